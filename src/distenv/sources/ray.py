"""Ray: the processes a raylet starts, Ray Train's workers first.

Every process Ray's raylet starts (task and actor workers, its agents) carries RAY_RAYLET_PID
and RAY_JOB_ID (measured: 2.60; `ray job submit`'s entrypoint has both stripped, a plain driver
has neither). Ray starts them itself, never through another launcher, so the variables they
inherit from the process that started Ray -- the driver (a local cluster) or the node's `ray
start` -- describe that process: a SLURM step's SLURM_PROCID=0 of SLURM_STEP_NUM_TASKS=1, an
mpirun rank, a Kubeflow or Indexed Job pod, a platform's node. Ray therefore comes before every
cluster launcher and platform, and only what Ray itself sets in the process is read:

- Ray Train's torch backend (TorchTrainer) sets RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, NODE_RANK and, with init_method "env" (the default), MASTER_ADDR (worker
  0's node) and MASTER_PORT in each worker before the training function runs, then
  initializes torch's process group (ray/train/torch/config.py, `_TorchBackend.on_start`).
  With torchft (TorchftConfig: TORCHFT_LIGHTHOUSE set) each worker is a replica group of its
  own: LOCAL_*, NODE_RANK and MASTER_* describe that group, so only RANK and WORLD_SIZE are
  read.
- TensorflowTrainer sets TF_CONFIG in each worker (ray/train/tensorflow/config.py): read as
  TF_CONFIG is read.
- Anything else (a task, an actor, a Tune trial, a JaxTrainer worker -- Ray initializes JAX
  itself and sets no variable --, or a Train worker before Ray sets its variables, as at
  interpreter start): Ray gives it no place, so every field is unknown, with a note. Its
  inherited variables are never read: they would make it rank SLURM_PROCID of `ray start`'s
  step. For the same reason DISTENV_AUTO does nothing in Ray's processes (`Frameworks.adapters`).

Launchers started *inside* a Ray worker come first in the registry where they set their own
marker (torchrun, horovod.ray's HOROVOD_RANK); mpirun or srun started from a Train worker
cannot be told apart from the ones Ray runs inside without asking the process tree:
DISTENV_LAUNCHER names it.

Inferred (docs/inferences.md): nothing beyond the variables. Ray numbers nodes in the order
its workers' nodes first appear (v2 worker_group.py, sorted by node then GPU), and nodes may
hold different numbers of workers, so only the resolver's one-node rule gives the node count.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from ..errors import DistEnvError
from . import Doctor, Frameworks, Launch, PassOn, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading

#: The variables Ray Train sets in each worker (any one of them: the rest must be there too).
TRAIN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


class RayTrain(Source):
    name = "ray"
    title = "Ray Train"
    family = "ray"
    prefixes = ("RAY_",) + TRAIN_VARS + ("MASTER_ADDR", "MASTER_PORT")
    launch = Launch(
        node_order="Ray Train numbers nodes in the order its workers' nodes first appear, not in any host list",
        unknown_fix="in a TorchTrainer's workers, nothing for torch: Ray Train placed them and "
                    "joined their process group itself; Ray reveals no node count or host list "
                    "(it decides placement at run time), so a framework that needs them runs "
                    "through Ray's own integration",
    )
    passing = PassOn(
        # A Train worker's environment is its node's raylet's (`ray start`'s) or, for a cluster
        # the driver started, the driver's; the driver's exported variables reach every worker
        # only through the job's runtime environment.
        how='ray.init(runtime_env={{"env_vars": {{"{name}": "{value}"}}}})',
        only=True,
    )
    frameworks = Frameworks(
        # DISTENV_AUTO acts at interpreter start, before Ray sets a Train worker's variables, when
        # every Ray process is one Ray has given no place yet: no zero-code path acts here (the
        # adapters called in the training function do).
        adapters=(),
        # Ray Train runs Lightning's processes through its own strategy and environment, whose
        # world may hold different numbers of workers per node (Lightning's devices x num_nodes
        # cannot say so), and Ray gives no node count: DistenvEnvironment steps aside.
        instead={"lightning": (
            "use Ray's Lightning integration in the training function: Trainer(strategy="
            "ray.train.lightning.RayDDPStrategy(), plugins=[ray.train.lightning."
            "RayLightningEnvironment()], devices='auto'), then trainer = ray.train.lightning."
            "prepare_trainer(trainer); distenv.resolve() still describes the worker")},
    )
    doctor = Doctor(package="ray")
    owns = TRAIN_VARS + ("MASTER_ADDR", "MASTER_PORT")

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        r.set("job_id", env.get("RAY_JOB_ID"), "RAY_JOB_ID")
        if not any(var in env for var in TRAIN_VARS):
            if "TF_CONFIG" in env:  # TensorflowTrainer's worker: Ray wrote it for this process
                from .tfconfig import SOURCE as tf_config

                tf_config.read(env, r)
                return
            r.notes.append(
                "a Ray process outside Ray Train's torch backend (a task, an actor, a Tune "
                "trial, a JaxTrainer worker, or a TorchTrainer worker before Ray sets its "
                "variables): Ray gives it no place, and the launcher variables it inherited "
                "describe whatever started Ray. Fix: call distenv in a TorchTrainer's training "
                "function, where Ray Train has set RANK, WORLD_SIZE, LOCAL_RANK, ...")
            return
        missing = [var for var in ("RANK", "WORLD_SIZE") if var not in env]
        if missing:
            present = ", ".join(f"{var}={env[var]}" for var in TRAIN_VARS if var in env)
            raise DistEnvError(
                f"{present} in a Ray worker (RAY_RAYLET_PID is set) without "
                f"{' and '.join(missing)}: Ray Train sets all of them in its workers, so "
                "something else set these. Fix: unset them in this Ray task, or run it as a "
                "Ray Train worker (TorchTrainer), or set DISTENV_LAUNCHER to the launcher that "
                "started this process.")
        if "TORCHFT_LIGHTHOUSE" in env:
            read_counts(env, r, self.title, "RANK", "WORLD_SIZE")
            r.notes.append(
                "Ray Train with torchft (TORCHFT_LIGHTHOUSE is set): every worker is a replica "
                "group of its own, so LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK and MASTER_* "
                "describe that group and are not read; torch's process group here is the "
                "group's, and torchft's Manager joins the replicas")
            return
        read_counts(env, r, self.title, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        r.int_from(env, "node_rank", "NODE_RANK", self.title)
        if env.get("MASTER_ADDR"):
            r.set("master_addr", env["MASTER_ADDR"], "MASTER_ADDR (set by Ray Train: worker 0's node)")
            r.int_from(env, "master_port", "MASTER_PORT", self.title, minimum=1)
        else:
            r.notes.append(
                "Ray Train set no MASTER_ADDR here (TorchConfig(init_method='tcp') passes rank "
                "0's address to torch directly): its host is unknown; the process group Ray "
                "made is already up")


SOURCE = RayTrain()
