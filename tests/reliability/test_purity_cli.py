"""What resolution does not do, through the command line and `distenv.auto`: no socket
opened, no process started, no file written, no framework imported -- unless an option that
says so asks (`distenv doctor --probe` opens one socket; `distenv run` execs its command).

tests/unit/test_purity.py checks `resolve()`; this checks `distenv show` (table, --json,
--explain), `distenv export`, `distenv doctor` (no --probe; its one process is the launcher's
`--version`, for its versions section) and `import distenv.auto`, each in
a fresh interpreter under an audit hook (PEP 578) installed before distenv is imported, for
a launcher environment of each family. `import distenv.auto` outside a distributed launch is
inert: no variable written, no framework hook installed (only the finder that wraps
torch.distributed.init_process_group once a script imports it, see distenv.auto).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    r"""
    import io, json, os, sys, contextlib
    events = []
    WATCH = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork",
             "os.spawn", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate",
             "os.chmod", "os.symlink", "os.link", "shutil.", "ctypes.dlopen", "os.putenv",
             "os.unsetenv")
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    def hook(event, args):
        if event.startswith(WATCH):
            events.append(event + ":" + str(args[:1])[:120])
        elif event == "open":
            mode = args[1] if len(args) > 1 else None
            flags = args[2] if len(args) > 2 else 0
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                    (isinstance(flags, int) and flags & WRITE):
                events.append("open-for-write:" + str(args[0]))
    before = set(sys.modules)
    sys.addaudithook(hook)
    what = sys.argv[1]
    snapshot = dict(os.environ)
    meta = list(sys.meta_path)
    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if what == "selftest":  # the hook sees what these tests say never happens
            open(os.devnull, "w").close()
            os.close(os.open(os.devnull, os.O_WRONLY))
            os.system("true")
            os.environ["X_DISTENV_SELFTEST"] = "1"
        elif what == "auto":
            from distenv import DistEnvError
            try:
                import distenv.auto
                code = "active" if distenv.auto.env is not None else "inert"
            except DistEnvError:
                code = "error"
        else:
            from distenv.cli import main
            try:
                code = main(what.split())
            except SystemExit as exc:
                code = exc.code
    frameworks = sorted(m for m in set(sys.modules) - before
                        if m.split(".")[0] in ("torch", "lightning", "pytorch_lightning",
                                               "transformers", "accelerate", "deepspeed",
                                               "tensorflow", "keras", "horovod", "mpi4py", "numpy"))
    print(json.dumps({"events": events, "frameworks": frameworks, "code": code,
                      "environ_changed": sorted(k for k in set(os.environ) | set(snapshot)
                                                if os.environ.get(k) != snapshot.get(k)),
                      "meta_path_changed": list(sys.meta_path) != meta,
                      "meta_path_added": [type(f).__name__ for f in sys.meta_path if f not in meta],
                      "stdout": out.getvalue()[-2000:], "stderr": err.getvalue()[-2000:]}))
    """
)

ENVS = {
    "none": {},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "OMPI_MCA_orte_num_nodes": "2", "OMPI_MCA_orte_hnp_uri": "7.0;tcp://10.0.0.1:5",
                "OMPI_MCA_ess_base_jobid": "7"},
    "mpich": {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    "slurm": {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2",
              "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
    "torchrun": {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                 "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400",
                 "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_RESTART_COUNT": "0"},
    "sagemaker-per-node": {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2",
                           "SM_NUM_GPUS": "0", "DISTENV_NPROC_PER_NODE": "2"},
    "broken": {"RANK": "x", "WORLD_SIZE": "2"},
}
COMMANDS = ["show", "show --json", "show --explain", "export", "doctor", "doctor --json"]


def run(what: str, env: dict) -> dict:
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.path.join(ROOT, "src"),
            "PYTHONDONTWRITEBYTECODE": "1", **env}
    p = subprocess.run([sys.executable, "-c", SCRIPT, what], env=full, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("family", sorted(ENVS))
def test_cli_opens_no_socket_starts_no_process_writes_no_file(family, command):
    report = run(command, ENVS[family])
    events = report["events"]
    if command.startswith("doctor"):
        # The doctor's one process: the launcher's own `--version` (stdin from /dev/null).
        started = [e for e in events if e.startswith("subprocess.Popen:")]
        assert len(started) <= 1 and all(
            os.path.basename(e.split("'")[1]) in ("srun", "mpirun", "mpiexec", "orterun",
                                                  "prterun", "mpiexec.hydra") for e in started), report
        events = [e for e in events if e not in started and e != "open-for-write:/dev/null"]
    assert events == [], report
    assert report["frameworks"] == [], report
    assert report["environ_changed"] == [], report
    if family == "broken":
        assert report["code"] == 2, report
    elif not command.startswith("doctor"):
        assert report["code"] == 0, report


@pytest.mark.parametrize("family", sorted(ENVS))
def test_import_distenv_auto(family):
    report = run("auto", {**ENVS[family], "DISTENV_RUN": "1"} if family == "sagemaker-per-node"
                 else ENVS[family])
    assert [e for e in report["events"] if not e.startswith("os.putenv:")] == [], report
    assert report["frameworks"] == [], report
    if family in ("none", "broken"):
        assert report["events"] == [], report
    if family == "broken":
        assert report["code"] == "error" and report["environ_changed"] == [] and \
            not report["meta_path_changed"], report
    elif family == "none":
        # outside a distributed launch: inert -- nothing written; the finder that waits for
        # torch.distributed, whose init_process_group() then gets the one-process job at the
        # script's call (issue 30, item 14), and the hook of Lightning's patch alone (the
        # workers a Trainer(devices=2) starts are handed this process as their node)
        assert report["code"] == "inert" and report["environ_changed"] == [] and \
            sorted(report["meta_path_added"]) == ["_Finder", "_OneProcessFinder"], report
    else:
        # in a launch it exports the torch variables (its job) and installs its hook, and
        # still opens, starts and writes nothing
        assert report["code"] == "active" and report["meta_path_changed"], report
        assert set(report["environ_changed"]) <= {
            "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK"}, report


def test_the_audit_hook_sees_writes_processes_and_environment_changes():
    report = run("selftest", {})
    kinds = {e.split(":")[0] for e in report["events"]}
    assert {"open-for-write", "os.system", "os.putenv"} <= kinds, report
    assert report["environ_changed"] == ["X_DISTENV_SELFTEST"], report


def test_doctor_probe_is_the_one_that_opens_a_socket():
    report = run("doctor --probe --timeout 0.2", ENVS["torchrun"])
    assert any(e.startswith("socket.") for e in report["events"]), report
    assert not [e for e in report["events"] if not e.startswith("socket.")], report
