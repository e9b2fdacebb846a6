#!/usr/bin/env bash
# Creates .venvs/horovod: distenv (editable), torch==2.13.0 (CPU) and Horovod 0.28.1 built
# from its PyPI sdist for PyTorch with MPI (Open MPI 4, Debian's libopenmpi-dev) and Gloo.
# Idempotent; prints the venv's python on stdout.
#
# Horovod 0.28.1 (2023, the last release) needs small source edits to build against
# torch 2.13: integrations/frameworks/horovod_patch.py applies them to the downloaded sdist
# only (nothing of Horovod is kept in this repository). The build must see the venv's
# torch, hence --no-build-isolation (with wheel/packaging/setuptools installed first).
# Compiling takes ~5 CPU-minutes at -O0 (docs/frameworks/horovod.md has the measured figures).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cd "$DISTENV_REPO_DIR"
: "${DISTENV_HOROVOD_VERSION:=0.28.1}"
# Built wheels are kept here, keyed by Horovod, torch, Python and patch: a second venv (tox,
# a fresh clone on the same machine) installs in seconds instead of compiling again.
: "${DISTENV_CACHE_DIR:=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/distenv}"
venv="${DISTENV_HOROVOD_VENV:-$DISTENV_REPO_DIR/.venvs/horovod}"  # tox: its env dir
py="$venv/bin/python"
marker="$venv/.distenv-horovod"
want="horovod==$DISTENV_HOROVOD_VERSION torch+mpi+gloo $(sha1sum integrations/frameworks/horovod_patch.py | cut -c1-12)"

built() {
    [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] &&
        "$py" -c 'import horovod.torch as hvd; assert hvd.mpi_built() and hvd.gloo_built()' 2>/dev/null
}

build() {
    venv_pip_install "$venv" -c "$DISTENV_REPO_DIR/integrations/frameworks/constraints.txt" \
        -e "$DISTENV_REPO_DIR" "torch==2.13.0" \
        wheel packaging "setuptools<81" cloudpickle psutil pyyaml cffi
    command -v cmake >/dev/null || "$venv/bin/pip" install -q --disable-pip-version-check cmake
    command -v mpicxx >/dev/null || die "mpicxx not found: install libopenmpi-dev (integrations/openmpi/install.sh)"
    command -v g++ >/dev/null || apt_install g++ make
    local torch_version pytag key wheels src
    torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
    pytag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    key="horovod-$DISTENV_HOROVOD_VERSION-torch$torch_version-$pytag-$(sha1sum integrations/frameworks/horovod_patch.py | cut -c1-12)"
    wheels="$DISTENV_CACHE_DIR/$key"
    if ! compgen -G "$wheels/horovod-*.whl" >/dev/null; then
        src=$(mktemp -d "${TMPDIR:-/tmp}/distenv-horovod.XXXXXX")
        # shellcheck disable=SC2064
        trap "rm -rf '$src'" RETURN
        log "downloading the horovod==$DISTENV_HOROVOD_VERSION sdist"
        "$venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
            "horovod==$DISTENV_HOROVOD_VERSION" -d "$src" 2> >(grep -v 'is ignored' >&2)
        tar -xzf "$src"/horovod-*.tar.gz -C "$src"
        "$py" integrations/frameworks/horovod_patch.py "$src/horovod-$DISTENV_HOROVOD_VERSION"
        log "building Horovod $DISTENV_HOROVOD_VERSION (PyTorch, MPI, Gloo; no TensorFlow, no MXNet)"
        local t0=$SECONDS
        PATH="$venv/bin:$PATH" MAKEFLAGS="-j$(nproc)" \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo \
            "$venv/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
            --no-cache-dir -w "$src/wheel" "$src/horovod-$DISTENV_HOROVOD_VERSION" > "$src/build.log" 2>&1 ||
            { tail -60 "$src/build.log" >&2; die "Horovod build failed"; }
        log "Horovod compiled in $((SECONDS - t0)) s"
        mkdir -p "$wheels"
        mv "$src"/wheel/horovod-*.whl "$wheels/"
    else
        log "using the Horovod wheel built before: $wheels"
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/horovod-*.whl
    "$py" - <<'EOF'
import horovod.torch as hvd
from importlib.metadata import version
if not (hvd.mpi_built() and hvd.gloo_built()):
    raise SystemExit(f"horovod built without MPI ({hvd.mpi_built()}) or Gloo ({hvd.gloo_built()})")
print(f"[distenv] horovod {version('horovod')} (torch {version('torch')}): MPI and Gloo built", flush=True)
EOF
    printf '%s' "$want" > "$marker"
}

if built; then
    log "already built: $want in $venv"
else
    timed "horovod venv (build included)" build >&2
fi
echo "$py"
