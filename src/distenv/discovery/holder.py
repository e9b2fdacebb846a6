"""The holder: a small process that keeps what discovery opened until each launcher task ends.

A launcher's service is asked once per task (the process the launcher started: the rank, or
the job script that runs it), but what that leaves behind must live as long as the task, not
as long as the Python that asked:

* **PMI-1** (Hydra's proxy, SLURM's stepd): the connection distenv talked on is held, and
  ``cmd=finalize`` sent once the task has ended. Measured (docs/discovery.md): a ``finalize``
  while the task lives breaks a later ``MPI_Init``; a connection closed without one makes
  Hydra kill the job (``-pmi-port``), and Intel MPI kills it when a rank that sent ``init``
  exits without it.
* **SLURM's stepd relay**: the stepd accepts one ``cmd=init`` per task and kills the step on a
  second (``mpi/pmi2: invalid pmi1 command received: 'init'``, measured). After distenv's
  exchange the task's ``PMI_FD`` is this relay: it answers a later ``init`` (an MPI library's
  ``MPI_Init``) with the stepd's own answer to distenv's, and passes every other line on.
* **PMIx over TCP**: the server's end of the query's connection, relayed by the rank
  (`distenv.discovery.pmix_relay`), is held until the task ends (PMIx 5.0's finalize race,
  docs/discovery.md).
* **The claim**: a later program of the same task (the job script's next ``python``) gets the
  answer from here instead of asking the service a second time.

Why a process of its own, exec'ed: a fork of the rank would keep a copy-on-write image of its
whole address space for the job's life (measured: 211 MB held after the rank freed it); a
thread would end with the Python that asked (a wrapper script's later programs, ``distenv
run``'s exec). This file runs as ``python -I -S _holder.py``: standard library only, no import
of distenv, not even of ``socket`` or ``json`` (its C parts only): a bare interpreter's memory
(about 6 MB private) and start (about 12 ms of CPU).

**One holder per node and job**, not per rank: the ranks of one launcher daemon on a node
share it (it listens on an abstract Unix socket named after this user and the daemon: its pid
and start time). The first rank to arrive starts it; the others connect and register their
task. Starting an interpreter per rank cost a second of wall time at 64 ranks on 2 cores
(``benchmarks/bench_slurm_services.py``). It ends when every task it watched has ended.

Who may talk to it: only this user's processes that descend from the daemon it serves
(SO_PEERCRED, /proc); the claim (an
abstract socket named after the task) answers only this user's processes of that task.
docs/guarantees.md has the trust model.

The protocol (`Holder` is the client): one line per message, ``op key=value ...`` with values
%-escaped, descriptors attached (SCM_RIGHTS); each answered ``ok pid=<holder pid>`` or
``error <text>`` (none for a message marked ``quiet``: `Holder.tell`). The first message of a
connection is ``watch`` (the task's pid and start time); the others are that task's duties:
``finalize`` (a PMI-1 connection), ``pmi_relay`` (the stepd's connection and the rank's end
of a socket pair, taken before the exchange) and ``pmi_go`` (after it: the stepd's answer to
our init),
``hold`` (a connection to keep open), ``claim`` (a listening abstract socket, the answer).
"""

from __future__ import annotations

import os
import sys
import time

try:
    from .chain import HOLDER, descends, parent_of, start_time
except ImportError:  # run as the holder program (`python -I -S holder.py`): no package, so
    # chain.py beside this file, by its path (nothing of the working directory or sys.path)
    import importlib.util as _util

    _spec = _util.spec_from_file_location("_distenv_chain", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "chain.py"))
    _chain = _util.module_from_spec(_spec)  # type: ignore[arg-type]  # a file: never None
    _spec.loader.exec_module(_chain)  # type: ignore[union-attr]  # as above
    HOLDER, descends, parent_of = _chain.HOLDER, _chain.descends, _chain.parent_of
    start_time = _chain.start_time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Sequence
    from typing import Any

#: Longest line a peer may send before it is dropped (a PMI-1 command is a few KB: values of
#: vallen_max, 1024 or 4096 measured; a claim's answer holds the compact host list).
MAX_LINE = 1 << 16
#: Longest message on the control connection (a claim's answer for a very large job).
MAX_CTRL = 64 << 20
#: This file: what a holder process runs (``python -I -S PROGRAM``), which its clients check.
PROGRAM = HOLDER
#: How many descriptors each duty comes with (the rest come with none).
TAKES = {"finalize": 1, "pmi_relay": 2, "hold": 1, "claim": 1}
#: Seconds the holder waits for a ``finalize_ack`` once a task has ended.
FINALIZE_WAIT = 5.0
#: Seconds a new holder waits for its first task before it ends.
FIRST_TASK_WAIT = 60.0


def _escape(value: object) -> str:
    text = str(value)
    for c, code in (("%", "%25"), (" ", "%20"), ("=", "%3D"), ("\n", "%0A"), ("\t", "%09")):
        text = text.replace(c, code)
    return text


def _unescape(text: str) -> str:
    head, *rest = text.split("%")
    return head + "".join(chr(int(part[:2], 16)) + part[2:] for part in rest)


def encode(op: str, fields: "dict[str, object]") -> bytes:
    return (" ".join([op, *(f"{k}={_escape(v)}" for k, v in fields.items())]) + "\n").encode()


def decode(line: bytes) -> "tuple[str, dict[str, str]]":
    op, *parts = line.decode("utf-8", "replace").split(" ")
    return op, {k: _unescape(v) for k, _, v in (p.partition("=") for p in parts if p)}


# -- the client side (in the rank) ------------------------------------------------------------
class HolderError(OSError):
    """The holder could not be started or reached, or refused a duty."""


#: Longest answer a holder gives a client (``ok pid=... id=...`` or ``error <text>``).
MAX_REPLY = 1 << 16


class Holder:
    """A connection to this node's holder, registered for one task; `ask` gives it a duty.
    Every answer is read by one deadline (`timeout` seconds from the question) and cap."""

    def __init__(self, conn: "socket.socket", pid: int, timeout: float = 30.0) -> None:
        self.conn, self.pid, self.timeout = conn, pid, timeout

    def ask(self, op: str, fds: "Sequence[int]" = (), **fields: Any) -> "dict[str, str]":
        import socket

        from .door import DoorError, recv_line

        try:
            self.conn.settimeout(self.timeout)
            socket.send_fds(self.conn, [encode(op, fields)], list(fds))
            reply = recv_line(self.conn, time.monotonic() + self.timeout, MAX_REPLY,
                              f"the holder (pid {self.pid})")
            if not reply:
                raise HolderError(f"the holder (pid {self.pid}) ended before answering {op}")
        except HolderError:
            raise
        except (OSError, DoorError) as exc:
            raise HolderError(f"the holder (pid {self.pid}) did not take {op}: {exc}") from None
        status, got = decode(reply)
        if status != "ok":
            text = reply.decode("utf-8", "replace").strip()
            raise HolderError(f"the holder refused {op}: {text.partition(' ')[2]}")
        return got

    def tell(self, op: str, fds: "Sequence[int]" = (), **fields: Any) -> None:
        """`ask` without waiting for the answer (the holder sends none): for a duty whose
        answer would only delay the rank (it has nothing to do if it fails but to go on)."""
        import socket

        try:
            self.conn.settimeout(self.timeout)
            socket.send_fds(self.conn, [encode(op, {**fields, "quiet": 1})], list(fds))
        except OSError as exc:
            raise HolderError(f"the holder (pid {self.pid}) did not take {op}: {exc}") from None

    def close(self) -> None:
        self.conn.close()


def address(daemon: "tuple[int, int | None] | None", task: "tuple[int, int | None]") -> str:
    """The abstract socket of the holder serving `daemon`'s tasks on this node (pid, start time)
    for this user, in this pid namespace (a holder watches the tasks it can see); without a
    daemon (a process asked on its own), one for `task` alone. The name holds this user's
    secret (`door.name`): another user can neither compute nor take it."""
    from .door import name, pid_namespace

    who = ("daemon", daemon[0], daemon[1]) if daemon else ("task", task[0], task[1])
    return name("holder", pid_namespace(), *who)


def _connect(name: str, timeout: float) -> "socket.socket | None":
    """A connection to a holder listening on `name`, or None when nothing listens there.
    `HolderError` when what listens is not this user's holder (`door.check_peer`): nothing is
    sent to it."""
    import socket

    from .door import DoorError, check_peer

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(name)
    except OSError:
        s.close()
        return None
    try:
        check_peer(s, "the holder's socket", program=PROGRAM)
    except (DoorError, OSError) as exc:
        s.close()
        raise HolderError(str(exc)) from None
    return s


def _spawn(name: str, guard: int) -> bool:
    """Bind `name` and start a holder listening on it that serves the descendants of process
    `guard` (the daemon, or the task itself); False when another process holds the name (it is
    starting one: connect to it)."""
    import socket

    # Bound here, listened on by the holder: a client's peer check (SO_PEERCRED: the
    # credentials of the process that called listen) then finds the holder itself.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
    except OSError:
        listener.close()
        return False
    try:
        if not sys.executable:
            raise HolderError("no Python interpreter to run the holder (sys.executable is empty)")
        fd = listener.fileno()
        os.set_inheritable(fd, True)
        # -I: isolated (no cwd, user site or PYTHON* variables); -S: no site at all.
        # posix_spawn, not subprocess: importing subprocess alone costs a rank ~13 ms.
        from ..knobs import HOLDER_LOG

        # the log file, if any, as an argument: the holder runs outside the package (-I -S)
        argv = [sys.executable, "-I", "-S", PROGRAM, str(fd), str(guard),
                HOLDER_LOG.raw() or ""]
        env: "dict[str, str]" = {}
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
                   (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
        pid = os.posix_spawn(sys.executable, argv, env, file_actions=actions)
        # it forks at once and its first process exits: the holder is nobody's child (a
        # shell that waits for its children, or the program distenv run execs, never waits)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # SIGCHLD ignored by this program: the kernel reaped it
            pass
    except OSError as exc:
        raise HolderError(f"could not start the holder: {exc}") from None
    finally:
        listener.close()  # the holder has its own copy
    return True


def start(task: int, task_start: "int | None", timeout: float = 30.0,
          daemon: "tuple[int, int | None] | None" = None) -> Holder:
    """A connection to the holder serving `daemon` on this node (started if none is), with
    `task` registered (its start time from /proc: a pid reused by another process is never
    watched); `HolderError` if none can be reached within `timeout` seconds. Where the
    shared name is held by something that is not this user's holder, this task gets a holder
    of its own on a name nobody else knows (and the debug log says so)."""
    name = address(daemon, (task, task_start))
    deadline = time.monotonic() + timeout
    spawned = False
    while True:
        try:
            conn = _connect(name, max(deadline - time.monotonic(), 0.01))
        except HolderError as exc:
            from .door import debug

            debug(f"holder: {exc}: this task gets a holder of its own")
            from .door import name as door_name

            name = door_name("holder", "own", task, task_start, os.urandom(8).hex())
            daemon, spawned = None, False
            continue
        if conn is not None:
            holder = Holder(conn, 0, max(deadline - time.monotonic(), 0.01))
            try:
                holder.pid = int(holder.ask("watch", pid=task, start=task_start or 0)["pid"])
                holder.timeout = timeout
                return holder
            except (HolderError, KeyError, ValueError):
                conn.close()  # it was ending as we came: start another
        elif not spawned:
            spawned = _spawn(name, daemon[0] if daemon else task)
            if spawned:
                continue
            # another task of this node is starting the holder: wait for it (not a busy
            # retry -- 63 ranks spinning on 2 cores starved the one holder they wait for)
        if time.monotonic() >= deadline:
            raise HolderError(f"no holder answered on this node within {timeout:g} s")
        time.sleep(0.01)
        spawned = False


_mine: "tuple[int, int, int | None, Holder] | None" = None  # (this pid, task, start, holder)


def for_task(task: int, task_start: "int | None",
             daemon: "tuple[int, int | None] | None" = None, timeout: float = 30.0) -> Holder:
    """This process's connection to the holder, registered for `task`, made on first use (a
    forked child that asks makes its own) within `timeout` seconds."""
    global _mine
    if _mine is not None and _mine[:3] == (os.getpid(), task, task_start):
        return _mine[3]
    holder = start(task, task_start, timeout=timeout, daemon=daemon)
    _mine = (os.getpid(), task, task_start, holder)
    return holder


# -- the holder itself ------------------------------------------------------------------------
class _Loop:
    """One thread: a poll over descriptors, each with its callback."""

    def __init__(self) -> None:
        import select

        self.poll = select.poll()
        self.calls: "dict[int, Callable[[], None]]" = {}

    def add(self, fd: int, call: "Callable[[], None]") -> None:
        import select

        self.calls[fd] = call
        self.poll.register(fd, select.POLLIN)

    def drop(self, fd: int) -> None:
        if self.calls.pop(fd, None) is not None:
            self.poll.unregister(fd)


def _sock(fd: int) -> Any:
    import _socket

    return _socket.socket(fileno=fd)


def _recv_fds(sock: Any, size: int) -> "tuple[bytes, list[int]]":
    import _socket
    import array

    data, anc, _flags, _addr = sock.recvmsg(size, _socket.CMSG_SPACE(8 * 4))
    fds = array.array("i")
    for level, kind, payload in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _peer(sock: Any) -> "tuple[int, int]":
    """(pid, uid) of a Unix socket's peer, from the kernel."""
    import _socket
    import struct

    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def _append(path: str, text: str) -> None:
    """`text` appended to the log file `path`: created 0600, never through a symbolic link
    (O_NOFOLLOW), and only into a file of this user's with one name (a link another user
    planted to a file this one may write is refused)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_nlink == 1 and not st.st_mode & 0o077:
            os.write(fd, text.encode("utf-8", "replace"))
    except OSError:
        pass
    finally:
        os.close(fd)


def _finalize(sock: Any) -> None:
    """``cmd=finalize``, then wait (at most FINALIZE_WAIT) for the ack, then close."""
    try:
        sock.settimeout(FINALIZE_WAIT)
        sock.sendall(b"cmd=finalize\n")
        deadline = time.monotonic() + FINALIZE_WAIT
        buf = b""
        while b"finalize_ack" not in buf and time.monotonic() < deadline and len(buf) < MAX_LINE:
            part = sock.recv(4096)
            if not part:
                break
            buf += part
    except OSError:
        pass
    finally:
        sock.close()


class _Task:
    """One task's duties, ended when it ends."""

    def __init__(self, main: "_Main", pid: int, start: int) -> None:
        self.main, self.pid, self.start = main, pid, start
        self.finalize: "list[Any]" = []
        self.relays: "list[_PmiRelay]" = []
        self.held: "list[Any]" = []
        self.claims: "list[_Claim]" = []
        self.pidfd: "int | None" = None
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # before Linux 5.3: polled
            self.pidfd = None
        if self.pidfd is not None:
            main.loop.add(self.pidfd, self.end)

    def alive(self) -> bool:
        return start_time(self.pid) == self.start if self.start else os.path.exists(f"/proc/{self.pid}")

    def end(self) -> None:
        self.main.log(f"task {self.pid} ended")
        if self.pidfd is not None:
            self.main.loop.drop(self.pidfd)
            os.close(self.pidfd)
        for claim in self.claims:
            claim.close()
        for sock in self.held:
            self.main.loop.drop(sock.fileno())
            sock.close()
        for r in self.relays:
            r.end()
        for sock in self.finalize:
            _finalize(sock)
            self.main.log("sent finalize")
        self.main.tasks.pop(self.pid, None)


class _Main:
    """The holder: serves this user's processes that descend from `daemon` (the launcher's
    daemon on this node, or the one task a holder was started for)."""

    def __init__(self, listener: Any, daemon: int, log: str = "") -> None:
        self.log_path = log
        self.loop = _Loop()
        self.listener, self.daemon, self.uid = listener, daemon, os.getuid()
        import _socket

        listener.listen(_socket.SOMAXCONN)  # the peer its clients check is this process
        self.tasks: "dict[int, _Task]" = {}
        self.sessions: "dict[int, list[Any]]" = {}  # fd -> [sock, buffer, task pid, fds]
        self.loop.add(listener.fileno(), self._accept)
        self.started = time.monotonic()
        self.ever = False

    def log(self, text: str) -> None:
        if self.log_path:
            _append(self.log_path, f"{time.time():.3f} holder {os.getpid()}: {text}\n")

    def _accept(self) -> None:
        try:
            fd, _ = self.listener._accept()
        except OSError:
            return
        conn = _sock(fd)
        pid, uid = _peer(conn)
        if uid != self.uid or not descends(pid, self.daemon):
            self.log(f"refused process {pid} (uid {uid})")
            conn.close()
            return
        self.sessions[conn.fileno()] = [conn, b"", None, []]
        fd = conn.fileno()
        self.loop.add(fd, lambda: self._on_session(fd))

    def _on_session(self, fd: int) -> None:
        """Every complete line received so far, in order. Descriptors queue up as they arrive
        and each op takes as many as it needs (`TAKES`) from the front: the kernel can hand
        two messages in one read (one without descriptors, then one with), and a large one in
        several, its descriptors with its first bytes."""
        session = self.sessions[fd]
        sock = session[0]
        try:
            data, fds = _recv_fds(sock, 1 << 16)
        except OSError:
            data, fds = b"", []
        session[3].extend(fds)
        if not data:
            self._end_session(fd)
            return
        session[1] += data
        if len(session[1]) > MAX_CTRL and b"\n" not in session[1]:
            self._end_session(fd)
            return
        while b"\n" in session[1]:
            line, _, session[1] = session[1].partition(b"\n")
            op, fields = decode(line)
            need = TAKES.get(op, 0)
            mine, session[3][:need] = session[3][:need], []
            try:
                if len(mine) != need:
                    raise ValueError(f"{op} needs {need} descriptor(s), {len(mine)} came")
                if op == "watch":
                    session[2] = self._watch(int(fields["pid"]), int(fields.get("start") or 0))
                elif session[2] is None or session[2] not in self.tasks:
                    raise ValueError("no task registered on this connection")
                else:
                    getattr(self, "_op_" + op)(self.tasks[session[2]], fields, mine)
            except Exception as exc:  # noqa: BLE001 - answered to the rank, which raises it
                for extra in mine:
                    try:
                        os.close(extra)
                    except OSError:
                        pass
                self.log(f"{op} failed: {type(exc).__name__}: {exc}")
                if "quiet" not in fields:
                    self._reply(sock, f"error {type(exc).__name__}: {exc}")
                continue
            if "quiet" not in fields:
                self._reply(sock, f"ok pid={os.getpid()}")

    def _end_session(self, fd: int) -> None:
        session = self.sessions.pop(fd)
        for extra in session[3]:
            try:
                os.close(extra)
            except OSError:
                pass
        self.loop.drop(fd)
        session[0].close()

    @staticmethod
    def _reply(sock: Any, text: str) -> None:
        try:
            sock.sendall(text.replace("\n", " ").encode() + b"\n")
        except OSError:
            pass

    def _watch(self, pid: int, start: int) -> int:
        if start and start_time(pid) != start:
            raise ValueError(f"process {pid} is not the task (it ended, or the pid was reused)")
        if pid not in self.tasks:
            self.tasks[pid] = _Task(self, pid, start)
            self.ever = True
            self.log(f"watching task {pid}")
        return pid

    def _op_finalize(self, task: _Task, fields: "dict[str, str]", fds: "list[int]") -> None:
        (fd,) = fds
        task.finalize.append(_sock(fd))

    def _op_pmi_relay(self, task: _Task, fields: "dict[str, str]", fds: "list[int]") -> None:
        """The stepd's connection and the rank's new PMI_FD, taken before the exchange (the
        relay waits, reading neither, until `pmi_go`: the rank still talks on its own copy)."""
        up, down = fds
        task.relays.append(_PmiRelay(self, _sock(up), _sock(down)))

    def _op_pmi_go(self, task: _Task, fields: "dict[str, str]", fds: "list[int]") -> None:
        """The exchange is over: relay, answering a later init with the stepd's to ours."""
        task.relays[-1].go(fields.get("init", ""))

    def _op_hold(self, task: _Task, fields: "dict[str, str]", fds: "list[int]") -> None:
        """A connection to keep open, drained, until the task ends (the PMIx server's end of a
        finalized query's connection: `distenv.discovery.pmix_relay`)."""
        (fd,) = fds
        sock = _sock(fd)
        task.held.append(sock)
        self.loop.add(fd, lambda: self._drain(task, sock))

    def _drain(self, task: _Task, sock: Any) -> None:
        try:
            if sock.recv(65536):
                return
        except OSError:
            pass
        self.loop.drop(sock.fileno())  # the server closed it: nothing left to hold
        task.held.remove(sock)
        sock.close()

    def _op_claim(self, task: _Task, fields: "dict[str, str]", fds: "list[int]") -> None:
        (fd,) = fds
        claim = _sock(fd)
        claim.listen(16)  # listening again makes this process the peer later programs check
        task.claims.append(_Claim(self, claim, fields["answer"], task.pid))

    def run(self) -> None:
        while True:
            polled = any(t.pidfd is None for t in self.tasks.values())
            events = self.loop.poll.poll(200 if polled or not self.ever else None)
            for fd, _ in events:
                call = self.loop.calls.get(fd)
                if call is None:
                    continue
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - one broken duty ends only itself
                    self.log(f"{type(exc).__name__} in a callback: {exc}")
                    self.loop.drop(fd)
            for task in [t for t in self.tasks.values() if t.pidfd is None and not t.alive()]:
                task.end()
            if self.ever and not self.tasks:
                return  # every task it watched has ended
            if not self.ever and time.monotonic() - self.started > FIRST_TASK_WAIT:
                return


class _PmiRelay:
    """The rank's PMI_FD (`down`) joined to SLURM's stepd (`up`), line by line: a ``cmd=init``
    from the rank is answered here with the stepd's answer to distenv's own init (`init`);
    everything else goes on, one line at a time (the stepd reads a command per read)."""

    def __init__(self, main: _Main, up: Any, down: Any) -> None:
        self.main, self.up, self.down = main, up, down
        self.init = ""
        self.buf = b""
        self.finalized = False
        self.open = True

    def go(self, init: str) -> None:
        self.init = init.strip() + "\n" if init.strip() else ""
        self.main.loop.add(self.down.fileno(), self._from_rank)
        self.main.loop.add(self.up.fileno(), self._from_stepd)

    def _from_rank(self) -> None:
        try:
            data = self.down.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close_down()
            return
        self.buf += data
        while b"\n" in self.buf:
            line, _, self.buf = self.buf.partition(b"\n")
            words = line.split()
            if words[:1] == [b"cmd=init"] and self.init:
                self.main.log("answered a later cmd=init itself")
                self.down.sendall(self.init.encode())
                continue
            if words[:1] == [b"cmd=finalize"]:
                self.finalized = True
            self.up.sendall(line + b"\n")
        if len(self.buf) > MAX_LINE:  # not PMI-1: stop relaying rather than buffer it all
            self._close_down()

    def _from_stepd(self) -> None:
        try:
            data = self.up.recv(65536)
        except OSError:
            data = b""
        if not data:  # the stepd closed it (after a finalize): so does the rank's end
            self.main.loop.drop(self.up.fileno())
            self._close_down()
            self.open = False
            return
        try:
            self.down.sendall(data)
        except OSError:
            pass

    def _close_down(self) -> None:
        if self.down.fileno() >= 0:
            self.main.loop.drop(self.down.fileno())
            self.down.close()

    def end(self) -> None:
        self._close_down()
        if self.open and not self.finalized:
            self.main.loop.drop(self.up.fileno())
            _finalize(self.up)
        else:
            self.up.close()


class _Claim:
    """The task's claim on a service: answers this user's processes of the same task."""

    def __init__(self, main: _Main, listener: Any, answer: str, task: int) -> None:
        self.main, self.listener, self.answer, self.task = main, listener, answer, task
        main.loop.add(listener.fileno(), self._accept)

    def _accept(self) -> None:
        try:
            fd, _ = self.listener._accept()
        except OSError:
            return
        client = _sock(fd)
        try:
            pid, uid = _peer(client)
            if uid == os.getuid() and descends(pid, self.task):
                client.settimeout(2.0)
                client.sendall(self.answer.encode() + b"\n")
            else:
                self.main.log(f"refused the claim to process {pid} (uid {uid})")
        except OSError:
            pass
        finally:
            client.close()

    def close(self) -> None:
        if self.listener.fileno() >= 0:
            self.main.loop.drop(self.listener.fileno())
            self.listener.close()


def _main(argv: "list[str]") -> None:
    keep, guard, log = int(argv[1]), int(argv[2]), (argv[3] if len(argv) > 3 else "")
    os.closerange(3, keep)  # posix_spawn passed every inheritable descriptor of the rank
    os.closerange(keep + 1, 1 << 16)
    if os.fork() != 0:  # the first process ends at once (see `_spawn`)
        os._exit(0)
    os.setsid()
    main = _Main(_sock(keep), guard, log)
    try:
        main.run()
    except BaseException as exc:  # noqa: BLE001 - nobody to report to but the log
        main.log(f"failed: {type(exc).__name__}: {exc}")
    for task in list(main.tasks.values()):
        task.end()
    os._exit(0)


if __name__ == "__main__":
    _main(sys.argv)
