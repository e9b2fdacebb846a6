#!/usr/bin/env python3
"""One rank of tests/integration/test_hpc_interfaces.py: prints one DISTENV-PROBE record.

    discover_probe.py discover [LIBMPICH]   resolve(), then distenv.discover() with mpi4py hidden
                                            (no MASTER_ADDR anywhere); with LIBMPICH, MPI_Init
                                            through MPICH's libmpi (ctypes) in this same process,
                                            an all-reduce and an all-gather of host names, and
                                            MPI_Finalize
    discover_probe.py show                  `distenv show --discover --json` as a child of this
                                            rank: its exit status, stdout and stderr
    discover_probe.py bring-up              what the adapters' bring-up completes (the fields
                                            torch needs), or its error
    discover_probe.py torch                 distenv.torch's whole bring-up (rank 0's own checks
                                            included, nothing exported), or its error

The launcher's own truth is the rank variable it set (SLURM_PROCID, OMPI_COMM_WORLD_RANK,
PMI_RANK) and this host's name. Standard library only, apart from distenv itself.
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
#: MPICH's ABI: MPI_COMM_WORLD, MPI_INT, MPI_SUM, MPI_CHAR (mpi.h of MPICH 4 and 5).
WORLD, INT, SUM, CHAR = 0x44000000, 0x4C000405, 0x58000003, 0x4C000101


def emit(record: dict) -> None:
    sys.stdout.write(MARK + json.dumps(record) + "\n")
    sys.stdout.flush()


def truth() -> dict:
    for var in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if var in os.environ:
            return {"rank": int(os.environ[var]), "var": var, "hostname": socket.gethostname()}
    return {"rank": None, "var": None, "hostname": socket.gethostname()}


def mpich_job(lib: str) -> dict:
    m = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    rc = m.MPI_Init(None, None)
    rank, size = ctypes.c_int(), ctypes.c_int()
    m.MPI_Comm_rank(WORLD, ctypes.byref(rank))
    m.MPI_Comm_size(WORLD, ctypes.byref(size))
    mine, total = ctypes.c_int(rank.value + 1), ctypes.c_int()
    m.MPI_Allreduce(ctypes.byref(mine), ctypes.byref(total), 1, INT, SUM, WORLD)
    send = ctypes.create_string_buffer(socket.gethostname().encode(), 64)
    recv = ctypes.create_string_buffer(64 * size.value)
    m.MPI_Allgather(send, 64, CHAR, recv, 64, CHAR, WORLD)
    hosts = [recv.raw[i * 64:(i + 1) * 64].split(b"\0", 1)[0].decode() for i in range(size.value)]
    return {"init_rc": rc, "rank": rank.value, "size": size.value, "sum": total.value,
            "hosts": hosts, "finalize_rc": m.MPI_Finalize()}


def discover_mode(lib: "str | None") -> None:
    sys.modules["mpi4py"] = None  # type: ignore[assignment]  # the launcher's service, not MPI
    had_master = "MASTER_ADDR" in os.environ
    import distenv

    before = distenv.resolve()
    record = {"truth": truth(), "pid": os.getpid(), "had_master_env": had_master,
              "before": before.to_dict(), "before_notes": list(before.notes),
              "pals": {k: v for k, v in os.environ.items() if k.startswith("PALS_")}}
    t0 = time.monotonic()
    try:
        env = distenv.discover()
        record.update(env=env.to_dict(), why=dict(env.provenance), notes=list(env.notes))
    except distenv.DistEnvError as exc:
        record["error"] = str(exc)
    record["seconds"] = time.monotonic() - t0
    record["mpi"] = mpich_job(lib) if lib and "error" not in record else None
    emit(record)


def show_mode() -> None:
    p = subprocess.run([sys.executable, "-m", "distenv", "show", "--discover", "--json"],
                       capture_output=True, text=True, timeout=300)
    emit({"truth": truth(), "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr})


def bring_up_mode() -> None:
    sys.modules["mpi4py"] = None  # type: ignore[assignment]  # the launcher's service, not MPI
    import distenv
    from distenv.bringup import completed

    record = {"truth": truth(), "given": os.environ.get("MASTER_ADDR")}
    try:
        env = completed(distenv.resolve())
        record.update(env=env.to_dict(), why=dict(env.provenance))
    except distenv.DistEnvError as exc:
        record["error"] = str(exc)
    emit(record)


def torch_mode() -> None:
    import distenv
    from distenv.bringup import NEVER, bring_up

    record = {"truth": truth(), "given": os.environ.get("MASTER_ADDR")}
    t0 = time.monotonic()
    try:
        env = bring_up("torch", export=NEVER, teardown=NEVER)
        record.update(env=env.to_dict(), why=dict(env.provenance))
    except distenv.DistEnvError as exc:
        record["error"] = str(exc)
    record["seconds"] = time.monotonic() - t0
    emit(record)


if __name__ == "__main__":
    if sys.argv[1] == "bring-up":
        bring_up_mode()
    elif sys.argv[1] == "torch":
        torch_mode()
    elif sys.argv[1] == "discover":
        discover_mode(sys.argv[2] if len(sys.argv) > 2 else None)
    elif sys.argv[1] == "show":
        show_mode()
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
