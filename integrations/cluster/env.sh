# Shared settings for the two-node cluster scripts (sourced, not executed).
# Override any of these in the environment before calling up.sh/down.sh.
CLUSTER_DIR=$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
CLUSTER_REPO=$(CDPATH= cd -- "$CLUSTER_DIR/../.." && pwd)   # the checkout these scripts are in
CLUSTER_STATE=${DISTENV_RUN_DIR:-/tmp/distenv-run}/cluster
CLUSTER_BRIDGE=${CLUSTER_BRIDGE:-distenv-br0}
CLUSTER_PREFIX=${CLUSTER_PREFIX:-10.213.77}          # a /24 nobody else uses
CLUSTER_HEAD_ADDR=$CLUSTER_PREFIX.1                  # on the bridge, root namespace
CLUSTER_NODES=(node1 node2)
CLUSTER_IF=${CLUSTER_IF:-clus0}                      # interface name inside each node
# node1 -> .11, node2 -> .12
cluster_addr() { echo "$CLUSTER_PREFIX.$((10 + ${1#node}))"; }
CLUSTER_HOSTS_TAG="# distenv-cluster"
