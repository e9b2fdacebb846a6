#!/usr/bin/env bash
# shellcheck disable=SC2046  # $(L ...) is split into words on purpose (see L below)
# Records what every single-node launcher layout really puts in the environment of its
# ranks, one fixture per layout: tests/fixtures/launchers/<layout>.json (see collect.py
# for the format, record_env.py for which variables and which values are kept).
#
#   integrations/record/record_all.sh [OUT_DIR] [LAYOUT_GLOB]
#
# Installs what is missing (idempotent installers), starts the one-node SLURM if it is
# not running (and stops it again at the end if it started it), and fails on the first
# layout that does not give the expected number of ranks. Takes about a minute, most of
# it sbatch --wait polling.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../common.sh"
I="$DISTENV_INTEGRATIONS_DIR"
out="${1:-$DISTENV_REPO_DIR/tests/fixtures/launchers}"
only="${2:-*}"
mkdir -p "$out" "$DISTENV_RUN_DIR"
out="$(cd "$out" && pwd)"

PY="$DISTENV_REPO_DIR/.venv/bin/python"
[ -x "$PY" ] || PY="$(command -v python3)"
REC="$here/record_env.py"
TORCHRUN="${DISTENV_TORCHRUN:-$DISTENV_REPO_DIR/.venv/bin/torchrun}"
# L NAME N: the argv prefix from the launcher table (integrations/launchers.py). Used
# unquoted on purpose, to split it into words: the paths in it must have no blanks.
L() { "$PY" "$I/launchers.py" argv "$@"; }
case "$DISTENV_LAUNCHERS_DIR$DISTENV_REPO_DIR" in
    *[[:space:]]*) die "record_all.sh needs DISTENV_LAUNCHERS_DIR and the repo path without blanks" ;;
esac

# --- launchers ----------------------------------------------------------------------
for s in openmpi/install.sh openmpi/install-5.sh mpich/install.sh mpich/install-5.sh \
         intel-mpi/install.sh slurm/install.sh; do
    bash "$I/$s" >/dev/null
done
[ -x "$TORCHRUN" ] || die "$TORCHRUN missing: install torch==2.13.0 into the project .venv"

# --- a clean environment: no launcher variable inherited from this shell (docs/launchers.md#trap-9)
for v in $(compgen -e); do
    case "$v" in
        OMPI_*|PMIX_*|PMI_*|MPI_LOCAL*|HYDRA_*|I_MPI_*|MV2_*|SLURM_*|SLURMD_*|TORCHELASTIC_*|\
        PALS_*|FLUX_*|JSM_*|LSB_*|HOROVOD_*|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|\
        GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|ROLE_WORLD_SIZE|ROLE_NAME|MASTER_ADDR|\
        MASTER_PORT|NODE_RANK|CUDA_VISIBLE_DEVICES) unset "$v" ;;
    esac
done

slurm_started=0
if ! pid_alive "$DISTENV_RUN_DIR/slurm1/slurmctld.pid"; then slurm_started=1; fi
# Exports SLURM_CONF, which srun/sbatch pass on to every task; it is this harness's,
# not the launcher's, so collect.py drops it from the fixtures.
eval "$("$I/slurm/start.sh")"
work="$(mktemp -d "$DISTENV_RUN_DIR/record.XXXXXX")"
cleanup() {
    rm -rf "$work"
    if [ "$slurm_started" = 1 ]; then "$I/slurm/stop.sh" || true; fi
}
trap cleanup EXIT

# --- versions -------------------------------------------------------------------------
LD="$DISTENV_LAUNCHERS_DIR"
V_OMPI4="$(/usr/bin/mpirun.openmpi --version 2>/dev/null | head -n1)"
V_OMPI5="$("$LD/openmpi5/bin/mpirun" --version 2>/dev/null | head -n1)"
V_MPICH4="MPICH $(/usr/bin/mpiexec.mpich --version | awk '$1 == "Version:" {print $2; exit}') (Hydra)"
V_MPICH5="MPICH $("$LD/mpich5/bin/mpiexec" --version | awk '$1 == "Version:" {print $2; exit}') (Hydra)"
V_IMPI="$("$LD/impi/bin/mpiexec.hydra" --version 2>/dev/null | head -n1 | sed 's/ *$//')"
V_SLURM="$(srun --version)"
V_TORCH="torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"

# show ARGS...: the command line as it goes in a fixture, machine paths shortened.
show() {
    local a s=""
    for a in "$@"; do
        a="${a//$REC/record_env.py}"
        a="${a//$PY/python}"
        a="${a//$TORCHRUN/torchrun}"
        a="${a//$LD/\$DISTENV_LAUNCHERS_DIR}"
        a="${a//$DISTENV_REPO_DIR\//}"
        case "$a" in *" "*) a="'$a'" ;; esac
        [ "$a" = sbatch_wait ] && a="sbatch --wait"
        s="$s${s:+ }$a"
    done
    printf '%s' "$s"
}


n_ok=0
# rec LAYOUT EXPECTED_RANKS VERSION CMD...
rec() {
    local layout="$1" expect="$2" version="$3"; shift 3
    # shellcheck disable=SC2254
    case "$layout" in $only) ;; *) return 0 ;; esac
    local t0=$SECONDS
    local ok=1
    if [ "$1" = sbatch_wait ]; then   # sbatch --wait, then the job's output file
        timeout -k 5 180 sbatch --wait -o "$work/$layout.job" "${@:2}" \
            >"$work/$layout.err" 2>&1 && cat "$work/$layout.job" >"$work/$layout.out" || ok=0
    else
        timeout -k 5 180 "$@" >"$work/$layout.out" 2>"$work/$layout.err" || ok=0
    fi
    if [ "$ok" = 0 ]; then
        cat "$work/$layout.err" >&2
        die "$layout: launcher failed"
    fi
    "$PY" "$here/collect.py" --layout "$layout" --cmd "$(show "$@")" --version "$version" \
        --expect "$expect" --drop SLURM_CONF --out "$out/$layout.json" <"$work/$layout.out" \
        || { cat "$work/$layout.err" >&2; die "$layout: wrong rank records"; }
    n_ok=$((n_ok + 1))
    log "$layout: $expect rank(s) in $((SECONDS - t0)) s"
}

# --- layouts ----------------------------------------------------------------------------
rec openmpi4-np4 4 "$V_OMPI4" $(L openmpi4 4) "$PY" "$REC"
rec openmpi4-np2 2 "$V_OMPI4" $(L openmpi4 2) "$PY" "$REC"
rec openmpi5-np4 4 "$V_OMPI5" $(L openmpi5 4) "$PY" "$REC"
rec openmpi5-np4-map-by-node 4 "$V_OMPI5" $(L openmpi5 4) --map-by node "$PY" "$REC"
rec mpich4-np4 4 "$V_MPICH4" $(L mpich4 4) "$PY" "$REC"
rec mpich4-np2-pmi-port 2 "$V_MPICH4" $(L mpich4 2) -pmi-port "$PY" "$REC"
rec mpich5-np4 4 "$V_MPICH5" $(L mpich5 4) "$PY" "$REC"
rec intelmpi-np4 4 "$V_IMPI" $(L intelmpi 4) "$PY" "$REC"

rec slurm-srun-n4 4 "$V_SLURM" srun -n4 "$PY" "$REC"
rec slurm-srun-n4-cyclic 4 "$V_SLURM" srun -n4 -m cyclic "$PY" "$REC"
rec slurm-srun-pmix-n2 2 "$V_SLURM" srun --mpi=pmix -n2 "$PY" "$REC"
rec slurm-srun-pmi2-n2 2 "$V_SLURM" srun --mpi=pmi2 -n2 "$PY" "$REC"
rec slurm-sbatch-script-n4 1 "$V_SLURM" sbatch_wait -n4 --wrap "$PY $REC"
rec slurm-salloc-shell-n2 1 "$V_SLURM" salloc -n2 "$PY" "$REC"
rec slurm-salloc-srun-n2 2 "$V_SLURM" salloc -n2 srun "$PY" "$REC"
rec slurm-sbatch-openmpi4-np2 2 "$V_OMPI4; $V_SLURM" sbatch_wait -n2 --wrap "$(L openmpi4 2) $PY $REC"
rec slurm-sbatch-openmpi5-np2 2 "$V_OMPI5; $V_SLURM" sbatch_wait -n2 --wrap "$(L openmpi5 2) $PY $REC"
rec slurm-sbatch-mpich4-np2 2 "$V_MPICH4; $V_SLURM" sbatch_wait -n2 --wrap "$(L mpich4 2) $PY $REC"
rec slurm-sbatch-intelmpi-np2 2 "$V_IMPI; $V_SLURM" sbatch_wait -n2 --wrap "$(L intelmpi 2) $PY $REC"

rec torchrun-standalone-nproc2 2 "$V_TORCH" $(L torchrun 2) "$PY" "$REC"
# No --standalone: torch 2.13 with one node and no --master-port/--rdzv-endpoint still
# switches to the standalone c10d rendezvous (run.py), so this matches the one above ...
rec torchrun-nproc2 2 "$V_TORCH" "$TORCHRUN" --nproc-per-node 2 --no-python "$PY" "$REC"
# ... and a --master-port is what gives the static rendezvous (free port picked now).
port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
rec torchrun-static-nproc2 2 "$V_TORCH" "$TORCHRUN" --nproc-per-node 2 --master-port "$port" \
    --no-python "$PY" "$REC"
rec slurm-srun-n1-torchrun-nproc2 2 "$V_TORCH; $V_SLURM" srun -n1 $(L torchrun 2) "$PY" "$REC"

rec no-launcher 1 "" "$PY" "$REC"

log "$n_ok layout(s) recorded in $out"
