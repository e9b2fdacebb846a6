#!/usr/bin/env python3
"""Turn the JSON lines printed by record_env.py (one per rank) into one fixture file.

    collect.py --layout NAME --cmd "launcher command" --expect N --out FILE < ranks.jsonl

Writes {"layout", "launcher_cmd", "launcher_version", "rank_var", "ranks": [{"hostname",
"env"}, ...]} with ranks sorted by the launcher's own rank variable: the first of RANK_VARS
that every rank has (RANK before the MPI ones, so torchrun under srun sorts by worker;
HOROVOD_RANK for horovodrun's Gloo mode; the
MPI ones before SLURM_PROCID, so mpirun inside a batch job sorts by MPI rank). Lines that
are not JSON objects (launcher chatter) are ignored; --drop NAME removes a variable the
recording harness itself set (SLURM_CONF). Fails when the count differs from
--expect, so a broken layout never silently writes a short fixture.
"""
from __future__ import annotations

import argparse
import json
import sys

RANK_VARS = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PMI_ID", "SLURM_PROCID")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", required=True)
    ap.add_argument("--cmd", required=True)
    ap.add_argument("--version", default="")
    ap.add_argument("--expect", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--drop", action="append", default=[],
                    help="variable set by the recording harness itself, not the launcher")
    a = ap.parse_args()

    ranks = []
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "env" in rec:
            for name in a.drop:
                rec["env"].pop(name, None)
            ranks.append(rec)
    if len(ranks) != a.expect:
        print(f"{a.layout}: expected {a.expect} rank records, got {len(ranks)}", file=sys.stderr)
        return 1
    rank_var = next((v for v in RANK_VARS if all(v in r["env"] for r in ranks)), None)
    if rank_var:
        ranks.sort(key=lambda r: int(r["env"][rank_var]))
    doc = {
        "layout": a.layout,
        "launcher_cmd": a.cmd,
        "launcher_version": a.version,
        "rank_var": rank_var,
        "ranks": [{"hostname": r["hostname"], "env": r["env"],
                   **({"apinfo": r["apinfo"]} if "apinfo" in r else {})} for r in ranks],
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
