#!/usr/bin/env python3
"""A JAX process that dies after joining: every process starts JAX through distenv.jax and
takes part in one all-gather; then process 1 ends at once (exit code 0, so the launcher does not
end the job for it) and the others start another all-gather. Each survivor must end on its own
within DISTENV_TIMEOUT (JAX's heartbeat and shutdown timeouts, which distenv.jax cuts to it),
naming process 1 (tests/e2e/test_jax_e2e.py). Prints JSON lines: {"event": ...}."""
import json
import os
import sys
import time

T0 = time.monotonic()

import distenv.jax  # noqa: E402

distenv.jax.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402


def say(event, **more):
    print(json.dumps({"event": event, "process_index": me, "since_start": time.monotonic() - T0,
                      **more}), flush=True)


me = jax.process_index()
say("joined", gathered=multihost_utils.process_allgather(jnp.array([me])).ravel().tolist())
if me == 1:
    say("leaving")
    os._exit(0)
time.sleep(1.0)
try:
    multihost_utils.process_allgather(jnp.array([me]))
    say("second all-gather returned")
except Exception as exc:  # gloo: the peer closed its connection
    say("second all-gather failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")
    sys.exit(3)
