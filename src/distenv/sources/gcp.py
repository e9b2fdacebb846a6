"""Google Cloud AI Platform Training and Vertex AI custom jobs.

Both describe the cluster in CLUSTER_SPEC (JSON: cluster -> task type -> ["host:port"],
task -> {type, index}); AI Platform names the pools master/worker/ps/evaluator, Vertex
workerpool0..3 (0: the primary replica, 1: workers, 2: parameter or reduction servers,
3: evaluators). PyTorch containers also get RANK = the *node* index and WORLD_SIZE = the
node count. Each replica runs one process: a per-node launch whose workers (one per GPU
by default) are yet to be started. CLUSTER_SPEC is used by unrelated systems too, so its
shape is checked before it is believed.

Inferred (docs/inferences.md): node rank from the task's pool and index (primary pool
first); master = MASTER_ADDR or the primary replica's host.
"""

from __future__ import annotations

from ..core.description import PER_NODE
from ..errors import DistEnvError
from ..knobs import NPROC_PER_NODE
from ..core.reading import get_int, parse_json
from . import Frameworks, Launch, Source, names_of

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env, Reading

PRIMARY = ("master", "chief", "workerpool0")
WORKERS = ("worker", "workerpool1")


def cluster_spec(env: "Env") -> "dict[str, Any] | None":
    """The parsed CLUSTER_SPEC when it has the TensorFlow-style shape, else None."""
    raw = env.get("CLUSTER_SPEC")
    if not raw:
        return None
    spec = parse_json(raw, "CLUSTER_SPEC")
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
        return None
    if not all(isinstance(v, list) for v in spec["cluster"].values()):
        return None
    return spec


def flavour(spec: "dict[str, Any]") -> str:
    return "vertex" if any(k.startswith("workerpool") for k in spec["cluster"]) else "gcp"


def training_nodes(spec: "dict[str, Any]") -> "list[str]":
    """host:port of every training replica in node-rank order (primary first)."""
    cluster = spec["cluster"]
    out: "list[str]" = []
    for kind in PRIMARY + WORKERS:
        out.extend(str(x) for x in cluster.get(kind, ()))
    return out


#: The fix for a CLUSTER_SPEC distenv cannot read.
PLATFORM_FIX = ("Fix: leave CLUSTER_SPEC as the platform (GCP AI Platform / Vertex AI) writes "
                "it, the same on every replica, and do not set it yourself.")


def task_node_rank(spec: "dict[str, Any]") -> "int | None":
    task = spec.get("task")
    if not isinstance(task, dict):
        return None
    kind, index = task.get("type"), task.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise DistEnvError(f"CLUSTER_SPEC task index {index!r} is not a non-negative integer. "
                           + PLATFORM_FIX)
    cluster = spec["cluster"]
    offset = 0
    for pool in PRIMARY + WORKERS:
        if pool == kind:
            if index >= len(cluster.get(pool, ())):
                raise DistEnvError(
                    f"CLUSTER_SPEC task {kind}[{index}] is not in its cluster "
                    f"({len(cluster.get(pool, ()))} {kind} replica(s)). " + PLATFORM_FIX
                )
            return offset + index
        offset += len(cluster.get(pool, ()))
    return None  # ps / evaluator / reduction server: not a training worker


#: Google Cloud pools -> TF_CONFIG task types (Vertex: workerpool0..3, documented as the
#: primary replica, workers, parameter servers, evaluators).
TF_TYPES = {"master": "chief", "chief": "chief", "workerpool0": "chief",
            "worker": "worker", "workerpool1": "worker",
            "ps": "ps", "workerpool2": "ps",
            "evaluator": "evaluator", "workerpool3": "evaluator"}


def tf_config(env: "Env") -> "dict[str, Any] | None":
    """The TF_CONFIG a CLUSTER_SPEC in `env` describes (pools renamed to TensorFlow's task
    types, checked like a TF_CONFIG), or None without a TensorFlow-style CLUSTER_SPEC."""
    import json

    from .tfconfig import parse

    spec = cluster_spec(env)
    if spec is None:
        return None
    cluster: "dict[str, list[str]]" = {}
    for pool, tasks in spec["cluster"].items():
        kind = TF_TYPES.get(pool)
        if kind is None:
            raise DistEnvError(f"CLUSTER_SPEC pool {pool!r} is not one TensorFlow knows "
                               f"({', '.join(TF_TYPES)}). " + PLATFORM_FIX)
        cluster.setdefault(kind, []).extend(str(t) for t in tasks)
    task: "dict[str, Any]" = spec.get("task") or {}
    kind = TF_TYPES.get(task.get("type"))  # type: ignore[arg-type]  # None: not a pool
    if kind is None:
        raise DistEnvError(f"CLUSTER_SPEC task type {task.get('type')!r} is not a known pool. "
                           + PLATFORM_FIX)
    config = {"cluster": cluster, "task": {"type": kind, "index": task.get("index", 0)},
              "environment": "cloud"}
    return parse(json.dumps(config), "CLUSTER_SPEC")


def platform(env: "Env") -> "str | None":
    """The platform's name here: "vertex" or "gcp" (the job's own flavour), or None: not one
    of their jobs (`Launch.platform`)."""
    spec = cluster_spec(env)
    if spec is not None:
        return flavour(spec)
    if env.get("CLOUD_ML_JOB_ID"):
        return "vertex" if any(k.startswith("AIP_") for k in env) else "gcp"
    return None


class GoogleCloud(Source):
    name = "gcp"
    title = "Google Cloud"
    family = "platform"
    prefixes = ('CLUSTER_SPEC', 'CLOUD_ML_', 'AIP_')
    launch = Launch(aliases=("gcp", "vertex"), platform=platform)
    frameworks = Frameworks(tf_cluster="CLUSTER_SPEC", tf_config=tf_config)
    owns = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    def detect(self, env: "Env") -> bool:
        spec = cluster_spec(env)
        if spec is None:
            return False
        # A TensorFlow job without torch variables: each TF_CONFIG task is one process,
        # which the TF_CONFIG source describes better.
        # Asked for several workers per replica (distenv run --nproc-per-node on a custom
        # container), the replica is a node whatever TF_CONFIG says.
        return "RANK" in env or "TF_CONFIG" not in env or bool(env.get(NPROC_PER_NODE))

    def read(self, env: "Env", r: "Reading") -> None:
        spec = cluster_spec(env)
        assert spec is not None  # detect() found it
        kind = flavour(spec)
        r.launch = PER_NODE
        r.set("launcher", kind, "CLUSTER_SPEC: the platform started one process per replica")
        nodes = training_nodes(spec)
        from_spec = task_node_rank(spec)
        rank = get_int(env, "RANK", kind)
        if rank is not None:
            r.set("node_rank", rank, f"RANK={rank} (on {kind}, the node index)")
            if from_spec is not None and from_spec != rank:
                raise DistEnvError(
                    f"RANK={rank} contradicts CLUSTER_SPEC, whose task is node {from_spec} "
                    "(primary pool first, then workers). Fix: unset RANK if the job script sets "
                    "it; the platform's RANK and CLUSTER_SPEC agree."
                )
        elif from_spec is not None:
            r.set("node_rank", from_spec, "CLUSTER_SPEC task (primary pool first, then workers)")
        else:
            task = spec.get("task") or {}
            raise DistEnvError(
                f"CLUSTER_SPEC task {task.get('type')!r} is not a training replica "
                "(parameter server, reduction server or evaluator): it has no rank. Fix: do not "
                "resolve a training launch in this replica (run its own server or evaluator "
                "code there), or make it a worker pool."
            )
        size = get_int(env, "WORLD_SIZE", kind, minimum=1)
        if size is not None:
            r.set("num_nodes", size, f"WORLD_SIZE={size} (on {kind}, the node count)")
            if nodes and len(nodes) != size:
                raise DistEnvError(
                    f"WORLD_SIZE={size} contradicts CLUSTER_SPEC, which lists "
                    f"{len(nodes)} training replica(s). Fix: unset WORLD_SIZE if the job script "
                    "sets it; the platform's WORLD_SIZE and CLUSTER_SPEC agree."
                )
        elif nodes:
            r.set("num_nodes", len(nodes), "CLUSTER_SPEC training replicas")
        if nodes:
            r.set("hosts", [n.rsplit(":", 1)[0] for n in nodes], "CLUSTER_SPEC training replicas")
        if env.get("MASTER_ADDR"):
            r.set("master_addr", env["MASTER_ADDR"], "MASTER_ADDR (set by the platform)")
        elif nodes:
            r.set("master_addr", nodes[0].rsplit(":", 1)[0], "CLUSTER_SPEC primary replica")
        r.int_from(env, "master_port", "MASTER_PORT", kind, minimum=1)
        job = env.get("CLOUD_ML_JOB_ID")
        r.set("job_id", job, "CLOUD_ML_JOB_ID")
        if job:
            r.port_key = "gcp:" + job

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """Started by the platform (one process per replica, replicas in CLUSTER_SPEC's
        order, even when each is its node's only worker): node k's workers are ranks
        k*nproc .. k*nproc+nproc-1."""
        if values.get("launcher") not in names_of(self):
            return None  # only the platform under another launcher: that one places ranks
        from ..core.placement import repeated

        return repeated(values, f"CLUSTER_SPEC training replicas in node order, nproc_per_node="
                                f"{values.get('nproc_per_node')} each (workers are numbered "
                                "node_rank * nproc_per_node + local_rank)")


SOURCE = GoogleCloud()
