"""`distenv doctor [--json] [--probe]`: is this launch set up right, and what to change.

Reads the environment and a few files (``/sys/class/infiniband``, ``/proc/net/dev``,
``/proc/net/route``, ``/etc/hosts``; paths are attributes of `distenv.doctor.system` so tests
can point them elsewhere) and reports findings, each with a level (error, warning, info, ok), a
topic (launch, map, gpus, cpu, network, auto, probe) and the fix:

* launch: the launcher and where each field came from, the resolver's notes, what a
  distributed job would miss (rank 0's address across nodes, a port shared by all jobs);
* map (rank 0's report): one row per node, as `distenv show --map` prints it
  (`distenv.nodemap`); where the environment does not place the ranks, every rank first asks
  the launcher's service (PMIx, Hydra's PMI-1: collective, so every rank runs the doctor); a
  contradiction is an error;
* gpus: visible GPUs against the processes on this node;
* cpu: threads x local processes against the cores this process may use (OMP_NUM_THREADS,
  CPU affinity set by the launcher);
* network: RDMA devices against NCCL_IB_DISABLE / NCCL_IB_HCA / UCX_*, NCCL_SOCKET_IFNAME and
  GLOO_SOCKET_IFNAME against the interfaces here, the interface that reaches rank 0, this
  host's name in /etc/hosts (gloo binds to what it resolves to);
* auto (with DISTENV_AUTO set): whether the `python` on PATH starts distenv;
* probe (only with ``--probe``, the only part that opens a socket): rank 0's address and
  port, with a short timeout.

It also reports versions (`versions`): distenv, Python, the frameworks installed for this
interpreter (from their metadata: nothing is imported) and the launcher's own, from what its
Source declares: a variable (Open MPI's ``OMPI_VERSION``), its Python distribution, or its ``--version`` (the one process the doctor starts, under
a short timeout: preferably the launcher binary that started this process, found among its
ancestors in /proc, else the command on PATH, labelled so).

Values of secret-looking variables never appear (`distenv.core.redact`); long values are
shortened as `distenv show` does (`distenv.display.shorten`); findings are printed whole up to
2000 characters, a longer one says where the whole text is (`distenv.display.clip`). Exit status: 2 when the
environment cannot be resolved (as every command), 1 when a finding is an error, else 0.

One module per concern; this one runs them (`diagnose`, `main`) and re-exports their public
names:

* `system`: the small readers of /sys, /proc and /etc/hosts (no sockets);
* `checks`: the launch, map, GPU and CPU checks;
* `network`: the network check and the probe;
* `autocheck`: the DISTENV_AUTO check (which `python` on PATH starts distenv);
* `versioninfo`: the package and launcher versions;
* `report`: `Report`, the levels, and the report's forms (`render`, `summary`, `exit_code`).

A test that points the doctor elsewhere patches the module that holds the name
(``distenv.doctor.system.NET_DEV``, ``distenv.doctor.versioninfo.VERSION_TIMEOUT``): the copies
re-exported here are for reading.
"""

from __future__ import annotations

import os

from ..errors import DistEnvError, split_fix
from ..core.redact import redact_environ, redact_text
from .autocheck import AUTO_PTH, _check_auto, site_dirs
from .checks import _check_cpu, _check_gpus, _check_knobs, _check_launch, _check_map
from .network import _check_network, _probe
from .report import LEVELS, SHOWN_NAMES, SHOWN_PREFIXES, Report, exit_code, render, summary
from .system import HOSTS_FILE, INFINIBAND_DIR, NET_DEV, NET_ROUTE, hosts_lookup, interfaces, \
    rdma_devices, route_interface
from .versioninfo import PACKAGES, VERSION_TIMEOUT, launcher_version, versions
from .versioninfo import _first_version_line as _first_version_line

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import Any

    from ..core.description import DistEnv

__all__ = [
    "AUTO_PTH", "HOSTS_FILE", "INFINIBAND_DIR", "LEVELS",
    "NET_DEV", "NET_ROUTE", "PACKAGES", "Report", "SHOWN_NAMES", "SHOWN_PREFIXES", "VERSION_TIMEOUT",
    "diagnose", "exit_code", "hosts_lookup", "interfaces", "launcher_version", "main",
    "rdma_devices", "render", "route_interface", "site_dirs", "summary", "versions",
]


def diagnose(environ: "Mapping[str, str] | None" = None, probe: bool = False, timeout: float = 2.0,
             versions: bool = False) -> "dict[str, Any]":
    """The report as a dict (what ``--json`` prints); with `versions`, the ``versions``
    section too (`versions()`: may start the launcher's ``--version``)."""
    return _diagnose(environ, probe, timeout, versions)[1]


def _diagnose(environ: "Mapping[str, str] | None", probe: bool, timeout: float, with_versions: bool,
              discover: bool = False) -> "tuple[DistEnv | None, dict[str, Any]]":
    """(the resolved DistEnv or None, the report). `discover`: the map asks the launcher's
    service where the environment does not place the ranks (collective: every rank)."""
    from ..core.resolver import resolve

    environ = dict(os.environ if environ is None else environ)
    rep = Report()
    out: "dict[str, Any]" = {"launch": None, "provenance": None, "notes": [], "error": None}
    env = None
    try:
        env = resolve(environ)
    except DistEnvError as exc:
        message = redact_text(" ".join(str(exc).split()))
        out["error"] = message
        problem, fix = split_fix(message)
        rep.add("error", "launch", problem, fix or "correct or unset the variable it names "
                "(distenv show --explain, once it resolves, shows where each field came from)")
    _check_knobs(rep, environ)
    if with_versions:
        out["versions"] = versions(env, environ)
    if env is not None:
        out["launch"] = env.to_dict()
        if out["launch"]["master_addr"] is not None:
            out["launch"]["master_addr"] = redact_text(out["launch"]["master_addr"])
        for key in ("job_id", "launcher", "platform"):
            if isinstance(out["launch"].get(key), str):
                out["launch"][key] = redact_text(out["launch"][key])
        if out["launch"].get("hosts"):
            out["launch"]["hosts"] = [redact_text(h) for h in out["launch"]["hosts"]]
        out["provenance"] = {k: redact_text(v) for k, v in env.provenance.items()}
        out["notes"] = [redact_text(n) for n in env.notes]
        _check_launch(rep, env, environ)
        _check_map(rep, out, env, discover)
        out["gpus"] = _check_gpus(rep, env, environ)
    # CPU and network checks stand without a resolved launch (they matter most then).
    out["cpu"] = _check_cpu(rep, env, environ)
    out["network"] = _check_network(rep, env, environ)
    auto = _check_auto(rep, environ)
    if auto is not None:
        out["auto"] = auto
    if probe and env is not None:
        out["probe"] = _probe(rep, env, timeout)
    rank = {level: i for i, level in enumerate(LEVELS)}
    out["findings"] = sorted(rep.findings, key=lambda f: rank[f["level"]])
    out["environment"] = redact_environ(environ, [
        k for k in sorted(environ) if k in SHOWN_NAMES or k.startswith(SHOWN_PREFIXES)])
    out["status"] = "error" if any(f["level"] == "error" for f in rep.findings) else \
        "warning" if any(f["level"] == "warning" for f in rep.findings) else "ok"
    return env, out


def main(args: argparse.Namespace) -> int:
    """`distenv doctor`: every rank checks; the ranks chosen by --ranks (default one per
    node) print the report. A rank not chosen still prints its one-line summary when its
    check fails: an error is never hidden."""
    import json

    from .. import display

    env, report = _diagnose(None, args.probe, args.timeout, False, discover=True)
    code = exit_code(report)
    summary_only = getattr(args, "summary", False)
    if not display.chosen(env, args.ranks):
        if code == 0:
            return 0
        summary_only = True
    if args.json:
        report["versions"] = versions(env)
        text = json.dumps(report, sort_keys=False)
    elif summary_only:
        text = f"{display.rank_label(env)} on {os.uname().nodename}: {summary(report)}"
    else:
        report["versions"] = versions(env)
        text = render(report)
    display.write(text, display.label(args.prefix, env, machine=args.json or summary_only))
    return code
