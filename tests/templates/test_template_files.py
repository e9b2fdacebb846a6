"""Every job template parses, runs only commands this repository has, passes `distenv
run` arguments its parser accepts, and hard-codes no rank, node rank or master address."""
from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess

import pytest

import template_catalog as cat
from template_catalog import REPO, TEMPLATES

IDS = [rel.split("integrations/", 1)[1] for rel, _ in TEMPLATES]


def test_every_template_file_is_listed():
    """A template added to a platform folder without being listed here would go untested."""
    listed = {rel for rel, _ in TEMPLATES}
    skip = {"README.md"}
    found = set()
    for d in cat.TEMPLATE_DIRS:
        for p in (REPO / d).iterdir():
            if p.is_file() and p.name not in skip and not p.name.startswith("."):
                found.add(str(p.relative_to(REPO)))
    assert found - listed == set(), "templates not in template_catalog.TEMPLATES"
    assert listed - found == set(), "listed templates that do not exist"


@pytest.mark.parametrize("rel,fmt", TEMPLATES, ids=IDS)
def test_parses(rel, fmt):
    path = REPO / rel
    text = path.read_text()
    if fmt == "yaml":
        pytest.importorskip("yaml", reason="PyYAML parses the YAML templates: pip install pyyaml "
                            "(it is in the `test` extra)")
        docs = cat.load_yaml(path)
        assert docs and all(isinstance(d, dict) for d in docs), f"{rel}: not a YAML mapping"
        # Nothing in a job spec is JSON-in-YAML except what the platform parses; still, any
        # JSON-looking string must be valid JSON.
        for s in re.findall(r"'(\{.*?\})'", text):
            json.loads(s)
    elif fmt == "python":
        tree = ast.parse(text, filename=rel)
        # The cloud SDKs are imported inside functions only: the file imports anywhere.
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in top:
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            assert all(m.split(".")[0] in ("__future__", "argparse", "os", "sys") for m in mods), \
                f"{rel}: top-level import of {mods}: import SDKs inside functions"
    elif fmt in ("bash", "sh"):
        shell = shutil.which(fmt)
        if shell is None:
            pytest.skip(f"{fmt} not found: it checks the script's syntax (`{fmt} -n`)")
        p = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, f"{fmt} -n {rel}: {p.stderr}"
        assert text.startswith(f"#!/bin/{fmt}\n"), f"{rel}: first line must be #!/bin/{fmt}"
    elif fmt == "dockerfile":
        instructions = [ln.split()[0] for ln in cat.logical_lines(text)]
        assert instructions[0] == "FROM", f"{rel}: must start with FROM"
        known = {"FROM", "ARG", "RUN", "WORKDIR", "COPY", "ENV", "ENTRYPOINT", "CMD"}
        assert set(instructions) <= known, f"{rel}: unknown instructions {set(instructions) - known}"
    else:  # pragma: no cover
        raise AssertionError(fmt)


# -- what each template runs exists in the repository ----------------------------------------
PATH_RE = re.compile(r"(?<![\w/.-])((?:examples|integrations|src|tests)/[\w./-]*\w)")


@pytest.mark.parametrize("rel,fmt", TEMPLATES, ids=IDS)
def test_referenced_paths_exist(rel, fmt):
    """Every repository path a template names (scripts it runs, files it uploads or copies)."""
    text = (REPO / rel).read_text()
    missing = sorted({m for m in PATH_RE.findall(text) if not (REPO / m).exists()})
    assert not missing, f"{rel} names paths that do not exist: {missing}"


def _relative_refs(rel):
    """Paths a template gives relative to its own folder (Azure's code:, conda_file:)."""
    if rel.startswith("integrations/azureml/job_"):
        (job,) = cat.load_yaml(REPO / rel)
        yield job["code"]
        yield job["environment"]["conda_file"]
    if rel.endswith("Dockerfile"):
        for line in cat.logical_lines((REPO / rel).read_text()):
            if line.startswith("COPY"):
                for src in line.split()[1:-1]:
                    yield "../../" + src   # the build context is the repository root


@pytest.mark.parametrize("rel", [r for r, _ in TEMPLATES
                                 if r.startswith("integrations/azureml/job_") or r.endswith("Dockerfile")])
def test_relative_references_exist(rel):
    pytest.importorskip("yaml", reason="PyYAML parses the YAML templates: pip install pyyaml")
    base = (REPO / rel).parent
    for ref in _relative_refs(rel):
        assert (base / ref).resolve().exists(), f"{rel}: {ref} does not exist"


def _launch_ids(launches):
    return [l.key.split("integrations/", 1)[1] for l in launches]


@pytest.fixture(scope="module")
def all_launches():
    pytest.importorskip("yaml", reason="PyYAML parses the YAML templates: pip install pyyaml")
    return cat.launches()


def test_every_template_starts_the_example(all_launches):
    """Each launch runs the example (PyTorch, or Keras for TensorFlow jobs) - directly, or
    through `distenv run`."""
    assert len(all_launches) >= 30
    for l in all_launches:
        words = " ".join(l.argv)
        assert cat.TORCH_EXAMPLE in words or cat.TF_EXAMPLE in words, f"{l.key}: {l.argv}"
        if l.kind in ("tensorflow", "TFJob") or "tensorflow" in l.template:
            assert cat.TF_EXAMPLE in words, f"{l.key}: a TensorFlow job runs the Keras example"


def _programs(argv):
    """The programs in an argv, through `env`, `bash -c`, launchers and `distenv run`."""
    if argv[:2] == ["bash", "-c"]:
        inner = shlex.split(argv[2])
        yield from _programs(inner[1:] if inner[0] == "exec" else inner)
        return
    if argv and argv[0] == "env":
        i = 1
        while i < len(argv) and (argv[i].startswith("-") or "=" in argv[i]):
            i += 2 if argv[i] == "-u" else 1
        yield from _programs(argv[i:])
        return
    yield argv


def test_commands_exist_in_the_repository(all_launches):
    """`distenv` is this repository's console script, `python -m distenv` its package,
    `python <script>` one of its files."""
    scripts = _console_scripts()
    assert "distenv" in scripts
    for l in all_launches:
        for argv in _programs(l.argv):
            prog = argv[0]
            if prog == "distenv":
                assert scripts["distenv"] == "distenv.cli:main"
            if prog == "python":
                if argv[1:3] == ["-m", "distenv"]:
                    assert (REPO / "src" / "distenv" / "__main__.py").exists()
                else:
                    assert (REPO / argv[1]).is_file(), f"{l.key}: {argv[1]} is not in the repository"
            args = cat.distenv_run_args(argv)
            if args is not None:
                cmd = args[args.index("--") + 1:] if "--" in args else args
                assert cmd[0] == "python" and (REPO / cmd[1]).is_file(), f"{l.key}: {cmd}"


def _console_scripts():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli", reason="reads pyproject.toml on Python < 3.11")
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


SAMPLE = {"$nproc": "2", "$NPROC_PER_NODE": "2"}


def test_distenv_run_accepts_the_arguments(all_launches):
    """Every `distenv run ...` in a template goes through the CLI's own parser."""
    from distenv import run

    seen = 0
    for l in all_launches:
        for argv in _programs(l.argv):
            args = cat.distenv_run_args(argv)
            if args is None:
                continue
            args = [SAMPLE.get(a, a) for a in args]
            assert not [a for a in args if a.startswith("$")], f"{l.key}: unresolved {args}"
            opts, cmd = run.parse(args)
            assert cmd[:2] in (["python", cat.TORCH_EXAMPLE],), f"{l.key}: {cmd}"
            assert opts["local_rank_arg"] == "none"
            seen += 1
    assert seen >= 12


@pytest.mark.parametrize("rel", [r for r, f in TEMPLATES if f in ("bash", "sh")])
def test_shell_distenv_run_lines_parse(rel):
    """Shell templates: the `distenv run` line with the template's own variables filled in."""
    from distenv import run

    text = (REPO / rel).read_text()
    lines = [c for c in cat.shell_commands(text) if cat.distenv_run_args(c) is not None]
    if rel.endswith(("per_process.sbatch", "per_process.lsf", "per_process.pbs")):
        assert not lines, f"{rel}: a per-process template runs the example directly"
        return
    assert len(lines) == 1, f"{rel}: expected one `distenv run` line, got {lines}"
    args = [SAMPLE.get(a, a) for a in cat.distenv_run_args(lines[0])]
    opts, cmd = run.parse(args)
    assert opts["nproc_per_node"] in ("2", "gpu", None)
    assert cmd == ["python", cat.TORCH_EXAMPLE]


# -- nothing hard-coded ----------------------------------------------------------------------
#: Launcher flags that would pin a process's place in the job.
PINNING_FLAGS = re.compile(r"--node[-_]rank|--master[-_]addr|--master[-_]port|--rdzv[-_]endpoint")
#: Variables that would: `NAME=value`, `NAME: value` (YAML), `${NAME:-value}` (shell default).
PINNING_VARS = re.compile(
    r"\b(RANK|LOCAL_RANK|NODE_RANK|GROUP_RANK|WORLD_SIZE|PET_NODE_RANK|PET_MASTER_ADDR|"
    r"MASTER_ADDR|SKYPILOT_NODE_RANK|SKYPILOT_NODE_IPS|SKYPILOT_NUM_NODES|DSTACK_NODE_RANK|"
    r"DSTACK_NODES_IPS|DSTACK_NODES_NUM|DSTACK_MASTER_NODE_IP|JOB_COMPLETION_INDEX)"
    r"(?:\s*=|:-|:\s)\s*[\"']?(\S*)")


@pytest.mark.parametrize("rel,fmt", TEMPLATES, ids=IDS)
def test_no_rank_node_rank_or_master_address_is_hard_coded(rel, fmt):
    text = (REPO / rel).read_text()
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    flags = PINNING_FLAGS.findall(code)
    assert not flags, f"{rel} pins a node rank or rendezvous address: {flags}"
    # A value may only be *derived* at run time (node file, jsrun, host file): $(...), ${...}.
    bad = [m.group(0) for m in PINNING_VARS.finditer(code) if not m.group(2).startswith("$")]
    assert not bad, f"{rel} pins a rank or address: {bad}"


def test_the_pinning_check_sees_the_platforms_variables():
    """The check above, on the lines a template must never hold."""
    for line in ("SKYPILOT_NODE_RANK=1", "export DSTACK_MASTER_NODE_IP=10.0.0.1",
                 "  DSTACK_NODES_NUM: 2", "JOB_COMPLETION_INDEX=0", "MASTER_ADDR: head"):
        assert [m.group(0) for m in PINNING_VARS.finditer(line) if not m.group(2).startswith("$")], line
    assert not [m for m in PINNING_VARS.finditer("N=${SKYPILOT_NUM_NODES}") if not m.group(2).startswith("$")]


#: What a Kubernetes pod template may give its container literally: copies of the Job's own
#: spec (checked equal below). The pod's place comes from Kubernetes (JOB_COMPLETION_INDEX) or
#: from the pod's labels through the downward API, never from a value in the template.
K8S_LITERAL = {"DISTENV_JOB_COMPLETIONS": lambda job: str(job["completions"]),
               "DISTENV_JOB_SUBDOMAIN": lambda job: job["template"]["spec"]["subdomain"]}
#: The downward-API field each variable must come from.
K8S_FIELDS = {
    "DISTENV_JOB_NAME": ("metadata.labels['batch.kubernetes.io/job-name']",),
    **{f"DISTENV_JOBSET_{var}": (f"metadata.labels['jobset.sigs.k8s.io/{key}']",
                                 f"metadata.annotations['jobset.sigs.k8s.io/{key}']")
       for var, key in (("JOB_GLOBAL_INDEX", "job-global-index"), ("GLOBAL_REPLICAS", "global-replicas"),
                        ("REPLICATED_JOB_REPLICAS", "replicatedjob-replicas"),
                        ("COORDINATOR", "coordinator"))},
}


def test_kubernetes_templates_pass_the_pod_s_place_only_through_the_downward_api(all_launches):
    """Indexed Job and JobSet: every DISTENV_ variable a pod gets is a copy of its Job's own
    spec (equal to it: completions = parallelism, the subdomain, a headless Service that selects
    the Job's pods) or a downward-API field of the pod's labels; nothing is typed per pod."""
    seen = set()
    for l in all_launches:
        if l.kind not in ("Job", "JobSet"):
            continue
        job, env = l.extra["job"], l.extra["container"].get("env", [])
        assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"], l.key
        for item in env:
            name = item["name"]
            seen.add(name)
            assert name != "JOB_COMPLETION_INDEX", f"{l.key}: Kubernetes sets JOB_COMPLETION_INDEX"
            if name in K8S_LITERAL:
                assert item.get("value") == K8S_LITERAL[name](job), f"{l.key}: {item}"
            elif name.startswith("DISTENV_"):
                assert "value" not in item, f"{l.key}: {name} typed by hand"
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                assert path in K8S_FIELDS[name], f"{l.key}: {name} from {path}"
        if l.kind == "Job":
            sub = job["template"]["spec"]["subdomain"]
            (svc,) = [d for d in l.extra["docs"] if d["kind"] == "Service"]
            assert svc["metadata"]["name"] == sub and svc["spec"]["clusterIP"] == "None", l.key
            assert svc["spec"]["selector"] == {"batch.kubernetes.io/job-name": l.extra["doc"]["metadata"]["name"]}
        else:
            assert l.extra["doc"]["spec"]["coordinator"]["replicatedJob"] == l.name, l.key
            assert len(l.extra["doc"]["spec"]["replicatedJobs"]) == 1, \
                f"{l.key}: the pods that train together are one replicated Job"
    assert seen >= {"DISTENV_JOB_COMPLETIONS", "DISTENV_JOB_NAME", "DISTENV_JOB_SUBDOMAIN",
                    "DISTENV_JOBSET_JOB_GLOBAL_INDEX", "DISTENV_JOBSET_COORDINATOR"}


# -- distenv reaches the nodes ---------------------------------------------------------------
def test_distenv_is_on_every_platforms_nodes(all_launches):
    """Each template gets distenv where it runs: Azure uploads the repository with
    PYTHONPATH=src; SageMaker ships src/distenv (and examples/ for the per-node entry
    point) in /opt/ml/code, which is on PYTHONPATH; the container platforms use the image
    of integrations/kubeflow/Dockerfile, which pip-installs this checkout (the `distenv`
    console script); SkyPilot syncs its workdir and dstack clones its repo (this checkout) to
    every node, where they pip-install it; HPC templates run on the cluster's shared file
    system. A template of another kind fails until its way is checked here."""
    docker = (REPO / "integrations/kubeflow/Dockerfile").read_text()
    assert "COPY src ./src" in docker and re.search(r"pip install [^\n]*\s\.\s*$", docker, re.M)
    for l in all_launches:
        if l.template.startswith("integrations/azureml/job_"):
            job = l.extra["job"]
            assert job["environment_variables"]["PYTHONPATH"] == "src", l.key
            assert (REPO / l.template).parent.joinpath(job["code"]).resolve() == REPO, l.key
        elif l.template.endswith(("sdk1_jobs.py", "sdk2_jobs.py")):
            text = (REPO / l.template).read_text()
            assert '{"PYTHONPATH": "src"}' in text and "REPO" in text, l.key
        elif l.template.endswith("estimators.py"):
            deps = l.extra["dependencies"]
            assert "src/distenv" in deps, l.key
            if l.extra["entry_point"].endswith(".sh"):
                assert "examples" in deps, f"{l.key}: the entry point runs examples/..."
            assert "/opt/ml/code" in (REPO / l.template).read_text()
        elif l.kind in ("PyTorchJob", "TrainJob", "MPIJob", "TFJob", "gcp", "vertex", "Job",
                        "JobSet"):
            text = (REPO / l.template).read_text()
            assert "integrations/kubeflow/Dockerfile" in text, f"{l.key}: which image?"
        elif l.kind == "skypilot":
            # `workdir` (sky launch from the repository root) is synced to every node; setup
            # installs it.
            task = l.extra["task"]
            assert (REPO / task["workdir"]).resolve() == REPO, l.key
            assert re.search(r"pip install [^\n]*\.\s*$", task["setup"], re.M), l.key
        elif l.kind == "dstack":
            # `repos` paths are relative to the configuration file; the commands install it.
            task = l.extra["task"]
            (repo,) = task["repos"]
            assert ((REPO / l.template).parent / repo).resolve() == REPO, l.key
            assert any(re.search(r"pip install .*\s\.$", c) for c in task["commands"]), l.key
        elif not l.template.endswith((".sbatch", ".lsf", ".pbs")):  # HPC: a shared file system
            raise AssertionError(f"{l.key}: how does distenv reach this platform's nodes?")
