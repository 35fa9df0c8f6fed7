"""Upstream epochs: after a failover the relay's files go on as one sequence, never overwritten.

The relay is repointed to a promoted replica M2 whose binlog has lower numbers (or another basename)
and other offsets. Streams are real corpus files served by the scripted master of ``tests/fakemaster``
(a GTID dump skips the groups the relay has, as MySQL's Binlog_sender does); M1's binlog is the same
corpus file with its groups in another commit order (a parallel applier), so M2's GTID dump leaves a
gap at the start of its file and one in the middle. No servers are needed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog import encoders as ENC
from relayproxy.binlog.gtid import GtidSet
from relayproxy.binlog.reader import scan_bytes, scan_file
from relayproxy.relay import RelayGapError, RelayMismatchError, RelayRecoveryError, RelayStateError, RelayStore
from relayproxy.relay import epoch_switch as ES
from relayproxy.relay import store as S
from relayproxy.relay.catalog import FileCatalog
from relayproxy.relay.epochs import EPOCHS_NAME, Epochs, EpochsError, is_filler, numbered_name, split_name
from relayproxy.upstream.receiver import RelayReceiver, StreamError

from ..support.fakemaster import BinlogIndex, DumpCursor, clear_in_use, make_event, next_binlog, split_events
from ..upstream.test_receiver import MARIA_CHAIN, MYSQL80, group_ends, index_ending_at, master_events, payload, read

U = "83759871-1141-11ed-b12d-0242ac130003"  # the server UUID of the MySQL 8.0 corpus file
OTHER = "11111111-2222-3333-4444-555555555555"
M1 = {"host": "m1.example", "port": 3306, "server_id": 1, "server_uuid": U}
M2 = {"host": "m2.example", "port": 3307, "server_id": 2, "server_uuid": "22222222-0000-0000-0000-000000000002"}
M3 = {"host": "m3.example", "port": 3306, "server_id": 3, "server_uuid": None}
RELAY_ID = 99  # the relay's own server_id: recorded with an epoch, never written into a relay file
SRC_ID = 1  # the server_id of the corpus file's FORMAT_DESCRIPTION (M1's and M2's images), and of eventgen's
MARIA_ID = 10  # the MariaDB corpus chain's
T = 1700000000


# -- streams -----------------------------------------------------------------------------------------------------


@dataclass
class Parts:
    """The MySQL 8.0 corpus file (PREVIOUS_GTIDS U:1-5, 21 groups U:6-26) cut into its events."""

    image: bytes
    fde: bytes
    prev: bytes
    groups: list[list[bytes]]


def mysql_parts(corpus_dir: Path) -> Parts:
    image = read(corpus_dir, MYSQL80)
    events = split_events(image)
    spans = []
    scan_bytes(image, on_group=lambda g: spans.append((g.start, g.end)) if g.complete else None)
    groups = [[ev for off, ev in events if start <= off < end] for start, end in spans]
    parts = Parts(image, events[0][1], events[1][1], groups)
    assert 4 + len(parts.fde) + len(parts.prev) + sum(len(e) for g in groups for e in g) == len(image)
    return parts


def rebuild(fde: bytes, events: list[bytes]) -> bytes:
    """A binlog image from the FDE and events given: log_pos and CRC32 recomputed for each position."""
    out = bytearray(C.BINLOG_MAGIC + fde)
    for ev in events:
        ev = bytearray(ev)
        struct.pack_into("<I", ev, 13, len(out) + len(ev))
        struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
        out += ev
    return bytes(out)


M1_ORDER = [*range(11), 14, 11, 12, 13, *range(15, 21)]  # M1 committed U:20 before U:17-19


def m1_image(p: Parts) -> bytes:
    return rebuild(p.fde, [p.prev] + [ev for i in M1_ORDER for ev in p.groups[i]])


def filler_bytes(start: int, end: int, checksum: bool = True, server_id: int = SRC_ID) -> bytes:
    """A filler as the relay must write it, built here independently of the encoders: timestamp 0, the server_id
    of the file's FORMAT_DESCRIPTION."""
    size = end - start
    head = struct.pack("<IBIIIH", 0, C.IGNORABLE_LOG_EVENT, server_id, size, end & 0xFFFFFFFF, C.LOG_EVENT_IGNORABLE_F)
    body = head + bytes(size - C.HEADER_LEN - (4 if checksum else 0))
    return body + struct.pack("<I", zlib.crc32(body)) if checksum else body


def rotate_bytes(name: str, start: int, server_id: int = SRC_ID, timestamp: int = 0) -> bytes:
    """The ROTATE the relay appends at a switch: a real (not artificial) rotate at the file's end, timestamp 0,
    the server_id of the file's FORMAT_DESCRIPTION (the old master's)."""
    body = struct.pack("<Q", 4) + name.encode()
    size = C.HEADER_LEN + len(body) + 4
    raw = struct.pack("<IBIIIH", timestamp, C.ROTATE_EVENT, server_id, size, start + size, 0) + body
    return raw + struct.pack("<I", zlib.crc32(raw))


def dump_skipping(files: list[tuple[str, bytes]], name: str, drop: set[int]) -> list[bytes]:
    """What a GTID-dumping master sends from ``name``: a by-position dump with the groups at the ``drop``
    indexes of that file left out (for streams the scripted MySQL master cannot produce)."""
    image = dict(files)[name]
    spans = []
    scan_bytes(image, on_group=lambda g: spans.append((g.start, g.end)) if g.complete else None)
    skip = {off for off, _ev in split_events(image) for i in drop if spans[i][0] <= off < spans[i][1]}
    sent = DumpCursor(BinlogIndex(files), file=name, pos=4, gtids=None, server_id=2).take()
    return [s.event for s in sent if not (s.file == name and s.offset in skip)]


def new_relay(path: Path) -> tuple[RelayStore, RelayReceiver]:
    store = RelayStore.open(path)
    return store, RelayReceiver(store, relay_server_id=RELAY_ID)


def stream(receiver: RelayReceiver, events: list[bytes], *, by_position: bool, epoch_master=None) -> None:
    receiver.end_stream()
    receiver.start_stream(announced_checksum="CRC32", semi_sync=False, by_position=by_position,
                          epoch_master=epoch_master)
    receiver.feed(payload(e) for e in events)


def m1_phase(store: RelayStore, receiver: RelayReceiver, m1: bytes) -> None:
    """M1 streams binlog.000004 by position; it dies inside the group after U:20 (12 groups in)."""
    events = master_events([("binlog.000004", m1)], "binlog.000004", 4)
    upto = index_ending_at(events, group_ends(m1)[11]) + 1
    stream(receiver, events[: upto + 1], by_position=True)  # and the GTID event of the next group
    store.sync()
    assert receiver.end_stream() > 0  # the partial group is dropped


def m2_dump(store: RelayStore, image: bytes, name: str = "binlog.000002") -> list[bytes]:
    return master_events([(name, image)], gtids=store.horizon.snapshot().gtids, server_id=2)


def state_of(relay_dir: Path) -> tuple:
    """Everything a restart rebuilds from: files, their bytes, the horizon, the epochs record."""
    store = RelayStore.open(relay_dir)
    try:
        snap = store.horizon.snapshot()
        files = store.files()
        data = {name: store.path(name).read_bytes() for name in files}
        epochs = (relay_dir / EPOCHS_NAME).read_text() if (relay_dir / EPOCHS_NAME).exists() else None
        return files, data, snap.coordinates, snap.text, epochs
    finally:
        store.close()


def failover_run(path: Path, p: Parts) -> tuple[RelayStore, RelayReceiver]:
    store, receiver = new_relay(path)
    m1_phase(store, receiver, m1_image(p))
    store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
    stream(receiver, m2_dump(store, p.image), by_position=False)
    store.sync()
    return store, receiver


# -- epoch 1: no epochs file ----------------------------------------------------------------------------------------


def test_without_an_epochs_file_names_map_identically_and_files_are_unchanged(tmp_path, corpus_dir):
    image = read(corpus_dir, MYSQL80)
    store, receiver = new_relay(tmp_path / "relay")
    stream(receiver, master_events([("binlog.000004", image)], "binlog.000004", 4), by_position=False)
    store.sync()
    assert store.files() == ["binlog.000004"]
    assert store.path("binlog.000004").read_bytes() == clear_in_use(image)
    assert store.epochs.implicit and store.epochs.current.epoch == 1
    assert store.relay_name("binlog.000009") == "binlog.000009"
    assert store.epochs.upstream_name("binlog.000004") == (1, "binlog.000004")
    assert store.upstream_position() == ("binlog.000004", len(image)) == store.horizon.snapshot().coordinates
    assert store.current_upstream_file == "binlog.000004"
    assert receiver.counters.fillers == 0
    store.close()
    assert sorted(os.listdir(tmp_path / "relay")) == [
        "binlog.000004", "relayproxy.checkpoint", "relayproxy.durable", "relayproxy.index"]  # no relayproxy.epochs
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.epochs.implicit and reopened.recovery.warnings == []
    reopened.close()
    assert not (tmp_path / "relay" / EPOCHS_NAME).exists()


# -- the failover -------------------------------------------------------------------------------------------------


def test_failover_to_lower_numbered_files_continues_the_relay_sequence_with_fillers(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    m1 = m1_image(p)
    m1_ends, ends = group_ends(m1), group_ends(p.image)
    store, receiver = new_relay(tmp_path / "relay")
    m1_phase(store, receiver, m1)
    assert store.horizon.snapshot().text == f"{U}:1-16:20"

    epoch = store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
    assert (epoch.epoch, epoch.first_file, epoch.upstream_first_file) == (2, "binlog.000005", "binlog.000002")
    old_end = m1_ends[11] + len(rotate_bytes("binlog.000005", m1_ends[11]))
    # The ROTATE is durable and the horizon is past it before any byte of M2 arrives.
    assert store.horizon.snapshot().coordinates == ("binlog.000004", old_end)
    assert store.epoch_switch_pending and store.current_file_closed
    assert store.relay_name("binlog.000002") == "binlog.000005"

    sent = m2_dump(store, p.image)
    stream(receiver, sent, by_position=False)
    store.sync()

    assert store.files() == ["binlog.000004", "binlog.000005"]
    old = store.path("binlog.000004").read_bytes()
    assert old == clear_in_use(m1)[: m1_ends[11]] + rotate_bytes("binlog.000005", m1_ends[11])
    p0 = 4 + len(p.fde) + len(p.prev)
    expected = (
        C.BINLOG_MAGIC + sent[1] + p.prev  # the FDE as M2 sent it (created cleared: a GTID dump skipped its start)
        + filler_bytes(p0, ends[10])  # U:6-16, which the relay has
        + p.image[ends[10] : ends[13]]  # U:17-19
        + filler_bytes(ends[13], ends[14])  # U:20, which the relay got from M1
        + p.image[ends[14] :]  # U:21-26
    )
    assert store.path("binlog.000005").read_bytes() == expected
    assert receiver.counters.fillers == 2 and receiver.counters.transactions == 12 + 9
    snap = store.horizon.snapshot()
    assert snap.coordinates == ("binlog.000005", len(p.image))
    assert snap.text == f"{U}:1-26"
    assert store.upstream_position() == ("binlog.000002", len(p.image))
    assert store.current_upstream_file == "binlog.000002"
    assert receiver.master_file == "binlog.000002" and receiver.master_position == ("binlog.000002", len(p.image))
    assert store.relay_name("binlog.000003") == "binlog.000006"
    assert store.epochs.upstream_name("binlog.000005") == (2, "binlog.000002")
    assert store.epochs.upstream_name("binlog.000004") == (1, "binlog.000004")
    assert store.warnings == [] and store.join_extra_gtids is None
    doc = json.loads((tmp_path / "relay" / EPOCHS_NAME).read_text())
    assert doc == {
        "format": "relayproxy-epochs", "version": 1, "relay_basename": "binlog", "relay_width": 6,
        "epochs": [
            {"epoch": 1, "first_file": "binlog.000004", "upstream_first_file": "binlog.000004", "master": None,
             "join_gtids": None, "started": None, "relay_server_id": None},
            {"epoch": 2, "first_file": "binlog.000005", "upstream_first_file": "binlog.000002", "master": M2,
             "join_gtids": f"{U}:1-16:20", "started": T, "relay_server_id": RELAY_ID},
        ],
    }
    # GTID bookkeeping for readers: the join file starts at join ∪ its PREVIOUS_GTIDS.
    catalog = FileCatalog(store)
    assert str(catalog.start_of("binlog.000005")[0]) == f"{U}:1-16:20"
    assert str(catalog.start_of("binlog.000004")[0]) == f"{U}:1-5"
    assert str(catalog.purged()) == f"{U}:1-5"
    store.close()

    # Recovery rebuilds exactly the uninterrupted run's state.
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().coordinates == ("binlog.000005", len(p.image))
    assert reopened.horizon.snapshot().text == f"{U}:1-26"
    assert reopened.recovery.warnings == [] and reopened.recovery.truncated_bytes == 0
    assert reopened.epochs == store.epochs and reopened.current_upstream_file == "binlog.000002"
    reopened.close()


def _with_created(fde: bytes, created: int) -> bytes:
    """The FDE as a master sends it from the file's start (create_timestamp set), CRC recomputed."""
    ev = bytearray(fde)
    struct.pack_into("<I", ev, C.HEADER_LEN + 2 + 50, created)
    struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
    return bytes(ev)


@pytest.mark.parametrize("restart", ["none", "before-switch", "after-record"])
def test_relay_written_bytes_depend_only_on_the_history(tmp_path, corpus_dir, restart, monkeypatch):
    """Design invariant 11: two relays (other server_ids, other clocks, one restarted, the join FDE sent with and
    without its create_timestamp) that follow the same masters hold the same bytes: the epoch ROTATE, the
    fillers and the join file's FORMAT_DESCRIPTION depend on the history only."""
    p = mysql_parts(corpus_dir)
    m1 = m1_image(p)
    images = {}
    for name, relay_id, now, created in (("a", 101, T, 0), ("b", 4242, T + 3600.5, T - 86400)):
        path = tmp_path / name
        store, receiver = RelayStore.open(path), None
        receiver = RelayReceiver(store, relay_server_id=relay_id)
        m1_phase(store, receiver, m1)
        if name == "b" and restart == "before-switch":
            store.close()
            store = RelayStore.open(path)
            receiver = RelayReceiver(store, relay_server_id=relay_id)
        if name == "b" and restart == "after-record":
            # A crash right after the epoch record: the ROTATE is appended again on restart, by another clock.
            monkeypatch.setattr(ES.EpochSwitch, "complete_pending_switch", lambda self: None)
            store.begin_epoch(M2, "binlog.000002", relay_server_id=relay_id, now=now)
            monkeypatch.undo()
            store.close()
            store = RelayStore.open(path)
            receiver = RelayReceiver(store, relay_server_id=relay_id + 1)
            now += 77
        store.begin_epoch(M2, "binlog.000002", relay_server_id=relay_id, now=now)
        sent = m2_dump(store, p.image)
        assert sent[1][4] == C.FORMAT_DESCRIPTION_EVENT
        if created:
            sent[1] = _with_created(sent[1], created)  # as a dump from the file's start sends it
        stream(receiver, sent, by_position=False)
        store.sync()
        assert receiver.counters.fillers == 2
        images[name] = {f: store.path(f).read_bytes() for f in store.files()}
        assert store.epochs.current.relay_server_id == relay_id  # who switched: the record only
        store.close()
    assert list(images["a"]) == list(images["b"]) == ["binlog.000004", "binlog.000005"]
    for f in images["a"]:
        assert images["a"][f] == images["b"][f], f
    join = images["a"]["binlog.000005"]
    fde = join[4 : 4 + len(p.fde)]
    assert struct.unpack_from("<I", fde, C.HEADER_LEN + 2 + 50)[0] == 0 and not fde[17] & C.LOG_EVENT_BINLOG_IN_USE_F
    assert scan_bytes(join).ok  # the recomputed CRC holds


def test_the_join_rotate_is_a_function_of_its_inputs():
    """join_rotate: name, offset, the file's FDE and its checksum setting; nothing else reaches the bytes."""
    from relayproxy.binlog.events import FormatDescription
    from ..support import eventgen as G

    fde = FormatDescription.parse(G.fde(), 0)
    one = ES.join_rotate("binlog.000005", fde, 1000, checksum=True)
    assert one == ES.join_rotate("binlog.000005", fde, 1000, checksum=True)
    assert one == rotate_bytes("binlog.000005", 1000, server_id=fde.server_id, timestamp=0)
    other = FormatDescription.parse(G.event(C.FORMAT_DESCRIPTION_EVENT, G.fde()[C.HEADER_LEN:-4], server_id=77), 0)
    assert struct.unpack_from("<I", ES.join_rotate("binlog.000005", other, 1000, checksum=True), 5)[0] == 77
    plain = ES.join_rotate("binlog.000005", fde, 1000, checksum=False)
    assert plain == struct.pack("<IBIIIH", 0, C.ROTATE_EVENT, fde.server_id, 40, 1040, 0) + struct.pack(
        "<Q", 4) + b"binlog.000005"


def test_the_switch_rotate_is_a_valid_event_and_the_old_files_last_transaction_stays(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, _receiver = failover_run(tmp_path / "relay", p)
    path = store.path("binlog.000004")
    store.close()
    events = []
    result = scan_file(path, on_event=events.append)
    assert result.ok and not result.partial_tail and result.warnings == [] and result.boundary_errors == 0
    assert result.groups_complete == 12 and result.rotate_to == ("binlog.000005", 4)
    last = events[-1]
    assert (last.type_code, last.timestamp, last.server_id, last.flags) == (C.ROTATE_EVENT, 0, SRC_ID, 0)
    assert last.log_pos == last.end == os.path.getsize(path) == result.good_end and last.crc_ok is True
    assert last.boundary == B.EVENT_OUTSIDE
    before = events[-2]  # U:20 (a DDL), the last transaction M1 sent whole, ends where the ROTATE begins
    assert before.boundary == B.GROUP_END and before.end == last.offset
    assert path.read_bytes()[: last.offset] == clear_in_use(m1_image(p))[: last.offset]
    assert str(result.gtids_after) == f"{U}:1-16:20"


def test_fillers_are_outside_every_group_and_scanned_with_their_crc(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, _receiver = failover_run(tmp_path / "relay", p)
    path = store.path("binlog.000005")
    store.close()
    events, groups = [], []
    result = scan_file(path, on_event=events.append, on_group=groups.append)
    fillers = [e for e in events if is_filler((e.timestamp, e.type_code, e.server_id, e.size, e.log_pos, e.flags))]
    ends = group_ends(p.image)
    p0 = 4 + len(p.fde) + len(p.prev)
    assert [(e.offset, e.end) for e in fillers] == [(p0, ends[10]), (ends[13], ends[14])]
    assert all(e.crc_ok is True and e.boundary == B.EVENT_OUTSIDE and e.server_id == SRC_ID for e in fillers)
    assert all(is_filler(e.data) for e in fillers)
    assert not any(g.start <= f.offset < g.end for g in groups for f in fillers)
    assert result.ok and result.groups_complete == 9 and result.boundary_errors == 0
    assert str(result.start_gtids) == f"{U}:1-5"  # the file's own PREVIOUS_GTIDS is M2's, kept byte for byte


def test_failover_to_another_basename_maps_the_masters_rotation(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, receiver = new_relay(tmp_path / "relay")
    m1_phase(store, receiver, m1_image(p))
    # M2 committed U:20 last: the GTID dump skips it right before M2's ROTATE, which lands after a filler.
    order = [*range(14), *range(15, 21), 14]
    first = rebuild(p.fde, [p.prev] + [ev for i in order for ev in p.groups[i]] + [make_event(
        C.ROTATE_EVENT, struct.pack("<Q", 4) + b"mysql-bin.000008", server_id=2, timestamp=T)])
    second = next_binlog(first, scan_bytes(p.image).gtids_after)
    files = [("mysql-bin.000007", first), ("mysql-bin.000008", second)]
    store.begin_epoch(M2, "mysql-bin.000007", relay_server_id=RELAY_ID, now=T)
    stream(receiver, master_events(files, gtids=store.horizon.snapshot().gtids, server_id=2), by_position=False)
    store.sync()
    assert store.files() == ["binlog.000004", "binlog.000005", "binlog.000006"]
    assert store.relay_name("mysql-bin.000009") == "binlog.000007"
    assert store.epochs.upstream_name("binlog.000006") == (2, "mysql-bin.000008")
    assert store.path("binlog.000006").read_bytes() == clear_in_use(second)
    # M2's own ROTATE names M2's next file; the relay file keeps it byte for byte at M2's offset.
    events = []
    assert scan_file(store.path("binlog.000005"), on_event=events.append).rotate_to == ("mysql-bin.000008", 4)
    assert [e.type_code for e in events[-2:]] == [C.IGNORABLE_LOG_EVENT, C.ROTATE_EVENT]
    assert store.path("binlog.000005").read_bytes()[events[-1].offset :] == first[events[-1].offset :]
    u20 = sum(len(ev) for ev in p.groups[14])
    assert (events[-2].offset, events[-2].size) == (len(first) - events[-1].size - u20, u20)
    assert receiver.counters.fillers == 2
    assert store.upstream_position() == ("mysql-bin.000008", len(second))
    assert store.horizon.snapshot().text == f"{U}:1-26"
    with pytest.raises(EpochsError, match="not in the series of epoch 2"):
        store.relay_name("binlog.000003")
    with pytest.raises(StreamError, match="master switched to mysql-bin.000006: .* is before 'mysql-bin.000007'"):
        stream(receiver, [ENC.artificial_rotate("mysql-bin.000006", 4, 2, True)], by_position=False)
    store.close()
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.recovery.warnings == []  # M2's ROTATE maps to the relay's next file: nothing to report
    assert reopened.horizon.snapshot().coordinates == ("binlog.000006", len(second))
    reopened.close()


def test_gaps_still_raise_in_by_position_streams_inside_groups_and_before_other_events(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, receiver = new_relay(tmp_path / "relay")
    m1_phase(store, receiver, m1_image(p))
    store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
    sent = m2_dump(store, p.image)
    assert [e[4] for e in sent[:5]] == [C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT,
                                        C.HEARTBEAT_LOG_EVENT, C.GTID_LOG_EVENT]  # U:6-16 skipped, then U:17
    p0 = 4 + len(p.fde) + len(p.prev)
    ends = group_ends(p.image)
    with pytest.raises(RelayGapError, match=rf"binlog.000005: event at offset {ends[10]}, but stored data ends at {p0}"):
        stream(receiver, sent, by_position=True)
    assert store.current_end == p0 and receiver.counters.fillers == 0
    # A GTID dump whose jump lands inside a group: U:21 (the first DML) loses its TABLE_MAP.
    g21 = [(off, ev) for off, ev in split_events(p.image) if ends[14] <= off < ends[15]]
    assert [ev[4] for _, ev in g21] == [C.GTID_LOG_EVENT, C.QUERY_EVENT, C.TABLE_MAP_EVENT, C.WRITE_ROWS_EVENT,
                                        C.XID_EVENT]
    i21 = sent.index(g21[0][1])
    with pytest.raises(RelayGapError, match=rf"event at offset {g21[3][0]}, but stored data ends at {g21[2][0]}"):
        stream(receiver, sent[: i21 + 2] + [g21[3][1]], by_position=False)
    assert receiver.counters.fillers == 2  # before U:17 and before U:21, at boundaries; none inside U:21
    receiver.end_stream()
    store.sync()
    assert store.horizon.snapshot().text == f"{U}:1-20"
    assert os.path.getsize(store.path("binlog.000005")) == ends[14]
    # A GTID dump whose first event after the jump cannot begin a group (U:21's XID).
    again = m2_dump(store, p.image)
    assert again[3][4] == C.HEARTBEAT_LOG_EVENT and again[4] == g21[0][1]
    with pytest.raises(RelayGapError, match=rf"event at offset {g21[-1][0]}, but stored data ends at {ends[14]}"):
        stream(receiver, again[:4] + [g21[-1][1]], by_position=False)
    assert receiver.counters.fillers == 2
    # The stream as sent completes the file as an uninterrupted run does.
    stream(receiver, m2_dump(store, p.image), by_position=False)
    store.sync()
    assert store.horizon.snapshot().text == f"{U}:1-26" and receiver.counters.fillers == 2
    done, _ = failover_run(tmp_path / "done", p)
    assert store.path("binlog.000005").read_bytes() == done.path("binlog.000005").read_bytes()
    done.close()
    store.close()


def test_mariadb_join_with_a_leading_gap_and_another_basename(tmp_path, corpus_dir):
    name = os.path.basename(MARIA_CHAIN[1])  # mariadb-repl-bin.000005
    image = read(corpus_dir, MARIA_CHAIN[1])
    spans = []
    scan_bytes(image, on_group=lambda g: spans.append((g.start, g.end)) if g.complete else None)
    store, receiver = new_relay(tmp_path / "relay")
    events = master_events([(name, image)], name, 4)
    stream(receiver, events[: index_ending_at(events, spans[39][1]) + 3], by_position=True)
    store.sync()
    assert store.horizon.snapshot().text == "0-10-262620" == str(scan_bytes(image[: spans[39][1]]).gtids_after)
    assert receiver.end_stream() > 0  # M1 died inside the next group
    m2 = {"host": "maria2", "port": 3306, "server_id": 11, "server_uuid": None}
    store.begin_epoch(m2, "mariadb-bin.000001", relay_server_id=RELAY_ID, now=T)
    files = [("mariadb-bin.000001", image)]
    stream(receiver, dump_skipping(files, "mariadb-bin.000001", set(range(40))), by_position=False)
    store.sync()
    assert store.files() == [name, "mariadb-repl-bin.000006"]
    join = store.path("mariadb-repl-bin.000006").read_bytes()
    # A BINLOG_CHECKPOINT sits between the first two groups (outside any group): it is kept between two fillers.
    assert (spans[0][1], spans[1][0]) == (1196, 1246)
    assert join == (image[: spans[0][0]] + filler_bytes(spans[0][0], 1196, server_id=MARIA_ID) + image[1196:1246]
                    + filler_bytes(1246, spans[39][1], server_id=MARIA_ID) + image[spans[39][1] :])
    assert receiver.counters.fillers == 2
    assert store.horizon.snapshot().text == "0-10-262667" == str(scan_bytes(image).gtids_after)
    assert str(FileCatalog(store).start_of("mariadb-repl-bin.000006")[0]) == "0-10-262620"
    result = scan_file(store.path("mariadb-repl-bin.000006"))
    assert result.ok and result.boundary_errors == 0 and result.groups_complete == 87 - 40
    store.close()
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().text == "0-10-262667" and reopened.recovery.warnings == []
    assert reopened.upstream_position() == ("mariadb-bin.000001", len(image))
    reopened.close()


def test_a_join_set_naming_gtids_the_relay_never_had_is_recorded_not_refused(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, receiver = new_relay(tmp_path / "relay")
    m1_phase(store, receiver, m1_image(p))
    ts, _t, sid, _size, _pos, flags = struct.unpack_from("<IBIIIH", p.prev)
    prev = make_event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet(f"{U}:1-5,{OTHER}:1-3").encode(), server_id=sid,
                      timestamp=ts, flags=flags)
    image = rebuild(p.fde, [prev] + [ev for g in p.groups for ev in g])
    store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
    drop = {i for i, gno in enumerate(range(6, 27)) if gno <= 16 or gno == 20}
    stream(receiver, dump_skipping([("binlog.000002", image)], "binlog.000002", drop), by_position=False)
    store.sync()
    assert str(store.join_extra_gtids) == f"{OTHER}:1-3"
    assert store.warnings == [
        (f"binlog.000005 (epoch 2) starts with PREVIOUS_GTIDS {OTHER}:1-3,{U}:1-5, which names "
         f"{OTHER}:1-3 that the relay never had: counted as purged")
    ]
    assert store.horizon.snapshot().text == f"{OTHER}:1-3,{U}:1-26"
    assert str(FileCatalog(store).purged()) == f"{OTHER}:1-3,\n{U}:1-5"
    store.close()
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().text == f"{OTHER}:1-3,{U}:1-26"
    assert reopened.recovery.warnings == [
        (f"binlog.000005 (epoch 2) starts with the GTID set {OTHER}:1-3,{U}:1-5, which names {OTHER}:1-3 that "
         "the relay never had: counted as purged")
    ]
    assert str(reopened.join_extra_gtids) == f"{OTHER}:1-3"
    # Only the first file of an epoch may start behind the relay: the next one must continue it.
    reopened.start_file("binlog.000003")
    behind = next_binlog(image, GtidSet(f"{U}:1-26"))
    reopened.write_event(4, split_events(behind)[0][1])
    with pytest.raises(RelayMismatchError, match="does not continue the relay's set"):
        reopened.write_event(*split_events(behind)[1])
    reopened.close()


# -- recovery ------------------------------------------------------------------------------------------------------


def _expected_at(p: Parts, cut: int) -> tuple[int, str]:
    """(good end, GTID set text) of the join file cut at ``cut``, from the uninterrupted file's layout."""
    ends = group_ends(p.image)
    p0 = 4 + len(p.fde) + len(p.prev)
    outside = [4 + len(p.fde), p0, ends[10], ends[14]]  # FDE, PREVIOUS_GTIDS and the two fillers end there
    sent = [ends[11], ends[12], ends[13], *ends[15:]]  # groups M2 sent: U:17-19, U:21-26
    good = max([4] + [e for e in outside + sent if e <= cut])
    gnos = [16 + i for i, e in zip((1, 2, 3, 5, 6, 7, 8, 9, 10), sent) if e <= cut]
    gtids = GtidSet(f"{U}:1-16:20")
    for gno in gnos:
        gtids.add(U, gno)
    return good, gtids.format(",")


def test_recovery_of_two_epochs_rebuilds_the_gtid_set_of_an_uninterrupted_run(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, _receiver = failover_run(tmp_path / "done", p)
    store.close()
    final = state_of(tmp_path / "done")
    join_len = len(final[1]["binlog.000005"])
    ends = group_ends(p.image)
    p0 = 4 + len(p.fde) + len(p.prev)
    cuts = sorted({4, 4 + len(p.fde), p0 - 3, p0, p0 + 1, p0 + 500, ends[10], ends[10] + 30, ends[13], ends[13] + 7,
                   ends[14], ends[16] - 1, ends[16], join_len - 1})
    for cut in cuts:
        d = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "done", d)
        with open(d / "binlog.000005", "r+b") as f:
            f.truncate(cut)
        store, receiver = new_relay(d)
        good, text = _expected_at(p, cut)
        assert store.horizon.snapshot().coordinates == ("binlog.000005", good), cut
        assert store.horizon.snapshot().text == text, cut
        assert store.upstream_position() == ("binlog.000002", good)
        # M2 is asked for what the relay lacks and the file ends up exactly as without the crash.
        stream(receiver, m2_dump(store, p.image), by_position=False)
        store.close()
        assert state_of(d) == final, cut


# -- crash safety of the switch ------------------------------------------------------------------------------------


class Crash(Exception):
    """The process is killed here."""


def kill(store: RelayStore) -> None:
    """What kill -9 leaves: the files as written so far (the page cache survives), buffered bytes lost."""
    w = store._w
    if w.fd >= 0:
        os.close(w.fd)
        w.fd = -1
    store._marks.close()
    w.closed = True
    w.appendable = False


CUTS = ["before-record", "after-record", "rotate-unsynced", "rotate-torn", "rotate-lost", "after-begin",
        "file-created-unlisted", "file-created-listed"]


@pytest.mark.parametrize("resume", ["begin_epoch-again", "stream-directly"])
@pytest.mark.parametrize("cut", CUTS)
def test_begin_epoch_killed_at_every_step_completes_the_switch_identically(tmp_path, corpus_dir, monkeypatch,
                                                                             cut, resume):
    p = mysql_parts(corpus_dir)
    done, _ = failover_run(tmp_path / "done", p)
    done.close()
    expected = state_of(tmp_path / "done")

    d = tmp_path / "crashed"
    store, receiver = new_relay(d)
    m1_phase(store, receiver, m1_image(p))
    rotate_at = store.current_end
    real_write_epochs, real_append = ES.write_epochs, ES.EpochSwitch.append_join_rotate

    def write_epochs(relay_dir, epochs):
        if cut == "before-record":
            raise Crash
        real_write_epochs(relay_dir, epochs)
        raise Crash

    def append_rotate(self, epoch):
        real_append(self, epoch)
        self._w.flush()  # in the page cache, not fsynced
        raise Crash

    if cut in ("before-record", "after-record"):
        monkeypatch.setattr(ES, "write_epochs", write_epochs)
    elif cut.startswith("rotate"):
        monkeypatch.setattr(ES.EpochSwitch, "append_join_rotate", append_rotate)
    try:
        store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
        if cut.startswith("file-created"):
            def write_index(relay_dir, names):
                if cut == "file-created-listed":
                    real_write_index(relay_dir, names)
                raise Crash

            real_write_index = S.write_index
            monkeypatch.setattr(S, "write_index", write_index)
            stream(receiver, m2_dump(store, p.image)[:1], by_position=False)  # the ROTATE to binlog.000002
        raise Crash
    except Crash:
        kill(store)
    monkeypatch.undo()
    old = d / "binlog.000004"
    if cut == "rotate-torn":
        with open(old, "r+b") as f:
            f.truncate(rotate_at + 20)  # power lost while the ROTATE was written
    elif cut == "rotate-lost":
        with open(old, "r+b") as f:
            f.truncate(rotate_at)

    store, receiver = new_relay(d)
    rotate_end = rotate_at + len(rotate_bytes("binlog.000005", rotate_at))
    if cut.startswith("file-created"):
        assert store.recovery.adopted == (["binlog.000005"] if cut == "file-created-unlisted" else [])
        assert store.files() == ["binlog.000004", "binlog.000005"] and store.current_end == 4
        assert store.epoch_switch_pending  # the new file holds nothing yet
    else:
        assert store.files() == ["binlog.000004"]
        # The ROTATE survives a kill whole (page cache); a torn one is cut as crash debris.
        survived = cut in ("rotate-unsynced", "after-begin")
        assert store.current_end == (rotate_end if survived else rotate_at)
        assert store.recovery.truncated_bytes == (20 if cut == "rotate-torn" else 0)
        assert store.epoch_switch_pending == (cut != "before-record")
    recorded = cut != "before-record"
    assert store.epochs.current.epoch == (2 if recorded else 1)
    if resume == "begin_epoch-again" or not recorded:
        store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
        if not cut.startswith("file"):
            assert store.horizon.snapshot().coordinates == ("binlog.000004", rotate_end)
        stream(receiver, m2_dump(store, p.image), by_position=False)
    else:
        # The session reconnects to M2, the current epoch's master: it only streams.
        stream(receiver, m2_dump(store, p.image), by_position=False, epoch_master=M2)
    store.close()
    assert state_of(d) == expected


@pytest.mark.parametrize("restart", [False, True])
def test_a_resume_by_position_in_a_later_epoch_covers_the_groups_the_relay_holds_with_fillers(tmp_path, corpus_dir,
                                                                                              restart):
    """The GTID dump that joined M2 sent M2's head (FDE, PREVIOUS_GTIDS) and was then skipping M2's copies of
    M1's transactions when the connection ended (kill -9 of the relay, or a network cut). When the relay then
    resumes by position in M2's file (ResumeByPosition: M2's next GTID dump began at a later file), M2 sends
    those copies again, this time whole: the relay covers them with fillers, exactly as the GTID dump would have
    (stored, a file/position replica of the relay would apply M1's transactions twice)."""
    p = mysql_parts(corpus_dir)
    done, _ = failover_run(tmp_path / "done", p)
    done.close()
    expected = state_of(tmp_path / "done")

    d = tmp_path / "resumed"
    store, receiver = new_relay(d)
    m1_phase(store, receiver, m1_image(p))
    store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
    sent = m2_dump(store, p.image)
    p0 = 4 + len(p.fde) + len(p.prev)
    stream(receiver, sent[:3], by_position=False)  # the artificial ROTATE, the FDE, PREVIOUS_GTIDS
    store.sync()
    assert store.horizon.snapshot().coordinates == ("binlog.000005", p0)
    if restart:
        kill(store)
        store, receiver = new_relay(d)
    resent = master_events([("binlog.000002", p.image)], "binlog.000002", p0, server_id=2)
    stream(receiver, resent, by_position=True)
    store.sync()
    assert receiver.counters.fillers == 2
    store.close()
    assert state_of(d) == expected


def test_the_receiver_begins_the_epoch_at_the_first_rotate_of_a_new_master(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    done, _ = failover_run(tmp_path / "done", p)
    done.close()
    m1 = m1_image(p)
    store, receiver = new_relay(tmp_path / "relay")
    events = master_events([("binlog.000004", m1)], "binlog.000004", 4)
    # A new relay records its first master (epoch 1, identity names) when the first stream begins.
    stream(receiver, events[: index_ending_at(events, group_ends(m1)[5]) + 1], by_position=True, epoch_master=M1)
    assert store.epochs.current.master_dict == M1 and store.epochs.current.first_file == "binlog.000004"
    store.sync()
    resumed = master_events([("binlog.000004", m1)], *store.horizon.snapshot().coordinates)
    stream(receiver, resumed[: index_ending_at(resumed, group_ends(m1)[11]) + 1], by_position=True, epoch_master=M1)
    assert len(store.epochs.epochs) == 1  # the same master again: no new epoch
    store.sync()
    stream(receiver, m2_dump(store, p.image), by_position=False, epoch_master=M2)
    store.sync()
    assert [(e.epoch, e.first_file, e.master_dict) for e in store.epochs.epochs] == [
        (1, "binlog.000004", M1), (2, "binlog.000005", M2)]
    assert store.files() == ["binlog.000004", "binlog.000005"]
    assert store.path("binlog.000005").read_bytes() == (tmp_path / "done" / "binlog.000005").read_bytes()
    rotate = scan_file(store.path("binlog.000004"))
    assert rotate.ok and rotate.rotate_to == ("binlog.000005", 4)
    store.close()


# -- begin_epoch rules ---------------------------------------------------------------------------------------------


def test_begin_epoch_rules_idempotence_reanchoring_and_empty_relays(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    # An empty relay: epoch 1 with identity names, no ROTATE anywhere.
    store, receiver = new_relay(tmp_path / "empty")
    first = store.begin_epoch(M1, "binlog.000003", relay_server_id=RELAY_ID, now=T)
    assert (first.epoch, first.first_file, first.master_dict) == (1, "binlog.000003", M1)
    stream(receiver, master_events([("binlog.000004", p.image)], "binlog.000004", 4), by_position=True)
    assert store.epochs.current.first_file == "binlog.000004"  # the master began elsewhere: the record follows
    assert store.files() == ["binlog.000004"]
    store.close()

    store, receiver = new_relay(tmp_path / "relay")
    m1_phase(store, receiver, m1_image(p))
    size = os.path.getsize(store.path("binlog.000004"))
    epoch = store.begin_epoch(M2, "binlog.000003", relay_server_id=RELAY_ID, now=T)
    assert store.begin_epoch(M2, "binlog.000003", relay_server_id=RELAY_ID, now=T + 50) == epoch  # idempotent
    assert os.path.getsize(store.path("binlog.000004")) == size + 44  # one ROTATE
    # Another master before any byte of M2 arrived replaces the unused record (same relay file).
    epoch3 = store.begin_epoch(M3, "relay-bin.000001", relay_server_id=RELAY_ID, now=T + 60)
    assert (epoch3.epoch, epoch3.first_file, epoch3.master_dict) == (2, "binlog.000005", M3)
    epoch = store.begin_epoch(M2, "binlog.000003", relay_server_id=RELAY_ID, now=T + 70)
    assert (epoch.epoch, epoch.first_file, epoch.started) == (2, "binlog.000005", T + 70)
    assert os.path.getsize(store.path("binlog.000004")) == size + 44
    # M2's GTID dump begins at binlog.000002, not 000003 as announced: the unused record follows it.
    stream(receiver, m2_dump(store, p.image), by_position=False)
    assert store.epochs.current.upstream_first_file == "binlog.000002"
    assert store.files() == ["binlog.000004", "binlog.000005"]
    store.sync()
    with pytest.raises(RelayStateError, match="no sequence number"):
        store.begin_epoch(M1, "binlog", relay_server_id=RELAY_ID)
    # An open group must be discarded first.
    store.write_event(*_group_at(store.current_end, 27)[0])
    with pytest.raises(RelayStateError, match="call discard_incomplete"):
        store.begin_epoch(M1, "binlog.000009", relay_server_id=RELAY_ID)
    assert store.discard_incomplete() > 0
    assert len(store.epochs.epochs) == 2
    store.close()


@pytest.mark.parametrize("started", [True, False], ids=["next-file-empty", "next-file-not-started"])
def test_a_master_that_rotated_and_died_hands_its_next_name_to_the_new_epoch(tmp_path, corpus_dir, started):
    """M1 rotated (its ROTATE to binlog.000005 is stored) and died before binlog.000005 got its FDE, or before
    the relay started it: binlog.000005 begins epoch 2 and no second ROTATE is appended."""
    p = mysql_parts(corpus_dir)
    closed = rebuild(p.fde, [p.prev] + [ev for g in p.groups[:11] for ev in g] + [
        make_event(C.ROTATE_EVENT, struct.pack("<Q", 4) + b"binlog.000005", server_id=1, timestamp=T)])
    store, receiver = new_relay(tmp_path / "relay")
    events = master_events([("binlog.000004", closed), ("binlog.000005", C.BINLOG_MAGIC + p.fde)], "binlog.000004", 4)
    stream(receiver, events[:-1] if started else events[:-2], by_position=True)
    store.sync()
    assert store.files() == (["binlog.000004", "binlog.000005"] if started else ["binlog.000004"])
    epoch = store.begin_epoch(M2, "binlog.000002", relay_server_id=RELAY_ID, now=T)
    assert epoch.first_file == "binlog.000005"
    assert store.path("binlog.000004").read_bytes() == clear_in_use(closed)  # M1's ROTATE already names it
    sent = m2_dump(store, p.image)
    stream(receiver, sent, by_position=False)
    store.sync()
    assert store.files() == ["binlog.000004", "binlog.000005"]
    assert store.horizon.snapshot().text == f"{U}:1-26"
    assert store.epochs.upstream_name("binlog.000005") == (2, "binlog.000002")
    p0, ends = 4 + len(p.fde) + len(p.prev), group_ends(p.image)
    expected = C.BINLOG_MAGIC + sent[1] + p.prev + filler_bytes(p0, ends[10]) + p.image[ends[10] :]
    assert store.path("binlog.000005").read_bytes() == expected
    store.close()
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.recovery.warnings == [] and reopened.horizon.snapshot().text == f"{U}:1-26"
    reopened.close()


def test_purge_drops_epochs_whose_files_are_all_gone(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, _receiver = failover_run(tmp_path / "relay", p)
    assert store.purge_to("binlog.000005") == ["binlog.000004"]
    doc = json.loads((tmp_path / "relay" / EPOCHS_NAME).read_text())
    assert [e["epoch"] for e in doc["epochs"]] == [2]
    assert (doc["relay_basename"], doc["relay_width"]) == ("binlog", 6)
    assert store.relay_name("binlog.000004") == "binlog.000007"
    assert str(FileCatalog(store).purged()) == f"{U}:1-16:20"  # the join file's start: join ∪ PREVIOUS_GTIDS
    store.close()
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.upstream_position() == ("binlog.000002", len(p.image))
    assert reopened.horizon.snapshot().text == f"{U}:1-26"
    with pytest.raises(EpochsError):
        reopened.epochs.upstream_name("binlog.000004")
    reopened.close()


def test_a_damaged_epochs_file_refuses_to_open(tmp_path, corpus_dir):
    p = mysql_parts(corpus_dir)
    store, _ = failover_run(tmp_path / "relay", p)
    store.close()
    (tmp_path / "relay" / (EPOCHS_NAME + ".tmp")).write_text("half")
    text = (tmp_path / "relay" / EPOCHS_NAME).read_text()
    (tmp_path / "relay" / EPOCHS_NAME).write_text(text[:50])
    with pytest.raises(RelayRecoveryError, match="cannot read the relay's upstream epochs"):
        RelayStore.open(tmp_path / "relay")
    evil = json.loads(text)
    evil["relay_basename"] = "../elsewhere"
    (tmp_path / "relay" / EPOCHS_NAME).write_text(json.dumps(evil))
    with pytest.raises(RelayRecoveryError, match="relay_basename '../elsewhere' is not a plain file name"):
        RelayStore.open(tmp_path / "relay")
    (tmp_path / "relay" / EPOCHS_NAME).write_text(text)
    reopened = RelayStore.open(tmp_path / "relay")
    assert not (tmp_path / "relay" / (EPOCHS_NAME + ".tmp")).exists()
    reopened.close()


# -- fillers -------------------------------------------------------------------------------------------------------


def _store_after_header(path: Path, checksum: bool = True) -> tuple[RelayStore, int]:
    image = ENC_image(checksum)
    store = RelayStore.open(path)
    store.start_file("binlog.000001")
    for off, ev in split_events(image):
        store.write_event(off, ev)
        store.boundary_outside(off + len(ev))
    return store, len(image)


def ENC_image(checksum: bool) -> bytes:
    from ..support import eventgen as G

    return G.binlog_file(G.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet(f"{U}:1-5").encode(), checksum=checksum),
                         checksum=checksum)


def _group_at(offset: int, gno: int, checksum: bool = True) -> list[tuple[int, bytes]]:
    from ..support import eventgen as G

    out = []
    for ev in (G.gtid(gno, bytes.fromhex(U.replace("-", "")), checksum=checksum),
               G.query("BEGIN", checksum=checksum), G.xid(checksum=checksum)):
        ev = bytearray(ev)
        struct.pack_into("<I", ev, 13, (offset + len(ev)) & 0xFFFFFFFF)
        if checksum:
            struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
        out.append((offset, bytes(ev)))
        offset += len(ev)
    return out


def test_a_large_filler_is_sparse_and_recovery_checks_its_crc(tmp_path):
    store, end = _store_after_header(tmp_path / "relay")
    gap = 40 << 20
    assert store.write_filler(end + gap, relay_server_id=7) == 1
    group = _group_at(end + gap, 6)
    for off, ev in group:
        store.write_event(off, ev)
    store.group_complete(group[-1][0] + len(group[-1][1]), (bytes.fromhex(U.replace("-", "")), 6))
    store.sync()
    path = store.path("binlog.000001")
    store.close()
    assert os.stat(path).st_blocks * 512 < (1 << 20)  # a hole, not 40 MB of zeros
    events = []
    result = scan_file(path, on_event=events.append)
    filler = events[2]
    assert (filler.offset, filler.size, filler.server_id, filler.streamed, filler.crc_ok) == (end, gap, SRC_ID, True, True)
    with open(path, "rb") as f:
        f.seek(end)
        assert f.read(C.HEADER_LEN + 8) == filler_bytes(end, end + gap)[: C.HEADER_LEN + 8]
        f.seek(end + gap - 4)
        assert f.read(4) == filler_bytes(end, end + gap)[-4:]
    assert result.ok and result.groups_complete == 1
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().coordinates == ("binlog.000001", end + gap + sum(len(e) for _, e in group))
    assert reopened.horizon.snapshot().text == f"{U}:1-6"
    reopened.close()


def test_a_gap_beyond_one_event_is_split_and_small_gaps_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ES, "FILLER_MAX_SIZE", (1 << 20) + 7)
    store, end = _store_after_header(tmp_path / "relay")
    gap = (7 << 19) + 3  # 3.5 MB: four events of at most 1 MB + 7
    assert store.write_filler(end + gap, relay_server_id=7) == 4
    assert store.current_end == store.boundary_end == end + gap
    with pytest.raises(RelayGapError):
        store.write_filler(store.current_end + 22, relay_server_id=7)  # a CRC32 event needs 23 bytes
    store.write_filler(store.current_end + 23, relay_server_id=7)
    store.sync()
    path = store.path("binlog.000001")
    store.close()
    events = []
    assert scan_file(path, on_event=events.append).ok
    fillers = [e for e in events if e.type_code == C.IGNORABLE_LOG_EVENT]
    sizes = [e.size for e in fillers]
    assert sizes == [917505, 917505, 917505, 917504, 23] and sum(sizes[:4]) == gap
    assert all(e.crc_ok and e.log_pos == e.end for e in fillers)
    assert (tmp_path / "relay" / "binlog.000001").read_bytes()[end + gap :] == filler_bytes(end + gap, end + gap + 23)


def test_fillers_without_checksums(tmp_path):
    store, end = _store_after_header(tmp_path / "relay", checksum=False)
    store.write_filler(end + 19, relay_server_id=7)  # the smallest event without a CRC
    store.write_filler(end + 19 + (2 << 20), relay_server_id=7)
    store.sync()
    path = store.path("binlog.000001")
    store.close()
    data = path.read_bytes()
    assert data[end:] == filler_bytes(end, end + 19, False) + filler_bytes(end + 19, end + 19 + (2 << 20), False)
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().position == len(data)
    reopened.close()


def test_the_boundary_parser_keeps_fillers_outside_groups_in_both_flavours():
    ev = ENC.filler(40, log_pos=140, server_id=7, checksum=True)
    assert is_filler(ev) and is_filler(struct.unpack_from("<IBIIIH", ev))
    assert not is_filler(ENC.rotate("binlog.000002", 4, server_id=1, checksum=True))
    plain = bytearray(ev)
    struct.pack_into("<H", plain, 17, 0)
    assert not is_filler(bytes(plain))
    from ..support import eventgen as G

    for flavour in ("mysql", "mariadb"):
        parser = B.TransactionBoundaryParser(flavour)
        assert parser.feed_event(ev) == B.EVENT_OUTSIDE and parser.errors == 0
        assert parser.feed_event(bytes(plain)) & B.FLAG_ERROR  # without the IGNORABLE flag: unsupported
    parser = B.TransactionBoundaryParser("mysql")
    parser.feed_event(G.fde())
    parser.feed_event(G.gtid(1))
    parser.feed_event(G.query("BEGIN"))
    assert parser.feed_event(ev) == B.GROUP_CONTINUE and parser.in_group  # never written there, but harmless
    maria = B.TransactionBoundaryParser("mariadb")
    maria.feed_event(G.fde("10.11.6-MariaDB-log"))
    maria.feed_event(G.maria_gtid(5))
    assert maria.feed_event(ev) == B.GROUP_CONTINUE and maria.in_group


# -- the name mapping ----------------------------------------------------------------------------------------------


epoch_plans = st.lists(
    st.tuples(
        st.sampled_from(["mysql-bin", "binlog", "db2-bin"]),  # the master's basename
        st.integers(1, 10**7),  # its first file's number
        st.integers(1, 6),  # its width (servers write 6 and go wider past 999999)
        st.integers(1, 5),  # files the relay gets from it
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(first=st.integers(1, 999_990), relay_base=st.sampled_from(["mysql-bin", "binlog"]), plans=epoch_plans)
def test_name_mapping_round_trips_and_the_relay_sequence_is_monotonic(first, relay_base, plans):
    epochs = Epochs()
    index = [numbered_name(relay_base, first + i, 6) for i in range(3)]  # epoch 1: the relay's first master
    upstream = {name: (1, name) for name in index}
    for n, (base, up_first, width, count) in enumerate(plans, start=2):
        epochs = epochs.next_epoch(
            index=index, current_empty=False, master={"host": f"m{n}", "port": 3306, "server_id": n},
            upstream_first_file=numbered_name(base, up_first, width), join_gtids=f"{U}:1-{n}", started=1.0 * n,
            relay_server_id=9,
        )
        assert epochs.current.epoch == n and epochs.current.first_file == numbered_name(
            relay_base, split_name(index[-1])[1] + 1, 6)
        for k in range(count):
            name = numbered_name(base, up_first + k, width)
            relay = epochs.relay_name(name)
            assert relay not in upstream
            upstream[relay] = (n, name)
            index.append(relay)
    seqs = [split_name(name)[1] for name in index]
    assert seqs == list(range(first, first + len(index)))  # one monotonic sequence, no hole
    assert all(split_name(name)[0] == relay_base for name in index)
    restored = Epochs.from_json(epochs.to_json())
    assert restored == epochs
    for relay, (n, name) in upstream.items():
        assert restored.upstream_name(relay) == (n, name)
        assert restored.epoch_of(relay).epoch == n
        if n >= 2:
            assert restored.relay_name(name, restored.epoch_of(relay)) == relay
    # After a purge the mapping of what is left is unchanged.
    for cut in range(len(index)):
        pruned = restored.pruned(index[cut])
        assert pruned.current == restored.current
        for relay in index[cut:]:
            assert pruned.upstream_name(relay) == upstream[relay]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=70_000))
def test_extending_a_crc32_by_zeros_equals_zlib(prefix, count):
    from relayproxy.binlog.checksum import crc32_zeros

    start = zlib.crc32(prefix)
    assert crc32_zeros(start, count) == zlib.crc32(bytes(count), start)


def test_a_large_fillers_crc_equals_the_crc_of_its_bytes():
    from relayproxy.binlog.checksum import crc32_zeros

    header = ENC.filler_header(64 << 20, log_pos=(64 << 20) + 4, server_id=RELAY_ID)
    body = bytes((64 << 20) - len(header) - 4)
    assert ENC.filler_crc(header, 64 << 20) == zlib.crc32(body, zlib.crc32(header))
    with pytest.raises(ValueError, match="must not be negative"):
        crc32_zeros(0, -1)
