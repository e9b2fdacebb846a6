#!/usr/bin/env bash
# Records what the framework launchers really put in the environment of their ranks, on this
# host, one fixture per layout (format: collect.py; variables and values kept: record_env.py):
#
#   integrations/record/record_frameworks.sh [OUT_DIR] [LAYOUT_GLOB]
#
#   horovodrun-gloo-np2    .venvs/horovod:   horovodrun --gloo -np 2 -H localhost:2
#   deepspeed-nproc2       .venvs/deepspeed: deepspeed --num_gpus 2 --master_port P (CPU: no GPU
#                          is needed once --num_gpus is given)
#   horovodrun-gloo-2x2    horovodrun --gloo -np 4 -H node1:2,node2:2 inside node1 of the namespace
#                          cluster (root; integrations/cluster/up.sh is run if the nodes are not
#                          up, and down.sh again at the end if this script brought them up);
#                          remote ranks start through an `ssh` on PATH that runs the fake ssh
#
# OUT_DIR defaults to tests/fixtures/frameworks, beside tests/fixtures/launchers, not in it:
# tests/unit/test_recorded.py replays every tests/fixtures/launchers/*.json and knows no
# horovodrun or DeepSpeed family yet, and tests/unit/test_resolve.py opens every entry of that
# folder as a file (a subfolder breaks it). tests/integration/test_framework_recordings.py
# replays these.
# About 20 s (the DeepSpeed runner imports torch twice before any rank starts).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../common.sh"
out="${1:-$DISTENV_REPO_DIR/tests/fixtures/frameworks}"
only="${2:-*}"
mkdir -p "$out" "$DISTENV_RUN_DIR"
out="$(cd "$out" && pwd)"
REC="$here/record_env.py"
HVD="$DISTENV_REPO_DIR/.venvs/horovod"
DS="$DISTENV_REPO_DIR/.venvs/deepspeed"

# A clean environment: no launcher variable inherited from this shell (docs/launchers.md#trap-9).
for v in $(compgen -e); do
    case "$v" in
        OMPI_*|PMIX_*|PMI_*|MPI_LOCAL*|HYDRA_*|I_MPI_*|MV2_*|SLURM_*|SLURMD_*|TORCHELASTIC_*|\
        PALS_*|FLUX_*|JSM_*|LSB_*|HOROVOD_*|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|\
        GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|ROLE_WORLD_SIZE|ROLE_NAME|MASTER_ADDR|\
        MASTER_PORT|NODE_RANK|CUDA_VISIBLE_DEVICES|LOCAL_SIZE|CROSS_RANK|CROSS_SIZE) unset "$v" ;;
    esac
done
unset PYTHONPATH

work="$(mktemp -d "$DISTENV_RUN_DIR/record-frameworks.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"

n_ok=0
# rec LAYOUT EXPECTED_RANKS VERSION SHOWN_CMD CMD...
rec() {
    local layout="$1" expect="$2" version="$3" shown="$4"; shift 4
    # shellcheck disable=SC2254
    case "$layout" in $only) ;; *) return 0 ;; esac
    local t0=$SECONDS
    timeout -k 5 180 "$@" >"$work/$layout.out" 2>"$work/$layout.err" \
        || { cat "$work/$layout.err" >&2; die "$layout: launcher failed"; }
    # horovodrun prefixes every line of a rank with "[N]<stdout>:"
    sed -e 's/^\[[0-9]*\]<stdout>://' "$work/$layout.out" \
        | python3 "$here/collect.py" --layout "$layout" --cmd "$shown" --version "$version" \
            --expect "$expect" --out "$out/$layout.json" \
        || { cat "$work/$layout.err" >&2; die "$layout: wrong rank records"; }
    n_ok=$((n_ok + 1))
    log "$layout: $expect rank(s) in $((SECONDS - t0)) s"
}

[ -x "$HVD/bin/horovodrun" ] || die "$HVD/bin/horovodrun missing: bash integrations/frameworks/horovod.sh"
[ -x "$DS/bin/deepspeed" ] || die "$DS/bin/deepspeed missing: bash integrations/frameworks/deepspeed.sh"
V_HVD="Horovod $("$HVD/bin/python" -c 'import horovod; print(horovod.__version__)')"
V_DS="$("$DS/bin/python" -c 'import deepspeed, torch; print(f"DeepSpeed {deepspeed.__version__}, torch {torch.__version__}")' 2>/dev/null | tail -n1)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

rec horovodrun-gloo-np2 2 "$V_HVD" "horovodrun --gloo -np 2 -H localhost:2 python record_env.py" \
    "$HVD/bin/horovodrun" --gloo -np 2 -H localhost:2 "$HVD/bin/python" "$REC"
rec deepspeed-nproc2 2 "$V_DS" "deepspeed --num_gpus 2 --master_port $port record_env.py" \
    "$DS/bin/deepspeed" --num_gpus 2 --master_port "$port" "$REC"

# shellcheck disable=SC2254
case horovodrun-gloo-2x2 in $only)
    [ "$(id -u)" = 0 ] || die "horovodrun-gloo-2x2 needs root (network namespaces)"
    C="$DISTENV_INTEGRATIONS_DIR/cluster"
    cluster_started=0
    [ -e /run/netns/node1 ] && [ -e /run/netns/node2 ] || cluster_started=1
    trap 'rm -rf "$work"; [ "$cluster_started" = 0 ] || "$C/down.sh" >/dev/null 2>&1 || true' EXIT
    "$C/up.sh" >/dev/null
    mkdir -p "$work/sshbin"
    printf '#!/bin/sh\nexec %s "$@"\n' "$C/fakessh" >"$work/sshbin/ssh"
    chmod +x "$work/sshbin/ssh"
    # --network-interfaces: the nodes' interface (integrations/cluster/env.sh CLUSTER_IF)
    PATH="$work/sshbin:$PATH" rec horovodrun-gloo-2x2 4 "$V_HVD" \
        "horovodrun --gloo -np 4 -H node1:2,node2:2 --network-interfaces clus0 python record_env.py (inside node1)" \
        "$C/on-node" node1 "$HVD/bin/horovodrun" --gloo -np 4 -H node1:2,node2:2 \
        --network-interfaces clus0 "$HVD/bin/python" "$REC"
    ;;
esac

log "$n_ok layout(s) recorded in $out"
