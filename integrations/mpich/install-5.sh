#!/usr/bin/env bash
# Installs MPICH 5 from PyPI (package `mpich`, ~60 MB) into its own venv at
# $DISTENV_LAUNCHERS_DIR/mpich5. Idempotent. Prints the path of its mpiexec on stdout.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
: "${DISTENV_MPICH5_SPEC:=mpich>=5,<6}"
venv="$DISTENV_LAUNCHERS_DIR/mpich5"
timed "mpich5 install" venv_pip_install "$venv" "$DISTENV_MPICH5_SPEC"
bin="$venv/bin/mpiexec"
[ -x "$bin" ] || die "$bin missing after install"
echo "$bin"
