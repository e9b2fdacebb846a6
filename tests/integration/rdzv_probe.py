#!/usr/bin/env python3
"""Rendezvous through distenv, as every rank of a real launcher:

    env = distenv.resolve(); env.export()
    torch.distributed.init_process_group("gloo", init_method="env://", timeout=60 s)
    all_reduce(tensor([rank + 1])) == N(N+1)/2

Prints ONE record after the marker ``DISTENV-PROBE ``: {"hostname", "ok", "rank",
"world_size", "sum", "expected", "resolved" (distenv's fields), "exported" (what
export() wrote), "peers" (every rank's hostname, by rank), "error" (on failure)}.
Exits 1 on any failure, after printing the record.
"""
from __future__ import annotations

import json
import socket
import sys
import traceback
from datetime import timedelta

MARK = "DISTENV-PROBE "


def main() -> int:
    out: dict = {"hostname": socket.gethostname(), "ok": False}
    try:
        import distenv

        env = distenv.resolve()
        out["resolved"] = env.to_dict()
        out["exported"] = env.export()

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
        try:
            rank, size = dist.get_rank(), dist.get_world_size()
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
            peers = [None] * size
            dist.all_gather_object(peers, socket.gethostname())
        finally:
            dist.destroy_process_group()
        expected = size * (size + 1) // 2
        out.update(rank=rank, world_size=size, sum=int(t.item()), expected=expected,
                   peers=peers, ok=int(t.item()) == expected and rank == env.rank)
    except BaseException as exc:  # noqa: BLE001 - reported, then a non-zero exit
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-3000:]
    sys.stdout.write(MARK + json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
