"""distenv.bringup.teardown on a stand-in torch.distributed: the order quiesce -> destroy -> quiesce,
the guard on a script's own destroy_process_group, and DISTENV_TEARDOWN=0. The real race is
provoked and shown gone under mpirun in tests/reliability/test_clean_exit.py."""
from __future__ import annotations

import sys
import types

import pytest

from distenv.bringup import teardown as _teardown


@pytest.fixture
def fake_dist(monkeypatch):
    calls = []
    dist = types.ModuleType("torch.distributed")
    state = {"up": True}

    def destroy_process_group(group=None):
        calls.append(("destroy", group))
        state["up"] = False

    dist.destroy_process_group = destroy_process_group
    dist.is_available = lambda: True
    dist.is_initialized = lambda: state["up"]
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setattr(_teardown, "quiesce", lambda limit=0: calls.append(("quiesce",)) or True)
    monkeypatch.delenv("DISTENV_TEARDOWN", raising=False)
    return types.SimpleNamespace(module=dist, calls=calls, state=state, original=destroy_process_group)


def test_end_waits_for_the_workers_before_and_after_destroying(fake_dist):
    _teardown.end()
    assert fake_dist.calls == [("quiesce",), ("destroy", None), ("quiesce",)]
    fake_dist.calls.clear()
    _teardown.end()  # nothing up any more: no destroy, still the waits
    assert fake_dist.calls == [("quiesce",), ("quiesce",)]


def test_a_failed_program_does_not_destroy(fake_dist, monkeypatch):
    monkeypatch.setattr(sys, "last_value", RuntimeError("boom"), raising=False)
    _teardown.at_exit()
    assert ("destroy", None) not in fake_dist.calls and fake_dist.state["up"]


def test_guard_wraps_the_scripts_own_destroy_once(fake_dist):
    _teardown.guard()
    _teardown.guard()  # idempotent
    wrapped = fake_dist.module.destroy_process_group
    assert wrapped is not fake_dist.original and wrapped.__wrapped__ is fake_dist.original
    wrapped("g")
    assert fake_dist.calls == [("quiesce",), ("destroy", "g"), ("quiesce",)]
    fake_dist.calls.clear()
    fake_dist.state["up"] = True
    _teardown.end()  # end() calls torch's own, not the guard (no double wait)
    assert fake_dist.calls == [("quiesce",), ("destroy", None), ("quiesce",)]


def test_teardown_off(fake_dist, monkeypatch):
    monkeypatch.setenv("DISTENV_TEARDOWN", "0")
    _teardown.guard()
    assert fake_dist.module.destroy_process_group is fake_dist.original


def test_no_torch_no_work_and_a_guard_when_it_comes(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    seen = []
    monkeypatch.setattr(_teardown, "quiesce", lambda limit=0: seen.append(1) or True)
    _teardown.end()
    _teardown.guard()
    _teardown.guard()
    assert seen == [] and sum(isinstance(f, _teardown._GuardFinder) for f in sys.meta_path) == 1
    # a stand-in torch.distributed on the path: guarded when its import completes
    pkg = tmp_path / "torch"
    (pkg / "distributed").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "distributed" / "__init__.py").write_text("def destroy_process_group(group=None):\n    return 'own'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torch", "torch.distributed"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import torch.distributed as dist

    assert dist.destroy_process_group.__distenv_guarded__ and dist.destroy_process_group() == "own"
    assert seen == [1, 1] and not any(isinstance(f, _teardown._GuardFinder) for f in sys.meta_path)
    for name in ("torch", "torch.distributed"):
        sys.modules.pop(name, None)


def test_two_wrapping_hooks_chain_without_recursing(monkeypatch, tmp_path):
    """distenv.auto's one-process finder and the guard's finder both wrap torch.distributed's
    loader by asking the other finders for its spec: with both on sys.meta_path each asked the
    other without end (RecursionError at ``import torch``). Now both wrap, in turn."""
    import distenv.auto

    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(_teardown, "quiesce", lambda limit=0: True)
    monkeypatch.setattr(distenv.auto, "single", None)
    sys.meta_path.insert(0, distenv.auto._OneProcessFinder())
    _teardown.guard()  # its finder goes first
    pkg = tmp_path / "torch"
    (pkg / "distributed").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "distributed" / "__init__.py").write_text(
        "def destroy_process_group(group=None):\n    return 'own'\n"
        "def init_process_group(*a, **k):\n    return 'init'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torch", "torch.distributed"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import torch.distributed as dist

    assert dist.destroy_process_group.__distenv_guarded__  # the guard's wrap
    assert dist.init_process_group._distenv_one_process  # auto's wrap
    assert dist.init_process_group() == "init" and dist.destroy_process_group() == "own"
    for name in ("torch", "torch.distributed"):
        sys.modules.pop(name, None)


def test_quiesce_without_workers_returns_at_once():
    assert _teardown.quiesce(0.5) is True
