"""Cray PALS (PBS `mpiexec` on HPE/Cray systems).

There is no PALS world-size variable: PMI_SIZE gives it. PALS_LOCAL_SIZE is the *local*
size. The node list is only in the file $PBS_NODEFILE, which resolution does not read.

Inferred (docs/inferences.md): node_rank = PALS_NODEID, PALS's node index of the
application (not measured here: no PALS); master unknown; port from PALS_APID.
"""

from __future__ import annotations

from ..description import PER_PROCESS
from . import Source
from ._common import first_int

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..reading import Env, Reading


class Pals(Source):
    name = "pals"
    title = "Cray PALS"
    family = "mpi"
    pass_on = "mpiexec --env {name}={value}"
    prefixes = ('PALS_', 'PMI_')
    can_be_per_node = True

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        r.int_from(env, "rank", "PALS_RANKID", self.title)
        r.int_from(env, "world_size", "PMI_SIZE", self.title, minimum=1)
        value, var = first_int(env, ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"), self.title)
        r.set("local_rank", value, f"{var}={value}")
        value, var = first_int(env, ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"), self.title)
        r.set("local_world_size", value, f"{var}={value}")
        r.int_from(env, "node_rank", "PALS_NODEID", self.title)
        job = env.get("PBS_JOBID") or env.get("PALS_APID")
        r.set("job_id", job, "PBS_JOBID" if env.get("PBS_JOBID") else "PALS_APID")
        if env.get("PALS_APID"):
            r.port_key = "pals:" + env["PALS_APID"]


SOURCE = Pals()
