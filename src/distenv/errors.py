"""The one exception distenv raises for a launch it cannot describe truthfully."""


class DistEnvError(ValueError):
    """A malformed, contradictory or incomplete launch environment.

    The message names the variable(s), their value(s) and what to do.
    """
