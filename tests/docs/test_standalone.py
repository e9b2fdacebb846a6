"""The repository stands alone (issue 29, item 4): a clone holds the evidence its files cite, and
no file depends on where one machine keeps its checkout. Every file `git ls-files` lists is read
(text files; a file with a NUL byte is skipped as binary).

- No file cites the launcher notebook that lived outside the repository (NOTEBOOK below): the
  launcher facts are in docs/launchers.md, and files cite a section of it
  (`docs/launchers.md#pmix`).
- No file holds an absolute path into a machine's checkout or home directory: this checkout's
  own path, or a path under the top-level directories `work` (where the development machines
  keep checkouts), `home`, `Users` or `root` (their home directories; the development machines
  run as root). The exceptions are in NOT_A_MACHINE, each with its reason. System paths the
  project itself uses are not machine paths and are not matched: the Debian launchers under
  `/usr`, the install scripts' default `/opt/distenv-launchers` (`DISTENV_LAUNCHERS_DIR`), run
  directories under `/tmp` (`DISTENV_RUN_DIR`), `/etc/hosts`, `/run/netns`, and the paths inside
  platforms' containers that fixtures and templates quote (`/opt/ml`, `/mnt/batch`, ...).
- Every section a file cites exists: `docs/<page>.md#<anchor>` anywhere, and markdown links
  `[..](<relative>.md#<anchor>)` and `[..](#<anchor>)` in .md files. An anchor is a heading's
  (GitHub's rule) or an explicit `<a id="...">`.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: The notebook's file name, spelled so that this file does not cite it.
NOTEBOOK = "LAUNCHERS" + ".md"


#: Absolute paths under a home or checkout directory that are not a machine's: (file, path) ->
#: why. Nothing else may match.
NOT_A_MACHINE = {
    ("integrations/kubeflow/mpijob.yaml", "/root/.ssh"):
        "inside the job's container (integrations/kubeflow/Dockerfile runs as root): where the "
        "MPI operator mounts the ssh keys",
    ("tests/unit/test_scale_properties.py", "/home/u/rf"):
        "an invented rankfile in a synthetic Open MPI environment: only its presence is read",
}

#: Not inside a longer path or a URL (`a/work/b`, `github.com/root/x`, `./work`, `~/root`).
_MACHINE_PATH = re.compile(r"(?<![\w.~/])(/(?:work|home|Users|root)/[^\s\"'`()<>,;|}]*)")
_DOC_CITATION = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)#([\w-]+)")
_MD_LINK = re.compile(r"\]\(([^()\s#]*)#([\w-]+)\)")
_EXPLICIT_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def tracked() -> dict[str, str]:
    """Every tracked text file: path relative to the root -> its text."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, or no git: {e}")
    files = {}
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data:
            files[name] = data.decode("utf-8", errors="replace")
    return files


FILES = None


def files() -> dict[str, str]:
    global FILES
    if FILES is None:
        FILES = tracked()
    return FILES


def citations_of_the_notebook() -> dict[str, int]:
    return {name: text.count(NOTEBOOK) for name, text in files().items() if NOTEBOOK in text}


def test_no_file_cites_the_notebook_outside_the_repository():
    found = citations_of_the_notebook()
    wrong = dict(found)
    assert not wrong, (
        f"these files cite {NOTEBOOK}, which is not in the repository: cite the section of "
        f"docs/launchers.md that holds the fact instead (docs/launchers.md#<anchor>): {wrong}")




def machine_paths(name: str, text: str) -> list[str]:
    here = str(ROOT)
    own = re.compile(r"(?<![\w.~/])" + re.escape(here) + r"(?![\w.-])")
    hits = [m.group(1) for m in _MACHINE_PATH.finditer(text)]
    hits += [m.group(0) for m in own.finditer(text)]
    # This file names the exempted paths in NOT_A_MACHINE itself.
    mine = {path for _, path in NOT_A_MACHINE} if name == SELF else set()
    return [p for p in hits if (name, p) not in NOT_A_MACHINE and p not in mine]


def test_no_file_holds_a_machine_path():
    found = {}
    for name, text in files().items():
        paths = machine_paths(name, text)
        if paths:
            found[name] = sorted(set(paths))
    assert not found, (
        "absolute paths of one machine's checkout or home: find the checkout from the file's "
        "own location (scripts: $(dirname \"${BASH_SOURCE[0]}\"); Python: __file__), or add the "
        f"path to NOT_A_MACHINE with the reason it is no machine's: {found}")


def test_the_exemptions_are_still_needed():
    """An exemption whose path is gone would let that path come back unnoticed."""
    stale = [key for key in NOT_A_MACHINE if key[1] not in files().get(key[0], "")]
    assert not stale, f"remove these from NOT_A_MACHINE: {stale}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links and inline HTML reduced to their text, lower case,
    everything but letters, digits, '_', '-' and spaces dropped, spaces made '-'."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found = set(_EXPLICIT_ID.findall(text))
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def cited_sections() -> list[tuple[str, str, str]]:
    """(citing file, cited file relative to the root, anchor) for every section citation."""
    out = []
    for name, text in files().items():
        for page, anchor in _DOC_CITATION.findall(text):
            out.append((name, page, anchor))
        if name.endswith(".md"):
            for target, anchor in _MD_LINK.findall(text):
                if "://" in target:
                    continue
                page = os.path.normpath(os.path.join(os.path.dirname(name), target)) if target \
                    else name
                out.append((name, page.replace(os.sep, "/"), anchor))
    return out


def test_every_cited_section_exists():
    cited = cited_sections()
    assert any(page == "docs/launchers.md" for _, page, _ in cited), "no citation found at all"
    missing = []
    known: dict[str, set[str]] = {}
    for name, page, anchor in cited:
        if page not in known:
            text = files().get(page)
            known[page] = anchors(text) if text is not None else set()
        if anchor not in known[page]:
            missing.append(f"{name}: {page}#{anchor}")
    assert not missing, "sections cited that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_launcher_facts_are_in_the_repository():
    """The page the citations point to, with the sections the issue names."""
    text = files()["docs/launchers.md"]
    assert {"variables", "traps", "pmix", "hydra-pmi", "cray-shasta", "apinfo",
            "slurm-conf"} <= anchors(text)
