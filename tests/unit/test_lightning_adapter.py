"""distenv.lightning on recorded and documented launcher environments: what the plugin tells
Lightning, the Trainer arguments it asks for, and the errors for contradicting ones.
Lightning is not needed (the plugin's answers are plain Python); where it is installed the
last tests check that each package's base class accepts the plugin: with
DISTENV_REQUIRE_FRAMEWORK=lightning (the Lightning venv's re-run in tests/e2e/test_lightning_e2e.py,
tox) a selected package that does not import is a failure, not a skip;
DISTENV_LIGHTNING_PACKAGES (default both) selects the packages, as in the e2e tests."""

import importlib
import json
import os

import pytest

from distenv import DistEnvError
from distenv.lightning import WORKER_VAR, DistenvEnvironment, settings, trainer_kwargs
from envs import PLATFORM_CASES, hydra_rank, ompi4, platform_case, ranks, slurm_at


PER_NODE = {"DISTENV_NPROC_PER_NODE": "2"}
REQUIRE = os.environ.get("DISTENV_REQUIRE_FRAMEWORK", "") == "lightning"
ALL = ("lightning", "pytorch_lightning")
SELECTED = os.environ.get("DISTENV_LIGHTNING_PACKAGES", ",".join(ALL))
PACKAGES = tuple(p for p in SELECTED.replace(" ", "").split(",") if p in ALL) or ALL


# -- trainer_kwargs ------------------------------------------------------------------------
@pytest.mark.parametrize("layout, devices, nodes", [
    ("openmpi4-np4", 4, 1), ("openmpi5-np4", 4, 1), ("mpich4-np4", 4, 1), ("intelmpi-np4", 4, 1),
    ("slurm-srun-n4", 4, 1), ("torchrun-nproc2", 2, 1), ("no-launcher", 1, 1),
    ("slurm-srun-n1-torchrun-nproc2", 2, 1),
])
def test_trainer_kwargs_on_recorded_launches(no_gpus, layout, devices, nodes):
    for e in ranks(layout):
        assert trainer_kwargs(environ=e) == {"devices": devices, "num_nodes": nodes}


def test_trainer_kwargs_two_nodes(no_gpus):
    assert trainer_kwargs(environ=slurm_at(3, 1, 1)) == {"devices": 2, "num_nodes": 2}
    # Open MPI 5 across nodes gives no node count: world / local when every node is alike.
    e = ompi4(2, 4, 0, 2, 2)
    del e["OMPI_MCA_orte_num_nodes"]
    assert trainer_kwargs(environ=e) == {"devices": 2, "num_nodes": 2}
    assert trainer_kwargs(environ=ompi4(1, 2, 0, 1, 2, PER_NODE)) == {"devices": 2, "num_nodes": 2}


def test_uneven_layout_is_an_error(no_gpus):
    # srun -N2 -n3: 2 tasks on node1, 1 on node2 -- Lightning needs equal counts.
    with pytest.raises(DistEnvError, match="same number on every node"):
        settings(DistenvEnvironment(environ=slurm_at(2, 1, 0, "2,1", 3)).env)


# -- per-process: the launcher made the workers ------------------------------------------------
def test_per_process_answers_come_from_the_launcher(no_gpus):
    for e in ranks("openmpi5-np4"):
        env = DistenvEnvironment(environ=e)
        assert env.creates_processes_externally is True
        assert env.global_rank() == int(e["OMPI_COMM_WORLD_RANK"])
        assert env.local_rank() == int(e["OMPI_COMM_WORLD_LOCAL_RANK"])  # 0,2,1,3: not rank % 4
        assert env.world_size() == 4 and env.node_rank() == 0
        assert env.main_address == "127.0.0.1" and 1 <= env.main_port <= 65535
        env.set_global_rank(0)   # Lightning's arithmetic is ignored for external processes
        env.set_world_size(1)
        assert env.global_rank() == int(e["OMPI_COMM_WORLD_RANK"]) and env.world_size() == 4
        env.validate_settings(num_devices=4, num_nodes=1)


def test_every_rank_agrees_on_the_master(no_gpus):
    envs = [DistenvEnvironment(environ=e) for e in ranks("slurm-srun-n4")]
    assert len({(e.main_address, e.main_port) for e in envs}) == 1


@pytest.mark.parametrize("devices, nodes", [(1, 1), (2, 1), (4, 2), (2, 2)])
def test_contradicting_settings_name_the_right_ones(no_gpus, devices, nodes):
    env = DistenvEnvironment(environ=ranks("openmpi4-np4")[1])
    with pytest.raises(DistEnvError) as err:
        env.validate_settings(num_devices=devices, num_nodes=nodes)
    msg = str(err.value)
    assert f"Trainer(devices={devices}, num_nodes={nodes}) contradicts the launch" in msg
    assert "Fix: Trainer(devices=4, num_nodes=1)" in msg and "trainer_kwargs()" in msg
    assert "\n" not in msg
    if (devices, nodes) == (1, 1):
        assert "believing it is rank 0" in msg


def test_unknown_master_across_nodes_names_master_addr(no_gpus):
    # MPICH across nodes reveals no head-node address.
    e = hydra_rank(1, 4, 1, 2)
    env = DistenvEnvironment(environ=e)
    assert env.env.master_addr is None
    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        env.main_address
    assert DistenvEnvironment(environ={**e, "MASTER_ADDR": "node1"}).main_address == "node1"


def test_incomplete_launch_fails_at_construction(no_gpus):
    # MPICH -pmi-port: no world size at all.
    with pytest.raises(DistEnvError, match="WORLD_SIZE"):
        DistenvEnvironment(environ=ranks("mpich4-np2-pmi-port")[1])


# -- per-node: Lightning starts the workers ------------------------------------------------
def test_per_node_process_lets_lightning_start_the_workers(no_gpus):
    environ = ompi4(1, 2, 0, 1, 2, PER_NODE)
    env = DistenvEnvironment(environ=environ)
    assert env.env.launch == "per-node"
    assert env.creates_processes_externally is False
    assert env.node_rank() == 1 and env.local_rank() == 0
    assert env.world_size() == 4 and env.global_rank() == 2
    assert env.main_address == "10.213.77.11"
    env.validate_settings(num_devices=2, num_nodes=2)
    # Lightning's own arithmetic is what its workers use: the setters are honoured.
    env.set_global_rank(2)
    env.set_world_size(4)
    assert (env.global_rank(), env.world_size()) == (2, 4)
    # validate_settings handed the node's description to the workers Lightning starts.
    node = json.loads(environ[WORKER_VAR])
    assert (node["node_rank"], node["num_nodes"], node["nproc_per_node"]) == (1, 2, 2)

    # A worker: Lightning copies the environment and sets LOCAL_RANK (and friends).
    worker_environ = {**environ, "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4",
                      "MASTER_ADDR": env.main_address, "MASTER_PORT": str(env.main_port)}
    worker = DistenvEnvironment(environ=worker_environ)
    assert worker.creates_processes_externally is True
    assert (worker.local_rank(), worker.node_rank(), worker.global_rank()) == (1, 1, 3)
    assert worker.world_size() == 4
    assert (worker.main_address, worker.main_port) == (env.main_address, env.main_port)
    worker.validate_settings(num_devices=2, num_nodes=2)


def test_per_node_contradictions(no_gpus):
    env = DistenvEnvironment(environ=ompi4(0, 2, 0, 1, 2, PER_NODE))
    for devices, nodes in ((1, 2), (2, 1), (4, 1)):
        with pytest.raises(DistEnvError, match=r"Fix: Trainer\(devices=2, num_nodes=2\)"):
            env.validate_settings(num_devices=devices, num_nodes=nodes)


# The peer's case: Lightning's guide "Run on an on-prem cluster (intermediate)": on each node
# MASTER_ADDR, MASTER_PORT, WORLD_SIZE (all processes) and NODE_RANK, Trainer(devices=8, num_nodes=4).
ONPREM = {"MASTER_ADDR": "10.10.10.16", "MASTER_PORT": "29500", "WORLD_SIZE": "32", "NODE_RANK": "1"}


def test_lightning_onprem_node_process_takes_the_trainer_s_devices(no_gpus):
    environ = dict(ONPREM)
    env = DistenvEnvironment(environ=environ)
    assert env.env.launch == "per-node" and env.creates_processes_externally is False
    assert (env.node_rank(), env.world_size(), env.main_address, env.main_port) == (1, 32, "10.10.10.16", 29500)
    env.validate_settings(num_devices=8, num_nodes=4)
    assert env.global_rank() == 8  # node 1 x 8 devices + local rank 0
    node = json.loads(environ[WORKER_VAR])
    assert (node["node_rank"], node["num_nodes"], node["nproc_per_node"], node["world_size"]) == (1, 4, 8, 32)
    worker = DistenvEnvironment(environ={**environ, "LOCAL_RANK": "3"})
    assert (worker.global_rank(), worker.world_size(), worker.node_rank()) == (11, 32, 1)
    with pytest.raises(DistEnvError, match=r"set DISTENV_NPROC_PER_NODE"):
        trainer_kwargs(environ=dict(ONPREM))
    assert trainer_kwargs(environ={**ONPREM, "DISTENV_NPROC_PER_NODE": "8"}) == {"devices": 8, "num_nodes": 4}


@pytest.mark.parametrize("devices,nodes,match", [
    (8, 2, r"makes 16 processes but the launch says world_size=32.*Fix: Trainer\(devices=8, num_nodes=4\)"),
    (5, 4, r"makes 20 processes.*devices x num_nodes = WORLD_SIZE"),
    (32, 1, r"node_rank=1.*NODE_RANK 0..0"),
])
def test_lightning_onprem_contradictions_name_both(no_gpus, devices, nodes, match):
    env = DistenvEnvironment(environ=dict(ONPREM))
    with pytest.raises(DistEnvError, match=match):
        env.validate_settings(num_devices=devices, num_nodes=nodes)


def test_workers_of_a_lone_process(no_gpus):
    # `python train.py` with Trainer(devices=2): Lightning starts the second worker itself.
    environ = {}
    env = DistenvEnvironment(environ=environ)
    assert trainer_kwargs(environ={}) == {"devices": 1, "num_nodes": 1}
    assert env.creates_processes_externally is False
    env.validate_settings(num_devices=2, num_nodes=1)
    worker = DistenvEnvironment(environ={**environ, "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                                         "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                                         "MASTER_PORT": str(env.main_port)})
    assert (worker.global_rank(), worker.world_size(), worker.local_rank()) == (1, 2, 1)
    with pytest.raises(DistEnvError, match="nothing starts it on other nodes"):
        DistenvEnvironment(environ={}).validate_settings(num_devices=1, num_nodes=2)


def test_slurm_batch_script_is_one_process(no_gpus):
    e = ranks("slurm-sbatch-script-n4")[0]
    with pytest.raises(DistEnvError, match="single process"):
        DistenvEnvironment(environ=e).validate_settings(num_devices=2, num_nodes=2)


# -- with Lightning installed ----------------------------------------------------------------
@pytest.mark.parametrize("package, module", [("lightning", "lightning.fabric.plugins.environments"),
                                             ("pytorch_lightning", "lightning_fabric.plugins.environments")])
def test_each_package_base_class_accepts_the_plugin(no_gpus, package, module):
    if package not in PACKAGES:
        pytest.skip(f"{package} is not selected (DISTENV_LIGHTNING_PACKAGES={SELECTED})")
    try:
        base = importlib.import_module(module).ClusterEnvironment
    except ImportError as exc:
        if REQUIRE:
            pytest.fail(f"{module} does not import (DISTENV_REQUIRE_FRAMEWORK=lightning): {exc}")
        pytest.skip(f"{package} is not installed: {exc}")
    env = DistenvEnvironment(environ=ranks("openmpi4-np2")[0])
    assert isinstance(env, base)
    missing = [name for name in base.__abstractmethods__ if not hasattr(env, name)]
    assert missing == []


# -- documented platforms: the cases where users hand-compute NODE_RANK and get it wrong ----------
def _training_launch(name) -> bool:
    want = platform_case(name)["expected"]
    return "error" not in want and want.get("world_size") is not None and want.get("launch") is not None


# Only complete training launches (not an error, not a parameter server): the others have
# nothing to tell Lightning, and leaving them out keeps the run free of skips (the Lightning
# venv's re-run accepts none).
@pytest.mark.parametrize("name", [n for n in PLATFORM_CASES if _training_launch(n)])
def test_documented_platforms(fake_gpus, name):
    case = platform_case(name)
    fake_gpus(case.get("gpus", 0))
    want = case["expected"]
    environ = dict(case["env"])
    env = DistenvEnvironment(environ=environ)
    if want["launch"] == "per-node":
        # Azure ML per-node MPI, Kubeflow/Vertex node-level RANK: Lightning starts the workers
        # of this node with the node rank -- never RANK taken as a global rank.
        assert env.creates_processes_externally is False
        assert env.node_rank() == want["node_rank"]
        assert trainer_kwargs(environ=environ) == {"devices": want["nproc_per_node"],
                                                   "num_nodes": want["num_nodes"]}
        assert env.world_size() == want["world_size"]
        _workers_resolve(environ, env, want)
    else:
        # A lone process (no launcher) is one node on which Lightning may start workers.
        assert env.creates_processes_externally is (env.env.launcher != "none")
        assert (env.global_rank(), env.world_size()) == (want["rank"], want["world_size"])
        if want.get("local_rank") is not None:
            assert env.local_rank() == want["local_rank"]
    if want.get("master_addr"):
        assert env.main_address == want["master_addr"]


def _workers_resolve(environ, env, want):
    """Each worker Lightning starts from this node process: the node's environment (RANK
    included, a node index on Kubeflow, GCP and Vertex), the hand-off, and what Lightning's
    launcher sets. Review, 2026-12-07: the inherited RANK stopped every worker but 0."""
    from distenv import resolve
    from distenv.sources.lightning_node import VARIABLE, hand_off

    nproc, nodes, node = want["nproc_per_node"], want["num_nodes"], want["node_rank"]
    for local in range(nproc):
        worker = {**environ, VARIABLE: hand_off(env.env, nproc, nodes), "LOCAL_RANK": str(local),
                  "NODE_RANK": str(node), "WORLD_SIZE": str(nproc * nodes)}
        if env.env.master_addr is not None:
            worker.update(MASTER_ADDR=env.env.master_addr, MASTER_PORT=str(env.env.master_port))
        got = resolve(worker)
        assert (got.launcher, got.rank, got.local_rank, got.node_rank, got.world_size) == \
            ("lightning", node * nproc + local, local, node, nproc * nodes)


def _need_installed(package, module):
    """Skip a package DISTENV_LIGHTNING_PACKAGES leaves out, or whose `module` is not installed
    (a failure under DISTENV_REQUIRE_FRAMEWORK=lightning)."""
    import importlib.util

    if package not in PACKAGES:
        pytest.skip(f"{package} is not selected (DISTENV_LIGHTNING_PACKAGES={SELECTED})")
    if importlib.util.find_spec(module) is None:
        if REQUIRE:
            pytest.fail(f"{module} is not installed (DISTENV_REQUIRE_FRAMEWORK=lightning)")
        pytest.skip(f"{module} is not installed")


@pytest.mark.parametrize("package, strategies", [("lightning", "lightning.pytorch.strategies"),
                                                 ("pytorch_lightning", "pytorch_lightning.strategies")])
def test_a_plugin_made_before_the_trainer_package_is_imported_guards_its_single_device(package, strategies):
    """Review, 2026-12-07: DistenvEnvironment() before `import pytorch_lightning` left its
    Trainer(devices=1) unguarded (lightning_fabric does not import it): two ranks trained alone."""
    import subprocess
    import sys

    _need_installed(package, package)
    code = (f"import sys; from distenv.lightning import DistenvEnvironment; DistenvEnvironment(); "
            f"import {strategies} as s; "
            "print(getattr(s.SingleDeviceStrategy.setup_environment, '_distenv_guard', False))")
    env = {**os.environ, **ompi4(1, 2, 1, 2, 1)}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "True", (p.stdout, p.stderr[-2000:])


FABRIC_CASES = """
import json, sys
from distenv.lightning import DistenvEnvironment
Fabric = __import__(sys.argv[1], fromlist=["Fabric"]).Fabric
out = {}
for name, kw in (("default", {}), ("devices1", {"devices": 1}), ("devices2", {"devices": 2})):
    try:
        f = Fabric(accelerator="cpu", plugins=[DistenvEnvironment()], **kw)
        out[name] = [type(f.strategy).__name__, f.global_rank, f.world_size]
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@pytest.mark.parametrize("package, fabric", [("lightning", "lightning"),
                                             ("pytorch_lightning", "lightning_fabric")])
def test_a_single_device_fabric_with_the_plugin_on_two_processes_is_refused(package, fabric):
    """Fabric(plugins=[DistenvEnvironment()]) with the default devices on CPU (one) or
    devices=1 ran each of two ranks as rank 0 of 1 (its single-device strategy has no launcher,
    where Lightning validates); now the Trainer's one line, naming Fabric."""
    import subprocess
    import sys

    _need_installed(package, fabric)
    env = {**os.environ, **ompi4(1, 2, 1, 2, 1)}
    p = subprocess.run([sys.executable, "-c", FABRIC_CASES, fabric], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for case in ("default", "devices1"):
        assert got[case].startswith("DistEnvError: Fabric(devices=1, num_nodes=1) contradicts") \
            and "Fix: Fabric(devices=2, num_nodes=1)" in got[case], got
    assert got["devices2"] == ["DDPStrategy", 1, 2], got


def test_lightning_s_own_workers_of_a_lone_process_are_handed_the_node(monkeypatch, no_gpus):
    """Review, 2026-12-07: no launcher, patch() and Trainer(devices=2): Lightning's own
    environment starts the workers, which got WORLD_SIZE, NODE_RANK and LOCAL_RANK but no RANK,
    and distenv in each stopped it. The node now hands them itself with the master Lightning
    chose (a real 2-worker fit ran so by hand; here Lightning's real environment object)."""
    import types

    from distenv import lightning, resolve

    try:
        from lightning.fabric.plugins.environments import LightningEnvironment
    except ImportError as exc:
        if REQUIRE:
            pytest.fail(f"lightning does not import (DISTENV_REQUIRE_FRAMEWORK=lightning): {exc}")
        pytest.skip(f"lightning is not installed: {exc}")
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", WORKER_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MASTER_PORT", "23456")
    chosen = LightningEnvironment()
    lightning._hand_off_own(types.SimpleNamespace(_parallel_devices=[0, 1], _num_nodes_flag=1), chosen)
    handed = os.environ[WORKER_VAR]
    worker = {WORKER_VAR: handed, "LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2",
              "MASTER_ADDR": chosen.main_address, "MASTER_PORT": "23456"}
    got = resolve(worker)
    assert (got.launcher, got.rank, got.world_size, got.master_addr, got.master_port) == \
        ("lightning", 1, 2, "127.0.0.1", 23456)
    monkeypatch.delenv(WORKER_VAR)
    lightning._hand_off_own(types.SimpleNamespace(_parallel_devices=[0], _num_nodes_flag=1), chosen)
    assert WORKER_VAR not in os.environ  # one device: no workers to hand anything


def test_plugin_pickles_for_spawn_strategies(no_gpus):
    import pickle

    env = DistenvEnvironment()
    copy = pickle.loads(pickle.dumps(env))
    assert copy.env == env.env and copy._environ is os.environ
    given = DistenvEnvironment(environ=ranks("openmpi4-np2")[1])
    assert pickle.loads(pickle.dumps(given)).global_rank() == 1
