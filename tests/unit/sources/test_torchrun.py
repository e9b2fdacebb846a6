"""The resolver on torchrun environments written by hand (src/distenv/sources/torchrun.py),
also started inside srun; recorded ones: test_recorded.py."""

from distenv import resolve
from envs import slurm_task, torchrun


def test_torchrun_inside_srun_describes_the_worker():
    env = slurm_task(1, 2, 0, 1, 2, "n[1-2]", "1(x2)")
    env.update({**torchrun(3, nodes=2, addr="n1"), "TORCHELASTIC_RUN_ID": "abc"})
    got = resolve(env)
    assert got.launcher == "torchrun"
    assert (got.rank, got.local_rank, got.node_rank, got.num_nodes) == (3, 1, 1, 2)
    assert (got.master_addr, got.master_port, got.job_id) == ("n1", 29400, "abc")
