"""An orderly end for a torch process group that distenv set up or patched.

A job that trained correctly could die at interpreter exit with ``terminate called without an
active exception`` (SIGABRT, exit 134), seen under mpirun, torchrun and SLURM alike. The cause
is in torch, not in the launch (pytorch/pytorch#190489; an atexit fix in torch itself,
pytorch/pytorch#179291, was abandoned): gloo's worker thread (``pt_gloo_runloop``) destroys
each finished collective *after* waking the caller. When the caller has already dropped the
tensors, that destruction frees their Python objects and needs the GIL. A worker that gets
the CPU late (a loaded machine) does this only once Python is finalizing: ``take_gil`` then
ends the thread with ``pthread_exit`` inside a C++ destructor, and the process aborts (core:
``ProcessGroupGloo::runLoop -> ~AsyncAllgatherWork -> TensorImpl::decref_pyobject ->
take_gil -> pthread_exit``). ``destroy_process_group()`` alone does not prevent it: gloo's
``shutdown()`` stops nothing, and its threads are joined only when the last reference goes,
which a DDP model (a Trainer, a LightningModule) still holds at exit.

`register()` (called by `distenv.torch.init_process_group`, `distenv.transformers.patch`,
`distenv.lightning`, and `distenv.auto` in a distributed launch) adds one atexit handler.
Python runs atexit handlers before it starts finalizing, so there the handler

1. destroys the default process group, unless the user already did or the program ends with
   an uncaught exception (a rank that failed must not wait on the others: with NCCL the
   destroy can block while peers are still in a collective);
2. waits until torch's worker threads (gloo's run loops, autograd's device threads) are idle,
   releasing the GIL meanwhile so that a late worker finishes its destruction while the
   interpreter is whole. Idle: every such thread asleep and not scheduled at all across a
   10 ms GIL-free sleep (Linux ``/proc/self/task``); at most `QUIESCE_LIMIT` seconds.

Standard library only, and torch is never imported here: the handler does nothing when the
program never imported ``torch.distributed``. ``DISTENV_TEARDOWN=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Iterable

#: Seconds the exit handler waits at most for torch's worker threads to go idle.
QUIESCE_LIMIT = 10.0
#: Thread names (prefixes) of torch workers that may free Python objects.
WORKERS = ("pt_gloo_runloop", "pt_autograd")

_registered = False


def register() -> None:
    """Run `at_exit` when the interpreter ends (once per process, however often called)."""
    global _registered
    off = os.environ.get("DISTENV_TEARDOWN", "").strip().lower() in ("0", "false", "no", "off")
    if _registered or off:
        return
    import atexit

    atexit.register(at_exit)
    _registered = True


def at_exit() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    import logging

    log = logging.getLogger("distenv.torch")
    try:
        # An uncaught exception is printed (and kept in sys.last_value) before atexit runs.
        failed = getattr(sys, "last_value", None) is not None
        if not failed and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
            log.debug("distenv: process group destroyed at exit")
    except Exception as exc:  # noqa: BLE001 - never turn a finished job into a failed exit
        log.debug("distenv: destroy_process_group at exit failed: %s", exc)
    try:
        if not quiesce(QUIESCE_LIMIT):
            log.debug("distenv: torch worker threads still busy after %s s at exit", QUIESCE_LIMIT)
    except Exception as exc:  # noqa: BLE001
        log.debug("distenv: waiting for torch worker threads at exit failed: %s", exc)


def _workers() -> "list[str] | None":
    """Thread ids of torch's workers in this process (None: no /proc to tell)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", "rb") as f:
                name = f.read().decode(errors="replace").strip()
        except OSError:
            continue  # the thread ended
        if name.startswith(WORKERS):
            found.append(tid)
    return found


def _snapshot(tids: "Iterable[str]") -> "dict[str, tuple[bytes, bytes, bytes]]":
    """{tid: (state, CPU time in ns, times scheduled)} of the threads still alive."""
    out: "dict[str, tuple[bytes, bytes, bytes]]" = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                sched = f.read().split()
        except OSError:
            continue
        state = stat[stat.rindex(b")") + 2:].split(None, 1)[0]
        out[tid] = (state, sched[0] if sched else b"", sched[2] if len(sched) > 2 else b"")
    return out


def quiesce(limit: float = QUIESCE_LIMIT) -> bool:
    """Wait (GIL released) until torch's worker threads are idle; False after `limit` s."""
    import time

    tids = _workers()
    if not tids:
        return True
    deadline = time.monotonic() + limit
    before = _snapshot(tids)
    while True:
        time.sleep(0.01)  # releases the GIL: a worker waiting for it takes it now
        now = _snapshot(tids)
        if now == before and all(s[0] == b"S" for s in now.values()):
            return True
        if time.monotonic() > deadline:
            return False
        before = now
