"""`distenv` command line: show, export, run, doctor (also `python -m distenv`).

Bare ``distenv`` is ``distenv show``, and takes its options (``distenv --json``).
``distenv --version`` / ``-V`` prints the version.

Every rank of a job may run the command at once (``mpirun -np 4 distenv show``): in a
distributed launch each line of the table, ``--explain`` and ``doctor`` output starts with
``[rank 3]`` (``[node 1]`` for the process of a per-node launch; ``--no-prefix`` turns it
off, ``--prefix`` forces it; JSON and one-line summaries are unprefixed by default: they
carry the rank themselves). ``--ranks 0`` / ``0,2`` / ``0-3`` / ``per-node`` / ``all``
chooses which ranks print (show: all; doctor: per-node, i.e. local rank 0 of each node), and
``--summary`` (``--oneline``) prints one line instead of the report on each rank that prints.
A rank's output is written at once.

``distenv show --map`` (every rank runs it; rank 0 prints, once for the job) is one row per
node: host, global ranks, local size, and the node of rank 0 and the master (`distenv.nodemap`).
"""

from __future__ import annotations

import argparse
import sys

from .errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any, NoReturn

    from .core.description import DistEnv


def _show(args: argparse.Namespace) -> int:
    from . import display
    from .core.resolver import resolve

    env = resolve()
    if getattr(args, "map", False):
        return _map(args, env)
    declined: "list[str]" = []
    if getattr(args, "discover", False):  # collective: before any rank decides not to print
        from .bringup import completed
        from .core.description import DECLINED

        env = completed(env, nodes=True)
        declined = [n for n in env.notes if getattr(n, "kind", None) == DECLINED]
    if not display.chosen(env, args.ranks):
        return 1 if declined else 0
    if any(isinstance(v, str) and ("@" in v or "=" in v or "_" in v) for v in _strings(env)):
        env = _redacted(env)  # a launcher value that looks like a secret is never printed
    if args.json:
        import json

        text = json.dumps(env.to_dict(), sort_keys=False)
    elif args.summary:
        text = summary(env)
    else:
        env = _shortened(env)
        if args.explain:
            text = env.explain()
        else:
            values = env.to_dict()
            width = max(len(k) for k in values)
            lines = []
            for key, value in values.items():
                if key == "hosts" and value:
                    value = display.hosts_text(value)
                elif isinstance(value, list):
                    value = ",".join(map(str, value))
                lines.append(f"{key:<{width}}  {'-' if value is None else value}")
            lines += [f"note: {note}" for note in env.notes]
            text = "\n".join(lines)
    display.write(text, display.label(args.prefix, env, machine=args.json or args.summary))
    if declined:  # --discover was asked for and could not: say so, and fail
        sys.stderr.write(f"distenv: {declined[-1]}\n")
        return 1
    return 0


def _map(args: argparse.Namespace, env: DistEnv) -> int:
    """`distenv show --map`: every rank completes the placement (collective under PMI-1),
    rank 0 prints the map once for the job."""
    from . import display, nodemap

    if args.explain or args.summary:
        args.parser.error("--map prints a table, or JSON with --json: not with --explain or --summary")
    if args.ranks is not None:
        args.parser.error("--map prints once for the job, on rank 0: --ranks does not apply")
    env = nodemap.collect(env)
    if not nodemap.prints(env):
        return 0
    if any(isinstance(v, str) and ("@" in v or "=" in v or "_" in v) for v in _strings(env)):
        env = _redacted(env)
    found = nodemap.build(env)
    if args.json:
        import json

        text = json.dumps(found.to_dict(), sort_keys=False)
    else:
        text = found.text()
    display.write(text, display.label(args.prefix, env, machine=True))
    return 0


def summary(env: DistEnv) -> str:
    """One line: where this process stands, what launched it, where rank 0 listens."""
    from .core.description import PER_NODE

    def of(a: object, b: object) -> str:
        return f"{'?' if a is None else a}/{'?' if b is None else b}"

    if env.launch == PER_NODE:
        place = f"node {of(env.node_rank, env.num_nodes)}, {env.nproc_per_node or '?'} worker(s) to start"
    else:
        place = (f"rank {of(env.rank, env.world_size)} local {of(env.local_rank, env.local_world_size)} "
                 f"node {of(env.node_rank, env.num_nodes)}")
    how = env.launcher + (f" on {env.platform}" if env.platform else "") + f" {env.launch}"
    parts = [place, how]
    if env.is_distributed:
        parts.append(f"master {env.master_addr or '?'}:{env.master_port or '?'}")
    if env.job_id:
        parts.append(f"job {env.job_id}")
    if env.notes:
        parts.append(f"{len(env.notes)} note(s): distenv show --explain")
    from .display import shorten

    return " | ".join(shorten(p) for p in parts)


def _strings(env: DistEnv) -> "Iterator[str | None]":
    yield from (getattr(env, f) for f in ("launcher", "platform", "master_addr", "job_id"))
    yield from env.hosts or ()
    yield from env.provenance.values()
    yield from env.notes


def _redacted(env: DistEnv) -> DistEnv:
    from .core.description import FIELDS, DistEnv
    from .core.redact import redact_text

    def clean(value: object) -> object:
        if isinstance(value, str):
            return redact_text(value)
        if isinstance(value, tuple):
            return tuple(redact_text(v) if isinstance(v, str) else v for v in value)
        return value

    values = {f: clean(getattr(env, f)) for f in FIELDS}
    return DistEnv(values, {k: redact_text(v) for k, v in env.provenance.items()},
                   [redact_text(n) for n in env.notes])


def _shortened(env: DistEnv) -> DistEnv:
    """`env` with long strings cut (display.shorten), for the table and --explain."""
    from .core.description import FIELDS, DistEnv
    from .display import shorten

    values = {f: getattr(env, f) for f in FIELDS}
    return DistEnv({f: shorten(v) for f, v in values.items()},
                   {k: shorten(v) for k, v in env.provenance.items()},
                   [shorten(n) for n in env.notes])


def _export(args: argparse.Namespace) -> int:
    import shlex

    from .core.export import export
    from .core.resolver import resolve

    import os

    from .sources import source_of

    env = resolve()
    if env.job_id is not None and source_of(env.launcher).family == "none":
        # One process inside a job but none of its tasks (a batch script): what it prints
        # would reach every task the script starts, each then a job of one.
        raise DistEnvError(
            f"this process is inside job {env.job_id} ({env.provenance.get('job_id')}) but is "
            "none of its tasks: RANK=0 and WORLD_SIZE=1 printed here would reach every task it "
            "starts, each then a job of one. Fix: run `distenv export` in each task (have the "
            "launcher start bash -c 'eval \"$(distenv export)\"; exec python train.py'), or start "
            "them with `distenv run`.")
    # checked against this environment, into a copy: a variable it holds with another value
    # (or one the launch does not prove) is refused, as export() refuses it; printed: every
    # value, so that the output stands alone (saved, sourced elsewhere)
    export(env, dict(os.environ))
    scratch: "dict[str, str]" = {}
    for name, value in export(env, scratch).items():
        print(f"export {name}={shlex.quote(value)}")
    for note in env.notes:
        sys.stderr.write(f"distenv export: note: {note}\n")
    return 0


def _ranks(text: str) -> "frozenset[int] | str | None":
    from .display import parse_ranks

    try:
        return parse_ranks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def _many_ranks(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--ranks", type=_ranks, default=_ranks(default), metavar="WHICH",
                   help=f"which ranks print: all, per-node (local rank 0 of each node), or "
                   f"numbers such as 0, 0,2 or 0-3 (node numbers in a per-node launch); "
                   f"default: {default}")
    p.add_argument("--prefix", action=argparse.BooleanOptionalAction, default=None,
                   help="start every line with [rank N] (default: on in a distributed launch, "
                   "off for --json and --summary)")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage error ends with the Fix every distenv error carries
    (its subcommands' parsers are of this class too)."""

    def error(self, message: str) -> "NoReturn":
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}. Fix: {self.prog} --help lists what it takes\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="distenv",
        description="Describe this process's place in a distributed launch, under any launcher. "
        "Without a command: show (distenv --json is distenv show --json).",
    )
    parser.add_argument("-V", "--version", action=_Version, nargs=0, version=version_line(__version__),
                        help="print the version, where it is installed, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    show = sub.add_parser(
        "show", help="print the resolved launch (rank, sizes, master, ...)",
        description="Print what distenv resolves from this process's environment: launcher, "
        "rank, local rank, world and local sizes, node rank and count, master address and "
        "port, hosts, each unknown where the launch does not prove it. Run it as every rank "
        "(mpirun -np 2 distenv show): each line starts with [rank N]. --discover asks the "
        "launcher's own service for what the variables leave unknown.")
    mode = show.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="the JSON contract: every field, null if unknown")
    mode.add_argument("--explain", action="store_true", help="which variable or rule gave each field")
    mode.add_argument("--summary", "--oneline", action="store_true",
                      help="one line: rank, local rank, node, launcher, master")
    show.add_argument("--discover", action="store_true",
                      help="ask the launcher's own service for what its variables do not "
                      "reveal (Cray PALS's apinfo file, PMIx, PMI-1: docs/discovery.md); every "
                      "rank must run it. Exit 1, saying why, when no service could be asked")
    show.add_argument("--map", action="store_true",
                      help="one row per node (host, global ranks, local size, rank 0, master), "
                      "printed once by rank 0; asks the launcher's service where the environment "
                      "does not place the ranks: every rank must run it")
    _many_ranks(show, "all")
    show.set_defaults(parser=show, func=_show)
    exp = sub.add_parser(
        "export", help="print `export VAR=value` lines for the torch variables "
        "(use: eval \"$(distenv export)\")",
        description="Print shell lines that export the torch variables of this launch (RANK, "
        "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT), "
        "for a job script: eval \"$(distenv export)\". Exits 2 with one line saying what is "
        "missing when the launch does not prove them.")
    exp.set_defaults(parser=exp, func=_export)
    # `run` parses its own arguments (the command after it is not ours): see main().
    sub.add_parser("run", help="export the launch and run a command; in a per-node launch start "
                   "the workers through torch.distributed.run (distenv run --help)", add_help=False)
    doc = sub.add_parser("doctor", help="check the launch, GPUs, CPU threads and network for "
                         "collectives, report versions, and say what to change (exit 2: the "
                         "environment cannot be resolved; 1: a finding is an error; else 0)")
    doc_mode = doc.add_mutually_exclusive_group()
    doc_mode.add_argument("--json", action="store_true", help="the report as JSON")
    doc_mode.add_argument("--summary", "--oneline", action="store_true",
                          help="one line: status, counts and the first problem")
    doc.add_argument("--probe", action="store_true",
                     help="also check that rank 0's address and port are reachable (opens a socket)")
    doc.add_argument("--timeout", type=float, default=2.0, metavar="S",
                     help="seconds to wait for --probe (default 2)")
    _many_ranks(doc, "per-node")
    doc.set_defaults(parser=doc, func=_doctor)
    return parser


class _Version(argparse.Action):
    """argparse's own version action wraps its text to the terminal's width, breaking a long
    install path across lines: print the line whole."""

    def __init__(self, option_strings: "list[str]", version: str, **kwargs: Any) -> None:
        super().__init__(option_strings, **kwargs)
        self.version = version

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: "str | None" = None) -> None:
        print(self.version)
        parser.exit()


def version_line(version: str) -> str:
    import os

    return (f"distenv {version} from {os.path.dirname(os.path.abspath(__file__))} "
            f"(Python {sys.version.split()[0]})")


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import main as doctor_main

    return doctor_main(args)


#: Words that are not `show`'s options when they come first (bare `distenv --json` is show).
_TOP_LEVEL = ("-h", "--help", "-V", "--version")


def main(argv: "Iterable[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    auto = sys.modules.get("distenv.auto")
    if auto is not None:
        # DISTENV_AUTO=1 activated distenv.auto in this interpreter: the CLI describes the
        # environment it was given, not one that auto exported into.
        auto.deactivate()
    try:
        if argv[:1] == ["run"]:
            from .run import main as run_main

            return run_main(argv[1:])
        if not argv or (argv[0].startswith("-") and argv[0] not in _TOP_LEVEL):
            argv = ["show", *argv]
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            # A word the command does not take: its own usage, not the top level's
            # (argparse leaves a subcommand's unknown options to the top-level parser).
            sub: argparse.ArgumentParser = getattr(args, "parser", parser)
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
        from .knobs import unknown

        if args.func is not _doctor and unknown():  # the doctor reports them in its findings
            from .core.resolver import rank_if_known
            from .log import warn_unknown_knobs  # logging only then: it costs milliseconds

            warn_unknown_knobs(rank=rank_if_known())
        code: int = args.func(args)  # a Namespace attribute is Any: _show, _export or _doctor
        return code
    except DistEnvError as exc:
        from .errors import EXIT_STATUS, error_line, traceback_wanted

        if traceback_wanted():
            import traceback

            traceback.print_exc()
        print(error_line(exc), file=sys.stderr)
        return EXIT_STATUS


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
