"""The key-value exchange (distenv.pmi) against a bare MPI_Init, in the same mpiexec run.

    .venv/bin/python benchmarks/bench_pmi.py [--np 64] [--runs 3] [--launcher mpich4|mpich5|intelmpi]
                                             [--pmi-port]

Every rank of one `mpiexec -np N` (one machine, oversubscribed) runs the exchange
(`distenv.pmi.exchange`), then mpi4py's `MPI_Init` (mpi4py imported beforehand with
rc.initialize=False, so only the call is timed). Ranks start seconds apart on a loaded
machine, and both steps wait for the last rank, so each step's cost is measured from the
moment the *last* rank entered it to the moment the last rank left it (CLOCK_MONOTONIC is
one clock for every process of a machine). Prints, per run and as the median over runs,
the exchange's cost, MPI_Init's, and the difference; the goal (issue 17) is an exchange
within 50 ms of MPI_Init's own start.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
L = Path(os.environ.get("DISTENV_LAUNCHERS_DIR", "/opt/distenv-launchers"))
MARK = "BENCH-PMI "

RANK = r'''
import json, os, sys, time
import mpi4py
mpi4py.rc.initialize = False
mpi4py.rc.finalize = True
from mpi4py import MPI
from distenv import pmi
t0 = time.monotonic()
ex = pmi.exchange(timeout=300)
t1 = time.monotonic()
MPI.Init()
t2 = time.monotonic()
assert MPI.COMM_WORLD.Get_size() == ex.size and MPI.COMM_WORLD.Get_rank() == ex.rank
sys.stdout.write("%s%s\n" % (sys.argv[1], json.dumps({"rank": ex.rank, "ex": [t0, t1],
                 "mpi": [t1, t2], "size": ex.size})))
sys.stdout.flush()
'''


def launcher(name: str, lib_dir: Path) -> "tuple[list[str], dict]":
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "MPI_LOCAL", "HYDRA_", "I_MPI_", "OMPI_", "PMIX_"))
           and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["MPI4PY_MPIABI"] = "mpich"
    if name == "mpich4":
        link = lib_dir / "libmpi.so.12"  # Debian's libmpich.so.12 under mpi4py's expected name
        if not link.exists():
            link.symlink_to("/usr/lib/x86_64-linux-gnu/libmpich.so.12")
        env["LD_LIBRARY_PATH"] = str(lib_dir)
        return ["/usr/bin/mpiexec.mpich"], env
    if name == "mpich5":
        env["LD_LIBRARY_PATH"] = str(L / "mpich5" / "lib")
        return [str(L / "mpich5" / "bin" / "mpiexec")], env
    env["LD_LIBRARY_PATH"] = str(L / "impi" / "lib")
    return [str(L / "impi" / "bin" / "mpiexec.hydra")], env


def cost(records, key) -> float:
    """Last entry to last exit, in seconds."""
    return max(r[key][1] for r in records) - max(r[key][0] for r in records)


def one_run(argv, env, np_, pmi_port) -> dict:
    cmd = ["timeout", "-k", "5", "600", *argv, "-np", str(np_), *(["-pmi-port"] if pmi_port else []),
           sys.executable, "-c", RANK, MARK]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
    records = []
    text = p.stdout
    i = 0
    dec = json.JSONDecoder()
    while True:
        i = text.find(MARK, i)
        if i < 0:
            break
        obj, i = dec.raw_decode(text, i + len(MARK))
        records.append(obj)
    if p.returncode != 0 or len(records) != np_:
        raise SystemExit(f"run failed (exit {p.returncode}, {len(records)} of {np_} ranks):\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    spread = max(r["ex"][0] for r in records) - min(r["ex"][0] for r in records)
    return {"exchange": cost(records, "ex"), "mpi_init": cost(records, "mpi"), "start_spread": spread}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--launcher", choices=("mpich4", "mpich5", "intelmpi"), default="mpich4")
    ap.add_argument("--pmi-port", action="store_true", help="Hydra's -pmi-port mode (MPICH only)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        argv, env = launcher(a.launcher, Path(tmp))
        results = []
        for n in range(a.runs):
            r = one_run(argv, env, a.np, a.pmi_port)
            results.append(r)
            print(f"run {n + 1}: exchange {r['exchange'] * 1e3:7.1f} ms   MPI_Init "
                  f"{r['mpi_init'] * 1e3:7.1f} ms   difference {(r['exchange'] - r['mpi_init']) * 1e3:+7.1f} ms"
                  f"   (ranks started over {r['start_spread']:.1f} s)")
    ex = statistics.median(r["exchange"] for r in results)
    mpi = statistics.median(r["mpi_init"] for r in results)
    mode = "-pmi-port" if a.pmi_port else "PMI_FD"
    print(f"{a.launcher} {mode}, {a.np} ranks on {os.cpu_count()} cores, median of {a.runs}: "
          f"exchange {ex * 1e3:.1f} ms, bare MPI_Init {mpi * 1e3:.1f} ms, difference "
          f"{(ex - mpi) * 1e3:+.1f} ms, ratio {ex / mpi:.2f} (goal: within 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
