"""Run by torchrun in test_platform_master.py: what distenv resolves, beside torchrun's own
MASTER_ADDR, as one JSON line."""
import json
import os

import distenv

d = distenv.resolve()
print(json.dumps({"rank": d.rank, "launcher": d.launcher, "platform": d.platform,
                  "master_addr": d.master_addr, "env_master": os.environ["MASTER_ADDR"],
                  "hosts": d.hosts, "num_nodes": d.num_nodes, "notes": [str(n) for n in d.notes]}),
      flush=True)
