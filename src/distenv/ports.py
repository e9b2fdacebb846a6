"""The master-port rule: one port every rank computes alike, different across concurrent jobs.

1. An explicit value wins: ``resolve(master_port=...)``, then ``MASTER_PORT`` from the
   environment (the user's, or the launcher's, e.g. torchrun, Kubeflow, Azure ML).
2. Otherwise a port derived from the job's identity (SLURM job and step id, the Open MPI
   job id, PMIx namespace, Flux/LSF/PBS job id, ...): ``BASE + fnv1a(key) % SPAN``
   (FNV-1a with a final avalanche mix).
   Every rank of a job sees the same key; two jobs on one machine almost never do.
3. A single process with no job id derives its port from its process id (it has no peer
   to agree with, and two single-process runs on one machine must not collide).
4. Otherwise torch's default, 29500.

The derived range 20000-29999 lies below Linux's ephemeral ports (32768+), so a port the
kernel handed to an unrelated outgoing connection cannot take it.
"""

from __future__ import annotations

BASE = 20000
SPAN = 10000
TORCH_DEFAULT = 29500


def fnv1a(text: str) -> int:
    """32-bit FNV-1a with murmur3's final mix: tiny, stable across Python runs (unlike
    hash()). The mix matters: plain FNV-1a's low bit is the parity of the bytes, so keys
    of one shape (Open MPI job ids) all landed on odd ports."""
    h = 0x811C9DC5
    for byte in text.encode("utf-8", "surrogatepass"):
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def port_for(key: str) -> int:
    return BASE + fnv1a(key) % SPAN
