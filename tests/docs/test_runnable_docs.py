"""The README's and docs' shell blocks marked runnable run as written.

A block is marked by its fence's info string: ```` ```sh runnable ```` (or ``bash runnable``;
renderers highlight by the first word and ignore the rest). Each marked block runs from the
repository root, as one `bash -euo pipefail` script, under a hard timeout, in an environment
without launcher variables -- a user's shell after `bash integrations/setup.sh`. Every command
in it must succeed; a block whose last command fails, or any command before it, fails the test.

Mark only cheap blocks (a `distenv show`, a 2-process example): all of them together stay under
two minutes. Blocks that start daemons (SLURM), build environments or need several nodes are
left unmarked; tests elsewhere run those paths.
"""

import os
import re
import shutil
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = re.compile(r"^(?P<fence>```+|~~~+)\s*(?:sh|bash|shell)\s+runnable\b(?P<opts>[^\n`]*)$")
REQUIRE = os.environ.get("DISTENV_REQUIRE_LAUNCHERS", "").strip() not in ("", "0")
# Seconds per block, hard (timeout -k). A block takes 10-50 s on 2 idle cores; the margin is for
# the same 2 cores shared with other jobs (measured: 3x slower at load average 30).
TIMEOUT = 240
# What a launcher or an outer tool would have set: a user's shell has none of it.
LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "PRTE_", "HYDRA_", "I_MPI_", "MPI_LOCAL", "SLURM_",
                     "SLURMD_", "TORCHELASTIC_", "DISTENV_", "SM_", "AZ_", "AZUREML_", "PET_",
                     "KUBEFLOW_", "HOROVOD_", "FLUX_", "LSB_", "JSM_", "PALS_", "PBS_")
LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                  "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG", "CLUSTER_SPEC",
                  "PIP_CONSTRAINT"}


def doc_files():
    files = [os.path.join(ROOT, "README.md")]
    for d, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".md")]
    return sorted(files)


def runnable_blocks(path: str):
    """[(line number of the fence, code)] of the blocks marked runnable in `path`."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if m:
            fence, start, body = m.group("fence"), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"{path}:{start}: unterminated runnable block"
            out.append((start, "\n".join(body)))
        i += 1
    return out


def missing_tools(code: str) -> list:
    """The setup-made interpreters and launchers a block names that are not there."""
    paths = set(re.findall(r"(?<![\w/])\.venvs?/(?:[\w.-]+/)?bin/[\w.-]+", code))
    out = sorted(p for p in paths if not os.path.exists(os.path.join(ROOT, p)))
    for tool in ("mpirun", "srun"):
        if re.search(rf"(?<![\w/.-]){tool}\b", code) and not shutil.which(tool):
            out.append(tool)
    return out


def user_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES}


def run_block(code: str, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(["timeout", "-k", "5", str(timeout), "bash", "-euo", "pipefail", "-c", code],
                          cwd=ROOT, env=user_env(), capture_output=True, text=True)


BLOCKS = [(os.path.relpath(p, ROOT), line, code) for p in doc_files() for line, code in runnable_blocks(p)]


def test_docs_mark_runnable_blocks():
    """Removing the markers must not make the test below vacuous."""
    files = {f for f, _, _ in BLOCKS}
    assert "README.md" in files, "the README's quick start is marked runnable"
    assert len(files) >= 4 and len(BLOCKS) >= 6, sorted(files)


def test_a_failing_block_fails(tmp_path):
    """The runner reports a failing command anywhere in a block, not only the last one."""
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```sh runnable\nfalse\necho after\n```\n\n```sh\nnot marked\n```\n")
    blocks = runnable_blocks(str(doc))
    assert blocks == [(3, "false\necho after")]
    assert run_block(blocks[0][1], timeout=10).returncode != 0
    assert run_block("true | false | true", timeout=10).returncode != 0   # pipefail


@pytest.mark.parametrize("doc,line,code", BLOCKS, ids=[f"{f}:{n}" for f, n, _ in BLOCKS])
def test_runnable_block(doc, line, code):
    needs = missing_tools(code)
    if needs:
        # What integrations/setup.sh installs: CI has it (a failure there), a bare clone may not.
        reason = f"{doc}:{line} needs {', '.join(needs)} (bash integrations/setup.sh)"
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    t0 = time.monotonic()
    p = run_block(code)
    took = time.monotonic() - t0
    assert p.returncode == 0, (
        f"{doc}:{line}: block exited {p.returncode} after {took:.0f} s"
        f"{' (timeout)' if p.returncode in (124, 137) else ''}\n--- block\n{code}\n"
        f"--- stdout\n{p.stdout[-2000:]}\n--- stderr\n{p.stderr[-3000:]}")
