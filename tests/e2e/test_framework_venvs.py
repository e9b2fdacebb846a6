"""Every framework venv that runs pytest bounds its tests: pytest-timeout is installed there, so
a hung test in a framework's own run ends (the project's `timeout` setting applies) instead of
running unbounded (issue 24). A missing venv skips, which DISTENV_REQUIRE_LAUNCHERS=1 (CI)
turns into a failure."""
import subprocess

import pytest

from launch_pool import interpreter

VENVS = ("lightning", "deepspeed", "transformers4", "transformers5", "tensorflow", "jax", "ray")


@pytest.mark.parametrize("name", VENVS)
def test_the_framework_venv_has_pytest_timeout(name):
    python, why = interpreter(name)
    if python is None:
        pytest.skip(why)
    p = subprocess.run([python, "-c", "import pytest, pytest_timeout; print(pytest.__version__)"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{name}: {p.stderr.strip()[-500:]} (integrations/frameworks/{name}.sh)"


def _pins(*names):
    """{package: version} of the constraints files `names` (integrations/frameworks/)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pins = {}
    for name in names:
        with open(os.path.join(root, "integrations", "frameworks", name), encoding="utf-8") as f:
            for line in f:
                spec = line.split("#")[0].strip()
                if "==" in spec:
                    package, version = spec.split("==")
                    pins[package.strip().lower().replace("_", "-")] = version.strip()
    return pins


@pytest.mark.parametrize("name", VENVS + ("horovod",))
def test_the_framework_venv_has_the_pinned_versions(name):
    """Every pinned package a venv holds is at its pin: the suite tests what the constraints
    say, on a fresh machine as on an old one (a venv set up before a pin moved is rebuilt)."""
    python, why = interpreter(name)
    if python is None:
        pytest.skip(why)
    extra = {"transformers4": ("constraints-transformers4.txt",),
             "transformers5": ("constraints-transformers5.txt",),
             "ray": ("constraints-transformers5.txt",)}.get(name, ())
    pins = _pins("constraints.txt", *extra)
    p = subprocess.run([python, "-c", "import importlib.metadata as m, json; print(json.dumps("
                        "{d.metadata['Name'].lower().replace('_', '-'): d.version "
                        "for d in m.distributions()}))"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-500:]
    import json

    have = json.loads(p.stdout)
    wrong = {k: (have[k], v) for k, v in pins.items() if k in have and have[k].split("+")[0] != v}
    assert not wrong, (f"{name}: installed vs pinned {wrong}: run bash integrations/setup.sh "
                       "(integrations/frameworks/constraints*.txt)")
    framework = {"lightning": "lightning", "deepspeed": "deepspeed", "transformers4": "transformers",
                 "transformers5": "transformers", "tensorflow": "tensorflow-cpu", "jax": "jax",
                 "horovod": "torch", "ray": "ray"}[name]
    assert framework in pins and framework in have, (framework, sorted(pins))
