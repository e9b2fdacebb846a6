"""Workers that Lightning started from a per-node process (or from a lone `python train.py`).

A per-node launch gives Lightning one process per node, and Lightning starts that node's
workers itself (`_SubprocessScriptLauncher`). Those workers inherit the node process's launcher
variables (which describe the *node*: under mpirun, OMPI_COMM_WORLD_RANK is the node index), so
they cannot describe a worker. Before Lightning starts them, `distenv.lightning` (its
``validate_settings``) writes the node's description, as resolved there, into
DISTENV_LIGHTNING_NODE (JSON of `DistEnv.to_dict()`, with the Trainer's ``devices`` as
``nproc_per_node``); this source reads it back in every worker.

Proof of each field (Lightning's launcher, lightning.fabric/pytorch
``strategies/launchers/subprocess_script.py``, sets in each worker it starts LOCAL_RANK =
0..devices-1 -- also in the node process itself, which becomes worker 0 --, NODE_RANK =
the plugin's ``node_rank()``, WORLD_SIZE = devices x num_nodes, MASTER_ADDR/MASTER_PORT = the
plugin's ``main_address``/``main_port``):

===============================  ===========================================================
field                            rule
===============================  ===========================================================
local_rank                       LOCAL_RANK (Lightning)
rank                             node_rank x nproc_per_node + local_rank: Lightning's own
                                 global rank of the workers it starts
                                 (``ClusterEnvironment.global_rank`` set from
                                 ``node_rank * num_processes + local_rank``)
world_size, local_world_size,    the node description (the Trainer's devices x num_nodes);
nproc_per_node, node_rank,       WORLD_SIZE and NODE_RANK, which Lightning also sets, are
num_nodes, hosts, rank_hosts     cross-checked by the resolver
master_addr, master_port         the node description (Lightning copies the same values
                                 into MASTER_ADDR/MASTER_PORT)
===============================  ===========================================================

The source answers only when LOCAL_RANK is set too: the node process itself, before Lightning
starts its workers, is still described by its launcher.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from ..errors import DistEnvError
from ..knobs import LIGHTNING_NODE
from ..core.reading import parse_int, parse_json, show
from . import Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

    from ..core.description import DistEnv
    from ..core.reading import Env, Reading

#: The variable a per-node process hands its node's description down in.
VARIABLE = LIGHTNING_NODE

#: Fields copied from the node's description as they are.
_COPIED = ("world_size", "node_rank", "num_nodes", "nproc_per_node", "master_addr",
           "master_port", "hosts", "rank_hosts", "job_id")


def hand_off(env: "DistEnv", devices: int, num_nodes: int) -> str:
    """The value of DISTENV_LIGHTNING_NODE a node process (`env`, a DistEnv) gives the
    `devices` workers per node that Lightning starts on each of `num_nodes` nodes."""
    import json

    node = env.replace(nproc_per_node=devices, local_world_size=devices, num_nodes=num_nodes,
                       world_size=devices * num_nodes, rank=None, local_rank=None).to_dict()
    node["launch"] = "per-node"
    if node.get("rank_hosts") is not None and len(node["rank_hosts"]) != devices * num_nodes:
        node["rank_hosts"] = None  # placed for another count of workers per node
    return json.dumps(node)


def _node(env: "Env") -> "dict[str, Any]":
    raw = env[VARIABLE]
    node = parse_json(raw, VARIABLE)
    if not isinstance(node, dict):
        raise DistEnvError(f"{VARIABLE} is not a JSON object: {show(raw)}. Fix: unset it.")
    for field in ("nproc_per_node", "num_nodes", "world_size"):
        value = node.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DistEnvError(f"{VARIABLE} has no valid {field}: {show(raw)}. Fix: unset it.")
    return node


class LightningNode(Source):
    name = "lightning"
    title = "Lightning (workers it started from a per-node process)"
    family = "lightning"
    prefixes = (VARIABLE,)
    # Lightning copies the node description's master into these: the same values. RANK it
    # does not set: one here is the node process's (the node index Kubeflow, GCP and Vertex
    # give each pod), never this worker's (review, 2026-12-07: every worker but 0 stopped).
    owns = ("MASTER_ADDR", "MASTER_PORT", "RANK")

    def detect(self, env: "Env") -> bool:
        return "LOCAL_RANK" in env

    def read(self, env: "Env", r: "Reading") -> None:
        node = _node(env)
        why = f"{VARIABLE} (the node process that started this worker)"
        r.launch = PER_PROCESS
        for field in _COPIED:
            value = node.get(field)
            if field in ("hosts", "rank_hosts") and value is not None:
                value = tuple(value)
            r.set(field, value, why)
        if node.get("platform") is not None:
            r.set("platform", node["platform"], why)
        nproc = node["nproc_per_node"]
        local = parse_int(env["LOCAL_RANK"], "LOCAL_RANK", "Lightning")
        if local >= nproc:
            raise DistEnvError(f"LOCAL_RANK={local} but {VARIABLE} says {nproc} worker(s) per "
                               f"node. Fix: let Lightning start its workers (do not set "
                               f"LOCAL_RANK or {VARIABLE} by hand).")
        r.set("local_rank", local, "LOCAL_RANK (set by Lightning for the workers it starts)")
        r.set("local_world_size", nproc, why + ": the Trainer's devices")
        node_rank = node.get("node_rank")
        if node_rank is not None:
            r.set("rank", node_rank * nproc + local,
                  "node_rank x nproc_per_node + LOCAL_RANK (Lightning numbers its workers so)")
        r.notes.append(f"a worker Lightning started from the {node.get('launcher')} process of "
                       f"node {node_rank}")


SOURCE = LightningNode()
