"""MVAPICH2 (mpirun_rsh or its Hydra): MV2_COMM_WORLD_* variables.

Inferred (docs/inferences.md): nothing; node rank and master are unknown across nodes.
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Doctor, Launch, PassOn, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class Mvapich2(Source):
    name = "mvapich2"
    title = "MVAPICH2"
    family = "mpi"
    launch = Launch(can_be_per_node=True)
    passing = PassOn(how="mpiexec -genv {name} {value}")
    doctor = Doctor(
        command="mpiexec",
        programs=("mpiexec", "mpirun", "mpirun_rsh", "mpiexec.hydra", "hydra_pmi_proxy"),
        daemons=("hydra_pmi_proxy",),
    )
    prefixes = ('MV2_', 'MPIRUN_')

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
                    "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE")


SOURCE = Mvapich2()
