#!/usr/bin/env python
"""Run a training script as a loaded machine would at its end: torch's threads late.

    python late_workers.py SCRIPT [ARGS ...]        (SCRIPT runs as __main__)

Every time the script starts a process group (``torch.distributed.init_process_group``,
whoever calls it: distenv, Accelerate, Lightning) and at every ``all_gather_object``, all
threads of the process are moved to one CPU and every thread but the main one to
SCHED_IDLE, and the GIL passes to another thread only when the main thread blocks (switch
interval 100 s): gloo's worker threads then hardly run while the main thread does, so they
free a finished collective's tensors late -- as they do on a busy machine. An object in a module
of its own sleeps when the interpreter clears the modules at exit (as the teardown of a big
program takes its time): a late worker then frees the tensors while Python is finalizing,
and the process aborts (SIGABRT, "terminate called without an active exception"), unless
something let the workers finish before finalization (distenv's exit handler, or the
script's own destroy_process_group with no other reference to the group).

Lowering the priority of one's own threads needs no privilege.
"""
import os
import runpy
import sys
import time
import types


def starve() -> None:
    cpu = min(os.sched_getaffinity(0))
    main = os.getpid()
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, {cpu})
            if tid != main:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            pass


class _SlowTeardown:
    def __del__(self):
        time.sleep(0.3)  # the GIL is free: a late worker runs now, during finalization


# A worker waiting for the GIL gets it only when the main thread blocks (not every 5 ms).
sys.setswitchinterval(100.0)
_sleeper = types.ModuleType("_distenv_late_workers_sleeper")
_sleeper.obj = _SlowTeardown()
sys.modules[_sleeper.__name__] = _sleeper
del _sleeper

import torch.distributed as dist  # noqa: E402


def _wrap(module, name):
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            starve()

    wrapper.__wrapped__ = original
    setattr(module, name, wrapper)


for _name in ("init_process_group", "all_gather_object"):
    _wrap(dist, _name)
    _wrap(dist.distributed_c10d, _name)

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
