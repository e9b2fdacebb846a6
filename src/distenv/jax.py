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
   policy `distenv.gpus.share`, which torch's device follows too), with CUDA_VISIBLE_DEVICES
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
import socket
import sys
import time
import zlib

from . import gpus
from .description import PER_NODE, DistEnv
from .errors import DistEnvError, install_excepthook
from .resolver import resolved

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
#: the slice again (the core's marker, `distenv.gpus`, which distenv.tensorflow writes too).
GPU_SLICE_VAR = gpus.GPU_SLICE_VAR
#: JAX's own defaults, kept when DISTENV_TIMEOUT is longer (jax/_src/distributed.py).
JAX_HEARTBEAT_TIMEOUT = 100
JAX_SHUTDOWN_TIMEOUT = 300
#: The shortest heartbeat timeout distenv sets: heartbeats come from a C++ thread, but on a
#: loaded machine a few seconds can pass between two of them.
MIN_HEARTBEAT = 10

_last: "dict[str, Any]" = {}  # the plan of the last initialize(), for inspection


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
    master address and port by `distenv.ports`, the same on every process, different across
    concurrent jobs, never the master port, which torchrun's agent store holds).
    """
    from . import knobs

    src = os.environ if environ is None else environ
    if port is not None:
        return int(port), "given"
    for var in ("JAX_COORDINATOR_PORT", "DISTENV_KERAS_PORT"):
        if src.get(var):
            return knobs.side_port(d, "jax", src, var=var), f"{var}={src[var]}"
    return knobs.side_port(d, "jax", src), (
        "derived from the job by distenv.knobs.side_port (distenv.ports), not the master port")


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def device_plan(d: DistEnv, environ: "Mapping[str, str] | None" = None,
                torch_imported: "bool | None" = None) -> "dict[str, Any]":
    """How this process binds its devices, without JAX: ``{"cuda_visible_devices": str|None
    (narrow to this), "local_device_ids": list, "cpu_devices": int|None, "why": str}``. Which
    GPUs: the core's policy (`distenv.gpus.share`); how JAX is told: here."""
    from .gpus import CROWDED, GIVEN, NODE, NONE, share

    src = os.environ if environ is None else environ
    if torch_imported is None:
        torch_imported = "torch" in sys.modules
    mine = share(d, src)
    count = mine.count
    out: "dict[str, Any]" = {"cuda_visible_devices": None, "local_device_ids": [], "cpu_devices": None}
    if mine.kind == NONE:
        nproc = d.nproc_per_node or 1
        user = ("xla_force_host_platform_device_count" in src.get("XLA_FLAGS", "")
                or src.get("JAX_NUM_CPU_DEVICES"))
        if d.launch == PER_NODE and nproc > 1 and not user:
            out["cpu_devices"] = nproc
            out["why"] = (f"CPU-only node of a per-node launch: the node's JAX process gets "
                          f"{nproc} XLA CPU devices, one per worker "
                          f"(nproc_per_node: {d.provenance.get('nproc_per_node', '')})")
        else:
            out["why"] = f"CPU only ({mine.seen})"
        return out
    if mine.kind in (GIVEN, NODE):
        out["local_device_ids"] = list(mine.positions)
        out["why"] = mine.why
        return out
    if mine.kind == CROWDED:
        raise DistEnvError(
            f"{d.local_world_size} JAX processes on this node but only {count} GPU(s) visible "
            f"({mine.seen}) and CUDA_VISIBLE_DEVICES is unset: JAX gives each process its own device. "
            "Fix: start one process per GPU, give each task its own GPUs (srun --gpus-per-task), "
            "start one process per node (DISTENV_NPROC_PER_NODE) or set JAX_PLATFORMS=cpu."
        )
    index, why = mine.positions[0], mine.why
    if count == 1 or torch_imported:
        out["local_device_ids"] = [index]
        out["why"] = why + ("" if count == 1 else " (CUDA_VISIBLE_DEVICES left alone: torch is "
                                                 "imported here and may have initialised CUDA)")
        return out
    narrowed = mine.ids[0]
    out["cuda_visible_devices"] = narrowed
    out["local_device_ids"] = [0]
    out["why"] = f"{why}: CUDA_VISIBLE_DEVICES={narrowed}"
    return out


def timeouts(environ: "Mapping[str, str] | None" = None, timeout: "float | None" = None
             ) -> "tuple[float, str]":
    """(seconds every process waits for the others, why): `timeout`, else DISTENV_TIMEOUT,
    else 180 (`distenv.knobs.timeout`)."""
    from . import knobs

    src = os.environ if environ is None else environ
    if timeout is not None:
        if not float(timeout) > 0:
            raise DistEnvError(f"timeout={timeout!r} is not a positive number of seconds.")
        return float(timeout), "given"
    raw = src.get("DISTENV_TIMEOUT")
    return knobs.timeout(src), (f"DISTENV_TIMEOUT={raw}" if raw and raw.strip()
                                else "the default (DISTENV_TIMEOUT unset)")


def plan(env: "DistEnv | Mapping[str, str] | None" = None, *,
         environ: "Mapping[str, str] | None" = None, port: "int | None" = None,
         timeout: "float | None" = None, coordinator_address: "str | None" = None,
         num_processes: "int | None" = None, process_id: "int | None" = None,
         local_device_ids: "int | Sequence[int] | None" = None, discover: bool = False
         ) -> "dict[str, Any]":
    """What `initialize()` would give `jax.distributed.initialize`, without JAX (pure unless
    `discover`): ``{"coordinator_address", "num_processes", "process_id", "local_device_ids",
    "cuda_visible_devices", "cpu_devices", "timeout", "env", "why": {...}}``. Explicit values
    win; JAX_COORDINATOR_ADDRESS counts as explicit (JAX itself reads it)."""
    d, src = resolved(env, environ)
    why: "dict[str, str]" = {}
    seconds, why["timeout"] = timeouts(src, timeout)
    if discover and d.is_distributed and d.launch != PER_NODE and (
            (d.master_addr is None and coordinator_address is None
             and not src.get("JAX_COORDINATOR_ADDRESS"))
            or (d.world_size is None and num_processes is None)):
        from . import discovery

        complete = getattr(discovery, "complete", None)  # the launcher's key-value service
        if complete is not None:  # (MPICH, Intel MPI across nodes; collective: every rank)
            d = complete(d, need=("master_addr", "world_size"), timeout=seconds)
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
        coordinator_address = f"{_bracket(addr)}:{p}"
        why["coordinator_address"] = f"master_addr ({d.provenance.get('master_addr', '')}); port {pwhy}"
    devices = device_plan(d, src)
    if local_device_ids is None and src.get("JAX_LOCAL_DEVICE_IDS"):
        local_device_ids = [int(x) for x in src["JAX_LOCAL_DEVICE_IDS"].split(",")]
        devices.update(cuda_visible_devices=None, cpu_devices=None, why="JAX_LOCAL_DEVICE_IDS")
    elif local_device_ids is not None:
        devices.update(cuda_visible_devices=None, cpu_devices=None, why="given")
    else:
        local_device_ids = devices["local_device_ids"]
    why["devices"] = devices["why"]
    if not (0 <= process_id < num_processes):
        raise DistEnvError(f"process_id={process_id} is not in 0..{num_processes - 1} "
                           f"(num_processes={num_processes}). Fix: pass matching values.")
    return {"coordinator_address": coordinator_address, "num_processes": int(num_processes),
            "process_id": int(process_id),
            "local_device_ids": [local_device_ids] if isinstance(local_device_ids, int) else list(local_device_ids),
            "cuda_visible_devices": devices["cuda_visible_devices"],
            "cpu_devices": devices["cpu_devices"], "timeout": seconds, "env": d, "why": why}


# -- pre-flight: every process meets process 0 before JAX's long, silent wait -------------------
def _split(address: str) -> "tuple[str, int]":
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _hosts(found: "Mapping[int, str]") -> str:
    names = sorted(set(found.values()))
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


def _ranges(ids: "Iterable[object]") -> str:
    ids = list(ids)
    shown = ", ".join(map(str, ids[:20]))
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > 20 else "")


def preflight(address: str, num_processes: int, process_id: int, timeout: float,
              what: str = "") -> float:
    """Every process meets process 0 at `address` (the coordinator's port, before JAX binds it):
    process 0 listens until all others said hello, then answers each "go"; when `timeout`
    passes first it answers "missing <ids>" and raises, and so does every process that came.
    A process that cannot reach process 0 in time raises naming the address. Returns the
    seconds it took. `what` says where the address came from (for the error)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    host, port = _split(address)
    key = str(zlib.crc32(f"{address}|{num_processes}".encode()))  # both ends compute it
    me = socket.gethostname()
    if process_id == 0:
        _serve(host, port, key, num_processes, deadline, timeout, address)
    else:
        _visit(host, port, key, num_processes, process_id, me, deadline, timeout, address, what)
    return time.monotonic() - t0


def _serve(host: str, port: int, key: str, n: int, deadline: float, timeout: float,
           address: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as exc:
        listener.close()
        raise DistEnvError(
            f"distenv.jax: process 0 cannot listen on the coordinator port {port} "
            f"({exc.strerror}): another job or a leftover process holds it. Fix: set "
            "JAX_COORDINATOR_PORT to a free port on every process (or MASTER_PORT, from which "
            "the port is derived)."
        ) from None
    listener.listen(max(128, n))
    listener.settimeout(0.2)
    came: "dict[int, tuple[socket.socket, str]]" = {}   # process id -> (connection, host)
    try:
        while len(came) < n - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [i for i in range(1, n) if i not in came]
                for conn, _ in came.values():
                    _send(conn, f"missing {','.join(map(str, missing))}\n")
                raise DistEnvError(
                    f"distenv.jax: after {timeout:.0f} s, process 0 of {n} (the coordinator, "
                    f"{address}) has not heard from process(es) {_ranges(missing)} "
                    f"({len(came) + 1} of {n} came, on {_hosts({0: socket.gethostname(), **{i: h for i, (_, h) in came.items()}})}): "
                    "they did not start, crashed before initialize, or cannot reach this host. "
                    "Fix: start every process (same launcher, same job), check that process 0's "
                    "address is reachable from them, or raise DISTENV_TIMEOUT."
                )
            try:
                conn, _ = listener.accept()
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                continue
            hello = _read_line(conn, min(2.0, max(0.1, deadline - time.monotonic())))
            words = hello.split()
            if len(words) == 4 and words[0] == "distenv-jax" and words[1] == key \
                    and words[2].isdigit() and 0 < int(words[2]) < n:
                old = came.pop(int(words[2]), None)
                if old is not None:
                    old[0].close()
                came[int(words[2])] = (conn, words[3])
            else:
                conn.close()  # another job's process, or a stray connection
        for conn, _ in came.values():
            _send(conn, "go\n")
    finally:
        for conn, _ in came.values():
            conn.close()
        listener.close()


def _visit(host: str, port: int, key: str, n: int, me_id: int, me: str, deadline: float,
           timeout: float, address: str, what: str) -> None:
    hello = f"distenv-jax {key} {me_id} {me}\n"
    reached = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            conn = socket.create_connection((host, port), timeout=min(1.0, left))
        except OSError:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            continue
        reached = True
        try:
            conn.sendall(hello.encode())
            # process 0 answers when everyone came or its own deadline passed; allow a little
            # beyond ours for that answer to arrive.
            answer = _read_line(conn, max(0.5, deadline - time.monotonic()) + 5.0)
        except OSError:
            answer = ""
        finally:
            conn.close()
        if answer == "go":
            return
        if answer.startswith("missing "):
            raise DistEnvError(
                f"distenv.jax: process {me_id} of {n} met the coordinator (process 0 at {address}), "
                f"but process(es) {_ranges(answer.split()[1].split(','))} never came within "
                f"{timeout:.0f} s: they did not start, crashed before initialize, or cannot reach "
                f"{host}. Fix: start every process (same launcher, same job), or raise DISTENV_TIMEOUT."
            )
        time.sleep(0.2)  # not process 0's pre-flight (yet): another listener on that port
    src = f" ({what})" if what else ""
    raise DistEnvError(
        f"distenv.jax: process {me_id} of {n} could not "
        f"{'meet' if reached else 'reach'} the coordinator (process 0) at {address}{src} within "
        f"{timeout:.0f} s: process 0 did not start, died, or runs on another host. Fix: check "
        "that process 0 started, that this address is its host and reachable from here (else "
        "set MASTER_ADDR or JAX_COORDINATOR_ADDRESS), or raise DISTENV_TIMEOUT."
    )


def _read_line(conn: socket.socket, wait: float) -> str:
    conn.settimeout(wait)
    data = b""
    end = time.monotonic() + wait
    try:
        while not data.endswith(b"\n") and len(data) < 512 and time.monotonic() < end:
            chunk = conn.recv(512)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode("ascii", "replace").strip()


def _send(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall(text.encode())
    except OSError:
        pass


# -- the call ---------------------------------------------------------------------------------
def _apply_devices(p: "dict[str, Any]", jax: "Any") -> None:
    """Write what the plan says before JAX creates its backends."""
    cuda = p["cuda_visible_devices"]
    if cuda is not None and os.environ.get("CUDA_VISIBLE_DEVICES") != cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[GPU_SLICE_VAR] = cuda
    if p["cpu_devices"]:
        try:
            jax.config.update("jax_num_cpu_devices", p["cpu_devices"])
        except (AttributeError, KeyError, ValueError):  # older JAX: the XLA flag
            flag = f"--xla_force_host_platform_device_count={p['cpu_devices']}"
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


def _call(original: "Any", p: "dict[str, Any]", extra: "dict[str, Any]",
          preflight_on: bool = True) -> "Any":
    """Pre-flight, then `original` (jax.distributed.initialize) with the plan's arguments."""
    import inspect

    accepted: "set[str] | None"
    try:
        accepted = set(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        accepted = None
    seconds = p["timeout"]
    wait = max(1, math.ceil(seconds))
    kwargs = {"coordinator_address": p["coordinator_address"], "num_processes": p["num_processes"],
              "process_id": p["process_id"], "local_device_ids": p["local_device_ids"],
              "initialization_timeout": wait,
              "heartbeat_timeout_seconds": min(JAX_HEARTBEAT_TIMEOUT, max(MIN_HEARTBEAT, wait)),
              "shutdown_timeout_seconds": min(JAX_SHUTDOWN_TIMEOUT, max(MIN_HEARTBEAT, wait))}
    kwargs.update(extra)  # the caller's own arguments win
    if accepted is not None and not any(
            v.kind == inspect.Parameter.VAR_KEYWORD for v in inspect.signature(original).parameters.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in accepted or k in extra}
    if preflight_on and p["num_processes"] > 1:
        took = preflight(kwargs["coordinator_address"], p["num_processes"], p["process_id"], seconds,
                         p["why"].get("coordinator_address", ""))
        _log().debug("%d processes met at %s in %.1f s", p["num_processes"],
                     kwargs["coordinator_address"], took)
    return original(**kwargs)


def initialize(coordinator_address: "str | None" = None, num_processes: "int | None" = None,
               process_id: "int | None" = None,
               local_device_ids: "int | Sequence[int] | None" = None, *,
               env: "DistEnv | Mapping[str, str] | None" = None, port: "int | None" = None,
               timeout: "float | None" = None, preflight: bool = True,
               **kwargs: "Any") -> "dict[str, Any]":
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
        out = {"initialized": True, "jax_cluster": cluster, "env": d,
               "why": {"num_processes": f"JAX's own {cluster!r} detection (no launcher variables)"}}
        _last.clear()
        _last.update(out)
        return out
    p = plan(d, environ=src, port=port, timeout=timeout, coordinator_address=coordinator_address,
             num_processes=num_processes, process_id=process_id,
             local_device_ids=local_device_ids, discover=True)
    _apply_devices(p, jax)
    _last.clear()
    _last.update(p)
    if p["num_processes"] > 1 or explicit:
        _call(original, p, kwargs, preflight)
        p["initialized"] = True
    else:
        p["initialized"] = False
    return p


def own_detection(jax: "Any") -> "str | None":
    """The cluster JAX's own detection finds (``jax/_src/clusters``: Cloud TPU/GCE, Kubernetes,
    ...) among those no distenv source covers (`Source.covers`), or None. Asked only when
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
        _last.clear()
        _last.update(p)
        p["initialized"] = True
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
           "device_plan", "processes", "own_detection"]
