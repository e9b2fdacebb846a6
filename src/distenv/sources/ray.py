"""Ray Train: the workers of a `TorchTrainer` (or any Train trainer built on its torch backend).

Ray's raylet starts every worker process with RAY_RAYLET_PID and RAY_JOB_ID (measured: 2.60;
`ray job submit`'s entrypoint and a plain driver have neither). Before the training function
runs, Ray Train's torch backend sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
MASTER_ADDR and MASTER_PORT in the worker's own environment and initializes torch's process
group itself (ray/train/torch/config.py, `_TorchBackend.on_start` and `_set_torch_distributed_env_vars`).
A Ray worker without those variables is a plain Ray task or actor, not a Train worker: this
source steps aside and whatever else is in the environment answers (Ray's MPI runtime
environment starts such a worker under mpirun, whose variables then describe it) -- except
SLURM's step variables: Ray never starts a worker through srun, so there they always describe
the step that started the driver or `ray start`, and reading them would make every such task
rank SLURM_PROCID of that step: an error instead.

Nesting: a Ray cluster runs inside SLURM steps, mpirun, Kubernetes pods and platforms, and its
workers inherit the variables of whatever started the driver or `ray start` (the driver's
`srun -N1 -n1` step: SLURM_PROCID=0, SLURM_STEP_NUM_TASKS=1). Ray's variables describe the
worker; those describe the driver or the node's raylet, so Ray comes before them. A launcher
started *from inside* a Ray worker (mpirun or srun in the training function) cannot be told
apart from one Ray runs inside without asking the process tree: DISTENV_LAUNCHER names it.

Inferred (docs/inferences.md): nothing beyond the variables. Ray numbers nodes in the order
its workers' nodes first appear (v2 worker_group.py, sorted by node then GPU), and nodes may
hold different numbers of workers, so only the resolver's one-node rule gives the node count.
"""

from __future__ import annotations

from ..description import PER_PROCESS
from ..errors import DistEnvError
from . import Source
from ._common import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..reading import Env, Reading

#: The variables Ray Train sets in each worker (any one of them: the rest must be there too).
TRAIN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
#: A SLURM step's markers: in a Ray worker, always inherited from the step that started Ray.
SLURM_STEP = ("SLURM_STEP_ID", "SLURM_STEPID")


class RayTrain(Source):
    name = "ray"
    title = "Ray Train"
    family = "ray"
    prefixes = ("RAY_",) + TRAIN_VARS + ("MASTER_ADDR", "MASTER_PORT")
    version_package = "ray"
    owns = TRAIN_VARS + ("MASTER_ADDR", "MASTER_PORT")
    node_order = "Ray Train numbers nodes in the order its workers' nodes first appear, not in any host list"
    # A Train worker's environment is its node's raylet's (`ray start`'s) or, for a cluster
    # the driver started, the driver's; the driver's exported variables reach every worker
    # only through the job's runtime environment.
    pass_on = 'ray.init(runtime_env={{"env_vars": {{"{name}": "{value}"}}}})'
    pass_on_only = True
    unknown_fix = ("nothing for torch: Ray Train placed its workers and joined their process "
                   "group itself; Ray reveals no node count or host list (its placement is "
                   "decided at run time), so a framework that needs them runs through Ray's "
                   "own integration")
    # Ray Train runs Lightning's processes through its own strategy and environment, whose
    # world may hold different numbers of workers per node (Lightning's devices x num_nodes
    # cannot say so), and Ray gives no node count: DistenvEnvironment steps aside.
    instead = {"lightning": (
        "use Ray's Lightning integration in the training function: Trainer(strategy="
        "ray.train.lightning.RayDDPStrategy(), plugins=[ray.train.lightning."
        "RayLightningEnvironment()], devices='auto'), then trainer = ray.train.lightning."
        "prepare_trainer(trainer); distenv.resolve() still describes the worker")}

    def detect(self, env: "Env") -> bool:
        if any(var in env for var in TRAIN_VARS):
            return True
        if not any(var in env for var in SLURM_STEP):
            return False
        # A launcher Ray started this worker under (mpirun for Ray's MPI runtime environment)
        # sits between Ray and SLURM in the registry: its variables describe the worker.
        from . import LAUNCHERS  # the registry (this module is loaded from it)

        names = [entry.name for entry in LAUNCHERS]
        between = LAUNCHERS[names.index(self.name) + 1:names.index("slurm")]
        return not any(entry.present(env) for entry in between)

    def read(self, env: "Env", r: "Reading") -> None:
        if not any(var in env for var in TRAIN_VARS):
            task = ", ".join(f"{var}={env[var]}" for var in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
                             if var in env)
            raise DistEnvError(
                f"a Ray task or actor that is not a Ray Train worker (RAY_RAYLET_PID is set, "
                f"RANK and WORLD_SIZE are not): its SLURM variables ({task or 'SLURM_STEP_ID'}) "
                "describe the SLURM step that started Ray, not this process. Fix: run the "
                "training function as the workers of a Ray Train TorchTrainer, or set "
                "DISTENV_LAUNCHER=none where this process works alone.")
        missing = [var for var in ("RANK", "WORLD_SIZE") if var not in env]
        if missing:
            present = ", ".join(f"{var}={env[var]}" for var in TRAIN_VARS if var in env)
            raise DistEnvError(
                f"{present} in a Ray worker (RAY_RAYLET_PID is set) without "
                f"{' and '.join(missing)}: Ray Train sets all of them in its workers, so "
                "something else set these. Fix: unset them in this Ray task, or run it as a "
                "Ray Train worker (TorchTrainer), or set DISTENV_LAUNCHER to the launcher that "
                "started this process.")
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        r.int_from(env, "node_rank", "NODE_RANK", self.title)
        if env.get("MASTER_ADDR"):
            r.set("master_addr", env["MASTER_ADDR"], "MASTER_ADDR (set by Ray Train: worker 0's node)")
        r.int_from(env, "master_port", "MASTER_PORT", self.title, minimum=1)
        r.set("job_id", env.get("RAY_JOB_ID"), "RAY_JOB_ID")


SOURCE = RayTrain()
