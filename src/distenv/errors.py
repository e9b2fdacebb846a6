"""The one exception distenv raises for a launch it cannot describe truthfully, and how a
process that did not catch it ends (`install_excepthook`)."""

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

# The class lives in the floor module (see there why); this is its public home.
from .core._error import MAX_MESSAGE as MAX_MESSAGE, DistEnvError as DistEnvError
from .core._error import split_fix as split_fix

#: Exit status of a process ended by an uncaught DistEnvError (as `distenv`'s own errors).
EXIT_STATUS = 2


def error_line(exc: BaseException) -> str:
    """``distenv: error: <message>``: one line, whitespace folded, secrets redacted."""
    from .core.redact import redact_text  # lazy: only on the error path

    return f"distenv: error: {redact_text(' '.join(str(exc).split()))}"


def traceback_wanted() -> bool:
    """Does whoever runs this process want the traceback of a DistEnvError? ``DISTENV_TRACEBACK``
    set (not 0), ``DISTENV_LOG_LEVEL=debug``, or the ``distenv`` logger enabled for DEBUG."""
    import sys

    from .knobs import TRACEBACK, debug_asked  # lazy: only on the error path

    if TRACEBACK.value() or debug_asked():
        return True
    logging = sys.modules.get("logging")  # not configured when never imported
    return logging is not None and logging.getLogger("distenv").isEnabledFor(logging.DEBUG)


def _emit(line: str) -> None:
    """`line` on the process's standard error, after what the program printed: written to
    descriptor 2 itself, since a hook that wraps this one may hold sys.stderr in a buffer it
    writes only if this one returns (torch.distributed's rank-prefixing hook does, and the
    SystemExit that sets the exit status would lose the line there)."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # what the program printed comes before the line
        except (OSError, ValueError, AttributeError):
            pass
    data = (line + "\n").encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _a_worker_of_distenv_run() -> bool:
    """Was this process started by `distenv run` (DISTENV_RUN), without a traceback asked for?"""
    from .knobs import RUN  # lazy: only on the error path

    return bool(RUN.raw()) and not traceback_wanted()


class _Excepthook:
    """sys.excepthook that ends a process on an uncaught DistEnvError with its one line and
    exit status 2; any other exception goes to the hook that was there before."""

    def __init__(self, previous: "Callable[..., object]") -> None:
        self.previous = previous

    def __call__(self, kind: "type[BaseException]", value: BaseException,
                 tb: "TracebackType | None") -> None:
        import sys

        if isinstance(value, KeyboardInterrupt) and _a_worker_of_distenv_run():
            # a Ctrl-C reaches every worker of the node at once: one line each, not a
            # traceback each (DISTENV_TRACEBACK=1 keeps it)
            import os

            rank = os.environ.get("RANK", "")
            _emit(f"distenv: {'rank ' + rank + ': ' if rank.isdigit() else ''}interrupted "
                  "(KeyboardInterrupt)")
            status = 130
        elif not isinstance(value, DistEnvError):
            self.previous(kind, value, tb)
            return
        elif traceback_wanted():
            self.previous(kind, value, tb)
            status = EXIT_STATUS
        else:
            _emit(error_line(value))
            status = EXIT_STATUS
        # Python calls the hook for the exception that ends the program after setting
        # sys.last_value; a SystemExit raised here then becomes the exit status, after the
        # atexit handlers ran. Not in an interactive session, nor when called by hand.
        if getattr(sys, "last_value", None) is value and not sys.flags.interactive \
                and not hasattr(sys, "ps1"):
            raise SystemExit(status)


def install_excepthook() -> None:
    """End this process with ``distenv: error: ... Fix: ...`` on stderr and exit status 2,
    no traceback, when a DistEnvError reaches the top uncaught (see `traceback_wanted` for
    the traceback). An exception the program catches, and any other exception, are left as
    they were. Installed by importing an adapter (`distenv.torch`, ...) or `distenv.auto`;
    idempotent; a hook installed earlier still sees everything else."""
    import sys

    if not isinstance(sys.excepthook, _Excepthook):
        sys.excepthook = _Excepthook(sys.excepthook)
