"""The resolver on Ray Train's workers (src/distenv/sources/ray.py).

The environments are recorded from real Ray 2.60 workers (tests/fixtures/frameworks/ray-*.json,
written from tests/e2e/ray_probe.py's records): the driver inside `srun -N1 -n1` (2 workers),
and integrations/ray/ray.sbatch on the two namespace nodes (4 workers, each node's `ray start`
in a one-task step of its own). Each rank's expected place is Ray's own
(`ray.train.get_context()`, recorded beside the environment), never an earlier distenv output.
"""
import json
from pathlib import Path

import pytest

from distenv import DistEnvError, resolve

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "frameworks"


def ranks(layout):
    return json.loads((FIXTURES / f"{layout}.json").read_text())["ranks"]


@pytest.mark.parametrize("layout,nodes", [("ray-srun-np2", 1), ("ray-sbatch-2x2", None)])
def test_every_recorded_worker_is_where_ray_put_it(layout, nodes):
    for r in ranks(layout):
        env = resolve(r["env"])
        assert env.launcher == "ray" and env.launch == "per-process"
        for field, value in r["ray_context"].items():
            assert getattr(env, field) == value, (field, env.explain())
        assert env.provenance["rank"] == f"RANK={r['ray_context']['rank']}"
        assert env.master_addr == r["node_ips"][0] == r["env"]["MASTER_ADDR"]
        assert env.master_port == int(r["env"]["MASTER_PORT"])
        assert env.job_id == r["env"]["RAY_JOB_ID"]
        assert env.num_nodes == nodes  # Ray gives no node count; one node is proven by count


def test_the_inherited_slurm_step_is_the_one_of_ray_start_not_the_worker():
    """Without Ray's source the step's variables would contradict Ray's (the reported bug)."""
    (_, worker) = ranks("ray-srun-np2")
    assert (worker["env"]["SLURM_PROCID"], worker["env"]["SLURM_STEP_NUM_TASKS"]) == ("0", "1")
    assert worker["env"]["RANK"] == "1"
    without_ray = {k: v for k, v in worker["env"].items() if k != "RAY_RAYLET_PID"}
    with pytest.raises(DistEnvError, match="contradicts"):
        resolve(without_ray)
    # node2's worker: its step says node 0 of a one-node step, Ray says node 1
    far = [r for r in ranks("ray-sbatch-2x2") if r["hostname"] == "node2"][0]
    assert far["env"]["SLURM_NODEID"] == "0" and far["env"]["NODE_RANK"] == "1"
    assert resolve(far["env"]).node_rank == 1


def test_a_contradiction_inside_rays_own_variables_is_still_an_error():
    env = dict(ranks("ray-srun-np2")[1]["env"], RANK="2")  # RANK 2 of WORLD_SIZE 2
    with pytest.raises(DistEnvError, match="RANK"):
        resolve(env)
    env = dict(ranks("ray-srun-np2")[1]["env"], LOCAL_RANK="2")  # of LOCAL_WORLD_SIZE 2
    with pytest.raises(DistEnvError, match="LOCAL_RANK"):
        resolve(env)


def test_train_variables_without_rank_or_world_size_are_an_error():
    with pytest.raises(DistEnvError, match="without WORLD_SIZE.*Ray Train sets all"):
        resolve({"RAY_RAYLET_PID": "7", "RANK": "0", "LOCAL_RANK": "0"})


def test_a_plain_ray_task_inside_a_slurm_step_is_refused_not_read_as_the_step():
    env = {k: v for k, v in ranks("ray-srun-np2")[0]["env"].items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                        "MASTER_ADDR", "MASTER_PORT")}
    with pytest.raises(DistEnvError, match="not a Ray Train worker.*SLURM_PROCID=0") as err:
        resolve(env)
    assert "\n" not in str(err.value) and "Fix: " in str(err.value)
    assert resolve(env, launcher="none").world_size == 1  # the fix it gives works


def test_a_plain_ray_task_elsewhere_is_whatever_else_its_environment_says():
    assert resolve({"RAY_RAYLET_PID": "7"}).launcher == "none"
    # Ray's MPI runtime environment starts the worker under mpirun, inside a SLURM step here
    mpi = {"RAY_RAYLET_PID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_JOB_ID": "3",
           "SLURM_STEP_NUM_TASKS": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    env = resolve(mpi)
    assert (env.launcher, env.rank, env.world_size) == ("openmpi", 1, 2)


def test_launchers_started_inside_ray_workers_come_first():
    worker = ranks("ray-srun-np2")[1]["env"]
    torchrun = dict(worker, TORCHELASTIC_RUN_ID="x", RANK="3", WORLD_SIZE="4", LOCAL_RANK="1",
                    LOCAL_WORLD_SIZE="2", GROUP_RANK="0")
    assert resolve(torchrun).launcher == "torchrun"
    horovod = dict(worker, HOROVOD_RANK="1", HOROVOD_SIZE="2", HOROVOD_LOCAL_RANK="1",
                   HOROVOD_LOCAL_SIZE="2")
    horovod = {k: v for k, v in horovod.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                              "LOCAL_WORLD_SIZE", "NODE_RANK")}
    assert resolve(horovod).launcher == "horovodrun"


def test_the_notes_and_fixes_speak_of_ray():
    env = resolve(ranks("ray-sbatch-2x2")[2]["env"])
    (note,) = [n for n in env.notes if "unknown here" in n]
    assert "num_nodes" in note and "Ray Train placed its workers" in note
    assert "distenv.discover()" not in note  # nothing of Ray's answers it
    from distenv.sources import source_of

    ray = source_of("ray")
    assert ray.passes_on("OMP_NUM_THREADS", 1) == \
        'ray.init(runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})'


def test_lightning_is_left_to_rays_integration_the_other_adapters_act():
    from distenv.sources import adapter_acts, source_of

    assert not adapter_acts("ray", "lightning")  # DISTENV_AUTO=1: Lightning not patched
    assert all(adapter_acts("ray", a) for a in ("torch", "transformers", "deepspeed", "jax"))
    assert "RayDDPStrategy" in source_of("ray").instead["lightning"]
    assert adapter_acts("slurm", "lightning") and adapter_acts("torchrun", "lightning")


#: What a worker inherits when Ray runs inside another launcher or platform (`ray start` under
#: mpirun, in a Kubeflow or Indexed Job pod, on a cloud platform): that launcher's variables
#: for the `ray start` process, which describe it, not the worker.
OUTER = {
    "openmpi": {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
    "mpich": {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
    "kubeflow": {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1",
                 "PET_MASTER_ADDR": "head", "PET_MASTER_PORT": "23456"},
    "k8s_job": {"JOB_COMPLETION_INDEX": "1", "DISTENV_JOB_COMPLETIONS": "2"},
    "sagemaker": {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"},
    "azureml": {"AZUREML_RUN_ID": "x", "AZ_BATCH_MASTER_NODE": "10.0.0.4:6105"},
    "skypilot": {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2",
                 "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2"},
    "tf_config": {"TF_CONFIG": '{"cluster":{"worker":["a:1","b:1"]},"task":{"type":"worker","index":1}}'},
}


@pytest.mark.parametrize("outer", sorted(OUTER))
def test_ray_inside_other_launchers_and_platforms_keeps_rays_fields(outer):
    worker = {k: v for k, v in ranks("ray-sbatch-2x2")[2]["env"].items()
              if not k.startswith("SLURM_")}
    alone = resolve(worker)
    env = resolve({**worker, **OUTER[outer]})
    assert env.launcher == "ray"
    for field in ("rank", "local_rank", "world_size", "local_world_size", "node_rank",
                  "master_addr", "master_port"):
        assert getattr(env, field) == getattr(alone, field), (outer, field, env.explain())
