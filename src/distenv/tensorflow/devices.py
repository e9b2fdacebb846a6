"""Each process's devices and threads: its slice of the node's GPUs, its share of the cores."""

from __future__ import annotations

from ..core import gpus
from .. import knobs
from ..core.description import DistEnv
from ..errors import DistEnvError
from .cluster import _environ

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping

#: Set beside CUDA_VISIBLE_DEVICES when distenv narrowed it: a second look (patch() then
#: strategy(), or strategy() twice) must not narrow the slice again (the core's marker).
GPU_SLICE_VAR = gpus.GPU_SLICE_VAR


def gpu_assignment(d: DistEnv, environ: "Mapping[str, str] | None" = None) -> "tuple[str | None, str]":
    """(CUDA_VISIBLE_DEVICES for this process or None to leave it, why): the core's policy
    (`distenv.core.gpus.share`) with a slice of GPUs per process, which MirroredStrategy drives."""
    mine = gpus.share(d, _environ(environ), split=True)
    if mine.kind == gpus.UNKNOWN:
        raise DistEnvError(gpus.unknown_error(mine))
    if mine.kind == gpus.CROWDED:
        raise DistEnvError(
            f"{mine.why}: TensorFlow cannot split a GPU between processes. Fix: start one "
            "process per GPU, or one process per node (MultiWorkerMirroredStrategy then uses "
            "every local GPU)."
        )
    return (",".join(mine.ids) if mine.kind == gpus.SLICE else None), mine.why


def thread_counts(d: DistEnv) -> "tuple[int, int]":
    """(intra-op, inter-op) threads: this process's share of the cores it may run on
    (`distenv.knobs.core_share`)."""
    share, _ = knobs.core_share(d.local_world_size)
    return share, max(1, min(2, share))
