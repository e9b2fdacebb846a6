"""distenv's diagnostics go through `logging` (distenv.log): a handler only when the
application has none, no double printing once it configures logging, and no bare writes to
stderr left in library code."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "distenv")


def _py(code: str, **env):
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.path.join(ROOT, "src"), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          capture_output=True, text=True, timeout=60)


def test_without_application_logging_messages_reach_stderr_once():
    p = _py("""
        from distenv.log import get_logger
        get_logger("torch").info("2 of 4 ranks joined; waiting for 2, 3")
        get_logger("distenv.run").debug("hidden at the default level")
        """)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == ["distenv.torch: info: 2 of 4 ranks joined; waiting for 2, 3"]
    assert p.stdout == ""


def test_level_from_DISTENV_LOG_LEVEL():
    p = _py("""
        from distenv.log import get_logger
        get_logger("x").info("quiet")
        get_logger("x").warning("loud")
        """, DISTENV_LOG_LEVEL="warning")
    assert p.stderr.splitlines() == ["distenv.x: warning: loud"]


def test_application_configured_logging_takes_over_even_after_the_first_message():
    p = _py("""
        import logging, sys
        from distenv.log import get_logger
        log = get_logger("torch")
        log.warning("before")
        logging.basicConfig(stream=sys.stdout, format="APP %(name)s %(levelname)s %(message)s")
        log.warning("after")
        """)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == ["distenv.torch: warning: before"]
    assert p.stdout.splitlines() == ["APP distenv.torch WARNING after"]


def test_application_handlers_present_first_no_distenv_handler():
    p = _py("""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="APP %(message)s")
        from distenv.log import get_logger
        get_logger("torch").info("joined")
        print(len(logging.getLogger("distenv").handlers))
        """)
    assert p.stdout.splitlines() == ["APP joined", "0"] and p.stderr == ""


def test_stderr_is_looked_up_at_each_message(capsys):
    import io
    import logging

    from distenv import log as dlog

    handler = dlog._Fallback()
    handler.setFormatter(dlog._Format("%(message)s"))
    record = logging.LogRecord("distenv.t", logging.WARNING, __file__, 1, "m %s", ("x",), None)
    buf = io.StringIO()
    old, sys.stderr = sys.stderr, buf
    root_handlers = logging.getLogger().handlers[:]
    logging.getLogger().handlers.clear()  # pytest's capture handler: the fallback would step aside
    try:
        handler.emit(record)
    finally:
        sys.stderr = old
        logging.getLogger().handlers[:] = root_handlers
    assert buf.getvalue() == "distenv.t: warning: m x\n"


def _bare_stderr_writes(path):
    """(line, text) of print(..., file=sys.stderr), sys.stderr.write and warnings.warn."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "write" and ast.unparse(f.value) == "sys.stderr":
            found.append((node.lineno, ast.unparse(node)[:80]))
        if isinstance(f, ast.Attribute) and f.attr == "warn" and ast.unparse(f.value) == "warnings":
            found.append((node.lineno, ast.unparse(node)[:80]))
        if isinstance(f, ast.Name) and f.id == "print" and any(
                k.arg == "file" and "stderr" in ast.unparse(k.value) for k in node.keywords):
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


#: The command line's own user output (usage, its error line) is not a library diagnostic;
#: nor is the line that ends a process on an uncaught DistEnvError (errors.py's excepthook,
#: and _autostart.py's at interpreter start): it stands where Python's traceback would, on
#: stderr whatever logging is configured (tests/unit/test_errors_one_line.py).
CLI_OUTPUT = {"cli.py", "run.py", "doctor.py", "errors.py", "_autostart.py"}


def test_library_code_writes_no_bare_stderr():
    offenders = []
    for dirpath, _, files in os.walk(SRC):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), SRC)
            if not name.endswith(".py") or rel in CLI_OUTPUT:
                continue
            offenders += [(rel, *hit) for hit in _bare_stderr_writes(os.path.join(dirpath, name))]
    assert offenders == [], "use distenv.log.get_logger(__name__) instead: " + repr(offenders)


def test_the_scan_sees_both_forms(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import sys\nsys.stderr.write('x')\nprint('y', file=sys.stderr)\nprint('ok')\n"
                 "import warnings\nwarnings.warn('z')\n")
    assert [line for line, _ in _bare_stderr_writes(str(f))] == [2, 3, 6]
