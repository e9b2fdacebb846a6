#!/usr/bin/env python
"""The smallest job of a process group: start it, all-reduce, all-gather, leave it to exit.

    python torch_job.py distenv     # distenv.torch.init_process_group()
    python torch_job.py plain       # torch.distributed.init_process_group("gloo") (env://)
    python torch_job.py accelerate  # accelerate.PartialState() starts it
    python torch_job.py patch       # distenv.transformers.patch(), then PartialState()

Each rank prints ``DISTENV-PROBE {"rank", "world_size", "sum", "ranks"}``. No
destroy_process_group(): ending the group in order at exit is what is under test.
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
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
ranks = [None] * dist.get_world_size()
dist.all_gather_object(ranks, dist.get_rank())
sys.stdout.write("DISTENV-PROBE " + json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                                               "sum": t.tolist(), "ranks": ranks}) + "\n")
sys.stdout.flush()
