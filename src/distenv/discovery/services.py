"""The launchers' own services that know where every rank runs, behind one interface.

Each launcher's `Source` declares the services its processes may use, in the order discovery
tries them (`Source.services`); each service decides from its own variables and guards whether
it is offered here (`offer`), asks (`ask`), and hands what it found to a program this process
is about to exec (`handoff`, `inherited`: ``distenv run``). `distenv.discovery.complete` and
`discover` loop over them; nothing here names a launcher.

=========  ============================================  =========================================
service    client                                        offered when
=========  ============================================  =========================================
apinfo     `distenv.discovery.apinfo`: Cray PALS's placement        ``PALS_APINFO`` names the file (HPE's
           file, read (no communication)                 PBS mpiexec, ``srun --mpi=cray_shasta``,
                                                         Flux's cray-pals)
pmix       `distenv.discovery.pmix`: the launcher's libpmix        ``PMIX_*`` and the PMIx server is this
           (ctypes)                                      task's daemon (Open MPI 4/5, PRRTE,
                                                         ``srun --mpi=pmix``)
pmi        `distenv.discovery.pmi`: the PMI-1 wire protocol        ``PMI_FD`` or ``PMI_PORT`` and the
           (standard library)                            daemon is Hydra's proxy or SLURM's
                                                         stepd (``srun --mpi=pmi2``)
=========  ============================================  =========================================
"""

from __future__ import annotations

from ..core.description import PER_NODE
from .apply import Answer

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ..core.description import DistEnv

#: The provenance of every field the key-value exchange fills.
PMI_WHY = "PMI-1 key-value exchange"
#: The provenance of every field the PMIx server's placement fills.
PMIX_WHY = "PMIx placement"


class Service:
    """One launcher service. `collective`: every rank must call `ask` (a rank that does not
    holds the others until their timeout)."""

    name = ""
    collective = False

    def soft(self, exc: Exception) -> bool:
        """Does `exc` (raised by `ask`) mean the service is unusable here -- no library to load,
        a file it cannot read -- rather than wrong? `complete()` then tries the next service
        and notes why, instead of failing."""
        return False

    #: Variables whose presence means this launch carries the service (it was meant to
    #: answer, whatever `offer` then decides).
    markers: "tuple[str, ...]" = ()

    def present(self, environ: "Mapping[str, str]") -> bool:
        return any(var in environ for var in self.markers)

    def offer(self, environ: "Mapping[str, str]") -> "tuple[Any, str]":
        """(how to reach it, "") or (None, why not: with its fix where one applies)."""
        raise NotImplementedError

    def ask(self, environ: "Mapping[str, str]", found: Any, timeout: "float | None",
            env: "DistEnv", need: "tuple[str, ...] | None" = None) -> Answer:
        """The service's answer; `need`: the fields the caller needs (None: every field), for a
        service that can answer less at less cost."""
        raise NotImplementedError

    def inherited(self, environ: "Mapping[str, str]") -> "Answer | None":
        """The answer this same process got before it exec'ed (``distenv run``), or None."""
        return None

    def handoff(self) -> "tuple[str, str] | None":
        """(variable, value) passing this process's answer to the program it is about to exec."""
        return None


class Apinfo(Service):
    name = "apinfo"
    markers = ("PALS_APINFO",)

    def soft(self, exc: Exception) -> bool:
        from .apinfo import ApinfoUnreadable

        return isinstance(exc, ApinfoUnreadable)

    def offer(self, environ: "Mapping[str, str]") -> "tuple[Any, str]":
        from . import apinfo

        return apinfo.offer(environ)

    def ask(self, environ: "Mapping[str, str]", found: Any, timeout: "float | None",
            env: "DistEnv", need: "tuple[str, ...] | None" = None) -> Answer:
        from . import apinfo
        from ..core.reading import get_int

        rank = get_int(environ, "PALS_RANKID", "Cray PALS")
        if rank is None:
            rank = env.rank
        layout = apinfo.read(found, rank)
        if rank is None:
            raise apinfo.ApinfoError("neither PALS_RANKID nor the launcher says which rank this "
                                     "is. Fix: set MASTER_ADDR (and NODE_RANK).")
        return Answer(self.name, rank, len(layout.hosts), layout.hosts,
                      f"{apinfo.WHY} (PALS_APINFO, version {layout.version})",
                      one_per_node="srun --ntasks-per-node=1, mpiexec --ppn 1")


class Pmix(Service):
    name = "pmix"
    markers = ("PMIX_NAMESPACE",)

    def soft(self, exc: Exception) -> bool:
        from .pmix import PMIxUnavailable

        return isinstance(exc, PMIxUnavailable)

    def offer(self, environ: "Mapping[str, str]") -> "tuple[Any, str]":
        from . import pmix

        return pmix.offer(environ)

    #: Fields that only every rank's host proves; without them rank 0's host suffices (the
    #: master address: 2 reads of the server's data instead of 1 + N, at any job size).
    EVERY_HOST = ("node_rank", "num_nodes", "local_world_size", "local_rank", "nproc_per_node",
                  "hosts", "rank_hosts")

    def ask(self, environ: "Mapping[str, str]", found: Any, timeout: "float | None",
            env: "DistEnv", need: "tuple[str, ...] | None" = None) -> Answer:
        from . import pmix

        # a per-node launch is proven one process per host by every rank's host alone
        full = need is None or env.launch == PER_NODE or any(f in self.EVERY_HOST for f in need)
        return self.answer(pmix.query(environ=environ, timeout=timeout, found=found, full=full),
                           found.server)

    @staticmethod
    def answer(got: Any, server: str = "") -> Answer:
        """A `distenv.discovery.pmix.Placement` as an `Answer`."""

        which = "every rank" if got.full else "rank 0"
        why = f"{PMIX_WHY} (the host of {which}{', ' + server if server else ''})"
        return Answer("pmix", got.rank, got.size, got.hosts, why,
                      one_per_node="mpirun --map-by ppr:1:node, srun --ntasks-per-node=1",
                      full=got.full)

    def inherited(self, environ: "Mapping[str, str]") -> "Answer | None":
        from ..knobs import PMIX_HELD

        if not PMIX_HELD.is_set(environ):  # pmix.HELD_VAR, without importing pmix
            return None
        from . import pmix

        got = pmix.inherited(environ)
        return None if got is None else self.answer(got)

    def handoff(self) -> "tuple[str, str] | None":
        from . import pmix

        held = pmix.handoff()
        return None if held is None else (pmix.HELD_VAR, held)


class Pmi(Service):
    name = "pmi"
    collective = True
    markers = ("PMI_FD", "PMI_PORT")

    def offer(self, environ: "Mapping[str, str]") -> "tuple[Any, str]":
        from . import pmi

        return pmi.offer(environ)

    def ask(self, environ: "Mapping[str, str]", found: Any, timeout: "float | None",
            env: "DistEnv", need: "tuple[str, ...] | None" = None) -> Answer:
        from . import pmi

        return self.answer(pmi.exchange(environ=environ, timeout=timeout, found=found))

    @staticmethod
    def answer(ex: Any) -> Answer:
        """A `distenv.discovery.pmi.Exchange` as an `Answer`."""

        how = "PMI_FD" if ex.mode == "fd" else "-pmi-port"
        why = f"{PMI_WHY} ({ex.server}, {how})"
        return Answer("pmi", ex.rank, ex.size, ex.hosts, why, port=ex.port,
                      port_key=f"hydra:{ex.kvsname}" if ex.kvsname else None,
                      one_per_node="mpiexec -ppn 1, srun --ntasks-per-node=1")

    def inherited(self, environ: "Mapping[str, str]") -> "Answer | None":
        from ..knobs import PMI_HELD

        if not PMI_HELD.is_set(environ):  # pmi.HELD_VAR, without importing pmi
            return None
        from . import pmi

        ex = pmi.inherited(environ)
        return None if ex is None else self.answer(ex)

    def handoff(self) -> "tuple[str, str] | None":
        from . import pmi

        held = pmi.handoff()
        return None if held is None else (pmi.HELD_VAR, held)


#: Every service by the name Sources declare it with.
SERVICES: "dict[str, Service]" = {s.name: s for s in (Apinfo(), Pmix(), Pmi())}


def of(env: "DistEnv") -> "list[Service]":
    """The services `env`'s launcher declares, in its order (`Source.services`)."""
    from ..sources import source_of

    return [SERVICES[name] for name in source_of(env.launcher).services]


__all__ = ["Service", "SERVICES", "of", "Apinfo", "Pmix", "Pmi"]
