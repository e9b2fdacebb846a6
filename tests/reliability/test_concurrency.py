"""Concurrent jobs on one machine: four simultaneous 2-process jobs under each launcher all
finish with a gloo all_reduce through `distenv.torch.init_process_group`. (Two at once ran
here too: every check of two is a check of four, so four alone; 58 CPU-s of a full run less.)

The jobs of one test are released together (a barrier), and their ranks meet before the
rendezvous (rank_job.py, JOB_MEET_DIR): a launcher that starts its job late (torchrun under a
full test run's load: the first job's ranks had ended before the last job's started, seen in a
two-worker run) cannot turn the test into jobs run one after another. Their lifetimes are
checked to overlap. Each job's master port comes from the port rule (`distenv.ports`):
Open MPI's job id, the PMIx namespace, Intel MPI's UUID, SLURM's job.step; torchrun
--standalone picks a free port and passes it as MASTER_PORT. MPICH reveals no job id, so
its ranks all derive torch's default 29500 and say so in a note: the documented rule is to
give each MPICH job its own MASTER_PORT, which these jobs do (and
test_mpich_without_master_port_shares_29500_and_says_so shows why).

SLURM jobs use ``srun --oversubscribe`` so four 2-task jobs share the one-node SLURM's 4
CPUs at once instead of queueing.
"""
from __future__ import annotations

import pytest

import jobs

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(600)]

LAUNCHERS = ["openmpi4", "openmpi5", "mpich4", "intelmpi", "slurm", "torchrun"]


def layout(launcher):
    return jobs.torchrun(2) if launcher == "torchrun" else jobs.local(launcher, 2)


@pytest.mark.parametrize("count", [4])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_simultaneous_jobs_all_finish(request, tmp_path, launcher, count):
    lay = layout(launcher)
    why = jobs.unavailable(request, lay)
    if why:
        pytest.skip(why)
    ports = jobs.free_ports(count)
    meet = tmp_path / "meet"
    meet.mkdir()
    specs = []
    for i in range(count):
        env = {"DISTENV_TIMEOUT": "120", "JOB_MEET_DIR": str(meet), "JOB_MEET_COUNT": str(2 * count)}
        if launcher.startswith("mpich"):
            env["MASTER_PORT"] = str(ports[i])  # the documented rule: MPICH has no job id
        specs.append(jobs.Spec(f"{launcher}-{i}", lay, "allreduce", env, timeout=240))
    runs = jobs.run_all(specs, together=True)

    masters = {}
    for name, r in runs.items():
        assert r.rc == 0, r.describe()
        recs = sorted(r.records, key=lambda x: x.get("rank", -1))
        assert [x.get("rank") for x in recs] == [0, 1], r.describe()
        for x in recs:
            assert x["ok"] and x["sum"] == 3 and x["world_size"] == 2, x
            assert x["met"], ("the other jobs' ranks did not all come within 120 s", x)
            assert x["resolved"]["launcher"] == lay.expect, x["resolved"]
        ports_seen = {x["resolved"]["master_port"] for x in recs}
        assert len(ports_seen) == 1, (name, ports_seen)
        masters[name] = ports_seen.pop()
    assert len(set(masters.values())) == count, f"jobs shared a master port: {masters}"
    every = [x for r in runs.values() for x in r.records]
    assert max(x["t_start"] for x in every) < min(x["t_end"] for x in every), \
        "the jobs did not run at the same time"


def test_mpich_without_master_port_shares_29500_and_says_so(request):
    """Why MPICH jobs need MASTER_PORT: two concurrent jobs resolve the same port (29500) on
    every rank, and distenv says so in a note (`distenv show` prints it)."""
    lay = jobs.local("mpich4", 2)
    why = jobs.unavailable(request, lay)
    if why:
        pytest.skip(why)
    runs = jobs.run_all([jobs.Spec(f"mpich4-{i}", lay, "resolve", timeout=60) for i in range(2)],
                        together=True)
    for r in runs.values():
        assert r.rc == 0 and len(r.records) == 2, r.describe()
        for x in r.records:
            assert x["resolved"]["master_port"] == 29500, x
            assert any("MPICH reveals no job id" in n and "MASTER_PORT" in n for n in x["notes"]), x
