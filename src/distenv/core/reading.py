"""What a source has read so far, and strict parsers that name the variable on error."""

from __future__ import annotations

from ._error import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    #: What sources read: os.environ or any mapping of variable names to values.
    Env = Mapping[str, str]

#: Largest rank/size we accept; anything above is certainly garbage.
MAX_COUNT = 1 << 31


def show(value: object, limit: int = 80) -> str:
    """A value quoted for an error message, truncated so garbage cannot flood logs."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + f"...<{len(text)} chars>"
    return repr(text)


def parse_int(raw: str, name: str, who: str = "", minimum: int = 0) -> int:
    """A strict integer from `minimum` to MAX_COUNT - 1 (ASCII digits only: int() would accept
    '٣' or '1_0'). Every bad value gets one wording: what was given, the range, the fix."""
    if raw.isdigit() and raw.isascii() and len(raw) <= 10:  # the usual case, checked below
        value = int(raw)
        if minimum <= value < MAX_COUNT:
            return value
    text = raw.strip()
    if text and len(text) <= 12 and text.isascii() and text.isdigit() and minimum <= int(text) < MAX_COUNT:
        return int(text)
    by = f" (set by {who})" if who else ""
    raise DistEnvError(
        f"{name}={show(raw)}{by} is not an integer from {minimum} to {MAX_COUNT - 1}. "
        f"Fix: unset {name} or give it the launcher's value."
    )


#: TCP ports: the range every port distenv reads or derives must be in.
PORT_MIN, PORT_MAX = 1, 65535


def port_error(name: str, given: object, who: str = "", last: int = PORT_MAX) -> DistEnvError:
    """The one wording of a bad port: what was given, the range, the fix. `last`: a lower
    upper bound for the first of several consecutive ports."""
    by = f" (set by {who})" if who else ""
    width = PORT_MAX + 1 - last
    text = str(given).strip()
    a_port = text.isascii() and text.isdigit() and PORT_MIN <= int(text[:6]) <= PORT_MAX
    what = (f"cannot be the first of {width} TCP ports ({PORT_MIN}-{PORT_MAX}): it must be at most {last}"
            if a_port and width > 1 else f"is not a TCP port ({PORT_MIN}-{PORT_MAX})")
    return DistEnvError(f"{name}={show(given)}{by} {what}. "
                        f"Fix: set {name} to a free port from {PORT_MIN} to {last}, or unset it.")


def parse_port(raw: str, name: str, who: str = "", last: int = PORT_MAX) -> int:
    """A TCP port, 1 to 65535 (or `last`), from a variable; else `port_error`."""
    text = raw.strip()
    if text and len(text) <= 5 and text.isascii() and text.isdigit() and PORT_MIN <= int(text) <= last:
        return int(text)
    raise port_error(name, raw, who, last)


def get_int(env: "Env", name: str, who: str = "", minimum: int = 0) -> "int | None":
    """`parse_int` of env[name], or None when the variable is absent."""
    raw = env.get(name)
    if raw is None:
        return None
    return parse_int(raw, name, who, minimum)


def read_counts(env: "Env", r: Reading, who: str, rank: str, size: str,
                local_rank: "str | None" = None, local_size: "str | None" = None) -> None:
    """The four numbers most launchers give, each recorded with its variable."""
    r.int_from(env, "rank", rank, who)
    r.int_from(env, "world_size", size, who, minimum=1)
    if local_rank:
        r.int_from(env, "local_rank", local_rank, who)
    if local_size:
        r.int_from(env, "local_world_size", local_size, who, minimum=1)


def first_int(env: "Env", names: "Iterable[str]", who: str = ""
              ) -> "tuple[int, str] | tuple[None, None]":
    """(value, name) of the first variable present among `names`."""
    for name in names:
        value = get_int(env, name, who)
        if value is not None:
            return value, name
    return None, None


def parse_json(raw: str, name: str) -> Any:
    import json  # lazy: only a few sources carry JSON

    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise DistEnvError(f"{name} is not valid JSON ({exc}): {show(raw)}. Fix: unset {name}, "
                           "or give it the JSON its launcher or platform writes.") from None


class Reading:
    """Fields a source found, each with why. Mutable while resolving, then frozen into DistEnv."""

    __slots__ = ("values", "why", "notes", "launch", "owns", "node_order", "port_key", "nproc_source",
                 "addr_explicit", "nproc_from_world", "hosts_by_node", "workers_unproven")

    def __init__(self) -> None:
        self.values: "dict[str, Any]" = {}
        self.why: "dict[str, str]" = {}
        self.notes: "list[str]" = []
        self.launch: "str | None" = None  # "per-process" / "per-node"; None until a source decides
        # The launcher's source's `owns` (canonical variables it reads with its own meaning) and
        # `node_order` (set when it numbers nodes by no host list): what a platform must respect.
        self.owns: "tuple[str, ...]" = ()
        self.node_order = ""
        self.port_key: "str | None" = None  # job identity for deriving a port every rank agrees on
        self.nproc_source: "tuple[str, str] | None" = None  # (raw value, why) of a platform's own processes-per-node hint
        self.addr_explicit = False  # the master address was named outright (not inferred)
        # A per-node launch that gives the total process count (world_size) but not the processes
        # per node: those come from DISTENV_NPROC_PER_NODE or the framework (the Trainer's
        # devices), never from a default, and num_nodes = world_size / them.
        self.nproc_from_world = False
        # `hosts` lists the nodes in node-rank order (node k's host is hosts[k]): False when a
        # process per node became a node with its rank as node rank, but the launcher's own node
        # index disagrees (or is unknown) -- its list is in its own order, not in rank order.
        self.hosts_by_node = True
        # Why this node's GPUs prove nothing of the other nodes' workers (AWS Batch's node groups
        # ask for their own resources): a multi-node per-node launch's workers per node are then
        # only what the user gives, else unknown with this reason ("" where a node stands for all).
        self.workers_unproven = ""

    def set(self, field: str, value: Any, why: str) -> None:
        if value is not None:
            self.values[field] = value
            self.why[field] = why

    def default(self, field: str, value: Any, why: str) -> None:
        """Set only when nothing has set the field yet."""
        if self.values.get(field) is None:
            self.set(field, value, why)

    def int_from(self, env: "Env", field: str, name: str, who: str = "", minimum: int = 0) -> "int | None":
        raw = env.get(name)
        if raw is None:
            return None
        value = parse_port(raw, name, who) if field == "master_port" else parse_int(raw, name, who, minimum)
        self.values[field] = value
        self.why[field] = f"{name}={value}"
        return value

    def get(self, field: str) -> Any:
        return self.values.get(field)
