#!/usr/bin/env python3
"""`timed_preflight.py MODULE:FUNCTION SCRIPT ARGS...` runs SCRIPT as `python SCRIPT ARGS...`
would, with distenv's pre-flight meeting (MODULE.FUNCTION: distenv.jax:preflight,
distenv.tensorflow.strategies:rendezvous, distenv.torch:_rendezvous) timed by this process
itself: one JSON line {"event": "distenv-preflight", "seconds": ..., "ok": ...} each time the
meeting ends, however it ends. The e2e tests bound that -- the wait DISTENV_TIMEOUT governs --
and not the launcher's start or the framework imports before it, which a loaded 2-core machine
makes slow at random."""
import importlib
import json
import runpy
import sys
import time

_module_name, _, _name = sys.argv[1].partition(":")
_module = importlib.import_module(_module_name)
_real = getattr(_module, _name)


def _timed(*args, **kwargs):
    t0, ok = time.monotonic(), False
    try:
        result = _real(*args, **kwargs)
        ok = True
        return result
    finally:
        print(json.dumps({"event": "distenv-preflight", "seconds": time.monotonic() - t0,
                          "ok": ok}), flush=True)


setattr(_module, _name, _timed)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
