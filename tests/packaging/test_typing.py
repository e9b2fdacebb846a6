"""Typing: `mypy --strict` (pyproject's [tool.mypy]) is clean on every module of src/distenv,
and a user's code gets a narrowing path from ``int | None`` to ``int``."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from packaging_util import ROOT, missing

SRC = os.path.join(ROOT, "src", "distenv")

#: Every module of src/distenv (all are typed: a new one, a launcher's say, needs no line here).
TYPED = sorted(os.path.relpath(os.path.join(d, f), SRC).replace(os.sep, "/")
               for d, _, files in os.walk(SRC) for f in files if f.endswith(".py"))


def mypy(*args, cwd=ROOT):
    if importlib.util.find_spec("mypy") is None:
        missing(f"mypy is not installed in {sys.executable}: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           os.path.join(ROOT, "pyproject.toml"), "--no-error-summary", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MYPYPATH": os.path.join(ROOT, "src")})


def test_typed_modules_pass_mypy_strict():
    assert "core/resolver.py" in TYPED and len(TYPED) > 50, TYPED  # the package, not another folder
    paths = [os.path.join(SRC, m) for m in TYPED]
    # follow-imports=silent: the modules they import are analysed (their types count) but only
    # the listed ones must be free of errors.
    p = mypy("--follow-imports=silent", *paths)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout[-5000:] + p.stderr[-2000:]


def test_the_narrowing_path(tmp_path):
    """`env.rank` is `int | None` (a strict checker refuses it as an int); `env.checked().rank`
    and `env.require(...)` values are accepted."""
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent("""
        import distenv

        env = distenv.resolve()
        view = env.checked()
        rank: int = view.rank
        world: int = view.world_size
        addr: str = view.master_addr
        port: int = view.master_port
        (nodes,) = env.require("num_nodes")
        n: int = nodes
        main: bool = view.is_main
        node: "int | None" = view.node_rank
    """))
    p = mypy("--follow-imports=silent", str(good), cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr

    bad = tmp_path / "bad.py"
    bad.write_text("import distenv\n\nrank: int = distenv.resolve().rank\n")
    p = mypy("--follow-imports=silent", str(bad), cwd=str(tmp_path))
    assert p.returncode == 1 and 'bad.py:3: error: Incompatible types in assignment (expression has ' \
        'type "int | None", variable has type "int")' in p.stdout, p.stdout + p.stderr

