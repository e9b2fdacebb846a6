"""The registry of sources: what each launcher or platform tells a process.

A *launcher* source describes the process (rank, sizes, ...). The first launcher in
`LAUNCHERS` whose marker variables are present and whose ``detect`` agrees wins, so the
order is the nesting rule: a launcher started *inside* another comes first (torchrun
started by srun describes the worker; mpirun inside a SLURM allocation beats the SLURM
variables it inherited). A *platform* source (Azure ML, SageMaker, ...) names where the job
runs and may fill what the launcher left unknown (typically the master address); some
platforms are launchers too when they start one process per node themselves.

Modules are imported only when one of their markers is present, which keeps
``import distenv`` and ``resolve()`` cheap. To add a source, write a module here whose
``SOURCE`` is an instance of a `Source` subclass (``distenv.sources.flux`` is a small one) and
add an `Entry` for it to `LAUNCHERS` (where the nesting rule puts it) or `PLATFORMS`.
"""

from __future__ import annotations

from .. import knobs

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from ..core.description import Later
    from ..core.reading import Env, Reading


class Launch:
    """What a launch proves beyond its variables, and what it leaves to the user.

    `aliases`: names DISTENV_LAUNCHER (and resolve(launcher=...)) accept (empty: the Source's
    `name`). `can_be_per_node`: a launch of one process per node may be turned into a per-node
    launch when the user asks for several workers per node (DISTENV_NPROC_PER_NODE).
    `per_node_platform`: a platform whose one process per node starts one worker per visible
    GPU when nothing else says how many (Azure ML's per-node MPI jobs). `node_order`: why no
    host list gives the order of this launcher's nodes, for fixes that would ask for one ("" when
    ranks fill a host list in order). `master_unknown`: why rank 0's host is unknown and what to
    do, in this launch's words, for the export error ("<problem> Fix: <fix>"; "" for the generic
    wording). `unknown_fix`: what to do about the fields this launcher never reveals (the node
    count, the host of every rank) where no service of its can tell them either ("" for the
    generic fixes). `platform`: for a platform that serves several names (gcp, vertex), the name
    here, or None when its markers are present but this is not one of its jobs; default: the
    Source's `name`. `agent_store`: the launcher's own agent may host the store at the master
    address, on a host rank 0 need not share (torchrun's c10d rendezvous), so rank 0 does not
    look for itself there (`distenv.bringup.master`)."""

    __slots__ = ("aliases", "can_be_per_node", "per_node_platform", "node_order", "master_unknown",
                 "unknown_fix", "platform", "agent_store")

    def __init__(self, *, aliases: "tuple[str, ...]" = (), can_be_per_node: bool = False,
                 per_node_platform: bool = False, node_order: str = "", master_unknown: str = "",
                 unknown_fix: str = "", platform: "Callable[[Env], str | None] | None" = None,
                 agent_store: bool = False) -> None:
        self.aliases, self.can_be_per_node, self.per_node_platform = aliases, can_be_per_node, per_node_platform
        self.node_order, self.master_unknown, self.unknown_fix = node_order, master_unknown, unknown_fix
        self.platform, self.agent_store = platform, agent_store


class Services(tuple[str, ...]):
    """The launcher's own services that know where every rank runs, in the order discovery
    tries them (`distenv.discovery.services`): "apinfo" (Cray PALS's placement file), "pmix",
    "pmi" (the PMI-1 wire protocol); the tuple of their names. Each checks its own variables
    and guards before it is offered; none is asked by resolve(). `fix`: what to do when none of
    them is offered to a process of this launch (how to launch so that one is), for the note
    discovery leaves; "" for the generic fix. `refuses(service, env)`: why this launch must not
    ask `service` although it is offered, with the fix; "" when it may (SLURM: PMI-1 does not
    span a heterogeneous step)."""

    fix: str
    refuses: "Callable[[str, Env], str]"

    def __new__(cls, *names: str, fix: str = "",
                refuses: "Callable[[str, Env], str] | None" = None) -> "Services":
        self = super().__new__(cls, names)
        self.fix = fix
        self.refuses = refuses or _may_ask
        return self


def _may_ask(service: str, env: "Env") -> str:
    return ""


class PassOn:
    """How a variable exported in the job script reaches every rank under this launcher, and how
    it labels output lines.

    `how`: for fixes in messages, "{name}" and "{value}" filled in ("mpirun -x {name}"); "" when
    the launcher has no such way or every rank inherits the script's environment anyway.
    `only`: variables exported in the job script reach ranks on other nodes only through `how`
    (Open MPI's mpirun); fixes that ask for a variable on every node then say so (`note`).
    `label_var`: how this launcher says it starts every output line with the rank itself (so
    distenv's CLI adds no ``[rank N]``): (variable, its values that mean yes -- () for any but ""
    and "0" --, the option's name for messages), or None. `label_options`: the launcher's
    programs (by name; a name ending in ".<suffix>" counts as ``program.<suffix>`` when listed)
    and their options that prefix each line with the rank."""

    __slots__ = ("how", "only", "label_var", "label_options")

    def __init__(self, how: str = "", *, only: bool = False,
                 label_var: "tuple[str, tuple[str, ...], str] | None" = None,
                 label_options: "dict[str, tuple[str, ...]] | None" = None) -> None:
        self.how, self.only, self.label_var, self.label_options = how, only, label_var, label_options or {}

    def fill(self, name: str, value: object = "<value>") -> str:
        """`how` filled in for one variable, or ""."""
        return self.how.format(name=name, value=value) if self.how else ""

    def note(self, name: str, title: str) -> str:
        """That `name` reaches other nodes only through `how` (`only`), or ""."""
        if not self.only or not self.how:
            return ""
        return f"{title} passes variables to other nodes only with {self.fill(name)}"


class Frameworks:
    """What frameworks' adapters read of this launch.

    `adapters`: the distenv adapters ("jax", "lightning", "transformers", "torch", ...) whose
    zero-code paths act on this launch; None: every one. The others leave the framework's own
    set-up alone (a TPU pod: torch-xla numbers processes per chip, not per host, so the
    host-level ranks must not reach torch's variables). `instead`: adapters this launch leaves to
    the framework's own integration, each with what to use instead (Ray Train runs Lightning
    through RayDDPStrategy): their zero-code paths do nothing, and an explicit call is refused in
    one line with it. `covers`: frameworks' own launch detections ("framework:name", e.g.
    "jax:slurm") that read the environments this source reads: where distenv resolves a launch,
    those are not asked (a detection no source covers is left alone when distenv finds no
    launcher, `covered`). `mpi_controller`: adapters ("horovod") whose MPI controller joins this
    launch's ranks by default (MPI_Init of a build against this MPI finds every rank).
    `tf_cluster`: the variable in which this platform describes the TensorFlow cluster itself
    (Google Cloud's CLUSTER_SPEC), and `tf_config(env)` that cluster as a TF_CONFIG dict (or
    None); adapters take it instead of building one."""

    __slots__ = ("adapters", "instead", "covers", "mpi_controller", "tf_cluster", "tf_config")

    def __init__(self, *, adapters: "tuple[str, ...] | None" = None,
                 instead: "dict[str, str] | None" = None, covers: "tuple[str, ...]" = (),
                 mpi_controller: "tuple[str, ...]" = (), tf_cluster: str = "",
                 tf_config: "Callable[[Env], dict[str, Any] | None] | None" = None) -> None:
        self.adapters, self.instead, self.covers = adapters, instead or {}, covers
        self.mpi_controller, self.tf_cluster, self.tf_config = mpi_controller, tf_cluster, tf_config


class Doctor:
    """How `distenv doctor` finds the launcher's own version: the variable that holds it (`var`,
    shown as "<title> <value>"), else the Python distribution that is the launcher (`package`),
    else `command`'s ``--version`` (`commands`: another command for some of the launcher's
    names) -- found among this process's ancestors (`programs`; a daemon in `daemons` stands for
    the command installed next to it), else on PATH. `job_prefixes`: the variables that make the
    launcher's own command think it runs inside one of its jobs (the doctor drops every
    launcher's before running a ``--version``)."""

    __slots__ = ("var", "package", "command", "commands", "programs", "daemons", "job_prefixes")

    def __init__(self, *, var: str = "", package: str = "", command: str = "",
                 commands: "dict[str, str] | None" = None, programs: "tuple[str, ...]" = (),
                 daemons: "tuple[str, ...]" = (), job_prefixes: "tuple[str, ...]" = ()) -> None:
        self.var, self.package, self.command, self.commands = var, package, command, commands or {}
        self.programs, self.daemons, self.job_prefixes = programs, daemons, job_prefixes

    def command_for(self, launcher: str) -> str:
        """The version command for `launcher` (one source may serve several names)."""
        return self.commands.get(launcher, self.command)


class Source:
    """One launcher or platform: what it declares (the grouped declarations below) and how it
    reads an environment. Subclasses set `name`, and override `read` (launchers) and/or
    `overlay` (platforms)."""

    #: Name shown as `launcher` (or `platform`).
    name = ""
    #: Human name used in messages ("Open MPI").
    title = ""
    #: The launcher family: "mpi" (mpirun/mpiexec start every rank), "slurm", "torch"
    #: (torchrun-style RANK/WORLD_SIZE), "platform" (a cloud service), or the launcher's own
    #: name. Adapters and tools (distenv run, doctor, horovod) branch on it, never on names.
    family = ""
    #: Prefixes (or whole names) of the variables this launcher or platform sets (the doctor
    #: shows them).
    prefixes: "tuple[str, ...]" = ()
    #: Canonical torch variables this source reads with its *own* meaning; the resolver
    #: does not cross-check them (e.g. GCP's RANK is a node index).
    owns: "tuple[str, ...]" = ()
    launch = Launch()
    services = Services()
    passing = PassOn()
    frameworks = Frameworks()
    doctor = Doctor()

    def detect(self, env: "Env") -> bool:
        """Refine the marker match (e.g. a SLURM batch script is not a task)."""
        return True

    def read(self, env: "Env", r: "Reading") -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def overlay(self, env: "Env", r: "Reading") -> None:
        """Platforms: fill fields the launcher left unknown."""

    def after(self, env: "Env", r: "Reading") -> None:
        """Run after the resolver's per-node and one-node steps, before the master is
        settled (Kubeflow: a node rank the operator gives only per pod)."""

    def place(self, env: "Env", values: "dict[str, Any]", per_node: bool
              ) -> "tuple[Later, str] | None":
        """Which host runs each global rank, where this launch proves it: a `Later` that
        builds the tuple on first access, and its why; None when it proves nothing. Called
        with the fields read so far (world size known) for the launcher's source, then for
        the platform's (`distenv.core.placement.record`)."""
        return None


def names_of(source: Source) -> "tuple[str, ...]":
    """Every name that selects `source` (its `launch.aliases`, else its `name`)."""
    return source.launch.aliases or (source.name,)


def platform_name(source: Source, env: "Env") -> "str | None":
    """A platform source's name here (`Launch.platform`), None when this is not its job."""
    return source.launch.platform(env) if source.launch.platform is not None else source.name


class Entry:
    __slots__ = ("name", "module", "markers", "_source")

    def __init__(self, name: str, module: str, markers: "Iterable[str]") -> None:
        self.name = name
        self.module = module
        self.markers = tuple(markers)
        self._source: "Source | None" = None

    def load(self) -> Source:
        if self._source is None:
            # __import__, not importlib.import_module: importing importlib (and the warnings
            # module it pulls in) cost more than the rest of `import distenv`.
            source: Source = __import__(f"{__name__}.{self.module}", fromlist=("SOURCE",)).SOURCE
            self._source = source
        return self._source

    def present(self, env: "Env") -> "str | None":
        for var in self.markers:
            if var in env:
                return var
        return None


# Order matters: see the module docstring. Markers: any one makes the source a candidate.
LAUNCHERS = [
    # A worker Lightning started from a per-node process inherits the node's launcher variables.
    Entry("lightning", "lightning_node", (knobs.LIGHTNING_NODE,)),
    Entry("torchrun", "torchrun", ("TORCHELASTIC_RUN_ID",)),
    Entry("deepspeed", "deepspeed", ("CROSS_RANK",)),
    Entry("horovodrun", "horovodrun", ("HOROVOD_RANK",)),
    # Ray runs inside the cluster launchers below (its workers inherit their variables); the
    # launchers above start inside Ray workers (horovod.ray, torchrun in a Ray task).
    Entry("ray", "ray", ("RAY_RAYLET_PID",)),
    Entry("openmpi", "openmpi", ("OMPI_COMM_WORLD_RANK",)),
    Entry("mvapich2", "mvapich2", ("MV2_COMM_WORLD_RANK",)),
    Entry("pals", "pals", ("PALS_RANKID",)),
    Entry("hydra", "hydra", ("PMI_RANK", "PMI_ID")),  # MPICH or Intel MPI
    Entry("flux", "flux", ("FLUX_TASK_RANK",)),
    Entry("lsf", "lsf", ("JSM_NAMESPACE_RANK",)),
    Entry("slurm", "slurm", ("SLURM_STEP_ID", "SLURM_STEPID")),
    Entry("gke_tpu", "gke_tpu", ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")),
    Entry("kubeflow", "kubeflow", ("PET_NNODES", "PET_NODE_RANK")),
    Entry("gcp", "gcp", ("CLUSTER_SPEC",)),
    Entry("sagemaker", "sagemaker", ("SM_HOSTS",)),
    Entry("skypilot", "skypilot", ("SKYPILOT_NODE_RANK",)),
    Entry("dstack", "dstack", ("DSTACK_NODE_RANK",)),
    Entry("aws_batch", "aws_batch", ("AWS_BATCH_JOB_NODE_INDEX",)),
    # Indexed Job / JobSet pods: only with the template's DISTENV_JOB_COMPLETIONS (detect()).
    Entry("k8s_job", "k8s_job", ("JOB_COMPLETION_INDEX", knobs.JOB_COMPLETIONS)),
    Entry("tf_config", "tfconfig", ("TF_CONFIG",)),
    Entry("env", "plain", ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
]

# The launcher used when nothing else matched.
NONE = Entry("none", "single", ())

# Platforms, first match names the platform. Markers are the platform's own variables.
PLATFORMS = [
    Entry(
        "azureml",
        "azureml",
        (
            "AZ_BATCH_MASTER_NODE",
            "AZ_BATCHAI_MPI_MASTER_NODE",
            "AZUREML_RUN_ID",
            "AZUREML_EXPERIMENT_ID",
        ),
    ),
    Entry("sagemaker", "sagemaker", ("SM_HOSTS", "SM_CURRENT_HOST", "SM_TRAINING_ENV")),
    Entry("gcp", "gcp", ("CLUSTER_SPEC", "CLOUD_ML_JOB_ID")),  # gcp or vertex
    Entry("kubeflow", "kubeflow", ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")),
]


def names() -> "list[str]":
    """Every launcher name DISTENV_LAUNCHER accepts."""
    out: "list[str]" = []
    for entry in LAUNCHERS:
        out.extend(names_of(entry.load()))
    return out + ["none"]


def _all_sources() -> "list[Source]":
    seen: "list[Source]" = []
    for entry in LAUNCHERS + [NONE] + PLATFORMS:
        source = entry.load()
        if source not in seen:
            seen.append(source)
    return seen


def family(launcher: "str | None") -> str:
    """The family of a launcher name (or alias): "mpi", "slurm", "torch", ...; "" if unknown."""
    if not launcher:
        return ""
    entry = find(launcher)
    return entry.load().family if entry is not None else ""


def source_of(launcher: "str | None") -> Source:
    """The source of a launcher name (or alias) -- what adapters branch on; for an unknown
    name, a bare `Source` that declares nothing."""
    entry = find(launcher) if launcher else None
    return entry.load() if entry is not None else Source()


def adapter_acts(launcher: "str | None", adapter: str) -> bool:
    """Does the zero-code `adapter` ("torch", "jax", ...) act on a launch by `launcher`?
    (`Frameworks.adapters`; an unknown name: yes.)"""
    entry = find(launcher) if launcher else None
    if entry is None:
        return True
    source = entry.load()
    acts = source.frameworks
    return adapter not in acts.instead and (acts.adapters is None or adapter in acts.adapters)


def job_prefixes() -> "tuple[str, ...]":
    """Every launcher's `job_prefixes`, each once."""
    out: "list[str]" = []
    for source in _all_sources():
        out.extend(p for p in source.doctor.job_prefixes if p not in out)
    return tuple(out)


def label_sources() -> "list[Source]":
    """Every source that declares how its launcher labels output lines (`PassOn.label_var`,
    `label_options`); loads every source module, so for the CLI, not for resolve()."""
    return [s for s in _all_sources() if s.passing.label_var is not None or s.passing.label_options]


def covered(framework: str) -> "frozenset[str]":
    """The names of `framework`'s own launch detections some source covers (`Frameworks.covers`)."""
    prefix = framework + ":"
    return frozenset(c[len(prefix):] for s in _all_sources() for c in s.frameworks.covers
                     if c.startswith(prefix))


def prefixes(family_name: "str | None" = None) -> "tuple[str, ...]":
    """The variable prefixes of every source (of one family when given), each once."""
    out: "list[str]" = []
    for source in _all_sources():
        if family_name is None or source.family == family_name:
            out.extend(p for p in source.prefixes if p not in out)
    return tuple(out)


def find(name: str) -> "Entry | None":
    entries = LAUNCHERS + [NONE]
    for entry in entries:  # by name first: loads no source module
        if name == entry.name:
            return entry
    for entry in entries:
        if name in entry.load().launch.aliases:
            return entry
    return None
