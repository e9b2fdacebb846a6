#!/usr/bin/env python
"""Data-parallel training with a Lightning Trainer, right under any launcher.

    python examples/lightning_trainer.py                                 # one process
    torchrun --nproc-per-node 2 examples/lightning_trainer.py
    mpirun -np 2 python examples/lightning_trainer.py                    # no mpi4py needed
    srun -n 2 python examples/lightning_trainer.py
    # one process per node, Lightning starts 2 workers on each node:
    DISTENV_NPROC_PER_NODE=2 mpirun -np 2 --map-by node --bind-to none -x DISTENV_NPROC_PER_NODE \
        python examples/lightning_trainer.py

The distenv lines are the Trainer's: ``plugins=[DistenvEnvironment()]`` and
``**trainer_kwargs()`` (the devices and num_nodes that match the launch). With
``--package pytorch_lightning`` the same lines run on the separate pytorch_lightning
package (default: ``lightning`` if installed). ``--no-plugin`` shows what Lightning does on
its own: under mpirun without mpi4py every rank believes it is rank 0 and trains alone.

The model, data and global batch are those of examples/pytorch_ddp.py (the sample order
is Lightning's shuffled one); rank 0 prints one JSON line with the final loss, the
parameter checksum of every rank, the ranks and hosts that took part, and timings.
"""
import argparse
import importlib.util
import json
import os
import socket
import sys
import time

T_START = time.time()


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", choices=("lightning", "pytorch_lightning"), default=None)
    ap.add_argument("--no-plugin", action="store_true",
                    help="plain Trainer(accelerator='cpu'), as a script without distenv")
    ap.add_argument("--devices", type=int, default=None, help="force Trainer(devices=)")
    ap.add_argument("--num-nodes", type=int, default=None, help="force Trainer(num_nodes=)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    return ap.parse_args()


ARGS = parse()
if ARGS.package is None:
    ARGS.package = "lightning" if importlib.util.find_spec("lightning") else "pytorch_lightning"
if ARGS.package == "lightning":
    import lightning.pytorch as pl  # noqa: E402
else:
    import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler, TensorDataset  # noqa: E402

from distenv.lightning import DistenvEnvironment, trainer_kwargs  # noqa: E402

FEATURES, HIDDEN = 16, 32


def make_data(samples: int):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(samples, 1, generator=g)
    return x, y


def checksum(model) -> float:
    total = 0.0
    for p in model.parameters():
        flat = p.detach().double().flatten().cpu()
        total += float((flat * torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64)).sum())
    return total


class ShuffleLikeDDP(RandomSampler):
    """Shuffles each epoch exactly as DistributedSampler(shuffle=True, seed=0) does.

    Under DDP Lightning replaces a RandomSampler by DistributedSampler(shuffle=True, seed=0):
    each epoch one permutation, rank r of W taking its elements r, r+W, ... -- so the W
    batches of global/W samples make exactly one global batch of that permutation. A single
    process keeps this sampler and sees the same global batches in the same order.
    """

    epoch = 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls it at each epoch
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.epoch)
        return iter(torch.randperm(len(self.data_source), generator=g).tolist())


class Regression(pl.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                       torch.nn.Linear(HIDDEN, 1))
        self.lr = lr
        self.t_first_step = None

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        if self.t_first_step is None:
            self.t_first_step = time.time()
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main():
    args = ARGS
    if args.no_plugin:
        extra = {"accelerator": "cpu"}
    else:
        extra = {"accelerator": "cpu", "plugins": [DistenvEnvironment()]}
        if args.devices is None:  # else the Trainer's own values, which the plugin checks
            extra.update(trainer_kwargs())
    if args.devices is not None:
        extra["devices"] = args.devices
    if args.num_nodes is not None:
        extra["num_nodes"] = args.num_nodes
    world = extra.get("devices", 1) * extra.get("num_nodes", 1)
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of {world}")

    x, y = make_data(args.samples)
    data = TensorDataset(x, y)
    loader = DataLoader(data, batch_size=args.global_batch // world, sampler=ShuffleLikeDDP(data))
    model = Regression(args.lr)
    trainer = pl.Trainer(max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         deterministic=True, **extra)
    t0 = time.time()
    trainer.fit(model, loader)
    seconds = time.time() - t0

    with torch.no_grad():
        final_loss = float(torch.nn.functional.mse_loss(model(x), y))
    mine = {"rank": trainer.global_rank, "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank, "host": socket.gethostname(), "pid": os.getpid(),
            "checksum": checksum(model), "t_first_step": model.t_first_step}
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        # The last collective: end the group now, while the interpreter is whole. Left to
        # interpreter exit, gloo's worker thread may free this gather's tensors only after
        # Python began finalizing (a loaded machine gives it the CPU late); freeing them needs
        # the GIL, and the process aborts (SIGABRT, "terminate called without an active
        # exception") after training succeeded. torch asks scripts to call this.
        dist.destroy_process_group()
    else:
        everyone = [mine]
    if trainer.global_rank == 0:
        env = trainer.strategy.cluster_environment if hasattr(trainer.strategy, "cluster_environment") else None
        sys.stdout.write(json.dumps({
            "example": "lightning_trainer", "package": args.package, "plugin": not args.no_plugin,
            "environment": type(env).__name__ if env is not None else None,
            "strategy": type(trainer.strategy).__name__,
            "world_size": trainer.world_size, "num_nodes": trainer.num_nodes,
            "devices": trainer.num_devices,
            "final_loss": final_loss, "checksum": mine["checksum"],
            "checksums": [r["checksum"] for r in everyone],
            "ranks": [r["rank"] for r in everyone],
            "local_ranks": [r["local_rank"] for r in everyone],
            "node_ranks": [r["node_rank"] for r in everyone],
            "hosts": [r["host"] for r in everyone], "pids": [r["pid"] for r in everyone],
            "steps": trainer.global_step, "train_seconds": seconds,
            "t_start": T_START, "t_first_step": max(r["t_first_step"] for r in everyone),
        }) + "\n")  # one write: ranks sharing a pipe cannot split it
        sys.stdout.flush()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
