#!/usr/bin/env python3
"""Run a daemon in the foreground under a child subreaper and reap what it leaves behind.

slurmd forks one slurmstepd per job step and lets it re-parent to the nearest subreaper,
normally PID 1. Where PID 1 does not reap orphans (some sandboxes and containers, like
the one this project's CI runs in), every step then stays a <defunct> zombie. Usage:

    reaper.py PIDFILE -- slurmd -D -f slurm.conf

marks this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER), starts the command
(which must stay in the foreground), writes the command's pid to PIDFILE, forwards
SIGTERM/SIGINT to it, reaps every orphan handed to it, and exits with the command's exit
code once no descendant is left.
"""
import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write(__doc__)
        return 2
    pidfile, cmd = sys.argv[1], sys.argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("reaper: PR_SET_CHILD_SUBREAPER failed; zombies may remain", file=sys.stderr)
    child = os.fork()
    if child == 0:
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{child}\n")
    os.replace(pidfile + ".tmp", pidfile)

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    rc = 0
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return rc
        except InterruptedError:
            continue
        if pid == child:
            rc = os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
