"""The resolver on hand-written launcher environments (recorded ones: test_recorded.py)."""

import pytest

from distenv import DistEnvError, resolve
from distenv.ports import port_for
from envs import ompi, slurm_task


def test_single_process_defaults():
    env = resolve({})
    assert (env.launcher, env.launch, env.platform) == ("none", "per-process", None)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (0, 0, 1, 1)
    assert (env.node_rank, env.num_nodes, env.nproc_per_node) == (0, 1, 1)
    assert env.master_addr == "127.0.0.1"
    assert 20000 <= env.master_port < 30000
    assert not env.is_distributed and env.is_main


def test_openmpi_one_node_uses_loopback_and_job_port():
    uri = "2197356545.0;tcp://192.0.2.2:41231"
    env = resolve(ompi(2, 4, 2, 4, OMPI_MCA_orte_hnp_uri=uri, OMPI_MCA_ess_base_jobid="2197356545"))
    assert env.launcher == "openmpi"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (2, 4, 2, 4)
    assert (env.node_rank, env.num_nodes, env.nproc_per_node) == (0, 1, 4)
    assert env.master_addr == "127.0.0.1"
    assert env.master_port == resolve(ompi(0, 4, 0, 4, OMPI_MCA_orte_hnp_uri=uri,
                                           OMPI_MCA_ess_base_jobid="2197356545")).master_port


def test_openmpi_node_rank_trap_is_not_used():
    # 2x2 on two nodes: OMPI_COMM_WORLD_NODE_RANK is 1 for rank 3, yet the node index is unknown.
    env = resolve(ompi(3, 4, 1, 2, OMPI_MCA_orte_num_nodes="2",
                       OMPI_MCA_orte_hnp_uri="1.0;tcp://10.1.0.1,10.2.0.1:5000"))
    assert env.node_rank is None
    assert env.num_nodes == 2
    assert env.master_addr == "10.1.0.1"
    assert "OMPI_MCA_orte_hnp_uri" in env.provenance["master_addr"]


def test_openmpi5_across_nodes_has_no_master_address():
    # Issue 13: PRRTE maps by its host list, which no rank sees (measured: -H node2:2,node1:2
    # from node1 put rank 0 on node2), so the mpirun host in PMIX_NAMESPACE proves nothing.
    env = resolve(ompi(1, 4, 1, 2, PMIX_NAMESPACE="prterun-gpu-node-7-12345@1", OMPI_WORLD_SIZE="4"))
    assert env.master_addr is None and any("MASTER_ADDR" in n for n in env.notes)
    assert env.job_id == "prterun-gpu-node-7-12345@1"
    assert resolve(ompi(1, 4, 1, 2, PMIX_NAMESPACE="prterun-gpu-node-7-12345@1",
                        MASTER_ADDR="gpu-node-7")).master_addr == "gpu-node-7"


def test_openmpi5_out_of_order_local_ranks_are_taken_as_given():
    # -np 4 on one node under Open MPI 5: rank 1 has local rank 2.
    env = resolve(ompi(1, 4, 2, 4, PMIX_NAMESPACE="prterun-vm-99@1"))
    assert (env.rank, env.local_rank, env.node_rank) == (1, 2, 0)


def test_stale_rank_from_shell_is_an_error_naming_both():
    with pytest.raises(DistEnvError) as err:
        resolve(ompi(1, 2, 1, 2, RANK="0", WORLD_SIZE="2"))
    assert "RANK=0" in str(err.value) and "OMPI_COMM_WORLD_RANK=1" in str(err.value)


def test_agreeing_canonical_variables_pass():
    env = resolve(ompi(1, 2, 1, 2, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1"))
    assert env.rank == 1


def test_wrong_hand_computed_node_rank_is_caught():
    # Azure's old recipe computed NODE_RANK wrongly; a contradiction must not pass.
    with pytest.raises(DistEnvError, match="NODE_RANK=1"):
        resolve(slurm_task(1, 4, 1, 0, 2, "n[1-2]", "2(x2)", NODE_RANK="1"))


def test_mpich_hydra():
    env = resolve({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
                   "PMI_FD": "6"})
    assert env.launcher == "mpich"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert env.node_rank is None and env.master_addr is None


def test_mpich_pmi_port_has_no_world_size():
    env = resolve({"PMI_ID": "1", "PMI_PORT": "vm:3333", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert env.rank == 1 and env.world_size is None
    assert any("pmi-port" in n for n in env.notes)
    with pytest.raises(DistEnvError, match="WORLD_SIZE"):
        env.export({})


def test_intel_mpi_gives_node_id():
    env = resolve({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
                   "HYDRA_BSTRAP_NODE_ID": "1", "I_MPI_ROOT": "x"})
    assert env.launcher == "intelmpi" and env.node_rank == 1


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


def test_slurm_batch_script_is_one_process_not_task_zero():
    batch = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
             "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "0"}
    env = resolve(batch)
    assert env.launcher == "none" and env.world_size == 1 and env.job_id == "9"
    assert any("srun" in n for n in env.notes)


def test_slurm_batch_step_id_marker_is_not_a_task():
    env = resolve(slurm_task(0, 4, 0, 0, 2, "n[1-2]", "2(x2)", step="4294967294"))
    assert env.launcher == "none"


def test_mpirun_inside_slurm_allocation_ignores_daemon_variables():
    env = ompi(3, 4, 1, 2, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_orte_hnp_uri="5.0;tcp://10.0.0.1:1")
    # What Open MPI ranks inherit from the srun that started the daemons.
    env.update(slurm_task(0, 2, 0, 0, 2, "n[1-2]", "1(x2)", step="0"))
    got = resolve(env)
    assert got.launcher == "openmpi" and got.rank == 3 and got.local_rank == 1


def test_torchrun_inside_srun_describes_the_worker():
    env = slurm_task(1, 2, 0, 1, 2, "n[1-2]", "1(x2)")
    env.update({"TORCHELASTIC_RUN_ID": "abc", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
                "MASTER_ADDR": "n1", "MASTER_PORT": "29400"})
    got = resolve(env)
    assert got.launcher == "torchrun"
    assert (got.rank, got.local_rank, got.node_rank, got.num_nodes) == (3, 1, 1, 2)
    assert (got.master_addr, got.master_port, got.job_id) == ("n1", 29400, "abc")


def test_deepspeed_launcher():
    env = resolve({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_SIZE": "4",
                   "CROSS_RANK": "1", "CROSS_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"})
    assert env.launcher == "deepspeed"
    assert (env.local_world_size, env.node_rank, env.num_nodes) == (4, 1, 2)


def test_horovodrun_gloo():
    env = resolve({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
                   "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.9", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4000"})
    assert env.launcher == "horovodrun" and env.master_addr == "127.0.0.1"
    assert env.master_port == port_for("horovod:10.0.0.9:4000")


def test_mvapich2_pals_flux_lsf():
    mv = resolve({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2",
                  "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"})
    assert mv.launcher == "mvapich2" and mv.local_rank == 1
    pals = resolve({"PALS_RANKID": "5", "PMI_RANK": "5", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "1",
                    "PALS_LOCAL_SIZE": "4", "PALS_NODEID": "1", "PALS_APID": "a1", "PBS_JOBID": "42.pbs"})
    assert (pals.launcher, pals.rank, pals.world_size, pals.node_rank) == ("pals", 5, 8, 1)
    assert pals.local_world_size == 4 and pals.master_addr is None
    flux = resolve({"FLUX_TASK_RANK": "2", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "0",
                    "FLUX_JOB_NNODES": "2", "FLUX_JOB_ID": "f123"})
    assert (flux.launcher, flux.rank, flux.num_nodes, flux.local_world_size) == ("flux", 2, 2, None)
    lsf = resolve({"JSM_NAMESPACE_RANK": "1", "JSM_NAMESPACE_SIZE": "2", "JSM_NAMESPACE_LOCAL_RANK": "1",
                   "JSM_NAMESPACE_LOCAL_SIZE": "2", "LSB_JOBID": "7"})
    assert (lsf.launcher, lsf.num_nodes, lsf.master_addr) == ("lsf", 1, "127.0.0.1")


def test_plain_env_variables():
    env = resolve({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                   "MASTER_PORT": "1234"})
    assert (env.launcher, env.rank, env.master_addr, env.master_port) == ("env", 1, "10.0.0.1", 1234)


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"WORLD_SIZE": "4"}, {"LOCAL_RANK": "2"}])
def test_partial_torch_variables_are_errors(env):
    with pytest.raises(DistEnvError):
        resolve(env)


def test_world_size_one_alone_is_a_single_process():
    assert resolve({"WORLD_SIZE": "1"}).rank == 0
    assert resolve({"LOCAL_RANK": "0"}).launcher == "none"


@pytest.mark.parametrize("value", ["abc", "-1", "", "1.5", "٣", "1_0", "99999999999999", " "])
def test_non_numeric_rank_names_the_variable(value):
    with pytest.raises(DistEnvError) as err:
        resolve(ompi(0, 2, 0, 2) | {"OMPI_COMM_WORLD_RANK": value})
    assert "OMPI_COMM_WORLD_RANK" in str(err.value)


def test_local_rank_beyond_local_size():
    with pytest.raises(DistEnvError, match="local_rank=2"):
        resolve(ompi(0, 4, 2, 2))


def test_rank_beyond_world():
    with pytest.raises(DistEnvError, match="OMPI_COMM_WORLD_SIZE"):
        resolve(ompi(4, 4, 0, 4))


def test_user_master_port_and_addr_win():
    env = resolve(slurm_task(0, 2, 0, 0, 2, "n[1-2]", "1(x2)", MASTER_PORT="31000", MASTER_ADDR="ib-n1"))
    assert (env.master_addr, env.master_port) == ("ib-n1", 31000)
    assert "user" in env.provenance["master_port"]


def test_keyword_overrides_win_over_everything():
    env = resolve(ompi(1, 2, 1, 2), master_addr="h", master_port=1111, world_size=2)
    assert (env.master_addr, env.master_port) == ("h", 1111)
    assert env.provenance["master_addr"] == "given to resolve()"
    with pytest.raises(TypeError):
        resolve({}, bogus=1)


def test_distenv_launcher_forces_and_disables():
    env = ompi(1, 2, 1, 2)
    assert resolve(env | {"DISTENV_LAUNCHER": "none"}).world_size == 1
    with pytest.raises(DistEnvError, match="SLURM"):
        resolve(env | {"DISTENV_LAUNCHER": "slurm"})
    with pytest.raises(DistEnvError, match="unknown launcher"):
        resolve(env | {"DISTENV_LAUNCHER": "nonsense"})
    # Forcing the torch variables over an MPI launch trusts them.
    got = resolve(env | {"DISTENV_LAUNCHER": "env", "RANK": "0", "WORLD_SIZE": "2"})
    assert got.launcher == "env" and got.rank == 0
    assert resolve(env, launcher="openmpi").rank == 1


def test_per_node_by_request_from_mpi_one_process_per_node(no_gpus):
    env = ompi(1, 2, 0, 1, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_orte_hnp_uri="3.0;tcp://10.0.0.1:9",
               DISTENV_NPROC_PER_NODE="2")
    got = resolve(env)
    assert got.launch == "per-node"
    assert (got.node_rank, got.num_nodes, got.nproc_per_node) == (1, 2, 2)
    assert (got.world_size, got.local_world_size, got.rank, got.local_rank) == (4, 2, None, None)
    assert got.master_addr == "10.0.0.1"
    written = got.export({})
    assert "RANK" not in written and written["NODE_RANK"] == "1"


def test_nproc_request_contradicting_launcher_is_an_error():
    with pytest.raises(DistEnvError, match="DISTENV_NPROC_PER_NODE"):
        resolve(ompi(1, 4, 1, 4, DISTENV_NPROC_PER_NODE="2"))


def test_single_process_asked_for_two_workers_is_a_one_node_per_node_launch():
    got = resolve({"DISTENV_NPROC_PER_NODE": "2"})
    assert got.launch == "per-node" and got.world_size == 2 and got.master_addr == "127.0.0.1"


def test_explain_names_every_field():
    text = resolve(slurm_task(1, 2, 1, 0, 1, "vm", "2")).explain()
    for field in ("rank", "SLURM_PROCID", "master_port", "SLURM_STEP_NODELIST"):
        assert field in text


def test_resolve_does_not_write_the_environment():
    env = ompi(1, 2, 1, 2)
    before = dict(env)
    resolve(env)
    assert env == before


def test_openmpi5_two_nodes_every_rank_leaves_the_master_unknown():
    # Issue 13: rank 2 on node1 of `-H node2:2,node1:2` sees what rank 0 of `-H node1:2,node2:2`
    # sees (mpirun's daemon, same namespace); no rank can prove rank 0's host, so none names one.
    base = ompi(0, 4, 0, 2, PMIX_NAMESPACE="prterun-node1-4242@1", PMIX_HOSTNAME="node1")
    got = resolve(dict(base, PMIX_SERVER_URI4="prterun-node1-4242@0.0;tcp4://127.0.0.1:1"))
    assert got.master_addr is None and any("MASTER_ADDR" in n for n in got.notes)
    other = ompi(2, 4, 0, 2, PMIX_NAMESPACE="prterun-node1-4242@1", PMIX_HOSTNAME="node2",
                 PMIX_SERVER_URI4="prterun-node1-4242@0.1;tcp4://127.0.0.1:1")
    assert resolve(other).master_addr is None
    assert got.master_port == resolve(other).master_port


def test_openmpi5_mpirun_outside_the_job_gives_no_master():
    env = ompi(0, 4, 0, 2, PMIX_NAMESPACE="prterun-vm-31601@1", PMIX_HOSTNAME="node1",
               PMIX_SERVER_URI4="prterun-vm-31601@0.1;tcp4://127.0.0.1:45067")
    got = resolve(env)
    assert got.master_addr is None and any("MASTER_ADDR" in n for n in got.notes)


def test_distenv_pickles_and_copies():
    import copy
    import pickle

    env = resolve({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
                   "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
                   "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "vm",
                   "SLURM_STEP_TASKS_PER_NODE": "2"})
    back = pickle.loads(pickle.dumps(env))
    assert back == env and back.provenance == env.provenance and back.hosts == ("vm",)
    assert copy.deepcopy(env) == env
