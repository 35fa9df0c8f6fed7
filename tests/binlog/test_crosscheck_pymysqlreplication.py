"""python-mysql-replication, driven from the corpus bytes, agrees with relayproxy on every corpus event.

The reference decoder (``relayproxy.lab.reference.ReferenceDecoder``) is fed each file's events in
order, as a live ``BinLogStreamReader`` would receive them; our side is the reader (event cuts,
positions), the boundary parser (GTIDs) and the typed views (fields). Where the library is known
to be wrong or unable, the test says so explicitly -- a table of known failures that must keep
failing, a table of event types it has no decoder for -- so that nothing is skipped in silence
and a fixed library (or a new corpus file) shows up as a test failure to look at.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.events import BinlogFormatError, FormatDescription
from relayproxy.binlog.reader import ScannedEvent, ScanResult, scan_file
from relayproxy.binlog.views import format_uuid, view_event
from relayproxy.lab.reference import (
    ReferenceDecodeError,
    ReferenceDecoder,
    library_decodes,
)

BLACKBEAM = "blackbeam-rust_mysql_common/test-data/binlogs/"
MARIADB_POC = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/"

# Magic + 10 bytes: not one complete event, nothing to compare.
NO_EVENTS = BLACKBEAM + "binlog_truncated_event.000001"
# Its FDE is complete and is cross-checked; the cut PREVIOUS_GTIDS after it is not an event and is
# never handed to the library (our reader reports it as a truncated tail).
CUT_TAIL = BLACKBEAM + "binlog_truncated_prev_gtid_event.000001"

# The library class each event type must decode to (the library's own dispatch table is not
# trusted here: this is what a correct decoder must produce for the type code our reader found).
EXPECTED_CLASS = {
    C.QUERY_EVENT: "QueryEvent",
    C.STOP_EVENT: "StopEvent",
    C.ROTATE_EVENT: "RotateEvent",
    C.INTVAR_EVENT: "IntvarEvent",
    C.RAND_EVENT: "RandEvent",
    C.USER_VAR_EVENT: "UserVarEvent",
    C.FORMAT_DESCRIPTION_EVENT: "FormatDescriptionEvent",
    C.XID_EVENT: "XidEvent",
    C.BEGIN_LOAD_QUERY_EVENT: "BeginLoadQueryEvent",
    C.EXECUTE_LOAD_QUERY_EVENT: "ExecuteLoadQueryEvent",
    C.TABLE_MAP_EVENT: "TableMapEvent",
    C.WRITE_ROWS_EVENT_V1: "WriteRowsEvent",
    C.UPDATE_ROWS_EVENT_V1: "UpdateRowsEvent",
    C.DELETE_ROWS_EVENT_V1: "DeleteRowsEvent",
    C.HEARTBEAT_LOG_EVENT: "HeartbeatLogEvent",
    C.ROWS_QUERY_LOG_EVENT: "RowsQueryLogEvent",
    C.WRITE_ROWS_EVENT: "WriteRowsEvent",
    C.UPDATE_ROWS_EVENT: "UpdateRowsEvent",
    C.DELETE_ROWS_EVENT: "DeleteRowsEvent",
    C.GTID_LOG_EVENT: "GtidEvent",
    C.PREVIOUS_GTIDS_LOG_EVENT: "PreviousGtidsEvent",
    C.XA_PREPARE_LOG_EVENT: "XAPrepareEvent",
    C.PARTIAL_UPDATE_ROWS_EVENT: "PartialUpdateRowsEvent",
    C.MARIA_ANNOTATE_ROWS_EVENT: "MariadbAnnotateRowsEvent",
    C.MARIA_BINLOG_CHECKPOINT_EVENT: "MariadbBinLogCheckPointEvent",
    C.MARIA_GTID_EVENT: "MariadbGtidEvent",
    C.MARIA_GTID_LIST_EVENT: "MariadbGtidListEvent",
    C.MARIA_START_ENCRYPTION_EVENT: "MariadbStartEncryptionEvent",
}

# Types python-mysql-replication 1.0.x has no decoder for: decode() returns None. Each one that
# occurs in the corpus is asserted to come back as None (and our reader/views still handle it).
NOT_DECODED = {
    C.ANONYMOUS_GTID_LOG_EVENT: "mapped to NotImplementedEvent: anonymous groups are invisible to it",
    C.TRANSACTION_PAYLOAD_EVENT: "no support for compressed transactions (MySQL 8.0.20+)",
    C.GTID_TAGGED_LOG_EVENT: "no support for MySQL 8.3+ tagged GTIDs",
    C.INCIDENT_EVENT: "no decoder",
    C.APPEND_BLOCK_EVENT: "no decoder (LOAD DATA data blocks)",
    C.PRE_GA_WRITE_ROWS_EVENT: "no decoder for MySQL 5.1 pre-GA rows events",
    C.PRE_GA_UPDATE_ROWS_EVENT: "no decoder for MySQL 5.1 pre-GA rows events",
    C.PRE_GA_DELETE_ROWS_EVENT: "no decoder for MySQL 5.1 pre-GA rows events",
    100: "vendor type (Amazon Aurora padding), unknown to every decoder",
}

# Every event on which the library raises, with the reason. Each entry must still raise (a fixed
# library turns the entry into a failure to update); any other exception fails the test.
KNOWN_LIBRARY_FAILURES: dict[tuple[str, int], tuple[int, str, str]] = {
    # FormatDescriptionEvent does tuple(map(int, "5.1.34sp1".split("."))): a version with letters in
    # a dotted part cannot be parsed. The stream goes on with our FDE (set_format), as a reader would
    # have to.
    ("alibaba-canal/parse/src/test/resources/binlog/mysql-bin.000002", 4): (
        C.FORMAT_DESCRIPTION_EVENT, "ValueError", "version string 5.1.34sp1 not parseable by int()"),
    ("alibaba-canal/dbsync/src/test/resources/binlog/mysql-bin.000001", 4): (
        C.FORMAT_DESCRIPTION_EVENT, "ValueError", "version string 5.1.34sp1 not parseable by int()"),
    # The corrupt event of a relay log kept by MySQL's test suite as a "corrupt relay log": status
    # vars length 16949 in a 171-byte event. The library rejects it, and so do our views (asserted
    # in test_known_library_failures_still_fail).
    (BLACKBEAM + "corrupt-relay-bin.000624", 91204): (
        C.QUERY_EVENT, "StatusVariableMismatch", "genuinely corrupt event"),
    # MySQL 9.0 VECTOR columns (type 242): the library does not know the type; its optional-metadata
    # loop then hits an unknown field type 0 or runs past the event.
    (BLACKBEAM + "vector.binlog", 1004): (C.TABLE_MAP_EVENT, "ValueError", "VECTOR column type unknown"),
    (BLACKBEAM + "vector.binlog", 1170): (C.TABLE_MAP_EVENT, "AssertionError", "VECTOR column type unknown"),
    (BLACKBEAM + "vector.binlog", 2456): (C.TABLE_MAP_EVENT, "ValueError", "VECTOR column type unknown"),
    (BLACKBEAM + "vector.binlog", 2622): (C.TABLE_MAP_EVENT, "AssertionError", "VECTOR column type unknown"),
    (BLACKBEAM + "vector.binlog", 3037): (C.TABLE_MAP_EVENT, "AssertionError", "VECTOR column type unknown"),
    (BLACKBEAM + "vector.binlog", 3227): (C.TABLE_MAP_EVENT, "AssertionError", "VECTOR column type unknown"),
    # MySQL 5.1 pre-GA TABLE_MAP with a 6-byte post-header (4-byte table id): the library insists on 8.
    (BLACKBEAM + "ver_5_1-wl2325_r.001", 650): (
        C.TABLE_MAP_EVENT, "MalformedBinLogEvent", "pre-GA 6-byte TABLE_MAP post-header"),
    # USER_VAR from servers that did not write the trailing flags byte (it is optional: MySQL reads
    # it only if bytes remain); the library always reads it and runs off the event.
    (BLACKBEAM + "ver_5_1-wl2325_s.001", 438): (C.USER_VAR_EVENT, "AssertionError", "USER_VAR without flags byte"),
    (BLACKBEAM + "ver_5_1_23.001", 1044): (C.USER_VAR_EVENT, "AssertionError", "USER_VAR without flags byte"),
    # MySQL 8.3+ tagged PREVIOUS_GTIDS format: the library reads the format word as the UUID count.
    (BLACKBEAM + "binlog_transaction_with_GTID_TAG.000001", 127): (
        C.PREVIOUS_GTIDS_LOG_EVENT, "AssertionError", "tagged GTID set format (8.3+) unknown"),
}

# Rows events whose row *values* the library cannot decode (decode() itself succeeds; .rows raises).
# The boundary parser never decodes rows; this pins down what the benchmark's "+ rows" row meets.
KNOWN_ROW_VALUE_FAILURES: dict[tuple[str, int], str] = {
    # JSON opaque TIME value decoded into an out-of-range hour.
    (BLACKBEAM + "json-opaque.binlog", 1080): "ValueError",
    # VECTOR column (type 242) unknown.
    (BLACKBEAM + "vector.binlog", 1085): "NotImplementedError",
    (BLACKBEAM + "vector.binlog", 1279): "NotImplementedError",
    (BLACKBEAM + "vector.binlog", 2537): "NotImplementedError",
    (BLACKBEAM + "vector.binlog", 2731): "NotImplementedError",
    (BLACKBEAM + "vector.binlog", 3146): "NotImplementedError",
    (BLACKBEAM + "vector.binlog", 3336): "NotImplementedError",
    # MariaDB 10.0 WRITE_ROWS_V1 events with 2 bytes after the last row (checksum NONE file): the
    # library reads them as another row and runs off the event.
    ("pingcap-tiflow/mysql-bin.000001", 1819): "AssertionError",
    ("pingcap-tiflow/mysql-bin.000001", 2418): "AssertionError",
    ("pingcap-tiflow/mysql-bin.000001", 3267): "AssertionError",
    ("pingcap-tiflow/mysql-bin.000001", 3569): "AssertionError",
}

# Files whose header log_pos values are not (all) this file's end offsets, and why. Any other file
# with such an event fails test_positions.
FOREIGN_POSITIONS = {
    # relay logs (manifest "relay": true): events carry the master's end_log_pos. (The third relay
    # log, slave-relay-bin.000001, is not here: its master's file had the same layout, so every
    # log_pos happens to be the relay file's own end offset too.)
    BLACKBEAM + "bug33029-slave-relay-bin.000001": "relay log",
    BLACKBEAM + "corrupt-relay-bin.000624": "relay log",
    # mysql-test files that are relay logs in all but name: a master's ROTATE + FDE mid-file, then the
    # master's events with the master's positions
    BLACKBEAM + "binlog_savepoint.000001": "relay-log content (master ROTATE + FDE mid-file)",
    BLACKBEAM + "rpl_unfiltered_hidden_gcol.000001": "relay-log content (master ROTATE + FDE mid-file)",
    # hand-edited mysql-test fixture: two QUERY events keep the positions of a longer original
    BLACKBEAM + "ver_5_1-wl2325_s.001": "hand-edited fixture",
}


# ---------------------------------------------------------------------------------------------
# One pass over the corpus: every event through our reader, parser and views, and the library.
@dataclass
class Checked:
    ev: ScannedEvent
    fde: FormatDescription  # in force for this event (the event itself for an FDE)
    checksum: bool
    lib: Any = None  # the library's event object, or None
    lib_error: ReferenceDecodeError | None = None
    stream_log_pos: int | None = None  # ReferenceDecoder.log_pos after the event (BinLogStreamReader.log_pos)
    stream_log_file: str | None = None
    our_gtid: Any = None  # TransactionBoundaryParser.gtid after feeding the event
    feed_result: int = 0
    view: Any = None  # our typed view (None when building it raised: see view_error)
    view_error: BinlogFormatError | None = None


@dataclass
class CheckedFile:
    name: str
    entry: dict
    result: ScanResult
    events: list[Checked] = field(default_factory=list)
    decoder: ReferenceDecoder | None = None


def crosscheck_file(path: Path, name: str, entry: dict, *, verify_checksum: bool = False) -> CheckedFile:
    scanned: list[ScannedEvent] = []
    result = scan_file(path, on_event=scanned.append)
    decoder = ReferenceDecoder(verify_checksum=verify_checksum)
    parser = B.TransactionBoundaryParser()
    out = CheckedFile(name, entry, result, decoder=decoder)
    fde: FormatDescription | None = None
    for ev in scanned:
        assert not ev.streamed, f"{name}: corpus events fit in memory"
        if ev.type_code == C.FORMAT_DESCRIPTION_EVENT:
            fde = FormatDescription.parse(ev.data, 0)
        assert fde is not None, f"{name}: event before the first FDE"
        checked = Checked(ev, fde, checksum=fde.checksum_len == 4)
        try:
            checked.lib = decoder.decode(ev.data, checksum=checked.checksum)
        except ReferenceDecodeError as exc:
            checked.lib_error = exc
            if ev.type_code == C.FORMAT_DESCRIPTION_EVENT:
                decoder.set_format(fde)  # what the library could not take from the event itself
        checked.stream_log_pos = decoder.log_pos
        checked.stream_log_file = decoder.log_file
        checked.feed_result = parser.feed_event(ev.data, 0)
        checked.our_gtid = parser.gtid
        try:
            checked.view = view_event(ev.data, 0, fde)
        except BinlogFormatError as exc:
            checked.view_error = exc
        out.events.append(checked)
    return out


@pytest.fixture(scope="module")
def checked_files(corpus_dir, manifest) -> dict[str, CheckedFile]:
    names = {e["file"] for e in manifest}
    # The exclusions and known-failure tables must name real corpus files, or they hide nothing.
    for name in [NO_EVENTS, CUT_TAIL, *FOREIGN_POSITIONS, *(f for f, _ in KNOWN_LIBRARY_FAILURES),
                 *(f for f, _ in KNOWN_ROW_VALUE_FAILURES)]:
        assert name in names, f"{name} is not in the corpus manifest"
    return {
        e["file"]: crosscheck_file(corpus_dir / e["file"], e["file"], e)
        for e in manifest
        if e["file"] != NO_EVENTS
    }


def all_events(checked_files):
    for cf in checked_files.values():
        for c in cf.events:
            yield cf, c


def vfield(view, name):
    """Read a view field; a decoding error becomes a test failure naming the event."""
    try:
        return getattr(view, name)
    except BinlogFormatError as exc:  # pragma: no cover - reported as a failure
        pytest.fail(f"our view could not decode {name}: {exc}")


# ---------------------------------------------------------------------------------------------
def test_every_event_reached_the_library(checked_files, manifest):
    """The whole corpus went through both sides: event counts are the manifest's, no event lost."""
    total = 0
    for entry in manifest:
        if entry["file"] == NO_EVENTS:
            continue
        cf = checked_files[entry["file"]]
        expected = entry["events"]
        assert len(cf.events) == expected, cf.name
        total += expected
    assert total > 35000
    cut = checked_files[CUT_TAIL]
    assert cut.result.truncated_event and [c.ev.type_code for c in cut.events] == [C.FORMAT_DESCRIPTION_EVENT]


def test_event_types_agree(checked_files):
    seen_not_decoded: set[int] = set()
    for cf, c in all_events(checked_files):
        t = c.ev.type_code
        where = f"{cf.name} @{c.ev.offset} {C.event_name(t)}"
        if c.lib_error is not None:
            continue  # test_known_library_failures_still_fail accounts for every one of these
        if t in NOT_DECODED:
            assert c.lib is None, where
            assert not library_decodes(t), where
            seen_not_decoded.add(t)
            continue
        assert t in EXPECTED_CLASS, f"{where}: type not classified for the library -- add it to a table"
        assert c.lib is not None, f"{where}: the library dropped an event it should decode"
        assert type(c.lib).__name__ == EXPECTED_CLASS[t], where
        assert c.lib.event_type == t, where
        assert library_decodes(t), where
    # The NOT_DECODED table lists only what the corpus really exercises.
    assert seen_not_decoded == set(NOT_DECODED)


def test_known_library_failures_still_fail(checked_files):
    failures = {
        (cf.name, c.ev.offset): c for cf, c in all_events(checked_files) if c.lib_error is not None
    }
    unexpected = {k: str(c.lib_error) for k, c in failures.items() if k not in KNOWN_LIBRARY_FAILURES}
    assert not unexpected, f"the library failed on events not known to break it: {unexpected}"
    for key, (type_code, exc_name, _why) in KNOWN_LIBRARY_FAILURES.items():
        assert key in failures, f"{key}: the library no longer fails here -- update KNOWN_LIBRARY_FAILURES"
        c = failures[key]
        assert c.ev.type_code == type_code, key
        assert type(c.lib_error.cause).__name__ == exc_name, (key, repr(c.lib_error.cause))
    # Where the library is right to fail, so are we: the corrupt relay-log QUERY.
    corrupt = failures[(BLACKBEAM + "corrupt-relay-bin.000624", 91204)]
    assert corrupt.view_error is not None and "status vars" in str(corrupt.view_error)
    # Everywhere else our views decode what the library could not.
    for key, c in failures.items():
        if key != (BLACKBEAM + "corrupt-relay-bin.000624", 91204):
            assert c.view_error is None, key
    tagged = failures[(BLACKBEAM + "binlog_transaction_with_GTID_TAG.000001", 127)]
    assert tagged.view.is_tagged_format and str(tagged.view.gtid_set)


def test_events_our_views_reject(checked_files):
    """Our side's refusals are pinned as well: exactly two corpus events, both malformed."""
    rejected = {(cf.name, c.ev.offset): c for cf, c in all_events(checked_files) if c.view_error is not None}
    assert set(rejected) == {
        (BLACKBEAM + "corrupt-relay-bin.000624", 91204),  # the library rejects it too
        (BLACKBEAM + "ver_5_1-wl2325_r.001", 549),
    }
    # A pre-GA 5.2 build numbers its event types differently from GA MySQL: its type 18 has a
    # 6-byte post-header (a rows event there), so it cannot be an EXECUTE_LOAD_QUERY (>= 11 bytes).
    # We refuse it; the library decodes the bytes as an EXECUTE_LOAD_QUERY regardless.
    pre_ga = rejected[(BLACKBEAM + "ver_5_1-wl2325_r.001", 549)]
    assert "post-header length 6" in str(pre_ga.view_error)
    assert type(pre_ga.lib).__name__ == "ExecuteLoadQueryEvent"


def test_positions(checked_files):
    """log_pos, event sizes and the stream position the library would report, against our offsets."""
    foreign = set()
    previous_stream_pos: dict[str, int | None] = {}
    for cf, c in all_events(checked_files):
        ev = c.ev
        before, previous_stream_pos[cf.name] = previous_stream_pos.get(cf.name), c.stream_log_pos
        where = f"{cf.name} @{ev.offset} {ev.name}"
        end = ev.offset + ev.size
        if c.lib is not None:
            wrapper = c.lib.packet  # BinLogPacketWrapper: the header as the library read it
            assert wrapper.log_pos == ev.log_pos, where
            assert wrapper.event_size == ev.size, where
            assert wrapper.timestamp == ev.timestamp and wrapper.server_id == ev.server_id, where
            # The library's body size: event minus header minus the CRC it was told about.
            assert c.lib.event_size == ev.size - C.HEADER_LEN - (4 if c.checksum else 0), where
        if ev.log_pos == 0:
            # Only three kinds of event have no end position: rotates a server generated (fake
            # rotates in relay-log content); a master's FDE as a relay log stores it (the master
            # sends it with log_pos 0); and -- MariaDB 11.4+, where binlog_legacy_event_pos is
            # OFF -- the events inside a group other than its last one.
            maria_11_4 = c.fde.is_mariadb and c.fde.version_tuple >= (11, 4, 0)
            assert (
                ev.type_code == C.ROTATE_EVENT
                or (ev.type_code == C.FORMAT_DESCRIPTION_EVENT and cf.name in FOREIGN_POSITIONS)
                or (maria_11_4 and c.feed_result & B.RESULT_MASK == B.GROUP_CONTINUE)
            ), where
        elif ev.log_pos != end:
            foreign.add(cf.name)
        # The position a BinLogStreamReader reports after this event (its fetchone rules): the
        # rotate's target, else the event's log_pos, and a log_pos of 0 leaves it where it was.
        if c.lib_error is not None:
            # A live reader would have raised here (KNOWN_LIBRARY_FAILURES); its position stays put.
            assert c.stream_log_pos == before, where
        elif ev.type_code == C.ROTATE_EVENT:
            assert (c.stream_log_file, c.stream_log_pos) == (c.view.next_file, c.view.position), where
        elif ev.log_pos:
            assert c.stream_log_pos == ev.log_pos, where
            if cf.name not in FOREIGN_POSITIONS:
                assert c.stream_log_pos == end, f"{where}: library position is not our next-event offset"
    assert foreign == set(FOREIGN_POSITIONS)
    # Each file's final ROTATE: where the library would continue is where our reader says.
    rotated = 0
    for cf in checked_files.values():
        if cf.result.rotate_to is not None:
            last = [c for c in cf.events if c.ev.type_code == C.ROTATE_EVENT][-1]
            assert (last.stream_log_file, last.stream_log_pos) == cf.result.rotate_to, cf.name
            rotated += 1
    assert rotated > 30


def test_mysql_gtids(checked_files):
    checked = anonymous = tagged = 0
    for cf, c in all_events(checked_files):
        t = c.ev.type_code
        where = f"{cf.name} @{c.ev.offset}"
        if t == C.GTID_LOG_EVENT:
            sid, gno = c.our_gtid
            ours = f"{format_uuid(sid)}:{gno}"
            assert c.lib.gtid == ours == vfield(c.view, "gtid"), where
            assert (c.lib.sid, c.lib.gno) == (sid, gno), where
            assert c.lib.commit_flag == bool(vfield(c.view, "gtid_flags") & 1), where
            if c.fde.version_tuple >= (5, 7, 0):
                # The library reads the logical clock only when it knows the server is 5.7+.
                assert c.lib.lt_type == vfield(c.view, "lt_type"), where
                assert c.lib.last_committed == vfield(c.view, "last_committed"), where
                assert c.lib.sequence_number == vfield(c.view, "sequence_number"), where
            else:
                # 5.6 GTID events are 25 bytes (no lt_type), but the library always reads a lt_type
                # byte: it takes the first byte after the event body (the CRC's), where we see none.
                assert vfield(c.view, "lt_type") is None, where
                assert c.lib.lt_type == c.ev.data[C.HEADER_LEN + 25], where
                assert not hasattr(c.lib, "last_committed"), where
            checked += 1
        elif t == C.ANONYMOUS_GTID_LOG_EVENT:
            assert c.lib is None and c.our_gtid is None and vfield(c.view, "is_anonymous"), where
            anonymous += 1
        elif t == C.GTID_TAGGED_LOG_EVENT:
            # The library cannot decode it (NOT_DECODED); ours must match our own view.
            assert c.lib is None, where
            assert c.our_gtid == (vfield(c.view, "sid"), vfield(c.view, "tag"), vfield(c.view, "gno")), where
            tagged += 1
    assert checked >= 100 and anonymous >= 200 and tagged >= 1


def test_mariadb_gtids(checked_files):
    checked = 0
    for cf, c in all_events(checked_files):
        if c.ev.type_code != C.MARIA_GTID_EVENT:
            continue
        where = f"{cf.name} @{c.ev.offset}"
        lib = (c.lib.domain_id, c.lib.server_id, c.lib.gtid_seq_no)
        assert lib == c.our_gtid == tuple(vfield(c.view, "gtid")), where
        assert c.lib.gtid == vfield(c.view, "gtid_text"), where
        assert c.lib.flags == vfield(c.view, "flags2"), where
        checked += 1
    assert checked > 5000


_LIB_SET_ENTRY = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-:\[([^\]]*)\]")
_LIB_INTERVAL = re.compile(r"'(-?\d+)-(\d+)'")


def library_previous_gtids(text: str) -> dict[str, list[tuple[int, int]]]:
    """Parse PreviousGtidsEvent's only decoded form, its private ``_previous_gtids`` string.

    The library writes ``<uuid>-:['<start>-<end>', ...]`` per UUID, joined by commas, with the
    intervals' *exclusive* ends copied from the encoding (a set 1-5 shows as '1-6'); it has no
    GTID-set object of its own.
    """
    parsed = {}
    for uuid, inner in _LIB_SET_ENTRY.findall(text):
        parsed[uuid] = [(int(a), int(b)) for a, b in _LIB_INTERVAL.findall(inner)]
    # Nothing left over: every entry matched the pattern.
    assert _LIB_SET_ENTRY.sub("", text).replace(",", "") == "", text
    return parsed


def test_previous_gtids_and_gtid_lists(checked_files):
    mysql_sets = nonempty_sets = maria_lists = nonempty_lists = 0
    for cf, c in all_events(checked_files):
        where = f"{cf.name} @{c.ev.offset}"
        if c.ev.type_code == C.PREVIOUS_GTIDS_LOG_EVENT and c.lib is not None:
            ours: dict[str, list[tuple[int, int]]] = {}
            for uuid, tag, start, end_inclusive in vfield(c.view, "gtid_set").intervals():
                assert tag == "", where  # tagged sets are the library's known failure
                ours.setdefault(uuid, []).append((start, end_inclusive + 1))
            assert library_previous_gtids(c.lib._previous_gtids) == ours, where
            mysql_sets += 1
            nonempty_sets += bool(ours)
        elif c.ev.type_code == C.MARIA_GTID_LIST_EVENT:
            gtids = vfield(c.view, "gtids")
            assert [(g.domain_id, g.server_id, g.gtid_seq_no) for g in c.lib.gtid_list] == [tuple(g) for g in gtids], where
            # The library keeps count_and_flags whole; the count is its low 28 bits.
            assert c.lib.gtid_length == vfield(c.view, "count") | vfield(c.view, "flags"), where
            maria_lists += 1
            nonempty_lists += bool(gtids)
    assert mysql_sets >= 50 and nonempty_sets >= 6 and maria_lists >= 10 and nonempty_lists >= 6


def test_queries_rotates_xids_and_fdes(checked_files):
    counts = {C.QUERY_EVENT: 0, C.ROTATE_EVENT: 0, C.XID_EVENT: 0, C.FORMAT_DESCRIPTION_EVENT: 0}
    for cf, c in all_events(checked_files):
        t = c.ev.type_code
        if t not in counts or c.lib is None:
            continue
        where = f"{cf.name} @{c.ev.offset} {c.ev.name}"
        if t == C.QUERY_EVENT:
            # The library decodes the text with errors="backslashreplace"; compare the same way.
            assert c.lib.query == vfield(c.view, "query").decode("utf-8", "backslashreplace"), where
            assert c.lib.schema.decode("utf-8", "replace") == vfield(c.view, "db"), where
            assert c.lib.error_code == vfield(c.view, "error_code"), where
            assert c.lib.slave_proxy_id == vfield(c.view, "thread_id"), where
        elif t == C.ROTATE_EVENT:
            assert c.lib.position == vfield(c.view, "position"), where
            assert c.lib.next_binlog == vfield(c.view, "next_file"), where
        elif t == C.XID_EVENT:
            post_header = c.fde.post_header_len(C.XID_EVENT)
            if post_header == 0:  # every real server
                assert c.lib.xid == vfield(c.view, "xid"), where
            else:
                # Only a pre-GA 5.2 build whose FDE declares a 6-byte post-header for type 16 (its
                # type numbering differs from GA MySQL). MySQL's Xid_event skips the declared
                # post-header and so do we; the library ignores it and reads at the body start.
                body = C.HEADER_LEN
                assert c.lib.xid == struct.unpack_from("<Q", c.ev.data, body)[0], where
                assert vfield(c.view, "xid") == struct.unpack_from("<Q", c.ev.data, body + post_header)[0], where
                assert cf.name == BLACKBEAM + "ver_5_1-wl2325_r.001", where
        elif t == C.FORMAT_DESCRIPTION_EVENT:
            assert c.lib.mysql_version_str == c.fde.server_version, where
            assert c.lib.mysql_version[:3] == c.fde.version_tuple, where
            assert c.lib.binlog_version == (4,), where  # the library keeps struct.unpack's tuple
            assert c.lib.created == c.fde.create_timestamp, where
            assert c.lib.post_header_len == tuple(c.fde.post_header_lens), where
            expected_alg = None if c.fde.checksum_alg == C.CHECKSUM_UNDEF else c.fde.checksum_alg
            assert c.lib.checksum_algorithm == expected_alg, where
        counts[t] += 1
    assert counts[C.QUERY_EVENT] > 20000 and counts[C.XID_EVENT] > 5000
    assert counts[C.ROTATE_EVENT] > 40 and counts[C.FORMAT_DESCRIPTION_EVENT] > 90


def test_library_never_touched_a_server(checked_files):
    for cf in checked_files.values():
        assert cf.decoder.connection.attempts == [], cf.name


def test_row_values_known_failures(checked_files):
    """Materialise every rows event's values: only the known library failures may raise."""
    failures = {}
    materialised = 0
    for cf, c in all_events(checked_files):
        if c.lib is None or not ReferenceDecoder.is_rows_type(c.ev.type_code):
            continue
        try:
            rows = ReferenceDecoder.materialise_rows(c.lib)
        except Exception as exc:  # the library's row decoders raise assorted exception types
            failures[(cf.name, c.ev.offset)] = type(exc).__name__
            continue
        assert isinstance(rows, list) and rows, f"{cf.name} @{c.ev.offset}: no rows"
        materialised += 1
    assert failures == KNOWN_ROW_VALUE_FAILURES
    assert materialised > 1600


def test_library_crc_checks_agree_with_ours(corpus_dir, manifest):
    """With the library's own CRC verification on, it accepts exactly the events our reader accepts.

    It also exposes a library bug: with verify_checksum on, each GTID_LIST entry object re-runs the
    CRC check, which rewinds the packet to the start of the body, so every entry is decoded from
    the body's first bytes (count_and_flags, then the first entry's domain and server ids).
    """
    crc_checked = lists = 0
    for entry in manifest:
        if entry["file"] in (NO_EVENTS,):
            continue
        cf = crosscheck_file(corpus_dir / entry["file"], entry["file"], entry, verify_checksum=True)
        for c in cf.events:
            where = f"{cf.name} @{c.ev.offset}"
            if c.lib is None:
                continue
            if c.checksum or (c.ev.type_code == C.FORMAT_DESCRIPTION_EVENT and c.fde.checksum_alg == C.CHECKSUM_CRC32):
                assert c.lib._is_event_valid is True and c.ev.crc_ok is True, where
                crc_checked += 1
            else:
                # No CRC to check: the library skips verification (its flag is forced off).
                assert c.lib._is_event_valid is None, where
            if c.ev.type_code == C.MARIA_GTID_LIST_EVENT and c.checksum and c.lib.gtid_list:
                body = c.ev.data[C.HEADER_LEN:]
                garbage = struct.unpack_from("<IIQ", body, 0)  # what re-reading from the body start gives
                got = [(g.domain_id, g.server_id, g.gtid_seq_no) for g in c.lib.gtid_list]
                assert got == [garbage] * len(got), where
                assert got != [tuple(g) for g in c.view.gtids], where
                lists += 1
    assert crc_checked > 30000 and lists >= 6
