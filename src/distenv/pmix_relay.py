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

With the relay the query process talks to the server through this process: when the query
process finalizes and exits, the relay keeps the server's connection open and drains it. The
server sees the close when this process exits (the held socket survives ``exec``, so with
``distenv run`` when the command exits), long after it marked the client, so the close can
no longer overtake the mark.

Only for servers reached over TCP (``PMIX_SERVER_URI*`` = ``<nspace>.<rank>;tcp4://...`` or
``tcp6://``, all naming one address); otherwise `open_relay` returns None and the query
process connects directly, as before. The relay listens on loopback only while the query
runs, and reaches nothing a local process could not reach already (the server listens on the
same loopback). Standard library only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays out of `import distenv`
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping

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


class Relay:
    """Listens on loopback; each connection it accepts is joined to the server."""

    def __init__(self, environ: "Mapping[str, str]", family: int, host: str, port: int) -> None:
        import socket
        import threading

        self.upstream = (host, port)
        self.family = family
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1" if family == socket.AF_INET else "::1", 0))
        self.listener.listen(4)
        here = self.listener.getsockname()[1]
        scheme = "tcp4://127.0.0.1" if family == socket.AF_INET else "tcp6://[::1]"
        #: The query process's PMIX_SERVER_URI* (same server name, the relay's address).
        self.env = {key: value.partition(";")[0] + f";{scheme}:{here}"
                    for key, value in environ.items() if key.startswith(URI_PREFIX)}
        self.held: "list[socket.socket]" = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="distenv-pmix-relay", daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed: the query process has ended
                return
            threading.Thread(target=self._join, args=(client,), name="distenv-pmix-relay",
                             daemon=True).start()

    def _join(self, client: "socket.socket") -> None:
        import selectors
        import socket

        try:
            server = socket.create_connection(self.upstream, timeout=30)
            server.settimeout(None)
            # kept across exec (`distenv run` execs the command): the close then waits for
            # the command's end too; subprocess closes it in children it starts
            server.set_inheritable(True)
        except OSError:
            client.close()  # the query process sees the server unreachable, as without us
            return
        with self._lock:
            self.held.append(server)
        # a selector, not select(): a big process may hold descriptors beyond FD_SETSIZE
        with selectors.DefaultSelector() as sel:
            sel.register(client, selectors.EVENT_READ, server)
            sel.register(server, selectors.EVENT_READ, client)
            try:
                while True:  # both ways until the query process closes its end
                    for key, _ in sel.select():
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            if key.fileobj is server:
                                return  # the server closed first: nothing left to hold
                            raise EOFError  # the query process is done
                        key.data.sendall(data)
            except EOFError:
                pass
            except Exception:  # noqa: BLE001 - a broken pump must not hang the query process:
                return  # its end closes (below), it fails; the server's end stays held
            finally:
                client.close()
        try:  # hold the server's end open (and read what it still sends) until we exit
            while server.recv(65536):
                pass
        except OSError:
            pass

    def stop(self, drop: bool = False) -> None:
        """No more connections; with `drop`, also close those held (the query failed: the
        server must see the loss now, as it would without the relay)."""
        _close(self.listener)
        if drop:
            with self._lock:
                for server in self.held:
                    _close(server)
                self.held.clear()


def _close(sock: "socket.socket") -> None:
    """Close now, also when another thread waits in accept() or recv() on it (close alone
    leaves the connection open until that call returns)."""
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected (a listener on some systems), or already closed
        pass
    sock.close()


def open_relay(environ: "Mapping[str, str]") -> "Relay | None":
    """A started relay for the server `environ` names, or None (not TCP, no loopback, or
    ``DISTENV_PMIX_RELAY=0``: the query connects directly, for comparison or if the relay
    itself is in the way)."""
    if environ.get("DISTENV_PMIX_RELAY", "").strip().lower() in ("0", "no", "off", "false"):
        return None
    where = server_address(environ)
    if where is None:
        return None
    try:
        return Relay(environ, *where)
    except OSError as exc:
        from .log import get_logger

        get_logger(__name__).debug(f"PMIx relay not used ({exc}); the query connects directly")
        return None


__all__ = ["open_relay", "server_address", "Relay", "URI_PREFIX"]
