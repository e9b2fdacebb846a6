#!/usr/bin/env bash
# Creates .venvs/tensorflow: distenv (editable), tensorflow-cpu, tf-keras, tensorboard and mpi4py.
# Idempotent; prints the venv's python on stdout.
#
# tf-keras goes in with --no-deps: its own requirement is `tensorflow`, the full CUDA wheel,
# which pip would install over tensorflow-cpu (2.2 GB venv, cuInit errors). tf-keras must
# carry TensorFlow's major.minor version (tf-keras 2.21.x for TensorFlow 2.21.x): checked below.
# tensorboard: TensorFlow 2.21 no longer depends on it, and the TensorBoard callback needs it.
# mpi4py is for distenv.tensorflow's opt-in host gathering across MPI nodes (a wheel; it
# loads the launcher's libmpi at run time).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cd "$DISTENV_REPO_DIR"
: "${DISTENV_TENSORFLOW_SPEC:=tensorflow-cpu>=2.16,<3}"
venv="${DISTENV_TENSORFLOW_VENV:-$DISTENV_REPO_DIR/.venvs/tensorflow}"  # tox: its env dir
py="$venv/bin/python"

install() {
    venv_pip_install "$venv" -c "$DISTENV_REPO_DIR/integrations/frameworks/constraints.txt" \
        -e "$DISTENV_REPO_DIR" "$DISTENV_TENSORFLOW_SPEC" tensorboard mpi4py pytest pytest-timeout
    local tf
    tf=$("$py" -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))')
    local mm=${tf%.*}
    if ! "$py" -c "from importlib.metadata import version; import sys; sys.exit(not version('tf-keras').startswith('$mm.'))" 2>/dev/null; then
        log "pip install tf-keras~=$mm.0 --no-deps into $venv"
        "$py" -m pip install -q --disable-pip-version-check --no-deps \
            -c "$DISTENV_REPO_DIR/integrations/frameworks/constraints.txt" "tf-keras~=$mm.0"
    fi
    # Versions must match, and tf-keras must not have dragged in the CUDA `tensorflow`.
    "$py" - <<'EOF'
from importlib.metadata import PackageNotFoundError, version
tf, tk = version("tensorflow-cpu"), version("tf-keras")
if tf.split(".")[:2] != tk.split(".")[:2]:
    raise SystemExit(f"tf-keras {tk} does not match tensorflow-cpu {tf}")
try:
    raise SystemExit(f"the CUDA `tensorflow` {version('tensorflow')} was installed over tensorflow-cpu")
except PackageNotFoundError:
    pass
print(f"[distenv] tensorflow-cpu {tf}, tf-keras {tk}, keras {version('keras')}", flush=True)
EOF
}
timed "tensorflow venv" install >&2
echo "$py"
