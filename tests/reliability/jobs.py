"""Real launcher jobs for the reliability tests: layouts, readiness, and running many at once.

Every job goes through tests/integration/harness.py (`harness.launch`): a clean launcher
environment, each rank's stdout in a file of its own, and a hard ``timeout -k 5 N``, so no
job can hang a test or outlive it. Ranks run tests/reliability/rank_job.py with the project
venv's python (it has torch 2.13).

    lay = local("openmpi4", 2)
    why = unavailable(request, lay)          # None, or why it cannot run (the test skips)
    results = run_all([Spec("a", lay, "allreduce", env={...}), ...], workers=4)
"""
from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

import harness  # noqa: E402
from harness import Layout  # noqa: E402

RANK_JOB = str(HERE / "rank_job.py")
PY = sys.executable
FAMILY = {"openmpi4": "openmpi", "openmpi5": "openmpi", "mpich4": "hydra", "mpich5": "hydra",
          "intelmpi": "hydra", "slurm": "slurm", "torchrun": "torchrun"}
#: distenv's `launcher` field under each
EXPECT = {"openmpi4": "openmpi", "openmpi5": "openmpi", "mpich4": "mpich", "mpich5": "mpich",
          "intelmpi": "intelmpi", "slurm": "slurm", "torchrun": "torchrun"}


def local(launcher: str, n: int, *flags: str) -> Layout:
    """`n` ranks of `launcher` on this host: the launcher table's argv (Open MPI
    --oversubscribe, torchrun --standalone: a free port per run), SLURM with --oversubscribe
    so concurrent jobs share the one-node SLURM's 4 CPUs instead of queueing."""
    if launcher == "slurm":
        argv = harness.plain("srun", "--oversubscribe", "-n", str(n), *flags)
    else:
        argv = harness.one_node(launcher, n, *flags)
    return Layout(launcher, f"np{n}", "slurm1" if launcher == "slurm" else "local", n,
                  FAMILY[launcher], EXPECT[launcher], argv, (harness.LOCALHOST,),
                  torch=launcher == "torchrun")


def torchrun(n: int, *flags: str) -> Layout:
    """torchrun --standalone with extra flags (e.g. --max-restarts 1)."""
    return Layout("torchrun", f"nproc{n}", "local", n, "torchrun", "torchrun",
                  harness.plain(str(REPO / ".venv" / "bin" / "torchrun"), "--standalone",
                                "--nproc-per-node", str(n), *flags, "--no-python"),
                  (harness.LOCALHOST,), torch=True)


_torch_ok: dict = {}
_lock = threading.Lock()


def unavailable(request, lay: Layout) -> "str | None":
    """Bring up what `lay` needs (the slurm1 session fixture); None when it can run, else why
    it cannot (the caller skips with it; DISTENV_REQUIRE_LAUNCHERS=1 makes that a failure)."""
    import subprocess

    import pytest

    if lay.needs != "local":
        try:
            request.getfixturevalue(lay.needs)
        except pytest.skip.Exception as exc:
            return f"{lay.needs} is not available: {exc}"
    why = harness.missing(lay)
    if why:
        return f"{lay.name}: {why}"
    with _lock:
        if "torch" not in _torch_ok:
            p = subprocess.run(["timeout", "-k", "5", "120", PY, "-c",
                                "import distenv, torch.distributed as d; assert d.is_gloo_available()"],
                               cwd="/", capture_output=True, text=True, env=harness.clean_env())
            _torch_ok["torch"] = None if p.returncode == 0 else (
                f"{PY} cannot import distenv and torch with gloo (pip install -e . "
                f"torch==2.13.0): {p.stderr[-300:]}")
    return _torch_ok["torch"]


@dataclass
class Spec:
    name: str
    layout: Layout
    mode: str = "allreduce"
    env: "dict[str, str]" = field(default_factory=dict)
    timeout: float = 150


@dataclass
class Run:
    name: str
    rc: int
    elapsed: float
    records: list
    output: str
    argv: list

    @property
    def by_rank(self) -> dict:
        return {r.get("rank"): r for r in self.records}

    def describe(self) -> str:
        return (f"{self.name}: exit {self.rc} after {self.elapsed:.1f} s, "
                f"{len(self.records)} record(s)\nargv: {' '.join(map(str, self.argv))}\n"
                f"{self.output[-6000:]}")


def run(spec: Spec, start: "threading.Barrier | None" = None) -> Run:
    if start is not None:
        start.wait()
    env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **spec.env}
    t0 = time.monotonic()
    try:
        res = harness.launch(spec.layout, [PY, RANK_JOB, spec.mode], env=env,
                             timeout=spec.timeout, check=False)
    except Exception as exc:  # noqa: BLE001 - the launcher could not even start
        return Run(spec.name, -1, time.monotonic() - t0, [], repr(exc), [])
    records, texts = [], [res["output"][-3000:]]
    for fname, (out, err) in sorted(res["files"].items()):
        found = harness.parse_records(out)
        records.extend(found)
        texts.append(f"--- rank file {fname}: {out[-2500:]}\n--- stderr: {err[-2500:]}")
    return Run(spec.name, res["rc"], res["elapsed"], records, "\n".join(texts), res["argv"])


def run_all(specs: "list[Spec]", workers: "int | None" = None, together: bool = False) -> "dict[str, Run]":
    """Run `specs` in threads (`workers` at a time, default all); `together`: every job is
    released at the same instant (a barrier), so they really overlap."""
    workers = workers or len(specs)
    barrier = threading.Barrier(len(specs)) if together and workers >= len(specs) else None
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rel-job") as pool:
        futures = {s.name: pool.submit(run, s, barrier) for s in specs}
        return {name: f.result() for name, f in futures.items()}


_HELD: list = []


def free_ports(n: int) -> "list[int]":
    """n distinct ports (for MPICH, which reveals no job id), held by this process until it
    exits: bound with SO_REUSEADDR and never listening, so no other process can take one
    before its job's rank 0 binds it -- torch's TCPStore binds with SO_REUSEADDR too and
    listens beside the held socket."""
    import socket

    ports = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        _HELD.append(s)
        ports.append(s.getsockname()[1])
    return ports


def cpu_seconds() -> float:
    """CPU seconds used by finished children of this process (ranks, launchers)."""
    t = os.times()
    return t.children_user + t.children_system
