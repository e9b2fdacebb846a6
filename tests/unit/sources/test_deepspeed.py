"""The resolver on the DeepSpeed launcher's environment (src/distenv/sources/deepspeed.py)."""

from distenv import resolve


def test_deepspeed_launcher():
    env = resolve({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_SIZE": "4",
                   "CROSS_RANK": "1", "CROSS_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"})
    assert env.launcher == "deepspeed"
    assert (env.local_world_size, env.node_rank, env.num_nodes) == (4, 1, 2)
