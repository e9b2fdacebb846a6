"""`distenv run` hands what discovery found to the command it execs (issue 32, item 2). The
host of every rank went in one environment variable: 10 000 ranks cyclic with fully qualified
names (410 KB) or 50 000 in blocks (256 KB) passed Linux's 128 KiB limit for one variable, and
exec failed with E2BIG (the user saw exit 126). A long list now goes in an inherited memory
file; this execs a real command with 50 000 such ranks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
RANKS, NODES = 50_000, 6_250

RANK = textwrap.dedent(f"""
    import os, sys
    from distenv import run
    from distenv.discovery import pmi
    hosts = [f"nid{{r % {NODES}:06d}}.cluster.example.org" for r in range({RANKS})]  # cyclic
    # as if this rank had just run the exchange: its answer is kept, and asked again it answers
    pmi._done = (os.getpid(), pmi.Exchange(1, {RANKS}, hosts, "fd", 0.0, "t", "kvs_1_0_x"))
    pmi.offer = lambda environ=None: (pmi.Offer("fd", "test"), "")
    sys.exit(run.main(["--", sys.executable, "-c", sys.argv[1]]))
""")
COMMAND = textwrap.dedent("""
    import json, os
    from distenv.discovery import pmi
    from distenv.discovery import complete
    env = complete(need=("master_addr", "num_nodes"))
    got = pmi.inherited()
    print(json.dumps({"pid": os.getpid(), "ranks": got.size, "master": env.master_addr,
                      "node_rank": env.node_rank, "nodes": env.num_nodes,
                      "why": env.provenance["master_addr"],
                      "var": len(os.environ[pmi.HELD_VAR]),
                      "longest": max(len(v) for v in os.environ.values())}))
""")


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs Linux's memfd_create")
def test_distenv_run_hands_off_50000_fully_qualified_ranks():
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": SRC,
           "PMI_RANK": "1", "PMI_SIZE": str(RANKS), "MPI_LOCALRANKID": "0",
           "MPI_LOCALNRANKS": str(RANKS // NODES), "DISTENV_AUTO": "0"}
    p = subprocess.run([sys.executable, "-c", RANK, COMMAND], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["ranks"] == RANKS and got["nodes"] == NODES
    assert got["master"] == "nid000000.cluster.example.org" and got["node_rank"] == 1
    # (the command itself resolves MASTER_ADDR and NODE_RANK from what distenv run exported,
    # and asks for the node count: the hand-off answers, agreeing with NODE_RANK)
    assert got["var"] < 100 and got["longest"] < 128 * 1024  # the list is not in a variable
