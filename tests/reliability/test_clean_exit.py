"""A job that trained correctly exits 0 on every process, on every path distenv starts or patches.

The abort this guards against (issue 16): ``terminate called without an active exception``,
SIGABRT, exit 134, at interpreter exit after a correct run. Cause, from cores: gloo's worker
thread destroys a finished collective's tensors after Python began finalizing and dies
taking the GIL (pytorch/pytorch#190489; see src/distenv/bringup/teardown.py). It is a race that a
loaded machine loses now and then (5 of 31 runs of the Transformers script in the issue), so
every run here goes through exit_scripts/late_workers.py, which makes torch's threads late
on purpose: without distenv's exit handler 10 of 18 jobs aborted, on 6 of the 8 paths. The
same race also *deadlocked* a finished Transformers job under mpirun (seen in CI; py-spy:
``~ProcessGroupGloo`` on the main thread, holding the GIL, waiting for a gloo worker that
waits for the GIL) when the script's own ``destroy_process_group()`` left the DDP model the
group's last reference: the ``*-destroy`` paths take that shape, which without distenv's
handling ends badly (`test_the_race_is_provoked` checks that it does on every run of this
module, so these tests can fail).

Each path is a 2-process job of the smallest script that takes that path
(exit_scripts/torch_job.py, lightning_job.py); every process -- ranks, and torchrun's agent
in a per-node launch -- runs under exit_scripts/status.sh, which keeps its exit status, and
the test checks every one of them (a launcher reports the first failure at best), plus the
ranks' all-reduce and all-gather results.

    DISTENV_EXIT_RUNS=30 pytest tests/reliability/test_clean_exit.py   # the full count

CI runs DISTENV_EXIT_RUNS (default 1) jobs per path, two at a time; the figures for 30 runs
per path are in docs/guarantees.md.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import jobs
from jobs import harness

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(1800)]

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "exit_scripts"
STATUS = str(SCRIPTS / "status.sh")
LATE = str(SCRIPTS / "late_workers.py")
REPO = HERE.parents[1]
RUNS = int(os.environ.get("DISTENV_EXIT_RUNS", "1"))
PARALLEL = int(os.environ.get("DISTENV_EXIT_PARALLEL", "2"))
BASE_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false", "DISTENV_AUTO": "0"}


def _python(venv: str) -> "str | None":
    if venv == "torch":
        return jobs.PY
    py = os.environ.get(f"DISTENV_PY_{venv.upper()}") or str(REPO / ".venvs" / venv / "bin"
                                                              / "python")
    return py if os.access(py, os.X_OK) else None


def _distenv(py: str) -> str:
    return str(Path(py).parent / "distenv")


# path: (layout, venv, command builder(py, status_dir) -> argv of each launched process, env)
def _rank(py, d, *args):
    return [STATUS, d, py, LATE, *args]


PATHS = {
    # distenv.torch.init_process_group()
    "torch-mpirun": (lambda: jobs.local("openmpi4", 2), "torch",
                     lambda py, d: _rank(py, d, str(SCRIPTS / "torch_job.py"), "distenv"), {}),
    "torch-torchrun": (lambda: jobs.torchrun(2), "torch",
                       lambda py, d: _rank(py, d, str(SCRIPTS / "torch_job.py"), "distenv"), {}),
    # distenv run: a plain torch script (init_process_group("gloo") of its own)
    "run-mpirun": (lambda: jobs.local("openmpi4", 2), "torch",
                   lambda py, d: [STATUS, d, _distenv(py), "run", "--", py, LATE,
                                  str(SCRIPTS / "torch_job.py"), "plain"], {}),
    # distenv run, per-node: one process per node starts 2 workers through torch's launcher
    "run-per-node": (lambda: jobs.local("openmpi4", 1, "--bind-to", "none"), "torch",
                     lambda py, d: [STATUS, d, _distenv(py), "run", "--nproc-per-node", "2", "--",
                                    *_rank(py, d, str(SCRIPTS / "torch_job.py"), "plain")], {}),
    # DISTENV_AUTO=1: Accelerate's PartialState starts the group, as the Trainer does
    "auto-mpirun": (lambda: jobs.local("openmpi4", 2), "transformers5",
                    lambda py, d: _rank(py, d, str(SCRIPTS / "torch_job.py"), "accelerate"),
                    {"DISTENV_AUTO": "1"}),
    "auto-torchrun": (lambda: jobs.torchrun(2), "transformers5",
                      lambda py, d: _rank(py, d, str(SCRIPTS / "torch_job.py"), "accelerate"),
                      {"DISTENV_AUTO": "1"}),
    # distenv.transformers.patch(), then Accelerate
    "transformers-patch": (lambda: jobs.local("openmpi4", 2), "transformers5",
                           lambda py, d: _rank(py, d, str(SCRIPTS / "torch_job.py"), "patch"), {}),
    # the script's own destroy_process_group(), then its DDP model freed (the Transformers
    # example's shape): the last reference to the group goes on the main thread
    "torch-destroy": (lambda: jobs.local("openmpi4", 2), "torch",
                      lambda py, d: _rank(py, d, str(SCRIPTS / "torch_job.py"), "distenv", "destroy"),
                      {}),
    "patch-destroy": (lambda: jobs.local("openmpi4", 2), "transformers5",
                      lambda py, d: _rank(py, d, str(SCRIPTS / "torch_job.py"), "patch", "destroy"),
                      {}),
    # a Lightning Trainer with DistenvEnvironment
    "lightning-mpirun": (lambda: jobs.local("openmpi4", 2), "lightning",
                         lambda py, d: _rank(py, d, str(SCRIPTS / "lightning_job.py")), {}),
}


def run_once(name: str, env_extra: "dict | None" = None, timeout: float = 300) -> dict:
    """One job of path `name`: {"rc", "statuses": [(status, command)], "records", "text"}."""
    make_layout, venv, build, env = PATHS[name]
    py = _python(venv)
    d = tempfile.mkdtemp(prefix=f"exit-{name}.")
    os.chmod(d, 0o777)
    try:
        res = harness.launch(make_layout(), build(py, d), timeout=timeout, check=False,
                             env={**BASE_ENV, **env, **(env_extra or {})})
        statuses = []
        for f in sorted(Path(d).glob("*.rc")):
            code, _, cmd = f.read_text().strip().partition(" ")
            statuses.append((int(code), cmd))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    records, texts = [], [f"launcher exit {res['rc']}: {res['output'][-1500:]}"]
    for fname, (out, err) in sorted(res["files"].items()):
        records.extend(harness.parse_records(out))
        texts.append(f"--- {fname} stdout: {out[-1000:]}\n--- stderr: {err[-2500:]}")
    return {"rc": res["rc"], "statuses": statuses, "records": records, "text": "\n".join(texts),
            "timed_out": res["rc"] in (124, 137) and res["elapsed"] >= timeout - 1}


def _skip_unless_runnable(request, name: str) -> None:
    make_layout, venv, _build, _env = PATHS[name]
    why = jobs.unavailable(request, make_layout())
    if why is None and _python(venv) is None:
        why = f"no {venv} interpreter (integrations/frameworks/{venv}.sh)"
    if why:
        pytest.skip(why)


def _processes(name: str) -> int:
    return 3 if name == "run-per-node" else 2  # the per-node process (torchrun's agent) too


@pytest.mark.parametrize("name", list(PATHS))
def test_every_process_exits_0(request, name):
    if RUNS < 1:
        pytest.skip("DISTENV_EXIT_RUNS=0")
    _skip_unless_runnable(request, name)
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        results = list(pool.map(lambda _i: run_once(name), range(RUNS)))
    bad = []
    for i, r in enumerate(results):
        ok = (r["rc"] == 0 and len(r["statuses"]) == _processes(name)
              and all(code == 0 for code, _cmd in r["statuses"]))
        ranks = sorted(rec["rank"] for rec in r["records"])
        right = ranks == [0, 1] and all(rec["sum"] == [3.0] * 4 and rec["ranks"] == [0, 1]
                                        and rec["world_size"] == 2 for rec in r["records"])
        if "checksum" in (r["records"] or [{}])[0]:
            right = right and len({rec["checksum"] for rec in r["records"]}) == 1
        if not (ok and right):
            bad.append(f"run {i + 1}: statuses {[c for c, _ in r['statuses']]}, launcher "
                       f"{r['rc']}, ranks {ranks}\n{r['text']}")
    assert not bad, f"{name}: {len(bad)} of {RUNS} runs not clean:\n" + "\n".join(bad[:2])


#: Jobs test_the_race_is_provoked may start to see the race end one badly. Measured without
#: the handling: 8 of 8 jobs at load 1-3, 4 of 8 at load 4-5 (other work on the 2 cores), so
#: at p = 0.5 all 8 ending well by chance has probability 1/256.
RACE_TRIES = int(os.environ.get("DISTENV_RACE_TRIES", "8"))


def test_the_race_is_provoked(request):
    """Without distenv's handling (DISTENV_TEARDOWN=0) late_workers.py makes the race end a
    finished job badly, so the tests above, which pass only with it, can fail. The shape that
    provokes it (the script's own destroy_process_group(), then the DDP model freed) ends in
    the abort or, on a machine where the worker comes later still, in the deadlock of issue 16
    (a hard 90 s timeout). Jobs run one after the other until one ends badly (RACE_TRIES at
    most); each must first have finished its work on both ranks with the right results: a job
    that never ran -- a launcher that failed, no status files -- proves nothing and fails."""
    _skip_unless_runnable(request, "torch-destroy")
    seen = []
    for _ in range(RACE_TRIES):
        r = run_once("torch-destroy", {"DISTENV_TEARDOWN": "0"}, timeout=90)
        codes = [c for c, _cmd in r["statuses"]]
        finished = sorted(rec["rank"] for rec in r["records"]) == [0, 1] and all(
            rec["sum"] == [3.0] * 4 and rec["ranks"] == [0, 1] for rec in r["records"])
        assert finished, f"the job did not get to its end, so its exit says nothing: {codes}\n{r['text']}"
        aborted = 134 in codes and "terminate called without an active exception" in r["text"]
        # a hang: the hard timeout ended it, so a process never wrote its status
        hung = r["timed_out"] and codes.count(0) < 2
        if aborted or hung:
            return
        seen.append(f"statuses {codes}, launcher {r['rc']}")
    raise AssertionError(f"no abort and no hang in {RACE_TRIES} jobs without distenv's handling: "
                         f"{seen}\nlast job:\n{r['text']}")


def test_e2e_harness_sees_a_process_that_aborts_after_its_output():
    """tests/e2e (framework_runs.fatal, launch_pool) fail a job whose process died of a fatal
    signal even when the launcher exited 0 (Lightning's workers are not the launcher's): a
    real process that writes its result and then aborts, as the exit race did."""
    import subprocess

    import framework_runs

    p = subprocess.run([jobs.PY, "-c", "import os; print('DISTENV-PROBE {}', flush=True); os.abort()"],
                       capture_output=True, text=True, timeout=60,
                       env={**harness.clean_env(), "PYTHONFAULTHANDLER": "1"})
    assert p.returncode == -6 and "DISTENV-PROBE" in p.stdout
    assert framework_runs.fatal({"rank.1": (p.stdout, p.stderr), "rank.0": ("ok", "")}) == ["rank.1"]
