"""`resolve()`: environment mapping in, `DistEnv` out. Pure: reads, never writes.

Order of work:
1. choose the launcher (DISTENV_LAUNCHER or the first matching registry entry);
2. let it read its variables, and let the platform (Azure ML, SageMaker, ...) fill gaps;
3. apply explicit keyword arguments (they win over the launch's variables; what the workers
   per node then contradict is an error);
4. settle per-node launches (how many workers per node);
5. derive what follows for certain (one node -> node rank 0, loopback master, ...);
6. pick the master port by the documented rule (`distenv.core.ports`);
7. cross-check canonical variables (a stale RANK is an error, not a choice) and invariants;
8. record where every rank runs when the launch proves it (`distenv.core.placement`).
"""

from __future__ import annotations

import os

from . import ports
from .description import (DEFAULT, DERIVED, FIELDS, GIVEN, PER_NODE, PER_PROCESS, UNKNOWN, DistEnv, Note,
                          Why, _build)
from ..errors import DistEnvError
from ..knobs import LAUNCHER, NPROC_PER_NODE, RUN
from .invariants import check, host_problem
from .reading import MAX_COUNT, Reading, get_int, parse_port, show
from ..sources import LAUNCHERS, NONE, PLATFORMS, find, names, names_of, platform_name

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any, NoReturn

    from .reading import Env
    from ..sources import Source

OVERRIDABLE = frozenset(FIELDS) - {"launch"}
LOOPBACK = "127.0.0.1"

# Canonical variables cross-checked against the launcher's answer.
CANONICAL = (
    ("RANK", "rank"),
    ("WORLD_SIZE", "world_size"),
    ("LOCAL_RANK", "local_rank"),
    ("LOCAL_WORLD_SIZE", "local_world_size"),
    ("NODE_RANK", "node_rank"),
    ("GROUP_RANK", "node_rank"),
)


def resolve(environ: "Mapping[str, str] | None" = None, **overrides: Any) -> DistEnv:
    """Describe this process's place in a distributed launch.

    `environ` is any mapping (default: ``os.environ``); it is only read. Keyword
    arguments named like `DistEnv` fields win over the environment (``launcher=`` forces a
    source, like DISTENV_LAUNCHER). Raises `DistEnvError` when the environment is
    malformed or contradictory, or a keyword argument contradicts the workers per node.
    """
    env = os.environ if environ is None else environ
    if type(env) is dict:
        env = _strings(env)
    else:  # os.environ, or any mapping: its values are checked as they are read
        env = _MappingView(env)  # type: ignore[assignment]  # reads like the Mapping it wraps
    if overrides:
        unknown = set(overrides) - OVERRIDABLE
        if unknown:
            raise TypeError(f"resolve() got unknown field(s): {', '.join(sorted(unknown))}")

    r = Reading()
    forced = overrides.pop("launcher", None)
    source, why = _choose(env, forced)
    source.read(env, r)
    if source.family == "mpi" and forced is None and not LAUNCHER.raw(env):
        _nested_mpi(env, r, source)
    r.default("launcher", source.name, why)
    r.owns, r.node_order = source.owns, source.launch.node_order  # what a platform overlay must respect
    _platform(env, r, source, overrides.pop("platform", None))

    for field in ("hosts", "rank_hosts"):
        if field in overrides:
            overrides[field] = _host_names(field, overrides[field])
    for field, value in overrides.items():
        if field != "nproc_per_node":
            r.values[field] = value
            r.why[field] = "given to resolve()"

    _per_node(env, r, source, overrides.get("nproc_per_node"))
    _derive(r)
    _kept(r, overrides)
    source.after(env, r)
    _master(env, r, source, overrides)
    _check_canonical(env, r, source, overrides)
    check(r.values, r.why)
    r.values["launch"] = r.launch
    r.why["launch"] = (
        "one process per node, whose workers are yet to be started" if r.launch == PER_NODE
        else "a single process, started without a launcher" if source.name == "none"
        else "the launcher started every worker process"
    )
    if r.values.get("platform") is None:
        r.why["platform"] = "no platform variables found"
    _note_unknowns(r, source)
    # 8. which host runs every rank, where the launch proves it (built on first access). Every
    # rule starts from a host list, so a launch without one does not even import the rules.
    if r.values.get("hosts") is not None:
        from .placement import record

        record(env, r.values, r.why, r.launch == PER_NODE, (source, _platform_source(r)),
               r.hosts_by_node)
    return _build(r.values, r.why, r.notes)


def _host_names(field: str, value: object) -> "tuple[str, ...]":
    """resolve(hosts=[...]) and rank_hosts=: a list or tuple of host names, else one error
    (an int raised TypeError, a string became one host, 'x y' passed)."""
    if isinstance(value, (list, tuple)) and value and all(host_problem(h, field) is None for h in value):
        return tuple(value)
    raise DistEnvError(f"{field}={show(repr(value))[1:-1]} (given to resolve()) is not a list of host "
                       f"names. Fix: pass {field}=['node1', 'node2', ...], or leave it out.")


def rank_if_known(environ: "Mapping[str, str] | None" = None) -> "int | None":
    """This process's rank, or None where it is unknown or the launch cannot be described: for
    a message that comes from rank 0 only, and from every process where that is unknown."""
    try:
        return resolve(environ).rank
    except Exception:  # noqa: BLE001 - a launch distenv cannot describe: still say it
        return None


def _strings(env: "Mapping[str, Any]") -> "Mapping[str, str]":
    """A mapping given to resolve() whose values are all strings, as an environment's are:
    itself when they are; an int (not a bool) becomes its digits (``{"RANK": 0}`` means
    RANK=0); any other value is refused with one line naming it."""
    for value in env.values():
        if not isinstance(value, str):
            break
    else:
        return env
    return {key: _string(key, value) for key, value in env.items()}


def _string(key: object, value: object) -> str:
    """`value` as an environment value: a str; an int (not a bool) as its digits; else the
    one-line error of `_strings`."""
    if isinstance(value, str):
        return value
    if value.__class__ is int:
        return str(value)
    name = key if isinstance(key, str) and len(key) <= 80 else show(key)
    raise DistEnvError(
        f"{name}={show(repr(value))[1:-1]} ({type(value).__name__}) in the mapping given "
        f"to resolve() is not a string, as environment values are. Fix: give it as a "
        f"string ({name}='...'), or leave it out of the mapping.")


class _MappingView:
    """os.environ (or any other mapping) read through one pass over its keys: resolution asks
    for ~50 mostly-missing variables, and os.environ answers each missing one by raising
    KeyError inside .get(). Measured (callgrind, whole process): cheaper than reading
    os.environ directly, and than the former view of its private ``_data``."""

    __slots__ = ("_env", "_keys")

    def __init__(self, env: "Mapping[str, str]") -> None:
        self._env = env
        self._keys = set(env)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __getitem__(self, key: str) -> str:
        value = self._env[key]
        return value if value.__class__ is str else _string(key, value)

    def get(self, key: str, default: "str | None" = None) -> "str | None":
        if key not in self._keys:
            return default
        value = self._env[key]
        return value if value.__class__ is str else _string(key, value)

    def __iter__(self) -> "Iterator[str]":
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


# -- 1. which launcher ------------------------------------------------------------------
def resolved(env: "DistEnv | Mapping[str, str] | None" = None,
             environ: "Mapping[str, str] | None" = None) -> "tuple[DistEnv, Mapping[str, str]]":
    """(description, environment) for an adapter called with a `DistEnv`, a mapping to
    resolve (in `env`'s place or as `environ`), or nothing (``os.environ``)."""
    if env is not None and not isinstance(env, DistEnv):  # a mapping to resolve
        environ, env = env, None
    src = os.environ if environ is None else environ
    return (resolve(src) if env is None else env), src


def _choose(env: "Env", forced: "str | None") -> "tuple[Source, str]":
    why_forced = f"launcher={forced!r} given to resolve()"
    if forced is None and LAUNCHER.raw(env):
        forced, why_forced = env[LAUNCHER], f"{LAUNCHER}={env[LAUNCHER]}"
    if forced is not None:
        name = str(forced).strip().lower()
        entry = find(name)
        if entry is None:
            raise DistEnvError(
                f"unknown launcher {name!r} ({why_forced}). Known: {', '.join(names())}. "
                f"Fix: {_unforce(why_forced)} one of the known names."
            )
        source = entry.load()
        if entry is not NONE and (entry.present(env) is None or not source.detect(env)):
            wanted = ", ".join(entry.markers)
            raise DistEnvError(
                f"{why_forced} forces {source.title}, but its variables ({wanted}) are absent "
                f"or say this is not one of its processes. Fix: {_unforce(why_forced)} the "
                "launcher that started this process, or run under that launcher."
            )
        return source, why_forced
    for entry in LAUNCHERS:
        for marker in entry.markers:  # Entry.present, inlined: this loop runs on every call
            if marker in env:
                source = entry.load()
                if source.detect(env):
                    return source, f"{marker} present"
                break
    return NONE.load(), "no launcher variables found"


def _nested_mpi(env: "Env", r: Reading, source: "Source") -> None:
    """Another MPI launcher's variables beside the chosen one's, with another rank or size (or
    local ones): one MPI launcher started inside the other, whose ranks inherit the outer
    one's variables (a review measured `mpirun -np 1 mpiexec.mpich -n 2`: both ranks read Open MPI's rank 0 of 1).
    The variables do not say which is inner, so it is an error; DISTENV_LAUNCHER decides.
    Launchers that set both families' variables for the same rank (MVAPICH2's Hydra: MV2_* and
    PMI_*) agree and pass."""
    for entry in LAUNCHERS:
        if entry.present(env) is None:
            continue
        other = entry.load()
        if other is source or other.family != "mpi" or not other.detect(env):
            continue
        theirs = Reading()
        try:
            other.read(env, theirs)
        except DistEnvError:  # its variables are malformed: they describe no rank to compare
            continue
        # the local counts too: Hydra's -pmi-port gives no size, and its rank 0 matched the
        # outer rank 0 (review: it resolved as rank 0 of 1 while rank 1 stopped)
        differ = [f for f in ("rank", "world_size", "local_rank", "local_world_size")
                  if None not in (r.get(f), theirs.get(f)) and r.get(f) != theirs.get(f)]
        if differ:
            shown = ", ".join(f"{f} {r.get(f)} ({r.why.get(f)}) against {theirs.get(f)} "
                              f"({theirs.why.get(f)})" for f in differ)
            raise DistEnvError(
                f"{source.title} and {other.title} variables are both here and disagree: {shown}. "
                "One MPI launcher was started inside the other, and the inner one's ranks carry "
                f"the outer one's variables. Fix: DISTENV_LAUNCHER={names_of(source)[0]} or "
                f"{names_of(other)[0]}, whichever started this process (or unset the outer "
                "launcher's variables before starting the inner one).")


def _unforce(why_forced: str) -> str:
    """The fix's verb for a forced launcher: where the force came from."""
    if not why_forced.endswith("given to resolve()"):
        return "unset DISTENV_LAUNCHER, or set it to"
    return "drop launcher= from the resolve() call, or give it"


def _platform(env: "Env", r: Reading, source: "Source", forced: "str | None") -> None:
    if forced is not None:
        r.set("platform", forced, "given to resolve()")
        return
    for entry in PLATFORMS:
        for marker in entry.markers:
            if marker in env:
                break
        else:
            continue
        platform = entry.load()
        name = platform_name(platform, env)
        if name is None:
            continue
        r.set("platform", name, f"{marker} present")
        if platform is not source:
            platform.overlay(env, r)
        return


# -- 4. per-node launches ----------------------------------------------------------------
def _nproc_value(raw: str, name: str, env: "Env", fix: "str | None" = None, given: str = ""
                 ) -> "tuple[int, str]":
    """A processes-per-node setting: a number, or torchrun's auto/gpu/cpu. `fix`: the error's
    fix (default: DISTENV_NPROC_PER_NODE's); `given`: where the value came from, for errors."""
    fix = NPROC_FIX if fix is None else fix
    text = raw.strip().lower()
    if text in ("auto", "gpu", "cpu"):
        from .gpus import visible_gpus

        gpus, why = visible_gpus(env)
        if text == "cpu" or (text == "auto" and gpus == 0):
            if text == "gpu":
                raise DistEnvError(f"{name}=gpu{given} but {_no_gpu(why)}. Fix: {fix}")
            count = os.cpu_count() or 1
            return count, f"{name}={raw} ({count} CPU cores)"
        if gpus == 0:
            raise DistEnvError(f"{name}={raw}{given} but {_no_gpu(why)}. Fix: {fix}")
        return gpus, f"{name}={raw} ({why})"
    if not (len(text) <= 12 and text.isascii() and text.isdigit() and 1 <= int(text) < MAX_COUNT):
        raise DistEnvError(f"{name}={show(raw)}{given} is not a number of workers per node. "
                           f"Fix: {fix}")
    return int(text), f"{name}={raw}"


def _nproc_override(value: object, env: "Env") -> "tuple[int, str]":
    """resolve(nproc_per_node=...): a whole number from 1, or what DISTENV_NPROC_PER_NODE
    takes ("4", auto, gpu, cpu), checked as that variable is; anything else (2.5, -3, True,
    "x") is one DistEnvError, never truncated nor ignored."""
    if isinstance(value, str):
        count, why = _nproc_value(value, "nproc_per_node", env, fix=NPROC_ARG_FIX,
                                  given=" (given to resolve())")
        return count, f"{why} (given to resolve())"
    if value.__class__ is int and 1 <= value < MAX_COUNT:
        return value, "given to resolve()"
    raise DistEnvError(f"nproc_per_node={show(repr(value))} (given to resolve()) is not a number of "
                       f"workers per node. Fix: {NPROC_ARG_FIX}")


#: The valid values of DISTENV_NPROC_PER_NODE (and resolve(nproc_per_node=...)).
NPROC_FIX = ("give DISTENV_NPROC_PER_NODE a positive number of workers per node, auto (one per "
             "visible GPU, else one per CPU core), gpu (one per visible GPU) or cpu (one per CPU "
             "core), or unset it.")


#: The valid values of resolve(nproc_per_node=...).
NPROC_ARG_FIX = ("give resolve() nproc_per_node= a whole number from 1, or 'auto' (one per visible "
                 "GPU, else one per CPU core), 'gpu' (one per visible GPU) or 'cpu' (one per CPU "
                 "core), or leave it out.")


def _no_gpu(why: str) -> str:
    """'no GPU is visible (...)' without repeating itself when `why` already says so."""
    return why if why.startswith("no GPU") else f"no GPU is visible ({why})"


def _wanted(env: "Env", override: "int | str | None") -> "tuple[int, str] | tuple[None, None]":
    if override is not None:
        return _nproc_override(override, env)
    raw = NPROC_PER_NODE.raw(env)
    if raw is not None:
        return _nproc_value(raw, NPROC_PER_NODE, env)
    return None, None


def _per_node(env: "Env", r: Reading, source: "Source", override: "int | str | None") -> None:
    want, want_why = _wanted(env, override)
    if r.launch == PER_PROCESS and source.launch.can_be_per_node:
        local, nodes, size = r.get("local_world_size"), r.get("num_nodes"), r.get("world_size")
        if local == 1 and (nodes is None or nodes == size):
            gpus = None
            platform = _platform_source(r)
            if want is None and platform is not None and platform.launch.per_node_platform:
                from .gpus import visible_gpus

                gpus, gpus_why = visible_gpus(env)
            if (want or 0) > 1 or (gpus or 0) > 1:
                # One process per node asked to start several workers: the process is a node,
                # numbered by its rank. The launcher's host list is in that order only where
                # its own node index is the rank (SLURM's block, cyclic and plane: task k on
                # node k); under srun --distribution=arbitrary task 0 may run on node 1
                # (measured: SLURM_PROCID=0 with SLURM_NODEID=1), and its index was dropped.
                r.hosts_by_node = r.get("node_rank") == r.get("rank")
                if nodes is not None or size == 1 or not source.services:
                    r.set("node_rank", r.get("rank"),
                          f"{r.why.get('rank')} (one process per node: the node rank)")
                    r.set("num_nodes", size, f"{r.why.get('world_size')} (one process per node)")
                else:
                    # This node runs one, but the launcher gives no node count: others may run
                    # more (mpiexec -n 3 placed 2 + 1, want 2: this rank would count 3 nodes and
                    # 6 workers). Node index and count stay unknown; discovery's answer proves
                    # one process per host or refuses (distenv.discovery.apply.per_node). A
                    # launcher with no service to ask (LSF's jsrun) keeps the job script's word
                    # (jsrun -r 1): nothing could check it.
                    r.values.pop("node_rank", None)
                    r.why.pop("node_rank", None)
                    r.notes.append(
                        f"one process on this node, but {source.title or source.name} does not say how "
                        "many run on the others (-n 3 may place 2 + 1): node rank and node count stay "
                        "unknown until discovery finds one process per host (distenv run and the "
                        "adapters ask the launcher; distenv show --discover shows its answer)")
                for field in ("rank", "local_rank", "world_size", "local_world_size"):
                    r.values.pop(field, None)
                    r.why.pop(field, None)
                r.launch = PER_NODE
        elif want is not None and local is not None and local != want:
            _contradicts_want(want_why, source, local, r)
    elif r.launch == PER_PROCESS and want is not None and source.name != "none":
        local = r.get("local_world_size")
        if local is not None and local != want:
            # Asked for `want` workers per node, but this launcher already started its workers
            # (or describes this process as one): silently starting a different number is wrong.
            _contradicts_want(want_why, source, local, r)
    if r.launch == PER_PROCESS and want is not None and source.name != "none":
        # Asked for `want` per node, and this node runs as many (or does not say): recorded,
        # so that a world size or node count it contradicts is an error (_check_counts).
        r.default("nproc_per_node", want, str(want_why))
    if r.launch != PER_NODE:
        return

    if r.nproc_from_world:
        _nproc_from_world(r, want, want_why)
        return
    if want is not None:
        nproc, why = want, str(want_why)  # a str whenever want is set
    elif r.nproc_source is not None:
        raw, raw_why = r.nproc_source
        nproc, why = _nproc_value(raw, raw_why.split("=", 1)[0], env)
    elif r.workers_unproven and r.get("num_nodes") != 1:
        r.notes.append(f"the workers per node are unknown: {r.workers_unproven}. Fix: distenv run "
                       "--nproc-per-node N (DISTENV_NPROC_PER_NODE=N), the same N on every node")
        return
    else:
        from .gpus import visible_gpus

        gpus, gpus_why = visible_gpus(env)
        nproc, why = (gpus, f"one worker per visible GPU: {gpus_why}") if gpus else (1, gpus_why + ": one worker")
    nodes, node = r.get("num_nodes"), r.get("node_rank")
    if nproc == 1:
        # The node *is* the worker.
        r.launch = PER_PROCESS
        r.set("rank", node, f"{r.why.get('node_rank')} (one worker per node: rank = node rank)")
        r.set("local_rank", 0, "one worker per node")
        r.set("world_size", nodes, f"{r.why.get('num_nodes')} (one worker per node)")
        r.set("local_world_size", 1, "one worker per node")
        r.set("nproc_per_node", 1, why)
    else:
        r.set("nproc_per_node", nproc, why)
        r.set("local_world_size", nproc, why)
        if nodes is not None:
            r.set("world_size", nodes * nproc, f"num_nodes x nproc_per_node = {nodes} x {nproc}")


def _nproc_from_world(r: Reading, want: "int | None", want_why: "str | None") -> None:
    """A per-node launch that gives the total process count, not the processes per node
    (Lightning's on-prem launch): those come from DISTENV_NPROC_PER_NODE (or the framework,
    later), and num_nodes = world_size / them, which must be a whole number."""
    size = r.get("world_size")
    if want is None:
        r.notes.append(
            f"a per-node launch that gives the total number of processes (world_size={size}) "
            "but not how many run on each node: the Trainer's "
            "devices (Lightning) or DISTENV_NPROC_PER_NODE=<workers per node> give them "
            "(distenv run: --nproc-per-node)")
        return
    if size is None:
        return
    if size % want:
        raise DistEnvError(
            f"{want_why} but the launch's world_size={size} ({r.why.get('world_size')}) is not "
            f"a multiple of it: the nodes cannot each run {want}. Fix: make WORLD_SIZE = nodes x "
            "workers per node, or give the number of workers each node runs.")
    r.set("nproc_per_node", want, str(want_why))
    r.set("local_world_size", want, str(want_why))
    r.set("num_nodes", size // want, f"world_size / nproc_per_node = {size} / {want}")
    if want == 1:  # the node is the worker
        r.launch = PER_PROCESS
        r.set("rank", r.get("node_rank"), f"{r.why.get('node_rank')} (one worker per node: rank = node rank)")
        r.set("local_rank", 0, "one worker per node")


def _contradicts_want(want_why: "str | None", source: "Source", local: int, r: Reading) -> "NoReturn":
    raise DistEnvError(
        f"{want_why} but {source.title} started {local} process(es) on this node "
        f"({r.why.get('local_world_size')}). Fix: make them agree or unset "
        "DISTENV_NPROC_PER_NODE."
    )


def _platform_source(r: Reading) -> "Source | None":
    name = r.values.get("platform")
    if name is None:
        return None
    for entry in PLATFORMS:
        if entry.name == name:
            return entry.load()
    return None


def _kept(r: Reading, overrides: "dict[str, Any]") -> None:
    """Keyword arguments win over the launch's variables, but not over what follows from the
    workers per node (world = nodes x workers, a node of one worker is that worker): a value
    the per-node step changed contradicts the call, an error, never silently replaced."""
    for field, value in overrides.items():
        if field != "nproc_per_node" and r.values.get(field) != value:
            why = r.why.get(field, "a per-node launch: the workers are yet to start")
            if "nproc_per_node" in overrides and why == r.why.get("nproc_per_node"):
                why = f"nproc_per_node={r.values.get('nproc_per_node')}, given to resolve()"
            raise DistEnvError(
                f"{field}={show(repr(value))[1:-1]} (given to resolve()) contradicts {field}="
                f"{r.values.get(field)} ({why}). Fix: drop {field}= from the call, or make it agree.")


# -- 5. what follows for certain ---------------------------------------------------------
def _derive(r: Reading) -> None:
    v = r.values
    size, local, nodes = v.get("world_size"), v.get("local_world_size"), v.get("num_nodes")
    if nodes is None and size is not None and size == local:
        r.set("num_nodes", 1, "world size = local world size: every rank on this node")
        nodes = 1
    if nodes == 2 and local is not None and size == 2 * local:
        r.default("nproc_per_node", local, "two nodes, world = 2 x local world: as many on each")
    elif nodes == 1:
        default = r.default
        default("node_rank", 0, "one node")
        if r.launch == PER_PROCESS:
            default("local_world_size", size, "one node: local world = world")
            default("local_rank", v.get("rank"), "one node: local rank = rank")
        default("nproc_per_node", v.get("local_world_size"), "one node")


def _master(env: "Env", r: Reading, source: "Source", overrides: "dict[str, Any]") -> None:
    v = r.values
    owns = source.owns
    if "master_addr" not in overrides and env.get("MASTER_ADDR") and "MASTER_ADDR" not in owns:
        mine, given = v.get("master_addr"), env["MASTER_ADDR"]
        if mine is not None and mine != given:
            r.notes.append(f"MASTER_ADDR={given} is used instead of {mine} ({r.why['master_addr']})")
        r.set("master_addr", given, Why("MASTER_ADDR (given by the user)", GIVEN))
        r.addr_explicit = True
    explicit = r.addr_explicit or "MASTER_ADDR" in owns or "master_addr" in overrides
    if v.get("num_nodes") == 1 and not explicit:
        # Loopback always works on one node; a host name derived from the launcher may not
        # resolve, and an interface address may be firewalled.
        r.set("master_addr", LOOPBACK, "one node: loopback")

    if "master_port" not in overrides and env.get("MASTER_PORT") and "MASTER_PORT" not in owns:
        r.set("master_port", parse_port(env["MASTER_PORT"], "MASTER_PORT"),
              Why("MASTER_PORT (given by the user)", GIVEN))
    if v.get("master_port") is None:
        if r.port_key:
            r.set("master_port", ports.port_for(r.port_key),
                  Why(f"derived from the job id ({r.port_key}); see distenv.core.ports", DERIVED))
        elif v.get("world_size") == 1 and r.launch == PER_PROCESS:
            r.set("master_port", ports.port_for(f"pid:{os.getpid()}"),
                  "derived from the process id (a single process); see distenv.core.ports")
        else:
            r.set("master_port", ports.TORCH_DEFAULT,
                  Why("torch's default (no job id to derive one from)", DEFAULT))


#: field -> the variable that would give it, for the note on an unknown field.
_UNKNOWN = (("rank", "RANK"), ("world_size", "WORLD_SIZE"), ("local_rank", "LOCAL_RANK"),
            ("local_world_size", "LOCAL_WORLD_SIZE"), ("node_rank", "NODE_RANK"),
            ("num_nodes", "num_nodes"), ("nproc_per_node", "nproc_per_node"),
            ("master_addr", "MASTER_ADDR"))


def _note_unknowns(r: Reading, source: "Source") -> None:
    """Every unknown field carries a note saying what to do (docs/inferences.md): one note that
    lists them all (`unknown_note`)."""
    note = unknown_note(r.values, source.title, r.launch == PER_NODE, reads=source.owns,
                        never=source.launch.unknown_fix)
    if note is not None:
        r.notes.append(note)


def unknown_note(values: "Mapping[str, Any]", title: str, per_node: bool,
                 asked: bool = False, reads: "tuple[str, ...]" = (),
                 never: str = "") -> "Note | None":
    """The note listing every unknown field of `values` and what to do (a source's own note
    may say more of one; its text is not matched), or None. A per-node launch's workers are
    not started yet, so their rank and local rank are unknown by nature. Discovery rebuilds it
    when it fills some of them (`Note.kind` UNKNOWN), or `asked` it and could not. The fix
    names a variable to export only where it would be read: MASTER_ADDR (the resolver takes
    it), or one of `reads` (the launcher's source's `owns`); the others are only checked
    against what the launcher says, so exporting them would change nothing. `never`: the
    launcher's own fix for what it never reveals (`Launch.unknown_fix`), instead of discovery."""
    left = [(f, var) for f, var in _UNKNOWN if values.get(f) is None
            and not (per_node and f in ("rank", "local_rank"))]
    if not left:
        return None
    names = ", ".join(f for f, _ in left)
    exported = [var for f, var in left if var == "MASTER_ADDR" or var in reads]
    # `asked`: discovery ran and could not fill them (its own note says why): no use in
    # suggesting it again
    fix = never or ("" if asked else
                    "call distenv.discover() (it asks the launcher's service or the other ranks)")
    if exported:
        fix += f"{', or ' if fix else ''}export {', '.join(exported)} to every process"
    fix = fix or "give them to every process"
    if [f for f, _ in left] == ["nproc_per_node"]:
        fix = ("nothing, unless your framework needs the same number on every node; then "
               "launch an equal count per node")
        names += " (the nodes may run different numbers of processes)"
    return Note(f"unknown here: {names} ({title} does not reveal {'it' if len(left) == 1 else 'them'}). "
                f"Fix: {fix}", about=tuple(f for f, _ in left), kind=UNKNOWN)


# -- 7. checks ---------------------------------------------------------------------------
def _check_canonical(env: "Env", r: Reading, source: "Source", overrides: "dict[str, Any]") -> None:
    for var, field in CANONICAL:
        if var in source.owns or field in overrides or var not in env:
            continue
        given = get_int(env, var)
        mine = r.get(field)
        if mine is None and (var == "NODE_RANK" or (var == "WORLD_SIZE" and r.launch == PER_PROCESS)) \
                and not RUN.raw(env):  # distenv run exported it: its proof comes with the hand-off
            # The launcher does not give it (a node index under MPICH across nodes or SLURM's
            # arbitrary layout, the size under Hydra's -pmi-port): the user's, like MASTER_ADDR;
            # the counts bound it, discovery refuses one its answer contradicts.
            rank = r.get("rank")
            if var == "NODE_RANK" and rank is not None and given is not None and given > rank:
                # nodes are numbered by their lowest rank: node k holds no rank below k
                raise DistEnvError(
                    f"NODE_RANK={env[var]} (given by the user) is above rank={rank} "
                    f"({r.why.get('rank')}): node k's lowest rank is at least k. A stale NODE_RANK "
                    "from the shell? Fix: unset NODE_RANK, or set it to this node's index.")
            r.set(field, given, Why(f"{var} (given by the user)", GIVEN))
        elif mine is not None and given != mine:
            raise DistEnvError(
                f"{var}={env[var]} contradicts {r.why.get(field, field)} ({field}={mine}). "
                f"A stale {var} from the shell, the job script or an outer launcher or platform? "
                f"Fix: unset {var}{_env_instead(env, source)}."
            )


def _env_instead(env: "Env", source: "Source") -> str:
    """The second way out of a contradiction, offered only where it leads somewhere: the
    torch variables alone describe a launch (they may lack RANK, or contradict each other,
    as NODE_RANK and torchrun's GROUP_RANK do under a platform that sets NODE_RANK)."""
    if source.name == "env":
        return ""
    try:
        resolve(env, launcher="env")
    except DistEnvError:
        return ""
    return ", or set DISTENV_LAUNCHER=env to trust the torch variables instead"
