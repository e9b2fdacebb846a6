"""The `distenv` command behaves like its neighbours: --version, bare `distenv` as `show`,
a readable job view when every rank runs it (a [rank N] prefix, --ranks, --summary, asserted
under a real `mpirun -np 4`), a doctor that reports versions, shortens long values and exits
2 on an environment it cannot resolve."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

import distenv
from distenv import display, doctor
from distenv.cli import main as cli_main
from envs import ompi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
CONSOLE = os.path.join(VENV_BIN, "distenv")
MPIRUN = "/usr/bin/mpirun"  # Open MPI 4 (Debian), docs/launchers.md#installing
DROP = ("OMPI_", "PMI", "PMIX_", "SLURM_", "DISTENV_", "TORCHELASTIC_", "HYDRA_", "MPI_LOCAL",
        "PET_", "PRTE_")
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "NODE_RANK", "GROUP_RANK", "TF_CONFIG")


def require(reason):
    if os.environ.get("DISTENV_REQUIRE_LAUNCHERS") == "1":
        pytest.fail(f"required but unavailable: {reason}")
    pytest.skip(reason)


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP) and k not in TORCH_VARS}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    env.update(extra or {})
    return env


def cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "distenv", *args], env=clean_env(env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


# -- version and bare `distenv` -----------------------------------------------------------
def test_version_both_spellings_and_both_entry_points():
    outs = {cli(flag).stdout for flag in ("--version", "-V")}
    assert len(outs) == 1
    line = outs.pop().strip()
    assert line.startswith(f"distenv {distenv.__version__} from ") and "(Python " in line
    if not os.path.exists(CONSOLE):
        require(".venv/bin/distenv missing (integrations/setup.sh)")
    p = subprocess.run([CONSOLE, "--version"], env=clean_env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.split(" from ")[0] == line.split(" from ")[0]


def test_version_is_one_line_however_narrow_the_terminal():
    """argparse's version action wraps to the terminal's width: a long install path came out
    broken across lines (seen with pytest-xdist's longer temporary paths)."""
    p = cli("--version", env={"COLUMNS": "20"})
    assert p.returncode == 0
    assert p.stdout.count("\n") == 1 and os.path.dirname(distenv.__file__) in p.stdout


@pytest.mark.parametrize("flags", [[], ["--json"], ["--explain"], ["--summary"], ["--ranks", "0"]])
def test_bare_distenv_is_show_with_its_flags(flags):
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29501"}
    bare, show = cli(*flags, env=env), cli("show", *flags, env=env)
    assert bare.returncode == show.returncode == 0, bare.stderr
    assert bare.stdout == show.stdout
    if flags == ["--json"]:
        assert json.loads(bare.stdout)["rank"] == 1
    if flags == ["--ranks", "0"]:
        assert bare.stdout == ""  # this is rank 1


def test_bad_ranks_value_is_a_usage_error():
    p = cli("--ranks", "first")
    assert p.returncode == 2 and "--ranks" in p.stderr and "per-node" in p.stderr


# -- prefix, filter, summary (in-process, the logic) ---------------------------------------
def test_parse_ranks_forms():
    assert display.parse_ranks("all") is None
    assert display.parse_ranks("per-node") == display.PER_NODE
    assert display.parse_ranks("0") == {0}
    assert display.parse_ranks("0,2") == {0, 2}
    assert display.parse_ranks("1-3,8") == {1, 2, 3, 8}
    for bad in ("", "x", "1-", "-1", "0,,2", "3-x"):
        with pytest.raises(ValueError, match="expected all, per-node"):
            display.parse_ranks(bad)


def test_per_node_launch_prints_as_its_node(no_gpus):
    env = distenv.resolve({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2",
                           "SM_NUM_GPUS": "0", "DISTENV_NPROC_PER_NODE": "2"})
    assert env.launch == "per-node" and display.rank_label(env) == "node 1"
    assert display.chosen(env, display.PER_NODE) and display.chosen(env, frozenset({1}))
    assert not display.chosen(env, frozenset({0}))


def test_a_rank_whose_place_is_unknown_is_never_hidden():
    assert display.chosen(None, frozenset({0}))  # no description at all: it prints
    assert display.rank_label(None).endswith(f"pid {os.getpid()}")


def test_shorten():
    assert display.shorten("x" * display.MAX_VALUE) == "x" * display.MAX_VALUE
    long = "y" * 100_000
    assert display.shorten(long) == "y" * display.KEEP + "... (100000 chars)"
    assert display.shorten(("a", long))[1].endswith("(100000 chars)")
    assert display.shorten(7) == 7


# -- under a real mpirun -np 4 ----------------------------------------------------------------
LABEL = re.compile(r"^\[rank (\d+)\] ")


def mpirun4(*args, timeout=120):
    if not os.path.exists(MPIRUN):
        require("Open MPI 4's mpirun is not installed (integrations/setup.sh)")
    cmd = ["timeout", "-k", "5", str(timeout - 10), MPIRUN, "--allow-run-as-root", "--oversubscribe",
           "-np", "4", sys.executable, "-m", "distenv", *args]
    p = subprocess.run(cmd, env=clean_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout.splitlines()


def by_rank(lines):
    """{rank: [lines without the prefix]}; every line must carry one."""
    out: dict = {}
    for line in lines:
        m = LABEL.match(line) or re.match(r"^\[rank (\d+)\]$", line)
        assert m, f"line without a rank prefix: {line!r}"
        out.setdefault(int(m.group(1)), []).append(line[m.end():] if LABEL.match(line) else "")
    return out


def test_show_under_mpirun_every_line_prefixed_and_right():
    ranks = by_rank(mpirun4("show"))
    assert sorted(ranks) == [0, 1, 2, 3]
    for r, lines in ranks.items():
        table = dict(line.split(None, 1) for line in lines if line and not line.startswith("note:"))
        assert table["rank"] == str(r) and table["world_size"] == "4" and table["launcher"] == "openmpi"


def test_show_ranks_filter_under_mpirun():
    assert sorted(by_rank(mpirun4("show", "--ranks", "0,2"))) == [0, 2]
    assert sorted(by_rank(mpirun4("--explain", "--ranks", "3"))) == [3]
    ranks = by_rank(mpirun4("--explain", "--ranks", "per-node"))
    assert list(ranks) == [0] and any(line.startswith("rank ") and " 0 " in line for line in ranks[0])


def test_no_prefix_and_json_under_mpirun():
    plain = mpirun4("show", "--no-prefix", "--ranks", "1")
    assert plain and not any(line.startswith("[") for line in plain)
    assert dict(line.split(None, 1) for line in plain if line)["rank"] == "1"
    docs = [json.loads(line) for line in mpirun4("--json")]  # JSON: unprefixed, one line per rank
    assert sorted(d["rank"] for d in docs) == [0, 1, 2, 3]


def test_summary_one_line_per_rank_under_mpirun():
    lines = mpirun4("--summary")
    assert len(lines) == 4
    seen = set()
    for line in lines:
        m = re.match(r"^rank (\d)/4 local (\d)/4 node 0/1 \| openmpi per-process \| "
                     r"master 127\.0\.0\.1:(\d+) \| job \d+$", line)
        assert m, line
        assert m.group(1) == m.group(2)
        seen.add(int(m.group(1)))
    assert seen == {0, 1, 2, 3}


def test_doctor_under_mpirun_one_report_per_node_with_versions():
    ranks = by_rank(mpirun4("doctor"))
    assert list(ranks) == [0]  # one node: local rank 0 only
    text = "\n".join(ranks[0])
    assert "findings" in text and "versions" in text
    launcher = next(line for line in ranks[0] if line.strip().startswith("launcher (openmpi)"))
    own = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True, timeout=30).stdout
    number = re.search(r"\d+\.\d+\.\d+", own).group(0)
    assert number in launcher and "--version" in launcher
    assert sorted(by_rank(mpirun4("doctor", "--ranks", "all", "--summary", "--prefix"))) == [0, 1, 2, 3]


# -- doctor: versions, shortening, exit codes, fix ------------------------------------------
def test_doctor_versions_come_from_metadata_without_importing(monkeypatch):
    before = set(sys.modules)
    v = doctor.versions(None, {})
    assert v["distenv"].startswith(distenv.__version__)
    assert v["python"].startswith(".".join(map(str, sys.version_info[:3])))
    for name in doctor.PACKAGES:
        try:
            expected = metadata.version(name)
        except metadata.PackageNotFoundError:
            assert name not in v["packages"]
        else:
            assert v["packages"][name] == expected
    top = {m.split(".")[0] for m in set(sys.modules) - before}
    assert not top & {"torch", "lightning", "transformers", "tensorflow", "deepspeed", "jax",
                      "horovod", "keras"}


def test_launcher_version_from_variables_and_python_launchers():
    assert doctor.launcher_version("openmpi", {"OMPI_VERSION": "5.0.11"}) == \
        {"version": "Open MPI 5.0.11", "source": "OMPI_VERSION"}
    got = doctor.launcher_version("torchrun", {})
    try:
        assert got["version"] == f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        assert got["version"] is None and "not installed" in got["source"]


def test_launcher_version_parses_hydra_and_reports_failures(tmp_path, monkeypatch):
    assert doctor._first_version_line("HYDRA build details:\n    Version:   4.0.2\n") == "Hydra 4.0.2"
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\necho 'srun: fatal: no configuration' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(doctor.versioninfo, "_launcher_command", lambda launcher, source: (str(fake), "test"))
    got = doctor.launcher_version("slurm", {})
    assert got["version"] is None and "srun: fatal: no configuration" in got["source"]
    slow = tmp_path / "mpiexec"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setattr(doctor.versioninfo, "_launcher_command", lambda launcher, source: (str(slow), "test"))
    monkeypatch.setattr(doctor.versioninfo, "VERSION_TIMEOUT", 0.5)
    got = doctor.launcher_version("mpich", {})
    assert got["version"] is None and "no answer within 0.5 s" in got["source"]


BIG = "z" * 100_000


def test_a_100kB_value_is_shortened_in_show_and_doctor():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
           "TORCHELASTIC_RUN_ID": BIG, "NCCL_DEBUG_SUBSYS": BIG, "OMP_NUM_THREADS": "1"}
    for args in (["show"], ["show", "--explain"], ["show", "--summary"], ["doctor"],
                 ["doctor", "--summary"]):
        p = cli(*args, env=env)
        assert p.returncode == 0, p.stderr
        assert len(p.stdout) < 12_000, (args, len(p.stdout))
        if args[-1] != "--summary":
            assert "(100000 chars)" in p.stdout
    # JSON is data: values whole
    assert json.loads(cli("show", "--json", env=env).stdout)["job_id"] == BIG


def test_doctor_exit_codes_and_fix_field():
    bad = cli("doctor", "--json", env={"RANK": "x", "WORLD_SIZE": "2"})
    assert bad.returncode == 2
    report = json.loads(bad.stdout)
    errors = [f for f in report["findings"] if f["level"] == "error"]
    assert errors and all(f["fix"] for f in errors) and "Fix:" not in errors[0]["message"]
    assert cli("doctor", env={"RANK": "x", "WORLD_SIZE": "2"}).returncode == 2
    finding = cli("doctor", env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                 "MASTER_PORT": "29512", "NCCL_SOCKET_IFNAME": "nope0"})
    assert finding.returncode == 1 and "[error] network: NCCL_SOCKET_IFNAME=nope0" in finding.stdout
    ok = cli("doctor", env={"OMP_NUM_THREADS": "1"})
    assert ok.returncode == 0


def test_a_rank_not_chosen_still_reports_its_error_in_one_line():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29513", "NCCL_SOCKET_IFNAME": "nope0", "OMP_NUM_THREADS": "1"}
    p = cli("doctor", env=env)  # default --ranks per-node: local rank 1 does not print...
    assert p.returncode == 1
    lines = p.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rank 3 on ")  # ...except its error
    assert "NCCL_SOCKET_IFNAME=nope0" in lines[0] and "Fix:" in lines[0]
    quiet = cli("doctor", env={k: v for k, v in env.items() if k != "NCCL_SOCKET_IFNAME"})
    assert quiet.returncode == 0 and quiet.stdout == ""


RECORDED = os.path.join(ROOT, "tests", "fixtures", "launchers")


def _recorded_envs():
    for name in sorted(n for n in os.listdir(RECORDED) if n.endswith(".json")):
        with open(os.path.join(RECORDED, name)) as f:
            data = json.load(f)
        for i, rank in enumerate(data["ranks"][:2]):
            env = rank.get("env", rank)
            if isinstance(env, dict) and all(isinstance(v, str) for v in env.values()):
                yield pytest.param(env, id=f"{name}-{i}")


@pytest.mark.parametrize("env", list(_recorded_envs()))
def test_every_doctor_error_and_warning_on_recorded_launches_has_a_fix(env, no_gpus):
    report = doctor.diagnose(env)
    assert report["error"] is None, report["error"]  # a real launch resolves
    missing = [f for f in report["findings"] if f["level"] in ("error", "warning") and
               not (f["fix"] or "").strip()]
    assert not missing, missing
    errors = [f for f in report["findings"] if f["level"] == "error"]
    assert doctor.exit_code(report) == (1 if errors else 0), (doctor.exit_code(report), errors)


def test_doctor_fixes_speak_the_launchers_language(no_gpus, monkeypatch):
    """No mpirun hint for a SLURM job or a plain RANK/WORLD_SIZE run; mpirun -x under Open MPI."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    slurm = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "1",
             "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "4"}
    plain = {"RANK": "0", "WORLD_SIZE": "2", "NNODES": "2"}
    openmpi = ompi(0, 4, 0, 4, node_rank_trap=False, OMPI_MCA_orte_num_nodes="1")
    fixes = {name: " ".join(f["fix"] or "" for f in doctor.diagnose(env)["findings"])
             for name, env in (("slurm", slurm), ("plain", plain), ("ompi", openmpi))}
    assert "OMP_NUM_THREADS" in fixes["slurm"] and "mpirun" not in fixes["slurm"]
    assert "MASTER_ADDR" in fixes["plain"] and "mpirun" not in fixes["plain"]
    assert "mpirun -x OMP_NUM_THREADS" in fixes["ompi"]


# -- distenv export (review, 2026-12-07) ------------------------------------------------------
TORCHRUN_1 = {"TORCHELASTIC_RUN_ID": "r", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
              "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": "29400", "NODE_RANK": "0"}


def test_export_prints_what_changes_and_refuses_what_the_shell_holds_otherwise():
    """It exported into an empty dict, so a shell's different value was replaced by the eval
    without a word, where export() refuses it."""
    from envs import platform

    # Kubeflow's own MASTER_ADDR is PET_MASTER_ADDR's (the source owns it); the shell's differs
    kubeflow = {**platform("kubeflow_pytorchjob_v1_nproc1_worker1"), "MASTER_ADDR": "10.1.2.3"}
    p = cli("export", env=kubeflow)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("distenv: error: refusing to overwrite MASTER_ADDR='10.1.2.3' (distenv: ")
    assert "Fix: unset MASTER_ADDR" in p.stderr and len(p.stderr.splitlines()) == 1
    ok = cli("export", env=TORCHRUN_1)
    assert ok.returncode == 0 and "export NODE_RANK=0\n" in ok.stdout and "export RANK=1\n" in ok.stdout


def test_export_in_a_batch_script_refuses_a_job_of_one_and_notes_reach_stderr():
    """In an sbatch script it printed RANK=0 WORLD_SIZE=1 with exit 0: srun passes them to
    every task, and a plain torch script ran as N jobs of one."""
    p = cli("export", env={"SLURM_JOB_ID": "5051", "SLURM_PROCID": "0"})
    assert p.returncode == 2 and p.stdout == ""
    assert "inside job 5051 (SLURM_JOB_ID) but is none of its tasks" in p.stderr and "Fix:" in p.stderr
    mpich = cli("export", env={"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0",
                               "MPI_LOCALNRANKS": "2"})
    assert mpich.returncode == 0 and "export WORLD_SIZE=2" in mpich.stdout
    assert "distenv export: note: MPICH reveals no job id" in mpich.stderr
