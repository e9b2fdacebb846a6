#!/usr/bin/env python
"""Train a tiny GPT-2 (built from a config: nothing is downloaded) on a synthetic dataset with
the Hugging Face Trainer. Runs unchanged under any launcher:

    python examples/hf_trainer.py
    torchrun --nproc-per-node 2 examples/hf_trainer.py
    mpirun -np 2 python examples/hf_trainer.py              # Open MPI, MPICH, Intel MPI
    srun -n 2 python examples/hf_trainer.py
    mpirun -np 2 python examples/hf_trainer.py --local_rank=$LOCAL_RANK   # Azure's docs: fine too

Rank 0 prints one JSON line: {"world_size", "final_loss", "checksum", "steps_per_epoch", ...}.
Options: any TrainingArguments flag (``--num_train_epochs 3``, ``--use_cpu``, ...), plus
``--samples N`` and ``--seq-len N`` (the dataset), ``--dropout P`` (GPT-2's dropout
probabilities, default 0.1 as GPT2Config's; ``--dropout 0`` makes a run's result depend
only on the global batches, so a 2-rank run can be compared with one process taking the
2-rank global batch: tests/e2e), ``--report`` (every rank prints its own
line, prefixed ``DISTENV-PROBE ``, for tests) and ``--no-distenv`` (skip
`distenv.transformers.patch()`, to see what goes wrong without it).

The only distenv line a script needs is ``distenv.transformers.patch()`` before
TrainingArguments is built (here: before HfArgumentParser builds it).
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
LOCAL_RANK_ARGS = [a for a in sys.argv[1:] if a.split("=")[0] in ("--local_rank", "--local-rank")]


def _take_flag(name: str) -> bool:
    if name in sys.argv:
        sys.argv.remove(name)
        return True
    return False


USE_DISTENV = not _take_flag("--no-distenv")
REPORT = _take_flag("--report")

if USE_DISTENV:
    import distenv.transformers

    distenv.transformers.patch()  # before TrainingArguments(...): the whole integration

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer,  # noqa: E402
                          TrainingArguments, set_seed)


@dataclass
class DataArguments:
    samples: int = 64
    seq_len: int = 16
    dropout: float = 0.1   # GPT2Config's default for resid_pdrop, embd_pdrop and attn_pdrop


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
                        n_head=2, bos_token_id=0, eos_token_id=0, resid_pdrop=data_args.dropout,
                        embd_pdrop=data_args.dropout, attn_pdrop=data_args.dropout)
    model = GPT2LMHeadModel(config)
    dataset = Counting(data_args.samples, data_args.seq_len, config.vocab_size)
    callbacks = [distenv.transformers.DistEnvCallback()] if USE_DISTENV else []
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=callbacks)
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
        "distenv": USE_DISTENV,
        "local_rank_args": LOCAL_RANK_ARGS,   # as the launcher or the job script passed them
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
        # Under distenv.transformers.patch() this call first waits for gloo's threads to be idle:
        # otherwise freeing the Trainer's DDP model after it can deadlock on them (distenv.bringup.teardown).
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
