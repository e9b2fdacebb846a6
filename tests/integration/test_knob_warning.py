"""A misspelled DISTENV_AUTO under real launchers (issue 29 item 2): ``DISTENV_AUOT=1 mpirun -np 2
python script.py`` with a script that never imports distenv used to train undistributed without
a word. Now the job prints one warning naming DISTENV_AUTO (from rank 0), and the script runs."""

import pytest

import harness


@pytest.mark.parametrize("launcher, shape", [("openmpi4", "np2"), ("mpich4", "np2"),
                                             ("slurm", "srun-n2")])
def test_a_misspelled_DISTENV_AUTO_warns_once_per_job(need, ranks_python, launcher, shape):
    lay = need(harness.layout(launcher, shape))
    result = harness.launch(lay, [ranks_python, "-c", "print('trained')"],
                            env={"DISTENV_AUOT": "1"})
    outs = [out for out, _ in result["files"].values()]
    assert outs == ["trained\n"] * 2, result["files"]
    warnings = [line for _, err in result["files"].values() for line in err.splitlines()
                if "DISTENV_AUOT" in line]
    assert len(warnings) == 1, result["files"]
    assert "did you mean DISTENV_AUTO?" in warnings[0]
    assert "DISTENV_AUOT" not in result["output"]  # not doubled by the launcher's own output
