"""Every error distenv can raise says what to do: a ``Fix:`` (`DistEnvError.fix`).

Two halves:

* statically, every ``DistEnvError(...)`` in src/distenv, found by walking the AST, builds a
  message that carries a Fix: the literal text of the call holds ``Fix:``, or its message
  comes from a helper function (or a variable of the enclosing function) whose text holds
  it, or it re-raises a caught DistEnvError with context (that error has its own Fix). A new
  raise without a Fix fails here, naming the file and line;
* dynamically, the errors users met (issue 14) are rendered from the environments that
  trigger them, and each is checked word for word: its Fix and what it must not say.
"""
from __future__ import annotations

import ast
import os

import pytest

import distenv
from distenv import DistEnvError
from distenv.errors import split_fix
from envs import ompi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "distenv")

#: Files being written or restructured by other changes right now, with the number of raises
#: without a Fix they still hold: the count may only go down (a new raise without a Fix
#: fails). Lower it as they are converted; remove the entry at zero.
PENDING: "dict[str, int]" = {}


def _functions_with_fix(trees) -> set:
    """Names of functions (any module) whose body's text holds 'Fix:', and of module-level
    constants whose value holds it (a fix shared by several errors)."""
    found = set()
    for text, tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    "Fix:" in (ast.get_source_segment(text, node) or ""):
                found.add(node.name)
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and \
                    "Fix:" in (ast.get_source_segment(text, node.value) or ""):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found.update(t.id for t in targets if isinstance(t, ast.Name))
    # and functions that return what one of those builds (a wrapper that rewords it)
    grew = True
    while grew:
        grew = False
        for text, tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in found \
                        and any(isinstance(n, ast.Assign) and _calls_helper(n.value, found)
                                for n in ast.walk(node)):
                    found.add(node.name)
                    grew = True
    return found


def _parents(tree):
    up = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            up[child] = node
    return up


def _enclosing(node, up, kinds):
    while node in up:
        node = up[node]
        if isinstance(node, kinds):
            return node
    return None


def _reraises_a_distenv_error(call, text, up) -> bool:
    """`raise DistEnvError(f"...: {exc}")` inside `except DistEnvError as exc:`."""
    handler = _enclosing(call, up, (ast.ExceptHandler,))
    if handler is None or handler.name is None or handler.type is None:
        return False
    if "DistEnvError" not in ast.get_source_segment(text, handler.type):
        return False
    return any(isinstance(n, ast.Name) and n.id == handler.name for n in ast.walk(call))


def _calls_helper(node, helpers) -> bool:
    return isinstance(node, ast.Call) and \
        getattr(node.func, "id", getattr(node.func, "attr", None)) in helpers


def _variable_has_fix(call, text, up, helpers) -> bool:
    """`DistEnvError(message)` where the enclosing function builds `message` with a Fix
    (literally, or from a helper function whose text holds one)."""
    if len(call.args) != 1 or not isinstance(call.args[0], ast.Name):
        return False
    name = call.args[0].id
    func = _enclosing(call, up, (ast.FunctionDef, ast.AsyncFunctionDef))
    scope = func if func is not None else None
    if scope is None:
        return False
    for node in ast.walk(scope):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and (
                "Fix:" in ast.get_source_segment(text, node)
                or _calls_helper(getattr(node, "value", None), helpers)):
            return True
    return False


def raise_sites():
    """[(relative path, line, source of the call, has a Fix)] for every DistEnvError(...)."""
    trees = {}
    for dirpath, _, files in os.walk(SRC):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                text = open(path, encoding="utf-8").read()
                trees[os.path.relpath(path, SRC)] = (text, ast.parse(text))
    helpers = _functions_with_fix(trees)
    sites = []
    for rel, (text, tree) in sorted(trees.items()):
        up = _parents(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and (
                    getattr(node.func, "id", None) == "DistEnvError"
                    or getattr(node.func, "attr", None) == "DistEnvError")):
                continue
            if rel == "errors.py":
                continue
            segment = ast.get_source_segment(text, node)
            ok = ("Fix:" in segment
                  or any(_calls_helper(a, helpers) for a in node.args)
                  or any(isinstance(n, ast.Name) and n.id in helpers for n in ast.walk(node))
                  or _variable_has_fix(node, text, up, helpers)
                  or _reraises_a_distenv_error(node, text, up))
            sites.append((rel, node.lineno, " ".join(segment.split())[:160], ok))
    return sites


def test_the_scan_finds_the_raise_sites():
    sites = raise_sites()
    files = {rel for rel, *_ in sites}
    # the core and the adapters raise; if this drops, the scan is broken, not the code
    assert len(sites) > 60 and {"core/resolver.py", "core/reading.py", "core/export.py", "run.py"} <= files


def test_every_raise_has_a_fix():
    missing: dict = {}
    for rel, line, source, ok in raise_sites():
        if not ok:
            missing.setdefault(rel, []).append(f"{rel}:{line}: {source}")
    over = []
    for rel, items in sorted(missing.items()):
        allowed = next((n for prefix, n in PENDING.items() if rel.startswith(prefix)), 0)
        if len(items) > allowed:
            over += items
    assert not over, "DistEnvError without 'Fix: ...' (say what to do):\n" + "\n".join(over)


def test_the_scan_rejects_a_raise_without_fix(tmp_path):
    (tmp_path / "m.py").write_text(
        "from .errors import DistEnvError\n"
        "def f(x):\n    raise DistEnvError(f'{x} is bad.')\n"
        "def g(x):\n    raise DistEnvError(f'{x} is bad. Fix: set it.')\n"
        "def h(x):\n    message = f'{x} bad'\n    message += ' Fix: unset it.'\n"
        "    raise DistEnvError(message)\n"
        "def k():\n    try:\n        f(1)\n    except DistEnvError as exc:\n"
        "        raise DistEnvError(f'context: {exc}')\n"
        "def m(x):\n    raise DistEnvError(helper(x))\n"
        "def helper(x):\n    return f'{x}. Fix: do it.'\n"
        "def n(x):\n    message = helper(x)\n    raise DistEnvError(message)\n"
        "def o(x):\n    message = other(x)\n    raise DistEnvError(message)\n"
        "def other(x):\n    return f'{x} is bad'\n"
        "SHARED = 'Fix: unset it.'\n"
        "def q(x):\n    raise DistEnvError(f'{x} is bad. ' + SHARED)\n")
    global SRC
    old, SRC = SRC, str(tmp_path)
    try:
        verdict = {line: ok for _, line, _, ok in raise_sites()}
    finally:
        SRC = old
    assert verdict == {3: False, 5: True, 9: True, 14: True, 16: True, 21: True, 24: False, 29: True}


# -- the errors users met, rendered ---------------------------------------------------------
def _error(environ=None, **kw) -> DistEnvError:
    with pytest.raises(DistEnvError) as info:
        distenv.resolve(environ or {}, **kw)
    return info.value


@pytest.mark.parametrize("value", ["-1", "0", "two", "99999999999999"])
def test_nproc_per_node_names_its_valid_values(value):
    err = _error({"DISTENV_NPROC_PER_NODE": value})
    assert f"DISTENV_NPROC_PER_NODE={value!r} is not a number of workers per node" in str(err)
    assert err.fix and all(w in err.fix for w in ("positive number", "auto", "gpu", "cpu"))


def test_nproc_gpu_without_gpu_does_not_repeat_itself(no_gpus):
    err = _error({"DISTENV_NPROC_PER_NODE": "gpu"})
    assert "no GPU is visible (no GPU" not in str(err) and "no GPU visible" in err.problem
    assert "cpu" in err.fix


@pytest.mark.parametrize("raw", ["not json", "{", "{}", "[]", '{"cluster": {}}'])
def test_tf_config_errors_have_a_fix(raw):
    err = _error({"TF_CONFIG": raw})
    assert err.fix and "TF_CONFIG" in err.fix, str(err)


def test_forced_launcher_blames_who_forced_it():
    err = _error(launcher="slurm")
    assert err.problem.startswith("launcher='slurm' given to resolve() forces SLURM")
    assert "DISTENV_LAUNCHER" not in str(err) and "resolve()" in err.fix
    env_err = _error({"DISTENV_LAUNCHER": "slurm"})
    assert env_err.problem.startswith("DISTENV_LAUNCHER=slurm forces SLURM")
    assert "unset DISTENV_LAUNCHER" in env_err.fix
    unknown = _error(launcher="bogus")
    assert "given to resolve()" in unknown.problem and "resolve()" in unknown.fix


def test_master_addr_message_names_the_launcher_at_hand():
    plain = distenv.resolve({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(DistEnvError) as info:
        plain.export({})
    text = str(info.value)
    assert "mpirun" not in text and "mpiexec" not in text
    assert "MASTER_ADDR" in info.value.fix and "RANK and WORLD_SIZE" in info.value.fix
    openmpi = distenv.resolve(ompi(0, 4, 0, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2"))
    if openmpi.master_addr is None:
        with pytest.raises(DistEnvError) as info:
            openmpi.export({})
        assert "mpirun -x MASTER_ADDR" in info.value.fix


def test_single_process_explain_does_not_claim_a_launcher():
    text = distenv.resolve({}).explain()
    launch = next(line for line in text.splitlines() if line.startswith("launch "))
    assert "launcher started" not in launch and "single process" in launch


def test_split_fix():
    assert split_fix("A is bad. Fix: set B.") == ("A is bad.", "set B.")
    assert split_fix("A is bad.") == ("A is bad.", None)
    assert DistEnvError("x. Fix: y").fix == "y" and DistEnvError("x").fix is None
