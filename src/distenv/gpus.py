"""Count the accelerators a process may use, without importing any framework."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping

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
