"""`distenv` command line: show, export, run, doctor."""

from __future__ import annotations

import argparse
import sys

from .errors import DistEnvError


def _show(args) -> int:
    from .resolver import resolve

    env = resolve()
    if any(isinstance(v, str) and ("@" in v or "=" in v or "_" in v) for v in _strings(env)):
        env = _redacted(env)  # a launcher value that looks like a secret is never printed
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


def _strings(env):
    yield from (getattr(env, f) for f in ("launcher", "platform", "master_addr", "job_id"))
    yield from env.hosts or ()
    yield from env.provenance.values()
    yield from env.notes


def _redacted(env):
    from .description import FIELDS, DistEnv
    from .redact import redact_text

    def clean(value):
        if isinstance(value, str):
            return redact_text(value)
        if isinstance(value, tuple):
            return tuple(redact_text(v) for v in value)
        return value

    values = {f: clean(getattr(env, f)) for f in FIELDS}
    return DistEnv(values, {k: redact_text(v) for k, v in env.provenance.items()},
                   [redact_text(n) for n in env.notes])


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
    # `run` parses its own arguments (the command after it is not ours): see main().
    sub.add_parser("run", help="export the launch and run a command; in a per-node launch start "
                   "the workers through torch.distributed.run (distenv run --help)", add_help=False)
    doc = sub.add_parser("doctor", help="check the launch, GPUs, CPU threads and network for "
                         "collectives, and say what to change")
    doc.add_argument("--json", action="store_true", help="the report as JSON")
    doc.add_argument("--probe", action="store_true",
                     help="also check that rank 0's address and port are reachable (opens a socket)")
    doc.add_argument("--timeout", type=float, default=2.0, metavar="S",
                     help="seconds to wait for --probe (default 2)")
    doc.set_defaults(func=_doctor)
    return parser


def _doctor(args) -> int:
    from .doctor import main as doctor_main

    return doctor_main(args)


def main(argv=None) -> int:
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
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            args = parser.parse_args(["show"] + argv)
        return args.func(args)
    except DistEnvError as exc:
        from .redact import redact_text

        print(f"distenv: error: {redact_text(' '.join(str(exc).split()))}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
