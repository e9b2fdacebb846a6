#!/usr/bin/env python3
"""Keras 3 on the JAX backend, data parallel across processes, under any launcher, unchanged:

    python examples/keras3_jax.py                                  # one process
    mpirun -np 2 python examples/keras3_jax.py                     # Open MPI, MPICH, Intel MPI
    srun -n 2 python examples/keras3_jax.py                        # SLURM
    torchrun --nproc-per-node 2 --no-python python examples/keras3_jax.py

Needs `keras>=3` and `jax` (pip install 'distenv[jax]'); no TensorFlow. Three distenv lines:
`distenv.keras.initialize()` (keras.distribution from the launch: coordinator, process count and
index, also where JAX detects nothing -- MPICH, Intel MPI, torchrun, per-node cloud launches),
`distenv.keras.data_parallel()` (DataParallel over every device of every process, each process
feeding its own share of every global batch) and `distenv.keras.callbacks(...)`: only the chief
(process 0) writes OUT/model.weights.h5 and OUT/log.csv; the others write to private temporary
directories removed after `fit`; BackupAndRestore keeps OUT/backup/worker-<process> per process. (With DISTENV_AUTO=1 a script calling plain
`keras.distribution.initialize()` gets the same start.)

A tiny regression model on synthetic data, fully deterministic: P processes compute what one
process computes on the same global batches. With --report each process prints one JSON line
with its weights and loss.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import socket
import time

T0 = time.time()
os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras is imported

import distenv.keras  # noqa: E402

FEATURES = 8


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # outside the working directory: running from a clone leaves it clean
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), f"keras3_jax_out-{os.getuid()}"),
                    help="checkpoint and log directory (default: in the temporary directory)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="steps per epoch")
    ap.add_argument("--batch", type=int, default=16, help="global batch size")
    ap.add_argument("--report", action="store_true", help="print one JSON line per process")
    args = ap.parse_args(argv)

    import keras
    import numpy as np

    keras.utils.set_random_seed(0)          # the same initial weights in every process
    distenv.keras.initialize()              # before any Keras or JAX computation
    keras.distribution.set_distribution(distenv.keras.data_parallel())

    import jax

    nproc, me = jax.process_count(), jax.process_index()
    if args.batch % nproc:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {nproc} processes")
    rng = np.random.default_rng(1234)
    n = args.steps * args.batch
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(FEATURES, 1))).astype("float32")
    # Process p's share of global batch s: rows s*B + p*B/P .. s*B + (p+1)*B/P.
    local = args.batch // nproc
    mine = np.concatenate([np.arange(s * args.batch + me * local, s * args.batch + (me + 1) * local)
                           for s in range(args.steps)])

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    os.makedirs(args.out, exist_ok=True)
    callbacks = distenv.keras.callbacks([
        keras.callbacks.ModelCheckpoint(os.path.join(args.out, "model.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv")),
        keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup")),  # one dir per process
    ])
    t_train = time.time()
    history = model.fit(x[mine], y[mine], batch_size=local, epochs=args.epochs, shuffle=False,
                        callbacks=callbacks, verbose=distenv.keras.verbose(2))
    flat = np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in model.get_weights()])
    summary = {
        "example": "keras3_jax", "keras": keras.__version__, "backend": keras.backend.backend(),
        "process_index": me, "process_count": nproc, "host": socket.gethostname(),
        "chief": distenv.keras.is_chief(),
        "distribution": type(keras.distribution.distribution()).__name__,
        "devices": len(keras.distribution.list_devices()),
        "losses": [float(v) for v in history.history["loss"]],
        "weights": [float(v) for v in flat],
        "digest": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
        "train_s": round(time.time() - t_train, 2), "total_s": round(time.time() - T0, 2),
    }
    if args.report:
        print(json.dumps(summary), flush=True)
    elif summary["chief"]:
        print(f"{nproc} process(es), {summary['devices']} device(s): loss "
              f"{summary['losses'][0]:.4f} -> {summary['losses'][-1]:.4f}, weights {summary['digest']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
