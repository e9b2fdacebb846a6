"""The launcher's PMIx service: where every rank runs, under Open MPI 4/5, PRRTE and ``srun --mpi=pmix``.

Every rank Open MPI starts (4: ORTE's ``orted``/``mpirun``; 5: PRRTE's ``prted``/``prterun``),
and every task of ``srun --mpi=pmix``, is a PMIx client of the daemon that started it:
``PMIX_NAMESPACE``, ``PMIX_RANK`` and ``PMIX_SERVER_URI*`` are in its environment. PMIx is a
binary protocol spoken through the C library ``libpmix``; this module calls that library with
`ctypes` (standard library only, no compiler), and only when those variables are present.

What it reads (measured on the two namespace nodes, docs/launchers.md#pmix):

* ``PMIx_Init`` gives this process's namespace and rank; ``pmix.job.size`` (rank WILDCARD)
  the job's size; ``pmix.hname`` of every rank its host -- or, where ``pmix.lpeers`` lists every
  rank on this node, this rank's host for all (`_all_here`). Job-level data the server hands
  every client at init: the reads are answered locally (about 1-40 ms for the whole job here).
* From the host of every rank, `distenv.discovery.from_hostnames` proves the rest: master
  address (rank 0's host), nodes ordered by their lowest rank, node count, local counts.
* Not used, measured wrong: ``pmix.num.nodes`` read 4 on some ranks of a 2-node Open MPI 5
  job; ``pmix.nodeid`` follows the allocation, not the lowest rank (node2 = 1 while it holds
  rank 0), and failed (-46) for remote ranks under Open MPI 4 and SLURM.

Which library: the one the launcher's own server uses, never a guess that could be another
MPI's (a second, different libpmix in a process that later loads its MPI's breaks MPI_Init).
In order (`candidates`): a libpmix already mapped in this process (an MPI loaded it: it must
be that one); the libpmix mapped by the parent process -- the launcher's daemon, the PMIx
server itself (``/proc/<ppid>/maps``: Debian's Open MPI 4 maps the system ``libpmix.so.2``,
Open MPI 5 ``<prefix>/lib/openmpi/libpmix.so.2``, measured); the prefix the server exports
(``PMIX_PREFIX``, set by PRRTE, measured); the directory of the daemon's executable; and,
only under SLURM's ``slurmstepd`` (whose maps a non-root task cannot read), the dynamic
linker's ``libpmix.so.2``. None loads: `PMIxError` naming what was tried; `complete()`
then leaves the fields unknown.

A later MPI_Init in the same process (mpi4py, Horovod, any MPI program): what works differs
by server (measured, docs/launchers.md#pmix-and-mpi-init, and `tests/integration/test_pmix_discovery.py`):

* Open MPI 4 (ORTE; its libmpi uses this same system libpmix, so the library is shared and
  ``PMIx_Init`` is reference-counted): a client finalized before MPI_Init makes MPI_Init
  fail, one never finalized makes mpirun report the rank "exiting improperly", and a child
  process's client, finalized, also makes the parent's MPI_Init fail. So the query runs in
  this process (``mode="in-process"``), stays initialized, and an `atexit` handler finalizes
  it. Before or after MPI_Finalize alike: the count makes the last of the two the real
  finalize (measured with mpi4py finalizing explicitly and at its exit). Limit: a rank that
  ends with ``os._exit`` after the query never finalizes, and mpirun exits 1 (measured).
* Open MPI 5 (PRRTE, PMIx 5): a client kept open makes MPI_Init fail ("local rank ... Not
  found (-13)"), one finalized in this process makes it crash ("double free"). A child
  process that queries and finalizes leaves MPI_Init in the parent working. So the query
  runs in another process (``mode="child"``) and nothing of PMIx is ever loaded here: a fork
  of this one when it is a single thread (`single_threaded`; no interpreter to start), else a
  fresh interpreter (a fork of a threaded process may inherit a lock another thread held). The
  same for SLURM and any other server. The child reaches a TCP server through
  `distenv.discovery.pmix_relay`, which this process runs while it waits and which holds the
  server's end of that connection until the task ends: without it, about 1 job in 100
  hung in MPI_Init (PMIx 5.0's server can count a finalized client whose close arrives early
  as a lost rank; the relay's docstring and docs/discovery.md give the evidence).

Guards (a client that is not the rank would speak for it): only a process the PMIx server
started itself -- its parent is the daemon (`SERVERS`: ``orted``, ``mpirun``/``orterun``/
``mpiexec`` (Open MPI 4 on its own node), ``prted``/``prterun``/``prte`` (Open MPI 5,
PRRTE), ``slurmstepd``). A child of a rank (a DataLoader worker, a subprocess) has the rank as
its parent and never qualifies, whatever it inherited; a rank started through a wrapper
script that does not ``exec`` neither. A process that ran the query never runs it again (the
answer is kept); ``distenv run`` passes ``DISTENV_PMIX_HELD`` to the command it execs (same
pid: it completes from that). ``DISTENV_PMIX=0`` turns it off.

Never called by `resolve()`: `distenv.discovery.complete()` calls it where communication is
about to happen anyway.
"""

from __future__ import annotations

import os
import time

from .. import knobs
from ..errors import DistEnvError
from .handoff import answered, begin, decode_hosts, encode_hosts, pack, refusal, unpack

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

#: The executables (else process names) of PMIx servers that start ranks themselves, by kind
#: (`server_kind`). Open MPI 4 on mpirun's own node: mpirun is the server (exe orterun,
#: measured); Open MPI 5's mpirun execs prterun (measured).
SERVERS = {
    "orted": "orte", "mpirun": "orte", "orterun": "orte", "mpiexec": "orte",
    "prted": "prrte", "prterun": "prrte", "prte": "prrte",
    "slurmstepd": "slurm",
}
#: The environment variable `distenv run` passes to the command it execs.
HELD_VAR = knobs.PMIX_HELD
#: The server URI variables PMIx 2 to 5 servers set (looked up by name first: iterating
#: os.environ decodes every variable, 0.4 ms of a rank's share at 64 ranks).
URIS = ("PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI21",
        "PMIX_SERVER_URI2", "PMIX_SERVER_URI")
#: PMIx's soname (PMIx 2 to 5 keep ABI major 2).
SONAME = "libpmix.so.2"

# pmix_common.h (PMIx 4.2 and 5.0 agree on these)
PMIX_MAX_NSLEN = 255
PMIX_RANK_WILDCARD = 0xFFFFFFFE
PMIX_ERR_NOT_FOUND = -46
#: pmix_data_type_t -> struct format (native) of the integer in the union (offset 8)
_INTS = {4: "N", 6: "i", 7: "b", 8: "h", 9: "i", 10: "q", 11: "I", 12: "B", 13: "H", 14: "I",
         15: "Q", 40: "I"}  # SIZE, INT, INT8..64, UINT, UINT8..64, PROC_RANK
PMIX_STRING = 3


class PMIxError(DistEnvError):
    """The PMIx service could not be used or its answer makes no sense."""


class PMIxUnavailable(PMIxError):
    """No library of the launcher's PMIx could be loaded: the fields stay unknown."""


class Offer:
    """How to reach this process's PMIx server: `libs` to try in order, the server's `kind`;
    `chain` the processes between the server and this one (`distenv.discovery.chain`), None
    in tests."""

    __slots__ = ("nspace", "rank", "kind", "server", "libs", "tried", "why", "chain")

    def __init__(self, nspace: str, rank: int, kind: str, server: str, libs: "list[str]",
                 tried: "list[str]", why: str, chain: Any = None) -> None:
        self.nspace, self.rank, self.kind, self.server = nspace, rank, kind, server
        self.libs, self.tried, self.why, self.chain = libs, tried, why, chain

    @property
    def mode(self) -> str:
        """"in-process" (Open MPI 4's ORTE) or "child" (everything else): see the module doc."""
        return "in-process" if self.kind == "orte" else "child"

    def __repr__(self) -> str:
        return f"Offer({self.kind!r}, {self.libs!r})"


class Placement:
    """What the service said: ``hosts[r]`` is rank r's host name -- every rank's, or (not
    `full`) rank 0's alone."""

    __slots__ = ("rank", "size", "hosts", "nspace", "lib", "version", "mode", "seconds",
                 "relayed", "full", "how")

    def __init__(self, rank: int, size: int, hosts: "list[str]", nspace: str, lib: str,
                 version: str, mode: str, seconds: float, relayed: bool = False,
                 full: bool = True, how: str = "") -> None:
        self.rank, self.size, self.hosts, self.nspace = rank, size, hosts, nspace
        self.lib, self.version, self.mode, self.seconds = lib, version, mode, seconds
        #: The child's connection went through `distenv.discovery.pmix_relay` (held until exit).
        self.relayed = relayed
        #: Every rank's host (else rank 0's alone: `query(full=False)`).
        self.full = full
        #: Mode "child": the query process was a "fork" of this one or a fresh "interpreter".
        self.how = how

    def __repr__(self) -> str:
        return f"Placement(rank={self.rank}, size={self.size}, hosts={self.hosts!r}, lib={self.lib!r})"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def mapped(maps_text: str) -> "list[str]":
    """The libpmix files in a /proc/<pid>/maps text, in order of first mapping. Only
    ``libpmix.so*`` names: PMIx servers also map their lock files (``.../dstore_sm.lock``)."""
    found: "list[str]" = []
    at = maps_text.find("libpmix.so")
    while at >= 0:  # only the lines that name it (a server maps 300-500): no split of the rest
        end = maps_text.find("\n", at)
        end = len(maps_text) if end < 0 else end
        parts = maps_text[maps_text.rfind("\n", 0, at) + 1:end].split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if os.path.basename(path).startswith("libpmix.so") and path not in found:
                found.append(path)
        at = maps_text.find("libpmix.so", end)
    return found


def candidates(environ: "Mapping[str, str]", kind: str, parent: "int | None",
               own_maps: "str | None" = None, parent_maps: "str | None" = None,
               parent_exe: "str | None" = None,
               exists: "Any" = os.path.exists) -> "tuple[list[str], list[str]]":
    """(libraries to try, in order; what was looked at and found nothing) -- see the module doc.
    The maps and exe are read from /proc unless given (tests). `parent` None: the server is
    not visible from here (a container's own pid namespace)."""
    libs: "list[str]" = []
    tried: "list[str]" = []

    def add(path: str, where: str) -> None:
        if path in libs:
            return
        if exists(path):
            libs.append(path)
        else:
            tried.append(f"{path} ({where}: no such file)")

    own = mapped(_read("/proc/self/maps") if own_maps is None else own_maps)
    if own:  # an MPI in this process loaded one: a second, different copy breaks it
        return own[:1], tried
    if parent is not None:
        server = mapped(_read(f"/proc/{parent}/maps") if parent_maps is None else parent_maps)
        for path in server:
            add(path, f"mapped by the PMIx server, pid {parent}")
        if not server:
            tried.append(f"/proc/{parent}/maps (the server's libraries: none readable)")
    prefix = environ.get("PMIX_PREFIX", "").strip()
    if prefix.startswith("/"):
        for sub in ("lib/openmpi", "lib", "lib64"):
            add(os.path.join(prefix, sub, SONAME), "PMIX_PREFIX")
    if parent is not None and parent_exe is None:
        try:
            parent_exe = os.readlink(f"/proc/{parent}/exe")
        except OSError:
            parent_exe = ""
    if parent_exe and parent_exe.startswith("/") and kind != "slurm":
        root = os.path.dirname(os.path.dirname(parent_exe))
        for sub in ("lib/openmpi", "lib", "lib64"):
            add(os.path.join(root, sub, SONAME), f"beside the server's executable {parent_exe}")
    if not libs:
        # Nothing the server proves (SLURM's stepd, whose maps a task cannot read; a server
        # in another user or pid namespace: Charliecloud, a container's own pid namespace):
        # a libpmix this process's MPI could load, taken only when it is the server's release
        # (PMIX_VERSION, which every server measured here exports), checked in the file
        # before it is loaded: another release could break a later MPI_Init.
        want = environ.get("PMIX_VERSION", "").strip()
        for path in linker_paths(environ):
            if not want:
                tried.append(f"{path} (PMIX_VERSION is not set, so it cannot be checked "
                             "against the server's)")
            elif not release_of(path, want):
                tried.append(f"{path} (not PMIx {want}, the server's)")
            else:
                libs.append(path)
                break
    return libs, tried


#: Where the dynamic linker looks for a library by default (Debian's multiarch first).
LINKER_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
               "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/lib",
               "/usr/local/lib")


def linker_paths(environ: "Mapping[str, str]") -> "list[str]":
    """The files named `SONAME` this process's MPI could load, each once: under Open MPI's
    prefix (``OPAL_PREFIX``, which Open MPI 5 sets on every node: measured; its libpmix is in
    ``lib/openmpi``), in LD_LIBRARY_PATH's directories (and their ``openmpi``), then in the
    dynamic linker's default directories."""
    out: "list[str]" = []
    dirs = [os.path.join(environ.get("OPAL_PREFIX", ""), sub) for sub in ("lib/openmpi", "lib")
            if environ.get("OPAL_PREFIX", "").startswith("/")]
    for d in environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d.startswith("/"):
            dirs += [d, os.path.join(d, "openmpi")]
    for d in (*dirs, *LINKER_DIRS):
        path = os.path.join(d, SONAME)
        if not os.path.isfile(path):  # first: realpath stats every component (most dirs lack it)
            continue
        path = os.path.realpath(path)
        if path not in out:
            out.append(path)
    return out


def release_of(path: str, version: str) -> bool:
    """Does the library file `path` carry PMIx's version banner for `version` (``OpenPMIx
    4.2.2rc2 (``, what PMIx_Get_version returns), read without loading it? Read from the end,
    in blocks: the banner is in .rodata, after the code (2.0 MB into PMIx 5.0's 2.3 MB file,
    1.7 into 4.2's 2.1), so a rank reads a block or two, not the file (1.0 ms -> 0.1 ms, measured)."""
    banner = f"OpenPMIx {version} (".encode()
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            while end > 0:
                start = max(0, end - _BLOCK)
                f.seek(start)
                if banner in f.read(end - start + len(banner) - 1):  # (one straddling the end)
                    return True
                end = start
    except OSError:
        return False
    return False


_BLOCK = 1 << 18


def kind_from_uri(environ: "Mapping[str, str]") -> "str | None":
    """The server's kind from its own URI, where the server cannot be seen (a container's pid
    namespace): ``PMIX_SERVER_URI*`` = ``<server's namespace>.<rank>;tcp4://...``, measured:
    SLURM's pmix plugin ``pmix-server.<stepd pid>``, PRRTE ``prterun-<host>-<pid>@0.<vpid>``,
    ORTE (Open MPI 4) ``<job id>.<vpid>``, digits (tests/fixtures/launchers/cluster-*)."""
    kinds = set()
    for key in environ:  # keys only: items() decoded every value too (43 against 15 us, measured)
        if key.startswith("PMIX_SERVER_URI"):
            server = environ[key].partition(";")[0]
            job, dot, vpid = server.partition(".")
            if server.startswith("pmix-server."):
                kinds.add("slurm")
            elif server.startswith(("prterun-", "prte-")):
                kinds.add("prrte")
            elif dot and job.isdigit() and vpid.isdigit():  # not `re`: 5 ms of a rank's import
                kinds.add("orte")
            else:
                kinds.add("")
    return kinds.pop() or None if len(kinds) == 1 else None


def server_kind(pid: int, exe: "str | None" = None, comm: "str | None" = None) -> "tuple[str, str | None]":
    """(name, kind in `SERVERS` or None) of process `pid`: its executable's name (Debian's
    ``mpirun.openmpi`` is a link to ``orterun``; Open MPI 5's ``mpirun`` execs ``prterun``),
    else -- when another user's (``slurmstepd``) cannot be read -- its process name, without
    a Debian-style ``.openmpi`` suffix."""
    if exe is None:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
    name = os.path.basename(exe).split(" ", 1)[0]
    if name in SERVERS:
        return name, SERVERS[name]
    if comm is None:
        comm = _read(f"/proc/{pid}/comm").strip()
    base = comm.split(".", 1)[0]
    return comm or name or "unknown", SERVERS.get(base)


def offer(environ: "Mapping[str, str] | None" = None) -> "tuple[Offer | None, str]":
    """(how to reach the service, "") or (None, why not). Reads /proc: call it only where
    communication is about to happen."""
    from ..knobs import PMIX

    environ = os.environ if environ is None else environ
    if not PMIX.value(environ):
        return None, f"{PMIX}=0"
    nspace, rank = environ.get("PMIX_NAMESPACE", ""), environ.get("PMIX_RANK", "").strip()
    if not nspace or not (any(k in environ for k in URIS)
                          or any(k.startswith("PMIX_SERVER_URI") for k in environ)):
        return None, "no PMIx server (PMIX_NAMESPACE and PMIX_SERVER_URI* are not set)"
    if not rank.isdigit():
        return None, f"PMIX_RANK={environ.get('PMIX_RANK')!r} is not a rank"
    refused = refusal(environ, HELD_VAR, os.getpid())
    if refused is not None:
        return None, refused
    from .chain import walk

    chain, why_not = walk(lambda pid: server_kind(pid)[1],
                          "orted, prted, prterun, mpirun, slurmstepd")
    if chain is None:
        return None, why_not
    if chain.container:  # the server is outside the container's pid namespace, unseen
        kind = kind_from_uri(environ)
        if kind is None:
            return None, (f"the PMIx server outside the {chain.container} container is of no "
                          "kind distenv knows (its PMIX_SERVER_URI names neither ORTE, PRRTE "
                          "nor SLURM). Fix: set MASTER_ADDR (and NODE_RANK) for every rank")
        libs, tried = candidates(environ, kind, None)
        why = f"PMIx server outside the {chain.container} container"
        return Offer(nspace, int(rank), kind, chain.name, libs, tried, why, chain), ""
    libs, tried = candidates(environ, chain.kind, chain.daemon)  # type: ignore[arg-type]  # a daemon's kind
    why = f"PMIx server {chain.name} (pid {chain.daemon})"
    return Offer(nspace, int(rank), chain.kind, chain.name, libs, tried, why, chain), ""  # type: ignore[arg-type]  # as above


# -- the library ------------------------------------------------------------------------------
def _types() -> "tuple[Any, Any]":
    """pmix_proc_t and pmix_value_t (pmix_common.h): the proc's nspace is char[256] then a
    uint32 rank; a value is a uint16 type, then a union at offset 8 (a pointer for strings)."""
    import ctypes

    class Proc(ctypes.Structure):
        _fields_ = [("nspace", ctypes.c_char * (PMIX_MAX_NSLEN + 1)), ("rank", ctypes.c_uint32)]

    class Value(ctypes.Structure):
        _fields_ = [("type", ctypes.c_uint16), ("_pad", ctypes.c_uint8 * 6),
                    ("data", ctypes.c_uint8 * 24)]

    return Proc, Value


def decode(vtype: int, data: bytes) -> "int | str | None":
    """A pmix_value_t's contents: `vtype` and the union's bytes (for PMIX_STRING: the bytes
    of the NUL-terminated string the pointer points at). Integers by their own width;
    anything else None (not a type this client reads)."""
    import struct

    if vtype == PMIX_STRING:
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")
    fmt = _INTS.get(vtype)
    if fmt is None:
        return None
    value: int = struct.unpack_from("@" + fmt, data)[0]  # native: size_t is "N"
    return value


def read_value(value: Any) -> "int | str | None":
    """The contents of a pmix_value_t (a `_types()` Value in the library's memory): for
    PMIX_STRING the string its pointer points at, else `decode` of the union's bytes."""
    import ctypes

    raw = bytes(value.data)
    if value.type == PMIX_STRING:
        ptr = ctypes.c_void_p.from_buffer_copy(raw[:ctypes.sizeof(ctypes.c_void_p)]).value
        raw = ctypes.string_at(ptr) if ptr else b""
    return decode(int(value.type), raw)


class _Lib:
    """One loaded libpmix (ctypes) and its client state."""

    def __init__(self, path: str) -> None:
        import ctypes

        # RTLD_GLOBAL: an MPI loaded later binds its own references to this same copy
        self.cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.path = path
        self.Proc, self.Value = _types()
        c = self.cdll
        c.PMIx_Init.restype = c.PMIx_Finalize.restype = c.PMIx_Get.restype = ctypes.c_int
        c.PMIx_Init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        c.PMIx_Finalize.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        c.PMIx_Get.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_void_p]
        c.PMIx_Get_version.restype = ctypes.c_char_p
        c.PMIx_Initialized.restype = ctypes.c_int
        try:  # PMIx 4+: frees what PMIx_Get returned (Open MPI 4's in-process client kept it all)
            self.free: Any = c.PMIx_Value_free
            self.free.restype = None
            self.free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        except AttributeError:
            self.free = None
        self.me = self.Proc()
        self._args: Any = None

    def version(self) -> str:
        raw = self.cdll.PMIx_Get_version()
        return raw.decode(errors="replace") if isinstance(raw, bytes) else "?"

    def initialized(self) -> bool:
        return bool(self.cdll.PMIx_Initialized())

    def init(self) -> None:
        import ctypes

        rc = self.cdll.PMIx_Init(ctypes.byref(self.me), None, 0)
        if rc != 0:
            raise PMIxError(f"PMIx_Init failed with status {rc} ({self.path})")

    def finalize(self) -> int:
        rc: int = self.cdll.PMIx_Finalize(None, 0)
        return rc

    def get(self, rank: int, key: str) -> "int | str | None":
        """`key` of `rank` in this process's namespace; None when the server has none."""
        import ctypes

        if self._args is None:  # one proc and one result pointer for every read (N of them)
            proc = self.Proc()
            proc.nspace = self.me.nspace
            self._args = (proc, ctypes.POINTER(self.Value)())
        proc, out = self._args
        proc.rank = rank
        rc = self.cdll.PMIx_Get(ctypes.byref(proc), key.encode(), None, 0, ctypes.byref(out))
        if rc == PMIX_ERR_NOT_FOUND:
            return None
        if rc != 0 or not out:
            raise PMIxError(f"PMIx_Get({key!r}, rank {rank}) failed with status {rc}")
        value = read_value(out.contents)
        if self.free is not None:
            self.free(out, 1)
        return value


def _query(lib: _Lib, full: bool = True) -> "tuple[int, int, list[str], str]":
    """(rank, size, host of every rank -- or, not `full`, of rank 0 alone --, nspace) from an
    initialized client. Every read is answered from the job data the server handed the client
    at init, but there are N of them: a caller that needs only rank 0's host asks for it alone
    (2 reads, whatever the job's size)."""
    rank = int(lib.me.rank)
    nspace = lib.me.nspace.decode(errors="replace")
    size = lib.get(PMIX_RANK_WILDCARD, "pmix.job.size")
    if not isinstance(size, int) or size < 1 or rank >= size:
        raise PMIxError(f"the PMIx server gave job size {size!r} for rank {rank}")
    hosts = [_hname(lib, 0, size)]
    if full and size > 1:
        hosts = _all_here(lib, size, rank, hosts[0]) or [
            hosts[0], *(_hname(lib, r, size) for r in range(1, size))]
    return rank, size, hosts, nspace


def _hname(lib: _Lib, rank: int, size: int) -> str:
    host = lib.get(rank, "pmix.hname")
    if not isinstance(host, str) or not host:
        raise PMIxError(f"the PMIx server gave no host (pmix.hname) for rank {rank} of {size}")
    return host


def _all_here(lib: _Lib, size: int, rank: int, host0: str) -> "list[str] | None":
    """Every rank's host in 2 more reads when every rank runs on this node: ``pmix.lpeers``
    (the ranks of this namespace on this node: PMIx standard, read at the wildcard rank as Open
    MPI's own MPI_Init reads it) lists all `size` ranks, and rank 0's ``pmix.hname`` is this
    rank's. Else None: one ``pmix.hname`` read per rank (64 reads were 2.3 ms of a rank's CPU
    under Open MPI 4). Not PMIx_Resolve_peers: OpenPMIx 4.2.2's deadlocked in its progress
    thread behind ch-run under Open MPI 4 (measured; its node-qualified read asks the server)."""
    try:  # an optional read: a server that fails it still has every rank's pmix.hname
        peers = lib.get(PMIX_RANK_WILDCARD, "pmix.lpeers")
        ranks = sorted(int(r) for r in peers.split(",")) if isinstance(peers, str) else None
    except (PMIxError, ValueError):
        return None
    if ranks != list(range(size)) or _hname(lib, rank, size) != host0:
        return None
    return [host0] * size


_done: "tuple[int, Placement] | None" = None  # (pid, answer): one query per process
_kept: "_Lib | None" = None  # the in-process client, finalized at exit


def _finalize_at_exit() -> None:
    global _kept
    lib, _kept = _kept, None
    if lib is not None and _done is not None and _done[0] == os.getpid():
        lib.finalize()


def _in_process(found: Offer, timeout: float, full: bool = True) -> "tuple[Placement, _Lib, bool]":
    """Load, init and read here, in a thread awaited for `timeout` seconds (a call into the
    library cannot be interrupted; a server that never answers must not hang the rank).
    ``_thread``, not ``threading``: its import alone cost a rank 1.4 ms of its 64-rank share."""
    import _thread

    box: "dict[str, Any]" = {}
    done = _thread.allocate_lock()
    done.acquire()

    def work() -> None:
        try:
            lib = _load(found.libs, found.tried)
            box["lib"] = lib
            was = lib.initialized()  # an MPI of this process initialized it already
            lib.init()
            box["was"] = was
            box["answer"] = _query(lib, full)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            done.release()

    start = time.monotonic()
    _thread.start_new_thread(work, ())  # like a daemon thread: never holds up the exit
    if not done.acquire(timeout=timeout):
        raise PMIxError(f"the PMIx server did not answer within {timeout:g} s ({found.why}). "
                        "Fix: set DISTENV_TIMEOUT=<seconds> to wait longer, or set MASTER_ADDR.")
    if "error" in box:
        raise box["error"]
    lib = box["lib"]
    rank, size, hosts, nspace = box["answer"]
    if box["was"]:  # reference-counted: give back only our own init, MPI keeps its own
        lib.finalize()
    return Placement(rank, size, hosts, nspace, lib.path, lib.version(), "in-process",
                     time.monotonic() - start, full=full), lib, box["was"]


def _load(libs: "Sequence[str]", tried: "Sequence[str]") -> _Lib:
    errors = list(tried)
    for path in libs:
        try:
            return _Lib(path)
        except (OSError, AttributeError) as exc:  # not loadable / not a libpmix
            errors.append(f"{path} ({str(exc)[:200]})")
    raise PMIxUnavailable("no PMIx library of this launcher could be loaded; tried: "
                    + ("; ".join(errors) or "nothing to try")
                    + ". Fix: set MASTER_ADDR (and NODE_RANK), or DISTENV_PMIX=0.")


#: The line the query process prints its answer on: this prefix, then `marshal` in hex.
MARK = "distenv-pmix-answer "
#: What the query interpreter runs (mode "child" in a threaded process): `_answer`.
_CHILD = """\
import sys
sys.path.insert(0, sys.argv[1])
from distenv.discovery import pmix
pmix._answer(sys.argv[3:], sys.argv[2] == "full")
"""


def _answer(libs: "list[str]", full: bool) -> None:
    """The query process's side of mode "child": load one of `libs`, init, `_query`, finalize,
    then the answer (or the error) as one `MARK` line on descriptor 1."""
    import marshal

    try:
        lib = _load(libs, [])
        lib.init()
        try:
            rank, size, hosts, nspace = _query(lib, full)
        finally:
            lib.finalize()
        got: "dict[str, Any]" = {"rank": rank, "size": size, "hosts": hosts, "nspace": nspace,
                                 "lib": lib.path, "version": lib.version()}
    except DistEnvError as exc:
        got = {"error": str(exc), "unavailable": isinstance(exc, PMIxUnavailable)}
    line = memoryview((MARK + marshal.dumps(got).hex() + "\n").encode())
    while line:
        line = line[os.write(1, line):]


def single_threaded() -> bool:
    """Is this process one thread (``/proc/self/task``)? Then a fork of it is safe: no other
    thread can hold a lock (the allocator's, the interpreter's, a library's) the child would
    find taken forever."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _fork(found: Offer, full: bool, env: "dict[str, str]", out: int) -> int:
    """The query process as a fork of this one (single-threaded: `single_threaded`). It never
    returns into the caller's code: `_answer`, then ``os._exit`` (no atexit handler, no flush
    of this process's buffers runs twice)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(out, 1)  # the answer, and whatever the library prints
            os.dup2(out, 2)
            os.environ.update(env)
            _answer(found.libs, full)
            code = 0
        except BaseException:  # noqa: BLE001 - shown to the rank in its error, as a child's
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _interpreter(found: Offer, full: bool, env: "dict[str, str]", out: int) -> int:
    """The query process as a fresh interpreter (a threaded process must not fork)."""
    import sys

    if not sys.executable:
        raise PMIxUnavailable("no Python interpreter to run the PMIx query in (sys.executable "
                              "is empty). Fix: set MASTER_ADDR (and NODE_RANK).")
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # -I -S: an isolated, bare interpreter (no current directory, user site, site or PYTHON*
    # variable runs before the query: a json.py in the rank's working directory ran inside it
    # with -S -E -s); distenv is found through `src`. posix_spawn: no `subprocess` import.
    argv = [sys.executable, "-I", "-S", "-c", _CHILD, src, "full" if full else "master",
            *found.libs]
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
    try:
        return os.posix_spawn(sys.executable, argv, {**os.environ, **env}, file_actions=actions)
    except OSError as exc:  # no interpreter to start (embedded Python): nothing to ask with
        raise PMIxUnavailable(f"could not start the PMIx query process {sys.executable!r} "
                              f"({exc}). Fix: set MASTER_ADDR (and NODE_RANK).") from None


def _reap(pid: int, deadline: float, kill: bool) -> int:
    """The query process's exit status; killed first when `kill` or when it outlives
    `deadline` (its answer is in: it is only exiting). 0 when the kernel reaped it already
    (a program that ignores SIGCHLD: review found the query lost, and the relay skipped)."""
    try:
        while not kill and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            time.sleep(0.002)
        try:
            os.kill(pid, 9)  # SIGKILL on Linux; importing `signal` costs a rank 5 ms (its enums)
        except ProcessLookupError:
            pass
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0


def _in_child(found: Offer, timeout: float, full: bool = True) -> Placement:
    """The query in another process (mode "child"): a fork of this one when it is a single
    thread (no interpreter to start: about 30 ms of CPU less per rank, which is most of the
    query at 64 ranks on 2 cores), else a fresh interpreter; this process relays its
    connection to the server meanwhile (`distenv.discovery.pmix_relay`) and reads its answer
    within `timeout`."""
    import marshal

    from .pmix_relay import collect, open_relay

    start = time.monotonic()
    deadline = start + timeout
    # Through a relay that holds the server's end of the child's connection until the task
    # ends: a close that overtakes the server's "finalized" mark makes it count this rank as
    # lost, and MPI_Init here would hang (pmix_relay explains).
    relay = open_relay(os.environ)
    env = {} if relay is None else dict(relay.env)
    if hidden_dir(os.environ) and "PMIX_MCA_gds" not in os.environ:
        # The server keeps the job's data in its directory, which this container does not
        # show: the query gets it over the connection instead (measured: Open MPI 5 and srun
        # --mpi=pmix behind bwrap --tmpfs; "pmix.hname" is missing otherwise). The child's
        # setting alone: the rank's own MPI is left as it is.
        env["PMIX_MCA_gds"] = "hash"
    text, pid, status = None, None, 0
    how = "fork" if single_threaded() else "interpreter"
    read, write = os.pipe()
    try:
        try:
            pid = (_fork if how == "fork" else _interpreter)(found, full, env, write)
        finally:
            os.close(write)  # the query process's copy alone: its exit ends `collect`
        text = collect(read, deadline, relay)
    finally:  # whatever ended the query (a KeyboardInterrupt too), nothing is left running
        os.close(read)
        try:
            if pid is not None:
                status = _reap(pid, deadline + 1.0, kill=text is None)
        finally:  # the server's end is held (or dropped) whatever the reaping met
            if relay is not None:
                relay.stop(drop=text is None, task=found.chain, deadline=deadline)
    if text is None:
        raise PMIxError(f"the PMIx server did not answer within {timeout:g} s ({found.why}). "
                        "Fix: set DISTENV_TIMEOUT=<seconds> to wait longer, or set MASTER_ADDR.")
    output = text.decode(errors="replace")
    got = None
    for line in output.splitlines():
        if line.startswith(MARK):
            try:
                got = marshal.loads(bytes.fromhex(line[len(MARK):]))
            except (ValueError, EOFError, TypeError):
                got = None
    if not isinstance(got, dict):
        raise PMIxError(f"the PMIx query process failed (exit {os.waitstatus_to_exitcode(status)}): "
                        f"{output.strip()[-300:]!r}. Fix: set MASTER_ADDR (and NODE_RANK), or "
                        "DISTENV_PMIX=0.")
    if "error" in got:
        tried = "; ".join(found.tried)
        error = PMIxUnavailable if got.get("unavailable") else PMIxError
        raise error(str(got["error"]) + (f" (also looked at: {tried})" if tried else ""))
    return Placement(int(got["rank"]), int(got["size"]), [str(h) for h in got["hosts"]],
                     str(got["nspace"]), str(got["lib"]), str(got["version"]), "child",
                     time.monotonic() - start, relay is not None, full, how)


def hidden_dir(environ: "Mapping[str, str]") -> str:
    """The PMIx server's directory (``PMIX_SERVER_TMPDIR``) when this process cannot see it (a
    container that does not bind it), else ""."""
    where = environ.get("PMIX_SERVER_TMPDIR", "")
    return where if where.startswith("/") and not os.path.isdir(where) else ""


def query(environ: "Mapping[str, str] | None" = None, timeout: "float | None" = None,
          found: "Offer | None" = None, full: bool = True) -> Placement:
    """Every rank's host from the PMIx server -- or, not `full`, rank 0's alone (2 reads
    instead of 1 + N: enough for the master address) -- (not collective: each rank asks its
    own daemon, no rank waits for another). Runs once per process (once more if a full
    answer is wanted after a partial one); later calls return the same answer. Raises
    `PMIxError` when the service cannot be used or answers nonsense."""
    global _done, _kept
    environ = os.environ if environ is None else environ
    earlier = answered(_done)
    if earlier is not None and (earlier.full or not full):
        return earlier
    found, timeout = begin(environ, found, timeout, offer, PMIxError, "PMIx service",
                           " Fix: set MASTER_ADDR (and NODE_RANK).")
    if not found.libs:
        raise PMIxUnavailable("no PMIx library of this launcher was found; tried: "
                        + "; ".join(found.tried) + ". Fix: set MASTER_ADDR (and NODE_RANK).")
    if _kept is not None and earlier is not None:
        # the in-process client (Open MPI 4) is still open: read the rest from it
        start = time.monotonic()
        rank, size, hosts, nspace = _query(_kept, full)
        answer = Placement(rank, size, hosts, nspace, _kept.path, _kept.version(), "in-process",
                           time.monotonic() - start, full=full)
    # An MPI of this process initialized PMIx already: its client is ours too (reference
    # counted), so the query runs here and gives back only its own init.
    elif found.mode == "in-process" and hidden_dir(environ):
        # this process's own client (ORTE): a setting here would be its MPI's too
        from .containers import fix, where

        raise PMIxUnavailable(
            f"the PMIx server's directory PMIX_SERVER_TMPDIR={hidden_dir(environ)} is not "
            f"visible here{where(environ)}, and Open MPI 4's query runs in this process. "
            + fix(environ, "dir", dir=hidden_dir(environ)))
    elif found.mode == "in-process" or (bool(mapped(_read("/proc/self/maps")))
                                        and _load(found.libs, ()).initialized()):
        answer, lib, was = _in_process(found, timeout, full)
        if not was:
            import atexit

            _kept = lib
            atexit.register(_finalize_at_exit)
    else:
        answer = _in_child(found, timeout, full)
    if answer.rank != found.rank or answer.nspace != found.nspace:
        raise PMIxError(f"PMIx_Init gave rank {answer.rank} of {answer.nspace!r} but "
                        f"PMIX_RANK={found.rank}, PMIX_NAMESPACE={found.nspace!r}. Fix: unset "
                        "PMIx variables left over from another job.")
    _done = (os.getpid(), answer)
    import sys

    if "logging" in sys.modules:  # a debug line cannot be shown otherwise: no import for it
        from ..log import get_logger

        relayed = ", the connection held by the relay" if answer.relayed else ""
        how = f" ({answer.how})" if answer.how else ""
        get_logger(__name__).debug(
            f"PMIx ({answer.mode}{how}{relayed}, {answer.lib}, {answer.version}): {answer.size} "
            f"ranks, {'every host' if full else 'rank 0s host'} in {answer.seconds * 1000:.0f} ms")
    return answer


def used() -> bool:
    """True when this process has queried the service."""
    return _done is not None and _done[0] == os.getpid()


def handoff() -> "str | None":
    """Before this process execs a command (``distenv run``): the value of `HELD_VAR`
    (``<pid>;<nspace>;<host>*<count>,...``, the hosts of ranks 0.. in runs), or None when
    this process did not query. An in-process client (Open MPI 4) is finalized here: the
    exec'ed program cannot (its library state is gone with the exec), and ORTE reports a
    rank whose client never finalized as "exiting improperly"."""
    global _kept
    if not used():
        return None
    answer = _done[1]  # type: ignore[index]  # used() proved _done is set
    if _kept is not None:
        _kept.finalize()
        _kept = None
    if not answer.full:  # (distenv run asks for every host: `discovery.services.Pmix.ask`)
        return None
    return f"{os.getpid()};{answer.nspace};" + pack(encode_hosts(answer.hosts))


def inherited(environ: "Mapping[str, str] | None" = None) -> "Placement | None":
    """The answer this same process (same pid) got before it exec'ed, from `HELD_VAR`."""
    environ = os.environ if environ is None else environ
    parts = environ.get(HELD_VAR, "").split(";")
    if len(parts) != 3 or parts[0] != str(os.getpid()) or parts[1] != environ.get("PMIX_NAMESPACE"):
        return None
    text = unpack(parts[2])
    hosts = decode_hosts(text) if text is not None else None
    if hosts is None:
        return None
    rank = environ.get("PMIX_RANK", "")
    if not rank.isdigit() or int(rank) >= len(hosts):
        return None
    return Placement(int(rank), len(hosts), hosts, parts[1], f"{HELD_VAR} (before exec)", "",
                     "inherited", 0.0)


__all__ = ["query", "offer", "used", "handoff", "inherited", "candidates", "decode", "mapped",
           "Offer", "Placement", "PMIxError", "PMIxUnavailable", "HELD_VAR", "SERVERS"]
