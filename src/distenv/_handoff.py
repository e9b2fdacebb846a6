"""What the two launcher-service clients, `distenv.pmi` (Hydra's PMI-1) and `distenv.pmix`,
share: how a call begins (this process's earlier answer, the offer, the timeout), and what
they hand the command they are about to exec (``distenv run``): the held-service guard and
the compact host list ``<host>*<count>,...`` (the hosts of ranks 0.. in runs)."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TypeVar

    T = TypeVar("T")


def answered(done: "tuple[int, T] | None") -> "T | None":
    """The answer this very process got before, or None: a service is asked once per process
    (a forked child has another pid and asks, or is refused, on its own)."""
    return done[1] if done is not None and done[0] == os.getpid() else None


def begin(environ: "Mapping[str, str]", found: Any, timeout: "float | None",
          offer: "Callable[[Mapping[str, str]], tuple[Any, str]]",
          fail: "Callable[[str], Exception]", service: str, fix: str = "") -> "tuple[Any, float]":
    """(the offer, the timeout) of a call: `found` if given, else `offer(environ)` -- when it
    declines, `fail` is raised saying the `service` cannot be used and why (then `fix`) --;
    `timeout` if given, else DISTENV_TIMEOUT's."""
    if found is None:
        found, why_not = offer(environ)
        if found is None:
            raise fail(f"the launcher's {service} cannot be used here: {why_not}.{fix}")
    if timeout is None:
        from .knobs import timeout as wait  # DISTENV_TIMEOUT's one parser

        timeout = wait(environ)
    return found, timeout


def refusal(environ: "Mapping[str, str]", var: str, pid: int) -> "str | None":
    """Why this process must not use the service again when `var` is set, or None. The value
    starts with the pid that used it: exec keeps the pid (this process asked before it
    exec'ed: its answer is in `var`); any other pid is an ancestor, whose connection this is
    not."""
    held = environ.get(var)
    if not held:
        return None
    if held.split(";", 1)[0] != str(pid):
        return f"{var}: the service belongs to process {held.split(';', 1)[0]}, an ancestor of this one"
    return f"{var}: this process used the service before it exec'ed"


def encode_hosts(hosts: "Sequence[str]") -> str:
    """``a*2,b*2`` for ``[a, a, b, b]``."""
    runs: "list[list[object]]" = []  # [host, count]
    for host in hosts:
        if runs and runs[-1][0] == host:
            runs[-1][1] += 1  # type: ignore[operator]  # the count is an int
        else:
            runs.append([host, 1])
    return ",".join(f"{h}*{n}" for h, n in runs)


def decode_hosts(text: str) -> "list[str] | None":
    """`encode_hosts` undone; None when `text` is not such a list."""
    hosts: "list[str]" = []
    try:
        for run in text.split(","):
            host, _, count = run.rpartition("*")
            if not host or int(count) < 1:
                return None
            hosts.extend([host] * int(count))
    except ValueError:
        return None
    return hosts
