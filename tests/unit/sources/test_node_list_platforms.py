"""What dstack and SkyPilot tasks share (src/distenv/sources/dstack.py, skypilot.py): a node
rank, a node count and every node's address in one variable, a per-node launch that
`distenv run` turns into torchrun's. Each platform's own rules stay in test_dstack.py and
test_skypilot.py. Recorded environments: tests/fixtures/platforms/<platform>_2x4_node*.json.

Before these sources, a node of a 2-node task resolved as launcher "none", one node, master
127.0.0.1: `distenv run` on every node started one-node jobs that trained alone.
"""

import pytest

from distenv import DistEnvError, resolve, run
from envs import documented, platform, platform_case

#: per platform: its address list, its node rank, another run's id, a node without GPUs
PLATFORMS = {
    "dstack": dict(ips="DSTACK_NODES_IPS", rank="DSTACK_NODE_RANK",
                   other={"DSTACK_RUN_ID": "0f5e3d1c-0000-4000-8000-000000000002"},
                   cpu={"DSTACK_GPUS_PER_NODE": "0", "DSTACK_GPUS_NUM": "0"}),
    "skypilot": dict(ips="SKYPILOT_NODE_IPS", rank="SKYPILOT_NODE_RANK",
                     other={"SKYPILOT_TASK_ID": "sky-2026-08-20-10-00-00-000001_other_4"},
                     cpu={"SKYPILOT_NUM_GPUS_PER_NODE": "0", "CUDA_VISIBLE_DEVICES": ""}),
}


def nodes(name: str) -> "tuple[dict, dict, list[str]]":
    node0, node1 = platform(f"{name}_2x4_node0"), platform(f"{name}_2x4_node1")
    return node0, node1, node0[PLATFORMS[name]["ips"]].split("\n")


@pytest.mark.parametrize("case", [c for name in PLATFORMS for c in documented(name)])
def test_documented_platform_environment(case, check_documented):
    check_documented(case)


@pytest.mark.parametrize("name, case", [(name, c) for name in PLATFORMS for c in documented(name)])
def test_distenv_show_json_gives_the_node_rank_count_and_master(name, case, show_json):
    recorded = platform_case(case)
    got = show_json(recorded["env"])
    assert (got["launcher"], got["node_rank"], got["num_nodes"], got["master_addr"]) == (
        name, recorded["expected"]["node_rank"], 2, nodes(name)[2][0])


@pytest.mark.parametrize("name", PLATFORMS)
def test_both_nodes_agree_on_the_master_and_port_and_another_run_differs(name, no_gpus):
    node0, node1, ips = nodes(name)
    a, b = resolve(node0), resolve(node1)
    assert (a.master_addr, a.master_port, a.job_id) == (b.master_addr, b.master_port, b.job_id)
    assert a.hosts == b.hosts == tuple(ips) and (a.node_rank, b.node_rank) == (0, 1)
    assert resolve(dict(node1, **PLATFORMS[name]["other"])).master_port != a.master_port


@pytest.mark.parametrize("name", PLATFORMS)
def test_run_plans_torchrun_with_the_node_and_one_worker_per_gpu(name, no_gpus, monkeypatch):
    monkeypatch.setattr(run, "_has_torch", lambda python, environ: True)
    p = run.plan(["python", "main.py"], nodes(name)[1])
    assert p.mode == "torchrun" and p.argv[-2:] == ["python", "main.py"]
    opts = dict(zip(p.argv[4:-3:2], p.argv[5:-3:2]))
    assert (opts["--nnodes"], opts["--node-rank"], opts["--nproc-per-node"],
            opts["--master-addr"]) == ("2", "1", "4", nodes(name)[2][0])


@pytest.mark.parametrize("name", PLATFORMS)
def test_a_cpu_node_runs_one_worker_without_a_gpu(name, no_gpus):
    env = resolve(dict(nodes(name)[1], **PLATFORMS[name]["cpu"]))
    assert (env.launch, env.rank, env.world_size, env.node_rank) == ("per-process", 1, 2, 1)


# -- contradictions with variables set by hand -------------------------------------------------
@pytest.mark.parametrize("name", PLATFORMS)
def test_a_hand_set_master_addr_naming_another_node_is_an_error(name, no_gpus):
    node0, node1, ips = nodes(name)
    for node in (node0, node1):
        with pytest.raises(DistEnvError, match=rf"MASTER_ADDR='{ips[1]}' is node 1's address in "
                                               rf"{PLATFORMS[name]['ips']}.*Fix: unset MASTER_ADDR"):
            resolve(dict(node, MASTER_ADDR=ips[1]))
        assert resolve(dict(node, MASTER_ADDR=ips[0])).master_addr == ips[0]


@pytest.mark.parametrize("name", PLATFORMS)
def test_a_hand_set_node_rank_that_contradicts_is_an_error(name, no_gpus):
    node0, node1, _ = nodes(name)
    assert resolve(dict(node1, NODE_RANK="1")).node_rank == 1
    with pytest.raises(DistEnvError, match=f"NODE_RANK=1 contradicts {PLATFORMS[name]['rank']}=0"):
        resolve(dict(node0, NODE_RANK="1"))
