"""What arrives over the wire or through the environment is bounded by the job and raises only
distenv's errors (issue 30, item 5): the PMI-1 reader, rank 0's summary, the hand-off
variables `distenv run` passes, and a later program's claim answer -- random and adversarial
input, with the memory it may take measured."""
from __future__ import annotations

import socket
import threading
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distenv import DistEnvError
from distenv.discovery import pmi
from distenv.discovery.handoff import decode_hosts
from distenv.discovery.apply import Answer

MB = 1 << 20


@pytest.mark.parametrize("text, size", [
    ("a/0*9999999999", 4),       # a run far past the job: was MemoryError
    ("a/0*3,0*3", 4),            # runs adding up past the job
    ("a/-1", 1),                 # a negative node index
    ("a,b/0,-1", 2),
    ("/0", 1),                   # an empty host name
    ("a,/0,1", 2),
    ("a/0*0", 0),
    ("a/0/99999", 1),            # a port outside 1-65535
])
def test_a_summary_that_is_not_this_jobs_is_one_pmi_error(text, size):
    tracemalloc.start()
    try:
        with pytest.raises(pmi.PMIError, match="Fix:"):
            pmi.decode(text, size)
        assert tracemalloc.get_traced_memory()[1] < MB
    finally:
        tracemalloc.stop()


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab,/*%0123456789-x", max_size=80), st.integers(0, 64))
def test_random_summaries(text, size):
    tracemalloc.start()
    try:
        try:
            hosts, port = pmi.decode(text, size)
        except pmi.PMIError:
            return
        assert len(hosts) == size and all(hosts) and (port is None or 0 < port < 65536)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < MB, peak


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_random_handoff_values(text):
    hosts = decode_hosts(text)
    assert hosts is None or all(hosts)
    assert Answer.from_json(text) is None or Answer.from_json(text).size >= 1


def feed(lines: bytes, expect: str = "get_result", timeout: float = 5.0):
    """What pmi's reader makes of `lines` sent by a peer."""
    import time

    ours, theirs = socket.socketpair()

    def peer():
        try:
            theirs.sendall(lines)
        except OSError:
            pass
        theirs.close()

    t = threading.Thread(target=peer, daemon=True)
    t.start()
    conn = pmi._Conn(ours, time.monotonic() + timeout)
    try:
        return conn.recv(expect)
    finally:
        ours.close()
        t.join(5)


def test_a_line_without_an_end_is_not_buffered_without_bound():
    endless = b"cmd=get_result value=" + b"x" * (8 * MB)  # made before measuring
    tracemalloc.start()
    try:
        with pytest.raises(pmi.PMIError, match="without a line end"):
            feed(endless)
        assert tracemalloc.get_traced_memory()[1] < 2 * pmi.MAX_LINE + MB
    finally:
        tracemalloc.stop()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_lines_from_the_launcher(data):
    """Only PMIError (a wrong answer) or the connection's own errors (a close, a timeout),
    which the exchange turns into one PMIError with a Fix."""
    try:
        got = feed(data + b"\n", timeout=2)
    except (pmi.PMIError, ConnectionError, socket.timeout, TimeoutError):
        return
    assert got.get("cmd") == "get_result"


def test_rank_0s_summary_with_an_absurd_part_count_is_refused():
    class Conn:
        def call(self, line, expect):
            return {"cmd": "get_result", "rc": "0", "value": "99999999;a/0"}

    with pytest.raises(DistEnvError, match="not distenv's"):
        pmi._read_summary(Conn(), "kvs", "s-", 4)


def test_an_empty_host_from_another_rank_is_missing_not_accepted():
    """Rank 0 reads every rank's host: an empty value is that rank's host missing."""
    class Conn:
        calls = []

        def call(self, line, expect):
            self.calls.append(line)
            if line.startswith("cmd=get "):
                return {"cmd": "get_result", "rc": "0", "value": ""}
            if line.startswith("cmd=get_maxes"):
                return {"cmd": "maxes", "vallen_max": "1024"}
            return {"cmd": expect, "rc": "0"}

    with pytest.raises(pmi.PMIError, match="rank 1's host is missing"):
        pmi._publish(Conn(), "kvs", "k-", "s-", "node1", 2)


@pytest.mark.parametrize("text", ["a*99999999999", "a*5000000,b*5000001", "a*-1", "*2", "a*x"])
def test_a_handoff_naming_absurd_counts_is_refused_in_bounded_memory(text):
    tracemalloc.start()
    try:
        assert decode_hosts(text) is None
        assert tracemalloc.get_traced_memory()[1] < 128 * MB
    finally:
        tracemalloc.stop()
