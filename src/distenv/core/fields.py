"""The words a description is made of: its fields, its two kinds of launch, and the kinds of
its provenance entries and notes (`distenv.core.description.Why`, `Note`).

The floor of the package: it imports nothing, so the modules that work on a description
(`export`, `checked`) need not import the description's module, which reaches them through
its convenience methods (`DistEnv.export`, `checked`, `require`).
"""

#: The public fields, in the order `distenv show --json` prints them. This is a contract.
FIELDS = (
    "launcher",
    "platform",
    "launch",
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "nproc_per_node",
    "master_addr",
    "master_port",
    "hosts",
    "rank_hosts",
    "job_id",
)

PER_PROCESS = "per-process"
PER_NODE = "per-node"

# Kinds of a provenance entry (`Why.kind`) or a note (`Note.kind`); see `distenv.core.description.Why`.
DEFAULT = "default"
DERIVED = "derived"
#: Set by the user by hand (MASTER_ADDR, MASTER_PORT), not by the launcher or distenv.
GIVEN = "given"
UNKNOWN = "unknown"
#: A note's kind: discovery was asked for these fields and no service could answer; the
#: note says why and what to do (an error about those fields repeats it: distenv.core.export).
DECLINED = "declined"
