#!/bin/bash
# Bring up a two-"node" cluster on this machine: a private bridge plus one
# network namespace per node (node1, node2), each with a veth on the bridge,
# its own IP, lo up, and an /etc/hosts entry. Idempotent. Needs root.
# Run things on a node with ./on-node NODE CMD... (own netns + own hostname).
set -euo pipefail
. "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
[ "$(id -u)" = 0 ] || { echo "up.sh: needs root (ip netns, veth, bridge, /etc/hosts)" >&2; exit 1; }
mkdir -p "$CLUSTER_STATE"

# Bridge in the root namespace, with the head address on it.
if ! ip link show "$CLUSTER_BRIDGE" >/dev/null 2>&1; then
  ip link add "$CLUSTER_BRIDGE" type bridge
fi
ip addr replace "$CLUSTER_HEAD_ADDR/24" dev "$CLUSTER_BRIDGE"
ip link set "$CLUSTER_BRIDGE" up

for n in "${CLUSTER_NODES[@]}"; do
  addr=$(cluster_addr "$n")
  host_if=dv-$n                      # root-namespace end of the veth pair
  [ -e "/run/netns/$n" ] || ip netns add "$n"
  ns=(nsenter "--net=/run/netns/$n")
  if ! "${ns[@]}" ip link show "$CLUSTER_IF" >/dev/null 2>&1; then
    # a half-made pair from an interrupted run
    ip link del "$host_if" 2>/dev/null || true
    ip link add "$host_if" type veth peer name "$host_if-p"
    ip link set "$host_if-p" netns "$n"
    "${ns[@]}" ip link set "$host_if-p" name "$CLUSTER_IF"
  fi
  ip link set "$host_if" master "$CLUSTER_BRIDGE"
  ip link set "$host_if" up
  "${ns[@]}" ip addr replace "$addr/24" dev "$CLUSTER_IF"
  "${ns[@]}" ip link set "$CLUSTER_IF" up
  "${ns[@]}" ip link set lo up
done

# /etc/hosts: rewrite in place (cat >, not sed -i / mv) so a bind-mounted
# /etc/hosts keeps its inode. Lines carry a tag so down.sh can remove them.
tmp=$(mktemp)
grep -v -- "$CLUSTER_HOSTS_TAG\$" /etc/hosts > "$tmp" || true
for n in "${CLUSTER_NODES[@]}"; do
  printf '%s %s %s\n' "$(cluster_addr "$n")" "$n" "$CLUSTER_HOSTS_TAG" >> "$tmp"
done
cmp -s "$tmp" /etc/hosts || cat "$tmp" > /etc/hosts
rm -f "$tmp"

# Wait until each node can reach the other over the bridge (DAD/bridge learning).
probe() { # $1=node $2=addr : TCP connect to a closed port gives "refused" quickly when reachable
  "$CLUSTER_DIR/on-node" "$1" python3 - "$2" <<'PY'
import socket, sys, errno
s = socket.socket(); s.settimeout(1)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    sys.exit(0)
except OSError:
    sys.exit(1)
sys.exit(0)
PY
}
for i in $(seq 50); do
  if probe node1 "$(cluster_addr node2)" && probe node2 "$(cluster_addr node1)"; then
    echo "cluster up: ${CLUSTER_NODES[*]} on $CLUSTER_PREFIX.0/24 (bridge $CLUSTER_BRIDGE, head $CLUSTER_HEAD_ADDR)"
    exit 0
  fi
  sleep 0.1
done
echo "up.sh: nodes cannot reach each other" >&2; exit 1
