"""PyTorch: one call that starts `torch.distributed` right under any launcher.

    import distenv.torch

    env = distenv.torch.init_process_group()     # mpirun, srun, torchrun, python, ...
    model = DDP(model.to(distenv.torch.device()))
    if env.is_main:
        print(loss)

`init_process_group(backend=None, timeout=None, **kwargs)`:

1. brings the launch up (`distenv.bringup.bring_up`): resolves it, refuses a *per-node*
   launch (one process per node that was meant to start the workers) with the command that
   would, completes what the launcher's variables left unknown from its own service, exports
   the torch variables (MASTER_ADDR, RANK, ...; see `DistEnv.export`) for any library that
   reads them later, and registers the orderly end of the process group at exit;
2. pins this process (`pin`): its CUDA device -- local rank N takes device N, unless the
   scheduler already narrowed CUDA_VISIBLE_DEVICES per task (fewer devices than local
   processes), in which case each process takes its first visible device -- and, when the
   user did not set OMP_NUM_THREADS, its CPU threads: the cores this process may run on,
   shared among the processes of the node unless the launcher bound each to cores of its own;
3. chooses the backend: NCCL when a CUDA device is usable, else gloo;
4. meets every rank on torch's own store before torch's long wait (`distenv.bringup.preflight.meet_on`,
   at most DISTENV_TIMEOUT seconds, default 180, never longer than `timeout`): a rank that
   never starts makes every other rank fail with one `distenv: error:` line naming it, instead
   of waiting torch's 30 minutes.

torch is imported inside the functions: `import distenv.torch` costs nothing without it.
"""

from __future__ import annotations

import datetime
import os

from dataclasses import dataclass

from . import knobs, resolve
from .bringup import bring_up
from .bringup import per_node_message as _per_node_message
from .core.description import PER_NODE, DistEnv
from .errors import DistEnvError, install_excepthook

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .bringup import preflight

#: Seconds the rendezvous waits for every rank (override: DISTENV_TIMEOUT; see distenv.knobs).
DEFAULT_RENDEZVOUS_TIMEOUT = knobs.DEFAULT_TIMEOUT

_device = None  # set by init_process_group
#: (description, default group) of the group init_process_group started last.
_started: "tuple[DistEnv, Any] | None" = None


#: Not every rank came to the rendezvous in time: a `DistEnvError` (one line with its Fix),
#: as every other refusal; the name stays for code that caught it.
RendezvousError = DistEnvError


# -- decisions (pure: unit-tested on recorded environments) ------------------------------------
def per_node_message(env: DistEnv) -> str:
    """Why a per-node launch cannot call init_process_group, and the commands that would work
    (the one refusal of every adapter, `distenv.bringup.per_node_message`)."""
    return _per_node_message(env, "torch")


#: The CPU way out of a device error, in each caller's words.
NO_GPU = "pass backend='gloo'"


def choose_device(env: DistEnv, cuda_count: int, environ: "Mapping[str, str] | None" = None,
                  instead: str = NO_GPU) -> "tuple[int | None, str]":
    """(CUDA device index for this process or None for CPU, why): the core's one-device
    policy (`distenv.core.gpus.one_device`); `instead` ends the Fix of its error.

    `cuda_count` is what torch.cuda.device_count() sees, i.e. after CUDA_VISIBLE_DEVICES.
    """
    from .core.gpus import device_index

    return device_index(env, cuda_count, os.environ if environ is None else environ, instead)


def choose_backend(requested: "str | None", device_index: "int | None", nccl: bool) -> str:
    if requested:
        if "nccl" in str(requested).lower() and device_index is None:
            raise DistEnvError(
                f"backend={requested!r} needs a CUDA device, and none is visible here. "
                "Fix: pass backend='gloo', or backend=None to choose automatically."
            )
        return requested
    return "nccl" if device_index is not None and nccl else "gloo"


def choose_threads(env: DistEnv, environ: "Mapping[str, str] | None" = None,
                   mine: "Iterable[int] | None" = None, parent: "Iterable[int] | None" = None
                   ) -> "tuple[int | None, str]":
    """(threads per process or None to leave alone, why).

    `mine`/`parent`: CPU sets of this process and of its parent (default: measured). When
    the launcher bound this process to fewer cores than its parent has (mpirun's default
    binding, srun --cpu-bind), those cores are its own; otherwise the node's processes share
    them.
    """
    environ = os.environ if environ is None else environ
    given = environ.get("OMP_NUM_THREADS")
    if given is not None and given.strip():
        return None, f"OMP_NUM_THREADS={given} (set by the user or the launcher)"
    return knobs.core_share(env.local_world_size, mine, parent)


@dataclass(frozen=True)
class Pin:
    """What `pin` did: this process's CUDA device (None: the CPU) and its threads (None: left
    as the user or the launcher set them), each with why."""

    device: "int | None"
    device_why: str
    threads: "int | None"
    threads_why: str


def pin(env: DistEnv, *, threads: bool = True, instead: str = NO_GPU) -> Pin:
    """Pin this process as the launch says, the one step `init_process_group` and
    `distenv.horovod` (PyTorch) share: its CUDA device (`choose_device`; an error ending with
    `instead` when more local processes than devices have nothing narrowed), and, with
    `threads` and OMP_NUM_THREADS unset, torch's CPU threads (`choose_threads`), written to
    OMP_NUM_THREADS too for the libraries and processes that read it."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index, why = choose_device(env, count, instead=instead)
    if index is not None:
        torch.cuda.set_device(index)
    n, threads_why = choose_threads(env) if threads else (None, "left alone (threads=False)")
    if n is not None:
        os.environ["OMP_NUM_THREADS"] = str(n)
        torch.set_num_threads(n)
    return Pin(index, why, n, threads_why)


def rendezvous_timeout(timeout: "datetime.timedelta | None",
                       environ: "Mapping[str, str] | None" = None) -> datetime.timedelta:
    limit = datetime.timedelta(seconds=knobs.timeout(environ))
    return min(limit, timeout) if timeout is not None else limit


def _as_timedelta(timeout: "datetime.timedelta | float | None") -> "datetime.timedelta | None":
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    return datetime.timedelta(seconds=float(timeout))


# -- the call ---------------------------------------------------------------------------------
def init_process_group(backend: "str | None" = None,
                       timeout: "datetime.timedelta | float | None" = None, **kwargs: Any) -> DistEnv:
    """Start the default process group for this launch and return its `DistEnv`.

    `backend`: None chooses NCCL when this process has a CUDA device, else gloo.
    `timeout` (seconds or timedelta): torch's collective timeout (default torch's own);
    the rendezvous waits at most min(timeout, DISTENV_TIMEOUT or 180 s) for every rank.
    Other keyword arguments go to `torch.distributed.init_process_group` (pg_options,
    device_id, ...). Raises `DistEnvError` for a launch that cannot start a process group
    (per-node, incomplete, or ranks that do not all come in time: one line naming them).

    Called while the default group is up (a second call; a group the script started), it
    starts nothing and returns the description when the group is this launch's (same rank
    and world size, and `backend` if given); otherwise it raises `DistEnvError`.
    """
    global _device, _started
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _already_up(dist, backend)
    env = bring_up("torch", timeout=rendezvous_timeout(_as_timedelta(timeout)).total_seconds())
    pinned = pin(env)
    chosen = choose_backend(backend, pinned.device, dist.is_nccl_available())
    _device = torch.device("cpu") if pinned.device is None else torch.device("cuda", pinned.device)

    pg_timeout = _as_timedelta(timeout)
    if pg_timeout is not None:
        kwargs["timeout"] = pg_timeout
    if kwargs.get("store") is None and "init_method" not in kwargs:
        store = _rendezvous(env, rendezvous_timeout(pg_timeout))
        if pg_timeout is None:
            from torch.distributed.distributed_c10d import _get_default_timeout

            pg_timeout = _get_default_timeout(chosen)
        store.set_timeout(pg_timeout)  # later store waits (new_group, ...) use torch's timeout
        # The process group's keys (each rank's gloo address, ...) under a prefix of their own
        # per job, torchrun restart and call (the meeting's key), as torch's env:// does
        # (/worker/attempt_N): the agent's store outlives a restart, and restarted ranks would
        # otherwise read the dead round's addresses (gloo: "Connection refused").
        kwargs["store"] = dist.PrefixStore(f"distenv/pg/{_key}/", store)
    dist.init_process_group(chosen, rank=env.rank, world_size=env.world_size, **kwargs)
    _started = (env, dist.group.WORLD)
    return env


def _already_up(dist: Any, backend: "str | None") -> DistEnv:
    """A call while the default process group is up (a second call, or a group the script or
    a framework started): a no-op returning the launch's description when the group is this
    launch's (same rank and world size, and `backend` if given), else one DistEnvError."""
    env = _started[0] if _started is not None and _started[1] is dist.group.WORLD else resolve()
    rank, size, current = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    asked = []
    if (env.rank, env.world_size) != (rank, size):
        asked.append(f"rank {env.rank} of {env.world_size} ({env.launcher})")
    if backend and str(backend).lower() != current.lower():
        asked.append(f"backend {backend!r}")
    if asked:
        raise DistEnvError(
            f"init_process_group() was called while the default process group is already up as "
            f"rank {rank} of {size} with backend {current!r}, which does not match "
            f"{' and '.join(asked)}. Fix: call init_process_group() once, or end the group first "
            "(distenv.torch.destroy_process_group()) to start another.")
    from .log import get_logger

    get_logger(__name__).debug(
        "init_process_group(): the default process group is already up (rank %d of %d, %s): "
        "nothing to do", rank, size, current)
    return env


def _listening(addr: str, port: int, wait: datetime.timedelta, start: float, size: int) -> None:
    """Return once something accepts connections at addr:port; TimeoutError after `wait`.

    torch's TCPStore client, refused because the server is not listening yet, sleeps a
    jittered backoff before it tries again: a client that came 20 ms before rank 0's store
    connected after 0.3-0.7 s (measured, torch 2.13). Knocking with a plain socket first, the
    client connects within a few milliseconds of the store listening: pauses from 10 ms,
    growing by half, jittered, up to the pre-flight's pace for `size` ranks
    (`distenv.bringup.preflight.pace`: about RATE knocks a second at rank 0's host, whatever the size)."""
    import socket
    import time

    from .bringup.preflight import FIRST_PAUSE, jitter, pace

    pause, cap = FIRST_PAUSE, pace(size)
    while True:
        left = wait.total_seconds() - (time.monotonic() - start)
        try:
            with socket.create_connection((addr, port), timeout=max(0.05, min(left, 2.0))):
                return
        except OSError as exc:
            if left <= 0:
                raise TimeoutError(f"nothing listens at {addr}:{port}: {exc}") from None
        time.sleep(max(0.0, min(pause * jitter(), left)))
        pause = min(pause * 1.5, cap)


def _connect(TCPStore: Any, addr: str, port: int, size: int, host: bool, wait: datetime.timedelta,
             start: float) -> Any:
    """The store, hosted or reached within `wait` of `start`. torch retries a client's connect
    once after a random delay, so one call can take about three times its timeout (measured
    with torch 2.13): a client tries in slices of a third of what is left until the time is up,
    each after the store listens (`_listening`)."""
    import time

    if host:
        return TCPStore(addr, port, size, True, timeout=wait, wait_for_workers=False, multi_tenant=True)
    second = datetime.timedelta(seconds=1)
    while True:
        _listening(addr, port, wait, start, size)
        left = wait - datetime.timedelta(seconds=time.monotonic() - start)
        try:
            return _within(left, lambda: TCPStore(addr, port, size, False,
                                                  timeout=max(left / 3, second),
                                                  wait_for_workers=False, multi_tenant=True))
        except Exception:
            if wait - datetime.timedelta(seconds=time.monotonic() - start) < second:
                raise


def _within(wait: datetime.timedelta, make: "Any") -> Any:
    """`make()`, or TimeoutError once `wait` is over. torch's store client waits without end
    for the answer to its first message when what listens at the port accepts and never
    answers (another program, a hung or foreign server: measured with torch 2.13, 120 s and
    counting under a 3 s timeout); the call stays in a daemon thread, which does not hold
    the process at its exit."""
    import threading

    box: "dict[str, Any]" = {}

    def call() -> None:
        try:
            box["store"] = make()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=call, name="distenv-store-client", daemon=True)
    t.start()
    t.join(max(wait.total_seconds(), 0.0) + 1.0)
    if t.is_alive():
        raise TimeoutError(f"what listens there accepted the connection but never answered "
                           f"torch's store protocol within {wait.total_seconds():.0f} s")
    if "error" in box:
        raise box["error"]
    return box["store"]


_generation = 0  # init_process_group calls in this process: keeps each rendezvous's keys apart
_key = ""  # the last meeting's key: the process group's keys go under it


def meeting(env: DistEnv, wait: datetime.timedelta, generation: int = 0) -> "preflight.Meeting":
    """The pre-flight of this launch on torch's store: every rank, at MASTER_ADDR:MASTER_PORT,
    within `wait`; its key carries the job, torchrun's restart count and the call."""
    from .bringup import preflight

    addr, port, size, rank = env.master_addr, env.master_port, env.world_size, env.rank
    assert addr is not None and port is not None and size is not None and rank is not None
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "-")
    return preflight.Meeting(
        size=size, index=rank, host=addr, port=port, timeout=wait.total_seconds(),
        job=preflight.identity(env, "torch", restart, generation), who="distenv.torch",
        noun="rank", entry="init_process_group",
        address_from=f"{env.provenance.get('master_addr', '')}; port: "
                     f"{env.provenance.get('master_port', '')}",
        address_fix="set MASTER_ADDR to rank 0's host on every rank",
        place="torchrun's store" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        else "rank 0's store", local=env.local_world_size or 1)


def _rendezvous(env: DistEnv, wait: datetime.timedelta) -> Any:
    """The TCPStore every rank joins -- rank 0 hosts it, or torchrun's agent does -- and the
    pre-flight on it (`distenv.bringup.preflight.meet_on`, at most `wait` in all): a rank that never
    comes (dead, hung, never started) is named in one line on every rank that did, also under
    torchrun, where no rank would otherwise wait less than gloo's 30-minute connection timeout.

    Why the store and not the core's socket star (`distenv.bringup.preflight.meet`): under torchrun the
    agent's store is the one address every rank is given, and rank 0 need not run on its host
    (c10d rendezvous), so there is no rank-0 address to dial; and every rank connects to this
    store anyway for the process group: no second port, no second listener. The meeting keeps
    the star's properties: a constant number of requests per rank, rank 0 alone names the
    missing ranks, keys that carry the job."""
    import time

    from torch.distributed import TCPStore

    from .bringup import preflight

    global _generation, _key
    _generation += 1
    start = time.monotonic()
    m = meeting(env, wait, _generation)
    _key = preflight.key(m)
    preflight.descriptors(2 * m.size + 256)  # the store's host holds a connection per rank
    # Under torchrun the agent already hosts the store at MASTER_ADDR:MASTER_PORT: every
    # rank is a client there (torch's env:// does the same).
    host = env.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    try:
        store = _connect(TCPStore, m.host, m.port, m.size, host, wait, start)
    except Exception as exc:  # torch raises DistNetworkError/DistStoreError/RuntimeError
        text = " ".join(str(exc).split())
        if host and "in use" in text.lower():
            raise DistEnvError(
                f"distenv.torch: rank 0 cannot listen on {m.host}:{m.port} for torch's store: the "
                f"port is taken (another job?). Fix: set MASTER_PORT to a free port on every rank "
                f"(torch said: {text[:200]}).") from None
        raise DistEnvError(preflight.unreachable(m, None, False, f"torch said: {text[:200]}")) from None
    preflight.meet_on(store, m, start)
    return store


def destroy_process_group() -> None:
    """End the default process group at the end of a script, in place of
    ``torch.distributed.destroy_process_group()``: it first waits (the GIL released) until
    torch's gloo and autograd worker threads are idle, destroys the group, and waits again.
    torch's own can hang or abort a finished job: ``~ProcessGroupGloo`` waits for a worker
    thread that itself waits for the GIL (pytorch/pytorch#190489; see distenv.bringup.teardown).
    Nothing happens when no group is up."""
    from .bringup import teardown as _teardown

    _teardown.end()


def device() -> Any:
    """The torch.device this process trains on (after init_process_group: its bound CUDA
    device, or the CPU); before it, the device init_process_group would choose."""
    import torch

    if _device is not None:
        return _device
    env = resolve()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index, _ = choose_device(env if env.launch != PER_NODE else env.replace(local_rank=0), count)
    return torch.device("cpu") if index is None else torch.device("cuda", index)


__all__ = ["init_process_group", "destroy_process_group", "device", "pin", "Pin", "meeting",
           "RendezvousError", "DEFAULT_RENDEZVOUS_TIMEOUT"]
