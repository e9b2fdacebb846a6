"""What a launcher service's client hands the command it is about to exec (``distenv run``),
shared by `distenv.pmi` (Hydra's PMI-1) and `distenv.pmix`: the held-service guard and the
compact host list ``<host>*<count>,...`` (the hosts of ranks 0.. in runs)."""

from __future__ import annotations

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


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
