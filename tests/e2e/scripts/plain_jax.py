#!/usr/bin/env python3
"""examples/jax_data_parallel.py with its distenv line removed: a plain
`jax.distributed.initialize()` with no arguments, as JAX's docs show it. Under MPICH, Intel MPI
or torchrun JAX alone stops there ("coordinator_address should be defined"); with
DISTENV_AUTO=1 distenv.auto patches it when JAX is imported (tests/e2e/test_jax_e2e.py).
Prints one JSON line per process, as the example does with --report."""
import hashlib
import json
import socket
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

FEATURES, HIDDEN, STEPS, BATCH, LR = 8, 16, 12, 16, 0.1

jax.distributed.initialize()

nproc, me = jax.process_count(), jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("data",))
rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
local = BATCH // nproc
rng = np.random.default_rng(1234)
x_all = rng.normal(size=(STEPS * BATCH, FEATURES)).astype(np.float32)
w_true = rng.normal(size=(FEATURES, 1)).astype(np.float32)
y_all = np.tanh(x_all @ w_true) + 0.1 * rng.normal(size=(len(x_all), 1)).astype(np.float32)
init = np.random.default_rng(0)
host = {"w1": (init.normal(size=(FEATURES, HIDDEN)) * 0.3).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (init.normal(size=(HIDDEN, 1)) * 0.3).astype(np.float32),
        "b2": np.zeros(1, np.float32)}
params = {k: jax.make_array_from_callback(v.shape, replicated, lambda i, v=v: v[i]) for k, v in host.items()}


def loss_fn(p, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)


@jax.jit
def step(p, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    return jax.tree.map(lambda a, g: a - LR * g, p, grads), loss


def global_batch(array, s):
    mine = array[s * BATCH + me * local: s * BATCH + (me + 1) * local]
    return jax.make_array_from_process_local_data(rows, mine, (BATCH, array.shape[1]))


losses = []
for s in range(STEPS):
    params, loss = step(params, global_batch(x_all, s), global_batch(y_all, s))
    losses.append(float(loss.addressable_data(0)))
flat = np.concatenate([np.asarray(params[k].addressable_data(0)).ravel() for k in sorted(params)])
flat = flat.astype(np.float64)
print(json.dumps({
    "example": "plain_jax", "process_index": me, "process_count": nproc,
    "host": socket.gethostname(), "devices": jax.device_count(), "losses": losses,
    "weights": [float(v) for v in flat], "digest": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
    "distenv_modules": sorted(m for m in sys.modules if m.startswith("distenv.")),
}), flush=True)
