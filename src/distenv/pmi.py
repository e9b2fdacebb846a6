"""The launcher's own key-value service: Hydra's simple PMI-1 wire protocol (MPICH, Intel MPI).

Across nodes, MPICH and Intel MPI reveal nothing about where rank 0 runs. But every rank Hydra
starts holds a connection to its launcher's key-value service (the one MPI_Init uses to
exchange business cards). `exchange()` uses it, standard library only: each rank publishes
its host name, one barrier, then reads every rank's -- which proves the master address, the
node of every rank, the node count and the local counts (`distenv.discovery.complete`).

The wire protocol, as measured here with MPICH 4.0 (Debian), MPICH 5 (PyPI) and Intel MPI
2021.18 (PyPI `impi-rt`), each `mpiexec` on one and on two nodes. Lines are
``cmd=NAME key=value ...``, newline-terminated, keys in any order (MPICH 5 puts ``rc=0``
first, adds ``tag=`` to ``barrier_out``; MPICH 4 and Intel add ``msg=``):

=========================================  =================================================
sent                                       answer
=========================================  =================================================
(``-pmi-port`` only, first)                ``cmd=initack``, then ``cmd=set size=N``,
``cmd=initack pmiid=<PMI_ID>``             ``cmd=set rank=R``, ``cmd=set debug=0``
``cmd=init pmi_version=1 pmi_subversion=1``  ``cmd=response_to_init ... rc=0``
``cmd=get_my_kvsname``                     ``cmd=my_kvsname kvsname=K``
``cmd=put kvsname=K key=k value=v``        ``cmd=put_result rc=0``
``cmd=barrier_in``                         ``cmd=barrier_out`` (when every rank came)
``cmd=get kvsname=K key=k``                ``cmd=get_result rc=0 value=v`` (rc=-1: no such key)
``cmd=finalize``                           ``cmd=finalize_ack``
=========================================  =================================================

Two modes. **PMI_FD** (Hydra's default; the only one Intel MPI's hydra offers -- its mpiexec
rejects ``-pmi-port``): the proxy hands each rank one end of a Unix socket pair, number
``PMI_FD``. **-pmi-port** (MPICH): ``PMI_PORT=<proxy host>:<port>`` and ``PMI_ID`` (the rank;
there is no ``PMI_SIZE``, the handshake gives the size).

What keeps the service usable afterwards, and the job's end clean (measured, MPICH 4 and 5,
Intel MPI, one and two nodes):

* A later ``cmd=init`` (mpi4py's ``MPI_Init``, Horovod, an MPI program) works after ours --
  on the same PMI_FD, or with -pmi-port on a new connection while ours stays open. But a
  ``finalize`` before it breaks it: the proxy closes PMI_FD ("Unable to write to PMI_fd"),
  and with -pmi-port MPICH 4's proxy crashed ("double free").
* Not finalizing is no better: with -pmi-port a connection closed without ``finalize``
  makes Hydra kill the job ("BAD TERMINATION ... EXIT CODE: 9"); with PMI_FD Intel MPI
  kills it when a rank that sent ``init`` exits without ``finalize`` (MPICH does not mind).
* So a watcher process (`_hold`: forked twice, holding only the connection) waits for the
  rank to end -- however it ends: return, ``os._exit``, an ``exec``'ed program's exit --
  then sends ``finalize``. Every combination above then exits 0.
* Timeouts make a socket non-blocking, a flag PMI_FD shares with our duplicate: it is put
  back, or MPI_Init's blocking read fails ("Resource temporarily unavailable", measured).

Guards (a connection used by two processes corrupts the protocol for both): distenv uses the
service only in a process Hydra's proxy started itself -- its parent is ``hydra_pmi_proxy``
(the name of MPICH 4's, MPICH 5's and Intel MPI's proxy, measured) and, with PMI_FD, the fd
is a socket whose peer (SO_PEERCRED) is that parent. A child of a rank (a DataLoader
worker, a subprocess, Lightning's or torch's launchers) has the rank as its parent and
never qualifies, whatever it inherited; so does a rank started through a shell script that
does not ``exec`` (then set MASTER_ADDR, or ``exec python ...`` in the script). A process
that ran the exchange never runs it again (the answer is kept). ``distenv run`` passes
``DISTENV_PMI_HELD`` (its pid and what it found) to the command it execs: same pid, same
rank, so the command completes from that without communicating (`inherited`), and any
other process that inherits the variable refuses the service. ``DISTENV_PMI=0`` turns the
exchange off.

Cost (benchmarks/bench_pmi.py): one ``put``, one barrier and one ``get`` per rank of the
job, each answered by the local proxy.

Never called by `resolve()`: adapters call `distenv.discovery.complete()` where
communication is about to happen anyway.
"""

from __future__ import annotations

import os
import socket
import time

from .errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: The process name (/proc/<pid>/comm) of Hydra's proxy: MPICH 4.0, MPICH 5, Intel MPI 2021.
PROXY_NAMES = ("hydra_pmi_proxy",)
#: The environment variable `distenv run` passes to the command it execs ("<pid>[:<fd>]").
HELD_VAR = "DISTENV_PMI_HELD"
#: Key prefix in the job's key-value space (MPICH's own keys are P<rank>-businesscard, ...).
KEY = "distenv-host"


class PMIError(DistEnvError):
    """The key-value exchange failed or timed out."""


class Offer:
    """How this process reaches its launcher's service: ``mode`` "fd" or "port"."""

    __slots__ = ("mode", "fd", "addr", "pmiid", "rank", "size", "why")

    def __init__(self, mode: str, why: str, fd: "int | None" = None,
                 addr: "tuple[str, int] | None" = None, pmiid: "int | None" = None,
                 rank: "int | None" = None, size: "int | None" = None) -> None:
        self.mode, self.why, self.fd, self.addr, self.pmiid = mode, why, fd, addr, pmiid
        self.rank, self.size = rank, size

    def __repr__(self) -> str:
        return f"Offer({self.mode!r}, {self.why!r})"


def _int(environ: "Mapping[str, str]", name: str) -> "int | None":
    raw = environ.get(name)
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def offer(environ: "Mapping[str, str] | None" = None) -> "tuple[Offer | None, str]":
    """(how to reach the service, why) or (None, why not). Reads /proc and fstat's the fd:
    call it only where communication is about to happen."""
    environ = os.environ if environ is None else environ
    if environ.get("DISTENV_PMI", "").strip().lower() in ("0", "no", "off", "false"):
        return None, "DISTENV_PMI=0"
    if "MPI_LOCALRANKID" not in environ:  # Hydra's own marker (the source's detect())
        return None, "not started by Hydra (no MPI_LOCALRANKID)"
    has_fd, has_port = "PMI_FD" in environ, "PMI_PORT" in environ and "PMI_ID" in environ
    if not (has_fd or has_port):
        return None, "Hydra gave no PMI_FD nor PMI_PORT/PMI_ID"
    held = environ.get(HELD_VAR)
    if held:
        pid = held.split(";", 1)[0]
        if pid != str(os.getpid()):
            return None, (f"{HELD_VAR}: the service belongs to process {pid}, an ancestor of "
                          "this one")
        return None, f"{HELD_VAR}: this process used the service before it exec'ed"
    parent = os.getppid()
    name = _comm(parent)
    if name not in PROXY_NAMES:
        return None, (f"the parent process ({parent}, {name or 'unknown'}) is not Hydra's "
                      "proxy: the PMI variables were inherited, and the connection belongs "
                      "to an ancestor (start the program with `exec` from a wrapper script)")
    rank = _int(environ, "PMI_RANK")
    size = _int(environ, "PMI_SIZE")
    if has_fd:
        fd = _int(environ, "PMI_FD")
        if fd is None:
            return None, f"PMI_FD={environ['PMI_FD']!r} is not a descriptor number"
        try:
            import stat

            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                return None, f"PMI_FD={fd} is not a socket in this process"
            peer = _peer_pid(fd)
        except OSError as exc:
            return None, f"PMI_FD={fd} is not open in this process ({exc.strerror})"
        if peer is not None and peer != parent:
            return None, (f"PMI_FD={fd} is connected to process {peer}, not to the parent "
                          f"proxy {parent}")
        return Offer("fd", f"PMI_FD={fd} from Hydra's proxy (pid {parent})", fd=fd,
                     rank=rank, size=size), ""
    host, _, port = environ["PMI_PORT"].rpartition(":")
    pmiid = _int(environ, "PMI_ID")
    if not host or not port.isdigit() or pmiid is None:
        return None, (f"PMI_PORT={environ['PMI_PORT']!r} / PMI_ID={environ.get('PMI_ID')!r} "
                      "are not <host>:<port> and a number")
    return Offer("port", f"PMI_PORT={environ['PMI_PORT']} PMI_ID={pmiid} (Hydra -pmi-port)",
                 addr=(host, int(port)), pmiid=pmiid, rank=pmiid if rank is None else rank,
                 size=size), ""


def _peer_pid(fd: int) -> "int | None":
    import struct

    s = socket.socket(fileno=os.dup(fd))
    try:
        if s.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
            return None
        raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer: int = struct.unpack("3i", raw)[0]  # struct's answer is Any; "3i": ints
        return peer
    finally:
        s.close()


# -- the connection ---------------------------------------------------------------------------
class _Conn:
    """One PMI-1 conversation; every read ends by `deadline` (time.monotonic())."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.buf = sock, deadline, b""

    def send(self, line: str) -> None:
        self.sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
        self.sock.sendall(line.encode() + b"\n")

    def recv(self, expect: str) -> "dict[str, str]":
        """The next answer, parsed; ``cmd`` must be `expect`."""
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the launcher closed the connection")
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        fields = dict(part.partition("=")[::2] for part in line.decode(errors="replace").split())
        if fields.get("cmd") != expect:
            raise PMIError(f"the launcher answered {line[:200]!r} where cmd={expect} was due")
        return fields

    def call(self, line: str, expect: str) -> "dict[str, str]":
        self.send(line)
        return self.recv(expect)


_held: "int | None" = None   # pid of the process whose connection a watcher holds
_kept: "list[socket.socket]" = []  # connections kept here when no watcher could be forked
_done: "tuple[int, Exchange] | None" = None   # (pid, Exchange): one exchange per process
_generation = 0


def _hold(sock: socket.socket) -> None:
    """Keep the connection open until this process ends, then send ``finalize``.

    Measured: with -pmi-port (MPICH 4, 5) a connection closed without ``finalize`` makes
    Hydra kill the job; with PMI_FD, Intel MPI kills it when a rank that sent ``init``
    exits without ``finalize`` (MPICH does not mind). A ``finalize`` sent while the process
    lives would break a later MPI_Init (see the module doc), so it is sent after.

    A watcher process holds it: forked twice (so it is nobody's child: a shell that `wait`s
    for its children, or a program `distenv run` exec'ed, never waits for it), with no
    descriptor but the connection (so Hydra's output forwarding ends with the rank), it
    waits for this process to end -- however it ends: return, ``os._exit``, an ``exec`` and
    the new program's exit -- then sends ``finalize`` and closes. An ``atexit`` handler in
    this process would miss ``os._exit`` and ``exec`` (Hydra then kills the job).
    """
    global _held
    import select  # imported before forking: the child must not import (import lock)

    watched = os.getpid()
    keep = sock.fileno()
    try:
        pid = os.fork()
    except OSError as exc:  # no process to spare: keep the connection here, open until exit
        from .log import get_logger

        _kept.append(sock)
        get_logger(__name__).warning(
            f"no watcher process for the launcher's connection ({exc.strerror}): if this rank "
            "ends first, Hydra may end the job as failed")
        return
    if pid == 0:  # first child: fork the watcher and leave at once
        try:
            if os.fork() == 0:
                _watch(watched, keep, select)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    sock.close()  # the watcher holds the connection now
    _held = watched


def _watch(watched: int, keep: int, select: Any) -> None:
    """The watcher (see `_hold`): never returns."""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
        try:
            pidfd = os.pidfd_open(watched)
        except (AttributeError, OSError):  # before Linux 5.3: poll for the pid instead
            pidfd = None
        if pidfd is not None:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll()
        else:
            while True:
                try:
                    os.kill(watched, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
        sock = socket.socket(fileno=keep)
        conn = _Conn(sock, time.monotonic() + 5.0)
        conn.call("cmd=finalize", "finalize_ack")
        sock.close()
    except BaseException:  # noqa: BLE001 - nobody to report to; Hydra sees the close
        pass
    os._exit(0)


def handoff() -> "str | None":
    """The value of `HELD_VAR` for a command this process is about to exec (``distenv run``):
    ``<pid>;<mode>;<kvsname>;<host>*<count>,...`` (the hosts of ranks 0.. in runs), or None
    when this process ran no exchange. Exec keeps the pid: the command is the same rank."""
    if not used():
        return None
    ex = _done[1]  # type: ignore[index]  # used() proved _done is set
    runs: "list[list[Any]]" = []  # [host, count]
    for host in ex.hosts:
        if runs and runs[-1][0] == host:
            runs[-1][1] += 1
        else:
            runs.append([host, 1])
    return (f"{os.getpid()};{ex.mode};{ex.kvsname or ''};"
            + ",".join(f"{h}*{n}" for h, n in runs))


def inherited(environ: "Mapping[str, str] | None" = None) -> "Exchange | None":
    """The exchange this same process (same pid) ran before it exec'ed, from `HELD_VAR`."""
    environ = os.environ if environ is None else environ
    parts = environ.get(HELD_VAR, "").split(";")
    if len(parts) != 4 or parts[0] != str(os.getpid()) or parts[1] not in ("fd", "port"):
        return None
    hosts = []
    try:
        for run in parts[3].split(","):
            host, _, count = run.rpartition("*")
            if not host or int(count) < 1:
                return None
            hosts.extend([host] * int(count))
    except ValueError:
        return None
    rank = _int(environ, "PMI_RANK")
    if rank is None:
        rank = _int(environ, "PMI_ID")
    if rank is None or rank >= len(hosts):
        return None
    return Exchange(rank, len(hosts), hosts, parts[1], 0.0, f"{HELD_VAR} (before exec)",
                    parts[2] or None)


def used() -> bool:
    """True when this process has run the exchange."""
    return _done is not None and _done[0] == os.getpid()


class Exchange:
    """What the exchange found: ``hosts[r]`` is rank r's host name."""

    __slots__ = ("rank", "size", "hosts", "mode", "seconds", "why", "kvsname")

    def __init__(self, rank: int, size: int, hosts: "list[str]", mode: str, seconds: float,
                 why: str, kvsname: "str | None" = None) -> None:
        self.rank, self.size, self.hosts, self.mode = rank, size, hosts, mode
        self.seconds, self.why, self.kvsname = seconds, why, kvsname

    def __repr__(self) -> str:
        return f"Exchange(rank={self.rank}, size={self.size}, mode={self.mode!r}, hosts={self.hosts!r})"


def _check_value(value: str) -> str:
    if not value or any(c.isspace() or c == "=" for c in value) or len(value) > 1000:
        raise PMIError(f"host name {value!r} cannot travel as a PMI-1 value (spaces, '=' or "
                       "too long). Fix: set MASTER_ADDR (and NODE_RANK) instead.")
    return value


def exchange(environ: "Mapping[str, str] | None" = None, timeout: "float | None" = None,
             found: "Offer | None" = None) -> Exchange:
    """Every rank publishes its host name, one barrier, every rank reads all. Collective:
    every rank of the job must call it. `timeout` seconds (default DISTENV_TIMEOUT, else
    180) bound the whole exchange; a rank that never comes makes the others raise `PMIError`
    naming the ranks whose host never appeared. Returns the same answer when called again
    in this process (the exchange runs once)."""
    global _done, _generation
    environ = os.environ if environ is None else environ
    if _done is not None and _done[0] == os.getpid():
        return _done[1]
    if found is None:
        found, why_not = offer(environ)
        if found is None:
            raise PMIError(f"the launcher's key-value service cannot be used here: {why_not}.")
    if timeout is None:
        from .knobs import timeout as wait  # DISTENV_TIMEOUT's one parser

        timeout = wait(environ)
    start = time.monotonic()
    deadline = start + timeout
    host = _check_value(socket.gethostname())
    sock: "socket.socket | None"
    flags: "int | None"
    sock = flags = None
    try:
        if found.mode == "fd":
            import fcntl

            # Timeouts make a socket non-blocking, and that flag belongs to the open file the
            # duplicate shares with PMI_FD: left set, MPI_Init's blocking read fails at once
            # ("Error reading initack ... Resource temporarily unavailable", measured with
            # MPICH 4 across nodes). It is put back however the exchange ends.
            flags = fcntl.fcntl(found.fd, fcntl.F_GETFL)  # type: ignore[arg-type]  # "fd": fd set (offer())
            sock = socket.socket(fileno=os.dup(found.fd))  # type: ignore[arg-type]  # as above
        else:
            sock = socket.create_connection(found.addr, timeout=max(timeout, 0.001))  # type: ignore[arg-type]  # "port": addr set (offer())
        conn = _Conn(sock, deadline)
        rank, size = found.rank, found.size
        if found.mode == "port":
            conn.call(f"cmd=initack pmiid={found.pmiid}", "initack")
            for _ in range(3):  # size, rank, debug: the order MPICH's client reads them in
                got = conn.recv("set")
                if "size" in got:
                    size = int(got["size"])
                if "rank" in got:
                    rank = int(got["rank"])
        got = conn.call("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init")
        if got.get("rc", "0") != "0":
            raise PMIError(f"the launcher refused PMI-1 init: {got}")
        kvs = conn.call("cmd=get_my_kvsname", "my_kvsname")["kvsname"]
        if rank is None or size is None:
            raise PMIError("Hydra gave no rank or size (PMI_RANK/PMI_SIZE, or the -pmi-port "
                           "handshake)")
        _generation += 1
        key = f"{KEY}-{_generation}-"
        got = conn.call(f"cmd=put kvsname={kvs} key={key}{rank} value={host}", "put_result")
        if got.get("rc", "0") != "0":
            raise PMIError(f"the launcher refused to store this rank's host: {got}")
        # The barrier may use all but a reserve, kept to find out who is missing: the
        # whole call ends within `timeout`.
        reserve = min(2.0, 0.1 * timeout)
        conn.deadline = deadline - reserve
        try:
            conn.call("cmd=barrier_in", "barrier_out")
        except (socket.timeout, TimeoutError):
            conn.deadline = deadline
            raise PMIError(_missing_message(conn, kvs, key, rank, size, timeout)) from None
        conn.deadline = deadline
        hosts = []
        for r in range(size):
            got = conn.call(f"cmd=get kvsname={kvs} key={key}{r}", "get_result")
            if got.get("rc", "0") != "0" or "value" not in got:
                raise PMIError(f"rank {r}'s host is missing after the barrier ({got}).")
            hosts.append(got["value"])
    except PMIError:
        _release(sock, found, flags)
        raise
    except (OSError, ValueError, KeyError) as exc:
        _release(sock, found, flags)
        if isinstance(exc, (socket.timeout, TimeoutError)):
            raise PMIError(f"the launcher's key-value service did not answer within {timeout:g} s "
                           f"({found.why}). Fix: set DISTENV_TIMEOUT=<seconds> to wait longer, "
                           "or set MASTER_ADDR.") from None
        raise PMIError(f"the key-value exchange with the launcher failed ({found.why}): "
                       f"{exc}. Fix: set MASTER_ADDR (and NODE_RANK) instead.") from None
    _release(sock, found, flags)
    result = Exchange(rank, size, hosts, found.mode, time.monotonic() - start, found.why, kvs)
    _done = (os.getpid(), result)
    return result


def _release(sock: "socket.socket | None", found: Offer, flags: "int | None") -> None:
    """After the exchange (or its failure): PMI_FD gets its blocking mode back, and a watcher
    takes the connection (`_hold`) to send ``finalize`` when this process ends, so the
    rank's own exit status -- not a dropped connection, nor a missing ``finalize`` -- tells
    Hydra how it ended."""
    if found.mode == "fd" and flags is not None:
        import fcntl

        try:
            fcntl.fcntl(found.fd, fcntl.F_SETFL, flags)  # type: ignore[arg-type]  # "fd": fd set
        except OSError:
            pass
    if sock is not None:
        _hold(sock)


def _missing_message(conn: _Conn, kvs: str, key: str, rank: int, size: int, timeout: float) -> str:
    """After a barrier timeout: which ranks' hosts never reached the service.

    Hydra's proxy keeps its ranks' puts until *all* of its node's ranks reached the barrier
    (measured, MPICH 4 on two nodes, rank 3 of node1 absent: rank 2's key was invisible
    too, even to rank 2). So a missing key names a rank that never came or shares a node
    with one; this rank itself certainly came.
    """
    missing: "list[int] | None"
    missing = []
    try:
        for r in range(size):
            conn.send(f"cmd=get kvsname={kvs} key={key}{r}")
            while True:
                try:
                    got = conn.recv("get_result")
                    break
                except PMIError as exc:  # a late barrier_out: skip it
                    if "barrier_out" not in str(exc):
                        raise
            if got.get("rc", "0") != "0" and r != rank:
                missing.append(r)
    except (OSError, PMIError):
        missing = None
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (f", ... ({len(missing)} in all)"
                                                     if len(missing) > 20 else "")
        if len(missing) == 1:
            who = f"rank {shown} never reached it"
        else:
            who = (f"rank(s) {shown} have not all reached it (Hydra publishes a node's ranks "
                   "together once all of them came: one or more of these never did)")
    else:
        who = "not every rank reached it (which ones: the launcher could not say in time)"
    return (f"key-value exchange of {size} ranks timed out after {timeout:g} s on rank {rank}: "
            f"{who}. Check that every rank runs the same distenv call (a rank that died or "
            "hangs before it, or a script that skips it on some ranks); set "
            "DISTENV_TIMEOUT=<seconds> to wait longer, or set MASTER_ADDR to skip the exchange.")


__all__ = ["exchange", "offer", "used", "handoff", "inherited", "Exchange", "Offer", "PMIError",
           "HELD_VAR"]
