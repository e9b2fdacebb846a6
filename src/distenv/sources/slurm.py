"""SLURM tasks started by `srun`.

Only `srun` makes tasks. The batch script looks like task 0 of N (SLURM_PROCID=0,
SLURM_NTASKS=N) but has no step id; an `salloc` shell has only job-level variables.
Both are single processes and are left to the `single` source, which says so.

What is read directly: rank (SLURM_PROCID), world size (SLURM_STEP_NUM_TASKS), local rank
(SLURM_LOCALID), node count (SLURM_STEP_NUM_NODES), the node list (SLURM_STEP_NODELIST),
tasks per node (SLURM_STEP_TASKS_PER_NODE), the ranks on this node (SLURM_GTIDS), job and
step id. What is inferred, and why (docs/inferences.md has the whole table):

====================  ==================================================================
field                 rule and its proof
====================  ==================================================================
node_rank             SLURM_NODEID, the index of this node in the step's node list. It
                      is also the node's place by lowest rank for block, cyclic and
                      plane distributions: each deals task 0 to node 0 and fills the
                      nodes in list order (srun(1) --distribution; measured on two
                      nodes: block, cyclic, plane=2, -w node2,node1, -r 1,
                      block:cyclic, cyclic:cyclic:block,nopack, block,pack).
                      Unknown under ``arbitrary`` (tasks follow SLURM_HOSTFILE / -w
                      order; measured: task 0 on node2 with SLURM_NODEID=1) and in
                      heterogeneous steps (below).
local_world_size      SLURM_GTIDS (ranks on this node), else the count at SLURM_NODEID
                      in SLURM_STEP_TASKS_PER_NODE (same order as the node list).
nproc_per_node        SLURM_STEP_TASKS_PER_NODE when every node has the same count.
master_addr           the first host of SLURM_STEP_NODELIST: node 0 runs task 0 for
                      block, cyclic and plane (as above). Unknown under ``arbitrary``
                      and in heterogeneous steps.
hosts                 SLURM_STEP_NODELIST; the job-level SLURM_NODELIST only when it has
                      as many hosts as the step (a step's nodes are a subset of the
                      job's, in the same node-table order; measured: an ``srun -r1 -N1``
                      task sees the job's two hosts in SLURM_NODELIST).
master_port           derived from SLURM_JOB_ID and the step id (the same in every task
                      of the step, het components included: measured).
====================  ==================================================================

Heterogeneous steps (``srun A : B``, and jobs with SLURM_HET_SIZE): SLURM_NODEID numbers
the nodes component by component while SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE
are in node-table order (measured, SLURM 22.05: ``srun -w node2 : -w node1`` gives task 0
SLURM_NODEID=0 on node2 with SLURM_STEP_NODELIST=node[1-2]). A het *job* says so in
SLURM_HET_SIZE on every task; a het step inside an ordinary job sets no variable at all,
so a task recognises it only where its own node contradicts the list (SLURMD_NODENAME is
not the host at SLURM_NODEID, or SLURM_GTIDS has another count than the list gives it).
On two nodes every task sees that (measured); with three or more nodes, tasks on a node
whose place happens to agree cannot tell, so do not run distributed training as an
``srun A : B`` step without MASTER_ADDR.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS, Note, unknown
from ..errors import DistEnvError
from ..core.reading import parse_int
from . import Doctor, Frameworks, Launch, PassOn, Services, Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env, Reading

# Step ids of steps that are not srun tasks (batch, extern, interactive, pending...).
NOT_TASK_STEPS = {"batch", "extern", "interactive", "pending",
                  "4294967290", "4294967291", "4294967292", "4294967293",
                  "4294967294", "4294967295"}


# (field, variables in order of preference, minimum value)
_INTS = (("rank", ("SLURM_PROCID",), 0),
         ("world_size", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 1),
         ("local_rank", ("SLURM_LOCALID",), 0),
         ("node_rank", ("SLURM_NODEID",), 0),
         ("num_nodes", ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"), 1))


# Expanded host lists and task counts by their text: a process resolves its launch again and
# again (every adapter asks), and the expansion is a pure function of the text. Bounded, so
# a fuzzer cannot grow it; what is cached is immutable (tuples).
_MEMO: "dict[tuple[Any, ...], Any]" = {}


def _remember(key: "tuple[Any, ...]", value: Any) -> Any:
    if len(_MEMO) < 32:
        _MEMO[key] = value
    return value


def step_id(env: "Env") -> "str | None":
    return env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))


def distribution(raw: "str | None") -> str:
    """The node-level part of SLURM_DISTRIBUTION: "cyclic:block" -> "cyclic",
    "block,pack" -> "block", "plane" -> "plane"; unset, "*" or "(null)" -> "block"
    (srun's default; srun itself writes "*:cyclic" as "block:cyclic", measured)."""
    text = (raw or "").split(":", 1)[0].split(",", 1)[0].strip().lower()
    return "block" if text in ("", "*", "(null)", "unknown") else text


HET_VARS = ("SLURM_HET_SIZE", "SLURM_PACK_SIZE")


def layout_doubt(env: "Env", hosts: "Sequence[str] | None", node: "int | None",
                 counts: "Sequence[int] | None", gtids: "list[str] | None",
                 rank: "int | None" = None) -> "tuple[str, bool] | None":
    """Why SLURM_NODEID and the step's node list do not prove where task 0 runs and the
    node order by lowest rank: (reason, counts_usable), or None when they do.

    counts_usable: SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID] is still this node's count
    (true under ``arbitrary``, where SLURM_NODEID indexes the node list; not in het steps).
    """
    dist = env.get("SLURM_DISTRIBUTION")
    if dist and distribution(dist) == "arbitrary":
        return (f"SLURM_DISTRIBUTION={dist}: tasks follow SLURM_HOSTFILE or the -w order, "
                "not the node list, so task 0's host and the node order are unknown", True)
    for var in HET_VARS:
        if env.get(var):
            return (f"{var}={env[var]}: a heterogeneous job, whose SLURM_NODEID counts nodes "
                    "per component while the node list is sorted", False)
    if node is None:
        return None
    name = env.get("SLURMD_NODENAME")
    if hosts and name and node < len(hosts) and hosts[node] != name:
        return (f"SLURMD_NODENAME={name} is not host {node} ({hosts[node]}) of the node list "
                f"(SLURM_NODEID={node}): a heterogeneous step (srun ... : ...)", False)
    if counts and gtids is not None and node < len(counts) and counts[node] != len(gtids):
        return (f"SLURM_GTIDS lists {len(gtids)} task(s) on this node but the tasks per node "
                f"give node {node} {counts[node]}: a heterogeneous step (srun ... : ...)", False)
    if rank is not None and counts and node < len(counts):  # past the list: _per_node's error
        # The distribution must place this task on its own node: task 0 on node 0 (the master
        # rule) is that rule's consequence, so a task it places elsewhere disproves it -- a
        # heterogeneous step's component (srun -w n3 : -w n1,n2) or a distribution unknown here.
        name = distribution(dist)
        placed = _node_of(rank, counts, name, env.get("SLURM_DIST_PLANESIZE"))
        if placed is None:
            return (f"SLURM_DISTRIBUTION={name} and the tasks per node do not place task {rank}: "
                    "the node of each task cannot be derived", False)
        if placed != node:
            return (f"SLURM_DISTRIBUTION={name} places task {rank} on node {placed} but "
                    f"SLURM_NODEID={node}: a heterogeneous step (srun ... : ...) or a distribution "
                    "that does not follow the node list", False)
    return None


def _node_of(rank: int, counts: "Sequence[int]", dist: str, plane: "str | None") -> "int | None":
    """The node `dist` deals task `rank` to (`task_nodes`, kept per counts: resolve() runs
    this on every call), or None (past the tasks, or no such rule)."""
    try:
        order = _MEMO.get(("order", tuple(counts), dist, plane))
        if order is None:
            order = _remember(("order", tuple(counts), dist, plane), tuple(task_nodes(counts, dist, plane)))
    except DistEnvError:
        return None
    return order[rank] if rank < len(order) else None


def heterogeneous(env: "Env") -> "str | None":
    """Why this task is in a heterogeneous step or job (`layout_doubt`'s signs), or None."""
    from ..core.hostlist import expand_hostlist, expand_tasks_per_node

    try:
        hosts = expand_hostlist(env["SLURM_STEP_NODELIST"], "SLURM_STEP_NODELIST") \
            if env.get("SLURM_STEP_NODELIST") else None
        counts = expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"], "SLURM_STEP_TASKS_PER_NODE") \
            if env.get("SLURM_STEP_TASKS_PER_NODE") else None
    except DistEnvError:
        return None
    nodeid = (env.get("SLURM_NODEID") or "").strip()
    gtids = env.get("SLURM_GTIDS")
    doubt = layout_doubt({k: env[k] for k in (*HET_VARS, "SLURMD_NODENAME") if k in env},
                         hosts, int(nodeid) if nodeid.isdigit() else None, counts,
                         gtids.split(",") if gtids else None)
    return doubt[0] if doubt is not None and not doubt[1] else None


#: The fix when the SLURM variables contradict each other (copied from another job or step).
MIXED_FIX = ("Fix: run the script through srun in this allocation, and do not copy SLURM_* "
             "variables from another job or step into its environment.")
#: The fix when a step's variables do not give every task's host (outside a step, or partial).
PLACE_FIX = ("Fix: run the script through srun (a job step gives its node list), or give every "
             "rank's host in DISTENV_HOSTFILE (or set TF_CONFIG).")
#: The fix when the layout is one SLURM's variables cannot place (arbitrary, heterogeneous).
DOUBT_FIX = ("Fix: launch with srun --mpi=pmix or --mpi=cray_shasta (distenv then asks SLURM's "
             "PMIx server or reads the apinfo file: where every task runs; --mpi=pmi2 too unless "
             "the step is heterogeneous), or give every rank's host in DISTENV_HOSTFILE.")


# -- which host runs each task (the resolver's rank_hosts; distenv.core.placement) ----------------
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
COUNT_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_BLOCK = ("block", "", "(null)", "unknown")


def task_nodes(counts: "Sequence[int]", dist: str = "block", plane: "str | int | None" = None
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
            raise DistEnvError("SLURM_DISTRIBUTION=plane without SLURM_DIST_PLANESIZE. "
                               + MIXED_FIX) from None
        if step < 1:
            raise DistEnvError(f"SLURM_DIST_PLANESIZE={size} is not a positive plane size. "
                               + MIXED_FIX)
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


def rank_hosts(env: "Env", world_size: "int | None" = None, rank: "int | None" = None,
                     node_rank: "int | None" = None) -> "list[str]":
    """The host of every SLURM task, in rank order, from the step's variables in `env`.

    Raises `DistEnvError` saying what is missing or contradictory."""
    from ..core.hostlist import expand_hostlist, expand_tasks_per_node

    for var in NODELIST_VARS:
        if env.get(var):
            hosts = expand_hostlist(env[var], var)
            break
    else:
        raise DistEnvError("SLURM does not reveal its node list (no SLURM_STEP_NODELIST). "
                           + PLACE_FIX)
    for cvar in COUNT_VARS:
        if env.get(cvar):
            counts = expand_tasks_per_node(env[cvar], cvar)
            break
    else:
        raise DistEnvError("SLURM does not reveal its tasks per node (no "
                           "SLURM_STEP_TASKS_PER_NODE). " + PLACE_FIX)
    if len(counts) != len(hosts):
        raise DistEnvError(f"{var} lists {len(hosts)} node(s) but {cvar} {len(counts)}. "
                           + MIXED_FIX)
    # The proof conditions of read(): a job-level list names the step's nodes only when it
    # has as many; arbitrary and heterogeneous layouts are unknown.
    step_nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES")
    if var != "SLURM_STEP_NODELIST" and str(len(hosts)) != (step_nodes or "").strip():
        raise DistEnvError(f"no SLURM_STEP_NODELIST, and {var} is not the step's node list. "
                           + PLACE_FIX)
    nodeid = env.get("SLURM_NODEID") or ""
    gtids = env.get("SLURM_GTIDS")
    doubt = layout_doubt(env, hosts, int(nodeid) if nodeid.isdigit() else None, counts,
                         gtids.split(",") if gtids else None, rank)
    if doubt is not None:
        raise DistEnvError(doubt[0] + ". " + DOUBT_FIX)
    dist = distribution(env.get("SLURM_DISTRIBUTION"))
    order = task_nodes(counts, dist, env.get("SLURM_DIST_PLANESIZE"))
    if world_size is not None and len(order) != world_size:
        raise DistEnvError(f"{cvar} adds up to {len(order)} tasks but world_size={world_size}. "
                           + MIXED_FIX)
    if node_rank is not None and rank is not None and rank < len(order) and order[rank] != node_rank:
        raise DistEnvError(
            f"SLURM_DISTRIBUTION={dist} places rank {rank} on node {order[rank]} but "
            f"SLURM_NODEID={node_rank}: an unusual distribution. Fix: set TF_CONFIG or "
            "DISTENV_HOSTFILE."
        )
    return [hosts[n] for n in order]


_PLACEMENT_VARS = NODELIST_VARS + COUNT_VARS + (
    "SLURM_DISTRIBUTION", "SLURM_DIST_PLANESIZE", "SLURMD_NODENAME", "SLURM_NODEID", "SLURM_GTIDS",
    "SLURM_HET_SIZE", "SLURM_PACK_SIZE", "SLURM_STEP_NUM_NODES", "SLURM_NNODES")


def _later(captured: "Env", size: int, rank: "int | None", node: "int | None"
           ) -> "tuple[tuple[str, ...] | None, str | None]":
    try:
        return tuple(rank_hosts(captured, size, rank, node)), None
    except DistEnvError as exc:
        return None, unknown(str(exc))


def refuses(service: str, env: "Env") -> str:
    """PMI-1 (``--mpi=pmi2``) in a heterogeneous step: the plugin does not join the
    components -- measured, SLURM 22.05, ``srun -w node2 : -w node1``: distenv's barrier
    never completed, and neither did MPICH's own MPI_Init without distenv -- so asking
    would only wait for the timeout. The apinfo file of another step (`pals.other_step`):
    it places that step's tasks, not this one's."""
    if service == "apinfo":
        from .pals import other_step

        step = other_step(env)
        if step is None:
            return ""
        return (f"PALS_APID={env.get('PALS_APID')} names step {step} of this job, not this "
                f"step ({env.get('SLURM_STEP_ID', env.get('SLURM_STEPID'))}): its PALS "
                "variables and apinfo file came with the environment srun passed on. Fix: "
                "launch this step with srun --mpi=cray_shasta, or unset PALS_* before srun")
    if service != "pmi":
        return ""
    why = heterogeneous(env)
    if why is None:
        return ""
    return (f"{why}, and SLURM's pmi2 plugin does not join the components of a "
            "heterogeneous step (MPI_Init itself never returns there). Fix: launch with "
            "srun --mpi=pmix or --mpi=cray_shasta (distenv asks their service), or set "
            "MASTER_ADDR (and NODE_RANK) for every task")


class Slurm(Source):
    name = "slurm"
    title = "SLURM"
    family = "slurm"
    launch = Launch(aliases=("slurm", "srun"), can_be_per_node=True)
    services = Services(
        "apinfo", "pmix", "pmi",
        # --mpi=none (SLURM_MPI_TYPE=none) offers none: a task then learns where task 0 runs only
        # from slurmctld (`sattach --layout`, one controller RPC per task: 4-24 ms each measured
        # here, N calls for N tasks at every job start), which distenv does not do
        fix="launch with srun --mpi=pmix or --mpi=cray_shasta (or --mpi=pmi2 unless the "
            "step is heterogeneous): distenv then asks that service",
        refuses=refuses,
    )
    passing = PassOn(
        how="srun passes the job script's environment",
        label_var=("SLURM_LABELIO", (), "srun --label"),
    )
    frameworks = Frameworks(
        covers=("jax:slurm",),  # JAX reads these variables too (jax/_src/clusters)
    )
    doctor = Doctor(command="srun", programs=("srun",))
    prefixes = ('SLURM_',)

    def detect(self, env: "Env") -> bool:
        step = step_id(env)
        return step is not None and step.strip() not in NOT_TASK_STEPS and "SLURM_PROCID" in env

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """The step's node list and tasks per node, dealt by SLURM_DISTRIBUTION (block,
        cyclic, plane: srun(1) --distribution); `rank_hosts` above says when it is unknown."""
        if per_node:
            return None
        from ..core.description import Later

        captured = {k: env.get(k) for k in _PLACEMENT_VARS}
        dist = distribution(captured["SLURM_DISTRIBUTION"])
        args = (captured, values["world_size"], values.get("rank"), values.get("node_rank"))
        return (Later(_later, args),
                f"SLURM node list and tasks per node, placed by distribution {dist}")

    def read(self, env: "Env", r: "Reading") -> None:
        from ..core.hostlist import expand_hostlist, expand_tasks_per_node

        get, values, why = env.get, r.values, r.why
        r.launch = PER_PROCESS
        # (field, first variable present of these, minimum): read inline -- resolve() runs
        # this on every call, and int_from's generality costs more than the parsing.
        found = {}
        for field, names, minimum in _INTS:
            for name in names:
                raw = get(name)
                if raw is not None:
                    if raw.isdigit() and raw.isascii() and len(raw) <= 10 and int(raw) >= minimum:
                        value = int(raw)
                    else:
                        value = parse_int(raw, name, "srun", minimum)
                    found[field] = values[field] = value
                    why[field] = f"{name}={value}"
                    break
        rank, node = found.get("rank"), found.get("node_rank")

        hosts = None
        for var in ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"):
            text = get(var)
            if text:
                listed = _MEMO.get(("hosts", text))
                if listed is None:
                    listed = _remember(("hosts", text), tuple(expand_hostlist(text, var)))
                if var != "SLURM_STEP_NODELIST" and len(listed) != found.get("num_nodes"):
                    # A job-level list names the step's nodes only when it has as many.
                    r.notes.append(f"no SLURM_STEP_NODELIST, and {var} lists {len(listed)} "
                                   "host(s), not the step's: the step's hosts are unknown")
                    break
                hosts = values["hosts"] = listed
                why["hosts"] = var
                break
        counts = None
        for cvar in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            text = get(cvar)
            if text:
                counts = _MEMO.get(("counts", text))
                if counts is None:
                    counts = _remember(("counts", text), tuple(expand_tasks_per_node(text, cvar)))
                break

        gtids_text = get("SLURM_GTIDS")
        gtids = None
        if gtids_text and rank is not None:
            gtids = [s.strip() for s in gtids_text.split(",")]
            if str(rank) not in gtids:
                raise DistEnvError(
                    f"SLURM_PROCID={rank} is not among SLURM_GTIDS={gtids_text!r}, the ranks "
                    "SLURM placed on this node: the SLURM variables are mixed from two steps. "
                    + MIXED_FIX
                )
            local = found.get("local_rank")
            if local is not None and (local >= len(gtids) or gtids[local] != str(rank)):
                # slurmstepd lists the node's tasks by local id (every recorded srun task:
                # tests/fixtures/launchers/*srun*)
                raise DistEnvError(
                    f"SLURM_LOCALID={local} but SLURM_GTIDS={gtids_text!r} gives local task "
                    f"{local} another rank than SLURM_PROCID={rank}: the SLURM variables are "
                    "mixed from two steps. " + MIXED_FIX)

        doubt = layout_doubt(env, hosts, node, counts, gtids, rank)
        if counts is not None:
            self._per_node(r, counts, cvar, node if doubt is None or doubt[1] else None)
        if gtids is not None:
            r.set("local_world_size", len(gtids),
                  f"SLURM_GTIDS={gtids_text} ({len(gtids)} ranks on this node)")
        if doubt is not None:
            values.pop("node_rank", None)
            why.pop("node_rank", None)
            plugin = (get("SLURM_MPI_TYPE") or "none").strip()
            ask = ("call distenv.discover() (it asks the --mpi=" + plugin + " service)"
                   if plugin in ("pmix", "pmi2", "cray_shasta") or plugin.startswith("pmix_")
                   else self.services.fix)
            r.notes.append(Note(doubt[0] + f". Fix: {ask}, or set MASTER_ADDR to task 0's host "
                                "(and NODE_RANK) for every task", about=("node_rank", "master_addr")))
        elif hosts:
            values["master_addr"] = hosts[0]
            why["master_addr"] = (f"first host of {why['hosts']} (block, cyclic and plane "
                                  "distributions place task 0 on node 0)")
        job = get("SLURM_JOB_ID") or get("SLURM_JOBID")
        if job:
            values["job_id"] = job
            why["job_id"] = "SLURM_JOB_ID"
            r.port_key = f"slurm:{job}.{step_id(env)}"

    @staticmethod
    def _per_node(r: "Reading", counts: "tuple[int, ...]", var: str, node: "int | None") -> None:
        values, why = r.values, r.why
        nodes, size, n = values.get("num_nodes"), values.get("world_size"), len(counts)
        if 0 in counts:
            raise DistEnvError(f"{var} gives node {counts.index(0)} no task, but every node of "
                               "a step runs one at least: the SLURM variables are inconsistent. "
                               + MIXED_FIX)
        if nodes is not None and n != nodes:
            raise DistEnvError(
                f"{var} lists {n} node(s) but {why['num_nodes']}: "
                "the SLURM variables are inconsistent. " + MIXED_FIX
            )
        if node is not None:
            if node >= n:
                raise DistEnvError(f"SLURM_NODEID={node} is beyond the {n} node(s) of {var}. "
                                   + MIXED_FIX)
            values["local_world_size"] = counts[node]
            why["local_world_size"] = f"{var}[SLURM_NODEID={node}]"
        if counts.count(counts[0]) == n:
            values["nproc_per_node"] = counts[0]
            why["nproc_per_node"] = f"{var} (same count on every node)"
        total = sum(counts)
        if size is not None and total != size:
            raise DistEnvError(
                f"{var} adds up to {total} tasks but {why['world_size']}: "
                "the SLURM variables are inconsistent. " + MIXED_FIX
            )


SOURCE = Slurm()
