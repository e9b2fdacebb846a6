#!/usr/bin/env python3
"""Azure ML SDK v2 (azure-ai-ml): the four jobs of the YAML files, from Python.

    pip install azure-ai-ml azure-identity
    python integrations/azureml/sdk2_jobs.py --subscription S --resource-group G \\
        --workspace W [--compute gpu-cluster] mpi-per-process|mpi-per-node|pytorch|tensorflow

Run from anywhere: the job uploads the repository root (examples/ and src/; .gitignore'd
paths stay out) and puts src/ on PYTHONPATH, so `import distenv` and
`python -m distenv run` work on the nodes. Launch mode of each job:

* mpi-per-process: mpirun starts every worker; the example resolves itself (Open MPI).
* mpi-per-node:    mpirun starts one process per node; `distenv run` starts its workers.
* pytorch:         Azure starts every worker with RANK/WORLD_SIZE/...; per-process.
* tensorflow:      one worker per node with TF_CONFIG; Keras MultiWorkerMirroredStrategy.
"""
from __future__ import annotations

import argparse
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"


def jobs(compute: str) -> dict:
    from azure.ai.ml import MpiDistribution, PyTorchDistribution, TensorFlowDistribution, command
    from azure.ai.ml.entities import Environment

    torch_env = Environment(image=IMAGE, conda_file=os.path.join(HERE, "conda_torch.yml"))
    tf_env = Environment(image=IMAGE, conda_file=os.path.join(HERE, "conda_tensorflow.yml"))
    common = dict(code=REPO, compute=compute, experiment_name="distenv",
                  environment_variables={"PYTHONPATH": "src"})
    return {
        # One worker per GPU: process_count_per_instance = GPUs per node.
        "mpi-per-process": command(
            command="python examples/pytorch_ddp.py",
            distribution=MpiDistribution(process_count_per_instance=2),
            instance_count=2, environment=torch_env, display_name="distenv-mpi-per-process",
            **common),
        # Azure's per-node launcher: one process per node, distenv run starts the workers.
        "mpi-per-node": command(
            command="python -m distenv run --nproc-per-node gpu -- python examples/pytorch_ddp.py",
            distribution=MpiDistribution(process_count_per_instance=1),
            instance_count=2, environment=torch_env, display_name="distenv-mpi-per-node",
            **common),
        "pytorch": command(
            command="python examples/pytorch_ddp.py",
            distribution=PyTorchDistribution(process_count_per_instance=2),
            instance_count=2, environment=torch_env, display_name="distenv-pytorch",
            **common),
        "tensorflow": command(
            command="python examples/keras_mwms.py --out outputs/keras_mwms",
            distribution=TensorFlowDistribution(worker_count=2),
            instance_count=2, environment=tf_env, display_name="distenv-tensorflow",
            **common),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", choices=["mpi-per-process", "mpi-per-node", "pytorch", "tensorflow"])
    ap.add_argument("--subscription", required=True)
    ap.add_argument("--resource-group", required=True)
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--compute", default="gpu-cluster")
    args = ap.parse_args()

    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

    client = MLClient(DefaultAzureCredential(), args.subscription, args.resource_group,
                      args.workspace)
    job = client.jobs.create_or_update(jobs(args.compute)[args.job])
    print(job.name, job.studio_url)


if __name__ == "__main__":
    main()
