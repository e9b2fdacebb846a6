"""Every pair of sources that can both be present: agreeing values pass, disagreeing ones
raise a DistEnvError naming both variables — or follow the documented precedence (a
launcher started inside another describes the process; see the README)."""

import json

import pytest

from distenv import DistEnvError, resolve
from envs import hydra_rank, ompi, slurm, torchrun

# rank 1 of 2 on one node (local rank 1 of 2), as each launcher says it.
LAUNCHERS = {
    "openmpi": (ompi(1, 2, 1, 2, node_rank_trap=False),
                {"rank": "OMPI_COMM_WORLD_RANK", "world_size": "OMPI_COMM_WORLD_SIZE",
                 "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK"}),
    "mpich": (hydra_rank(1, 2, 1, 2),
              {"rank": "PMI_RANK", "world_size": "PMI_SIZE", "local_rank": "MPI_LOCALRANKID"}),
    "intelmpi": (hydra_rank(1, 2, 1, 2, HYDRA_BSTRAP_NODE_ID="0", I_MPI_HYDRA_UUID="u-1"),
                 {"rank": "PMI_RANK", "node_rank": "HYDRA_BSTRAP_NODE_ID"}),
    "mvapich2": ({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2",
                  "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
                 {"rank": "MV2_COMM_WORLD_RANK"}),
    "pals": ({"PALS_RANKID": "1", "PMI_RANK": "1", "PMI_SIZE": "2", "PALS_LOCAL_RANKID": "1",
              "PALS_LOCAL_SIZE": "2", "PALS_NODEID": "0"},
             # node_rank: the one-node rule, never PALS_NODEID (sources/pals.py)
             {"rank": "PALS_RANKID"}),
    "flux": ({"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "2", "FLUX_TASK_LOCAL_ID": "1",
              "FLUX_JOB_NNODES": "1", "FLUX_JOB_ID": "f1"},
             {"rank": "FLUX_TASK_RANK", "local_rank": "FLUX_TASK_LOCAL_ID"}),
    "lsf": ({"JSM_NAMESPACE_RANK": "1", "JSM_NAMESPACE_SIZE": "2", "JSM_NAMESPACE_LOCAL_RANK": "1",
             "JSM_NAMESPACE_LOCAL_SIZE": "2", "LSB_JOBID": "3"},
            {"rank": "JSM_NAMESPACE_RANK"}),
    "slurm": ({**slurm(1, nodelist="vm", tasks="2", job="8", ntasks=2, nnodes=1), "SLURM_NTASKS": "2"},
              {"rank": "SLURM_PROCID", "local_rank": "SLURM_LOCALID", "node_rank": "SLURM_NODEID"}),
    "horovodrun": ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
                    "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"},
                   # local rank 1: HOROVOD_CROSS_RANK is no node index there (issue 13)
                   {"rank": "HOROVOD_RANK"}),
    "tf_config": ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1", "h:2"]},
                                            "task": {"type": "worker", "index": 1}})},
                  {"rank": "TF_CONFIG"}),
}
TRUTH = {"rank": 1, "world_size": 2, "local_rank": 1, "local_world_size": 2, "node_rank": 0}
CANONICAL = [("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"),
             ("LOCAL_WORLD_SIZE", "local_world_size"), ("NODE_RANK", "node_rank"),
             ("GROUP_RANK", "node_rank")]
CASES = [(name, var, field) for name in LAUNCHERS for var, field in CANONICAL]


@pytest.mark.parametrize("name, var, field", CASES)
def test_canonical_variable_agreeing_passes(name, var, field):
    env, _ = LAUNCHERS[name]
    got = resolve(dict(env, **{var: str(TRUTH[field])}))
    assert got.launcher == name and getattr(got, field) == TRUTH[field]


@pytest.mark.parametrize("name, var, field", CASES)
def test_canonical_variable_disagreeing_names_both(name, var, field):
    env, origin = LAUNCHERS[name]
    with pytest.raises(DistEnvError) as err:
        resolve(dict(env, **{var: str(TRUTH[field] + 1)}))
    text = str(err.value)
    assert f"{var}={TRUTH[field] + 1}" in text and "contradicts" in text
    # The launcher's own variable (or the rule the value came from) is named too.
    why = resolve(env).provenance[field]
    assert why in text, (why, text)
    if field in origin:
        assert origin[field] in text


@pytest.mark.parametrize("name, var, field", CASES)
def test_every_way_out_the_fix_offers_works(name, var, field):
    """Each alternative of the Fix, applied as written, resolves: unsetting the variable gives
    the launcher's value; DISTENV_LAUNCHER=env is offered only where the torch variables
    alone describe a launch (it used to be offered always, and led to a second error: a
    NODE_RANK beside torchrun's GROUP_RANK, or no RANK at all)."""
    env, _ = LAUNCHERS[name]
    stale = dict(env, **{var: str(TRUTH[field] + 1)})
    with pytest.raises(DistEnvError) as err:
        resolve(stale)
    text = str(err.value)
    assert f"Fix: unset {var}" in text, text
    assert getattr(resolve(env), field) == TRUTH[field]
    offered = "DISTENV_LAUNCHER=env" in text
    try:
        resolve(dict(stale, DISTENV_LAUNCHER="env"))
        works = True
    except DistEnvError:
        works = False
    assert offered == works, text


def test_torchrun_under_a_platform_s_node_rank_is_not_sent_in_a_circle():
    """Azure ML sets NODE_RANK for the node; torchrun's c10d rendezvous numbered it otherwise."""
    env = {**torchrun(0, nodes=2), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "NODE_RANK": "1",
           "AZ_BATCH_MASTER_NODE": "10.0.0.4:6105", "AZUREML_RUN_ID": "run1"}
    with pytest.raises(DistEnvError, match=r"Fix: unset NODE_RANK\.$"):
        resolve(env)
    assert resolve({k: v for k, v in env.items() if k != "NODE_RANK"}).node_rank == 0


# -- sources that own the canonical variables: the cross-check is between their own ----------
def test_torchrun_group_rank_vs_node_rank():
    env = {**torchrun(3, nodes=2, addr="h", port="1"), "TORCHELASTIC_RUN_ID": "r"}
    assert resolve(dict(env, NODE_RANK="1")).node_rank == 1
    with pytest.raises(DistEnvError, match="NODE_RANK=0.*GROUP_RANK=1"):
        resolve(dict(env, NODE_RANK="0"))


def test_deepspeed_cross_rank_vs_node_rank():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "CROSS_RANK": "1",
           "CROSS_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    with pytest.raises(DistEnvError, match="NODE_RANK=0.*CROSS_RANK=1"):
        resolve(dict(env, NODE_RANK="0"))


@pytest.mark.parametrize("env, var", [
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0",
      "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}, "GROUP_RANK=1"),
    ({"CROSS_RANK": "1", "RANK": "0", "WORLD_SIZE": "4", "LOCAL_SIZE": "2", "CROSS_SIZE": "2",
      "LOCAL_RANK": "0"}, "CROSS_RANK=1"),
])
def test_a_launcher_s_node_index_above_the_rank_is_an_error(env, var):
    """Nodes are numbered by their lowest rank (torch assigns ranks agent by agent), so node 1
    cannot hold rank 0: such variables (a stale or hand-set one) resolved as rank 0 on node 1
    (review, 2026-12-08). The same through DistEnv.replace()."""
    with pytest.raises(DistEnvError, match=rf"node_rank=1 \({var}\) is above rank=0 \(RANK=0\).*Fix: "):
        resolve(env)
    ok = resolve(dict(env, RANK="4" if "GROUP_RANK" in env else "2"))
    assert (ok.node_rank, ok.launcher) == (1, "torchrun" if "GROUP_RANK" in env else ok.launcher)
    with pytest.raises(DistEnvError, match=r"node_rank=1 \(replaced by the caller\) is above rank=0"):
        ok.replace(rank=0, node_rank=1)


def test_gcp_rank_vs_cluster_spec_task():
    spec = json.dumps({"cluster": {"master": ["m:1"], "worker": ["w0:1", "w1:1"]},
                       "task": {"type": "worker", "index": 1}})
    assert resolve({"CLUSTER_SPEC": spec, "RANK": "2", "WORLD_SIZE": "3"}).node_rank == 2
    with pytest.raises(DistEnvError, match="RANK=1 contradicts CLUSTER_SPEC"):
        resolve({"CLUSTER_SPEC": spec, "RANK": "1", "WORLD_SIZE": "3"})
    with pytest.raises(DistEnvError, match="WORLD_SIZE=4 contradicts CLUSTER_SPEC"):
        resolve({"CLUSTER_SPEC": spec, "RANK": "2", "WORLD_SIZE": "4"})


def test_kubeflow_v1_world_size_vs_pods_times_nproc():
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "RANK": "1", "MASTER_ADDR": "m",
           "MASTER_PORT": "23456"}
    assert resolve(dict(env, WORLD_SIZE="4")).world_size == 4
    with pytest.raises(DistEnvError, match="WORLD_SIZE=3"):
        resolve(dict(env, WORLD_SIZE="3"))


def test_kubeflow_pet_node_rank_vs_node_rank():
    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
           "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "29500"}
    with pytest.raises(DistEnvError, match="NODE_RANK=0.*PET_NODE_RANK=1"):
        resolve(dict(env, NODE_RANK="0"))


def test_slurm_gtids_vs_procid():
    env, _ = LAUNCHERS["slurm"]
    assert resolve(dict(env, SLURM_GTIDS="0,1")).rank == 1
    with pytest.raises(DistEnvError, match="SLURM_GTIDS"):
        resolve(dict(env, SLURM_GTIDS="0,2"))


def test_sagemaker_current_host_vs_hosts():
    with pytest.raises(DistEnvError, match="SM_CURRENT_HOST"):
        resolve({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-3"})


def test_user_master_port_vs_platform_port_user_wins():
    env = {"TORCHELASTIC_RUN_ID": "r", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    assert resolve(env).master_port == 1234


# -- documented precedence: nested launchers ---------------------------------------------------
TORCHRUN_WORKER = {**torchrun(3, nodes=2, addr="n1"), "TORCHELASTIC_RUN_ID": "r"}


@pytest.mark.parametrize("outer", ["slurm", "openmpi", "mpich", "intelmpi", "flux", "lsf", "pals"])
def test_torchrun_inside_another_launcher_describes_the_worker(outer):
    env = dict(LAUNCHERS[outer][0], **TORCHRUN_WORKER)
    got = resolve(env)
    assert (got.launcher, got.rank, got.node_rank) == ("torchrun", 3, 1)


@pytest.mark.parametrize("mpi", ["openmpi", "mpich", "intelmpi", "mvapich2", "pals"])
def test_mpi_inside_slurm_ignores_the_daemon_tasks(mpi):
    # What the ranks inherit from the srun that started MPI's daemons: task 0 of 1.
    daemons = dict(LAUNCHERS["slurm"][0], SLURM_PROCID="0", SLURM_LOCALID="0",
                   SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1")
    got = resolve(dict(daemons, **LAUNCHERS[mpi][0]))
    assert got.launcher == mpi and got.rank == 1


@pytest.mark.parametrize("outer, inner", [("openmpi", "mpich"), ("mpich", "openmpi"),
                                          ("mvapich2", "mpich"), ("openmpi", "mvapich2")])
def test_two_mpi_launchers_that_disagree_are_an_error_until_one_is_named(outer, inner):
    # The inner launcher's rank 1 of 2 beside the outer one's rank 0 of 1, which every rank of
    # the inner launch inherited: nothing says which is inner (measured for Open MPI and MPICH,
    # tests/integration/test_nested_mpi.py).
    alone = {"openmpi": ompi(0, 1, 0, 1, node_rank_trap=False), "mpich": hydra_rank(0, 1, 0, 1),
             "mvapich2": {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "1",
                          "MV2_COMM_WORLD_LOCAL_RANK": "0", "MV2_COMM_WORLD_LOCAL_SIZE": "1"}}
    env = dict(alone[outer], **LAUNCHERS[inner][0])
    with pytest.raises(DistEnvError, match=r"disagree: rank .* Fix: DISTENV_LAUNCHER=\w+ or \w+") as err:
        resolve(env)
    assert inner in str(err.value) and outer in str(err.value)
    for name, rank in ((inner, 1), (outer, 0)):
        assert resolve(dict(env, DISTENV_LAUNCHER=name)).rank == rank
        assert resolve(env, launcher=name).rank == rank


def test_hydra_pmi_port_rank_0_inside_open_mpi_rank_0_is_an_error_too():
    # -pmi-port gives no size to compare and its rank 0 matches the outer rank 0: the local
    # size (2 against Open MPI's 1) tells (review: rank 0 resolved as rank 0 of 1)
    env = dict(ompi(0, 1, 0, 1, node_rank_trap=False), PMI_ID="0", PMI_PORT="h:1",
               MPI_LOCALRANKID="0", MPI_LOCALNRANKS="2")
    with pytest.raises(DistEnvError, match=r"local_world_size 1 \(OMPI_COMM_WORLD_LOCAL_SIZE=1\) against 2"):
        resolve(env)
    assert resolve(dict(env, DISTENV_LAUNCHER="mpich")).local_world_size == 2


def test_mpi_launchers_that_set_each_others_variables_for_the_same_rank_agree():
    # MVAPICH2 started by Hydra sets MV2_* and Hydra's PMI_* for the same rank.
    env = dict(LAUNCHERS["mvapich2"][0], **LAUNCHERS["mpich"][0])
    assert (resolve(env).launcher, resolve(env).rank, resolve(env).world_size) == ("mvapich2", 1, 2)


def test_launcher_beats_tf_config():
    tf = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})
    got = resolve(dict(LAUNCHERS["slurm"][0], TF_CONFIG=tf))
    assert got.launcher == "slurm" and got.rank == 1


@pytest.mark.parametrize("platform_env, platform", [
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1"}, "kubeflow"),
    ({"CLUSTER_SPEC": json.dumps({"cluster": {"master": ["m:1"], "worker": ["w:1"]},
                                  "task": {"type": "worker", "index": 0}}),
      "CLOUD_ML_JOB_ID": "j"}, "gcp"),
    ({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}, "sagemaker"),
    ({"AZ_BATCH_MASTER_NODE": "10.0.0.4:6105", "AZUREML_RUN_ID": "x"}, "azureml"),
])
def test_torchrun_on_a_platform_describes_the_worker_and_names_the_platform(platform_env, platform):
    got = resolve(dict(platform_env, **TORCHRUN_WORKER))
    assert (got.launcher, got.platform, got.rank) == ("torchrun", platform, 3)


def test_gcp_rank_beats_tf_config_and_tf_config_alone_is_per_process():
    spec = {"cluster": {"master": ["m:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}
    tf = json.dumps({"cluster": {"chief": ["m:1"], "worker": ["w:1"]},
                     "task": {"type": "worker", "index": 0}})
    both = {"CLUSTER_SPEC": json.dumps(spec), "TF_CONFIG": tf}
    assert resolve(dict(both, RANK="1", WORLD_SIZE="2")).launcher == "gcp"
    assert resolve(both).launcher == "tf_config"


def test_azure_overlay_agrees_with_open_mpi():
    env = dict(LAUNCHERS["openmpi"][0], AZ_BATCHAI_MPI_MASTER_NODE="10.0.0.4", AZUREML_RUN_ID="x")
    got = resolve(env)
    assert (got.launcher, got.platform, got.master_addr) == ("openmpi", "azureml", "10.0.0.4")


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "1", "LOCAL_RANK": "3"},
                                 {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "3"}])
def test_local_rank_beyond_the_world_is_an_error(env):
    """No local world size to compare with, but a local rank of 3 in a world of 1 cannot be
    (it used to resolve, and would have picked GPU 3)."""
    with pytest.raises(DistEnvError, match=r"local_rank=3 \(LOCAL_RANK=3\) must be below world_size=1"):
        resolve(env)


# -- the counts must describe one layout (review, 2026-12-07: each returned a wrong value) ------
def _recorded(layout, rank):
    from envs import recorded

    return recorded(layout, rank)


@pytest.mark.parametrize("extra, kwargs, words", [
    # a node count of 1 on the second node's rank made the loopback its master
    ({"OMPI_MCA_orte_num_nodes": "1"}, {}, "num_nodes=1 (OMPI_MCA_orte_num_nodes=1) but local_world_size=2"),
    ({}, {"num_nodes": 1}, "num_nodes=1 (given to resolve()) but local_world_size=2"),
    ({}, {"num_nodes": 4}, "leaves 2 of world_size=4 (OMPI_COMM_WORLD_SIZE=4) for the other 3"),
    # the README's example of a keyword the workers per node contradict, in a per-process launch
    ({}, {"world_size": 16, "nproc_per_node": 2}, "world_size=16 (given to resolve()) is not num_nodes=2"),
])
def test_counts_that_cannot_be_one_layout_are_an_error(extra, kwargs, words, no_gpus):
    env = {**_recorded("cluster-openmpi4-2x2", 2), **extra}
    with pytest.raises(DistEnvError) as err:
        resolve(env, **kwargs)
    assert words in str(err.value) and "Fix:" in str(err.value), err.value


def test_torchrun_counts_that_cannot_be_one_layout_are_an_error(no_gpus):
    env = {**torchrun(0, nodes=2, nproc=2, addr="n0"), "WORLD_SIZE": "6",
           "TORCH_ELASTIC_WORKER_IDENTICAL": "1"}
    with pytest.raises(DistEnvError, match=r"world_size=6 \(WORLD_SIZE=6\) is not num_nodes=2"):
        resolve(env)
    env.update(WORLD_SIZE="4", GROUP_WORLD_SIZE="1")
    with pytest.raises(DistEnvError, match=r"num_nodes=1 \(GROUP_WORLD_SIZE=1\) but local_world_size=2"):
        resolve(env)


@pytest.mark.parametrize("how", ["keyword", "variable"])
def test_workers_per_node_asked_of_a_per_process_launch_are_kept_and_checked(how, no_gpus):
    def ask(env, n):
        return resolve(env, nproc_per_node=n) if how == "keyword" else \
            resolve({**env, "DISTENV_NPROC_PER_NODE": str(n)})

    agreeing = ask(_recorded("cluster-openmpi4-2x2", 2), 2)
    assert (agreeing.launch, agreeing.nproc_per_node, agreeing.world_size) == ("per-process", 2, 4)
    with pytest.raises(DistEnvError, match=r"nproc_per_node=4 \(.*\) cannot exceed world_size=2 \(WORLD_SIZE=2\)"):
        ask({"RANK": "1", "WORLD_SIZE": "2"}, 4)


def test_workers_per_node_that_do_not_divide_the_world_are_an_error_without_a_node_count(no_gpus):
    """mpirun_rsh -np 3 h1 h1 h2 with 2 workers per node asked: h1's rank resolved as 3 ranks,
    2 per node, with no error (review, 2026-12-08); every node runs nproc_per_node."""
    env = {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "3", "MV2_COMM_WORLD_LOCAL_RANK": "0",
           "MV2_COMM_WORLD_LOCAL_SIZE": "2", "DISTENV_NPROC_PER_NODE": "2"}
    with pytest.raises(DistEnvError, match=r"world_size=3 \(MV2_COMM_WORLD_SIZE=3\) is not a multiple of "
                                           r"nproc_per_node=2 \(DISTENV_NPROC_PER_NODE=2\).*Fix: "):
        resolve(env)
    fits = resolve(dict(env, MV2_COMM_WORLD_SIZE="4"))
    assert (fits.world_size, fits.nproc_per_node, fits.num_nodes) == (4, 2, None)


@pytest.mark.parametrize("field, value", [("hosts", 5), ("rank_hosts", 5), ("hosts", "node1"),
                                          ("hosts", ["a b"]), ("hosts", [])])
def test_a_host_list_given_to_resolve_that_is_none_is_one_error(field, value):
    # review, 2026-12-07: an int raised TypeError, a string became one host, "a b" passed
    with pytest.raises(DistEnvError, match=rf"{field}=.* \(given to resolve\(\)\) is not a list of host names\. Fix:"):
        resolve({}, **{field: value})
    assert resolve({}, hosts=["node1"]).hosts == ("node1",)


def test_a_lone_rank_of_a_launcher_without_node_count_proves_no_per_node_layout(no_gpus):
    """mpiexec -n 3 placed 2 + 1, two workers asked per node: the lone rank cannot tell that
    the other node runs two (it counted 3 nodes and 6 workers, and with MASTER_ADDR given
    nothing asked); its node index and count stay unknown, for discovery to prove or refuse."""
    from distenv.discovery.apply import per_node
    from distenv.discovery.apply import Answer

    lone = {**hydra_rank(2, 3, 0, 1), "DISTENV_NPROC_PER_NODE": "2",
            "MASTER_ADDR": "hostA", "MASTER_PORT": "29400"}
    got = resolve(lone)
    assert got.launch == "per-node" and got.nproc_per_node == 2
    assert (got.node_rank, got.num_nodes, got.world_size) == (None, None, None)
    assert any("-n 3 may place 2 + 1" in n for n in got.notes), got.notes
    with pytest.raises(DistEnvError, match="found 3 processes on 2 hosts"):
        per_node(got, Answer("pmi", 2, 3, ["hostA", "hostA", "hostB"], "PMI-1"))
    # the launcher that gives its node count proves one process per node (SLURM: 2 nodes, 2 tasks)
    slurmed = resolve({**slurm(1, nodelist="n[1-2]", tasks="1(x2)", job="8", ntasks=2, nnodes=2,
                                             nodeid=1, localid=0),
                       "DISTENV_NPROC_PER_NODE": "2"})
    assert (slurmed.node_rank, slurmed.num_nodes, slurmed.world_size) == (1, 2, 4)


def test_node_rank_given_where_the_launcher_gives_none_is_read_and_bounded():
    """The Fixes say "set MASTER_ADDR (and NODE_RANK)": NODE_RANK was only cross-checked, so
    where the launcher gives no node index it was ignored. Now read as given by the user,
    within what the counts allow (2 ranks elsewhere: at most 2 nodes before this one)."""
    env = {**hydra_rank(2, 4, 0, 2), "MASTER_ADDR": "hostA", "NODE_RANK": "1"}
    got = resolve(env)
    assert got.node_rank == 1 and got.provenance["node_rank"] == "NODE_RANK (given by the user)"
    with pytest.raises(DistEnvError, match=r"NODE_RANK=3 \(given by the user\) is above rank=2 "
                                           r"\(PMI_RANK=2\): node k's lowest rank is at least k"):
        resolve({**env, "NODE_RANK": "3"})  # rank 0 can only be on node 0, rank 2 on node <= 2
    last = {**hydra_rank(3, 4, 1, 2), "MASTER_ADDR": "hostA", "NODE_RANK": "3"}
    with pytest.raises(DistEnvError, match=r"node_rank=3 \(NODE_RANK \(given by the user\)\) but "
                                           r"local_world_size=2 .* leaves 2 of world_size=4"):
        resolve(last)


def test_hydra_pmi_port_reads_pmi_id_not_an_outer_launch_s_pmi_rank():
    """Measured by a review (MPICH 4): mpiexec -pmi-port sets PMI_ID and PMI_PORT only and
    passes on the PMI_RANK/PMI_SIZE it inherited (an outer srun --mpi=pmi2 step's): both
    ranks were rank 0 of 4."""
    port = {"PMI_ID": "1", "PMI_PORT": "h:1", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    with pytest.raises(DistEnvError, match=r"PMI_ID=1 \(Hydra -pmi-port: this rank\) but PMI_RANK=0, "
                                           r"PMI_SIZE=4 came with .* Fix: unset PMI_RANK PMI_SIZE PMI_FD"):
        resolve({**port, "PMI_RANK": "0", "PMI_SIZE": "4"})
    agreeing = resolve({**port, "PMI_RANK": "1", "PMI_SIZE": "4"})
    assert (agreeing.rank, agreeing.world_size) == (1, None)  # the size is the outer launch's
    # the note's Fix works: WORLD_SIZE given where the launcher gives no size
    given = resolve({**port, "WORLD_SIZE": "2"})
    assert given.world_size == 2 and given.provenance["world_size"] == "WORLD_SIZE (given by the user)"
    with pytest.raises(DistEnvError, match=r"rank=1 \(PMI_ID=1\) must be below world_size=1"):
        resolve({**port, "WORLD_SIZE": "1"})


def test_flux_with_a_task_per_node_is_a_per_node_launch_and_local_ranks_leave_every_node_one():
    flux = {"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "2", "FLUX_TASK_LOCAL_ID": "0",
            "FLUX_JOB_NNODES": "2", "FLUX_JOB_ID": "f1"}
    got = resolve({**flux, "DISTENV_NPROC_PER_NODE": "4"})
    assert (got.launch, got.node_rank, got.num_nodes, got.world_size) == ("per-node", 1, 2, 8)
    # local id 3 of 4 tasks on 2 nodes: the other node would hold none
    with pytest.raises(DistEnvError, match=r"local_rank=3 \(FLUX_TASK_LOCAL_ID=3\) leaves fewer than 1 "):
        resolve({**flux, "FLUX_TASK_RANK": "3", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "3"})
