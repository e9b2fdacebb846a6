"""The one way up: what every adapter, ``DISTENV_AUTO`` and ``distenv run`` do before their
framework's own calls.

    env = bring_up("torch", timeout=180)     # distenv.torch.init_process_group, then torch's calls

1. resolve the launch (`distenv.resolve`, from `environ` or os.environ, with `overrides`);
2. refuse a per-node launch (one process per node, meant to start the workers) where the
   framework runs one process per worker -- one wording, `per_node_message`, naming the
   framework and what else starts its workers;
3. complete what the framework needs from the launcher's own service (`completed`: the fields
   of `needs`, asked through `distenv.discovery.complete` only in a distributed launch, and only
   for this process's own environment, never for a mapping a caller passed in);
4. export the torch variables (`DistEnv.export`) always, in a distributed launch only, for the
   zero-code path only where the launch's Source lets torch's variables be written
   (`Source.adapters`), or never;
5. on rank 0 of the torch family (whose rank 0 binds the master port: torch's store, or the
   torchrun `distenv run` starts), when distenv derived the port, check it is free here
   (`port_is_free`): a port another job holds would make the ranks meet that job, or fail
   with torch's bare "address already in use";
6. register the orderly end of a torch process group at exit (`distenv.bringup.teardown`).

Standard library only; what a framework does next is its adapter's.
"""

from __future__ import annotations

import os
import sys

from ..core.description import DEFAULT, DERIVED, GIVEN, PER_NODE, DistEnv, kind_of
from ..errors import DistEnvError

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping
    from typing import Any

#: A per-node launch is refused (the framework runs one process per worker) or allowed.
REFUSE, ALLOW = "refuse", "allow"
#: When to export the torch variables and register the teardown (`ZERO_CODE`: in a distributed
#: launch whose Source lets torch's variables be written, `Source.adapters`).
ALWAYS, DISTRIBUTED, ZERO_CODE, NEVER = "always", "distributed", "zero-code", "never"

#: framework -> (what it runs, who else starts its workers): the two words of the one refusal.
WORKERS = {
    "torch": ("torch.distributed runs one process per worker",
              ", or let Lightning start them (Trainer(plugins=[distenv.lightning.DistenvEnvironment()], "
              "**distenv.lightning.trainer_kwargs()))"),
    "transformers": ("the Trainer runs one process per worker", ", or `accelerate launch`"),
    "deepspeed": ("DeepSpeed runs one process per worker", ", or the `deepspeed` launcher"),
    "horovod": ("Horovod runs one process per worker", ""),
}


def per_node_message(env: DistEnv, framework: str = "torch") -> str:
    """Why a per-node launch cannot start `framework`, and the commands that would: the one
    wording of every adapter that needs one process per worker."""
    runs, others = WORKERS.get(framework, (f"{framework} runs one process per worker", ""))
    nproc = env.nproc_per_node if env.nproc_per_node is not None else "N"
    nodes = env.num_nodes if env.num_nodes is not None else "<nodes>"
    node = env.node_rank if env.node_rank is not None else "<node rank>"
    addr = env.master_addr or "<rank 0 host>"
    why = env.provenance.get("launch", "one process per node")
    return (
        f"this process is node {node} of {nodes} of a per-node launch ({why}; "
        f"nproc_per_node={nproc} from {env.provenance.get('nproc_per_node', 'unknown')}): "
        f"it is not a training worker, and {runs}. Fix: start the {nproc} workers from it, e.g. "
        f"`torchrun --nnodes {nodes} --node-rank {node} --nproc-per-node {nproc} --master-addr "
        f"{addr} --master-port {env.master_port} train.py` (or `distenv run -- python train.py`)"
        f"{others}, or launch one process per worker (e.g. mpirun -np <workers>) and unset "
        "DISTENV_NPROC_PER_NODE."
    )


def needs(env: DistEnv, nodes: bool = False) -> "tuple[str, ...]":
    """The fields a framework needs of this launch: rank 0's host and the size; a per-node
    launch's node index and count instead of the size; with `nodes` (Lightning, Horovod's
    cross ranks) the node index and count too."""
    if env.launch == PER_NODE:
        return ("master_addr", "node_rank", "num_nodes")
    return ("master_addr", "world_size") + (("node_rank", "num_nodes") if nodes else ())


def completed(env: DistEnv, *, nodes: bool = False, need: "tuple[str, ...] | None" = None,
              timeout: "float | None" = None) -> DistEnv:
    """`env` with the fields a framework needs (`need`, default `needs(env, nodes)`) filled
    from the launcher's own service, in a distributed launch (`distenv.discovery.complete`:
    nothing is asked when they are known; collective under PMI-1: every process calls it)."""
    need = needs(env, nodes) if need is None else need
    if env.is_distributed and env.launch != PER_NODE and \
            kind_of(env.provenance.get("master_addr")) == GIVEN:
        # A master address set by hand must be rank 0's host: checked against where the
        # launch places rank 0 -- its own placement, else the service's (asked for it)
        placed = env.rank_hosts
        if placed is not None:
            from ..discovery.apply import not_rank_0s

            not_rank_0s(env, placed[0], set(placed), f"the launch's placement: "
                                                     f"{env.provenance.get('rank_hosts')}")
        elif "rank_hosts" not in need:
            need = (*need, "rank_hosts")
    if env.is_distributed and kind_of(env.provenance.get("master_port")) == DEFAULT \
            and "rank_hosts" not in need:
        # No job id to derive a port from (MPICH): every such job on a host would take
        # torch's 29500 and meet the others' stores. The launcher's service knows the job
        # (its key-value space, per mpiexec) and rank 0 publishes a port it found free:
        # discovery's answer gives the job its own (distenv.discovery.apply).
        from ..sources import source_of

        if source_of(env.launcher).services:
            need = (*need, "rank_hosts")
    if not env.is_distributed or all(getattr(env, f) is not None for f in need):
        return env  # nothing to ask (and distenv.discovery not even imported)
    from ..discovery import complete

    return complete(env, need=need, timeout=timeout)


def _when(policy: str, env: DistEnv) -> bool:
    if policy == ALWAYS:
        return True
    if policy == NEVER or not env.is_distributed:
        return False
    if policy == ZERO_CODE:
        from ..sources import adapter_acts

        return adapter_acts(env.launcher, "torch")
    return True


def bring_up(framework: str, *, environ: "Mapping[str, str] | None" = None,
             overrides: "Mapping[str, Any] | None" = None, per_node: str = REFUSE,
             nodes: bool = False, need: "tuple[str, ...] | None" = None,
             complete: "bool | None" = None, timeout: "float | None" = None,
             export: str = ALWAYS, target: "MutableMapping[str, str] | None" = None,
             overwrite: bool = False, teardown: str = ALWAYS, check_port: bool = True) -> DistEnv:
    """Resolve, refuse, complete, export and register the teardown for `framework` (the module
    doc); returns the launch's description.

    `environ`: the mapping to resolve (default os.environ); `overrides` go to `resolve`.
    `per_node`: REFUSE or ALLOW. `nodes`, `need`, `timeout`: what `completed` asks for.
    `complete`: ask the launcher's service (default: only when `environ` is None -- a mapping
    passed in is not this process's own launch). `export`, `teardown`: ALWAYS, DISTRIBUTED,
    ZERO_CODE or NEVER; the variables go to `target` (default `environ` when it is writable,
    else os.environ), never overwriting a different value unless `overwrite`. `check_port`:
    False where the caller may still change the port (`distenv run` picks a free one for a
    one-node job without a job id) and checks it itself (`port_is_free`).
    """
    from ..knobs import unknown
    from ..core.resolver import resolve

    env = resolve(environ, **dict(overrides or {}))
    if environ is None and unknown():  # a misspelled DISTENV_* name: one warning, from rank 0
        from ..log import warn_unknown_knobs

        warn_unknown_knobs(rank=env.process_index)
    if per_node == REFUSE and env.launch == PER_NODE:
        raise DistEnvError(per_node_message(env, framework))
    if environ is None if complete is None else complete:
        env = completed(env, nodes=nodes, need=need, timeout=timeout)
    if (environ is None if complete is None else complete) and framework not in OWN_PORTS \
            and check_port:
        port_is_free(env)
    if _when(export, env):
        if target is None:
            target = environ if _writable(environ) else os.environ  # type: ignore[assignment]
        env.export(target, overwrite=overwrite)
    if _when(teardown, env):
        from . import teardown as _teardown

        # torch's gloo threads can abort or hang a finished job at exit (distenv.bringup.teardown)
        _teardown.register()
    return env


#: Frameworks whose rank 0 does not bind the master port (each meets on ports of its own).
OWN_PORTS = ("jax", "tensorflow", "keras", "horovod")
_checked: "set[int]" = set()


def port_is_free(env: DistEnv) -> None:
    """On the process that binds the master port (rank 0; node 0 of a per-node launch, whose
    torchrun binds it), once: a port distenv derived (from the job id, or torch's default) that
    something here already holds is a `DistEnvError` naming it and a free one. A port the user
    or the launcher gave is theirs (torchrun's agent holds its own), and once torch's process
    group is up the port is rightly taken."""
    port = env.master_port
    first = env.is_main
    if not env.is_distributed or not first or port is None or port in _checked \
            or kind_of(env.provenance.get("master_port")) not in (DERIVED, DEFAULT):
        return
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "is_available", lambda: False)() and dist.is_initialized():
        return
    _checked.add(port)
    from ..core.ports import bindable, free

    if bindable(port):
        return
    other = free(port + 1)
    example = f"e.g. MASTER_PORT={other}" if other is not None else "MASTER_PORT=<a free port>"
    raise DistEnvError(
        f"the master port {port} ({env.provenance.get('master_port')}) is already in use on rank "
        "0's host: another job or program listens there, and this job's ranks would meet it or "
        f"fail. Fix: set MASTER_PORT to a free port ({example}) for every rank.")


def _writable(environ: "Mapping[str, str] | None") -> bool:
    return environ is not None and hasattr(environ, "__setitem__")


__all__ = ["bring_up", "completed", "needs", "per_node_message", "port_is_free", "REFUSE", "ALLOW", "ALWAYS",
           "DISTRIBUTED", "ZERO_CODE", "NEVER", "WORKERS"]
