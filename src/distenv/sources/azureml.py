"""Azure ML jobs (platform overlay; Azure itself launches with Open MPI, with the
plain torch variables (PyTorch jobs), or with TF_CONFIG (TensorFlow jobs)).

AZ_BATCH_MASTER_NODE="<addr>:<port>" (multi-node) and AZ_BATCHAI_MPI_MASTER_NODE=<addr>
(one node) name the node where Azure starts rank 0. Azure warns that
OMPI_COMM_WORLD_NODE_RANK is not a node rank; with process_count_per_node=1 an MPI job is
a per-node launch (OMPI_COMM_WORLD_RANK = node rank), which the resolver handles when
several GPUs are visible or DISTENV_NPROC_PER_NODE asks for more workers per node.

Inferred (docs/inferences.md): master from Azure's own master-node variables, unless the
launcher inside the job set its own MASTER_ADDR (torchrun, DeepSpeed: their rank 0 need not
be on Azure's master node); block layout (the same count per node, in rank order) for MPI and
PyTorch jobs.
"""

from __future__ import annotations

from ..errors import DistEnvError
from ..core.reading import show
from . import Launch, Source
from ._common import block_layout, platform_hosts, platform_master

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env, Reading


class AzureML(Source):
    name = "azureml"
    title = "Azure ML"
    family = "platform"
    prefixes = ('AZ_BATCH', 'AZUREML_')
    launch = Launch(per_node_platform=True)

    def overlay(self, env: "Env", r: "Reading") -> None:
        node = env.get("AZ_BATCH_MASTER_NODE")
        if node:
            addr, sep, _port = node.rpartition(":")
            if not sep or not addr:
                raise DistEnvError(f"AZ_BATCH_MASTER_NODE={show(node)} is not '<address>:<port>'. "
                                   "Fix: leave it as Azure ML writes it, or unset it.")
            # Azure starts rank 0 on this node. Its port is reserved for the Batch service
            # ("do not use it for MPI or NCCL"), so only the address is taken.
            platform_master(r, addr, "Azure ML's master node (AZ_BATCH_MASTER_NODE)",
                            "AZ_BATCH_MASTER_NODE (Azure ML's master node)")
        elif env.get("AZ_BATCHAI_MPI_MASTER_NODE"):
            platform_master(r, env["AZ_BATCHAI_MPI_MASTER_NODE"],
                            "Azure ML's master node (AZ_BATCHAI_MPI_MASTER_NODE)",
                            "AZ_BATCHAI_MPI_MASTER_NODE (Azure ML's master node)")
        hosts = [h.strip() for h in env.get("AZ_BATCH_HOST_LIST", "").split(",") if h.strip()]
        if hosts:
            platform_hosts(r, hosts, "AZ_BATCH_HOST_LIST")
        size, nodes = r.get("world_size"), r.get("num_nodes")
        if r.get("launcher") == "env" and r.get("local_world_size") is None and size and nodes \
                and size % nodes == 0:
            r.set("local_world_size", size // nodes,
                  "WORLD_SIZE / node count (Azure ML starts as many processes on every node)")
            r.default("nproc_per_node", size // nodes, "Azure ML: the same count on every node")
        if r.get("launcher") in ("openmpi", "env"):
            # Azure starts process_count_per_node processes on every node, in rank order.
            block_layout(r, "Azure ML starts the same number of processes on every node, in rank order")
        run = env.get("AZUREML_RUN_ID")
        if run:
            r.default("job_id", run, "AZUREML_RUN_ID")
            r.port_key = r.port_key or "azureml:" + run

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """AZ_BATCH_HOST_LIST in order, the same count on each: Azure starts the same number
        of processes per node in rank order -- proven only when the list's first host is the
        master node Azure names (else the list's order is unproven)."""
        if values.get("launcher") not in ("openmpi", "env"):
            return None
        listed = [h.strip() for h in env.get("AZ_BATCH_HOST_LIST", "").split(",") if h.strip()]
        if not listed or list(values["hosts"]) != listed or values.get("master_addr") != listed[0]:
            return None
        from ..core.placement import repeated

        per = values.get("nproc_per_node")
        return repeated(values, f"AZ_BATCH_HOST_LIST in order, {per} each (Azure ML starts the "
                                "same count per node in rank order; its first host is the master node)")


SOURCE = AzureML()
