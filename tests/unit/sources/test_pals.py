"""Cray PALS (src/distenv/sources/pals.py): HPE's PBS mpiexec from its documented variables,
and SLURM's --mpi=cray_shasta tasks recorded on the two namespace nodes
(tests/fixtures/launchers/cluster-srun-cray-*.json), where PALS_NODEID is not the node rank."""
import glob
import json
import os

from types import MappingProxyType

import pytest

from distenv import DistEnvError, resolve
from distenv.sources.pals import carried_by

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "launchers")
CRAY = sorted(glob.glob(os.path.join(FIXTURES, "cluster-srun-cray-*.json")))

#: HPE's PBS mpiexec, rank 5 of 8, 4 per node (the variables HPE documents; no PALS here).
PBS = {"PALS_RANKID": "5", "PMI_RANK": "5", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "1",
       "PALS_LOCAL_SIZE": "4", "PALS_NODEID": "1", "PALS_DEPTH": "2", "PMI_LOCAL_RANK": "1",
       "PMI_LOCAL_SIZE": "4", "PALS_APID": "a1b2", "PBS_JOBID": "42.pbs"}


def test_pbs_mpiexec_ranks_and_counts_but_not_palss_node_index():
    env = resolve(PBS)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == (
        "pals", 5, 8, 1, 4)
    # PALS_NODEID is PALS's index of the node in its node list, not distenv's node order
    assert env.node_rank is None and env.master_addr is None
    assert any("PALS_NODEID=1" in n and "distenv.discover()" in n for n in env.notes)
    assert env.job_id == "42.pbs"


def test_pbs_mpiexec_with_only_the_pmi_local_variables():
    env = resolve({k: v for k, v in PBS.items() if not k.startswith("PALS_LOCAL")})
    assert (env.local_rank, env.local_world_size) == (1, 4)
    assert env.provenance["local_rank"] == "PMI_LOCAL_RANK=1"


def test_pmi_rank_contradicting_pals_rankid_is_an_error():
    with pytest.raises(DistEnvError, match="PALS_RANKID=5 but PMI_RANK=4"):
        resolve({**PBS, "PMI_RANK": "4"})


def test_the_port_is_the_applications_on_every_rank():
    ports = {resolve({**PBS, "PALS_RANKID": str(r), "PMI_RANK": str(r)}).master_port for r in range(8)}
    assert len(ports) == 1


@pytest.mark.parametrize("path", CRAY, ids=[os.path.basename(p)[:-5] for p in CRAY])
def test_slurm_cray_shasta_tasks_are_slurm_tasks_and_never_wrong(path):
    """Under srun --mpi=cray_shasta the step's SLURM variables describe the task; no field
    is taken from PALS_NODEID, and every field given is the truth of the recorded run."""
    with open(path) as f:
        rec = json.load(f)
    ranks = rec["ranks"]
    hosts = [r["hostname"] for r in ranks]  # ranks are sorted by the launcher's rank
    by_lowest = list(dict.fromkeys(hosts))
    assert len(by_lowest) == 2
    for r, host in zip(ranks, hosts):
        assert carried_by(r["env"]) == "slurm"
        env = resolve(MappingProxyType(r["env"]))  # read as os.environ is (not a dict)
        assert env.launcher == "slurm" and env.provenance["launcher"] == "SLURM_STEP_ID present"
        rank = int(r["env"]["SLURM_PROCID"])
        assert (env.rank, env.world_size, env.num_nodes) == (rank, len(ranks), 2)
        assert env.local_world_size == hosts.count(host)
        assert env.node_rank in (None, by_lowest.index(host))
        assert env.master_addr in (None, hosts[0])
        assert not any("PALS_NODEID" in str(why) for why in env.provenance.values())
        if "arbitrary" in path or "het" in path:
            assert env.node_rank is None and env.master_addr is None
        else:
            assert env.node_rank == by_lowest.index(host) and env.master_addr == hosts[0]


def test_the_recorded_arbitrary_layout_is_the_one_palss_node_index_gets_wrong():
    """Rank 0 runs on node2 with PALS_NODEID=1: taking PALS_NODEID as the node rank (what
    distenv did before) was wrong on every rank of this run."""
    with open(os.path.join(FIXTURES, "cluster-srun-cray-n4-arbitrary.json")) as f:
        ranks = json.load(f)["ranks"]
    hosts = [r["hostname"] for r in ranks]
    by_lowest = list(dict.fromkeys(hosts))
    wrong = [r for r, h in zip(ranks, hosts) if int(r["env"]["PALS_NODEID"]) != by_lowest.index(h)]
    assert hosts[0] == "node2" and len(wrong) == len(ranks)


def test_pals_variables_of_another_step_are_an_error():
    with open(CRAY[0]) as f:
        env = dict(json.load(f)["ranks"][1]["env"])
    env["PALS_RANKID"] = "0"
    with pytest.raises(DistEnvError, match="PALS_RANKID=0 but SLURM_PROCID=1"):
        resolve(env)


def test_pals_of_another_slurm_step_is_pals_own():
    """PALS_APID names another step (PBS's mpiexec started inside a SLURM task, say): the
    SLURM variables do not describe these PALS ranks, so the PALS source reads them."""
    env = {**PBS, "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_JOB_ID": "77"}
    assert carried_by(env) is None
    assert resolve(env).launcher == "pals"


def test_flux_cray_pals_tasks_are_flux_tasks():
    env = {"FLUX_TASK_RANK": "3", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "1",
           "FLUX_JOB_ID": "f2", "PALS_RANKID": "3", "PALS_NODEID": "1", "PALS_APID": "123"}
    assert carried_by(env) == "flux"
    got = resolve(env)
    assert (got.launcher, got.rank, got.node_rank) == ("flux", 3, None)


def test_pals_variables_of_another_step_of_the_job_are_left_to_slurm():
    """A pmix step started from the one task of a cray_shasta step: every task carries step 0's
    PALS_APID=<job>.0 and PALS_RANKID=0 (measured: tests/integration/test_hpc_interfaces.py::
    test_a_pmix_step_inside_a_cray_step_ignores_the_outer_steps_pals_variables). They are the
    outer step's: SLURM's variables give the rank, and its apinfo file is not asked."""
    from distenv.sources.pals import other_step
    from distenv.sources.slurm import SOURCE as SLURM

    with open(CRAY[0]) as f:
        env = dict(json.load(f)["ranks"][-1]["env"])
    job = env["SLURM_JOB_ID"]
    env.update({"SLURM_STEP_ID": "1", "SLURM_MPI_TYPE": "pmix", "PALS_RANKID": "0",
                "PALS_APID": f"{job}.0"})
    assert other_step(env) == "0" and carried_by(env) == "slurm"
    got = resolve(env)
    assert (got.launcher, got.rank) == ("slurm", int(env["SLURM_PROCID"])) and got.rank != 0
    refused = SLURM.services.refuses("apinfo", env)
    assert f"PALS_APID={job}.0 names step 0" in refused and "Fix:" in refused
    env["SLURM_STEP_ID"] = "0"  # its own step: not another's, and the rank mix is an error
    assert other_step(env) is None and SLURM.services.refuses("apinfo", env) == ""
