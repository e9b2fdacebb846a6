"""Mutation fuzzing of REAL launch environments.

The seeds are every rank of every recording in tests/fixtures/launchers/*.json (what Open MPI
4/5, MPICH 4/5, Intel MPI, SLURM and torchrun really set, one node and two) and every
documented platform environment in tests/fixtures/platforms/*.json (Azure ML, GCP, Vertex,
SageMaker, Kubeflow, TF_CONFIG). Each case takes one seed and applies 1-4 mutations, aimed
4 times in 5 at the variables resolve() really reads in that seed:
garbage, huge and negative numbers, empty and blank strings, unicode digits and control
characters, truncated or deeply nested JSON, absurd host lists, dropped variables, values
swapped between variables, a stale value from another rank, and mixes of two recordings.

For each: ``resolve()`` returns a `DistEnv` that satisfies the invariants or raises
`DistEnvError` with a one-line message of bounded length; nothing else escapes and no case
takes longer than PER_EXAMPLE_SECONDS (a hang is interrupted after HANG_SECONDS). A failure
is reported with the seed, the case number and the mutations shrunk to the fewest that
still fail. A sample goes through the real command line in a subprocess (``python -m
distenv show --json``): exit 0 with the JSON contract, or exit 2 with one line on stderr.

The cases are pseudo-random from DISTENV_FUZZ_SEED (default 9: the same cases on every run;
``random`` for a new one, printed). Sizes: DISTENV_FUZZ_EXAMPLES (default 20000 cases, about
8 s) and DISTENV_FUZZ_CLI (default 40 subprocesses). Nightly (100000 cases take ~25 s here):

    DISTENV_FUZZ_EXAMPLES=100000 DISTENV_FUZZ_CLI=1000 DISTENV_FUZZ_SEED=random \\
        .venv/bin/python -m pytest tests/unit/test_properties.py tests/reliability/test_fuzz_recorded.py
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from distenv import DistEnvError, resolve
from distenv.core.description import FIELDS
from distenv.sources import names as source_names

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

EXAMPLES = int(os.environ.get("DISTENV_FUZZ_EXAMPLES", "20000"))
CLI_EXAMPLES = int(os.environ.get("DISTENV_FUZZ_CLI", "40"))
#: No single resolve() may take longer (measured resolve is ~0.1 ms; this is for a loaded CI
#: box). A hang is interrupted by SIGALRM after HANG_SECONDS.
PER_EXAMPLE_SECONDS = float(os.environ.get("DISTENV_FUZZ_PER_EXAMPLE", "2"))
HANG_SECONDS = 10


# -- seeds ---------------------------------------------------------------------------------
def _load_seeds():
    seeds = []
    for path in sorted(glob.glob(os.path.join(FIXTURES, "launchers", "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        for i, rank in enumerate(doc["ranks"]):
            seeds.append((f"launchers/{os.path.basename(path)}#{i}", dict(rank["env"])))
    for path in sorted(glob.glob(os.path.join(FIXTURES, "platforms", "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        seeds.append((f"platforms/{os.path.basename(path)}", dict(doc["env"])))
    return seeds


SEEDS = _load_seeds()
SEED_NAMES = [name for name, _ in SEEDS]
#: Variables worth mutating: everything the seeds set, plus what distenv reads on top.
EXTRA_VARS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "DISTENV_LAUNCHER", "DISTENV_NPROC_PER_NODE",
              "CUDA_VISIBLE_DEVICES", "TF_CONFIG", "CLUSTER_SPEC", "SM_HOSTS", "SM_CURRENT_HOST",
              "AZ_BATCH_MASTER_NODE", "AZ_BATCH_HOST_LIST", "PET_NNODES", "PET_NPROC_PER_NODE"]


class _Recorder:
    """A mapping that remembers which variables resolve() read."""

    def __init__(self, env):
        self.env, self.read = env, set()

    def __getitem__(self, key):
        self.read.add(key)
        return self.env[key]

    def __iter__(self):
        return iter(self.env)

    def __len__(self):
        return len(self.env)

    def __contains__(self, key):
        return key in self.env

    def get(self, key, default=None):
        if key in self.env:
            self.read.add(key)
        return self.env.get(key, default)

    def keys(self):
        return self.env.keys()


def _read_by(env):
    import distenv.core.gpus

    rec = _Recorder(env)
    old, distenv.core.gpus.NVIDIA_DIR = distenv.core.gpus.NVIDIA_DIR, "/nonexistent/distenv-fuzz"
    try:
        resolve(rec)
    except DistEnvError:
        pass
    finally:
        distenv.core.gpus.NVIDIA_DIR = old
    return sorted(rec.read)


#: The variables resolve() really reads in each seed: mutations aim there most of the time.
READ = [_read_by(env) for _, env in SEEDS]


def test_seeds_are_loaded():
    launchers = [n for n in SEED_NAMES if n.startswith("launchers/")]
    platforms = [n for n in SEED_NAMES if n.startswith("platforms/")]
    assert len(launchers) >= 40 and len(platforms) >= 20, (len(launchers), len(platforms))


def _recordings():
    for path in sorted(glob.glob(os.path.join(FIXTURES, "launchers", "*.json"))):
        with open(path) as f:
            yield os.path.basename(path), json.load(f)


#: Recordings whose environment does not carry the world size (checked to stay None, not guessed).
NO_WORLD_SIZE = {"mpich4-np2-pmi-port.json": "Hydra's -pmi-port: the size comes over the PMI wire"}


def test_every_seed_resolves_unmutated(no_gpus_session):
    """The recordings themselves are sane inputs: each resolves (no DistEnvError: they are real
    launches), satisfies the invariants, and agrees with what the launcher itself said: the rank is
    the recording's own rank variable, the world size the number of ranks it started, and the
    ranks that shared a host hold distinct local ranks below that host's count."""
    failures = []
    for name, env in SEEDS:
        try:
            check_invariants(resolve(env))
        except (DistEnvError, AssertionError) as exc:
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    for base, doc in _recordings():
        per_host = {}
        for i, rank in enumerate(doc["ranks"]):
            try:
                d = resolve(rank["env"])
            except DistEnvError:
                continue  # reported above
            where = f"launchers/{base}#{i}"
            var = doc["rank_var"]
            if var and var in rank["env"]:
                if d.rank != int(rank["env"][var]):
                    failures.append(f"{where}: rank {d.rank}, the launcher's {var}={rank['env'][var]}")
            elif d.rank != 0:  # not started by a launcher: the one process of a world of one
                failures.append(f"{where}: rank {d.rank} without a launcher rank variable")
            want = None if base in NO_WORLD_SIZE else len(doc["ranks"])
            if d.world_size != want:
                failures.append(f"{where}: world_size {d.world_size}, the recording started {want}")
            per_host.setdefault(rank["hostname"], []).append((where, d.local_rank, d.local_world_size))
        for host, got in per_host.items():
            locals_ = sorted(lr for _, lr, _ in got)
            if locals_ != list(range(len(got))):
                failures.append(f"{base}: local ranks on {host} {locals_}, {len(got)} ranks there")
            for where, _, lws in got:
                if lws not in (None, len(got)):
                    failures.append(f"{where}: local_world_size {lws}, {len(got)} ranks on {host}")
    assert not failures, "\n".join(failures)


# -- mutations -----------------------------------------------------------------------------
HUGE = ["2147483648", "2147483647", "4294967296", "9223372036854775808", "1" * 30, "1e9",
        "99999999999999999999999999999999999999", str(10 ** 300)]
NEGATIVE = ["-1", "-0", "-2147483648", "-99999999999", "- 1", "−1"]
BLANK = ["", " ", "\t", "  \n "]
UNICODE = ["١", "٣", "１", "²", "Ⅳ", "𝟙", "1\u200b", "\u200e1", "\ufeff0", "0\u0301", "\u00a01",
           "nœud1", "ノード", "🙂", "\u2028", "a\u0000b", "\udcff", "\x1b[31mred", "1\n2", "1\r",
           "\x7f", "é" * 200]
GARBAGE = ["x", "None", "null", "nan", "inf", "true", "[]", "{}", "0x10", "0o7", "0b1", "1_000",
           "+1", "1.0", "1e3", " 1 ", "01", "00", "1,2", "1;2", "1(x2)", "2(x0)", "(x2)",
           "1(x-1)", "3(x99999999999)", ":", "::", "h:", ":1", "h:0", "h:65536", "h:-1",
           "[::1]:80", "tcp://", ";", "2079588352.0;", "x.0;tcp://:1", "@0.0", "prterun-@",
           "%s%n", "{0}", "${HOME}", "$(reboot)", "`id`", "A" * 5000]
HOSTLISTS = ["n[1-1000000000]", "n[0-99999999999999]", "n[1-3", "n1-3]", "n[3-1]", "n[a-z]",
             "n[1-2]x[1-2]y[1-2]z[1-2]", "n[" + ",".join(str(i) for i in range(3000)) + "]",
             "[1-2]", ",,,", "n[01-10000000]", "n[1-2],n[1-2]", "n[-1-2]", "n[1--2]",
             "n[00000000000000000001-2]", "a" * 300 + "[1-2]"]
JSONISH = ['{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 5}}',
           '{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}',
           '{"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": "0"}}',
           '{"cluster": {}, "task": {}}', '{"cluster": null}', '["algo-1", "algo-1"]',
           '["algo-1", 2, null]', '"algo-1"', "[" * 100000 + "]" * 100000, "[" * 50000,
           '{"a": ' * 3000 + "1" + "}" * 3000, '{"cluster": {"worker": [' + '"h:1",' * 20000 +
           '"h:1"]}, "task": {"type": "worker", "index": 19999}}', "\x00{}", '{"k": NaN}']
POOLS = (HUGE, NEGATIVE, BLANK, UNICODE, GARBAGE, HOSTLISTS, JSONISH)


Op = tuple  # ("set", var, value) | ("drop", var) | ("update", {var: value}, over)


def _edit(rng, old):
    """Edit a real value, keeping the launcher's shape (jobid.vpid;tcp://..., n[1-2], 2(x2))."""
    at = rng.randint(0, len(old))
    how = rng.choice(["digit", "grow", "repeat", "char", "minus"])
    if how == "digit":
        return old[:at] + rng.choice(["²", "٣", "１", "𝟗", "\u0660", "⁹"]) + old[at + 1:]
    if how == "grow":
        return old[:at] + "9" * rng.choice([1, 5, 12, 30, 5000]) + old[at:]
    if how == "repeat":
        return (old * rng.choice([2, 3, 1000]))[:20000]
    if how == "char":
        return old[:at] + rng.choice(",;:.@[]()x-+ \n\x00") + old[at + 1:]
    return "-" + old


def _random_text(rng):
    alphabet = "0123456789,;:.@[]()-x n\x00\n²٣é🙂{}\"'"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))


def mutations(rng, index):
    """1-4 replayable operations on seed `index`, aimed (4 times in 5) at variables resolve()
    reads in that seed."""
    env = dict(SEEDS[index][1])
    ops = []
    for _ in range(rng.randint(1, 4)):
        keys = sorted(env)
        read = [k for k in READ[index] if k in env]

        def pick():
            if read and rng.random() < 0.8:
                return rng.choice(read)
            return rng.choice(keys or EXTRA_VARS)

        kind = rng.choice(["value", "value", "edit", "edit", "edit", "int", "drop", "drop_many",
                           "swap", "other_seed", "mix", "mix_partial", "extra", "truncate"])
        if kind == "value":
            pool = rng.choice(POOLS + ("text",))
            op = ("set", pick(), _random_text(rng) if pool == "text" else rng.choice(pool))
        elif kind == "edit":
            var = pick()
            op = ("set", var, _edit(rng, env.get(var, "0")))
        elif kind == "int":
            op = ("set", pick(), str(rng.choice([rng.randint(-10, 10), rng.randint(-2 ** 70, 2 ** 70)])))
        elif kind == "drop" and keys:
            op = ("drop", pick())
        elif kind == "drop_many" and keys:
            op = ("update", {}, tuple(rng.sample(keys, rng.randint(1, max(1, len(keys) // 2)))))
        elif kind == "swap" and len(keys) > 1:
            a, b = pick(), pick()
            op = ("update", {a: env[b], b: env[a]}, ())
        elif kind == "other_seed":  # a stale value from another rank or layout
            other = SEEDS[rng.randrange(len(SEEDS))][1]
            shared = sorted(set(other) & set(env))
            if not shared:
                continue
            var = rng.choice(shared)
            op = ("set", var, other[var])
        elif kind == "mix":  # two recordings at once, either one on top
            other = SEEDS[rng.randrange(len(SEEDS))][1]
            op = ("update", dict(other), ()) if rng.random() < 0.5 else \
                ("update", {k: v for k, v in other.items() if k not in env}, ())
        elif kind == "mix_partial":
            other = SEEDS[rng.randrange(len(SEEDS))][1]
            if not other:
                continue
            take = rng.sample(sorted(other), rng.randint(1, max(1, len(other) // 2)))
            op = ("update", {k: other[k] for k in take}, ())
        elif kind == "extra":
            pool = rng.choice(POOLS + (["0", "1", "2", "3", "8"],))
            op = ("set", rng.choice(EXTRA_VARS), rng.choice(pool))
        elif kind == "truncate" and keys:
            var = pick()
            op = ("set", var, env[var][:rng.randint(0, max(0, len(env[var]) - 1))])
        else:
            continue
        env = apply([op], env)
        ops.append(op)
    return ops


def apply(ops, base):
    env = dict(base)
    for op in ops:
        if op[0] == "set":
            env[op[1]] = op[2]
        elif op[0] == "drop":
            env.pop(op[1], None)
        else:
            env.update(op[1])
            for var in op[2]:
                env.pop(var, None)
    return env


def describe(ops) -> str:
    def short(v):
        return repr(v if len(v) <= 60 else v[:60] + f"...<{len(v)} chars>")

    out = []
    for op in ops:
        if op[0] == "set":
            out.append(f"{op[1]}={short(op[2])}")
        elif op[0] == "drop":
            out.append(f"unset {op[1]}")
        else:
            shown = ", ".join(f"{k}={short(v)}" for k, v in list(op[1].items())[:6])
            more = f" (+{len(op[1]) - 6} more)" if len(op[1]) > 6 else ""
            out.append("set {" + shown + more + "}" + (f" unset {list(op[2])}" if op[2] else ""))
    return "; ".join(out)


# -- the checks ----------------------------------------------------------------------------
KNOWN_LAUNCHERS = set(source_names())


def check_invariants(d):
    v = d.to_dict()
    assert list(v) == list(FIELDS)
    assert d.launch in ("per-process", "per-node")
    assert d.launcher in KNOWN_LAUNCHERS, d.launcher
    for field in ("rank", "local_rank", "world_size", "local_world_size", "node_rank",
                  "num_nodes", "nproc_per_node", "master_port"):
        assert v[field] is None or (type(v[field]) is int and v[field] >= 0), (field, v[field])
    for field in ("world_size", "local_world_size", "num_nodes", "nproc_per_node", "master_port"):
        assert v[field] != 0, field
    if d.rank is not None and d.world_size is not None:
        assert d.rank < d.world_size
    if d.local_rank is not None and d.local_world_size is not None:
        assert d.local_rank < d.local_world_size
    if d.local_world_size is not None and d.world_size is not None:
        assert d.local_world_size <= d.world_size
    if d.num_nodes is not None and d.world_size is not None:
        assert d.num_nodes <= d.world_size
    if d.node_rank is not None and d.num_nodes is not None:
        assert d.node_rank < d.num_nodes
    if d.master_port is not None:
        assert 1 <= d.master_port <= 65535
    if d.master_addr is not None:
        assert isinstance(d.master_addr, str) and d.master_addr.strip() and \
            d.master_addr.isprintable() and " " not in d.master_addr, d.master_addr
    if d.hosts is not None:
        assert all(isinstance(h, str) and h for h in d.hosts), d.hosts[:5]
        if d.num_nodes is not None:
            assert len(d.hosts) == d.num_nodes
    if d.launch == "per-node":
        # the workers are yet to be started: no rank of their own; how many per node, when
        # given (a Lightning-style per-node launch gives only the total: a note says so)
        assert d.rank is None and d.local_rank is None
        assert d.nproc_per_node is None or d.nproc_per_node >= 1
    for field in FIELDS:
        assert field in d.provenance or getattr(d, field) is None, field
    json.dumps(v)
    assert d.explain()


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"resolve() ran longer than {HANG_SECONDS} s")


def resolve_bounded(env):
    """resolve(env) -> DistEnv or DistEnvError instance; anything else propagates. Fails if it
    took longer than PER_EXAMPLE_SECONDS; interrupts it after HANG_SECONDS."""
    # pytest-timeout (signal method) may have its own alarm running: ours must not cancel it.
    outer, _ = signal.getitimer(signal.ITIMER_REAL)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, min(HANG_SECONDS, outer) if outer else HANG_SECONDS)
    t0 = time.perf_counter()
    try:
        try:
            result = resolve(env)
        except DistEnvError as exc:
            result = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.perf_counter() - t0), 0.001))
    took = time.perf_counter() - t0
    assert took < PER_EXAMPLE_SECONDS, f"resolve() took {took:.2f} s"
    return result


def check_error(exc: DistEnvError):
    text = str(exc)
    assert text.strip(), "empty DistEnvError"
    assert "\n" not in text and "\r" not in text and text.isprintable(), repr(text[:300])
    assert len(text) < 4000, f"DistEnvError of {len(text)} characters: {text[:200]}..."


def outcome(env):
    """None when env is handled as promised, else what went wrong (one line)."""
    try:
        result = resolve_bounded(env)
    except Hang as exc:
        return str(exc)
    except AssertionError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - the point: nothing but DistEnvError escapes
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{os.path.basename(frame.filename)} in {frame.name}"
        return f"{type(exc).__name__} escaped resolve() at {where}: {str(exc)[:300]}"
    try:
        if isinstance(result, DistEnvError):
            check_error(result)
        else:
            check_invariants(result)
    except AssertionError as exc:
        return f"{'DistEnvError' if isinstance(result, DistEnvError) else 'DistEnv'} breaks a " \
               f"promise: {str(exc)[:300]}"
    return None


def shrink(index, ops):
    """Fewer operations, then fewer seed variables, while the same kind of failure remains."""
    base = dict(SEEDS[index][1])
    kind = (outcome(apply(ops, base)) or "").split(":")[0]

    def fails(o, b):
        got = outcome(apply(o, b))
        return got is not None and got.split(":")[0] == kind

    i = 0
    while i < len(ops):
        trial = ops[:i] + ops[i + 1:]
        if fails(trial, base):
            ops = trial
        else:
            i += 1
    for var in sorted(base):
        trial = {k: v for k, v in base.items() if k != var}
        if fails(ops, trial):
            base = trial
    return ops, base


#: The seed of the pseudo-random mutations. CI uses this fixed one (a failure is the same on
#: every run); a nightly job passes DISTENV_FUZZ_SEED=random (printed on failure).
SEED = os.environ.get("DISTENV_FUZZ_SEED", "9")


def test_mutated_recordings_resolve_or_raise_distenverror(no_gpus_session):
    import random

    seed = random.SystemRandom().randrange(2 ** 32) if SEED == "random" else int(SEED)
    rng = random.Random(seed)
    failures, known = {}, {}
    for n in range(EXAMPLES):
        index = rng.randrange(len(SEEDS))
        ops = mutations(rng, index)
        problem = outcome(apply(ops, SEEDS[index][1]))
        if problem is None:
            continue
        bug = known_bug(problem)
        if bug is not None:
            known[bug] = known.get(bug, 0) + 1
            continue
        key = re.sub(r"'.*|[0-9]+", "", problem)[:90]
        if key in failures or len(failures) >= 8:
            continue
        small_ops, small_base = shrink(index, ops)
        dropped = len(SEEDS[index][1]) - len(small_base)
        failures[key] = (f"case {n} (DISTENV_FUZZ_SEED={seed}), seed {SEED_NAMES[index]} "
                         f"({dropped} of its variables not needed): {describe(small_ops)}\n"
                         f"    -> {outcome(apply(small_ops, small_base))}")
    assert not failures, f"{len(failures)} kind(s) of failure in {EXAMPLES} cases:\n" + \
        "\n".join(failures.values())
    print(f"{EXAMPLES} cases, seed {seed}; known bugs hit (strict xfails below): {known}")


# -- known resolver bugs: strict xfails (fixed -> XPASS fails -> move the entry to FIXED_BUGS) --
#: name -> (regex on the problem `outcome()` reports, seed, ops reproducing it, why/fix).
KNOWN_BUGS: dict = {}

#: Bugs the fuzzer found and eccb56e fixed, replayed as regression cases: they must stay fixed.
#: (With no known bug left these also keep test_known_bug's parameter set non-empty: an empty one
#: is a skip, a failure under DISTENV_REQUIRE_LAUNCHERS=1.)
FIXED_BUGS = {
    "openmpi-int-escapes": (
        r"^ValueError escaped resolve\(\) at openmpi\.py in (read|_hnp_hosts_rank0):",
        "launchers/cluster-openmpi4-2x2.json#2",
        [("set", "OMPI_MCA_ess_base_num_procs", "\u00b2")],
        "sources/openmpi.py took str.isdigit() for int(): '\u00b2' raised a plain ValueError"),
    "openmpi-vpid-escapes": (
        r"^ValueError escaped resolve\(\) at openmpi\.py in (read|_hnp_hosts_rank0):",
        "launchers/cluster-openmpi4-2x2.json#2",
        [("set", "OMPI_MCA_orte_local_daemon_uri", "888537088." + "9" * 5000 + ";tcp://10.213.77.12:1")],
        "as above, for a 5000-digit daemon vpid"),
    "long-error-messages": (
        r"^DistEnvError breaks a promise: DistEnvError of [0-9]+ characters",
        "launchers/cluster-srun-2x2.json#1",
        [("set", "SLURM_GTIDS", "x" * 50000)],
        "values quoted whole in messages: a 50000-character DistEnvError"),
}


def known_bug(problem: str):
    for name, (pattern, *_rest) in KNOWN_BUGS.items():
        if re.search(pattern, problem):
            return name
    return None


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason=KNOWN_BUGS[n][3])) for n in KNOWN_BUGS] + list(FIXED_BUGS))
def test_known_bug(no_gpus_session, name):
    """A known bug still reproduces (strict xfail); a fixed one stays fixed (plain pass)."""
    pattern, seed, ops, _why = KNOWN_BUGS.get(name) or FIXED_BUGS[name]
    problem = outcome(apply(ops, SEEDS[SEED_NAMES.index(seed)][1]))
    assert problem is None, problem


#: Values too long for any message: an error may name them, never print them whole.
LONG_VALUES = ["x" * 10000, "1" * 10000, "[" * 10000, "n[" + ",".join(map(str, range(3000))) + "]",
               "2(x" + "9" * 5000 + ")", "1(x2)," * 3000, "é" * 10000,
               '{"cluster": {"worker": ["a:1"]}, "task": {"type": "' + "w" * 10000 + '", "index": 0}}',
               '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": [' + "1," * 5000 + '1]}}']


def test_long_values_give_short_errors_for_every_variable_read(no_gpus_session):
    """Every variable resolve() reads in every seed, set to a value of 10000+ characters:
    the answer is a DistEnv or a DistEnvError of bounded length (no log flooding)."""
    problems = {}
    for index, (name, base) in enumerate(SEEDS):
        extra = EXTRA_VARS if name.endswith("#0") or name.startswith("platforms/") else []
        for var in sorted(set(READ[index]) | set(extra)):
            for value in LONG_VALUES:
                problem = outcome({**base, var: value})
                if problem is not None and known_bug(problem) is None:
                    problems.setdefault(var, f"{name}: {var}={value[:30]!r}... -> {problem}")
    assert not problems, "\n".join(problems.values())


# -- the command line, in a subprocess ------------------------------------------------------
def _real_environment(env):
    """What a real process environment can hold: no NUL, names non-empty without '='; values
    that the filesystem encoding (UTF-8, surrogateescape) can carry."""
    out = {}
    for k, v in env.items():
        v = v.replace("\x00", "")
        try:
            v.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            v = v.encode("utf-8", "replace").decode("utf-8")
        if k and "=" not in k and "\x00" not in k:
            out[k] = v
    return out


def _cli_cases():
    """A fixed sample (reproducible, so a failure is a test id): the seeds in turn, mutated."""
    import random

    rng = random.Random(int(SEED) if SEED != "random" else None)
    cases = []
    for n in range(CLI_EXAMPLES):
        index = (n * 7) % len(SEEDS)
        env = apply(mutations(rng, index), SEEDS[index][1])
        cases.append(pytest.param(env, id=f"{n}-{SEED_NAMES[index].split('/')[-1]}"))
    return cases


BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.path.join(ROOT, "src"),
            "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}


@pytest.mark.parametrize("env", _cli_cases())
def test_cli_on_mutated_recordings_exits_cleanly(env):
    env = {**_real_environment(env), **BASE_ENV}
    p = subprocess.run([sys.executable, "-m", "distenv", "show", "--json"], env=env,
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if p.returncode == 0:
        assert set(json.loads(out)) == set(FIELDS) and not err.strip(), err
    else:
        assert p.returncode == 2, (p.returncode, err[-2000:])
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("distenv: error: "), err[-2000:]
        assert "Traceback" not in err and not out.strip()
