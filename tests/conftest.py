import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


@pytest.fixture
def no_gpus(monkeypatch, tmp_path):
    """Make GPU discovery see an empty driver directory."""
    import distenv.gpus

    monkeypatch.setattr(distenv.gpus, "NVIDIA_DIR", str(tmp_path / "no-such-dir"))
    return tmp_path


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """fake_gpus(n): the driver lists n GPUs (through a directory the test controls)."""
    import distenv.gpus

    def make(n):
        d = tmp_path / "nvidia-gpus"
        d.mkdir(exist_ok=True)
        for i in range(n):
            (d / f"0000:{i:02x}:00.0").mkdir()
        monkeypatch.setattr(distenv.gpus, "NVIDIA_DIR", str(d))

    return make


@pytest.fixture(scope="session")
def no_gpus_session(tmp_path_factory):
    """Session-wide: GPU discovery sees no driver (for hypothesis tests)."""
    import distenv.gpus

    old = distenv.gpus.NVIDIA_DIR
    distenv.gpus.NVIDIA_DIR = str(tmp_path_factory.mktemp("gpus") / "none")
    yield
    distenv.gpus.NVIDIA_DIR = old
