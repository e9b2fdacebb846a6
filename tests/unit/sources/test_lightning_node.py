"""The resolver in a worker Lightning started from a per-node process
(src/distenv/sources/lightning_node.py): the node's hand-off (DISTENV_LIGHTNING_NODE) read back,
with Lightning's own LOCAL_RANK."""

import json

import pytest

from distenv import DistEnvError, resolve
from distenv.sources.lightning_node import VARIABLE, hand_off
from envs import ompi4

PER_NODE = {"DISTENV_NPROC_PER_NODE": "2"}


def _node(rank=1):
    """Node `rank` of an Open MPI per-node launch: 2 nodes, 2 workers each."""
    environ = ompi4(rank, 2, 0, 1, 2, PER_NODE)
    return environ, resolve(environ)


@pytest.mark.parametrize("node,local,rank", [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)])
def test_a_worker_is_node_rank_times_devices_plus_local_rank(node, local, rank):
    environ, env = _node(node)
    worker = {**environ, VARIABLE: hand_off(env, 2, 2), "LOCAL_RANK": str(local),
              "NODE_RANK": str(node), "WORLD_SIZE": "4"}
    w = resolve(worker)
    assert (w.launcher, w.launch) == ("lightning", "per-process")
    assert (w.rank, w.local_rank, w.world_size, w.local_world_size) == (rank, local, 4, 2)
    assert (w.node_rank, w.num_nodes, w.nproc_per_node) == (node, 2, 2)
    assert (w.master_addr, w.master_port) == (env.master_addr, env.master_port)
    assert VARIABLE in w.provenance["world_size"] and "LOCAL_RANK" in w.provenance["local_rank"]


def test_the_node_process_itself_is_still_described_by_its_launcher():
    environ, env = _node(1)
    both = resolve({**environ, VARIABLE: hand_off(env, 2, 2)})  # no LOCAL_RANK yet
    assert (both.launcher, both.launch) == ("openmpi", "per-node")


def test_hand_off_carries_the_trainer_s_devices_and_nodes():
    _, env = _node(1)
    node = json.loads(hand_off(env, 3, 2))
    assert (node["nproc_per_node"], node["local_world_size"], node["num_nodes"], node["world_size"]) == (3, 3, 2, 6)
    assert node["launch"] == "per-node" and node["rank"] is None and node["local_rank"] is None


@pytest.mark.parametrize("value,extra,match", [
    ("not json", {}, "not valid JSON"),
    ("[1, 2]", {}, "not a JSON object"),
    ('{"nproc_per_node": 0, "num_nodes": 1, "world_size": 1}', {}, "no valid nproc_per_node"),
    (None, {"LOCAL_RANK": "2"}, "LOCAL_RANK=2 but"),
    (None, {"WORLD_SIZE": "8"}, "WORLD_SIZE=8 contradicts"),
])
def test_a_bad_hand_off_is_an_error(value, extra, match):
    environ, env = _node(0)
    worker = {**environ, VARIABLE: value if value is not None else hand_off(env, 2, 2),
              "LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "4", **extra}
    with pytest.raises(DistEnvError, match=match):
        resolve(worker)
