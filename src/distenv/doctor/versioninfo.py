"""The doctor's versions: distenv, Python, the frameworks installed for this interpreter (from
their metadata: nothing is imported) and the launcher's own (its variables, its Python
distribution, or its ``--version``: the one process the doctor starts)."""

from __future__ import annotations

import os

from . import system

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ..description import DistEnv


#: Distributions reported when installed for this interpreter, in this order.
PACKAGES = ("torch", "lightning", "pytorch-lightning", "transformers", "accelerate", "deepspeed",
            "tensorflow", "tf-keras", "keras", "horovod", "jax", "jaxlib", "mpi4py")
#: launcher -> (command whose --version to run, names of its binaries and daemons that may be
#: an ancestor of a rank). A daemon (orted, hydra_pmi_proxy) stands for the command next to it.
LAUNCHER_COMMANDS = {
    "openmpi": ("mpirun", ("mpirun", "mpiexec", "orterun", "prterun", "prte", "orted", "prted")),
    "mpich": ("mpiexec", ("mpiexec", "mpirun", "mpiexec.hydra", "hydra_pmi_proxy")),
    "intelmpi": ("mpiexec.hydra", ("mpiexec.hydra", "mpiexec", "mpirun", "hydra_pmi_proxy",
                                   "hydra_bstrap_proxy")),
    "mvapich2": ("mpiexec", ("mpiexec", "mpirun", "mpirun_rsh", "mpiexec.hydra", "hydra_pmi_proxy")),
    "pals": ("mpiexec", ("mpiexec",)),
    "slurm": ("srun", ("srun",)),
    "flux": ("flux", ()),
    "lsf": ("jsrun", ("jsrun",)),
}
#: launcher -> the distribution whose version is the launcher's (a Python launcher).
LAUNCHER_PACKAGES = {"torchrun": "torch", "deepspeed": "deepspeed", "horovodrun": "horovod"}
#: Variables that would make a launcher's --version think it runs inside a job.
_JOB_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "PRTE_", "HYDRA_", "I_MPI_HYDRA", "MPI_LOCAL", "ORTE_")
VERSION_TIMEOUT = 3.0


def _distribution_versions() -> "dict[str, str]":
    from importlib import metadata

    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # a broken dist-info must not break the doctor
            found[name] = "unknown (unreadable metadata)"
    return found


def _launcher_command(launcher: str) -> "tuple[str, str] | None":
    """(argv0, how it was found) of the launcher's command, or None."""
    import shutil

    command, names = LAUNCHER_COMMANDS[launcher]
    for pid, exe, comm in system._ancestors():
        base = os.path.basename(exe) if exe else comm
        if base in names or comm in names:
            if exe and base in ("orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy"):
                # A daemon: the launcher's command is installed next to it.
                sibling = os.path.join(os.path.dirname(exe), command)
                if os.path.exists(sibling):
                    return sibling, f"next to {base}, pid {pid}, an ancestor of this process"
                continue
            if exe:
                return exe, f"pid {pid}, the ancestor of this process that launched it"
    found = shutil.which(command)
    if found:
        return found, f"{command} on PATH: this process's launcher is not among its ancestors"
    return None


def _first_version_line(text: str) -> "str | None":
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:  # MPICH's Hydra: "HYDRA build details:" then "Version: 4.0.2"
        if line.startswith("Version:"):
            return f"Hydra {line.split(':', 1)[1].strip()}"
    return lines[0] if lines else None


def launcher_version(launcher: str, environ: "Mapping[str, str]") -> "dict[str, str | None]":
    """{"version", "source"}: the launcher's own version, where it says it."""
    if launcher == "openmpi" and environ.get("OMPI_VERSION"):
        return {"version": f"Open MPI {environ['OMPI_VERSION']}", "source": "OMPI_VERSION"}
    if launcher in LAUNCHER_PACKAGES:
        from importlib import metadata

        dist = LAUNCHER_PACKAGES[launcher]
        try:
            return {"version": f"{dist} {metadata.version(dist)}",
                    "source": f"{dist}'s metadata in this interpreter"}
        except metadata.PackageNotFoundError:
            return {"version": None, "source": f"{dist} is not installed for this interpreter"}
    if launcher not in LAUNCHER_COMMANDS:
        return {"version": None, "source": f"{launcher} has no version command"}
    found = _launcher_command(launcher)
    if found is None:
        return {"version": None,
                "source": f"{LAUNCHER_COMMANDS[launcher][0]} is neither an ancestor nor on PATH"}
    command, how = found
    import subprocess

    clean = {k: v for k, v in environ.items() if not k.startswith(_JOB_PREFIXES)}
    try:
        p = subprocess.run([command, "--version"], env=clean, capture_output=True, text=True,
                           errors="replace", timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"version": None, "source": f"`{command} --version` gave no answer within "
                f"{VERSION_TIMEOUT:g} s; {how}"}
    except OSError as exc:
        return {"version": None, "source": f"`{command} --version` failed: {exc.strerror}; {how}"}
    line = _first_version_line(p.stdout) if p.returncode == 0 else None
    if line is None:
        why = _first_version_line(p.stderr) or f"exit status {p.returncode}"
        return {"version": None, "source": f"`{command} --version` failed: {why}; {how}"}
    return {"version": line, "source": f"`{command} --version`; {how}"}


def versions(env: "DistEnv | None", environ: "Mapping[str, str] | None" = None) -> "dict[str, Any]":
    """distenv, Python, installed frameworks (metadata only: no framework is imported) and
    the launcher's own version."""
    import sys

    from .. import __version__

    environ = os.environ if environ is None else environ
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # distenv/, not doctor/
    out: "dict[str, Any]" = {"distenv": f"{__version__} ({package})",
                             "python": f"{sys.version.split()[0]} ({sys.executable})",
                             "packages": _distribution_versions(), "launcher": None}
    if env is not None and env.launcher != "none":
        out["launcher"] = {"name": env.launcher, **launcher_version(env.launcher, environ)}
    return out
