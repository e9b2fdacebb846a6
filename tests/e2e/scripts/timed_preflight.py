#!/usr/bin/env python3
"""Runs a script (`timed_preflight.py SCRIPT ARGS...`, as `python SCRIPT ARGS...` would) with
distenv.jax's pre-flight meeting timed by this process itself: one JSON line
{"event": "distenv-preflight", "seconds": ..., "ok": ...} when the meeting ends, however it ends.
The e2e tests bound that -- the wait DISTENV_TIMEOUT governs -- and not the launcher's start
or the framework imports before it, which a loaded 2-core machine makes slow at random."""
import json
import runpy
import sys
import time

import distenv.jax

_real = distenv.jax.preflight


def _timed(*args, **kwargs):
    t0, ok = time.monotonic(), False
    try:
        result = _real(*args, **kwargs)
        ok = True
        return result
    finally:
        print(json.dumps({"event": "distenv-preflight", "seconds": time.monotonic() - t0,
                          "ok": ok}), flush=True)


distenv.jax.preflight = _timed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
