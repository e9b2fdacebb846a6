#!/usr/bin/env bash
# .venvs/transformers5 (or $DISTENV_TRANSFORMERS5_VENV, e.g. a tox env): distenv (editable),
# torch 2.13 CPU, Transformers 5.x, Accelerate.
# Idempotent (venv_pip_install). No mpi4py: the end-to-end tests prove distenv needs none.
# Checked: transformers 5 requires no torch itself; accelerate requires torch>=2.0.0, so
# the torch==2.13.0 constraint holds (pip install --dry-run --report shows 2.13.0+cpu only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. integrations/common.sh
C="$PWD/integrations/frameworks/constraints.txt"
T="$PWD/integrations/frameworks/constraints-transformers5.txt"  # this venv's Transformers
export PIP_CONSTRAINT="$C $T"
V="${DISTENV_TRANSFORMERS5_VENV:-$PWD/.venvs/transformers5}"
venv_pip_install "$V" -c "$C" -c "$T" -e . torch==2.13.0 \
    "transformers>=5,<6" "accelerate>=1.10" pytest pytest-timeout
"$V/bin/python" -c \
    'import transformers, accelerate, torch; print(transformers.__version__, accelerate.__version__, torch.__version__)'
