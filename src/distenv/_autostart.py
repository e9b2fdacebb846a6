"""Interpreter-start activation of `distenv.auto` when ``DISTENV_AUTO`` is set.

The wheel ships ``distenv_auto.pth`` at the root of site-packages; its one line checks
``os.environ`` (already imported by `site`) and imports this module only when
``DISTENV_AUTO`` is set and not ``0``, or when a ``DISTENV_*`` name as short as it is set that
distenv does not use (``DISTENV_AUOT``: a misspelled DISTENV_AUTO would otherwise leave the
script undistributed without a word; this module then warns, naming DISTENV_AUTO). An
interpreter without them pays one look at each variable's name.
A launch distenv cannot describe ends the interpreter with the one-line error
``distenv: error: ... Fix: ...`` (exit 2; ``DISTENV_TRACEBACK=1`` adds the traceback):
training undistributed would be worse.
"""

from __future__ import annotations

import os
import sys


def _is_distenv_cli() -> bool:
    """This interpreter runs the `distenv` command (it describes the environment it was
    given, and `distenv run` sets up its children itself)."""
    argv: "list[str]" = getattr(sys, "orig_argv", None) or [sys.executable] + list(getattr(sys, "argv", []))
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return i + 1 < len(argv) and argv[i + 1] in ("distenv", "distenv.cli")
        if arg == "-c" or not arg.startswith("-"):
            return os.path.basename(arg) == "distenv"
        # the interpreter's options that take the next word (python -X dev -m distenv ...)
        i += 2 if arg in ("-X", "-W", "--check-hash-based-pycs") else 1
    return False


def _start() -> None:
    from .knobs import AUTO, unknown

    if _is_distenv_cli():
        return  # the command warns of unknown names itself (the doctor reports them)
    if unknown():  # a misspelled DISTENV_AUTO: the .pth line imports this module for it too
        from .core.resolver import rank_if_known
        from .log import warn_unknown_knobs

        warn_unknown_knobs(rank=rank_if_known())
    if not AUTO.value():
        return
    from .errors import DistEnvError

    try:
        from . import auto  # noqa: F401  (activates on import)
    except DistEnvError as exc:
        # Raised while `site` reads the .pth file, which would print the traceback and go on
        # undistributed: the one line (`distenv.errors.error_line`) and exit 2 here.
        from .errors import EXIT_STATUS, error_line, traceback_wanted

        if traceback_wanted():
            import traceback

            traceback.print_exc()
        sys.stderr.write(f"{error_line(exc)} ({AUTO}={AUTO.raw()}; "
                         "unset it to start without distenv)\n")
        sys.stderr.flush()  # os._exit skips the flush at exit
        os._exit(EXIT_STATUS)


_start()
