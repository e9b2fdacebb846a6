"""Machine instructions per in-process `resolve()` call, counted by valgrind (callgrind).

    python benchmarks/count_instructions.py [--calls 1000] [--ref GIT_REF]

Wall-clock figures (bench_core.py) move with whatever else runs on the machine; instruction
counts do not (PYTHONHASHSEED is fixed, since string hashes change dict probing). Each count
is (instructions of a run with N+1 calls - of a run with 1 call) / N, so interpreter start
and imports cancel out. With ``--ref`` the same is counted for that git revision (checked out
into a temporary worktree) and the ratio printed: how a change moved the cost. Needs valgrind
(apt install valgrind); exits 0 with a message when it is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from distenv import resolve  # first: bench_core puts this checkout's src first on sys.path
import distenv
assert distenv.__file__.startswith(sys.argv[1]), distenv.__file__
sys.path.insert(0, sys.argv[2])
from bench_core import ENVS
env = ENVS[sys.argv[3]]
for _ in range(int(sys.argv[4])):
    resolve(env)
"""


def instructions(src: str, name: str, calls: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, "-c", CHILD, src, HERE, name, str(calls)]
    env = dict(os.environ, PYTHONHASHSEED="0")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    found = re.search(r"Collected : (\d+)", p.stderr)
    if p.returncode != 0 or not found:
        raise SystemExit(f"valgrind failed ({p.returncode}): {p.stderr[-2000:]}")
    return int(found.group(1))


def per_call(src: str, name: str, calls: int) -> float:
    return (instructions(src, name, calls + 1) - instructions(src, name, 1)) / calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--ref", help="also count this git revision and print the ratio")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt install valgrind): nothing counted")
        return 0
    sys.path.insert(0, HERE)
    from bench_core import ENVS

    trees = [("this tree", os.path.join(ROOT, "src"))]
    tmp = None
    if args.ref:
        tmp = tempfile.mkdtemp(prefix="distenv-ref-")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", tmp, args.ref], check=True)
        trees.append((args.ref, os.path.join(tmp, "src")))
    try:
        print(f"instructions per resolve() call (callgrind, {args.calls} calls):")
        for name in ENVS:
            counts = [per_call(src, name, args.calls) for _, src in trees]
            line = f"  {name:<16} {counts[0]:>9,.0f}"
            if len(counts) == 2:
                line += f"   {args.ref}: {counts[1]:>9,.0f}   ratio {counts[0] / counts[1]:.2f}"
            print(line)
    finally:
        if tmp:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tmp], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
