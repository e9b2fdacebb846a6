"""Shared by test_tensorflow_e2e.py and test_horovod_e2e.py: interpreters, 2-worker layouts,
and launching a script through tests/integration/harness.py (clean launcher environment,
per-rank output files, `timeout -k 5 N` around every run).

Ranks run the framework's interpreter: $DISTENV_PY_TENSORFLOW / $DISTENV_PY_HOROVOD (tox
sets them) or .venvs/<name>/bin/python (integrations/frameworks/<name>.sh).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

import harness  # noqa: E402
from harness import FAKESSH, NET, NODES, OMPI4, ONE, Layout, on_node1, one_node, plain  # noqa: E402

EXAMPLES = REPO / "examples"
TORCHRUN = str(REPO / ".venv" / "bin" / "torchrun")
REQUIRE = os.environ.get("DISTENV_REQUIRE_LAUNCHERS", "").strip() not in ("", "0")
#: Seconds for one multi-process run (TensorFlow's import alone can take a minute here).
TIMEOUT = float(os.environ.get("DISTENV_E2E_TIMEOUT", "300"))


def skip(reason: str):
    """Skip with the reason; under CI (DISTENV_REQUIRE_LAUNCHERS=1) fail instead."""
    if REQUIRE:
        pytest.fail(f"DISTENV_REQUIRE_LAUNCHERS=1 makes this skip a failure: {reason}")
    pytest.skip(reason)


def integration_fixtures():
    """tests/integration's session fixtures (root, slurm1, cluster, slurm2), loaded once."""
    name = "distenv_integration_conftest"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "integration" / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def venv_python(name: str, modules) -> str:
    """The framework's interpreter, checked to import `modules`; skip with how to make it."""
    var = f"DISTENV_PY_{name.upper()}"
    py = os.environ.get(var) or str(REPO / ".venvs" / name / "bin" / "python")
    how = f"bash integrations/frameworks/{name}.sh, or set {var}"
    if not os.access(py, os.X_OK):
        skip(f"no {name} interpreter ({py} missing): {how}")
    code = "import " + ", ".join(modules)
    p = subprocess.run(["timeout", "-k", "5", "170", py, "-c", code], capture_output=True, text=True,
                       timeout=180, env=harness.clean_env({"TF_CPP_MIN_LOG_LEVEL": "3"}), cwd="/")
    if p.returncode != 0:
        skip(f"{py} cannot `{code}`: {p.stderr.strip()[-400:]} ({how})")
    return py


def layout(name: str) -> Layout:
    """Two workers. openmpi4 (this host), openmpi4-2nodes and mpich4-2nodes (node1 + node2
    through the fake ssh), slurm (one-node srun), slurm-2nodes (srun -N2), torchrun (--standalone)."""
    if name == "openmpi4":
        return Layout("openmpi4", "np2", "local", 2, "openmpi", "openmpi", one_node("openmpi4", 2), ONE)
    if name == "openmpi4-2nodes":
        return Layout("openmpi4", "1x2-nodes", "cluster", 2, "openmpi", "openmpi",
                      on_node1(OMPI4, "--allow-run-as-root", "-np", "2", "-H", "node1:1,node2:1",
                               "--mca", "plm_rsh_agent", FAKESSH, "--mca", "oob_tcp_if_include", NET,
                               "--mca", "btl_tcp_if_include", NET), NODES)
    if name == "mpich4-2nodes":  # Hydra's variables place no rank: its PMI-1 service does
        return Layout("mpich4", "1x2-nodes", "cluster", 2, "hydra", "mpich",
                      on_node1(harness.MPICH4, "-np", "2", "-hosts", "node1:1,node2:1", "-launcher", "ssh",
                               "-launcher-exec", FAKESSH), NODES)
    if name == "slurm":
        return Layout("slurm", "srun-n2", "slurm1", 2, "slurm", "slurm", plain("srun", "-n2"), ONE)
    if name == "slurm-2nodes":
        return Layout("slurm", "srun-N2", "slurm2", 2, "slurm", "slurm",
                      plain("srun", "-N2", "--ntasks-per-node=1"), NODES)
    if name == "torchrun":
        return Layout("torchrun", "nproc2", "local", 2, "torchrun", "torchrun",
                      plain(TORCHRUN, "--standalone", "--nproc-per-node", "2", "--no-python"), ONE,
                      torch=True)
    raise KeyError(name)


def need(request, lay: Layout) -> None:
    """Bring up what the layout needs (session fixtures); skip with the reason if it cannot."""
    if lay.launcher == "torchrun":
        if not os.access(TORCHRUN, os.X_OK):
            skip(f"torchrun not found at {TORCHRUN} (the project venv: bash integrations/setup.sh)")
    else:
        why = harness.missing(lay)
        if why:
            skip(f"{lay.name}: {why}")
    if lay.needs != "local":
        try:
            request.getfixturevalue(lay.needs)
        except pytest.skip.Exception as exc:
            skip(f"{lay.name} needs {lay.needs}: {exc}")


@dataclass
class Run:
    name: str
    rc: int
    records: list
    files: dict
    output: str
    elapsed: float
    argv: list

    def explain(self) -> str:
        lines = [f"{self.name}: exit {self.rc} after {self.elapsed:.1f} s, {len(self.records)} record(s)",
                 f"argv: {' '.join(map(str, self.argv))}", f"launcher output: {self.output[-2000:]}"]
        for fname, (out, err) in self.files.items():
            lines.append(f"--- {fname} stdout:\n{out[-1500:]}\n--- stderr:\n{err[-3000:]}")
        return "\n".join(lines)


def records(text: str, marker: str) -> list:
    out = []
    for line in text.splitlines():
        i = line.find(marker + " ")
        if i >= 0:
            try:
                out.append(json.loads(line[i + len(marker) + 1:]))
            except ValueError:
                pass
    return out


def launch(lay: Layout, cmd, marker: str, env: dict, timeout: float = TIMEOUT) -> Run:
    """Run `cmd` as every rank of `lay`; `env` reaches every rank (mpirun -x across nodes)."""
    extra = []
    if lay.multi_node and lay.launcher.startswith("openmpi"):  # ssh'ed ranks get only -x vars
        for var in env:
            extra += ["-x", var]
    result = harness.launch(lay, [str(c) for c in cmd], extra=extra, env=env, timeout=timeout, check=False)
    found = []
    for _name, (out, _err) in sorted(result["files"].items()):
        found.extend(records(out, marker))
    found.sort(key=lambda r: r.get("worker", r.get("rank", 0)))
    return Run(lay.name, result["rc"], found, result["files"], result["output"], result["elapsed"],
               result["argv"])
