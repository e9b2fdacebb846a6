#!/usr/bin/env python3
"""Keras 3 layers trained by a custom strategy.run loop under MultiWorkerMirroredStrategy:
the tested opt-in `distenv.tensorflow.strategy(allow_keras3=True)` (Keras 3's own fit fails
under MWMS, keras-team/keras#20585). Prints ``DISTENV-KERAS {json}`` per worker."""
import hashlib
import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import distenv.keras  # noqa: E402
import distenv.tensorflow  # noqa: E402

strategy = distenv.tensorflow.strategy(allow_keras3=True)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

assert keras.__version__.startswith("3."), keras.__version__
GLOBAL_BATCH, STEPS = 16, 6
rng = np.random.default_rng(0)
x = rng.normal(size=(GLOBAL_BATCH * STEPS, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)

with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.05)


@tf.function
def step(batch):
    def replica(xb, yb):
        with tf.GradientTape() as tape:
            err = tf.reduce_sum(tf.square(model(xb, training=True) - yb)) / GLOBAL_BATCH
        grads = tape.gradient(err, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return err

    per = strategy.run(replica, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)


for batch in strategy.experimental_distribute_dataset(data):
    loss = step(batch)

weights = [v.numpy() for v in model.weights]
digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
sys.stdout.write("DISTENV-KERAS " + json.dumps({
    "worker": distenv.keras.worker_index(), "chief": distenv.tensorflow.is_chief(),
    "replicas": strategy.num_replicas_in_sync, "strategy": type(strategy).__name__,
    "keras": "keras " + keras.__version__, "weights": digest, "loss": float(loss)}) + "\n")
sys.stdout.flush()
