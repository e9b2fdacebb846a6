"""distenv.lightning.patch() with the real Lightning: Trainers and Fabrics built with no
distenv in their arguments follow the launch (what `distenv.auto` relies on).

Needs Lightning: it runs in .venvs/lightning (tests/e2e/test_lightning_e2e.py starts it
there with DISTENV_REQUIRE_FRAMEWORK=lightning, which turns the skips into failures).
"""

import os
import subprocess
import sys

import pytest

from distenv import DistEnvError
from envs import ompi4, slurm_at

REQUIRE = os.environ.get("DISTENV_REQUIRE_FRAMEWORK", "") == "lightning"
ALL = ("lightning", "pytorch_lightning")
# DISTENV_LIGHTNING_PACKAGES (default both) selects the packages, as in tests/e2e: tox's
# pytorch-lightning env installs no `lightning`, and tests of it are not selected there.
SELECTED = os.environ.get("DISTENV_LIGHTNING_PACKAGES", ",".join(ALL))
PACKAGES = [p for p in SELECTED.replace(" ", "").split(",") if p in ALL] or list(ALL)
KEEP = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS",
        "DISTENV_MASTER_CHECK")


def package(name):
    """(Trainer module, Fabric class, environments module) of one Lightning distribution."""
    if name not in PACKAGES:
        pytest.skip(f"{name} is not selected (DISTENV_LIGHTNING_PACKAGES={SELECTED})")
    try:
        if name == "lightning":
            import lightning.fabric as fabric
            import lightning.pytorch as pl
        else:
            import lightning_fabric as fabric
            import pytorch_lightning as pl
    except ImportError:
        if REQUIRE:
            pytest.fail(f"{name} is not installed (DISTENV_REQUIRE_FRAMEWORK=lightning)")
        pytest.skip(f"{name} is not installed")
    return pl, fabric.Fabric, fabric.plugins.environments


@pytest.fixture
def launch(monkeypatch, no_gpus):
    """launch(variables): os.environ holds only these (and the basics) for the test."""
    def set_env(variables):
        for name in list(os.environ):
            if name not in KEEP:
                monkeypatch.delenv(name)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
    return set_env


@pytest.fixture
def patched():
    import distenv.lightning as dl

    dl.patch()
    yield dl
    dl.unpatch()


def trainer(pl, **kwargs):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


def describe(t):
    env = t._accelerator_connector.cluster_environment  # a single-device strategy has none
    return {"env": type(env).__name__, "strategy": type(t.strategy).__name__,
            "world_size": t.world_size, "global_rank": t.global_rank, "local_rank": t.local_rank,
            "node_rank": t.node_rank, "num_nodes": t.num_nodes, "num_devices": t.num_devices}


# -- the bug, then the fix ------------------------------------------------------------------
@pytest.mark.parametrize("name", PACKAGES)
def test_unpatched_trainer_trains_alone_under_mpirun(launch, name):
    """The baseline the patch fixes: Open MPI without mpi4py, no plugin -> rank 0 of 1."""
    pl, _, _ = package(name)
    launch(ompi4(3, 4, 1, 2, 2))
    got = describe(trainer(pl))
    assert (got["world_size"], got["global_rank"], got["env"]) == (1, 0, "LightningEnvironment")


@pytest.mark.parametrize("name", PACKAGES)
@pytest.mark.parametrize("variables, rank, local, node", [
    (ompi4(3, 4, 1, 2, 2), 3, 1, 1),     # Open MPI across two nodes (no node rank revealed)
    (ompi4(0, 4, 0, 2, 2), 0, 0, 0),
    (slurm_at(2, 1, 0), 2, 0, 1),        # srun, two nodes
    ({"TORCHELASTIC_RUN_ID": "j1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
      "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2",
      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "0",
      "TORCHELASTIC_MAX_RESTARTS": "0"}, 1, 1, 0),
])
def test_patched_trainer_follows_the_launch(launch, patched, name, variables, rank, local, node):
    pl, _, _ = package(name)
    launch(variables)
    size = int(variables.get("OMPI_COMM_WORLD_SIZE") or variables.get("SLURM_NTASKS") or variables["WORLD_SIZE"])
    nodes = 2 if size == 4 else 1
    got = describe(trainer(pl))
    assert got == {"env": "DistenvEnvironment", "strategy": "DDPStrategy", "world_size": size,
                   "global_rank": rank, "local_rank": local, "node_rank": node, "num_nodes": nodes,
                   "num_devices": size // nodes}


@pytest.mark.parametrize("name", PACKAGES)
def test_explicit_matching_settings_are_kept(launch, patched, name):
    pl, _, _ = package(name)
    launch(ompi4(1, 4, 1, 2, 2))
    got = describe(trainer(pl, devices=2, num_nodes=2))
    assert (got["world_size"], got["global_rank"], got["env"]) == (4, 1, "DistenvEnvironment")


@pytest.mark.parametrize("name", PACKAGES)
@pytest.mark.parametrize("kwargs", [{"devices": 1}, {"devices": 4}, {"devices": 2, "num_nodes": 1},
                                    {"num_nodes": 3}])
def test_contradicting_settings_fail_with_the_right_ones(launch, patched, name, kwargs):
    """Explicit values are the user's: checked, never silently replaced."""
    pl, _, _ = package(name)
    launch(ompi4(1, 4, 1, 2, 2))
    with pytest.raises(DistEnvError, match=r"Fix: Trainer\(devices=2, num_nodes=2\)"):
        trainer(pl, **kwargs)


@pytest.mark.parametrize("name", PACKAGES)
def test_the_users_own_environment_wins(launch, patched, name):
    pl, _, envs = package(name)
    launch(ompi4(1, 4, 1, 2, 2))
    mine = envs.LightningEnvironment()
    t = trainer(pl, plugins=[mine], devices=1)
    assert t._accelerator_connector.cluster_environment is mine
    import distenv.lightning as dl

    given = dl.DistenvEnvironment(environ=ompi4(1, 4, 1, 2, 2), rank=1)
    assert trainer(pl, plugins=[given]).strategy.cluster_environment is given  # DDP: 2 x 2


@pytest.mark.parametrize("name", PACKAGES)
def test_no_launcher_keeps_lightnings_choices(launch, patched, name):
    pl, _, _ = package(name)
    launch({})
    got = describe(trainer(pl))
    assert (got["env"], got["world_size"], got["num_devices"]) == ("LightningEnvironment", 1, 1)
    got = describe(trainer(pl, devices=2))  # Lightning starts two workers itself, as always
    assert (got["env"], got["world_size"], got["num_devices"]) == ("LightningEnvironment", 2, 2)


@pytest.mark.parametrize("name", PACKAGES)
def test_per_node_process_starts_the_nodes_workers(launch, patched, name):
    """One MPI process per node and DISTENV_NPROC_PER_NODE=2: Lightning starts 2 workers."""
    pl, _, _ = package(name)
    launch(ompi4(1, 2, 0, 1, 2, {"DISTENV_NPROC_PER_NODE": "2"}))
    t = trainer(pl)
    got = describe(t)
    assert got["env"] == "DistenvEnvironment" and (got["num_devices"], got["num_nodes"]) == (2, 2)
    assert got["node_rank"] == 1 and got["world_size"] == 4
    assert not t.strategy.cluster_environment.creates_processes_externally
    assert type(t.strategy.launcher).__name__ == "_SubprocessScriptLauncher"


@pytest.mark.parametrize("name", PACKAGES)
def test_fabric_follows_the_launch(launch, patched, name):
    _, Fabric, _ = package(name)
    launch(slurm_at(3, 1, 1))
    f = Fabric(accelerator="cpu")
    assert type(f._connector.cluster_environment).__name__ == "DistenvEnvironment"
    assert (f.world_size, f.global_rank, f.local_rank, f.node_rank) == (4, 3, 1, 1)


def test_patch_is_idempotent_and_undone(patched):
    package("lightning")
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector as C

    before = C._choose_and_init_cluster_environment
    patched.patch()
    assert C._choose_and_init_cluster_environment is before
    assert not getattr(before.__wrapped__, "_distenv_patched", False)
    patched.unpatch()
    assert not getattr(C._choose_and_init_cluster_environment, "_distenv_patched", False)
    assert not getattr(C._check_device_config_and_set_final_flags, "_distenv_patched", False)


@pytest.mark.parametrize("name, other", [("lightning", "pytorch_lightning"), ("pytorch_lightning", "lightning")])
def test_patch_touches_only_the_imported_package(name, other):
    """patch() after `import lightning` does not import pytorch_lightning, and the reverse."""
    package(name)
    code = (f"import sys, {name}, distenv.lightning as d; done = d.patch(); "
            f"assert {other!r} not in sys.modules, sys.modules.keys(); "
            f"assert done and all(m.startswith(({name!r}, 'lightning_fabric')) for m in done), done; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k in KEEP})
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


def test_auto_patches_each_lightning_package_imported():
    """distenv.auto under a launch: `import lightning` then `import pytorch_lightning` -- both
    Trainers get the launch's environment, without a plugin in the script."""
    package("lightning")
    package("pytorch_lightning")
    code = """
import json, sys
import distenv.auto
import lightning.pytorch as a
import pytorch_lightning as b
out = []
for pl in (a, b):
    t = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    out.append([type(t.strategy.cluster_environment).__name__, t.world_size, t.global_rank])
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k in KEEP}
    env.update(ompi4(3, 4, 1, 2, 2))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == '[["DistenvEnvironment", 4, 3], ["DistenvEnvironment", 4, 3]]'
    assert "not patched" not in p.stderr


@pytest.mark.parametrize("name", PACKAGES)
@pytest.mark.parametrize("variables", [
    {"TPU_WORKER_HOSTNAMES": "w-0,w-1", "TPU_WORKER_ID": "1"},   # a TPU pod: torch-xla's own ranks
    {"PJRT_DEVICE": "TPU"},                                         # no launcher: Lightning's own choice
], ids=["gke-tpu-pod", "torch-xla-no-launcher"])
def test_patched_trainer_leaves_a_platform_lightning_sets_up_itself(launch, patched, name, variables):
    """Issue 23's general rule: on a TPU pod (whose host-level ranks are not torch-xla's
    per-chip ones) and with no launcher, the patched Trainer is the unpatched one."""
    pl, _, _ = package(name)
    launch(variables)
    got = describe(trainer(pl))
    assert got["env"] != "DistenvEnvironment", got
    assert (got["world_size"], got["global_rank"]) == (1, 0), got
