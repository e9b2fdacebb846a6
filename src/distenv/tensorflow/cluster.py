"""TF_CONFIG for this process, built from the core's placement (`distenv.core.placement`).

No launcher variable is read here: the hosts come from `DistEnv.rank_hosts` (or, when asked,
a host file or discovery), the chief rule and the CLUSTER_SPEC mapping from the sources'
own functions, the ports from `distenv.knobs`.
"""

from __future__ import annotations

import os

from .. import knobs
from ..core import placement
from ..core.description import PER_NODE, UNKNOWN, DistEnv, kind_of
from ..errors import DistEnvError, split_fix
from ..core.resolver import resolved
from ..sources import family, source_of, tfconfig

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

LOOPBACK = "127.0.0.1"
CHIEFS = ("chief", "master")


def _environ(environ: "Mapping[str, str] | None") -> "Mapping[str, str]":
    return os.environ if environ is None else environ


def tf_config(env: "DistEnv | Mapping[str, str] | None" = None, *,
              environ: "Mapping[str, str] | None" = None, hostfile: "str | None" = None,
              gather: "bool | str | None" = None, base_port: "int | None" = None) -> "dict[str, Any]":
    """A valid TF_CONFIG dict for this process (``{"cluster": ..., "task": ...}``).

    `env`: a `DistEnv`, or a mapping to resolve (default: ``os.environ``). Keywords (each
    also read from the environment when not given):

    * `hostfile` (DISTENV_HOSTFILE): host names across MPI nodes, one per line (``host``,
      ``host:N``, ``host slots=N``, or a host repeated once per rank as in PBS_NODEFILE);
      ranks fill hosts in blocks, in file order, as mpirun maps them by default.
    * `gather` (DISTENV_GATHER=mpi4py): learn every rank's host name by an MPI allgather
      (`distenv.discover`).
    * `base_port` (DISTENV_TF_PORT): the first port; worker k on a host listens on
      ``base_port + k``. Default: derived from the job, so concurrent jobs differ.

    Raises `DistEnvError` naming what is missing when the hosts cannot be known.
    """
    d, src = resolved(env, environ)
    raw = src.get("TF_CONFIG")  # TensorFlow's own variable: validated, passed through
    if raw:
        return _passthrough(raw, d)
    source = source_of(d.launcher)
    if source.frameworks.tf_cluster:  # the platform describes the cluster itself
        config = source.frameworks.tf_config(src) if source.frameworks.tf_config else None
        if config is None:
            raise DistEnvError(f"{source.frameworks.tf_cluster} has no TensorFlow-style 'cluster' mapping of "
                               "lists. Fix: give it {\"cluster\": {\"worker\": [\"host:port\", "
                               "...]}}, or set TF_CONFIG yourself.")
        return config
    hosts = _worker_hosts(d, src, hostfile, gather)
    return _assemble(d, src, hosts, base_port)


def hosts_needed(d: DistEnv, src: "Mapping[str, str]", hostfile: "str | None" = None,
                 gather: "bool | str | None" = None) -> "tuple[str, ...]":
    """What `tf_config` would lack that the launcher's own service can give: every rank's host
    (("rank_hosts",)) in a launch across nodes (or of an unknown node count) whose variables do
    not place its ranks, where no TF_CONFIG, platform cluster, host file or gathering gives
    them; else (). A per-node launch's workers are its nodes: placed by the launch, or not."""
    if not d.is_distributed or d.launch == PER_NODE or d.rank_hosts is not None or d.num_nodes == 1 \
            or src.get("TF_CONFIG") or hostfile or knobs.hostfile(src) \
            or (gather if gather is not None else knobs.gather(src)):
        return ()
    return () if source_of(d.launcher).frameworks.tf_cluster else ("rank_hosts",)  # last: loads the source


def _passthrough(raw: str, d: DistEnv) -> "dict[str, Any]":
    config = tfconfig.parse(raw)
    if family(d.launcher) != "tensorflow":  # TF_CONFIG is not the launch: check it agrees
        members = tfconfig.workers(config)
        task = config["task"]
        kind, index = task["type"], task.get("index", 0)
        rank = tfconfig.task_rank(config)
        if d.world_size is not None and d.launch != PER_NODE and len(members) != d.world_size:
            raise DistEnvError(
                f"TF_CONFIG lists {len(members)} training worker(s) but {d.launcher} started "
                f"world_size={d.world_size} ({d.provenance.get('world_size')}): a stale TF_CONFIG? "
                "Fix: unset TF_CONFIG and let distenv build it."
            )
        if rank is not None and d.rank is not None and d.launch != PER_NODE and rank != d.rank:
            raise DistEnvError(
                f"TF_CONFIG task {kind}[{index}] is rank {rank} but {d.launcher} says rank={d.rank} "
                f"({d.provenance.get('rank')}). Fix: unset TF_CONFIG and let distenv build it."
            )
    return config


def _worker_hosts(d: DistEnv, src: "Mapping[str, str]", hostfile: "str | None",
                  gather: "bool | str | None") -> "list[str]":
    """The host of every worker, indexed by rank (node rank for a per-node launch)."""
    if d.launch == PER_NODE:
        # One process per node: for TensorFlow the node's process *is* the worker (it
        # uses every local GPU through MirroredStrategy inside MultiWorkerMirroredStrategy).
        if d.num_nodes == 1:
            return [LOOPBACK]
        # Node k's host is where its workers run (rank_hosts), not the k-th entry of the
        # launcher's node list: that list is in the launcher's order, which need not be the
        # node-rank order (srun --distribution=arbitrary).
        per, placed = d.nproc_per_node, d.rank_hosts
        if placed and per and d.num_nodes and len(placed) == per * d.num_nodes:
            return list(placed[::per])
        raise DistEnvError(_missing(d, "the host of every node"))
    size, rank = d.world_size, d.rank
    if size is None or rank is None:
        raise DistEnvError(
            f"cannot build TF_CONFIG: {d.launcher} does not reveal "
            f"{'the world size' if size is None else 'the rank'} "
            f"({d.provenance.get('world_size' if size is None else 'rank')}). "
            "Fix: launch so that it does (e.g. MPICH without -pmi-port), or set TF_CONFIG."
        )
    if size == 1 or d.num_nodes == 1:
        return [LOOPBACK] * size  # one node: loopback always works (as the master address)
    hostfile = hostfile or knobs.hostfile(src)
    if gather is None:
        gather = knobs.gather(src)
    if hostfile:
        return placement.read_hostfile(d, hostfile)
    if gather:
        if gather is not True:  # gather= is checked as the variable is, by the knob's parser
            knobs.GATHER.parse(str(gather), "gather")
        from ..discovery import discover

        gathered = discover(d, method="mpi4py").rank_hosts
        assert gathered is not None  # the allgather gives every rank's host, or raises
        return list(gathered)
    if d.rank_hosts is not None:
        return list(d.rank_hosts)
    why = d.provenance.get("rank_hosts")
    if why is not None and kind_of(why) == UNKNOWN:  # the launch's own rule failed: say why
        reason, fix = split_fix(why.split(": ", 1)[1])  # the source's own fix, if it gave one
        raise DistEnvError(f"cannot build TF_CONFIG: {reason} Fix: {fix or _how(d) + '.'}")
    raise DistEnvError(_missing(d, "which host runs each rank"))


def _missing(d: DistEnv, what: str) -> str:
    return (f"cannot build TF_CONFIG: {d.launcher} runs {d.world_size or '?'} worker(s) on "
            f"{d.num_nodes or 'several'} node(s) but does not reveal {what}. Fix: {_how(d)}.")


def _how(d: DistEnv) -> str:
    """What to do when the launch does not give every rank's host."""
    how = ("pass hostfile=... or set DISTENV_HOSTFILE to a file of host names (host:N per "
           "line, in mpirun's order), or gather=True / DISTENV_GATHER=mpi4py (needs mpi4py) "
           "to ask the other ranks, or set TF_CONFIG yourself")
    source = source_of(d.launcher)
    note = source.passing.note(knobs.HOSTFILE, source.title)
    if source.launch.node_order:  # no host list can place its nodes
        how = f"{source.launch.node_order}: set TF_CONFIG yourself, or launch with mpirun/srun"
    elif note:
        how += f" ({note})"
    return how


def _assemble(d: DistEnv, src: "Mapping[str, str]", hosts: "Sequence[str]", base_port: "int | None"
              ) -> "dict[str, Any]":
    seen: "dict[str, int]" = {}
    slot: "list[int]" = []
    for host in hosts:
        slot.append(seen.get(host, 0))
        seen[host] = slot[-1] + 1
    base = knobs.side_port(d, "tf", src, knobs.TF_PORT, base_port, width=max(seen.values()))
    workers = [knobs.address(h, base + k) for h, k in zip(hosts, slot)]
    index = d.process_index
    if index is None:
        raise DistEnvError(_missing(d, "this process's node index"))
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def training_workers(config: "dict[str, Any]") -> "list[str]":
    """host:port of every training worker (chief first, then workers)."""
    return tfconfig.workers(config)


def task_index(config: "dict[str, Any]") -> "int | None":
    """This task's index among the training workers (chief first), None for ps/evaluator."""
    return tfconfig.task_rank(config)
