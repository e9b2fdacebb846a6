"""distenv.core.hostlist: SLURM host lists and per-node counts.

The reference is SLURM's own parser (src/common/hostlist.c, hostlist_create),
run for real: `scontrol show hostnames` expands batches of random compressed
lists (test_same_as_scontrol_show_hostnames; a missing scontrol is a skip, a
failure under DISTENV_REQUIRE_LAUNCHERS=1). `slurm_reference` below
re-implements its expansion rules literally (including the recursion in
_push_range_list that fixes the order of three or more bracket groups) for
cheap examples without SLURM, and python-hostlist is checked against where it
agrees with SLURM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

try:
    from distenv.errors import DistEnvError
    from distenv.core.hostlist import MAX_HOSTS, expand_hostlist, expand_tasks_per_node
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from distenv.errors import DistEnvError
    from distenv.core.hostlist import MAX_HOSTS, expand_hostlist, expand_tasks_per_node


# --- a literal transcription of SLURM's rules, for valid input only ---------------


def _split_top(text: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    items.append(cur)
    return items


def _ranges(inner: str) -> list[tuple[int, int, int]]:
    out = []
    for r in inner.split(","):
        lo, _, hi = r.partition("-")
        out.append((int(lo), int(hi or lo), len(lo)))  # width = strlen(low end)
    return out


def _push_range_list(out: list[str], prefix: str, ranges) -> None:
    # hostlist.c: the last '[...]' left in the prefix is the outer loop, and
    # the function recurses on what is left of the prefix.
    p = prefix.rfind("[")
    if p >= 0 and "]" in prefix[p:]:
        q = prefix.rindex("]")
        head, inner, tail = prefix[:p], prefix[p + 1 : q], prefix[q + 1 :]
        for lo, hi, w in _ranges(inner):
            for j in range(lo, hi + 1):
                new = f"{head}{j:0{w}d}{tail}"
                if "[" in head:
                    _push_range_list(out, new, ranges)
                else:
                    for lo2, hi2, w2 in ranges:
                        out.extend(f"{new}{k:0{w2}d}" for k in range(lo2, hi2 + 1))
        return
    for lo, hi, w in ranges:
        out.extend(f"{prefix}{k:0{w}d}" for k in range(lo, hi + 1))


def slurm_reference(text: str) -> list[str]:
    out: list[str] = []
    for tok in _split_top(text):
        if "[" not in tok:
            out.append(tok)
            continue
        p = tok.rindex("[")
        q = tok.index("]", p)
        assert q == len(tok) - 1, "SLURM rejects text after the last ']'"
        _push_range_list(out, tok[:p], _ranges(tok[p + 1 : q]))
    return out


# --- precise cases ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # slurm_hostlist_create(3) man page
        ("linux[1-3,6]", ["linux1", "linux2", "linux3", "linux6"]),
        # slurm.conf(5), NodeName
        ("lx[15,18,32-33]", ["lx15", "lx18", "lx32", "lx33"]),
        ("linux[0-3]", ["linux0", "linux1", "linux2", "linux3"]),
        # several groups in one name, as slurm.conf's "rack[0-63]_blade[0-41]":
        # the last group varies fastest
        ("rack[0-1]_blade[0-2]",
         ["rack0_blade0", "rack0_blade1", "rack0_blade2",
          "rack1_blade0", "rack1_blade1", "rack1_blade2"]),
        ("rack[1-2]-node[01-02]",
         ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("cn[007-009,099-101]", ["cn007", "cn008", "cn009", "cn099", "cn100", "cn101"]),
        ("n[1,3,5]", ["n1", "n3", "n5"]),
        ("n[5]", ["n5"]),
        ("n[007]", ["n007"]),  # a lone number keeps its zeros
        ("n[3-3]", ["n3"]),
        # padding is the width of the low end; the high end's zeros do not matter
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[008-10]", ["n008", "n009", "n010"]),
        ("n[8-010]", ["n8", "n9", "n10"]),
        ("n[0-2]", ["n0", "n1", "n2"]),
        ("n[00-02]", ["n00", "n01", "n02"]),
        # across blocks of a thousand (the implementation builds names per 1000)
        ("n[998-1002]", ["n998", "n999", "n1000", "n1001", "n1002"]),
        ("n[0998-1001]", ["n0998", "n0999", "n1000", "n1001"]),
        ("n[00999-01001]", ["n00999", "n01000", "n01001"]),
        ("n[99999-100001]", ["n99999", "n100000", "n100001"]),
        ("n[1999-2000,5000]", ["n1999", "n2000", "n5000"]),
        # plain names, dots, hyphens, underscores, digits in the prefix
        ("login1", ["login1"]),
        ("a.b-c_d,e", ["a.b-c_d", "e"]),
        ("node-1.cluster.local,node-2.cluster.local",
         ["node-1.cluster.local", "node-2.cluster.local"]),
        ("gpu-a100-[1-2]", ["gpu-a100-1", "gpu-a100-2"]),
        ("x1y[2-3]", ["x1y2", "x1y3"]),
        ("n[1-2][7]", ["n17", "n27"]),
        ("[1-3]", ["1", "2", "3"]),  # no prefix at all
        # mixed list keeps SLURM's order, not sorted
        ("b[2-1000],a1,b1", None),
        ("c[3-4],a[1-2],b1", ["c3", "c4", "a1", "a2", "b1"]),
        # duplicates are kept, as hostlist_create keeps them (no hostlist_uniq)
        ("n1,n1", ["n1", "n1"]),
        ("n[1-2],n[2-3]", ["n1", "n2", "n2", "n3"]),
        ("n[1,1]", ["n1", "n1"]),
    ],
)
def test_expand_examples(text, expected):
    got = expand_hostlist(text)
    assert got == slurm_reference(text)
    if expected is not None:
        assert got == expected


def test_mixed_list_order_is_kept():
    got = expand_hostlist("b[2-1000],a1,b1")
    assert got[:2] == ["b2", "b3"] and got[-3:] == ["b1000", "a1", "b1"]
    assert len(got) == 1001


def test_three_groups_follow_slurm_order_not_odometer():
    # SLURM's _push_range_list takes the last bracket of the prefix as the
    # outer loop and recurses: for a[]b[]c[] the order is b (slowest), a, c.
    got = expand_hostlist("a[1-2]b[1-2]c[1-2]")
    assert got == [
        "a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2",
        "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2",
    ]
    assert got == slurm_reference("a[1-2]b[1-2]c[1-2]")
    four = "w[1-2]x[1-2]y[1-2]z[1-2]"
    assert expand_hostlist(four) == slurm_reference(four)


def test_big_lists():
    hosts = expand_hostlist("node[00001-10000]")
    assert len(hosts) == 10_000
    assert hosts[0] == "node00001" and hosts[998] == "node00999" and hosts[999] == "node01000"
    assert hosts == [f"node{i:05d}" for i in range(1, 10_001)]
    assert expand_hostlist("n[1-100000]") == [f"n{i}" for i in range(1, 100_001)]


def test_limit_is_inclusive():
    assert len(expand_hostlist(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS


@pytest.mark.parametrize(
    "text, expected",
    [
        # SLURM splits names on space and tab as well as comma
        ("a b", ["a", "b"]),
        ("a, b", ["a", "b"]),
        (" n[1-2] ,\tn3 ", ["n1", "n2", "n3"]),
        ("n[1-2]\n", ["n1", "n2"]),  # e.g. a value read from a file
        ("n[1-2] m[3-4]", ["n1", "n2", "m3", "m4"]),
    ],
)
def test_whitespace(text, expected):
    assert expand_hostlist(text) == expected


# --- errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, says",
    [
        ("gpu[01-", "never closed"),
        ("gpu[01-02", "never closed"),
        ("a]b", "without a matching '['"),
        ("n[1-2]]", "without a matching '['"),
        ("n[3-1]", "backwards"),
        ("n[a-b]", "neither a number nor a range"),
        ("n[1-]", "neither a number nor a range"),
        ("n[-1]", "neither a number nor a range"),
        ("n[1-2-3]", "neither a number nor a range"),
        ("n[+1]", "neither a number nor a range"),
        ("n[0x1]", "neither a number nor a range"),
        ("n[\u0661-\u0663]", "neither a number nor a range"),  # Arabic-Indic digits
        ("n[1\x1b]", "neither a number nor a range"),
        ("n[]", "empty brackets"),
        ("n[1,,2]", "empty range"),
        ("n[,1]", "empty range"),
        ("n[[1-2]]", "nested"),
        ("n[1[2]]", "nested"),
        ("a,,b", "item number 2 is empty"),
        (",a", "item number 1 is empty"),
        ("a,", "item number 2 is empty"),
        ("a, ,b", "item number 2 is empty"),
        (",", "empty"),
        ("", "empty"),
        ("   ", "empty"),
        ("n[1, 2]", "whitespace inside brackets"),
        ("n[1-2]-ib", "nothing after the final bracket"),
        ("n[1-2]x[3]y", "nothing after the final bracket"),
        ("n[0-1000000]", "more than 1,000,000 hosts"),
        ("n[1-999999999999999999999]", "more than 1,000,000 hosts"),
        ("a[1-600000],b[1-600000]", "more than 1,000,000 hosts"),
        ("a[1-1000]b[1-1000]c[1-2]", "more than 1,000,000 hosts"),
        ("x" * 200 + "[1-600000]", "characters"),
        ("n[1-" + "9" * 100 + "]", "digits"),
        ("n[" + "1" * 5000 + "]", "digits"),
        ("n[" + "1" * 5000 + "-2]", "digits"),  # int() would refuse > 4300 digits
    ],
)
def test_malformed_names_variable_and_problem(text, says):
    with pytest.raises(DistEnvError) as info:
        expand_hostlist(text, var="MY_NODES")
    msg = str(info.value)
    assert msg.startswith("MY_NODES=")
    assert says in msg
    assert "Fix:" in msg
    if len(text) < 100:
        assert repr(text) in msg  # the value is quoted whole
    assert msg.isprintable()  # one line, control characters escaped


def test_error_is_a_value_error_and_default_var():
    with pytest.raises(ValueError, match=r"^SLURM_NODELIST='n\[3-1\]'"):
        expand_hostlist("n[3-1]")


def test_huge_value_is_truncated_in_message():
    text = "n[1-2]," * 5_000 + "gpu[01-"
    with pytest.raises(DistEnvError) as info:
        expand_hostlist(text, var="SLURM_JOB_NODELIST")
    msg = str(info.value)
    assert msg.startswith("SLURM_JOB_NODELIST='n[1-2],")
    assert f"({len(text)} characters)" in msg
    assert len(msg) < 1000


def test_not_a_string():
    with pytest.raises(TypeError):
        expand_hostlist(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        expand_tasks_per_node(3)  # type: ignore[arg-type]


# --- where python-hostlist differs from SLURM (we follow SLURM) -------------------


def test_differences_from_python_hostlist():
    hl = pytest.importorskip("hostlist")
    # python-hostlist drops duplicates unless asked not to; SLURM keeps them
    assert hl.expand_hostlist("n1,n1") == ["n1"]
    assert expand_hostlist("n1,n1") == ["n1", "n1"]
    # three groups: python-hostlist is an odometer (first group slowest)
    text = "a[1-2]b[1-2]c[1-2]"
    assert hl.expand_hostlist(text)[:3] == ["a1b1c1", "a1b1c2", "a1b2c1"]
    assert expand_hostlist(text)[:3] == ["a1b1c1", "a1b1c2", "a2b1c1"]
    # text after the last bracket: python-hostlist accepts, SLURM refuses
    assert hl.expand_hostlist("n[1-2]-ib") == ["n1-ib", "n2-ib"]
    with pytest.raises(DistEnvError):
        expand_hostlist("n[1-2]-ib")
    # whitespace: python-hostlist keeps it in the name, SLURM separates
    assert hl.expand_hostlist("a b") == ["a b"]
    assert expand_hostlist("a b") == ["a", "b"]
    # empty items: python-hostlist skips them, SLURM too (it collapses
    # separators), we refuse them as a sign of a broken value
    assert hl.expand_hostlist("a,,b") == ["a", "b"]
    with pytest.raises(DistEnvError):
        expand_hostlist("a,,b")


# --- property tests --------------------------------------------------------------

_lit = st.text(alphabet="abnz09.-_", max_size=4)


@st.composite
def _group(draw, max_ranges=4, max_span=40):
    parts = []
    for _ in range(draw(st.integers(1, max_ranges))):
        lo = draw(st.integers(0, 2100))
        w = draw(st.integers(1, 5))
        if draw(st.booleans()):
            parts.append(str(lo).zfill(w))
        else:
            hi = lo + draw(st.integers(0, max_span))
            parts.append(f"{str(lo).zfill(w)}-{str(hi).zfill(draw(st.integers(1, 5)))}")
    return "[" + ",".join(parts) + "]"


@st.composite
def _name(draw, max_groups):
    ngroups = draw(st.integers(0, max_groups))
    # keep products of several groups small: at most ~10 names per group
    group = _group() if max_groups <= 2 else _group(max_ranges=2, max_span=4)
    if ngroups == 0:
        return draw(_lit.filter(bool))
    out = draw(_lit)
    for i in range(ngroups):
        if i:
            out += draw(_lit)
        out += draw(group)
    return out  # nothing after the last group, as SLURM requires


def _hostlists(max_groups):
    return st.lists(_name(max_groups), min_size=1, max_size=5).map(",".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_hostlists(max_groups=2))
def test_same_as_python_hostlist(text):
    hl = pytest.importorskip("hostlist")
    assert expand_hostlist(text) == hl.expand_hostlist(text, allow_duplicates=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_hostlists(max_groups=4))
def test_same_as_slurm_reference(text):
    assert expand_hostlist(text) == slurm_reference(text)


# --- SLURM itself: `scontrol show hostnames` --------------------------------------
#
# The transcription above is written like the code it checks; SLURM's own parser is the real
# oracle. `scontrol show hostnames LIST` expands a list locally (hostlist_create, then one name
# a line) and needs no controller, only a configuration file to start: a two-line one in a
# temporary directory. One scontrol call checks a whole batch of lists, each followed by a
# sentinel host name that the generated names cannot take, so the output splits back per list.

_SENTINEL = "distenv-sentinel-"  # 'd', 'i', 's', ... are not in _lit's alphabet
_BATCH_HOSTS = 20_000  # expanded hosts per scontrol call at most (output stays small)


def _require_launchers() -> bool:
    return os.environ.get("DISTENV_REQUIRE_LAUNCHERS", "").strip() not in ("", "0")


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """show(lists) -> SLURM's expansion of each list, from one `scontrol show hostnames`."""
    binary = shutil.which("scontrol")
    if binary is None:
        why = "scontrol not found (SLURM's client: integrations/setup.sh installs slurm-wlm)"
        if _require_launchers():
            pytest.fail(f"DISTENV_REQUIRE_LAUNCHERS=1: {why}")
        pytest.skip(why)
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=distenvtest\nSlurmctldHost=localhost\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(conf),
           "LANG": "C"}

    def show(lists):
        # the sentinel first too: a list may start with '-', which scontrol takes for an option
        arg = ",".join([f"{_SENTINEL}start"] + [f"{text},{_SENTINEL}{i}" for i, text in enumerate(lists)])
        p = subprocess.run([binary, "show", "hostnames", arg], env=env, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
        # scontrol exits 0 even on "Invalid hostlist": its stderr must be empty too
        assert p.returncode == 0 and not p.stderr.strip(), (p.returncode, p.stderr[-2000:], arg[:500])
        lines = p.stdout.splitlines()
        assert lines[:1] == [f"{_SENTINEL}start"], lines[:3]
        out, cur = [], []
        for line in lines[1:]:
            if line == f"{_SENTINEL}{len(out)}":
                out.append(cur)
                cur = []
            else:
                cur.append(line)
        assert len(out) == len(lists) and not cur, (len(out), len(lists), cur[:5])
        return out

    return show


def test_scontrol_oracle_answers(scontrol):
    """The oracle itself, on the slurm.conf(5) examples (so a mute scontrol cannot pass)."""
    assert scontrol(["lx[15,18,32-33]", "linux[0-3]", "a"]) == [
        ["lx15", "lx18", "lx32", "lx33"], ["linux0", "linux1", "linux2", "linux3"], ["a"]]


@st.composite
def _hostlist_batch(draw):
    """Random compressed host lists (one to four bracket groups a name, zero padding, ranges
    across powers of ten, comma or space between names), as many as _BATCH_HOSTS allows."""
    lists, total = [], 0
    for _ in range(draw(st.integers(20, 120))):
        names = draw(st.lists(st.one_of(_name(2), _name(4)), min_size=1, max_size=5))
        text = names[0]
        for name in names[1:]:
            text += draw(st.sampled_from([",", ",", " "])) + name
        size = len(expand_hostlist(text))  # a valid list: distenv must read it (else fail)
        if total + size > _BATCH_HOSTS:
            break
        lists.append(text)
        total += size
    return lists


# No shrinking: each step of it is a scontrol call, and the report names the lists that differ.
@settings(max_examples=int(os.environ.get("DISTENV_SCONTROL_EXAMPLES", "12")), deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_hostlist_batch())
def test_same_as_scontrol_show_hostnames(scontrol, lists):
    """distenv.core.hostlist expands every list exactly as SLURM does: same names, same order,
    duplicates kept (12 scontrol calls of 20-120 lists each by default, about 2 s)."""
    theirs = scontrol(lists)
    wrong = []
    for text, want in zip(lists, theirs):
        mine = expand_hostlist(text)
        if mine != want:
            at = next((i for i, (a, b) in enumerate(zip(mine, want)) if a != b), min(len(mine), len(want)))
            wrong.append(f"{text!r}: {len(mine)} names, SLURM {len(want)}; from name {at}: "
                         f"distenv {mine[at:at + 3]}, SLURM {want[at:at + 3]}")
    assert not wrong, f"{len(wrong)} of {len(lists)} lists differ:\n" + "\n".join(wrong[:5])


@settings(max_examples=200, deadline=None)
@given(
    lo=st.integers(0, 10**7),
    count=st.integers(1, 3000),
    width=st.integers(1, 9),
    hi_width=st.integers(1, 9),
    prefix=_lit,
)
def test_ranges_match_printf_padding(lo, count, width, hi_width, prefix):
    hi = lo + count - 1
    text = f"{prefix}[{str(lo).zfill(width)}-{str(hi).zfill(hi_width)}]"
    assert expand_hostlist(text) == [f"{prefix}{i:0{width}d}" for i in range(lo, hi + 1)]


def _max_groups_per_name(text: str) -> int:
    most = 0
    for item in _split_top(text):
        most = max(most, item.count("["))
    return most


_garbage_alphabet = "[]-,0123456789an. \t\n(x)"


@st.composite
def _mutated_hostlist(draw):
    """A valid host list with a few characters inserted, deleted or replaced."""
    text = draw(_hostlists(max_groups=2))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        ch = draw(st.sampled_from("[]-,,09a \t"))
        op = draw(st.sampled_from(("insert", "delete", "replace")))
        if op == "insert":
            text = text[:i] + ch + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + ch + text[i + 1 :]
    return text


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(alphabet=_garbage_alphabet, max_size=30),
        st.text(max_size=30),
        _mutated_hostlist(),
    )
)
def test_garbage_gives_a_list_or_distenv_error(text):
    try:
        got = expand_hostlist(text, var="GARBAGE")
    except DistEnvError as e:
        assert str(e).startswith("GARBAGE=")
        assert str(e).isprintable()  # one line, control characters escaped
        return
    assert isinstance(got, list) and got
    assert all(isinstance(h, str) and h for h in got)
    assert all("," not in h and "[" not in h and "]" not in h for h in got)
    # whenever we accept something python-hostlist also reads the same way, agree
    if any(c in text for c in " \t\n\r\f\v") or _max_groups_per_name(text) > 2:
        return
    hl = pytest.importorskip("hostlist")
    try:
        theirs = hl.expand_hostlist(text, allow_duplicates=True)
    except hl.BadHostlist:
        return
    assert got == theirs


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789(x),  ", max_size=20), st.text(max_size=20)))
def test_tasks_garbage_gives_a_list_or_distenv_error(text):
    try:
        got = expand_tasks_per_node(text, var="GARBAGE")
    except DistEnvError as e:
        assert str(e).startswith("GARBAGE=")
        assert str(e).isprintable()
        return
    assert got and all(isinstance(n, int) and n >= 0 for n in got)


# --- tasks per node --------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # sbatch(1), SLURM_TASKS_PER_NODE
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("2,1", [2, 1]),
        ("1(x1)", [1]),
        ("8(x2),4,8(x2)", [8, 8, 4, 8, 8]),
        ("0,1", [0, 1]),
        ("72(x2)", [72, 72]),
        (" 2(x2) , 1 ", [2, 2, 1]),
    ],
)
def test_tasks_per_node(text, expected):
    assert expand_tasks_per_node(text) == expected


def test_tasks_per_node_matches_python_hostlist():
    hl = pytest.importorskip("hostlist")
    for text in ["2(x3),1", "4", "2,1", "16(x128),8"]:
        assert expand_tasks_per_node(text) == hl.parse_slurm_tasks_per_node(text)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "empty"),
        ("2,,1", "item number 2 is empty"),
        ("2,", "item number 2 is empty"),
        ("2(x0)", "zero times"),
        ("2(3)", "neither a count"),
        ("2(x3", "neither a count"),
        ("(x3)", "neither a count"),
        ("2x3", "neither a count"),
        ("-1", "neither a count"),
        ("2(x-1)", "neither a count"),
        ("a", "neither a count"),
        ("\u0662", "neither a count"),
        ("1(x1000001)", "more than 1,000,000"),
        ("1" * 5000, "impossibly large"),
        ("2(x" + "1" * 5000 + ")", "impossibly large"),
        ("1" * 5000 + "(x2)", "impossibly large"),
    ],
)
def test_tasks_per_node_malformed(text, says):
    with pytest.raises(DistEnvError) as info:
        expand_tasks_per_node(text, var="SLURM_TASKS_PER_NODE")
    msg = str(info.value)
    assert msg.startswith(f"SLURM_TASKS_PER_NODE={text[:20]!r}"[:-1])
    if len(text) < 100:
        assert msg.startswith(f"SLURM_TASKS_PER_NODE={text!r}")
    assert says in msg
    assert len(msg) < 1000
