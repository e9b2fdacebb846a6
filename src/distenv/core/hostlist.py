"""Expand SLURM's compressed host lists and task counts.

``expand_hostlist("cn[007-009,099-101],login1")`` gives
``['cn007', 'cn008', 'cn009', 'cn099', 'cn100', 'cn101', 'login1']`` and
``expand_tasks_per_node("2(x3),1")`` gives ``[2, 2, 2, 1]``.

The syntax and the order of the result follow SLURM's own parser
(``hostlist_create`` in ``src/common/hostlist.c``), not python-hostlist,
where the two differ:

* Duplicates are kept and nothing is sorted (python-hostlist removes
  duplicates unless ``allow_duplicates=True``).
* With three or more bracket groups in one name SLURM does not vary the groups
  like an odometer: the last group varies fastest, then the first, the second,
  ... and the second-to-last slowest, so ``a[1-2]b[1-2]c[1-2]`` starts
  ``a1b1c1, a1b1c2, a2b1c1, a2b1c2, a1b2c1``. python-hostlist varies the first
  group slowest. With one or two groups both agree (last group fastest).
* Nothing may follow the last ``]`` of a name: SLURM rejects ``n[1-2]-ib``
  (python-hostlist accepts it). Text between groups is fine: ``rack[1-2]-n[1-4]``.
* Space and tab separate names like a comma does (``"a b"`` is two hosts);
  python-hostlist keeps ``"a b"`` as one name. We also take newline, CR, FF
  and VT as separators (SLURM would keep them inside a name), so a value read
  from a file with its trailing newline still works.

Zero padding follows the low end of each range: ``[8-10]`` gives 8, 9, 10 and
``[08-10]`` gives 08, 09, 10, as in both SLURM and python-hostlist.

Where SLURM's C parser silently accepts garbage that SLURM itself never writes,
this module raises `DistEnvError` instead: empty items (``a,,b``), an unclosed or
stray bracket (``gpu[01-`` is taken by SLURM as a host literally named
``gpu[01-]``; ``a]b`` as a host named ``a]b``), ``n[1-]`` (SLURM: ``n1``),
whitespace or signs inside brackets (SLURM's ``strtoul`` skips them and then
pads to the wrong width), and an empty value. SLURM refuses a single range of
more than 65,536 hosts; we accept ranges of any size but refuse a list that
expands to more than `MAX_HOSTS` hosts (or `MAX_CHARS` characters in all).
"""

from __future__ import annotations

from ._error import DistEnvError

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MAX_HOSTS", "MAX_CHARS", "expand_hostlist", "expand_tasks_per_node"]

#: A host list expanding to more hosts than this is refused as garbage.
MAX_HOSTS = 1_000_000
#: ... and so is one whose host names add up to more characters than this.
MAX_CHARS = 100_000_000

_MAX_DIGITS = 64  # in a range bound; SLURM itself reads them as unsigned long
_SPACES = " \t\n\r\f\v"  # separators between names, like SLURM's " \t,"
_EXAMPLE = "'node[01-04,07],login1'"


class _Bad(Exception):
    """Internal: what is wrong, turned into a DistEnvError naming the variable."""


def _show(value: str, limit: int = 200) -> str:
    """`value` quoted for a message, cut short so garbage cannot flood a log."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[: limit - 40] + "..." + value[-30:]) + f" ({len(value)} characters)"


def _error(var: str, text: str, what: str, problem: str, fix: str) -> DistEnvError:
    return DistEnvError(f"{var}={_show(text)} is not a valid {what}: {problem}. Fix: {fix}")


def _near(text: str, at: int) -> str:
    """Where in `text` a problem is, e.g. "(character 4, in 'gpu[01-')"."""
    lo = at - 20 if at > 20 else 0
    return f"(character {at + 1}, in {text[lo : at + 20]!r})"


def _too_big(total: int) -> str:
    if total > MAX_HOSTS:
        return f"it expands to more than {MAX_HOSTS:,} hosts"
    return f"its host names add up to more than {MAX_CHARS:,} characters"


def _empty_item(number: int) -> str:
    return f"item number {number} is empty (two commas in a row, or a comma at an end)"


# --- number tables: 0..999 as strings, built on first use -----------------------

_TABLES: "list[list[str]]" = []  # [str(i).zfill(w) for i in 0..999] for w = 1, 2, 3


def _tables() -> "list[list[str]]":
    if not _TABLES:
        d = "0123456789"
        t2 = [a + b for a in d for b in d]  # "00".."99"
        t3 = [a + b for a in d for b in t2]  # "000".."999"
        _TABLES.extend((list(d) + t2[10:] + t3[100:], t2 + t3[100:], t3))
    return _TABLES


def _range_block(prefix: str, lo: int, hi: int, width: int) -> str:
    """Comma-joined ``prefix + str(i).zfill(width)`` for lo <= i <= hi.

    Turning ints into decimal strings one by one is the slow part of expanding
    a host list, so the numbers are cut into blocks of a thousand: the low three
    digits come from a table and each block is one C-level ``join``.
    """
    tabs = _TABLES or _tables()
    t3 = tabs[2]
    q0, r0 = divmod(lo, 1000)
    q1, r1 = divmod(hi, 1000)
    out = []
    for q in range(q0, q1 + 1):
        a = r0 if q == q0 else 0
        b = r1 + 1 if q == q1 else 1000
        if q:
            # str(q * 1000 + r).zfill(w) == str(q).zfill(w - 3) + "%03d" % r
            head = prefix + str(q).zfill(width - 3)
            tab = t3
        elif width > 3:
            head = prefix + "0" * (width - 3)
            tab = t3
        else:
            head = prefix
            tab = tabs[width - 1]
        chunk = tab if (a == 0 and b == 1000) else tab[a:b]
        out.append(head + ("," + head).join(chunk))
    return out[0] if len(out) == 1 else ",".join(out)


def _digits(s: str) -> bool:
    # str.isdigit() alone also accepts '²' or '٣'; SLURM's strtoul takes ASCII only.
    return s.isdigit() and s.isascii()


def _parse_group(content: str, item: str) -> "tuple[list[Any], int, int]":
    """Parse what is between brackets: ``01-04,07``.

    Returns (ranges, count, widest): ranges holds a str for a single number
    (already in its final form: "007" stays 007) or a (lo, hi, width) tuple;
    widest bounds the length of one number, for the size guard.
    """
    pieces = content.split(",")
    if not (content.replace(",", "").replace("-", "").isdigit() and content.isascii()):
        raise _Bad(_group_problem(pieces, content, item))
    widest = max(map(len, pieces))
    if widest > _MAX_DIGITS:
        for r in pieces:
            if max(map(len, r.split("-"))) > _MAX_DIGITS:
                raise _Bad(f"a number in {_show(item, 60)} has more than {_MAX_DIGITS} digits")
    if "-" not in content:  # only single numbers
        if not widest or "" in pieces:
            raise _Bad(_group_problem(pieces, content, item))
        return pieces, len(pieces), widest
    ranges: "list[Any]" = []  # str (one number) or (lo, hi, width)
    count = 0
    for r in pieces:
        lo_s, dash, hi_s = r.partition("-")
        if not dash:
            if not r:
                raise _Bad(_group_problem(pieces, content, item))
            ranges.append(r)
            count += 1
            continue
        if not lo_s or not hi_s or "-" in hi_s:
            raise _Bad(_group_problem(pieces, content, item))
        lo = int(lo_s)
        hi = int(hi_s)
        if lo > hi:
            raise _Bad(f"the range {r!r} in {_show(item, 60)} runs backwards ({lo} > {hi})")
        ranges.append((lo, hi, len(lo_s)))
        count += hi - lo + 1
    return ranges, count, widest


def _group_problem(pieces: "list[str]", content: str, item: str) -> str:
    """Say what is wrong with the first bad piece of a bracket group."""
    where = f"{_show('[' + content + ']', 60)} (in {_show(item, 60)})"
    if not content:
        return f"empty brackets '[]' in {_show(item, 60)}"
    for r in pieces:
        if not r:
            return f"an empty range between commas in {where}"
        lo_s, dash, hi_s = r.partition("-")
        if not (_digits(lo_s) and (not dash or _digits(hi_s))):
            if any(c in _SPACES for c in r):
                return f"whitespace inside the brackets {where}"
            return f"{r!r} is neither a number nor a range of two numbers like 01-04 in {where}"
    return f"malformed brackets {where}"  # not reached


def _group_block(prefix: str, ranges: "list[Any]") -> str:
    """Comma-joined host names: prefix followed by each number of one group."""
    tabs = _TABLES or _tables()
    sep = "," + prefix
    blocks = []
    nums = []  # numbers still to be joined behind `prefix`
    for r in ranges:
        if r.__class__ is str:
            nums.append(r)
            continue
        lo, hi, width = r
        if hi < 1000 and width <= 3:  # the common case: straight from a table
            nums += tabs[width - 1][lo : hi + 1]
            continue
        if nums:
            blocks.append(prefix + sep.join(nums))
            nums = []
        blocks.append(_range_block(prefix, lo, hi, width))
    if nums:
        blocks.append(prefix + sep.join(nums))
    return blocks[0] if len(blocks) == 1 else ",".join(blocks)


def _expand_item(parts: "list[Any]", out: "list[str]") -> None:
    """Expand a name with two or more bracket groups; `parts` = [lit0, group0, lit1, ...].

    Appends comma-joined blocks of names to `out`.
    """
    lits = parts[0::2]
    groups = parts[1::2]
    # SLURM's order (_push_range_list recurses from the last bracket of the
    # prefix): the last group varies fastest, then group 1, 2, ..., n-1.
    names = _group_block(lits[0], groups[0]).split(",")
    for lit, group in zip(lits[1:-1], groups[1:-1]):
        tails = [lit + g for g in _group_block("", group).split(",")]
        names = [p + t for t in tails for p in names]
    last = _group_block("", groups[-1]).split(",")
    lit = lits[-1]
    for p in names:
        head = p + lit
        out.append(head + ("," + head).join(last))


def _split_spaces(text: str) -> str:
    """Turn whitespace separators into commas (SLURM splits names on " \\t,").

    Whitespace inside brackets and empty comma-separated items are errors.
    """
    for ch in _SPACES[1:]:
        text = text.replace(ch, " ")
    items: "list[str]" = []
    pos = start = 0
    n = len(text)
    while True:
        c = text.find(",", pos)
        end = c if c >= 0 else n
        b = text.find("[", pos, end)
        if b >= 0:
            e = text.find("]", b + 1)
            if e < 0:
                break  # the main parser reports the unclosed bracket
            if " " in text[b:e]:
                w = text.index(" ", b)
                raise _Bad(f"whitespace inside brackets {_near(text, w)}")
            pos = e + 1
            continue
        item = text[start:end]
        words = [w for w in item.split(" ") if w]
        if not words:
            raise _Bad(_empty_item(len(items) + 1))
        items.extend(words)
        if c < 0:
            return ",".join(items)
        pos = start = c + 1
    items.append(text[start:])
    return ",".join(items)


def expand_hostlist(text: str, var: str = "SLURM_NODELIST") -> list[str]:
    """Expand a SLURM host list such as ``cn[007-009,099-101],rack[1-2]-node[01-02]``.

    The hosts come in SLURM's order, duplicates kept. Raises `DistEnvError`
    naming `var` and quoting `text` if it is not a host list SLURM would write.
    """
    try:
        return _expand(text)
    except _Bad as bad:
        raise _error(
            var, text, "SLURM hostlist", str(bad),
            f"give {var} comma-separated host names with optional numeric ranges "
            f"in brackets, e.g. {_EXAMPLE}, as SLURM sets it",
        ) from None


def _expand(text: str) -> list[str]:
    if text.__class__ is not str:
        if not isinstance(text, str):
            raise TypeError(f"expand_hostlist() needs a str, not {type(text).__name__}")
    if not text.strip(_SPACES):
        raise _Bad("it is empty")
    for ch in _SPACES:
        if ch in text:
            text = _split_spaces(text)
            break
    if text[-1] == "]" and "," not in text:
        hosts = _one_range(text)
        if hosts is not None:
            return hosts
    if "[" not in text:
        if "]" in text:
            raise _Bad(f"a ']' without a matching '[' {_near(text, text.index(']'))}")
        hosts = text.split(",")
        if "" in hosts:
            raise _Bad(_empty_item(hosts.index("") + 1))
        if len(hosts) > MAX_HOSTS:
            raise _Bad(f"it lists more than {MAX_HOSTS:,} hosts")
        return hosts

    out = []  # comma-joined blocks of host names, split once at the end
    total = 0
    chars = 0
    n = len(text)
    pos = start = item_start = 0
    parts: "list[Any]" = []  # for the current item: literal, group, literal, group, ...
    nitem = 1
    while True:
        c = text.find(",", pos)
        end = c if c >= 0 else n
        b = text.find("[", pos, end)
        if b >= 0:
            s = text.find("]", pos, b)
            if s >= 0:
                raise _Bad(f"a ']' without a matching '[' {_near(text, s)}")
            e = text.find("]", b + 1)
            if e < 0:
                raise _Bad(f"a '[' is never closed {_near(text, b)}")
            nb = text.find("[", b + 1, e)
            if nb >= 0:
                raise _Bad(f"nested brackets {_near(text, nb)}")
            parts.append(text[start:b])
            parts.append(text[b + 1 : e])
            pos = start = e + 1
            continue
        s = text.find("]", pos, end)
        if s >= 0:
            raise _Bad(f"a ']' without a matching '[' {_near(text, s)}")
        tail = text[start:end]
        if parts:
            item = text[item_start:end]
            if tail:
                raise _Bad(
                    f"{_show(tail, 40)} follows the last ']' in {_show(item, 60)}; SLURM "
                    "allows nothing after the final bracket group of a name"
                )
            if len(parts) == 2:  # one bracket group, the usual case
                ranges, count, widest = _parse_group(parts[1], item)
                total += count
                chars += count * (widest + len(parts[0]))
                if total > MAX_HOSTS or chars > MAX_CHARS:
                    raise _Bad(_too_big(total))
                out.append(_group_block(parts[0], ranges))
            else:
                count = 1
                length = 0
                for i in range(1, len(parts), 2):
                    ranges, k, widest = _parse_group(parts[i], item)
                    parts[i] = ranges
                    count *= k
                    length += widest + len(parts[i - 1])
                total += count
                chars += count * length
                if total > MAX_HOSTS or chars > MAX_CHARS:
                    raise _Bad(_too_big(total))
                _expand_item(parts, out)
            parts = []
        elif tail:
            out.append(tail)
            total += 1
        else:
            raise _Bad(_empty_item(nitem))
        if c < 0:
            break
        nitem += 1
        pos = start = item_start = c + 1
    if total > MAX_HOSTS:
        raise _Bad(_too_big(total))
    return out[0].split(",") if len(out) == 1 else ",".join(out).split(",")


def _one_range(text: str) -> "list[str] | None":
    """The usual shape, ``prefix[lo-hi]`` with numbers below 1000, straight from the number
    tables; None for anything else (the full parser then takes it, errors included)."""
    b = text.find("[")
    if b < 0 or text.find("[", b + 1) >= 0 or text.find("]") != len(text) - 1:
        return None
    lo_s, dash, hi_s = text[b + 1 : -1].partition("-")
    if not (dash and 0 < len(lo_s) <= 3 and 0 < len(hi_s) <= 3 and lo_s.isdigit()
            and hi_s.isdigit() and lo_s.isascii() and hi_s.isascii()):
        return None
    lo, hi = int(lo_s), int(hi_s)
    if lo > hi:
        return None
    prefix = text[:b]
    return [prefix + n for n in (_TABLES or _tables())[len(lo_s) - 1][lo : hi + 1]]


def expand_tasks_per_node(text: str, var: str = "SLURM_STEP_TASKS_PER_NODE") -> list[int]:
    """Expand SLURM's compressed per-node counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Also fits SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE. Raises
    `DistEnvError` naming `var` if `text` is not in that form.
    """
    if not isinstance(text, str):
        raise TypeError(f"expand_tasks_per_node() needs a str, not {type(text).__name__}")
    # The usual shapes, "N" and "N(xR)", without the general loop.
    if text.isdigit() and text.isascii() and len(text) <= 9:
        return [int(text)]
    num, sep, rest = text.partition("(x")
    if sep and text[-1] == ")" and 0 < len(num) <= 9 and 1 < len(rest) <= 7 and num.isdigit() \
            and num.isascii() and rest[:-1].isdigit() and rest.isascii() and rest[0] != "0":
        return [int(num)] * int(rest[:-1])

    def bad(problem: str) -> DistEnvError:
        return _error(
            var, text, "SLURM per-node count list", problem,
            f"give {var} comma-separated counts, each N or N(xR) for R nodes in a "
            "row, e.g. '2(x3),1', as SLURM sets it",
        )

    if not text.strip(_SPACES):
        raise bad("it is empty")
    counts: list[int] = []
    for i, item in enumerate(text.split(","), 1):
        item = item.strip(_SPACES)
        if _digits(item) and len(item) <= 9:
            counts.append(int(item))
            continue
        if not item:
            raise bad(_empty_item(i))
        num, sep, rest = item.partition("(x")
        if not (sep and rest.endswith(")") and _digits(num) and _digits(rest[:-1])):
            if _digits(item):
                raise bad(f"item {i} {_show(item, 60)} is an impossibly large count")
            raise bad(f"item {i} {_show(item, 60)} is neither a count N nor N(xR)")
        if len(num) > 9 or len(rest) > 10:
            raise bad(f"item {i} {_show(item, 60)} holds an impossibly large number")
        reps = int(rest[:-1])
        if reps == 0:
            raise bad(f"item {i} {_show(item, 60)} repeats a count zero times")
        if len(counts) + reps > MAX_HOSTS:
            raise bad(f"it expands to more than {MAX_HOSTS:,} nodes")
        counts.extend([int(num)] * reps)
    return counts
