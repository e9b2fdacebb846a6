#!/usr/bin/env python
"""Per-rank output files for a launcher that starts ``python -u SCRIPT ARGS`` itself (legacy
``python -m torch.distributed.launch`` without ``--use-env`` cannot run another program).

    python -m torch.distributed.launch ... per_rank.py OUT_DIR SCRIPT ARGS...

Sends this rank's stdout and stderr to ``OUT_DIR/<host>.XXXXXX.out`` / ``.err`` (the files
tests/integration/harness.py gathers), then execs ``python SCRIPT ARGS --local-rank=N``: the
launcher puts its ``--local-rank=N`` first, before OUT_DIR; it is handed on to SCRIPT.
"""
import os
import socket
import sys
import tempfile

argv = sys.argv[1:]
ours = [a for a in argv if a.split("=")[0] in ("--local-rank", "--local_rank")]
out_dir, script, *args = [a for a in argv if a not in ours]
fd, path = tempfile.mkstemp(prefix=socket.gethostname() + ".", suffix=".out", dir=out_dir)
os.dup2(fd, 1)
os.dup2(os.open(path[:-4] + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
os.execv(sys.executable, [sys.executable, script, *args, *ours])
