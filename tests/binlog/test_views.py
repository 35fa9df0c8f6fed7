"""Typed event views: decoded against the real corpus, synthetic edge cases, and malformed input."""

from __future__ import annotations

import inspect
import json
import os
import struct
import zlib
from functools import lru_cache
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog.checksum import ChecksumError
from relayproxy.binlog.events import HEADER, BinlogFormatError, EventHeader, FormatDescription
from relayproxy.binlog.gtid import GtidSet, MariaGtid
from relayproxy.binlog.serialization import write_string, write_varlen_int, write_varlen_uint
from relayproxy.binlog.views import (
    EVENT_VIEWS,
    BinlogCheckpointView,
    EventView,
    ExecuteLoadQueryView,
    FormatDescriptionView,
    GtidTaggedView,
    GtidView,
    HeartbeatV2View,
    HeartbeatView,
    IncidentView,
    MariaGtidListView,
    MariaGtidView,
    OpaqueEvent,
    PreviousGtidsView,
    QueryView,
    RotateView,
    StartEncryptionView,
    TransactionPayloadView,
    XaPrepareView,
    XidView,
    read_net_field_length,
    view_event,
)

# Same rule as conftest's corpus_dir fixture; needed at import time for hypothesis' samples.
CORPUS = Path(os.environ.get("RELAYPROXY_CORPUS") or Path(__file__).resolve().parents[3] / "shared/corpus/binlogs")


@pytest.fixture(autouse=True, scope="module")
def _corpus_present(corpus_dir):
    """Fail (never skip) with conftest's clear message when the corpus is missing."""

BLACKBEAM = "blackbeam-rust_mysql_common/test-data/binlogs/"
MARIA_OP = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0/mariadb-repl-bin."
TAGGED_FILE = BLACKBEAM + "binlog_transaction_with_GTID_TAG.000001"

# Files the corpus keeps as negative tests, or whose bytes are not what a v4 reader expects.
KNOWN_BAD = {
    BLACKBEAM + "binlog_truncated_event.000001",  # magic + 10 bytes
    BLACKBEAM + "binlog_truncated_prev_gtid_event.000001",  # PREVIOUS_GTIDS cut short
    BLACKBEAM + "corrupt-relay-bin.000624",  # relay log from a corruption bug report
    BLACKBEAM + "ver_5_1-wl2325_r.001",  # 5.2 dev tree: its type 18 is not EXECUTE_LOAD_QUERY
}

# A stand-in FDE for synthetic events: 8.0 post-header lengths, with or without CRCs.
_POST_HEADERS_80 = bytes(
    [0, 13, 0, 8, 0, 0, 0, 0, 4, 0, 4, 0, 0, 0, 98, 0, 4, 26, 8, 0, 0, 0, 8, 8, 8, 2, 0, 0, 0, 10, 10, 10,
     42, 42, 0, 18, 52, 0, 10, 40, 0]
)  # fmt: skip
FDE_CRC = FormatDescription(4, "8.0.36", 0, 19, _POST_HEADERS_80, C.CHECKSUM_CRC32)
FDE_NOCRC = FormatDescription(4, "8.0.36", 0, 19, _POST_HEADERS_80, C.CHECKSUM_OFF)
MARIA_FDE = FormatDescription(4, "10.11.6-MariaDB-log", 0, 19, bytes(163), C.CHECKSUM_CRC32)


def corpus_events(rel: str):
    """(data, offset, header, fde) for each whole event of a corpus file, with the FDE in force."""
    return _events(rel)


@lru_cache(maxsize=None)
def _events(rel: str) -> tuple:
    data = (CORPUS / rel).read_bytes()
    out = []
    pos, fde = 4, None
    while pos + C.HEADER_LEN <= len(data):
        header = EventHeader.unpack(data, pos)
        if header.event_size < C.HEADER_LEN or pos + header.event_size > len(data):
            break
        if header.type_code == C.FORMAT_DESCRIPTION_EVENT:
            fde = FormatDescription.parse(data, pos)
        out.append((data, pos, header, fde))
        pos += header.event_size
    return tuple(out)


def manifest() -> list[dict]:
    return json.loads((CORPUS / "manifest.json").read_text())


def views_of(rel: str, *type_codes: int) -> list[EventView]:
    return [view_event(d, p, f) for d, p, h, f in corpus_events(rel) if not type_codes or h.type_code in type_codes]


def make_event(type_code: int, body: bytes, *, fde: FormatDescription = FDE_CRC, server_id: int = 7,
               log_pos: int = 1000, flags: int = 0, timestamp: int = 1700000000) -> bytes:
    crc = fde.checksum_len
    ev = HEADER.pack(timestamp, type_code, server_id, 19 + len(body) + crc, log_pos, flags) + body
    return ev + struct.pack("<I", zlib.crc32(ev)) if crc else ev


def public_properties(view: EventView) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(type(view))
        if isinstance(member, property) and not name.startswith("_")
    ]


def touch_everything(view: EventView) -> None:
    """Read every public property, the summary and any inner events (what inspect would do)."""
    for name in public_properties(view):
        getattr(view, name)
    view.describe()
    if isinstance(view, TransactionPayloadView):
        for inner in view.iter_inner_events():
            touch_everything(inner)


# ---------------------------------------------------------------------------------------------
# The whole corpus
# ---------------------------------------------------------------------------------------------


def test_every_corpus_event_decodes_and_verifies():
    checked = 0
    for entry in manifest():
        rel = entry["file"]
        if rel in KNOWN_BAD:
            continue
        events = corpus_events(rel)
        assert len(events) == entry["events"], rel
        for data, pos, header, fde in events:
            view = view_event(data, pos, fde)
            assert view.header == header
            assert view.end_offset == pos + header.event_size
            touch_everything(view)
            view.verify_checksum()
            checked += 1
    assert checked > 34000


def test_known_bad_files_raise_format_errors():
    # The corrupt relay log's event at 91204 claims 16949 bytes of status vars in a 171-byte event.
    data, pos, _, fde = next(e for e in corpus_events(BLACKBEAM + "corrupt-relay-bin.000624") if e[1] == 91204)
    with pytest.raises(BinlogFormatError, match="at offset 91204: QUERY: status vars"):
        view_event(data, pos, fde)
    # A 5.2 dev-tree FDE gives type 18 a 6-byte post-header: not an EXECUTE_LOAD_QUERY layout.
    data, pos, _, fde = next(e for e in corpus_events(BLACKBEAM + "ver_5_1-wl2325_r.001") if e[2].type_code == 18)
    with pytest.raises(BinlogFormatError, match="post-header length 6"):
        view_event(data, pos, fde)


def test_dispatch_picks_the_typed_view():
    expected = {
        C.FORMAT_DESCRIPTION_EVENT: FormatDescriptionView,
        C.QUERY_EVENT: QueryView,
        C.EXECUTE_LOAD_QUERY_EVENT: ExecuteLoadQueryView,
        C.ROTATE_EVENT: RotateView,
        C.XID_EVENT: XidView,
        C.GTID_LOG_EVENT: GtidView,
        C.ANONYMOUS_GTID_LOG_EVENT: GtidView,
        C.GTID_TAGGED_LOG_EVENT: GtidTaggedView,
        C.PREVIOUS_GTIDS_LOG_EVENT: PreviousGtidsView,
        C.TRANSACTION_PAYLOAD_EVENT: TransactionPayloadView,
        C.MARIA_GTID_EVENT: MariaGtidView,
        C.MARIA_GTID_LIST_EVENT: MariaGtidListView,
        C.MARIA_BINLOG_CHECKPOINT_EVENT: BinlogCheckpointView,
        C.TABLE_MAP_EVENT: OpaqueEvent,
        100: OpaqueEvent,  # Aurora's padding event
    }
    seen = set()
    for entry in manifest():
        if entry["file"] in KNOWN_BAD:
            continue
        for data, pos, header, fde in corpus_events(entry["file"]):
            if header.type_code in expected:
                assert type(view_event(data, pos, fde)) is expected[header.type_code]
                seen.add(header.type_code)
    assert seen == set(expected)


# ---------------------------------------------------------------------------------------------
# MySQL GTIDs
# ---------------------------------------------------------------------------------------------


def _groups_by_transaction_length(rel: str):
    """For each GTID event with a transaction_length: (gtid view, summed sizes of its group)."""
    events = corpus_events(rel)
    starts = [i for i, e in enumerate(events) if e[2].type_code in (33, 34, 42)]
    for n, i in enumerate(starts):
        view = view_event(*events[i][:2], events[i][3])
        if view.transaction_length is None:
            continue
        stop = starts[n + 1] if n + 1 < len(starts) else len(events)
        # The group is the GTID up to (excluding) the next GTID, minus trailing ROTATE/STOP.
        while stop > i + 1 and events[stop - 1][2].type_code in (C.ROTATE_EVENT, C.STOP_EVENT):
            stop -= 1
        yield view, sum(e[2].event_size for e in events[i:stop])


def test_transaction_length_equals_the_group_size_on_every_80_gtid():
    checked = total = 0
    for entry in manifest():
        version = entry["server_version"]
        if entry["file"] in KNOWN_BAD or "MariaDB" in version or not version[:1].isdigit():
            continue
        if int(version.split(".")[0]) < 8:
            continue
        total += sum(entry["counts"].get(kind, 0) for kind in ("GTID", "ANONYMOUS_GTID", "GTID_TAGGED"))
        for view, group_size in _groups_by_transaction_length(entry["file"]):
            assert view.transaction_length == group_size, (entry["file"], view.offset)
            checked += 1
    # Every 8.0+ GTID carries transaction_length (8.0.2+), and every one matched its group.
    assert checked == total > 60


def test_80_gtid_tail_fields():
    views = views_of(BLACKBEAM + "transaction_compression.000001", C.ANONYMOUS_GTID_LOG_EVENT)
    (gtid,) = views
    assert gtid.is_anonymous and gtid.gtid == "ANONYMOUS" and gtid.gno == 0
    assert gtid.sid == bytes(16)
    assert (gtid.lt_type, gtid.last_committed, gtid.sequence_number) == (2, 0, 1)
    assert gtid.immediate_commit_timestamp == int.from_bytes(bytes.fromhex("69688efcbc0506"), "little")
    assert gtid.original_commit_timestamp == gtid.immediate_commit_timestamp
    assert abs(gtid.immediate_commit_timestamp // 10**6 - gtid.timestamp) <= 1
    assert gtid.transaction_length == 234
    assert gtid.immediate_server_version == gtid.original_server_version == 80032
    assert gtid.commit_group_ticket is None
    assert gtid.describe() == "ANONYMOUS last_committed=0 sequence_number=1 transaction_length=234"


def test_56_and_57_gtid_forms():
    gtids56 = views_of(BLACKBEAM + "binlog_56_gtid_reserved_word.000001", C.GTID_LOG_EVENT)
    assert [g.gno for g in gtids56] == [1, 2, 3, 4, 5, 6]
    for g in gtids56:
        assert g.body_len == 25
        assert g.uuid == "11111111-1111-1111-1111-111111111111"
        assert (g.lt_type, g.last_committed, g.sequence_number, g.transaction_length) == (None,) * 4
        assert g.immediate_commit_timestamp is None and g.commit_group_ticket is None
    gtids57 = views_of("Meituan-Dianping-MyFlash/testbinlog/haha.000041", C.GTID_LOG_EVENT)
    assert [g.gtid for g in gtids57] == [f"efca80c9-323b-11e7-b857-00505622f032:{n}" for n in range(126, 133)]
    assert [(g.last_committed, g.sequence_number) for g in gtids57] == [(n, n + 1) for n in range(7)]
    assert all(g.transaction_length is None and g.immediate_server_version is None for g in gtids57)


def test_previous_gtids_then_gtids_continue_the_set():
    rel = "Meituan-Dianping-MyFlash/testbinlog/haha.000041"
    (prev,) = views_of(rel, C.PREVIOUS_GTIDS_LOG_EVENT)
    assert not prev.is_tagged_format
    assert str(prev.gtid_set) == "efca80c9-323b-11e7-b857-00505622f032:1-125"
    running = prev.gtid_set.copy()
    for g in views_of(rel, C.GTID_LOG_EVENT):
        assert not running.contains_gtid(g.sid, g.gno)
        assert running.last_gno(g.sid) == g.gno - 1
        running.add(g.sid, g.gno)
    # Consecutive 5.7 files without GTIDs carry the same (empty) set from file to file.
    for n in ("7.from-xxd", "8", "9"):
        (p,) = views_of(f"Meituan-Dianping-MyFlash/testbinlog/haha.00000{n}", C.PREVIOUS_GTIDS_LOG_EVENT)
        assert not p.gtid_set and p.describe() == "(empty)"


def test_tagged_gtid_from_96():
    events = views_of(TAGGED_FILE)
    prev = next(v for v in events if isinstance(v, PreviousGtidsView))
    tagged = next(v for v in events if isinstance(v, GtidTaggedView))
    sid = bytes.fromhex("557789040299 11f1b1b84ef0c4956feb".replace(" ", ""))
    assert prev.is_tagged_format
    assert prev.gtid_set == GtidSet("55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2")
    assert (tagged.sid, tagged.tag, tagged.gno) == (sid, "mytag", 3)
    assert tagged.gtid == "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:3"
    assert tagged.flags == tagged.gtid_flags == 0 and not tagged.may_have_sbr
    assert (tagged.last_committed, tagged.sequence_number) == (0, 1)
    assert tagged.immediate_commit_timestamp == 0x064A2414B8F31C == tagged.original_commit_timestamp
    assert tagged.immediate_server_version == tagged.original_server_version == 90600
    assert tagged.commit_group_ticket is None and tagged.lt_type is None
    assert tagged.transaction_length == 296
    assert not prev.gtid_set.contains_gtid(sid, 3, "mytag")
    ((view, size),) = list(_groups_by_transaction_length(TAGGED_FILE))
    assert size == 296


def _tagged_body(
    fields: dict[int, bytes], *, last_non_ignorable: int = 0, version: int = 1, extra: bytes = b""
) -> bytes:
    payload = b"".join(write_varlen_uint(fid) + value for fid, value in sorted(fields.items())) + extra
    rest = write_varlen_uint(last_non_ignorable) + payload
    fixed = len(write_varlen_uint(version)) + len(rest)
    size = fixed + 1
    while fixed + len(write_varlen_uint(size)) != size:  # the size counts its own bytes
        size = fixed + len(write_varlen_uint(size))
    return write_varlen_uint(version) + write_varlen_uint(size) + rest


def _tagged_fields(over: dict[int, bytes | None] | None = None) -> dict[int, bytes]:
    sid = bytes(range(16))
    fields = {
        0: write_varlen_uint(0),
        1: b"".join(write_varlen_uint(b) for b in sid),
        2: write_varlen_int(42),
        3: write_string("Blue_1"),
        4: write_varlen_int(7),
        5: write_varlen_int(9),
        6: write_varlen_uint(1_700_000_000_000_001),
        8: write_varlen_uint(1234),
        9: write_varlen_uint(80400),
    }
    fields.update(over or {})
    return {k: v for k, v in fields.items() if v is not None}


def test_synthetic_tagged_gtid_optional_and_unknown_fields():
    fields = _tagged_fields(
        {7: write_varlen_uint(1_600_000_000_000_000), 10: write_varlen_uint(80036), 11: write_varlen_uint(5)}
    )
    # A newer server's ignorable field 12 is skipped thanks to the message size.
    body = _tagged_body(fields, last_non_ignorable=12, extra=write_varlen_uint(12) + write_varlen_uint(99))
    for fde in (FDE_CRC, FDE_NOCRC):
        view = view_event(make_event(C.GTID_TAGGED_LOG_EVENT, body, fde=fde), 0, fde)
        assert (view.sid, view.tag, view.gno) == (bytes(range(16)), "blue_1", 42)
        assert (view.last_committed, view.sequence_number) == (7, 9)
        assert view.immediate_commit_timestamp == 1_700_000_000_000_001
        assert view.original_commit_timestamp == 1_600_000_000_000_000
        assert (view.immediate_server_version, view.original_server_version) == (80400, 80036)
        assert (view.transaction_length, view.commit_group_ticket) == (1234, 5)
    # An unknown non-ignorable field is refused, as MySQL refuses it.
    body = _tagged_body(fields, last_non_ignorable=13)
    with pytest.raises(BinlogFormatError, match="unknown non-ignorable field 12"):
        view_event(make_event(C.GTID_TAGGED_LOG_EVENT, body), 0, FDE_CRC).gno
    # An unknown serialization version, a tag over 32 bytes, a message size past the body.
    with pytest.raises(BinlogFormatError, match="serialization format version 2"):
        view_event(make_event(C.GTID_TAGGED_LOG_EVENT, _tagged_body(fields, version=2)), 0, FDE_CRC).tag
    with pytest.raises(BinlogFormatError, match="limit of 32"):
        bad = _tagged_body(_tagged_fields({3: write_string("x" * 33)}))
        view_event(make_event(C.GTID_TAGGED_LOG_EVENT, bad), 0, FDE_CRC).tag
    with pytest.raises(BinlogFormatError, match="does not fit"):
        view_event(make_event(C.GTID_TAGGED_LOG_EVENT, b"\x02\x7e\x00"), 0, FDE_CRC).gno
    with pytest.raises(BinlogFormatError, match="invalid GNO 0"):
        view_event(make_event(C.GTID_TAGGED_LOG_EVENT, _tagged_body(_tagged_fields({2: None}))), 0, FDE_CRC).gno


def test_gtid_gno_and_length_checks():
    body = struct.pack("<B16sqBqq", 1, b"\x11" * 16, 0, 2, 0, 1)
    with pytest.raises(BinlogFormatError, match="invalid GNO 0"):
        view_event(make_event(C.GTID_LOG_EVENT, body), 0, FDE_CRC).gno
    body = struct.pack("<B16sqBqq", 1, bytes(16), 5, 2, 0, 1)
    with pytest.raises(BinlogFormatError, match="anonymous GTID with GNO 5"):
        view_event(make_event(C.ANONYMOUS_GTID_LOG_EVENT, body), 0, FDE_CRC).gno
    with pytest.raises(BinlogFormatError, match="flags \\+ SID \\+ GNO needs 25 bytes"):
        view_event(make_event(C.GTID_LOG_EVENT, b"\x01" * 24), 0, FDE_CRC)
    # Bit 55 promises an original_commit_timestamp that is not there.
    ts = (1 << 55 | 12345).to_bytes(7, "little")
    body = struct.pack("<B16sqBqq", 1, b"\x11" * 16, 9, 2, 0, 1) + ts + b"\x01\x02"
    with pytest.raises(BinlogFormatError, match="original_commit_timestamp needs 7 bytes"):
        view_event(make_event(C.GTID_LOG_EVENT, body), 0, FDE_CRC).transaction_length
    # Packed transaction_length whose prefix promises more bytes than remain.
    body = struct.pack("<B16sqBqq", 1, b"\x11" * 16, 9, 2, 0, 1) + (12345).to_bytes(7, "little") + b"\xfe\x01"
    message = "transaction_length at body offset 49: truncated packed integer: needs 9 bytes, 2 left"
    with pytest.raises(BinlogFormatError, match=message):
        view_event(make_event(C.GTID_LOG_EVENT, body), 0, FDE_CRC).transaction_length


def test_gtid_full_tail_with_originals_and_ticket():
    ict, oct_ = 1_700_000_000_000_002, 1_690_000_000_000_000
    body = (
        struct.pack("<B16sqBqq", 0, b"\xab" * 16, 77, 2, 5, 6)
        + (ict | 1 << 55).to_bytes(7, "little")
        + oct_.to_bytes(7, "little")
        + b"\xfc\x10\x27"  # transaction_length 10000
        + struct.pack("<II", 80036 | 1 << 31, 57044)
        + struct.pack("<Q", 99)
    )
    view = view_event(make_event(C.GTID_LOG_EVENT, body), 0, FDE_CRC)
    assert (view.immediate_commit_timestamp, view.original_commit_timestamp) == (ict, oct_)
    assert view.transaction_length == 10000
    assert (view.immediate_server_version, view.original_server_version) == (80036, 57044)
    assert view.commit_group_ticket == 99 and not view.may_have_sbr


# ---------------------------------------------------------------------------------------------
# TRANSACTION_PAYLOAD
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rel, expected",
    [
        (BLACKBEAM + "transaction_compression.000001", [[2, 19, 30, 16]]),
        ("osheroff-mysql-binlog-connector-java/src/test/resources/mysql-bin.compressed", [[2, 19, 31, 16]]),
        (
            "apecloud-mysql-binlog-connector-rust/tests/parse_file_tests/mysql-bin.000057",
            [[2, 29, 19, 30, 16], [2, 29, 19, 31, 29, 19, 30, 16]],
        ),
    ],
)
def test_transaction_payload_inner_events(rel, expected):
    payloads = views_of(rel, C.TRANSACTION_PAYLOAD_EVENT)
    assert [[inner.type_code for inner in p.iter_inner_events()] for p in payloads] == expected
    for p in payloads:
        assert p.compression_type == C.PAYLOAD_COMPRESSION_ZSTD
        assert p.payload_size == len(p.payload) and p.payload.startswith(b"\x28\xb5\x2f\xfd")
        inner = list(p.iter_inner_events(chunk_size=7))  # tiny reads: same events
        assert [i.raw for i in inner] == [i.raw for i in p.iter_inner_events()]
        # Inner events carry no CRC and log_pos 0, and fill uncompressed_size exactly.
        assert sum(i.event_size for i in inner) == p.uncompressed_size
        assert all(i.log_pos == 0 and not i.has_checksum and i.server_id == p.server_id for i in inner)
        assert inner[0].query_text == "BEGIN"
        assert isinstance(inner[-1], XidView)


def _payload_event(payload: bytes, *, compression: int, uncompressed: int | None, fde=FDE_CRC) -> bytes:
    def tlv(field: int, value: int) -> bytes:
        v = value.to_bytes(1, "little") if value < 251 else b"\xfc" + value.to_bytes(2, "little")
        return bytes([field, len(v)]) + v

    head = tlv(C.PAYLOAD_FIELD_COMPRESSION_TYPE, compression)
    if uncompressed is not None:
        head += tlv(C.PAYLOAD_FIELD_UNCOMPRESSED_SIZE, uncompressed)
    head += tlv(C.PAYLOAD_FIELD_SIZE, len(payload)) + b"\x00"
    return make_event(C.TRANSACTION_PAYLOAD_EVENT, head + payload, fde=fde)


def _inner_events() -> bytes:
    inner = make_event(C.QUERY_EVENT, struct.pack("<IIBHH", 5, 0, 0, 0, 0) + b"\0BEGIN", fde=FDE_NOCRC, log_pos=0)
    inner += make_event(C.XID_EVENT, struct.pack("<Q", 77), fde=FDE_NOCRC, log_pos=0)
    return inner


def test_payload_stored_and_zstd_round_trip():
    raw = _inner_events()
    for compression, payload in (
        (C.PAYLOAD_COMPRESSION_NONE, raw),
        (C.PAYLOAD_COMPRESSION_ZSTD, zstandard.compress(raw)),
    ):
        view = view_event(_payload_event(payload, compression=compression, uncompressed=len(raw)), 0, FDE_CRC)
        inner = list(view.iter_inner_events())
        assert [i.type_code for i in inner] == [C.QUERY_EVENT, C.XID_EVENT]
        assert inner[0].query == b"BEGIN" and inner[0].thread_id == 5 and inner[1].xid == 77
        assert b"".join(i.raw for i in inner) == raw


def test_payload_streams_without_trusting_uncompressed_size():
    raw = _inner_events() * 50
    # uncompressed_size absent (it is informational): still decoded, by streaming.
    view = view_event(_payload_event(zstandard.compress(raw), compression=0, uncompressed=None), 0, FDE_CRC)
    assert view.uncompressed_size is None and len(list(view.iter_inner_events(chunk_size=13))) == 100
    # A lying uncompressed_size is caught, not used to size a buffer.
    view = view_event(_payload_event(zstandard.compress(raw), compression=0, uncompressed=10), 0, FDE_CRC)
    with pytest.raises(BinlogFormatError, match="runs past uncompressed_size 10"):
        list(view.iter_inner_events())


@pytest.mark.parametrize(
    "payload, compression, match",
    [
        (zstandard.compress(b"\x00" * 19 + b"junk"), 0, "invalid event_size 0"),
        (zstandard.compress(_inner_events())[:-6], 0, "zstd frame is truncated"),
        (b"not a zstd frame at all", 0, "zstd decompression failed at payload offset"),
        (zstandard.compress(_inner_events()) + b"trailing", 0, "zstd decompression failed"),
        (_inner_events()[:-3], C.PAYLOAD_COMPRESSION_NONE, "ends inside an event at uncompressed offset 38"),
        (zstandard.compress(_inner_events()[:30]), 0, "ends inside an event at uncompressed offset 0"),
        (zstandard.compress(_inner_events()[:48]), 0, "ends inside an event header at uncompressed offset 38"),
    ],
)
def test_payload_corruption_is_a_format_error(payload, compression, match):
    view = view_event(_payload_event(payload, compression=compression, uncompressed=None), 0, FDE_CRC)
    with pytest.raises(BinlogFormatError, match=match):
        list(view.iter_inner_events())


def test_payload_header_errors():
    for head, match in (
        (b"\x02\x01\x00\x00", "no payload_size"),
        (b"\x01\x01\x05\x00", "no compression_type"),
        (b"\x02\x01\x07\x01\x01\x00\x00", "unknown compression type 7"),
        (b"\x02\x01\x00\x01\x01\x09\x00abc", "payload_size 9 exceeds"),
        (b"\x02\x01\x00", "without its end mark"),
        (b"\x09\x05\x00", "unknown field 9 needs 5 bytes"),
    ):
        view = view_event(make_event(C.TRANSACTION_PAYLOAD_EVENT, head), 0, FDE_CRC)
        with pytest.raises(BinlogFormatError, match=match):
            view.payload_size
    # Unknown TLV fields are skipped by their length, as MySQL's decoder does.
    # NONE (255) is a packed integer too: 0xfc 0xff 0x00, in a 3-byte field.
    head = b"\x09\x02xy" + b"\x02\x03\xfc\xff\x00" + b"\x01\x01\x00" + b"\x00"
    view = view_event(make_event(C.TRANSACTION_PAYLOAD_EVENT, head), 0, FDE_CRC)
    assert (view.compression_type, view.payload_size, list(view.iter_inner_events())) == (255, 0, [])


# ---------------------------------------------------------------------------------------------
# MariaDB
# ---------------------------------------------------------------------------------------------


def test_mariadb_105_gtids_and_preamble():
    rel = BLACKBEAM + "mariadb-bin.000001"
    (glist,) = views_of(rel, C.MARIA_GTID_LIST_EVENT)
    assert glist.gtids == () and glist.count == 0 and glist.flags == 0 and glist.body_len == 6
    (checkpoint,) = views_of(rel, C.MARIA_BINLOG_CHECKPOINT_EVENT)
    assert checkpoint.file_name == "mariadb-bin.000001"
    gtids = views_of(rel, C.MARIA_GTID_EVENT)
    assert [g.gtid for g in gtids] == [MariaGtid(0, 1, 1), MariaGtid(0, 1, 2)]
    for g in gtids:
        assert g.flags2 == C.FL_TRANSACTIONAL | C.FL_ALLOW_PARALLEL
        assert g.transactional and g.allow_parallel and not g.standalone and not g.is_xa
        assert g.commit_id is None and g.flags_extra == 0 and g.thread_id is None
        assert g.header.flags == C.LOG_EVENT_SUPPRESS_USE_F


def test_mariadb_118_gtid_flags_and_thread_id():
    views = views_of(MARIA_OP + "000002")
    gtids = [v for v in views if isinstance(v, MariaGtidView)]
    assert len(gtids) == 4433
    standalone = [g for g in gtids if g.standalone]
    assert len(standalone) == 2 and all(g.is_ddl for g in standalone)
    assert len(gtids) - len(standalone) == sum(isinstance(v, XidView) for v in views)
    # 11.5+ writes flags_extra FL_EXTRA_THREAD_ID with the originating thread id.
    assert all(g.flags_extra == 0x10 and g.thread_id is not None for g in gtids)
    assert [g.gtid.seq_no for g in gtids] == list(range(250080, 254513))
    # A standalone group is the GTID plus exactly one statement.
    index = {v.offset: i for i, v in enumerate(views)}
    for g in standalone:
        nxt = views[index[g.offset] + 1]
        assert isinstance(nxt, QueryView) and not nxt.query_text.startswith("BEGIN")
        assert isinstance(views[index[g.offset] + 2], (MariaGtidView, RotateView))


@pytest.mark.parametrize(
    "first, second", [("000004", "000005"), ("000005", "000006"), ("000006", "000007"), ("000009", "000010")]
)
def test_mariadb_gtid_list_of_consecutive_files(first, second):
    (list1,) = views_of(MARIA_OP + first, C.MARIA_GTID_LIST_EVENT)
    state = list1.state
    for g in views_of(MARIA_OP + first, C.MARIA_GTID_EVENT):
        state.update(g.gtid)
    (list2,) = views_of(MARIA_OP + second, C.MARIA_GTID_LIST_EVENT)
    assert list2.state == state
    assert list(list2.gtids) == state.gtids()
    checkpoints = [c.file_name for c in views_of(MARIA_OP + second, C.MARIA_BINLOG_CHECKPOINT_EVENT)]
    assert checkpoints[-1] == "mariadb-repl-bin." + second


def test_mariadb_10_0_standalone_flags():
    gtids = views_of("pingcap-tiflow/mysql-bin.000001", C.MARIA_GTID_EVENT)
    assert {g.flags2 for g in gtids} == {0, 1}
    assert all(g.flags_extra == 0 and g.body_len == 19 for g in gtids)


def _maria_gtid(flags2: int, tail: bytes, *, seq_no: int = 100, domain: int = 3) -> bytes:
    body = struct.pack("<QIB", seq_no, domain, flags2) + tail
    return make_event(C.MARIA_GTID_EVENT, body + bytes(max(0, 19 - len(body))), fde=MARIA_FDE, server_id=11)


def test_mariadb_gtid_optional_fields():
    view = view_event(_maria_gtid(C.FL_GROUP_COMMIT_ID | C.FL_TRANSACTIONAL, struct.pack("<Q", 555)), 0, MARIA_FDE)
    assert view.commit_id == 555 and view.gtid_text == "3-11-100" and view.describe() == "3-11-100 trans cid=555"
    xid = struct.pack("<IBB", 1, 3, 2) + b"abcXY"
    view = view_event(_maria_gtid(C.FL_PREPARED_XA, xid), 0, MARIA_FDE)
    assert view.is_xa and view.is_prepared_xa and not view.is_completed_xa
    assert (view.xid_format_id, view.xid_gtrid, view.xid_bqual) == (1, b"abc", b"XY")
    assert view.xid_text == "X'616263',X'5859',1"
    extra = bytes([0x01 | C.FL_COMMIT_ALTER_E1 | 0x10, 2]) + struct.pack("<QI", 98, 4242)
    raw = _maria_gtid(C.FL_COMPLETED_XA | C.FL_GROUP_COMMIT_ID, struct.pack("<Q", 1) + xid + extra)
    view = view_event(raw, 0, MARIA_FDE)
    assert (view.commit_id, view.xid_gtrid, view.flags_extra) == (1, b"abc", 0x15)
    assert (view.extra_engines, view.sa_seq_no, view.thread_id) == (2, 98, 4242)
    assert view.is_commit_alter and not view.is_start_alter and not view.is_rollback_alter


def test_mariadb_gtid_malformed():
    with pytest.raises(BinlogFormatError, match="shorter than the 19-byte minimum"):
        view_event(make_event(C.MARIA_GTID_EVENT, bytes(18), fde=MARIA_FDE), 0, MARIA_FDE)
    view = view_event(_maria_gtid(C.FL_PREPARED_XA, struct.pack("<IBB", 1, 60, 60)), 0, MARIA_FDE)
    with pytest.raises(BinlogFormatError, match="XID data needs 120 bytes"):
        view.xid_text
    view = view_event(_maria_gtid(C.FL_PREPARED_XA, struct.pack("<IBB", 1, 65, 0)), 0, MARIA_FDE)
    with pytest.raises(BinlogFormatError, match="invalid XID lengths"):
        view.describe()
    view = view_event(_maria_gtid(0, bytes([C.FL_ROLLBACK_ALTER_E1, 1, 2])), 0, MARIA_FDE)
    with pytest.raises(BinlogFormatError, match="sa_seq_no needs 8 bytes"):
        view.sa_seq_no


def test_gtid_list_flags_and_truncation():
    body = struct.pack("<I", 2 | C.GTID_LIST_FLAG_IGN_GTIDS) + struct.pack("<IIQIIQ", 0, 1, 5, 1, 2, 9)
    view = view_event(make_event(C.MARIA_GTID_LIST_EVENT, body, fde=MARIA_FDE), 0, MARIA_FDE)
    assert view.flags == C.GTID_LIST_FLAG_IGN_GTIDS and view.count == 2
    assert view.gtids == (MariaGtid(0, 1, 5), MariaGtid(1, 2, 9))
    assert view.describe() == "[0-1-5,1-2-9] ign-gtids"
    view = view_event(make_event(C.MARIA_GTID_LIST_EVENT, body[:-1], fde=MARIA_FDE), 0, MARIA_FDE)
    with pytest.raises(BinlogFormatError, match="2 GTID entries needs 32 bytes"):
        view.gtids


def test_start_encryption_and_checkpoint_synthetic():
    body = bytes([1]) + struct.pack("<I", 7) + bytes(range(12))
    view = view_event(make_event(C.MARIA_START_ENCRYPTION_EVENT, body, fde=MARIA_FDE), 0, MARIA_FDE)
    assert isinstance(view, StartEncryptionView)
    assert (view.scheme, view.key_version, view.nonce) == (1, 7, bytes(range(12)))
    view = view_event(make_event(C.MARIA_START_ENCRYPTION_EVENT, body[:10], fde=MARIA_FDE), 0, MARIA_FDE)
    with pytest.raises(BinlogFormatError, match="nonce needs 12 bytes"):
        view.nonce
    raw = make_event(C.MARIA_BINLOG_CHECKPOINT_EVENT, struct.pack("<I", 20) + b"short", fde=MARIA_FDE)
    view = view_event(raw, 0, MARIA_FDE)
    with pytest.raises(BinlogFormatError, match="file name needs 20 bytes"):
        view.file_name


# ---------------------------------------------------------------------------------------------
# QUERY, ROTATE, XID, INCIDENT, FDE
# ---------------------------------------------------------------------------------------------


def test_query_fields():
    views = views_of("PrivateRookie-boxercrab/tests/events/02_query/log.bin", C.QUERY_EVENT)
    assert views[0].query_text == "DROP TABLE IF EXISTS `boxercrab` /* generated by server */"
    create = views[1]
    assert create.db == "default" and create.error_code == 0 and create.exec_time == 0
    assert create.query_text.startswith("CREATE TABLE")
    assert create.status_vars[:1] == b"\x00"  # Q_FLAGS2 first
    assert create.query_prefix(6) == b"CREATE"
    assert create.describe().startswith("default: CREATE TABLE")
    assert len(create.describe()) <= len("default: ") + 60
    begins = [q for q in views_of(TAGGED_FILE, C.QUERY_EVENT)]
    assert begins[0].query == b"BEGIN" and begins[0].db == "test" and begins[0].describe() == "test: BEGIN"


def test_execute_load_query_fields():
    (elq,) = views_of("PrivateRookie-boxercrab/tests/events/17_18_load/log.bin", C.EXECUTE_LOAD_QUERY_EVENT)
    assert elq.file_id == 1 and elq.fn_pos_start < elq.fn_pos_end <= elq.query_len
    assert b"INFILE '/tmp/data.txt'" in elq.query[elq.fn_pos_start : elq.fn_pos_end]
    assert elq.dup_handling in (0, 1, 2)


def test_query_malformed():
    with pytest.raises(BinlogFormatError, match="post-header needs 13 bytes"):
        view_event(make_event(C.QUERY_EVENT, b"\x00" * 12), 0, FDE_CRC)
    # db_len 200 in a short body.
    body = struct.pack("<IIBHH", 1, 0, 200, 0, 0) + b"db\0SELECT"
    with pytest.raises(BinlogFormatError, match="db name \\(200 bytes\\)"):
        view_event(make_event(C.QUERY_EVENT, body), 0, FDE_CRC)


def test_rotate_fields():
    (rot,) = views_of("Meituan-Dianping-MyFlash/testbinlog/haha.000009", C.ROTATE_EVENT)
    assert (rot.next_file, rot.position, rot.is_artificial) == ("haha.000010", 4, False)
    assert rot.log_pos == rot.end_offset and rot.describe() == "-> haha.000010:4"
    fakes = [r for r in views_of(BLACKBEAM + "rpl_unfiltered_hidden_gcol.000001", C.ROTATE_EVENT) if r.is_artificial]
    assert fakes and all(r.timestamp == 0 or r.log_pos == 0 for r in fakes)
    # A stand-in FDE without per-type lengths still reads the frozen 8-byte position.
    raw = make_event(C.ROTATE_EVENT, struct.pack("<Q", 123) + b"bin.000007", fde=FDE_NOCRC)
    view = view_event(raw, 0, None)
    assert (view.position, view.next_file) == (123, "bin.000007")
    with pytest.raises(BinlogFormatError, match="next file name is empty"):
        view_event(make_event(C.ROTATE_EVENT, struct.pack("<Q", 4)), 0, FDE_CRC).next_file


def test_xid_and_incident():
    xids = views_of(TAGGED_FILE, C.XID_EVENT)
    assert [x.xid for x in xids] == [40]
    (incident,) = views_of(BLACKBEAM + "bug40482-bin.000001", C.INCIDENT_EVENT)
    assert (incident.incident_type, incident.message) == (66, "")  # the bug's test writes number 66
    view = view_event(make_event(C.INCIDENT_EVENT, b"\x01\x00\x0blost events"), 0, FDE_CRC)
    assert isinstance(view, IncidentView)
    assert view.describe() == "incident 1 (LOST_EVENTS): lost events"
    view = view_event(make_event(C.INCIDENT_EVENT, b"\x01\x00\x20abc"), 0, FDE_CRC)
    with pytest.raises(BinlogFormatError, match="message needs 32 bytes"):
        view.message


def test_format_description_view():
    (fde,) = views_of("osheroff-mysql-binlog-connector-java/src/test/resources/mysql-bin.compressed", 15)
    assert fde.server_version == "8.0.28" and fde.checksum_alg == C.CHECKSUM_CRC32
    assert fde.body_len == 57 + len(fde.format.post_header_lens)
    assert fde.describe().startswith("server 8.0.28, binlog v4, checksum CRC32")
    # Checksum OFF files still carry a valid FDE CRC; pre-5.6 FDEs have none.
    (off,) = views_of("shyiko-mysql-binlog-connector-java/src/test/resources/mysql-bin.checksum-none", 15)
    assert off.checksum_alg == C.CHECKSUM_OFF and off.has_checksum
    off.verify_checksum()
    (old,) = views_of(BLACKBEAM + "bug16266.000001", 15)
    assert old.checksum_alg == C.CHECKSUM_UNDEF and not old.has_checksum and old.body_end == old.end_offset
    raw = bytearray(off.raw)
    raw[90] ^= 0xFF  # a post-header length (flipping the version text would make it "pre-checksum")
    with pytest.raises(ChecksumError):
        view_event(bytes(raw), 0, None).verify_checksum()


def test_xa_prepare_synthetic():
    body = struct.pack("<BIII", 0, 1, 3, 2) + b"gtrbq"
    view = view_event(make_event(C.XA_PREPARE_LOG_EVENT, body), 0, FDE_CRC)
    assert isinstance(view, XaPrepareView)
    assert (view.one_phase, view.format_id, view.gtrid, view.bqual) == (False, 1, b"gtr", b"bq")
    assert view.xid_text == "X'677472',X'6271',1" and view.describe() == "XA PREPARE X'677472',X'6271',1"
    view = view_event(make_event(C.XA_PREPARE_LOG_EVENT, struct.pack("<BIII", 1, 7, 1, 0) + b"\xff"), 0, FDE_CRC)
    assert view.describe() == "XA COMMIT X'ff',X'',7 ONE PHASE"
    view = view_event(make_event(C.XA_PREPARE_LOG_EVENT, struct.pack("<BIII", 0, 1, 65, 0)), 0, FDE_CRC)
    with pytest.raises(BinlogFormatError, match="invalid XID lengths"):
        view.gtrid
    view = view_event(make_event(C.XA_PREPARE_LOG_EVENT, struct.pack("<BIII", 0, 1, 10, 0) + b"abc"), 0, FDE_CRC)
    with pytest.raises(BinlogFormatError, match="gtrid needs 10 bytes"):
        view.xid_text


def test_heartbeats_synthetic():
    view = view_event(make_event(C.HEARTBEAT_LOG_EVENT, b"binlog.000003", timestamp=0, log_pos=4567), 0, FDE_CRC)
    assert isinstance(view, HeartbeatView)
    assert (view.log_file, view.log_pos, view.has_sub_header) == ("binlog.000003", 4567, False)
    # MariaDB past 4 GB: log_pos 0 and an 8-byte position sub-header.
    body = struct.pack("<Q", 5 << 32) + b"mariadb-bin.000002"
    view = view_event(make_event(C.HEARTBEAT_LOG_EVENT, body, fde=MARIA_FDE, log_pos=0), 0, MARIA_FDE)
    assert (view.log_file, view.log_pos, view.header.log_pos) == ("mariadb-bin.000002", 5 << 32, 0)
    for body, log_pos, match in (
        (b"", 10, "no binlog file name"),
        (b"x", 3, "log_pos 3"),
        (b"1234567", 0, "sub-header needs 8"),
    ):
        with pytest.raises(BinlogFormatError, match=match):
            view = view_event(make_event(C.HEARTBEAT_LOG_EVENT, body, log_pos=log_pos), 0, FDE_CRC)
            view.position, view.log_file
    body = b"\x01\x05b.001\x03\x02zz\x02\x09\xfe" + struct.pack("<Q", 1 << 40) + b"\x00"
    view = view_event(make_event(C.HEARTBEAT_LOG_EVENT_V2, body), 0, FDE_CRC)
    assert isinstance(view, HeartbeatV2View)
    assert (view.log_file, view.log_pos) == ("b.001", 1 << 40)
    with pytest.raises(BinlogFormatError, match="log file name needs 9 bytes"):
        view_event(make_event(C.HEARTBEAT_LOG_EVENT_V2, b"\x01\x09abc"), 0, FDE_CRC).log_file


def test_read_net_field_length():
    assert read_net_field_length(b"\xfa", 0, 1) == (250, 1)
    assert read_net_field_length(b"\xfc\x01\x02", 0, 3) == (0x0201, 3)
    assert read_net_field_length(b"\xfd\x01\x02\x03", 0, 4) == (0x030201, 4)
    assert read_net_field_length(b"\xfe" + bytes(range(1, 9)), 0, 9) == (0x0807060504030201, 9)
    for raw in (b"\xfb", b"\xff", b"\xfc\x01", b""):
        with pytest.raises(BinlogFormatError):
            read_net_field_length(raw, 0, len(raw))


# ---------------------------------------------------------------------------------------------
# Malformed input never escapes as anything but BinlogFormatError
# ---------------------------------------------------------------------------------------------

_TYPED = sorted(EVENT_VIEWS)


def _only_format_errors(buf, offset, fde) -> None:
    try:
        view = view_event(buf, offset, fde)
        touch_everything(view)
        view.verify_checksum()
    except (BinlogFormatError, ChecksumError):
        pass  # ChecksumError: a mangled FDE's CRC (FormatDescription.parse verifies it)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=120), offset=st.integers(0, 30), crc=st.booleans())
def test_random_bytes_raise_only_format_errors(data, offset, crc):
    _only_format_errors(data, offset, FDE_CRC if crc else FDE_NOCRC)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    type_code=st.sampled_from(_TYPED + [0, 100, 255]),
    body=st.binary(max_size=90),
    log_pos=st.sampled_from([0, 2, 4, 1000]),
    fde=st.sampled_from([FDE_CRC, FDE_NOCRC, MARIA_FDE, None]),
)
def test_random_bodies_of_every_typed_event(type_code, body, log_pos, fde):
    _only_format_errors(make_event(type_code, body, fde=fde or FDE_NOCRC, log_pos=log_pos), 0, fde)


def _mutation_sample() -> list[tuple[bytes, FormatDescription]]:
    picks = {}
    for entry in manifest():
        if entry["file"] in KNOWN_BAD:
            continue
        for data, pos, header, fde in corpus_events(entry["file"]):
            key = (header.type_code, fde.flavour, fde.checksum_alg)
            if key not in picks and header.event_size < 4096:
                picks[key] = (data[pos : pos + header.event_size], fde)
    return list(picks.values())


_SAMPLES = _mutation_sample() if (CORPUS / "manifest.json").exists() else [(b"", None)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sample=st.sampled_from(_SAMPLES),
    flips=st.lists(st.tuples(st.integers(0, 4095), st.integers(1, 255)), max_size=4),
    cut=st.integers(0, 64),
)
def test_mutated_corpus_events_raise_only_format_errors(sample, flips, cut):
    event, fde = sample
    raw = bytearray(event)
    for where, xor in flips:
        if 19 <= where < len(raw):  # keep the header: mangle the body
            raw[where] ^= xor
    if cut and len(raw) - cut >= 19:  # shorten the body, keeping event_size consistent
        del raw[len(raw) - cut :]
        struct.pack_into("<I", raw, 9, len(raw))
    _only_format_errors(bytes(raw), 0, fde)


def test_views_accept_bytes_bytearray_and_memoryview_at_any_offset():
    data, pos, header, fde = next(e for e in corpus_events(TAGGED_FILE) if e[2].type_code == C.GTID_TAGGED_LOG_EVENT)
    expected = view_event(data[pos : pos + header.event_size], 0, fde)
    for buf in (data, bytearray(data), memoryview(data), memoryview(bytearray(data))):
        view = view_event(buf, pos, fde)
        assert (view.sid, view.tag, view.gno, view.transaction_length) == (
            expected.sid, expected.tag, expected.gno, expected.transaction_length)  # fmt: skip
        assert view.raw == expected.raw and bytes(view.body) == expected.raw[19:-4]
    # A live view does not pin a bytearray: the reader that owns it can still resize it.
    owned = bytearray(data)
    view = view_event(owned, pos, fde)
    del owned[:4]
    owned += b"more"
    assert view.buf is owned
    # Read with a checksum-off stand-in FDE (as the boundary parser does), the CRC bytes are
    # simply trailing body bytes: the message size bounds the decoder.
    stand_in = FormatDescription(4, "8.3.0", 0, 19, b"", C.CHECKSUM_OFF)
    assert view_event(expected.raw, 0, stand_in).gtid == expected.gtid


def test_event_size_and_buffer_checks():
    raw = make_event(C.XID_EVENT, struct.pack("<Q", 1))
    with pytest.raises(BinlogFormatError, match="runs past the end of the buffer"):
        view_event(raw[:-1], 0, FDE_CRC)
    with pytest.raises(BinlogFormatError, match="smaller than the header \\+ trailer"):
        view_event(HEADER.pack(0, C.XID_EVENT, 1, 20, 0, 0) + b"\0" * 8, 0, FDE_CRC)
    with pytest.raises(BinlogFormatError, match="header needs 19 bytes, have 5"):
        view_event(raw, len(raw) - 5, FDE_CRC)
    with pytest.raises(BinlogFormatError, match="xid needs 8 bytes"):
        view_event(make_event(C.XID_EVENT, b"\x01\x02"), 0, FDE_CRC).xid
