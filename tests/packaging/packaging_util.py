"""Helpers for tests/packaging (a module of its own: `conftest` is a name every test directory uses)."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRE = os.environ.get("DISTENV_REQUIRE_LAUNCHERS", "").strip() not in ("", "0")


def missing(reason: str):
    """What CI must have is a failure there (DISTENV_REQUIRE_LAUNCHERS=1), a skip elsewhere."""
    if REQUIRE:
        pytest.fail(reason)
    pytest.skip(reason)


def clean_env(**extra: str) -> dict:
    """An environment without launcher variables, pip settings of a surrounding tool (tox's
    PIP_CONSTRAINT) or this checkout on the path: what a user's fresh shell has."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "PIP_CERT",
            "PIP_FIND_LINKS", "PIP_DEFAULT_TIMEOUT", "REQUESTS_CA_BUNDLE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env.update(extra)
    return env
