#!/usr/bin/env python3
"""Azure ML SDK v1 (azureml-core): the ScriptRunConfig equivalents of the SDK v2 jobs,
as in Azure's v1 distributed-training guide (MpiConfiguration, PyTorchConfiguration,
TensorflowConfiguration).

    pip install azureml-core
    python integrations/azureml/sdk1_jobs.py [--config config.json] [--compute gpu-cluster] \\
        mpi-per-process|mpi-per-node|pytorch|tensorflow

Launch mode of each run:

* mpi-per-process: MpiConfiguration(process_count_per_node=2, node_count=2): mpirun starts
  every worker; the example resolves itself through distenv.
* mpi-per-node:    MpiConfiguration(process_count_per_node=1, node_count=2): one process
  per node; `distenv run` starts one worker per GPU there.
* pytorch:         PyTorchConfiguration(process_count=4, node_count=2): Azure starts every
  worker with RANK/WORLD_SIZE/...; per-process. (node_count alone starts one process per
  node: then process_count = node_count, one worker per node.)
* tensorflow:      TensorflowConfiguration(worker_count=2): TF_CONFIG per worker.
"""
from __future__ import annotations

import argparse
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"


def runs(compute: str) -> dict:
    from azureml.core import Environment, ScriptRunConfig
    from azureml.core.runconfig import (MpiConfiguration, PyTorchConfiguration,
                                        TensorflowConfiguration)

    def env(name, conda):
        e = Environment.from_conda_specification(name, os.path.join(HERE, conda))
        e.docker.base_image = IMAGE
        e.environment_variables = {"PYTHONPATH": "src"}
        return e

    torch_env, tf_env = env("distenv-torch", "conda_torch.yml"), env("distenv-tf", "conda_tensorflow.yml")
    return {
        "mpi-per-process": ScriptRunConfig(
            source_directory=REPO, command=["python", "examples/pytorch_ddp.py"],
            compute_target=compute, environment=torch_env,
            distributed_job_config=MpiConfiguration(process_count_per_node=2, node_count=2)),
        "mpi-per-node": ScriptRunConfig(
            source_directory=REPO,
            command=["python", "-m", "distenv", "run", "--nproc-per-node", "gpu", "--",
                     "python", "examples/pytorch_ddp.py"],
            compute_target=compute, environment=torch_env,
            distributed_job_config=MpiConfiguration(process_count_per_node=1, node_count=2)),
        "pytorch": ScriptRunConfig(
            source_directory=REPO, command=["python", "examples/pytorch_ddp.py"],
            compute_target=compute, environment=torch_env,
            distributed_job_config=PyTorchConfiguration(process_count=4, node_count=2)),
        "tensorflow": ScriptRunConfig(
            source_directory=REPO,
            command=["python", "examples/keras_mwms.py", "--out", "outputs/keras_mwms"],
            compute_target=compute, environment=tf_env,
            distributed_job_config=TensorflowConfiguration(worker_count=2)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", choices=["mpi-per-process", "mpi-per-node", "pytorch", "tensorflow"])
    ap.add_argument("--config", default=None, help="workspace config.json (default: searched)")
    ap.add_argument("--compute", default="gpu-cluster")
    args = ap.parse_args()

    from azureml.core import Experiment, Workspace

    ws = Workspace.from_config(path=args.config)
    run = Experiment(ws, "distenv").submit(runs(args.compute)[args.run])
    print(run.id, run.get_portal_url())


if __name__ == "__main__":
    main()
