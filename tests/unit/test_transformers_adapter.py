"""distenv.transformers: fast tests.

The first part needs neither Transformers nor Accelerate (the project venv). The second
uses the real Transformers and Accelerate, with torch.distributed's process-group calls
replaced by a stand-in (no rendezvous, no second process); it skips where they are not
installed -- tests/e2e/test_transformers_e2e.py runs this file in .venvs/transformers4 and
.venvs/transformers5 with DISTENV_REQUIRE_FRAMEWORK=transformers, which turns those skips
into failures. The real multi-process runs are in tests/e2e.
"""
import os
import sys

import pytest

import distenv.transformers as dt
from distenv import DistEnvError, resolve
from envs import ompi, slurm_task

OPENMPI = ompi(1, 2, 1, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="1",
               OMPI_MCA_ess_base_jobid="3351838721", PMIX_RANK="1", PMIX_NAMESPACE="3351838721")
PREFIXES = ("OMPI_", "PMIX_", "PMI_", "MPI_LOCAL", "HYDRA_", "SLURM_", "TORCHELASTIC_",
            "AZ_BATCH", "AZUREML_", "SM_", "PALS_", "FLUX_", "JSM_", "LSB_", "HOROVOD_", "PET_",
            "MV2_", "I_MPI_", "ACCELERATE_")
NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
         "MASTER_ADDR", "MASTER_PORT", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
         "GROUP_WORLD_SIZE", "DISTENV_LAUNCHER", "DISTENV_NPROC_PER_NODE", "TF_CONFIG",
         "CLUSTER_SPEC", "CLOUD_ML_JOB_ID", "CUDA_VISIBLE_DEVICES", "DISTENV_AUTO"}
REQUIRE = os.environ.get("DISTENV_REQUIRE_FRAMEWORK", "") == "transformers"


@pytest.fixture(autouse=True)
def clean(no_gpus):
    """Each test starts without launcher variables and ends with os.environ, sys.argv and
    Accelerate's singletons as they were."""
    saved_env, saved_argv = dict(os.environ), list(sys.argv)
    for k in list(os.environ):
        if k in NAMES or k.startswith(PREFIXES):
            del os.environ[k]
    yield
    dt.unpatch()
    if "accelerate.state" in sys.modules:
        sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.clear()
    os.environ.update(saved_env)
    sys.argv[:] = saved_argv


def launch(env=OPENMPI):
    os.environ.update(env)


# -- without the frameworks ------------------------------------------------------------------
def test_single_process_exports_nothing():
    env = dt.patch(argv=["x"])
    assert env.world_size == 1
    assert "RANK" not in os.environ and "MASTER_ADDR" not in os.environ


def test_openmpi_rank_exports_the_torch_variables():
    launch()
    env = dt.patch(argv=["x"])
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("1", "2", "1")
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    assert os.environ["MASTER_PORT"] == str(env.master_port) != "29500"
    assert dt.resolved() == env


def test_patch_is_idempotent():
    launch()
    first = dict(os.environ)
    a, b = dt.patch(argv=["x"]), dt.patch(argv=["x"])
    assert a == b and dict(os.environ) == {**first, **{k: os.environ[k] for k in os.environ}}


def test_per_node_launch_is_refused():
    launch(slurm_task(1, 2, 0, 1, 2, "n[1-2]", "1(x2)", SLURM_JOB_NUM_NODES="2",
                      SLURM_TASKS_PER_NODE="1(x2)", DISTENV_NPROC_PER_NODE="4"))
    with pytest.raises(DistEnvError, match="one process per worker"):
        dt.patch(argv=["x"])


@pytest.mark.parametrize("argv,fixed", [
    (["t.py", "--local_rank=", "--x"], ["t.py", "--local_rank=1", "--x"]),   # Azure, unset
    (["t.py", "--local-rank=-1"], ["t.py", "--local-rank=1"]),
    (["t.py", "--local_rank", "--x", "1"], ["t.py", "--local_rank", "1", "--x", "1"]),
    (["t.py", "--local_rank"], ["t.py", "--local_rank", "1"]),
    (["t.py", "--local_rank", "1"], ["t.py", "--local_rank", "1"]),
    (["t.py", "--local-rank=1", "--lr", "3"], ["t.py", "--local-rank=1", "--lr", "3"]),
    (["t.py", "--local_ranks=0"], ["t.py", "--local_ranks=0"]),              # not ours
])
def test_local_rank_argv_forms(argv, fixed):
    launch()
    env = resolve()
    assert dt.fix_local_rank_argv(env, list(argv)) == fixed


@pytest.mark.parametrize("argv", [["t.py", "--local_rank=0"], ["t.py", "--local-rank", "0"]])
def test_local_rank_argv_contradiction(argv):
    launch()
    with pytest.raises(DistEnvError, match="contradicts the launch .local_rank=1"):
        dt.patch(argv=argv)


def test_local_rank_argv_garbage():
    launch()
    with pytest.raises(DistEnvError, match="not an integer"):
        dt.patch(argv=["t.py", "--local_rank=$LOCAL_RANK"])


def test_patch_fixes_sys_argv_in_place():
    launch()
    sys.argv[:] = ["train.py", "--local_rank="]
    dt.patch()
    assert sys.argv == ["train.py", "--local_rank=1"]


class FakeState:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_check_state_accepts_the_launch_and_refuses_an_undistributed_state():
    launch()
    env = resolve()
    dt.check_state(FakeState(num_processes=2, process_index=1, local_process_index=1), env)
    with pytest.raises(DistEnvError, match=r"undistributed: num_processes=1 \(launch: 2\)"):
        dt.check_state(FakeState(num_processes=1, process_index=0, local_process_index=0,
                                 distributed_type="DistributedType.NO"), env)


def test_describe_one_line():
    launch()
    dt.patch(argv=["x"])
    line = dt.describe()
    assert "openmpi launch, rank 1/2" in line and "\n" not in line


# -- with the real Transformers and Accelerate -------------------------------------------------
def need(module):
    try:
        return __import__(module)
    except ImportError:
        if REQUIRE:
            pytest.fail(f"{module} is not importable by {sys.executable} "
                        "(DISTENV_REQUIRE_FRAMEWORK=transformers)")
        pytest.skip(f"{module} is not installed for {sys.executable} "
                    "(bash integrations/frameworks/transformers5.sh)")


@pytest.fixture
def fake_process_group(monkeypatch):
    """torch.distributed without a rendezvous: init_process_group records its call and the
    group then reports the environment's RANK / WORLD_SIZE, as gloo would."""
    need("accelerate")
    torch = need("torch")
    calls = []
    state = {"up": False}

    def init_process_group(backend=None, **kwargs):
        calls.append({"backend": backend, **kwargs})
        state["up"] = True

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(torch.distributed, "get_world_size",
                        lambda group=None: int(os.environ["WORLD_SIZE"]))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: int(os.environ["RANK"]))
    return calls


def training_args(tmp_path, **kw):
    need("accelerate")
    transformers = need("transformers")
    return transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", **kw)


def test_baseline_cpu_rank_trains_alone_without_distenv(tmp_path, fake_process_group):
    """Under mpirun, without use_cpu=True and without distenv: world size 1, rank 0."""
    launch()
    args = training_args(tmp_path)
    assert (args.world_size, args.process_index) == (1, 0)
    assert args.parallel_mode.value == "not_parallel"
    assert fake_process_group == []


def test_cpu_rank_distributed_with_patch(tmp_path, fake_process_group):
    launch()
    dt.patch(argv=["x"])
    assert os.environ["ACCELERATE_USE_CPU"] == "true"
    args = training_args(tmp_path)
    assert (args.world_size, args.process_index, args.local_process_index) == (2, 1, 1)
    assert args.parallel_mode.value == "distributed"
    assert args.device.type == "cpu"
    (call,) = fake_process_group
    assert call["backend"] == "gloo" and call["world_size"] == 2 and call["rank"] == 1
    assert os.environ["MASTER_PORT"] != "29500"


def test_patch_after_importing_transformers_and_before(tmp_path, fake_process_group):
    need("transformers")
    import transformers.training_args  # noqa: F401  (already imported: patch() still works)

    launch()
    dt.patch(argv=["x"])
    dt.patch(argv=["x"])  # idempotent: one hook
    from accelerate.state import PartialState

    assert PartialState.__init__.__wrapped__.__name__ == "__init__"
    assert not getattr(PartialState.__init__.__wrapped__, "_distenv", False)
    assert training_args(tmp_path).world_size == 2


def test_hook_forces_cpu_for_plain_accelerate(fake_process_group):
    """A script that builds PartialState() itself (no TrainingArguments) without cpu=True."""
    need("accelerate")
    launch()
    dt.patch(argv=["x"])
    del os.environ["ACCELERATE_USE_CPU"]  # PartialState does not read it; the hook decides
    from accelerate.state import PartialState

    state = PartialState()
    assert (state.num_processes, state.process_index) == (2, 1)
    assert str(state.distributed_type).endswith("MULTI_CPU")


def test_state_built_before_patch_is_an_error(fake_process_group):
    need("accelerate")
    launch()
    from accelerate.state import PartialState

    PartialState()  # undistributed: no LOCAL_RANK, no cpu=True
    with pytest.raises(DistEnvError, match="was built before distenv.transformers.patch"):
        dt.patch(argv=["x"])


def test_state_built_wrong_after_patch_is_an_error(monkeypatch, fake_process_group):
    """A process group that disagrees with the launch (here: size 1) fails loudly."""
    need("accelerate")
    import torch

    launch()
    dt.patch(argv=["x"])
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 1)
    from accelerate.state import PartialState

    with pytest.raises(DistEnvError, match=r"num_processes=1 \(launch: 2\)"):
        PartialState()


def _accelerate_sees_gpus(monkeypatch):
    """Make Accelerate's own GPU check answer "CUDA", through the function its
    `PartialState._prepare_backend` consults (read from its source): Accelerate >= 1.16 asks
    `get_torch_accelerator_backend()`, older ones `torch.cuda.is_available()`. An Accelerate
    that asks neither fails here, naming what to update, instead of passing untested."""
    import inspect

    import accelerate
    import accelerate.state as state
    import torch

    source = inspect.getsource(state.PartialState._prepare_backend)
    if "get_torch_accelerator_backend(" in source:
        monkeypatch.setattr(state, "get_torch_accelerator_backend",
                            lambda check_available=True: ("cuda", torch.cuda))
    elif "torch.cuda.is_available()" in source:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    else:
        pytest.fail(f"Accelerate {accelerate.__version__}'s _prepare_backend consults neither "
                    "get_torch_accelerator_backend() nor torch.cuda.is_available(): teach "
                    "_accelerate_sees_gpus what it asks now")


def test_baseline_gpu_and_mpirun_undistributed(monkeypatch):
    """With GPUs, Accelerate goes distributed only when LOCAL_RANK is set: under mpirun it
    is not, so every rank trains alone. After patch() it is (Accelerate's own choice)."""
    need("accelerate")
    import accelerate
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    _accelerate_sees_gpus(monkeypatch)
    # the stand-in GPUs convince this Accelerate: with LOCAL_RANK (torchrun's) it is multi-GPU
    monkeypatch.setenv("LOCAL_RANK", "0")
    got = PartialState._prepare_backend(dt._Probe(), False, False, None)
    assert got == ("nccl", DistributedType.MULTI_GPU), (
        f"Accelerate {accelerate.__version__} no longer sees the stand-in GPUs ({got}): "
        "update _accelerate_sees_gpus")
    monkeypatch.delenv("LOCAL_RANK")
    launch()
    _backend, kind = PartialState._prepare_backend(dt._Probe(), False, False, None)
    assert kind == DistributedType.NO
    dt.patch(argv=["x"])
    backend, kind = PartialState._prepare_backend(dt._Probe(), False, False, None)
    assert (backend, kind) == ("nccl", DistributedType.MULTI_GPU)
    assert "ACCELERATE_USE_CPU" not in os.environ  # a GPU machine keeps its GPUs


def test_baseline_azure_local_rank_argv(tmp_path, fake_process_group):
    """Azure's `--local_rank=$LOCAL_RANK` with LOCAL_RANK unset reaches the script as
    `--local_rank=`: HfArgumentParser rejects it; after patch() it parses."""
    need("accelerate")
    transformers = need("transformers")
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    base = ["--output_dir", str(tmp_path), "--report_to", "none"]
    launch()
    argv = ["train.py", *base, "--local_rank="]
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(args=argv[1:])
    dt.patch(argv=argv)
    (args,) = parser.parse_args_into_dataclasses(args=argv[1:])
    assert args.local_rank == 1 and args.local_process_index == 1


@pytest.mark.parametrize("form", [["--local_rank=1"], ["--local-rank=1"], ["--local_rank", "1"],
                                  ["--local-rank", "1"]])
def test_hf_argument_parser_accepts_both_forms(tmp_path, form, fake_process_group):
    need("accelerate")
    transformers = need("transformers")
    launch()
    argv = ["train.py", "--output_dir", str(tmp_path), "--report_to", "none", *form]
    dt.patch(argv=argv)
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(args=argv[1:])
    assert args.local_rank == 1 and args.world_size == 2


def test_callback_logs_once_and_checks_world_size(tmp_path, fake_process_group, capsys, caplog):
    need("accelerate")
    need("transformers")
    import logging

    from transformers import TrainerControl, TrainerState

    launch(dict(OPENMPI, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0", PMIX_RANK="0"))
    dt.patch(argv=["x"])
    args = training_args(tmp_path)
    cb = dt.DistEnvCallback(stdout=True)
    state = TrainerState()
    state.is_world_process_zero = True
    with caplog.at_level(logging.DEBUG, logger="distenv"):
        cb.on_train_begin(args, state, TrainerControl())
        cb.on_train_begin(args, state, TrainerControl())
    out = capsys.readouterr().out
    assert out.count("distenv: openmpi launch, rank 0/2") == 1
    assert "Trainer: world_size=2, process_index=0, parallel_mode=distributed" in out
    # the normal status line is information, not a warning (issue 30, item 12)
    logged = [r for r in caplog.records if "openmpi launch, rank 0/2" in r.getMessage()]
    assert [(r.name, r.levelname) for r in logged] == [("distenv.transformers", "INFO")]

    class Wrong:
        world_size = 1

    with pytest.raises(DistEnvError, match="world_size=1 but openmpi started 2"):
        cb.on_train_begin(Wrong(), state, TrainerControl())
