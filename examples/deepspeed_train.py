#!/usr/bin/env python
"""Train a small MLP with DeepSpeed (data parallel, ZeRO stage 0/1/2) on synthetic data.
Runs unchanged under any launcher, with no mpi4py:

    python examples/deepspeed_train.py
    torchrun --nproc-per-node 2 examples/deepspeed_train.py
    mpirun -np 2 python examples/deepspeed_train.py          # Open MPI, MPICH, Intel MPI
    srun -n 2 python examples/deepspeed_train.py
    deepspeed --num_gpus 2 examples/deepspeed_train.py       # the DeepSpeed launcher

Rank 0 prints one JSON line: {"world_size", "final_loss", "checksum", ...}.
Options: ``--steps N``, ``--micro-batch N``, ``--grad-accum N``, ``--zero STAGE``,
``--report`` (every rank prints its own line, prefixed ``DISTENV-PROBE ``, for tests) and
``--no-distenv`` (call ``deepspeed.init_distributed()`` itself, to see what goes wrong).

The distenv lines: ``distenv.deepspeed.init_distributed()`` instead of
``deepspeed.init_distributed()``, and ``check_batch_size`` before ``deepspeed.initialize``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

T0 = time.monotonic()
MARK = "DISTENV-PROBE "


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2))
    p.add_argument("--report", action="store_true")
    p.add_argument("--no-distenv", dest="distenv", action="store_false")
    # The DeepSpeed launcher passes --local_rank=N; legacy torch.distributed.launch --local-rank=N.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args, _unknown = p.parse_known_args()
    return args


def checksum(module) -> "tuple[str, float]":
    import torch

    h = hashlib.sha256()
    total = 0.0
    for name, p in sorted(module.named_parameters()):
        t = p.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
        total += float(t.double().sum())
    return h.hexdigest()[:16], total


def main() -> int:
    args = parse()
    import deepspeed
    import torch

    if args.distenv:
        import distenv.deepspeed

        env = distenv.deepspeed.init_distributed()   # resolve, export, auto_mpi_discovery=False
        world = env.checked().world_size             # an int (or an error naming what to set)
    else:
        deepspeed.init_distributed()                 # DeepSpeed's own discovery (mpi4py ...)
        world = deepspeed.comm.get_world_size()
    t_init = time.monotonic()

    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_batch * args.grad_accum * world,
        "zero_optimization": {"stage": args.zero},
        "zero_allow_untested_optimizer": True,   # a plain torch optimizer, on CPU
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }
    if args.distenv:
        distenv.deepspeed.check_batch_size(config, world)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    engine, _opt, _loader, _sched = deepspeed.initialize(model=model, optimizer=optimizer,
                                                         config=config)
    rank, size = engine.global_rank, engine.world_size

    # The same synthetic regression on every rank; each takes its own share of every batch.
    g = torch.Generator().manual_seed(1234)
    w_true = torch.randn(16, 1, generator=g)
    losses = []
    for _step in range(args.steps * args.grad_accum):
        x = torch.randn(args.micro_batch * size, 16, generator=g)
        y = x @ w_true + 0.01 * torch.randn(args.micro_batch * size, 1, generator=g)
        mine = slice(rank * args.micro_batch, (rank + 1) * args.micro_batch)
        xb, yb = x[mine].to(engine.device), y[mine].to(engine.device)
        loss = torch.nn.functional.mse_loss(engine(xb), yb)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())
    final = losses[-1].clone()
    if size > 1:  # the mean over ranks of the last step's loss
        torch.distributed.all_reduce(final)
        final /= size
    digest, total = checksum(engine.module)

    record = {
        "world_size": size,
        "final_loss": round(float(final), 6),
        "checksum": digest,
        "param_sum": total,
        "rank": rank,
        "local_rank": engine.local_rank,
        "dp_world_size": engine.dp_world_size,
        "steps": engine.global_steps,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "master_port": os.environ.get("MASTER_PORT"),
        "deepspeed": deepspeed.__version__,
        "distenv": args.distenv,
        "seconds": {"init": round(t_init - T0, 2), "total": round(time.monotonic() - T0, 2)},
    }
    if args.report:
        sys.stdout.write(MARK + json.dumps(record, sort_keys=True) + "\n")
    if rank == 0:
        keys = ("world_size", "final_loss", "checksum", "steps", "deepspeed")
        print(json.dumps({k: record[k] for k in keys}), flush=True)
    sys.stdout.flush()
    if torch.distributed.is_initialized():
        # End the group while the interpreter is whole (pytorch/pytorch#190489: gloo's worker
        # thread can otherwise abort the process at exit after a correct run);
        # under distenv.deepspeed this call also waits for gloo's threads to be idle.
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
