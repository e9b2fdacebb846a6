"""One wording per error (issue 22, item 5).

* every bad port (MASTER_PORT from any source, the side ports, resolve(master_port=)) says
  what was given, the range 1-65535 and one fix; every bad integer variable says what was
  given and its range;
* DISTENV_LAUNCHER=env under another launcher does not claim "no launcher variables were found";
* `distenv run --nproc-per-node N` errors name the flag, not DISTENV_NPROC_PER_NODE;
* `distenv run --help`'s usage line and option help agree; a subcommand's unknown option
  prints that subcommand's usage;
* no ``[rank N]`` prefix where the launcher labels lines itself (srun --label, mpirun
  --tag-output / -tag-output / --output tag, mpiexec -l / -prepend-rank).
The real launchers' side: tests/integration/test_launcher_labels.py.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import distenv
from distenv import DistEnvError, knobs, resolve
from distenv.cli import main as cli_main
from distenv.display import _tagging, launcher_labels
from distenv.run import USAGE, as_flag, plan
from envs import ompi

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
PLAIN = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}
OMPI = ompi(0, 2, 0, 2, node_rank_trap=False)
TORCHRUN = {**PLAIN, "TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1"}
PORT_FIX = "Fix: set MASTER_PORT to a free port from 1 to 65535, or unset it."


def error(environ, **overrides) -> str:
    with pytest.raises(DistEnvError) as info:
        resolve(environ, **overrides)
    return str(info.value)


# -- ports ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "0", "70000", "-1", "", " ", "65536", "1e3", "٣"])
@pytest.mark.parametrize("launch", [PLAIN, OMPI, TORCHRUN], ids=["env", "openmpi", "torchrun"])
def test_every_bad_MASTER_PORT_has_one_wording(launch, value):
    if value == "" and launch is OMPI:
        # A user's empty MASTER_PORT beside a launcher's variables counts as unset.
        assert resolve({**launch, "MASTER_PORT": value}).master_port is not None
        return
    text = error({**launch, "MASTER_PORT": value})
    assert f"MASTER_PORT={value!r}" in text, text
    assert "is not a TCP port (1-65535)." in text and text.endswith(PORT_FIX), text


@pytest.mark.parametrize("value", ["1", "29500", "65535", " 80 "])
def test_good_ports_still_pass(value):
    assert resolve({**PLAIN, "MASTER_PORT": value}).master_port == int(value)
    assert resolve({**OMPI, "MASTER_PORT": value}).master_port == int(value)


@pytest.mark.parametrize("port", [0, 70000, -3])
def test_a_port_given_to_resolve_names_the_range_too(port):
    text = error(PLAIN, master_port=port)
    assert f"master_port='{port}' (given to resolve()) is not a TCP port (1-65535)." in text
    assert "Fix: " in text


@pytest.mark.parametrize("value", ["70000", "abc", "0"])
def test_side_ports_share_the_wording(value):
    env = resolve({**PLAIN, "MASTER_PORT": "29500"})
    with pytest.raises(DistEnvError) as info:
        knobs.side_port(env, "tf", {"DISTENV_TF_PORT": value}, "DISTENV_TF_PORT")
    assert str(info.value) == (f"DISTENV_TF_PORT={value!r} is not a TCP port (1-65535). "
                               "Fix: set DISTENV_TF_PORT to a free port from 1 to 65535, or unset it.")
    with pytest.raises(DistEnvError) as info:  # three ports from 65535: past the range
        knobs.side_port(env, "tf", {"DISTENV_TF_PORT": "65535"}, "DISTENV_TF_PORT", width=3)
    assert str(info.value) == ("DISTENV_TF_PORT='65535' cannot be the first of 3 TCP ports (1-65535): "
                               "it must be at most 65533. Fix: set DISTENV_TF_PORT to a free port "
                               "from 1 to 65533, or unset it.")
    assert knobs.side_port(env, "tf", {"DISTENV_TF_PORT": "65533"}, "DISTENV_TF_PORT", width=3) == 65533
    with pytest.raises(DistEnvError, match=r"port='0' is not a TCP port \(1-65535\)"):
        knobs.side_port(env, "horovod", {}, given=0)


@pytest.mark.parametrize("value", ["abc", "0", "70000"])
def test_distenv_show_names_the_range(value):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "DISTENV_", "SLURM_", "PMI"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    env.update({**PLAIN, "MASTER_PORT": value, "PYTHONPATH": SRC})
    p = subprocess.run([sys.executable, "-m", "distenv", "show"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"MASTER_PORT={value!r}" in p.stderr and "(1-65535)" in p.stderr and PORT_FIX in p.stderr


# -- other integers --------------------------------------------------------------------------
@pytest.mark.parametrize("var, value, low", [("OMPI_COMM_WORLD_RANK", "x", 0),
                                            ("OMPI_COMM_WORLD_RANK", "99999999999", 0),
                                            ("OMPI_COMM_WORLD_RANK", "-1", 0),
                                            ("OMPI_COMM_WORLD_SIZE", "0", 1)])
def test_bad_integer_variables_say_value_and_range(var, value, low):
    text = error({**OMPI, var: value})
    assert text == (f"{var}={value!r} (set by Open MPI) is not an integer from {low} to 2147483647. "
                    f"Fix: unset {var} or give it the launcher's value.")


@pytest.mark.parametrize("field", ["world_size", "num_nodes"])
def test_bad_counts_given_to_resolve_say_the_range(field):
    assert f"{field}='0' (given to resolve()) is not an integer from 1 to 2147483647." in error(
        PLAIN, **{field: 0})


# -- a forced launcher -----------------------------------------------------------------------
def test_forced_env_under_mpirun_does_not_say_no_launcher_variables():
    text = error({**OMPI, "DISTENV_LAUNCHER": "env", "WORLD_SIZE": "2"})
    assert "no launcher variables were found" not in text, text
    assert "DISTENV_LAUNCHER=env makes distenv read only these variables, not Open MPI's " \
           "(OMPI_COMM_WORLD_RANK is set)" in text, text
    assert "Fix: unset DISTENV_LAUNCHER so that distenv reads Open MPI's variables; or " in text
    text = error({**OMPI, "DISTENV_LAUNCHER": "env", "RANK": "0"})
    assert "no launcher variables were found" not in text and "Open MPI's" in text, text


def test_forced_env_alone_and_unforced_keep_their_context():
    text = error({"DISTENV_LAUNCHER": "env", "WORLD_SIZE": "2"})
    assert "DISTENV_LAUNCHER=env makes distenv read only these variables." in text
    assert "no launcher variables were found" in error({"WORLD_SIZE": "2"})
    assert "no launcher variables were found" in error({"LOCAL_RANK": "1"})
    # A SLURM batch script (no step) is not a task: its variables are there but do not describe it.
    text = error({"SLURM_STEP_ID": "4294967291", "SLURM_JOB_ID": "7", "WORLD_SIZE": "2"})
    assert "no launcher variables were found" not in text or "SLURM" not in text, text


# -- distenv run ------------------------------------------------------------------------------
def test_run_nproc_per_node_errors_name_the_flag():
    with pytest.raises(DistEnvError) as info:
        plan(["--nproc-per-node", "4", "--", "true"], OMPI)
    text = str(info.value)
    assert "DISTENV_NPROC_PER_NODE" not in text, text
    assert text.startswith("--nproc-per-node 4 but Open MPI started 2 process(es)") and \
        text.endswith("Fix: make them agree or drop --nproc-per-node."), text
    with pytest.raises(DistEnvError) as info:
        plan(["--nproc-per-node=gpu", "--", "true"],
             {**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "CUDA_VISIBLE_DEVICES": ""})
    text = str(info.value)
    assert "DISTENV_NPROC_PER_NODE" not in text and text.startswith("--nproc-per-node gpu but no GPU"), text
    assert text.endswith("cpu (one per CPU core), or drop it."), text


def test_as_flag_leaves_other_messages_alone():
    text = "MASTER_PORT='x' is not a TCP port (1-65535). Fix: set MASTER_PORT to a free port from 1 to 65535, or unset it."
    assert as_flag(text, "4") == text


def test_run_usage_line_matches_the_option_help():
    usage = USAGE.splitlines()[0]
    option = next(line.strip() for line in USAGE.splitlines() if line.strip().startswith("--nproc-per-node "))
    assert f"[{option}]" in usage, (usage, option)
    from distenv import run

    assert f"`distenv run [{option}]" in (run.__doc__ or "")


@pytest.mark.parametrize("argv, command", [(["show", "--jsn"], "show"), (["--jsn"], "show"),
                                           (["doctor", "--x"], "doctor"), (["export", "--y"], "export")])
def test_an_unknown_option_prints_the_subcommands_usage(argv, command, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"usage: distenv {command} "), err
    assert f"distenv {command}: error: unrecognized arguments: {argv[-1]}. Fix: distenv {command} --help" in err, err


@pytest.mark.parametrize("argv, command", [(["frob"], "distenv"), (["show", "--ranks", "x"], "distenv show"),
                                           (["run", "--bogus"], "distenv run"),
                                           (["run", "--nproc-per-node", "0", "--", "true"], "distenv run")])
def test_every_usage_error_is_one_line_with_a_fix(argv, command, capsys):
    try:
        code = cli_main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert line.startswith(f"{command}: error: ") and line.endswith(f"Fix: {command} --help lists what it takes"), err


# -- the rank prefix ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, expect", [
    (["/usr/bin/mpirun", "--allow-run-as-root", "-np", "2", "--tag-output", "python", "x.py"], "mpirun --tag-output"),
    (["mpirun", "-np", "2", "-tag-output", "distenv", "show"], "mpirun -tag-output"),
    (["/usr/bin/mpirun.openmpi", "--tag-output", "distenv"], "mpirun.openmpi --tag-output"),
    (["mpiexec.openmpi", "-l", "distenv"], None),
    (["/opt/ompi5/bin/prterun", "-np", "2", "--output", "tag,timestamp", "distenv"], "prterun --output tag,timestamp"),
    (["prterun", "--output=tag", "distenv"], "prterun --output=tag"),
    (["mpiexec.mpich", "-l", "-n", "2", "distenv", "show"], "mpiexec.mpich -l"),
    (["mpiexec", "-prepend-rank", "-n", "2", "distenv", "show"], "mpiexec -prepend-rank"),
    (["mpiexec.hydra", "-n", "2", "-l", "/venv/bin/distenv"], "mpiexec.hydra -l"),
    # the command's own options are not the launcher's
    (["mpirun", "-np", "2", "python", "train.py", "-l", "--tag-output"], None),
    (["mpirun", "-np", "2", "--", "./a.out", "-l"], None),
    (["mpirun", "-np", "2", "--output", "filename", "distenv"], None),
    (["bash", "-l", "--tag-output"], None),
    (["hydra_pmi_proxy", "--control-port", "vm:1"], None),
    ([""], None), ([], None),
])
def test_launcher_tag_options(argv, expect):
    assert _tagging(argv) == expect


def test_launcher_labels_from_the_environment():
    assert launcher_labels({"SLURM_LABELIO": "1"}) == "srun --label"
    assert launcher_labels({"OMPI_MCA_orte_tag_output": "1"}) == "mpirun --tag-output"
    assert launcher_labels({"OMPI_MCA_orte_tag_output": "1"}, proc="/nonexistent") == "mpirun --tag-output"
    assert launcher_labels({"SLURM_LABELIO": "0"}, proc="/nonexistent") is None


def test_launcher_labels_from_an_ancestor(tmp_path):
    """A fake /proc: this process -> a shell -> prterun --tag-output."""
    me, shell, launcher = os.getpid(), 4242001, 4242000
    for pid, ppid, argv in ((me, shell, ["python"]), (shell, launcher, ["bash", "-c", "distenv show"]),
                            (launcher, 1, ["prterun", "-np", "2", "--tag-output", "bash"])):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (x) y) S {ppid} 0 0\n")  # a ')' in the name: parsed from the last
        (d / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    assert launcher_labels({}, proc=str(tmp_path)) == "prterun --tag-output"
    (tmp_path / str(launcher) / "cmdline").write_bytes(b"prterun\0-np\x002\0bash\0")
    assert launcher_labels({}, proc=str(tmp_path)) is None


def _show(extra: dict, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "DISTENV_", "SLURM_", "PMI"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    env.update({**OMPI, **extra, "PYTHONPATH": SRC})
    p = subprocess.run([sys.executable, "-m", "distenv", "show", *args], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("labelled", [{"SLURM_LABELIO": "1"}, {"OMPI_MCA_orte_tag_output": "1"}])
def test_no_doubled_prefix_where_the_launcher_labels_lines(labelled):
    assert _show({}).startswith("[rank 0] launcher")
    assert _show(labelled).startswith("launcher ")
    assert _show(labelled, "--prefix").startswith("[rank 0] launcher")  # asked for: given


def test_version_still_importable():
    assert distenv.__version__
