"""Zero code for TensorFlow: the plain tf-keras script tests/e2e/scripts/plain_keras.py
(examples/keras_mwms.py with its distenv lines removed: a bare
`tf.distribute.MultiWorkerMirroredStrategy()`, no distenv import) trains as one 2-worker
cluster with DISTENV_AUTO=1 under real launchers -- distenv.auto calls
distenv.tensorflow.patch() when the script imports TensorFlow.

Checked on every run: both workers report num_replicas_in_sync == 2 and tasks worker 0 and 1,
identical weights, the very weights (and loss) examples/keras_mwms.py (distenv lines present,
no DISTENV_AUTO) reaches under the same launcher, and distenv.auto and distenv.tensorflow in
the workers' sys.modules. Launchers: Open MPI 4 `mpirun -np 2` (one node), torchrun
`--standalone --nproc-per-node 2`, srun on two network-namespace nodes (SLURM's node list
gives the hosts), Open MPI on two namespace nodes with DISTENV_HOSTFILE. Plus: the baseline
(the same script without DISTENV_AUTO builds a one-replica strategy in every process -- the bug),
Open MPI across nodes without a host file stops at the strategy naming DISTENV_HOSTFILE
instead of guessing, and Keras 3 as tf.keras is refused at the strategy with the fix.

Ranks run .venvs/tensorflow/bin/python (or $DISTENV_PY_TENSORFLOW) with distenv installed with
its distenv_auto.pth; every run is under `timeout -k 5 N` (TensorFlow catches SIGTERM). A
missing interpreter, launcher or cluster skips (a failure under DISTENV_REQUIRE_LAUNCHERS=1).
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

import tfhvd_support as S

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(1800)]

_ic = S.integration_fixtures()
root, slurm1, cluster, slurm2 = _ic.root, _ic.slurm1, _ic.cluster, _ic.slurm2

PLAIN = S.HERE / "scripts" / "plain_keras.py"
EXAMPLE = S.EXAMPLES / "keras_mwms.py"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1",
         "DISTENV_TIMEOUT": "120"}
AUTO = {**QUIET, "DISTENV_AUTO": "1"}
OFF = {**QUIET, "DISTENV_AUTO": "0"}


@pytest.fixture(scope="module")
def tf_python():
    py = S.venv_python("tensorflow", ["tensorflow", "tf_keras", "distenv.tensorflow"])
    probe = subprocess.run(
        [py, "-c", "import site, os, sys; sys.exit(not any(os.path.exists(os.path.join(d, "
                   "'distenv_auto.pth')) for d in site.getsitepackages()))"],
        capture_output=True, timeout=120, env=S.harness.clean_env(), cwd="/")
    if probe.returncode != 0:
        S.skip(f"{py} lacks distenv_auto.pth: {py} -m pip install --no-deps -e {S.REPO}")
    return py


def workdir() -> Path:
    """A directory every "node" sees (they share the mount namespace) and can write."""
    base = S.harness.run_dir() / "e2e-tf-zero-code"
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    work = Path(tempfile.mkdtemp(prefix="run.", dir=base))
    os.chmod(work, 0o755)
    return work


def run_script(lay, tf_python, script, env, timeout=S.TIMEOUT) -> "tuple[S.Run, Path]":
    out = workdir() / "out"
    run = S.launch(lay, [tf_python, script, "--out", out], "DISTENV-KERAS", env, timeout=timeout)
    run.records.sort(key=lambda r: r.get("task_id", r.get("worker")) or 0)
    return run, out


_REFERENCE: dict = {}


def reference(lay, tf_python, extra_env=None) -> dict:
    """examples/keras_mwms.py (distenv.tensorflow.strategy()) under the same launcher."""
    if lay.name not in _REFERENCE:
        run, _out = run_script(lay, tf_python, EXAMPLE, {**OFF, **(extra_env or {})})
        assert run.rc == 0 and len(run.records) == 2, run.explain()
        a, b = run.records
        assert a["replicas"] == b["replicas"] == 2 and a["weights"] == b["weights"], run.explain()
        _REFERENCE[lay.name] = {"weights": a["weights"], "loss": a["loss"], "elapsed": run.elapsed}
    return _REFERENCE[lay.name]


def check_plain(run: S.Run, out: Path, ref: dict) -> None:
    assert run.rc == 0 and len(run.records) == 2, run.explain()
    a, b = run.records
    assert [(r["task_type"], r["task_id"]) for r in run.records] == [("worker", 0), ("worker", 1)], \
        run.explain()
    assert a["replicas"] == b["replicas"] == 2, run.explain()
    assert a["strategy"] == b["strategy"] == "CollectiveAllReduceStrategy"
    assert a["keras"].startswith("tf_keras")
    assert a["weights"] == b["weights"], "workers diverged: " + run.explain()
    assert a["values"] == b["values"]
    # The plain script under DISTENV_AUTO reaches exactly what the distenv example does.
    assert a["weights"] == ref["weights"] and a["loss"] == ref["loss"], (a["loss"], ref, run.explain())
    for r in run.records:
        assert {"distenv.auto", "distenv.tensorflow"} <= set(r["distenv_modules"]), r["distenv_modules"]
    assert (out / "model.h5").is_file()  # tf-keras: the chief writes it


def stopped(run: S.Run, message: str) -> str:
    """No worker trained; the error is on every rank that got as far as the strategy (mpirun
    aborts the job when the first rank exits, so a slower rank may be killed before it).
    Returns the first rank's error."""
    assert run.rc not in (0, 124, 137) and run.records == [], run.explain()
    errors = [err for _out, err in run.files.values() if message in err]
    assert errors, run.explain()
    assert run.elapsed < 150, run.explain()  # no rank waited for a peer
    return errors[0]


def fit_plain(request, tf_python, name, extra_env=None):
    lay = S.layout(name)
    S.need(request, lay)
    ref = reference(lay, tf_python, extra_env)
    run, out = run_script(lay, tf_python, PLAIN, {**AUTO, **(extra_env or {})})
    check_plain(run, out, ref)
    print(f"\n[{name}: plain + DISTENV_AUTO {run.elapsed:.1f} s, example {ref['elapsed']:.1f} s]", end=" ")
    return run


def test_baseline_without_distenv_every_process_trains_alone(request, tf_python):
    """The bug distenv fixes: mpirun -np 2 without DISTENV_AUTO builds two 1-replica strategies.
    (Both processes then act as the chief and race on the same checkpoint files: `fit` ends
    in an HDF5 lock or a missing backup file now and then, so only the strategy is checked.)"""
    lay = S.layout("openmpi4")
    S.need(request, lay)
    run = S.launch(lay, [tf_python, PLAIN, "--out", workdir() / "out"], "DISTENV-KERAS-STRATEGY", OFF)
    assert len(run.records) == 2, run.explain()
    for r in run.records:
        assert r["replicas"] == 1 and r["task_type"] is None, run.explain()
    for out, _err in run.files.values():
        for r in S.records(out, "DISTENV-KERAS"):
            assert r["distenv_modules"] == [] and r["replicas"] == 1, r


def test_openmpi_one_node(request, tf_python):
    fit_plain(request, tf_python, "openmpi4")


def test_torchrun(request, tf_python):
    fit_plain(request, tf_python, "torchrun")


@pytest.mark.cluster
def test_srun_two_nodes(request, tf_python):
    """srun -N2 --ntasks-per-node=1 on node1 and node2: hosts from SLURM_STEP_NODELIST."""
    run = fit_plain(request, tf_python, "slurm-2nodes")
    assert len({r["task_id"] for r in run.records}) == 2


@pytest.mark.cluster
def test_openmpi_two_nodes_with_nothing_set(request, tf_python):
    """Open MPI's variables do not say which host runs each rank; its PMIx server does: asked
    when the script builds MultiWorkerMirroredStrategy() (not when it imports TensorFlow),
    every worker's host from it, nothing set by hand (the next test: without the service,
    the same job stops)."""
    run = fit_plain(request, tf_python, "openmpi4-2nodes")
    assert sorted(r["task_id"] for r in run.records) == [0, 1]
    for r in run.records:
        assert "distenv.discovery.pmix" in r["distenv_modules"], r["distenv_modules"]


@pytest.mark.cluster
def test_openmpi_two_nodes_without_hosts_stops_at_the_strategy(request, tf_python):
    """Open MPI's PMIx server not asked (DISTENV_PMIX=0) and no host file: no guess, a
    DistEnvError at MultiWorkerMirroredStrategy() naming DISTENV_HOSTFILE (and mpirun -x), on
    both ranks."""
    lay = S.layout("openmpi4-2nodes")
    S.need(request, lay)
    # DISTENV_TRACEBACK=1: the traceback shows where it was raised (else the one line)
    run, out = run_script(lay, tf_python, PLAIN, {**AUTO, "DISTENV_TRACEBACK": "1", "DISTENV_PMIX": "0"},
                          timeout=200)
    err = stopped(run, "DistEnvError: cannot build TF_CONFIG: openmpi runs 2 worker(s) on 2 node(s)")
    assert "DISTENV_HOSTFILE" in err and "mpirun -x DISTENV_HOSTFILE" in err
    assert "MultiWorkerMirroredStrategy()" in err  # raised where the script builds it
    assert not (out / "model.h5").exists()


@pytest.mark.cluster
def test_openmpi_two_nodes_with_a_host_file(request, tf_python):
    """The fix the error names: DISTENV_HOSTFILE (mpirun's own host file format)."""
    lay = S.layout("openmpi4-2nodes")
    S.need(request, lay)
    hosts = workdir() / "hosts"
    hosts.write_text("node1 slots=1\nnode2 slots=1\n")
    os.chmod(hosts, 0o644)
    run = fit_plain(request, tf_python, "openmpi4-2nodes", {"DISTENV_HOSTFILE": str(hosts)})
    assert len({r["task_id"] for r in run.records}) == 2


def test_keras3_is_refused_at_the_strategy_with_the_fix(request, tf_python):
    """tf.keras = Keras 3 (TF_USE_LEGACY_KERAS=0): Keras 3's fit fails under MWMS with a
    bare ValueError about PerReplica; patch() stops both ranks at the strategy, before the
    cluster starts, naming the fix."""
    lay = S.layout("openmpi4")
    S.need(request, lay)
    run, out = run_script(lay, tf_python, PLAIN, {**AUTO, "TF_USE_LEGACY_KERAS": "0"}, timeout=200)
    err = stopped(run, "distenv: error: Keras 3 with MultiWorkerMirroredStrategy")
    assert "TF_USE_LEGACY_KERAS=1" in err and "DISTENV_ALLOW_KERAS3=1" in err
    assert not (out / "model.h5").exists()
