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

The same race can also *hang* a finished job, measured here under mpirun with the Transformers
example (py-spy): when the last reference to the process group goes (a script's
``destroy_process_group()`` followed by its DDP model being freed, or the exit handler's own
destroy), ``~ProcessGroupGloo`` runs on the main thread *holding the GIL* and waits for the
worker thread, while that worker waits for the GIL to free a finished all-gather's tensors
(``~AsyncAllgatherWork -> decref_pyobject -> gil_scoped_acquire``): a deadlock, every rank's
training done. So the process group is ended only once the workers are idle.

`register()` (called by `distenv.torch.init_process_group`, `distenv.transformers.patch`,
`distenv.deepspeed.prepare`, `distenv.lightning`, and `distenv.auto` in a distributed launch)
adds one atexit handler and guards ``torch.distributed.destroy_process_group`` (`guard`).
Python runs atexit handlers before it starts finalizing, so there `end()`

1. waits until torch's worker threads (gloo's run loops, autograd's device threads) are idle,
   releasing the GIL meanwhile so that a late worker finishes its destruction while the
   interpreter is whole. Idle: every such thread asleep and not scheduled at all across a
   10 ms GIL-free sleep (Linux ``/proc/self/task``); at most `QUIESCE_LIMIT` seconds;
2. destroys the default process group, unless the user already did or the program ends with
   an uncaught exception (a rank that failed must not wait on the others: with NCCL the
   destroy can block while peers are still in a collective);
3. waits for the workers again (the destroy may have finished collectives of its own).

`guard()` makes a script's own ``torch.distributed.destroy_process_group()`` wait the same way
before and after (same function, same arguments; ``distenv.torch.destroy_process_group`` is
`end()` by name). ``DISTENV_TEARDOWN=0`` turns all of it off.

Standard library only, and torch is never imported here: nothing happens when the program
never imported ``torch.distributed``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

#: Seconds the exit handler waits at most for torch's worker threads to go idle.
QUIESCE_LIMIT = 10.0
#: Thread names (prefixes) of torch workers that may free Python objects.
WORKERS = ("pt_gloo_runloop", "pt_autograd")

_registered = False


def _off() -> bool:
    from ..knobs import TEARDOWN

    return not TEARDOWN.value()


def register() -> None:
    """Run `at_exit` when the interpreter ends (once per process, however often called), and
    `guard` torch's destroy_process_group if torch.distributed is imported already."""
    global _registered
    if _off():
        return
    guard()
    if _registered:
        return
    import atexit

    atexit.register(at_exit)
    _registered = True


def guard() -> None:
    """Make ``torch.distributed.destroy_process_group`` wait for torch's workers to be idle
    before and after it runs (see the module docstring). Once. When torch.distributed is not
    imported yet (``patch()`` comes before ``import torch`` in most scripts), it is guarded
    as soon as its import completes."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        if not any(isinstance(f, _GuardFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _GuardFinder())
        return
    original = getattr(dist, "destroy_process_group", None)
    if original is None or getattr(original, "__distenv_guarded__", False) or _off():
        return
    import functools

    @functools.wraps(original)
    def destroy_process_group(*args: "Any", **kwargs: "Any") -> "Any":
        _settle()
        try:
            return original(*args, **kwargs)
        finally:
            _settle()

    destroy_process_group.__distenv_guarded__ = True  # type: ignore[attr-defined]
    setattr(dist, "destroy_process_group", destroy_process_group)


_local: "Any" = None  # per thread: the wrapping finders whose spec_from_others is under way


def spec_from_others(me: "Any", name: str, path: "Any", target: "Any") -> "Any":
    """The spec the meta-path finders other than `me` give for `name` (None if none does):
    what an import hook that only wraps loaders (this one, distenv.auto's) asks. Two such
    hooks on sys.meta_path chain (the second wraps the real loader, the first wraps that): a
    finder already asking is skipped, or each would ask the other without end."""
    global _local
    if _local is None:
        import threading

        _local = threading.local()
    _asking: "list[Any]" = _local.__dict__.setdefault("asking", [])
    _asking.append(me)
    try:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is None or any(finder is f for f in _asking):
                continue
            spec = find(name, path, target)
            if spec is not None:
                return spec
        return None
    finally:
        _asking.pop()


class _GuardFinder:
    """Finds nothing itself: for ``torch.distributed``, wraps the loader the other finders
    return so that `guard` runs once the module's body did; then leaves sys.meta_path."""

    def find_spec(self, name: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if name != "torch.distributed":
            return None
        spec = spec_from_others(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _GuardLoader(spec.loader)
        return spec

    def invalidate_caches(self) -> None:
        pass


class WrappingLoader:
    """A loader that delegates to `loader` (what a finder of `spec_from_others` returned) and
    runs its `run` around the module's body; the module and its spec see the real loader.
    Subclasses (this module's guard, distenv.auto's hooks) override `run`."""

    def __init__(self, loader: "Any") -> None:
        self.loader = loader

    def __getattr__(self, attr: str) -> "Any":
        return getattr(self.loader, attr)

    def create_module(self, spec: "Any") -> "Any":
        create = getattr(self.loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: "Any") -> None:
        module.__loader__ = self.loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        self.run(module)

    def run(self, module: "Any") -> None:
        self.loader.exec_module(module)


class _GuardLoader(WrappingLoader):
    def run(self, module: "Any") -> None:
        self.loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _GuardFinder)]
        guard()


def _settle() -> None:
    try:
        if not quiesce(QUIESCE_LIMIT):
            _log().debug("distenv: torch worker threads still busy after %s s", QUIESCE_LIMIT)
    except Exception as exc:  # noqa: BLE001 - never turn a finished job into a failed one
        _log().debug("distenv: waiting for torch worker threads failed: %s", exc)


def _log() -> "Any":
    import logging

    return logging.getLogger("distenv.torch")


def end(destroy: bool = True) -> None:
    """End the default process group in an order that neither hangs nor aborts: torch's
    workers idle, destroy (when `destroy` and a group is up), workers idle again."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    _settle()
    try:
        if destroy and dist.is_available() and dist.is_initialized():
            original = getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)
            original()
            _log().debug("distenv: process group destroyed")
    except Exception as exc:  # noqa: BLE001 - never turn a finished job into a failed exit
        _log().debug("distenv: destroy_process_group failed: %s", exc)
    _settle()


def at_exit() -> None:
    # An uncaught exception is printed (and kept in sys.last_value) before atexit runs.
    end(destroy=getattr(sys, "last_value", None) is None)


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
