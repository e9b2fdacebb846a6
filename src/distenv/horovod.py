"""Horovod that cannot silently split: `init()` under any launcher, then a hard check.

    import distenv.horovod
    hvd = distenv.horovod.init()            # horovod.torch (PyTorch only: see below)
    model = ...; opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

Under torchrun, or srun without an MPI plugin, `hvd.init()` quietly gives size 1 on every
rank: each process trains alone and all exit 0. `init()`:

1. resolves the launch (`distenv.resolve()`);
2. chooses the controller: horovodrun's own settings under horovodrun; MPI under Open MPI's
   mpirun; otherwise a *self-rendezvous*: rank 0 starts Horovod's own Gloo rendezvous server
   (the one horovodrun runs) on a port derived from the job, and every rank gets the
   HOROVOD_* variables horovodrun would have set (rank, sizes, cross ranks, rendezvous
   address, HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo). Override with
   ``controller=`` or DISTENV_HOROVOD_CONTROLLER=mpi|gloo;
3. in the self-rendezvous, meets every rank at rank 0 (the core's one pre-flight,
   `distenv.bringup.preflight.meet`, after rank 0's server is up) before Horovod's own silent wait:
   a rank that never comes is named in one line on every rank that did, a rank 0 that never
   answers is named with its address, after DISTENV_TIMEOUT seconds (default 180);
4. calls `hvd.init()` and checks `hvd.size()` and `hvd.rank()` against the launch: a
   mismatch is a `DistEnvError`, never a silent size 1;
5. pins the device and torch's threads with `distenv.torch.pin`, the step `distenv.torch`
   takes (local rank N takes device N, a task narrowed to its own GPU takes it, more local
   processes than GPUs is an error, never two on one GPU; threads: this process's share of
   the cores).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import knobs
from .bringup import preflight
from .bringup import bring_up, refuse
from .core.description import DistEnv
from .errors import DistEnvError, install_excepthook
from .core.resolver import resolved
from .sources import source_of

install_excepthook()  # an uncaught DistEnvError ends the script with its one line, exit 2

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_TIMEOUT = knobs.DEFAULT_TIMEOUT
_server: "dict[str, Any]" = {}


@dataclass(frozen=True)
class Plan:
    """What `init()` does, without Horovod: the `controller` ("horovodrun", "mpi", "gloo",
    "single"), the HOROVOD_* variables it sets (`environ`), whether this rank hosts the Gloo
    rendezvous server (`server`) and where it is (`address`, for "gloo")."""

    env: DistEnv
    controller: str
    environ: "dict[str, str]" = field(default_factory=dict)
    server: bool = False
    address: "tuple[str, int] | None" = None


def rendezvous_port(d: DistEnv, src: "Mapping[str, str] | None" = None) -> int:
    """The self-rendezvous server's port: DISTENV_HOROVOD_PORT, else derived from the job."""
    return knobs.side_port(d, "horovod", src, knobs.HOROVOD_PORT)


def plan(env: "DistEnv | Mapping[str, str] | None" = None, *,
         environ: "Mapping[str, str] | None" = None, controller: "str | None" = None) -> Plan:
    """What `init()` will do, without Horovod (`Plan`)."""
    d, src = resolved(env, environ)
    refuse(d, "horovod")  # a description given to plan() came without the bring-up
    # controller= is checked as the variable is, by the knob's parser
    wanted = (knobs.HOROVOD_CONTROLLER.parse(controller, "controller") if controller
              else knobs.HOROVOD_CONTROLLER.value(src))
    source = source_of(d.launcher)
    if source.family == "horovod":  # horovodrun set Horovod up itself
        return Plan(d, "horovodrun")
    if d.world_size == 1:
        return Plan(d, "single")
    if wanted == "mpi" or (wanted == "auto" and "horovod" in source.frameworks.mpi_controller):
        return Plan(d, "mpi", {"HOROVOD_CONTROLLER": "mpi"})

    missing = [f for f in ("rank", "world_size", "local_rank", "local_world_size")
               if getattr(d, f) is None]
    node, nodes = d.node_rank, d.num_nodes
    if nodes is None or node is None:
        missing.append("node_rank" if node is None else "num_nodes")
    if d.master_addr is None:
        missing.append("master_addr")
    if missing:
        raise DistEnvError(
            f"Horovod's Gloo self-rendezvous needs {', '.join(missing)}, which {d.launcher} does "
            "not reveal here. Fix: export MASTER_ADDR (rank 0's host) and NODE_RANK to every rank, "
            "or run under mpirun (DISTENV_HOROVOD_CONTROLLER=mpi) or horovodrun."
        )
    assert nodes is not None and node is not None  # nothing was missing
    if nodes > 1 and (d.nproc_per_node is None or d.nproc_per_node * nodes != d.world_size):
        raise DistEnvError(
            f"Horovod's Gloo self-rendezvous needs the same number of workers on every node, but "
            f"{d.launcher} runs {d.world_size} on {nodes} nodes unevenly. Fix: start as many "
            "workers on each node, or use mpirun or horovodrun."
        )
    port = rendezvous_port(d, src)
    host = d.hosts[node] if d.hosts and len(d.hosts) == nodes else f"distenv-node{node}"
    values = {
        "HOROVOD_RANK": d.rank, "HOROVOD_SIZE": d.world_size,
        "HOROVOD_LOCAL_RANK": d.local_rank, "HOROVOD_LOCAL_SIZE": d.local_world_size,
        # Horovod's cross communicator joins the ranks with the same local rank, one per node.
        "HOROVOD_CROSS_RANK": node, "HOROVOD_CROSS_SIZE": nodes,
        "HOROVOD_HOSTNAME": host,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": d.master_addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    return Plan(d, "gloo", {k: str(v) for k, v in values.items()}, d.rank == 0,
                (str(d.master_addr), port))  # master_addr: not missing (above)


def _start_server(port: int, d: DistEnv) -> Any:
    """Rank 0: Horovod's own Gloo rendezvous HTTP server, in a daemon thread."""
    import threading

    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    try:
        httpd = RendezvousHTTPServer(("0.0.0.0", port), RendezvousHandler, False)
    except OSError as exc:
        raise DistEnvError(
            f"rank 0 cannot start Horovod's rendezvous server on port {port} ({exc.strerror}). "
            "Fix: set DISTENV_HOROVOD_PORT to a free port on every rank."
        ) from None

    class Slot:  # what RendezvousHTTPServer.init reads from horovod's SlotInfo
        def __init__(self, local_rank: int) -> None:
            self.size, self.local_size, self.cross_size = d.world_size, d.local_world_size, d.num_nodes
            self.local_rank = local_rank
            self.hostname = ""

    httpd.init([Slot(i) for i in range(d.local_world_size or 1)])
    httpd.scope_size.pop("local_", None)  # host names differ per node; local scopes stay ad hoc
    thread = threading.Thread(target=httpd.serve_forever, name="distenv-horovod-rendezvous",
                              daemon=True)
    thread.start()
    _server.update(httpd=httpd, thread=thread)
    return httpd


def meeting(d: DistEnv, host: str, timeout: float, port: "int | None" = None) -> preflight.Meeting:
    """The self-rendezvous's pre-flight: every rank meets rank 0 at `host` (the master
    address, where rank 0's Gloo rendezvous server runs) on the pre-flight's port
    (`distenv.bringup.preflight.port`, unless `port`)."""
    assert d.world_size is not None and d.rank is not None  # plan() checked
    return preflight.Meeting(
        size=d.world_size, index=d.rank, host=host,
        port=preflight.port(d, host) if port is None else port,
        job=preflight.identity(d, "horovod"), timeout=timeout, who="distenv.horovod",
        noun="rank", entry="hvd.init()", address_from=d.provenance.get("master_addr", ""),
        address_fix="set MASTER_ADDR to rank 0's host on every rank", local=d.local_world_size or 1)


#: Why Horovod's TensorFlow and Keras modules are refused (issue 24): never built or run here.
_TF_UNSUPPORTED = (
    "distenv.horovod supports Horovod with PyTorch only: its TensorFlow/Keras path was never "
    "built or tested (Horovod 0.28.1 does not build against TensorFlow >= 2.16 unpatched; "
    "docs/frameworks/horovod.md). Fix: for TensorFlow use distenv.tensorflow.strategy() "
    "(MultiWorkerMirroredStrategy), or call horovod.tensorflow's hvd.init() yourself.")


def _framework(framework: "str | None") -> str:
    """The framework asked for, checked before anything is set up."""
    framework = (framework or "torch").lower()
    if framework in ("tensorflow", "tf", "keras"):
        raise DistEnvError(_TF_UNSUPPORTED)
    if framework not in ("torch", "pytorch"):
        raise ValueError(f"framework={framework!r}: distenv.horovod supports 'torch'")
    return "torch"


def init(framework: "str | None" = None, *, env: "DistEnv | Mapping[str, str] | None" = None,
         controller: "str | None" = None, timeout: "float | None" = None, threads: bool = True
         ) -> Any:
    """Initialise Horovod for this launch and return the Horovod module (``hvd``).

    `framework`: "torch" (the default and the only one: "tensorflow" and "keras" raise
    `DistEnvError`, that path being untested). See the module docstring for what happens;
    raises `DistEnvError` if Horovod's size or rank disagrees with the launch.
    """
    framework = _framework(framework)
    wait = knobs.timeout(os.environ, timeout)
    if env is None:
        # MPICH/Intel MPI across nodes: master, node rank and count from the launcher's
        # key-value service (Horovod's MPI_Init still works after it: measured with mpi4py).
        env = bring_up("horovod", timeout=wait)
    p = plan(env, controller=controller)
    d = p.env
    for name, value in p.environ.items():
        os.environ[name] = value
    if p.controller == "gloo":
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(max(wait, 30))))
    import horovod.torch as hvd

    if p.address is not None:
        host, port = p.address
        if p.server:
            _start_server(port, d)
        preflight.meet(meeting(d, host, wait))  # after rank 0's server is up: then go
    hvd.init()
    check(hvd, d, p.controller)
    from .torch import pin  # Horovod's PyTorch path: torch's pinning step

    pin(d, threads=threads, instead="hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on CPUs")
    return hvd


def check(hvd: Any, d: DistEnv, controller: str = "?") -> None:
    """Raise `DistEnvError` unless Horovod's size and rank are the launch's."""
    size, rank = hvd.size(), hvd.rank()
    if d.world_size is not None and size != d.world_size or d.rank is not None and rank != d.rank:
        built = []
        for name in ("mpi", "gloo"):
            probe = getattr(hvd, f"{name}_built", None)
            if probe is not None:
                built.append(f"{name.upper()} {'built' if probe() else 'NOT built'}")
        raise DistEnvError(
            f"Horovod says rank {rank} of size {size} but {d.launcher} started rank {d.rank} of "
            f"world_size {d.world_size} ({d.provenance.get('world_size')}); controller {controller}, "
            f"{', '.join(built) or 'build unknown'}. Horovod did not join the job (every rank would "
            "train alone). Fix: DISTENV_HOROVOD_CONTROLLER=gloo (self-rendezvous), or a Horovod "
            "built with HOROVOD_WITH_MPI=1 against this launcher's MPI (horovodrun --check-build "
            "can claim what was not built)."
        )
