#!/usr/bin/env bash
# Run Intel MPI's Hydra launcher from the PyPI runtime ($DISTENV_LAUNCHERS_DIR/impi):
#   integrations/intel-mpi/run.sh -np 4 CMD...
# Hydra needs no flag for root or oversubscription. The venv's lib/ goes first on
# LD_LIBRARY_PATH (Hydra passes it to the ranks) so MPI programs find Intel's libmpi.so.12;
# the PyPI package has no vars.sh to source. On one node Intel MPI uses shared memory
# only; across nodes set FI_PROVIDER=tcp.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
root="$DISTENV_LAUNCHERS_DIR/impi"
bin="$root/bin/mpiexec.hydra"
[ -x "$bin" ] || die "$bin not found: run integrations/intel-mpi/install.sh"
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$bin" "$@"
