"""Shared by the per-source tests: the check of a documented platform case."""
import pytest

from distenv import DistEnvError, resolve
from envs import platform_case


@pytest.fixture
def check_documented(fake_gpus):
    """check_documented(name): resolve tests/fixtures/platforms/<name>.json on its number of GPUs
    and compare with what the case expects (the description's fields, or the error)."""
    def check(name):
        case = platform_case(name)
        fake_gpus(case.get("gpus", 0))
        expected = case["expected"]
        if "error" in expected:
            with pytest.raises(DistEnvError, match=expected["error"]):
                resolve(case["env"])
            return
        got = resolve(case["env"]).to_dict()
        wrong = {k: (got[k], v) for k, v in expected.items() if got.get(k) != v}
        assert not wrong, f"{case['scenario']}\n(got, expected): {wrong}\n{resolve(case['env']).explain()}"
    return check


@pytest.fixture
def show_json():
    """show_json(env): what `distenv show --json` prints for the environment `env` (nothing else
    of this process's environment but PATH and HOME, and this checkout's distenv on
    PYTHONPATH), as a dict; a failing command fails the test with its error line."""
    import json
    import os
    import subprocess
    import sys

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "src")

    def run(env):
        base = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
        p = subprocess.run([sys.executable, "-m", "distenv", "show", "--json"],
                           env={**base, **env, "PYTHONPATH": os.path.abspath(src)},
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    return run
