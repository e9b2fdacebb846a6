import os

import pytest


@pytest.fixture(autouse=True)
def _restore_environ():
    """Give every unit test the os.environ it started with back: adapters under test export
    (RANK, MASTER_ADDR, ...) into os.environ on purpose, and monkeypatch undoes only what the
    test itself set, so a later test would meet a stale RANK that contradicts its launcher."""
    saved = dict(os.environ)
    yield
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
