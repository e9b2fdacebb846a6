"""Real-launcher tests: session fixtures for what they need running, and the rule that
turns skips into failures when DISTENV_REQUIRE_LAUNCHERS=1.

Fixtures (session scope, brought up once, with the project's own scripts):

    slurm1   the one-node SLURM of integrations/slurm/start.sh        -> its SLURM_CONF
    cluster  the two network-namespace nodes of integrations/cluster/up.sh
    slurm2   the two-node SLURM of integrations/cluster/slurm-up.sh   -> its SLURM_CONF

Each is idempotent (the scripts are). Teardown: the last pytest process using it (pytest
-n workers, or two sessions at once, count through a pid list under a file lock in
$DISTENV_RUN_DIR/itest-<name>.users) stops it with the scripts' stop/down commands --
and only if it was not already up when the first of them started: a cluster that was up
before (a developer's, another tool's) is left as it was. The scripts stop daemons by pid
file, and down.sh kills whatever still runs inside the namespaces.

Each fixture skips with the reason when it cannot work here (not root, no network
namespaces, SLURM not installed, ...); `layout_records`/`need` skip when a launcher is not
installed. With DISTENV_REQUIRE_LAUNCHERS=1 every such skip in tests/integration is a
failure instead (the hook in tests/conftest.py; it also catches skips raised in fixtures
and by skip marks, in the setup phase, and reports them as FAILED, not ERROR).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import harness  # noqa: E402

SLURM_DIR = harness.REPO / "integrations" / "slurm"
CLUSTER_DIR = harness.CLUSTER


# DISTENV_REQUIRE_LAUNCHERS=1 (skip -> failure) is applied by tests/conftest.py.
def _under_here(item) -> bool:
    try:
        return HERE in Path(str(item.path)).resolve().parents
    except AttributeError:  # pragma: no cover - pytest < 7
        return HERE in Path(str(item.fspath)).resolve().parents


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _under_here(item):
            item.add_marker(pytest.mark.launcher)
            # Under pytest -n N one worker runs all of these, one after the other
            # (tests/conftest.py, xdist_unit): MPICH reveals no job id, so two MPICH
            # rendezvous at once would meet on the same default port.


# -- helpers ---------------------------------------------------------------------------------
def _run(argv, timeout=180):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, env=harness.clean_env(), stdin=subprocess.DEVNULL)


def _export_line(stdout: str, script) -> str:
    for line in stdout.splitlines():
        if line.startswith("export SLURM_CONF="):
            return line.split("=", 1)[1].strip()
    pytest.fail(f"{script} printed no `export SLURM_CONF=` line: {stdout!r}")


def _pid_alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def _fail_script(what, p):
    pytest.fail(f"{what} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")


@contextlib.contextmanager
def _users(name: str):
    """The shared record of who uses `name` (pids) and whether this round started it."""
    harness.run_dir().mkdir(parents=True, exist_ok=True)
    path = harness.run_dir() / f"itest-{name}.users"
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        try:
            state = json.loads(f.read() or "{}")
        except ValueError:
            state = {}
        state.setdefault("pids", [])
        state.setdefault("started", False)
        state["pids"] = [p for p in state["pids"] if _alive(p)]
        yield state
        f.seek(0)
        f.truncate()
        f.write(json.dumps(state))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _shared(name: str, is_up, start, stop):
    """Start `name` (idempotent `start()`), yield its value, stop it when the last user
    leaves -- if it was down when the first user came."""
    with _users(name) as state:
        if not state["pids"]:
            state["started"] = not is_up()
        value = start()
        state["pids"].append(os.getpid())
    try:
        yield value
    finally:
        with _users(name) as state:
            state["pids"] = [p for p in state["pids"] if p != os.getpid()]
            if not state["pids"] and state["started"]:
                stop()
                state["started"] = False


def _slurm_tools():
    tools = ["slurmctld", "slurmd", "srun", "sbatch", "salloc", "scontrol", "sinfo", "munge"]
    missing = [t for t in tools if shutil.which(t) is None]
    if not (shutil.which("munged") or os.access("/usr/sbin/munged", os.X_OK)):
        missing.append("munged")
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} not found): run "
                    "integrations/slurm/install.sh")
    if not os.path.isdir("/sys/fs/cgroup") or not os.listdir("/sys/fs/cgroup"):
        pytest.skip("slurmd needs /sys/fs/cgroup mounted, and it is not")


# -- session fixtures --------------------------------------------------------------------------
@pytest.fixture(scope="session")
def root():
    if os.geteuid() != 0:
        pytest.skip("needs root (daemons as SlurmUser=root, network namespaces, /etc/hosts)")


@pytest.fixture(scope="session")
def ranks_python():
    """The interpreter every rank runs: it must import distenv from any directory, since
    ranks start in other directories, on other "nodes", with a fresh environment."""
    p = subprocess.run([sys.executable, "-c", "import distenv; print(distenv.__file__)"],
                       capture_output=True, text=True, cwd="/", timeout=60,
                       env=harness.clean_env({"PYTHONPATH": ""}))
    if p.returncode != 0:
        pytest.skip(f"{sys.executable} cannot import distenv outside the repository "
                    f"(install it: {sys.executable} -m pip install -e .): {p.stderr[-300:]}")
    return sys.executable


@pytest.fixture(scope="session")
def torch_python(ranks_python):
    p = subprocess.run([sys.executable, "-c", "import torch.distributed as d; "
                        "assert d.is_available() and d.is_gloo_available()"],
                       capture_output=True, text=True, cwd="/", timeout=180)
    if p.returncode != 0:
        pytest.skip(f"torch with gloo is not importable by {sys.executable} "
                    f"(pip install torch==2.13.0): {p.stderr[-300:]}")
    return sys.executable


@pytest.fixture(scope="session")
def slurm1(root):
    """One-node SLURM (integrations/slurm/start.sh); yields its SLURM_CONF."""
    _slurm_tools()
    run = harness.run_dir() / "slurm1"

    def start():
        p = _run([SLURM_DIR / "start.sh"])
        if p.returncode != 0:
            _fail_script("integrations/slurm/start.sh", p)
        return _export_line(p.stdout, "integrations/slurm/start.sh")

    yield from _shared(
        "slurm1", lambda: all(_pid_alive(run / f) for f in ("slurmctld.pid", "slurmd.pid")),
        start, lambda: _run([SLURM_DIR / "stop.sh"]))


def _cluster_is_up() -> bool:
    return all(Path(f"/run/netns/{n}").exists() for n in harness.NODES) and \
        Path("/sys/class/net/distenv-br0").exists()


@pytest.fixture(scope="session")
def cluster(root):
    """The two nodes of integrations/cluster/up.sh (network namespaces node1, node2)."""
    missing = [t for t in ("ip", "nsenter", "unshare") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found (install iproute2 util-linux)")
    p = _run(["unshare", "--net", "--uts", "true"], timeout=30)
    if p.returncode != 0:
        pytest.skip(f"no network namespaces here (`unshare --net --uts true` failed: "
                    f"{p.stderr.strip()[-200:]})")

    def start():
        p = _run([CLUSTER_DIR / "up.sh"])
        if p.returncode != 0:
            _fail_script("integrations/cluster/up.sh", p)
        return harness.NODES

    yield from _shared("cluster", _cluster_is_up, start, lambda: _run([CLUSTER_DIR / "down.sh"]))


@pytest.fixture(scope="session")
def slurm2(cluster):
    """Two-node SLURM on the cluster (integrations/cluster/slurm-up.sh); yields SLURM_CONF."""
    _slurm_tools()
    run = harness.run_dir() / "cluster" / "slurm"

    def start():
        p = _run([CLUSTER_DIR / "slurm-up.sh"])
        if p.returncode != 0:
            _fail_script("integrations/cluster/slurm-up.sh", p)
        return _export_line(p.stdout, "integrations/cluster/slurm-up.sh")

    def is_up():
        return all(_pid_alive(run / f) for f in
                   ("slurmctld.pid", "slurmd-node1.pid", "slurmd-node2.pid"))

    yield from _shared("slurm2", is_up, start, lambda: _run([CLUSTER_DIR / "slurm-down.sh"]))


@pytest.fixture
def need(request, ranks_python):
    """need(layout): bring up what the layout needs, skip if its launcher is missing."""
    def _need(lay: harness.Layout) -> harness.Layout:
        if lay.needs != "local":
            request.getfixturevalue(lay.needs)
        why = harness.missing(lay)
        if why:
            pytest.skip(f"{lay.name}: {why}")
        if lay.torch:
            request.getfixturevalue("torch_python")
        return lay
    return _need
