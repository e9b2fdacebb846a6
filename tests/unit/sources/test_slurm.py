"""The resolver on SLURM environments written by hand (src/distenv/sources/slurm.py): srun
tasks, and the batch script or allocation that is not one; recorded ones: test_recorded.py."""

import pytest

from distenv import DistEnvError, resolve
from distenv.core.ports import port_for
from envs import slurm_task


def test_slurm_pmi2_without_hydra_is_slurm():
    env = resolve(slurm_task(1, 2, 1, 0, 1, "vm", "2", PMI_RANK="1", PMI_SIZE="2", PMI_FD="5"))
    assert env.launcher == "slurm" and env.rank == 1


def test_slurm_block_two_nodes():
    env = resolve(slurm_task(3, 4, 1, 1, 2, "node[1-2]", "2(x2)"))
    assert (env.rank, env.local_rank, env.node_rank, env.num_nodes) == (3, 1, 1, 2)
    assert env.local_world_size == 2 and env.nproc_per_node == 2
    assert env.hosts == ("node1", "node2") and env.master_addr == "node1"
    assert env.job_id == "77" and env.master_port == port_for("slurm:77.0")


def test_slurm_uneven_tasks():
    env = resolve(slurm_task(2, 3, 0, 1, 2, "node[1-2]", "2,1"))
    assert env.local_world_size == 1 and env.nproc_per_node is None and env.node_rank == 1


def test_slurm_cyclic_uses_gtids():
    env = resolve(slurm_task(2, 4, 1, 0, 2, "node[1-2]", "2(x2)", SLURM_GTIDS="0,2",
                             SLURM_DISTRIBUTION="cyclic"))
    assert (env.rank, env.local_rank, env.node_rank) == (2, 1, 0)


def test_slurm_arbitrary_distribution_has_no_master():
    env = resolve(slurm_task(0, 2, 0, 0, 2, "node[1-2]", "1(x2)", SLURM_DISTRIBUTION="arbitrary"))
    assert env.master_addr is None
    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        env.export({})


@pytest.mark.parametrize("dist,procid,nodeid", [("arbitrary", 0, 1), ("arbitrary", 1, 0)])
def test_one_task_per_node_made_per_node_under_arbitrary_places_no_worker(dist, procid, nodeid):
    """srun -N2 --ntasks-per-node=1 --distribution=arbitrary, each task a node of 4 workers
    (DISTENV_NPROC_PER_NODE=4): the node is numbered by its task rank, but the step's node
    list is in SLURM_NODEID order, and task 0 may run on node 1 (measured, docs/launchers.md).
    Workers 0-3 run on task 0's node, not on the list's first host: unknown, never
    ('node1',)*4 for the workers of node2."""
    env = resolve(slurm_task(procid, 2, 0, nodeid, 2, "node[1-2]", "1(x2)",
                             SLURM_DISTRIBUTION=dist, DISTENV_NPROC_PER_NODE="4"))
    assert env.launch == "per-node" and env.node_rank == procid and env.num_nodes == 2
    assert env.hosts == ("node1", "node2") and env.world_size == 8
    assert env.rank_hosts is None and "not in node-rank order" in env.provenance["rank_hosts"]
    assert env.master_addr is None


@pytest.mark.parametrize("dist", [None, "block", "cyclic"])
def test_one_task_per_node_made_per_node_places_workers_in_list_order(dist):
    """Block and cyclic put task k on node k: the list is in node-rank order."""
    extra = {"SLURM_DISTRIBUTION": dist} if dist else {}
    env = resolve(slurm_task(1, 2, 0, 1, 2, "node[1-2]", "1(x2)", DISTENV_NPROC_PER_NODE="2",
                             **extra))
    assert env.launch == "per-node" and env.node_rank == 1
    assert env.rank_hosts == ("node1", "node1", "node2", "node2") and env.master_addr == "node1"


def test_slurm_batch_script_is_one_process_not_task_zero():
    batch = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
             "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "0"}
    env = resolve(batch)
    assert env.launcher == "none" and env.world_size == 1 and env.job_id == "9"
    assert any("srun" in n for n in env.notes)


def test_slurm_batch_step_id_marker_is_not_a_task():
    env = resolve(slurm_task(0, 4, 0, 0, 2, "n[1-2]", "2(x2)", step="4294967294"))
    assert env.launcher == "none"


def test_an_arbitrary_step_without_a_plugin_names_the_plugins_that_place_it():
    """srun --mpi=none: no service can tell a task where task 0 runs; the note and discovery's
    answer name the plugins that can (recorded: the pmi2 arbitrary run, as --mpi=none would
    give it), and the note goes once a service filled the fields."""
    import json
    import os

    from distenv.core.description import DECLINED
    from distenv.discovery import complete

    path = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "launchers",
                        "cluster-srun-pmi2-n4-arbitrary.json")
    with open(path) as f:
        env = {k: v for k, v in json.load(f)["ranks"][0]["env"].items() if not k.startswith("PMI_")}
    env["SLURM_MPI_TYPE"] = "none"
    got = resolve(env)
    (doubt,) = [n for n in got.notes if "SLURM_DISTRIBUTION=arbitrary" in n]
    assert "srun --mpi=pmix or --mpi=cray_shasta" in doubt and "distenv.discover()" not in doubt
    done = complete(got, need=("master_addr",), environ=env)
    (said,) = [n for n in done.notes if getattr(n, "kind", None) == DECLINED]
    assert said.startswith("discovery found no service of slurm to ask") and "--mpi=pmix" in said
    with_pmi2 = resolve({**env, "SLURM_MPI_TYPE": "pmi2"})
    assert any("call distenv.discover() (it asks the --mpi=pmi2 service)" in n for n in with_pmi2.notes)


# -- the distribution must place the task on its own node (review, 2026-12-07) -------------------
@pytest.mark.parametrize("procid, localid, nodeid, nodes, tpn, extra", [
    # task 0 on node 1 of a block step: "task 0 on node 0" does not hold; it gave master node1
    (0, 0, 1, "node[1-2]", "2(x2)", {"SLURMD_NODENAME": "node2", "SLURM_GTIDS": "0,1"}),
    # one component of srun -w n3 : -w n1,n2 as it sees itself (written from the het-step signs)
    (1, 0, 0, "node[1-3]", "1(x3)", {"SLURMD_NODENAME": "node1", "SLURM_GTIDS": "1"}),
    # a distribution this module cannot deal: it gave the first host as master
    (0, 0, 0, "node[1-2]", "2(x2)", {"SLURM_DISTRIBUTION": "bogus"}),
])
def test_a_task_its_distribution_does_not_place_on_its_node_has_no_master(procid, localid, nodeid,
                                                                           nodes, tpn, extra):
    ntasks = sum(int(c.split("(")[0]) * (int(c.split("x")[1].rstrip(")")) if "x" in c else 1)
                 for c in tpn.split(","))
    n = 3 if nodes.endswith("3]") else 2
    env = resolve(slurm_task(procid, ntasks, localid, nodeid, n, nodes, tpn, **extra))
    assert (env.master_addr, env.node_rank, env.rank_hosts) == (None, None, None), env
    assert any("SLURM_DISTRIBUTION=" in note and "Fix:" in note for note in env.notes), env.notes
    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        env.export({})


@pytest.mark.parametrize("tpn, gtids, procid, localid, words", [
    ("0,2", "0,1", 0, 0, "SLURM_STEP_TASKS_PER_NODE gives node 0 no task"),
    ("2(x2)", "0,1", 1, 0, "SLURM_LOCALID=0 but SLURM_GTIDS='0,1' gives local task 0 another rank"),
])
def test_counts_and_local_ids_slurm_never_writes_are_an_error(tpn, gtids, procid, localid, words):
    ntasks = 2 if tpn == "0,2" else 4
    env = slurm_task(procid, ntasks, localid, 1 if tpn == "0,2" else 0, 2, "node[1-2]", tpn,
                     SLURM_GTIDS=gtids)
    with pytest.raises(DistEnvError) as err:
        resolve(env)
    assert words in str(err.value) and "Fix:" in str(err.value), err.value
