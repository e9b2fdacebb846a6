"""docs/architecture.md names every module of src/distenv (issue 21): a module added without its
line in the map fails here."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "distenv")


def test_the_module_map_names_every_module():
    with open(os.path.join(ROOT, "docs", "architecture.md")) as fh:
        named = set(re.findall(r"^\| `([\w/]+\.py)` \|", fh.read(), re.M))
    modules = {os.path.relpath(os.path.join(d, f), SRC).replace(os.sep, "/")
               for d, _, files in os.walk(SRC) for f in files if f.endswith(".py")}
    assert modules - named == set(), "modules missing from docs/architecture.md"
    assert named - modules == set(), "docs/architecture.md names modules that do not exist"


def test_the_unit_test_map_names_every_module_and_existing_tests():
    """tests/unit/README.md: one row per module, naming test files that exist (issue 29)."""
    unit = os.path.join(ROOT, "tests", "unit")
    with open(os.path.join(unit, "README.md")) as fh:
        rows = re.findall(r"^\| `([\w/]+\.py)` \| (.+) \|$", fh.read(), re.M)
    rows = [(m, t) for m, t in rows if not m.startswith("test_")]  # "Across modules" rows
    named = {module for module, _ in rows}
    modules = {os.path.relpath(os.path.join(d, f), SRC).replace(os.sep, "/")
               for d, _, files in os.walk(SRC) for f in files if f.endswith(".py")}
    assert modules - named == set(), "modules missing from tests/unit/README.md"
    assert named - modules == set(), "tests/unit/README.md names modules that do not exist"
    for module, tests in rows:
        files = re.findall(r"`([\w/]+\.py)`", tests)
        assert files, f"{module}: no test named"
        absent = [f for f in files if not os.path.isfile(os.path.join(unit, f))]
        assert not absent, f"{module}: {absent} not in tests/unit"
