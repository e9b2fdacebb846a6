"""Each process's devices and threads: its slice of the node's GPUs, its share of the cores."""

from __future__ import annotations

from .. import knobs
from ..description import PER_NODE, DistEnv
from ..errors import DistEnvError
from .cluster import _environ

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping

#: Set beside CUDA_VISIBLE_DEVICES when distenv narrowed it: a second look (patch() then
#: strategy(), or strategy() twice) must not narrow the slice again.
GPU_SLICE_VAR = "DISTENV_GPU_SLICE"


def gpu_assignment(d: DistEnv, environ: "Mapping[str, str] | None" = None) -> "tuple[str | None, str]":
    """(CUDA_VISIBLE_DEVICES for this process or None to leave it, why)."""
    from ..gpus import visible_gpus

    src = _environ(environ)
    count, why = visible_gpus(src)
    local, lsize = d.local_rank, d.local_world_size
    if count == 0:
        return None, why
    if src.get(GPU_SLICE_VAR) is not None and src.get(GPU_SLICE_VAR) == src.get("CUDA_VISIBLE_DEVICES"):
        return None, f"distenv already gave this process its GPUs ({GPU_SLICE_VAR}={src[GPU_SLICE_VAR]!r})"
    if d.launch == PER_NODE or not lsize or lsize == 1 or local is None:
        return None, f"one process on this node uses all {count} GPU(s) ({why})"
    given = src.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in given.split(",")][:count] if given else [str(i) for i in range(count)]
    if count < lsize:
        if count == 1 and given is not None:
            return None, f"the scheduler gave this process its own GPU ({why})"
        raise DistEnvError(
            f"{lsize} processes on this node share {count} GPU(s) ({why}): TensorFlow cannot "
            "split a GPU between processes. Fix: start one process per GPU, or one process per "
            "node (MultiWorkerMirroredStrategy then uses every local GPU)."
        )
    per = count // lsize
    mine = ids[local * per:(local + 1) * per]
    return ",".join(mine), f"local rank {local} of {lsize} takes {per} of {count} GPU(s) ({why})"


def thread_counts(d: DistEnv) -> "tuple[int, int]":
    """(intra-op, inter-op) threads: this process's share of the cores it may run on
    (`distenv.knobs.core_share`)."""
    share, _ = knobs.core_share(d.local_world_size)
    return share, max(1, min(2, share))
