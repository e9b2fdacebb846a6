"""Optional discovery: ask the other ranks for what the launcher did not reveal.

Resolution never communicates. Some launchers leave fields unknown across nodes (MPICH and
Open MPI give no node index; MPICH and Open MPI 5 give no head-node address). Two ways to
fill them, only when called, after every rank started:

* `complete(env, need=...)` -- what the adapters call before they communicate: returns `env`
  unchanged when the fields in `need` are known; otherwise, when the launcher offers a
  service that knows the placement, the answer fills master address, node rank, node count,
  local counts, host list and the host of every rank:
  - Hydra's PMI-1 (MPICH, Intel MPI; `distenv.pmi`): every rank publishes its host name, one
    barrier, every rank reads all (provenance "PMI-1 key-value exchange");
  - PMIx (Open MPI 4 and 5, PRRTE, ``srun --mpi=pmix``; `distenv.pmix`): every rank reads
    every rank's host from its own launcher daemon, no rank waits for another (provenance
    "PMIx placement");
  otherwise `env` unchanged (the caller's error names MASTER_ADDR).
* `discover(env, method=...)` -- the explicit call: "mpi4py" (an MPI allgather of host
  names; the default, as before), "pmi" (the key-value exchange), "pmix" (the PMIx server)
  or "auto" (mpi4py when MPI is already initialized here, else PMI-1 or PMIx when offered,
  else mpi4py).

    env = distenv.discover()            # node_rank, num_nodes, hosts, master_addr filled
    env.export()
"""

from __future__ import annotations

from .description import DEFAULT, DERIVED, FIELDS, PER_NODE, DistEnv, about, kind_of
from .errors import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .pmi import Exchange
    from .pmix import Placement


def _with(env: DistEnv, changes: "Mapping[str, object]", why: str) -> DistEnv:
    values = {f: getattr(env, f) for f in FIELDS}
    provenance = dict(env.provenance)
    for name, value in changes.items():
        if value is not None and values.get(name) != value:
            values[name] = value
            provenance[name] = why
    return DistEnv(values, provenance, env.notes)


#: The fix of a contradiction between what the launcher says and what the ranks found.
STALE = ("Fix: run every rank under the same launcher and job, and unset variables left over "
         "from another job (distenv show --explain names where each value came from).")


def from_hostnames(env: DistEnv, names: "list[str]", why: str) -> DistEnv:
    """Complete `env` from every rank's host name (index = global rank). Pure, for tests."""
    if env.rank is None or env.world_size is None:
        raise DistEnvError("discovery needs a per-process launch with a known rank and world size. "
                           "Fix: run it in every rank of a launch that gives them (mpirun -np N, "
                           "srun -n N), not in a per-node or single process.")
    if len(names) != env.world_size:
        raise DistEnvError(
            f"discovery saw {len(names)} ranks but the launcher says world_size={env.world_size} "
            f"({env.provenance.get('world_size')}). Fix: run discovery in every rank of the job, "
            "and in no other process."
        )
    nodes: "list[str]" = []
    for name in names:  # nodes ordered by their lowest rank
        if name not in nodes:
            nodes.append(name)
    mine = names[env.rank]
    on_node = [r for r, name in enumerate(names) if name == mine]
    for field, known, found in (
        ("node_rank", env.node_rank, nodes.index(mine)),
        ("num_nodes", env.num_nodes, len(nodes)),
        ("local_world_size", env.local_world_size, len(on_node)),
    ):
        if known is not None and known != found:
            raise DistEnvError(
                f"{field}={known} ({env.provenance.get(field)}) contradicts discovery ({why}): {found}. "
                + STALE
            )
    counts = {names.count(n) for n in nodes}
    changes = {
        "node_rank": nodes.index(mine),
        "num_nodes": len(nodes),
        "local_world_size": len(on_node),
        "hosts": tuple(nodes),
        "rank_hosts": tuple(names),  # every rank's host: the placement (distenv.placement)
        "nproc_per_node": len(on_node) if len(counts) == 1 else None,
    }
    if env.local_rank is None:
        changes["local_rank"] = on_node.index(env.rank)
    if env.master_addr is None:  # one node: loopback, as the resolver's own one-node rule
        changes["master_addr"] = names[0] if len(nodes) > 1 else "127.0.0.1"
    if "rank_hosts" in FIELDS:  # the placement of every rank (distenv.placement)
        changes["rank_hosts"] = tuple(names)
    return _with(env, changes, why)


#: The provenance of every field the key-value exchange fills.
PMI_WHY = "PMI-1 key-value exchange"


def _mpi_ready() -> Any:
    """mpi4py's MPI module when this process already initialized MPI (else None): an
    allgather over it is then free of side effects, unlike importing mpi4py (MPI_Init)."""
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            return mpi
    except Exception:  # noqa: BLE001 - a broken or fake binding: not usable
        pass
    return None


def _from_exchange(env: DistEnv, ex: Exchange) -> DistEnv:
    """`env` completed from a PMI exchange `ex` (distenv.pmi.Exchange)."""
    why = f"{PMI_WHY} (Hydra, {'PMI_FD' if ex.mode == 'fd' else '-pmi-port'})"
    port_kind = kind_of(env.provenance.get("master_port"))
    if (ex.port is not None and port_kind in (DEFAULT, DERIVED)
            and env.master_addr in (None, ex.hosts[0])):
        # Rank 0 found this port free on its own host, where the store will listen, and
        # published it with the hosts (distenv.pmi.free_port): a job already listening on
        # the derived port is avoided, and every rank has the same port.
        env = _with(env, {"master_port": ex.port},
                    f"free on rank 0's host ({ex.hosts[0]}) when it looked ({PMI_WHY}); "
                    "see distenv.pmi.free_port")
        env = _known(env, "master_port")
    elif ex.kvsname and port_kind == DEFAULT:
        # MPICH reveals no job id, but its key-value space name is one: the same on every
        # rank of one mpiexec, different across mpiexecs (kvs_<mpiexec pid>_0_<random>_<host>,
        # measured): two MPICH jobs on one machine no longer share 29500.
        from .ports import port_for

        env = _with(env, {"master_port": port_for(f"hydra:{ex.kvsname}")},
                    f"derived from the job's key-value space name ({ex.kvsname}; {PMI_WHY}); "
                    "see distenv.ports")
        env = _known(env, "master_port")
    if env.launch == PER_NODE:
        # One process per node (DISTENV_NPROC_PER_NODE under mpiexec): Hydra's ranks are nodes.
        return _per_node(env, ex.rank, ex.size, list(ex.hosts), why, "the key-value exchange found",
                         "mpiexec -ppn 1")
    if env.rank is not None and env.rank != ex.rank:
        raise DistEnvError(f"rank={env.rank} ({env.provenance.get('rank')}) but Hydra's "
                           f"key-value service says rank {ex.rank}: the launch is not this job. "
                           + STALE)
    if env.world_size is None:  # -pmi-port: the handshake gives the size PMI_SIZE would have
        env = _with(env, {"world_size": ex.size}, why)
        env = _known(env, "world_size")
    return from_hostnames(env, list(ex.hosts), why)


def _known(env: DistEnv, field: str) -> DistEnv:
    """`env` without the notes about `field`, which a service has just filled."""
    return DistEnv(env.to_dict(), env.provenance, [n for n in env.notes if about(n) != field])


def _per_node(env: DistEnv, rank: int, size: int, hosts: "list[str]", why: str, service: str,
              one_per_node: str) -> DistEnv:
    """A per-node launch completed from a service's answer: its ranks are the nodes, one
    process on each host (else an error), rank = node rank."""
    if len(set(hosts)) != size:
        raise DistEnvError(
            f"a per-node launch, but {service} {size} processes on {len(set(hosts))} hosts "
            f"({', '.join(sorted(set(hosts))[:8])}). Fix: start one process per node "
            f"({one_per_node}), or unset DISTENV_NPROC_PER_NODE.")
    for field, found in (("node_rank", rank), ("num_nodes", size)):
        known = getattr(env, field)
        if known is not None and known != found:
            raise DistEnvError(f"{field}={known} ({env.provenance.get(field)}) contradicts "
                               f"the {why}: {found}. " + STALE)
    return _with(env, {"node_rank": rank, "num_nodes": size, "hosts": tuple(hosts),
                       "master_addr": env.master_addr or hosts[0]}, why)


#: The provenance of every field the PMIx server's placement fills.
PMIX_WHY = "PMIx placement"


def _from_pmix(env: DistEnv, got: "Placement", server: str = "") -> DistEnv:
    """`env` completed from the PMIx server's placement `got` (distenv.pmix.Placement): the
    host of every rank (pmix.hname), from which `from_hostnames` proves the rest."""
    why = f"{PMIX_WHY} (pmix.hname of every rank{', ' + server if server else ''})"
    if env.launch == PER_NODE:
        # One process per node (DISTENV_NPROC_PER_NODE under mpirun/srun): the ranks are nodes.
        return _per_node(env, got.rank, got.size, list(got.hosts), why, "the PMIx server places",
                         "mpirun --map-by ppr:1:node, srun --ntasks-per-node=1")
    if env.rank is not None and env.rank != got.rank:
        raise DistEnvError(f"rank={env.rank} ({env.provenance.get('rank')}) but the PMIx server "
                           f"says rank {got.rank}: the launch is not this job. " + STALE)
    if env.world_size is None:
        env = _with(env, {"world_size": got.size}, why)
    return from_hostnames(env, list(got.hosts), why)


def _pmix(env: DistEnv, timeout: "float | None", strict: bool) -> "DistEnv | None":
    """`env` completed by the PMIx server when this process may use one (else None). Not
    `strict` (complete()): no loadable library leaves `env` as it was, with a warning saying
    what was tried; anything else the server does wrong raises."""
    from . import pmix

    before_exec = pmix.inherited()  # `distenv run` queried, then exec'ed this program
    if before_exec is not None:
        return _from_pmix(env, before_exec)
    found, why_not = pmix.offer()
    if found is None:
        if strict:
            raise pmix.PMIxError(f"the launcher's PMIx service cannot be used here: {why_not}. "
                                 "Fix: set MASTER_ADDR (and NODE_RANK).")
        if env.launcher in ("openmpi", "slurm"):
            from .log import get_logger

            get_logger(__name__).debug(f"no PMIx query: {why_not}")
        return None
    try:
        got = pmix.query(timeout=timeout, found=found)
    except pmix.PMIxUnavailable as exc:
        if strict:
            raise
        from .log import get_logger

        get_logger(__name__).warning(f"PMIx cannot fill the unknown fields: {exc}")
        return DistEnv(env.to_dict(), env.provenance, [*env.notes, f"PMIx: {exc}"])
    return _from_pmix(env, got, found.server)


def _pmix_strict(env: DistEnv, timeout: "float | None") -> DistEnv:
    completed = _pmix(env, timeout, strict=True)
    if completed is None:  # strict: _pmix answers or raises
        raise DistEnvError("the PMIx service gave no answer. Fix: set MASTER_ADDR (and NODE_RANK).")
    return completed


def complete(env: "DistEnv | None" = None, *, need: "Iterable[str]" = ("master_addr",),
             timeout: "float | None" = None) -> DistEnv:
    """`env` with the fields in `need` filled by asking the other ranks, when it must and can.

    * Every field in `need` known: `env` unchanged, no communication.
    * MPI already initialized in this process (mpi4py): an allgather of host names.
    * The launcher offers a key-value service (Hydra's PMI-1: MPICH, Intel MPI; see
      `distenv.pmi` for the guards): every rank publishes its host name, one barrier, every
      rank reads all (collective: every rank must call it). Provenance "PMI-1 key-value
      exchange". `timeout` seconds (default DISTENV_TIMEOUT, else 180): a rank that never
      comes makes the others raise `DistEnvError` naming it.
    * The launcher is a PMIx server (Open MPI 4/5, PRRTE, ``srun --mpi=pmix``; see
      `distenv.pmix` for the guards and the library): every rank's host from this rank's
      daemon, no collective. Provenance "PMIx placement". No loadable library: `env`
      unchanged, a warning naming what was tried.
    * Otherwise: `env` unchanged (the caller's own error then says what to set).
    """
    if env is None:
        from .resolver import resolve

        env = resolve()
    if all(getattr(env, field) is not None for field in need):
        return env
    mpi = _mpi_ready()
    if mpi is not None:
        return discover(env, "mpi4py")
    from . import pmi

    before_exec = pmi.inherited()  # `distenv run` exchanged, then exec'ed this program
    if before_exec is not None:
        return _from_exchange(env, before_exec)
    found, why_not = pmi.offer()
    if found is None:
        if env.launcher in ("mpich", "intelmpi"):
            from .log import get_logger

            get_logger(__name__).debug(f"no key-value exchange: {why_not}")
        completed = _pmix(env, timeout, strict=False)
        return env if completed is None else completed
    return _from_exchange(env, pmi.exchange(timeout=timeout, found=found))


def discover(env: "DistEnv | None" = None, method: str = "mpi4py", *,
             timeout: "float | None" = None) -> DistEnv:
    """Fill node rank, node count, host list and master address by asking the other ranks.

    Communicates: call it explicitly, on every rank. `method`: "mpi4py" (an MPI allgather
    of host names; imports mpi4py, which initializes MPI), "pmi" (the launcher's key-value
    service, standard library only: Hydra's PMI-1 under MPICH and Intel MPI), "pmix" (the
    launcher's PMIx server through its own libpmix: Open MPI 4 and 5, PRRTE, srun
    --mpi=pmix), or "auto" (mpi4py when MPI is already initialized here, else PMI-1 or PMIx
    when the launcher offers one, else mpi4py).
    """
    if env is None:
        from .resolver import resolve

        env = resolve()
    if method not in ("mpi4py", "pmi", "pmix", "auto"):
        raise DistEnvError(f"unknown discovery method {method!r}. Fix: pass method='mpi4py', "
                           "'pmi', 'pmix' or 'auto'.")
    if method == "auto":
        if _mpi_ready() is not None:
            method = "mpi4py"
        else:
            from . import pmi

            found, _ = pmi.offer()
            if found is not None:
                return _from_exchange(env, pmi.exchange(timeout=timeout, found=found))
            from . import pmix

            if pmix.inherited() is not None or pmix.offer()[0] is not None:
                try:
                    return _pmix_strict(env, timeout)
                except pmix.PMIxUnavailable:
                    import importlib.util

                    if importlib.util.find_spec("mpi4py") is None:
                        raise  # its message says which libraries were tried
            method = "mpi4py"
    if method == "pmix":
        return _pmix_strict(env, timeout)
    if method == "pmi":
        from . import pmi

        return _from_exchange(env, pmi.exchange(timeout=timeout))
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistEnvError(
            "discovery with mpi4py needs mpi4py built for your MPI. Fix: pip install mpi4py; "
            "without it, set MASTER_ADDR (and NODE_RANK) in the job script instead."
        ) from None
    comm = MPI.COMM_WORLD
    if env.world_size is None:  # MPICH -pmi-port gives no PMI_SIZE; MPI knows the size
        env = _with(env, {"world_size": comm.Get_size()}, "MPI_Comm_size (mpi4py)")
    if comm.Get_rank() != env.rank or comm.Get_size() != env.world_size:
        raise DistEnvError(
            f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but distenv resolved "
            f"rank={env.rank} of world_size={env.world_size}: the launch is not this MPI job. "
            + STALE
        )
    import socket

    names = comm.allgather(socket.gethostname())
    return from_hostnames(env, names, "mpi4py allgather of host names")
