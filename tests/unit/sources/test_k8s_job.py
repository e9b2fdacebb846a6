"""The resolver on Kubernetes Indexed Job and JobSet pods (src/distenv/sources/k8s_job.py),
written from Kubernetes's and JobSet's source (tests/fixtures/platforms/k8s_*.json,
jobset_*.json), with the variables the templates in integrations/kubernetes/ pass in.

JAX's own Kubernetes detection numbers a JobSet pod by its Job's JOB_COMPLETION_INDEX, which
starts at 0 in every Job: two Jobs of two pods give process ids 0, 1, 0, 1
(kubeflow/trainer#3537). distenv numbers them across the JobSet.
"""

import pytest

from distenv import DistEnvError, resolve
from envs import documented, platform, platform_case

JOBSET = [f"jobset_2jobs_job{j}_pod{p}" for j in (0, 1) for p in (0, 1)]
INDEXED = platform("k8s_indexed_job_2pods_pod1")
POD3 = platform("jobset_2jobs_job1_pod1")


@pytest.mark.parametrize("name", documented("k8s_job"))
def test_documented_platform_environment(name, check_documented):
    check_documented(name)


@pytest.mark.parametrize("name", documented("k8s_job"))
def test_distenv_show_json_gives_the_node_rank_count_and_master(name, show_json):
    want = platform_case(name)["expected"]
    got = show_json(platform_case(name)["env"])
    assert (got["launcher"], got["node_rank"], got["num_nodes"], got["master_addr"]) == (
        "k8s_job", want["node_rank"], want["num_nodes"], want["master_addr"])


# -- JobSet: one index across the Jobs ----------------------------------------------------------
def test_a_jobset_of_two_jobs_gives_four_distinct_global_process_indexes(fake_gpus):
    import distenv.jax

    fake_gpus(4)
    envs = [platform(name) for name in JOBSET]
    # What JAX's own detection takes as the process id: duplicates.
    assert sorted(int(e["JOB_COMPLETION_INDEX"]) for e in envs) == [0, 0, 1, 1]
    described = [resolve(e) for e in envs]
    assert [d.node_rank for d in described] == [0, 1, 2, 3]
    assert {d.num_nodes for d in described} == {4}
    assert {(d.master_addr, d.master_port) for d in described} == {
        ("distenv-ddp-workers-0-0.distenv-ddp", described[0].master_port)}
    # distenv.jax: one JAX process per pod (a per-node launch), numbered across the JobSet.
    plans = [distenv.jax.plan(d, environ=e) for d, e in zip(described, envs)]
    assert [p.process_id for p in plans] == [0, 1, 2, 3]
    assert {p.num_processes for p in plans} == {4}
    assert {p.coordinator_address.rsplit(":", 1)[0] for p in plans} == {
        "distenv-ddp-workers-0-0.distenv-ddp"}


def test_one_worker_per_pod_makes_each_pod_a_rank(no_gpus):
    ranks = [(d.launch, d.rank, d.world_size) for d in (resolve(platform(n)) for n in JOBSET)]
    assert ranks == [("per-process", r, 4) for r in range(4)]


def test_the_hosts_follow_jobset_s_names_and_place_every_rank(no_gpus):
    env = resolve(dict(POD3, DISTENV_NPROC_PER_NODE="2"))
    hosts = tuple(f"distenv-ddp-workers-{j}-{p}.distenv-ddp" for j in (0, 1) for p in (0, 1))
    assert env.hosts == hosts
    assert env.rank_hosts == tuple(h for h in hosts for _ in range(2))


def test_the_coordinator_need_not_be_process_0(no_gpus):
    # spec.coordinator may name another pod: it gives the names; node 0's pod is the master.
    env = resolve(dict(POD3, DISTENV_JOBSET_COORDINATOR="distenv-ddp-workers-1-1.distenv-ddp"))
    assert env.master_addr == "distenv-ddp-workers-0-0.distenv-ddp"


def test_jobset_without_its_labels_or_coordinator_says_what_to_pass(no_gpus):
    env = dict(POD3)
    del env["DISTENV_JOBSET_GLOBAL_REPLICAS"]
    got = resolve(env)
    assert got.node_rank is None and got.num_nodes is None
    assert any("jobset.sigs.k8s.io/global-replicas" in n and "Fix:" in n for n in got.notes)
    env = dict(POD3)
    del env["DISTENV_JOBSET_COORDINATOR"]
    got = resolve(env)
    assert (got.node_rank, got.num_nodes, got.master_addr) == (3, 4, None)
    assert any("spec.coordinator" in n and "Fix:" in n for n in got.notes)


def test_several_replicated_jobs_leave_the_node_rank_unknown(no_gpus):
    # global-replicas 3, this replicated Job 2: a third Job of another template may run any
    # number of pods, and whether it trains with these is not in the labels.
    got = resolve(dict(POD3, DISTENV_JOBSET_GLOBAL_REPLICAS="3"))
    assert (got.node_rank, got.num_nodes, got.master_addr) == (None, None, None)
    assert any("several replicated Jobs" in n and "Fix:" in n for n in got.notes)


# -- Indexed Job ------------------------------------------------------------------------------
def test_an_indexed_job_without_names_says_what_to_pass(no_gpus):
    env = dict(INDEXED)
    del env["DISTENV_JOB_SUBDOMAIN"]
    got = resolve(env)
    assert (got.node_rank, got.num_nodes, got.master_addr) == (1, 2, None)
    assert any("DISTENV_JOB_SUBDOMAIN not set" in n and "Fix:" in n for n in got.notes)


def test_an_indexed_job_pod_without_the_template_s_opt_in_stays_a_single_process():
    # Any Indexed Job (a work queue too) has JOB_COMPLETION_INDEX: it proves no gang. JAX's
    # own Kubernetes detection (which reads the Job's parallelism from the API) stays asked.
    from distenv.sources import covered

    env = {k: v for k, v in INDEXED.items() if not k.startswith("DISTENV_")}
    got = resolve(env)
    assert (got.launcher, got.world_size) == ("none", 1)
    assert any("JOB_COMPLETION_INDEX is set" in n for n in got.notes)
    assert "k8s" not in covered("jax")


def test_operator_and_tpu_pods_keep_their_sources(no_gpus):
    # Kubeflow Trainer v2 and GKE TPU pods are Indexed Job pods too.
    trainer = platform("kubeflow_trainer_v2_node1")
    assert resolve(dict(trainer, DISTENV_JOB_COMPLETIONS="2")).launcher == "kubeflow"
    tpu = {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "a,b", "JOB_COMPLETION_INDEX": "1",
           "DISTENV_JOB_COMPLETIONS": "2"}
    assert resolve(tpu).launcher == "gke_tpu"


# -- bad input: one line with a Fix, never a guess -------------------------------------------
@pytest.mark.parametrize("env, words", [
    ({**INDEXED, "JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX=2 is not below DISTENV_JOB_COMPLETIONS=2"),
    ({k: v for k, v in INDEXED.items() if k != "JOB_COMPLETION_INDEX"}, "the Job is not Indexed"),
    ({**POD3, "DISTENV_JOBSET_JOB_GLOBAL_INDEX": "2"}, "disagree"),
    ({**POD3, "DISTENV_JOBSET_COORDINATOR": "distenv-ddp-workers-0.distenv-ddp"},
     "is not JobSet's coordinator endpoint"),
    ({**POD3, "DISTENV_JOBSET_COORDINATOR": "distenv-ddp-workers-0-0"},
     "is not JobSet's coordinator endpoint"),
    ({**POD3, "DISTENV_JOBSET_COORDINATOR": "distenv-ddp-workers-2-0.distenv-ddp"},
     "names pod 0 of Job 2, but the JobSet's replicated Job has 2 Job(s)"),
    ({**INDEXED, "DISTENV_JOB_COMPLETIONS": "0"}, "DISTENV_JOB_COMPLETIONS='0'"),
])
def test_bad_input_is_one_line_with_a_fix(no_gpus, env, words):
    with pytest.raises(DistEnvError) as err:
        resolve(env)
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.fix


def test_a_hand_set_master_addr_naming_another_pod_is_an_error(no_gpus):
    with pytest.raises(DistEnvError, match="is node 1's address in the pods' host names"):
        resolve(dict(INDEXED, MASTER_ADDR="distenv-ddp-1.distenv-ddp"))
    with pytest.raises(DistEnvError, match="NODE_RANK=0 contradicts"):
        resolve(dict(INDEXED, NODE_RANK="0"))


def test_one_worker_per_pod_is_exec_ed_and_its_process_resolves_the_same(no_gpus):
    """No GPU in the pod: `distenv run` execs the command as the pod's only worker, with the
    torch variables exported and DISTENV_AUTO=1; that process (DISTENV_AUTO, the adapters)
    resolves the same launch again, the exported variables agreeing with the pod's."""
    from distenv import run

    p = run.plan(["python", "main.py"], POD3)
    assert p.mode == "exec" and p.argv == ["python", "main.py"]
    assert (p.environ["RANK"], p.environ["WORLD_SIZE"], p.environ["DISTENV_AUTO"]) == ("3", "4", "1")
    again = resolve(p.environ)
    assert (again.launcher, again.rank, again.world_size, again.master_addr, again.master_port) == (
        "k8s_job", 3, 4, "distenv-ddp-workers-0-0.distenv-ddp", p.env.master_port)


def test_a_node_count_no_job_has_is_refused_at_once(no_gpus):
    """DISTENV_JOB_COMPLETIONS=2147483647 built that many host names (resolve() ran for
    minutes: found by tests/reliability/test_fuzz_recorded.py, case 12813 of seed 9)."""
    import time

    start = time.monotonic()
    with pytest.raises(DistEnvError, match="more than the 1,000,000 distenv places.*Fix:"):
        resolve({**INDEXED, "DISTENV_JOB_COMPLETIONS": "2147483647"})
    assert time.monotonic() - start < 1
