"""The holder: a small process that keeps what discovery opened until the launcher's task ends.

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
* **PMIx over TCP**: the query process connects through this relay, and the server's end of
  that connection is held until the task ends (PMIx 5.0's finalize race: docs/discovery.md).
* **The claim**: a later program of the same task (the job script's next ``python``) gets the
  answer from here instead of asking the service a second time.

Why a process of its own, exec'ed: a fork of the rank would keep a copy-on-write image of its
whole address space for the job's life (measured: 211 MB held after the rank freed it); a
thread would end with the Python that asked (a wrapper script's later programs, ``distenv
run``'s exec). This file is run as ``python -I -S _holder.py``: standard library only, no
import of distenv, its memory a bare interpreter's.

Who may talk to it: its control socket is a socket pair inherited from the process that started
it, nothing else can reach it; the PMIx relay's loopback listener accepts only connections
whose owner (the kernel's /proc/net/tcp) is this user, at most `max` of them, and only while
the query runs; the claim (an abstract Unix socket named after the task) answers only this
user's processes that descend from the task (SO_PEERCRED, /proc). docs/guarantees.md has the
trust model.

The control protocol (`Holder` below is its client): one JSON object per message on the
socket pair, descriptors attached (SCM_RIGHTS); each answered ``{"ok": true}`` or
``{"error": "..."}``. Messages: ``watch`` (pid, start time: the task; first), ``finalize``
(one PMI-1 connection), ``pmi_relay`` (stepd connection, the rank's end of a socket pair, the
stepd's init answer), ``pmix_relay`` (a listening socket, the server's address, the cap),
``pmix_done``, ``claim`` (a listening abstract socket, the answer, the task).
"""

from __future__ import annotations

import os
import socket
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

#: Longest line a PMI-1 peer may send before the relay gives up on it (a PMI-1 command is
#: at most a few KB: keys, and values of vallen_max, 1024 or 4096 measured).
MAX_LINE = 1 << 16
#: Seconds the holder waits for a ``finalize_ack`` once the task has ended.
FINALIZE_WAIT = 5.0


# -- the client side (in the rank) ------------------------------------------------------------
class HolderError(OSError):
    """The holder could not be started or refused a duty."""


class Holder:
    """A started holder; `ask` gives it a duty (and descriptors)."""

    def __init__(self, ctrl: socket.socket, pid: int) -> None:
        self.ctrl, self.pid = ctrl, pid

    def ask(self, op: str, fds: "Sequence[int]" = (), **fields: Any) -> "dict[str, Any]":
        import json

        msg = (json.dumps({"op": op, **fields}) + "\n").encode()
        try:
            socket.send_fds(self.ctrl, [msg], list(fds))
            reply = b""
            while not reply.endswith(b"\n"):
                part = self.ctrl.recv(4096)
                if not part:
                    raise HolderError(f"the holder (pid {self.pid}) ended before answering {op}")
                reply += part
        except OSError as exc:
            if isinstance(exc, HolderError):
                raise
            raise HolderError(f"the holder (pid {self.pid}) did not take {op}: {exc}") from None
        got: "dict[str, Any]" = json.loads(reply)
        if not got.get("ok"):
            raise HolderError(f"the holder refused {op}: {got.get('error')}")
        return got

    def close(self) -> None:
        self.ctrl.close()


def start(task: int, task_start: "int | None", timeout: float = 30.0) -> Holder:
    """Start a holder that watches `task` (its start time `task_start`, from /proc: a pid
    reused by another process is never watched); `HolderError` if it cannot be started."""
    import subprocess

    if not sys.executable:
        raise HolderError("no Python interpreter to run the holder (sys.executable is empty)")
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # -I: isolated (no cwd, user site or PYTHON* variables); -S: no site at all
        argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(theirs.fileno())]
        log = os.environ.get("DISTENV_HOLDER_LOG")
        env = {"DISTENV_HOLDER_LOG": log} if log else {}
        p = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             close_fds=True, env=env)
        # it forks at once and its first process exits: the holder is nobody's child (a
        # shell that waits for its children, or the program distenv run execs, never waits)
        p.wait(timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        mine.close()
        raise HolderError(f"could not start the holder: {exc}") from None
    finally:
        theirs.close()
    mine.settimeout(timeout)
    holder = Holder(mine, p.pid)
    try:
        holder.pid = int(holder.ask("watch", pid=task, start=task_start)["pid"])
    except HolderError:
        mine.close()
        raise
    return holder


_mine: "tuple[int, int, int | None, Holder] | None" = None  # (this pid, task, start, holder)


def for_task(task: int, task_start: "int | None") -> Holder:
    """This process's holder for `task`, started on first use (one per process: a forked
    child that asks gets its own)."""
    global _mine
    if _mine is not None and _mine[:3] == (os.getpid(), task, task_start):
        return _mine[3]
    holder = start(task, task_start)
    _mine = (os.getpid(), task, task_start, holder)
    return holder


def start_time(pid: int) -> "int | None":
    """Field 22 of /proc/<pid>/stat (clock ticks since boot): with the pid, a process's
    identity (a pid alone may be reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def parent_of(pid: int) -> "int | None":
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def descends(pid: int, ancestor: int, depth: int = 64) -> bool:
    """Is `pid` `ancestor` or one of its descendants?"""
    for _ in range(depth):
        if pid == ancestor:
            return True
        parent = parent_of(pid)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False


def tcp_owner(local: "tuple[str, int]", remote: "tuple[str, int]") -> "int | None":
    """The uid owning the TCP socket whose local address is `local` and remote `remote`
    (the kernel's /proc/net/tcp and tcp6), or None when none is listed."""

    def hexaddr(host: str, port: int, six: bool) -> str:
        if ":" in host:
            if not six:
                raise ValueError(host)
            raw = socket.inet_pton(socket.AF_INET6, host)
        else:
            raw = socket.inet_pton(socket.AF_INET, host)
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


# -- the holder itself ------------------------------------------------------------------------
class _Main:
    """The holder's one thread: a selector over its control socket, the watched task, and
    whatever it holds or relays."""

    def __init__(self, ctrl: socket.socket) -> None:
        import selectors

        self.sel = selectors.DefaultSelector()
        self.ctrl: "socket.socket | None" = ctrl
        self.ctrl_buf = b""
        self.task: "int | None" = None
        self.task_start: "int | None" = None
        self.pidfd: "int | None" = None
        self.finalize: "list[socket.socket]" = []   # PMI-1 connections to finalize at the end
        self.relays: "list[_PmiRelay]" = []
        self.pmix: "_PmixRelay | None" = None
        self.claim: "_Claim | None" = None
        self.held: "list[socket.socket]" = []       # PMIx server ends held until the end
        self.sel.register(ctrl, selectors.EVENT_READ, self._on_ctrl)

    def log(self, text: str) -> None:
        path = os.environ.get("DISTENV_HOLDER_LOG")
        if path:
            try:
                with open(path, "a") as f:
                    f.write(f"{time.time():.3f} holder {os.getpid()}: {text}\n")
            except OSError:
                pass

    # control
    def _on_ctrl(self, sock: socket.socket) -> None:
        import json

        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_LINE, 8)
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            self.sel.unregister(sock)
            sock.close()
            self.ctrl = None  # no more duties; the holder lives on until the task ends
            return
        self.ctrl_buf += data
        if b"\n" not in self.ctrl_buf:
            if len(self.ctrl_buf) > MAX_LINE:
                self.ctrl_buf = b""
                self._reply(sock, error="message too long")
            for fd in fds:
                os.close(fd)
            return
        line, _, self.ctrl_buf = self.ctrl_buf.partition(b"\n")
        try:
            msg = json.loads(line)
            getattr(self, "_op_" + str(msg.get("op")))(msg, fds)
        except Exception as exc:  # noqa: BLE001 - answered to the rank, which raises it
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._reply(sock, error=f"{type(exc).__name__}: {exc}")
            return
        self._reply(sock)

    @staticmethod
    def _reply(sock: socket.socket, error: "str | None" = None) -> None:
        import json

        try:
            reply = {"ok": True, "pid": os.getpid()} if error is None else {"error": error}
            sock.sendall((json.dumps(reply) + "\n").encode())
        except OSError:
            pass

    def _op_watch(self, msg: "dict[str, Any]", fds: "list[int]") -> None:
        import selectors

        pid, start = int(msg["pid"]), msg.get("start")
        if start is not None and start_time(pid) != int(start):
            raise ValueError(f"process {pid} is not the task (it ended, or the pid was reused)")
        self.task, self.task_start = pid, start
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # before Linux 5.3: polled in run()
            self.pidfd = None
        if self.pidfd is not None:
            self.sel.register(self.pidfd, selectors.EVENT_READ, self._on_task_end)
        self.log(f"watching task {pid}")

    def _op_finalize(self, msg: "dict[str, Any]", fds: "list[int]") -> None:
        (fd,) = fds
        self.finalize.append(socket.socket(fileno=fd))

    def _op_pmi_relay(self, msg: "dict[str, Any]", fds: "list[int]") -> None:
        up, down = (socket.socket(fileno=fd) for fd in fds)
        relay = _PmiRelay(self, up, down, str(msg["init"]))
        self.relays.append(relay)

    def _op_pmix_relay(self, msg: "dict[str, Any]", fds: "list[int]") -> None:
        (fd,) = fds
        family, host, port = msg["server"]
        self.pmix = _PmixRelay(self, socket.socket(fileno=fd), (int(family), str(host), int(port)),
                               int(msg.get("max", 2)), int(msg.get("uid", os.getuid())))

    def _op_pmix_done(self, msg: "dict[str, Any]", fds: "list[int]") -> None:
        if self.pmix is not None:
            self.pmix.stop(drop=bool(msg.get("drop")))

    def _op_claim(self, msg: "dict[str, Any]", fds: "list[int]") -> None:
        (fd,) = fds
        self.claim = _Claim(self, socket.socket(fileno=fd), str(msg["answer"]), int(msg["task"]))

    # the end
    def _on_task_end(self, _fd: Any) -> None:
        raise _TaskEnded

    def _task_alive(self) -> bool:
        if self.task is None:
            return True
        return start_time(self.task) == self.task_start if self.task_start is not None else \
            os.path.exists(f"/proc/{self.task}")

    def run(self) -> None:
        try:
            while True:
                # no pidfd: look at the task every 200 ms; no watch yet: the control socket
                # must give one soon (the rank waits for the answer)
                timeout = None if self.pidfd is not None or self.task is None else 0.2
                events = self.sel.select(timeout)
                for key, _ in events:
                    try:
                        key.data(key.fileobj)
                    except _TaskEnded:
                        raise
                    except Exception as exc:  # noqa: BLE001 - one broken duty ends only itself
                        self.log(f"{type(exc).__name__} in {key.data}: {exc}")
                        try:
                            self.sel.unregister(key.fileobj)
                        except (KeyError, ValueError):
                            pass
                if self.task is not None and self.pidfd is None and not self._task_alive():
                    raise _TaskEnded
                if self.task is None and self.ctrl is None:
                    return  # started but never told what to watch
        except _TaskEnded:
            self.log(f"task {self.task} ended")
        self.end()

    def end(self) -> None:
        if self.claim is not None:
            self.claim.close()
        if self.pmix is not None:
            self.pmix.stop(drop=True)
        for relay in self.relays:
            relay.end()
        for sock in self.finalize:
            _finalize(sock)
            self.log("sent finalize")
        for sock in self.held:
            sock.close()


class _TaskEnded(Exception):
    pass


def _finalize(sock: socket.socket) -> None:
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


class _PmiRelay:
    """The rank's PMI_FD (`down`) joined to SLURM's stepd (`up`), line by line: a ``cmd=init``
    from the rank is answered here with the stepd's answer to distenv's own init (`init`);
    everything else goes on, one line at a time (the stepd reads a command per read)."""

    def __init__(self, main: _Main, up: socket.socket, down: socket.socket, init: str) -> None:
        import selectors

        self.main, self.up, self.down, self.init = main, up, down, init.strip() + "\n"
        self.buf = b""
        self.finalized = False
        self.open = True
        main.sel.register(down, selectors.EVENT_READ, self._from_rank)
        main.sel.register(up, selectors.EVENT_READ, self._from_stepd)

    def _from_rank(self, _sock: Any) -> None:
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
            if words[:1] == [b"cmd=init"]:
                self.main.log("answered a later cmd=init itself")
                self.down.sendall(self.init.encode())
                continue
            if words[:1] == [b"cmd=finalize"]:
                self.finalized = True
            self.up.sendall(line + b"\n")
        if len(self.buf) > MAX_LINE:  # not PMI-1: stop relaying rather than buffer it all
            self._close_down()

    def _from_stepd(self, _sock: Any) -> None:
        try:
            data = self.up.recv(65536)
        except OSError:
            data = b""
        if not data:  # the stepd closed it (after a finalize): so does the rank's end
            self.main.sel.unregister(self.up)
            self._close_down()
            self.open = False
            return
        try:
            self.down.sendall(data)
        except OSError:
            pass

    def _close_down(self) -> None:
        try:
            self.main.sel.unregister(self.down)
        except (KeyError, ValueError):
            pass
        self.down.close()

    def end(self) -> None:
        self._close_down()
        if self.open and not self.finalized:
            _finalize(self.up)
        else:
            self.up.close()


class _PmixRelay:
    """A loopback listener the PMIx query process connects to; each accepted connection (this
    user's, at most `cap`) is joined to the server, whose end is held after the query process
    closes its own until the task ends; a connection that never carried a byte is closed."""

    def __init__(self, main: _Main, listener: socket.socket, server: "tuple[int, str, int]",
                 cap: int, uid: int) -> None:
        import selectors

        self.main, self.listener, self.server, self.cap, self.uid = main, listener, server, cap, uid
        self.accepted = 0
        self.pairs: "list[list[Any]]" = []  # [client, upstream, used]
        main.sel.register(listener, selectors.EVENT_READ, self._accept)

    def _accept(self, _sock: Any) -> None:
        import selectors

        try:
            client, peer = self.listener.accept()
        except OSError:
            return
        local = client.getsockname()
        owner = tcp_owner((peer[0], peer[1]), (local[0], local[1]))
        if owner != self.uid or self.accepted >= self.cap:
            self.main.log(f"refused a relay connection from {peer} (owner {owner})")
            client.close()
            return
        self.accepted += 1
        if self.accepted >= self.cap:
            self.stop()
        family, host, port = self.server
        try:
            up = socket.create_connection((host, port), timeout=30)
            up.settimeout(None)
        except OSError:
            client.close()  # the query process sees the server unreachable, as without us
            return
        pair = [client, up, False]
        self.pairs.append(pair)
        self.main.sel.register(client, selectors.EVENT_READ, lambda s, p=pair: self._pump(p, 0))
        self.main.sel.register(up, selectors.EVENT_READ, lambda s, p=pair: self._pump(p, 1))

    def _pump(self, pair: "list[Any]", side: int) -> None:
        src, dst = pair[side], pair[1 - side]
        if src is None:  # closed by an earlier event of the same round
            return
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if data:
            pair[2] = True
            if dst is not None:
                try:
                    dst.sendall(data)
                except OSError:
                    pass
            return
        self.main.sel.unregister(src)
        if side == 1:  # the server closed: nothing left to hold
            src.close()
            if pair[0] is not None:
                try:
                    self.main.sel.unregister(pair[0])
                except (KeyError, ValueError):
                    pass
                pair[0].close()
            pair[0] = pair[1] = None
            return
        src.close()  # the query process is done with it
        pair[0] = None
        if not pair[2]:  # never used: nothing to hold
            self.main.sel.unregister(pair[1])
            pair[1].close()
            pair[1] = None
        # else: the server's end stays registered (drained) until the task ends

    def stop(self, drop: bool = False) -> None:
        try:
            self.main.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        if drop:
            for pair in self.pairs:
                for i in (0, 1):
                    if pair[i] is not None:
                        try:
                            self.main.sel.unregister(pair[i])
                        except (KeyError, ValueError):
                            pass
                        pair[i].close()
                        pair[i] = None


class _Claim:
    """The task's claim on the service: answers this user's processes of the same task."""

    def __init__(self, main: _Main, listener: socket.socket, answer: str, task: int) -> None:
        import selectors

        self.main, self.listener, self.answer, self.task = main, listener, answer, task
        main.sel.register(listener, selectors.EVENT_READ, self._accept)

    def _accept(self, _sock: Any) -> None:
        import struct

        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        try:
            raw = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _gid = struct.unpack("3i", raw)
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
        try:
            self.main.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()


def _main(argv: "list[str]") -> None:
    ctrl_fd = int(argv[1])
    if os.fork() != 0:  # the first process ends at once (see `start`)
        os._exit(0)
    os.setsid()
    ctrl = socket.socket(fileno=ctrl_fd)
    main = _Main(ctrl)
    try:
        main.run()
    except BaseException as exc:  # noqa: BLE001 - nobody to report to but the log
        main.log(f"failed: {type(exc).__name__}: {exc}")
    os._exit(0)


if __name__ == "__main__":
    _main(sys.argv)
