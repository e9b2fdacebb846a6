"""The doctor's checks of the launch (the launcher, its notes, what a distributed job would
miss), the placement map (rank 0's report), the GPUs and the CPU threads."""

from __future__ import annotations

import os

from ..core.description import DEFAULT, PER_NODE, kind_of
from ..errors import DistEnvError, split_fix
from ..core.redact import redact_text
from . import system

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ..core.description import DistEnv
    from .report import Report


def _int(value: object) -> "int | None":
    try:
        return int(str(value).split(",")[0].strip())
    except (TypeError, ValueError):
        return None


def _check_knobs(rep: Report, environ: "Mapping[str, str]") -> None:
    """A DISTENV_* name distenv does not know: a warning naming the nearest one (a misspelled
    DISTENV_AUTO leaves a script undistributed without a word). A known knob whose value its
    parser refuses: an error now, with the knob's Fix (the job would die on it only when the
    adapter first reads it, e.g. DISTENV_TIMEOUT at the rendezvous)."""
    from ..knobs import KNOBS, unknown, unknown_message

    for name, nearest in unknown(environ):
        problem, fix = split_fix(unknown_message(name, nearest))
        rep.add("warning", "knobs", problem, fix)
    for knob in KNOBS.values():
        try:
            knob.value(environ)
        except DistEnvError as e:
            problem, fix = split_fix(str(e))
            rep.add("error", "knobs", problem, fix)


def _check_launch(rep: Report, env: DistEnv, environ: "Mapping[str, str]") -> None:
    if env.launcher == "none" and env.launch != PER_NODE:
        rep.add("info", "launch", "not launched distributed: a single process "
                f"({env.provenance.get('launcher')}). distenv's zero-code paths (DISTENV_AUTO, "
                "the patches) patch no framework here: a framework that detects its platform "
                "itself (JAX on Cloud TPU/GCE or Kubernetes, torch-xla, Lightning's XLA "
                "environment, Accelerate's TPU state) keeps its own answer.")
    else:
        where = f" on {env.platform}" if env.platform else ""
        rep.add("ok", "launch", f"{env.launcher}{where}, {env.launch} launch: "
                f"{env.provenance.get('launcher')}.")
    from ..knobs import LAUNCHER

    if LAUNCHER.raw(environ):
        rep.add("info", "launch", f"{LAUNCHER}={environ[LAUNCHER]} forces the launcher.")
    from ..sources import find

    entry = find(env.launcher) if env.launcher else None
    acting = entry.load().frameworks.adapters if entry is not None else None
    if acting is not None:
        rep.add("info", "launch", f"on this launch only distenv's {', '.join(acting)} adapter(s) act; "
                "the other frameworks set themselves up (a TPU pod: torch-xla numbers its "
                "processes per chip, so no torch variables are exported).")
    for note in env.notes:
        rep.add("warning", "launch", *split_fix(note))
    if env.launch == PER_NODE:
        rep.add("info", "launch",
                f"per-node launch: node {env.node_rank} of {env.num_nodes}, {env.nproc_per_node} "
                f"worker(s) per node are yet to be started ({env.provenance.get('nproc_per_node')}).",
                "start the script with `distenv run -- python script.py ...` (torch's launcher "
                "starts the workers), or have the launcher start one process per worker.")
    if not env.is_distributed:
        return
    if env.world_size is None:
        rep.add("warning", "launch", f"the world size is unknown ({env.provenance.get('world_size', 'not revealed')}).",
                "run with a launcher that gives it (MPICH: drop -pmi-port) or set WORLD_SIZE.")
    multi = env.num_nodes is None or env.num_nodes > 1
    if env.master_addr is None:
        from ..core.export import missing_message

        rep.add("error", "launch", f"rank 0's address is unknown: {env.launcher} does not reveal it "
                "across nodes.", split_fix(missing_message(env, ["MASTER_ADDR"]))[1])
    elif multi and env.num_nodes is not None and env.master_addr.startswith("127."):
        rep.add("error", "launch", f"master_addr={env.master_addr} is a loopback address but the "
                f"job spans {env.num_nodes} nodes ({env.provenance.get('master_addr')}).",
                "set MASTER_ADDR to rank 0's host name or address, reachable from every node.")
    if kind_of(env.provenance.get("master_port")) == DEFAULT:
        rep.add("warning", "launch", f"master_port={env.master_port} is torch's default: no job id "
                "to derive a port from, so two such jobs on one machine collide.",
                "export MASTER_PORT=<a free port> per job (the same on every rank).")
    if env.master_addr is not None:
        try:
            env.export({})
        except DistEnvError as exc:
            problem, fix = split_fix(str(exc))
            rep.add("error", "launch", f"the torch variables cannot be exported: {problem}",
                    fix or "set the missing variables in the job script (distenv show --explain "
                    "shows what is known)")


def _check_map(rep: Report, out: "dict[str, Any]", env: DistEnv, discover: bool) -> None:
    """out["map"]: the placement map (`distenv.nodemap`), in rank 0's report only. With
    `discover` every rank first completes the placement from the launcher's service (PMI-1 is
    collective: no rank may skip it)."""
    from .. import nodemap

    try:
        placed = nodemap.collect(env) if discover else env
        if not nodemap.prints(placed):
            return
        found = nodemap.build(placed).to_dict()
    except DistEnvError as exc:
        problem, fix = split_fix(redact_text(" ".join(str(exc).split())))
        rep.add("error", "map", problem, fix or "distenv show --explain shows where each field "
                "came from")
        return
    for node in found["nodes"]:
        if node["host"] is not None:
            node["host"] = redact_text(node["host"])
    for key in ("master_addr", "placement"):
        if found[key] is not None:
            found[key] = redact_text(found[key])
    found["unknown"] = [redact_text(u) for u in found["unknown"]]
    out["map"] = found
    if env.master_addr is None and placed.master_addr is not None:
        rep.add("info", "map", f"the launcher's service names rank 0's host, {placed.master_addr} "
                f"({placed.provenance.get('master_addr')}): distenv's adapters, `distenv run` and "
                "DISTENV_AUTO=1 ask it and find the master there.",
                f"a framework set up without distenv needs MASTER_ADDR={placed.master_addr} "
                "(the launch finding above)")


def _check_gpus(rep: Report, env: DistEnv, environ: "Mapping[str, str]") -> "dict[str, Any]":
    from ..core.gpus import visible_gpus

    count, why = visible_gpus(environ)
    local = env.nproc_per_node if env.launch == PER_NODE else env.local_world_size
    info = {"visible": count, "why": why, "local_processes": local}
    if count == 0:
        rep.add("info", "gpus", f"{why}: workers run on CPU; torch uses gloo.")
        return info
    if local is None:
        rep.add("info", "gpus", f"{count} GPU(s) visible ({why}); the number of processes on "
                "this node is unknown.")
        return info
    narrowed = any(var in environ for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                                 "ROCR_VISIBLE_DEVICES"))
    per_process = env.launch != PER_NODE
    if count == local or (per_process and count == 1 and narrowed and local > 1):
        if count == local:
            rep.add("ok", "gpus", f"{count} GPU(s) visible ({why}) for {local} process(es) on this node.")
        else:
            rep.add("info", "gpus", f"this process sees 1 GPU ({why}) and {local} processes run on "
                    "this node: right if the scheduler gives each task its own GPU; if they all "
                    "see the same one, NCCL fails on the duplicate GPU.")
    elif count < local:
        rep.add("error", "gpus", f"{local} process(es) on this node but only {count} GPU(s) visible "
                f"({why}): processes would share a GPU (NCCL refuses duplicate GPUs).",
                f"start {count} process(es) per node (--nproc-per-node {count}), or use gloo on CPU.")
    else:
        rep.add("warning", "gpus", f"{count} GPU(s) visible ({why}) but {local} process(es) on this "
                f"node: {count - local} GPU(s) idle.",
                f"start {count} process(es) per node (distenv run --nproc-per-node {count}, "
                "srun --ntasks-per-node, mpirun -np), or narrow CUDA_VISIBLE_DEVICES.")
    return info


def _check_cpu(rep: Report, env: "DistEnv | None", environ: "Mapping[str, str]") -> "dict[str, Any]":
    total = os.cpu_count() or 1
    from .. import knobs

    bound = knobs.bound_cores() or total
    per_node = env is not None and env.launch == PER_NODE
    local = ((env.nproc_per_node if per_node else env.local_world_size) if env else None) or 1
    omp_raw = environ.get("OMP_NUM_THREADS")
    omp = _int(omp_raw) if omp_raw is not None else None
    info = {"cores": total, "cores_usable": bound, "local_processes": local,
            "OMP_NUM_THREADS": omp_raw}
    share = max(1, total // local)
    if omp_raw is not None and (omp is None or omp < 1):
        rep.add("warning", "cpu", f"OMP_NUM_THREADS={omp_raw!r} is not a positive number.",
                f"export OMP_NUM_THREADS={share}")
        return info
    if per_node and bound < local and bound < total:
        rep.add("warning", "cpu", f"this process is bound to {bound} of {total} cores and its "
                f"{local} workers inherit the binding: they share {bound} core(s).",
                "let the launcher bind nothing (mpirun --bind-to none, or --map-by "
                "ppr:1:node:pe=<cores>; srun --cpus-per-task=<cores>).")
    threads = omp if omp is not None else bound
    over: "tuple[str, str] | None"  # (problem, fix) when threads outnumber the cores
    if bound < total:
        # Bound by the launcher: each process has its own cores (as far as we can tell).
        over = None if threads <= bound else (
            f"OMP_NUM_THREADS={omp} threads but this process may use {bound} core(s) (CPU "
            "affinity, set by the launcher): threads compete.", f"export OMP_NUM_THREADS={bound}")
        fine = f"{threads} thread(s) on {bound} core(s) bound to this process."
    else:
        demand = threads * local
        why = (f"OMP_NUM_THREADS={omp}" if omp is not None
               else "OMP_NUM_THREADS unset: torch and OpenMP take every core in each process")
        over = None if demand <= total else (
            f"{local} process(es) x {threads} thread(s) = {demand} threads on {total} core(s) "
            f"({why}): oversubscribed, training slows down.",
            f"export OMP_NUM_THREADS={share} (cores / local processes)"
            f"{_passed_on(env, 'OMP_NUM_THREADS', share)}")
        fine = f"{local} process(es) x {threads} thread(s) on {total} core(s)."
    if over is not None:
        rep.add("warning", "cpu", *over)
    else:
        rep.add("ok", "cpu", fine)
    return info


def _passed_on(env: "DistEnv | None", name: str, value: object) -> str:
    """How a variable exported in the job script reaches every rank, for this launcher."""
    from ..sources import find

    entry = find(env.launcher) if env is not None and env.launcher else None
    passed = entry.load().passing.fill(name, value) if entry is not None else ""
    return f", and pass it to every rank ({passed})" if passed else ""
