"""The resolver on Cray PALS (aprun/mpiexec on HPE Cray EX) environments written from its documentation
(src/distenv/sources/pals.py)."""
from distenv import resolve


def test_pals_ranks_and_no_master():
    pals = resolve({"PALS_RANKID": "5", "PMI_RANK": "5", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "1",
                    "PALS_LOCAL_SIZE": "4", "PALS_NODEID": "1", "PALS_APID": "a1", "PBS_JOBID": "42.pbs"})
    assert (pals.launcher, pals.rank, pals.world_size, pals.node_rank) == ("pals", 5, 8, 1)
    assert pals.local_world_size == 4 and pals.master_addr is None
