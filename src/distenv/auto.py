"""Zero-code distenv: ``import distenv.auto`` (or ``DISTENV_AUTO=1``, see `distenv._autostart`).

In a distributed launch this

1. resolves the launch and exports the canonical torch variables (``MASTER_ADDR``,
   ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...; never overwriting a
   different value: that is a `DistEnvError`), and
2. installs an import hook (a `sys.meta_path` finder whose loader wraps the real one) that
   applies distenv's framework adapters right after -- and only when -- the script imports
   Lightning, Transformers/Accelerate, DeepSpeed, TensorFlow or JAX. A framework imported before
   ``distenv.auto`` is patched at once.

Outside a distributed launch (a single process) it writes no variable and patches no framework,
with two exceptions. Lightning's patch alone is installed (no torch variable: only, when a
Trainer(devices=2) starts its workers, the hand-off they read): with no launcher, those workers
are handed this process as their node; in the one process `distenv run` started, such a
Trainer (which would wait forever for a rank 1 nothing starts) fails in one line. And where no
launcher started this process: a script's own
``torch.distributed.init_process_group()`` with torch's env:// defaults and no ``RANK`` or
``WORLD_SIZE`` -- torch's "environment variable RANK expected" -- gets the one-process job that
``distenv run`` exports (``RANK=0``, ``WORLD_SIZE=1``, ``MASTER_ADDR=127.0.0.1``, a port derived
from the process id, ...), written at that call, when one process is proven (`one_process`);
otherwise that call raises one `DistEnvError` line saying what to do. It never imports a
framework itself; the adapters it calls are the same public entry points a script could call by
hand (`HOOKS`).
"""

from __future__ import annotations

import os
import sys

from .bringup.teardown import WrappingLoader, spec_from_others
from .core.description import PER_NODE
from . import knobs
from .errors import install_excepthook

TYPE_CHECKING = False  # typing stays out of interpreter start (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    from .core.description import DistEnv

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
#: The only adapter modules the hooks apply (None: every one): Lightning's, in one process.
_only: "frozenset[str] | None" = None
_pending: "list[str]" = []
_depth = 0


def activate(environ: "MutableMapping[str, str] | None" = None, reason: str = "import distenv.auto"
             ) -> "DistEnv | None":
    """Resolve, export and install the hooks; returns the DistEnv, or None when the launch
    is not distributed (then nothing is changed). Idempotent."""
    global env
    if _finder is not None:
        return env
    from .bringup import bring_up

    target: "MutableMapping[str, str]" = os.environ if environ is None else environ
    before = {name: target.get(name) for name in _EXPORTED_NAMES}
    # Resolve; in a distributed launch, complete from the launcher's service what the
    # variables left unknown (MPICH across nodes, or a command `distenv run` exec'ed after
    # asking) and export torch's variables where the launch's source lets torch act (a TPU
    # pod's hosts are not torch-xla's ranks, Frameworks.adapters); whoever starts the process group
    # (the script, Accelerate, Lightning), it ends in order at exit (distenv.bringup.teardown).
    found = bring_up("auto", environ=environ, target=target)
    if not found.is_distributed:
        if environ is None and found.launcher == "none" and found.launch != PER_NODE:
            _offer_one_process(found)
        lone = found.launcher == "none" and found.job_id is None and one_process(target) is None
        if environ is None and found.launch != PER_NODE and (lone or target.get(knobs.RUN)):
            # One process, where a Trainer(devices=2) goes wrong without distenv's Lightning
            # patch (no torch variable; the workers' hand-off): with no launcher, the workers
            # Lightning starts get no RANK (the patch hands them this process as their node);
            # in distenv run's one process LOCAL_RANK is set, so Lightning starts none and
            # waited forever for its rank 1 (the patch makes that its one-line devices error).
            global _only
            _only = frozenset({"distenv.lightning"})
            install()
        return None
    env = found
    exported.update({name: old for name, old in before.items() if target.get(name) != old})
    if found.launch == PER_NODE and not target.get(knobs.RUN):
        from .log import get_logger  # lazy: logging costs milliseconds at interpreter start

        get_logger(__name__).warning(
            f"this is a per-node launch ({reason}): this process stands for node "
            f"{found.node_rank} of {found.num_nodes}, and its {found.nproc_per_node} worker(s) are "
            "still to be started. A Lightning Trainer starts them itself (patched by distenv); "
            "a JAX or Keras 3 (JAX) script runs as the node's one JAX process, owning its devices; "
            "any other script: start it with `distenv run [--nproc-per-node N] -- python "
            "script.py ...` so that torch's launcher starts them.")
    install()
    return found


_EXPORTED_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                   "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")


# -- no launcher: torch's env:// default as under `distenv run` ---------------------------------
#: The description of a process no launcher started (None elsewhere): what a script's
#: torch.distributed.init_process_group() gets (see the module docstring).
single: "DistEnv | None" = None


def one_process(environ: "Mapping[str, str]") -> "str | None":
    """None when one process is proven (no launcher, and no platform whose framework numbers
    its own processes: the single source's FRAMEWORK_PLATFORMS), else why it is not."""
    from .sources.single import FRAMEWORK_PLATFORMS

    for var, what in FRAMEWORK_PLATFORMS:
        if var in environ:
            return f"{var} is set ({what})"
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return ("this process was started by another Python process (multiprocessing, "
                "torch.multiprocessing.spawn), which may have started others")
    return None


def _offer_one_process(found: "DistEnv") -> None:
    """Wrap torch.distributed.init_process_group once torch.distributed is imported (at once
    if it is)."""
    global single
    single = found
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        _wrap_init(dist)
    elif not any(isinstance(f, _OneProcessFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _OneProcessFinder())


def _wrap_init(dist: "ModuleType") -> None:
    original = getattr(dist, "init_process_group", None)
    if original is None or getattr(original, "_distenv_one_process", False):
        return
    import functools

    @functools.wraps(original)
    def init_process_group(*args: "Any", **kwargs: "Any") -> "Any":
        _before_init(original, args, kwargs)
        return original(*args, **kwargs)

    init_process_group._distenv_one_process = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group  # type: ignore[attr-defined]


def _before_init(original: "Any", args: "tuple[Any, ...]", kwargs: "dict[str, Any]") -> None:
    """A call torch would end with "environment variable RANK expected" (env:// by default, no
    rank or world size given or set; MPI, which numbers its own, aside): fill in the one-process
    job, or say in one line why not. Any other call is left as it is."""
    if single is None or "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    import inspect

    try:
        call = inspect.signature(original).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return  # torch itself says what is wrong with the call
    if call.get("store") is not None or call.get("init_method") not in (None, "env://") \
            or call.get("rank", -1) != -1 or call.get("world_size", -1) != -1 \
            or "mpi" in str(call.get("backend") or "").lower():
        return
    why_not = one_process(os.environ)
    if why_not is not None:
        from .errors import DistEnvError

        raise DistEnvError(
            "torch.distributed.init_process_group() needs RANK and WORLD_SIZE, no launcher set "
            f"them, and DISTENV_AUTO cannot prove this is a single process: {why_not}. Fix: start "
            "the processes with a launcher (torchrun, mpirun, srun, distenv run --nproc-per-node "
            "N), or pass rank= and world_size= (or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).")
    from .core.export import variables

    written = []
    for name, value in variables(single).items():
        if value is not None and name not in os.environ:
            os.environ[name] = str(value)
            exported.setdefault(name, None)
            written.append(f"{name}={value}")
    from .log import get_logger

    get_logger(__name__).debug(
        "no launcher: torch.distributed.init_process_group() joins a one-process job, as under "
        "distenv run (%s)", ", ".join(written))


class _OneProcessFinder:
    """Finds nothing itself: for ``torch.distributed``, wraps the loader the other finders
    return so that `_wrap_init` runs once the module's body did; then leaves sys.meta_path."""

    def find_spec(self, name: str, path: "Sequence[str] | None" = None,
                  target: "ModuleType | None" = None) -> "ModuleSpec | None":
        if name != "torch.distributed":
            return None
        spec: "ModuleSpec | None" = spec_from_others(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _OneProcessLoader(spec.loader)  # type: ignore[assignment]  # a Loader by duck typing
        return spec

    def invalidate_caches(self) -> None:
        pass


class _OneProcessLoader(WrappingLoader):
    def run(self, module: "ModuleType") -> None:
        self.loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _OneProcessFinder)]
        _wrap_init(module)


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
    """Undo `activate`: remove the hooks and restore the variables it exported."""
    global _finder, env, single, _only
    target: "MutableMapping[str, str]" = os.environ if environ is None else environ
    _only = None
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None
    single = None  # a wrapped init_process_group, if any, now passes every call through
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _OneProcessFinder)]
    for name, old in exported.items():
        if old is None:
            target.pop(name, None)
        else:
            target[name] = old
    exported.clear()
    env = None


def _acts(adapter_module: str) -> bool:
    """Does the resolved launch's source let this adapter act (`Frameworks.adapters`)?"""
    from .sources import adapter_acts

    return adapter_acts(env.launcher if env is not None else None, adapter_module.rsplit(".", 1)[-1])


def _run_pending() -> None:
    while _pending:
        name = _pending.pop(0)
        entry = HOOKS.get(name)
        if entry is None:
            continue
        key = f"{entry[0]}:{entry[1]}"
        if key in skipped or (key in applied and key not in EACH_IMPORT) or (
                _only is not None and entry[0] not in _only):
            continue
        if env is not None and not _acts(entry[0]):
            # The launch's source leaves this framework to its own set-up (a TPU pod and
            # torch-xla): say so once, patch nothing.
            skipped[key] = f"{env.launcher} leaves {name} to its own set-up (Frameworks.adapters)"
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
        spec: "ModuleSpec | None" = spec_from_others(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, name)  # type: ignore[assignment]  # a Loader by duck typing (importlib.abc costs start-up time)
        return spec

    def invalidate_caches(self) -> None:
        pass


class _Loader(WrappingLoader):
    """Delegates to the real loader; after the module's body ran, applies the adapter once
    the outermost hooked import is complete (so a framework importing another hooked one,
    transformers -> accelerate, is patched when both are whole). The module's own code, and
    everything after, sees its real loader."""

    def __init__(self, loader: Any, name: str) -> None:
        super().__init__(loader)
        self.name = name

    def run(self, module: "ModuleType") -> None:
        global _depth
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
