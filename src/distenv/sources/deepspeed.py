"""The DeepSpeed launcher (`deepspeed train.py`): torch variables plus LOCAL_SIZE and CROSS_*.

Inferred (docs/inferences.md): CROSS_RANK/CROSS_SIZE are the launcher's node index and
count (ranks numbered node by node); LOCAL_SIZE is this node's count only (a host file may
give hosts different slot counts).
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Doctor, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class DeepSpeedLauncher(Source):
    name = "deepspeed"
    title = "the DeepSpeed launcher"
    family = "torch"
    prefixes = ('CROSS_RANK', 'CROSS_SIZE', 'LOCAL_SIZE')
    doctor = Doctor(package="deepspeed")
    owns = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

    def detect(self, env: "Env") -> bool:
        return "RANK" in env and "LOCAL_SIZE" in env

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE")
        r.int_from(env, "node_rank", "CROSS_RANK", self.title)
        r.int_from(env, "num_nodes", "CROSS_SIZE", self.title, minimum=1)
        # CROSS_RANK/CROSS_SIZE are the launcher's node index and count (launch.py), ranks
        # numbered node by node. LOCAL_SIZE is this node's count only: a host file may give
        # hosts different slot counts (the resolver knows it on one or two nodes by count).
        if env.get("MASTER_ADDR"):
            r.set("master_addr", env["MASTER_ADDR"], "MASTER_ADDR (set by the DeepSpeed launcher)")
        r.int_from(env, "master_port", "MASTER_PORT", self.title, minimum=1)


SOURCE = DeepSpeedLauncher()
