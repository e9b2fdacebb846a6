"""Kubernetes Indexed Jobs and JobSets (no training operator): one pod per node.

An Indexed Job (``completionMode: Indexed``) gives each pod JOB_COMPLETION_INDEX and the host
name ``<job>-<index>``; a JobSet creates one Indexed Job per replica of each replicated Job
and labels every pod with its place (``jobset.sigs.k8s.io/...``). Everything else a launch
needs is in the Job's spec or the pod's labels, which a container sees only when its template
passes them in (the downward API, or a value the template repeats): distenv reads this source
only when the template does (DISTENV_JOB_COMPLETIONS is its opt-in), so a pod of any other
Indexed Job (a work queue, say) stays a single process, and JAX's own Kubernetes detection
(``jax/_src/clusters/k8s_cluster.py``, which asks the API server for the Job's parallelism)
is left alone there: this source covers no framework detection (``Frameworks.covers`` is empty). Each pod
is a node whose workers `distenv run` starts (one per visible GPU by default).

Variables (the templates in ``integrations/kubernetes/`` set them):

==================================  ===========================================================
variable                            what the pod gets
==================================  ===========================================================
JOB_COMPLETION_INDEX                set by Kubernetes in every container of an Indexed Job's
                                    pod (``pkg/controller/job/indexed_job_utils.go``,
                                    ``addCompletionIndexEnvVariable``): 0 .. completions-1
DISTENV_JOB_COMPLETIONS             the template's copy of the Job's ``completions`` (=
                                    ``parallelism``: every pod runs at once)
DISTENV_JOB_NAME                    downward API ``metadata.labels['batch.kubernetes.io/
                                    job-name']`` (Indexed Job)
DISTENV_JOB_SUBDOMAIN               the pod template's ``subdomain`` (its headless Service)
DISTENV_JOBSET_JOB_GLOBAL_INDEX     label ``jobset.sigs.k8s.io/job-global-index`` (JobSet
                                    v0.6.0+, kubernetes-sigs/jobset#650)
DISTENV_JOBSET_GLOBAL_REPLICAS      label ``jobset.sigs.k8s.io/global-replicas`` (v0.7.0+)
DISTENV_JOBSET_REPLICATED_JOB_      label ``jobset.sigs.k8s.io/replicatedjob-replicas``
REPLICAS
DISTENV_JOBSET_COORDINATOR          label ``jobset.sigs.k8s.io/coordinator`` (when the JobSet
                                    sets ``spec.coordinator``)
==================================  ===========================================================

Proof of every field (Kubernetes ``pkg/controller/job/job_controller.go``: an Indexed Job's
pod has ``spec.hostname = <job>-<index>``, so with ``spec.subdomain`` naming a headless
Service that selects the pods, ``<job>-<index>.<subdomain>`` resolves in the namespace (Job
docs, "Completion mode"); JobSet v0.12.0 ``pkg/controllers/jobset_controller.go``:
``labelAndAnnotateObject``, ``globalJobIndex``, ``globalReplicas``, ``CoordinatorEndpoint``;
``pkg/util/placement/placement.go``, ``GenJobName``):

===============  ===========================================================================
field            rule
===============  ===========================================================================
node_rank        Indexed Job: JOB_COMPLETION_INDEX. JobSet: job-global-index x pods per Job
                 + JOB_COMPLETION_INDEX -- unique across the JobSet's Jobs, where each Job's
                 completion indexes start at 0 again (JAX's per-Job index gives duplicate
                 process ids there: kubeflow/trainer#3537). ``globalJobIndex`` numbers the
                 Jobs 0 .. global-replicas-1, replicated Job by replicated Job; the rule needs
                 every Job to run as many pods, proven when the JobSet has one replicated Job
                 (global-replicas = replicatedjob-replicas: every Job from one template).
                 Several replicated Jobs: unknown, with a note
num_nodes        DISTENV_JOB_COMPLETIONS (Indexed Job); global-replicas x it (JobSet)
hosts,           Indexed Job: ``<DISTENV_JOB_NAME>-<k>.<DISTENV_JOB_SUBDOMAIN>`` for node
master_addr      k. JobSet: the coordinator endpoint is ``<jobset>-<replicatedJob>-<jobIndex>
                 -<podIndex>.<subdomain>`` and Job j of the one replicated Job is
                 ``<jobset>-<replicatedJob>-<j>``, so node k is ``<jobset>-<replicatedJob>-
                 <k // pods>-<k % pods>.<subdomain>``. Master: node 0's host (rank 0 runs
                 there). Without the names: unknown, with a note
master_port      derived from the Job's name (Indexed Job) or node 0's host (JobSet): the same
                 in every pod, different across Jobs running at once
job_id           DISTENV_JOB_NAME
===============  ===========================================================================

Errors (one line, with a Fix): DISTENV_JOB_COMPLETIONS without JOB_COMPLETION_INDEX (a Job
that is not Indexed); an index not below its count; a coordinator endpoint that is not
JobSet's shape, or whose Job or pod index is outside the JobSet; a MASTER_ADDR set by hand that
is another pod's host (`_common.check_master`). Not provable from a pod: that a JobSet
template passes only the Indexed Job variables (each Job would look like a whole job: pass the
JobSet's labels), and that ``parallelism`` equals ``completions``.
"""

from __future__ import annotations

from ..core.description import PER_NODE
from .. import knobs
from ..errors import DistEnvError
from ..core.reading import get_int, show
from . import Launch, PassOn, Source, names_of
from ._common import check_master

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env, Reading

COUNT = knobs.JOB_COMPLETIONS
GLOBAL_INDEX = knobs.JOBSET_JOB_GLOBAL_INDEX
GLOBAL_REPLICAS = knobs.JOBSET_GLOBAL_REPLICAS
REPLICAS = knobs.JOBSET_REPLICATED_JOB_REPLICAS
COORDINATOR = knobs.JOBSET_COORDINATOR
#: The downward-API source of each JobSet variable, for fixes.
LABELS = {GLOBAL_INDEX: "jobset.sigs.k8s.io/job-global-index",
          GLOBAL_REPLICAS: "jobset.sigs.k8s.io/global-replicas",
          REPLICAS: "jobset.sigs.k8s.io/replicatedjob-replicas",
          COORDINATOR: "jobset.sigs.k8s.io/coordinator"}
FIX = ("Fix: set DISTENV_JOB_COMPLETIONS to the Job's completions (equal to its parallelism) and "
       "pass the pod's labels unchanged through the downward API, as "
       "integrations/kubernetes/ does.")


def _bounded(pods: int, what: str) -> None:
    """A node count larger than any host list distenv builds (`distenv.core.hostlist.MAX_HOSTS`) is
    not a Job's: building its host names would take minutes."""
    from ..core.hostlist import MAX_HOSTS

    if pods > MAX_HOSTS:
        raise DistEnvError(f"{what} gives {pods:,} pods, more than the {MAX_HOSTS:,} distenv "
                           f"places. {FIX}")


class IndexedJob(Source):
    name = "k8s_job"
    title = "Kubernetes Indexed Job"
    family = "platform"
    launch = Launch(aliases=("k8s_job", "indexed_job", "jobset"))
    passing = PassOn(how="env: [{{name: {name}, value: \"{value}\"}}] in the pod template")
    prefixes = ("JOB_COMPLETION_INDEX", "DISTENV_JOB_", "DISTENV_JOBSET_")

    def detect(self, env: "Env") -> bool:
        return COUNT in env  # the template's opt-in (see the module docstring)

    def read(self, env: "Env", r: "Reading") -> None:
        r.launch = PER_NODE
        pods = get_int(env, COUNT, self.title, minimum=1)
        assert pods is not None  # detect() saw it
        index = get_int(env, "JOB_COMPLETION_INDEX", self.title)
        if index is None:
            raise DistEnvError(f"{COUNT}={pods} is set but JOB_COMPLETION_INDEX is not: the Job is "
                               "not Indexed, so its pods have no index. Fix: set completionMode: "
                               "Indexed in the Job's spec (JobSet sets it for its Jobs).")
        if index >= pods:
            raise DistEnvError(f"JOB_COMPLETION_INDEX={index} is not below {COUNT}={pods}: the "
                               f"Job's pods are numbered 0 to completions-1. {FIX}")
        if any(var in env for var in LABELS):
            self._jobset(env, r, index, pods)
        else:
            self._job(env, r, index, pods)

    def _job(self, env: "Env", r: "Reading", index: int, pods: int) -> None:
        _bounded(pods, f"{COUNT}={pods}")
        r.set("launcher", self.name, f"JOB_COMPLETION_INDEX with {COUNT}: a pod of an Indexed Job, "
                                     "one per node")
        r.set("node_rank", index, f"JOB_COMPLETION_INDEX={index}")
        r.set("num_nodes", pods, f"{COUNT}={pods} (the Job's completions)")
        job = (env.get(knobs.JOB_NAME) or "").strip()
        sub = (env.get(knobs.JOB_SUBDOMAIN) or "").strip()
        if job:
            r.set("job_id", job, knobs.JOB_NAME)
            r.port_key = "k8s-job:" + job
        if job and sub:
            hosts = tuple(f"{job}-{k}.{sub}" for k in range(pods))
            why = "<DISTENV_JOB_NAME>-<index>.<DISTENV_JOB_SUBDOMAIN> (an Indexed Job's pod host names)"
            self._hosts(env, r, hosts, why)
        elif pods > 1:
            missing = " and ".join(v for v, x in ((knobs.JOB_NAME, job),
                                                  (knobs.JOB_SUBDOMAIN, sub)) if not x)
            r.notes.append(
                f"{missing} not set: the pods' host names, and so rank 0's address, are unknown. "
                "Fix: pass the Job's name (downward API: metadata.labels['batch.kubernetes.io/"
                "job-name']) as DISTENV_JOB_NAME and the pod template's subdomain (a headless "
                "Service selecting the pods) as DISTENV_JOB_SUBDOMAIN")

    def _jobset(self, env: "Env", r: "Reading", index: int, pods: int) -> None:
        r.set("launcher", self.name, f"JOB_COMPLETION_INDEX with {COUNT} and JobSet labels: a pod "
                                     "of a JobSet, one per node")
        g = get_int(env, GLOBAL_INDEX, self.title)
        total = get_int(env, GLOBAL_REPLICAS, self.title, minimum=1)
        reps = get_int(env, REPLICAS, self.title, minimum=1)
        missing = [v for v, x in ((GLOBAL_INDEX, g), (GLOBAL_REPLICAS, total), (REPLICAS, reps))
                   if x is None]
        if missing:
            r.notes.append(
                f"a JobSet pod without {', '.join(missing)}: its place among the JobSet's Jobs is "
                "unknown (JOB_COMPLETION_INDEX numbers the pods of one Job, so every Job has a "
                "pod 0). Fix: pass the pod's labels " + ", ".join(LABELS[v] for v in missing)
                + f" (downward API) as {', '.join(missing)}")
            return
        assert g is not None and total is not None and reps is not None  # none is missing
        if g >= total or reps > total:
            raise DistEnvError(f"{GLOBAL_INDEX}={g}, {REPLICAS}={reps} and {GLOBAL_REPLICAS}={total} "
                               "disagree: JobSet numbers its Jobs 0 to global-replicas-1, and a "
                               f"replicated Job holds at most global-replicas of them. {FIX}")
        if reps != total:
            r.notes.append(
                f"the JobSet has several replicated Jobs ({GLOBAL_REPLICAS}={total}, this one's "
                f"{REPLICAS}={reps}): whether their Jobs run as many pods as this one, and which of "
                "them train together, is not in this pod's labels, so the node rank and count are "
                "unknown. Fix: put the pods that train together in one replicated Job (replicas: "
                "the number of Jobs)")
            return
        node, count = g * pods + index, total * pods
        _bounded(count, f"{GLOBAL_REPLICAS}={total} x {COUNT}={pods}")
        r.set("node_rank", node, f"{GLOBAL_INDEX}={g} x {COUNT}={pods} + JOB_COMPLETION_INDEX="
                                 f"{index} (the pod's place across the JobSet's Jobs)")
        r.set("num_nodes", count, f"{GLOBAL_REPLICAS}={total} Job(s) x {COUNT}={pods} pods (one "
                                  "replicated Job: every Job from one template)")
        coordinator = (env.get(COORDINATOR) or "").strip()
        if coordinator:
            prefix, sub = _endpoint(coordinator, reps, pods)
            hosts = tuple(f"{prefix}-{k // pods}-{k % pods}.{sub}" for k in range(count))
            self._hosts(env, r, hosts, "<jobset>-<replicatedJob>-<job>-<pod>.<subdomain> (JobSet's "
                                       f"pod host names, named as in {COORDINATOR})")
        elif count > 1:
            r.notes.append(
                f"{COORDINATOR} is not set: the pods' host names, and so rank 0's address, are "
                "unknown. Fix: give the JobSet spec.coordinator (replicatedJob: <its name>) and "
                f"pass the pod's label {LABELS[COORDINATOR]} (downward API) as {COORDINATOR}")

    @staticmethod
    def _hosts(env: "Env", r: "Reading", hosts: "tuple[str, ...]", why: str) -> None:
        r.set("hosts", hosts, why)
        r.set("master_addr", hosts[0], f"node 0's pod host name ({hosts[0]}), where rank 0 runs")
        r.port_key = r.port_key or "k8s-job:" + hosts[0]
        check_master(env, hosts, "the pods' host names")

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """Node k (pod k's host) runs ranks k*nproc .. k*nproc+nproc-1, also when each pod is
        its only worker (a per-process launch)."""
        if values.get("launcher") not in names_of(self):
            return None
        from ..core.placement import repeated

        return repeated(values, f"the pods' host names in node order, nproc_per_node="
                                f"{values.get('nproc_per_node')} each (workers are numbered "
                                "node_rank * nproc_per_node + local_rank)")


def _endpoint(raw: str, jobs: int, pods: int) -> "tuple[str, str]":
    """(``<jobset>-<replicatedJob>``, subdomain) of JobSet's coordinator endpoint
    ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>``, its indexes checked."""
    host, _, sub = raw.partition(".")
    parts = host.rsplit("-", 2)
    if len(parts) != 3 or not sub or not all(p.isascii() and p.isdigit() for p in parts[1:]) \
            or not parts[0]:
        raise DistEnvError(f"{COORDINATOR}={show(raw)} is not JobSet's coordinator endpoint "
                           f"<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>. {FIX}")
    j, p = int(parts[1]), int(parts[2])
    if j >= jobs or p >= pods:
        raise DistEnvError(f"{COORDINATOR}={show(raw)} names pod {p} of Job {j}, but the JobSet's "
                           f"replicated Job has {jobs} Job(s) of {pods} pod(s). {FIX}")
    return parts[0], sub


SOURCE = IndexedJob()
