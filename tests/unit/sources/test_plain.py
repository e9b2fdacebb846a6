"""The resolver on the plain torch variables with no launcher marker
(src/distenv/sources/plain.py): RANK/WORLD_SIZE set by hand, and the partial sets that are errors."""

import pytest

from distenv import DistEnvError, resolve


def test_plain_env_variables():
    env = resolve({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                   "MASTER_PORT": "1234"})
    assert (env.launcher, env.rank, env.master_addr, env.master_port) == ("env", 1, "10.0.0.1", 1234)


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"WORLD_SIZE": "4"}, {"LOCAL_RANK": "2"}])
def test_partial_torch_variables_are_errors(env):
    with pytest.raises(DistEnvError):
        resolve(env)


def test_world_size_one_alone_is_a_single_process():
    assert resolve({"WORLD_SIZE": "1"}).rank == 0
    assert resolve({"LOCAL_RANK": "0"}).launcher == "none"


# -- Lightning's on-prem launch ------------------------------------------------------------------
# The peer's case: Lightning's guide "Run on an on-prem cluster (intermediate)": on each node
# MASTER_ADDR, MASTER_PORT, WORLD_SIZE (the total number of processes) and NODE_RANK, then
# `python train.py` with Trainer(devices=8, num_nodes=4). distenv raised "WORLD_SIZE='32' is set
# but RANK is not ... set RANK too", wrong advice for a per-node process.
ONPREM = {"MASTER_ADDR": "10.10.10.16", "MASTER_PORT": "29500", "WORLD_SIZE": "32", "NODE_RANK": "1"}


def test_lightning_onprem_launch_is_per_node_with_the_workers_per_node_unknown():
    env = resolve(ONPREM)
    assert (env.launcher, env.launch) == ("env", "per-node")
    assert (env.node_rank, env.world_size, env.master_addr, env.master_port) == (1, 32, "10.10.10.16", 29500)
    assert env.nproc_per_node is None and env.num_nodes is None and env.rank is None
    assert any("DISTENV_NPROC_PER_NODE" in n and "devices" in n for n in env.notes)


def test_lightning_onprem_launch_with_the_workers_per_node_given():
    env = resolve({**ONPREM, "DISTENV_NPROC_PER_NODE": "8"})
    assert (env.launch, env.node_rank, env.num_nodes, env.nproc_per_node) == ("per-node", 1, 4, 8)
    assert (env.world_size, env.local_world_size) == (32, 8)
    assert resolve(ONPREM, nproc_per_node=4).num_nodes == 8


def test_lightning_onprem_launch_one_worker_per_node_is_the_worker():
    env = resolve({**ONPREM, "WORLD_SIZE": "4", "DISTENV_NPROC_PER_NODE": "1"})
    assert (env.launch, env.rank, env.world_size, env.local_rank, env.num_nodes) == ("per-process", 1, 4, 0, 4)


@pytest.mark.parametrize("extra,match", [
    ({"DISTENV_NPROC_PER_NODE": "5"}, "world_size=32"),          # 32 is no multiple of 5
    ({"DISTENV_NPROC_PER_NODE": "8", "NODE_RANK": "4"}, "node_rank=4"),   # 4 nodes: 0..3
    # what Lightning's launcher gives the workers it starts (no RANK): not a node with a stray
    # LOCAL_RANK to unset (that made the worker a node process), but the hand-off to ask for
    ({"LOCAL_RANK": "0"}, r"a worker Lightning started.*Fix: pass distenv\.lightning\.DistenvEnvironment"),
])
def test_lightning_onprem_contradictions_are_errors(extra, match):
    with pytest.raises(DistEnvError, match=match):
        resolve({**ONPREM, **extra})


def test_world_size_and_local_rank_without_node_rank_say_which_to_unset():
    with pytest.raises(DistEnvError, match="a worker needs RANK too.*unset LOCAL_RANK there"):
        resolve({"WORLD_SIZE": "8", "LOCAL_RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})


def test_world_size_alone_gives_the_per_node_fix_too():
    with pytest.raises(DistEnvError, match="set NODE_RANK"):
        resolve({"WORLD_SIZE": "32", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
