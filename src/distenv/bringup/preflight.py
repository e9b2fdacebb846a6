"""The pre-flight: every process of a launch meets process 0 before a framework's own long and
silent wait, so that a process that never comes is named, within DISTENV_TIMEOUT, on every
process that did -- one `DistEnvError` line, one wording, for torch, JAX, TensorFlow and Horovod.

    took = meet(Meeting(size=n, index=i, host=rank0_host, port=port(env, rank0_host),
                        job=identity(env, "torch"), timeout=180, who="distenv.torch", noun="rank"))

A star on process 0 that holds no socket per peer, so that it meets thousands of processes
under the default descriptor limit of 1024 (measured: benchmarks/bench_preflight.py):

* process 0 listens (backlog: the system's maximum) and reads the hellos of many connections at
  once, each within `HELLO_WAIT` seconds and `HELLO_MAX` bytes, at most `CONCURRENT` open at a
  time; it records who came, answers one line and closes: ``wait <came> <size> <seconds left>``
  while some are missing, ``go`` once every process came; when its timeout passes first,
  ``missing <count> <ids>``: process 0 alone names the missing ones, and every other process
  reads that one answer;
* every other process says hello and, while told to wait (or while nothing listens yet), asks
  again after a pause that grows by half each time, jittered, up to `pace`: whatever the size,
  process 0 gets at most about `RATE` requests a second, and one host's processes make at
  most about `LOCAL_RATE`;
* process 0 returns once every process that came has its answer; one that came and then stops
  asking for `LINGER` seconds is named (it died or hangs after arriving);
* a hello carries a key of the job's identity (`identity`: launcher, job id, master address and
  port, the size, the port, and what the adapter adds, e.g. torchrun's restart count): another
  job's process is answered ``other`` and never counted; anything else is dropped at once.

Who can connect and what they can do: docs/guarantees.md#the-pre-flight-listener. The port is
the core's side port for "preflight" (`port`: DISTENV_PREFLIGHT_PORT, else derived from the job
like the master port), so the framework's own ports stay untouched until every process came.

Standard library only.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from dataclasses import dataclass

from .. import knobs
from ..errors import DistEnvError

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    import random
    from collections.abc import Iterable, Mapping
    from typing import Any

    from ..core.description import DistEnv

#: The first word of every hello (then the key, the process's index, its host and pid).
PROTOCOL = "distenv-preflight/1"
_HEAD = PROTOCOL.encode()
#: Requests a second process 0 answers at most while it waits: the clients' pace follows it.
RATE = 2000.0
#: Requests a second the processes of one host make at most while they wait: each costs its
#: process about a millisecond of CPU (measured: 768 workers on 2 cores asking 2 000 times a
#: second took more than both cores, and ended late), so many on one host ask less often.
LOCAL_RATE = 500.0
#: A client's first pause between two requests; the shortest and the longest pace.
FIRST_PAUSE, MIN_PACE, MAX_PACE = 0.01, 0.05, 5.0
#: Seconds process 0 gives a connection for its hello, and the longest hello it reads.
HELLO_WAIT, HELLO_MAX = 5.0, 512
#: Connections process 0 reads at once (fewer when its descriptor limit is low).
CONCURRENT = 256
#: Seconds a client waits for the one-line answer to its hello.
REPLY_WAIT = 10.0
#: Seconds process 0 keeps answering, after its verdict, for those that came and lack it.
LINGER = 30.0
#: Seconds past its deadline process 0 still reads the hellos already at its door (accepted, or
#: queued in the listen backlog) before it names anyone: a process whose request was waiting
#: there came in time, however slowly process 0 got to it under load.
DRAIN = 1.0
#: Seconds a rank waits on a store past its own deadline before it looks for process 0 itself:
#: process 0, which started about when it did, gives its verdict at its own deadline.
STORE_GRACE = 2.0
#: Seconds between process 0's progress lines while it waits.
PROGRESS_EVERY = 10.0
#: Indexes a message shows (the others are counted).
SHOWN = 20
#: The environment variable that sets the port on every process.
PORT_VAR = knobs.PREFLIGHT_PORT


@dataclass(frozen=True)
class Meeting:
    """Who meets where, and how the messages name things.

    `size` processes meet; this one is `index`; process 0 listens at `port` and is reached at
    `host`. `job`: the job's identity, the same on every process (`identity`). `timeout`:
    seconds process 0 waits for every process. The words: `who` speaks ("distenv.torch"),
    `noun` is what a process is called ("rank", "process", "worker"), `entry` what a process
    that never came did not reach ("init_process_group"), `address_from` where `host` came from,
    `address_fix` how to point the others at process 0, `place` what listens there when it is
    not process 0 itself ("rank 0's store"). `local`: the meeting's processes on this host
    (1 when unknown), which slows their pace where many share it (`pace`)."""

    size: int
    index: int
    host: str
    port: int
    job: str
    timeout: float
    who: str = "distenv"
    noun: str = "process"
    entry: str = "the framework's start"
    address_from: str = ""
    address_fix: str = "set MASTER_ADDR to its host on every process"
    place: str = ""
    local: int = 1


def _at(m: Meeting) -> str:
    """Who listens where: "process 0 at host:port (why)", or the meeting's own `place`."""
    return f"{m.place or m.noun + ' 0'} at {_where(m)}"


# -- what every adapter shares ----------------------------------------------------------------
def port(env: "DistEnv", host: "str | None" = None, environ: "Mapping[str, str] | None" = None,
         given: "int | str | None" = None) -> int:
    """The pre-flight's port: `given`, else DISTENV_PREFLIGHT_PORT, else derived from the job by
    the core's side-port rule (`distenv.knobs.side_port`): the same on every process, different
    across concurrent jobs, never the master port. `host`: process 0's host (default: the master
    address)."""
    from ..knobs import side_port

    return side_port(env, "preflight", environ, PORT_VAR, given, addr=host)


def identity(env: "DistEnv", *extra: object) -> str:
    """The job's identity for a hello: what every process of this launch sees alike and another
    job does not (launcher, job id, master address and port), plus `extra` (the framework, a
    restart count, ...)."""
    return "|".join(str(p) for p in (env.launcher, env.job_id, env.master_addr, env.master_port, *extra))


def pace(size: int, local: int = 1) -> float:
    """The longest pause between two requests of one process: `size` / `RATE` seconds, so that
    process 0 gets at most about RATE requests a second, and at least `local` / `LOCAL_RATE`
    (the meeting's processes on this host), within MIN_PACE..MAX_PACE."""
    return min(MAX_PACE, max(MIN_PACE, size / RATE, local / LOCAL_RATE))


#: What `descriptors` reports for a limit the system does not set.
UNLIMITED = 1 << 30


def descriptors(need: int = 0) -> int:
    """This process's descriptor limit, first raised to the hard limit when the soft one is
    below `need` (a framework then holds a connection per peer: torch's store and gloo, JAX's
    coordinator, TensorFlow's channels). Returns the soft limit now in force."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not a Unix
        return UNLIMITED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return UNLIMITED
    if soft >= need:
        return int(soft)
    new = hard if hard != resource.RLIM_INFINITY else need
    if new <= soft:
        return int(soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        return soft
    from ..log import get_logger

    get_logger(__name__).debug("descriptor limit raised from %d to %d (%d needed)", soft, new, need)
    return int(new)


def ranges(ids: "Iterable[object]", total: "int | None" = None) -> str:
    """The first SHOWN of `ids`, and how many in all (`total`, default: len(ids)) when there
    are more."""
    listed = list(ids)
    total = len(listed) if total is None else total
    shown = ", ".join(map(str, listed[:SHOWN]))
    return shown + (f", ... ({total} in all)" if total > min(len(listed), SHOWN) else "")


# -- the one wording -----------------------------------------------------------------------------
def _plural(noun: str) -> str:
    return f"{noun}({'es' if noun.endswith('s') else 's'})"


def _where(m: Meeting) -> str:
    from ..knobs import address

    return address(m.host, m.port) + (f" ({m.address_from})" if m.address_from else "")


def never_came(m: Meeting, ids: "Iterable[object]", seen: str, total: "int | None" = None) -> str:
    """The one message for processes that never came (`total` of them, `ids` the first ones):
    `seen` says who saw it (process 0 with the count and hosts, or a process that read process
    0's answer)."""
    return (f"{m.who}: {_plural(m.noun)} {ranges(ids, total)} of {m.size} never came to the pre-flight "
            f"within {m.timeout:.0f} s ({seen}): they did not start, crashed before {m.entry}, or "
            f"cannot reach {m.host}. Fix: start every {m.noun} (same launcher, same job), check "
            f"that {m.host} is reachable from them, or raise DISTENV_TIMEOUT.")


def unreachable(m: Meeting, met: "tuple[int, int] | None", other: bool, said: str = "") -> str:
    """Process 0 never answered this process (`met`: it did, (came, size), then went away;
    `said`: what the transport said, if anything)."""
    if met is not None:
        what = (f"met {_at(m)} ({met[0]} of {met[1]} had come), then lost it before every "
                f"{m.noun} came: {m.noun} 0 died or hangs")
    else:
        what = (f"could not reach {_at(m)} within {m.timeout:.0f} s: {m.noun} 0 "
                "did not start, died, or runs on another host")
    fix = (f"check that {m.noun} 0 started, that {m.host} is its host and reachable from here "
           f"(else {m.address_fix}), or raise DISTENV_TIMEOUT")
    if other:
        what += "; another job's pre-flight answers at that port"
        fix += f"; set {PORT_VAR} to a free port on every {m.noun}"
    if said:
        what += f" ({said})"
    return f"{m.who}: {m.noun} {m.index} of {m.size} {what}. Fix: {fix}."


def cannot_listen(m: Meeting, why: str) -> str:
    return (f"{m.who}: {m.noun} 0 cannot listen on port {m.port} for the pre-flight ({why}): "
            f"another job or a leftover process holds it. Fix: set {PORT_VAR} to a free port on "
            f"every {m.noun}.")


def went_silent(m: Meeting, ids: "Iterable[object]") -> str:
    return (f"{m.who}: {_plural(m.noun)} {ranges(ids)} of {m.size} came to the pre-flight, then "
            f"stopped asking for its answer for {LINGER:.0f} s: they died or hang after arriving. "
            f"Fix: look at their output, and start the job again.")


def twice(m: Meeting, index: int, first: str, second: str) -> str:
    return (f"{m.who}: two processes say they are {m.noun} {index} of {m.size} ({first} and "
            f"{second}): the launch started more processes than it numbered. Fix: start "
            f"{m.size} {m.noun}{'es' if m.noun.endswith('s') else 's'} numbered 0 to {m.size - 1} "
            "(one launcher, one job).")


# -- the meeting -------------------------------------------------------------------------------
def key(m: Meeting) -> str:
    """The hello's key: a digest of the job's identity, the size and where they meet."""
    import hashlib

    text = f"{m.job}|{m.size}|{m.host}|{m.port}"
    return hashlib.blake2s(text.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()


def meet(m: Meeting) -> float:
    """Meet every process of `m` (see the module doc); returns the seconds it took. Raises
    `DistEnvError` with the one wording when a process never came (on process 0 and on every
    process that came), when process 0 cannot be reached, or when its port is taken."""
    t0 = time.monotonic()
    if m.size <= 1:
        return 0.0
    if not 0 <= m.index < m.size:
        raise DistEnvError(f"{m.who}: {m.noun} {m.index} is not in 0..{m.size - 1}. Fix: pass "
                           "matching values.")
    descriptors(2 * m.size + 256)  # the framework's connections, one per peer, come next
    if m.index == 0:
        _Host(m, t0).run()
    else:
        _visit(m, t0)
    return time.monotonic() - t0


# -- process 0 ------------------------------------------------------------------------------------
def _backlog() -> int:
    """The system's largest listen backlog (the kernel cuts any larger value to it)."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return max(socket.SOMAXCONN, int(f.read().strip()))
    except (OSError, ValueError):
        return max(socket.SOMAXCONN, 4096)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class _Conn:
    __slots__ = ("sock", "until", "data")

    def __init__(self, sock: socket.socket, until: float) -> None:
        self.sock, self.until, self.data = sock, until, b""


class _Host:
    """Process 0: one thread, one listener, at most `limit` connections open at a time."""

    def __init__(self, m: Meeting, t0: float) -> None:
        import selectors

        self.m, self.t0, self.deadline = m, t0, t0 + m.timeout
        self.sel = selectors.DefaultSelector()  # first: a listener made before it would leak
        try:
            self.listener = self._listen()
        except BaseException:
            self.sel.close()
            raise
        self.key = key(m)
        self.came: "dict[int, tuple[str, str]]" = {}   # index -> (host, pid)
        self.asked: "dict[int, float]" = {}            # index -> last request
        self.told: "set[tuple[int, tuple[str, str]]]" = set()  # (index, who) has the verdict
        self.clash: "tuple[int, str, str] | None" = None
        self.verdict: "str | None" = None
        self.verdict_at = 0.0
        self.missing: "list[int]" = []                # at the verdict
        self.open: "dict[int, _Conn]" = {}
        self.second: "tuple[str, str] | None" = None  # the clash's second claimant
        self.paused = 0.0  # no accept before this (out of descriptors)
        self.limit = max(8, min(CONCURRENT, (descriptors() - 64) // 2))
        self.accepting = False
        self.queued = True  # connections may wait in the backlog (until an accept finds none)

    def _listen(self) -> socket.socket:
        m = self.m
        family = socket.AF_INET6 if ":" in m.host else socket.AF_INET
        here = ""  # every interface: the other nodes must reach it
        if _loopback(m.host):  # a one-node job: loopback only, at the very address dialed
            here = "127.0.0.1" if m.host == "localhost" else m.host
        try:
            listener = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # out of descriptors
            raise DistEnvError(cannot_listen(m, exc.strerror or str(exc))) from None
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((here, m.port))
            listener.listen(_backlog())
        except OSError as exc:
            listener.close()
            raise DistEnvError(cannot_listen(m, exc.strerror or str(exc))) from None
        listener.setblocking(False)
        return listener

    def run(self) -> None:
        progress = self.t0 + PROGRESS_EVERY
        try:
            self._accepting(True)
            while True:
                now = time.monotonic()
                self._decide(now)
                if self.verdict is not None:
                    waiting = [w for w in self._claimants() if w not in self.told]
                    if not waiting or now >= self.verdict_at + LINGER:
                        break
                elif now >= progress:
                    progress = now + PROGRESS_EVERY
                    self._progress(now)
                for fd, conn in list(self.open.items()):
                    if now >= conn.until:
                        self._drop(fd)
                self._accepting(len(self.open) < self.limit and now >= self.paused)
                for sel_key, _ in self.sel.select(0.1):
                    if sel_key.data is None:
                        self._accept(now)
                    else:
                        self._read(sel_key.fd)
        finally:
            for fd in list(self.open):
                self._drop(fd)
            self.sel.close()
            self.listener.close()
        self._outcome()

    def _accepting(self, on: bool) -> None:
        import selectors

        if on and not self.accepting:
            self.sel.register(self.listener, selectors.EVENT_READ, None)
        elif not on and self.accepting:
            self.sel.unregister(self.listener)
        self.accepting = on

    def _accept(self, now: float) -> None:
        import selectors

        while len(self.open) < self.limit:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:  # nothing pending
                self.queued = False
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # the listener stays readable: without a pause the loop would spin on it
                    self.paused = now + 0.05
                    self._accepting(False)
                return  # else the peer left already
            self.queued = True
            sock.setblocking(False)
            fd = sock.fileno()
            try:
                self.sel.register(sock, selectors.EVENT_READ, fd)
            except (OSError, ValueError):  # out of memory for the selector: not heard, closed
                sock.close()
                continue
            self.open[fd] = _Conn(sock, now + HELLO_WAIT)

    def _drop(self, fd: int) -> None:
        conn = self.open.pop(fd, None)
        if conn is not None:
            self.sel.unregister(conn.sock)
            conn.sock.close()

    def _read(self, fd: int) -> None:
        conn = self.open.get(fd)
        if conn is None:
            return
        try:
            chunk = conn.sock.recv(HELLO_MAX - len(conn.data))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        conn.data += chunk
        if not chunk or not _HEAD.startswith(conn.data[:len(_HEAD)]):
            self._drop(fd)  # gone, or not a pre-flight client (a web probe, a framework's channel)
            return
        if b"\n" not in conn.data:
            if len(conn.data) >= HELLO_MAX:
                self._drop(fd)
            return
        try:  # the peer closed already (it gave up waiting): an answer now never reaches it
            gone = conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:  # still there, waiting
            gone = False
        except OSError:  # reset
            gone = True
        answer = self._hello(conn.data.split(b"\n", 1)[0].decode("ascii", "replace"), not gone)
        if answer is not None:
            try:
                conn.sock.send(answer.encode())  # a few bytes into a fresh socket's buffer
            except OSError:
                pass
        self._drop(fd)

    def _hello(self, line: str, hears: bool = True) -> "str | None":
        """The answer to one hello line (None: not a hello, no answer); not `hears`: the peer
        closed its end, so a verdict is not counted as told."""
        words = line.split()
        if len(words) != 5 or words[0] != PROTOCOL:
            return None
        if words[1] != self.key:
            return "other\n"
        if not words[2].isdigit() or not 0 < int(words[2]) < self.m.size:
            return None
        index, who = int(words[2]), (words[3][:255], words[4][:20])
        now = time.monotonic()
        first = self.came.setdefault(index, who)
        if first != who and self.clash is None and self.verdict is None:
            self.clash = (index, f"{first[0]} pid {first[1]}", f"{who[0]} pid {who[1]}")
            self.second = who
        self.asked[index] = now
        self._decide(now)
        if self.verdict is None:
            return f"wait {len(self.came) + 1} {self.m.size} {max(0.0, self.deadline - now):.1f}\n"
        if hears:
            self.told.add((index, who))
        return self.verdict

    def _decide(self, now: float) -> None:
        if self.verdict is not None:
            return
        if self.clash is not None:
            index, first, second = self.clash
            self.verdict = f"twice {index} {first.replace(' ', '/')} {second.replace(' ', '/')}\n"
        elif len(self.came) >= self.m.size - 1:
            self.verdict = "go\n"
        elif now >= self.deadline:
            if now < self.deadline + DRAIN:
                if self.accepting:  # a hello still in the backlog came in time (a late loop)
                    self._accept(now)
                if self.queued or self.open:
                    return  # first hear those at the door: they came in time
            self.missing = self._missing()
            self.verdict = _missing_line(len(self.missing), self.missing[:SHOWN])
        else:
            return
        self.verdict_at = now

    def _claimants(self) -> "list[tuple[int, tuple[str, str]]]":
        """Every process that came, as (index, who): both of a clash's claimants."""
        out = list(self.came.items())
        if self.clash is not None and self.second is not None:
            out.append((self.clash[0], self.second))
        return out

    def _missing(self) -> "list[int]":
        return [i for i in range(1, self.m.size) if i not in self.came]

    def _hosts(self) -> str:
        names = sorted({socket.gethostname(), *(h for h, _ in self.came.values())})
        return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")

    def _progress(self, now: float) -> None:
        missing = self._missing()
        _log_progress(self.m, self.t0, self.m.size - len(missing), missing)

    def _outcome(self) -> None:
        m = self.m
        if self.clash is not None:
            raise DistEnvError(twice(m, *self.clash))
        if self.verdict == "go\n":
            silent = sorted(i for i, who in self.came.items() if (i, who) not in self.told)
            if silent:
                raise DistEnvError(went_silent(m, silent))
            return
        came = m.size - len(self.missing)
        raise DistEnvError(never_came(m, self.missing, f"{_at(m)} heard from "
                                                       f"{came} of {m.size}, on {self._hosts()}"))


# -- every other process -------------------------------------------------------------------------
def _settle(m: Meeting, words: "list[str]", where: str) -> bool:
    """Act on process 0's verdict: True for ``go``; a `DistEnvError` (the one wording) for
    ``missing`` or ``twice``; False for anything else. `where`: who gave it."""
    if words == ["go"]:
        return True
    if words[:1] == ["missing"] and len(words) == 3:
        ids = words[2].split(",")
        seen = (f"{m.noun} {m.index} came after {where} gave up" if str(m.index) in ids
                else f"{where} says so")
        raise DistEnvError(never_came(m, ids, seen, int(words[1]) if words[1].isdigit() else None))
    if words[:1] == ["twice"] and len(words) == 4:
        raise DistEnvError(twice(m, int(words[1]) if words[1].isdigit() else -1,
                                 words[2].replace("/", " "), words[3].replace("/", " ")))
    return False


def _missing_line(total: int, ids: "Iterable[int]") -> str:
    return f"missing {total} {','.join(map(str, ids))}\n"


def jitter() -> float:
    """A factor in [0.5, 1.5) from an RNG of distenv's own: the program's `random` (which it
    may have seeded, Keras its weights from it) is never drawn from, so every process leaves
    the pre-flight with the random state it came with, however often it asked."""
    global _rng
    if _rng is None:
        import random

        _rng = random.Random(os.urandom(16))
    return 0.5 + _rng.random()


_rng: "random.Random | None" = None


def _visit(m: Meeting, t0: float) -> None:
    hello = f"{PROTOCOL} {key(m)} {m.index} {_me()} {os.getpid()}\n".encode()
    cap = pace(m.size, m.local)
    end = t0 + m.timeout
    longest = t0 + 2 * m.timeout + LINGER  # however long process 0 says it still waits
    pause = FIRST_PAUSE
    met: "tuple[int, int] | None" = None
    other = False
    refused = 0  # requests in a row that found nothing listening at process 0's port
    addresses: "list[tuple[int, Any]]" = []
    while True:
        now = time.monotonic()
        if not addresses:
            addresses = _addresses(m.host, m.port)
        # A request even when a starved thread wakes past `end`: the verdict may be waiting.
        words = _ask(addresses, hello, max(end - now, 2 * MIN_PACE)).split()
        if words == ["refused"]:
            refused += 1
        elif words:
            refused = 0
        if _settle(m, words, _at(m)):
            return
        if words[:1] == ["wait"] and len(words) == 4:
            try:
                came, size, left = int(words[1]), int(words[2]), float(words[3])
            except ValueError:
                pass
            else:
                met = (came, size)
                # process 0 gives its verdict when its own time is up: wait for it a little longer
                end = min(max(end, now + left + 1.5 * cap + 5.0), longest)
        elif words == ["busy"] and met is not None:
            # process 0 took the request but had no time to answer: it is alive and answers,
            # lingering after its verdict, everyone who came -- wait on, as long as it may
            end = min(max(end, time.monotonic() + 1.5 * cap + 5.0), longest)
        elif words == ["other"]:
            other = True
        if time.monotonic() >= end:
            break
        time.sleep(max(0.0, min(pause * jitter(), end - time.monotonic())))
        pause = min(pause * 1.5, cap)
    raise DistEnvError(unreachable(m, met, other, "nothing listens at its port: it has not "
                                   "reached the pre-flight, or already ended it before this "
                                   f"{m.noun} came" if refused and met is None else ""))


# -- the same meeting over a key-value store ------------------------------------------------------
def meet_on(store: "Any", m: Meeting, t0: "float | None" = None) -> float:
    """Meet every process of `m` through a key-value store they all reach already -- torch's
    TCPStore, which torchrun's agent may host away from process 0 -- with the same verdicts
    and wording as `meet`, and a constant number of requests per process: each sets its key,
    counts itself, waits for the verdict key and reads it (two more when the verdict is late);
    the last to come publishes ``go``; when `m.timeout` passes first, process 0 alone finds the
    first missing ones (a bisection over the keys: SHOWN x log2(size) requests) and publishes
    ``missing``. Keys carry the job's identity (`key`). `store`: set, add, get, check, wait
    and compare_set as torch's Store has them. `t0`: when the wait began (default now)."""
    import datetime

    t0 = time.monotonic() if t0 is None else t0
    if m.size <= 1:
        return 0.0
    deadline = t0 + m.timeout
    prefix = f"distenv/preflight/{key(m)}/"
    verdict, where = prefix + "verdict", _at(m)

    def waited(keys: "list[str]", seconds: float) -> bool:
        try:
            store.wait(keys, datetime.timedelta(seconds=max(0.01, seconds)))
            return True
        except Exception:  # noqa: BLE001 - a timeout (torch's DistStoreError); a store that is
            return False  # gone fails the next request, which says so

    try:
        # claimed, not set: a second process saying it is this index (a wrong launch) must not
        # count as the one that is missing (the key's prefix is per job, restart and call)
        mine = f"{_me()}/pid/{os.getpid()}"
        first = store.compare_set(f"{prefix}rank/{m.index}", "", mine)
        first = first.decode("ascii", "replace") if isinstance(first, bytes) else str(first)
        if first != mine:
            store.compare_set(verdict, "", f"twice {m.index} {first} {mine}")
        elif int(store.add(prefix + "count", 1)) >= m.size:
            store.compare_set(verdict, "", "go")
        if m.index == 0:
            line = _keep(store, m, prefix, t0, deadline)
        elif waited([verdict], deadline + STORE_GRACE - time.monotonic()):
            line = store.get(verdict).decode("ascii", "replace")
        elif not store.check([f"{prefix}rank/0"]):  # no process 0 to give a verdict: say so here
            came = int(store.add(prefix + "count", 0))
            raise DistEnvError(never_came(m, [0], f"{m.noun} {m.index} at {where} saw {came} of "
                                                  f"{m.size}", m.size - came))
        elif waited([verdict], m.timeout + 5.0):  # process 0 came after us: its deadline is later
            line = store.get(verdict).decode("ascii", "replace")
        else:
            raise DistEnvError(unreachable(m, (int(store.add(prefix + "count", 0)), m.size), False))
    except DistEnvError:
        raise
    except Exception as exc:  # noqa: BLE001 - the store is gone (process 0, or the agent, ended)
        text = " ".join(str(exc).split())[:300]
        raise DistEnvError(f"{m.who}: {m.noun} {m.index} of {m.size} lost the store at "
                           f"{_where(m)} while waiting for every {m.noun} ({text}): the process "
                           f"that hosts it ended. Fix: look at {m.noun} 0's output (it failed "
                           "first), and start the job again.") from None
    words = line.split()
    if words[:1] == ["missing"] and len(words) == 3 and m.index != 0 and words[1].isdigit():
        # read: process 0 may end (and its store with it) once every process that came read it
        if int(store.add(prefix + "read", 1)) >= m.size - int(words[1]) - 1:
            store.set(prefix + "read/all", "1")
    if m.index == 0 and words[:1] == ["missing"] and len(words) == 3 and words[1].isdigit():
        came = m.size - int(words[1])
        if came > 1:
            waited([prefix + "read/all"], LINGER)
        raise DistEnvError(never_came(m, words[2].split(","), f"{where} heard from {came} of "
                                                              f"{m.size}", int(words[1])))
    if not _settle(m, words, where):
        raise DistEnvError(unreachable(m, None, True))  # a verdict of another protocol
    return time.monotonic() - t0


def _keep(store: "Any", m: Meeting, prefix: str, t0: float, deadline: float) -> str:
    """Process 0 over a store: wait for the verdict, logging progress; publish ``missing``
    when the time is up (unless the last one published ``go`` meanwhile). Returns the verdict."""
    import datetime

    verdict = prefix + "verdict"
    while True:
        now = time.monotonic()
        step = min(PROGRESS_EVERY, deadline - now)
        if step > 0:
            try:
                store.wait([verdict], datetime.timedelta(seconds=step))
            except Exception:  # noqa: BLE001 - torch's DistStoreError: a timeout
                pass
        if store.check([verdict]):
            return str(store.get(verdict).decode("ascii", "replace"))
        came = int(store.add(prefix + "count", 0))
        missing = _absent(store, prefix, m.size, SHOWN)
        if time.monotonic() < deadline:
            _log_progress(m, t0, m.size - came, missing)
            continue
        # every key there: the last ones set theirs after the count was read, and are counting
        line = _missing_line(m.size - came, missing).strip() if missing else "go"
        published = store.compare_set(verdict, "", line)
        return str(published.decode("ascii", "replace"))


def _absent(store: "Any", prefix: str, size: int, limit: int) -> "list[int]":
    """The first `limit` indexes (from 1) whose key is not in `store`: a bisection, one
    `check` per range, so about limit x log2(size) requests instead of one per index."""
    out: "list[int]" = []

    def look(lo: int, hi: int) -> None:
        if len(out) >= limit or lo >= hi or store.check([f"{prefix}rank/{i}" for i in range(lo, hi)]):
            return
        if hi - lo == 1:
            out.append(lo)
            return
        mid = (lo + hi) // 2
        look(lo, mid)
        look(mid, hi)

    look(1, size)
    return out


def _log_progress(m: Meeting, t0: float, came: int, missing: "list[int]") -> None:
    from ..log import get_logger

    get_logger(m.who).info(
        "%d of %d %ss joined; waiting for %s (%d s so far; gives up after %d s, DISTENV_TIMEOUT)",
        came, m.size, m.noun, ranges(missing, m.size - came), time.monotonic() - t0, m.timeout)


def _me() -> str:
    name = socket.gethostname() or "?"
    return "".join(c if c.isprintable() and not c.isspace() else "?" for c in name)[:255]


def _addresses(host: str, port: int) -> "list[tuple[int, Any]]":
    """process 0's addresses, looked up once (not at every request); [] while the name does
    not resolve."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [(family, addr) for family, _, _, _, addr in found]


def _ask(addresses: "list[tuple[int, Any]]", hello: bytes, left: float) -> str:
    """One request: say hello, read the one-line answer ("" when nothing answered; "refused"
    when nothing listens at any address; "busy" when process 0's listener took the hello but
    no answer came in time: it is there, and slow). The request ends within `left` seconds
    (and REPLY_WAIT) in all: a peer that trickles bytes cannot stretch it read by read."""
    deadline = time.monotonic() + min(max(left, 0.05), REPLY_WAIT)
    refused = bool(addresses)
    for family, addr in addresses:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # out of descriptors, no such family here: this address not asked
            refused = False
            continue
        sent = False
        try:
            sock.settimeout(max(0.05, min(2.0, deadline - time.monotonic())))
            sock.connect(addr)
            refused = False
            sock.sendall(hello)
            sent = True
            data = b""
            while not data.endswith(b"\n") and len(data) < HELLO_MAX:
                rest = deadline - time.monotonic()
                if rest <= 0:
                    return "busy"
                sock.settimeout(rest)
                chunk = sock.recv(HELLO_MAX - len(data))
                if not chunk:
                    break
                data += chunk
            return data.decode("ascii", "replace").strip()
        except ConnectionRefusedError:
            continue
        except socket.timeout:  # TimeoutError from Python 3.10
            if sent:
                return "busy"
            refused = False
            continue
        except OSError:
            refused = False
            continue
        finally:
            sock.close()
    return "refused" if refused else ""


__all__ = ["Meeting", "meet", "meet_on", "jitter", "port", "identity", "pace", "descriptors", "ranges", "key",
           "never_came", "unreachable", "cannot_listen", "went_silent", "twice", "PORT_VAR"]
