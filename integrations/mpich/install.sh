#!/usr/bin/env bash
# Installs Debian's MPICH 4.0 (apt: mpich). Idempotent. Prints the path of its launcher.
# Call it as mpiexec.mpich: /usr/bin/mpirun/mpiexec stay Open MPI's when both are installed.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
timed "mpich4 install" apt_install mpich
bin=/usr/bin/mpiexec.mpich
[ -x "$bin" ] || die "$bin missing after install"
echo "$bin"
