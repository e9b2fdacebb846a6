"""HPE Cray PALS: HPE's PBS `mpiexec`, and the PALS variables other launchers add.

PALS describes a job to Cray's PMI through variables and a binary file, the *apinfo*
(`PALS_APINFO`, every rank's node and every node's host: `distenv.discovery.apinfo`). Two kinds of
launch carry them:

* **Another launcher's task** -- SLURM's ``--mpi=cray_shasta`` plugin and Flux's
  ``cray-pals`` shell plugin add the PALS variables to tasks their own variables describe.
  That launcher's source reads them (`detect` steps aside; nesting, as for MPI inside
  ``sbatch``), and `distenv.discovery.apinfo` fills what its variables cannot prove. The proof that the
  PALS variables belong to that very task: SLURM's plugin sets ``PALS_APID=<job>.<step>`` and
  ``PALS_RANKID`` = the global task id (``mpi_cray_shasta.c``, ``mpi_p_slurmstepd_task``;
  measured on two nodes, block, cyclic, arbitrary and heterogeneous: ``PALS_APID`` =
  ``$SLURM_JOB_ID.$SLURM_STEP_ID``, ``PALS_RANKID`` = ``SLURM_PROCID``); Flux's sets
  ``PALS_RANKID`` to the task rank (flux-coral2 ``cray_pals.c``).
* **HPE's own PBS mpiexec**, read here. It sets (HPE's PALS documentation, as ALCF's and
  flux-coral2's lists quote it) ``PALS_RANKID``, ``PALS_LOCAL_RANKID``, ``PALS_LOCAL_SIZE``,
  ``PALS_NODEID``, ``PALS_DEPTH``, ``PALS_APID``, ``PALS_APINFO``, and Cray PMI's ``PMI_RANK``,
  ``PMI_SIZE``, ``PMI_LOCAL_RANK``, ``PMI_LOCAL_SIZE``. There is no PALS world-size
  variable (``PMI_SIZE`` gives it).

====================  ==================================================================
field                 rule and its proof
====================  ==================================================================
rank                  PALS_RANKID (PMI_RANK must agree)
world_size            PMI_SIZE
local_rank            PALS_LOCAL_RANKID, else PMI_LOCAL_RANK
local_world_size      PALS_LOCAL_SIZE, else PMI_LOCAL_SIZE
node_rank             **not PALS_NODEID**: that is the node's index in the application's
                      node list ("head compute node is 0"), not distenv's order of nodes
                      by their lowest rank -- measured under SLURM's plugin with
                      ``--distribution=arbitrary -w node2,node1,node1,node2``: rank 0 on
                      node2 has PALS_NODEID=1; in a heterogeneous step PALS_NODEID even
                      disagrees with the apinfo's own node index. Unknown here;
                      `distenv.discovery.apinfo` proves it from the file at discovery time.
master_addr           unknown (no variable names rank 0's host); `distenv.discovery.apinfo`.
master_port           derived from PALS_APID (one application id for all ranks), else
                      PBS_JOBID.
====================  ==================================================================
"""

from __future__ import annotations

from ..core.description import PER_PROCESS, Note
from ..errors import DistEnvError
from . import Doctor, Launch, PassOn, Services, Source
from ..core.reading import first_int

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading

#: The variables naming the job ids of a SLURM task: its own, and under a heterogeneous job
#: each component's (SLURM 22.05 names them PACK_GROUP, later versions HET_GROUP).
_SLURM_JOB_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")
_SLURM_GROUP_PREFIXES = ("SLURM_JOB_ID_PACK_GROUP_", "SLURM_JOB_ID_HET_GROUP_")


def _slurm_step(env: "Env") -> "tuple[str, set[str]] | None":
    """(this SLURM task's step id, its job ids) in a step, else None."""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if step is None or "SLURM_PROCID" not in env:
        return None
    jobs = {env[v] for v in _SLURM_JOB_VARS if env.get(v)}
    jobs.update(env[k] for k in env if k.startswith(_SLURM_GROUP_PREFIXES) and env[k])
    return step, jobs


def other_step(env: "Env") -> "str | None":
    """The step PALS_APID names when it is another step of this SLURM task's job than its own,
    else None. SLURM's cray_shasta plugin sets PALS_APID=<job>.<step> for its own step only,
    and srun passes the caller's environment on: a task of `srun --mpi=pmix` started by a
    script that itself runs in a cray_shasta step carries that step's PALS_* variables, which
    say nothing of this task (rank, apinfo file)."""
    here = _slurm_step(env)
    if here is None:
        return None
    step, jobs = here
    apid = env.get("PALS_APID", "")
    for job in jobs:
        if apid.startswith(job + ".") and apid[len(job) + 1:] != step:
            return apid[len(job) + 1:]
    return None


def carried_by(env: "Env") -> "str | None":
    """The launcher ("slurm", "flux") whose task these PALS variables describe, where its own
    variables prove it (module docstring), else None. A SLURM step whose PALS_APID matches
    but whose PALS_RANKID does not is a mix of two launches: an error. PALS variables of
    another step of the job (`other_step`) leave the task to SLURM too."""
    apid, rank = env.get("PALS_APID", ""), env.get("PALS_RANKID")
    here = _slurm_step(env)
    if here is not None:
        step, jobs = here
        if other_step(env) is not None:
            return "slurm"
        if any(apid == f"{job}.{step}" for job in jobs):
            if rank != env["SLURM_PROCID"]:
                raise DistEnvError(
                    f"PALS_RANKID={rank} but SLURM_PROCID={env['SLURM_PROCID']} in the step "
                    f"PALS_APID={apid} names: the variables are mixed from two launches. Fix: "
                    "run the script through srun in this allocation, and do not copy PALS_* or "
                    "SLURM_* variables from another job into its environment.")
            return "slurm"
    if "FLUX_TASK_RANK" in env and env["FLUX_TASK_RANK"] == rank:
        return "flux"
    return None


class Pals(Source):
    name = "pals"
    title = "Cray PALS"
    family = "mpi"
    launch = Launch(can_be_per_node=True)
    services = Services("apinfo")
    passing = PassOn(how="mpiexec --env {name}={value}")
    doctor = Doctor(command="mpiexec", programs=("mpiexec",))
    prefixes = ('PALS_', 'PMI_')

    def detect(self, env: "Env") -> bool:
        # Under srun --mpi=cray_shasta or Flux's cray-pals, that launcher's source reads the
        # task (it is later in the registry) and the apinfo service completes it.
        return carried_by(env) is None

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        r.int_from(env, "rank", "PALS_RANKID", self.title)
        pmi_rank = env.get("PMI_RANK")
        if pmi_rank is not None and pmi_rank.strip() != str(r.get("rank")):
            raise DistEnvError(f"PALS_RANKID={env['PALS_RANKID']} but PMI_RANK={pmi_rank}: the "
                               "variables are mixed from two launches. Fix: start every rank "
                               "with one mpiexec and do not copy PMI_* or PALS_* variables "
                               "between jobs.")
        r.int_from(env, "world_size", "PMI_SIZE", self.title, minimum=1)
        value, var = first_int(env, ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"), self.title)
        r.set("local_rank", value, f"{var}={value}")
        value, var = first_int(env, ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"), self.title)
        r.set("local_world_size", value, f"{var}={value}")
        if "PALS_NODEID" in env:
            r.notes.append(Note(
                f"PALS_NODEID={env['PALS_NODEID']} is this node's index in PALS's node list, "
                "not the order of nodes by their lowest rank, so the node rank is not taken "
                "from it. Fix: call distenv.discover() (it reads PALS_APINFO), or set NODE_RANK",
                about="node_rank"))
        job = env.get("PBS_JOBID") or env.get("PALS_APID")
        r.set("job_id", job, "PBS_JOBID" if env.get("PBS_JOBID") else "PALS_APID")
        apid = env.get("PALS_APID") or env.get("PBS_JOBID")  # one application id for all ranks
        if apid:
            r.port_key = "pals:" + apid


SOURCE = Pals()
