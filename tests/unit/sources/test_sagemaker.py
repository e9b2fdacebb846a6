"""The resolver on Amazon SageMaker environments (src/distenv/sources/sagemaker.py), written
from its documentation (tests/fixtures/platforms/sagemaker_*.json)."""

import pytest

from envs import documented


@pytest.mark.parametrize("name", documented("sagemaker"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)
