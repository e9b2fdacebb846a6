"""Rank 0's own look at the master address (issue 42, item 4): is it this host?

Every other rank dials the master address at the master port, and only rank 0 (node 0 of a
per-node launch, whose torchrun binds the port) starts something there. Where the launch does
not place rank 0 (`DistEnv.rank_hosts` unknown: the user's own variables, a platform's), only
rank 0 can tell that the address may lead elsewhere, and say so within seconds, before the
other ranks' wait there ends (the pre-flight's DISTENV_TIMEOUT; torch's own is 30 minutes).

"None of this host's addresses" is no proof: a NAT, a load balancer, a Kubernetes service or a
published container port forwards an address of another machine here. So rank 0 asks the
network, as the other ranks will:

1. the address is this host's name, a loopback, or resolves to an address this host can bind
   (the kernel's own list: no interface parsing; not a multicast or broadcast address) -> rank
   0's; done;
2. else rank 0 listens on the master port (every address, as torch's store does) for a moment
   and dials the address at that port itself, sending a token:
   - the token arrives at its listener -> the address leads here (through whatever forwards);
   - the connection is refused, or another program answers (connected, the token never
     arrives) -> **a warning** naming both. Not an error: a forwarder whose backend is not
     ready yet answers so too, and rank 0's store, its backend, cannot be listening before
     this look ends -- a Kubernetes service without ready endpoints, a NodePort on a
     neighbour node and an LVS or keepalived address refuse, a proxy accepts and closes; on
     this host's own network as well as beyond (a refusal by a neighbour that only forwards
     once its health check passes was shown in review). If the other ranks cannot reach rank
     0 there, the pre-flight ends the job within DISTENV_TIMEOUT, naming the master;
   - no answer within `REACH_SECONDS`, an unreachable network, a name that does not resolve,
     the port already held here: no proof, it passes.

Not where the launcher's agent may host the store (`Launch.agent_store`: torchrun, whose c10d
rendezvous puts it on a host rank 0 need not share).

Called at bring-up only, once per process, never by `resolve()`; ``DISTENV_MASTER_CHECK=0``
turns it off (the unit tests do: they replay other hosts' environments here). Standard
library only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    import socket

    from ..core.description import DistEnv

#: Seconds rank 0 gives its own connection to the master address, for the connect and again
#: for the token: a forwarding path answers within milliseconds; one that drops packets proves
#: nothing. `DIAL_SECONDS` bounds every dial together, the token's wait included (an address
#: whose turn comes after it is not dialed: no proof).
REACH_SECONDS = 2.0
DIAL_SECONDS = 2 * REACH_SECONDS
#: Addresses of the master name dialed at most: a name with more (a service's) proves nothing,
#: since any one of them may be the one a client reaches.
DIALED = 16
_checked: "set[tuple[str, int]]" = set()


def is_rank_0s(env: "DistEnv") -> None:
    """On rank 0 (`env.is_main`) of a distributed launch, once per address and port: a warning
    naming the address and this host when the master address is none of this host's and,
    dialed, leads elsewhere or nowhere yet (the module doc); never an error."""
    import os
    import socket

    from ..knobs import MASTER_CHECK

    addr, port = env.master_addr, env.master_port
    if not env.is_distributed or not env.is_main or not addr or port is None \
            or (addr, port) in _checked or not MASTER_CHECK.value(os.environ):
        return
    from ..sources import source_of

    if source_of(env.launcher).launch.agent_store:
        return
    _checked.add((addr, port))
    here = socket.gethostname()
    placed = env.rank_hosts[0] if env.rank_hosts else None
    if addr.lower() in {here.lower(), here.split(".")[0].lower(), (placed or "").lower()} \
            or addr.lower() == "localhost" or addr.startswith("127.") or addr == "::1":
        return
    from ..core.placement import _addresses  # bounded by its LOOKUP_SECONDS

    addresses = sorted(_addresses([addr]).get(addr, ()))
    if not addresses or len(addresses) > DIALED or any(_own(a) for a in addresses):
        return  # unresolved or too many (no proof), loopback only, or one of this host's own
    outcomes = _dial(addresses, port)
    if not outcomes or not all(o in ("refused", "other") for o in outcomes):
        return
    said = ("refused the connection" if all(o == "refused" for o in outcomes)
            else "is answered by another program")
    from ..log import get_logger

    get_logger(__name__).warning(
        f"master_addr={addr} ({env.provenance.get('master_addr')}) is none of the addresses of "
        f"{here}, where rank 0 runs, and {addr}:{port} dialed from there {said}: unless it "
        f"forwards to {here} once rank 0's store listens (a service, a load balancer), the "
        f"other ranks will not find the store there. Fix: unset MASTER_ADDR (distenv takes rank "
        f"0's host), or set it to {here} on every rank; {MASTER_CHECK}=0 silences this.")


def _own(address: str) -> bool:
    """Can this host bind `address` (a new socket, port 0)? Where non-local binds are allowed
    (net.ipv{4,6}.ip_nonlocal_bind) a bind proves nothing: not own."""
    import socket

    v6 = ":" in address
    first = address.split(".", 1)[0]
    if (v6 and address.lower().startswith("ff")) or address == "255.255.255.255" \
            or (first.isdigit() and 224 <= int(first) <= 239):
        return False  # multicast or broadcast: bindable, yet no TCP client reaches it
    try:
        with open(f"/proc/sys/net/ipv{6 if v6 else 4}/ip_nonlocal_bind") as f:
            if f.read().strip() != "0":
                return False
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def _dial(addresses: "list[str]", port: int) -> "list[str]":
    """Each address dialed at `port` from here while this host listens there, until one answers
    "here" (the token came back) or "unknown" (no answer in time): "refused", "other" (someone
    else answered); [] when the port cannot be listened on here (held: nothing to compare
    with). Every dial ends by one deadline, `DIAL_SECONDS` from now."""
    import time

    listeners = _listen(port)
    out: "list[str]" = []
    end = time.monotonic() + DIAL_SECONDS
    try:
        for address in addresses if listeners else ():
            out.append(_one(address, port, listeners, end) if end > time.monotonic()
                       else "unknown")
            if out[-1] in ("here", "unknown"):  # either decides: no further dial changes it
                break
    finally:
        for s in listeners:
            s.close()
    return out


def _listen(port: int) -> "list[socket.socket]":
    """Listeners on `port` at every address (as torch's store listens), not blocking; [] when
    the port is held here (torchrun's agent, another program)."""
    from ..core.ports import bound

    listeners = bound(port, backlog=8)
    for s in listeners:
        s.setblocking(False)
    return listeners


#: SO_LINGER {on, 0 s}: closed with a reset, so no TIME_WAIT is left on the master port.
_LINGER = b"\x01\x00\x00\x00\x00\x00\x00\x00"


def _one(address: str, port: int, listeners: "list[socket.socket]", end: float) -> str:
    """One dial of `address`:`port` with a fresh token, watched on `listeners`: the connect
    and then the token each get at most `REACH_SECONDS`, both together ending by `end` (a
    monotonic time); what arrives is read up to `_READ` bytes a connection, the connections
    closed at the end."""
    import os
    import selectors
    import socket
    import time

    token = os.urandom(16)
    came: "dict[socket.socket, bytes]" = {}  # accepted here -> what it sent
    try:
        sel = selectors.DefaultSelector()
    except OSError:  # out of descriptors: no proof
        return "unknown"
    try:
        c = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    except OSError:  # no IPv6 here, out of descriptors
        sel.close()
        return "unknown"
    try:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
        c.settimeout(max(0.001, min(REACH_SECONDS, end - time.monotonic())))
        try:
            c.connect((address, port))
            c.sendall(token)
        except ConnectionRefusedError:
            return "refused"
        except OSError:  # timed out, unreachable: no proof
            return "unknown"
        for s in listeners:
            sel.register(s, selectors.EVENT_READ, s)
        deadline = min(time.monotonic() + REACH_SECONDS, end)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "other"
            for key, _ in sel.select(left):
                s = key.data
                if s in listeners:
                    try:
                        conn, _ = s.accept()
                    except OSError:
                        continue
                    came[conn] = b""
                    try:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
                        sel.register(conn, selectors.EVENT_READ, conn)
                    except (OSError, ValueError):
                        continue
                    continue
                try:
                    data = s.recv(64)
                except OSError:
                    data = b""
                came[s] += data
                if token in came[s]:
                    return "here"
                if not data or len(came[s]) > _READ:
                    sel.unregister(s)
                    s.close()
    finally:
        sel.close()
        c.close()
        for s in came:
            s.close()


#: Bytes read from one connection before it is dropped: the token, after a proxy's header.
_READ = 256
