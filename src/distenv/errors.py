"""The one exception distenv raises for a launch it cannot describe truthfully."""


class DistEnvError(ValueError):
    """A malformed, contradictory or incomplete launch environment.

    The message names the variable(s), their value(s) and what to do. It is always one
    line: values from the environment are shown with control characters escaped, so a
    garbage value cannot break a log line or forge another.
    """

    def __init__(self, message: str = ""):
        text = str(message)
        if not text.isprintable():
            text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        super().__init__(text)
