"""`distenv show --map` (and `distenv doctor`'s map) under the real launchers.

Every rank first reports itself from its launcher's own variables (OMPI_COMM_WORLD_RANK or
PMI_RANK) and `hostname`, then execs `distenv show --map` (so the parent of distenv is still
the launcher's daemon, and the service's guards accept it). Rank 0's map must list one row
per node whose host and ranks are exactly what the ranks said about themselves, nodes
numbered by their lowest rank; every other rank prints nothing; the job exits 0.

- one host: Open MPI 4 ``mpirun -np 4`` -- one row, this host, ranks 0-3 (no service asked:
  the environment says one node);
- the two namespace nodes, mpirun/mpiexec started inside node1 with rank 0 on node2 (as in
  test_pmix_discovery.py and test_pmi_discovery.py): Open MPI 4 (MPMD ``-np 2 -H node2:2 :
  -np 2 -H node1:2``; ORTE otherwise puts rank 0 on mpirun's node), Open MPI 5
  (``-H node2:2,node1:2``) and MPICH 4 (``-hosts node2:2,node1:2``): the environment alone
  does not place the ranks, so the map comes from PMIx and PMI-1 (and, under MPICH, `--json`
  and `distenv doctor`'s map);
- the two-node SLURM, ``srun -N2 -n4 -m cyclic``: its variables place every rank (no service).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import harness
from harness import FAKESSH, MPICH4, NET, OMPI4, OMPI5, ON_NODE, Layout

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(600)]

DISTENV = str(Path(sys.executable).parent / "distenv")
TIMEOUT = 120
#: Each rank's self-report from its launcher's variables, then the command (exec: same pid).
SELF = ('echo "SELF host=$(hostname) rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-?}}}"; '
        'exec "$0" "$@"')


def _ompi4_mpmd(cmd, extra):
    flags = (OMPI4, "--allow-run-as-root", "--mca", "plm_rsh_agent", FAKESSH,
             "--mca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET)
    return [ON_NODE, "node1", *flags, "-np", "2", "-H", "node2:2", *extra, *cmd, ":",
            "-np", "2", "-H", "node1:2", *extra, *cmd]


def _ompi5(cmd, extra):
    return [ON_NODE, "node1", OMPI5, "--allow-run-as-root", "--prtemca", "plm_ssh_agent", FAKESSH,
            "--prtemca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET,
            "-np", "4", "-H", "node2:2,node1:2", *extra, *cmd]


def _mpich4(cmd, extra):
    return [ON_NODE, "node1", MPICH4, "-np", "4", "-hosts", "node2:2,node1:2", "-launcher", "ssh",
            "-launcher-exec", FAKESSH, *extra, *cmd]


TWO_NODES = {
    "openmpi4": Layout("openmpi4", "map-rank0-node2", "cluster", 4, "openmpi", "openmpi",
                       _ompi4_mpmd, ("node2", "node1")),
    "openmpi5": Layout("openmpi5", "map-rank0-node2", "cluster", 4, "openmpi", "openmpi", _ompi5,
                       ("node2", "node1")),
    "mpich4": Layout("mpich4", "map-rank0-node2", "cluster", 4, "hydra", "mpich", _mpich4,
                     ("node2", "node1")),
}


def run(lay: Layout, *args: str, status: int = 0):
    """(every rank's (host, rank) from its launcher, {rank: the lines it printed after});
    the launcher must exit with `status` and every rank report."""
    result = harness.launch(lay, ["/bin/sh", "-c", SELF, DISTENV, *args], timeout=TIMEOUT,
                            check=status == 0)
    assert (result["rc"], len(result["files"])) == (status, lay.nranks), \
        harness.describe_failure(lay, result, kept=False)
    selves, printed = [], {}
    for name, (out, err) in result["files"].items():
        lines = out.splitlines()
        m = re.fullmatch(r"SELF host=(\S+) rank=(\d+)", lines[0] if lines else "")
        assert m, f"rank file {name}: no self-report\n{out}\n{err}"
        selves.append((m.group(1), int(m.group(2))))
        printed[int(m.group(2))] = (lines[1:], err)
    assert sorted(r for _, r in selves) == list(range(lay.nranks)), selves
    return sorted(selves, key=lambda s: s[1]), printed


def expected_rows(selves):
    """(node, host, rank list, local size) from what the ranks said, nodes by lowest rank."""
    nodes: "dict[str, list[int]]" = {}
    for host, rank in selves:
        nodes.setdefault(host, []).append(rank)
    return [(i, host, ranks, len(ranks)) for i, (host, ranks) in enumerate(nodes.items())]


def table_rows(lines):
    """The rows of the printed map: (node, host, ranks text, local, holds)."""
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["node", "host", "ranks"])
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("master:"):
            return rows
        node, host, ranks, local, *holds = line.split(None, 4)
        rows.append((int(node), host, ranks, int(local), holds[0] if holds else ""))
    raise AssertionError(f"no master line after the table:\n" + "\n".join(lines))


def ranks_text(ranks):
    """Runs of consecutive ranks as a-b, joined by commas (0,2-3)."""
    runs = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def check_map(selves, printed, multi_node: bool):
    lines, err = printed[0]
    detail = "\n".join(lines) + "\n" + err
    want = expected_rows(selves)
    rows = table_rows(lines)
    assert [(n, h, r, l) for n, h, r, l, _ in rows] == \
        [(n, h, ranks_text(r), l) for n, h, r, l in want], detail
    # rank 0's node holds rank 0 and the master (its host by name across nodes, loopback on one)
    assert [holds for *_, holds in rows] == ["rank 0, master"] + [""] * (len(rows) - 1), detail
    master = next(line for line in lines if line.startswith("master: "))
    if multi_node:
        assert master.split()[1].split(":")[0] == want[0][1], detail
    else:
        assert master.split()[1].startswith("127.0.0.1:"), detail
    assert not any(line.startswith("unknown:") for line in lines), detail
    for rank, (other, err) in printed.items():  # printed once, by rank 0
        if rank:
            assert other == [], (rank, other, err)
    return lines


def test_one_host_mpirun_np4(need):
    lay = need(harness.layout("openmpi4", "np4"))
    selves, printed = run(lay, "show", "--map")
    assert {h for h, _ in selves} == {harness.LOCALHOST}, selves
    lines = check_map(selves, printed, multi_node=False)
    assert table_rows(lines)[0][:4] == (0, harness.LOCALHOST, "0-3", 4), lines
    placement = next(line for line in lines if line.startswith("placement: "))
    assert placement.startswith("placement: one node"), lines  # no service asked


@pytest.mark.parametrize("name", sorted(TWO_NODES))
def test_two_nodes_rank0_on_node2(need, name):
    lay = need(TWO_NODES[name])
    selves, printed = run(lay, "show", "--map")
    assert selves == [("node2", 0), ("node2", 1), ("node1", 2), ("node1", 3)], selves
    lines = check_map(selves, printed, multi_node=True)
    service = "PMI-1 key-value exchange" if name.startswith("mpich") else "PMIx placement"
    assert next(l for l in lines if l.startswith("placement: ")).startswith(
        f"placement: {service}"), lines


def test_srun_cyclic_is_placed_from_its_variables(need):
    """srun -N2 -n4 -m cyclic: SLURM's variables place every rank (here node1 holds 0,2-3 and
    node2 1), so no service is asked, and a row's ranks are not one run."""
    lay = need(harness.layout("slurm", "N2-n4-cyclic"))
    selves, printed = run(lay, "show", "--map")
    lines = check_map(selves, printed, multi_node=True)
    assert [r[2] for r in table_rows(lines)] == [ranks_text(w[2]) for w in expected_rows(selves)]
    assert len(table_rows(lines)) == 2 and "," in table_rows(lines)[0][2] + table_rows(lines)[1][2], lines
    assert next(l for l in lines if l.startswith("placement: ")).startswith(
        "placement: SLURM node list and tasks per node, placed by distribution cyclic"), lines


def test_two_nodes_json_and_doctor_mpich(need):
    lay = need(TWO_NODES["mpich4"])
    selves, printed = run(lay, "show", "--map", "--json")
    lines, err = printed[0]
    got = json.loads(lines[-1])
    want = expected_rows(selves)
    assert [(n["node_rank"], n["host"], n["ranks"], n["local_world_size"]) for n in got["nodes"]] \
        == [tuple(w) for w in want], (got, err)
    assert [(n["rank0"], n["master"]) for n in got["nodes"]] == [(True, True), (False, False)], got
    assert (got["world_size"], got["num_nodes"], got["master_addr"], got["unknown"]) == \
        (4, 2, "node2", []), got
    assert all(not p[0] for r, p in printed.items() if r), printed
    # doctor: every rank checks and completes the placement; rank 0's report holds the map.
    # It exits 1: its launch check still reports that the environment alone names no master
    # (a framework that does not ask the service needs MASTER_ADDR).
    selves, printed = run(lay, "doctor", "--json", status=1)
    reports = {rank: json.loads(lines[-1]) for rank, (lines, _) in printed.items()}
    got = reports[0]["map"]
    assert [(n["node_rank"], n["host"], n["ranks"], n["local_world_size"]) for n in got["nodes"]] \
        == [tuple(w) for w in want], got
    assert (got["master_addr"], got["placement"].startswith("PMI-1")) == ("node2", True), got
    assert all("map" not in reports[r] for r in (1, 2, 3)), reports
    found = [f for f in reports[0]["findings"] if f["topic"] == "map"]
    assert [(f["level"], "node2" in f["message"]) for f in found] == [("info", True)], found
    assert any(f["topic"] == "launch" and "rank 0's address is unknown" in f["message"]
               for f in reports[0]["findings"]), reports[0]["findings"]
