"""distenv.jax (and the Keras 3 parts of distenv.keras) on environments: what
`jax.distributed.initialize` gets under every launcher -- including those JAX does not detect --,
device binding, the coordinator port, timeouts, the pre-flight meeting (real sockets, threads)
and the zero-code patch (a stand-in `jax`). `test_real_jax_*` run the same paths with the real
JAX and Keras 3 in a subprocess of .venvs/jax (or $DISTENV_PY_JAX) when it exists; under CI
(DISTENV_REQUIRE_LAUNCHERS=1) a missing interpreter fails them.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

import distenv
import distenv.jax as dj
import distenv.keras as dk
from distenv import DistEnvError
from distenv.core import ports
from envs import platform, recorded, slurm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(autouse=True)
def _no_gpus(monkeypatch, tmp_path):
    """No NVIDIA driver entries unless a test fakes them (the machine's own must not count)."""
    import distenv.core.gpus

    monkeypatch.setattr(distenv.core.gpus, "NVIDIA_DIR", str(tmp_path / "no-nvidia"))


def host_of(address: str) -> str:
    return address.rpartition(":")[0]


# -- processes and coordinator under every launcher ----------------------------------------------
@pytest.mark.parametrize("name,size", [("openmpi4-np4", 4), ("mpich4-np4", 4), ("intelmpi-np4", 4),
                                       ("torchrun-nproc2", 2), ("slurm-srun-n4", 4)])
def test_every_rank_agrees_on_one_coordinator(name, size):
    plans = [dj.plan(recorded(name, r)) for r in range(size)]
    assert [p.process_id for p in plans] == list(range(size))
    assert {p.num_processes for p in plans} == {size}
    assert len({p.coordinator_address for p in plans}) == 1, [p.coordinator_address for p in plans]
    assert all(p.local_device_ids == [] and p.cpu_devices is None for p in plans)


@pytest.mark.parametrize("fixture,count,index,host", [
    ("azureml_mpi_per_process_2x2_rank2.json", 4, 2, "10.0.0.4"),
    ("azureml_sdk2_pytorch_2nodes_2proc_rank3.json", 4, 3, "10.0.0.4"),
    ("azureml_tensorflow_worker1.json", 2, 1, "10.0.0.4"),
    ("sagemaker_mpi_2hosts_rank3.json", 4, 3, "algo-1"),
    ("sagemaker_torch_distributed_2hosts_rank5.json", 8, 5, "algo-1"),
    ("gcp_pytorch_worker0.json", 3, 1, "cmle-training-master-e118e0f997-0"),
    ("vertex_pytorch_workerpool1_index1.json", 3, 2, "cmle-training-workerpool0-d604929a6a-0"),
    ("kubeflow_tfjob_worker1.json", 3, 2, "dist-mnist-chief-0.kubeflow.svc"),
    ("tf_config_chief_worker_ps.json", 3, 0, "trainer-chief-0"),
])
def test_launchers_jax_does_not_detect(fixture, count, index, host):
    p = dj.plan(platform(fixture[:-5]))
    assert (p.num_processes, p.process_id) == (count, index)
    assert host_of(p.coordinator_address) == host


@pytest.mark.parametrize("fixture,nodes,node,host,nproc", [
    ("sagemaker_no_launcher_2hosts_host2", 2, 1, "algo-1", 4),
    ("kubeflow_pytorchjob_v1_nproc2_pod1", 2, 1, "pytorch-job-master-0", 2),
    ("kubeflow_trainer_v2_node1", 2, 1, "mnist-node-0-0.mnist", 4),
])
def test_per_node_launch_one_process_per_node_owning_its_devices(fake_gpus, fixture, nodes, node,
                                                                 host, nproc):
    env = platform(fixture)
    p = dj.plan(env)
    assert p.env.launch == distenv.PER_NODE
    assert (p.num_processes, p.process_id) == (nodes, node)
    assert host_of(p.coordinator_address) == host
    # CPU-only node: one XLA CPU device per worker the launch asked for
    assert p.local_device_ids == [] and p.cpu_devices == p.env.nproc_per_node == nproc
    # GPU node: all of them, none narrowed
    fake_gpus(4)
    g = dj.plan(env)
    assert g.local_device_ids == [0, 1, 2, 3] and g.cuda_visible_devices is None
    assert g.cpu_devices is None


def test_coordinator_port_is_the_cores_rule_not_the_master_port():
    env = recorded("torchrun-nproc2", 1)
    d = distenv.resolve(env)
    port, why = dj.coordinator_port(d, env)
    assert port != d.master_port and ports.BASE <= port < ports.BASE + ports.SPAN
    assert "distenv.core.ports" in why
    assert dj.plan(env).coordinator_address == f"{d.master_addr}:{port}"
    # another job (another master port) gets another port; the same job the same one
    other = distenv.resolve({**env, "MASTER_PORT": str(d.master_port + 1)})
    assert dj.coordinator_port(other, env)[0] != port
    assert dj.coordinator_port(distenv.resolve(env), env)[0] == port
    assert dj.coordinator_port(d, env, 1234) == (1234, "given")
    assert dj.coordinator_port(d, {**env, "JAX_COORDINATOR_PORT": "2345"})[0] == 2345
    assert dj.coordinator_port(d, {**env, "DISTENV_KERAS_PORT": "3456"})[0] == 3456
    with pytest.raises(DistEnvError, match="JAX_COORDINATOR_PORT"):
        dj.coordinator_port(d, {**env, "JAX_COORDINATOR_PORT": "x"})


def test_explicit_arguments_win():
    env = recorded("openmpi4-np2", 1)
    p = dj.plan(env, coordinator_address="10.1.2.3:999", num_processes=4, process_id=3,
                local_device_ids=[2], timeout=7)
    assert (p.coordinator_address, p.num_processes, p.process_id) == ("10.1.2.3:999", 4, 3)
    assert p.local_device_ids == [2] and p.timeout == 7.0
    assert p.why["coordinator_address"] == "given" and p.why["timeout"] == "given"
    q = dj.plan({**env, "JAX_COORDINATOR_ADDRESS": "h:1", "JAX_LOCAL_DEVICE_IDS": "0,1"})
    assert q.coordinator_address == "h:1" and q.local_device_ids == [0, 1]
    with pytest.raises(DistEnvError, match="process_id=5"):
        dj.plan(env, num_processes=2, process_id=5)


def test_unknown_coordinator_or_count_names_the_fix():
    with pytest.raises(DistEnvError, match="MASTER_ADDR") as e:
        dj.plan(recorded("cluster-mpich4-2x2", 1))
    assert "does not reveal across nodes" in str(e.value)
    with pytest.raises(DistEnvError, match="process count"):
        dj.plan(recorded("mpich4-np2-pmi-port", 1))
    # MASTER_ADDR given: fine
    env = {**recorded("cluster-mpich4-2x2", 1), "MASTER_ADDR": "node1"}
    assert host_of(dj.plan(env).coordinator_address) == "node1"


def test_discovery_completes_an_unknown_master(monkeypatch):
    """discover=True (initialize, the patch) asks distenv.discovery.complete, collectively."""
    import distenv.discovery

    asked = []

    def complete(env, need=("master_addr",), timeout=None):
        asked.append((need, timeout))
        return env.replace(master_addr="node1")

    monkeypatch.setattr(distenv.discovery, "complete", complete, raising=False)
    env = {**recorded("cluster-mpich4-2x2", 1), "DISTENV_TIMEOUT": "9"}
    assert host_of(dj.plan(env, discover=True).coordinator_address) == "node1"
    # and every rank's host: MPICH gives no job id, so the service gives the job its port
    assert asked == [(("master_addr", "world_size", "rank_hosts"), 9.0)]
    asked.clear()
    dj.plan(recorded("openmpi4-np4", 1), discover=True)  # everything known: no exchange
    assert asked == []


def test_single_process():
    p = dj.plan({})
    assert (p.num_processes, p.process_id) == (1, 0)
    assert p.coordinator_address.startswith("127.0.0.1:")


# -- devices ---------------------------------------------------------------------------------
def _mpi(rank, size=2, local=None, lsize=None, **more):
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank if local is None else local),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(size if lsize is None else lsize),
            "OMPI_MCA_orte_num_nodes": "1", "OMPI_MCA_orte_hnp_uri": "77.0;tcp://10.0.0.1:300", **more}


def test_one_gpu_per_process_narrowed():
    env = _mpi(1, CUDA_VISIBLE_DEVICES="4,5")
    p = dj.device_plan(distenv.resolve(env), env, torch_imported=False)
    assert p.cuda_visible_devices == "5" and p.local_device_ids == [0]
    # torch here may have initialised CUDA: JAX's own selection instead of the variable
    q = dj.device_plan(distenv.resolve(env), env, torch_imported=True)
    assert q.cuda_visible_devices is None and q.local_device_ids == [1]
    # the narrowed slice, seen again: left as it is
    again = {**env, "CUDA_VISIBLE_DEVICES": "5", dj.GPU_SLICE_VAR: "5"}
    r = dj.device_plan(distenv.resolve(again), again, torch_imported=False)
    assert r.cuda_visible_devices is None and r.local_device_ids == [0]


def test_scheduler_narrowed_gpu_and_too_few_gpus(fake_gpus):
    env = _mpi(1, CUDA_VISIBLE_DEVICES="3")  # srun --gpus-per-task: one each
    p = dj.device_plan(distenv.resolve(env), env, torch_imported=False)
    assert p.cuda_visible_devices is None and p.local_device_ids == [0]
    crowded = _mpi(1, size=4, local=1, lsize=4)  # 4 processes, 2 GPUs, nothing narrowed
    fake_gpus(2)
    with pytest.raises(DistEnvError, match="JAX_PLATFORMS=cpu"):
        dj.device_plan(distenv.resolve(crowded), crowded, torch_imported=False)


def test_cpu_devices_left_to_the_user():
    env = {**platform("sagemaker_no_launcher_2hosts_host2"),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert dj.plan(env).cpu_devices is None
    assert dj.plan({**env, "XLA_FLAGS": "", "JAX_NUM_CPU_DEVICES": "3"}).cpu_devices is None


def test_timeouts():
    assert dj.timeouts({}) == (180.0, "the default (DISTENV_TIMEOUT unset)")
    assert dj.timeouts({"DISTENV_TIMEOUT": "12"}) == (12.0, "DISTENV_TIMEOUT=12")
    assert dj.timeouts({"DISTENV_TIMEOUT": "12"}, 30) == (30.0, "given")
    with pytest.raises(DistEnvError, match="DISTENV_TIMEOUT"):
        dj.timeouts({"DISTENV_TIMEOUT": "soon"})


# -- the pre-flight meeting (real sockets) -----------------------------------------------------------
_HELD = []


def _free_port() -> int:
    """A port held for the rest of the session: bound with SO_REUSEADDR and never listening,
    so no other process can bind it between here and preflight (which binds it with
    SO_REUSEADDR too, and may listen beside this socket); released at exit."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return s.getsockname()[1]


def _connect_when_listening(port, within=20.0):
    """A connection to 127.0.0.1:port once something listens there (refused until then)."""
    end = time.monotonic() + within
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=2)
        except ConnectionRefusedError:
            if time.monotonic() > end:
                raise
            time.sleep(0.01)


def _meet(n, present, timeout, address=None):
    """Run preflight for the processes in `present` (threads); {id: seconds or exception}."""
    address = address or f"127.0.0.1:{_free_port()}"
    out = {}

    def one(i):
        try:
            out[i] = dj.preflight(address, n, i, timeout)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in present]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 20)
    return out, address


def test_preflight_all_present():
    t0 = time.monotonic()
    out, _ = _meet(4, [3, 1, 0, 2], 20)
    assert all(isinstance(v, float) for v in out.values()), out
    assert time.monotonic() - t0 < 10


def test_preflight_missing_process_is_named_everywhere_within_the_timeout():
    t0 = time.monotonic()
    out, address = _meet(4, [0, 1, 3], 2.0)
    took = time.monotonic() - t0
    assert 1.9 < took < 10, took
    assert isinstance(out[0], DistEnvError), out
    assert str(out[0]).startswith("distenv.jax: process(es) 2 of 4 never came to the pre-flight "
                                  f"within 2 s (process 0 at {address} heard from 3 of 4, on ")
    assert "crashed before jax.distributed.initialize" in str(out[0])
    for i in (1, 3):
        assert isinstance(out[i], DistEnvError), out
        assert str(out[i]).startswith("distenv.jax: process(es) 2 of 4 never came to the pre-flight "
                                      f"within 2 s (process 0 at {address} says so)"), out[i]
        assert str(out[i]).split(" (process 0")[0] == str(out[0]).split(" (process 0")[0]  # one wording


def test_preflight_without_process_0_names_the_address():
    out, address = _meet(2, [1], 1.5)
    assert isinstance(out[1], DistEnvError)
    assert f"process 1 of 2 could not reach process 0 at {address} within 2 s" in str(out[1])
    assert "JAX_COORDINATOR_ADDRESS" in str(out[1]).split("Fix:")[1]


def test_preflight_ignores_strangers_and_other_jobs():
    port = _free_port()
    address = f"127.0.0.1:{port}"
    result = {}
    t = threading.Thread(target=lambda: result.setdefault(0, _catch(dj.preflight, address, 2, 0, 5)))
    t.start()
    silent = _connect_when_listening(port)  # a connection that never says anything
    for junk in (b"GET / HTTP/1.0\n", b"distenv-preflight/1 0123456789abcdef0123 1 other-job 7\n"):
        with _connect_when_listening(port) as c:  # process 0 is listening (not a guess)
            c.sendall(junk)
            answer = c.recv(64)
        assert answer in (b"", b"other\n"), answer  # another job's hello: told so, not counted
    assert dj.preflight(address, 2, 1, 5) >= 0
    t.join(10)
    silent.close()
    assert isinstance(result[0], float), result


def _catch(f, *a):
    try:
        return f(*a)
    except Exception as exc:  # noqa: BLE001
        return exc


def test_preflight_port_taken():
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(DistEnvError, match=f"process 0 cannot listen on port {port} for the "
                                               "pre-flight .*DISTENV_PREFLIGHT_PORT"):
            dj.preflight(f"127.0.0.1:{port}", 2, 0, 1)


# -- the zero-code patch, on a stand-in jax ----------------------------------------------------
@pytest.fixture
def fake_jax(monkeypatch):
    calls = []
    mod = types.ModuleType("jax")
    dist = types.ModuleType("jax.distributed")

    def initialize(coordinator_address=None, num_processes=None, process_id=None,
                   local_device_ids=None, cluster_detection_method=None,
                   initialization_timeout=300, heartbeat_timeout_seconds=100,
                   shutdown_timeout_seconds=300, coordinator_bind_address=None):
        calls.append(dict(coordinator_address=coordinator_address, num_processes=num_processes,
                          process_id=process_id, local_device_ids=local_device_ids,
                          cluster_detection_method=cluster_detection_method,
                          initialization_timeout=initialization_timeout,
                          heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                          shutdown_timeout_seconds=shutdown_timeout_seconds,
                          coordinator_bind_address=coordinator_bind_address))

    dist.initialize = initialize
    mod.distributed = dist
    updates = {}
    mod.config = types.SimpleNamespace(jax_cpu_collectives_implementation=None,
                                       update=lambda k, v: updates.__setitem__(k, v))
    monkeypatch.setitem(sys.modules, "jax", mod)
    monkeypatch.setitem(sys.modules, "jax.distributed", dist)
    met = []
    monkeypatch.setattr(dj, "preflight", lambda *a: met.append(a) or 0.0)
    yield types.SimpleNamespace(module=mod, calls=calls, updates=updates, met=met, original=initialize)
    dj.unpatch()


def test_patch_fills_what_the_caller_leaves_out(fake_jax, monkeypatch):
    for k, v in recorded("mpich4-np4", 2).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("DISTENV_TIMEOUT", "15")
    dj.patch()
    dj.patch()  # idempotent
    assert fake_jax.module.distributed.initialize.__wrapped__ is fake_jax.original
    fake_jax.module.distributed.initialize()
    (call,) = fake_jax.calls
    want = dj.plan()
    assert call["coordinator_address"] == want.coordinator_address
    assert (call["num_processes"], call["process_id"], call["local_device_ids"]) == (4, 2, [])
    assert call["initialization_timeout"] == 15 and call["heartbeat_timeout_seconds"] == 15
    assert call["shutdown_timeout_seconds"] == 15 and call["cluster_detection_method"] is None
    # every process meets process 0 on its host, at the pre-flight's own port (not JAX's), with
    # a key of the job
    from distenv.bringup import preflight

    host = want.coordinator_address.rpartition(":")[0]
    met = f"{host}:{preflight.port(want.env, host)}"
    assert met != want.coordinator_address
    assert fake_jax.met == [(met, 4, 2, 15.0, want.why["coordinator_address"],
                             preflight.identity(want.env, "jax", want.coordinator_address, 4),
                             want.env.local_world_size)]  # the processes on this host: their pace
    assert fake_jax.updates == {"jax_cpu_collectives_implementation": "gloo"}
    # Keras passes its (explicit) arguments; they win, the rest is filled
    fake_jax.module.distributed.initialize(coordinator_address="h:5", num_processes=4, process_id=2,
                                           heartbeat_timeout_seconds=50)
    assert fake_jax.calls[-1]["coordinator_address"] == "h:5"
    assert fake_jax.calls[-1]["heartbeat_timeout_seconds"] == 50
    # JAX's own detection, asked for by name: left to JAX
    fake_jax.module.distributed.initialize(cluster_detection_method="mpi4py")
    assert fake_jax.calls[-1]["cluster_detection_method"] == "mpi4py"
    assert fake_jax.calls[-1]["coordinator_address"] is None
    dj.unpatch()
    assert fake_jax.module.distributed.initialize is fake_jax.original


def test_initialize_single_process_does_not_start_the_runtime(fake_jax, monkeypatch):
    monkeypatch.setenv("DISTENV_LAUNCHER", "none")
    p = dj.initialize()
    assert p.initialized is False and fake_jax.calls == [] and fake_jax.met == []


def test_auto_hooks_jax():
    import distenv.auto

    assert distenv.auto.HOOKS["jax"] == ("distenv.jax", "patch")


# -- Keras 3 (distenv.keras) ---------------------------------------------------------------------
def test_keras_initialize_args_come_from_the_jax_plan():
    for name, size in (("mpich4-np4", 4), ("torchrun-nproc2", 2)):
        for r in range(size):
            env = recorded(name, r)
            p = dj.plan(env)
            assert dk.initialize_args(env) == {"job_addresses": p.coordinator_address,
                                               "num_processes": size, "process_id": r}


def test_data_parallel_sharding(monkeypatch):
    made = []
    mod = types.ModuleType("keras")
    mod.distribution = types.SimpleNamespace(
        list_devices=lambda: ["cpu:0", "cpu:1"],
        DataParallel=lambda **kw: made.append(kw) or kw)
    monkeypatch.setitem(sys.modules, "keras", mod)
    assert dk.data_parallel() == {"devices": ["cpu:0", "cpu:1"], "auto_shard_dataset": False}
    assert dk.data_parallel("global")["auto_shard_dataset"] is True
    assert dk.data_parallel(devices=["cpu:0"])["devices"] == ["cpu:0"]
    with pytest.raises(DistEnvError, match="per-rank"):
        dk.data_parallel("sharded")


def test_keras_chief_in_a_per_node_launch():
    env = distenv.resolve(platform("sagemaker_no_launcher_2hosts_host2"))
    assert dk.is_chief(env) is False and dk.worker_index(env) == 1


# -- with the real JAX and Keras 3 ----------------------------------------------------------------
def jax_python():
    for py in (os.environ.get("DISTENV_PY_JAX"), os.path.join(ROOT, ".venvs", "jax", "bin", "python")):
        if py and os.access(py, os.X_OK):
            return py
    why = "no JAX interpreter (.venvs/jax: bash integrations/frameworks/jax.sh, or DISTENV_PY_JAX)"
    if os.environ.get("DISTENV_REQUIRE_LAUNCHERS", "").strip() not in ("", "0"):
        pytest.fail(why)
    pytest.skip(why)


def _run(code, env):
    py = jax_python()
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OMPI_", "PMI_", "SLURM_", "PMIX_", "MPI_", "TORCHELASTIC_"))
             and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run(["timeout", "-k", "5", "150", py, "-c", code], env={**clean, **env},
                       capture_output=True, text=True, timeout=170, cwd="/")
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_real_jax_per_node_cpu_devices_and_patch():
    """A per-node launch of one node asking for 2 workers: one JAX process with 2 CPU devices;
    the patched jax.distributed.initialize() with no arguments starts a 1-process runtime."""
    code = """
import json, distenv.jax, jax
p = distenv.jax.initialize()
distenv.jax.patch()
sig = jax.distributed.initialize.__wrapped__ is not None
print(json.dumps({"initialized": p.initialized, "devices": jax.device_count(),
                  "cpu": p.cpu_devices, "gloo": jax.config.jax_cpu_collectives_implementation}))
"""
    env = {**slurm(0, nodelist="localhost", tasks="1", job="5", ntasks=1, nnodes=1),
           "DISTENV_NPROC_PER_NODE": "2", "JAX_PLATFORMS": "cpu", "DISTENV_AUTO": "0"}
    out = _run(code, env)
    assert out == {"initialized": False, "devices": 2, "cpu": 2, "gloo": "gloo"}, out


def test_real_jax_patched_initialize_in_one_process():
    code = """
import json, distenv.jax, jax
distenv.jax.patch()
jax.distributed.initialize()
print(json.dumps({"count": jax.process_count(), "index": jax.process_index(),
                  "up": jax.distributed.is_initialized()}))
"""
    out = _run(code, {"DISTENV_LAUNCHER": "none", "JAX_PLATFORMS": "cpu", "DISTENV_AUTO": "0"})
    assert out == {"count": 1, "index": 0, "up": True}


def test_real_keras_data_parallel():
    code = """
import json, os
os.environ["KERAS_BACKEND"] = "jax"
import distenv.keras, keras
distenv.keras.initialize()
a, b = distenv.keras.data_parallel(), distenv.keras.data_parallel("global")
print(json.dumps({"kind": type(a).__name__, "per_rank": a.auto_shard_dataset,
                  "global": b.auto_shard_dataset, "devices": len(a.device_mesh.devices.ravel())}))
"""
    out = _run(code, {"DISTENV_LAUNCHER": "none", "JAX_PLATFORMS": "cpu", "DISTENV_AUTO": "0"})
    assert out == {"kind": "DataParallel", "per_rank": False, "global": True, "devices": 1}, out
