"""`distenv doctor [--json] [--probe]`: is this launch set up right, and what to change.

Reads the environment and a few files (``/sys/class/infiniband``, ``/proc/net/dev``,
``/proc/net/route``, ``/etc/hosts``; paths are module attributes so tests can point them
elsewhere) and reports findings, each with a level (error, warning, info, ok), a topic
(launch, map, gpus, cpu, network, probe) and the fix:

* launch: the launcher and where each field came from, the resolver's notes, what a
  distributed job would miss (rank 0's address across nodes, a port shared by all jobs);
* map (rank 0's report): one row per node, as `distenv show --map` prints it
  (`distenv.nodemap`); where the environment does not place the ranks, every rank first asks
  the launcher's service (PMIx, Hydra's PMI-1: collective, so every rank runs the doctor); a
  contradiction is an error;
* gpus: visible GPUs against the processes on this node;
* cpu: threads x local processes against the cores this process may use (OMP_NUM_THREADS,
  CPU affinity set by the launcher);
* network: RDMA devices against NCCL_IB_DISABLE / NCCL_IB_HCA / UCX_*, NCCL_SOCKET_IFNAME and
  GLOO_SOCKET_IFNAME against the interfaces here, the interface that reaches rank 0, this
  host's name in /etc/hosts (gloo binds to what it resolves to);
* probe (only with ``--probe``, the only part that opens a socket): rank 0's address and
  port, with a short timeout.

It also reports versions (`versions`): distenv, Python, the frameworks installed for this
interpreter (from their metadata: nothing is imported) and the launcher's own, from its
variables (``OMPI_VERSION``) or its ``--version`` (the one process the doctor starts, under
a short timeout: preferably the launcher binary that started this process, found among its
ancestors in /proc, else the command on PATH, labelled so).

Values of secret-looking variables never appear (`distenv.redact`); long values are
shortened as `distenv show` does (`distenv.display.shorten`). Exit status: 2 when the
environment cannot be resolved (as every command), 1 when a finding is an error, else 0.
"""

from __future__ import annotations

import os

from .description import DEFAULT, PER_NODE, kind_of
from .errors import DistEnvError, split_fix
from .redact import redact_environ, redact_text

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Iterator, Mapping
    from typing import Any

    from .description import DistEnv

# Paths, as module attributes so tests can point them at directories they control.
INFINIBAND_DIR = "/sys/class/infiniband"
NET_DEV = "/proc/net/dev"  # per network namespace (unlike /sys/class/net under nsenter)
NET_ROUTE = "/proc/net/route"
HOSTS_FILE = "/etc/hosts"

LEVELS = ("error", "warning", "info", "ok")

def _launcher_prefixes() -> "tuple[str, ...]":
    from .sources import prefixes  # every source names the variables it reads (`prefixes`)

    return prefixes()


#: Variables shown in the report (values redacted where secret): every launcher's and
#: platform's own (from the sources), then the communication and threading libraries'.
SHOWN_PREFIXES = _launcher_prefixes() + (
    "AWS_", "KUBERNETES_SERVICE",
    "NCCL_", "GLOO_", "UCX_", "FI_", "OMP_", "MKL_NUM", "OPENBLAS_NUM", "CUDA_VISIBLE",
    "HIP_VISIBLE", "ROCR_VISIBLE", "DISTENV_", "TORCH_DISTRIBUTED_",
)
SHOWN_NAMES = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK", "CROSS_SIZE",
    "TF_CONFIG", "CLUSTER_SPEC", "CLOUD_ML_JOB_ID",
})


class Report:
    def __init__(self) -> None:
        self.findings: "list[dict[str, Any]]" = []  # level, topic, message, fix: JSON

    def add(self, level: str, topic: str, message: str, fix: "str | None" = None) -> None:
        self.findings.append({"level": level, "topic": topic, "message": redact_text(message),
                              "fix": redact_text(fix) if fix else None})


# -- small readers (no sockets) -----------------------------------------------------------
def _read(path: str) -> "str | None":
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _read_bytes(path: str, size: int) -> "bytes | None":
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def rdma_devices(root: "str | None" = None) -> "list[dict[str, Any]]":
    """RDMA devices (InfiniBand, RoCE, iWARP) and their ports' state and link layer."""
    root = INFINIBAND_DIR if root is None else root
    try:
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except OSError:
        return []
    out = []
    for name in names:
        ports = []
        try:
            port_ids = sorted(os.listdir(os.path.join(root, name, "ports")), key=lambda p: (len(p), p))
        except OSError:
            port_ids = []
        for port in port_ids:
            base = os.path.join(root, name, "ports", port)
            state = (_read(os.path.join(base, "state")) or "").strip()  # "4: ACTIVE"
            layer = (_read(os.path.join(base, "link_layer")) or "").strip()  # InfiniBand/Ethernet
            ports.append({"port": port, "state": state.split(":", 1)[-1].strip() or None,
                          "link_layer": layer or None})
        out.append({"device": name, "ports": ports})
    return out


def _active(dev: "Mapping[str, Any]") -> bool:
    # No port information: count the device as usable (we cannot tell otherwise).
    return not dev["ports"] or any((p["state"] or "ACTIVE") == "ACTIVE" for p in dev["ports"])


def interfaces(path: "str | None" = None) -> "list[str]":
    """Network interfaces of this process's network namespace (/proc/net/dev)."""
    text = _read(NET_DEV if path is None else path)
    if not text:
        return []
    names = []
    for line in text.splitlines()[2:]:
        if ":" in line:
            names.append(line.split(":", 1)[0].strip())
    return names


def _ipv4(text: str) -> "int | None":
    parts = text.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        return None
    return int.from_bytes(bytes(int(p) for p in parts), "big")


def route_interface(addr: str, path: "str | None" = None) -> "tuple[str, str] | None":
    """(interface, route) by which this host reaches an IPv4 address (longest prefix)."""
    target = _ipv4(addr)
    text = _read(NET_ROUTE if path is None else path)
    if target is None or not text:
        return None
    best = None
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        try:
            dest = int.from_bytes(bytes.fromhex(cols[1])[::-1], "big")
            mask = int.from_bytes(bytes.fromhex(cols[7])[::-1], "big")
        except ValueError:
            continue
        if target & mask == dest & mask:
            length = bin(mask).count("1")
            if best is None or length > best[0]:
                shown = "default" if mask == 0 else \
                    ".".join(str(b) for b in dest.to_bytes(4, "big")) + f"/{length}"
                best = (length, cols[0], shown)
    return None if best is None else (best[1], best[2])


def hosts_lookup(name: str, path: "str | None" = None) -> "list[str]":
    """Addresses /etc/hosts gives a name (no DNS)."""
    text = _read(HOSTS_FILE if path is None else path) or ""
    found = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and name in words[1:]:
            found.append(words[0])
    return found


def _ifname_spec(spec: str) -> "tuple[bool, bool, list[str]]":
    """NCCL_SOCKET_IFNAME syntax: '^' excludes, '=' asks exact names, else prefixes."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    return exclude, exact, [x.strip() for x in body.split(",") if x.strip()]


def _ifname_matches(spec: str, names: "Iterable[str]", force_exact: bool = False) -> "list[str]":
    exclude, exact, items = _ifname_spec(spec)
    exact = exact or force_exact

    def hit(name: str) -> bool:
        return any(name == i if exact else name.startswith(i) for i in items)

    return [n for n in names if (not hit(n)) == exclude]


def _int(value: object) -> "int | None":
    try:
        return int(str(value).split(",")[0].strip())
    except (TypeError, ValueError):
        return None


def _affinity() -> "int | None":
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


# -- the checks ---------------------------------------------------------------------------
def _check_launch(rep: Report, env: DistEnv, environ: "Mapping[str, str]") -> None:
    if env.launcher == "none" and env.launch != PER_NODE:
        rep.add("info", "launch", "not launched distributed: a single process "
                f"({env.provenance.get('launcher')}). distenv's zero-code paths (DISTENV_AUTO, "
                "the patches) change nothing here: a framework that detects its platform itself "
                "(JAX on Cloud TPU/GCE or Kubernetes, torch-xla, Lightning's XLA environment, "
                "Accelerate's TPU state) keeps its own answer.")
    else:
        where = f" on {env.platform}" if env.platform else ""
        rep.add("ok", "launch", f"{env.launcher}{where}, {env.launch} launch: "
                f"{env.provenance.get('launcher')}.")
    if environ.get("DISTENV_LAUNCHER", "").strip():
        rep.add("info", "launch", f"DISTENV_LAUNCHER={environ['DISTENV_LAUNCHER']} forces the launcher.")
    from .sources import find

    entry = find(env.launcher) if env.launcher else None
    acting = entry.load().adapters if entry is not None else None
    if acting is not None:
        rep.add("info", "launch", f"on this launch only distenv's {', '.join(acting)} adapter(s) act; "
                "the other frameworks set themselves up (a TPU pod: torch-xla numbers its "
                "processes per chip, so no torch variables are exported).")
    for note in env.notes:
        rep.add("warning", "launch", *split_fix(note))
    if env.launch == PER_NODE:
        rep.add("info", "launch",
                f"per-node launch: node {env.node_rank} of {env.num_nodes}, {env.nproc_per_node} "
                f"worker(s) per node are yet to be started ({env.provenance.get('nproc_per_node')}).",
                "start the script with `distenv run -- python script.py ...` (torch's launcher "
                "starts the workers), or have the launcher start one process per worker.")
    if not env.is_distributed:
        return
    if env.world_size is None:
        rep.add("warning", "launch", f"the world size is unknown ({env.provenance.get('world_size', 'not revealed')}).",
                "run with a launcher that gives it (MPICH: drop -pmi-port) or set WORLD_SIZE.")
    multi = env.num_nodes is None or env.num_nodes > 1
    if env.master_addr is None:
        from .export import missing_message

        rep.add("error", "launch", f"rank 0's address is unknown: {env.launcher} does not reveal it "
                "across nodes.", split_fix(missing_message(env, ["MASTER_ADDR"]))[1])
    elif multi and env.num_nodes is not None and env.master_addr.startswith("127."):
        rep.add("error", "launch", f"master_addr={env.master_addr} is a loopback address but the "
                f"job spans {env.num_nodes} nodes ({env.provenance.get('master_addr')}).",
                "set MASTER_ADDR to rank 0's host name or address, reachable from every node.")
    if kind_of(env.provenance.get("master_port")) == DEFAULT:
        rep.add("warning", "launch", f"master_port={env.master_port} is torch's default: no job id "
                "to derive a port from, so two such jobs on one machine collide.",
                "export MASTER_PORT=<a free port> per job (the same on every rank).")
    if env.master_addr is not None:
        try:
            env.export({})
        except DistEnvError as exc:
            problem, fix = split_fix(str(exc))
            rep.add("error", "launch", f"the torch variables cannot be exported: {problem}",
                    fix or "set the missing variables in the job script (distenv show --explain "
                    "shows what is known)")


def _check_map(rep: Report, out: "dict[str, Any]", env: DistEnv, discover: bool) -> None:
    """out["map"]: the placement map (`distenv.nodemap`), in rank 0's report only. With
    `discover` every rank first completes the placement from the launcher's service (PMI-1 is
    collective: no rank may skip it)."""
    from . import nodemap

    try:
        placed = nodemap.collect(env) if discover else env
        if not nodemap.prints(placed):
            return
        found = nodemap.build(placed).to_dict()
    except DistEnvError as exc:
        problem, fix = split_fix(redact_text(" ".join(str(exc).split())))
        rep.add("error", "map", problem, fix or "distenv show --explain shows where each field "
                "came from")
        return
    for node in found["nodes"]:
        if node["host"] is not None:
            node["host"] = redact_text(node["host"])
    for key in ("master_addr", "placement"):
        if found[key] is not None:
            found[key] = redact_text(found[key])
    found["unknown"] = [redact_text(u) for u in found["unknown"]]
    out["map"] = found
    if env.master_addr is None and placed.master_addr is not None:
        rep.add("info", "map", f"the launcher's service names rank 0's host, {placed.master_addr} "
                f"({placed.provenance.get('master_addr')}): distenv's adapters, `distenv run` and "
                "DISTENV_AUTO=1 ask it and find the master there.",
                f"a framework set up without distenv needs MASTER_ADDR={placed.master_addr} "
                "(the launch finding above)")


def _check_gpus(rep: Report, env: DistEnv, environ: "Mapping[str, str]") -> "dict[str, Any]":
    from .gpus import visible_gpus

    count, why = visible_gpus(environ)
    local = env.nproc_per_node if env.launch == PER_NODE else env.local_world_size
    info = {"visible": count, "why": why, "local_processes": local}
    if count == 0:
        rep.add("info", "gpus", f"{why}: workers run on CPU; torch uses gloo.")
        return info
    if local is None:
        rep.add("info", "gpus", f"{count} GPU(s) visible ({why}); the number of processes on "
                "this node is unknown.")
        return info
    narrowed = any(var in environ for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                                 "ROCR_VISIBLE_DEVICES"))
    per_process = env.launch != PER_NODE
    if count == local or (per_process and count == 1 and narrowed and local > 1):
        if count == local:
            rep.add("ok", "gpus", f"{count} GPU(s) visible ({why}) for {local} process(es) on this node.")
        else:
            rep.add("info", "gpus", f"this process sees 1 GPU ({why}) and {local} processes run on "
                    "this node: right if the scheduler gives each task its own GPU; if they all "
                    "see the same one, NCCL fails on the duplicate GPU.")
    elif count < local:
        rep.add("error", "gpus", f"{local} process(es) on this node but only {count} GPU(s) visible "
                f"({why}): processes would share a GPU (NCCL refuses duplicate GPUs).",
                f"start {count} process(es) per node (--nproc-per-node {count}), or use gloo on CPU.")
    else:
        rep.add("warning", "gpus", f"{count} GPU(s) visible ({why}) but {local} process(es) on this "
                f"node: {count - local} GPU(s) idle.",
                f"start {count} process(es) per node (distenv run --nproc-per-node {count}, "
                "srun --ntasks-per-node, mpirun -np), or narrow CUDA_VISIBLE_DEVICES.")
    return info


def _check_cpu(rep: Report, env: "DistEnv | None", environ: "Mapping[str, str]") -> "dict[str, Any]":
    total = os.cpu_count() or 1
    bound = _affinity() or total
    per_node = env is not None and env.launch == PER_NODE
    local = ((env.nproc_per_node if per_node else env.local_world_size) if env else None) or 1
    omp_raw = environ.get("OMP_NUM_THREADS")
    omp = _int(omp_raw) if omp_raw is not None else None
    info = {"cores": total, "cores_usable": bound, "local_processes": local,
            "OMP_NUM_THREADS": omp_raw}
    share = max(1, total // local)
    if omp_raw is not None and (omp is None or omp < 1):
        rep.add("warning", "cpu", f"OMP_NUM_THREADS={omp_raw!r} is not a positive number.",
                f"export OMP_NUM_THREADS={share}")
        return info
    if per_node and bound < local and bound < total:
        rep.add("warning", "cpu", f"this process is bound to {bound} of {total} cores and its "
                f"{local} workers inherit the binding: they share {bound} core(s).",
                "let the launcher bind nothing (mpirun --bind-to none, or --map-by "
                "ppr:1:node:pe=<cores>; srun --cpus-per-task=<cores>).")
    threads = omp if omp is not None else bound
    if bound < total:
        # Bound by the launcher: each process has its own cores (as far as we can tell).
        if threads > bound:
            rep.add("warning", "cpu", f"OMP_NUM_THREADS={omp} threads but this process may use "
                    f"{bound} core(s) (CPU affinity, set by the launcher): threads compete.",
                    f"export OMP_NUM_THREADS={bound}")
        else:
            rep.add("ok", "cpu", f"{threads} thread(s) on {bound} core(s) bound to this process.")
        return info
    demand = threads * local
    if demand > total:
        why = (f"OMP_NUM_THREADS={omp}" if omp is not None
               else "OMP_NUM_THREADS unset: torch and OpenMP take every core in each process")
        rep.add("warning", "cpu", f"{local} process(es) x {threads} thread(s) = {demand} threads on "
                f"{total} core(s) ({why}): oversubscribed, training slows down.",
                f"export OMP_NUM_THREADS={share} (cores / local processes){_passed_on(env, 'OMP_NUM_THREADS', share)}")
    else:
        rep.add("ok", "cpu", f"{local} process(es) x {threads} thread(s) on {total} core(s).")
    return info


def _passed_on(env: "DistEnv | None", name: str, value: object) -> str:
    """How a variable exported in the job script reaches every rank, for this launcher."""
    from .sources import find

    entry = find(env.launcher) if env is not None and env.launcher else None
    passed = entry.load().passes_on(name, value) if entry is not None else ""
    return f", and pass it to every rank ({passed})" if passed else ""


def _truthy(value: object) -> bool:
    return str(value).strip().lower() not in ("", "0", "false", "no", "off")


def _check_network(rep: Report, env: "DistEnv | None", environ: "Mapping[str, str]"
                   ) -> "dict[str, Any]":
    devices = rdma_devices()
    active = [d for d in devices if _active(d)]
    ifaces = interfaces()
    multi = env is not None and env.is_distributed and (env.num_nodes is None or env.num_nodes > 1)

    def describe(d: "Mapping[str, Any]") -> str:
        ports = ", ".join(f"port {p['port']} {p['state'] or '?'}"
                          + (f" {p['link_layer']}" if p["link_layer"] else "") for p in d["ports"])
        return f"{d['device']} ({ports})" if ports else d["device"]

    info = {"rdma_devices": devices, "interfaces": ifaces, "route_to_master": None}
    if devices:
        rep.add("info", "network", "RDMA device(s): " + "; ".join(describe(d) for d in devices) + ".")
    elif multi:
        rep.add("info", "network", f"no RDMA device ({INFINIBAND_DIR} is empty or absent): "
                "collectives across nodes go over TCP sockets.")

    ib_disable = environ.get("NCCL_IB_DISABLE")
    if ib_disable is not None and _truthy(ib_disable) and active:
        rep.add("warning", "network", f"NCCL_IB_DISABLE={ib_disable} but RDMA device(s) are present "
                f"and active: {', '.join(describe(d) for d in active)}. NCCL will use TCP sockets "
                "instead of InfiniBand/RoCE: collectives across nodes much slower.",
                "unset NCCL_IB_DISABLE (keep it only where the RDMA fabric is known broken).")
    hca = environ.get("NCCL_IB_HCA")
    if hca and devices:
        exclude, exact, items = _ifname_spec(hca)
        names = [d["device"] for d in devices]
        wanted = [i.split(":", 1)[0] for i in items]
        hits = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
        if not exclude and not hits:
            rep.add("warning", "network", f"NCCL_IB_HCA={hca} matches no RDMA device here "
                    f"(present: {', '.join(names)}): NCCL falls back to sockets.",
                    f"export NCCL_IB_HCA={names[0]} (or unset it)")
    elif hca and not devices:
        rep.add("info", "network", f"NCCL_IB_HCA={hca} is set but there is no RDMA device here.")

    for var, exact in (("NCCL_SOCKET_IFNAME", False), ("GLOO_SOCKET_IFNAME", True)):
        spec = environ.get(var)
        if spec is None or not ifaces:
            continue
        chosen = _ifname_matches(spec, ifaces, force_exact=exact)
        if not chosen:
            rep.add("error", "network", f"{var}={spec} matches no network interface here "
                    f"(interfaces: {', '.join(ifaces)}).",
                    f"set {var} to one of them (the one that reaches rank 0), or unset it.")
        elif multi and all(c == "lo" for c in chosen):
            rep.add("error", "network", f"{var}={spec} selects only the loopback interface, but the "
                    "job spans several nodes.", f"set {var} to the interface that reaches rank 0.")
        else:
            rep.add("ok", "network", f"{var}={spec} selects {', '.join(chosen)}.")

    master = env.master_addr if env is not None else None
    if master and multi:
        addr = master if _ipv4(master) is not None else next(iter(hosts_lookup(master)), None)
        route = route_interface(addr) if addr else None
        if route:
            info["route_to_master"] = {"address": addr, "interface": route[0], "route": route[1]}
            iface = route[0]
            missing = [v for v in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if v not in environ]
            others = [i for i in ifaces if i not in ("lo", iface)]
            text = f"rank 0 ({master}{' = ' + addr if addr != master else ''}) is reached through {iface} (route {route[1]})."  # type: ignore[operator]  # addr is set: route came from it
            if missing and others:
                rep.add("info", "network", text + f" Other interfaces here: {', '.join(others)}.",
                        " ".join(f"export {v}={iface}" for v in missing)
                        + " so that collectives use it.")
            else:
                rep.add("ok", "network", text)
        elif addr is None:
            rep.add("info", "network", f"rank 0's host {master} is not in {HOSTS_FILE}: DNS "
                    "resolves it (check with --probe).")

    # gloo binds to the address this host's name resolves to.
    host = os.uname().nodename
    mapped = hosts_lookup(host)
    if multi and "GLOO_SOCKET_IFNAME" not in environ and mapped and all(a.startswith("127.") or a == "::1" for a in mapped):
        rep.add("warning", "network", f"this host's name {host} maps to {', '.join(mapped)} in "
                f"{HOSTS_FILE}: gloo binds to that loopback address and other nodes cannot reach it.",
                "export GLOO_SOCKET_IFNAME=<interface that reaches rank 0> (or fix /etc/hosts).")

    # UCX (Open MPI's pml ucx, UCC, Horovod): devices and transports.
    ucx_dev = environ.get("UCX_NET_DEVICES")
    if ucx_dev and ucx_dev.strip().lower() != "all":
        known = {d["device"] for d in devices} | set(ifaces)
        bad = [x for x in (s.strip() for s in ucx_dev.split(",")) if x and x.split(":", 1)[0] not in known]
        if bad:
            rep.add("warning", "network", f"UCX_NET_DEVICES={ucx_dev} names device(s) not present "
                    f"here: {', '.join(bad)} (present: {', '.join(sorted(known)) or 'none'}).",
                    "set UCX_NET_DEVICES to present devices (mlx5_0:1, eth0) or unset it.")
    ucx_tls = environ.get("UCX_TLS")
    if ucx_tls:
        rdma_tls = ("rc", "ud", "dc", "ib", "rc_x", "ud_x", "dc_x", "rc_v", "ud_v", "rc_mlx5",
                    "dc_mlx5", "ud_mlx5", "all")
        items = [t.strip().lower() for t in ucx_tls.lstrip("^").split(",")]
        excluded = ucx_tls.startswith("^")
        uses_rdma = any(t in rdma_tls for t in items) != excluded
        if active and not uses_rdma:
            rep.add("warning", "network", f"UCX_TLS={ucx_tls} keeps UCX off the RDMA device(s) "
                    f"{', '.join(d['device'] for d in active)}.",
                    "unset UCX_TLS, or include rc/ud/dc (e.g. UCX_TLS=rc,sm,self).")
    for var in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        if _truthy(environ.get(var, "")):
            rep.add("info", "network", f"{var}={environ[var]}: a fast intra-node transport is off.",
                    f"unset {var} unless it works around a known fault.")
    if multi and "NCCL_DEBUG" not in environ and devices:
        rep.add("info", "network", "to see which transport NCCL chose, run once with NCCL_DEBUG=INFO.")
    return info


#: What a site-packages directory holds when DISTENV_AUTO=1 works for its interpreter.
AUTO_PTH = "distenv_auto.pth"


def site_dirs(python: str) -> "list[str]":
    """The directories where `python` reads .pth files at start, found from its path alone
    (nothing is run): a virtualenv's (pyvenv.cfg beside bin/) lib/python*/site-packages;
    otherwise its prefix's site- and dist-packages, Debian's /usr/local one and the user's."""
    import glob

    real = os.path.realpath(python)
    prefixes = []
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
        prefixes.append(venv)
    else:
        prefix = os.path.dirname(os.path.dirname(real))
        prefixes += [prefix, os.path.join(prefix, "local")]
        prefixes.append(os.path.join(os.path.expanduser("~"), ".local"))
    found: "list[str]" = []
    for prefix in prefixes:
        for pattern in ("lib/python*/site-packages", "lib/python*/dist-packages", "lib/python3/dist-packages"):
            for d in sorted(glob.glob(os.path.join(prefix, pattern))):
                if os.path.isdir(d) and d not in found:
                    found.append(d)
    return found


def _check_auto(rep: Report, environ: "Mapping[str, str]") -> "dict[str, Any] | None":
    """DISTENV_AUTO=1 acts only in an interpreter whose site-packages hold distenv_auto.pth;
    any other ignores it without a word. Is `python` (and `python3`) on PATH one of those?"""
    import shutil
    import sys

    flag = environ.get("DISTENV_AUTO", "").strip().lower()
    if flag in ("", "0", "false", "no", "off") or not environ.get("PATH"):
        return None  # off, or no PATH to tell which `python` a launch runs
    out: "dict[str, Any]" = {}
    mine = os.path.dirname(os.path.abspath(sys.executable))
    for name in ("python", "python3"):
        python = shutil.which(name, path=environ["PATH"])
        if python is None or any(python == seen["path"] for seen in out.values()):
            continue
        head = (_read_bytes(os.path.realpath(python), 4) or b"")
        if head != b"\x7fELF":  # a wrapper (pyenv's shims, a script): which Python it runs is its business
            out[name] = {"path": python, "distenv_auto": None, "site_dirs": []}
            rep.add("info", "auto", f"DISTENV_AUTO={environ['DISTENV_AUTO']}: `{name}` on PATH ({python}) "
                    "is a wrapper, not an interpreter: distenv cannot tell whether the Python it runs "
                    f"has distenv (an interpreter without it ignores DISTENV_AUTO silently).",
                    f"check with `{name} -c 'import distenv'`, or start scripts through "
                    f"`distenv run -- {name} script.py`.")
            continue
        dirs = site_dirs(python)
        has = [d for d in dirs if os.path.exists(os.path.join(d, AUTO_PTH))]
        out[name] = {"path": python, "distenv_auto": bool(has), "site_dirs": dirs}
        if has:
            rep.add("ok", "auto", f"DISTENV_AUTO={environ['DISTENV_AUTO']}: `{name}` on PATH ({python}) "
                    f"starts distenv ({AUTO_PTH} in {has[0]}).")
            continue
        here = " (this interpreter's directory)" if os.path.dirname(os.path.abspath(python)) == mine else ""
        rep.add("warning", "auto",
                f"DISTENV_AUTO={environ['DISTENV_AUTO']} is set, but `{name}` on PATH ({python}{here}) has "
                f"no {AUTO_PTH} in {', '.join(dirs) or 'any site-packages found'}: a script it runs "
                "starts without distenv, and says nothing (torch then asks for RANK).",
                f"install distenv into that environment ({python} -m pip install <distenv's "
                f"source or wheel>), start the script with {sys.executable}, or through `distenv run "
                f"-- {name} script.py`, which exports the torch variables before the script starts.")
    return out


def _probe(rep: Report, env: DistEnv, timeout: float) -> "dict[str, Any]":
    import errno
    import socket
    import threading

    out = {"address": env.master_addr, "port": env.master_port, "result": None}
    if not env.is_distributed:
        out["result"] = "skipped: not distributed"
        return out
    if env.master_addr is None or env.master_port is None:
        rep.add("info", "probe", "not probed: rank 0's address or port is unknown.")
        out["result"] = "skipped: unknown address"
        return out
    host, port = env.master_addr, env.master_port
    box: "dict[str, Any]" = {}

    def lookup() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            box["error"] = exc

    t = threading.Thread(target=lookup, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive() or "error" in box:
        why = f"no answer within {timeout:g} s" if t.is_alive() else str(box["error"])
        rep.add("error", "probe", f"rank 0's host {host} does not resolve ({why}).",
                "use an address, or a name every node resolves (/etc/hosts, DNS); set MASTER_ADDR.")
        out["result"] = "unresolved"
        return out
    family, kind, proto, _, sockaddr = box["infos"][0]
    out["resolved"] = sockaddr[0]
    s = socket.socket(family, kind, proto)
    s.settimeout(timeout)
    try:
        s.connect(sockaddr)
        out["result"] = "listening"
        rep.add("info", "probe", f"{host}:{port} ({sockaddr[0]}) accepts connections: rank 0's "
                "store if the job is running; otherwise another process holds the port.",
                "if the job is not running yet, choose another MASTER_PORT.")
    except ConnectionRefusedError:
        out["result"] = "refused"
        rep.add("ok", "probe", f"{host}:{port} ({sockaddr[0]}) is reachable and nothing listens "
                "there yet (normal before rank 0 starts).")
    except socket.timeout:
        out["result"] = "timeout"
        rep.add("error", "probe", f"no answer from {host}:{port} ({sockaddr[0]}) within {timeout:g} s: "
                "a firewall or a missing route drops the connection.",
                "open the port between the nodes, or pick an address on the network the nodes share.")
    except OSError as exc:
        out["result"] = errno.errorcode.get(exc.errno, str(exc.errno))  # type: ignore[arg-type]  # errno None: .get gives the default
        rep.add("error", "probe", f"cannot reach {host}:{port} ({sockaddr[0]}): {exc.strerror}.",
                "check the route to rank 0's node, or set MASTER_ADDR to an address it listens on.")
    finally:
        s.close()
    if env.is_main and out["result"] == "listening":
        out["note"] = "this is rank 0: the port is taken"
    return out


def diagnose(environ: "Mapping[str, str] | None" = None, probe: bool = False, timeout: float = 2.0,
             versions: bool = False) -> "dict[str, Any]":
    """The report as a dict (what ``--json`` prints); with `versions`, the ``versions``
    section too (`versions()`: may start the launcher's ``--version``)."""
    return _diagnose(environ, probe, timeout, versions)[1]


def _diagnose(environ: "Mapping[str, str] | None", probe: bool, timeout: float, with_versions: bool,
              discover: bool = False) -> "tuple[DistEnv | None, dict[str, Any]]":
    """(the resolved DistEnv or None, the report). `discover`: the map asks the launcher's
    service where the environment does not place the ranks (collective: every rank)."""
    from .resolver import resolve

    environ = dict(os.environ if environ is None else environ)
    rep = Report()
    out: "dict[str, Any]" = {"launch": None, "provenance": None, "notes": [], "error": None}
    env = None
    try:
        env = resolve(environ)
    except DistEnvError as exc:
        message = redact_text(" ".join(str(exc).split()))
        out["error"] = message
        problem, fix = split_fix(message)
        rep.add("error", "launch", problem, fix or "correct or unset the variable it names "
                "(distenv show --explain, once it resolves, shows where each field came from)")
    if with_versions:
        out["versions"] = versions(env, environ)
    if env is not None:
        out["launch"] = env.to_dict()
        if out["launch"]["master_addr"] is not None:
            out["launch"]["master_addr"] = redact_text(out["launch"]["master_addr"])
        for key in ("job_id", "launcher", "platform"):
            if isinstance(out["launch"].get(key), str):
                out["launch"][key] = redact_text(out["launch"][key])
        if out["launch"].get("hosts"):
            out["launch"]["hosts"] = [redact_text(h) for h in out["launch"]["hosts"]]
        out["provenance"] = {k: redact_text(v) for k, v in env.provenance.items()}
        out["notes"] = [redact_text(n) for n in env.notes]
        _check_launch(rep, env, environ)
        _check_map(rep, out, env, discover)
        out["gpus"] = _check_gpus(rep, env, environ)
    # CPU and network checks stand without a resolved launch (they matter most then).
    out["cpu"] = _check_cpu(rep, env, environ)
    out["network"] = _check_network(rep, env, environ)
    auto = _check_auto(rep, environ)
    if auto is not None:
        out["auto"] = auto
    if probe and env is not None:
        out["probe"] = _probe(rep, env, timeout)
    rank = {level: i for i, level in enumerate(LEVELS)}
    out["findings"] = sorted(rep.findings, key=lambda f: rank[f["level"]])
    out["environment"] = redact_environ(environ, [
        k for k in sorted(environ) if k in SHOWN_NAMES or k.startswith(SHOWN_PREFIXES)])
    out["status"] = "error" if any(f["level"] == "error" for f in rep.findings) else \
        "warning" if any(f["level"] == "warning" for f in rep.findings) else "ok"
    return env, out


def exit_code(report: "Mapping[str, Any]") -> int:
    """2: the environment cannot be resolved (as every distenv command); 1: a finding is an
    error; 0 otherwise."""
    if report.get("error"):
        return 2
    return 1 if report["status"] == "error" else 0


# -- versions ------------------------------------------------------------------------------
#: Distributions reported when installed for this interpreter, in this order.
PACKAGES = ("torch", "lightning", "pytorch-lightning", "transformers", "accelerate", "deepspeed",
            "tensorflow", "tf-keras", "keras", "horovod", "jax", "jaxlib", "mpi4py")
#: launcher -> (command whose --version to run, names of its binaries and daemons that may be
#: an ancestor of a rank). A daemon (orted, hydra_pmi_proxy) stands for the command next to it.
LAUNCHER_COMMANDS = {
    "openmpi": ("mpirun", ("mpirun", "mpiexec", "orterun", "prterun", "prte", "orted", "prted")),
    "mpich": ("mpiexec", ("mpiexec", "mpirun", "mpiexec.hydra", "hydra_pmi_proxy")),
    "intelmpi": ("mpiexec.hydra", ("mpiexec.hydra", "mpiexec", "mpirun", "hydra_pmi_proxy",
                                   "hydra_bstrap_proxy")),
    "mvapich2": ("mpiexec", ("mpiexec", "mpirun", "mpirun_rsh", "mpiexec.hydra", "hydra_pmi_proxy")),
    "pals": ("mpiexec", ("mpiexec",)),
    "slurm": ("srun", ("srun",)),
    "flux": ("flux", ()),
    "lsf": ("jsrun", ("jsrun",)),
}
#: launcher -> the distribution whose version is the launcher's (a Python launcher).
LAUNCHER_PACKAGES = {"torchrun": "torch", "deepspeed": "deepspeed", "horovodrun": "horovod"}
#: Variables that would make a launcher's --version think it runs inside a job.
_JOB_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "PRTE_", "HYDRA_", "I_MPI_HYDRA", "MPI_LOCAL", "ORTE_")
VERSION_TIMEOUT = 3.0


def _distribution_versions() -> "dict[str, str]":
    from importlib import metadata

    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # a broken dist-info must not break the doctor
            found[name] = "unknown (unreadable metadata)"
    return found


def _ancestors(limit: int = 12) -> "Iterator[tuple[int, str | None, str]]":
    """(pid, executable, name) of this process's parents, nearest first (/proc)."""
    pid = os.getpid()
    for _ in range(limit):
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            return
        try:
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            return
        if pid <= 1:
            return
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = None
        yield pid, exe, (_read(f"/proc/{pid}/comm") or "").strip()


def _launcher_command(launcher: str) -> "tuple[str, str] | None":
    """(argv0, how it was found) of the launcher's command, or None."""
    import shutil

    command, names = LAUNCHER_COMMANDS[launcher]
    for pid, exe, comm in _ancestors():
        base = os.path.basename(exe) if exe else comm
        if base in names or comm in names:
            if exe and base in ("orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy"):
                # A daemon: the launcher's command is installed next to it.
                sibling = os.path.join(os.path.dirname(exe), command)
                if os.path.exists(sibling):
                    return sibling, f"next to {base}, pid {pid}, an ancestor of this process"
                continue
            if exe:
                return exe, f"pid {pid}, the ancestor of this process that launched it"
    found = shutil.which(command)
    if found:
        return found, f"{command} on PATH: this process's launcher is not among its ancestors"
    return None


def _first_version_line(text: str) -> "str | None":
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:  # MPICH's Hydra: "HYDRA build details:" then "Version: 4.0.2"
        if line.startswith("Version:"):
            return f"Hydra {line.split(':', 1)[1].strip()}"
    return lines[0] if lines else None


def launcher_version(launcher: str, environ: "Mapping[str, str]") -> "dict[str, str | None]":
    """{"version", "source"}: the launcher's own version, where it says it."""
    if launcher == "openmpi" and environ.get("OMPI_VERSION"):
        return {"version": f"Open MPI {environ['OMPI_VERSION']}", "source": "OMPI_VERSION"}
    if launcher in LAUNCHER_PACKAGES:
        from importlib import metadata

        dist = LAUNCHER_PACKAGES[launcher]
        try:
            return {"version": f"{dist} {metadata.version(dist)}",
                    "source": f"{dist}'s metadata in this interpreter"}
        except metadata.PackageNotFoundError:
            return {"version": None, "source": f"{dist} is not installed for this interpreter"}
    if launcher not in LAUNCHER_COMMANDS:
        return {"version": None, "source": f"{launcher} has no version command"}
    found = _launcher_command(launcher)
    if found is None:
        return {"version": None,
                "source": f"{LAUNCHER_COMMANDS[launcher][0]} is neither an ancestor nor on PATH"}
    command, how = found
    import subprocess

    clean = {k: v for k, v in environ.items() if not k.startswith(_JOB_PREFIXES)}
    try:
        p = subprocess.run([command, "--version"], env=clean, capture_output=True, text=True,
                           errors="replace", timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"version": None, "source": f"`{command} --version` gave no answer within "
                f"{VERSION_TIMEOUT:g} s; {how}"}
    except OSError as exc:
        return {"version": None, "source": f"`{command} --version` failed: {exc.strerror}; {how}"}
    line = _first_version_line(p.stdout) if p.returncode == 0 else None
    if line is None:
        why = _first_version_line(p.stderr) or f"exit status {p.returncode}"
        return {"version": None, "source": f"`{command} --version` failed: {why}; {how}"}
    return {"version": line, "source": f"`{command} --version`; {how}"}


def versions(env: "DistEnv | None", environ: "Mapping[str, str] | None" = None) -> "dict[str, Any]":
    """distenv, Python, installed frameworks (metadata only: no framework is imported) and
    the launcher's own version."""
    import sys

    from . import __version__

    environ = os.environ if environ is None else environ
    out: "dict[str, Any]" = {"distenv": f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})",
                             "python": f"{sys.version.split()[0]} ({sys.executable})",
                             "packages": _distribution_versions(), "launcher": None}
    if env is not None and env.launcher != "none":
        out["launcher"] = {"name": env.launcher, **launcher_version(env.launcher, environ)}
    return out


def render(report: "Mapping[str, Any]") -> str:
    """The human-readable report."""
    from .description import FIELDS

    from .display import hosts_text, shorten

    lines = ["launch"]
    if report["launch"] is not None:
        width = max(len(f) for f in FIELDS)
        for name in FIELDS:
            value = report["launch"][name]
            if name == "hosts" and value:
                value = hosts_text(value)
            elif isinstance(value, list):
                value = ",".join(map(str, value))
            shown = "unknown" if value is None else shorten(str(value))
            why = shorten(report["provenance"].get(name, ""))
            lines.append(f"  {name:<{width}}  {shown:<16}  {why}".rstrip())
    else:
        lines.append(f"  cannot be resolved: {shorten(report['error'])}")
    if report.get("map") is not None:
        from .nodemap import render as render_map

        lines.append("")
        lines.append("map (once for the job: distenv show --map)")
        lines += [f"  {line}" for line in render_map(report["map"]).split("\n")]
    lines.append("")
    lines.append("findings")
    for f in report["findings"]:
        lines.append(f"  [{f['level']}] {f['topic']}: {shorten(f['message'])}")
        if f["fix"]:
            lines.append(f"      fix: {shorten(f['fix'])}")
    if report.get("versions"):
        v = report["versions"]
        lines.append("")
        lines.append("versions")
        rows = [("distenv", v["distenv"]), ("python", v["python"]), *v["packages"].items()]
        if v.get("launcher"):
            launcher = v["launcher"]
            rows.append((f"launcher ({launcher['name']})",
                         f"{launcher['version'] or 'unknown'}  [{launcher['source']}]"))
        missing = [p for p in PACKAGES if p not in v["packages"]]
        if missing:
            rows.append(("not installed", ", ".join(missing)))
        width = max(len(name) for name, _ in rows)
        lines += [f"  {name:<{width}}  {shorten(value)}" for name, value in rows]
    if report.get("probe"):
        lines.append("")
        p = report["probe"]
        lines.append(f"probe  {p.get('address')}:{p.get('port')} -> {p.get('result')}")
    lines.append("")
    lines.append("environment (secret values redacted)")
    if report["environment"]:
        for name, value in report["environment"].items():
            lines.append(f"  {name}={shorten(value)}")
    else:
        lines.append("  (no launcher, collective or thread variables set)")
    lines.append("")
    counts = {level: sum(1 for f in report["findings"] if f["level"] == level) for level in LEVELS}
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s)")
    return "\n".join(lines)


def summary(report: "Mapping[str, Any]") -> str:
    """One line: status, counts, the first error (else warning) and its fix."""
    from .display import shorten

    counts = {level: sum(1 for f in report["findings"] if f["level"] == level) for level in LEVELS}
    line = f"doctor: {report['status']}: {counts['error']} error(s), {counts['warning']} warning(s)"
    worst = next((f for f in report["findings"] if f["level"] in ("error", "warning")), None)
    if worst is not None:
        line += f"; {worst['topic']}: {shorten(worst['message'])}"
        if worst["fix"]:
            line += f" Fix: {shorten(worst['fix'])}"
    return line


def main(args: argparse.Namespace) -> int:
    """`distenv doctor`: every rank checks; the ranks chosen by --ranks (default one per
    node) print the report. A rank not chosen still prints its one-line summary when its
    check fails: an error is never hidden."""
    import json

    from . import display

    env, report = _diagnose(None, args.probe, args.timeout, False, discover=True)
    code = exit_code(report)
    summary_only = getattr(args, "summary", False)
    if not display.chosen(env, args.ranks):
        if code == 0:
            return 0
        summary_only = True
    if args.json:
        report["versions"] = versions(env)
        text = json.dumps(report, sort_keys=False)
    elif summary_only:
        text = f"{display.rank_label(env)} on {os.uname().nodename}: {summary(report)}"
    else:
        report["versions"] = versions(env)
        text = render(report)
    display.write(text, display.label(args.prefix, env, machine=args.json or summary_only))
    return code
