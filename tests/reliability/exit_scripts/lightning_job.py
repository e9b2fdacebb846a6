#!/usr/bin/env python
"""A one-epoch Lightning Trainer on a tiny model with DistenvEnvironment, ended by exit.

    python lightning_job.py          # Trainer(plugins=[DistenvEnvironment()], **trainer_kwargs())

Each rank prints ``DISTENV-PROBE {"rank", "world_size", "sum", "ranks", "checksum"}``. No
destroy_process_group(): ending the group in order at exit is what is under test.
"""
import json
import sys

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from distenv.lightning import DistenvEnvironment, trainer_kwargs


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


g = torch.Generator().manual_seed(1)
x = torch.randn(32, 4, generator=g)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
model = Tiny()
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     plugins=[DistenvEnvironment()], **trainer_kwargs())
trainer.fit(model, data)
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
ranks = [None] * dist.get_world_size()
dist.all_gather_object(ranks, dist.get_rank())
checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
sys.stdout.write("DISTENV-PROBE " + json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                                               "sum": t.tolist(), "ranks": ranks,
                                               "checksum": checksum}) + "\n")
sys.stdout.flush()
