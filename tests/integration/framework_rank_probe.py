"""Run as every rank of a framework launcher (horovodrun, the DeepSpeed runner): print one
line ``REC {json}`` with what the launcher told this rank and what distenv made of it.

    python framework_rank_probe.py torch [OUT_DIR]      # distenv.torch.init_process_group("gloo")
    python framework_rank_probe.py deepspeed [OUT_DIR]  # distenv.deepspeed.init_distributed("gloo")

Arguments starting with ``--`` are ignored (the DeepSpeed launcher appends ``--local_rank=N``).
With OUT_DIR the line also goes to OUT_DIR/rank-<distenv rank>.<pid>.rec, one file per rank (the
nodes share the file system): launchers that glue the ranks' output lines cannot mix records.

The record: ``host`` (this rank's real host name), ``v`` (the launcher's own variables:
HOROVOD_*, OMPI_COMM_WORLD_*, and the torch/DeepSpeed names RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE,
CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT, as the launcher set them, read before
distenv exports anything), ``d`` (``distenv.resolve().to_dict()`` before any
communication), ``bare`` (the same without
MASTER_ADDR, in torch mode), ``used`` (the description the adapter returned, after its completion),
``sum`` (a gloo all_reduce of rank + 1) and ``world`` (torch.distributed's world size).
Standard output only; the test reads every rank's line.
"""
import json
import os
import socket
import sys

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "LOCAL_WORLD_SIZE", "CROSS_RANK",
         "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK")


def main(mode: str, out: "str | None") -> int:
    v = {k: val for k, val in os.environ.items() if k in NAMES or k.startswith(("HOROVOD_", "OMPI_COMM_WORLD_"))}
    import distenv

    d = distenv.resolve()
    # the same rank without a MASTER_ADDR given by the user (what the launcher alone reveals)
    bare = distenv.resolve({k: val for k, val in os.environ.items() if k != "MASTER_ADDR"}) \
        if mode == "torch" else d
    import torch
    import torch.distributed as dist

    if mode == "deepspeed":
        import distenv.deepspeed

        used = distenv.deepspeed.init_distributed("gloo")
    else:
        import distenv.torch

        used = distenv.torch.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    rec = {"host": socket.gethostname(), "v": v, "d": d.to_dict(), "bare": bare.to_dict(), "used": used.to_dict(),
           "sum": t.item(), "world": dist.get_world_size(), "dist_rank": dist.get_rank()}
    line = "REC " + json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(os.path.join(out, f"rank-{d.rank}.{os.getpid()}.rec"), "w") as f:
            f.write(line + "\n")
    if mode == "deepspeed":
        dist.barrier()
        dist.destroy_process_group()
    else:
        distenv.torch.destroy_process_group()
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sys.exit(main(args[0] if args else "torch", args[1] if len(args) > 1 else None))
