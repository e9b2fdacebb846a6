"""Plain torch variables (RANK, WORLD_SIZE, ...) with no launcher marker.

Set by hand, by a platform that launches processes itself (Azure ML PyTorch jobs), or by
older `torch.distributed.launch`. RANK without WORLD_SIZE (or the reverse) cannot be
trusted and is an error; LOCAL_RANK alone (e.g. `--local_rank` style scripts) is fine only
when it is 0.

Lightning's on-prem launch ("Run on an on-prem cluster": on every node MASTER_ADDR,
MASTER_PORT, WORLD_SIZE = the total number of processes and NODE_RANK, then one
``python train.py`` per node whose Trainer(devices=N, num_nodes=M) starts the node's N
workers) is a *per-node* launch: WORLD_SIZE and NODE_RANK with neither RANK nor LOCAL_RANK.
It is read as Lightning reads it (``LightningEnvironment``: ``creates_processes_externally``
is False without LOCAL_RANK, ``node_rank`` from NODE_RANK, the world from WORLD_SIZE); the
processes per node are not in the environment: DISTENV_NPROC_PER_NODE or the Trainer's
``devices`` give them, and num_nodes = WORLD_SIZE / processes per node (not a whole number:
an error naming both).

Inferred (docs/inferences.md): nothing; the resolver's one-node rules apply.
"""

from __future__ import annotations

from ..core.description import PER_NODE, PER_PROCESS
from ..errors import DistEnvError
from ..knobs import LAUNCHER
from ..core.reading import get_int
from . import Launch, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class Plain(Source):
    name = "env"
    title = "the RANK/WORLD_SIZE variables"
    family = "torch"
    prefixes = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'GROUP_RANK', 'MASTER_ADDR', 'MASTER_PORT')
    owns = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    launch = Launch(
        aliases=("env", "plain"),
        # no launcher passes variables on here: whoever set RANK and WORLD_SIZE sets the master too
        master_unknown="RANK and WORLD_SIZE are set but MASTER_ADDR, rank 0's host, is not Fix: "
                       "set MASTER_ADDR=<rank 0's host> (and MASTER_PORT) wherever RANK and "
                       "WORLD_SIZE are set, the same on every rank",
    )

    def detect(self, env: "Env") -> bool:
        has_rank, has_size = "RANK" in env, "WORLD_SIZE" in env
        if has_rank != has_size:
            present, missing = ("RANK", "WORLD_SIZE") if has_rank else ("WORLD_SIZE", "RANK")
            size = get_int(env, "WORLD_SIZE") if has_size else None
            if size == 1:  # WORLD_SIZE=1 alone describes a single process truthfully
                return True
            if _per_node(env):
                return True
            context, first = _context(env)
            if has_size and "LOCAL_RANK" in env and "NODE_RANK" in env:
                # What Lightning's own launcher gives the workers it starts (LOCAL_RANK,
                # NODE_RANK, WORLD_SIZE = devices x nodes; sources/lightning_node.py): the rank
                # is node_rank x devices + local_rank, and the devices are the Trainer's.
                raise DistEnvError(
                    f"WORLD_SIZE={env['WORLD_SIZE']!r}, NODE_RANK={env['NODE_RANK']!r} and "
                    f"LOCAL_RANK={env['LOCAL_RANK']!r} are set but RANK is not, {context}: a "
                    "worker Lightning started, whose rank depends on the Trainer's devices. Fix: "
                    f"{first}pass distenv.lightning.DistenvEnvironment() to the Trainer "
                    "(plugins=[...]) or call distenv.lightning.patch() before building it, so "
                    "that the node hands its description to its workers; or set RANK for each "
                    "worker."
                )
            if has_size and "LOCAL_RANK" in env:
                raise DistEnvError(
                    f"WORLD_SIZE={env['WORLD_SIZE']!r} and LOCAL_RANK={env['LOCAL_RANK']!r} are "
                    f"set but RANK is not, {context}. Fix: {first}a worker "
                    "needs RANK too; a process per node (whose workers Lightning or `distenv "
                    "run` starts) has NODE_RANK and no LOCAL_RANK: unset LOCAL_RANK there."
                )
            if has_size:
                raise DistEnvError(
                    f"WORLD_SIZE={env['WORLD_SIZE']!r} is set but neither RANK nor NODE_RANK is, "
                    f"{context}. Fix: {first}for one process per node whose "
                    "workers Lightning or `distenv run` starts, set NODE_RANK (and MASTER_ADDR, "
                    "MASTER_PORT) on each node; for one process per worker set RANK; or unset "
                    "WORLD_SIZE, or run under your launcher (mpirun, srun, torchrun)."
                )
            raise DistEnvError(
                f"{present}={env[present]!r} is set but {missing} is not, {context}. "
                f"Fix: {first}set {missing} too, unset {present}, or run under "
                "your launcher (mpirun, srun, torchrun)."
            )
        if not has_rank:
            local = get_int(env, "LOCAL_RANK")
            if local:
                context, first = _context(env)
                raise DistEnvError(
                    f"LOCAL_RANK={local} is set but RANK and WORLD_SIZE are not, {context}: "
                    "distenv cannot tell the rest of the job. "
                    f"Fix: {first}set RANK and WORLD_SIZE, or run under your launcher."
                )
            return False  # LOCAL_RANK=0 alone: a single process
        return True

    def read(self, env: "Env", r: "Reading") -> None:
        if _per_node(env):
            self._read_per_node(env, r)
            return
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

    def _read_per_node(self, env: "Env", r: "Reading") -> None:
        """Lightning's on-prem launch: this process stands for node NODE_RANK of a job of
        WORLD_SIZE processes (see the module docstring)."""
        r.launch = PER_NODE
        r.int_from(env, "node_rank", "NODE_RANK", self.title)
        size = r.int_from(env, "world_size", "WORLD_SIZE", self.title, minimum=1)
        r.why["world_size"] = f"WORLD_SIZE={size} (the total number of processes, as Lightning's on-prem launch sets it)"
        r.nproc_from_world = True
        if env.get("MASTER_ADDR"):
            r.set("master_addr", env["MASTER_ADDR"], "MASTER_ADDR")
        r.int_from(env, "master_port", "MASTER_PORT", self.title, minimum=1)


def _context(env: "Env") -> "tuple[str, str]":
    """(why only the torch variables were read, the fix that comes first) for the errors of
    `Plain.detect`: no launcher matched, or DISTENV_LAUNCHER forces this source while
    another launcher's variables are there to read."""
    from . import LAUNCHERS  # the registry (this module is loaded from it)

    found = [(entry, marker) for entry in LAUNCHERS if entry.name != Plain.name
             for marker in (entry.present(env),) if marker is not None]
    forced = LAUNCHER.raw(env) or ""
    if forced:
        if not found:
            return f"and DISTENV_LAUNCHER={forced} makes distenv read only these variables", ""
        entry, marker = found[0]
        title = entry.load().title
        return (f"and DISTENV_LAUNCHER={forced} makes distenv read only these variables, not "
                f"{title}'s ({marker} is set)",
                f"unset DISTENV_LAUNCHER so that distenv reads {title}'s variables; or ")
    if found:
        names = ", ".join(marker for _, marker in found)
        return f"and the launcher variables present ({names}) do not describe this process", ""
    return "and no launcher variables were found", ""


def _per_node(env: "Env") -> bool:
    """WORLD_SIZE and NODE_RANK without RANK or LOCAL_RANK: one process per node (Lightning's
    on-prem launch). With LOCAL_RANK the process is a worker, whose RANK must be given."""
    return ("WORLD_SIZE" in env and "NODE_RANK" in env and "RANK" not in env
            and "LOCAL_RANK" not in env)


SOURCE = Plain()
