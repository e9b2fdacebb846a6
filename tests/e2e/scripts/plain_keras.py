#!/usr/bin/env python3
"""examples/keras_mwms.py with its distenv lines removed: a plain tf-keras
MultiWorkerMirroredStrategy script.

    DISTENV_AUTO=1 mpirun -np 2 -x DISTENV_AUTO python plain_keras.py
    DISTENV_AUTO=1 srun -N2 --ntasks-per-node=1 python plain_keras.py
    DISTENV_AUTO=1 torchrun --nproc-per-node 2 --no-python python plain_keras.py

It never imports distenv and reads no launcher variable: `tf.distribute.MultiWorkerMirroredStrategy()`
reads TF_CONFIG, which distenv.auto (DISTENV_AUTO=1) writes when the script imports TensorFlow.
Without it every process trains alone (num_replicas_in_sync == 1; each believes it is the chief
and they race on the checkpoint files). Each worker prints ``DISTENV-KERAS-STRATEGY {json}``
(its task and replica count) once the strategy is built and, after `fit`, ``DISTENV-KERAS
{json}``: the same plus a digest of its weights, the weights themselves, the loss, and which
distenv modules the process ended up with.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # outside the working directory: running from a clone leaves it clean
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), f"keras_mwms_out-{os.getuid()}"),
                    help="checkpoint/log directory (default: in the temporary directory)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="steps per epoch")
    ap.add_argument("--batch", type=int, default=16, help="global batch size")
    args = ap.parse_args(argv)

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other TensorFlow call
    resolver = strategy.cluster_resolver
    sys.stdout.write("DISTENV-KERAS-STRATEGY " + json.dumps({
        "task_type": resolver.task_type, "task_id": resolver.task_id,
        "replicas": strategy.num_replicas_in_sync}) + "\n")
    sys.stdout.flush()

    import numpy as np
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
    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(args.out, "model.h5")),
        keras.callbacks.TensorBoard(os.path.join(args.out, "tb")),
        keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv")),
        keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup")),
    ]
    history = model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps,
                        callbacks=callbacks, verbose=2)

    weights = model.get_weights()
    report = {
        "task_type": resolver.task_type,
        "task_id": resolver.task_id,
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "keras": keras.__name__ + " " + keras.__version__,
        "weights": hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest(),
        "values": [float(v) for w in weights for v in w.ravel()],
        "loss": float(history.history["loss"][-1]),
        "distenv_modules": sorted(m for m in sys.modules if m.startswith("distenv")),
    }
    sys.stdout.write("DISTENV-KERAS " + json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
