"""The resolver in general, whatever the launcher: variables that contradict the launcher's, bad
input, user and keyword overrides, DISTENV_LAUNCHER, per-node requests, explain(), purity,
pickling, and the documented platform cases as a set. Each launcher's and platform's own
cases: tests/unit/sources/test_<source>.py; recorded launches: test_recorded.py."""

import glob
import os

import pytest

from distenv import DistEnvError, resolve
from envs import PLATFORM_CASES, ompi, platform_case, platform_source, slurm_task

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = sorted(glob.glob(os.path.join(HERE, "..", "fixtures", "platforms", "*.json")))


def test_stale_rank_from_shell_is_an_error_naming_both():
    with pytest.raises(DistEnvError) as err:
        resolve(ompi(1, 2, 1, 2, RANK="0", WORLD_SIZE="2"))
    assert "RANK=0" in str(err.value) and "OMPI_COMM_WORLD_RANK=1" in str(err.value)


def test_agreeing_canonical_variables_pass():
    env = resolve(ompi(1, 2, 1, 2, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1"))
    assert env.rank == 1


def test_wrong_hand_computed_node_rank_is_caught():
    # Azure's old recipe computed NODE_RANK wrongly; a contradiction must not pass.
    with pytest.raises(DistEnvError, match="NODE_RANK=1"):
        resolve(slurm_task(1, 4, 1, 0, 2, "n[1-2]", "2(x2)", NODE_RANK="1"))


@pytest.mark.parametrize("value", ["abc", "-1", "", "1.5", "٣", "1_0", "99999999999999", " "])
def test_non_numeric_rank_names_the_variable(value):
    with pytest.raises(DistEnvError) as err:
        resolve(ompi(0, 2, 0, 2) | {"OMPI_COMM_WORLD_RANK": value})
    assert "OMPI_COMM_WORLD_RANK" in str(err.value)


def test_local_rank_beyond_local_size():
    with pytest.raises(DistEnvError, match="local_rank=2"):
        resolve(ompi(0, 4, 2, 2))


def test_rank_beyond_world():
    with pytest.raises(DistEnvError, match="OMPI_COMM_WORLD_SIZE"):
        resolve(ompi(4, 4, 0, 4))


def test_user_master_port_and_addr_win():
    env = resolve(slurm_task(0, 2, 0, 0, 2, "n[1-2]", "1(x2)", MASTER_PORT="31000", MASTER_ADDR="ib-n1"))
    assert (env.master_addr, env.master_port) == ("ib-n1", 31000)
    assert "user" in env.provenance["master_port"]


def test_keyword_overrides_win_over_everything():
    env = resolve(ompi(1, 2, 1, 2), master_addr="h", master_port=1111, world_size=2)
    assert (env.master_addr, env.master_port) == ("h", 1111)
    assert env.provenance["master_addr"] == "given to resolve()"
    with pytest.raises(TypeError):
        resolve({}, bogus=1)


def test_distenv_launcher_forces_and_disables():
    env = ompi(1, 2, 1, 2)
    assert resolve(env | {"DISTENV_LAUNCHER": "none"}).world_size == 1
    with pytest.raises(DistEnvError, match="SLURM"):
        resolve(env | {"DISTENV_LAUNCHER": "slurm"})
    with pytest.raises(DistEnvError, match="unknown launcher"):
        resolve(env | {"DISTENV_LAUNCHER": "nonsense"})
    # Forcing the torch variables over an MPI launch trusts them.
    got = resolve(env | {"DISTENV_LAUNCHER": "env", "RANK": "0", "WORLD_SIZE": "2"})
    assert got.launcher == "env" and got.rank == 0
    assert resolve(env, launcher="openmpi").rank == 1


def test_per_node_by_request_from_mpi_one_process_per_node(no_gpus):
    env = ompi(1, 2, 0, 1, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_orte_hnp_uri="3.0;tcp://10.0.0.1:9",
               DISTENV_NPROC_PER_NODE="2")
    got = resolve(env)
    assert got.launch == "per-node"
    assert (got.node_rank, got.num_nodes, got.nproc_per_node) == (1, 2, 2)
    assert (got.world_size, got.local_world_size, got.rank, got.local_rank) == (4, 2, None, None)
    assert got.master_addr == "10.0.0.1"
    written = got.export({})
    assert "RANK" not in written and written["NODE_RANK"] == "1"


def test_nproc_request_contradicting_launcher_is_an_error():
    with pytest.raises(DistEnvError, match="DISTENV_NPROC_PER_NODE"):
        resolve(ompi(1, 4, 1, 4, DISTENV_NPROC_PER_NODE="2"))


def test_single_process_asked_for_two_workers_is_a_one_node_per_node_launch():
    got = resolve({"DISTENV_NPROC_PER_NODE": "2"})
    assert got.launch == "per-node" and got.world_size == 2 and got.master_addr == "127.0.0.1"


def test_explain_names_every_field():
    text = resolve(slurm_task(1, 2, 1, 0, 1, "vm", "2")).explain()
    for field in ("rank", "SLURM_PROCID", "master_port", "SLURM_STEP_NODELIST"):
        assert field in text


def test_resolve_does_not_write_the_environment():
    env = ompi(1, 2, 1, 2)
    before = dict(env)
    resolve(env)
    assert env == before


def test_distenv_pickles_and_copies():
    import copy
    import pickle

    env = resolve({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
                   "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
                   "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "vm",
                   "SLURM_STEP_TASKS_PER_NODE": "2"})
    back = pickle.loads(pickle.dumps(env))
    assert back == env and back.provenance == env.provenance and back.hosts == ("vm",)
    assert copy.deepcopy(env) == env


def test_fixtures_exist():
    assert len(FIXTURES) >= 20


def test_every_platform_fixture_is_checked_by_its_source_file():
    # Each documented case belongs to one source (envs.platform_source), whose test file checks
    # it; dstack's and SkyPilot's are checked together, by test_node_list_platforms.py.
    with open(os.path.join(HERE, "sources", "test_node_list_platforms.py")) as f:
        shared = f.read()
    for source in {platform_source(name) for name in PLATFORM_CASES}:
        path = os.path.join(HERE, "sources", f"test_{source}.py")
        with open(path) as f:
            assert f'documented("{source}")' in f.read() or f'\n    "{source}": dict(' in shared, path


# -- every unknown carries a note (docs/inferences.md) -------------------------------------------
def _every_case():
    import json
    import os

    from envs import FIXTURES, PLATFORM_CASES, platform_case, recorded

    for name in PLATFORM_CASES:
        yield name, platform_case(name)["env"]
    folder = os.path.join(FIXTURES, "launchers")
    for f in sorted(os.listdir(folder)):
        with open(os.path.join(folder, f)) as fh:
            count = len(json.load(fh)["ranks"])
        for r in range(count):
            yield f"{f[:-5]}#{r}", recorded(f[:-5], r)


_VARS = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
         "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "NODE_RANK",
         "num_nodes": "num_nodes", "nproc_per_node": "nproc_per_node", "master_addr": "MASTER_ADDR"}


def test_every_unknown_field_of_every_documented_and_recorded_case_has_a_note():
    from distenv import DistEnvError

    seen, missing = 0, []
    for name, environ in _every_case():
        try:
            env = resolve(environ)
        except DistEnvError:
            continue  # a documented error case: the error says it
        for field, var in _VARS.items():
            if getattr(env, field) is not None:
                continue
            if env.launch == "per-node" and field in ("rank", "local_rank"):
                continue  # the workers are not started yet
            seen += 1
            if not any((field in n or var in n) and "Fix:" in n for n in env.notes):
                missing.append((name, field, env.notes))
    assert seen > 20, "the fixtures must include unknown fields for this test to mean anything"
    assert not missing, missing


@pytest.mark.parametrize("given", [dict(nproc_per_node=2, world_size=16),
                                   dict(nproc_per_node=1, rank=5, world_size=9),
                                   dict(nproc_per_node=2, local_world_size=4)])
def test_a_value_given_to_resolve_that_the_workers_per_node_contradict_is_an_error(no_gpus, given):
    # (second review of the AWS Batch source: they were replaced without a word, also under SkyPilot)
    node = platform_case("skypilot_2x4_node1")["env"]
    with pytest.raises(DistEnvError) as err:
        resolve(node, **given)
    assert "(given to resolve()) contradicts" in str(err.value) and "\n" not in str(err.value)
    agreeing = {k: v for k, v in given.items() if k == "nproc_per_node"}
    assert resolve(node, **agreeing).nproc_per_node == given["nproc_per_node"]
