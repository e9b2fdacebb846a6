"""TensorFlow: the right `tf.distribute` strategy under any launcher.

    import os
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # tf-keras: see "Keras 3" below
    import distenv.tensorflow

    strategy = distenv.tensorflow.strategy()            # first TensorFlow call of the script
    with strategy.scope():
        model = ...
    model.fit(..., callbacks=distenv.keras.callbacks([...]))

Under mpirun, srun or torchrun, TensorFlow's MultiWorkerMirroredStrategy reads only
TF_CONFIG: without it every process trains its own copy and believes it is the chief.
`strategy()`:

1. resolves the launch (`distenv.resolve()`) and builds the cluster (`tf_config()`):
   every worker's ``host:port``, from an existing TF_CONFIG (validated, passed through),
   CLUSTER_SPEC (Google Cloud / Vertex), SM_HOSTS (SageMaker), SLURM's node and task lists
   (in SLURM's order, block/cyclic/plane distributions), one node (loopback), or, across
   MPI nodes, a host file or an mpi4py allgather of host names (only when asked). Ports
   are derived from the job (`distenv.ports`), so concurrent jobs do not collide;
2. gives each of several processes per node its own GPUs (CUDA_VISIBLE_DEVICES) and its
   share of the CPU cores, before TensorFlow initialises its devices;
3. refuses Keras 3 with MultiWorkerMirroredStrategy (its model.fit fails there,
   keras-team/keras#20585) with the fix, unless ``allow_keras3=True`` (custom loops);
4. runs a pre-flight rendezvous: every worker listens on its port and waits until it
   and every other worker have reached each other, so a missing worker is a clear error after
   DISTENV_TIMEOUT seconds (default 180) instead of an endless wait;
5. returns the strategy: the default one (or MirroredStrategy with several local GPUs)
   for a single worker, MultiWorkerMirroredStrategy built from a cluster resolver (no
   TF_CONFIG needed in os.environ unless ``set_tf_config=True``), NCCL with GPUs and
   RING otherwise, or ParameterServerStrategy when the cluster has ``ps`` tasks.

Zero code: `patch()` (called by DISTENV_AUTO=1 / ``import distenv.auto`` right after the script
imports TensorFlow) gives a script that builds ``tf.distribute.MultiWorkerMirroredStrategy()``
itself the same cluster: TF_CONFIG, GPUs and threads in the environment, and the Keras 3 check
and pre-flight rendezvous when the strategy is built.

Everything but `strategy()` and `patch()` is pure (no TensorFlow import): `tf_config()`,
`plan()`, `patch_environ()` (which writes only into the mapping it is given).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from . import placement, ports
from .placement import parse_hostfile, slurm_task_nodes  # noqa: F401 - public names, unchanged
from .description import PER_NODE, DistEnv
from .errors import DistEnvError

#: Seconds the pre-flight rendezvous waits for every worker (override: DISTENV_TIMEOUT).
DEFAULT_TIMEOUT = 180.0
LOOPBACK = "127.0.0.1"
CHIEFS = ("chief", "master")
#: Google Cloud pools -> TF_CONFIG task types (Vertex: workerpool0..3).
GCP_TYPES = {"master": "chief", "chief": "chief", "workerpool0": "chief",
             "worker": "worker", "workerpool1": "worker",
             "ps": "ps", "workerpool2": "ps",
             "evaluator": "evaluator", "workerpool3": "evaluator"}
MPI_LAUNCHERS = ("openmpi", "mpich", "intelmpi", "hydra", "mvapich2", "pals")


class TooLateError(RuntimeError):
    """TensorFlow initialised its devices before `strategy()` could configure them."""


# -- environments ------------------------------------------------------------------------
def _environ(environ):
    return os.environ if environ is None else environ


def _inputs(env, environ) -> "tuple[DistEnv, object]":
    """(description, environment mapping) from a DistEnv, a mapping, or nothing."""
    if env is not None and not isinstance(env, DistEnv):  # a mapping to resolve
        environ, env = env, None
    src = _environ(environ)
    if env is None:
        from .resolver import resolve

        env = resolve(src)
    return env, src


def _truthy(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


# -- TF_CONFIG ---------------------------------------------------------------------------
def tf_config(env=None, *, environ=None, hostfile=None, gather=None, base_port=None) -> dict:
    """A valid TF_CONFIG dict for this process (``{"cluster": ..., "task": ...}``).

    `env`: a `DistEnv`, or a mapping to resolve (default: ``os.environ``). Keywords (each
    also read from the environment when not given):

    * `hostfile` (DISTENV_HOSTFILE): host names across MPI nodes, one per line (``host``,
      ``host:N``, ``host slots=N``, or a host repeated once per rank as in PBS_NODEFILE);
      ranks fill hosts in blocks, in file order, as mpirun maps them by default.
    * `gather` (DISTENV_GATHER=mpi4py): learn every rank's host name by an MPI allgather.
    * `base_port` (DISTENV_TF_PORT): the first port; worker k on a host listens on
      ``base_port + k``. Default: derived from the job, so concurrent jobs differ.

    Raises `DistEnvError` naming what is missing when the hosts cannot be known.
    """
    d, src = _inputs(env, environ)
    raw = src.get("TF_CONFIG")
    if raw:
        return _passthrough(raw, d)
    if d.launcher in ("gcp", "vertex") and src.get("CLUSTER_SPEC"):
        return _from_cluster_spec(src)
    hosts = _worker_hosts(d, src, hostfile, gather)
    return _assemble(d, src, hosts, base_port)


def _passthrough(raw: str, d: DistEnv) -> dict:
    from .sources import tfconfig

    config = tfconfig.parse(raw)
    if d.launcher != "tf_config":
        members = tfconfig.workers(config)
        task = config["task"]
        chiefs = sum(len(config["cluster"].get(k, ())) for k in CHIEFS)
        kind, index = task["type"], task.get("index", 0)
        rank = index if kind in CHIEFS else chiefs + index if kind == "worker" else None
        if d.world_size is not None and d.launch != PER_NODE and len(members) != d.world_size:
            raise DistEnvError(
                f"TF_CONFIG lists {len(members)} training worker(s) but {d.launcher} started "
                f"world_size={d.world_size} ({d.provenance.get('world_size')}): a stale TF_CONFIG? "
                "Fix: unset TF_CONFIG and let distenv build it."
            )
        if rank is not None and d.rank is not None and d.launch != PER_NODE and rank != d.rank:
            raise DistEnvError(
                f"TF_CONFIG task {kind}[{index}] is rank {rank} but {d.launcher} says rank={d.rank} "
                f"({d.provenance.get('rank')}). Fix: unset TF_CONFIG and let distenv build it."
            )
    return config


def _from_cluster_spec(src) -> dict:
    from .sources import gcp

    spec = gcp.cluster_spec(src)
    if spec is None:
        raise DistEnvError("CLUSTER_SPEC has no TensorFlow-style 'cluster' mapping of lists.")
    cluster: dict = {}
    for pool, tasks in spec["cluster"].items():
        kind = GCP_TYPES.get(pool)
        if kind is None:
            raise DistEnvError(f"CLUSTER_SPEC pool {pool!r} is not one TensorFlow knows "
                               f"({', '.join(GCP_TYPES)}).")
        cluster.setdefault(kind, []).extend(str(t) for t in tasks)
    task = spec.get("task") or {}
    kind = GCP_TYPES.get(task.get("type"))
    if kind is None:
        raise DistEnvError(f"CLUSTER_SPEC task type {task.get('type')!r} is not a known pool.")
    config = {"cluster": cluster, "task": {"type": kind, "index": task.get("index", 0)},
              "environment": "cloud"}
    from .sources import tfconfig

    return tfconfig.parse(json.dumps(config), "CLUSTER_SPEC")


def _worker_hosts(d: DistEnv, src, hostfile, gather) -> "list[str]":
    """The host of every worker, indexed by rank (node rank for a per-node launch)."""
    if d.launch == PER_NODE:
        # One process per node: for TensorFlow the node's process *is* the worker (it
        # uses every local GPU through MirroredStrategy inside MultiWorkerMirroredStrategy).
        if d.num_nodes == 1:
            return [LOOPBACK]
        if d.hosts and d.num_nodes == len(d.hosts) and d.node_rank is not None:
            return list(d.hosts)
        raise DistEnvError(_missing(d, "the host of every node"))
    size, rank = d.world_size, d.rank
    if size is None or rank is None:
        raise DistEnvError(
            f"cannot build TF_CONFIG: {d.launcher} does not reveal "
            f"{'the world size' if size is None else 'the rank'} "
            f"({d.provenance.get('world_size' if size is None else 'rank')}). "
            "Fix: launch so that it does (e.g. MPICH without -pmi-port), or set TF_CONFIG."
        )
    if size == 1 or d.num_nodes == 1:
        return [LOOPBACK] * size
    hostfile = hostfile or src.get("DISTENV_HOSTFILE") or None
    if gather is None:
        gather = src.get("DISTENV_GATHER", "").strip().lower() or None
    if hostfile:
        return placement.read_hostfile(d, hostfile)
    if gather:
        if gather not in (True, "mpi4py", "mpi", "1", "true", "yes"):
            raise DistEnvError(f"DISTENV_GATHER={gather!r}: the only method is 'mpi4py'.")
        return _gather_hostnames(d)
    if d.rank_hosts is not None:
        return list(d.rank_hosts)
    why = d.provenance.get("rank_hosts")
    raise DistEnvError(why[len("unknown: "):] if why and why.startswith("unknown: ")
                       else _missing(d, "which host runs each rank"))


def _missing(d: DistEnv, what: str) -> str:
    how = ("pass hostfile=... or set DISTENV_HOSTFILE to a file of host names (host:N per "
           "line, in mpirun's order), or gather=True / DISTENV_GATHER=mpi4py (needs mpi4py) "
           "to ask the other ranks, or set TF_CONFIG yourself")
    if d.launcher == "torchrun":
        how = ("torchrun numbers nodes in rendezvous order, not in any host list: set "
               "TF_CONFIG yourself, or launch with mpirun/srun")
    elif d.launcher == "openmpi":
        how += " (Open MPI passes variables to other nodes only with mpirun -x DISTENV_HOSTFILE)"
    return (f"cannot build TF_CONFIG: {d.launcher} runs {d.world_size or '?'} worker(s) on "
            f"{d.num_nodes or 'several'} node(s) but does not reveal {what}. Fix: {how}.")


def _gather_hostnames(d: DistEnv) -> "list[str]":
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistEnvError(
            "DISTENV_GATHER=mpi4py needs mpi4py (pip install mpi4py) for the launcher's MPI; "
            "or give DISTENV_HOSTFILE instead."
        ) from None
    comm = MPI.COMM_WORLD
    if comm.Get_rank() != d.rank or comm.Get_size() != d.world_size:
        raise DistEnvError(
            f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but distenv resolved "
            f"rank={d.rank} of world_size={d.world_size}: mpi4py is not using this launcher's MPI."
        )
    return list(comm.allgather(socket.gethostname()))


def _base_port(d: DistEnv, src, base_port, width: int) -> int:
    if base_port is None and src.get("DISTENV_TF_PORT"):
        from .reading import parse_int

        base_port = parse_int(src["DISTENV_TF_PORT"], "DISTENV_TF_PORT", minimum=1)
    if base_port is not None:
        if base_port + width - 1 > 65535:
            raise DistEnvError(f"DISTENV_TF_PORT={base_port} + {width} worker(s) passes 65535.")
        return int(base_port)
    key = f"tf:{d.launcher}:{d.job_id}:{d.master_addr}:{d.master_port}"
    base = ports.port_for(key)
    if d.master_port is not None and base <= d.master_port < base + width:
        base = d.master_port + 1  # torchrun's store (or the user's) holds MASTER_PORT
    return base


def _assemble(d: DistEnv, src, hosts, base_port) -> dict:
    seen: dict = {}
    slot = []
    for host in hosts:
        slot.append(seen.get(host, 0))
        seen[host] = slot[-1] + 1
    base = _base_port(d, src, base_port, max(seen.values()))
    workers = [f"{_bracket(h)}:{base + k}" for h, k in zip(hosts, slot)]
    index = d.node_rank if d.launch == PER_NODE else d.rank
    if index is None:
        raise DistEnvError(_missing(d, "this process's node index"))
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# -- what strategy() will do ---------------------------------------------------------------
def training_workers(config: dict) -> "list[str]":
    cluster = config["cluster"]
    return [t for k in ("chief", "master", "worker") for t in cluster.get(k, ())]


def task_index(config: dict) -> "int | None":
    """This task's index among the training workers (chief first), None for ps/evaluator."""
    cluster, task = config["cluster"], config["task"]
    kind, index = task["type"], task.get("index", 0)
    chiefs = sum(len(cluster.get(k, ())) for k in CHIEFS)
    if kind in CHIEFS:
        return index
    if kind == "worker":
        return chiefs + index
    return None


#: Set beside CUDA_VISIBLE_DEVICES when distenv narrowed it: a second look (patch() then
#: strategy(), or strategy() twice) must not narrow the slice again.
GPU_SLICE_VAR = "DISTENV_GPU_SLICE"


def gpu_assignment(d: DistEnv, environ=None) -> "tuple[str | None, str]":
    """(CUDA_VISIBLE_DEVICES for this process or None to leave it, why)."""
    from .gpus import visible_gpus

    src = _environ(environ)
    count, why = visible_gpus(src)
    local, lsize = d.local_rank, d.local_world_size
    if count == 0:
        return None, why
    if src.get(GPU_SLICE_VAR) is not None and src.get(GPU_SLICE_VAR) == src.get("CUDA_VISIBLE_DEVICES"):
        return None, f"distenv already gave this process its GPUs ({GPU_SLICE_VAR}={src[GPU_SLICE_VAR]!r})"
    if d.launch == PER_NODE or not lsize or lsize == 1 or local is None:
        return None, f"one process on this node uses all {count} GPU(s) ({why})"
    given = src.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in given.split(",")][:count] if given else [str(i) for i in range(count)]
    if count < lsize:
        if count == 1 and given is not None:
            return None, f"the scheduler gave this process its own GPU ({why})"
        raise DistEnvError(
            f"{lsize} processes on this node share {count} GPU(s) ({why}): TensorFlow cannot "
            "split a GPU between processes. Fix: start one process per GPU, or one process per "
            "node (MultiWorkerMirroredStrategy then uses every local GPU)."
        )
    per = count // lsize
    mine = ids[local * per:(local + 1) * per]
    return ",".join(mine), f"local rank {local} of {lsize} takes {per} of {count} GPU(s) ({why})"


def thread_counts(d: DistEnv) -> "tuple[int, int]":
    """(intra-op, inter-op) threads: this process's share of the cores it may run on."""
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = os.cpu_count() or 1
    total = os.cpu_count() or mine
    share = mine
    if mine >= total and (d.local_world_size or 1) > 1:
        share = max(1, mine // d.local_world_size)  # not bound: share with the node's others
    return share, max(1, min(2, share))


def plan(env=None, *, environ=None, **tf_config_kwargs) -> dict:
    """What `strategy()` would do here, without importing TensorFlow.

    ``{"kind": "default"|"mirrored"|"multi_worker"|"parameter_server", "tf_config",
    "workers", "index", "communication": "NCCL"|"RING"|None, "cuda_visible_devices",
    "threads"}``.
    """
    d, src = _inputs(env, environ)
    cuda, cuda_why = gpu_assignment(d, src)
    from .gpus import visible_gpus

    gpus = visible_gpus(src)[0] if cuda is None else len(cuda.split(","))
    single = not src.get("TF_CONFIG") and not (d.launcher in ("gcp", "vertex")) and (
        (d.launch != PER_NODE and d.world_size == 1) or (d.launch == PER_NODE and d.num_nodes == 1))
    out = {"env": d, "cuda_visible_devices": cuda, "cuda_why": cuda_why, "threads": thread_counts(d)}
    if single:
        out.update(kind="mirrored" if gpus > 1 else "default", tf_config=None, workers=[],
                   index=0, communication=None)
        return out
    config = tf_config(d, environ=src, **tf_config_kwargs)
    members = training_workers(config)
    if config["cluster"].get("ps"):
        kind = "parameter_server"
    elif len(members) > 1:
        kind = "multi_worker"
    else:
        kind = "mirrored" if gpus > 1 else "default"
    out.update(kind=kind, tf_config=config, workers=members, index=task_index(config),
               communication=("NCCL" if gpus else "RING") if kind == "multi_worker" else None)
    return out


# -- checks that need TensorFlow's state ----------------------------------------------------
def tf_initialized() -> bool:
    """True once TensorFlow created its eager context (devices are fixed from then on)."""
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover - a very different TensorFlow
        return False
    ctx = context.context_safe()
    return ctx is not None and bool(getattr(ctx, "_initialized", False))


def keras_flavour(environ=None) -> "tuple[str, str]":
    """(flavour, why): which Keras `tf.keras` is, or will be: 'tf_keras', 'keras_3', 'keras_2'."""
    import importlib.util
    from importlib import metadata

    src = _environ(environ)
    legacy = src.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        loader = tf.__dict__.get("keras")
        if getattr(loader, "_tfll_initialized", False):
            return loader._tfll_keras_version or "none", "tf.keras is already loaded"
        at_import = tf.__dict__.get("_tf_uses_legacy_keras")
        if at_import is not None and at_import != legacy:
            return "mixed", (f"TF_USE_LEGACY_KERAS={src.get('TF_USE_LEGACY_KERAS')!r} now, but "
                             f"{'set' if at_import else 'unset'} when TensorFlow was imported")
    try:
        tf_version = metadata.version("tensorflow-cpu")
    except metadata.PackageNotFoundError:
        try:
            tf_version = metadata.version("tensorflow")
        except metadata.PackageNotFoundError:
            tf_version = "0"
    if legacy:
        if importlib.util.find_spec("tf_keras") is None:
            return "missing", "TF_USE_LEGACY_KERAS=1 but tf-keras is not installed"
        return "tf_keras", "TF_USE_LEGACY_KERAS=1 and tf-keras installed"
    try:
        major_minor = tuple(int(x) for x in tf_version.split(".")[:2])
    except ValueError:
        major_minor = (0, 0)
    if (2, 0) <= major_minor < (2, 16):
        return "keras_2", f"TensorFlow {tf_version} ships Keras 2 as tf.keras"
    try:
        kv = metadata.version("keras")
    except metadata.PackageNotFoundError:
        return "none", "no keras installed"
    return ("keras_3" if kv.startswith("3.") else "keras_2"), \
        f"TensorFlow {tf_version} without TF_USE_LEGACY_KERAS=1: tf.keras is keras {kv}"


def keras_problem(environ=None, *, opt_in: str = "pass allow_keras3=True") -> "str | None":
    """Why Keras would fail under MultiWorkerMirroredStrategy here, with the fix (or None).

    `opt_in`: how the caller lets a custom-loop user through (named in the fix)."""
    if "tf_keras" in sys.modules:
        return None  # the user trains with tf-keras directly
    flavour, why = keras_flavour(environ)
    imported = sys.modules.get("keras")
    if flavour == "tf_keras" and str(getattr(imported, "__version__", "")).startswith("3."):
        flavour, why = "keras_3", f"keras {imported.__version__} (Keras 3) is imported, tf_keras is not"
    if flavour in ("tf_keras", "keras_2", "none"):
        return None
    fix = ("Fix: pip install 'tf-keras~=<TensorFlow major.minor>.0' --no-deps and set "
           "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (or `import tf_keras as keras`); "
           f"or train with a custom strategy.run loop and {opt_in}.")
    if flavour == "missing":
        return f"{why}: tf.keras would fail to load. {fix}"
    if flavour == "mixed":
        return f"{why}: tf.keras and tensorflow.keras imports would disagree. {fix}"
    return (f"Keras 3 with MultiWorkerMirroredStrategy: model.fit fails there "
            f"(keras-team/keras#20585) and Keras 3 callbacks know no chief ({why}). {fix}")


# -- pre-flight rendezvous ------------------------------------------------------------------
def _split(address: str) -> "tuple[str, int]":
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def rendezvous(workers, index: int, timeout: "float | None" = None, environ=None) -> float:
    """Listen on ``workers[index]``'s port until every worker has reached every other one.

    Each worker connects to every other worker's port and says hello (its index and a digest
    of the cluster, so another job's worker does not count); it stops listening only when it
    reached every peer *and* every peer reached it, so no peer can find the port closed in
    the gap before TensorFlow binds it. Returns the seconds it took. Raises `DistEnvError`
    naming the missing workers when `timeout` (default DISTENV_TIMEOUT, else 180 s) passes.
    """
    if timeout is None:
        raw = _environ(environ).get("DISTENV_TIMEOUT")
        timeout = float(raw) if raw else DEFAULT_TIMEOUT
    t0 = time.monotonic()
    deadline = t0 + timeout
    _, port = _split(workers[index])
    key = ports.fnv1a(",".join(workers))
    hello = f"distenv-tf {index} {key}\n".encode()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as exc:
        listener.close()
        raise DistEnvError(
            f"worker {index} cannot listen on port {port} ({exc.strerror}): another job or a "
            "leftover process holds it. Fix: set DISTENV_TF_PORT to a free base port on every worker."
        ) from None
    listener.listen(128)
    listener.setblocking(False)
    peers = {i: w for i, w in enumerate(workers) if i != index}
    unreached = dict(peers)
    heard: set = set()
    try:
        while True:
            _drain(listener, heard, key)
            for i, address in list(unreached.items()):
                if _say_hello(address, hello):
                    del unreached[i]
            _drain(listener, heard, key)
            silent = [i for i in peers if i not in heard]
            if not unreached and not silent:
                break
            if time.monotonic() >= deadline:
                gone = sorted(set(unreached) | set(silent))
                missing = ", ".join(f"worker {i} ({peers[i]})" for i in gone)
                raise DistEnvError(
                    f"TensorFlow pre-flight: after {timeout:.0f} s, worker {index} of "
                    f"{len(workers)} has not met {missing}: that worker did not start, crashed, "
                    "or is blocked by a firewall. Fix: start every worker (same launcher, same "
                    "job), or raise DISTENV_TIMEOUT."
                )
            time.sleep(0.2)
    finally:
        listener.close()
    return time.monotonic() - t0


def _drain(listener, heard: set, key: int) -> None:
    """Accept pending connections and record which workers said hello."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # BlockingIOError: nothing pending
            return
        try:
            conn.settimeout(2.0)
            data = b""
            while not data.endswith(b"\n") and len(data) < 256:
                chunk = conn.recv(256)
                if not chunk:
                    break
                data += chunk
            words = data.decode("ascii", "replace").split()
            if len(words) == 3 and words[0] == "distenv-tf" and words[2] == str(key) \
                    and words[1].isdigit():
                heard.add(int(words[1]))
        except OSError:
            pass
        finally:
            conn.close()


def _say_hello(address: str, hello: bytes) -> bool:
    host, port = _split(address)
    try:
        with socket.create_connection((host, port), timeout=1.0) as conn:
            conn.sendall(hello)
            return True
    except OSError:
        return False


# -- the strategy -----------------------------------------------------------------------
_last: dict = {}


def strategy(env=None, *, communication: str = "auto", timeout: "float | None" = None,
             set_tf_config: bool = False, allow_keras3: bool = False, threads: bool = True,
             hostfile=None, gather=None, base_port=None, **kwargs):
    """The `tf.distribute` strategy for this launch; call it before any other TensorFlow call.

    `communication`: "auto" (NCCL with GPUs, else RING), "ring", "nccl". `timeout`: seconds
    for the pre-flight rendezvous (default DISTENV_TIMEOUT, else 180). `set_tf_config`:
    also write TF_CONFIG into os.environ. `allow_keras3`: you train with a custom loop, not
    Keras 3's model.fit. `threads`: size TensorFlow's thread pools from this process's share
    of the cores. `hostfile`, `gather`, `base_port`: see `tf_config`. Other keywords go to
    the strategy's constructor.
    """
    p = plan(env, hostfile=hostfile, gather=gather, base_port=base_port)
    d, kind = p["env"], p["kind"]
    distributed = kind in ("multi_worker", "parameter_server")
    initialised = tf_initialized()
    cuda = p["cuda_visible_devices"]
    if cuda is not None and os.environ.get("CUDA_VISIBLE_DEVICES") != cuda:
        if initialised:
            raise TooLateError(_too_late("give this process its own GPUs "
                                         f"(CUDA_VISIBLE_DEVICES={cuda}: {p['cuda_why']})"))
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[GPU_SLICE_VAR] = cuda
    if distributed and initialised:
        raise TooLateError(_too_late(f"join the {len(p['workers'])}-worker cluster"))
    if kind == "multi_worker" and not allow_keras3:
        problem = keras_problem()
        if problem:
            raise DistEnvError(problem)
    config = p["tf_config"]
    if set_tf_config and config is not None:
        os.environ["TF_CONFIG"] = json.dumps(config)

    import tensorflow as tf

    if threads and not initialised:
        intra, inter = p["threads"]
        if tf.config.threading.get_intra_op_parallelism_threads() == 0:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if tf.config.threading.get_inter_op_parallelism_threads() == 0:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    if kind == "default":
        result = tf.distribute.get_strategy()
    elif kind == "mirrored":
        result = tf.distribute.MirroredStrategy(**kwargs)
    else:
        task = config["task"]
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(config["cluster"]), task_type=task["type"],
            task_id=task.get("index", 0), rpc_layer="grpc",
            environment=config.get("environment", ""))
        me = p["index"]
        if me is not None:
            rendezvous(p["workers"], me, timeout)
        if kind == "parameter_server":
            result = _parameter_server(tf, resolver, task, **kwargs)
        else:
            impl = {"auto": p["communication"], "ring": "RING", "nccl": "NCCL"}.get(
                communication.lower(), communication.upper())
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=getattr(tf.distribute.experimental.CommunicationImplementation, impl))
            kwargs.setdefault("communication_options", options)
            result = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, **kwargs)
    _last.update(strategy=result, plan=p)
    return result


def _parameter_server(tf, resolver, task, **kwargs):
    if task["type"] == "evaluator":
        return tf.distribute.get_strategy()  # a side-car evaluator trains nothing
    if task["type"] in ("worker", "ps"):
        # Workers and parameter servers serve the coordinator (the chief) until it ends.
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"],
                                      task_index=task.get("index", 0), protocol="grpc", start=True)
        server.join()
        raise SystemExit(0)  # pragma: no cover - join() does not return
    return tf.distribute.experimental.ParameterServerStrategy(resolver, **kwargs)


def _too_late(what: str, who: str = "distenv.tensorflow.strategy()",
              fix: str = "call strategy() at the top of the script, before any other "
                         "TensorFlow call") -> str:
    return (f"{who} came too late to {what}: TensorFlow already "
            "initialised its devices (a tensor, a device query or a model was created first). "
            f"Fix: {fix}.")


def is_chief(env=None) -> bool:
    """True on the worker that writes checkpoints and logs (chief, else worker 0)."""
    p = _last.get("plan")
    if p is not None and env is None:
        config = p["tf_config"]
    else:
        d, _ = _inputs(env, None)
        try:
            config = tf_config(d) if d.is_distributed else None
        except DistEnvError:
            return d.is_main
    if config is None:
        return True
    task = config["task"]
    if config["cluster"].get("chief") or config["cluster"].get("master"):
        return task["type"] in CHIEFS
    return task["type"] == "worker" and task.get("index", 0) == 0


# -- zero code: patch() ---------------------------------------------------------------------
#: What `patch()` did (None before its first call): see `patch_environ`.
_patched: "dict | None" = None


def patch_environ(environ=None) -> dict:
    """The environment half of `patch()`, without TensorFlow: fix `environ` (default
    ``os.environ``) so that a plain ``tf.distribute.MultiWorkerMirroredStrategy()`` joins the
    launch, and say what could not be fixed.

    * not a distributed launch: nothing is written (``env`` is None);
    * TF_CONFIG missing: set from `tf_config()` (host file, gathering and base port from
      DISTENV_HOSTFILE, DISTENV_GATHER, DISTENV_TF_PORT); an existing one is validated as
      `tf_config()` does and left untouched;
    * several processes on a node with GPUs: CUDA_VISIBLE_DEVICES narrowed to this process's
      slice (`gpu_assignment`), unless TensorFlow already initialised its devices, or torch
      is already imported (a torch job that imports TensorFlow on the side, as TensorBoard
      does, keeps its GPUs);
    * a per-node launch (one process per node) is one TensorFlow worker per node when that
      process can drive ``nproc_per_node`` replicas itself, i.e. the node's GPUs; otherwise
      (CPUs, or another count asked by DISTENV_NPROC_PER_NODE) TensorFlow cannot start the
      other workers: a problem.

    Nothing raises for a launch that cannot be served: the reason is returned as
    ``problem`` (``(exception class, message, about the cluster)``), which `patch()` raises
    when the script builds a MultiWorkerMirroredStrategy -- a script that merely imports
    TensorFlow (a torch job through TensorBoard) is not broken. A problem about the cluster
    gives way to a TF_CONFIG the script sets itself before building the strategy. Returns
    ``{"env", "tf_config", "written", "threads", "problem"}``.
    """
    from .gpus import visible_gpus
    from .resolver import resolve

    src = _environ(environ)
    d = resolve(src)
    out = {"env": None, "tf_config": None, "written": {}, "threads": None, "problem": None}
    if not d.is_distributed:
        return out
    out["env"] = d
    initialised = tf_initialized()
    platform_cluster = bool(src.get("TF_CONFIG")) or (
        d.launcher in ("gcp", "vertex") and bool(src.get("CLUSTER_SPEC")))
    if d.launch == PER_NODE and (d.nproc_per_node or 1) > 1 and not platform_cluster:
        gpus, gpus_why = visible_gpus(src)
        if gpus != d.nproc_per_node:
            out["problem"] = (DistEnvError, (
                f"this is a per-node launch ({d.launcher}: one process for node {d.node_rank} of "
                f"{d.num_nodes}, nproc_per_node={d.nproc_per_node}: "
                f"{d.provenance.get('nproc_per_node')}), but TensorFlow cannot start workers and "
                f"one process here drives {max(gpus, 1)} replica(s) ({gpus_why}). Fix: let the "
                "launcher start one process per worker (mpirun --map-by ppr:N:node, srun "
                "--ntasks-per-node=N), or set DISTENV_NPROC_PER_NODE=1 for one TensorFlow worker "
                "per node."), True)
            return out
    try:
        p = plan(d, environ=src)
    except DistEnvError as exc:
        out["problem"] = (DistEnvError, str(exc), True)
        return out
    if d.launch != PER_NODE:
        out["threads"] = p["threads"]
    config = p["tf_config"]
    out["tf_config"] = config
    if config is not None and not src.get("TF_CONFIG"):
        src["TF_CONFIG"] = out["written"]["TF_CONFIG"] = json.dumps(config)
    cuda = p["cuda_visible_devices"]
    if cuda is not None and src.get("CUDA_VISIBLE_DEVICES") != cuda:
        if initialised:
            out["problem"] = (TooLateError, _too_late(
                f"give this process its own GPUs (CUDA_VISIBLE_DEVICES={cuda}: {p['cuda_why']})",
                "distenv.tensorflow.patch()", "import distenv.auto (or set DISTENV_AUTO=1) before "
                "any TensorFlow call, or set CUDA_VISIBLE_DEVICES per process yourself"), False)
        elif "torch" in sys.modules:
            out["problem"] = (DistEnvError, (
                f"CUDA_VISIBLE_DEVICES was left alone because torch is imported in this process "
                f"(narrowing it could move torch's GPUs), so this TensorFlow worker would use every "
                f"GPU of the node beside the other {d.local_world_size - 1} process(es) there. Fix: "
                f"import tensorflow before torch, or set CUDA_VISIBLE_DEVICES={cuda} for this "
                f"process yourself ({p['cuda_why']})."), False)
        else:
            for var in ("CUDA_VISIBLE_DEVICES", GPU_SLICE_VAR):
                src[var] = out["written"][var] = cuda
    if p["kind"] in ("multi_worker", "parameter_server") and initialised and out["problem"] is None:
        out["problem"] = (TooLateError, _too_late(
            f"join the {len(p['workers'])}-worker cluster", "distenv.tensorflow.patch()",
            "import distenv.auto (or set DISTENV_AUTO=1) before any TensorFlow call"), False)
    return out


def patch():
    """Zero code for TensorFlow: a plain ``tf.distribute.MultiWorkerMirroredStrategy()`` joins
    the launch (``DISTENV_AUTO=1`` / ``import distenv.auto`` call it right after the script
    imports TensorFlow; a script may call it itself, before any TensorFlow call).

    No arguments; idempotent (a second call does nothing); nothing at all when the launch is
    not distributed. Otherwise:

    1. `patch_environ()`: TF_CONFIG (when missing), this process's CUDA_VISIBLE_DEVICES;
    2. TensorFlow's thread pools sized from this process's share of the cores (as `strategy()`);
    3. ``tf.distribute.MultiWorkerMirroredStrategy.__init__`` (the experimental class calls
       it too) is wrapped, once (``_distenv_patched``, ``__wrapped__``): when the strategy is
       built from TF_CONFIG (no cluster resolver, or a TFConfigClusterResolver) it first raises
       what `patch_environ()` could not fix (hosts unknown across MPI nodes, a per-node launch
       TensorFlow cannot serve, too late), checks the TF_CONFIG then in force against the
       launch, refuses Keras 3 (`keras_problem()`; opt out with DISTENV_ALLOW_KERAS3=1 for a
       custom strategy.run loop), and runs the pre-flight `rendezvous()` (once per process),
       so a missing worker is a clear error after DISTENV_TIMEOUT instead of a hang. A
       strategy given another cluster resolver (as `strategy()` does) is left alone.

    Returns the resolved `DistEnv`, or None when the launch is not distributed.
    """
    global _patched
    if _patched is not None:
        return _patched["env"]
    state = patch_environ(os.environ)
    _patched = state
    if state["env"] is None:
        return None
    import tensorflow as tf

    if state["threads"] and not tf_initialized():
        intra, inter = state["threads"]
        if tf.config.threading.get_intra_op_parallelism_threads() == 0:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if tf.config.threading.get_inter_op_parallelism_threads() == 0:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    _wrap_mwms(tf.distribute.MultiWorkerMirroredStrategy)
    return state["env"]


def _wrap_mwms(cls) -> None:
    if getattr(cls.__init__, "_distenv_patched", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        resolver = kwargs.get("cluster_resolver", args[0] if args else None)
        _before_mwms(resolver)
        original(self, *args, **kwargs)

    __init__._distenv_patched = True
    __init__.__wrapped__ = original
    __init__.__doc__ = original.__doc__
    __init__.__name__ = original.__name__
    __init__.__qualname__ = original.__qualname__
    cls.__init__ = __init__


def unpatch() -> None:
    """Undo the MultiWorkerMirroredStrategy wrap and forget `patch()` (tests). Variables
    it wrote stay."""
    global _patched
    _patched = None
    _rendezvous_done.clear()
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        cls = tf.distribute.MultiWorkerMirroredStrategy
        if getattr(cls.__init__, "_distenv_patched", False):
            cls.__init__ = cls.__init__.__wrapped__


_rendezvous_done: list = []


def _before_mwms(resolver) -> None:
    """The checks of a MultiWorkerMirroredStrategy built from TF_CONFIG (see `patch()`)."""
    if resolver is not None:
        own = sys.modules["tensorflow"].distribute.cluster_resolver.TFConfigClusterResolver
        if not isinstance(resolver, own):
            return  # the script (or strategy()) gave its own cluster
    state = _patched or {}
    problem = state.get("problem")
    if problem is not None:
        kind, message, about_cluster = problem
        # A TF_CONFIG the script set itself since patch() is checked below instead.
        if not (about_cluster and os.environ.get("TF_CONFIG")
                and os.environ["TF_CONFIG"] != state["written"].get("TF_CONFIG")):
            raise kind(message)
    if not os.environ.get("TF_CONFIG"):
        return  # not distributed (patch() found nothing to do): TensorFlow's single worker
    config = tf_config(environ=os.environ)  # validates the TF_CONFIG in force against the launch
    members = training_workers(config)
    if len(members) < 2 or config["cluster"].get("ps"):
        return
    if tf_initialized():
        raise TooLateError(_too_late(
            f"join the {len(members)}-worker cluster", "MultiWorkerMirroredStrategy()",
            "build the strategy at the top of the script, before any other TensorFlow call"))
    if not _truthy(os.environ.get("DISTENV_ALLOW_KERAS3", "")):
        problem = keras_problem(opt_in="set DISTENV_ALLOW_KERAS3=1")
        if problem:
            raise DistEnvError(problem)
    index = task_index(config)
    if index is not None and not _rendezvous_done:
        rendezvous(members, index)
        _rendezvous_done.append(index)
