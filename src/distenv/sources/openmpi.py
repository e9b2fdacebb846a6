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
from . import Source
from ._common import read_counts


def _small_int(text: str) -> bool:
    """ASCII digits of sane length (str.isdigit() accepts '²', and int() of 5000 digits fails)."""
    return text.isascii() and text.isdigit() and len(text) <= 12


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
    family = "mpi"
    prefixes = ('OMPI_', 'PMIX_', 'PRTE_', 'ORTE_')
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
            family = uri.split(";", 1)[0]
            jobid = env.get("OMPI_MCA_ess_base_jobid") or family
            r.set("job_id", jobid, "OMPI_MCA_ess_base_jobid" if env.get("OMPI_MCA_ess_base_jobid")
                  else "job family in OMPI_MCA_orte_hnp_uri")
            r.port_key = f"ompi:{family}:{jobid}"
            addr = hnp_address(uri)
            daemon = env.get("OMPI_MCA_orte_local_daemon_uri", "").split(";", 1)[0]
            daemons = env.get("OMPI_MCA_ess_base_num_procs", "")
            nodes = r.get("num_nodes")
            if _small_int(daemons) and nodes is not None and int(daemons) > nodes:
                # More daemons than nodes with ranks (measured: set on ranks started by a
                # remote daemon): mpirun runs a daemon on a host that has no rank.
                self._not_on_mpirun_host(r, "OMPI_MCA_ess_base_num_procs > OMPI_MCA_orte_num_nodes")
            elif addr and self._hnp_hosts_rank0(r, daemon, family, "OMPI_MCA_orte_local_daemon_uri"):
                r.set("master_addr", addr,
                      "OMPI_MCA_orte_hnp_uri (the mpirun host, where Open MPI maps rank 0)")
        elif namespace:  # Open MPI 5 (or 4 with external PMIx)
            r.set("job_id", namespace, "PMIX_NAMESPACE")
            r.port_key = "pmix:" + namespace
            host = prterun_host(namespace)
            server = env.get("PMIX_SERVER_URI41") or env.get("PMIX_SERVER_URI4") or ""
            daemon = server.split(";", 1)[0]
            here = env.get("PMIX_HOSTNAME")
            if host and r.get("rank") == 0 and here and here != host:
                self._not_on_mpirun_host(r, "PMIX_HOSTNAME")
            elif host and self._hnp_hosts_rank0(r, daemon, namespace.split("@")[0] + "@0.0",
                                                 "PMIX_SERVER_URI4"):
                r.set("master_addr", host,
                      "PMIX_NAMESPACE (prterun-<mpirun host>-<pid>: rank 0 runs on the mpirun host)")

    def _hnp_hosts_rank0(self, r, daemon: str, hnp: str, var: str) -> bool:
        """Is the mpirun host (daemon 0) where rank 0 runs, as far as this rank can tell?

        Daemons are numbered 0 (mpirun) then 1, 2, ... for the other nodes. On rank 0 a
        daemon other than mpirun's means mpirun runs elsewhere (a login node, a Kubeflow
        launcher pod); on any rank a daemon number >= the node count means mpirun's host
        runs no rank at all. Either way the address is unknown, not mpirun's.
        """
        if not daemon or "." not in daemon:
            return True
        job, _, vpid = daemon.rpartition(".")
        if not _small_int(vpid):
            return True
        nodes = r.get("num_nodes")
        if (r.get("rank") == 0 and daemon != hnp) or (nodes is not None and int(vpid) >= nodes):
            self._not_on_mpirun_host(r, var)
            return False
        return True

    @staticmethod
    def _not_on_mpirun_host(r, var):
        r.notes.append(
            f"mpirun's host runs no rank here ({var}), so rank 0's address is unknown: "
            "start mpirun on the first node of the job, or set MASTER_ADDR"
        )


SOURCE = OpenMPI()
