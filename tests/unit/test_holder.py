"""The holder (src/distenv/discovery/holder.py) and the walk up to the launcher's daemon
(src/distenv/discovery/chain.py), with real processes and sockets: what the holder costs, who
may talk to it, the SLURM stepd relay, and the task's claim."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from distenv.discovery import holder as _holder
from distenv.discovery import chain as chains
from distenv.discovery.chain import Chain, start_time, walk

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
ME = (os.getpid(), start_time(os.getpid()))


def run_py(code: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60, **kwargs)


# -- what it costs ---------------------------------------------------------------------------------
def private_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean", "Private_Dirty")))


def test_the_holder_holds_none_of_the_ranks_memory():
    """A rank holding 200 MB starts a holder: the holder's own memory is a bare interpreter's
    (the double-forked watcher it replaces kept a copy-on-write image of the whole rank:
    211 MB measured). Then the rank frees its memory; the holder still holds a few MB."""
    p = run_py("""
        import os, sys
        from distenv.discovery import holder as _holder
        big = bytearray(200 << 20)
        for i in range(0, len(big), 4096):
            big[i] = 1
        h = _holder.start(os.getpid(), _holder.start_time(os.getpid()))
        print(h.pid, flush=True)
        sys.stdin.readline()
    """, input="\n")
    holder = int(p.stdout.split()[0])
    assert p.returncode == 0, p.stderr
    # the rank has exited: the holder notices and ends (it watched the rank)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{holder}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{holder}")


def test_holder_memory_is_independent_of_the_rank():
    code = """
        import os, sys, time
        from distenv.discovery import holder as _holder
        big = bytearray(200 << 20)
        for i in range(0, len(big), 4096):
            big[i] = 1
        h = _holder.start(os.getpid(), _holder.start_time(os.getpid()))
        print(h.pid, flush=True)
        time.sleep(30)
    """
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    rank = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        holder = int(rank.stdout.readline())
        mine = private_kb(holder)
        theirs = private_kb(rank.pid)
        assert theirs > 200_000  # the rank really holds its 200 MB
        assert mine < 16_000, f"the holder holds {mine} kB privately"  # measured: about 6 MB
    finally:
        rank.kill()
        rank.wait()


def test_sigchld_ignored_by_the_program_does_not_break_starting_the_holder():
    """A program (or a launch wrapper) that ignores SIGCHLD: its children are reaped by the
    kernel, so waiting for one raises ChildProcessError (the watcher's os.waitpid did, out of
    exchange(), over its PMIError)."""
    p = run_py("""
        import os, signal
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        from distenv.discovery import holder as _holder
        h = _holder.start(os.getpid(), _holder.start_time(os.getpid()))
        print("started", h.pid > 0)
    """)
    assert p.returncode == 0 and "started True" in p.stdout, p.stderr


# -- the SLURM stepd relay --------------------------------------------------------------------------
def recv_line(sock: socket.socket, timeout: float = 10) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n"):
        part = sock.recv(4096)
        if not part:
            break
        data += part
    return data


def test_the_stepd_relay_answers_a_later_init_and_passes_the_rest():
    """The stepd accepts one init per task: the relay answers MPI_Init's with the stepd's
    answer to distenv's, and passes the other lines on, one at a time; when the task ends
    without a finalize, the holder sends one."""
    stepd, up = socket.socketpair()
    rank, down = socket.socketpair()
    task = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                            stdin=subprocess.PIPE)
    try:
        # this process plays the launcher's daemon: the task is its child
        h = _holder.start(task.pid, start_time(task.pid), daemon=ME)
        h.ask("pmi_relay", fds=[up.fileno(), down.fileno()])  # before the exchange: paused
        h.ask("pmi_go", init="cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1")
        up.close()
        down.close()
        rank.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\n")
        assert recv_line(rank) == b"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n"
        rank.sendall(b"cmd=get_maxes\n")
        assert recv_line(stepd) == b"cmd=get_maxes\n"  # the stepd sees only this, not the init
        stepd.sendall(b"cmd=maxes rc=0 kvsname_max=256 keylen_max=256 vallen_max=1024\n")
        assert recv_line(rank).startswith(b"cmd=maxes")
        task.stdin.close()  # the task ends, without a finalize of its own
        task.wait(10)
        assert recv_line(stepd) == b"cmd=finalize\n"
        stepd.sendall(b"cmd=finalize_ack rc=0\n")
    finally:
        task.kill()
        task.wait()
        h.close()


def test_a_finalize_from_the_rank_is_passed_on_and_not_repeated():
    stepd, up = socket.socketpair()
    rank, down = socket.socketpair()
    task = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                            stdin=subprocess.PIPE)
    try:
        # this process plays the launcher's daemon: the task is its child
        h = _holder.start(task.pid, start_time(task.pid), daemon=ME)
        h.ask("pmi_relay", fds=[up.fileno(), down.fileno()])
        h.tell("pmi_go", init="cmd=response_to_init rc=0")  # as the rank does: no answer
        up.close()
        down.close()
        rank.sendall(b"cmd=finalize\n")
        assert recv_line(stepd) == b"cmd=finalize\n"
        stepd.sendall(b"cmd=finalize_ack rc=0\n")
        assert recv_line(rank) == b"cmd=finalize_ack rc=0\n"
        stepd.close()  # the stepd closes the task's fd after a finalize (measured)
        assert recv_line(rank) == b""
        task.stdin.close()
        task.wait(10)
    finally:
        task.kill()
        task.wait()
        h.close()


# -- hold: a connection kept open until the task ends ------------------------------------------------
@pytest.fixture
def server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s
    s.close()


def test_a_held_connection_closes_when_the_task_ends(server):
    """``hold``: the holder keeps a connection open (drained) after the process that handed it
    over has closed its own, until the task it watches ends."""
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        h = _holder.start(task.pid, start_time(task.pid),
                          daemon=(os.getpid(), start_time(os.getpid())))
        mine = socket.create_connection(server.getsockname(), timeout=5)
        server.settimeout(10)
        up, _ = server.accept()
        h.ask("hold", fds=[mine.fileno()])
        mine.close()  # the holder's copy keeps it open
        up.sendall(b"drained")  # what the peer still sends is read and dropped
        up.settimeout(0.5)
        with pytest.raises(socket.timeout):
            up.recv(10)
        task.kill()
        task.wait(10)
        up.settimeout(10)
        assert up.recv(10) == b""  # the task ended: the holder let it close
        h.close()
    finally:
        task.kill()
        task.wait(10)


# -- the walk up to the daemon ---------------------------------------------------------------------
DAEMONS = {"hydra_pmi_proxy": "Hydra", "slurmstepd": "SLURM"}


@pytest.mark.parametrize("tree, daemon, task, between", [
    ({10: (9, "python3.11"), 9: (5, "hydra_pmi_proxy")}, 9, 10, []),
    ({10: (9, "python3.11"), 9: (8, "bash"), 8: (5, "slurmstepd")}, 8, 9, ["bash"]),
    ({10: (9, "python3.11"), 9: (8, "time"), 8: (7, "dash"), 7: (5, "hydra_pmi_proxy")}, 7, 8,
     ["time", "dash"]),
])
def test_walk_finds_the_daemon_through_programs_that_never_speak_pmi(tree, daemon, task, between):
    names = {pid: n for pid, (_, n) in tree.items()}
    got, why = walk(lambda pid: DAEMONS.get(names.get(pid, "")), "d", start=10,
                    parent=lambda pid: tree[pid][0], name=lambda pid: names.get(pid, ""))
    assert why == "" and got is not None
    assert (got.daemon, got.task, got.between, got.kind) == (daemon, task, between, DAEMONS[names[daemon]])


@pytest.mark.parametrize("tree, says", [
    ({10: (9, "python3.11"), 9: (8, "python3.11"), 8: (5, "hydra_pmi_proxy")},
     "a Python process: this one is its child"),
    ({10: (9, "python3.11"), 9: (8, "mpi_program"), 8: (5, "hydra_pmi_proxy")},
     "a program that may speak PMI itself"),
    ({10: (9, "python3.11"), 9: (1, "bash")}, "no launcher daemon (d) is an ancestor"),
])
def test_walk_refuses_with_the_reason_and_the_exec_fix(tree, says):
    names = {pid: n for pid, (_, n) in tree.items()}
    got, why = walk(lambda pid: DAEMONS.get(names.get(pid, "")), "d", start=10,
                    parent=lambda pid: tree.get(pid, (None,))[0], name=lambda pid: names.get(pid, ""))
    assert got is None and says in why
    # a Python parent gets the fix that works in Python; the rest the job script's
    assert ("os.execv(sys.executable" in why) == ("Python" in says), why
    assert ("exec python train.py" in why) == ("Python" not in says), why


@pytest.mark.parametrize("tree, one, want", [
    # a starter that stays the rank's parent (bwrap --dev-bind / /, Apptainer's starter)
    ({10: (9, "python3.11"), 9: (8, "bwrap"), 8: (5, "hydra_pmi_proxy")}, "",
     (8, 9, ["bwrap"], "")),
    # the container's own pid namespace: the walk ends at its process 1, the starter's init
    ({2: (1, "python3.11")}, "bwrap", (1, 2, [], "bubblewrap")),
    ({3: (2, "python3.11"), 2: (1, "bash")}, "bwrap", (1, 2, ["bash"], "bubblewrap")),
])
def test_walk_passes_container_starters(tree, one, want):
    names = {pid: n for pid, (_, n) in tree.items()}
    names[1] = one
    parents = {pid: p for pid, (p, _) in tree.items()}
    got, why = walk(lambda pid: DAEMONS.get(names.get(pid, "")), "d", start=max(tree),
                    parent=parents.get, name=lambda pid: names.get(pid, ""),
                    is_starter=lambda pid, program: {"bwrap": "bubblewrap"}.get(program))
    assert why == "" and got is not None, why
    assert (got.daemon, got.task, got.between, got.container) == want
    assert got.kind == (None if want[3] else "Hydra")


@pytest.mark.parametrize("task, between, wrapped", [
    ("self", [], False),                 # the launcher started this process
    ("other", ["bash"], True),           # a job script: later programs may follow
    ("other", ["bwrap"], False),         # a starter runs one command, this one, and ends with it
    ("other", ["starter", "bwrap"], False),
    ("other", ["bash", "bwrap"], True),  # a script inside the container
])
def test_a_task_of_container_starters_alone_is_not_a_job_script(task, between, wrapped):
    pid = os.getpid() if task == "self" else os.getppid()
    assert Chain(1, "prted", "prrte", pid, None, between).wrapped is wrapped


def test_podmans_monitor_is_named_and_no_exec_fix_is_given():
    tree = {10: (9, "python3.11"), 9: (1, "conmon")}
    names = {10: "python3.11", 9: "conmon", 1: "systemd"}
    got, why = walk(lambda pid: None, "d", start=10, parent=lambda pid: tree[pid][0],
                    name=names.get)
    assert got is None and "podman's container monitor" in why and "exec" not in why, why


@pytest.mark.parametrize("one, says", [
    ("systemd", "parent is 1, systemd, not a container starter distenv knows"),
    ("", "parent is 1, unknown, not a container starter distenv knows"),
])
def test_a_pid_1_that_is_no_starter_is_refused(one, says):
    tree = {10: (9, "python3.11"), 9: (1, "bash")}
    names = {10: "python3.11", 9: "bash", 1: one}
    got, why = walk(lambda pid: None, "d", start=10, parent=lambda pid: tree[pid][0],
                    name=names.get)
    assert got is None and says in why and "exec python train.py" in why


def test_a_program_called_starter_outside_apptainers_directories_is_no_starter(tmp_path):
    """Apptainer's starter is recognised by its install directory, the name being common."""
    fake = tmp_path / "starter"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    p = subprocess.Popen([str(fake)])
    try:
        time.sleep(0.2)
        assert chains.starter(p.pid, "starter") is None
        assert chains.starter(p.pid, "bwrap") == "bubblewrap"
    finally:
        p.kill()
        p.wait()


# -- the task's claim ----------------------------------------------------------------------------------
def test_a_later_program_of_the_task_gets_the_first_ones_answer():
    """The first program takes the task's claim and its holder answers the later ones -- only
    this user's processes that descend from the task."""
    me = os.getpid()
    chain = Chain(1, "fake", "Hydra", me, start_time(me), ["bash"])
    assert chains.earlier_answer("test-claim", chain, 1) is None
    claim = chains.take_claim("test-claim", chain)
    assert claim is not None
    assert chains.take_claim("test-claim", chain) is None  # taken: one asker per task
    h = _holder.start(me, start_time(me))
    try:
        h.ask("claim", fds=[claim.fileno()], answer='{"said": 1}')
        claim.close()
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from distenv.discovery import chain as c; from distenv.discovery import holder as _holder; "
                f"ch = c.Chain(1, 'fake', 'Hydra', {me}, {chain.task_start}, ['bash']); "
                "print(c.earlier_answer('test-claim', ch, 5))")
        p = subprocess.run([sys.executable, "-c", code, os.path.abspath(SRC)],
                           capture_output=True, text=True, timeout=60)
        assert p.stdout.strip() == '{"said": 1}', p.stderr  # a child of the task: answered
        if os.getuid() == 0:
            pid = os.fork()
            if pid == 0:  # another user: refused (the connection closes unanswered)
                os.setuid(65534)
                os._exit(0 if chains.earlier_answer("test-claim", chain, 5) is None else 1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        h.close()


def test_the_ranks_of_one_daemon_on_a_node_share_one_holder():
    """Starting an interpreter per rank cost a second at 64 ranks on 2 cores: the ranks a
    daemon started on a node register with one holder, the first to come starts it, and it
    ends when the last of their tasks has ended."""
    code = textwrap.dedent(f"""
        import os, sys
        from distenv.discovery import holder as _holder
        from distenv.discovery.chain import start_time
        h = _holder.start(os.getpid(), start_time(os.getpid()), daemon={ME!r})
        print(h.pid, flush=True)
        sys.stdin.readline()
    """)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    ranks = [subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        holders = {int(r.stdout.readline()) for r in ranks}
        assert len(holders) == 1, holders
        (holder,) = holders
        for r in ranks[:3]:
            r.stdin.close()
            r.wait(10)
        time.sleep(0.3)
        assert os.path.exists(f"/proc/{holder}")  # one task left: still held
        ranks[3].stdin.close()
        ranks[3].wait(10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{holder}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{holder}")  # the last task ended: so did it
    finally:
        for r in ranks:
            r.kill()
            r.wait()


def test_a_process_outside_its_daemons_tree_is_refused(tmp_path):
    """The holder serves this user's descendants of its daemon: this test process is the
    daemon's parent, not its descendant, so the holder it starts closes on it unanswered (the
    log says so), and no task of it is ever watched."""
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    log = tmp_path / "holder.log"
    os.environ["DISTENV_HOLDER_LOG"] = str(log)
    try:
        ident = (daemon.pid, start_time(daemon.pid))
        with pytest.raises(_holder.HolderError, match="no holder answered"):
            _holder.start(os.getpid(), start_time(os.getpid()), timeout=2, daemon=ident)
        text = log.read_text()
        assert f"refused process {os.getpid()}" in text and "watching" not in text, text
    finally:
        del os.environ["DISTENV_HOLDER_LOG"]
        daemon.kill()
        daemon.wait()


def test_the_services_look_for_the_clients_own_hand_off_variables():
    """discovery.services checks DISTENV_PMI_HELD / DISTENV_PMIX_HELD before importing a
    client (import costs a rank milliseconds): the names must be the clients' own."""
    from distenv import knobs
    from distenv.discovery import pmi, pmix
    from distenv.discovery import services

    assert pmi.HELD_VAR is knobs.PMI_HELD and pmix.HELD_VAR is knobs.PMIX_HELD
    text = open(services.__file__).read()
    assert "PMI_HELD.is_set(environ)" in text and "PMIX_HELD.is_set(environ)" in text
    # absent: the client is not even imported; present: it is asked (and ignores a value that
    # is not this process's hand-off)
    code = ("import sys\nfrom distenv.discovery import services\n"
            "for name, s, mod in (('DISTENV_PMI_HELD', services.Pmi(), 'distenv.discovery.pmi'),"
            " ('DISTENV_PMIX_HELD', services.Pmix(), 'distenv.discovery.pmix')):\n"
            "    assert s.inherited({}) is None and mod not in sys.modules\n"
            "    assert s.inherited({name: 'x'}) is None and mod in sys.modules\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout == "ok\n", p.stderr
