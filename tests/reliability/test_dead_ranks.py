"""Dead, hung and missing ranks under real launchers: the others fail within the documented
timeout, naming the missing ranks; the launchers' own abort paths are exercised.

`distenv.torch.init_process_group` waits at most DISTENV_TIMEOUT seconds (default 180, or
less with ``timeout=``) for every rank; each rank announces itself in the store (the core's
pre-flight on torch's store), so a rank that never came is named on every rank that did, in one
`DistEnvError` line. Every job is 2 ranks of
tests/reliability/rank_job.py with short timeouts (15 s; 12 s through
init_process_group(timeout=)), under a hard ``timeout -k 5``; all scenarios run at once
(they mostly wait), so the module costs about one timeout plus the torch imports.

What the launchers do themselves (measured here):
* Open MPI 4/5 (mpirun): a rank exiting non-zero makes mpirun kill the others and exit
  non-zero at once -- no timeout needed; a rank exiting 0 early or hanging is not noticed,
  and the survivors' timeout ends the job (mpirun then kills the hung rank).
* MPICH/Intel MPI (Hydra): a rank exiting non-zero does *not* stop the others (ranks are not
  MPI programs); only distenv's timeout ends them.
* torchrun: a worker exiting 0 early is not a failure; before distenv waited for every rank
  itself, the survivor sat in gloo's connect for torch's 30 minutes.
* srun: waits for all tasks (no --kill-on-bad-exit by default).
"""
from __future__ import annotations

import pytest

import jobs

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(600)]

T = 15          # DISTENV_TIMEOUT of these jobs
T_INIT = 12     # init_process_group(timeout=) of the slurm job
SLACK = 10      # load on a shared 2-core machine

SCENARIOS = {
    # name: (layout, mode, env)
    "openmpi4-exit0": (("openmpi4", 2), "exit-before", {"JOB_EXIT": "0", "DISTENV_TIMEOUT": str(T)}),
    "openmpi4-abort": (("openmpi4", 2), "exit-before", {"JOB_EXIT": "3", "DISTENV_TIMEOUT": "90"}),
    "openmpi5-abort": (("openmpi5", 2), "exit-before", {"JOB_EXIT": "3", "DISTENV_TIMEOUT": "90"}),
    "openmpi5-hang": (("openmpi5", 2), "hang-before", {"DISTENV_TIMEOUT": str(T)}),
    "openmpi4-hang-rank0": (("openmpi4", 2), "hang-before", {"JOB_VICTIM": "0",
                                                             "DISTENV_TIMEOUT": str(T)}),
    "mpich4-exit3": (("mpich4", 2), "exit-before", {"JOB_EXIT": "3", "DISTENV_TIMEOUT": str(T)}),
    "intelmpi-exit0": (("intelmpi", 2), "exit-before", {"JOB_EXIT": "0", "DISTENV_TIMEOUT": str(T)}),
    "slurm-exit0-init-timeout": (("slurm", 2), "exit-before", {"JOB_EXIT": "0",
                                                               "JOB_INIT_TIMEOUT": str(T_INIT)}),
    "torchrun-exit0": (("torchrun", 2), "exit-before", {"JOB_EXIT": "0", "DISTENV_TIMEOUT": str(T)}),
    "torchrun-hang-rank0": (("torchrun", 2), "hang-before", {"JOB_VICTIM": "0",
                                                             "DISTENV_TIMEOUT": str(T)}),
    "openmpi5-hang-collective": (("openmpi5", 2), "hang-collective", {"JOB_PG_TIMEOUT": "10",
                                                                      "DISTENV_TIMEOUT": "60"}),
}


@pytest.fixture(scope="module")
def dead(request):
    """Run every scenario at once; {name: Run or the reason it could not run}."""
    specs, out = [], {}
    ports = jobs.free_ports(len(SCENARIOS))
    for i, (name, ((launcher, n), mode, env)) in enumerate(SCENARIOS.items()):
        lay = jobs.torchrun(n) if launcher == "torchrun" else jobs.local(launcher, n)
        why = jobs.unavailable(request, lay)
        if why:
            out[name] = why
            continue
        if launcher.startswith("mpich"):
            env = {**env, "MASTER_PORT": str(ports[i])}  # MPICH reveals no job id
        specs.append(jobs.Spec(name, lay, mode, env, timeout=150))
    out.update(jobs.run_all(specs))
    return out


def get(dead, name) -> jobs.Run:
    r = dead[name]
    if isinstance(r, str):
        pytest.skip(r)
    return r


def survivor(r: jobs.Run, rank: int) -> dict:
    rec = r.by_rank.get(rank)
    assert rec is not None, f"rank {rank} printed no record\n{r.describe()}"
    return rec


def assert_named_in_time(r: jobs.Run, rank: int, missing: str, limit: float):
    rec = survivor(r, rank)
    err = rec.get("error", "")
    assert err.startswith("DistEnvError: distenv.torch: "), r.describe()
    assert f"rank(s) {missing} of 2 never came to the pre-flight" in err, err
    assert "DISTENV_TIMEOUT" in err, err
    assert limit - 1 <= rec["init_seconds"] <= limit + SLACK, (rec["init_seconds"], err)
    assert r.rc not in (0, 124, 137), r.describe()


def test_rank_exiting_early_is_named_openmpi4(dead):
    assert_named_in_time(get(dead, "openmpi4-exit0"), 0, "1", T)


@pytest.mark.parametrize("name", ["openmpi4-abort", "openmpi5-abort"])
def test_mpirun_aborts_the_job_when_a_rank_exits_nonzero(dead, name):
    """mpirun's own abort path: no timeout involved (DISTENV_TIMEOUT=90 here)."""
    r = get(dead, name)
    assert r.rc not in (0, 124, 137), r.describe()
    assert r.elapsed < 60, r.describe()
    assert "non-zero" in r.output, r.describe()
    rank0 = r.by_rank.get(0)
    assert rank0 is None or "never came" not in rank0.get("error", ""), r.describe()


def test_hung_rank_is_named_and_mpirun_ends_the_job(dead):
    r = get(dead, "openmpi5-hang")
    assert_named_in_time(r, 0, "1", T)
    assert r.elapsed < 120, r.describe()  # mpirun killed the hung rank: not the hard timeout


def test_hung_rank_0_fails_the_others_in_time(dead):
    r = get(dead, "openmpi4-hang-rank0")
    rec = survivor(r, 1)
    err = rec.get("error", "")
    assert err.startswith("DistEnvError: distenv.torch: rank 1 of 2 could not reach rank 0's store"), \
        r.describe()
    assert T - 1 <= rec["init_seconds"] <= T + SLACK, (rec["init_seconds"], err)
    assert r.rc not in (0, 124, 137), r.describe()


def test_hydra_does_not_abort_but_distenv_times_out_mpich4(dead):
    r = get(dead, "mpich4-exit3")
    assert_named_in_time(r, 0, "1", T)


def test_rank_exiting_early_is_named_intelmpi(dead):
    assert_named_in_time(get(dead, "intelmpi-exit0"), 0, "1", T)


def test_init_process_group_timeout_bounds_the_wait_under_srun(dead):
    """No DISTENV_TIMEOUT: init_process_group(timeout=12) bounds the rendezvous."""
    r = get(dead, "slurm-exit0-init-timeout")
    rec = survivor(r, 0)
    assert "within 12 s" in rec.get("error", ""), r.describe()
    assert_named_in_time(r, 0, "1", T_INIT)


def test_worker_exiting_early_is_named_under_torchrun(dead):
    assert_named_in_time(get(dead, "torchrun-exit0"), 0, "1", T)


def test_hung_worker_0_is_named_under_torchrun(dead):
    """The agent hosts the store, so rank 1 reaches it; rank 0 never announces itself."""
    assert_named_in_time(get(dead, "torchrun-hang-rank0"), 1, "0", T)


def test_hung_collective_fails_after_init_process_group_timeout(dead):
    r = get(dead, "openmpi5-hang-collective")
    rec = survivor(r, 0)
    assert "Timed out" in rec.get("error", ""), r.describe()
    assert 9 <= rec["op_seconds"] <= 10 + SLACK, rec
    assert r.rc not in (0, 124, 137), r.describe()
