"""The resolver on MPICH and Intel MPI (Hydra's `mpiexec`) environments written by hand
(src/distenv/sources/hydra.py); recorded ones: test_recorded.py."""

import pytest

from distenv import DistEnvError, resolve
from envs import hydra_rank


def test_mpich_hydra():
    env = resolve(hydra_rank(3, 4, 1, 2, PMI_FD="6"))
    assert env.launcher == "mpich"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert env.node_rank is None and env.master_addr is None


def test_mpich_pmi_port_has_no_world_size():
    env = resolve({"PMI_ID": "1", "PMI_PORT": "vm:3333", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert env.rank == 1 and env.world_size is None
    assert any("pmi-port" in n for n in env.notes)
    with pytest.raises(DistEnvError, match="WORLD_SIZE"):
        env.export({})


def test_intel_mpi_gives_node_id():
    env = resolve(hydra_rank(2, 4, 0, 2, HYDRA_BSTRAP_NODE_ID="1", I_MPI_ROOT="x"))
    assert env.launcher == "intelmpi" and env.node_rank == 1
