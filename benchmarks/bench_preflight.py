"""The pre-flight with thousands of simulated peers under a descriptor limit of 1024 (issue 32).

    .venv/bin/python benchmarks/bench_preflight.py [--peers 4000] [--tf-workers 1024]
                                                   [--store-peers 4000] [--timeout 10]
                                                   [--procs 8] [--only tf] [--json]

Every simulated process runs distenv's own code (`distenv.bringup.preflight.meet` for the star that
torch's neighbours JAX and Horovod use, `distenv.tensorflow.rendezvous` for TensorFlow's
workers, `distenv.bringup.preflight.meet_on` over a real torch TCPStore for torch), as threads spread
over --procs processes; process 0 runs alone in its own process. Each process starts with
RLIMIT_NOFILE at 1024: soft and hard for the star and TensorFlow (nothing can raise it: process
0 must hold no socket per peer), soft only for torch's store (its host holds one connection
per rank, as the process group needs anyway: `distenv.bringup.preflight.descriptors` raises the soft
limit to the machine's hard one). Requests are counted per simulated process: every
connection it opens to process 0 (the star), every store call (torch).

Scenarios, each measured in this one run:

* meet: every process present; process 0 starts with the others. The time process 0's
  meeting took, and until the last process had its answer.
* late: process 0 starts --late seconds after the others, which knock meanwhile (backing off
  with jitter up to `distenv.bringup.preflight.pace`): the time process 0 then needs to meet them all.
* missing: the last process never starts; --timeout seconds. When process 0 names it, when the
  last of the others does (each reads process 0's one answer), and requests per process.

Goals (issue 32, item 1): each meeting within 30 s; a missing peer named within the timeout
(plus 4 s, 1.5 times the pace a peer waits between two requests, and on the star process 0's
DRAIN, the second in which it still reads the hellos at its door) by every peer and by
process 0 (which returns once the peers have its answer), with a
number of requests per peer that does not grow with the number of peers (the star's bound:
2 + log1.5(pace / FIRST_PAUSE) + 2 x (timeout + grace) / pace; torch's store: at most 8).
The last line: `preflight: N of M goals met`. Exit status 0 either way: this reports, the tests
decide (tests/unit/test_preflight_scale.py runs it with 1 000 peers).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

MARK = "BENCH-PREFLIGHT "
GOAL_SECONDS = 30.0
STORE_REQUESTS = 8  # set, add, wait, check, wait, get, add (read), set (the last reader)


# -- the roles (one process each) -----------------------------------------------------------------
def _limit(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _counted() -> "threading.local":
    """Count, per thread, the connections the star's clients open (distenv.bringup.preflight._ask)."""
    from distenv.bringup import preflight

    local = threading.local()
    real = preflight._ask

    def ask(addresses, hello, left):
        local.count = getattr(local, "count", 0) + 1
        return real(addresses, hello, left)

    preflight._ask = ask
    return local


class _CountingStore:
    """A torch store whose calls are counted (one request each)."""

    def __init__(self, store) -> None:
        self.store, self.count = store, 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args, **kwargs):
            self.count += 1
            return method(*args, **kwargs)

        return call


class MemoryStore:
    """torch's Store calls (set, add, get, check, wait, compare_set) on a dict shared by the
    threads of one process: the torch meeting's protocol at thousands of ranks, without the
    transport (see the module doc: torch's own store is measured at a smaller size)."""

    def __init__(self) -> None:
        self.data: "dict[str, bytes]" = {}
        self.lock = threading.Lock()
        self.events: "dict[str, threading.Event]" = {}

    def _event(self, key: str) -> "threading.Event":
        with self.lock:
            return self.events.setdefault(key, threading.Event())

    def _put(self, key: str, value: bytes) -> None:
        self.data[key] = value
        self.events.setdefault(key, threading.Event()).set()

    def set(self, key: str, value) -> None:
        with self.lock:
            self._put(key, value.encode() if isinstance(value, str) else value)

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            value = int(self.data.get(key, b"0")) + amount
            self._put(key, str(value).encode())
            return value

    def get(self, key: str) -> bytes:
        self._event(key).wait()
        return self.data[key]

    def check(self, keys) -> bool:
        with self.lock:
            return all(k in self.data for k in keys)

    def wait(self, keys, timeout) -> None:
        end = time.monotonic() + timeout.total_seconds()
        for k in keys:
            if not self._event(k).wait(max(0.0, end - time.monotonic())):
                raise RuntimeError(f"wait timeout after {timeout}, keys: {keys}")

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.lock:
            current = self.data.get(key)
            if (current is None and expected == "") or current == expected.encode():
                self._put(key, desired.encode())
                return desired.encode()
            return current if current is not None else expected.encode()


_MEMORY = MemoryStore()


def _one(kind: str, size: int, index: int, port: int, timeout: float, local, t0: float,
         tf_base: int = 0) -> dict:
    from distenv.bringup import preflight
    from distenv.errors import DistEnvError

    out: dict = {"index": index}
    start = time.monotonic()
    try:
        if kind == "star":
            preflight.meet(preflight.Meeting(size, index, "127.0.0.1", port, "bench", timeout,
                                             who="distenv.bench", noun="process"))
        elif kind == "tf":
            import distenv.tensorflow as dtf

            # each worker's own port, free here (every worker checks its own before meeting)
            workers = [f"127.0.0.1:{tf_base + i}" for i in range(size)]
            dtf.rendezvous(workers, index, timeout, {}, port=port)
        elif kind == "kv":  # the torch meeting's protocol on an in-process store
            store = _CountingStore(_MEMORY)
            try:
                preflight.meet_on(store, preflight.Meeting(size, index, "127.0.0.1", port, "bench",
                                                           timeout, who="distenv.bench", noun="rank"),
                                  start)
            finally:
                out["requests"] = store.count
        else:  # torch's store
            import datetime

            from torch.distributed import TCPStore

            import distenv.torch

            # as distenv.torch._rendezvous connects: rank 0 hosts, the others knock, then connect
            wait = datetime.timedelta(seconds=timeout + 60)
            store = _CountingStore(distenv.torch._connect(TCPStore, "127.0.0.1", port, size,
                                                          index == 0, wait, start))
            try:
                preflight.meet_on(store, preflight.Meeting(size, index, "127.0.0.1", port, "bench",
                                                           timeout, who="distenv.bench", noun="rank"),
                                  start)
            finally:
                out["requests"] = store.count
                out["seconds"] = time.monotonic() - start
                if index == 0:  # the store lives on (as the process group's would)
                    time.sleep(2.0)
        out["ok"] = True
    except DistEnvError as exc:
        out["ok"], out["error"] = False, str(exc)
    out.setdefault("seconds", time.monotonic() - start)
    out["done"] = start - t0 + out["seconds"]
    if kind in ("star", "tf"):
        out["requests"] = getattr(local, "count", 0)
    return out


def role(args: argparse.Namespace) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    _limit(1024, 1024 if args.kind != "store" else hard)
    ids = [int(i) for i in args.ids.split(",") if i]
    local = _counted()
    if args.kind == "store":
        import torch.distributed  # noqa: F401  (imported before the clock starts)

        import distenv.torch  # noqa: F401
    if args.kind == "tf":
        import distenv.tensorflow  # noqa: F401
    threading.stack_size(256 * 1024)
    results: "list[dict]" = []
    go = threading.Event()
    start: "list[float]" = []

    def run(i: int) -> None:
        go.wait()
        results.append(_one(args.kind, args.size, i, args.port, args.timeout, local, start[0],
                            args.tf_base))

    threads = [threading.Thread(target=run, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    # Every role process is ready (imports done, threads waiting): the orchestrator then
    # writes one start time, the same clock for all (CLOCK_MONOTONIC is machine-wide).
    with open(os.path.join(args.sync, f"ready.{os.getpid()}"), "w"):
        pass
    path = os.path.join(args.sync, "start")
    while not os.path.exists(path):
        time.sleep(0.01)
    time.sleep(0.01)
    with open(path) as f:
        start.append(float(f.read()))
    time.sleep(max(0.0, start[0] + args.delay - time.monotonic()))
    go.set()
    for t in threads:
        t.join()
    sys.stdout.write(MARK + json.dumps({"soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                                        "results": results}) + "\n")


# -- the orchestrator ------------------------------------------------------------------------------
def _free_block(size: int) -> int:
    """The first of `size` consecutive ports, all free here, in distenv's derived range: the
    simulated TensorFlow workers' own ports."""
    from distenv.core.ports import BASE, SPAN, bindable

    base = BASE
    while base + size <= BASE + SPAN:
        busy = next((p for p in range(base, base + size) if not bindable(p)), None)
        if busy is None:
            return base
        base = busy + 1
    raise SystemExit(f"no {size} consecutive free ports in {BASE}-{BASE + SPAN - 1}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scenario(kind: str, size: int, procs: int, timeout: float, late: float = 0.0,
             missing: bool = False) -> dict:
    """Run one scenario; {"host": process 0's result, "peers": [...], "wall": seconds from the
    common start until every role process ended}."""
    import tempfile

    port = _free_port()
    peers = list(range(1, size - 1 if missing else size))
    groups = [g for g in (peers[i::procs] for i in range(procs)) if g]
    if kind == "kv":  # one process: the store is in it
        groups, late = [], 0.0
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "DISTENV_LOG_LEVEL": "error"}
    sync = tempfile.mkdtemp(prefix="bench-preflight-")
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "--kind", kind, "--size", str(size),
           "--port", str(port), "--timeout", str(timeout), "--sync", sync,
           "--tf-base", str(_free_block(size) if kind == "tf" else 0)]
    if kind == "store":
        # torch's store looks up the name of every connection's peer (getnameinfo), the server in
        # its one thread, and this machine's DNS server drops some of those queries (5 s each,
        # 1 client in 25 seen here, more in a burst): a one-second resolver timeout.
        env["RES_OPTIONS"] = "timeout:1 attempts:1"
    host_env = env
    first = "0" if kind != "kv" else ",".join(map(str, [0, *peers]))
    started = [subprocess.Popen([*cmd, "--ids", first, "--delay", str(late)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=host_env)]
    started += [subprocess.Popen([*cmd, "--ids", ",".join(map(str, g)), "--delay", "0"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for g in groups]
    out: dict = {"peers": [], "host": None, "errors": []}
    limit = time.monotonic() + 600
    while sum(1 for f in os.listdir(sync) if f.startswith("ready.")) < len(started):
        if time.monotonic() > limit or any(p.poll() is not None for p in started):
            break
        time.sleep(0.05)
    t0 = time.monotonic() + 0.2
    with open(os.path.join(sync, "start.tmp"), "w") as f:
        f.write(repr(t0))
    os.rename(os.path.join(sync, "start.tmp"), os.path.join(sync, "start"))
    for p in started:
        try:
            stdout, stderr = p.communicate(timeout=max(300.0, 4 * timeout + 120))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            out["errors"].append("a role process hung and was killed")
        lines = [json.loads(line[len(MARK):]) for line in stdout.splitlines() if line.startswith(MARK)]
        if not lines:
            out["errors"].append(f"a role process printed nothing (rc {p.returncode}): {stderr[-800:]}")
            continue
        for r in lines[0]["results"]:
            r["soft"] = lines[0]["soft"]
            if r["index"] == 0:
                out["host"] = r
            else:
                out["peers"].append(r)
    out["wall"] = time.monotonic() - t0
    import shutil

    shutil.rmtree(sync, ignore_errors=True)
    return out


def star_bound(size: int, timeout: float, local: int = 1) -> int:
    """The most requests one star client makes in a wait of `timeout` (module doc), `local` of
    the meeting's processes on its host."""
    from distenv.bringup import preflight

    cap = preflight.pace(size, local)
    grace = 1.5 * cap + 5.0
    return int(2 + math.log(cap / preflight.FIRST_PAUSE, 1.5) + 2 * (timeout + grace) / cap)


def _figures(name: str, kind: str, size: int, r: dict, timeout: float, missing: bool,
             late: float = 0.0) -> "tuple[list[str], list[tuple[str, bool]]]":
    lines, goals = [], []
    host, peers = r["host"] or {}, r["peers"]
    requests = [p.get("requests", 0) for p in peers] or [0]
    bound = STORE_REQUESTS if kind in ("store", "kv") else star_bound(size, timeout, _local(kind, size))
    soft = host.get("soft", "?")
    if r["errors"]:
        lines.append(f"  {name}: {'; '.join(r['errors'])}")
        goals.append((f"{name}: every role process reported", False))
        return lines, goals
    if not missing:
        ok = host.get("ok") and all(p.get("ok") for p in peers) and len(peers) == size - 1
        last = max([host.get("done", 0.0), *[p["done"] for p in peers]])
        took = host.get("seconds", float("nan"))
        lines.append(f"  {name}: {size - 1} peers and process 0 (descriptor limit {soft}): "
                     f"process 0 met them in {took:.2f} s, the last peer had its answer "
                     f"{last - late:.2f} s after {'process 0 started' if late else 'the start'}; "
                     f"requests per peer: max {max(requests)}, mean {sum(requests) / len(requests):.1f}")
        goals.append((f"{name}: met within {GOAL_SECONDS:.0f} s", bool(ok) and took <= GOAL_SECONDS
                       and last - late <= GOAL_SECONDS))
        if late:
            goals.append((f"{name}: requests per peer <= {bound}", max(requests) <= bound))
        return lines, goals
    gone = size - 1
    noun = {"star": "process(es)", "tf": "worker(s)", "store": "rank(s)", "kv": "rank(s)"}[kind]
    named = f"{noun} {gone} of {size} never came"
    host_named = not host.get("ok") and named in host.get("error", "")
    peers_named = [p for p in peers if not p.get("ok") and named in p.get("error", "")]
    host_took = host.get("seconds", float("nan"))
    last = max([p["seconds"] for p in peers] or [0.0])
    # the star: a peer's longest wait between two requests, and process 0's DRAIN (it first
    # reads the hellos already at its door); the store: its own wait
    slack = 2.0 + (1.5 * _pace(size, _local(kind, size)) + _drain() if kind in ("star", "tf") else 0.0)
    lines.append(f"  {name}: {size - 2} peers, process {gone} missing, timeout {timeout:.0f} s: "
                 f"process 0 named it after {host_took:.2f} s, {len(peers_named)} of {len(peers)} "
                 f"peers named it, the last after {last:.2f} s; requests per peer: max "
                 f"{max(requests)}, mean {sum(requests) / len(requests):.1f} (bound {bound})")
    if not host_named:
        lines.append(f"    process 0 said: {host.get('error', host)}"[:600])
    # Process 0 decides at its deadline but returns only once every peer that came has the
    # answer (or after preflight.LINGER): it ends with the last peer, so it gets the peers'
    # bound. (Measured in a two-worker test run: 7.4 s for a 4 s timeout, the last peer in time.)
    goals.append((f"{name}: process 0 names the missing peer within the timeout + {slack + 2.0:.1f} s",
                  bool(host_named) and timeout - 0.5 <= host_took <= timeout + slack + 2.0))
    goals.append((f"{name}: every peer names it within the timeout + {slack + 2.0:.1f} s",
                  len(peers_named) == len(peers) and last <= timeout + slack + 2.0))
    goals.append((f"{name}: requests per peer <= {bound}", max(requests) <= bound))
    return lines, goals


def _pace(size: int, local: int = 1) -> float:
    from distenv.bringup import preflight

    return preflight.pace(size, local)


def _local(kind: str, size: int) -> int:
    """The meeting's processes on one host, as the meeting counts them: TensorFlow's workers
    all at 127.0.0.1 (its cluster says so); the star's Meeting is built here without it (1)."""
    return size if kind == "tf" else 1


def _drain() -> float:
    from distenv.bringup import preflight

    return preflight.DRAIN


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=4000, help="simulated processes of the star")
    ap.add_argument("--tf-workers", type=int, default=1024)
    ap.add_argument("--kv-peers", type=int, default=4000,
                    help="torch's meeting on an in-process store (0: skip)")
    ap.add_argument("--store-peers", type=int, default=128,
                    help="torch's meeting on torch's own TCPStore (0: skip)")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--late", type=float, default=3.0)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", default="",
                    help="run only the scenarios whose name starts with this (e.g. 'tf')")
    ap.add_argument("--role", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="star", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tf-base", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ids", default="", help=argparse.SUPPRESS)
    ap.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--sync", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        role(args)
        return 0
    plan = [("star meet", "star", args.peers + 1, False, 0.0),
            ("star late", "star", args.peers + 1, False, args.late),
            ("star missing", "star", args.peers + 1, True, 0.0),
            ("tf meet", "tf", args.tf_workers, False, 0.0),
            ("tf missing", "tf", args.tf_workers, True, 0.0)]
    if args.kv_peers:
        plan += [("torch protocol meet", "kv", args.kv_peers + 1, False, 0.0),
                 ("torch protocol missing", "kv", args.kv_peers + 1, True, 0.0)]
    if args.store_peers:
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            print("torch's store: skipped (torch is not installed here)")
        else:
            plan += [("torch TCPStore meet", "store", args.store_peers + 1, False, 0.0),
                     ("torch TCPStore missing", "store", args.store_peers + 1, True, 0.0)]
    plan = [step for step in plan if step[0].startswith(args.only)]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"{args.procs} role processes of threads, RLIMIT_NOFILE 1024")
    report, goals = {}, []
    for name, kind, size, missing, late in plan:
        r = scenario(kind, size, args.procs, args.timeout, late=late, missing=missing)
        lines, met = _figures(name, kind, size, r, args.timeout, missing, late)
        for line in lines:
            print(line, flush=True)
        goals += met
        host = r["host"] or {}
        requests = [p.get("requests", 0) for p in r["peers"]] or [0]
        report[name] = {"size": size, "host_seconds": host.get("seconds"), "host_ok": host.get("ok"),
                        "host_error": host.get("error"), "wall": r["wall"], "errors": r["errors"],
                        "peer_seconds_max": max([p["seconds"] for p in r["peers"]] or [0.0]),
                        "peers_ok": sum(1 for p in r["peers"] if p.get("ok")),
                        "peers": len(r["peers"]), "requests_max": max(requests),
                        "requests_mean": sum(requests) / len(requests),
                        "soft": host.get("soft"), "goals": {g: ok for g, ok in met}}
    for goal, ok in goals:
        print(f"  {'met' if ok else 'NOT MET'}: {goal}")
    if args.json:
        print(MARK + json.dumps(report))
    print(f"preflight: {sum(ok for _, ok in goals)} of {len(goals)} goals met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
