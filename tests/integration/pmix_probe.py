"""One rank of tests/integration/test_pmix_discovery.py: prints one DISTENV-PROBE record.

    pmix_probe.py discover LIBMPI   distenv.discover(method="auto") with no MASTER_ADDR anywhere
                                    (and without mpi4py: it must not be needed), then MPI_Init
                                    through the launcher's own libmpi (ctypes) in the same
                                    process: an all-reduce and an all-gather of host names, the
                                    launcher's truth of where every rank runs
    pmix_probe.py torch LIBMPI      distenv.torch.init_process_group("gloo") with no MASTER_ADDR,
                                    an all-reduce, then the same MPI job as above
    pmix_probe.py mpi4py            discover(method="auto"), then mpi4py's MPI_Init, an all-reduce
                                    and an all-gather; MPI_Finalize left to mpi4py at exit
    pmix_probe.py mpi-first LIBMPI  MPI_Init first, then discover(method="pmix"), an all-reduce
    pmix_probe.py guards            a forked and a spawned child, which inherited the PMIx
                                    variables, must refuse the service
    pmix_probe.py plain-torch       an unmodified torch script (init_process_group("gloo") from
                                    the environment); run with DISTENV_AUTO=1
    pmix_probe.py horovod           distenv.horovod.init("torch"): Horovod's MPI_Init after PMIx
    pmix_probe.py deepspeed         distenv.deepspeed.prepare(): the variables it exports
    pmix_probe.py after-run         the command `distenv run` exec'ed: what it was given, and
                                    that it completes without asking the server again
    pmix_probe.py dead-child LIBMPI distenv.discovery.pmix's child query, but the child exits without
                                    PMIx_Finalize (the server counts it a dead rank, as when its
                                    close overtakes the "finalized" mark), through the relay
                                    unless DISTENV_PMIX_RELAY=0; then the same MPI job
"""
from __future__ import annotations

import ctypes
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


def truth() -> dict:
    """What the launcher itself says about this rank: Open MPI's OMPI_COMM_WORLD_*, or
    SLURM's task variables (SLURM_GTIDS: the global ids of this node's tasks)."""
    get = os.environ.get
    if "SLURM_PROCID" in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        # (mpirun inside sbatch: the ranks inherit SLURM_* of its daemons' step, not theirs)
        gtids = [int(g) for g in get("SLURM_GTIDS", "").split(",") if g]
        return {"rank": int(get("SLURM_PROCID")), "size": int(get("SLURM_NTASKS", "-1")),
                "local_rank": int(get("SLURM_LOCALID", "-1")), "local_size": len(gtids),
                "hostname": socket.gethostname()}
    return {"rank": int(get("OMPI_COMM_WORLD_RANK", "-1")), "size": int(get("OMPI_COMM_WORLD_SIZE", "-1")),
            "local_rank": int(get("OMPI_COMM_WORLD_LOCAL_RANK", "-1")),
            "local_size": int(get("OMPI_COMM_WORLD_LOCAL_SIZE", "-1")),
            "hostname": socket.gethostname()}


def mpi_job(libmpi: str) -> dict:
    """MPI_Init in this process after discovery, through the launcher's libmpi: rank, size,
    the sum of rank+1 and every rank's host (MPI_Allgather), then MPI_Finalize."""
    m = ctypes.CDLL(libmpi, mode=ctypes.RTLD_GLOBAL)

    def sym(name):
        return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(m, name)))

    world = sym("ompi_mpi_comm_world")
    rc = m.MPI_Init(None, None)
    rank, size = ctypes.c_int(), ctypes.c_int()
    m.MPI_Comm_rank(world, ctypes.byref(rank))
    m.MPI_Comm_size(world, ctypes.byref(size))
    mine, total = ctypes.c_int(rank.value + 1), ctypes.c_int()
    m.MPI_Allreduce(ctypes.byref(mine), ctypes.byref(total), 1, sym("ompi_mpi_int"),
                    sym("ompi_mpi_op_sum"), world)
    send = ctypes.create_string_buffer(socket.gethostname().encode(), 64)
    recv = ctypes.create_string_buffer(64 * size.value)
    m.MPI_Allgather(send, 64, sym("ompi_mpi_char"), recv, 64, sym("ompi_mpi_char"), world)
    hosts = [recv.raw[i * 64:(i + 1) * 64].split(b"\0", 1)[0].decode() for i in range(size.value)]
    fin = m.MPI_Finalize()
    return {"init_rc": rc, "rank": rank.value, "size": size.value, "sum": total.value,
            "hosts": hosts, "finalize_rc": fin}


def discover_mode(libmpi: str) -> None:
    # mpi4py must not be what makes discovery work: hide it (method="auto" once demanded it)
    sys.modules["mpi4py"] = None  # type: ignore[assignment]
    had_master = "MASTER_ADDR" in os.environ
    import distenv
    import distenv.discovery.pmix as pmix

    before = distenv.resolve()
    t0 = time.monotonic()
    env = distenv.discover(method="auto")
    took = time.monotonic() - t0
    answer = pmix.query()  # the kept answer: no second query
    record = {"truth": truth(), "had_master_env": had_master,
              "before": before.to_dict(),
              "env": env.to_dict(), "why": dict(env.provenance), "seconds": took,
              "mode": answer.mode, "relayed": getattr(answer, "relayed", None), "lib": answer.lib,
              "version": answer.version}
    record["mpi"] = mpi_job(libmpi) if libmpi != "none" else None
    emit(record)


def mpi_first_mode(libmpi: str) -> None:
    """MPI_Init (the launcher's libmpi, ctypes) before discovery: the query then shares MPI's
    own PMIx client (in this process, whatever the version) and gives back only its own
    reference; MPI keeps working and finalizes cleanly."""
    m = ctypes.CDLL(libmpi, mode=ctypes.RTLD_GLOBAL)
    rc = m.MPI_Init(None, None)
    import distenv
    import distenv.discovery.pmix as pmix

    env = distenv.discover(method="pmix")
    answer = pmix.query()

    def sym(name):
        return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(m, name)))

    mine, total = ctypes.c_int(env.rank + 1), ctypes.c_int()
    m.MPI_Allreduce(ctypes.byref(mine), ctypes.byref(total), 1, sym("ompi_mpi_int"),
                    sym("ompi_mpi_op_sum"), sym("ompi_mpi_comm_world"))
    emit({"truth": truth(), "env": env.to_dict(), "mode": answer.mode, "init_rc": rc,
          "sum": total.value, "finalize_rc": m.MPI_Finalize()})


def mpi4py_mode() -> None:
    """discover(method="auto") with mpi4py installed but not imported (MPI not initialized:
    PMIx answers), then mpi4py's MPI_Init; no explicit MPI_Finalize (mpi4py's at exit)."""
    import distenv

    env = distenv.discover(method="auto")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    emit({"truth": truth(), "env": env.to_dict(), "why": env.provenance.get("master_addr"),
          "mpi": {"rank": comm.Get_rank(), "size": comm.Get_size(),
                  "sum": comm.allreduce(comm.Get_rank() + 1),
                  "hosts": comm.allgather(socket.gethostname()),
                  "library": MPI.Get_library_version()[:20]}})


def torch_mode(libmpi: str) -> None:
    had_master = "MASTER_ADDR" in os.environ
    import torch
    import torch.distributed as dist

    import distenv.torch

    env = distenv.torch.init_process_group("gloo")
    x = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(x)
    hosts = [None] * env.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()
    emit({"truth": truth(), "had_master_env": had_master, "env": env.to_dict(),
          "why": {k: env.provenance.get(k) for k in ("master_addr", "node_rank", "world_size")},
          "sum": x.item(), "gloo_hosts": hosts, "exported": os.environ.get("MASTER_ADDR"),
          "mpi": mpi_job(libmpi)})


CHILD = ("import json, distenv.discovery.pmix as p, distenv.discovery as d; o, why = p.offer(); "
         "e = d.complete(need=('master_addr', 'node_rank')); "
         "print(json.dumps({'offer': None if o is None else o.kind, 'why': why, "
         "'node_rank': e.node_rank, 'used': p.used()}))")


def guards_mode() -> None:
    """A spawned and a forked child inherit PMIX_*: neither may use the service, and the
    rank itself still can afterwards."""
    out = {}
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=300)
    out["spawned"] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-800:]}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            import distenv.discovery as d
            import distenv.discovery.pmix as pm

            o, why = pm.offer()
            e = d.complete(need=("master_addr", "node_rank"))
            os.write(w, json.dumps({"offer": None if o is None else o.kind, "why": why,
                                    "node_rank": e.node_rank, "used": pm.used()}).encode())
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
    import distenv.discovery as d

    e = d.complete(need=("master_addr", "node_rank"))
    emit({"truth": truth(), "guards": out, "node_rank": e.node_rank,
          "node_rank_why": e.provenance.get("node_rank")})


def plain_torch() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    x = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(x)
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()
    emit({"truth": truth(), "sum": x.item(), "gloo_hosts": hosts,
          **{k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}})


def horovod_mode() -> None:
    """distenv.horovod.init("torch") (Horovod's MPI controller under Open MPI: its MPI_Init
    after the PMIx query), an allreduce, Horovod's own shutdown."""
    import torch

    import distenv.horovod
    from distenv.discovery import complete

    hvd = distenv.horovod.init("torch")
    env = complete(need=("master_addr", "node_rank"))  # the kept answer
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    emit({"truth": truth(), "hvd": {"rank": hvd.rank(), "size": hvd.size(),
                                    "local_rank": hvd.local_rank(), "sum": total.item(),
                                    "cross_rank": hvd.cross_rank()},
          "env": env.to_dict(), "why": env.provenance.get("master_addr")})
    hvd.shutdown()


def deepspeed_mode() -> None:
    """distenv.deepspeed.prepare() (DeepSpeed itself not needed) exports DeepSpeed's five
    variables from PMIx."""
    import distenv.deepspeed

    distenv.deepspeed.prepare()
    emit({"truth": truth(), **{k: os.environ.get(k) for k in
                               ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}})


def after_run() -> None:
    import distenv.discovery.pmix as pm
    from distenv.discovery import complete

    o, why = pm.offer()
    e = complete(need=("node_rank", "num_nodes"))  # from what distenv run found
    emit({"truth": truth(), "node_rank": e.node_rank, "num_nodes": e.num_nodes,
          "num_nodes_why": e.provenance.get("num_nodes"), "node_rank_why": e.provenance.get("node_rank"),
          "queried": pm.used(), "held": os.environ.get(pm.HELD_VAR), "pid": os.getpid(),
          "offer": None if o is None else o.kind, "why": why,
          **{k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE",
                                            "RANK", "LOCAL_RANK")}})


#: The child of dead-child: pmix's own query, then an exit that skips PMIx_Finalize.
DEAD_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from distenv.discovery import pmix
lib = pmix._load(sys.argv[2:], [])
lib.init()
print(json.dumps(pmix._query(lib)[2]))
sys.stdout.flush()
os._exit(0)
"""


def dead_child(libmpi: str) -> None:
    from distenv.discovery import pmix, pmix_relay

    found, why = pmix.offer()
    assert found is not None, why
    relay = pmix_relay.open_relay(os.environ)  # None with DISTENV_PMIX_RELAY=0
    env = None if relay is None else {**os.environ, **relay.env}
    src = os.path.dirname(os.path.dirname(os.path.dirname(pmix.__file__)))
    read, write = os.pipe()
    p = subprocess.Popen([sys.executable, "-S", "-E", "-s", "-c", DEAD_CHILD, src, *found.libs],
                         env=env, stdout=write)
    os.close(write)
    out = pmix_relay.collect(read, time.monotonic() + 120, relay)  # relaying meanwhile
    os.close(read)
    p.wait(30)
    if relay is not None:
        relay.stop(task=found.chain)
    hosts = json.loads(out.decode().strip().splitlines()[-1])
    time.sleep(0.5)  # the server has handled whatever close it saw
    emit({"truth": truth(), "relayed": relay is not None, "child_hosts": hosts,
          "mpi": mpi_job(libmpi)})


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "discover":
        discover_mode(sys.argv[2])
    elif mode == "torch":
        torch_mode(sys.argv[2])
    elif mode == "guards":
        guards_mode()
    elif mode == "mpi4py":
        mpi4py_mode()
    elif mode == "mpi-first":
        mpi_first_mode(sys.argv[2])
    elif mode == "horovod":
        horovod_mode()
    elif mode == "deepspeed":
        deepspeed_mode()
    elif mode == "plain-torch":
        plain_torch()
    elif mode == "after-run":
        after_run()
    elif mode == "dead-child":
        dead_child(sys.argv[2])
    else:
        sys.exit(f"unknown mode {mode}")
