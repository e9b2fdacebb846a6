#!/usr/bin/env python3
"""The tiny example the template tests run: what every job template runs, minus training.

    distenv.resolve(); env.export(); torch.distributed gloo init; all_reduce(rank + 1);
    all_gather of host names; one JSON record per rank.

    python integrations/templates-test/allreduce.py [--out DIR]

With --out, each rank writes its record to DIR/<host>-<pid>.json (no launcher can merge or
cut it); otherwise it prints ``DISTENV-TEMPLATE {json}``. The record: host, rank,
world_size, local_rank (from distenv), sum (the all_reduce result; every rank must hold
N(N+1)/2), hosts (every rank's host, by rank), and distenv's launcher, launch, node_rank,
num_nodes, master_addr, master_port. Exits 1 on any failure, after writing the record.
Needs only distenv and torch (gloo).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import traceback
from datetime import timedelta

MARK = "DISTENV-TEMPLATE "


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the record to a file of its own in this directory")
    ap.add_argument("--timeout", type=float, default=90, help="rendezvous timeout, seconds")
    args = ap.parse_args(argv)
    rec: dict = {"host": socket.gethostname(), "pid": os.getpid(), "ok": False,
                 "via_distenv_run": os.environ.get("DISTENV_RUN") == "1"}
    try:
        import distenv

        env = distenv.resolve()
        rec.update({k: env.to_dict()[k] for k in ("launcher", "platform", "launch", "node_rank",
                                                  "num_nodes", "master_addr", "master_port",
                                                  "local_rank", "local_world_size")})
        env.export()

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://",
                                timeout=timedelta(seconds=args.timeout))
        try:
            rank, size = dist.get_rank(), dist.get_world_size()
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
            hosts = [None] * size
            dist.all_gather_object(hosts, socket.gethostname())
        finally:
            dist.destroy_process_group()
        rec.update(rank=rank, world_size=size, sum=int(t.item()), hosts=hosts,
                   ok=int(t.item()) == size * (size + 1) // 2 and rank == env.rank)
    except BaseException as exc:  # noqa: BLE001 - reported, then a non-zero exit
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()[-2000:]
    text = json.dumps(rec, sort_keys=True)
    if args.out:
        path = os.path.join(args.out, f"{rec['host']}-{rec['pid']}.json")
        with open(path + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(path + ".tmp", path)
    else:
        sys.stdout.write(MARK + text + "\n")
        sys.stdout.flush()
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
