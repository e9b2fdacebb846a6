#!/usr/bin/env python
"""examples/hf_trainer.py with its distenv lines removed: a plain Transformers Trainer script
(a tiny GPT-2 built from a config, a synthetic dataset; nothing is downloaded).

    torchrun --nproc-per-node 2 plain_transformers.py --use_cpu
    mpirun -np 2 distenv run -- python plain_transformers.py
    DISTENV_AUTO=1 mpirun -np 2 python plain_transformers.py

It never imports distenv. ``--report``: every rank prints its record after ``DISTENV-PROBE ``;
rank 0 also prints a summary line.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

T0 = time.monotonic()
MARK = "DISTENV-PROBE "


def _take_flag(name: str) -> bool:
    if name in sys.argv:
        sys.argv.remove(name)
        return True
    return False


REPORT = _take_flag("--report")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer,  # noqa: E402
                          TrainingArguments, set_seed)


@dataclass
class DataArguments:
    samples: int = 64
    seq_len: int = 16


class Counting(torch.utils.data.Dataset):
    """Sequences that count up from a random start (mod the vocabulary): easy to learn."""

    def __init__(self, samples: int, seq_len: int, vocab: int, seed: int = 1234):
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (samples, 1), generator=g)
        self.ids = (starts + torch.arange(seq_len)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def checksum(model) -> "tuple[str, float]":
    h = hashlib.sha256()
    total = 0.0
    for name, p in sorted(model.named_parameters()):
        t = p.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
        total += float(t.double().sum())
    return h.hexdigest()[:16], total


def main() -> int:
    defaults = ["--output_dir", os.path.join(tempfile.gettempdir(), f"hf-trainer-{os.getpid()}"),
                "--per_device_train_batch_size", "4", "--num_train_epochs", "2",
                "--learning_rate", "3e-3", "--seed", "0", "--report_to", "none",
                "--save_strategy", "no", "--logging_steps", "4", "--disable_tqdm", "true",
                "--dataloader_num_workers", "0"]
    parser = HfArgumentParser((DataArguments, TrainingArguments))
    data_args, args = parser.parse_args_into_dataclasses(args=defaults + sys.argv[1:])
    t_args = time.monotonic()

    set_seed(args.seed)
    config = GPT2Config(vocab_size=64, n_positions=data_args.seq_len, n_embd=32, n_layer=2,
                        n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    dataset = Counting(data_args.samples, data_args.seq_len, config.vocab_size)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    steps_per_epoch = len(trainer.get_train_dataloader())
    result = trainer.train()
    digest, total = checksum(trainer.model)

    record = {
        "world_size": args.world_size,
        "final_loss": round(float(result.training_loss), 6),
        "checksum": digest,
        "param_sum": total,
        "process_index": args.process_index,
        "local_process_index": args.local_process_index,
        "parallel_mode": getattr(args.parallel_mode, "value", str(args.parallel_mode)),
        "device": str(args.device),
        "wrapped": type(trainer.model_wrapped).__name__,
        "steps_per_epoch": steps_per_epoch,
        "global_step": trainer.state.global_step,
        "master_port": os.environ.get("MASTER_PORT"),
        "torch_dist": torch.distributed.is_initialized()
        and torch.distributed.get_world_size(),
        "transformers": transformers.__version__,
        "distenv_modules": sorted(m for m in sys.modules if m.startswith("distenv")),
        "accelerate_use_cpu": os.environ.get("ACCELERATE_USE_CPU"),
        "seconds": {"to_args": round(t_args - T0, 2), "total": round(time.monotonic() - T0, 2)},
    }
    if REPORT:
        sys.stdout.write(MARK + json.dumps(record, sort_keys=True) + "\n")
    if args.process_index == 0:
        keys = ("world_size", "final_loss", "checksum", "steps_per_epoch", "global_step",
                "transformers")
        print(json.dumps({k: record[k] for k in keys}), flush=True)
    sys.stdout.flush()
    if torch.distributed.is_initialized():
        # End the group while the interpreter is whole, as torch asks: left to exit, gloo's
        # worker thread may free the last collective's tensors after Python began finalizing,
        # and the process aborts (SIGABRT, exit 134) after a correct run (pytorch/pytorch#190489).
        # gloo's threads live on while the Trainer's DDP model holds the group: under
        # `distenv run` or DISTENV_AUTO=1, distenv also waits for them at exit.
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
