"""Environment builders shared by the tests: what a launcher or platform gives one process,
read from the fixtures (tests/fixtures) or written by hand. Each call returns a new dict, so
a test may change it.

Tests import them by name (`from envs import recorded, slurm`): pyproject.toml's pytest
`pythonpath` puts tests/ on sys.path.
"""
from __future__ import annotations

import json
import os

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
PLATFORMS = os.path.join(FIXTURES, "platforms")


# -- recorded and documented fixtures ----------------------------------------------------------
def ranks(name):
    """Every rank's environment in tests/fixtures/launchers/<name>.json (a recorded launch)."""
    with open(os.path.join(FIXTURES, "launchers", name + ".json")) as fh:
        return [dict(r["env"]) for r in json.load(fh)["ranks"]]


def recorded(name, rank):
    """Rank `rank`'s environment in tests/fixtures/launchers/<name>.json."""
    return ranks(name)[rank]


def platform_case(name):
    """The whole documented case tests/fixtures/platforms/<name>.json (env, gpus, expected)."""
    with open(os.path.join(PLATFORMS, name + ".json")) as fh:
        return json.load(fh)


def platform(name):
    """The environment of the documented case tests/fixtures/platforms/<name>.json."""
    return dict(platform_case(name)["env"])


#: Every documented platform case, by name.
PLATFORM_CASES = sorted(f[:-5] for f in os.listdir(PLATFORMS) if f.endswith(".json"))

#: The source whose test file (tests/unit/sources/test_<source>.py) checks a documented case:
#: the platform's when the case expects one ...
PLATFORM_SOURCES = {"azureml": "azureml", "gcp": "gcp", "vertex": "gcp", "sagemaker": "sagemaker",
                    "kubeflow": "kubeflow"}
#: ... else the launcher that wins: the registry's module for the case's expected launcher, or,
#: where the case does not name one, this map.
NO_PLATFORM_SOURCES = {"kubeflow_mpijob_rank3": "openmpi", "kubeflow_tfjob_worker1": "tfconfig",
                       "tf_config_chief_worker_ps": "tfconfig", "tf_config_evaluator": "tfconfig"}


def platform_source(name):
    """The source module that a documented case belongs to (KeyError: a new case to place)."""
    expected = platform_case(name)["expected"]
    if expected.get("platform"):
        return PLATFORM_SOURCES[expected["platform"]]
    if "launcher" not in expected:
        return NO_PLATFORM_SOURCES[name]
    from distenv.sources import find

    entry = find(expected["launcher"])
    if entry is None:
        raise KeyError(f"{name}: no source is named {expected['launcher']!r}")
    return entry.module


def documented(source):
    """The names of the documented platform cases that `source`'s test file checks."""
    return [name for name in PLATFORM_CASES if platform_source(name) == source]


# -- written by hand ---------------------------------------------------------------------------
def ompi(rank, size, local, lsize, *, node_rank_trap=True, **extra):
    """An `mpirun` rank: the OMPI_COMM_WORLD_* variables (and the NODE_RANK trap unless node_rank_trap=False)."""
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(lsize),
    }
    if node_rank_trap:
        # Trap: a local index, never a node index.
        env["OMPI_COMM_WORLD_NODE_RANK"] = str(local)
    env.update(extra)
    return env


def ompi4(rank, size, local, local_size, nodes, extra=None):
    """An Open MPI 4 rank with its node count, job id and HNP URI (node1 of the namespace cluster)."""
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
            "OMPI_MCA_orte_num_nodes": str(nodes), "OMPI_MCA_ess_base_jobid": "4242",
            "OMPI_MCA_orte_hnp_uri": "4241.0;tcp://10.213.77.11:4000", **(extra or {})}


def hydra_rank(rank, size, local, lsize, **extra):
    """A rank of Hydra's `mpiexec` (MPICH, Intel MPI): PMI_RANK, PMI_SIZE and MPI_LOCAL* only."""
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(size), "MPI_LOCALRANKID": str(local),
            "MPI_LOCALNRANKS": str(lsize), **extra}


def slurm(rank, nodelist="node[9-10]", tasks="2(x2)", dist=None, job="77", nodeid=None,
          localid=None, ntasks=4, nnodes=2):
    """Task `rank` of an srun step (2 x 2 on node[9-10] unless told): node and local id from
    the rank, two per node, unless given; no SLURM_NTASKS."""
    env = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
           "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_NUM_NODES": str(nnodes),
           "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks,
           "SLURM_NODEID": str(nodeid if nodeid is not None else rank // 2),
           "SLURM_LOCALID": str(localid if localid is not None else rank % 2)}
    if dist:
        env["SLURM_DISTRIBUTION"] = dist
    return env


def slurm_at(rank, node, local, per_node="2(x2)", ntasks=4, nodes=2):
    """Task `rank` of an srun step on node[1-2], at node index `node` with local id `local`."""
    return {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
            "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
            "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_STEP_NODELIST": "node[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": per_node}


def slurm_task(procid, ntasks, localid, nodeid, nnodes, nodelist, tpn, job="77", step="0", **extra):
    """An srun task with every number given, and the job-level SLURM_NTASKS and SLURM_JOB_NODELIST."""
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": step,
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tpn,
    }
    env.update(extra)
    return env


def torchrun(rank, nodes=1, nproc=2, addr="127.0.0.1", port="29400"):
    """Worker `rank` of torchrun with `nproc` workers on each of `nodes` nodes."""
    return {"TORCHELASTIC_RUN_ID": "r1", "RANK": str(rank), "WORLD_SIZE": str(nodes * nproc),
            "LOCAL_RANK": str(rank % nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(rank // nproc), "GROUP_WORLD_SIZE": str(nodes),
            "MASTER_ADDR": addr, "MASTER_PORT": port}
