"""A platform's master node against the launcher inside the job, with the real torchrun.

Azure ML names a master node (AZ_BATCH_MASTER_NODE), SageMaker a first host (SM_HOSTS[0]):
where the platform itself starts rank 0. A job that runs torchrun per node with a c10d
rendezvous at that node does not put rank 0 there: torch orders the rendezvous' participants
by their address (`DynamicRendezvousHandler`, sorted participants) and the rank-0 agent
passes its own address as MASTER_ADDR. Two agents on this host, one at 127.0.0.2 (the
rendezvous endpoint, the platform's master node) and one at 127.0.0.1: rank 0 is the
second's. Every worker must resolve torchrun's MASTER_ADDR (where its rank 0 and the store
are), not the platform's node, with a note naming both, and no host list in the platform's
order (torchrun numbers nodes in rendezvous order; node 0 is not its first host).
"""
from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

import harness

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(300)]

WORKER = Path(__file__).with_name("platform_master_probe.py")
ENDPOINT, OTHER = "127.0.0.2", "127.0.0.1"

PLATFORMS = {
    "azureml": {"AZ_BATCH_MASTER_NODE": f"{ENDPOINT}:6000",
                "AZ_BATCH_HOST_LIST": f"{ENDPOINT},{OTHER}", "AZUREML_RUN_ID": "run-1"},
    "sagemaker": {"SM_HOSTS": json.dumps([ENDPOINT, OTHER]), "SM_CURRENT_HOST": ENDPOINT,
                  "TRAINING_JOB_NAME": "job-1"},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((ENDPOINT, 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_torchrun_c10d_rank0_off_the_platform_master(torch_python, platform):
    port = _free_port()
    env = harness.clean_env({**PLATFORMS[platform], "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    procs = []
    for addr in (ENDPOINT, OTHER):
        # SageMaker sets SM_CURRENT_HOST per host; Azure's variables are the same on every node.
        agent_env = dict(env, **({"SM_CURRENT_HOST": addr} if platform == "sagemaker" else {}))
        procs.append(subprocess.Popen(
            [torch_python, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ENDPOINT}:{port}", "--rdzv-id", "j1",
             "--max-restarts", "0", "--local-addr", addr, str(WORKER)],
            env=agent_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/"))
    records = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        records += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in records) == [0, 1], records
    rank0 = next(r for r in records if r["rank"] == 0)
    assert rank0["env_master"] == OTHER, ("torchrun put rank 0 on the endpoint's node: the case "
                                          "this test is for did not happen", records)
    for r in records:
        assert r["launcher"] == "torchrun" and r["platform"] == platform, r
        assert r["master_addr"] == r["env_master"] == OTHER, r
        assert r["hosts"] is None and r["num_nodes"] == 2, r
        assert any(ENDPOINT in n and f"{OTHER} is used" in n for n in r["notes"]), r["notes"]
