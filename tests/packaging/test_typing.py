"""Typing: `mypy --strict` (pyproject's [tool.mypy]) is clean on the modules listed in TYPED,
and a user's code gets a narrowing path from ``int | None`` to ``int``.

TYPED lists every module of src/distenv (`test_every_module_is_typed` keeps it so): a new module
joins when `mypy --strict` reports nothing in it.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from packaging_util import ROOT, missing

SRC = os.path.join(ROOT, "src", "distenv")

TYPED = (
    "__init__.py",
    "core/_error.py",
    "discovery/handoff.py",
    "discovery/holder.py",
    "__main__.py",
    "_autostart.py",
    "bringup/teardown.py",
    "auto.py",
    "bringup/__init__.py",
    "core/__init__.py",
    "core/checked.py",
    "cli.py",
    "deepspeed.py",
    "discovery/apinfo.py",
    "core/description.py",
    "discovery/__init__.py",
    "discovery/apply.py",
    "discovery/chain.py",
    "discovery/containers.py",
    "discovery/door.py",
    "discovery/services.py",
    "display.py",
    "doctor/__init__.py",
    "doctor/autocheck.py",
    "doctor/checks.py",
    "doctor/network.py",
    "doctor/report.py",
    "doctor/system.py",
    "doctor/versioninfo.py",
    "errors.py",
    "core/export.py",
    "core/fields.py",
    "core/gpus.py",
    "horovod.py",
    "core/hostlist.py",
    "jax.py",
    "keras.py",
    "knobs.py",
    "lightning.py",
    "log.py",
    "nodemap.py",
    "core/placement.py",
    "discovery/pmi.py",
    "discovery/pmix.py",
    "discovery/pmix_relay.py",
    "core/ports.py",
    "bringup/master.py",
    "bringup/preflight.py",
    "core/reading.py",
    "core/redact.py",
    "core/resolver.py",
    "run.py",
    "torch.py",
    "transformers.py",
    "sources/__init__.py",
    "sources/_common.py",
    "sources/azureml.py",
    "sources/deepspeed.py",
    "sources/dstack.py",
    "sources/flux.py",
    "sources/gcp.py",
    "sources/gke_tpu.py",
    "sources/horovodrun.py",
    "sources/ray.py",
    "sources/hydra.py",
    "sources/k8s_job.py",
    "sources/kubeflow.py",
    "sources/lightning_node.py",
    "sources/lsf.py",
    "sources/mvapich2.py",
    "sources/openmpi.py",
    "sources/pals.py",
    "sources/plain.py",
    "sources/sagemaker.py",
    "sources/skypilot.py",
    "sources/single.py",
    "sources/slurm.py",
    "sources/tfconfig.py",
    "sources/torchrun.py",
    "tensorflow/__init__.py",
    "tensorflow/cluster.py",
    "tensorflow/devices.py",
    "tensorflow/keras_check.py",
    "tensorflow/preflight.py",
    "tensorflow/strategies.py",
    "tensorflow/zero_code.py",
)


def mypy(*args, cwd=ROOT):
    if importlib.util.find_spec("mypy") is None:
        missing(f"mypy is not installed in {sys.executable}: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           os.path.join(ROOT, "pyproject.toml"), "--no-error-summary", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MYPYPATH": os.path.join(ROOT, "src")})


def test_typed_modules_pass_mypy_strict():
    paths = [os.path.join(SRC, m) for m in TYPED]
    assert all(os.path.isfile(p) for p in paths), [p for p in paths if not os.path.isfile(p)]
    # follow-imports=silent: the modules they import are analysed (their types count) but only
    # the listed ones must be free of errors.
    p = mypy("--follow-imports=silent", *paths)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout[-5000:] + p.stderr[-2000:]


def test_the_narrowing_path(tmp_path):
    """`env.rank` is `int | None` (a strict checker refuses it as an int); `env.checked().rank`
    and `env.require(...)` values are accepted."""
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent("""
        import distenv

        env = distenv.resolve()
        view = env.checked()
        rank: int = view.rank
        world: int = view.world_size
        addr: str = view.master_addr
        port: int = view.master_port
        (nodes,) = env.require("num_nodes")
        n: int = nodes
        main: bool = view.is_main
        node: "int | None" = view.node_rank
    """))
    p = mypy("--follow-imports=silent", str(good), cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr

    bad = tmp_path / "bad.py"
    bad.write_text("import distenv\n\nrank: int = distenv.resolve().rank\n")
    p = mypy("--follow-imports=silent", str(bad), cwd=str(tmp_path))
    assert p.returncode == 1 and 'bad.py:3: error: Incompatible types in assignment (expression has ' \
        'type "int | None", variable has type "int")' in p.stdout, p.stdout + p.stderr


def test_every_module_is_typed():
    """src/distenv is clean under mypy --strict as a whole: no module is left out of TYPED."""
    found = sorted(os.path.relpath(os.path.join(d, f), SRC).replace(os.sep, "/")
                   for d, _, files in os.walk(SRC) for f in files if f.endswith(".py"))
    assert sorted(TYPED) == found
