#!/usr/bin/env bash
# Creates .venvs/jax: distenv (editable), JAX for CPU (jax + jaxlib; its CPU collectives go
# through gloo, built into jaxlib), Keras 3 (its JAX backend and keras.distribution) and pytest.
# No TensorFlow: Keras 3 on JAX trains from NumPy arrays without it, and the venv stays small.
#
#   bash integrations/frameworks/jax.sh      # idempotent; prints the interpreter
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cd "$DISTENV_REPO_DIR"
: "${DISTENV_JAX_SPEC:=jax>=0.10,<1}"
: "${DISTENV_KERAS_SPEC:=keras>=3.15,<4}"
venv="${DISTENV_JAX_VENV:-$DISTENV_REPO_DIR/.venvs/jax}"  # tox: its env dir
py="$venv/bin/python"

install() {
    venv_pip_install "$venv" -c "$DISTENV_REPO_DIR/integrations/frameworks/constraints.txt" \
        -e "$DISTENV_REPO_DIR" "$DISTENV_JAX_SPEC" "$DISTENV_KERAS_SPEC" \
        numpy pytest pytest-timeout
    # The CPU wheel only: a CUDA plugin would make every test host look like a GPU host.
    "$py" - <<'PY'
import importlib.metadata as md
import sys
for cuda in ("jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt"):
    try:
        sys.exit(f"jax venv: {cuda} {md.version(cuda)} was installed; this venv is for CPU JAX")
    except md.PackageNotFoundError:
        pass
print(f"[distenv] jax venv: jax {md.version('jax')}, jaxlib {md.version('jaxlib')}, "
      f"keras {md.version('keras')}", file=sys.stderr)
PY
}
timed "jax venv" install >&2
echo "$py"
