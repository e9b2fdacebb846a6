"""Time distenv.core.hostlist.expand_hostlist against python-hostlist.

    python benchmarks/bench_hostlist.py [--out DIR] [--repeat N] [--check]

For 10 to 100,000 nodes and three shapes of list, prints the median time of
each library, the ratio python-hostlist / distenv, and whether distenv meets
the goal (every shape of 10,000 nodes expanded within 10 ms, and faster than
python-hostlist); with --check it exits 1 if not (timings on a loaded machine
can miss it, so that is not the default). Draws DIR/hostlist.png (default
benchmarks/out/). Without python-hostlist it times distenv alone; without
matplotlib it skips the picture; both say so and exit 0.

python-hostlist is called with allow_duplicates=True, which gives the same
result as distenv and is less work than its default (which also removes
duplicates), so the ratio is if anything on its side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    from distenv.core.hostlist import expand_hostlist
except ImportError:  # a checkout without the package installed
    sys.path.insert(0, str(ROOT / "src"))
    from distenv.core.hostlist import expand_hostlist

try:
    import hostlist as python_hostlist
except ImportError:
    python_hostlist = None

NODE_COUNTS = (10, 100, 1_000, 10_000, 100_000)
GOAL_NODES = 10_000
GOAL_SECONDS = 0.010


def contiguous(n: int) -> str:
    """One range, as for a whole partition: node[000001-010000]."""
    return f"node[{1:06d}-{n:06d}]"


def fragmented(n: int) -> str:
    """A busy cluster's allocation: racks of 64 nodes, every 7th node taken by
    someone else, so many short ranges under many prefixes, plus a login node."""
    racks: dict[int, list[int]] = {}
    i = 0
    got = 1  # the login node
    while got < n:
        i += 1
        if i % 7 == 0:
            continue
        racks.setdefault(i // 64, []).append(i % 64)
        got += 1
    items = []
    for rack, nodes in racks.items():
        runs = []
        start = prev = nodes[0]
        for x in nodes[1:] + [None]:
            if x is not None and x == prev + 1:
                prev = x
                continue
            runs.append(f"{start:02d}" if start == prev else f"{start:02d}-{prev:02d}")
            if x is not None:
                start = prev = x
        items.append(f"r{rack:04d}n[{','.join(runs)}]")
    return ",".join(items + ["login01"])


def two_groups(n: int) -> str:
    """A cartesian name: rack[001-100]-node[001-100] (100 nodes a rack)."""
    per = min(n, 100)
    return f"rack[{1:03d}-{n // per:03d}]-node[{1:03d}-{per:03d}]"


SHAPES = {"contiguous": contiguous, "fragmented": fragmented, "two groups": two_groups}


def median_seconds(func, text: str, repeat: int) -> float:
    timer = timeit.Timer(lambda: func(text))
    number, _ = timer.autorange()  # enough calls for about 0.2 s
    return statistics.median(timer.repeat(repeat=repeat, number=number)) / number


def theirs(text: str) -> list[str]:
    return python_hostlist.expand_hostlist(text, allow_duplicates=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out",
                        help="folder for hostlist.png (default: benchmarks/out)")
    parser.add_argument("--repeat", type=int, default=7,
                        help="timing runs per case; the median is reported (default 7)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the goal at 10,000 nodes is missed")
    args = parser.parse_args(argv)

    load = ""
    if hasattr(os, "getloadavg"):
        load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    print(f"Python {sys.version.split()[0]}; median of {args.repeat} runs per case{load}")
    if python_hostlist is None:
        print("python-hostlist is not installed (pip install python-hostlist): "
              "timing distenv alone, no comparison.")
    else:
        print(f"python-hostlist {python_hostlist.__version__}, "
              "called with allow_duplicates=True")
    print()
    print(f"{'shape':<11} {'nodes':>7} {'chars':>7} {'distenv ms':>11} "
          f"{'python-hostlist ms':>19} {'ratio':>7}")

    results: dict[str, list[tuple[int, float, float | None]]] = {}
    failures = []
    for shape, make in SHAPES.items():
        for n in NODE_COUNTS:
            text = make(n)
            ours = expand_hostlist(text)
            if len(ours) != n:
                raise SystemExit(f"bug: {shape} list of {n} nodes expanded to {len(ours)}")
            t_ours = median_seconds(expand_hostlist, text, args.repeat)
            t_theirs = None
            if python_hostlist is not None:
                if theirs(text) != ours:
                    raise SystemExit(f"results differ for {shape} with {n} nodes: {text[:80]}")
                t_theirs = median_seconds(theirs, text, args.repeat)
            results.setdefault(shape, []).append((n, t_ours, t_theirs))
            ratio = f"{t_theirs / t_ours:6.1f}x" if t_theirs else "      -"
            theirs_ms = f"{t_theirs * 1e3:19.3f}" if t_theirs else f"{'-':>19}"
            print(f"{shape:<11} {n:>7,} {len(text):>7,} {t_ours * 1e3:11.3f} {theirs_ms} {ratio}")
            if n == GOAL_NODES:
                if t_ours > GOAL_SECONDS:
                    failures.append(f"{shape}: {t_ours * 1e3:.2f} ms > {GOAL_SECONDS * 1e3:g} ms")
                if t_theirs is not None and t_ours >= t_theirs:
                    failures.append(f"{shape}: not faster than python-hostlist")
    print()
    if failures:
        print(f"FAIL: goal at {GOAL_NODES:,} nodes (<= {GOAL_SECONDS * 1e3:g} ms"
              f"{', faster than python-hostlist' if python_hostlist else ''}): "
              + "; ".join(failures))
    else:
        print(f"PASS: every shape of {GOAL_NODES:,} nodes expands in <= "
              f"{GOAL_SECONDS * 1e3:g} ms"
              + (" and faster than python-hostlist" if python_hostlist else ""))

    plot(results, args.out)
    return 1 if failures and args.check else 0


def plot(results, out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no picture drawn.")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    colors = ("tab:blue", "tab:orange", "tab:green")
    for color, (shape, rows) in zip(colors, results.items()):
        nodes = [r[0] for r in rows]
        ax.plot(nodes, [r[1] * 1e3 for r in rows], "o-", color=color, lw=2,
                label=f"distenv, {shape}")
        if all(r[2] is not None for r in rows):
            ax.plot(nodes, [r[2] * 1e3 for r in rows], "s--", color=color, lw=1.5,
                    alpha=0.8, label=f"python-hostlist, {shape}")
    ax.axhline(GOAL_SECONDS * 1e3, color="red", lw=1, ls=":")
    ax.axvline(GOAL_NODES, color="red", lw=1, ls=":")
    ax.annotate(f"goal: {GOAL_NODES:,} nodes in {GOAL_SECONDS * 1e3:g} ms",
                (GOAL_NODES, GOAL_SECONDS * 1e3), textcoords="offset points",
                xytext=(-190, 8), color="red")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes in the list")
    ax.set_ylabel("median time to expand (ms)")
    ax.set_title("Expanding a SLURM host list: distenv vs python-hostlist")
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.15)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "hostlist.png"
    fig.savefig(path)
    plt.close(fig)
    print(f"picture: {path}")


if __name__ == "__main__":
    sys.exit(main())
