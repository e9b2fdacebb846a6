"""distenv.torch and distenv.lightning under mpirun vs torchrun, in one run, printed as ratios
against the goals of issue 4.

    python benchmarks/bench_torch.py [--runs 3] [--nproc 2] [--epochs 20]

1. Time to the first all_reduce, from the launcher's start to the moment every rank has
   finished one: ``mpirun -np N python -c "distenv.torch.init_process_group(); all_reduce"``
   vs ``torchrun --standalone --nproc-per-node N`` with torch's own
   ``init_process_group("gloo")`` (goal: ratio <= 1.0).
2. DDP training throughput of examples/pytorch_ddp.py (unchanged) under both launchers:
   steps/s reported by rank 0 (goal: ratio >= 0.98).
3. Lightning Trainer start: examples/lightning_trainer.py (unchanged, DistenvEnvironment)
   under both, from the launcher's start to the first training step of every rank
   (reported; skipped when .venvs/lightning or $DISTENV_PY_LIGHTNING is missing).

Runs alternate between the launchers and the median of --runs is taken, so load from other
processes on the machine hits both sides alike. Launchers come from
integrations/launchers.py (Open MPI 4 from apt; torchrun from the project venv).
Exit status is 0 either way: this reports, the tests decide.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from integrations import launchers  # noqa: E402

TORCH_PY = os.environ.get("DISTENV_PY_TORCH") or os.path.join(ROOT, ".venv", "bin", "python")
LIGHTNING_PY = os.environ.get("DISTENV_PY_LIGHTNING") or os.path.join(ROOT, ".venvs", "lightning",
                                                                     "bin", "python")
DDP = os.path.join(ROOT, "examples", "pytorch_ddp.py")
TRAINER = os.path.join(ROOT, "examples", "lightning_trainer.py")

# Each rank writes one line in one write() (ranks share the launcher's pipe).
DONE = "import sys; sys.stdout.write('{\"t_done\": %r}\\n' % time.time())"
FIRST_DISTENV = ("import time, torch, distenv.torch; distenv.torch.init_process_group(); "
                 "torch.distributed.all_reduce(torch.ones(1)); " + DONE)
FIRST_TORCH = ("import time, torch, torch.distributed as d; d.init_process_group('gloo'); "
               "d.all_reduce(torch.ones(1)); " + DONE)

STRIP_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "TORCHELASTIC_", "HYDRA_", "PET_")
STRIP = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "NODE_RANK", "GROUP_RANK", "DISTENV_NPROC_PER_NODE", "DISTENV_LAUNCHER"}


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in STRIP and not k.startswith(STRIP_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch(which: str, n: int, cmd: list, timeout: int = 600) -> "tuple[float, list]":
    """Run cmd as n ranks; return (launcher start time, JSON objects printed)."""
    entry = launchers.get("openmpi4" if which == "mpirun" else "torchrun")
    argv = ["timeout", "-k", "5", str(timeout), *entry.argv(n), *cmd]
    env = {**clean_env(), **entry.env()}
    t0 = time.time()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT,
                       stdin=subprocess.DEVNULL)
    records, dec, i = [], json.JSONDecoder(), 0
    while (i := p.stdout.find("{", i)) >= 0:  # ranks sharing a pipe may glue their lines
        try:
            obj, i = dec.raw_decode(p.stdout, i)
            records.append(obj)
        except ValueError:
            i += 1
    if p.returncode != 0 or not records:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return t0, records


def measure(label, runs, one):
    """Alternate mpirun/torchrun `runs` times; one(which) -> number. Returns medians."""
    values = {"mpirun": [], "torchrun": []}
    for i in range(runs):
        for which in (("mpirun", "torchrun") if i % 2 == 0 else ("torchrun", "mpirun")):
            values[which].append(one(which))
            print(f"  {label:28} {which:8} run {i + 1}: {values[which][-1]:.3f}", file=sys.stderr)
    return {k: statistics.median(v) for k, v in values.items()}, values


def first_allreduce(n):
    def one(which):
        code = FIRST_DISTENV if which == "mpirun" else FIRST_TORCH
        t0, recs = launch(which, n, [TORCH_PY, "-c", code])
        assert len(recs) == n, recs
        return max(r["t_done"] for r in recs) - t0
    return one


def ddp_steps(n, epochs):
    def one(which):
        _, recs = launch(which, n, [TORCH_PY, DDP, "--epochs", str(epochs)])
        (rec,) = [r for r in recs if r.get("example") == "pytorch_ddp"]
        assert rec["world_size"] == n and len(set(rec["checksums"])) == 1, rec
        return rec["steps_per_s"]
    return one


def trainer_start(n):
    def one(which):
        t0, recs = launch(which, n, [LIGHTNING_PY, TRAINER, "--epochs", "1"])
        (rec,) = [r for r in recs if r.get("example") == "lightning_trainer"]
        assert rec["world_size"] == n, rec
        return rec["t_first_step"] - t0
    return one


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=20, help="DDP example epochs (16 steps each)")
    ap.add_argument("--only", choices=("allreduce", "ddp", "lightning"), action="append",
                    help="run only these measurements (default: all)")
    args = ap.parse_args()
    for name in ("openmpi4", "torchrun"):
        if not launchers.get(name).available():
            sys.exit(f"{name} is not installed: bash integrations/setup.sh")

    only = set(args.only or ("allreduce", "ddp", "lightning"))
    rows = []
    if "allreduce" in only:
        med, _ = measure("first all_reduce (s)", args.runs, first_allreduce(args.nproc))
        rows.append(("time to first all_reduce", med, med["mpirun"] / med["torchrun"], "<= 1.0",
                     med["mpirun"] / med["torchrun"] <= 1.0, "s"))
    if "ddp" in only:
        med, _ = measure("DDP steps/s", args.runs, ddp_steps(args.nproc, args.epochs))
        rows.append(("DDP example steps/s", med, med["mpirun"] / med["torchrun"], ">= 0.98",
                     med["mpirun"] / med["torchrun"] >= 0.98, "steps/s"))
    if "lightning" not in only:
        pass
    elif os.access(LIGHTNING_PY, os.X_OK):
        med, _ = measure("Trainer start (s)", args.runs, trainer_start(args.nproc))
        rows.append(("Lightning Trainer start", med, med["mpirun"] / med["torchrun"], "report",
                     None, "s"))
    else:
        print(f"Lightning skipped: no {LIGHTNING_PY} (bash integrations/frameworks/lightning.sh)")

    print(f"\ndistenv.torch / distenv.lightning: {args.nproc} ranks on one node, median of "
          f"{args.runs} alternating runs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"{'metric':26} {'mpirun+distenv':>16} {'torchrun':>16} {'ratio':>6}  goal")
    for name, med, ratio, goal, ok, unit in rows:
        verdict = "" if ok is None else (" (met)" if ok else " (NOT met)")
        mine, theirs = f"{med['mpirun']:.2f} {unit}", f"{med['torchrun']:.2f} {unit}"
        print(f"{name:26} {mine:>16} {theirs:>16} {ratio:>6.2f}  {goal}{verdict}")


if __name__ == "__main__":
    main()
