"""Open MPI 4 (ORTE) and 5 (PRRTE/PMIx) `mpirun`.

Traps: OMPI_COMM_WORLD_NODE_RANK is a *local* index, not a node index; Open MPI 5 numbers
local ranks out of rank order; OMPI_UNIVERSE_SIZE counts slots. No node index is given, so
node_rank is known only on one node. The master address: Open MPI 4 gives the addresses of
the mpirun host in OMPI_MCA_orte_hnp_uri, Open MPI 5 its name in PMIX_NAMESPACE. Open MPI
maps rank 0 to the first node of the job, which is the mpirun host whenever that host
takes part (the usual case: mpirun from the first node of an allocation).
"""

from __future__ import annotations

from ..description import PER_PROCESS
from ..errors import DistEnvError
from . import Source
from ._common import read_counts


def hnp_address(uri: str) -> "str | None":
    """The first IPv4 address in '<jobfam>.0;tcp://a,b:port;tcp6://[..]:port'."""
    for part in uri.split(";"):
        if part.startswith("tcp://"):
            addrs = part[len("tcp://"):].rsplit(":", 1)[0]
            for addr in addrs.split(","):
                addr = addr.strip()
                if addr and addr != "127.0.0.1":
                    return addr
    return None


def prterun_host(namespace: str) -> "str | None":
    """'prterun-<host>-<pid>@1' -> '<host>' (host names may contain '-')."""
    if not namespace.startswith("prterun-"):
        return None
    body = namespace[len("prterun-"):].split("@", 1)[0]
    host, sep, pid = body.rpartition("-")
    return host if sep and host and pid.isdigit() else None


class OpenMPI(Source):
    name = "openmpi"
    title = "Open MPI"
    aliases = ("openmpi", "ompi")
    can_be_per_node = True

    def read(self, env, r):
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
        r.int_from(env, "num_nodes", "OMPI_MCA_orte_num_nodes", self.title, minimum=1)

        uri = env.get("OMPI_MCA_orte_hnp_uri")
        namespace = env.get("PMIX_NAMESPACE", "")
        if uri:  # Open MPI 4
            jobid = env.get("OMPI_MCA_ess_base_jobid") or uri.split(";", 1)[0]
            r.set("job_id", jobid, "OMPI_MCA_ess_base_jobid" if env.get("OMPI_MCA_ess_base_jobid")
                  else "job family in OMPI_MCA_orte_hnp_uri")
            r.port_key = "ompi:" + uri.split(";", 1)[0] + ":" + jobid
            addr = hnp_address(uri)
            if addr:
                r.set("master_addr", addr,
                      "OMPI_MCA_orte_hnp_uri (the mpirun host, where Open MPI maps rank 0)")
                self._check_rank0_on_hnp(env, r, uri)
        elif namespace:  # Open MPI 5 (or 4 with external PMIx)
            r.set("job_id", namespace, "PMIX_NAMESPACE")
            r.port_key = "pmix:" + namespace
            host = prterun_host(namespace)
            if host:
                r.set("master_addr", host,
                      "PMIX_NAMESPACE (prterun-<mpirun host>-<pid>: rank 0 runs on the mpirun host)")

    @staticmethod
    def _check_rank0_on_hnp(env, r, uri):
        # On the mpirun host the local daemon *is* mpirun. If rank 0 is elsewhere (mpirun on
        # a login node not in the host file), say so on rank 0 rather than hang the others.
        daemon = env.get("OMPI_MCA_orte_local_daemon_uri")
        if r.get("rank") == 0 and daemon and daemon.split(";", 1)[0] != uri.split(";", 1)[0]:
            raise DistEnvError(
                "Open MPI rank 0 does not run on the mpirun host (OMPI_MCA_orte_local_daemon_uri "
                "differs from OMPI_MCA_orte_hnp_uri), so the master address is unknown. "
                "Fix: start mpirun on the first node of the job, or set MASTER_ADDR."
            )


SOURCE = OpenMPI()
