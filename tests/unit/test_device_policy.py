"""The one device policy (`distenv.core.gpus.share`, `one_device`) the torch, JAX and TensorFlow
adapters follow (issue 21): which visible GPUs a process takes, decided without a framework."""
from __future__ import annotations

import pytest

from distenv import DistEnvError, resolve
from distenv.core import gpus
from distenv.core.description import PER_NODE


def _mpi(rank, size, local=None, lsize=None, **more):
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank if local is None else local),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(size if lsize is None else lsize),
            "OMPI_MCA_orte_num_nodes": "1", "OMPI_MCA_orte_hnp_uri": "77.0;tcp://10.0.0.1:300", **more}


def test_none_visible(no_gpus):
    env = _mpi(1, 2)
    for split in (False, True):
        s = gpus.share(resolve(env), env, split=split)
        assert (s.kind, s.positions, s.ids, s.count) == (gpus.NONE, (), (), 0)
        assert s.why == s.seen and "no GPU visible" in s.why
    assert gpus.one_device(resolve(env), 0, env).kind == gpus.NONE


@pytest.mark.parametrize("split", [False, True])
def test_local_rank_takes_its_part(split):
    env = _mpi(1, 2, CUDA_VISIBLE_DEVICES="4,5,6,7")
    s = gpus.share(resolve(env), env, split=split)
    assert s.kind == gpus.SLICE and s.count == 4
    # one device per process (torch, JAX) or an even slice (TensorFlow's MirroredStrategy)
    assert (s.positions, s.ids) == (((1,), ("5",)) if not split else ((2, 3), ("6", "7")))


def test_ids_without_cuda_visible_devices_are_the_driver_numbers(fake_gpus):
    fake_gpus(4)
    env = _mpi(3, 4)
    assert gpus.share(resolve(env), env).ids == ("3",)
    assert gpus.share(resolve(env), env, split=True).ids == ("3",)


@pytest.mark.parametrize("split", [False, True])
def test_a_slice_distenv_gave_is_kept(split):
    env = _mpi(1, 2, CUDA_VISIBLE_DEVICES="6,7", **{gpus.GPU_SLICE_VAR: "6,7"})
    s = gpus.share(resolve(env), env, split=split)
    assert (s.kind, s.positions, s.ids) == (gpus.GIVEN, (0, 1), ("6", "7"))
    # a marker that no longer matches (the user changed the list) counts for nothing
    other = {**env, gpus.GPU_SLICE_VAR: "5"}
    assert gpus.share(resolve(other), other, split=split).kind == gpus.SLICE


@pytest.mark.parametrize("split", [False, True])
def test_a_per_node_process_owns_every_gpu(split):
    # one Open MPI process on each of 2 nodes, asked to start 2 workers each
    env = {**_mpi(1, 2, local=0, lsize=1), "OMPI_MCA_orte_num_nodes": "2",
           "DISTENV_NPROC_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    d = resolve(env)
    assert d.launch == PER_NODE
    s = gpus.share(d, env, split=split)
    assert (s.kind, s.positions) == (gpus.NODE, (0, 1, 2, 3))


def test_fewer_gpus_than_processes():
    narrowed = _mpi(3, 4, CUDA_VISIBLE_DEVICES="6,7")     # srun --gpus-per-task=2, 4 tasks
    lone = _mpi(3, 4, CUDA_VISIBLE_DEVICES="3")            # srun --gpus-per-task=1
    # one device each: a narrowed list, or a lone device, is this process's own
    assert gpus.share(resolve(narrowed), narrowed).kind == gpus.OWN
    assert gpus.share(resolve(narrowed), narrowed).ids == ("6",)
    assert gpus.share(resolve(lone), lone).ids == ("3",)
    # a slice each: only a list narrowed to one GPU is; a GPU cannot be split
    assert gpus.share(resolve(lone), lone, split=True).kind == gpus.OWN
    crowded = gpus.share(resolve(narrowed), narrowed, split=True)
    assert crowded.kind == gpus.CROWDED and (crowded.positions, crowded.ids) == ((), ())
    assert crowded.why.startswith("4 processes on this node share 2 GPU(s)")


def test_crowded_when_nothing_narrowed(fake_gpus):
    fake_gpus(2)
    env = _mpi(3, 4)
    for split in (False, True):
        assert gpus.share(resolve(env), env, split=split).kind == gpus.CROWDED
    assert gpus.one_device(resolve(env), 2, env).kind == gpus.CROWDED
    # one GPU and nothing narrowed: one device each shares it (torch's rule), a slice cannot
    one = _mpi(3, 4, HIP_VISIBLE_DEVICES="0")  # one visible, CUDA_VISIBLE_DEVICES unset
    assert gpus.share(resolve(one), one).kind == gpus.OWN
    assert gpus.share(resolve(one), one, split=True).kind == gpus.CROWDED


def test_a_lone_process_takes_every_gpu_as_its_slice():
    env = _mpi(0, 1, CUDA_VISIBLE_DEVICES="2,3")
    assert gpus.share(resolve(env), env, split=True).kind == gpus.ALONE
    assert gpus.share(resolve(env), env, split=True).ids == ("2", "3")
    assert gpus.share(resolve(env), env).ids == ("2",)  # one device each: its first


def test_one_device_counts_what_the_framework_sees():
    # torch's count (after CUDA_VISIBLE_DEVICES), not the driver's; the marker is not looked at
    env = _mpi(1, 2, CUDA_VISIBLE_DEVICES="0,1", **{gpus.GPU_SLICE_VAR: "0,1"})
    s = gpus.one_device(resolve(env), 2, env)
    assert (s.kind, s.positions, s.ids) == (gpus.SLICE, (1,), ("1",))
    assert s.why == "local rank 1 of 2 takes device 1 of 2"


def test_the_adapters_share_the_marker():
    from distenv.jax import GPU_SLICE_VAR as jax_marker
    from distenv.tensorflow import GPU_SLICE_VAR as tf_marker

    assert jax_marker == tf_marker == gpus.GPU_SLICE_VAR == "DISTENV_GPU_SLICE"


# Launches that leave the local rank or the local count unknown (a review found every rank
# given device 0 as "local rank 0 of 1", and TensorFlow every process every GPU).
PLAIN = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"}  # no LOCAL_RANK
FLUX = {"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "1",
        "FLUX_JOB_ID": "f1", "FLUX_JOB_NNODES": "2"}  # no local size (docs/launchers.md)


@pytest.mark.parametrize("split", [False, True])
def test_an_unknown_local_rank_with_several_gpus_is_refused(fake_gpus, split):
    fake_gpus(4)
    d = resolve(PLAIN)
    assert d.local_rank is None
    s = gpus.share(d, PLAIN, split=split)
    assert s.kind == gpus.UNKNOWN and s.positions == () and "local rank is unknown" in s.why
    assert "Fix: set LOCAL_RANK and LOCAL_WORLD_SIZE where RANK is set by hand" in gpus.unknown_error(s)
    with pytest.raises(DistEnvError, match=r"local rank is unknown.*or use the CPU\.$"):
        gpus.device_index(d, 4, PLAIN, "use the CPU")
    # one visible device, or a lone process: the first device is the only choice
    assert gpus.one_device(d, 1, PLAIN).positions == (0,)
    alone = {**PLAIN, "RANK": "0", "WORLD_SIZE": "1"}
    assert gpus.one_device(resolve(alone), 4, alone).positions == (0,)


def test_a_local_rank_without_the_local_count_takes_its_own_device(fake_gpus):
    fake_gpus(4)
    d = resolve(FLUX)
    assert (d.local_rank, d.local_world_size) == (1, None)
    s = gpus.share(d, FLUX)
    assert (s.kind, s.positions) == (gpus.SLICE, (1,))
    assert s.why == "local rank 1 of at least 2 takes device 1 of 4"
    # narrowed to this task's one GPU: its first, never device 1 of 1
    mine = {**FLUX, "CUDA_VISIBLE_DEVICES": "1"}
    assert gpus.share(resolve(mine), mine).positions == (0,)
    # a slice each: the count is needed to split, and local rank 1 proves there are others
    split = gpus.share(d, FLUX, split=True)
    assert split.kind == gpus.UNKNOWN and "number of processes on its node" in split.why
    assert gpus.share(resolve(mine), mine, split=True).kind == gpus.OWN


def test_every_adapter_refuses_the_unknown_share_in_one_wording(fake_gpus):
    from distenv.jax import device_plan
    from distenv.tensorflow import gpu_assignment

    fake_gpus(4)
    d = resolve(PLAIN)
    for call in (lambda: device_plan(d, PLAIN, torch_imported=False),
                 lambda: gpu_assignment(d, PLAIN)):
        with pytest.raises(DistEnvError, match="local rank is unknown .*Fix: set LOCAL_RANK"):
            call()
