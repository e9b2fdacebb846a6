"""Placement proofs under real launchers (issue 13): where the launcher's variables do not
prove rank 0's host or the node order, every rank says unknown; where a documented rule
proves them, every rank gives the same, right answer.

Each layout below is one that broke distenv's promise before issue 13 (measured on the two
namespace nodes), or the ordinary neighbour whose rule the fix relies on:

- Open MPI 4, MPMD ``-np 1 -H node2 : -np 2 -H node1:2`` started on node1: rank 0 runs on
  node2, and ranks 1-2 (on mpirun's host) named mpirun's host as master.
- Open MPI 4 with a rankfile or ``--map-by seq`` putting rank 0 on node2 (same failure), and
  ``-H node2:2,node1:2`` where ORTE still maps rank 0 to mpirun's node (the rule holds).
- Open MPI 5 with ``-H node2:2,node1:2`` started on node1: PRRTE maps by the host list, rank 0
  runs on node2, and ranks 2-3 named node1.
- SLURM heterogeneous steps (``srun A : B``) and het jobs: SLURM_NODEID numbers nodes per
  component while the node list is sorted, so task 0 ran on node2 while distenv named node1;
  ``-m arbitrary`` / SLURM_HOSTFILE: SLURM_NODEID was taken as a node rank out of
  lowest-rank order. Block, cyclic, plane, ``-w`` out of order, pack/nopack suffixes and
  ``-r`` steps: the rule holds and the host of every rank (rank_hosts) is right.
- MPICH with ``-pmi-port`` across nodes: the derived port came from PMI_PORT, which is the
  local proxy's and differs per node, so ranks on two nodes derived different ports.

Every rank runs rank_probe.py (the launcher's own numbering, ``distenv show --json``,
resolve()/export() in process); the truth about placement is each rank's real host name.
"""
from __future__ import annotations

import json
import os

import pytest

import harness
from harness import FAKESSH, MPICH4, MPICH5, NET, NODE_IP, OMPI4, OMPI5, ON_NODE, Layout

pytestmark = [pytest.mark.launcher, pytest.mark.cluster, pytest.mark.timeout(900)]

PY = harness.PY
OMPI4_FLAGS = (OMPI4, "--allow-run-as-root", "--mca", "plm_rsh_agent", FAKESSH,
               "--mca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET)
OMPI5_FLAGS = (OMPI5, "--allow-run-as-root", "--prtemca", "plm_ssh_agent", FAKESSH,
               "--prtemca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET)


def on_node1(*argv):
    return lambda cmd, extra: [ON_NODE, "node1", *argv, *extra, *cmd]


def mpmd(*head, first, second):
    """mpirun HEAD FIRST CMD : SECOND CMD, inside node1."""
    return lambda cmd, extra: [ON_NODE, "node1", *head, *extra, *first, *cmd, ":", *second, *cmd]


def plain(*argv):
    return lambda cmd, extra: [*argv, *extra, *cmd]


def het_step(cmd, extra):
    # An ordinary two-node allocation, one step of two components: task 0 alone on node2.
    return ["salloc", "-N2", "-n4", "srun", *extra, "-N1", "-n1", "-w", "node2", *cmd, ":",
            "-N1", "-n2", "-w", "node1", *cmd]


def het_job(cmd, extra):
    # A heterogeneous job (component 0 on node2) and a step over both components.
    return ["salloc", "-N1", "-n2", "-w", "node2", ":", "-N1", "-n2", "-w", "node1",
            "srun", "--het-group=0,1", *extra, *cmd]


def relative_step(cmd, extra):
    return ["salloc", "-N2", "-n4", "srun", "-N1", "-n1", "-r1", *extra, *cmd]


def lay(launcher, shape, needs, n, truth, argv, hosts=harness.NODES):
    expect = {"openmpi": "openmpi", "slurm": "slurm", "hydra": "mpich"}[truth]
    return Layout(launcher, shape, needs, n, truth, expect, argv, tuple(hosts))


#: name -> (layout, launcher env, what is proven: "known" (every rank names rank 0's host
#: and the node order is right where given) or "unknown" (every rank leaves master_addr None
#: and says to set MASTER_ADDR)).
CASES = {
    # ---- Open MPI 4 -------------------------------------------------------------------------
    "openmpi4-mpmd-rank0-on-node2": (lay(
        "openmpi4", "mpmd", "cluster", 3, "openmpi",
        mpmd(*OMPI4_FLAGS, first=("-np", "1", "-H", "node2"), second=("-np", "2", "-H", "node1:2"))),
        {}, "unknown"),
    "openmpi4-rankfile-rank0-on-node2": (lay(
        "openmpi4", "rankfile", "cluster", 3, "openmpi",
        on_node1(*OMPI4_FLAGS, "-np", "3", "-H", "node1:2,node2:2", "-rf", "{rankfile}")),
        {}, "unknown"),
    "openmpi4-map-by-seq-node2-first": (lay(
        "openmpi4", "seq", "cluster", 2, "openmpi",
        on_node1(*OMPI4_FLAGS, "-np", "2", "--hostfile", "{hostfile}", "--map-by", "seq")),
        {}, "unknown"),
    "openmpi4-hosts-node2-first": (lay(
        "openmpi4", "hosts-21", "cluster", 4, "openmpi",
        on_node1(*OMPI4_FLAGS, "-np", "4", "-H", "node2:2,node1:2")),
        {}, "known"),
    "openmpi4-hostfile-node2-first": (lay(
        "openmpi4", "hostfile-21", "cluster", 4, "openmpi",
        on_node1(*OMPI4_FLAGS, "-np", "4", "--hostfile", "{hostfile}")),
        {}, "known"),
    # ---- Open MPI 5 -------------------------------------------------------------------------
    "openmpi5-hosts-node2-first": (lay(
        "openmpi5", "hosts-21", "cluster", 4, "openmpi",
        on_node1(*OMPI5_FLAGS, "-np", "4", "-H", "node2:2,node1:2")),
        {}, "unknown"),
    # ---- SLURM ------------------------------------------------------------------------------
    "slurm-het-step": (lay("slurm", "het-step", "slurm2", 3, "slurm", het_step), {}, "unknown"),
    "slurm-het-job": (lay("slurm", "het-job", "slurm2", 4, "slurm", het_job), {}, "unknown"),
    "slurm-arbitrary-w": (lay("slurm", "arbitrary", "slurm2", 3, "slurm",
                              plain("srun", "-n3", "-m", "arbitrary", "-w", "node2,node1,node1")),
                          {}, "unknown"),
    "slurm-hostfile": (lay("slurm", "hostfile", "slurm2", 3, "slurm", plain("srun", "-n3")),
                       {"SLURM_HOSTFILE": "{slurm_hostfile}"}, "unknown"),
    "slurm-w-node2-first": (lay("slurm", "w21", "slurm2", 3, "slurm",
                                plain("srun", "-N2", "-n3", "-w", "node2,node1")), {}, "known"),
    "slurm-plane2": (lay("slurm", "plane2", "slurm2", 5, "slurm",
                         plain("srun", "-N2", "-n5", "-m", "plane=2")), {}, "known"),
    "slurm-cyclic-nopack": (lay("slurm", "cyclic-nopack", "slurm2", 3, "slurm",
                                plain("srun", "-N2", "-n3", "-m", "cyclic:cyclic:block,nopack")),
                            {}, "known"),
    "slurm-block-pack": (lay("slurm", "block-pack", "slurm2", 3, "slurm",
                             plain("srun", "-N2", "-n3", "-m", "block,pack")), {}, "known"),
    "slurm-relative": (lay("slurm", "relative", "slurm2", 1, "slurm", relative_step,
                           hosts=("node2",)), {}, "known"),
    # ---- Hydra -pmi-port --------------------------------------------------------------------
    "mpich4-pmi-port-2x2": (lay("mpich4", "pmi-port", "cluster", 4, "hydra",
                                on_node1(MPICH4, "-np", "4", "-hosts", "node1:2,node2:2", "-launcher",
                                         "ssh", "-launcher-exec", FAKESSH, "-pmi-port")),
                            {}, "unknown"),
    "mpich5-pmi-port-2x2": (lay("mpich5", "pmi-port", "cluster", 4, "hydra",
                                on_node1(MPICH5, "-np", "4", "-hosts", "node1:2,node2:2", "-launcher",
                                         "ssh", "-launcher-exec", FAKESSH, "-pmi-port")),
                            {}, "unknown"),
}

_cache: dict = {}


@pytest.fixture(scope="module")
def files():
    """Rankfile and host files the layouts name, under the shared run directory (every node
    sees it; ranks started over the fake ssh run with a fresh environment)."""
    base = harness.run_dir() / "itest"
    base.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, text in (("rankfile", "rank 0=node2 slot=0\nrank 1=node1 slot=0\nrank 2=node1 slot=1\n"),
                      ("hostfile", "node2 slots=2\nnode1 slots=2\n"),
                      ("slurm_hostfile", "node2\nnode1\nnode2\n")):
        path = base / f"placement-{os.getpid()}-{key}"
        path.write_text(text)
        out[key] = str(path)
    yield out
    for path in out.values():
        os.unlink(path)


def _fill(argv, files):
    return [a.format(**files) if "{" in a else a for a in argv]


def run(need, files, name):
    layout, env, _ = CASES[name]
    layout = need(layout)
    if name not in _cache:
        base = layout.argv
        filled = Layout(layout.launcher, layout.shape, layout.needs, layout.nranks, layout.truth,
                        layout.expect, lambda cmd, extra: _fill(base(cmd, extra), files),
                        layout.hosts)
        cmd = [PY, str(harness.PROBE), "--truth", layout.truth]
        try:
            result = harness.launch(filled, cmd, env={k: v.format(**files) for k, v in env.items()},
                                    timeout=180)
            recs = []
            for fname, (out, err) in result["files"].items():
                found = harness.parse_records(out)
                assert len(found) == 1, f"{fname}: {out[-2000:]}\n{err[-2000:]}"
                recs.append(found[0])
            recs.sort(key=lambda r: r["truth"]["rank"])
            _cache[name] = recs
        except (harness.LaunchError, AssertionError) as exc:
            _cache[name] = exc
    got = _cache[name]
    if isinstance(got, Exception):
        pytest.fail(str(got), pytrace=False)
    return layout, got


def view(recs, *fields) -> str:
    return "\n".join(f"  rank {r['truth']['rank']} on {r['hostname']}: "
                     + json.dumps({f: (r['distenv']['json'] or {}).get(f) for f in fields})
                     + f" notes={r['inproc'].get('notes')}" for r in recs)


@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_agrees_or_all_say_unknown(need, files, name):
    """All ranks give one master address and port and one node order, and each is right
    (rank 0's host; nodes ordered by lowest rank) -- or all leave it unknown and say what
    to set. The launcher's own numbering is reproduced on every rank."""
    layout, recs = run(need, files, name)
    want = CASES[name][2]
    assert [r["truth"]["rank"] for r in recs] == list(range(layout.nranks))
    assert {r["hostname"] for r in recs} == set(layout.hosts), "the layout ran elsewhere"
    fields = ("rank", "master_addr", "master_port", "node_rank", "num_nodes", "local_world_size")
    for r in recs:
        d = r["distenv"]["json"]
        assert r["distenv"]["rc"] == 0 and d is not None, r["distenv"]["stderr"]
        assert d["rank"] == r["truth"]["rank"], view(recs, *fields)
    hosts = [r["hostname"] for r in recs]  # index = rank
    by_lowest = list(dict.fromkeys(hosts))
    masters = {r["distenv"]["json"]["master_addr"] for r in recs}
    ports = {r["distenv"]["json"]["master_port"] for r in recs}
    assert len(ports) == 1 and None not in ports, "ranks disagree on the port:\n" + view(recs, *fields)
    assert len(masters) == 1, "ranks disagree on the master:\n" + view(recs, *fields)
    master = masters.pop()
    if want == "unknown":
        assert master is None, f"{name}: the variables prove no master here:\n" + view(recs, *fields)
        for r in recs:  # export refuses, naming what to set
            assert r["export"]["rc"] != 0 and "MASTER_ADDR" in r["export"]["stderr"]
            if layout.truth != "hydra":  # Hydra never reveals a master: no note needed
                assert any("MASTER_ADDR" in n for n in r["inproc"]["notes"]), view(recs, *fields)
    elif len(by_lowest) == 1:
        assert master == "127.0.0.1"
    else:
        assert master in (hosts[0], NODE_IP[hosts[0]]), view(recs, *fields)
    for r in recs:
        d = r["distenv"]["json"]
        if d["node_rank"] is not None:
            assert d["node_rank"] == by_lowest.index(r["hostname"]), view(recs, *fields)
        if d["local_world_size"] is not None:
            assert d["local_world_size"] == hosts.count(r["hostname"]), view(recs, *fields)
        if d["num_nodes"] is not None:
            assert d["num_nodes"] == len(by_lowest), view(recs, *fields)
        placed = r["inproc"]["fields"].get("rank_hosts")
        if placed is not None:
            assert list(placed) == hosts, f"rank_hosts {placed} but the ranks ran on {hosts}"
    if want == "known" and layout.launcher == "slurm" and len(by_lowest) > 1:
        # The SLURM rule also gives the host of every rank; and node ranks are known.
        assert all(r["inproc"]["fields"].get("rank_hosts") is not None for r in recs) or \
            "rank_hosts" not in recs[0]["inproc"]["fields"]
        assert {r["distenv"]["json"]["node_rank"] for r in recs} == set(range(len(by_lowest)))


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n][2] == "unknown"
                                  and not n.startswith("mpich")])
def test_the_layout_is_the_one_that_misled(need, files, name):
    """The unknown cases are real: rank 0 runs where the old rule did not say (not on
    mpirun's host, not on the first host of the node list) -- else the test proves nothing."""
    layout, recs = run(need, files, name)
    rank0 = recs[0]["hostname"]
    if layout.launcher.startswith("openmpi"):
        assert rank0 != "node1", "mpirun ran on node1; rank 0 must be elsewhere here"
    else:
        assert rank0 == "node2", "the sorted node list starts with node1; rank 0 must not"


@pytest.mark.parametrize("name", ["mpich4-pmi-port-2x2", "mpich5-pmi-port-2x2"])
def test_pmi_port_is_not_a_job_key(need, files, name):
    """With -pmi-port, PMI_PORT is each node's proxy (measured: node1:A on node1, node2:B
    on node2); a port derived from it differed between the nodes. One port on every rank."""
    layout, recs = run(need, files, name)
    assert {r["hostname"] for r in recs} == {"node1", "node2"}
    assert {r["distenv"]["json"]["world_size"] for r in recs} == {None}  # no PMI_SIZE
    assert len({r["distenv"]["json"]["master_port"] for r in recs}) == 1
