"""SLURM's other plugins (issue 28): discovery against a bare MPI_Init, in one invocation.

    .venv/bin/python benchmarks/bench_slurm_services.py [--np 64] [--runs 3]

Needs the two-node SLURM (integrations/cluster/slurm-up.sh; root) and Debian's MPICH 4.

- ``srun --mpi=pmi2 -N2 -n N -O``: every task runs `distenv.discover()` (the PMI-1 exchange
  with slurmstepd, its PMI_FD then relayed by the holder), then MPICH's own ``MPI_Init``
  (ctypes, no mpi4py) in the same process, through the relay.
- ``srun --mpi=cray_shasta -N2 -n N -O``: every task runs `distenv.discover()` (the apinfo
  file: a read, no communication); the parse alone is timed too.

Ranks start at different times on a loaded machine and both steps wait for the last rank, so
a step's cost is measured from the moment the *last* rank entered it to the moment the last
rank left it (CLOCK_MONOTONIC is one clock for every process of a machine; the two namespace
nodes share it): what the job waits. The apinfo read waits for nobody, so its slowest rank's
own time is shown too (on 2 cores it is mostly the other ranks' interpreters starting). Goal:
each at most 0.2x the bare MPI_Init (of the pmi2 run, the MPI_Init such a job pays anyway).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "BENCH-SLURM "
#: Where rank 0 copies the job's apinfo file (a directory both namespace nodes see).
COPY = f"/tmp/distenv-bench-apinfo-{os.getpid()}"
LIBMPICH = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"

RANK = r'''
import ctypes, json, os, sys, time
sys.modules["mpi4py"] = None
import distenv
mode = sys.argv[2]
held = []
if mode == "pmi2":  # how much of the discovery handing the connection to the holder takes
    import distenv.discovery.pmi as _p
    _hold = _p._hold
    def _timed(*args):
        h0 = time.monotonic()
        _hold(*args)
        held.append(time.monotonic() - h0)
    _p._hold = _timed
t0 = time.monotonic()
env = distenv.discover()
t1 = time.monotonic()
rec = {"rank": env.rank, "discover": [t0, t1], "master": env.master_addr, "node": env.node_rank,
       "hold": sum(held)}
if mode == "pmi2":
    m = ctypes.CDLL(sys.argv[3], mode=ctypes.RTLD_GLOBAL)
    rc = m.MPI_Init(None, None)
    t2 = time.monotonic()
    rec["mpi"] = [t1, t2]
    total = ctypes.c_int()
    m.MPI_Allreduce(ctypes.byref(ctypes.c_int(env.rank + 1)), ctypes.byref(total), 1,
                    0x4C000405, 0x58000003, 0x44000000)
    rec["sum"] = total.value
    m.MPI_Finalize()
elif env.rank == 0:  # a copy of the file, for the parse alone to be timed by the benchmark
    import shutil
    shutil.copyfile(os.environ["PALS_APINFO"], sys.argv[4])
sys.stdout.write(sys.argv[1] + json.dumps(rec) + "\n")
sys.stdout.flush()
'''


def marked(text: str) -> list:
    records, i, dec = [], 0, json.JSONDecoder()
    while True:
        i = text.find(MARK, i)
        if i < 0:
            return records
        obj, i = dec.raw_decode(text, i + len(MARK))
        records.append(obj)


def cost(records, key) -> float:
    return max(r[key][1] for r in records) - max(r[key][0] for r in records)


def one_run(mpi: str, n: int) -> list:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PALS_", "PMIX_", "OMPI_")) and k not in ("MASTER_ADDR", "RANK")}
    env.setdefault("SLURM_CONF", "/tmp/distenv-run/cluster/slurm/slurm.conf")
    env["PYTHONPATH"] = str(REPO / "src")
    cmd = ["timeout", "-k", "5", "600", "srun", f"--mpi={mpi}", "-N2", f"-n{n}", "-O",
           sys.executable, "-c", RANK, MARK, mpi, LIBMPICH, COPY]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660, cwd="/tmp")
    records = marked(p.stdout)
    if p.returncode != 0 or len(records) != n:
        raise SystemExit(f"{mpi}: run failed (exit {p.returncode}, {len(records)} of {n} ranks):\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    masters = {r["master"] for r in records}
    assert len(masters) == 1 and None not in masters, masters
    if mpi == "pmi2":
        assert {r["sum"] for r in records} == {n * (n + 1) // 2}
    return records


def parse_time(path: str) -> float:
    """Seconds one parse of the job's apinfo file takes here (the best of 20; no other rank
    competes for the CPU in this process)."""
    import time

    sys.path.insert(0, str(REPO / "src"))
    from distenv.discovery import apinfo

    with open(path, "rb") as f:
        data = f.read()
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        apinfo.parse(data)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    pmi2, mpi, apinfo, parse = [], [], [], []
    for n in range(a.runs):
        load0 = os.getloadavg()[0]
        recs = one_run("pmi2", a.np)
        pmi2.append(cost(recs, "discover"))
        mpi.append(cost(recs, "mpi"))
        recs = one_run("cray_shasta", a.np)
        # the same measure as MPI_Init's: from the last rank's entry to the last rank's exit
        # (what the job waits); the slowest rank's own time is shown beside it
        apinfo.append(cost(recs, "discover"))
        own = max(r["discover"][1] - r["discover"][0] for r in recs)
        parse.append(parse_time(COPY))
        print(f"run {n + 1}: pmi2 discovery {pmi2[-1] * 1e3:7.1f} ms   bare MPI_Init "
              f"{mpi[-1] * 1e3:7.1f} ms   apinfo discovery {apinfo[-1] * 1e3:6.1f} ms (slowest rank's own "
              f"{own * 1e3:.1f} ms; parse "
              f"{parse[-1] * 1e6:.0f} us)   (load average {load0:.1f} -> {os.getloadavg()[0]:.1f})",
              flush=True)
    m_pmi2, m_mpi, m_apinfo = (statistics.median(x) for x in (pmi2, mpi, apinfo))
    print(f"{a.np} tasks on 2 nodes ({os.cpu_count()} cores), median of {a.runs}: MPI_Init "
          f"{m_mpi * 1e3:.1f} ms; pmi2 discovery {m_pmi2 * 1e3:.1f} ms = {m_pmi2 / m_mpi:.2f}x "
          f"(goal <= 0.2x: {'met' if m_pmi2 / m_mpi <= 0.2 else 'not met'}); apinfo discovery "
          f"{m_apinfo * 1e3:.1f} ms = {m_apinfo / m_mpi:.2f}x (goal <= 0.2x: "
          f"{'met' if m_apinfo / m_mpi <= 0.2 else 'not met'}); apinfo parse "
          f"{statistics.median(parse) * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
