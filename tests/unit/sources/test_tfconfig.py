"""The resolver on TF_CONFIG (src/distenv/sources/tfconfig.py): the documented cases where
TF_CONFIG alone describes the process (tests/fixtures/platforms/tf_config_*.json,
kubeflow_tfjob_*.json), and a per-node request that contradicts it."""

import json

import pytest

from distenv import DistEnvError, resolve
from envs import documented


@pytest.mark.parametrize("name", documented("tfconfig"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


def test_nproc_request_contradicting_a_tf_worker_is_an_error(no_gpus):
    tf = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})
    with pytest.raises(DistEnvError, match="DISTENV_NPROC_PER_NODE"):
        resolve({"TF_CONFIG": tf, "DISTENV_NPROC_PER_NODE": "4"})
