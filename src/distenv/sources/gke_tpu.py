"""TPU slices on GKE (one slice, or several: multislice), as JAX reads them.

GKE's TPU webhook gives every pod of a multi-host TPU slice TPU_WORKER_ID (the pod's index in
the slice) and TPU_WORKER_HOSTNAMES (every worker's host, in worker order; newer GKE also
TPU_PROCESS_ADDRESSES, one entry per process, which JAX reads first); JobSet/xpk multislice
jobs add MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID. There is
no launcher: the pods are the processes. Cloud TPU VMs outside GKE carry none of these
variables (their worker list lives in the metadata server, which resolving never asks): there
distenv finds no launcher, and its zero-code paths leave the framework's own detection alone
(docs/platforms.md).

Proof of every field: JAX's own rule for this platform (``jax/_src/clusters/
cloud_tpu_cluster.py``, ``BaseTpuCluster`` and ``GkeTpuCluster``, jax 0.10), which every JAX
process of the job applies to the same variables:

===============  ===========================================================================
field            rule
===============  ===========================================================================
world_size       workers per slice x slices: len(TPU_PROCESS_ADDRESSES or
                 TPU_WORKER_HOSTNAMES) x MEGASCALE_NUM_SLICES
rank             TPU_WORKER_ID + MEGASCALE_SLICE_ID x workers per slice
slices           1 without MEGASCALE_COORDINATOR_ADDRESS: several slices talk through the
                 megascale coordinator, and on GKE only the environment can name it (there
                 is no TPU metadata there). With it but without MEGASCALE_NUM_SLICES or
                 MEGASCALE_SLICE_ID: unknown (JAX would ask a metadata server)
master_addr      MEGASCALE_COORDINATOR_ADDRESS ("set as the host with process id = 0",
                 JAX), else the slice's first worker ("the workers lists are sorted by
                 process ID", JAX); its port, if any, dropped
rank_hosts,      one slice: entry i of the worker list runs process i, so local rank and
local sizes,     size count equal hosts before and with this one, node rank and count
node rank/count  number the distinct hosts in order. Several slices: one process per
                 host when the slice's hosts are distinct (node = rank); else unknown
master_port      derived from the coordinator's (or first worker's) name, the same in every
                 process and different across jobs (JobSet names hosts after the job)
===============  ===========================================================================

Which adapters act: JAX's (and Keras 3 on JAX, through it). torch-xla's PJRT runtime,
Lightning's XLA environment and Accelerate's TPU state number their processes per TPU chip,
not per host, and set themselves up from the same platform: distenv's torch-facing zero-code
adapters leave them alone (``Frameworks.adapters``).
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from ..errors import DistEnvError
from ..core.reading import get_int, show
from . import Frameworks, Launch, Source

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


def _host(entry: str) -> str:
    """'host', 'host:port' or '[v6]:port' -> host."""
    entry = entry.strip()
    if entry.startswith("["):
        return entry[1:].split("]", 1)[0]
    return entry.split(":", 1)[0] if entry.count(":") == 1 else entry


def workers(env: "Env") -> "tuple[str, tuple[str, ...]]":
    """(variable, hosts of the slice's processes in process order), JAX's precedence."""
    for var in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
        raw = env.get(var)
        if raw is not None:
            hosts = tuple(_host(e) for e in raw.split(","))
            if not all(hosts):
                raise DistEnvError(f"{var}={show(raw)} has an empty entry. Fix: give one host per "
                                   "TPU worker, comma-separated, as GKE sets it.")
            return var, hosts
    raise AssertionError("a marker is present")  # pragma: no cover


class GkeTpu(Source):
    name = "gke_tpu"
    title = "GKE TPU (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES)"
    family = "tpu"
    launch = Launch(aliases=("gke_tpu", "tpu"))
    frameworks = Frameworks(
        covers=("jax:gketpu",),  # JAX reads these variables too (jax/_src/clusters)
        adapters=("jax",),
    )
    prefixes = ("TPU_WORKER_", "TPU_PROCESS_ADDRESSES", "MEGASCALE_")

    def detect(self, env: "Env") -> bool:
        return "TPU_WORKER_ID" in env

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        var, hosts = workers(env)
        per_slice = len(hosts)
        worker = get_int(env, "TPU_WORKER_ID", self.title)
        assert worker is not None  # detect() saw it
        if worker >= per_slice:
            raise DistEnvError(f"TPU_WORKER_ID={worker} but {var} lists {per_slice} worker(s). "
                               f"Fix: keep the platform's {var} and TPU_WORKER_ID together.")
        coordinator = env.get("MEGASCALE_COORDINATOR_ADDRESS", "").strip()
        slices = get_int(env, "MEGASCALE_NUM_SLICES", self.title, minimum=1)
        slice_id = get_int(env, "MEGASCALE_SLICE_ID", self.title)
        if not coordinator:
            if (slices or 1) > 1:
                raise DistEnvError(
                    f"MEGASCALE_NUM_SLICES={slices} without MEGASCALE_COORDINATOR_ADDRESS: several "
                    "slices need the megascale coordinator. Fix: keep the variables JobSet/xpk "
                    "set together, or unset MEGASCALE_NUM_SLICES.")
            slices, slice_id, how = 1, 0, "one slice (no MEGASCALE_COORDINATOR_ADDRESS)"
        elif slices is None or slice_id is None:
            r.notes.append(
                "MEGASCALE_COORDINATOR_ADDRESS is set but MEGASCALE_NUM_SLICES or "
                "MEGASCALE_SLICE_ID is not: the process count and index are unknown. Fix: set "
                "both as JobSet/xpk do for multislice jobs")
            self._master(r, coordinator, hosts, var)
            return
        else:
            how = f"MEGASCALE_NUM_SLICES={slices}, MEGASCALE_SLICE_ID={slice_id}"
        if slice_id >= slices:
            raise DistEnvError(f"MEGASCALE_SLICE_ID={slice_id} but MEGASCALE_NUM_SLICES={slices}. "
                               "Fix: keep the platform's MEGASCALE_* variables together.")
        rank = slice_id * per_slice + worker
        r.set("rank", rank, f"TPU_WORKER_ID={worker} + slice x workers per slice ({how}; "
                            "JAX's GKE TPU rule)")
        r.set("world_size", per_slice * slices,
              f"{per_slice} worker(s) in {var} x {slices} slice(s) (JAX's GKE TPU rule)")
        self._placement(r, hosts, worker, var, slices)
        self._master(r, coordinator, hosts, var)

    @staticmethod
    def _placement(r: "Reading", hosts: "tuple[str, ...]", worker: int, var: str, slices: int) -> None:
        me = hosts[worker]
        distinct = len(set(hosts)) == len(hosts)
        if slices == 1:
            order: "list[str]" = []
            for h in hosts:
                if h not in order:
                    order.append(h)
            why = f"{var} (entry i runs process i)"
            r.set("hosts", tuple(order), why)
            r.set("rank_hosts", hosts, why)
            r.set("local_rank", hosts[:worker].count(me), why)
            r.set("local_world_size", hosts.count(me), why)
            r.set("node_rank", order.index(me), why)
            r.set("num_nodes", len(order), why)
            counts = {hosts.count(h) for h in order}
            if len(counts) == 1:
                r.set("nproc_per_node", counts.pop(), why + ": as many on every host")
        elif distinct:
            why = f"{var}: one process per host in every slice"
            r.set("local_rank", 0, why)
            r.set("local_world_size", 1, why)
            r.set("nproc_per_node", 1, why)
            r.set("node_rank", r.get("rank"), why + " (node = process)")
            r.set("num_nodes", r.get("world_size"), why + " (node = process)")
        else:
            r.notes.append(f"{var} repeats a host: the processes of the other slices cannot be "
                           "placed, so local ranks and nodes are unknown")

    @staticmethod
    def _master(r: "Reading", coordinator: str, hosts: "tuple[str, ...]", var: str) -> None:
        if coordinator:
            addr = _host(coordinator)
            r.set("master_addr", addr, "MEGASCALE_COORDINATOR_ADDRESS (the host of process 0, "
                                       "JAX's GKE TPU rule)")
        else:
            addr = hosts[0]
            r.set("master_addr", addr, f"the first worker of {var} (process 0, JAX's GKE TPU rule)")
        r.addr_explicit = True  # a host name every worker resolves, never loopback
        r.port_key = "tpu:" + addr


SOURCE = GkeTpu()
