"""The resolver on the plain torch variables with no launcher marker
(src/distenv/sources/plain.py): RANK/WORLD_SIZE set by hand, and the partial sets that are errors."""

import pytest

from distenv import DistEnvError, resolve


def test_plain_env_variables():
    env = resolve({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                   "MASTER_PORT": "1234"})
    assert (env.launcher, env.rank, env.master_addr, env.master_port) == ("env", 1, "10.0.0.1", 1234)


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"WORLD_SIZE": "4"}, {"LOCAL_RANK": "2"}])
def test_partial_torch_variables_are_errors(env):
    with pytest.raises(DistEnvError):
        resolve(env)


def test_world_size_one_alone_is_a_single_process():
    assert resolve({"WORLD_SIZE": "1"}).rank == 0
    assert resolve({"LOCAL_RANK": "0"}).launcher == "none"
