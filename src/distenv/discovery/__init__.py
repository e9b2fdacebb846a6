"""Discovery: ask the launcher's own service for what its variables did not reveal.

Resolution never communicates. Some launchers leave fields unknown across nodes (MPICH and
Open MPI give no node index; MPICH and Open MPI 5 give no head-node address; SLURM's variables
cannot place an arbitrary or heterogeneous step). But every rank they start can reach a
service that knows where every rank runs -- the one its MPI library uses. Only when called,
where communication is about to happen anyway:

* `complete(env, need=...)` -- what the adapters, ``DISTENV_AUTO`` and ``distenv run`` call:
  `env` unchanged when the fields in `need` are known; otherwise the first service the
  launcher declares (`Source.services`) that is offered here answers (`services`), and its
  answer fills master address, node rank, node count, local counts, host list and the host of
  every rank (`apply`). When none is offered, `env` comes back with a note saying why and
  what to do (an error built on it then says the same, not a generic "set MASTER_ADDR").
* `discover(env, method="auto")` -- the explicit call: "auto" (mpi4py when MPI is already
  initialized here, else the launcher's services as above, else mpi4py), or one of "apinfo",
  "pmix", "pmi", "mpi4py".

A service belongs to the process its launcher started, the *task*; a program started through
a job script that does not ``exec`` may still use it when everything in between never speaks
PMI (`chain`), and later programs of that task get the same answer from the first one's
holder instead of asking again (the claim).

    env = distenv.discover()            # node_rank, num_nodes, hosts, master_addr filled
    env.export()
"""

from __future__ import annotations

from ..core.description import DECLINED, PER_NODE, UNKNOWN, DistEnv, Note, unsettled
from ..errors import DistEnvError
from .apply import STALE, Answer, apply, from_hostnames
from .services import PMI_WHY, PMIX_WHY

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .services import Service

#: What `discover` accepts as `method`.
METHODS = ("auto", "apinfo", "pmix", "pmi", "mpi4py")


def _debug(text: str) -> None:
    from .door import debug  # here: a discovery that logs nothing never imports the door

    debug(text)


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


class Declined(str):
    """Why a service was not asked (its fix in the text, where one applies); `present`: its
    variables are here, so it was meant to answer (not merely not offered here)."""

    __slots__ = ("service", "present")
    service: str
    present: bool

    def __new__(cls, text: str, service: str, present: bool = True) -> "Declined":
        self = super().__new__(cls, text)
        self.service, self.present = service, present
        return self


def _ask(svc: "Service", environ: "Mapping[str, str]", found: Any, timeout: "float | None",
         env: DistEnv, need: "tuple[str, ...] | None" = None) -> Answer:
    """`svc` asked once for this task: a program started through a job script first takes
    the task's claim (or gets the answer an earlier program of the task got), and its holder
    keeps the answer for the next ones."""
    chain = getattr(found, "chain", None)
    if chain is None or not chain.wrapped:
        return svc.ask(environ, found, timeout, env, need)
    from . import chain as chains

    from ..knobs import timeout as wait

    from .door import DoorError

    seconds = wait(environ, timeout)
    try:
        text = chains.earlier_answer(svc.name, chain, seconds)
    except DoorError as exc:
        # a name is no proof: nothing from that peer is believed, and the job still gets
        # its answer from the launcher's own service
        _debug(f"discovery: {exc}: asking the launcher's {svc.name} service without the "
               "task's claim (a later program of this job script asks again)")
        return svc.ask(environ, found, timeout, env, need)
    if text is not None:
        earlier = Answer.from_json(text)
        if earlier is None:
            raise DistEnvError(f"an earlier program of this task gave an answer distenv cannot "
                               f"read ({text[:200]!r}). Fix: run one distenv version in the job "
                               "script, or set MASTER_ADDR (and NODE_RANK).")
        earlier.why += f"; kept for this task by process {earlier.earlier}"
        return earlier
    claim = chains.take_claim(svc.name, chain)
    if claim is None:
        raise DistEnvError(f"another program of this task (started by {chain.name}, pid "
                           f"{chain.daemon}) is asking the launcher's {svc.name} service now. "
                           "Fix: run the programs of a job script one after the other, or set "
                           "MASTER_ADDR (and NODE_RANK).")
    try:
        # a later program of the task may need more than this one: the claim keeps every host
        ans = svc.ask(environ, found, timeout, env, None)
        from . import holder as _holder

        try:
            holder = _holder.for_task(chain.task, chain.task_start, chain.daemon_id)
            import os

            holder.ask("claim", fds=[claim.fileno()], answer=ans.to_json(os.getpid()))
        except _holder.HolderError as exc:
            from ..log import get_logger

            get_logger(__name__).warning(
                f"the answer of the launcher's {svc.name} service is not kept for later programs "
                f"of this job script ({exc}); a later one that asks again may fail")
        return ans
    finally:
        claim.close()


def _services(env: DistEnv, only: "str | None" = None) -> "list[Service]":
    from .services import SERVICES, of

    if only is not None:
        return [SERVICES[only]]
    return of(env)


def _discovered(env: DistEnv, environ: "Mapping[str, str]", timeout: "float | None",
                strict: bool, only: "str | None" = None, need: "tuple[str, ...] | None" = None
                ) -> "tuple[DistEnv | None, list[Declined]]":
    """(`env` completed by the first service offered here, or None; why the others were not
    asked). Not `strict`: a service that turns out unusable here (`Service.soft`) is noted and
    the next one tried; anything else it raises is raised."""
    svcs = _services(env, only)
    for svc in svcs:  # this same process asked before it exec'ed (distenv run)
        earlier = svc.inherited(environ)
        if earlier is not None:
            return apply(env, earlier), []
    declined: "list[Declined]" = []
    from ..sources import source_of

    source = source_of(env.launcher)
    for svc in svcs:
        refused = source.services.refuses(svc.name, environ) if svc.present(environ) else ""
        if refused:
            _debug(f"discovery: {svc.name} not asked: {refused}")
            declined.append(Declined(refused, svc.name, True))
            continue
        found, why_not = svc.offer(environ)
        if found is None:
            _debug(f"discovery: {svc.name} not asked: {why_not}")
            declined.append(Declined(why_not, svc.name, svc.present(environ)))
            continue
        try:
            ans = _ask(svc, environ, found, timeout, env, need)
        except Exception as exc:
            if strict or not svc.soft(exc):
                raise
            from ..log import get_logger

            get_logger(__name__).warning(f"discovery: the launcher's {svc.name} service cannot "
                                         f"fill the unknown fields: {exc}")
            declined.append(Declined(str(exc), svc.name))
            continue
        return apply(env, ans), declined
    return None, declined


def _not_asked(env: DistEnv, declined: "list[Declined]", need: "Iterable[str]",
               environ: "Mapping[str, str] | None" = None) -> DistEnv:
    """`env` with a note saying why no service filled `need` (about those fields: dropped
    once known), in place of the resolver's suggestion to call discovery. The reason given is
    the first service whose variables are here (the one meant to answer)."""
    present = [d for d in declined if d.present] or declined
    if not present:
        return env
    reason = present[0]
    fields = tuple(f for f in need if getattr(env, f) is None)
    if not fields:
        return env
    from ..core.resolver import unknown_note
    from ..sources import source_of

    if reason.present:
        text = f"discovery did not ask the launcher's {reason.service} service: {reason}"
    else:
        from . import containers

        fix = source_of(env.launcher).services.fix
        inside = containers.where(environ or {})
        if inside:  # the starter kept the service's variables out: its own option lets them in
            text = (f"discovery found no service of {env.launcher} to ask{inside}, which passed "
                    f"none of its variables ({reason}). {containers.fix(environ or {}, 'env')}")
        else:
            text = (f"discovery found no service of {env.launcher} to ask ({reason})"
                    + (f". Fix: {fix}, or set MASTER_ADDR (and NODE_RANK) for every rank" if fix else ""))
    text += "" if "Fix:" in text else ". Fix: set MASTER_ADDR (and NODE_RANK) for every rank"

    notes = [n for n in env.notes if getattr(n, "kind", None) != UNKNOWN]
    values = unsettled(env)
    source = source_of(env.launcher)
    rebuilt = unknown_note(values, source.title or str(env.launcher),
                           env.launch == PER_NODE, asked=True, reads=source.owns,
                           never=source.launch.unknown_fix)
    return DistEnv(values, env.provenance,
                   [*notes, *([rebuilt] if rebuilt else []), Note(text, about=fields, kind=DECLINED)])


def complete(env: "DistEnv | None" = None, *, need: "Iterable[str]" = ("master_addr",),
             timeout: "float | None" = None, environ: "Mapping[str, str] | None" = None) -> DistEnv:
    """`env` with the fields in `need` filled by asking the launcher's service, when it must
    and can (module docstring).

    * Every field in `need` known: `env` unchanged, no communication.
    * MPI already initialized in this process (mpi4py): an allgather of host names.
    * Else the launcher's services in turn (`Source.services`): the first offered here
      answers. The PMI-1 exchange is collective -- every rank must call it -- and ends
      within `timeout` seconds (default DISTENV_TIMEOUT, else 180), naming a rank that never
      came; the PMIx query and the apinfo file are not collective.
    * None offered (or none usable): `env` with a note (`about` the fields in `need`) saying
      why, which the caller's own error repeats.
    """
    import os

    if env is None:
        from ..core.resolver import resolve

        env = resolve(environ)
    need = tuple(need)
    if all(getattr(env, field) is not None for field in need):
        return env
    if _mpi_ready() is not None:
        return discover(env, "mpi4py")
    environ = os.environ if environ is None else environ
    got, declined = _discovered(env, environ, timeout, strict=False, need=need)
    return got if got is not None else _not_asked(env, declined, need, environ)


def handoffs() -> "dict[str, str]":
    """The variables that pass this process's answer to a program it is about to exec (``distenv
    run``): the same pid completes from them without asking again (`Service.inherited`)."""
    from .services import SERVICES

    out = {}
    for svc in SERVICES.values():
        held = svc.handoff()
        if held is not None:
            out[held[0]] = held[1]
    return out


def discover(env: "DistEnv | None" = None, method: str = "auto", *,
             timeout: "float | None" = None) -> DistEnv:
    """Fill node rank, node count, host list and master address by asking the launcher's
    service or the other ranks.

    Communicates: call it explicitly, on every rank. `method`: "auto" (the default: mpi4py
    when MPI is already initialized here, else the services the launcher declares -- Cray
    PALS's apinfo file, PMIx, PMI-1 -- else mpi4py), "apinfo", "pmix", "pmi" (one service, an
    error saying why when it cannot be used here), or "mpi4py" (an MPI allgather of host names;
    importing mpi4py initializes MPI).
    """
    import os

    if env is None:
        from ..core.resolver import resolve

        env = resolve()
    if method not in METHODS:
        raise DistEnvError(f"unknown discovery method {method!r}. Fix: pass method="
                           + ", ".join(repr(m) for m in METHODS[:-1]) + f" or {METHODS[-1]!r}.")
    if method == "auto" and _mpi_ready() is not None:
        method = "mpi4py"
    if method != "mpi4py":
        got, declined = _discovered(env, os.environ, timeout, strict=method != "auto",
                                    only=None if method == "auto" else method)
        if got is not None:
            return got
        import importlib.util

        if method != "auto" or importlib.util.find_spec("mpi4py") is None:
            shown = [d for d in declined if d.present] or declined
            why = "; ".join(f"{d.service}: {d}" for d in shown) or (
                f"{env.launcher} offers no service distenv can ask")
            fix = "" if any("Fix:" in d for d in declined) else (
                " Fix: set MASTER_ADDR (and NODE_RANK) for every rank, or pip install mpi4py.")
            raise DistEnvError(f"discovery cannot ask the launcher here: {why}.{fix}")
    return _mpi4py(env)


def _mpi4py(env: DistEnv) -> DistEnv:
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistEnvError(
            "discovery with mpi4py needs mpi4py built for your MPI. Fix: pip install mpi4py; "
            "without it, set MASTER_ADDR (and NODE_RANK) in the job script instead."
        ) from None
    from .apply import with_values

    comm = MPI.COMM_WORLD
    if env.world_size is None:  # MPICH -pmi-port gives no PMI_SIZE; MPI knows the size
        env = with_values(env, {"world_size": comm.Get_size()}, "MPI_Comm_size (mpi4py)")
    if comm.Get_rank() != env.rank or comm.Get_size() != env.world_size:
        raise DistEnvError(
            f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but distenv resolved "
            f"rank={env.rank} of world_size={env.world_size}: the launch is not this MPI job. "
            + STALE
        )
    import socket

    names = comm.allgather(socket.gethostname())
    return from_hostnames(env, names, "mpi4py allgather of host names")


__all__ = ["complete", "discover", "from_hostnames", "handoffs", "Answer", "apply", "STALE",
           "PMI_WHY", "PMIX_WHY", "METHODS"]
