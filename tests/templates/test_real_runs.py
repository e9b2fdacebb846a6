"""The HPC templates, run for real with the tiny example
(integrations/templates-test/allreduce.py: distenv.resolve(), export(), gloo
init_process_group, all_reduce, one JSON record per rank):

    SLURM     per_process.sbatch, per_node.sbatch    on the two-node SLURM (as written:
              2 nodes) and on the one-node SLURM (sbatch --nodes=1)
    PBS       per_process.pbs and per_node.pbs, each with MPICH 4 and with Open MPI 4
              (the scripts branch on the two), on the two network-namespace nodes, with a PBS_NODEFILE as PBS writes it (a node once
              per mpiprocs) and mpiexec reaching node2 through the cluster's fake ssh
    MPIJob    the Kubeflow MPIJob launcher's command (Open MPI 4), on the same two nodes,
              with the host file mpi-operator writes

Every run is submitted or started at once (they overlap: the machine has two cores and the
budget is minutes), each under a hard timeout; each test then checks its own run: as many
records as the world size, ranks 0..N-1, every rank's all_reduce = N(N+1)/2, the hosts
and the launch mode the template promises. A run whose launcher or cluster is missing is
skipped with the reason (a failure under DISTENV_REQUIRE_LAUNCHERS=1).
"""
from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import harness
from integrations import launchers as table
from template_catalog import REPO

pytestmark = [pytest.mark.launcher]

PROBE = "integrations/templates-test/allreduce.py"
SLURM_T = REPO / "integrations" / "slurm" / "templates"
PBS_T = REPO / "integrations" / "pbs"
NET = harness.NET
TIMEOUT = 300          # seconds, per run (hard: timeout -k / scancel)
RDZV_TIMEOUT = 150     # the example's rendezvous timeout


@dataclass(frozen=True)
class Run:
    name: str
    needs: str                    # slurm1, slurm2, cluster
    world: int
    per_host: "dict[str, int]"    # expected ranks per host
    launcher: str                 # distenv's `launcher` in the workers
    via_distenv_run: bool
    mpi: str = ""                 # integrations/launchers.py name, for cluster runs
    sbatch: "tuple[str, ...]" = ()  # template, then sbatch options
    note: str = ""


LOCAL = socket.gethostname()
JOB_BASE = random.randrange(1000, 9900)   # fake PBS job numbers: JOB_BASE + run index
RUNS = {r.name: r for r in [
    Run("slurm2-per-process", "slurm2", 4, {"node1": 2, "node2": 2}, "slurm", False,
        sbatch=("per_process.sbatch",)),
    Run("slurm2-per-node", "slurm2", 4, {"node1": 2, "node2": 2}, "torchrun", True,
        sbatch=("per_node.sbatch",)),
    Run("slurm1-per-process", "slurm1", 2, {LOCAL: 2}, "slurm", False,
        sbatch=("per_process.sbatch", "--nodes=1")),
    Run("slurm1-per-node", "slurm1", 2, {LOCAL: 2}, "torchrun", True,
        sbatch=("per_node.sbatch", "--nodes=1")),
    Run("pbs-per-process-mpich4", "cluster", 4, {"node1": 2, "node2": 2}, "mpich", False,
        mpi="mpich4"),
    Run("pbs-per-node-openmpi4", "cluster", 4, {"node1": 2, "node2": 2}, "torchrun", True,
        mpi="openmpi4"),
    # The other MPI family for each script (the scripts branch on Open MPI vs Hydra).
    Run("pbs-per-process-openmpi4", "cluster", 4, {"node1": 2, "node2": 2}, "openmpi", False,
        mpi="openmpi4"),
    Run("pbs-per-node-mpich4", "cluster", 4, {"node1": 2, "node2": 2}, "torchrun", True,
        mpi="mpich4"),
    Run("mpijob-openmpi4", "cluster", 4, {"node1": 2, "node2": 2}, "openmpi", False,
        mpi="openmpi4"),
]}


# -- starting the runs -------------------------------------------------------------------------
def _workdir(name: str) -> Path:
    base = harness.run_dir() / "itest"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"template-{name}.", dir=base))
    os.chmod(work, 0o755)
    (work / "out").mkdir()
    return work


def _base_env(extra: dict) -> dict:
    """This process's environment minus every launcher variable, with this interpreter's
    bin directory (python, distenv) first on PATH, as a user's activated venv would be."""
    venv_bin = str(Path(sys.executable).parent)
    env = harness.clean_env(extra)
    env["PATH"] = os.pathsep.join([p for p in (extra.get("PATH"), venv_bin, os.environ.get("PATH", ""))
                                   if p])
    return env


def _probe(work: Path) -> "list[str]":
    return ["python", PROBE, "--out", str(work / "out"), "--timeout", str(RDZV_TIMEOUT)]


def _sbatch(run: Run, conf: str, work: Path):
    template, *options = run.sbatch
    env = _base_env({"SLURM_CONF": conf})
    sub = subprocess.run(["timeout", "-k", "5", "60", "sbatch", "--parsable", *options,
                          "-J", f"tmpl-{run.name}", "-o", str(work / "job.out"),
                          str(SLURM_T / template), *_probe(work)],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=90)
    if sub.returncode != 0:
        return sub.returncode, f"sbatch failed: {sub.stdout}{sub.stderr}"
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + TIMEOUT
    state, q = "?", None
    while time.monotonic() < deadline:
        q = subprocess.run(["scontrol", "show", "job", "-o", job], env=env,
                           capture_output=True, text=True, timeout=30)
        m = re.search(r"\bJobState=(\S+)", q.stdout)
        state = m.group(1) if m else ("GONE" if q.returncode else "?")
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "?"):
            break
        time.sleep(0.5)
    else:
        subprocess.run(["scancel", job], env=env, timeout=30)
        return 124, f"job {job} still {state} after {TIMEOUT} s: scancel'ed"
    out = (work / "job.out").read_text(errors="replace") if (work / "job.out").exists() else ""
    m = re.search(r"\bExitCode=(\d+):(\d+)", q.stdout)
    rc = int(m.group(1)) if m else (0 if state == "COMPLETED" else 1)
    return (rc if state == "COMPLETED" or rc else 1), f"job {job} {state}\n{out}"


def _mpi_bin(work: Path, name: str, as_name: str) -> dict:
    """A directory with `as_name` running launcher `name` (Hydra finds its proxy next to the
    real binary, so a wrapper script, not a symlink), and the launcher's environment."""
    entry = table.get(name)
    bindir = work / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / as_name
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(entry.binary())} "$@"\n')
    wrapper.chmod(0o755)
    env = dict(entry.env(os.environ))
    env["PATH"] = str(bindir)
    if entry.family == "openmpi":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_plm_rsh_agent=harness.FAKESSH,
                   OMPI_MCA_oob_tcp_if_include=NET, OMPI_MCA_btl_tcp_if_include=NET)
    else:
        env.update(HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=harness.FAKESSH)
    return env


def _on_node1(argv, env, work: Path):
    """argv inside node1 (the job's first node, where PBS runs the script), hard timeout."""
    cmd = ["timeout", "-k", "5", str(TIMEOUT), harness.ON_NODE, "node1", *argv]
    try:
        p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                           timeout=TIMEOUT + 30, stdin=subprocess.DEVNULL, start_new_session=True)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        return 124, f"python-side timeout: {exc}"


def _pbs(run: Run, work: Path):
    per_node = "per-node" in run.name
    nodefile = work / "PBS_NODEFILE"
    # As PBS writes it: each node once per mpiprocs (2 for per-process, 1 for per-node).
    nodefile.write_text("node1\nnode2\n" if per_node else "node1\nnode1\nnode2\nnode2\n")
    env = _base_env(_mpi_bin(work, run.mpi, "mpiexec"))
    _own_ompi_session_dir(env, work)
    # The scripts derive MASTER_PORT from the job number: distinct for runs that overlap.
    env.update(PBS_NODEFILE=str(nodefile), PBS_JOBID=f"{JOB_BASE + list(RUNS).index(run.name)}.pbs-test",
               PBS_O_WORKDIR=str(REPO), TRAIN=shlex.join(_probe(work)))
    if per_node:
        env["NCPUS"] = "2"     # ncpus of the chunk: two workers per node
    template = PBS_T / ("per_node.pbs" if per_node else "per_process.pbs")
    return _on_node1(["bash", str(template)], env, work)


def _mpijob(run: Run, work: Path):
    """The MPIJob launcher container's command, run where mpirun reaches both nodes."""
    import yaml

    (doc,) = yaml.safe_load_all((REPO / "integrations" / "kubeflow" / "mpijob.yaml").read_text())
    (launcher,) = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert launcher["command"] == ["bash", "-c"]
    script = launcher["args"][0]
    example = "python examples/pytorch_ddp.py"
    assert script.endswith(example), script
    script = script[: -len(example)] + shlex.join(_probe(work))
    hostfile = work / "hostfile"
    slots = doc["spec"]["slotsPerWorker"]
    hostfile.write_text(f"node1 slots={slots}\nnode2 slots={slots}\n")  # as mpi-operator writes it
    env = _base_env(_mpi_bin(work, run.mpi, "mpirun"))
    _own_ompi_session_dir(env, work)
    env["OMPI_MCA_orte_default_hostfile"] = str(hostfile)
    return _on_node1(["bash", "-c", script], env, work)


def _execute(run: Run, conf: "str | None"):
    work = _workdir(run.name)
    t0 = time.monotonic()
    try:
        if run.sbatch:
            rc, output = _sbatch(run, conf, work)
        elif run.name.startswith("pbs-"):
            rc, output = _pbs(run, work)
        else:
            rc, output = _mpijob(run, work)
    except Exception:  # noqa: BLE001 - reported by this run's test, not the others'
        import traceback

        rc, output = 1, f"starting the run failed:\n{traceback.format_exc()}"
    records = []
    for f in sorted((work / "out").glob("*.json")):
        try:
            records.append(json.loads(f.read_text()))
        except ValueError as exc:
            records.append({"ok": False, "error": f"{f.name}: {exc}"})
    return {"rc": rc, "output": output, "records": records, "work": work,
            "elapsed": time.monotonic() - t0}


def _prerequisites(request, run: Run) -> "str | None":
    """Bring up what the run needs (session fixtures); None, or why it cannot run."""
    request.getfixturevalue("torch_python")
    venv_bin = Path(sys.executable).parent
    if not (venv_bin / "distenv").exists():
        pytest.skip(f"{venv_bin}/distenv not found: the templates run `distenv run` from the "
                    f"job's PATH (install: {sys.executable} -m pip install -e .)")
    if run.needs == "cluster":
        request.getfixturevalue("cluster")
        entry = table.get(run.mpi)
        if not entry.available():
            pytest.skip(f"{run.mpi} is not installed ({entry.binary()}; install: {' '.join(entry.install)})")
        return None
    return request.getfixturevalue(run.needs)


@pytest.fixture(scope="module")
def real_runs(request):
    """Start every selected run at once; {name: result} or {name: (outcome, reason)}."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if getattr(item, "module", None) is sys.modules[__name__]
                and hasattr(item, "callspec") and "name" in item.callspec.params}
    confs, results = {}, {}
    for run in RUNS.values():
        if run.name not in selected:
            continue
        try:
            confs[run.name] = _prerequisites(request, run)
        except pytest.skip.Exception as exc:
            results[run.name] = ("skip", str(exc))
        except pytest.fail.Exception as exc:
            results[run.name] = ("fail", str(exc))
    ready = [RUNS[n] for n in confs]
    t0 = time.monotonic()
    if ready:
        with ThreadPoolExecutor(max_workers=len(ready)) as pool:
            futures = {run.name: pool.submit(_execute, run, confs[run.name]) for run in ready}
            for name, fut in futures.items():
                results[name] = fut.result()
    results["_wall"] = time.monotonic() - t0
    yield results
    for name, res in results.items():
        if isinstance(res, dict) and res.get("passed"):
            shutil.rmtree(res["work"], ignore_errors=True)


def _own_ompi_session_dir(env: dict, work: Path) -> None:
    """Each run's Open MPI 4 session directories under its own work dir (mpirun passes the
    variable to its daemons). Open MPI 4's daemons create /tmp/ompi.<host>.<uid> when it is
    missing and remove it when a job leaves it empty, and the nodes share /tmp: the runs
    below, started together, raced on it (measured once: "A call to mkdir was unable to
    create ... /tmp/ompi.node2.0 ... File exists", orte_init failed)."""
    base = work / "ompi"
    base.mkdir(exist_ok=True)
    os.chmod(base, 0o755)
    env["OMPI_MCA_orte_tmpdir_base"] = str(base)


def _describe(run: Run, res: dict) -> str:
    lines = [f"{run.name}: exit {res['rc']} after {res['elapsed']:.1f} s, "
             f"{len(res['records'])} of {run.world} record(s)",
             f"output:\n{res['output'][-4000:]}"]
    for r in res["records"]:
        if not r.get("ok"):
            lines.append(f"record: {json.dumps(r)[:3000]}")
    lines.append(f"(kept in {res['work']})")
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(RUNS))
def test_template_runs_for_real(real_runs, name):
    run, res = RUNS[name], real_runs[name]
    if isinstance(res, tuple):
        outcome, reason = res
        (pytest.skip if outcome == "skip" else pytest.fail)(f"{name}: {reason}")
    assert res["rc"] == 0 and len(res["records"]) == run.world, _describe(run, res)
    recs = sorted(res["records"], key=lambda r: r.get("rank", -1))
    why = _describe(run, res)
    assert all(r["ok"] for r in recs), why
    assert [r["rank"] for r in recs] == list(range(run.world)), why
    assert {r["world_size"] for r in recs} == {run.world}, why
    assert {r["sum"] for r in recs} == {run.world * (run.world + 1) // 2}, why
    assert Counter(r["host"] for r in recs) == Counter(run.per_host), why
    assert all(r["hosts"] == recs[0]["hosts"] for r in recs), why
    assert {r["launcher"] for r in recs} == {run.launcher}, why
    assert {r["launch"] for r in recs} == {"per-process"}, why   # each worker's own view
    assert {r["via_distenv_run"] for r in recs} == {run.via_distenv_run}, why
    # Ranks fill a node before the next, and local ranks are 0..n-1 on every node.
    for host in run.per_host:
        locals_ = sorted(r["local_rank"] for r in recs if r["host"] == host)
        assert locals_ == list(range(run.per_host[host])), why
    hosts_in_rank_order = [r["host"] for r in recs]
    assert hosts_in_rank_order == sorted(hosts_in_rank_order, key=list(run.per_host).index), why
    res["passed"] = True
