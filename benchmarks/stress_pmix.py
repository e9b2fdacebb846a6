"""MPI_Init after the PMIx query, many small jobs: how often a job fails, with the query's
connection held by `distenv.discovery.pmix_relay` (the default) and without it (DISTENV_PMIX_RELAY=0).

    .venv/bin/python benchmarks/stress_pmix.py [--jobs 200] [--np 4] [--parallel 2]
                                               [--launcher openmpi5|openmpi4]

Each job is bench_pmix.py's: every rank of `mpirun -np N` (one machine) runs
`distenv.discover(method="pmix")`, then `MPI_Init`, an all-reduce checked against N(N+1)/2, and
`MPI_Finalize`; a job fails when it exits non-zero, hangs past --limit seconds, or a rank's
figures are wrong. Jobs alternate between the two arms and run --parallel at a time, so both
arms see the same load (the race the relay removes needs the launcher's daemon thread to be
descheduled at the wrong moment: load makes it likelier). Prints each arm's failures.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench_pmix import LAUNCHERS, one_run  # this folder: the same job

ARMS = {"relay": {}, "no relay": {"DISTENV_PMIX_RELAY": "0"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="jobs per arm")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=2, help="jobs running at once")
    ap.add_argument("--limit", type=int, default=60, help="seconds before a job counts as hung")
    ap.add_argument("--launcher", choices=sorted(LAUNCHERS), default="openmpi5")
    ap.add_argument("--arms", default=",".join(ARMS), help="which arms, comma-separated")
    a = ap.parse_args()
    arms = [name for name in a.arms.split(",") if name]
    order = [arm for _ in range(a.jobs) for arm in arms]
    failed = {arm: [] for arm in arms}
    start = time.monotonic()

    def job(i: int) -> None:
        arm = order[i]
        r = one_run(a.launcher, a.np, ARMS[arm], a.limit)
        if isinstance(r, str):
            failed[arm].append(i)
            print(f"job {i + 1} ({arm}) FAILED: {r[:600]}", flush=True)

    with ThreadPoolExecutor(a.parallel) as pool:
        list(pool.map(job, range(len(order))))
    took = time.monotonic() - start
    for arm in arms:
        print(f"{a.launcher}, {a.np} ranks, {a.parallel} jobs at a time on {os.cpu_count()} "
              f"cores: {arm}: {len(failed[arm])} of {a.jobs} jobs failed", flush=True)
    print(f"{len(order)} jobs in {took:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
