"""`DistEnv`: the frozen description of one process's place in a distributed launch."""

from __future__ import annotations

#: The public fields, in the order `distenv show --json` prints them. This is a contract.
FIELDS = (
    "launcher",
    "platform",
    "launch",
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "nproc_per_node",
    "master_addr",
    "master_port",
    "hosts",
    "job_id",
)

PER_PROCESS = "per-process"
PER_NODE = "per-node"


class DistEnv:
    """What launched this process and where it stands in the job.

    Every field the launcher does not reveal is ``None``. ``provenance`` maps each
    field to the variable(s) or rule that produced it; ``notes`` holds warnings
    worth showing a user (e.g. "this is a SLURM batch script, not a task").
    """

    __slots__ = FIELDS + ("provenance", "notes")

    # Annotations for readers and type checkers; values live in the slots.
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
    job_id: "str | None"
    provenance: dict
    notes: tuple

    def __init__(self, values: dict, provenance: "dict | None" = None, notes=()):
        setter = object.__setattr__
        for name in FIELDS:
            value = values.get(name)
            if name == "hosts" and value is not None:
                value = tuple(value)
            setter(self, name, value)
        setter(self, "provenance", dict(provenance or {}))
        setter(self, "notes", tuple(notes))

    def __setattr__(self, name, value):
        raise AttributeError("DistEnv is frozen; use resolve(**overrides) or .replace()")

    __delattr__ = __setattr__

    def __eq__(self, other):
        if not isinstance(other, DistEnv):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in FIELDS)

    def __reduce__(self):
        # Frozen slots defeat pickle's default setattr path; rebuild through __init__.
        return (DistEnv, (self.to_dict(), self.provenance, self.notes))

    def __hash__(self):
        return hash(tuple(getattr(self, f) for f in FIELDS))

    def __repr__(self):
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in FIELDS if f != "hosts")
        return f"DistEnv({inner})"

    # -- convenience -------------------------------------------------------------
    @property
    def is_distributed(self) -> bool:
        """True when more than one worker takes part (or the node must spawn workers)."""
        # An unknown world size (MPICH -pmi-port) is a distributed job we cannot describe fully.
        return self.launch == PER_NODE or self.world_size != 1

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (on node 0 for a per-node launch)."""
        if self.launch == PER_NODE:
            return self.node_rank == 0
        return self.rank == 0

    def replace(self, **changes) -> "DistEnv":
        """A copy with some fields changed (provenance says 'replaced')."""
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise TypeError(f"unknown DistEnv field(s): {', '.join(sorted(unknown))}")
        values = {f: getattr(self, f) for f in FIELDS}
        values.update(changes)
        why = dict(self.provenance)
        for name in changes:
            why[name] = "replaced by the caller"
        return DistEnv(values, why, self.notes)

    def to_dict(self) -> dict:
        """The public JSON contract: exactly FIELDS, ``None`` where unknown."""
        out = {f: getattr(self, f) for f in FIELDS}
        if out["hosts"] is not None:
            out["hosts"] = list(out["hosts"])
        return out

    def explain(self) -> str:
        """One line per field: its value and where it came from."""
        width = max(len(f) for f in FIELDS)
        lines = []
        for name in FIELDS:
            value = getattr(self, name)
            if name == "hosts" and value is not None and len(value) > 8:
                shown = ",".join(value[:4]) + f",... ({len(value)} hosts)"
            elif name == "hosts" and value is not None:
                shown = ",".join(value)
            else:
                shown = "unknown" if value is None else str(value)
            why = self.provenance.get(name, "not revealed by the launcher" if value is None else "")
            lines.append(f"{name:<{width}}  {shown:<16}  {why}".rstrip())
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)

    def export(self, environ=None, overwrite: bool = False) -> dict:
        """Write the canonical torch variables; see `distenv.export.export`."""
        from .export import export

        return export(self, environ, overwrite=overwrite)
