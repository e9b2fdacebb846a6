"""The extras resolve with the frameworks users actually have: `pip install --dry-run` of the
built wheel's extras against the package index (nothing is installed).

- `"torch>=2.14" "distenv[lightning]"` resolves (a newer torch than this machine's pin);
- `distenv[tensorflow]` resolves to a TensorFlow and a tf-keras of the same major.minor (the
  pair MultiWorkerMirroredStrategy needs) and no tensorflow-cpu beside `tensorflow`;
- with integrations/frameworks/constraints.txt (`-c`) the same extra resolves to the pinned
  torch: exact pins live there, not in the extras.

Needs the package index (PyPI): pip's resolver reads the candidates' metadata there.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from packaging_util import ROOT, clean_env, missing

CONSTRAINTS = os.path.join(ROOT, "integrations", "frameworks", "constraints.txt")


def _index_reachable() -> bool:
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                        "--no-deps", "--quiet", "packaging"],
                       capture_output=True, text=True, timeout=120, env=clean_env())
    return p.returncode == 0


def _version(v: str) -> tuple:
    return tuple(int(x) for x in v.split("+")[0].split(".")[:3] if x.isdigit())


def dry_run(tmp_path, name, *requirements):
    """{distribution name (normalised): version} pip would install into an empty environment."""
    report = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), *requirements]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=clean_env())
    assert p.returncode == 0, f"{' '.join(cmd)} does not resolve:\n{p.stderr[-3000:]}"
    with open(report, encoding="utf-8") as f:
        install = json.load(f)["install"]
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
            for i in install}


@pytest.fixture(scope="module")
def resolutions(built, tmp_path_factory):
    if not _index_reachable():
        missing("the package index is not reachable (pip install --dry-run packaging failed)")
    tmp = tmp_path_factory.mktemp("dry")
    wheel = built.wheel
    jobs = {
        "newer_torch": ("torch>=2.14", f"{wheel}[lightning]"),
        "tensorflow": (f"{wheel}[tensorflow]",),
        "pinned": ("-c", CONSTRAINTS, f"{wheel}[lightning]"),
    }
    # In parallel: each is a minute or more of resolving on a busy machine.
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {k: pool.submit(dry_run, tmp, k, *v) for k, v in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def test_newer_torch_and_the_lightning_extra_resolve(resolutions):
    got = resolutions["newer_torch"]
    assert _version(got["torch"]) >= (2, 14), got["torch"]
    assert "lightning" in got and "distenv" in got and "numpy" in got


def test_tensorflow_extra_is_a_matched_multi_worker_pair(resolutions):
    got = resolutions["tensorflow"]
    assert "tensorflow" in got and "tf-keras" in got, sorted(got)
    assert _version(got["tensorflow"])[:2] == _version(got["tf-keras"])[:2], \
        (got["tensorflow"], got["tf-keras"])
    # tensorflow-cpu beside tensorflow would be two copies of one package in one directory.
    assert "tensorflow-cpu" not in got
    assert "tensorboard" in got           # the TensorBoard callback; TensorFlow no longer needs it


def test_the_constraints_file_holds_the_exact_pin(resolutions):
    with open(CONSTRAINTS, encoding="utf-8") as f:
        pins = dict(line.split("#")[0].strip().split("==") for line in f
                    if "==" in line.split("#")[0])
    got = resolutions["pinned"]
    assert got["torch"].split("+")[0] == pins["torch"], (got["torch"], pins)
