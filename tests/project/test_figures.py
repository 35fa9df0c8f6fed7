"""One source of truth for the figures the README, docs/ and the CHANGELOG quote: the results files under
benchmarks/results/.

The convention, which these tests hold the text to:

- a measured figure (a ratio such as 0.88x, a latency in ms or µs, MB/s, MB of RSS, CPU per GB, % of a core, a
  duration measured by a benchmark) sits in a sentence, a list item's sentence or a table cell that names the
  results file it comes from: `benchmarks/results/NAME.md`, or `NAME.md` when that file is in benchmarks/results/;
- every number with a decimal point, a unit or a thousands separator in such a sentence appears in one of the files
  it names (ranges and repeats included), so a figure goes stale the moment its results file changes under it;
- and appears there with the scope the sentence gives it, not anywhere in the file: in a table row whose label the
  sentence names (the kind "relay-kill", the backlog "1 GB", the form "zstd 3"; with the load's heading when the
  same row recurs under several, as oltp and bulk do), or in a sentence of the file that the sentence names by a
  rare word or that holds another of its figures too. A semicolon starts another claim: each clause is read with
  what comes before it in the sentence (``out_of_scope`` and ``scopes`` give the details);
- a sentence that names no results file quotes no measured figure (configuration values, limits and defaults are
  not measurements and are not matched by the patterns below).

The CHANGELOG is held to the same rules against each results file as it is now or as it was at a commit the
sentence names ("`fanout_real.md` at abef903").

And the results files themselves: each names the commit it measured, and that commit is in this repository's
history, or the file says plainly that it is not (re-run to refresh), and each says whether the tree was clean.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter, defaultdict
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DOCS = ["README.md"] + sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))

# -- reading markdown into sentences ------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(\[])")
_ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "etc.", "cf.")


def _sentences(block: str) -> list[str]:
    parts = _SENTENCE_END.split(block)
    out: list[str] = []
    for part in parts:
        if out and out[-1].endswith(_ABBREVIATIONS):
            out[-1] += " " + part
        else:
            out.append(part)
    return out


class Unit(NamedTuple):
    """One unit of a markdown file: a sentence, a list item's sentence, a table cell (``units``) or row
    (``units(rows=True)``), and with ``rows=True`` a heading."""

    line: int
    text: str
    label: tuple[str, ...] | None = None  # a table row's label cells (rows=True); None for prose
    context: str = ""  # a table cell's row labels and column name; a row's section heading (rows=True)
    table: int | None = None  # which table of the file a row is in (rows=True)


_ORDINAL = re.compile(r"#|runs?|repeats?|trials?|rounds?|repetitions?")


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _row_label(header: list[str], align: list[bool], cells: list[str]) -> tuple[str, ...]:
    """A table row's label: its first cell, and every other cell of a column that is not right-aligned (numbers
    are) and holds no digit; a numbered row (a trial, a run, a repeat: the first column says so) is named by its
    column and number alone, "repeat 3"."""
    first = cells[0] if cells else ""
    ordinal = re.match(r"\d+\b", first)
    if ordinal and header and _ORDINAL.fullmatch(header[0].lower()):
        return (f"{header[0]} {ordinal.group(0)}",)
    label = [first] if first else []
    for number, cell in enumerate(cells[1:], 1):
        right = align[number] if number < len(align) else True
        if cell and not right and not re.search(r"\d", cell):
            label.append(cell)
    return tuple(label)


def units(markdown: str, rows: bool = False) -> list[Unit]:
    """Every sentence of the prose, list items included, and every table cell, each with its first line number;
    fenced code blocks (sample output, commands) and headings are left out.

    With ``rows``, the way a results file is read: a table row is one unit (its cells with their column names),
    with its label cells and the heading of its section; a heading is a unit of its own."""
    result: list[Unit] = []
    block: list[str] = []
    start = 0
    fenced = False
    heading = ""
    header: list[str] = []
    align: list[bool] | None = None
    tables = 0
    in_table = False

    def flush():
        if block:
            for sentence in _sentences(" ".join(line.strip() for line in block)):
                result.append(Unit(start, sentence, context=heading if rows else ""))
            block.clear()

    for number, line in enumerate(markdown.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            in_table = False
            continue
        if fenced:
            continue
        if stripped.startswith("|"):
            flush()
            cells = _cells(stripped)
            if not in_table:
                header, align, tables, in_table = cells, None, tables + 1, True
            elif align is None and all(re.fullmatch(r":?-*:?", cell) for cell in cells):
                align = [cell.endswith(":") for cell in cells]
                continue
            if not rows:
                labels = [cell for cell in cells if not citations(cell)]
                for column, cell in enumerate(cells):
                    name = header[column] if column < len(header) and cells is not header else ""
                    result.append(Unit(number, cell, context=" | ".join([name] + labels)))
            elif cells is header or align is None:
                result.append(Unit(number, " | ".join(cells), context=heading))
            else:
                text = "; ".join(f"{name}: {cell}" for name, cell in zip(header + [""] * len(cells), cells))
                result.append(Unit(number, text, _row_label(header, align, cells), heading, tables))
            continue
        in_table = False
        if not stripped or stripped.startswith("#"):
            flush()
            if stripped.startswith("#") and rows:
                heading = stripped.lstrip("#").strip()
                result.append(Unit(number, heading, context=heading))
            continue
        if re.match(r"([-*]|\d+\.)\s", stripped):  # a list item starts a block of its own
            flush()
        if not block:
            start = number
        block.append(stripped)
    flush()
    return result


# -- citations, figures, numbers ----------------------------------------------------------------------------------

_CITED = re.compile(r"(?:benchmarks/results/)?((?:[\w-]+/)?[\w-]+\.md)\b")


def citations(text: str) -> list[str]:
    """The results files a sentence names (paths relative to benchmarks/results/)."""
    found = []
    for match in _CITED.finditer(text):
        name = match.group(1)
        full = match.group(0).startswith("benchmarks/results/")
        if (RESULTS / name).is_file() and (full or "/" not in name) and name not in found:
            found.append(name)
    return found


_NUMBER = r"(?<![\w./])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?"
_UNIT = r"\s?(x|×|%|ms|µs|us|ns|s|MB/s|GB/s|MB|GB|KB|kB|MiB|GiB|KiB|trx/s|cores?)(?![\w/])"
_FIGURE = re.compile(_NUMBER + f"(?:{_UNIT})?")


def _normal(integer: str, fraction: str | None) -> str:
    try:
        value = Decimal(integer.replace(",", "") + (fraction or ""))
    except InvalidOperation:  # pragma: no cover - the pattern only matches numbers
        return integer
    text = format(value.normalize(), "f")
    return text


def figures(text: str) -> list[tuple[str, str]]:
    """(as written, normalized) for every number in ``text`` that is a figure: with a decimal point, a unit
    (a ratio's x included) or a thousands separator. Bare small integers (3 runs, 50 clients) are counts."""
    out = []
    for match in _FIGURE.finditer(text):
        integer, fraction, unit = match.group(1), match.group(2), match.group(3)
        if fraction or unit or "," in integer:
            out.append((match.group(0).strip(), _normal(integer, fraction)))
    return out


def numbers_in(text: str) -> set[str]:
    """Every number of a results file, normalized (0.250 and 0.25 are one figure; 1,051 and 1051 too)."""
    return {_normal(m.group(1), m.group(2)) for m in re.finditer(_NUMBER, text)}


# -- scope: which row or sentence of a results file a figure comes from ------------------------------------------

_STOP = frozenset("a an the of in on at to by for from with and or vs is are was were be been it its as that this "
                  "these those than per one each every all no not".split()
                  + "x ms µs us ns s kb mb gb kib mib gib b".split())  # and units: a unit names no scope
_SCOPE_WORD = re.compile(
    r"(?<![\w.])(\d[0-9a-f]*[a-f][0-9a-f]*)(?![\w.])"  # a commit: 8e0eb2e
    r"|(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:\s?(kb|mb|gb|kib|mib|gib|trx/s|cores?)(?![\w/]))?"
    r"|(?<![\w.])([a-z][a-z0-9_]*(?:['-][a-z0-9_]+)*)|([^\s\w])")


def _stem(word: str) -> str:
    word = re.sub(r"'s?$", "", word)
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def scope_words(text: str) -> set[str]:
    """The words of ``text`` that can name a scope: its words (lower case, plurals singular, no stop words or
    units), commits, sizes and rates ("1 gb", "300 trx/s"), whole numbers ("0", "300") and a word with the
    number or numbers after it ("repeat 3", "zstd 3"; "runs 1, 2 and 4", "runs 1 / 2", "runs 1-5": "run 1",
    "run 2", ...). Figures with a decimal point, ratios, times and percentages are not."""
    found: set[str] = set()
    previous = None  # the word the numbers after it belong to
    last = None  # the whole number just read, when a list or a range of them may go on
    range_from = None  # the start of a range ("1-5") whose end comes next
    for match in _SCOPE_WORD.finditer(text.lower().replace("`", "").replace("*", "")):
        commit, integer, fraction, unit, word, sign = match.group(1, 2, 3, 4, 5, 6)
        if commit or word:
            if last is not None and word in ("and", "or", "to"):
                range_from = last if word == "to" else None
                continue
            previous = None if word in _STOP else _stem(commit or word)
            last = range_from = None
            if previous:
                found.add(previous)
            continue
        if sign:
            if last is not None and sign in ",/-–":
                range_from = last if sign in "-–" else None
            else:
                previous = last = range_from = None
            continue
        if integer and not fraction:
            number = int(integer.replace(",", ""))
            if unit:
                found.add(f"{number} {_stem(unit)}")
            else:
                found.add(str(number))
                if previous:
                    start = range_from if range_from is not None and 0 <= number - range_from <= 20 else number
                    found.update(f"{previous} {n}" for n in range(start, number + 1))
                    last, range_from = number, None
                    continue
        previous = last = range_from = None
    return found


class Scoped(NamedTuple):
    """A unit of a results file with the words that name it."""

    unit: Unit
    numbers: frozenset[str]
    key: frozenset[str]  # the words that name the unit's scope
    need: int  # how many of them a quoting clause must name
    heading_key: frozenset[str]  # a row whose label recurs under another heading: its own heading's words
    rare: frozenset[str] = frozenset()  # a sentence's words that name it alone


def _label_words(label: tuple[str, ...]) -> set[str]:
    """The scope words of a row's label; a numbered row's is its column and number alone ("run 2", "# 7")."""
    ordinal = re.fullmatch(r"(\S+) (\d+)", label[0].lower()) if len(label) == 1 else None
    if ordinal and _ORDINAL.fullmatch(ordinal.group(1)):
        return {f"{_stem(ordinal.group(1))} {ordinal.group(2)}"}
    return scope_words(" ".join(label))


def scopes(markdown: str) -> list[Scoped]:
    """A results file's units (``units(rows=True)``), each with the words that name it.

    A table row is named by its label's distinguishing words: those in at most half the rows of its table and at
    most half the file's units ("relay-kill", "1 gb", "zstd 3", "peak", "vmhwm"; all its label words when none
    are); a quoting clause names two of them, or the one there is. When the same label recurs under another
    heading (the oltp and the bulk load of fanout_real.md), the clause also names a word of the row's own heading
    that the other headings lack. A sentence, list item or heading is named, with the words of its section's
    heading, by one rare word (in at most two of the file's units, or its rarest word when none is that rare), or
    by two words that are in at most a tenth of the file's units (one- and two-digit numbers left out)."""
    read = units(markdown, rows=True)
    frequency: Counter[str] = Counter()
    for unit in read:
        frequency.update(scope_words(unit.text))
    in_rows: dict[int, Counter[str]] = defaultdict(Counter)
    rows: Counter[int] = Counter()
    headings_of: dict[tuple[str, ...], set[str]] = defaultdict(set)
    heading_words = {unit.text: scope_words(unit.text) for unit in read if unit.text == unit.context}
    for unit in read:
        if unit.label is not None:
            in_rows[unit.table].update(_label_words(unit.label))
            rows[unit.table] += 1
            headings_of[unit.label].add(unit.context)
    out = []
    for unit in read:
        heading_key: frozenset[str] = frozenset()
        rare: frozenset[str] = frozenset()
        if unit.label is not None:
            words = _label_words(unit.label)
            key = {w for w in words
                   if in_rows[unit.table][w] * 2 <= rows[unit.table] and frequency[w] * 2 <= len(read)} or words
            others = headings_of[unit.label] - {unit.context}
            if others:
                heading_key = frozenset(scope_words(unit.context) - set().union(*map(scope_words, others)))
        else:
            words = {w for w in scope_words(unit.text) | heading_words.get(unit.context, set())
                     if not (w.isdigit() and len(w) < 3)}
            rarest = min((frequency[w] for w in words), default=0)
            rare = frozenset(w for w in words if frequency[w] <= max(2, rarest))
            key = {w for w in words if frequency[w] * 10 <= len(read)} | rare
        out.append(Scoped(unit, frozenset(numbers_in(unit.text)), frozenset(key), min(2, len(key)), heading_key,
                          rare))
    return out


def _named(scoped: Scoped, words: set[str]) -> bool:
    return bool(scoped.rare & words) or (bool(scoped.key) and len(scoped.key & words) >= scoped.need
                                         and (not scoped.heading_key or bool(scoped.heading_key & words)))


def clauses(text: str) -> list[tuple[str, str]]:
    """(clause, the text that names its scope) for each clause of a sentence: the text between semicolons,
    named by itself and what comes before it in the sentence (a semicolon starts another claim; the sentence's
    start still says what is measured)."""
    parts = text.split(";")
    return [(part, ";".join(parts[: number + 1])) for number, part in enumerate(parts)]


_SIZE = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)\s?(?:KB|kB|MB|GB|KiB|MiB|GiB|trx/s|cores?)")


def out_of_scope(unit: Unit, read: list[list[Scoped]]) -> list[str]:
    """The figures of a doc unit (as written) that no unit of the cited files (``read``: ``scopes`` of each file,
    and of each version the CHANGELOG names) holds in the unit's scope. A figure of a clause is in scope when it
    sits in a row or sentence that the clause names (with what comes before it in the sentence, and for a table
    cell its row's other cells and its column's name), or in a sentence of the file that also holds another
    figure of the clause (a median with its range, a figure with the one it is compared with; not a whole size or
    rate, nor a round count). A whole size or rate ("1 GB", "300 trx/s") names a scope rather than measuring one:
    it is only looked for (the test above)."""
    every = [scoped for version in read for scoped in version]
    bad = []
    for clause, naming in clauses(unit.text):
        found = figures(clause)
        named = scope_words(naming + " " + unit.context)
        partners = {value for written, value in found if not _SIZE.fullmatch(written)
                    and not (re.fullmatch(r"[\d,]+", written) and int(value) % 100 == 0)}
        for written, value in found:
            if _SIZE.fullmatch(written):
                continue
            if not any(_named(scoped, named) or (scoped.unit.label is None and scoped.numbers & (partners - {value}))
                       for scoped in every if value in scoped.numbers):
                bad.append(written)
    return bad


# A measured figure: what must never appear in a sentence that names no results file.
MEASURE = re.compile(
    r"(?<![\w.])(?:\d+\.\d+|\d{2,})x\b(?! ?\d)"  # a ratio: 0.88x, 62.2x, 40x (not a multiplier such as 2x)
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:MB|MiB|GB)\s(?:RSS|resident)\b"  # memory
    r"|\bRSS\b(?:(?!\b(?:within|under|below|at most|up to)\b)[^.;]){0,40}?\d\s?(?:MB|MiB)\b"  # (a bound is no measurement)
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:MB|GB)/s\b"  # throughput
    r"|(?<![\w.])\d+(?:[.,]\d+)*\s?(?:µs|us|ns)\b"  # per-event or per-call cost
    r"|\d\s?%\sof\s(?:a|one)\score|(?<![\w.])\d+(?:\.\d+)?\s(?:of\s)?(?:a\s)?cores?\b(?![\s-](?:of|machine|hours))"  # CPU
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:CPU\s)?s(?:econds?)?\s?(?:per|/|a)\s?GB\b"  # CPU or time per GB
    r"|\bp(?:50|90|99)\b(?!\s(?:above|below|over|under))[^.;]{0,30}?\d(?:\.\d+)?\s?ms\b"  # latency
    r"|\b\d{1,3}(?:,\d{3})+\s+tests\b|\bminutes?\b[^.;]{0,10}?\bsuite\b"  # the suite's size and time
)


def _doc_units():
    for doc in DOCS:
        for unit in units((REPO / doc).read_text()):
            yield doc, unit


def _results_text(name: str) -> str:
    return (RESULTS / name).read_text(errors="replace")


_SCOPES: dict[tuple[str, str | None], list[Scoped]] = {}


def _scopes_of(name: str, commit: str | None = None) -> list[Scoped]:
    """``scopes`` of a results file now, or at a commit (empty if the file did not exist there)."""
    if (name, commit) not in _SCOPES:
        _SCOPES[name, commit] = scopes(_results_text(name) if commit is None else _results_at(commit, name))
    return _SCOPES[name, commit]


# -- the tests ----------------------------------------------------------------------------------------------------


def test_every_figure_in_a_sentence_that_cites_a_results_file_is_in_that_file():
    stale = []
    checked = 0
    for doc, unit in _doc_units():
        cited = citations(unit.text)
        if not cited:
            continue
        have: set[str] = set()
        for name in cited:
            have |= numbers_in(_results_text(name))
        for written, value in figures(unit.text):
            checked += 1
            if value not in have:
                stale.append(f"{doc}:{unit.line}: {written!r} is not in {', '.join(cited)}: {unit.text[:200]}")
    assert checked > 100, f"only {checked} figures checked: the convention is not being used"
    assert not stale, "figures not in the results file their sentence cites:\n" + "\n".join(stale)


def test_every_figure_sits_in_the_row_or_sentence_of_its_file_that_the_sentence_names():
    """The same figures, each in a row or sentence of the cited file with the scope the doc gives it
    (``out_of_scope``): not a p95 of one kind next to the name of another."""
    wrong = []
    checked = 0
    for doc, unit in _doc_units():
        cited = citations(unit.text)
        if not cited:
            continue
        checked += len(figures(unit.text))
        for written in out_of_scope(unit, [_scopes_of(name) for name in cited]):
            wrong.append(f"{doc}:{unit.line}: {written!r} is in no row or sentence of {', '.join(cited)} that the "
                         f"sentence names: {unit.text[:300]}")
    assert checked > 100, f"only {checked} figures checked: the convention is not being used"
    assert not wrong, (f"{len(wrong)} of {checked} figures outside the scope their sentence gives them (name the "
                       "row's label, the load, the kind; or quote the row the sentence names):\n" + "\n".join(wrong))


def test_no_measured_figure_without_a_results_file():
    uncited = []
    for doc, unit in _doc_units():
        if citations(unit.text):
            continue
        found = [m.group(0) for m in MEASURE.finditer(unit.text)]
        if found:
            uncited.append(f"{doc}:{unit.line}: {found} in a sentence that names no benchmarks/results/ file: "
                           f"{unit.text[:200]}")
    assert not uncited, "measured figures with no results file:\n" + "\n".join(uncited)


def test_the_checks_catch_a_stale_and_an_uncited_figure():
    """The two rules above, on text made to break them (so a regex that matches nothing cannot pass them)."""
    stale = "The relay spends 0.95x the CPU per byte, range 0.87-0.9876 (`benchmarks/results/fanout_real.md`)."
    [unit] = units(stale)
    have = numbers_in(_results_text("fanout_real.md"))
    assert citations(unit.text) == ["fanout_real.md"]
    assert [w for w, v in figures(unit.text) if v not in have] == ["0.9876"]
    assert "0.95" in have  # the previous run's figure is still named in the findings: it is quoted as such
    assert MEASURE.search("it uses 0.88x the CPU at 54.7 MB RSS")
    assert MEASURE.search("about 1,580 tests")
    assert not MEASURE.search("checkpoint every 16 MB / 10 s, max_binlog_size 1 GB, a 60 s timeout")
    assert MEASURE.search("peak RSS from 177 to 50 MB") and not MEASURE.search("RSS comes back to within 96 MiB")


def test_the_scope_check_catches_a_figure_from_the_wrong_row():
    """The scope rule on real results files: the relay-kill row's kill -> writable median and p95 pass quoted for
    the relay-kill kind and fail quoted for another kind; the 100 MB backlog's failover times pass at 100 MB and
    fail at 1 GB; a clause quoting figures of two rows passes when it names both. And a results file is read the
    way the rule says: rows with their labels, a recurring label with its heading."""
    def wrong(text: str, name: str) -> list[str]:
        [unit] = units(text)
        assert citations(unit.text) == [name]
        return out_of_scope(unit, [_scopes_of(name)])

    kinds = "Kill -> writable in the {} kind: median 0.80 s (p95 3.37 s) (`benchmarks/results/lossless_trials.md`)."
    assert wrong(kinds.format("relay-kill"), "lossless_trials.md") == []
    assert wrong(kinds.format("promote-kill"), "lossless_trials.md") == ["0.80 s", "3.37 s"]
    assert wrong(kinds.format("fallback"), "lossless_trials.md") == ["0.80 s", "3.37 s"]
    backlog = "Relay -> R2 at a {} backlog: 0.037 s, direct 0.017 s (`benchmarks/results/failover_time.md`)."
    assert wrong(backlog.format("100 MB"), "failover_time.md") == []
    assert wrong(backlog.format("1 GB"), "failover_time.md") == ["0.037 s", "0.017 s"]
    both = ("Relay -> R2 0.037 s at 100 MB; 0.139 s at {} (`benchmarks/results/failover_time.md`).")
    assert wrong(both.format("1 GB"), "failover_time.md") == []
    assert wrong(both.format("0"), "failover_time.md") == ["0.139 s"]

    assert {"run 0", "run 1", "run 2", "run 4", "zstd 3", "1 gb"} <= scope_words("runs 0-2 and 4, zstd 3 at 1 GB")
    read = {scoped.unit.label: scoped for scoped in _scopes_of("lossless_trials.md") if scoped.unit.label}
    assert read["relay-kill",].key == {"relay-kill"}
    assert read["# 7",].key == {"# 7"}  # a numbered row is named by its column and number: a trial, not quotable
    oltp = [scoped for scoped in _scopes_of("fanout_real.md") if scoped.unit.label
            and scoped.unit.label[0] == "**relay CPU per MB / master dump threads CPU per MB**"]
    assert len(oltp) == 2 and {"oltp"} <= oltp[0].heading_key and {"bulk", "8 kb"} <= oltp[1].heading_key


# -- CHANGELOG.md: figures as they were, checkable -----------------------------------------------------------------
#
# The CHANGELOG is history: an entry quotes what was measured when it was written. The rules it is held to: a
# sentence that names a results file quotes only figures that file holds now, or held at a commit the sentence names
# ("as `fanout_real.md` recorded them at abef903"; read with git show), each in the row or sentence the sentence
# names, in one of those versions; a figure no version of its file held is wrong. And a measured figure names its
# results file here too: one that no results file ever held is not quoted (the entry says what changed, and where
# today's figure is).

_HASH = re.compile(r"(?<![\w-])[0-9a-f]{7,12}(?![\w-])")


def _results_at(commit: str, name: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:benchmarks/results/{name}"], capture_output=True,
                          text=True, errors="replace")
    return done.stdout if done.returncode == 0 else ""


def _changelog_citing():
    """(unit, cited files, commits it names) for each CHANGELOG sentence that names a results file."""
    for unit in units((REPO / "CHANGELOG.md").read_text()):
        cited = citations(unit.text)
        if cited:
            commits = [h for h in _HASH.findall(unit.text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
            yield unit, cited, commits


def test_every_figure_the_changelog_cites_is_in_that_file_now_or_at_the_commit_it_names():
    if not (REPO / ".git").exists():
        pytest.fail("the CHANGELOG check needs the git history (.git)")
    stale, checked = [], 0
    for unit, cited, commits in _changelog_citing():
        have: set[str] = set()
        for name in cited:
            have |= numbers_in(_results_text(name))
            for commit in commits:
                have |= numbers_in(_results_at(commit, name))
        for written, value in figures(unit.text):
            checked += 1
            if value not in have:
                stale.append(f"CHANGELOG.md:{unit.line}: {written!r} is in no version of {', '.join(cited)} "
                             f"(now{', at ' + ', '.join(commits) if commits else ''}): {unit.text[:200]}")
    assert checked > 50, f"only {checked} CHANGELOG figures checked"
    assert not stale, "CHANGELOG figures that their results file never held:\n" + "\n".join(stale)


def test_every_figure_the_changelog_cites_sits_in_the_row_or_sentence_it_names_now_or_then():
    """The scope rule of the docs, against the file now or at a commit the sentence names (any one version)."""
    if not (REPO / ".git").exists():
        pytest.fail("the CHANGELOG check needs the git history (.git)")
    wrong, checked = [], 0
    for unit, cited, commits in _changelog_citing():
        checked += len(figures(unit.text))
        read = [_scopes_of(name, commit) for name in cited for commit in [None, *commits]]
        for written in out_of_scope(unit, read):
            wrong.append(f"CHANGELOG.md:{unit.line}: {written!r} is in no row or sentence that the sentence names "
                         f"of {', '.join(cited)} (now{', at ' + ', '.join(commits) if commits else ''}): "
                         f"{unit.text[:300]}")
    assert checked > 50, f"only {checked} CHANGELOG figures checked"
    assert not wrong, (f"{len(wrong)} of {checked} CHANGELOG figures outside the scope their sentence gives them:\n"
                       + "\n".join(wrong))


def test_no_measured_figure_in_the_changelog_without_a_results_file():
    """History too: a measured figure names the results file it comes from, now or at the commit that held it
    ("`fanout_real.md` at abef903"). A figure no results file ever held is not quoted: the entry says what changed
    and where today's figure is."""
    uncited = []
    for unit in units((REPO / "CHANGELOG.md").read_text()):
        if citations(unit.text):
            continue
        found = [m.group(0) for m in MEASURE.finditer(unit.text)]
        if found:
            uncited.append(f"CHANGELOG.md:{unit.line}: {found} in a sentence that names no results file: "
                           f"{unit.text[:300]}")
    assert not uncited, f"{len(uncited)} CHANGELOG sentences with measured figures and no results file:\n" + \
        "\n".join(uncited)


# -- results files: provenance ------------------------------------------------------------------------------------

_COMMIT_LINE = re.compile(r"^- (?:relayproxy )?commit: ([0-9a-f]{7,40})\b", re.M)
NOT_KEPT = "is not in this repository's history"


def _results_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*.md"))


def _in_history(commit: str) -> bool:
    done = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.parametrize("path", _results_files(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_each_results_file_names_a_commit_in_the_history_or_says_it_is_not(path):
    if not (REPO / ".git").exists():
        pytest.fail("the provenance check needs the git history (.git)")
    text = path.read_text(errors="replace")
    named = re.findall(r"(?:relayproxy commit|commit):? `?([0-9a-f]{7,40})\b", text)
    assert named, f"{path.name} names no commit"
    # Every abbreviated hash it mentions, not only those after the word "commit" ("the previous run (5be452e)").
    hashes = {h for h in re.findall(r"(?<![\w-])[0-9a-f]{7,12}(?![\w-])", text)
              if re.search(r"[a-f]", h) and re.search(r"\d", h)}
    for commit in sorted(set(named) | hashes):
        if not _in_history(commit):
            assert re.search(rf"{commit}\b[^\n]*{re.escape(NOT_KEPT)}", text), (
                f"{path.name} names commit {commit}, which is not in the history, without saying so: add "
                f"'commit {commit} {NOT_KEPT}: ...' to it")
    assert re.search(r"^- (?:[^\n]*; )?tree: (clean|dirty)\b", text, re.M), (
        f"{path.name} does not say whether the tree was clean (a '- tree: clean ...' or '- tree: dirty ...' line; "
        "a run whose tree nobody recorded is run again)")
