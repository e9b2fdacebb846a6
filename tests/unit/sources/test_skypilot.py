"""The resolver on SkyPilot tasks (src/distenv/sources/skypilot.py), written from SkyPilot's
source and documentation (tests/fixtures/platforms/skypilot_*.json).

What dstack and SkyPilot share (the documented cases, the master, torchrun's plan, hand-set
variables that contradict) is tested once for both in test_node_list_platforms.py.
"""

import pytest

from distenv import DistEnvError, resolve, run
from envs import platform, torchrun

NODE0, NODE1 = platform("skypilot_2x4_node0"), platform("skypilot_2x4_node1")
IPS = NODE0["SKYPILOT_NODE_IPS"].split("\n")


def test_run_counts_the_reserved_gpus(no_gpus, monkeypatch):
    monkeypatch.setattr(run, "_has_torch", lambda python, environ: True)
    # --nproc-per-node gpu counts the GPUs Ray gave the run commands (CUDA_VISIBLE_DEVICES):
    # the task's reserved GPUs, as SKYPILOT_NUM_GPUS_PER_NODE says.
    p = run.plan(["--nproc-per-node", "gpu", "python", "main.py"], NODE1)
    assert dict(zip(p.argv[4:-3:2], p.argv[5:-3:2]))["--nproc-per-node"] == "4"
    # --nproc-per-node N wins over SKYPILOT_NUM_GPUS_PER_NODE.
    p = run.plan(["--nproc-per-node", "2", "python", "main.py"], NODE1)
    assert dict(zip(p.argv[4:-3:2], p.argv[5:-3:2]))["--nproc-per-node"] == "2"
    assert p.env.world_size == 4


def test_the_node_count_is_the_address_lines_without_skypilot_num_nodes(no_gpus):
    env = dict(NODE1)
    del env["SKYPILOT_NUM_NODES"]
    got = resolve(env)
    assert (got.num_nodes, got.master_addr) == (2, IPS[0])
    assert "SKYPILOT_NODE_IPS" in got.provenance["num_nodes"]


# -- bad input: one line with a Fix, never a guess -------------------------------------------
@pytest.mark.parametrize("change, words", [
    ({"SKYPILOT_NODE_RANK": "2"}, "SKYPILOT_NODE_RANK=2 is not below the node count 2"),
    ({"SKYPILOT_NUM_NODES": "3"}, "lists 2 address(es) but the task has 3 nodes"),
    ({"SKYPILOT_NODE_IPS": ""}, "SKYPILOT_NODE_IPS is empty"),
    ({"SKYPILOT_NODE_IPS": "  \n "}, "SKYPILOT_NODE_IPS is empty"),
    ({"SKYPILOT_NODE_IPS": "172.31.11.42\n\n172.31.7.150"}, "line 2 is ''"),
    ({"SKYPILOT_NODE_IPS": "172.31.11.42 172.31.7.150", "SKYPILOT_NUM_NODES": "1",
      "SKYPILOT_NODE_RANK": "0"}, "line 1 is '172.31.11.42 172.31.7.150'"),
])
def test_bad_input_is_one_line_with_a_fix(no_gpus, change, words):
    with pytest.raises(DistEnvError) as err:
        resolve(dict(NODE1, **change))
    text = str(err.value)
    assert words in text and "\n" not in text
    assert err.value.fix and "as SkyPilot sets them" in err.value.fix


def test_more_addresses_than_nodes_leave_the_master_unknown_with_a_note(no_gpus):
    # SkyPilot on Slurm lists the whole Slurm job's nodes: which line is node 0 is not proven.
    env = resolve(dict(NODE1, SKYPILOT_NODE_IPS="10.0.0.1\n10.0.0.2\n10.0.0.3"))
    assert env.master_addr is None and env.hosts is None
    assert any("SKYPILOT_NODE_IPS lists 3 addresses for 2 node(s)" in n and "Fix:" in n
               for n in env.notes)


# -- contradictions with variables set by hand -------------------------------------------------
def test_a_hand_set_master_addr_the_list_does_not_hold_is_used_with_a_note(no_gpus):
    # A name the list does not hold (node 0's host name, another interface) cannot be checked:
    # the user's value is used, and the note says instead of what.
    named = resolve(dict(NODE1, MASTER_ADDR="head-node"))
    assert named.master_addr == "head-node"
    assert any("is used instead of 172.31.11.42" in n for n in named.notes)


def test_a_hand_set_world_size_of_nodes_contradicts_the_workers(no_gpus):
    # A recipe's WORLD_SIZE=$SKYPILOT_NUM_NODES is the node count, not the 8 workers.
    with pytest.raises(DistEnvError, match="WORLD_SIZE=2 contradicts"):
        resolve(dict(NODE1, WORLD_SIZE="2"))


# -- what is not this source's ------------------------------------------------------------------
def test_setup_commands_are_not_a_run_node(no_gpus):
    setup = {"SKYPILOT_SETUP_NODE_RANK": "1", "SKYPILOT_SETUP_NODE_IPS": NODE1["SKYPILOT_NODE_IPS"],
             "SKYPILOT_NUM_NODES": "2"}
    assert resolve(setup).launcher == "none"


def test_launchers_started_inside_the_task_describe_their_processes(no_gpus):
    # SkyPilot's own recipe: torchrun on every node; its workers keep SKYPILOT_*.
    worker = resolve({**NODE1, **torchrun(5, nodes=2, nproc=4, addr=IPS[0]),
                      "GROUP_RANK": "1", "NODE_RANK": "1"})
    assert (worker.launcher, worker.rank, worker.node_rank) == ("torchrun", 5, 1)
    srun = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    # SkyPilot's Slurm backend runs the commands inside srun --ntasks-per-node=1.
    assert resolve({**NODE1, **srun}).launcher == "slurm"


def test_distenv_run_s_workers_resolve_as_torchrun_with_the_same_launch(no_gpus, monkeypatch):
    """What a worker of `distenv run` on node 1 sees: SkyPilot's variables, what distenv run
    exported (NODE_RANK, MASTER_ADDR, ...) and torchrun's own: DISTENV_AUTO and the adapters
    resolve it as torchrun's worker, agreeing with the node's plan (no contradiction)."""
    monkeypatch.setattr(run, "_has_torch", lambda python, environ: True)
    p = run.plan(["--nproc-per-node", "2", "python", "main.py"], NODE1)
    worker = {**p.environ, **torchrun(3, nodes=2, nproc=2, addr=p.env.master_addr,
                                      port=str(p.env.master_port)), "GROUP_RANK": "1"}
    got = resolve(worker)
    assert (got.launcher, got.rank, got.world_size, got.node_rank) == ("torchrun", 3, 4, 1)
    assert (got.master_addr, got.master_port) == (IPS[0], p.env.master_port)
    assert p.environ["DISTENV_AUTO"] == "1"
