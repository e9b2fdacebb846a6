"""A rendezvous waiting for ranks says so (issue 14): rank 0 logs, every 10 s, how many ranks
joined and which ones it waits for, through the logger ``distenv.torch``; with no logging
configured by the application, distenv's own handler prints it on stderr.

A real 2-rank Open MPI job in which rank 1 starts its init_process_group 16 s after rank 0
(counted from a file rank 0 leaves just before its own: how long each rank takes to import
torch on a loaded machine does not move it).
"""
from __future__ import annotations

import re

import pytest

import jobs
from jobs import harness

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(600)]

LATE = 16  # seconds rank 1 comes after rank 0: one or two progress lines (every 10 s)
SCRIPT = f"""
import json, os, sys, time
import torch, torch.distributed as dist
import distenv.torch
ready = os.path.join(os.environ["JOB_DIR"], "rank0-waits")
if int(os.environ["OMPI_COMM_WORLD_RANK"]) == 1:
    while not os.path.exists(ready):
        time.sleep(0.05)
    time.sleep({LATE})
else:
    open(ready, "w").close()
env = distenv.torch.init_process_group()
t = torch.full((1,), float(env.rank + 1))
dist.all_reduce(t)
sys.stdout.write("DISTENV-PROBE " + json.dumps({{"rank": env.rank, "sum": t.item()}}) + "\\n")
"""


def test_rank_0_logs_who_is_missing_while_it_waits(request, tmp_path):
    lay = jobs.local("openmpi4", 2)
    why = jobs.unavailable(request, lay)
    if why:
        pytest.skip(why)
    res = harness.launch(lay, [jobs.PY, "-c", SCRIPT], timeout=240, check=False,
                         env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "DISTENV_AUTO": "0",
                              "JOB_DIR": str(tmp_path)})
    files = res["files"]
    records = {r["rank"]: r for out, _err in files.values() for r in harness.parse_records(out)}
    text = "\n".join(f"--- {n}: {out[-1500:]}\n{err[-3000:]}" for n, (out, err) in files.items())
    assert res["rc"] == 0 and sorted(records) == [0, 1], text
    assert all(r["sum"] == 3.0 for r in records.values()), records
    line = re.compile(r"^distenv\.torch: info: 1 of 2 ranks joined; waiting for 1 "
                      r"\((\d+) s so far; gives up after 180 s, DISTENV_TIMEOUT\)$", re.M)
    by_rank = {}
    for out, err in files.values():
        rank = harness.parse_records(out)[0]["rank"] if harness.parse_records(out) else None
        by_rank[rank] = [int(m.group(1)) for m in line.finditer(err)]
    assert by_rank.get(0), f"rank 0 logged no progress line:\n{text}"
    assert by_rank[0][0] >= 9 and all(b - a >= 9 for a, b in zip(by_rank[0], by_rank[0][1:])), by_rank
    assert not by_rank.get(1), f"only rank 0 reports progress:\n{text}"
