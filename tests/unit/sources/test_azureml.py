"""The resolver on Azure ML environments (src/distenv/sources/azureml.py), written from its
documentation (tests/fixtures/platforms/azureml_*.json)."""

import pytest

from distenv import resolve

from envs import documented


@pytest.mark.parametrize("name", documented("azureml"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


# -- a launcher inside the job that names its own master -------------------------------------
#: torchrun per node with a c10d rendezvous at Azure's master node: rank 0 went to the other
#: node (torch orders participants by address; the real run is
#: tests/integration/test_platform_master.py). This is node 10.0.0.5's worker.
TORCHRUN_C10D = {
    "TORCHELASTIC_RUN_ID": "j1", "RANK": "1", "GROUP_RANK": "1", "LOCAL_RANK": "0",
    "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "34897",
    "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "AZ_BATCH_MASTER_NODE": "10.0.0.5:6000", "AZ_BATCH_HOST_LIST": "10.0.0.5,10.0.0.4",
    "AZUREML_RUN_ID": "run1",
}


def test_torchrun_master_is_kept_over_azure_master_node(no_gpus):
    d = resolve(TORCHRUN_C10D)
    assert (d.launcher, d.platform, d.master_addr) == ("torchrun", "azureml", "10.0.0.4")
    assert d.provenance["master_addr"] == "MASTER_ADDR (set by torchrun)"
    assert any("AZ_BATCH_MASTER_NODE" in n and "10.0.0.5" in n and "10.0.0.4 is used" in n
               for n in d.notes), d.notes
    # node 1 runs on the list's first host: the list's order is not torchrun's node order
    assert (d.node_rank, d.num_nodes, d.hosts) == (1, 2, None)


def test_deepspeed_launcher_master_is_kept_over_azure_master_node(no_gpus):
    env = {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "CROSS_RANK": "1", "CROSS_SIZE": "2",
           "LOCAL_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500",
           "AZ_BATCH_MASTER_NODE": "10.0.0.4:6000", "AZ_BATCH_HOST_LIST": "10.0.0.4,10.0.0.5",
           "AZUREML_RUN_ID": "run1"}
    d = resolve(env)
    assert (d.launcher, d.master_addr) == ("deepspeed", "10.0.0.5"), d.explain()


def test_agreeing_torchrun_master_gives_no_note(no_gpus):
    d = resolve({**TORCHRUN_C10D, "MASTER_ADDR": "10.0.0.5"})
    assert d.master_addr == "10.0.0.5"
    assert not any("AZ_BATCH_MASTER_NODE" in n for n in d.notes), d.notes


def test_mpi_job_still_takes_azure_master_node(no_gpus):
    env = {k: v for k, v in TORCHRUN_C10D.items() if not k.startswith(("TORCH", "GROUP", "LOCAL_",
                                                                       "RANK", "WORLD", "MASTER"))}
    d = resolve(env)
    assert (d.launcher, d.master_addr) == ("openmpi", "10.0.0.5"), d.explain()
    assert d.provenance["master_addr"] == "AZ_BATCH_MASTER_NODE (Azure ML's master node)"
    assert d.hosts == ("10.0.0.5", "10.0.0.4")
