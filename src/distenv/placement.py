"""Placement: which host runs each global rank, where the launch proves it, else unknown.

One model for every adapter. `DistEnv.rank_hosts` is the host of every global rank (a tuple
indexed by rank) or None; the resolver fills it from the launcher's own lists and rules:

===================  ======================================================================
launch               rule (proof)
===================  ======================================================================
SLURM (srun)         node list + tasks per node placed by SLURM_DISTRIBUTION: block fills
                     nodes in list order, cyclic deals one task per node round-robin, plane=N
                     deals N at a time (srun(1) --distribution, SLURM's task layout code);
                     arbitrary or unknown distributions: unknown. A layout that puts this
                     rank on another node than SLURM_NODEID says: unknown (the variables
                     contradict the assumed rule). Heterogeneous jobs and steps, and a
                     job-level node list that is not the step's: unknown (the SLURM
                     source's `layout_doubt`, measured on two nodes; docs/inferences.md).
TF_CONFIG            the cluster's host:port list, chief first then workers (the rank rule
                     of `distenv.sources.tfconfig`).
CLUSTER_SPEC,        per-node launches: the host list in node order, each host repeated
SageMaker (per-node) nproc_per_node times (the node's workers are numbered
                     node_rank * nproc_per_node + local_rank when they are started).
SageMaker + mpirun   SM_HOSTS in order, processes_per_host each (SageMaker runs mpirun with
                     ``-H algo-1:N,algo-2:N,...``: block placement).
Azure ML + MPI/env   AZ_BATCH_HOST_LIST in order, the same count on each (Azure starts the
                     same number of processes per node in rank order), only when the list's
                     first host is the master node Azure names (else its order is unproven).
host file            `hostfile_rank_hosts` / `read_hostfile`: DISTENV_HOSTFILE, filled in
                     blocks in file order as mpirun maps by slot by default. Reading a file
                     is I/O, so resolve() never does it: adapters call `read_hostfile`
                     explicitly (`distenv.tensorflow` does when DISTENV_HOSTFILE is set).
discovery            `distenv.discovery.discover()`: an allgather of host names.
===================  ======================================================================

Everything else (Open MPI, MPICH, torchrun across nodes, ...) is unknown: those launchers do
not reveal where the other ranks run.

The per-rank tuple can hold thousands of entries, so the resolver records a `Later` (the few
strings the rule needs) and `DistEnv.rank_hosts` builds the tuple on first access: resolve()
stays as cheap as before. Standard library only; no I/O at import.
"""

from __future__ import annotations

from .description import Later
from .errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .description import DistEnv
    from .reading import Env

# -- SLURM ---------------------------------------------------------------------------------
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
COUNT_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_BLOCK = ("block", "", "(null)", "unknown")


def slurm_distribution(raw: "str | None") -> str:
    """The node-level part of SLURM_DISTRIBUTION ("cyclic:block" -> "cyclic", "block,pack"
    -> "block", "*" -> "block"): the SLURM source's rule, one copy."""
    from .sources.slurm import distribution

    return distribution(raw)


def slurm_task_nodes(counts: "Sequence[int]", dist: str = "block", plane: "str | int | None" = None
                     ) -> "list[int]":
    """The node index of every task, in rank order, for SLURM's task distribution."""
    total = sum(counts)
    if dist in _BLOCK:
        return [n for n, c in enumerate(counts) for _ in range(c)]
    if dist.startswith("plane"):
        size = plane if plane is not None else (dist.split("=", 1)[1] if "=" in dist else None)
        try:
            step = int(size)  # type: ignore[arg-type]  # None is the TypeError below
        except (TypeError, ValueError):
            raise DistEnvError("SLURM_DISTRIBUTION=plane without SLURM_DIST_PLANESIZE.") from None
        if step < 1:
            raise DistEnvError(f"SLURM_DIST_PLANESIZE={size} is not a positive plane size.")
    elif dist.startswith("cyclic"):
        step = 1
    else:
        raise DistEnvError(
            f"SLURM_DISTRIBUTION={dist}: the host of each task cannot be derived. Fix: set "
            "TF_CONFIG or DISTENV_HOSTFILE, or use block or cyclic distribution."
        )
    left = list(counts)
    out: "list[int]" = []
    while len(out) < total:
        for n in range(len(left)):
            take = min(step, left[n])
            out.extend([n] * take)
            left[n] -= take
    return out


def slurm_rank_hosts(env: "Env", world_size: "int | None" = None, rank: "int | None" = None,
                     node_rank: "int | None" = None) -> "list[str]":
    """The host of every SLURM task, in rank order, from the step's variables in `env`.

    Raises `DistEnvError` saying what is missing or contradictory."""
    from .hostlist import expand_hostlist, expand_tasks_per_node

    for var in NODELIST_VARS:
        if env.get(var):
            hosts = expand_hostlist(env[var], var)
            break
    else:
        raise DistEnvError("SLURM does not reveal its node list (no SLURM_STEP_NODELIST).")
    for cvar in COUNT_VARS:
        if env.get(cvar):
            counts = expand_tasks_per_node(env[cvar], cvar)
            break
    else:
        raise DistEnvError("SLURM does not reveal its tasks per node (no SLURM_STEP_TASKS_PER_NODE).")
    if len(counts) != len(hosts):
        raise DistEnvError(f"{var} lists {len(hosts)} node(s) but {cvar} {len(counts)}.")
    # The SLURM source's proof conditions (sources/slurm.py): a job-level list names the
    # step's nodes only when it has as many; arbitrary and heterogeneous layouts are unknown.
    from .sources.slurm import layout_doubt

    step_nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES")
    if var != "SLURM_STEP_NODELIST" and str(len(hosts)) != (step_nodes or "").strip():
        raise DistEnvError(f"no SLURM_STEP_NODELIST, and {var} is not the step's node list.")
    nodeid = env.get("SLURM_NODEID") or ""
    gtids = env.get("SLURM_GTIDS")
    doubt = layout_doubt(env, hosts, int(nodeid) if nodeid.isdigit() else None, counts,
                         gtids.split(",") if gtids else None)
    if doubt is not None:
        raise DistEnvError(doubt[0] + ".")
    dist = slurm_distribution(env.get("SLURM_DISTRIBUTION"))
    order = slurm_task_nodes(counts, dist, env.get("SLURM_DIST_PLANESIZE"))
    if world_size is not None and len(order) != world_size:
        raise DistEnvError(f"{cvar} adds up to {len(order)} tasks but world_size={world_size}.")
    if node_rank is not None and rank is not None and rank < len(order) and order[rank] != node_rank:
        raise DistEnvError(
            f"SLURM_DISTRIBUTION={dist} places rank {rank} on node {order[rank]} but "
            f"SLURM_NODEID={node_rank}: an unusual distribution. Fix: set TF_CONFIG or "
            "DISTENV_HOSTFILE."
        )
    return [hosts[n] for n in order]


#: Platforms that start one process per node (even when it then is the node's only worker).
PER_NODE_PLATFORMS = ("gcp", "vertex", "sagemaker")

_SLURM_VARS = NODELIST_VARS + COUNT_VARS + (
    "SLURM_DISTRIBUTION", "SLURM_DIST_PLANESIZE", "SLURMD_NODENAME", "SLURM_NODEID", "SLURM_GTIDS",
    "SLURM_HET_SIZE", "SLURM_PACK_SIZE", "SLURM_STEP_NUM_NODES", "SLURM_NNODES")


# -- host files (DISTENV_HOSTFILE) ----------------------------------------------------------
def parse_hostfile(text: str, name: str = "host file") -> "tuple[list[str], list[int | None]]":
    """Hosts in file order with their slot counts (None where the file gives none)."""
    hosts: "list[str]" = []
    counts: "list[int | None]" = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        host, count = words[0], None
        if ":" in host and host.rsplit(":", 1)[1].isdigit():
            host, n = host.rsplit(":", 1)
            count = int(n)
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots", "cpu", "cpus") and value.isdigit():
                if key != "max_slots":
                    count = int(value)
            else:
                raise DistEnvError(f"{name} line {lineno}: {line!r} is not 'host', 'host:N' "
                                   "or 'host slots=N'.")
        if count == 0:
            raise DistEnvError(f"{name} line {lineno}: {line!r} gives no slot.")
        if host in hosts:  # PBS_NODEFILE style: one line per slot
            i = hosts.index(host)
            counts[i] = (counts[i] or 1) + (count or 1)
        else:
            hosts.append(host)
            counts.append(count)
    if not hosts:
        raise DistEnvError(f"{name} lists no host.")
    return hosts, counts


def block(hosts: "Sequence[str]", counts: "Sequence[int]", size: "int | None", why: str) -> "list[str]":
    """Ranks fill `hosts` in order, counts[i] on hosts[i] (mpirun's default by-slot map)."""
    if sum(counts) != size:
        raise DistEnvError(f"{why} holds {sum(counts)} slot(s) but the launch has world_size={size}.")
    out: "list[str]" = []
    for host, count in zip(hosts, counts):
        out.extend([host] * count)
    return out


def hostfile_rank_hosts(text: str, world_size: "int | None", per_node: "int | None" = None,
                        name: str = "host file") -> "list[str]":
    """The host of every rank from a host file's text: blocks in file order. Lines without
    a slot count take `per_node` each (the launch's processes per node)."""
    hosts, counts = parse_hostfile(text, name)
    if all(c is None for c in counts):
        if len(hosts) * (per_node or 0) != world_size:
            raise DistEnvError(
                f"{name} lists {len(hosts)} host(s) without slot counts and the launch "
                f"has world_size={world_size}: give 'host:N' lines."
            )
        counts = [per_node] * len(hosts)
    filled = [1 if c is None else c for c in counts]
    return block(hosts, filled, world_size, name)


def read_hostfile(env: "DistEnv", path: str) -> "list[str]":
    """I/O, called explicitly by adapters: the host of every rank of `env` (a DistEnv) from
    the host file at `path` (DISTENV_HOSTFILE)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise DistEnvError(f"DISTENV_HOSTFILE={path!r} cannot be read ({exc.strerror}).") from None
    return hostfile_rank_hosts(text, env.world_size, env.nproc_per_node or env.local_world_size,
                               f"host file {path}")


def with_rank_hosts(env: "DistEnv", rank_hosts: "Sequence[str]", why: str) -> "DistEnv":
    """`env` (a DistEnv) with `rank_hosts` filled (what discovery or a host file found).
    A host list that contradicts the one the launcher revealed is an error."""
    known = env.rank_hosts
    given = tuple(rank_hosts)
    if env.world_size is not None and len(given) != env.world_size:
        raise DistEnvError(f"{why} gives {len(given)} host(s) but world_size={env.world_size} "
                           f"({env.provenance.get('world_size')}).")
    if known is not None and known != given:
        raise DistEnvError(f"{why} contradicts {env.provenance.get('rank_hosts')}: "
                           f"{_short(given)} vs {_short(known)}.")
    if known is not None:
        return env
    from .description import DistEnv, FIELDS

    values = {f: getattr(env, f) for f in FIELDS}
    values["rank_hosts"] = given
    why_map = dict(env.provenance)
    why_map["rank_hosts"] = why
    return DistEnv(values, why_map, env.notes)


def _short(hosts: "Sequence[str]") -> str:
    return ",".join(hosts[:4]) + (f",... ({len(hosts)})" if len(hosts) > 4 else "")


def display_node_rank(env: "DistEnv") -> int:
    """A node number for display only, where a framework insists on one and the launch does
    not reveal it: ``rank // local_world_size``, which is the node index under block placement
    with the same count on every node (Open MPI's default by-slot map, SLURM's block) and may
    be wrong under others. Never a `DistEnv` field (those are proven or None); 0 when even
    that is unknown (Lightning's own default without NODE_RANK)."""
    if env.node_rank is not None:
        return env.node_rank
    if env.rank is not None and env.local_world_size:
        return env.rank // env.local_world_size
    return 0


# -- TensorFlow cluster descriptions (one copy: the sources' rules) -----------------------
def tf_task_rank(config: "dict[str, Any]") -> "int | None":
    """A parsed TF_CONFIG task's global rank (chief first, then workers), None for a
    parameter server or evaluator."""
    from .sources.tfconfig import task_rank

    return task_rank(config)


def tf_workers(config: "dict[str, Any]") -> "list[str]":
    """host:port of every training worker of a parsed TF_CONFIG, in rank order."""
    from .sources.tfconfig import workers

    return workers(config)


def parse_tf_config(raw: str, name: str = "TF_CONFIG") -> "dict[str, Any]":
    """A TF_CONFIG string parsed and checked (`DistEnvError` when malformed)."""
    from .sources.tfconfig import parse

    return parse(raw, name)


def cluster_spec_tf_config(env: "Env") -> "dict[str, Any] | None":
    """The TF_CONFIG equivalent of a Google Cloud CLUSTER_SPEC in `env`, or None."""
    from .sources.gcp import tf_config

    return tf_config(env)


# -- what the resolver records -------------------------------------------------------------
def record(env: "Env", values: "dict[str, Any]", why: "dict[str, str]", launch_per_node: bool) -> None:
    """Set values["rank_hosts"] (a `Later`, or None) and its why, from the launch read so far.

    Cheap: captures the few strings a rule needs; the tuple is built on first access."""
    launcher, size = values.get("launcher"), values.get("world_size")
    if values.get("rank_hosts") is not None or size is None:
        return
    hosts, per = values.get("hosts"), values.get("nproc_per_node")
    if launcher == "slurm" and not launch_per_node:
        captured = {k: env.get(k) for k in _SLURM_VARS}
        dist = slurm_distribution(captured["SLURM_DISTRIBUTION"])
        args = (captured, size, values.get("rank"), values.get("node_rank"))
        values["rank_hosts"] = Later(_slurm_later, args)
        why["rank_hosts"] = f"SLURM node list and tasks per node, placed by distribution {dist}"
        return
    if launcher == "tf_config" and why.get("hosts", "").startswith("TF_CONFIG"):
        values["rank_hosts"] = Later(_tf_later, (env.get("TF_CONFIG"),))
        why["rank_hosts"] = "TF_CONFIG cluster: chief first, then workers"
        return
    if hosts is None or per is None or len(hosts) * per != size:
        return
    platform = values.get("platform")
    if launch_per_node or launcher in PER_NODE_PLATFORMS:
        # The node's workers are yet to be started: node k's are ranks k*nproc .. k*nproc+nproc-1.
        values["rank_hosts"] = Later(_repeat, (tuple(hosts), per))
        why["rank_hosts"] = (f"{why.get('hosts')} in node order, nproc_per_node={per} each "
                             "(workers are numbered node_rank * nproc_per_node + local_rank)")
    elif platform == "sagemaker" and launcher == "openmpi" and why.get("hosts") == "SM_HOSTS":
        values["rank_hosts"] = Later(_repeat, (tuple(hosts), per))
        why["rank_hosts"] = f"SM_HOSTS in order, {per} each (SageMaker's mpirun -H host:N,...)"
    elif platform == "azureml" and launcher in ("openmpi", "env") \
            and why.get("hosts") == "AZ_BATCH_HOST_LIST" and values.get("master_addr") == hosts[0]:
        values["rank_hosts"] = Later(_repeat, (tuple(hosts), per))
        why["rank_hosts"] = (f"AZ_BATCH_HOST_LIST in order, {per} each (Azure ML starts the same "
                             "count per node in rank order; its first host is the master node)")


def _repeat(hosts: "Sequence[str]", per: int) -> "tuple[tuple[str, ...], None]":
    return tuple(h for h in hosts for _ in range(per)), None


def _slurm_later(captured: "Env", size: int, rank: "int | None", node: "int | None"
                 ) -> "tuple[tuple[str, ...] | None, str | None]":
    try:
        return tuple(slurm_rank_hosts(captured, size, rank, node)), None
    except DistEnvError as exc:
        return None, f"unknown: {exc}"


def _tf_later(raw: str) -> "tuple[tuple[str, ...], None]":
    from .sources.tfconfig import parse, workers

    return tuple(m.rsplit(":", 1)[0] for m in workers(parse(raw))), None
