"""Running a framework example as 2 ranks of a real launcher, for tests/e2e.

    py = venv_python("transformers5")                   # skips with the reason if missing
    run = launch_example(py, "openmpi4", "examples/hf_trainer.py", ["--samples", "32"])
    run.records                                         # one dict per rank (DISTENV-PROBE lines)

Ranks run the framework's own interpreter: ``$DISTENV_PY_<NAME>`` (tox sets it) or
``.venvs/<name>/bin/python`` (integrations/frameworks/<name>.sh creates it). Launches go
through tests/integration/harness.py: a clean launcher environment, each rank's output in
its own file, and a hard ``timeout -k 5 N`` around every run (DISTENV_E2E_TIMEOUT, default
300 s: this 2-core machine is shared, and importing a framework there can take a minute).
"""
from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

import harness  # noqa: E402
from harness import ONE, Layout, one_node, plain  # noqa: E402

TIMEOUT = float(os.environ.get("DISTENV_E2E_TIMEOUT", "300"))
EXAMPLES = REPO / "examples"

#: Every run: one thread per rank (2 ranks share 2 cores), no distenv.auto, no hub access.
BASE_ENV = {"OMP_NUM_THREADS": "1", "DISTENV_AUTO": "0", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
#: What a process that died of a fatal signal leaves on its stderr: Python's faulthandler
#: (PYTHONFAULTHANDLER=1: SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) and C++'s std::terminate.
FATAL = ("Fatal Python error", "terminate called")


def fatal(files: dict) -> "list[str]":
    """The rank files whose stderr shows a process that died of a fatal signal -- also a
    process the launcher did not start (Lightning's workers), whose status it never sees."""
    return [name for name, (_out, err) in sorted(files.items()) if any(m in err for m in FATAL)]


def venv_python(name: str) -> str:
    """The interpreter of framework venv `name`; skip (with how to make it) when absent."""
    var = f"DISTENV_PY_{name.upper()}"
    py = os.environ.get(var) or str(REPO / ".venvs" / name / "bin" / "python")
    if not os.access(py, os.X_OK):
        pytest.skip(f"no {name} interpreter: {py} is missing (create it with "
                    f"`bash integrations/frameworks/{name}.sh`, or set {var})")
    return py


def launcher_binary(py: str, name: str) -> str:
    """A console script of the venv holding `py` (torchrun, deepspeed)."""
    return str(Path(py).parent / name)


def layout(py: str, name: str) -> Layout:
    """Two ranks on this host. Names: openmpi4, openmpi5, mpich4, intelmpi, slurm,
    torchrun (the venv's own, --standalone), torch-launch (legacy
    `python -m torch.distributed.launch`, which passes --local-rank=N)."""
    if name in ("openmpi4", "openmpi5", "mpich4", "mpich5", "intelmpi"):
        family = {"openmpi4": "openmpi", "openmpi5": "openmpi"}.get(name, "hydra")
        expect = {"mpich4": "mpich", "mpich5": "mpich", "intelmpi": "intelmpi"}.get(name, "openmpi")
        return Layout(name, "np2", "local", 2, family, expect, one_node(name, 2), ONE)
    if name == "slurm":
        return Layout("slurm", "srun-n2", "slurm1", 2, "slurm", "slurm", plain("srun", "-n2"), ONE)
    if name == "torchrun":
        return Layout("torchrun", "nproc2", "local", 2, "torchrun", "torchrun",
                      plain(launcher_binary(py, "torchrun"), "--standalone", "--nproc-per-node", "2",
                            "--no-python"), ONE, torch=True)
    if name == "torch-launch":
        return Layout("torchrun", "launch-nproc2", "local", 2, "torchrun", "torchrun",
                      _legacy_launch(py), ONE, torch=True)
    raise KeyError(name)


def _legacy_launch(py: str):
    """`python -m torch.distributed.launch` runs `python -u SCRIPT ARGS --local-rank=N`: the
    harness's per-rank shell wrapper becomes per_rank.py, the script it execs."""
    def build(cmd, extra):
        # harness._per_rank: ["/bin/sh", "-c", WRAPPER, OUT_DIR, python, script, args...]
        if len(cmd) < 6 or cmd[0] != "/bin/sh" or cmd[4] != py:
            raise AssertionError(f"unexpected per-rank command from the harness: {cmd[:6]}")
        return [py, "-m", "torch.distributed.launch", "--standalone", "--nproc-per-node", "2",
                *extra, str(HERE / "per_rank.py"), cmd[3], *cmd[5:]]
    return build


def need_launcher(request, lay: Layout) -> None:
    """Skip with the reason when the launcher is not installed; bring up SLURM if needed."""
    if lay.launcher != "torchrun":
        why = harness.missing(lay)
        if why:
            pytest.skip(f"{lay.name}: {why}")
    if lay.needs == "slurm1":
        try:
            request.getfixturevalue("slurm1")
        except pytest.FixtureLookupError:
            pytest.skip("no slurm1 fixture (tests/conftest.py shares tests/integration's)")


@dataclass
class Run:
    name: str
    rc: int
    records: list
    files: dict
    output: str
    elapsed: float
    argv: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and len(self.records) == 2

    def stderr(self) -> str:
        return "\n".join(err for _out, err in self.files.values())

    def explain(self) -> str:
        lines = [f"{self.name}: exit {self.rc} after {self.elapsed:.1f} s, "
                 f"{len(self.records)} record(s)", f"launcher output: {self.output[-1500:]}"]
        for fname, (out, err) in self.files.items():
            lines.append(f"--- {fname} stdout:\n{out[-1500:]}\n--- stderr:\n{err[-2500:]}")
        return "\n".join(lines)


def launch_example(py: str, lay: Layout, script: str, args=(), *, env=None,
                   extra=(), timeout: float = TIMEOUT) -> Run:
    """Run examples/<script> --report as every rank of `lay`; never raises on failure."""
    cmd = [py, str(EXAMPLES / script), "--report", *args]
    result = harness.launch(lay, cmd, extra=list(extra), env={**BASE_ENV, **(env or {})},
                            timeout=timeout, check=False)
    records = []
    for _name, (out, _err) in sorted(result["files"].items()):
        records.extend(harness.parse_records(out))
    records.sort(key=lambda r: (r.get("process_index", r.get("rank", 0)) or 0))
    # Every process's end counts, not only the launcher's status: one that died of a fatal
    # signal after its output (an abort at exit) makes the run fail (134) even if the
    # launcher did not see it.
    dead = fatal(result["files"])
    rc = 134 if result["rc"] == 0 and dead else result["rc"]
    output = result["output"] + (f"\nfatal signal in: {', '.join(dead)}" if dead else "")
    return Run(lay.name, rc, records, result["files"], output, result["elapsed"], result["argv"])


def run_python(py: str, script: str, args=(), *, env=None, timeout: float = TIMEOUT) -> Run:
    """One plain `python examples/<script> --report` process (no launcher)."""
    t0 = time.monotonic()
    full = harness.clean_env({**BASE_ENV, **(env or {})})
    argv = ["timeout", "-k", "5", str(int(timeout)), py, str(EXAMPLES / script), "--report", *args]
    try:
        p = subprocess.run(argv, env=full, capture_output=True, text=True, cwd="/tmp",
                           timeout=timeout + 20, stdin=subprocess.DEVNULL)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, "", f"python-side timeout: {exc}"
    return Run("python", rc, harness.parse_records(out), {"python": (out, err)}, "",
               time.monotonic() - t0, argv)


def concurrently(*calls):
    """Run the zero-argument callables at the same time; their results, in order."""
    results = [None] * len(calls)
    errors = []

    def work(i, call):
        try:
            results[i] = call()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def steps(samples: int, batch: int, world: int) -> int:
    return math.ceil(samples / (batch * world))


class Cache:
    """Session-wide results of expensive runs, so a baseline test and the test of the fixed
    behaviour share one launch (whichever runs first pays)."""

    def __init__(self):
        self._values = {}
        self._lock = threading.Lock()

    def get(self, key, make):
        with self._lock:
            if key not in self._values:
                self._values[key] = make()
            return self._values[key]


CACHE = Cache()
