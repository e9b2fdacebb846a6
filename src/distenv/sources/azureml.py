"""Azure ML jobs (platform overlay; Azure itself launches with Open MPI, with the
plain torch variables (PyTorch jobs), or with TF_CONFIG (TensorFlow jobs)).

AZ_BATCH_MASTER_NODE="<addr>:<port>" (multi-node) and AZ_BATCHAI_MPI_MASTER_NODE=<addr>
(one node) name the node where Azure starts rank 0. Azure warns that
OMPI_COMM_WORLD_NODE_RANK is not a node rank; with process_count_per_node=1 an MPI job is
a per-node launch (OMPI_COMM_WORLD_RANK = node rank), which the resolver handles when
several GPUs are visible or DISTENV_NPROC_PER_NODE asks for more workers per node.
"""

from __future__ import annotations

from ..errors import DistEnvError
from ..reading import parse_int, show
from . import Source


class AzureML(Source):
    name = "azureml"
    title = "Azure ML"
    per_node_platform = True

    def overlay(self, env, r):
        node = env.get("AZ_BATCH_MASTER_NODE")
        if node:
            addr, sep, port = node.rpartition(":")
            if not sep or not addr:
                raise DistEnvError(
                    f"AZ_BATCH_MASTER_NODE={show(node)} is not '<address>:<port>'."
                )
            # Azure starts rank 0 on this node: it is more reliable than Open MPI's guess.
            r.set("master_addr", addr, "AZ_BATCH_MASTER_NODE (Azure ML's master node)")
            r.set("master_port", parse_int(port, "AZ_BATCH_MASTER_NODE port", "Azure ML", 1),
                  "AZ_BATCH_MASTER_NODE (Azure ML's master port)")
        elif env.get("AZ_BATCHAI_MPI_MASTER_NODE"):
            r.set("master_addr", env["AZ_BATCHAI_MPI_MASTER_NODE"],
                  "AZ_BATCHAI_MPI_MASTER_NODE (Azure ML's master node)")
        run = env.get("AZUREML_RUN_ID")
        if run:
            r.default("job_id", run, "AZUREML_RUN_ID")
            r.port_key = r.port_key or "azureml:" + run


SOURCE = AzureML()
