import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


@pytest.fixture
def no_gpus(monkeypatch, tmp_path):
    """Make GPU discovery see an empty driver directory."""
    import distenv.core.gpus

    monkeypatch.setattr(distenv.core.gpus, "NVIDIA_DIR", str(tmp_path / "no-such-dir"))
    return tmp_path


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """fake_gpus(n): the driver lists n GPUs (through a directory the test controls)."""
    import distenv.core.gpus

    def make(n):
        d = tmp_path / "nvidia-gpus"
        d.mkdir(exist_ok=True)
        for i in range(n):
            (d / f"0000:{i:02x}:00.0").mkdir()
        monkeypatch.setattr(distenv.core.gpus, "NVIDIA_DIR", str(d))

    return make


@pytest.fixture(scope="session")
def no_gpus_session(tmp_path_factory):
    """Session-wide: GPU discovery sees no driver (for hypothesis tests)."""
    import distenv.core.gpus

    old = distenv.core.gpus.NVIDIA_DIR
    distenv.core.gpus.NVIDIA_DIR = str(tmp_path_factory.mktemp("gpus") / "none")
    yield
    distenv.core.gpus.NVIDIA_DIR = old


# -- tests/e2e: frameworks under real launchers ------------------------------------------------
# The session fixtures that bring up what launchers need (root, slurm1, cluster, slurm2) live
# in tests/integration/conftest.py; they are made visible to tests/e2e here (tests/integration's
# own conftest still wins for its tests). And DISTENV_REQUIRE_LAUNCHERS=1 turns every skip in
# tests/e2e into a failure, as tests/integration's conftest does for its tests: a missing
# framework venv or launcher cannot hide behind a skip in CI.
def _load_integration_conftest():
    import importlib.util

    path = os.path.join(ROOT, "tests", "integration", "conftest.py")
    spec = importlib.util.spec_from_file_location("distenv_integration_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


try:
    _itest = _load_integration_conftest()
    root, slurm1, cluster, slurm2 = _itest.root, _itest.slurm1, _itest.cluster, _itest.slurm2
except Exception as _exc:  # keep tests/unit runnable whatever happens to tests/integration
    _itest_error = f"tests/integration/conftest.py could not be loaded: {_exc!r}"

    @pytest.fixture(scope="session")
    def cluster():
        pytest.skip(_itest_error)

    root = slurm1 = slurm2 = cluster

E2E_DIR = os.path.join(ROOT, "tests", "e2e")
_E2E_REQUIRE = os.environ.get("DISTENV_REQUIRE_LAUNCHERS", "").strip() not in ("", "0")

# DISTENV_REQUIRE_LAUNCHERS=1 (set by .ci/run): in these directories a skip -- a missing
# launcher, framework venv, root, SLURM or the namespace cluster -- is a failure, reported as
# FAILED also when a fixture raised it. Elsewhere (tests/unit) the same holds for a test
# marked `launcher` (it runs a real launcher) or `required` (what it needs is on CI's machine:
# .venv's torch, the installed distenv_auto.pth, ...); other unit tests keep ordinary skips.
# Without the variable (a developer's machine lacking launchers) every skip stays a skip.
REQUIRED_DIRS = tuple(os.path.join(ROOT, "tests", d) + os.sep
                      for d in ("integration", "e2e", "templates", "reliability"))
REQUIRED_MARKS = ("launcher", "required")


def _required(path) -> bool:
    return os.path.abspath(str(path)).startswith(REQUIRED_DIRS)


def _required_item(item) -> bool:
    return _required(getattr(item, "path", None) or item.fspath) or \
        any(item.get_closest_marker(m) is not None for m in REQUIRED_MARKS)


def _in_e2e(item) -> bool:
    return os.path.abspath(str(getattr(item, "path", None) or item.fspath)).startswith(E2E_DIR + os.sep)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not _E2E_REQUIRE or not rep.skipped or hasattr(rep, "wasxfail") or not _required_item(item):
        return
    reason = rep.longrepr
    if isinstance(reason, tuple) and len(reason) == 3:
        reason = reason[2]
    rep.outcome = "failed"
    rep.longrepr = (f"DISTENV_REQUIRE_LAUNCHERS=1 makes this skip ({rep.when} phase) a "
                    f"failure: {reason}")
    rep.user_properties.append(("distenv_required_skip", rep.when))


def pytest_report_teststatus(report, config):
    if report.when == "setup" and report.failed and \
            ("distenv_required_skip", "setup") in report.user_properties:
        return "failed", "F", "FAILED"
    return None


#: Run by one pytest-xdist worker, one test after the other (the README's `pytest -n 2`):
#: tests that start real launchers on default or fixed ports (MPICH reveals no job id, so its
#: rendezvous meet on 29500; the Transformers baselines collide there on purpose) or time
#: concurrent jobs. Every other module is a unit of its own, so its module and session
#: fixtures (launch pools, built venvs) are set up once. Paths as in pytest's node ids.
SERIAL = ("tests/integration/", "tests/reliability/", "tests/templates/",
          "tests/e2e/test_transformers_e2e.py", "tests/unit/test_run.py")


def xdist_unit(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole: "launchers", or the test's module."""
    path = nodeid.split("::", 1)[0]
    return "launchers" if path.startswith(SERIAL) else path


class _XdistUnits:
    """pytest-xdist's own groups (--dist loadgroup) do nothing under pytest 9.2 (xdist 3.8
    renames item._nodeid, which pytest 9.2 no longer reads): a scheduler of our own units."""

    @pytest.hookimpl
    def pytest_xdist_make_scheduler(self, config, log):
        from xdist.scheduler import LoadScopeScheduling

        class Units(LoadScopeScheduling):
            def _split_scope(self, nodeid):
                return xdist_unit(nodeid)

        return Units(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _in_e2e(item):
            item.add_marker(pytest.mark.launcher)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistUnits(), "distenv-xdist-units")
    config.addinivalue_line(
        "markers", "jobs(*names): launcher jobs this e2e test reads (tests/e2e/launch_pool.py)")
    config.addinivalue_line(
        "markers", "required: DISTENV_REQUIRE_LAUNCHERS=1 makes a skip of this test a failure "
        "(tests/conftest.py; what tests/integration, e2e, templates and reliability get by folder)")
