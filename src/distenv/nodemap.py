"""The placement map of a launch (`distenv show --map`, `distenv doctor`): one row per node --
its node rank, host, global ranks (compressed, ``0-3``), local world size, and which node holds
rank 0 and the master -- printed once for the whole job, by rank 0.

    job: openmpi per-process launch, 4 rank(s) on 2 node(s)
    node  host   ranks  local  holds
    0     node2  0-1    2      rank 0, master
    1     node1  2-3    2
    master: node2:24707
    placement: PMIx placement (the host of every rank, orted)

Where the rows come from, provable or unknown (never guessed):

* the host of every rank (`DistEnv.rank_hosts`) where the environment proves it (SLURM,
  TF_CONFIG, the platforms' lists: `distenv.core.placement`), else from the launcher's own service
  (`collect`: `distenv.discovery.complete`, PMIx or Hydra's PMI-1), else from DISTENV_HOSTFILE;
  nodes are numbered as `hosts` orders them, else by their lowest rank (distenv's definition);
* one node (``num_nodes`` 1, or every rank local): all ranks on this host, no service asked;
* a per-node launch: the nodes and the workers each is to start (node k's workers are ranks
  ``k * nproc_per_node ...``, torch's numbering);
* otherwise what is known (this process's node, the counts), and a line per unknown field
  saying what to set.

`build` is pure (a `DistEnv` in, a `NodeMap` out); `collect` communicates and is collective
under PMI-1: every rank calls it, whatever it then prints. A contradiction between the
description's fields and the placement is a `DistEnvError`.
"""

from __future__ import annotations

import os

from .core.description import PER_NODE
from .errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from .core.description import DistEnv

#: The fix when the host of every rank is unknown.
PLACEMENT_FIX = ("Fix: run it as every rank of a launch that offers a PMIx or PMI-1 service "
                 "(docs/discovery.md lists the launchers), or set DISTENV_HOSTFILE to a file of "
                 "'host:N' lines in rank order (N processes each).")
#: Rank runs shown per node before the list is cut (a cyclic layout on many nodes).
MAX_RUNS = 6


class Node:
    """One row: None where unknown."""

    __slots__ = ("node_rank", "host", "ranks", "local", "rank0", "master")

    def __init__(self, node_rank: "int | None", host: "str | None",
                 ranks: "tuple[int, ...] | None", local: "int | None") -> None:
        self.node_rank, self.host, self.ranks, self.local = node_rank, host, ranks, local
        self.rank0 = ranks is not None and 0 in ranks
        self.master = False

    def to_dict(self) -> "dict[str, Any]":
        return {"node_rank": self.node_rank, "host": self.host,
                "ranks": None if self.ranks is None else list(self.ranks),
                "local_world_size": self.local, "rank0": self.rank0, "master": self.master}


class NodeMap:
    """The map of one launch: its rows, what proves them, and what stays unknown."""

    __slots__ = ("launcher", "launch", "world_size", "num_nodes", "nproc_per_node",
                 "master_addr", "master_port", "why", "nodes", "unknown")

    def __init__(self, env: "DistEnv", nodes: "list[Node]", why: str, unknown: "list[str]") -> None:
        self.launcher, self.launch = env.launcher, env.launch
        self.world_size, self.nproc_per_node = env.world_size, env.nproc_per_node
        self.num_nodes = env.num_nodes if env.num_nodes is not None else (
            len(nodes) if nodes and all(n.ranks is not None for n in nodes) else None)
        self.master_addr, self.master_port = env.master_addr, env.master_port
        self.why, self.nodes, self.unknown = why, nodes, unknown

    def to_dict(self) -> "dict[str, Any]":
        """What ``distenv show --map --json`` prints."""
        return {"launcher": self.launcher, "launch": self.launch, "world_size": self.world_size,
                "num_nodes": self.num_nodes, "nproc_per_node": self.nproc_per_node,
                "master_addr": self.master_addr, "master_port": self.master_port,
                "placement": self.why, "nodes": [n.to_dict() for n in self.nodes],
                "unknown": list(self.unknown)}

    def text(self) -> str:
        """The table for people."""
        return render(self)


# -- collecting (communicates) ------------------------------------------------------------
def needs(env: "DistEnv") -> "tuple[str, ...]":
    """The fields the map needs from the launcher's service: () where the environment alone
    places every rank. The same answer on every rank of a launch (job-level facts only), so
    that every rank takes part in a collective exchange or none does."""
    if env.launch == PER_NODE:
        return () if env.num_nodes == 1 or env.hosts is not None else ("hosts",)
    if _one_node(env) or env.world_size == 1 or env.rank_hosts is not None:
        return ()
    return ("rank_hosts",)


def collect(env: "DistEnv", timeout: "float | None" = None) -> "DistEnv":
    """`env` with what the map needs filled: the launcher's service where it offers one
    (`distenv.discovery.complete`; collective under PMI-1: call it on every rank), then
    DISTENV_HOSTFILE where the placement is still unknown. Raises `DistEnvError` on a
    contradiction."""
    need = needs(env)
    if not need:
        return env
    from .discovery import complete

    env = complete(env, need=need, timeout=timeout)
    if env.launch != PER_NODE and env.rank_hosts is None:
        from .knobs import hostfile

        path = hostfile()
        if path is not None:
            from .core.placement import read_hostfile, with_rank_hosts

            env = with_rank_hosts(env, read_hostfile(env, path), f"DISTENV_HOSTFILE={path}")
    return env


def prints(env: "DistEnv") -> bool:
    """Does this process print the map? Rank 0 (node 0 in a per-node launch); a process whose
    place is unknown prints too (never hidden on a guess)."""
    return env.process_index in (None, 0)


# -- building (pure) ------------------------------------------------------------------------
def _one_node(env: "DistEnv") -> bool:
    return env.num_nodes == 1 or (env.world_size is not None
                                  and env.local_world_size == env.world_size)


def this_host() -> str:
    return os.uname().nodename


def build(env: "DistEnv", host: "str | None" = None) -> NodeMap:
    """The map of `env` as seen from this process (running on `host`, default this machine's
    name). Pure; raises `DistEnvError` where the fields contradict the placement."""
    host = this_host() if host is None else host
    if env.launch == PER_NODE:
        nodes, why, unknown = _per_node(env, host)
    elif env.rank_hosts is not None:
        nodes, why, unknown = _placed(env, env.rank_hosts)
    elif _one_node(env) and env.world_size is not None:
        name = env.hosts[0] if env.hosts is not None and len(env.hosts) == 1 else host
        nodes = [Node(0, name, tuple(range(env.world_size)), env.world_size)]
        why = "one node: every rank runs on this host (" + (
            env.provenance.get("num_nodes", "") if env.num_nodes == 1 else
            f"local_world_size = world_size = {env.world_size}") + ")"
        unknown = []
    else:
        nodes, why, unknown = _partial(env, host)
    _mark_master(env, nodes)
    if env.master_addr is None and env.world_size != 1:
        unknown.append(f"master_addr ({env.provenance.get('master_addr', 'not revealed')}). "
                       "Fix: set MASTER_ADDR to rank 0's host name on every rank.")
    return NodeMap(env, nodes, why, unknown)


def _placed(env: "DistEnv", rank_hosts: "Sequence[str]") -> "tuple[list[Node], str, list[str]]":
    """Rows from the host of every rank."""
    why = env.provenance.get("rank_hosts", "the host of every rank")
    if env.world_size is not None and len(rank_hosts) != env.world_size:
        raise DistEnvError(f"{len(rank_hosts)} rank host(s) ({why}) but world_size="
                           f"{env.world_size} ({env.provenance.get('world_size')}). " + _STALE)
    ranks: "dict[str, list[int]]" = {}
    for rank, name in enumerate(rank_hosts):  # nodes by their lowest rank: distenv's numbering
        ranks.setdefault(name, []).append(rank)
    order = list(ranks)
    if env.hosts is not None:
        listed = set(env.hosts)  # a set: 50 000 ranks on thousands of hosts stay linear
        extra = [h for h in order if h not in listed]
        if extra or len(env.hosts) != len(order):
            raise DistEnvError(
                f"the ranks run on {_few(order)} ({why}) but hosts is {_few(env.hosts)} "
                f"({env.provenance.get('hosts')}). " + _STALE)
        order = list(env.hosts)
    if env.num_nodes is not None and env.num_nodes != len(order):
        raise DistEnvError(f"the ranks run on {len(order)} host(s) ({why}) but num_nodes="
                           f"{env.num_nodes} ({env.provenance.get('num_nodes')}). " + _STALE)
    nodes = [Node(i, name, tuple(ranks[name]), len(ranks[name])) for i, name in enumerate(order)]
    if env.rank is not None and env.rank < len(rank_hosts):
        mine = nodes[order.index(rank_hosts[env.rank])]
        for field, known, found in (("node_rank", env.node_rank, mine.node_rank),
                                    ("local_world_size", env.local_world_size, mine.local)):
            if known is not None and known != found:
                raise DistEnvError(
                    f"{field}={known} ({env.provenance.get(field)}) but rank {env.rank} runs on "
                    f"{mine.host} with {mine.local} rank(s), node {mine.node_rank} ({why}). "
                    + _STALE)
    return nodes, why, []


def _per_node(env: "DistEnv", host: str) -> "tuple[list[Node], str, list[str]]":
    """Rows of a per-node launch: its processes are the nodes; the workers are to be started."""
    count, per, hosts = env.num_nodes, env.nproc_per_node, env.hosts
    unknown: "list[str]" = []
    if count is None and hosts is not None:
        count = len(hosts)
    indices: "Iterable[int | None]"
    if count is not None:
        indices = range(count)
    else:
        indices = [env.node_rank]
        unknown.append(f"num_nodes ({env.provenance.get('num_nodes', 'not revealed')}). "
                       "Fix: set NNODES (or the launcher's node count) on every node.")
    nodes = []
    for k in indices:
        name = hosts[k] if hosts is not None and k is not None and 0 <= k < len(hosts) else (
            host if k == env.node_rank else None)
        ranks = tuple(range(k * per, (k + 1) * per)) if per is not None and k is not None else None
        nodes.append(Node(k, name, ranks, per))
        nodes[-1].rank0 = k == 0  # worker 0 is node 0's first
    if hosts is None and (count is None or count > 1):
        unknown.append("the other nodes' hosts (a per-node launch names only its own). Fix: run "
                       "it as every node's process of a launch that offers a PMIx or PMI-1 "
                       "service, one process per node (docs/discovery.md lists the launchers).")
    if per is None:
        unknown.append(f"nproc_per_node ({env.provenance.get('nproc_per_node', 'not revealed')}). "
                       "Fix: set DISTENV_NPROC_PER_NODE (the workers each node starts).")
    why = (f"per-node launch: {per if per is not None else '?'} worker(s) to start on each node, "
           "numbered node_rank * nproc_per_node + local_rank")
    return nodes, why, unknown


def _partial(env: "DistEnv", host: str) -> "tuple[list[Node], str, list[str]]":
    """What is known without the host of every rank: this process's node and the counts."""
    from .sources import source_of

    own = source_of(env.launcher).launch.unknown_fix
    unknown = [f"the host of every rank ({env.provenance.get('rank_hosts', 'not revealed')}). "
               + (f"Fix: {own}." if own else PLACEMENT_FIX)]
    count, mine = env.num_nodes, env.node_rank
    if env.world_size is None:
        unknown.append(f"world_size ({env.provenance.get('world_size', 'not revealed')}). "
                       "Fix: set WORLD_SIZE on every rank.")
    def named(k: "int | None") -> "str | None":
        hosts = env.hosts
        return hosts[k] if hosts is not None and k is not None and 0 <= k < len(hosts) else None

    nodes = [Node(mine, named(mine) or host, None, env.local_world_size)]
    nodes[0].rank0 = env.rank == 0
    if count is not None and mine is not None:
        per = env.nproc_per_node
        nodes = [nodes[0] if k == mine else Node(k, named(k), None, per) for k in range(count)]
    elif count is None:
        unknown.append(f"num_nodes ({env.provenance.get('num_nodes', 'not revealed')}). "
                       "Fix: the same as for the host of every rank.")
    if mine is None:
        unknown.append(f"node_rank of this host ({env.provenance.get('node_rank', 'not revealed')}). "
                       "Fix: the same as for the host of every rank, or set NODE_RANK.")
    return nodes, "not every rank's host: only this process's node is placed", unknown


_LOOPBACK = ("127.", "localhost", "::1")


def _mark_master(env: "DistEnv", nodes: "list[Node]") -> None:
    addr = env.master_addr
    if addr is None:
        return
    for node in nodes:
        if node.host is not None and node.host == addr:
            node.master = True
            return
    if addr.startswith(_LOOPBACK) and len(nodes) == 1:
        nodes[0].master = True  # one node: the loopback is this node's


_STALE = ("Fix: run every rank under the same launcher and job, and unset variables left over "
          "from another job (distenv show --explain names where each value came from).")


def _few(hosts: "Sequence[str]") -> str:
    return ",".join(hosts[:4]) + (f",... ({len(hosts)})" if len(hosts) > 4 else "")


# -- showing ----------------------------------------------------------------------------------
def compress(ranks: "Iterable[int]") -> str:
    """``0-3``, ``0,2,4-7``: runs of consecutive ranks; the first runs and the count when
    there are more than `MAX_RUNS` (a cyclic layout on many nodes)."""
    runs: "list[list[int]]" = []
    total = 0
    for r in sorted(ranks):
        total += 1
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(parts) > MAX_RUNS:
        return ",".join(parts[:MAX_RUNS - 2]) + f",... ({total} ranks)"
    return ",".join(parts)


#: Longest host shown whole.
MAX_HOST = 60


def _cut(text: str) -> str:
    return text if len(text) <= MAX_HOST else f"{text[:MAX_HOST - 20]}... ({len(text)} chars)"


def render(m: "NodeMap | Mapping[str, Any]") -> str:
    """The map as a table (`NodeMap.text`); also from its JSON form (`NodeMap.to_dict`), as
    `distenv doctor` keeps it."""
    d = m.to_dict() if isinstance(m, NodeMap) else m

    def n(value: "int | None") -> str:
        return "?" if value is None else str(value)

    per_node = d["launch"] == PER_NODE
    if d["launcher"] == "none" and not per_node:
        head = "job: one process, no launcher"
    elif per_node:
        head = (f"job: {d['launcher']} per-node launch, {n(d['num_nodes'])} node(s), "
                f"{n(d['nproc_per_node'])} worker(s) each to start")
    else:
        head = (f"job: {d['launcher']} {d['launch']} launch, {n(d['world_size'])} rank(s) on "
                f"{n(d['num_nodes'])} node(s)")
    rows = [("node", "host", "workers" if per_node else "ranks", "local", "holds")]
    for node in d["nodes"]:
        holds = ", ".join(w for w, yes in (("rank 0", node["rank0"]), ("master", node["master"]))
                          if yes)
        rows.append((n(node["node_rank"]), "?" if node["host"] is None else _cut(node["host"]),
                     "?" if node["ranks"] is None else compress(node["ranks"]),
                     n(node["local_world_size"]), holds))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [head] + ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4]
                      for row in rows]
    lines = [line.rstrip() for line in lines]
    master = f"master: {d['master_addr'] or '?'}:{n(d['master_port'])}"
    if d["master_addr"] is not None and not any(node["master"] for node in d["nodes"]):
        master += " (not a host named above: its node is not looked up)"
    lines.append(master)
    lines.append(f"placement: {d['placement']}")
    lines += [f"unknown: {u}" for u in d["unknown"]]
    return "\n".join(lines)
