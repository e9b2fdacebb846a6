"""SLURM tasks started by `srun`.

Only `srun` makes tasks. The batch script looks like task 0 of N (SLURM_PROCID=0,
SLURM_NTASKS=N) but has no step id; an `salloc` shell has only job-level variables.
Both are single processes and are left to the `single` source, which says so.
Node index and task counts per node come from the *step* variables; rank 0 runs on the
first host of the step's node list for every distribution but `arbitrary`.
"""

from __future__ import annotations

from ..description import PER_PROCESS
from ..errors import DistEnvError
from ..reading import parse_int
from . import Source

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
_MEMO: dict = {}


def _remember(key, value):
    if len(_MEMO) < 32:
        _MEMO[key] = value
    return value


def step_id(env):
    return env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))


class Slurm(Source):
    name = "slurm"
    title = "SLURM"
    aliases = ("slurm", "srun")
    can_be_per_node = True

    def detect(self, env):
        step = step_id(env)
        return step is not None and step.strip() not in NOT_TASK_STEPS and "SLURM_PROCID" in env

    def read(self, env, r):
        from ..hostlist import expand_hostlist, expand_tasks_per_node

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

        for var in ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"):
            text = get(var)
            if text:
                hosts = _MEMO.get(("hosts", text))
                if hosts is None:
                    hosts = _remember(("hosts", text), tuple(expand_hostlist(text, var)))
                values["hosts"] = hosts
                why["hosts"] = var
                break
        else:
            hosts = None
        for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            text = get(var)
            if text:
                counts = _MEMO.get(("counts", text))
                if counts is None:
                    counts = _remember(("counts", text), tuple(expand_tasks_per_node(text, var)))
                self._per_node(r, counts, var, node)
                break

        gtids = get("SLURM_GTIDS")
        if gtids and rank is not None:
            ranks = [s.strip() for s in gtids.split(",")]
            if str(rank) not in ranks:
                raise DistEnvError(
                    f"SLURM_PROCID={rank} is not among SLURM_GTIDS={gtids!r}, the ranks SLURM "
                    "placed on this node: the SLURM variables are mixed from two steps."
                )
            r.set("local_world_size", len(ranks),
                  f"SLURM_GTIDS={gtids} ({len(ranks)} ranks on this node)")

        if hosts:
            if get("SLURM_DISTRIBUTION", "").startswith("arbitrary"):
                r.notes.append("SLURM_DISTRIBUTION=arbitrary: rank 0's host is not the first "
                               "of the node list; set MASTER_ADDR")
            else:
                values["master_addr"] = hosts[0]
                why["master_addr"] = f"first host of {why['hosts']} (srun places task 0 there)"
        job = get("SLURM_JOB_ID") or get("SLURM_JOBID")
        if job:
            values["job_id"] = job
            why["job_id"] = "SLURM_JOB_ID"
            r.port_key = f"slurm:{job}.{step_id(env)}"

    @staticmethod
    def _per_node(r, counts, var, node):
        values, why = r.values, r.why
        nodes, size, n = values.get("num_nodes"), values.get("world_size"), len(counts)
        if nodes is not None and n != nodes:
            raise DistEnvError(
                f"{var} lists {n} node(s) but {why['num_nodes']}: "
                "the SLURM variables are inconsistent."
            )
        if node is not None:
            if node >= n:
                raise DistEnvError(f"SLURM_NODEID={node} is beyond the {n} node(s) of {var}.")
            values["local_world_size"] = counts[node]
            why["local_world_size"] = f"{var}[SLURM_NODEID={node}]"
        if counts.count(counts[0]) == n:
            values["nproc_per_node"] = counts[0]
            why["nproc_per_node"] = f"{var} (same count on every node)"
        total = sum(counts)
        if size is not None and total != size:
            raise DistEnvError(
                f"{var} adds up to {total} tasks but {why['world_size']}: "
                "the SLURM variables are inconsistent."
            )


SOURCE = Slurm()
