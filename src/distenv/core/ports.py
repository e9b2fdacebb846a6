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

Collisions: two jobs derive the same port with probability 1/SPAN (1e-4); among J jobs on one
host, 1 - (1 - 1e-4)^(J(J-1)/2): 0.06 % for 4, 0.45 % for 10, 11.5 % for 50. Where rank 0 can
look before it binds, it does (`bindable`, `free`): the PMI-1 exchange publishes a port rank 0
found free (`free`), and the bring-up of the torch family stops with the port's name on rank 0
when the derived port is taken there (`distenv.bringup`) instead of meeting another job.
"""

from __future__ import annotations

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    import socket

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


def free(start: int, tries: int = 64) -> "int | None":
    """The first port from `start` (wrapping within distenv.core.ports' range, 20000-29999, below
    the kernel's ephemeral ports) that this host lets a new listening socket bind, as
    torch's store binds it (SO_REUSEADDR, every address); None if `tries` ports are taken.
    A bind and a close: microseconds. Free now is not reserved: a program binding it before
    the store does still wins; but a job already listening there is avoided."""
    for i in range(tries):
        port = BASE + (start - BASE + i) % SPAN
        if bindable(port):
            return port
    return None


def bindable(port: int) -> bool:
    """True when a listening socket could bind `port` on every address, IPv6 (when this
    host has it) and IPv4 alike."""
    socks = bound(port)
    for s in socks:
        s.close()
    return bool(socks)


def bound(port: int, backlog: int = 0) -> "list[socket.socket]":
    """Sockets bound to `port` at every IPv4 address and, where this host has IPv6, every IPv6
    one, as torch's store binds them (SO_REUSEADDR), listening when `backlog` is given; []
    when the port is taken at one of them (nothing left open)."""
    import errno
    import socket  # lazy: only where rank 0 checks (resolve() opens no socket)

    socks = []
    for family, anywhere in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # (both open at once: IPv6 alone, not dual-stack)
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((anywhere, port))
            if backlog:
                s.listen(backlog)
            socks.append(s)
        except OSError as exc:
            s.close()
            if family == socket.AF_INET or exc.errno == errno.EADDRINUSE:
                for other in socks:
                    other.close()
                return []
    return socks
