#!/usr/bin/env python3
"""Run as every rank of a real launcher; prints ONE marked JSON record on stdout.

    <launcher argv> /abs/python /abs/tests/integration/rank_probe.py --truth FAMILY

The record (after the marker ``DISTENV-PROBE ``, so launchers that glue lines together,
like Intel MPI's output forwarding, cannot break parsing):

    {"hostname": socket.gethostname(),
     "truth":   the launcher's own numbering, read from ITS variables (FAMILY below),
     "markers": a few launcher variables as they are (e.g. SLURM_JOB_ID under mpirun
                inside sbatch),
     "distenv": {"rc", "json" | None, "stderr"}  -- `python -m distenv show --json`,
                run as a subprocess of this rank (the CLI contract),
     "export":  {"rc", "stdout", "stderr"}       -- `python -m distenv export` (CLI),
     "inproc":  {"fields", "notes", "export" | "export_error"} -- distenv.resolve() in
                this process, and what .export({}) wrote or the DistEnvError it raised}

FAMILY names whose variables are the truth: openmpi, hydra (MPICH, Intel MPI), slurm,
torchrun, none. It is given explicitly because nested launches carry several families'
variables (mpirun inside sbatch still has SLURM_*; torchrun inside srun has SLURM_*).
Standard library only, apart from distenv itself.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

MARK = "DISTENV-PROBE "

# field -> variable names (first present wins), per family.
TRUTH = {
    "openmpi": {
        "rank": ("OMPI_COMM_WORLD_RANK",),
        "local_rank": ("OMPI_COMM_WORLD_LOCAL_RANK",),
        "world_size": ("OMPI_COMM_WORLD_SIZE",),
        "local_world_size": ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    },
    "hydra": {
        "rank": ("PMI_RANK", "PMI_ID"),
        "local_rank": ("MPI_LOCALRANKID",),
        "world_size": ("PMI_SIZE",),
        "local_world_size": ("MPI_LOCALNRANKS",),
        "node_rank": ("HYDRA_BSTRAP_NODE_ID",),
    },
    "slurm": {
        "rank": ("SLURM_PROCID",),
        "local_rank": ("SLURM_LOCALID",),
        "node_rank": ("SLURM_NODEID",),
        "world_size": ("SLURM_STEP_NUM_TASKS",),
        "num_nodes": ("SLURM_STEP_NUM_NODES",),
    },
    "torchrun": {
        "rank": ("RANK",),
        "local_rank": ("LOCAL_RANK",),
        "world_size": ("WORLD_SIZE",),
        "local_world_size": ("LOCAL_WORLD_SIZE",),
        "node_rank": ("GROUP_RANK",),
        "num_nodes": ("GROUP_WORLD_SIZE",),
        "master_addr": ("MASTER_ADDR",),
        "master_port": ("MASTER_PORT",),
    },
    "none": {},
}


# Variables recorded as they are (presence matters): nested launches inherit these.
MARKERS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID",
           "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PMI_ID", "TORCHELASTIC_RUN_ID",
           "MASTER_ADDR", "MASTER_PORT",
           # the launchers' own job ids (test_layouts.JOB_ID_VAR)
           "PMIX_NAMESPACE", "I_MPI_HYDRA_UUID")


def truth(family: str) -> dict:
    out: dict = {"family": family, "vars": {}}
    for field, names in TRUTH[family].items():
        out[field] = None
        for name in names:
            if name in os.environ:
                out["vars"][field] = f"{name}={os.environ[name]}"
                try:
                    out[field] = int(os.environ[name])
                except ValueError:
                    out[field] = os.environ[name]
                break
    return out


def cli(*args: str) -> dict:
    try:
        p = subprocess.run([sys.executable, "-m", "distenv", *args], capture_output=True,
                           text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {"rc": None, "stdout": "", "stderr": "timed out"}
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def inproc() -> dict:
    try:
        import distenv
    except Exception as exc:  # pragma: no cover - reported, asserted by the tests
        return {"import_error": repr(exc)}
    try:
        env = distenv.resolve()
    except distenv.DistEnvError as exc:
        return {"resolve_error": str(exc)}
    out = {"fields": env.to_dict(), "notes": list(env.notes)}
    try:
        out["export"] = env.export({})
    except distenv.DistEnvError as exc:
        out["export_error"] = str(exc)
    return out


def main() -> int:
    family = "none"
    if "--truth" in sys.argv:
        family = sys.argv[sys.argv.index("--truth") + 1]
    show = cli("show", "--json")
    parsed = None
    if show["rc"] == 0:
        try:
            parsed = json.loads(show["stdout"])
        except ValueError:
            parsed = None
    record = {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "truth": truth(family),
        "markers": {k: os.environ[k] for k in MARKERS if k in os.environ},
        "distenv": {"rc": show["rc"], "json": parsed, "stdout": show["stdout"],
                    "stderr": show["stderr"]},
        "export": cli("export"),
        "inproc": inproc(),
    }
    # One write, so records of ranks sharing a pipe do not interleave.
    sys.stdout.write(MARK + json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
