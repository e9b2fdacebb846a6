"""Keras (tf-keras and Keras 3): chief-aware callbacks, and `keras.distribution` from the launch.

    callbacks = distenv.keras.callbacks([
        keras.callbacks.ModelCheckpoint("out/model.keras"),
        keras.callbacks.TensorBoard("out/tb"),
        keras.callbacks.CSVLogger("out/log.csv"),
        keras.callbacks.BackupAndRestore("out/backup"),
    ])
    model.fit(x, y, callbacks=callbacks, verbose=distenv.keras.verbose())

Under MultiWorkerMirroredStrategy every worker must run the same saving code (saving reads
variables through collectives), but only one may write where the user asked: two workers
writing one HDF5 file die on its lock, and two CSV loggers interleave. `callbacks()` keeps
the user's callbacks and, on every worker but the chief, points their output at a private
temporary directory, a fresh one for each `fit` (`mkdtemp`: mode 0700), removed when training
ends (and at exit):

* ModelCheckpoint (`filepath`), TensorBoard (`log_dir`), CSVLogger (`filename`): the chief
  writes the user's path, other workers ``<tmp>/<same name>``;
* BackupAndRestore: one directory per worker, ``<backup_dir>/worker-<rank>`` (every worker
  saves and restores its own state), except under tf-keras with a multi-worker
  `tf.distribute` strategy, which already shares one directory between chief and workers;
* progress bars: a silent ProgbarLogger on non-chief workers (``fit(verbose=...)`` then
  prints on the chief only), and TensorFlow's Python loggers lowered to errors there.

Keras 3 on the JAX backend (docs/frameworks/jax.md): `initialize()` starts
`keras.distribution` from the resolved launch (through `distenv.jax`) and `data_parallel()`
returns the `DataParallel` distribution for per-rank arrays or a global tf.data dataset; the
callbacks above work there as under tf-keras (the chief is process 0, node 0 in a per-node
launch). Keras is imported inside the functions: `import distenv.keras` costs nothing without it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile

from .core.description import DistEnv
from .errors import DistEnvError, install_excepthook
from .sources import family

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

#: Callback class name -> the attribute holding the path it writes.
PATH_ATTRS = {"ModelCheckpoint": "filepath", "TensorBoard": "log_dir", "CSVLogger": "filename"}


def _resolve(env: "DistEnv | Mapping[str, str] | None") -> DistEnv:
    if isinstance(env, DistEnv):
        return env
    from .core.resolver import resolve

    return resolve(env)


def is_chief(env: "DistEnv | Mapping[str, str] | None" = None) -> bool:
    """True on the worker that writes the user's paths: the TF_CONFIG chief (or worker 0)
    when `distenv.tensorflow.strategy()` built the cluster, else global rank 0."""
    tf_adapter = sys.modules.get("distenv.tensorflow")
    if env is None and tf_adapter is not None and tf_adapter._last.get("plan") is not None:
        chief: bool = tf_adapter.is_chief()  # a sys.modules module's attribute is Any
        return chief
    d = _resolve(env)
    if not d.is_distributed:
        return True
    if family(d.launcher) == "tensorflow":  # a TF_CONFIG launch: TensorFlow's chief rule
        from .tensorflow import is_chief as tf_is_chief

        return tf_is_chief(d)
    return d.is_main


def worker_index(env: "DistEnv | Mapping[str, str] | None" = None) -> int:
    """This worker's index (global rank; node rank for a per-node launch)."""
    tf_adapter = sys.modules.get("distenv.tensorflow")
    if env is None and tf_adapter is not None and tf_adapter._last.get("plan") is not None:
        index: "int | None" = tf_adapter._last["plan"].index
        if index is not None:
            return index
    d = _resolve(env)
    value = d.process_index
    return 0 if value is None else value


def is_distributed(env: "DistEnv | Mapping[str, str] | None" = None) -> bool:
    """True when more than one worker trains (the TF cluster's workers, else the launch's)."""
    tf_adapter = sys.modules.get("distenv.tensorflow")
    if env is None and tf_adapter is not None and tf_adapter._last.get("plan") is not None:
        return len(tf_adapter._last["plan"].workers) > 1
    return _resolve(env).is_distributed


def verbose(default: "int | str" = "auto", env: "DistEnv | Mapping[str, str] | None" = None
            ) -> "int | str":
    """The `verbose` to give `fit`/`evaluate`: `default` on the chief, 0 elsewhere."""
    return default if is_chief(env) else 0


def _class_names(cb: "Any") -> "list[str]":
    return [k.__name__ for k in type(cb).__mro__]


def _flavour_of(cb: "Any") -> str:
    for k in type(cb).__mro__:
        root = k.__module__.split(".", 1)[0]
        if root in ("tf_keras", "keras"):
            return root
    return "keras"


def _multi_worker_strategy(strategy: "Any") -> bool:
    if strategy is None:
        tf_adapter = sys.modules.get("distenv.tensorflow")
        if tf_adapter is not None:
            strategy = tf_adapter._last.get("strategy")
    if strategy is None and "tensorflow" in sys.modules:
        strategy = sys.modules["tensorflow"].distribute.get_strategy()
    try:
        return bool(strategy.extended._in_multi_worker_mode())
    except AttributeError:
        return False


class _Scratch:
    """One private temporary directory per process and fit, removed at train end and at exit.

    Each fit gets a fresh `tempfile.mkdtemp` (mode 0700, a name nobody else holds): the
    directory of the fit before is never re-created by name, since after its removal anyone
    on the machine may have created (or linked) a directory of that name in the shared
    temporary directory. The callbacks redirected into it (`targets`) are pointed at each new
    one."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.path: "str | None" = None
        self.targets: "list[tuple[Any, str, str]]" = []  # (callback, attribute, file name)
        self._exit_hook = False

    def make(self) -> str:
        """The current directory; a fresh one (and the callbacks pointed at it) if none is."""
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix=f"distenv-worker{self.index}-")
            if not self._exit_hook:
                atexit.register(self.remove)
                self._exit_hook = True
            for cb, attr, name in self.targets:
                setattr(cb, attr, os.path.join(self.path, name))
        return self.path

    def redirect(self, cb: "Any", attr: str, name: str) -> None:
        self.targets.append((cb, attr, name))
        setattr(cb, attr, os.path.join(self.make(), name))

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def _redirect(cb: "Any", attr: str, scratch: _Scratch) -> None:
    original = str(getattr(cb, attr))
    name = os.path.basename(original.rstrip("/\\")) or attr
    scratch.redirect(cb, attr, name)


def _per_worker_backup(cb: "Any", index: int) -> None:
    base = str(cb.backup_dir)
    mine = os.path.join(base, f"worker-{index}")
    cb.backup_dir = mine
    # Keras 3 derives its file paths in __init__; keep them in step.
    for attr, leaf in (("_weights_path", "latest.weights.h5"),
                       ("_training_metadata_path", "training_metadata.json")):
        if hasattr(cb, attr):
            setattr(cb, attr, os.path.join(mine, leaf))
    for attr, src in (("_prev_weights_path", "_weights_path"),
                      ("_prev_training_metadata_path", "_training_metadata_path")):
        if hasattr(cb, attr) and hasattr(cb, src):
            setattr(cb, attr, getattr(cb, src) + ".bkp")


def _keras_module(flavour: str) -> "Any":
    if flavour == "tf_keras":
        import tf_keras

        return tf_keras
    import keras

    return keras


def _guess_flavour() -> str:
    if "tf_keras" in sys.modules or os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):
        return "tf_keras"
    return "keras"


def _scratch_callback(keras: "Any", scratch: _Scratch) -> "Any":
    class DistenvScratch(keras.callbacks.Callback):  # type: ignore[misc]  # Keras is Any here
        """First in the list: gives each fit a fresh private directory. In `set_model`, which
        `fit` calls on every callback in order before any `on_train_begin`: TensorBoard takes
        its log directory there."""

        def set_model(self, model: "Any") -> None:
            super().set_model(model)
            scratch.make()

        def on_train_begin(self, logs: "dict[str, Any] | None" = None) -> None:
            scratch.make()  # a caller that skipped set_model

    return DistenvScratch()


def _cleanup_callback(keras: "Any", scratch: _Scratch) -> "Any":
    class DistenvCleanup(keras.callbacks.Callback):  # type: ignore[misc]  # Keras is Any here
        """Last in the list: removes the private directory after training."""

        def on_train_end(self, logs: "dict[str, Any] | None" = None) -> None:
            scratch.remove()

    return DistenvCleanup()


def _silent_progbar(keras: "Any") -> "Any":
    class SilentProgbarLogger(keras.callbacks.ProgbarLogger):  # type: ignore[misc]  # Keras is Any here
        """Takes the progress bar's place on a non-chief worker and prints nothing."""

        def set_params(self, params: "dict[str, Any]") -> None:
            super().set_params(params)
            self.verbose = 0

    return SilentProgbarLogger()


def callbacks(cbs: "Iterable[Any] | None" = None, *,
              env: "DistEnv | Mapping[str, str] | None" = None, strategy: "Any" = None,
              chief: "bool | None" = None, quiet: bool = True) -> "list[Any]":
    """The user's callbacks made chief-aware (see the module docstring); a new list.

    A single worker gets its callbacks back unchanged. `chief` overrides the chief test
    (default `is_chief(env)`); `strategy` the strategy
    used to tell tf-keras multi-worker mode (default: the one `distenv.tensorflow` made).
    The callbacks are changed in place, so build a fresh list per `fit`.
    """
    cbs = list(cbs or [])
    if chief is None and not is_distributed(env):
        return cbs  # a single worker writes where the user asked, as without distenv
    chief = is_chief(env) if chief is None else chief
    index = worker_index(env)
    flavours = {_flavour_of(cb) for cb in cbs if "Callback" in _class_names(cb)}
    flavour = flavours.pop() if len(flavours) == 1 else _guess_flavour()
    scratch = _Scratch(index)
    out: "list[Any]" = []
    for cb in cbs:
        names = _class_names(cb)
        if "BackupAndRestore" in names and hasattr(cb, "backup_dir"):
            if not (_flavour_of(cb) == "tf_keras" and _multi_worker_strategy(strategy)):
                _per_worker_backup(cb, index)
            out.append(cb)
            continue
        if not chief:
            if "ProgbarLogger" in names:
                continue  # replaced by a silent one below
            for cls, attr in PATH_ATTRS.items():
                if cls in names and getattr(cb, attr, None):
                    _redirect(cb, attr, scratch)
                    break
        out.append(cb)
    if not chief:
        keras = _keras_module(flavour)
        if scratch.targets:
            out.insert(0, _scratch_callback(keras, scratch))
        out.append(_silent_progbar(keras))
        out.append(_cleanup_callback(keras, scratch))
        if quiet:
            for name in ("tensorflow", "absl", "keras"):
                logging.getLogger(name).setLevel(logging.ERROR)
    return out


# -- keras.distribution (Keras 3, JAX backend) ------------------------------------------------
def initialize_args(env: "DistEnv | Mapping[str, str] | None" = None, *,
                    environ: "Mapping[str, str] | None" = None, port: "int | None" = None
                    ) -> "dict[str, Any]":
    """The arguments `initialize()` gives `keras.distribution.initialize`, without Keras:
    ``{"job_addresses": "<process 0's host>:<port>", "num_processes": N, "process_id": i}``,
    from `distenv.jax.plan` (one JAX process per worker, or per node in a per-node launch).

    The coordinator port is `port`, else JAX_COORDINATOR_PORT or DISTENV_KERAS_PORT, else
    derived from the job (never the master port, which torchrun's own store may hold).
    """
    return _args(env, environ=environ, port=port)


def _args(env: "DistEnv | Mapping[str, str] | None" = None, *,
          environ: "Mapping[str, str] | None" = None, port: "int | None" = None,
          discover: bool = False) -> "dict[str, Any]":
    from .jax import plan

    p = plan(env, environ=environ, port=port, discover=discover)
    return {"job_addresses": p.coordinator_address, "num_processes": p.num_processes,
            "process_id": p.process_id}


def initialize(env: "DistEnv | Mapping[str, str] | None" = None, *, port: "int | None" = None,
               set_environ: bool = False) -> "dict[str, Any]":
    """Call `keras.distribution.initialize` with the launch's coordinator, size and index.

    Keras 3 implements it for the JAX backend only: it starts `jax.distributed` and agrees on
    one random seed across processes. Around that call distenv's JAX patch is in place
    (`distenv.jax.patch`): devices bound, CPU collectives chosen, every process met within
    DISTENV_TIMEOUT. Call it before any Keras or JAX computation; then
    `keras.distribution.set_distribution(distenv.keras.data_parallel())`. `set_environ` also
    writes the KERAS_DISTRIBUTION_* variables. Returns the arguments used.
    """
    # discover: across MPICH/Intel MPI nodes process 0's host comes from the launcher's
    # key-value service (collective: every process gets here)
    args = _args(env, port=port, discover=True)
    if set_environ:
        os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"] = args["job_addresses"]
        os.environ["KERAS_DISTRIBUTION_NUM_PROCESSES"] = str(args["num_processes"])
        os.environ["KERAS_DISTRIBUTION_PROCESS_ID"] = str(args["process_id"])
    import keras

    backend = keras.backend.backend()
    if backend != "jax":
        raise DistEnvError(
            f"keras.distribution.initialize works with the JAX backend only; KERAS_BACKEND is "
            f"{backend!r}. Fix: set KERAS_BACKEND=jax before importing keras, or with TensorFlow "
            "use distenv.tensorflow.strategy() and tf-keras."
        )
    jax_mod = sys.modules.get("jax")
    patched_here = False
    if jax_mod is not None and not getattr(jax_mod.distributed.initialize, "_distenv", False):
        from . import jax as distenv_jax

        distenv_jax.patch()
        patched_here = True
    try:
        if args["num_processes"] > 1:
            keras.distribution.initialize(**args)
        elif jax_mod is not None:
            # One process: no runtime to start, but the node's devices still to bind.
            from . import jax as distenv_jax

            distenv_jax.initialize(env=env)
    finally:
        if patched_here:
            from . import jax as distenv_jax

            distenv_jax.unpatch()
    return args


#: How `data_parallel(data=...)` feeds Keras: each process's own share, or one global dataset.
PER_RANK, GLOBAL = "per-rank", "global"


def data_parallel(data: str = PER_RANK, devices: "Any" = None) -> "Any":
    """`keras.distribution.DataParallel` over every device of every process, its dataset
    sharding set for how the script feeds data:

    * ``data="per-rank"`` (default): each process passes its own share of every global batch
      (NumPy arrays, or a dataset it already sharded), `fit(batch_size=<global batch> /
      <processes>)`; Keras assembles the global batch from the processes' shares, in process
      order. (`auto_shard_dataset=False`: Keras must not shard again.)
    * ``data="global"``: every process passes the same `tf.data.Dataset` of global batches;
      Keras shards it per process (`auto_shard_dataset=True`; tf.data only).

    `devices`: the devices to use (default `keras.distribution.list_devices()`: all of them).
    """
    if data not in (PER_RANK, GLOBAL):
        raise DistEnvError(f"data={data!r}: expected {PER_RANK!r} (each process feeds its own "
                           f"share) or {GLOBAL!r} (one tf.data.Dataset of global batches). "
                           f"Fix: pass data={PER_RANK!r} or data={GLOBAL!r}.")
    import keras

    if devices is None:
        devices = keras.distribution.list_devices()
    return keras.distribution.DataParallel(devices=devices, auto_shard_dataset=data == GLOBAL)
