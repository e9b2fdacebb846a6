"""The knob registry (`distenv.knobs`, issue 29 item 2): every ``DISTENV_*`` name distenv reads is
registered with its parser, default and meaning; no module spells one outside the registry;
docs/knobs.md is generated from it; a name that is none of them -- a misspelled DISTENV_AUTO --
gets one warning naming the nearest one, and `distenv doctor` counts it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from distenv import DistEnvError, knobs, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "distenv")
#: A DISTENV_* name as a whole token (not a test function's name, nor a prefix like DISTENV_PY_).
TOKEN = re.compile(r"(?<![A-Za-z0-9])DISTENV_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_])")
NAME = re.compile(r"^DISTENV_[A-Z0-9_]*[A-Z0-9]$")
#: Names the docs, messages and tests spell wrong on purpose, as examples of what is warned about.
MISSPELLED = {"DISTENV_AUOT", "DISTENV_LAUCHER", "DISTENV_TIMOUT", "DISTENV_NPROC_PER_NOD",
              "DISTENV_ZZZ_NOT_A_KNOB"}


def _sources():
    for folder, _, files in os.walk(SRC):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8") as fh:
                    yield os.path.relpath(path, SRC), fh.read()


def spelled(text: str):
    """(line, name) of each string constant that is exactly a DISTENV_* name -- a read or a
    write by name -- outside f-strings (messages name knobs through the Knob)."""
    tree = ast.parse(text)
    in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and NAME.match(node.value) and id(node) not in in_fstrings:
            yield node.lineno, node.value


def test_the_scan_finds_names_spelled_outside_the_registry():
    text = ('a = os.environ.get("DISTENV_TIMEOUT")\nb = env["DISTENV_AUTO"]\n'
            'c = "DISTENV_PMI" in env\nd = f"set DISTENV_TIMEOUT={x}"\ne = "Fix: set DISTENV_AUTO=1"\n'
            'f = knobs.TIMEOUT.value(env)\n')
    assert list(spelled(text)) == [(1, "DISTENV_TIMEOUT"), (2, "DISTENV_AUTO"), (3, "DISTENV_PMI")]


def test_no_module_spells_a_name_outside_the_registry():
    """Every read (and write) of a DISTENV_* variable goes through its `Knob`."""
    found = [f"{path}:{line}: {name}" for path, text in _sources() if path != "knobs.py"
             for line, name in spelled(text)]
    assert not found, "spell these through distenv.knobs: " + ", ".join(found)


def test_every_name_the_package_mentions_is_registered():
    """Messages and docstrings name only knobs that exist (and so are documented)."""
    found = sorted({f"{path}: {name}" for path, text in _sources() for name in TOKEN.findall(text)
                    if not knobs.known(name) and name not in MISSPELLED})
    assert not found, found


def test_every_name_the_repository_uses_is_known():
    """The test suite's and the scripts' names are registered as development names, so that a
    CI or developer environment draws no warning -- and a new one cannot be forgotten."""
    found = set()
    for top in ("tests", "integrations", "benchmarks", ".ci", "examples", "docs"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".txt")) \
                        or f in ("run",):
                    with open(os.path.join(folder, f), encoding="utf-8", errors="replace") as fh:
                        found |= {(os.path.join(top, f), n) for n in TOKEN.findall(fh.read())}
    for f in ("README.md", "tox.ini", "pyproject.toml", "CONTRIBUTING.md"):
        if os.path.exists(os.path.join(ROOT, f)):
            with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
                found |= {(f, n) for n in TOKEN.findall(fh.read())}
    unknown = sorted(f"{where}: {n}" for where, n in found if not knobs.known(n) and n not in MISSPELLED)
    assert not unknown, unknown


def test_docs_knobs_md_is_the_registry():
    with open(os.path.join(ROOT, "docs", "knobs.md"), encoding="utf-8") as fh:
        text = fh.read()
    assert text == knobs.markdown() + "\n", (
        "docs/knobs.md differs from the registry: regenerate it with "
        "python -c 'import distenv.knobs as k; print(k.markdown())' > docs/knobs.md")


@pytest.mark.parametrize("wrong, right", [("DISTENV_AUOT", "DISTENV_AUTO"),
                                          ("DISTENV_LAUCHER", "DISTENV_LAUNCHER"),
                                          ("DISTENV_TIMOUT", "DISTENV_TIMEOUT"),
                                          ("DISTENV_NPROC_PER_NOD", "DISTENV_NPROC_PER_NODE")])
def test_a_misspelled_name_gets_the_nearest_one(wrong, right):
    env = {wrong: "1", "DISTENV_TIMEOUT": "5", "DISTENV_PY_JAX": "/x", "DISTENV_REQUIRE_LAUNCHERS": "1"}
    assert knobs.unknown(env) == [(wrong, right)]
    line = knobs.unknown_message(wrong, right)
    assert f"did you mean {right}?" in line and line.count("\n") == 0 and "Fix:" in line


def test_a_name_far_from_any_gets_no_guess():
    assert knobs.unknown({"DISTENV_ZZZ_NOT_A_KNOB": "1"}) == [("DISTENV_ZZZ_NOT_A_KNOB", None)]
    assert knobs.unknown({"SLURM_PROCID": "0", "DISTENV_AUTO": "1"}) == []


@pytest.mark.parametrize("given", [0, -1, "abc", float("nan"), "0"])
def test_a_timeout_given_to_any_adapter_is_checked_once(given):
    """knobs.timeout is every adapter's wait limit: a value given in code that is not a positive
    number is one error, whichever adapter got it (it used to be JAX's check only)."""
    with pytest.raises(DistEnvError, match=r"timeout=.* is not a positive number of seconds\. Fix: "):
        knobs.timeout({}, given)
    assert knobs.timeout({"DISTENV_TIMEOUT": "5"}, 2.5) == 2.5 and knobs.timeout({"DISTENV_TIMEOUT": "5"}) == 5.0


def test_parsers_and_defaults():
    assert knobs.TIMEOUT.value({}) == 180.0 and knobs.TIMEOUT.value({"DISTENV_TIMEOUT": " 7.5 "}) == 7.5
    with pytest.raises(DistEnvError, match="DISTENV_TIMEOUT='-1' is not a positive number"):
        knobs.TIMEOUT.value({"DISTENV_TIMEOUT": "-1"})
    for off in ("0", "no", "OFF", "false"):
        assert knobs.PMI.value({"DISTENV_PMI": off}) is False and knobs.AUTO.value({"DISTENV_AUTO": off}) is False
    assert knobs.PMI.value({}) is True and knobs.AUTO.value({}) is False
    assert knobs.AUTO.value({"DISTENV_AUTO": "1"}) is True and knobs.AUTO.value({"DISTENV_AUTO": " "}) is False
    assert knobs.HOROVOD_CONTROLLER.value({}) == "auto"
    with pytest.raises(DistEnvError, match="DISTENV_HOROVOD_CONTROLLER='nccl' is not one of auto, mpi, gloo"):
        knobs.HOROVOD_CONTROLLER.value({"DISTENV_HOROVOD_CONTROLLER": "nccl"})
    with pytest.raises(DistEnvError, match="DISTENV_TF_PORT"):
        knobs.TF_PORT.value({"DISTENV_TF_PORT": "70000"})
    assert knobs.TF_PORT.value({"DISTENV_TF_PORT": "23456"}) == 23456


def test_the_pth_line_knows_the_short_names():
    """The .pth line imports distenv at interpreter start only for DISTENV_AUTO or for an unknown
    name as short as it (DISTENV_AUOT); its list of short known names is the registry's."""
    with open(os.path.join(ROOT, "src", "distenv_auto.pth"), encoding="utf-8") as fh:
        line = fh.read()
    listed = set(re.search(r"not in \(([^)]*)\)\s*for k", line).group(1).replace('"', "").replace(" ", "")
                 .split(","))
    names = list(knobs.KNOBS) + list(knobs.DEVELOPMENT_NAMES)
    short = {n[8:] for n in names if 2 < len(n) - 8 < 6}
    assert listed == short


def _python(env_extra, code="print('trained')"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTENV_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


def _pth_installed():
    import sysconfig

    path = os.path.join(sysconfig.get_paths()["purelib"], "distenv_auto.pth")
    with open(os.path.join(ROOT, "src", "distenv_auto.pth"), encoding="utf-8") as fh:
        want = fh.read()
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != want:
        pytest.fail(f"{path} is not src/distenv_auto.pth: reinstall (pip install -e .)")


def test_a_misspelled_DISTENV_AUTO_warns_once_in_a_plain_script():
    """The user's case: a script that never imports distenv, DISTENV_AUTO misspelled. It used to
    train undistributed without a word."""
    _pth_installed()
    p = _python({"DISTENV_AUOT": "1"})
    assert p.returncode == 0 and p.stdout == "trained\n"
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and "DISTENV_AUOT" in lines[0] and "did you mean DISTENV_AUTO?" in lines[0], p.stderr
    # rank 1 of a launch stays quiet: one line per job
    p = _python({"DISTENV_AUOT": "1", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "23456"})
    assert p.returncode == 0 and p.stderr == "", p.stderr
    # known names (a user's DISTENV_TIMEOUT, the suite's own) do not even load distenv
    p = _python({"DISTENV_TIMEOUT": "9", "DISTENV_REQUIRE_LAUNCHERS": "1"},
                "import sys; print('distenv' in sys.modules)")
    assert p.stdout == "False\n" and p.stderr == ""


def test_the_cli_warns_and_the_doctor_counts_it():
    p = subprocess.run([sys.executable, "-m", "distenv", "show", "--json"], capture_output=True, text=True,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("DISTENV_")},
                            "DISTENV_LAUCHER": "env"}, timeout=60)
    assert p.returncode == 0
    assert [ln for ln in p.stderr.splitlines() if "DISTENV_LAUCHER" in ln and "DISTENV_LAUNCHER" in ln], p.stderr
    from distenv.doctor import diagnose

    report = diagnose({"DISTENV_AUOT": "1", "PATH": "/usr/bin"})
    found = [f for f in report["findings"] if f["topic"] == "knobs"]
    assert [f["level"] for f in found] == ["warning"] and "DISTENV_AUTO" in found[0]["message"]
    assert diagnose({"PATH": "/usr/bin"})["findings"] == [f for f in diagnose({"PATH": "/usr/bin"})["findings"]
                                                         if f["topic"] != "knobs"]


def test_the_readme_lists_every_launcher_name_distenv_launcher_takes():
    """DISTENV_LAUNCHER's valid names were listed nowhere but in its error: the README's
    override table holds them, and this keeps them the registry's."""
    import re

    from distenv.sources import names

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        row = next(line for line in fh if line.startswith("| `resolve(launcher="))
    listed = re.findall(r"`([\w.]+)`", row.partition("The names:")[2])
    assert listed == names(), (listed, names())


@pytest.mark.parametrize("name, value, said, good", [
    ("DISTENV_TIMEOUT", "abc", "positive number of seconds", "300"),
    ("DISTENV_TIMEOUT", "-3", "positive number of seconds", "0.5"),
    ("DISTENV_TF_PORT", "99999", "DISTENV_TF_PORT", "23456"),
    ("DISTENV_HOROVOD_CONTROLLER", "tcp", "auto, mpi, gloo", "gloo"),
    ("DISTENV_GATHER", "zz", "mpi4py", "mpi4py"),
    ("DISTENV_LOG_LEVEL", "loud", "debug, info", "debug"),
])
def test_the_doctor_reports_a_value_its_knob_refuses(name, value, said, good):
    """`DISTENV_TIMEOUT=abc` got "0 errors" from the doctor, then the job died on it at the
    rendezvous: every knob's value goes through its parser, an error with the knob's Fix."""
    from distenv.doctor import diagnose

    found = [f for f in diagnose({name: value, "PATH": "/usr/bin"})["findings"] if f["topic"] == "knobs"]
    assert [f["level"] for f in found] == ["error"], found
    assert name in found[0]["message"] and said in found[0]["message"], found
    assert found[0].get("fix"), found
    assert not [f for f in diagnose({name: good, "PATH": "/usr/bin"})["findings"] if f["topic"] == "knobs"]


def test_the_doctor_command_exits_1_on_a_bad_knob_value():
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DISTENV_")}, "DISTENV_TIMEOUT": "abc"}
    p = subprocess.run([sys.executable, "-m", "distenv", "doctor", "--summary"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "DISTENV_TIMEOUT='abc'" in p.stdout and "Fix: " in p.stdout, p.stdout


def test_a_side_ports_variable_is_parsed_by_its_knob():
    """DISTENV_TF_PORT (any side port's DISTENV_* name) goes through its knob: its parser's
    words for a value that is no port, blank as unset; a port too high to start `width`
    consecutive ones names that."""
    env = resolve({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    with pytest.raises(DistEnvError) as err:
        knobs.side_port(env, "tf", {"DISTENV_TF_PORT": "abc"}, knobs.TF_PORT)
    with pytest.raises(DistEnvError) as by_knob:
        knobs.TF_PORT.value({"DISTENV_TF_PORT": "abc"})
    assert str(err.value) == str(by_knob.value)
    assert knobs.side_port(env, "tf", {"DISTENV_TF_PORT": " "}, knobs.TF_PORT) == \
        knobs.side_port(env, "tf", {}, knobs.TF_PORT)  # blank: unset, the derived port
    assert knobs.side_port(env, "tf", {"DISTENV_TF_PORT": "65530"}, knobs.TF_PORT, width=6) == 65530
    with pytest.raises(DistEnvError, match=r"DISTENV_TF_PORT='65531' cannot be the first of 6 TCP ports"):
        knobs.side_port(env, "tf", {"DISTENV_TF_PORT": "65531"}, knobs.TF_PORT, width=6)
