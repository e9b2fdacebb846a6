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
from . import Source

# Step ids of steps that are not srun tasks (batch, extern, interactive, pending...).
NOT_TASK_STEPS = {"batch", "extern", "interactive", "pending",
                  "4294967290", "4294967291", "4294967292", "4294967293",
                  "4294967294", "4294967295"}


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

        who = "srun"
        r.launch = PER_PROCESS
        rank = r.int_from(env, "rank", "SLURM_PROCID", who)
        for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
            if var in env:
                r.int_from(env, "world_size", var, who, minimum=1)
                break
        r.int_from(env, "local_rank", "SLURM_LOCALID", who)
        node = r.int_from(env, "node_rank", "SLURM_NODEID", who)
        for var in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"):
            if var in env:
                r.int_from(env, "num_nodes", var, who, minimum=1)
                break

        for var in ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"):
            if env.get(var):
                hosts = expand_hostlist(env[var], var)
                r.set("hosts", hosts, var)
                break
        for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if env.get(var):
                counts = expand_tasks_per_node(env[var], var)
                self._per_node(r, counts, var, node)
                break

        gtids = env.get("SLURM_GTIDS")
        if gtids and rank is not None:
            ranks = [s.strip() for s in gtids.split(",")]
            if str(rank) not in ranks:
                raise DistEnvError(
                    f"SLURM_PROCID={rank} is not among SLURM_GTIDS={gtids!r}, the ranks SLURM "
                    "placed on this node: the SLURM variables are mixed from two steps."
                )
            r.set("local_world_size", len(ranks),
                  f"SLURM_GTIDS={gtids} ({len(ranks)} ranks on this node)")

        hosts = r.get("hosts")
        if hosts:
            dist = env.get("SLURM_DISTRIBUTION", "")
            if dist.startswith("arbitrary"):
                r.notes.append("SLURM_DISTRIBUTION=arbitrary: rank 0's host is not the first "
                               "of the node list; set MASTER_ADDR")
            else:
                r.set("master_addr", hosts[0],
                      f"first host of {r.why['hosts']} (srun places task 0 there)")
        job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
        r.set("job_id", job, "SLURM_JOB_ID")
        if job:
            r.port_key = f"slurm:{job}.{step_id(env)}"

    @staticmethod
    def _per_node(r, counts, var, node):
        nodes = r.get("num_nodes")
        if nodes is not None and len(counts) != nodes:
            raise DistEnvError(
                f"{var} lists {len(counts)} node(s) but {r.why['num_nodes']}: "
                "the SLURM variables are inconsistent."
            )
        if node is not None:
            if node >= len(counts):
                raise DistEnvError(f"SLURM_NODEID={node} is beyond the {len(counts)} node(s) of {var}.")
            r.set("local_world_size", counts[node], f"{var}[SLURM_NODEID={node}]")
        if all(c == counts[0] for c in counts):
            r.set("nproc_per_node", counts[0], f"{var} (same count on every node)")
        total = sum(counts)
        if r.get("world_size") is not None and total != r.get("world_size"):
            raise DistEnvError(
                f"{var} adds up to {total} tasks but {r.why['world_size']}: "
                "the SLURM variables are inconsistent."
            )


SOURCE = Slurm()
