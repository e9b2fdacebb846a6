"""A loopback relay between the PMIx query process and the launcher's PMIx server, run by the
rank while it waits for the query: the server's end of the query's connection stays open until
the task (the process the launcher started) ends.

Why (measured under Open MPI 5.0.11, PMIx 5.0.11 in PRRTE, docs/discovery.md): the PMIx
server marks a client "finalized" in the daemon's own thread *after* it has queued the reply
to the client's ``PMIx_Finalize``. The client reads that reply and closes at once. When the
server's progress thread sees the close before the daemon's thread has set the mark, it
counts the rank as lost and lowers the namespace's local count (4 -> 3, seen in the server's
log of a hung job); every later fence then completes one contribution short, and the rank's
own ``MPI_Init`` waits forever in a fence the other ranks already left (about 1 job in 100
here; a client that never finalizes loses this way every time). The fix upstream moves that
callback into the server's thread (openpmix#3605); servers in use still have the race.

With the relay the query process talks to the server through this process (`collect` pumps
both ways while it waits for the answer: no thread, no other process). When the query process
has finalized and exited, the server's end goes to a process that closes it only after the
task has ended: the close then comes long after the server marked the client, and can no
longer overtake the mark. Where this process is the task's only program (the launcher started
it, directly or through container starters), a `keeper`: ``cat`` reading a pipe this process
(and a program it execs) holds open. Where the task is a job script, the task's holder
(`distenv.discovery.holder`, ``hold``), which drains it and closes it when the script ends.
Kept in the rank itself instead (closed by the kernel at its exit), 6 of 60 two-node mpi4py
jobs under Open MPI 5 hung in their last fence, 13 of 60 with the end moved past every other
descriptor (measured 2026-12-07, `test_mpi4py_after_discovery`; 0 of 60 through the keeper, 0
of 50 through the holder; the cause was not found): the rank keeps it (`held`, inheritable)
only where neither can take it.

Only for servers reached over TCP (``PMIX_SERVER_URI*`` = ``<nspace>.<rank>;tcp4://...`` or
``tcp6://``, all naming one address); otherwise `open_relay` returns None and the query
process connects directly. Who may connect: the listener is on loopback, only while the query
runs; it accepts only connections owned by this user (the kernel's /proc/net/tcp), at most
`MAX_CONNECTIONS`, and holds only those that carried the query (one that never sent a byte is
closed). It reaches nothing a local process could not reach already (the server listens on
the same loopback). Standard library only; ``_socket``, not ``socket`` (whose import alone
cost a rank 2 ms of its 64-rank share).
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # typing stays out of `import distenv`
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: The prefix of the variables that give the server's address, one per protocol version.
URI_PREFIX = "PMIX_SERVER_URI"
#: Connections the relay accepts: the PMIx client opens one to its server (measured: one
#: accept per query under PRRTE and slurmstepd); one more in case it reconnects.
MAX_CONNECTIONS = 2

#: The server's ends this process holds (closed when it ends, or by the program it execs).
held: "list[Any]" = []


def server_address(environ: "Mapping[str, str]") -> "tuple[int, str, int] | None":
    """(address family, host, port) that every ``PMIX_SERVER_URI*`` names, or None when one
    is not TCP or they disagree."""
    import _socket

    found = set()
    for key, value in environ.items():
        if not key.startswith(URI_PREFIX):
            continue
        _, sep, url = value.partition(";")
        scheme, _, where = url.partition("://")
        host, _, port = where.rpartition(":")
        if not sep or scheme not in ("tcp4", "tcp6") or not host or not port.isdigit():
            return None
        family = _socket.AF_INET if scheme == "tcp4" else _socket.AF_INET6
        found.add((family, host.strip("[]"), int(port)))
    return found.pop() if len(found) == 1 else None


class Relay:
    """A loopback listener whose connections `collect` joins to the server."""

    def __init__(self, environ: "Mapping[str, str]", family: int, host: str, port: int) -> None:
        import _socket

        self.listener = _socket.socket(family, _socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1" if family == _socket.AF_INET else "::1", 0))
        self.listener.listen(MAX_CONNECTIONS)
        here = self.listener.getsockname()[1]
        scheme = "tcp4://127.0.0.1" if family == _socket.AF_INET else "tcp6://[::1]"
        #: The query process's PMIX_SERVER_URI* (same server name, the relay's address).
        self.env = {key: value.partition(";")[0] + f";{scheme}:{here}"
                    for key, value in environ.items() if key.startswith(URI_PREFIX)}
        self.server = (family, host, port)
        self.accepted = 0
        self.pairs: "list[list[Any]]" = []  # [query's end, server's end, carried a byte]
        self.ends: "dict[int, tuple[list[Any], int]]" = {}  # fd -> (pair, side)

    def fds(self) -> "list[int]":
        """The descriptors to watch for it (the listener while it listens, every open end)."""
        return ([self.listener.fileno()] if self.listener.fileno() >= 0 else []) + list(self.ends)

    def on(self, fd: int, deadline: float) -> None:
        """`fd` (one of `fds`) is readable."""
        if fd == self.listener.fileno():
            self._accept(deadline)
        elif fd in self.ends:
            self._pump(*self.ends[fd], deadline)

    def _accept(self, deadline: float) -> None:
        import _socket

        try:
            fd, peer = self.listener._accept()  # type: ignore[attr-defined]  # _socket: the C half
        except OSError:
            return
        client = _socket.socket(fileno=fd)
        local = client.getsockname()
        if tcp_owner((peer[0], peer[1]), (local[0], local[1])) != os.getuid():
            client.close()  # another user's: never joined to the server
            return
        self.accepted += 1
        if self.accepted >= MAX_CONNECTIONS:
            self.listener.close()
        family, host, port = self.server
        up = _socket.socket(family, _socket.SOCK_STREAM)
        try:  # every wait, the sends too, within the query's deadline
            for sock in (client, up):
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
            up.connect((host, port))
        except OSError:
            up.close()
            client.close()  # the query process sees the server unreachable, as without us
            return
        pair: "list[Any]" = [client, up, False]
        self.pairs.append(pair)
        self.ends[client.fileno()] = (pair, 0)
        self.ends[up.fileno()] = (pair, 1)

    def _pump(self, pair: "list[Any]", side: int, deadline: float) -> None:
        src, dst = pair[side], pair[1 - side]
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if data:
            pair[2] = True
            if dst is not None:
                try:  # within the query's deadline, not the time left at the accept
                    dst.settimeout(max(deadline - time.monotonic(), 0.01))
                    dst.sendall(data)
                except OSError:  # part of a message lost: the stream is broken, end both
                    self._close(pair, 0)
                    self._close(pair, 1)
            return
        self._close(pair, side)
        if side == 1 and pair[0] is not None:  # the server closed: nothing left to hold
            self._close(pair, 0)

    def _close(self, pair: "list[Any]", side: int) -> None:
        sock = pair[side]
        if sock is not None:
            self.ends.pop(sock.fileno(), None)
            sock.close()
            pair[side] = None

    def stop(self, drop: bool = False, task: "Any" = None, deadline: "float | None" = None) -> None:
        """The query has ended: no more connections; the server's ends that carried it are
        held until `task` (`distenv.discovery.chain`'s walk) ends: by a `keeper` when this
        process is the task's only program, else (a job script's) by the task's holder within
        what is left of the query's `deadline` (time.monotonic()), else here (`held`); with
        `drop` (the query failed) closed instead: the server must see the loss now, as it
        would without the relay."""
        self.listener.close()
        keep = []
        for pair in self.pairs:
            self._close(pair, 0)
            if pair[1] is not None and (drop or not pair[2]):
                self._close(pair, 1)
            elif pair[1] is not None:
                keep.append(pair[1])
        self.ends.clear()
        if not keep:
            return
        if task is not None and not task.wrapped and keeper(keep):
            return
        left = 30.0 if deadline is None else deadline - time.monotonic()
        if task is not None and left > 0:
            try:
                from . import holder

                h = holder.for_task(task.task, task.task_start, task.daemon_id, timeout=left)
                for sock in keep:
                    h.ask("hold", fds=[sock.fileno()])
                for sock in keep:
                    sock.close()  # the holder has its copy
                return
            except OSError as exc:  # HolderError too: held here, until this Python ends
                from ..log import get_logger

                get_logger(__name__).debug(f"PMIx relay: the task's holder did not take the "
                                           f"connection ({exc}); held until this process ends")
        # nobody else: held here until this process (or a program it execs) ends
        for sock in keep:
            held.append(_above_2(sock))


#: The keeper's program: it blocks reading its standard input and ends at its end of file.
KEEPER = ("/bin/cat", "/usr/bin/cat")
#: This process's end of each keeper's life line (inheritable: a program it execs keeps it).
lines: "list[int]" = []


def keeper(socks: "list[Any]") -> bool:
    """Hand `socks` to a keeper that closes them only after this process has ended: ``cat``
    started with them as extra descriptors and the read end of a pipe as its standard input,
    whose write end this process keeps (inheritable: a program it execs -- ``distenv run``'s
    command -- keeps it too). When the last holder of the write end is gone, ``cat`` reads
    the end of file and exits, and the kernel closes its copies: after this process's own
    descriptors, as the holder's close after the task's end (in the rank itself, closed at
    its own exit, 6 of 60 and 13 of 60 two-node mpi4py jobs under Open MPI 5 hung; through a
    keeper 0 of 60). Its cost: one posix_spawn (no fork of this process's memory; safe in
    a threaded process), about 1 MB; a holder costs an interpreter, about 30 ms of CPU, and
    behind a starter that gives every rank its own pid namespace every rank needed one
    (the query at 0.77x MPI_Init against 0.25x without). False where no ``cat`` can be
    started (nothing handed)."""
    try:
        read, write = os.pipe()
    except OSError:  # out of descriptors
        return False
    try:  # the kept end above 0-2: where this process closed its standard streams, a later
        # dup2 onto 1 (a daemon's) would close it, and every subprocess would get it as stdout
        write = _dup_above_2(write)
        sources = {read, *(s.fileno() for s in socks)}
        actions = _actions(read, write, socks, sources)
    except OSError:
        os.close(read)
        os.close(write)
        return False
    try:
        for path in KEEPER:
            try:
                # the signals a launcher sends the rank's process group (PRRTE, Ctrl-C) or
                # every process of a step (SLURM) blocked: the keeper lives while the rank
                # handles them (review: cat died first, and a SIGUSR1 left it a zombie)
                os.posix_spawn(path, ["cat"], {}, file_actions=actions, setsigmask=_SIGNALS)
                break
            except FileNotFoundError:
                continue
        else:
            os.close(write)
            return False
    except OSError:
        os.close(write)
        return False
    finally:
        os.close(read)
    os.set_inheritable(write, True)
    lines.append(write)
    for sock in socks:
        sock.close()  # the keeper has its copies
    return True


#: SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, SIGTERM (Linux numbers: the
#: `signal` module costs a rank milliseconds); the end of file and SIGKILL still end it.
_SIGNALS = (1, 2, 3, 10, 12, 13, 14, 15)


def _actions(read: int, write: int, socks: "list[Any]", sources: "set[int]") -> "list[tuple[Any, ...]]":
    """The keeper's descriptors: its sources above every number in use, then the life line's
    read end as its standard input, /dev/null as its output, nothing else of this process's."""
    # Nothing else of this process's: an inheritable descriptor a library left here (a pipe
    # its reader waits to see closed) would stay open in `cat` (closing one that is gone by
    # then is ignored). Then every source to a number above them all (a source may be 0-2
    # where this process has closed its standard streams), then the standard streams.
    actions: "list[tuple[Any, ...]]" = [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable()
                                        if fd > 2 and fd not in sources]
    base = max(write, *sources) + 1
    life = base + len(socks)
    actions += [(os.POSIX_SPAWN_DUP2, s.fileno(), base + i) for i, s in enumerate(socks)]
    actions += [(os.POSIX_SPAWN_DUP2, read, life), (os.POSIX_SPAWN_DUP2, life, 0),
                (os.POSIX_SPAWN_CLOSE, life), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, 1, 2)]
    return actions


def _dup_above_2(fd: int) -> int:
    """`fd` moved to a number above 2 (close-on-exec until made inheritable), or `fd` itself."""
    import fcntl

    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _above_2(sock: Any) -> Any:
    """`sock`, inheritable, at a number above 2 (a new socket object where it was moved)."""
    import _socket

    if sock.fileno() > 2:
        os.set_inheritable(sock.fileno(), True)
        return sock
    fd = _dup_above_2(sock.detach())
    os.set_inheritable(fd, True)
    return _socket.socket(fileno=fd)


def _inheritable() -> "list[int]":
    """This process's inheritable descriptors."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.get_inheritable(int(name)):
                out.append(int(name))
        except OSError:  # closed since it was listed (the listing's own descriptor among them)
            pass
    return out


def tcp_owner(local: "tuple[str, int]", remote: "tuple[str, int]") -> "int | None":
    """The uid owning the TCP socket whose local address is `local` and remote `remote`
    (the kernel's /proc/net/tcp and tcp6), or None when none is listed."""
    import _socket
    import sys

    def hexaddr(host: str, port: int, six: bool) -> str:
        if ":" in host:
            if not six:
                raise ValueError(host)
            raw = _socket.inet_pton(_socket.AF_INET6, host)
        else:
            raw = _socket.inet_pton(_socket.AF_INET, host)
            if six:
                raw = b"\0" * 10 + b"\xff\xff" + raw  # ::ffff:a.b.c.d
        # the kernel prints each 32-bit word in host order
        words = [raw[i:i + 4][::-1] if sys.byteorder == "little" else raw[i:i + 4]
                 for i in range(0, len(raw), 4)]
        return b"".join(words).hex().upper() + f":{port:04X}"

    for six, table in ((False, "/proc/net/tcp"), (True, "/proc/net/tcp6")):
        try:
            want = (hexaddr(*local, six), hexaddr(*remote, six))
        except (ValueError, OSError):
            continue
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) > 7 and (parts[1], parts[2]) == want:
                        return int(parts[7])
        except (OSError, StopIteration, ValueError):
            continue
    return None


def collect(fd: int, deadline: float, relay: "Relay | None") -> "bytes | None":
    """Everything written to `fd` until its writers close it (the query process has ended),
    relaying meanwhile; None when `deadline` passes first."""
    import select

    chunks: "list[bytes]" = []
    poll = select.poll()  # not select(): a rank may hold descriptors past 1023
    watched: "set[int]" = set()
    while True:
        want = {fd, *(relay.fds() if relay is not None else ())}
        for gone in watched - want:
            poll.unregister(gone)
        for new in want - watched:
            poll.register(new, select.POLLIN)
        watched = want
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        for ready, _ in poll.poll(left * 1000):
            if ready == fd:
                data = os.read(fd, 65536)
                if not data:
                    return b"".join(chunks)
                chunks.append(data)
            elif relay is not None:
                relay.on(ready, deadline)


def open_relay(environ: "Mapping[str, str]") -> "Relay | None":
    """A started relay for the server `environ` names, or None (not TCP, no loopback, or
    ``DISTENV_PMIX_RELAY=0``: the query connects directly, for comparison or if the relay
    itself is in the way)."""
    from ..knobs import PMIX_RELAY

    if not PMIX_RELAY.value(environ):
        return None
    where = server_address(environ)
    if where is None:
        return None
    try:
        return Relay(environ, *where)
    except OSError as exc:
        from ..log import get_logger

        get_logger(__name__).debug(f"PMIx relay not used ({exc}); the query connects directly")
        return None


__all__ = ["open_relay", "collect", "server_address", "held", "keeper", "lines", "Relay", "URI_PREFIX",
           "MAX_CONNECTIONS"]
