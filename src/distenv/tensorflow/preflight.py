"""The pre-flight rendezvous: every worker listens on its port until every worker reached
every other one, so a missing worker is a clear error after DISTENV_TIMEOUT, not a hang."""

from __future__ import annotations

import socket
import time
import zlib

from .. import knobs
from ..errors import DistEnvError
from .cluster import _environ

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

#: Seconds the pre-flight rendezvous waits for every worker (override: DISTENV_TIMEOUT).
DEFAULT_TIMEOUT = knobs.DEFAULT_TIMEOUT
#: How a worker's hello starts (then its index and the cluster's digest).
_HELLO = b"distenv-tf "


def _split(address: str) -> "tuple[str, int]":
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def rendezvous(workers: "Sequence[str]", index: int, timeout: "float | None" = None,
               environ: "Mapping[str, str] | None" = None) -> float:
    """Listen on ``workers[index]``'s port until every worker has reached every other one.

    Each worker connects to every other worker's port and says hello (its index and a digest
    of the cluster, so another job's worker does not count); it stops listening only when it
    reached every peer *and* every peer reached it, so no peer can find the port closed in
    the gap before TensorFlow binds it. Returns the seconds it took. Raises `DistEnvError`
    naming the missing workers when `timeout` (default DISTENV_TIMEOUT, else 180 s) passes.
    """
    timeout = knobs.timeout(_environ(environ), timeout)
    t0 = time.monotonic()
    deadline = t0 + timeout
    _, port = _split(workers[index])
    key = zlib.crc32(",".join(workers).encode("utf-8", "surrogatepass"))  # this cluster's tag
    hello = _HELLO + f"{index} {key}\n".encode()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as exc:
        listener.close()
        raise DistEnvError(
            f"worker {index} cannot listen on port {port} ({exc.strerror}): another job or a "
            "leftover process holds it. Fix: set DISTENV_TF_PORT to a free base port on every worker."
        ) from None
    listener.listen(128)
    listener.setblocking(False)
    peers = {i: w for i, w in enumerate(workers) if i != index}
    unreached = dict(peers)
    heard: "set[int]" = set()
    try:
        while True:
            _drain(listener, heard, key)
            for i, address in list(unreached.items()):
                if _say_hello(address, hello):
                    del unreached[i]
            _drain(listener, heard, key)
            silent = [i for i in peers if i not in heard]
            if not unreached and not silent:
                break
            if time.monotonic() >= deadline:
                gone = sorted(set(unreached) | set(silent))
                missing = ", ".join(f"worker {i} ({peers[i]})" for i in gone)
                raise DistEnvError(
                    f"TensorFlow pre-flight: after {timeout:.0f} s, worker {index} of "
                    f"{len(workers)} has not met {missing}: that worker did not start, crashed, "
                    "or is blocked by a firewall. Fix: start every worker (same launcher, same "
                    "job), or raise DISTENV_TIMEOUT."
                )
            time.sleep(0.2)
    finally:
        listener.close()
    return time.monotonic() - t0


def _drain(listener: Any, heard: "set[int]", key: int, budget: float = 1.0) -> None:
    """Accept pending connections for at most `budget` seconds and record which workers said
    hello. Bounded, and quick to drop a stranger: once a peer has passed its own rendezvous,
    TensorFlow's gRPC channels connect to this very port and reconnect as soon as they are
    dropped; waiting on each for a hello line that never comes kept a worker here for good
    (measured: 1 job in 11 across two nodes hung until killed)."""
    end = time.monotonic() + budget
    while time.monotonic() < end:
        try:
            conn, _ = listener.accept()
        except OSError:  # BlockingIOError: nothing pending
            return
        try:
            conn.settimeout(0.5)  # a peer sends its hello in one write right after connecting
            data = b""
            while not data.endswith(b"\n") and len(data) < 256 and \
                    (_HELLO.startswith(data) or data.startswith(_HELLO)):
                chunk = conn.recv(256)
                if not chunk:
                    break
                data += chunk
            words = data.decode("ascii", "replace").split()
            if len(words) == 3 and words[0] == "distenv-tf" and words[2] == str(key) \
                    and words[1].isdigit():
                heard.add(int(words[1]))
        except OSError:
            pass
        finally:
            conn.close()


def _say_hello(address: str, hello: bytes) -> bool:
    host, port = _split(address)
    try:
        with socket.create_connection((host, port), timeout=1.0) as conn:
            conn.sendall(hello)
            return True
    except OSError:
        return False

