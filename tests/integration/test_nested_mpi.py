"""One MPI launcher started inside another's rank (review, 2026-12-07): MPICH's mpiexec run by
Open MPI's mpirun gives its ranks Hydra's variables beside the Open MPI ones they inherit, and
distenv read Open MPI's (every rank was rank 0 of 1, each training alone). The variables do
not say which launcher is the inner one: an error naming both, and DISTENV_LAUNCHER decides."""
from __future__ import annotations

import json
import subprocess

from harness import MPICH4, OMPI4, PY, REPO, clean_env, layout

CODE = ("import json, os, sys, distenv\n"
        "try:\n"
        "    d = distenv.resolve(); out = [d.launcher, d.rank, d.world_size]\n"
        "except distenv.DistEnvError as e:\n"
        "    out = ['error', str(e)]\n"
        "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').write(json.dumps(out))\n")


def _ranks(out, extra=None):
    out.mkdir()
    env = clean_env({"PYTHONPATH": str(REPO / "src"), **(extra or {})})
    p = subprocess.run([OMPI4, "--allow-run-as-root", "-np", "1", MPICH4, "-n", "2", PY, "-c", CODE,
                        str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return sorted(json.loads(f.read_text()) for f in out.iterdir())


def test_mpich_inside_open_mpi_is_an_error_naming_both_until_the_launcher_is_named(need, tmp_path):
    need(layout("openmpi4", "np2"))
    need(layout("mpich4", "np2"))
    found = _ranks(tmp_path / "guess")
    assert len(found) == 2 and all(r[0] == "error" for r in found), found
    assert all("Open MPI and MPICH (Hydra) variables are both here and disagree: " in r[1]
               and "world_size 1 (OMPI_COMM_WORLD_SIZE=1) against 2 (PMI_SIZE=2)" in r[1] and "Fix: DISTENV_LAUNCHER=openmpi or mpich"
               in r[1] for r in found), found
    assert _ranks(tmp_path / "named", {"DISTENV_LAUNCHER": "mpich"}) == [["mpich", 0, 2], ["mpich", 1, 2]]
