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

from .description import FIELDS, PER_NODE, PER_PROCESS, DistEnv
from .errors import DistEnvError
from .resolver import resolve

__version__ = "0.1.0"

__all__ = ["DistEnv", "DistEnvError", "FIELDS", "PER_NODE", "PER_PROCESS", "resolve", "__version__"]
