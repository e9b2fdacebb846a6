"""Helpers shared by platform sources (kept tiny: each source stays readable on its own; the
counts most launchers give are `core.reading.read_counts`, which the MPI and torch sources
use without importing this module).

block_layout's proof is the calling platform's documented layout (docs/inferences.md);
address_lines reads the node lists SkyPilot and dstack document (line k: node rank k);
check_master refuses a MASTER_ADDR that names another node of such a list than node 0;
platform_master and platform_hosts keep a platform's master node and host order from
overriding what the launcher inside it says of its own ranks;
NodeList is what those two per-node platforms share (the node index, the placement rule).
"""

from __future__ import annotations

from ..core.description import PER_NODE
from ..errors import DistEnvError
from ..core.reading import get_int, Reading, show
from . import Source, names_of

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env


def block_layout(r: Reading, why: str) -> None:
    """Node rank for a platform that documents a block layout with the same number of
    processes on every node (Azure ML and SageMaker MPI jobs): node = rank // local size."""
    rank, local, size = r.get("rank"), r.get("local_world_size"), r.get("world_size")
    if None in (rank, local, size) or size % local:
        return
    nodes = size // local
    if r.get("num_nodes") not in (None, nodes):
        return
    r.default("num_nodes", nodes, f"world size / local world size ({why})")
    r.default("node_rank", rank // local, f"rank // local world size ({why})")
    r.default("nproc_per_node", local, f"local world size ({why})")


def address_lines(raw: str, var: str, fix: str) -> "tuple[str, ...]":
    """The node addresses of a newline-separated list (SkyPilot's SKYPILOT_NODE_IPS, dstack's
    DSTACK_NODES_IPS: one address per line, node rank order). Blank space around the list and
    around each line is dropped; an empty list, an empty line or a line holding blanks is an
    error ending with `fix` (a list distenv cannot read proves no node order)."""
    text = raw.strip()
    if not text:
        raise DistEnvError(f"{var} is empty: it names no node, so neither rank 0's address nor "
                           f"the node order is known. {fix}")
    lines = tuple(line.strip() for line in text.split("\n"))
    for i, host in enumerate(lines):
        if not host or any(c.isspace() for c in host):
            raise DistEnvError(f"{var}={show(raw)}: line {i + 1} is {show(host)}, not one "
                               f"address. {fix}")
    return lines


def check_master(env: "Env", hosts: "tuple[str, ...]", why: str) -> None:
    """A MASTER_ADDR set by hand that names another node of the list than node 0 (where the
    launch puts rank 0) is a contradiction, never a choice; one the list does not hold (a host
    name, another interface of node 0) cannot be checked, and the resolver takes it with a
    note."""
    given = (env.get("MASTER_ADDR") or "").strip()
    if not given or given == hosts[0] or given not in hosts:
        return
    raise DistEnvError(
        f"MASTER_ADDR={show(given)} is node {hosts.index(given)}'s address in {why}, but rank 0 "
        f"runs on node 0 ({hosts[0]}). Fix: unset MASTER_ADDR (distenv takes node 0's address "
        f"from {why}), or set it to node 0's address.")


def platform_master(r: Reading, addr: str, what: str, why: str) -> None:
    """The master node a platform names (`what`: which, for a note; `why`: the provenance),
    where the platform itself starts rank 0 -- unless the launcher inside the job set its own MASTER_ADDR (torchrun, the
    DeepSpeed launcher): that one names where its rank 0 runs, and the platform's node does
    not (torchrun's c10d rendezvous gives group rank 0 to any node, measured; the rank-0 agent
    then passes its own address). The launcher's then stays, with a note when they differ."""
    own = r.get("master_addr") if "MASTER_ADDR" in r.owns else None
    if own is None and r.node_order and "MASTER_ADDR" in r.owns:
        # The launcher puts its rank 0 on any node (Ray Train, without the MASTER_ADDR it sets
        # under init_method "env"): the platform's node is no proof of where.
        r.notes.append(f"{what} is {addr}, but {r.node_order}: it is not taken as rank 0's host")
        return
    if own is None:
        r.set("master_addr", addr, why)
        r.addr_explicit = True
    elif own != addr:
        r.notes.append(f"{what} is {addr}, but the launcher's own "
                       f"{r.why['master_addr']} names rank 0's host: {own} is used")


def platform_hosts(r: Reading, hosts: "list[str]", why: str, count: bool = True) -> None:
    """A platform's host list as `hosts` (node k = k-th host), unless the launcher numbers its
    nodes by no host list (its source's node_order, e.g. torchrun's rendezvous order): then
    only the node count (`count`: where the list is every node of the launch), since node k
    need not be the k-th host."""
    if not r.node_order:
        r.default("hosts", hosts, why)
    if count:
        r.default("num_nodes", len(hosts), why)


class NodeList(Source):
    """A platform that runs a task's commands once on each node, gives the node's index in
    `rank_var` and lists the nodes' addresses in `ips_var`, line k = node rank k (SkyPilot,
    dstack): a per-node launch whose workers are numbered node_rank * nproc_per_node +
    local_rank (`distenv run` starts them)."""

    family = "platform"
    #: The node index variable, the address list variable, and what the platform did (for
    #: the launcher's provenance).
    rank_var = ""
    ips_var = ""
    started = ""
    #: The fix for platform variables distenv cannot read (ends every such error).
    fix = ""

    def read_node(self, env: "Env", r: Reading) -> "int | None":
        """The per-node launch and this node's index."""
        r.launch = PER_NODE
        r.set("launcher", self.name, f"{self.rank_var}: {self.started}")
        node = get_int(env, self.rank_var, self.title)
        r.set("node_rank", node, f"{self.rank_var}={node}")
        return node

    def read_ips(self, env: "Env") -> "tuple[str, ...] | None":
        """The address list (line k: node rank k's IP), None when it is not set."""
        raw = env.get(self.ips_var)
        return address_lines(raw, self.ips_var, self.fix) if raw is not None else None

    def set_nodes(self, env: "Env", r: Reading, ips: "tuple[str, ...]", hosts: bool = True) -> None:
        """Line k is node rank k's IP, so line 0 is rank 0's host (`hosts`: the list is every
        node of the task); a MASTER_ADDR naming another node is refused."""
        if hosts:
            r.set("hosts", ips, f"{self.ips_var} (line k: node rank k's IP)")
        r.set("master_addr", ips[0], f"first line of {self.ips_var}: node rank 0's IP, where "
                                     "rank 0 runs")
        check_master(env, ips, self.ips_var)

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """Node k (line k of the address list) runs ranks k*nproc .. k*nproc+nproc-1, also
        when each node is its only worker (a per-process launch)."""
        if values.get("launcher") not in names_of(self):
            return None
        from ..core.placement import repeated

        return repeated(values, f"{self.ips_var} in node order, nproc_per_node="
                                f"{values.get('nproc_per_node')} each (workers are numbered "
                                "node_rank * nproc_per_node + local_rank)")
