"""DeepSpeed adapter: `init_distributed()` that works under any launcher, without mpi4py.

    import distenv.deepspeed
    env = distenv.deepspeed.init_distributed()          # instead of deepspeed.init_distributed()
    sizes = distenv.deepspeed.check_batch_size(ds_config, env.world_size)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config, ...)

Why: ``deepspeed.init_distributed()`` skips its own discovery only when all five of
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK are set. Otherwise it patches
the environment from Azure ML or SageMaker heuristics (fixed ports 6105/54965) or calls
mpi4py and ``hostname -I`` -- without mpi4py even a plain ``python train.py`` fails.
`init_distributed` resolves the launch with `distenv.resolve()` (Open MPI, MPICH, Intel
MPI, SLURM, torchrun, the DeepSpeed launcher's LOCAL_SIZE/CROSS_RANK, Azure ML and
SageMaker MPI jobs, ...), exports the torch variables, and calls DeepSpeed with
``auto_mpi_discovery=False``. The master port comes from the job id, so two jobs on one
machine do not collide.

DeepSpeed is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import json
import os

from .core.description import DistEnv
from .errors import DistEnvError, install_excepthook

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from typing import Any

#: The variables whose presence makes deepspeed.init_distributed skip its discovery.
REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


def prepare(environ: "MutableMapping[str, str] | None" = None, *, overwrite: bool = False,
            **overrides: Any) -> DistEnv:
    """Resolve the launch and export RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK
    (and LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK) into `environ` (default ``os.environ``).

    Raises `DistEnvError` naming the fix when the launch is per-node (its workers are still
    to be started) or one of the five cannot be known. Returns the resolved `DistEnv`.
    """
    from .bringup import bring_up

    target = os.environ if environ is None else environ
    # DeepSpeed never ends its process group, and its engine holds it to the end: bring_up
    # registers an orderly end at exit in a distributed launch (distenv.bringup.teardown).
    env = bring_up("deepspeed", environ=environ, overrides=overrides, target=target,
                   overwrite=overwrite)
    missing = [name for name in REQUIRED if not target.get(name)]
    if missing:
        raise DistEnvError(
            f"DeepSpeed needs {', '.join(missing)} but {env.launcher} does not reveal "
            f"{'it' if len(missing) == 1 else 'them'}. Fix: set "
            f"{', '.join(missing)} in the job script, or run `distenv show --explain`."
        )
    return env


def init_distributed(dist_backend: "str | None" = None, *,
                     environ: "MutableMapping[str, str] | None" = None, overwrite: bool = False,
                     overrides: "dict[str, Any] | None" = None, **kwargs: Any) -> DistEnv:
    """`deepspeed.init_distributed` that needs no mpi4py under any launcher.

    Resolves and exports as `prepare` does, then calls
    ``deepspeed.init_distributed(dist_backend, auto_mpi_discovery=False, **kwargs)``
    (``distributed_port`` is ignored by DeepSpeed once MASTER_PORT is set, so it is not
    passed). `overrides` go to `distenv.resolve` (e.g. ``{"master_addr": "node1"}``).
    Returns the resolved `DistEnv`.
    """
    if kwargs.pop("auto_mpi_discovery", False):
        raise TypeError("distenv.deepspeed.init_distributed always passes auto_mpi_discovery=False: "
                        "distenv has already described the launch")
    env = prepare(environ, overwrite=overwrite, **(overrides or {}))
    import deepspeed

    deepspeed.init_distributed(dist_backend=dist_backend, auto_mpi_discovery=False, **kwargs)
    return env


# -- batch sizes ---------------------------------------------------------------------------
_TBS, _MICRO, _GAS = ("train_batch_size", "train_micro_batch_size_per_gpu",
                      "gradient_accumulation_steps")


def _quotient(tbs: int, key: str, given: int, dp: int, where: str, other: str) -> int:
    """The batch factor the config leaves out: `tbs` / (`given` x `dp`), where `key` gave
    `given` and `other` is the key left out; an error when it does not divide."""
    step = given * dp
    if tbs % step:
        raise DistEnvError(
            f"DeepSpeed config {_TBS}={tbs} is not a multiple of {key}={given} x {dp} "
            f"(world size) = {step} {where}. Fix: set {_TBS} to "
            f"{max(1, round(tbs / step)) * step} (or another multiple of "
            f"{step}), or give {other} instead of {_TBS}."
        )
    return tbs // step


def _value(config: "dict[str, Any]", key: str) -> "int | None":
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DistEnvError(f"DeepSpeed config {key}={value!r} is not a positive integer. "
                           f"Fix: set {key} to a positive integer (or remove it).")
    return value


def check_batch_size(config: "dict[str, Any] | str | os.PathLike[str]", world_size: "int | None" = None, *,
                     data_parallel_size: "int | None" = None) -> "dict[str, int]":
    """Check ``train_batch_size == train_micro_batch_size_per_gpu *
    gradient_accumulation_steps * data-parallel size`` for a DeepSpeed config (a dict or
    the path of a JSON file), as DeepSpeed will, and say which number to change.

    The data-parallel size is `data_parallel_size` if given (world size divided by the
    tensor/pipeline-parallel degree), else `world_size`, else the resolved launch's world
    size. Missing values (or ``"auto"``) are completed the way DeepSpeed completes them.
    Returns ``{"train_batch_size", "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps", "data_parallel_size"}``; raises `DistEnvError` (a
    ValueError) naming the number to change.
    """
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            settings: "dict[str, Any]" = json.load(f)
    else:
        settings = config
    dp = data_parallel_size if data_parallel_size is not None else world_size
    if dp is None:
        from .core.resolver import resolve

        dp = resolve().world_size
        if dp is None:
            raise DistEnvError("check_batch_size: the launcher does not reveal the world size. "
                               "Fix: pass world_size= (or data_parallel_size=).")
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise DistEnvError(f"check_batch_size: data-parallel size {dp!r} is not a positive integer. "
                           "Fix: pass world_size= (or data_parallel_size=) as a number >= 1.")
    tbs, micro, gas = _value(settings, _TBS), _value(settings, _MICRO), _value(settings, _GAS)
    where = f"with {dp} data-parallel process{'es' if dp != 1 else ''}"

    if tbs is not None and micro is not None and gas is not None:
        product = micro * gas * dp
        if product != tbs:
            fixes = [f"set {_TBS} to {product} (keeps the per-GPU batch and the accumulation)"]
            if tbs % (micro * dp) == 0:
                fixes.append(f"or {_GAS} to {tbs // (micro * dp)} (keeps the global batch)")
            elif tbs % (gas * dp) == 0:
                fixes.append(f"or {_MICRO} to {tbs // (gas * dp)} (keeps the global batch)")
            raise DistEnvError(
                f"DeepSpeed config {_TBS}={tbs} but {_MICRO}={micro} x {_GAS}={gas} x "
                f"{dp} (world size) = {product} {where}. Fix: " + ", ".join(fixes) + "."
            )
    elif tbs is not None and micro is not None:
        gas = _quotient(tbs, _MICRO, micro, dp, where, _GAS)
    elif tbs is not None and gas is not None:
        micro = _quotient(tbs, _GAS, gas, dp, where, _MICRO)
    elif micro is not None:
        gas = gas or 1
        tbs = micro * gas * dp
    elif tbs is not None:
        if tbs % dp:
            raise DistEnvError(
                f"DeepSpeed config {_TBS}={tbs} is not a multiple of the world size {dp}. "
                f"Fix: set {_TBS} to {max(1, round(tbs / dp)) * dp}, or give {_MICRO} instead."
            )
        gas = 1
        micro = tbs // dp
    else:
        raise DistEnvError(f"DeepSpeed config sets neither {_TBS} nor {_MICRO}. "
                           f"Fix: set {_MICRO} (per-GPU batch) and, optionally, {_GAS}.")
    return {_TBS: tbs, _MICRO: micro, _GAS: gas, "data_parallel_size": dp}
