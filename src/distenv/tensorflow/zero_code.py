"""Zero code: `patch()` makes a plain ``tf.distribute.MultiWorkerMirroredStrategy()`` join
the launch (DISTENV_AUTO=1 / ``import distenv.auto`` call it when a script imports TensorFlow)."""

from __future__ import annotations

import json
import logging
import os
import sys

from .. import knobs
from ..core.description import PER_NODE
from ..errors import DistEnvError
from ..sources import source_of
from .cluster import _environ, hosts_needed, task_index, tf_config, training_workers
from .devices import GPU_SLICE_VAR
from .preflight import rendezvous
from .strategies import TooLateError, _hooks, _too_late, plan

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from typing import Any

    from ..core.description import DistEnv

log = logging.getLogger("distenv.tensorflow")

#: What `patch()` did (None before its first call): see `patch_environ`.
_patched: "dict[str, Any] | None" = None


def patch_environ(environ: "MutableMapping[str, str] | None" = None, discover: bool = False
                  ) -> "dict[str, Any]":
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
    gives way to a TF_CONFIG the script sets itself before building the strategy. With
    `discover`, what the launch's variables leave unknown (every rank's host across MPI
    nodes) is asked of the launcher's own service (`plan(discover=True)`). Returns
    ``{"env", "tf_config", "written", "threads", "problem"}``.
    """
    from ..core.gpus import visible_gpus
    from ..core.resolver import resolve

    # _environ gives back `environ` itself (or os.environ), typed as a read-only Mapping: written below
    src: "MutableMapping[str, str]" = _environ(environ)  # type: ignore[assignment]
    d = resolve(src)
    out: "dict[str, Any]" = {"env": None, "tf_config": None, "written": {}, "threads": None, "problem": None}
    if not d.is_distributed:
        return out
    out["env"] = d
    initialised = _hooks().tf_initialized()
    # A cluster the platform describes (TF_CONFIG, or its own: Google Cloud's CLUSTER_SPEC).
    platform_cluster = bool(src.get("TF_CONFIG")) or bool(source_of(d.launcher).frameworks.tf_cluster)
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
        p = plan(d, environ=src, discover=discover)
    except DistEnvError as exc:
        out["problem"] = (DistEnvError, str(exc), True)
        return out
    if d.launch != PER_NODE:
        out["threads"] = p.threads
    config = p.tf_config
    out["tf_config"] = config
    if config is not None and not src.get("TF_CONFIG"):
        src["TF_CONFIG"] = out["written"]["TF_CONFIG"] = json.dumps(config)
    cuda = p.cuda_visible_devices
    if cuda is not None and src.get("CUDA_VISIBLE_DEVICES") != cuda:
        if initialised:
            out["problem"] = (TooLateError, _too_late(
                f"give this process its own GPUs (CUDA_VISIBLE_DEVICES={cuda}: {p.cuda_why})",
                "distenv.tensorflow.patch()", "import distenv.auto (or set DISTENV_AUTO=1) before "
                "any TensorFlow call, or set CUDA_VISIBLE_DEVICES per process yourself"), False)
        elif "torch" in sys.modules:
            assert d.local_world_size is not None  # gpu_assignment slices only for several local processes
            out["problem"] = (DistEnvError, (
                f"CUDA_VISIBLE_DEVICES was left alone because torch is imported in this process "
                f"(narrowing it could move torch's GPUs), so this TensorFlow worker would use every "
                f"GPU of the node beside the other {d.local_world_size - 1} process(es) there. Fix: "
                f"import tensorflow before torch, or set CUDA_VISIBLE_DEVICES={cuda} for this "
                f"process yourself ({p.cuda_why})."), False)
        else:
            for var in ("CUDA_VISIBLE_DEVICES", GPU_SLICE_VAR):
                src[var] = out["written"][var] = cuda
    if p.kind in ("multi_worker", "parameter_server") and initialised and out["problem"] is None:
        out["problem"] = (TooLateError, _too_late(
            f"join the {len(p.workers)}-worker cluster", "distenv.tensorflow.patch()",
            "import distenv.auto (or set DISTENV_AUTO=1) before any TensorFlow call"), False)
    return out


def patch() -> "DistEnv | None":
    """Zero code for TensorFlow: a plain ``tf.distribute.MultiWorkerMirroredStrategy()`` joins
    the launch (``DISTENV_AUTO=1`` / ``import distenv.auto`` call it right after the script
    imports TensorFlow; a script may call it itself, before any TensorFlow call).

    No arguments; idempotent (a second call does nothing); nothing at all when the launch is
    not distributed. Otherwise:

    1. `patch_environ()`: TF_CONFIG (when missing), this process's CUDA_VISIBLE_DEVICES;
    2. TensorFlow's thread pools sized from this process's share of the cores (as `strategy()`);
    3. ``tf.distribute.MultiWorkerMirroredStrategy.__init__`` (the experimental class calls
       it too) is wrapped, once (``_distenv_patched``, ``__wrapped__``): when the strategy is
       built from TF_CONFIG (no cluster resolver, or a TFConfigClusterResolver) it first asks
       the launcher's own service for the hosts the variables leave unknown (MPI across
       nodes: `patch_environ(discover=True)`, where communication starts anyway), then raises
       what still could not be fixed (hosts nobody gave, a per-node launch TensorFlow cannot
       serve, too late), checks the TF_CONFIG then in force against the
       launch, refuses Keras 3 (`keras_problem()`; opt out with DISTENV_ALLOW_KERAS3=1 for a
       custom strategy.run loop), and runs the pre-flight `rendezvous()` (once per process),
       so a missing worker is a clear error after DISTENV_TIMEOUT instead of a hang. A
       strategy given another cluster resolver (as `strategy()` does) is left alone.

    Returns the resolved `DistEnv`, or None when the launch is not distributed.
    """
    global _patched
    if _patched is not None:
        env: "DistEnv | None" = _patched["env"]  # the state's values are Any
        return env
    state = patch_environ(os.environ)
    _patched = state
    if state["env"] is not None:
        log.debug("patch(): wrote %s; left for the strategy: %s", sorted(state["written"]),
                  state["problem"][1] if state["problem"] else "nothing")
    if state["env"] is None:
        return None
    import tensorflow as tf

    if state["threads"] and not _hooks().tf_initialized():
        intra, inter = state["threads"]
        if tf.config.threading.get_intra_op_parallelism_threads() == 0:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if tf.config.threading.get_inter_op_parallelism_threads() == 0:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    _wrap_mwms(tf.distribute.MultiWorkerMirroredStrategy)
    env = state["env"]
    return env


def _wrap_mwms(cls: "Any") -> None:
    if getattr(cls.__init__, "_distenv_patched", False):
        return
    original = cls.__init__

    def __init__(self: "Any", *args: "Any", **kwargs: "Any") -> None:
        resolver = kwargs.get("cluster_resolver", args[0] if args else None)
        _before_mwms(resolver)
        original(self, *args, **kwargs)

    __init__._distenv_patched = True  # type: ignore[attr-defined]  # markers on the wrapper
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
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


_rendezvous_done: "list[int]" = []


def _before_mwms(resolver: "Any") -> None:
    """The checks of a MultiWorkerMirroredStrategy built from TF_CONFIG (see `patch()`)."""
    if resolver is not None:
        own = sys.modules["tensorflow"].distribute.cluster_resolver.TFConfigClusterResolver
        if not isinstance(resolver, own):
            return  # the script (or strategy()) gave its own cluster
    global _patched
    state = _patched or {}
    problem = state.get("problem")
    if problem is not None and problem[2] and not os.environ.get("TF_CONFIG") \
            and state.get("env") is not None and hosts_needed(state["env"], os.environ):
        # Hosts the launch's variables leave unknown (MPI across nodes): asked of the launcher's
        # own service now that the strategy is about to communicate (every worker builds it,
        # as PMI-1's exchange needs), not when the script merely imported TensorFlow.
        state = _patched = patch_environ(os.environ, discover=True)
        problem = state["problem"]
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
    if _hooks().tf_initialized():
        raise TooLateError(_too_late(
            f"join the {len(members)}-worker cluster", "MultiWorkerMirroredStrategy()",
            "build the strategy at the top of the script, before any other TensorFlow call"))
    if not knobs.ALLOW_KERAS3.value():
        problem = _hooks().keras_problem(opt_in="set DISTENV_ALLOW_KERAS3=1")
        if problem:
            raise DistEnvError(problem)
    index = task_index(config)
    if index is not None and not _rendezvous_done:
        rendezvous(members, index)
        _rendezvous_done.append(index)

