"""Relay store: byte-identical files at master offsets, durable horizon, re-sends, recovery after crashes."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import zlib
from pathlib import Path

import pytest

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.binlog.reader import scan_bytes, scan_file
from relayproxy.relay import (
    Horizon,
    HorizonSnapshot,
    RelayEventError,
    RelayGapError,
    RelayMismatchError,
    RelayRecoveryError,
    RelayStateError,
    RelayStore,
    RelayStoreFailed,
    SyncPolicy,
)
from relayproxy.relay import durable as DU
from relayproxy.relay import layout as LA
from relayproxy.relay import store as S

from ..support import eventgen as E

REPO_ROOT = Path(__file__).resolve().parents[2]
OTHER_SID = bytes(range(100, 116))
MARIA = "10.11.6-MariaDB-log"
NO_AUTO_SYNC = SyncPolicy("batch", max_transactions=1 << 30, max_delay=1e9)


# ---------------------------------------------------------------------------------------------
# Streams


def mysql_image(name_next: str = "binlog.000002", *, rotate: bool = True, groups: int = 4, start=None) -> bytes:
    """A MySQL file image; ``start`` is its PREVIOUS_GTIDS (default OTHER_SID:1-5). A file that follows
    another must start with the set the first one ends with, as a real master writes it."""
    if start is None:
        start = GtidSet()
        start.add_interval(OTHER_SID, 1, 6)
    events = [E.event(C.PREVIOUS_GTIDS_LOG_EVENT, start.encode())]
    gno = 1
    for i in range(groups):
        if i % 3 == 2:
            events += [E.gtid(0, anonymous=True), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(i)]
        elif i % 3 == 1:
            events += [E.gtid(gno), E.query("CREATE TABLE t%d (a int)" % i)]
            gno += 1
        else:
            events += [E.gtid(gno), E.query("BEGIN"), E.table_map(), E.write_rows(), E.write_rows(), E.xid(i)]
            gno += 1
    if rotate:
        events.append(E.rotate(name_next))
    return E.binlog_file(*events)


def maria_image(name_next: str = "mariadb-bin.000002", *, rotate: bool = True) -> bytes:
    start = MariaBinlogState([MariaGtid(0, 1, 5), MariaGtid(1, 2, 9)])
    events = [E.event(C.MARIA_GTID_LIST_EVENT, start.encode_gtid_list_body())]
    events += [E.maria_gtid(6, 0, 0), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(1)]
    events += [E.maria_gtid(10, 1, C.FL_STANDALONE, server_id=2), E.query("CREATE TABLE t (a int)")]
    events += [
        E.maria_gtid(7, 0, 0, server_id=3), E.query("BEGIN"), E.query("INSERT INTO t VALUES (1)"), E.query("COMMIT")
    ]
    events += [E.maria_gtid(8, 0, 0), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(2)]
    if rotate:
        events.append(E.rotate(name_next))
    return E.binlog_file(*events, server_version=MARIA)


def split_events(image: bytes, start: int = 4) -> list[tuple[int, bytes]]:
    out = []
    pos = start
    while pos < len(image):
        size = struct.unpack_from("<I", image, pos + 9)[0]
        out.append((pos, image[pos : pos + size]))
        pos += size
    return out


class Feeder:
    """What the upstream session does per event: boundary parser, store calls, a sync when one is due."""

    def __init__(self, store: RelayStore, *, sync_each_event: bool = True):
        self.store = store
        self.parser = B.TransactionBoundaryParser()
        self.sync_each_event = sync_each_event
        self.boundaries: list[tuple[int, object, bool]] = []  # (end, gtid, is_group)

    def feed(self, offset: int, event: bytes) -> str:
        outcome = self.store.write_event(offset, event)
        kind = self.parser.feed_event(event, 0) & B.RESULT_MASK
        end = offset + len(event)
        if kind == B.GROUP_END:
            self.store.group_complete(end, self.parser.gtid)
            self.boundaries.append((end, self.parser.gtid, True))
        elif kind == B.EVENT_OUTSIDE:
            self.store.boundary_outside(end)
            self.boundaries.append((end, None, False))
        if self.sync_each_event:
            if self.store.sync_due():
                self.store.sync()
        return outcome

    def feed_all(self, image: bytes, start: int = 4) -> list[str]:
        return [self.feed(offset, ev) for offset, ev in split_events(image, start)]


def expected_after(image: bytes, cut: int):
    """(good_end, gtid set) of the complete prefix of ``image`` up to ``cut``, without the scanner."""
    parser = B.TransactionBoundaryParser()
    good_end, gtids, start_seen = 4, None, False
    for offset, ev in split_events(image):
        end = offset + len(ev)
        if end > cut:
            break
        type_code = ev[4]
        if type_code == C.PREVIOUS_GTIDS_LOG_EVENT and not start_seen:
            gtids, start_seen = GtidSet.decode(ev, 19, len(ev) - 23), True
        elif type_code == C.MARIA_GTID_LIST_EVENT and not start_seen:
            gtids, start_seen = MariaBinlogState.decode_gtid_list_body(ev, 19, len(ev) - 23)[0], True
        kind = parser.feed_event(ev, 0) & B.RESULT_MASK
        if kind == B.GROUP_END:
            gtid = parser.gtid
            if gtid is not None:
                gtids = S._add_gtid(gtids, gtid)
            good_end = end
        elif kind == B.EVENT_OUTSIDE:
            good_end = end
    return good_end, gtids


def fresh_store(tmp_path: Path, name: str = "binlog.000001", **kw) -> RelayStore:
    store = RelayStore.open(tmp_path / "relay", **kw)
    store.start_file(name)
    return store


def relay_dir_with(tmp_path: Path, files: dict[str, bytes], *, index: list[str] | None = None) -> Path:
    d = tmp_path / "relay"
    d.mkdir(exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    names = list(files) if index is None else index
    (d / LA.INDEX_NAME).write_text("".join(f"{n}\n" for n in names))
    return d


# ---------------------------------------------------------------------------------------------
# Writing


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
@pytest.mark.parametrize(
    "policy",
    [SyncPolicy(), SyncPolicy("batch", max_transactions=2, max_delay=60), NO_AUTO_SYNC],
    ids=["transaction", "batch", "manual"],
)
def test_stream_written_event_by_event_is_byte_identical(tmp_path, flavour, policy):
    image = mysql_image() if flavour == "mysql" else maria_image()
    store = fresh_store(tmp_path, sync=policy)
    outcomes = Feeder(store).feed_all(image)
    assert set(outcomes) == {"appended"}
    assert store.current_end == len(image)
    store.sync()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image
    snap = store.horizon.snapshot()
    assert (snap.file, snap.position) == ("binlog.000001", len(image))
    assert snap.gtids == scan_bytes(image).gtids_after
    assert store.flavour == flavour
    assert store.files() == ["binlog.000001"]
    assert (tmp_path / "relay" / LA.INDEX_NAME).read_text() == "binlog.000001\n"
    store.close()


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
def test_horizon_moves_only_after_sync_and_only_to_group_ends(tmp_path, flavour):
    image = mysql_image() if flavour == "mysql" else maria_image()
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    feeder = Feeder(store, sync_each_event=False)
    last = store.horizon.snapshot()
    for offset, ev in split_events(image):
        feeder.feed(offset, ev)
        assert store.horizon.snapshot() == last  # nothing moves before a sync
        moved = store.sync()
        snap = store.horizon.snapshot()
        boundary_ends = [end for end, _, _ in feeder.boundaries]
        assert moved == (snap != last)
        assert snap.position == max([4, *boundary_ends])  # the last boundary, never mid-group
        assert snap.position in [4, *boundary_ends]
        good_end, gtids = expected_after(image, offset + len(ev))
        assert snap.position == good_end
        assert snap.gtids == gtids
        last = snap
    store.close()


def test_fsync_happens_before_the_horizon_moves(tmp_path, monkeypatch):
    """Crash-safe order: pwrite -> fdatasync -> durable mark -> horizon.advance."""
    log: list[tuple[str, int]] = []
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync
    store = fresh_store(tmp_path, sync=SyncPolicy())
    relay_fd = store._w.fd

    def pwrite(fd, data, offset):
        n = real_pwrite(fd, data, offset)
        if fd == relay_fd:
            log.append(("write", offset + n))
        return n

    def fdatasync(fd):
        real_fdatasync(fd)
        if fd == relay_fd:
            log.append(("fsync", os.fstat(fd).st_size))

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    real_advance = store.horizon.advance

    def advance(file, position, gtids, **kw):
        log.append(("advance", position))
        return real_advance(file, position, gtids, **kw)

    store.horizon.advance = advance
    Feeder(store).feed_all(mysql_image())
    store.close()
    durable = 4  # file size covered by the last fdatasync
    written = 4
    advances = 0
    for what, value in log:
        if what == "write":
            written = max(written, value)
        elif what == "fsync":
            durable = value
            assert durable == written  # everything written so far is covered
        else:
            assert value <= durable, log  # never publish bytes an fsync has not covered
            advances += 1
    assert advances >= 5


def test_transaction_mode_groups_arriving_together_share_one_fsync(tmp_path):
    store = fresh_store(tmp_path)
    feeder = Feeder(store, sync_each_event=False)
    before = store.fsyncs
    feeder.feed_all(mysql_image(groups=6))  # one "network batch"
    assert store.sync_due()
    assert (store.sync_due() and store.sync()) is True
    assert store.fsyncs == before + 1
    assert store.horizon.snapshot().position == store.current_end
    assert (store.sync_due() and store.sync()) is False  # nothing pending
    assert store.fsyncs == before + 1
    store.close()


def test_batch_mode_defers_until_count_or_delay(tmp_path):
    store = fresh_store(tmp_path, sync=SyncPolicy("batch", max_transactions=3, max_delay=60))
    image = mysql_image(rotate=False, groups=6)
    feeder = Feeder(store, sync_each_event=False)
    fsyncs_before = store.fsyncs
    events = split_events(image)
    header = [ev for ev in events if ev[1][4] in (C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT)]
    for offset, ev in header:
        feeder.feed(offset, ev)
    now = time.monotonic()
    assert store.sync_deadline is not None and store.sync_deadline <= now + 60
    assert (store.sync_due(now) and store.sync()) is False  # boundaries pending, neither limit reached
    assert (store.sync_due(store.sync_deadline + 0.001) and store.sync()) is True  # max_delay passed
    groups_seen = 0
    for offset, ev in events[len(header) :]:
        feeder.feed(offset, ev)
        groups = sum(1 for _, _, is_group in feeder.boundaries if is_group)
        if groups != groups_seen:
            groups_seen = groups
            moved = (store.sync_due(time.monotonic()) and store.sync())
            assert moved == (groups_seen % 3 == 0), groups_seen
    assert groups_seen == 6
    assert store.horizon.snapshot().position == len(image)
    assert store.fsyncs - fsyncs_before == 3  # the header, then one per 3 groups
    store.close()


def test_large_events_and_buffer_flushes_keep_bytes_identical(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "FLUSH_BYTES", 300)
    monkeypatch.setattr(S, "DIRECT_BYTES", 150)
    big = E.event(C.WRITE_ROWS_EVENT, bytes(10) + os.urandom(5000))
    image = E.binlog_file(
        E.previous_gtids(), E.gtid(1), E.query("BEGIN"), E.table_map(), big, E.write_rows(), big, E.xid(),
        E.gtid(2), E.query("DROP TABLE t"),
    )
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    Feeder(store, sync_each_event=False).feed_all(image)
    assert store.synced_end == 4  # written to the page cache, not yet fsynced
    store.sync()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image
    store.close()


# ---------------------------------------------------------------------------------------------
# Re-sends, gaps, mismatches, discard


@pytest.mark.parametrize("flush", [False, True], ids=["buffered", "on-disk"])
def test_resend_after_reconnect_is_verified_and_skipped(tmp_path, monkeypatch, flush):
    if flush:
        monkeypatch.setattr(S, "FLUSH_BYTES", 64)
    image = maria_image()
    events = split_events(image)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:6]:
        feeder.feed(offset, ev)
    store.sync()
    horizon = store.horizon.snapshot()
    for offset, ev in events[6:12]:  # a group and a half more, not synced
        feeder.feed(offset, ev)
    mid_group = store.current_end
    # disconnect: the partial group goes, the complete one stays
    dropped = store.discard_incomplete()
    assert dropped == mid_group - store.boundary_end > 0
    # reconnect from the durable horizon: the master re-sends everything after it
    feeder.parser.reset()
    outcomes = [feeder.feed(offset, ev) for offset, ev in events if offset >= horizon.position]
    assert "duplicate" in outcomes and outcomes[-1] == "appended"
    assert outcomes.index("appended") > 0
    store.sync()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image
    # every GTID counted once, in order: the MariaDB binlog state equals a straight scan's
    assert store.horizon.snapshot().gtids == scan_bytes(image).gtids_after
    store.close()


def test_gap_raises(tmp_path):
    image = mysql_image()
    events = split_events(image)
    store = fresh_store(tmp_path)
    store.write_event(*events[0])
    with pytest.raises(RelayGapError) as info:
        store.write_event(*events[2])
    assert (info.value.offset, info.value.current_end) == (events[2][0], events[1][0])
    assert "binlog.000001" in str(info.value)
    store.close()


def test_mismatch_raises_and_stored_bytes_stay(tmp_path):
    image = mysql_image()
    events = split_events(image)
    store = fresh_store(tmp_path)
    feeder = Feeder(store)
    for offset, ev in events[:5]:
        feeder.feed(offset, ev)
    offset, ev = events[3]
    changed = bytearray(ev)
    changed[25] ^= 0xFF
    with pytest.raises(RelayMismatchError, match=r"first difference at byte 25"):
        store.write_event(offset, bytes(changed))
    # an event that straddles the stored end cannot be a re-send either
    straddle = E.event(C.WRITE_ROWS_EVENT, bytes(10) + bytes(400))
    straddle = bytearray(straddle)
    struct.pack_into("<I", straddle, 13, events[4][0] + len(straddle))
    with pytest.raises(RelayMismatchError, match="past the end"):
        store.write_event(events[4][0], bytes(straddle))
    store.sync()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image[: events[5][0]]
    store.close()


def _with_crc(event: bytes | bytearray) -> bytes:
    body = bytes(event[:-4])
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
def test_fde_resend_may_differ_only_where_masters_change_it(tmp_path, flavour):
    """A master clears the in-use flag and, when a dump does not start at the file's first event
    (a GTID dump), zeroes create_timestamp and recomputes the CRC; nothing else may differ."""
    image = mysql_image() if flavour == "mysql" else maria_image()
    store = fresh_store(tmp_path)
    fde = bytearray(split_events(image)[0][1])
    struct.pack_into("<I", fde, 19 + 52, 1700000000)  # the file's FDE was written at server start
    fde = bytearray(_with_crc(fde))
    prefix = image[:4] + bytes(fde) + image[4 + len(fde) : split_events(image)[2][0]]
    Feeder(store).feed_all(prefix)
    store.sync()
    in_use = bytearray(fde)
    in_use[17] |= C.LOG_EVENT_BINLOG_IN_USE_F  # flipped in place: the CRC stays the flag-clear one
    assert store.write_event(4, bytes(in_use)) == "duplicate"
    zero_created = bytearray(fde)
    struct.pack_into("<I", zero_created, 19 + 52, 0)
    assert store.write_event(4, _with_crc(zero_created)) == "duplicate"
    with pytest.raises(RelayEventError, match="CRC"):
        store.write_event(4, bytes(zero_created))  # zeroed but the CRC not recomputed
    other_created = bytearray(fde)
    struct.pack_into("<I", other_created, 19 + 52, 1700000001)
    with pytest.raises(RelayMismatchError, match="byte 71"):
        store.write_event(4, _with_crc(other_created))
    other_flag = bytearray(fde)
    other_flag[18] ^= 0x01  # another flag bit is a real difference
    with pytest.raises(RelayMismatchError):
        store.write_event(4, _with_crc(other_flag))
    store.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes()[4 : 4 + len(fde)] == bytes(fde)


def test_events_that_do_not_sit_at_their_master_offset_are_refused(tmp_path):
    image = mysql_image()
    events = split_events(image)
    store = fresh_store(tmp_path)
    with pytest.raises(RelayEventError, match="starts with its FORMAT_DESCRIPTION"):
        store.write_event(4, E.xid(log_pos=4 + len(E.xid())))
    store.write_event(*events[0])
    offset, ev = events[1]
    wrong = bytearray(ev)
    struct.pack_into("<I", wrong, 13, offset + len(ev) + 1)
    with pytest.raises(RelayEventError, match=rf"log_pos {offset + len(ev) + 1}, expected {offset + len(ev)}"):
        store.write_event(offset, bytes(wrong))
    with pytest.raises(RelayEventError, match="header says"):
        store.write_event(offset, ev + b"x")
    fake_rotate = E.rotate("binlog.000001", flags=C.LOG_EVENT_ARTIFICIAL_F)  # log_pos 0, artificial
    with pytest.raises(RelayEventError, match="artificial"):
        store.write_event(offset, fake_rotate)
    mid_file_fde = E.fde()  # log_pos 0: the FDE a dump starting mid-file begins with
    with pytest.raises(RelayEventError, match="offset 4"):
        store.write_event(offset, mid_file_fde)
    assert store.current_end == offset
    # log_pos 0 inside a group is what MariaDB 11.4+ writes (binlog_legacy_event_pos=OFF): accepted
    assert store.write_event(offset, E.query("BEGIN")) == "appended"
    store.close()


@pytest.mark.parametrize("flush", [False, True], ids=["buffered", "on-disk"])
def test_discard_incomplete_cuts_back_to_the_boundary(tmp_path, monkeypatch, flush):
    if flush:
        monkeypatch.setattr(S, "FLUSH_BYTES", 32)
    image = mysql_image(rotate=False)
    events = split_events(image)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:5]:  # FDE, PREVIOUS_GTIDS, GTID, BEGIN, TABLE_MAP
        feeder.feed(offset, ev)
    boundary = store.boundary_end
    assert boundary == events[2][0]
    assert store.discard_incomplete() == events[5][0] - boundary
    assert store.current_end == boundary
    assert store.discard_incomplete() == 0
    store.sync()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image[:boundary]
    # the group comes again, whole
    feeder.parser.reset()
    for offset, ev in events[2:]:
        feeder.feed(offset, ev)
    store.sync()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image
    store.close()


# ---------------------------------------------------------------------------------------------
# Files, rotation, index


def test_rotation_keeps_master_names_and_coordinates(tmp_path):
    first = mysql_image("binlog.000002")
    second = mysql_image("binlog.000003", rotate=False, groups=2, start=scan_bytes(first).gtids_after)
    store = fresh_store(tmp_path)
    feeder = Feeder(store)
    feeder.feed_all(first)
    assert store.horizon.snapshot().coordinates == ("binlog.000001", len(first))
    set_after_first = store.horizon.snapshot().gtids
    store.start_file("binlog.000002")
    snap = store.horizon.snapshot()
    assert snap.coordinates == ("binlog.000002", 4)
    assert snap.gtids == set_after_first  # carried until the new file's PREVIOUS_GTIDS
    feeder.parser = B.TransactionBoundaryParser()
    feeder.feed_all(second)
    store.close()
    d = tmp_path / "relay"
    assert (d / "binlog.000001").read_bytes() == first
    assert (d / "binlog.000002").read_bytes() == second
    assert (d / LA.INDEX_NAME).read_text() == "binlog.000001\nbinlog.000002\n"
    reopened = RelayStore.open(d)
    assert reopened.recovery.warnings == []
    assert reopened.horizon.snapshot().coordinates == ("binlog.000002", len(second))
    assert reopened.horizon.snapshot().gtids == scan_bytes(second).gtids_after
    reopened.close()


def test_rotation_adopts_previous_gtids_naming_purged_gtids_but_refuses_one_that_goes_back(tmp_path):
    """MySQL's 5.6.22 case: after SET GLOBAL gtid_purged the next file's PREVIOUS_GTIDS names GTIDs no file holds.
    The relay mirrors that file (its set grows; FileCatalog.purged counts them); a set lacking GTIDs the relay
    holds is another history and is still refused."""
    first = mysql_image("binlog.000002")
    after = scan_bytes(first).gtids_after
    restored = after.copy()
    restored.add_interval(OTHER_SID, 100, 111)
    second = mysql_image("binlog.000003", rotate=False, groups=2, start=restored)
    store = fresh_store(tmp_path)
    feeder = Feeder(store)
    feeder.feed_all(first)
    store.start_file("binlog.000002")
    feeder.parser = B.TransactionBoundaryParser()
    feeder.feed_all(second)
    assert store.horizon.snapshot().gtids == scan_bytes(second).gtids_after
    store.close()
    assert (tmp_path / "relay" / "binlog.000002").read_bytes() == second
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().gtids == scan_bytes(second).gtids_after
    reopened.close()

    behind = GtidSet()
    behind.add_interval(OTHER_SID, 1, 3)  # lacks OTHER_SID:3-5 and the first file's own GTIDs
    store = fresh_store(tmp_path / "other")
    feeder = Feeder(store)
    feeder.feed_all(first)
    store.start_file("binlog.000002")
    feeder.parser = B.TransactionBoundaryParser()
    with pytest.raises(RelayMismatchError, match="does not continue the relay's set"):
        feeder.feed_all(mysql_image("binlog.000003", rotate=False, groups=2, start=behind))
    assert store.horizon.snapshot().gtids == after
    store.close()


def test_start_file_rules(tmp_path):
    store = fresh_store(tmp_path)
    store.start_file("binlog.000001")  # still only the magic: a no-op
    with pytest.raises(RelayStateError, match="not a plain file name"):
        store.start_file("../etc/passwd")
    for reserved in (LA.INDEX_NAME, "relayproxy.uuid"):
        with pytest.raises(RelayStateError, match="reserved"):
            store.start_file(reserved)
    image = mysql_image()
    events = split_events(image)
    feeder = Feeder(store)
    for offset, ev in events[:4]:  # inside the first group
        feeder.feed(offset, ev)
    with pytest.raises(RelayStateError, match="discard_incomplete"):
        store.start_file("binlog.000002")
    with pytest.raises(RelayStateError, match="already the current"):
        store.start_file("binlog.000001")
    store.discard_incomplete()
    (tmp_path / "relay" / "binlog.000002").write_bytes(b"\xfebin" + b"something else")
    with pytest.raises(RelayStateError, match="other content"):
        store.start_file("binlog.000002")
    (tmp_path / "relay" / "binlog.000002").write_bytes(b"\xfeb")  # a crashed start_file: reused
    store.start_file("binlog.000002")
    assert store.files() == ["binlog.000001", "binlog.000002"]
    with pytest.raises(RelayStateError, match="older one"):
        store.start_file("binlog.000001")
    store.close()
    with pytest.raises(RelayStateError, match="closed"):
        store.sync()


def test_write_before_start_file_is_an_error(tmp_path):
    store = RelayStore.open(tmp_path / "relay")
    assert store.recovery.started_empty
    assert store.horizon.snapshot() == HorizonSnapshot(None, 0, None, 0)
    with pytest.raises(RelayStateError, match="start_file"):
        store.write_event(4, split_events(mysql_image())[0][1])
    store.close()
    with pytest.raises(RelayRecoveryError, match="does not exist"):
        RelayStore.open(tmp_path / "nowhere", create=False)


def test_purge_to_removes_older_files_index_first(tmp_path):
    store = fresh_store(tmp_path)
    start = None
    for n in range(1, 4):
        image = mysql_image(f"binlog.{n + 1:06d}", groups=1, start=start)
        Feeder(store).feed_all(image)
        start = scan_bytes(image).gtids_after
        store.start_file(f"binlog.{n + 1:06d}")
    assert store.purge_to("binlog.000003") == ["binlog.000001", "binlog.000002"]
    assert store.files() == ["binlog.000003", "binlog.000004"]
    assert sorted(p.name for p in (tmp_path / "relay").iterdir() if p.name.startswith("binlog")) == store.files()
    store.close()


# ---------------------------------------------------------------------------------------------
# Recovery after crashes


@pytest.fixture
def fast_tmp(tmp_path):
    """A directory on tmpfs when there is one: thousands of reopen cycles, each with its fsyncs."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="relayproxy-test-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _cut_recovers(tmp_path: Path, image: bytes, cut: int, tail: bytes, *, mark: bool = False):
    name = "binlog.000001"
    d = tmp_path / "relay"
    shutil.rmtree(d, ignore_errors=True)
    relay_dir_with(tmp_path, {name: image[:cut] + tail})
    good_end, gtids = expected_after(image, cut)
    if mark:  # the horizon published before the crash: at most the last boundary before the cut
        (d / LA.DURABLE_MARK_NAME).write_bytes(DU.encode_durable_mark(name, good_end))
    store = RelayStore.open(d)
    try:
        assert (d / name).read_bytes() == image[:good_end], (cut, tail[:4])
        snap = store.horizon.snapshot()
        assert snap.coordinates == (name, good_end), (cut, tail[:4])
        assert snap.gtids == gtids, (cut, tail[:4])
        assert store.current_end == good_end
        assert store.recovery.truncated_bytes == cut + len(tail) - good_end
        return store
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
def test_recovery_after_a_cut_at_every_byte(fast_tmp, flavour):
    tmp_path = fast_tmp
    image = mysql_image(groups=4) if flavour == "mysql" else maria_image()
    rng = random.Random(7)
    garbage = bytes(rng.randrange(256) for _ in range(97))
    for cut in range(4, len(image) + 1):
        _cut_recovers(tmp_path, image, cut, b"")
        _cut_recovers(tmp_path, image, cut, garbage, mark=flavour == "mariadb")
        if flavour == "mysql":
            _cut_recovers(tmp_path, image, cut, bytes(4096), mark=True)  # zeros: an extended, unwritten block


def test_recovery_of_a_file_cut_inside_the_magic(tmp_path):
    for cut in range(0, 4):
        d = relay_dir_with(tmp_path, {"binlog.000001": b"\xfebin"[:cut]})
        store = RelayStore.open(d)
        assert (d / "binlog.000001").read_bytes() == b"\xfebin"
        assert store.horizon.snapshot().coordinates == ("binlog.000001", 4)
        store.close()


def test_crash_after_sync_then_resume_writing(tmp_path, monkeypatch):
    """A process that dies with unsynced bytes: reopen cuts them, the session resumes from the horizon."""
    monkeypatch.setattr(S, "FLUSH_BYTES", 50)  # unsynced bytes reach the file, as the page cache would
    image = mysql_image(groups=6)
    events = split_events(image)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:12]:
        feeder.feed(offset, ev)
    store.sync()
    durable = store.horizon.snapshot()
    for offset, ev in events[12:20]:
        feeder.feed(offset, ev)
    store._w.flush()
    os.close(store._w.fd)  # "crash": no sync, no close
    store._marks.close()
    size_at_crash = (tmp_path / "relay" / "binlog.000001").stat().st_size
    assert size_at_crash > durable.position
    reopened = RelayStore.open(tmp_path / "relay")
    snap = reopened.horizon.snapshot()
    good_end, gtids = expected_after(image, size_at_crash)
    assert snap.coordinates == ("binlog.000001", good_end) and snap.gtids == gtids
    assert snap.position >= durable.position
    assert reopened.recovery.durable_mark == DU.DurableMark("binlog.000001", durable.position)
    # the master re-sends from the horizon
    feeder = Feeder(reopened)
    for offset, ev in events:
        if offset >= snap.position:
            assert feeder.feed(offset, ev) == "appended"
    reopened.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image


def _written_store(tmp_path: Path, image: bytes, name: str = "binlog.000001") -> Path:
    store = fresh_store(tmp_path, name=name)
    Feeder(store).feed_all(image)
    store.close()
    return tmp_path / "relay"


def _corrupt(path: Path, offset: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    return bytes(data)


def test_crc_error_inside_durable_data_refuses_to_open(tmp_path):
    image = mysql_image(groups=6)
    d = _written_store(tmp_path, image)
    victim = split_events(image)[6]
    damaged = _corrupt(d / "binlog.000001", victim[0] + 21)
    with pytest.raises(RelayRecoveryError) as info:
        RelayStore.open(d)
    message = str(info.value)
    assert "binlog.000001" in message and f"offset {victim[0]}" in message and "CRC32 mismatch" in message
    assert "durable" in message
    assert (info.value.file, info.value.offset) == ("binlog.000001", victim[0])
    assert (d / "binlog.000001").read_bytes() == damaged  # nothing was cut


def test_crc_error_without_durable_mark_refuses_when_intact_events_follow(tmp_path):
    image = mysql_image(groups=6)
    victim = split_events(image)[6]
    data = bytearray(image)
    data[victim[0] + 21] ^= 0x40
    d = relay_dir_with(tmp_path, {"binlog.000001": bytes(data)})
    with pytest.raises(RelayRecoveryError, match=rf"offset {victim[0]}.*intact event follows"):
        RelayStore.open(d)
    assert (d / "binlog.000001").read_bytes() == bytes(data)


def test_damaged_fde_with_data_after_it_refuses(tmp_path):
    image = mysql_image()
    data = bytearray(image)
    data[30] ^= 0x01  # inside the FORMAT_DESCRIPTION: its CRC fails and nothing after can be read
    d = relay_dir_with(tmp_path, {"binlog.000001": bytes(data)})
    with pytest.raises(RelayRecoveryError, match="offset 4"):
        RelayStore.open(d)


def test_damage_after_the_durable_mark_is_crash_debris(tmp_path):
    image = mysql_image(groups=6)
    events = split_events(image)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:8]:
        feeder.feed(offset, ev)
    store.sync()
    mark = store.horizon.snapshot().position
    store.close()
    # bytes after the mark that never got synced: a garbled event followed by more events
    path = tmp_path / "relay" / "binlog.000001"
    tail = bytearray(image[mark:])
    tail[25] ^= 0x10
    path.write_bytes(image[:mark] + bytes(tail))
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().position == mark
    assert path.read_bytes() == image[:mark]
    assert any("debris" in w for w in reopened.recovery.warnings)
    reopened.close()


def test_index_repairs(tmp_path):
    first = mysql_image("binlog.000002", groups=2)
    second = mysql_image("binlog.000003", groups=2, start=scan_bytes(first).gtids_after)
    d = relay_dir_with(
        tmp_path,
        {"binlog.000001": first, "binlog.000002": second},
        index=["binlog.000000", "binlog.000001", "binlog.000002", "binlog.000003"],
    )
    (d / LA.INDEX_TMP_NAME).write_text("half written")
    store = RelayStore.open(d)
    assert store.files() == ["binlog.000001", "binlog.000002"]
    assert (d / LA.INDEX_NAME).read_text() == "binlog.000001\nbinlog.000002\n"
    assert not (d / LA.INDEX_TMP_NAME).exists()
    warnings = "\n".join(store.recovery.warnings)
    assert "binlog.000000" in warnings and "binlog.000003" in warnings
    store.close()


def test_unlisted_next_file_is_adopted_when_whole(tmp_path):
    first = mysql_image("binlog.000002", groups=2)
    second = mysql_image("binlog.000003", groups=2, start=scan_bytes(first).gtids_after)
    d = relay_dir_with(tmp_path, {"binlog.000001": first, "binlog.000002": second}, index=["binlog.000001"])
    (d / "stray.bin").write_bytes(b"whatever")
    store = RelayStore.open(d)
    assert store.files() == ["binlog.000001", "binlog.000002"]
    assert store.recovery.adopted == ["binlog.000002"]
    assert store.horizon.snapshot().coordinates == ("binlog.000002", len(second))
    assert any("stray.bin" in w for w in store.recovery.warnings)
    store.close()
    # a next file with a cut group is not adopted: it is moved aside whole (nothing in an unlisted file was ever
    # durable or served), so the relay can write that name again when its master sends it
    shutil.rmtree(d)
    d = relay_dir_with(tmp_path, {"binlog.000001": first, "binlog.000002": second[:-60]}, index=["binlog.000001"])
    store = RelayStore.open(d)
    assert store.files() == ["binlog.000001"]
    aside = d / LA.UNADOPTED_DIR / "binlog.000002.1"
    assert not (d / "binlog.000002").exists() and aside.read_bytes() == second[:-60]
    assert any("binlog.000002" in w and str(aside) in w for w in store.recovery.warnings)
    store.start_file("binlog.000002")
    Feeder(store).feed_all(second)
    store.close()
    assert (d / "binlog.000002").read_bytes() == second
    # a second one of the same name does not overwrite the first
    shutil.rmtree(d)
    d = relay_dir_with(tmp_path, {"binlog.000001": first, "binlog.000002": second[:-70]}, index=["binlog.000001"])
    (d / LA.UNADOPTED_DIR).mkdir()
    (d / LA.UNADOPTED_DIR / "binlog.000002.1").write_bytes(b"earlier")
    RelayStore.open(d).close()
    assert (d / LA.UNADOPTED_DIR / "binlog.000002.1").read_bytes() == b"earlier"
    assert (d / LA.UNADOPTED_DIR / "binlog.000002.2").read_bytes() == second[:-70]
    assert not (d / "binlog.000002").exists()
    # an empty one (the crash came before its magic was durable) is adopted, its magic completed
    (d / "binlog.000002").write_bytes(b"")
    store = RelayStore.open(d)
    assert store.files() == ["binlog.000001", "binlog.000002"]
    assert (d / "binlog.000002").read_bytes() == b"\xfebin"
    snap = store.horizon.snapshot()
    assert snap.coordinates == ("binlog.000002", 4) and snap.gtids == scan_bytes(first).gtids_after
    store.start_file("binlog.000002")  # the session's start_file for it is a no-op
    Feeder(store).feed_all(second)
    store.close()
    assert (d / "binlog.000002").read_bytes() == second


def test_missing_file_in_the_middle_refuses(tmp_path):
    d = relay_dir_with(
        tmp_path,
        {"binlog.000001": mysql_image("binlog.000002"), "binlog.000003": mysql_image("binlog.000004")},
        index=["binlog.000001", "binlog.000002", "binlog.000003"],
    )
    with pytest.raises(RelayRecoveryError, match="binlog.000002"):
        RelayStore.open(d)


def test_older_file_without_rotate_to_next_is_reported(tmp_path):
    d = relay_dir_with(
        tmp_path,
        {"binlog.000001": mysql_image("binlog.000009"), "binlog.000002": mysql_image("binlog.000003")},
    )
    store = RelayStore.open(d)
    assert any("ROTATE to binlog.000009" in w for w in store.recovery.warnings)
    store.close()


def test_newest_file_before_its_gtid_set_event_continues_the_previous_set(tmp_path):
    first = mysql_image("binlog.000002")
    second = mysql_image("binlog.000003")
    fde_end = split_events(second)[1][0]
    d = relay_dir_with(tmp_path, {"binlog.000001": first, "binlog.000002": second[:fde_end]})
    store = RelayStore.open(d)
    snap = store.horizon.snapshot()
    assert snap.coordinates == ("binlog.000002", fde_end)
    assert snap.gtids == scan_bytes(first).gtids_after
    store.close()


# ---------------------------------------------------------------------------------------------
# Real corpus


MARIA_CORPUS = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"


def test_recovery_over_real_mariadb_files(tmp_path, corpus_dir):
    names = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5, 6, 7)]
    files = {name: (corpus_dir / MARIA_CORPUS / name).read_bytes() for name in names}
    d = relay_dir_with(tmp_path, files)
    store = RelayStore.open(d)
    last = scan_file(corpus_dir / MARIA_CORPUS / names[-1])
    snap = store.horizon.snapshot()
    assert snap.coordinates == (names[-1], len(files[names[-1]]))
    assert snap.gtids == last.gtids_after
    assert snap.text == last.gtid_text() == "0-10-262796"
    assert store.flavour == "mariadb"
    assert store.recovery.warnings == [] and store.recovery.truncated_bytes == 0
    store.close()
    # cut the newest at a sample of offsets: the horizon is the scan of the complete prefix
    data = files[names[-1]]
    previous = scan_file(corpus_dir / MARIA_CORPUS / names[-2])
    for cut in range(4, len(data), 997):
        (d / names[-1]).write_bytes(data[:cut])
        prefix = scan_bytes(data[:cut])
        store = RelayStore.open(d)
        assert store.horizon.snapshot().coordinates == (names[-1], prefix.good_end)
        if prefix.start_gtids is None:  # cut before its GTID_LIST: the previous file's set carries on
            assert store.horizon.snapshot().gtids == previous.gtids_after == last.start_gtids
        else:
            assert store.horizon.snapshot().gtids == prefix.gtids_after
        assert (d / names[-1]).read_bytes() == data[: prefix.good_end]
        store.close()


@pytest.mark.parametrize(
    "relpath",
    [
        f"{MARIA_CORPUS}/mariadb-repl-bin.000005",
        "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004",
        "zalora-binlog-parser/data/gtid-fixtures/mysql-bin.01",
        "shyiko-mysql-binlog-connector-java/src/test/resources/mysql-bin.checksum-none",
    ],
)
def test_real_files_stream_through_the_store_byte_identical(tmp_path, corpus_dir, relpath):
    source = corpus_dir / relpath
    data = source.read_bytes()
    fde_flags = struct.unpack_from("<H", data, 4 + 17)[0]
    if fde_flags & C.LOG_EVENT_BINLOG_IN_USE_F:
        # what the master sends: the in-use flag cleared (the CRC was computed with it clear)
        data = data[:21] + struct.pack("<H", fde_flags & ~C.LOG_EVENT_BINLOG_IN_USE_F) + data[23:]
    store = fresh_store(tmp_path, name=source.name)
    Feeder(store).feed_all(data)
    store.close()
    assert (tmp_path / "relay" / source.name).read_bytes() == data
    reopened = RelayStore.open(tmp_path / "relay")
    expected = scan_file(source)
    assert reopened.horizon.snapshot().coordinates == (source.name, expected.good_end)
    assert reopened.horizon.snapshot().gtids == expected.gtids_after
    reopened.close()


# ---------------------------------------------------------------------------------------------
# Failures


def test_fsync_failure_poisons_the_store_and_reopen_recovers(tmp_path, monkeypatch):
    image = mysql_image(groups=4)
    events = split_events(image)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:8]:
        feeder.feed(offset, ev)
    store.sync()
    durable = store.horizon.snapshot()
    for offset, ev in events[8:14]:
        feeder.feed(offset, ev)

    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(OSError, match="No space"):
        store.sync()
    assert store.horizon.snapshot() == durable  # nothing published
    with pytest.raises(RelayStoreFailed, match="No space"):
        store.write_event(*events[14])
    monkeypatch.undo()
    store.close()
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().position >= durable.position
    reopened.close()


def test_fsync_failure_in_a_worker_thread_fails_the_store(tmp_path, monkeypatch):
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    image = mysql_image(groups=2)
    Feeder(store, sync_each_event=False).feed_all(image)
    before = store.horizon.snapshot()

    def broken(fd):
        raise OSError(5, "Input/output error")

    async def main():
        ticket = store.begin_sync()
        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(OSError, match="Input/output"):
            await asyncio.get_running_loop().run_in_executor(None, ticket.make_durable)
        with pytest.raises(RelayStoreFailed):
            store.complete_sync(ticket)

    asyncio.run(main())
    monkeypatch.undo()
    assert store.horizon.snapshot() == before
    with pytest.raises(RelayStoreFailed):
        store.begin_sync()
    store.close()  # still possible: the failed ticket is over
    # After a failed fsync the written bytes may be in the page cache only: close() cut the file back
    # to the last successful fsync (start_file's magic here), so recovery cannot trust them.
    assert (tmp_path / "relay" / "binlog.000001").stat().st_size == 4
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().position == 4
    reopened.close()


def test_the_relays_own_files_are_not_relay_files(tmp_path):
    store = fresh_store(tmp_path)
    Feeder(store).feed_all(mysql_image())
    store.close()
    (tmp_path / "relay" / "relayproxy.uuid").write_text("4f0c8f0e-0000-4000-8000-000000000000\n")
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.recovery.warnings == []
    assert str(reopened.recovery).startswith("1 files; horizon binlog.000001:")
    reopened.close()


# ---------------------------------------------------------------------------------------------
# Bounded memory


def test_a_200_mb_transaction_streams_with_flat_rss(tmp_path):
    script = textwrap.dedent(
        """
        import os, resource, struct, sys, zlib
        sys.path.insert(0, sys.argv[2])
        from relayproxy.binlog import boundary as B, constants as C
        from relayproxy.relay import RelayStore
        from tests.support import eventgen as E

        def rss_kb():
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])

        store = RelayStore.open(sys.argv[1])
        store.start_file("binlog.000001")
        parser = B.TransactionBoundaryParser()
        offset = 4
        def put(ev):
            global offset
            ev = bytearray(ev)
            struct.pack_into("<I", ev, 13, offset + len(ev))
            struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(memoryview(ev)[:-4]))
            store.write_event(offset, ev)
            kind = parser.feed_event(ev, 0) & B.RESULT_MASK
            offset += len(ev)
            if kind == B.GROUP_END:
                store.group_complete(offset, parser.gtid)
            elif kind == B.EVENT_OUTSIDE:
                store.boundary_outside(offset)
            if store.sync_due():
                store.sync()
        put(E.fde()); put(E.previous_gtids())
        template = E.event(C.WRITE_ROWS_EVENT, bytes(10) + os.urandom(256 << 10))
        big = E.event(C.WRITE_ROWS_EVENT, bytes(10) + os.urandom(3 << 20))
        put(E.gtid(1)); put(E.query("BEGIN")); put(E.table_map())
        base = rss_kb()
        peak = base
        target = 200 << 20
        n = 0
        while offset < target:
            put(big if n % 50 == 0 else template)
            n += 1
            if n % 16 == 0:
                peak = max(peak, rss_kb())
        put(E.xid())
        peak = max(peak, rss_kb())
        assert store.horizon.snapshot().position == offset, store.horizon.snapshot()
        store.close()
        print(base, peak, offset, os.path.getsize(os.path.join(sys.argv[1], "binlog.000001")))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "relay"), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    base, peak, end, size = map(int, out.stdout.split())
    assert end == size >= 200 << 20
    print(f"RSS {base >> 10} MB before, peak {peak >> 10} MB while writing {end >> 20} MB")
    assert peak - base < 100 << 10, f"RSS grew {(peak - base) >> 10} MB while writing a 200 MB transaction"


# ---------------------------------------------------------------------------------------------
# Horizon


def test_horizon_waiters_wake_on_advance_without_polling():
    horizon = Horizon("binlog.000001", 4, None)

    async def main():
        loop = asyncio.get_running_loop()
        waiter = asyncio.ensure_future(horizon.wait_for_advance(0))
        await asyncio.sleep(0.05)
        assert not waiter.done() and horizon.waiting == 1
        assert not loop._scheduled  # no timer: the waiter is one future, nothing polls
        cpu = time.process_time()
        await asyncio.sleep(0.2)
        assert time.process_time() - cpu < 0.1
        gtids = GtidSet()
        gtids.add(OTHER_SID, 1)
        horizon.advance("binlog.000001", 100, gtids)
        gtids.add(OTHER_SID, 2)  # the snapshot holds its own copy
        snap = await asyncio.wait_for(waiter, 1)
        assert (snap.file, snap.position, snap.seq) == ("binlog.000001", 100, 1)
        assert snap.text == "64656667-6869-6a6b-6c6d-6e6f70717273:1"
        assert horizon.waiting == 0
        # already past: immediate
        assert (await horizon.wait_for_advance(0)).seq == 1
        # timeout: the current snapshot comes back
        timed_out = await horizon.wait_for_advance(1, timeout=0.01)
        assert timed_out.seq == 1 and horizon.waiting == 0
        # cancellation leaves no waiter behind
        task = asyncio.ensure_future(horizon.wait_for_advance(1))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert horizon.waiting == 0

    asyncio.run(main())


def test_horizon_advanced_from_another_thread_wakes_loop_waiters():
    horizon = Horizon()

    async def main():
        waiters = [asyncio.ensure_future(horizon.wait_for_advance(0)) for _ in range(5)]
        await asyncio.sleep(0.01)
        thread = threading.Thread(target=horizon.advance, args=("binlog.000001", 4, None))
        thread.start()
        snaps = await asyncio.wait_for(asyncio.gather(*waiters), 2)
        thread.join()
        assert {s.seq for s in snaps} == {1}

    asyncio.run(main())


def test_horizon_snapshots_are_consistent_under_concurrent_advance():
    horizon = Horizon("f0", 0, MariaBinlogState())
    stop = threading.Event()
    seen = []

    def writer():
        state = MariaBinlogState()
        for i in range(1, 3000):
            state.update(MariaGtid(0, 1, i))
            horizon.advance(f"f{i % 7}", 0 if i % 7 == 0 else i, state)
        stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not stop.is_set():
        snap = horizon.snapshot()
        seen.append(snap)
        if snap.seq:
            # file, position and GTID set always belong to the same advance
            assert snap.file == f"f{snap.seq % 7}"
            assert snap.position == (0 if snap.seq % 7 == 0 else snap.seq)
            assert str(snap.gtids) == f"0-1-{snap.seq}"
    thread.join()
    last = horizon.snapshot()
    assert (last.seq, last.file, last.position) == (2999, "f3", 2999)
    with pytest.raises(ValueError, match="backwards"):
        horizon.advance("f3", 1, None)


def test_store_readers_can_wait_on_the_store_horizon(tmp_path):
    store = fresh_store(tmp_path)
    image = mysql_image()

    async def main():
        start = store.horizon.snapshot()
        reader = asyncio.ensure_future(store.horizon.wait_for_advance(start.seq))
        await asyncio.sleep(0)
        feeder = Feeder(store, sync_each_event=False)
        for offset, ev in split_events(image)[:3]:
            feeder.feed(offset, ev)
        await asyncio.sleep(0.01)
        assert not reader.done()  # written, not synced: readers do not see it
        if store.sync_due():
            store.sync()
        snap = await asyncio.wait_for(reader, 1)
        assert snap.position == split_events(image)[2][0]

    asyncio.run(main())
    store.close()


def test_sync_ticket_lets_fsync_run_in_a_worker_thread(tmp_path):
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    image = mysql_image(groups=6)
    events = split_events(image)
    feeder = Feeder(store, sync_each_event=False)

    async def main():
        loop = asyncio.get_running_loop()
        for offset, ev in events[:8]:
            feeder.feed(offset, ev)
        target = store.boundary_end
        ticket = store.begin_sync()
        job = loop.run_in_executor(None, ticket.make_durable)
        for offset, ev in events[8:]:  # the stream keeps flowing while the fsync runs
            feeder.feed(offset, ev)
        await job
        assert store.complete_sync(ticket)
        assert store.horizon.snapshot().position == target
        assert store.sync()
        assert store.horizon.snapshot().position == len(image)

    asyncio.run(main())
    store.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image
