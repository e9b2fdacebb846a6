"""AWS Batch multi-node parallel jobs (one container per node: the node's index in AWS_BATCH_*).

AWS Batch starts one job container on each node, and the nodes are single-tenant ("only a
single job container is run on each Amazon EC2 instance"); the container's command is the
node's one process, whose workers are yet to be started: a per-node launch, whose whole
command is ``distenv run --nproc-per-node N -- python main.py``. A launcher the command runs
(torchrun, mpirun) comes first in the registry and describes its own workers.

Proof of every field: the AWS Batch User Guide, "Multi-node parallel jobs"
(``multi-node-parallel-jobs.html``), "Environment variables" (``mnp-env-vars.html``), "Node
groups" (``mnp-node-groups.html``), read 2026-12-07; there is no AWS Batch here, so the cases
(tests/fixtures/platforms/aws_batch_*.json) follow those pages:

===============  ===========================================================================
field            rule
===============  ===========================================================================
num_nodes        AWS_BATCH_JOB_NUM_NODES: "the number of nodes that you have requested"
node_rank        (AWS_BATCH_JOB_NODE_INDEX - AWS_BATCH_JOB_MAIN_NODE_INDEX) mod num_nodes:
                 the node indexes are unique, 0 .. nodes-1, and every node is given the
                 same main node index, so this numbers the nodes 0 .. nodes-1 on every node
                 alike, with the main node 0 (rank 0 runs where the address below leads;
                 the main node need not be index 0: ``mainNode`` in the job definition)
master_addr      AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS, "the private IPv4 address of
                 the job's main node", set on the child nodes only: on the main node itself
                 unknown (AWS Batch does not give a node its own address)
nproc_per_node   given (``--nproc-per-node N``, DISTENV_NPROC_PER_NODE=N), never this node's
                 GPUs (`Reading.workers_unproven`): node groups share the instance type but
                 each asks for its own resources, so the nodes may see different GPU counts;
                 unknown otherwise (on one node: the resolver's default)
master_port      derived from AWS_BATCH_JOB_ID up to any ``#``: a node is addressed as
                 ``<job id>#<node index>``, so the part before it is the job's on every node
job_id           the same
===============  ===========================================================================

Errors (one line, with a Fix): the node count or main node index missing, either index not
below the node count; a child node without the main node's address (AWS Batch sets it on every
one: a starter dropped it); a loopback MASTER_ADDR on a child node (the main node is another
instance); RANK or LOCAL_RANK in a process no launcher distenv knows started (a worker started
by hand, or a stale variable: either would train apart from the other nodes).
"""

from __future__ import annotations

from ..core.description import PER_NODE
from ..errors import DistEnvError
from ..core.reading import get_int, show
from . import Launch, Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading

FIX = ("Fix: leave the AWS_BATCH_* variables as AWS Batch sets them, and pass them into any "
       "container or environment the job's command starts (the prefix is reserved: a job "
       "definition cannot set them).")
MAIN_IP = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
#: Where the main node's own address comes from: only there, since the child nodes have theirs.
ON_MAIN = (f"on the main node only (where {MAIN_IP} is unset), set MASTER_ADDR to its private "
           "IPv4 address")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
REQUIRED = ("AWS_BATCH_JOB_NUM_NODES", "AWS_BATCH_JOB_MAIN_NODE_INDEX")


class AwsBatch(Source):
    name = "aws_batch"
    title = "AWS Batch"
    family = "platform"
    prefixes = ("AWS_BATCH_",)
    launch = Launch(
        master_unknown=(f"this is AWS Batch's main node, and AWS Batch gives the main node's "
                        f"address ({MAIN_IP}) to the child nodes only Fix: {ON_MAIN}"),
        unknown_fix="give what the notes above name (AWS Batch does not say them)")

    def read(self, env: "Env", r: "Reading") -> None:
        for var in ("RANK", "LOCAL_RANK"):
            if var in env:  # no launcher distenv knows started it (theirs come first)
                raise DistEnvError(
                    f"{var}={show(env[var])} is set in a process of AWS Batch's job, which AWS Batch "
                    "starts once per node: a worker the job's command started by hand, or a stale "
                    f"variable (an image's ENV)? Either would train apart from the other nodes. Fix: "
                    f"unset {var} and start the workers with distenv run --nproc-per-node N (or "
                    "torchrun).")
        r.launch = PER_NODE
        r.set("launcher", self.name, "AWS_BATCH_JOB_NODE_INDEX: AWS Batch started the job's "
                                     "container once on each node")
        r.workers_unproven = ("AWS Batch does not say whether every node group asked for as "
                              "many GPUs as this node sees")
        for var in REQUIRED:  # AWS Batch sets each on every node: a missing one was dropped
            if not env.get(var):
                raise DistEnvError(f"{var} is not set, but AWS_BATCH_JOB_NODE_INDEX is: AWS Batch "
                                   f"sets both on every node of a multi-node parallel job. {FIX}")
        count = r.int_from(env, "num_nodes", "AWS_BATCH_JOB_NUM_NODES", self.title, minimum=1)
        index = get_int(env, "AWS_BATCH_JOB_NODE_INDEX", self.title)
        main = get_int(env, "AWS_BATCH_JOB_MAIN_NODE_INDEX", self.title)
        for var, value in (("AWS_BATCH_JOB_NODE_INDEX", index), ("AWS_BATCH_JOB_MAIN_NODE_INDEX", main)):
            if value is not None and count is not None and value >= count:
                raise DistEnvError(f"{var}={value} is not below AWS_BATCH_JOB_NUM_NODES={count}: "
                                   f"AWS Batch numbers nodes 0 to nodes-1. {FIX}")
        if index is not None and main is not None and count is not None:
            r.set("node_rank", (index - main) % count,
                  f"(AWS_BATCH_JOB_NODE_INDEX={index} - AWS_BATCH_JOB_MAIN_NODE_INDEX={main}) mod "
                  f"{count}: the main node is node rank 0")
        addr = (env.get(MAIN_IP) or "").strip()
        child = index is not None and main is not None and index != main
        if child and not addr:
            raise DistEnvError(f"{MAIN_IP} is not set on node index {index}, a child node (the main "
                               f"node's index is {main}): AWS Batch sets it on every child node. {FIX}")
        given = (env.get("MASTER_ADDR") or "").strip()
        if addr and given and given != addr and _loopback(given):  # ipaddress only when one is given
            raise DistEnvError(
                f"MASTER_ADDR={show(given)} is this node's loopback, but rank 0 runs on the main "
                f"node, another instance ({MAIN_IP}={addr}). Fix: unset MASTER_ADDR on the child "
                f"nodes (distenv takes the main node's address from AWS Batch); {ON_MAIN}.")
        if addr:
            r.set("master_addr", addr, f"{MAIN_IP} (the main node, node rank 0, where rank 0 runs)")
            r.addr_explicit = True
        job = (env.get("AWS_BATCH_JOB_ID") or "").partition("#")[0].strip()
        if job:
            r.set("job_id", job, "AWS_BATCH_JOB_ID (up to '#': the job's, not the node's)")
            r.port_key = "aws_batch:" + job

    def after(self, env: "Env", r: "Reading") -> None:
        """The main node's note, unless its address was given (MASTER_ADDR, resolve())."""
        if r.get("master_addr") is None and not env.get("MASTER_ADDR") and r.get("num_nodes") != 1:
            r.notes.append(f"rank 0's address is unknown: this is the main node, and AWS Batch gives "
                           f"its address to the child nodes only. Fix: {ON_MAIN}")


def _loopback(host: str) -> bool:
    """An address or name that leads back to this host (or to any: 0.0.0.0)."""
    import ipaddress

    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or ip.is_unspecified or bool(mapped and (mapped.is_loopback or mapped.is_unspecified))


SOURCE = AwsBatch()
