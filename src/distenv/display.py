"""How the command line shows values and many ranks' output: one place, used by `distenv
show` and `distenv doctor` alike.

* `shorten`: a value longer than `MAX_VALUE` characters (a 100 kB ``TF_CONFIG``, a job id)
  is cut to its start and its length, after redaction (so a secret is never cut in half
  into something that no longer looks like one).
* `clip`: a doctor's finding is printed whole up to `MAX_MESSAGE` characters; a longer one
  is cut with a pointer to where it is whole (``distenv doctor --json``).
* `rank_label`, `parse_ranks`, `chosen`: the ``[rank 3]`` prefix and ``--ranks`` selection
  when every rank of a job runs the same command (``mpirun -np 4 distenv doctor``).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing stays out of the command's start (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from .core.description import DistEnv

#: Longest value shown whole; longer ones keep their first `KEEP` characters.
MAX_VALUE = 200
KEEP = 120
#: Longest finding (distenv's own sentence, the values in it already cut) the doctor prints
#: whole; a longer one is cut and says where the whole text is (`clip`).
MAX_MESSAGE = 2000
#: `--ranks` value: one process per node, the one with local rank 0 (a per-node launch's
#: process stands for its node).
PER_NODE = "per-node"


def shorten(value: Any) -> Any:
    """`value` unchanged if short (or not text), else its start and its length."""
    if isinstance(value, str) and len(value) > MAX_VALUE:
        return f"{value[:KEEP]}... ({len(value)} chars)"
    if isinstance(value, (tuple, list)):
        return type(value)(shorten(v) for v in value)
    return value


def clip(text: str, limit: int = MAX_MESSAGE, whole: str = "distenv doctor --json") -> str:
    """`text` unchanged up to `limit` characters, else cut and saying where the whole text is."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars; the whole text: {whole})"


def hosts_text(hosts: "Iterable[str]") -> str:
    """A host list, its first four and the count when longer than eight."""
    hosts = [shorten(h) for h in hosts]
    if len(hosts) <= 8:
        return ",".join(hosts)
    return f"{','.join(hosts[:4])},... ({len(hosts)} hosts)"


def rank_label(env: "DistEnv | None") -> str:
    """``rank 3`` (``node 1`` for the process of a per-node launch); the host and process
    id when the description has neither (an unknown rank is never guessed)."""
    from .core.description import PER_NODE as LAUNCH_PER_NODE

    if env is not None and env.launch != LAUNCH_PER_NODE and env.rank is not None:
        return f"rank {env.rank}"
    if env is not None and env.launch == LAUNCH_PER_NODE and env.node_rank is not None:
        return f"node {env.node_rank}"
    return f"{os.uname().nodename} pid {os.getpid()}"


#: Where a launcher's own options end: the command it starts (the usual ones).
_COMMANDS = ("python", "pypy", "distenv", "bash", "sh", "env", "timeout")


def launcher_labels(environ: "dict[str, str] | None" = None, proc: str = "/proc") -> "str | None":
    """How the launcher already starts every output line with the rank (``srun --label``,
    ``mpirun --tag-output``, ``mpiexec -l``), or None: then distenv adds no ``[rank N]`` of
    its own. From the environment where the launcher says so (SLURM_LABELIO, Open MPI 4's
    OMPI_MCA_orte_tag_output), else from the options of a launcher among this process's
    nearest ancestors on this node (Open MPI 5 and Hydra say it nowhere else)."""
    env = os.environ if environ is None else environ
    from .sources import label_sources

    for source in label_sources():  # each launcher's own way of saying so (PassOn.label_var)
        if source.passing.label_var is not None:
            var, yes, option = source.passing.label_var
            value = env.get(var, "").strip().lower()
            if (value in yes) if yes else value not in ("", "0"):
                return option
    pid = os.getpid()
    for _ in range(3):  # the rank's parent is the launcher or its daemon; a shell may sit between
        try:
            with open(f"{proc}/{pid}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            pid = int(stat.rsplit(")", 1)[1].split()[1])
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
        except (OSError, ValueError, IndexError):
            return None
        found = _tagging(argv)
        if found is not None:
            return found
        if pid <= 1:
            return None
    return None


def _tag_options(program: str) -> "tuple[str, ...]":
    """The options of `program` that label lines, from every source that declares some
    (`PassOn.label_options`; "mpiexec.*" matches an mpiexec.<suffix> no source names)."""
    from .sources import label_sources

    out: "list[str]" = []
    for name in (program, program.split(".", 1)[0] + ".*" if "." in program else None):
        for source in label_sources():  # a program some source names wins over a pattern
            out.extend(o for o in source.passing.label_options.get(name or "", ()) if o not in out)
        if out:
            break
    return tuple(out)


def _tagging(argv: "list[str]") -> "str | None":
    """`launcher_labels` for one ancestor's command line."""
    if not argv or not argv[0]:
        return None
    program = os.path.basename(argv[0])
    options = _tag_options(program)
    if not options:
        return None
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--" or os.path.basename(arg).startswith(_COMMANDS):
            break
        if arg in options:
            return f"{program} {arg}"
        if arg in ("--output", "-output") and "tag" in (argv[i + 1] if i + 1 < len(argv) else "").split(","):
            return f"{program} {arg} {argv[i + 1]}"
        if arg.startswith(("--output=", "-output=")) and "tag" in arg.partition("=")[2].split(","):
            return f"{program} {arg}"
    return None


def parse_ranks(spec: str) -> "frozenset[int] | str | None":
    """``all`` -> None; ``per-node``; ``0``, ``0,2``, ``0-3,8`` -> a frozenset of ranks.
    Raises ValueError with the accepted forms."""
    text = spec.strip().lower()
    if text == "all":
        return None
    if text in (PER_NODE, "node", "nodes"):
        return PER_NODE
    ranks: "set[int]" = set()
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()):
                raise ValueError
            ranks.update(range(int(lo), int(hi if dash else lo) + 1))
    except ValueError:
        raise ValueError(f"--ranks {spec!r}: expected all, per-node, or rank numbers "
                         "(0 / 0,2 / 0-3)") from None
    if not ranks:
        raise ValueError(f"--ranks {spec!r}: no rank given")
    return frozenset(ranks)


def chosen(env: "DistEnv | None", ranks: "frozenset[int] | str | None") -> bool:
    """Does this process print under `ranks` (from `parse_ranks`)? A process whose place
    is unknown prints (never hidden on a guess). In a per-node launch the numbers are node
    ranks: its processes are the nodes."""
    from .core.description import PER_NODE as LAUNCH_PER_NODE

    if ranks is None or env is None:
        return True
    per_node_launch = env.launch == LAUNCH_PER_NODE
    if ranks == PER_NODE:
        if per_node_launch:
            return True
        return env.local_rank is None or env.local_rank == 0
    index = env.node_rank if per_node_launch else env.rank
    return index is None or index in ranks


def prefixed(text: str, label: "str | None") -> str:
    """Every line of `text` with ``[label] `` in front (no change when label is None)."""
    if label is None:
        return text
    return "\n".join(f"[{label}] {line}" if line else f"[{label}]" for line in text.split("\n"))


def label(prefix: "bool | None", env: "DistEnv | None", machine: bool) -> "str | None":
    """The line prefix: `prefix` (--prefix/--no-prefix) when given, else on in a distributed
    launch for text meant for people (off for JSON and one-line summaries, which name the
    rank), unless the launcher labels every line itself (srun --label, mpirun --tag-output,
    mpiexec -l)."""
    on = prefix if prefix is not None else (
        not machine and (env is None or env.is_distributed) and launcher_labels() is None)
    return rank_label(env) if on else None


def write(text: str, label: "str | None") -> None:
    """`text` with every line prefixed by `label`, in one write per rank: its lines stay
    together as far as the launcher's forwarding allows."""
    import sys

    sys.stdout.write(prefixed(text, label) + "\n")
    sys.stdout.flush()
