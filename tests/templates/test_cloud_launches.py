"""Each cloud template, fed the environment its platform documents for it.

For every way a template starts the job (template_catalog.launches()), the environment
the platform gives that process - from tests/fixtures/platforms/, written from each
platform's documentation and source - goes through what the template runs:

* `distenv run ...` (per-node templates): `distenv.run.plan()` must start the node's
  workers with torch.distributed.run, with the node count the template asks for, the
  documented node rank and master, and one worker per GPU the template requests;
* the example run directly (per-process templates): `resolve()` must describe a
  per-process launch of the template's size, and `export()` must have everything
  torch's env:// rendezvous needs.

LSF jsrun and Cray PALS (PBS on HPE systems) have no launcher here; their templates get
the same treatment with the variables IBM and HPE document.
"""
from __future__ import annotations

import copy
import json
import shlex
import subprocess
from dataclasses import dataclass, field

import pytest

import template_catalog as cat
from template_catalog import REPO

FIXTURES = REPO / "tests" / "fixtures" / "platforms"


def fixture(name: str) -> dict:
    with open(FIXTURES / f"{name}.json") as f:
        return json.load(f)


# -- derived environments: another replica of the same documented job -------------------------
def retask(case: dict, cluster_spec_task=None, tf_task=None, **set_vars) -> dict:
    """The same job seen from another replica: CLUSTER_SPEC/TF_CONFIG task replaced, and
    plain variables (RANK, PET_NODE_RANK, ...) set."""
    case = copy.deepcopy(case)
    env = case["env"]
    for var, task in (("CLUSTER_SPEC", cluster_spec_task), ("TF_CONFIG", tf_task)):
        if task is not None and var in env:
            spec = json.loads(env[var])
            spec["task"] = {**spec.get("task", {}), **task}
            env[var] = json.dumps(spec)
    env.update(set_vars)
    return case


@dataclass
class Case:
    fixture: str
    derive: dict = field(default_factory=dict)  # retask() arguments
    expect: dict = field(default_factory=dict)  # what the derived replica changes
    gpus: "int | None" = None     # GPUs on the node (default: the template's, else the fixture's)
    shape: bool = True            # the fixture's job has the template's size
    why: str = ""


#: The primary replica of a TensorFlow job: rank 0 on node 0.
CHIEF = dict(rank=0, local_rank=0, node_rank=0)

AZURE = {
    "mpi-per-process": [Case("azureml_mpi_per_process_2x2_rank2")],
    "mpi-per-node": [Case("azureml_mpi_per_node_2nodes_rank1")],
    "pytorch": [Case("azureml_sdk2_pytorch_2nodes_2proc_rank3")],
    "tensorflow": [Case("azureml_tensorflow_worker1")],
}
CASES = {
    # AI Platform: the master is node 0, worker i is node i + 1.
    "gcp/pytorch_config.yaml::master": [Case("gcp_pytorch_master")],
    "gcp/pytorch_config.yaml::worker": [Case("gcp_pytorch_worker0")],
    "gcp/tensorflow_config.yaml::master": [
        Case("gcp_tensorflow_worker", dict(tf_task={"type": "chief", "index": 0}), CHIEF)],
    "gcp/tensorflow_config.yaml::worker": [Case("gcp_tensorflow_worker")],
    # Vertex: workerpool0 is node 0; a custom container (no RANK/WORLD_SIZE) too.
    "vertex/pytorch_job.yaml::workerpool0": [Case("vertex_pytorch_workerpool0")],
    "vertex/pytorch_job.yaml::workerpool1": [
        Case("vertex_pytorch_workerpool1_index1"),
        Case("vertex_custom_container_workerpool1_index0",
             why="custom container: only CLUSTER_SPEC (and TF_CONFIG, which the template unsets)")],
    "vertex/tensorflow_job.yaml::workerpool0": [
        Case("vertex_custom_container_workerpool1_index0",
             dict(cluster_spec_task={"type": "workerpool0", "index": 0},
                  tf_task={"type": "chief", "index": 0}), CHIEF)],
    "vertex/tensorflow_job.yaml::workerpool1": [Case("vertex_custom_container_workerpool1_index0")],
    "sagemaker/estimators.py::per-node": [Case("sagemaker_no_launcher_2hosts_host2")],
    "sagemaker/estimators.py::torch-distributed": [Case("sagemaker_torch_distributed_2hosts_rank5")],
    "sagemaker/estimators.py::mpi": [
        Case("sagemaker_mpi_2hosts_rank3", shape=False,
             why="the documented job runs 2 processes per host, the template 4 (one per GPU)")],
    "kubeflow/pytorchjob.yaml::Master": [
        Case("kubeflow_pytorchjob_v1_nproc2_pod1", dict(RANK="0", PET_NODE_RANK="0"),
             dict(node_rank=0))],
    "kubeflow/pytorchjob.yaml::Worker": [Case("kubeflow_pytorchjob_v1_nproc2_pod1")],
    "kubeflow/trainjob.yaml::trainer": [Case("kubeflow_trainer_v2_node1")],
    "kubeflow/mpijob.yaml::launcher": [Case("kubeflow_mpijob_rank3")],
    "kubeflow/tfjob.yaml::Chief": [
        Case("kubeflow_tfjob_worker1", dict(tf_task={"type": "chief", "index": 0}), CHIEF)],
    "kubeflow/tfjob.yaml::Worker": [Case("kubeflow_tfjob_worker1")],
    # SkyPilot, dstack: every node runs the same line; each node's documented environment.
    "skypilot/train.yaml::run": [Case("skypilot_2x4_node0"), Case("skypilot_2x4_node1")],
    "dstack/train.dstack.yml::commands": [Case("dstack_2x4_node0"), Case("dstack_2x4_node1")],
    "kubernetes/indexed_job.yaml::Job": [
        Case("k8s_indexed_job_2pods_pod1"),
        Case("k8s_indexed_job_2pods_pod1", dict(JOB_COMPLETION_INDEX="0", HOSTNAME="distenv-ddp-0"),
             dict(node_rank=0))],
    "kubernetes/jobset.yaml::workers": [Case(f"jobset_2jobs_job{j}_pod{p}")
                                        for j in (0, 1) for p in (0, 1)],
}


def cases_for(launch) -> "list[Case]":
    short = launch.key.split("integrations/", 1)[1]
    if launch.template.startswith("integrations/azureml/"):
        name = launch.name[4:].replace("_", "-") if launch.name.startswith("job_") else launch.name
        return AZURE.get(name, [])
    return CASES.get(short, [])


def _launches():
    try:
        import yaml  # noqa: F401
    except ModuleNotFoundError:
        return []
    return [l for l in cat.launches() if not l.template.endswith((".sbatch", ".lsf", ".pbs"))]


LAUNCHES = _launches()


def test_yaml_available():
    pytest.importorskip("yaml", reason="PyYAML parses the YAML templates: pip install pyyaml "
                        "(it is in the `test` extra)")
    assert len(LAUNCHES) >= 28


def test_every_cloud_launch_has_a_documented_environment():
    missing = [l.key for l in LAUNCHES if not cases_for(l)]
    assert not missing, f"cloud launches without a documented-environment case: {missing}"


# -- running a template's argv against an environment ----------------------------------------
def strip_env(argv, env):
    """Apply a leading `env -u VAR ... K=V` to (argv, env) as env(1) would."""
    env = dict(env)
    if argv and argv[0] == "env":
        i = 1
        while i < len(argv):
            if argv[i] == "-u":
                env.pop(argv[i + 1], None)
                i += 2
            elif "=" in argv[i] and not argv[i].startswith("-"):
                k, _, v = argv[i].partition("=")
                env[k] = v
                i += 1
            else:
                break
        argv = argv[i:]
    return argv, env


@pytest.fixture
def planner(monkeypatch):
    """distenv.run.plan(), with the container's interpreter taken to have torch (it does:
    the templates' images and environments install it)."""
    from distenv import run

    monkeypatch.setattr(run, "_has_torch", lambda python, environ: True)
    return run.plan


def _flag(argv, name):
    return argv[argv.index(name) + 1]


IDS = [l.key.split("integrations/", 1)[1] for l in LAUNCHES]


@pytest.fixture
def gpus_on_node(monkeypatch, tmp_path):
    """gpus_on_node(n): GPU discovery sees n GPUs (a fresh driver directory per call)."""
    import itertools

    import distenv.core.gpus

    counter = itertools.count()

    def make(n):
        d = tmp_path / f"nvidia-gpus-{next(counter)}"
        d.mkdir()
        for i in range(n):
            (d / f"0000:{i:02x}:00.0").mkdir()
        monkeypatch.setattr(distenv.core.gpus, "NVIDIA_DIR", str(d))

    return make


@pytest.mark.parametrize("launch", LAUNCHES, ids=IDS)
def test_documented_environment_gives_the_template_launch(launch, gpus_on_node, planner):
    from distenv import resolve

    for case in cases_for(launch):
        data = retask(fixture(case.fixture), **case.derive)
        expected = {**data["expected"], **case.expect}
        gpus = case.gpus or launch.gpus_per_node or data.get("gpus", 0)
        gpus_on_node(gpus)
        where = f"{launch.key} with {case.fixture} {case.derive or ''} ({gpus} GPUs)"

        if launch.kind == "MPIJob":
            _check_mpijob(launch, data, expected, where)
            continue
        argv, env = strip_env(launch.argv, data["env"])
        args = cat.distenv_run_args(argv)
        if args is not None:
            # Per-node template: distenv run starts this node's workers.
            p = planner(args, env)
            assert p.mode == "torchrun", f"{where}: expected a per-node launch, got {p!r}"
            assert p.argv[1:4] == ["-m", "distenv.run", "--torch-elastic-agent"], where  # torch.distributed.run
            nproc = int(_flag(p.argv, "--nproc-per-node"))
            assert int(_flag(p.argv, "--nnodes")) == launch.nodes, where
            assert int(_flag(p.argv, "--node-rank")) == expected["node_rank"], where
            assert _flag(p.argv, "--master-addr") == expected["master_addr"], where
            assert nproc == (launch.gpus_per_node or expected["nproc_per_node"]), where
            if "master_port" in expected:
                assert int(_flag(p.argv, "--master-port")) == expected["master_port"], where
            assert p.argv[p.argv.index("--no-python") + 1:] == ["python", cat.TORCH_EXAMPLE], where
            assert p.env.world_size == launch.nodes * nproc, where
            for var in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
                assert var in p.environ, f"{where}: {var} not exported"
        else:
            # Per-process template: the example resolves itself.
            env_ = resolve(env)
            assert env_.launch == "per-process", f"{where}: {env_.explain()}"
            for key in ("rank", "world_size", "local_rank", "node_rank", "num_nodes", "master_addr"):
                assert getattr(env_, key) == expected[key], f"{where}: {key}\n{env_.explain()}"
            if case.shape and launch.procs_per_node:
                assert env_.world_size == launch.nodes * launch.procs_per_node, \
                    f"{where}: world {env_.world_size} is not {launch.nodes} x {launch.procs_per_node}"
            elif case.shape:   # torchrun per GPU (SageMaker torch_distributed)
                assert env_.num_nodes == launch.nodes, where
            scratch: dict = {}
            env_.export(scratch)
            assert {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"} <= set(scratch), where


def _check_mpijob(launch, data, expected, where):
    """MPIJob: the launcher's own shell derives MASTER_ADDR from the operator's host file;
    every rank then resolves its place from Open MPI's variables."""
    from distenv import resolve

    script = launch.argv[2]
    words = shlex.split(script)
    assert words[:2] == ["exec", "mpirun"], where
    np_ = int(words[words.index("-np") + 1])
    assert np_ == launch.nodes * launch.procs_per_node, f"{where}: -np {np_}"
    assert expected["world_size"] == np_, where
    # The host file as mpi-operator writes it: "<job>-worker-<i>.<job>.<ns>.svc slots=<n>".
    job = launch.extra["name"]
    hosts = [f"{job}-worker-{i}.{job}.default.svc" for i in range(launch.nodes)]
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".hostfile") as hf:
        hf.write("".join(f"{h} slots={launch.procs_per_node}\n" for h in hosts))
        hf.flush()
        expr = next(w for w in words if w.startswith("MASTER_ADDR="))
        # Evaluate the template's own expression with bash, as the launcher pod does.
        inner = script[script.index("MASTER_ADDR=") + len("MASTER_ADDR="):]
        inner = inner[:inner.index('")"') + 3]
        p = subprocess.run(["bash", "-c", f"printf %s {inner}"], capture_output=True, text=True,
                           env={"OMPI_MCA_orte_default_hostfile": hf.name, "PATH": "/usr/bin:/bin"},
                           timeout=30)
    assert p.returncode == 0, f"{where}: {expr}: {p.stderr}"
    master = p.stdout
    assert master == hosts[0], f"{where}: MASTER_ADDR={master!r}"
    env = dict(data["env"], MASTER_ADDR=master)
    got = resolve(env)
    assert got.launch == "per-process", where
    assert (got.rank, got.world_size, got.local_world_size) == (
        expected["rank"], np_, launch.procs_per_node), where
    assert got.master_addr == master, where
    scratch: dict = {}
    got.export(scratch)
    assert scratch["MASTER_ADDR"] == master and scratch["WORLD_SIZE"] == str(np_), where
    # Without the template's MASTER_ADDR there is nothing to rendezvous at (documented trap).
    from distenv import DistEnvError

    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        resolve(data["env"]).export({})


# -- LSF jsrun and Cray PALS: documented variables --------------------------------------------
def _jsm(rank, size, local_rank, local_size):
    """What jsrun gives each task (IBM Spectrum LSF JSM: JSM_NAMESPACE_*), plus the job."""
    return {"JSM_NAMESPACE_RANK": str(rank), "JSM_NAMESPACE_SIZE": str(size),
            "JSM_NAMESPACE_LOCAL_RANK": str(local_rank), "JSM_NAMESPACE_LOCAL_SIZE": str(local_size),
            "JSM_NAMESPACE_ID": "1", "LSB_JOBID": "123456", "LSB_JOBNAME": "distenv",
            "PMIX_RANK": str(rank), "PMIX_NAMESPACE": "jsm-1"}


def test_lsf_per_process_template(fake_gpus):
    """jsrun -n 12 (2 nodes x 6 GPUs), task 7; MASTER_ADDR as the template exports it."""
    from distenv import resolve

    text = (REPO / "integrations/lsf/per_process.lsf").read_text()
    assert 'MASTER_ADDR="${MASTER_ADDR:-$(jsrun -n 1' in text
    fake_gpus(6)
    env = resolve({**_jsm(7, 12, 1, 6), "MASTER_ADDR": "h1"})
    assert (env.launcher, env.launch, env.rank, env.world_size, env.local_rank) == (
        "lsf", "per-process", 7, 12, 1)
    scratch: dict = {}
    env.export(scratch)
    assert scratch["MASTER_ADDR"] == "h1" and scratch["RANK"] == "7"
    # jsrun alone does not reveal rank 0's host: hence the template's MASTER_ADDR line.
    from distenv import DistEnvError

    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        resolve(_jsm(7, 12, 1, 6)).export({})


def test_lsf_per_node_template(fake_gpus, planner):
    """jsrun -n 2 -r 1 (one resource set per node) + distenv run --nproc-per-node gpu."""
    (launch,) = [l for l in cat.launches() if l.template.endswith("per_node.lsf")]
    fake_gpus(6)
    args = [a if a != "$nproc" else "gpu" for a in cat.distenv_run_args(launch.argv)]
    p = planner(args, {**_jsm(1, 2, 0, 1), "MASTER_ADDR": "h1"})
    assert p.mode == "torchrun"
    assert (_flag(p.argv, "--nnodes"), _flag(p.argv, "--node-rank"),
            _flag(p.argv, "--nproc-per-node"), _flag(p.argv, "--master-addr")) == ("2", "1", "6", "h1")


def _pals(rank, size, local_rank, local_size, node):
    """What Cray PALS mpiexec gives each rank (HPE Cray PALS: PALS_*, PMI_SIZE), plus PBS."""
    return {"PALS_RANKID": str(rank), "PALS_LOCAL_RANKID": str(local_rank),
            "PALS_LOCAL_SIZE": str(local_size), "PALS_NODEID": str(node), "PMI_SIZE": str(size),
            "PALS_APID": "6f1c2a3b-0c5d-4e6f-8a9b-0c1d2e3f4a5b", "PBS_JOBID": "4242.pbs01",
            "PBS_NODEFILE": "/var/spool/pbs/aux/4242.pbs01"}


def test_pbs_templates_on_cray_pals(fake_gpus, planner, monkeypatch):
    """The PBS templates' MASTER_ADDR/MASTER_PORT with PALS's variables (HPE Cray EX):
    per-process resolves; per-node (mpiprocs=1) plans torch.distributed.run."""
    from distenv import DistEnvError, resolve

    port = {"MASTER_ADDR": "x1000c0s0b0n0", "MASTER_PORT": str(20000 + 4242 % 10000)}
    env = resolve({**_pals(5, 8, 1, 4, 1), **port})
    assert (env.launcher, env.launch, env.rank, env.world_size) == ("pals", "per-process", 5, 8)
    assert env.node_rank is None  # PALS_NODEID is PALS's node index, not the node rank
    scratch: dict = {}
    env.export(scratch)
    assert scratch["MASTER_ADDR"] == "x1000c0s0b0n0"

    (launch,) = [l for l in cat.launches() if l.template.endswith("per_node.pbs")]
    fake_gpus(4)
    args = [a if a != "$nproc" else "gpu" for a in cat.distenv_run_args(launch.argv)]
    node = {**_pals(1, 2, 0, 1, 1), **port}
    # PALS gives no node count: a lone rank proves no per-node layout (mpiexec -n 3 may place
    # 2 + 1); distenv run asks the apinfo file, which this pure plan does not read
    with pytest.raises(DistEnvError, match="a per-node launch needs num_nodes"):
        planner(args, node)
    # ... and plans from what the apinfo file answers (one process on each of 2 hosts)
    from distenv import bringup
    from distenv.discovery.apply import Answer, per_node

    answered = per_node(resolve({**node, "DISTENV_NPROC_PER_NODE": "4"}),
                        Answer("apinfo", 1, 2, ["x1000c0s0b0n0", "x1000c0s0b1n0"], "the apinfo file"))
    monkeypatch.setattr(bringup, "bring_up", lambda *a, **k: answered)
    p = planner(args, node)
    assert p.mode == "torchrun"
    assert (_flag(p.argv, "--nnodes"), _flag(p.argv, "--node-rank"),
            _flag(p.argv, "--nproc-per-node"), _flag(p.argv, "--master-port")) == ("2", "1", "4", "24242")
