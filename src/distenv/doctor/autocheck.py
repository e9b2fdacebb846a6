"""The doctor's DISTENV_AUTO check: does the `python` on PATH start distenv (its
site-packages hold distenv_auto.pth)? Named so as not to be taken for `distenv.auto`."""

from __future__ import annotations

import os

from ..knobs import AUTO
from . import system

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .report import Report


#: What a site-packages directory holds when DISTENV_AUTO=1 works for its interpreter.
AUTO_PTH = "distenv_auto.pth"


def site_dirs(python: str) -> "list[str]":
    """The directories where `python` reads .pth files at start, found from its path alone
    (nothing is run): a virtualenv's (pyvenv.cfg beside bin/) lib/python*/site-packages;
    otherwise its prefix's site- and dist-packages, Debian's /usr/local one and the user's."""
    import glob

    real = os.path.realpath(python)
    prefixes = []
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
        prefixes.append(venv)
    else:
        prefix = os.path.dirname(os.path.dirname(real))
        prefixes += [prefix, os.path.join(prefix, "local")]
        prefixes.append(os.path.join(os.path.expanduser("~"), ".local"))
    found: "list[str]" = []
    for prefix in prefixes:
        for pattern in ("lib/python*/site-packages", "lib/python*/dist-packages", "lib/python3/dist-packages"):
            for d in sorted(glob.glob(os.path.join(prefix, pattern))):
                if os.path.isdir(d) and d not in found:
                    found.append(d)
    return found


def _check_auto(rep: Report, environ: "Mapping[str, str]") -> "dict[str, Any] | None":
    """DISTENV_AUTO=1 acts only in an interpreter whose site-packages hold distenv_auto.pth;
    any other ignores it without a word. Is `python` (and `python3`) on PATH one of those?"""
    import shutil
    import sys

    if not AUTO.value(environ) or not environ.get("PATH"):
        return None  # off, or no PATH to tell which `python` a launch runs
    out: "dict[str, Any]" = {}
    mine = os.path.dirname(os.path.abspath(sys.executable))
    for name in ("python", "python3"):
        python = shutil.which(name, path=environ["PATH"])
        if python is None or any(python == seen["path"] for seen in out.values()):
            continue
        head = (system._read_bytes(os.path.realpath(python), 4) or b"")
        if head != b"\x7fELF":  # a wrapper (pyenv's shims, a script): which Python it runs is its business
            out[name] = {"path": python, "distenv_auto": None, "site_dirs": []}
            rep.add("info", "auto", f"{AUTO}={environ[AUTO]}: `{name}` on PATH ({python}) "
                    "is a wrapper, not an interpreter: distenv cannot tell whether the Python it runs "
                    f"has distenv (an interpreter without it ignores DISTENV_AUTO silently).",
                    f"check with `{name} -c 'import distenv'`, or start scripts through "
                    f"`distenv run -- {name} script.py`.")
            continue
        dirs = site_dirs(python)
        has = [d for d in dirs if os.path.exists(os.path.join(d, AUTO_PTH))]
        out[name] = {"path": python, "distenv_auto": bool(has), "site_dirs": dirs}
        if has:
            rep.add("ok", "auto", f"{AUTO}={environ[AUTO]}: `{name}` on PATH ({python}) "
                    f"starts distenv ({AUTO_PTH} in {has[0]}).")
            continue
        here = " (this interpreter's directory)" if os.path.dirname(os.path.abspath(python)) == mine else ""
        rep.add("warning", "auto",
                f"{AUTO}={environ[AUTO]} is set, but `{name}` on PATH ({python}{here}) has "
                f"no {AUTO_PTH} in {', '.join(dirs) or 'any site-packages found'}: a script it runs "
                "starts without distenv, and says nothing (torch then asks for RANK).",
                f"install distenv into that environment ({python} -m pip install <distenv's "
                f"source or wheel>), start the script with {sys.executable}, or through `distenv run "
                f"-- {name} script.py`, which exports the torch variables before the script starts.")
    return out
