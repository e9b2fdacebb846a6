"""Ctrl-C under MPICH 5's mpiexec can end with "YOUR APPLICATION TERMINATED WITH THE EXIT STRING:
Segmentation fault (signal 11)" where no process segfaulted (issue 42, item 2; docs/launchers.md,
Hydra). mpiexec ORs the raw wait statuses of every rank (``exit_status |= proxy->exit_status[i]``
in src/pm/hydra/mpiexec/mpiexec.c): one rank ended by the SIGINT (2) and another by Hydra's
cleanup SIGKILL (9) read as 11. A Ctrl-C'd Python rank unwinds its KeyboardInterrupt and may be
the one Hydra kills: seen with plain ``python -c "import time; time.sleep(100)"`` ranks (2 of 8,
4 of 10), with distenv's examples alike. Not distenv's, torch's or gloo's; this pins the cause
without Python or timing."""
from __future__ import annotations

import subprocess

from harness import MPICH5, layout

#: Rank 0 ends by SIGINT at once, rank 1 by SIGKILL a second later: no process faults.
RANKS = 'if [ "$PMI_RANK" = 0 ]; then kill -INT $$; else sleep 1; kill -KILL $$; fi'


def test_sigint_and_sigkill_read_as_a_segmentation_fault(need, tmp_path):
    need(layout("mpich5", "np4"))
    for _ in range(3):
        p = subprocess.run([MPICH5, "-print-all-exitcodes", "-n", "2", "sh", "-c", RANKS],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
        out = p.stdout + p.stderr
        # Hydra's own race, seen once in CI: its proxy's "Assertion failed ... assert (!closed)"
        # when the killed rank's socket closes under it; nothing of what is tested here ran.
        if "assert (!closed) failed" not in out:
            break
    assert "Exit codes: [" in out and "] 2,9" in out, out  # SIGINT and SIGKILL, nothing else
    assert "EXIT STRING: Segmentation fault (signal 11)" in out, out
    assert p.returncode == 11
