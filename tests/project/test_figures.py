"""One source of truth for the figures the README and docs/ quote: the results files under benchmarks/results/.

The convention, which these tests hold the text to:

- a measured figure (a ratio such as 0.88x, a latency in ms or µs, MB/s, MB of RSS, CPU per GB, % of a core, a
  duration measured by a benchmark) sits in a sentence, a list item's sentence or a table cell that names the
  results file it comes from: `benchmarks/results/NAME.md`, or `NAME.md` when that file is in benchmarks/results/;
- every number with a decimal point, a unit or a thousands separator in such a sentence appears in one of the files
  it names (ranges and repeats included), so a figure goes stale the moment its results file changes under it;
- a sentence that names no results file quotes no measured figure (configuration values, limits and defaults are
  not measurements and are not matched by the patterns below).

And the results files themselves: each names the commit it measured, and that commit is in this repository's
history, or the file says plainly that it is not (re-run to refresh), and each says whether the tree was clean.
"""

from __future__ import annotations

import re
import subprocess
from decimal import Decimal, InvalidOperation
from pathlib import Path

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


def units(markdown: str) -> list[tuple[int, str]]:
    """(first line number, text) for every sentence of the prose, list items included, and every table cell;
    fenced code blocks (sample output, commands) and headings are left out."""
    result: list[tuple[int, str]] = []
    block: list[str] = []
    start = 0
    fenced = False

    def flush():
        if block:
            for sentence in _sentences(" ".join(line.strip() for line in block)):
                result.append((start, sentence))
            block.clear()

    for number, line in enumerate(markdown.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not stripped or stripped.startswith("#"):
            flush()
            continue
        if stripped.startswith("|"):
            flush()
            for cell in stripped.strip("|").split("|"):
                result.append((number, cell.strip()))
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


# A measured figure: what must never appear in a sentence that names no results file.
MEASURE = re.compile(
    r"(?<![\w.])(?:\d+\.\d+|\d{2,})x\b(?! ?\d)"  # a ratio: 0.88x, 62.2x, 40x (not a multiplier such as 2x)
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:MB|MiB|GB)\s(?:RSS|resident)\b|\bRSS\b[^.;]{0,40}?\d\s?(?:MB|MiB)\b"  # memory
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:MB|GB)/s\b"  # throughput
    r"|(?<![\w.])\d+(?:[.,]\d+)*\s?(?:µs|us|ns)\b"  # per-event or per-call cost
    r"|\d\s?%\sof\s(?:a|one)\score|(?<![\w.])\d+(?:\.\d+)?\s(?:of\s)?(?:a\s)?cores?\b(?![\s-](?:of|machine|hours))"  # CPU
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:CPU\s)?s(?:econds?)?\s?(?:per|/|a)\s?GB\b"  # CPU or time per GB
    r"|\bp(?:50|90|99)\b(?!\s(?:above|below|over|under))[^.;]{0,30}?\d(?:\.\d+)?\s?ms\b"  # latency
    r"|\b\d{1,3}(?:,\d{3})+\s+tests\b|\bminutes?\b[^.;]{0,10}?\bsuite\b"  # the suite's size and time
)


def _doc_units():
    for doc in DOCS:
        for line, text in units((REPO / doc).read_text()):
            yield doc, line, text


def _results_text(name: str) -> str:
    return (RESULTS / name).read_text(errors="replace")


# -- the tests ----------------------------------------------------------------------------------------------------


def test_every_figure_in_a_sentence_that_cites_a_results_file_is_in_that_file():
    stale = []
    checked = 0
    for doc, line, text in _doc_units():
        cited = citations(text)
        if not cited:
            continue
        have: set[str] = set()
        for name in cited:
            have |= numbers_in(_results_text(name))
        for written, value in figures(text):
            checked += 1
            if value not in have:
                stale.append(f"{doc}:{line}: {written!r} is not in {', '.join(cited)}: {text[:200]}")
    assert checked > 100, f"only {checked} figures checked: the convention is not being used"
    assert not stale, "figures not in the results file their sentence cites:\n" + "\n".join(stale)


def test_no_measured_figure_without_a_results_file():
    uncited = []
    for doc, line, text in _doc_units():
        if citations(text):
            continue
        found = [m.group(0) for m in MEASURE.finditer(text)]
        if found:
            uncited.append(f"{doc}:{line}: {found} in a sentence that names no benchmarks/results/ file: {text[:200]}")
    assert not uncited, "measured figures with no results file:\n" + "\n".join(uncited)


def test_the_checks_catch_a_stale_and_an_uncited_figure():
    """The two rules above, on text made to break them (so a regex that matches nothing cannot pass them)."""
    stale = "The relay spends 0.95x the CPU per byte, range 0.87-0.9876 (`benchmarks/results/fanout_real.md`)."
    [(_, sentence)] = units(stale)
    have = numbers_in(_results_text("fanout_real.md"))
    assert citations(sentence) == ["fanout_real.md"]
    assert [w for w, v in figures(sentence) if v not in have] == ["0.9876"]
    assert "0.95" in have  # the previous run's figure is still named in the findings: it is quoted as such
    assert MEASURE.search("it uses 0.88x the CPU at 54.7 MB RSS")
    assert MEASURE.search("about 1,580 tests")
    assert not MEASURE.search("checkpoint every 16 MB / 10 s, max_binlog_size 1 GB, a 60 s timeout")


# -- CHANGELOG.md: figures as they were, checkable -----------------------------------------------------------------
#
# The CHANGELOG is history: an entry quotes what was measured when it was written. The rule it is held to: a sentence
# that names a results file quotes only figures that file holds now, or held at a commit the sentence names ("as
# `fanout_real.md` recorded them at abef903"; read with git show). A figure no version of its file held is wrong.

_HASH = re.compile(r"(?<![\w-])[0-9a-f]{7,12}(?![\w-])")


def _results_at(commit: str, name: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:benchmarks/results/{name}"], capture_output=True,
                          text=True, errors="replace")
    return done.stdout if done.returncode == 0 else ""


def test_every_figure_the_changelog_cites_is_in_that_file_now_or_at_the_commit_it_names():
    if not (REPO / ".git").exists():
        pytest.fail("the CHANGELOG check needs the git history (.git)")
    stale, checked = [], 0
    for line, text in units((REPO / "CHANGELOG.md").read_text()):
        cited = citations(text)
        if not cited:
            continue
        commits = [h for h in _HASH.findall(text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
        have: set[str] = set()
        for name in cited:
            have |= numbers_in(_results_text(name))
            for commit in commits:
                have |= numbers_in(_results_at(commit, name))
        for written, value in figures(text):
            checked += 1
            if value not in have:
                stale.append(f"CHANGELOG.md:{line}: {written!r} is in no version of {', '.join(cited)} "
                             f"(now{', at ' + ', '.join(commits) if commits else ''}): {text[:200]}")
    assert checked > 50, f"only {checked} CHANGELOG figures checked"
    assert not stale, "CHANGELOG figures that their results file never held:\n" + "\n".join(stale)


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
