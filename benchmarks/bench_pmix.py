"""The PMIx placement query (distenv.discovery.pmix, through distenv.discover) against a bare MPI_Init,
in the same mpirun run.

    .venv/bin/python benchmarks/bench_pmix.py [--np 64[,128,...]] [--runs 3]
                                              [--launcher openmpi4|openmpi5]

Every rank of one `mpirun -np N` (one machine, oversubscribed) runs
`distenv.discover(method="pmix")` (every rank's host from the launcher's PMIx server), then
`MPI_Init` through the launcher's own libmpi (ctypes: no mpi4py, the library loaded
beforehand so only the call is timed), an all-reduce that checks the job (and that the
query's rank is MPI's), and `MPI_Finalize`. In the same rounds, alternating, the same job
without the query ("bare"): its `MPI_Init` is what the query is compared with. As in bench_pmi.py each step's cost runs from the moment the *last* rank
entered it to the moment the last rank left it (CLOCK_MONOTONIC is one clock for every
process of a machine). Issue 20's goal: at 64 ranks the query within MPI_Init + 50 ms.

Imports (``import distenv``) happen before the clock starts, and so does the collection debt
the interpreter's start leaves (``gc.collect()`` in both arms; ``--unsettled`` leaves it):
Python's start leaves some 5 000 objects in the collector's middle generation with its counter
past the threshold (``gc.get_count()`` after ``import ctypes, distenv``: (109, 11, 0)), so the
first ~700 allocations of any program pay a collection of all of them -- measured in a rank
under Open MPI 4: one generation-1 collection, 0.5 ms, nothing collected, inside the query
because the query is the bench's first Python code after the imports. A training script pays
it long before (importing torch allocates millions); `bare` never allocates, so without this
the query alone carried the start's debt (about a tenth of its CPU time).

Open MPI 5: the query runs in a child process (a fork of the rank, which is one thread here)
whose connection the rank relays (`distenv.discovery.pmix_relay`, docs/discovery.md);
`stress_pmix.py` counts how often MPI_Init after it fails, with and without the relay. Open MPI
4: in the rank itself.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_pmi import STARTERS, cost, marked  # this folder: the same measure and parsing

REPO = Path(__file__).resolve().parents[1]
L = Path(os.environ.get("DISTENV_LAUNCHERS_DIR", "/opt/distenv-launchers"))
MARK = "BENCH-PMIX "
LAUNCHERS = {
    "openmpi4": (["/usr/bin/mpirun.openmpi"], "/usr/lib/x86_64-linux-gnu/libmpi.so.40"),
    "openmpi5": ([str(L / "openmpi5" / "bin" / "mpirun")], str(L / "openmpi5" / "lib" / "libmpi.so.40")),
}

RANK = r'''
import ctypes, gc, json, sys, time
m = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
query = sys.argv[3] == "query"
if query:
    import distenv
if sys.argv[4] == "settled":
    gc.collect()  # the interpreter start's collection debt, paid before the clock (module doc)
t0 = time.monotonic()
env = distenv.discover(method="pmix") if query else None
t1 = time.monotonic()
rc = m.MPI_Init(None, None)
t2 = time.monotonic()
sym = lambda name: ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(m, name)))
world = sym("ompi_mpi_comm_world")
rank, size = ctypes.c_int(), ctypes.c_int()
m.MPI_Comm_rank(world, ctypes.byref(rank))
m.MPI_Comm_size(world, ctypes.byref(size))
mine, total = ctypes.c_int(rank.value + 1), ctypes.c_int()
m.MPI_Allreduce(ctypes.byref(mine), ctypes.byref(total), 1, sym("ompi_mpi_int"), sym("ompi_mpi_op_sum"), world)
m.MPI_Finalize()
sys.stdout.write("%s%s\n" % (sys.argv[1], json.dumps({
    "rank": env.rank if env else rank.value, "size": env.world_size if env else size.value,
    "mpi_rank": rank.value, "hosts": len(env.rank_hosts or ()) if env else size.value,
    "sum": total.value, "init_rc": rc, "query": [t0, t1], "mpi": [t1, t2]})))
sys.stdout.flush()
'''


def one_run(launcher: str, np_: int, extra: "dict[str, str] | None" = None,
            limit: int = 600, starter: "list[str] | tuple[str, ...]" = (),
            query: bool = True, settled: bool = True) -> "dict | str":
    """The run's figures, or why it failed (`extra`: variables passed to every rank; `limit`:
    seconds before the job counts as hung; not `query`: a bare MPI_Init, nothing before it;
    not `settled`: the interpreter start's collection debt left to whatever allocates first)."""
    argv, libmpi = LAUNCHERS[launcher]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "MPI_LOCAL", "HYDRA_", "I_MPI_", "OMPI_", "PMIX_", "PRTE_"))
           and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO / "src"), env.get("PYTHONPATH"))))
    env.update(extra or {})
    passed = [a for k in ("PYTHONPATH", *(extra or {})) for a in ("-x", k)]
    cmd = ["timeout", "-k", "5", str(limit), *argv, "--allow-run-as-root", "--oversubscribe",
           *passed, "-np", str(np_), *starter, sys.executable, "-c", RANK, MARK, libmpi,
           "query" if query else "bare", "settled" if settled else "unsettled"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit + 60)
    records = marked(p.stdout, MARK)
    want = np_ * (np_ + 1) // 2
    if p.returncode != 0 or len(records) != np_ or any(
            (r["size"], r["hosts"], r["sum"], r["init_rc"], r["rank"]) != (np_, np_, want, 0,
                                                               r["mpi_rank"]) for r in records):
        return (f"exit {p.returncode}, {len(records)} of {np_} ranks reported:\n"
                f"{p.stdout[-1500:]}\n{p.stderr[-2000:]}")
    spread = max(r["query"][0] for r in records) - min(r["query"][0] for r in records)
    return {"query": cost(records, "query"), "mpi_init": cost(records, "mpi"),
            "start_spread": spread, "load": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", default="64", help="rank counts, comma-separated (e.g. 32,64)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--launcher", choices=sorted(LAUNCHERS), default="openmpi4")
    ap.add_argument("--starter", choices=sorted(STARTERS),
                    help="also every rank behind this container starter, in the same rounds")
    ap.add_argument("--unsettled", action="store_true",
                    help="leave the interpreter start's garbage-collection debt to the query "
                         "(the measure before 2026-12-07; module doc)")
    a = ap.parse_args()
    sizes = [int(n) for n in a.np.split(",")]
    # "bare": the same job with no query before MPI_Init -- the goal's denominator. Under Open
    # MPI 4 the query's PMIx_Init is the one MPI_Init then shares (reference-counted), so the
    # MPI_Init measured after it is cheaper than a bare one.
    arms = ["bare", "direct", *([a.starter] if a.starter else [])]
    # Open MPI's shared-memory transport needs TCP when every rank has its own pid namespace
    # (docs/discovery.md#containers): then every arm runs over TCP, for one MPI_Init to compare.
    extra = {"OMPI_MCA_btl": "tcp,self"} if a.starter == "bwrap-pid" else None
    for np_ in sizes:
        results: "dict[str, list[dict]]" = {arm: [] for arm in arms}
        for n in range(a.runs):
            for arm in (arms if n % 2 == 0 else arms[::-1]):
                load0 = os.getloadavg()[0]
                r = one_run(a.launcher, np_, extra, starter=STARTERS.get(arm, ()),
                            query=arm != "bare", settled=not a.unsettled)
                if isinstance(r, str):
                    raise SystemExit(f"{np_} ranks, {arm}, run {n + 1} failed: {r}")
                results[arm].append(r)
                what = "" if arm == "bare" else f"PMIx query {r['query'] * 1e3:7.1f} ms, then "
                print(f"{np_} ranks, {arm}, run {n + 1}: {what}MPI_Init {r['mpi_init'] * 1e3:7.1f} "
                      f"ms   (ranks started over {r['start_spread']:.1f} s; load average "
                      f"{load0:.1f} -> {r['load']:.1f})", flush=True)
        bare = statistics.median(r["mpi_init"] for r in results["bare"])
        for arm in arms[1:]:
            q = statistics.median(r["query"] for r in results[arm])
            after = statistics.median(r["mpi_init"] for r in results[arm])
            print(f"{a.launcher}, {np_} ranks on {os.cpu_count()} cores, {arm}"
                  f"{' (unsettled)' if a.unsettled else ''}, median of "
                  f"{a.runs}: PMIx query {q * 1e3:.1f} ms, bare MPI_Init {bare * 1e3:.1f} ms: "
                  f"ratio {q / bare:.2f} (goal: <= 0.2x; {'met' if q <= 0.2 * bare else 'not met'})"
                  f"; MPI_Init after the query {after * 1e3:.1f} ms (the query's ratio to it "
                  f"{q / after:.2f}); query + MPI_Init - bare MPI_Init {(q + after - bare) * 1e3:+.1f}"
                  " ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
