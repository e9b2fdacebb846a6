#!/usr/bin/env bash
# .venvs/transformers4 (or $DISTENV_TRANSFORMERS4_VENV, e.g. a tox env): distenv (editable),
# torch 2.13 CPU, Transformers 4.57.x, Accelerate.
# Idempotent (venv_pip_install). No mpi4py: the end-to-end tests prove distenv needs none.
# Checked: transformers 4.57 requires no torch itself; accelerate requires torch>=2.0.0, so
# the torch==2.13.0 constraint holds (pip install --dry-run --report shows 2.13.0+cpu only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. integrations/common.sh
C="$PWD/integrations/frameworks/constraints.txt"
T="$PWD/integrations/frameworks/constraints-transformers4.txt"  # this venv's Transformers
export PIP_CONSTRAINT="$C $T"
V="${DISTENV_TRANSFORMERS4_VENV:-$PWD/.venvs/transformers4}"
venv_pip_install "$V" -c "$C" -c "$T" -e . torch==2.13.0 \
    "transformers>=4.57,<4.58" "accelerate>=1.10" pytest pytest-timeout
"$V/bin/python" -c \
    'import transformers, accelerate, torch; print(transformers.__version__, accelerate.__version__, torch.__version__)'
