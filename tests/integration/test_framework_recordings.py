"""Replay of the framework launchers' recordings: tests/fixtures/frameworks/*.json,
written from real runs by integrations/record/record_frameworks.sh (horovodrun --gloo -np 2,
horovodrun --gloo 2x2 on the namespace nodes, deepspeed --num_gpus 2 on CPU; Ray Train's
workers from tests/e2e/ray_probe.py's records), in the format of tests/fixtures/launchers/*.json.

No launcher runs here: every rank's recorded environment goes through distenv.resolve().

1. The unit replay itself (tests/unit/test_recorded.py::test_recorded_job, loaded from its
   file and run unchanged) with two more families, horovodrun and deepspeed. The unit test's
   FAMILIES list knows neither, and every tests/fixtures/launchers/*.json must have a family
   there (and tests/unit/test_resolve.py opens every entry of that folder as a file), so
   these recordings sit beside it until those two entries are added:
   ("horovodrun", "horovodrun", "HOROVOD_LOCAL_RANK"), ("deepspeed", "deepspeed", "LOCAL_RANK").
2. Exact values per rank, expected from the launcher's own recorded variables
   (HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*; RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE, CROSS_*,
   MASTER_ADDR, MASTER_PORT), not from an earlier distenv output.
"""
import importlib.util
import json

import pytest

import harness
from distenv import DistEnvError, resolve

FIXTURES = harness.REPO / "tests" / "fixtures" / "frameworks"
FILES = sorted(FIXTURES.glob("*.json"))
FAMILIES = [("horovodrun", "horovodrun", "HOROVOD_LOCAL_RANK"),
            ("deepspeed", "deepspeed", "LOCAL_RANK"),
            ("ray", "ray", "LOCAL_RANK")]  # Ray Train's workers: tests/unit/sources/test_ray.py


def _load(path):
    with open(path) as f:
        return json.load(f)


def _unit_replay():
    spec = importlib.util.spec_from_file_location(
        "_distenv_unit_test_recorded", harness.REPO / "tests" / "unit" / "test_recorded.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_framework_recordings_exist():
    assert {_load(p)["layout"] for p in FILES} == \
        {"horovodrun-gloo-np2", "horovodrun-gloo-2x2", "deepspeed-nproc2", "ray-srun-np2",
         "ray-sbatch-2x2"}
    for p in FILES:
        assert p.stem == _load(p)["layout"]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_unit_replay_on_framework_recording(path, no_gpus, monkeypatch):
    unit = _unit_replay()
    monkeypatch.setattr(unit, "FAMILIES", FAMILIES + list(unit.FAMILIES))
    unit.test_recorded_job(str(path), no_gpus)


def _ranks(name):
    rec = _load(FIXTURES / f"{name}.json")
    return rec, [(r["env"], resolve(r["env"])) for r in rec["ranks"]]


def test_horovodrun_gloo_recording(no_gpus):
    rec, ranks = _ranks("horovodrun-gloo-np2")
    assert rec["rank_var"] == "HOROVOD_RANK" and len(ranks) == 2
    for v, d in ranks:
        assert (d.launcher, d.launch) == ("horovodrun", "per-process")
        assert (d.rank, d.world_size) == (int(v["HOROVOD_RANK"]), int(v["HOROVOD_SIZE"]))
        assert (d.local_rank, d.local_world_size) == \
            (int(v["HOROVOD_LOCAL_RANK"]), int(v["HOROVOD_LOCAL_SIZE"]))
        # one host: the cross rank/size are the node index/count on every local rank
        assert (d.node_rank, d.num_nodes) == \
            (int(v["HOROVOD_CROSS_RANK"]), int(v["HOROVOD_CROSS_SIZE"])) == (0, 1)
        assert d.master_addr == "127.0.0.1"
    assert [d.rank for _, d in ranks] == [0, 1]
    # both ranks meet on one port (taken from horovodrun's rendezvous, the same on both)
    assert len({(v["HOROVOD_GLOO_RENDEZVOUS_ADDR"], v["HOROVOD_GLOO_RENDEZVOUS_PORT"])
                for v, _ in ranks}) == 1
    assert len({(d.master_addr, d.master_port) for _, d in ranks}) == 1
    assert all(d.master_port for _, d in ranks)


def test_deepspeed_runner_recording(no_gpus):
    rec, ranks = _ranks("deepspeed-nproc2")
    assert rec["rank_var"] == "RANK" and len(ranks) == 2
    for v, d in ranks:
        assert (d.launcher, d.launch) == ("deepspeed", "per-process")
        assert (d.rank, d.world_size) == (int(v["RANK"]), int(v["WORLD_SIZE"]))
        assert (d.local_rank, d.local_world_size) == (int(v["LOCAL_RANK"]), int(v["LOCAL_SIZE"]))
        assert (d.node_rank, d.num_nodes) == (int(v["CROSS_RANK"]), int(v["CROSS_SIZE"])) == (0, 1)
        assert (d.master_addr, d.master_port) == (v["MASTER_ADDR"], int(v["MASTER_PORT"]))
        exported = d.export({})
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            assert exported[name] == v[name], name
    assert [d.rank for _, d in ranks] == [0, 1]


def test_horovodrun_gloo_two_node_recording(no_gpus):
    rec, ranks = _ranks("horovodrun-gloo-2x2")
    hosts = [r["hostname"] for r in rec["ranks"]]
    assert rec["rank_var"] == "HOROVOD_RANK" and hosts == ["node1", "node1", "node2", "node2"]
    for (v, d), host in zip(ranks, hosts):
        assert v["HOROVOD_HOSTNAME"] == host
        assert (d.launcher, d.launch) == ("horovodrun", "per-process")
        assert (d.rank, d.world_size) == (int(v["HOROVOD_RANK"]), int(v["HOROVOD_SIZE"]))
        assert (d.local_rank, d.local_world_size) == \
            (int(v["HOROVOD_LOCAL_RANK"]), int(v["HOROVOD_LOCAL_SIZE"]))
        if v["HOROVOD_LOCAL_RANK"] == "0":  # the cross rank is the host index there only
            assert (d.node_rank, d.num_nodes) == \
                (int(v["HOROVOD_CROSS_RANK"]), int(v["HOROVOD_CROSS_SIZE"])) == \
                (("node1", "node2").index(host), 2)
        else:
            assert (d.node_rank, d.num_nodes) == (None, None)
        # horovodrun names no rank-0 host (its rendezvous server is horovodrun's own):
        # unknown, and export says what to set
        assert d.master_addr is None
        with pytest.raises(DistEnvError, match="MASTER_ADDR"):
            d.export({})
        fixed = resolve({**v, "MASTER_ADDR": "node1"})
        assert fixed.export({})["RANK"] == v["HOROVOD_RANK"]
        assert fixed.master_addr == "node1"
    assert len({d.master_port for _, d in ranks}) == 1
