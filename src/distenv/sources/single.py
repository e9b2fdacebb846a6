"""A single process: nothing launched it distributed (or DISTENV_LAUNCHER=none).

Inferred (docs/inferences.md): nothing; one process is rank 0 of 1 on one node.
"""

from __future__ import annotations

from ..description import PER_PROCESS
from . import Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..reading import Env, Reading


class Single(Source):
    name = "none"
    title = "no launcher"
    family = "none"
    prefixes = ()
    aliases = ("none",)
    can_be_per_node = True

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        why = "a single process: no launcher variables found"
        for field, value in (("rank", 0), ("local_rank", 0), ("world_size", 1),
                             ("local_world_size", 1), ("node_rank", 0), ("num_nodes", 1)):
            r.set(field, value, why)
        job = env.get("SLURM_JOB_ID")
        if job:
            r.set("job_id", job, "SLURM_JOB_ID")
            kind = "batch script" if env.get("SLURM_PROCID") is not None and env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")) is None \
                else "allocation shell (salloc) or batch step"
            r.notes.append(
                f"inside SLURM job {job} but not an srun task: this {kind} is one process. "
                "Start the tasks with srun (e.g. `srun python train.py`)."
            )


SOURCE = Single()
