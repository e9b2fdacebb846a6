"""distenv.core.placement: which host runs each rank (DistEnv.rank_hosts), proven or unknown; the
Lightning node hand-off source; the shared knobs (distenv.knobs)."""

from __future__ import annotations

import pickle

import pytest

import distenv
from distenv import DistEnvError, knobs, resolve
from distenv.core import placement, ports
from distenv.core.description import Later
from distenv.discovery import from_hostnames
from distenv.sources import slurm
from envs import ompi, platform


def srun(rank, nodes, per, dist=None, nodelist=None, job="5"):
    """One task of `srun -N nodes --ntasks-per-node per` under SLURM_DISTRIBUTION `dist`."""
    size = nodes * per
    order = slurm.task_nodes([per] * nodes, "block" if dist in (None, "arbitrary") else dist)
    node = order[rank]
    env = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
           "SLURM_STEP_NUM_TASKS": str(size), "SLURM_STEP_NUM_NODES": str(nodes),
           "SLURM_STEP_NODELIST": nodelist or f"n[1-{nodes}]",
           "SLURM_STEP_TASKS_PER_NODE": f"{per}(x{nodes})" if nodes > 1 else str(per),
           "SLURM_NODEID": str(node), "SLURM_LOCALID": str(order[:rank].count(node))}
    if dist:
        env["SLURM_DISTRIBUTION"] = dist
    return env


# -- SLURM ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dist, want", [
    (None, ["n1", "n1", "n1", "n2", "n2", "n2"]),
    ("block", ["n1", "n1", "n1", "n2", "n2", "n2"]),
    ("cyclic", ["n1", "n2", "n1", "n2", "n1", "n2"]),
    ("cyclic:block", ["n1", "n2", "n1", "n2", "n1", "n2"]),
    ("plane=2", ["n1", "n1", "n2", "n2", "n1", "n2"]),
])
def test_slurm_rank_hosts_follow_the_distribution(dist, want):
    for rank in range(6):
        d = resolve(srun(rank, 2, 3, dist))
        assert list(d.rank_hosts) == want
        assert d.rank_hosts[rank] == d.hosts[d.node_rank]  # this rank's own node agrees


def test_slurm_layouts_the_variables_do_not_prove_are_unknown():
    d = resolve(srun(0, 2, 2, "arbitrary"))
    assert d.rank_hosts is None and "arbitrary" in d.provenance["rank_hosts"]
    # SLURM_NODEID contradicts the block rule for rank 1: not a guess, unknown with the reason.
    env = {**srun(1, 2, 2), "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}
    d = resolve(env)
    assert d.rank_hosts is None and "SLURM_NODEID" in d.provenance["rank_hosts"]


def test_4096_ranks_on_512_nodes_agree_and_cost_nothing_until_asked():
    seen = set()
    for rank in (0, 1, 7, 8, 2047, 4095):
        d = resolve(srun(rank, 512, 8, nodelist="gpu[001-512]"))
        assert type(d._values["rank_hosts"]) is Later  # resolve() built no 4096-entry tuple
        hosts = d.rank_hosts
        assert len(hosts) == 4096 and hosts[rank] == f"gpu{rank // 8 + 1:03d}"
        seen.add(hosts)
    assert len(seen) == 1  # every rank computes the same placement
    cyclic = resolve(srun(4095, 512, 8, "cyclic", nodelist="gpu[001-512]")).rank_hosts
    assert cyclic[:3] == ("gpu001", "gpu002", "gpu003") and cyclic[4095] == "gpu512"


def test_lazy_field_behaves_like_a_value():
    d = resolve(srun(2, 2, 2))
    again = resolve(srun(2, 2, 2))
    assert d == again and hash(d) == hash(again)  # settles both
    assert d.to_dict()["rank_hosts"] == ["n1", "n1", "n2", "n2"]
    assert pickle.loads(pickle.dumps(resolve(srun(2, 2, 2)))).rank_hosts == ("n1", "n1", "n2", "n2")
    assert resolve(srun(2, 2, 2)).replace(rank=2).rank_hosts == ("n1", "n1", "n2", "n2")
    assert list(d.to_dict()) == list(distenv.FIELDS)


def test_explain_shortens_rank_hosts():
    text = resolve(srun(0, 512, 8, nodelist="gpu[001-512]")).explain()
    line = next(x for x in text.splitlines() if x.startswith("rank_hosts"))
    assert "gpu001*8,gpu002*8,gpu003*8,gpu004*8,... (4096 ranks)" in line and len(line) < 200


# -- other launches -----------------------------------------------------------------------
def test_tf_config_and_platform_lists():
    assert resolve(platform("tf_config_chief_worker_ps")).rank_hosts == (
        "trainer-chief-0", "trainer-worker-0", "trainer-worker-1")
    sm = resolve(platform("sagemaker_mpi_2hosts_rank3"))
    assert sm.rank_hosts == ("algo-1", "algo-1", "algo-2", "algo-2")
    az = resolve(platform("azureml_mpi_per_process_2x2_rank2"))
    assert az.rank_hosts == ("10.0.0.4", "10.0.0.4", "10.0.0.5", "10.0.0.5")


def test_per_node_launch_places_the_workers_it_will_start(monkeypatch):
    env = platform("vertex_pytorch_workerpool1_index1")
    d = resolve(env, nproc_per_node=2)
    assert d.launch == "per-node" and len(d.rank_hosts) == 6
    assert d.rank_hosts[2 * d.node_rank] == d.hosts[d.node_rank]


def test_launchers_that_do_not_reveal_placement_leave_it_unknown():
    openmpi = ompi(1, 4, 1, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_ess_base_jobid="9")
    d = resolve(openmpi)
    assert d.rank_hosts is None and "rank_hosts" not in d.provenance
    # ... until discovery asks the ranks
    found = from_hostnames(d, ["a", "a", "b", "b"], "test")
    assert found.rank_hosts == ("a", "a", "b", "b")
    filled = placement.with_rank_hosts(d, ["a", "a", "b", "b"], "a host file")
    assert filled.rank_hosts == ("a", "a", "b", "b") and filled.provenance["rank_hosts"] == "a host file"
    with pytest.raises(DistEnvError, match="world_size=4"):
        placement.with_rank_hosts(d, ["a", "b"], "a host file")
    with pytest.raises(DistEnvError, match="contradicts"):
        placement.with_rank_hosts(resolve(srun(0, 2, 2)), ["x"] * 4, "a host file")


# -- host files -----------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["a slots=2\nb slots=2\n", "a:2\n# c\nb:2\n", "a\na\nb\nb\n"])
def test_host_files(text):
    assert placement.hostfile_rank_hosts(text, 4) == ["a", "a", "b", "b"]


def test_host_file_errors(tmp_path):
    assert placement.hostfile_rank_hosts("a\nb\n", 4, per_node=2) == ["a", "a", "b", "b"]
    with pytest.raises(DistEnvError, match="give 'host:N' lines"):
        placement.hostfile_rank_hosts("a\nb\n", 4)
    with pytest.raises(DistEnvError, match="6 slot"):
        placement.hostfile_rank_hosts("a:3\nb:3\n", 4)
    with pytest.raises(DistEnvError, match="line 1"):
        placement.parse_hostfile("a foo=1\n")
    d = resolve(srun(0, 2, 2))
    with pytest.raises(DistEnvError, match="cannot be read"):
        placement.read_hostfile(d, str(tmp_path / "missing"))
    path = tmp_path / "hosts"
    path.write_text("x:2\ny:2\n")
    assert placement.read_hostfile(d, str(path)) == ["x", "x", "y", "y"]


# -- the Lightning node hand-off source -----------------------------------------------------------
def node_process(extra=None):
    """An mpirun process that is node 1 of 2, asked for 2 workers per node."""
    return ompi(1, 2, 0, 1, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_ess_base_jobid="77",
                OMPI_MCA_orte_hnp_uri="76.0;tcp://10.1.0.1:4000", DISTENV_NPROC_PER_NODE="2") | (extra or {})


def test_lightning_worker_is_described_by_the_hand_off(no_gpus):
    from distenv.sources.lightning_node import VARIABLE, hand_off

    node = resolve(node_process())
    assert node.launch == "per-node" and node.node_rank == 1
    value = hand_off(node, 2, 2)
    # The node process itself (no LOCAL_RANK yet) is still described by its launcher.
    assert resolve(node_process({VARIABLE: value})).launch == "per-node"
    # What Lightning sets in the worker it starts as local rank 1 of node 1.
    worker = resolve(node_process({VARIABLE: value, "LOCAL_RANK": "1", "NODE_RANK": "1",
                                   "WORLD_SIZE": "4", "MASTER_ADDR": node.master_addr,
                                   "MASTER_PORT": str(node.master_port)}))
    assert (worker.launcher, worker.launch, worker.rank, worker.local_rank, worker.world_size,
            worker.node_rank, worker.num_nodes) == ("lightning", "per-process", 3, 1, 4, 1, 2)
    assert (worker.master_addr, worker.master_port) == (node.master_addr, node.master_port)
    # A Lightning variable contradicting the hand-off is an error, not a choice.
    with pytest.raises(DistEnvError, match="WORLD_SIZE=6"):
        resolve(node_process({VARIABLE: value, "LOCAL_RANK": "1", "WORLD_SIZE": "6"}))
    with pytest.raises(DistEnvError, match="LOCAL_RANK=2"):
        resolve(node_process({VARIABLE: value, "LOCAL_RANK": "2"}))
    with pytest.raises(DistEnvError, match=f"{VARIABLE} is not valid JSON"):
        resolve(node_process({VARIABLE: "{", "LOCAL_RANK": "0"}))


# -- knobs ------------------------------------------------------------------------------------
def test_timeout_knob():
    assert knobs.timeout({}) == knobs.DEFAULT_TIMEOUT
    assert knobs.timeout({"DISTENV_TIMEOUT": "7.5"}) == 7.5
    assert knobs.timeout({"DISTENV_TIMEOUT": "7"}, given=3) == 3
    for bad in ("0", "-1", "x", "nan", "inf"):
        with pytest.raises(DistEnvError, match="DISTENV_TIMEOUT"):
            knobs.timeout({"DISTENV_TIMEOUT": bad})


def test_side_ports_agree_across_ranks_and_avoid_the_master_port():
    a, b = resolve(srun(0, 2, 2)), resolve(srun(3, 2, 2))
    assert knobs.side_port(a, "tf", {}) == knobs.side_port(b, "tf", {})
    assert knobs.side_port(a, "tf", {}) != knobs.side_port(a, "horovod", {})
    assert knobs.side_port(a, "tf", {"DISTENV_TF_PORT": "31000"}, "DISTENV_TF_PORT") == 31000
    with pytest.raises(DistEnvError, match="65535"):
        knobs.side_port(a, "tf", {}, given=65535, width=2)
    # Blocks are aligned (two jobs with as many workers per host share a whole block or none)
    widths = {w: knobs.side_port(a, "tf", {}, width=w) for w in (1, 4, 8)}
    assert all((port - ports.BASE) % w == 0 and port + w <= ports.BASE + ports.SPAN
               for w, port in widths.items()), widths
    # A master port inside the derived block: the block moves to the next one.
    key = f"x:{a.launcher}:{a.job_id}:{a.master_addr}:"
    master = next(p for p in range(1, 65536)
                  if 0 <= p - (ports.BASE + 4 * (ports.fnv1a(key + str(p)) % 2500)) < 4)
    taken = a.replace(master_port=master)
    port = knobs.side_port(taken, "x", {}, width=4)
    assert port == master - (master - ports.BASE) % 4 + 4 and not port <= master < port + 4


def test_core_share():
    assert knobs.core_share(2, mine={2, 3}, parent=set(range(8)))[0] == 2   # bound by the launcher
    assert knobs.core_share(4, mine=set(range(8)), parent=set(range(8)))[0] == 2  # shared
    assert knobs.core_share(4, mine={0}, parent={0})[0] == 1  # never 0


def test_placement_code_names_no_launcher_or_platform():
    """Every launch's placement rule lives in its Source (`Source.place`); placement.py keeps
    the model (host files, block placement, the record loop) and names no launcher, platform
    or launcher variable in its code (its docstring's table may)."""
    import ast
    import re

    path = placement.__file__
    tree = ast.parse(open(path, encoding="utf-8").read())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    launch_words = re.compile(r"\b(SLURM_\w*|SM_\w+|AZ_\w+|TF_CONFIG|CLUSTER_SPEC|slurm|sagemaker|"
                              r"azureml|gcp|vertex|tf_config|openmpi|mpich|torchrun)\b")
    found = [node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and id(node) not in docstrings and launch_words.search(node.value)]
    assert found == [], found
