#!/usr/bin/env bash
# .venvs/ray (or $DISTENV_RAY_VENV, e.g. a tox env): distenv (editable), torch 2.13 CPU,
# Ray Train, and the frameworks the Ray tests run inside Ray's workers: Transformers 5 with
# Accelerate, Lightning (whose plugin distenv refuses there, in one line).
#
#   bash integrations/frameworks/ray.sh      # idempotent; prints the interpreter
#
# ray[train] asks for no torch itself; the constraints keep torch at the CPU build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. integrations/common.sh
C="$PWD/integrations/frameworks/constraints.txt"
T="$PWD/integrations/frameworks/constraints-transformers5.txt"
export PIP_CONSTRAINT="$C $T"
V="${DISTENV_RAY_VENV:-$DISTENV_REPO_DIR/.venvs/ray}"
venv_pip_install "$V" -c "$C" -c "$T" -e . torch==2.13.0 "ray[train]" \
    "transformers>=5,<6" accelerate lightning pytest pytest-timeout
"$V/bin/python" - <<'PY'
import importlib.metadata as md
import sys
torch = md.version("torch")
if not torch.startswith("2.13.0"):
    sys.exit(f"ray venv: torch {torch} was installed instead of 2.13.0")
print(f"[distenv] ray venv: ray {md.version('ray')}, torch {torch}, transformers "
      f"{md.version('transformers')}, lightning {md.version('lightning')}", file=sys.stderr)
PY
echo "$V/bin/python"
