#!/usr/bin/env bash
# .venvs/deepspeed (or $DISTENV_DEEPSPEED_VENV, e.g. a tox env): distenv (editable), torch 2.13
# CPU, DeepSpeed (no mpi4py), plus its CPU communication op built once into
# <venv>/torch-extensions. Idempotent.
#
# DeepSpeed ships only an sdist whose setup.py imports torch: it is built with
# --no-build-isolation against the venv's torch 2.13 (an isolated build could fetch another
# torch) and DS_BUILD_OPS=0 (ops are compiled on first use instead). Checked: deepspeed
# requires torch>=2.0.0 and nothing else torch-like, so the torch==2.13.0 constraint holds.
#
# On a CPU-only machine DeepSpeed's TorchBackend JIT-compiles the `deepspeed_shm_comm` op at
# init_distributed (1 to 6 minutes on a shared 2-core machine). Ranks and tests share one
# build through TORCH_EXTENSIONS_DIR=<venv>/torch-extensions
# (tests/e2e set it), so a CI run pays for it at most once, here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. integrations/common.sh
C="$PWD/integrations/frameworks/constraints.txt"
export PIP_CONSTRAINT="$C" DS_BUILD_OPS=0
V="${DISTENV_DEEPSPEED_VENV:-$PWD/.venvs/deepspeed}"
spec=(-c "$C" --no-build-isolation torch==2.13.0 "deepspeed>=0.16" pytest pytest-timeout)
if [ "$(cat "$V/.distenv-installed" 2>/dev/null)" != "$(venv_want "${spec[@]}")" ]; then
    # First distenv and what deepspeed's no-isolation build imports (torch, setuptools).
    venv_pip_install "$V" -c "$C" -e . torch==2.13.0 setuptools wheel packaging ninja
fi
venv_pip_install "$V" "${spec[@]}"
export TORCH_EXTENSIONS_DIR="$V/torch-extensions"
"$V/bin/python" - <<'PY'
import time
t0 = time.monotonic()
import deepspeed, torch
from deepspeed.accelerator import get_accelerator
b = get_accelerator().create_op_builder("ShareMemCommBuilder")
if b is not None and deepspeed.ops.__compatible_ops__.get(b.NAME, False):
    b.load(verbose=False)
    print(f"deepspeed {deepspeed.__version__} torch {torch.__version__}: {b.NAME} ready "
          f"({time.monotonic() - t0:.1f} s)")
else:
    print(f"deepspeed {deepspeed.__version__} torch {torch.__version__}: no CPU op to build")
PY
