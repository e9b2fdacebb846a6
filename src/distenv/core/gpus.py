"""The accelerators a process may use, without importing any framework: how many are visible
(`visible_gpus`), and which of them each process takes (`share`, `one_device`), the one device
policy of the torch, JAX and TensorFlow adapters."""

from __future__ import annotations

import os

from .. import knobs

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from .description import DistEnv

# Module attributes so tests can point them at a directory they control.
NVIDIA_DIR = "/proc/driver/nvidia/gpus"
VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _count_list(value: str) -> int:
    # CUDA stops at the first invalid entry ("0,1,-1,2" exposes two devices).
    count = 0
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-") or item == "NoDevFiles":
            break
        count += 1
    return count


def visible_gpus(env: "Mapping[str, str]") -> "tuple[int, str]":
    """(count, why). A *_VISIBLE_DEVICES variable is the scheduler's word; else the driver's."""
    for var in VISIBLE_VARS:
        value = env.get(var)
        if value is not None:
            return _count_list(value), f"{var}={value!r}"
    try:
        count = len([d for d in os.listdir(NVIDIA_DIR) if not d.startswith(".")])
    except OSError:
        return 0, "no GPU visible (no CUDA_VISIBLE_DEVICES, no NVIDIA driver entries)"
    return count, f"{count} NVIDIA GPU(s) listed in {NVIDIA_DIR}"


# -- which GPUs a process takes: one policy for every adapter (torch, JAX, TensorFlow) ---------
#: Written beside CUDA_VISIBLE_DEVICES when an adapter narrowed it to this process's GPUs: a
#: second look (patch() then strategy(), initialize() twice) must not narrow the slice again.
GPU_SLICE_VAR = knobs.GPU_SLICE

# What `share` and `one_device` decide (`Share.kind`).
NONE = "none"        # no GPU visible
GIVEN = "given"      # distenv already narrowed CUDA_VISIBLE_DEVICES to this process's GPUs
NODE = "node"        # a per-node launch: the node's one process drives every GPU
ALONE = "alone"      # one process on its node (or its local rank unknown): every GPU
OWN = "own"          # fewer GPUs than local processes, but the scheduler narrowed them per task
SLICE = "slice"      # the local rank's part of the node's GPUs
CROWDED = "crowded"  # more local processes than GPUs, nothing narrowed: the adapter refuses
UNKNOWN = "unknown"  # several GPUs, but this process's local rank (or share) is unknown: refused


class Share:
    """Which of the visible GPUs this process takes, and why.

    `positions` number the GPUs as the framework sees them (after CUDA_VISIBLE_DEVICES), `ids`
    are the same GPUs as CUDA_VISIBLE_DEVICES entries (to narrow it to them); both are empty
    for NONE and CROWDED. `count` GPUs are visible (`seen` says who says so)."""

    __slots__ = ("kind", "positions", "count", "why", "seen", "_listed")

    def __init__(self, kind: str, positions: "Iterable[int]", count: int, why: str, seen: str,
                 listed: "Sequence[str]") -> None:
        self.kind, self.positions, self.count = kind, tuple(positions), count
        self.why, self.seen, self._listed = why, seen, listed

    @property
    def ids(self) -> "tuple[str, ...]":
        return tuple(self._listed[p] for p in self.positions if p < len(self._listed))

    def __repr__(self) -> str:
        return f"Share({self.kind}, positions={self.positions}, ids={self.ids}, why={self.why!r})"


def _listed(env: "Mapping[str, str]", count: int) -> "list[str]":
    """The visible GPUs as CUDA_VISIBLE_DEVICES entries (0..count-1 when it is unset)."""
    given = env.get("CUDA_VISIBLE_DEVICES")
    return [x.strip() for x in given.split(",")][:count] if given else [str(i) for i in range(count)]


def one_device(d: "DistEnv", count: int, env: "Mapping[str, str]", seen: str = "") -> Share:
    """One device per process (torch; JAX per process): local rank N takes device N of the
    `count` the framework sees. With fewer devices than local processes, a narrowed
    CUDA_VISIBLE_DEVICES (srun --gpus-per-task) or a lone device is this process's own: it takes
    the first. Neither a per-node launch nor GPU_SLICE_VAR is looked at (`share` does)."""
    if count <= 0:
        return Share(NONE, (), 0, "no CUDA device visible", seen, ())
    listed = _listed(env, count)
    local, nlocal = d.local_rank, d.local_world_size
    if local is None:
        if count > 1 and d.world_size != 1:
            return _unknown(d, count, seen, listed, "local rank")
        local, nlocal = 0, 1  # a lone process, or one device: the first is the only choice
    # Local rank N proves N+1 processes on this node; with the count unknown, N's own device
    # is still N (every local rank takes its own number).
    of = nlocal if nlocal is not None else f"at least {local + 1}"
    nlocal = nlocal if nlocal is not None else local + 1
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if count >= nlocal:
        return Share(SLICE, (local,), count,
                     f"local rank {local} of {of} takes device {local} of {count}", seen, listed)
    if visible is not None or count == 1:
        return Share(OWN, (0,), count, f"{count} device(s) for {nlocal} local processes: "
                     f"CUDA_VISIBLE_DEVICES={visible!r} was narrowed per task, take its first",
                     seen, listed)
    return Share(CROWDED, (), count, f"{nlocal} processes on this node share {count} GPU(s)"
                 + (f" ({seen})" if seen else ""), seen, listed)


def _unknown(d: "DistEnv", count: int, seen: str, listed: "Sequence[str]", what: str) -> Share:
    """UNKNOWN: several GPUs, and which are this process's is not known (`unknown_error`)."""
    field = "local_rank" if what == "local rank" else "local_world_size"
    return Share(UNKNOWN, (), count, (
        f"{count} GPUs visible{f' ({seen})' if seen else ''} but this process's {what} is "
        f"unknown ({d.provenance.get(field) or 'not revealed'}): which GPUs are its own is not "
        "known"), seen, listed)


def unknown_error(got: Share, instead: str = "") -> str:
    """The refusal of an UNKNOWN share, in one wording for every adapter; `instead` is the
    framework's own way out."""
    return (f"{got.why}. Fix: set LOCAL_RANK and LOCAL_WORLD_SIZE where RANK is set by hand, "
            "launch with a launcher that gives each process its local rank and count (mpirun, "
            "srun, torchrun), give each process its own GPUs (CUDA_VISIBLE_DEVICES, srun "
            "--gpus-per-task), "
            f"{'' if instead else 'or '}start one process per node (DISTENV_NPROC_PER_NODE)"
            f"{f', or {instead}' if instead else ''}.")


def device_index(d: "DistEnv", count: int, env: "Mapping[str, str]", instead: str
                 ) -> "tuple[int | None, str]":
    """(this process's device among the `count` a framework sees, or None for none; why):
    `one_device` for the frameworks that pin one device per process (torch, Horovod). More
    local processes than devices with nothing narrowed is an error, never two processes on one
    GPU (NCCL refuses a duplicate GPU); `instead` ends its Fix (the framework's CPU way out)."""
    from ..errors import DistEnvError

    got = one_device(d, count, env)
    if got.kind == UNKNOWN:
        raise DistEnvError(unknown_error(got, instead))
    if got.kind == CROWDED:
        nlocal = d.local_world_size
        raise DistEnvError(
            f"{nlocal} processes on this node (local_world_size={nlocal}, "
            f"{d.provenance.get('local_world_size', '')}) but only {count} CUDA devices "
            "visible and CUDA_VISIBLE_DEVICES is unset. Fix: start one process per GPU "
            f"(e.g. -np {count} per node), give each task its own GPUs (srun --gpus-per-task), "
            f"or {instead}."
        )
    return (got.positions[0] if got.positions else None), got.why


def share(d: "DistEnv", env: "Mapping[str, str]", split: bool = False) -> Share:
    """The GPUs of `visible_gpus(env)` this process takes.

    Every GPU when distenv already narrowed the list (GPU_SLICE_VAR equals CUDA_VISIBLE_DEVICES)
    or in a per-node launch; else `one_device`, or with `split` (TensorFlow: a process drives
    its slice through MirroredStrategy) an even slice per local process -- every GPU for a lone
    process, and, since a GPU cannot be split, CROWDED with fewer GPUs than local processes
    unless the scheduler narrowed the list to one."""
    from .description import PER_NODE

    count, seen = visible_gpus(env)
    listed = _listed(env, count)
    if count == 0:
        return Share(NONE, (), 0, seen, seen, listed)
    every = range(count)
    given = env.get(GPU_SLICE_VAR)
    if given is not None and given == env.get("CUDA_VISIBLE_DEVICES"):
        return Share(GIVEN, every, count, f"distenv already gave this process its "
                     f"GPU{'s' if split else ''} ({GPU_SLICE_VAR}={given!r})", seen, listed)
    alone = f"one process on this node uses all {count} GPU(s) ({seen})"
    if d.launch == PER_NODE:
        return Share(NODE, every, count, alone if split else
                     f"per-node launch: this process owns all {count} GPU(s) ({seen})", seen, listed)
    if not split:
        return one_device(d, count, env, seen)
    local, nlocal = d.local_rank, d.local_world_size
    if nlocal == 1 or d.world_size == 1:
        return Share(ALONE, every, count, alone, seen, listed)
    if count == 1 and env.get("CUDA_VISIBLE_DEVICES") is not None and (local is None or not nlocal):
        return Share(OWN, every, count, f"the scheduler gave this process its own GPU ({seen})",
                     seen, listed)
    if local is None:
        return _unknown(d, count, seen, listed, "local rank")
    if not nlocal:  # local rank N: N+1 processes at least, so not every GPU is this one's
        return _unknown(d, count, seen, listed, "number of processes on its node")
    if count < nlocal:
        if count == 1 and env.get("CUDA_VISIBLE_DEVICES") is not None:
            return Share(OWN, every, count, f"the scheduler gave this process its own GPU ({seen})",
                         seen, listed)
        return Share(CROWDED, (), count, f"{nlocal} processes on this node share {count} GPU(s) "
                     f"({seen})", seen, listed)
    per = count // nlocal
    return Share(SLICE, range(local * per, (local + 1) * per), count,
                 f"local rank {local} of {nlocal} takes {per} of {count} GPU(s) ({seen})", seen, listed)
