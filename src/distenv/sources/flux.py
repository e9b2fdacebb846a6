"""Flux (`flux run` / `flux submit`).

Inferred (docs/inferences.md): only the port, from FLUX_JOB_ID (the same on every task).
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Source
from ._common import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class Flux(Source):
    name = "flux"
    title = "Flux"
    family = "flux"
    pass_on = "flux run passes the environment"
    prefixes = ('FLUX_',)
    can_be_per_node = True
    services = ("apinfo",)  # Flux's cray-pals plugin writes one (sources/pals.py)
    version_command = "flux"

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "FLUX_TASK_RANK", "FLUX_JOB_SIZE", "FLUX_TASK_LOCAL_ID")
        r.int_from(env, "num_nodes", "FLUX_JOB_NNODES", self.title, minimum=1)
        r.set("job_id", env.get("FLUX_JOB_ID"), "FLUX_JOB_ID")
        if env.get("FLUX_JOB_ID"):
            r.port_key = "flux:" + env["FLUX_JOB_ID"]


SOURCE = Flux()
