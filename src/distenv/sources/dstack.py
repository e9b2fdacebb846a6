"""dstack tasks with `nodes: N` (distributed tasks on a cluster fleet).

dstack's runner starts a task's ``commands`` once on each node, with the node's place in
DSTACK_* variables; the workers are yet to be started (dstack's guide starts them with torchrun
from those variables): a per-node launch, whose whole launch line is
``distenv run -- python main.py``.

Proof of every field: dstack's source and documentation (dstackai/dstack 0.21.2:
``runner/internal/runner/executor/executor.go``, ``execJob``: the job's variables;
``src/dstack/_internal/server/background/pipeline_tasks/jobs_running.py``,
``_get_cluster_info``: the cluster they come from; ``mkdocs/docs/concepts/tasks.md``, "System
environment variables"; DSTACK_NODES_IPS since 0.18.25, DSTACK_GPUS_NUM since 0.18.1,
DSTACK_RUN_ID since 0.19.9 -- each read only when present):

===============  ===========================================================================
field            rule
===============  ===========================================================================
node_rank        DSTACK_NODE_RANK: the job's ``JobNum``, 0 .. nodes-1
num_nodes        DSTACK_NODES_NUM: ``JobsPerReplica``, the run's nodes
hosts            DSTACK_NODES_IPS: the replica's jobs' internal IPs sorted by ``job_num``,
                 joined by newlines, so line *k* is node rank *k*'s IP
master_addr      DSTACK_MASTER_NODE_IP: ``job_ips[0]``, node rank 0's IP, where rank 0 runs
                 (the docs: "groups[0].nodes[0] is the run's master node"); with
                 DSTACK_NODES_IPS it must be that list's first line
nproc_per_node   DSTACK_GPUS_PER_NODE when above 0 and every node has as many: it is *this*
                 node's GPU count (``gpus_per_job``), and DSTACK_GPUS_NUM the sum over the
                 nodes (``gpus_per_node``), so the nodes are alike when GPUS_NUM = NODES_NUM x
                 GPUS_PER_NODE (before 0.21 dstack computed GPUS_NUM as that product). Nodes
                 that differ (node groups of different resources): one worker per GPU would
                 give them different worker counts, so the count must be given
                 (``distenv run --nproc-per-node N``), else an error. 0 GPUs: the resolver's
                 default (visible GPUs, else one worker)
master_port      derived from DSTACK_RUN_ID (else DSTACK_RUN_NAME): one run, every node
job_id           DSTACK_RUN_NAME (else DSTACK_RUN_ID)
===============  ===========================================================================

Errors (one line, with a Fix): a node rank not below the node count; an empty address list,
an empty line in it, or a list whose length is not the node count; DSTACK_MASTER_NODE_IP that
is not the list's first line; a MASTER_ADDR set by hand that is another node's address of the
list (`_common.check_master`). A hand-set NODE_RANK that contradicts DSTACK_NODE_RANK is the
resolver's canonical check. DSTACK_JOB_ID names one node's job submission, not the run: never
a port key.
"""

from __future__ import annotations

from ..errors import DistEnvError
from ..core.reading import get_int, show
from ._common import NodeList
from . import PassOn

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading

#: The fix for dstack variables distenv cannot read.
FIX = ("Fix: leave the DSTACK_* variables as dstack's runner sets them (do not set "
       "DSTACK_NODE_RANK, DSTACK_NODES_NUM, DSTACK_NODES_IPS or DSTACK_MASTER_NODE_IP in the "
       "configuration's env).")
IPS = "DSTACK_NODES_IPS"
#: How the resolver records a processes-per-node count the user gave (resolver._wanted).
GIVEN = ("DISTENV_NPROC_PER_NODE=", "given to resolve()")
#: ... of which these words are no count but a rule each node applies to itself (auto, gpu:
#: its own GPUs; cpu: its own cores), so the counts differ where the nodes do.
PER_NODE_WORDS = ("auto", "gpu", "cpu")


class Dstack(NodeList):
    name = "dstack"
    title = "dstack"
    prefixes = ("DSTACK_",)
    passing = PassOn(how="env: [{name}={value}] in the dstack configuration")
    rank_var, ips_var, fix = "DSTACK_NODE_RANK", IPS, FIX
    started = "dstack's runner started the task's commands once on each node"

    def read(self, env: "Env", r: "Reading") -> None:
        node = self.read_node(env, r)
        count = r.int_from(env, "num_nodes", "DSTACK_NODES_NUM", self.title, minimum=1)
        if node is not None and count is not None and node >= count:
            raise DistEnvError(f"DSTACK_NODE_RANK={node} is not below DSTACK_NODES_NUM={count}: "
                               f"dstack numbers nodes 0 to nodes-1. {FIX}")
        ips = self.read_ips(env)
        if ips is not None and count is not None and len(ips) != count:
            fewer = (f"the nodes after line {len(ips)} have no address" if len(ips) < count
                     else "which lines are this run's nodes is not proven")
            raise DistEnvError(f"{IPS} lists {len(ips)} address(es) but DSTACK_NODES_NUM={count}: "
                               f"{fewer}. {FIX}")
        master = (env.get("DSTACK_MASTER_NODE_IP") or "").strip()
        if ips is not None:
            if master and master != ips[0]:
                raise DistEnvError(f"DSTACK_MASTER_NODE_IP={show(master)} is not the first line of "
                                   f"{IPS} ({ips[0]}): dstack sets both from node rank 0's IP. {FIX}")
            self.set_nodes(env, r, ips, hosts=count is not None)
        elif master:
            r.set("master_addr", master, "DSTACK_MASTER_NODE_IP (node rank 0's IP, where rank 0 runs)")
        elif count != 1:
            r.notes.append("neither DSTACK_NODES_IPS nor DSTACK_MASTER_NODE_IP is set: rank 0's "
                           "address is unknown. Fix: keep the variables dstack's runner sets, or "
                           "set MASTER_ADDR=<node 0's address> on every node")
        per = get_int(env, "DSTACK_GPUS_PER_NODE", self.title)
        if per and _uneven(env, count, per) is None:
            r.nproc_source = (str(per), f"DSTACK_GPUS_PER_NODE={per}")
        run_id, run_name = env.get("DSTACK_RUN_ID"), env.get("DSTACK_RUN_NAME")
        if run_name or run_id:
            r.set("job_id", run_name or run_id, "DSTACK_RUN_NAME" if run_name else "DSTACK_RUN_ID")
            r.port_key = "dstack:" + (run_id or run_name or "")

    def after(self, env: "Env", r: "Reading") -> None:
        """Nodes with different GPU counts: the workers per node must be given, never taken
        from this node's GPUs (the others would start a different number)."""
        per = get_int(env, "DSTACK_GPUS_PER_NODE", self.title)
        total = _uneven(env, r.get("num_nodes"), per or 0)
        why = r.why.get("nproc_per_node", "")
        word = why.partition("=")[2].partition(" ")[0].lower() in PER_NODE_WORDS
        if total is None or (why.startswith(GIVEN) and not word):
            return
        raise DistEnvError(
            f"DSTACK_GPUS_NUM={total} is not DSTACK_NODES_NUM={r.get('num_nodes')} x "
            f"DSTACK_GPUS_PER_NODE={per}: the run's nodes have different GPU counts, so one worker "
            "per GPU would start different numbers of workers on them. Fix: give every node the "
            "same count: distenv run --nproc-per-node N (DISTENV_NPROC_PER_NODE=N).")


def _uneven(env: "Env", nodes: "int | None", per: int) -> "int | None":
    """DSTACK_GPUS_NUM when it says the nodes have different GPU counts, else None."""
    total = get_int(env, "DSTACK_GPUS_NUM", Dstack.title)
    if total is None or nodes is None or total == nodes * per:
        return None
    return total


SOURCE = Dstack()
