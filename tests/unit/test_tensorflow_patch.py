"""distenv.tensorflow.patch(), the zero-code hook for TensorFlow (DISTENV_AUTO=1 calls it when the
script imports TensorFlow).

The environment half, `patch_environ()`, on launcher environments (recorded from real launchers,
or written from the platforms' documentation): TF_CONFIG per rank, an existing one left alone,
idempotence, nothing for one process, the cases it refuses to guess. Then `patch()` itself with
real TensorFlow (.venvs/tensorflow, or $DISTENV_PY_TENSORFLOW), one fresh interpreter per
environment: os.environ, thread pools, the MultiWorkerMirroredStrategy wrap, and the errors
raised where the script builds the strategy.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

import distenv
import distenv.tensorflow as dtf
from distenv import DistEnvError
from envs import torchrun
from test_tensorflow_adapter import mpi_two_nodes, platform, recorded, tensorflow_python

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


def workers(config):
    return config["cluster"]["worker"]


def one_per_node(rank, nodes=2, **extra):
    """mpirun --map-by ppr:1:node over `nodes` nodes (Open MPI 4's variables)."""
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(nodes),
            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
            "OMPI_MCA_orte_num_nodes": str(nodes),
            "OMPI_MCA_orte_hnp_uri": "123.0;tcp://10.0.0.1:4000", "OMPI_MCA_ess_base_jobid": "55", **extra}


# -- patch_environ: no TensorFlow needed ---------------------------------------------------------
@pytest.mark.parametrize("name", ["openmpi4-np2", "torchrun-nproc2", "slurm-srun-pmix-n2"])
def test_tf_config_set_per_rank_on_one_node(no_gpus, name):
    envs = [recorded(name, r) for r in (0, 1)]
    states = [dtf.patch_environ(e) for e in envs]
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    assert [s["written"] for s in states] == [{"TF_CONFIG": e["TF_CONFIG"]} for e in envs]
    assert [s["problem"] for s in states] == [None, None]
    assert workers(configs[0]) == workers(configs[1])  # one cluster
    hosts, ports = zip(*(w.rsplit(":", 1) for w in workers(configs[0])))
    assert hosts == ("127.0.0.1", "127.0.0.1") and int(ports[1]) == int(ports[0]) + 1
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert configs == [dtf.tf_config(recorded(name, r)) for r in (0, 1)]  # what strategy() builds
    if "MASTER_PORT" in envs[0]:
        assert envs[0]["MASTER_PORT"] not in ports  # torchrun's store keeps its port


def test_tf_config_across_srun_nodes_follows_slurms_node_list(no_gpus):
    configs = []
    for rank in range(4):
        env = recorded("cluster-srun-2x2", rank)
        dtf.patch_environ(env)
        configs.append(json.loads(env["TF_CONFIG"]))
    assert [c["task"]["index"] for c in configs] == [0, 1, 2, 3]
    assert [w.rsplit(":", 1)[0] for w in workers(configs[0])] == ["node1", "node1", "node2", "node2"]
    assert all(workers(c) == workers(configs[0]) for c in configs)


def test_second_call_writes_nothing(no_gpus):
    env = recorded("openmpi4-np2", 1)
    first = dtf.patch_environ(env)
    before = dict(env)
    again = dtf.patch_environ(env)
    assert first["written"] and again["written"] == {} and env == before
    assert again["tf_config"] == first["tf_config"]


def test_existing_tf_config_is_left_untouched(no_gpus):
    env = platform("azureml_tensorflow_worker1")
    raw = env["TF_CONFIG"]
    state = dtf.patch_environ(env)
    assert state["written"] == {} and env["TF_CONFIG"] == raw and state["problem"] is None
    assert state["tf_config"] == json.loads(raw)


def test_existing_tf_config_matching_the_launch_is_kept_byte_for_byte(no_gpus):
    env = recorded("openmpi4-np2", 1)
    raw = json.dumps({"cluster": {"worker": ["127.0.0.1:31000", "127.0.0.1:31001"]},
                      "task": {"type": "worker", "index": 1}}, indent=1)
    env["TF_CONFIG"] = raw
    state = dtf.patch_environ(env)
    assert env["TF_CONFIG"] == raw and state["written"] == {} and state["problem"] is None


def test_stale_tf_config_is_a_problem_and_left_untouched(no_gpus):
    env = recorded("openmpi4-np2", 1)
    raw = json.dumps({"cluster": {"worker": ["a:1", "b:1", "c:1"]}, "task": {"type": "worker", "index": 1}})
    env["TF_CONFIG"] = raw
    state = dtf.patch_environ(env)
    assert env["TF_CONFIG"] == raw and state["written"] == {}
    kind, message, about_cluster = state["problem"]
    assert kind is DistEnvError and "stale TF_CONFIG" in message and about_cluster


@pytest.mark.parametrize("env", [{}, {"PATH": "/usr/bin"}, "no-launcher", "slurm-sbatch-script-n4"])
def test_nothing_for_a_single_process(no_gpus, env):
    if isinstance(env, str):
        env = recorded(env, 0)
    before = dict(env)
    state = dtf.patch_environ(env)
    assert state == {"env": None, "tf_config": None, "written": {}, "threads": None, "problem": None}
    assert env == before


def test_open_mpi_across_nodes_does_not_guess_hosts(no_gpus):
    env = mpi_two_nodes(2)
    state = dtf.patch_environ(env)
    assert "TF_CONFIG" not in env and state["written"] == {}
    kind, message, about_cluster = state["problem"]
    assert kind is DistEnvError and about_cluster and "\n" not in message
    assert "does not reveal which host runs each rank" in message
    for fix in ("DISTENV_HOSTFILE", "DISTENV_GATHER=mpi4py", "mpirun -x DISTENV_HOSTFILE", "TF_CONFIG"):
        assert fix in message, fix


def test_open_mpi_across_nodes_with_a_host_file(no_gpus, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=2\nnode2 slots=2\n")
    env = {**mpi_two_nodes(2), "DISTENV_HOSTFILE": str(hosts), "DISTENV_TF_PORT": "30000"}
    state = dtf.patch_environ(env)
    assert state["problem"] is None
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["node1:30000", "node1:30001", "node2:30000", "node2:30001"]},
        "task": {"type": "worker", "index": 2}}


def test_torchrun_across_nodes_is_a_problem(no_gpus):
    env = {**torchrun(3, nodes=2, addr="node1"), "TORCHELASTIC_RUN_ID": "x"}
    state = dtf.patch_environ(env)
    assert "TF_CONFIG" not in env and "torchrun numbers nodes in rendezvous order" in state["problem"][1]


def test_the_fixes_follow_what_the_source_declares(no_gpus, monkeypatch):
    """The adapter reads the launch's `Source` (passing.only, launch.node_order, frameworks), never its
    name: changing a declaration changes what TensorFlow is told (issue 21)."""
    from distenv.sources import Frameworks, source_of

    ompi = source_of("openmpi")
    assert (ompi.passing.only, ompi.launch.node_order, ompi.frameworks.tf_cluster) == (True, "", "")
    assert ompi.passing.note("X", ompi.title) == "Open MPI passes variables to other nodes only with mpirun -x X"
    monkeypatch.setattr(ompi.passing, "only", False)
    message = dtf.patch_environ(mpi_two_nodes(2))["problem"][1]
    assert "DISTENV_HOSTFILE" in message and "passes variables" not in message
    monkeypatch.setattr(ompi.launch, "node_order", "it numbers nodes its own way")
    message = dtf.patch_environ(mpi_two_nodes(2))["problem"][1]
    assert "Fix: it numbers nodes its own way: set TF_CONFIG yourself" in message
    # a platform that describes the cluster itself: its cluster, not one built from the hosts
    config = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setattr(ompi, "frameworks", Frameworks(tf_cluster="OMPI_SPEC"))
    monkeypatch.setattr(ompi.frameworks, "tf_config", lambda env: config)
    assert dtf.tf_config(mpi_two_nodes(2)) == config
    monkeypatch.setattr(ompi.frameworks, "tf_config", lambda env: None)
    with pytest.raises(DistEnvError, match="OMPI_SPEC has no TensorFlow-style"):
        dtf.tf_config(mpi_two_nodes(2))
    assert source_of("no-such-launcher").frameworks.tf_cluster == ""  # an unknown name declares nothing


def test_each_local_process_gets_its_gpus(fake_gpus, monkeypatch):
    # A TensorFlow job's process: no torch imported (an earlier test of the session may have).
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    fake_gpus(4)
    env = recorded("openmpi4-np2", 1)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    state = dtf.patch_environ(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and state["written"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert json.loads(env["TF_CONFIG"])["task"]["index"] == 1
    # Narrowed once: a second look (patch again, or strategy() after it) keeps the slice.
    assert dtf.patch_environ(env)["written"] == {} and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert dtf.plan(env).cuda_visible_devices is None


def test_gpus_shared_by_processes_is_a_problem(fake_gpus):
    fake_gpus(1)
    env = recorded("openmpi4-np2", 0)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    state = dtf.patch_environ(env)
    assert "share 1 GPU(s)" in state["problem"][1] and "CUDA_VISIBLE_DEVICES" not in env


def test_gpus_left_alone_when_torch_is_imported(fake_gpus, monkeypatch):
    """A torch job that imports TensorFlow on the side (TensorBoard does): narrowing
    CUDA_VISIBLE_DEVICES could move torch's GPUs, so it is left, and building a
    MultiWorkerMirroredStrategy would be the error."""
    fake_gpus(4)
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # "torch is imported"
    env = recorded("openmpi4-np2", 1)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    state = dtf.patch_environ(env)
    assert "CUDA_VISIBLE_DEVICES" not in env and "TF_CONFIG" in env
    kind, message, about_cluster = state["problem"]
    assert kind is DistEnvError and not about_cluster
    assert "torch is imported" in message and "CUDA_VISIBLE_DEVICES=2,3" in message


@pytest.fixture
def service(monkeypatch):
    """distenv.discovery.complete stood in for (the real service: tests/e2e, Open MPI's PMIx
    and MPICH's PMI-1 across the two namespace nodes): the fields asked, every rank placed."""
    import distenv.discovery

    asked = []

    def complete(env, need=("master_addr",), timeout=None):
        asked.append(tuple(need))
        hosts = tuple("node1" if r < 2 else "node2" for r in range(env.world_size))
        return env.replace(rank_hosts=hosts, master_addr="node1")

    monkeypatch.setattr(distenv.discovery, "complete", complete)
    return asked


def test_the_service_gives_the_hosts_when_the_strategy_is_built_not_at_import(no_gpus, service):
    """Open MPI across nodes: nothing asked when the script imports TensorFlow (patch_environ,
    a torch job through TensorBoard asks nothing); asked with discover=True, as the wrapped
    MultiWorkerMirroredStrategy() does: every rank's host, TF_CONFIG from it."""
    env = mpi_two_nodes(2)
    assert dtf.patch_environ(dict(env))["problem"] is not None and service == []
    state = dtf.patch_environ(env, discover=True)
    assert service == [("rank_hosts",)] and state["problem"] is None
    config = json.loads(env["TF_CONFIG"])
    hosts = [w.rsplit(":", 1)[0] for w in config["cluster"]["worker"]]
    assert hosts == ["node1", "node1", "node2", "node2"] and config["task"]["index"] == 2


@pytest.mark.parametrize("extra, asks", [
    ({}, True),
    ({"DISTENV_HOSTFILE": "/nonexistent"}, False),  # the user's host file (read later, not asked)
    ({"DISTENV_GATHER": "mpi4py"}, False),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1", "c:1", "d:1"]},
                               "task": {"type": "worker", "index": 2}})}, False),
])
def test_the_service_is_asked_only_for_hosts_nothing_else_gives(no_gpus, extra, asks):
    from distenv.tensorflow.cluster import hosts_needed

    env = {**mpi_two_nodes(2), **extra}
    assert hosts_needed(distenv.resolve(env), env) == (("rank_hosts",) if asks else ())
    for one_node in (recorded("openmpi4-np2", 1), recorded("cluster-srun-2x2", 1),
                     one_per_node(1, DISTENV_NPROC_PER_NODE="2")):
        assert hosts_needed(distenv.resolve(one_node), one_node) == ()  # placed, or one node, or per-node


def test_per_node_launch_on_cpus_cannot_be_served(no_gpus):
    """One process per node asked to be 2 workers (DISTENV_NPROC_PER_NODE=2): TensorFlow has
    no launcher for the second, and one CPU process is one replica."""
    env = one_per_node(1, DISTENV_NPROC_PER_NODE="2")
    state = dtf.patch_environ(env)
    assert state["env"].launch == "per-node" and "TF_CONFIG" not in env
    kind, message, about_cluster = state["problem"]
    assert kind is DistEnvError and about_cluster and "\n" not in message
    assert "per-node launch" in message and "TensorFlow cannot start workers" in message
    assert "--map-by ppr:N:node" in message and "DISTENV_NPROC_PER_NODE=1" in message
    # The fix it names works: one TensorFlow worker per node (hosts still to be given).
    env["DISTENV_NPROC_PER_NODE"] = "1"
    assert "does not reveal which host runs each rank" in dtf.patch_environ(env)["problem"][1]


def test_per_node_launch_with_one_process_driving_its_gpus_is_one_worker_per_node(fake_gpus):
    """SageMaker (no launcher), 4 GPUs per host: one TensorFlow worker per host, MWMS makes a
    replica of each local GPU -- 8 replicas, the world size distenv reports."""
    fake_gpus(4)
    env = platform("sagemaker_no_launcher_2hosts_host2")
    state = dtf.patch_environ(env)
    assert state["problem"] is None and state["env"].world_size == 8
    config = json.loads(env["TF_CONFIG"])
    assert [w.rsplit(":", 1)[0] for w in workers(config)] == ["algo-1", "algo-2"]
    assert config["task"] == {"type": "worker", "index": 1}
    assert "CUDA_VISIBLE_DEVICES" not in env  # the one process keeps every GPU


def test_one_worker_per_node_is_simply_a_worker(no_gpus, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode2\n")
    env = one_per_node(1, DISTENV_HOSTFILE=str(hosts))
    state = dtf.patch_environ(env)
    assert state["problem"] is None and state["env"].launch == "per-process"
    config = json.loads(env["TF_CONFIG"])
    assert [w.rsplit(":", 1)[0] for w in workers(config)] == ["node1", "node2"]
    assert config["task"]["index"] == 1


def test_patch_environ_imports_no_framework():
    code = ("import sys, json, distenv.tensorflow as d; e = json.loads(sys.argv[1]); d.patch_environ(e); "
            "assert 'TF_CONFIG' in e; bad = [m for m in ('tensorflow', 'keras', 'tf_keras', 'torch') "
            "if m in sys.modules]; assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(recorded("openmpi4-np2", 0))],
                       env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


# -- patch() with real TensorFlow -----------------------------------------------------------------
def run_tf(code: str, env: dict, legacy_keras: bool = True) -> dict:
    """Run `code` in a fresh TensorFlow interpreter with exactly `env` (plus what Python needs);
    it prints one JSON line after "RESULT "."""
    py = tensorflow_python()
    full = {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": SRC,
            "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    if legacy_keras:
        full["TF_USE_LEGACY_KERAS"] = "1"
    p = subprocess.run(["timeout", "-k", "5", "170", py, "-c", code], env=full, capture_output=True,
                       text=True, timeout=180, cwd="/")
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def catch(call: str) -> str:
    """Code: run `call`, put 'ok' or '<ExceptionClass>: <message>' in variable `caught`."""
    return (f"try:\n    {call}\n    caught = 'ok'\n"
            "except Exception as exc:\n    caught = type(exc).__name__ + ': ' + str(exc)\n")


def test_patch_with_tensorflow_on_a_two_worker_launch():
    """Open MPI rank 1 of 2: TF_CONFIG in os.environ, thread pools sized, the MWMS constructor
    wrapped once (marked, __wrapped__), a second call changes nothing, unpatch restores."""
    code = (
        "import json, os, distenv.tensorflow as d, tensorflow as tf\n"
        "M = tf.distribute.MultiWorkerMirroredStrategy\n"
        "original = M.__init__\n"
        "env = d.patch()\n"
        "wrapped = M.__init__\n"
        "config = os.environ['TF_CONFIG']\n"
        "again = d.patch()\n"
        "out = dict(rank=env.rank, tf_config=json.loads(config), same=again is env,\n"
        "    unchanged=os.environ['TF_CONFIG'] == config and M.__init__ is wrapped,\n"
        "    marked=getattr(wrapped, '_distenv_patched', False), inner=wrapped.__wrapped__ is original,\n"
        "    intra=tf.config.threading.get_intra_op_parallelism_threads(),\n"
        "    inter=tf.config.threading.get_inter_op_parallelism_threads(),\n"
        "    want=list(d.thread_counts(env)), initialized=d.tf_initialized())\n"
        "d.unpatch()\n"
        "out['restored'] = M.__init__ is original\n"
        "print('RESULT ' + json.dumps(out))\n")
    env = recorded("openmpi4-np2", 1)
    r = run_tf(code, env)
    assert r["rank"] == 1 and r["tf_config"] == dtf.tf_config(recorded("openmpi4-np2", 1))
    assert r["same"] and r["unchanged"] and r["marked"] and r["inner"] and r["restored"]
    assert [r["intra"], r["inter"]] == r["want"] and not r["initialized"]


def test_patch_with_tensorflow_leaves_an_existing_tf_config():
    raw = json.dumps({"cluster": {"worker": ["127.0.0.1:31000", "127.0.0.1:31001"]},
                      "task": {"type": "worker", "index": 0}}, indent=2)
    code = ("import json, os, distenv.tensorflow as d, tensorflow as tf\nd.patch()\n"
            "print('RESULT ' + json.dumps(os.environ['TF_CONFIG']))\n")
    assert run_tf(code, {**recorded("openmpi4-np2", 0), "TF_CONFIG": raw}) == raw


def test_patch_with_tensorflow_does_nothing_for_one_process():
    code = ("import json, os, distenv.tensorflow as d, tensorflow as tf\n"
            "M = tf.distribute.MultiWorkerMirroredStrategy\noriginal = M.__init__\n"
            "result = d.patch()\n"
            "s = M()\n"
            "print('RESULT ' + json.dumps(dict(result=result, tf_config=os.environ.get('TF_CONFIG'),\n"
            "    wrapped=M.__init__ is not original, replicas=s.num_replicas_in_sync,\n"
            "    intra=tf.config.threading.get_intra_op_parallelism_threads())))\n")
    r = run_tf(code, {})
    assert r == {"result": None, "tf_config": None, "wrapped": False, "replicas": 1, "intra": 0}


def test_hosts_unknown_raise_where_the_strategy_is_built():
    """Open MPI across nodes without a host file: importing TensorFlow and patch() go on (a
    script that never builds the strategy is not broken); both MWMS constructors raise."""
    code = ("import json, os, distenv.tensorflow as d, tensorflow as tf\n"
            "d.patch()\n" + catch("tf.distribute.MultiWorkerMirroredStrategy()") + "first = caught\n"
            + catch("tf.distribute.experimental.MultiWorkerMirroredStrategy()") +
            "print('RESULT ' + json.dumps(dict(first=first, experimental=caught,\n"
            "    tf_config=os.environ.get('TF_CONFIG'))))\n")
    r = run_tf(code, mpi_two_nodes(0))
    assert r["tf_config"] is None
    for caught in (r["first"], r["experimental"]):
        assert caught.startswith("DistEnvError: cannot build TF_CONFIG: openmpi runs 4 worker(s) on 2 node(s)")
        assert "DISTENV_HOSTFILE" in caught


def test_too_late_says_so_where_the_strategy_is_built():
    """A tensor first, then `import distenv.auto` (which patches at once): the strategy raises
    TooLateError naming the fix instead of TensorFlow's own collective-ops error."""
    code = ("import json, tensorflow as tf\ntf.constant(1.0)\nimport distenv.auto, distenv.tensorflow as d\n"
            + catch("tf.distribute.MultiWorkerMirroredStrategy()") +
            "print('RESULT ' + json.dumps(dict(caught=caught, applied=distenv.auto.applied)))\n")
    r = run_tf(code, recorded("openmpi4-np2", 0))
    assert "distenv.tensorflow:patch" in r["applied"]
    assert r["caught"].startswith("TooLateError: distenv.tensorflow.patch() came too late to join the 2-worker")
    assert "import distenv.auto (or set DISTENV_AUTO=1) before any TensorFlow call" in r["caught"]


def test_keras3_refused_at_the_strategy_and_the_opt_in_reaches_the_rendezvous():
    """tf.keras is Keras 3: DistEnvError naming TF_USE_LEGACY_KERAS=1 and DISTENV_ALLOW_KERAS3=1,
    before anything listens. With DISTENV_ALLOW_KERAS3=1 the pre-flight rendezvous runs and,
    worker 1 never starting, names it after DISTENV_TIMEOUT instead of hanging."""
    code = ("import json, os, time, distenv.tensorflow as d, tensorflow as tf\nd.patch()\n"
            + catch("tf.distribute.MultiWorkerMirroredStrategy()") + "keras3 = caught\n"
            "os.environ['DISTENV_ALLOW_KERAS3'] = '1'\nt0 = time.monotonic()\n"
            + catch("tf.distribute.MultiWorkerMirroredStrategy()") +
            "print('RESULT ' + json.dumps(dict(keras3=keras3, opt_in=caught, took=time.monotonic() - t0)))\n")
    r = run_tf(code, {**recorded("openmpi4-np2", 0), "DISTENV_TIMEOUT": "2"}, legacy_keras=False)
    assert r["keras3"].startswith("DistEnvError: Keras 3 with MultiWorkerMirroredStrategy")
    assert "TF_USE_LEGACY_KERAS=1" in r["keras3"] and "DISTENV_ALLOW_KERAS3=1" in r["keras3"]
    assert "allow_keras3=True" not in r["keras3"]
    assert r["opt_in"].startswith("DistEnvError: distenv.tensorflow: worker(s) 1 of 2 never came to "
                                  "the pre-flight within 2 s (worker 0 at ")
    assert r["took"] < 30
