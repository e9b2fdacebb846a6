"""The placement map (`distenv.nodemap`, `distenv show --map`, the doctor's map) on recorded
and synthetic environments: rows equal to where the recorded ranks really ran, no service
asked where the environment places every rank, the unknown named with a fix where it does
not, a per-node launch's nodes and workers, contradictions as errors. The real launchers:
tests/integration/test_show_map_launchers.py."""
from __future__ import annotations

import glob
import json
import os

import pytest

from distenv import DistEnvError, doctor, nodemap, resolve
from distenv.cli import main as cli_main
from distenv.discovery import from_hostnames
from envs import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "launchers")
RECORDED = sorted(glob.glob(os.path.join(FIXTURES, "*.json")))
DROP = ("OMPI_", "PMI", "PMIX_", "SLURM_", "DISTENV_", "TORCHELASTIC_", "HYDRA_", "MPI_LOCAL",
        "PET_", "PRTE_", "SM_", "AZ_", "MV2_", "PALS_", "FLUX_", "JSM_", "LSB_", "HOROVOD_")
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "NNODES", "TF_CONFIG", "CLUSTER_SPEC")


def load(name):
    with open(os.path.join(FIXTURES, f"{name}.json")) as f:
        return json.load(f)


def job(rec):
    """[(rank, hostname, DistEnv)] of a recorded job, by the launcher's own rank."""
    out = []
    for r in rec["ranks"]:
        env = resolve(r["env"])
        out.append((int(r["env"][rec["rank_var"]]), r["hostname"], env))
    return sorted(out, key=lambda t: t[0])


def truth_rows(ranks_hosts):
    """(node, host, ranks, local) from where each rank ran, nodes by lowest rank."""
    nodes: "dict[str, list[int]]" = {}
    for rank, host in ranks_hosts:
        nodes.setdefault(host, []).append(rank)
    return [(i, h, r, len(r)) for i, (h, r) in enumerate(nodes.items())]


def rows(m):
    return [(n.node_rank, n.host, None if n.ranks is None else list(n.ranks), n.local)
            for n in m.nodes]


@pytest.fixture
def launch_env(monkeypatch):
    """Put a recorded rank's environment in os.environ (nothing else of a launcher's)."""
    def put(env):
        for key in list(os.environ):
            if key.startswith(DROP) or key in TORCH_VARS:
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    return put


# -- compressing rank lists ------------------------------------------------------------------
@pytest.mark.parametrize("ranks, text", [
    ([0, 1, 2, 3], "0-3"), ([3, 0, 2, 1], "0-3"), ([5], "5"), ([0, 2, 4, 5, 6, 7], "0,2,4-7"),
    ([0, 1, 3, 4, 8], "0-1,3-4,8"),
    (list(range(0, 200, 10)), "0,10,20,30,... (20 ranks)"),
])
def test_compress(ranks, text):
    assert nodemap.compress(ranks) == text


# -- recorded jobs: the environment alone ------------------------------------------------------
@pytest.mark.parametrize("path", RECORDED, ids=[os.path.basename(p)[:-5] for p in RECORDED])
def test_every_rank_of_a_recorded_job_takes_the_same_path(path):
    """`needs` is job-level: every rank asks the service or none does (PMI-1 is collective)."""
    rec = load(os.path.basename(path)[:-5])
    envs = [resolve(r["env"]) for r in rec["ranks"]]
    asks = {nodemap.needs(e) != () and (e.rank_hosts is None if e.launch != "per-node"
                                         else e.hosts is None) for e in envs}
    assert len(asks) == 1, [(e.rank, nodemap.needs(e), e.rank_hosts) for e in envs]


@pytest.mark.parametrize("name", ["openmpi4-np4", "openmpi5-np4", "mpich4-np4", "mpich5-np4",
                                  "intelmpi-np4", "slurm-srun-n4", "torchrun-nproc2"])
def test_one_host_is_one_row_without_asking(name):
    ranks = job(load(name))
    rank, host, env = ranks[0]
    assert rank == 0 and nodemap.needs(env) == () and nodemap.collect(env) is env
    m = nodemap.build(env, host=host)
    assert rows(m) == truth_rows((r, h) for r, h, _ in ranks)
    assert (m.nodes[0].rank0, m.nodes[0].master, m.unknown) == (True, True, [])
    assert [nodemap.prints(e) for _, _, e in ranks] == [True] + [False] * (len(ranks) - 1)
    row = m.text().splitlines()[2].split()
    assert row == ["0", host, f"0-{len(ranks) - 1}", str(len(ranks)), "rank", "0,", "master"], row


@pytest.mark.parametrize("name", ["cluster-srun-2x2", "cluster-srun-n4-cyclic", "cluster-srun-n3",
                                  "cluster-srun-in-salloc-2x2"])
def test_srun_places_every_rank_from_its_variables(name):
    ranks = job(load(name))
    want = truth_rows((r, h) for r, h, _ in ranks)
    for rank, host, env in ranks:  # the same map from every rank, without asking anyone
        assert nodemap.collect(env) is env
        m = nodemap.build(env, host=host)
        assert rows(m) == want, (rank, m.text())
        assert m.unknown == [] and m.why.startswith("SLURM node list")
    m = nodemap.build(ranks[0][2], host=ranks[0][1])
    assert [(n.rank0, n.master) for n in m.nodes] == [(True, True)] + [(False, False)] * (len(want) - 1)


@pytest.mark.parametrize("name", ["cluster-mpich4-2x2", "cluster-openmpi4-2x2", "cluster-openmpi5-2x2",
                                  "cluster-intelmpi-2x2"])
def test_mpi_across_nodes_says_what_is_unknown_then_discovery_fills_it(name):
    ranks = job(load(name))
    rank, host, env = ranks[0]
    assert nodemap.needs(env) == ("rank_hosts",)
    m = nodemap.build(env, host=host)
    # never guessed: only rank 0's own node is placed, its other ranks unknown
    assert m.nodes[[n.host for n in m.nodes].index(host)].ranks is None, m.text()
    assert m.unknown and m.unknown[0].startswith("the host of every rank") and "DISTENV_HOSTFILE" in m.unknown[0]
    assert all("Fix:" in u for u in m.unknown), m.unknown
    assert "unknown: the host of every rank" in m.text()
    # what the launcher's service answers (the host of every rank), as discovery applies it
    names = [h for _, h, _ in ranks]
    for r, h, e in ranks:
        done = from_hostnames(e, names, "PMI-1 key-value exchange (test)")
        m = nodemap.build(done, host=h)
        assert rows(m) == truth_rows(enumerate(names)), m.text()
        assert m.unknown == [] and m.why == "PMI-1 key-value exchange (test)"
        # the master is marked on the node it names; an address (Open MPI 4's mpirun host)
        # is not looked up, and the text says so
        named = done.master_addr == names[0]
        assert [(n.rank0, n.master) for n in m.nodes] == [(True, named), (False, False)], m.text()
        assert ("not a host named above" in m.text()) is not named, m.text()


# -- synthetic launches ----------------------------------------------------------------------
TORCHRUN_2X2 = {**torchrun(0, nodes=2, addr="10.0.0.5"), "TORCHELASTIC_RUN_ID": "x"}


def test_torchrun_across_nodes_shows_what_is_known():
    env = resolve(TORCHRUN_2X2)
    m = nodemap.build(env, host="a")
    assert rows(m) == [(0, "a", None, 2), (1, None, None, 2)], m.text()
    assert m.nodes[0].rank0 and not any(n.master for n in m.nodes)  # 10.0.0.5 is no host name here
    assert len(m.unknown) == 1 and m.unknown[0].startswith("the host of every rank"), m.unknown
    text = m.text()
    assert "master: 10.0.0.5:29400" in text and "1     ?     ?      2" in text, text


def test_a_host_file_places_what_the_environment_does_not(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text("a:2\nb:2\n")
    monkeypatch.setenv("DISTENV_HOSTFILE", str(hosts))
    env = resolve(TORCHRUN_2X2)
    done = nodemap.collect(env)
    m = nodemap.build(done, host="a")
    assert rows(m) == [(0, "a", [0, 1], 2), (1, "b", [2, 3], 2)], m.text()
    assert m.why == f"DISTENV_HOSTFILE={hosts}" and m.unknown == []
    hosts.write_text("a:3\nb:1\n")  # rank 0's node holds 3 ranks, but LOCAL_WORLD_SIZE=2
    with pytest.raises(DistEnvError, match="local_world_size=2 .*Fix:"):
        nodemap.build(nodemap.collect(env), host="a")


def test_per_node_launch_shows_nodes_and_workers():
    env = resolve({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1",
                   "SM_NUM_GPUS": "0", "DISTENV_NPROC_PER_NODE": "2"})
    assert env.launch == "per-node" and nodemap.prints(env) and nodemap.needs(env) == ()
    m = nodemap.build(env, host="ignored")
    assert rows(m) == [(0, "algo-1", [0, 1], 2), (1, "algo-2", [2, 3], 2)], m.text()
    assert [(n.rank0, n.master) for n in m.nodes] == [(True, True), (False, False)]
    text = m.text()
    assert text.startswith("job: sagemaker per-node launch, 2 node(s), 2 worker(s) each to start")
    assert "node  host    workers" in text, text
    other = resolve({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2",
                     "SM_NUM_GPUS": "0", "DISTENV_NPROC_PER_NODE": "2"})
    assert not nodemap.prints(other)


def test_per_node_launch_without_hosts_names_them_unknown():
    env = resolve({"NODE_RANK": "0", "NNODES": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1234",
                   "DISTENV_NPROC_PER_NODE": "3", "WORLD_SIZE": "6"})
    if env.launch != "per-node":
        pytest.skip(f"not a per-node launch here: {env.launcher} {env.launch}")
    m = nodemap.build(env, host="a")
    assert rows(m) == [(0, "a", [0, 1, 2], 3), (1, None, [3, 4, 5], 3)], m.text()
    assert m.nodes[0].master and any("other nodes' hosts" in u for u in m.unknown), m.unknown


def test_contradictions_are_errors():
    env = resolve(load("cluster-srun-2x2")["ranks"][0]["env"])
    with pytest.raises(DistEnvError, match="num_nodes=3 .*Fix:"):
        nodemap.build(env.replace(num_nodes=3, hosts=None))
    with pytest.raises(DistEnvError, match="but hosts is .*Fix:"):
        nodemap.build(env.replace(hosts=("x", "y")))
    with pytest.raises(DistEnvError, match="world_size=8 .*Fix:"):
        nodemap.build(env.replace(world_size=8))


# -- the command line and the doctor ------------------------------------------------------------
def test_cli_show_map_prints_once_on_rank_0(launch_env, capsys):
    rec = load("cluster-srun-2x2")
    ranks = sorted(rec["ranks"], key=lambda r: int(r["env"]["SLURM_PROCID"]))
    launch_env(ranks[1]["env"])
    assert cli_main(["show", "--map"]) == 0 and capsys.readouterr().out == ""
    launch_env(ranks[0]["env"])
    assert cli_main(["show", "--map"]) == 0
    out = capsys.readouterr().out
    want = truth_rows((int(r["env"]["SLURM_PROCID"]), r["hostname"]) for r in ranks)
    assert out.splitlines()[1:4] == [
        "node  host   ranks  local  holds",
        f"0     {want[0][1]}  0-1    2      rank 0, master",
        f"1     {want[1][1]}  2-3    2"], out
    assert not out.startswith("[")  # printed once: no rank prefix
    assert cli_main(["show", "--map", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [(n["node_rank"], n["host"], n["ranks"], n["local_world_size"]) for n in got["nodes"]] \
        == [tuple(w) for w in want]
    for bad in (["--explain"], ["--summary"], ["--ranks", "1"]):
        with pytest.raises(SystemExit) as exc:
            cli_main(["show", "--map", *bad])
        assert exc.value.code == 2


def test_doctor_holds_the_map_in_rank_0s_report():
    ranks = sorted(load("cluster-srun-n4-cyclic")["ranks"], key=lambda r: int(r["env"]["SLURM_PROCID"]))
    report = doctor.diagnose(ranks[0]["env"])
    want = truth_rows((int(r["env"]["SLURM_PROCID"]), r["hostname"]) for r in ranks)
    assert [(n["node_rank"], n["host"], n["ranks"], n["local_world_size"])
            for n in report["map"]["nodes"]] == [tuple(w) for w in want]
    text = doctor.render(report)
    assert "map (once for the job: distenv show --map)" in text
    assert f"  0     {want[0][1]}  {nodemap.compress(want[0][2])}" in text, text
    assert "map" not in doctor.diagnose(ranks[1]["env"])


def test_doctor_reports_a_contradiction_as_an_error(monkeypatch):
    env = resolve(load("cluster-srun-2x2")["ranks"][0]["env"])
    monkeypatch.setattr(nodemap, "build", lambda e, host=None: (_ for _ in ()).throw(
        DistEnvError("the ranks run on 2 host(s) but num_nodes=3. Fix: unset NNODES.")))
    report = doctor.diagnose(load("cluster-srun-2x2")["ranks"][0]["env"])
    found = [f for f in report["findings"] if f["topic"] == "map"]
    assert found == [{"level": "error", "topic": "map", "message": "the ranks run on 2 host(s) but "
                      "num_nodes=3.", "fix": "unset NNODES."}], found
    assert report["status"] == "error" and "map" not in report and env.rank == 0
