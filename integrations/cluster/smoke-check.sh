#!/bin/bash
# Rendezvous smoke test over real TCP between the namespaces: torch_smoke.py
# (gloo init_process_group + all_reduce + all_gather of hostnames) under each
# MPI launcher, with mpirun/mpiexec inside node1 and ./fakessh as the agent.
# Shows the bytes that crossed node2's veth during each run.
set -uo pipefail
. "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
"$CLUSTER_DIR/up.sh" >/dev/null
L=${DISTENV_LAUNCHERS_DIR:-/opt/distenv-launchers}
PY=${DISTENV_VENV:-$CLUSTER_REPO/.venv}/bin/python
[ -x "$PY" ] || { echo "SKIP: no $PY"; exit 0; }
SSH=$CLUSTER_DIR/fakessh NET=$CLUSTER_PREFIX.0/24 S=$CLUSTER_DIR/torch_smoke.py
ON1=("$CLUSTER_DIR/on-node" node1 timeout -k 5 180)
bytes() { ip -s -j link show dv-node2 | python3 -c 'import json,sys;s=json.load(sys.stdin)[0]["stats64"];print(s["rx"]["bytes"]+s["tx"]["bytes"])'; }
rc=0
T() { # name nranks cmd...
  local name=$1 n=$2; shift 2
  local b0=$(bytes) t0=$(date +%s.%N) out
  out=$("$@" 2>&1)
  local st=$? dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') db=$(( $(bytes) - b0 ))
  if [ $st = 0 ] && [ "$(echo "$out" | grep -o 'hosts=[^ ]* OK' | wc -l)" = "$n" ]; then
    echo "PASS $name ($dt s, $db bytes through node2's veth)"
  else
    echo "FAIL $name (exit $st)"; echo "$out" | grep -v 'cannot be retrieved' | sed 's/^/  | /'; rc=1
  fi
  # (Intel MPI's output forwarding can glue two ranks' lines together)
  [ -n "${VERBOSE:-}" ] && echo "$out" | grep -o 'rank=[^=]*host=.*\(OK\|BAD\)' | sed 's/^/    /'
  return 0
}
T "Open MPI 4, 2x2" 4 "${ON1[@]}" mpirun --allow-run-as-root -np 4 -H node1:2,node2:2 \
  --mca plm_rsh_agent "$SSH" --mca oob_tcp_if_include "$NET" --mca btl_tcp_if_include "$NET" "$PY" "$S"
[ -x "$L/openmpi5/bin/mpirun" ] && T "Open MPI 5, 2x1" 2 "${ON1[@]}" "$L/openmpi5/bin/mpirun" --allow-run-as-root \
  -np 2 -H node1:1,node2:1 --map-by ppr:1:node --prtemca plm_ssh_agent "$SSH" "$PY" "$S"
T "MPICH 4, 2x1, GLOO_SOCKET_IFNAME=$CLUSTER_IF" 2 "${ON1[@]}" mpiexec.mpich -np 2 -hosts node1:1,node2:1 \
  -launcher ssh -launcher-exec "$SSH" -genv GLOO_SOCKET_IFNAME "$CLUSTER_IF" "$PY" "$S"
[ -x "$L/impi/bin/mpiexec.hydra" ] && T "Intel MPI, 2x1" 2 "${ON1[@]}" "$L/impi/bin/mpiexec.hydra" -np 2 \
  -hosts node1,node2 -ppn 1 -bootstrap ssh -bootstrap-exec "$SSH" "$PY" "$S"
exit $rc
