"""Horovod (0.28.1 built from source for torch 2.13) through distenv.horovod.init() under real
launchers (examples/horovod_torch.py): hvd.size() == 2 on both ranks and identical weights,
with MPI under mpirun and Horovod's own Gloo rendezvous (started by rank 0) under torchrun
and srun. And the hard check: a Horovod that does not join the job is an error, not size 1.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile

import pytest

import tfhvd_support as S

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(1200)]

_ic = S.integration_fixtures()
root, slurm1, cluster, slurm2 = _ic.root, _ic.slurm1, _ic.cluster, _ic.slurm2

EXAMPLE = S.EXAMPLES / "horovod_torch.py"
ENV = {"PYTHONUNBUFFERED": "1", "DISTENV_TIMEOUT": "120", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def hvd_python():
    py = S.venv_python("horovod", ["horovod.torch", "distenv.horovod"])
    import subprocess

    p = subprocess.run([py, "-c", "import horovod.torch as h; print(h.mpi_built(), h.gloo_built())"],
                       capture_output=True, text=True, timeout=120, cwd="/")
    if p.stdout.split() != ["True", "True"]:
        S.skip(f"Horovod in {py} lacks MPI or Gloo (mpi_built, gloo_built = {p.stdout.strip()}): "
               "rebuild with bash integrations/frameworks/horovod.sh")
    return py


def train(request, py, name, env=None):
    lay = S.layout(name)
    S.need(request, lay)
    return S.launch(lay, [py, EXAMPLE], "DISTENV-HOROVOD", {**ENV, **(env or {})}, timeout=240)


def check(run, controller):
    assert run.rc == 0 and len(run.records) == 2, run.explain()
    a, b = run.records
    assert [a["rank"], b["rank"]] == [0, 1]
    assert a["size"] == b["size"] == 2, run.explain()
    assert a["local_size"] == b["local_size"] == 2 and {a["local_rank"], b["local_rank"]} == {0, 1}
    assert a["controller"] == b["controller"] == controller
    assert a["weights"] == b["weights"], "ranks diverged: " + run.explain()


def test_mpirun(request, hvd_python):
    check(train(request, hvd_python, "openmpi4"), "mpi")


def test_torchrun_self_rendezvous(request, hvd_python):
    check(train(request, hvd_python, "torchrun"), "gloo")


def test_srun_self_rendezvous(request, hvd_python):
    check(train(request, hvd_python, "slurm"), "gloo")


def test_a_horovod_that_does_not_join_is_an_error(request, hvd_python):
    """Forcing the MPI controller under torchrun (no MPI launched it): hvd.init() gives size 1
    on each rank, which Horovod alone would accept; distenv stops both ranks naming why.

    The two ranks' MPI_Init are Open MPI 4 singletons started at the same moment, which race
    to create their shared top session directory (<tmpdir>/ompi.<host>.<uid>): one rank's
    orte_init failed with "File exists" in a CI-like run. The directory exists before they
    start, under a short base of this test's own (unix socket paths stay short)."""
    base = tempfile.mkdtemp(prefix="hvd", dir="/tmp")
    try:
        os.mkdir(os.path.join(base, f"ompi.{socket.gethostname().split('.')[0]}.{os.getuid()}"), 0o700)
        run = train(request, hvd_python, "torchrun", {"DISTENV_HOROVOD_CONTROLLER": "mpi",
                                                       "OMPI_MCA_orte_tmpdir_base": base})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    errors = "\n".join(err for _out, err in run.files.values())
    assert run.rc != 0 and run.records == [], run.explain()
    assert errors.count("Horovod says rank 0 of size 1 but torchrun started rank") == 2, run.explain()
    assert "DISTENV_HOROVOD_CONTROLLER=gloo" in errors


@pytest.mark.cluster
@pytest.mark.parametrize("name, controller", [("openmpi4-2nodes", "mpi"), ("slurm-2nodes", "gloo")])
def test_two_nodes(request, hvd_python, name, controller):
    """Horovod itself across the two namespace nodes (one rank each): MPI under mpirun (rank 0's
    host from the launcher's PMIx service, none set by hand), Horovod's Gloo rendezvous started
    by rank 0 under srun -N2; identical weights after hvd.allreduce-averaged training."""
    run = train(request, hvd_python, name)
    assert run.rc == 0 and len(run.records) == 2, run.explain()
    a, b = run.records
    assert [a["rank"], b["rank"]] == [0, 1] and a["size"] == b["size"] == 2, run.explain()
    assert a["local_size"] == b["local_size"] == 1 and a["local_rank"] == b["local_rank"] == 0
    assert a["controller"] == b["controller"] == controller
    assert a["weights"] == b["weights"], "ranks diverged: " + run.explain()
    hosts = {f.split(".")[0] for f, (out, _err) in run.files.items() if S.records(out, "DISTENV-HOROVOD")}
    assert hosts == {"node1", "node2"}, run.explain()
