"""Core cost, measured in one run and printed as ratios against the goals (issue 2).

    python benchmarks/bench_core.py [--runs 40] [--out DIR]

1. Whole process: `python -c "import distenv; distenv.resolve()"` vs `python -c pass`,
   interleaved runs, median difference (goal: <= 5 ms added).
2. In-process `resolve()` on realistic launcher environments (goal: <= 50 us).
3. SLURM host-list expansion of 10 000 nodes vs python-hostlist (goal: <= 10 ms); the full
   curve and its PNG come from bench_hostlist.py, run at the end.
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
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))

ENVS = {
    "single process": {},
    "Open MPI 2x2": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                     "OMPI_MCA_orte_num_nodes": "2",
                     "OMPI_MCA_orte_hnp_uri": "2197356545.0;tcp://10.0.0.1,10.1.0.1:41231",
                     "OMPI_MCA_ess_base_jobid": "2197356545"},
    "srun -N2 -n4": {"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
                     "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1",
                     "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2",
                     "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
    "torchrun": {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                 "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
}


def whole_process(runs: int) -> "tuple[float, float]":
    # An installed wheel carries compiled .pyc files; an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile every module on every start. Compile first.
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "src", "distenv"), quiet=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTENV_",))}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    cmd_base = [sys.executable, "-c", "pass"]
    cmd_ours = [sys.executable, "-c", "import distenv; distenv.resolve()"]
    for cmd in (cmd_base, cmd_ours):  # warm the page cache and the .pyc files
        subprocess.run(cmd, env=env, check=True)
    base, ours = [], []
    for _ in range(runs):
        for cmd, out in ((cmd_base, base), (cmd_ours, ours)):
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True)
            out.append(time.perf_counter() - t0)
    return statistics.median(base) * 1e3, statistics.median(ours) * 1e3


def _forget() -> None:
    """Empty the memos of pure functions resolve() keeps (expanded SLURM lists, where a
    version still has them), so a call pays what a process's first call pays."""
    from distenv.sources import slurm

    memo = getattr(slurm, "_MEMO", None)
    if memo is not None:
        memo.clear()


def in_process() -> "dict[str, tuple[float, float]]":
    """name -> (us per call again and again, as a process calls it; us for a first call)."""
    from distenv import resolve

    out = {}
    number = 2000
    for name, env in ENVS.items():
        resolve(env)  # import the source modules first
        again = min(timeit.repeat(lambda: resolve(env), number=number, repeat=5))
        empty = min(timeit.repeat(_forget, number=number, repeat=5))

        def first():
            _forget()
            resolve(env)

        cold = min(timeit.repeat(first, number=number, repeat=5)) - empty
        out[name] = (again / number * 1e6, cold / number * 1e6)
    return out


def hostlist_10k() -> "tuple[float, float | None]":
    from distenv.core.hostlist import expand_hostlist

    text = "node[00001-10000]"
    ours = min(timeit.repeat(lambda: expand_hostlist(text), number=20, repeat=5)) / 20 * 1e3
    try:
        import hostlist
    except ImportError:
        return ours, None
    theirs = min(timeit.repeat(lambda: hostlist.expand_hostlist(text), number=5, repeat=3)) / 5 * 1e3
    return ours, theirs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--json", action="store_true", help="also print a JSON summary line")
    args = parser.parse_args(argv)

    base, ours = whole_process(args.runs)
    added = ours - base
    print(f"whole process (median of {args.runs}):  python -c pass {base:.1f} ms, "
          f"import distenv + resolve() {ours:.1f} ms")
    print(f"  added {added:.2f} ms  ratio {ours / base:.3f}  goal <= 5 ms: {'PASS' if added <= 5 else 'FAIL'}")
    print("in-process resolve() (best of 5 x 2000 calls; 'first' = with resolve()'s memos emptied):")
    micro = in_process()
    for name, (us, cold) in micro.items():
        print(f"  {name:<16} {us:7.1f} us   vs goal 50 us: ratio {us / 50:.2f}  {'PASS' if us <= 50 else 'FAIL'}"
              f"   first call {cold:5.1f} us (ratio {cold / 50:.2f})")
    ours_hl, theirs_hl = hostlist_10k()
    line = f"expand 10 000-node SLURM list: distenv {ours_hl:.2f} ms"
    if theirs_hl is not None:
        line += f", python-hostlist {theirs_hl:.2f} ms, ratio {theirs_hl / ours_hl:.1f}x faster"
    print(line + f"  goal <= 10 ms: {'PASS' if ours_hl <= 10 else 'FAIL'}")
    if args.json:
        print(json.dumps({"added_ms": added, "resolve_us": {k: v[0] for k, v in micro.items()},
                          "resolve_first_call_us": {k: v[1] for k, v in micro.items()}, "hostlist_10k_ms": ours_hl,
                          "python_hostlist_10k_ms": theirs_hl}))
    # The full expansion curve and its PNG.
    bench = os.path.join(HERE, "bench_hostlist.py")
    if os.path.exists(bench):
        subprocess.run([sys.executable, bench, "--out", args.out], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
