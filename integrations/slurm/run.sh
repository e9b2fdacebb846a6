#!/usr/bin/env bash
# Run srun against the one-node SLURM of integrations/slurm/start.sh:
#   integrations/slurm/run.sh -n4 CMD...
# Starts that SLURM first when it is not running (it stays up: stop it with stop.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../common.sh"
eval "$("$here/start.sh")"
exec srun "$@"
