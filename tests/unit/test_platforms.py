"""The resolver on platform environments written from each platform's documentation
(tests/fixtures/platforms/*.json: env, GPUs on the node, the expected description and
the sources it follows)."""

import glob
import json
import os

import pytest

from distenv import DistEnvError, resolve

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = sorted(glob.glob(os.path.join(HERE, "..", "fixtures", "platforms", "*.json")))


def load(path):
    with open(path) as f:
        return json.load(f)


def test_fixtures_exist():
    assert len(FIXTURES) >= 20


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.basename(p)[:-5] for p in FIXTURES])
def test_documented_platform_environment(path, fake_gpus):
    case = load(path)
    fake_gpus(case.get("gpus", 0))
    expected = case["expected"]
    if "error" in expected:
        with pytest.raises(DistEnvError, match=expected["error"]):
            resolve(case["env"])
        return
    got = resolve(case["env"]).to_dict()
    wrong = {k: (got[k], v) for k, v in expected.items() if got.get(k) != v}
    assert not wrong, f"{case['scenario']}\n(got, expected): {wrong}\n{resolve(case['env']).explain()}"
