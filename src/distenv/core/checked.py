"""Narrowing a `DistEnv` for code (and type checkers) that needs its fields known.

`DistEnv` fields are ``int | None``: ``None`` is the truthful answer where a launcher does not
reveal something. A worker that needs them asks once, and gets either values that are never
``None`` or one `DistEnvError` naming every unknown field and what to set:

    env = distenv.resolve().checked()      # rank, world_size, local_rank: int; master_addr: str
    rank, nodes = distenv.resolve().require("rank", "num_nodes")

Imported by those two methods only: `import distenv` does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple

from .fields import FIELDS, PER_NODE
from ..knobs import HOSTFILE, NPROC_PER_NODE
from ..errors import DistEnvError

if TYPE_CHECKING:
    from .description import DistEnv

#: What `checked()` requires: the five values every framework's rendezvous needs (torch's
#: ``env://``, DeepSpeed, Accelerate). The others stay optional in the view: a valid launch
#: may leave them unknown (Open MPI reveals no node rank across nodes).
REQUIRED = ("rank", "world_size", "local_rank", "master_addr", "master_port")

# The canonical variable that supplies each field when the launcher does not.
_SET = {
    "rank": "RANK",
    "world_size": "WORLD_SIZE",
    "local_rank": "LOCAL_RANK",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "node_rank": "NODE_RANK",
    "num_nodes": "resolve(num_nodes=N)",
    "nproc_per_node": NPROC_PER_NODE,
    "master_addr": "MASTER_ADDR (rank 0's host name or address)",
    "master_port": "MASTER_PORT",
    "platform": "a platform's own variables",
    "hosts": HOSTFILE,
    "rank_hosts": HOSTFILE,
    "job_id": "the launcher's job id",
}
_WORKER = ("rank", "local_rank")


class Checked:
    """A `DistEnv` whose rendezvous fields are known: typed without ``None``.

    ``env`` is the full description (provenance, notes, `export()`, `explain()`).
    """

    __slots__ = ("env", "launcher", "launch", "rank", "world_size", "local_rank",
                 "master_addr", "master_port", "local_world_size", "node_rank", "num_nodes",
                 "nproc_per_node", "platform", "hosts", "job_id")

    env: "DistEnv"
    launcher: str
    launch: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    local_world_size: Optional[int]
    node_rank: Optional[int]
    num_nodes: Optional[int]
    nproc_per_node: Optional[int]
    platform: Optional[str]
    hosts: Optional[Tuple[str, ...]]
    job_id: Optional[str]

    def __init__(self, env: "DistEnv") -> None:
        _check(env, REQUIRED)
        set_ = object.__setattr__
        set_(self, "env", env)
        for name in self.__slots__[1:]:
            set_(self, name, getattr(env, name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a checked DistEnv is frozen")

    @property
    def is_main(self) -> bool:
        """True on global rank 0."""
        return self.rank == 0

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__[1:] if f != "hosts")
        return f"Checked({inner})"


def checked(env: "DistEnv") -> Checked:
    return Checked(env)


def require(env: "DistEnv", names: Tuple[str, ...]) -> Tuple[Any, ...]:
    unknown_names = [n for n in names if n not in FIELDS]
    if unknown_names:
        raise TypeError(f"unknown DistEnv field(s): {', '.join(unknown_names)}; "
                        f"fields: {', '.join(FIELDS)}")
    _check(env, names)
    return tuple(getattr(env, n) for n in names)


def _check(env: "DistEnv", names: "Tuple[str, ...]") -> None:
    missing = [n for n in names if getattr(env, n) is None]
    if not missing:
        return
    launch = f"this {env.launcher} launch" if env.launcher != "none" else "this process"
    if env.launch == PER_NODE and any(n in _WORKER for n in missing):
        raise DistEnvError(
            f"{', '.join(missing)} unknown: {launch} is per-node (one process per node, "
            f"{env.nproc_per_node} worker(s) each), and ranks belong to the workers it has yet to "
            f"start. Fix: start the workers with `distenv run --nproc-per-node "
            f"{env.nproc_per_node or 'N'} -- python script.py` (or Lightning's own launcher), or "
            f"let the launcher start one process per worker")
    why = "; ".join(f"{n}: {env.provenance[n]}" for n in missing if env.provenance.get(n))
    fixes = ", ".join(dict.fromkeys(_SET[n] for n in missing))
    raise DistEnvError(
        f"{', '.join(missing)} unknown in {launch}"
        f"{' (' + why + ')' if why else ''}: the launcher does not reveal "
        f"{'it' if len(missing) == 1 else 'them'}. Fix: set {fixes} on every process "
        f"(or give distenv.resolve({missing[0]}=...))")
