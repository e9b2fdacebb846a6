"""distenv.deepspeed without DeepSpeed: a stand-in `deepspeed` module records the call.

The real DeepSpeed under real launchers is tests/e2e/test_deepspeed_e2e.py.
"""
import json
import os
import sys
import types

import pytest

import distenv.deepspeed as dsa
from distenv import DistEnvError
from envs import ompi, slurm_task

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
FIVE = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


@pytest.fixture
def fake_deepspeed(monkeypatch):
    """A `deepspeed` module whose init_distributed records its arguments and the five
    variables as DeepSpeed would read them (and fails, like DeepSpeed without mpi4py,
    when discovery would be needed)."""
    calls = []

    def init_distributed(dist_backend=None, auto_mpi_discovery=True, **kwargs):
        have = all(v in os.environ for v in FIVE)
        if auto_mpi_discovery and not have:
            raise ModuleNotFoundError("No module named 'mpi4py'")
        calls.append({"dist_backend": dist_backend, "auto_mpi_discovery": auto_mpi_discovery,
                      "kwargs": kwargs, "env": {v: os.environ.get(v) for v in FIVE}})

    module = types.ModuleType("deepspeed")
    module.init_distributed = init_distributed
    monkeypatch.setitem(sys.modules, "deepspeed", module)
    return calls


def _scrub(monkeypatch, keep=()):
    """Remove launcher variables from os.environ for the test's duration."""
    prefixes = ("OMPI_", "PMIX_", "PMI_", "MPI_LOCAL", "HYDRA_", "SLURM_", "TORCHELASTIC_",
                "AZ_BATCH", "AZUREML_", "SM_", "PALS_", "FLUX_", "JSM_", "LSB_", "HOROVOD_",
                "PET_", "MV2_", "I_MPI_")
    names = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
             "GROUP_WORLD_SIZE", "DISTENV_LAUNCHER", "DISTENV_NPROC_PER_NODE", "TF_CONFIG",
             "CLUSTER_SPEC", "CLOUD_ML_JOB_ID", "CUDA_VISIBLE_DEVICES"}
    for k in list(os.environ):
        if (k in names or k.startswith(prefixes)) and k not in keep:
            monkeypatch.delenv(k)


def _fixture(kind, name):
    with open(os.path.join(FIXTURES, kind, name)) as f:
        return json.load(f)


def test_import_costs_nothing():
    import subprocess

    code = ("import sys, distenv.deepspeed, distenv.transformers; "
            "bad = [m for m in ('deepspeed', 'torch', 'transformers', 'accelerate') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.path.join(HERE, "..", "..", "src")})
    assert p.returncode == 0, p.stdout + p.stderr


def test_single_python_process_needs_no_mpi4py(monkeypatch, fake_deepspeed, no_gpus):
    """One `python` process: distenv exports the five and turns DeepSpeed's discovery off.
    (That real DeepSpeed goes to mpi4py there without distenv is measured on the real thing:
    tests/e2e/test_deepspeed_e2e.py::test_baseline_single_python_needs_mpi4py_without_distenv.)"""
    _scrub(monkeypatch)
    env = dsa.init_distributed()
    assert env.world_size == 1 and env.rank == 0
    (call,) = fake_deepspeed
    assert call["auto_mpi_discovery"] is False
    assert call["env"]["RANK"] == "0" and call["env"]["WORLD_SIZE"] == "1"
    assert call["env"]["LOCAL_RANK"] == "0" and call["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert 20000 <= int(call["env"]["MASTER_PORT"]) < 30000


OPENMPI_RANK1 = ompi(1, 2, 1, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="1",
                     OMPI_MCA_ess_base_jobid="3351838721", PMIX_RANK="1", PMIX_NAMESPACE="3351838721")


def test_openmpi_rank_exports_five_and_disables_discovery(monkeypatch, fake_deepspeed, no_gpus):
    _scrub(monkeypatch)
    for k, v in OPENMPI_RANK1.items():
        monkeypatch.setenv(k, v)
    env = dsa.init_distributed("gloo", timeout=None)
    (call,) = fake_deepspeed
    assert call == {"dist_backend": "gloo", "auto_mpi_discovery": False, "kwargs": {"timeout": None},
                    "env": {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(env.master_port), "LOCAL_RANK": "1"}}
    # The port is the job's: another Open MPI job id gives (almost surely) another port.
    other = dict(OPENMPI_RANK1, OMPI_MCA_ess_base_jobid="3351904257", PMIX_NAMESPACE="3351904257")
    from distenv import resolve

    assert resolve(other).master_port != env.master_port


@pytest.mark.parametrize("name", ["azureml_mpi_per_process_2x2_rank2.json",
                                  "sagemaker_mpi_2hosts_rank3.json"])
def test_platform_mpi_jobs(name, monkeypatch, fake_deepspeed, fake_gpus):
    """Azure ML and SageMaker MPI jobs: DeepSpeed would patch the environment with its own
    heuristics (fixed ports) or go to mpi4py; distenv exports the resolved five instead."""
    case = _fixture("platforms", name)
    _scrub(monkeypatch)
    fake_gpus(case.get("gpus", 0))
    for k, v in case["env"].items():
        monkeypatch.setenv(k, v)
    env = dsa.init_distributed()
    (call,) = fake_deepspeed
    exp = case["expected"]
    assert call["auto_mpi_discovery"] is False
    assert call["env"]["RANK"] == str(exp["rank"])
    assert call["env"]["WORLD_SIZE"] == str(exp["world_size"])
    assert call["env"]["LOCAL_RANK"] == str(exp["local_rank"])
    assert call["env"]["MASTER_ADDR"] == exp["master_addr"]
    assert call["env"]["MASTER_PORT"] == str(env.master_port)
    # Azure Batch reserves the port in AZ_BATCH_MASTER_NODE: it must not be used.
    assert call["env"]["MASTER_PORT"] != "6105"


def test_deepspeed_launcher_variables(monkeypatch, fake_deepspeed, no_gpus):
    """The DeepSpeed launcher's own LOCAL_SIZE / CROSS_RANK / CROSS_SIZE (2 nodes x 2)."""
    _scrub(monkeypatch)
    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2",
                 "CROSS_RANK": "1", "CROSS_SIZE": "2", "MASTER_ADDR": "worker-0",
                 "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    env = dsa.init_distributed()
    assert (env.launcher, env.node_rank, env.num_nodes, env.local_world_size) == ("deepspeed", 1, 2, 2)
    (call,) = fake_deepspeed
    assert call["env"] == {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "worker-0",
                           "MASTER_PORT": "29500", "LOCAL_RANK": "1"}
    assert os.environ["NODE_RANK"] == "1" and os.environ["LOCAL_WORLD_SIZE"] == "2"


def test_unknown_world_size_names_the_fix(monkeypatch, fake_deepspeed, no_gpus):
    """MPICH with -pmi-port gives no size: an error naming what to set, not a hang."""
    _scrub(monkeypatch)
    monkeypatch.setenv("PMI_ID", "1")
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    with pytest.raises(DistEnvError, match="WORLD_SIZE"):
        dsa.init_distributed()
    assert fake_deepspeed == []


def test_stale_rank_in_the_shell_is_an_error(monkeypatch, fake_deepspeed, no_gpus):
    _scrub(monkeypatch)
    for k, v in OPENMPI_RANK1.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DistEnvError, match="RANK=0"):
        dsa.init_distributed()
    assert fake_deepspeed == []


def test_per_node_launch_is_refused(monkeypatch, fake_deepspeed, no_gpus):
    _scrub(monkeypatch)
    for k, v in slurm_task(1, 2, 0, 1, 2, "n[1-2]", "1(x2)", SLURM_JOB_NUM_NODES="2",
                            SLURM_TASKS_PER_NODE="1(x2)", DISTENV_NPROC_PER_NODE="4").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DistEnvError, match="per-node launch.*DeepSpeed runs one process per "
                                           "worker.*the `deepspeed` launcher"):
        dsa.init_distributed()


def test_auto_mpi_discovery_true_is_refused(fake_deepspeed):
    with pytest.raises(TypeError, match="auto_mpi_discovery"):
        dsa.init_distributed(auto_mpi_discovery=True)


# -- batch sizes ---------------------------------------------------------------------------
def cfg(tbs=None, micro=None, gas=None):
    out = {}
    if tbs is not None:
        out["train_batch_size"] = tbs
    if micro is not None:
        out["train_micro_batch_size_per_gpu"] = micro
    if gas is not None:
        out["gradient_accumulation_steps"] = gas
    return out


@pytest.mark.parametrize("config,world,expected", [
    (cfg(32, 4, 4), 2, (32, 4, 4)),
    (cfg(32, 4), 2, (32, 4, 4)),          # DeepSpeed derives the accumulation
    (cfg(32, None, 2), 2, (32, 8, 2)),    # ... or the micro batch
    (cfg(None, 4, 2), 2, (16, 4, 2)),     # ... or the global batch
    (cfg(None, 4), 3, (12, 4, 1)),
    (cfg(16), 4, (16, 4, 1)),
    (dict(cfg(16, 4, 2), train_batch_size="auto"), 2, (16, 4, 2)),
])
def test_batch_size_completed(config, world, expected):
    got = dsa.check_batch_size(config, world)
    assert (got["train_batch_size"], got["train_micro_batch_size_per_gpu"],
            got["gradient_accumulation_steps"]) == expected
    assert got["data_parallel_size"] == world


def test_batch_size_mismatch_says_which_number_to_change():
    with pytest.raises(DistEnvError) as e:
        dsa.check_batch_size(cfg(32, 4, 2), 2)
    text = str(e.value)
    assert "train_batch_size=32" in text and "= 16" in text
    assert "set train_batch_size to 16" in text
    assert "gradient_accumulation_steps to 4" in text
    assert "\n" not in text


def test_batch_size_mismatch_on_more_processes():
    """The config written for 1 process, run on 2: the global batch doubles unless changed."""
    with pytest.raises(DistEnvError, match="set train_batch_size to 64.*gradient_accumulation_steps to 2"):
        dsa.check_batch_size(cfg(32, 8, 4), 2)


@pytest.mark.parametrize("config,world,match", [
    (cfg(30, 4), 2, "not a multiple of .* = 8.*set train_batch_size to 32"),
    (cfg(30, None, 4), 2, "not a multiple of .* = 8"),
    (cfg(9), 2, "not a multiple of the world size 2"),
    (cfg(None, None, 2), 2, "neither train_batch_size nor"),
    (cfg(8, 0), 2, "train_micro_batch_size_per_gpu=0 is not a positive integer"),
    (cfg(8, True), 2, "not a positive integer"),
])
def test_batch_size_errors(config, world, match):
    with pytest.raises(DistEnvError, match=match):
        dsa.check_batch_size(config, world)


def test_batch_size_data_parallel_size_and_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg(16, 4, 2)))
    got = dsa.check_batch_size(str(path), world_size=8, data_parallel_size=2)
    assert got["data_parallel_size"] == 2


def test_batch_size_world_from_the_launch(monkeypatch, no_gpus):
    _scrub(monkeypatch)
    for k, v in OPENMPI_RANK1.items():
        monkeypatch.setenv(k, v)
    assert dsa.check_batch_size(cfg(None, 4, 1))["train_batch_size"] == 8
