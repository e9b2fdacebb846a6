#!/usr/bin/env python3
"""One rank of a reliability job, started by a real launcher (see tests/reliability/jobs.py).

    rank_job.py MODE

Every rank resolves its launch first (`distenv.resolve()`), then according to MODE:

    resolve         only resolve (no torch): the record shows what distenv derived
    allreduce       distenv.torch.init_process_group("gloo"), all_reduce(rank + 1)
    exit-before     rank $JOB_VICTIM exits with status $JOB_EXIT (default 0) before the
                    rendezvous; the others do `allreduce`
    hang-before     rank $JOB_VICTIM sleeps (until killed) before the rendezvous
    hang-collective every rank joins; rank $JOB_VICTIM then sleeps while the others
                    all_reduce with init_process_group(timeout=$JOB_PG_TIMEOUT)
    fail-once       under torchrun: rank $JOB_VICTIM exits 1 in the first attempt
                    (TORCHELASTIC_RESTART_COUNT=0); every rank of the next attempt does
                    `allreduce`
    fail-once-after as fail-once, but the victim fails after the first attempt's
                    rendezvous and all_reduce (a crash during training)

$JOB_INIT_TIMEOUT (seconds), if set, is passed as init_process_group(timeout=...).
$JOB_MEET_DIR and $JOB_MEET_COUNT, if set: before the rendezvous, every rank leaves a file in
the directory and waits (up to 120 s) until there are that many: the ranks of concurrent jobs
then all rendezvous at the same time, however late a launcher started one (record: "met").

Prints one record after the marker ``DISTENV-PROBE `` (whatever happens): hostname, pid,
mode, resolved fields and notes, restart count, ok, sum, error (type: message), seconds
spent in init_process_group (init_seconds) and all_reduce (op_seconds), and elapsed
seconds since the rank started. Exits 0 on success, 1 on an error, $JOB_EXIT for a victim.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback

T0 = time.monotonic()
START = time.time()
MARK = "DISTENV-PROBE "


def emit(out: dict) -> None:
    out["elapsed"] = round(time.monotonic() - T0, 2)
    out["t_start"], out["t_end"] = round(START, 3), round(time.time(), 3)
    sys.stdout.write(MARK + json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()


def meet(directory: str, count: int, limit: float = 120.0) -> bool:
    """Leave this rank's file in `directory`; wait until `count` files are there (True) or
    `limit` seconds passed (False)."""
    open(os.path.join(directory, f"{socket.gethostname()}.{os.getpid()}"), "w").close()
    deadline = time.monotonic() + limit
    while len(os.listdir(directory)) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def main(mode: str) -> int:
    out: dict = {"hostname": socket.gethostname(), "pid": os.getpid(), "mode": mode, "ok": False,
                 "restart_count": os.environ.get("TORCHELASTIC_RESTART_COUNT")}
    victim = int(os.environ.get("JOB_VICTIM", "1"))
    try:
        import distenv

        env = distenv.resolve()
        out["resolved"] = env.to_dict()
        out["notes"] = list(env.notes)
        out["rank"] = env.rank
        if mode == "resolve":
            out["ok"] = True
            emit(out)
            return 0
        is_victim = env.rank == victim
        if mode == "exit-before" and is_victim:
            code = int(os.environ.get("JOB_EXIT", "0"))
            out.update(victim=True, exit=code)
            emit(out)
            return code
        if mode == "hang-before" and is_victim:
            out["victim"] = True
            emit(out)
            time.sleep(3600)
            return 0
        if mode == "fail-once" and is_victim and out["restart_count"] == "0":
            out.update(victim=True, exit=1)
            emit(out)
            return 1

        import torch
        import torch.distributed as dist

        import distenv.torch

        kwargs = {}
        if mode == "hang-collective":
            kwargs["timeout"] = float(os.environ.get("JOB_PG_TIMEOUT", "10"))
        if os.environ.get("JOB_INIT_TIMEOUT"):
            kwargs["timeout"] = float(os.environ["JOB_INIT_TIMEOUT"])
        if os.environ.get("JOB_MEET_DIR"):
            out["met"] = meet(os.environ["JOB_MEET_DIR"], int(os.environ["JOB_MEET_COUNT"]))
        t_init = time.monotonic()
        try:
            distenv.torch.init_process_group("gloo", **kwargs)
        finally:
            out["init_seconds"] = round(time.monotonic() - t_init, 2)
        out["port"] = int(os.environ.get("MASTER_PORT", "0"))  # the port the job met on
        try:
            if mode == "hang-collective" and is_victim:
                out["victim"] = True
                emit(out)
                time.sleep(3600)
                return 0
            t = torch.tensor([float(env.rank + 1)])
            t_op = time.monotonic()
            try:
                dist.all_reduce(t)
            finally:
                out["op_seconds"] = round(time.monotonic() - t_op, 2)
            size = dist.get_world_size()
            out.update(sum=int(t.item()), world_size=size,
                       ok=int(t.item()) == size * (size + 1) // 2 and dist.get_rank() == env.rank)
            if mode == "fail-once-after" and is_victim and out["restart_count"] == "0":
                out.update(victim=True, exit=1)
                emit(out)
                os._exit(1)
        finally:
            if mode != "hang-collective":
                dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported, then a non-zero exit
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:3000]
        out["traceback"] = traceback.format_exc()[-2000:]
    emit(out)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    code = main(sys.argv[1] if len(sys.argv) > 1 else "allreduce")
    sys.stdout.flush()
    # a hang-collective survivor must not wait in gloo's teardown for the sleeping victim
    os._exit(code)
