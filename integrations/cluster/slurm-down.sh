#!/bin/bash
# Stop the two-node SLURM of slurm-up.sh: cancel its jobs, then slurmd x2,
# slurmctld and its munged, each by the PID in its pid file. Safe when nothing
# runs; touches no other SLURM or munged.
set -uo pipefail
. "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
run=$CLUSTER_STATE/slurm
conf=$run/slurm.conf
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() { # pidfile
  local f=$1 pid i
  [ -s "$f" ] || { rm -f "$f"; return 0; }
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$f"
}
if [ -f "$conf" ] && alive "$run/slurmctld.pid"; then
  export SLURM_CONF=$conf
  if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --full --user=root 2>/dev/null || true
    for i in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
  fi
fi
stop "$run/slurmd-node1.pid"
stop "$run/slurmd-node2.pid"
stop "$run/slurmctld.pid"
stop "$run/munge/munged.pid"
echo "two-node SLURM stopped"
