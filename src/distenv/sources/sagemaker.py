"""Amazon SageMaker training jobs.

SM_HOSTS (JSON list, e.g. ["algo-1","algo-2"]) and SM_CURRENT_HOST name the nodes.
Without a distribution option SageMaker runs the entry point once per host: a per-node
launch (its own torchrun runner uses hosts[0] as master and node_rank = hosts.index).
With `mpi` it runs mpirun from the first host over the hosts in SM_HOSTS order, so the
Open MPI source answers and this platform adds the host list and the master host. Its
TensorFlow toolkit writes TF_CONFIG (one task per host): the TF_CONFIG source answers.

Inferred (docs/inferences.md): master = first host of SM_HOSTS (SageMaker's own runner;
its mpirun runs there, where Open MPI 4 maps rank 0); with mpirun, the block layout
processes_per_host per host in SM_HOSTS order.
"""

from __future__ import annotations

from ..core.description import PER_NODE
from ..errors import DistEnvError
from ..knobs import NPROC_PER_NODE
from ..core.reading import get_int, parse_json, show
from . import Source, names_of
from ._common import block_layout, platform_hosts, platform_master

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env, Reading


#: The fix for SageMaker variables distenv cannot read.
SM_FIX = ("Fix: leave SM_HOSTS and SM_CURRENT_HOST as SageMaker writes them (a JSON list of "
          "the job's hosts, and this host's name in it), or unset both outside SageMaker.")


def hosts(env: "Env") -> "list[str] | None":
    raw = env.get("SM_HOSTS")
    if raw is None:
        return None
    value: Any = parse_json(raw, "SM_HOSTS")
    if not isinstance(value, list) or not value or not all(isinstance(h, str) and h for h in value):
        raise DistEnvError(f"SM_HOSTS must be a non-empty JSON list of host names, got {show(raw)}. "
                           + SM_FIX)
    if len(set(value)) != len(value):
        raise DistEnvError(f"SM_HOSTS lists a host twice: {show(raw)}. " + SM_FIX)
    return value


#: Why the job's hosts are the distribution's in a heterogeneous cluster (several instance
#: groups): SageMaker's toolkit distributes over `distribution_hosts` only -- the hosts of the
#: groups in SM_DISTRIBUTION_INSTANCE_GROUPS, in SM_INSTANCE_GROUPS order -- and its master is
#: their first (sagemaker-training-toolkit, environment.py: get_distribution_hosts,
#: get_master_hostname; its mpirun runs over them); SM_HOSTS lists every group's hosts.
HETERO_WHY = ("the hosts of SM_DISTRIBUTION_INSTANCE_GROUPS in SM_INSTANCE_GROUPS_DICT "
              "(a heterogeneous cluster: SageMaker distributes over those groups only)")
HETERO_FIX = ("Fix: leave SM_INSTANCE_GROUPS, SM_INSTANCE_GROUPS_DICT and "
              "SM_DISTRIBUTION_INSTANCE_GROUPS as SageMaker writes them.")


def job_hosts(env: "Env") -> "tuple[list[str] | None, str]":
    """(the hosts SageMaker distributes the job over, why): SM_HOSTS, or in a heterogeneous
    cluster (SM_IS_HETERO=true) the distribution groups' hosts (HETERO_WHY)."""
    names = hosts(env)
    if names is None or (env.get("SM_IS_HETERO") or "").strip().lower() != "true":
        return names, "SM_HOSTS"
    order = parse_json(env.get("SM_INSTANCE_GROUPS") or "null", "SM_INSTANCE_GROUPS")
    groups = parse_json(env.get("SM_INSTANCE_GROUPS_DICT") or "null", "SM_INSTANCE_GROUPS_DICT")
    chosen = parse_json(env.get("SM_DISTRIBUTION_INSTANCE_GROUPS") or "null",
                        "SM_DISTRIBUTION_INSTANCE_GROUPS")
    if not (isinstance(order, list) and isinstance(groups, dict) and isinstance(chosen, list)):
        raise DistEnvError("SM_IS_HETERO=true but SM_INSTANCE_GROUPS, SM_INSTANCE_GROUPS_DICT or "
                           "SM_DISTRIBUTION_INSTANCE_GROUPS is missing or not JSON of its kind: "
                           "which hosts run the job is unknown. " + HETERO_FIX)
    picked: "list[str]" = []
    for name in order:
        if name in chosen:
            group = groups.get(name)
            listed = group.get("hosts") if isinstance(group, dict) else None
            if not isinstance(listed, list) or not all(h in names for h in listed):
                raise DistEnvError(f"SM_INSTANCE_GROUPS_DICT gives instance group {show(str(name))} "
                                   "no host list of SM_HOSTS's hosts. " + HETERO_FIX)
            picked += listed
    if not picked:
        raise DistEnvError("SM_IS_HETERO=true but SM_DISTRIBUTION_INSTANCE_GROUPS names no group of "
                           "SM_INSTANCE_GROUPS with hosts: no host runs the distributed job. "
                           + HETERO_FIX)
    return picked, HETERO_WHY


def current_index(env: "Env", names: "list[str]") -> "int | None":
    current = env.get("SM_CURRENT_HOST")
    if current is None:
        return None
    if current not in names:
        raise DistEnvError(
            f"SM_CURRENT_HOST={show(current)} is not in SM_HOSTS={show(env.get('SM_HOSTS'))}. "
            + SM_FIX
        )
    return names.index(current)


class SageMaker(Source):
    name = "sagemaker"
    title = "SageMaker"
    family = "platform"
    prefixes = ('SM_', 'TRAINING_JOB_NAME', 'AWS_')  # AWS_: the doctor shows them (redacted)

    def detect(self, env: "Env") -> bool:
        # SageMaker's TensorFlow toolkit (parameter_server, multi_worker_mirrored distributions)
        # starts one process per host with a TF_CONFIG naming its task (_build_tf_config,
        # master/worker/ps): each task is one process, which the TF_CONFIG source reads. Asked
        # for several workers per host (DISTENV_NPROC_PER_NODE), the host is a node whatever
        # TF_CONFIG says.
        return "SM_CURRENT_HOST" in env and ("TF_CONFIG" not in env or bool(env.get(NPROC_PER_NODE)))

    def read(self, env: "Env", r: "Reading") -> None:
        names, why = job_hosts(env)
        assert names is not None  # SM_HOSTS is this source's marker: the resolver checked it
        if why != "SM_HOSTS" and env.get("SM_CURRENT_HOST") not in names:
            raise DistEnvError(
                f"SM_CURRENT_HOST={show(env.get('SM_CURRENT_HOST') or '')} is in instance group "
                f"{show(env.get('SM_CURRENT_INSTANCE_GROUP') or '?')}, which "
                "SM_DISTRIBUTION_INSTANCE_GROUPS does not distribute over: this host runs no "
                "worker of the distributed job. Fix: call distenv on the distribution groups' "
                "hosts only (branch on SM_CURRENT_INSTANCE_GROUP).")
        r.launch = PER_NODE
        r.set("launcher", "sagemaker", "SM_HOSTS without a launcher: SageMaker ran one process per host")
        r.set("hosts", names, why)
        r.set("num_nodes", len(names), why)
        r.set("node_rank", current_index(env, names), f"SM_CURRENT_HOST's place in {why}")
        r.set("master_addr", names[0], f"first host of {why} (SageMaker's own runner uses it)")
        gpus = get_int(env, "SM_NUM_GPUS", "SageMaker")
        if gpus:
            r.nproc_source = (str(gpus), f"SM_NUM_GPUS={gpus}")
        self._job(env, r)

    def overlay(self, env: "Env", r: "Reading") -> None:
        names, why = job_hosts(env)
        if not names:
            return
        platform_hosts(r, names, why, count=False)  # the count: under mpirun only, below
        if len(names) > 1:
            # SageMaker runs mpirun on hosts[0] with `-H algo-1:N,algo-2:N,...`: rank 0 is
            # there and every host runs N ranks in order. SM_CURRENT_HOST cannot tell the
            # node: mpirun -x copies the master's value to every rank.
            platform_master(r, names[0], f"SageMaker's first host ({why})",
                            f"first host of {why} (SageMaker runs mpirun there)")
            if r.get("launcher") == "openmpi":
                r.default("num_nodes", len(names), why)
                block_layout(r, "SageMaker's mpirun places processes_per_host ranks on each host in order")
        self._job(env, r)

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """SM_HOSTS in order: SageMaker started one process per host itself (node k's
        workers are ranks k*nproc .. k*nproc+nproc-1), or ran mpirun with
        ``-H algo-1:N,algo-2:N,...`` (block placement, N per host)."""
        from ..core.placement import repeated

        per = values.get("nproc_per_node")
        if values.get("launcher") in names_of(self):
            return repeated(values, f"SM_HOSTS in node order, nproc_per_node={per} each (workers "
                                    "are numbered node_rank * nproc_per_node + local_rank)")
        names, _ = job_hosts(env)
        if values.get("launcher") == "openmpi" and names and list(values["hosts"]) == names:
            return repeated(values, f"SM_HOSTS in order, {per} each (SageMaker's mpirun -H host:N,...)")
        return None

    @staticmethod
    def _job(env: "Env", r: "Reading") -> None:
        job = env.get("TRAINING_JOB_NAME")
        if job:
            r.default("job_id", job, "TRAINING_JOB_NAME")
            r.port_key = r.port_key or "sagemaker:" + job


SOURCE = SageMaker()
