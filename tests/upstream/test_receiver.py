"""RelayReceiver, sans-I/O, with a real RelayStore: dump-stream payloads in, relay files and a horizon out.

Every stream here is what a master sends (``tests/fakemaster.DumpCursor`` follows MySQL's Binlog_sender:
fake ROTATE, FDE with the in-use flag cleared, PREVIOUS_GTIDS, events byte for byte, GTID skipping with a
heartbeat, file switches), wrapped as packet payloads (0x00 + event, or 0x00 0xEF flag + event with
semi-sync). Real corpus files are the binlogs; synthetic events only where the corpus has no example.
"""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from pathlib import Path

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog import encoders as E
from relayproxy.binlog.gtid import GtidSet
from relayproxy.binlog.reader import scan_bytes, scan_file
from relayproxy.relay.epochs import Epochs
from relayproxy.relay.errors import RelayGapError, RelayMismatchError, RelayStoreError
from relayproxy.relay.store import RelayStore
from relayproxy.binlog.gtid import boundary_gtid_text as gtid_text
from relayproxy.upstream.receiver import ChecksumMismatch, MasterStreamEnded, RelayReceiver, StreamError
from relayproxy.wire.packets import MySQLError

from ..support import eventgen as G
from ..support.fakemaster import BinlogIndex, DumpCursor, clear_in_use, fake_rotate, heartbeat, next_binlog, split_events

MYSQL80 = "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004"  # 8.0.29, 21 GTIDs, in use
MYSQL80_CREATED = "apecloud-mysql-binlog-connector-rust/tests/parse_file_tests/mysql-bin.000057"  # 8.0.31, compressed
MYSQL57_ROTATE = "Meituan-Dianping-MyFlash/testbinlog/haha.000041"  # 5.7.18, GTIDs, ends with ROTATE
MYSQL96_TAGGED = "blackbeam-rust_mysql_common/test-data/binlogs/binlog_transaction_with_GTID_TAG.000001"
MARIA_DIR = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0/"
MARIA118 = MARIA_DIR + "mariadb-repl-bin.000005"  # 11.8.5: log_pos 0 inside groups
MARIA_CHAIN = [MARIA_DIR + f"mariadb-repl-bin.00000{n}" for n in (4, 5, 6, 7)]  # each rotates to the next
MARIA105 = "blackbeam-rust_mysql_common/test-data/binlogs/mariadb-bin.000001"  # 10.5, in use
MARIA100_NONE = "pingcap-tiflow/mysql-bin.000001"  # 10.0.17, binlog_checksum NONE


# -- helpers -----------------------------------------------------------------------------------------------------


def read(corpus_dir: Path, rel: str) -> bytes:
    return (corpus_dir / rel).read_bytes()


def payload(event: bytes, semi: int | None = None) -> bytes:
    """One dump packet's payload: 0x00 + event, or 0x00 0xEF <flag> + event when semi-sync is on."""
    return b"\x00" + event if semi is None else b"\x00\xef" + bytes([semi]) + event


def master_events(files: list[tuple[str, bytes]], file: str = "", pos: int = 4, gtids: GtidSet | None = None,
                  server_id: int = 1) -> list[bytes]:
    return [s.event for s in DumpCursor(BinlogIndex(files), file=file, pos=pos, gtids=gtids,
                                        server_id=server_id).take()]


_open_stores: list[RelayStore] = []


@pytest.fixture(autouse=True)
def _close_stores():
    yield
    while _open_stores:
        store = _open_stores.pop()
        try:
            store.close()
        except Exception:
            pass  # a store a test left failed or mid-sync: closing is only tidying up here


def new_receiver(tmp_path: Path, *, checksum: str = "CRC32", semi_sync: bool = False):
    store = RelayStore.open(tmp_path / "relay")
    _open_stores.append(store)
    receiver = RelayReceiver(store)
    receiver.start_stream(announced_checksum=checksum, semi_sync=semi_sync)
    return store, receiver


def relay_bytes(store: RelayStore, name: str) -> bytes:
    return store.path(name).read_bytes()


def reconnect(receiver: RelayReceiver, *, checksum: str = "CRC32", semi_sync: bool = False) -> int:
    dropped = receiver.end_stream()
    receiver.start_stream(announced_checksum=checksum, semi_sync=semi_sync)
    return dropped


MYSQL_SID_TEXT = "00010203-0405-0607-0809-0a0b0c0d0e0f"


def synthetic_mysql_image() -> bytes:
    """An 8.0 binlog with PREVIOUS_GTIDS (sid:1-5) and three groups of the shapes §1.1 documents."""
    prev = G.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet(f"{MYSQL_SID_TEXT}:1-5").encode(),
                   flags=C.LOG_EVENT_IGNORABLE_F)
    return G.binlog_file(
        prev,
        G.gtid(6), G.query("BEGIN"), G.table_map(), G.write_rows(), G.xid(),  # DML
        G.gtid(7), G.query("CREATE TABLE t (a INT)"),  # DDL
        G.gtid(8), G.intvar(), G.query("INSERT INTO t VALUES (NULL)"),  # pre-statement + statement
    )


def group_ends(image: bytes) -> list[int]:
    ends: list[int] = []
    scan_bytes(image, on_group=lambda g: ends.append(g.end) if g.complete else None)
    return ends


def index_ending_at(stream: list[bytes], end: int) -> int:
    """Index of the stream event that ends at file offset ``end`` (log_pos, or running offset for log_pos 0)."""
    offset = None
    for i, ev in enumerate(stream):
        size, log_pos, flags = struct.unpack_from("<IIH", ev, 9)
        if ev[4] == C.ROTATE_EVENT and flags & C.LOG_EVENT_ARTIFICIAL_F:
            offset = struct.unpack_from("<Q", ev, C.HEADER_LEN)[0]
            continue
        if ev[4] in (C.HEARTBEAT_LOG_EVENT, C.HEARTBEAT_LOG_EVENT_V2) or offset is None:
            continue
        if ev[4] == C.FORMAT_DESCRIPTION_EVENT and log_pos == 0:
            continue
        offset = log_pos if log_pos else offset + size
        if offset == end:
            return i
    raise AssertionError(f"no event ends at {end}")


def assert_resumes_to_image(store: RelayStore, receiver: RelayReceiver, name: str, image: bytes) -> None:
    """Fail loud, lose nothing: after an error, a new stream from the horizon completes the file exactly."""
    dropped = reconnect(receiver)
    assert store.current_end == store.boundary_end, dropped
    horizon = store.horizon.snapshot()
    assert relay_bytes(store, name)[: horizon.position] == clear_in_use(image)[: horizon.position]
    receiver.feed(payload(e) for e in master_events([(name, image)], name, horizon.position))
    store.sync()
    assert relay_bytes(store, name) == clear_in_use(image)
    assert store.horizon.snapshot().position == len(image)


# -- bootstrap -----------------------------------------------------------------------------------------------------


def test_bootstrap_synthetic_mysql_file(tmp_path):
    image = synthetic_mysql_image()
    store, receiver = new_receiver(tmp_path)
    events = master_events([("binlog.000001", image)], "binlog.000001", 4)
    assert events[0][4] == C.ROTATE_EVENT and events[1][4] == C.FORMAT_DESCRIPTION_EVENT
    receiver.feed(payload(e) for e in events)
    # Nothing is advertised before the fsync: the horizon is still at the new file's start.
    assert store.horizon.snapshot().coordinates == ("binlog.000001", 4)
    assert store.sync()
    horizon = store.horizon.snapshot()
    assert horizon.coordinates == ("binlog.000001", len(image))
    assert horizon.text == f"{MYSQL_SID_TEXT}:1-8"
    assert relay_bytes(store, "binlog.000001") == image
    assert store.files() == ["binlog.000001"]
    assert receiver.counters.transactions == 3
    assert receiver.counters.events == len(events) - 1  # all but the fake ROTATE
    assert receiver.master_file == "binlog.000001"
    assert receiver.master_position == ("binlog.000001", len(image))
    store.close()


def _name(rel: str) -> str:
    return os.path.basename(rel)


CORPUS_FILES = [MYSQL80, MYSQL80_CREATED, MYSQL57_ROTATE, MYSQL96_TAGGED, MARIA118, MARIA105, MARIA100_NONE]


@pytest.mark.parametrize("rel", CORPUS_FILES, ids=lambda r: _name(r))
def test_bootstrap_corpus_file_equals_image(tmp_path, corpus_dir, rel):
    image = read(corpus_dir, rel)
    scan = scan_bytes(image)
    assert scan.ok and not scan.partial_tail
    checksum = "CRC32" if scan.fde.checksum_alg == C.CHECKSUM_CRC32 else "NONE"
    name = _name(rel)
    store, receiver = new_receiver(tmp_path, checksum=checksum)
    receiver.feed(payload(e) for e in master_events([(name, image)], name, 4))
    store.sync()
    horizon = store.horizon.snapshot()
    assert horizon.coordinates == (name, len(image))
    assert horizon.gtids == scan.gtids_after
    # The master clears LOG_EVENT_BINLOG_IN_USE_F in the FDE it sends; everything else is byte-identical.
    assert relay_bytes(store, name) == clear_in_use(image)
    assert receiver.counters.transactions == scan.groups_complete
    store.close()


def test_mariadb_log_pos_zero_events_are_placed_by_running_offset(tmp_path, corpus_dir):
    image = read(corpus_dir, MARIA118)
    events = split_events(image)
    zero = [(off, ev) for off, ev in events if struct.unpack_from("<I", ev, 13)[0] == 0]
    assert len(zero) > 300  # MariaDB 11.4+ without binlog_legacy_event_pos: the file is the test's premise
    store, receiver = new_receiver(tmp_path)
    name = _name(MARIA118)
    stream = master_events([(name, image)], name, 4)
    # Feed up to (and including) the first log_pos-0 event: it lands right after the previous event.
    first_zero_off, first_zero = zero[0]
    upto = next(i for i, e in enumerate(stream) if e == first_zero)
    receiver.feed(payload(e) for e in stream[: upto + 1])
    assert store.current_end == first_zero_off + len(first_zero)
    receiver.feed(payload(e) for e in stream[upto + 1 :])
    store.sync()
    assert relay_bytes(store, name) == image
    assert store.horizon.snapshot().gtids == scan_bytes(image).gtids_after


# -- reconnects ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", [MYSQL80, MARIA118], ids=_name)
def test_mid_file_resume_by_position(tmp_path, corpus_dir, rel):
    image = read(corpus_dir, rel)
    name = _name(rel)
    ends = group_ends(image)
    k = len(ends) // 2
    cut_group_end = ends[k]
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(name, image)], name, 4)
    # First connection: everything up to a group end, then the next group but its last event, then the cut.
    upto = index_ending_at(stream, cut_group_end) + 1
    last = index_ending_at(stream, ends[k + 1])
    receiver.feed(payload(e) for e in stream[:last])
    store.sync()  # writes the partial group to the file too; the horizon stays at the group end
    assert store.horizon.snapshot().position == cut_group_end < store.current_end
    dropped = reconnect(receiver)
    assert dropped == sum(len(e) for e in stream[upto:last])
    store.sync()
    assert os.path.getsize(store.path(name)) == cut_group_end  # truncated back to the boundary

    resumed = master_events([(name, image)], name, cut_group_end)
    rotate, fde = resumed[0], resumed[1]
    assert struct.unpack_from("<Q", rotate, C.HEADER_LEN)[0] == cut_group_end
    assert fde[4] == C.FORMAT_DESCRIPTION_EVENT and struct.unpack_from("<I", fde, 13)[0] == 0
    receiver.feed(payload(e) for e in resumed)
    store.sync()
    # The artificial FDE (log_pos 0, created 0) describes the stream and is not stored anywhere.
    assert relay_bytes(store, name) == clear_in_use(image)
    assert receiver.counters.duplicates == 0
    assert receiver.counters.transactions == len(ends)
    assert store.horizon.snapshot().gtids == scan_bytes(image).gtids_after


def test_resent_events_are_verified_duplicates_not_counted_twice(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    name = _name(MYSQL80)
    store, receiver = new_receiver(tmp_path)
    receiver.feed(payload(e) for e in master_events([(name, image)], name, 4))
    store.sync()
    before = store.horizon.snapshot()
    transactions, events = receiver.counters.transactions, receiver.counters.events
    # A master asked for an older position re-sends what the relay holds: all verified, nothing written.
    reconnect(receiver)
    again = master_events([(name, image)], name, 4)
    receiver.feed(payload(e) for e in again)
    assert receiver.counters.duplicates == len(again) - 1  # the FDE at 4 included, the fake ROTATE not
    assert receiver.counters.transactions == transactions
    assert receiver.counters.events == events + len(again) - 1
    assert not store.sync()  # nothing new: the horizon does not move
    assert store.horizon.snapshot() == before
    assert relay_bytes(store, name) == clear_in_use(image)

    # A re-sent event that differs from the stored bytes is refused loudly, naming file and offset.
    reconnect(receiver)
    off, ev = split_events(image)[5]
    bad = bytearray(ev)
    bad[C.HEADER_LEN + 2] ^= 0xFF
    struct.pack_into("<I", bad, len(bad) - 4, zlib.crc32(bad[:-4]))
    with pytest.raises(RelayMismatchError, match=rf"{name}:{off}"):
        receiver.feed([payload(fake_rotate(name, off, 1)), payload(bytes(bad))])
    assert_resumes_to_image(store, receiver, name, image)


@pytest.mark.parametrize("rel", [MYSQL80, MYSQL80_CREATED], ids=_name)
def test_gtid_auto_position_master_skips_groups_the_relay_has(tmp_path, corpus_dir, rel):
    image = read(corpus_dir, rel)
    name = _name(rel)
    ends = group_ends(image)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(name, image)], name, 4)
    upto = index_ending_at(stream, ends[1]) + 1
    receiver.feed(payload(e) for e in stream[: upto + 1])  # two groups and the next group's GTID event
    store.sync()
    reconnect(receiver)
    have = store.horizon.snapshot().gtids
    assert have == scan_bytes(image[: ends[1]]).gtids_after

    resumed = master_events([(name, image)], gtids=have)
    types = [e[4] for e in resumed]
    # MySQL's rule: the file restarts at 4 (fake rotate, FDE, PREVIOUS_GTIDS), the groups the relay has
    # are skipped, a heartbeat names the end of the skipped ones, then the first new group at the old end.
    assert types[:4] == [C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT,
                         C.HEARTBEAT_LOG_EVENT]
    assert struct.unpack_from("<I", resumed[3], 13)[0] == ends[1]
    assert struct.unpack_from("<I", resumed[4], 13)[0] - len(resumed[4]) == ends[1]
    if scan_bytes(image).fde.create_timestamp:
        assert resumed[1][C.HEADER_LEN + 52 : C.HEADER_LEN + 56] == b"\0\0\0\0"  # created cleared by the master
    receiver.feed(payload(e) for e in resumed)
    store.sync()
    assert relay_bytes(store, name) == clear_in_use(image)
    assert receiver.counters.duplicates == 2  # the FDE and PREVIOUS_GTIDS, verified against the file
    assert receiver.counters.transactions == len(ends)
    assert store.horizon.snapshot().gtids == scan_bytes(image).gtids_after
    assert receiver.master_position == (name, len(image))


# -- heartbeats ----------------------------------------------------------------------------------------------------


def test_heartbeats_move_master_position_and_are_not_stored(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    name = _name(MYSQL80)
    store, receiver = new_receiver(tmp_path)
    receiver.feed(payload(e) for e in master_events([(name, image)], name, 4))
    store.sync()
    horizon = store.horizon.snapshot()
    size = os.path.getsize(store.path(name))

    receiver.feed([payload(heartbeat(name, len(image) + 100, 1))])
    assert receiver.master_position == (name, len(image) + 100)
    receiver.feed([payload(heartbeat(name, len(image) + 500, 1, v2=True))])
    assert receiver.master_position == (name, len(image) + 500)
    big = (5 << 30) + 123  # past 4 GB: v2 carries it whole, MariaDB's v1 in an 8-byte sub-header
    receiver.feed([payload(E.heartbeat_v2(name, big, 1, True))])
    assert receiver.master_position == (name, big)
    receiver.feed([payload(E.heartbeat_v1(name, big + 1, 1, True, mariadb=True))])
    assert receiver.master_position == (name, big + 1)
    # An older position (a heartbeat that crossed a newer event) does not move it back.
    receiver.feed([payload(heartbeat(name, 1000, 1))])
    assert receiver.master_position == (name, big + 1)
    assert receiver.counters.heartbeats == 5

    assert not store.sync()
    assert store.horizon.snapshot() == horizon
    assert os.path.getsize(store.path(name)) == size == store.current_end

    bad = bytearray(heartbeat(name, len(image), 1))
    bad[-1] ^= 0x55
    with pytest.raises(StreamError, match="CRC32 mismatch in HEARTBEAT"):
        receiver.feed([payload(bytes(bad))])


def test_heartbeat_v1_without_checksum(tmp_path, corpus_dir):
    image = read(corpus_dir, MARIA100_NONE)
    name = _name(MARIA100_NONE)
    store, receiver = new_receiver(tmp_path, checksum="NONE")
    receiver.feed(payload(e) for e in master_events([(name, image)], name, 4))
    receiver.feed([payload(heartbeat(name, len(image) + 7, 1, checksum=False))])
    assert receiver.master_position == (name, len(image) + 7)
    receiver.feed([payload(E.heartbeat_v1(name, 6 << 30, 1, False, mariadb=True))])
    assert receiver.master_position == (name, 6 << 30)


# -- rotation ------------------------------------------------------------------------------------------------------


def test_rotation_across_real_mariadb_files(tmp_path, corpus_dir):
    files = [(_name(rel), read(corpus_dir, rel)) for rel in MARIA_CHAIN]
    store, receiver = new_receiver(tmp_path)
    stream = master_events(files, files[0][0], 4)
    fake = [e for e in stream if e[4] == C.ROTATE_EVENT and struct.unpack_from("<H", e, 17)[0] & 0x20]
    real = [e for e in stream if e[4] == C.ROTATE_EVENT and not struct.unpack_from("<H", e, 17)[0] & 0x20]
    assert len(fake) == 4 and len(real) == 4  # one real ROTATE ends each file, a fake one starts each file
    receiver.feed(payload(e) for e in stream)
    store.sync()
    assert store.files() == [name for name, _ in files]
    for name, image in files:
        assert relay_bytes(store, name) == image  # the real ROTATE is stored at each file's end
    horizon = store.horizon.snapshot()
    assert horizon.coordinates == (files[-1][0], len(files[-1][1]))
    assert horizon.gtids == scan_file(corpus_dir / MARIA_CHAIN[-1]).gtids_after


def test_resume_at_the_end_of_a_closed_file(tmp_path, corpus_dir):
    files = [(_name(rel), read(corpus_dir, rel)) for rel in MARIA_CHAIN[1:3]]
    (first, image), (second, _) = files
    store, receiver = new_receiver(tmp_path)
    stream = master_events(files, first, 4)
    receiver.feed(payload(e) for e in stream[: index_ending_at(stream, len(image)) + 1])  # through the real ROTATE
    store.sync()
    assert store.horizon.snapshot().coordinates == (first, len(image))
    reconnect(receiver)
    resumed = master_events(files, first, len(image))
    # fake ROTATE (first, its end), artificial FDE, then the next file from its start.
    assert [e[4] for e in resumed[:4]] == [C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT, C.ROTATE_EVENT,
                                           C.FORMAT_DESCRIPTION_EVENT]
    receiver.feed(payload(e) for e in resumed)
    store.sync()
    assert store.files() == [first, second]
    for name, data in files:
        assert relay_bytes(store, name) == data
    assert receiver.counters.duplicates == 0


def test_rotation_mysql_tagged_gtids_into_a_new_file(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL96_TAGGED)
    after = scan_bytes(image).gtids_after
    files = [("binlog.000004", image), ("binlog.000005", next_binlog(image, after))]
    store, receiver = new_receiver(tmp_path)
    receiver.feed(payload(e) for e in master_events(files, "binlog.000004", 4))
    store.sync()
    assert store.files() == ["binlog.000004", "binlog.000005"]
    assert relay_bytes(store, "binlog.000004") == image
    assert relay_bytes(store, "binlog.000005") == clear_in_use(files[1][1])
    horizon = store.horizon.snapshot()
    assert horizon.coordinates == ("binlog.000005", len(files[1][1]))
    assert horizon.text == "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-3"


def test_new_file_with_previous_gtids_behind_the_relay_never_shrinks_its_gtid_set(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    ends = group_ends(image)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(_name(MYSQL80), image)], _name(MYSQL80), 4)
    receiver.feed(payload(e) for e in stream[: index_ending_at(stream, ends[10]) + 1])
    store.sync()
    have = store.horizon.snapshot().gtids  # PREVIOUS_GTIDS 1-5 plus the 11 transactions: 1-16
    reconnect(receiver)
    # A master whose binlog holds the same transactions under another name starts its file at 4; its
    # PREVIOUS_GTIDS (1-5) is older than what the relay holds.
    other = master_events([("other-bin.000001", image)], gtids=have)
    assert [e[4] for e in other[:3]] == [C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT]
    try:
        receiver.feed(payload(e) for e in other[:3])
    except (StreamError, RelayStoreError):
        pass  # refusing the new file is fine: what matters is what the relay advertises afterwards
    receiver.end_stream()
    store.sync()
    assert store.horizon.snapshot().gtids.is_superset(have), store.horizon.snapshot().text


class _RecordingStore:
    """Just the store surface RelayReceiver uses, recording offsets: a real relay file past 4 GB is too big
    for a unit test, and the point here is the receiver's arithmetic."""

    epochs = Epochs()  # one implicit epoch: the master's names are the relay's

    def __init__(self, name: str, end: int):
        self.current_file, self.current_end, self.boundary_end = name, end, end
        self.writes: list[int] = []

    def files(self) -> list[str]:
        return [self.current_file]

    def relay_name(self, upstream_name: str) -> str:
        return upstream_name

    def append_event(self, offset: int, event, log_pos: int, type_code: int) -> str:
        return self.write_event(offset, event)

    def write_filler(self, offset: int, *, relay_server_id: int = 0) -> int:
        raise AssertionError("no gap to fill in this test")

    def write_event(self, offset: int, event) -> str:
        self.writes.append(offset)
        self.current_end = max(self.current_end, offset + len(event))
        return "appended"

    def group_complete(self, end: int, gtid=None) -> None:
        self.boundary_end = end

    def boundary_outside(self, end: int) -> None:
        self.boundary_end = end

    def discard_incomplete(self) -> int:
        return 0


def test_events_past_4_gb_are_placed_at_their_real_offset():
    start = (1 << 32) - 100  # the relay holds this much of the file; the next event crosses 4 GB
    store = _RecordingStore("binlog.000042", start)
    receiver = RelayReceiver(store)
    receiver.start_stream(announced_checksum="CRC32", semi_sync=False)
    receiver.feed([payload(fake_rotate("binlog.000042", start, 1))])
    rows = bytearray(G.event(C.WRITE_ROWS_EVENT, bytes(10) + b"\x01\xff\x00" + bytes(180)))
    end = start + len(rows)
    struct.pack_into("<I", rows, 13, end & 0xFFFFFFFF)  # what the master writes: the end offset mod 2**32
    struct.pack_into("<I", rows, len(rows) - 4, zlib.crc32(rows[:-4]))
    receiver.feed([payload(bytes(rows))])
    assert store.writes == [start]
    assert receiver.master_position == ("binlog.000042", end)


# -- impossible streams --------------------------------------------------------------------------------------------


@pytest.fixture
def mysql_half(tmp_path, corpus_dir):
    """A relay holding the first half of the 8.0 corpus file (at a group boundary), mid-stream."""
    image = read(corpus_dir, MYSQL80)
    name = _name(MYSQL80)
    ends = group_ends(image)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(name, image)], name, 4)
    upto = index_ending_at(stream, ends[10]) + 1
    receiver.feed(payload(e) for e in stream[:upto])
    store.sync()
    rest = [(off, ev) for off, ev in split_events(image) if off >= ends[10]]
    yield store, receiver, name, image, rest
    store.close()


def test_crc_mismatch_names_file_and_offset(mysql_half):
    store, receiver, name, image, rest = mysql_half
    off, ev = rest[1]
    bad = bytearray(ev)
    bad[C.HEADER_LEN + 3] ^= 0x01
    receiver.feed([payload(rest[0][1])])
    with pytest.raises(ChecksumMismatch, match=rf"CRC32 mismatch in \w+ event at {name}:{off}$"):
        receiver.feed([payload(bytes(bad))])
    assert_resumes_to_image(store, receiver, name, image)


def test_crc_mismatch_in_format_description(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    name = _name(MYSQL80)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(name, image)], name, 4)
    bad = bytearray(stream[1])
    bad[C.HEADER_LEN + 10] ^= 0x01
    with pytest.raises(StreamError, match="FORMAT_DESCRIPTION_EVENT from the master"):
        receiver.feed([payload(stream[0]), payload(bytes(bad))])
    assert os.path.getsize(store.path(name)) == 4


def test_event_size_differs_from_packet_size(mysql_half):
    store, receiver, name, image, rest = mysql_half
    ev = rest[0][1]
    with pytest.raises(StreamError, match=rf"says {len(ev)} bytes but its packet holds {len(ev) - 3}"):
        receiver.feed([payload(ev[:-3])])
    with pytest.raises(StreamError, match="says .* but its packet holds"):
        receiver.feed([payload(ev + b"\0")])
    with pytest.raises(StreamError, match="shorter than its header"):
        receiver.feed([payload(ev[:10])])
    assert_resumes_to_image(store, receiver, name, image)


def test_rotate_back_to_an_older_file(tmp_path, corpus_dir):
    files = [(_name(rel), read(corpus_dir, rel)) for rel in MARIA_CHAIN[:2]]
    store, receiver = new_receiver(tmp_path)
    receiver.feed(payload(e) for e in master_events(files, files[0][0], 4))
    with pytest.raises(StreamError, match=f"switched back to {files[0][0]}, older than .* {files[1][0]}"):
        receiver.feed([payload(fake_rotate(files[0][0], 4, 1))])


def test_resume_position_beyond_what_the_relay_holds(mysql_half):
    store, receiver, name, image, rest = mysql_half
    reconnect(receiver)
    held = store.current_end
    with pytest.raises(StreamError, match=rf"resumes {name} at {held + 79} but the relay holds only {held} bytes"):
        receiver.feed([payload(fake_rotate(name, held + 79, 1))])
    with pytest.raises(StreamError, match=r"starts binlog.000009 at position 200, but the relay has no such file"):
        receiver.feed([payload(fake_rotate("binlog.000009", 200, 1))])
    with pytest.raises(StreamError, match="impossible binlog file"):
        receiver.feed([payload(fake_rotate("../etc", 4, 1))])
    assert_resumes_to_image(store, receiver, name, image)


def test_gap_in_the_stream(mysql_half):
    store, receiver, name, image, rest = mysql_half
    # The master skips the next group's GTID event: the following event does not touch the stored data.
    (off, _), (off2, ev2) = rest[0], rest[1]
    with pytest.raises((StreamError, RelayGapError)) as info:
        receiver.feed([payload(ev2)])
    message = str(info.value)
    assert name in message and f"offset {off2}" in message and f"ends at {off}" in message
    assert_resumes_to_image(store, receiver, name, image)


def test_gtid_inside_an_open_group(tmp_path):
    image = synthetic_mysql_image()
    events = split_events(image)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([("binlog.000001", image)], "binlog.000001", 4)
    # rotate, FDE, PREVIOUS_GTIDS, GTID 6, BEGIN, then a GTID where the rows should be.
    receiver.feed(payload(e) for e in stream[:5])
    begin_end = events[3][0] + len(events[3][1])
    intruder = bytearray(G.gtid(9))
    struct.pack_into("<I", intruder, 13, begin_end + len(intruder))
    struct.pack_into("<I", intruder, len(intruder) - 4, zlib.crc32(intruder[:-4]))
    with pytest.raises(StreamError, match=rf"unexpected event sequence at binlog.000001:{begin_end} \(GTID"):
        receiver.feed([payload(bytes(intruder))])
    assert_resumes_to_image(store, receiver, "binlog.000001", image)


def test_mariadb_gtid_inside_an_open_group(tmp_path, corpus_dir):
    image = read(corpus_dir, MARIA118)
    name = _name(MARIA118)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(name, image)], name, 4)
    gtids = [i for i, e in enumerate(stream) if e[4] == C.MARIA_GTID_EVENT]
    receiver.feed(payload(e) for e in stream[: gtids[1] + 2])  # group 1, then GTID + a query of group 2
    assert stream[gtids[1] + 1][4] == C.QUERY_EVENT
    # Group 3's GTID event where group 2 should go on (placed at the stream's offset, CRC valid).
    intruder = bytearray(stream[gtids[2]])
    at = store.current_end
    struct.pack_into("<I", intruder, 13, at + len(intruder))
    struct.pack_into("<I", intruder, len(intruder) - 4, zlib.crc32(intruder[:-4]))
    with pytest.raises(StreamError, match=rf"unexpected event sequence at {name}:{at} \(MARIA_GTID"):
        receiver.feed([payload(bytes(intruder))])
    assert_resumes_to_image(store, receiver, name, image)


def test_event_before_any_rotate_and_rotate_inside_a_group(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    name = _name(MYSQL80)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(name, image)], name, 4)
    with pytest.raises(StreamError, match="before the stream named its binlog file"):
        receiver.feed([payload(stream[2])])  # PREVIOUS_GTIDS without the fake ROTATE first
    reconnect(receiver)
    receiver.feed(payload(e) for e in stream[:4])  # ... PREVIOUS_GTIDS and a GTID event: a group is open
    with pytest.raises(StreamError, match="rotated to binlog.000005 inside a transaction"):
        receiver.feed([payload(fake_rotate("binlog.000005", 4, 1))])
    assert_resumes_to_image(store, receiver, name, image)


def test_semi_sync_packet_without_magic(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    name = _name(MYSQL80)
    store, receiver = new_receiver(tmp_path, semi_sync=True)
    stream = master_events([(name, image)], name, 4)
    receiver.feed([payload(stream[0], 0)])
    with pytest.raises(StreamError, match="Missing magic number for semi-sync packet"):
        receiver.feed([payload(stream[1])])
    with pytest.raises(StreamError, match="Missing magic number"):
        receiver.feed([b"\x00\xef"])


def test_error_packet_end_packet_and_garbage(tmp_path):
    store, receiver = new_receiver(tmp_path)
    err = b"\xff" + struct.pack("<H", 1236) + b"#HY000" + b"Could not find first log file name in binary log index file"
    with pytest.raises(MySQLError) as info:
        receiver.feed([err])
    assert info.value.code == 1236
    assert info.value.message == "Could not find first log file name in binary log index file"
    with pytest.raises(MasterStreamEnded, match="end of the binlog stream"):
        receiver.feed([b"\xfe\x00\x00\x02\x00"])
    with pytest.raises(StreamError, match=r"unexpected packet in the binlog stream \(first byte 1, 3 bytes\)"):
        receiver.feed([b"\x01ab"])
    with pytest.raises(StreamError, match="first byte -1"):
        receiver.feed([b""])
    assert issubclass(MasterStreamEnded, StreamError)


# -- semi-sync -----------------------------------------------------------------------------------------------------


def test_semi_sync_ack_pending_only_for_flagged_appended_groups(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    name = _name(MYSQL80)
    ends = group_ends(image)
    store, receiver = new_receiver(tmp_path, semi_sync=True)
    cursor = DumpCursor(BinlogIndex([(name, image)]), file=name, pos=4, gtids=None, server_id=1)
    sent = cursor.take()
    first_end = next(i for i, s in enumerate(sent) if s.offset is not None and s.offset + len(s.event) == ends[0])
    second_end = next(i for i, s in enumerate(sent) if s.offset is not None and s.offset + len(s.event) == ends[1])
    assert sent[first_end].need_ack and sent[second_end].need_ack
    # Group 1 arrives unflagged (the master was not waiting on it): nothing to acknowledge.
    receiver.feed(payload(s.event, 0) for s in sent[: first_end + 1])
    assert receiver.ack_pending is None
    # Group 2's last event is flagged: the ACK names the master's file and the group's end position.
    receiver.feed(
        payload(s.event, 1 if i == second_end else 0) for i, s in enumerate(sent) if first_end < i <= second_end
    )
    assert receiver.ack_pending == (name, ends[1])
    store.sync()
    receiver.ack_pending = None  # the session sent it
    # Re-sent after a reconnect (duplicates) and flagged: not appended, so no new ACK.
    reconnect(receiver, semi_sync=True)
    again = master_events([(name, image)], name, 4)
    receiver.feed(payload(e, 1) for e in again[: second_end + 1])
    assert receiver.counters.duplicates > 0 and receiver.ack_pending is None
    # The flag on a heartbeat or the fake rotate never asks for an ACK of stored data.
    receiver.feed([payload(heartbeat(name, ends[1], 1), 1)])
    assert receiver.ack_pending is None
    # end_stream forgets a pending ACK: the new connection's master does not wait on it.
    receiver.feed(payload(s.event, 1) for s in sent[second_end + 1 : second_end + 3])
    assert receiver.ack_pending is not None
    reconnect(receiver, semi_sync=True)
    assert receiver.ack_pending is None


def test_semi_sync_tally_counts_transaction_ends_the_master_did_not_ask_to_acknowledge(tmp_path, corpus_dir):
    """MariaDB flags a transaction's last event while it waits for it (or, in fallback, once the replica has caught
    up with its latest commit); a group ending unflagged is tallied with its GTID. Only at group ends."""
    image = read(corpus_dir, MARIA118)
    name = _name(MARIA118)
    ends = group_ends(image)
    store, receiver = new_receiver(tmp_path, semi_sync=True)
    now = [1000.0]
    receiver.clock = lambda: now[0]
    tally = receiver.semi_sync
    assert tally.master_waiting is None and tally.ack_requests == tally.unrequested_transactions == 0
    stream = master_events([(name, image)], name, 4)
    cut = [index_ending_at(stream, end) for end in ends[:4]]
    flags = {cut[0]: 1, cut[2]: 0, cut[3]: 1}  # group 2 (cut[1]) and 3 end unflagged
    # Flags on events other than group ends (the fallback master flags any event at its commit position) are
    # not tallied: MariaDB only waits on transaction ends.
    receiver.feed(payload(e, flags.get(i, 1 if i < cut[0] else 0)) for i, e in enumerate(stream[: cut[0] + 1]))
    assert (tally.ack_requests, tally.unrequested_transactions, tally.master_waiting) == (1, 0, True)
    assert tally.last_ack_request_time == 1000.0 and tally.last_unrequested_gtid is None
    now[0] = 1001.0
    receiver.feed(payload(e, flags.get(i, 0)) for i, e in enumerate(stream[: cut[2] + 1]) if i > cut[0])
    assert (tally.ack_requests, tally.unrequested_transactions, tally.master_waiting) == (1, 2, False)
    gtid = tally.last_unrequested_gtid
    assert isinstance(gtid[0], int) and gtid_text(gtid) == "-".join(map(str, gtid))
    assert tally.last_unrequested_time == 1001.0 and tally.last_ack_request_time == 1000.0
    receiver.feed(payload(e, flags.get(i, 0)) for i, e in enumerate(stream[: cut[3] + 1]) if i > cut[2])
    assert (tally.ack_requests, tally.unrequested_transactions, tally.master_waiting) == (2, 2, True)
    assert tally.last_unrequested_gtid == gtid and receiver.counters.transactions == 4
    store.sync()
    # A new stream: the master's waiting is unknown until its first transaction end; re-sent groups (duplicates)
    # are not tallied again, whatever their flag.
    reconnect(receiver, semi_sync=True)
    assert tally.master_waiting is None and tally.unrequested_transactions == 2
    receiver.feed(payload(e, 0) for e in master_events([(name, image)], name, 4)[: cut[3] + 1])
    assert receiver.counters.duplicates > 0 and (tally.ack_requests, tally.unrequested_transactions) == (2, 2)
    # An asynchronous stream tallies nothing.
    reconnect(receiver, semi_sync=False)
    receiver.feed(payload(e) for e in master_events([(name, image)], name, 4))
    assert receiver.counters.transactions > 4
    assert (tally.ack_requests, tally.unrequested_transactions, tally.master_waiting) == (2, 2, None)


# -- end_stream ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flush_first", [False, True], ids=["buffered", "flushed"])
def test_end_stream_discards_the_partial_group(tmp_path, corpus_dir, flush_first):
    image = read(corpus_dir, MARIA118)
    name = _name(MARIA118)
    ends = group_ends(image)
    store, receiver = new_receiver(tmp_path)
    stream = master_events([(name, image)], name, 4)
    upto = index_ending_at(stream, ends[3]) + 1
    partial = stream[upto : upto + 4]  # GTID + 3 queries (log_pos 0) of the next group
    receiver.feed(payload(e) for e in stream[:upto])
    receiver.feed(payload(e) for e in partial)
    assert store.current_end == ends[3] + sum(map(len, partial))
    if flush_first:
        store.sync()  # the partial group reaches the file (not the horizon)
        assert os.path.getsize(store.path(name)) == store.current_end
    dropped = receiver.end_stream()
    assert dropped == sum(map(len, partial))
    assert store.current_end == store.boundary_end == ends[3]
    store.sync()
    assert os.path.getsize(store.path(name)) == ends[3]
    assert relay_bytes(store, name) == image[: ends[3]]
    assert store.horizon.snapshot().position == ends[3]
    assert receiver.end_stream() == 0  # idempotent
    receiver.start_stream(announced_checksum="CRC32", semi_sync=False)
    receiver.feed(payload(e) for e in master_events([(name, image)], name, ends[3]))
    store.sync()
    assert relay_bytes(store, name) == image


# -- property: any batching, any reconnects --------------------------------------------------------------------------


class _Relay:
    """A receiver + store driven the way UpstreamSession drives them, against a scripted master."""

    def __init__(self, relay_dir: Path, files: list[tuple[str, bytes]], gtid_mode: bool):
        self.files = files
        self.gtid_mode = gtid_mode
        self.store = RelayStore.open(relay_dir)
        self.receiver = RelayReceiver(self.store)
        self.requests: list[tuple] = []

    def connect(self) -> list[bytes]:
        self.receiver.end_stream()
        self.receiver.start_stream(announced_checksum="CRC32", semi_sync=False)
        horizon = self.store.horizon.snapshot()
        if self.store.current_file is None:
            request = (self.files[0][0], 4, None)
        elif self.gtid_mode and isinstance(horizon.gtids, GtidSet):
            request = ("", 4, horizon.gtids.copy())
        else:
            request = (horizon.file, horizon.position, None)
        self.requests.append(request)
        return master_events(self.files, *request)


@settings(
    max_examples=int(os.environ.get("RECEIVER_EXAMPLES", 100)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@pytest.mark.slow
@given(data=st.data())
def test_random_batches_and_reconnects_rebuild_the_corpus_files(corpus_dir, data):
    which = data.draw(st.sampled_from(["mysql-gtid", "mysql-position", "mariadb-chain"]), label="stream")
    hypothesis.event(which)
    if which == "mariadb-chain":
        files = [(_name(rel), read(corpus_dir, rel)) for rel in MARIA_CHAIN[1:]]
        expected_gtids = scan_file(corpus_dir / MARIA_CHAIN[-1]).gtids_after
    else:
        files = [(_name(MYSQL80), read(corpus_dir, MYSQL80))]
        expected_gtids = scan_file(corpus_dir / MYSQL80).gtids_after
    with tempfile.TemporaryDirectory() as tmp:
        relay = _Relay(Path(tmp) / "relay", files, gtid_mode=which == "mysql-gtid")
        stream = relay.connect()
        reconnects = data.draw(st.integers(0, 4), label="reconnects")
        while True:
            # The connection drops after `cut` more events (a partial packet never reaches feed()).
            cut = data.draw(st.integers(0, len(stream)), label="cut") if reconnects else len(stream)
            pos = 0
            while pos < cut:
                n = data.draw(st.integers(1, 256), label="batch")
                batch = stream[pos : min(pos + n, cut)]
                relay.receiver.feed(payload(e) for e in batch)
                pos += len(batch)
                if data.draw(st.booleans(), label="sync"):
                    if relay.store.sync_due():
                        relay.store.sync()
            if not reconnects:
                break
            reconnects -= 1
            stream = relay.connect()
        relay.store.sync()
        kinds = {"gtid" if r[2] is not None else "position" for r in relay.requests[1:]}
        for kind in kinds:
            hypothesis.event(f"reconnect by {kind}")
        hypothesis.event(f"duplicates>0: {relay.receiver.counters.duplicates > 0}")
        store = relay.store
        assert store.files() == [name for name, _ in files]
        for name, image in files:
            assert relay_bytes(store, name) == clear_in_use(image), name
        horizon = store.horizon.snapshot()
        assert horizon.coordinates == (files[-1][0], len(files[-1][1]))
        assert horizon.gtids == expected_gtids
        assert relay.receiver.counters.transactions == sum(scan_bytes(image).groups_complete for _, image in files)
        store.close()
