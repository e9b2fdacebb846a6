"""The resolver on a TPU slice on GKE (src/distenv/sources/gke_tpu.py).

The peer's case: JAX's own GKE TPU detection (jax/_src/clusters/cloud_tpu_cluster.py,
``GkeTpuCluster`` and ``BaseTpuCluster``, jax 0.10): the pod variables GKE's TPU webhook sets
(``TPU_WORKER_HOSTNAMES=w-0.svc,...,w-3.svc``, ``TPU_WORKER_ID=2``) and the multislice ones
JobSet/xpk add (``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_NUM_SLICES``,
``MEGASCALE_SLICE_ID``). Before this source distenv resolved them as "no launcher, rank 0 of
1", and distenv.jax passed num_processes=1 over JAX's own detection.
"""

import pytest

from distenv import DistEnvError, resolve
from distenv.sources import adapter_acts

HOSTS = "w-0.svc,w-1.svc,w-2.svc,w-3.svc"


@pytest.mark.parametrize("worker", range(4))
def test_one_slice_jax_gke_case(worker):
    env = resolve({"TPU_WORKER_HOSTNAMES": HOSTS, "TPU_WORKER_ID": str(worker)})
    assert (env.launcher, env.launch) == ("gke_tpu", "per-process")
    assert (env.rank, env.world_size) == (worker, 4)
    assert (env.local_rank, env.local_world_size, env.nproc_per_node) == (0, 1, 1)
    assert (env.node_rank, env.num_nodes) == (worker, 4)
    assert env.master_addr == "w-0.svc" and env.rank_hosts == tuple(HOSTS.split(","))
    assert "TPU_WORKER_ID" in env.provenance["rank"] and not env.notes


def test_every_worker_agrees_on_the_master_port():
    ports = {resolve({"TPU_WORKER_HOSTNAMES": HOSTS, "TPU_WORKER_ID": str(w)}).master_port
             for w in range(4)}
    other = resolve({"TPU_WORKER_HOSTNAMES": HOSTS.replace("w-", "x-"), "TPU_WORKER_ID": "0"})
    assert len(ports) == 1 and other.master_port not in ports


@pytest.mark.parametrize("slice_id,worker,rank", [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)])
def test_multislice_process_index_is_slice_times_workers_plus_worker(slice_id, worker, rank):
    env = resolve({"TPU_WORKER_HOSTNAMES": f"s{slice_id}-w-0.svc,s{slice_id}-w-1.svc",
                   "TPU_WORKER_ID": str(worker),
                   "MEGASCALE_COORDINATOR_ADDRESS": "job-slice-0-0.job.svc:8080",
                   "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": str(slice_id)})
    assert (env.rank, env.world_size) == (rank, 4)
    assert env.master_addr == "job-slice-0-0.job.svc"  # the port dropped, as JAX does
    assert (env.local_rank, env.local_world_size, env.node_rank, env.num_nodes) == (0, 1, rank, 4)
    assert env.rank_hosts is None  # the other slice's hosts are not in this pod's variables


def test_process_addresses_win_and_place_several_processes_per_host():
    env = resolve({"TPU_PROCESS_ADDRESSES": "h0:8476,h0:8477,h1:8476,h1:8477",
                   "TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "3"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.num_nodes, env.nproc_per_node, env.master_addr) == (1, 2, 2, "h0")


def test_coordinator_without_slice_count_leaves_the_counts_unknown_with_a_note():
    env = resolve({"TPU_WORKER_HOSTNAMES": "a,b", "TPU_WORKER_ID": "1",
                   "MEGASCALE_COORDINATOR_ADDRESS": "a"})
    assert env.rank is None and env.world_size is None
    assert any("MEGASCALE_NUM_SLICES" in n for n in env.notes)


@pytest.mark.parametrize("extra,match", [
    ({"TPU_WORKER_ID": "4"}, "TPU_WORKER_ID=4"),
    ({"MEGASCALE_NUM_SLICES": "2"}, "MEGASCALE_COORDINATOR_ADDRESS"),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "c", "MEGASCALE_NUM_SLICES": "2",
      "MEGASCALE_SLICE_ID": "2"}, "MEGASCALE_SLICE_ID=2"),
])
def test_contradictions_are_errors(extra, match):
    with pytest.raises(DistEnvError, match=match):
        resolve({"TPU_WORKER_HOSTNAMES": HOSTS, "TPU_WORKER_ID": "0", **extra})


def test_only_the_jax_adapters_act_on_a_tpu_pod():
    """torch-xla numbers its processes per chip: torch's variables and the torch-facing
    zero-code adapters are not distenv's to set here."""
    assert adapter_acts("gke_tpu", "jax")
    for adapter in ("torch", "lightning", "transformers", "deepspeed", "tensorflow"):
        assert not adapter_acts("gke_tpu", adapter)
    assert adapter_acts("openmpi", "torch") and adapter_acts("none", "lightning")
