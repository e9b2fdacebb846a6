"""Every ``DISTENV_*`` name distenv knows (the registry), and the knobs every adapter shares.

The registry (`KNOBS`): one `Knob` per name -- the name itself (a `str`), its parser, its
default, what it means, and who sets it (`USER`: documented for users; `TEMPLATE`: set by a
job template distenv ships; `INTERNAL`: distenv writes it for its own processes; `DEVELOPMENT`:
distenv's own test suite and scripts). Every module reads a name through its `Knob` (`value`,
`raw`, `is_set`); `tests/unit/test_knobs.py` scans the source so that no module spells a
``DISTENV_*`` name outside this file, and checks that ``docs/knobs.md`` is `markdown()`.
`unknown(environ)`: the ``DISTENV_*`` names in an environment that are none of these, each with
the nearest known one (``DISTENV_AUOT`` -> ``DISTENV_AUTO``): a misspelled knob is otherwise
ignored without a word (`distenv.log.warn_unknown_knobs` says so, `distenv doctor` counts it).
`distenv doctor` parses every known knob's value as its reader will (an error, with the Fix).

The shared knobs:

* `timeout()`: seconds a rendezvous waits for every rank (DISTENV_TIMEOUT, default 180).
* `side_port()`: a port beside the master port for a framework's own service (TensorFlow's
  workers, Horovod's rendezvous server, Keras/JAX's coordinator): the user's DISTENV_<X>_PORT,
  else derived from the job like the master port (`distenv.core.ports`), so every rank computes the
  same one and concurrent jobs differ; never the master port itself (torchrun's store, or the
  user's, may hold it).
* `core_share()`: how many cores this process may use for its thread pools.
* `hostfile()`, `gather()`: where `distenv.tensorflow` may learn every rank's host
  (DISTENV_HOSTFILE, DISTENV_GATHER), see `distenv.core.placement`.

Standard library only; reading the CPU affinity is the only system call, and only when asked.
"""

from __future__ import annotations

import os

from .core import ports
from .core._error import DistEnvError
from .core.reading import PORT_MAX, parse_port, port_error

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

    from .core.description import DistEnv


def _environ(environ: "Mapping[str, str] | None") -> "Mapping[str, str]":
    return os.environ if environ is None else environ


# -- the registry -------------------------------------------------------------------------------
USER = "user"
TEMPLATE = "template"
INTERNAL = "internal"
DEVELOPMENT = "development"

#: The words that turn a switch off; any other non-empty value turns it on.
OFF = ("0", "false", "no", "off")


def on(value: object) -> bool:
    """A switch's value: off for "", 0, false, no, off (any case); on for anything else."""
    text = str(value).strip().lower()
    return bool(text) and text not in OFF


def _text(raw: str, name: str) -> str:
    return raw.strip()


def _flag(raw: str, name: str) -> bool:
    return on(raw)


def _seconds(raw: str, name: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise DistEnvError(f"{name}={raw!r} is not a positive number of seconds. "
                           f"Fix: unset it or give e.g. {name}=300.")
    return seconds


def _port(raw: str, name: str) -> int:
    return parse_port(raw, name)


def _choice(*allowed: str) -> "Callable[[str, str], str]":
    def parse(raw: str, name: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise DistEnvError(f"{name}={raw!r} is not one of {', '.join(allowed)}. "
                               f"Fix: set {name} to one of them, or unset it.")
        return value

    parse.__doc__ = " | ".join(allowed)
    return parse


class Knob(str):
    """A ``DISTENV_*`` name (the string itself) and what distenv knows of it."""

    __slots__ = ("parse", "default", "meaning", "values", "who")
    parse: "Callable[[str, str], object]"
    default: object
    meaning: str
    values: str
    who: str

    def __new__(cls, name: str, meaning: str, values: str = "text",
                parse: "Callable[[str, str], object]" = _text, default: object = None,
                who: str = USER) -> "Knob":
        self = super().__new__(cls, name)
        self.parse, self.default, self.meaning = parse, default, meaning
        self.values, self.who = values, who
        return self

    def raw(self, environ: "Mapping[str, str] | None" = None) -> "str | None":
        """The value as set (None when unset or blank)."""
        value = _environ(environ).get(self)
        return value if value is not None and value.strip() else None

    def is_set(self, environ: "Mapping[str, str] | None" = None) -> bool:
        """Present in the environment at all (blank included: a marker's presence)."""
        return self in _environ(environ)

    def value(self, environ: "Mapping[str, str] | None" = None) -> "Any":
        """The parsed value, or the default when unset or blank; a bad value is a
        `DistEnvError` naming the variable."""
        raw = self.raw(environ)
        return self.default if raw is None else self.parse(raw, self)

    def __reduce__(self) -> "tuple[Any, ...]":
        return (str, (str(self),))


KNOBS: "dict[str, Knob]" = {}


def _knob(name: str, meaning: str, **kw: "Any") -> Knob:
    knob = KNOBS[name] = Knob(name, meaning, **kw)
    return knob


_SWITCH = dict(values="0 turns it off (on by default)", parse=_flag, default=True)
_FLAG = dict(values="1 turns it on (0, false, no, off or unset: off)", parse=_flag, default=False)

# Users'
AUTO = _knob("DISTENV_AUTO", "set up distributed training at interpreter start, with no code "
             "change (docs/zero-code.md)", **_FLAG)
LAUNCHER = _knob("DISTENV_LAUNCHER", "read this launcher's variables, whatever else is set "
                 "(`distenv show --json` names them; `env`: the plain torch variables; `none`: "
                 "one process)", values="a launcher name")
NPROC_PER_NODE = _knob("DISTENV_NPROC_PER_NODE", "workers each node starts, where one process "
                       "per node was launched (distenv run, Lightning)",
                       values="a number from 1, auto, gpu or cpu")
TIMEOUT = _knob("DISTENV_TIMEOUT", "seconds every rendezvous, pre-flight and launcher service "
                "waits for every rank", values="seconds > 0", parse=_seconds, default=180.0)
HOSTFILE = _knob("DISTENV_HOSTFILE", "a file naming the host of every rank, where the launcher "
                 "does not say (docs/discovery.md)", values="a path")
GATHER = _knob("DISTENV_GATHER", "learn every rank's host with an MPI allgather (TensorFlow's "
               "cluster)", values="mpi4py", parse=_choice("mpi4py", "mpi", "1", "true", "yes"))
TF_PORT = _knob("DISTENV_TF_PORT", "the first of TensorFlow's worker ports (default: derived "
                "from the job, beside the master port)", values="a port", parse=_port)
KERAS_PORT = _knob("DISTENV_KERAS_PORT", "the port of JAX's coordinator for Keras 3 (default: "
                   "derived from the job)", values="a port", parse=_port)
HOROVOD_PORT = _knob("DISTENV_HOROVOD_PORT", "the port of Horovod's Gloo rendezvous server "
                     "(default: derived from the job)", values="a port", parse=_port)
PREFLIGHT_PORT = _knob("DISTENV_PREFLIGHT_PORT", "the port process 0 of the pre-flight listens "
                       "at (JAX, TensorFlow, Horovod; default: derived from the job)",
                       values="a port", parse=_port)
HOROVOD_CONTROLLER = _knob("DISTENV_HOROVOD_CONTROLLER", "how Horovod's ranks meet",
                           values="auto, mpi or gloo", parse=_choice("auto", "mpi", "gloo"),
                           default="auto")
ALLOW_KERAS3 = _knob("DISTENV_ALLOW_KERAS3", "let TensorFlow's zero-code patch go on where "
                     "tf.keras is Keras 3 (which MultiWorkerMirroredStrategy does not train)",
                     **_FLAG)
LOG_LEVEL = _knob("DISTENV_LOG_LEVEL", "the level of distenv's own log lines (when the "
                  "application configured no logging)", values="debug, info, warning or error",
                  parse=_choice("debug", "info", "warning", "error"), default="info")
TRACEBACK = _knob("DISTENV_TRACEBACK", "print the traceback of an error distenv ends a process "
                  "with, not only its one line", **_FLAG)
TEARDOWN = _knob("DISTENV_TEARDOWN", "end torch's process group in order at exit", **_SWITCH)
PMI = _knob("DISTENV_PMI", "ask the launcher's PMI-1 service (Hydra, srun --mpi=pmi2) what the "
            "variables do not say", **_SWITCH)
PMIX = _knob("DISTENV_PMIX", "ask the launcher's PMIx server (Open MPI, srun --mpi=pmix) what "
             "the variables do not say", **_SWITCH)
PMIX_RELAY = _knob("DISTENV_PMIX_RELAY", "keep the PMIx query's connection open until the task "
                   "ends (PMIx 5's finalize race, docs/discovery.md)", **_SWITCH)
APINFO = _knob("DISTENV_APINFO", "read Cray PALS's placement file (PALS_APINFO)", **_SWITCH)
MASTER_CHECK = _knob("DISTENV_MASTER_CHECK", "rank 0 dials the master address once at bring-up "
                    "and warns where it does not lead to its own host (docs/guarantees.md, row 18)",
                    **_SWITCH)
# Set by the Kubernetes templates of integrations/kubernetes (downward API, k8s_job source)
_T = dict(who=TEMPLATE)
JOB_COMPLETIONS = _knob("DISTENV_JOB_COMPLETIONS", "an Indexed Job's completions: its pods "
                        "(the template's opt-in)", values="a number from 1", **_T)
JOB_NAME = _knob("DISTENV_JOB_NAME", "the Job's name (label batch.kubernetes.io/job-name)", **_T)
JOB_SUBDOMAIN = _knob("DISTENV_JOB_SUBDOMAIN", "the pod template's subdomain (its headless "
                      "Service)", **_T)
JOBSET_JOB_GLOBAL_INDEX = _knob("DISTENV_JOBSET_JOB_GLOBAL_INDEX", "JobSet label "
                                "job-global-index", values="a number from 0", **_T)
JOBSET_GLOBAL_REPLICAS = _knob("DISTENV_JOBSET_GLOBAL_REPLICAS", "JobSet label global-replicas",
                               values="a number from 1", **_T)
JOBSET_REPLICATED_JOB_REPLICAS = _knob("DISTENV_JOBSET_REPLICATED_JOB_REPLICAS", "JobSet label "
                                       "replicatedjob-replicas", values="a number from 1", **_T)
JOBSET_COORDINATOR = _knob("DISTENV_JOBSET_COORDINATOR", "JobSet label coordinator (the "
                           "coordinator pod's address)", **_T)
# distenv's own, written for its own processes
_I = dict(who=INTERNAL)
LIGHTNING_NODE = _knob("DISTENV_LIGHTNING_NODE", "a Lightning node process's description, "
                       "handed to the workers it starts", values="JSON", **_I)
PMI_HELD = _knob("DISTENV_PMI_HELD", "distenv run's PMI-1 answer, handed to the command it "
                 "execs", **_I)
PMIX_HELD = _knob("DISTENV_PMIX_HELD", "distenv run's PMIx answer, handed to the command it "
                  "execs", **_I)
RUN = _knob("DISTENV_RUN", "this process is the command distenv run started", **_I)
GPU_SLICE = _knob("DISTENV_GPU_SLICE", "the CUDA_VISIBLE_DEVICES an adapter narrowed to this "
                  "process's GPUs (not narrowed again)", **_I)
HOLDER_LOG = _knob("DISTENV_HOLDER_LOG", "a file the holder logs its requests to (debugging)",
                   values="a path", **_I)
# distenv's test suite and scripts (tests/, integrations/, benchmarks/, .ci/): known, so never
# warned about, but no Knob each (a plain table keeps `import distenv` light).
DEVELOPMENT_NAMES = {
    "DISTENV_REQUIRE_LAUNCHERS": "a test that would skip for a missing launcher fails",
    "DISTENV_REQUIRE_FRAMEWORK": "a test that would skip for a missing framework fails",
    "DISTENV_LAUNCHERS_DIR": "where integrations/setup.sh installs the launchers",
    "DISTENV_RUN_DIR": "where the test clusters keep their state",
    "DISTENV_CONCURRENCY_ROUNDS": "rounds of the concurrent Hydra jobs test (default 10)",
    "DISTENV_REPO_DIR": "the checkout the integration scripts use",
    "DISTENV_INTEGRATIONS_DIR": "the integrations/ folder the scripts use",
    "DISTENV_CACHE_DIR": "the setup's download cache",
    "DISTENV_KEEP_RUNS": "keep a failed integration run's directory",
    "DISTENV_VENV": "the project's virtualenv",
    "DISTENV_PYTHON": "the interpreter the setup builds virtualenvs with",
    "DISTENV_SLURMD_PORT": "the test SLURM's slurmd port",
    "DISTENV_SLURMCTLD_PORT": "the test SLURM's slurmctld port",
    "DISTENV_SLURM_CPUS": "the test SLURM's CPUs per node",
    "DISTENV_TORCHRUN": "the torchrun the tests use",
    "DISTENV_E2E_TIMEOUT": "an end-to-end run's limit",
    "DISTENV_E2E_LOG_DIR": "where end-to-end runs keep their output",
    "DISTENV_E2E_JOBS": "end-to-end runs at once",
    "DISTENV_FUZZ_SEED": "the fuzz tests' seed",
    "DISTENV_FUZZ_EXAMPLES": "the fuzz tests' examples",
    "DISTENV_FUZZ_CLI": "the CLI fuzz test's examples",
    "DISTENV_FUZZ_PER_EXAMPLE": "the fuzz tests' mutations per example",
    "DISTENV_SCALE_EXAMPLES": "the scale property tests' examples",
    "DISTENV_SCONTROL_EXAMPLES": "the host list tests' examples against scontrol",
    "DISTENV_RACE_TRIES": "the race tests' tries",
    "DISTENV_EXIT_RUNS": "the clean-exit tests' runs",
    "DISTENV_EXIT_PARALLEL": "the clean-exit tests' runs at once",
    "DISTENV_PORT_KEYS": "the port spread test's keys",
    "DISTENV_SELFTEST": "a test script's self-test mode",
    "DISTENV_TEST_RUN": "a test's marker of its own run",
    "DISTENV_EXPORT_SCRIPT": "a test's script for distenv export",
    "DISTENV_HOROVOD_VERSION": "the Horovod the setup builds",
    "DISTENV_LIGHTNING_PACKAGES": "the Lightning packages the setup installs",
    "DISTENV_TRANSFORMERS4_VENV": "the transformers4 virtualenv of the setup",
    "DISTENV_TRANSFORMERS5_VENV": "the transformers5 virtualenv of the setup",
    "DISTENV_RAY_VENV": "the Ray virtualenv of the setup",
    "DISTENV_DEEPSPEED_VENV": "the deepspeed virtualenv of the setup",
    "DISTENV_HOROVOD_VENV": "the horovod virtualenv of the setup",
    "DISTENV_TENSORFLOW_VENV": "the tensorflow virtualenv of the setup",
    "DISTENV_JAX_VENV": "the jax virtualenv of the setup",
    "DISTENV_TENSORFLOW_SPEC": "what the setup installs for tensorflow",
    "DISTENV_KERAS_SPEC": "what the setup installs for keras",
    "DISTENV_JAX_SPEC": "what the setup installs for jax",
    "DISTENV_OPENMPI5_SPEC": "what the setup installs for openmpi5",
    "DISTENV_MPICH5_SPEC": "what the setup installs for mpich5",
    "DISTENV_IMPI_SPEC": "what the setup installs for impi",
}
#: Prefixes of development names: DISTENV_PY_<NAME>, a framework's interpreter.
DEVELOPMENT_PREFIXES = ("DISTENV_PY_",)


def known(name: str) -> bool:
    """Is `name` a knob, or a name of distenv's own test suite and scripts?"""
    return name in KNOBS or name in DEVELOPMENT_NAMES or name.startswith(DEVELOPMENT_PREFIXES)


def unknown(environ: "Mapping[str, str] | None" = None) -> "list[tuple[str, str | None]]":
    """The ``DISTENV_*`` names set in `environ` that distenv does not know, each with the
    nearest name users set (None when none is near)."""
    names = [n for n in _environ(environ) if n.startswith("DISTENV_") and not known(n)]
    if not names:
        return []
    from difflib import get_close_matches

    public = [k for k in KNOBS.values() if k.who in (USER, TEMPLATE)]
    out = []
    for name in sorted(names):
        near = get_close_matches(name, public, n=1, cutoff=0.8)
        out.append((name, near[0] if near else None))
    return out


def unknown_message(name: str, nearest: "str | None") -> str:
    """One line about an unknown name: what distenv does with it and what to do."""
    if nearest:
        return (f"{name} is not a distenv setting and is ignored: did you mean {nearest}? "
                f"Fix: rename it to {nearest}.")
    return (f"{name} is not a distenv setting and is ignored. Fix: see docs/knobs.md for the "
            "settings, or unset it.")


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    return f"{default:g}" if isinstance(default, float) else str(default)


def markdown() -> str:
    """docs/knobs.md: every knob, by who sets it (the test keeps the file equal to this)."""
    titles = {USER: "Settings for users", TEMPLATE: "Set by distenv's job templates",
              INTERNAL: "Written by distenv for its own processes (do not set)",
              DEVELOPMENT: "distenv's own test suite and scripts"}
    lines = ["# DISTENV_* variables", "",
             "Generated from the registry in `src/distenv/knobs.py` (`distenv.knobs.markdown()`);",
             "`tests/unit/test_knobs.py` fails when this file and the registry differ. A",
             "`DISTENV_*` name that is none of these gets one warning naming the nearest one",
             "(`DISTENV_AUOT` -> `DISTENV_AUTO`), and `distenv doctor` counts it as a warning.",
             "`distenv doctor` also parses every value set below: one its parser refuses",
             "(`DISTENV_TIMEOUT=abc`) is an error with the Fix, before the job would die on it.", ""]
    for who in (USER, TEMPLATE, INTERNAL):
        lines += [f"## {titles[who]}", ""]
        if who == INTERNAL:
            lines += ["| name | meaning |", "|---|---|"]
        else:
            lines += ["| name | values | default | meaning |", "|---|---|---|---|"]
        for knob in sorted((k for k in KNOBS.values() if k.who == who), key=str):
            if who == INTERNAL:
                lines.append(f"| `{knob}` | {knob.meaning} |")
            else:
                lines.append(f"| `{knob}` | {knob.values} | {_shown(knob.default)} | {knob.meaning} |")
        lines.append("")
    lines += [f"## {titles[DEVELOPMENT]}", "", "| name | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in sorted(DEVELOPMENT_NAMES.items())]
    lines += [f"| `{prefix}<NAME>` | a framework's interpreter (`.venvs/<name>`) |"
              for prefix in DEVELOPMENT_PREFIXES]
    lines.append("")
    return "\n".join(lines)


# -- the shared knobs -------------------------------------------------------------------------
#: Seconds a rendezvous waits for every rank unless DISTENV_TIMEOUT says otherwise.
DEFAULT_TIMEOUT: float = TIMEOUT.default  # type: ignore[assignment]



def timeout(environ: "Mapping[str, str] | None" = None, given: "float | str | None" = None) -> float:
    """Seconds to wait: `given` when not None, else DISTENV_TIMEOUT, else 180: the one wait
    limit of every adapter. Either one that is not a positive number is an error naming it."""
    if given is not None:
        try:
            seconds_given = float(given)
        except (TypeError, ValueError):
            seconds_given = float("nan")
        if not seconds_given > 0:  # nan too
            raise DistEnvError(f"timeout={given!r} is not a positive number of seconds. Fix: give "
                               f"a number above 0, or leave it out ({TIMEOUT}, else {DEFAULT_TIMEOUT:g}).")
        return seconds_given
    seconds: float = TIMEOUT.value(environ)
    return seconds


def side_port(env: "DistEnv", purpose: str, environ: "Mapping[str, str] | None" = None,
              var: "str | None" = None, given: "int | str | None" = None,
              width: int = 1, addr: "str | None" = None) -> int:
    """The first of `width` ports for `purpose` ("tf", "horovod", "keras", ...).

    `given` (a keyword argument) wins, then the variable `var` (e.g. DISTENV_TF_PORT), else
    ``ports.port_for("<purpose>:<launcher>:<job id>:<addr>:<master port>")`` moved past the
    master port when the range would hold it. `addr` defaults to the master address."""
    name = var or "port"
    last = PORT_MAX + 1 - width  # the first of `width` consecutive ports
    raw = _environ(environ).get(var) if given is None and var is not None else None
    if var is not None and raw is not None and raw.strip():
        # a DISTENV_* name through its knob's parser; a framework's own (JAX_COORDINATOR_PORT) as a port
        port: int = var.value(environ) if isinstance(var, Knob) else parse_port(raw, var)
        if port > last:  # a port, but not the first of `width` free ones
            raise port_error(var, raw, last=last)
        return port
    if given is not None:
        return parse_port(str(given), name, last=last)
    host = env.master_addr if addr is None else addr
    key = f"{purpose}:{env.launcher}:{env.job_id}:{host}:{env.master_port}"
    # Blocks of `width` ports are aligned: two jobs with as many workers per host share a
    # whole block or none, so a pair collides with odds width/10000 (2 * width - 1 unaligned:
    # 0.15 % for 8 ports); each worker then checks its own port is free before binding it
    # (distenv.tensorflow.preflight).
    blocks = ports.SPAN // width
    base = ports.BASE + width * (ports.fnv1a(key) % blocks)
    master = env.master_port
    if master is not None and base <= master < base + width:
        base = ports.BASE + width * ((base - ports.BASE) // width + 1) % (blocks * width)
    return base


def address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:29500``), as every launcher and
    framework writes an address."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def cpu_set(pid: int = 0) -> "set[int] | None":
    """The cores process `pid` (0: this one) may run on; None where the system does not say."""
    try:
        return set(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


def bound_cores() -> "int | None":
    """How many cores this process may run on (its CPU affinity); None where unknown."""
    cores = cpu_set()
    return None if cores is None else len(cores)


def core_share(local_world_size: "int | None", mine: "Iterable[int] | None" = None,
               parent: "Iterable[int] | None" = None) -> "tuple[int, str]":
    """(cores this process may use, why).

    `mine`/`parent`: CPU sets of this process and of its parent (default: measured). When the
    launcher bound this process to fewer cores than its parent has (mpirun's default binding,
    srun --cpu-bind), those cores are its own; otherwise the node's `local_world_size`
    processes share them."""
    cores = cpu_set() if mine is None else set(mine)
    if not cores:
        cores = set(range(os.cpu_count() or 1))
    theirs = cpu_set(os.getppid()) if parent is None else set(parent)
    nlocal = local_world_size or 1
    if theirs and cores < theirs:
        return len(cores), f"{len(cores)} core(s) bound to this process by the launcher"
    return max(1, len(cores) // nlocal), f"{len(cores)} core(s) shared by {nlocal} local process(es)"


def hostfile(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """DISTENV_HOSTFILE: a file naming every rank's host (see `distenv.core.placement`)."""
    path: "str | None" = HOSTFILE.value(environ)
    return path or None


def gather(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """DISTENV_GATHER: how to ask the other ranks for their hosts (only 'mpi4py'); a value
    its parser refuses is an error naming it."""
    method: "str | None" = GATHER.value(environ)
    return method


def log_level(environ: "Mapping[str, str] | None" = None) -> str:
    """DISTENV_LOG_LEVEL's level; 'info' when unset, and when its parser refuses the value (the
    logger then keeps INFO, and `distenv doctor` reports the value as an error)."""
    try:
        level: str = LOG_LEVEL.value(environ)
    except DistEnvError:
        return str(LOG_LEVEL.default)
    return level


def debug_asked(environ: "Mapping[str, str] | None" = None) -> bool:
    """DISTENV_LOG_LEVEL=debug (see `log_level`)."""
    return log_level(environ) == "debug"
