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
