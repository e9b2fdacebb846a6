"""Containers between the launcher and Python: which one this process runs in, and the Fix that
works there when it keeps the launcher's service out of reach.

A container starter passes the launcher's variables on (or not), and its service with them (or
not): the PMIx server's directory (``PMIX_SERVER_TMPDIR``, where the server keeps the job's
data), the PMI-1 descriptor (``PMI_FD``), the ``PMIX_*``/``PMI_*`` variables themselves. Where one
of them is missing, the Fix is the starter's own option -- never "use exec" to a user who did.
Each starter is known by a variable it sets in its containers:

=============  ===================================  ==================================================
starter        marker (set in the container)        source
=============  ===================================  ==================================================
pyxis/enroot   ``PYXIS_VERSION``                     read: NVIDIA/pyxis pyxis_slurmstepd.c (set before
                                                     ``enroot start``, imported into every task); hook
                                                     ``50-slurm-pmi.sh`` in NVIDIA/enroot conf/hooks/extra
Apptainer      ``APPTAINER_CONTAINER``,              read: Apptainer's documented container variables
               ``SINGULARITY_CONTAINER``
Charliecloud   ``CH_RUNNING``                        measured (ch-run 0.31, Debian 12)
Podman         ``container=podman``                  read: podman-run(1); NERSC podman-hpc issues 95, 97,
                                                     158 (``--preserve-fds``, the PMIx directory)
=============  ===================================  ==================================================

bubblewrap sets nothing: the generic Fix is given there.
"""

from __future__ import annotations

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping


class Container:
    """One starter: its `title`, the `markers` that say a process runs in one of its containers
    (a name, or ``name=value``), and its Fix for each thing it can keep out: ``dir`` (the PMIx
    server's directory, ``{dir}`` in the text), ``fd`` (PMI_FD), ``env`` (the service's
    variables)."""

    __slots__ = ("title", "markers", "fixes")

    def __init__(self, title: str, markers: "tuple[str, ...]", fixes: "dict[str, str]") -> None:
        self.title, self.markers, self.fixes = title, markers, fixes

    def present(self, environ: "Mapping[str, str]") -> bool:
        for marker in self.markers:
            name, sep, value = marker.partition("=")
            if name in environ and (not sep or environ[name] == value):
                return True
        return False


CONTAINERS = (
    Container("pyxis/enroot", ("PYXIS_VERSION",), {
        "dir": "enable enroot's 50-slurm-pmi.sh hook (copy it from enroot's hooks/extra into "
               "its hooks.d: it binds {dir} and passes PMIX_* and PMI_*), or srun "
               "--container-mounts={dir}",
        "fd": "enable enroot's 50-slurm-pmi.sh hook (copy it from enroot's hooks/extra into its "
              "hooks.d)",
        "env": "enable enroot's 50-slurm-pmi.sh hook (copy it from enroot's hooks/extra into "
               "its hooks.d): it passes SLURM_*, PMIX_* and PMI_* into the container",
    }),
    Container("Apptainer", ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"), {
        "dir": "apptainer exec --bind {dir} ..., or PMIX_MCA_gds=hash for every rank",
        "fd": "run apptainer without --containall/--cleanenv, which drop PMI_FD",
        "env": "run apptainer without --cleanenv (or --env PMIX_RANK=... for each variable)",
    }),
    Container("Charliecloud", ("CH_RUNNING",), {
        "dir": "ch-run -b {dir} ..., or PMIX_MCA_gds=hash for every rank",
        "fd": "run ch-run without --unset-env for PMI_FD",
        "env": "run ch-run without --unset-env/--env-file for the launcher's variables",
    }),
    Container("Podman", ("container=podman",), {
        "dir": "podman run -v {dir}:{dir} ... (as podman-hpc binds /var/spool/slurmd)",
        "fd": "podman run --preserve-fds=<PMI_FD - 2> -e PMI_FD ... (the descriptor is not "
              "passed into the container otherwise)",
        "env": "podman run -e 'SLURM_*' -e 'PMIX_*' -e 'PMI_*' ... (podman passes no variable "
               "it is not told to)",
    }),
)
#: Where no starter distenv knows is recognised.
GENERIC = {
    "dir": "make {dir} visible in the container (bind it), or set PMIX_MCA_gds=hash for every rank",
    "fd": "pass the descriptor PMI_FD names into the container",
    "env": "pass the launcher's PMIX_* and PMI_* variables into the container",
}


def here(environ: "Mapping[str, str]") -> "Container | None":
    """The starter whose container this process runs in, when one distenv knows says so."""
    return next((c for c in CONTAINERS if c.present(environ)), None)


def fix(environ: "Mapping[str, str]", what: str, **fields: str) -> str:
    """"Fix: ..." for `what` ("dir", "fd", "env") in the container here, naming it."""
    container = here(environ)
    text = (container.fixes if container else GENERIC)[what].format(**fields)
    return f"Fix: {text}" + (f" ({container.title})" if container else "")


def where(environ: "Mapping[str, str]") -> str:
    """" in the <starter> container" when one is recognised, else ""."""
    container = here(environ)
    return f" in the {container.title} container" if container else ""


__all__ = ["Container", "CONTAINERS", "here", "fix", "where"]
