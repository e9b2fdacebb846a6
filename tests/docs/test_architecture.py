"""docs/architecture.md names every module of src/distenv (issue 21): a module added without its
line in the map fails here. The launchers' rows are generated from each source module's docstring
(issue 41, item 4: a launcher is declared in its own module): `python tests/docs/test_architecture.py`
rewrites them."""
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "distenv")


ARCH = os.path.join(ROOT, "docs", "architecture.md")
BEGIN = "<!-- sources: generated from each module's docstring by tests/docs/test_architecture.py -->"
END = "<!-- end of the generated sources -->"


def sources_rows() -> str:
    """One row per launcher or platform module, in the registry's order: its docstring's first
    paragraph (what it reads), then any source module the registry does not name."""
    sys.path.insert(0, os.path.join(ROOT, "src"))
    try:
        from distenv.sources import LAUNCHERS, NONE, PLATFORMS
    finally:
        sys.path.pop(0)
    order = list(dict.fromkeys(e.module for e in LAUNCHERS + [NONE] + PLATFORMS))
    folder = os.path.join(SRC, "sources")
    rest = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and not f.startswith("_"))
    rows = ["| launcher or platform, in the registry's order | what it reads (its docstring) |", "|---|---|"]
    for module in order + [m for m in rest if m not in order]:
        with open(os.path.join(folder, module + ".py"), encoding="utf-8") as fh:
            doc = ast.get_docstring(ast.parse(fh.read())) or ""
        first = " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")
        rows.append(f"| `sources/{module}.py` | {first} |")
    return "\n".join(rows)


def _block(text: str) -> str:
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")


def _rewritten(text: str) -> str:
    """`text` with the generated block, and nothing else, replaced (by position: a block's old
    text -- once the single letter "X" -- also occurs elsewhere in the prose)."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + sources_rows() + "\n" + text[end:]


def test_the_launchers_rows_are_their_modules_own_words():
    with open(ARCH, encoding="utf-8") as fh:
        text = fh.read()
    assert _block(text) == sources_rows(), "run: python tests/docs/test_architecture.py"
    # once, between the markers: an earlier rewrite by str.replace put five copies in the prose
    assert text.count("| launcher or platform, in the registry's order |") == 1
    assert _rewritten(text) == text


def test_the_rewrite_touches_only_the_block():
    text = f"JAX and X\n{BEGIN}\nX\n{END}\nX again\n"
    out = _rewritten(text)
    assert out.startswith("JAX and X\n") and out.endswith(f"{END}\nX again\n")
    assert _block(out) == sources_rows()


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
    # a launcher's module is tested by its own file (tests/unit/sources/test_<name>.py): no row needed
    by_name = {m for m in modules if re.fullmatch(r"sources/[a-z]\w*\.py", m)
               and os.path.isfile(os.path.join(unit, "sources", "test_" + m[len("sources/"):]))}
    assert modules - named - by_name == set(), "modules missing from tests/unit/README.md"
    assert named - modules == set(), "tests/unit/README.md names modules that do not exist"
    for module, tests in rows:
        files = re.findall(r"`([\w/]+\.py)`", tests)
        assert files, f"{module}: no test named"
        absent = [f for f in files if not os.path.isfile(os.path.join(unit, f))]
        assert not absent, f"{module}: {absent} not in tests/unit"


if __name__ == "__main__":  # rewrite the generated rows
    with open(ARCH, encoding="utf-8") as fh:
        text = fh.read()
    with open(ARCH, "w", encoding="utf-8") as fh:
        fh.write(_rewritten(text))
