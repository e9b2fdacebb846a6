"""The explicit step that writes the canonical torch variables into an environment."""

from __future__ import annotations

import os

from .fields import DECLINED, PER_NODE
from ..errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import MutableMapping, Sequence

    from .description import DistEnv

# Written for a per-process launch; a per-node launch writes only the node-level ones
# (the workers it will start get their own RANK/LOCAL_RANK from their launcher).
PROCESS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")
NODE_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK")


def variables(env: DistEnv) -> "dict[str, object]":
    """The canonical variables and their values (None where unknown)."""
    values = {
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": env.master_port,
        "RANK": env.rank,
        "WORLD_SIZE": env.world_size,
        "LOCAL_RANK": env.local_rank,
        "LOCAL_WORLD_SIZE": env.local_world_size,
        "NODE_RANK": env.node_rank,
        "GROUP_RANK": env.node_rank,
    }
    keep = NODE_VARS if env.launch == PER_NODE else PROCESS_VARS
    return {k: values[k] for k in keep}


def missing_message(env: DistEnv, names: "Sequence[str]") -> str:
    """Why an incomplete launch cannot be exported, and what to set, in the words of the
    launcher at hand (a plain RANK/WORLD_SIZE run has no mpirun to pass variables on)."""
    launcher = env.provenance.get("launcher", env.launcher)
    problems, fixes = [], []
    declined = [n for n in env.notes if getattr(n, "kind", None) == DECLINED]
    if declined and "MASTER_ADDR" in names:
        # discovery was asked and could not: its reason and fix (a wrapper script that needs
        # `exec`, say), not a generic "set MASTER_ADDR"
        reason, _, fix = declined[-1].partition(" Fix: ")
        problems.append(f"{env.launcher} does not reveal rank 0's host (MASTER_ADDR), and "
                        + reason.rstrip("."))
        fixes.append(fix.rstrip(".") or "set MASTER_ADDR=<rank 0's host> for every rank")
    elif "MASTER_ADDR" in names:
        from ..sources import source_of

        source = source_of(env.launcher)
        passed = source.passing.fill("MASTER_ADDR", "<host>")
        if passed:
            problems.append(f"{env.launcher} does not reveal rank 0's host (MASTER_ADDR) across nodes")
            fixes.append(f"export MASTER_ADDR=<rank 0's host> in the job script and pass it to "
                         f"every rank ({passed})")
        elif source.launch.master_unknown:  # the source's own words (plain RANK/WORLD_SIZE)
            problem, _, fix = source.launch.master_unknown.partition(" Fix: ")
            problems.append(problem)
            fixes.append(fix)
        else:
            problems.append(f"{env.launcher} does not reveal rank 0's host (MASTER_ADDR)")
            fixes.append("set MASTER_ADDR=<rank 0's host> for every rank")
    others = [n for n in names if n != "MASTER_ADDR"]
    if others:
        problems.append(f"{', '.join(others)} not revealed by {env.launcher} ({launcher})")
        fixes.append(f"set {', '.join(others)}, or run `distenv show --explain` to see what is known")
    return ("cannot export an incomplete launch: " + "; ".join(problems)
            + ". Fix: " + "; ".join(fixes) + ".")


def export(env: DistEnv, environ: "MutableMapping[str, str] | None" = None,
           overwrite: bool = False) -> "dict[str, str]":
    """Write MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    NODE_RANK and GROUP_RANK into `environ` (default ``os.environ``).

    A variable that already holds a different value is an error unless `overwrite`;
    one holding the same value is left alone. Unknown fields that a distributed job
    needs (the master address across nodes, say) are an error naming the fix.
    Returns the variables written.
    """
    target: "MutableMapping[str, str]" = os.environ if environ is None else environ
    values = variables(env)
    required: "tuple[str, ...]" = ("MASTER_ADDR", "MASTER_PORT") if env.is_distributed else ()
    if env.launch != PER_NODE and env.is_distributed:
        required += ("RANK", "WORLD_SIZE")
    missing = [k for k in required if values.get(k) is None]
    if missing:
        raise DistEnvError(missing_message(env, missing))
    clashes, stale = [], []
    owned = _owned(env)
    for name, value in values.items():
        if name not in target or overwrite:
            continue
        if value is None:
            # set, but the launch does not prove it: beside the values written here a child
            # would take it for this launch's (a stale GROUP_RANK made Lightning's node rank)
            if name not in owned:
                stale.append(f"{name}={target[name]!r}")
        elif target[name].strip() != str(value):
            clashes.append(f"{name}={target[name]!r} (distenv: {value})")
    if clashes or stale:
        raise DistEnvError(
            ("refusing to overwrite " + ", ".join(clashes) if clashes else "")
            + ("; " if clashes and stale else "")
            + (f"{', '.join(stale)} set, but {_title(env)} does not prove "
               f"{'it' if len(stale) == 1 else 'them'}: a child would take "
               f"{'it' if len(stale) == 1 else 'them'} for this launch's" if stale else "")
            + ". Fix: unset " + " ".join(c.split("=", 1)[0] for c in clashes + stale)
            + " (or, calling export() yourself, pass overwrite=True)."
        )
    written: "dict[str, str]" = {}
    for name, value in values.items():
        if value is None:
            if overwrite and name in target and name not in owned:
                del target[name]
        elif name not in target or target[name].strip() != str(value):
            target[name] = str(value)
            written[name] = str(value)
    return written


def _title(env: DistEnv) -> str:
    from ..sources import source_of

    return source_of(env.launcher).title or str(env.launcher)


def _owned(env: DistEnv) -> "tuple[str, ...]":
    """The canonical variables the launcher or platform sets with its own meaning (GCP's RANK
    is a node index): theirs, not stale."""
    from ..sources import PLATFORMS, source_of

    owns = source_of(env.launcher).owns
    for entry in PLATFORMS:
        if entry.name == env.platform:
            owns += entry.load().owns
    return owns
