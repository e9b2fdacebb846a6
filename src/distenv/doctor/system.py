"""The doctor's small readers of the machine: RDMA devices (``/sys/class/infiniband``),
network interfaces and routes (``/proc/net/dev``, ``/proc/net/route``), ``/etc/hosts``, this
process's CPU affinity and its ancestors (``/proc``). Nothing here opens a socket or starts a
process.

The paths are attributes of this module so that tests can point them at files they write;
every reader looks them up when called (patch ``distenv.doctor.system.NET_DEV``, not a copy).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


# Paths, as module attributes so tests can point them at directories they control.
INFINIBAND_DIR = "/sys/class/infiniband"
NET_DEV = "/proc/net/dev"  # per network namespace (unlike /sys/class/net under nsenter)
NET_ROUTE = "/proc/net/route"
HOSTS_FILE = "/etc/hosts"


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
