"""Run a test module's launcher jobs concurrently, so framework e2e tests fit their budget.

Importing torch takes 3-8 s per process here and Lightning more, so every multi-process
run costs tens of seconds; run one after the other they would take many minutes. Tests
therefore declare the jobs they need up front, and the first test that asks for a result
starts *all* jobs wanted by the selected tests (a few at a time, longest first) in
background threads; each test then waits only for its own job.

    JOBS = {"ompi-np2": Job(layout=np("openmpi4", 2), cmd=[...], python="torch")}

    @pytest.mark.jobs("ompi-np2")
    def test_x(jobs):                  # fixture: see e.g. tests/e2e/test_torch_e2e.py
        r = jobs.result("ompi-np2")    # skips with the reason if the job cannot run here
        assert r.rc == 0

Every job runs through tests/integration/harness.py (`harness.launch`): a clean launcher
environment, each rank's output in a file of its own, and a hard `timeout -k 5 N` (sbatch:
polled, then scancel'ed), so nothing is left running and no job can hang a test.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

import harness  # noqa: E402
from harness import Layout  # noqa: E402

#: What a process that died of a fatal signal leaves on its stderr: Python's faulthandler
#: (PYTHONFAULTHANDLER=1: SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) and C++'s std::terminate.
FATAL = ("Fatal Python error", "terminate called")
#: Jobs running at once. Each is 1-4 processes on a 2-core machine: more only thrashes.
WORKERS = int(os.environ.get("DISTENV_E2E_JOBS", "3"))


# -- interpreters --------------------------------------------------------------------------------
def interpreter(name: str) -> "tuple[str | None, str]":
    """(python for a framework's ranks, or None, and why). CONTRIBUTING: $DISTENV_PY_<NAME>,
    else .venvs/<name>/bin/python; torch also runs in the project venv."""
    var = f"DISTENV_PY_{name.upper()}"
    given = os.environ.get(var)
    if given:
        return (given, var) if os.access(given, os.X_OK) else (None, f"{var}={given} is not executable")
    if name == "torch":
        return sys.executable, "the project venv (pytest's interpreter)"
    path = REPO / ".venvs" / name / "bin" / "python"
    if os.access(path, os.X_OK):
        return str(path), str(path)
    return None, (f"no {name} interpreter: set {var} or run "
                  f"integrations/frameworks/{name}.sh (creates {path})")


_probes: dict = {}
_probe_lock = threading.Lock()


def importable(python: str, modules: Sequence[str]) -> "str | None":
    """None when `python` imports every module (and distenv from outside the repo), else why not."""
    key = (python, tuple(modules))
    with _probe_lock:
        if key not in _probes:
            # find_spec, not import: importing Lightning costs as much as a job here.
            code = ("import importlib.util, sys, distenv; missing = [m for m in sys.argv[1:] "
                    "if importlib.util.find_spec(m) is None]; print(' '.join(missing)); "
                    "sys.exit(1 if missing else 0)")
            p = subprocess.run(["timeout", "-k", "5", "60", python, "-c", code, *modules],
                               cwd="/", capture_output=True, text=True, env=harness.clean_env())
            _probes[key] = None if p.returncode == 0 else (
                f"{python} cannot import {p.stdout.strip() or 'distenv'} (install: "
                f"integrations/frameworks/*.sh): {p.stderr.strip()[-300:]}")
        return _probes[key]


# -- layouts beyond harness.LAYOUTS ---------------------------------------------------------------
def local(launcher: str, n: int, *flags: str, shape: "str | None" = None) -> Layout:
    """`n` ranks of `launcher` on this host."""
    fam = {"openmpi4": "openmpi", "openmpi5": "openmpi", "mpich4": "hydra", "mpich5": "hydra",
           "intelmpi": "hydra", "slurm": "slurm", "torchrun": "torchrun"}[launcher]
    needs = "slurm1" if launcher == "slurm" else "local"
    return Layout(launcher, shape or f"np{n}", needs, n, fam, launcher,
                  harness.one_node(launcher, n, *flags), (harness.LOCALHOST,),
                  torch=launcher == "torchrun")


def single() -> Layout:
    """One process, no launcher (``python script.py``)."""
    return Layout("none", "single", "local", 1, "none", "none", harness.plain(),
                  (harness.LOCALHOST,))


def openmpi4_nodes(per_node: int, *flags: str, shape: "str | None" = None) -> Layout:
    """Open MPI 4 across the two namespace nodes, `per_node` ranks each, mpirun inside node1."""
    n = 2 * per_node
    return Layout("openmpi4", shape or f"2x{per_node}", "cluster", n, "openmpi", "openmpi",
                  harness.on_node1(harness.OMPI4, "--allow-run-as-root", "-np", str(n), "-H",
                                   f"node1:{per_node},node2:{per_node}", "--mca", "plm_rsh_agent",
                                   harness.FAKESSH, "--mca", "oob_tcp_if_include", harness.NET,
                                   "--mca", "btl_tcp_if_include", harness.NET, *flags),
                  harness.NODES)


def srun_nodes(per_node: int, *flags: str) -> Layout:
    """Two-node SLURM, `per_node` tasks on each node."""
    return Layout("slurm", f"N2-2x{per_node}", "slurm2", 2 * per_node, "slurm", "slurm",
                  harness.plain("srun", "-N2", f"--ntasks-per-node={per_node}", *flags),
                  harness.NODES)


# -- jobs -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    layout: Layout
    args: "tuple[str, ...]"          # script and its arguments (the interpreter is prepended)
    python: str = "torch"            # which framework interpreter runs the ranks
    modules: "tuple[str, ...]" = ("torch",)  # it must import these
    env: "dict[str, str]" = field(default_factory=dict)
    extra: "tuple[str, ...]" = ()    # launcher arguments before the command
    timeout: float = 240
    cost: float = 1.0                # rough relative duration: longest start first


@dataclass
class Result:
    name: str
    rc: int
    elapsed: float
    records: list          # every JSON object printed on a line of its own, by any rank
    output: str            # every rank's stdout+stderr and the launcher's, for messages
    argv: list

    def describe(self) -> str:
        return (f"job {self.name}: exit {self.rc} after {self.elapsed:.1f} s\n"
                f"argv: {' '.join(map(str, self.argv))}\n{self.output[-6000:]}")


class Pool:
    def __init__(self):
        self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="e2e-job")
        self._futures: "dict[str, Future]" = {}
        self._skips: "dict[str, str]" = {}
        self._lock = threading.Lock()

    def prepare(self, name: str, job: Job, request) -> "str | None":
        """Bring up what the job needs; None when it can run, else the reason it cannot
        (a fixture that failed, rather than skipped, gives a reason starting with FAIL)."""
        import pytest

        lay = job.layout
        if lay.needs != "local":
            try:
                request.getfixturevalue(lay.needs)
            except pytest.skip.Exception as exc:
                return f"{lay.needs} is not available: {exc}"
            except pytest.fail.Exception as exc:
                return f"FAIL {lay.needs} could not be started: {exc}"
        why = harness.missing(lay) if lay.launcher != "none" else None
        if why:
            return f"{lay.name}: {why}"
        python, where = interpreter(job.python)
        if python is None:
            return where
        return importable(python, job.modules)

    def submit(self, jobs: "dict[str, Job]", request) -> None:
        """Start every job in `jobs` not started yet (longest first)."""
        with self._lock:
            todo = [(n, j) for n, j in jobs.items() if n not in self._futures and n not in self._skips]
            for name, job in sorted(todo, key=lambda nj: -nj[1].cost):
                why = self.prepare(name, job, request)
                if why:
                    self._skips[name] = why
                    continue
                self._futures[name] = self._executor.submit(self._run, name, job)

    def _run(self, name: str, job: Job) -> Result:
        python, _ = interpreter(job.python)
        cmd = [python, *job.args]
        env = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **job.env}
        t0 = time.monotonic()
        if job.layout.launcher == "none":
            return self._run_single(name, job, cmd, env)
        try:
            res = harness.launch(job.layout, cmd, extra=job.extra, env=env,
                                 timeout=job.timeout, check=False)
        except Exception as exc:  # the launcher could not even start
            return Result(name, -1, time.monotonic() - t0, [], repr(exc), cmd)
        texts = [res["output"]]
        records = harness.json_lines(res["output"]) if job.layout.batch is not None else []
        for fname, (out, err) in sorted(res["files"].items()):
            records.extend(harness.json_lines(out))
            texts.append(f"--- rank file {fname} stdout:\n{out[-4000:]}\n--- stderr:\n{err[-4000:]}")
        # Every process's end counts: one that died of a fatal signal after its output (an
        # abort at exit; Lightning's workers, which the launcher never sees) fails the job.
        dead = [f for f, (_out, err) in sorted(res["files"].items()) if any(m in err for m in FATAL)]
        if dead:
            texts.insert(0, f"fatal signal in: {', '.join(dead)}")
        rc = 134 if res["rc"] == 0 and dead else res["rc"]
        return Result(name, rc, res["elapsed"], records, "\n".join(texts), res["argv"])

    @staticmethod
    def _run_single(name: str, job: Job, cmd: "list[str]", env: dict) -> Result:
        """No launcher: the command itself, in a clean environment, under the same timeout."""
        argv = ["timeout", "-k", "5", str(int(job.timeout)), *cmd]
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, env=harness.clean_env(env), cwd="/", capture_output=True,
                               text=True, timeout=job.timeout + 20, stdin=subprocess.DEVNULL)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = 124, "", f"python-side timeout: {exc}"
        return Result(name, rc, time.monotonic() - t0, harness.json_lines(out),
                      f"--- stdout:\n{out[-4000:]}\n--- stderr:\n{err[-6000:]}", argv)

    def result(self, name: str, timeout: float = 900) -> Result:
        import pytest

        if name in self._skips:
            why = self._skips[name]
            if why.startswith("FAIL "):
                pytest.fail(why[5:])
            pytest.skip(why)
        if name not in self._futures:
            raise KeyError(f"job {name} was never submitted (mark the test with jobs({name!r}))")
        return self._futures[name].result(timeout=timeout)

    def shutdown(self):
        self._executor.shutdown(wait=True)


POOL = Pool()


def wanted(session) -> "dict[str, Job]":
    """The jobs the selected tests ask for with @pytest.mark.jobs(...), from the JOBS dict of
    each test's module (job names are unique across modules)."""
    out = {}
    for item in session.items:
        catalog = getattr(getattr(item, "module", None), "JOBS", {})
        for mark in item.iter_markers("jobs"):
            for name in mark.args:
                if name not in catalog:
                    raise KeyError(f"{item.nodeid}: no job {name!r} in its module's JOBS")
                out[name] = catalog[name]
    return out


try:
    import pytest as _pytest

    @_pytest.fixture(scope="session")
    def jobs(request):
        """The pool, with every job of the selected tests started (see the module doc)."""
        POOL.submit(wanted(request.session), request)
        return POOL
except ImportError:  # pragma: no cover - used outside pytest
    pass
