#!/bin/bash
# Exercise the two-node SLURM (starts it with slurm-up.sh if needed):
# srun block/cyclic/uneven, --mpi=pmix/pmi2 with real MPI programs, sbatch --wait
# with srun and with mpirun/mpiexec inside, salloc, and torchrun under srun.
set -uo pipefail
. "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
eval "$("$CLUSTER_DIR/slurm-up.sh")"
B=$CLUSTER_STATE/bin J=$CLUSTER_STATE/jobs
PY=${DISTENV_VENV:-$CLUSTER_REPO/.venv}/bin
mkdir -p "$J"
"$CLUSTER_DIR/mpi-check.sh" --build-only >/dev/null 2>&1 || true
rc=0
T() { # name expected-regex-per-line... -- cmd...
  local name=$1; shift; local pats=()
  while [ "$1" != -- ]; do pats+=("$1"); shift; done; shift
  local t0=$(date +%s.%N) out ok=1
  out=$(timeout -k 5 180 "$@" 2>&1) || ok=0
  for p in "${pats[@]}"; do echo "$out" | grep -Eq -- "$p" || { ok=0; echo "  missing: $p"; }; done
  local dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  if [ $ok = 1 ]; then echo "PASS $name ($dt s)"; else echo "FAIL $name ($dt s)"; echo "$out" | sed 's/^/  | /'; rc=1; fi
  [ -n "${VERBOSE:-}" ] && echo "$out" | sed 's/^/    /'
  return 0
}
task='echo "$(hostname) procid=$SLURM_PROCID nodeid=$SLURM_NODEID localid=$SLURM_LOCALID ip=$(ip -4 -o addr show '$CLUSTER_IF' | awk "{print \$4}")"'

T "srun -N2 -n4 hostname" '^node1$' '^node2$' -- srun -N2 -n4 hostname
T "srun -N2 -n4 -m cyclic" '^node1 procid=0 .*ip=10.213.77.11/' '^node2 procid=1 nodeid=1 .*ip=10.213.77.12/' \
  -- srun -N2 -n4 -m cyclic sh -c "$task"
T "srun -N2 -n3" '^node1 procid=0 ' '^node2 procid=2 nodeid=1 ' -- srun -N2 -n3 sh -c "$task"
T "srun --mpi=pmix -N2 -n2" '^node1 PMIX_RANK=0' '^node2 PMIX_RANK=1' \
  -- srun --mpi=pmix -N2 -n2 sh -c 'echo "$(hostname) PMIX_RANK=$PMIX_RANK"'
T "srun --mpi=pmi2 -N2 -n2" '^node1 PMI_RANK=0' '^node2 PMI_RANK=1' \
  -- srun --mpi=pmi2 -N2 -n2 sh -c 'echo "$(hostname) PMI_RANK=$PMI_RANK"'
T "srun --mpi=pmix Open MPI 4 program 2x2" 'rank=3 size=4 host=node2 .* OK' 'rank=0 size=4 host=node1 .* OK' \
  -- srun --mpi=pmix -N2 --ntasks-per-node=2 "$B/hello-ompi4"
T "srun --mpi=pmi2 MPICH 4 program 2x2" 'rank=3 size=4 host=node2 .* OK' 'rank=0 size=4 host=node1 .* OK' \
  -- srun --mpi=pmi2 -N2 --ntasks-per-node=2 "$B/hello-mpich4"

cat > "$J/job-srun.sh" <<EOS
#!/bin/bash
echo "batch host=\$(hostname) nodelist=\$SLURM_JOB_NODELIST step=\${SLURM_STEP_ID:-none}"
srun sh -c '$task'
EOS
cat > "$J/job-mpi.sh" <<EOS
#!/bin/bash
echo "batch host=\$(hostname) nodelist=\$SLURM_JOB_NODELIST"
mpirun --allow-run-as-root -np 4 $B/hello-ompi4 | sed 's/^/ompi4 /'
mpiexec.mpich -np 4 $B/hello-mpich4 | sed 's/^/mpich4 /'
EOS
rm -f "$J"/*.out
T "sbatch --wait -N2 (srun inside)" 'batch host=node1 nodelist=node\[1-2\] step=none' '^node2 procid=3 nodeid=1' \
  -- sh -c "sbatch --wait -N2 --ntasks-per-node=2 -o '$J/%j.out' '$J/job-srun.sh' >/dev/null && cat '$J'/*.out"
rm -f "$J"/*.out
T "sbatch --wait -N2 (mpirun + mpiexec.mpich inside)" 'ompi4 rank=3 size=4 host=node2 .* OK' 'mpich4 rank=3 size=4 host=node2 .* OK' \
  'ompi4 rank=0 size=4 host=node1 .* OK' 'mpich4 rank=0 size=4 host=node1 .* OK' \
  -- sh -c "sbatch --wait -N2 --ntasks-per-node=2 -o '$J/%j.out' '$J/job-mpi.sh' >/dev/null && cat '$J'/*.out"
T "salloc -N2 srun" '^node1 procid=0 ' '^node2 procid=3 nodeid=1 ' -- salloc -N2 --ntasks-per-node=2 srun sh -c "$task"
if [ -x "$PY/torchrun" ]; then
  T "srun -N2 torchrun --nnodes 2 --nproc-per-node 2 (gloo all_reduce)" \
    'rank=0/4 host=node1 .* OK' 'rank=3/4 host=node2 .* OK' \
    -- srun -N2 --ntasks-per-node=1 "$PY/torchrun" --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
       --rdzv-endpoint node1:29400 --rdzv-id slurm-check "$CLUSTER_DIR/torch_smoke.py"
else
  echo "SKIP torchrun ($PY/torchrun missing)"
fi
exit $rc
