#!/usr/bin/env python3
"""tf-keras with MultiWorkerMirroredStrategy under any launcher, unchanged:

    python examples/keras_mwms.py                                  # one worker
    mpirun -np 2 python examples/keras_mwms.py                     # Open MPI, MPICH, Intel MPI
    srun -n 2 python examples/keras_mwms.py                        # SLURM
    torchrun --nproc-per-node 2 --no-python python examples/keras_mwms.py

Across MPI nodes the launcher does not say which host runs each rank: add
DISTENV_GATHER=mpi4py (an allgather of host names) or DISTENV_HOSTFILE=<mpirun's host file>
(`mpirun -x DISTENV_GATHER ...`). Needs tensorflow-cpu and tf-keras (installed with
--no-deps), e.g. `bash integrations/frameworks/tensorflow.sh`.

Only the chief writes OUT/model.h5, OUT/tb and OUT/log.csv; the other workers write to
private temporary directories that are removed after `fit`. Each worker prints one line
``DISTENV-KERAS {json}`` with its rank, the replica count and a digest of its weights.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import sys

# tf.keras is Keras 3 since TensorFlow 2.16, and Keras 3's fit fails under
# MultiWorkerMirroredStrategy: use tf-keras. Must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import distenv.keras  # noqa: E402
import distenv.tensorflow  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # outside the working directory: running from a clone leaves it clean
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), f"keras_mwms_out-{os.getuid()}"),
                    help="checkpoint/log directory (default: in the temporary directory)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="steps per epoch")
    ap.add_argument("--batch", type=int, default=16, help="global batch size")
    args = ap.parse_args(argv)

    strategy = distenv.tensorflow.strategy()  # before any other TensorFlow call

    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    rng = np.random.default_rng(0)  # the same data on every worker; MWMS shards it
    x = rng.normal(size=(args.batch * args.steps, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch).with_options(options)

    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")

    os.makedirs(args.out, exist_ok=True)
    callbacks = distenv.keras.callbacks([
        keras.callbacks.ModelCheckpoint(os.path.join(args.out, "model.h5")),
        keras.callbacks.TensorBoard(os.path.join(args.out, "tb")),
        keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv")),
        keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup")),
    ])
    history = model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps,
                        callbacks=callbacks, verbose=distenv.keras.verbose(2))

    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    report = {
        "worker": distenv.keras.worker_index(),
        "chief": distenv.keras.is_chief(),
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "keras": keras.__name__ + " " + keras.__version__,
        "weights": digest,
        "loss": float(history.history["loss"][-1]),
        "callbacks": [cb.__class__.__name__ for cb in callbacks],
    }
    sys.stdout.write("DISTENV-KERAS " + json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
