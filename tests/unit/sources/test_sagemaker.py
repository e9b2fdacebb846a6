"""The resolver on Amazon SageMaker environments (src/distenv/sources/sagemaker.py), written
from its documentation (tests/fixtures/platforms/sagemaker_*.json)."""

import json

import pytest

from distenv import DistEnvError, resolve

from envs import documented


@pytest.mark.parametrize("name", documented("sagemaker"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


def test_torchrun_master_is_kept_over_the_first_host(no_gpus):
    """torchrun per host with a c10d rendezvous at algo-1 may give rank 0 to algo-2 (the real
    run: tests/integration/test_platform_master.py); its MASTER_ADDR names where."""
    env = {"TORCHELASTIC_RUN_ID": "j1", "RANK": "2", "GROUP_RANK": "1", "LOCAL_RANK": "0",
           "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2",
           "MASTER_ADDR": "algo-2", "MASTER_PORT": "29500", "SM_HOSTS": '["algo-1","algo-2"]',
           "SM_CURRENT_HOST": "algo-1", "TRAINING_JOB_NAME": "t"}
    d = resolve(env)
    assert (d.launcher, d.platform, d.master_addr, d.hosts) == ("torchrun", "sagemaker", "algo-2", None)
    assert any("SM_HOSTS" in n and "algo-2 is used" in n for n in d.notes), d.notes


#: SageMaker's TensorFlow toolkit with the parameter_server distribution: one process per
#: host, SM_* variables plus the TF_CONFIG its _build_tf_config writes (a "master" on the first
#: host, a worker per other host, a ps on every host), aws/sagemaker-tensorflow-training-toolkit
#: src/sagemaker_tensorflow_container/training.py (_build_tf_config, _run_worker).
def _tf_ps(task_type, index, current):
    import json

    return {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": current, "SM_NUM_GPUS": "4",
            "TRAINING_JOB_NAME": "tfps",
            "TF_CONFIG": json.dumps({"cluster": {"master": ["algo-1:2222"],
                                                 "ps": ["algo-1:2223", "algo-2:2223"],
                                                 "worker": ["algo-2:2222"]},
                                     "environment": "cloud",
                                     "task": {"index": index, "type": task_type}})}


def test_tensorflow_job_is_one_process_per_task(fake_gpus):
    """Each host's process is one TensorFlow task (it uses every GPU itself), not a per-node
    launch of SM_NUM_GPUS workers (what it resolved to before: world 8, 4 per node)."""
    fake_gpus(4)
    d = resolve(_tf_ps("worker", 0, "algo-2"))
    assert (d.launcher, d.platform, d.launch) == ("tf_config", "sagemaker", "per-process"), d.explain()
    assert (d.rank, d.world_size, d.local_world_size, d.node_rank, d.num_nodes) == (1, 2, 1, 1, 2)
    assert d.master_addr == "algo-1" and d.hosts == ("algo-1", "algo-2")
    m = resolve(_tf_ps("master", 0, "algo-1"))
    assert (m.rank, m.world_size, m.node_rank) == (0, 2, 0)


def test_tensorflow_job_asked_for_workers_per_host_is_per_node(fake_gpus):
    fake_gpus(4)
    d = resolve({**_tf_ps("worker", 0, "algo-2"), "DISTENV_NPROC_PER_NODE": "4"})
    assert (d.launcher, d.launch, d.world_size, d.node_rank) == ("sagemaker", "per-node", 8, 1)


# A heterogeneous cluster (SageMaker's "instance groups"): SM_HOSTS lists every group's hosts,
# but the toolkit distributes over the groups of SM_DISTRIBUTION_INSTANCE_GROUPS only, in
# SM_INSTANCE_GROUPS order, with their first host as master (environment.py's
# get_distribution_hosts, get_master_hostname); its mpirun runs over those hosts.
HETERO = {"SM_HOSTS": '["algo-1","algo-2","algo-3"]', "SM_IS_HETERO": "true",
          "SM_INSTANCE_GROUPS": '["data","gpu"]',
          "SM_INSTANCE_GROUPS_DICT": json.dumps({
              "data": {"instance_group_name": "data", "hosts": ["algo-1"]},
              "gpu": {"instance_group_name": "gpu", "hosts": ["algo-2", "algo-3"]}}),
          "SM_DISTRIBUTION_INSTANCE_GROUPS": '["gpu"]', "TRAINING_JOB_NAME": "j1"}
# rank 3 of SageMaker's mpirun over algo-2 and algo-3, 2 per host, an Open MPI 5 (PMIx only)
RANK3 = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
         "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "1073872897", "PMIX_RANK": "3"}


def test_heterogeneous_mpi_job_runs_on_the_distribution_groups_hosts(no_gpus):
    """It said 3 nodes and master algo-1, a host of the data group that runs no rank."""
    env = resolve({**HETERO, **RANK3, "SM_CURRENT_HOST": "algo-2", "SM_CURRENT_INSTANCE_GROUP": "gpu"})
    assert (env.launcher, env.num_nodes, env.master_addr) == ("openmpi", 2, "algo-2")
    assert env.hosts == ("algo-2", "algo-3") and env.node_rank == 1
    assert env.rank_hosts == ("algo-2", "algo-2", "algo-3", "algo-3")
    assert "SM_DISTRIBUTION_INSTANCE_GROUPS" in env.provenance["master_addr"]


def test_heterogeneous_job_without_a_launcher_is_a_node_of_the_distribution(no_gpus):
    env = resolve({**HETERO, "SM_CURRENT_HOST": "algo-3", "SM_CURRENT_INSTANCE_GROUP": "gpu"})
    assert (env.launcher, env.num_nodes, env.node_rank, env.master_addr) == ("sagemaker", 2, 1, "algo-2")
    with pytest.raises(DistEnvError, match=r"in instance group 'data', which SM_DISTRIBUTION_INSTANCE_"
                                           r"GROUPS does not distribute over.*Fix: "):
        resolve({**HETERO, "SM_CURRENT_HOST": "algo-1", "SM_CURRENT_INSTANCE_GROUP": "data"})


def test_heterogeneous_without_its_group_variables_is_refused_not_guessed(no_gpus):
    env = {**HETERO, **RANK3, "SM_CURRENT_HOST": "algo-2"}
    del env["SM_INSTANCE_GROUPS_DICT"]
    with pytest.raises(DistEnvError, match="which hosts run the job is unknown"):
        resolve(env)


def test_a_homogeneous_cluster_keeps_sm_hosts(no_gpus):
    env = resolve({**HETERO, **RANK3, "SM_IS_HETERO": "false", "SM_CURRENT_HOST": "algo-1"})
    assert env.hosts == ("algo-1", "algo-2", "algo-3") and env.master_addr == "algo-1"
