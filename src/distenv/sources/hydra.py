"""MPICH and Intel MPI, both started by the Hydra process manager (`mpiexec`).

Hydra gives PMI_RANK/PMI_SIZE (with `-pmi-port`: PMI_ID and *no size*) and the local
MPI_LOCALRANKID/MPI_LOCALNRANKS; Intel MPI adds HYDRA_BSTRAP_NODE_ID, a node index.
No head-node address is given. SLURM's own PMI-2 plugin also sets PMI_RANK, but not
MPI_LOCALRANKID, so those processes are left to the SLURM source.

Inferred (docs/inferences.md has every launcher's table):

==============  ==========================================================================
field           rule and its proof
==============  ==========================================================================
node_rank       HYDRA_BSTRAP_NODE_ID (Intel MPI): Hydra's proxy index. Taken as the node's
                place by lowest rank because Hydra starts proxies in the order it hands
                out ranks -- measured on two nodes: ``-hosts node1,node2 -ppn 2``,
                ``-hosts node2,node1 -ppn 2`` and the MPMD ``-n 1 -host node2 : -n 2
                -host node1`` all gave node 0 to rank 0's host.
num_nodes = 1   world size = local world size (the resolver); then loopback master.
master_addr     unknown across nodes (Hydra reveals no head node); the adapters can
                complete it through Hydra's PMI key-value service (distenv.discovery).
master_port     derived from I_MPI_HYDRA_UUID (Intel MPI, the same on every rank:
                measured) or PMI_KVSNAME (the job's key-value space). Never from PMI_PORT:
                with ``-pmi-port`` it is the local proxy's host:port, different on every
                node (measured, MPICH 4 and 5 on two nodes: node1:40463 and node2:36967),
                so ranks derived different ports. Without a job-wide value: torch's
                default 29500 (MPICH reveals no job id, measured).
==============  ==========================================================================
"""

from __future__ import annotations

from ..core.description import PER_PROCESS, Note
from . import Doctor, Launch, PassOn, Services, Source
from ..errors import DistEnvError
from ..core.reading import first_int

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class Hydra(Source):
    name = "mpich"
    title = "MPICH (Hydra)"
    family = "mpi"
    launch = Launch(aliases=("mpich", "intelmpi", "impi", "hydra"), can_be_per_node=True)
    services = Services("pmi")
    passing = PassOn(
        how="mpiexec -genv {name} {value}",
        # Hydra's mpiexec -l / -prepend-rank, under any of its names (MPICH installs mpiexec too)
        label_options={name: ("-l", "-prepend-rank", "--prepend-rank")
                         for name in ("mpiexec", "mpiexec.hydra", "mpiexec.mpich", "mpiexec.*")},
    )
    doctor = Doctor(
        command="mpiexec",
        commands={"intelmpi": "mpiexec.hydra"},
        programs=("mpiexec", "mpirun", "mpiexec.hydra", "hydra_pmi_proxy", "hydra_bstrap_proxy"),
        daemons=("hydra_pmi_proxy", "hydra_bstrap_proxy"),
        job_prefixes=("PMI_", "HYDRA_", "I_MPI_HYDRA", "MPI_LOCAL"),
    )
    prefixes = ('PMI_', 'MPI_LOCAL', 'HYDRA_', 'I_MPI_')

    def detect(self, env: "Env") -> bool:
        return "MPI_LOCALRANKID" in env

    def read(self, env: "Env", r: "Reading") -> None:
        intel = any(k.startswith("I_MPI_") for k in env) or "HYDRA_BSTRAP_NODE_ID" in env
        who = "Intel MPI" if intel else "MPICH"
        r.set("launcher", "intelmpi" if intel else "mpich",
              "I_MPI_*/HYDRA_BSTRAP_NODE_ID present" if intel else "PMI_RANK with MPI_LOCALRANKID")
        r.launch = PER_PROCESS
        if "PMI_ID" in env:
            # -pmi-port: Hydra sets PMI_ID and PMI_PORT only, and passes on PMI_RANK/PMI_SIZE
            # it inherited (measured, MPICH 4: an outer srun --mpi=pmi2 step's 0 and 4 on both
            # ranks of mpiexec -pmi-port -n 2): those are another launch's.
            value, var = first_int(env, ("PMI_ID",), who)
            stale = [f"{k}={env[k]}" for k in ("PMI_RANK", "PMI_SIZE") if k in env]
            if "PMI_RANK" in env and env["PMI_RANK"].strip() != str(value):
                raise DistEnvError(
                    f"PMI_ID={value} (Hydra -pmi-port: this rank) but {', '.join(stale)} came with "
                    "the environment mpiexec was started in (an outer launch's). Fix: unset "
                    "PMI_RANK PMI_SIZE PMI_FD before mpiexec (or run it without -pmi-port).")
        else:
            value, var = first_int(env, ("PMI_RANK",), who)
        r.set("rank", value, f"{var}={value}")
        if "PMI_ID" not in env:
            r.int_from(env, "world_size", "PMI_SIZE", who, minimum=1)
        if r.get("world_size") is None:
            r.notes.append(Note("Hydra with -pmi-port gives no world size (a PMI_SIZE is an outer "
                                "launch's). Fix: "
                                "run mpiexec without -pmi-port, or set WORLD_SIZE for every "
                                "rank", about="world_size"))
        r.int_from(env, "local_rank", "MPI_LOCALRANKID", who)
        r.int_from(env, "local_world_size", "MPI_LOCALNRANKS", who, minimum=1)
        r.int_from(env, "node_rank", "HYDRA_BSTRAP_NODE_ID", who)
        # MPICH gives no job id at all (measured); Intel MPI has I_MPI_HYDRA_UUID. Not
        # PMI_PORT (-pmi-port): it is the *local proxy's* host:port, different on every node
        # (measured, MPICH 4 on two nodes: ranks derived different ports). The key-value
        # exchange (distenv.discovery.complete) derives one from the job's kvsname instead.
        for var in ("I_MPI_HYDRA_UUID", "PMI_KVSNAME"):
            if env.get(var):
                r.port_key = f"hydra:{env[var]}"
                if var == "I_MPI_HYDRA_UUID":
                    r.set("job_id", env[var], var)
                break
        else:
            r.notes.append(Note("MPICH reveals no job id: the port shown is torch's default; "
                                "distenv's adapters and distenv run take the job's own from "
                                "Hydra's key-value service (distenv show --discover shows it). "
                                "Fix: a script that reads MASTER_PORT itself needs one per "
                                "concurrent job (mpiexec -genv MASTER_PORT <port>)",
                                about="master_port"))


SOURCE = Hydra()
