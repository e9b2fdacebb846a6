#!/usr/bin/env python3
"""Amazon SageMaker (SageMaker Python SDK v2): the example as a PyTorch training job, in
the three ways SageMaker can start it.

    pip install sagemaker
    python integrations/sagemaker/estimators.py --role ROLE_ARN per-node|torch-distributed|mpi

Run from the repository root. distenv travels with the code (``dependencies``:
src/distenv lands in /opt/ml/code/distenv, which is on PYTHONPATH), so the container
needs nothing installed beyond SageMaker's PyTorch image.

* per-node (no ``distribution``): SageMaker runs the entry point once per host;
  launch_per_node.sh runs ``python -m distenv run``, which starts one worker per GPU
  (SM_NUM_GPUS) with torch.distributed.run. Per-node launch.
* torch-distributed: SageMaker's torchrun starts one worker per GPU on every host;
  the example resolves itself (torchrun's variables). Per-process launch.
* mpi: SageMaker's mpirun starts processes_per_host ranks on every host; the example
  resolves itself (Open MPI's variables, master = first host of SM_HOSTS). Per-process.
"""
from __future__ import annotations

import argparse

INSTANCE_TYPE = "ml.g5.12xlarge"      # 4 GPUs
INSTANCE_COUNT = 2
COMMON = dict(
    framework_version="2.3",
    py_version="py311",
    instance_type=INSTANCE_TYPE,
    instance_count=INSTANCE_COUNT,
    environment={"PYTHONPATH": "/opt/ml/code"},
)


def estimators(role: str) -> dict:
    from sagemaker.pytorch import PyTorch

    return {
        "per-node": PyTorch(
            entry_point="integrations/sagemaker/launch_per_node.sh",
            dependencies=["src/distenv", "examples"],
            role=role, **COMMON),
        "torch-distributed": PyTorch(
            entry_point="examples/pytorch_ddp.py",
            dependencies=["src/distenv"],
            distribution={"torch_distributed": {"enabled": True}},
            role=role, **COMMON),
        "mpi": PyTorch(
            entry_point="examples/pytorch_ddp.py",
            dependencies=["src/distenv"],
            distribution={"mpi": {"enabled": True, "processes_per_host": 4}},
            role=role, **COMMON),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["per-node", "torch-distributed", "mpi"])
    ap.add_argument("--role", required=True, help="IAM role ARN for the training job")
    args = ap.parse_args()
    estimators(args.role)[args.mode].fit(wait=False)


if __name__ == "__main__":
    main()
