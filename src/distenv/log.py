"""distenv's diagnostics go through `logging`: the logger ``distenv`` and a child per module.

    >>> from distenv.log import get_logger
    >>> log = get_logger(__name__)      # "distenv.torch", ...; or get_logger("torch")
    >>> log.info("2 of 4 ranks joined; waiting for 2, 3")

As Lightning's and Transformers' library loggers do, distenv shows its messages even in an
application that configured no logging: when neither the ``distenv`` logger nor the root
logger has a handler, it gets one that writes ``distenv.torch: info: ...`` lines to
``sys.stderr`` (the stream current at each message, so redirections and pytest's capture see
them). Unlike theirs, that handler steps aside as soon as the application configures the
root logger (``logging.basicConfig``, a framework's setup), even after distenv's first
message, so a message is never printed twice nor lost: the record propagates to the
application's handlers.

The level: ``DISTENV_LOG_LEVEL`` (``debug``, ``info``, ``warning``, ``error``; default
``info``, as Lightning's) when distenv adds its handler; otherwise the application decides
(``logging.getLogger("distenv").setLevel(...)``).

Not imported by ``import distenv`` (``logging`` costs milliseconds at interpreter start);
modules import it where they emit.
"""

from __future__ import annotations

import logging
import sys

from .knobs import log_level, unknown, unknown_message

ROOT = "distenv"

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TextIO

    _Handler = logging.StreamHandler[TextIO]  # generic for type checkers only (Python < 3.11)
else:
    _Handler = logging.StreamHandler


class _Fallback(_Handler):
    """The handler distenv adds when the application has none (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> "TextIO":
        return sys.stderr

    @stream.setter
    def stream(self, value: "TextIO") -> None:  # StreamHandler.__init__ sets it; the current stderr wins
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application configured logging: the record reaches its handlers
        super().emit(record)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"{record.name}: {record.levelname.lower()}: {text}"


def _configure() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if any(isinstance(h, _Fallback) for h in logger.handlers):
        return logger
    if logger.handlers or logging.getLogger().handlers:
        return logger  # the application has handlers: it decides
    handler = _Fallback()
    handler.setFormatter(_Format("%(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(log_level().upper())
    return logger


def get_logger(name: str = ROOT) -> logging.Logger:
    """The logger ``distenv`` or its child `name` (``"torch"``, ``"distenv.torch"`` or a
    module's ``__name__``), with distenv's fallback handler installed if needed."""
    _configure()
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)


_warned = False


def warn_unknown_knobs(environ: "Mapping[str, str] | None" = None, rank: "int | None" = None) -> None:
    """A warning line (logger ``distenv.knobs``) for each ``DISTENV_*`` name in the environment
    distenv does not know, naming the nearest one it does; once per process, and only where
    `rank` (this process's, from the caller: `distenv.core.resolver.rank_if_known`, a bring-up's
    description) is 0 or unknown: one line per job, however many ranks start."""
    global _warned
    if _warned or not unknown(environ):
        return
    _warned = True
    if rank not in (None, 0):
        return
    log = get_logger("knobs")
    for name, nearest in unknown(environ):
        log.warning(unknown_message(name, nearest))
