"""What both parse benchmarks measure, defined once: the corpus walk, relayproxy's parsers and python-mysql-replication
per event, the counting of what the library decodes, the timed walks and the ratios.

``parse_cost.py`` times these walks over whole file images in one process; ``spark_parse_cost.py`` times every event
on its own in Spark tasks (its batch loops) and runs the same walks on the driver. The timed loops keep their
per-event work inline (a Python call per event would be timed with the parser). Spark ships this file to its
executors as a plain module (``addPyFile``), so it imports nothing of ``benchmarks`` by the package's name.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from benchinfo import fmt_median_range

from relayproxy.binlog import constants as C
from relayproxy.binlog.boundary import TransactionBoundaryParser
from relayproxy.binlog.events import HEADER, BinlogFormatError, FormatDescription
from relayproxy.lab.reference import ReferenceDecodeError, ReferenceDecoder

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "binlogs"  # beside the checkout

_unpack_from = HEADER.unpack_from
_FDE = C.FORMAT_DESCRIPTION_EVENT
_HEADER_LEN = C.HEADER_LEN
_crc32 = zlib.crc32
_u32_from = struct.Struct("<I").unpack_from

# What a consumer of each view reads: the fields it exists for (header fields for the rest).
VIEW_FIELDS: dict[int, tuple[str, ...]] = {
    C.QUERY_EVENT: ("db", "query"),
    C.EXECUTE_LOAD_QUERY_EVENT: ("db", "query"),
    C.XID_EVENT: ("xid",),
    C.GTID_LOG_EVENT: ("sid", "gno", "last_committed", "sequence_number"),
    C.ANONYMOUS_GTID_LOG_EVENT: ("sid", "gno", "last_committed", "sequence_number"),
    C.GTID_TAGGED_LOG_EVENT: ("sid", "tag", "gno"),
    C.MARIA_GTID_EVENT: ("domain_id", "seq_no", "flags2"),
    C.ROTATE_EVENT: ("position", "next_file"),
    C.PREVIOUS_GTIDS_LOG_EVENT: ("gtid_set",),
    C.MARIA_GTID_LIST_EVENT: ("gtids",),
    C.FORMAT_DESCRIPTION_EVENT: ("server_version",),
}
HEADER_FIELDS = ("log_pos", "event_size")

# The two sides of every run, in the order of even runs (odd runs reverse it: benchinfo.alternating_orders).
CONTESTANTS = ("relayproxy", "pymysqlreplication")
# What python-mysql-replication made of one event.
DECODED, NOT_DECODED, ERROR = "decoded", "not_decoded", "error"


# ---------------------------------------------------------------------------------------------
# The corpus walk
def scan_events(data: bytes, pos: int = 4, fde: FormatDescription | None = None
                ) -> Iterator[tuple[int, int, int, FormatDescription | None]]:
    """(offset, size, type code, the FORMAT_DESCRIPTION in force) of every complete event from ``pos``; a cut or
    impossible last event ends the walk (it is not an event). An FDE is in force from its own event on."""
    n = len(data)
    while pos + _HEADER_LEN <= n:
        size = _unpack_from(data, pos)[3]
        if size < _HEADER_LEN or pos + size > n:
            return
        type_code = data[pos + 4]
        if type_code == _FDE:
            fde = FormatDescription.parse(data, pos, size)
        yield pos, size, type_code, fde
        pos += size


def carries_crc(type_code: int, fde: FormatDescription | None) -> bool:
    """Whether an event ends in a CRC32 its decoder must leave out (an FDE's own is checked by its parser)."""
    return fde is not None and fde.checksum_len != 0 and type_code != _FDE


@dataclass
class CorpusFile:
    name: str
    data: bytes
    flavour: str  # from its first FDE: "mysql" / "mariadb"
    events: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, size, type) of complete events
    checksummed: list[bool] = field(default_factory=list)  # per event: carries a CRC32 trailer

    @property
    def event_bytes(self) -> int:
        return sum(size for _, size, _ in self.events)


def corpus_path() -> Path:
    """$RELAYPROXY_CORPUS, else the shared corpus beside the checkout."""
    configured = os.environ.get("RELAYPROXY_CORPUS")
    return Path(configured) if configured else DEFAULT_CORPUS


def load_corpus(root: Path) -> list[CorpusFile]:
    """Every file of manifest.json in memory, with the offsets of its complete events."""
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise SystemExit(f"parse_cost: no corpus at {root} (manifest.json missing); set RELAYPROXY_CORPUS")
    return [load_binlog(entry["file"], (root / entry["file"]).read_bytes())
            for entry in json.loads(manifest_path.read_text())]


def load_binlog(name: str, data: bytes) -> CorpusFile:
    """One binlog file image with the offsets of its complete events (a cut last event is left out)."""
    cf = CorpusFile(name, data, "mysql")
    for pos, size, type_code, fde in scan_events(data):
        if type_code == _FDE and not cf.events:
            cf.flavour = fde.flavour
        cf.events.append((pos, size, type_code))
        cf.checksummed.append(carries_crc(type_code, fde))
    return cf


def files_totals(files: list[CorpusFile]) -> tuple[int, int]:
    """(events, bytes) of the files' complete events."""
    return sum(len(cf.events) for cf in files), sum(cf.event_bytes for cf in files)


# ---------------------------------------------------------------------------------------------
# Per event: python-mysql-replication, as a BinLogStreamReader decodes it
def decode_events(decoder: ReferenceDecoder, data: bytes, events, checksummed, materialise_rows: bool = False
                  ) -> tuple[int, int, int, int, int]:
    """The library's decode of each event ((offset, size, type) in ``data``) from a copy of its bytes, as
    ``BinLogStreamReader`` gets its packet: (events, decoded, no decoder for its type, raised, raised on rows)."""
    # An FDE it cannot read (e.g. "5.1.34sp1") is replaced by relayproxy's, so that the events after it decode.
    count = decoded = not_decoded = errors = row_errors = 0
    decode = decoder.decode
    for (pos, size, type_code), checksum in zip(events, checksummed):
        count += 1
        try:
            ev = decode(data[pos : pos + size], checksum=checksum)
        except ReferenceDecodeError:
            errors += 1
            if type_code == _FDE:
                decoder.set_format(FormatDescription.parse(data, pos, size))
            continue
        if ev is None:
            not_decoded += 1
            continue
        decoded += 1
        if materialise_rows:
            try:
                decoder.materialise_rows(ev)
            except Exception:  # the library's row decoders fail on some real rows (see test)
                row_errors += 1
    return count, decoded, not_decoded, errors, row_errors


def outcome_of(decoded: int, not_decoded: int) -> str:
    """What the library made of one event, from ``decode_events``' counts."""
    return DECODED if decoded else NOT_DECODED if not_decoded else ERROR


@dataclass
class LibraryStats:
    decoded: int = 0
    not_decoded: int = 0  # types the library has no decoder for (decode returned None)
    errors: int = 0  # the library raised
    row_errors: int = 0  # the library raised while materialising row values


# ---------------------------------------------------------------------------------------------
# The walks over file images. Each returns the number of events it processed (a cheap sanity check, no objects).
def walk_headers(files: list[CorpusFile]) -> int:
    """The floor: find every event with one unpack_from, do nothing with it."""
    count = 0
    for cf in files:
        data = cf.data
        n = len(data)
        pos = 4
        while pos + 19 <= n:
            size = _unpack_from(data, pos)[3]
            if size < 19 or pos + size > n:  # a cut or impossible event ends the walk
                break
            pos += size
            count += 1
    return count


def walk_boundary(files: list[CorpusFile]) -> int:
    """relayproxy's hot path: header unpack + TransactionBoundaryParser.feed per event."""
    count = 0
    for cf in files:
        data = cf.data
        n = len(data)
        parser = TransactionBoundaryParser()
        feed = parser.feed
        pos = 4
        while pos + 19 <= n:
            _ts, type_code, _sid, size, _log_pos, flags = _unpack_from(data, pos)
            if size < 19 or pos + size > n:
                break
            if type_code == _FDE:
                parser.set_format(FormatDescription.parse(data, pos, size))
                feed = parser.feed  # set_format may switch the flavour's feed method
            feed(type_code, flags, data, pos, size)
            pos += size
            count += 1
    return count


def walk_boundary_batch(files: list[CorpusFile]) -> int:
    """The parser's batch fast path: TransactionBoundaryParser.feed_buffer over each file image,
    with a group-end callback (what recovery and the Spark job run)."""
    def on_end(end: int, gtid) -> None:
        return None

    count = 0
    for cf in files:
        TransactionBoundaryParser().feed_buffer(cf.data, 4, len(cf.data), on_end)
        count += len(cf.events)
    return count


def walk_boundary_crc(files: list[CorpusFile]) -> int:
    """The hot path plus CRC32 verification of every checksummed event (zlib over a memoryview)."""
    count = 0
    bad = 0
    for cf in files:
        data = cf.data
        view = memoryview(data)
        n = len(data)
        parser = TransactionBoundaryParser()
        feed = parser.feed
        checksum_len = 0
        pos = 4
        while pos + 19 <= n:
            _ts, type_code, _sid, size, _log_pos, flags = _unpack_from(data, pos)
            end = pos + size
            if size < 19 or end > n:
                break
            if type_code == _FDE:
                fde = FormatDescription.parse(data, pos, size)  # verifies the FDE's own CRC
                checksum_len = fde.checksum_len
                parser.set_format(fde)
                feed = parser.feed
            elif checksum_len and _crc32(view[pos : end - 4]) != _u32_from(data, end - 4)[0]:
                bad += 1
            feed(type_code, flags, data, pos, size)
            pos = end
            count += 1
    if bad:
        raise AssertionError(f"{bad} CRC32 mismatches in the corpus")
    return count


def make_walk_views(rejected: list[str]) -> Callable[[list[CorpusFile]], int]:
    """A walk building relayproxy's typed view of every event; ``rejected`` gets "file @offset: why" for each
    event a view rejects (the last walk's)."""
    from relayproxy.binlog.views import view_event

    fields_for = VIEW_FIELDS.get

    def walk_views(files: list[CorpusFile]) -> int:
        """relayproxy's typed views: view_event + reading its main fields, per event."""
        count = 0
        found = []
        for cf in files:
            data = cf.data
            fde = None
            for pos, size, type_code in cf.events:
                count += 1
                if type_code == _FDE:
                    fde = FormatDescription.parse(data, pos, size)
                try:
                    ev = view_event(data, pos, fde)
                    for name in fields_for(type_code, HEADER_FIELDS):
                        getattr(ev, name)
                except BinlogFormatError as exc:
                    found.append(f"`{cf.name}` @{pos}: {exc}")
        rejected[:] = found
        return count

    return walk_views


def make_walk_library(materialise_rows: bool, stats: LibraryStats) -> Callable[[list[CorpusFile]], int]:
    """A walk decoding every event with python-mysql-replication (``decode_events``), counted into ``stats``."""
    def walk_library(files: list[CorpusFile]) -> int:
        """python-mysql-replication's decode of every event, as a BinLogStreamReader would do it."""
        totals = [0, 0, 0, 0, 0]
        for cf in files:
            counts = decode_events(ReferenceDecoder(), cf.data, cf.events, cf.checksummed, materialise_rows)
            totals = [a + b for a, b in zip(totals, counts)]
        count, stats.decoded, stats.not_decoded, stats.errors, stats.row_errors = totals
        return count

    return walk_library


# ---------------------------------------------------------------------------------------------
# Timing the walks
@dataclass
class Measure:
    key: str
    label: str
    walk: Callable[[list[CorpusFile]], int]
    files: list[CorpusFile]
    events: int
    nbytes: int
    inner: int = 1  # walks per sample
    samples_ns: list[int] = field(default_factory=list)
    peer: bool = False  # python-mysql-replication's (timed before or after relayproxy's, by the run's order)

    @property
    def ns_per_event(self) -> float:
        return statistics.median(self.samples_ns) / (self.inner * self.events)

    @property
    def spread(self) -> tuple[float, float]:
        per = self.inner * self.events
        return min(self.samples_ns) / per, max(self.samples_ns) / per


def measure(key: str, label: str, walk, files: list[CorpusFile], peer: bool = False) -> Measure:
    """A walk to time over ``files``."""
    return Measure(key, label, walk, files, *files_totals(files), peer=peer)


def core_measures(files: list[CorpusFile], prefix: str = "", stats: LibraryStats | None = None) -> list[Measure]:
    """The walks both benchmarks time: the floor, the batch path, the per-event API, the library's decode (counted
    into ``stats``)."""
    return [
        measure(prefix + "header_walk", "header walk (floor)", walk_headers, files),
        measure(prefix + "boundary_batch", "boundary, batch (feed_buffer)", walk_boundary_batch, files),
        measure(prefix + "boundary", "boundary (unpack + feed)", walk_boundary, files),
        measure(prefix + "pymysqlreplication", "pymysqlreplication decode",
                make_walk_library(False, stats or LibraryStats()), files, peer=True),
    ]


def timed(walk, files, inner: int) -> tuple[int, int]:
    """(ns, what the last walk returned) of ``inner`` walks over ``files`` in a row, GC off (collected first)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            n = walk(files)
        t1 = time.perf_counter_ns()
    finally:
        gc.enable()
    return t1 - t0, n


def run_measures(measures: list[Measure], repeat: int, min_sample_s: float) -> None:
    """Warm-up, then ``repeat`` samples of each measure in turn (round robin); a sample lasts >= ``min_sample_s``."""
    # Warm-up and calibration: one walk each, which also fixes how many walks make one sample.
    for m in measures:
        elapsed, n = timed(m.walk, m.files, 1)
        if n != m.events:
            raise AssertionError(f"{m.key}: walked {n} events, expected {m.events}")
        m.inner = max(1, int(min_sample_s * 1e9 / max(elapsed, 1)) + 1) if elapsed < min_sample_s * 1e9 else 1
    for _ in range(repeat):
        for m in measures:
            elapsed, _ = timed(m.walk, m.files, m.inner)
            m.samples_ns.append(elapsed)


def run_in_order(measures: list[Measure], order, repeat: int, min_sample_s: float) -> dict[str, float]:
    """One run: relayproxy's measures and the library's, in ``order`` (``CONTESTANTS`` or reversed); returns each
    measure's ns per event over this run's samples alone."""
    before = {m.key: len(m.samples_ns) for m in measures}
    relay = [m for m in measures if not m.peer]
    peers = [m for m in measures if m.peer]
    run_measures(relay + peers if order[0] == CONTESTANTS[0] else peers + relay, repeat, min_sample_s)
    return {m.key: statistics.median(m.samples_ns[before[m.key]:]) / (m.inner * m.events) for m in measures}


def walk_figures(ns: dict[str, float], prefix: str = "") -> dict[str, float | None]:
    """One run's headline figures of the ``core_measures`` walks (``run_in_order``'s ns per event): the library's
    cost over the batch path's (``ratio``) and over the per-event API's (``ratio_feed``), and the three costs."""
    library, batch, feed = (ns[prefix + key] for key in ("pymysqlreplication", "boundary_batch", "boundary"))
    return {"ratio": ratio(library, batch), "ratio_feed": ratio(library, feed), "boundary_ns": batch,
            "boundary_feed_ns": feed, "library_ns": library, "floor_ns": ns[prefix + "header_walk"]}


# ---------------------------------------------------------------------------------------------
# Ratios: sums of ns over the same events (additive), ratios of them (ratios of means)
SUM_FIELDS = ("boundary_all", "view_all", "boundary_dec", "view_dec", "library_dec")


def add_sums(rows, key: Callable[[dict], object]) -> dict:
    """Per ``key(row)`` (rows whose key is None are left out): events, events the library decoded, and each of
    ``SUM_FIELDS`` summed."""
    table: dict = {}
    for r in rows:
        k = key(r)
        if k is None:
            continue
        t = table.setdefault(k, {"events": 0, "decoded_events": 0, **{name: 0.0 for name in SUM_FIELDS}})
        t["events"] += r["events"]
        if r["pymysqlreplication_outcome"] == DECODED:
            t["decoded_events"] += r["events"]
        for name in SUM_FIELDS:
            t[name] += r[name] or 0.0
    return table


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or zero."""
    return a / b if a and b else None


def fmt(value: float | None, digits: int = 0) -> str:
    """A figure for the markdown: thousands separated, "-" when missing."""
    return "-" if value is None else f"{value:,.{digits}f}"


def fmt_x(a: float | None, b: float | None, digits: int = 1) -> str:
    """The ratio a / b as "12.3x" ("-x" when either is missing or zero)."""
    return f"{fmt(ratio(a, b), digits)}x"


def fmt_runs(values, fmt: str = "{:.1f}", unit: str = "x") -> str:
    """The runs' median and range ("40.5x (range 38.1x - 41.2x, 3 runs)") of the values not None; "-" if none."""
    values = [v for v in values if v is not None]
    return fmt_median_range(values, fmt, unit) if values else "-"
