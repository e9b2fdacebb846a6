"""`DistEnv.checked()` and `DistEnv.require()`: the narrowing path from ``int | None`` fields to
known values, or one DistEnvError naming every unknown field and what to set."""

import pytest

import distenv
from distenv import DistEnvError
from distenv.core.checked import REQUIRED, Checked
from envs import ompi

OMPI_4_ON_2_NODES = ompi(3, 4, 1, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2")


def test_single_process_is_fully_known(no_gpus):
    env = distenv.resolve({})
    c = env.checked()
    assert isinstance(c, Checked) and c.env is env
    assert (c.rank, c.world_size, c.local_rank, c.master_addr) == (0, 1, 0, "127.0.0.1")
    assert c.master_port == env.master_port and isinstance(c.master_port, int)
    assert c.launcher == "none" and c.launch == "per-process" and c.is_main
    with pytest.raises(AttributeError):
        c.rank = 1


def test_checked_copies_every_field_it_shows(no_gpus):
    env = distenv.resolve(dict(OMPI_4_ON_2_NODES, MASTER_ADDR="10.0.0.1"))
    c = env.checked()
    for name in Checked.__slots__[1:]:
        assert getattr(c, name) == getattr(env, name), name
    assert not c.is_main and c.rank == 3 and c.master_addr == "10.0.0.1"
    assert c.node_rank is None           # optional in the view: Open MPI does not reveal it


def test_unknown_required_fields_are_one_error_naming_what_to_set(no_gpus):
    env = distenv.resolve(OMPI_4_ON_2_NODES)      # across nodes: rank 0's host unknown
    assert env.master_addr is None
    with pytest.raises(DistEnvError) as e:
        env.checked()
    msg = str(e.value)
    assert msg.startswith("master_addr unknown in this openmpi launch") and "Fix: set MASTER_ADDR" in msg
    env = distenv.resolve(OMPI_4_ON_2_NODES, master_addr="10.0.0.1")   # the fix it names works
    assert env.checked().master_addr == "10.0.0.1"


def test_every_missing_field_is_named_at_once(no_gpus):
    env = distenv.resolve({}).replace(rank=None, master_port=None, node_rank=None)
    with pytest.raises(DistEnvError, match=r"^rank, master_port unknown .*Fix: set RANK, MASTER_PORT"):
        env.checked()
    with pytest.raises(DistEnvError, match=r"^node_rank unknown .*NODE_RANK"):
        env.require("world_size", "node_rank")


def test_per_node_launch_says_to_start_the_workers(no_gpus):
    env = distenv.resolve(dict(OMPI_4_ON_2_NODES, OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2",
                               OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="1",
                               DISTENV_NPROC_PER_NODE="2"))
    assert env.launch == distenv.PER_NODE
    with pytest.raises(DistEnvError, match=r"per-node .*Fix: start the workers with `distenv run "
                                           r"--nproc-per-node 2"):
        env.checked()


def test_require_returns_values_in_order_or_rejects_unknown_names(no_gpus):
    env = distenv.resolve(dict(OMPI_4_ON_2_NODES, MASTER_ADDR="h0"))
    assert env.require("num_nodes", "rank", "master_addr") == (2, 3, "h0")
    assert env.require() == ()
    with pytest.raises(TypeError, match="unknown DistEnv field"):
        env.require("ranks")


def test_required_fields_are_the_rendezvous_five():
    assert set(REQUIRED) == {"rank", "world_size", "local_rank", "master_addr", "master_port"}
    assert set(REQUIRED) <= set(distenv.FIELDS)


def test_import_distenv_does_not_load_the_narrowing_module():
    import subprocess
    import sys
    code = "import sys, distenv; distenv.resolve({}); print('distenv.core.checked' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout.strip()
    assert out == "False"


def test_process_index_is_the_node_rank_of_a_per_node_launch_else_the_rank(no_gpus):
    """One rule for "which process of the launch am I" (the map, Keras' worker index,
    TensorFlow's task index and the bring-up used five copies of it)."""
    per_process = distenv.resolve(OMPI_4_ON_2_NODES)
    assert (per_process.process_index, per_process.is_main) == (3, False)
    per_node = distenv.resolve({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NODEID": "1",
                                "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "2",
                                "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "n[1-2]",
                                "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "DISTENV_NPROC_PER_NODE": "4"})
    assert per_node.launch == "per-node" and per_node.rank is None
    assert (per_node.process_index, per_node.is_main) == (1, False)
    assert distenv.resolve({}).process_index == 0
