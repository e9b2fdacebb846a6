"""distenv.torch: backend, device, thread and timeout decisions on recorded launcher
environments (no torch needed), plus the in-process calls where torch is installed."""

import datetime
import json
import os
import socket
import subprocess
import sys

import pytest

from distenv import DistEnvError, resolve
from distenv.torch import (DEFAULT_RENDEZVOUS_TIMEOUT, choose_backend, choose_device,
                           choose_threads, per_node_message, rendezvous_timeout)
from envs import ompi

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "launchers")
ROOT = os.path.dirname(os.path.dirname(HERE))


def ranks(layout):
    with open(os.path.join(FIXTURES, layout + ".json")) as f:
        return [r["env"] for r in json.load(f)["ranks"]]


def per_node_env():
    """One Open MPI process on each of 2 nodes, asked to start 2 workers each."""
    return ompi(1, 2, 0, 1, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_ess_base_jobid="77",
                OMPI_MCA_orte_hnp_uri="76.0;tcp://10.213.77.11:4000", DISTENV_NPROC_PER_NODE="2")


# -- device --------------------------------------------------------------------------------
def test_no_cuda_means_cpu(no_gpus):
    env = resolve(ranks("openmpi4-np4")[1])
    assert choose_device(env, 0, {})[0] is None


def test_each_local_rank_takes_its_device_open_mpi_5_out_of_order(no_gpus):
    # Open MPI 5 numbers local ranks 0,2,1,3 for ranks 0..3: the device follows the
    # launcher's local rank, never rank % devices.
    for e in ranks("openmpi5-np4"):
        index, _ = choose_device(resolve(e), 4, e)
        assert index == int(e["OMPI_COMM_WORLD_LOCAL_RANK"])


def test_scheduler_narrowed_devices_per_task(no_gpus):
    # srun --gpus-per-task=1: each of 4 tasks sees one device, its own, as cuda:0.
    for e in ranks("slurm-srun-n4"):
        env = resolve(e)
        task = {**e, "CUDA_VISIBLE_DEVICES": str(env.local_rank)}
        assert choose_device(env, 1, task)[0] == 0
    # --gpus-per-task=2 with 4 tasks: 2 visible each, fewer than the 4 local tasks.
    e = ranks("slurm-srun-n4")[3]
    assert choose_device(resolve(e), 2, {**e, "CUDA_VISIBLE_DEVICES": "6,7"})[0] == 0


def test_more_processes_than_devices_is_an_error(no_gpus):
    e = ranks("openmpi4-np4")[2]
    with pytest.raises(DistEnvError) as err:
        choose_device(resolve(e), 2, e)
    msg = str(err.value)
    assert "4 processes on this node" in msg and "only 2 CUDA devices" in msg
    assert "backend='gloo'" in msg and "\n" not in msg


# -- backend -------------------------------------------------------------------------------
@pytest.mark.parametrize("requested, index, nccl, want", [
    (None, 0, True, "nccl"), (None, None, True, "gloo"), (None, 0, False, "gloo"),
    ("gloo", 0, True, "gloo"), ("nccl", 1, True, "nccl"), ("cpu:gloo,cuda:nccl", 0, True,
                                                            "cpu:gloo,cuda:nccl"),
])
def test_backend(requested, index, nccl, want):
    assert choose_backend(requested, index, nccl) == want


def test_nccl_without_a_device_says_what_to_pass():
    with pytest.raises(DistEnvError, match="backend='gloo'"):
        choose_backend("nccl", None, True)


# -- threads -------------------------------------------------------------------------------
def test_threads_left_alone_when_set(no_gpus):
    env = resolve(ranks("openmpi4-np4")[0])
    assert choose_threads(env, {"OMP_NUM_THREADS": "3"})[0] is None


def test_threads_of_a_bound_process_are_its_cores(no_gpus):
    # mpirun bound this rank to 2 cores out of its parent's 8: they are its own.
    env = resolve(ranks("openmpi4-np4")[0])
    assert choose_threads(env, {}, mine={2, 3}, parent=set(range(8)))[0] == 2


def test_threads_of_unbound_processes_share_the_cores(no_gpus):
    env = resolve(ranks("openmpi4-np4")[0])  # 4 local processes
    assert choose_threads(env, {}, mine=set(range(8)), parent=set(range(8)))[0] == 2
    assert choose_threads(env, {}, mine={0, 1}, parent={0, 1})[0] == 1  # never 0
    single = resolve({})
    assert choose_threads(single, {}, mine=set(range(8)), parent=set(range(8)))[0] == 8


# -- timeout -------------------------------------------------------------------------------
def test_rendezvous_timeout():
    assert rendezvous_timeout(None, {}) == datetime.timedelta(seconds=DEFAULT_RENDEZVOUS_TIMEOUT)
    assert rendezvous_timeout(None, {"DISTENV_TIMEOUT": "5"}) == datetime.timedelta(seconds=5)
    short = datetime.timedelta(seconds=2)
    assert rendezvous_timeout(short, {"DISTENV_TIMEOUT": "5"}) == short


@pytest.mark.parametrize("bad", ["abc", "0", "-3", "nan"])
def test_bad_timeout_names_the_variable(bad):
    with pytest.raises(DistEnvError, match="DISTENV_TIMEOUT"):
        rendezvous_timeout(None, {"DISTENV_TIMEOUT": bad})


# -- per-node ------------------------------------------------------------------------------
def test_per_node_message_gives_the_torchrun_command(no_gpus):
    env = resolve(per_node_env())
    assert env.launch == "per-node"
    msg = per_node_message(env)
    assert "node 1 of 2" in msg
    assert ("torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.213.77.11 "
            f"--master-port {env.master_port}") in msg
    assert "DistenvEnvironment" in msg and "\n" not in msg


def test_importing_the_adapter_imports_no_framework():
    code = ("import sys, distenv.torch, distenv.lightning; "
            "print([m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'lightning', 'pytorch_lightning', 'lightning_fabric', 'numpy')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- in-process, with torch ----------------------------------------------------------------
LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "MPI_LOCAL", "HYDRA_", "SLURM_", "TORCHELASTIC_",
                     "PALS_", "FLUX_", "JSM_", "LSB_", "HOROVOD_", "PET_", "SM_", "AZ_BATCH",
                     "AZUREML_", "DISTENV_")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "TF_CONFIG",
                  "CLUSTER_SPEC", "CUDA_VISIBLE_DEVICES")


@pytest.fixture
def clean_launch(monkeypatch, no_gpus):
    """No launcher variables, and whatever init_process_group writes is undone afterwards."""
    for key in set(LAUNCHER_NAMES) | {"LOCAL_WORLD_SIZE", "OMP_NUM_THREADS"}:
        monkeypatch.setenv(key, "0")  # records the original (or its absence) for undo
        monkeypatch.delenv(key)
    for key in list(os.environ):
        if key.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def torch_dist():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    threads = torch.get_num_threads()
    yield torch
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.set_num_threads(threads)


def test_single_process_group(clean_launch, torch_dist):
    import distenv.torch

    torch = torch_dist
    env = distenv.torch.init_process_group()
    assert env.world_size == 1 and env.rank == 0 and env.launcher == "none"
    assert torch.distributed.get_backend() == "gloo" and torch.distributed.get_world_size() == 1
    assert os.environ["RANK"] == "0" and os.environ["MASTER_ADDR"] == "127.0.0.1"
    assert int(os.environ["OMP_NUM_THREADS"]) == torch.get_num_threads() >= 1
    assert distenv.torch.device().type == "cpu"
    t = torch.ones(2)
    torch.distributed.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]


def test_per_node_launch_refuses_before_any_rendezvous(clean_launch, torch_dist):
    import distenv.torch

    for key, value in per_node_env().items():
        clean_launch.setenv(key, value)
    with pytest.raises(DistEnvError, match="per-node launch"):
        distenv.torch.init_process_group()
    assert not torch_dist.distributed.is_initialized()


def test_rank_without_rank_0_fails_after_the_timeout(clean_launch, torch_dist):
    import time

    import distenv.torch

    # Rank 0's port: bound here and never listening for the whole test, so every connection
    # is refused (a port released first could be taken by another job's listener meanwhile).
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(holder.getsockname()[1]), "DISTENV_TIMEOUT": "2"}.items():
        clean_launch.setenv(key, value)
    t0 = time.monotonic()
    with holder, pytest.raises(DistEnvError) as err:
        distenv.torch.init_process_group()
    assert time.monotonic() - t0 < 30
    assert "rank 1 of 2 could not reach rank 0's store at 127.0.0.1" in str(err.value)
    assert "DISTENV_TIMEOUT" in str(err.value) and "\n" not in str(err.value)
    assert distenv.torch.RendezvousError is DistEnvError  # the old name, for code that caught it


def test_a_second_call_is_a_no_op_returning_the_same_description(clean_launch, torch_dist, caplog):
    """Issue 30, item 11: a second init_process_group() ended every rank with ~15 lines of
    torch's traceback ("trying to initialize the default process group twice!"). A real gloo
    group of one process (MASTER_ADDR=127.0.0.1, a free port)."""
    import logging

    import distenv.torch

    torch = torch_dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clean_launch.setenv("MASTER_ADDR", "127.0.0.1")
    clean_launch.setenv("MASTER_PORT", str(port))
    env = distenv.torch.init_process_group()
    group = torch.distributed.group.WORLD
    with caplog.at_level(logging.DEBUG, logger="distenv"):
        assert distenv.torch.init_process_group() is env
        assert distenv.torch.init_process_group("gloo") is env
    assert "already up (rank 0 of 1, gloo)" in caplog.text
    assert torch.distributed.group.WORLD is group  # the same group, untouched
    t = torch.ones(2)
    torch.distributed.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]
    # a call that asks for something else is one line, and the group stays
    with pytest.raises(DistEnvError) as err:
        distenv.torch.init_process_group("mpi")
    text = str(err.value)
    assert "already up as rank 0 of 1 with backend 'gloo'" in text and "backend 'mpi'" in text
    assert "Fix: " in text and "\n" not in text
    assert torch.distributed.is_initialized() and torch.distributed.group.WORLD is group


def test_a_group_the_script_started_is_checked_against_the_launch(clean_launch, torch_dist):
    """A group started outside distenv: returned as the launch's when rank and world size
    agree; a different launch is one line, not torch's traceback."""
    import distenv.torch

    torch = torch_dist
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, store=store)
    env = distenv.torch.init_process_group()
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "none")
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29999"}.items():
        clean_launch.setenv(key, value)
    with pytest.raises(DistEnvError) as err:
        distenv.torch.init_process_group()
    assert "already up as rank 0 of 1 with backend 'gloo', which does not match rank 1 of 2 (env)" \
        in str(err.value)
