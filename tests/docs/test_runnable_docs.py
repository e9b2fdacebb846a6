"""The README's and docs' shell blocks marked runnable run as written, in a venv a pip user makes.

A block is marked by its fence's info string: ```` ```sh runnable ```` (or ``bash runnable``;
renderers highlight by the first word and ignore the rest). Each marked block runs from the
repository root (a clone), as one `bash -euo pipefail` script, under a hard timeout, in an
environment without launcher variables. Every command in it must succeed; a block whose last
command fails, or any command before it, fails the test.

Which venv. A block runs in the venv a user gets from `python -m venv venv && . venv/bin/activate
&& pip install '.[EXTRA]'`, so it says `python`, `distenv`, `torchrun`, never a path into the
setup's `.venv/` or `.venvs/`. EXTRA is the fence's ``venv=EXTRA`` (```` ```sh runnable
venv=lightning ````), else the page's name for docs/frameworks/EXTRA.md; any other page must say
it. EXTRA is one of pyproject.toml's extras, and the page shows the `pip install '.[EXTRA]'` (or
`".[EXTRA,...]"`) line that makes that venv.

How the test makes it without a download: the project's wheel is built once per session
(`pip wheel --no-deps --no-build-isolation --no-index`: hatchling comes with the `test` extra);
per EXTRA a fresh venv (`python -m venv --without-pip`, from the matching setup venv's
interpreter) gets the wheel with `pip --python <venv> install --no-deps --no-index`, and a .pth
file appends the site-packages of the setup venv that holds EXTRA's frameworks
(`SETUP_VENVS`; `bash integrations/setup.sh` builds them). The wheel's distenv comes first on
sys.path (checked: `distenv.__file__` is in the new venv, and so is the `distenv` command the
block finds on PATH); the appended directory is no site dir, so its .pth files (the setup's
editable distenv) are not read. The frameworks' console scripts (`torchrun`, ...) are copied into
the new venv with its interpreter as shebang, as pip would have written them. The block runs with
that venv's bin first on PATH (every PATH entry inside the checkout removed) and VIRTUAL_ENV set,
as after `. venv/bin/activate`. For EXTRA=deepspeed, TORCH_EXTENSIONS_DIR points at the CPU op
the setup compiled (a user's first run compiles it, docs/frameworks/deepspeed.md).

Root. Open MPI's `mpirun` refuses root; every page handles it the same way: a block that runs
`mpirun` first exports `OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1` (ROOT_LINE,
harmless for other users), and no shell block on any page passes `--allow-run-as-root`.

Mark only cheap blocks (a `distenv show`, a 2-process example): all of them together stay under
three minutes. Blocks that start daemons (SLURM), build environments or need several nodes are
left unmarked; tests elsewhere run those paths. A missing setup venv or launcher skips the block
(fails it under DISTENV_REQUIRE_LAUNCHERS=1, as in CI).
"""

import os
import re
import shutil
import stat
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = re.compile(r"^(?:sh|bash|shell)\s+runnable\b(?P<opts>[^\n`]*)$")   # the info string
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w-]*)")
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
                  "PIP_CONSTRAINT", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "TORCH_EXTENSIONS_DIR"}
# extra -> the venv integrations/setup.sh builds with that extra's frameworks.
SETUP_VENVS = {"torch": ".venv", "lightning": ".venvs/lightning",
               "pytorch-lightning": ".venvs/lightning", "transformers": ".venvs/transformers5",
               "deepspeed": ".venvs/deepspeed", "tensorflow": ".venvs/tensorflow",
               "jax": ".venvs/jax", "horovod": ".venvs/horovod"}
ROOT_LINE = "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"


def doc_files():
    files = [os.path.join(ROOT, "README.md")]
    for d, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".md")]
    return sorted(files)


def fenced_blocks(path: str):
    """[(line number of the fence, info string, code)] of every fenced block in `path`."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if m:
            fence, start, info, body = m.group("fence"), i + 1, lines[i].strip()[len(m.group("fence")):], []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"{path}:{start}: unterminated block"
            out.append((start, info.strip(), "\n".join(body)))
        i += 1
    return out


def block_extra(path: str, opts: str):
    """The extra a block's venv is made with: `venv=X` in the fence, else docs/frameworks/X.md."""
    m = re.search(r"\bvenv=([\w-]+)", opts)
    if m:
        return m.group(1)
    rel = os.path.relpath(path, ROOT)
    m = re.fullmatch(r"docs/frameworks/([\w-]+)\.md", rel)
    return m.group(1) if m else None


def runnable_blocks(path: str):
    """[(line number of the fence, code, extra)] of the blocks marked runnable in `path`."""
    out = []
    for line, info, code in fenced_blocks(path):
        m = MARK.match(info)
        if m:
            out.append((line, code, block_extra(path, m.group("opts"))))
    return out


def missing_tools(code: str) -> list:
    """The launchers a block names that are not installed."""
    return [tool for tool in ("mpirun", "srun")
            if re.search(rf"(?<![\w/.-]){tool}\b", code) and not shutil.which(tool)]


def user_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES}
    # Nothing of the checkout's venvs on PATH: a block finds only the venv it runs in.
    inside = os.path.join(ROOT, "")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not os.path.join(os.path.abspath(p), "").startswith(inside))
    return env


def venv_env(venv: str, extra: str) -> dict:
    """The environment of a shell that activated `venv`."""
    env = user_env()
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env["PATH"]
    ext = os.path.join(ROOT, SETUP_VENVS[extra], "torch-extensions")
    if extra == "deepspeed" and os.path.isdir(ext):
        env["TORCH_EXTENSIONS_DIR"] = ext   # the CPU op integrations/frameworks/deepspeed.sh built
    return env


def run_block(code: str, timeout: int = TIMEOUT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["timeout", "-k", "5", str(timeout), "bash", "-euo", "pipefail", "-c", code],
                          cwd=ROOT, env=env if env is not None else user_env(),
                          capture_output=True, text=True)


def pyproject_extras() -> set:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return set(tomllib.load(fh)["project"]["optional-dependencies"])


def install_lines_extras(path: str) -> set:
    """The extras of the page's `pip install '.[a,b]'` lines."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return {e.strip() for m in re.finditer(r"pip install [\"']?\.\[([\w,\s-]+)\]", text)
            for e in m.group(1).split(",")}


BLOCKS = [(os.path.relpath(p, ROOT), line, code, extra)
          for p in doc_files() for line, code, extra in runnable_blocks(p)]


def test_docs_mark_runnable_blocks():
    """Removing the markers must not make the test below vacuous."""
    files = {f for f, _, _, _ in BLOCKS}
    assert "README.md" in files, "the README's quick start is marked runnable"
    assert len(files) >= 4 and len(BLOCKS) >= 6, sorted(files)


def test_every_block_names_its_venv_and_its_install_line():
    extras, bad = pyproject_extras(), []
    for doc, line, code, extra in BLOCKS:
        where = f"{doc}:{line}"
        if extra is None:
            bad.append(f"{where}: no venv=EXTRA in the fence (only docs/frameworks/EXTRA.md imply it)")
            continue
        if extra not in extras or extra not in SETUP_VENVS:
            bad.append(f"{where}: venv={extra} is no extra of pyproject.toml with a setup venv")
        if extra not in install_lines_extras(os.path.join(ROOT, doc)):
            bad.append(f"{where}: the page shows no `pip install '.[{extra}]'` for the block's venv")
        if re.search(r"(?<![\w/])\.venvs?/", code):
            bad.append(f"{where}: names the setup's .venv/ or .venvs/; use the active venv's python")
    assert not bad, "\n".join(bad)


def test_root_is_handled_the_same_on_every_page():
    bad = []
    for path in doc_files():
        doc = os.path.relpath(path, ROOT)
        for line, info, code in fenced_blocks(path):
            if re.match(r"(sh|bash|shell|console)\b", info) and "--allow-run-as-root" in code:
                bad.append(f"{doc}:{line}: --allow-run-as-root (export the variables instead)")
    for doc, line, code, _ in BLOCKS:
        if re.search(r"(?<![\w/.-])mpirun\b", code):
            first = next(ln for ln in code.split("\n") if ln.strip() and not ln.startswith("#"))
            if not first.startswith(ROOT_LINE):
                bad.append(f"{doc}:{line}: runs mpirun; its first line must be `{ROOT_LINE}`")
    assert not bad, "\n".join(bad)


def commands(code: str):
    """[(command, comment)] of a shell block: continuation lines joined, whitespace collapsed,
    comment lines and `export` lines left out."""
    out, parts = [], []
    for raw in code.split("\n"):
        line = raw.strip()
        if not parts and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        text = " ".join(parts)
        parts = []
        cmd, _, comment = text.partition(" #")
        cmd = " ".join(cmd.split())
        if cmd and not cmd.startswith("export "):
            out.append((cmd, comment.strip()))
    return out


def test_zero_code_forms_run_here_or_say_what_they_need():
    """docs/zero-code.md (issue 30, item 13): a new user ran its `distenv run` block on one
    2-core machine and nothing worked (4 slots, --map-by ppr:1:node over 2 nodes, an undefined
    train.py). Every command of its unmarked shell blocks now either runs as written in one of
    its runnable blocks (test_runnable_block runs them) or says in its comment what it needs."""
    path = os.path.join(ROOT, "docs", "zero-code.md")
    runnable = {cmd for _, code, _ in runnable_blocks(path) for cmd, _ in commands(code)}
    bad = []
    for line, info, code in fenced_blocks(path):
        if MARK.match(info) or not re.match(r"(sh|bash|shell)\b", info):
            continue
        for cmd, comment in commands(code):
            if cmd not in runnable and not re.search(r"\bneeds\b", comment):
                bad.append(f"docs/zero-code.md:{line}: `{cmd}` is in no runnable block and its "
                           "comment does not say what it needs (# ... needs ...)")
    assert not bad, "\n".join(bad)
    assert any("--map-by ppr:1:node" in cmd for cmd in runnable), "the per-node form, on one machine"


def test_a_failing_block_fails(tmp_path):
    """The runner reports a failing command anywhere in a block, not only the last one."""
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```sh runnable venv=jax\nfalse\necho after\n```\n\n```sh\nnot marked\n```\n")
    blocks = runnable_blocks(str(doc))
    assert blocks == [(3, "false\necho after", "jax")]
    assert run_block(blocks[0][1], timeout=10).returncode != 0
    assert run_block("true | false | true", timeout=10).returncode != 0   # pipefail


def _skip(reason: str):
    # What integrations/setup.sh installs: CI has it (a failure there), a bare clone may not.
    if REQUIRE:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """The project's wheel, built once, offline."""
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--disable-pip-version-check", "-w", str(out), ROOT],
                       capture_output=True, text=True, timeout=300, env=user_env())
    assert p.returncode == 0, f"pip wheel failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    wheels = [n for n in os.listdir(out) if n.startswith("distenv-") and n.endswith(".whl")]
    assert len(wheels) == 1, os.listdir(out)
    return str(out / wheels[0])


def _python(venv: str, code: str) -> str:
    p = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], capture_output=True,
                       text=True, timeout=120, cwd="/", env=venv_env(venv, "torch"))
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def make_venv(extra: str, wheel: str, where: str) -> str:
    """A venv with the wheel installed and the setup venv's frameworks (see the module doc)."""
    base = os.path.join(ROOT, SETUP_VENVS[extra])
    venv = os.path.join(where, f"venv-{extra}")
    subprocess.run([os.path.join(base, "bin", "python"), "-m", "venv", "--without-pip", venv],
                   check=True, timeout=120, env=user_env())
    p = subprocess.run([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"),
                        "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check", wheel],
                       capture_output=True, text=True, timeout=300, env=user_env())
    assert p.returncode == 0, f"installing the wheel failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    paths = "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])"
    site = _python(venv, paths).split("\n")[0]
    base_sites = dict.fromkeys(_python(base, paths).split("\n"))
    with open(os.path.join(site, "zz_docs_test_frameworks.pth"), "w") as f:
        f.write("".join(s + "\n" for s in base_sites))
    # The frameworks' console scripts, as pip writes them into the venv it installs into.
    shebang = re.compile(rb"^#!" + re.escape(os.path.join(base, "bin", "python").encode()) + rb"[\d.]*\n")
    for name in sorted(os.listdir(os.path.join(base, "bin"))):
        src, dst = os.path.join(base, "bin", name), os.path.join(venv, "bin", name)
        if name.startswith("pip") or os.path.lexists(dst) or not os.path.isfile(src):
            continue
        with open(src, "rb") as f:
            text = f.read()
        if shebang.match(text):
            with open(dst, "wb") as f:
                f.write(shebang.sub(b"#!" + os.path.join(venv, "bin", "python").encode() + b"\n", text, 1))
            os.chmod(dst, os.stat(dst).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    # The wheel's distenv, not the checkout's nor the setup venv's editable install.
    found = _python(venv, "import distenv, shutil; print(distenv.__file__); print(shutil.which('distenv'))")
    module, command = found.split("\n")
    assert module.startswith(os.path.join(site, "distenv", "")), module
    assert command == os.path.join(venv, "bin", "distenv"), command
    with open(command) as f:
        assert f.readline().strip() == "#!" + os.path.join(venv, "bin", "python")
    return venv


@pytest.fixture(scope="session")
def venv_for(wheel, tmp_path_factory):
    """extra -> a wheel-installed venv with that extra's frameworks, made on first use."""
    made, where = {}, str(tmp_path_factory.mktemp("venvs"))

    def get(extra: str) -> str:
        if extra not in made:
            made[extra] = make_venv(extra, wheel, where)
        return made[extra]
    return get


@pytest.mark.parametrize("doc,line,code,extra", BLOCKS, ids=[f"{f}:{n}" for f, n, _, _ in BLOCKS])
def test_runnable_block(doc, line, code, extra, venv_for):
    assert extra in SETUP_VENVS, f"{doc}:{line}: no venv (test_every_block_names_its_venv...)"
    needs = missing_tools(code)
    base = os.path.join(SETUP_VENVS[extra], "bin", "python")
    if not os.path.exists(os.path.join(ROOT, base)):
        needs.insert(0, base)
    if needs:
        _skip(f"{doc}:{line} needs {', '.join(needs)} (bash integrations/setup.sh)")
    venv = venv_for(extra)
    t0 = time.monotonic()
    p = run_block(code, env=venv_env(venv, extra))
    took = time.monotonic() - t0
    assert p.returncode == 0, (
        f"{doc}:{line}: block exited {p.returncode} after {took:.0f} s in a venv with "
        f"'.[{extra}]'{' (timeout)' if p.returncode in (124, 137) else ''}\n--- block\n{code}\n"
        f"--- stdout\n{p.stdout[-2000:]}\n--- stderr\n{p.stderr[-3000:]}")
