"""Container starters between the launcher and Python (issue 39), on the two namespace nodes,
nothing exported by hand (no MASTER_ADDR anywhere: the probes check), rank 0 on node2:

- the starters: ``bwrap --dev-bind / /`` (Apptainer's shape: the starter stays the rank's
  parent), ``bwrap --unshare-pid --proc /proc`` (a pid namespace of the container's own: the
  launcher's daemon is out of sight), ``ch-run IMAGE --`` (Charliecloud: a user namespace, the
  daemon's /proc entries unreadable);
- the launchers: Open MPI 5 (PMIx, PRRTE), Open MPI 4 (PMIx, ORTE: MPMD, rank 0 remote), MPICH 4
  (Hydra's PMI-1), ``srun --mpi=pmix`` and ``--mpi=pmi2`` (arbitrary layout);
- every cell: `distenv.discover()` fills every field with the truth; then MPI_Init in the same
  process works where the probe can start the launcher's MPI (MPICH under Hydra and SLURM's
  pmi2; Open MPI 5), with an all-reduce and an all-gather of host names;
- the other ways up, one cell each: `distenv.torch.init_process_group()` all-reduces (Open MPI 5
  in its own pid namespace), an unmodified torch script under DISTENV_AUTO=1 (``srun
  --mpi=pmix`` through ch-run), `distenv run` (MPICH through bwrap).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import harness
from harness import Layout
from test_hpc_interfaces import ARBITRARY_HOSTS, LIBMPICH, NODE2_FIRST, WRAPPED, check_discovered

pytestmark = [pytest.mark.launcher, pytest.mark.cluster, pytest.mark.timeout(900)]

DISCOVER = str(harness.HERE / "discover_probe.py")
PMIX_PROBE = str(harness.HERE / "pmix_probe.py")
PMI_PROBE = str(harness.HERE / "pmi_probe.py")
DISTENV = str(Path(sys.executable).parent / "distenv")
LIBMPI5 = str(harness.L / "openmpi5" / "lib" / "libmpi.so.40")

#: What ch-run's image binds from the host: where Python, the venvs, the repository and the
#: launchers live, and SLURM's spool (its PMIx directory). ch-run binds /tmp, /proc, /dev,
#: /sys and /etc's passwd, group, hosts and resolv.conf itself.
CH_BINDS = ("/usr", "/opt", "/var", "/run")


@pytest.fixture(scope="module")
def image():
    """A Charliecloud directory image: mount points for the host directories it binds."""
    if shutil.which("ch-run") is None or shutil.which("bwrap") is None:
        pytest.skip("bubblewrap or Charliecloud missing: bash integrations/setup.sh installs them")
    roots = set(CH_BINDS)
    for path in (sys.base_prefix, sys.prefix, str(harness.REPO), str(harness.L)):
        roots.add("/" + Path(path).resolve().parts[1])
    img = harness.run_dir() / "itest" / "ch-image"
    shutil.rmtree(img, ignore_errors=True)
    (img / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "hosts", "resolv.conf"):
        (img / "etc" / name).touch()
    for d in ("tmp", "proc", "dev", "sys", "home", *(r.lstrip("/") for r in roots)):
        (img / d).mkdir(parents=True, exist_ok=True)
    for link in ("lib", "lib64", "bin", "sbin"):  # merged /usr (Debian 12)
        if os.path.islink(f"/{link}"):
            (img / link).symlink_to(os.readlink(f"/{link}").lstrip("/"))
    os.chmod(img, 0o755)
    return img, sorted(roots)


def starter(name: str, image) -> "list[str]":
    if name == "bwrap":
        return ["bwrap", "--dev-bind", "/", "/"]
    if name == "bwrap-pid":
        return ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc"]
    img, roots = image
    binds = [arg for root in roots for arg in ("-b", f"{root}:{root}")]
    return ["env", f"USER={os.environ.get('USER') or 'root'}", "ch-run", *binds, str(img), "--"]


STARTERS = ("bwrap", "bwrap-pid", "ch-run")
PMI2 = Layout("slurm", "pmi2-arbitrary", "slurm2", 4, "slurm", "slurm",
              lambda cmd, extra: ["srun", "--mpi=pmi2", *harness.ARBITRARY, *extra, *cmd],
              ("node1", "node2"))
#: launcher -> (layout, where each rank runs, discovery's provenance, the MPI the probe starts)
LAUNCHERS = {
    "openmpi5": (WRAPPED["openmpi5"][0], NODE2_FIRST, "PMIx placement", LIBMPI5),
    "openmpi4": (WRAPPED["openmpi4-mpmd"][0], NODE2_FIRST, "PMIx placement", None),
    "mpich4": (WRAPPED["mpich4"][0], NODE2_FIRST, "PMI-1 key-value exchange (Hydra, PMI_FD)",
               LIBMPICH),
    "srun-pmix": (WRAPPED["srun-pmix"][0], ARBITRARY_HOSTS, "PMIx placement", None),
    "srun-pmi2": (PMI2, ARBITRARY_HOSTS, "PMI-1 key-value exchange (SLURM, PMI_FD)", LIBMPICH),
}


#: Open MPI's shared-memory transport crashes MPI_Init's first collective when every rank has a
#: pid namespace of its own (measured without distenv: a segfault in mca_btl_sm_sendi; the
#: ranks are all "process 2"): such jobs run Open MPI over TCP (docs/discovery.md#containers).
OWN_PID_NS_OMPI = ("--mca", "btl", "tcp,self")
#: MPICH's UCX maps its peers' shared memory through /proc/<pid>/fd: refused across the user
#: namespaces ch-run gives every rank and across bwrap's pid namespaces (measured without
#: distenv: "open(file_name=/proc/<pid>/fd/23) failed: Permission denied"). UCX's setting for
#: containers names the memory instead (measured: MPI_Init then works in both).
UCX_IN_CONTAINERS = {"UCX_POSIX_USE_PROC_LINK": "n"}


def records_of(lay, cmd, *, env=None, extra=()):
    """One record per rank, sorted by the launcher's rank; the launch must exit 0."""
    result = harness.launch(lay, cmd, env=env, extra=extra, timeout=600)
    records = []
    for name, (out, err) in sorted(result["files"].items()):
        found = harness.parse_records(out)
        assert len(found) == 1, f"{lay.name}: rank file {name}: {out[-1500:]}\n{err[-3000:]}"
        records.extend(found)
    records.sort(key=lambda r: r["truth"]["rank"])
    assert [r["truth"]["rank"] for r in records] == list(range(lay.nranks))
    return records


def _mpi_ok(r, hosts):
    got = r["mpi"]
    assert got is not None, r
    assert (got["init_rc"], got["size"], got["sum"], got["hosts"], got["finalize_rc"]) == \
        (0, 4, 10, hosts, 0), r
    assert got["rank"] == r["truth"]["rank"], r


@pytest.mark.parametrize("how", STARTERS)
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_discover_behind_a_starter(need, image, launcher, how):
    lay, hosts, why, libmpi = LAUNCHERS[launcher]
    lay = need(lay)
    if libmpi == LIBMPI5:  # Open MPI's ABI: the PMIx probe starts it
        records = records_of(lay, [*starter(how, image), harness.PY, PMIX_PROBE, "discover",
                                   libmpi], extra=OWN_PID_NS_OMPI if how == "bwrap-pid" else ())
        for r in records:
            t, e, detail = r["truth"], r["env"], json.dumps(r)[:3000]
            assert r["had_master_env"] is False and t["hostname"] == hosts[t["rank"]], detail
            assert r["before"]["master_addr"] is None, detail
            for field, value in harness.placement_facts(hosts, t["rank"]).items():
                assert e[field] == value, (field, detail)
            assert r["why"]["master_addr"].startswith(why), detail
            _mpi_ok(r, hosts)
        return
    cmd = [*starter(how, image), harness.PY, DISCOVER, "discover", *([libmpi] if libmpi else [])]
    records = records_of(lay, cmd, env=UCX_IN_CONTAINERS if libmpi else None)
    check_discovered(records, hosts, why)
    if libmpi:
        for r in records:
            _mpi_ok(r, hosts)


def test_torch_adapter_in_its_own_pid_namespace(need, torch_python):
    lay, hosts, _, libmpi = LAUNCHERS["openmpi5"]
    lay = need(lay)
    records = records_of(lay, [*starter("bwrap-pid", None), torch_python, PMIX_PROBE, "torch",
                               libmpi], extra=OWN_PID_NS_OMPI)
    for r in records:
        assert r["env"]["master_addr"] == "node2" and r["sum"] == 10.0, r
        _mpi_ok(r, hosts)


def test_distenv_auto_through_ch_run(need, image, torch_python):
    lay, hosts, _, _ = LAUNCHERS["srun-pmix"]
    lay = need(lay)
    records = records_of(lay, [*starter("ch-run", image), torch_python, PMIX_PROBE, "plain-torch"],
                         env={"DISTENV_AUTO": "1"})
    for r in records:
        assert (r["MASTER_ADDR"], r["WORLD_SIZE"], r["RANK"]) == ("node2", "4", str(r["truth"]["rank"])), r
        assert r["sum"] == 10.0 and r["gloo_hosts"] == hosts, r
    assert len({r["MASTER_PORT"] for r in records}) == 1, records


def test_distenv_run_through_bwrap(need):
    """`distenv run` as the rank behind the starter: it exchanges once and execs the command
    with the completed variables; the command completes from them without a second exchange."""
    lay, hosts, _, _ = LAUNCHERS["mpich4"]
    lay = need(lay)
    result = harness.launch(lay, [*starter("bwrap", None), DISTENV, "run", "--", harness.PY,
                                  PMI_PROBE, "after-run"], timeout=600)
    records = sorted((r for out, _ in result["files"].values() for r in harness.parse_records(out)),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1, 2, 3], result["files"]
    for r in records:
        rank = r["rank"]
        assert (r["MASTER_ADDR"], r["WORLD_SIZE"]) == ("node2", "4"), r
        assert r["hostname"] == hosts[rank] and r["NODE_RANK"] == ("0" if rank < 2 else "1"), r
        assert r["ran_exchange"] is False and (r["node_rank"], r["num_nodes"]) == (int(r["NODE_RANK"]), 2), r
    assert len({r["MASTER_PORT"] for r in records}) == 1, records


#: A container that hides the PMIx server's directory (PMIX_SERVER_TMPDIR: Open MPI's under /tmp,
#: SLURM's in its spool, here under /tmp too): pyxis without its PMI hook, Apptainer without
#: --bind, podman without -v.
HIDES_TMP = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/tmp"]


@pytest.mark.parametrize("launcher", ["openmpi5", "srun-pmix"])
def test_a_container_without_the_pmix_directory_still_discovers(need, launcher):
    """The query's own process reads the job's data over its connection (PMIX_MCA_gds=hash in
    that process alone): before, the server gave no host ("pmix.hname") and every field
    stayed unknown."""
    lay, hosts, why, _ = LAUNCHERS[launcher]
    lay = need(lay)
    records = records_of(lay, [*HIDES_TMP, harness.PY, DISCOVER, "discover"])
    check_discovered(records, hosts, why)


def test_open_mpi_4_without_the_pmix_directory_says_what_to_bind(need):
    """Open MPI 4's query runs in the rank itself (its MPI shares the client): distenv changes
    nothing there and says, in one line, what to bind or set."""
    lay, _, _, _ = LAUNCHERS["openmpi4"]
    lay = need(lay)
    records = records_of(lay, [*HIDES_TMP, harness.PY, DISCOVER, "discover"])
    for r in records:
        error = r["error"]
        assert "PMIX_SERVER_TMPDIR=" in error and "is not visible here" in error, r
        assert error.count("Fix:") == 1 and "PMIX_MCA_gds=hash" in error, r
        assert "exec" not in error, r  # never "use exec" to someone who did
