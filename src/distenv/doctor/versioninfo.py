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

    from ..core.description import DistEnv


#: Distributions reported when installed for this interpreter, in this order.
PACKAGES = ("torch", "lightning", "pytorch-lightning", "transformers", "accelerate", "deepspeed",
            "tensorflow", "tf-keras", "keras", "horovod", "jax", "jaxlib", "mpi4py")
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


def _launcher_command(launcher: str, source: Any) -> "tuple[str, str] | None":
    """(argv0, how it was found) of the launcher's command (its Source's `Doctor`:
    `command_for`, `programs`, `daemons`), or None."""
    import shutil

    command = source.doctor.command_for(launcher)
    for pid, exe, comm in system._ancestors():
        base = os.path.basename(exe) if exe else comm
        if base in source.doctor.programs or comm in source.doctor.programs:
            if exe and base in source.doctor.daemons:
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
    """{"version", "source"}: the launcher's own version, where it says it (how: its Source's
    `Doctor`: `var`, `package`, `command_for`)."""
    from ..sources import job_prefixes, source_of

    source = source_of(launcher)
    if source.doctor.var and environ.get(source.doctor.var):
        return {"version": f"{source.title} {environ[source.doctor.var]}",
                "source": source.doctor.var}
    if source.doctor.package:
        from importlib import metadata

        dist = source.doctor.package
        try:
            return {"version": f"{dist} {metadata.version(dist)}",
                    "source": f"{dist}'s metadata in this interpreter"}
        except metadata.PackageNotFoundError:
            return {"version": None, "source": f"{dist} is not installed for this interpreter"}
    if not source.doctor.command_for(launcher):
        return {"version": None, "source": f"{launcher} has no version command"}
    found = _launcher_command(launcher, source)
    if found is None:
        return {"version": None,
                "source": f"{source.doctor.command_for(launcher)} is neither an ancestor nor on PATH"}
    command, how = found
    import subprocess

    clean = {k: v for k, v in environ.items() if not k.startswith(job_prefixes())}
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
