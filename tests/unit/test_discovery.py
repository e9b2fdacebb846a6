"""Discovery completes a launch from every rank's host name (`from_hostnames`, where every
discovery method ends). Under real launchers: the key-value exchange through Hydra's PMI-1
(MPICH, Intel MPI; distenv.torch, `distenv run`, `distenv show --discover`) in
tests/integration/test_pmi_discovery.py, and through PMIx (Open MPI 4 and 5,
`discover(method="auto")`) in tests/integration/test_pmix_discovery.py. The mpi4py allgather
(`discover(method="mpi4py")`, and its "MPI says rank ... is not this MPI job" error) has no
real-launcher test yet (issue 24)."""

import pytest

from distenv import DistEnvError, resolve
from distenv.discovery import from_hostnames


def mpich(rank, size, local, lsize):
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(size), "MPI_LOCALRANKID": str(local),
            "MPI_LOCALNRANKS": str(lsize)}


def test_two_nodes_block():
    env = resolve(mpich(3, 4, 1, 2))
    assert env.node_rank is None and env.master_addr is None
    got = from_hostnames(env, ["a", "a", "b", "b"], "test")
    assert (got.node_rank, got.num_nodes, got.master_addr, got.hosts) == (1, 2, "a", ("a", "b"))
    assert got.nproc_per_node == 2 and got.provenance["node_rank"] == "test"


def test_cyclic_and_uneven():
    env = resolve(mpich(1, 3, 0, 1))
    got = from_hostnames(env, ["a", "b", "a"], "test")
    assert (got.node_rank, got.num_nodes, got.local_world_size, got.nproc_per_node) == (1, 2, 1, None)


def test_contradiction_is_an_error():
    env = resolve(mpich(1, 4, 1, 2))
    with pytest.raises(DistEnvError, match="local_world_size"):
        from_hostnames(env, ["a", "b", "c", "d"], "test")
    with pytest.raises(DistEnvError, match="world_size=4"):
        from_hostnames(env, ["a", "b"], "test")


def test_one_node_keeps_loopback():
    env = resolve(mpich(1, 2, 1, 2))
    got = from_hostnames(env, ["a", "a"], "test")
    assert got.master_addr == "127.0.0.1" and got.node_rank == 0
