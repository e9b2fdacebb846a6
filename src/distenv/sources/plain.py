"""Plain torch variables (RANK, WORLD_SIZE, ...) with no launcher marker.

Set by hand, by a platform that launches processes itself (Azure ML PyTorch jobs), or by
older `torch.distributed.launch`. RANK without WORLD_SIZE (or the reverse) cannot be
trusted and is an error; LOCAL_RANK alone (e.g. `--local_rank` style scripts) is fine only
when it is 0.

Inferred (docs/inferences.md): nothing; the resolver's one-node rules apply.
"""

from __future__ import annotations

from ..description import PER_PROCESS
from ..errors import DistEnvError
from ..reading import get_int
from . import Source
from ._common import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..reading import Env, Reading


class Plain(Source):
    name = "env"
    title = "the RANK/WORLD_SIZE variables"
    family = "torch"
    prefixes = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'GROUP_RANK', 'MASTER_ADDR', 'MASTER_PORT')
    owns = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    aliases = ("env", "plain")

    def detect(self, env: "Env") -> bool:
        has_rank, has_size = "RANK" in env, "WORLD_SIZE" in env
        if has_rank != has_size:
            present, missing = ("RANK", "WORLD_SIZE") if has_rank else ("WORLD_SIZE", "RANK")
            size = get_int(env, "WORLD_SIZE") if has_size else None
            if size == 1:  # WORLD_SIZE=1 alone describes a single process truthfully
                return True
            raise DistEnvError(
                f"{present}={env[present]!r} is set but {missing} is not, and no launcher "
                f"variables were found. Fix: set {missing} too, unset {present}, or run under "
                "your launcher (mpirun, srun, torchrun)."
            )
        if not has_rank:
            local = get_int(env, "LOCAL_RANK")
            if local:
                raise DistEnvError(
                    f"LOCAL_RANK={local} is set but RANK and WORLD_SIZE are not, and no launcher "
                    "variables were found: distenv cannot tell the rest of the job. "
                    "Fix: set RANK and WORLD_SIZE, or run under your launcher."
                )
            return False  # LOCAL_RANK=0 alone: a single process
        return True

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        if "RANK" not in env:
            r.set("rank", 0, "WORLD_SIZE=1: the only rank")
        for var in ("NODE_RANK", "GROUP_RANK"):
            if var in env:
                r.int_from(env, "node_rank", var, self.title)
                break
        for var in ("GROUP_WORLD_SIZE", "NNODES"):
            if var in env:
                r.int_from(env, "num_nodes", var, self.title, minimum=1)
                break
        if env.get("MASTER_ADDR"):
            r.set("master_addr", env["MASTER_ADDR"], "MASTER_ADDR")
        r.int_from(env, "master_port", "MASTER_PORT", self.title, minimum=1)


SOURCE = Plain()
