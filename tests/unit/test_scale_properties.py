"""Property tests at scale (issue 13): synthetic jobs of up to 4096 ranks on 512 nodes, built
the way each launcher writes its variables (the shapes measured on the two namespace nodes,
see tests/integration/test_placement_proofs.py), every sampled rank resolved.

The property: all ranks agree on master address, master port and node order -- and what
they agree on is the truth of the simulated layout (rank 0's host; nodes ordered by their
lowest rank) -- or all of them report it unknown. Never some ranks one value and others
another, never a wrong value.

Sampled ranks: rank 0, the first rank of every node (and its last, up to 64 nodes): one on
each side of every node boundary; and a few at random. 50 examples per test by default (CI:
about 4 s for the file); DISTENV_SCALE_EXAMPLES=500 for more.

Where the launcher's variables prove a node rank or node count, every rank must give it (not
only be right when it gives one): see `proves` in each generator.

Launches simulated:
- SLURM srun steps: block, cyclic, plane=N (with srun's spellings: "block,pack",
  "cyclic:cyclic:block,nopack", "plane" + SLURM_DIST_PLANESIZE, unset), arbitrary
  (SLURM_HOSTFILE), heterogeneous jobs (SLURM_HET_SIZE) of any size, and heterogeneous steps
  in ordinary jobs on two nodes. (With three or more nodes a het step in an ordinary job can
  leave ranks on some nodes with the very variables of an ordinary step: SLURM marks such
  steps nowhere -- the limit documented in distenv.sources.slurm; not generated here.)
- Open MPI 4: mpirun on the first node (by slot or by node, any -H order), mpirun on a head
  node with no rank, MPMD (OMPI_NUM_APP_CTX=2), a rankfile and --map-by seq.
- Open MPI 5: any host-list order, mpirun on a node or a head node.
- Platforms: SageMaker (mpirun and one process per host), Azure ML MPI jobs, Kubeflow
  PyTorchJob per pod, TF_CONFIG tasks, Vertex AI CLUSTER_SPEC replicas.
"""
from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, given, settings, strategies as st

from distenv import resolve

EXAMPLES = int(os.environ.get("DISTENV_SCALE_EXAMPLES", "50"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_NODES, MAX_RANKS = 512, 4096


# -- shared: a layout is (node names, the node index of every rank) ---------------------------
def names_for(n: int, draw) -> "list[str]":
    """n host names in node-table order (sorted as SLURM writes them)."""
    prefix = draw(st.sampled_from(["n", "cn", "gpu-node-", "r1-c"]))
    width = len(str(n + 100))
    start = draw(st.integers(0, 50))
    gap = draw(st.sampled_from([1, 1, 2]))
    return [f"{prefix}{start + gap * i:0{width}d}" for i in range(n)]


@st.composite
def node_counts(draw, max_nodes=MAX_NODES, max_ranks=MAX_RANKS, min_nodes=1):
    n = draw(st.one_of(st.integers(min_nodes, min(4, max_nodes)), st.integers(min_nodes, max_nodes)))
    per = max(1, min(8, max_ranks // n))
    if draw(st.booleans()):
        counts = [draw(st.integers(1, per))] * n
    else:
        counts = [draw(st.integers(1, per)) for _ in range(n)]
    return counts


def sample(nodes_of_rank, draw) -> "list[int]":
    """Rank 0, the first rank of every node (and the last, up to 64 nodes), a few others."""
    picked = {0, len(nodes_of_rank) - 1}
    seen = {}
    for rank, node in enumerate(nodes_of_rank):
        seen.setdefault(node, []).append(rank)
    small = len(seen) <= 64
    for ranks in seen.values():  # the first rank of every node: one at each node boundary
        picked.update((ranks[0], ranks[-1]) if small else (ranks[0],))
    picked.update(draw(st.lists(st.integers(0, len(nodes_of_rank) - 1), max_size=4)))
    return sorted(picked)


def truth(hosts, nodes_of_rank):
    host_of = [hosts[n] for n in nodes_of_rank]
    by_lowest = list(dict.fromkeys(host_of))
    return host_of, by_lowest


def check(envs, host_of, by_lowest, known: bool, master_ok=None, proves=()):
    """The property. envs: {rank: DistEnv}. known: the launcher's rules prove the master
    here (else every rank must say unknown, unless the job is on one node). proves: the
    fields among node_rank and num_nodes that the launcher's variables prove in this layout,
    which every rank must then give (on one node both are always proved: the local world is
    the world)."""
    proves = set(proves) | ({"node_rank", "num_nodes"} if len(by_lowest) == 1 else set())
    for rank, e in envs.items():
        for field in sorted(proves):
            assert getattr(e, field) is not None, (rank, field, e.explain())
    masters = {e.master_addr for e in envs.values()}
    ports = {e.master_port for e in envs.values()}
    assert len(ports) == 1 and None not in ports, ports
    assert len(masters) == 1, f"ranks disagree on the master: {masters}"
    master = masters.pop()
    one_node = len(by_lowest) == 1
    if one_node and master is not None:
        assert master in ("127.0.0.1", host_of[0]) or (master_ok and master_ok(master))
    elif master is not None:
        assert known, f"master {master} named where nothing proves it"
        assert (master_ok or (lambda m: m == host_of[0]))(master), (master, host_of[0])
    elif known and not one_node:
        raise AssertionError("the rule proves the master, but ranks left it unknown")
    node_ranks = {}
    for rank, e in envs.items():
        if e.node_rank is not None:
            assert e.node_rank == by_lowest.index(host_of[rank]), (rank, e.node_rank, e.explain())
        node_ranks.setdefault(e.node_rank is None, []).append(rank)
        if e.num_nodes is not None:
            assert e.num_nodes == len(by_lowest)
        if e.local_world_size is not None and e.launch == "per-process":
            assert e.local_world_size == host_of.count(host_of[rank])
    if not one_node:
        assert len(node_ranks) == 1, f"node rank known on some ranks only: {node_ranks}"
    # The host of every rank, where the core places them: right on the ranks that have it
    # (checked on rank 0 and one other: the tuple is built on first access).
    for rank in list(envs)[:2]:
        placed = envs[rank].rank_hosts if hasattr(envs[rank], "rank_hosts") else None
        if placed is not None:
            assert list(placed) == host_of, envs[rank].provenance.get("rank_hosts")


# -- SLURM ------------------------------------------------------------------------------------
def compress(hosts) -> str:
    """SLURM's compressed form of a host list whose names share a prefix and width."""
    import re

    if len(hosts) < 3 or len({re.sub(r"\d+$", "", h) for h in hosts}) != 1:
        return ",".join(hosts)
    prefix = re.sub(r"\d+$", "", hosts[0])
    nums = [h[len(prefix):] for h in hosts]
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and int(nums[j + 1]) == int(nums[j]) + 1 and len(nums[j + 1]) == len(nums[i]):
            j += 1
        parts.append(nums[i] if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return f"{prefix}[{','.join(parts)}]"


def tasks_per_node(counts) -> str:
    out, i = [], 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        out.append(str(counts[i]) if i == j else f"{counts[i]}(x{j - i + 1})")
        i = j + 1
    return ",".join(out)


def deal(counts, step):
    """SLURM's cyclic (step 1) and plane (step N) task layouts: deal `step` tasks at a time
    to each node in list order, skipping full nodes (src/common/slurm_step_layout.c)."""
    left, out = list(counts), []
    while len(out) < sum(counts):
        for n in range(len(left)):
            take = min(step, left[n])
            out.extend([n] * take)
            left[n] -= take
    return out


@st.composite
def slurm_jobs(draw):
    kind = draw(st.sampled_from(["block", "cyclic", "plane", "arbitrary", "het-job", "het-step"]))
    counts = draw(node_counts(min_nodes=2 if kind.startswith("het") else 1,
                              max_nodes=2 if kind == "het-step" else MAX_NODES))
    n = len(counts)
    hosts = names_for(n, draw)
    extra, spell = {}, None
    node_id = list(range(n))  # SLURM_NODEID of node k (list order unless said otherwise)
    if kind == "block":
        order = [k for k, c in enumerate(counts) for _ in range(c)]
        spell = draw(st.sampled_from([None, "block", "block,pack", "block:cyclic", "block:block:cyclic"]))
    elif kind == "cyclic":
        order = deal(counts, 1)
        spell = draw(st.sampled_from(["cyclic", "cyclic:cyclic:block,nopack", "cyclic:block"]))
    elif kind == "plane":
        size = draw(st.integers(1, 6))
        order = deal(counts, size)
        spell = "plane"
        extra["SLURM_DIST_PLANESIZE"] = str(size)
    elif kind == "arbitrary":
        # SLURM_HOSTFILE order: any node may hold task 0; the list stays sorted.
        order = [k for k, c in enumerate(counts) for _ in range(c)]
        order = draw(st.permutations(order))
        spell = "arbitrary"
    else:
        # Components in any order; SLURM_NODEID counts nodes component by component, the
        # list and the tasks per node stay in node-table order (measured, SLURM 22.05).
        perm = draw(st.permutations(range(n)))
        cut = draw(st.integers(1, n - 1))
        components = [list(perm[:cut]), list(perm[cut:])]
        order, seq = [], 0
        for comp in components:
            for k in comp:
                order.extend([k] * counts[k])
                node_id[k] = seq
                seq += 1
        spell = "block"
        if kind == "het-job":
            extra["SLURM_HET_SIZE"] = "2"
            extra["SLURM_PACK_SIZE"] = "2"
    gtids_on = draw(st.booleans())
    common = {
        "SLURM_JOB_ID": str(draw(st.integers(1, 10**7))), "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": str(len(order)), "SLURM_NTASKS": str(len(order)),
        "SLURM_STEP_NUM_NODES": str(n), "SLURM_NNODES": str(n),
        "SLURM_STEP_NODELIST": compress(hosts), "SLURM_NODELIST": compress(hosts),
        "SLURM_JOB_NODELIST": compress(hosts),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node(counts),
        "SLURM_TASKS_PER_NODE": tasks_per_node(counts), **extra,
    }
    if spell is not None:
        common["SLURM_DISTRIBUTION"] = spell
    on_node = {}
    for rank, k in enumerate(order):
        on_node.setdefault(k, []).append(rank)

    def env_of(rank):
        k = order[rank]
        env = dict(common, SLURM_PROCID=str(rank), SLURM_LOCALID=str(on_node[k].index(rank)),
                   SLURM_NODEID=str(node_id[k]), SLURMD_NODENAME=hosts[k])
        if gtids_on:
            env["SLURM_GTIDS"] = ",".join(map(str, on_node[k]))
        return env

    known = kind in ("block", "cyclic", "plane") or (kind == "het-step" and order[0] == 0)
    # SLURM_STEP_NUM_NODES counts the nodes of every step. SLURM_NODEID is the node's place
    # in the step's node list, which for block, cyclic and plane steps is also the order of
    # the nodes' lowest ranks (tasks are dealt in list order from the first node).
    proves = {"num_nodes"} | ({"node_rank"} if kind in ("block", "cyclic", "plane") else set())
    return kind, hosts, order, env_of, known, proves


@SETTINGS
@given(job=slurm_jobs(), data=st.data())
def test_slurm_jobs_agree_or_say_unknown(job, data):
    kind, hosts, order, env_of, known, proves = job
    host_of, by_lowest = truth(hosts, order)
    ranks = sample(order, data.draw)
    envs = {r: resolve(env_of(r)) for r in ranks}
    assert {e.launcher for e in envs.values()} == {"slurm"}
    check(envs, host_of, by_lowest, known, proves=proves)
    if kind in ("arbitrary", "het-job") and len(by_lowest) > 1:
        assert all(e.node_rank is None for e in envs.values())


# -- Open MPI 4 -------------------------------------------------------------------------------
def ip(k: int) -> str:
    return f"10.{k // 250}.{k % 250}.{1 + k % 3}"


@st.composite
def openmpi4_jobs(draw):
    kind = draw(st.sampled_from(["first", "first", "head", "mpmd", "rankfile", "seq"]))
    counts = draw(node_counts())
    n = len(counts)
    hosts = names_for(n, draw)
    by = draw(st.sampled_from(["slot", "node"]))
    # Target nodes: mpirun's node (daemon 0) first, the others in daemon order (ORTE).
    if by == "slot":
        order = [k for k, c in enumerate(counts) for _ in range(c)]
    else:
        order = deal(counts, 1)
    head = kind == "head"
    if kind in ("mpmd", "rankfile", "seq"):
        order = list(draw(st.permutations(order)))  # rank 0 anywhere
    family = draw(st.integers(1, 60000)) * 65536
    hnp = "10.255.255.254" if head else ip(0)
    # the mpirun host's every interface: with a second one (a bridge, a BMC port) the one
    # the nodes reach is in no variable
    bridge = draw(st.booleans())
    uri = f"{family}.0;tcp://{hnp}{',192.0.2.7' if bridge else ''}:4{draw(st.integers(1000, 9999))}"
    daemons = n + 1 if head else n
    on_node = {}
    for rank, k in enumerate(order):
        on_node.setdefault(k, []).append(rank)
    size = len(order)

    def env_of(rank):
        k = order[rank]
        vpid = k + 1 if head else k
        env = {
            "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(on_node[k].index(rank)),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(len(on_node[k])),
            "OMPI_COMM_WORLD_NODE_RANK": str(on_node[k].index(rank)),
            "OMPI_MCA_orte_num_nodes": str(n), "OMPI_MCA_orte_hnp_uri": uri,
            "OMPI_MCA_ess_base_jobid": str(family + 1),
            "OMPI_MCA_orte_local_daemon_uri": f"{family}.{vpid};tcp://{ip(k)}:5000",
            "OMPI_NUM_APP_CTX": "2" if kind == "mpmd" else "1",
            "PMIX_RANK": str(rank), "PMIX_NAMESPACE": str(family + 1), "PMIX_HOSTNAME": hosts[k],
        }
        if vpid != 0:  # measured: only ranks started by a remote daemon carry it
            env["OMPI_MCA_ess_base_num_procs"] = str(daemons)
            if kind in ("rankfile", "seq"):  # measured: the count differs on those ranks
                env["OMPI_MCA_orte_num_nodes"] = str(2 * n)
        if kind == "rankfile":
            env["OMPI_MCA_orte_rankfile"] = "/home/u/rf"
        if kind == "seq":
            env["OMPI_MCA_rmaps_base_mapping_policy"] = "seq"
        return env

    known = kind == "first" and not bridge
    # OMPI_MCA_orte_num_nodes is the node count on every rank, except with a rankfile or
    # --map-by seq, where it differs between ranks (measured); Open MPI 4 gives no node rank.
    proves = {"num_nodes"} if kind in ("first", "head", "mpmd") else set()
    return hosts, order, env_of, known, (lambda m: m == ip(0)), proves


@SETTINGS
@given(job=openmpi4_jobs(), data=st.data())
def test_openmpi4_jobs_agree_or_say_unknown(job, data):
    hosts, order, env_of, known, master_ok, proves = job
    host_of, by_lowest = truth(hosts, order)
    envs = {r: resolve(env_of(r)) for r in sample(order, data.draw)}
    check(envs, host_of, by_lowest, known, master_ok, proves)


# -- Open MPI 5 -------------------------------------------------------------------------------
@st.composite
def openmpi5_jobs(draw):
    counts = draw(node_counts())
    n = len(counts)
    hosts = names_for(n, draw)
    # PRRTE maps by its host list, in any order; mpirun on some node (or a head node).
    perm = draw(st.permutations(range(n)))
    order = [k for k in perm for _ in range(counts[k])]
    hnp = draw(st.sampled_from([None] + list(range(n))))
    ns = f"prterun-{'login1' if hnp is None else hosts[hnp]}-{draw(st.integers(2, 99999))}@1"
    daemon = {k: i + (1 if hnp is None else 0) for i, k in enumerate(
        ([] if hnp is None else [hnp]) + [k for k in range(n) if k != hnp])}
    on_node = {}
    for rank, k in enumerate(order):
        on_node.setdefault(k, []).append(rank)

    def env_of(rank):
        k = order[rank]
        local = on_node[k]
        return {
            "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(len(order)),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local.index(rank)),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(len(local)), "OMPI_WORLD_SIZE": str(len(order)),
            "OMPI_NUM_APP_CTX": "1", "PMIX_NAMESPACE": ns, "PMIX_RANK": str(rank),
            "PMIX_HOSTNAME": hosts[k],
            "PMIX_SERVER_URI41": f"{ns[:-2]}@0.{daemon[k]};tcp4://127.0.0.1:4{daemon[k] % 9999}",
        }

    return hosts, order, env_of


@SETTINGS
@given(job=openmpi5_jobs(), data=st.data())
def test_openmpi5_jobs_agree_or_say_unknown(job, data):
    hosts, order, env_of = job
    host_of, by_lowest = truth(hosts, order)
    envs = {r: resolve(env_of(r)) for r in sample(order, data.draw)}
    check(envs, host_of, by_lowest, known=False)


# -- platforms --------------------------------------------------------------------------------
@st.composite
def platform_jobs(draw):
    kind = draw(st.sampled_from(["sagemaker-mpi", "sagemaker-per-host", "azureml-mpi",
                                 "kubeflow", "tf_config", "vertex"]))
    per_node = kind in ("sagemaker-per-host", "kubeflow", "vertex")
    n = draw(st.one_of(st.integers(1, 4), st.integers(1, MAX_NODES)))
    per = 1 if per_node else draw(st.integers(1, max(1, min(8, MAX_RANKS // n))))
    hosts = [ip(i) for i in range(n)] if kind == "azureml-mpi" else names_for(n, draw)
    order = [k for k in range(n) for _ in range(per)]  # documented block layouts
    size = len(order)
    job = str(draw(st.integers(1, 10**6)))

    def ompi(rank):
        k = order[rank]
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % per),
                "OMPI_COMM_WORLD_LOCAL_SIZE": str(per), "OMPI_MCA_orte_num_nodes": str(n),
                "OMPI_MCA_orte_hnp_uri": f"{job}0000.0;tcp://{ip(0)}:4000",
                "OMPI_MCA_ess_base_jobid": f"{job}0001", "OMPI_NUM_APP_CTX": "1",
                "OMPI_MCA_orte_local_daemon_uri": f"{job}0000.{k};tcp://{ip(k)}:5000"}

    cluster = [f"{h}:{2222 + i}" for h in hosts for i in range(per)]  # TF_CONFIG: one per task

    def env_of(rank):
        k = order[rank]
        if kind == "sagemaker-mpi":
            # mpirun -x copies the master's SM_CURRENT_HOST to every rank (SageMaker docs).
            return dict(ompi(rank), SM_HOSTS=json.dumps(hosts), SM_CURRENT_HOST=hosts[0],
                        TRAINING_JOB_NAME="job-" + job)
        if kind == "sagemaker-per-host":
            return {"SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": hosts[k],
                    "TRAINING_JOB_NAME": "job-" + job}
        if kind == "azureml-mpi":
            return dict(ompi(rank), AZ_BATCH_MASTER_NODE=f"{ip(0)}:6105",
                        AZ_BATCH_HOST_LIST=",".join(hosts),
                        AZUREML_RUN_ID="run-" + job)
        if kind == "kubeflow":
            return {"PET_NNODES": str(n), "PET_NODE_RANK": str(k), "PET_NPROC_PER_NODE": "1",
                    "PET_MASTER_ADDR": hosts[0], "PET_MASTER_PORT": "23456",
                    "MASTER_ADDR": hosts[0], "MASTER_PORT": "23456", "RANK": str(k),
                    "WORLD_SIZE": str(n)}
        if kind == "tf_config":
            chief, workers = cluster[:1], cluster[1:]
            task = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": rank - 1}
            spec = {"chief": chief, **({"worker": workers} if workers else {})}
            return {"TF_CONFIG": json.dumps({"cluster": spec, "task": task})}
        replicas = [f"{h}:2222" for h in hosts]
        spec = {"cluster": {"workerpool0": replicas[:1], **({"workerpool1": replicas[1:]} if n > 1 else {})},
                "task": {"type": "workerpool0" if k == 0 else "workerpool1",
                         "index": 0 if k == 0 else k - 1}, "environment": "cloud"}
        return {"CLUSTER_SPEC": json.dumps(spec), "CLOUD_ML_JOB_ID": job, "RANK": str(k),
                "WORLD_SIZE": str(n), "AIP_MODEL_DIR": "gs://b/m"}

    return kind, hosts, order, env_of, None


@SETTINGS
@given(job=platform_jobs(), data=st.data())
def test_platform_jobs_agree(job, data, no_gpus_session):
    kind, hosts, order, env_of, master_ok = job
    host_of, by_lowest = truth(hosts, order)
    envs = {r: resolve(env_of(r)) for r in sample(order, data.draw)}
    # Every one of these platforms names the master itself (or documents where rank 0 runs),
    # and its variables give the node count and each node's place (SM_HOSTS and
    # SM_CURRENT_HOST, AZ_BATCH_HOST_LIST with the Open MPI local size, PET_NNODES and
    # PET_NODE_RANK, the TF_CONFIG / CLUSTER_SPEC cluster and task).
    check(envs, host_of, by_lowest, known=True, master_ok=master_ok,
          proves={"node_rank", "num_nodes"})
