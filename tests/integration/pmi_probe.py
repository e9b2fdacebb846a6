"""One rank of tests/integration/test_pmi_discovery.py: prints one DISTENV-PROBE record.

    pmi_probe.py torch          distenv.torch.init_process_group() with no MASTER_ADDR anywhere,
                                all_reduce, the guards (a forked and a spawned child that
                                inherited PMI_FD/PMI_PORT must refuse the service), then
                                mpi4py's MPI_Init and an MPI allreduce in the same process
    pmi_probe.py fault R T      rank R exits before the exchange; the others run it with
                                DISTENV_TIMEOUT=T and report the error and how long it took
    pmi_probe.py after-run      the command `distenv run` exec'ed: what it was given
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

MARK = "DISTENV-PROBE "


def emit(record: dict) -> None:
    sys.stdout.write(MARK + json.dumps(record) + "\n")
    sys.stdout.flush()


def launcher_rank() -> int:
    return int(os.environ.get("PMI_RANK", os.environ.get("PMI_ID", "-1")))


CHILD = ("import json, distenv.discovery.pmi as p, distenv.discovery as d; o, why = p.offer(); "
         "e = d.complete(need=('master_addr',)); "
         "print(json.dumps({'offer': None if o is None else o.mode, 'why': why, "
         "'master_addr': e.master_addr}))")


def children() -> dict:
    """What a forked child and a spawned child (given the PMI fd) make of the service."""
    out = {}
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    fds = ()
    if os.environ.get("PMI_FD", "").isdigit():
        fds = (int(os.environ["PMI_FD"]),)
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, pass_fds=fds, capture_output=True,
                       text=True, timeout=120)
    out["spawned"] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-800:]}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked child inherits everything, the fd included
        os.close(r)
        try:
            os.environ.pop("MASTER_ADDR", None)
            import distenv.discovery as d
            import distenv.discovery.pmi as pm

            o, why = pm.offer()
            from distenv import resolve

            e = d.complete(resolve(), need=("master_addr",))
            os.write(w, json.dumps({"offer": None if o is None else o.mode, "why": why,
                                    "master_addr": e.master_addr}).encode())
        except BaseException as exc:  # noqa: BLE001
            os.write(w, json.dumps({"error": repr(exc)}).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.waitpid(pid, 0)
    out["forked"] = json.loads(data or b'{"error": "nothing"}')
    return out


def torch_mode() -> None:
    had_master = "MASTER_ADDR" in os.environ
    import distenv

    before = distenv.resolve()
    import torch
    import torch.distributed as dist

    import distenv.torch

    t0 = time.monotonic()
    env = distenv.torch.init_process_group("gloo")
    joined = time.monotonic() - t0
    x = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(x)
    hosts = [None] * env.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()
    guards = children()
    from mpi4py import MPI  # MPI_Init after the exchange, in the same process

    comm = MPI.COMM_WORLD
    mpi = {"rank": comm.Get_rank(), "size": comm.Get_size(),
           "sum": comm.allreduce(comm.Get_rank() + 1), "hosts": comm.allgather(socket.gethostname())}
    emit({"rank": env.rank, "hostname": socket.gethostname(), "had_master_env": had_master,
          "before": {"master_addr": before.master_addr, "node_rank": before.node_rank,
                     "world_size": before.world_size},
          "env": env.to_dict(), "why": {k: env.provenance.get(k) for k in
                                        ("master_addr", "node_rank", "world_size", "master_port")},
          "sum": x.item(), "gloo_hosts": hosts, "joined_s": joined, "guards": guards, "mpi": mpi,
          "exported": os.environ.get("MASTER_ADDR")})
    MPI.Finalize()


def fault_mode(drop: int, timeout: str) -> None:
    rank = launcher_rank()
    if rank == drop:
        sys.exit(0)  # never reaches the exchange
    os.environ["DISTENV_TIMEOUT"] = timeout
    from distenv import DistEnvError
    from distenv.discovery import complete

    t0, cpu0 = time.monotonic(), time.process_time()
    try:
        env = complete(need=("master_addr",))
        record = {"rank": rank, "error": None, "master_addr": env.master_addr}
    except DistEnvError as exc:
        record = {"rank": rank, "error": str(exc)}
    record["elapsed"] = time.monotonic() - t0
    record["cpu"] = time.process_time() - cpu0  # this process's CPU while it waited
    emit(record)
    time.sleep(2)  # the others print too before this rank's exit can end the job


def after_run() -> None:
    import distenv.discovery.pmi as pm

    o, why = pm.offer()
    from distenv.discovery import complete

    e = complete(need=("node_rank", "num_nodes"))  # from what distenv run found, no exchange
    emit({"rank": int(os.environ["RANK"]), "node_rank": e.node_rank, "num_nodes": e.num_nodes,
          "num_nodes_why": e.provenance.get("num_nodes"), "ran_exchange": pm.used(), "MASTER_ADDR": os.environ.get("MASTER_ADDR"),
          "MASTER_PORT": os.environ.get("MASTER_PORT"), "NODE_RANK": os.environ.get("NODE_RANK"),
          "WORLD_SIZE": os.environ.get("WORLD_SIZE"), "held": os.environ.get(pm.HELD_VAR),
          "pid": os.getpid(), "offer": None if o is None else o.mode, "why": why,
          "hostname": socket.gethostname()})


def adapter_mode(which: str) -> None:
    """`deepspeed`: distenv.deepspeed.prepare() (DeepSpeed itself is not needed for it);
    `auto`: what DISTENV_AUTO=1 exported at interpreter start, before any line of ours."""
    seen = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                           "LOCAL_RANK", "NODE_RANK")}
    if which == "deepspeed":
        import distenv.deepspeed

        distenv.deepspeed.prepare()
        seen = {k: os.environ.get(k) for k in seen}
    emit({"rank": launcher_rank(), "vars": seen, "hostname": socket.gethostname()})


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "torch":
        torch_mode()
    elif mode == "fault":
        fault_mode(int(sys.argv[2]), sys.argv[3])
    elif mode == "after-run":
        after_run()
    elif mode in ("deepspeed", "auto"):
        adapter_mode(mode)
    else:
        sys.exit(f"unknown mode {mode}")
