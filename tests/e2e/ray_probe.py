"""What every Ray Train worker of tests/e2e/test_ray_e2e.py runs (through
integrations/ray/driver.py, as a user's script would): one JSON record per worker in --out.

The record holds Ray's own view of the worker (`ray.train.get_context()`: the truth),
distenv's (`distenv.resolve()`), whether `distenv.torch.init_process_group()` kept the process
group Ray had made (the same object before and after), an all_reduce of rank + 1 over it,
every worker's node address (rank 0's is where Ray put the master), whether the worker saw
the SLURM variables of the step that started Ray, and with --cli the outputs of `distenv
show --json`, `distenv doctor` and `distenv show --map` run from the worker; with
--lightning, what `distenv.lightning.DistenvEnvironment()` says there. With --then SCRIPT
ARGS..., that script then runs as __main__ in the same worker (examples/hf_trainer.py).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback


def cli(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "distenv", *args], capture_output=True, text=True,
                       timeout=120)
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr[-2000:]}


def probe(args: "list[str]") -> dict:
    rec: dict = {"host": socket.gethostname(), "pid": os.getpid(), "ok": False}
    import ray.train
    import ray.util
    import torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rec["truth"] = {"rank": ctx.get_world_rank(), "local_rank": ctx.get_local_rank(),
                    "node_rank": ctx.get_node_rank(), "world_size": ctx.get_world_size(),
                    "local_world_size": ctx.get_local_world_size()}
    rec["ray_initialized_torch"] = dist.is_initialized()
    rec["slurm_inherited"] = {k: os.environ[k] for k in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
                              if k in os.environ}
    group = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    # what a recording keeps (integrations/record: tests/fixtures/frameworks/ray-*.json)
    rec["environ"] = {k: v for k, v in os.environ.items()
                      if k.startswith(("RAY_", "SLURM_", "MASTER_", "TORCHELASTIC_")) or k in
                      ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")}

    import distenv
    import distenv.torch

    env = distenv.resolve()
    rec["resolved"] = env.to_dict()
    rec["why"] = dict(env.provenance)
    got = distenv.torch.init_process_group()
    rec["init_returned"] = {"launcher": got.launcher, "rank": got.rank,
                            "world_size": got.world_size}
    rec["same_group"] = group is not None and dist.distributed_c10d._get_default_group() is group
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    rec["sum"] = int(t.item())
    ips: list = [None] * dist.get_world_size()
    dist.all_gather_object(ips, ray.util.get_node_ip_address())
    rec["node_ips"] = ips
    if "--cli" in args:
        rec["show"] = cli("show", "--json")
        rec["doctor"] = cli("doctor")
        rec["map"] = cli("show", "--map")
    if "--lightning" in args:
        try:
            import distenv.lightning

            distenv.lightning.DistenvEnvironment()
            rec["lightning"] = "accepted"
        except distenv.DistEnvError as exc:
            rec["lightning"] = str(exc)
    rec["ok"] = True
    return rec


def main() -> int:
    args = sys.argv[1:]
    then = args[args.index("--then") + 1:] if "--then" in args else []
    mine = args[:len(args) - len(then) - (1 if then else 0)]
    out = mine[mine.index("--out") + 1]
    try:
        rec = probe(mine)
    except BaseException as exc:  # noqa: BLE001 - recorded, then a failure
        rec = {"host": socket.gethostname(), "pid": os.getpid(), "ok": False,
               "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    path = os.path.join(out, f"{rec['host']}-{rec['pid']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, sort_keys=True)
    os.replace(path + ".tmp", path)
    if not rec["ok"]:
        return 1
    if then:
        import runpy

        sys.argv = then
        runpy.run_path(then[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
