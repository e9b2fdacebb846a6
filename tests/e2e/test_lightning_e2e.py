"""distenv.lightning under real launchers: examples/lightning_trainer.py, unchanged, as every rank.

- Data-parallel for real: rank 0 gathers every rank's parameter checksum (identical), the
  global ranks are 0..N-1 on the expected hosts and nodes, and the result equals a
  single-process run of the same script over the same global batches.
- Per-node launch: one Open MPI process on each of the two namespace nodes with
  DISTENV_NPROC_PER_NODE=2; Lightning starts 2 workers per node from distenv's node rank,
  node count and master: 4 ranks on 2 nodes.
- The silent duplication without the plugin: under mpirun (no mpi4py) a plain Trainer makes
  every rank a rank 0 of a 1-process job -- two independent trainings, exit 0 -- and the
  same launch with the plugin is one 2-process job.
- Trainer(devices=1) on a 2-process launch fails at once naming devices=2, never hangs.
- Both packages: `lightning` and `pytorch_lightning` (DISTENV_LIGHTNING_PACKAGES, default
  both, restricts them, e.g. in a tox env that installs one), the plugin accepted by each
  Trainer and Fabric.

Ranks run with $DISTENV_PY_LIGHTNING or .venvs/lightning/bin/python
(integrations/frameworks/lightning.sh). Jobs run concurrently, each under a hard timeout.
"""
from __future__ import annotations

import math
import os
import subprocess

import pytest

import harness
from launch_pool import Job, jobs, local, openmpi4_nodes, single  # noqa: F401  (jobs: fixture)

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(900)]

EXAMPLE = str(harness.REPO / "examples" / "lightning_trainer.py")
CHECK = str(harness.REPO / "tests" / "e2e" / "lightning_plugin_check.py")
ALL = ("lightning", "pytorch_lightning")
PACKAGES = tuple(p for p in os.environ.get("DISTENV_LIGHTNING_PACKAGES", ",".join(ALL))
                 .replace(" ", "").split(",") if p in ALL) or ALL


def pkg(preferred: str) -> str:
    """The package a scenario uses: its own when selected, else the one selected."""
    return preferred if preferred in PACKAGES else PACKAGES[0]


def lightning_job(layout, package, *args, **kw) -> Job:
    return Job(layout, (EXAMPLE, "--package", package, *args), python="lightning",
               modules=(package,), **kw)


# scenario -> (job, launcher distenv reports, hosts per rank or None for this host)
SCENARIOS = {
    "openmpi4-np2": (lightning_job(local("openmpi4", 2), pkg("lightning"), cost=3),
                     None),
    "srun-n2": (lightning_job(local("slurm", 2, shape="n2"), pkg("pytorch_lightning"), cost=3),
                None),
    "torchrun-nproc2": (lightning_job(harness.LAYOUTS["torchrun-nproc2"], pkg("pytorch_lightning"),
                                      cost=3), None),
    "per-node-2x2": (lightning_job(openmpi4_nodes(1, "--bind-to", "none", "-x",
                                                  "DISTENV_NPROC_PER_NODE=2", shape="2x1-per-node"),
                                   pkg("lightning"), cost=6, timeout=300),
                     ["node1", "node1", "node2", "node2"]),
}
RANKS = {"openmpi4-np2": 2, "srun-n2": 2, "torchrun-nproc2": 2, "per-node-2x2": 4}

JOBS = {f"lt-{name}": job for name, (job, _) in SCENARIOS.items()}
JOBS.update({f"lt-single-{p}": lightning_job(single(), p, cost=2) for p in PACKAGES})
JOBS["lt-openmpi4-np2-no-plugin"] = lightning_job(local("openmpi4", 2), pkg("lightning"),
                                                  "--no-plugin", cost=3)
JOBS["lt-openmpi4-np2-devices1"] = lightning_job(local("openmpi4", 2), pkg("lightning"),
                                                 "--devices", "1", cost=2, timeout=180)
JOBS["lt-plugin-check"] = Job(single(), (CHECK, *PACKAGES), python="lightning",
                              modules=PACKAGES, cost=2)


def summaries(result):
    return [r for r in result.records if r.get("example") == "lightning_trainer"]


def summary(result):
    found = summaries(result)
    assert result.rc == 0 and len(found) == 1, result.describe()
    return found[0]


def close(a: float, b: float, rel: float = 1e-4) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-6)


@pytest.mark.parametrize("package", [pytest.param(p, marks=pytest.mark.jobs(f"lt-single-{p}"))
                                     for p in PACKAGES])
def test_single_process_reference(jobs, package):
    ref = summary(jobs.result(f"lt-single-{package}"))
    assert ref["package"] == package and ref["world_size"] == 1 and ref["steps"] == 48, ref


def _scenario_params():
    out = []
    for name, (job, _) in SCENARIOS.items():
        package = job.args[2]
        out.append(pytest.param(name, marks=pytest.mark.jobs(f"lt-{name}", f"lt-single-{package}"),
                                id=f"{name}-{package}"))
    return out


@pytest.mark.parametrize("name", _scenario_params())
def test_data_parallel_equals_one_process(jobs, name):
    job, hosts = SCENARIOS[name]
    package = job.args[2]
    out = summary(jobs.result(f"lt-{name}"))
    n = RANKS[name]
    assert out["package"] == package and out["plugin"] is True, out
    assert out["environment"] == "DistenvEnvironment" and out["strategy"] == "DDPStrategy", out
    assert out["world_size"] == n and sorted(out["ranks"]) == list(range(n)), out
    assert len(set(out["pids"])) == n, f"{n} ranks must be {n} processes: {out}"
    assert len(set(out["checksums"])) == 1, f"ranks ended with different parameters: {out}"
    if hosts is not None:
        assert out["hosts"] == hosts, out
        assert out["node_ranks"] == [0, 0, 1, 1] and out["local_ranks"] == [0, 1, 0, 1], out
        assert (out["devices"], out["num_nodes"]) == (2, 2), out
    else:
        assert len(set(out["hosts"])) == 1 and out["local_ranks"] == list(range(n)), out
    ref = summary(jobs.result(f"lt-single-{package}"))
    assert out["steps"] == ref["steps"], (out, ref)
    assert close(out["final_loss"], ref["final_loss"]), (out["final_loss"], ref["final_loss"])
    assert close(out["checksum"], ref["checksum"]), (out["checksum"], ref["checksum"])


@pytest.mark.jobs("lt-openmpi4-np2-no-plugin", "lt-openmpi4-np2")
def test_without_plugin_two_silent_copies_with_plugin_one_job(jobs):
    bad = jobs.result("lt-openmpi4-np2-no-plugin")
    copies = summaries(bad)
    # The failure the plugin exists for: exit 0, two trainings, each "rank 0 of 1".
    assert bad.rc == 0, bad.describe()
    assert len(copies) == 2, bad.describe()
    assert all(c["world_size"] == 1 and c["ranks"] == [0] for c in copies), copies
    assert copies[0]["pids"] != copies[1]["pids"], copies
    good = summary(jobs.result("lt-openmpi4-np2"))
    assert good["world_size"] == 2 and good["ranks"] == [0, 1], good
    assert len(set(good["checksums"])) == 1, good


@pytest.mark.jobs("lt-openmpi4-np2-devices1")
def test_devices_1_on_two_processes_is_a_clear_error(jobs):
    r = jobs.result("lt-openmpi4-np2-devices1")
    assert r.rc not in (0, 124, 137), r.describe()  # failed, and not by the timeout
    text = " ".join(r.output.split())
    assert "distenv: error: " in text and "Traceback" not in text, r.describe()  # the one line
    assert "Trainer(devices=1, num_nodes=1) contradicts the launch" in text, r.describe()
    assert "Fix: Trainer(devices=2, num_nodes=1)" in text, r.describe()
    assert not summaries(r), "a rank trained alone instead of failing"


@pytest.mark.jobs("lt-plugin-check")
def test_plugin_accepted_by_each_package(jobs):
    r = jobs.result("lt-plugin-check")
    facts = [x for x in r.records if set(x) & set(ALL)]
    assert r.rc == 0 and len(facts) == 1, r.describe()
    for package in PACKAGES:
        f = facts[0][package]
        assert f["isinstance"] is True, f
        assert f["trainer_env"] == "DistenvEnvironment" and f["fabric_env"] == "DistenvEnvironment", f
        for case in ("devices1", "devices1_ddp"):
            assert "Fix: Trainer(devices=2, num_nodes=1)" in f[case], (case, f)
        assert f["kwargs_np2"] == {"devices": 2, "num_nodes": 1}, f


# -- the adapter's unit tests, with the real Lightning ------------------------------------------
def test_adapter_unit_tests_in_the_venv():
    """tests/unit/test_lightning_{adapter,patch}.py in the Lightning venv: the plugin with each
    package's base class, and patch() on real Trainers and Fabrics (skips become failures)."""
    from launch_pool import interpreter

    py, why = interpreter("lightning")
    if py is None:
        pytest.skip(why)  # a failure under DISTENV_REQUIRE_LAUNCHERS=1 (tests/conftest.py)
    repo = str(harness.REPO)
    p = subprocess.run([py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "tests/unit/test_lightning_adapter.py", "tests/unit/test_lightning_patch.py"],
                       capture_output=True, text=True, timeout=900, cwd=repo,
                       env={"PATH": "/usr/bin:/bin", "HOME": os.path.expanduser("~"),
                            "OMP_NUM_THREADS": "1",
                            "DISTENV_REQUIRE_FRAMEWORK": "lightning",
                            "DISTENV_LIGHTNING_PACKAGES": ",".join(PACKAGES)})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert " passed" in p.stdout and " failed" not in p.stdout, p.stdout[-2000:]
    # No skip of a test this venv can run: the only skips allowed are of a package left out
    # by DISTENV_LIGHTNING_PACKAGES (tox's one-package envs); with both, none.
    skips = [line for line in p.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("is not selected (DISTENV_LIGHTNING_PACKAGES=" in line for line in skips), skips
    assert not skips or set(PACKAGES) != set(ALL), skips


# -- Lightning's on-prem launch, as its guide says ----------------------------------------------
def _onprem_node(node: int, port: int, package: str) -> "subprocess.Popen[str]":
    """One "node" of Lightning's "Run on an on-prem cluster (intermediate)": MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE (every process of the job) and NODE_RANK set by hand, then the
    script with Trainer(devices=2, num_nodes=2): Lightning starts the node's 2 workers."""
    from launch_pool import interpreter

    python, why = interpreter("lightning")
    if python is None:
        pytest.skip(why)
    env = harness.clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                             "WORLD_SIZE": "4", "NODE_RANK": str(node), "DISTENV_TIMEOUT": "120",
                             "OMP_NUM_THREADS": "1"})
    return subprocess.Popen(["timeout", "-k", "5", "400", python, EXAMPLE, "--package", package,
                             "--devices", "2", "--num-nodes", "2"], env=env, cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.jobs(f"lt-single-{pkg('lightning')}")
def test_lightning_onprem_launch_two_nodes_equals_one_process(jobs):
    """The peer's case: Lightning's on-prem guide. Two "nodes" (two process groups on this host),
    each given only the four variables, with the plugin: one 4-process job whose result equals
    the single-process run's (distenv used to refuse it: "set RANK too")."""
    import socket

    package = pkg("lightning")
    # The port stays bound here (SO_REUSEADDR, never listening) until the job is over: no other
    # process can take it between here and rank 0's TCPStore, which binds with SO_REUSEADDR too
    # and listens beside it.
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    outs = []
    with held:
        procs = [_onprem_node(n, port, package) for n in (0, 1)]
        for p in procs:
            try:
                out, err = p.communicate(timeout=460)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                out, err = p.communicate()
            outs.append((p.returncode, out, err))
    for rc, out, err in outs:
        assert rc == 0, f"exit {rc}\n{out[-3000:]}\n{err[-6000:]}"
    found = [r for r in harness.json_lines(outs[0][1]) if r.get("example") == "lightning_trainer"]
    assert len(found) == 1, outs[0]
    out = found[0]
    assert out["environment"] == "DistenvEnvironment" and out["strategy"] == "DDPStrategy", out
    assert (out["world_size"], out["devices"], out["num_nodes"]) == (4, 2, 2), out
    assert out["ranks"] == [0, 1, 2, 3] and out["node_ranks"] == [0, 0, 1, 1], out
    assert out["local_ranks"] == [0, 1, 0, 1] and len(set(out["pids"])) == 4, out
    assert len(set(out["checksums"])) == 1, out
    ref = summary(jobs.result(f"lt-single-{package}"))
    assert out["steps"] == ref["steps"], (out, ref)
    assert close(out["final_loss"], ref["final_loss"]), (out["final_loss"], ref["final_loss"])
    assert close(out["checksum"], ref["checksum"]), (out["checksum"], ref["checksum"])


# -- distenv run's one process and a Trainer asking for more ------------------------------------
def test_distenv_run_one_process_with_trainer_devices_2_is_one_line_not_a_wait():
    """`distenv run -- python train.py` (no launcher) exports LOCAL_RANK=0, so Lightning starts
    no worker, and a plain Trainer(devices=2) waited forever for its rank 1 (2026-12-07,
    measured: killed at 60 s). Now one line naming both ways out; the second one then trains
    as one 2-process job."""
    from launch_pool import interpreter

    python, why = interpreter("lightning")
    if python is None:
        pytest.skip(why)
    distenv = os.path.join(os.path.dirname(python), "distenv")
    env = harness.clean_env({"OMP_NUM_THREADS": "1", "DISTENV_TIMEOUT": "60"})
    script = [python, EXAMPLE, "--package", pkg("lightning"), "--no-plugin", "--devices", "2",
              "--epochs", "1", "--samples", "128"]
    p = subprocess.run(["timeout", "-k", "5", "120", distenv, "run", "--", *script], env=env,
                       cwd="/", capture_output=True, text=True, timeout=130, stdin=subprocess.DEVNULL)
    errors = [line for line in p.stderr.splitlines() if "distenv: error:" in line]
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-3000:])
    assert len(errors) == 1 and "Trainer(devices=2, num_nodes=1) contradicts the launch" in errors[0], errors
    assert "distenv run --nproc-per-node 2 --" in errors[0], errors
    p = subprocess.run(["timeout", "-k", "5", "240", distenv, "run", "--nproc-per-node", "2", "--",
                        *script], env=env, cwd="/", capture_output=True, text=True, timeout=250,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    found = [r for r in harness.json_lines(p.stdout) if r.get("example") == "lightning_trainer"]
    assert len(found) == 1 and found[0]["ranks"] == [0, 1], p.stdout[-2000:]


def test_distenv_auto_alone_lets_lightning_start_its_own_workers():
    """No launcher, DISTENV_AUTO=1, a plain Trainer(devices=2): the workers Lightning starts
    inherit WORLD_SIZE, NODE_RANK, LOCAL_RANK and no RANK, and distenv in each stopped it
    (2026-12-07). Auto now installs Lightning's patch there, which hands them the node."""
    from launch_pool import interpreter

    python, why = interpreter("lightning")
    if python is None:
        pytest.skip(why)
    env = harness.clean_env({"OMP_NUM_THREADS": "1", "DISTENV_TIMEOUT": "60", "DISTENV_AUTO": "1"})
    p = subprocess.run(["timeout", "-k", "5", "240", python, EXAMPLE, "--package", pkg("lightning"),
                        "--no-plugin", "--devices", "2", "--epochs", "1", "--samples", "128"],
                       env=env, cwd="/", capture_output=True, text=True, timeout=250,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    found = [r for r in harness.json_lines(p.stdout) if r.get("example") == "lightning_trainer"]
    assert len(found) == 1 and found[0]["ranks"] == [0, 1], p.stdout[-2000:]
    assert len(set(found[0]["checksums"])) == 1, found[0]
