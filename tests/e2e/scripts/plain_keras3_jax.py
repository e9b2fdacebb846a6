#!/usr/bin/env python3
"""examples/keras3_jax.py with its distenv lines removed: a plain
`keras.distribution.initialize()` with no arguments and Keras's own DataParallel, as Keras's
distribution guide shows them (each process feeds its share: auto_shard_dataset=False). Without
KERAS_DISTRIBUTION_* variables Keras passes JAX nothing, and JAX finds no coordinator under
MPICH, Intel MPI or torchrun; with DISTENV_AUTO=1 distenv.auto patches jax.distributed.initialize
when Keras imports JAX (tests/e2e/test_jax_e2e.py). One JSON line per process."""
import hashlib
import json
import os
import socket
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

FEATURES, EPOCHS, STEPS, BATCH = 8, 2, 4, 16

keras.utils.set_random_seed(0)
keras.distribution.initialize()
keras.distribution.set_distribution(keras.distribution.DataParallel(
    devices=keras.distribution.list_devices(), auto_shard_dataset=False))

nproc, me = jax.process_count(), jax.process_index()
rng = np.random.default_rng(1234)
x = rng.normal(size=(STEPS * BATCH, FEATURES)).astype("float32")
y = np.tanh(x @ rng.normal(size=(FEATURES, 1))).astype("float32")
local = BATCH // nproc
mine = np.concatenate([np.arange(s * BATCH + me * local, s * BATCH + (me + 1) * local)
                       for s in range(STEPS)])
model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
history = model.fit(x[mine], y[mine], batch_size=local, epochs=EPOCHS, shuffle=False,
                    verbose=2 if me == 0 else 0)
flat = np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in model.get_weights()])
print(json.dumps({
    "example": "plain_keras3_jax", "process_index": me, "process_count": nproc,
    "host": socket.gethostname(), "devices": len(keras.distribution.list_devices()),
    "losses": [float(v) for v in history.history["loss"]],
    "weights": [float(v) for v in flat], "digest": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
    "distenv_modules": sorted(m for m in sys.modules if m.startswith("distenv.")),
}), flush=True)
