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


# -- a per-node launch completed from a service's answer (one helper for PMI-1 and PMIx) ----------
def test_per_node_launch_from_either_service_takes_the_ranks_as_nodes():
    from distenv import DistEnvError, pmi, pmix, resolve
    from distenv.discovery import _from_exchange, _from_pmix

    hydra = resolve({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1",
                     "DISTENV_NPROC_PER_NODE": "2"})
    got = _from_exchange(hydra, pmi.Exchange(1, 2, ["n1", "n2"], "fd", 0.0, "t", "kvs"))
    assert (got.launch, got.node_rank, got.num_nodes, got.hosts, got.master_addr) == \
        ("per-node", 1, 2, ("n1", "n2"), "n1")
    with pytest.raises(DistEnvError, match=r"key-value exchange found 2 processes on 1 hosts.*mpiexec -ppn 1"):
        _from_exchange(hydra, pmi.Exchange(1, 2, ["n1", "n1"], "fd", 0.0, "t", "kvs"))
    ompi = resolve({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "PMIX_NAMESPACE": "prterun-x-1@1",
                    "DISTENV_NPROC_PER_NODE": "2"})
    placed = pmix.Placement(0, 2, ["n2", "n1"], "prterun-x-1@1", "/lib/libpmix.so.2", "4.2", "child", 0.0)
    got = _from_pmix(ompi, placed)
    assert (got.node_rank, got.num_nodes, got.master_addr) == (0, 2, "n2")
    with pytest.raises(DistEnvError, match=r"PMIx server places 2 processes on 1 hosts.*ppr:1:node"):
        _from_pmix(ompi, pmix.Placement(0, 2, ["n2", "n2"], "prterun-x-1@1", "", "", "child", 0.0))
