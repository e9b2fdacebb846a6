#!/usr/bin/env bash
# Installs the Intel MPI runtime from PyPI (package `impi-rt`, ~321 MB) into its own venv
# at $DISTENV_LAUNCHERS_DIR/impi. Idempotent. Prints the path of its mpiexec.hydra.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
: "${DISTENV_IMPI_SPEC:=impi-rt>=2021,<2022}"
venv="$DISTENV_LAUNCHERS_DIR/impi"
timed "impi install" venv_pip_install "$venv" "$DISTENV_IMPI_SPEC"
bin="$venv/bin/mpiexec.hydra"
[ -x "$bin" ] || die "$bin missing after install"
echo "$bin"
