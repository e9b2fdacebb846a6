"""The resolver on AWS Batch multi-node parallel jobs (src/distenv/sources/aws_batch.py), written
from the AWS Batch User Guide (tests/fixtures/platforms/aws_batch_*.json); the two-node training
run is in ../test_run_rented_nodes.py."""

import json
import os
import subprocess
import sys

import pytest

from distenv import DistEnvError, resolve
from envs import documented, platform, torchrun

CHILD, MAIN = platform("aws_batch_2x8_child_node1"), platform("aws_batch_3x4_main_index2")
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "src")


@pytest.mark.parametrize("case", documented("aws_batch"))
def test_documented_platform_environment(case, check_documented):
    check_documented(case)


def node(index, main, count, job="4e1b9c2d-7a3f-4c5e-8d6b-0f1a2b3c4d5e", **extra):
    """One node's variables as AWS Batch documents them (the main node has no main node address)."""
    env = {"AWS_BATCH_JOB_ID": f"{job}#{index}", "AWS_BATCH_JOB_NODE_INDEX": str(index),
           "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main), "AWS_BATCH_JOB_NUM_NODES": str(count)}
    if index != main:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "10.0.7.21"
    return {**env, **extra}


@pytest.mark.parametrize("count", [2, 3, 5])
def test_the_nodes_are_numbered_once_each_with_the_main_node_first(no_gpus, count):
    for main in range(count):
        got = [resolve(node(i, main, count), nproc_per_node=2) for i in range(count)]
        assert sorted(g.node_rank for g in got) == list(range(count))
        assert got[main].node_rank == 0 and got[main].master_addr is None
        assert {g.master_addr for g in got if g.node_rank} == {"10.0.7.21"}
        assert {(g.world_size, g.num_nodes, g.master_port, g.job_id) for g in got} == {
            (2 * count, count, got[0].master_port, "4e1b9c2d-7a3f-4c5e-8d6b-0f1a2b3c4d5e")}


def test_the_job_id_is_the_job_s_whether_or_not_the_node_s_index_follows(no_gpus):
    plain = resolve(dict(CHILD, AWS_BATCH_JOB_ID=CHILD["AWS_BATCH_JOB_ID"].partition("#")[0]))
    assert plain.job_id == resolve(CHILD).job_id == resolve(MAIN).job_id
    assert plain.master_port == resolve(CHILD).master_port == resolve(MAIN).master_port
    assert resolve(dict(CHILD, AWS_BATCH_JOB_ID="other#1")).master_port != plain.master_port


def test_the_workers_per_node_are_what_the_user_gives_never_this_node_s_gpus(fake_gpus):
    fake_gpus(8)
    seen = resolve(CHILD)
    assert (seen.nproc_per_node, seen.world_size, seen.launch) == (None, None, "per-node")
    assert any("--nproc-per-node N" in n for n in seen.notes)
    for given in (resolve(dict(CHILD, DISTENV_NPROC_PER_NODE="4")), resolve(CHILD, nproc_per_node=4),
                  resolve(dict(CHILD, DISTENV_NPROC_PER_NODE=" 4")), resolve(CHILD, nproc_per_node="4")):
        assert (given.nproc_per_node, given.world_size, given.local_world_size) == (4, 8, 4)
        assert not any("--nproc-per-node" in n for n in given.notes)
    # one worker per node given: the node is the worker
    one = resolve(CHILD, nproc_per_node=1)
    assert (one.launch, one.rank, one.world_size) == ("per-process", 1, 2)
    # a rule the user gives (one per GPU) is theirs to give: each node applies it to its own
    assert resolve(dict(CHILD, DISTENV_NPROC_PER_NODE="gpu")).nproc_per_node == 8
    # no GPU here is no proof either (another node group may have some)
    none = resolve(dict(CHILD, CUDA_VISIBLE_DEVICES=""))
    assert none.rank is None and none.world_size is None
    # values given to resolve() stay (review: a rollback once dropped them)
    kept = resolve(CHILD, world_size=16, local_world_size=8, rank=9, local_rank=1)
    assert (kept.world_size, kept.local_world_size, kept.rank, kept.local_rank) == (16, 8, 9, 1)
    # one node: nothing to differ from, the resolver's default stands
    alone = resolve(node(0, 0, 1))
    assert (alone.nproc_per_node, alone.world_size, alone.master_addr) == (8, 8, "127.0.0.1")


def test_torch_variables_no_launcher_set_are_an_error_never_a_job_of_one(no_gpus):
    # a worker started by hand, or an image's stale ENV: deferring to the torch variables once
    # made LOCAL_RANK=0 alone a single process, every node training apart (second review)
    for extra in ({"LOCAL_RANK": "0"}, {"RANK": "0", "WORLD_SIZE": "1"},
                  {"RANK": "11", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                   "MASTER_ADDR": "10.0.7.21"}):
        with pytest.raises(DistEnvError) as err:
            resolve(dict(CHILD, **extra))
        assert "apart from the other nodes" in str(err.value) and "distenv run" in err.value.fix


def test_the_main_node_s_address_is_asked_on_the_main_node_only(no_gpus):
    main = resolve(MAIN)
    assert main.master_addr is None and any("on the main node only" in n for n in main.notes)
    given = resolve(dict(MAIN, MASTER_ADDR="10.0.7.30"))
    assert given.master_addr == "10.0.7.30" and given.node_rank == 0
    # once given, no note asks for it (second review: the note stayed)
    for env in (given, resolve(MAIN, master_addr="10.0.7.30")):
        assert not any("on the main node only" in n for n in env.notes), env.notes
    assert not any("on the main node only" in n for n in resolve(CHILD).notes)
    # a child node with a loopback master would wait on itself: the main node is another instance
    for loop in ("127.0.0.1", "localhost", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1",
                 "ip6-localhost", "0.0.0.0", "127.1.2.3"):
        with pytest.raises(DistEnvError) as err:
            resolve(dict(CHILD, MASTER_ADDR=loop))
        assert "rank 0 runs on the main node" in str(err.value) and "unset MASTER_ADDR" in err.value.fix
    # another address (of the main node, perhaps) is taken, with a note; "::10.0.7.21" is no loopback
    for other in ("::10.0.7.21", "10.0.7.22", "main.example"):
        assert resolve(dict(CHILD, MASTER_ADDR=other)).master_addr == other


@pytest.mark.parametrize("change, words", [
    ({"AWS_BATCH_JOB_NODE_INDEX": "2"}, "AWS_BATCH_JOB_NODE_INDEX=2 is not below AWS_BATCH_JOB_NUM_NODES=2"),
    ({"AWS_BATCH_JOB_MAIN_NODE_INDEX": "5"}, "AWS_BATCH_JOB_MAIN_NODE_INDEX=5 is not below"),
    ({"AWS_BATCH_JOB_NUM_NODES": "0"}, "AWS_BATCH_JOB_NUM_NODES"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "one"}, "AWS_BATCH_JOB_NODE_INDEX"),
    # AWS Batch sets these on every node (a starter that dropped one: no guess at the rest)
    ({"AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": ""}, "is not set on node index 1, a child node"),
    ({"AWS_BATCH_JOB_MAIN_NODE_INDEX": ""}, "AWS_BATCH_JOB_MAIN_NODE_INDEX is not set"),
    ({"AWS_BATCH_JOB_NUM_NODES": ""}, "AWS_BATCH_JOB_NUM_NODES is not set"),
])
def test_bad_input_is_one_line_with_a_fix(no_gpus, change, words):
    with pytest.raises(DistEnvError) as err:
        resolve(dict(CHILD, **change))
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.fix


def test_torchrun_inside_the_container_describes_its_worker(no_gpus):
    worker = resolve({**CHILD, **torchrun(2, nodes=2, nproc=4, addr="10.0.7.21")})
    assert (worker.launcher, worker.rank) == ("torchrun", 2)


def test_a_child_node_s_resolve_imports_nothing_more_without_a_master_address_given():
    # the loopback check parses an address only when MASTER_ADDR is given (review of the diff:
    # every child node's resolve() imported ipaddress for an empty string)
    code = ("import sys, json, distenv; env = json.loads(sys.argv[1]); before = set(sys.modules); "
            "distenv.resolve(env, nproc_per_node=2); print(sorted(set(sys.modules) - before))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(CHILD)], capture_output=True, text=True,
                       env={"PYTHONPATH": os.path.abspath(SRC), "PATH": os.environ.get("PATH", "")},
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ipaddress" not in p.stdout and "distenv.sources.aws_batch" in p.stdout, p.stdout


def _run(env, *args):
    base = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    return subprocess.run([sys.executable, "-m", "distenv", "run", *args, "--", sys.executable, "-c", "0"],
                          env={**base, **env, "PYTHONPATH": os.path.abspath(SRC), "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_distenv_run_says_what_to_give_in_one_line():
    p = _run(CHILD)
    assert p.returncode != 0 and p.stderr.count("\n") == 1, p.stderr
    assert "needs nproc_per_node" in p.stderr and "Fix: distenv run --nproc-per-node N" in p.stderr
    main = {k: v for k, v in MAIN.items() if k != "DISTENV_NPROC_PER_NODE"}
    p = _run(main, "--nproc-per-node", "2")
    assert p.returncode != 0 and p.stderr.count("\n") == 1, p.stderr
    assert "AWS Batch's main node" in p.stderr and "set MASTER_ADDR to its private IPv4" in p.stderr
