"""The path of a user who skips integrations/setup.sh: build the sdist and the wheel (the wheel
from the sdist, as `python -m build` does), install the wheel into a fresh virtualenv without
any index (the core has no dependencies), and use it there -- away from this checkout.

Also what the built metadata promises: the license, typing marker, the DISTENV_AUTO hook, no
dependency of the core, no exact pin in an extra, README links that work on a package index.
"""

import email
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

from packaging_util import ROOT, clean_env

from distenv import FIELDS

PYPROJECT = os.path.join(ROOT, "pyproject.toml")


def _version_in_pyproject() -> str:
    with open(PYPROJECT, encoding="utf-8") as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


def _metadata(wheel: str) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(name))


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory):
    """A fresh virtualenv with only the wheel installed (no index, no dependencies)."""
    d = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True, timeout=300,
                   env=clean_env())
    p = subprocess.run([str(d / "bin" / "python"), "-m", "pip", "install", "--no-index",
                        "--no-deps", built.wheel], capture_output=True, text=True, timeout=300,
                       env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def run(venv, *args, env=None, cwd=None):
    # cwd away from the checkout: `python -m distenv` must not find ./src by accident.
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120,
                          env=env or clean_env(), cwd=cwd or str(venv))


def test_wheel_contents(built):
    with zipfile.ZipFile(built.wheel) as z:
        names = set(z.namelist())
    version = _version_in_pyproject()
    assert os.path.basename(built.wheel) == f"distenv-{version}-py3-none-any.whl"
    assert "distenv/py.typed" in names                      # PEP 561: type checkers use it
    assert "distenv_auto.pth" in names                      # DISTENV_AUTO=1 at interpreter start
    assert f"distenv-{version}.dist-info/licenses/LICENSE" in names
    assert "distenv/__init__.py" in names and "distenv/sources/openmpi.py" in names
    # Nothing but the package, its hook and metadata.
    stray = {n for n in names if not n.startswith(("distenv/", f"distenv-{version}.dist-info/"))}
    assert stray == {"distenv_auto.pth"}, stray


def test_sdist_contents(built):
    version = _version_in_pyproject()
    with tarfile.open(built.sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "src/distenv/py.typed",
                   "src/distenv_auto.pth", "docs/zero-code.md", "examples/pytorch_ddp.py",
                   "integrations/frameworks/constraints.txt", "tests/conftest.py"):
        assert needed in names, f"{needed} missing from {os.path.basename(built.sdist)}"
    assert os.path.basename(built.sdist) == f"distenv-{version}.tar.gz"
    assert not any(n.startswith((".venv", ".git/", "dist/")) for n in names)


def test_metadata(built):
    meta = _metadata(built.wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    assert text.startswith("Apache License Version 2.0, January 2004") and \
        "END OF TERMS AND CONDITIONS" in text        # the full text, as the metadata says
    requires = meta.get_all("Requires-Dist") or []
    # The core needs nothing: every requirement belongs to an extra.
    assert requires and all("extra ==" in r for r in requires), requires
    # No exact pin in an extra: `pip install "torch==2.14.1" "distenv[lightning]"` must resolve.
    pinned = [r for r in requires if re.search(r"===?\s*\d", r.split(";")[0])]
    assert not pinned, f"exact pins belong in integrations/frameworks/constraints.txt: {pinned}"
    extras = set(meta.get_all("Provides-Extra"))
    assert {"torch", "lightning", "transformers", "deepspeed", "tensorflow", "horovod", "test",
            "bench"} <= extras
    assert any(r.startswith("matplotlib") and "'bench'" in r for r in requires)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Source", "Changelog"} <= set(urls)
    # On a package index relative links lead nowhere: every link of the README is absolute there.
    body = meta.get_payload()
    links = re.findall(r"\]\(([^)\s]+)\)", body)
    assert links, "the README links its docs"
    relative = [u for u in links if not re.match(r"https?://|#", u)]
    assert not relative, f"relative links in the package's long description: {relative}"
    assert meta["Description-Content-Type"] == "text/markdown"


def test_installed_wheel_runs_away_from_the_checkout(venv):
    py, distenv_cmd = venv / "bin" / "python", venv / "bin" / "distenv"
    where = run(venv, py, "-c", "import distenv, importlib.metadata as m; "
                "print(distenv.__file__); print(m.version('distenv')); print(distenv.__version__)")
    assert where.returncode == 0, where.stderr
    path, meta_version, module_version = where.stdout.split()
    assert path.startswith(str(venv)), f"distenv imported from {path}, not the fresh venv"
    assert meta_version == module_version == _version_in_pyproject()
    assert os.path.isfile(os.path.join(os.path.dirname(path), "py.typed"))

    # The console script and `python -m distenv` both work and agree on the version.
    for cmd in ([distenv_cmd, "--version"], [py, "-m", "distenv", "--version"]):
        p = run(venv, *cmd)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"distenv {meta_version} "), p.stdout
        assert str(venv) in p.stdout, p.stdout    # says which installation answers

    # The JSON contract, in a plain shell (no launcher): one process, rank 0 of 1.
    p = run(venv, py, "-m", "distenv", "show", "--json")
    assert p.returncode == 0, p.stderr
    shown = json.loads(p.stdout)
    assert list(shown) == list(FIELDS)
    assert (shown["launcher"], shown["rank"], shown["world_size"], shown["launch"]) == \
        ("none", 0, 1, "per-process")
    # And it reads a real launcher's variables from the installed copy too.
    ompi = clean_env(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2",
                     OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="2",
                     OMPI_MCA_orte_num_nodes="1")
    p = run(venv, distenv_cmd, "show", "--json", env=ompi)
    assert p.returncode == 0, p.stderr
    shown = json.loads(p.stdout)
    assert (shown["launcher"], shown["rank"], shown["world_size"]) == ("openmpi", 1, 2)


def test_distenv_auto_pth_is_active_in_the_installed_wheel(venv):
    """distenv_auto.pth landed at the root of site-packages and runs at interpreter start."""
    py = venv / "bin" / "python"
    site = run(venv, py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    assert os.path.isfile(os.path.join(site.stdout.strip(), "distenv_auto.pth"))
    probe = "import sys; print('distenv._autostart' in sys.modules)"
    assert run(venv, py, "-c", probe).stdout.strip() == "False"         # off: nothing imported
    assert run(venv, py, "-c", probe, env=clean_env(DISTENV_AUTO="1")).stdout.strip() == "True"
    # On: a broken launch stops the interpreter before the script, with the one-line error.
    bad = run(venv, py, "-c", "print('script ran')",
              env=clean_env(DISTENV_AUTO="1", OMPI_COMM_WORLD_RANK="x", OMPI_COMM_WORLD_SIZE="2"))
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    assert "script ran" not in bad.stdout
    assert "OMPI_COMM_WORLD_RANK" in bad.stderr and "Fix:" in bad.stderr
