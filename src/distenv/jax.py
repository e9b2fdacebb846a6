"""JAX: `jax.distributed.initialize` right under any launcher distenv resolves.

    import distenv.jax
    distenv.jax.initialize()           # mpirun, mpiexec (MPICH, Intel MPI), srun, torchrun, ...
    import jax                          # jax.process_count() == the launch's processes

JAX detects a few launchers itself (Open MPI, SLURM, mpi4py, some clouds); under MPICH, Intel
MPI, torchrun, Azure ML, SageMaker, GCP/Vertex and Kubeflow per-node launches or TF_CONFIG its
`jax.distributed.initialize()` stops at "coordinator_address should be defined". `initialize()`:

1. takes the process count and index from the resolved launch: one JAX process per worker in a
   per-process launch; in a per-node launch (one process per node) one JAX process per node,
   owning the node's devices (`process_id` = node rank);
2. puts the coordinator on process 0's host (`master_addr`; unknown across MPICH nodes: then
   `distenv.discovery.complete(env, need=("master_addr",))` where this distenv has it) at a
   port from the core's rule (`coordinator_port`: never the master port, which torchrun's agent
   holds);
3. binds local devices: per-process, one GPU per process (the local rank's, by the core's
   policy `distenv.core.gpus.share`, which torch's device follows too), with CUDA_VISIBLE_DEVICES
   narrowed to it (unless torch is imported here: CUDA may be initialised already, so JAX's
   `local_device_ids` alone selects it); per-node, every visible GPU -- or, on a CPU-only node
   with several workers per node (DISTENV_NPROC_PER_NODE), that many XLA CPU devices;
4. picks gloo for CPU collectives when nothing chose an implementation (older JAX had none);
5. before JAX's own wait (it aborts the process after `initialization_timeout`, 300 s, with a
   message that names nobody), meets every process at the coordinator's port within
   DISTENV_TIMEOUT seconds (default 180): a process that never comes is named in a
   `DistEnvError` on every process that did; JAX's heartbeat and shutdown timeouts are cut to
   that time too, so a process that dies later ends the others within it.

Explicit arguments win over all of this. `patch()` makes a plain `jax.distributed.initialize()`
(and so `keras.distribution.initialize()` on the JAX backend) do the same: `DISTENV_AUTO=1`
calls it when a script imports JAX. JAX is imported inside the functions only.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from dataclasses import dataclass, field, replace

from .core import gpus
from . import knobs
from .core.description import PER_NODE, DistEnv
from .errors import DistEnvError, install_excepthook
from .core.resolver import resolved

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from logging import Logger
    from typing import Any

def _log() -> "Logger":
    from .log import get_logger

    return get_logger(__name__)

#: Written beside CUDA_VISIBLE_DEVICES when distenv narrowed it: a second look must not narrow
#: the slice again (the core's marker, `distenv.core.gpus`, which distenv.tensorflow writes too).
GPU_SLICE_VAR = gpus.GPU_SLICE_VAR
#: JAX's own defaults, kept when DISTENV_TIMEOUT is longer (jax/_src/distributed.py).
JAX_HEARTBEAT_TIMEOUT = 100
JAX_SHUTDOWN_TIMEOUT = 300
#: The shortest heartbeat timeout distenv sets: heartbeats come from a C++ thread, but on a
#: loaded machine a few seconds can pass between two of them.
MIN_HEARTBEAT = 10



@dataclass(frozen=True)
class Devices:
    """How this process binds its devices: narrow CUDA_VISIBLE_DEVICES to `cuda_visible_devices`
    (None: leave it), give JAX `local_device_ids`, and `cpu_devices` XLA CPU devices (None:
    JAX's default); `why`."""

    local_device_ids: "list[int]" = field(default_factory=list)
    cuda_visible_devices: "str | None" = None
    cpu_devices: "int | None" = None
    why: str = ""


@dataclass(frozen=True)
class Plan:
    """What `initialize()` gives `jax.distributed.initialize` (see `plan`), and what it did:
    `initialized` (the runtime was started), `jax_cluster` (JAX's own detection was used
    instead: then the other values are JAX's and left None here)."""

    env: DistEnv
    coordinator_address: "str | None" = None
    num_processes: "int | None" = None
    process_id: "int | None" = None
    local_device_ids: "list[int]" = field(default_factory=list)
    cuda_visible_devices: "str | None" = None
    cpu_devices: "int | None" = None
    timeout: float = 0.0
    why: "dict[str, str]" = field(default_factory=dict)
    initialized: bool = False
    jax_cluster: "str | None" = None


_last: "list[Plan]" = []  # the plan of the last initialize(), for inspection


def last() -> "Plan | None":
    """The plan of the last `initialize()` (or patched call) in this process, or None."""
    return _last[-1] if _last else None


def _keep(p: Plan) -> Plan:
    _last[:] = [p]
    return p


# -- decisions (pure: unit-tested on recorded environments) ------------------------------------
def _because(d: DistEnv, field: str) -> str:
    why = d.provenance.get(field)
    return f" ({why})" if why else ""


def processes(d: DistEnv) -> "tuple[int | None, int | None, str]":
    """(JAX process count, this process's index, why): one JAX process per worker, or per
    node in a per-node launch."""
    if d.launch == PER_NODE:
        return d.num_nodes, d.node_rank, ("per-node launch: one JAX process per node "
                                          f"(node_rank {d.node_rank} of num_nodes {d.num_nodes})")
    return d.world_size, d.rank, f"per-process launch: rank {d.rank} of world_size {d.world_size}"


def coordinator_port(d: DistEnv, environ: "Mapping[str, str] | None" = None,
                     port: "int | None" = None) -> "tuple[int, str]":
    """(port, why) for the coordinator service process 0 hosts.

    `port`, else JAX_COORDINATOR_PORT (JAX's own variable), else DISTENV_KERAS_PORT, else the
    core's side port for "jax" (`distenv.knobs.side_port`: derived from the job's launcher, id,
    master address and port by `distenv.core.ports`, the same on every process, different across
    concurrent jobs, never the master port, which torchrun's agent store holds).
    """
    src = os.environ if environ is None else environ
    if port is not None:
        return int(port), "given"
    for var in ("JAX_COORDINATOR_PORT", knobs.KERAS_PORT):
        if src.get(var):
            return knobs.side_port(d, "jax", src, var=var), f"{var}={src[var]}"
    return knobs.side_port(d, "jax", src), (
        "derived from the job by distenv.knobs.side_port (distenv.core.ports), not the master port")


def device_plan(d: DistEnv, environ: "Mapping[str, str] | None" = None,
                torch_imported: "bool | None" = None) -> Devices:
    """How this process binds its devices, without JAX (`Devices`). Which GPUs: the core's
    policy (`distenv.core.gpus.share`); how JAX is told: here."""
    from .core.gpus import CROWDED, GIVEN, NODE, NONE, UNKNOWN, share, unknown_error

    src = os.environ if environ is None else environ
    if torch_imported is None:
        torch_imported = "torch" in sys.modules
    mine = share(d, src)
    count = mine.count
    if mine.kind == NONE:
        nproc = d.nproc_per_node or 1
        user = ("xla_force_host_platform_device_count" in src.get("XLA_FLAGS", "")
                or src.get("JAX_NUM_CPU_DEVICES"))
        if d.launch == PER_NODE and nproc > 1 and not user:
            return Devices(cpu_devices=nproc, why=(
                f"CPU-only node of a per-node launch: the node's JAX process gets {nproc} XLA CPU "
                f"devices, one per worker (nproc_per_node: {d.provenance.get('nproc_per_node', '')})"))
        return Devices(why=f"CPU only ({mine.seen})")
    if mine.kind in (GIVEN, NODE):
        return Devices(list(mine.positions), why=mine.why)
    if mine.kind == UNKNOWN:
        raise DistEnvError(unknown_error(mine, "set JAX_PLATFORMS=cpu"))
    if mine.kind == CROWDED:
        raise DistEnvError(
            f"{d.local_world_size} JAX processes on this node but only {count} GPU(s) visible "
            f"({mine.seen}) and CUDA_VISIBLE_DEVICES is unset: JAX gives each process its own device. "
            "Fix: start one process per GPU, give each task its own GPUs (srun --gpus-per-task), "
            "start one process per node (DISTENV_NPROC_PER_NODE) or set JAX_PLATFORMS=cpu."
        )
    index, why = mine.positions[0], mine.why
    if count == 1 or torch_imported:
        return Devices([index], why=why + ("" if count == 1 else " (CUDA_VISIBLE_DEVICES left "
                                           "alone: torch is imported here and may have initialised CUDA)"))
    narrowed = mine.ids[0]
    return Devices([0], narrowed, why=f"{why}: CUDA_VISIBLE_DEVICES={narrowed}")


def timeouts(environ: "Mapping[str, str] | None" = None, timeout: "float | None" = None
             ) -> "tuple[float, str]":
    """(seconds every process waits for the others, why): `timeout`, else DISTENV_TIMEOUT,
    else 180 (`distenv.knobs.timeout`)."""
    src = os.environ if environ is None else environ
    raw = knobs.TIMEOUT.raw(src)
    return knobs.timeout(src, timeout), ("given" if timeout is not None else f"{knobs.TIMEOUT}={raw}"
                                         if raw else f"the default ({knobs.TIMEOUT} unset)")


def plan(env: "DistEnv | Mapping[str, str] | None" = None, *,
         environ: "Mapping[str, str] | None" = None, port: "int | None" = None,
         timeout: "float | None" = None, coordinator_address: "str | None" = None,
         num_processes: "int | None" = None, process_id: "int | None" = None,
         local_device_ids: "int | Sequence[int] | None" = None, discover: bool = False
         ) -> Plan:
    """What `initialize()` would give `jax.distributed.initialize`, without JAX (pure unless
    `discover`: then what the launch leaves unknown comes from the launcher's service,
    `distenv.bringup.bring_up`). Explicit values win; JAX_COORDINATOR_ADDRESS counts as
    explicit (JAX itself reads it)."""
    d, src = resolved(env, environ)
    why: "dict[str, str]" = {}
    seconds, why["timeout"] = timeouts(src, timeout)
    if discover:
        from .bringup import bring_up, needs

        given = {"master_addr": coordinator_address is not None or bool(src.get("JAX_COORDINATOR_ADDRESS")),
                 "world_size": num_processes is not None, "num_nodes": num_processes is not None,
                 "node_rank": process_id is not None}
        # The one way up; what the launch leaves unknown (MPICH, Intel MPI across nodes) comes
        # from the launcher's service -- collective: every process asks.
        d = bring_up("jax", env=d, need=tuple(f for f in needs(d) if not given[f]), timeout=seconds)
    count, index, how = processes(d)
    if num_processes is None:
        num_processes, why["num_processes"] = count, how
    if process_id is None:
        process_id, why["process_id"] = index, how
    if num_processes is None or process_id is None:
        missing = " and ".join(n for n, v in (("the process count", num_processes),
                                               ("this process's index", process_id)) if v is None)
        raise DistEnvError(
            f"jax.distributed.initialize needs {missing}, which {d.launcher} does not reveal"
            f"{_because(d, 'world_size' if num_processes is None else 'rank')}. "
            "Fix: launch with a launcher that does (MPICH: without -pmi-port), or pass "
            "num_processes= and process_id= to initialize()."
        )
    if coordinator_address is not None:
        why["coordinator_address"] = "given"
    elif src.get("JAX_COORDINATOR_ADDRESS"):
        coordinator_address = src["JAX_COORDINATOR_ADDRESS"]
        why["coordinator_address"] = "JAX_COORDINATOR_ADDRESS"
    if coordinator_address is None:
        addr = d.master_addr
        if addr is None and num_processes == 1:
            addr = "127.0.0.1"
        if addr is None:
            raise DistEnvError(
                f"jax.distributed.initialize needs process 0's address (the coordinator), which "
                f"{d.launcher} does not reveal across nodes"
                f"{_because(d, 'master_addr')}. "
                "Fix: export MASTER_ADDR=<process 0's host> (or JAX_COORDINATOR_ADDRESS=<host>:<port>) "
                "to every process, e.g. mpiexec -genv MASTER_ADDR <host>."
            )
        p, pwhy = coordinator_port(d, src, port)
        coordinator_address = knobs.address(addr, p)
        why["coordinator_address"] = f"master_addr ({d.provenance.get('master_addr', '')}); port {pwhy}"
    devices = device_plan(d, src)
    if local_device_ids is None and src.get("JAX_LOCAL_DEVICE_IDS"):
        devices = Devices([int(x) for x in src["JAX_LOCAL_DEVICE_IDS"].split(",")],
                          why="JAX_LOCAL_DEVICE_IDS")
    elif local_device_ids is not None:
        devices = Devices([local_device_ids] if isinstance(local_device_ids, int)
                          else list(local_device_ids), why="given")
    why["devices"] = devices.why
    if not (0 <= process_id < num_processes):
        raise DistEnvError(f"process_id={process_id} is not in 0..{num_processes - 1} "
                           f"(num_processes={num_processes}). Fix: pass matching values.")
    return Plan(d, coordinator_address, int(num_processes), int(process_id),
                devices.local_device_ids, devices.cuda_visible_devices, devices.cpu_devices,
                seconds, why)


# -- pre-flight: every process meets process 0 before JAX's long, silent wait -------------------
def preflight(address: str, num_processes: int, process_id: int, timeout: float,
              what: str = "", job: str = "", local: int = 1) -> float:
    """Every process meets process 0 at `address` (``host:port``: process 0's host and the
    pre-flight's port, `distenv.bringup.preflight.port`), before JAX's coordinator starts: the core's
    one pre-flight (`distenv.bringup.preflight.meet`). A process that never comes within `timeout` is
    named in a `DistEnvError` on every process that came; a process that cannot reach process 0
    names the address. Returns the seconds it took. `what` says where the address came from;
    `job` is the job's identity (`distenv.bringup.preflight.identity`); `local` the processes on
    this host (their pace)."""
    from .bringup import preflight as core

    host, _, port = address.rpartition(":")
    return core.meet(core.Meeting(
        size=num_processes, index=process_id, host=host.strip("[]"), port=int(port),
        job=job or f"jax|{address}", timeout=timeout, who="distenv.jax", noun="process",
        entry="jax.distributed.initialize", address_from=what,
        address_fix="set MASTER_ADDR, or JAX_COORDINATOR_ADDRESS=<host>:<port>, on every process",
        local=local))


# -- the call ---------------------------------------------------------------------------------
def _apply_devices(p: Plan, jax: "Any") -> None:
    """Write what the plan says before JAX creates its backends."""
    cuda = p.cuda_visible_devices
    if cuda is not None and os.environ.get("CUDA_VISIBLE_DEVICES") != cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[GPU_SLICE_VAR] = cuda
    if p.cpu_devices:
        try:
            jax.config.update("jax_num_cpu_devices", p.cpu_devices)
        except (AttributeError, KeyError, ValueError):  # older JAX: the XLA flag
            flag = f"--xla_force_host_platform_device_count={p.cpu_devices}"
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    try:
        current = jax.config.jax_cpu_collectives_implementation
    except AttributeError:
        current = "unknown"
    if current in (None, "none", ""):
        try:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except (AttributeError, KeyError, ValueError):  # pragma: no cover - a JAX without gloo
            pass


def _call(original: "Any", p: Plan, extra: "dict[str, Any]", preflight_on: bool = True) -> "Any":
    """Pre-flight, then `original` (jax.distributed.initialize) with the plan's arguments."""
    import inspect

    accepted: "set[str] | None"
    try:
        accepted = set(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        accepted = None
    seconds = p.timeout
    wait = max(1, math.ceil(seconds))
    kwargs = {"coordinator_address": p.coordinator_address, "num_processes": p.num_processes,
              "process_id": p.process_id, "local_device_ids": p.local_device_ids,
              "initialization_timeout": wait,
              "heartbeat_timeout_seconds": min(JAX_HEARTBEAT_TIMEOUT, max(MIN_HEARTBEAT, wait)),
              "shutdown_timeout_seconds": min(JAX_SHUTDOWN_TIMEOUT, max(MIN_HEARTBEAT, wait))}
    kwargs.update(extra)  # the caller's own arguments win
    if accepted is not None and not any(
            v.kind == inspect.Parameter.VAR_KEYWORD for v in inspect.signature(original).parameters.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in accepted or k in extra}
    n, index, address = p.num_processes, p.process_id, p.coordinator_address
    assert n is not None and index is not None and address is not None  # a plan of distenv's own
    if preflight_on and n > 1:
        from .bringup import preflight as core

        host = address.rpartition(":")[0].strip("[]")
        met = knobs.address(host, core.port(p.env, host))
        took = preflight(met, n, index, seconds, p.why.get("coordinator_address", ""),
                         core.identity(p.env, "jax", address, n), p.env.local_world_size or 1)
        _log().debug("%d processes met at %s in %.1f s", n, met, took)
    return original(**kwargs)


def initialize(coordinator_address: "str | None" = None, num_processes: "int | None" = None,
               process_id: "int | None" = None,
               local_device_ids: "int | Sequence[int] | None" = None, *,
               env: "DistEnv | Mapping[str, str] | None" = None, port: "int | None" = None,
               timeout: "float | None" = None, preflight: bool = True,
               **kwargs: "Any") -> Plan:
    """Start JAX's distributed runtime for this launch; returns the plan used (see `plan`).

    Call it before any JAX computation. Arguments named like `jax.distributed.initialize`'s win
    over the launch; other keywords go to it unchanged. `env`: a DistEnv or a mapping to read
    instead of os.environ. `port`: the coordinator port. `timeout`: seconds every process waits
    for the others (default DISTENV_TIMEOUT, else 180). A single process binds its devices and
    does not start the runtime (nothing to coordinate) -- unless distenv found no launcher and
    JAX's own detection finds a cluster no distenv source reads (`own_detection`: a Cloud TPU
    VM, Kubernetes): then JAX's ``initialize()`` runs with JAX's own values.
    """
    import jax

    original = jax.distributed.initialize
    if getattr(original, "_distenv", False):  # patched: the pre-flight must not run twice
        original = original.__wrapped__
    explicit = coordinator_address is not None or num_processes is not None or process_id is not None
    d, src = resolved(env, None)
    cluster = _defer(d, jax, explicit or local_device_ids is not None)
    if cluster is not None:
        original(**kwargs)
        return _keep(Plan(d, initialized=True, jax_cluster=cluster, why={
            "num_processes": f"JAX's own {cluster!r} detection (no launcher variables)"}))
    p = plan(d, environ=src, port=port, timeout=timeout, coordinator_address=coordinator_address,
             num_processes=num_processes, process_id=process_id,
             local_device_ids=local_device_ids, discover=True)
    _apply_devices(p, jax)
    _keep(p)
    if (p.num_processes or 0) > 1 or explicit:
        _call(original, p, kwargs, preflight)
        return _keep(replace(p, initialized=True))
    return p


def own_detection(jax: "Any") -> "str | None":
    """The cluster JAX's own detection finds (``jax/_src/clusters``: Cloud TPU/GCE, Kubernetes,
    ...) among those no distenv source covers (`Frameworks.covers`), or None. Asked only when
    distenv found no launcher: there "one process" is distenv's default, not a proof, and a
    platform JAX knows must keep its own answer (never ``num_processes=1`` over it). Opt-in
    detections (mpi4py) are not asked; one that fails counts as absent."""
    import importlib

    try:
        types = list(importlib.import_module("jax._src.clusters").ClusterEnv._cluster_types)
    except (ImportError, AttributeError):  # a JAX without this registry: nothing to ask
        return None
    from .sources import covered

    mine = covered("jax")
    for cls in types:
        name = getattr(cls, "name", cls.__name__)
        if getattr(cls, "opt_in_only_method", False) or name in mine:
            continue
        try:
            if cls.is_env_present():
                return str(name)
        except Exception:  # noqa: BLE001 - a detection that cannot run has found nothing
            continue
    return None


def _defer(d: DistEnv, jax: "Any", explicit: bool) -> "str | None":
    """JAX's own cluster, when distenv found no launcher and the caller named nothing."""
    if explicit or d.launcher != "none":
        return None
    found = own_detection(jax)
    if found is not None:
        _log().info("no launcher variables found, but JAX's own detection finds a %r cluster: "
                    "jax.distributed.initialize runs with JAX's values", found)
    return found


# -- zero code ----------------------------------------------------------------------------------
_original: "Any" = None  # JAX's own jax.distributed.initialize while patched


def patch() -> None:
    """Make `jax.distributed.initialize` fill what the caller leaves out from the launch (see the
    module docstring); explicit arguments still win. Idempotent; `unpatch()` undoes it.
    Scripts that did `from jax.distributed import initialize` before this keep JAX's own."""
    global _original
    import inspect

    import jax
    import jax.distributed

    current = jax.distributed.initialize
    if getattr(current, "_distenv", False):
        return
    signature = inspect.signature(current)

    @functools.wraps(current)
    def initialize(*args: "Any", **kwargs: "Any") -> "Any":
        given = signature.bind_partial(*args, **kwargs).arguments
        named = {k: given.pop(k) for k in ("coordinator_address", "num_processes", "process_id",
                                           "local_device_ids") if given.get(k) is not None}
        given = {k: v for k, v in given.items() if v is not None}
        if given.pop("cluster_detection_method", None) is not None and not named:
            # The user asked for one of JAX's own detections: theirs, unchanged.
            return current(*args, **kwargs)
        if not named and _defer(resolved(None, None)[0], jax, False) is not None:
            return current(*args, **kwargs)  # a platform JAX knows and distenv does not
        p = plan(discover=True, **named)
        _apply_devices(p, jax)
        _keep(replace(p, initialized=True))
        return _call(current, p, given)

    initialize._distenv = True  # type: ignore[attr-defined]  # a marker on the wrapper
    _original = current
    jax.distributed.initialize = initialize


def unpatch() -> None:
    global _original
    if _original is None:
        return
    import jax.distributed

    jax.distributed.initialize = _original
    _original = None


__all__ = ["initialize", "plan", "patch", "unpatch", "preflight", "coordinator_port",
           "device_plan", "processes", "own_detection", "last", "Plan", "Devices"]
