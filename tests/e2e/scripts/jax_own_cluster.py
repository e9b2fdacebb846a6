#!/usr/bin/env python3
"""A platform JAX detects itself and no distenv source reads: a JAX cluster plugin registered
here (as JAX's own Cloud TPU/GCE and Kubernetes clusters are: a `ClusterEnv` subclass). With no
launcher variables distenv must leave JAX's detection alone, in the plain
`jax.distributed.initialize()` (argv[1] == "plain", DISTENV_AUTO=1) and in an explicit
`distenv.jax.initialize()` ("distenv"), never passing num_processes=1 over it.
Prints one JSON line per process."""
import json
import os
import sys

import jax
import numpy as np
from jax._src import clusters
from jax.experimental import multihost_utils


class TestPod(clusters.ClusterEnv):
    name = "testpod"

    @classmethod
    def is_env_present(cls):
        return "TESTPOD_ID" in os.environ

    @classmethod
    def get_coordinator_address(cls, timeout_secs, override_coordinator_port=None):
        return f"127.0.0.1:{os.environ['TESTPOD_PORT']}"

    @classmethod
    def get_process_count(cls):
        return int(os.environ["TESTPOD_COUNT"])

    @classmethod
    def get_process_id(cls):
        return int(os.environ["TESTPOD_ID"])

    @classmethod
    def get_local_process_id(cls):
        return 0


jax.config.update("jax_cpu_collectives_implementation", "gloo")
if sys.argv[1] == "distenv":
    import distenv.jax

    plan = distenv.jax.initialize()
    how = plan.jax_cluster
else:
    jax.distributed.initialize()
    how = None
ids = multihost_utils.process_allgather(np.array([jax.process_index()]))
print(json.dumps({"example": "jax_own_cluster", "process_index": jax.process_index(),
                  "process_count": jax.process_count(), "gathered": [int(i) for i in np.ravel(ids)],
                  "jax_cluster": how, "wrapped": getattr(jax.distributed.initialize, "_distenv", False),
                  "distenv_modules": sorted(m for m in sys.modules if m.startswith("distenv."))}),
      flush=True)
