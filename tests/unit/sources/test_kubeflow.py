"""The resolver on Kubeflow PyTorchJob and TrainJob environments (src/distenv/sources/kubeflow.py),
written from its documentation (tests/fixtures/platforms/kubeflow_*.json)."""

import pytest

from distenv import DistEnvError, resolve
from envs import documented


@pytest.mark.parametrize("name", documented("kubeflow"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


# PyTorchJob v1 pod with nprocPerNode: 1 (the operator's WORLD_SIZE counts pods), started as
# `distenv run --nproc-per-node 4`: the contradiction is the request, which the Fix names.
POD = {"MASTER_ADDR": "pytorch-job-master-0", "MASTER_PORT": "23456", "PET_MASTER_ADDR": "pytorch-job-master-0",
       "PET_MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2", "PET_NPROC_PER_NODE": "1",
       "PET_NODE_RANK": "2", "PET_NNODES": "3"}


@pytest.mark.parametrize("how", ["variable", "argument"])
def test_workers_asked_of_distenv_name_the_request_in_the_fix(how):
    env, kw = (({**POD, "DISTENV_NPROC_PER_NODE": "4"}, {}) if how == "variable"
               else (POD, {"nproc_per_node": 4}))
    with pytest.raises(DistEnvError) as err:
        resolve(env, **kw)
    text = str(err.value)
    assert "3 pods (PET_NNODES) x 4 processes per pod" in text and "= 12" in text, text
    assert "Fix: drop --nproc-per-node (DISTENV_NPROC_PER_NODE), or set nprocPerNode: 4" in text
    assert resolve(POD).world_size == 3  # the Fix's first way out works
