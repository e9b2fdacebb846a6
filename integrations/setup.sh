#!/usr/bin/env bash
# Sets up everything the demo and the whole test suite need on a fresh Debian 12 machine,
# as root: the launchers (Debian's Open MPI 4, MPICH 4, SLURM; PyPI's Open MPI 5, MPICH 5,
# Intel MPI, each in its own venv under $DISTENV_LAUNCHERS_DIR), the container starters the
# tests put between a launcher and Python (bubblewrap, Charliecloud), and the project's own
# virtualenv .venv (distenv editable, torch 2.13 CPU, pytest, tox). Idempotent: a second run
# takes a few seconds.
#
#   bash integrations/setup.sh && .venv/bin/python -m pytest -n 2
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. integrations/common.sh
start=$SECONDS

# One apt transaction for every Debian package (dpkg allows one at a time).
apt_install openmpi-bin libopenmpi-dev mpich slurm-wlm munge iproute2 util-linux procps \
    bubblewrap charliecloud-runtime
integrations/slurm/install.sh >/dev/null   # also makes the munge key if the image lacks one

# The rest downloads from PyPI: in parallel, each into its own venv.
pids=()
(
    if [ ! -x .venv/bin/python ]; then "$DISTENV_PYTHON" -m venv .venv; fi
    # tox: the docs run the framework envs with .venv/bin/tox. -c: this machine's exact pins.
    .venv/bin/pip install -q --disable-pip-version-check -c integrations/frameworks/constraints.txt \
        -e '.[test,torch,discovery]' tox
    log "project venv ready: .venv"
) & pids+=($!)
integrations/openmpi/install-5.sh >/dev/null & pids+=($!)
integrations/mpich/install-5.sh >/dev/null & pids+=($!)
integrations/intel-mpi/install.sh >/dev/null & pids+=($!)
# Each framework gets its own virtualenv .venvs/<name> (see integrations/frameworks/).
for script in integrations/frameworks/*.sh; do
    [ -e "$script" ] || continue
    bash "$script" >/dev/null & pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ "$status" -eq 0 ] || die "an install step failed (see above)"
log "setup done in $((SECONDS - start)) s"
