"""The resolver on torchrun environments written by hand (src/distenv/sources/torchrun.py),
also started inside srun; recorded ones: test_recorded.py."""

from distenv import resolve
from envs import slurm_task


def test_torchrun_inside_srun_describes_the_worker():
    env = slurm_task(1, 2, 0, 1, 2, "n[1-2]", "1(x2)")
    env.update({"TORCHELASTIC_RUN_ID": "abc", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
                "MASTER_ADDR": "n1", "MASTER_PORT": "29400"})
    got = resolve(env)
    assert got.launcher == "torchrun"
    assert (got.rank, got.local_rank, got.node_rank, got.num_nodes) == (3, 1, 1, 2)
    assert (got.master_addr, got.master_port, got.job_id) == ("n1", 29400, "abc")
