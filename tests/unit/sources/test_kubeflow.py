"""The resolver on Kubeflow PyTorchJob and TrainJob environments (src/distenv/sources/kubeflow.py),
written from its documentation (tests/fixtures/platforms/kubeflow_*.json)."""

import pytest

from envs import documented


@pytest.mark.parametrize("name", documented("kubeflow"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)
