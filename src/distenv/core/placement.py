"""Placement: which host runs each global rank, where the launch proves it, else unknown.

One model for every adapter. `DistEnv.rank_hosts` is the host of every global rank (a tuple
indexed by rank) or None. Each launch's rule lives in its Source (`Source.place`: SLURM's in
sources/slurm.py, TF_CONFIG's, Google Cloud's, SageMaker's and Azure ML's in theirs); `record`
asks the launcher's source, then applies the per-node rule, then asks the platform's. The rules:

===================  ======================================================================
launch               rule (proof)
===================  ======================================================================
SLURM (srun)         the step's node list and tasks per node, dealt by its distribution:
                     block fills nodes in list order, cyclic deals one task per node
                     round-robin, plane=N deals N at a time (srun(1) --distribution);
                     arbitrary or unknown distributions, a layout that contradicts this
                     task's own node, heterogeneous steps and a job-level list that is not
                     the step's: unknown (`distenv.sources.slurm`, docs/inferences.md).
TF_CONFIG            the cluster's host:port list, chief first then workers (the rank rule
                     of `distenv.sources.tfconfig`).
CLUSTER_SPEC,        per-node launches: the host list in node order, each host repeated
SageMaker (per-node) nproc_per_node times (the node's workers are numbered
                     node_rank * nproc_per_node + local_rank when they are started).
SageMaker + mpirun   SM_HOSTS in order, processes_per_host each (SageMaker runs mpirun with
                     ``-H algo-1:N,algo-2:N,...``: block placement).
Azure ML + MPI/env   AZ_BATCH_HOST_LIST in order, the same count on each (Azure starts the
                     same number of processes per node in rank order), only when the list's
                     first host is the master node Azure names (else its order is unproven).
host file            `hostfile_rank_hosts` / `read_hostfile`: DISTENV_HOSTFILE, filled in
                     blocks in file order as mpirun maps by slot by default. Reading a file
                     is I/O, so resolve() never does it: adapters call `read_hostfile`
                     explicitly (`distenv.tensorflow` does when DISTENV_HOSTFILE is set).
discovery            `distenv.discovery.discover()`: an allgather of host names.
===================  ======================================================================

Everything else (Open MPI, MPICH, torchrun across nodes, ...) is unknown: those launchers do
not reveal where the other ranks run.

The per-rank tuple can hold thousands of entries, so the resolver records a `Later` (the few
strings the rule needs) and `DistEnv.rank_hosts` builds the tuple on first access: resolve()
stays as cheap as before. Standard library only; no I/O at import.
"""

from __future__ import annotations

from itertools import groupby

from .description import Later
from ..errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    from .description import DistEnv
    from .reading import Env
    from ..sources import Source

# -- host files (DISTENV_HOSTFILE) ----------------------------------------------------------
def parse_hostfile(text: str, name: str = "host file") -> "tuple[list[str], list[int | None]]":
    """Hosts in file order with their slot counts (None where the file gives none)."""
    hosts: "list[str]" = []
    counts: "list[int | None]" = []
    seen: "dict[str, int]" = {}  # a dict, not list membership: a 50 000-line file stays linear
    # A PBS_NODEFILE repeats a host's line once per slot: each run of equal lines is parsed
    # once (groupby), and each distinct line once (`lines`).
    lines: "dict[str, tuple[str, int | None] | None]" = {}
    lineno = 1
    for raw, run in groupby(text.splitlines()):
        repeats = len(list(run))
        if raw in lines:
            entry = lines[raw]
        else:
            entry = lines[raw] = _hostfile_line(raw, lineno, name)
        lineno += repeats
        if entry is None:
            continue
        host, count = entry
        i = seen.get(host)
        if i is None:
            seen[host] = i = len(hosts)
            hosts.append(host)
            counts.append(count)
            repeats -= 1
        if repeats:  # PBS_NODEFILE style: one line per slot
            counts[i] = (counts[i] or 1) + (count or 1) * repeats
    if not hosts:
        raise DistEnvError(f"{name} lists no host. Fix: list the job's hosts, one per line, "
                           "in the order the launcher fills them.")
    return hosts, counts


def _hostfile_line(raw: str, lineno: int, name: str) -> "tuple[str, int | None] | None":
    """(host, slots or None) of one host file line; None for a blank or comment line."""
    line = raw.split("#", 1)[0].strip()
    if not line:
        return None
    words = line.split()
    host, count = words[0], None
    if ":" in host and host.rsplit(":", 1)[1].isdigit():
        host, n = host.rsplit(":", 1)
        count = int(n)
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key in ("slots", "max_slots", "cpu", "cpus") and value.isdigit():
            if key != "max_slots":
                count = int(value)
        else:
            raise DistEnvError(f"{name} line {lineno}: {line!r} is not 'host', 'host:N' "
                               "or 'host slots=N'. Fix: write one host per line in one of "
                               "those forms (mpirun's host file format).")
    if count == 0:
        raise DistEnvError(f"{name} line {lineno}: {line!r} gives no slot. Fix: give every "
                           "host at least one slot (host:N with N >= 1), or leave it out.")
    return host, count


def block(hosts: "Sequence[str]", counts: "Sequence[int]", size: "int | None", why: str) -> "list[str]":
    """Ranks fill `hosts` in order, counts[i] on hosts[i] (mpirun's default by-slot map)."""
    if sum(counts) != size:
        raise DistEnvError(f"{why} holds {sum(counts)} slot(s) but the launch has world_size={size}. "
                           "Fix: give each host as many slots as it runs ranks, so that they add "
                           "up to the world size.")
    out: "list[str]" = []
    for host, count in zip(hosts, counts):
        out.extend([host] * count)
    return out


def hostfile_rank_hosts(text: str, world_size: "int | None", per_node: "int | None" = None,
                        name: str = "host file") -> "list[str]":
    """The host of every rank from a host file's text: blocks in file order. Lines without
    a slot count take `per_node` each (the launch's processes per node)."""
    hosts, counts = parse_hostfile(text, name)
    if all(c is None for c in counts):
        if len(hosts) * (per_node or 0) != world_size:
            raise DistEnvError(
                f"{name} lists {len(hosts)} host(s) without slot counts and the launch "
                f"has world_size={world_size}. Fix: give 'host:N' lines (N ranks on each host, "
                "in rank order)."
            )
        counts = [per_node] * len(hosts)
    filled = [1 if c is None else c for c in counts]
    return block(hosts, filled, world_size, name)


def read_hostfile(env: "DistEnv", path: str) -> "list[str]":
    """I/O, called explicitly by adapters: the host of every rank of `env` (a DistEnv) from
    the host file at `path` (DISTENV_HOSTFILE)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise DistEnvError(f"DISTENV_HOSTFILE={path!r} cannot be read ({exc.strerror}). Fix: "
                           "point it at a file every rank can read.") from None
    return hostfile_rank_hosts(text, env.world_size, env.nproc_per_node or env.local_world_size,
                               f"host file {path}")


def with_rank_hosts(env: "DistEnv", rank_hosts: "Sequence[str]", why: str) -> "DistEnv":
    """`env` (a DistEnv) with `rank_hosts` filled (what discovery or a host file found).
    A host list that contradicts the one the launcher revealed is an error."""
    known = env.rank_hosts
    given = tuple(rank_hosts)
    if env.world_size is not None and len(given) != env.world_size:
        raise DistEnvError(f"{why} gives {len(given)} host(s) but world_size={env.world_size} "
                           f"({env.provenance.get('world_size')}). Fix: give one host per rank.")
    if known is not None and known != given:
        raise DistEnvError(f"{why} contradicts {env.provenance.get('rank_hosts')}: "
                           f"{_short(given)} vs {_short(known)}. Fix: correct or unset the one "
                           "that is wrong (a host file: DISTENV_HOSTFILE).")
    if known is not None:
        return env
    from .description import DistEnv, FIELDS

    values = {f: getattr(env, f) for f in FIELDS}
    values["rank_hosts"] = given
    why_map = dict(env.provenance)
    why_map["rank_hosts"] = why
    return DistEnv(values, why_map, env.notes)


def _short(hosts: "Sequence[str]") -> str:
    return ",".join(hosts[:4]) + (f",... ({len(hosts)})" if len(hosts) > 4 else "")


def display_node_rank(env: "DistEnv") -> int:
    """A node number for display only, where a framework insists on one and the launch does
    not reveal it: ``rank // local_world_size``, which is the node index under block placement
    with the same count on every node (Open MPI's default by-slot map, SLURM's block) and may
    be wrong under others. Never a `DistEnv` field (those are proven or None); 0 when even
    that is unknown (Lightning's own default without NODE_RANK)."""
    if env.node_rank is not None:
        return env.node_rank
    if env.rank is not None and env.local_world_size:
        return env.rank // env.local_world_size
    return 0


# -- what the resolver records -------------------------------------------------------------
def record(env: "Env", values: "dict[str, Any]", why: "dict[str, str]", launch_per_node: bool,
           sources: "Sequence[Source | None]" = (), hosts_by_node: bool = True) -> None:
    """Set values["rank_hosts"] (a `Later`, or None) and its why, from the launch read so far:
    the launcher's source's rule (`Source.place`), then a per-node launch's (below) where
    `hosts` is in node-rank order (`Reading.hosts_by_node`), then the platform's.

    Cheap: captures the few strings a rule needs; the tuple is built on first access."""
    if values.get("rank_hosts") is not None or values.get("world_size") is None:
        return
    launcher, platform = (tuple(sources) + (None, None))[:2]
    if launcher is not None:
        found = launcher.place(env, values, launch_per_node)
        if found is not None:
            values["rank_hosts"], why["rank_hosts"] = found
            return
    if launch_per_node and hosts_by_node:
        found = repeated(values, f"{why.get('hosts')} in node order, nproc_per_node="
                                 f"{values.get('nproc_per_node')} each (workers are numbered "
                                 "node_rank * nproc_per_node + local_rank)")
        if found is not None:
            values["rank_hosts"], why["rank_hosts"] = found
            return
    if platform is not None and platform is not launcher:
        found = platform.place(env, values, launch_per_node)
        if found is not None:
            values["rank_hosts"], why["rank_hosts"] = found
            return
    if launch_per_node and not hosts_by_node:
        why["rank_hosts"] = (f"unknown: {why.get('hosts')} is not in node-rank order (each node's "
                             "process is numbered by its rank, which the launcher did not place "
                             "by that list)")


def repeated(values: "dict[str, Any]", why: str) -> "tuple[Later, str] | None":
    """Block placement over the host list: each host `nproc_per_node` times, in list order
    (the rule of per-node launches, whose node k starts ranks k*nproc .. k*nproc+nproc-1, and
    of platforms that start the same count per host in rank order); None when the list and
    the counts do not add up to the world size."""
    hosts, per, size = values.get("hosts"), values.get("nproc_per_node"), values.get("world_size")
    if hosts is None or per is None or size is None or len(hosts) * per != size:
        return None
    return Later(_repeat, (tuple(hosts), per)), why


def _repeat(hosts: "Sequence[str]", per: int) -> "tuple[tuple[str, ...], None]":
    return tuple(h for h in hosts for _ in range(per)), None


# -- a master address set by hand --------------------------------------------------------------
#: How long the bring-up looks names up (the master address, the job's hosts) to tell whether a
#: master address is another host's: a name that has not answered by then proves nothing.
LOOKUP_SECONDS = 3.0
#: The job's hosts looked up at most (a larger job is checked against these: the pre-flight
#: still names an unreachable master within DISTENV_TIMEOUT).
LOOKUP_HOSTS = 64
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def not_rank_0s(env: DistEnv, first: str, hosts: "Iterable[str]", why: str) -> None:
    """A master address the environment gave that is another host of the job than rank 0's
    (`first`) is an error naming both: torch's store listens on rank 0's host, so every rank
    would wait on a host where nothing listens (30 minutes, by torch's default). Another host's
    name proves it; so does an address (or another name) that resolves to one of another host's
    addresses and to none of rank 0's (name lookups: called at bring-up only, never by
    `resolve()`; bounded by LOOKUP_SECONDS). Anything else -- an InfiniBand alias, a Kubernetes service address, a
    name that resolves to nothing the job's hosts do -- may reach rank 0: it cannot be proven
    wrong, and passes."""
    given = (env.master_addr or "").lower()
    if given == first.lower() or given in _LOOPBACK:
        return
    names = list(dict.fromkeys(hosts))
    other = next((h for h in names if h.lower() == given), None)
    how = "the host of other ranks"
    if other is None:
        other = _same_address(env.master_addr or "", first, [h for h in names if h.lower() != first.lower()])
        how = f"an address of {other}, another host of the job" if other else how
    if other is not None:
        raise DistEnvError(
            f"master_addr={env.master_addr} ({env.provenance.get('master_addr')}) is {how}, but "
            f"rank 0 runs on {first} ({why}): every rank would wait for a store nobody starts "
            f"there. Fix: unset MASTER_ADDR (distenv takes rank 0's host), or set it to {first}.")


def _same_address(given: str, first: str, others: "list[str]") -> "str | None":
    """The first of `others` (hosts of the job other than rank 0's `first`) that `given`
    resolves to one of the addresses of, where it resolves to none of `first`'s; else None."""
    found = _addresses([given, first, *others[:LOOKUP_HOSTS]])
    mine, rank_0s = found.get(given), found.get(first)
    if not mine or not rank_0s or mine & rank_0s:  # rank 0's own addresses unknown: no proof
        return None
    return next((h for h in others[:LOOKUP_HOSTS] if mine & found.get(h, frozenset())), None)


def _addresses(names: "list[str]") -> "dict[str, frozenset[str]]":
    """Each name's addresses (getaddrinfo, loopback left out), those answered within
    LOOKUP_SECONDS, by at most 16 threads; a name that fails or is late is absent."""
    import socket
    import threading
    import time

    out: "dict[str, frozenset[str]]" = {}
    todo = list(dict.fromkeys(n for n in names if n))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop()
            try:
                infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
            except (OSError, UnicodeError, ValueError):
                continue
            found = frozenset(str(i[4][0]) for i in infos) - {"::1"}
            out[name] = frozenset(a for a in found if not a.startswith("127."))

    deadline = time.monotonic() + LOOKUP_SECONDS
    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(16, len(todo)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(out)  # a copy: a late lookup may still write
