#!/usr/bin/env bash
# Records what every two-node layout really puts in the environment of its ranks, one
# fixture per layout: tests/fixtures/launchers/cluster-<layout>.json, in the format of the
# single-node fixtures of record_all.sh ({"layout", "launcher_cmd", "launcher_version",
# "rank_var", "ranks": [{"hostname", "env"}, ...]}; record_env.py's filtering: launcher
# variables only, machine paths -> "<path>", keys -> "<redacted>"; SLURM_CONF dropped).
#
#   integrations/record/record_cluster.sh [OUT_DIR] [LAYOUT_GLOB]
#
# The layouts (argv, rank counts) are those of the integration tests,
# tests/integration/harness.py (`python tests/integration/harness.py list`): MPI 2x2 over
# node1/node2 through the fake ssh, and the two-node SLURM (srun block/cyclic/uneven,
# pmix/pmi2, salloc, sbatch with and without mpirun inside, torchrun under srun).
# Needs root. Brings up the namespace cluster and its SLURM if they are not running, and
# takes down again what it brought up. Fails on the first layout that does not give the
# expected number of ranks. About 40 s here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../common.sh"
C="$DISTENV_INTEGRATIONS_DIR/cluster"
out="${1:-$DISTENV_REPO_DIR/tests/fixtures/launchers}"
only="${2:-*}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
PY="${DISTENV_VENV:-$DISTENV_REPO_DIR/.venv}/bin/python"
[ -x "$PY" ] || die "$PY missing: create the project venv (torch==2.13.0, distenv -e)"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, SLURM daemons)"

cluster_started=0 slurm_started=0
[ -e /run/netns/node1 ] && [ -e /run/netns/node2 ] || cluster_started=1
pid_alive "$DISTENV_RUN_DIR/cluster/slurm/slurmctld.pid" || slurm_started=1
cleanup() {
    if [ "$cluster_started" = 1 ]; then "$C/down.sh" >/dev/null 2>&1 || true
    elif [ "$slurm_started" = 1 ]; then "$C/slurm-down.sh" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
"$C/up.sh" >/dev/null
"$C/slurm-up.sh" >/dev/null   # the harness points each srun/sbatch at its SLURM_CONF

# The harness gives every launcher a clean environment (no inherited launcher variables).
"$PY" "$DISTENV_REPO_DIR/tests/integration/harness.py" record "$out" "$only"
