"""Shared for tests/packaging: the sdist and wheel, built once per session from this checkout.

The build runs without network (`python -m build --no-isolation`: hatchling and
hatch-fancy-pypi-readme come from the test extra), so it works offline; the resolution tests
that need the package index say so themselves.
"""

import glob
import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from packaging_util import ROOT, clean_env, missing


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """SimpleNamespace(sdist=path, wheel=path) built from this checkout."""
    for module in ("build", "hatchling", "hatch_fancy_pypi_readme"):
        if importlib.util.find_spec(module) is None:
            missing(f"{module} is not installed in {sys.executable}: "
                    f"pip install -e '.[test]' (tests/packaging builds without network)")
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), ROOT],
                       capture_output=True, text=True, timeout=600, env=clean_env())
    assert p.returncode == 0, f"python -m build failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    sdists = glob.glob(str(out / "distenv-*.tar.gz"))
    wheels = glob.glob(str(out / "distenv-*-py3-none-any.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, os.listdir(out)
    return SimpleNamespace(sdist=sdists[0], wheel=wheels[0], dir=str(out))
