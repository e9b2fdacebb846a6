"""Kubeflow: PyTorchJob (training-operator v1) and Trainer v2 TrainJob.

Both set torchrun's own variables PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR, PET_MASTER_PORT for a `torchrun` in the pod to read. When the pod runs
the script directly, the pod is a node and its workers are yet to be started: a per-node
launch. v1 also sets RANK = *pod* index and WORLD_SIZE = pods x nprocPerNode, so with
more than one process per pod RANK is a node rank, not a global rank.

Inferred (docs/inferences.md): nothing beyond the PET_* variables the operator sets.
"""

from __future__ import annotations

from ..core.description import PER_NODE
from ..errors import DistEnvError
from ..core.reading import get_int, parse_int
from . import Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


def parse_nnodes(raw: str, name: str) -> int:
    # torchrun accepts "N" or an elastic range "MIN:MAX"; only a fixed size is a size.
    if ":" in raw:
        low, _, high = raw.partition(":")
        lo, hi = parse_int(low, name), parse_int(high, name)
        if lo != hi:
            raise DistEnvError(
                f"{name}={raw!r} is an elastic range: the node count is decided at rendezvous. "
                "Fix: run torchrun in the pod (it reads PET_*), or set a fixed node count."
            )
        return lo
    return parse_int(raw, name, minimum=1)


class Kubeflow(Source):
    name = "kubeflow"
    title = "Kubeflow"
    family = "platform"
    prefixes = ('PET_',)
    owns = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_NODE
        r.set("launcher", "kubeflow", "PET_* variables without torchrun: the pod is a node")
        node = get_int(env, "PET_NODE_RANK", "Kubeflow")
        if node is not None:
            r.set("node_rank", node, f"PET_NODE_RANK={node}")
        else:
            node = get_int(env, "RANK", "Kubeflow")
            r.set("node_rank", node, f"RANK={node} (PyTorchJob v1: the pod index)")
        if env.get("PET_NNODES"):
            r.set("num_nodes", parse_nnodes(env["PET_NNODES"], "PET_NNODES"), "PET_NNODES")
        nproc = env.get("PET_NPROC_PER_NODE")
        if nproc:
            r.nproc_source = (nproc.strip(), f"PET_NPROC_PER_NODE={nproc}")
        addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
        r.set("master_addr", addr, "PET_MASTER_ADDR" if env.get("PET_MASTER_ADDR") else "MASTER_ADDR")
        for var in ("PET_MASTER_PORT", "MASTER_PORT"):
            if env.get(var):
                r.int_from(env, "master_port", var, "Kubeflow", minimum=1)
                break

    def after(self, env: "Env", r: "Reading") -> None:
        """v1 check once nproc is known: WORLD_SIZE must be pods x nprocPerNode."""
        nproc = env.get("PET_NPROC_PER_NODE", "").strip()
        if nproc and not nproc.isdigit():
            return  # the operator counted one process per pod for auto/gpu/cpu
        size = get_int(env, "WORLD_SIZE", "Kubeflow")
        total = r.get("world_size")
        if size is not None and total is not None and size != total:
            per = r.get("nproc_per_node")
            shape = (f"{r.get('num_nodes')} pods ({r.why.get('num_nodes')}) x {per} processes "
                     f"per pod ({r.why.get('nproc_per_node')}) = {total}")
            if nproc != str(per):
                # the workers per pod were asked of distenv (distenv run --nproc-per-node,
                # DISTENV_NPROC_PER_NODE), not of the operator, whose WORLD_SIZE counts its own
                raise DistEnvError(
                    f"WORLD_SIZE={size}, the operator's count, contradicts {shape}. Fix: drop "
                    f"--nproc-per-node (DISTENV_NPROC_PER_NODE), or set nprocPerNode: {per} in "
                    "the PyTorchJob (the operator's WORLD_SIZE then counts them).")
            raise DistEnvError(
                f"WORLD_SIZE={size} contradicts {shape}. Fix: unset WORLD_SIZE in the pod spec "
                "(the operator's PET_* variables give the job's size), or make the replica "
                "count and nprocPerNode match it."
            )


SOURCE = Kubeflow()
