"""The resolver on Amazon SageMaker environments (src/distenv/sources/sagemaker.py), written
from its documentation (tests/fixtures/platforms/sagemaker_*.json)."""

import pytest

from distenv import resolve

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
