"""Open MPI 4 (ORTE) and 5 (PRRTE/PMIx) `mpirun`.

Traps: OMPI_COMM_WORLD_NODE_RANK is a *local* index, not a node index; Open MPI 5 numbers
local ranks out of rank order; OMPI_UNIVERSE_SIZE counts slots. No node index is given, so
node_rank is known only on one node.

Read directly: rank, size, local rank and size (OMPI_COMM_WORLD_*), the node count
(OMPI_MCA_orte_num_nodes, Open MPI 4), the job id. Inferred (docs/inferences.md):

=================  =====================================================================
field              rule and its proof
=================  =====================================================================
master_addr,       The mpirun host (its addresses are in OMPI_MCA_orte_hnp_uri), only
Open MPI 4         when ORTE's own rule puts rank 0 there: ORTE lists the target nodes
                   in daemon order with mpirun's node (daemon 0) first
                   (``orte_rmaps_base_get_target_nodes``, orte/mca/rmaps/base/
                   rmaps_base_support_fns.c: "if the hnp was allocated, include it",
                   then the pool "in daemon order"), and its round-robin and ppr
                   mappers give rank 0 the first target node. Measured on two nodes:
                   ``-H node2:2,node1:2`` and a host file listing node2 first, started
                   on node1, both put rank 0 on node1. The rule does not hold, and the
                   address is unknown, when: mpirun's host runs no rank (daemon count
                   OMPI_MCA_ess_base_num_procs > node count; rank 0's daemon is not
                   mpirun's); several app contexts (OMPI_NUM_APP_CTX > 1, MPMD
                   ``-np 1 -H node2 a : -np 2 -H node1 b`` put rank 0 on node2, measured:
                   ranks of the later contexts cannot tell); a user mapping (a rankfile,
                   OMPI_MCA_orte_rankfile; ``--map-by seq`` / ``-mca rmaps seq``, which
                   follow the host file: measured rank 0 on node2). With a user mapping
                   OMPI_MCA_orte_num_nodes also differs between ranks (4 and 2 measured
                   on two nodes), so the node count is unknown too. The address: the
                   URI's one IPv4 address other than loopback, else its one global IPv6
                   address (``tcp6://[fe80::..,2620::..]:port``, JAX's ompi_cluster example);
                   a link-local IPv6 one is unusable without its zone, which the URI lacks.
                   Several: unknown. ORTE advertises every interface and its daemons try
                   each in turn; measured here, the first (192.0.2.2, the host's outside
                   bridge) was one the nodes could not reach (integrations/cluster/README.md,
                   item 5), and a docker0 or BMC address is the same on every node.
master_addr,       Unknown across nodes. PRRTE maps by its host list (-H, host file or
Open MPI 5         allocation order), which no rank sees: ``-H node2:2,node1:2`` started
                   on node1 put rank 0 on node2 while ranks 2 and 3 on node1 saw exactly
                   what rank 0 and 1 see in the ordinary ``-H node1:2,node2:2`` layout
                   (same daemon, same PMIX_NAMESPACE; measured). Set MASTER_ADDR
                   (``mpirun -x MASTER_ADDR=<first host>``) or call distenv.discover().
master_port        Derived from the job id (Open MPI 4: job family in the HNP URI and
                   OMPI_MCA_ess_base_jobid; Open MPI 5: PMIX_NAMESPACE), the same in
                   every rank (measured, MPMD included).
num_nodes = 1      world size = local world size (the resolver): then loopback.
=================  =====================================================================
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Doctor, Frameworks, Launch, PassOn, Services, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


def _small_int(text: str) -> bool:
    """ASCII digits of sane length (str.isdigit() accepts '²', and int() of 5000 digits fails)."""
    return text.isascii() and text.isdigit() and len(text) <= 12


def hnp_addresses(uri: str) -> "list[str]":
    """The mpirun host's usable addresses in
    '<jobfam>.0;tcp://a,b:port;tcp6://[x,y]:port': its IPv4 ones other than loopback, else its
    global IPv6 ones (unbracketed). A link-local IPv6 address (fe80::/10) is skipped: without
    its zone (the interface, which the URI does not carry) no other host can connect to it."""
    four: "list[str]" = []
    six: "list[str]" = []
    for part in uri.split(";"):
        if part.startswith("tcp://"):
            addrs = part[len("tcp://"):].rsplit(":", 1)[0]
            four += [a for a in (x.strip() for x in addrs.split(",")) if a and a != "127.0.0.1"
                     and a not in four]
        elif part.startswith("tcp6://["):
            inner = part[len("tcp6://["):].split("]", 1)[0]
            six += [a for a in (x.strip() for x in inner.split(",")) if _global_ipv6(a) and a not in six]
    return four or six


def _global_ipv6(addr: str) -> bool:
    import ipaddress  # lazy: only an IPv6-only URI gets here

    try:
        ip = ipaddress.IPv6Address(addr)
    except ValueError:
        return False
    return not (ip.is_link_local or ip.is_loopback or ip.is_unspecified or ip.is_multicast)


def user_mapping(env: "Env") -> "str | None":
    """The variable that says ranks were mapped by the user, not by ORTE's round robin over
    the target nodes (measured: mpirun passes -rf and --map-by seq on as these)."""
    for var in ("OMPI_MCA_orte_rankfile", "OMPI_MCA_rmaps_rank_file_path"):
        if env.get(var):
            return f"{var}={env[var]} (a rankfile places rank 0)"
    policy = env.get("OMPI_MCA_rmaps_base_mapping_policy", "")
    if policy.split(":", 1)[0].strip().lower() == "seq":
        return f"OMPI_MCA_rmaps_base_mapping_policy={policy} (ranks follow the host file)"
    mappers = env.get("OMPI_MCA_rmaps", "")
    if any(m in mappers for m in ("seq", "rank_file")):
        return f"OMPI_MCA_rmaps={mappers} (ranks follow the host file or rankfile)"
    return None


class OpenMPI(Source):
    name = "openmpi"
    title = "Open MPI"
    launch = Launch(aliases=("openmpi", "ompi"), can_be_per_node=True)
    services = Services("pmix")
    passing = PassOn(
        how="mpirun -x {name}",
        only=True,  # mpirun forwards to other nodes only the variables -x names
        # Open MPI 4 passes --tag-output on as a variable; Open MPI 5 only in mpirun's options
        # (--tag-output, -tag-output, or --output tag[,...]). Debian names it mpirun.openmpi.
        label_var=("OMPI_MCA_orte_tag_output", ("1", "true", "yes", "on"), "mpirun --tag-output"),
        label_options={name: ("--tag-output", "-tag-output")
                         for name in ("mpirun", "mpiexec", "orterun", "prterun", "mpirun.openmpi",
                                      "mpiexec.openmpi")},
    )
    frameworks = Frameworks(
        mpi_controller=("horovod",),  # Horovod is usually built with Open MPI
        covers=("jax:ompi", "jax:prrte"),  # JAX reads these variables too (jax/_src/clusters)
    )
    doctor = Doctor(
        var="OMPI_VERSION",  # Open MPI 5 sets it in every rank (recorded: openmpi5-np4)
        command="mpirun",
        programs=("mpirun", "mpiexec", "orterun", "prterun", "prte", "orted", "prted"),
        daemons=("orted", "prted"),
        job_prefixes=("OMPI_", "PMIX_", "PRTE_", "ORTE_"),
    )
    family = "mpi"
    prefixes = ("OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "OMPI_MCA_ess_", "OMPI_MCA_rmaps", "OMPI_VERSION",
                "OMPI_NUM_APP_CTX", "PMIX_RANK", "PMIX_NAMESPACE", "PMIX_HOSTNAME")

    def read(self, env: "Env", r: "Reading") -> None:
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
            addrs = hnp_addresses(uri)
            addr = addrs[0] if len(addrs) == 1 else None
            daemon = env.get("OMPI_MCA_orte_local_daemon_uri", "").split(";", 1)[0]
            daemons = env.get("OMPI_MCA_ess_base_num_procs", "")
            nodes = r.get("num_nodes")
            apps = env.get("OMPI_NUM_APP_CTX", "1").strip()
            user = user_mapping(env)
            if user:
                # ORTE's node count then differs between ranks (measured): not a count.
                r.values.pop("num_nodes", None)
                r.why.pop("num_nodes", None)
                self._unknown(r, user)
            elif apps != "1":
                self._unknown(r, f"OMPI_NUM_APP_CTX={apps} (an MPMD launch: rank 0's app "
                                 "context may run on other hosts)")
            elif _small_int(daemons) and nodes is not None and int(daemons) > nodes:
                # More daemons than nodes with ranks (measured: set on ranks started by a
                # remote daemon): mpirun runs a daemon on a host that has no rank.
                self._not_on_mpirun_host(r, "OMPI_MCA_ess_base_num_procs > OMPI_MCA_orte_num_nodes")
            elif addr is None:
                if nodes != 1 and r.get("world_size") != r.get("local_world_size"):
                    if addrs:
                        self._unknown(r, f"OMPI_MCA_orte_hnp_uri lists {len(addrs)} addresses of "
                                         f"the mpirun host ({', '.join(addrs)}), and which one the "
                                         "other nodes reach is in no variable (ORTE's daemons try "
                                         "each in turn)", "mpirun --mca oob_tcp_if_include <the "
                                         "nodes' network> (then it lists one), ")
                    else:
                        self._unknown(r, "OMPI_MCA_orte_hnp_uri lists no address another node can "
                                         "reach (only loopback or link-local IPv6, which needs its zone)")
            elif self._hnp_hosts_rank0(r, daemon, family, "OMPI_MCA_orte_local_daemon_uri"):
                r.set("master_addr", addr,
                      "OMPI_MCA_orte_hnp_uri (the mpirun host: ORTE maps rank 0 to the first "
                      "target node, mpirun's own)")
        elif namespace:  # Open MPI 5 (or 4 with external PMIx)
            r.set("job_id", namespace, "PMIX_NAMESPACE")
            r.port_key = "pmix:" + namespace
            size, local = r.get("world_size"), r.get("local_world_size")
            if size is None or local is None or size != local:
                r.notes.append(
                    "Open MPI 5 maps ranks by its host list (-H, host file or allocation "
                    "order), which the ranks do not see: rank 0's address is unknown across "
                    "nodes. Fix: mpirun -x MASTER_ADDR=<first host>, or call distenv.discover()"
                )

    def _hnp_hosts_rank0(self, r: "Reading", daemon: str, hnp: str, var: str) -> bool:
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
    def _not_on_mpirun_host(r: "Reading", var: str) -> None:
        r.notes.append(
            f"mpirun's host runs no rank here ({var}), so rank 0's address is unknown. Fix: "
            "start mpirun on the first node of the job, or mpirun -x MASTER_ADDR=<rank 0's "
            "host>, or call distenv.discover()"
        )

    @staticmethod
    def _unknown(r: "Reading", why: str, first: str = "") -> None:
        r.notes.append(f"{why}: rank 0's address is unknown. Fix: {first}mpirun -x MASTER_ADDR=<rank "
                       "0's host>, or call distenv.discover()")


SOURCE = OpenMPI()
