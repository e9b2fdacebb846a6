"""TF_CONFIG: TensorFlow's cluster description, one process per task.

cluster: {chief|master: [...], worker: [...], ps: [...], evaluator: [...]} of "host:port";
task: {type, index}. Training workers are ranked chief first, then workers; parameter
servers and evaluators take part without a rank. Tasks on the same host string share a
node; nodes are ordered by their lowest rank.

Inferred (docs/inferences.md): all of the above is distenv's rank rule for TF_CONFIG; the
master is the chief's host (rank 0). Two strings naming one machine count as two nodes.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS, unknown
from ..errors import DistEnvError
from ..core.reading import parse_json, show
from . import Launch, Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env, Reading

CHIEFS = ("chief", "master")
#: What a valid TF_CONFIG looks like, for the errors' Fix (TensorFlow's documented form).
FORM = ('{"cluster": {"worker": ["host0:port", "host1:port"]}, '
        '"task": {"type": "worker", "index": 0}}')
TRAINING = CHIEFS + ("worker",)


def parse(raw: str, name: str = "TF_CONFIG") -> "dict[str, Any]":
    config = parse_json(raw, name)
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise DistEnvError(f"{name} has no 'cluster' mapping: {show(raw)}. Fix: give {name} "
                           f"the form {FORM} (as the platform writes it), or unset it.")
    cluster = config["cluster"]
    for kind, tasks in cluster.items():
        if not isinstance(tasks, list) or not all(isinstance(t, str) and ":" in t for t in tasks):
            raise DistEnvError(f"{name} cluster[{kind!r}] must be a list of 'host:port' strings. "
                               f"Fix: give {name} the form {FORM}.")
    if sum(len(cluster[k]) for k in CHIEFS if k in cluster) > 1:
        raise DistEnvError(f"{name} lists more than one chief. Fix: keep one 'chief' (or "
                           "'master') task in its cluster; the others are workers.")
    task = config.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("type"), str):
        raise DistEnvError(f"{name} has no task type: distenv cannot tell which task this is. "
                           f"Fix: give each process its own {name} with \"task\": "
                           "{\"type\": \"worker\", \"index\": <its index>}.")
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        raise DistEnvError(f"{name} task index {index!r} is not an integer. Fix: set "
                           "\"index\" to this task's position in its cluster list (0, 1, ...).")
    tasks = cluster.get(task["type"])
    if task["type"] == "evaluator" and tasks is None:
        return config  # TensorFlow never lists the evaluator in the cluster
    if tasks is None or not 0 <= index < len(tasks):
        raise DistEnvError(
            f"{name} task {task['type']}[{index}] is not in its cluster "
            f"({len(tasks or ())} {task['type']} task(s)). Fix: list every task of the job in "
            f"{name}'s cluster, the same on every process, with this one's type and index."
        )
    return config


def workers(config: "dict[str, Any]") -> "list[str]":
    cluster = config["cluster"]
    return [t for kind in TRAINING for t in cluster.get(kind, ())]


def task_rank(config: "dict[str, Any]") -> "int | None":
    """The task's global rank: the chief first, then the workers in order (TensorFlow's
    MultiWorkerMirroredStrategy numbers them so); None for a parameter server or evaluator."""
    cluster, task = config["cluster"], config["task"]
    kind = task["type"]
    index: int = task.get("index", 0)  # parse() checked it is an int
    if kind in CHIEFS:
        return index
    if kind == "worker":
        return sum(len(cluster.get(k, ())) for k in CHIEFS) + index
    return None


class TFConfig(Source):
    name = "tf_config"
    title = "TF_CONFIG"
    family = "tensorflow"
    prefixes = ('TF_CONFIG',)
    launch = Launch(aliases=("tf_config", "tensorflow"))

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """The cluster's host:port list, chief first then workers (`task_rank`'s rule), when
        the hosts in force are TF_CONFIG's own (checked when built: resolve() stays cheap)."""
        from ..core.description import Later

        if values.get("hosts") is None:
            return None
        return (Later(_rank_hosts, (env.get("TF_CONFIG"), tuple(values["hosts"]))),
                "TF_CONFIG cluster: chief first, then workers")

    def read(self, env: "Env", r: "Reading") -> None:
        config = parse(env["TF_CONFIG"])
        task = config["task"]
        kind, index = task["type"], task.get("index", 0)
        r.launch = PER_PROCESS
        members = workers(config)
        cluster = config["cluster"]
        # One pass (a cluster of thousands of tasks resolved in seconds with list scans).
        of = [entry.rsplit(":", 1)[0] for entry in members]  # host of every rank
        count: "dict[str, int]" = {}
        for host in of:
            count[host] = count.get(host, 0) + 1
        hosts = list(count)  # distinct, in rank order (dicts keep insertion order)
        if members:
            r.set("master_addr", hosts[0], "TF_CONFIG: host of the chief (or worker 0)")
        if kind not in TRAINING:
            # A parameter server or evaluator is a process of the job, not a rank of the
            # collective: nothing rank-like describes it.
            r.notes.append(f"TF_CONFIG task {kind}[{index}] is not a training worker: it has no rank")
            r.port_key = "tf:" + ",".join(members)
            return
        r.set("world_size", len(members), "TF_CONFIG cluster (chief + workers)")
        r.set("hosts", hosts, "TF_CONFIG cluster hosts, in rank order")
        r.set("num_nodes", len(hosts), "distinct hosts in TF_CONFIG")
        rank = task_rank(config)
        assert rank is not None  # a training task (above)
        mine = of[rank]
        same = [i for i, host in enumerate(of) if host == mine]
        why = f"TF_CONFIG task {kind}[{index}]"
        r.set("rank", rank, why + " (chief first, then workers)")
        r.set("local_rank", same.index(rank), why + " among tasks on the same host")
        r.set("local_world_size", len(same), "tasks on the same host in TF_CONFIG")
        r.set("node_rank", hosts.index(mine), "host order in TF_CONFIG")
        counts = list(count.values())
        if counts and all(c == counts[0] for c in counts):
            r.set("nproc_per_node", counts[0], "tasks per host in TF_CONFIG")
        # Same on every task of the job, different across jobs: the cluster itself.
        r.port_key = "tf:" + ",".join(members)


def _rank_hosts(raw: str, hosts: "tuple[str, ...]") -> "tuple[tuple[str, ...] | None, str | None]":
    of = tuple(m.rsplit(":", 1)[0] for m in workers(parse(raw)))
    if tuple(dict.fromkeys(of)) != hosts:  # hosts given another way (resolve(hosts=...))
        return None, unknown("the hosts in force are not TF_CONFIG's")
    return of, None


SOURCE = TFConfig()
