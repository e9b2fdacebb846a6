#!/bin/sh
# SageMaker entry point for a job without a `distribution`: SageMaker runs it once per
# host, and `distenv run` starts the host's workers (one per GPU, from SM_NUM_GPUS) with
# torch.distributed.run: node rank = SM_CURRENT_HOST's place in SM_HOSTS, master = the
# first host (as SageMaker's own torchrun runner does). Runs in /opt/ml/code, where
# estimators.py puts distenv/ and examples/ next to this file.
exec python -m distenv run -- python examples/pytorch_ddp.py "$@"
