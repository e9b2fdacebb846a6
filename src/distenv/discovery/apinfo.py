"""Cray PALS's placement file, the *apinfo*: where every rank runs, without communicating.

Every launcher that speaks to Cray's PMI -- HPE's PBS ``mpiexec``, SLURM's
``--mpi=cray_shasta`` plugin, Flux's ``cray-pals`` shell plugin -- writes, on every node before
the ranks start, one binary file and names it in ``PALS_APINFO``. Cray PMI reads it instead of
asking a server. It holds the node of every rank and the host name of every node, so it proves
`master_addr`, `node_rank`, `num_nodes` and the local counts in every layout (arbitrary,
heterogeneous) -- and reading it touches no PMI, no socket, no other rank: a later
``MPI_Init`` is unaffected, and it is the same cost on every rank of any job size.

The layout (SLURM ``src/plugins/mpi/cray_shasta/apinfo.h``; flux-coral2
``src/common/libapinfo/apinfo1.h`` and ``apinfo5.h``): the C structs written as they are in
memory, so native byte order, ``int`` and ``size_t`` with the C compiler's alignment:

=====================  =====================================================================
header (version 1)     int version; size_t total_size; then for each section -- comm
                       profiles, commands, PEs, nodes, NICs -- size_t struct size, size_t
                       offset from the file's start, int count
header (version 5)     the same, then size_t status_offset, dist_size, dist_offset
PE record              int localidx (node-local index), int cmdidx (MPMD command),
                       int nodeidx (index into the node records); one per rank, in rank order
node record            int nid; char hostname[64] (NUL-terminated)
=====================  =====================================================================

Measured with SLURM 22.05's plugin on the two namespace nodes (`tests/fixtures/launchers/
cluster-srun-cray-*.json` keep the files): version 1, 332 bytes for 4 ranks on 2 nodes; node
records in the step's node-list order (``node1``, ``node2``); PE ``nodeidx`` right in every
layout, arbitrary and heterogeneous included (rank 0 on node2: nodeidx 1) -- also where
``PALS_NODEID`` is not (a heterogeneous step: PALS_NODEID=0 on node2).

Only versions 1 and 5 are read (their PE and node records and the header fields read here are
the same). Anything else -- another version, a file shorter than its header says, a section
outside the file, a node index out of range, an empty host name, more than `MAX_BYTES` -- is
`ApinfoUnreadable`, and discovery leaves the fields unknown with that note; nothing here
raises anything else. Checked against this process: the file must place `PALS_RANKID` (this
rank) on a node named as this host is (`os.uname()`, or its short name), else it describes
some other job (`ApinfoError`, a contradiction, with a Fix).

Never called by `resolve()` (it is I/O): `distenv.discovery` calls `read` where
communication is about to happen.
"""

from __future__ import annotations

import os
import struct

from ..errors import DistEnvError

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping

#: The header fields read, as the C struct lays them out (native alignment: '@').
_HEADER = struct.Struct("@i N N N i N N i N N i N N i N N i")
#: Versions whose layout this module reads.
VERSIONS = (1, 5)
#: A larger file is refused unread (a 100 000-rank job on 10 000 nodes takes about 2 MB).
MAX_BYTES = 64 << 20
_PE = struct.Struct("@iii")
_NODE_NAME = 64
_NODE_MIN = struct.calcsize("@i") + _NODE_NAME
#: The provenance of every field the apinfo fills.
WHY = "Cray PALS apinfo"


class ApinfoError(DistEnvError):
    """The apinfo file does not describe this job (a contradiction: an error)."""


class ApinfoUnreadable(ApinfoError):
    """The apinfo file cannot be read here (missing, unknown version, malformed): discovery
    leaves the fields unknown, with this as a note."""


class Layout:
    """What the file says: ``hosts[r]`` is rank r's host; ``local[r]`` its node-local index."""

    __slots__ = ("version", "hosts", "local", "nodes")

    def __init__(self, version: int, hosts: "list[str]", local: "list[int]", nodes: "list[str]") -> None:
        self.version, self.hosts, self.local, self.nodes = version, hosts, local, nodes

    def __repr__(self) -> str:
        return f"Layout(version={self.version}, hosts={self.hosts!r})"


def parse(data: bytes) -> Layout:
    """The layout in `data` (a whole apinfo file); `ApinfoError` saying what is wrong."""
    fix = " Fix: set MASTER_ADDR (and NODE_RANK) for every rank, or DISTENV_APINFO=0."
    if len(data) > MAX_BYTES:
        raise ApinfoUnreadable(f"the apinfo file is {len(data)} bytes, more than distenv reads "
                          f"({MAX_BYTES}).{fix}")
    if len(data) < _HEADER.size:
        raise ApinfoUnreadable(f"the apinfo file has {len(data)} bytes, less than its header "
                          f"({_HEADER.size}).{fix}")
    (version, total, _cps, _cpo, _ncp, _cs, _co, _nc, pe_size, pe_off, npes,
     node_size, node_off, nnodes, _ns, _no, _nn) = _HEADER.unpack_from(data)
    if version not in VERSIONS:
        raise ApinfoUnreadable(f"the apinfo file is version {version}; distenv reads versions "
                          f"{', '.join(map(str, VERSIONS))}.{fix}")
    if total != len(data):
        raise ApinfoUnreadable(f"the apinfo header says {total} bytes but the file has {len(data)} "
                          f"(cut short, or still being written).{fix}")
    for what, size, off, count, least in (("PE", pe_size, pe_off, npes, _PE.size),
                                          ("node", node_size, node_off, nnodes, _NODE_MIN)):
        if count < 1 or size < least or off < _HEADER.size or off + size * count > len(data):
            raise ApinfoUnreadable(f"the apinfo's {what} section ({count} of {size} bytes at "
                              f"{off}) does not fit a file of {len(data)} bytes.{fix}")
    nodes: "list[str]" = []
    for i in range(nnodes):
        start = node_off + i * node_size + struct.calcsize("@i")
        raw = data[start:start + _NODE_NAME].split(b"\0", 1)
        name = raw[0].decode("ascii", "replace")
        if not name or len(raw) < 2 or any(c.isspace() or not c.isprintable() for c in name):
            raise ApinfoUnreadable(f"node {i} of the apinfo file has no usable host name "
                              f"({raw[0][:64]!r}).{fix}")
        nodes.append(name)
    hosts: "list[str]" = []
    local: "list[int]" = []
    for r in range(npes):
        localidx, _cmd, nodeidx = _PE.unpack_from(data, pe_off + r * pe_size)
        if not 0 <= nodeidx < nnodes or not 0 <= localidx < npes:
            raise ApinfoUnreadable(f"rank {r} of the apinfo file is on node {nodeidx} (local index "
                              f"{localidx}) of {nnodes}.{fix}")
        hosts.append(nodes[nodeidx])
        local.append(localidx)
    return Layout(version, hosts, local, nodes)


def offer(environ: "Mapping[str, str]") -> "tuple[str | None, str]":
    """(the file's path, "") or (None, why not): no file named, or turned off."""
    from ..knobs import APINFO

    if not APINFO.value(environ):
        return None, f"{APINFO}=0"
    path = environ.get("PALS_APINFO", "").strip()
    if not path:
        return None, "no Cray PALS apinfo file (PALS_APINFO is not set)"
    return path, ""


def read(path: str, rank: "int | None" = None, host: "str | None" = None) -> Layout:
    """The layout in the file at `path`, checked to place `rank` (this process's) on a node
    named as `host` (default: this host). `ApinfoError` otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ApinfoUnreadable(f"cannot read the apinfo file PALS_APINFO={path} "
                          f"({exc.strerror or exc}). Fix: run the rank as the job's user on its "
                          "own node, or set MASTER_ADDR (and NODE_RANK).") from None
    layout = parse(data)
    if rank is not None:
        if rank >= len(layout.hosts):
            raise ApinfoError(f"the apinfo file lists {len(layout.hosts)} ranks but this is rank "
                              f"{rank}: it is not this job's. Fix: do not copy PALS_* variables "
                              "between jobs.")
        host = hostname() if host is None else host
        placed = layout.hosts[rank]
        if not _same_host(placed, host):
            raise ApinfoError(f"the apinfo file places rank {rank} on {placed}, but it runs on "
                              f"{host}: it is not this job's. Fix: do not copy PALS_* variables "
                              "between jobs.")
    return layout


def hostname() -> str:
    """This host's name: os.uname()'s, which is what socket.gethostname() returns on Linux,
    without importing socket (a rank that reads the apinfo may need no socket at all)."""
    return os.uname().nodename


def _same_host(a: str, b: str) -> bool:
    """One host under two spellings: equal, or equal short names (``nid001`` and
    ``nid001.cluster``)."""
    return a == b or a.split(".", 1)[0] == b.split(".", 1)[0]


__all__ = ["parse", "read", "offer", "Layout", "ApinfoError", "ApinfoUnreadable", "VERSIONS", "MAX_BYTES", "WHY"]
