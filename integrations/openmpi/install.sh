#!/usr/bin/env bash
# Installs Debian's Open MPI 4.1 (apt: openmpi-bin libopenmpi-dev). Idempotent.
# Prints the path of its mpirun on stdout.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
timed "openmpi4 install" apt_install openmpi-bin libopenmpi-dev
# /usr/bin/mpirun is an alternatives link that MPICH may also claim; this name is Open MPI's.
bin=/usr/bin/mpirun.openmpi
[ -x "$bin" ] || die "$bin missing after install"
echo "$bin"
