"""Containers between the launcher and Python, without a launcher (issue 39, items 3 and 4):
which starter a process runs in, the Fix that works there when it keeps the launcher's service
out, and resolution of the environments the starters give (recorded launches plus what each
starter adds, as read in its source: never a wrong field).

The same starters under the real launchers: tests/integration/test_container_starters.py."""
from __future__ import annotations

import pytest

import distenv
from distenv import DistEnvError
from distenv.discovery import containers
from envs import ranks

#: What each starter puts in its containers' environment (the module docstring's table).
MARKERS = {
    "pyxis/enroot": {"PYXIS_VERSION": "0.20.0"},
    "Apptainer": {"APPTAINER_CONTAINER": "/scratch/pytorch.sif", "APPTAINER_NAME": "pytorch.sif"},
    "Charliecloud": {"CH_RUNNING": "Weird Al Yankovic"},  # measured: ch-run's own value
    "Podman": {"container": "podman"},
}
#: Each starter's own option in its Fix, per thing it can keep out.
OPTIONS = {
    "pyxis/enroot": {"dir": "50-slurm-pmi.sh", "fd": "50-slurm-pmi.sh", "env": "50-slurm-pmi.sh"},
    "Apptainer": {"dir": "--bind", "fd": "--containall", "env": "--cleanenv"},
    "Charliecloud": {"dir": "ch-run -b", "fd": "--unset-env", "env": "--unset-env"},
    "Podman": {"dir": "podman run -v", "fd": "--preserve-fds", "env": "-e 'PMIX_*'"},
}


@pytest.mark.parametrize("title", list(MARKERS))
@pytest.mark.parametrize("what", ["dir", "fd", "env"])
def test_each_starter_is_named_with_its_own_fix(title, what):
    environ = MARKERS[title]
    assert containers.here(environ).title == title
    text = containers.fix(environ, what, dir="/var/spool/slurmd/pmix.5.0")
    assert text.startswith("Fix: ") and OPTIONS[title][what] in text and title in text, text
    assert "exec" not in text.replace("apptainer exec", ""), text  # never "use exec"
    assert containers.where(environ) == f" in the {title} container"


def test_no_starter_known_gets_the_generic_fix():
    assert containers.here({"CH_RUNNINGX": "1", "container": "docker"}) is None
    assert containers.fix({}, "dir", dir="/d") == (
        "Fix: make /d visible in the container (bind it), or set PMIX_MCA_gds=hash for every rank")


def _without_services(env):
    return {k: v for k, v in env.items() if not k.startswith(("PMIX_", "PMI_"))}


@pytest.mark.parametrize("title", ["pyxis/enroot", "Podman"])
def test_a_container_that_passed_no_service_variables_names_itself_and_its_option(title):
    """srun --mpi=pmix, arbitrary layout (rank 0 on node2, so the variables cannot place it),
    in a container that passed SLURM_* but no PMIX_* (pyxis without its PMI hook, podman
    without -e 'PMIX_*'): the note says which container and its option, not "use exec"."""
    from distenv.discovery import complete

    env = {**_without_services(ranks("cluster-srun-pmi2-n4-arbitrary")[0]), **MARKERS[title]}
    e = distenv.resolve(env)
    assert e.master_addr is None
    done = complete(e, need=("master_addr",), environ=env)
    note = next(str(n) for n in done.notes if "discovery found no service" in str(n))
    assert f"in the {title} container" in note and OPTIONS[title]["env"] in note, note
    assert "exec python" not in note, note


def test_a_pmi_fd_the_container_did_not_pass_names_its_option(monkeypatch):
    """podman without --preserve-fds: PMI_FD names a descriptor this process does not have."""
    from distenv.discovery import chain, pmi

    monkeypatch.setattr(chain, "walk", lambda *a, **k: (
        chain.Chain(1, "conmon", None, 2, 1, [], "Podman"), ""))
    environ = {"PMI_FD": "987", "PMI_RANK": "0", "PMI_SIZE": "2", "PMI_JOBID": "5.0",
               **MARKERS["Podman"]}
    found, why = pmi.offer(environ)
    assert found is None and "PMI_FD=987 is not open in this process in the Podman container" in why
    assert "--preserve-fds" in why and why.count("Fix:") == 1, why


# -- recorded launches as each starter passes them on: resolution is never wrong ----------------
def _resolved(env):
    e = distenv.resolve(env)
    return {k: v for k, v in e.to_dict().items()}


@pytest.mark.parametrize("recording", ["cluster-srun-pmix-2x2", "cluster-srun-pmi2-n4-arbitrary",
                                       "cluster-openmpi5-2x2", "cluster-mpich4-2x2"])
@pytest.mark.parametrize("title", list(MARKERS))
def test_a_starters_own_variables_change_no_field(recording, title):
    """Apptainer, Charliecloud and podman-hpc pass the task's variables through (podman-hpc:
    -e SLURM_* -e PMIX_*); pyxis keeps each task's SLURM_PROCID, SLURM_LOCALID, PMIX_RANK and
    PMI_FD (pyxis_slurmstepd.c: the container's environment, imported over the task's, leaves
    them out). What the starter adds changes nothing."""
    for env in ranks(recording):
        assert _resolved({**env, **MARKERS[title]}) == _resolved(env)


def _pytorch_hook(env, master):
    """NVIDIA enroot's 50-slurm-pytorch.sh (images with PYTORCH_VERSION): RANK, LOCAL_RANK,
    WORLD_SIZE from SLURM's, MASTER_ADDR the step's first node, MASTER_PORT from the job id."""
    return {**env, **MARKERS["pyxis/enroot"], "PYTORCH_VERSION": "2.5.0a0",
            "RANK": env["SLURM_PROCID"], "LOCAL_RANK": env["SLURM_LOCALID"],
            "WORLD_SIZE": env["SLURM_NTASKS"], "MASTER_ADDR": master,
            "MASTER_PORT": str(int(env["SLURM_JOB_ID"]) % 4536 + 61000)}


def test_the_pyxis_pytorch_hooks_variables_agree_with_slurms():
    for env in ranks("cluster-srun-pmix-2x2"):
        hooked = distenv.resolve(_pytorch_hook(env, "node1"))
        plain = distenv.resolve(env)
        for field in ("rank", "local_rank", "world_size", "local_world_size", "node_rank"):
            assert getattr(hooked, field) == getattr(plain, field), field
        assert hooked.master_addr == "node1" and hooked.rank_hosts[0] == "node1"


@pytest.mark.parametrize("var, value", [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")])
def test_a_hook_variable_that_disagrees_with_slurms_is_named_in_an_error(var, value):
    env = ranks("cluster-srun-pmix-2x2")[0]
    hooked = {**_pytorch_hook(env, "node1"), var: value}  # rank 0 of 4, local rank 0
    with pytest.raises(DistEnvError, match=var):
        distenv.resolve(hooked)
