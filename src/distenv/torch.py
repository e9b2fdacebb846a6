"""PyTorch: one call that starts `torch.distributed` right under any launcher.

    import distenv.torch

    env = distenv.torch.init_process_group()     # mpirun, srun, torchrun, python, ...
    model = DDP(model.to(distenv.torch.device()))
    if env.is_main:
        print(loss)

`init_process_group(backend=None, timeout=None, **kwargs)`:

1. resolves the launch (`distenv.resolve()`) and refuses a *per-node* launch (one
   process per node that was meant to start the workers) with the command that would;
2. exports the torch variables (MASTER_ADDR, RANK, ...; see `DistEnv.export`) for any
   library that reads them later;
3. chooses the backend: NCCL when a CUDA device is usable, else gloo;
4. binds this process's CUDA device: local rank N takes device N, unless the scheduler
   already narrowed CUDA_VISIBLE_DEVICES per task (fewer devices than local processes),
   in which case each process takes its first visible device;
5. sets the CPU thread count when the user did not (OMP_NUM_THREADS unset): the cores
   this process may run on, shared among the processes of the node unless the launcher
   bound each process to cores of its own;
6. joins the rendezvous with a short timeout (DISTENV_TIMEOUT seconds, default 180, never
   longer than `timeout`): a rank that never starts makes every other rank fail with a
   message naming what is missing, instead of waiting torch's 30 minutes.

torch is imported inside the functions: `import distenv.torch` costs nothing without it.
"""

from __future__ import annotations

import datetime
import os

from . import resolve
from . import knobs
from .description import PER_NODE, DistEnv
from .errors import DistEnvError, install_excepthook

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

#: Seconds the rendezvous waits for every rank (override: DISTENV_TIMEOUT; see distenv.knobs).
DEFAULT_RENDEZVOUS_TIMEOUT = knobs.DEFAULT_TIMEOUT

_device = None  # set by init_process_group
#: (description, default group) of the group init_process_group started last.
_started: "tuple[DistEnv, Any] | None" = None


class RendezvousError(RuntimeError):
    """Not every rank joined the rendezvous in time, or rank 0's address is unusable."""


# -- decisions (pure: unit-tested on recorded environments) ------------------------------------
def per_node_message(env: DistEnv) -> str:
    """Why a per-node launch cannot call init_process_group, and the commands that would work."""
    nproc = env.nproc_per_node if env.nproc_per_node is not None else "N"
    nodes = env.num_nodes if env.num_nodes is not None else "<nodes>"
    node = env.node_rank if env.node_rank is not None else "<node rank>"
    addr = env.master_addr or "<rank 0 host>"
    why = env.provenance.get("launch", "one process per node")
    return (
        f"this process is node {node} of {nodes} of a per-node launch ({why}; "
        f"nproc_per_node={nproc} from {env.provenance.get('nproc_per_node', 'unknown')}): "
        f"it is not a training worker, so it cannot join a process group. Fix: start the "
        f"{nproc} workers from it, e.g. `torchrun --nnodes {nodes} --node-rank {node} "
        f"--nproc-per-node {nproc} --master-addr {addr} --master-port {env.master_port} "
        f"train.py`, or let Lightning start them (Trainer(plugins=[distenv.lightning."
        f"DistenvEnvironment()], **distenv.lightning.trainer_kwargs())), or launch one process "
        f"per worker (e.g. mpirun -np <workers>) and unset DISTENV_NPROC_PER_NODE."
    )


def choose_device(env: DistEnv, cuda_count: int, environ: "Mapping[str, str] | None" = None
                  ) -> "tuple[int | None, str]":
    """(CUDA device index for this process or None for CPU, why): the core's one-device
    policy (`distenv.gpus.one_device`).

    `cuda_count` is what torch.cuda.device_count() sees, i.e. after CUDA_VISIBLE_DEVICES.
    """
    from .gpus import device_index

    return device_index(env, cuda_count, os.environ if environ is None else environ,
                        "pass backend='gloo'")


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
    (per-node, incomplete) and `RendezvousError` when ranks do not all join in time.

    Called while the default group is up (a second call; a group the script started), it
    starts nothing and returns the description when the group is this launch's (same rank
    and world size, and `backend` if given); otherwise it raises `DistEnvError`.
    """
    global _device, _started
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _already_up(dist, backend)
    env = resolve()
    if env.launch == PER_NODE:
        raise DistEnvError(per_node_message(env))
    # MPICH/Intel MPI across nodes: rank 0's host from the launcher's key-value service.
    from .discovery import complete

    env = complete(env, need=("master_addr", "world_size"), timeout=rendezvous_timeout(
        _as_timedelta(timeout)).total_seconds())
    env.export()

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index, _ = choose_device(env, count)
    chosen = choose_backend(backend, index, dist.is_nccl_available())
    if index is not None:
        torch.cuda.set_device(index)
        _device = torch.device("cuda", index)
    else:
        _device = torch.device("cpu")

    threads, _ = choose_threads(env)
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)

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
        # per torchrun restart and per call, as torch's env:// does (/worker/attempt_N): the
        # agent's store outlives a restart, and restarted ranks would otherwise read the dead
        # round's addresses (gloo: "Connection refused").
        kwargs["store"] = dist.PrefixStore(
            f"distenv/pg/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '-')}/{_generation}/", store)
    dist.init_process_group(chosen, rank=env.rank, world_size=env.world_size, **kwargs)
    _started = (env, dist.group.WORLD)
    from . import _teardown

    _teardown.register()  # an orderly end at exit (torch's gloo threads can abort it otherwise)
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


def _listening(addr: str, port: int, wait: datetime.timedelta, start: float) -> None:
    """Return once something accepts connections at addr:port; TimeoutError after `wait`.

    torch's TCPStore client, refused because the server is not listening yet, sleeps a
    jittered backoff before it tries again: a client that came 20 ms before rank 0's store
    connected after 0.3-0.7 s (measured, torch 2.13). Each rank of a job starts at its own
    pace, so that is what most starts paid. Knocking with a plain socket every few
    milliseconds first, the client connects within 5-10 ms of the store listening."""
    import socket
    import time

    pause = 0.002
    while True:
        left = wait.total_seconds() - (time.monotonic() - start)
        try:
            with socket.create_connection((addr, port), timeout=max(0.05, min(left, 2.0))):
                return
        except OSError as exc:
            if left <= 0:
                raise TimeoutError(f"nothing listens at {addr}:{port}: {exc}") from None
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)


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
        _listening(addr, port, wait, start)
        left = wait - datetime.timedelta(seconds=time.monotonic() - start)
        try:
            return TCPStore(addr, port, size, False, timeout=max(left / 3, second),
                            wait_for_workers=False, multi_tenant=True)
        except Exception:
            if wait - datetime.timedelta(seconds=time.monotonic() - start) < second:
                raise


#: Seconds between rank 0's progress lines while it waits for the other ranks.
PROGRESS_EVERY = 10.0


def _wait_all(store: Any, prefix: str, env: DistEnv, wait: datetime.timedelta, start: float) -> None:
    """Wait (at most `wait` since `start`) until every rank joined; rank 0 logs every
    PROGRESS_EVERY seconds how many did and which are missing (logger ``distenv.torch``)."""
    import time

    size = env.world_size
    assert size is not None  # init_process_group exported it
    while True:
        left = wait.total_seconds() - (time.monotonic() - start)
        step = max(min(left, PROGRESS_EVERY), 1.0) if env.rank == 0 else max(left, 1.0)
        try:
            store.wait([f"{prefix}all"], datetime.timedelta(seconds=step))
            return
        except Exception:  # noqa: BLE001 - torch raises DistStoreError on a timeout
            if env.rank != 0 or left <= step:
                raise
        came = int(store.add(f"{prefix}count", 0))
        if came >= size:
            continue  # the last one is setting the key now
        missing = [r for r in range(size) if not store.check([f"{prefix}rank/{r}"])]
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        from .log import get_logger

        get_logger("distenv.torch").info(
            "%d of %d ranks joined; waiting for %s (%d s so far; gives up after %d s, "
            "DISTENV_TIMEOUT)",
            size - len(missing), size, shown, time.monotonic() - start, wait.total_seconds())


_generation = 0  # init_process_group calls in this process: keeps each rendezvous's keys apart


def _rendezvous(env: DistEnv, wait: datetime.timedelta) -> Any:
    """The TCPStore every rank joins; rank 0 hosts it. Every rank then announces itself and
    waits for all the others, at most `wait` in all: a rank that never comes (dead, hung,
    never started) is named in the error on every rank that did come -- also under torchrun,
    where the agent hosts the store and no rank would otherwise wait before gloo's
    (30-minute) connection timeout."""
    import time

    from torch.distributed import TCPStore

    global _generation
    _generation += 1
    start = time.monotonic()
    addr, port, size = env.master_addr, env.master_port, env.world_size
    assert addr is not None and port is not None and size is not None  # exported before
    where = f"{addr}:{port} ({env.provenance.get('master_addr', '')}; " \
            f"port: {env.provenance.get('master_port', '')})"
    seconds = int(wait.total_seconds())
    # Under torchrun the agent already hosts the store at MASTER_ADDR:MASTER_PORT: every
    # rank is a client there (torch's env:// does the same).
    host = env.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    try:
        store = _connect(TCPStore, addr, port, size, host, wait, start)
    except Exception as exc:  # torch raises DistNetworkError/DistStoreError/RuntimeError
        text = " ".join(str(exc).split())
        if env.rank == 0 and "in use" in text.lower():
            fix = (f"port {port} on {addr} is taken (another job?). Fix: set MASTER_PORT to a "
                   "free port on every rank")
        else:
            fix = (f"rank {env.rank} could not reach rank 0's store at {where} within "
                   f"{seconds} s. Check that rank 0 started and that {addr} is rank 0's host, "
                   f"reachable from here (else set MASTER_ADDR); set DISTENV_TIMEOUT=<seconds> "
                   "to wait longer")
        raise RendezvousError(f"distenv.torch: rendezvous of {size} ranks failed: {fix}. "
                              f"torch said: {text[:300]}") from None

    import socket

    prefix = (f"distenv/join/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '-')}/"
              f"{_generation}/")
    try:
        store.set(f"{prefix}rank/{env.rank}", socket.gethostname())
        if store.add(f"{prefix}count", 1) >= size:
            store.set(f"{prefix}all", "1")
        _wait_all(store, prefix, env, wait, start)
    except Exception as exc:  # the wait timed out, or rank 0 (the store) went away
        text = " ".join(str(exc).split())
        try:
            came = {r: store.get(f"{prefix}rank/{r}").decode(errors="replace")
                    for r in range(size) if store.check([f"{prefix}rank/{r}"])}
        except Exception:  # noqa: BLE001 - the store itself is gone (rank 0 died)
            raise RendezvousError(
                f"distenv.torch: rendezvous of {size} ranks failed: rank {env.rank} lost rank "
                f"0's store at {where} while waiting for the other ranks (rank 0 ended?). "
                f"torch said: {text[:300]}") from None
        missing = [r for r in range(size) if r not in came]
        shown = ", ".join(map(str, missing[:20])) + (f", ... ({len(missing)} in all)"
                                                     if len(missing) > 20 else "")
        hosts = sorted(set(came.values()))
        raise RendezvousError(
            f"distenv.torch: rendezvous of {size} ranks failed: rank {env.rank} waited "
            f"{seconds} s at {where}; rank(s) {shown} never joined ({len(came)} of {size} "
            f"did, on {', '.join(hosts[:8])}{', ...' if len(hosts) > 8 else ''}). Check that "
            f"the launcher started {size} processes, that none of them died or hangs before "
            f"init_process_group, and that each reaches {addr}; set DISTENV_TIMEOUT=<seconds> "
            f"to wait longer. torch said: {text[:200]}") from None
    return store


def destroy_process_group() -> None:
    """End the default process group at the end of a script, in place of
    ``torch.distributed.destroy_process_group()``: it first waits (the GIL released) until
    torch's gloo and autograd worker threads are idle, destroys the group, and waits again.
    torch's own can hang or abort a finished job: ``~ProcessGroupGloo`` waits for a worker
    thread that itself waits for the GIL (pytorch/pytorch#190489; see distenv._teardown).
    Nothing happens when no group is up."""
    from . import _teardown

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


__all__ = ["init_process_group", "destroy_process_group", "device", "RendezvousError", "DEFAULT_RENDEZVOUS_TIMEOUT"]
