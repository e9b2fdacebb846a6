"""`distenv doctor`'s ``auto`` section (issue 22, item 6): with DISTENV_AUTO set, is `python`
(and `python3`) on PATH an interpreter whose site-packages hold distenv_auto.pth? One without
it ignores DISTENV_AUTO in silence (nothing of distenv runs there to say so): a warning. Read
from paths only (doctor starts no process); a wrapper script cannot be judged: info.
"""
from __future__ import annotations

import os
import stat

from distenv.doctor import AUTO_PTH, diagnose, site_dirs

ELF = b"\x7fELF" + b"\0" * 60


def _exe(path, content: bytes = ELF):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def venv(root, with_pth: bool):
    """A virtualenv's layout: bin/python, bin/python3, pyvenv.cfg, lib/python3.X/site-packages."""
    _exe(root / "bin" / "python")
    _exe(root / "bin" / "python3")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if with_pth:
        (site / AUTO_PTH).write_text("import os; 'DISTENV_AUTO' in os.environ and __import__('distenv._autostart')\n")
    return root


def auto(environ):
    report = diagnose(environ)
    return report.get("auto"), [f for f in report["findings"] if f["topic"] == "auto"]


def test_an_interpreter_with_distenv_is_ok(tmp_path):
    v = venv(tmp_path / "good", with_pth=True)
    out, findings = auto({"DISTENV_AUTO": "1", "PATH": str(v / "bin")})
    assert out["python"]["distenv_auto"] is True and out["python3"]["distenv_auto"] is True
    assert [f["level"] for f in findings] == ["ok", "ok"], findings
    assert str(v / "lib" / "python3.11" / "site-packages") in findings[0]["message"]


def test_an_interpreter_without_distenv_is_a_warning_with_the_fix(tmp_path):
    v = venv(tmp_path / "bare", with_pth=False)
    out, findings = auto({"DISTENV_AUTO": "1", "PATH": str(v / "bin")})
    assert out["python"]["distenv_auto"] is False
    assert [f["level"] for f in findings] == ["warning", "warning"], findings
    first = findings[0]
    assert f"`python` on PATH ({v / 'bin' / 'python'})" in first["message"]
    assert "starts without distenv, and says nothing" in first["message"]
    assert "distenv run -- python script.py" in first["fix"] and "-m pip install" in first["fix"]
    assert diagnose({"DISTENV_AUTO": "1", "PATH": str(v / "bin")})["status"] == "warning"


def test_the_first_on_PATH_is_the_one_judged(tmp_path):
    bare, good = venv(tmp_path / "bare", False), venv(tmp_path / "good", True)
    _, findings = auto({"DISTENV_AUTO": "1", "PATH": f"{good / 'bin'}{os.pathsep}{bare / 'bin'}"})
    assert {f["level"] for f in findings} == {"ok"}
    _, findings = auto({"DISTENV_AUTO": "1", "PATH": f"{bare / 'bin'}{os.pathsep}{good / 'bin'}"})
    assert {f["level"] for f in findings} == {"warning"}


def test_a_wrapper_cannot_be_judged(tmp_path):
    shims = tmp_path / "shims"
    _exe(shims / "python", b"#!/usr/bin/env bash\nexec pyenv exec python \"$@\"\n")
    out, findings = auto({"DISTENV_AUTO": "1", "PATH": str(shims)})
    assert out["python"]["distenv_auto"] is None
    assert [f["level"] for f in findings] == ["info"] and "is a wrapper" in findings[0]["message"]


def test_a_plain_prefix_and_its_dist_packages(tmp_path):
    """No pyvenv.cfg: the prefix's (and Debian's local) site- and dist-packages."""
    prefix = tmp_path / "usr"
    python = _exe(prefix / "bin" / "python3")
    (prefix / "lib" / "python3" / "dist-packages").mkdir(parents=True)
    local = prefix / "local" / "lib" / "python3.11" / "dist-packages"
    local.mkdir(parents=True)
    assert site_dirs(str(python))[:2] == [str(prefix / "lib" / "python3" / "dist-packages"), str(local)]
    _, findings = auto({"DISTENV_AUTO": "1", "PATH": str(prefix / "bin")})
    assert [f["level"] for f in findings] == ["warning"]
    (local / AUTO_PTH).write_text("")
    _, findings = auto({"DISTENV_AUTO": "1", "PATH": str(prefix / "bin")})
    assert [f["level"] for f in findings] == ["ok"]


def test_nothing_without_DISTENV_AUTO_or_PATH(tmp_path):
    v = venv(tmp_path / "bare", with_pth=False)
    for environ in ({"PATH": str(v / "bin")}, {"DISTENV_AUTO": "0", "PATH": str(v / "bin")},
                    {"DISTENV_AUTO": "1"}):
        out, findings = auto(environ)
        assert out is None and findings == [], environ


def test_this_interpreter_is_judged_like_any_other():
    import sys

    environ = {"DISTENV_AUTO": "1", "PATH": os.path.dirname(sys.executable)}
    out, findings = auto(environ)
    pth = any(os.path.exists(os.path.join(d, AUTO_PTH)) for d in site_dirs(sys.executable))
    assert out["python"]["distenv_auto"] is pth, (out, findings)
