"""Flux (`flux run` / `flux submit`).

Inferred (docs/inferences.md): only the port, from FLUX_JOB_ID (the same on every task).
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Doctor, Launch, PassOn, Services, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class Flux(Source):
    name = "flux"
    title = "Flux"
    family = "flux"
    launch = Launch(can_be_per_node=True)
    services = Services("apinfo")
    passing = PassOn(how="flux run passes the environment")
    doctor = Doctor(command="flux")
    prefixes = ('FLUX_',)

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "FLUX_TASK_RANK", "FLUX_JOB_SIZE", "FLUX_TASK_LOCAL_ID")
        nodes = r.int_from(env, "num_nodes", "FLUX_JOB_NNODES", self.title, minimum=1)
        if nodes is not None and nodes == r.get("world_size"):
            # FLUX_JOB_NNODES counts the nodes hosting tasks (flux-core's job environment
            # docs): as many as the tasks, one on each (what a per-node launch asks).
            r.set("local_world_size", 1, "FLUX_JOB_NNODES = FLUX_JOB_SIZE: one task per node")
        r.set("job_id", env.get("FLUX_JOB_ID"), "FLUX_JOB_ID")
        if env.get("FLUX_JOB_ID"):
            r.port_key = "flux:" + env["FLUX_JOB_ID"]


SOURCE = Flux()
