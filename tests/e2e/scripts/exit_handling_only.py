#!/usr/bin/env python
"""Run a script as __main__ with only distenv's exit handling on (distenv.bringup.teardown), nothing else
of distenv: no resolution, no export, no patch.

    python exit_handling_only.py SCRIPT [ARGS ...]

The zero-code tests compare distenv's runs with a reference: the plain script under torchrun.
Without distenv that reference itself deadlocks at its end now and then (measured in the full
suite: one of 4 workers hung for 10 minutes in ~ProcessGroupGloo, holding the GIL, while a gloo
worker waited for it -- torch's race, pytorch/pytorch#190489), and the test would fail on the
reference, not on distenv. This keeps the reference's training untouched and lets it end.
"""
import runpy
import sys

from distenv.bringup import teardown as _teardown

_teardown.register()
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
