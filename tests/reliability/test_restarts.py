"""Restarts: under ``torchrun --max-restarts 1`` a worker that fails once makes torchrun
restart the whole group; the restarted workers resolve right and rendezvous.

Worker 1 exits 1 in the first attempt (TORCHELASTIC_RESTART_COUNT=0), right after resolving
or after a first rendezvous and all_reduce (a crash in training); torchrun stops worker 0 and starts both again with TORCHELASTIC_RESTART_COUNT=1, where both
run `distenv.torch.init_process_group` and an all_reduce. Each attempt's workers are new
processes with their own output files (tests/integration/harness.py), so every attempt is
seen.
"""
from __future__ import annotations

import pytest

import jobs

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(600)]


MODES = ["fail-once", "fail-once-after"]


@pytest.fixture(scope="module")
def runs(request):
    lay = jobs.torchrun(2, "--max-restarts", "1", "--monitor-interval", "1")
    why = jobs.unavailable(request, lay)
    if why:
        pytest.skip(why)
    return jobs.run_all([jobs.Spec(mode, lay, mode, {"DISTENV_TIMEOUT": "60"}, timeout=240)
                         for mode in MODES])


@pytest.fixture(params=MODES)
def restarted(request, runs):
    """fail-once: worker 1 fails before the rendezvous; fail-once-after: after it (the first
    attempt's store keys exist when the second attempt joins)."""
    return runs[request.param]


def test_the_job_succeeds_after_one_restart(restarted):
    r = restarted
    assert r.rc == 0, r.describe()
    first = [x for x in r.records if x.get("restart_count") == "0"]
    assert [x.get("rank") for x in first if x.get("victim")] == [1], r.describe()


def test_restarted_workers_resolve_right_and_rendezvous(restarted):
    r = restarted
    second = sorted((x for x in r.records if x.get("restart_count") == "1"),
                    key=lambda x: x["rank"])
    assert [x["rank"] for x in second] == [0, 1], r.describe()
    for x in second:
        d = x["resolved"]
        assert d["launcher"] == "torchrun" and d["world_size"] == 2, d
        assert d["local_rank"] == x["rank"] and d["local_world_size"] == 2, d
        assert d["node_rank"] == 0 and d["num_nodes"] == 1, d
        assert x["ok"] and x["sum"] == 3 and x["world_size"] == 2, x
    assert len({x["resolved"]["master_port"] for x in second}) == 1
    assert len({x["pid"] for x in r.records}) == len(r.records), "restarted workers are new processes"
