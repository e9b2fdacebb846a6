"""The launcher's own key-value service: Hydra's simple PMI-1 wire protocol (MPICH, Intel MPI).

Across nodes, MPICH and Intel MPI reveal nothing about where rank 0 runs. But every rank Hydra
starts holds a connection to its launcher's key-value service (the one MPI_Init uses to
exchange business cards). `exchange()` uses it, standard library only: each rank publishes
its host name, one barrier; rank 0 reads every rank's and publishes one summary (`encode`,
split across keys within the service's value length), a second barrier, and every other
rank reads only the summary -- which proves the master address, the node of every rank, the
node count and the local counts (`distenv.discovery.complete`). Rank 0 also publishes a port
it found free on its host (`distenv.core.ports.free`), so every rank has the same one.

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

from .. import knobs
from ..errors import DistEnvError
from .handoff import answered, begin, decode_hosts, encode_hosts, pack, refusal, unpack

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: The daemons that speak PMI-1 to the processes they start, by process name
#: (/proc/<pid>/comm), and how this client calls them: Hydra's proxy (MPICH 4.0, MPICH 5,
#: Intel MPI 2021: measured) and SLURM's slurmstepd (``srun --mpi=pmi2``, whose plugin also
#: speaks PMI-1 on PMI_FD: measured, SLURM 22.05).
SERVERS = {"hydra_pmi_proxy": "Hydra", "slurmstepd": "SLURM"}
#: Longest line read from the launcher (a PMI-1 answer is a few KB: a value is at most
#: vallen_max, 1024 or 4096 measured); more is not this protocol.
MAX_LINE = 1 << 16
#: The environment variable `distenv run` passes to the command it execs ("<pid>[:<fd>]").
HELD_VAR = knobs.PMI_HELD
#: Key prefix in the job's key-value space (MPICH's own keys are P<rank>-businesscard, ...).
KEY = "distenv-host"
#: Key prefix of rank 0's summary of every rank's host (`encode`, in parts: `split`).
SUMMARY = "distenv-hosts"


class PMIError(DistEnvError):
    """The key-value exchange failed or timed out."""


class Offer:
    """How this process reaches its launcher's service: ``mode`` "fd" or "port"; `server`
    "Hydra" or "SLURM" (`SERVERS`); `chain` the processes between the daemon and this one
    (`distenv.discovery.chain`), None in tests."""

    __slots__ = ("mode", "fd", "addr", "pmiid", "rank", "size", "why", "server", "chain")

    def __init__(self, mode: str, why: str, fd: "int | None" = None,
                 addr: "tuple[str, int] | None" = None, pmiid: "int | None" = None,
                 rank: "int | None" = None, size: "int | None" = None, server: str = "Hydra",
                 chain: Any = None) -> None:
        self.mode, self.why, self.fd, self.addr, self.pmiid = mode, why, fd, addr, pmiid
        self.rank, self.size, self.server, self.chain = rank, size, server, chain

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
    from ..knobs import PMI

    environ = os.environ if environ is None else environ
    if not PMI.value(environ):
        return None, f"{PMI}=0"
    has_fd, has_port = "PMI_FD" in environ, "PMI_PORT" in environ and "PMI_ID" in environ
    if not (has_fd or has_port):
        return None, "no PMI-1 service (neither PMI_FD nor PMI_PORT/PMI_ID is set)"
    refused = refusal(environ, HELD_VAR, os.getpid())
    if refused is not None:
        return None, refused
    from .chain import walk

    chain, why_not = walk(lambda pid: SERVERS.get(_comm(pid)), ", ".join(SERVERS))
    if chain is None:
        return None, why_not
    # In a container's own pid namespace the daemon is outside, unseen: SLURM's pmi2 plugin
    # sets PMI_JOBID (<job>.<step>, measured), Hydra never does (MPICH 4, 5, Intel MPI:
    # tests/fixtures/launchers/cluster-*-2x2.json)
    server = chain.kind or ("SLURM" if "PMI_JOBID" in environ else "Hydra")
    rank = _int(environ, "PMI_RANK")
    size = _int(environ, "PMI_SIZE")
    if server == "SLURM":
        # The stepd answers one `init` per task and kills the step on a second (measured):
        # distenv's own exchange is that one, and its relay (distenv.discovery.holder) answers the
        # MPI library's later init. A job script between them could start another program
        # that inits on the script's own connection, which no relay sees; a container starter
        # runs one command (STARTERS).
        from .chain import STARTERS

        scripts = [p for p in chain.between if p not in STARTERS]
        if scripts:
            return None, (f"under SLURM's stepd the PMI connection belongs to the job script "
                          f"({' < '.join(scripts)}), which may start another program that "
                          "initializes MPI on it; the stepd kills the step on a second init. Fix: "
                          "end the job script with `exec python ...`, or launch with srun "
                          "--mpi=pmix")
        loaded = _mpi_loaded()
        if loaded:
            return None, (f"an MPI library is loaded in this process ({loaded}) and may have "
                          "used the stepd's one init already. Fix: call distenv before "
                          "importing mpi4py, or let mpi4py discover (method='mpi4py')")
        if not has_fd:
            return None, "SLURM's stepd gave no PMI_FD"
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
            from .containers import fix, where

            return None, (f"PMI_FD={fd} is not open in this process{where(environ)} "
                          f"({exc.strerror}). {fix(environ, 'fd')}")
        if chain.container:
            # the daemon is outside the container's pid namespace: so must the other end be
            # (the kernel gives 0 for a peer this namespace cannot see)
            if peer not in (None, 0):
                return None, (f"PMI_FD={fd} is connected to process {peer} inside the "
                              f"{chain.container} container, not to the launcher's daemon "
                              "outside it")
        elif peer is not None and peer != chain.daemon:
            return None, (f"PMI_FD={fd} is connected to process {peer}, not to the launcher's "
                          f"{chain.name} ({chain.daemon})")
        origin = (f"{server}'s daemon, outside the {chain.container} container" if chain.container
                  else f"{server}'s {chain.name} (pid {chain.daemon})")
        return Offer("fd", f"PMI_FD={fd} from {origin}", fd=fd, rank=rank, size=size,
                     server=server, chain=chain), ""
    host, _, port = environ["PMI_PORT"].rpartition(":")
    pmiid = _int(environ, "PMI_ID")
    if not host or not port.isdigit() or pmiid is None:
        return None, (f"PMI_PORT={environ['PMI_PORT']!r} / PMI_ID={environ.get('PMI_ID')!r} "
                      "are not <host>:<port> and a number")
    return Offer("port", f"PMI_PORT={environ['PMI_PORT']} PMI_ID={pmiid} (Hydra -pmi-port)",
                 addr=(host, int(port)), pmiid=pmiid, rank=pmiid if rank is None else rank,
                 size=size, server=server, chain=chain), ""


def _mpi_loaded() -> str:
    """The MPI or PMI library mapped in this process, or "" (/proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                name = os.path.basename(line.rstrip().rsplit(" ", 1)[-1])
                if name.startswith(("libmpi.so", "libmpich.so", "libpmi.so", "libpmi2.so")):
                    return name
    except OSError:
        pass
    return ""


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
        self.sock, self.deadline, self.buf, self.last = sock, deadline, b"", ""

    def send(self, line: str) -> None:
        self.sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
        self.sock.sendall(line.encode() + b"\n")

    def recv(self, expect: str) -> "dict[str, str]":
        """The next answer, parsed; ``cmd`` must be `expect`."""
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise PMIError(f"the launcher sent {len(self.buf)} bytes without a line end: "
                               "not PMI-1. Fix: set MASTER_ADDR (and NODE_RANK), or DISTENV_PMI=0.")
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the launcher closed the connection")
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        self.last = line.decode(errors="replace")
        fields = dict(part.partition("=")[::2] for part in line.decode(errors="replace").split())
        if fields.get("cmd") != expect:
            raise PMIError(f"the launcher answered {line[:200]!r} where cmd={expect} was due")
        return fields

    def call(self, line: str, expect: str) -> "dict[str, str]":
        self.send(line)
        return self.recv(expect)


_kept: "list[socket.socket]" = []  # connections kept here when no holder could be started
_done: "tuple[int, Exchange] | None" = None   # (pid, Exchange): one exchange per process
_generation = 0


class _Held:
    """What the holder was given before the exchange: the connection to it, and under SLURM's
    stepd the rank's end of the relay (to become PMI_FD after the exchange)."""

    __slots__ = ("holder", "mine", "error")

    def __init__(self, holder: Any = None, mine: "socket.socket | None" = None,
                 error: "Exception | None" = None) -> None:
        self.holder, self.mine, self.error = holder, mine, error


def _holder_for(found: Offer, deadline: "float | None" = None) -> _Held:
    """This task's holder (`distenv.discovery.holder`: shared by the daemon's ranks on this node),
    reached before the exchange so that it overlaps the wait at the barriers; under SLURM's
    stepd it takes the relay now, paused until `_hold` (one message after the exchange, not a
    round trip: 64 ranks on 2 cores waited up to 180 ms for theirs). Reaching it ends by
    `deadline` (time.monotonic()), the exchange's."""
    from . import holder as _holder
    from .chain import start_time

    chain = found.chain
    timeout = 30.0 if deadline is None else max(deadline - time.monotonic(), 0.01)
    try:
        holder = _holder.for_task(chain.task if chain else os.getpid(),
                                  chain.task_start if chain else start_time(os.getpid()),
                                  chain.daemon_id if chain else None, timeout=timeout)
        if found.server != "SLURM" or found.mode != "fd":
            return _Held(holder)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        up = os.dup(found.fd)  # type: ignore[arg-type]  # "fd": fd set (offer())
        try:
            holder.ask("pmi_relay", fds=[up, theirs.fileno()])
        except _holder.HolderError:
            mine.close()
            raise
        finally:
            os.close(up)
            theirs.close()
        return _Held(holder, mine)
    except (_holder.HolderError, OSError) as exc:
        return _Held(error=exc)


def _hold(sock: socket.socket, found: Offer, init: str, held: "_Held | None" = None) -> None:
    """After the exchange: the connection goes to the holder (`distenv.discovery.holder`), which keeps
    it until the task ends and then sends ``finalize`` -- however the task ends: return,
    ``os._exit``, an ``exec`` and the new program's exit. Measured: with -pmi-port (MPICH 4, 5)
    a connection closed without ``finalize`` makes Hydra kill the job; with PMI_FD, Intel MPI
    kills it when a rank that sent ``init`` exits without ``finalize``; a ``finalize`` while
    the task lives breaks a later MPI_Init (module doc).

    Under SLURM's stepd the holder is also a relay: the stepd accepts one ``init`` per task,
    so this process's PMI_FD becomes one end of a socket pair whose other end the holder
    joins to the stepd, answering a later ``init`` (MPI_Init's) with the stepd's answer to
    ours (`init`) and passing every other line on. No holder (no process to spare): the
    connection stays open here until this process exits, with a warning.
    """
    from . import holder as _holder

    held = _holder_for(found) if held is None else held
    try:
        if held.error is not None:
            raise held.error
        if held.mine is not None:
            # the relay takes PMI_FD's number: MPI_Init (here, or in a program this one execs
            # or starts) speaks to it as it would to the stepd
            os.dup2(held.mine.fileno(), found.fd, inheritable=True)  # type: ignore[arg-type]  # "fd": fd set
            held.mine.close()
            held.holder.tell("pmi_go", init=init)
            sock.close()
        else:
            held.holder.tell("finalize", fds=[sock.fileno()])
            sock.close()
    except (_holder.HolderError, OSError) as exc:
        from ..log import get_logger

        _kept.append(sock)
        get_logger(__name__).warning(
            f"no holder for the launcher's connection ({exc}): if this rank ends first, the "
            "launcher may end the job as failed" + (", and a later MPI_Init here fails (SLURM's "
            "stepd accepts one init per task)" if found.server == "SLURM" else ""))


def handoff() -> "str | None":
    """The value of `HELD_VAR` for a command this process is about to exec (``distenv run``):
    ``<pid>;<mode>;<kvsname>;<host>*<count>,...;<server>`` (the hosts of ranks 0.. in runs),
    or None when this process ran no exchange. Exec keeps the pid: the command is the same rank."""
    if not used():
        return None
    ex = _done[1]  # type: ignore[index]  # used() proved _done is set
    return f"{os.getpid()};{ex.mode};{ex.kvsname or ''};" + pack(encode_hosts(ex.hosts)) + f";{ex.server}"


def inherited(environ: "Mapping[str, str] | None" = None) -> "Exchange | None":
    """The exchange this same process (same pid) ran before it exec'ed, from `HELD_VAR`."""
    environ = os.environ if environ is None else environ
    parts = environ.get(HELD_VAR, "").split(";")
    if len(parts) != 5 or parts[0] != str(os.getpid()) or parts[1] not in ("fd", "port") \
            or parts[4] not in SERVERS.values():
        return None
    text = unpack(parts[3])
    hosts = decode_hosts(text) if text is not None else None
    if hosts is None:
        return None
    rank = _int(environ, "PMI_RANK")
    if rank is None:
        rank = _int(environ, "PMI_ID")
    if rank is None or rank >= len(hosts):
        return None
    return Exchange(rank, len(hosts), hosts, parts[1], 0.0, f"{HELD_VAR} (before exec)",
                    parts[2] or None, server=parts[4])


def used() -> bool:
    """True when this process has run the exchange."""
    return _done is not None and _done[0] == os.getpid()


class Exchange:
    """What the exchange found: ``hosts[r]`` is rank r's host name."""

    __slots__ = ("rank", "size", "hosts", "mode", "seconds", "why", "kvsname", "port", "server")

    def __init__(self, rank: int, size: int, hosts: "list[str]", mode: str, seconds: float,
                 why: str, kvsname: "str | None" = None, port: "int | None" = None,
                 server: str = "Hydra") -> None:
        self.rank, self.size, self.hosts, self.mode = rank, size, hosts, mode
        self.seconds, self.why, self.kvsname, self.server = seconds, why, kvsname, server
        #: A TCP port rank 0 found free on its host (`distenv.core.ports.free`), the same on every rank;
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
    held = _holder_for(found, deadline)
    host = _check_value(socket.gethostname())
    sock: "socket.socket | None"
    flags: "int | None"
    sock = flags = None
    init = ""  # the launcher's answer to our init (SLURM's relay gives it to a later init)
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
        init = conn.last
        kvs = conn.call("cmd=get_my_kvsname", "my_kvsname")["kvsname"]
        if rank is None or size is None:
            raise PMIError(f"{found.server} gave no rank or size (PMI_RANK/PMI_SIZE, or the "
                           "-pmi-port handshake). Fix: set MASTER_ADDR (and NODE_RANK).")
        _generation += 1
        key = f"{KEY}-{_generation}-"
        got = conn.call(f"cmd=put kvsname={kvs} key={key}{rank} value={host}", "put_result")
        if got.get("rc", "0") != "0":
            raise PMIError(f"the launcher refused to store this rank's host: {got}")
        # The barrier may use all but a reserve, kept to find out who is missing: the
        # whole call ends within `timeout`. Rank 0 reads every rank's key then, the others
        # one key. A key costs about 0.2 ms against Hydra's proxy, and as much against the
        # bench's fake proxy on a loaded 2-core machine (0.065 ms quiet): the reserve allows
        # 0.5 ms (5 s at 10 000 ranks, 25 s at 50 000), at most a quarter of the timeout.
        reserve = min(max(2.0, size * 5e-4), 0.25 * timeout) if rank == 0 else min(2.0, 0.1 * timeout)
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
        _release(sock, found, flags, init, held)
        raise
    except (OSError, ValueError, KeyError) as exc:
        _release(sock, found, flags, init, held)
        if isinstance(exc, (socket.timeout, TimeoutError)):
            raise PMIError(f"the launcher's key-value service did not answer within {timeout:g} s "
                           f"({found.why}). Fix: set DISTENV_TIMEOUT=<seconds> to wait longer, "
                           "or set MASTER_ADDR.") from None
        raise PMIError(f"the key-value exchange with the launcher failed ({found.why}): "
                       f"{exc}. Fix: set MASTER_ADDR (and NODE_RANK) instead.") from None
    _release(sock, found, flags, init, held)
    result = Exchange(rank, size, hosts, found.mode, time.monotonic() - start, found.why, kvs,
                      port, found.server)
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
        if not all(distinct):
            raise ValueError("an empty host name")
        hosts: "list[str]" = []
        for run in runs.split(","):
            i, _, n = run.partition("*")
            index, count = int(i), (int(n) if n else 1)
            # bounded by the job: a run past `size` ranks is not this job's summary (and
            # would otherwise build a list of any length it names)
            if index < 0 or count < 1 or len(hosts) + count > size:
                raise ValueError(run)
            hosts.extend([distinct[index]] * count)
    except (ValueError, IndexError):
        hosts = []
    if len(hosts) != size or size < 1:
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


def _publish(conn: _Conn, kvs: str, key: str, summary: str, host: str,
             size: int) -> "tuple[list[str], int | None]":
    """Rank 0, after the first barrier: read every rank's host, find a free port on this
    host (`distenv.core.ports.free`, from the port derived from the job's kvsname), publish both as one
    summary (split across keys ``<summary><i>`` within the service's value length), then
    the second barrier, after which every other rank reads the summary."""
    hosts = [host]
    missing: "tuple[int, dict[str, str]] | None" = None
    for r in range(1, size):
        got = conn.call(f"cmd=get kvsname={kvs} key={key}{r}", "get_result")
        if got.get("rc", "0") != "0" or not got.get("value"):
            missing = (r, got)
            break
        hosts.append(got["value"])
    # A missing host is published too ("!<rank>"): every rank then fails with rank 0's
    # reason at once, instead of waiting out its timeout at the second barrier.
    from ..core.ports import free, port_for

    port = free(port_for(f"hydra:{kvs}"))
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
            # a summary of `size` ranks takes at most ~17 parts per rank (hosts of 1000
            # characters in values of 63): more is not this job's
            if not head.isdigit() or not 1 <= int(head) <= 17 * size + 1:
                raise PMIError(f"rank 0's summary of the hosts is not distenv's ({str(got)[:200]}). "
                               + STALE_SUMMARY)
            count = int(head)
        parts.append(value)
        i += 1
    text = "".join(parts)
    if text.startswith("!"):
        raise PMIError(f"rank {text[1:]}'s host is missing after the barrier (rank 0 could not "
                       "read it).")
    return decode(text, size)


def _release(sock: "socket.socket | None", found: Offer, flags: "int | None", init: str,
             held: "_Held | None" = None) -> None:
    """After the exchange (or its failure): PMI_FD gets its blocking mode back, and the holder
    takes the connection (`_hold`) to send ``finalize`` when the task ends, so the rank's own
    exit status -- not a dropped connection, nor a missing ``finalize`` -- tells the launcher
    how it ended."""
    if found.mode == "fd" and flags is not None:
        import fcntl

        try:
            fcntl.fcntl(found.fd, fcntl.F_SETFL, flags)  # type: ignore[arg-type]  # "fd": fd set
        except OSError:
            pass
    if sock is not None:
        _hold(sock, found, init, held)


def _missing_message(conn: _Conn, kvs: str, key: str, rank: int, size: int, timeout: float) -> str:
    """After a barrier timeout: which ranks' hosts never reached the service.

    Rank 0 alone reads every rank's key and names the missing ones; every other rank reads
    rank 0's key only and points at rank 0's error: a constant number of requests per rank
    (all N ranks reading N keys would ask the launcher N^2 times, 10^8 at 10 000 ranks).

    Hydra's proxy keeps its ranks' puts until *all* of its node's ranks reached the barrier
    (measured, MPICH 4 on two nodes, rank 3 of node1 absent: rank 2's key was invisible
    too, even to rank 2). So a missing key names a rank that never came or shares a node
    with one; this rank itself certainly came.
    """
    missing: "list[int]" = []
    read = 0  # keys read before the time ran out (or the launcher failed)
    try:
        for r in (range(size) if rank == 0 else (0,)):
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
            read += 1
    except (OSError, PMIError):
        pass
    if read == 0:
        who = "not every rank reached it (which ones: the launcher could not say in time)"
    elif rank != 0:
        who = ("rank 0 came; its error names the ranks that did not" if not missing else
               "rank 0's host did not appear: rank 0 never reached it, or a rank on its node did "
               "not (Hydra shows a node's keys once all its ranks came); rank 0's error, if it "
               "runs, names them")
    else:
        shown = ", ".join(map(str, missing[:20])) + (f", ... ({len(missing)} in all)"
                                                     if len(missing) > 20 else "")
        if len(missing) == 1:
            who = f"rank {shown} never reached it"
        elif missing:
            who = (f"rank(s) {shown} have not all reached it (Hydra publishes a node's ranks "
                   "together once all of them came: one or more of these never did)")
        elif read == size:
            who = ("every rank's host is there, yet not every rank reached the barrier (one died "
                   "or hangs right after publishing its host)")
        else:
            who = "not every rank reached it"
        if read < size:  # the time ran out first: name what was read, and what was not
            came = f"ranks 0 to {read - 1} reached it"
            who = f"{who if missing else came}; ranks {read} to {size - 1} were not checked in time"
    return (f"key-value exchange of {size} ranks timed out after {timeout:g} s on rank {rank}: "
            f"{who}. Check that every rank runs the same distenv call (a rank that died or "
            f"hangs before it, or a script that skips it on some ranks); set "
            f"{knobs.TIMEOUT}=<seconds> to wait longer, or set MASTER_ADDR to skip the exchange.")


__all__ = ["exchange", "offer", "used", "handoff", "inherited", "Exchange", "Offer", "PMIError",
           "HELD_VAR"]
