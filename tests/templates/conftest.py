"""Template tests: the session fixtures of tests/integration (one-node SLURM, the
namespace cluster, two-node SLURM, torch) reused, and DISTENV_REQUIRE_LAUNCHERS=1 turning
every skip in tests/templates into a failure (as tests/integration/conftest.py does for
its own directory; that hook is scoped to tests/integration, so this directory has its
own)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
INTEGRATION = HERE.parent / "integration"


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

# DISTENV_REQUIRE_LAUNCHERS=1 (skip -> failure) is applied by tests/conftest.py.
