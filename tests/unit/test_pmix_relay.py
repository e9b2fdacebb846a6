"""distenv.discovery.pmix_relay: the query process reaches the PMIx server through this process while
it waits (`collect`), and the server's end stays open after the query process has closed, until
this process (or the program it execs) ends (real sockets, a fake server)."""

from __future__ import annotations

import os
import select
import socket
import threading
import time

import pytest

from distenv.discovery import pmix_relay
from distenv.discovery.pmix_relay import collect, open_relay, server_address

URIS = ("PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2")


def uris(url: str, name: str = "prterun-vm-42@0.0") -> dict:
    return {k: f"{name};{url}" for k in URIS}


@pytest.mark.parametrize("environ, want", [
    (uris("tcp4://127.0.0.1:38043"), (socket.AF_INET, "127.0.0.1", 38043)),
    (uris("tcp6://[::1]:5000"), (socket.AF_INET6, "::1", 5000)),
    ({**uris("tcp4://127.0.0.1:1"), "PMIX_SERVER_URI2": "x.0;tcp4://127.0.0.1:2"}, None),
    (uris("/tmp/pmix.sock"), None),       # not TCP: the query connects directly
    ({"PMIX_SERVER_URI41": "no-separator"}, None),
    ({}, None),
])
def test_server_address(environ, want):
    assert server_address(environ) == want


def readable(sock: socket.socket, seconds: float) -> bool:
    poll = select.poll()  # not select(): descriptors past 1023 in the last test
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(seconds * 1000))


@pytest.fixture
def server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s
    s.close()


class Query:
    """The rank's side while a query runs: `collect` relaying in a thread (this test plays
    the query process), until `end` closes the answer's pipe as the query process's exit does."""

    def __init__(self, relay, seconds: float = 30):
        self.relay = relay
        self.read, self.write = os.pipe()
        self.result: list = []
        self.thread = threading.Thread(target=lambda: self.result.append(
            collect(self.read, time.monotonic() + seconds, relay)))
        self.thread.start()

    def end(self, answer: bytes = b"answer", drop: bool = False, task=None):
        os.write(self.write, answer)
        os.close(self.write)
        self.thread.join(30)
        os.close(self.read)
        self.relay.stop(drop=drop, task=task)
        return self.result[0]


def port_of(relay) -> int:
    return int(relay.env["PMIX_SERVER_URI41"].rsplit(":", 1)[1])


def through(server: socket.socket, **extra):
    """(the running query, the query process's socket, the server's socket for it)."""
    environ = {**uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}"), **extra}
    relay = open_relay(environ)
    assert relay is not None
    # the query process gets the relay's address under the server's own name
    assert set(relay.env) == set(URIS)
    assert relay.env["PMIX_SERVER_URI41"].startswith("prterun-vm-42@0.0;tcp4://127.0.0.1:")
    assert port_of(relay) != server.getsockname()[1]
    query = Query(relay)
    client = socket.create_connection(("127.0.0.1", port_of(relay)), timeout=10)
    server.settimeout(10)
    upstream, _ = server.accept()
    upstream.settimeout(10)  # a relay that stops pumping fails the test, never hangs it
    return query, client, upstream


@pytest.fixture(autouse=True)
def nothing_held(monkeypatch):
    monkeypatch.setattr(pmix_relay, "held", [])
    monkeypatch.setattr(pmix_relay, "lines", [])
    yield
    for fd in pmix_relay.lines:  # a keeper a test started ends with its life line
        os.close(fd)


def test_carries_both_ways_then_holds_the_server_s_end_until_this_process_ends(server):
    query, client, upstream = through(server)
    client.sendall(b"connect-ack")
    assert upstream.recv(100) == b"connect-ack"
    upstream.sendall(b"reply")
    assert client.recv(100) == b"reply"
    client.close()  # the query process finalized and exited
    assert query.end() == b"answer"
    # the server sees no close: nothing to read (an EOF would be readable at once)
    assert not readable(upstream, 0.5)
    (kept,) = pmix_relay.held
    assert os.get_inheritable(kept.fileno())  # a program this process execs keeps it
    upstream.sendall(b"late event")  # the server may still write: not an error
    assert not readable(upstream, 0.3)
    kept.close()  # this process ends: a reset (the late event unread) or a close
    assert readable(upstream, 5)
    with pytest.raises(ConnectionResetError):
        upstream.recv(100)


@pytest.mark.parametrize("left", [-1.0, 20.0])
def test_the_hand_off_to_the_holder_waits_only_within_the_query_s_deadline(server, monkeypatch,
                                                                          left):
    """The server's end goes to the task's holder within what is left of the query's deadline
    (one deadline for the whole query); none left: held here, no holder asked."""
    from distenv.discovery import holder
    from distenv.discovery.chain import Chain

    asked = []

    def for_task(task, start, daemon=None, timeout=30.0):
        asked.append(timeout)
        raise holder.HolderError("not in this test")

    monkeypatch.setattr(holder, "for_task", for_task)
    query, client, upstream = through(server)
    client.sendall(b"x")
    assert upstream.recv(1) == b"x"
    client.close()
    os.write(query.write, b"answer")
    os.close(query.write)
    query.thread.join(30)
    os.close(query.read)
    task = Chain(1, "test", None, os.getppid(), None, ["sh"])  # a job script's: its holder
    query.relay.stop(task=task, deadline=time.monotonic() + left)
    assert len(asked) == (0 if left < 0 else 1) and all(0 < t <= left for t in asked), asked
    assert len(pmix_relay.held) == 1  # held here either way (the holder refused, or no time)


def test_a_failed_query_drops_the_connection_at_once(server):
    query, client, upstream = through(server)
    client.sendall(b"connect-ack")
    assert upstream.recv(100) == b"connect-ack"
    assert query.end(drop=True) == b"answer"
    assert pmix_relay.held == []  # the server must see the loss now, as without the relay
    assert readable(upstream, 5) and upstream.recv(100) == b""


def test_the_server_closing_first_closes_the_query_s_end(server):
    query, client, upstream = through(server)
    upstream.close()
    assert readable(client, 5) and client.recv(100) == b""
    query.end()
    assert pmix_relay.held == []


def test_stop_refuses_new_connections(server):
    query, client, upstream = through(server)
    query.end()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port_of(query.relay)), timeout=2)
    client.close()


def test_an_unreachable_server_is_unreachable_through_the_relay_too():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there
    relay = open_relay(uris(f"tcp4://127.0.0.1:{port}"))
    assert relay is not None
    query = Query(relay)
    client = socket.create_connection(("127.0.0.1", port_of(relay)), timeout=10)
    assert readable(client, 10) and client.recv(100) == b""
    query.end()


def test_the_wait_ends_at_the_deadline_and_says_so(server):
    relay = open_relay(uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}"))
    read, write = os.pipe()
    t0 = time.monotonic()
    assert collect(read, time.monotonic() + 1, relay) is None  # the writer never closed
    assert 0.9 < time.monotonic() - t0 < 5
    for fd in (read, write):
        os.close(fd)
    relay.stop(drop=True)


def test_another_users_connection_never_reaches_the_server(server):
    """Bytes from another user (uid 65534) reached the server before: the relay checks the
    connection's owner in the kernel's socket table and closes it unanswered."""
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another user")
    import encodings.idna  # noqa: F401 - the child cannot import it (root's Python, 0700)

    relay = open_relay(uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}"))
    query = Query(relay)
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(65534)
            s = socket.create_connection(("127.0.0.1", port_of(relay)), timeout=5)
            s.sendall(b"from a stranger")
            s.settimeout(5)
            try:
                got = s.recv(10)
            except ConnectionResetError:  # closed with our bytes unread: a reset
                got = b""
            os._exit(0 if got == b"" else 1)  # closed on it, nothing relayed
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    server.settimeout(1)
    with pytest.raises(socket.timeout):
        server.accept()  # no connection was made to the server for it
    # this user's connection still goes through
    mine = socket.create_connection(("127.0.0.1", port_of(relay)), timeout=5)
    server.settimeout(10)
    up, _ = server.accept()
    mine.sendall(b"ok")
    assert up.recv(2) == b"ok"
    query.end(drop=True)


def test_at_most_the_cap_and_unused_connections_are_not_held(server):
    """40 connections held 41 server sockets before: now at most MAX_CONNECTIONS, and a
    connection that never carried a byte closes the server's end."""
    assert pmix_relay.MAX_CONNECTIONS == 2
    relay = open_relay(uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}"))
    query = Query(relay)
    first = socket.create_connection(("127.0.0.1", port_of(relay)), timeout=5)
    server.settimeout(10)
    up1, _ = server.accept()
    first.close()  # never used
    up1.settimeout(10)
    second = socket.create_connection(("127.0.0.1", port_of(relay)), timeout=5)
    up2, _ = server.accept()
    with pytest.raises(OSError):  # the cap is reached: no more listening
        third = socket.create_connection(("127.0.0.1", port_of(relay)), timeout=2)
        third.settimeout(2)
        assert third.recv(1) == b""
        raise ConnectionRefusedError
    second.sendall(b"used")
    assert up2.recv(4) == b"used"
    second.close()
    query.end()
    assert up1.recv(10) == b""  # the unused one's server end closed, not held
    assert len(pmix_relay.held) == 1 and not readable(up2, 0.3)


@pytest.mark.parametrize("value", ["0", "off", "no", "false"])
def test_turned_off(server, value):
    environ = {**uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}"), "DISTENV_PMIX_RELAY": value}
    assert open_relay(environ) is None


def test_no_loopback_means_no_relay(monkeypatch, server):
    def refuse(*args, **kwargs):
        raise OSError("no loopback here")

    monkeypatch.setattr(pmix_relay, "Relay", refuse)
    assert open_relay(uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}")) is None


#: A rank: its query process (a fork here) talks to the server through the relay and exits;
#: then the rank keeps what the relay holds (`argv[2]` "self": no holder reachable) or hands it
#: to the task's holder ("parent": a job script, `argv[3]` the daemon whose holder serves it),
#: and execs or ends.
QUERY_THEN = r"""
import os, socket, sys, time
from distenv.discovery import pmix_relay
port, task = int(sys.argv[1]), sys.argv[2]
relay = pmix_relay.open_relay({"PMIX_SERVER_URI41": "srv.0;tcp4://127.0.0.1:%d" % port})
read, write = os.pipe()
if os.fork() == 0:  # the query process
    client = socket.create_connection(("127.0.0.1", int(relay.env["PMIX_SERVER_URI41"].rsplit(":", 1)[1])))
    client.sendall(b"hello")
    assert client.recv(5) == b"howdy"
    client.close()
    os._exit(0)
os.close(write)
assert pmix_relay.collect(read, time.monotonic() + 30, relay) == b""
os.wait()
from distenv.discovery.chain import Chain
from distenv.discovery.chain import start_time
if task in ("self", "keeper"):
    if task == "self":  # no task: no holder to reach
        relay.stop()
    else:  # the task is this process: a keeper holds it
        relay.stop(task=Chain(1, "test", None, os.getpid(), start_time(os.getpid()), []))
    assert len(pmix_relay.held) == (task == "self")
    time.sleep(0.2)
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1.5)"])  # as distenv run
daemon = int(sys.argv[3])
relay.stop(task=Chain(daemon, "test", None, os.getppid(), start_time(os.getppid()), ["sh"]))
assert pmix_relay.held == []  # the task's holder has it
"""


@pytest.mark.parametrize("task", ["self", "parent", "keeper"])
def test_the_held_end_closes_when_the_task_ends(server, task):
    """`distenv run` execs the command after the query: the server sees the close only when
    the command has ended, not at the exec ("self"). A job script ran Python, which asked
    and ended: the server sees the close when the script ends ("parent": the task's holder
    holds it). The same where the rank's keeper holds it ("keeper": the task is the rank)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", QUERY_THEN, str(server.getsockname()[1]), task]
    if task == "parent":
        argv = ["sh", "-c", '"$@"; sleep 1.5', "sh", *argv, str(os.getpid())]
    p = subprocess.Popen(argv, env=env)
    server.settimeout(20)
    upstream, _ = server.accept()
    assert upstream.recv(5) == b"hello"
    upstream.sendall(b"howdy")
    start = time.monotonic()
    assert readable(upstream, 30) and upstream.recv(100) == b""  # the close, at last
    held = time.monotonic() - start
    assert p.wait(10) == 0
    assert held >= 1.5, held  # not when Python ended or exec'ed but at the task's end


def test_descriptors_beyond_fd_setsize(server):
    """A rank that already holds many files (select() stops at descriptor 1023)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1200
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"the descriptor limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    devnull = os.open(os.devnull, os.O_RDONLY)
    filler = []
    try:
        while len(filler) < 1100:
            filler.append(os.dup(devnull))
        query, client, upstream = through(server)
        assert client.fileno() > 1024  # the relay's own sockets come after these too
        client.sendall(b"connect-ack")
        assert upstream.recv(100) == b"connect-ack"
        upstream.sendall(b"reply")
        assert readable(client, 5) and client.recv(100) == b"reply"
        client.close()
        query.end(drop=True)
        assert readable(upstream, 5) and upstream.recv(100) == b""
    finally:
        for fd in filler + [devnull]:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


#: A rank that hands its end to a keeper, says so, then waits for a line on its stdin.
KEEPER_RANK = r"""
import socket, sys
from distenv.discovery import pmix_relay
import os
leaked = os.pipe()[1]
os.set_inheritable(leaked, True)  # as a library may leave one: the keeper must not hold it
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(b"hello")
assert pmix_relay.keeper([sock])
assert sock.fileno() == -1  # closed here: the keeper has its copy
print("handed", flush=True)
sys.stdin.readline()
"""


def settled_descriptors(pid: int) -> "dict[int, str]":
    """`pid`'s descriptors once it waits in a read: right after its exec the dynamic loader
    opens and closes libraries on the lowest free number (CI saw fd 3 vanish mid-listing)."""
    deadline = time.monotonic() + 10
    last = None
    while time.monotonic() < deadline:
        try:
            now = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:  # one closed while listed
            now, state = None, "R"
        if now is not None and now == last and state == "S":
            return now
        last = now
        time.sleep(0.05)
    raise AssertionError(f"process {pid}'s descriptors did not settle in 10 s: {last}")


def test_a_keeper_holds_the_end_until_the_rank_ends_and_nothing_else(server):
    """The keeper (``cat`` on the rank's life line) keeps the server's end open while the rank
    lives, holds nothing of the rank's but that end, and closes it once the rank has ended."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rank = subprocess.Popen([sys.executable, "-c", KEEPER_RANK, str(server.getsockname()[1])],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        server.settimeout(20)
        upstream, _ = server.accept()
        assert upstream.recv(5) == b"hello"
        assert rank.stdout.readline() == b"handed\n"
        children = [int(c) for t in os.listdir(f"/proc/{rank.pid}/task")
                    for c in open(f"/proc/{rank.pid}/task/{t}/children").read().split()]
        (cat,) = [c for c in children if os.readlink(f"/proc/{c}/exe").endswith("/cat")]
        fds = settled_descriptors(cat)
        assert fds[0].startswith("pipe:") and fds[1] == fds[2] == "/dev/null"
        extra = [target for fd, target in fds.items() if fd > 2]
        assert len(extra) == 1 and extra[0].startswith("socket:"), fds  # the server's end alone
        upstream.sendall(b"late event")  # not an error
        assert not readable(upstream, 0.5)  # held
        rank.stdin.write(b"end\n")
        rank.stdin.close()
        assert rank.wait(10) == 0
        assert readable(upstream, 10)  # closed after the rank: a reset (the event unread)
        with pytest.raises(ConnectionResetError):
            upstream.recv(100)
    finally:
        rank.kill()
        rank.wait()


#: The same rank with its standard streams closed: the pipe and the socket get numbers 0-2.
KEEPER_RANK_CLOSED = r"""
import os, socket, sys, time
from distenv.discovery import pmix_relay
port = int(sys.argv[1])
for fd in (0, 1, 2):
    os.close(fd)
sock = socket.create_connection(("127.0.0.1", port))
sock.sendall(b"hello")
assert sock.fileno() <= 2
assert pmix_relay.keeper([sock])
assert min(pmix_relay.lines) > 2  # else a daemon's dup2 onto 1 would close it (found in review)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
os.dup2(1, 2)
time.sleep(1.5)
"""


def test_a_keeper_of_a_rank_without_standard_streams_still_holds_the_end(server):
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rank = subprocess.Popen([sys.executable, "-c", KEEPER_RANK_CLOSED, str(server.getsockname()[1])],
                            env=env)
    try:
        server.settimeout(20)
        upstream, _ = server.accept()
        assert upstream.recv(5) == b"hello"
        assert not readable(upstream, 1.0)  # held while the rank sleeps
        assert rank.wait(10) == 0
        assert readable(upstream, 10) and upstream.recv(100) == b""  # closed after the rank
    finally:
        rank.kill()
        rank.wait()


#: A rank whose process group gets the launcher's signals (PRRTE's Ctrl-C forwarding, a
#: SIGUSR1 checkpoint request) and handles them: its keeper must outlive them.
KEEPER_RANK_SIGNALLED = r"""
import os, signal, socket, sys, time
from distenv.discovery import pmix_relay
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(b"hello")
assert pmix_relay.keeper([sock])
me = os.getpid()
cats = [int(c) for c in open(f"/proc/{me}/task/{me}/children").read().split()]
for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda *a: None)
    os.killpg(os.getpgid(0), sig)
time.sleep(0.5)
print(" ".join(open(f"/proc/{c}/stat").read().split()[2] for c in cats), flush=True)
time.sleep(1.0)
"""


def test_a_keeper_outlives_the_signals_its_ranks_group_gets(server):
    """Found in review: under Open MPI 5 every rank leads a process group that PRRTE signals,
    and SLURM signals every process of a step: cat died of a SIGINT or SIGUSR1 the rank
    handled, closing the server's end while the rank lived. The keeper blocks them."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rank = subprocess.Popen([sys.executable, "-c", KEEPER_RANK_SIGNALLED, str(server.getsockname()[1])],
                            env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        server.settimeout(20)
        upstream, _ = server.accept()
        assert upstream.recv(5) == b"hello"
        states = rank.stdout.readline().split()
        assert states and all(st in ("S", "R") for st in states), states  # not Z: alive
        assert not readable(upstream, 0.5)  # still held while the rank lives
        assert rank.wait(10) == 0
        assert readable(upstream, 10) and upstream.recv(100) == b""  # closed after the rank
    finally:
        rank.kill()
        rank.wait()


def test_no_keeper_program_means_nothing_handed(server, monkeypatch):
    """No ``cat`` to start: nothing is handed (the caller falls back to the holder or to
    holding it itself) and nothing leaks."""
    monkeypatch.setattr(pmix_relay, "KEEPER", ("/nonexistent/cat",))
    before = len(os.listdir("/proc/self/fd"))
    sock = socket.create_connection(("127.0.0.1", server.getsockname()[1]))
    try:
        assert not pmix_relay.keeper([sock])
        assert sock.fileno() >= 0 and pmix_relay.lines == []
        assert len(os.listdir("/proc/self/fd")) == before + 1  # the socket alone
    finally:
        sock.close()
