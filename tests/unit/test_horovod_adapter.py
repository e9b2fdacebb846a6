"""distenv.horovod on environments: the controller plan, the HOROVOD_* variables of the Gloo
self-rendezvous, the hard size/rank check, and init() against a stand-in Horovod."""
from __future__ import annotations

import os
import socket
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

import distenv
import distenv.horovod as dh
from distenv import DistEnvError
from distenv.core import ports
from distenv.bringup import preflight
from envs import hydra_rank, platform, recorded, torchrun


def test_mpirun_uses_the_mpi_controller():
    p = dh.plan(recorded("openmpi4-np2", 1))
    assert p.controller == "mpi" and p.server is False


def test_single_process_needs_nothing():
    assert dh.plan({}).controller == "single"


def test_horovodrun_is_left_alone():
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
           "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"}
    p = dh.plan(env)
    assert p.controller == "horovodrun" and p.environ == {}


def test_the_controller_follows_what_the_source_declares(monkeypatch):
    """Open MPI declares that Horovod's MPI controller joins its ranks (`mpi_controller`), and
    horovodrun is the "horovod" family: the plan reads those, never a launcher's name."""
    from distenv.sources import Frameworks, source_of

    ompi, hvdrun = source_of("openmpi"), source_of("horovodrun")
    assert ompi.frameworks.mpi_controller == ("horovod",) and hvdrun.family == "horovod"
    monkeypatch.setattr(ompi.frameworks, "mpi_controller", ())
    assert dh.plan(recorded("openmpi4-np2", 1)).controller == "gloo"
    monkeypatch.setattr(source_of("torchrun"), "frameworks", Frameworks(mpi_controller=("horovod",)))
    assert dh.plan(torchrun(1)).controller == "mpi"
    monkeypatch.setattr(hvdrun, "family", "other")
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
           "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"}
    assert dh.plan(env).controller != "horovodrun"


def test_torchrun_gets_a_gloo_self_rendezvous():
    p0, p1 = dh.plan(torchrun(0)), dh.plan(torchrun(1))
    assert p0.controller == p1.controller == "gloo"
    assert p0.server and not p1.server
    assert p0.address == p1.address and p0.address[0] == "127.0.0.1"
    e = p1.environ
    assert e["HOROVOD_RANK"] == "1" and e["HOROVOD_SIZE"] == "2"
    assert e["HOROVOD_LOCAL_RANK"] == "1" and e["HOROVOD_LOCAL_SIZE"] == "2"
    assert e["HOROVOD_CROSS_RANK"] == "0" and e["HOROVOD_CROSS_SIZE"] == "1"
    assert e["HOROVOD_CONTROLLER"] == "gloo" and e["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert e["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
    port = int(e["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    assert port != 29400 and ports.BASE <= port < ports.BASE + ports.SPAN


def test_torchrun_two_nodes():
    p = dh.plan(torchrun(3, nodes=2, addr="node1"))
    e = p.environ
    assert e["HOROVOD_CROSS_RANK"] == "1" and e["HOROVOD_CROSS_SIZE"] == "2"
    assert e["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "node1"
    assert e["HOROVOD_HOSTNAME"] == "distenv-node1"


def test_srun_without_mpi_uses_gloo_with_slurm_hosts():
    env = recorded("slurm-srun-n4", 2)
    p = dh.plan(env)
    assert p.controller == "gloo" and p.environ["HOROVOD_RANK"] == "2"
    assert p.environ["HOROVOD_HOSTNAME"] == env["SLURM_STEP_NODELIST"]


def test_ports_differ_between_jobs():
    a = dh.plan(recorded("slurm-srun-n4", 0)).address
    env = {**recorded("slurm-srun-n4", 0), "SLURM_JOB_ID": "999999"}
    assert dh.plan(env).address != a
    assert dh.plan({**env, "DISTENV_HOROVOD_PORT": "31234"}).address[1] == 31234


def test_controller_can_be_forced():
    assert dh.plan(recorded("openmpi4-np2", 0), controller="gloo").controller == "gloo"
    assert dh.plan({**torchrun(0), "DISTENV_HOROVOD_CONTROLLER": "mpi"}).controller == "mpi"
    with pytest.raises(DistEnvError, match="DISTENV_HOROVOD_CONTROLLER"):
        dh.plan({**torchrun(0), "DISTENV_HOROVOD_CONTROLLER": "nccl"})


def test_gloo_needs_the_master_address_across_nodes():
    env = hydra_rank(1, 4, 1, 2)
    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        dh.plan(env)


def test_per_node_launch_is_refused(fake_gpus):
    fake_gpus(4)
    env = platform("sagemaker_no_launcher_2hosts_host2")
    with pytest.raises(DistEnvError, match="one process per node"):
        dh.plan(env)


class FakeHvd:
    def __init__(self, size, rank, local=0):
        self._size, self._rank, self._local = size, rank, local
        self.inits = 0

    def init(self):
        self.inits += 1

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def local_rank(self):
        return self._local

    def mpi_built(self):
        return True

    def gloo_built(self):
        return False


def test_the_silent_size_one_is_an_error():
    d = distenv.resolve(torchrun(1))
    with pytest.raises(DistEnvError) as err:
        dh.check(FakeHvd(1, 0), d, "mpi")
    text = str(err.value)
    assert "size 1" in text and "world_size 2" in text and "GLOO NOT built" in text
    assert "DISTENV_HOROVOD_CONTROLLER=gloo" in text and "\n" not in text
    dh.check(FakeHvd(2, 1), d)  # agreeing is fine


def test_waiting_for_a_missing_rank_zero_names_it():
    # Bound and never listening for the whole test: every connection is refused (a port
    # released first could get another job's listener, which would answer).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        d = distenv.resolve(torchrun(1))
        with pytest.raises(DistEnvError, match=f"distenv.horovod: rank 1 of 2 could not reach rank 0 "
                                               f"at 127.0.0.1:{port} .*within 1 s"):
            preflight.meet(dh.meeting(d, "127.0.0.1", 1.0, port))


@pytest.fixture
def fake_horovod(monkeypatch):
    """horovod.torch and horovod.runner.http.http_server stand-ins."""
    hvd = FakeHvd(2, 0)
    pkg = types.ModuleType("horovod")
    torch_mod = types.ModuleType("horovod.torch")
    for name in ("init", "size", "rank", "local_rank", "mpi_built", "gloo_built"):
        setattr(torch_mod, name, getattr(hvd, name))
    http = types.ModuleType("horovod.runner.http.http_server")

    class Server(HTTPServer):
        def __init__(self, addr, handler, verbose):
            super().__init__(addr, handler)
            self.scope_size = {}

        def init(self, plan):
            for slot in plan:
                self.scope_size["global"] = slot.size
                self.scope_size["local_" + slot.hostname] = slot.local_size
                self.scope_size["cross_" + str(slot.local_rank)] = slot.cross_size

    http.RendezvousHTTPServer = Server
    http.RendezvousHandler = BaseHTTPRequestHandler
    for name, mod in (("horovod", pkg), ("horovod.torch", torch_mod), ("horovod.runner", types.ModuleType("r")),
                      ("horovod.runner.http", types.ModuleType("h")), ("horovod.runner.http.http_server", http)):
        monkeypatch.setitem(sys.modules, name, mod)
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    fake_torch.threads = []
    fake_torch.set_num_threads = fake_torch.threads.append
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    launcher_vars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                     "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG", "CLUSTER_SPEC",
                     "OMP_NUM_THREADS"}
    prefixes = ("HOROVOD_", "OMPI_", "PMIX_", "PMI_", "MPI_LOCAL", "SLURM_", "TORCHELASTIC_", "DISTENV_",
                "SM_", "PET_", "AZ_BATCH", "AZUREML_")
    for var in list(os.environ):  # a stale variable (another test's export) must not leak in
        if var in launcher_vars or var.startswith(prefixes):
            monkeypatch.delenv(var)
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # init() writes it (torch's pin): undone after
    monkeypatch.delenv("OMP_NUM_THREADS")
    yield hvd, fake_torch
    server = dh._server.pop("httpd", None)
    if server is not None:
        server.shutdown()
        server.server_close()
    for var in list(os.environ):
        if var.startswith("HOROVOD_"):
            os.environ.pop(var)


def test_init_under_torchrun_starts_the_rendezvous_on_rank_zero(fake_horovod, monkeypatch):
    hvd, torch = fake_horovod
    env = torchrun(0)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # rank 1, in a thread: its pre-flight (rank 0 meets every rank before hvd.init())
    other = threading.Thread(target=preflight.meet, args=(
        dh.meeting(distenv.resolve(torchrun(1)), "127.0.0.1", 10),))
    other.start()
    mod = dh.init("torch", timeout=10)
    other.join(10)
    assert mod is sys.modules["horovod.torch"] and hvd.inits == 1
    assert os.environ["HOROVOD_CONTROLLER"] == "gloo" and os.environ["HOROVOD_SIZE"] == "2"
    port = int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # rank 0's server is up for the other ranks
    assert torch.threads and torch.threads[0] >= 1


def test_init_refuses_a_horovod_that_did_not_join(fake_horovod, monkeypatch):
    hvd, _ = fake_horovod
    hvd._size = 1
    for k, v in recorded("openmpi4-np2", 0).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DistEnvError, match="did not join the job"):
        dh.init("torch")


@pytest.mark.parametrize("framework", ["tensorflow", "tf", "keras", "Keras"])
def test_the_untested_tensorflow_path_is_refused_before_anything_is_set_up(framework, monkeypatch):
    """Horovod's TensorFlow/Keras modules were never built or run here (issue 24): init()
    refuses them with the fix, before it writes a variable or imports Horovod."""
    monkeypatch.setitem(sys.modules, "horovod", None)  # an import would raise ImportError
    before = dict(os.environ)
    with pytest.raises(DistEnvError, match=r"PyTorch only.*Fix: .*distenv\.tensorflow\.strategy\(\)"):
        dh.init(framework, env=recorded("openmpi4-np2", 0))
    assert dict(os.environ) == before
    with pytest.raises(ValueError, match="supports 'torch'"):
        dh.init("mxnet", env=recorded("openmpi4-np2", 0))


def _cuda(torch, count):
    torch.devices = []
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: count,
                                       set_device=torch.devices.append)


@pytest.mark.parametrize("count, visible, want", [
    (4, None, 2),      # a device per local process: local rank 2 takes device 2
    (1, "5", 0),       # the scheduler narrowed this task to its own GPU
    (8, None, 2),      # more devices than processes: still local rank's own
])
def test_init_pins_the_device_by_the_core_s_policy(fake_horovod, monkeypatch, count, visible, want):
    hvd, torch = fake_horovod
    hvd._size, hvd._rank, hvd._local = 4, 2, 2
    _cuda(torch, count)
    for k, v in recorded("openmpi4-np4", 2).items():
        monkeypatch.setenv(k, v)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    dh.init("torch")
    assert torch.devices == [want]


def test_init_refuses_two_processes_on_one_gpu(fake_horovod, monkeypatch):
    """4 processes, 2 GPUs, nothing narrowed: Horovod's own local_rank % count would put two
    processes on each GPU (NCCL refuses a duplicate GPU); distenv.torch refuses it too."""
    hvd, torch = fake_horovod
    hvd._size, hvd._rank, hvd._local = 4, 2, 2
    _cuda(torch, 2)
    for k, v in recorded("openmpi4-np4", 2).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(DistEnvError, match=r"4 processes on this node.*only 2 CUDA devices.*"
                                           r"Fix: .*CUDA_VISIBLE_DEVICES=\) to train on CPUs"):
        dh.init("torch")
    assert torch.devices == []
