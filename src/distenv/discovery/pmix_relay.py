"""A loopback relay between the PMIx query process and the launcher's PMIx server: the
server's end of the query's connection stays open until this process (the rank) ends.

Why (measured under Open MPI 5.0.11, PMIx 5.0.11 in PRRTE, docs/discovery.md): the PMIx
server marks a client "finalized" in the daemon's own thread *after* it has queued the reply
to the client's ``PMIx_Finalize``. The client reads that reply and closes at once. When the
server's progress thread sees the close before the daemon's thread has set the mark, it
counts the rank as lost and lowers the namespace's local count (4 -> 3, seen in the server's
log of a hung job); every later fence then completes one contribution short, and the rank's
own ``MPI_Init`` waits forever in a fence the other ranks already left (about 1 job in 100
here; a client that never finalizes loses this way every time). The fix upstream moves that
callback into the server's thread (openpmix#3605); servers in use still have the race.

With the relay the query process talks to the server through the task's holder
(`distenv.discovery.holder`, a small exec'ed process): when the query process finalizes and exits, the
holder keeps the server's connection open and drains it. The server sees the close when the
task ends (the launcher's process: this one, or the job script that runs it; with ``distenv
run``, the command it execs), long after it marked the client, so the close can no longer
overtake the mark.

Only for servers reached over TCP (``PMIX_SERVER_URI*`` = ``<nspace>.<rank>;tcp4://...`` or
``tcp6://``, all naming one address); otherwise `open_relay` returns None and the query
process connects directly, as before. Who may connect: the listener is on loopback, only while
the query runs; the holder accepts only connections owned by this user (the kernel's
/proc/net/tcp), at most `MAX_CONNECTIONS`, and holds only those that carried the query (one
that never sent a byte is closed). It reaches nothing a local process could not reach already
(the server listens on the same loopback). Standard library only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays out of `import distenv`
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: The prefix of the variables that give the server's address, one per protocol version.
URI_PREFIX = "PMIX_SERVER_URI"


def server_address(environ: "Mapping[str, str]") -> "tuple[int, str, int] | None":
    """(address family, host, port) that every ``PMIX_SERVER_URI*`` names, or None when one
    is not TCP or they disagree."""
    import socket

    found = set()
    for key, value in environ.items():
        if not key.startswith(URI_PREFIX):
            continue
        _, sep, url = value.partition(";")
        scheme, _, where = url.partition("://")
        host, _, port = where.rpartition(":")
        if not sep or scheme not in ("tcp4", "tcp6") or not host or not port.isdigit():
            return None
        family = socket.AF_INET if scheme == "tcp4" else socket.AF_INET6
        found.add((family, host.strip("[]"), int(port)))
    return found.pop() if len(found) == 1 else None


#: Connections the relay accepts: the PMIx client opens one to its server (measured: one
#: accept per query under PRRTE and slurmstepd); one more in case it reconnects.
MAX_CONNECTIONS = 2


class Relay:
    """A loopback listener whose connections the task's holder joins to the server."""

    def __init__(self, environ: "Mapping[str, str]", family: int, host: str, port: int,
                 chain: Any = None) -> None:
        import os
        import socket

        from . import holder as _holder

        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1" if family == socket.AF_INET else "::1", 0))
        self.listener.listen(MAX_CONNECTIONS)
        here = self.listener.getsockname()[1]
        scheme = "tcp4://127.0.0.1" if family == socket.AF_INET else "tcp6://[::1]"
        #: The query process's PMIX_SERVER_URI* (same server name, the relay's address).
        self.env = {key: value.partition(";")[0] + f";{scheme}:{here}"
                    for key, value in environ.items() if key.startswith(URI_PREFIX)}
        task = chain.task if chain is not None else os.getpid()
        task_start = chain.task_start if chain is not None else _holder.start_time(task)
        try:
            self.holder = _holder.for_task(task, task_start,
                                           chain.daemon_id if chain is not None else None)
            got = self.holder.ask("pmix_relay", fds=[self.listener.fileno()], family=family,
                                  host=host, port=port, max=MAX_CONNECTIONS, uid=os.getuid())
            self.id = int(got["id"])
        finally:
            self.listener.close()  # the holder listens now

    def stop(self, drop: bool = False) -> None:
        """No more connections; with `drop`, also close those held (the query failed: the
        server must see the loss now, as it would without the relay)."""
        from . import holder as _holder

        try:
            self.holder.ask("pmix_done", id=self.id, drop=drop)
        except _holder.HolderError:
            pass


def open_relay(environ: "Mapping[str, str]", chain: Any = None) -> "Relay | None":
    """A started relay for the server `environ` names, held for `chain`'s task (default: this
    process), or None (not TCP, no holder, or ``DISTENV_PMIX_RELAY=0``: the query connects
    directly, for comparison or if the relay itself is in the way)."""
    from ..knobs import PMIX_RELAY

    if not PMIX_RELAY.value(environ):
        return None
    where = server_address(environ)
    if where is None:
        return None
    try:
        return Relay(environ, *where, chain=chain)
    except OSError as exc:  # HolderError too
        from ..log import get_logger

        get_logger(__name__).debug(f"PMIx relay not used ({exc}); the query connects directly")
        return None


__all__ = ["open_relay", "server_address", "Relay", "URI_PREFIX", "MAX_CONNECTIONS"]
