#!/usr/bin/env python
"""Run a training script as a loaded machine would: gloo's threads get the CPU late at the end.

    python late_gloo_threads.py SCRIPT [ARGS ...]

When SCRIPT calls ``torch.distributed.all_gather_object`` (the last collective of
plain_lightning.py and examples/lightning_trainer.py), every thread of the process is first
moved to one CPU and every thread but the main one to SCHED_IDLE: gloo's worker thread then
hardly runs while the main thread does. The main thread returns from the gather, drops
its tensors and exits while gloo's thread still holds them. A script that leaves its process
group to interpreter exit then aborts (SIGABRT, "terminate called without an active
exception": gloo's thread frees the tensors, which needs the GIL, after Python began
finalizing); one that calls ``destroy_process_group()`` first finishes. This is what made
test_per_node_one_node[lightning] fail once in a full run on a loaded 2-core machine.

Lowering the priority of one's own threads needs no privilege. The script runs as __main__.
"""
import os
import runpy
import sys

import torch.distributed as dist

_gather = dist.all_gather_object


def all_gather_object(*args, **kwargs):
    cpu = min(os.sched_getaffinity(0))
    main = os.getpid()
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, {cpu})
            if tid != main:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            pass
    return _gather(*args, **kwargs)


dist.all_gather_object = all_gather_object
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
