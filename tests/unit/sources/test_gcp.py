"""The resolver on Google Cloud AI Platform Training and Vertex AI environments
(src/distenv/sources/gcp.py), written from their documentation
(tests/fixtures/platforms/gcp_*.json, vertex_*.json)."""

import pytest

from distenv import resolve
from envs import documented, platform


@pytest.mark.parametrize("name", documented("gcp"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


@pytest.mark.parametrize("name", ["vertex_custom_container_workerpool1_index0",
                                  "gcp_custom_container_master_with_ps"])
def test_custom_container_with_tf_config_becomes_per_node_when_asked(name, no_gpus):
    # A Vertex/GCP custom container gets CLUSTER_SPEC and TF_CONFIG but no RANK; asking
    # for 4 workers per replica must give a per-node launch, not one silent worker.
    env = resolve(dict(platform(name), DISTENV_NPROC_PER_NODE="4"))
    assert env.launch == "per-node" and env.nproc_per_node == 4
    assert env.world_size == 4 * env.num_nodes
