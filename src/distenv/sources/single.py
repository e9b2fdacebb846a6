"""A single process: nothing launched it distributed (or DISTENV_LAUNCHER=none).

Inferred (docs/inferences.md): nothing; one process is rank 0 of 1 on one node.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from ..errors import DistEnvError
from ..core.reading import show
from . import Launch, Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


#: Task variables that only srun gives a task beyond the first: a batch script (the one process
#: sbatch starts) is always task 0 on node 0 (SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0,
#: measured), and an salloc shell has none of them.
_SRUN_ONLY = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")


def _not_a_task(env: "Env") -> None:
    """A nonzero srun task index without a step (SLURM_STEP_ID) is neither a batch script
    nor an srun task: claiming rank 0 of 1 would be a guess (Lightning's SLURMEnvironment
    tests build such environments). The step variables were lost or stripped."""
    if "SLURM_STEP_ID" in env or "SLURM_STEPID" in env:
        return  # an srun task (DISTENV_LAUNCHER=none forced it here): its own description
    for var in _SRUN_ONLY:
        raw = env.get(var)
        if raw is not None and raw.strip() not in ("", "0"):
            raise DistEnvError(
                f"{var}={show(raw)} says this is SLURM task/node {raw.strip()}, but SLURM_STEP_ID "
                "is not set: this is neither a batch script (always task 0) nor an srun task, "
                "and distenv will not guess its rank. Fix: start the tasks with srun (which sets "
                "SLURM_STEP_ID) and keep its environment, or unset the copied SLURM_* variables."
            )


#: Variables of platforms that frameworks detect themselves and no distenv source reads:
#: without launcher variables they mean "perhaps not one process", and distenv's zero-code
#: paths leave the framework's own detection alone (they act only on distributed launches).
FRAMEWORK_PLATFORMS = (
    ("JOB_COMPLETION_INDEX", "a pod of a Kubernetes Indexed Job: distenv reads it only when the "
                             "pod template passes DISTENV_JOB_COMPLETIONS and the pods' names "
                             "(integrations/kubernetes/); JAX's own Kubernetes detection may find "
                             "the job"),
    ("KUBERNETES_SERVICE_HOST", "a Kubernetes pod: JAX's own Kubernetes detection may find the "
                                "job (with the kubernetes package)"),
    ("TPU_ACCELERATOR_TYPE", "a Cloud TPU VM: JAX, torch-xla (Lightning's XLA environment, "
                             "Accelerate's TPU state) find the slice from its metadata server"),
    ("TPU_NAME", "a Cloud TPU: JAX and torch-xla find the slice themselves"),
    ("PJRT_DEVICE", "torch-xla's PJRT runtime (Lightning's XLA environment, Accelerate's TPU "
                    "state) numbers its own processes"),
    ("XRT_TPU_CONFIG", "torch-xla's runtime numbers its own processes"),
)


class Single(Source):
    name = "none"
    title = "no launcher"
    family = "none"
    # the platforms frameworks detect themselves (shown by the doctor)
    prefixes = tuple(name for name, _ in FRAMEWORK_PLATFORMS)
    launch = Launch(aliases=("none",), can_be_per_node=True)

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        why = "a single process: no launcher variables found"
        for field, value in (("rank", 0), ("local_rank", 0), ("world_size", 1),
                             ("local_world_size", 1), ("node_rank", 0), ("num_nodes", 1)):
            r.set(field, value, why)
        _not_a_task(env)
        for var, what in FRAMEWORK_PLATFORMS:
            if var in env:
                r.notes.append(
                    f"no launcher variables, but {var} is set ({what}): distenv does not read "
                    "this platform, so 'one process' is its default, not a proof. distenv's "
                    "zero-code paths leave the framework's own detection alone here. Fix: if "
                    "this is one of several processes, start it with a launcher distenv reads")
                break
        job = env.get("SLURM_JOB_ID")
        if job:
            r.set("job_id", job, "SLURM_JOB_ID")
            kind = "batch script" if env.get("SLURM_PROCID") is not None and env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")) is None \
                else "allocation shell (salloc) or batch step"
            r.notes.append(
                f"inside SLURM job {job} but not an srun task: this {kind} is one process. "
                "Fix: start the tasks with srun (e.g. `srun python train.py`)."
            )


SOURCE = Single()
