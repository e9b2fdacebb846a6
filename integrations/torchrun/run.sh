#!/usr/bin/env bash
# Run torchrun from the project's venv (torch ships it) as a single-node standalone job:
#   integrations/torchrun/run.sh 2 CMD...   ==  .venv/bin/torchrun --standalone
#                                              --nproc-per-node 2 --no-python CMD...
# --no-python makes CMD an ordinary command line, like the MPI launchers' (give the
# interpreter yourself: `... 2 python script.py`). DISTENV_TORCHRUN overrides the binary.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
bin="${DISTENV_TORCHRUN:-$DISTENV_REPO_DIR/.venv/bin/torchrun}"
[ -x "$bin" ] || die "$bin not found: create the project venv with torch installed"
n="${1:?usage: run.sh NPROC CMD...}"; shift
exec "$bin" --standalone --nproc-per-node "$n" --no-python "$@"
