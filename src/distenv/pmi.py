"""The launcher's own key-value service: Hydra's simple PMI-1 wire protocol (MPICH, Intel MPI).

Across nodes, MPICH and Intel MPI reveal nothing about where rank 0 runs. But every rank Hydra
starts holds a connection to its launcher's key-value service (the one MPI_Init uses to
exchange business cards). `exchange()` uses it, standard library only: each rank publishes
its host name, one barrier; rank 0 reads every rank's and publishes one summary (`encode`,
split across keys within the service's value length), a second barrier, and every other
rank reads only the summary -- which proves the master address, the node of every rank, the
node count and the local counts (`distenv.discovery.complete`). Rank 0 also publishes a port
it found free on its host (`free_port`), so every rank has the same one.

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
``cmd=get_maxes``                          ``cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=V``
                                           (V = 1024 MPICH 4 and 5, 4096 Intel MPI; MPICH 4
                                           keeps V-1 characters of a value)
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

Cost (benchmarks/bench_pmi.py): per rank one ``put``, two barriers and one ``get`` per
part of the summary (one part up to about 1000 characters: 256 ranks in blocks on 2 nodes
take 23, round-robin about 2-4 characters per rank); rank 0 also one ``get`` per rank, one
``get_maxes`` and one ``put`` per part. Reading every rank's key on every rank (before
2026-11-26) made N^2 reads through each node's proxy: 128 -> 256 ranks cost 3x.

Never called by `resolve()`: adapters call `distenv.discovery.complete()` where
communication is about to happen anyway.
"""

from __future__ import annotations

import os
import socket
import time

from .errors import DistEnvError
from ._handoff import answered, begin, decode_hosts, encode_hosts, refusal

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
#: Key prefix of rank 0's summary of every rank's host (`encode`, in parts: `split`).
SUMMARY = "distenv-hosts"


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
    refused = refusal(environ, HELD_VAR, os.getpid())
    if refused is not None:
        return None, refused
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
    return f"{os.getpid()};{ex.mode};{ex.kvsname or ''};" + encode_hosts(ex.hosts)


def inherited(environ: "Mapping[str, str] | None" = None) -> "Exchange | None":
    """The exchange this same process (same pid) ran before it exec'ed, from `HELD_VAR`."""
    environ = os.environ if environ is None else environ
    parts = environ.get(HELD_VAR, "").split(";")
    if len(parts) != 4 or parts[0] != str(os.getpid()) or parts[1] not in ("fd", "port"):
        return None
    hosts = decode_hosts(parts[3])
    if hosts is None:
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

    __slots__ = ("rank", "size", "hosts", "mode", "seconds", "why", "kvsname", "port")

    def __init__(self, rank: int, size: int, hosts: "list[str]", mode: str, seconds: float,
                 why: str, kvsname: "str | None" = None, port: "int | None" = None) -> None:
        self.rank, self.size, self.hosts, self.mode = rank, size, hosts, mode
        self.seconds, self.why, self.kvsname = seconds, why, kvsname
        #: A TCP port rank 0 found free on its host (`free_port`), the same on every rank;
        #: None when none was found (or the answer came from before an exec).
        self.port = port

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
    earlier = answered(_done)
    if earlier is not None:
        return earlier
    found, timeout = begin(environ, found, timeout, offer, PMIError, "key-value service")
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
        summary = f"{SUMMARY}-{_generation}-"
        port: "int | None"
        if rank == 0:
            hosts, port = _publish(conn, kvs, key, summary, host, size)
        else:
            try:
                conn.call("cmd=barrier_in", "barrier_out")  # rank 0 published the summary
            except (socket.timeout, TimeoutError):
                raise PMIError(
                    f"key-value exchange of {size} ranks timed out after {timeout:g} s on rank "
                    f"{rank}: every rank published its host, but rank 0 never published the "
                    "summary of all of them (it died or hangs after the first barrier). Check "
                    "rank 0's output; set DISTENV_TIMEOUT=<seconds> to wait longer, or set "
                    "MASTER_ADDR to skip the exchange.") from None
            hosts, port = _read_summary(conn, kvs, summary, size)
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
    result = Exchange(rank, size, hosts, found.mode, time.monotonic() - start, found.why, kvs,
                      port)
    _done = (os.getpid(), result)
    return result


def _vallen(conn: _Conn) -> int:
    """How many characters one value may hold: ``cmd=get_maxes`` answers ``vallen_max``
    (measured: 1024 under MPICH 4 and 5, 4096 under Intel MPI). MPICH 4 keeps
    ``vallen_max - 1`` characters (the C string's NUL; measured: a 1024-character value
    came back as 1023), so that is the limit used."""
    got = conn.call("cmd=get_maxes", "maxes")
    raw = got.get("vallen_max", "")
    if got.get("rc", "0") != "0" or not raw.isdigit() or int(raw) < 64:
        raise PMIError(f"the launcher gave no usable value length (cmd=get_maxes: {got})")
    return int(raw) - 1


def _escape(host: str) -> str:
    for c, code in (("%", "%25"), (",", "%2C"), ("*", "%2A"), ("/", "%2F"), (";", "%3B")):
        host = host.replace(c, code)
    return host


def _unescape(text: str) -> str:
    head, *rest = text.split("%")
    return head + "".join(chr(int(part[:2], 16)) + part[2:] for part in rest)


def encode(hosts: "list[str]", port: "int | None" = None) -> str:
    """Every rank's host, compactly: the distinct hosts (by lowest rank, escaped) joined by
    ``,``, then ``/``, then each rank's index into them in runs (``i`` or ``i*count``):
    ``node2,node1/0*2,1*2``. 256 ranks on 2 nodes in blocks: 23 characters. Then
    ``/<port>`` when rank 0 found a free port."""
    index: "dict[str, int]" = {}
    runs: "list[list[int]]" = []  # [node index, count]
    for host in hosts:
        i = index.setdefault(host, len(index))
        if runs and runs[-1][0] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return (",".join(_escape(h) for h in index) + "/"
            + ",".join(f"{i}*{n}" if n > 1 else str(i) for i, n in runs)
            + ("" if port is None else f"/{port}"))


def decode(text: str, size: int) -> "tuple[list[str], int | None]":
    """The inverse of `encode`: (hosts, port); PMIError unless it names exactly `size`
    ranks."""
    port = None
    try:
        names, _, runs = text.partition("/")
        runs, _, raw_port = runs.partition("/")
        if raw_port:
            port = int(raw_port)
            if not 0 < port < 65536:
                raise ValueError(raw_port)
        distinct = [_unescape(h) for h in names.split(",")]
        hosts: "list[str]" = []
        for run in runs.split(","):
            i, _, n = run.partition("*")
            hosts.extend([distinct[int(i)]] * (int(n) if n else 1))
    except (ValueError, IndexError):
        hosts = []
    if len(hosts) != size:
        raise PMIError(f"rank 0's summary of the hosts does not describe {size} ranks "
                       f"({text[:200]!r}). " + STALE_SUMMARY)
    return hosts, port


#: What to do when the summary is not this job's (another program using the same keys).
STALE_SUMMARY = ("Fix: run every rank under one distenv version; set MASTER_ADDR (and "
                 "NODE_RANK) to skip the exchange.")


def split(payload: str, limit: int) -> "list[str]":
    """`payload` as values of at most `limit` characters, the first prefixed ``<count>;``."""
    count = 1
    for _ in range(8):
        head = f"{count};"
        cut = limit - len(head)
        parts = [head + payload[:cut]] + [payload[i:i + limit]
                                           for i in range(cut, len(payload), limit)]
        if len(parts) == count:
            return parts
        count = len(parts)
    raise PMIError(f"cannot split {len(payload)} characters into values of {limit}")


def free_port(start: int, tries: int = 64) -> "int | None":
    """The first port from `start` (wrapping within distenv.ports' range, 20000-29999, below
    the kernel's ephemeral ports) that this host lets a new listening socket bind, as
    torch's store binds it (SO_REUSEADDR, every address); None if `tries` ports are taken.
    A bind and a close: microseconds. Free now is not reserved: a program binding it before
    the store does still wins; but a job already listening there is avoided."""
    from .ports import BASE, SPAN

    for i in range(tries):
        port = BASE + (start - BASE + i) % SPAN
        if _bindable(port):
            return port
    return None


def _bindable(port: int) -> bool:
    """True when a listening socket could bind `port` on every address, IPv6 (when this
    host has it) and IPv4 alike."""
    bound = False
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
            bound = True
        except OSError:
            return False
        finally:
            s.close()
    return bound


def _publish(conn: _Conn, kvs: str, key: str, summary: str, host: str,
             size: int) -> "tuple[list[str], int | None]":
    """Rank 0, after the first barrier: read every rank's host, find a free port on this
    host (`free_port`, from the port derived from the job's kvsname), publish both as one
    summary (split across keys ``<summary><i>`` within the service's value length), then
    the second barrier, after which every other rank reads the summary."""
    hosts = [host]
    missing: "tuple[int, dict[str, str]] | None" = None
    for r in range(1, size):
        got = conn.call(f"cmd=get kvsname={kvs} key={key}{r}", "get_result")
        if got.get("rc", "0") != "0" or "value" not in got:
            missing = (r, got)
            break
        hosts.append(got["value"])
    # A missing host is published too ("!<rank>"): every rank then fails with rank 0's
    # reason at once, instead of waiting out its timeout at the second barrier.
    from .ports import port_for

    port = free_port(port_for(f"hydra:{kvs}"))
    payload = f"!{missing[0]}" if missing is not None else encode(hosts, port)
    for i, part in enumerate(split(payload, _vallen(conn))):
        got = conn.call(f"cmd=put kvsname={kvs} key={summary}{i} value={part}", "put_result")
        if got.get("rc", "0") != "0":
            raise PMIError(f"the launcher refused to store the summary of the hosts: {got}")
    try:
        conn.call("cmd=barrier_in", "barrier_out")
    except (socket.timeout, TimeoutError):
        raise PMIError(
            f"key-value exchange of {size} ranks timed out on rank 0: every rank published its "
            "host, but not every rank came back to read the summary (one died or hangs between "
            "the two barriers). Set DISTENV_TIMEOUT=<seconds> to wait longer, or set "
            "MASTER_ADDR to skip the exchange.") from None
    if missing is not None:
        raise PMIError(f"rank {missing[0]}'s host is missing after the barrier ({missing[1]}).")
    return hosts, port


def _read_summary(conn: _Conn, kvs: str, summary: str, size: int) -> "tuple[list[str], int | None]":
    """Every rank but 0, after the second barrier: rank 0's summary, one ``get`` per part."""
    parts: "list[str]" = []
    count = 1
    i = 0
    while i < count:
        got = conn.call(f"cmd=get kvsname={kvs} key={summary}{i}", "get_result")
        if got.get("rc", "0") != "0" or "value" not in got:
            raise PMIError(f"part {i} of rank 0's summary of the hosts is missing after the "
                           f"barrier ({got}). " + STALE_SUMMARY)
        value = got["value"]
        if i == 0:
            head, _, value = value.partition(";")
            if not head.isdigit() or int(head) < 1:
                raise PMIError(f"rank 0's summary of the hosts is not distenv's ({got}). "
                               + STALE_SUMMARY)
            count = int(head)
        parts.append(value)
        i += 1
    text = "".join(parts)
    if text.startswith("!"):
        raise PMIError(f"rank {text[1:]}'s host is missing after the barrier (rank 0 could not "
                       "read it).")
    return decode(text, size)


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
