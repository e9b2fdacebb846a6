"""`DistEnvError` itself: the floor of the package, importing nothing of it.

Its public home is `distenv.errors`, which re-exports it beside how an uncaught one ends a
process; the modules that one reads the knobs through (`distenv.knobs`, `distenv.core.reading`)
import it from here, so that `distenv.errors` may read the knobs without an import circle.
"""

#: Longest message: a garbage value of megabytes must not become a megabyte log line.
MAX_MESSAGE = 2000


class DistEnvError(ValueError):
    """A malformed, contradictory or incomplete launch environment.

    The message names the variable(s), their value(s) and what to do. It is always one
    printable line of at most MAX_MESSAGE characters, with anything that looks like a secret
    (credentials in an address, tokens) redacted: values come from the environment and the
    message ends up in logs.
    """

    __module__ = "distenv.errors"  # its public home: tracebacks and pickles name it there

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
