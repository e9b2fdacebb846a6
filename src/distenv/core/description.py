"""`DistEnv`: the frozen description of one process's place in a distributed launch."""

from __future__ import annotations

# The words are in the floor module; they stay importable from here, as they always were.
from .fields import DECLINED as DECLINED, DEFAULT as DEFAULT, DERIVED as DERIVED, GIVEN as GIVEN
from .fields import FIELDS as FIELDS, PER_NODE as PER_NODE, PER_PROCESS as PER_PROCESS
from .fields import UNKNOWN as UNKNOWN

# Names for type checkers only (mypy treats any TYPE_CHECKING as true): importing `typing`
# would cost `import distenv` milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
    from typing import Any

    from .checked import Checked


#: What an unknown field without a provenance entry says (`explain`, the doctor).
UNREVEALED = "not revealed by the launcher"


class Why(str):
    """A provenance entry: the text people read, and a `kind` code branches on.

    Code never tests a why's wording (rewording a message must not change behaviour); it tests
    `kind_of(why)`. A plain str has no kind (None). Kinds set today:
    DEFAULT - a fixed fallback (torch's 29500: nothing to derive a port from);
    DERIVED - computed by distenv's own rule from an identity (a port from the job id);
    GIVEN - set by hand (MASTER_ADDR, MASTER_PORT the launch does not own);
    UNKNOWN - a launch's own rule could not prove the field (the text says why)."""

    __slots__ = ("kind",)
    kind: "str | None"

    def __new__(cls, text: str, kind: "str | None" = None) -> "Why":
        self = super().__new__(cls, text)
        self.kind = kind
        return self

    def __reduce__(self) -> "tuple[Any, ...]":
        return (Why, (str(self), self.kind))


class Note(str):
    """A note, and the field(s) it is about (`about`): a note about fields a service later
    fills (a world size, a port, rank 0's host) is dropped by looking at `about`, never at its
    text. `kind` UNKNOWN marks the resolver's one note that lists every unknown field
    (`distenv.core.resolver.unknown_note`), which is rebuilt when some of them get known."""

    __slots__ = ("about", "kind")
    about: "tuple[str, ...]"
    kind: "str | None"

    def __new__(cls, text: str, about: "str | tuple[str, ...] | None" = None,
                kind: "str | None" = None) -> "Note":
        self = super().__new__(cls, text)
        self.about = (about,) if isinstance(about, str) else tuple(about or ())
        self.kind = kind
        return self

    def __reduce__(self) -> "tuple[Any, ...]":
        return (Note, (str(self), self.about, self.kind))




def kind_of(why: "str | None") -> "str | None":
    """The kind of a provenance entry (None for plain text or no entry)."""
    return getattr(why, "kind", None)


def unknown(reason: str) -> Why:
    """The provenance of a field a launch's own rule could not prove: 'unknown: <reason>'."""
    return Why(f"unknown: {reason}", UNKNOWN)


def about(note: str) -> "tuple[str, ...]":
    """The fields a note is about (none for plain text)."""
    fields: "tuple[str, ...]" = getattr(note, "about", ())
    return fields


class Later:
    """A field's value computed on first access (`distenv.core.placement` records the host of
    every rank this way: thousands of entries nobody may ask for). ``fn(*args)`` returns
    ``(value, why)``; a `why` (a string) replaces the field's provenance."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: "Callable[..., tuple[Any, str | None]]", args: "tuple[Any, ...]" = ()
                 ) -> None:
        self.fn, self.args = fn, args


def unsettled(env: "DistEnv") -> "dict[str, Any]":
    """A copy of `env`'s fields as stored: `rank_hosts` may still be a `Later` (not computed:
    a copy that replaces it, as discovery does, never pays for it). For `DistEnv(...)`."""
    return dict(env._values)


def _settle(values: "dict[str, Any]", provenance: "dict[str, str]", name: str) -> Any:
    value = values[name]
    if value.__class__ is Later:
        value, why = value.fn(*value.args)
        values[name] = value  # the dict is private and the answer fixed: the object stays frozen
        if why is not None:
            provenance[name] = why
    return value


def _settled(self: "DistEnv") -> "dict[str, Any]":
    values = self._values
    if values["rank_hosts"].__class__ is Later:
        _settle(values, self.provenance, "rank_hosts")
    return values


class DistEnv:
    """What launched this process and where it stands in the job.

    Every field the launcher does not reveal is ``None``. ``provenance`` maps each
    field to the variable(s) or rule that produced it; ``notes`` holds warnings
    worth showing a user (e.g. "this is a SLURM batch script, not a task").
    """

    # The fields live in one dict (`_values`, every field present) read by a property each:
    # resolve() builds a DistEnv on every call, and filling one dict is far cheaper than
    # fourteen slots.
    __slots__ = ("_values", "provenance", "notes")

    # Annotations for readers and type checkers; the properties are added below the class.
    launcher: str
    platform: "str | None"
    launch: str
    rank: "int | None"
    local_rank: "int | None"
    world_size: "int | None"
    local_world_size: "int | None"
    node_rank: "int | None"
    num_nodes: "int | None"
    nproc_per_node: "int | None"
    master_addr: "str | None"
    master_port: "int | None"
    hosts: "tuple[str, ...] | None"
    rank_hosts: "tuple[str, ...] | None"
    job_id: "str | None"
    provenance: "dict[str, str]"
    notes: "tuple[str, ...]"
    _values: "dict[str, Any]"

    def __init__(self, values: "Mapping[str, Any]", provenance: "Mapping[str, str] | None" = None,
                 notes: "Iterable[str]" = ()) -> None:
        _fill(self, values, dict(provenance or {}), notes)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("DistEnv is frozen; use resolve(**overrides) or .replace()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("DistEnv is frozen; use resolve(**overrides) or .replace()")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DistEnv):
            return NotImplemented
        return _settled(self) == _settled(other)

    def __reduce__(self) -> "tuple[Any, ...]":
        # Frozen slots defeat pickle's default setattr path; rebuild through __init__.
        return (DistEnv, (self.to_dict(), self.provenance, self.notes))

    def __hash__(self) -> int:
        return hash(tuple(map(_settled(self).get, FIELDS)))

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in FIELDS
                          if f not in ("hosts", "rank_hosts"))
        return f"DistEnv({inner})"

    # -- convenience -------------------------------------------------------------
    @property
    def is_distributed(self) -> bool:
        """True when more than one worker takes part (or the node must spawn workers)."""
        # An unknown world size (MPICH -pmi-port) is a distributed job we cannot describe fully.
        return self.launch == PER_NODE or self.world_size != 1

    @property
    def process_index(self) -> "int | None":
        """This process among those the launcher started: its node rank in a per-node launch
        (one process per node), else its rank; None when unknown."""
        return self.node_rank if self.launch == PER_NODE else self.rank

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (on node 0 for a per-node launch)."""
        return self.process_index == 0

    def replace(self, **changes: Any) -> "DistEnv":
        """A copy with some fields changed (provenance says 'replaced'); DistEnvError where the
        copy cannot describe one process of a launch (as resolve() checks its overrides)."""
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise TypeError(f"unknown DistEnv field(s): {', '.join(sorted(unknown))}")
        values = dict(_settled(self))
        values.update(changes)
        why = dict(self.provenance)
        for name in changes:
            why[name] = "replaced by the caller"
        # what resolve() checks of its overrides: a copy export() would write as it is
        from .invariants import check

        check(values, why, fix="give replace() values that describe one process of the launch")
        return DistEnv(values, why, self.notes)

    def to_dict(self) -> "dict[str, Any]":
        """The public JSON contract: exactly FIELDS, ``None`` where unknown."""
        out = dict(_settled(self))
        for name in ("hosts", "rank_hosts"):
            if out[name] is not None:
                out[name] = list(out[name])
        return out

    def explain(self) -> str:
        """One line per field: its value and where it came from."""
        width = max(len(f) for f in FIELDS)
        lines: "list[str]" = []
        for name in FIELDS:
            value = getattr(self, name)
            if name == "rank_hosts" and value is not None:
                shown = _runs(value)
            elif name == "hosts" and value is not None and len(value) > 8:
                shown = ",".join(value[:4]) + f",... ({len(value)} hosts)"
            elif name == "hosts" and value is not None:
                shown = ",".join(value)
            else:
                shown = "unknown" if value is None else str(value)
            why = self.provenance.get(name, UNREVEALED if value is None else "")
            lines.append(f"{name:<{width}}  {shown:<16}  {why}".rstrip())
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)

    def export(self, environ: "MutableMapping[str, str] | None" = None,
               overwrite: bool = False) -> "dict[str, str]":
        """Write the canonical torch variables; see `distenv.core.export.export`."""
        from .export import export

        return export(self, environ, overwrite=overwrite)

    def checked(self) -> "Checked":
        """This description with rank, world_size, local_rank (int), master_addr (str) and
        master_port (int) known -- typed without None -- or a `DistEnvError` naming every unknown
        one and what to set. See `distenv.core.checked`."""
        from .checked import Checked

        return Checked(self)

    def require(self, *names: str) -> "tuple[Any, ...]":
        """The values of the named fields, in order, none of them None; else a `DistEnvError`
        naming every unknown one and what to set: ``rank, nodes = env.require("rank",
        "num_nodes")``."""
        from .checked import require

        return require(self, names)


def _runs(hosts: "Sequence[str]") -> str:
    """rank_hosts shortened: consecutive ranks on one host as host*count, at most 4 runs."""
    runs: "list[list[Any]]" = []
    for host in hosts:
        if runs and runs[-1][0] == host:
            runs[-1][1] += 1
        else:
            runs.append([host, 1])
    shown = ",".join(h if n == 1 else f"{h}*{n}" for h, n in runs[:4])
    return shown + (f",... ({len(hosts)} ranks)" if len(runs) > 4 else "")


def _field(name: str) -> property:
    def get(self: DistEnv) -> Any:
        return self._values[name]

    get.__name__ = name
    return property(get, doc=f"The {name.replace('_', ' ')} (None when unknown).")


for _name in FIELDS:
    setattr(DistEnv, _name, _field(_name))
del _name


def _rank_hosts(self: DistEnv) -> Any:
    value = self._values["rank_hosts"]
    if value.__class__ is Later:
        value = _settle(self._values, self.provenance, "rank_hosts")
    return value


setattr(DistEnv, "rank_hosts", property(_rank_hosts, doc=(
    "The host of every global rank (index = rank) where the launch proves it, else None "
    "(see distenv.core.placement).")))

_SET_VALUES = DistEnv.__dict__["_values"].__set__
_SET_PROVENANCE = DistEnv.__dict__["provenance"].__set__
_SET_NOTES = DistEnv.__dict__["notes"].__set__
_EMPTY = dict.fromkeys(FIELDS)


def _fill(self: DistEnv, values: "Mapping[str, Any]", provenance: "dict[str, str]",
          notes: "Iterable[str]") -> None:
    if values.keys() <= _EMPTY.keys():
        fields = _EMPTY.copy()
        fields.update(values)
    else:  # extra keys are not fields: leave them out
        fields = {name: values.get(name) for name in FIELDS}
    hosts = fields["hosts"]
    if hosts is not None and hosts.__class__ is not tuple:
        fields["hosts"] = tuple(hosts)
    hosts = fields["rank_hosts"]
    if hosts is not None and hosts.__class__ is not tuple and hosts.__class__ is not Later:
        fields["rank_hosts"] = tuple(hosts)
    _SET_VALUES(self, fields)
    _SET_PROVENANCE(self, provenance)
    _SET_NOTES(self, tuple(notes))


def _build(values: "Mapping[str, Any]", provenance: "dict[str, str]", notes: "Iterable[str]"
           ) -> DistEnv:
    """A DistEnv owning `provenance` (not copied): for resolve(), which made it fresh."""
    self = object.__new__(DistEnv)
    _fill(self, values, provenance, notes)
    return self
