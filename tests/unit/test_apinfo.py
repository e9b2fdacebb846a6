"""Cray PALS's apinfo file (src/distenv/discovery/apinfo.py): the real files SLURM 22.05's cray_shasta
plugin wrote on the two namespace nodes (kept, base64, in
tests/fixtures/launchers/cluster-srun-cray-*.json by integrations/record/record_env.py), and
files cut short, of another version, oversized or pointing outside themselves -- which leave
the fields unknown with a note, never another exception."""
from __future__ import annotations

import base64
import glob
import json
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distenv import resolve
from distenv.discovery import apinfo
from distenv.discovery.apinfo import ApinfoError, ApinfoUnreadable
from distenv.core.description import DECLINED
from distenv.discovery import complete

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "launchers")
CRAY = sorted(glob.glob(os.path.join(FIXTURES, "cluster-srun-cray-*.json")))


def recorded(name: str) -> dict:
    with open(os.path.join(FIXTURES, f"{name}.json")) as f:
        return json.load(f)


def data_of(rec: dict, rank: int = 0) -> bytes:
    return base64.b64decode(rec["ranks"][rank]["apinfo"])


ARBITRARY = data_of(recorded("cluster-srun-cray-n4-arbitrary"))
HEADER = struct.Struct("@i N N N i N N i N N i N N i N N i")


@pytest.mark.parametrize("path", CRAY, ids=[os.path.basename(p)[:-5] for p in CRAY])
def test_the_recorded_files_place_every_rank_where_it_ran(path):
    with open(path) as f:
        rec = json.load(f)
    hosts = [r["hostname"] for r in rec["ranks"]]  # ranks sorted by SLURM_PROCID
    for r in rec["ranks"]:
        layout = apinfo.parse(base64.b64decode(r["apinfo"]))
        assert layout.version == 1
        assert layout.hosts == hosts  # every rank's host, the same file on every node
        # the node-local index is SLURM's local id
        assert layout.local[int(r["env"]["SLURM_PROCID"])] == int(r["env"]["SLURM_LOCALID"])


def test_arbitrary_layout_puts_rank_0_on_node2():
    assert apinfo.parse(ARBITRARY).hosts == ["node2", "node1", "node1", "node2"]


def with_header(data: bytes, **fields) -> bytes:
    names = ("version", "total", "cps", "cpo", "ncp", "cs", "co", "nc", "ps", "po", "npes",
             "ns", "no", "nn", "nis", "nio", "nni")
    values = dict(zip(names, HEADER.unpack_from(data)))
    values.update(fields)
    return HEADER.pack(*(values[n] for n in names)) + data[HEADER.size:]


def version5(data: bytes) -> bytes:
    """The same layout as HPE's version 5 writes it: three more header fields (status
    offset, distance size and offset), every section moved back by their 24 bytes."""
    extra = struct.calcsize("@NNN")
    values = list(HEADER.unpack_from(data))
    values[0] = 5
    values[1] += extra
    for i in (3, 6, 9, 12, 15):  # the offsets
        values[i] += extra
    return HEADER.pack(*values) + struct.pack("@NNN", 0, 0, 0) + data[HEADER.size:]


def test_version_5_reads_the_same():
    assert apinfo.parse(version5(ARBITRARY)).hosts == ["node2", "node1", "node1", "node2"]


@pytest.mark.parametrize("bad, why", [
    (ARBITRARY[:100], "less than its header"),
    (ARBITRARY[:-10], "header says 332 bytes but the file has 322"),
    (with_header(ARBITRARY, version=2), "version 2"),
    (with_header(ARBITRARY, version=-1), "version -1"),
    (with_header(ARBITRARY, npes=1000), "PE section"),
    (with_header(ARBITRARY, nn=0), "node section"),
    (with_header(ARBITRARY, po=1 << 40), "PE section"),
    (with_header(ARBITRARY, no=10), "node section"),
    (with_header(ARBITRARY, ps=4), "PE section"),
    (b"\0" * (apinfo.MAX_BYTES + 1), "more than distenv reads"),
])
def test_a_file_distenv_cannot_read_says_why(bad, why):
    with pytest.raises(ApinfoUnreadable, match="Fix:") as err:
        apinfo.parse(bad)
    assert why in str(err.value)


def test_a_node_index_outside_the_nodes_is_refused():
    po = HEADER.unpack_from(ARBITRARY)[9]
    bad = bytearray(ARBITRARY)
    struct.pack_into("@iii", bad, po, 0, 0, 7)  # rank 0 on node 7 of 2
    with pytest.raises(ApinfoUnreadable, match="rank 0 of the apinfo file is on node 7"):
        apinfo.parse(bytes(bad))


def test_an_empty_host_name_is_refused():
    no = HEADER.unpack_from(ARBITRARY)[12]
    bad = bytearray(ARBITRARY)
    bad[no + 4] = 0
    with pytest.raises(ApinfoUnreadable, match="node 0 of the apinfo file has no usable host name"):
        apinfo.parse(bytes(bad))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 331), st.binary(min_size=1, max_size=8))
def test_random_and_mangled_files_raise_only_apinfo_errors(noise, at, patch):
    for data in (noise, ARBITRARY[:at] + patch + ARBITRARY[at + len(patch):]):
        try:
            layout = apinfo.parse(data)
        except ApinfoUnreadable:
            continue
        assert len(layout.hosts) == len(layout.local) >= 1 and all(layout.hosts)


def test_read_checks_the_file_is_this_jobs(tmp_path):
    path = tmp_path / "apinfo"
    path.write_bytes(ARBITRARY)
    assert apinfo.read(str(path), 0, host="node2").hosts[0] == "node2"
    assert apinfo.read(str(path), 1, host="node1.cluster").hosts[1] == "node1"  # short names
    with pytest.raises(ApinfoError, match="places rank 0 on node2, but it runs on node1") as err:
        apinfo.read(str(path), 0, host="node1")
    assert not isinstance(err.value, ApinfoUnreadable)  # a contradiction, not a soft failure
    with pytest.raises(ApinfoError, match="lists 4 ranks but this is rank 9"):
        apinfo.read(str(path), 9, host="node2")
    with pytest.raises(ApinfoUnreadable, match="cannot read the apinfo file"):
        apinfo.read(str(tmp_path / "missing"), 0)


def cray_env(rank: int, path: str) -> dict:
    env = dict(recorded("cluster-srun-cray-n4-arbitrary")["ranks"][rank]["env"])
    env["PALS_APINFO"] = path
    return env


@pytest.mark.parametrize("rank", range(4))
def test_discovery_fills_what_slurms_variables_cannot(tmp_path, monkeypatch, rank):
    """srun --mpi=cray_shasta, arbitrary: SLURM leaves master and node rank unknown; the
    apinfo file proves them, no communication."""
    path = tmp_path / "apinfo"
    path.write_bytes(ARBITRARY)
    environ = cray_env(rank, str(path))
    hosts = ["node2", "node1", "node1", "node2"]
    monkeypatch.setattr(apinfo, "hostname", lambda: hosts[rank])
    env = resolve(environ)
    assert env.launcher == "slurm" and env.master_addr is None and env.node_rank is None
    got = complete(env, need=("master_addr", "node_rank"), environ=environ)
    assert (got.master_addr, got.node_rank, got.num_nodes, got.local_world_size) == (
        "node2", [0, 1, 1, 0][rank], 2, 2)
    assert got.rank_hosts == tuple(hosts) and got.hosts == ("node2", "node1")
    assert got.provenance["master_addr"] == "Cray PALS apinfo (PALS_APINFO, version 1)"
    # no note says a field is unknown once the file filled it
    assert not any("master_addr" in n or "node_rank" in n for n in got.notes), got.notes


def test_an_unreadable_file_leaves_the_fields_unknown_with_a_note(tmp_path, monkeypatch, caplog):
    path = tmp_path / "apinfo"
    path.write_bytes(with_header(ARBITRARY, version=3))
    environ = cray_env(0, str(path))
    monkeypatch.setattr(apinfo, "hostname", lambda: "node2")
    env = resolve(environ)
    with caplog.at_level("WARNING", logger="distenv"):
        got = complete(env, need=("master_addr",), environ=environ)
    assert got.master_addr is None
    assert "version 3" in caplog.text
    (said,) = [n for n in got.notes if getattr(n, "kind", None) == DECLINED]
    assert "version 3" in said and "Fix:" in said
    with pytest.raises(ApinfoUnreadable, match="version 3"):
        from distenv.discovery import discover

        monkeypatch.setattr("os.environ", environ)
        discover(env, method="apinfo")


def test_off_switch(tmp_path):
    path = tmp_path / "apinfo"
    path.write_bytes(ARBITRARY)
    assert apinfo.offer({"PALS_APINFO": str(path), "DISTENV_APINFO": "0"}) == (None, "DISTENV_APINFO=0")
    assert apinfo.offer({"PALS_APINFO": str(path)}) == (str(path), "")
    assert apinfo.offer({})[0] is None
