"""`distenv run [--nproc-per-node N|auto|gpu|cpu] [--local-rank-arg {none,underscore,hyphen}] [--] CMD ...`

Make an unmodified command run right under any launcher:

* **per-process launch** (the launcher started every worker: ``mpirun -np 4``, ``srun -n 4``,
  torchrun, ...): export the resolved torch variables (``MASTER_ADDR``, ``MASTER_PORT``,
  ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...) and *exec* the command: it replaces this
  process, so signals and the exit status pass straight through.
* **per-node launch** (one process per node that must start the workers: ``mpirun --map-by
  ppr:1:node`` or ``srun --ntasks-per-node=1`` with ``--nproc-per-node N``, GCP/Vertex,
  Kubeflow, SageMaker, ...): exec torch's elastic launcher, ``python -m torch.distributed.run
  --nnodes N --node-rank R --nproc-per-node P --master-addr A --master-port P --no-python CMD``
  (static rendezvous), which starts and watches the local workers.
* ``--nproc-per-node N`` with no launcher at all: a one-node per-node launch of N workers.

The children get ``DISTENV_AUTO=1`` (framework adapters applied on import, see
`distenv.auto`) and ``DISTENV_RUN=1``. `plan()` is the pure part (what would be exec'ed).
"""

from __future__ import annotations

import math
import os
import re
import sys

from .core.description import DEFAULT, PER_NODE, kind_of
from . import knobs
from .errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from .core.description import DistEnv

USAGE = """\
usage: distenv run [--nproc-per-node N|auto|gpu|cpu] [--local-rank-arg {none,underscore,hyphen}] [--] CMD ...

Export the resolved launch and run CMD: exec'ed directly when the launcher started every
worker; started through torch.distributed.run (N workers here) in a per-node launch.

options:
  --nproc-per-node N|auto|gpu|cpu
                 workers per node. With a launcher that started one process per node
                 (mpirun --map-by ppr:1:node, srun --ntasks-per-node=1), or with no launcher,
                 this makes a per-node launch; otherwise it must match the launcher's count.
                 auto: one per visible GPU, else one per CPU core (as torchrun).
  --local-rank-arg {none,underscore,hyphen}
                 also pass --local_rank=<local rank> (underscore) or --local-rank=<local rank>
                 (hyphen) to the script, for legacy scripts that parse it (default: none).
  -h, --help     show this help

CMD gets DISTENV_AUTO=1 (distenv.auto patches the frameworks it imports) and the torch
variables MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
GROUP_RANK.
"""

LOCAL_RANK_FLAGS = {"none": None, "underscore": "--local_rank", "hyphen": "--local-rank"}
#: torch.distributed.run reads PET_<OPTION> for options not given; these would override ours.
PET_OVERRIDES = ("PET_STANDALONE", "PET_MODULE", "PET_RUN_PATH", "PET_RDZV_ENDPOINT",
                 "PET_RDZV_CONF", "PET_RDZV_BACKEND", "PET_RDZV_ID", "PET_NO_PYTHON",
                 "PET_MAX_RESTARTS", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE",
                 "PET_MASTER_ADDR", "PET_MASTER_PORT")
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
_SHELL = re.compile(r"^(ba|da|z|k|mk)?sh$")


class Usage(Exception):
    """Bad command line (exit 2 with the usage)."""


class Plan:
    """What `distenv run` will exec: ``argv``, its environment ``environ``, the resolved
    launch ``env``, and ``warnings`` to print first."""

    __slots__ = ("argv", "environ", "env", "warnings", "mode")

    def __init__(self, argv: "Iterable[str]", environ: "dict[str, str]", env: DistEnv, mode: str,
                 warnings: "Iterable[str]" = ()) -> None:
        self.argv, self.environ, self.env, self.mode = list(argv), environ, env, mode
        self.warnings = list(warnings)

    def __repr__(self) -> str:
        return f"Plan(mode={self.mode!r}, argv={self.argv!r})"


def parse(argv: "Iterable[str]") -> "tuple[dict[str, Any], list[str]]":
    """(options, command). Options end at the first word that is not one, or at ``--``."""
    opts: "dict[str, Any]" = {"nproc_per_node": None, "local_rank_arg": "none", "help": False}
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if a in ("-h", "--help"):
            opts["help"] = True
            i += 1
            continue
        name, eq, value = a.partition("=")
        key = {"--nproc-per-node": "nproc_per_node", "--nproc_per_node": "nproc_per_node",
               "--local-rank-arg": "local_rank_arg", "--local_rank_arg": "local_rank_arg"}.get(name)
        if key is None:
            if a.startswith("-") and len(a) > 1:
                raise Usage(f"unknown option {a!r} (put the command after --)")
            break
        if not eq:
            if i + 1 >= len(args):
                raise Usage(f"{name} needs a value")
            value = args[i + 1]
            i += 1
        opts[key] = value
        i += 1
    cmd = args[i:]
    nproc = opts["nproc_per_node"]
    if nproc is not None:
        text = nproc.strip().lower()
        if text not in ("auto", "gpu", "cpu") and not (text.isascii() and text.isdigit() and int(text) >= 1):
            raise Usage(f"--nproc-per-node {nproc!r}: expected a positive number, auto, gpu or cpu")
        opts["nproc_per_node"] = text
    if opts["local_rank_arg"] not in LOCAL_RANK_FLAGS:
        raise Usage(f"--local-rank-arg {opts['local_rank_arg']!r}: expected none, underscore or hyphen")
    return opts, cmd


def script_index(cmd: "Sequence[str]") -> int:
    """Where a legacy ``--local-rank=N`` goes: right after the script (as torch.distributed.launch
    does: ``python -u script.py --local-rank=N args``), after ``-m module`` / ``-c code``
    for an interpreter, else right after the program."""
    if not cmd:
        return 0
    if _SHELL.match(os.path.basename(cmd[0])):
        return _shell_script_index(cmd)
    if not _PYTHON.match(os.path.basename(cmd[0])):
        return 1
    i = 1
    while i < len(cmd):
        a = cmd[i]
        if a in ("-m", "-c"):
            return min(i + 2, len(cmd))
        if a in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if a.startswith("-m") or a.startswith("-c"):
            return i + 1
        if a.startswith("-") and a != "-":
            i += 1
            continue
        return i + 1
    return len(cmd)


def _shell_script_index(cmd: "Sequence[str]") -> int:
    """`bash [-x] [-o opt] s.sh args`: right after the script (before it, bash reads the flag
    as its own invalid option); `sh -c code name args`: after the name ($0), so the script
    sees it in "$@"."""
    i = 1
    while i < len(cmd):
        a = cmd[i]
        if a == "-c":
            return min(i + 3, len(cmd))
        if a in ("-o", "+o", "-O", "+O"):
            i += 2
            continue
        if a.startswith(("-", "+")) and a not in ("-", "--"):
            i += 1
            continue
        return min(i + 2 if a == "--" else i + 1, len(cmd))
    return len(cmd)


def with_local_rank(cmd: "Sequence[str]", style: str, value: str) -> "list[str]":
    flag = LOCAL_RANK_FLAGS[style]
    if flag is None:
        return list(cmd)
    at = script_index(cmd)
    return [*cmd[:at], f"{flag}={value}", *cmd[at:]]


def _interpreter(cmd: "Sequence[str]") -> str:
    """The Python that runs torch.distributed.run: the command's own interpreter when the
    command is one (it is the one with the script's packages), else this one."""
    import shutil

    if cmd and _PYTHON.match(os.path.basename(cmd[0])):
        found = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0])
        if found:
            return found
    return sys.executable


def _has_torch(python: str, environ: "Mapping[str, str]") -> bool:
    """Can the interpreter the user named import torch? Answered in this process only when
    it is this very interpreter: two venvs' pythons are symlinks to one base Python (same
    real path) with different site-packages, so a different path is asked directly."""
    mine = os.path.abspath(sys.executable)
    if os.path.abspath(python) == mine or (
            os.path.dirname(os.path.abspath(python)) == os.path.dirname(mine)
            and os.path.realpath(python) == os.path.realpath(mine)):  # python/python3 of one venv
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    import subprocess

    probe = {k: v for k, v in environ.items() if k != knobs.AUTO}
    try:
        p = subprocess.run([python, "-c", "import importlib.util, sys; "
                            "sys.exit(importlib.util.find_spec('torch') is None)"],
                           env=probe, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def _free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # socket's answer is Any; AF_INET: (host, port)
        return port


def _how_else(env: DistEnv) -> str:
    world = f"{env.world_size}" if env.world_size else "<workers>"
    nproc = env.nproc_per_node or "<N>"
    from .sources import family

    kind = family(env.launcher)  # launcher families live on the Source classes
    if kind == "mpi":
        return f"have mpirun start every worker (mpirun -np {world} ..., {nproc} per node) and drop --nproc-per-node"
    if kind == "slurm":
        return f"have srun start every worker (srun --ntasks-per-node={nproc} ...) and drop --nproc-per-node"
    return "start one process per worker with your launcher"


def as_flag(message: str, value: str) -> str:
    """A resolver message about DISTENV_NPROC_PER_NODE, which `distenv run --nproc-per-node`
    sets for the resolver and the command, worded for the flag the user gave."""
    var = knobs.NPROC_PER_NODE
    for old, new in ((f"{var}={value}", f"--nproc-per-node {value}"),
                     (f"unset {var}", "drop --nproc-per-node"),
                     (f"give {var} ", "give --nproc-per-node "),
                     ("(one per CPU core), or unset it.", "(one per CPU core), or drop it."),
                     (var, "--nproc-per-node")):
        message = message.replace(old, new)
    return message


def plan(argv: "Iterable[str]", environ: "Mapping[str, str] | None" = None,
         discover: bool = False) -> Plan:
    """Resolve and decide what to exec, without side effects (apart from finding a free
    port for a one-node per-node launch that has no job id to derive one from).

    `discover` (what `main` passes): when a field the launch needs is unknown and the
    launcher offers a service that knows (PMI-1, PMIx, Cray PALS's apinfo), ask it first
    (`distenv.discovery.complete`); the command then gets the answer (DISTENV_PMI_HELD,
    DISTENV_PMIX_HELD), so neither it nor its children ask again."""
    opts, cmd = parse(argv)
    if opts["help"]:
        raise Usage("")
    if not cmd:
        raise Usage("no command given")
    child = dict(os.environ if environ is None else environ)
    if opts["nproc_per_node"] is not None:
        child[knobs.NPROC_PER_NODE] = opts["nproc_per_node"]
    from .bringup import bring_up, port_is_free

    # `discover` (main): what the launch leaves unknown comes from the launcher's service; the
    # command then gets the answer (exec keeps the pid: the services' `inherited`), so neither
    # it nor its children ask again (Open MPI 4's in-process client is finalized before exec).
    # The variables are exported below, into the command's environment, once decided.
    try:
        # every node fact, not only the master: the command it execs (a Lightning script,
        # say) may need them, and gets this process's answer (`handoffs`) instead of asking
        env = bring_up("run", environ=child, complete=discover and environ is None)
    except DistEnvError as exc:
        if opts["nproc_per_node"] is not None:
            raise DistEnvError(as_flag(str(exc), opts["nproc_per_node"])) from None
        raise
    if discover and environ is None:
        from .discovery import handoffs

        child.update(handoffs())
    child[knobs.AUTO] = "1"
    child[knobs.RUN] = "1"
    warnings: "list[str]" = []
    style = opts["local_rank_arg"]

    # The port is checked once settled: a one-node per-node launch without a job id gets a
    # free one below, so torch's default held by another job is no reason to stop it there.
    own = discover and environ is None  # this process's launch (bring_up's complete=)
    if env.launch != PER_NODE:
        if own:
            port_is_free(env)
        env.export(child)
        _count_not_word(child, env)
        if style != "none" and env.local_rank is None:
            raise DistEnvError(f"--local-rank-arg {style}: the local rank is not known under "
                               f"{env.launcher} ({env.provenance.get('local_rank', 'not revealed')}). "
                               "Fix: set LOCAL_RANK for each process, or drop --local-rank-arg "
                               "and read the LOCAL_RANK variable in the script.")
        return Plan(with_local_rank(cmd, style, str(env.local_rank)), child, env, "exec", warnings)

    # Per-node: torch's elastic launcher starts the workers on this node.
    if env.nproc_per_node is None and env.world_size is not None:
        # Lightning's on-prem style: WORLD_SIZE is every process of the job, NODE_RANK this node.
        raise DistEnvError(
            f"this per-node launch gives world_size={env.world_size} "
            f"({env.provenance.get('world_size', '')}) but not how many workers each node runs. "
            "Fix: distenv run --nproc-per-node N (WORLD_SIZE must be a multiple of N).")
    for field in ("num_nodes", "node_rank", "nproc_per_node"):
        if getattr(env, field) is None:
            # the workers per node are this command's own option; the others, the job script's
            fix = ("distenv run --nproc-per-node N, the same N on every node" if field == "nproc_per_node"
                   else "run `distenv show --explain`, and set the missing value in the job script")
            raise DistEnvError(
                f"a per-node launch needs {field}, which {env.launcher} does not reveal here "
                f"({env.provenance.get(field, 'unknown')}). Fix: {fix}.")
    if env.num_nodes == 1 and kind_of(env.provenance.get("master_port")) == DEFAULT \
            and "MASTER_PORT" not in child:
        # One node and no job id: 29500 would collide with any other such run here.
        env = env.replace(master_port=_free_port())
    if own:
        port_is_free(env)
    env.export(child)
    _count_not_word(child, env)
    python = _interpreter(cmd)
    if not _has_torch(python, child):
        raise DistEnvError(
            f"this is a per-node launch ({env.launcher}, node {env.node_rank} of {env.num_nodes}): "
            f"its {env.nproc_per_node} worker(s) are started by torch's elastic launcher "
            f"(python -m torch.distributed.run), but {python} cannot import torch. Fix: install "
            f"torch there (pip install torch==2.13.0), or {_how_else(env)}.")
    for name in PET_OVERRIDES:
        child.pop(name, None)
    cores = knobs.bound_cores()
    # nproc_per_node is not None here: the loop over the per-node fields above raised otherwise
    if cores is not None and cores < env.nproc_per_node and cores < (os.cpu_count() or cores):  # type: ignore[operator]
        warnings.append(
            f"this process is bound to {cores} CPU core(s) and its {env.nproc_per_node} workers "
            "inherit that binding: they will share it. Fix: let the launcher bind nothing "
            "(mpirun --bind-to none, or --map-by ppr:1:node:pe=<cores>; srun --cpus-per-task=<cores>).")
    run_id = env.job_id or f"distenv-{env.master_port}"
    from .knobs import address
    from .core.invariants import host_problem

    port = env.master_port
    assert port is not None  # the resolver always sets one (derived from the job, else 29500)

    # The address goes on torchrun's command line: one that starts with '-' would be read as
    # an option there. The resolver refuses it; one the launcher's service gave (discovery)
    # is checked here again.
    problem = host_problem(env.master_addr, env.provenance.get("master_addr", "unknown"))
    if problem:
        raise DistEnvError(f"{problem} Fix: set MASTER_ADDR to rank 0's host name or address "
                           "on every node.")
    argv_ = [python, "-m", "distenv.run", AGENT,
             "--nnodes", str(env.num_nodes), "--node-rank", str(env.node_rank),
             "--nproc-per-node", str(env.nproc_per_node),
             "--master-addr", str(env.master_addr), "--master-port", str(env.master_port),
             "--rdzv-backend", "static", "--rdzv-endpoint", address(str(env.master_addr), port),
             # DISTENV_TIMEOUT bounds the nodes' meeting too (torch's static default: 600 s)
             "--rdzv-conf", f"timeout={math.ceil(knobs.timeout(child))}",
             "--rdzv-id", str(run_id), "--no-python",
             *with_local_rank(cmd, style, "${local_rank}")]
    return Plan(argv_, child, env, "torchrun", warnings)


def _count_not_word(child: "dict[str, str]", env: Any) -> None:
    """The command gets the count, not the word ("gpu", "auto"): an adapter that narrows
    CUDA_VISIBLE_DEVICES to a worker's GPU would re-count 1 and contradict the launch."""
    if knobs.NPROC_PER_NODE in child and env.nproc_per_node is not None:
        child[knobs.NPROC_PER_NODE] = str(env.nproc_per_node)


def main(argv: "Sequence[str] | None" = None) -> int:
    """Entry point of `distenv run`: returns only on error (the command replaces us)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        p = plan(argv, discover=True)
    except Usage as exc:
        if str(exc):
            sys.stderr.write(USAGE.split("\n\n")[0] + f"\ndistenv run: error: {exc}. "
                             "Fix: distenv run --help lists what it takes\n")
            return 2
        sys.stdout.write(USAGE)
        return 0
    if p.warnings:
        from .log import get_logger

        for warning in p.warnings:
            get_logger(__name__).warning(warning)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(p.argv[0], p.argv, p.environ)
    except FileNotFoundError:
        sys.stderr.write(f"distenv run: error: command not found: {p.argv[0]}. Fix: give the "
                         "command's path, or install it on this node\n")
        return 127
    except PermissionError:
        sys.stderr.write(f"distenv run: error: permission denied: {p.argv[0]}. Fix: make it "
                         "executable (chmod +x), or run it through its interpreter\n")
        return 126
    except OSError as exc:
        sys.stderr.write(f"distenv run: error: cannot run {p.argv[0]}: {exc.strerror}\n")
        return 126
    return 0  # type: ignore[unreachable]  # pragma: no cover - execvpe does not return


#: The first argument of ``python -m distenv.run`` when it runs torch's elastic agent for a
#: node's workers (`agent`): what `plan` execs in a per-node launch.
AGENT = "--torch-elastic-agent"


def agent(args: "Sequence[str]") -> int:
    """torch.distributed.run with `args`, as `distenv run` starts a node's workers. A Ctrl-C
    (SIGINT to the terminal's process group) or the launcher's SIGTERM stops the workers as
    torchrun does, and ends here with one line and 128 + the signal's number, instead of the
    agent's traceback and a warning per worker (after a Ctrl-C, which reached every worker
    too, each worker's one line is all: `distenv.errors`). The agent's own warnings show with
    DISTENV_LOG_LEVEL=debug."""
    import logging
    import signal

    # A signal during torch's import (a second or more) is kept for after it: raised inside
    # it, torch swallowed the KeyboardInterrupt and the workers started anyway (review).
    from .knobs import debug_asked

    arrived: "list[int]" = []
    before = {sig: signal.signal(sig, lambda number, _frame: arrived.append(number))
              for sig in (signal.SIGINT, signal.SIGTERM)}
    # torch's C++ log (a refused or timed-out rendezvous: a warning per retry, then the error
    # with its C++ stack) is read once, at import: quiet for the agent alone, not its workers
    cpp_quiet = not debug_asked() and "TORCH_CPP_LOG_LEVEL" not in os.environ
    if cpp_quiet:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        from torch.distributed import DistError
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if cpp_quiet:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
    if arrived:
        return _stopped(arrived[0])

    if not debug_asked():
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("torch.distributed"):
                logging.getLogger(name).setLevel(logging.ERROR)
        # its "failed (exitcode: ...)" for a failed worker: the one line below says it
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        torchrun(list(args))
    except (SignalException, KeyboardInterrupt) as exc:
        return _stopped(int(getattr(exc, "sigval", signal.SIGINT)))
    except ChildFailedError as exc:
        # The failed worker printed its own error; torch's summary (a traceback of the agent,
        # 35 lines) said nothing more. One line, and the worker's status as the node's.
        rank, failure = exc.get_first_failure()
        code = failure.exitcode
        what = (f"was killed by {failure.signal_name()}" if code < 0 else f"exited with status {code}")
        sys.stderr.write(f"distenv run: worker {rank} (local rank {failure.local_rank}) {what}; "
                         "the node's other workers were stopped\n")
        return 128 - code if code < 0 else (code if 0 < code < 256 else 1)
    except DistError as exc:  # the nodes' meeting (static rendezvous: torch's TCPStore)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        sys.stderr.write(f"distenv run: this node's rendezvous with the other nodes failed ({first}). "
                         "Fix: start distenv run on every node with the same MASTER_ADDR and "
                         "MASTER_PORT, or set DISTENV_TIMEOUT=<seconds> to wait longer\n")
        return 1
    except (FileNotFoundError, PermissionError) as exc:  # the command: not found, not executable
        name = args[-1] if not exc.filename else exc.filename
        sys.stderr.write(f"distenv run: error: cannot run {name}: {exc.strerror}. Fix: give "
                         "the command's path, or install it on this node\n")
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0


def _stopped(number: int) -> int:
    """The agent's end after a signal: 128 + its number; a line unless it was a Ctrl-C, which
    reached every worker too (each said so)."""
    import signal

    _stop_children(number)
    if number != signal.SIGINT:
        sys.stderr.write(f"distenv run: stopped by {signal.Signals(number).name}; its "
                         "workers were stopped too\n")
    return 128 + number


def _stop_children(number: int, grace: float = 5.0) -> None:
    """Stop every worker still running under this agent, with its own processes: `number` to
    its process group, then SIGKILL after `grace` seconds. torch starts each worker in a
    session of its own and stops the ones it tracks, but a signal that lands while its Popen
    is between fork and return raises there, and the forked worker is in no list of torch's
    (nor reached by a terminal's Ctrl-C: another session). Only group leaders are workers:
    the PMIx keeper this process inherited (`discovery.pmix_relay.keeper`) must outlive it."""
    import signal
    import time

    me = str(os.getpid())
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _parent(name) == me:
            try:
                if os.getpgid(int(name)) == int(name):
                    kids.append(int(name))
            except ProcessLookupError:
                pass
    for pid in kids:
        try:
            os.killpg(pid, number)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    groups = kids
    while groups:  # until every group is empty (a process of one may ignore the signal)
        for pid in groups:
            _reaped(pid)
        groups = [pid for pid in groups if _group_alive(pid)]
        if not groups or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for pid in groups:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in kids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped above
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parent(pid: str) -> str:
    """Field 4 of /proc/<pid>/stat (after the name, which may hold anything up to its ")");
    discovery.chain's parent_of is that package's internal."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode("ascii", "replace").rpartition(")")[2].split()[1]
    except (OSError, IndexError):
        return ""


def _reaped(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # not ours any more, or reaped by torch
        return True


if __name__ == "__main__":
    if sys.argv[1:2] == [AGENT]:
        sys.exit(agent(sys.argv[2:]))
    sys.exit(main())

