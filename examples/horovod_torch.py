#!/usr/bin/env python3
"""Horovod with PyTorch under any launcher, unchanged:

    python examples/horovod_torch.py                                  # one worker
    mpirun -np 2 python examples/horovod_torch.py                     # Open MPI (Horovod's MPI)
    srun -n 2 python examples/horovod_torch.py                        # SLURM (Gloo self-rendezvous)
    torchrun --nproc-per-node 2 --no-python python examples/horovod_torch.py

Without distenv, torchrun and srun give every rank `hvd.size() == 1`: each trains alone and
all exit 0. `distenv.horovod.init()` starts Horovod's Gloo rendezvous on rank 0 where no
MPI launched the job, and refuses to go on if Horovod's size or rank differ from the
launch. Needs the Horovod build of `bash integrations/frameworks/horovod.sh`.

Each rank prints one line ``DISTENV-HOROVOD {json}``: rank, size, local rank, controller
and a digest of its weights after training (identical on every rank).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys

import distenv.horovod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    args = ap.parse_args(argv)

    hvd = distenv.horovod.init("torch")

    import torch

    torch.manual_seed(1234 + hvd.rank())  # different on purpose: broadcast must fix it
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    gen = torch.Generator().manual_seed(hvd.rank())  # each rank its own data shard
    true_w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for step in range(args.steps):
        x = torch.randn(args.batch, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
    mean_loss = hvd.allreduce(loss.detach(), name="loss").item()

    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    digest = hashlib.sha256(struct.pack(f"{len(flat)}f", *flat))  # no numpy needed
    report = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
              "local_size": hvd.local_size(), "controller": os.environ.get("HOROVOD_CONTROLLER", "none"),
              "weights": digest.hexdigest(), "loss": mean_loss}
    sys.stdout.write("DISTENV-HOROVOD " + json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
