"""torchrun / torch.distributed.run (and legacy torch.distributed.launch, which runs it).

torchrun describes its workers completely; when it was started inside another launcher
(srun, mpirun, a Kubeflow pod) its variables describe the worker and win.

Inferred (docs/inferences.md): nothing beyond the variables, except nproc_per_node =
LOCAL_WORLD_SIZE only with TORCH_ELASTIC_WORKER_IDENTICAL=1 (agents may run different numbers
of workers); GROUP_RANK is the order by lowest rank (torch numbers ranks agent by agent).
"""

from __future__ import annotations

from ..core.description import PER_PROCESS
from . import Doctor, Launch, Source
from ..core.reading import read_counts

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from ..core.reading import Env, Reading


class TorchRun(Source):
    name = "torchrun"
    title = "torchrun"
    family = "torch"
    prefixes = ('TORCHELASTIC_', 'GROUP_RANK', 'GROUP_WORLD_SIZE', 'ROLE_', 'LOCAL_WORLD_SIZE')
    launch = Launch(
        aliases=("torchrun", "torch.distributed.launch", "torchelastic"),
        node_order="torchrun numbers nodes in rendezvous order, not in any host list",
        agent_store=True,  # TORCHELASTIC_USE_AGENT_STORE: the store is the agent's
    )
    doctor = Doctor(package="torch")
    owns = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT")

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_PROCESS
        read_counts(env, r, self.title, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        r.int_from(env, "node_rank", "GROUP_RANK", self.title)
        r.int_from(env, "num_nodes", "GROUP_WORLD_SIZE", self.title, minimum=1)
        lws = r.get("local_world_size")
        # torchrun starts the same number of workers on every node it manages.
        # Agents may start different numbers of workers (torch's _assign_worker_ranks "slow
        # path" sums each agent's local world size), so LOCAL_WORLD_SIZE is this node's count
        # only -- the same on every node when torch runs its identical-workers fast path
        # (TORCH_ELASTIC_WORKER_IDENTICAL=1), or by count on one or two nodes (the resolver).
        if env.get("TORCH_ELASTIC_WORKER_IDENTICAL") == "1":
            r.set("nproc_per_node", lws,
                  "LOCAL_WORLD_SIZE (TORCH_ELASTIC_WORKER_IDENTICAL=1: as many on every node)")
        if env.get("MASTER_ADDR"):
            r.set("master_addr", env["MASTER_ADDR"], "MASTER_ADDR (set by torchrun)")
        r.int_from(env, "master_port", "MASTER_PORT", self.title, minimum=1)
        r.set("job_id", env.get("TORCHELASTIC_RUN_ID"), "TORCHELASTIC_RUN_ID")
        restarts = env.get("TORCHELASTIC_RESTART_COUNT")
        if restarts not in (None, "", "0"):
            r.notes.append(f"torchrun restarted the workers (TORCHELASTIC_RESTART_COUNT={restarts})")


SOURCE = TorchRun()
