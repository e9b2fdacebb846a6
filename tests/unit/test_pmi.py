"""distenv.pmi against a fake Hydra proxy (the real ones: tests/integration/test_pmi_discovery.py).

The fake speaks the dialects measured from MPICH 4 (``msg=`` fields, rc last) and MPICH 5
(rc first, ``tag=`` on barrier_out), on a socket pair (PMI_FD) or TCP (-pmi-port).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from distenv import DistEnvError, pmi, resolve
from distenv.discovery import PMI_WHY, _from_exchange, complete

MPICH4 = {"init": "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
          "put": "cmd=put_result rc=0 msg=success", "barrier": "cmd=barrier_out",
          "get": "cmd=get_result rc=0 msg=success value={v}",
          "miss": "cmd=get_result rc=-1 msg=key_{k}_not_found value=unknown"}
MPICH5 = {"init": "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2",
          "put": "cmd=put_result rc=0", "barrier": "cmd=barrier_out tag=0",
          "get": "cmd=get_result rc=0 value={v}", "miss": "cmd=get_result rc=-1"}


class FakeProxy(threading.Thread):
    """Answers one PMI-1 client. `others`: keys the other ranks put (visible after the
    barrier); `barrier`: False = the barrier never completes (a rank never came)."""

    def __init__(self, sock, dialect, others, barrier=True, size=2, rank=1):
        super().__init__(daemon=True)
        self.sock, self.d, self.kvs, self.barrier = sock, dialect, {}, barrier
        self.others, self.size, self.rank = others, size, rank
        self.seen = []

    def run(self):
        f = self.sock.makefile("rwb", buffering=0)
        for raw in f:
            line = raw.decode().strip()
            self.seen.append(line)
            fields = dict(p.partition("=")[::2] for p in line.split())
            cmd = fields.get("cmd")
            out = None
            if cmd == "initack":
                out = (f"cmd=initack\ncmd=set size={self.size}\ncmd=set rank={self.rank}\n"
                       "cmd=set debug=0")
            elif cmd == "init":
                out = self.d["init"]
            elif cmd == "get_my_kvsname":
                out = "cmd=my_kvsname kvsname=kvs_42_0_7_node1"
            elif cmd == "put":
                self.kvs[fields["key"]] = fields["value"]
                out = self.d["put"]
            elif cmd == "barrier_in":
                if self.barrier:
                    self.kvs.update(self.others)
                    out = self.d["barrier"]
            elif cmd == "get":
                k = fields["key"]
                out = self.d["get"].format(v=self.kvs[k]) if k in self.kvs else \
                    self.d["miss"].format(k=k)
            elif cmd == "finalize":
                out = "cmd=finalize_ack"
            if out is not None:
                f.write(out.encode() + b"\n")


@pytest.fixture
def no_watcher(monkeypatch):
    """Keep the watcher (a double fork) out of the pytest process: record what it would hold."""
    held = []
    monkeypatch.setattr(pmi, "_hold", lambda sock: (held.append(sock.fileno()), sock.close()))
    monkeypatch.setattr(pmi, "_done", None)
    return held


def key(rank, gen):
    return f"{pmi.KEY}-{gen}-{rank}"


@pytest.mark.parametrize("dialect", [MPICH4, MPICH5], ids=["mpich4", "mpich5"])
def test_fd_exchange_reads_every_rank(no_watcher, dialect):
    ours, theirs = socket.socketpair()
    gen = pmi._generation + 1
    proxy = FakeProxy(theirs, dialect, {key(0, gen): "node2"})
    proxy.start()
    found = pmi.Offer("fd", "test", fd=ours.fileno(), rank=1, size=2)
    ex = pmi.exchange({}, timeout=5, found=found)
    assert (ex.rank, ex.size, ex.hosts, ex.kvsname) == (1, 2, ["node2", socket.gethostname()],
                                                        "kvs_42_0_7_node1")
    assert proxy.seen[:3] == ["cmd=init pmi_version=1 pmi_subversion=1", "cmd=get_my_kvsname",
                              f"cmd=put kvsname=kvs_42_0_7_node1 key={key(1, gen)} "
                              f"value={socket.gethostname()}"]
    assert "cmd=finalize" not in proxy.seen  # a finalize now would break a later MPI_Init
    assert os.get_blocking(ours.fileno()), "PMI_FD must stay blocking for MPI_Init"
    assert len(no_watcher) == 1  # the watcher took the connection
    assert pmi.exchange({}, timeout=5, found=found) is ex  # once per process
    ours.close()


def test_port_exchange_handshake_gives_the_size(no_watcher):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    gen = pmi._generation + 1

    def serve():
        conn, _ = server.accept()
        FakeProxy(conn, MPICH5, {key(0, gen): "node2", key(2, gen): "node1"}, size=3,
                  rank=1).run()

    threading.Thread(target=serve, daemon=True).start()
    found = pmi.Offer("port", "test", addr=("127.0.0.1", port), pmiid=1, rank=1, size=None)
    ex = pmi.exchange({}, timeout=5, found=found)
    assert (ex.rank, ex.size, ex.hosts) == (1, 3, ["node2", socket.gethostname(), "node1"])
    server.close()


def test_a_barrier_that_never_ends_names_the_missing_rank_in_time(no_watcher):
    ours, theirs = socket.socketpair()
    gen = pmi._generation + 1
    # rank 0 and 2 published (their node is complete), rank 3 did not
    proxy = FakeProxy(theirs, MPICH4, {}, barrier=False)
    proxy.kvs.update({key(0, gen): "a", key(2, gen): "b"})
    proxy.start()
    found = pmi.Offer("fd", "test", fd=ours.fileno(), rank=1, size=4)
    t0 = time.monotonic()
    with pytest.raises(pmi.PMIError, match=r"timed out after 2 s on rank 1: rank 3 never "
                                           r"reached it.*DISTENV_TIMEOUT"):
        pmi.exchange({}, timeout=2, found=found)
    assert time.monotonic() - t0 <= 2.2
    assert os.get_blocking(ours.fileno())
    ours.close()


def test_timeout_comes_from_distenv_timeout(no_watcher):
    ours, theirs = socket.socketpair()
    FakeProxy(theirs, MPICH4, {}, barrier=False).start()
    found = pmi.Offer("fd", "test", fd=ours.fileno(), rank=0, size=2)
    t0 = time.monotonic()
    with pytest.raises(pmi.PMIError, match="after 1.5 s"):
        pmi.exchange({"DISTENV_TIMEOUT": "1.5"}, found=found)
    assert 1.0 < time.monotonic() - t0 <= 1.7
    with pytest.raises(DistEnvError, match="DISTENV_TIMEOUT"):
        pmi.exchange({"DISTENV_TIMEOUT": "soon"}, found=found)
    ours.close()


# -- guards ---------------------------------------------------------------------------------------
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
         "PMI_FD": "6"}


@pytest.mark.parametrize("environ,why", [
    ({}, "not started by Hydra"),
    ({k: v for k, v in HYDRA.items() if k != "MPI_LOCALRANKID"}, "not started by Hydra"),
    ({**HYDRA, "DISTENV_PMI": "0"}, "DISTENV_PMI=0"),
    ({**HYDRA, pmi.HELD_VAR: "1;fd;kvs;a*2"}, "belongs to process 1, an ancestor"),
    ({**HYDRA, pmi.HELD_VAR: f"{os.getpid()};fd;kvs;a*2"}, "before it exec'ed"),
    # pytest's parent is a shell or a CI runner, never Hydra's proxy: an inherited PMI_FD
    (HYDRA, "is not Hydra's proxy"),
    ({"MPI_LOCALRANKID": "0", "PMI_PORT": "node1:4444", "PMI_ID": "0"}, "is not Hydra's proxy"),
])
def test_offer_refuses(environ, why):
    found, reason = pmi.offer(environ)
    assert found is None and why in reason, reason


def test_a_process_not_started_by_the_proxy_keeps_its_fd_untouched():
    """A child given a socket as PMI_FD, whose parent is not Hydra's proxy: refused, and the
    fd never read or written (the test's end of the pair stays empty)."""
    ours, theirs = socket.socketpair()
    code = ("import os, distenv.discovery as d, distenv.pmi as p; o, why = p.offer(); "
            "e = d.complete(need=('master_addr',)); print(o, e.master_addr, why)")
    # a fresh environment: other tests may have exported RANK, MASTER_ADDR, ... into this one
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **HYDRA, "PMI_FD": str(theirs.fileno()),
           "PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "1", "MPI_LOCALRANKID": "0"}
    p = subprocess.run([sys.executable, "-c", code], env=env, pass_fds=(theirs.fileno(),),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("None None ") and "not Hydra's proxy" in p.stdout, p.stdout
    ours.setblocking(False)
    with pytest.raises(BlockingIOError):
        ours.recv(1)


def test_watcher_finalizes_after_the_process_ends_however_it_ends():
    """The real watcher: a child runs the exchange against the fake proxy, then os._exit(0)
    (no atexit): the proxy gets cmd=finalize only after the child is gone."""
    ours, theirs = socket.socketpair()
    gen = 1  # the child's first exchange
    proxy = FakeProxy(ours, MPICH5, {key(0, gen): "node2"})
    proxy.start()
    code = ("import os, sys, time, distenv.pmi as p; "
            "o = p.Offer('fd', 't', fd=int(sys.argv[1]), rank=1, size=2); "
            "ex = p.exchange({}, timeout=5, found=o); print(ex.hosts, flush=True); "
            "time.sleep(0.5); os._exit(0)")
    child = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())],
                             pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE, text=True)
    theirs.close()
    out = child.stdout.readline()
    assert "node2" in out
    time.sleep(0.2)
    assert "cmd=finalize" not in proxy.seen  # the rank still runs: no finalize yet
    child.wait(timeout=30)
    deadline = time.monotonic() + 10
    while "cmd=finalize" not in proxy.seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.seen[-1] == "cmd=finalize", proxy.seen


# -- completing a DistEnv -------------------------------------------------------------------------
def test_complete_leaves_a_known_launch_alone():
    env = resolve({**HYDRA, "MASTER_ADDR": "node9"})
    assert complete(env, need=("master_addr",)) is env


def test_complete_without_a_service_changes_nothing(monkeypatch):
    monkeypatch.delenv("MPI_LOCALRANKID", raising=False)  # this process: not a Hydra rank
    env = resolve({**HYDRA, "PMI_SIZE": "4"})  # two nodes: the master is unknown
    assert env.master_addr is None and complete(env) is env


def test_from_exchange_fills_placement_and_port():
    env = resolve({"PMI_ID": "2", "PMI_PORT": "node1:3333", "MPI_LOCALRANKID": "0",
                   "MPI_LOCALNRANKS": "2"})
    assert env.world_size is None and env.master_port == 29500
    ex = pmi.Exchange(2, 4, ["node2", "node2", "node1", "node1"], "port", 0.01, "t",
                      "kvs_1_0_2_node1")
    got = _from_exchange(env, ex)
    assert (got.world_size, got.master_addr, got.node_rank, got.num_nodes, got.hosts) == \
        (4, "node2", 1, 2, ("node2", "node1"))
    assert got.provenance["master_addr"] == f"{PMI_WHY} (Hydra, -pmi-port)"
    assert got.master_port != 29500 and "kvs_1_0_2_node1" in got.provenance["master_port"]
    assert not any("no world size" in n or "no job id" in n for n in got.notes), got.notes


def test_from_exchange_refuses_another_jobs_rank():
    env = resolve(HYDRA)
    with pytest.raises(DistEnvError, match="rank 0"):
        _from_exchange(env, pmi.Exchange(0, 2, ["a", "b"], "fd", 0, "t", "k"))


def test_handoff_round_trip(monkeypatch):
    ex = pmi.Exchange(1, 4, ["n2", "n2", "n1", "n1"], "fd", 0.1, "t", "kvs_9")
    monkeypatch.setattr(pmi, "_done", (os.getpid(), ex))
    held = pmi.handoff()
    assert held == f"{os.getpid()};fd;kvs_9;n2*2,n1*2"
    back = pmi.inherited({pmi.HELD_VAR: held, "PMI_RANK": "1"})
    assert (back.rank, back.size, back.hosts, back.kvsname) == (1, 4, ex.hosts, "kvs_9")
    assert pmi.inherited({pmi.HELD_VAR: "1;fd;k;a*2", "PMI_RANK": "1"}) is None  # another pid
    assert pmi.inherited({pmi.HELD_VAR: f"{os.getpid()};fd;k;a*x", "PMI_RANK": "0"}) is None


def test_complete_uses_mpi_when_it_is_already_initialized(monkeypatch):
    """MPI initialized in this process (mpi4py): an allgather, no key-value exchange; under
    -pmi-port MPI also gives the size."""
    import types

    class Comm:
        def Get_rank(self):
            return 2

        def Get_size(self):
            return 4

        def allgather(self, value):
            return ["node2", "node2", value, "node1"]

    mpi = types.ModuleType("mpi4py.MPI")
    mpi.COMM_WORLD = Comm()
    mpi.Is_initialized = lambda: True
    mpi.Is_finalized = lambda: False
    pkg = types.ModuleType("mpi4py")
    pkg.MPI = mpi
    monkeypatch.setitem(sys.modules, "mpi4py", pkg)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    monkeypatch.setattr(pmi, "offer", lambda *a: pytest.fail("the service must not be asked"))
    monkeypatch.setattr(socket, "gethostname", lambda: "node1")
    env = resolve({"PMI_ID": "2", "PMI_PORT": "node1:3333", "MPI_LOCALRANKID": "0",
                   "MPI_LOCALNRANKS": "2"})
    got = complete(env, need=("master_addr", "world_size"))
    assert (got.world_size, got.master_addr, got.node_rank, got.num_nodes) == (4, "node2", 1, 2)
    assert got.provenance["master_addr"] == "mpi4py allgather of host names"
