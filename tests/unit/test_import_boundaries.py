"""The layering, read from the source with ast (every import, also those inside functions):

* the core (resolver, sources, placement, knobs, ...) imports only the standard library and
  other core modules: never an adapter, a tool (CLI, doctor, run) or a framework;
* an adapter (distenv.torch, .lightning, .tensorflow, ...) imports from the core only the
  public API and the few shared helpers named below, and no private (``_name``) from the
  core: every resolution rule (placement, ports, knobs) lives in the core, where it is
  tested once;
* an adapter reads no launcher variable and compares no launcher name: it branches on what the
  launch's `Source` declares;
* no import circle: no module reaches itself through imports run at any time, those inside
  functions included (only ``if TYPE_CHECKING:`` blocks, which never run, are left out).
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
ROOT = os.path.join(SRC, "distenv")

#: Framework adapters (a package's submodules count as the adapter).
ADAPTERS = ("distenv.torch", "distenv.lightning", "distenv.transformers", "distenv.deepspeed",
            "distenv.tensorflow", "distenv.keras", "distenv.horovod", "distenv.jax")
#: Tools: they may import anything (they drive adapters and the core); not core.
TOOLS = ("distenv.cli", "distenv.__main__", "distenv.doctor", "distenv.run", "distenv.auto",
         "distenv._autostart", "distenv.display", "distenv.nodemap")
#: What an adapter may import from the core. Public API:
PUBLIC = ("distenv", "distenv.core.description", "distenv.errors", "distenv.core.resolver",
          "distenv.discovery", "distenv.core.export")
#: ... and the shared helpers, each a core rule adapters consume instead of holding their own.
SHARED = (
    "distenv.core.placement",             # which host runs each rank
    "distenv.knobs",                 # timeout, side ports, core share, host file knobs
    "distenv.core.gpus",                  # visible GPUs
    "distenv.log",                   # the distenv logger
    "distenv.bringup.teardown",             # an orderly end of a process group at exit
    "distenv.bringup",               # the one way up: resolve, refuse, complete, export, teardown
    "distenv.bringup.preflight",             # the one pre-flight: meet every rank, name the missing ones
    "distenv.core.ports",                 # whether a port is free here, and a free one (TF's own ports)
    "distenv.sources.lightning_node",  # both ends of the Lightning node hand-off
    "distenv.sources",               # what a launch's source declares (source_of, family, ...)
    "distenv.sources.slurm",         # SLURM's task layout, re-exported as distenv.tensorflow.slurm_task_nodes
    "distenv.sources.tfconfig",      # TF_CONFIG's own rules (parse, workers, task rank): the TF adapter
)
#: The core's floors, lowest first (docs/architecture.md): a module imports -- at any time,
#: inside functions too; `if TYPE_CHECKING:` never runs -- only from its own floor or lower ones.
#: A name covers its submodules; "distenv" is the package's own __init__ (the public API).
FLOORS = (
    ("distenv.core", "distenv.core._error", "distenv.core.fields", "distenv.core.redact",
     "distenv.core.reading", "distenv.core.hostlist", "distenv.core.ports"),     # words, parsers
    ("distenv.knobs", "distenv.errors", "distenv.log"),                              # settings, errors
    ("distenv.core.description", "distenv.core.checked", "distenv.core.export",       # the description
     "distenv.core.gpus", "distenv.core.invariants", "distenv.core.placement",         # and the sources
     "distenv.sources"),
    ("distenv.core.resolver",),                                                       # resolve()
    ("distenv.discovery",),                                                           # the services
    ("distenv", "distenv.bringup"),                                                   # the API, the way up
)
#: Modules outside the standard library a core module may import (lazily), and where.
CORE_EXTERNAL = {"distenv.discovery": {"mpi4py"}}
#: Known violations, each with its fix. Strict: once fixed, the entry must go (the test fails).
KNOWN: "dict[tuple[str, str], str]" = {}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def imports(name: str, text: str, is_package: bool = False):
    """(imported module, names taken from it) for every import in a module's source."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            names = tuple(a.name for a in node.names)
            if not node.module and node.level:  # from . import x: x may be a module
                for n in names:
                    yield f"{module}.{n}", ()
            else:
                yield module, names


def _modules():
    for folder, _, files in os.walk(ROOT):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8") as fh:
                    yield _module_name(path), fh.read(), f == "__init__.py"


def _under(name: str, roots) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def _known_module(name: str, all_names) -> str:
    """The distenv module an import names ("distenv.resolve" is the package's attribute)."""
    while name not in all_names and "." in name:
        name = name.rpartition(".")[0]
    return name


def _submodules(found, all_names):
    """`from .core import gpus` imports the module distenv.core.gpus, not the package."""
    for imported, names in found:
        subs = [n for n in names if f"{imported}.{n}" in all_names]
        yield from ((f"{imported}.{n}", ()) for n in subs)
        if not subs or len(subs) < len(names):
            yield imported, tuple(n for n in names if n not in subs)


def violations(modules) -> "list[tuple[str, str, str]]":
    """(importer, imported, why) for every import that breaks the layering."""
    modules = list(modules)
    all_names = {m for m, _, _ in modules}
    out = []
    for name, text, is_package in modules:
        adapter = _under(name, ADAPTERS)
        core = not adapter and not _under(name, TOOLS)
        for imported, names in _submodules(imports(name, text, is_package), all_names):
            top = imported.split(".")[0]
            if top != "distenv":
                if core and top not in sys.stdlib_module_names and \
                        top not in CORE_EXTERNAL.get(name, ()):
                    out.append((name, imported, "the core imports only the standard library"))
                continue
            target = _known_module(imported, all_names)
            if core and (_under(target, ADAPTERS) or _under(target, TOOLS)):
                out.append((name, target, "the core imports an adapter or a tool"))
            if adapter and not _under(target, ADAPTERS):
                if target not in PUBLIC + SHARED and not _under(target, TOOLS):
                    out.append((name, target, "an adapter imports a core internal"))
                private = [n for n in names if n.startswith("_") and n != "__version__"]
                if private and not _under(target, ADAPTERS):
                    out.append((name, target, f"an adapter imports private {', '.join(private)}"))
    return out


def test_the_checker_catches_each_kind_of_violation():
    fake = [
        ("distenv.core.resolver", "import torch\nfrom ..lightning import x\n", False),
        ("distenv.sources.slurm", "def f():\n    from ..cli import main\n", False),
        ("distenv.tensorflow.cluster", "from ..core.hostlist import expand_hostlist\n"
                                       "from ..core.description import _build\n", False),
        ("distenv.lightning", "from .core.placement import display_node_rank\nimport lightning\n", False),
        ("distenv.core.hostlist", "", False), ("distenv.cli", "", False), ("distenv.core.description", "", False),
        ("distenv.core.placement", "", False),
    ]
    found = {(a, b) for a, b, _ in violations(fake)}
    assert found == {("distenv.core.resolver", "torch"), ("distenv.core.resolver", "distenv.lightning"),
                     ("distenv.sources.slurm", "distenv.cli"),
                     ("distenv.tensorflow.cluster", "distenv.core.hostlist"),
                     ("distenv.tensorflow.cluster", "distenv.core.description")}


def test_layering():
    found = violations(_modules())
    unexpected = [v for v in found if (v[0], v[1]) not in KNOWN]
    assert not unexpected, "\n".join(f"{a} -> {b}: {why}" for a, b, why in unexpected)
    fixed = [k for k in KNOWN if k not in {(a, b) for a, b, _ in found}]
    assert not fixed, f"fixed, remove from KNOWN: {fixed}"


#: Launcher variables an adapter may read, with why (none is a resolution rule).
ALLOWED_READS = {
    # torchrun's own switches for torch's store, which the torch adapter must follow
    "TORCHELASTIC_USE_AGENT_STORE": "torch's env:// joins the torchrun agent's store when set",
    "TORCHELASTIC_RESTART_COUNT": "a fresh key prefix per torchrun restart (not a field)",
}
#: Names adapters read that are not launcher variables though a source lists them: torch's
#: and TensorFlow's own variables (adapters export them, frameworks read them), and the
#: Lightning hand-off (written by the adapter, read by its source).
FRAMEWORK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                       "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE", "TF_CONFIG",
                       "DISTENV_LIGHTNING_NODE")


def reads(text: str):
    """Variable names a module reads: ``m.get("X")``, ``m["X"]`` (not an assignment),
    ``"X" in m``, ``os.getenv("X")``."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "getenv", "pop") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            yield node.slice.value
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                isinstance(node.left.value, str) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            yield node.left.value


def test_reads_finds_reads_not_writes():
    text = ("a = env.get('SLURM_PROCID')\nb = env['OMPI_COMM_WORLD_RANK']\nc = 'PMI_RANK' in env\n"
            "env['HOROVOD_RANK'] = '1'\nd = {'HOROVOD_SIZE': '2'}\n")
    assert list(reads(text)) == ["SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_adapters_parse_no_launcher_variable(adapter):
    """No adapter reads a launcher's variables (that is the sources' job): writing them for a
    framework (Horovod's HOROVOD_*) is fine."""
    from distenv.sources import prefixes

    launcher = tuple(p for p in prefixes() if p not in FRAMEWORK_VARIABLES)
    found = [f"{name}: {var!r}" for name, text, _ in _modules() if _under(name, (adapter,))
             for var in reads(text) if var.startswith(launcher) and var not in ALLOWED_READS]
    assert not found, found


#: Launcher names an adapter may compare `.launcher` with, and why.
ALLOWED_NAMES = {"none": "the resolver's answer when no launcher started the process"}


def launcher_comparisons(text: str):
    """String constants a module compares an attribute named ``launcher`` with
    (``d.launcher == "x"``, ``env.launcher in ("x", "y")``)."""
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(s, ast.Attribute) and s.attr == "launcher" for s in sides):
            continue
        for side in sides:
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    yield item.value


def test_launcher_comparisons_finds_names():
    text = ('a = d.launcher == "openmpi"\nb = env.launcher in ("gcp", "vertex")\n'
            'c = framework in ("tensorflow", "keras")\nd = "slurm" != e.launcher\n')
    assert list(launcher_comparisons(text)) == ["openmpi", "gcp", "vertex", "slurm"]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_adapters_branch_on_declarations_not_launcher_names(adapter):
    """Adapters ask the launch's Source what it declares (`distenv.sources.source_of`, `family`:
    issue 21), never which launcher it is by name."""
    found = [f"{name}: {value!r}" for name, text, _ in _modules() if _under(name, (adapter,))
             for value in launcher_comparisons(text) if value not in ALLOWED_NAMES]
    assert not found, found


#: Adapters built on another adapter, with why: the only imports between adapters.
ADAPTER_BASES = {
    "distenv.keras": ("distenv.jax", "distenv.tensorflow"),  # Keras 3 runs on its backend's set-up
    "distenv.horovod": ("distenv.torch",),  # horovod.torch pins its process as torch's does (pin)
}


def test_no_adapter_imports_another_except_its_backend():
    """Each adapter stands on the core alone; Keras 3, which runs on JAX or TensorFlow, uses
    their adapters for its backend (ADAPTER_BASES)."""
    modules = list(_modules())
    names = {m for m, _, _ in modules}
    found = set()
    for name, text, is_package in modules:
        own = next((a for a in ADAPTERS if _under(name, (a,))), None)
        if own is None:
            continue
        for imported, _names in imports(name, text, is_package):
            if imported.split(".")[0] != "distenv":
                continue
            target = next((a for a in ADAPTERS if _under(_known_module(imported, names), (a,))), None)
            if target is not None and target != own:
                found.add((own, target))
    allowed = {(a, b) for a, bases in ADAPTER_BASES.items() for b in bases}
    assert found - allowed == set(), sorted(found - allowed)
    assert allowed - found == set(), f"no longer imported, remove from ADAPTER_BASES: {sorted(allowed - found)}"


# -- the core and the tools name no launcher either (issue 29, item 3) ----------------------------
#: The wire-protocol clients: each speaks its own protocol, whose servers and variables it must
#: name (PMI-1's PMI_FD and Hydra's proxy, PMIx's PMIX_* and daemons, the apinfo's PALS_APINFO),
#: and the discovery services that stand for them.
PROTOCOL_CLIENTS = ("distenv.discovery.pmi", "distenv.discovery.pmix", "distenv.discovery.pmix_relay",
                    "distenv.discovery.apinfo", "distenv.discovery.services")


def _outside_sources(name: str) -> bool:
    return not _under(name, ("distenv.sources",) + ADAPTERS + PROTOCOL_CLIENTS)


def test_core_and_tools_read_no_launcher_variable():
    """Launcher facts live in Sources: no core or tool module (the resolver, discovery, the
    doctor, distenv run, ...) reads a launcher's variable; a client of a launcher's wire
    protocol reads that protocol's own."""
    from distenv.sources import prefixes

    launcher = tuple(p for p in prefixes() if p not in FRAMEWORK_VARIABLES)
    found = [f"{name}: {var!r}" for name, text, _ in _modules() if _outside_sources(name)
             for var in reads(text) if var.startswith(launcher)]
    assert not found, found


def test_core_and_tools_compare_no_launcher_name():
    found = [f"{name}: {value!r}" for name, text, _ in _modules() if _outside_sources(name)
             for value in launcher_comparisons(text) if value not in ALLOWED_NAMES]
    assert not found, found


# -- no import circle (issue 29, item 5) ---------------------------------------------------------
def _runs(node) -> bool:
    """Is this statement's body ever executed? ``if TYPE_CHECKING:`` is for type checkers only."""
    test = getattr(node, "test", None)
    return not (isinstance(node, ast.If) and (
        isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def runtime_imports(name: str, text: str, is_package: bool = False):
    """The distenv modules a module imports when run: at the top or inside any function."""
    keep = []

    def visit(node):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            keep.append(node)
        for child in ast.iter_child_nodes(node):
            if _runs(child):
                visit(child)
            else:  # the else branch of ``if TYPE_CHECKING:`` runs
                for other in child.orelse:
                    visit(other)

    visit(ast.parse(text))
    return imports(name, ast.unparse(ast.Module(body=keep, type_ignores=[])), is_package)


def circles(modules) -> "list[list[str]]":
    """Every import circle: each strongly connected group of more than one module (Tarjan)."""
    modules = list(modules)
    names = {m for m, _, _ in modules}
    graph = {m: set() for m in names}
    for name, text, is_package in modules:
        for imported, taken in runtime_imports(name, text, is_package):
            if imported.split(".")[0] != "distenv":
                continue
            for target in [f"{imported}.{t}" for t in taken if f"{imported}.{t}" in names] or [imported]:
                target = _known_module(target, names)
                if target != name:
                    graph[name].add(target)
    index: "dict[str, int]" = {}
    low: "dict[str, int]" = {}
    stack: "list[str]" = []
    out = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_sees_lazy_imports_not_type_checking_ones():
    fake = [
        ("distenv.core.description", "def export(self):\n    from .export import export\n", False),
        ("distenv.core.export", "from .fields import PER_NODE\nfrom .. import sources as s\n", False),
        ("distenv.sources", "TYPE_CHECKING = False\nif TYPE_CHECKING:\n"
                            "    from ..core.description import Later\nelse:\n    from ..core import fields\n", True),
        ("distenv.core.fields", "", False),
        ("distenv.discovery", "from .services import PMI_WHY\n", True),
        ("distenv.discovery.services", "def ask():\n    from . import PMI_WHY\n", False),
    ]
    assert circles(fake) == [["distenv.discovery", "distenv.discovery.services"]]
    fake[2] = ("distenv.sources", "def f():\n    from ..core.description import Later\n", True)
    assert sorted(circles(fake)) == [["distenv.core.description", "distenv.core.export", "distenv.sources"],
                                     ["distenv.discovery", "distenv.discovery.services"]]


def test_no_import_circle():
    found = circles(_modules())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_nothing_outside_discovery_imports_its_internals():
    """Discovery's clients and helpers (PMI-1, PMIx, the relay, apinfo, the holder, the
    hand-off, the chain, services, apply) are reached only through `distenv.discovery` itself
    (`complete`, `discover`, `handoffs`): their modules can change without touching anyone."""
    modules = list(_modules())
    names = {m for m, _, _ in modules}
    found = set()
    for name, text, is_package in modules:
        if _under(name, ("distenv.discovery",)):
            continue
        for imported, taken in _submodules(imports(name, text, is_package), names):
            target = _known_module(imported, names)
            if _under(target, ("distenv.discovery",)) and target != "distenv.discovery":
                found.add((name, target))
    assert not found, sorted(found)


def floor(name: str) -> "int | None":
    """The floor of a core module (FLOORS), None for an adapter or a tool."""
    found = None
    for i, names in enumerate(FLOORS):
        for n in names:
            if name == n or (n not in ("distenv", "distenv.core") and name.startswith(n + ".")):
                found = i
    return found


def upward(modules) -> "list[tuple[str, str]]":
    """(importer, imported) for every run-time import from a core module to a higher floor."""
    modules = list(modules)
    names = {m for m, _, _ in modules}
    out = []
    for name, text, is_package in modules:
        here = floor(name)
        if here is None:
            continue
        for imported, _taken in _submodules(runtime_imports(name, text, is_package), names):
            if imported.split(".")[0] != "distenv":
                continue
            target = _known_module(imported, names)
            there = floor(target)
            if there is not None and there > here:
                out.append((name, target))
    return out


def test_every_core_module_has_a_floor():
    core = [m for m, _, _ in _modules() if not _under(m, ADAPTERS) and not _under(m, TOOLS)]
    assert [m for m in core if floor(m) is None] == []


def test_no_core_module_imports_from_a_higher_floor():
    """The log does not resolve a launch, the parsers raise the floor's error, the description's
    convenience methods reach only their own floor: discovery included, no exemption."""
    assert upward(_modules()) == []


def test_the_floor_check_sees_a_lazy_upward_import():
    fake = [("distenv.log", "def f():\n    from .core.resolver import resolve\n", False),
            ("distenv.core.hostlist", "from ..errors import DistEnvError\n", False),
            ("distenv.core.resolver", "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from ..discovery import x\n", False),
            ("distenv.core.resolver", "", False), ("distenv.errors", "", False), ("distenv.discovery", "", True)]
    assert upward(fake) == [("distenv.log", "distenv.core.resolver"), ("distenv.core.hostlist", "distenv.errors")]


def test_the_source_base_is_small_and_sources_declare_only_its_members():
    """`Source` has at most 15 members (issue 41, item 4): five identities, five grouped
    declarations (launch, services, passing, frameworks, doctor), five methods. A launcher's
    class sets or overrides only those (its own helpers are private), so a misspelled or
    retired declaration (`pass_on = ...`) cannot sit there unread."""
    from distenv.sources import LAUNCHERS, NONE, PLATFORMS, Source

    members = [n for n in vars(Source) if not n.startswith("_")]
    assert len(members) <= 15, members
    for entry in LAUNCHERS + [NONE] + PLATFORMS:
        cls = type(entry.load())
        shared = {n for base in cls.__mro__[1: cls.__mro__.index(Source)] for n in vars(base)}  # a family's map
        extra = [n for n in vars(cls) if not n.startswith("_") and n not in members and n not in shared]
        assert not extra, (cls.__name__, extra)
