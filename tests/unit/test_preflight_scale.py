"""The pre-flight at scale (issue 32, item 1), in CI's time: benchmarks/bench_preflight.py with
1 000 simulated peers of the star (JAX, Horovod), 256 TensorFlow workers and 250 ranks of
torch's meeting protocol, every process under RLIMIT_NOFILE 1024 (soft and hard for the star
and TensorFlow: process 0 cannot hold a socket per peer). Each meets within 30 s; a missing
peer is named by process 0 and by every peer within the timeout (plus 4 s and 1.5 paces),
each peer making at most the documented number of requests. The benchmark itself runs 4 000
peers and 1 024 workers (figures in benchmarks/README.md).

Torch's protocol runs its ranks as threads of one process (an in-process store): 1 000 of
them beside the suite's other worker missed the 4 s timeout's bound in 2 of 4 CI-shaped runs
(threads not yet started at the deadline; the verdict read 6.6 s late), a starvation of the
simulation, not of the protocol (its ranks are processes). 250 threads and a 6 s timeout
keep the check of the protocol's bounds without the simulation's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BENCH = os.path.join(ROOT, "benchmarks", "bench_preflight.py")
MARK = "BENCH-PREFLIGHT "


@pytest.fixture(scope="module")
def report():
    p = subprocess.run([sys.executable, BENCH, "--peers", "1000", "--tf-workers", "256",
                        "--kv-peers", "250", "--store-peers", "0", "--timeout", "6", "--late", "2",
                        "--procs", "4", "--json"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    lines = [line for line in p.stdout.splitlines() if line.startswith(MARK)]
    assert p.returncode == 0 and lines, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(lines[0][len(MARK):]), p.stdout


@pytest.mark.parametrize("scenario", ["star meet", "star late", "star missing", "tf meet",
                                      "tf missing", "torch protocol meet", "torch protocol missing"])
def test_every_goal_is_met(report, scenario):
    figures, text = report
    got = figures[scenario]
    assert got["errors"] == [] and got["goals"] and all(got["goals"].values()), (got, text)
    assert got["soft"] == 1024, got  # the star's process 0 could not raise it: hard limit 1024 too


def test_missing_peers_are_named_with_one_read_of_the_verdict(report):
    """Every peer that came read process 0's one answer: all of them raise naming the missing
    one, none of them more than the bound of requests (counted)."""
    figures, text = report
    for name in ("star missing", "tf missing", "torch protocol missing"):
        got = figures[name]
        assert got["peers_ok"] == 0 and got["peers"] == got["size"] - 2, (name, got)
        assert got["host_ok"] is False and "never came" in got["host_error"], (name, got)
