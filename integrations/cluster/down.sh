#!/bin/bash
# Tear down what up.sh (and slurm-up.sh) created: SLURM/munge daemons (by PID
# file), anything still running inside node1/node2, the namespaces (their veth
# pairs go with them), the bridge, and the tagged /etc/hosts lines.
# Safe to run when nothing is up.
set -uo pipefail
. "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
[ "$(id -u)" = 0 ] || { echo "down.sh: needs root" >&2; exit 1; }

"$CLUSTER_DIR/slurm-down.sh" || true

for n in "${CLUSTER_NODES[@]}"; do
  [ -e "/run/netns/$n" ] || continue
  # Leftover processes in the node (ranks, orted, hydra proxies, ...): they
  # belong to this cluster, and a namespace with live members never goes away.
  pids=$(ip netns pids "$n" 2>/dev/null | tr '\n' ' ')
  if [ -n "${pids// }" ]; then
    echo "down.sh: stopping leftover processes in $n: $pids" >&2
    kill $pids 2>/dev/null || true
    for i in $(seq 30); do [ -z "$(ip netns pids "$n" 2>/dev/null)" ] && break; sleep 0.1; done
    pids=$(ip netns pids "$n" 2>/dev/null | tr '\n' ' ')
    [ -n "${pids// }" ] && kill -9 $pids 2>/dev/null || true
  fi
  ip netns del "$n"
done
for n in "${CLUSTER_NODES[@]}"; do ip link del "dv-$n" 2>/dev/null || true; done
ip link del "$CLUSTER_BRIDGE" 2>/dev/null || true

if grep -q -- "$CLUSTER_HOSTS_TAG\$" /etc/hosts; then
  tmp=$(mktemp)
  grep -v -- "$CLUSTER_HOSTS_TAG\$" /etc/hosts > "$tmp"
  cat "$tmp" > /etc/hosts          # in place: keeps the inode of a bind mount
  rm -f "$tmp"
fi
echo "cluster down"
