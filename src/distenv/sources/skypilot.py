"""SkyPilot tasks (`sky launch`, `sky jobs launch`) with `num_nodes: N`.

SkyPilot runs a task's ``run`` commands once on each of its nodes, with the node's place in
SKYPILOT_* variables; the workers are yet to be started (SkyPilot's own guide starts them with
torchrun from those variables): a per-node launch, whose whole launch line is
``distenv run -- python main.py``.

Proof of every field: SkyPilot's source and documentation (skypilot-org/skypilot, the 0.14
development line, ``sky/__init__.py`` ``__version__ = '0.14.0rc1'``: ``sky/backends/
task_codegen.py`` at commit 00526108, ``RayCodeGen.add_setup`` and ``_add_ray_task``;
``sky/skylet/constants.py``; ``sky/skylet/executor/slurm.py``; ``docs/source/running-jobs/
distributed-jobs.rst`` and ``environment-variables.rst``):

===============  ===========================================================================
field            rule
===============  ===========================================================================
node_rank        SKYPILOT_NODE_RANK: the node's index in ``job_ip_rank_list`` (the task's
                 node IPs sorted by the cluster's stable order), 0 .. num_nodes-1
num_nodes        SKYPILOT_NUM_NODES (``len(job_ip_rank_list)``); without it, the lines of
                 SKYPILOT_NODE_IPS (the docs: "Same value as ``echo "$SKYPILOT_NODE_IPS" |
                 wc -l``")
hosts            SKYPILOT_NODE_IPS: ``'\\n'.join(job_ip_rank_list)``, so line *k* is node
                 rank *k*'s IP
master_addr      the first line of SKYPILOT_NODE_IPS: node rank 0, where rank 0 runs (the
                 guide: ``MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)``)
nproc_per_node   SKYPILOT_NUM_GPUS_PER_NODE when above 0: ``ceil`` of the task's accelerator
                 count, one value for every node of the task (the resources of its Ray
                 placement group's bundles are one copy per node); 0 (a CPU task): the
                 resolver's default (visible GPUs, else one worker)
master_port      derived from SKYPILOT_TASK_ID (one id for every node of the task; kept by
                 every recovery of a managed job)
job_id           SKYPILOT_TASK_ID
===============  ===========================================================================

Errors (one line, with a Fix): a node rank not below the node count; an empty address list,
an empty line in it, or fewer lines than nodes; a MASTER_ADDR set by hand that is another
node's address of the list (`_common.check_master`). A hand-set NODE_RANK that contradicts
SKYPILOT_NODE_RANK is the resolver's canonical check. More lines than nodes (SkyPilot's Slurm
executor, ``sky/skylet/executor/slurm.py``, lists the whole Slurm job's nodes while the task
may run on fewer) prove no node order: hosts and master are unknown, with a note.

Setup commands get SKYPILOT_SETUP_NODE_RANK and SKYPILOT_SETUP_NODE_IPS instead, never
SKYPILOT_NODE_RANK: a setup step is not this source's. On SkyPilot's Slurm backend the run
commands execute inside ``srun --ntasks-per-node=1`` (``executor/slurm.py``), whose step
variables describe the process: the SLURM source, earlier in the registry, reads it (one task
per node; ``distenv run --nproc-per-node gpu`` makes it a per-node launch there).
"""

from __future__ import annotations

from ..errors import DistEnvError
from ..core.reading import get_int
from ._common import NodeList
from . import PassOn

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading

#: The fix for SkyPilot variables distenv cannot read.
FIX = ("Fix: leave SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES and SKYPILOT_NODE_IPS as SkyPilot "
       "sets them for the run commands (do not set them in the task's envs or with --env).")
IPS = "SKYPILOT_NODE_IPS"


class SkyPilot(NodeList):
    name = "skypilot"
    title = "SkyPilot"
    prefixes = ("SKYPILOT_",)
    passing = PassOn(how="sky launch --env {name}={value} (or the task YAML's envs:)")
    rank_var, ips_var, fix = "SKYPILOT_NODE_RANK", IPS, FIX
    started = "SkyPilot ran the task's run commands once on each node"

    def read(self, env: "Env", r: "Reading") -> None:
        node = self.read_node(env, r)
        count = get_int(env, "SKYPILOT_NUM_NODES", self.title, minimum=1)
        ips = self.read_ips(env)
        if count is not None:
            r.set("num_nodes", count, f"SKYPILOT_NUM_NODES={count}")
        elif ips is not None:
            count = len(ips)
            r.set("num_nodes", count, f"the {count} line(s) of {IPS} (SkyPilot's node count)")
        if node is not None and count is not None and node >= count:
            raise DistEnvError(f"SKYPILOT_NODE_RANK={node} is not below the node count {count} "
                               f"({r.why['num_nodes']}): SkyPilot numbers nodes 0 to "
                               f"num_nodes-1. {FIX}")
        if ips is not None and count is not None:
            self._hosts(env, r, ips, count)
        elif count != 1:
            r.notes.append(f"{IPS} is not set: rank 0's address is unknown. Fix: keep the {IPS} "
                           "SkyPilot gives run commands, or set MASTER_ADDR=<node 0's address> "
                           "on every node")
        gpus = get_int(env, "SKYPILOT_NUM_GPUS_PER_NODE", self.title)
        if gpus:  # 0: a CPU task, where the resolver's default (visible GPUs, else 1) applies
            r.nproc_source = (str(gpus), f"SKYPILOT_NUM_GPUS_PER_NODE={gpus}")
        task = env.get("SKYPILOT_TASK_ID")
        if task:
            r.set("job_id", task, "SKYPILOT_TASK_ID")
            r.port_key = "skypilot:" + task

    def _hosts(self, env: "Env", r: "Reading", ips: "tuple[str, ...]", count: int) -> None:
        if len(ips) < count:
            raise DistEnvError(
                f"{IPS} lists {len(ips)} address(es) but the task has {count} nodes "
                f"({r.why['num_nodes']}): the nodes after line {len(ips)} have no address. {FIX}")
        if len(ips) > count:
            r.notes.append(
                f"{IPS} lists {len(ips)} addresses for {count} node(s) (SkyPilot on Slurm lists "
                "the whole Slurm job's nodes): which is node 0 is not proven, so rank 0's address "
                "is unknown. Fix: set MASTER_ADDR=<node 0's address> on every node")
            return
        self.set_nodes(env, r, ips)


SOURCE = SkyPilot()
