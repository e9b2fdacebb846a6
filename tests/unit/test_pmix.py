"""distenv.discovery.pmix without a launcher: the ctypes layout and value decoding, the library lookup,
the guards, the hand-over to an exec'ed command, the wiring into discovery, and -- against a
fake libpmix compiled here (skipped without a C compiler) -- the query in both modes and its
timeout. The real servers: tests/integration/test_pmix_discovery.py."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest

from distenv import DistEnvError, discovery, resolve
from distenv.discovery import pmix
from distenv.discovery import PMIX_WHY, complete, discover
from distenv.discovery.apply import apply
from distenv.discovery.services import Pmix
from envs import ompi


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No answer kept from another test; PMIx variables only where a test sets them."""
    monkeypatch.setattr(pmix, "_done", None)
    monkeypatch.setattr(pmix, "_kept", None)
    for k in list(os.environ):
        if k.startswith(("PMIX_", "OMPI_", "PMI_", "SLURM_", "MPI_LOCAL")) or k in (
                "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", pmix.HELD_VAR, "DISTENV_PMIX"):
            monkeypatch.delenv(k)


# -- layout and decoding ----------------------------------------------------------------------
def test_struct_layout_matches_pmix_common_h():
    proc_t, value_t = pmix._types()
    assert ctypes.sizeof(proc_t) == 260 and proc_t.rank.offset == 256  # char[256] + uint32
    assert value_t.type.offset == 0 and value_t.data.offset == 8  # uint16, then the union
    assert ctypes.sizeof(value_t) == 32


@pytest.mark.parametrize("vtype,data,want", [
    (14, struct.pack("=I", 4096) + b"\xff" * 4, 4096),          # UINT32: only its 4 bytes
    (13, struct.pack("=H", 7) + b"\xee" * 6, 7),                # UINT16
    (40, struct.pack("=I", 3), 3),                              # PROC_RANK
    (6, struct.pack("=i", -2), -2),                             # INT
    (4, struct.pack("@N", 2 ** 40), 2 ** 40),                   # SIZE
    (15, struct.pack("=Q", 2 ** 63), 2 ** 63),                  # UINT64
    (3, b"node2\0garbage", "node2"),                            # STRING: up to the NUL
    (1, b"\1", None), (21, b"", None),                          # BOOL, VALUE: not read
])
def test_decode(vtype, data, want):
    assert pmix.decode(vtype, data.ljust(8, b"\0")) == want


def test_read_value_follows_the_string_pointer():
    _, value_t = pmix._types()
    text = ctypes.create_string_buffer(b"node1.example")
    v = value_t()
    v.type = 3
    ctypes.memmove(ctypes.addressof(v) + 8, ctypes.byref(ctypes.c_void_p(ctypes.addressof(text))), 8)
    assert pmix.read_value(v) == "node1.example"
    v.type = 14
    ctypes.memmove(ctypes.addressof(v) + 8, struct.pack("=Q", (7 << 32) | 4), 8)
    assert pmix.read_value(v) == 4  # the high bytes of the union are not the uint32's


# -- which library -------------------------------------------------------------------------------
MAPS = """\
7f00-7f10 r--p 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.6.2
7f10-7f20 r-xp 00010000 08:01 11 /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.6.2
7f20-7f30 rw-s 00000000 00:1f 12 /tmp/ompi.vm.0/pid.1/pmix_dstor_ds12_1/dstore_sm.lock
7f30-7f40 r-xp 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
7f40-7f50 rw-p 00000000 00:00 0
"""


def test_mapped_finds_the_library_not_the_lock_files():
    assert pmix.mapped(MAPS) == ["/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.6.2"]
    assert pmix.mapped("") == []


def exists_in(*paths):
    return lambda p: p in paths


def test_the_server_s_own_library_comes_first():
    libs, _ = pmix.candidates({"PMIX_PREFIX": "/opt/ompi5"}, "prrte", 1, own_maps="",
                              parent_maps=MAPS, parent_exe="/opt/ompi5/bin/prterun",
                              exists=exists_in("/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.6.2",
                                               "/opt/ompi5/lib/openmpi/libpmix.so.2"))
    assert libs == ["/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.6.2",
                    "/opt/ompi5/lib/openmpi/libpmix.so.2"]


def test_a_library_already_in_this_process_is_the_only_choice():
    libs, _ = pmix.candidates({"PMIX_PREFIX": "/opt/ompi5"}, "prrte", 1,
                              own_maps="1-2 r-xp 0 0:0 1 /opt/other/lib/libpmix.so.2\n",
                              parent_maps=MAPS, parent_exe="/opt/ompi5/bin/prterun",
                              exists=lambda p: True)
    assert libs == ["/opt/other/lib/libpmix.so.2"]


def test_prefix_then_the_daemon_s_install_when_its_maps_are_unreadable():
    libs, tried = pmix.candidates({"PMIX_PREFIX": "/opt/ompi5"}, "prrte", 1, own_maps="",
                                  parent_maps="", parent_exe="/opt/prrte/bin/prted",
                                  exists=exists_in("/opt/ompi5/lib/openmpi/libpmix.so.2",
                                                   "/opt/prrte/lib/libpmix.so.2"))
    assert libs == ["/opt/ompi5/lib/openmpi/libpmix.so.2", "/opt/prrte/lib/libpmix.so.2"]
    assert any("/proc/1/maps" in t for t in tried)
    assert any("/opt/ompi5/lib/libpmix.so.2 (PMIX_PREFIX: no such file)" == t for t in tried)


def _fake_lib(tmp_path, version):
    d = tmp_path / f"lib-{version}"
    d.mkdir()
    (d / "libpmix.so.2").write_bytes(b"\x7fELF...OpenPMIx " + version.encode() + b" (PMIx Standard: 4.2)...")
    return d


@pytest.mark.parametrize("kind", ["slurm", "orte", "prrte"])
def test_a_library_the_server_does_not_prove_is_taken_only_at_the_servers_release(tmp_path, kind):
    """Where nothing the server shows names its library (SLURM's stepd, a server in another
    user or pid namespace), a libpmix this process could load is taken only when its file
    carries the server's release (PMIX_VERSION): another release could break MPI_Init."""
    d = _fake_lib(tmp_path, "4.2.2rc2")
    environ = {"LD_LIBRARY_PATH": str(d), "PMIX_VERSION": "4.2.2rc2"}
    libs, _ = pmix.candidates(environ, kind, None, own_maps="")
    assert libs == [str(d / "libpmix.so.2")]
    libs, tried = pmix.candidates({**environ, "PMIX_VERSION": "9.9.9"}, kind, None, own_maps="")
    assert libs == [] and f"{d / 'libpmix.so.2'} (not PMIx 9.9.9, the server's)" in tried
    libs, tried = pmix.candidates({"LD_LIBRARY_PATH": str(d)}, kind, None, own_maps="")
    assert libs == [] and any("PMIX_VERSION is not set" in t for t in tried)


def test_open_mpis_prefix_is_looked_at_and_the_servers_own_library_comes_first(tmp_path):
    prefix = tmp_path / "ompi5"
    (prefix / "lib" / "openmpi").mkdir(parents=True)
    (prefix / "lib" / "openmpi" / "libpmix.so.2").write_bytes(b"OpenPMIx 5.0.11rc1 (x)")
    libs, _ = pmix.candidates({"OPAL_PREFIX": str(prefix), "PMIX_VERSION": "5.0.11rc1"}, "prrte",
                              None, own_maps="")
    assert libs == [str(prefix / "lib" / "openmpi" / "libpmix.so.2")]
    libs, _ = pmix.candidates({}, "slurm", 1, own_maps="", parent_maps=MAPS, parent_exe="",
                              exists=lambda p: True)
    assert libs == ["/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.6.2"]


@pytest.mark.parametrize("uri, kind", [
    ("pmix-server.896;tcp4://127.0.0.1:60827", "slurm"),
    ("prterun-node1-32707@0.1;tcp4://127.0.0.1:43565", "prrte"),
    ("888537088.0;tcp4://127.0.0.1:50325", "orte"),
    ("something-else;tcp4://127.0.0.1:1", None),
])
def test_the_servers_kind_from_its_uri(uri, kind):
    """Recorded URIs (tests/fixtures/launchers/cluster-*-2x2.json): what tells the kind where
    the server itself cannot be seen (a container's own pid namespace)."""
    assert pmix.kind_from_uri({"PMIX_SERVER_URI4": uri, "PMIX_SERVER_URI41": uri}) == kind


@pytest.mark.parametrize("exe,comm,want", [
    ("/usr/bin/orterun", "mpirun.openmpi", "orte"), ("/usr/bin/orted", "orted", "orte"),
    ("/opt/o5/bin/prterun", "prterun", "prrte"), ("/opt/o5/bin/prted", "prted", "prrte"),
    ("", "slurmstepd", "slurm"),  # another user's daemon: only its name is readable
    ("", "mpirun.openmpi", "orte"), ("/usr/bin/python3.11", "python", None),
    ("/usr/bin/bash", "bash", None), ("", "", None),
])
def test_server_kind(exe, comm, want):
    assert pmix.server_kind(1, exe=exe, comm=comm)[1] == want


# -- guards --------------------------------------------------------------------------------------
SERVER_ENV = {"PMIX_NAMESPACE": "prterun-vm-1@1", "PMIX_RANK": "0",
              "PMIX_SERVER_URI41": "prterun-vm-1@0.0;tcp4://127.0.0.1:1"}


@pytest.mark.parametrize("environ,why", [
    ({}, "no PMIx server"),
    ({"PMIX_NAMESPACE": "x", "PMIX_RANK": "0"}, "no PMIx server"),
    ({**SERVER_ENV, "DISTENV_PMIX": "0"}, "DISTENV_PMIX=0"),
    ({**SERVER_ENV, "PMIX_RANK": "x"}, "is not a rank"),
    ({**SERVER_ENV, pmix.HELD_VAR: "1;ns;a*2"}, "belongs to process 1"),
    (SERVER_ENV, "(orted, prted, prterun, mpirun, slurmstepd)"),  # no launcher daemon above pytest
    # a URI variable of a release not in pmix.URIS: still a server (then the same refusal)
    ({"PMIX_NAMESPACE": "x", "PMIX_RANK": "0", "PMIX_SERVER_URI6": "x.0;tcp4://127.0.0.1:1"},
     "(orted, prted, prterun, mpirun, slurmstepd)"),
])
def test_offer_refuses(environ, why):
    found, why_not = pmix.offer(environ)
    assert found is None and why in why_not


def test_query_without_a_library_says_what_was_tried():
    found = pmix.Offer("ns", 0, "orte", "orted", [], ["/x/libpmix.so.2 (PMIX_PREFIX: no such file)"],
                       "PMIx server orted")
    with pytest.raises(pmix.PMIxUnavailable, match=r"tried: /x/libpmix.so.2 .*Fix: set MASTER_ADDR"):
        pmix.query({}, timeout=5, found=found)
    with pytest.raises(pmix.PMIxUnavailable, match=r"/etc/hostname \(.*\).*Fix:"):
        pmix._load(["/etc/hostname"], [])


# -- discovery wiring ----------------------------------------------------------------------------
def ompi4(rank):  # Open MPI 4, 4 ranks on 2 nodes, mpirun on a host that runs no rank
    return ompi(rank, 4, rank % 2, 2, node_rank_trap=False, PMIX_NAMESPACE="1234", PMIX_RANK=str(rank))


def placement(rank, hosts=("node2", "node2", "node1", "node1")):
    return pmix.Placement(rank, len(hosts), list(hosts), "1234", "/lib/libpmix.so.2", "4.2",
                          "in-process", 0.01)


def test_from_pmix_fills_the_placement():
    env = resolve(ompi4(3))
    got = apply(env, Pmix.answer(placement(3), "orted"))
    assert (got.master_addr, got.node_rank, got.num_nodes, got.local_world_size) == ("node2", 1, 2, 2)
    assert got.hosts == ("node2", "node1") and got.rank_hosts == ("node2", "node2", "node1", "node1")
    assert got.provenance["master_addr"] == f"{PMIX_WHY} (the host of every rank, orted)"


def test_from_pmix_refuses_another_job_s_rank():
    with pytest.raises(DistEnvError, match=r"but PMIx placement .* says rank 2"):
        apply(resolve(ompi4(3)), Pmix.answer(placement(2)))


def test_complete_and_auto_use_pmix_without_mpi4py(monkeypatch):
    found = pmix.Offer("1234", 3, "orte", "orted", ["/lib/libpmix.so.2"], [], "PMIx server orted")
    calls = []
    monkeypatch.setattr(pmix, "offer", lambda environ=None: (found, ""))
    monkeypatch.setattr(pmix, "query", lambda **kw: calls.append(kw) or placement(3))
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # not installed
    env = resolve(ompi4(3))
    assert env.master_addr is None
    got = complete(env, need=("master_addr",))
    assert got.master_addr == "node2" and got.node_rank == 1
    assert discover(env, method="auto").master_addr == "node2"
    assert discover(env, method="pmix").master_addr == "node2"
    assert len(calls) == 3
    assert complete(got, need=("master_addr",)) is got  # known: no query


def test_complete_without_a_library_leaves_fields_unknown_and_says_why(monkeypatch, caplog):
    found = pmix.Offer("1234", 3, "orte", "orted", [], ["/proc/9/maps (none readable)"], "x")
    monkeypatch.setattr(pmix, "offer", lambda environ=None: (found, ""))
    env = resolve(ompi4(3))
    with caplog.at_level("WARNING", logger="distenv"):
        got = complete(env, need=("master_addr",))
    assert got.master_addr is None
    assert any("PMIx" in n and "/proc/9/maps" in n for n in got.notes)
    assert "/proc/9/maps" in caplog.text
    with pytest.raises(pmix.PMIxUnavailable, match="/proc/9/maps"):
        discover(env, method="pmix")


def test_handoff_round_trip(monkeypatch):
    monkeypatch.setattr(pmix, "_done", (os.getpid(), placement(3)))
    held = pmix.handoff()
    assert held == f"{os.getpid()};1234;node2*2,node1*2"
    env = {**ompi4(3), pmix.HELD_VAR: held}
    got = pmix.inherited(env)
    assert got is not None and got.hosts == ["node2", "node2", "node1", "node1"] and got.rank == 3
    assert pmix.inherited({**env, pmix.HELD_VAR: "1;1234;a*4"}) is None  # another pid
    assert pmix.inherited({**env, "PMIX_NAMESPACE": "999"}) is None  # another job
    found, why = pmix.offer({**env, "PMIX_SERVER_URI4": "x"})
    assert found is None and "before it exec'ed" in why


# -- a fake libpmix: both modes, the finalize, the timeout ------------------------------------------
FAKE_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef struct { char nspace[256]; uint32_t rank; } proc_t;
typedef struct { uint16_t type; union { char *s; uint32_t u32; uint64_t pad[3]; } d; } value_t;
static int count = 0;
static void log_call(const char *what) {
    const char *f = getenv("FAKE_LOG");
    if (f) { FILE *o = fopen(f, "a"); fprintf(o, "%s %d\n", what, (int)getpid()); fclose(o); }
}
const char *PMIx_Get_version(void) { return "FakePMIx 0.1"; }
int PMIx_Initialized(void) { return count > 0; }
int PMIx_Init(proc_t *me, void *info, size_t n) {
    /* Read the environment at once: a server that never answers leaves this call running in
       a daemon thread after its test, whose monkeypatch then removes these variables. */
    const char *ns = getenv("PMIX_NAMESPACE"), *rk = getenv("FAKE_RANK"), *s = getenv("FAKE_SLEEP");
    if (!ns || !rk) return -1;
    if (s) { sleep(atoi(s)); return -1; }  /* never answers in time, then fails */
    strncpy(me->nspace, ns, 255);
    me->rank = (uint32_t)atoi(rk);
    count++; log_call("init"); return 0;
}
int PMIx_Finalize(void *info, size_t n) { count--; log_call("finalize"); return 0; }
int PMIx_Get(const proc_t *p, const char *key, void *info, size_t n, value_t **out) {
    log_call("get");
    char *hosts = strdup(getenv("FAKE_HOSTS")), *h = strtok(hosts, ",");
    uint32_t size = 0, r = 0;
    const char *mine = NULL;
    for (; h; h = strtok(NULL, ","), size++) if (size == p->rank) mine = h;
    value_t *v = calloc(1, sizeof *v);
    if (!strcmp(key, "pmix.job.size") && p->rank == 0xfffffffe) { v->type = 14; v->d.pad[0] = ((uint64_t)9 << 32) | size; }
    else if (!strcmp(key, "pmix.hname") && mine) { v->type = 3; v->d.s = strdup(mine); }
    else if (!strcmp(key, "pmix.lpeers") && p->rank == 0xfffffffe && getenv("FAKE_LPEERS")) {
        if (!strcmp(getenv("FAKE_LPEERS"), "error")) { free(v); return -25; }
        v->type = 3; v->d.s = strdup(getenv("FAKE_LPEERS")); }
    else { free(v); return -46; }
    *out = v; return 0;
}
"""


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake libpmix")
    out = tmp_path_factory.mktemp("fakepmix")
    (out / "fake.c").write_text(FAKE_C)
    lib = out / "libpmix.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(out / "fake.c")], check=True,
                   timeout=120)
    return str(lib)


def fake_env(monkeypatch, tmp_path, rank=1, **extra):
    log = tmp_path / "calls"
    for k, v in {"PMIX_NAMESPACE": "fake@1", "FAKE_RANK": str(rank), "FAKE_LOG": str(log),
                 "FAKE_HOSTS": "node2,node2,node1", **extra}.items():
        monkeypatch.setenv(k, v)
    return log


def calls(log, gets=False):
    """The fake's log: init and finalize calls (and every PMIx_Get with `gets`)."""
    lines = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [c for c in lines if gets or c[0] in ("init", "finalize")]


def test_child_mode_queries_in_another_process_and_finalizes_there(fake_lib, monkeypatch, tmp_path):
    """A threaded process (this test worker's) starts a fresh interpreter for the query."""
    log = fake_env(monkeypatch, tmp_path)
    monkeypatch.setattr(pmix, "single_threaded", lambda: False)
    found = pmix.Offer("fake@1", 1, "prrte", "prted", [fake_lib], [], "PMIx server prted")
    loaded_before = fake_lib in open("/proc/self/maps").read()  # by another test's in-process run
    got = pmix.query(timeout=120, found=found)
    assert (got.rank, got.size, got.hosts, got.mode) == (1, 3, ["node2", "node2", "node1"], "child")
    assert got.lib == fake_lib and got.version == "FakePMIx 0.1" and got.how == "interpreter"
    (init, child), (fin, child2) = calls(log)
    assert (init, fin) == ("init", "finalize") and child == child2 != str(os.getpid())
    assert pmix.used() and pmix.query(timeout=1) is got  # once per process
    assert (fake_lib in open("/proc/self/maps").read()) == loaded_before  # nothing loaded here


#: A single-threaded rank: the query process is a fork (no interpreter to start).
FORKED = r"""
import json, os, sys, threading
from distenv.discovery import pmix
found = pmix.Offer("fake@1", 1, "prrte", "prted", [sys.argv[1]], [], "PMIx server prted")
assert pmix.single_threaded()
got = pmix.query(timeout=60, found=found)
maps = open("/proc/self/maps").read()
# a thread now: the same process must not fork for a second query
t = threading.Thread(target=lambda: None); t.start(); t.join()
print(json.dumps({"pid": os.getpid(), "hosts": got.hosts, "how": got.how, "mode": got.mode,
                  "loaded_here": sys.argv[1] in maps, "stdout_ok": True}))
"""


def test_a_single_threaded_rank_forks_the_query_process(fake_lib, tmp_path):
    """The fork answers as the interpreter does, finalizes in the child, leaves nothing of
    PMIx loaded here, and prints nothing twice (this process's unflushed output stays its own)."""
    log = tmp_path / "calls"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PMIX_")},
           "PYTHONPATH": os.pathsep.join(sys.path), "PMIX_NAMESPACE": "fake@1",
           "FAKE_RANK": "1", "FAKE_LOG": str(log), "FAKE_HOSTS": "node2,node2,node1"}
    p = subprocess.run([sys.executable, "-c", "print('before', end='');" + FORKED, fake_lib],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("before") == 1
    got = json.loads(p.stdout.replace("before", "", 1))
    assert (got["hosts"], got["how"], got["mode"]) == (["node2", "node2", "node1"], "fork", "child")
    assert not got["loaded_here"]
    (init, child), (fin, child2) = calls(log)
    assert (init, fin) == ("init", "finalize") and child == child2 != str(got["pid"])


def test_in_process_mode_stays_initialized_until_exit_or_exec(fake_lib, monkeypatch, tmp_path):
    log = fake_env(monkeypatch, tmp_path)
    found = pmix.Offer("fake@1", 1, "orte", "orted", [fake_lib], [], "PMIx server orted")
    got = pmix.query(timeout=120, found=found)
    assert (got.hosts, got.mode) == (["node2", "node2", "node1"], "in-process")
    assert calls(log) == [["init", str(os.getpid())]]  # kept open: a later MPI_Init shares it
    assert pmix.handoff() == f"{os.getpid()};fake@1;node2*2,node1*1"  # before an exec ...
    assert calls(log)[-1] == ["finalize", str(os.getpid())]  # ... it is finalized
    pmix._finalize_at_exit()
    assert len(calls(log)) == 2  # and not twice


def test_a_rank_mismatch_is_an_error(fake_lib, monkeypatch, tmp_path):
    fake_env(monkeypatch, tmp_path, rank=2)
    found = pmix.Offer("fake@1", 1, "prrte", "prted", [fake_lib], [], "PMIx server prted")
    with pytest.raises(pmix.PMIxError, match="PMIx_Init gave rank 2 .* PMIX_RANK=1"):
        pmix.query(timeout=120, found=found)


@pytest.mark.parametrize("kind", ["orte", "prrte"])
def test_a_server_that_never_answers_ends_within_the_timeout(fake_lib, monkeypatch, tmp_path, kind):
    fake_env(monkeypatch, tmp_path, FAKE_SLEEP="30")
    found = pmix.Offer("fake@1", 1, kind, "x", [fake_lib], [], "PMIx server x")
    t0 = time.monotonic()
    with pytest.raises(pmix.PMIxError, match="did not answer within 3 s .*DISTENV_TIMEOUT"):
        pmix.query(timeout=3, found=found)
    assert time.monotonic() - t0 < 15


def test_child_mode_without_an_interpreter_leaves_fields_unknown(monkeypatch):
    monkeypatch.setattr(sys, "executable", "")
    monkeypatch.setattr(pmix, "single_threaded", lambda: False)
    monkeypatch.setattr(pmix, "mapped", lambda text: [])  # whatever another test loaded here
    found = pmix.Offer("ns", 0, "prrte", "prted", ["/x/libpmix.so.2"], [], "PMIx server prted")
    with pytest.raises(pmix.PMIxUnavailable, match="sys.executable is empty"):
        pmix.query({}, timeout=5, found=found)


def test_the_query_child_runs_nothing_from_the_working_directory(monkeypatch, tmp_path):
    """The interpreter is started isolated (-I): a json.py in the rank's working directory
    ran inside it with -S -E -s ('' stayed on sys.path)."""
    (tmp_path / "json.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pmix, "single_threaded", lambda: False)
    found = pmix.Offer("ns", 0, "prrte", "prted", ["/nonexistent/libpmix.so.2"], [], "x")
    with pytest.raises(pmix.PMIxUnavailable):
        pmix._in_child(found, timeout=60)
    assert not (tmp_path / "ran").exists()


def test_the_relay_stops_and_the_query_process_ends_however_the_query_ends(monkeypatch):
    """A query interrupted by anything (KeyboardInterrupt here), not only a timeout, drops
    what the relay holds and kills and reaps the query process."""
    from distenv.discovery import pmix_relay

    stopped, started = [], []

    class Relay:
        env: dict = {}

        def stop(self, drop=False, task=None, deadline=None):
            stopped.append(drop)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def sleeper(found, full, env, out):
        pid = os.posix_spawn("/bin/sleep", ["sleep", "60"], dict(os.environ))
        started.append(pid)
        return pid

    monkeypatch.setattr(pmix_relay, "open_relay", lambda environ: Relay())
    monkeypatch.setattr(pmix_relay, "collect", interrupted)
    monkeypatch.setattr(pmix, "single_threaded", lambda: False)
    monkeypatch.setattr(pmix, "_interpreter", sleeper)
    found = pmix.Offer("ns", 0, "prrte", "prted", ["/x/libpmix.so.2"], [], "x")
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pmix._in_child(found, timeout=30)
    assert stopped == [True] and time.monotonic() - t0 < 10
    with pytest.raises(ChildProcessError):  # killed and reaped: nothing left running
        os.waitpid(started[0], os.WNOHANG)


@pytest.mark.parametrize("mode", ["child", "in-process"])
def test_only_rank_0s_host_when_only_the_master_is_needed(fake_lib, monkeypatch, tmp_path, mode):
    """1 + N reads on every rank (N^2 in all: 10^8 at 10 000 ranks) for a master address that
    is one host: a caller that needs only the master gets 2 reads, whatever the job's size;
    one that needs the node facts after it gets every host then (counted in the fake)."""
    hosts = ",".join(f"node{i // 4}" for i in range(64))
    log = fake_env(monkeypatch, tmp_path, rank=5, FAKE_HOSTS=hosts)
    monkeypatch.setattr(pmix, "_done", None)
    monkeypatch.setattr(pmix, "_kept", None)
    kind = "orte" if mode == "in-process" else "prrte"
    found = pmix.Offer("fake@1", 5, kind, "orted", [fake_lib], [], "PMIx server")
    got = pmix.query(timeout=120, found=found, full=False)
    gets = [c for c in calls(log, gets=True) if c[0] == "get"]
    assert (got.size, got.hosts, got.full) == (64, ["node0"], False) and len(gets) == 2
    again = pmix.query(timeout=120, found=found, full=False)
    assert again is got and len([c for c in calls(log, gets=True) if c[0] == "get"]) == 2  # kept
    assert pmix.handoff() is None  # a partial answer is not handed to an exec'ed command
    full = pmix.query(timeout=120, found=found, full=True)
    assert full.full and full.hosts == hosts.split(",")
    # 16 nodes (the fake has no pmix.lpeers here): size, rank 0's host, lpeers, every other host
    assert [c[0] for c in calls(log, gets=True)].count("get") == 2 + 1 + 1 + 1 + 63


def test_every_rank_on_this_node_is_three_reads(fake_lib, monkeypatch, tmp_path):
    """pmix.lpeers lists every rank (in its own order) and rank 0 runs where this rank does:
    every host is this one, in size + rank 0 + pmix.lpeers + this rank's host reads."""
    log = fake_env(monkeypatch, tmp_path, rank=5, FAKE_HOSTS=",".join(["node1"] * 64),
                   FAKE_LPEERS=",".join(str(r) for r in [*range(32, 64), *range(32)]))
    monkeypatch.setattr(pmix, "_done", None)
    monkeypatch.setattr(pmix, "_kept", None)
    found = pmix.Offer("fake@1", 5, "prrte", "prted", [fake_lib], [], "PMIx server prted")
    got = pmix.query(timeout=120, found=found, full=True)
    assert got.hosts == ["node1"] * 64
    assert [c[0] for c in calls(log, gets=True)].count("get") == 4


@pytest.mark.parametrize("rank, lpeers", [
    (2, "0,1,2"),  # every rank listed, but this rank's host is not rank 0's: read per rank
    (0, "0,1"),  # rank 2 missing
    (0, "0,1,2,3"),  # a rank past the job's size
    (0, "0,1,1"),  # rank 1 twice, rank 2 missing
    (0, "0,x,2"),  # not ranks
    (0, "error"),  # the read fails (status -25): optional, never the end of the query
])
def test_local_peers_that_do_not_prove_one_node_are_not_taken(fake_lib, monkeypatch, tmp_path,
                                                               rank, lpeers):
    log = fake_env(monkeypatch, tmp_path, rank=rank, FAKE_LPEERS=lpeers)
    monkeypatch.setattr(pmix, "_done", None)
    monkeypatch.setattr(pmix, "_kept", None)
    found = pmix.Offer("fake@1", rank, "prrte", "prted", [fake_lib], [], "PMIx server prted")
    got = pmix.query(timeout=120, found=found, full=True)
    assert got.hosts == ["node2", "node2", "node1"]  # FAKE_HOSTS: what pmix.hname says
    assert [c[0] for c in calls(log, gets=True)].count("get") >= 1 + 3  # read per rank


def test_complete_asks_for_every_host_only_when_node_facts_are_needed(monkeypatch):
    asked = []

    def query(environ=None, timeout=None, found=None, full=True):
        asked.append(full)
        hosts = ["node2", "node2", "node1", "node1"] if full else ["node2"]
        return pmix.Placement(3, 4, hosts, "1234", "/lib/libpmix.so.2", "4.2", "child", 0.0,
                              full=full)

    found = pmix.Offer("1234", 3, "orte", "orted", ["/lib/libpmix.so.2"], [], "PMIx server orted")
    monkeypatch.setattr(pmix, "offer", lambda environ=None: (found, ""))
    monkeypatch.setattr(pmix, "query", query)
    env = resolve(ompi4(3))
    torch_like = complete(env, need=("master_addr", "world_size"))
    assert torch_like.master_addr == "node2" and torch_like.node_rank is None and asked == [False]
    assert "the host of rank 0" in torch_like.provenance["master_addr"]
    lightning_like = complete(env, need=("master_addr", "node_rank", "num_nodes"))
    assert (lightning_like.node_rank, lightning_like.num_nodes) == (1, 2) and asked == [False, True]


def test_a_librarys_release_is_read_from_its_banner_wherever_it_lies(tmp_path):
    """`release_of` reads the file from the end in blocks: the banner found at the start, at
    the end, straddling a block boundary (each offset around it), not found when absent or of
    another release; the installed libraries' own banners (Debian's 4.2, Open MPI 5's)."""
    banner = b"OpenPMIx 5.0.3 (PMIx Standard: 5.0)"
    size = 3 * pmix._BLOCK + 1000
    boundary = size - pmix._BLOCK  # where the reader's first block starts
    for at in (0, size - len(banner), *range(boundary - len(banner), boundary + 2), pmix._BLOCK):
        data = bytearray(size)
        data[at:at + len(banner)] = banner
        path = tmp_path / "libpmix.so.2"
        path.write_bytes(bytes(data))
        assert pmix.release_of(str(path), "5.0.3"), at
        assert not pmix.release_of(str(path), "5.0.30") and not pmix.release_of(str(path), "4.2.2"), at
    path.write_bytes(bytes(size))
    assert not pmix.release_of(str(path), "5.0.3")
    assert not pmix.release_of(str(tmp_path / "none.so"), "5.0.3")
    installed = [p for p in ("/usr/lib/x86_64-linux-gnu/libpmix.so.2",
                             os.path.join(os.environ.get("DISTENV_LAUNCHERS_DIR", "/opt/distenv-launchers"),
                                          "openmpi5", "lib", "openmpi", "libpmix.so.2")) if os.path.isfile(p)]
    for lib in installed:
        with open(lib, "rb") as f:
            whole = f.read()
        at = whole.find(b"OpenPMIx ")
        version = whole[at + 9:whole.index(b" (", at)].decode()
        assert pmix.release_of(lib, version) and not pmix.release_of(lib, version + "9"), lib


REAP_IGNORING_SIGCHLD = r"""
import os, signal, time
from distenv.discovery import pmix
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps children itself
pid = os.fork()
if pid == 0:
    os._exit(3)
time.sleep(0.2)
print(pmix._reap(pid, time.monotonic() + 1.0, kill=False), flush=True)
"""


def test_the_query_process_reaped_by_the_kernel_is_no_error():
    """Found in review: a rank that ignores SIGCHLD (some servers do) has its children reaped
    by the kernel; waitpid's ChildProcessError lost the query's answer and skipped the relay's
    stop. Its status is then unknown: 0."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", REAP_IGNORING_SIGCHLD], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "0", (out.stdout, out.stderr)
