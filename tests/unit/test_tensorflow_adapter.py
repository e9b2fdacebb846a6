"""distenv.tensorflow on environments: TF_CONFIG from every launch, the strategy plan, the
pre-flight rendezvous, the Keras 3 check. No TensorFlow needed (tests that need it say so)."""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import types

import pytest

import distenv
import distenv.tensorflow as dtf
from distenv import DistEnvError
from distenv.core import ports
from envs import ompi, platform, recorded, slurm, slurm_task, torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


def workers(config):
    return config["cluster"]["worker"]


# -- TF_CONFIG -------------------------------------------------------------------------------
def test_existing_tf_config_passes_through():
    raw = {"cluster": {"chief": ["a:1"], "worker": ["b:2", "c:3"]}, "task": {"type": "worker", "index": 1}}
    assert dtf.tf_config({"TF_CONFIG": json.dumps(raw)}) == raw


def test_invalid_tf_config_is_an_error():
    with pytest.raises(DistEnvError, match="TF_CONFIG"):
        dtf.tf_config({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}'})


def test_stale_tf_config_under_mpirun_is_an_error():
    env = recorded("openmpi4-np2", 1)
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["a:1", "b:1", "c:1"]},
                                   "task": {"type": "worker", "index": 1}})
    with pytest.raises(DistEnvError, match="stale TF_CONFIG"):
        dtf.tf_config(env)


def test_one_node_openmpi_uses_loopback_and_one_port_per_rank(no_gpus):
    configs = [dtf.tf_config(recorded("openmpi4-np2", r)) for r in (0, 1)]
    assert workers(configs[0]) == workers(configs[1])
    (a, pa), (b, pb) = (w.rsplit(":", 1) for w in workers(configs[0]))
    assert a == b == "127.0.0.1" and int(pb) == int(pa) + 1
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]


def test_ports_derive_from_the_job():
    one = workers(dtf.tf_config(slurm(0, job="100")))
    again = workers(dtf.tf_config(slurm(3, job="100")))
    other = workers(dtf.tf_config(slurm(0, job="101")))
    assert one == again
    assert one != other
    base = int(one[0].rsplit(":", 1)[1])
    assert ports.BASE <= base < ports.BASE + ports.SPAN


def test_base_port_can_be_given():
    cfg = dtf.tf_config(slurm(0), base_port=31000)
    assert workers(cfg) == ["node9:31000", "node9:31001", "node10:31000", "node10:31001"]
    env = {**slurm(0), "DISTENV_TF_PORT": "32000"}
    assert workers(dtf.tf_config(env))[0] == "node9:32000"


def test_slurm_hosts_keep_slurms_order_not_string_order():
    cfg = dtf.tf_config(slurm(2), base_port=30000)
    # node9 before node10 (a string sort would put node10 first and swap the ranks)
    assert workers(cfg) == ["node9:30000", "node9:30001", "node10:30000", "node10:30001"]
    assert cfg["task"] == {"type": "worker", "index": 2}


def test_slurm_cyclic_distribution():
    env = slurm(1, dist="cyclic", nodeid=1, localid=0)
    cfg = dtf.tf_config(env, base_port=30000)
    assert workers(cfg) == ["node9:30000", "node10:30000", "node9:30001", "node10:30001"]


def test_slurm_uneven_and_plane():
    cfg = dtf.tf_config(slurm(2, nodelist="cn[1-2]", tasks="2,1", ntasks=3, nodeid=1, localid=0),
                        base_port=30000)
    assert workers(cfg) == ["cn1:30000", "cn1:30001", "cn2:30000"]
    assert dtf.slurm_task_nodes([4, 4], "plane", 2) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert dtf.slurm_task_nodes([3, 1], "cyclic") == [0, 1, 0, 0]


def test_slurm_arbitrary_distribution_is_refused():
    with pytest.raises(DistEnvError, match="arbitrary"):
        dtf.tf_config(slurm(0, dist="arbitrary"))


def test_per_node_slurm_workers_are_where_their_node_runs():
    """One task per node (each the node's TensorFlow worker): worker k is node rank k's host.
    Under block that is the node list's k-th host; under arbitrary task 0 can run on node2
    while the list starts with node1, so the hosts are unknown there (the error), never the
    list's order (which would tell node1's worker it is worker 1 at node2)."""
    def task(procid, nodeid, dist):
        return slurm_task(procid, 2, 0, nodeid, 2, "node[1-2]", "1(x2)", SLURM_DISTRIBUTION=dist,
                          DISTENV_NPROC_PER_NODE="4")
    cfg = dtf.tf_config(task(1, 1, "block"))
    assert [w.rsplit(":", 1)[0] for w in workers(cfg)] == ["node1", "node2"]
    assert cfg["task"]["index"] == 1
    with pytest.raises(DistEnvError, match="the host of every node"):
        dtf.tf_config(task(0, 1, "arbitrary"))


def test_slurm_layout_contradicting_nodeid_is_refused():
    with pytest.raises(DistEnvError, match="SLURM_NODEID"):
        dtf.tf_config(slurm(1, dist="block", nodeid=1, localid=0))


def test_recorded_slurm_cyclic_one_node():
    cfgs = [dtf.tf_config(recorded("slurm-srun-n4-cyclic", r)) for r in range(4)]
    assert len({tuple(workers(c)) for c in cfgs}) == 1
    assert [c["task"]["index"] for c in cfgs] == [0, 1, 2, 3]
    assert len(set(workers(cfgs[0]))) == 4


def test_torchrun_one_node():
    cfg = dtf.tf_config(recorded("torchrun-nproc2", 1))
    assert cfg["task"]["index"] == 1
    assert all(w.startswith("127.0.0.1:") for w in workers(cfg))
    master = int(recorded("torchrun-nproc2", 1)["MASTER_PORT"])
    assert master not in [int(w.rsplit(":", 1)[1]) for w in workers(cfg)]


def test_torchrun_across_nodes_says_what_is_missing():
    env = {**torchrun(3, nodes=2, addr="node1"), "TORCHELASTIC_RUN_ID": "x"}
    with pytest.raises(DistEnvError, match="torchrun numbers nodes in rendezvous order"):
        dtf.tf_config(env)


def mpi_two_nodes(rank):
    return ompi(rank, 4, rank % 2, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2",
                OMPI_MCA_orte_hnp_uri="123.0;tcp://10.0.0.1:4000", OMPI_MCA_ess_base_jobid="55")


def test_mpi_across_nodes_without_hosts_names_the_fix():
    with pytest.raises(DistEnvError) as err:
        dtf.tf_config(mpi_two_nodes(0))
    text = str(err.value)
    assert "DISTENV_HOSTFILE" in text and "DISTENV_GATHER=mpi4py" in text and "\n" not in text


@pytest.mark.parametrize("content", ["node1 slots=2\nnode2 slots=2\n", "node1:2\n# comment\nnode2:2\n",
                                     "node1\nnode1\nnode2\nnode2\n", "node1\nnode2\n"])
def test_mpi_across_nodes_from_a_host_file(tmp_path, content):
    path = tmp_path / "hosts"
    path.write_text(content)
    cfg = dtf.tf_config(mpi_two_nodes(3), hostfile=str(path), base_port=30000)
    assert workers(cfg) == ["node1:30000", "node1:30001", "node2:30000", "node2:30001"]
    env = {**mpi_two_nodes(3), "DISTENV_HOSTFILE": str(path), "DISTENV_TF_PORT": "30000"}
    assert dtf.tf_config(env) == cfg


def test_host_file_that_does_not_add_up(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("node1:3\nnode2:3\n")
    with pytest.raises(DistEnvError, match="6 slot"):
        dtf.tf_config(mpi_two_nodes(0), hostfile=str(path))
    with pytest.raises(DistEnvError, match="cannot be read"):
        dtf.tf_config(mpi_two_nodes(0), hostfile=str(tmp_path / "nope"))


def test_gather_asks_mpi_only_when_asked(monkeypatch):
    calls = []

    class Comm:
        def Get_rank(self):
            return 2

        def Get_size(self):
            return 4

        def allgather(self, value):
            calls.append(value)
            return ["node1", "node1", "node2", "node2"]

    fake = types.ModuleType("mpi4py")
    fake.MPI = types.SimpleNamespace(COMM_WORLD=Comm())
    monkeypatch.setitem(sys.modules, "mpi4py", fake)
    with pytest.raises(DistEnvError):
        dtf.tf_config(mpi_two_nodes(2))
    assert calls == []  # never without being asked
    cfg = dtf.tf_config({**mpi_two_nodes(2), "DISTENV_GATHER": "mpi4py"}, base_port=30000)
    assert workers(cfg) == ["node1:30000", "node1:30001", "node2:30000", "node2:30001"]
    assert cfg["task"]["index"] == 2 and len(calls) == 1


def test_gather_without_mpi4py_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(DistEnvError, match="pip install mpi4py"):
        dtf.tf_config(mpi_two_nodes(0), gather=True)


def test_google_cloud_cluster_spec():
    cfg = dtf.tf_config(platform("vertex_pytorch_workerpool1_index1"))
    assert cfg["task"] == {"type": "worker", "index": 1}
    assert list(cfg["cluster"]) == ["chief", "worker"]
    assert cfg["environment"] == "cloud"
    spec = {"cluster": {"master": ["m:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:2222"]},
            "task": {"type": "master", "index": 0}}
    cfg = dtf.tf_config({"CLUSTER_SPEC": json.dumps(spec), "CLOUD_ML_JOB_ID": "j"})
    assert cfg["cluster"] == {"chief": ["m:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:2222"]}
    assert cfg["task"] == {"type": "chief", "index": 0}


def test_vertex_tf_config_wins_over_cluster_spec():
    env = platform("vertex_tf_ps")
    assert dtf.tf_config(env) == json.loads(env["TF_CONFIG"])


def test_sagemaker_one_process_per_host(fake_gpus):
    fake_gpus(4)
    cfg = dtf.tf_config(platform("sagemaker_no_launcher_2hosts_host2"))
    hosts = [w.rsplit(":", 1)[0] for w in workers(cfg)]
    assert hosts == ["algo-1", "algo-2"] and cfg["task"]["index"] == 1


def test_sagemaker_mpi_places_ranks_by_host(no_gpus):
    cfg = dtf.tf_config(platform("sagemaker_mpi_2hosts_rank3"))
    hosts = [w.rsplit(":", 1)[0] for w in workers(cfg)]
    assert hosts == ["algo-1", "algo-1", "algo-2", "algo-2"] and cfg["task"]["index"] == 3


def test_accepts_a_distenv():
    d = distenv.resolve(slurm(1))
    assert dtf.tf_config(d, environ=slurm(1)) == dtf.tf_config(slurm(1))


# -- the plan ----------------------------------------------------------------------------------
def test_plan_single_process(no_gpus):
    p = dtf.plan({})
    assert p.kind == "default" and p.tf_config is None


def test_plan_single_process_with_gpus_is_mirrored(fake_gpus):
    fake_gpus(2)
    assert dtf.plan({}).kind == "mirrored"


def test_plan_multi_worker_on_cpus_uses_ring(no_gpus):
    p = dtf.plan(recorded("openmpi4-np2", 0))
    assert p.kind == "multi_worker" and p.communication == "RING"
    assert p.index == 0 and len(p.workers) == 2 and p.cuda_visible_devices is None


def test_plan_gives_each_local_process_its_gpus():
    env = {**recorded("openmpi4-np2", 1), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    p = dtf.plan(env)
    assert p.cuda_visible_devices == "2,3" and p.communication == "NCCL"
    env = {**recorded("openmpi4-np2", 0), "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert dtf.plan(env).cuda_visible_devices == "GPU-a"


def test_plan_refuses_to_share_one_gpu_between_processes(fake_gpus):
    fake_gpus(1)
    with pytest.raises(DistEnvError, match="share 1 GPU"):
        dtf.plan(recorded("openmpi4-np2", 0))


def test_plan_keeps_a_gpu_the_scheduler_gave():
    env = {**recorded("openmpi4-np2", 1), "CUDA_VISIBLE_DEVICES": "3"}
    assert dtf.plan(env).cuda_visible_devices is None


def test_plan_keeps_the_slice_distenv_gave(fake_gpus):
    """Narrowed once (DISTENV_GPU_SLICE beside it): strategy() after patch(), or twice, must
    not narrow "2,3" again to "3"."""
    fake_gpus(4)
    env = recorded("openmpi4-np2", 1)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    assert dtf.plan(env).cuda_visible_devices == "2,3"
    env["CUDA_VISIBLE_DEVICES"] = env[dtf.GPU_SLICE_VAR] = "2,3"
    assert dtf.plan(env).cuda_visible_devices is None


def test_plan_parameter_server(no_gpus):
    p = dtf.plan(platform("tf_config_chief_worker_ps"))
    assert p.kind == "parameter_server"


def test_is_chief_follows_tf_config():
    chief = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}
    worker0 = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}
    assert dtf.is_chief({"TF_CONFIG": json.dumps(chief)})
    assert not dtf.is_chief({"TF_CONFIG": json.dumps(worker0)})
    assert dtf.is_chief(slurm(0)) and not dtf.is_chief(slurm(1))


def test_thread_counts_share_the_node():
    d = distenv.resolve(slurm(0))
    intra, inter = dtf.thread_counts(d)
    assert intra >= 1 and 1 <= inter <= 2


# -- Keras 3 -------------------------------------------------------------------------------
def fake_versions(monkeypatch, **versions):
    from importlib import metadata

    def version(name):
        if name in versions:
            return versions[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)


def test_keras3_under_mwms_fails_early_with_the_fix(monkeypatch):
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    fake_versions(monkeypatch, **{"tensorflow-cpu": "2.21.0", "keras": "3.15.1"})
    problem = dtf.keras_problem({})
    assert "Keras 3" in problem and "TF_USE_LEGACY_KERAS=1" in problem
    assert "allow_keras3=True" in problem and "\n" not in problem
    # Keras 3 itself works on the JAX backend: the fix names that path too.
    assert "Keras 3 on the JAX backend: distenv.keras.initialize()" in problem
    assert "docs/frameworks/jax.md" in problem


def test_tf_keras_is_fine(monkeypatch):
    import importlib.util

    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    fake_versions(monkeypatch, **{"tensorflow-cpu": "2.21.0", "keras": "3.15.1"})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert dtf.keras_problem({"TF_USE_LEGACY_KERAS": "1"}) is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "not installed" in dtf.keras_problem({"TF_USE_LEGACY_KERAS": "1"})


def test_keras3_imported_directly_is_caught(monkeypatch):
    import importlib.util

    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    monkeypatch.setitem(sys.modules, "keras", types.SimpleNamespace(__version__="3.15.1"))
    fake_versions(monkeypatch, **{"tensorflow-cpu": "2.21.0", "keras": "3.15.1"})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert "is imported" in dtf.keras_problem({"TF_USE_LEGACY_KERAS": "1"})


def test_old_tensorflow_has_keras2(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    fake_versions(monkeypatch, **{"tensorflow": "2.15.1", "keras": "2.15.0"})
    assert dtf.keras_problem({}) is None


def test_strategy_refuses_keras3_before_importing_tensorflow(monkeypatch, no_gpus):
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    monkeypatch.setattr(dtf, "tf_initialized", lambda: False)
    monkeypatch.setattr(dtf, "keras_problem", lambda environ=None: "Keras 3 with MultiWorkerMirroredStrategy")
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # importing it would fail the test
    with pytest.raises(DistEnvError, match="Keras 3"):
        dtf.strategy(recorded("openmpi4-np2", 0))


def test_strategy_too_late(monkeypatch, no_gpus):
    monkeypatch.setattr(dtf, "tf_initialized", lambda: True)
    with pytest.raises(dtf.TooLateError, match="at the top of the script"):
        dtf.strategy(recorded("openmpi4-np2", 0))


# -- pre-flight rendezvous -----------------------------------------------------------------
def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    out = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return out


def test_a_worker_whose_port_is_taken_says_so_before_anyone_waits():
    """Another job's worker (blocks derived alike) or any program on this worker's TensorFlow
    port: the worker stops at once, naming the port, instead of failing in TensorFlow's server
    or letting the others reach that job (issue 32 item 5)."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("0.0.0.0", 0))
    held.listen(1)
    taken = held.getsockname()[1]
    addrs = [f"127.0.0.1:{taken}", f"127.0.0.1:{free_ports(1)[0]}"]
    try:
        t0 = time.monotonic()
        with pytest.raises(DistEnvError, match=rf"TensorFlow's port {taken} for worker 0 .* already "
                                               r"in use on this host.*Fix: set DISTENV_TF_PORT to a "
                                               r"free base port on every worker"):
            dtf.rendezvous(addrs, 0, timeout=20, port=free_ports(1)[0], environ={})
        assert time.monotonic() - t0 < 2  # before waiting for anyone
        with pytest.raises(DistEnvError, match=r"Fix: give this worker a free port in TF_CONFIG"):
            dtf.rendezvous(addrs, 0, timeout=20, port=free_ports(1)[0],
                           environ={"TF_CONFIG": json.dumps({"cluster": {"worker": addrs}})})
    finally:
        held.close()


def test_rendezvous_of_three_workers():
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    port = free_ports(1)[0]
    errors, took = [], []

    def run(i, delay):
        time.sleep(delay)
        try:
            took.append(dtf.rendezvous(addrs, i, timeout=20, port=port))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, 0.3 * i)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(took) == 3
    for p in [*addrs, f"127.0.0.1:{port}"]:  # no listener left: TensorFlow's ports are free
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(p.rsplit(":", 1)[1])))
        s.close()


def test_rendezvous_names_the_missing_worker_within_the_timeout():
    addrs = [f"127.0.0.1:{p}" for p in free_ports(2)]
    port = free_ports(1)[0]
    t0 = time.monotonic()
    with pytest.raises(DistEnvError) as err:
        dtf.rendezvous(addrs, 0, timeout=1.5, port=port)
    assert time.monotonic() - t0 < 5
    assert str(err.value).startswith("distenv.tensorflow: worker(s) 1 of 2 never came to the "
                                     f"pre-flight within 2 s (worker 0 at 127.0.0.1:{port} "
                                     f"(worker 0 of the cluster: {addrs[0]}) heard from 1 of 2")
    assert "DISTENV_TIMEOUT" in str(err.value)


def test_rendezvous_timeout_from_environment():
    addrs = [f"127.0.0.1:{p}" for p in free_ports(2)]
    with pytest.raises(DistEnvError, match="worker 1 of 2 could not reach worker 0 at .* within 1 s"):
        dtf.rendezvous(addrs, 1, environ={"DISTENV_TIMEOUT": "1"}, port=free_ports(1)[0])


def test_rendezvous_port_in_use():
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen(1)
    try:
        port = holder.getsockname()[1]
        with pytest.raises(DistEnvError, match="DISTENV_PREFLIGHT_PORT"):
            dtf.rendezvous(["127.0.0.1:1", "127.0.0.1:2"], 0, timeout=1, port=port)
    finally:
        holder.close()


def test_workers_report_to_worker_0_only():
    """The star: worker 0 alone listens (at the pre-flight's port); no worker dials another
    worker's TensorFlow port, which stay closed throughout (issue 32: all-to-all met 256 local
    workers in 134 s, and failed at 384)."""
    n = 6
    addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
    port = free_ports(1)[0]
    seen = []
    real = socket.socket.connect

    def connect(self, address):
        seen.append(address[1])
        return real(self, address)

    out = {}
    socket.socket.connect = connect
    try:
        threads = [threading.Thread(target=lambda i=i: out.setdefault(i, dtf.rendezvous(
            addrs, i, timeout=20, port=port))) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        socket.socket.connect = real
    assert sorted(out) == list(range(n)), out
    assert set(seen) == {port}, seen


def test_import_costs_nothing():
    import subprocess

    code = ("import sys, distenv.tensorflow, distenv.keras, distenv.horovod; "
            "bad = [m for m in ('tensorflow', 'keras', 'tf_keras', 'horovod', 'torch', 'mpi4py') "
            "if m in sys.modules]; assert not bad, bad")
    src = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": src},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


# -- with TensorFlow installed (.venvs/tensorflow, or tox -e tensorflow) ----------------------
def tensorflow_python():
    """An interpreter with TensorFlow: $DISTENV_PY_TENSORFLOW, .venvs/tensorflow, or this one."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(HERE))
    for py in (os.environ.get("DISTENV_PY_TENSORFLOW"),
               os.path.join(root, ".venvs", "tensorflow", "bin", "python")):
        if py and os.access(py, os.X_OK):
            return py
    if importlib.util.find_spec("tensorflow") is not None:
        return sys.executable
    msg = ("no interpreter with TensorFlow (set DISTENV_PY_TENSORFLOW or run "
           "integrations/frameworks/tensorflow.sh)")
    if os.environ.get("DISTENV_REQUIRE_LAUNCHERS") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


def test_too_late_with_real_tensorflow(tmp_path):
    """A tensor first, then a 2-worker strategy: TooLateError naming the fix."""
    import subprocess

    py = tensorflow_python()
    code = ("import os, distenv.tensorflow as d, tensorflow as tf; tf.constant(1.0)\n"
            "try:\n    d.strategy()\nexcept d.TooLateError as e:\n    print('TOO-LATE', e)\n")
    src = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
    env = {**recorded("openmpi4-np2", 0), "PATH": os.environ.get("PATH", ""), "PYTHONPATH": src,
           "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(["timeout", "-k", "5", "170", py, "-c", code], env=env,
                       capture_output=True, text=True, timeout=180, cwd=str(tmp_path))
    assert "TOO-LATE" in p.stdout and "before any other TensorFlow call" in p.stdout, p.stderr[-2000:]
