"""Per-relay-file transaction indexes (``relayproxy.txindex.<file>``): each transaction's offsets, GTID, commit time
and tables, written as the file grows, and the lookups over them (by GTID, by time, by table, between positions).

What one record says of a transaction (a group as ``binlog/reader.BinlogScanner`` delimits it: the one parser):
its start (first event) and end (end of its last event), its GTID (MariaDB ``domain-server-seq``, MySQL
``uuid:gno`` or ``uuid:tag:gno``, None for an anonymous or GTID-less group), its commit time in microseconds and
the tables it touches. The commit time is the GTID event's ``immediate_commit_timestamp`` where MySQL (8.0.1+)
writes one; else the header timestamp (whole seconds) of the event that ends the group (XID, COMMIT, the DDL
statement), stored as ``s * 1_000_000`` with ``second_resolution`` set. Tables come from TABLE_MAP events
(``db.table``, also inside MySQL's TRANSACTION_PAYLOAD when it is held in memory) and, *best-effort*, from the
text of QUERY events (DROP/CREATE/ALTER/TRUNCATE/RENAME TABLE, INSERT/REPLACE INTO, UPDATE, DELETE FROM; the
first bytes of the statement, qualified with the event's default database): a statement this parse does not
understand names no table.

The sidecar is append-only frames (all integers little-endian)::

    magic    "RPXTXI1\\n"
    frame    kind u8, payload length u32, payload, CRC32 of kind + length + payload u32
    kinds    H  header (JSON: format, version, name, the CRC32 and length of the file's FORMAT_DESCRIPTION)
             D  table names first used by the next block (JSON list; ids continue the previous D frames)
             B  a block of up to BLOCK_RECORDS transactions: header length u16, header (JSON: count, first
                start, last start, end, CRC32 of the 32 file bytes before end, min/max commit time, the table
                ids, per GTID source (MariaDB domain-server, MySQL uuid[:tag]) its min and max sequence number),
                then the table-id count u32, the compressed length u32 of each column, and the columns (start
                gap, length, GTID source, sequence delta, commit-time delta, resolution flag, table count, table
                ids): fixed-width little-endian arrays, signed deltas, byte-shuffled, each its own zlib stream
                (a lookup decompresses only the columns it reads)
             F  footer of a closed file (JSON: its size, transactions, and the tail CRC)

Blocks are appended as they fill and at least every ``FLUSH_SECONDS`` for a slow stream; a reader scans the
relay file from the last block's end to the horizon for the rest. At load a torn or CRC-bad tail frame is cut,
blocks that describe bytes past the file's end are dropped (recovery cut the file), and a sidecar whose
FORMAT_DESCRIPTION or last block's tail CRC does not match its file is rebuilt where the relay may write (a log
line says why) or bypassed (the file scanned, the result kept in memory) where it may not (``relayproxy serve``).
A closed file's sidecar is rewritten compacted (full blocks) at its footer. Rebuilds are atomic (temporary file,
fsync, rename, directory fsync). The sidecar lives under the relay's reserved prefix and goes with its file.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import functools
import json
import os
import re
import struct
import threading
import time
import weakref
import sys
import zlib
from array import array
from collections import OrderedDict, deque
from itertools import accumulate
from operator import add, sub
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from ..binlog import constants as C
from ..binlog.checksum import crc32 as _crc32
from ..binlog.events import BinlogFormatError, FormatDescription
from ..binlog.reader import BinlogScanner, ScannedEvent, ScannedGroup
from ..log import get_logger
from .closed_files import StoredFileError, archive_dir_of, logical_name, open_relay_file
from .durable import write_file_atomically
from .layout import RESERVED_PREFIX

if TYPE_CHECKING:
    from .reader import StoreReader

log = get_logger(__name__)

KEPT_ERRORS = 100  # an indexer keeps its newest errors (a pass failing for hours must not grow memory)

SIDECAR_PREFIX = RESERVED_PREFIX + "txindex."
MAGIC = b"RPXTXI1\n"
FORMAT = "relayproxy-txindex"
VERSION = 1
BLOCK_RECORDS = 512  # a lookup decodes one block of these; its header costs about 0.3 byte a transaction
FLUSH_SECONDS = 5.0
TAIL_CHECK = 32  # bytes before a block's end whose CRC32 ties the block to its file
MAX_FRAME = 64 << 20
_FRAME = struct.Struct("<BI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_CHUNK = 1 << 20
_MAX_EVENT_IN_MEMORY = 1 << 20

K_HEADER, K_DICT, K_BLOCK, K_FOOTER = b"H"[0], b"D"[0], b"B"[0], b"F"[0]


class TxIndexError(ValueError):
    """A sidecar cannot be read or does not describe its file (the message says why)."""


@dataclass(frozen=True)
class Transaction:
    file: str
    start: int
    end: int
    gtid: str | None
    commit_us: int
    second_resolution: bool
    tables: tuple[str, ...]


@dataclass(frozen=True)
class SpanSummary:
    transactions: int
    bytes: int  # the bytes of those transactions (their end - start, summed)
    first_file: str | None
    last_file: str | None
    files: tuple[str, ...]


def sidecar_name(name: str) -> str:
    return SIDECAR_PREFIX + name


def sidecar_path(relay_dir: Path, name: str) -> Path:
    return Path(relay_dir) / sidecar_name(name)


# ---------------------------------------------------------------------------------------------
# Times and GTIDs as text


_TIME = re.compile(
    r"^\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?\s*(Z|[+-]\d{2}:?\d{2}|UTC)?\s*$",
    re.IGNORECASE)


def time_has_zone(text: str) -> bool:
    m = _TIME.match(text)
    return bool(m and m.group(8))


def parse_time(text: str, default_zone=None) -> int:
    """Microseconds since the epoch of ``'YYYY-MM-DD HH:MM:SS[.ffffff]'`` with an optional zone (``Z``, ``UTC``,
    ``+HH:MM``); without one, in ``default_zone`` (a tzinfo, a zone name such as ``Europe/Paris`` or ``UTC``;
    None: the machine's local zone). ValueError naming what is wrong."""
    m = _TIME.match(text or "")
    if not m:
        raise ValueError(f"bad time {text!r}: expected 'YYYY-MM-DD HH:MM:SS[.ffffff]' with an optional zone "
                         "(Z or +HH:MM)")
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    frac = int((m.group(7) or "0").ljust(6, "0"))
    zone = m.group(8)
    if zone:
        z = zone.upper()
        if z in ("Z", "UTC"):
            tz = _dt.timezone.utc
        else:
            digits = z[1:].replace(":", "")
            delta = _dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            if delta >= _dt.timedelta(hours=24):
                raise ValueError(f"bad time {text!r}: zone offset {zone} out of range")
            tz = _dt.timezone(-delta if z[0] == "-" else delta)
    else:
        tz = zone_of(default_zone)
    try:
        naive = _dt.datetime(y, mo, d, h, mi, s, frac)
    except ValueError as exc:
        raise ValueError(f"bad time {text!r}: {exc}") from None
    if tz is None:
        aware = naive.astimezone()  # the machine's local zone
    else:
        aware = naive.replace(tzinfo=tz)
    delta = aware - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def zone_of(zone):
    """A tzinfo for ``zone`` (tzinfo, name, or None: local, returned as None). ValueError for an unknown name."""
    if zone is None or isinstance(zone, _dt.tzinfo):
        return zone
    if str(zone).upper() in ("UTC", "Z", "+00:00"):
        return _dt.timezone.utc
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(str(zone))
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {zone!r}") from None


def format_time_utc(us: int) -> str:
    """``'YYYY-MM-DD HH:MM:SS.ffffff'`` in UTC."""
    t = _dt.datetime(1970, 1, 1) + _dt.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")


_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_TAG = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")


def _fmt_uuid(sid: bytes) -> str:
    h = sid.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_gtid(text: str) -> tuple[tuple[str, str], int]:
    """``((kind, source), number)`` of a GTID's text: MariaDB ``D-S-N`` (kind m, source ``D-S``), MySQL
    ``uuid:N`` or ``uuid:tag:N`` (kind u, source ``uuid`` or ``uuid:tag``). ValueError naming what is wrong."""
    t = (text or "").strip()
    parts = t.split("-")
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        d, s, n = (int(p) for p in parts)
        if d >= 1 << 32 or s >= 1 << 32 or n >= 1 << 64:
            raise ValueError(f"bad GTID {text!r}: a number is out of range")
        return ("m", f"{d}-{s}"), n
    pieces = t.lower().split(":")
    if len(pieces) in (2, 3) and _UUID.match(pieces[0]) and pieces[-1].isdigit():
        uuid = _fmt_uuid(bytes.fromhex(pieces[0].replace("-", "")))
        n = int(pieces[-1])
        if not 1 <= n < (1 << 63) - 1:
            raise ValueError(f"bad GTID {text!r}: the transaction number must be 1 .. 2^63-2")
        if len(pieces) == 3:
            if not _TAG.match(pieces[1]):
                raise ValueError(f"bad GTID {text!r}: {pieces[1]!r} is not a GTID tag")
            return ("u", f"{uuid}:{pieces[1]}"), n
        return ("u", uuid), n
    raise ValueError(f"bad GTID {text!r}: expected domain-server-sequence (MariaDB) or uuid[:tag]:number (MySQL)")


def _gtid_parts(gtid) -> tuple[tuple[str, str] | None, int]:
    """((kind, source), number) of the boundary parser's GTID form, or (None, 0)."""
    if gtid is None:
        return None, 0
    if len(gtid) == 3 and isinstance(gtid[0], int):
        d, s, n = gtid
        return ("m", f"{d}-{s}"), n
    if len(gtid) == 3:
        sid, tag, gno = gtid
        return ("u", f"{_fmt_uuid(sid)}:{tag}"), gno
    sid, gno = gtid
    return ("u", _fmt_uuid(sid)), gno


def _gtid_text(source: tuple[str, str] | None, number: int) -> str | None:
    if source is None:
        return None
    return f"{source[1]}-{number}" if source[0] == "m" else f"{source[1]}:{number}"


# ---------------------------------------------------------------------------------------------
# Tables named by a statement (best-effort)


_IDENT = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_NAME = rf"({_IDENT}(?:\s*\.\s*{_IDENT})?)"
_LEAD = r"^\s*(?:/\*.*?\*/\s*)*"
_STATEMENTS = [
    re.compile(_LEAD + r"DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(" + _NAME[1:-1]
               + r"(?:\s*,\s*" + _NAME[1:-1] + r")*)", re.I | re.S),
    re.compile(_LEAD + r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?" + _NAME,
               re.I | re.S),
    re.compile(_LEAD + r"ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?" + _NAME, re.I | re.S),
    re.compile(_LEAD + r"TRUNCATE\s+(?:TABLE\s+)?" + _NAME, re.I | re.S),
    re.compile(_LEAD + r"(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*(?:INTO\s+)?"
               + _NAME, re.I | re.S),
    re.compile(_LEAD + r"UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*" + _NAME, re.I | re.S),
    re.compile(_LEAD + r"DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*FROM\s+" + _NAME, re.I | re.S),
]
_RENAME = re.compile(_LEAD + r"RENAME\s+TABLES?\s+(.*)", re.I | re.S)
_RENAME_PAIR = re.compile(_NAME + r"\s+TO\s+" + _NAME, re.I | re.S)
_SPLIT_NAME = re.compile(_IDENT)
_KEYWORDS = frozenset({"SELECT", "SET", "VALUES", "VALUE", "WHERE", "IF", "LIKE", "AS"})


def _qualify(name: str, db: str) -> str | None:
    parts = [p[1:-1].replace("``", "`") if p.startswith("`") else p for p in _SPLIT_NAME.findall(name)]
    if not parts or (len(parts) == 1 and parts[0].upper() in _KEYWORDS):
        return None
    if len(parts) == 1:
        return f"{db}.{parts[0]}" if db else parts[0]
    return f"{parts[0]}.{parts[1]}"


def statement_tables(query: str, db: str) -> list[str]:
    """Tables a statement's text names (best-effort: DDL and statement-based DML), qualified with ``db``."""
    head = query[:4096]
    m = _RENAME.match(head)
    if m:
        out = []
        for a, b in _RENAME_PAIR.findall(m.group(1)):
            out += [t for t in (_qualify(a, db), _qualify(b, db)) if t]
        return out
    for pattern in _STATEMENTS:
        m = pattern.match(head)
        if m:
            names = re.findall(_NAME, m.group(1)) if pattern is _STATEMENTS[0] else [m.group(1)]
            return [t for t in (_qualify(n, db) for n in names) if t]
    return []


# ---------------------------------------------------------------------------------------------
# Varints and the block codec (sans-I/O)


@dataclass(slots=True)
class Record:
    """One transaction as a block holds it (table ids into the file's dictionary)."""

    start: int
    end: int
    source: tuple[str, str] | None
    number: int
    commit_us: int
    second_resolution: bool
    tables: tuple[int, ...]


# Columns of a block body, each a fixed-width little-endian array, byte-shuffled (all first bytes, then all second
# bytes, ...) so that the zero high bytes of small deltas form long runs for zlib.
# Deltas are signed ("q"): two's complement keeps the rare negative one (a clock step back) cheap, and decoding is
# ``itertools.accumulate`` over the array, at C speed.
_COLUMNS = (("gap", "Q"), ("length", "Q"), ("source", "H"), ("number", "q"), ("commit", "q"), ("coarse", "B"),
            ("ntables", "H"))
_LITTLE = sys.byteorder == "little"


def _shuffle(arr: array) -> bytes:
    if not _LITTLE:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    raw = arr.tobytes()
    w = arr.itemsize
    return raw if w == 1 else b"".join(raw[i::w] for i in range(w))


def _unshuffle(raw: bytes, typecode: str, n: int) -> array:
    arr = array(typecode)
    w = arr.itemsize
    if len(raw) != n * w:
        raise TxIndexError("a block's column has the wrong length")
    if w == 1:
        arr.frombytes(raw)
    else:
        out = bytearray(n * w)
        for i in range(w):
            out[i::w] = raw[i * n:(i + 1) * n]
        arr.frombytes(bytes(out))
    if not _LITTLE:
        arr.byteswap()
    return arr


def encode_block(records: list[Record], tail_crc: int) -> bytes:
    """A B frame's payload for ``records`` (in file order, at least one)."""
    if not records:
        raise ValueError("a block holds at least one record")
    sources: dict[tuple[str, str], list[int]] = {}
    tables: set[int] = set()
    for r in records:
        if r.source is not None:
            rng = sources.get(r.source)
            if rng is None:
                sources[r.source] = [r.number, r.number]
            else:
                rng[0] = min(rng[0], r.number)
                rng[1] = max(rng[1], r.number)
        tables.update(r.tables)
    order = {s: i + 1 for i, s in enumerate(sources)}
    min_us = min(r.commit_us for r in records)
    max_us = max(r.commit_us for r in records)
    header = {
        "n": len(records), "first": records[0].start, "last": records[-1].start, "end": records[-1].end,
        "tail": tail_crc, "min_us": min_us, "max_us": max_us, "tables": sorted(tables),
        "gtids": [[s[0], s[1], lo, hi] for s, (lo, hi) in sources.items()],
    }
    cols = {name: array(code) for name, code in _COLUMNS}
    tids = array("I")
    prev_end = records[0].start
    last_num = {s: rng[0] for s, rng in sources.items()}
    prev_us = min_us
    for r in records:
        if r.start < prev_end or r.end < r.start:
            raise ValueError(f"records out of order at offset {r.start}")
        cols["gap"].append(r.start - prev_end)
        cols["length"].append(r.end - r.start)
        prev_end = r.end
        if r.source is None:
            cols["source"].append(0)
            cols["number"].append(0)
        else:
            cols["source"].append(order[r.source])
            cols["number"].append(r.number - last_num[r.source])
            last_num[r.source] = r.number
        cols["commit"].append(r.commit_us - prev_us)
        cols["coarse"].append(r.second_resolution)
        prev_us = r.commit_us
        cols["ntables"].append(len(r.tables))
        tids.extend(r.tables)
    streams = [zlib.compress(_shuffle(cols[name]), 9) for name, _ in _COLUMNS] + [zlib.compress(_shuffle(tids), 9)]
    body = _U32.pack(len(tids)) + b"".join(_U32.pack(len(z)) for z in streams) + b"".join(streams)
    head = json.dumps(header, separators=(",", ":")).encode()
    return _U16.pack(len(head)) + head + body


def block_header(payload: bytes) -> tuple[dict, int]:
    """(header, offset of the compressed body) of a B frame's payload; TxIndexError when malformed."""
    if len(payload) < 2:
        raise TxIndexError("a block is shorter than its header length")
    n = _U16.unpack_from(payload, 0)[0]
    try:
        header = json.loads(payload[2:2 + n])
    except (ValueError, UnicodeDecodeError):
        raise TxIndexError("a block's header is not JSON") from None
    _check_header(header)
    return header, 2 + n


def _check_header(h) -> None:
    ints = ("n", "first", "last", "end", "tail", "min_us", "max_us")
    if not isinstance(h, dict) or not all(type(h.get(k)) is int for k in ints):
        raise TxIndexError("a block's header lacks its fields")
    if not (1 <= h["n"] <= 1 << 20 and 4 <= h["first"] <= h["last"] <= h["end"] and h["min_us"] <= h["max_us"]):
        raise TxIndexError("a block's header is inconsistent")
    if not isinstance(h.get("tables"), list) or not all(type(t) is int and t >= 0 for t in h["tables"]):
        raise TxIndexError("a block's table ids are malformed")
    g = h.get("gtids")
    if not isinstance(g, list) or len(g) >= 0xFFFF or not all(
            isinstance(e, list) and len(e) == 4 and e[0] in ("m", "u") and isinstance(e[1], str)
            and type(e[2]) is int and type(e[3]) is int and 0 <= e[2] <= e[3] for e in g):
        raise TxIndexError("a block's GTID ranges are malformed")


class Block:
    """A decoded block: its records as columns, each decoded when first asked for (a GTID lookup needs the GTIDs, a
    time lookup the commit times), checked against the header; ``record(i)`` builds one Record."""

    def __init__(self, payload: bytes):
        header, at = block_header(payload)
        self.header = header
        n = self.n = header["n"]
        names = [name for name, _ in _COLUMNS] + ["tids"]
        head = at + 4 + 4 * len(names)
        if len(payload) < head:
            raise TxIndexError("a block's body is too short")
        m = _U32.unpack_from(payload, at)[0]
        self._raw = {}
        pos = head
        for i, (name, code) in enumerate([*_COLUMNS, ("tids", "I")]):
            length = _U32.unpack_from(payload, at + 4 + 4 * i)[0]
            self._raw[name] = (payload, pos, length, code, m if name == "tids" else n)
            pos += length
        if pos != len(payload):
            raise TxIndexError("a block's columns do not fill its body")
        self._m = m
        self._cols: dict = {}

    def _col(self, name: str) -> array:
        """One column, decompressed when first asked for (each is its own zlib stream)."""
        got = self._cols.get(name)
        if got is None:
            payload, pos, length, code, count = self._raw[name]
            try:
                raw = zlib.decompress(payload[pos:pos + length])
            except zlib.error as exc:
                raise TxIndexError(f"a block's {name} column does not decompress: {exc}") from None
            got = self._cols[name] = _unshuffle(raw, code, count)
        return got

    @functools.cached_property
    def ends(self) -> list[int]:
        ends = list(accumulate(map(add, self._col("gap"), self._col("length")), initial=self.header["first"]))[1:]
        if ends[-1] != self.header["end"]:
            raise TxIndexError("a block's records do not match its header")
        return ends

    @functools.cached_property
    def starts(self) -> list[int]:
        starts = list(map(sub, self.ends, self._col("length")))
        if starts[0] != self.header["first"] or starts[-1] != self.header["last"]:
            raise TxIndexError("a block's records do not match its header")
        return starts

    @functools.cached_property
    def _gtids(self) -> tuple[list, list]:
        header, n = self.header, self.n
        src_list = [None] + [(e[0], e[1]) for e in header["gtids"]]
        nsrc = len(src_list)
        src_col, deltas = self._col("source"), self._col("number")
        if nsrc == 2 and src_col.count(1) == n:  # one GTID source, no anonymous group: the common case
            lo, hi = header["gtids"][0][2], header["gtids"][0][3]
            nums = list(accumulate(deltas, initial=lo))[1:]
            if min(nums) < lo or max(nums) > hi:
                raise TxIndexError("a record's GTID lies outside its block's range")
            return [src_list[1]] * n, nums
        ranges = [None] + [(e[2], e[3]) for e in header["gtids"]]
        last_num = [0] + [e[2] for e in header["gtids"]]
        srcs, nums = [], []
        for si, d in zip(src_col, deltas):
            if si >= nsrc:
                raise TxIndexError("a record names a GTID source its block does not list")
            if si:
                v = last_num[si] + d
                lo, hi = ranges[si]
                if not lo <= v <= hi:
                    raise TxIndexError("a record's GTID lies outside its block's range")
                last_num[si] = v
                nums.append(v)
            else:
                nums.append(0)
            srcs.append(src_list[si])
        return srcs, nums

    @property
    def sources(self) -> list:
        return self._gtids[0]

    @property
    def numbers(self) -> list[int]:
        return self._gtids[1]

    @functools.cached_property
    def commits(self) -> list[int]:
        lo, hi = self.header["min_us"], self.header["max_us"]
        commits = list(accumulate(self._col("commit"), initial=lo))[1:]
        if min(commits) < lo or max(commits) > hi:
            raise TxIndexError("a record's commit time lies outside its block's range")
        return commits

    @functools.cached_property
    def coarse(self) -> array:
        col = self._col("coarse")
        if col.count(0) + col.count(1) != self.n:
            raise TxIndexError("a record's resolution flag is neither 0 nor 1")
        return col

    @functools.cached_property
    def toff(self) -> list[int]:
        toff = list(accumulate(self._col("ntables"), initial=0))
        if toff[-1] != self._m:
            raise TxIndexError("a block's table counts do not match its table ids")
        return toff

    @functools.cached_property
    def tids(self) -> array:
        tids = self._col("tids")
        if self._m and not set(self.header["tables"]).issuperset(tids):
            raise TxIndexError("a record names a table its block does not list")
        return tids

    def check(self) -> "Block":
        """Decode every column (what a lazy lookup would meet): TxIndexError when one does not match the header."""
        _ = self.starts, self._gtids, self.commits, self.coarse, self.toff, self.tids
        return self

    def __len__(self) -> int:
        return self.n

    def find(self, source, number: int) -> int | None:
        """The index of the record of GTID (source, number), or None."""
        nums, k = self.numbers, -1
        while True:
            try:
                k = nums.index(number, k + 1)
            except ValueError:
                return None
            if self.sources[k] == source:
                return k

    def touching(self, tid: int) -> list[int]:
        """The indexes of the records that touch table ``tid``, in order (found in the table-id column, at C speed)."""
        tids, toff, at = self.tids, self.toff, -1
        out: list[int] = []
        while True:
            try:
                at = tids.index(tid, at + 1)
            except ValueError:
                return out
            k = bisect.bisect_right(toff, at) - 1
            if not out or out[-1] != k:
                out.append(k)

    def first_at_or_after(self, commit_us: int) -> int:
        """The index of the first record whose commit time is >= ``commit_us`` (n when none)."""
        return bisect.bisect_left(list(accumulate(self.commits, max)), commit_us)

    def record(self, i: int) -> Record:
        if "commits" in self.__dict__ and "ends" in self.__dict__ and "toff" in self.__dict__:
            toff = self.toff
            return Record(self.starts[i], self.ends[i], self.sources[i], self.numbers[i], self.commits[i],
                          bool(self.coarse[i]), tuple(self.tids[toff[i]:toff[i + 1]]))
        # One record of a lookup: prefix sums over the arrays (C speed), without building every column's list.
        h = self.header
        lengths, ntables = self._col("length"), self._col("ntables")
        end = h["first"] + sum(self._col("gap")[:i + 1]) + sum(lengths[:i + 1])
        start = end - lengths[i]
        commit = h["min_us"] + sum(self._col("commit")[:i + 1])
        t0 = sum(ntables[:i])
        tids = tuple(self._col("tids")[t0:t0 + ntables[i]])
        coarse = self._col("coarse")[i]
        if not (h["first"] <= start <= end <= h["end"] and h["min_us"] <= commit <= h["max_us"] and coarse in (0, 1)
                and set(tids).issubset(h["tables"])):
            raise TxIndexError("a block's record does not match its header")
        return Record(start, end, self.sources[i], self.numbers[i], commit, bool(coarse), tids)

    def records(self) -> list[Record]:
        return [self.record(i) for i in range(self.n)]


def decode_block(payload: bytes) -> list[Record]:
    """The records of a B frame's payload; TxIndexError when it does not decode to what its header says."""
    return Block(payload).records()


def frame(kind: int, payload: bytes) -> bytes:
    head = _FRAME.pack(kind, len(payload))
    return head + payload + _U32.pack(_crc32(payload, _crc32(head)))


def iter_frames(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(frame start, kind, payload) of each whole, CRC-good frame after the magic; stops at the first that is not
    (the caller sees where from the last frame's end)."""
    pos = len(MAGIC)
    n = len(data)
    while n - pos >= _FRAME.size + 4:
        kind, length = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length + 4
        if length > MAX_FRAME or end > n:
            return
        payload = data[pos + _FRAME.size:end - 4]
        if _U32.unpack_from(data, end - 4)[0] != _crc32(payload, _crc32(data[pos:pos + _FRAME.size])):
            return
        yield pos, kind, bytes(payload)
        pos = end


# ---------------------------------------------------------------------------------------------
# Collecting transactions from the scanner (sans-I/O)


class TableDictionary:
    """The file's table names and their ids (in the order first seen)."""

    def __init__(self, names: Iterable[str] = ()):
        self.names: list[str] = list(names)
        self.ids = {n: i for i, n in enumerate(self.names)}
        self.unwritten: list[str] = []

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
            self.unwritten.append(name)
        return i


class TransactionCollector:
    """Fed a BinlogScanner's events and groups (``on_event`` / ``on_group``), it calls ``emit(Record)`` for each
    complete group, in file order."""

    # The events it reads; the scanner hands it no others (a commit time without an immediate_commit_timestamp is
    # the group's closing event's, which the group carries).
    EVENT_TYPES = frozenset({C.FORMAT_DESCRIPTION_EVENT, C.GTID_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT,
                             C.GTID_TAGGED_LOG_EVENT, C.MARIA_GTID_EVENT, C.TABLE_MAP_EVENT, C.QUERY_EVENT,
                             C.TRANSACTION_PAYLOAD_EVENT})

    def __init__(self, emit: Callable[[Record], None], tables: TableDictionary, fde: FormatDescription | None = None):
        self.emit = emit
        self.tables = tables
        self.fde = fde
        self._reset()

    def _reset(self) -> None:
        self._ict: int | None = None
        self._names: list[str] = []

    def on_event(self, ev: ScannedEvent) -> None:
        """One event of ``EVENT_TYPES`` (the scanner calls it for no other)."""
        t = ev.type_code
        if t == C.FORMAT_DESCRIPTION_EVENT:
            try:
                self.fde = FormatDescription.parse(ev.data, 0, len(ev.data))
            except Exception:  # noqa: BLE001 - the scanner reports a bad FDE
                pass
            return
        if t in (C.GTID_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT):
            self._reset()
            self._ict = self._commit_timestamp(ev.data)
        elif t == C.MARIA_GTID_EVENT:
            self._reset()
        elif t == C.TABLE_MAP_EVENT:
            self._table_map(ev.data, self.fde)
        elif t == C.QUERY_EVENT:
            self._query(ev.data, self.fde)
        elif t == C.TRANSACTION_PAYLOAD_EVENT and not ev.streamed:
            self._payload(ev.data)

    def on_group(self, group: ScannedGroup) -> None:
        if group.complete:
            source, number = _gtid_parts(group.gtid)
            if self._ict:
                us, coarse = self._ict, False
            else:
                us, coarse = group.end_timestamp * 1_000_000, True  # the closing event's header timestamp
            ids = []
            for n in self._names:
                i = self.tables.id(n)
                if i not in ids:
                    ids.append(i)
            self.emit(Record(group.start, group.end, source, number, us, coarse, tuple(ids)))
        self._reset()

    # -- event bodies ------------------------------------------------------------------------------
    def _commit_timestamp(self, data: bytes) -> int | None:
        from ..binlog.views import GtidView, view_event

        try:
            view = view_event(data, 0, self.fde)
            if not isinstance(view, GtidView):
                return None
            return view.immediate_commit_timestamp or None
        except Exception:  # noqa: BLE001 - a 5.6/5.7 GTID event has none; a damaged one is the scanner's to report
            return None

    def _table_map(self, data, fde) -> None:
        try:
            ph = fde.post_header_len(C.TABLE_MAP_EVENT) if fde is not None else 8
            pos = C.HEADER_LEN + (ph or 8)
            dl = data[pos]
            db = bytes(data[pos + 1:pos + 1 + dl]).decode("utf-8", "replace")
            pos += 1 + dl + 1
            tl = data[pos]
            tbl = bytes(data[pos + 1:pos + 1 + tl]).decode("utf-8", "replace")
        except (IndexError, TypeError):
            return
        name = f"{db}.{tbl}"
        if name not in self._names:
            self._names.append(name)

    def _query(self, data, fde) -> None:
        try:
            ph = fde.query_post_header_len if fde is not None else 13
            body = C.HEADER_LEN
            db_len = data[body + 8]
            status_len = _U16.unpack_from(data, body + 11)[0] if ph >= 13 else 0
            db_start = body + ph + status_len
            q = db_start + db_len + 1
            end = len(data) - (fde.checksum_len if fde is not None else 0)
            head = bytes(data[q:min(end, q + 4096)])
            if not head or head[:1] in (b"B", b"C") and head in (b"BEGIN", b"COMMIT"):
                return
            db = bytes(data[db_start:db_start + db_len]).decode("utf-8", "replace")
        except (IndexError, struct.error):
            return
        for name in statement_tables(head.decode("utf-8", "replace"), db):
            if name not in self._names:
                self._names.append(name)

    def _payload(self, data) -> None:
        from ..binlog.views import TransactionPayloadView, view_event

        try:
            view = view_event(data, 0, self.fde)
            if not isinstance(view, TransactionPayloadView):
                return
            inner_fde = view.inner_format
            for inner in view.iter_inner_events():
                raw = bytes(inner.buf[inner.offset:inner.body_end])
                code = raw[4]
                if code == C.TABLE_MAP_EVENT:
                    self._table_map(raw, inner_fde)
                elif code == C.QUERY_EVENT:
                    self._query(raw, inner_fde)
        except Exception:  # noqa: BLE001 - best-effort: a payload that does not decode names no table
            return


# ---------------------------------------------------------------------------------------------
# Building sidecar bytes (sans-I/O)


class SidecarBuilder:
    """Turns records into sidecar frames: ``add`` records, ``flush`` a block (also done when one fills), ``take``
    the bytes produced so far (to append to the file), ``footer`` once the file is closed."""

    def __init__(self, name: str, tables: TableDictionary, *, header: bool = True, fde_bytes: bytes | None = None,
                 block_records: int = BLOCK_RECORDS):
        self.name = name
        self.tables = tables
        self.block_records = block_records
        self.pending: list[Record] = []
        self.out = bytearray()
        self.header_written = not header
        self.magic_written = not header
        self.fde_bytes = fde_bytes
        self.records = 0
        self.end = 4  # end of the last record in a written block
        self.tail_source: Callable[[int], bytes] | None = None  # file bytes before an offset (the tail CRC)

    def start(self, fde_bytes: bytes) -> None:
        if not self.header_written:
            if not self.magic_written:
                self.out += MAGIC
                self.magic_written = True
            self.out += frame(K_HEADER, json.dumps({
                "format": FORMAT, "version": VERSION, "name": self.name, "fde_len": len(fde_bytes),
                "fde_crc": _crc32(fde_bytes)}).encode())
            self.header_written = True

    def add(self, record: Record) -> None:
        self.pending.append(record)
        if len(self.pending) >= self.block_records:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        if not self.header_written:
            if self.fde_bytes is None:
                raise TxIndexError("the file's FORMAT_DESCRIPTION is not known: cannot start its index")
            self.start(self.fde_bytes)
        if self.tables.unwritten:
            self.out += frame(K_DICT, json.dumps(self.tables.unwritten).encode())
            self.tables.unwritten = []
        end = self.pending[-1].end
        tail = self.tail_source(end) if self.tail_source is not None else b""
        self.out += frame(K_BLOCK, encode_block(self.pending, _crc32(tail)))
        self.records += len(self.pending)
        self.end = end
        self.pending = []

    def footer(self, size: int, tail: bytes) -> None:
        self.flush()
        if not self.header_written and self.fde_bytes is not None:
            self.start(self.fde_bytes)
        if self.header_written:
            self.out += frame(K_FOOTER, json.dumps({"size": size, "transactions": self.records,
                                                     "tail": _crc32(tail)}).encode())

    def take(self) -> bytes:
        data = bytes(self.out)
        self.out = bytearray()
        return data


# ---------------------------------------------------------------------------------------------
# Files: reading a relay file's bytes, building and loading sidecars


def _read_fde(f) -> bytes | None:
    head = f.read(4, C.HEADER_LEN)
    if len(head) < C.HEADER_LEN or head[4] != C.FORMAT_DESCRIPTION_EVENT:
        return None
    size = int.from_bytes(head[9:13], "little")
    if not C.HEADER_LEN < size <= 64 << 10:
        return None
    raw = f.read(4, size)
    return raw if len(raw) == size else None


def _tail(f, end: int) -> bytes:
    start = max(4, end - TAIL_CHECK)
    return f.read(start, end - start) if end > start else b""


def scan_records(f, name: str, *, start: int = 4, stop: int | None = None, tables: TableDictionary | None = None,
                 emit: Callable[[Record], None], fde_bytes: bytes | None = None,
                 stop_event: threading.Event | None = None) -> int:
    """Feed the logical file ``f`` (closed_files.LogicalFile) from ``start`` (4, or a boundary: a block's end) to
    ``stop`` (its size when None) through the scanner; ``emit`` each complete group's Record. Returns where the
    scan reached (the end of the last complete group or outside event: never inside a group)."""
    tables = tables if tables is not None else TableDictionary()
    if stop is None:
        stop = f.size()
    collector = TransactionCollector(emit, tables)
    if start > 4:
        raw = fde_bytes if fde_bytes is not None else _read_fde(f)
        if raw is None:
            raise TxIndexError(f"{name}: no FORMAT_DESCRIPTION_EVENT to resume the scan at {start}")
        try:
            fde = FormatDescription.parse(raw, 0, len(raw))
        except BinlogFormatError as exc:
            raise TxIndexError(f"{name}: its FORMAT_DESCRIPTION_EVENT does not parse: {exc}") from None
        collector.fde = fde
        scanner = _scanner_for(collector, name, resume=(start, fde))
        pos = start
    else:
        scanner = _scanner_for(collector, name)
        pos = 0
    while pos < stop:
        if stop_event is not None and stop_event.is_set():
            raise _Stopped()
        chunk = f.read(pos, min(_CHUNK, stop - pos))
        if not chunk:
            break
        scanner.feed(chunk)
        pos += len(chunk)
        if scanner._stopped:
            break
    return scanner.result.good_end


def _scanner_for(collector: TransactionCollector, name: str, *,
                 resume: tuple[int, FormatDescription] | None = None) -> BinlogScanner:
    """A scanner of relay file ``name`` feeding ``collector``: from the file's start, or resumed at a boundary
    ``(offset, FORMAT_DESCRIPTION)``."""
    # track_gtids off: the index takes each group's GTID; the file's GTID set is not needed.
    if resume is None:
        return BinlogScanner(on_event=collector.on_event, on_group=collector.on_group, track_gtids=False,
                             on_event_types=collector.EVENT_TYPES, max_event_in_memory=_MAX_EVENT_IN_MEMORY, path=name)
    return BinlogScanner.resume(resume[0], resume[1], on_event=collector.on_event, on_group=collector.on_group,
                                track_gtids=False, on_event_types=collector.EVENT_TYPES,
                                max_event_in_memory=_MAX_EVENT_IN_MEMORY, path=name)


class _Stopped(Exception):
    pass


def build_bytes(relay_dir: Path, name: str, *, stop: int | None = None, closed: bool = True,
                stop_event: threading.Event | None = None) -> tuple[bytes, int]:
    """(sidecar bytes, end covered) of relay file ``name`` scanned from its start (any storage form) up to
    ``stop`` (its size); with a footer when ``closed`` and the whole file was read."""
    with open_relay_file(Path(relay_dir) / name) as f:
        size = f.size()
        upto = size if stop is None else min(stop, size)
        fde = _read_fde(f)
        tables = TableDictionary()
        b = SidecarBuilder(name, tables, fde_bytes=fde)
        b.tail_source = lambda end: _tail(f, end)
        if fde is not None:
            b.start(fde)
        reached = scan_records(f, name, stop=upto, tables=tables, emit=b.add, stop_event=stop_event)
        if closed and upto == size:
            b.footer(size, _tail(f, size))
        else:
            b.flush()
        return bytes(b.out) if b.out else MAGIC, reached


@dataclass
class BlockRef:
    header: dict
    offset: int  # of the payload in the sidecar (or the in-memory image)
    length: int
    ntables: int  # table names known (D frames before it)

    @property
    def frame_end(self) -> int:
        return self.offset + self.length + 4


@dataclass
class Sidecar:
    """A loaded, verified sidecar: its blocks (bodies read on demand), table names and footer."""

    name: str
    path: Path | None  # None: held in memory (a file scanned where its sidecar may not be written)
    image: bytes | None
    blocks: list[BlockRef]
    tables: list[str]
    footer: dict | None
    good_len: int  # bytes of the sidecar that are good frames (a torn tail after it)
    covered: int  # the end of the last block (4 when none)
    fde_bytes: bytes | None = None
    header: dict | None = None
    header_end: int = len(MAGIC)
    footer_end: int | None = None

    def payload(self, ref: BlockRef) -> bytes:
        if self.image is not None:
            return self.image[ref.offset:ref.offset + ref.length]
        assert self.path is not None  # a sidecar without its image in memory was loaded from its path
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, ref.length, ref.offset)
        finally:
            os.close(fd)
        if len(data) != ref.length:
            raise TxIndexError(f"{self.path}: a block is cut short (the sidecar shrank)")
        return data

    @property
    def transactions(self) -> int:
        return sum(b.header["n"] for b in self.blocks)


def parse_sidecar(data: bytes, name: str, *, path: Path | None = None, keep_image: bool = False) -> Sidecar:
    """The frames of a sidecar image, checked (TxIndexError for a header that is not this file's); blocks after a
    torn or bad frame are not kept (``good_len`` says where the good frames end)."""
    if data[:len(MAGIC)] != MAGIC:
        raise TxIndexError("not a transaction index (bad magic)")
    header = None
    blocks: list[BlockRef] = []
    tables: list[str] = []
    footer = None
    footer_end = None
    good = len(MAGIC)
    header_end = len(MAGIC)  # set with the header frame (without one the sidecar is refused below)
    for pos, kind, payload in iter_frames(data):
        end = pos + _FRAME.size + len(payload) + 4
        if footer is not None:
            break  # nothing may follow a footer
        if header is None:
            if kind != K_HEADER:
                raise TxIndexError("the first frame is not the header")
            try:
                header = json.loads(payload)
            except ValueError:
                raise TxIndexError("the header is not JSON") from None
            if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
                raise TxIndexError(f"not a {FORMAT} v{VERSION} sidecar")
            if header.get("name") != name:
                raise TxIndexError(f"the sidecar is {header.get('name')!r}'s")
            header_end = end
        elif kind == K_DICT:
            try:
                names = json.loads(payload)
            except ValueError:
                break
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                break
            tables = tables + names
        elif kind == K_BLOCK:
            try:
                bh, _at = block_header(payload)
            except TxIndexError:
                break
            if blocks and bh["first"] < blocks[-1].header["end"] or any(t >= len(tables) for t in bh["tables"]):
                break
            blocks.append(BlockRef(bh, pos + _FRAME.size, len(payload), len(tables)))
        elif kind == K_FOOTER:
            try:
                footer = json.loads(payload)
            except ValueError:
                break
            if not isinstance(footer, dict) or type(footer.get("size")) is not int:
                footer = None
                break
            footer_end = end
        else:
            break
        good = end
    if header is None:
        raise TxIndexError("the sidecar has no header frame")
    side = Sidecar(name, path, data if keep_image else None, blocks, tables, footer, good,
                   blocks[-1].header["end"] if blocks else 4)
    side.header = header
    side.header_end = header_end
    side.footer_end = footer_end
    return side


def verify(side: Sidecar, f) -> str | None:
    """Cut ``side`` to what matches the open logical file ``f``; why it does not describe the file at all, or None.
    Blocks past the file's end are dropped (recovery cut the file), with the frames after them (``good_len``
    then says where the sidecar is to be cut); the header's FORMAT_DESCRIPTION, the last kept block's tail CRC
    and the footer must match the file."""
    size = f.size()
    fde = _read_fde(f)
    h = side.header or {}
    if fde is None or (len(fde), _crc32(fde)) != (h.get("fde_len"), h.get("fde_crc")):
        return "the file's FORMAT_DESCRIPTION_EVENT is not the one indexed"
    side.fde_bytes = fde
    cut = False
    while side.blocks and side.blocks[-1].header["end"] > size:
        side.blocks.pop()
        cut = True
    if cut:
        side.footer = None
        side.footer_end = None
    if side.footer is not None:
        if side.footer["size"] != size:
            return f"the footer describes a file of {side.footer['size']} bytes, the file holds {size}"
        if side.footer.get("tail") != _crc32(_tail(f, size)):
            return "the file's last bytes are not the ones indexed (CRC32 differs)"
    if side.blocks:
        last = side.blocks[-1].header
        if _crc32(_tail(f, last["end"])) != last["tail"]:
            return f"the file's bytes before offset {last['end']} are not the ones indexed (CRC32 differs)"
    side.covered = side.blocks[-1].header["end"] if side.blocks else 4
    if side.footer is not None:
        assert side.footer_end is not None  # parse_sidecar sets both with the footer frame; a cut drops both
        side.good_len = side.footer_end
    else:
        side.good_len = side.blocks[-1].frame_end if side.blocks else side.header_end
        side.tables = side.tables[:side.blocks[-1].ntables] if side.blocks else []
    return None


def load(relay_dir: Path, name: str) -> tuple[Sidecar | None, str | None]:
    """(the verified sidecar of ``name``, None) or (None, why not: "no index" when there is none)."""
    path = sidecar_path(relay_dir, name)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "no index"
    except OSError as exc:
        return None, f"index unreadable: {exc.strerror}"
    try:
        side = parse_sidecar(data, name, path=path)
    except TxIndexError as exc:
        return None, f"index damaged: {exc}"
    try:
        with open_relay_file(Path(relay_dir) / name) as f:
            problem = verify(side, f)
    except (OSError, StoredFileError) as exc:
        return None, f"cannot read the file to check its index: {exc}"
    if problem is not None:
        return None, f"index does not match: {problem}"
    return side, None


def write_atomically(relay_dir: Path, name: str, data: bytes) -> None:
    side = sidecar_path(relay_dir, name)
    if len(side.name.encode("utf-8", "surrogateescape")) > 255:
        raise TxIndexError(f"{name}: the index's name would be longer than a file name may be")
    tmp = side.with_name(f"{side.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    write_file_atomically(side, data, tmp=tmp)


def rebuild(relay_dir: Path, name: str, *, closed: bool = True, stop: int | None = None,
            stop_event: threading.Event | None = None) -> int:
    """Build the sidecar of ``name`` from the file alone and replace the old one atomically; returns the
    transactions indexed."""
    data, _reached = build_bytes(relay_dir, name, stop=stop, closed=closed, stop_event=stop_event)
    write_atomically(relay_dir, name, data)
    side = parse_sidecar(data, name) if data != MAGIC else None
    return side.transactions if side is not None else 0


def remove(relay_dir: Path, name: str) -> None:
    """Remove the sidecar of ``name`` (with its file: PURGE, retention); no error when there is none."""
    try:
        os.unlink(sidecar_path(relay_dir, name))
    except FileNotFoundError:
        pass


def clean_leftovers(relay_dir: Path) -> list[str]:
    """Remove temporary sidecars a crash left, and sidecars whose relay file is gone; returns their names."""
    relay_dir = Path(relay_dir)
    removed: list[str] = []
    try:
        entries = list(os.scandir(relay_dir))
    except OSError:
        return removed
    names = {logical_name(e.name) for e in entries}
    archive = archive_dir_of(relay_dir)
    if archive is not None:
        try:
            names |= {logical_name(e.name) for e in os.scandir(archive)}
        except OSError:
            return removed
    for entry in entries:
        if not entry.name.startswith(SIDECAR_PREFIX):
            continue
        if entry.name.endswith(".tmp") or entry.name[len(SIDECAR_PREFIX):] not in names:
            try:
                os.unlink(entry.path)
                removed.append(entry.name)
            except OSError:
                pass
    if removed:
        log.info("removed leftover transaction indexes", files=removed)
    return removed


# ---------------------------------------------------------------------------------------------
# The background writer


class _Follow:
    """The indexer's state for the file it follows: the open sidecar, the scanner fed up to ``fed``."""

    def __init__(self, relay_dir: Path, name: str):
        self.relay_dir = relay_dir
        self.name = name
        self.path = sidecar_path(relay_dir, name)
        self.tables = TableDictionary()
        self.builder: SidecarBuilder | None = None
        self.fed = 4
        self.scanner: BinlogScanner | None = None
        self.collector: TransactionCollector | None = None
        self.last_flush = time.monotonic()
        self.fd = -1
        self.fde_bytes: bytes | None = None
        self.stop_event: threading.Event | None = None  # set: stop between two chunks (the store is closing)

    def open(self, f) -> SidecarBuilder:
        """Take up the existing sidecar (cut to its good part) or start a new one (atomically); its builder."""
        side, why = load(self.relay_dir, self.name)
        start = 4
        if side is not None and side.footer is None:
            self.tables = TableDictionary(side.tables)
            self.fde_bytes = side.fde_bytes
            start = side.covered
            fd = os.open(self.path, os.O_RDWR)
            if os.fstat(fd).st_size != side.good_len:
                os.ftruncate(fd, side.good_len)  # a torn frame, or blocks past the file's recovered end
            os.lseek(fd, 0, os.SEEK_END)
            self.fd = fd
            self.builder = SidecarBuilder(self.name, self.tables, header=False, fde_bytes=self.fde_bytes)
            self.builder.records = side.transactions
            self.builder.end = start
        else:
            if why not in (None, "no index"):
                log.warning("transaction index rebuilt", file=self.name, reason=why)
            self.fde_bytes = _read_fde(f)
            self.builder = SidecarBuilder(self.name, self.tables, fde_bytes=self.fde_bytes)
            if self.fde_bytes is not None:
                self.builder.start(self.fde_bytes)
                data = self.builder.take()
            else:
                data = MAGIC
                self.builder.magic_written = True
            write_atomically(self.relay_dir, self.name, data)
            self.fd = os.open(self.path, os.O_RDWR)
            os.lseek(self.fd, 0, os.SEEK_END)
        self.fed = start
        return self.builder

    def advance(self, f, upto: int) -> None:
        """Feed the file's bytes ``[fed, upto)`` (durable: at or below the horizon) and append full blocks."""
        builder = self.builder if self.builder is not None else self.open(f)
        builder.tail_source = lambda end: _tail(f, end)
        if self.fde_bytes is None:
            self.fde_bytes = _read_fde(f)
            if self.fde_bytes is None:
                return
            builder.fde_bytes = self.fde_bytes
            if not builder.header_written:
                builder.start(self.fde_bytes)
        scanner = self.scanner
        if scanner is None:
            self.collector = TransactionCollector(builder.add, self.tables)
            if self.fed > 4:
                fde = FormatDescription.parse(self.fde_bytes, 0, len(self.fde_bytes))
                self.collector.fde = fde
                scanner = self.scanner = _scanner_for(self.collector, self.name, resume=(self.fed, fde))
            else:
                scanner = self.scanner = _scanner_for(self.collector, self.name)
                self.fed = 0
        while self.fed < upto:
            if self.stop_event is not None and self.stop_event.is_set():
                raise _Stopped()
            chunk = f.read(self.fed, min(_CHUNK, upto - self.fed))
            if not chunk:
                break
            scanner.feed(chunk)
            self.fed += len(chunk)
            self._write()
            if scanner.result.error is not None:
                raise TxIndexError(f"{self.name}: {scanner.result.error}")
        self._write()

    def tick(self, now: float) -> None:
        if self.builder is not None and self.builder.pending and now - self.last_flush >= FLUSH_SECONDS:
            self.builder.flush()
            self._write()

    def _write(self) -> None:
        assert self.builder is not None  # called once open() made the builder (advance, tick, finish)
        data = self.builder.take()
        if data:
            os.write(self.fd, data)
            self.last_flush = time.monotonic()

    def finish(self, f) -> None:
        """The file is closed: index the rest, append the footer, fsync; compact when many small blocks."""
        size = f.size()
        self.advance(f, size)
        if self.builder is None:
            return
        self.builder.footer(size, _tail(f, size))
        self._write()
        os.fsync(self.fd)
        self.close()
        side, _why = load(self.relay_dir, self.name)
        if side is not None and side.footer is not None and len(side.blocks) > side.transactions // BLOCK_RECORDS + 1:
            compact(self.relay_dir, self.name, side)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def compact(relay_dir: Path, name: str, side: Sidecar) -> None:
    """Rewrite a closed file's sidecar in full blocks (atomically), streaming one block at a time. ``side`` is
    a loaded (verified) sidecar with its footer."""
    footer, fde_bytes = side.footer, side.fde_bytes
    if footer is None or fde_bytes is None:
        raise TxIndexError(f"{name}: only a verified sidecar with its footer is compacted")
    tables = TableDictionary(side.tables)
    tables.unwritten = list(side.tables)
    b = SidecarBuilder(name, tables, fde_bytes=side.fde_bytes)
    with open_relay_file(Path(relay_dir) / name) as f:
        b.tail_source = lambda end: _tail(f, end)
        b.start(fde_bytes)
        for ref in side.blocks:
            for r in decode_block(side.payload(ref)):
                b.add(r)
        b.footer(footer["size"], _tail(f, footer["size"]))
    write_atomically(relay_dir, name, bytes(b.out))


def finish_closed(relay_dir: Path, name: str, *, stop_event: threading.Event | None = None) -> bool:
    """Make sure the closed file ``name`` has a finished sidecar: take up an unfinished one (index the rest, footer),
    rebuild one that is missing or does not match. Returns whether anything was written."""
    side, why = load(relay_dir, name)
    if side is not None and side.footer is not None:
        return False
    if side is None and why != "no index":
        log.warning("transaction index rebuilt", file=name, reason=why)
    if side is None:
        rebuild(relay_dir, name, closed=True, stop_event=stop_event)
        return True
    follow = _Follow(Path(relay_dir), name)
    try:
        with open_relay_file(Path(relay_dir) / name) as f:
            follow.finish(f)
    finally:
        follow.close()
    return True


class TxIndexer:
    """Follows a store's horizon in a background thread (``relay-txindex``): reads the newly durable bytes of the
    current file (from the page cache), appends blocks, finishes a file when the store moves past it, and finishes
    or builds the sidecars that closed files lack. The store never waits on it: it reads ``horizon()`` and
    ``files()`` (immutable values) when it wakes, every ``poll_seconds``."""

    def __init__(self, relay_dir: Path, files: Callable[[], list[str]], horizon: Callable[[], tuple[str | None, int]],
                 *, poll_seconds: float = 0.5):
        self.relay_dir = Path(relay_dir)
        self._files = files
        self._horizon = horizon
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._follow: _Follow | None = None
        self._done: set[str] = set()  # closed files whose sidecar is finished
        self.finished: list[str] = []
        self.errors: deque[str] = deque(maxlen=KEPT_ERRORS)  # the newest; error_count counts them all
        self.error_count = 0
        self.passes = 0
        self._pass_done = threading.Condition()
        clean_leftovers(self.relay_dir)

    def start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="relay-txindex", daemon=True)
            self._thread.start()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait for two whole passes after this call (tests, benchmarks): what was durable is indexed (blocks
        written only when full or FLUSH_SECONDS old)."""
        with self._pass_done:
            target = self.passes + 2
            self._wake.set()
            return self._pass_done.wait_for(lambda: self.passes >= target or self._thread is None, timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.run_pass():
                    return
                if self._wake.wait(self.poll_seconds):
                    self._wake.clear()
        except BaseException:  # noqa: BLE001 - the process (or the simulated machine) is going down
            return
        finally:
            self._drop_follow()
            with self._pass_done:
                self._pass_done.notify_all()

    def run_pass(self) -> bool:
        """One pass (``run_once``) with its errors logged and kept in ``errors`` (it is retried at the next), counted
        in ``passes``; False when it was stopped (``close``)."""
        try:
            self.run_once()
        except _Stopped:
            return False
        except FileNotFoundError as exc:
            self._drop_follow()
            if not self.relay_dir.exists():
                return False  # the directory is gone (a test's, a removed relay): nothing left to follow
            log.debug("transaction index pass: a file went away meanwhile", error=str(exc))
        except (OSError, TxIndexError, StoredFileError) as exc:
            self._drop_follow()
            self._error(str(exc))
            log.warning("transaction index pass failed: it is retried", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a defect must not end indexing for good
            self._drop_follow()
            self._error(repr(exc))
            log.error("transaction index pass failed unexpectedly", error=repr(exc))
        with self._pass_done:
            self.passes += 1
            self._pass_done.notify_all()
        return True

    def _error(self, message: str) -> None:
        self.errors.append(message)
        self.error_count += 1

    def describe(self) -> dict:
        """The indexer's health (/status ``txindex``, /metrics): where it runs, its passes, the files it finished,
        its errors (each pass that failed; it is retried) and the newest of them."""
        return {"mode": "thread", "passes": self.passes, "files_finished": len(self.finished),
                "errors": self.error_count, "last_error": self.errors[-1] if self.errors else None}

    def _drop_follow(self) -> None:
        if self._follow is not None:
            self._follow.close()
            self._follow = None

    def run_once(self) -> None:
        """One pass: follow the horizon's file, finish the one it left, finish or build what closed files lack."""
        file, position = self._horizon()
        files = self._files()
        follow = self._follow
        if follow is not None and follow.name != file:
            if follow.name in files:  # the store moved past it: the file is closed and durable whole
                with open_relay_file(self.relay_dir / follow.name) as f:
                    follow.finish(f)
                self.finished.append(follow.name)
                self._done.add(follow.name)
            self._drop_follow()
            follow = None
        if file is not None and file in files:
            if follow is None:
                follow = self._follow = _Follow(self.relay_dir, file)
                follow.stop_event = self._stop
            with open_relay_file(self.relay_dir / file) as f:
                follow.advance(f, position)
                follow.tick(time.monotonic())
        # Closed files not known to be finished: the first pass looks at every one (a restart, an older relay
        # directory), later ones at those the store closed before this thread followed them.
        self._done &= set(files)
        for name in files:
            if name == file or name in self._done:
                continue
            if self._stop.is_set():
                raise _Stopped()
            try:
                wrote = finish_closed(self.relay_dir, name, stop_event=self._stop)
            except FileNotFoundError:
                continue
            if wrote:  # a file the store closed before this indexer followed it, finished here all the same
                self.finished.append(name)
            self._done.add(name)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._drop_follow()


# ---------------------------------------------------------------------------------------------
# The reader


@dataclass
class _FileView:
    name: str
    side: Sidecar
    tail: list[Record]  # transactions after the sidecar's last block, up to the horizon or the file's end (scanned)
    side_stamp: tuple
    horizon_pos: int | None
    min_us: int
    max_us: int
    sources: dict  # (kind, source) -> (min, max)
    table_ids: dict  # name -> id
    tables: list  # id -> name
    count: int
    run_max: list  # running maximum of commit times per block (the tail last), from the file's start
    gtid_blocks: dict  # (kind, source) -> (block los sorted, block ids, prefix max of his)


class TransactionIndex:
    """Lookups over the transaction indexes of a relay directory (read-only use allowed).

    ``files()`` gives the relay files oldest first, ``horizon()`` the durable ``(file, position)``: nothing past it
    is read or reported. Per-file summaries (GTID ranges, commit-time range and running maximum, table names) are
    read once and cached (dropped when the file list changes); the horizon's file is looked at again when it grew.
    A closed file whose sidecar is missing or does not match is rebuilt when ``writable``, else scanned and the
    result kept in memory; what a sidecar does not cover yet is scanned.

    Time rule: ``first_at_or_after(T)`` is the first transaction in binlog order whose commit time is >= T. The
    choice of file and block bisects the running maximum of commit times, which never decreases, so timestamps
    that go backwards (clock steps, a file from another master) cannot misdirect the search: the answer is where
    the running maximum first reaches T. With second-resolution times this is also the tie rule: T at a whole
    second gives the first transaction (binlog order) committed in that second, T inside a second the first of
    the next second.
    """

    def __init__(self, relay_dir, files: Callable[[], list[str]], horizon: Callable[[], tuple[str | None, int]], *,
                 writable: bool = False, cache_blocks: int = 64):
        self.relay_dir = Path(relay_dir)
        self._files_fn = files
        self._horizon_fn = horizon
        self.writable = writable
        self._views: dict[str, _FileView] = {}
        self._files_key: tuple = ()
        self._lock = threading.RLock()
        self._blocks: OrderedDict = OrderedDict()
        self._cache_blocks = cache_blocks

    @classmethod
    def for_store(cls, store: StoreReader, *, writable: bool | None = None) -> "TransactionIndex":
        def horizon():
            snap = store.horizon.snapshot()
            return snap.file, snap.position

        if writable is None:
            writable = store.sidecars_writable and not store.read_only
        return cls(store.relay_dir, store.files, horizon, writable=writable)

    # -- file views -------------------------------------------------------------------------------
    def _current(self) -> list[_FileView]:
        files = list(self._files_fn())
        hfile, hpos = self._horizon_fn()
        if hfile in files:
            files = files[:files.index(hfile) + 1]
        key = tuple(files)
        if key != self._files_key:
            self._views = {n: v for n, v in self._views.items() if n in files}
            self._files_key = key
            self._blocks.clear()
        views = []
        for name in files:
            v = self._view(name, hpos if name == hfile else None)
            views.append(v)
        return views

    def _side_stamp(self, name: str) -> tuple:
        try:
            st = os.stat(sidecar_path(self.relay_dir, name))
            return (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            return ()

    def _view(self, name: str, horizon_pos: int | None) -> _FileView:
        v = self._views.get(name)
        closed = horizon_pos is None
        if v is not None and closed and v.horizon_pos is None:
            return v  # a closed file does not change
        stamp = self._side_stamp(name)
        if v is not None and v.side_stamp == ("memory",) and not stamp:
            stamp = v.side_stamp  # scanned into memory before, and still no sidecar
        if v is not None and v.side_stamp == stamp and v.horizon_pos == horizon_pos:
            return v
        side: Sidecar | None
        if v is not None and v.side_stamp == stamp and (v.side.path is not None or len(v.tail) < 4 * BLOCK_RECORDS):
            side = v.side  # the sidecar is as it was: only the tail moved
        else:
            side, why = load(self.relay_dir, name)
            if side is None and closed and self.writable:
                if why != "no index":
                    log.warning("transaction index rebuilt", file=name, reason=why)
                try:
                    rebuild(self.relay_dir, name, closed=True)
                    side, why = load(self.relay_dir, name)
                    stamp = self._side_stamp(name)
                except (OSError, TxIndexError) as exc:
                    log.warning("transaction index not written: the file is scanned", file=name, error=str(exc))
            if side is None:
                if why not in ("no index", None):
                    log.info("transaction index not used: the file was scanned", file=name, reason=why)
                data, _ = build_bytes(self.relay_dir, name, stop=horizon_pos, closed=closed)
                if data == MAGIC:
                    side = Sidecar(name, None, MAGIC, [], [], None, len(MAGIC), 4)
                else:
                    side = parse_sidecar(data, name, keep_image=True)
                    side.covered = side.blocks[-1].header["end"] if side.blocks else 4
                stamp = ("memory",)
        blocks = side.blocks
        if horizon_pos is not None:
            blocks = [b for b in blocks if b.header["end"] <= horizon_pos]
        covered = blocks[-1].header["end"] if blocks else 4
        tables = TableDictionary(side.tables[:blocks[-1].ntables] if blocks else [])
        tables.names = list(side.tables)  # ids past the kept blocks are not reused below
        tables.ids = {n: i for i, n in enumerate(tables.names)}
        tail: list[Record] = []
        with open_relay_file(self.relay_dir / name) as f:
            limit = horizon_pos if horizon_pos is not None else f.size()
            if covered < limit and not (side.footer is not None and horizon_pos is None):
                scan_records(f, name, start=covered, stop=limit, tables=tables, emit=tail.append,
                             fde_bytes=side.fde_bytes)
        view_side = Sidecar(side.name, side.path, side.image, blocks, side.tables, side.footer, side.good_len,
                            covered, side.fde_bytes, side.header, side.header_end, side.footer_end)
        min_us = min([b.header["min_us"] for b in blocks] + [r.commit_us for r in tail], default=0)
        max_us = max([b.header["max_us"] for b in blocks] + [r.commit_us for r in tail], default=0)
        sources: dict = {}
        per_source: dict = {}
        for i, b in enumerate(blocks):
            for kind, src, lo, hi in b.header["gtids"]:
                cur = sources.get((kind, src))
                sources[(kind, src)] = (lo, hi) if cur is None else (min(cur[0], lo), max(cur[1], hi))
                per_source.setdefault((kind, src), []).append((lo, hi, i))
        for r in tail:
            if r.source is not None:
                cur = sources.get(r.source)
                sources[r.source] = (r.number, r.number) if cur is None else (
                    min(cur[0], r.number), max(cur[1], r.number))
        gtid_blocks = {}
        for key, entries in per_source.items():
            entries.sort()
            pmax, m = [], None
            for lo, hi, _i in entries:
                m = hi if m is None else max(m, hi)
                pmax.append(m)
            gtid_blocks[key] = ([e[0] for e in entries], [e[2] for e in entries], [e[1] for e in entries], pmax)
        run_max, m = [], None
        for b in blocks:
            m = b.header["max_us"] if m is None else max(m, b.header["max_us"])
            run_max.append(m)
        if tail:
            tm = max(r.commit_us for r in tail)
            run_max.append(tm if m is None else max(m, tm))
        count = sum(b.header["n"] for b in blocks) + len(tail)
        v = _FileView(name, view_side, tail, stamp, horizon_pos, min_us, max_us, sources, dict(tables.ids),
                      list(tables.names), count, run_max, gtid_blocks)
        self._views[name] = v
        return v

    def _block(self, v: _FileView, i: int):
        """Block ``i`` of ``v`` decoded (cached); ``len(blocks)`` is the scanned tail (a list of Records)."""
        if i == len(v.side.blocks):
            return v.tail
        ref = v.side.blocks[i]
        key = (v.name, ref.offset, v.side_stamp)
        got = self._blocks.get(key)
        if got is None:
            got = Block(v.side.payload(ref))
            self._blocks[key] = got
            if len(self._blocks) > self._cache_blocks:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return got

    @staticmethod
    def _rec(blk, i: int) -> Record:
        return blk[i] if isinstance(blk, list) else blk.record(i)

    def _tx(self, v: _FileView, r: Record) -> Transaction:
        names = v.tables
        return Transaction(v.name, r.start, r.end, _gtid_text(r.source, r.number), r.commit_us, r.second_resolution,
                           tuple(names[t] for t in r.tables if t < len(names)))

    # -- queries ----------------------------------------------------------------------------------
    def by_gtid(self, gtid: str) -> Transaction | None:
        """The transaction of ``gtid`` (text), or None. ValueError for text that is not a GTID."""
        source, number = parse_gtid(gtid)
        with self._lock:
            for v in reversed(self._current()):
                rng = v.sources.get(source)
                if rng is None or not rng[0] <= number <= rng[1]:
                    continue
                entry = v.gtid_blocks.get(source)
                if entry is not None:
                    los, ids, his, pmax = entry
                    j = bisect.bisect_right(los, number) - 1
                    while j >= 0 and pmax[j] >= number:
                        if his[j] >= number:
                            blk = self._block(v, ids[j])
                            k = blk.find(source, number)
                            if k is not None:
                                return self._tx(v, blk.record(k))
                        j -= 1
                for r in v.tail:
                    if r.source == source and r.number == number:
                        return self._tx(v, r)
            return None

    def _locate_time(self, commit_us: int):
        """(views, file index, block index, record index) of first_at_or_after, or None."""
        views = self._current()
        running = None
        for fi, v in enumerate(views):
            if not v.count:
                continue
            top = v.run_max[-1] if running is None else max(running, v.run_max[-1])
            if top < commit_us:
                running = top
                continue
            if running is not None and running >= commit_us:  # pragma: no cover - returned earlier
                break
            bi = bisect.bisect_left(v.run_max, commit_us)
            blk = self._block(v, bi)
            if isinstance(blk, list):
                ri = next((i for i, r in enumerate(blk) if r.commit_us >= commit_us), len(blk))
            else:
                ri = blk.first_at_or_after(commit_us)
            if ri < len(blk):
                return views, fi, bi, ri
            raise TxIndexError(f"{v.name}: a block's maximum commit time is not among its records")
        return None

    def first_at_or_after(self, commit_us: int) -> Transaction | None:
        """The first transaction (binlog order) whose commit time is >= ``commit_us`` (the class's time rule)."""
        with self._lock:
            found = self._locate_time(commit_us)
            if found is None:
                return None
            views, fi, bi, ri = found
            return self._tx(views[fi], self._rec(self._block(views[fi], bi), ri))

    def last_before(self, commit_us: int) -> Transaction | None:
        """The transaction just before ``first_at_or_after(commit_us)`` in binlog order (the last one when none is
        at or after); None when there is none before."""
        with self._lock:
            found = self._locate_time(commit_us)
            if found is None:
                return self.last()
            views, fi, bi, ri = found
            if ri > 0:
                return self._tx(views[fi], self._rec(self._block(views[fi], bi), ri - 1))
            for v_i in range(fi, -1, -1):
                v = views[v_i]
                top = bi - 1 if v_i == fi else len(v.side.blocks)
                for b_i in range(top, -1, -1):
                    blk = self._block(v, b_i)
                    if len(blk):
                        return self._tx(v, self._rec(blk, len(blk) - 1))
            return None

    def touching(self, table: str, from_us: int, to_us: int, limit: int = 1000) -> list[Transaction]:
        """Transactions (binlog order) that touch ``table`` (``db.table``) with ``from_us <= commit time <= to_us``,
        at most ``limit``."""
        table = ".".join(p.strip().strip("`") for p in table.split(".", 1))
        out: list[Transaction] = []
        with self._lock:
            for v in self._current():
                tid = v.table_ids.get(table)
                if tid is None or not v.count or v.max_us < from_us or v.min_us > to_us:
                    continue
                for i, b in enumerate(v.side.blocks):
                    h = b.header
                    if h["max_us"] < from_us or h["min_us"] > to_us or tid not in h["tables"]:
                        continue
                    blk = self._block(v, i)
                    for k in blk.touching(tid):
                        if from_us <= blk.commits[k] <= to_us:
                            out.append(self._tx(v, blk.record(k)))
                            if len(out) >= limit:
                                return out
                for r in v.tail:
                    if tid in r.tables and from_us <= r.commit_us <= to_us:
                        out.append(self._tx(v, r))
                        if len(out) >= limit:
                            return out
        return out

    def span(self, start: tuple[str, int], end: tuple[str, int]) -> SpanSummary:
        """The transactions wholly between two positions (start <= their start, their end <= end), their bytes,
        and the files from ``start``'s to ``end``'s. ValueError for a file not up to the horizon or positions in
        the wrong order."""
        with self._lock:
            views = self._current()
            names = [v.name for v in views]
            for f, _p in (start, end):
                if f not in names:
                    raise ValueError(f"{f!r} is not a relay file (up to the horizon)")
            a, b = names.index(start[0]), names.index(end[0])
            if (a, start[1]) > (b, end[1]):
                raise ValueError("the start position is after the end position")
            count = nbytes = 0
            for fi in range(a, b + 1):
                v = views[fi]
                lo = start[1] if fi == a else 0
                hi = end[1] if fi == b else 1 << 62
                for i, blk_ref in enumerate(v.side.blocks):
                    h = blk_ref.header
                    if h["end"] <= lo or h["first"] >= hi:
                        continue
                    if h["first"] >= lo and h["end"] <= hi:
                        count += h["n"]
                        blk = self._block(v, i)
                        nbytes += sum(blk.ends) - sum(blk.starts)
                        continue
                    blk = self._block(v, i)
                    for s, e in zip(blk.starts, blk.ends):
                        if s >= lo and e <= hi:
                            count += 1
                            nbytes += e - s
                for r in v.tail:
                    if r.start >= lo and r.end <= hi:
                        count += 1
                        nbytes += r.end - r.start
            files = tuple(names[a:b + 1])
            return SpanSummary(count, nbytes, files[0], files[-1], files)

    def first(self) -> Transaction | None:
        with self._lock:
            for v in self._current():
                if v.count:
                    return self._tx(v, self._rec(self._block(v, 0), 0))
            return None

    def last(self) -> Transaction | None:
        with self._lock:
            for v in reversed(self._current()):
                if v.count:
                    blk = self._block(v, len(v.side.blocks)) or self._block(v, len(v.side.blocks) - 1)
                    return self._tx(v, self._rec(blk, len(blk) - 1))
            return None

    def transactions(self, name: str) -> list[Transaction]:
        """Every indexed transaction of file ``name`` up to the horizon, in order (tests, ``relayproxy index``)."""
        with self._lock:
            for v in self._current():
                if v.name == name:
                    out = []
                    for i in range(len(v.side.blocks) + 1):
                        blk = self._block(v, i)
                        out += [self._tx(v, self._rec(blk, k)) for k in range(len(blk))]
                    return out
            return []


_BY_STORE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BY_STORE_LOCK = threading.Lock()


def index_of(store: StoreReader) -> TransactionIndex:
    """The store's TransactionIndex (its own ``transaction_index`` when it has one, else one kept per store)."""
    own = store.transaction_index
    if isinstance(own, TransactionIndex):
        return own
    with _BY_STORE_LOCK:
        found = _BY_STORE.get(store)
        if found is None:
            found = _BY_STORE[store] = TransactionIndex.for_store(store)
        return found
