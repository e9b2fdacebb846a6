"""DeepSpeed under real launchers, in .venvs/deepspeed (mpi4py NOT installed):
examples/deepspeed_train.py with distenv.deepspeed.init_distributed().

- Open MPI, SLURM srun, torchrun: the engine reports world size 2, ranks 0 and 1, and both
  ranks end with the same weights.
- Baselines from issue 5, each failing without distenv and passing with it:
  DeepSpeed's own init_distributed() goes to mpi4py under mpirun, and even for one plain
  `python` process.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from framework_runs import CACHE, launch_example, layout, need_launcher, run_python, venv_python

SCRIPT = "deepspeed_train.py"
ARGS = ["--steps", "6"]


@pytest.fixture(scope="module")
def py():
    return venv_python("deepspeed")


@pytest.fixture(scope="module")
def ds_env(py):
    """TORCH_EXTENSIONS_DIR: the CPU op integrations/frameworks/deepspeed.sh built once."""
    cache = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path(py).parents[1] / "torch-extensions")
    return {"TORCH_EXTENSIONS_DIR": cache}


def distenv_run(request, py, env, launcher):
    lay = layout(py, launcher)
    need_launcher(request, lay)
    return CACHE.get(("deepspeed", launcher, "distenv"),
                     lambda: launch_example(py, lay, SCRIPT, ARGS, env=env))


def assert_engine_distributed(run):
    assert run.ok, run.explain()
    assert [r["rank"] for r in run.records] == [0, 1], run.explain()
    assert {r["world_size"] for r in run.records} == {2}, run.explain()
    assert {r["dp_world_size"] for r in run.records} == {2}, run.explain()
    assert {r["backend"] for r in run.records} == {"gloo"}, run.explain()
    assert len({r["checksum"] for r in run.records}) == 1, "ranks disagree on weights"
    assert {r["steps"] for r in run.records} == {6}


def test_mpi4py_is_not_installed(py):
    import subprocess

    p = subprocess.run([py, "-c", "import mpi4py"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "mpi4py" in p.stderr, "this venv must not have mpi4py"


@pytest.mark.parametrize("launcher", ["openmpi4", "slurm", "torchrun"])
def test_engine_world_size_2_and_ranks_agree(request, py, ds_env, launcher):
    run = distenv_run(request, py, ds_env, launcher)
    assert_engine_distributed(run)
    if launcher != "torchrun":  # torchrun --standalone picks its own free port
        assert 20000 <= int(run.records[0]["master_port"]) < 30000, "port derived from the job id"


def test_baseline_mpirun_needs_mpi4py_without_distenv(request, py, ds_env):
    """Without distenv, deepspeed.init_distributed() under mpirun imports mpi4py."""
    lay = layout(py, "openmpi4")
    need_launcher(request, lay)
    bare = launch_example(py, lay, SCRIPT, ARGS + ["--no-distenv"], env=ds_env)
    assert not bare.ok and "No module named 'mpi4py'" in bare.stderr(), bare.explain()
    assert_engine_distributed(distenv_run(request, py, ds_env, "openmpi4"))


def test_baseline_single_python_needs_mpi4py_without_distenv(py, ds_env):
    """Even one plain `python train.py` fails in DeepSpeed's discovery without distenv."""
    bare = run_python(py, SCRIPT, ["--steps", "2", "--no-distenv"], env=ds_env)
    assert bare.rc != 0 and "No module named 'mpi4py'" in bare.stderr(), bare.explain()
    fixed = run_python(py, SCRIPT, ["--steps", "2"], env=ds_env)
    assert fixed.rc == 0 and len(fixed.records) == 1, fixed.explain()
    assert fixed.records[0]["world_size"] == 1 and fixed.records[0]["steps"] == 2
