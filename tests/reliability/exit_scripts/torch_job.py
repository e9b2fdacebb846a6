#!/usr/bin/env python
"""The smallest job of a process group: start it, all-reduce, all-gather, leave it to exit.

    python torch_job.py distenv     # distenv.torch.init_process_group()
    python torch_job.py plain       # torch.distributed.init_process_group("gloo") (env://)
    python torch_job.py accelerate  # accelerate.PartialState() starts it
    python torch_job.py patch       # distenv.transformers.patch(), then PartialState()
    python torch_job.py MODE destroy   # inside a function holding a DDP model, the script's
                                       # own dist.destroy_process_group(), then the model goes

Each rank prints ``DISTENV-PROBE {"rank", "world_size", "sum", "ranks"}``. Without
``destroy``, no destroy_process_group(): ending the group in order at exit is what is under
test. With it, the shape of the Transformers example (the Trainer's DDP model freed after the
script's own destroy): the last reference to the group goes on the main thread, which
deadlocked against a late gloo worker (see distenv.bringup.teardown).
"""
import json
import sys

mode = sys.argv[1]
if mode == "patch":
    import distenv.transformers

    distenv.transformers.patch()
if mode in ("accelerate", "patch"):
    from accelerate import PartialState

    state = PartialState()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if mode == "distenv":
    import distenv.torch

    distenv.torch.init_process_group()
elif mode == "plain":
    dist.init_process_group("gloo")


def job():
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, dist.get_rank())
    sys.stdout.write("DISTENV-PROBE " + json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                                                   "sum": t.tolist(), "ranks": ranks}) + "\n")
    sys.stdout.flush()
    if own_destroy:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))  # holds the group
        model(torch.ones(1, 2)).sum().backward()
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, dist.get_rank())  # a late worker still holds its tensors
        dist.destroy_process_group()
    # returning frees the model: the group's last reference, when the script destroyed it


own_destroy = sys.argv[2:] == ["destroy"]
job()
