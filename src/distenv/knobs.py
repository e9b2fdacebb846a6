"""Knobs every adapter shares, computed once here: the wait limit, side ports, core share.

* `timeout()`: seconds a rendezvous waits for every rank (DISTENV_TIMEOUT, default 180).
* `side_port()`: a port beside the master port for a framework's own service (TensorFlow's
  workers, Horovod's rendezvous server, Keras/JAX's coordinator): the user's DISTENV_<X>_PORT,
  else derived from the job like the master port (`distenv.ports`), so every rank computes the
  same one and concurrent jobs differ; never the master port itself (torchrun's store, or the
  user's, may hold it).
* `core_share()`: how many cores this process may use for its thread pools.
* `hostfile()`, `gather()`: where `distenv.tensorflow` may learn every rank's host
  (DISTENV_HOSTFILE, DISTENV_GATHER), see `distenv.placement`.

Standard library only; reading the CPU affinity is the only system call, and only when asked.
"""

from __future__ import annotations

import os

from . import ports
from .errors import DistEnvError
from .reading import PORT_MAX, parse_port

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from .description import DistEnv

#: Seconds a rendezvous waits for every rank unless DISTENV_TIMEOUT says otherwise.
DEFAULT_TIMEOUT = 180.0


def _environ(environ: "Mapping[str, str] | None") -> "Mapping[str, str]":
    return os.environ if environ is None else environ


def timeout(environ: "Mapping[str, str] | None" = None, given: "float | str | None" = None) -> float:
    """Seconds to wait: `given` when not None, else DISTENV_TIMEOUT, else 180.

    A DISTENV_TIMEOUT that is not a positive number is an error naming the variable."""
    if given is not None:
        return float(given)
    raw = _environ(environ).get("DISTENV_TIMEOUT")
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise DistEnvError(
            f"DISTENV_TIMEOUT={raw!r} is not a positive number of seconds. "
            "Fix: unset it or give e.g. DISTENV_TIMEOUT=300."
        )
    return seconds


def side_port(env: "DistEnv", purpose: str, environ: "Mapping[str, str] | None" = None,
              var: "str | None" = None, given: "int | str | None" = None,
              width: int = 1, addr: "str | None" = None) -> int:
    """The first of `width` ports for `purpose` ("tf", "horovod", "keras", ...).

    `given` (a keyword argument) wins, then the variable `var` (e.g. DISTENV_TF_PORT), else
    ``ports.port_for("<purpose>:<launcher>:<job id>:<addr>:<master port>")`` moved past the
    master port when the range would hold it. `addr` defaults to the master address."""
    name = var or "port"
    last = PORT_MAX + 1 - width  # the first of `width` consecutive ports
    if given is None and var is not None:
        raw = _environ(environ).get(var)
        if raw:
            return parse_port(raw, var, last=last)
    if given is not None:
        return parse_port(str(given), name, last=last)
    host = env.master_addr if addr is None else addr
    base = ports.port_for(f"{purpose}:{env.launcher}:{env.job_id}:{host}:{env.master_port}")
    master = env.master_port
    if master is not None and base <= master < base + width:
        base = master + 1
    return base


def address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:29500``), as every launcher and
    framework writes an address."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _affinity(pid: int = 0) -> "set[int] | None":
    try:
        return set(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


def core_share(local_world_size: "int | None", mine: "Iterable[int] | None" = None,
               parent: "Iterable[int] | None" = None) -> "tuple[int, str]":
    """(cores this process may use, why).

    `mine`/`parent`: CPU sets of this process and of its parent (default: measured). When the
    launcher bound this process to fewer cores than its parent has (mpirun's default binding,
    srun --cpu-bind), those cores are its own; otherwise the node's `local_world_size`
    processes share them."""
    cores = _affinity() if mine is None else set(mine)
    if not cores:
        cores = set(range(os.cpu_count() or 1))
    theirs = _affinity(os.getppid()) if parent is None else set(parent)
    nlocal = local_world_size or 1
    if theirs and cores < theirs:
        return len(cores), f"{len(cores)} core(s) bound to this process by the launcher"
    return max(1, len(cores) // nlocal), f"{len(cores)} core(s) shared by {nlocal} local process(es)"


def hostfile(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """DISTENV_HOSTFILE: a file naming every rank's host (see `distenv.placement`)."""
    return _environ(environ).get("DISTENV_HOSTFILE") or None


def gather(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """DISTENV_GATHER: how to ask the other ranks for their hosts (only 'mpi4py')."""
    return _environ(environ).get("DISTENV_GATHER", "").strip().lower() or None


def truthy(value: object) -> bool:
    """A yes/no knob's value: 1, true, yes, on."""
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def switched_off(environ: "Mapping[str, str] | None", name: str) -> bool:
    """An on-by-default switch (DISTENV_PMI, DISTENV_PMIX, ...) turned off: 0, no, off, false."""
    return _environ(environ).get(name, "").strip().lower() in ("0", "no", "off", "false")
