"""GTID arithmetic: MySQL GTID sets (text, binary, algebra) and MariaDB GTID positions and binlog states."""

# MySQL rules follow sql/rpl_gtid_set.cc and libs/mysql/gtid/{uuid,tag,tsid}.cpp (8.3+,
# with tags); MariaDB rules follow sql/rpl_gtid.cc and Gtid_list_log_event.

from __future__ import annotations

import re
import struct
import uuid as _uuid
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from functools import lru_cache
from operator import itemgetter
from typing import NamedTuple

from .constants import GTID_LIST_COUNT_MASK
from .events import BinlogFormatError
from .serialization import read_varlen_uint, string_size, write_string

__all__ = [
    "GNO_MAX",
    "GNO_END",
    "TAG_MAX_LENGTH",
    "GtidSet",
    "MariaGtid",
    "MariaGtidPosition",
    "MariaBinlogState",
]

# ---------------------------------------------------------------------------------------
# MySQL
# ---------------------------------------------------------------------------------------

#: Largest valid GNO.  MySQL's GNO_END is INT64_MAX and is exclusive.
GNO_MAX = (1 << 63) - 2
#: Exclusive upper bound of any interval (``end`` of ``[start, end)``).
GNO_END = (1 << 63) - 1
TAG_MAX_LENGTH = 32

_FORMAT_UNTAGGED = 0
_FORMAT_TAGGED = 1
_UNTAGGED_SID_COUNT_MASK = (1 << 56) - 1
_TAGGED_SID_COUNT_MAX = (1 << 48) - 1

_U64 = struct.Struct("<Q")

# MySQL's isspace() set; Python's str.strip() would also eat Unicode spaces.
_WHITESPACE = " \t\n\r\v\f"
_UUID_TEXT_RE = re.compile(
    r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\Z"
)
_UUID_HEX_RE = re.compile(r"[0-9A-Fa-f]{32}\Z")
_TAG_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}\Z")
_INTERVAL_RE = re.compile(r"([0-9]+)[ \t\n\r\v\f]*(?:-[ \t\n\r\v\f]*([0-9]+))?\Z")

_start_of = itemgetter(0)
_end_of = itemgetter(1)

Interval = tuple[int, int]
Tsid = tuple[bytes, str]


@lru_cache(maxsize=4096)
def _uuid_text(sid: bytes) -> str:
    h = sid.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _parse_uuid_text(text: str, *, allow_compact: bool) -> bytes | None:
    if _UUID_TEXT_RE.match(text):
        return bytes.fromhex(text.replace("-", ""))
    if allow_compact and _UUID_HEX_RE.match(text):
        return bytes.fromhex(text)
    return None


def _sid_bytes(sid) -> bytes:
    """Normalise a server UUID given as 16 bytes, ``uuid.UUID`` or text to its 16 bytes."""
    if type(sid) is bytes and len(sid) == 16:
        return sid
    if isinstance(sid, _uuid.UUID):
        return sid.bytes
    if isinstance(sid, str):
        parsed = _parse_uuid_text(sid.strip(_WHITESPACE), allow_compact=True)
        if parsed is None:
            raise ValueError(f"invalid server UUID {sid!r}")
        return parsed
    if isinstance(sid, (bytes, bytearray, memoryview)):
        data = bytes(sid)
        if len(data) == 16:
            return data
        raise ValueError(f"a binary server UUID has 16 bytes, not {len(data)}")
    raise TypeError(f"server UUID must be 16 bytes, uuid.UUID or str, not {type(sid).__name__}")


@lru_cache(maxsize=1024)
def _normalise_tag(tag: str) -> str:
    """Validate a GTID tag and return it in MySQL's normal form (lower case)."""
    if not isinstance(tag, str):
        raise TypeError(f"GTID tag must be str, not {type(tag).__name__}")
    if not tag:
        return ""
    if not _TAG_RE.match(tag):
        raise ValueError(
            f"invalid GTID tag {tag!r}: a tag is a letter or '_' followed by at most 31 "
            "letters, digits or '_'"
        )
    return tag.lower()


def _check_gno(gno: int) -> None:
    if type(gno) is not int:
        raise TypeError(f"GNO must be int, not {type(gno).__name__}")
    if not 1 <= gno <= GNO_MAX:
        raise ValueError(f"GNO {gno} is outside 1..{GNO_MAX}")


def _union_intervals(a: list[Interval], b: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    i = j = 0
    len_a, len_b = len(a), len(b)
    while i < len_a or j < len_b:
        if j >= len_b or (i < len_a and a[i][0] <= b[j][0]):
            start, end = a[i]
            i += 1
        else:
            start, end = b[j]
            j += 1
        # Touching intervals merge, as in MySQL's add_gno_interval: [1,3) + [3,5) = [1,5).
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _subtract_intervals(a: list[Interval], b: list[Interval]) -> list[Interval]:
    result: list[Interval] = []
    j = 0
    len_b = len(b)
    for start, end in a:
        while j < len_b and b[j][1] <= start:
            j += 1
        cursor = start
        k = j
        while k < len_b and b[k][0] < end:
            cut_start, cut_end = b[k]
            if cut_start > cursor:
                result.append((cursor, cut_start))
            if cut_end > cursor:
                cursor = cut_end
            if cut_end >= end:
                break  # this cut may reach into the next interval of a: keep it
            k += 1
        j = k
        if cursor < end:
            result.append((cursor, end))
    return result


def _intersect_intervals(a: list[Interval], b: list[Interval]) -> list[Interval]:
    result: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if start < end:
            result.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return result


def _intervals_subset(sub: list[Interval], sup: list[Interval]) -> bool:
    j = 0
    for start, end in sub:
        while j < len(sup) and sup[j][1] <= start:
            j += 1
        if j == len(sup) or sup[j][0] > start or sup[j][1] < end:
            return False
    return True


def _intervals_overlap(a: list[Interval], b: list[Interval]) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if max(a[i][0], b[j][0]) < min(a[i][1], b[j][1]):
            return True
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return False


class GtidSet:
    """A MySQL GTID set: per (server UUID, tag), sorted and merged ``[start, end)`` GNO intervals.

    Text is MySQL's (``uuid:1-5:7,uuid2:tag:1-3``); binary is the encoding of
    PREVIOUS_GTIDS_LOG_EVENT and COM_BINLOG_DUMP_GTID, untagged (format 0) or tagged
    (format 1, MySQL 8.3+).  The untagged tag is ``""``.
    """

    __slots__ = ("_intervals",)
    __hash__ = None  # mutable

    def __init__(self, text: str | None = None):
        # (uuid bytes, tag) -> sorted, merged, non-empty list of (start, end_exclusive).
        self._intervals: dict[Tsid, list[Interval]] = {}
        if text:
            self._add_text(text)

    # -- text -----------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> GtidSet:
        """Parse MySQL's text form; whitespace, newlines, unordered and overlapping intervals are fine."""
        gtid_set = cls()
        gtid_set._add_text(text)
        return gtid_set

    def _add_text(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"GTID set text must be str, not {type(text).__name__}")
        # Empty elements are allowed (",,", a trailing comma), as MySQL allows them.
        for element in text.split(","):
            element = element.strip(_WHITESPACE)
            if element:
                self._add_text_element(element, text)

    def _add_text_element(self, element: str, text: str) -> None:
        tokens = [token.strip(_WHITESPACE) for token in element.split(":")]
        sid = _parse_uuid_text(tokens[0], allow_compact=False)
        if sid is None:
            raise _text_error(text, f"expected a server UUID (36 characters, 8-4-4-4-12 hex), found {tokens[0]!r}")
        tag = ""
        for token in tokens[1:]:
            if not token:
                raise _text_error(text, f"empty interval or tag after {tokens[0]!r}")
            first = token[0]
            if first.isascii() and (first.isalpha() or first == "_"):
                if not _TAG_RE.match(token):
                    raise _text_error(
                        text,
                        f"invalid tag {token!r}: a tag is a letter or '_' followed by at most 31 "
                        "letters, digits or '_'",
                    )
                tag = token.lower()
                continue
            match = _INTERVAL_RE.match(token)
            if match is None:
                raise _text_error(text, f"invalid interval {token!r}")
            start_text, end_text = match.groups()
            start = _text_gno(start_text, token, text)
            end = _text_gno(end_text, token, text) if end_text is not None else start
            if end < start:
                # MySQL silently drops a reversed interval; a relay should not guess.
                raise _text_error(text, f"interval {token!r} ends before it starts")
            self._add_range((sid, tag), start, end + 1)

    def format(self, separator: str = ",\n") -> str:
        """MySQL's canonical text; ``separator`` goes between UUIDs (``",\\n"`` as MySQL prints)."""
        parts: list[str] = []
        current_sid = None
        piece: list[str] = []
        for (sid, tag), ivs in sorted(self._intervals.items()):
            if sid != current_sid:
                if piece:
                    parts.append("".join(piece))
                piece = [_uuid_text(sid)]
                current_sid = sid
            if tag:
                piece.append(":")
                piece.append(tag)
            for start, end in ivs:
                piece.append(f":{start}" if end == start + 1 else f":{start}-{end - 1}")
        if piece:
            parts.append("".join(piece))
        return separator.join(parts)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"GtidSet({self.format(',')!r})"

    # -- building -------------------------------------------------------------------

    def add(self, sid, gno: int, tag: str = "") -> None:
        """Add one GTID; O(1) when ``gno`` extends the last interval of its UUID/tag (a live stream)."""
        if type(sid) is not bytes or len(sid) != 16:
            sid = _sid_bytes(sid)
        key = (sid, _normalise_tag(tag) if tag else "")
        ivs = self._intervals.get(key)
        if ivs is not None:
            start, end = ivs[-1]
            if end == gno and gno <= GNO_MAX and type(gno) is int:
                ivs[-1] = (start, end + 1)
                return
        _check_gno(gno)
        self._add_range(key, gno, gno + 1)

    def add_interval(self, sid, start: int, end_exclusive: int, tag: str = "") -> None:
        """Add the GTIDs ``start .. end_exclusive - 1`` of one UUID/tag."""
        _check_gno(start)
        if type(end_exclusive) is not int:
            raise TypeError(f"interval end must be int, not {type(end_exclusive).__name__}")
        if not start < end_exclusive <= GNO_END:
            raise ValueError(f"invalid interval [{start}, {end_exclusive}): need start < end <= {GNO_END}")
        self._add_range((_sid_bytes(sid), _normalise_tag(tag)), start, end_exclusive)

    def _add_range(self, key: Tsid, start: int, end: int) -> None:
        ivs = self._intervals.get(key)
        if ivs is None:
            self._intervals[key] = [(start, end)]
            return
        if ivs[-1][1] < start:
            ivs.append((start, end))
            return
        # Intervals in ivs[first:last] overlap or touch [start, end).
        first = bisect_left(ivs, start, key=_end_of)
        last = bisect_right(ivs, end, key=_start_of)
        if first == last:
            ivs.insert(first, (start, end))
        else:
            ivs[first:last] = [(min(start, ivs[first][0]), max(end, ivs[last - 1][1]))]

    # -- queries --------------------------------------------------------------------

    def contains_gtid(self, sid, gno: int, tag: str = "") -> bool:
        ivs = self._intervals.get((_sid_bytes(sid), _normalise_tag(tag) if tag else ""))
        if not ivs:
            return False
        i = bisect_right(ivs, gno, key=_start_of) - 1
        return i >= 0 and gno < ivs[i][1]

    def __contains__(self, gtid) -> bool:
        """``(sid, gno) in s`` or ``(sid, tag, gno) in s``."""
        if isinstance(gtid, tuple):
            if len(gtid) == 2:
                return self.contains_gtid(gtid[0], gtid[1])
            if len(gtid) == 3:
                return self.contains_gtid(gtid[0], gtid[2], gtid[1])
        raise TypeError("GtidSet membership takes a (sid, gno) or (sid, tag, gno) tuple")

    def last_gno(self, sid, tag: str = "") -> int:
        """Highest GNO of a UUID/tag in the set, 0 if it has none (MySQL's get_last_gno)."""
        ivs = self._intervals.get((_sid_bytes(sid), _normalise_tag(tag) if tag else ""))
        return ivs[-1][1] - 1 if ivs else 0

    def count(self) -> int:
        """Number of GTIDs in the set."""
        return sum(end - start for ivs in self._intervals.values() for start, end in ivs)

    def __bool__(self) -> bool:
        return bool(self._intervals)

    def sids(self) -> list[str]:
        """Server UUIDs (text, sorted) that have at least one GTID, tagged or not."""
        return [_uuid_text(sid) for sid in sorted({sid for sid, _ in self._intervals})]

    def tsids(self) -> list[tuple[str, str]]:
        """(server UUID text, tag) pairs that have at least one GTID, in canonical order."""
        return [(_uuid_text(sid), tag) for sid, tag in sorted(self._intervals)]

    def intervals(self) -> Iterator[tuple[str, str, int, int]]:
        """Yield ``(uuid, tag, start, end_inclusive)`` in canonical order."""
        for (sid, tag), ivs in sorted(self._intervals.items()):
            text = _uuid_text(sid)
            for start, end in ivs:
                yield text, tag, start, end - 1

    def copy(self) -> GtidSet:
        clone = GtidSet()
        clone._intervals = {key: list(ivs) for key, ivs in self._intervals.items()}
        return clone

    __copy__ = copy

    # -- algebra --------------------------------------------------------------------

    def union(self, other: GtidSet | str) -> GtidSet:
        result = self.copy()
        result.update(other)
        return result

    def update(self, other: GtidSet | str) -> None:
        """Add every GTID of ``other`` to this set (MySQL's add_gtid_set)."""
        other = _as_gtid_set(other)
        for key, ivs in list(other._intervals.items()):  # a copy: ``other`` may be ``self``
            mine = self._intervals.get(key)
            self._intervals[key] = list(ivs) if mine is None else _union_intervals(mine, ivs)

    def subtract(self, other: GtidSet | str) -> GtidSet:
        """GTIDs of this set that are not in ``other`` (``GTID_SUBTRACT``)."""
        result = self.copy()
        result.difference_update(other)
        return result

    def difference_update(self, other: GtidSet | str) -> None:
        """Remove every GTID of ``other`` from this set (MySQL's remove_gtid_set)."""
        other = _as_gtid_set(other)
        for key, ivs in list(other._intervals.items()):  # a copy: ``other`` may be ``self``
            mine = self._intervals.get(key)
            if mine is not None:
                remaining = _subtract_intervals(mine, ivs)
                if remaining:
                    self._intervals[key] = remaining
                else:
                    del self._intervals[key]

    def intersect(self, other: GtidSet | str) -> GtidSet:
        other = _as_gtid_set(other)
        result = GtidSet()
        for key, ivs in self._intervals.items():
            theirs = other._intervals.get(key)
            if theirs is not None:
                common = _intersect_intervals(ivs, theirs)
                if common:
                    result._intervals[key] = common
        return result

    def intersection_update(self, other: GtidSet | str) -> None:
        self._intervals = self.intersect(other)._intervals

    def is_subset(self, other: GtidSet | str) -> bool:
        """True if every GTID of this set is in ``other`` (``GTID_SUBSET``)."""
        other = _as_gtid_set(other)
        for key, ivs in self._intervals.items():
            theirs = other._intervals.get(key)
            if theirs is None or not _intervals_subset(ivs, theirs):
                return False
        return True

    def is_superset(self, other: GtidSet | str) -> bool:
        return _as_gtid_set(other).is_subset(self)

    issubset = is_subset
    issuperset = is_superset

    def isdisjoint(self, other: GtidSet | str) -> bool:
        """True if no GTID is in both sets (the negation of MySQL's is_intersection_nonempty)."""
        other = _as_gtid_set(other)
        for key, ivs in self._intervals.items():
            theirs = other._intervals.get(key)
            if theirs is not None and _intervals_overlap(ivs, theirs):
                return False
        return True

    def __or__(self, other):
        return self.union(other) if isinstance(other, GtidSet) else NotImplemented

    def __ior__(self, other):
        if not isinstance(other, GtidSet):
            return NotImplemented
        self.update(other)
        return self

    def __sub__(self, other):
        return self.subtract(other) if isinstance(other, GtidSet) else NotImplemented

    def __isub__(self, other):
        if not isinstance(other, GtidSet):
            return NotImplemented
        self.difference_update(other)
        return self

    def __and__(self, other):
        return self.intersect(other) if isinstance(other, GtidSet) else NotImplemented

    def __iand__(self, other):
        if not isinstance(other, GtidSet):
            return NotImplemented
        self.intersection_update(other)
        return self

    def __eq__(self, other):
        if not isinstance(other, GtidSet):
            return NotImplemented
        return self._intervals == other._intervals

    def __le__(self, other):
        return self.is_subset(other) if isinstance(other, GtidSet) else NotImplemented

    def __ge__(self, other):
        return self.is_superset(other) if isinstance(other, GtidSet) else NotImplemented

    def __lt__(self, other):
        if not isinstance(other, GtidSet):
            return NotImplemented
        return self != other and self.is_subset(other)

    def __gt__(self, other):
        if not isinstance(other, GtidSet):
            return NotImplemented
        return self != other and self.is_superset(other)

    # -- binary ---------------------------------------------------------------------

    def _encoding_plan(self, tagged: bool | None, skip_tagged: bool) -> tuple[bool, list[Tsid]]:
        keys = sorted(key for key in self._intervals if not (skip_tagged and key[1]))
        has_tags = any(tag for _, tag in keys)
        if tagged is None:
            tagged = has_tags
        elif not tagged and has_tags:
            raise ValueError(
                "the GTID set has tagged GTIDs, which the untagged format cannot carry; "
                "use tagged=True, or skip_tagged=True to leave them out"
            )
        if tagged and len(keys) > _TAGGED_SID_COUNT_MAX:
            raise ValueError(f"too many UUID/tag entries for the tagged format: {len(keys)}")
        return tagged, keys

    def encode(self, tagged: bool | None = None, *, skip_tagged: bool = False) -> bytes:
        """Binary form as in PREVIOUS_GTIDS_LOG_EVENT / COM_BINLOG_DUMP_GTID.

        ``tagged=None`` picks the tagged format (8.3+) only if a tagged GTID is present;
        ``tagged=True`` forces it; ``tagged=False`` demands the untagged format and raises
        ``ValueError`` if tags are present.  ``skip_tagged=True`` leaves tagged GTIDs out,
        as MySQL does for a peer older than 8.3 (``encode(buf, skip_tagged_gtids)``).
        """
        tagged, keys = self._encoding_plan(tagged, skip_tagged)
        if tagged:
            header = (_FORMAT_TAGGED << 56) | (len(keys) << 8) | _FORMAT_TAGGED
        else:
            header = len(keys)
        out = bytearray(_U64.pack(header))
        for key in keys:
            sid, tag = key
            ivs = self._intervals[key]
            out += sid
            if tagged:
                out += write_string(tag, max_length=TAG_MAX_LENGTH)
            out += _U64.pack(len(ivs))
            out += struct.pack(f"<{2 * len(ivs)}q", *[bound for iv in ivs for bound in iv])
        return bytes(out)

    def encoded_length(self, tagged: bool | None = None, *, skip_tagged: bool = False) -> int:
        """Length of ``encode(tagged, skip_tagged=...)`` without building it."""
        tagged, keys = self._encoding_plan(tagged, skip_tagged)
        length = 8
        for key in keys:
            length += 16 + 8 + 16 * len(self._intervals[key])
            if tagged:
                length += string_size(key[1])
        return length

    @classmethod
    def decode(cls, buf, offset: int = 0, length: int | None = None) -> GtidSet:
        """Decode the binary form (either format, detected); exactly ``length`` bytes must be used.

        ``length`` defaults to the rest of ``buf``.  Malformed input raises
        ``BinlogFormatError`` naming the offset, where MySQL reports
        ER_MALFORMED_GTID_SET_ENCODING.
        """
        end = len(buf) if length is None else offset + length
        if offset < 0 or end > len(buf) or end < offset:
            raise BinlogFormatError(
                f"GTID set encoding of {length} bytes does not fit a buffer of {len(buf)}", offset
            )
        if end - offset < 8:
            raise BinlogFormatError(f"GTID set encoding needs at least 8 bytes, has {end - offset}", offset)
        (header,) = _U64.unpack_from(buf, offset)
        gtid_format = header >> 56
        if gtid_format == _FORMAT_UNTAGGED:
            n_sids = header & _UNTAGGED_SID_COUNT_MASK
            min_entry = 16 + 8
        elif gtid_format == _FORMAT_TAGGED:
            if header & 0xFF != _FORMAT_TAGGED:
                raise BinlogFormatError(
                    f"tagged GTID set header {header:#018x} does not repeat the format in its low byte", offset
                )
            n_sids = (header >> 8) & _TAGGED_SID_COUNT_MAX
            min_entry = 16 + 1 + 8
        else:
            raise BinlogFormatError(f"unknown GTID set encoding format {gtid_format}", offset)
        pos = offset + 8
        if n_sids * min_entry > end - pos:
            raise BinlogFormatError(
                f"GTID set declares {n_sids} UUID entries but only {end - pos} bytes follow", offset
            )
        gtid_set = cls()
        intervals = gtid_set._intervals
        for _ in range(n_sids):
            entry_pos = pos
            if end - pos < 16:
                raise BinlogFormatError("truncated UUID in GTID set", pos)
            sid = bytes(buf[pos : pos + 16])
            pos += 16
            tag = ""
            if gtid_format == _FORMAT_TAGGED:
                tag, pos = _read_tag(buf, pos, end)
            if end - pos < 8:
                raise BinlogFormatError("truncated interval count in GTID set", pos)
            (n_intervals,) = _U64.unpack_from(buf, pos)
            pos += 8
            if n_intervals * 16 > end - pos:
                raise BinlogFormatError(
                    f"GTID set entry declares {n_intervals} intervals but only {end - pos} bytes follow", entry_pos
                )
            bounds = struct.unpack_from(f"<{2 * n_intervals}q", buf, pos)
            ivs: list[Interval] = []
            previous_end = 0
            for i in range(0, 2 * n_intervals, 2):
                start, stop = bounds[i], bounds[i + 1]
                # As MySQL: each interval must start after the previous one ends (so they
                # are merged and sorted), and must not be empty.
                if start <= previous_end or stop <= start:
                    raise BinlogFormatError(
                        f"invalid GTID interval [{start}, {stop}) after end {previous_end} "
                        f"for {_uuid_text(sid)}{':' + tag if tag else ''}",
                        pos + 8 * i,
                    )
                ivs.append((start, stop))
                previous_end = stop
            pos += 16 * n_intervals
            if not ivs:
                continue
            key = (sid, tag)
            existing = intervals.get(key)
            intervals[key] = ivs if existing is None else _union_intervals(existing, ivs)
        if pos != end:
            raise BinlogFormatError(f"{end - pos} unexpected bytes after the GTID set", pos)
        return gtid_set


def _read_tag(buf, pos: int, end: int) -> tuple[str, int]:
    """Read a serialization-encoded tag that must end by ``end``; return ``(tag, new_pos)``."""
    length, data_pos = read_varlen_uint(buf, pos)
    if length > TAG_MAX_LENGTH:
        raise BinlogFormatError(f"GTID tag length {length} exceeds the limit of {TAG_MAX_LENGTH}", pos)
    if data_pos + length > end:
        raise BinlogFormatError(f"truncated GTID tag: declares {length} bytes, {max(end - data_pos, 0)} left", pos)
    raw = bytes(buf[data_pos : data_pos + length])
    tag = raw.decode("ascii", "replace")
    # MySQL re-parses a decoded tag with the text rules (and lower-cases it).
    if raw and not _TAG_RE.match(tag):
        raise BinlogFormatError(f"invalid GTID tag {raw!r}", pos)
    return tag.lower(), data_pos + length


def _as_gtid_set(other) -> GtidSet:
    if isinstance(other, GtidSet):
        return other
    if isinstance(other, str):
        return GtidSet.parse(other)
    raise TypeError(f"expected GtidSet or str, not {type(other).__name__}")


def _text_error(text: str, reason: str) -> ValueError:
    shown = text if len(text) <= 200 else text[:200] + "..."
    return ValueError(f"malformed GTID set {shown!r}: {reason}")


def _text_gno(digits: str, token: str, text: str) -> int:
    if digits[0] == "0":
        # MySQL reads GNOs with strtoll(base 0): "010" is 8 there.  Refuse the ambiguity.
        if digits.strip("0") == "":
            raise _text_error(text, f"GNO 0 in {token!r}: GNOs start at 1")
        raise _text_error(text, f"GNO with a leading zero in {token!r} (MySQL would read it as octal)")
    gno = int(digits)
    if gno > GNO_MAX:
        raise _text_error(text, f"GNO {gno} in {token!r} exceeds the maximum {GNO_MAX}")
    return gno


# ---------------------------------------------------------------------------------------
# MariaDB
# ---------------------------------------------------------------------------------------

_UINT32_MAX = (1 << 32) - 1
_UINT64_MAX = (1 << 64) - 1
_MARIA_GTID_RE = re.compile(r"([0-9]+)-([0-9]+)-([0-9]+)\Z")
_GTID_LIST_ENTRY = struct.Struct("<IIQ")
_GTID_LIST_FLAGS_MASK = 0xFFFFFFFF & ~GTID_LIST_COUNT_MASK


class MariaGtid(NamedTuple):
    """A MariaDB GTID ``domain_id-server_id-seq_no``."""

    domain_id: int
    server_id: int
    seq_no: int

    @classmethod
    def parse(cls, text: str) -> MariaGtid:
        token = text.strip(_WHITESPACE)
        match = _MARIA_GTID_RE.match(token)
        if match is None:
            raise ValueError(f"malformed MariaDB GTID {text!r}: expected domain_id-server_id-seq_no")
        gtid = cls(*map(int, match.groups()))
        gtid.check()
        return gtid

    def check(self) -> None:
        """Raise ``ValueError`` unless domain and server fit 32 bits and seq_no 64 bits."""
        domain_id, server_id, seq_no = self
        if not (
            type(domain_id) is int and type(server_id) is int and type(seq_no) is int
        ):
            raise TypeError(f"MariaDB GTID fields must be int: {tuple(self)!r}")
        if not 0 <= domain_id <= _UINT32_MAX:
            raise ValueError(f"MariaDB GTID domain_id {domain_id} is outside 0..{_UINT32_MAX}")
        if not 0 <= server_id <= _UINT32_MAX:
            raise ValueError(f"MariaDB GTID server_id {server_id} is outside 0..{_UINT32_MAX}")
        if not 0 <= seq_no <= _UINT64_MAX:
            raise ValueError(f"MariaDB GTID seq_no {seq_no} is outside 0..{_UINT64_MAX}")

    def __str__(self) -> str:
        return f"{self.domain_id}-{self.server_id}-{self.seq_no}"


def _split_maria_list(text: str, what: str) -> list[MariaGtid]:
    if not isinstance(text, str):
        raise TypeError(f"{what} text must be str, not {type(text).__name__}")
    if not text.strip(_WHITESPACE):
        return []
    gtids = []
    for element in text.split(","):
        if not element.strip(_WHITESPACE):
            raise ValueError(f"malformed {what} {text!r}: empty entry")
        try:
            gtids.append(MariaGtid.parse(element))
        except ValueError as exc:
            raise ValueError(f"malformed {what} {text!r}: {exc}") from None
    return gtids


class MariaGtidPosition:
    """A MariaDB GTID position: at most one GTID per domain (gtid_slave_pos, @slave_connect_state).

    Comparison is per domain by ``seq_no`` only; ``server_id`` only records the origin.
    """

    __slots__ = ("_by_domain",)
    __hash__ = None  # mutable

    def __init__(self, gtids: Iterable[MariaGtid] = ()):
        self._by_domain: dict[int, MariaGtid] = {}
        for gtid in gtids:
            gtid = MariaGtid(*gtid)
            gtid.check()
            if gtid.domain_id in self._by_domain:
                raise ValueError(
                    f"two GTIDs for domain {gtid.domain_id} in one position: "
                    f"{self._by_domain[gtid.domain_id]} and {gtid}"
                )
            self._by_domain[gtid.domain_id] = gtid

    @classmethod
    def parse(cls, text: str) -> MariaGtidPosition:
        """Parse ``"0-1-100,1-2-50"``; the empty string is the empty position."""
        gtids = _split_maria_list(text, "MariaDB GTID position")
        try:
            return cls(gtids)
        except ValueError as exc:
            raise ValueError(f"malformed MariaDB GTID position {text!r}: {exc}") from None

    def __str__(self) -> str:
        return ",".join(str(gtid) for gtid in self)

    def __repr__(self) -> str:
        return f"MariaGtidPosition({str(self)!r})"

    def update(self, gtid: MariaGtid) -> None:
        """Set the domain's GTID to ``gtid``, replacing any earlier one."""
        gtid = MariaGtid(*gtid)
        gtid.check()
        self._by_domain[gtid.domain_id] = gtid

    def discard(self, domain_id: int) -> None:
        self._by_domain.pop(domain_id, None)

    def get(self, domain_id: int, default: MariaGtid | None = None) -> MariaGtid | None:
        return self._by_domain.get(domain_id, default)

    def domains(self) -> list[int]:
        return sorted(self._by_domain)

    def __iter__(self) -> Iterator[MariaGtid]:
        """GTIDs sorted by domain, as MariaDB prints a position."""
        return iter([self._by_domain[d] for d in sorted(self._by_domain)])

    def __len__(self) -> int:
        return len(self._by_domain)

    def __eq__(self, other):
        if not isinstance(other, MariaGtidPosition):
            return NotImplemented
        return self._by_domain == other._by_domain

    def contains(self, gtid: MariaGtid) -> bool:
        """True if the position is at or past ``gtid`` in its domain (seq_no only)."""
        mine = self._by_domain.get(gtid[0])
        return mine is not None and mine.seq_no >= gtid[2]

    __contains__ = contains

    def covers(self, other: MariaGtidPosition) -> bool:
        """True if this position is at or past ``other`` in every domain ``other`` has."""
        return all(self.contains(gtid) for gtid in other._by_domain.values())

    def is_behind(self, other: MariaGtidPosition) -> bool:
        """True if ``other`` has a domain this position lacks or is further along in."""
        return not self.covers(other)

    def copy(self) -> MariaGtidPosition:
        clone = MariaGtidPosition()
        clone._by_domain = dict(self._by_domain)
        return clone

    __copy__ = copy


class MariaBinlogState:
    """A MariaDB binlog state (``gtid_binlog_state``, GTID_LIST_EVENT): one GTID per
    (domain, server_id), plus which of them is the most recent in each domain.

    As in MariaDB's rpl_binlog_state, "most recent" is the last one ``update`` saw in
    the domain, not the highest seq_no.
    """

    __slots__ = ("_servers", "_latest")
    __hash__ = None  # mutable

    def __init__(self, gtids: Iterable[MariaGtid] = ()):
        # domain_id -> server_id -> GTID, and domain_id -> most recent GTID of the domain.
        self._servers: dict[int, dict[int, MariaGtid]] = {}
        self._latest: dict[int, MariaGtid] = {}
        for gtid in gtids:
            self.update(gtid)

    @classmethod
    def parse(cls, text: str) -> MariaBinlogState:
        """Parse ``"0-1-100,0-2-90,1-1-7"``; within a domain the last GTID is the most recent."""
        return cls(_split_maria_list(text, "MariaDB binlog state"))

    def update(self, gtid: MariaGtid) -> None:
        """Record a binlogged GTID: it replaces its (domain, server_id) entry and becomes the domain's latest."""
        if type(gtid) is not MariaGtid:
            gtid = MariaGtid(*gtid)
        gtid.check()
        servers = self._servers.get(gtid.domain_id)
        if servers is None:
            self._servers[gtid.domain_id] = {gtid.server_id: gtid}
        else:
            servers[gtid.server_id] = gtid
        self._latest[gtid.domain_id] = gtid

    def get(self, domain_id: int, server_id: int) -> MariaGtid | None:
        servers = self._servers.get(domain_id)
        return None if servers is None else servers.get(server_id)

    def latest(self, domain_id: int) -> MariaGtid | None:
        return self._latest.get(domain_id)

    def domains(self) -> list[int]:
        return sorted(self._servers)

    def current_position(self) -> MariaGtidPosition:
        """The most recent GTID of each domain (what ``gtid_binlog_pos`` shows)."""
        position = MariaGtidPosition()
        position._by_domain = dict(self._latest)
        return position

    def gtids(self) -> list[MariaGtid]:
        """Every entry, domains ascending; within a domain the other servers by server_id, then
        the most recent last.

        MariaDB's get_gtid_list also puts each domain's most recent GTID last (that is how a
        reader of GTID_LIST_EVENT learns it); its order of domains and of the other servers
        is hash order, which we replace by a sorted one.
        """
        result: list[MariaGtid] = []
        for domain_id in sorted(self._servers):
            latest = self._latest[domain_id]
            servers = self._servers[domain_id]
            result.extend(servers[s] for s in sorted(servers) if s != latest.server_id)
            result.append(latest)
        return result

    def __iter__(self) -> Iterator[MariaGtid]:
        return iter(self.gtids())

    def __len__(self) -> int:
        return sum(len(servers) for servers in self._servers.values())

    def __str__(self) -> str:
        return ",".join(str(gtid) for gtid in self.gtids())

    def __repr__(self) -> str:
        return f"MariaBinlogState({str(self)!r})"

    def __eq__(self, other):
        if not isinstance(other, MariaBinlogState):
            return NotImplemented
        return self._servers == other._servers and self._latest == other._latest

    def copy(self) -> MariaBinlogState:
        clone = MariaBinlogState()
        clone._servers = {domain: dict(servers) for domain, servers in self._servers.items()}
        clone._latest = dict(self._latest)
        return clone

    __copy__ = copy

    def encode_gtid_list_body(self, flags: int = 0) -> bytes:
        """The GTID_LIST_EVENT body after the common header: count_and_flags, then the entries.

        ``flags`` are GTID_LIST_FLAG_* bits (the top 4 bits of count_and_flags).  An empty
        list carries 2 zero bytes of padding, as MariaDB writes it.
        """
        if flags & ~_GTID_LIST_FLAGS_MASK:
            raise ValueError(f"GTID_LIST flags {flags:#x} overlap the count field")
        gtids = self.gtids()
        if len(gtids) > GTID_LIST_COUNT_MASK:
            raise ValueError(f"{len(gtids)} GTIDs do not fit a GTID_LIST_EVENT")
        out = bytearray(struct.pack("<I", len(gtids) | flags))
        if not gtids:
            out += b"\x00\x00"
        for gtid in gtids:
            out += _GTID_LIST_ENTRY.pack(*gtid)
        return bytes(out)

    @classmethod
    def decode_gtid_list_body(
        cls, buf, offset: int = 0, length: int | None = None
    ) -> tuple[MariaBinlogState, int]:
        """Decode a GTID_LIST_EVENT body; return ``(state, flags)``.

        Entries are applied in order, so each domain's last entry becomes its most recent
        GTID.  Bytes after the entries (the empty list's padding) are ignored, as MariaDB
        ignores them.
        """
        end = len(buf) if length is None else offset + length
        if offset < 0 or end > len(buf) or end < offset:
            raise BinlogFormatError(
                f"GTID_LIST body of {length} bytes does not fit a buffer of {len(buf)}", offset
            )
        if end - offset < 4:
            raise BinlogFormatError(f"GTID_LIST body needs at least 4 bytes, has {end - offset}", offset)
        (count_and_flags,) = struct.unpack_from("<I", buf, offset)
        count = count_and_flags & GTID_LIST_COUNT_MASK
        flags = count_and_flags & _GTID_LIST_FLAGS_MASK
        pos = offset + 4
        if count * _GTID_LIST_ENTRY.size > end - pos:
            raise BinlogFormatError(
                f"GTID_LIST declares {count} GTIDs ({count * _GTID_LIST_ENTRY.size} bytes) "
                f"but only {end - pos} bytes follow",
                offset,
            )
        state = cls()
        for _ in range(count):
            state.update(MariaGtid._make(_GTID_LIST_ENTRY.unpack_from(buf, pos)))
            pos += _GTID_LIST_ENTRY.size
        return state, flags


def boundary_gtid_text(gtid) -> str | None:
    """Text of a boundary-parser GTID: ``domain-server-seq``, ``uuid:gno`` or ``uuid:tag:gno``."""
    if gtid is None:
        return None
    if isinstance(gtid[0], int):
        return "-".join(str(part) for part in gtid)
    if len(gtid) == 3:
        sid, tag, gno = gtid
        return f"{_uuid.UUID(bytes=bytes(sid))}:{tag}:{gno}" if tag else f"{_uuid.UUID(bytes=bytes(sid))}:{gno}"
    sid, gno = gtid
    return f"{_uuid.UUID(bytes=bytes(sid))}:{gno}"
