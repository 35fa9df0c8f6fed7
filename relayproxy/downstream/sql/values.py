"""MySQL's value rules for the expressions the relay evaluates: implicit number and text conversion, truth,
comparison, LIKE patterns, dates, and how a value is put into a result set."""

from __future__ import annotations

import datetime as _dt
import functools
import re
from typing import Any


def to_number(v: Any) -> int | float:
    """MySQL's implicit string-to-number conversion: the longest numeric prefix, 0 when there is none."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, _dt.datetime):
        return int(v.strftime("%Y%m%d%H%M%S"))
    text = v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)
    m = re.match(r"\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", text)
    if m is None:
        return 0
    number = m.group().strip()
    try:
        return int(number)
    except ValueError:
        return float(number)


def truthy(v: Any) -> bool:
    return to_number(v) != 0


def to_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    return str(output_value(v))


def compare_values(a: Any, b: Any) -> int | None:
    if a is None or b is None:
        return None
    if isinstance(a, _dt.datetime) or isinstance(b, _dt.datetime):
        x_d, y_d = to_datetime(a), to_datetime(b)
        if x_d is None or y_d is None:
            return None
        return (x_d > y_d) - (x_d < y_d)
    if isinstance(a, (str, bytes)) and isinstance(b, (str, bytes)):
        x_s, y_s = to_text(a).casefold().rstrip(" "), to_text(b).casefold().rstrip(" ")
        return (x_s > y_s) - (x_s < y_s)
    x_n, y_n = to_number(a), to_number(b)
    return (x_n > y_n) - (x_n < y_n)


# -- LIKE ------------------------------------------------------------------------------------------------
# Linear in the subject per segment: the pattern is cut at each % into segments of fixed length (literal
# characters and _), the first anchored at the start, the last at the end, each one between them matched at
# its leftmost place after the one before (leftmost is always the best choice: what follows a % can start
# anywhere). No backtracking regex: '%a%a%ab' over a long run of a's no longer costs n^3.


def _fold(text: str) -> str:
    """Case-folded character by character (one character for one, so positions stay aligned)."""
    low = text.lower()
    if len(low) == len(text):  # no character lowers to several: the fold is one for one
        return low
    return "".join(c if len(f := c.lower()) != 1 else f for c in text)


@functools.lru_cache(maxsize=256)
def _like_segments(pattern: str, escape: str = "\\") -> tuple[tuple[int, tuple[tuple[int, str], ...]], ...]:
    """The pattern as segments between %: (length, ((offset, literal run), ...)), runs case-folded.

    MySQL's rules: ``_`` is one character, ``%`` any run, the escape character makes the next one literal (an
    escape character at the very end is itself literal)."""
    segments: list[list[str | None]] = [[]]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape and i + 1 < n:
            segments[-1].append(pattern[i + 1])
            i += 2
            continue
        if c == "%":
            segments.append([])
        else:
            segments[-1].append(None if c == "_" else c)
        i += 1
    out = []
    for chars in segments:
        runs: list[tuple[int, str]] = []
        j = 0
        while j < len(chars):
            if chars[j] is None:
                j += 1
                continue
            k = j
            while k < len(chars) and chars[k] is not None:
                k += 1
            runs.append((j, _fold("".join(chars[j:k]))))  # type: ignore[arg-type]
            j = k
        out.append((len(chars), tuple(runs)))
    return tuple(out)


def _charge(budget: Any, chars: int) -> None:
    if budget is not None:
        budget.charge(1 + (chars >> 10))


def _segment_at(text: str, start: int, runs: tuple[tuple[int, str], ...], budget: Any) -> bool:
    for offset, run in runs:
        _charge(budget, len(run))
        if not text.startswith(run, start + offset):
            return False
    return True


def _segment_from(text: str, pos: int, length: int, runs: tuple[tuple[int, str], ...], budget: Any) -> int:
    """The leftmost start >= pos where the segment matches, or -1."""
    if not runs:
        return pos if pos + length <= len(text) else -1
    offset, anchor = runs[0]
    j = text.find(anchor, pos + offset)
    last = pos
    while j >= 0:
        start = j - offset
        if start + length > len(text):
            return -1
        _charge(budget, j - last)
        last = j
        if _segment_at(text, start, runs[1:], budget):
            return start
        j = text.find(anchor, j + 1)
    return -1


def like_match(subject: str, pattern: str, escape: str = "\\", budget: Any = None) -> bool:
    """``subject LIKE pattern [ESCAPE escape]``, case-insensitive, in time linear in the subject per segment
    (each step charged to ``budget``, a ``limits.Budget``, when given)."""
    segments = _like_segments(pattern, escape)
    text = _fold(subject)
    _charge(budget, len(text))
    n = len(text)
    first_len, first_runs = segments[0]
    if len(segments) == 1:
        return n == first_len and _segment_at(text, 0, first_runs, budget)
    if first_len > n or not _segment_at(text, 0, first_runs, budget):
        return False
    pos = first_len
    for length, runs in segments[1:-1]:
        start = _segment_from(text, pos, length, runs, budget)
        if start < 0:
            return False
        pos = start + length
    last_len, last_runs = segments[-1]
    start = n - last_len
    return start >= pos and _segment_at(text, start, last_runs, budget)


_DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d", "%Y%m%d%H%M%S",
                     "%Y%m%d")


def to_datetime(v: Any) -> _dt.datetime | None:
    if isinstance(v, _dt.datetime):
        return v
    text = to_text(v).strip().replace("T", " ")
    for fmt in _DATETIME_FORMATS:
        try:
            return _dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
    return None


def output_value(v: Any) -> Any:
    """A value as the result set carries it (str, bytes, int, float or None)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, _dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, _dt.date):
        return v.isoformat()
    return v
