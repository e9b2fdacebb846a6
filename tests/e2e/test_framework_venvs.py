"""Every framework venv that runs pytest bounds its tests: pytest-timeout is installed there, so
a hung test in a framework's own run ends (the project's `timeout` setting applies) instead of
running unbounded (issue 24). A missing venv skips, which DISTENV_REQUIRE_LAUNCHERS=1 (CI)
turns into a failure."""
import subprocess

import pytest

from launch_pool import interpreter

VENVS = ("lightning", "deepspeed", "transformers4", "transformers5", "tensorflow", "jax")


@pytest.mark.parametrize("name", VENVS)
def test_the_framework_venv_has_pytest_timeout(name):
    python, why = interpreter(name)
    if python is None:
        pytest.skip(why)
    p = subprocess.run([python, "-c", "import pytest, pytest_timeout; print(pytest.__version__)"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{name}: {p.stderr.strip()[-500:]} (integrations/frameworks/{name}.sh)"
