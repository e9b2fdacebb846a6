"""The resolver with no launcher (src/distenv/sources/single.py): one process, rank 0 of 1, also
in a plain Kubernetes pod (tests/fixtures/platforms/plain_kubernetes_pod.json)."""

import pytest

from distenv import DistEnvError, resolve
from envs import documented


@pytest.mark.parametrize("name", documented("single"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


def test_single_process_defaults():
    env = resolve({})
    assert (env.launcher, env.launch, env.platform) == ("none", "per-process", None)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (0, 0, 1, 1)
    assert (env.node_rank, env.num_nodes, env.nproc_per_node) == (0, 1, 1)
    assert env.master_addr == "127.0.0.1"
    assert 20000 <= env.master_port < 30000
    assert not env.is_distributed and env.is_main


# The peer's case: Lightning's SLURMEnvironment test (tests_fabric/plugins/environments/
# test_slurm.py, test_attributes_from_environment_variables) builds task variables with no step:
# SLURM_PROCID=1, SLURM_LOCALID=2, SLURM_NODEID=3. distenv answered "rank 0 of 1" by its
# batch-script rule, but a batch script is always task 0 on node 0 (recorded:
# tests/fixtures/launchers/cluster-sbatch-script.json): such an environment is no batch script.
LIGHTNING_SLURM_CASE = {"SLURM_NODELIST": "1.1.1.1, 1.1.1.2", "SLURM_JOB_ID": "0001234",
                        "SLURM_NTASKS": "20", "SLURM_NTASKS_PER_NODE": "10", "SLURM_LOCALID": "2",
                        "SLURM_PROCID": "1", "SLURM_NODEID": "3", "SLURM_JOB_NAME": "JOB"}


@pytest.mark.parametrize("var", ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"])
def test_srun_task_variables_without_a_step_are_an_error_not_rank_0(var):
    case = {**LIGHTNING_SLURM_CASE, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
            var: "1"}
    with pytest.raises(DistEnvError, match=f"{var}='1'.*SLURM_STEP_ID.*Fix: "):
        resolve(case)
    with pytest.raises(DistEnvError, match="SLURM_PROCID='1'"):
        resolve(LIGHTNING_SLURM_CASE)


def test_the_recorded_batch_script_is_still_one_process():
    from envs import recorded

    env = resolve(recorded("cluster-sbatch-script", 0))
    assert (env.launcher, env.rank, env.world_size) == ("none", 0, 1)
    assert any("batch script" in n for n in env.notes)


def test_forced_none_in_an_srun_task_is_not_refused():
    env = resolve({**LIGHTNING_SLURM_CASE, "SLURM_STEP_ID": "0", "DISTENV_LAUNCHER": "none"})
    assert (env.launcher, env.rank) == ("none", 0)


@pytest.mark.parametrize("var", ["KUBERNETES_SERVICE_HOST", "TPU_ACCELERATOR_TYPE", "PJRT_DEVICE"])
def test_a_platform_frameworks_detect_is_noted_not_proven_single(var):
    env = resolve({var: "x"})
    assert env.launcher == "none"
    assert any(var in n and "not a proof" in n and "Fix:" in n for n in env.notes), env.notes
