"""distenv.discovery.pmix_relay: the query process reaches the PMIx server through this process, and the
server's end stays open after the query process has closed (real sockets, a fake server)."""

from __future__ import annotations

import os
import select
import socket

import pytest

from distenv.discovery import pmix_relay
from distenv.discovery.pmix_relay import open_relay, server_address

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
    s.listen(1)
    yield s
    s.close()


def through(server: socket.socket, **extra):
    """(relay, the query process's socket, the server's socket for it)."""
    environ = {**uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}"), **extra}
    relay = open_relay(environ)
    assert relay is not None
    # the query process gets the relay's address under the server's own name
    assert set(relay.env) == set(URIS)
    host_port = relay.env["PMIX_SERVER_URI41"]
    assert host_port.startswith("prterun-vm-42@0.0;tcp4://127.0.0.1:")
    port = int(host_port.rsplit(":", 1)[1])
    assert port != server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    server.settimeout(10)
    upstream, _ = server.accept()
    upstream.settimeout(10)  # a relay that stops pumping fails the test, never hangs it
    return relay, client, upstream


def test_carries_both_ways_then_holds_the_server_s_end_until_dropped(server):
    relay, client, upstream = through(server)
    client.sendall(b"connect-ack")
    assert upstream.recv(100) == b"connect-ack"
    upstream.sendall(b"reply")
    assert client.recv(100) == b"reply"
    client.close()  # the query process finalized and exited
    # the server sees no close: nothing to read (an EOF would be readable at once)
    assert not readable(upstream, 0.5)
    upstream.sendall(b"late event")  # the server may still write: drained, not an error
    assert not readable(upstream, 0.3)
    relay.stop(drop=True)  # the query failed: the server must see the loss now
    assert readable(upstream, 5) and upstream.recv(100) == b""


def test_the_server_closing_first_closes_the_query_s_end(server):
    relay, client, upstream = through(server)
    upstream.close()
    assert readable(client, 5) and client.recv(100) == b""
    relay.stop()


def test_stop_refuses_new_connections(server):
    relay, client, upstream = through(server)
    relay.stop()
    port = int(relay.env["PMIX_SERVER_URI41"].rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    client.close()


def test_an_unreachable_server_is_unreachable_through_the_relay_too():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there
    relay = open_relay(uris(f"tcp4://127.0.0.1:{port}"))
    assert relay is not None
    client = socket.create_connection(
        ("127.0.0.1", int(relay.env["PMIX_SERVER_URI41"].rsplit(":", 1)[1])), timeout=10)
    assert readable(client, 10) and client.recv(100) == b""
    relay.stop()


@pytest.mark.parametrize("value", ["0", "off", "no", "false"])
def test_turned_off(server, value):
    environ = {**uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}"), "DISTENV_PMIX_RELAY": value}
    assert open_relay(environ) is None


def test_no_loopback_means_no_relay(monkeypatch, server):
    def refuse(*args, **kwargs):
        raise OSError("no loopback here")

    monkeypatch.setattr(pmix_relay, "Relay", refuse)
    assert open_relay(uris(f"tcp4://127.0.0.1:{server.getsockname()[1]}")) is None


EXEC_AFTER = r"""
import os, socket, sys, time
from distenv.discovery.pmix_relay import open_relay
port = int(sys.argv[1])
relay = open_relay({"PMIX_SERVER_URI41": "srv.0;tcp4://127.0.0.1:%d" % port})
client = socket.create_connection(("127.0.0.1", int(relay.env["PMIX_SERVER_URI41"].rsplit(":", 1)[1])))
client.sendall(b"hello")
assert client.recv(5) == b"howdy"
client.close()        # the query process is done
relay.stop()
time.sleep(0.2)       # the relay has seen the close (it holds the server's end now)
os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1.5)"])  # as distenv run
"""


def test_the_held_end_survives_exec_and_closes_when_the_command_ends(server):
    """`distenv run` execs the command after the query: the server sees the close only when
    the command has ended, not at the exec."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", EXEC_AFTER, str(server.getsockname()[1])],
                         env=env)
    server.settimeout(20)
    upstream, _ = server.accept()
    assert upstream.recv(5) == b"hello"
    upstream.sendall(b"howdy")
    start = time.monotonic()
    assert readable(upstream, 30) and upstream.recv(100) == b""  # the close, at last
    held = time.monotonic() - start
    assert p.wait(10) == 0
    assert held >= 1.5, held  # not at the exec (0.2 s in) but at the command's end


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
        relay, client, upstream = through(server)
        assert client.fileno() > 1024  # the relay's own sockets come after these too
        client.sendall(b"connect-ack")
        assert upstream.recv(100) == b"connect-ack"
        upstream.sendall(b"reply")
        assert readable(client, 5) and client.recv(100) == b"reply"
        client.close()
        assert not readable(upstream, 0.3)
        relay.stop(drop=True)
    finally:
        for fd in filler + [devnull]:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
