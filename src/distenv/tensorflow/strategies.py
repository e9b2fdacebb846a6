"""`strategy()`: the `tf.distribute` strategy for this launch, and `plan()`, what it will do."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from ..core.description import PER_NODE
from ..errors import DistEnvError
from ..sources import source_of
from ..core.resolver import resolved
from .cluster import CHIEFS, hosts_needed, task_index, tf_config, training_workers
from .devices import GPU_SLICE_VAR, gpu_assignment, thread_counts
from .preflight import rendezvous

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType
    from typing import Any

    from ..core.description import DistEnv


class TooLateError(RuntimeError):
    """TensorFlow initialised its devices before `strategy()` could configure them."""


def _hooks() -> "ModuleType":
    """The package namespace: `tf_initialized` and `keras_problem` are looked up there, so
    that replacing ``distenv.tensorflow.tf_initialized`` (tests, a user's override) holds
    for every module of the package."""
    return sys.modules[__package__]


@dataclass(frozen=True)
class Plan:
    """What `strategy()` does here: `kind` ("default", "mirrored", "multi_worker",
    "parameter_server"), the cluster (`tf_config`, None for a single worker; `workers`, the
    training workers' host:port, chief first; `index`, this one's, None for a parameter server
    or an evaluator), `communication` ("NCCL", "RING", None), this process's GPUs
    (`cuda_visible_devices`, None: left alone; `cuda_why`) and its (intra-op, inter-op)
    `threads`."""

    env: "DistEnv"
    kind: str
    cuda_visible_devices: "str | None"
    cuda_why: str
    threads: "tuple[int, int]"
    tf_config: "dict[str, Any] | None" = None
    workers: "list[str]" = field(default_factory=list)
    index: "int | None" = 0
    communication: "str | None" = None


def plan(env: "DistEnv | Mapping[str, str] | None" = None, *,
         environ: "Mapping[str, str] | None" = None, discover: bool = False,
         timeout: "float | None" = None, **tf_config_kwargs: "Any") -> Plan:
    """What `strategy()` would do here, without importing TensorFlow (`Plan`). Pure unless
    `discover`: then the launch goes up the one way (`distenv.bringup.bring_up`), and every
    rank's host the launch leaves unknown (`hosts_needed`: MPI across nodes) comes from the
    launcher's own service within `timeout` (default DISTENV_TIMEOUT) -- collective under
    PMI-1: every worker asks."""
    d, src = resolved(env, environ)
    if discover:
        from .. import knobs
        from ..bringup import bring_up

        d = bring_up("tensorflow", env=d, timeout=knobs.timeout(src, timeout),
                     need=hosts_needed(d, src, tf_config_kwargs.get("hostfile"), tf_config_kwargs.get("gather")))
    cuda, cuda_why = gpu_assignment(d, src)
    from ..core.gpus import visible_gpus

    gpus = visible_gpus(src)[0] if cuda is None else len(cuda.split(","))
    single = not src.get("TF_CONFIG") and (
        (d.launch != PER_NODE and d.world_size == 1) or (d.launch == PER_NODE and d.num_nodes == 1)
    ) and not source_of(d.launcher).frameworks.tf_cluster  # last: it loads the source modules
    threads = thread_counts(d)
    if single:
        return Plan(d, "mirrored" if gpus > 1 else "default", cuda, cuda_why, threads)
    config = tf_config(d, environ=src, **tf_config_kwargs)
    members = training_workers(config)
    if config["cluster"].get("ps"):
        kind = "parameter_server"
    elif len(members) > 1:
        kind = "multi_worker"
    else:
        kind = "mirrored" if gpus > 1 else "default"
    return Plan(d, kind, cuda, cuda_why, threads, config, members, task_index(config),
                ("NCCL" if gpus else "RING") if kind == "multi_worker" else None)


_last: "dict[str, Any]" = {}


def strategy(env: "DistEnv | Mapping[str, str] | None" = None, *, communication: str = "auto",
             timeout: "float | None" = None, set_tf_config: bool = False,
             allow_keras3: bool = False, threads: bool = True, hostfile: "str | None" = None,
             gather: "bool | str | None" = None, base_port: "int | None" = None,
             **kwargs: "Any") -> "Any":
    """The `tf.distribute` strategy for this launch; call it before any other TensorFlow call.

    `communication`: "auto" (NCCL with GPUs, else RING), "ring", "nccl". `timeout`: seconds
    for the pre-flight rendezvous (default DISTENV_TIMEOUT, else 180). `set_tf_config`:
    also write TF_CONFIG into os.environ. `allow_keras3`: you train with a custom loop, not
    Keras 3's model.fit. `threads`: size TensorFlow's thread pools from this process's share
    of the cores. `hostfile`, `gather`, `base_port`: see `tf_config`. Other keywords go to
    the strategy's constructor.
    """
    p = plan(env, hostfile=hostfile, gather=gather, base_port=base_port, discover=True, timeout=timeout)
    d, kind = p.env, p.kind
    distributed = kind in ("multi_worker", "parameter_server")
    hooks = _hooks()
    initialised = hooks.tf_initialized()
    cuda = p.cuda_visible_devices
    if cuda is not None and os.environ.get("CUDA_VISIBLE_DEVICES") != cuda:
        if initialised:
            raise TooLateError(_too_late("give this process its own GPUs "
                                         f"(CUDA_VISIBLE_DEVICES={cuda}: {p.cuda_why})"))
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[GPU_SLICE_VAR] = cuda
    if distributed and initialised:
        raise TooLateError(_too_late(f"join the {len(p.workers)}-worker cluster"))
    if kind == "multi_worker" and not allow_keras3:
        problem = hooks.keras_problem()
        if problem:
            raise DistEnvError(problem)
    config = p.tf_config
    if set_tf_config and config is not None:
        os.environ["TF_CONFIG"] = json.dumps(config)

    import tensorflow as tf

    if threads and not initialised:
        intra, inter = p.threads
        if tf.config.threading.get_intra_op_parallelism_threads() == 0:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if tf.config.threading.get_inter_op_parallelism_threads() == 0:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    if kind == "default":
        result = tf.distribute.get_strategy()
    elif kind == "mirrored":
        result = tf.distribute.MirroredStrategy(**kwargs)
    else:
        assert config is not None  # a cluster of several workers
        task = config["task"]
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(config["cluster"]), task_type=task["type"],
            task_id=task.get("index", 0), rpc_layer="grpc",
            environment=config.get("environment", ""))
        me = p.index
        if me is not None:
            rendezvous(p.workers, me, timeout, env=d)
        if kind == "parameter_server":
            result = _parameter_server(tf, resolver, task, **kwargs)
        else:
            impl = {"auto": p.communication or "RING", "ring": "RING", "nccl": "NCCL"}.get(
                communication.lower(), communication.upper())
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=getattr(tf.distribute.experimental.CommunicationImplementation, impl))
            kwargs.setdefault("communication_options", options)
            result = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, **kwargs)
    _last.update(strategy=result, plan=p)
    return result


def _parameter_server(tf: "Any", resolver: "Any", task: "dict[str, Any]", **kwargs: "Any") -> "Any":
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


def is_chief(env: "DistEnv | Mapping[str, str] | None" = None) -> bool:
    """True on the worker that writes checkpoints and logs (chief, else worker 0)."""
    p = _last.get("plan")
    if p is not None and env is None:
        config: "dict[str, Any] | None" = p.tf_config
    else:
        d, _ = resolved(env, None)
        try:
            config = tf_config(d) if d.is_distributed else None
        except DistEnvError:
            return d.is_main
    if config is None:
        return True
    task = config["task"]
    if config["cluster"].get("chief") or config["cluster"].get("master"):
        return task["type"] in CHIEFS
    first: bool = task["type"] == "worker" and task.get("index", 0) == 0  # TF_CONFIG values: Any
    return first

