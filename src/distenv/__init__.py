"""distenv: one truthful description of any distributed launch.

    >>> import distenv
    >>> env = distenv.resolve()        # pure: reads os.environ, writes nothing
    >>> env.rank, env.world_size, env.master_addr
    >>> print(env.explain())           # which variable gave each field
    >>> env.export()                   # explicit: write RANK, WORLD_SIZE, MASTER_ADDR, ...

The core is standard library only and imports no framework; adapters
(`distenv.torch`, `distenv.lightning`, ...) import theirs lazily.
"""

from __future__ import annotations

from .core.description import FIELDS, PER_NODE, PER_PROCESS, DistEnv
from .errors import DistEnvError
from .core.resolver import resolve

__version__ = "0.1.0"

__all__ = ["DistEnv", "DistEnvError", "FIELDS", "PER_NODE", "PER_PROCESS", "discover", "resolve",
           "__version__"]


def __getattr__(name: str) -> object:
    # `distenv.discover` on first use: discovery (sockets, the PMI client) stays out of
    # `import distenv`, whose cost is one of the core's guarantees.
    if name == "discover":
        from .discovery import discover

        return discover
    raise AttributeError(f"module 'distenv' has no attribute {name!r}")
