"""A description completed from a service's answer: pure (no I/O), the same for every service.

An `Answer` is what any service says -- this process's rank, the job's size, and the host of
every rank -- plus what a service may add (a port rank 0 found free, a job key to derive one
from). `apply` checks it against what the launcher's variables said (a rank or a count that
disagrees is an error naming both) and fills the rest: from the host of every rank,
`from_hostnames` proves rank 0's host (`master_addr`), the node of every rank (nodes ordered
by their lowest rank: `node_rank`, `num_nodes`, `hosts`), the local counts and `rank_hosts`.
A note about a field it fills is dropped (`Note.about`).
"""

from __future__ import annotations

from ..core.description import DEFAULT, DERIVED, PER_NODE, UNKNOWN, DistEnv, about, kind_of, unsettled
from ..errors import DistEnvError

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

#: The fix of a contradiction between what the launcher says and what the ranks found.
STALE = ("Fix: run every rank under the same launcher and job, and unset variables left over "
         "from another job (distenv show --explain names where each value came from).")


class Answer:
    """What a service said. ``hosts[r]`` is rank r's host; `why` the provenance of every
    field it fills; `port` a TCP port rank 0 found free on its host (every rank got the same),
    `port_key` a job identity to derive one from (distenv.core.ports); `one_per_node` the launcher
    option that starts one process per node, for the error of a per-node launch that did not."""

    __slots__ = ("service", "rank", "size", "hosts", "why", "port", "port_key", "one_per_node",
                 "earlier", "full")

    def __init__(self, service: str, rank: int, size: int, hosts: "Sequence[str]", why: str,
                 port: "int | None" = None, port_key: "str | None" = None,
                 one_per_node: str = "", earlier: "int | None" = None, full: bool = True) -> None:
        self.service, self.rank, self.size, self.hosts = service, rank, size, list(hosts)
        self.why, self.port, self.port_key, self.one_per_node = why, port, port_key, one_per_node
        #: the pid of the earlier program of this task that asked (the claim), or None
        self.earlier = earlier
        #: `hosts` holds every rank's host; else rank 0's alone (the master address only)
        self.full = full

    def to_json(self, pid: int) -> str:
        """The answer as the claim hands it to later programs of the task (`from_json`)."""
        import json

        from .handoff import encode_hosts

        return json.dumps({"service": self.service, "rank": self.rank, "size": self.size,
                           "hosts": encode_hosts(self.hosts), "why": self.why, "port": self.port,
                           "port_key": self.port_key, "one_per_node": self.one_per_node,
                           "pid": pid})

    @classmethod
    def from_json(cls, text: str) -> "Answer | None":
        """`to_json` undone, or None when `text` is not such an answer."""
        import json

        from .handoff import decode_hosts

        try:
            got = json.loads(text)
            hosts = decode_hosts(str(got["hosts"]))
            if hosts is None or len(hosts) != int(got["size"]) or not 0 <= int(got["rank"]) < len(hosts):
                return None
            port = got.get("port")
            return cls(str(got["service"]), int(got["rank"]), int(got["size"]), hosts,
                       str(got["why"]), int(port) if port is not None else None,
                       got.get("port_key"), str(got.get("one_per_node", "")), int(got["pid"]))
        except (ValueError, KeyError, TypeError):
            return None

    def __repr__(self) -> str:
        return f"Answer({self.service!r}, rank={self.rank}, size={self.size}, hosts={self.hosts!r})"


def with_values(env: DistEnv, changes: "Mapping[str, object]", why: str) -> DistEnv:
    """`env` with `changes` (None values skipped), each with provenance `why`; the notes
    about a field this fills go (`settled`)."""
    values = unsettled(env)  # a rank_hosts still to compute is replaced or carried, not computed
    provenance = dict(env.provenance)
    filled = set()
    for name, value in changes.items():
        if value is not None and values.get(name) != value:
            values[name] = value
            provenance[name] = why
            filled.add(name)
    notes = settled(env, filled, values) if filled else list(env.notes)
    return DistEnv(values, provenance, notes)


def settled(env: DistEnv, filled: "set[str]", values: "Mapping[str, Any]") -> "list[str]":
    """`env`'s notes once the fields in `filled` are known: a note about one of them goes; the
    resolver's note listing the unknown fields (kind UNKNOWN) is rebuilt for those still
    unknown, so no note names a field discovery filled."""
    keep: "list[str]" = []
    rebuild = False
    for note in env.notes:
        if filled.intersection(about(note)):
            rebuild = rebuild or getattr(note, "kind", None) == UNKNOWN
            continue
        keep.append(note)
    if rebuild:
        from ..core.resolver import unknown_note
        from ..sources import source_of

        source = source_of(env.launcher)
        rebuilt = unknown_note(values, source.title or str(env.launcher),
                               env.launch == PER_NODE, reads=source.owns,
                               never=source.launch.unknown_fix)
        if rebuilt is not None:
            keep.append(rebuilt)
    return keep


def from_hostnames(env: DistEnv, names: "list[str]", why: str) -> DistEnv:
    """Complete `env` from every rank's host name (index = global rank). Pure, for tests."""
    if env.rank is None or env.world_size is None:
        raise DistEnvError("discovery needs a per-process launch with a known rank and world size. "
                           "Fix: run it in every rank of a launch that gives them (mpirun -np N, "
                           "srun -n N), not in a per-node or single process.")
    if len(names) != env.world_size:
        raise DistEnvError(
            f"discovery saw {len(names)} ranks but the launcher says world_size={env.world_size} "
            f"({env.provenance.get('world_size')}). Fix: run discovery in every rank of the job, "
            "and in no other process."
        )
    index: "dict[str, int]" = {}  # node index by lowest rank, one pass: linear in the ranks
    counts: "dict[str, int]" = {}
    for name in names:
        index.setdefault(name, len(index))
        counts[name] = counts.get(name, 0) + 1
    mine = names[env.rank]
    nodes = list(index)
    for field, known, found in (
        ("node_rank", env.node_rank, index[mine]),
        ("num_nodes", env.num_nodes, len(nodes)),
        ("local_world_size", env.local_world_size, counts[mine]),
    ):
        if known is not None and known != found:
            raise DistEnvError(
                f"{field}={known} ({env.provenance.get(field)}) contradicts discovery ({why}): {found}. "
                + STALE
            )
    # What the environment says of this host's ranks must fit the placement too: a local rank
    # below their count, and one count for every host where it says so.
    per = set(counts.values())
    for field, known, fits, placed in (
        ("local_rank", env.local_rank, env.local_rank is None or env.local_rank < counts[mine],
         f"{counts[mine]} rank(s) on this host"),
        ("nproc_per_node", env.nproc_per_node, env.nproc_per_node is None or per == {env.nproc_per_node},
         f"{', '.join(map(str, sorted(per)))} rank(s) per host"),
    ):
        if not fits:
            raise DistEnvError(
                f"{field}={known} ({env.provenance.get(field)}) contradicts discovery ({why}): {placed}. "
                + STALE
            )
    changes = {
        "node_rank": index[mine],
        "num_nodes": len(nodes),
        "local_world_size": counts[mine],
        "hosts": tuple(nodes),
        "rank_hosts": tuple(names),  # every rank's host: the placement (distenv.core.placement)
        "nproc_per_node": counts[mine] if len(set(counts.values())) == 1 else None,
    }
    if env.local_rank is None:
        changes["local_rank"] = sum(1 for name in names[:env.rank] if name == mine)
    if env.master_addr is None:  # one node: loopback, as the resolver's own one-node rule
        changes["master_addr"] = names[0] if len(nodes) > 1 else "127.0.0.1"
    elif len(nodes) > 1:  # one host: no other host the address could be (no import, no lookup)
        from ..core.placement import not_rank_0s

        not_rank_0s(env, names[0], counts, why)
    return with_values(env, changes, why)


def per_node(env: DistEnv, ans: Answer) -> DistEnv:
    """A per-node launch completed from a service's answer: its ranks are the nodes, one
    process on each host (else an error), rank = node rank."""
    if not ans.full:  # rank 0's host alone proves no process per host (Pmix.ask asks for all)
        raise DistEnvError(f"a per-node launch, but {ans.why} gave rank 0's host alone, which "
                           "cannot show one process per host. Fix: ask for every host "
                           "(distenv.discover(), or complete(need=('hosts',))).")
    distinct = list(dict.fromkeys(ans.hosts))
    if len(distinct) != ans.size:
        raise DistEnvError(
            f"a per-node launch, but {ans.why} found {ans.size} processes on {len(distinct)} "
            f"hosts ({', '.join(sorted(distinct)[:8])}). Fix: start one process per node"
            f"{' (' + ans.one_per_node + ')' if ans.one_per_node else ''}, or unset "
            "DISTENV_NPROC_PER_NODE.")
    for field, found in (("node_rank", ans.rank), ("num_nodes", ans.size)):
        known = getattr(env, field)
        if known is not None and known != found:
            raise DistEnvError(f"{field}={known} ({env.provenance.get(field)}) contradicts "
                               f"{ans.why}: {found}. " + STALE)
    if env.master_addr is not None and ans.size > 1:  # node 0 starts the store: as from_hostnames
        from ..core.placement import not_rank_0s

        not_rank_0s(env, ans.hosts[0], ans.hosts, ans.why)
    return with_values(env, {"node_rank": ans.rank, "num_nodes": ans.size, "hosts": tuple(ans.hosts),
                             "master_addr": env.master_addr or ans.hosts[0]}, ans.why)


def apply(env: DistEnv, ans: Answer) -> DistEnv:
    """`env` completed from `ans` (module docstring); `DistEnvError` on a contradiction, or
    when a host the service gave cannot be a master address (the resolver's own check:
    `distenv run` puts it on torchrun's command line)."""
    from ..core.invariants import host_problem

    for host in dict.fromkeys(ans.hosts):
        problem = host_problem(host, ans.why)
        if problem is not None:
            raise DistEnvError(f"{problem[:-1]}: the launcher's service answered something that is "
                               "not a host. " + STALE)
    port_kind = kind_of(env.provenance.get("master_port"))
    if (ans.port is not None and port_kind in (DEFAULT, DERIVED)
            and env.master_addr in (None, ans.hosts[0])):
        # Rank 0 found this port free on its own host, where the store will listen, and
        # published it with the hosts (distenv.core.ports.free): a job already listening on
        # the derived port is avoided, and every rank has the same port.
        env = with_values(env, {"master_port": ans.port},
                          f"free on rank 0's host ({ans.hosts[0]}) when it looked ({ans.why}); "
                          "see distenv.core.ports.free")
    elif ans.port_key and port_kind == DEFAULT:
        # A launcher with no job id (MPICH) still has one service key the same on every rank
        # of one job, different across jobs (its key-value space name): two such jobs on one
        # machine no longer share 29500.
        from ..core.ports import port_for

        env = with_values(env, {"master_port": port_for(ans.port_key)},
                          f"derived from the job's key-value space name ({ans.port_key.split(':', 1)[-1]}; "
                          f"{ans.why}); see distenv.core.ports")
    if env.launch == PER_NODE:
        # One process per node (DISTENV_NPROC_PER_NODE under mpirun/srun): the ranks are nodes.
        return per_node(env, ans)
    if env.rank is not None and env.rank != ans.rank:
        raise DistEnvError(f"rank={env.rank} ({env.provenance.get('rank')}) but {ans.why} says "
                           f"rank {ans.rank}: the launch is not this job. " + STALE)
    if env.world_size is None:  # MPICH -pmi-port: the service gives the size
        env = with_values(env, {"world_size": ans.size}, ans.why)
    elif env.world_size != ans.size:
        raise DistEnvError(f"world_size={env.world_size} ({env.provenance.get('world_size')}) but "
                           f"{ans.why} says {ans.size} ranks. " + STALE)
    if not ans.full:  # rank 0's host alone: the master address, nothing about nodes
        return with_values(env, {"master_addr": env.master_addr or ans.hosts[0]}, ans.why)
    return from_hostnames(env, list(ans.hosts), ans.why)


__all__ = ["Answer", "apply", "from_hostnames", "per_node", "with_values", "settled", "STALE"]
