"""Optional discovery: ask the other ranks for what the launcher did not reveal.

Resolution never communicates. Some launchers leave fields unknown across nodes (MPICH and
Open MPI give no node index; MPICH gives no head-node address). `discover()` fills them by
an allgather of host names over MPI (mpi4py) — only when called, after every rank started.

    env = distenv.discover()            # node_rank, num_nodes, hosts, master_addr filled
    env.export()
"""

from __future__ import annotations

import socket

from .description import FIELDS, DistEnv
from .errors import DistEnvError


def _with(env: DistEnv, changes: dict, why: str) -> DistEnv:
    values = {f: getattr(env, f) for f in FIELDS}
    provenance = dict(env.provenance)
    for name, value in changes.items():
        if value is not None and values.get(name) != value:
            values[name] = value
            provenance[name] = why
    return DistEnv(values, provenance, env.notes)


def from_hostnames(env: DistEnv, names: "list[str]", why: str) -> DistEnv:
    """Complete `env` from every rank's host name (index = global rank). Pure, for tests."""
    if env.rank is None or env.world_size is None:
        raise DistEnvError("discovery needs a per-process launch with a known rank and world size.")
    if len(names) != env.world_size:
        raise DistEnvError(
            f"discovery saw {len(names)} ranks but the launcher says world_size={env.world_size} "
            f"({env.provenance.get('world_size')})."
        )
    nodes: list = []
    for name in names:  # nodes ordered by their lowest rank
        if name not in nodes:
            nodes.append(name)
    mine = names[env.rank]
    on_node = [r for r, name in enumerate(names) if name == mine]
    for field, known, found in (
        ("node_rank", env.node_rank, nodes.index(mine)),
        ("num_nodes", env.num_nodes, len(nodes)),
        ("local_world_size", env.local_world_size, len(on_node)),
    ):
        if known is not None and known != found:
            raise DistEnvError(
                f"{field}={known} ({env.provenance.get(field)}) contradicts discovery ({why}): {found}."
            )
    counts = {names.count(n) for n in nodes}
    changes = {
        "node_rank": nodes.index(mine),
        "num_nodes": len(nodes),
        "local_world_size": len(on_node),
        "hosts": tuple(nodes),
        "nproc_per_node": len(on_node) if len(counts) == 1 else None,
    }
    if env.local_rank is None:
        changes["local_rank"] = on_node.index(env.rank)
    if env.master_addr is None and len(nodes) > 1:
        changes["master_addr"] = names[0]
    return _with(env, changes, why)


def discover(env: "DistEnv | None" = None, method: str = "mpi4py") -> DistEnv:
    """Fill node rank, node count, host list and master address by asking the other ranks.

    Communicates (an MPI allgather of host names): call it explicitly, on every rank.
    """
    if env is None:
        from .resolver import resolve

        env = resolve()
    if method != "mpi4py":
        raise DistEnvError(f"unknown discovery method {method!r}: only 'mpi4py' exists.")
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistEnvError(
            "discovery with mpi4py needs mpi4py built for your MPI: pip install mpi4py. "
            "Without it, set MASTER_ADDR (and NODE_RANK) in the job script instead."
        ) from None
    comm = MPI.COMM_WORLD
    if comm.Get_rank() != env.rank or comm.Get_size() != env.world_size:
        raise DistEnvError(
            f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but distenv resolved "
            f"rank={env.rank} of world_size={env.world_size}: the launch is not this MPI job."
        )
    names = comm.allgather(socket.gethostname())
    return from_hostnames(env, names, "mpi4py allgather of host names")
