"""The resolver on dstack distributed tasks (src/distenv/sources/dstack.py), written from
dstack's source and documentation (tests/fixtures/platforms/dstack_*.json).

Before this source, a node of a 2-node dstack task resolved as launcher "none", one node,
master 127.0.0.1: `distenv run` on every node started one-node jobs that trained alone.
"""

import pytest

from distenv import DistEnvError, resolve, run
from envs import documented, platform, platform_case, torchrun

NODE0, NODE1 = platform("dstack_2x4_node0"), platform("dstack_2x4_node1")
IPS = NODE0["DSTACK_NODES_IPS"].split("\n")


@pytest.mark.parametrize("name", documented("dstack"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


@pytest.mark.parametrize("name", documented("dstack"))
def test_distenv_show_json_gives_the_node_rank_count_and_master(name, show_json):
    case = platform_case(name)
    got = show_json(case["env"])
    want = case["expected"]
    assert (got["launcher"], got["node_rank"], got["num_nodes"], got["master_addr"]) == (
        "dstack", want["node_rank"], 2, IPS[0])


def test_both_nodes_agree_on_the_master_and_port_and_another_run_differs(no_gpus):
    a, b = resolve(NODE0), resolve(NODE1)
    assert (a.master_addr, a.master_port, a.job_id) == (b.master_addr, b.master_port, b.job_id)
    assert a.job_id == "distenv-ddp" and a.hosts == b.hosts == tuple(IPS)
    # DSTACK_JOB_ID differs between the nodes (one job per node): never the port's key.
    assert NODE0["DSTACK_JOB_ID"] != NODE1["DSTACK_JOB_ID"]
    other = resolve(dict(NODE1, DSTACK_RUN_ID="0f5e3d1c-0000-4000-8000-000000000002"))
    assert other.master_port != a.master_port


def test_run_plans_torchrun_with_the_node_and_one_worker_per_gpu(no_gpus, monkeypatch):
    monkeypatch.setattr(run, "_has_torch", lambda python, environ: True)
    p = run.plan(["python", "main.py"], NODE1)
    assert p.mode == "torchrun"
    opts = dict(zip(p.argv[4:-3:2], p.argv[5:-3:2]))
    assert (opts["--nnodes"], opts["--node-rank"], opts["--nproc-per-node"],
            opts["--master-addr"]) == ("2", "1", "4", IPS[0])


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


def test_a_cpu_node_runs_one_worker_without_a_gpu(no_gpus):
    env = resolve(dict(NODE1, DSTACK_GPUS_PER_NODE="0", DSTACK_GPUS_NUM="0"))
    assert (env.launch, env.rank, env.world_size, env.node_rank) == ("per-process", 1, 2, 1)


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


# -- contradictions with variables set by hand -------------------------------------------------
def test_a_hand_set_master_addr_naming_another_node_is_an_error(no_gpus):
    with pytest.raises(DistEnvError, match=r"MASTER_ADDR='10.0.12.9' is node 1's address in "
                                           r"DSTACK_NODES_IPS.*Fix: unset MASTER_ADDR"):
        resolve(dict(NODE0, MASTER_ADDR=IPS[1]))
    # dstack's guide: MASTER_ADDR=$DSTACK_MASTER_NODE_IP agrees.
    assert resolve(dict(NODE0, MASTER_ADDR=NODE0["DSTACK_MASTER_NODE_IP"])).master_addr == IPS[0]


def test_a_hand_set_node_rank_that_contradicts_is_an_error(no_gpus):
    with pytest.raises(DistEnvError, match="NODE_RANK=1 contradicts DSTACK_NODE_RANK=0"):
        resolve(dict(NODE0, NODE_RANK="1"))


def test_torchrun_inside_the_task_describes_its_worker(no_gpus):
    worker = resolve({**NODE0, **torchrun(2, nodes=2, nproc=4, addr=IPS[0])})
    assert (worker.launcher, worker.rank) == ("torchrun", 2)
