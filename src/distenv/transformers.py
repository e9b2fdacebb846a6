"""Hugging Face Transformers / Accelerate adapter: the Trainer really distributed under any launcher.

    import distenv.transformers
    distenv.transformers.patch()          # first, before TrainingArguments(...) or Accelerator()
    args = TrainingArguments(...)         # args.world_size, process_index, parallel_mode: right
    trainer = Trainer(..., callbacks=[distenv.transformers.DistEnvCallback()])   # optional

What goes wrong without it (measured with Transformers 4.57 and 5.x, Accelerate 1.x):
- Accelerate's `PartialState` (a per-process singleton, built when `TrainingArguments` first
  touches its device) goes distributed on GPUs only when LOCAL_RANK is set: under mpirun or
  srun every rank trains alone. On CPUs it goes distributed only with ``use_cpu=True`` (even
  under torchrun); then under mpirun it maps the Open MPI ranks but has no MASTER_ADDR and
  fails, and two jobs on one machine both take port 29500.
- Azure's documented ``--local_rank=$LOCAL_RANK`` reaches the script as ``--local_rank=``
  when the variable is unset, which HfArgumentParser rejects.

`patch()` resolves the launch (`distenv.resolve()`), exports MASTER_ADDR, MASTER_PORT (derived
from the job id), RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, and
hooks `accelerate.state.PartialState` so that, on a machine where Accelerate would find no
accelerator to be distributed on, the state is built for CPUs (gloo), and so that a state
that does not describe the resolved launch raises `DistEnvError` instead of training
undistributed. Idempotent; safe before or after importing transformers (it imports
`accelerate.state`, not transformers). Frameworks are imported inside functions: importing
this module costs nothing.
"""

from __future__ import annotations

import os
import sys

from .core.description import DistEnv
from .errors import DistEnvError, install_excepthook
from .log import get_logger

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from typing import Any

log = get_logger(__name__)  # distenv.log: a stderr handler only when the application has none

#: What `patch()` resolved (None before the first call).
_env: "DistEnv | None" = None
_ARGV_FORMS = ("--local_rank", "--local-rank")


def patch(*, argv: "list[str] | None" = None, overwrite: bool = False, **overrides: Any) -> DistEnv:
    """Make Transformers and Accelerate see the resolved launch before their state is built.

    1. The launch is brought up (`distenv.bringup.bring_up`, with `overrides`): a per-node
       launch (workers not started yet) is a `DistEnvError` (the Trainer runs one process per
       worker); in a distributed launch, what the variables leave unknown comes from the
       launcher's service, the torch variables are exported to ``os.environ``
       (`DistEnv.export`, `overwrite` as there), and the process group's orderly end at exit
       is registered.
    2. The ``--local_rank`` / ``--local-rank`` forms in `argv` (default ``sys.argv``), as
       ``--local_rank=N`` or ``--local_rank N``, are checked against the launch: an empty or
       ``-1`` value (``--local_rank=$LOCAL_RANK`` with the variable unset) is replaced by the
       resolved local rank in place; a contradicting value is a `DistEnvError`.
    3. ACCELERATE_USE_CPU=true is set when Accelerate would find no accelerator to be
       distributed on (so ``use_cpu=True`` is not needed).
    4. `accelerate.state.PartialState` is hooked (once): see the module docstring. A state
       built before this call that does not describe the launch is a `DistEnvError` now.

    Returns the resolved `DistEnv`. Calling it again re-checks and changes nothing more.
    """
    global _env
    from .bringup import bring_up

    # Accelerate never ends its process group: bring_up registers an orderly end at exit
    # (distenv.bringup.teardown) in a distributed launch, where it also exports the torch variables.
    env = bring_up("transformers", overrides=overrides, overwrite=overwrite)
    fix_local_rank_argv(env, sys.argv if argv is None else argv)
    _env = env
    state_cls = _accelerate_partial_state()
    if state_cls is not None:
        _hook(state_cls)
        if env.is_distributed and _needs_cpu(state_cls) \
                and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
            if not os.environ.get("ACCELERATE_USE_CPU", "").strip():
                os.environ["ACCELERATE_USE_CPU"] = "true"
        if state_cls._shared_state:
            check_state(state_cls(), env, when="was built before distenv.transformers.patch()")
    return env


def resolved() -> "DistEnv | None":
    """The launch `patch()` resolved, or None if it has not run."""
    return _env


# -- argv --------------------------------------------------------------------------------
def fix_local_rank_argv(env: DistEnv, argv: "list[str]") -> "list[str]":
    """Check (and complete) ``--local_rank`` / ``--local-rank`` in `argv`, in place.

    Both spellings, ``=N`` and ``N`` forms, are accepted: HfArgumentParser knows both for
    TrainingArguments.local_rank; legacy ``torch.distributed.launch`` passes ``--local-rank=N``,
    the DeepSpeed launcher ``--local_rank=N``. A value of ``-1`` or nothing (an unset
    ``$LOCAL_RANK`` expanded by a shell) becomes the resolved local rank; another value must
    equal it. Returns `argv`.
    """
    want = env.local_rank
    i = 1
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name not in _ARGV_FORMS:
            i += 1
            continue
        if eq:
            given, where = value, i
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            given, where = argv[i + 1], i + 1
        else:
            given, where = "", None
        text = given.strip()
        if text in ("", "-1"):
            if want is not None:
                if where == i:
                    argv[i] = f"{name}={want}"
                elif where is None:
                    argv.insert(i + 1, str(want))
                else:
                    argv[where] = str(want)
        else:
            try:
                number = int(text)
            except ValueError:
                raise DistEnvError(f"{name}={given!r} on the command line is not an integer. "
                                   f"Fix: drop {name}; distenv exports LOCAL_RANK.") from None
            if want is not None and number != want:
                raise DistEnvError(
                    f"{name}={given} on the command line contradicts the launch "
                    f"(local_rank={want}: {env.provenance.get('local_rank', env.launcher)}). "
                    f"Fix: drop {name}; distenv exports LOCAL_RANK."
                )
        i += 1 if where in (None, i) else 2
    return argv


# -- Accelerate's state ------------------------------------------------------------------
def _accelerate_partial_state() -> Any:
    try:
        from accelerate.state import PartialState
    except ImportError:
        return None
    return PartialState


class _Probe:
    """Stand-in `self` for PartialState._prepare_backend (it reads no state)."""


def _needs_cpu(state_cls: Any, backend: "str | None" = None) -> bool:
    """True when Accelerate, given LOCAL_RANK, would find no accelerator to be distributed
    on, and so would build an undistributed state unless told ``cpu=True``."""
    from accelerate.utils import DistributedType

    saved = os.environ.get("LOCAL_RANK")
    if saved is None:
        os.environ["LOCAL_RANK"] = "0"
    try:
        _backend, kind = state_cls._prepare_backend(_Probe(), False, False, backend)
    except Exception:  # an Accelerate whose helper moved: ask torch
        import torch

        return not bool(torch.cuda.is_available())
    finally:
        if saved is None:
            os.environ.pop("LOCAL_RANK", None)
    return bool(kind == DistributedType.NO)


def _hook(state_cls: Any) -> None:
    if getattr(state_cls.__init__, "_distenv", False):
        return
    original = state_cls.__init__

    def __init__(self: Any, cpu: bool = False, **kwargs: Any) -> None:
        env = _env
        fresh = not state_cls._shared_state
        if fresh and env is not None and env.is_distributed and not cpu \
                and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true" \
                and _needs_cpu(state_cls, kwargs.get("backend")):
            cpu = True
            log.info("distenv: no accelerator to distribute on; Accelerate state built with cpu=True")
        original(self, cpu, **kwargs)
        if fresh and env is not None:
            check_state(self, env, when="was built")

    __init__._distenv = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    state_cls.__init__ = __init__


def unpatch() -> None:
    """Remove the PartialState hook (tests). The exported variables stay."""
    global _env
    state_cls = _accelerate_partial_state()
    if state_cls is not None and getattr(state_cls.__init__, "_distenv", False):
        state_cls.__init__ = state_cls.__init__.__wrapped__
    _env = None


def check_state(state: Any, env: DistEnv, when: str = "") -> None:
    """Raise `DistEnvError` unless Accelerate's `state` describes the resolved launch."""
    if getattr(state, "backend", None) == "xla" or not env.is_distributed:
        return
    got = {"num_processes": getattr(state, "num_processes", None),
           "process_index": getattr(state, "process_index", None),
           "local_process_index": getattr(state, "local_process_index", None)}
    want = {"num_processes": env.world_size, "process_index": env.rank,
            "local_process_index": env.local_rank}
    wrong = [f"{k}={got[k]} (launch: {want[k]})" for k in got
             if want[k] is not None and got[k] != want[k]]
    if wrong:
        kind = getattr(state, "distributed_type", "?")
        raise DistEnvError(
            f"Accelerate's PartialState {when or 'is'} {'undistributed' if str(kind).endswith('NO') else kind}: "
            f"{', '.join(wrong)}; {env.launcher} started {env.world_size} processes. "
            "This run would train undistributed. Fix: call distenv.transformers.patch() before "
            "TrainingArguments(...), Accelerator() or PartialState() (first thing in the script)."
        )


# -- a Trainer callback ------------------------------------------------------------------
def describe(args: Any = None) -> str:
    """One line: the resolved launch and, given TrainingArguments, what the Trainer uses."""
    env = _env
    if env is None:
        from .core.resolver import resolve

        env = resolve()
    text = (f"distenv: {env.launcher} launch, rank {env.rank}/{env.world_size}, local rank "
            f"{env.local_rank}/{env.local_world_size}, node {env.node_rank}/{env.num_nodes}, "
            f"master {env.master_addr}:{env.master_port}")
    if args is not None:
        text += (f"; Trainer: world_size={args.world_size}, process_index={args.process_index}, "
                 f"parallel_mode={getattr(args.parallel_mode, 'value', args.parallel_mode)}, "
                 f"device={args.device}")
    return text


def _make_callback_class() -> Any:
    from transformers import TrainerCallback

    class DistEnvCallback(TrainerCallback):  # type: ignore[misc]  # Transformers is Any here
        """Logs the resolved launch once, on the main process, when training begins
        (``print`` too when `stdout`), and checks the Trainer's world size against it."""

        def __init__(self, stdout: bool = False) -> None:
            self.stdout = stdout
            self.done = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            env = _env
            if env is not None and env.is_distributed and env.world_size is not None \
                    and args.world_size != env.world_size:
                raise DistEnvError(
                    f"TrainingArguments.world_size={args.world_size} but {env.launcher} started "
                    f"{env.world_size} processes. Fix: call distenv.transformers.patch() before "
                    "TrainingArguments(...)."
                )
            if self.done or not state.is_world_process_zero:
                return
            self.done = True
            line = describe(args)
            log.info(line)  # the launch as it should be: information, not a warning
            if self.stdout:
                print(line, flush=True)

    return DistEnvCallback


_classes: "dict[str, Any]" = {}


def __getattr__(name: str) -> Any:
    if name == "DistEnvCallback":
        if name not in _classes:
            _classes[name] = _make_callback_class()
        return _classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
