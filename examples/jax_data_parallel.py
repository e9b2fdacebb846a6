#!/usr/bin/env python3
"""Data-parallel training with plain JAX, started right under any launcher, unchanged:

    python examples/jax_data_parallel.py                                  # one process
    mpirun -np 2 python examples/jax_data_parallel.py                     # Open MPI, MPICH, Intel MPI
    srun -n 2 python examples/jax_data_parallel.py                        # SLURM
    torchrun --nproc-per-node 2 --no-python python examples/jax_data_parallel.py

The only distenv line is `distenv.jax.initialize()`: it gives `jax.distributed.initialize` the
coordinator, process count and index from the launch (also under launchers JAX does not detect:
MPICH, Intel MPI, torchrun, per-node cloud launches), binds the devices and fails within
DISTENV_TIMEOUT naming a process that never came. (With DISTENV_AUTO=1 a script calling plain
`jax.distributed.initialize()` gets the same.)

A tiny regression model on synthetic data, fully deterministic. Every step takes one global
batch of --batch samples over a mesh of every device of every process: process p feeds its
share of the batch (rows p*b/P .. (p+1)*b/P), jit computes the gradient of the global batch
and the parameters stay replicated, so P processes compute what one process computes on the
whole batch. With --report each process prints one JSON line with its weights and loss.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import time

T0 = time.time()

import distenv.jax  # noqa: E402

FEATURES, HIDDEN = 8, 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16, help="global batch size")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--report", action="store_true", help="print one JSON line per process")
    args = ap.parse_args(argv)

    plan = distenv.jax.initialize()  # before any JAX computation

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    nproc, me = jax.process_count(), jax.process_index()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    if args.batch % jax.device_count():
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {jax.device_count()} devices")
    local = args.batch // nproc

    rng = np.random.default_rng(1234)
    x_all = rng.normal(size=(args.steps * args.batch, FEATURES)).astype(np.float32)
    w_true = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    y_all = np.tanh(x_all @ w_true) + 0.1 * rng.normal(size=(len(x_all), 1)).astype(np.float32)
    init = np.random.default_rng(0)
    host_params = {"w1": (init.normal(size=(FEATURES, HIDDEN)) * 0.3).astype(np.float32),
                   "b1": np.zeros(HIDDEN, np.float32),
                   "w2": (init.normal(size=(HIDDEN, 1)) * 0.3).astype(np.float32),
                   "b2": np.zeros(1, np.float32)}
    # The same values on every process: a replicated global array from each one's copy.
    params = {k: jax.make_array_from_callback(v.shape, replicated, lambda i, v=v: v[i])
              for k, v in host_params.items()}

    def loss_fn(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, g: a - args.lr * g, p, grads), loss

    def global_batch(array, s):
        mine = array[s * args.batch + me * local: s * args.batch + (me + 1) * local]
        return jax.make_array_from_process_local_data(rows, mine, (args.batch, array.shape[1]))

    t_train = time.time()
    losses = []
    for s in range(args.steps):
        params, loss = step(params, global_batch(x_all, s), global_batch(y_all, s))
        losses.append(float(loss.addressable_data(0)))
    weights = {k: np.asarray(v.addressable_data(0)) for k, v in params.items()}
    flat = np.concatenate([weights[k].ravel() for k in sorted(weights)]).astype(np.float64)
    summary = {
        "example": "jax_data_parallel",
        "process_index": me, "process_count": nproc, "host": socket.gethostname(),
        "devices": jax.device_count(), "local_devices": jax.local_device_count(),
        "coordinator": plan.coordinator_address if plan.initialized else None,
        "steps": args.steps, "losses": losses,
        "weights": [float(v) for v in flat],
        "digest": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
        "train_s": round(time.time() - t_train, 2), "total_s": round(time.time() - T0, 2),
        "pid": os.getpid(),
    }
    if args.report:
        print(json.dumps(summary), flush=True)
    elif me == 0:
        print(f"{nproc} process(es), {jax.device_count()} device(s): loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f}, weights {summary['digest']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
