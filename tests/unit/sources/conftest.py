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
