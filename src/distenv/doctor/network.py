"""The doctor's network check (RDMA devices against NCCL_IB_* and UCX_*, the socket interface
variables against the interfaces here, the route to rank 0, this host's name in /etc/hosts)
and the probe (``--probe``: the only part of the doctor that opens a socket)."""

from __future__ import annotations

import os

from . import system

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from ..core.description import DistEnv
    from .report import Report


def _active(dev: "Mapping[str, Any]") -> bool:
    # No port information: count the device as usable (we cannot tell otherwise).
    return not dev["ports"] or any((p["state"] or "ACTIVE") == "ACTIVE" for p in dev["ports"])


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


def _truthy(value: object) -> bool:
    return str(value).strip().lower() not in ("", "0", "false", "no", "off")


def _check_network(rep: Report, env: "DistEnv | None", environ: "Mapping[str, str]"
                   ) -> "dict[str, Any]":
    devices = system.rdma_devices()
    active = [d for d in devices if _active(d)]
    ifaces = system.interfaces()
    multi = env is not None and env.is_distributed and (env.num_nodes is None or env.num_nodes > 1)

    def describe(d: "Mapping[str, Any]") -> str:
        ports = ", ".join(f"port {p['port']} {p['state'] or '?'}"
                          + (f" {p['link_layer']}" if p["link_layer"] else "") for p in d["ports"])
        return f"{d['device']} ({ports})" if ports else d["device"]

    info = {"rdma_devices": devices, "interfaces": ifaces, "route_to_master": None}
    if devices:
        rep.add("info", "network", "RDMA device(s): " + "; ".join(describe(d) for d in devices) + ".")
    elif multi:
        rep.add("info", "network", f"no RDMA device ({system.INFINIBAND_DIR} is empty or absent): "
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
        addr = master if system._ipv4(master) is not None else next(iter(system.hosts_lookup(master)), None)
        route = system.route_interface(addr) if addr else None
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
            rep.add("info", "network", f"rank 0's host {master} is not in {system.HOSTS_FILE}: DNS "
                    "resolves it (check with --probe).")

    # gloo binds to the address this host's name resolves to.
    host = os.uname().nodename
    mapped = system.hosts_lookup(host)
    if multi and "GLOO_SOCKET_IFNAME" not in environ and mapped and all(a.startswith("127.") or a == "::1" for a in mapped):
        rep.add("warning", "network", f"this host's name {host} maps to {', '.join(mapped)} in "
                f"{system.HOSTS_FILE}: gloo binds to that loopback address and other nodes cannot reach it.",
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
