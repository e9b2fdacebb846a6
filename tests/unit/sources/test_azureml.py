"""The resolver on Azure ML environments (src/distenv/sources/azureml.py), written from its
documentation (tests/fixtures/platforms/azureml_*.json)."""

import pytest

from envs import documented


@pytest.mark.parametrize("name", documented("azureml"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)
