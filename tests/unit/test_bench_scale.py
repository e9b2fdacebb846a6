"""benchmarks/bench_scale.py in CI (issue 32 item 6): placement and the hand-off at 50 000 ranks,
PMIx and PMI-1 at 10 000 (`--quick`); its pre-flight part is tests/unit/test_preflight_scale.py's
(the same benchmark at 1 000 peers). Every goal the run prints must be met."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_scale_quick_meets_every_goal():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_scale.py"),
                        "--quick", "--skip", "preflight"], capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items() if not k.startswith("DISTENV_")})
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    m = re.fullmatch(r"scale: (\d+) of (\d+) goals met", last)
    assert m, p.stdout[-3000:] + p.stderr[-3000:]
    met, total = int(m.group(1)), int(m.group(2))
    assert total >= 9 and met == total, p.stdout[-4000:]
    assert p.returncode == 0
