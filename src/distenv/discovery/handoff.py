"""What the two launcher-service clients, `distenv.discovery.pmi` (Hydra's PMI-1) and `distenv.discovery.pmix`,
share: how a call begins (this process's earlier answer, the offer, the timeout), and what
they hand the command they are about to exec (``distenv run``): the held-service guard and
the compact host list ``<host>*<count>,...`` (the hosts of ranks 0.. in runs), in the
variable itself or, when long, in an inherited memory file (`pack`)."""

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
        from ..knobs import timeout as wait  # DISTENV_TIMEOUT's one parser

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


#: Longest host list a hand-off variable holds itself. Linux limits one variable to 128 KiB
#: (MAX_ARG_STRLEN): 10 000 ranks cyclic with fully qualified names took 410 KB, and exec
#: failed with E2BIG (the user saw exit 126). A longer list goes in a memory file (`pack`).
INLINE = 16 << 10
#: How a hand-off variable names the memory file holding its host list.
FD_PREFIX = "@fd:"


def pack(text: str) -> str:
    """`text` for a hand-off variable: itself when short, else ``@fd:<n>``, a memory file
    (memfd: no file on disk, gone with the process) that the exec'ed program -- the same
    process -- inherits and reads (`unpack`)."""
    if len(text) <= INLINE:
        return text
    fd = os.memfd_create("distenv-handoff", 0)  # no MFD_CLOEXEC: it must survive the exec
    data = text.encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return f"{FD_PREFIX}{fd}"


def unpack(text: str) -> "str | None":
    """`pack` undone (None when the memory file is not there: not this process's hand-off).
    The descriptor is made non-inheritable once read: the program's own children do not
    carry it."""
    if not text.startswith(FD_PREFIX):
        return text
    raw = text[len(FD_PREFIX):]
    if not raw.isdigit():
        return None
    fd = int(raw)
    try:
        size = os.fstat(fd).st_size
        if size > (256 << 20):
            return None
        data = os.pread(fd, size, 0)
        os.set_inheritable(fd, False)
    except OSError:
        return None
    return data.decode("utf-8", "replace")


def encode_hosts(hosts: "Sequence[str]") -> str:
    """``a*2,b*2`` for ``[a, a, b, b]``."""
    runs: "list[list[object]]" = []  # [host, count]
    for host in hosts:
        if runs and runs[-1][0] == host:
            runs[-1][1] += 1  # type: ignore[operator]  # the count is an int
        else:
            runs.append([host, 1])
    return ",".join(f"{h}*{n}" for h, n in runs)


#: Most ranks a hand-off may describe (MAX_COUNT of the resolver is larger; no job is).
MAX_RANKS = 10_000_000


def decode_hosts(text: str, limit: int = MAX_RANKS) -> "list[str] | None":
    """`encode_hosts` undone; None when `text` is not such a list (or names more than `limit`
    ranks: it would otherwise build a list of any length it names)."""
    hosts: "list[str]" = []
    try:
        for run in text.split(","):
            host, _, count = run.rpartition("*")
            n = int(count)
            if not host or n < 1 or len(hosts) + n > limit:
                return None
            hosts.extend([host] * n)
    except ValueError:
        return None
    return hosts
