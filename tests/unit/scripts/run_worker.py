#!/usr/bin/env python3
"""A worker for `distenv run` tests: prints ONE marked JSON record on stdout.

    run_worker.py [--allreduce] [--sleep S] [--pid-dir DIR] [--exit N] [args...]

Record (after the marker ``DISTENV-WORKER ``): the torch variables this worker was given,
DISTENV_AUTO/DISTENV_RUN, its argv, host name and pid, and with --allreduce the result of a
real gloo rendezvous: init_process_group + all_reduce(rank + 1) + all_gather of host names.
"""
import json
import os
import socket
import sys
import time

MARK = "DISTENV-WORKER "
VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DISTENV_AUTO",
        "DISTENV_RUN", "DISTENV_NPROC_PER_NODE", "OMP_NUM_THREADS")


def main(argv):
    record = {"vars": {k: os.environ.get(k) for k in VARS}, "argv": argv,
              "hostname": socket.gethostname(), "pid": os.getpid()}
    if "--pid-dir" in argv:
        d = argv[argv.index("--pid-dir") + 1]
        with open(os.path.join(d, f"{os.getpid()}.pid"), "w") as f:
            f.write(str(os.getpid()))
    if "--allreduce" in argv:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        hosts = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, socket.gethostname())
        record["dist"] = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                          "sum": t.item(), "hosts": hosts}
        dist.destroy_process_group()
    sys.stdout.write(MARK + json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()
    if "--sleep" in argv:
        time.sleep(float(argv[argv.index("--sleep") + 1]))
    if "--exit" in argv:
        return int(argv[argv.index("--exit") + 1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
