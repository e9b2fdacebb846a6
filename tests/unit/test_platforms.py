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


@pytest.mark.parametrize("name", ["vertex_custom_container_workerpool1_index0",
                                  "gcp_custom_container_master_with_ps"])
def test_custom_container_with_tf_config_becomes_per_node_when_asked(name, no_gpus):
    # A Vertex/GCP custom container gets CLUSTER_SPEC and TF_CONFIG but no RANK; asking
    # for 4 workers per replica must give a per-node launch, not one silent worker.
    case = load(os.path.join(HERE, "..", "fixtures", "platforms", name + ".json"))
    env = resolve(dict(case["env"], DISTENV_NPROC_PER_NODE="4"))
    assert env.launch == "per-node" and env.nproc_per_node == 4
    assert env.world_size == 4 * env.num_nodes


def test_nproc_request_contradicting_a_tf_worker_is_an_error(no_gpus):
    tf = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})
    with pytest.raises(DistEnvError, match="DISTENV_NPROC_PER_NODE"):
        resolve({"TF_CONFIG": tf, "DISTENV_NPROC_PER_NODE": "4"})
