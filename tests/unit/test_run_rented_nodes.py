"""`distenv run -- python main.py` as the whole launch line of a SkyPilot or dstack task (issue 31),
or of an AWS Batch multi-node parallel job (issue 41, item 4: the launcher added to try the recipe).

A simulated two-node launch on this machine: two `distenv run --nproc-per-node 2` processes,
each given one node's variables as the platform documents them (the recorded environments in
tests/fixtures/platforms/, with node 0 at 127.0.0.1 and node 1 at 127.0.0.2, both this
machine's loopback). Nothing else is set: no MASTER_ADDR (but on AWS Batch's main node, which
AWS Batch gives no address), no MASTER_PORT, no node rank. Each
process starts its two workers with torch.distributed.run; the workers (DISTENV_AUTO=1) run
examples/pytorch_ddp.py unchanged. The four must train as one job: rank 0 gathers every rank's
parameter checksum (all identical), the ranks are 0..3, and the final loss and parameters equal
a single-process run over the same global batches (within float tolerance: DDP averages four
partial gradients where one process takes one mean), as tests/e2e/test_torch_e2e.py checks
under real launchers. Before this issue each node resolved as launcher "none" and trained
alone.
"""

import json
import math
import os
import socket
import subprocess
from pathlib import Path

import pytest

from distenv import resolve
from envs import platform

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "pytorch_ddp.py")
VENV_PY = ROOT / ".venv" / "bin" / "python"
DISTENV = ROOT / ".venv" / "bin" / "distenv"
NODE_IPS = ("127.0.0.1", "127.0.0.2")

pytestmark = pytest.mark.required  # .venv's torch is on CI's machine: a skip there is a failure


def have_torch():
    return VENV_PY.exists() and subprocess.run(
        [str(VENV_PY), "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"],
        timeout=60).returncode == 0


def clean_env(extra):
    """This machine's environment without any launcher's or torch's variables, this checkout's
    distenv first on the path, and `extra`."""
    drop = ("OMPI_", "PMI", "PMIX_", "SLURM_", "DISTENV_", "TORCHELASTIC_", "HYDRA_", "MPI_LOCAL",
            "PET_", "SKYPILOT_", "DSTACK_", "JOB_COMPLETION_INDEX", "CUDA_VISIBLE_DEVICES")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k not in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "NODE_RANK", "GROUP_RANK", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env.update(extra)
    return env


def skypilot_node(node, task):
    env = {k: v for k, v in platform(f"skypilot_2x4_node{node}").items()
           if k.startswith("SKYPILOT_")}
    env.update(SKYPILOT_NODE_IPS="\n".join(NODE_IPS), SKYPILOT_TASK_ID=task)
    return env


def dstack_node(node, run_id):
    env = {k: v for k, v in platform(f"dstack_2x4_node{node}").items() if k.startswith("DSTACK_")}
    env.update(DSTACK_NODES_IPS="\n".join(NODE_IPS), DSTACK_MASTER_NODE_IP=NODE_IPS[0],
               DSTACK_RUN_ID=run_id)
    return env


def aws_batch_node(node, job):
    """Node rank `node` of an AWS Batch job whose main node has index 1 (`mainNode: 1`): node
    rank 0 is the main node, which AWS Batch gives no address, so it sets MASTER_ADDR to its own
    (as distenv's error there says); node rank 1 (index 0) is given the main node's."""
    main = node == 0
    env = {k: v for k, v in platform("aws_batch_2x8_child_node1").items() if k.startswith("AWS_BATCH_")}
    env.update(AWS_BATCH_JOB_ID=f"{job}#{1 - node}", AWS_BATCH_JOB_NODE_INDEX=str(1 - node),
               AWS_BATCH_JOB_MAIN_NODE_INDEX="1")
    del env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]
    env.update({"MASTER_ADDR": NODE_IPS[0]} if main
               else {"AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": NODE_IPS[0]})
    return env


NODES = {"skypilot": skypilot_node, "dstack": dstack_node, "aws_batch": aws_batch_node}


def held_job(make):
    """(job id, socket): a job id whose derived master port (distenv.core.ports, the same on both
    nodes) this pytest process can bind, bound with SO_REUSEADDR and never listening, so that
    nothing else takes it before the job's TCPStore (which binds with SO_REUSEADDR too) does."""
    for i in range(50):
        job = f"distenv-test-{os.getpid()}-{i}"
        port = resolve(make(0, job)).master_port
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        return job, s
    raise AssertionError("no job id with a free derived port in 50 tries")


def summary(out):
    found = [json.loads(line) for line in out.splitlines()
             if line.startswith("{") and '"example": "pytorch_ddp"' in line]
    assert len(found) == 1, out
    return found[0]


def close(a, b, rel=1e-4):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-6)


@pytest.fixture(scope="module")
def reference():
    """The same training in one process, no launcher."""
    if not have_torch():
        pytest.skip("torch is not installed in .venv (integrations/setup.sh)")
    p = subprocess.run(["timeout", "-k", "5", "180", str(VENV_PY), EXAMPLE], env=clean_env({}),
                       capture_output=True, text=True, timeout=210)
    assert p.returncode == 0, p.stdout + p.stderr
    ref = summary(p.stdout)
    assert ref["world_size"] == 1 and ref["launcher"] == "none"
    return ref


@pytest.mark.parametrize("name", sorted(NODES))
def test_two_nodes_train_four_workers_to_identical_weights(name, reference):
    make = NODES[name]
    job, held = held_job(make)
    cmd = ["timeout", "-k", "5", "240", str(DISTENV), "run", "--nproc-per-node", "2", "--",
           str(VENV_PY), EXAMPLE]
    with held:
        procs = [subprocess.Popen(cmd, env=clean_env(make(node, job)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for node in (0, 1)]
        outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    out = summary(outs[0][0])  # rank 0 runs on node 0
    assert not any('"example": "pytorch_ddp"' in o for o, _ in outs[1:]), outs
    assert out["launcher"] == "torchrun" and out["launch"] == "per-process", out
    assert out["world_size"] == 4 and out["ranks"] == [0, 1, 2, 3], out
    assert out["local_ranks"] == [0, 1, 0, 1], out
    assert len(set(out["checksums"])) == 1, f"ranks ended with different parameters: {out}"
    assert out["steps"] == reference["steps"], (out, reference)
    assert close(out["final_loss"], reference["final_loss"]), (out["final_loss"], reference["final_loss"])
    assert close(out["checksum"], reference["checksum"]), (out["checksum"], reference["checksum"])
