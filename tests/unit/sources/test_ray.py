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


PLACE = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "master_addr")


def plain_task(layout="ray-srun-np2", rank=0):
    """A Ray process outside Ray Train: a recorded worker without Train's variables (what
    every worker is at interpreter start, before Ray's on_start)."""
    return {k: v for k, v in ranks(layout)[rank]["env"].items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                         "MASTER_ADDR", "MASTER_PORT")}


@pytest.mark.parametrize("outer", ["slurm", "slurm+pmi2", "openmpi", "flux", "k8s_job",
                                   "skypilot", "none"])
def test_a_ray_process_outside_train_has_no_place_whatever_started_ray(outer):
    """Ray starts its processes itself: what they inherit describes `ray start` (or the driver),
    never them. Before, under SLURM every such process was rank SLURM_PROCID of that step
    (and with srun --mpi=pmi2's PMI_RANK, of a 2-task step), under Flux or an Indexed Job pod
    that launcher's rank."""
    env = plain_task("ray-sbatch-2x2", 2)
    if outer != "slurm" and not outer.startswith("slurm+"):
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    env.update({"slurm+pmi2": {"PMI_RANK": "1", "PMI_SIZE": "2"},
                "openmpi": {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
                "flux": {"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "2", "FLUX_TASK_LOCAL_ID": "0",
                         "FLUX_JOB_ID": "f1"},
                "k8s_job": {"JOB_COMPLETION_INDEX": "1", "DISTENV_JOB_COMPLETIONS": "2"},
                "skypilot": {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2",
                             "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2"}}.get(outer, {}))
    got = resolve(env)
    assert got.launcher == "ray" and got.job_id == env["RAY_JOB_ID"]
    assert all(getattr(got, f) is None for f in PLACE), got.explain()
    assert any("outside Ray Train" in n and "Fix: " in n for n in got.notes), got.notes


def test_distenv_auto_does_nothing_in_a_ray_process(tmp_path):
    """DISTENV_AUTO acts at interpreter start, before Ray sets a Train worker's variables: a Ray
    process there must start as if distenv were absent (it exited 2 under SLURM before)."""
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DISTENV_AUTO": "1",
           **{k: v for k, v in plain_task().items() if not v.startswith("<")}}
    p = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('RANK'))"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout.strip()) == (0, "None"), p.stderr
    from distenv.sources import adapter_acts

    assert not any(adapter_acts("ray", a) for a in ("torch", "lightning", "transformers", "jax"))


def test_tensorflow_trainers_workers_read_the_tf_config_ray_wrote():
    env = plain_task()
    env["TF_CONFIG"] = ('{"cluster": {"worker": ["10.0.0.1:1", "10.0.0.2:2"]}, '
                        '"task": {"type": "worker", "index": 1}}')
    got = resolve(env)
    assert (got.launcher, got.rank, got.world_size) == ("ray", 1, 2)


def test_torchft_workers_are_replica_groups_of_their_own():
    """TorchftConfig: Ray sets LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, NODE_RANK=0 and the worker's own
    node as MASTER_ADDR in every worker (each its own replica group): only the global numbers
    are the job's."""
    env = dict(ranks("ray-srun-np2")[1]["env"], TORCHFT_LIGHTHOUSE="http://10.0.0.1:29510",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", NODE_RANK="0")
    got = resolve(env)
    assert (got.rank, got.world_size) == (1, 2)
    assert (got.local_rank, got.local_world_size, got.node_rank, got.master_addr) == \
        (None, None, None, None), got.explain()
    assert any("torchft" in n for n in got.notes)


def test_without_rays_master_no_platform_names_one():
    """TorchConfig(init_method="tcp"): Ray sets no MASTER_ADDR. Rank 0 may be on any node, so an
    Azure ML or SageMaker master node is no proof of where."""
    env = {k: v for k, v in ranks("ray-sbatch-2x2")[2]["env"].items()
           if k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("SLURM_")}
    for platform in ({"AZUREML_RUN_ID": "x", "AZ_BATCH_MASTER_NODE": "10.0.0.4:6105"},
                     {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}):
        got = resolve({**env, **platform})
        assert got.launcher == "ray" and got.master_addr is None, got.explain()
        assert any("init_method='tcp'" in n for n in got.notes)


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
    assert "num_nodes" in note and "Ray Train placed them" in note
    assert "distenv.discover()" not in note  # nothing of Ray's answers it
    from distenv.sources import source_of

    ray = source_of("ray")
    assert ray.passing.fill("OMP_NUM_THREADS", 1) == \
        'ray.init(runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})'


def test_lightning_is_left_to_rays_integration():
    from distenv.sources import adapter_acts, source_of

    assert "RayDDPStrategy" in source_of("ray").frameworks.instead["lightning"]
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
