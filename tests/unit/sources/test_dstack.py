"""The resolver on dstack distributed tasks (src/distenv/sources/dstack.py), written from
dstack's source and documentation (tests/fixtures/platforms/dstack_*.json).

What dstack and SkyPilot share (the documented cases, the master, torchrun's plan, hand-set
variables that contradict) is tested once for both in test_node_list_platforms.py.
"""

import pytest

from distenv import DistEnvError, resolve
from envs import platform, torchrun

NODE0, NODE1 = platform("dstack_2x4_node0"), platform("dstack_2x4_node1")
IPS = NODE0["DSTACK_NODES_IPS"].split("\n")


def test_the_job_id_is_the_run_s_not_the_per_node_job_s(no_gpus):
    a, b = resolve(NODE0), resolve(NODE1)
    assert a.job_id == b.job_id == "distenv-ddp"
    # DSTACK_JOB_ID differs between the nodes (one job per node): never the port's key.
    assert NODE0["DSTACK_JOB_ID"] != NODE1["DSTACK_JOB_ID"]


@pytest.mark.parametrize("drop", ["DSTACK_NODES_IPS", "DSTACK_GPUS_NUM"])
def test_before_0_18_25_the_master_ip_alone_gives_the_master(no_gpus, drop):
    env = dict(NODE1)
    del env[drop]
    got = resolve(env)
    assert (got.node_rank, got.num_nodes, got.master_addr, got.nproc_per_node) == (1, 2, IPS[0], 4)
    if drop == "DSTACK_NODES_IPS":
        assert got.hosts is None and "DSTACK_MASTER_NODE_IP" in got.provenance["master_addr"]


def test_nodes_with_different_gpu_counts_need_the_workers_per_node(no_gpus):
    # Node groups: this node has 4 GPUs, the run 12 on 2 nodes (a node of 8, or 4 + 8).
    uneven = dict(NODE1, DSTACK_GPUS_NUM="12")
    with pytest.raises(DistEnvError) as err:
        resolve(uneven)
    assert "DSTACK_GPUS_NUM=12 is not DSTACK_NODES_NUM=2 x DSTACK_GPUS_PER_NODE=4" in str(err.value)
    assert "--nproc-per-node N" in err.value.fix
    given = resolve(dict(uneven, DISTENV_NPROC_PER_NODE="2"))
    assert (given.nproc_per_node, given.world_size) == (2, 4)
    assert resolve(uneven, nproc_per_node=2).world_size == 4
    # a word is no count: each node applies it to its own GPUs (or cores), and the nodes differ
    # (it passed before: this node's 8 GPUs gave world 16 while the other node ran 4)
    eight = dict(uneven, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    for word in ("gpu", "auto", "GPU", "cpu"):
        with pytest.raises(DistEnvError, match="DSTACK_GPUS_NUM=12 is not"):
            resolve(dict(eight, DISTENV_NPROC_PER_NODE=word))
        with pytest.raises(DistEnvError, match="DSTACK_GPUS_NUM=12 is not"):
            resolve(eight, nproc_per_node=word)


# -- bad input: one line with a Fix, never a guess -------------------------------------------
@pytest.mark.parametrize("change, words", [
    ({"DSTACK_NODE_RANK": "2"}, "DSTACK_NODE_RANK=2 is not below DSTACK_NODES_NUM=2"),
    ({"DSTACK_NODES_NUM": "3"}, "lists 2 address(es) but DSTACK_NODES_NUM=3"),
    ({"DSTACK_NODES_IPS": "10.0.12.5\n10.0.12.9\n10.0.12.7"}, "lists 3 address(es) but DSTACK_NODES_NUM=2"),
    ({"DSTACK_NODES_IPS": ""}, "DSTACK_NODES_IPS is empty"),
    ({"DSTACK_NODES_IPS": "10.0.12.5\n"}, "lists 1 address(es) but DSTACK_NODES_NUM=2"),
    ({"DSTACK_MASTER_NODE_IP": "10.0.12.9"}, "DSTACK_MASTER_NODE_IP='10.0.12.9' is not the first line"),
])
def test_bad_input_is_one_line_with_a_fix(no_gpus, change, words):
    with pytest.raises(DistEnvError) as err:
        resolve(dict(NODE1, **change))
    text = str(err.value)
    assert words in text and "\n" not in text
    assert err.value.fix and "as dstack's runner sets them" in err.value.fix


def test_torchrun_inside_the_task_describes_its_worker(no_gpus):
    worker = resolve({**NODE0, **torchrun(2, nodes=2, nproc=4, addr=IPS[0])})
    assert (worker.launcher, worker.rank) == ("torchrun", 2)
