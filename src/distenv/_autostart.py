"""Interpreter-start activation of `distenv.auto` when ``DISTENV_AUTO`` is set.

The wheel ships ``distenv_auto.pth`` at the root of site-packages; its one line checks
``os.environ`` (already imported by `site`) and imports this module only when
``DISTENV_AUTO`` is set and not ``0``, so an interpreter without it pays one dict lookup.
A launch distenv cannot describe ends the interpreter with the one-line error (exit 2):
training undistributed would be worse.
"""

from __future__ import annotations

import os
import sys


def _start() -> None:
    flag = os.environ.get("DISTENV_AUTO", "").strip().lower()
    if flag in ("", "0", "false", "no", "off"):
        return
    from .errors import DistEnvError

    try:
        from . import auto  # noqa: F401  (activates on import)
    except DistEnvError as exc:
        from .redact import redact_text

        message = redact_text(" ".join(str(exc).split()))
        sys.stderr.write(f"distenv.auto: error: {message} (DISTENV_AUTO={os.environ['DISTENV_AUTO']}; "
                         "unset it to start without distenv)\n")
        sys.stderr.flush()
        os._exit(2)


_start()
