"""Install lines that work before distenv is on a package index (issue 22, item 3): no page says
``pip install 'distenv[...]'`` except in the git URL form (``'distenv[x] @ git+https://...'``),
and the README's extras table has a row for every extra pyproject.toml defines."""
from __future__ import annotations

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                             recursive=True))]


def offending(line: str) -> bool:
    """`pip install 'distenv[x]'` (an index install) outside the git URL form."""
    return any(not line[m.end():].lstrip().startswith("@ git+")
               for m in re.finditer(r"pip install [\"']?distenv\[[^\]]*\][\"']?", line))


def test_the_check_sees_both_forms():
    assert offending("pip install 'distenv[jax]'          # jax (CPU wheel)")
    assert offending("Install: `pip install 'distenv[lightning]'` (or ...)")
    assert not offending("pip install 'distenv[lightning] @ git+https://<git-host>/<owner>/distenv.git'")
    assert not offending("pip install '.[jax]'")
    assert not offending("so `pip install distenv` finds nothing")  # says why it is not used


def test_no_index_install_lines():
    bad = []
    for page in PAGES:
        with open(page, encoding="utf-8") as fh:
            bad += [f"{os.path.relpath(page, ROOT)}:{number}: {line.strip()}"
                    for number, line in enumerate(fh, 1) if offending(line)]
    assert not bad, "distenv is on no index: use pip install '.[x]' or the git URL form:\n" + "\n".join(bad)


def _extras() -> "set[str]":
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return set(tomllib.load(fh)["project"]["optional-dependencies"])


def test_the_extras_table_lists_every_extra():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    table = text[text.index("| extra | installs |"):]
    table = table[: table.index("\n\n")]
    listed = {name for row in table.splitlines()[2:] for name in re.findall(r"`([\w-]+)`", row.split("|")[1])}
    assert _extras() - listed == set(), f"README's extras table lacks {sorted(_extras() - listed)}"


def test_the_readme_shows_pip_install_before_the_test_setup():
    """A user reads how to install with pip first; integrations/setup.sh is the test suite's."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    assert "pip install ." in text and "bash integrations/setup.sh" in text
    assert text.index("pip install .") < text.index("bash integrations/setup.sh")
