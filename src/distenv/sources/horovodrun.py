"""horovodrun in Gloo mode (in MPI mode it runs mpirun, and the MPI source answers).

Inferred (docs/inferences.md): HOROVOD_CROSS_RANK/SIZE are a node index and count only
on local rank 0 (Horovod counts cross ranks per local rank); elsewhere unknown.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Doctor, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class HorovodRun(Source):
    name = "horovodrun"
    title = "horovodrun"
    family = "horovod"
    prefixes = ('HOROVOD_',)
    doctor = Doctor(package="horovod")

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "HOROVOD_RANK", "HOROVOD_SIZE",
                    "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
        # HOROVOD_CROSS_RANK/SIZE index the hosts that run *this local rank*
        # (horovod/runner/common/util/hosts.py get_host_assignments: ranks are dealt host by
        # host in -H order, cross ranks counted per local rank). Every host runs a local
        # rank 0, so there they are the node index and count; on local rank > 0 of uneven
        # hosts (-H a:1,b:2) they are not, and nothing says the hosts are even.
        if env.get("HOROVOD_LOCAL_RANK", "").strip() == "0":
            r.int_from(env, "node_rank", "HOROVOD_CROSS_RANK", self.title)
            r.int_from(env, "num_nodes", "HOROVOD_CROSS_SIZE", self.title, minimum=1)
        addr = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        port = env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        if addr and port:
            # The rendezvous server belongs to horovodrun, not to rank 0: it identifies the
            # job (for the port rule) but is not a master address.
            r.port_key = f"horovod:{addr}:{port}"


SOURCE = HorovodRun()
