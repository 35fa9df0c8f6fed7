"""Dump sender: preambles, byte-identical streaming, the horizon, GTID starts and skipping, errors, semi-sync.

Sans-I/O-ish: a fake DumpChannel collects the payloads the sender produces (decoded with the binlog
views) and feeds it ACKs; the relay side is a real RelayStore, filled from real corpus files (MySQL
8.0 GTID, MariaDB 11.8 consecutive files) copied to tmp, or from synthetic streams.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.events import FormatDescription
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.binlog.reader import scan_file
from relayproxy.binlog.views import view_event
from relayproxy.commands.run import SessionRelayView
from relayproxy.downstream import dump as D
from relayproxy.downstream.context import (
    ConnectionState,
    DownstreamContext,
    DumpRequest,
)
from relayproxy.downstream.dump import errors as DE
from relayproxy.ops.status import StatusSources, UpstreamSources, relay_status
from relayproxy.upstream.receiver import ReceiverCounters
from relayproxy.upstream.session import UpstreamStatus
from relayproxy.relay import RelayStore, SyncPolicy
from relayproxy.relay import layout as LA
from relayproxy.wire import packets as P

from ..support import eventgen as E

SID = E.MYSQL_SID
OTHER = bytes(range(100, 116))
RELAY_ID = 99
MARIA = "10.11.6-MariaDB-log"
MARIA_CORPUS = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
MYSQL80 = "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004"  # 8.0.29, GTIDs 6-26
MANUAL_SYNC = SyncPolicy("batch", max_transactions=1 << 30, max_delay=1e9)
CRC32 = {"master_binlog_checksum": "CRC32"}


def uuid_of(sid: bytes) -> str:
    return str(uuid.UUID(bytes=sid))


# ---------------------------------------------------------------------------------------------
# The fake channel and the context


class PlainChannel:
    """A DumpChannel that collects payloads, with none of the extras (the sender then goes event by event and holds
    a large event whole)."""

    def __init__(self, *, fail_after: int | None = None):
        self.payloads: list[bytes] = []
        self.chunks_sent = 0
        self._seq = 0
        self.stream_pieces: list[list[int]] = []
        self._closed = False
        self._incoming: asyncio.Queue = asyncio.Queue()
        self._changed = asyncio.Event()
        self._fail_after = fail_after

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, payload) -> None:
        if self._closed:
            raise ConnectionError("replica gone")
        if self._fail_after is not None and len(self.payloads) >= self._fail_after:
            self._closed = True
            raise ConnectionResetError("connection reset by peer")
        self.payloads.append(bytes(payload))
        self._changed.set()

    async def receive(self, timeout: float | None = None) -> bytes | None:
        try:
            item = await asyncio.wait_for(self._incoming.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if item is None:
            raise ConnectionError("replica closed the connection")
        return item

    def ack(self, file: str, pos: int) -> None:
        self._incoming.put_nowait(bytes([0xEF]) + struct.pack("<Q", pos) + file.encode())

    def close(self) -> None:
        self._closed = True
        self._incoming.put_nowait(None)

    async def wait_until(self, predicate, timeout: float = 5.0) -> None:
        async def loop():
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)


class _Streams:
    """``send_stream`` reassembles a streamed payload and records its piece sizes (dump.StreamingChannel)."""

    async def send_stream(self, total: int, chunks) -> None:
        pieces = [bytes(c) async for c in chunks]
        data = b"".join(pieces)
        assert len(data) == total
        self.stream_pieces.append([len(p) for p in pieces])
        await self.send(data)


class _Chunks:
    """``send_packets`` unframes a shared chunk, checking its packet headers and sequence ids (dump.ChunkChannel)."""

    async def send_packets(self, chunk, omit=frozenset()) -> None:
        first = self._seq
        data, self._seq = chunk.frame_for(first, omit)
        at, seq = 0, first
        while at < len(data):
            length = int.from_bytes(data[at : at + 3], "little")
            assert data[at + 3] == seq, f"packet {seq} numbered {data[at + 3]}"
            assert 0 < length < 0xFFFFFF
            seq = (seq + 1) & 0xFF
            await self.send(bytes(data[at + 4 : at + 4 + length]))
            at += 4 + length
        assert at == len(data) and seq == self._seq
        self.chunks_sent += 1


class FakeChannel(_Chunks, _Streams, PlainChannel):
    """A channel with both extras, as the server's: streamed large events and shared chunks."""


class ChunklessChannel(_Streams, PlainChannel):
    """Streams large events, sends no shared chunk: the sender goes event by event."""


class StreamlessChannel(_Chunks, PlainChannel):
    """Shared chunks, but a large event is held whole and sent through ``send``."""


def make_ctx(store: RelayStore, *, master_uuid: str | None = None, semi_sync: bool = True,
             version: str | None = None) -> DownstreamContext:
    cfg = SimpleNamespace(server_id=RELAY_ID, semi_sync=semi_sync)
    status = UpstreamStatus(master_uuid=master_uuid, master_flavour=None, master_server_version=version)
    upstream = UpstreamSources(status=status, receiver=SimpleNamespace(counters=ReceiverCounters()))
    return DownstreamContext(SessionRelayView(cfg, lambda: store, lambda: upstream,
                                              server_uuid="4f0c8f0e-0000-4000-8000-000000000001"),
                             status_document=lambda: relay_status(cfg, StatusSources(store, upstream)))


def make_conn(**user_vars) -> ConnectionState:
    return ConnectionState(conn_id=7, user_vars=dict(user_vars))


def file_request(name: str = "binlog.000001", pos: int = 4, flags: int = P.BINLOG_DUMP_NON_BLOCK) -> DumpRequest:
    return DumpRequest("file", server_id=2, flags=flags, file=name, position=pos)


def gtid_request(gtids: GtidSet, flags: int = P.BINLOG_DUMP_NON_BLOCK) -> DumpRequest:
    return DumpRequest("mysql-gtid", server_id=2, flags=flags, file="", position=4, gtid_set=gtids.encode())


def maria_request(flags: int = P.BINLOG_DUMP_NON_BLOCK) -> DumpRequest:
    return DumpRequest("mariadb-gtid", server_id=2, flags=flags, file="", position=4)


def run(coro, timeout: float = 10.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def dump_all(ctx, conn, request, channel=None) -> FakeChannel:
    channel = channel or FakeChannel()
    await D.serve_dump(ctx, conn, request, channel)
    return channel


# ---------------------------------------------------------------------------------------------
# Decoding what was sent


class Sent:
    """One payload: semi-sync flag (None without the header), the event bytes, their view."""

    def __init__(self, payload: bytes, fde: FormatDescription | None):
        assert payload[0] == 0x00, f"not an event packet: {payload[:16]!r}"
        if len(payload) > 2 and payload[1] == 0xEF and payload[2] in (0, 1) and len(payload) >= 3 + 19 and (
            struct.unpack_from("<I", payload, 3 + 9)[0] == len(payload) - 3
        ):
            self.ack_flag, self.raw = payload[2], payload[3:]
        else:
            self.ack_flag, self.raw = None, payload[1:]
        self.type = self.raw[4]
        self.size, self.log_pos, self.flags = struct.unpack_from("<IIH", self.raw, 9)
        self.timestamp = struct.unpack_from("<I", self.raw, 0)[0]
        self.server_id = struct.unpack_from("<I", self.raw, 5)[0]
        assert self.size == len(self.raw)
        self.view = view_event(self.raw, 0, fde)

    def __repr__(self) -> str:
        return f"<{C.event_name(self.type)} {self.size}B log_pos={self.log_pos}>"


def decode(payloads: list[bytes]) -> tuple[list[Sent], bytes | None]:
    """Events (FDE-aware decoding) and the final non-event packet (ERR / EOF) if any."""
    events: list[Sent] = []
    fde = None
    tail = None
    for i, payload in enumerate(payloads):
        if payload[0] != 0x00:
            assert i == len(payloads) - 1, "nothing may follow an ERR or EOF"
            tail = payload
            break
        sent = Sent(payload, fde)
        if sent.type == C.FORMAT_DESCRIPTION_EVENT:
            fde = FormatDescription.parse(sent.raw)
        events.append(sent)
    return events, tail


def error_of(tail: bytes | None) -> tuple[int, str]:
    assert tail is not None and tail[0] == 0xFF, f"expected an ERR packet, got {tail!r}"
    code = struct.unpack_from("<H", tail, 1)[0]
    assert tail[3:4] == b"#"
    return code, tail[9:].decode()


def is_eof(tail: bytes | None) -> bool:
    return tail is not None and tail[0] == 0xFE and len(tail) < 9


def crc_ok(raw: bytes) -> bool:
    return zlib.crc32(raw[:-4]) == struct.unpack_from("<I", raw, len(raw) - 4)[0]


def split_events(image: bytes, start: int = 4) -> list[tuple[int, bytes]]:
    out = []
    pos = start
    while pos < len(image):
        size = struct.unpack_from("<I", image, pos + 9)[0]
        out.append((pos, image[pos : pos + size]))
        pos += size
    return out


def expected_rotate(name: str, pos: int, crc: bool = True) -> bytes:
    """An artificial ROTATE built independently of the encoders under test."""
    return E.event(C.ROTATE_EVENT, struct.pack("<Q", pos) + name.encode(), flags=C.LOG_EVENT_ARTIFICIAL_F,
                   server_id=RELAY_ID, log_pos=0, timestamp=0, checksum=crc)


def assert_preamble(events: list[Sent], name: str, pos: int, image: bytes, *, mid_file: bool = False,
                    created_cleared: bool = False) -> int:
    """The fake ROTATE and the FDE copy at events[0:2]; returns the FDE's end in the file."""
    assert events[0].raw == expected_rotate(name, pos)
    fde_size = struct.unpack_from("<I", image, 4 + 9)[0]
    original = bytearray(image[4 : 4 + fde_size])
    flags = struct.unpack_from("<H", original, 17)[0] & ~C.LOG_EVENT_BINLOG_IN_USE_F
    struct.pack_into("<H", original, 17, flags)
    if mid_file:
        struct.pack_into("<I", original, 13, 0)
    if mid_file or created_cleared:
        struct.pack_into("<I", original, 19 + 52, 0)
    struct.pack_into("<I", original, len(original) - 4, zlib.crc32(original[:-4]))
    fde = events[1]
    assert fde.type == C.FORMAT_DESCRIPTION_EVENT and fde.raw == bytes(original)
    assert not fde.flags & C.LOG_EVENT_BINLOG_IN_USE_F and crc_ok(fde.raw)
    return 4 + fde_size


# ---------------------------------------------------------------------------------------------
# Relay stores


def as_sent(image: bytes) -> bytes:
    """A file as a master sends it: the FDE's in-use flag cleared (its CRC was computed with it clear)."""
    flags = struct.unpack_from("<H", image, 4 + 17)[0]
    return image[:21] + struct.pack("<H", flags & ~C.LOG_EVENT_BINLOG_IN_USE_F) + image[23:]


def with_created(image: bytes, created: int) -> bytes:
    """The file with a non-zero FDE create_timestamp (a file written at server start)."""
    out = bytearray(image)
    size = struct.unpack_from("<I", out, 4 + 9)[0]
    struct.pack_into("<I", out, 4 + 19 + 52, created)
    struct.pack_into("<I", out, 4 + size - 4, zlib.crc32(out[4 : 4 + size - 4]))
    return bytes(out)


def relay_with(tmp_path: Path, files: dict[str, bytes], **kw) -> RelayStore:
    """A relay directory holding ``files`` (index order = dict order), opened: recovery sets the horizon."""
    d = tmp_path / "relay"
    d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    (d / LA.INDEX_NAME).write_text("".join(f"{n}\n" for n in files))
    return RelayStore.open(d, **kw)


class Feeder:
    """What the upstream session does per event: write, boundary parser, group ends; no automatic sync."""

    def __init__(self, store: RelayStore):
        self.store = store
        self.parser = B.TransactionBoundaryParser()

    def feed(self, offset: int, event: bytes) -> None:
        self.store.write_event(offset, event)
        kind = self.parser.feed_event(event, 0) & B.RESULT_MASK
        end = offset + len(event)
        if kind == B.GROUP_END:
            self.store.group_complete(end, self.parser.gtid)
        elif kind == B.EVENT_OUTSIDE:
            self.store.boundary_outside(end)

    def feed_events(self, events: list[tuple[int, bytes]]) -> None:
        for offset, event in events:
            self.feed(offset, event)


def live_store(tmp_path: Path, name: str = "binlog.000001") -> tuple[RelayStore, Feeder]:
    store = RelayStore.open(tmp_path / "relay", sync=MANUAL_SYNC)
    store.start_file(name)
    return store, Feeder(store)


def mysql_group(gno: int | None, sid: bytes = SID) -> list[bytes]:
    head = E.gtid(0, anonymous=True) if gno is None else E.gtid(gno, sid)
    return [head, E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(gno or 0)]


def mysql_file(start: GtidSet, gnos: list[int | None], next_name: str | None = None, *, sid: bytes = SID) -> bytes:
    events = [E.event(C.PREVIOUS_GTIDS_LOG_EVENT, start.encode(), flags=C.LOG_EVENT_IGNORABLE_F)]
    for gno in gnos:
        events += mysql_group(gno, sid)
    if next_name:
        events.append(E.rotate(next_name))
    return E.binlog_file(*events)


def gtids(text: str) -> GtidSet:
    return GtidSet.parse(text)


def sid_set(sid: bytes, first: int, last: int) -> GtidSet:
    s = GtidSet()
    s.add_interval(sid, first, last + 1)
    return s


def group_ends(image: bytes) -> list[int]:
    ends: list[int] = []
    parser = B.TransactionBoundaryParser()
    for offset, event in split_events(image):
        if parser.feed_event(event, 0) & B.RESULT_MASK == B.GROUP_END:
            ends.append(offset + len(event))
    return ends


# ---------------------------------------------------------------------------------------------
# File/position mode: preamble, byte identity, positions


@pytest.fixture
def mysql80(tmp_path, corpus_dir):
    """The MySQL 8.0.29 GTID corpus file, streamed into a relay store as the master sends it."""
    image = as_sent((corpus_dir / MYSQL80).read_bytes())
    store, feeder = live_store(tmp_path, "binlog.000004")
    feeder.feed_events(split_events(image))
    store.sync()
    yield store, image
    store.close()


def test_preamble_and_events_are_byte_identical_to_the_real_mysql_file(mysql80):
    store, image = mysql80
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000004", 4)))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    fde_end = assert_preamble(events, "binlog.000004", 4, image)
    assert events[2].type == C.PREVIOUS_GTIDS_LOG_EVENT  # the file's own, sent as stored
    body = b"".join(e.raw for e in events[2:])
    assert body == image[fde_end:]
    pos = fde_end
    for event in events[2:]:
        pos += event.size
        assert event.log_pos == pos  # continuous: a file/pos replica counts exactly these bytes
    assert pos == store.horizon.snapshot().position == len(image)


def test_progress_is_recorded_on_the_connection(mysql80):
    store, image = mysql80
    conn = make_conn(**CRC32)
    channel = run(dump_all(make_ctx(store), conn, file_request("binlog.000004", 4)))
    assert conn.dump.file == "binlog.000004" and conn.dump.position == len(image)
    assert conn.dump.mode == "file" and conn.dump.events_sent == len(decode(channel.payloads)[0])
    assert conn.dump.bytes_sent == sum(len(p) for p in channel.payloads)  # the EOF included


def test_mid_file_start_zeroes_log_pos_and_created_in_the_fde(tmp_path):
    image = with_created(mysql_file(GtidSet(), [1, 2, 3]), 1700000123)
    store = relay_with(tmp_path, {"binlog.000001": image})
    start = group_ends(image)[0]
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", start)))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    assert_preamble(events, "binlog.000001", start, image, mid_file=True)
    assert events[1].view.create_timestamp == 0 and events[1].log_pos == 0
    assert events[2].type == C.GTID_LOG_EVENT  # no PREVIOUS_GTIDS when resuming mid-file
    assert b"".join(e.raw for e in events[2:]) == image[start:]
    # from position 4 the created timestamp is kept
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4)))
    events, _ = decode(channel.payloads)
    assert events[1].view.create_timestamp == 1700000123
    store.close()


def test_empty_file_name_means_the_oldest_file_and_rotations_are_followed(tmp_path):
    first = mysql_file(GtidSet(), [1, 2], "binlog.000002")
    second = mysql_file(sid_set(SID, 1, 2), [3], "binlog.000003")
    third = mysql_file(sid_set(SID, 1, 3), [4])
    store = relay_with(tmp_path, {"binlog.000001": first, "binlog.000002": second, "binlog.000003": third})
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("", 4)))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    # per file: fake rotate, FDE, then the file's events (the last of which is the real ROTATE)
    expected = []
    for name, image in (("binlog.000001", first), ("binlog.000002", second), ("binlog.000003", third)):
        fde_end = struct.unpack_from("<I", image, 13)[0] + 4
        expected += [expected_rotate(name, 4), None] + [ev for _off, ev in split_events(image, fde_end)]
    assert len(events) == len(expected)
    for sent, want in zip(events, expected):
        if want is None:
            assert sent.type == C.FORMAT_DESCRIPTION_EVENT
        else:
            assert sent.raw == want
    store.close()


def test_real_mariadb_files_stream_whole_with_a_preamble_at_each_rotation(tmp_path, corpus_dir):
    names = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5, 6, 7)]
    files = {name: (corpus_dir / MARIA_CORPUS / name).read_bytes() for name in names}
    store = relay_with(tmp_path, files)
    flags = P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32, mariadb_slave_capability=4),
                           file_request(names[0], 4, flags=flags)))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    at = 0
    for name in names:
        image = files[name]
        fde_end = assert_preamble(events[at:], name, 4, image)
        file_events = split_events(image, fde_end)
        sent = events[at + 2 : at + 2 + len(file_events)]
        assert [s.raw for s in sent] == [ev for _off, ev in file_events]
        assert sent[0].type == C.MARIA_GTID_LIST_EVENT and sent[1].type == C.MARIA_BINLOG_CHECKPOINT_EVENT
        for s, (offset, _ev) in zip(sent, file_events):
            assert s.log_pos in (0, offset + s.size)  # MariaDB 11 writes 0 inside groups
        at += 2 + len(file_events)
    assert at == len(events)
    store.close()


# ---------------------------------------------------------------------------------------------
# Errors of the position protocol


@pytest.mark.parametrize(
    "name, pos, message",
    [
        ("binlog.000009", 4, "Could not find first log file name in binary log index file"),
        ("binlog.000001", 3, "Client requested master to start replication from position < 4"),
        ("binlog.000001", 10**6, "Client requested master to start replication from position > file size"),
    ],
)
def test_position_errors_are_mysqls(tmp_path, name, pos, message):
    store = relay_with(tmp_path, {"binlog.000001": mysql_file(GtidSet(), [1])})
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request(name, pos)))
    assert error_of(channel.payloads[-1]) == (1236, message)
    assert len(channel.payloads) == 1  # refused before anything was sent
    store.close()


def test_a_position_past_the_horizon_is_past_the_file_size(tmp_path):
    store, feeder = live_store(tmp_path)
    image = mysql_file(GtidSet(), [1, 2])
    events = split_events(image)
    feeder.feed_events(events[:7])  # FDE, PREVIOUS_GTIDS, the first group
    store.sync()
    feeder.feed_events(events[7:9])  # part of the second group
    store.sync()
    assert store.current_end > store.horizon.snapshot().position
    assert (tmp_path / "relay" / "binlog.000001").stat().st_size == store.current_end
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", store.current_end)))
    assert error_of(channel.payloads[-1]) == (1236, DE.MSG_POS_GT_SIZE)
    store.close()


def test_mariadb_position_errors_use_mariadbs_text(tmp_path):
    image = E.binlog_file(E.event(C.MARIA_GTID_LIST_EVENT, MariaBinlogState().encode_gtid_list_body()),
                          server_version=MARIA)
    store = relay_with(tmp_path, {"mariadb-bin.000001": image})
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("mariadb-bin.000001", 2)))
    assert error_of(channel.payloads[-1]) == (
        1236,
        "Client requested master to start replication from impossible position; the first event "
        "'mariadb-bin.000001' at 2, the last event read from 'mariadb-bin.000001' at 4, the last byte read from "
        "'mariadb-bin.000001' at 4.",
    )
    store.close()


# ---------------------------------------------------------------------------------------------
# Checksums


def test_a_replica_that_announced_no_checksum_gets_1236_after_the_fake_rotate(tmp_path):
    image = mysql_file(GtidSet(), [1])
    store = relay_with(tmp_path, {"binlog.000001": image})
    channel = run(dump_all(make_ctx(store), make_conn(), file_request("binlog.000001", 4)))
    events, tail = decode(channel.payloads)
    assert [e.raw for e in events] == [expected_rotate("binlog.000001", 4, crc=False)]
    fde_end = struct.unpack_from("<I", image, 13)[0] + 4
    assert error_of(tail) == (
        1236,
        "Slave can not handle replication events with the checksum that master is configured to log; the first "
        f"event 'binlog.000001' at 4, the last event read from 'binlog.000001' at 4, the last byte read from "
        f"'binlog.000001' at {fde_end}.",
    )
    store.close()


def test_replica_announcing_none_gets_the_crcs_as_stored_and_fake_events_follow_the_fde(tmp_path):
    image = mysql_file(GtidSet(), [1])
    store = relay_with(tmp_path, {"binlog.000001": image})

    async def main():
        channel = FakeChannel()
        conn = make_conn(master_binlog_checksum="NONE", master_heartbeat_period=str(20_000_000))
        task = asyncio.create_task(D.serve_dump(make_ctx(store), conn, file_request("binlog.000001", 4, 0), channel))
        await channel.wait_until(lambda c: any(p[5] == C.HEARTBEAT_LOG_EVENT for p in c.payloads))
        channel.close()
        await task
        return channel

    events, _ = decode(run(main()).payloads)
    # before the FDE the replica expects what it announced (no CRC), after it what the FDE says
    assert events[0].raw == expected_rotate("binlog.000001", 4, crc=False)
    assert b"".join(e.raw for e in events[2:-1]) == image[struct.unpack_from("<I", image, 13)[0] + 4 :]
    heartbeat = events[-1]
    assert heartbeat.type == C.HEARTBEAT_LOG_EVENT and crc_ok(heartbeat.raw)
    store.close()


def test_a_corrupt_event_is_refused_with_the_crc_error_and_never_sent(tmp_path):
    image = bytearray(mysql_file(GtidSet(), [1, 2, 3]))
    ends = group_ends(bytes(image))
    bad_at = ends[1]  # the GTID event of the third group
    image[bad_at + 25] ^= 0xFF
    store = relay_with(tmp_path, {"binlog.000001": bytes(mysql_file(GtidSet(), [1, 2, 3]))})
    (tmp_path / "relay" / "binlog.000001").write_bytes(bytes(image))  # damaged after recovery checked it
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4)))
    events, tail = decode(channel.payloads)
    bad_size = struct.unpack_from("<I", image, bad_at + 9)[0]
    assert error_of(tail) == (
        1236,
        "event read from binlog did not pass crc check; the first event 'binlog.000001' at 4, the last event read "
        f"from 'binlog.000001' at {bad_at}, the last byte read from 'binlog.000001' at {bad_at + bad_size}.",
    )
    assert events[-1].log_pos == bad_at  # everything before it, nothing of it
    store.close()


def test_a_closed_file_cut_inside_an_event_is_refused(tmp_path):
    first = mysql_file(GtidSet(), [1, 2], "binlog.000002")
    second = mysql_file(sid_set(SID, 1, 2), [3])
    store = relay_with(tmp_path, {"binlog.000001": first, "binlog.000002": second})
    cut = group_ends(first)[0] + 30
    with open(tmp_path / "relay" / "binlog.000001", "r+b") as f:
        f.truncate(cut)
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4)))
    code, message = error_of(channel.payloads[-1])
    assert code == 1236
    assert message.startswith("binlog truncated in the middle of event; consider out of disk space on master; ")
    store.close()


# ---------------------------------------------------------------------------------------------
# The horizon, waiting, heartbeats, NON_BLOCK, disconnects


def test_never_a_byte_past_the_horizon_and_a_waiting_dump_wakes_for_new_groups(tmp_path):
    store, feeder = live_store(tmp_path)
    image = mysql_file(GtidSet(), [1, 2, 3, 4])
    events = split_events(image)
    feeder.feed_events(events[:7])  # FDE, PREVIOUS_GTIDS, group 1
    store.sync()
    feeder.feed_events(events[7:10])  # half of group 2: in the file, but not a complete group
    assert store.sync() is False  # written and fsynced; the horizon cannot move inside a group
    horizon_before = store.horizon.snapshot().position
    assert (tmp_path / "relay" / "binlog.000001").stat().st_size > horizon_before

    async def main():
        channel = FakeChannel()
        conn = make_conn(**CRC32, master_heartbeat_period=str(40_000_000))
        task = asyncio.create_task(D.serve_dump(make_ctx(store), conn, file_request("binlog.000001", 4, 0), channel))
        await channel.wait_until(lambda c: sum(p[5] == C.HEARTBEAT_LOG_EVENT for p in c.payloads) >= 2)
        sent_before = decode(channel.payloads)[0]
        real = [e for e in sent_before if e.type not in (C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT,
                                                          C.HEARTBEAT_LOG_EVENT)]
        assert real[-1].log_pos == horizon_before  # stopped at the horizon, not at the written end
        heartbeats = [e for e in sent_before if e.type == C.HEARTBEAT_LOG_EVENT]
        assert all(h.view.log_file == "binlog.000001" and h.view.position == horizon_before for h in heartbeats)
        # complete group 2 and add half of group 3: only group 2 becomes durable
        feeder.feed_events(events[10:12])
        feeder.feed_events(events[12:14])
        store.sync()
        group2_end = events[11][0] + len(events[11][1])
        assert store.horizon.snapshot().position == group2_end
        count = len(channel.payloads)
        await channel.wait_until(lambda c: any(Sent(p, None).log_pos == group2_end for p in c.payloads[count:]
                                               if p[5] != C.HEARTBEAT_LOG_EVENT))
        await asyncio.sleep(0.1)  # let it try to send more: it must not
        new = [Sent(p, None) for p in channel.payloads[count:]]
        new = [e for e in new if e.type != C.HEARTBEAT_LOG_EVENT]
        assert b"".join(e.raw for e in new) == image[horizon_before:group2_end]
        channel.close()
        await task

    run(main())
    store.close()


def test_non_block_sends_eof_at_the_horizon_and_server_id_0_too(tmp_path):
    store = relay_with(tmp_path, {"binlog.000001": mysql_file(GtidSet(), [1])})
    for request in (file_request("binlog.000001", 4, P.BINLOG_DUMP_NON_BLOCK),
                    DumpRequest("file", server_id=0, flags=0, file="binlog.000001", position=4)):
        channel = run(dump_all(make_ctx(store), make_conn(**CRC32), request))
        assert channel.payloads[-1] == b"\xfe\x00\x00\x02\x00"
    conn = make_conn(**CRC32)
    conn.capabilities = P.CLIENT_DEPRECATE_EOF
    channel = run(dump_all(make_ctx(store), conn, file_request("binlog.000001", 4)))
    assert channel.payloads[-1] == b"\xfe\x00\x00\x02\x00\x00\x00"  # the OK-as-EOF of DEPRECATE_EOF
    store.close()


def test_heartbeat_v2_only_for_mysql_replicas_that_ask(tmp_path):
    store = relay_with(tmp_path, {"binlog.000001": mysql_file(GtidSet(), [1])})

    async def first_heartbeat(flags):
        channel = FakeChannel()
        conn = make_conn(**CRC32, source_heartbeat_period=10_000_000)
        request = file_request("binlog.000001", 4, flags)
        task = asyncio.create_task(D.serve_dump(make_ctx(store), conn, request, channel))
        await channel.wait_until(lambda c: any(p[5] in (27, 41) for p in c.payloads))
        channel.close()
        await task
        return [e for e in decode(channel.payloads)[0] if e.type in (27, 41)][0]

    v2 = run(first_heartbeat(P.USE_HEARTBEAT_EVENT_V2))
    assert v2.type == C.HEARTBEAT_LOG_EVENT_V2 and v2.view.log_file == "binlog.000001"
    assert v2.view.position == store.horizon.snapshot().position and crc_ok(v2.raw)
    v1 = run(first_heartbeat(0))
    assert v1.type == C.HEARTBEAT_LOG_EVENT and v1.timestamp == 0 and v1.flags == 0 and v1.server_id == RELAY_ID
    store.close()


def test_a_replica_that_disconnects_ends_the_dump_quietly(tmp_path):
    store = relay_with(tmp_path, {"binlog.000001": mysql_file(GtidSet(), [1, 2])})

    async def waiting_then_gone():
        channel = FakeChannel()
        conn = make_conn(**CRC32)  # no heartbeats: only the replica's departure can end the wait
        task = asyncio.create_task(D.serve_dump(make_ctx(store), conn, file_request("binlog.000001", 4, 0), channel))
        await channel.wait_until(lambda c: len(c.payloads) >= 5)
        await asyncio.sleep(0.05)
        assert not task.done() and store.horizon.waiting == 1
        channel.close()
        await asyncio.wait_for(task, 1.0)
        assert store.horizon.waiting == 0
        return channel

    channel = run(waiting_then_gone())
    assert all(p[0] == 0 for p in channel.payloads)  # no ERR: it just ends
    # a connection reset while sending ends it the same way
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4),
                           FakeChannel(fail_after=3)))
    assert len(channel.payloads) == 3 and all(p[0] == 0 for p in channel.payloads)
    store.close()


# ---------------------------------------------------------------------------------------------
# Large events: streamed in pieces, CRC checked before the first byte leaves


def big_file(size: int) -> bytes:
    blob = E.event(C.WRITE_ROWS_EVENT, bytes(10) + bytes(range(256)) * (size // 256))
    return E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode()),
                         E.gtid(1), E.query("BEGIN"), E.table_map(), blob, E.xid(1))


def test_a_large_event_streams_in_pieces_and_a_corrupt_one_is_not_half_sent(tmp_path, monkeypatch):
    monkeypatch.setattr(D.sender, "_STREAM_PIECE", 64 << 10)
    monkeypatch.setattr(D.sender, "READ_CHUNK", 32 << 10)
    image = big_file(1 << 20)
    store = relay_with(tmp_path, {"binlog.000001": image})
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4)))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    fde_end = struct.unpack_from("<I", image, 13)[0] + 4
    assert b"".join(e.raw for e in events[2:]) == image[fde_end:]
    assert len(channel.stream_pieces) == 1 and max(channel.stream_pieces[0]) <= 64 << 10
    # without a streaming channel the event goes whole through send()
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4),
                           StreamlessChannel()))
    assert b"".join(e.raw for e in decode(channel.payloads)[0][2:]) == image[fde_end:]
    # a damaged byte deep inside the large event: refused before any of it is sent
    blob_at = [off for off, ev in split_events(image) if ev[4] == C.WRITE_ROWS_EVENT][0]
    damaged = bytearray(image)
    damaged[blob_at + 700_000] ^= 0x01
    (tmp_path / "relay" / "binlog.000001").write_bytes(bytes(damaged))
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4)))
    events, tail = decode(channel.payloads)
    assert error_of(tail)[1].startswith("event read from binlog did not pass crc check;")
    assert not channel.stream_pieces and events[-1].log_pos == blob_at
    store.close()


# ---------------------------------------------------------------------------------------------
# MySQL GTID auto-position


def three_mysql_files(created: int = 0) -> dict[str, bytes]:
    return {
        "binlog.000001": mysql_file(GtidSet(), [1, 2, 3], "binlog.000002"),
        "binlog.000002": with_created(mysql_file(sid_set(SID, 1, 3), [4, 5, 6], "binlog.000003"), created),
        "binlog.000003": mysql_file(sid_set(SID, 1, 6), [7, 8]),
    }


def test_gtid_start_file_skipping_and_the_heartbeat_after_skipped_groups(tmp_path):
    files = three_mysql_files(created=1700000000)
    store = relay_with(tmp_path, files)
    channel = run(dump_all(make_ctx(store, master_uuid=uuid_of(SID)), make_conn(**CRC32),
                           gtid_request(sid_set(SID, 1, 5))))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    second = files["binlog.000002"]
    # newest file whose PREVIOUS_GTIDS the replica has: binlog.000002 (000003 starts after 6)
    fde_end = assert_preamble(events, "binlog.000002", 4, second, created_cleared=True)
    assert events[1].log_pos != 0  # GTID protocol: only "created" is cleared
    ends = group_ends(second)
    assert events[2].type == C.PREVIOUS_GTIDS_LOG_EVENT
    heartbeat = events[3]
    assert heartbeat.type == C.HEARTBEAT_LOG_EVENT
    assert (heartbeat.view.log_file, heartbeat.view.position) == ("binlog.000002", ends[1])  # after GTIDs 4 and 5
    gtid6 = events[4]
    assert gtid6.type == C.GTID_LOG_EVENT and gtid6.view.gno == 6
    n = len(split_events(second, ends[1]))
    assert b"".join(e.raw for e in events[4 : 4 + n]) == second[ends[1]:]  # through its real ROTATE
    assert events[4 + n].raw == expected_rotate("binlog.000003", 4)
    sent_gnos = [e.view.gno for e in events if e.type == C.GTID_LOG_EVENT]
    assert sent_gnos == [6, 7, 8]
    assert fde_end < ends[1]
    store.close()


def test_the_created_flag_stays_when_the_first_transaction_is_sent(tmp_path):
    store = relay_with(tmp_path, three_mysql_files(created=1700000000))
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), gtid_request(sid_set(SID, 1, 3))))
    events, _ = decode(channel.payloads)
    assert events[0].raw == expected_rotate("binlog.000002", 4)
    assert events[1].view.create_timestamp == 1700000000
    assert [e.view.gno for e in events if e.type == C.GTID_LOG_EVENT] == [4, 5, 6, 7, 8]
    store.close()


def test_gtid_skipping_on_the_real_mysql_file(mysql80):
    store, image = mysql80
    source = "83759871-1141-11ed-b12d-0242ac130003"
    channel = run(dump_all(make_ctx(store, master_uuid=source), make_conn(**CRC32),
                           gtid_request(gtids(f"{source}:1-10"))))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    heartbeat = events[3]
    assert heartbeat.type == C.HEARTBEAT_LOG_EVENT and heartbeat.view.position == 3333  # end of GTID 10
    assert b"".join(e.raw for e in events[4:]) == image[3333:]
    assert [e.view.gno for e in events if e.type == C.GTID_LOG_EVENT] == list(range(11, 27))


def test_a_replica_that_has_everything_gets_a_heartbeat_at_the_end(mysql80):
    store, image = mysql80
    source = "83759871-1141-11ed-b12d-0242ac130003"
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), gtid_request(gtids(f"{source}:1-26"))))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    assert [e.type for e in events] == [C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT,
                                        C.HEARTBEAT_LOG_EVENT]
    assert events[-1].view.position == len(image)


def test_replica_with_more_of_the_masters_gtids_gets_1885_text(tmp_path):
    store = relay_with(tmp_path, three_mysql_files())
    ahead = sid_set(SID, 1, 9)
    for master_uuid in (uuid_of(SID), None):  # known upstream master; or the UUIDs of the relay files
        channel = run(dump_all(make_ctx(store, master_uuid=master_uuid), make_conn(**CRC32), gtid_request(ahead)))
        code, message = error_of(channel.payloads[-1])
        assert code == 1236 and len(channel.payloads) == 1
        assert message.startswith("Replica has more GTIDs than the source has, using the source's SERVER_UUID.")
    # the pre-8.0.26 wording for an older master
    channel = run(dump_all(make_ctx(store, master_uuid=uuid_of(SID), version="8.0.20-log"), make_conn(**CRC32),
                           gtid_request(ahead)))
    assert error_of(channel.payloads[-1])[1].startswith("Slave has more GTIDs than the master has")
    # GTIDs of other servers may run ahead: only the master's own UUID counts
    replica = sid_set(SID, 1, 8).union(sid_set(OTHER, 1, 50))
    channel = run(dump_all(make_ctx(store, master_uuid=uuid_of(SID)), make_conn(**CRC32), gtid_request(replica)))
    assert is_eof(decode(channel.payloads)[1])
    store.close()


def test_purged_gtids_are_refused_with_the_missing_set(tmp_path):
    store = relay_with(tmp_path, {
        "binlog.000007": mysql_file(sid_set(SID, 1, 10), [11, 12], "binlog.000008"),
        "binlog.000008": mysql_file(sid_set(SID, 1, 12), [13]),
    })
    replica = sid_set(SID, 1, 5)
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), gtid_request(replica)))
    assert len(channel.payloads) == 1
    assert error_of(channel.payloads[0]) == (
        1236,
        "Cannot replicate because the source purged required binary logs. Replicate the missing transactions from "
        "elsewhere, or provision a new replica from backup. Consider increasing the source's binary log expiration "
        f"period. The GTID set sent by the replica is '{uuid_of(SID)}:1-5', and the missing transactions are "
        f"'{uuid_of(SID)}:6-10'",
    )
    # a replica with a long set gets the message cut as the servers cut it (511 bytes)
    scattered = GtidSet()
    for gno in range(1, 200, 2):
        scattered.add(OTHER, gno)
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), gtid_request(replica.union(scattered))))
    code, message = error_of(channel.payloads[0])
    assert code == 1236 and len(message.encode()) == 511 and message.startswith("Cannot replicate because")
    store.close()


def test_the_5_6_22_case_gtids_named_by_a_later_file_but_held_by_none(tmp_path):
    """Bug #19012085: SET GLOBAL gtid_purged on an empty server rotates; the oldest file has an empty
    PREVIOUS_GTIDS and no GTID events, the next one names the purged GTIDs. Without the purged check the
    oldest file "matches" every replica and the purged transactions are silently never sent."""
    restored = sid_set(OTHER, 1, 100)
    oldest = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode()),
                           E.query("CREATE TABLE t (a INT)"), E.rotate("binlog.000002"))
    newer = mysql_file(restored, [1, 2])
    store = relay_with(tmp_path, {"binlog.000001": oldest, "binlog.000002": newer})
    channel = run(dump_all(make_ctx(store, master_uuid=uuid_of(SID)), make_conn(**CRC32),
                           gtid_request(sid_set(SID, 1, 1))))
    assert len(channel.payloads) == 1  # nothing streamed
    code, message = error_of(channel.payloads[0])
    assert code == 1236 and message.endswith(f"and the missing transactions are '{uuid_of(OTHER)}:1-100'")
    # a replica holding the restored set starts in the newer file
    channel = run(dump_all(make_ctx(store, master_uuid=uuid_of(SID)), make_conn(**CRC32),
                           gtid_request(restored.union(sid_set(SID, 1, 1)))))
    events, tail = decode(channel.payloads)
    assert is_eof(tail) and events[0].raw == expected_rotate("binlog.000002", 4)
    assert [e.view.gno for e in events if e.type == C.GTID_LOG_EVENT] == [2]
    store.close()


def test_anonymous_groups_end_an_auto_position_dump(tmp_path):
    image = mysql_file(GtidSet(), [1, None, 2])
    store = relay_with(tmp_path, {"binlog.000001": image})
    anonymous_at = group_ends(image)[0]
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), gtid_request(GtidSet())))
    events, tail = decode(channel.payloads)
    code, message = error_of(tail)
    assert code == 1236 and message.startswith(
        f"Cannot replicate anonymous transaction when AUTO_POSITION = 1, at file binlog.000001, position "
        f"{anonymous_at}.; the first event '' at 4,"
    )
    assert [e.view.gno for e in events if e.type == C.GTID_LOG_EVENT] == [1]
    store.close()


def test_gtid_request_errors(tmp_path):
    store = relay_with(tmp_path, {"binlog.000001": mysql_file(GtidSet(), [1])})
    bad = DumpRequest("mysql-gtid", server_id=2, flags=1, file="", position=4, gtid_set=b"\x01\x00")
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), bad))
    assert error_of(channel.payloads[-1]) == (1773, "Malformed GTID set encoding.")
    store.close()
    maria = relay_with(tmp_path / "m", {"mariadb-bin.000001": maria_file(MariaBinlogState(), [(1, 0, 0)])})
    channel = run(dump_all(make_ctx(maria), make_conn(**CRC32), gtid_request(GtidSet())))
    assert error_of(channel.payloads[-1]) == (1047, "Unknown command")
    assert channel.payloads[-1][3:9] == b"#08S01"
    maria.close()


def test_a_gtid_dump_right_after_a_rotation_follows_it_into_the_new_file(tmp_path):
    """The horizon's file has no durable header yet: it must not pass for a file without GTIDs; the dump
    starts in the previous file, follows the rotation, and waits (with heartbeats) for the new FDE."""
    store, feeder = live_store(tmp_path)
    first = mysql_file(GtidSet(), [1, 2], "binlog.000002")
    feeder.feed_events(split_events(first))
    store.sync()
    store.start_file("binlog.000002")
    assert store.horizon.snapshot().coordinates == ("binlog.000002", 4)
    second = split_events(mysql_file(sid_set(SID, 1, 2), [3]))

    async def main():
        channel = FakeChannel()
        conn = make_conn(**CRC32, master_heartbeat_period=20_000_000)
        task = asyncio.create_task(D.serve_dump(make_ctx(store), conn, gtid_request(sid_set(SID, 1, 2), 0), channel))

        def heartbeat_in_new_file(c):
            events = decode(c.payloads)[0]
            return any(e.type == C.HEARTBEAT_LOG_EVENT and e.view.log_file == "binlog.000002" for e in events)

        await channel.wait_until(heartbeat_in_new_file)
        feeder.feed(*second[0])  # the new file's FDE becomes durable
        store.sync()
        feeder.feed_events(second[1:])
        store.sync()
        await channel.wait_until(lambda c: any(e.raw == second[-1][1] for e in decode(c.payloads)[0]))
        channel.close()
        await task
        return channel

    events = decode(run(main()).payloads)[0]
    kinds = [(e.type, e.view.log_file if e.type == C.HEARTBEAT_LOG_EVENT else None) for e in events]
    start = kinds.index((C.PREVIOUS_GTIDS_LOG_EVENT, None))
    assert events[0].raw == expected_rotate("binlog.000001", 4)
    assert kinds[start + 1] == (C.HEARTBEAT_LOG_EVENT, "binlog.000001")  # GTIDs 1 and 2 skipped
    assert events[start + 1].view.position == group_ends(first)[-1]
    assert events[start + 2].raw == split_events(first)[-1][1]  # the real ROTATE
    assert events[start + 3].raw == expected_rotate("binlog.000002", 4)
    waited = [e for e in events[start + 4 :] if e.type == C.HEARTBEAT_LOG_EVENT]
    assert waited and all((h.view.log_file, h.view.position) == ("binlog.000002", 4) for h in waited)
    rest = [e for e in events[start + 4 :] if e.type != C.HEARTBEAT_LOG_EVENT]
    assert rest[0].type == C.FORMAT_DESCRIPTION_EVENT
    assert [e.raw for e in rest[1:]] == [ev for _o, ev in second[1:]]
    store.close()


def test_a_named_file_in_a_gtid_request_is_used_and_gtids_are_still_skipped(tmp_path):
    store = relay_with(tmp_path, three_mysql_files(created=1700000000))
    request = DumpRequest("mysql-gtid", server_id=2, flags=1, file="binlog.000002", position=4,
                          gtid_set=sid_set(SID, 1, 4).encode())
    events, tail = decode(run(dump_all(make_ctx(store), make_conn(**CRC32), request)).payloads)
    assert is_eof(tail) and events[0].raw == expected_rotate("binlog.000002", 4)
    assert events[1].view.create_timestamp == 1700000000  # m_gtid_clear_fd_created_flag stays false
    assert [e.view.gno for e in events if e.type == C.GTID_LOG_EVENT] == [5, 6, 7, 8]
    store.close()


def test_files_without_previous_gtids(tmp_path):
    old = E.binlog_file(E.query("CREATE TABLE t (a INT)"), E.rotate("binlog.000002"))
    store = relay_with(tmp_path, {"binlog.000001": old, "binlog.000002": E.binlog_file(E.query("DROP TABLE t"))})
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), gtid_request(GtidSet())))
    assert error_of(channel.payloads[-1]) == (1236, DE.MSG_GTID_MODE_OFF)
    store.close()
    store = relay_with(tmp_path / "b", {"binlog.000001": old, "binlog.000002": mysql_file(sid_set(SID, 1, 5), [6])})
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), gtid_request(sid_set(SID, 1, 2))))
    assert error_of(channel.payloads[-1]) == (
        1236,
        "Found old binary log without GTIDs while looking for the oldest binary log that contains any GTID that is "
        "not in the given gtid set",
    )
    store.close()


def test_a_file_that_is_no_binlog_is_refused(tmp_path):
    image = mysql_file(GtidSet(), [1], "binlog.000002")
    store = relay_with(tmp_path, {"binlog.000001": image, "binlog.000002": mysql_file(sid_set(SID, 1, 1), [2])})
    (tmp_path / "relay" / "binlog.000001").write_bytes(b"\x00bin" + image[4:])
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request("binlog.000001", 4)))
    assert error_of(channel.payloads[-1]) == (1236, DE.MSG_BAD_MAGIC)
    store.close()


# ---------------------------------------------------------------------------------------------
# MariaDB GTID


def maria_file(start: MariaBinlogState, groups: list[tuple[int, int, int]], next_name: str | None = None,
               *, annotate: bool = False) -> bytes:
    """groups: (seq, domain, flags2); standalone groups are one DDL query, others BEGIN ... XID."""
    events = [E.event(C.MARIA_GTID_LIST_EVENT, start.encode_gtid_list_body()),
              E.event(C.MARIA_BINLOG_CHECKPOINT_EVENT, struct.pack("<I", 18) + b"mariadb-bin.000001")]
    for seq, domain, flags2 in groups:
        events.append(E.maria_gtid(seq, domain, flags2))
        if flags2 & C.FL_STANDALONE:
            events.append(E.query("CREATE TABLE t%d (a INT)" % seq))
        else:
            events.append(E.query("BEGIN"))
            if annotate:
                events.append(E.event(C.MARIA_ANNOTATE_ROWS_EVENT, b"INSERT INTO t VALUES (1)"))
            events += [E.table_map(), E.write_rows(), E.xid(seq)]
    if next_name:
        events.append(E.rotate(next_name))
    return E.binlog_file(*events, server_version=MARIA)


@pytest.fixture
def maria_corpus(tmp_path, corpus_dir):
    names = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5, 6, 7)]
    files = {name: (corpus_dir / MARIA_CORPUS / name).read_bytes() for name in names}
    store = relay_with(tmp_path, files)
    groups = {}
    for name in names:
        found = []
        scan_file(tmp_path / "relay" / name, on_group=found.append)
        groups[name] = found
    yield store, files, groups
    store.close()


def test_mariadb_gtid_start_file_skipping_and_fake_gtid_list(maria_corpus):
    store, files, groups = maria_corpus
    name = "mariadb-repl-bin.000005"
    target = groups[name][2]  # the third group of 000005: 0-10-262583
    assert target.gtid == (0, 10, 262583)
    conn = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state="0-10-262583")
    channel = run(dump_all(make_ctx(store), conn, maria_request()))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    image = files[name]
    fde_end = assert_preamble(events, name, 4, image, created_cleared=True)
    assert events[2].type == C.MARIA_GTID_LIST_EVENT and events[3].type == C.MARIA_BINLOG_CHECKPOINT_EVENT
    fakes = [i for i, e in enumerate(events)
             if e.type == C.MARIA_GTID_LIST_EVENT and e.flags & C.LOG_EVENT_ARTIFICIAL_F]
    assert len(fakes) == 1
    fake = events[fakes[0]]
    assert fake.flags == C.LOG_EVENT_ARTIFICIAL_F and fake.timestamp == 0 and fake.server_id == RELAY_ID
    assert fake.log_pos == target.end and crc_ok(fake.raw)
    assert str(fake.view.state) == "0-10-262583"  # the GTIDs met while skipping, as MariaDB keeps them
    # between the file's header and the fake list only events outside the skipped groups
    skipped = events[4 : fakes[0]]
    assert [e.type for e in skipped] == [C.MARIA_BINLOG_CHECKPOINT_EVENT]
    # then the rest of 000005 byte for byte
    n5 = len(split_events(image, target.end))
    after = events[fakes[0] + 1 : fakes[0] + 1 + n5]
    assert b"".join(e.raw for e in after) == image[target.end:]
    assert after[0].view.gtid == MariaGtid(0, 10, 262584)
    assert fde_end < target.end
    sent_gtids = [e.view.gtid.seq_no for e in events if e.type == C.MARIA_GTID_EVENT]
    assert sent_gtids == list(range(262584, 262797))


def test_a_long_skip_gives_the_event_loop_turns(tmp_path, monkeypatch):
    """A GTID dump skipping to its point handles a read's worth of small events (READ_CHUNK) without waiting for
    anything: it must still give the loop, which runs the upstream session and every other dump, a turn every
    ``_EVENTS_PER_YIELD`` events (before, it held the loop for a whole read: ~180 ms per MB of tiny events here)."""
    from relayproxy.downstream.dump import sender as S

    n = 20_000
    events = []
    for seq in range(1, n + 1):
        events += [E.maria_gtid(seq), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(seq)]
    store = relay_with(tmp_path, {"binlog.000001": E.binlog_file(*events, server_version="10.11.6-MariaDB-log")})
    conn = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state=f"0-1-{n - 1}")
    handled = 0
    real_handle = S.DumpSender._handle

    async def counting_handle(self, *args):
        nonlocal handled
        handled += 1
        return await real_handle(self, *args)

    monkeypatch.setattr(S.DumpSender, "_handle", counting_handle)

    async def main() -> tuple[int, FakeChannel]:
        most, done = 0, False

        async def other_work() -> None:  # the rest of the relay: how many events went by between two of its turns
            nonlocal most
            seen = handled
            while not done:
                await asyncio.sleep(0)
                most, seen = max(most, handled - seen), handled

        other = asyncio.create_task(other_work())
        try:
            channel = await dump_all(make_ctx(store), conn, maria_request())
            return most, channel
        finally:
            done = True
            await other

    try:
        most, channel = run(main(), timeout=60)
        sent = [e.view.gtid.seq_no for e in decode(channel.payloads)[0] if e.type == C.MARIA_GTID_EVENT]
        assert sent == [n]  # everything before the replica's point skipped, its next transaction sent
        assert handled >= len(events) - 10
        assert most <= S._EVENTS_PER_YIELD, f"{most} events handled between two turns of the loop"
    finally:
        store.close()


def test_mariadb_requesting_the_last_gtid_of_a_file_starts_at_the_next_without_skipping(maria_corpus):
    store, files, groups = maria_corpus
    conn = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state="0-10-262667")
    channel = run(dump_all(make_ctx(store), conn, maria_request()))
    events, tail = decode(channel.payloads)
    assert is_eof(tail)
    assert events[0].raw == expected_rotate("mariadb-repl-bin.000006", 4)
    assert events[1].view.create_timestamp == 0
    assert not any(e.type == C.MARIA_GTID_LIST_EVENT and e.flags & C.LOG_EVENT_ARTIFICIAL_F for e in events)
    image = files["mariadb-repl-bin.000006"]
    fde_end = struct.unpack_from("<I", image, 13)[0] + 4
    assert b"".join(e.raw for e in events[2 : 2 + len(split_events(image, fde_end))]) == image[fde_end:]


@pytest.mark.parametrize(
    "state, message",
    [
        ("0-10-262100", "Could not find GTID state requested by slave in any binlog files. Probably the slave state "
                        "is too old and required binlog files have been purged."),
        ("0-10-262900", "Error: connecting slave requested to start from GTID 0-10-262900, which is not in the "
                        "master's binlog"),
        ("0-11-262700", "Error: connecting slave requested to start from GTID 0-11-262700, which is not in the "
                        "master's binlog. Since the master's binlog contains GTIDs with higher sequence numbers, it "
                        "probably means that the slave has diverged due to executing extra erroneous transactions"),
        ("", "Could not find GTID state requested by slave in any binlog files. Probably the slave state is too old "
             "and required binlog files have been purged."),
        ("0-10-x", "Out of memory or malformed slave request when obtaining start position from GTID state"),
    ],
)
def test_mariadb_gtid_errors(maria_corpus, state, message):
    store, _files, _groups = maria_corpus
    conn = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state=state)
    channel = run(dump_all(make_ctx(store), conn, maria_request()))
    code, text = error_of(channel.payloads[-1])
    assert text == message and len(channel.payloads) == 1
    assert code == (1105 if "malformed" in message else 1236)


def test_mariadb_ignore_duplicates_and_an_unknown_domain_are_accepted(maria_corpus):
    store, _files, _groups = maria_corpus
    # a domain the relay has never seen is another master's: accepted, nothing to skip there
    conn = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state="0-10-262790,7-3-5")
    events, tail = decode(run(dump_all(make_ctx(store), conn, maria_request())).payloads)
    assert is_eof(tail)
    assert [e.view.gtid.seq_no for e in events if e.type == C.MARIA_GTID_EVENT] == list(range(262791, 262797))
    # ahead of the relay with gtid_ignore_duplicates: it may have come another way; nothing is sent
    conn = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state="0-10-262900",
                     slave_gtid_ignore_duplicates=1)
    events, tail = decode(run(dump_all(make_ctx(store), conn, maria_request())).payloads)
    assert is_eof(tail) and not any(e.type == C.MARIA_GTID_EVENT for e in events)


def test_mariadb_strict_mode_refuses_a_start_in_a_hole(tmp_path):
    image = maria_file(MariaBinlogState([MariaGtid(0, 1, 4)]), [(5, 0, 0), (7, 0, 0), (8, 0, C.FL_STANDALONE)])
    store = relay_with(tmp_path, {"mariadb-bin.000001": image})
    strict = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state="0-1-6", slave_gtid_strict_mode=1)
    channel = run(dump_all(make_ctx(store), strict, maria_request()))
    assert error_of(channel.payloads[-1]) == (
        1236,
        "The binlog on the master is missing the GTID 0-1-6 requested by the slave (even though both a prior and a "
        "subsequent sequence number does exist), and GTID strict mode is enabled",
    )
    lax = make_conn(**CRC32, mariadb_slave_capability=4, slave_connect_state="0-1-6")
    events, tail = decode(run(dump_all(make_ctx(store), lax, maria_request())).payloads)
    assert is_eof(tail)
    assert [e.view.gtid.seq_no for e in events if e.type == C.MARIA_GTID_EVENT] == [7, 8]
    store.close()


def test_mariadb_capabilities_and_annotate_rows(tmp_path):
    groups = [(1, 0, 0), (2, 0, C.FL_STANDALONE), (3, 0, 0)]
    image = maria_file(MariaBinlogState(), groups, annotate=True)
    store = relay_with(tmp_path, {"mariadb-bin.000001": image})
    file_events = split_events(image, struct.unpack_from("<I", image, 13)[0] + 4)

    def dump(capability, flags=P.BINLOG_DUMP_NON_BLOCK):
        conn = make_conn(**CRC32, mariadb_slave_capability=capability)
        channel = run(dump_all(make_ctx(store), conn, file_request("mariadb-bin.000001", 4, flags)))
        events, tail = decode(channel.payloads)
        assert is_eof(tail)
        return events[2:]

    # GTID-aware replica that asked for ANNOTATE_ROWS: everything as stored
    assert [e.raw for e in dump(4, P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT)] == \
        [ev for _o, ev in file_events]
    # without the flag: ANNOTATE_ROWS left out (such a replica takes positions from log_pos)
    sent = dump(4)
    assert [e.raw for e in sent] == [ev for _o, ev in file_events if ev[4] != C.MARIA_ANNOTATE_ROWS_EVENT]
    # capability 1: ANNOTATE_ROWS sent as is (it understands and ignores it), GTIDs still rewritten
    annotate = [ev for _o, ev in file_events if ev[4] == C.MARIA_ANNOTATE_ROWS_EVENT]
    sent = dump(1)
    assert [e.raw for e in sent if e.type == C.MARIA_ANNOTATE_ROWS_EVENT] == annotate
    assert [e.size for e in sent] == [len(ev) for _o, ev in file_events]
    assert not any(e.type == C.MARIA_GTID_EVENT for e in sent)
    # capability 0 (a MySQL replica): same-size dummies, BEGIN for transactional GTIDs: positions unchanged
    sent = dump(0)
    assert [e.size for e in sent] == [len(ev) for _o, ev in file_events]
    assert [e.log_pos for e in sent] == [struct.unpack_from("<I", ev, 13)[0] for _o, ev in file_events]
    by_type = [(e.type, e.view.query_text if e.type == C.QUERY_EVENT else None) for e in sent]
    assert by_type[0][0] == C.USER_VAR_EVENT  # a 25-byte GTID_LIST is too short for a query: a NULL @`!`
    assert by_type[1][1] == "# Dummy "  # the comment is cut to the event's size
    assert by_type[2] == (C.QUERY_EVENT, "BEGIN")  # the GTID of group 1
    assert by_type[4] == (C.QUERY_EVENT, "# Dummy ev")  # ANNOTATE_ROWS, same size
    assert all(crc_ok(e.raw) for e in sent)
    assert all(e.flags & C.LOG_EVENT_SUPPRESS_USE_F for e, (_o, ev) in zip(sent, file_events) if e.raw != ev)
    # capability 2: holes allowed: standalone GTIDs, GTID_LIST and ANNOTATE_ROWS left out
    sent = dump(2)
    types = [e.type for e in sent]
    assert C.MARIA_GTID_LIST_EVENT not in types and C.MARIA_ANNOTATE_ROWS_EVENT not in types
    assert C.MARIA_BINLOG_CHECKPOINT_EVENT not in types
    begins = sum(1 for e in sent if e.type == C.QUERY_EVENT and e.view.query_text == "BEGIN")
    assert begins == 2 + 2  # the 2 transactional GTIDs rewritten, and the groups' own BEGINs
    store.close()


def test_dummy_and_begin_events_match_mariadbs_layout():
    header = E.maria_gtid(5)[:19]
    begin = D.begin_event(header, 19 + 19 + 4, True)
    assert len(begin) == 42 and begin[4] == C.QUERY_EVENT and begin.endswith(b"\0BEGIN" + begin[-4:]) and crc_ok(begin)
    begin40 = D.begin_event(header, 19 + 21 + 4, True)
    assert len(begin40) == 44 and begin40[19 + 11 : 19 + 13] == b"\x02\x00" and begin40[32:34] == b"\x05\x00"
    assert D.begin_event(header, 19 + 30 + 4, True) is None  # MariaDB refuses other layouts too
    short = D.dummy_event(header, 19 + 8, False)
    assert short[4] == C.USER_VAR_EVENT and short[19:23] == b"\x03\x00\x00\x00" and short[23:26] == b"!du"
    assert short[-1] == 1 and len(short) == 27
    assert D.dummy_event(header, 24, False) is None


def test_a_pre_gtid_replica_gets_real_mariadb_11_files_with_same_size_begins(maria_corpus):
    store, files, _groups = maria_corpus
    name = "mariadb-repl-bin.000007"
    image = files[name]
    conn = make_conn(**CRC32)  # no @mariadb_slave_capability: a MySQL or pre-10.0 replica
    events, tail = decode(run(dump_all(make_ctx(store), conn, file_request(name, 4))).payloads)
    assert is_eof(tail)
    stored = split_events(image, struct.unpack_from("<I", image, 13)[0] + 4)
    sent = events[2:]
    assert [e.size for e in sent] == [len(ev) for _o, ev in stored]  # positions stay the master's
    for e, (_o, ev) in zip(sent, stored):
        if ev[4] == C.MARIA_GTID_EVENT:
            assert e.type == C.QUERY_EVENT and e.view.query_text == "BEGIN" and crc_ok(e.raw)
        elif ev[4] in (C.MARIA_GTID_LIST_EVENT, C.MARIA_BINLOG_CHECKPOINT_EVENT):
            assert "# Dummy event replacing event type".startswith(e.view.query_text)
        else:
            assert e.raw == ev


def test_a_gtid_event_mariadb_cannot_rewrite_ends_the_dump_with_its_error(tmp_path):
    big_gtid = E.event(C.MARIA_GTID_EVENT, struct.pack("<QIB", 1, 0, C.FL_GROUP_COMMIT_ID) + bytes(8) + bytes(5))
    image = E.binlog_file(E.event(C.MARIA_GTID_LIST_EVENT, MariaBinlogState().encode_gtid_list_body()), big_gtid,
                          E.query("BEGIN"), E.xid(), server_version=MARIA)
    store = relay_with(tmp_path, {"mariadb-bin.000001": image})
    channel = run(dump_all(make_ctx(store), make_conn(**CRC32, mariadb_slave_capability=3),
                           file_request("mariadb-bin.000001", 4)))
    code, message = error_of(channel.payloads[-1])
    assert code == 1236
    assert message.startswith("Failed to replace GTID event with backwards-compatible event: currupt event.; ")
    store.close()


# ---------------------------------------------------------------------------------------------
# Semi-sync


def test_semi_sync_headers_ack_flags_and_ack_tracking(tmp_path):
    image = mysql_file(GtidSet(), [1, 2])
    ddl_file = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode()), E.gtid(1),
                             E.query("CREATE TABLE t (a INT)"))
    store = relay_with(tmp_path, {"binlog.000001": image})
    ctx = make_ctx(store)
    tracker = D.semi_sync_tracker(ctx)
    ends = group_ends(image)

    async def main():
        channel = FakeChannel()
        conn = make_conn(**CRC32, rpl_semi_sync_slave=1, master_heartbeat_period=30_000_000)
        task = asyncio.create_task(D.serve_dump(ctx, conn, file_request("binlog.000001", 4, 0), channel))
        await channel.wait_until(lambda c: any(p[5 + 2] == C.HEARTBEAT_LOG_EVENT for p in c.payloads))
        assert tracker.replicas == 1
        waiter = asyncio.create_task(tracker.wait_for("binlog.000001", ends[1], 1, timeout=2))
        await asyncio.sleep(0)
        channel.ack("binlog.000001", ends[0])
        await asyncio.sleep(0.01)
        assert conn.dump.last_ack == ("binlog.000001", ends[0]) and not waiter.done()
        channel.ack("binlog.000001", ends[1])
        assert await waiter is True
        assert tracker.count("binlog.000001", ends[1]) == 1 and tracker.count("binlog.000002", 4) == 0
        channel.close()
        await task
        assert tracker.replicas == 0 and tracker.count("binlog.000001", 4) == 0  # forgotten
        return channel

    channel = run(main())
    assert all(p[:2] == b"\x00\xef" and p[2] in (0, 1) for p in channel.payloads)
    events, _ = decode(channel.payloads)
    flagged = [e.log_pos for e in events if e.ack_flag == 1]
    assert flagged == ends  # the XID of each transaction, nothing else
    assert all(e.ack_flag == 0 for e in events if e.type in (C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT,
                                                                C.HEARTBEAT_LOG_EVENT, C.GTID_LOG_EVENT))
    # a DDL's single query is its transaction's last event; without the config option no header at all
    store.close()
    store = relay_with(tmp_path / "ddl", {"binlog.000001": ddl_file})
    events, _ = decode(run(dump_all(make_ctx(store), make_conn(**CRC32, rpl_semi_sync_replica="1"),
                                    file_request())).payloads)
    assert [e.ack_flag for e in events] == [0, 0, 0, 0, 1]
    channel = run(dump_all(make_ctx(store, semi_sync=False), make_conn(**CRC32, rpl_semi_sync_slave=1),
                           file_request()))
    assert all(p[1] != 0xEF for p in channel.payloads[:-1])
    store.close()


def test_semi_sync_tracker_counts_replicas_and_times_out():
    async def main():
        tracker = D.SemiSyncTracker()
        tracker.register("a")
        tracker.register("b")
        assert await tracker.wait_for("binlog.000002", 100, 0) is True
        waiter = asyncio.create_task(tracker.wait_for("binlog.000002", 100, 2, timeout=1))
        tracker.acked("binlog.000002", 150, "a")
        tracker.acked("binlog.000001", 999999, "b")  # an older file, whatever the offset
        await asyncio.sleep(0.01)
        assert not waiter.done() and tracker.count("binlog.000002", 100) == 1
        tracker.acked("binlog.000003", 4, "b")
        assert await waiter is True
        tracker.acked("binlog.000002", 120, "a")  # ACKs never move back
        assert tracker.last_ack("a") == ("binlog.000002", 150)
        assert await tracker.wait_for("binlog.000009", 4, 1, timeout=0.01) is False
        tracker.forget("a")
        assert tracker.replicas == 1 and tracker.count("binlog.000002", 100) == 1
        assert tracker.count("binlog.0000010", 4) == 0  # sequence numbers compare as numbers

    run(main())
