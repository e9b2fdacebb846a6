"""The resolver on Flux environments written from its documentation
(src/distenv/sources/flux.py)."""
from distenv import resolve


def test_flux_ranks_and_nodes():
    flux = resolve({"FLUX_TASK_RANK": "2", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "0",
                    "FLUX_JOB_NNODES": "2", "FLUX_JOB_ID": "f123"})
    assert (flux.launcher, flux.rank, flux.num_nodes, flux.local_world_size) == ("flux", 2, 2, None)
