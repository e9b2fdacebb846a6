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
   are derived from the job (`distenv.core.ports`), so concurrent jobs do not collide;
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

Modules, one job each: `cluster` (TF_CONFIG from the core's placement), `devices` (GPU slice,
threads), `keras_check` (which Keras, TensorFlow's state), `preflight` (the rendezvous),
`strategies` (`plan`, `strategy`, `is_chief`), `zero_code` (`patch`). Diagnostics go to the
``distenv.tensorflow`` logger.
"""

from __future__ import annotations

# One module per job; the public names below are this package's API (unchanged from the
# single module it was). No launcher variable is read here: placement comes from
# `distenv.core.placement` (through DistEnv.rank_hosts), knobs from `distenv.knobs`.
from ..core.placement import parse_hostfile
from ..sources.slurm import task_nodes as slurm_task_nodes
from .cluster import CHIEFS, LOOPBACK, task_index, tf_config, training_workers
from .devices import GPU_SLICE_VAR, gpu_assignment, thread_counts
from .keras_check import keras_flavour, keras_problem, tf_initialized
from .preflight import DEFAULT_TIMEOUT, rendezvous
from .strategies import TooLateError, _last, _too_late, is_chief, plan, strategy
from .zero_code import patch, patch_environ, unpatch
from ..errors import install_excepthook

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

__all__ = [
    "strategy", "plan", "tf_config", "is_chief", "patch", "unpatch", "patch_environ",
    "gpu_assignment", "thread_counts", "rendezvous", "keras_flavour", "keras_problem",
    "tf_initialized", "training_workers", "task_index", "parse_hostfile", "slurm_task_nodes",
    "TooLateError", "GPU_SLICE_VAR", "DEFAULT_TIMEOUT", "LOOPBACK", "CHIEFS",
]
