"""Template tests: the session fixtures of tests/integration (one-node SLURM, the
namespace cluster, two-node SLURM, torch) reused, and DISTENV_REQUIRE_LAUNCHERS=1 turning
every skip in tests/templates into a failure (as tests/integration/conftest.py does for
its own directory; that hook is scoped to tests/integration, so this directory has its
own)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
INTEGRATION = HERE.parent / "integration"
for p in (HERE, INTEGRATION):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

REQUIRE = os.environ.get("DISTENV_REQUIRE_LAUNCHERS", "").strip() not in ("", "0")


def _load_integration_conftest():
    """tests/integration/conftest.py as a module of its own name (pytest imports it as
    `conftest`, which this file shadows), for its fixtures."""
    name = "distenv_integration_conftest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, INTEGRATION / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_itest = _load_integration_conftest()
# The session fixtures, by name (their hooks stay scoped to tests/integration).
root = _itest.root
ranks_python = _itest.ranks_python
torch_python = _itest.torch_python
slurm1 = _itest.slurm1
cluster = _itest.cluster
slurm2 = _itest.slurm2


def _under_here(item) -> bool:
    try:
        path = Path(str(item.path)).resolve()
    except AttributeError:  # pragma: no cover - pytest < 7
        path = Path(str(item.fspath)).resolve()
    return HERE in path.parents


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not REQUIRE or not rep.skipped or hasattr(rep, "wasxfail") or not _under_here(item):
        return
    reason = rep.longrepr
    if isinstance(reason, tuple) and len(reason) == 3:
        reason = reason[2]
    rep.outcome = "failed"
    rep.longrepr = (f"DISTENV_REQUIRE_LAUNCHERS=1 makes this skip ({rep.when} phase) a "
                    f"failure: {reason}")
