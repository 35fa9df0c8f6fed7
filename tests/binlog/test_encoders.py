"""Encoders of relay-made events: checked byte for byte against real events, and round-tripped through the views."""

from __future__ import annotations

import json
import os
import struct
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog.checksum import ChecksumError, crc32_ok
from relayproxy.binlog.encoders import (
    add_checksum,
    artificial_rotate,
    binlog_checkpoint,
    encode_event,
    fde_copy,
    gtid_list,
    heartbeat_v1,
    heartbeat_v2,
    net_store_length,
    previous_gtids,
    rotate,
    strip_checksum,
)
from relayproxy.binlog.events import BinlogFormatError, EventHeader, FormatDescription
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.binlog.views import (
    BinlogCheckpointView,
    FormatDescriptionView,
    HeartbeatV2View,
    HeartbeatView,
    MariaGtidListView,
    PreviousGtidsView,
    RotateView,
    read_net_field_length,
    view_event,
)

# Same rule as conftest's corpus_dir fixture (which fails clearly when the corpus is missing).
CORPUS = Path(os.environ.get("RELAYPROXY_CORPUS") or Path(__file__).resolve().parents[3] / "shared/corpus/binlogs")


@pytest.fixture(autouse=True, scope="module")
def _corpus_present(corpus_dir):
    """Fail (never skip) with conftest's clear message when the corpus is missing."""

# Negative-test files of the corpus (see its MANIFEST.md notes) and a dev-tree oddity.
SKIP = ("binlog_truncated_event", "binlog_truncated_prev_gtid_event", "corrupt-relay-bin", "ver_5_1-wl2325_r")
MYSQL_NOCRC = FormatDescription(4, "8.0.36", 0, 19, bytes([0, 13, 0, 8]), C.CHECKSUM_OFF)
MYSQL_CRC = FormatDescription(4, "8.0.36", 0, 19, bytes([0, 13, 0, 8]), C.CHECKSUM_CRC32)
MARIA_CRC = FormatDescription(4, "10.11.6-MariaDB-log", 0, 19, bytes(163), C.CHECKSUM_CRC32)


@lru_cache(maxsize=None)
def corpus_events() -> tuple:
    """(file, event bytes, header, fde in force) for every event of the readable corpus files."""
    out = []
    for entry in json.loads((CORPUS / "manifest.json").read_text()):
        if any(bad in entry["file"] for bad in SKIP):
            continue
        data = (CORPUS / entry["file"]).read_bytes()
        pos, fde = 4, None
        while pos + 19 <= len(data):
            header = EventHeader.unpack(data, pos)
            if header.event_size < 19 or pos + header.event_size > len(data):
                break
            if header.type_code == C.FORMAT_DESCRIPTION_EVENT:
                fde = FormatDescription.parse(data, pos)
            out.append((entry["file"], data[pos : pos + header.event_size], header, fde))
            pos += header.event_size
    return tuple(out)


def real(type_code: int) -> list[tuple[str, bytes, EventHeader, FormatDescription]]:
    return [e for e in corpus_events() if e[2].type_code == type_code]


# ---------------------------------------------------------------------------------------------
# ROTATE
# ---------------------------------------------------------------------------------------------


def test_rotate_rebuilds_every_real_rotate_byte_for_byte():
    rotates = real(C.ROTATE_EVENT)
    assert len(rotates) > 40
    for rel, raw, header, fde in rotates:
        view = view_event(raw, 0, fde)
        built = rotate(
            view.next_file,
            view.position,
            server_id=header.server_id,
            checksum=fde.checksum_len == 4,
            timestamp=header.timestamp,
            log_pos=header.log_pos,
            flags=header.flags,
        )
        assert built == raw, rel


def test_artificial_rotate_fields():
    for checksum in (True, False):
        raw = artificial_rotate("binlog.000042", 4, 77, checksum)
        view = view_event(raw, 0, MYSQL_CRC if checksum else MYSQL_NOCRC)
        assert isinstance(view, RotateView)
        assert (view.timestamp, view.log_pos, view.flags, view.server_id) == (0, 0, C.LOG_EVENT_ARTIFICIAL_F, 77)
        assert (view.next_file, view.position, view.is_artificial) == ("binlog.000042", 4, True)
        assert view.event_size == len(raw) == 19 + 8 + 13 + (4 if checksum else 0)
        view.verify_checksum()
    # The dump thread sends the basename; a directory is stripped as the servers do.
    stripped = artificial_rotate("/var/lib/mysql/binlog.000042", 4, 77, True)
    assert stripped == artificial_rotate("binlog.000042", 4, 77, True)
    for bad in ("", "dir/", "a\0b", "x" * 512):
        with pytest.raises(ValueError):
            artificial_rotate(bad, 4, 1, True)
    with pytest.raises(ValueError, match="server_id"):
        artificial_rotate("b.1", 4, 1 << 32, True)


@settings(max_examples=100, deadline=None)
@given(
    name=st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=60),
    position=st.integers(0, (1 << 64) - 1),
    server_id=st.integers(0, (1 << 32) - 1),
    checksum=st.booleans(),
)
def test_artificial_rotate_round_trips(name, position, server_id, checksum):
    view = view_event(artificial_rotate(name, position, server_id, checksum), 0, MYSQL_CRC if checksum else MYSQL_NOCRC)
    assert (view.next_file, view.position, view.server_id) == (name, position, server_id)
    view.verify_checksum()


# ---------------------------------------------------------------------------------------------
# FORMAT_DESCRIPTION copies
# ---------------------------------------------------------------------------------------------


def test_fde_copy_of_every_real_fde():
    fdes = real(C.FORMAT_DESCRIPTION_EVENT)
    assert len(fdes) > 90
    for rel, raw, header, fde in fdes:
        # Nothing changed: byte-identical, CRC included (the server signs with in-use cleared).
        assert fde_copy(raw, clear_in_use=False) == raw, rel
        sent = fde_copy(raw, log_pos=0, created=0)
        view = view_event(sent, 0, None)
        assert isinstance(view, FormatDescriptionView)
        assert (view.flags & C.LOG_EVENT_BINLOG_IN_USE_F, view.log_pos, view.create_timestamp) == (0, 0, 0)
        assert view.format.post_header_lens == fde.post_header_lens
        assert view.server_version == fde.server_version and len(sent) == len(raw)
        view.verify_checksum()
        tail = None if fde.checksum_alg == C.CHECKSUM_UNDEF else -4  # post-header lengths (+ alg byte)
        assert sent[19 + 57 : tail] == raw[19 + 57 : tail]
        if fde.checksum_alg == C.CHECKSUM_UNDEF:  # no alg byte, no CRC: nothing to sign
            with pytest.raises(ValueError, match="predates binlog checksums"):
                fde_copy(raw, checksum_alg=C.CHECKSUM_OFF)
        else:  # OFF files too: a checksum-aware server always signs its FDE
            assert crc32_ok(sent, 0, len(sent))


def test_fde_copy_changes_the_checksum_alg_and_keeps_the_crc():
    (_, raw, header, fde) = next(
        e for e in real(C.FORMAT_DESCRIPTION_EVENT) if e[3].checksum_alg == C.CHECKSUM_CRC32 and e[2].flags & 1
    )
    off = fde_copy(raw, checksum_alg=C.CHECKSUM_OFF)
    parsed = FormatDescription.parse(off, 0)
    assert parsed.checksum_alg == C.CHECKSUM_OFF and parsed.checksum_len == 0
    assert len(off) == len(raw)  # the FDE keeps its 4 CRC bytes even with checksums off
    assert crc32_ok(off, 0, len(off))
    back = fde_copy(off, checksum_alg=C.CHECKSUM_CRC32, clear_in_use=False)
    assert back == fde_copy(raw)  # the in-use flag was cleared in the first copy
    # Keeping the in-use flag: still verifies, because the CRC is computed with it masked out.
    kept = fde_copy(raw, clear_in_use=False, log_pos=0)
    assert EventHeader.unpack(kept).flags & 1 and not crc32_ok(kept, 0, len(kept))
    view_event(kept, 0, None).verify_checksum()
    with pytest.raises(ValueError, match="checksum_alg must be"):
        fde_copy(raw, checksum_alg=2)


def test_fde_copy_refuses_a_corrupt_or_foreign_input():
    (_, raw, _, _) = next(e for e in real(C.FORMAT_DESCRIPTION_EVENT) if e[3].checksum_alg == C.CHECKSUM_CRC32)
    bad = bytearray(raw)
    bad[90] ^= 1
    with pytest.raises(ChecksumError):
        fde_copy(bytes(bad))
    with pytest.raises(BinlogFormatError, match="exactly one event"):
        fde_copy(raw + b"\0")
    with pytest.raises(BinlogFormatError, match="expected FORMAT_DESCRIPTION_EVENT"):
        fde_copy(real(C.ROTATE_EVENT)[0][1])


# ---------------------------------------------------------------------------------------------
# Heartbeats
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("checksum", [True, False])
def test_heartbeat_v1(checksum):
    fde = MYSQL_CRC if checksum else MYSQL_NOCRC
    raw = heartbeat_v1("binlog.000007", 123456, 5, checksum)
    header = EventHeader.unpack(raw)
    assert (header.timestamp, header.type_code, header.log_pos, header.flags) == (0, C.HEARTBEAT_LOG_EVENT, 123456, 0)
    view = view_event(raw, 0, fde)
    assert isinstance(view, HeartbeatView)
    assert (view.log_file, view.log_pos, view.server_id) == ("binlog.000007", 123456, 5)
    view.verify_checksum()
    # MariaDB past 4 GB: log_pos 0 in the header, the position in an 8-byte sub-header.
    big = (1 << 32) + 99
    raw = heartbeat_v1("mariadb-bin.000002", big, 5, checksum, mariadb=True)
    view = view_event(raw, 0, fde)
    assert (view.header.log_pos, view.log_pos, view.log_file, view.event_size) == (
        0, big, "mariadb-bin.000002", 19 + 8 + 18 + (4 if checksum else 0))  # fmt: skip
    view.verify_checksum()
    with pytest.raises(ValueError, match="use heartbeat_v2"):
        heartbeat_v1("binlog.000007", big, 5, checksum)
    # Below 4 GB MariaDB and MySQL heartbeats are the same bytes.
    assert heartbeat_v1("b.1", 4, 1, checksum, mariadb=True) == heartbeat_v1("b.1", 4, 1, checksum)


@settings(max_examples=100, deadline=None)
@given(position=st.one_of(st.sampled_from([4, 250, 251, 0xFFFF, 0x10000, 0xFFFFFF, 1 << 24, (1 << 32) - 1, 1 << 32]),
                          st.integers(4, (1 << 64) - 1)),
       checksum=st.booleans())  # fmt: skip
def test_heartbeat_v2_round_trips(position, checksum):
    raw = heartbeat_v2("binlog.000123", position, 9, checksum)
    view = view_event(raw, 0, MYSQL_CRC if checksum else MYSQL_NOCRC)
    assert isinstance(view, HeartbeatV2View)
    assert (view.log_file, view.log_pos) == ("binlog.000123", position)
    assert (view.header.log_pos, view.timestamp, view.header.flags) == (position & 0xFFFFFFFF, 0, 0)
    assert view.event_size == len(raw)
    view.verify_checksum()


def test_heartbeat_v2_layout():
    # type 1, len 5, "b.001"; type 2, len 1, 200; end mark.
    raw = heartbeat_v2("b.001", 200, 1, False)
    assert raw[19:] == b"\x01\x05b.001\x02\x01\xc8\x00"


# ---------------------------------------------------------------------------------------------
# GTID preambles
# ---------------------------------------------------------------------------------------------


def test_previous_gtids_rebuilds_every_real_one():
    events = real(C.PREVIOUS_GTIDS_LOG_EVENT)
    assert len(events) > 50
    for rel, raw, header, fde in events:
        view = view_event(raw, 0, fde)
        assert isinstance(view, PreviousGtidsView)
        built = previous_gtids(
            view.gtid_set,
            header.server_id,
            header.log_pos,
            fde.checksum_len == 4,
            tagged=view.is_tagged_format,
            timestamp=header.timestamp,
            flags=header.flags,
        )
        assert built == raw, rel


def test_previous_gtids_formats():
    gtids = GtidSet("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7,3e11fa47-71ca-11e1-9e33-c80aa9429562:tag_a:1-2")
    raw = previous_gtids(gtids, 1, 200, True)
    view = view_event(raw, 0, MYSQL_CRC)
    assert view.is_tagged_format and view.gtid_set == gtids and view.header.flags == C.LOG_EVENT_IGNORABLE_F
    view.verify_checksum()
    with pytest.raises(ValueError):
        previous_gtids(gtids, 1, 200, True, tagged=False)
    untagged = GtidSet("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5")
    view = view_event(previous_gtids(untagged, 1, 200, False), 0, MYSQL_NOCRC)
    assert not view.is_tagged_format and view.gtid_set == untagged
    assert view_event(previous_gtids(GtidSet(), 1, 0, False), 0, MYSQL_NOCRC).body_len == 8


def test_gtid_list_and_checkpoint_rebuild_real_mariadb_events():
    lists = real(C.MARIA_GTID_LIST_EVENT)
    checkpoints = real(C.MARIA_BINLOG_CHECKPOINT_EVENT)
    assert len(lists) >= 13 and len(checkpoints) >= 17
    for rel, raw, header, fde in lists:
        view = view_event(raw, 0, fde)
        assert isinstance(view, MariaGtidListView)
        args = (header.server_id, header.log_pos, fde.checksum_len == 4, view.flags)
        kwargs = {"timestamp": header.timestamp, "header_flags": header.flags}
        assert gtid_list(view.gtids, *args, **kwargs) == raw, rel
        assert gtid_list(view.state, *args, **kwargs) == raw, rel  # one GTID per domain in the corpus
    for rel, raw, header, fde in checkpoints:
        view = view_event(raw, 0, fde)
        assert isinstance(view, BinlogCheckpointView)
        args = (view.file_name, header.server_id, header.log_pos, fde.checksum_len == 4)
        built = binlog_checkpoint(*args, timestamp=header.timestamp, flags=header.flags)
        assert built == raw, rel


def test_gtid_list_round_trip_and_flags():
    state = MariaBinlogState([MariaGtid(0, 1, 10), MariaGtid(0, 2, 12), MariaGtid(5, 1, 3), MariaGtid(0, 1, 11)])
    raw = gtid_list(state, 1, 300, True, flags=C.GTID_LIST_FLAG_IGN_GTIDS, header_flags=C.LOG_EVENT_ARTIFICIAL_F)
    view = view_event(raw, 0, MARIA_CRC)
    assert view.flags == C.GTID_LIST_FLAG_IGN_GTIDS and view.header.flags == C.LOG_EVENT_ARTIFICIAL_F
    assert view.state == state and list(view.gtids) == state.gtids()
    view.verify_checksum()
    raw = gtid_list([(1, 2, 3), MariaGtid(4, 5, 6)], 1, 300, False)
    assert view_event(raw, 0, None).gtids == (MariaGtid(1, 2, 3), MariaGtid(4, 5, 6))
    assert view_event(gtid_list([], 1, 300, False), 0, None).body_len == 6  # 2 bytes of padding, as MariaDB
    with pytest.raises(ValueError, match="overlap the count"):
        gtid_list([], 1, 300, False, flags=5)
    with pytest.raises(ValueError, match="seq_no"):
        gtid_list([(1, 2, -3)], 1, 300, False)


# ---------------------------------------------------------------------------------------------
# Checksum trailer
# ---------------------------------------------------------------------------------------------


def test_strip_and_add_checksum_on_real_events():
    sample = [e for e in corpus_events() if e[3].checksum_len == 4 and e[2].type_code != C.FORMAT_DESCRIPTION_EVENT]
    assert len(sample) > 5000
    for rel, raw, header, fde in sample[::7]:
        stripped = strip_checksum(raw)
        h = EventHeader.unpack(stripped)
        assert h.event_size == header.event_size - 4
        assert (h.log_pos, h.flags, h.timestamp) == (header.log_pos, header.flags, header.timestamp)
        assert stripped[19:] == raw[19:-4]
        assert add_checksum(stripped) == raw, rel
    rel, raw, header, fde = sample[0]
    bad = raw[:-1] + bytes([raw[-1] ^ 1])
    with pytest.raises(ChecksumError):
        strip_checksum(bad)
    assert len(strip_checksum(bad, verify=False)) == len(raw) - 4
    with pytest.raises(ValueError, match="fde_copy"):
        strip_checksum(real(C.FORMAT_DESCRIPTION_EVENT)[0][1])
    with pytest.raises(BinlogFormatError, match="exactly one event"):
        add_checksum(raw + raw)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


@given(st.integers(0, (1 << 64) - 1))
def test_net_store_length_round_trips(value):
    packed = net_store_length(value)
    assert read_net_field_length(packed, 0, len(packed)) == (value, len(packed))
    assert len(packed) == (1 if value < 251 else 3 if value < 1 << 16 else 4 if value < 1 << 24 else 9)


def test_encode_event_validates_header_fields():
    raw = encode_event(C.XID_EVENT, struct.pack("<Q", 5), server_id=1, log_pos=99, checksum=True, timestamp=7, flags=0)
    assert view_event(raw, 0, MYSQL_CRC).xid == 5 and crc32_ok(raw, 0, len(raw))
    for field, value in (("log_pos", 1 << 32), ("timestamp", -1), ("flags", 1 << 16)):
        with pytest.raises(ValueError, match=field):
            encode_event(C.XID_EVENT, b"", server_id=1, checksum=False, **{"log_pos": 0, field: value})
