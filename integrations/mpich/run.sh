#!/usr/bin/env bash
# Run MPICH's Hydra mpiexec:
#   integrations/mpich/run.sh 4 -np 4 CMD...   # Debian MPICH 4.0 (/usr/bin/mpiexec.mpich)
#   integrations/mpich/run.sh 5 -np 4 CMD...   # PyPI MPICH 5 ($DISTENV_LAUNCHERS_DIR/mpich5)
# Hydra needs no flag for root or for more ranks than cores. Default version 4.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
ver=4
case "${1:-}" in 4|5) ver="$1"; shift ;; esac
if [ "$ver" = 4 ]; then bin=/usr/bin/mpiexec.mpich; inst=install.sh
else bin="$DISTENV_LAUNCHERS_DIR/mpich5/bin/mpiexec"; inst=install-5.sh; fi
[ -x "$bin" ] || die "$bin not found: run integrations/mpich/$inst"
exec "$bin" "$@"
