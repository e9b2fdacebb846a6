"""Who may speak for a task (issue 38): another local user, real (uid 65534 through fork and
setuid, so the test needs root, as CI has), tries each door discovery opens.

- 1, 2: the task's claim. Its name holds this user's secret, which another user cannot read;
  and a name is no proof: a claim held by another user (as if the name had leaked) is refused
  at once -- no byte of it believed, no wait -- and the program asks the service itself.
  A peer of this user that trickles is cut off at the caller's deadline.
- 3: the holder. Another user listening on the holder's exact name gets no connection of
  ours, no descriptor; the task gets a holder of its own.
- 4: `Holder.ask` ends by one deadline and reads at most `MAX_REPLY`.
- 5: the holder's log file: never through a link another user planted, created 0600.
- 6: the pre-flight: a squatter on process 0's port cannot hold a process past its timeout;
  a process that finds nothing listening is told so; "processs" is gone.
- 7: redaction of SSHPASS=..., --password X, -pX.

tests/integration/test_attacker_on_real_jobs.py runs the same attacker against real launchers (Hydra, SLURM's
stepd, Open MPI 5's PMIx relay).
"""
from __future__ import annotations

import array
import json
import os
import socket
import stat
import struct
import sys
import time

import pytest

from distenv.discovery import chain as chains
from distenv.discovery import door
from distenv.discovery import holder as _holder
from distenv.discovery.chain import Chain, start_time

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


class Squatter:
    """Another user (a forked child, uid 65534) listening on an abstract socket `name`;
    `mode`: "forge" (answers a forged rendezvous), "silent" (accepts, never answers),
    "trickle" (one byte every 0.5 s, no line end), "holder" (answers every request as a
    holder would, ``ok pid=1``). `report()`: what it got (connections,
    descriptors received), read from a pipe when it ends."""

    FORGED = json.dumps({"master_addr": "evil.attacker.example", "master_port": 31337})

    def __init__(self, name: str, mode: str, seconds: float = 8.0) -> None:
        self.read, write = os.pipe()
        ready_r, ready_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 0
            try:
                os.close(self.read)
                os.close(ready_r)
                _as_nobody()
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.bind(name)
                s.listen(16)
                os.write(ready_w, b"1")
                got = {"connections": 0, "fds": 0, "bytes": 0}
                end = time.monotonic() + seconds
                s.settimeout(0.05)
                held = []
                while time.monotonic() < end:
                    try:
                        c, _ = s.accept()
                    except socket.timeout:
                        for c in held:
                            if mode == "trickle":
                                try:
                                    c.send(b"x")
                                except OSError:
                                    pass
                        time.sleep(0.45 if mode == "trickle" and held else 0)
                        continue
                    got["connections"] += 1
                    c.settimeout(0.3)
                    try:
                        data, anc, _, _ = c.recvmsg(1 << 16, socket.CMSG_SPACE(16 * 4))
                        got["bytes"] += len(data)
                        for level, kind, payload in anc:
                            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                                got["fds"] += len(payload) // 4
                    except OSError:
                        pass
                    if mode in ("forge", "holder"):
                        try:
                            c.sendall(self.FORGED.encode() + b"\n" if mode == "forge"
                                      else b"ok pid=1\n")
                        except OSError:
                            pass
                    held.append(c)
                os.write(write, json.dumps(got).encode())
            except BaseException:
                code = 3
            os._exit(code)
        os.close(write)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1", "the squatter could not listen"
        os.close(ready_r)

    def report(self) -> dict:
        data = b""
        while True:
            part = os.read(self.read, 4096)
            if not part:
                break
            data += part
        os.close(self.read)
        _, status = os.waitpid(self.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return json.loads(data)


@pytest.fixture
def world():
    """A directory another user can reach (pytest's own are under root's 0700 one)."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="distenv-trust-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _me() -> "tuple[int, int | None]":
    return os.getpid(), start_time(os.getpid())


# -- names nobody else can compute -------------------------------------------------------------
def test_the_names_hold_a_secret_another_user_cannot_read(world, monkeypatch):
    tmp_path = world
    os.chmod(tmp_path, 0o1777)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(door, "_secret", None)
    secret = door.secret()
    assert len(secret) == 32 and secret in door.name("x")
    where = door.private_dir()
    assert where == str(tmp_path / f"distenv-{os.geteuid()}")
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    pid = os.fork()
    if pid == 0:
        _as_nobody()
        try:
            open(os.path.join(where, "secret")).read()
            os._exit(1)
        except PermissionError:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    me = Chain(1, "fake", "Hydra", *_me(), ["bash"])
    assert secret in chains.claim_address("pmi", me)
    assert secret in _holder.address((1, 2), _me())


@pytest.mark.parametrize("plant", ["dir", "link"])
def test_a_private_directory_another_user_made_first_is_skipped(world, monkeypatch, plant):
    tmp_path = world
    """Another user creates ``distenv-<uid>`` (or a link by that name) first: it is skipped
    and the next candidate is used, never trusted."""
    os.chmod(tmp_path, 0o1777)
    theirs = tmp_path / f"distenv-{os.geteuid()}"
    pid = os.fork()
    if pid == 0:
        _as_nobody()
        if plant == "dir":
            os.mkdir(theirs, 0o777)
        else:
            os.mkdir(tmp_path / "elsewhere", 0o777)
            os.symlink(tmp_path / "elsewhere", theirs)
        os._exit(0)
    os.waitpid(pid, 0)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(door, "candidates", lambda environ=None: [
        str(theirs), str(home / ".cache" / "distenv")])
    assert door.private_dir() == str(home / ".cache" / "distenv")


# -- 1, 2: the claim -------------------------------------------------------------------------
def _task_chain() -> Chain:
    return Chain(1, "fake", "Hydra", *_me(), ["bash"])


def test_a_claim_held_by_another_user_is_refused_at_once_and_the_service_answers(monkeypatch):
    """The claim's exact name in another user's hands (as if leaked): earlier_answer refuses
    it before reading a byte, and discovery asks the service itself (its answer, never the
    forged one)."""
    import distenv.discovery as discovery
    from distenv.discovery.apply import Answer

    chain = _task_chain()
    service = f"trust-{os.urandom(4).hex()}"  # a claim name no other test of this process holds
    squatter = Squatter(chains.claim_address(service, chain), "forge", seconds=3)
    try:
        t0 = time.monotonic()
        with pytest.raises(door.DoorError, match=f"another user \\(uid {NOBODY}"):
            chains.earlier_answer(service, chain, 10)
        assert time.monotonic() - t0 < 1.0  # refused at once, not after the timeout

        class Service:
            name = service

            def ask(self, environ, found, timeout, env, need=None):
                return Answer(service, 0, 2, ["node2", "node1"], "the service itself")

        class Found:
            pass

        found = Found()
        found.chain = chain
        ans = discovery._ask(Service(), {}, found, 5, None)
        assert ans.hosts == ["node2", "node1"] and ans.why == "the service itself"
    finally:
        got = squatter.report()
    assert got["bytes"] == 0 and got["fds"] == 0


def test_a_trickling_claim_of_this_user_is_cut_off_at_the_deadline():
    """A peer of this user (a hung program of the task) that sends a byte every 0.5 s held a
    program 14 s under DISTENV_TIMEOUT=3 before: the deadline bounds the whole read."""
    chain = _task_chain()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    service = f"trickle-{os.urandom(4).hex()}"
    s.bind(chains.claim_address(service, chain))
    s.listen(4)
    pid = os.fork()
    if pid == 0:
        c, _ = s.accept()
        for _ in range(40):
            try:
                c.send(b"x")
            except OSError:
                break
            time.sleep(0.5)
        os._exit(0)
    s.close()
    try:
        t0 = time.monotonic()
        with pytest.raises(door.DoorError, match="did not answer in time"):
            chains.earlier_answer(service, chain, 2)
        assert time.monotonic() - t0 < 2.8
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


# -- 3: the holder ---------------------------------------------------------------------------
def _runs_the_holder(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return any(arg.endswith(b"holder.py") for arg in f.read().split(b"\0"))


def test_an_impostor_on_the_holders_name_gets_nothing_and_the_task_its_own_holder():
    """Another user listens on the holder's exact name and answers like a holder: it used to
    receive the task's descriptors (a live PMI connection). Now the peer check refuses it
    before a byte is sent, and the task gets a holder of its own."""
    daemon = (os.getppid(), start_time(os.getppid()))
    impostor = Squatter(_holder.address(daemon, _me()), "holder", seconds=3)
    h = None
    try:
        h = _holder.start(*_me(), timeout=10, daemon=daemon)
        assert h.pid > 1 and _runs_the_holder(h.pid)
        a, b = socket.socketpair()
        h.ask("finalize", fds=[a.fileno()])  # a descriptor goes to the real holder only
        a.close()
    finally:
        got = impostor.report()
        if h is not None:
            h.close()
    assert got["fds"] == 0 and got["bytes"] == 0, got  # connected, checked, left


# -- 4: Holder.ask -------------------------------------------------------------------------------
@pytest.mark.parametrize("behaviour", ["trickle", "flood"])
def test_holder_ask_has_one_deadline_and_a_cap(behaviour):
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        mine.close()
        theirs.recv(4096)
        try:
            if behaviour == "trickle":
                for _ in range(40):
                    theirs.send(b"x")
                    time.sleep(0.3)
            else:
                theirs.sendall(b"x" * (_holder.MAX_REPLY + 10))
                time.sleep(5)
        except OSError:
            pass
        os._exit(0)
    theirs.close()
    try:
        h = _holder.Holder(mine, pid, timeout=1.5)
        t0 = time.monotonic()
        with pytest.raises(_holder.HolderError, match="in time" if behaviour == "trickle" else "more than"):
            h.ask("watch", pid=1, start=1)
        assert time.monotonic() - t0 < 2.3
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        mine.close()


# -- 5: the holder's log ---------------------------------------------------------------------
def test_the_holder_log_follows_no_link_another_user_planted(world, monkeypatch):
    """Another user owns the directory the log is meant for and plants a link there to a file
    only root may read: the holder used to append its lines to that file."""
    tmp_path = world
    victim = tmp_path / "root-only"
    victim.write_text("root's\n")
    os.chmod(victim, 0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    link = theirs / "holder.log"
    pid = os.fork()
    if pid == 0:
        _as_nobody()
        os.symlink(victim, link)
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.lstat(link).st_uid == NOBODY
    fresh = tmp_path / "mine.log"
    for path in (link, fresh):
        monkeypatch.setenv("DISTENV_HOLDER_LOG", str(path))
        child = os.fork()
        if child == 0:  # a task of its own: its holder logs "watching task" at once
            try:
                _holder.start(os.getpid(), start_time(os.getpid()), timeout=10).close()
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    deadline = time.monotonic() + 10
    while "watching task" not in (fresh.read_text() if fresh.exists() else ""):
        assert time.monotonic() < deadline, "the holder wrote no log line"
        time.sleep(0.05)
    assert victim.read_text() == "root's\n"
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o600


# -- 6: the pre-flight -------------------------------------------------------------------------------
def _meeting(port: int, timeout: float, index: int = 1):
    from distenv.bringup.preflight import Meeting

    return Meeting(host="127.0.0.1", port=port, index=index, size=2, job="trust-test",
                   timeout=timeout, who="distenv.test", noun="process")


def test_a_squatter_on_the_preflight_port_cannot_hold_a_process_past_its_timeout():
    """Another user listens on process 0's port and sends a byte every 0.5 s: a process used
    to wait up to 10 s per read, stretched again by every byte; now it ends with its
    timeout."""
    from distenv import DistEnvError
    from distenv.bringup.preflight import meet

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        _as_nobody()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(16)
        os.write(write, b"1")
        s.settimeout(0.1)
        held, end = [], time.monotonic() + 12
        while time.monotonic() < end:
            try:
                held.append(s.accept()[0])
            except socket.timeout:
                pass
            for c in held:
                try:
                    c.send(b"w")
                except OSError:
                    pass
            time.sleep(0.4)
        os._exit(0)
    os.read(read, 1)
    try:
        t0 = time.monotonic()
        with pytest.raises(DistEnvError, match="could not reach"):
            meet(_meeting(port, 3.0))
        assert time.monotonic() - t0 < 3.0 + 1.0
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_process_that_finds_nothing_listening_is_told_so():
    from distenv import DistEnvError
    from distenv.bringup.preflight import meet

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(DistEnvError) as err:
        meet(_meeting(port, 1.0))
    text = str(err.value)
    assert "nothing listens at its port" in text and "already ended it" in text, text


def test_the_two_processes_message_spells_processes():
    from distenv.bringup.preflight import twice

    text = twice(_meeting(1, 1.0), 1, "a 1", "b 2")
    assert "processes numbered" in text and "processs" not in text


# -- 7: redaction --------------------------------------------------------------------------------
@pytest.mark.parametrize("text, secret", [
    ("SSHPASS=hunter2 sshpass -e ssh node2", "hunter2"),
    ("mpirun --mca plm_rsh_agent 'sshpass -phunter3 ssh' -np 4", "hunter3"),
    ("sshpass -p hunter4 ssh node2", "hunter4"),
    ("launcher --password hunter5 --np 4", "hunter5"),
    ("mysql -u root -phunter6 jobs", "hunter6"),
])
def test_command_line_passwords_are_redacted(text, secret):
    from distenv.core.redact import MASK, redact_text, redact_value

    shown = redact_text(text)
    assert secret not in shown and MASK in shown, shown
    assert redact_value("SSHPASS", "hunter2") == MASK


def test_launcher_flags_that_start_with_p_are_kept():
    from distenv.core.redact import redact_text

    for text in ("mpiexec -pmi-port -ppn 2 python x.py", "srun -p debug -N2 python x.py"):
        assert redact_text(text) == text
