"""The resolver on MVAPICH2's mpirun_rsh / Hydra variables environments written from its documentation
(src/distenv/sources/mvapich2.py)."""
from distenv import resolve


def test_mvapich2_ranks():
    mv = resolve({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2",
                  "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"})
    assert mv.launcher == "mvapich2" and mv.local_rank == 1
