"""The key-value exchange (distenv.discovery.pmi) against a bare MPI_Init, in the same mpiexec run.

    .venv/bin/python benchmarks/bench_pmi.py [--np 64[,128,...]] [--runs 3]
                                             [--launcher mpich4|mpich5|intelmpi] [--pmi-port]
                                             [--compare OTHER/src]

Every rank of one `mpiexec -np N` (one machine, oversubscribed) runs the exchange
(`distenv.discovery.pmi.exchange`), then mpi4py's `MPI_Init` (mpi4py imported beforehand with
rc.initialize=False, so only the call is timed). Ranks start seconds apart on a loaded
machine, and both steps wait for the last rank, so each step's cost is measured from the
moment the *last* rank entered it to the moment the last rank left it (CLOCK_MONOTONIC is
one clock for every process of a machine). Prints, per run and as the median over runs,
the exchange's cost, MPI_Init's, and the difference; the goal (issue 17) is an exchange
within 50 ms of MPI_Init's own start. Issue 20's goals: at the largest --np the exchange
costs <= 0.2x MPI_Init, and from one --np to twice as many it grows <= 2.2x.

--compare DIR runs every round a second time with DIR (another checkout's src, e.g. a
`git worktree` of the commit before a change) first on PYTHONPATH, alternating which arm
goes first, so both see the same load. The load average is printed with every run.
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
from distenv.discovery import pmi
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


def marked(text: str, mark: str) -> list:
    """The JSON records printed after `mark` in `text` (the ranks' lines may be glued)."""
    records, i, dec = [], 0, json.JSONDecoder()
    while True:
        i = text.find(mark, i)
        if i < 0:
            return records
        obj, i = dec.raw_decode(text, i + len(mark))
        records.append(obj)


def cost(records, key) -> float:
    """Last entry to last exit, in seconds."""
    return max(r[key][1] for r in records) - max(r[key][0] for r in records)


#: Container starters a rank can run behind (--starter): bubblewrap as Apptainer's shape (the
#: starter stays the rank's parent) and with a pid namespace of the container's own.
STARTERS = {"bwrap": ["bwrap", "--dev-bind", "/", "/"],
            "bwrap-pid": ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc"]}


def one_run(argv, env, np_, pmi_port, src=None, starter=()) -> dict:
    if src is not None:
        env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, (str(src), env.get("PYTHONPATH"))))}
    cmd = ["timeout", "-k", "5", "600", *argv, "-np", str(np_), *(["-pmi-port"] if pmi_port else []),
           *starter, sys.executable, "-c", RANK, MARK]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
    records = marked(p.stdout, MARK)
    if p.returncode != 0 or len(records) != np_:
        raise SystemExit(f"run failed (exit {p.returncode}, {len(records)} of {np_} ranks):\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    spread = max(r["ex"][0] for r in records) - min(r["ex"][0] for r in records)
    return {"exchange": cost(records, "ex"), "mpi_init": cost(records, "mpi"), "start_spread": spread,
            "load": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", default="64", help="rank counts, comma-separated (e.g. 128,256)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--launcher", choices=("mpich4", "mpich5", "intelmpi"), default="mpich4")
    ap.add_argument("--pmi-port", action="store_true", help="Hydra's -pmi-port mode (MPICH only)")
    ap.add_argument("--compare", type=Path, help="another checkout's src/ to measure alongside")
    ap.add_argument("--starter", choices=sorted(STARTERS),
                    help="also every rank behind this container starter, in the same rounds")
    a = ap.parse_args()
    sizes = [int(n) for n in a.np.split(",")]
    arms = {"this": None, **({"compare": a.compare.resolve()} if a.compare else {}),
            **({a.starter: None} if a.starter else {})}
    mode = "-pmi-port" if a.pmi_port else "PMI_FD"
    medians: "dict[str, dict[int, tuple[float, float]]]" = {arm: {} for arm in arms}
    width = max(len(arm) for arm in arms)
    with tempfile.TemporaryDirectory() as tmp:
        argv, env = launcher(a.launcher, Path(tmp))
        for np_ in sizes:
            results: "dict[str, list[dict]]" = {arm: [] for arm in arms}
            for n in range(a.runs):
                order = list(arms) if n % 2 == 0 else list(reversed(arms))
                for arm in order:
                    load0 = os.getloadavg()[0]
                    r = one_run(argv, env, np_, a.pmi_port, arms[arm], STARTERS.get(arm, ()))
                    results[arm].append(r)
                    print(f"{np_} ranks, {arm:{width}s} run {n + 1}: exchange {r['exchange'] * 1e3:7.1f} ms"
                          f"   MPI_Init {r['mpi_init'] * 1e3:7.1f} ms   ratio "
                          f"{r['exchange'] / r['mpi_init']:.2f}   (ranks started over "
                          f"{r['start_spread']:.1f} s; load average {load0:.1f} -> {r['load']:.1f})",
                          flush=True)
            for arm in arms:
                ex = statistics.median(r["exchange"] for r in results[arm])
                mpi = statistics.median(r["mpi_init"] for r in results[arm])
                medians[arm][np_] = (ex, mpi)
                print(f"{a.launcher} {mode}, {np_} ranks on {os.cpu_count()} cores, {arm}, median of "
                      f"{a.runs}: exchange {ex * 1e3:.1f} ms, bare MPI_Init {mpi * 1e3:.1f} ms, "
                      f"difference {(ex - mpi) * 1e3:+.1f} ms, ratio {ex / mpi:.2f} "
                      "(goals: within 50 ms; <= 0.2x at the largest size)", flush=True)
    for arm in arms:
        got = medians[arm]
        ex, mpi = got[sizes[-1]]
        verdict = "met" if ex / mpi <= 0.2 else "not met"
        print(f"{arm}: at {sizes[-1]} ranks the exchange costs {ex / mpi:.2f}x MPI_Init "
              f"(goal <= 0.2x: {verdict})")
        for small in sizes:
            if 2 * small in got:
                growth = got[2 * small][0] / got[small][0]
                print(f"{arm}: {small} -> {2 * small} ranks, the exchange grows {growth:.2f}x "
                      f"(goal <= 2.2x: {'met' if growth <= 2.2 else 'not met'}); MPI_Init "
                      f"{got[2 * small][1] / got[small][1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
