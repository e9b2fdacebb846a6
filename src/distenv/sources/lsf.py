"""LSF `jsrun` (IBM Job Step Manager).

Inferred (docs/inferences.md): only the port, from LSB_JOBID and the jsrun step's namespace.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Doctor, Launch, PassOn, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class Jsrun(Source):
    name = "lsf"
    title = "LSF jsrun"
    family = "lsf"
    launch = Launch(aliases=("lsf", "jsrun"), can_be_per_node=True)
    passing = PassOn(how="jsrun passes the environment")
    doctor = Doctor(command="jsrun", programs=("jsrun",))
    prefixes = ('JSM_', 'LSB_')

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE",
                    "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE")
        job = env.get("LSB_JOBID")
        r.set("job_id", job, "LSB_JOBID")
        if job:
            # Several jsrun steps of one job may run at once: the step id tells them apart.
            r.port_key = f"lsf:{job}:{env.get('JSM_NAMESPACE_ID', env.get('PMIX_NAMESPACE', ''))}"


SOURCE = Jsrun()
