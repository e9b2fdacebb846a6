"""Under a real launcher, a launch distenv refuses ends every rank that found it with one
``distenv: error: ... Fix: ...`` line and exit status 2, no traceback (issue 22, item 4):
a training script calling an adapter, DISTENV_AUTO=1 at interpreter start, and `distenv run`.

Open MPI 4 (`harness.OMPI4`), 2 ranks on this host, a stale ``-x WORLD_SIZE=4``. Ranks run
$DISTENV_PY_TORCH or the project venv's python (which has torch). Each run is under
``timeout -k 5``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness

pytestmark = [pytest.mark.launcher]

ROOT = Path(__file__).resolve().parents[2]
MESSAGE = "distenv: error: WORLD_SIZE=4 contradicts OMPI_COMM_WORLD_SIZE=2 (world_size=2)."
FIX = "Fix: unset WORLD_SIZE."  # DISTENV_LAUNCHER=env would not help: there is no RANK


def require(reason: str) -> None:
    if os.environ.get("DISTENV_REQUIRE_LAUNCHERS") == "1":
        pytest.fail(f"required but unavailable: {reason}")
    pytest.skip(reason)


def torch_python() -> str:
    py = os.environ.get("DISTENV_PY_TORCH") or sys.executable
    if subprocess.run([py, "-c", "import torch"], capture_output=True, timeout=300).returncode != 0:
        require(f"{py} cannot import torch")
    return py


def mpirun(*argv: str, env_extra: "dict[str, str] | None" = None, timeout: int = 240):
    if not os.access(harness.OMPI4, os.X_OK):
        require(f"Open MPI 4 is not installed ({harness.OMPI4}): integrations/openmpi/install.sh")
    env = harness.clean_env({"OMP_NUM_THREADS": "1", "DISTENV_AUTO": "0", **(env_extra or {})})
    env.pop("DISTENV_TRACEBACK", None)
    env.pop("DISTENV_LOG_LEVEL", None)
    cmd = ["timeout", "-k", "5", str(timeout), harness.OMPI4, "--allow-run-as-root", "--oversubscribe",
           "-np", "2", "-x", "WORLD_SIZE=4", *argv]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 10)


def error_lines(p, tagged: bool = False) -> "list[str]":
    text = p.stdout + p.stderr
    assert p.returncode not in (0, 124, 137), (p.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "distenv: error:" in line]
    # One line per rank that raised (mpirun may end the other rank first), each the whole message.
    assert 1 <= len(lines) <= 2, text[-3000:]
    for line in lines:
        assert (MESSAGE in line if tagged else line.startswith(MESSAGE)) and FIX in line, line
    assert "Exit code:    2" in text, text[-3000:]  # Open MPI names the rank's exit status
    return lines


def test_training_script_calling_the_torch_adapter():
    """The issue's own case: examples/pytorch_ddp.py calls distenv.torch.init_process_group()."""
    error_lines(mpirun(torch_python(), "examples/pytorch_ddp.py"))


def test_tag_output_prefixes_the_one_line():
    p = mpirun("--tag-output", torch_python(), "examples/pytorch_ddp.py")
    for line in error_lines(p, tagged=True):
        assert line.startswith("[1,") and "]<stderr>:" + MESSAGE in line, line


def test_DISTENV_AUTO_at_interpreter_start():
    py = torch_python()
    p = mpirun("-x", "DISTENV_AUTO=1", py, "-c", "print('script ran')")
    for line in error_lines(p):
        assert line.endswith("(DISTENV_AUTO=1; unset it to start without distenv)")
    assert "script ran" not in p.stdout


def test_distenv_run():
    py = torch_python()
    error_lines(mpirun(py, "-m", "distenv", "run", "--", py, "-c", "print('script ran')"))


MISSING = ("import os, sys\n"
           "if os.environ['PMI_RANK'] == '2':\n"
           "    sys.exit(0)  # this rank never reaches the pre-flight\n"
           "import distenv.torch\n"
           "distenv.torch.init_process_group()\n"
           "print('joined')\n")


def test_a_missing_rank_under_mpich_is_one_line_per_rank():
    """Issue 29: a missing rank ended every rank that came with a RendezvousError traceback.
    MPICH (Hydra: a rank that exits does not stop the others), 3 ranks, rank 2 leaves before
    the pre-flight: ranks 0 and 1 each end with one `distenv: error:` line naming it, in one
    wording, after DISTENV_TIMEOUT, exit status 2, no traceback."""
    if not os.access(harness.MPICH4, os.X_OK):
        require(f"MPICH is not installed ({harness.MPICH4}): integrations/mpich/install.sh")
    import socket

    with socket.socket() as s:  # MPICH reveals no job id: a port of this job's own
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = harness.clean_env({"OMP_NUM_THREADS": "1", "DISTENV_AUTO": "0", "DISTENV_TIMEOUT": "5",
                             "MASTER_PORT": str(port)})
    env.pop("DISTENV_TRACEBACK", None)
    env.pop("DISTENV_LOG_LEVEL", None)
    cmd = ["timeout", "-k", "5", "240", harness.MPICH4, "-np", "3", torch_python(), "-c", MISSING]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=250)
    text = p.stdout + p.stderr
    assert p.returncode not in (0, 124, 137), (p.returncode, text[-3000:])
    assert "Traceback" not in text and "joined" not in p.stdout, text[-3000:]
    lines = [line for line in text.splitlines() if "distenv: error:" in line]
    assert len(lines) == 2, text[-3000:]  # ranks 0 and 1, one line each
    for line in lines:
        assert line.startswith("distenv: error: distenv.torch: rank(s) 2 of 3 never came to the "
                               "pre-flight within 5 s (rank 0's store at 127.0.0.1:"), line
        assert "Fix: start every rank" in line, line
    assert sum("heard from 2 of 3" in line for line in lines) == 1  # rank 0's own
