"""Helpers shared by sources (kept tiny: each source stays readable on its own).

block_layout's proof is the calling platform's documented layout (docs/inferences.md).
"""

from __future__ import annotations

from ..reading import get_int, Reading

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..reading import Env


def read_counts(env: "Env", r: Reading, who: str, rank: str, size: str,
                local_rank: "str | None" = None, local_size: "str | None" = None) -> None:
    """The four numbers most launchers give, each recorded with its variable."""
    r.int_from(env, "rank", rank, who)
    r.int_from(env, "world_size", size, who, minimum=1)
    if local_rank:
        r.int_from(env, "local_rank", local_rank, who)
    if local_size:
        r.int_from(env, "local_world_size", local_size, who, minimum=1)


def first_int(env: "Env", names: "Iterable[str]", who: str = ""
              ) -> "tuple[int, str] | tuple[None, None]":
    """(value, name) of the first variable present among `names`."""
    for name in names:
        value = get_int(env, name, who)
        if value is not None:
            return value, name
    return None, None


def block_layout(r: Reading, why: str) -> None:
    """Node rank for a platform that documents a block layout with the same number of
    processes on every node (Azure ML and SageMaker MPI jobs): node = rank // local size."""
    rank, local, size = r.get("rank"), r.get("local_world_size"), r.get("world_size")
    if None in (rank, local, size) or size % local:
        return
    nodes = size // local
    if r.get("num_nodes") not in (None, nodes):
        return
    r.default("num_nodes", nodes, f"world size / local world size ({why})")
    r.default("node_rank", rank // local, f"rank // local world size ({why})")
    r.default("nproc_per_node", local, f"local world size ({why})")
