"""What distenv does at job start, at 10 000 and 50 000 ranks, on one 2-core machine (issue 32).

    .venv/bin/python benchmarks/bench_scale.py [--quick]

Each part runs the real functions against a simulated job and prints its figures, then the
goals it checks; the last line is ``scale: N of M goals met`` (exit status 1 unless all are).

* placement: every rank's node facts from 50 000 host names (`discovery.from_hostnames`), a
  50 000-line node file, the placement map -- each the least CPU time of 3 runs, goal <= 50 ms;
* hand-off: `distenv run` execs a real command after an exchange of 50 000 ranks on fully
  qualified host names (E2BIG before: exit 126);
* PMIx: a fake libpmix (compiled here, in-process mode) serving 10 000 / 50 000 ranks; the
  PMIx_Get calls one rank makes, counted in the library: 2 whatever the size when only rank 0's
  host is needed (torch, Transformers, DeepSpeed, DISTENV_AUTO), 2 + N when every host is on
  8 ranks a node (the size, every rank's host, and `pmix.lpeers`, which here does not list every
  rank: the one-node shortcut is tested in tests/unit/test_pmix.py);
* PMI-1: a fake proxy playing every other rank of 10 000 / 50 000; rank 0's full exchange
  (N - 1 gets, the price of knowing every rank's host), another rank's (one summary), and the
  requests a rank makes when a rank never comes (rank 0: N; any other: 1);
* pre-flights: see `bench_preflight.py` (run from here): torch/JAX's star and TensorFlow's
  workers-report-to-worker-0 with thousands of simulated peers under ``ulimit -n 1024``.

`--quick` asks the services (PMIx, PMI-1) at 10 000 ranks only; CI's fast test uses it.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
sys.path.insert(0, str(SRC))

PER_NODE = 8
LIMIT = 0.050
goals: "list[tuple[str, bool]]" = []


def goal(name: str, met: bool) -> None:
    goals.append((name, met))
    print(f"  goal: {name}: {'met' if met else 'NOT MET'}")


def hosts_of(ranks: int, cyclic: bool = False) -> "list[str]":
    nodes = ranks // PER_NODE
    names = [f"nid{n:06d}.cluster.example.org" for n in range(nodes)]
    return [names[r % nodes] if cyclic else names[r // PER_NODE] for r in range(ranks)]


def best(fn, runs: int = 3) -> float:
    """The least CPU time of this process over `runs` calls. CPU time, not wall time: the
    goal is the computation's own cost (a quadratic step costs seconds), and wall time on a
    2-core machine also counts whatever else runs (measured: 38.9 ms alone, 55 ms at load 12)."""
    out = float("inf")
    for _ in range(runs):
        gc.collect()
        gc.disable()  # a collection of the caller's garbage (a long test process) is not its cost
        try:
            t0 = time.process_time()
            fn()
            out = min(out, time.process_time() - t0)
        finally:
            gc.enable()
    return out


def mpich(rank: int, ranks: int) -> "dict[str, str]":
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(ranks), "MPI_LOCALRANKID": "0",
            "MPI_LOCALNRANKS": str(PER_NODE)}


# -- placement -----------------------------------------------------------------------------------
def placement(ranks: int) -> None:
    from distenv import resolve
    from distenv.discovery.apply import from_hostnames
    from distenv.nodemap import build
    from distenv.core.placement import parse_hostfile

    print(f"placement, {ranks} ranks on {ranks // PER_NODE} fully qualified hosts")
    for layout in ("block", "cyclic"):
        names = hosts_of(ranks, cyclic=layout == "cyclic")
        env = resolve(mpich(ranks - 1, ranks))
        took = best(lambda: from_hostnames(env, names, "bench"))
        print(f"  from_hostnames ({layout}): {took * 1e3:.1f} ms (ratio to the 50 ms goal "
              f"{took / LIMIT:.2f})")
        goal(f"from_hostnames {layout} <= 50 ms", took <= LIMIT)
        placed = from_hostnames(resolve(mpich(0, ranks)), names, "bench")
        took = best(lambda: build(placed))
        print(f"  placement map ({layout}): {took * 1e3:.1f} ms (ratio {took / LIMIT:.2f})")
        goal(f"placement map {layout} <= 50 ms", took <= LIMIT)
    text = "\n".join(hosts_of(ranks)) + "\n"
    took = best(lambda: parse_hostfile(text))
    print(f"  node file of {ranks} lines: {took * 1e3:.1f} ms (ratio {took / LIMIT:.2f})")
    goal("node file <= 50 ms", took <= LIMIT)


# -- the hand-off of distenv run -------------------------------------------------------------------
HANDOFF_RANK = textwrap.dedent("""
    import os, sys
    from distenv import run
    from distenv.discovery import pmi
    ranks = int(sys.argv[2])
    nodes = ranks // 8
    hosts = [f"nid{r % nodes:06d}.cluster.example.org" for r in range(ranks)]
    pmi._done = (os.getpid(), pmi.Exchange(1, ranks, hosts, "fd", 0.0, "t", "kvs_1_0_x"))
    pmi.offer = lambda environ=None: (pmi.Offer("fd", "bench"), "")
    sys.exit(run.main(["--", sys.executable, "-c", sys.argv[1]]))
""")
HANDOFF_COMMAND = textwrap.dedent("""
    import json, os
    from distenv.discovery import pmi
    from distenv.discovery import complete
    env = complete(need=("master_addr", "node_rank"))
    print(json.dumps({"ranks": pmi.inherited().size, "nodes": env.num_nodes,
                      "var": len(os.environ[pmi.HELD_VAR]),
                      "longest": max(len(v) for v in os.environ.values())}))
""")


def handoff(ranks: int) -> None:
    print(f"hand-off: distenv run execs a command after an exchange of {ranks} ranks")
    full = len(",".join(hosts_of(ranks, cyclic=True)))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(SRC),
           **mpich(1, ranks), "DISTENV_AUTO": "0"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", HANDOFF_RANK, HANDOFF_COMMAND, str(ranks)], env=env,
                       capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t0
    ok = p.returncode == 0
    got = json.loads(p.stdout.strip().splitlines()[-1]) if ok else {}
    print(f"  exit {p.returncode} in {took:.2f} s; the host list ({full / 1024:.0f} KiB as one "
          f"variable, over Linux's 128 KiB) became a {got.get('var', '?')}-byte variable; "
          f"longest variable {got.get('longest', '?')} bytes")
    if not ok:
        print("  " + p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "  (no error output)")
    goal(f"hand-off of {ranks} fully qualified ranks execs (no E2BIG)",
         ok and got.get("ranks") == ranks and got.get("longest", 1 << 20) < 128 * 1024)


# -- PMIx ---------------------------------------------------------------------------------------
FAKE_PMIX = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct { char nspace[256]; uint32_t rank; } proc_t;
typedef struct { uint16_t type; union { char *s; uint32_t u32; uint64_t pad[3]; } d; } value_t;
static int count = 0;
static long gets = 0;
long fake_gets(void) { return gets; }
void fake_reset(void) { gets = 0; }
const char *PMIx_Get_version(void) { return "FakePMIx scale"; }
int PMIx_Initialized(void) { return count > 0; }
int PMIx_Init(proc_t *me, void *info, size_t n) {
    strncpy(me->nspace, getenv("PMIX_NAMESPACE"), 255);
    me->rank = (uint32_t)atoi(getenv("FAKE_RANK"));
    count++; return 0;
}
int PMIx_Finalize(void *info, size_t n) { count--; return 0; }
void PMIx_Value_free(value_t *v, size_t n) { if (v->type == 3) free(v->d.s); free(v); }
int PMIx_Get(const proc_t *p, const char *key, void *info, size_t n, value_t **out) {
    gets++;
    uint32_t size = (uint32_t)atoi(getenv("FAKE_SIZE")), nodes = size / 8;
    value_t *v = calloc(1, sizeof *v);
    if (!strcmp(key, "pmix.job.size") && p->rank == 0xfffffffe) {
        v->type = 14; v->d.pad[0] = ((uint64_t)9 << 32) | size;
    } else if (!strcmp(key, "pmix.hname") && p->rank < size) {
        char host[64];
        snprintf(host, sizeof host, "nid%06u.cluster.example.org", p->rank / 8 % nodes);
        v->type = 3; v->d.s = strdup(host);
    } else { free(v); return -46; }
    *out = v; return 0;
}
"""


def fake_pmix(work: Path) -> "str | None":
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    (work / "fake.c").write_text(FAKE_PMIX)
    lib = work / "libpmix.so.2"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(work / "fake.c")],
                   check=True, timeout=120)
    return str(lib)


PMIX_RANK = textwrap.dedent("""
    import ctypes, json, os, sys, time
    from distenv.discovery import pmix
    lib, full = sys.argv[1], sys.argv[2] == "full"
    found = pmix.Offer("fake@1", 1, "orte", "orted", [lib], [], "PMIx server orted")
    t0 = time.perf_counter()
    got = pmix.query(timeout=300, found=found, full=full)
    took = time.perf_counter() - t0
    gets = ctypes.CDLL(lib).fake_gets()
    print(json.dumps({"gets": gets, "seconds": took, "size": got.size, "hosts": len(got.hosts)}))
""")


def pmix_part(sizes: "list[int]", work: Path) -> None:
    print("PMIx: the PMIx_Get calls of one rank, counted in a fake libpmix (in-process mode)")
    lib = fake_pmix(work)
    if lib is None:
        print("  no C compiler (cc): skipped")
        goal("PMIx asks O(1) per rank for the master (no C compiler to build the fake)", False)
        return
    for size in sizes:
        row = {}
        for mode in ("master", "full"):
            env = {**os.environ, "PYTHONPATH": str(SRC), "PMIX_NAMESPACE": "fake@1",
                   "FAKE_RANK": "1", "FAKE_SIZE": str(size), "DISTENV_AUTO": "0"}
            p = subprocess.run([sys.executable, "-c", PMIX_RANK, lib, mode], env=env,
                               capture_output=True, text=True, timeout=300)
            row[mode] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-300:]}
        m, f = row["master"], row["full"]
        print(f"  {size} ranks: rank 0's host only {m.get('gets')} gets "
              f"({m.get('seconds', 0) * 1e3:.1f} ms); every host {f.get('gets')} gets "
              f"({f.get('seconds', 0) * 1e3:.0f} ms); all ranks together: {2 * size} vs "
              f"{f.get('gets', 0) * size} reads of the server's data")
        goal(f"PMIx at {size} ranks: 2 gets per rank for the master, 2 + N for every host",
             m.get("gets") == 2 and f.get("gets") == 2 + size and f.get("hosts") == size)


# -- PMI-1 --------------------------------------------------------------------------------------
class Proxy(threading.Thread):
    """The PMI-1 wire of Hydra's proxy (MPICH 4's dialect) for one client, playing every other
    rank of a `size`-rank job: their hosts are there after the first barrier; as rank 0 it
    publishes the summary before the second. `missing`: rank that never comes (the barrier
    never ends)."""

    def __init__(self, sock: socket.socket, rank: int, size: int, missing: "int | None" = None):
        super().__init__(daemon=True)
        self.sock, self.rank, self.size, self.missing = sock, rank, size, missing
        self.kvs: "dict[str, str]" = {}
        self.gets = 0
        self.barriers = 0

    def run(self) -> None:
        try:
            self.serve()
        except OSError:  # the rank closed its end (after a timeout)
            pass

    def serve(self) -> None:
        from distenv.discovery import pmi

        f = self.sock.makefile("rwb", buffering=1 << 16)
        nodes = self.size // PER_NODE
        for raw in f:
            fields = dict(p.partition("=")[::2] for p in raw.decode().split())
            cmd, out = fields.get("cmd"), None
            if cmd == "init":
                out = "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
            elif cmd == "get_maxes":
                out = "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024"
            elif cmd == "get_my_kvsname":
                out = "cmd=my_kvsname kvsname=kvs_42_0_7_node1"
            elif cmd == "put":
                self.kvs[fields["key"]] = fields["value"]
                out = "cmd=put_result rc=0"
            elif cmd == "barrier_in":
                self.barriers += 1
                if self.barriers == 1:  # the others' hosts (but a missing rank's) are there
                    prefix = next(k for k in self.kvs if k.startswith(pmi.KEY)).rsplit("-", 1)[0]
                    for r in range(self.size):
                        if r != self.missing:
                            self.kvs.setdefault(f"{prefix}-{r}", f"nid{r // PER_NODE % nodes:06d}.x")
                if self.missing is not None:
                    continue  # the barrier never ends
                elif self.rank != 0:
                    gen = prefix.rsplit("-", 1)[1]
                    hosts = [self.kvs[f"{prefix}-{r}"] for r in range(self.size)]
                    for i, part in enumerate(pmi.split(pmi.encode(hosts, 23456), 1023)):
                        self.kvs[f"{pmi.SUMMARY}-{gen}-{i}"] = part
                out = "cmd=barrier_out"
            elif cmd == "get":
                self.gets += 1
                v = self.kvs.get(fields["key"])
                out = (f"cmd=get_result rc=0 msg=success value={v}" if v is not None else
                       f"cmd=get_result rc=-1 msg=key_{fields['key']}_not_found")
            elif cmd == "finalize":
                out = "cmd=finalize_ack"
            if out is not None:
                f.write(out.encode() + b"\n")
                f.flush()


def exchange_once(rank: int, size: int, missing: "int | None" = None, timeout: float = 300
                  ) -> "tuple[float, int, str]":
    from distenv.discovery import pmi

    pmi._done = None
    pmi._hold = lambda sock, *_: sock.close()  # no holder: the bench keeps nothing
    ours, theirs = socket.socketpair()
    proxy = Proxy(theirs, rank, size, missing)
    proxy.start()
    found = pmi.Offer("fd", "bench", fd=ours.fileno(), rank=rank, size=size)
    t0 = time.perf_counter()
    error = ""
    try:
        pmi.exchange({}, timeout=timeout, found=found)
    except pmi.PMIError as exc:
        error = str(exc)
    took = time.perf_counter() - t0
    ours.close()
    return took, proxy.gets, error


def pmi_part(sizes: "list[int]") -> None:
    print("PMI-1: one rank's exchange against a fake proxy playing every other rank")
    for size in sizes:
        t0, g0, e0 = exchange_once(0, size)
        t1, g1, e1 = exchange_once(1, size)
        print(f"  {size} ranks: rank 0 {t0:.2f} s ({g0} gets: every rank's host, serially), "
              f"rank 1 {t1 * 1e3:.0f} ms ({g1} gets: rank 0's summary)")
        goal(f"PMI-1 at {size} ranks completes (rank 0 reads N - 1 hosts, the others the summary)",
             not e0 and not e1 and g0 == size - 1)
    size = sizes[0]
    # Rank 0 keeps 0.5 ms a key, at most a quarter of its timeout, to read every key: 20 s
    # leave it the whole 5 s for 10 000 keys; they cost 0.2 ms each on this machine under a
    # full test run's load (it read 4870 in the 1 s a 4 s timeout left it). Rank 1 reads one.
    t0, g0, e0 = exchange_once(0, size, missing=size - 1, timeout=20)
    t1, g1, e1 = exchange_once(1, size, missing=size - 1, timeout=4)
    print(f"  a rank that never comes ({size} ranks): rank 0 asks {g0} times and names it "
          f"(20 s timeout, ended in {t0:.1f} s); rank 1 asks {g1} time(s) and points at rank 0 "
          f"(4 s timeout, ended in {t1:.1f} s)")
    goal("PMI-1's missing rank: rank 0 names it, other ranks ask O(1)",
         f"rank {size - 1} never reached it" in e0 and g1 == 1 and "rank 0 came" in e1)


# -- pre-flights ----------------------------------------------------------------------------------
def preflight_part(quick: bool) -> None:
    bench = REPO / "benchmarks" / "bench_preflight.py"
    sizes = ["--peers", "1000", "--tf-workers", "256", "--kv-peers", "1000"] if quick else []
    print(f"pre-flights: benchmarks/bench_preflight.py {' '.join(sizes)} (its own 1024-descriptor "
          "limits)")
    p = subprocess.run([sys.executable, str(bench), *sizes], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "PYTHONPATH": str(SRC)})
    seen = False
    for line in p.stdout.splitlines():
        text = line.strip()
        for prefix, ok in (("met: ", True), ("NOT MET: ", False)):
            if text.startswith(prefix):
                goal(text[len(prefix):], ok)
                seen = True
                break
        else:
            print("  " + line)
    if not seen:
        print("  " + ((p.stderr.strip().splitlines() or ["no output"])[-1]))
        goal("pre-flights at scale (bench_preflight.py reported nothing)", False)


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the services at 10 000 ranks only (placement and hand-off stay at 50 000)")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["placement", "handoff", "pmix", "pmi", "preflight"])
    args = ap.parse_args(argv)
    big = 50_000
    sizes = [10_000] if args.quick else [10_000, 50_000]
    load = os.getloadavg()[0]
    print(f"bench_scale: {os.cpu_count()} CPU(s), load {load:.1f}, Python {sys.version.split()[0]}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        parts = {"placement": lambda: placement(big), "handoff": lambda: handoff(big),
                 "pmix": lambda: pmix_part(sizes, Path(tmp)), "pmi": lambda: pmi_part(sizes),
                 "preflight": lambda: preflight_part(args.quick)}
        for name, part in parts.items():
            if name not in args.skip:
                part()
    met = sum(1 for _, ok in goals if ok)
    print(f"({time.monotonic() - t0:.0f} s)")
    print(f"scale: {met} of {len(goals)} goals met")
    return 0 if met == len(goals) else 1


if __name__ == "__main__":
    sys.exit(main())
