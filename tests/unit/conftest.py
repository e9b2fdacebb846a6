import os

import pytest


@pytest.fixture(autouse=True)
def _no_master_dial(monkeypatch):
    """Rank 0's look at the master address (distenv.bringup.master) dials it: the environments
    unit tests replay name other hosts (the namespace nodes' 10.213.77.x, which refuse here
    while the cluster is up), so the answer would depend on this machine's network. Off here;
    its own tests turn it on; tests/integration runs it on real hosts."""
    monkeypatch.setenv("DISTENV_MASTER_CHECK", "0")


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
