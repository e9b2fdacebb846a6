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
from envs import hydra_rank, ompi


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


def test_a_local_rank_or_count_the_placement_contradicts_is_an_error():
    """Found by a review: Flux gives a local rank but no local count, so the placement's
    count for this host was taken beside a local rank it cannot hold (local rank 1 of 1);
    and a same-count-everywhere claim stood beside uneven hosts on the ranks whose own count
    happened to match."""
    flux = {"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "3", "FLUX_TASK_LOCAL_ID": "1",
            "FLUX_JOB_NNODES": "2", "FLUX_JOB_ID": "f123"}
    with pytest.raises(DistEnvError, match=r"local_rank=1 \(FLUX_TASK_LOCAL_ID=1\) contradicts discovery "
                                           r"\(test\): 1 rank\(s\) on this host\. Fix:"):
        from_hostnames(resolve(flux), ["n1", "n2", "n1"], "test")
    # as many tasks as nodes: one on each (FLUX_JOB_NNODES counts nodes hosting tasks), so
    # local rank 1 is refused by the resolver itself (review, 2026-12-07)
    with pytest.raises(DistEnvError, match=r"local_rank=1 \(FLUX_TASK_LOCAL_ID=1\) must be below "
                                           r"local_world_size=1 \(FLUX_JOB_NNODES = FLUX_JOB_SIZE"):
        resolve({**flux, "FLUX_JOB_SIZE": "2"})
    four = resolve({"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "1",
                    "FLUX_JOB_NNODES": "2", "FLUX_JOB_ID": "f123"})
    assert from_hostnames(four, ["n1", "n1", "n2", "n2"], "test").local_world_size == 2
    slurm = resolve({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                     "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_NUM_NODES": "3",
                     "SLURM_STEP_NODELIST": "a,b,c", "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
                     "SLURM_DISTRIBUTION": "arbitrary"})
    assert slurm.nproc_per_node == 2
    with pytest.raises(DistEnvError, match=r"nproc_per_node=2 .*contradicts discovery .*1, 2, 3 rank\(s\) per host"):
        from_hostnames(slurm, ["a", "a", "b", "b", "b", "c"], "test")
    assert from_hostnames(slurm, ["a", "b", "c", "a", "b", "c"], "test").node_rank == 0


def test_one_node_keeps_loopback():
    env = resolve(mpich(1, 2, 1, 2))
    got = from_hostnames(env, ["a", "a"], "test")
    assert got.master_addr == "127.0.0.1" and got.node_rank == 0


# -- a per-node launch completed from a service's answer (one helper for PMI-1 and PMIx) ----------
def test_per_node_launch_from_either_service_takes_the_ranks_as_nodes():
    from distenv import DistEnvError, resolve
    from distenv.discovery import pmi, pmix
    from distenv.discovery.apply import apply
    from distenv.discovery.services import Pmi, Pmix

    hydra = resolve(hydra_rank(1, 2, 0, 1, DISTENV_NPROC_PER_NODE="2"))
    got = apply(hydra, Pmi.answer(pmi.Exchange(1, 2, ["n1", "n2"], "fd", 0.0, "t", "kvs")))
    assert (got.launch, got.node_rank, got.num_nodes, got.hosts, got.master_addr) == \
        ("per-node", 1, 2, ("n1", "n2"), "n1")
    with pytest.raises(DistEnvError, match=r"key-value exchange \(Hydra, PMI_FD\) found 2 processes on 1 hosts.*mpiexec -ppn 1"):
        apply(hydra, Pmi.answer(pmi.Exchange(1, 2, ["n1", "n1"], "fd", 0.0, "t", "kvs")))
    openmpi = resolve(ompi(0, 2, 0, 1, node_rank_trap=False, PMIX_NAMESPACE="prterun-x-1@1",
                           DISTENV_NPROC_PER_NODE="2"))
    placed = pmix.Placement(0, 2, ["n2", "n1"], "prterun-x-1@1", "/lib/libpmix.so.2", "4.2", "child", 0.0)
    got = apply(openmpi, Pmix.answer(placed))
    assert (got.node_rank, got.num_nodes, got.master_addr) == (0, 2, "n2")
    with pytest.raises(DistEnvError, match=r"PMIx placement \(the host of every rank\) found 2 processes on 1 hosts.*ppr:1:node"):
        apply(openmpi, Pmix.answer(pmix.Placement(0, 2, ["n2", "n2"], "prterun-x-1@1", "", "", "child", 0.0)))


def test_a_per_node_launch_checks_a_given_master_and_asks_every_host(monkeypatch):
    """Review, 2026-12-08: a per-node launch took any MASTER_ADDR beside the answer (each node
    setting its own name: every agent but node 0's waits on itself), and rank 0's host alone
    (what the PMIx query reads when only the master is needed) was read as 2 processes on 1
    host, a false error naming the user's launch."""
    from distenv.discovery import pmi, pmix
    from distenv.discovery.apply import apply
    from distenv.discovery.services import Pmi, Pmix

    given = resolve(hydra_rank(1, 2, 0, 1, DISTENV_NPROC_PER_NODE="2", MASTER_ADDR="n2"))
    with pytest.raises(DistEnvError, match=r"master_addr=n2 \(.*\) is the host of other ranks, but "
                                           r"rank 0 runs on n1.*Fix: unset MASTER_ADDR"):
        apply(given, Pmi.answer(pmi.Exchange(1, 2, ["n1", "n2"], "fd", 0.0, "t", "kvs")))
    right = resolve(hydra_rank(1, 2, 0, 1, DISTENV_NPROC_PER_NODE="2", MASTER_ADDR="n1"))
    assert apply(right, Pmi.answer(pmi.Exchange(1, 2, ["n1", "n2"], "fd", 0.0, "t", "kvs"))).master_addr == "n1"

    openmpi = resolve(ompi(1, 2, 0, 1, node_rank_trap=False, PMIX_NAMESPACE="prterun-x-1@1",
                           DISTENV_NPROC_PER_NODE="2"))
    alone = pmix.Placement(1, 2, ["n1"], "prterun-x-1@1", "", "", "child", 0.0, full=False)
    with pytest.raises(DistEnvError, match=r"rank 0's host alone, which cannot show one process per "
                                           r"host\. Fix: ask for every host"):
        apply(openmpi, Pmix.answer(alone))
    asked = []

    def query(**kwargs):
        asked.append(kwargs["full"])
        return pmix.Placement(1, 2, ["n1", "n2"], "prterun-x-1@1", "", "", "child", 0.0, full=kwargs["full"])

    monkeypatch.setattr(pmix, "query", query)
    found = pmix.Offer("prterun-x-1@1", 1, "prrte", "prted", [], [], "test", None)
    got = Pmix().ask({}, found, 1.0, openmpi, ("master_addr",))
    assert asked == [True] and got.full and got.hosts == ["n1", "n2"]
    per_process = resolve(ompi(1, 2, 1, 2, PMIX_NAMESPACE="prterun-x-1@1"))
    Pmix().ask({}, found, 1.0, per_process, ("master_addr",))
    assert asked == [True, False]  # rank 0's host suffices where the ranks are the workers


# -- what a service fills replaces only distenv's own choices, by kind, not by wording ------------
def test_the_exchange_port_replaces_only_a_port_distenv_chose():
    """Rank 0's free port (published in the exchange) replaces torch's default and a port
    derived from a job id; a MASTER_PORT the user gave stays. The rule reads the provenance's
    kind (distenv.core.description.Why), so rewording the text changes nothing; the notes about the
    port and the world size go once the service filled them (Note.about)."""
    import pickle

    from distenv.discovery import pmi
    from distenv.core.description import DEFAULT, DERIVED, Why, kind_of
    from distenv.discovery.apply import apply
    from distenv.discovery.services import Pmi

    pmi_port = {"PMI_RANK": "1", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}  # no PMI_SIZE
    env = resolve(pmi_port)
    assert kind_of(env.provenance["master_port"]) == DEFAULT and env.master_port == 29500
    assert any("no job id" in n for n in env.notes) and any("no world size" in n for n in env.notes)
    ex = pmi.Exchange(1, 2, ["n1", "n2"], "port", 0.0, "t", "kvs_1_0_x_n1", port=41234)
    got = apply(env, Pmi.answer(ex))
    assert (got.master_port, got.world_size, got.master_addr) == (41234, 2, "n1")
    assert not any("no job id" in n or "no world size" in n for n in got.notes), got.notes
    # Without a published port: one derived from the key-value space name, not 29500.
    derived = apply(env, Pmi.answer(pmi.Exchange(1, 2, ["n1", "n2"], "port", 0.0, "t", "kvs_1_0_x_n1")))
    assert derived.master_port not in (29500, None) and "kvs_1_0_x_n1" in derived.provenance["master_port"]
    # A port derived from a job id (Intel MPI's UUID) is distenv's choice too: replaced.
    intel = resolve({**pmi_port, "PMI_SIZE": "2", "I_MPI_HYDRA_UUID": "u-1"})
    assert kind_of(intel.provenance["master_port"]) == DERIVED
    assert apply(intel, Pmi.answer(ex)).master_port == 41234
    # The user's MASTER_PORT stays; so does any port whose provenance has no kind, whatever it says.
    given = resolve({**pmi_port, "MASTER_PORT": "23456"})
    assert apply(given, Pmi.answer(ex)).master_port == 23456
    reworded = type(env)(env.to_dict(), {**env.provenance, "master_port": "torch's default"}, env.notes)
    assert apply(reworded, Pmi.answer(ex)).master_port == 29500
    # Kinds survive copies, pickling and JSON (as plain text there).
    back = pickle.loads(pickle.dumps(env))
    assert kind_of(back.provenance["master_port"]) == DEFAULT and back == env
    assert isinstance(Why("x", DEFAULT), str) and __import__("json").dumps(Why("x", DEFAULT)) == '"x"'
