"""`distenv` command line: show, export (more subcommands register in COMMANDS)."""

from __future__ import annotations

import argparse
import sys

from .errors import DistEnvError


def _show(args) -> int:
    from .resolver import resolve

    env = resolve()
    if args.json:
        import json

        print(json.dumps(env.to_dict(), sort_keys=False))
    elif args.explain:
        print(env.explain())
    else:
        width = max(len(k) for k in env.to_dict())
        for key, value in env.to_dict().items():
            if key == "hosts" and value:
                value = ",".join(value) if len(value) <= 8 else f"{','.join(value[:4])},... ({len(value)})"
            print(f"{key:<{width}}  {'-' if value is None else value}")
        for note in env.notes:
            print(f"note: {note}")
    return 0


def _export(args) -> int:
    import shlex

    from .export import export
    from .resolver import resolve

    env = resolve()
    scratch: dict = {}
    export(env, scratch)
    for name, value in scratch.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distenv",
        description="Describe this process's place in a distributed launch, under any launcher.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    show = sub.add_parser("show", help="print the resolved launch (rank, sizes, master, ...)")
    mode = show.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="the JSON contract: every field, null if unknown")
    mode.add_argument("--explain", action="store_true", help="which variable or rule gave each field")
    show.set_defaults(func=_show)
    exp = sub.add_parser("export", help="print `export VAR=value` lines for the torch variables "
                         "(use: eval \"$(distenv export)\")")
    exp.set_defaults(func=_export)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["show"] + list(argv or sys.argv[1:]))
    try:
        return args.func(args)
    except DistEnvError as exc:
        print(f"distenv: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
