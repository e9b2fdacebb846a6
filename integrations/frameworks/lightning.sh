#!/usr/bin/env bash
# Creates .venvs/lightning: distenv (editable), torch 2.13 CPU, and BOTH Lightning
# distributions -- `lightning` (lightning.pytorch / lightning.fabric) and the separate
# `pytorch-lightning` (pytorch_lightning + lightning_fabric) -- so the e2e tests can
# exercise distenv.lightning against each package's own ClusterEnvironment base class.
#
#   bash integrations/frameworks/lightning.sh      # idempotent; prints the interpreter
#
# torch is pinned and installed in the same pip call: lightning/pytorch-lightning only
# ask for torch>=2.1, which 2.13.0 satisfies, so pip keeps the CPU build (any other torch
# would pull a multi-GB CUDA build). The check below fails loudly if that ever changes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. integrations/common.sh

venv="$DISTENV_REPO_DIR/.venvs/lightning"
venv_pip_install "$venv" -c integrations/frameworks/constraints.txt -e . torch==2.13.0 lightning pytorch-lightning pytest pytest-timeout
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import sys
torch = md.version("torch")
if not torch.startswith("2.13.0"):
    sys.exit(f"lightning venv: torch {torch} was installed instead of 2.13.0")
print(f"[distenv] lightning venv: torch {torch}, lightning {md.version('lightning')}, "
      f"pytorch-lightning {md.version('pytorch-lightning')}", file=sys.stderr)
PY
echo "$venv/bin/python"
