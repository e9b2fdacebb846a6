"""Run a command as every rank of a real launcher layout and gather one record per rank.

    from harness import LAYOUTS, run_ranks, probe_cmd
    records = run_ranks("openmpi4", "2x2", probe_cmd("openmpi4", "2x2"))

A *layout* is one way of starting ranks: a launcher (the names of
integrations/launchers.py), a shape (``np4`` on this host, ``2x2`` on the two
network-namespace nodes of integrations/cluster, ``srun -N2 -n3``, ...), what it needs
running first (``needs``: nothing, the one-node SLURM ``slurm1``, the two-node
``cluster``, the two-node SLURM ``slurm2``), and what distenv is expected to leave
unknown there (``unknown``: fields the launcher does not reveal).

How ranks report: every rank runs ``/bin/sh -c 'exec "$@" >DIR/<host>.XXXXXX.out'``
around the command, so each rank's stdout lands in its own file in a directory all
"nodes" share (they share the mount namespace). Launchers that merge or split the
ranks' output lines (srun cuts long lines, Intel MPI glues them) cannot corrupt a
record, and the number of files is the number of ranks that really ran. A record is
the JSON object printed after the marker ``DISTENV-PROBE `` (see rank_probe.py).

Every launch runs under ``timeout -k 5 <seconds>`` (a batch job: polled, then
scancel'ed). Launch directories go under $DISTENV_RUN_DIR/itest and are removed
afterwards (DISTENV_KEEP_RUNS=1 keeps those of failed runs). The environment given to a
launcher is this process's minus every launcher/torch variable (a stale RANK in the
caller's shell must not leak into ranks).

Command line (used by integrations/record/record_cluster.sh):

    python tests/integration/harness.py list
    python tests/integration/harness.py record OUT_DIR [GLOB]   # two-node layouts -> fixtures
"""
from __future__ import annotations

import fnmatch
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from integrations import launchers as table  # noqa: E402  (the launcher table)

PROBE = HERE / "rank_probe.py"
RDZV = HERE / "rdzv_probe.py"
RECORD_ENV = REPO / "integrations" / "record" / "record_env.py"
COLLECT = REPO / "integrations" / "record" / "collect.py"
CLUSTER = REPO / "integrations" / "cluster"
ON_NODE = str(CLUSTER / "on-node")
FAKESSH = str(CLUSTER / "fakessh")


def ssh_on_path(folder):
    """A directory (made in `folder`) whose `ssh` runs the fake ssh, to put first on PATH for
    launchers that call plain `ssh` (horovodrun, the DeepSpeed runner) to reach the namespace
    nodes; a symlink would not do: fakessh finds its siblings from $0."""
    from pathlib import Path

    d = Path(folder) / "sshbin"
    d.mkdir()
    (d / "ssh").write_text(f'#!/bin/sh\nexec {FAKESSH} "$@"\n')
    (d / "ssh").chmod(0o755)
    return d
NET = "10.213.77.0/24"
NODE_IP = {"node1": "10.213.77.11", "node2": "10.213.77.12"}
NODES = ("node1", "node2")
LOCALHOST = socket.gethostname()
PY = sys.executable
MARK = "DISTENV-PROBE "

OMPI4 = "/usr/bin/mpirun.openmpi"
MPICH4 = "/usr/bin/mpiexec.mpich"


def run_dir() -> Path:
    return table.run_dir()


def slurm_conf(needs: str) -> str:
    if needs == "slurm1":
        return str(run_dir() / "slurm1" / "slurm.conf")
    return str(run_dir() / "cluster" / "slurm" / "slurm.conf")


# -- a clean environment for launchers ---------------------------------------------------
LAUNCHER_PREFIXES = (
    "OMPI_", "PMIX_", "PMI_", "MPI_LOCAL", "HYDRA_", "I_MPI_", "MV2_", "SLURM_", "SLURMD_",
    "TORCHELASTIC_", "PALS_", "FLUX_", "JSM_", "LSB_", "HOROVOD_", "PET_", "SM_", "AZ_BATCH",
    "AZUREML_", "PRTE_", "FI_",
)
LAUNCHER_NAMES = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
    "NNODES", "CROSS_RANK", "CLUSTER_SPEC", "CLOUD_ML_JOB_ID", "TF_CONFIG",
    "DISTENV_LAUNCHER", "DISTENV_NPROC_PER_NODE", "CUDA_VISIBLE_DEVICES",
}


def clean_env(extra: "dict[str, str] | None" = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra or {})
    return env


# -- layouts -----------------------------------------------------------------------------
Argv = Callable[[Sequence[str], Sequence[str]], "list[str]"]  # (cmd, extra launcher args)

#: distenv fields whose values the layout tests compare with the launcher's truth.
CHECKED = ("rank", "local_rank", "world_size", "local_world_size", "node_rank", "num_nodes",
           "nproc_per_node", "master_addr", "master_port")
#: Unknown on a multi-node Hydra (MPICH) job: only ranks and local ranks are given.
HYDRA_MULTI = frozenset({"node_rank", "num_nodes", "nproc_per_node", "master_addr"})


@dataclass(frozen=True)
class Layout:
    launcher: str          # entry of integrations/launchers.py (availability, binary)
    shape: str             # "np4", "2x2", ...
    needs: str             # "local", "slurm1", "cluster", "slurm2"
    nranks: int
    truth: str             # rank_probe.py --truth family
    expect: str            # distenv's `launcher` field
    argv: Argv             # the launcher argv around a command
    hosts: "tuple[str, ...]"
    unknown: frozenset = frozenset()      # CHECKED fields distenv must leave None
    batch: "tuple[str, ...] | None" = None  # sbatch options: argv() is the batch script
    also: "tuple[str, ...]" = ()          # other launchers this layout needs installed
    torch: bool = False                   # the launcher itself is torchrun
    master_optional: bool = False         # master_addr: rank 0's node, or None on every rank
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.launcher}-{self.shape}"

    @property
    def multi_node(self) -> bool:
        return len(self.hosts) > 1


def one_node(name: str, n: int, *flags: str) -> Argv:
    def build(cmd, extra):
        return [*table.get(name).argv(n), *flags, *extra, *cmd]
    return build


def on_node1(*argv: str) -> Argv:
    """The launcher runs inside node1 (its host takes part, as on a real cluster)."""
    def build(cmd, extra):
        return [ON_NODE, "node1", *argv, *extra, *cmd]
    return build


def plain(*argv: str) -> Argv:
    def build(cmd, extra):
        return [*argv, *extra, *cmd]
    return build


def _torchrun_srun(cmd, extra):
    port = random.randint(29400, 29899)
    rid = f"itest-{os.getpid()}-{port}"
    return ["srun", "-N2", "--ntasks-per-node=1",
            str(REPO / ".venv" / "bin" / "torchrun"), "--nnodes", "2", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"node1:{port}", "--rdzv-id", rid,
            *extra, "--no-python", *cmd]


#: srun's arbitrary distribution with rank 0 on node2 (the sorted node list starts with node1).
ARBITRARY = ("-N2", "-n4", "--distribution=arbitrary", "-w", "node2,node1,node1,node2")
#: What SLURM's variables cannot prove in those layouts (sources/slurm.py, layout_doubt).
DOUBT = frozenset({"node_rank", "master_addr"})


def _het(mpi: str) -> Argv:
    """One heterogeneous step in an ordinary allocation: component 0 (task 0) alone on
    node2, component 1 on node1. (A heterogeneous *job*, ``srun A : B`` without salloc,
    waited 26-30 s here for the scheduler; the step starts at once.)"""
    def build(cmd, extra):
        return ["salloc", "-N2", "-n4", "srun", mpi, *extra, "-N1", "-n1", "-w", "node2", *cmd,
                ":", "-N1", "-n2", "-w", "node1", *cmd]
    return build


L = table.launchers_dir()
OMPI5 = str(L / "openmpi5" / "bin" / "mpirun")
MPICH5 = str(L / "mpich5" / "bin" / "mpiexec")
IMPI = str(L / "impi" / "bin" / "mpiexec.hydra")
ONE = (LOCALHOST,)

_layouts = [
    # ---- one node (this host) -----------------------------------------------------------
    Layout("openmpi4", "np4", "local", 4, "openmpi", "openmpi", one_node("openmpi4", 4), ONE),
    Layout("openmpi5", "np4", "local", 4, "openmpi", "openmpi", one_node("openmpi5", 4), ONE,
           note="default mapping, oversubscribed: local ranks 0,2,1,3"),
    Layout("openmpi5", "np4-map-by-node", "local", 4, "openmpi", "openmpi",
           one_node("openmpi5", 4, "--map-by", "node"), ONE),
    Layout("mpich4", "np4", "local", 4, "hydra", "mpich", one_node("mpich4", 4), ONE),
    Layout("mpich4", "np4-pmi-port", "local", 4, "hydra", "mpich",
           one_node("mpich4", 4, "-pmi-port"), ONE,
           unknown=frozenset({"world_size", "num_nodes", "node_rank", "nproc_per_node",
                              "master_addr"}),
           note="-pmi-port: no PMI_SIZE, so no world size"),
    Layout("mpich5", "np4", "local", 4, "hydra", "mpich", one_node("mpich5", 4), ONE),
    Layout("intelmpi", "np4", "local", 4, "hydra", "intelmpi", one_node("intelmpi", 4), ONE),
    # two ranks: no oversubscription (Open MPI binds), and half the torch imports for the
    # one-node rendezvous tests
    *(Layout(name, "np2", "local", 2, truth, expect, one_node(name, 2), ONE)
      for name, truth, expect in (("openmpi4", "openmpi", "openmpi"),
                                  ("openmpi5", "openmpi", "openmpi"),
                                  ("mpich4", "hydra", "mpich"), ("mpich5", "hydra", "mpich"),
                                  ("intelmpi", "hydra", "intelmpi"))),
    Layout("slurm", "srun-n4", "slurm1", 4, "slurm", "slurm", plain("srun", "-n4"), ONE),
    Layout("slurm", "srun-n2", "slurm1", 2, "slurm", "slurm", plain("srun", "-n2"), ONE),
    Layout("slurm", "srun-n4-cyclic", "slurm1", 4, "slurm", "slurm",
           plain("srun", "-n4", "-m", "cyclic"), ONE),
    Layout("torchrun", "nproc2", "local", 2, "torchrun", "torchrun",
           plain(str(REPO / ".venv" / "bin" / "torchrun"), "--nproc-per-node", "2", "--no-python"),
           ONE, torch=True),
    # ---- two nodes, MPI through the fake ssh, mpirun inside node1 -----------------------
    Layout("openmpi4", "2x2", "cluster", 4, "openmpi", "openmpi",
           on_node1(OMPI4, "--allow-run-as-root", "-np", "4", "-H", "node1:2,node2:2",
                    "--mca", "plm_rsh_agent", FAKESSH, "--mca", "oob_tcp_if_include", NET,
                    "--mca", "btl_tcp_if_include", NET),
           NODES, unknown=frozenset({"node_rank"})),
    Layout("openmpi5", "2x2", "cluster", 4, "openmpi", "openmpi",
           on_node1(OMPI5, "--allow-run-as-root", "-np", "4", "-H", "node1:2,node2:2",
                    "--map-by", "ppr:2:node", "--prtemca", "plm_ssh_agent", FAKESSH,
                    "--prtemca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET),
           NODES, unknown=frozenset({"node_rank", "num_nodes", "nproc_per_node", "master_addr"}),
           note="Open MPI 5 maps by its host list, which ranks do not see: no master (issue 13)"),
    # mpirun on a host that runs no rank (a login node): here the root namespace, host
    # name vm, which reaches the nodes over the bridge (10.213.77.1)
    Layout("openmpi4", "2x2-from-head", "cluster", 4, "openmpi", "openmpi",
           plain(OMPI4, "--allow-run-as-root", "-np", "4", "-H", "node1:2,node2:2",
                 "--mca", "plm_rsh_agent", FAKESSH, "--mca", "oob_tcp_if_include", NET,
                 "--mca", "btl_tcp_if_include", NET),
           NODES, unknown=frozenset({"node_rank"}), master_optional=True,
           note="mpirun's host (vm) runs no rank: master is node1 or unknown, never vm"),
    Layout("openmpi5", "2x2-from-head", "cluster", 4, "openmpi", "openmpi",
           plain(OMPI5, "--allow-run-as-root", "-np", "4", "-H", "node1:2,node2:2",
                 "--map-by", "ppr:2:node", "--prtemca", "plm_ssh_agent", FAKESSH,
                 "--prtemca", "oob_tcp_if_include", NET, "--mca", "btl_tcp_if_include", NET),
           NODES, unknown=frozenset({"node_rank", "num_nodes", "nproc_per_node", "master_addr"}),
           master_optional=True,
           note="mpirun's host (vm) runs no rank: master is node1 or unknown, never vm"),
    Layout("mpich4", "2x2", "cluster", 4, "hydra", "mpich",
           on_node1(MPICH4, "-np", "4", "-hosts", "node1:2,node2:2", "-launcher", "ssh",
                    "-launcher-exec", FAKESSH),
           NODES, unknown=HYDRA_MULTI),
    Layout("mpich5", "2x2", "cluster", 4, "hydra", "mpich",
           on_node1(MPICH5, "-np", "4", "-hosts", "node1:2,node2:2", "-launcher", "ssh",
                    "-launcher-exec", FAKESSH),
           NODES, unknown=HYDRA_MULTI),
    Layout("intelmpi", "2x2", "cluster", 4, "hydra", "intelmpi",
           on_node1(IMPI, "-np", "4", "-hosts", "node1,node2", "-ppn", "2", "-bootstrap", "ssh",
                    "-bootstrap-exec", FAKESSH, "-genv", "FI_PROVIDER", "tcp"),
           NODES, unknown=frozenset({"num_nodes", "nproc_per_node", "master_addr"})),
    # ---- two-node SLURM -----------------------------------------------------------------
    Layout("slurm", "N2-2x2", "slurm2", 4, "slurm", "slurm",
           plain("srun", "-N2", "-n4", "--ntasks-per-node=2"), NODES),
    Layout("slurm", "N2-n4-cyclic", "slurm2", 4, "slurm", "slurm",
           plain("srun", "-N2", "-n4", "-m", "cyclic"), NODES,
           note="node1 gets ranks 0,2,3 and node2 rank 1"),
    Layout("slurm", "N2-n3", "slurm2", 3, "slurm", "slurm", plain("srun", "-N2", "-n3"), NODES,
           note="uneven: 2 + 1"),
    Layout("slurm", "N2-2x2-pmix", "slurm2", 4, "slurm", "slurm",
           plain("srun", "--mpi=pmix", "-N2", "--ntasks-per-node=2"), NODES),
    Layout("slurm", "N2-2x2-pmi2", "slurm2", 4, "slurm", "slurm",
           plain("srun", "--mpi=pmi2", "-N2", "--ntasks-per-node=2"), NODES),
    Layout("slurm", "N2-salloc-srun", "slurm2", 4, "slurm", "slurm",
           plain("salloc", "-N2", "--ntasks-per-node=2", "srun"), NODES),
    Layout("slurm", "N2-salloc-shell", "slurm2", 1, "none", "none",
           plain("salloc", "-N2", "--ntasks-per-node=2"), ONE,
           note="the command salloc runs: on this host, one process"),
    Layout("slurm", "N2-sbatch-script", "slurm2", 1, "none", "none", plain(), ("node1",),
           batch=("-N2", "--ntasks-per-node=2"), note="the batch script itself: one process"),
    Layout("slurm", "N2-sbatch-openmpi4", "slurm2", 4, "openmpi", "openmpi",
           plain(OMPI4, "--allow-run-as-root", "-np", "4"), NODES,
           batch=("-N2", "--ntasks-per-node=2"), also=("openmpi4",),
           unknown=frozenset({"node_rank"})),
    Layout("slurm", "N2-sbatch-openmpi5", "slurm2", 4, "openmpi", "openmpi",
           plain(OMPI5, "--allow-run-as-root", "-np", "4"), NODES,
           batch=("-N2", "--ntasks-per-node=2"), also=("openmpi5",),
           unknown=frozenset({"node_rank", "num_nodes", "nproc_per_node", "master_addr"})),
    Layout("slurm", "N2-sbatch-mpich4", "slurm2", 4, "hydra", "mpich",
           plain(MPICH4, "-np", "4"), NODES, batch=("-N2", "--ntasks-per-node=2"),
           also=("mpich4",), unknown=HYDRA_MULTI),
    Layout("slurm", "N2-sbatch-intelmpi", "slurm2", 4, "hydra", "intelmpi",
           plain(IMPI, "-np", "4", "-ppn", "2", "-genv", "FI_PROVIDER", "tcp"), NODES,
           batch=("-N2", "--ntasks-per-node=2"), also=("intelmpi",),
           unknown=frozenset({"num_nodes", "nproc_per_node", "master_addr"})),
    # SLURM's other MPI plugins (issue 28): HPE Cray PALS (cray_shasta) and PMI-2, in the
    # layouts the step's variables place and in those they cannot (arbitrary, heterogeneous:
    # rank 0 on node2 while the sorted node list starts with node1).
    Layout("slurm", "N2-n4-cray", "slurm2", 4, "slurm", "slurm",
           plain("srun", "--mpi=cray_shasta", "-N2", "-n4"), NODES, note="3 + 1"),
    Layout("slurm", "N2-n4-cray-cyclic", "slurm2", 4, "slurm", "slurm",
           plain("srun", "--mpi=cray_shasta", "-N2", "-n4", "-m", "cyclic"), NODES),
    Layout("slurm", "N2-n4-cray-arbitrary", "slurm2", 4, "slurm", "slurm",
           plain("srun", "--mpi=cray_shasta", *ARBITRARY), NODES, unknown=DOUBT),
    Layout("slurm", "N2-cray-het", "slurm2", 3, "slurm", "slurm", _het("--mpi=cray_shasta"),
           NODES, unknown=DOUBT | {"nproc_per_node"}),
    Layout("slurm", "N2-n4-pmi2-arbitrary", "slurm2", 4, "slurm", "slurm",
           plain("srun", "--mpi=pmi2", *ARBITRARY), NODES, unknown=DOUBT),
    Layout("slurm", "N2-pmi2-het", "slurm2", 3, "slurm", "slurm", _het("--mpi=pmi2"),
           NODES, unknown=DOUBT | {"nproc_per_node"}),
    Layout("torchrun", "srun-N2-2x2", "slurm2", 4, "torchrun", "torchrun", _torchrun_srun,
           NODES, also=("slurm",), torch=True,
           note="srun -N2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 2, "
                "c10d rendezvous at node1"),
]
LAYOUTS: "dict[str, Layout]" = {l.name: l for l in _layouts}


def layout(launcher: str, shape: str) -> Layout:
    try:
        return LAYOUTS[f"{launcher}-{shape}"]
    except KeyError:
        raise KeyError(f"no layout {launcher}-{shape}; known: {', '.join(LAYOUTS)}") from None


def missing(lay: Layout) -> "str | None":
    """Why this layout's launchers cannot run here (None when they can)."""
    for name in (lay.launcher, *lay.also):
        entry = table.get(name)
        if not entry.available():
            how = " ".join(entry.install) or "torch==2.13.0 in the project .venv"
            return f"{name} is not installed ({entry.binary()}; install: {how})"
    if lay.batch is not None or lay.needs in ("slurm1", "slurm2"):
        for b in ("srun", "sbatch", "salloc", "scontrol"):
            if shutil.which(b) is None:
                return f"SLURM client {b} not found (install: integrations/slurm/install.sh)"
    return None


def probe_cmd(launcher_or_layout, shape: "str | None" = None) -> "list[str]":
    lay = launcher_or_layout if shape is None else layout(launcher_or_layout, shape)
    return [PY, str(PROBE), "--truth", lay.truth]


#: Resolver bugs these tests found (xfail(strict) where they show; see the tests).

# -- running -----------------------------------------------------------------------------
class LaunchError(AssertionError):
    """The launcher failed, timed out, or not every rank reported."""


def _tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _per_rank(cmd: Sequence[str], out_dir: Path) -> "list[str]":
    """Wrap `cmd` so each rank's stdout/stderr go to files of its own in `out_dir`."""
    # No "$$" or "${...}": torchrun runs its argv through string.Template (for its
    # ${local_rank} macro), which turns "$$" into "$". mktemp gives the unique name.
    script = 'd=$0; f=$(mktemp "$d/$(hostname).XXXXXX") || exit 97; exec "$@" >"$f.out" 2>"$f.err"'
    return ["/bin/sh", "-c", script, str(out_dir), *cmd]


def _sbatch(lay: Layout, argv: "list[str]", env: dict, work: Path, timeout: float):
    """Submit `argv` as a batch script; poll until the job ends. Returns (rc, chatter)."""
    script = work / "job.sh"
    script.write_text("#!/bin/bash\n" + shlex.join(argv) + "\n")
    script.chmod(0o755)
    sub = subprocess.run(["timeout", "-k", "5", "30", "sbatch", "--parsable", *lay.batch,
                          "-o", str(work / "job.out"), "-e", str(work / "job.err"),
                          "-J", f"itest-{lay.name}", str(script)],
                         env=env, cwd=work, capture_output=True, text=True, timeout=60)
    if sub.returncode != 0:
        return sub.returncode, sub.stdout + sub.stderr
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        q = subprocess.run(["scontrol", "show", "job", "-o", job], env=env,
                           capture_output=True, text=True, timeout=30)
        m = re.search(r"\bJobState=(\S+)", q.stdout)
        state = m.group(1) if m else ("GONE" if q.returncode else "?")
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "?"):
            break
        time.sleep(0.2)
    else:
        subprocess.run(["scancel", job], env=env, timeout=30)
        return 124, f"batch job {job} still {state} after {timeout} s: scancel'ed"
    chatter = "".join((work / f).read_text(errors="replace") for f in ("job.out", "job.err")
                      if (work / f).exists())
    exit_code = re.search(r"\bExitCode=(\d+):(\d+)", q.stdout)
    rc = int(exit_code.group(1)) if exit_code else (0 if state == "COMPLETED" else 1)
    return (rc if state == "COMPLETED" or rc else 1), f"job {job} {state}\n{chatter}"


def json_lines(text: str) -> "list[dict]":
    """Every line of `text` that is one JSON object (a probe's output between the launcher's)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def parse_records(text: str) -> "list[dict]":
    """Every JSON object after a DISTENV-PROBE marker (tolerates glued lines)."""
    out, dec, i = [], json.JSONDecoder(), 0
    while True:
        i = text.find(MARK, i)
        if i < 0:
            return out
        i += len(MARK)
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            continue
        out.append(obj)
        i = end


#: Every launched process inherits this variable with a token of its run, so that `reap` can
#: find what a run left behind.
RUN_TOKEN = "DISTENV_TEST_RUN"


def reap(token: str) -> "list[str]":
    """SIGKILL every process whose environment holds this run's token; their descriptions.

    A launcher killed by the hard timeout (SIGKILL after SIGTERM) cannot end its ranks: a rank
    hung at exit outlives it, holding its port (a rank 0's store on 29500), and a later test's
    job fails on EADDRINUSE. Nothing a run started may outlive it."""
    mark = f"{RUN_TOKEN}={token}".encode()
    killed = []
    for _round in range(3):
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    what = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
            except OSError:
                continue
            found.append((int(pid), what))
        if not found:
            break
        for pid, what in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{pid} {what}")
            except OSError:
                pass
        time.sleep(0.2)
    return killed


def launch(lay: Layout, cmd: Sequence[str], *, extra: Sequence[str] = (),
           env: "dict[str, str] | None" = None, timeout: float = 120, check: bool = True):
    """Run `cmd` as every rank of `lay`. Returns (rank files {name: (stdout, stderr)},
    launcher rc, launcher output, argv). `check`: raise LaunchError unless rc == 0 and
    exactly lay.nranks ranks wrote a file."""
    base = run_dir() / "itest"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=lay.name + ".", dir=base))
    os.chmod(work, 0o755)
    ranks_dir = work / "ranks"
    ranks_dir.mkdir()
    extra_env = {}
    for name in (lay.launcher, *lay.also):
        extra_env.update(table.get(name).env(os.environ))
    if lay.needs in ("slurm1", "slurm2"):
        extra_env["SLURM_CONF"] = slurm_conf(lay.needs)
    token = f"{os.getpid()}-{work.name}"
    full_env = clean_env({**extra_env, **(env or {}), RUN_TOKEN: token})
    argv = lay.argv(_per_rank(cmd, ranks_dir), extra)
    t0 = time.monotonic()
    try:
        if lay.batch is not None:
            rc, chatter = _sbatch(lay, argv, full_env, work, timeout)
        else:
            try:
                p = subprocess.run(["timeout", "-k", "5", str(int(timeout)), *argv], env=full_env,
                                   cwd=work, capture_output=True, text=True, timeout=timeout + 20,
                                   stdin=subprocess.DEVNULL)
                rc, chatter = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired as exc:
                rc, chatter = 124, f"python-side timeout: {exc}"
    finally:
        left = reap(token)
    if left:
        chatter += f"\n[harness] killed {len(left)} process(es) the launcher left running: {left}"
    elapsed = time.monotonic() - t0
    files = {}
    for f in sorted(ranks_dir.glob("*.out")):
        err = f.with_name(f.name[:-4] + ".err")
        files[f.name[:-4]] = (f.read_text(errors="replace"),
                         err.read_text(errors="replace") if err.exists() else "")
    result = {"files": files, "rc": rc, "output": chatter, "argv": argv, "work": work,
              "elapsed": elapsed}
    failed = check and (rc != 0 or len(files) != lay.nranks)
    keep = failed and os.environ.get("DISTENV_KEEP_RUNS", "") not in ("", "0")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    if failed:
        raise LaunchError(describe_failure(lay, result, kept=keep))
    return result


def placement_facts(hosts: "list[str]", rank: int) -> dict:
    """What distenv must say of `rank` when `hosts[r]` is rank r's host: nodes ordered by
    their lowest rank, and the counts and master that follow."""
    nodes = list(dict.fromkeys(hosts))
    mine = hosts[rank]
    on_node = [r for r, h in enumerate(hosts) if h == mine]
    counts = {hosts.count(n) for n in nodes}
    return {"node_rank": nodes.index(mine), "num_nodes": len(nodes), "hosts": nodes,
            "rank_hosts": hosts, "local_world_size": len(on_node),
            "local_rank": on_node.index(rank),
            "nproc_per_node": len(on_node) if len(counts) == 1 else None,
            "master_addr": hosts[0] if len(nodes) > 1 else "127.0.0.1"}


def describe_failure(lay: Layout, result: dict, kept: bool = True) -> str:
    lines = [f"{lay.name}: launcher exit {result['rc']} after {result['elapsed']:.1f} s, "
             f"{len(result['files'])} of {lay.nranks} rank(s) reported",
             f"argv: {shlex.join(map(str, result['argv']))}",
             f"launcher output:\n{_tail(result['output'])}"]
    for name, (out, err) in result["files"].items():
        lines.append(f"rank file {name}: stdout:\n{_tail(out, 1500)}\nstderr:\n{_tail(err, 1500)}")
    lines.append(f"(kept in {result['work']})" if kept else
                 "(DISTENV_KEEP_RUNS=1 keeps the launch directory of a failed run)")
    return "\n".join(lines)


def run_ranks(launcher: str, shape: str, cmd: Sequence[str], *, extra: Sequence[str] = (),
              env: "dict[str, str] | None" = None, timeout: float = 120) -> "list[dict]":
    """Run `cmd` as every rank of layout (launcher, shape) under a hard timeout and return
    one record per rank (the JSON after the DISTENV-PROBE marker), sorted by the
    launcher's own rank (``truth.rank``) or, for other commands, their ``rank``.

    `extra` goes on the launcher's command line just before the command (e.g.
    ``-genv MASTER_ADDR node1``); `env` is added to the launcher's (clean) environment.
    Raises LaunchError when the launcher fails, times out, or a rank printed no record.
    """
    lay = layout(launcher, shape)
    result = launch(lay, cmd, extra=extra, env=env, timeout=timeout)
    records = []
    for name, (out, err) in result["files"].items():
        found = parse_records(out)
        if len(found) != 1:
            raise LaunchError(f"{lay.name}: rank file {name} holds {len(found)} records\n"
                              f"stdout:\n{_tail(out)}\nstderr:\n{_tail(err)}")
        found[0]["_stderr"] = err
        records.append(found[0])

    def key(r):
        rank = (r.get("truth") or {}).get("rank", r.get("rank"))
        return (rank is None, rank if isinstance(rank, int) else 0, r.get("hostname", ""))

    return sorted(records, key=key)


# -- recording two-node fixtures (integrations/record/record_cluster.sh) ----------------------
def _version(lay: Layout) -> str:
    def first_line(argv):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                               env=clean_env({"SLURM_CONF": slurm_conf("slurm2")}))
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        text = p.stdout + p.stderr
        m = re.search(r"^\s*Version:\s*(\S+)", text, re.M)
        if m:
            return f"MPICH {m.group(1)} (Hydra)"
        return (text.strip().splitlines() or ["?"])[0].strip()

    binaries = {"openmpi4": [OMPI4, "--version"], "openmpi5": [OMPI5, "--version"],
                "mpich4": [MPICH4, "--version"], "mpich5": [MPICH5, "--version"],
                "intelmpi": [IMPI, "--version"], "slurm": ["srun", "--version"]}
    parts = []
    for name in (*lay.also, lay.launcher):
        if name == "torchrun":
            p = subprocess.run([PY, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=60)
            parts.append(f"torch {p.stdout.strip() or '?'}")
        elif name in binaries:
            parts.append(first_line(binaries[name]))
    return "; ".join(dict.fromkeys(parts))


def shown(lay: Layout, cmd: Sequence[str]) -> str:
    """The launcher command as a fixture shows it: machine paths shortened, and without
    the per-rank output wrapper (see _per_rank) that the harness puts around `cmd`."""
    argv = lay.argv(cmd, ())
    text = shlex.join(map(str, argv))
    if lay.batch is not None:
        text = f"sbatch {shlex.join(lay.batch)} --wrap {shlex.quote(text)}"
    for path, short in ((str(RECORD_ENV), "record_env.py"), (PY, "python"),
                        (str(REPO / ".venv" / "bin" / "torchrun"), "torchrun"),
                        (str(L), "$DISTENV_LAUNCHERS_DIR"), (str(REPO) + "/", "")):
        text = text.replace(path, short)
    return re.sub(r"itest-\d+-\d+", "itest-ID", re.sub(r"node1:\d{5}", "node1:PORT", text))


#: Two-node layout -> fixture name (tests/unit/test_recorded.py picks the expected launcher
#: by the name's prefix: cluster-openmpi*, cluster-srun*, cluster-sbatch-<mpi>*, ...).
FIXTURE_NAMES = {
    "openmpi4-2x2": "cluster-openmpi4-2x2",
    "openmpi5-2x2": "cluster-openmpi5-2x2",
    "mpich4-2x2": "cluster-mpich4-2x2",
    "mpich5-2x2": "cluster-mpich5-2x2",
    "intelmpi-2x2": "cluster-intelmpi-2x2",
    "openmpi4-2x2-from-head": "cluster-openmpi4-2x2-from-head",
    "openmpi5-2x2-from-head": "cluster-openmpi5-2x2-from-head",
    "slurm-N2-2x2": "cluster-srun-2x2",
    "slurm-N2-n4-cyclic": "cluster-srun-n4-cyclic",
    "slurm-N2-n3": "cluster-srun-n3",
    "slurm-N2-2x2-pmix": "cluster-srun-pmix-2x2",
    "slurm-N2-2x2-pmi2": "cluster-srun-pmi2-2x2",
    "slurm-N2-salloc-srun": "cluster-srun-in-salloc-2x2",
    "slurm-N2-salloc-shell": "cluster-salloc-shell",
    "slurm-N2-sbatch-script": "cluster-sbatch-script",
    "slurm-N2-sbatch-openmpi4": "cluster-sbatch-openmpi4-2x2",
    "slurm-N2-sbatch-openmpi5": "cluster-sbatch-openmpi5-2x2",
    "slurm-N2-sbatch-mpich4": "cluster-sbatch-mpich4-2x2",
    "slurm-N2-sbatch-intelmpi": "cluster-sbatch-intelmpi-2x2",
    "torchrun-srun-N2-2x2": "cluster-srun-torchrun-2x2",
    "slurm-N2-n4-cray": "cluster-srun-cray-n4",
    "slurm-N2-n4-cray-cyclic": "cluster-srun-cray-n4-cyclic",
    "slurm-N2-n4-cray-arbitrary": "cluster-srun-cray-n4-arbitrary",
    "slurm-N2-cray-het": "cluster-srun-cray-het",
    "slurm-N2-n4-pmi2-arbitrary": "cluster-srun-pmi2-n4-arbitrary",
    "slurm-N2-pmi2-het": "cluster-srun-pmi2-het",
}


def record(out_dir: Path, pattern: str = "*") -> int:
    """Record each two-node layout's launcher variables into out_dir/<FIXTURE_NAMES>.json."""
    done = 0
    for lay in LAYOUTS.values():
        if lay.needs not in ("cluster", "slurm2"):
            continue
        fixture = FIXTURE_NAMES[lay.name]
        if not (fnmatch.fnmatch(lay.name, pattern) or fnmatch.fnmatch(fixture, pattern)):
            continue
        why = missing(lay)
        if why:
            print(f"skip {lay.name}: {why}", file=sys.stderr)
            continue
        cmd = [PY, str(RECORD_ENV)]
        result = launch(lay, cmd, timeout=180)
        lines = []
        for name, (out, _err) in result["files"].items():
            objs = [ln for ln in out.splitlines() if ln.startswith("{")]
            lines.extend(objs)
        target = out_dir / f"{fixture}.json"
        p = subprocess.run([PY, str(COLLECT), "--layout", fixture,
                            "--cmd", shown(lay, cmd), "--version", _version(lay),
                            "--expect", str(lay.nranks), "--drop", "SLURM_CONF",
                            "--out", str(target)], input="\n".join(lines) + "\n", text=True)
        if p.returncode != 0:
            print(f"{lay.name}: collect.py failed", file=sys.stderr)
            return 1
        done += 1
        print(f"{target.name}: {lay.nranks} rank(s) in {result['elapsed']:.1f} s", file=sys.stderr)
    print(f"{done} two-node layout(s) recorded in {out_dir}", file=sys.stderr)
    return 0


def main(argv: "list[str]") -> int:
    if argv[:1] == ["list"]:
        for lay in LAYOUTS.values():
            print(f"{lay.name:28} {lay.needs:8} {lay.nranks}  {missing(lay) or 'ok'}")
        return 0
    if argv[:1] == ["record"] and len(argv) in (2, 3):
        return record(Path(argv[1]), argv[2] if len(argv) == 3 else "*")
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
