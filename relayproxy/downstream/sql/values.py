"""MySQL's value rules for the expressions the relay evaluates: implicit number and text conversion, truth,
comparison, LIKE patterns, dates, and how a value is put into a result set."""

from __future__ import annotations

import datetime as _dt
import functools
import re
from typing import Any


def _to_number(v: Any) -> int | float:
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


def _truthy(v: Any) -> bool:
    return _to_number(v) != 0


def _to_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    return str(_output(v))


def _compare(a: Any, b: Any) -> int | None:
    if a is None or b is None:
        return None
    if isinstance(a, _dt.datetime) or isinstance(b, _dt.datetime):
        x, y = _to_datetime(a), _to_datetime(b)
        if x is None or y is None:
            return None
        return (x > y) - (x < y)
    if isinstance(a, (str, bytes)) and isinstance(b, (str, bytes)):
        x_s, y_s = _to_text(a).casefold().rstrip(" "), _to_text(b).casefold().rstrip(" ")
        return (x_s > y_s) - (x_s < y_s)
    x, y = _to_number(a), _to_number(b)
    return (x > y) - (x < y)


@functools.lru_cache(maxsize=256)
def _like_regex(pattern: str, escape: str = "\\") -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.IGNORECASE | re.DOTALL)


_DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d", "%Y%m%d%H%M%S",
                     "%Y%m%d")


def _to_datetime(v: Any) -> _dt.datetime | None:
    if isinstance(v, _dt.datetime):
        return v
    text = _to_text(v).strip().replace("T", " ")
    for fmt in _DATETIME_FORMATS:
        try:
            return _dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
    return None


def _output(v: Any) -> Any:
    """A value as the result set carries it (str, bytes, int, float or None)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, _dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, _dt.date):
        return v.isoformat()
    return v
