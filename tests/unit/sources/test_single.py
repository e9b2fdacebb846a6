"""The resolver with no launcher (src/distenv/sources/single.py): one process, rank 0 of 1, also
in a plain Kubernetes pod (tests/fixtures/platforms/plain_kubernetes_pod.json)."""

import pytest

from distenv import resolve
from envs import documented


@pytest.mark.parametrize("name", documented("single"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


def test_single_process_defaults():
    env = resolve({})
    assert (env.launcher, env.launch, env.platform) == ("none", "per-process", None)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (0, 0, 1, 1)
    assert (env.node_rank, env.num_nodes, env.nproc_per_node) == (0, 1, 1)
    assert env.master_addr == "127.0.0.1"
    assert 20000 <= env.master_port < 30000
    assert not env.is_distributed and env.is_main
