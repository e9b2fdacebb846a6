"""Zero-code distenv: ``import distenv.auto`` (or ``DISTENV_AUTO=1``, see `distenv._autostart`).

In a distributed launch this

1. resolves the launch and exports the canonical torch variables (``MASTER_ADDR``,
   ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...; never overwriting a
   different value: that is a `DistEnvError`), and
2. installs an import hook (a `sys.meta_path` finder whose loader wraps the real one) that
   applies distenv's framework adapters right after -- and only when -- the script imports
   Lightning, Transformers/Accelerate, DeepSpeed, TensorFlow or JAX. A framework imported before
   ``distenv.auto`` is patched at once.

Outside a distributed launch (a single process) it does nothing at all: no variable written,
no hook installed. It never imports a framework itself; the adapters it calls are the same
public entry points a script could call by hand (`HOOKS`).
"""

from __future__ import annotations

import os
import sys

from .description import PER_NODE
from .errors import install_excepthook

TYPE_CHECKING = False  # typing stays out of interpreter start (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import MutableMapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    from .description import DistEnv

#: top-level module -> (adapter module, function) called right after that module is imported.
#: One adapter function runs once, whichever of its frameworks comes first.
HOOKS = {
    "lightning": ("distenv.lightning", "patch"),
    "pytorch_lightning": ("distenv.lightning", "patch"),
    "lightning_fabric": ("distenv.lightning", "patch"),
    "transformers": ("distenv.transformers", "patch"),
    "accelerate": ("distenv.transformers", "patch"),
    # deepspeed.init_distributed skips its mpi4py discovery once the five torch variables
    # are set; prepare() checks they are (and refuses a per-node launch with the fix).
    "deepspeed": ("distenv.deepspeed", "prepare"),
    "tensorflow": ("distenv.tensorflow", "patch"),
    # jax.distributed.initialize() (and keras.distribution.initialize() on the JAX backend,
    # which calls it) with no arguments: filled from the launch.
    "jax": ("distenv.jax", "patch"),
}
#: Adapters applied again for each of their frameworks imported (they patch what is
#: imported and are idempotent): `import lightning` and later `import pytorch_lightning`
#: are two Trainers to patch, and patching the second must not import it early.
EACH_IMPORT = {"distenv.lightning:patch"}

#: The resolved launch (None until `activate`, and when not distributed).
env: "DistEnv | None" = None
#: Variables `activate` wrote into os.environ: {name: previous value or None}.
exported: "dict[str, str | None]" = {}
#: Adapter functions already applied, as "module:function".
applied: "list[str]" = []
#: "module:function" -> why it could not be applied (adapter missing).
skipped: "dict[str, str]" = {}

_finder: "_Finder | None" = None
_pending: "list[str]" = []
_depth = 0


def activate(environ: "MutableMapping[str, str] | None" = None, reason: str = "import distenv.auto"
             ) -> "DistEnv | None":
    """Resolve, export and install the hooks; returns the DistEnv, or None when the launch
    is not distributed (then nothing is changed). Idempotent."""
    global env
    if _finder is not None:
        return env
    from .resolver import resolve

    target: "MutableMapping[str, str]" = os.environ if environ is None else environ
    found = resolve(target)
    if not found.is_distributed:
        return None
    if environ is None and (found.master_addr is None or found.world_size is None):
        # MPICH/Intel MPI across nodes, or a command `distenv run` exec'ed after exchanging:
        # the launcher's key-value service (distenv.discovery.complete).
        from .discovery import complete

        found = complete(found, need=("master_addr", "world_size"))
    env = found
    if _acts("torch"):
        # torch's variables; a source whose ranks are not torch's (a TPU pod's hosts, while
        # torch-xla numbers chips) gets none.
        before = {name: target.get(name) for name in _EXPORTED_NAMES}
        written = found.export(target)
        exported.update({name: before.get(name) for name in written})
    if found.launch == PER_NODE and not target.get("DISTENV_RUN"):
        from .log import get_logger  # lazy: logging costs milliseconds at interpreter start

        get_logger(__name__).warning(
            f"this is a per-node launch ({reason}): this process stands for node "
            f"{found.node_rank} of {found.num_nodes}, and its {found.nproc_per_node} worker(s) are "
            "still to be started. A Lightning Trainer starts them itself (patched by distenv); "
            "a JAX or Keras 3 (JAX) script runs as the node's one JAX process, owning its devices; "
            "any other script: start it with `distenv run [--nproc-per-node N] -- python "
            "script.py ...` so that torch's launcher starts them.")
    install()
    from . import _teardown

    # Whoever starts the process group (the script, Accelerate, Lightning), it ends in order
    # at exit: torch's gloo threads can otherwise abort a finished job (see distenv._teardown).
    _teardown.register()
    return found


_EXPORTED_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                   "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")


def install() -> None:
    """Put the import hook first on sys.meta_path; patch frameworks already imported."""
    global _finder
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
    for name in HOOKS:
        if name in sys.modules:
            _pending.append(name)
    if _pending and _depth == 0:
        _run_pending()


def deactivate(environ: "MutableMapping[str, str] | None" = None) -> None:
    """Undo `activate`: remove the hook and restore the variables it exported."""
    global _finder, env
    target: "MutableMapping[str, str]" = os.environ if environ is None else environ
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None
    for name, old in exported.items():
        if old is None:
            target.pop(name, None)
        else:
            target[name] = old
    exported.clear()
    env = None


def _acts(adapter_module: str) -> bool:
    """Does the resolved launch's source let this adapter act (`Source.adapters`)?"""
    from .sources import adapter_acts

    return adapter_acts(env.launcher if env is not None else None, adapter_module.rsplit(".", 1)[-1])


def _run_pending() -> None:
    while _pending:
        name = _pending.pop(0)
        entry = HOOKS.get(name)
        if entry is None:
            continue
        key = f"{entry[0]}:{entry[1]}"
        if key in skipped or (key in applied and key not in EACH_IMPORT):
            continue
        if env is not None and not _acts(entry[0]):
            # The launch's source leaves this framework to its own set-up (a TPU pod and
            # torch-xla): say so once, patch nothing.
            skipped[key] = f"{env.launcher} leaves {name} to its own set-up (Source.adapters)"
            from .log import get_logger

            get_logger(__name__).info(f"{name} is not patched: {skipped[key]}.")
            continue
        import importlib

        try:
            adapter = importlib.import_module(entry[0])
        except ImportError as exc:
            if getattr(exc, "name", None) != entry[0]:
                raise
            adapter = None
        function = getattr(adapter, entry[1], None)
        if function is None:
            why = f"{entry[0]}.{entry[1]}() does not exist in this distenv"
            skipped[key] = why
            from .log import get_logger

            get_logger(__name__).warning(f"{name} was imported but is not patched: {why}.")
            continue
        if key not in applied:
            applied.append(key)
        function()


class _Finder:
    """Finds nothing itself: for a hooked top-level module, asks the finders after it and
    wraps the loader of the spec they return."""

    def find_spec(self, name: str, path: "Sequence[str] | None" = None,
                  target: "ModuleType | None" = None) -> "ModuleSpec | None":
        if name not in HOOKS:
            return None
        from ._teardown import spec_from_others

        spec: "ModuleSpec | None" = spec_from_others(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, name)  # type: ignore[assignment]  # a Loader by duck typing (importlib.abc costs start-up time)
        return spec

    def invalidate_caches(self) -> None:
        pass


class _Loader:
    """Delegates to the real loader; after the module's body ran, applies the adapter once
    the outermost hooked import is complete (so a framework importing another hooked one,
    transformers -> accelerate, is patched when both are whole)."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.loader, attr)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        create = getattr(self.loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: "ModuleType") -> None:
        global _depth
        # The module's own code, and everything after, sees its real loader.
        module.__loader__ = self.loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        _depth += 1
        try:
            self.loader.exec_module(module)
        finally:
            _depth -= 1
        _pending.append(self.name)
        if _depth == 0:
            _run_pending()


# A DistEnvError a hook raises inside the script (at `import lightning`, ...) ends it with
# its one line, as `distenv.errors.install_excepthook` says.
install_excepthook()
activate(reason="DISTENV_AUTO=1" if "distenv._autostart" in sys.modules else "import distenv.auto")
