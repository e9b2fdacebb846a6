"""Issue 28 under the real launchers on the two namespace nodes: SLURM's HPE Cray PALS and PMI-2
plugins, and ranks started through a job script that does not ``exec`` -- nothing exported by
hand (the harness's clean environment has no MASTER_ADDR; the probe checks), mpi4py hidden.

- ``srun --mpi=cray_shasta``: block, cyclic, arbitrary (rank 0 on node2) and heterogeneous
  (component 0 on node2). Without discovery no field is wrong (unknown where SLURM's variables
  prove nothing); after it every field is the truth, from the apinfo file.
- ``srun --mpi=pmi2``: arbitrary, discovery through the stepd's PMI-1, then MPICH's own
  ``MPI_Init``, an all-reduce and an all-gather in the same process, exit 0, 20 times in a
  row. A heterogeneous step is refused at once with the plugins that work: SLURM's pmi2 does
  not join its components (MPICH's own MPI_Init never returns there either: measured).
- Wrapper scripts (``echo ...`` then ``python ...`` without exec): Open MPI 5 with rank 0 on
  node2, Open MPI 4 MPMD with rank 0 remote, MPICH 4, ``srun --mpi=pmix`` and
  ``--mpi=cray_shasta`` arbitrary: every field right. A second program of the same script gets
  the first one's answer (the task's claim) instead of asking the service again. Under
  ``--mpi=pmi2`` the script's connection cannot be made safe: refused with the exec fix, and
  ``distenv show --discover`` exits 1 saying so.
- An unmodified Transformers script (``examples/hf_trainer.py --no-distenv``, DISTENV_AUTO=1)
  trains as one 4-process job with identical weights under ``srun --mpi=cray_shasta``
  arbitrary and through a wrapper script under MPICH 4.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import harness
from harness import FAKESSH, MPICH4, NET, OMPI4, OMPI5, ON_NODE, Layout

pytestmark = [pytest.mark.launcher, pytest.mark.cluster, pytest.mark.timeout(1800)]

PROBE = str(harness.HERE / "discover_probe.py")
LIBMPICH = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"  # Debian's MPICH 4
ARBITRARY_HOSTS = ["node2", "node1", "node1", "node2"]
HET_HOSTS = ["node2", "node1", "node1"]
NODE2_FIRST = ["node2", "node2", "node1", "node1"]
TIMEOUT = 600


def wrapper(lines: "list[str]") -> str:
    """A job script in the shared run directory: `lines`, no exec (as most job scripts are
    after `module load` / `conda activate`)."""
    base = harness.run_dir() / "itest"
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"job-{os.getpid()}-{abs(hash(tuple(lines)))}.sh"
    path.write_text("#!/bin/bash\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)
    return str(path)


def job(*cmd: str, twice: bool = False) -> str:
    run = " ".join(f'"{c}"' for c in cmd)
    return wrapper(['echo "job script on $(hostname)" >&2', run, *([run] if twice else [])])


def records_of(lay: Layout, cmd, *, env=None, timeout=TIMEOUT, each=1, retry_if=None):
    """`each` records per rank, sorted by the launcher's rank (then by the order printed).
    `retry_if`: a launcher message after which the launch is tried once more (see its use)."""
    result = harness.launch(lay, cmd, env=env, timeout=timeout, check=retry_if is None)
    if retry_if is not None and (result["rc"] != 0 or len(result["files"]) != lay.nranks):
        if retry_if not in result["output"]:
            raise harness.LaunchError(harness.describe_failure(lay, result, kept=False))
        result = harness.launch(lay, cmd, env=env, timeout=timeout)
    records = []
    for name, (out, err) in sorted(result["files"].items()):
        found = harness.parse_records(out)
        assert len(found) == each, f"{lay.name}: rank file {name}: {out[-1500:]}\n{err[-3000:]}"
        for i, r in enumerate(found):
            r["_order"] = i
        records.extend(found)
    records.sort(key=lambda r: (r["truth"]["rank"], r["_order"]))
    assert [r["truth"]["rank"] for r in records] == [r for r in range(lay.nranks) for _ in range(each)]
    return records


def check_discovered(records, hosts, why):
    """Every rank: nothing was exported by hand; before discovery no field is wrong; after it,
    every field is the truth of where the ranks ran, with `why` as its provenance."""
    for r in records:
        t, detail = r["truth"], json.dumps(r)[:4000]
        assert r["had_master_env"] is False, detail
        assert t["hostname"] == hosts[t["rank"]], detail  # the layout is the one meant
        assert "error" not in r, detail
        want = harness.placement_facts(hosts, t["rank"])
        before, after = r["before"], r["env"]
        for field, value in want.items():
            if field == "hosts" and before["node_rank"] is None and before["hosts"] is not None:
                # the launcher's node list, in its own order (no node rank to index it)
                assert set(before["hosts"]) == set(value), ("wrong before discovery", field, detail)
            else:
                assert before[field] in (None, value), ("wrong before discovery", field, detail)
            assert after[field] == value, (field, detail)
        assert (after["rank"], after["world_size"]) == (t["rank"], len(hosts)), detail
        if before["master_addr"] is None:  # filled by the service (else the variables' proof stands)
            assert r["why"]["master_addr"].startswith(why), detail
        # no note says a field is unknown once discovery filled it
        assert not any("master_addr" in n or "node_rank" in n for n in r["notes"]), detail
    assert len({r["env"]["master_port"] for r in records}) == 1, records


# -- srun --mpi=cray_shasta: the apinfo file ---------------------------------------------------------
CRAY = {"block": ("slurm-N2-n4-cray", ["node1", "node1", "node1", "node2"]),
        "cyclic": ("slurm-N2-n4-cray-cyclic", ["node1", "node2", "node1", "node1"]),
        "arbitrary": ("slurm-N2-n4-cray-arbitrary", ARBITRARY_HOSTS),
        "het": ("slurm-N2-cray-het", HET_HOSTS)}


@pytest.mark.parametrize("shape", list(CRAY))
def test_cray_shasta_every_field_from_the_apinfo_file(need, shape):
    name, hosts = CRAY[shape]
    lay = need(harness.LAYOUTS[name])
    records = records_of(lay, [harness.PY, PROBE, "discover"])
    check_discovered(records, hosts, "Cray PALS apinfo (PALS_APINFO, version 1)")
    if shape in ("arbitrary", "het"):  # the layouts SLURM's variables cannot place
        assert {r["before"]["master_addr"] for r in records} == {None}


def _nested_pmix_in_cray(cmd, extra):
    """A one-task cray_shasta step whose task starts a pmix step: srun passes its PALS_*
    variables (step 0's, rank 0's, its apinfo file) to every task of the inner step."""
    return ["salloc", "-N2", "-n4", "srun", "--mpi=cray_shasta", "-N1", "-n1", "-w", "node1",
            "srun", "--mpi=pmix", "--overlap", *harness.ARBITRARY, *extra, *cmd]


def test_a_pmix_step_inside_a_cray_step_ignores_the_outer_steps_pals_variables(need):
    """Every task of the inner step carries PALS_RANKID=0 and PALS_APID=<job>.0 (measured
    here): before, distenv read them as PALS's and gave every task rank 0. PALS_APID naming
    another step of the job makes them the outer step's: SLURM's variables give the ranks, and
    discovery asks the inner step's PMIx server, not the outer step's apinfo file."""
    lay = need(Layout("slurm", "nested-pmix-in-cray", "slurm2", 4, "slurm", "slurm",
                      _nested_pmix_in_cray, NODES))
    records = records_of(lay, [harness.PY, PROBE, "discover"])
    for r in records:  # the premise: the outer step's PALS variables reached every task
        assert r["pals"].get("PALS_RANKID") == "0" and r["pals"]["PALS_APID"].endswith(".0"), r
    check_discovered(records, ARBITRARY_HOSTS, "PMIx placement")


# -- srun --mpi=pmi2: the stepd's PMI-1, then MPICH's MPI_Init ------------------------------------------
def test_pmi2_arbitrary_discovery_then_mpi_init_20_times_in_a_row(need):
    lay = need(harness.LAYOUTS["slurm-N2-n4-pmi2-arbitrary"])
    seconds = []
    for run in range(20):
        records = records_of(lay, [harness.PY, PROBE, "discover", LIBMPICH])
        check_discovered(records, ARBITRARY_HOSTS, "PMI-1 key-value exchange (SLURM, PMI_FD)")
        for r in records:
            assert r["mpi"] == {"init_rc": 0, "rank": r["truth"]["rank"], "size": 4, "sum": 10,
                                "hosts": ARBITRARY_HOSTS, "finalize_rc": 0}, (run, r)
        seconds.append(max(r["seconds"] for r in records))
    print(f"pmi2 arbitrary: 20 runs, discovery {min(seconds):.2f}-{max(seconds):.2f} s")


def test_pmi2_heterogeneous_is_refused_at_once_with_the_plugins_that_work(need):
    """SLURM's pmi2 plugin does not join a heterogeneous step's components: MPICH's own
    MPI_Init never returns there (measured), and a PMI-1 barrier never completes. Discovery
    says so at once, naming the plugins that place such a step (pmix, cray_shasta), instead
    of waiting out its timeout."""
    lay = need(harness.LAYOUTS["slurm-N2-pmi2-het"])
    # Once in a full run (0 of 37 runs alone, quiet or beside 4 busy loops) SLURM 22.05 started
    # only component 0: srun's pmi2 agent then looped on "mpi/pmi2: unable to accept new
    # connection: Invalid argument" and the node1 tasks never ran (no rank file, so no distenv
    # code ran there). That launcher failure, and only it, gets one more launch.
    records = records_of(lay, [harness.PY, PROBE, "discover"],
                         retry_if="mpi/pmi2: unable to accept new connection")
    for r in records:
        assert "does not join the components" in r["error"], r
        assert "--mpi=pmix or --mpi=cray_shasta" in r["error"] and r["error"].count("Fix:") == 1, r
        assert r["seconds"] < 10, r  # no barrier was waited for


# -- wrapper scripts ----------------------------------------------------------------------------------
OMPI4_FLAGS = (OMPI4, "--allow-run-as-root", "--mca", "plm_rsh_agent", FAKESSH,
               "--mca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET)
OMPI5_FLAGS = (OMPI5, "--allow-run-as-root", "--prtemca", "plm_ssh_agent", FAKESSH,
               "--prtemca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET)


def _ompi4_mpmd(cmd, extra):
    return [ON_NODE, "node1", *OMPI4_FLAGS, "-np", "2", "-H", "node2:2", *extra, *cmd, ":",
            "-np", "2", "-H", "node1:2", *extra, *cmd]


def _srun(mpi):
    return lambda cmd, extra: ["srun", f"--mpi={mpi}", *harness.ARBITRARY, *extra, *cmd]


NODES = ("node1", "node2")
WRAPPED = {
    "openmpi5": (Layout("openmpi5", "wrapped-21", "cluster", 4, "openmpi", "openmpi",
                        lambda cmd, extra: [ON_NODE, "node1", *OMPI5_FLAGS, "-np", "4", "-H",
                                            "node2:2,node1:2", *extra, *cmd], NODES),
                 NODE2_FIRST, "PMIx placement"),
    "openmpi4-mpmd": (Layout("openmpi4", "wrapped-mpmd", "cluster", 4, "openmpi", "openmpi",
                             _ompi4_mpmd, NODES), NODE2_FIRST, "PMIx placement"),
    "mpich4": (Layout("mpich4", "wrapped-21", "cluster", 4, "hydra", "mpich",
                      lambda cmd, extra: [ON_NODE, "node1", MPICH4, "-np", "4", "-hosts",
                                          "node2:2,node1:2", "-launcher", "ssh", "-launcher-exec",
                                          FAKESSH, *extra, *cmd], NODES),
               NODE2_FIRST, "PMI-1 key-value exchange (Hydra, PMI_FD)"),
    "srun-pmix": (Layout("slurm", "wrapped-pmix", "slurm2", 4, "slurm", "slurm", _srun("pmix"),
                         NODES), ARBITRARY_HOSTS, "PMIx placement"),
    "srun-cray": (Layout("slurm", "wrapped-cray", "slurm2", 4, "slurm", "slurm",
                         _srun("cray_shasta"), NODES), ARBITRARY_HOSTS, "Cray PALS apinfo"),
}


@pytest.mark.parametrize("name", list(WRAPPED))
def test_a_job_script_without_exec_still_discovers(need, name):
    lay, hosts, why = WRAPPED[name]
    lay = need(lay)
    records = records_of(lay, [job(harness.PY, PROBE, "discover")])
    check_discovered(records, hosts, why)


@pytest.mark.parametrize("name", ["mpich4", "openmpi5"])
def test_a_second_program_of_the_script_gets_the_first_ones_answer(need, name):
    """The script runs the probe twice: the second program does not ask the service again
    (a second PMI-1 exchange on the script's one connection, or a second PMIx client of the
    rank) but gets the first one's answer from the task's holder."""
    lay, hosts, why = WRAPPED[name]
    lay = need(lay)
    records = records_of(lay, [job(harness.PY, PROBE, "discover", twice=True)], each=2)
    check_discovered(records, hosts, why)
    for first, second in zip(records[::2], records[1::2]):
        assert first["pid"] != second["pid"]
        assert "kept for this task" not in first["why"]["master_addr"], first
        assert second["why"]["master_addr"].endswith(
            f"kept for this task by process {first['pid']}"), second


def test_pmi2_through_a_job_script_is_refused_with_the_exec_fix(need):
    lay = need(Layout("slurm", "wrapped-pmi2", "slurm2", 4, "slurm", "slurm", _srun("pmi2"), NODES))
    records = records_of(lay, [job(harness.PY, PROBE, "discover")])
    for r in records:
        assert "SLURM's stepd" in r["error"] and "exec python" in r["error"], r
        assert r["error"].count("Fix:") == 1, r  # one line, one fix
    shown = records_of(lay, [job(harness.PY, PROBE, "show")])
    for r in shown:
        assert r["rc"] == 1, r
        out = json.loads(r["stdout"])
        assert out["master_addr"] is None and out["node_rank"] is None, r
        assert "discovery did not ask the launcher's pmi service" in r["stderr"], r
        # `distenv show` runs as the probe's child: the Python parent is named, with the fix
        # that works in Python (os.execv), not the shell's exec
        assert "a Python process" in r["stderr"] and "os.execv" in r["stderr"], r


# -- an unmodified Transformers script, DISTENV_AUTO=1 -------------------------------------------------
@pytest.mark.parametrize("where", ["srun-cray-arbitrary", "mpich4-wrapped"])
def test_transformers_unmodified_trains_across_both_nodes(need, where):
    """examples/hf_trainer.py --no-distenv: no distenv line in the script; DISTENV_AUTO=1 at
    interpreter start completes the launch (the apinfo file; Hydra's PMI-1 through the job
    script) before TrainingArguments exists. 4 processes in one DDP job, one set of weights."""
    from framework_runs import BASE_ENV, steps, venv_python

    py = venv_python("transformers5")
    samples, batch = 32, 4
    args = [str(harness.REPO / "examples" / "hf_trainer.py"), "--no-distenv", "--report",
            "--samples", str(samples), "--num_train_epochs", "1", "--logging_steps", "2"]
    if where == "srun-cray-arbitrary":
        lay, hosts = need(harness.LAYOUTS["slurm-N2-n4-cray-arbitrary"]), ARBITRARY_HOSTS
        cmd = [py, *args]
    else:
        lay, hosts, _ = WRAPPED["mpich4"]
        lay = need(lay)
        cmd = [job(py, *args)]
    result = harness.launch(lay, cmd, env={**BASE_ENV, "DISTENV_AUTO": "1"}, timeout=900,
                            check=False)
    records = sorted((r for out, _ in result["files"].values() for r in harness.parse_records(out)),
                     key=lambda r: r["process_index"])
    assert result["rc"] == 0 and len(records) == 4, harness.describe_failure(lay, result)
    assert [r["process_index"] for r in records] == [0, 1, 2, 3], records
    assert {r["world_size"] for r in records} == {4}, records
    assert {r["parallel_mode"] for r in records} == {"distributed"}, records
    assert {r["wrapped"] for r in records} == {"DistributedDataParallel"}, records
    assert len({r["checksum"] for r in records}) == 1, "ranks disagree on the weights"
    assert {r["steps_per_epoch"] for r in records} == {steps(samples, batch, 4)}, records
    assert len({r["master_port"] for r in records}) == 1, records
    if "hostname" in records[0]:
        assert [r["hostname"] for r in records] == hosts, records
