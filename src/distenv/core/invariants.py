"""What every description must satisfy, whoever built it: `resolve()` from the environment and
its overrides, `DistEnv.replace()` from a caller's values (both end in this check); and what a
master address must look like (`host_problem`, also asked by `distenv run` and discovery)."""

from __future__ import annotations

from ..errors import DistEnvError
from .reading import MAX_COUNT, PORT_MAX, PORT_MIN, show

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, NoReturn


_COUNTS = ("rank", "local_rank", "world_size", "local_world_size", "node_rank",
           "num_nodes", "nproc_per_node")  # master_port: a TCP port, checked on its own
_POSITIVE = ("world_size", "local_world_size", "num_nodes", "nproc_per_node")
_LEAST = tuple((field, 1 if field in _POSITIVE else 0) for field in _COUNTS)
# (a, b, strict): a < b when strict, else a <= b.
_ORDER = (("rank", "world_size", True), ("local_rank", "local_world_size", True),
          ("local_rank", "world_size", True),  # also where the local world size is unknown
          ("node_rank", "num_nodes", True), ("local_world_size", "world_size", False),
          ("num_nodes", "world_size", False), ("nproc_per_node", "world_size", False))


def _bad(text: str, fix: str) -> "NoReturn":
    raise DistEnvError(f"{text} Fix: {fix}.")


def check(values: "Mapping[str, Any]", why: "Mapping[str, Any]",
          fix: str = "correct the launcher's variables or the override") -> None:
    """Raise DistEnvError (ending in `fix`) where the fields, each with where it came from,
    cannot describe one process of one launch: types and ranges, ranks below their sizes, the
    counts of one layout, the hosts and the master address."""
    get = values.get
    port = get("master_port")
    if port is not None and (port.__class__ is not int or not PORT_MIN <= port <= PORT_MAX):
        _bad(f"master_port={show(port)} ({why.get('master_port')}) is not a TCP port ({PORT_MIN}-{PORT_MAX}).", fix)
    for field, least in _LEAST:
        value = get(field)
        if value is not None and (value.__class__ is not int or not least <= value < MAX_COUNT):
            _bad(f"{field}={show(value)} ({why.get(field)}) is not an integer from {least} to {MAX_COUNT - 1}.", fix)
    for low, high, strict in _ORDER:
        a = get(low)
        if a is not None:
            b = get(high)
            if b is not None and (a >= b if strict else a > b):
                relation = "must be below" if strict else "cannot exceed"
                _bad(f"{low}={a} ({why.get(low)}) {relation} {high}={b} ({why.get(high)}).", fix)
    node, rank = get("node_rank"), get("rank")
    if node is not None and rank is not None and node > rank:
        _bad(f"node_rank={node} ({why.get('node_rank')}) is above rank={rank} ({why.get('rank')}): "
             "nodes are numbered by their lowest rank, so node k holds no rank below k.", fix)
    _check_counts(get, why, fix)
    hosts, nodes = get("hosts"), get("num_nodes")
    if hosts is not None and nodes is not None and len(hosts) != nodes:
        _bad(f"{len(hosts)} host(s) in {why.get('hosts')} but num_nodes={nodes} ({why.get('num_nodes')}).", fix)
    addr = get("master_addr")
    if addr is not None:
        problem = host_problem(addr, why.get("master_addr"))
        if problem:
            _bad(problem, fix)


def _check_counts(get: Any, why: "Mapping[str, Any]", fix: str) -> None:
    """The counts must describe one layout: world = nodes x workers per node (where every node
    has as many), and the other nodes - 1 hold the world's other ranks, at least one each (a
    node count is of nodes that run ranks: every source reads it so) -- else a node count of
    1 on a rank with neighbours elsewhere would make the loopback its master."""
    size, local, nodes, nproc = (get("world_size"), get("local_world_size"), get("num_nodes"),
                                 get("nproc_per_node"))
    node = get("node_rank")
    if nodes is None and None not in (size, local, node) and node > size - local:
        _bad(f"node_rank={node} ({why.get('node_rank')}) but local_world_size={local} "
             f"({why.get('local_world_size')}) leaves {size - local} of world_size={size} "
             f"({why.get('world_size')}) for the {node} nodes before this one, at least one "
             "rank on each.", fix)
    if nproc is not None and size is not None and size % nproc:
        # every node runs nproc_per_node: also where the node count is unknown (mpirun_rsh -np
        # 3 h1 h1 h2 with 2 per node asked resolved on h1 as 3 ranks, 2 per node)
        _bad(f"world_size={size} ({why.get('world_size')}) is not a multiple of nproc_per_node="
             f"{nproc} ({why.get('nproc_per_node')}): every node runs as many.", fix)
    if size is None or nodes is None:
        return
    lrank = get("local_rank")
    if lrank is not None and lrank > size - nodes:
        _bad(f"local_rank={lrank} ({why.get('local_rank')}) leaves fewer than {nodes - 1} of "
             f"world_size={size} ({why.get('world_size')}) for the other nodes of "
             f"num_nodes={nodes} ({why.get('num_nodes')}), at least one rank on each.", fix)
    if local is not None and nodes == 1 and local != size:
        _bad(f"num_nodes=1 ({why.get('num_nodes')}) but local_world_size={local} "
             f"({why.get('local_world_size')}) is not world_size={size} "
             f"({why.get('world_size')}): one node holds every rank.", fix)
    if local is not None and (size - local < nodes - 1 or (nodes > 1 and size == local)):
        _bad(f"local_world_size={local} ({why.get('local_world_size')}) leaves {size - local} "
             f"of world_size={size} ({why.get('world_size')}) for the other {nodes - 1} of "
             f"num_nodes={nodes} ({why.get('num_nodes')}), at least one rank on each.", fix)
    if nproc is not None and nodes * nproc != size:
        _bad(f"world_size={size} ({why.get('world_size')}) is not num_nodes={nodes} "
             f"({why.get('num_nodes')}) x nproc_per_node={nproc} ({why.get('nproc_per_node')}).", fix)


def host_problem(addr: object, why: object) -> "str | None":
    """What is wrong with a master address (`why`: where it came from), or None for a host
    name, IPv4 or IPv6 address. Every place that reads one (the resolver; `distenv run`, which
    puts it on torchrun's command line) asks this."""
    if _is_host(addr):
        return None
    text = f"master_addr={show(addr)} ({why}) is not a host name or address"
    if isinstance(addr, str) and addr.startswith("-"):
        text += " (it starts with '-': a command such as torchrun would take it for an option)"
    return text + "."


def _is_host(addr: object) -> bool:
    """A host name, IPv4 or IPv6 address: no URL, no user@, no port, no space, no leading '-'
    (no host name starts with one, RFC 952/1123; on a command line it would be an option)."""
    if type(addr) is not str or not addr or not addr.isprintable() or len(addr) > 255:
        return False
    if addr.startswith("-"):
        return False
    if any(c in addr for c in " /@?#"):
        return False
    if ":" in addr:  # only an IPv6 address may hold colons
        import ipaddress

        try:
            ipaddress.IPv6Address(addr.strip("[]").split("%", 1)[0])
        except ValueError:
            return False
    return True
