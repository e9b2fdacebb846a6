"""`distenv.auto` and ``DISTENV_AUTO=1``: inert outside a distributed launch, never imports a
framework the script did not import, applies the adapters right after the script imports one.

Every case runs in a fresh interpreter (sys.modules and os.environ are what is checked).
Fake frameworks (packages written to a temp dir) and a fake adapter that records its calls
exercise the import hook without any real framework installed.
"""

import json
import os
import site
import subprocess
import sys
import textwrap

import pytest

import distenv.auto
from envs import ompi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")
FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "lightning_fabric", "transformers",
              "accelerate", "deepspeed", "tensorflow", "keras", "tf_keras", "horovod", "jax",
              "mpi4py", "numpy")
MODULES = json.dumps(FRAMEWORKS)
OMPI_2 = ompi(1, 2, 1, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="1",
              OMPI_MCA_orte_hnp_uri="2197356545.0;tcp://10.0.0.1:41231",
              OMPI_MCA_ess_base_jobid="2197356545")
REPORT = textwrap.dedent(f"""
    import json, os, sys
    def report(**extra):
        auto = sys.modules.get("distenv.auto")
        out = {{
            "distenv_imported": "distenv" in sys.modules,
            "auto_imported": auto is not None,
            "env": None if auto is None or auto.env is None else auto.env.to_dict(),
            "hooked": any(type(f).__name__ == "_Finder" for f in sys.meta_path),
            "only": sorted(getattr(sys.modules.get("distenv.auto"), "_only", None) or []),
            "frameworks": sorted(m for m in sys.modules if m.split(".")[0] in {MODULES}),
            "adapters": sorted(m for m in sys.modules if m.startswith("distenv.") and m.split(".")[1]
                               in ("torch", "lightning", "transformers", "deepspeed", "tensorflow",
                                   "keras", "horovod")),
            "vars": {{k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                     "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")}},
        }}
        out.update(extra)
        print("REPORT " + json.dumps(out))
""")


def _has_pth() -> bool:
    """The interpreter running the tests has distenv_auto.pth installed (pip install [-e] .)."""
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
    return any(os.path.exists(os.path.join(d, "distenv_auto.pth")) for d in dirs)


# CI's .venv has distenv installed (`pip install -e .`), so distenv_auto.pth is there: under
# DISTENV_REQUIRE_LAUNCHERS=1 a skip for its absence is a failure (tests/conftest.py).
pytestmark = pytest.mark.required

needs_pth = pytest.mark.skipif(not _has_pth(), reason="distenv_auto.pth is not installed for this "
                               "interpreter: `pip install -e .` (or the wheel) installs it")


def run_py(code, env_extra=None, fake=None, timeout=60):
    """Run `code` (after the REPORT helper) in a fresh interpreter; returns (report, proc)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "SLURM_", "DISTENV_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join(([str(fake)] if fake else []) + [SRC])
    env.update(env_extra or {})
    p = subprocess.run(["timeout", "-k", "5", str(timeout), sys.executable, "-c", REPORT + textwrap.dedent(code)],
                       env=env, capture_output=True, text=True, timeout=timeout + 10)
    reports = [json.loads(line[len("REPORT "):]) for line in p.stdout.splitlines() if line.startswith("REPORT ")]
    return (reports[-1] if reports else None), p


@pytest.fixture
def fake(tmp_path):
    """Fake frameworks `fakefw` (imports `fakefw_inner`) and a fake adapter recording calls."""
    root = tmp_path / "fake"
    (root / "fakefw").mkdir(parents=True)
    (root / "fakefw" / "__init__.py").write_text(textwrap.dedent("""
        import fakefw_inner
        from . import sub
        READY = True
    """))
    (root / "fakefw" / "sub.py").write_text("VALUE = 42\n")
    (root / "fakefw" / "data.txt").write_text("resource\n")
    (root / "fakefw_inner.py").write_text("READY = True\n")
    (root / "fakefw_alone.py").write_text("READY = True\n")
    (root / "fake_adapter.py").write_text(textwrap.dedent("""
        import sys
        CALLS = []
        def _state(name):
            mod = sys.modules.get(name)
            return None if mod is None else getattr(mod, "READY", False)
        def patch_outer():
            CALLS.append(("outer", _state("fakefw"), _state("fakefw_inner")))
        def patch_inner():
            CALLS.append(("inner", _state("fakefw"), _state("fakefw_inner")))
        def patch_alone():
            CALLS.append(("alone", _state("fakefw_alone"), None))
    """))
    return root


HOOK_FAKES = """
import distenv.auto as a
a.HOOKS.clear()
a.HOOKS.update({"fakefw": ("fake_adapter", "patch_outer"), "fakefw_inner": ("fake_adapter", "patch_inner"),
                "fakefw_alone": ("fake_adapter", "patch_alone")})
"""


# -- inert outside a distributed launch -------------------------------------------------------
@needs_pth
@pytest.mark.parametrize("extra", [{}, {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"},
                                   {"WORLD_SIZE": "1"}], ids=["plain", "sbatch-script", "world1"])
def test_DISTENV_AUTO_writes_nothing_and_imports_nothing_in_a_single_process(extra):
    # A lone process (no launcher, no job) gets Lightning's patch alone (for the workers a
    # Trainer(devices=2) starts): no variable, no framework imported, no other adapter.
    rep, p = run_py("import json, email.message\nreport()", {"DISTENV_AUTO": "1", **extra})
    assert p.returncode == 0, p.stderr
    assert rep["auto_imported"] and rep["env"] is None
    assert (rep["hooked"], rep["only"]) == ((True, ["distenv.lightning"]) if not extra else (False, []))
    assert rep["vars"] == {k: None for k in rep["vars"]} | ({"WORLD_SIZE": "1"} if "WORLD_SIZE" in extra else {})
    assert rep["frameworks"] == [] and rep["adapters"] == []
    assert p.stderr == ""


def test_import_distenv_auto_writes_nothing_in_a_single_process():
    rep, p = run_py("import distenv.auto\nreport()")
    assert p.returncode == 0, p.stderr
    assert rep["env"] is None and rep["frameworks"] == [] and rep["only"] == ["distenv.lightning"]
    assert all(v is None for v in rep["vars"].values())


@needs_pth
@pytest.mark.parametrize("value", ["", "0"])
def test_DISTENV_AUTO_unset_or_0_imports_nothing(value):
    rep, p = run_py("report()", {"DISTENV_AUTO": value, **OMPI_2})
    assert p.returncode == 0, p.stderr
    assert not rep["distenv_imported"] and not rep["hooked"] and rep["vars"]["RANK"] is None


def test_pth_line_checks_environ_before_importing():
    line = open(os.path.join(SRC, "distenv_auto.pth")).read().strip()
    assert "\n" not in line and line.startswith("import os;")
    assert line.index('os.environ.get("DISTENV_AUTO"') < line.index("__import__")


# -- active: export + hooks, no framework imported ----------------------------------------------
@needs_pth
def test_DISTENV_AUTO_exports_and_hooks_without_importing_any_framework():
    rep, p = run_py("import json, email.message, importlib, unittest\nreport()", {"DISTENV_AUTO": "1", **OMPI_2})
    assert p.returncode == 0, p.stderr
    assert rep["hooked"] and rep["env"]["world_size"] == 2
    assert rep["vars"] == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(rep["env"]["master_port"]),
                           "NODE_RANK": "0"}
    assert rep["frameworks"] == [] and rep["adapters"] == []


def test_a_missing_framework_stays_missing_and_loads_no_adapter():
    code = """
        import distenv.auto
        missing = []
        for name in ("tensorflow", "deepspeed", "transformers", "accelerate", "lightning", "pytorch_lightning"):
            try:
                __import__(name)
            except ImportError:
                missing.append(name)
        report(missing=missing)
    """
    rep, p = run_py(code, OMPI_2)
    assert p.returncode == 0, p.stderr
    absent = [m for m in rep["missing"]]
    # No adapter module is imported for a framework that did not import.
    for name in absent:
        adapter = distenv.auto.HOOKS[name][0]
        assert adapter not in rep["adapters"], (name, rep["adapters"])


@pytest.mark.parametrize("how", ["DISTENV_AUTO", "import"])
def test_hooks_patch_after_import_and_only_what_was_imported(fake, how):
    if how == "DISTENV_AUTO" and not _has_pth():
        pytest.skip("distenv_auto.pth not installed")
    code = HOOK_FAKES + textwrap.dedent("""
        import fake_adapter, importlib.resources, inspect, importlib.machinery
        before = list(fake_adapter.CALLS)
        import fakefw
        after_fw = list(fake_adapter.CALLS)
        import fakefw              # a second import patches nothing more
        report(before=before, calls=fake_adapter.CALLS, after_fw=after_fw,
               loader=type(fakefw.__loader__).__name__, spec_loader=type(fakefw.__spec__.loader).__name__,
               source=inspect.getsource(fakefw.sub), resource=importlib.resources.files("fakefw").joinpath("data.txt").read_text(),
               alone="fakefw_alone" in sys.modules)
    """)
    env = {"DISTENV_AUTO": "1", **OMPI_2} if how == "DISTENV_AUTO" else OMPI_2
    prefix = "" if how == "DISTENV_AUTO" else "import distenv.auto\n"
    rep, p = run_py(prefix + code, env, fake=fake)
    assert p.returncode == 0, p.stderr
    assert rep["before"] == []
    # fakefw imports fakefw_inner: both adapters run once, after the outermost import is whole.
    assert rep["calls"] == [["inner", True, True], ["outer", True, True]] or \
        rep["calls"] == [["outer", True, True], ["inner", True, True]]
    assert rep["after_fw"] == rep["calls"]
    assert not rep["alone"] and "alone" not in json.dumps(rep["calls"])
    # The module keeps its real loader: source and resources work.
    assert rep["loader"] == rep["spec_loader"] == "SourceFileLoader"
    assert rep["source"] == "VALUE = 42\n" and rep["resource"] == "resource\n"


def test_a_framework_imported_before_auto_is_patched_on_activation(fake):
    code = """
        import fakefw_alone
        import distenv.auto as a
        a.deactivate()
        a.HOOKS.clear()
        a.HOOKS.update({"fakefw_alone": ("fake_adapter", "patch_alone")})
        a.activate()
        import fake_adapter
        report(calls=fake_adapter.CALLS)
    """
    rep, p = run_py(code, OMPI_2, fake=fake)
    assert p.returncode == 0, p.stderr
    assert rep["calls"] == [["alone", True, None]]


def test_no_adapter_but_lightning_s_is_applied_outside_a_distributed_launch(fake):
    code = HOOK_FAKES + textwrap.dedent("""
        import fake_adapter, fakefw
        report(calls=fake_adapter.CALLS)
    """)
    rep, p = run_py("import distenv.auto\n" + code, {}, fake=fake)
    assert p.returncode == 0, p.stderr
    assert rep["calls"] == [] and rep["only"] == ["distenv.lightning"]  # Lightning's alone
    rep, p = run_py("import distenv.auto\n" + code, {"SLURM_JOB_ID": "7"}, fake=fake)  # a batch script
    assert p.returncode == 0, p.stderr
    assert rep["calls"] == [] and not rep["hooked"]


@pytest.mark.parametrize("extra, only", [({}, ["distenv.lightning"]),
                                         ({"DISTENV_RUN": "1", "RANK": "0", "WORLD_SIZE": "1",
                                           "LOCAL_RANK": "0"}, ["distenv.lightning"]),
                                         ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, []),
                                         ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, [])],
                         ids=["lone", "distenv-run-one", "torch-vars-world1", "kubernetes"])
def test_one_process_gets_lightning_s_patch_alone_where_a_trainer_would_go_wrong(fake, extra, only):
    # lone: the workers a Trainer(devices=2) starts got no RANK; distenv run's one process:
    # LOCAL_RANK is set, so Lightning started none and waited forever. Nowhere else.
    code = """
        import distenv.auto as a
        a.HOOKS.update({"fakefw_alone": ("distenv.lightning", "patch")})
        a._only and a.install()
        import fakefw_alone
        report(applied=a.applied)
    """
    rep, p = run_py(code, extra, fake=fake)
    assert p.returncode == 0, p.stderr
    assert rep["only"] == only and rep["vars"]["RANK"] == extra.get("RANK"), rep
    assert rep["applied"] == (["distenv.lightning:patch"] if only else []), rep


def test_missing_adapter_function_warns_and_the_import_proceeds(fake):
    code = """
        import distenv.auto as a
        a.HOOKS["fakefw_alone"] = ("fake_adapter", "no_such_patch")
        import fakefw_alone
        report(skipped=a.skipped, ready=fakefw_alone.READY)
    """
    rep, p = run_py(code, OMPI_2, fake=fake)
    assert p.returncode == 0, p.stderr
    assert rep["ready"] is True and "fake_adapter:no_such_patch" in rep["skipped"]
    assert "fakefw_alone was imported but is not patched" in p.stderr


def test_an_adapter_error_surfaces_at_the_import(fake):
    (fake / "bad_adapter.py").write_text(
        "from distenv.errors import DistEnvError\n"
        "def patch():\n    raise DistEnvError('Trainer(devices=1) contradicts the launch. Fix: devices=2')\n")
    code = """
        import distenv.auto as a
        a.HOOKS["fakefw_alone"] = ("bad_adapter", "patch")
        try:
            import fakefw_alone
        except Exception as exc:
            report(error=str(exc))
    """
    rep, p = run_py(code, OMPI_2, fake=fake)
    assert rep and "Fix: devices=2" in rep["error"], p.stderr


# -- errors, per-node, undo ---------------------------------------------------------------------
@needs_pth
def test_DISTENV_AUTO_with_a_broken_launch_stops_with_one_line():
    rep, p = run_py("report()", {"DISTENV_AUTO": "1", "OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2",
                                 "HF_TOKEN": "hf_secretsecretsecretsecret00"})
    assert p.returncode == 2 and rep is None
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distenv: error: OMPI_COMM_WORLD_RANK='x'")
    assert "unset it to start without distenv" in lines[0]


@needs_pth
def test_per_node_launch_warns_to_use_distenv_run():
    env = {**OMPI_2, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_MCA_orte_num_nodes": "2", "DISTENV_NPROC_PER_NODE": "2", "MASTER_ADDR": "node1"}
    rep, p = run_py("report()", {"DISTENV_AUTO": "1", **env})
    assert p.returncode == 0, p.stderr
    assert rep["env"]["launch"] == "per-node" and "distenv run" in p.stderr
    assert rep["vars"]["RANK"] is None and rep["vars"]["NODE_RANK"] == "1"
    rep, p = run_py("report()", {"DISTENV_AUTO": "1", "DISTENV_RUN": "1", **env})
    assert p.stderr == ""  # started by distenv run: the torchrun agent, no warning


def test_deactivate_restores_the_environment():
    code = """
        import os
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        import distenv.auto as a
        exported = dict(a.exported)
        a.deactivate()
        report(exported=exported)
    """
    rep, p = run_py(code, OMPI_2)
    assert p.returncode == 0, p.stderr
    assert "RANK" in rep["exported"] and "MASTER_ADDR" not in rep["exported"]
    assert rep["vars"]["RANK"] is None and rep["vars"]["MASTER_ADDR"] == "127.0.0.1"
    assert not rep["hooked"]


@needs_pth
def test_cli_describes_the_environment_it_was_given_under_DISTENV_AUTO():
    env = {**OMPI_2, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_MCA_orte_num_nodes": "2", "MASTER_ADDR": "node1"}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "DISTENV_"))}
    base["PYTHONPATH"] = SRC
    plain = subprocess.run([sys.executable, "-m", "distenv", "show", "--json"], env={**base, **env},
                           capture_output=True, text=True, timeout=60)
    auto = subprocess.run([sys.executable, "-m", "distenv", "show", "--json"],
                          env={**base, **env, "DISTENV_AUTO": "1"}, capture_output=True, text=True, timeout=60)
    assert plain.returncode == auto.returncode == 0, auto.stderr
    assert json.loads(plain.stdout) == json.loads(auto.stdout)
    # A per-node launch: the command neither activates nor warns (it is not the training script).
    per_node = {**base, **env, "DISTENV_AUTO": "1", "DISTENV_NPROC_PER_NODE": "2"}
    p = subprocess.run([sys.executable, "-m", "distenv", "show", "--json"], env=per_node,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "" and json.loads(p.stdout)["launch"] == "per-node"
    code = "import sys; print('distenv.auto' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], env=per_node, capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "True" and "distenv run" in p.stderr


def test_every_hook_names_an_adapter_function_that_exists():
    """Each framework auto hooks has its adapter entry point (importing the adapter module
    imports no framework). A missing one would only print 'not patched' at run time."""
    import importlib

    for framework, (module, function) in distenv.auto.HOOKS.items():
        adapter = importlib.import_module(module)
        assert callable(getattr(adapter, function, None)), f"{framework}: {module}.{function}() is missing"
    assert set(distenv.auto.EACH_IMPORT) <= {f"{m}:{f}" for m, f in distenv.auto.HOOKS.values()}


# -- platforms frameworks detect themselves; sources that leave some adapters out --------------
@needs_pth
@pytest.mark.parametrize("extra", [{"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                                   {"TPU_ACCELERATOR_TYPE": "v4-16"}, {"PJRT_DEVICE": "TPU"},
                                   {"XRT_TPU_CONFIG": "localservice;0;localhost:51011"}],
                         ids=["kubernetes", "cloud-tpu-vm", "torch-xla-pjrt", "torch-xla-xrt"])
def test_DISTENV_AUTO_leaves_a_platform_the_frameworks_detect_alone(extra):
    """No launcher variables is no proof of one process where JAX (Kubernetes, Cloud TPU),
    torch-xla, Lightning's XLA environment or Accelerate's TPU state detect the job themselves:
    DISTENV_AUTO=1 writes nothing and hooks nothing, so their own detection runs unchanged."""
    rep, p = run_py("report()", {"DISTENV_AUTO": "1", **extra})
    assert p.returncode == 0, p.stderr
    assert rep["env"] is None and not rep["hooked"] and rep["only"] == [], rep
    assert all(v is None for v in rep["vars"].values()), rep["vars"]


def _adapters(root):
    pkg = root / "fakeadapters"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("CALLS = []\n")
    for name in ("jax", "lightning", "transformers"):
        (pkg / f"{name}.py").write_text(f"from . import CALLS\ndef patch():\n    CALLS.append({name!r})\n")


@needs_pth
@pytest.mark.parametrize("launch,acting", [
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1", "TPU_WORKER_ID": "1"}, ["jax"]),
    (OMPI_2, ["jax", "lightning", "transformers"]),
], ids=["gke-tpu", "openmpi"])
def test_a_source_names_the_adapters_that_act_on_its_launch(fake, launch, acting):
    """A TPU pod on GKE: JAX's adapter acts (process 1 of 2); torch-xla numbers per chip, so
    torch's variables are not exported and the Lightning/Transformers adapters are not applied."""
    _adapters(fake)
    code = textwrap.dedent("""
        import distenv.auto as a
        a.HOOKS.clear()
        a.HOOKS.update({"fakefw": ("fakeadapters.lightning", "patch"),
                        "fakefw_inner": ("fakeadapters.transformers", "patch"),
                        "fakefw_alone": ("fakeadapters.jax", "patch")})
        import fakefw, fakefw_alone, fakeadapters
        report(calls=sorted(fakeadapters.CALLS), skipped=sorted(a.skipped))
    """)
    rep, p = run_py(code, {"DISTENV_AUTO": "1", **launch}, fake=fake)
    assert p.returncode == 0, p.stderr
    assert rep["calls"] == acting, rep
    assert rep["env"]["rank"] == 1 and rep["env"]["world_size"] == 2
    exported = {k: v for k, v in rep["vars"].items() if v is not None}
    if "lightning" in acting:
        assert exported["RANK"] == "1" and exported["WORLD_SIZE"] == "2", exported
    else:
        assert exported == {}, exported
        assert rep["skipped"] == ["fakeadapters.lightning:patch", "fakeadapters.transformers:patch"]


# -- no launcher: a torch script runs as under `distenv run` (issue 30, item 14) -----------------
TORCH_SCRIPT = """
    import torch.distributed as dist
    dist.init_process_group("gloo")
    import torch
    t = torch.ones(1)
    dist.all_reduce(t)
    report(rank=dist.get_rank(), size=dist.get_world_size(), sum=t.item())
    dist.destroy_process_group()
"""


def needs_torch():
    """Skip without torch, without importing it here: the tests run it in subprocesses, and an
    import in this process changes what later tests see (tests/unit/test_tensorflow_patch.py::
    test_each_local_process_gets_its_gpus fails once torch is imported)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed for this interpreter")


def _clean(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "SLURM_", "DISTENV_", "TORCHELASTIC_", "KUBERNETES_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "PYTHONPATH")}
    return {**env, "PYTHONPATH": SRC, **extra}


@needs_pth
def test_DISTENV_AUTO_without_a_launcher_runs_a_torch_script_as_distenv_run_does():
    """`DISTENV_AUTO=1 python script.py` with no launcher ended in torch's "environment
    variable RANK expected" traceback while `distenv run -- python script.py` ran it as one
    process. A real interpreter and a real gloo group: both now run it as rank 0 of 1, with the
    same variables (the port: derived from each one's process id, by the same rule)."""
    needs_torch()
    rep, p = run_py(TORCH_SCRIPT, {"DISTENV_AUTO": "1"}, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (rep["rank"], rep["size"], rep["sum"]) == (0, 1, 1.0)
    assert "RANK expected" not in p.stderr
    code = REPORT + textwrap.dedent(TORCH_SCRIPT)
    q = subprocess.run(["timeout", "-k", "5", "120", sys.executable, "-m", "distenv", "run", "--",
                        sys.executable, "-c", code], env=_clean({}), capture_output=True, text=True,
                       timeout=130)
    assert q.returncode == 0, q.stderr[-3000:]
    run_rep = json.loads(next(line for line in q.stdout.splitlines() if line.startswith("REPORT "))[7:])
    assert (run_rep["rank"], run_rep["size"], run_rep["sum"]) == (0, 1, 1.0)
    same = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "NODE_RANK")
    assert {k: rep["vars"][k] for k in same} == {k: run_rep["vars"][k] for k in same} == {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "NODE_RANK": "0"}
    assert rep["vars"]["MASTER_PORT"] and run_rep["vars"]["MASTER_PORT"]


@needs_pth
def test_DISTENV_AUTO_writes_nothing_before_torch_asks():
    """Until the script's init_process_group() call, nothing is written (a Lightning Trainer that
    reads LOCAL_RANK still sees a plain process and starts its own workers), and a call that
    names its rank and world size, or the MPI backend, is left alone."""
    needs_torch()
    code = """
        import os
        import torch.distributed as dist
        before = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "0"
        store = dist.HashStore()
        dist.init_process_group("gloo", rank=0, world_size=1, store=store)
        dist.destroy_process_group()
        report(before=before)
    """
    rep, p = run_py(code, {"DISTENV_AUTO": "1"}, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert rep["before"] == {"RANK": None, "LOCAL_RANK": None, "WORLD_SIZE": None, "MASTER_PORT": None}
    assert rep["vars"]["RANK"] is None and rep["vars"]["WORLD_SIZE"] is None


@needs_pth
@pytest.mark.parametrize("extra", [{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {"PJRT_DEVICE": "TPU"}],
                         ids=["kubernetes", "torch-xla"])
def test_DISTENV_AUTO_where_one_process_is_not_proven_says_what_to_do(extra):
    """Where a platform may have started other processes distenv does not see, the script's
    init_process_group() ends with one line saying what to do, not torch's traceback, and no
    variable is written."""
    needs_torch()
    rep, p = run_py(TORCH_SCRIPT, {"DISTENV_AUTO": "1", **extra}, timeout=120)
    assert p.returncode == 2 and rep is None, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distenv: error: torch.distributed."
                                                   "init_process_group() needs RANK and WORLD_SIZE"), p.stderr
    assert f"{next(iter(extra))} is set" in lines[0] and "Fix: start the processes with a launcher" in lines[0]


@needs_pth
def test_DISTENV_AUTO_in_a_multiprocessing_child_says_what_to_do():
    """A child a script spawned (torch.multiprocessing.spawn, multiprocessing) is no proof of one
    process: each would silently train alone. Its init_process_group() without a rank is one
    line, in the child."""
    needs_torch()
    code = """
        import multiprocessing as mp

        def child(q):
            import torch.distributed as dist
            try:
                dist.init_process_group("gloo")
                q.put("joined")
            except Exception as exc:
                q.put(type(exc).__name__ + ": " + str(exc))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            said = q.get(timeout=100)
            p.join(100)
            report(said=said)
    """
    script = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"distenv-mp-child-{os.getpid()}.py")
    with open(script, "w") as f:
        f.write(REPORT + textwrap.dedent(code))
    try:
        p = subprocess.run(["timeout", "-k", "5", "150", sys.executable, script], env=_clean({"DISTENV_AUTO": "1"}),
                           capture_output=True, text=True, timeout=160)
    finally:
        os.remove(script)
    assert p.returncode == 0, p.stderr[-3000:]
    said = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("REPORT "))[7:])["said"]
    assert said.startswith("DistEnvError: torch.distributed.init_process_group() needs RANK") and \
        "started by another Python process" in said, said


@pytest.mark.parametrize("argv, cli", [
    (["python", "-m", "distenv", "doctor"], True),
    (["python", "-X", "dev", "-m", "distenv", "doctor"], True),  # 'dev' was taken for the script
    (["python", "-W", "ignore", "-u", "-m", "distenv.cli", "show"], True),
    (["python", "-Xdev", "/v/bin/distenv", "show"], True),
    (["python", "-X", "dev", "train.py"], False),
    (["python", "-c", "import distenv"], False),
])
def test_the_distenv_command_is_recognised_past_the_interpreter_s_options(argv, cli, monkeypatch):
    from distenv import _autostart

    monkeypatch.setattr(sys, "orig_argv", argv, raising=False)
    assert _autostart._is_distenv_cli() is cli
