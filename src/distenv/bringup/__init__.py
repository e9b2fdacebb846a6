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
   (`Frameworks.adapters`), or never;
5. on rank 0 of the torch family (whose rank 0 binds the master port: torch's store, or the
   torchrun `distenv run` starts), when distenv derived the port, check it is free here
   (`port_is_free`): a port another job holds would make the ranks meet that job, or fail
   with torch's bare "address already in use"; and that the master address leads to this
   host (`distenv.bringup.master`: an address none of its own that refuses or answers
   another program, a warning naming both; never an error: a forwarder whose backend is not
   ready does the same);
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
#: launch whose Source lets torch's variables be written, `Frameworks.adapters`).
ALWAYS, DISTRIBUTED, ZERO_CODE, NEVER = "always", "distributed", "zero-code", "never"


class Way:
    """How one framework goes up: its row of differences, the only place they are written.

    `runs`, `others`: the two words of the per-node refusal (what it runs, who else starts its
    workers); `per_node`: REFUSE (one process per worker) or ALLOW; `nodes`: it needs the node
    index and count too (`needs`); `export`, `teardown`: when (ALWAYS, DISTRIBUTED, ZERO_CODE,
    NEVER); `check_port`: whether the bring-up checks that a derived master port is free on
    rank 0 (`port_is_free`): not where rank 0 binds none (JAX, TensorFlow, Horovod meet on
    ports of their own), nor where the caller may still change it and checks it itself
    (`distenv run` picks a free one for a one-node job without a job id). (A plain class: `DISTENV_AUTO=1` imports this
    module at interpreter start, and dataclasses would cost it milliseconds.)"""

    __slots__ = ("runs", "others", "per_node", "nodes", "export", "teardown", "check_port")

    def __init__(self, runs: str = "", others: str = "", per_node: str = ALLOW, *,
                 nodes: bool = False, export: str = ALWAYS, teardown: str = ALWAYS,
                 check_port: bool = True) -> None:
        self.runs, self.others, self.per_node, self.nodes = runs, others, per_node, nodes
        self.export, self.teardown, self.check_port = export, teardown, check_port


_ONE_PER_WORKER = "runs one process per worker"
#: Every framework and entry point that goes up, by the name it passes to `bring_up`.
WAYS = {
    "torch": Way(f"torch.distributed {_ONE_PER_WORKER}",
                 ", or let Lightning start them (Trainer(plugins=[distenv.lightning.DistenvEnvironment()], "
                 "**distenv.lightning.trainer_kwargs()))", REFUSE),
    "transformers": Way(f"the Trainer {_ONE_PER_WORKER}", ", or `accelerate launch`", REFUSE,
                        export=DISTRIBUTED, teardown=DISTRIBUTED),
    # teardown ALWAYS: deepspeed.init_distributed starts a gloo group for one process too, and
    # gloo's late thread aborted that one at exit after a correct run (CI, 2026-12-08)
    "deepspeed": Way(f"DeepSpeed {_ONE_PER_WORKER}", ", or the `deepspeed` launcher", REFUSE),
    "horovod": Way(f"Horovod {_ONE_PER_WORKER}", "", REFUSE, nodes=True, export=NEVER, teardown=NEVER,
                   check_port=False),
    # Lightning starts a per-node launch's workers itself; its plugin asks for the teardown
    # when it is the one that starts the process group (`bring_up(teardown=ALWAYS)`).
    "lightning": Way(nodes=True, export=NEVER, teardown=NEVER),
    # One JAX process (TensorFlow worker) may own a node's devices: a per-node launch is theirs.
    "jax": Way(export=NEVER, teardown=NEVER, check_port=False),
    "tensorflow": Way(export=NEVER, teardown=NEVER, check_port=False),
    "auto": Way(export=ZERO_CODE, teardown=DISTRIBUTED),
    "run": Way(nodes=True, export=NEVER, teardown=NEVER, check_port=False),
}


def way(framework: str) -> Way:
    """`framework`'s row (a name without one: one process per worker, everything done)."""
    return WAYS.get(framework) or Way(f"{framework} {_ONE_PER_WORKER}", "", REFUSE)


def refuse(env: DistEnv, framework: str) -> None:
    """The one per-node refusal: a `DistEnvError` when `framework` runs one process per worker
    and `env` is a per-node launch (pure: `plan()`s that take a description call it too)."""
    if env.launch == PER_NODE and way(framework).per_node == REFUSE:
        raise DistEnvError(per_node_message(env, framework))


def per_node_message(env: DistEnv, framework: str = "torch") -> str:
    """Why a per-node launch cannot start `framework`, and the commands that would: the one
    wording of every adapter that needs one process per worker."""
    runs, others = way(framework).runs or f"{framework} {_ONE_PER_WORKER}", way(framework).others
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
    if env.is_distributed and kind_of(env.provenance.get("master_addr")) == GIVEN:
        # A master address set by hand must be rank 0's host: checked against where the
        # launch places rank 0 -- its own placement (a per-node launch's too: worker 0 runs on
        # node 0, whose torchrun binds the master port), else the service's (asked for it)
        placed = env.rank_hosts
        if placed is not None:
            from ..core.placement import not_rank_0s

            not_rank_0s(env, placed[0], set(placed), f"the launch's placement: "
                                                     f"{env.provenance.get('rank_hosts')}")
        elif env.launch != PER_NODE and "rank_hosts" not in need:
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
             overrides: "Mapping[str, Any] | None" = None, env: "DistEnv | None" = None,
             need: "tuple[str, ...] | None" = None, complete: "bool | None" = None,
             timeout: "float | None" = None, target: "MutableMapping[str, str] | None" = None,
             overwrite: bool = False, export: "str | None" = None,
             teardown: "str | None" = None) -> DistEnv:
    """Resolve, refuse, complete, export and register the teardown for `framework` (the module
    doc), as its row of `WAYS` says; returns the launch's description.

    `environ`: the mapping to resolve (default os.environ); `overrides` go to `resolve`; `env`:
    a description already resolved from it (a framework's `plan()` given one), taken as is.
    `need`, `timeout`: what `completed` asks for (default `needs`). `complete`: ask the
    launcher's service (default: only when `environ` is None -- a mapping passed in is not
    this process's own launch). The variables go to `target` (default `environ` when it is
    writable, else os.environ), never overwriting a different value unless `overwrite`.
    `export`, `teardown`: this call's policy instead of the row's (Lightning's plugin, which
    starts the process group, asks for the teardown).
    """
    row = way(framework)
    if env is None:
        from ..core.resolver import resolve

        env = resolve(environ, **dict(overrides or {}))
    if environ is None:
        from ..knobs import unknown

        if unknown():  # a misspelled DISTENV_* name: one warning, from rank 0
            from ..log import warn_unknown_knobs

            warn_unknown_knobs(rank=env.process_index)
    refuse(env, framework)
    if environ is None if complete is None else complete:
        env = completed(env, nodes=row.nodes, need=need, timeout=timeout)
        if row.check_port:  # rank 0 starts torch's store: its port free, its address its own
            port_is_free(env)
            from .master import is_rank_0s

            is_rank_0s(env)
    if _when(row.export if export is None else export, env):
        if target is None:
            target = environ if _writable(environ) else os.environ  # type: ignore[assignment]
        env.export(target, overwrite=overwrite)
    if _when(row.teardown if teardown is None else teardown, env):
        from . import teardown as _teardown

        # torch's gloo threads can abort or hang a finished job at exit (distenv.bringup.teardown)
        _teardown.register()
    return env


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


__all__ = ["bring_up", "completed", "needs", "per_node_message", "port_is_free", "refuse", "way", "Way",
           "WAYS", "REFUSE", "ALLOW", "ALWAYS", "DISTRIBUTED", "ZERO_CODE", "NEVER"]
