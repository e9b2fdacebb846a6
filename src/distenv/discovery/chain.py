"""Whose connection is it: the processes between the launcher's daemon and this one.

A launcher's service (Hydra's PMI-1, SLURM's stepd, a PMIx server) belongs to the process the
launcher started -- its *task*. Everything that task starts inherits the service's variables
(and with PMI_FD, the connection itself): a DataLoader worker, a subprocess, a second program
of a job script. Two processes speaking on one connection corrupt the protocol for both, and
a second ``init`` to SLURM's stepd kills the step; so exactly one process of a task may ask.

That process is found by walking up from this one: its parent, then the parent's parent, while
each is a program that never speaks PMI (`PASS_THROUGH`: shells, ``time``, ``timeout``,
``numactl``, ...: the usual job script, ``module load ...; conda activate ...; python
train.py`` without ``exec``), until the launcher's daemon (the service says which names are
its daemons). The last process before the daemon is the task. Any other program on the way --
a Python (the rank this process is a child of), an MPI program -- may itself speak PMI, so the
walk stops there and the service is refused, with the reason.

When the task is not this process (a wrapper script), later programs of the same script
may ask too: the first to ask takes the task's *claim* (an abstract Unix socket named after the
task's pid and start time), and its holder (`distenv.discovery.holder`) answers the later ones with the
same answer instead of letting them ask the service again.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

#: The holder program (``python -I -S HOLDER``, `distenv.discovery.holder`), which its clients
#: check. Named here: the holder imports this module (its process-tree helpers), not the reverse.
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "holder.py")


def start_time(pid: int) -> "int | None":
    """Field 22 of /proc/<pid>/stat (clock ticks since boot): with the pid, a process's
    identity (a pid alone may be reused)."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def parent_of(pid: int) -> "int | None":
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _stat(pid: int) -> "list[str]":
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return []
    return text.rpartition(")")[2].split()


def descends(pid: int, ancestor: int, depth: int = 64) -> bool:
    """Is `pid` `ancestor` or one of its descendants?"""
    for _ in range(depth):
        if pid == ancestor:
            return True
        parent = parent_of(pid)
        if parent is None or parent < 1:  # (a container's own process 1 may be the ancestor)
            return False
        pid = parent
    return False


#: Programs that may stand between the launcher's daemon and the rank: none of them speaks
#: PMI, PMIx or Cray PMI (each is a shell or a small C utility that runs one command and waits
#: for it; `env`, `nice`, `taskset`, `numactl`, `chrt`, `stdbuf`, `nohup`, `setsid`, `ionice`
#: exec it instead, so they are never seen, but are listed for the versions that fork).
PASS_THROUGH = frozenset({
    "sh", "bash", "dash", "zsh", "ksh", "ksh93", "mksh", "csh", "tcsh", "fish",
    "time", "timeout", "env", "nice", "ionice", "chrt", "taskset", "numactl", "stdbuf",
    "nohup", "setsid", "flock",
})
#: Container starters that stay the rank's parent (or, in a pid namespace of their own, its
#: init, process 1), by executable name: none links a PMI or PMIx library or speaks their
#: protocols; each forks the container's process and waits for it. bubblewrap (``bwrap``:
#: measured, with and without --unshare-pid); Apptainer and SingularityCE (``starter``,
#: ``starter-suid``: the "runtime parent" that forks the container process, read in
#: apptainer/apptainer cmd/starter; accepted only from their libexec directories, the name
#: alone being common). Charliecloud's ch-run and NVIDIA's enroot exec the command: never
#: seen. Podman's conmon is not the daemon's descendant at all: nothing to walk.
STARTERS = {"bwrap": "bubblewrap", "starter": "Apptainer", "starter-suid": "Apptainer"}
#: Where Apptainer's and SingularityCE's starters are installed (<prefix>/libexec/<name>/bin).
STARTER_DIRS = ("/libexec/apptainer/bin/", "/libexec/singularity/bin/")
#: How far up to walk before giving up (a job script rarely nests more than 3 deep).
MAX_DEPTH = 12


def starter(pid: int, program: str) -> "str | None":
    """The container starter process `pid` (named `program`) is, or None."""
    title = STARTERS.get(program)
    if title is None or program == "bwrap":
        return title
    try:  # Apptainer's: its executable's directory (when readable: setuid starters hide it)
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return title
    return title if any(d in exe for d in STARTER_DIRS) else None


def own_proc_pid() -> "int | None":
    """This process's pid as /proc shows it (``/proc/self``), None when unreadable. It differs
    from `os.getpid()` in a pid namespace whose /proc is another namespace's (``bwrap
    --unshare-pid`` without ``--proc``): pids read there are not this process's pids."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return None


def name_of(pid: int) -> str:
    """A process's program: its executable's base name (``/proc/<pid>/exe``: bash, python3.11,
    orted), else its process name (another user's, such as root's slurmstepd)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).split(" ", 1)[0]
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class Chain:
    """What the walk found: the launcher's `daemon` (pid, name, the service's `kind` of it) and
    the `task` (pid, start time) it started; `between` the pass-through programs, innermost
    first (empty when the daemon started this very process). In a container with a pid
    namespace of its own, `container` names its starter: `daemon` is then the namespace's
    process 1 (the starter's init; the launcher's daemon is outside, unseen), `kind` None (the
    service tells its kind from its own variables), and `task` the container's main process."""

    __slots__ = ("daemon", "name", "kind", "task", "task_start", "between", "container")

    def __init__(self, daemon: int, name: str, kind: "str | None", task: int,
                 task_start: "int | None", between: "list[str]", container: str = "") -> None:
        self.daemon, self.name, self.kind = daemon, name, kind
        self.task, self.task_start, self.between = task, task_start, between
        self.container = container

    @property
    def daemon_id(self) -> "tuple[int, int | None]":
        """The daemon's identity (pid, start time): the ranks it started on this node share
        one holder (`distenv.discovery.holder`)."""
        return self.daemon, start_time(self.daemon)

    @property
    def wrapped(self) -> bool:
        """True when the launcher started another program that runs this one (a job script),
        other than container starters alone: each runs one command and ends when it ends
        (`STARTERS`), so this process is then the task's only program and ends with it."""
        return self.task != os.getpid() and not all(p in STARTERS for p in self.between)

    def __repr__(self) -> str:
        return f"Chain(daemon={self.name}:{self.daemon}, task={self.task}, between={self.between})"


#: The one-line fix for a process whose chain of parents holds a program that may speak PMI.
EXEC_FIX = ("Fix: in a job script, run the program with `exec` (exec python train.py), or "
            "call distenv in the process the launcher started, not in one of its children")
#: The fix where a Python process started this one (a launcher script running the training as
#: its subprocess, or a rank's own child such as a DataLoader worker).
PYTHON_FIX = ("Fix: call distenv in the rank itself; a Python script that starts the training "
              "should replace itself with it (os.execv(sys.executable, [sys.executable, "
              "'train.py', ...])) rather than run it as a subprocess")


def walk(is_daemon: "Callable[[int], str | None]", daemons: str,
         start: "int | None" = None, parent: "Callable[[int], int | None]" = parent_of,
         name: "Callable[[int], str]" = name_of,
         is_starter: "Callable[[int, str], str | None]" = starter) -> "tuple[Chain | None, str]":
    """(the chain, "") up from process `start` (default: this one) to the launcher's daemon
    -- `is_daemon(pid)` names its kind, or None --, or (None, why not, with its fix).
    `daemons` names them for messages ("hydra_pmi_proxy, slurmstepd"). Container starters
    (`STARTERS`) pass as the shells do; where one is process 1 of this pid namespace, the
    walk ends there (`Chain.container`): what started the container is outside, unseen."""
    if start is None:
        pid = os.getpid()
        seen = own_proc_pid()
        if seen is not None and seen != pid:
            return None, (f"this process is {pid} in its own pid namespace but {seen} in the /proc "
                          "it sees (a container with a pid namespace of its own and another "
                          "namespace's /proc, such as bwrap --unshare-pid without --proc): its "
                          "parents cannot be read. Fix: give the container its own /proc "
                          "(bwrap --proc /proc), or no pid namespace of its own")
    else:
        pid = start
    between: "list[str]" = []
    for _ in range(MAX_DEPTH):
        up = parent(pid)
        if up is None or up < 1:
            return None, (f"no launcher daemon ({daemons}) is an ancestor of this process "
                          f"(process {pid}'s parent is {'unknown' if up is None else up}): the "
                          "service's variables were inherited. " + EXEC_FIX)
        kind = is_daemon(up)
        if kind is not None:
            return Chain(up, name(up), kind, pid, start_time(pid), between), ""
        program = name(up)
        title = is_starter(up, program)
        if up == 1:
            if title is None:
                return None, (f"no launcher daemon ({daemons}) is an ancestor of this process "
                              f"(process {pid}'s parent is 1, {program or 'unknown'}, not a "
                              "container starter distenv knows): the service's variables were "
                              "inherited. " + EXEC_FIX)
            # process 1 of a pid namespace of the container's own: everything that can speak
            # here descends from it, and it never speaks PMI; the daemon is outside
            return Chain(1, program, None, pid, start_time(pid), between, title), ""
        if program not in PASS_THROUGH and title is None:
            if program == "conmon":  # podman's container monitor: podman's own child
                return None, (f"the parent process ({up}) is podman's container monitor "
                              "(conmon), which podman starts, not the launcher's daemon "
                              f"({daemons}): whose service this is cannot be proven from "
                              "here. Fix: let MPI gather the hosts in the container "
                              "(distenv.discover(method='mpi4py'), with mpi4py installed), or "
                              "set MASTER_ADDR (and NODE_RANK) for every rank")
            if program.startswith(("python", "pypy")):
                return None, (f"the parent process ({up}, {program}) is not the launcher's "
                              f"daemon ({daemons}) but a Python process: this one is its child "
                              "(a DataLoader worker, a subprocess of the rank, or the training "
                              "run as a subprocess of a Python launcher script), and the "
                              "service's connection belongs to that process. " + PYTHON_FIX)
            return None, (f"the parent process ({up}, {program or 'unknown'}) is not the "
                          f"launcher's daemon ({daemons}) but a program that may speak PMI "
                          "itself: the service's variables were inherited, and its connection "
                          "belongs to another process. " + EXEC_FIX)
        between.append(program)
        pid = up
    return None, (f"no launcher daemon ({daemons}) within {MAX_DEPTH} parent processes. "
                  + EXEC_FIX)


# -- the claim -----------------------------------------------------------------------------
#: Longest answer a claim gives (the compact host list of a very large job, as JSON).
MAX_ANSWER = 64 << 20


def claim_address(service: str, chain: Chain) -> str:
    """The abstract Unix socket name of the task's claim on `service` (the leading NUL makes
    it abstract: no file, gone with the socket). It holds this user's secret
    (`door.name`): another user can neither compute nor take it."""
    from .door import name, pid_namespace

    return name("claim", pid_namespace(), service, chain.task, chain.task_start)


def _check_claim_peer(sock: "socket.socket", chain: Chain) -> None:
    """The claim is this user's holder (which listens on it once the first program handed it
    over) or, while it hands it over, that program: a process of this task. Else
    `DoorError`."""
    from .door import DoorError, check_peer, runs

    pid = check_peer(sock, "the task's claim")
    if pid > 0 and not (runs(pid, HOLDER) or descends(pid, chain.task)):
        raise DoorError(f"the task's claim is held by process {pid}, neither the holder nor a "
                        f"process of task {chain.task}")


def earlier_answer(service: str, chain: Chain, timeout: float = 5.0) -> "str | None":
    """The answer an earlier program of this task got from `service` (its holder keeps it),
    or None when no program of this task has asked. Read within `timeout` seconds in all and
    at most `MAX_ANSWER` bytes; `DoorError` when what holds the claim is not this user's
    holder or program of this task, or answers too slowly or too much: nothing it says is
    believed."""
    import socket
    import time

    from .door import recv_line

    deadline = time.monotonic() + timeout
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        try:
            s.connect(claim_address(service, chain))
        except OSError:
            return None  # nobody holds the claim: no program of this task asked
        _check_claim_peer(s, chain)
        line = recv_line(s, deadline, MAX_ANSWER, f"the task's claim on {service}")
    finally:
        s.close()
    return line.decode("utf-8", "replace").strip() or None


def take_claim(service: str, chain: Chain) -> "socket.socket | None":
    """This task's claim on `service` (a listening socket: hand it to the holder with the
    answer), or None when another program of the task holds it."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(claim_address(service, chain))
        s.listen(16)
    except OSError:
        s.close()
        return None
    return s


__all__ = ["walk", "Chain", "PASS_THROUGH", "STARTERS", "EXEC_FIX", "PYTHON_FIX", "own_proc_pid", "claim_address", "earlier_answer",
           "take_claim", "name_of"]
