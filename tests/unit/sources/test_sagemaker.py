"""The resolver on Amazon SageMaker environments (src/distenv/sources/sagemaker.py), written
from its documentation (tests/fixtures/platforms/sagemaker_*.json)."""

import pytest

from distenv import resolve

from envs import documented


@pytest.mark.parametrize("name", documented("sagemaker"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


def test_torchrun_master_is_kept_over_the_first_host(no_gpus):
    """torchrun per host with a c10d rendezvous at algo-1 may give rank 0 to algo-2 (the real
    run: tests/integration/test_platform_master.py); its MASTER_ADDR names where."""
    env = {"TORCHELASTIC_RUN_ID": "j1", "RANK": "2", "GROUP_RANK": "1", "LOCAL_RANK": "0",
           "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2",
           "MASTER_ADDR": "algo-2", "MASTER_PORT": "29500", "SM_HOSTS": '["algo-1","algo-2"]',
           "SM_CURRENT_HOST": "algo-1", "TRAINING_JOB_NAME": "t"}
    d = resolve(env)
    assert (d.launcher, d.platform, d.master_addr, d.hosts) == ("torchrun", "sagemaker", "algo-2", None)
    assert any("SM_HOSTS" in n and "algo-2 is used" in n for n in d.notes), d.notes
