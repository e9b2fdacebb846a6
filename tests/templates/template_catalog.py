"""Every job template in integrations/, and what each one runs.

`TEMPLATES` lists the template files (path, format). `launches()` reads them - YAML with
PyYAML, Python with `ast` (never imported: the cloud SDKs are not installed here), shell
scripts as text - and returns one `Launch` per way a template starts the job: the argv
the platform runs in each container/process, how many nodes and processes per node the
platform starts, the GPUs per node it asks for. The tests feed these to distenv's own
`distenv run` parser and planner, and to the resolver with the platform's documented
environment.
"""
from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INTEGRATIONS = REPO / "integrations"

#: (path relative to the repository, format). Formats: yaml, python, bash, sh, dockerfile.
TEMPLATES = [
    ("integrations/azureml/job_mpi_per_process.yml", "yaml"),
    ("integrations/azureml/job_mpi_per_node.yml", "yaml"),
    ("integrations/azureml/job_pytorch.yml", "yaml"),
    ("integrations/azureml/job_tensorflow.yml", "yaml"),
    ("integrations/azureml/conda_torch.yml", "yaml"),
    ("integrations/azureml/conda_tensorflow.yml", "yaml"),
    ("integrations/azureml/sdk2_jobs.py", "python"),
    ("integrations/azureml/sdk1_jobs.py", "python"),
    ("integrations/gcp/pytorch_config.yaml", "yaml"),
    ("integrations/gcp/tensorflow_config.yaml", "yaml"),
    ("integrations/vertex/pytorch_job.yaml", "yaml"),
    ("integrations/vertex/tensorflow_job.yaml", "yaml"),
    ("integrations/sagemaker/estimators.py", "python"),
    ("integrations/sagemaker/launch_per_node.sh", "sh"),
    ("integrations/kubeflow/pytorchjob.yaml", "yaml"),
    ("integrations/kubeflow/trainjob.yaml", "yaml"),
    ("integrations/kubeflow/mpijob.yaml", "yaml"),
    ("integrations/kubeflow/tfjob.yaml", "yaml"),
    ("integrations/kubeflow/Dockerfile", "dockerfile"),
    ("integrations/slurm/templates/per_process.sbatch", "bash"),
    ("integrations/slurm/templates/per_node.sbatch", "bash"),
    ("integrations/lsf/per_process.lsf", "bash"),
    ("integrations/lsf/per_node.lsf", "bash"),
    ("integrations/pbs/per_process.pbs", "bash"),
    ("integrations/pbs/per_node.pbs", "bash"),
    ("integrations/skypilot/train.yaml", "yaml"),
    ("integrations/dstack/train.dstack.yml", "yaml"),
    ("integrations/kubernetes/indexed_job.yaml", "yaml"),
    ("integrations/kubernetes/jobset.yaml", "yaml"),
]

#: Folders whose templates are listed above (a new file there must be listed too).
TEMPLATE_DIRS = ["integrations/azureml", "integrations/gcp", "integrations/vertex",
                 "integrations/sagemaker", "integrations/kubeflow",
                 "integrations/slurm/templates", "integrations/lsf", "integrations/pbs",
                 "integrations/skypilot", "integrations/dstack", "integrations/kubernetes"]

#: The example each template runs by default.
TORCH_EXAMPLE = "examples/pytorch_ddp.py"
TF_EXAMPLE = "examples/keras_mwms.py"


@dataclass
class Launch:
    """One way a template starts the job."""
    template: str              # path relative to the repository
    name: str                  # e.g. "mpi-per-node" (several launches in one file)
    argv: "list[str]"          # what runs in every platform-started process
    nodes: "int | None" = None            # nodes (instances, replicas, pods, hosts)
    procs_per_node: "int | None" = None   # processes the platform starts per node
    gpus_per_node: "int | None" = None    # GPUs the template asks for per node
    kind: str = ""             # platform distribution type (mpi, pytorch, tensorflow, ...)
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.template}::{self.name}"


def load_yaml(path: Path):
    import yaml  # PyYAML: the `test` extra

    with open(path) as f:
        return list(yaml.safe_load_all(f))


# -- shell scripts ---------------------------------------------------------------------------
def logical_lines(text: str) -> "list[str]":
    """Lines with backslash continuations joined, comments and blank lines dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not cur and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def default_command(text: str) -> "list[str]":
    """The command a shell template runs when given none: `set -- CMD` or ${TRAIN:-CMD}."""
    m = re.search(r'^\s*\[ "\$#" -gt 0 \] \|\| set -- (.+)$', text, re.M)
    if m:
        return shlex.split(m.group(1))
    m = re.search(r'\$\{TRAIN:-([^}]+)\}', text)
    if m:
        return shlex.split(m.group(1))
    raise AssertionError("no default command (`set -- CMD` or ${TRAIN:-CMD}) found")


def shell_commands(text: str) -> "list[list[str]]":
    """Every simple command a shell script runs at its top level (best effort: words of
    each logical line, with `exec` dropped and the template's own command expansions
    ("$@", "${train[@]}") replaced by its default command)."""
    default = default_command(text) if ("set --" in text or "TRAIN:-" in text) else []
    out = []
    for line in logical_lines(text):
        if line.startswith(("#", "set ", "[", "if ", "fi", "else", "then", "for ", "done",
                            "trap ", "read ", "cd ", ":", "mpi=", "mpi+=")) or "=" in line.split(" ")[0]:
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words and words[0] == "exec":
            words = words[1:]
        expanded = []
        for w in words:
            if w in ("$@", "${train[@]}"):
                expanded.extend(default)
            elif w == "${mpi[@]}":
                continue
            else:
                expanded.append(w)
        if expanded:
            out.append(expanded)
    return out


def distenv_run_args(argv: "list[str]") -> "list[str] | None":
    """The arguments after `distenv run` / `python -m distenv run` in argv, else None."""
    for i, w in enumerate(argv):
        if w == "distenv" and argv[i + 1:i + 2] == ["run"]:
            return argv[i + 2:]
        if w == "-m" and argv[i + 1:i + 3] == ["distenv", "run"]:
            return argv[i + 3:]
    return None


# -- Python (ast) ----------------------------------------------------------------------------
def _const(node):
    return ast.literal_eval(node)


def _calls(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if fname == name:
                yield node


def _kw(call, name):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _dict_entries(tree, call_name):
    """(dict key, call) for each `"key": call_name(...)` entry of a dict literal."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(v, ast.Call) and isinstance(k, ast.Constant):
                    f = v.func
                    if (isinstance(f, ast.Name) and f.id == call_name) or \
                            (isinstance(f, ast.Attribute) and f.attr == call_name):
                        yield k.value, v


def _module_consts(tree) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


# -- per platform ----------------------------------------------------------------------------
def _azure_yaml(rel) -> "list[Launch]":
    (job,) = load_yaml(REPO / rel)
    dist = job.get("distribution") or {}
    kind = dist.get("type")
    nodes = job["resources"]["instance_count"]
    per = dist.get("process_count_per_instance", 1 if kind != "tensorflow" else None)
    if kind == "tensorflow":
        per = dist["worker_count"] // nodes
    return [Launch(rel, Path(rel).stem, shlex.split(job["command"]), nodes, per, None, kind,
                   {"job": job})]


_AZURE_DIST = {"MpiDistribution": "mpi", "PyTorchDistribution": "pytorch",
               "TensorFlowDistribution": "tensorflow"}


def _azure_sdk2(rel) -> "list[Launch]":
    tree = ast.parse((REPO / rel).read_text())
    out = []
    for name, call in _dict_entries(tree, "command"):
        dist = _kw(call, "distribution")
        kind = _AZURE_DIST[dist.func.id]
        kwargs = {k.arg: _const(k.value) for k in dist.keywords}
        nodes = _const(_kw(call, "instance_count"))
        per = kwargs.get("process_count_per_instance")
        if kind == "tensorflow":
            per = kwargs["worker_count"] // nodes
        out.append(Launch(rel, name, shlex.split(_const(_kw(call, "command"))), nodes, per,
                          None, kind, {"distribution": kwargs}))
    return out


_AZURE_V1 = {"MpiConfiguration": "mpi", "PyTorchConfiguration": "pytorch",
             "TensorflowConfiguration": "tensorflow"}


def _azure_sdk1(rel) -> "list[Launch]":
    tree = ast.parse((REPO / rel).read_text())
    out = []
    for name, call in _dict_entries(tree, "ScriptRunConfig"):
        cfg = _kw(call, "distributed_job_config")
        kind = _AZURE_V1[cfg.func.id]
        kw = {k.arg: _const(k.value) for k in cfg.keywords}
        if kind == "mpi":
            nodes, per = kw["node_count"], kw["process_count_per_node"]
        elif kind == "pytorch":
            nodes = kw.get("node_count", 1)
            per = kw.get("process_count", nodes) // nodes
        else:
            nodes, per = kw["worker_count"], 1
        cmd = _const(_kw(call, "command"))
        out.append(Launch(rel, name, cmd if isinstance(cmd, list) else shlex.split(cmd),
                          nodes, per, None, kind, {"config": kw}))
    return out


def _gcp(rel) -> "list[Launch]":
    (doc,) = load_yaml(REPO / rel)
    ti = doc["trainingInput"]
    nodes = 1 + ti.get("workerCount", 0)
    out = []
    for role in ("master", "worker"):
        cfg = ti[f"{role}Config"]
        argv = list(cfg.get("containerCommand", [])) + list(cfg.get("containerArgs", []))
        gpus = (cfg.get("acceleratorConfig") or {}).get("count")
        out.append(Launch(rel, role, argv, nodes, 1, gpus, "gcp", {"trainingInput": ti}))
    return out


def _vertex(rel) -> "list[Launch]":
    (doc,) = load_yaml(REPO / rel)
    pools = doc["workerPoolSpecs"]
    nodes = sum(p["replicaCount"] for p in pools[:2])  # pools 2, 3: ps/reduction, evaluators
    out = []
    for i, pool in enumerate(pools):
        c = pool["containerSpec"]
        argv = list(c.get("command", [])) + list(c.get("args", []))
        out.append(Launch(rel, f"workerpool{i}", argv, nodes, 1,
                          pool["machineSpec"].get("acceleratorCount"), "vertex", {"pool": pool}))
    return out


def _container_argv(c) -> "list[str]":
    return list(c.get("command", [])) + list(c.get("args", []))


def _gpus(c) -> "int | None":
    limits = (c.get("resources") or {}).get("limits") or {}
    return limits.get("nvidia.com/gpu")


def _kubeflow(rel) -> "list[Launch]":
    (doc,) = load_yaml(REPO / rel)
    kind, spec, out = doc["kind"], doc["spec"], []
    if kind == "PyTorchJob":
        reps = spec["pytorchReplicaSpecs"]
        nodes = sum(r["replicas"] for r in reps.values())
        for role, r in reps.items():
            (c,) = r["template"]["spec"]["containers"]
            out.append(Launch(rel, role, _container_argv(c), nodes, 1, _gpus(c), kind,
                              {"nprocPerNode": spec.get("nprocPerNode"), "name": doc["metadata"]["name"],
                               "container": c["name"]}))
    elif kind == "TrainJob":
        t = spec["trainer"]
        gpus = ((t.get("resourcesPerNode") or {}).get("limits") or {}).get("nvidia.com/gpu")
        out.append(Launch(rel, "trainer", list(t["command"]) + list(t.get("args", [])),
                          t["numNodes"], 1, gpus, kind, {"numProcPerNode": t["numProcPerNode"]}))
    elif kind == "MPIJob":
        reps = spec["mpiReplicaSpecs"]
        (launcher,) = reps["Launcher"]["template"]["spec"]["containers"]
        (worker,) = reps["Worker"]["template"]["spec"]["containers"]
        out.append(Launch(rel, "launcher", _container_argv(launcher), reps["Worker"]["replicas"],
                          spec["slotsPerWorker"], _gpus(worker), kind,
                          {"name": doc["metadata"]["name"], "worker": _container_argv(worker)}))
    elif kind == "TFJob":
        reps = spec["tfReplicaSpecs"]
        nodes = sum(r["replicas"] for r in reps.values())
        for role, r in reps.items():
            (c,) = r["template"]["spec"]["containers"]
            out.append(Launch(rel, role, _container_argv(c), nodes, 1, _gpus(c), kind,
                              {"container": c["name"]}))
    else:  # pragma: no cover
        raise AssertionError(f"{rel}: unknown kind {kind}")
    return out


def _sagemaker(rel) -> "list[Launch]":
    tree = ast.parse((REPO / rel).read_text())
    consts = _module_consts(tree)
    out = []
    for name, call in _dict_entries(tree, "PyTorch"):
        entry = _const(_kw(call, "entry_point"))
        dist = _kw(call, "distribution")
        dist = _const(dist) if dist is not None else {}
        deps = _const(_kw(call, "dependencies")) if _kw(call, "dependencies") else []
        if entry.endswith(".sh"):
            # SageMaker runs a non-Python entry point as a command, in /opt/ml/code.
            cmds = [c for c in shell_commands((REPO / entry).read_text()) if distenv_run_args(c) is not None]
            argv = cmds[0]
        else:
            argv = ["python", entry]
        per = 1
        if "mpi" in dist:
            per = dist["mpi"]["processes_per_host"]
        elif "torch_distributed" in dist:
            per = None  # torchrun: one per GPU
        out.append(Launch(rel, name, argv, consts["INSTANCE_COUNT"], per, None, "sagemaker",
                          {"entry_point": entry, "distribution": dist, "dependencies": deps,
                           "instance_type": consts["INSTANCE_TYPE"]}))
    return out


def _shell(rel) -> "list[Launch]":
    text = (REPO / rel).read_text()
    cmds = [c for c in shell_commands(text)
            if c[0] in ("srun", "mpiexec", "jsrun") and len(c) > 2]
    return [Launch(rel, Path(rel).stem, cmds[-1], None, None, None, Path(rel).suffix[1:],
                   {"text": text, "commands": cmds})]


def _skypilot(rel) -> "list[Launch]":
    """SkyPilot runs `run` once per node (`num_nodes`), with `accelerators: <name>:<count>`."""
    (task,) = load_yaml(REPO / rel)
    (cmd,) = [c for c in shell_commands(task["run"]) if distenv_run_args(c) is not None]
    gpus = int(str(task["resources"]["accelerators"]).rpartition(":")[2])
    return [Launch(rel, "run", cmd, task["num_nodes"], 1, gpus, "skypilot", {"task": task})]


def _dstack(rel) -> "list[Launch]":
    """dstack's runner runs `commands` once per node (`nodes`), with `resources.gpu`."""
    (task,) = load_yaml(REPO / rel)
    (cmd,) = [shlex.split(c) for c in task["commands"] if distenv_run_args(shlex.split(c)) is not None]
    return [Launch(rel, "commands", cmd, task["nodes"], 1, int(task["resources"]["gpu"]), "dstack",
                   {"task": task})]


def _kubernetes(rel) -> "list[Launch]":
    """An Indexed Job (one pod per completion index) or a JobSet (replicas x completions
    pods per replicated Job), one container each."""
    docs = load_yaml(REPO / rel)
    out = []
    for doc in docs:
        if doc["kind"] == "Job":
            jobs = [("Job", 1, doc["spec"])]
        elif doc["kind"] == "JobSet":
            jobs = [(r["name"], r.get("replicas", 1), r["template"]["spec"])
                    for r in doc["spec"]["replicatedJobs"]]
        else:
            continue
        for name, replicas, spec in jobs:
            (c,) = spec["template"]["spec"]["containers"]
            out.append(Launch(rel, name, _container_argv(c), replicas * spec["completions"], 1,
                              _gpus(c), doc["kind"], {"doc": doc, "job": spec, "container": c,
                                                      "docs": docs}))
    return out


def launches() -> "list[Launch]":
    out: "list[Launch]" = []
    for rel, _fmt in TEMPLATES:
        if rel.startswith("integrations/azureml/job_"):
            out += _azure_yaml(rel)
        elif rel.endswith("sdk2_jobs.py"):
            out += _azure_sdk2(rel)
        elif rel.endswith("sdk1_jobs.py"):
            out += _azure_sdk1(rel)
        elif rel.startswith("integrations/gcp/"):
            out += _gcp(rel)
        elif rel.startswith("integrations/vertex/"):
            out += _vertex(rel)
        elif rel.startswith("integrations/kubeflow/") and rel.endswith(".yaml"):
            out += _kubeflow(rel)
        elif rel.endswith("estimators.py"):
            out += _sagemaker(rel)
        elif rel.endswith((".sbatch", ".lsf", ".pbs")):
            out += _shell(rel)
        elif rel.startswith("integrations/skypilot/"):
            out += _skypilot(rel)
        elif rel.startswith("integrations/dstack/"):
            out += _dstack(rel)
        elif rel.startswith("integrations/kubernetes/"):
            out += _kubernetes(rel)
    return out
