"""The resolver on environments recorded from the real launchers (tests/fixtures/launchers,
written by integrations/record/): every rank of a job, checked against the launcher's own
numbering and against each other."""

import glob
import json
import os

import pytest

from distenv import DistEnvError, resolve

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = sorted(glob.glob(os.path.join(HERE, "..", "fixtures", "launchers", "*.json")))

# layout prefix -> (expected launcher, the launcher's local-rank variable)
FAMILIES = [
    ("slurm-srun-n1-torchrun", "torchrun", "LOCAL_RANK"),
    ("cluster-srun-torchrun", "torchrun", "LOCAL_RANK"),
    ("slurm-sbatch-openmpi", "openmpi", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("slurm-sbatch-mpich", "mpich", "MPI_LOCALRANKID"),
    ("slurm-sbatch-intelmpi", "intelmpi", "MPI_LOCALRANKID"),
    ("cluster-sbatch-openmpi", "openmpi", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("cluster-sbatch-mpich", "mpich", "MPI_LOCALRANKID"),
    ("slurm-sbatch-script", "none", None),
    ("cluster-sbatch-script", "none", None),
    ("cluster-salloc-shell", "none", None),
    ("cluster-sbatch-intelmpi", "intelmpi", "MPI_LOCALRANKID"),
    ("cluster-sbatch-openmpi", "openmpi", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("slurm-salloc-shell", "none", None),
    ("no-launcher", "none", None),
    ("openmpi", "openmpi", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("cluster-openmpi", "openmpi", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpich", "mpich", "MPI_LOCALRANKID"),
    ("cluster-mpich", "mpich", "MPI_LOCALRANKID"),
    ("intelmpi", "intelmpi", "MPI_LOCALRANKID"),
    ("cluster-intelmpi", "intelmpi", "MPI_LOCALRANKID"),
    ("slurm", "slurm", "SLURM_LOCALID"),
    ("cluster-srun", "slurm", "SLURM_LOCALID"),
    ("torchrun", "torchrun", "LOCAL_RANK"),
]


# The namespace cluster's node addresses (integrations/cluster/env.sh).
NODE_ADDRS = {"node1": "10.213.77.11", "node2": "10.213.77.12"}


def family(layout):
    for prefix, launcher, local_var in FAMILIES:
        if layout.startswith(prefix):
            return launcher, local_var
    raise AssertionError(f"no family for {layout}")


def load(path):
    with open(path) as f:
        return json.load(f)


def test_recordings_exist():
    assert len(FILES) >= 20


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p)[:-5] for p in FILES])
def test_recorded_job(path, no_gpus):
    rec = load(path)
    launcher, local_var = family(rec["layout"])
    ranks = rec["ranks"]
    envs = [resolve(r["env"]) for r in ranks]
    assert {e.launcher for e in envs} == {launcher}, [e.explain() for e in envs]
    if launcher == "none":
        assert [(e.rank, e.world_size) for e in envs] == [(0, 1)]
        if rec["layout"].startswith(("slurm", "cluster")):
            assert any("srun" in n for n in envs[0].notes)
        return
    n = len(ranks)
    truth = [int(r["env"][rec["rank_var"]]) for r in ranks]
    assert [e.rank for e in envs] == truth
    assert sorted(truth) == list(range(n))
    assert {e.launch for e in envs} == {"per-process"}
    for e, r in zip(envs, ranks):
        assert e.local_rank == int(r["env"][local_var])
    hosts = {}
    for e, r in zip(envs, ranks):
        hosts.setdefault(r["hostname"], []).append(e)
    for members in hosts.values():
        assert sorted(e.local_rank for e in members) == list(range(len(members)))
        assert {e.local_world_size for e in members} == {len(members)}
    if "pmi-port" in rec["layout"]:
        assert {e.world_size for e in envs} == {None}
        with pytest.raises(DistEnvError, match="WORLD_SIZE"):
            envs[0].export({})
    else:
        assert {e.world_size for e in envs} == {n}
    assert {e.num_nodes for e in envs} <= {len(hosts), None}
    if len(hosts) == 1:
        assert {e.node_rank for e in envs} <= {0, None}
    if rec["layout"].endswith("-from-head"):
        # mpirun ran on a host with no rank. Rank 0 always knows (its daemon is not mpirun's)
        # and refuses to name an address, so a job that needs one fails on rank 0 at once.
        rank0 = envs[truth.index(0)]
        assert rank0.master_addr is None and any("MASTER_ADDR" in n for n in rank0.notes)
        if rec["layout"].startswith("cluster-openmpi4"):
            # Open MPI 4 tells every rank: more daemons than nodes with ranks.
            assert {e.master_addr for e in envs} == {None}
        return
    # Every rank must agree on where and how to meet.
    assert len({(e.master_addr, e.master_port) for e in envs}) == 1
    # torchrun and Ray Train start the rendezvous themselves and say where: their address
    if len(hosts) == 1 and launcher not in ("torchrun", "ray") and "pmi-port" not in rec["layout"]:
        assert envs[0].master_addr == "127.0.0.1"
    for e in envs:
        if e.world_size and (e.master_addr is not None or len(hosts) == 1):
            written = e.export({})
            assert written["RANK"] == str(e.rank)
        elif e.world_size:
            # Across nodes without a revealed address: export must say to set MASTER_ADDR.
            with pytest.raises(DistEnvError, match="MASTER_ADDR"):
                e.export({})
    if len(hosts) > 1:
        # The address, when known, is rank 0's node (by name or by its address).
        rank0 = ranks[truth.index(0)]
        addr = envs[0].master_addr
        if addr is not None:
            assert addr in (rank0["hostname"], NODE_ADDRS.get(rank0["hostname"])), (addr, rank0["hostname"])
        nodes_by_lowest = sorted(hosts, key=lambda h: min(e.rank for e in hosts[h]))
        for e, r in zip(envs, ranks):
            if e.node_rank is not None:
                assert e.node_rank == nodes_by_lowest.index(r["hostname"])


def test_open_mpi_5_local_ranks_follow_the_launcher_not_rank_order(no_gpus):
    rec = load(os.path.join(HERE, "..", "fixtures", "launchers", "openmpi5-np4.json"))
    got = [(resolve(r["env"]).rank, resolve(r["env"]).local_rank) for r in rec["ranks"]]
    assert got == [(0, 0), (1, 2), (2, 1), (3, 3)]


@pytest.mark.parametrize("layout", ["openmpi4-np4", "mpich4-np4", "intelmpi-np4", "torchrun-nproc2",
                                    "slurm-srun-n4"])
def test_a_launcher_s_resolve_imports_no_platform_helper(layout):
    # every rank of every job resolves at start: the helpers only platforms use
    # (sources/_common.py) cost a rank 0.9 M instructions (callgrind) when its counts lived there
    import subprocess
    import sys

    env = load(os.path.join(HERE, "..", "fixtures", "launchers", layout + ".json"))["ranks"][0]["env"]
    code = ("import sys, json, distenv; before = set(sys.modules); "
            "e = distenv.resolve(json.loads(sys.argv[1])); "
            "print(e.launcher, sorted(m for m in set(sys.modules) - before if m.startswith('distenv')))")
    src = os.path.join(HERE, "..", "..", "src")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(env)], capture_output=True, text=True,
                       env={"PYTHONPATH": os.path.abspath(src), "PATH": os.environ.get("PATH", ""),
                            "CUDA_VISIBLE_DEVICES": ""}, timeout=60)
    assert p.returncode == 0, p.stderr
    launcher, modules = p.stdout.split(" ", 1)
    assert launcher == family(layout)[0] and "distenv.sources." in modules, p.stdout
    assert "distenv.sources._common" not in modules, p.stdout
