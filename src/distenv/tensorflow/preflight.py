"""The pre-flight before TensorFlow's silent wait: every training worker reports to worker 0
(the core's one pre-flight, `distenv.bringup.preflight.meet`), so a missing worker is one clear error
line after DISTENV_TIMEOUT, not a hang."""

from __future__ import annotations

from .. import knobs
from ..bringup import preflight
from ..errors import DistEnvError
from ..core.resolver import resolved
from .cluster import _environ

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ..core.description import DistEnv

#: Seconds the pre-flight waits for every worker (override: DISTENV_TIMEOUT).
DEFAULT_TIMEOUT = knobs.DEFAULT_TIMEOUT


def rendezvous(workers: "Sequence[str]", index: int, timeout: "float | None" = None,
               environ: "Mapping[str, str] | None" = None, *, port: "int | None" = None,
               env: "DistEnv | None" = None) -> float:
    """Every worker of ``workers`` (host:port, chief first) reports to worker 0, which
    answers each once all came (`distenv.bringup.preflight.meet`: a star on worker 0 that holds no
    connection per worker, at the pre-flight's own port, `distenv.bringup.preflight.port`, unless
    `port` is given). Returns the seconds it took. Raises `DistEnvError` naming the workers
    that never came when `timeout` (default DISTENV_TIMEOUT, else 180 s) passes, on worker 0
    and on every worker that came; naming worker 0's address on a worker that cannot reach it.
    `env`: the launch (default: resolved from `environ`)."""
    src = _environ(environ)
    seconds = knobs.timeout(src, timeout)
    _own_port_free(workers, index, src)
    host = workers[0].rpartition(":")[0].strip("[]")
    d = env if env is not None else resolved(None, src)[0]
    cluster = ",".join(workers)
    mine = workers[index].rpartition(":")[0]
    return preflight.meet(preflight.Meeting(
        size=len(workers), index=index, host=host,
        port=preflight.port(d, host, src) if port is None else port,
        # the cluster (its ports derived from the job) and the job: what every worker sees alike
        job=f"tensorflow|{d.launcher}|{d.job_id}|{cluster}", timeout=seconds,
        who="distenv.tensorflow", noun="worker", entry="the strategy",
        address_from=f"worker 0 of the cluster: {workers[0]}",
        address_fix="give every worker the same cluster (TF_CONFIG, DISTENV_HOSTFILE)",
        local=sum(w.rpartition(":")[0] == mine for w in workers)))


def _own_port_free(workers: "Sequence[str]", index: int, src: "Mapping[str, str]") -> None:
    """This worker's TensorFlow port is about to be bound by its server: taken here already
    (another job's worker, blocks derived alike), TensorFlow would fail or reach that job.
    Checked where it can be, on the worker itself, before any other worker waits for it."""
    from ..core.ports import bindable, free

    raw = workers[index].rpartition(":")[2]
    if not raw.isdigit() or bindable(int(raw)):
        return
    port = int(raw)
    if src.get("TF_CONFIG"):
        fix = "give this worker a free port in TF_CONFIG"
    else:
        other = free(port + 1)
        fix = (f"set {knobs.TF_PORT} to a free base port on every worker"
               + (f" (e.g. {knobs.TF_PORT}={other})" if other is not None else ""))
    raise DistEnvError(f"TensorFlow's port {port} for worker {index} ({workers[index]}) is already "
                       "in use on this host: another job or program listens there, and this "
                       f"worker's server would fail or the others would reach it. Fix: {fix}.")
