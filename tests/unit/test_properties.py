"""Property tests: any environment gives a DistEnv that satisfies the invariants, or a
DistEnvError. Nothing else escapes. (More examples: DISTENV_FUZZ_EXAMPLES=100000.)"""

import json
import os

from hypothesis import HealthCheck, given, settings, strategies as st

import distenv
from distenv import DistEnvError, resolve
from distenv.core.description import FIELDS

EXAMPLES = int(os.environ.get("DISTENV_FUZZ_EXAMPLES", "1500"))

# Every variable any source reads, grouped by launcher so mixes are realistic.
GROUPS = {
    "openmpi": ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_orte_num_nodes", "OMPI_MCA_orte_hnp_uri",
                "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_local_daemon_uri", "PMIX_NAMESPACE"],
    "hydra": ["PMI_RANK", "PMI_SIZE", "PMI_ID", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
              "HYDRA_BSTRAP_NODE_ID", "PMI_KVSNAME", "I_MPI_ROOT"],
    "slurm": ["SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
              "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
              "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
              "SLURM_TASKS_PER_NODE", "SLURM_GTIDS", "SLURM_DISTRIBUTION"],
    "torch": ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
              "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"],
    "deepspeed": ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"],
    "horovod": ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"],
    "others": ["MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "PALS_RANKID", "PALS_NODEID",
               "FLUX_TASK_RANK", "FLUX_JOB_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"],
    "platforms": ["AZ_BATCH_MASTER_NODE", "AZ_BATCHAI_MPI_MASTER_NODE", "AZUREML_RUN_ID",
                  "SM_HOSTS", "SM_CURRENT_HOST", "SM_NUM_GPUS", "CLUSTER_SPEC", "TF_CONFIG",
                  "CLOUD_ML_JOB_ID", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE",
                  "PET_MASTER_ADDR", "PET_MASTER_PORT", "AWS_BATCH_JOB_NODE_INDEX",
                  "AWS_BATCH_JOB_MAIN_NODE_INDEX", "AWS_BATCH_JOB_NUM_NODES",
                  "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS", "AWS_BATCH_JOB_ID"],
    "distenv": ["DISTENV_LAUNCHER", "DISTENV_NPROC_PER_NODE", "CUDA_VISIBLE_DEVICES"],
}
ALL_VARS = sorted({v for group in GROUPS.values() for v in group})

small = st.integers(min_value=0, max_value=8).map(str)
garbage = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.text(max_size=12),
    st.sampled_from(["", " ", "1.5", "0x10", "١", "1e3", "nan", "None", "null", "[", "{}", "[]",
                     "node[1-", "a[3-1]", "2(x", "auto", "cpu", "gpu", "none", "slurm", "openmpi",
                     "prterun-h-1@1", "1.0;tcp://10.0.0.1:5", "h:1", "h:99999", ":"]),
)
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=6),
              st.sampled_from(["h:1", "h0:2222", "workerpool0", "worker", "chief", "ps"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["cluster", "task", "type", "index",
                                                             "worker", "chief", "workerpool0",
                                                             "workerpool1", "ps"]), inner, max_size=4)),
    max_leaves=12,
).map(json.dumps)
value = st.one_of(small, small, garbage, json_value)


@st.composite
def environments(draw):
    groups = draw(st.lists(st.sampled_from(sorted(GROUPS)), min_size=0, max_size=3, unique=True))
    env = {}
    for group in groups:
        for var in GROUPS[group]:
            if draw(st.booleans()):
                env[var] = draw(value)
    for var in draw(st.lists(st.sampled_from(ALL_VARS), max_size=3)):
        env[var] = draw(value)
    return env


def check_invariants(d):
    assert set(d.to_dict()) == set(FIELDS)
    assert d.launch in ("per-process", "per-node")
    if d.rank is not None and d.world_size is not None:
        assert 0 <= d.rank < d.world_size
    if d.local_rank is not None and d.local_world_size is not None:
        assert 0 <= d.local_rank < d.local_world_size
    if d.local_rank is not None and d.world_size is not None:
        assert d.local_rank < d.world_size
    if d.local_world_size is not None and d.world_size is not None:
        assert d.local_world_size <= d.world_size
    if d.node_rank is not None and d.num_nodes is not None:
        assert 0 <= d.node_rank < d.num_nodes
    if d.master_port is not None:
        assert 1 <= d.master_port <= 65535
    if d.launch == "per-node":
        # the workers are yet to be started: no rank of their own; how many per node, when
        # given (a Lightning-style per-node launch gives only the total: a note says so)
        assert d.rank is None and d.local_rank is None
        assert d.nproc_per_node is None or d.nproc_per_node >= 1
    for field in FIELDS:
        assert field in d.provenance or getattr(d, field) is None
    json.dumps(d.to_dict())
    d.explain()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(environments())
def test_any_environment_resolves_or_raises_distenverror(no_gpus_session, env):
    try:
        d = resolve(env)
    except DistEnvError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        return
    check_invariants(d)


@settings(max_examples=max(EXAMPLES // 5, 50), deadline=None)
@given(environments())
def test_cli_exits_nonzero_with_one_line(no_gpus_session, env):
    import contextlib
    import io

    from distenv.cli import main

    # A real environment cannot hold NUL bytes or lone surrogates.
    env = {k: v.replace("\x00", "").encode("utf-8", "replace").decode() for k, v in env.items()}
    err, out = io.StringIO(), io.StringIO()
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["show", "--json"])
    finally:
        os.environ.clear()
        os.environ.update(old)
    if code == 0:
        assert set(json.loads(out.getvalue())) == set(FIELDS)
    else:
        assert code == 2
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("distenv: error: ")
