"""The one exception distenv raises for a launch it cannot describe truthfully, and how a
process that did not catch it ends (`install_excepthook`)."""

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

#: Longest message: a garbage value of megabytes must not become a megabyte log line.
MAX_MESSAGE = 2000


class DistEnvError(ValueError):
    """A malformed, contradictory or incomplete launch environment.

    The message names the variable(s), their value(s) and what to do. It is always one
    printable line of at most MAX_MESSAGE characters, with anything that looks like a secret
    (credentials in an address, tokens) redacted: values come from the environment and the
    message ends up in logs.
    """

    def __init__(self, message: str = ""):
        text = str(message)
        if not text.isprintable():
            text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        if "@" in text or "=" in text or "_" in text:
            from .redact import redact_text  # lazy: only on the error path

            text = redact_text(text)  # before the cut, which could split a secret in half
        if len(text) > MAX_MESSAGE:
            text = text[: MAX_MESSAGE - 30] + f"... <{len(text)} chars>"
        super().__init__(text)

    @property
    def fix(self) -> "str | None":
        """What to do, the text after ``Fix:`` in the message (None if it has none)."""
        return split_fix(str(self))[1]

    @property
    def problem(self) -> str:
        """What is wrong: the message without its ``Fix:`` part."""
        return split_fix(str(self))[0]


def split_fix(message: str) -> "tuple[str, str | None]":
    """(problem, fix) of a message whose fix follows ``Fix:``; (message, None) without one."""
    head, sep, tail = message.partition("Fix:")
    if not sep or not tail.strip():
        return message, None
    return head.rstrip(), tail.strip()


#: Set to 1 to see the traceback of an uncaught DistEnvError instead of its one line.
TRACEBACK_VAR = "DISTENV_TRACEBACK"
#: Exit status of a process ended by an uncaught DistEnvError (as `distenv`'s own errors).
EXIT_STATUS = 2


def error_line(exc: BaseException) -> str:
    """``distenv: error: <message>``: one line, whitespace folded, secrets redacted."""
    from .redact import redact_text  # lazy: only on the error path

    return f"distenv: error: {redact_text(' '.join(str(exc).split()))}"


def traceback_wanted() -> bool:
    """Does whoever runs this process want the traceback of a DistEnvError? ``DISTENV_TRACEBACK``
    set (not 0), ``DISTENV_LOG_LEVEL=debug``, or the ``distenv`` logger enabled for DEBUG."""
    import os
    import sys

    if os.environ.get(TRACEBACK_VAR, "").strip().lower() not in ("", "0", "false", "no", "off"):
        return True
    if os.environ.get("DISTENV_LOG_LEVEL", "").strip().lower() == "debug":
        return True
    logging = sys.modules.get("logging")  # not configured when never imported
    return logging is not None and logging.getLogger("distenv").isEnabledFor(logging.DEBUG)


class _Excepthook:
    """sys.excepthook that ends a process on an uncaught DistEnvError with its one line and
    exit status 2; any other exception goes to the hook that was there before."""

    def __init__(self, previous: "Callable[..., object]") -> None:
        self.previous = previous

    def __call__(self, kind: "type[BaseException]", value: BaseException,
                 tb: "TracebackType | None") -> None:
        import sys

        if not isinstance(value, DistEnvError):
            self.previous(kind, value, tb)
            return
        if traceback_wanted():
            self.previous(kind, value, tb)
        else:
            try:
                sys.stdout.flush()  # what the program printed comes before the error
            except (OSError, ValueError, AttributeError):
                pass
            sys.stderr.write(error_line(value) + "\n")
            sys.stderr.flush()
        # Python calls the hook for the exception that ends the program after setting
        # sys.last_value; a SystemExit raised here then becomes the exit status, after the
        # atexit handlers ran. Not in an interactive session, nor when called by hand.
        if getattr(sys, "last_value", None) is value and not sys.flags.interactive \
                and not hasattr(sys, "ps1"):
            raise SystemExit(EXIT_STATUS)


def install_excepthook() -> None:
    """End this process with ``distenv: error: ... Fix: ...`` on stderr and exit status 2,
    no traceback, when a DistEnvError reaches the top uncaught (see `traceback_wanted` for
    the traceback). An exception the program catches, and any other exception, are left as
    they were. Installed by importing an adapter (`distenv.torch`, ...) or `distenv.auto`;
    idempotent; a hook installed earlier still sees everything else."""
    import sys

    if not isinstance(sys.excepthook, _Excepthook):
        sys.excepthook = _Excepthook(sys.excepthook)
