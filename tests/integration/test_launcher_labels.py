"""`distenv show` adds no ``[rank N]`` where the launcher already labels every line (issue 22):
``mpirun --tag-output`` / ``-tag-output`` (Open MPI 4 and 5), ``--output tag`` (Open MPI 5),
``mpiexec -l`` (MPICH), ``srun --label``; without them each line carries ``[rank N]``.
Two ranks on this host, each run under ``timeout -k 5``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import harness

pytestmark = [pytest.mark.launcher]

SHOW = [sys.executable, "-m", "distenv", "show"]
OMPI = ("--allow-run-as-root", "--oversubscribe", "-np", "2")


def need(binary: str) -> None:
    if not os.access(binary, os.X_OK):
        if os.environ.get("DISTENV_REQUIRE_LAUNCHERS") == "1":
            pytest.fail(f"required but unavailable: {binary}")
        pytest.skip(f"{binary} is not installed")


def run(argv, extra_env=None) -> "list[str]":
    env = harness.clean_env({"DISTENV_AUTO": "0", "PYTHONPATH": str(harness.REPO / "src"), **(extra_env or {})})
    p = subprocess.run(["timeout", "-k", "5", "120", *argv], env=env, capture_output=True, text=True,
                       timeout=130)
    assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
    return [line for line in p.stdout.splitlines() if "launcher " in line]


# (launcher binary, its options that label lines, the label each line then starts with)
CASES = {
    "openmpi4-tag-output": (harness.OMPI4, (*OMPI, "--tag-output"), r"\[1,[01]\]<stdout>:\s*launcher "),
    "openmpi4-single-dash": (harness.OMPI4, (*OMPI, "-tag-output"), r"\[1,[01]\]<stdout>:\s*launcher "),
    "openmpi5-tag-output": (harness.OMPI5, (*OMPI, "--tag-output"), r"\[1,[01]\]<stdout>:\s*launcher "),
    "openmpi5-output-tag": (harness.OMPI5, (*OMPI, "--output", "tag"), r"\[1,[01]\]<stdout>:\s*launcher "),
    "mpich-l": (harness.MPICH4, ("-l", "-n", "2"), r"\[[01]\] launcher "),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_doubled_prefix(case):
    binary, options, label = CASES[case]
    need(binary)
    lines = run([binary, *options, *SHOW])
    assert len(lines) == 2 and all(re.match(label, line) for line in lines), lines
    assert not any("[rank" in line for line in lines), lines
    # the same launch without the labelling option: distenv's own prefix
    plain = [o for o in options if o not in ("--tag-output", "-tag-output", "--output", "tag", "-l")]
    lines = run([binary, *plain, *SHOW])
    assert sorted(line.split("]", 1)[0] for line in lines) == ["[rank 0", "[rank 1"], lines


def test_srun_label(slurm1):
    need("/usr/bin/srun")
    lines = run(["srun", "--label", "-n2", *SHOW], {"SLURM_CONF": slurm1})
    assert sorted(line.split(":", 1)[0] for line in lines) == ["0", "1"], lines
    assert not any("[rank" in line for line in lines), lines
    lines = run(["srun", "-n2", *SHOW], {"SLURM_CONF": slurm1})
    assert sorted(line.split("]", 1)[0] for line in lines) == ["[rank 0", "[rank 1"], lines
