#!/usr/bin/env python
"""Data-parallel training with plain PyTorch DDP, started right under any launcher.

    python examples/pytorch_ddp.py                                   # one process
    torchrun --nproc-per-node 2 examples/pytorch_ddp.py
    mpirun -np 2 python examples/pytorch_ddp.py                      # Open MPI, MPICH, Intel MPI
    srun -n 2 python examples/pytorch_ddp.py

The only distenv line is `distenv.torch.init_process_group()`: it reads the launcher's
variables, exports RANK/WORLD_SIZE/MASTER_ADDR/..., picks gloo or NCCL, binds the GPU and
joins the rendezvous (a missing rank fails after DISTENV_TIMEOUT seconds, not 30 minutes).

A tiny regression model on synthetic data, fully deterministic. Each step takes one global
batch of --global-batch samples; rank r of W trains on samples r, r+W, r+2W, ... of it,
so W ranks compute exactly what one process computes on the whole global batch. Rank 0
prints one JSON line: the final loss (on the whole data set), a checksum of the parameters
on every rank (they must be identical), the ranks and hosts that took part, and timings.
"""
import argparse
import json
import os
import socket
import sys
import time

T_START = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import distenv.torch  # noqa: E402

FEATURES, HIDDEN = 16, 32


def make_data(samples: int):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(samples, 1, generator=g)
    return x, y


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, 1))


def checksum(model) -> float:
    """Position-weighted sum of every parameter (float64): equal parameters, equal sums."""
    total = 0.0
    for p in model.parameters():
        flat = p.detach().double().flatten().cpu()
        total += float((flat * torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64)).sum())
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    # .checked(): rank, world size, local rank and master known (int/str, never None) or one
    # error saying what to set -- so `env.local_rank` below type-checks as an int.
    env = distenv.torch.init_process_group().checked()
    t_init = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of the "
                         f"world size {world}")
    device = distenv.torch.device()

    x, y = make_data(args.samples)
    x, y = x.to(device), y.to(device)
    model = DDP(make_model().to(device))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    steps = 0
    t_first = None
    t0 = time.time()
    for _ in range(args.epochs):
        for start in range(0, args.samples, args.global_batch):
            # This rank's share of the global batch: samples rank, rank+W, ... of it.
            xb = x[start + rank:start + args.global_batch:world]
            yb = y[start + rank:start + args.global_batch:world]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()  # DDP all-reduces (averages) the gradients
            opt.step()
            steps += 1
            if t_first is None:
                t_first = time.time()
    seconds = time.time() - t0

    with torch.no_grad():
        final_loss = float(loss_fn(model.module(x), y))
    mine = {"rank": rank, "local_rank": env.local_rank, "host": socket.gethostname(),
            "checksum": checksum(model.module), "threads": torch.get_num_threads(),
            "t_first_step": t_first}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        sys.stdout.write(json.dumps({
            "example": "pytorch_ddp", "launcher": env.launcher, "launch": env.launch,
            "world_size": world, "backend": dist.get_backend(),
            "final_loss": final_loss, "checksum": mine["checksum"],
            "checksums": [r["checksum"] for r in everyone],
            "ranks": [r["rank"] for r in everyone],
            "local_ranks": [r["local_rank"] for r in everyone],
            "hosts": [r["host"] for r in everyone],
            "threads": [r["threads"] for r in everyone],
            "steps": steps, "train_seconds": seconds, "steps_per_s": steps / seconds,
            "t_start": T_START, "t_init": t_init,
            "t_first_step": max(r["t_first_step"] for r in everyone),
        }) + "\n")  # one write: ranks sharing a pipe cannot split it
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
