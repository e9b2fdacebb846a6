"""Lightning: a `ClusterEnvironment` that is right under every launcher.

    from distenv.lightning import DistenvEnvironment, trainer_kwargs

    trainer = Trainer(max_epochs=3, plugins=[DistenvEnvironment()], **trainer_kwargs())

The same line works with the `lightning` package (``lightning.pytorch.Trainer``,
``lightning.fabric.Fabric``) and with the separate `pytorch_lightning` / `lightning_fabric`
packages: their two `ClusterEnvironment` base classes are distinct, and `DistenvEnvironment`
is registered as a (virtual) subclass of each one imported in the process, so either
Trainer accepts it from ``plugins=[...]``.

What it does, by launch (see `distenv.resolve`):

* **per-process** (mpirun, srun, torchrun, a platform started every worker): the launcher
  created the processes (``creates_processes_externally`` is True) and ranks, sizes and the
  master come from distenv, never from Lightning's arithmetic. Without this plugin Lightning
  under mpirun (no mpi4py) falls back to its default environment: every rank believes it
  is rank 0 and the job silently trains N independent copies.
* **per-node** (one process per node that must start the workers, e.g. an MPI job with
  one process per node and ``DISTENV_NPROC_PER_NODE=2``, or an Azure ML MPI job with
  ``process_count_per_node=1`` on GPU nodes): Lightning starts ``devices`` workers on each
  node, with distenv's node rank, node count, master address and port.
* **Lightning's on-prem launch** (its guide: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` =
  the total number of processes and ``NODE_RANK`` on each node, then ``python train.py`` with
  ``Trainer(devices=N, num_nodes=M)``): a per-node launch whose workers per node are the
  Trainer's devices; ``N x M`` must be ``WORLD_SIZE`` (else a `DistEnvError` naming both).
* **no launcher** (``python train.py``): one node; Lightning may start ``devices`` workers
  itself, as it does without a plugin.

`validate_settings` (called by Lightning before it starts or joins workers, and by a guard
when a single-device Trainer would silently train alone) raises `DistEnvError` naming the
``Trainer(devices=..., num_nodes=...)`` values that match the launch. `trainer_kwargs()`
returns exactly those values.

Lightning is imported lazily: ``import distenv.lightning`` costs nothing without it.
"""

from __future__ import annotations

import os
import sys

from . import resolve
from .bringup import ALWAYS, NEVER, bring_up
from .core.description import PER_NODE, PER_PROCESS, DistEnv
from .errors import DistEnvError, install_excepthook
from .knobs import RUN

# The hand-off to the workers Lightning starts is a source (read back by resolve() in them).
from .sources import family
from .sources.lightning_node import VARIABLE, hand_off

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping
    from typing import Any

#: Set by a per-node process for the workers Lightning starts from it: its DistEnv as JSON.
WORKER_VAR = VARIABLE

# (module holding the ClusterEnvironment base class, module of the Trainer's strategies)
_PACKAGES = (
    ("lightning.fabric.plugins.environments", "lightning.pytorch.strategies"),
    ("lightning_fabric.plugins.environments", "pytorch_lightning.strategies"),
)
_ROOTS = {"lightning.fabric.plugins.environments": ("lightning", "lightning.fabric"),
          "lightning_fabric.plugins.environments": ("lightning_fabric", "pytorch_lightning")}


# -- what the launch means for a Trainer (pure; unit-tested on environments) ----------------------
def _alone(launcher: "str | None") -> bool:
    """No launcher started this process (its source's family is "none")."""
    return family(launcher) == "none"


def _spawns(env: DistEnv) -> bool:
    """Lightning starts the workers of this launch (per-node, or a lone process)."""
    return env.launch == PER_NODE or _alone(env.launcher)


def _nodes(env: DistEnv) -> "int | None":
    if env.num_nodes is not None:
        return env.num_nodes
    size, local = env.world_size, env.local_world_size
    if size is not None and local and size % local == 0:
        return size // local  # equal counts per node: the only layout Lightning supports
    return None


def settings(env: DistEnv) -> "tuple[int, int]":
    """The (devices, num_nodes) a Trainer needs for this launch; DistEnvError if none fit."""
    if _alone(env.launcher) and env.launch == PER_PROCESS:
        return 1, 1
    if env.launch == PER_NODE:
        if env.nproc_per_node is None and env.world_size is not None:
            # Lightning's on-prem launch: WORLD_SIZE is the total, the Trainer gives devices.
            raise DistEnvError(
                f"this per-node launch gives world_size={env.world_size} "
                f"({env.provenance.get('world_size', '')}) but not the workers per node, which "
                "the Trainer gives. Fix: Trainer(devices=<workers per node>, num_nodes="
                f"{env.world_size}/<workers per node>), or set DISTENV_NPROC_PER_NODE.")
        if env.nproc_per_node is None or env.num_nodes is None:
            raise DistEnvError(
                f"per-node launch with nproc_per_node={env.nproc_per_node}, num_nodes="
                f"{env.num_nodes}: Lightning needs both. Fix: set DISTENV_NPROC_PER_NODE=<workers "
                "per node>, or run `distenv show --explain` to see what the launcher revealed."
            )
        return env.nproc_per_node, env.num_nodes
    size, local, nodes = env.world_size, env.local_world_size, _nodes(env)
    if size is None or local is None or nodes is None:
        raise DistEnvError(
            f"{env.launcher} reveals world_size={size}, local_world_size={local}, num_nodes="
            f"{env.num_nodes}: Lightning needs the processes per node and the node count. "
            "Fix: export WORLD_SIZE/LOCAL_WORLD_SIZE for every rank, or run `distenv show "
            "--explain` to see what is known."
        )
    if local * nodes != size:
        raise DistEnvError(
            f"{env.launcher} started {size} processes on {nodes} nodes, {local} on this one "
            f"({env.provenance.get('local_world_size', '')}): Lightning needs the same number on "
            "every node. Fix: launch an equal count per node (srun --ntasks-per-node=N, mpirun "
            "--map-by ppr:N:node)."
        )
    return local, nodes


def trainer_kwargs(environ: "Mapping[str, str] | None" = None, **overrides: Any) -> "dict[str, Any]":
    """``{"devices": ..., "num_nodes": ...}`` matching the launch: pass them to the Trainer.

    A lone process (no launcher) gets ``devices=1``: to use several, start them with a
    launcher or set DISTENV_NPROC_PER_NODE=N so that Lightning starts N.
    """
    devices, nodes = settings(_resolve(environ, overrides))
    return {"devices": devices, "num_nodes": nodes}


def _resolve(environ: "Mapping[str, str] | None", overrides: "dict[str, Any]",
             teardown: str = NEVER) -> DistEnv:
    """The launch (`distenv.bringup.bring_up`: a per-node launch is Lightning's to start; what
    the variables leave unknown, the node index and count too, comes from the launcher's
    service -- every rank builds its Trainer, so every rank takes part). A worker Lightning
    started from a per-node process is described by the ``lightning`` source
    (`distenv.sources.lightning_node`) from the node's hand-off."""
    _refuse_if_elsewhere(environ, overrides)
    return bring_up("lightning", environ=environ, overrides=overrides, teardown=teardown)


def mismatch_message(env: DistEnv, num_devices: int, num_nodes: int, name: str = "Trainer"
                     ) -> "str | None":
    """Why Trainer(devices=num_devices, num_nodes=num_nodes) contradicts the launch, or None
    (`name`: "Fabric" for a Fabric's)."""
    message = _mismatch(env, num_devices, num_nodes)
    return message.replace("Trainer(", f"{name}(") if message and name != "Trainer" else message


def _mismatch(env: DistEnv, num_devices: int, num_nodes: int) -> "str | None":
    if _alone(env.launcher) and env.launch == PER_PROCESS:
        if num_nodes == 1:
            return None  # Lightning starts `devices` workers on this one node
        return (f"Trainer(num_nodes={num_nodes}) but this is a single process with no launcher "
                f"({env.provenance.get('launcher', '')}); nothing starts it on other nodes. Fix: "
                "Trainer(num_nodes=1), or start one process per node or per worker with your "
                "launcher (srun, mpirun, torchrun) and use **distenv.lightning.trainer_kwargs().")
    if env.launch == PER_NODE and env.nproc_per_node is None and env.world_size is not None:
        return _world_mismatch(env, num_devices, num_nodes)
    devices, nodes = settings(env)
    if (num_devices, num_nodes) == (devices, nodes):
        return None
    if env.launch == PER_NODE:
        what = (f"this per-node launch has {env.num_nodes} node(s) and {env.nproc_per_node} "
                f"worker(s) per node for Lightning to start ({env.provenance.get('nproc_per_node', '')})")
    else:
        what = (f"{env.launcher} started {env.world_size} process(es), {env.local_world_size} on "
                f"this node, on {nodes} node(s) ({env.provenance.get('world_size', '')})")
        if num_devices * num_nodes == 1:
            what += ("; with devices=1 each process would train alone, believing it is rank 0 "
                     "(duplicate jobs)")
    return (f"Trainer(devices={num_devices}, num_nodes={num_nodes}) contradicts the launch: "
            f"{what}. Fix: Trainer(devices={devices}, num_nodes={nodes}), i.e. "
            "Trainer(..., **distenv.lightning.trainer_kwargs()).")


def _world_mismatch(env: DistEnv, num_devices: int, num_nodes: int) -> "str | None":
    """Lightning's on-prem launch (WORLD_SIZE = the total, NODE_RANK, the Trainer's devices):
    devices x num_nodes must be WORLD_SIZE, and this node one of them."""
    size, node = env.world_size, env.node_rank
    assert size is not None
    if num_devices * num_nodes == size and (node is None or node < num_nodes):
        return None
    if num_devices * num_nodes != size:
        fit = (f"Trainer(devices={num_devices}, num_nodes={size // num_devices})"
               if size % num_devices == 0 else "devices x num_nodes = WORLD_SIZE")
        return (f"Trainer(devices={num_devices}, num_nodes={num_nodes}) makes "
                f"{num_devices * num_nodes} processes but the launch says world_size={size} "
                f"({env.provenance.get('world_size', '')}). Fix: {fit}, or set WORLD_SIZE to "
                "the total number of processes on every node.")
    return (f"Trainer(num_nodes={num_nodes}) but this node's node_rank={node} "
            f"({env.provenance.get('node_rank', '')}). Fix: NODE_RANK 0..{num_nodes - 1}, one "
            "per node, or the Trainer's num_nodes.")


# -- registration with the Lightning packages -------------------------------------------------------
_registered: "set[Any]" = set()


def _register() -> None:
    """Make DistenvEnvironment a virtual subclass of each imported ClusterEnvironment base, and
    guard each imported Trainer's single-device strategy (see _guard_single_device).

    Imports a package only when none is imported yet (then every installed one). Without
    Lightning installed it does nothing: there is no Trainer to accept the plugin anyway.
    """
    wanted = [p for p in _PACKAGES if any(r in sys.modules for r in _ROOTS[p[0]])]
    before_import = not wanted
    if before_import:
        # Created before any Lightning import: register with every installed package, since
        # the Trainer that will receive this plugin may come from either -- and guard its
        # Trainer now: importing lightning_fabric does not import pytorch_lightning, whose
        # Trainer(devices=1) then trained alone (review, 2026-12-07).
        import importlib.util

        wanted = [p for p in _PACKAGES if importlib.util.find_spec(_ROOTS[p[0]][0]) is not None]
    import importlib

    for env_module, strategies in wanted:
        if env_module not in _registered:
            importlib.import_module(env_module).ClusterEnvironment.register(DistenvEnvironment)
            _registered.add(env_module)
        _guard_fabric(getattr(importlib.import_module(
            env_module.replace("plugins.environments", "connector")), "_Connector", None))
        trainer_pkg = strategies.rsplit(".", 1)[0]  # lightning.pytorch / pytorch_lightning
        if trainer_pkg not in sys.modules and not (
                before_import and importlib.util.find_spec(trainer_pkg.split(".")[0]) is not None):
            continue  # Fabric only (or the Trainer package is not imported: nothing to guard)
        _guard_single_device(importlib.import_module(strategies).SingleDeviceStrategy)


def _guard_single_device(cls: Any) -> None:
    """Lightning never consults a ClusterEnvironment for a single-device Trainer: with
    Trainer(devices=1) on a 2-process launch each process would train alone as rank 0.
    Wrap `setup_environment` so that a Trainer given a DistenvEnvironment validates it."""
    original = cls.setup_environment
    if getattr(original, "_distenv_guard", False):
        return

    def setup_environment(self: Any, *args: Any, **kwargs: Any) -> Any:
        module = getattr(self, "_lightning_module", None)
        trainer = getattr(module, "_trainer", None)
        env = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        if isinstance(env, DistenvEnvironment):
            env.validate_settings(num_devices=1, num_nodes=getattr(trainer, "num_nodes", 1))
        return original(self, *args, **kwargs)

    setup_environment._distenv_guard = True  # type: ignore[attr-defined]
    setup_environment.__wrapped__ = original  # type: ignore[attr-defined]
    setup_environment.__doc__ = original.__doc__
    cls.setup_environment = setup_environment


def _guard_fabric(cls: Any) -> None:
    """The same for Fabric: its single-device strategy (devices=1, or the default on CPU) runs
    no launcher, which is where Lightning validates: on a 2-process launch each process ran
    as rank 0 of 1. Wrap the connector's last step so that a Fabric given a DistenvEnvironment
    whose strategy numbers no ranks (no `_set_world_ranks`) validates it."""
    original = getattr(cls, "_lazy_init_strategy", None)  # private: a release without it stays unguarded
    if original is None or getattr(original, "_distenv_guard", False):
        return

    def _lazy_init_strategy(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        env = getattr(self, "cluster_environment", None)
        if isinstance(env, DistenvEnvironment) and not hasattr(self.strategy, "_set_world_ranks"):
            message = mismatch_message(env._env, 1, getattr(self, "_num_nodes_flag", 1), "Fabric")
            if message:
                raise DistEnvError(message)
        return out

    _lazy_init_strategy._distenv_guard = True  # type: ignore[attr-defined]
    _lazy_init_strategy.__wrapped__ = original  # type: ignore[attr-defined]
    cls._lazy_init_strategy = _lazy_init_strategy


# -- zero-code: every Trainer / Fabric gets a DistenvEnvironment ---------------------------------
# (top-level package that must already be imported, connector module, connector class)
_CONNECTORS = (
    ("lightning.pytorch", "lightning.pytorch.trainer.connectors.accelerator_connector",
     "_AcceleratorConnector"),
    ("pytorch_lightning", "pytorch_lightning.trainer.connectors.accelerator_connector",
     "_AcceleratorConnector"),
    ("lightning.fabric", "lightning.fabric.connector", "_Connector"),
    ("lightning_fabric", "lightning_fabric.connector", "_Connector"),
)


def patch() -> "list[str]":
    """Make every ``Trainer`` and ``Fabric`` created from now on run the resolved launch,
    without ``plugins=[DistenvEnvironment()]`` in the script (`distenv.auto` calls this when
    the script imports Lightning). Idempotent; returns the connectors now patched.

    For a distributed launch, a Trainer/Fabric given no ClusterEnvironment of its own gets a
    `DistenvEnvironment` (Lightning alone picks its default environment under mpirun without
    mpi4py: every rank trains alone as rank 0), and ``devices="auto"`` (the default) becomes
    the launch's processes per node (or workers per node for a per-node launch), with
    ``num_nodes`` the launch's node count when left at 1. Explicit values that contradict
    the launch are a `DistEnvError` naming the right ones (`validate_settings`). Outside a
    distributed launch Lightning's own choices are untouched. Patches the Lightning packages
    already imported (every installed one if none is).
    """
    import importlib

    wanted = [c for c in _CONNECTORS if c[0] in sys.modules]
    if not wanted:
        import importlib.util

        wanted = [c for c in _CONNECTORS if importlib.util.find_spec(c[0].split(".")[0]) is not None]
    done = []
    for _root, module, name in wanted:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:  # a Lightning without this private class
            raise DistEnvError(
                f"distenv.lightning.patch() cannot find {module}.{name} ({exc}) in this Lightning "
                "version. Fix: pass plugins=[distenv.lightning.DistenvEnvironment()] to the "
                "Trainer/Fabric instead.") from None
        _patch_connector(cls)
        done.append(f"{module}.{name}")
    return done


def _launch_environment(connector: Any) -> "DistenvEnvironment | None":
    """The DistenvEnvironment this connector will use, or None (not distributed, or the
    user brought another ClusterEnvironment: theirs wins). Resolved once per connector."""
    flag = getattr(connector, "_cluster_environment_flag", None)
    if flag is not None and not isinstance(flag, str):  # plugins=[...] gave one
        return flag if isinstance(flag, DistenvEnvironment) else None
    if "_distenv_environment" not in connector.__dict__:
        from .sources import adapter_acts

        # No launcher: Lightning's own choice (its XLA environment on a TPU VM, ...); a launch
        # whose source leaves torch frameworks alone (a TPU pod: torch-xla numbers per chip)
        # or Lightning to its own integration (Ray Train's RayLightningEnvironment).
        launcher = resolve().launcher
        acts = not _alone(launcher) and adapter_acts(launcher, "lightning")
        connector._distenv_environment = DistenvEnvironment() if acts else None
    found: "DistenvEnvironment | None" = connector._distenv_environment
    return found


def _hand_off_own(connector: Any, chosen: Any) -> None:
    """No launcher, and Lightning's own environment is about to start this process's workers
    (Trainer(devices=2) in a plain `python train.py`): they inherit WORLD_SIZE, NODE_RANK and
    LOCAL_RANK but no RANK, which distenv in each (patch(), DISTENV_AUTO) cannot place. Hand
    them this process as their node, with the master Lightning chose (review, 2026-12-07:
    every worker stopped)."""
    devices = len(getattr(connector, "_parallel_devices", ()) or ()) or 1
    # Only Lightning's default environment, whose workers are this script started again with
    # LOCAL_RANK (its subprocess launcher): not XLA's on a TPU VM whose variables were not yet
    # set at start, whose processes torch-xla numbers per chip.
    if (type(chosen).__name__ != "LightningEnvironment" or chosen.creates_processes_externally
            or "LOCAL_RANK" in os.environ or devices < 2
            or getattr(connector, "_num_nodes_flag", 1) != 1):
        return
    env = resolve()
    if not _alone(env.launcher):
        return
    node = env.replace(master_addr=chosen.main_address, master_port=int(chosen.main_port))
    os.environ[WORKER_VAR] = hand_off(node, devices, 1)


def _refuse_if_elsewhere(environ: "Mapping[str, str] | None", overrides: "dict[str, Any]") -> None:
    """One line when the launch runs Lightning through its own integration (`Frameworks.instead`)."""
    from .sources import source_of

    source = source_of(resolve(environ, **overrides).launcher)
    fix = source.frameworks.instead.get("lightning")
    if fix:
        raise DistEnvError(f"distenv's Lightning plugin inside {source.title}: {source.title} runs this "
                           f"Trainer's processes with its own Lightning integration. Fix: {fix}.")


def _launch_devices(env: DistEnv, devices: Any, num_nodes: int) -> "tuple[Any, int]":
    """Trainer(devices=, num_nodes=) with the defaults filled from the launch."""
    if devices != "auto":
        return devices, num_nodes  # explicit: validate_settings checks it against the launch
    if env.launch == PER_NODE and env.nproc_per_node is None and env.world_size is not None:
        return devices, num_nodes  # the Trainer's devices decide; validate_settings checks them
    launch_devices, launch_nodes = settings(env)
    return launch_devices, (launch_nodes if num_nodes == 1 else num_nodes)


def _patch_connector(cls: Any) -> None:
    choose = cls._choose_and_init_cluster_environment
    if getattr(choose, "_distenv_patched", False):
        return
    check_devices = cls._check_device_config_and_set_final_flags

    def _check_device_config_and_set_final_flags(self: Any, devices: Any, num_nodes: int) -> Any:
        env = _launch_environment(self)
        if env is not None:
            devices, num_nodes = _launch_devices(env.env, devices, num_nodes)
        return check_devices(self, devices=devices, num_nodes=num_nodes)

    def _choose_and_init_cluster_environment(self: Any) -> Any:
        env = _launch_environment(self)
        if env is None:
            chosen = choose(self)
            _hand_off_own(self, chosen)
            return chosen
        # The devices are parsed by now; a single-device Trainer never consults its
        # environment again, so check here that it is not one of N processes training alone.
        env.validate_settings(len(self._parallel_devices) or 1, self._num_nodes_flag)
        return env

    wrappers: "tuple[tuple[Any, Any], ...]" = ((_check_device_config_and_set_final_flags, check_devices),
                                               (_choose_and_init_cluster_environment, choose))
    for new, old in wrappers:
        new._distenv_patched = True
        new.__wrapped__ = old
        new.__doc__ = old.__doc__
        setattr(cls, old.__name__, new)


def unpatch() -> None:
    """Undo `patch` on every connector class it changed (tests)."""
    import importlib

    for root, module, name in _CONNECTORS:
        if module not in sys.modules:
            continue
        cls = getattr(importlib.import_module(module), name)
        for attr in ("_check_device_config_and_set_final_flags", "_choose_and_init_cluster_environment"):
            method = cls.__dict__.get(attr)
            if getattr(method, "_distenv_patched", False):
                setattr(cls, attr, method.__wrapped__)


# -- the plugin ----------------------------------------------------------------------------------
class DistenvEnvironment:
    """A Lightning ``ClusterEnvironment`` backed by `distenv.resolve()`.

    ``DistenvEnvironment(environ=None, **overrides)``: `environ` and `overrides` go to
    `distenv.resolve` (tests, or forcing a field). Raises `DistEnvError` at once when the
    launch cannot be described, so a bad environment fails before any training starts.
    """

    def __init__(self, environ: "MutableMapping[str, str] | None" = None, **overrides: Any) -> None:
        self._environ: "MutableMapping[str, str]" = os.environ if environ is None else environ
        # The Trainer's process group ends before Python does (bring_up registers distenv.bringup.teardown).
        self._env = _resolve(environ, overrides, teardown=ALWAYS)
        self._global_rank: "int | None" = None
        self._world_size: "int | None" = None
        self._devices: "int | None" = None  # the Trainer's devices, once validated
        if self._env.launch == PER_PROCESS and self._env.is_distributed and (
                self._env.rank is None or self._env.world_size is None):
            from .core.export import missing_message

            raise DistEnvError(missing_message(self._env, [n for n, v in (
                ("RANK", self._env.rank), ("WORLD_SIZE", self._env.world_size)) if v is None]))
        _register()

    def __getstate__(self) -> "dict[str, Any]":
        # Picklable for spawn-based strategies: os.environ is the child's own there, and a
        # DistEnv (frozen, slotted) travels as its values.
        state = dict(self.__dict__)
        if state["_environ"] is os.environ:
            state["_environ"] = None
        e = state["_env"]
        state["_env"] = (e.to_dict(), dict(e.provenance), tuple(e.notes))
        return state

    def __setstate__(self, state: "dict[str, Any]") -> None:
        values, why, notes = state.pop("_env")
        self.__dict__.update(state)
        self._env = DistEnv(values, why, notes)
        if self.__dict__.get("_environ") is None:  # pickled from os.environ: the child's own
            self._environ = os.environ

    # -- distenv's view --------------------------------------------------------------------------
    @property
    def env(self) -> DistEnv:
        """The resolved launch this environment answers from."""
        return self._env

    def __repr__(self) -> str:
        e = self._env
        return (f"DistenvEnvironment(launcher={e.launcher!r}, launch={e.launch!r}, "
                f"rank={e.rank}, world_size={e.world_size}, node_rank={e.node_rank})")

    # -- ClusterEnvironment -------------------------------------------------------------------------
    @property
    def creates_processes_externally(self) -> bool:
        """True when the launcher started this process as a worker; False for a per-node
        process (or a lone one), from which Lightning starts the node's workers. A worker
        Lightning started has LOCAL_RANK set (by Lightning)."""
        if _spawns(self._env):
            return "LOCAL_RANK" in self._environ
        return True

    @property
    def main_address(self) -> str:
        addr = self._env.master_addr
        if addr is None:
            from .core.export import missing_message

            raise DistEnvError(missing_message(self._env, ["MASTER_ADDR"]))
        return addr

    @property
    def main_port(self) -> int:
        port = self._env.master_port
        assert port is not None  # distenv always has one (derived, else 29500)
        return int(port)

    @staticmethod
    def detect() -> bool:
        """True when distenv can describe this process's launch (any launcher, or none)."""
        try:
            resolve()
        except DistEnvError:
            return False
        return True

    def world_size(self) -> int:
        if self._world_size is not None:
            return self._world_size
        if self._env.world_size is not None:
            return self._env.world_size
        return 1

    def set_world_size(self, size: int) -> None:
        # Lightning's arithmetic (num_nodes * devices) is used only for workers it starts.
        if _spawns(self._env):
            self._world_size = int(size)

    def global_rank(self) -> int:
        if self._global_rank is not None:
            return self._global_rank
        if not _spawns(self._env):
            rank = self._env.rank
            assert rank is not None  # __init__ refused a distributed launch without it
            return rank
        nproc = self._env.nproc_per_node or self._devices or 1
        return (self._env.node_rank or 0) * nproc + self.local_rank()

    def set_global_rank(self, rank: int) -> None:
        if _spawns(self._env):
            self._global_rank = int(rank)
            try:  # as Lightning's own environment does
                from lightning_utilities.core.rank_zero import rank_zero_only

                rank_zero_only.rank = int(rank)
            except ImportError:  # pragma: no cover - lightning always ships it
                pass

    def local_rank(self) -> int:
        if _spawns(self._env):
            return int(self._environ.get("LOCAL_RANK", 0))
        return self._env.local_rank if self._env.local_rank is not None else 0

    def node_rank(self) -> int:
        e = self._env
        if e.node_rank is not None:
            return e.node_rank
        # Unknown (Open MPI, MPICH across nodes): Lightning uses the node rank of externally
        # created processes only for display (ranks come from global_rank()), so the core's
        # display-only block guess will do; never written into the DistEnv.
        from .core.placement import display_node_rank

        return display_node_rank(e)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise DistEnvError naming the right values when Trainer(devices=, num_nodes=)
        contradict the launch. For a per-node process about to start its workers, hand
        them the node's description (WORKER_VAR)."""
        message = mismatch_message(self._env, num_devices, num_nodes)
        if message and self._environ.get(RUN) and self._env.world_size == 1 and num_nodes == 1:
            # distenv run's one process: its own option is the other way to the devices asked
            message = (message[:-1] + f"; or start {num_devices} processes: distenv run "
                       f"--nproc-per-node {num_devices} -- <your command>.")
        if message:
            raise DistEnvError(message)
        self._devices = int(num_devices)
        if _spawns(self._env) and "LOCAL_RANK" not in self._environ:
            self._warn_if_bound(num_devices)
            self._environ[WORKER_VAR] = hand_off(self._env, num_devices, num_nodes)

    def _warn_if_bound(self, num_devices: int) -> None:
        from .knobs import bound_cores

        cores = bound_cores()
        if cores is None:
            return
        if num_devices > 1 and cores < num_devices and cores < (os.cpu_count() or cores):
            from .log import get_logger

            get_logger(__name__).warning(
                f"this node process is bound to {cores} core(s) and Lightning will start "
                f"{num_devices} workers on them (they inherit the binding). Fix: start it "
                "unbound (mpirun --bind-to none, srun --cpu-bind=none).")

    def teardown(self) -> None:
        pass


__all__ = ["DistenvEnvironment", "trainer_kwargs", "settings", "mismatch_message", "patch", "unpatch",
           "WORKER_VAR"]
