"""Dumps parked at the horizon and served by the shared pass at each advance (downstream/dump/followers.py).

An in-process server with a live store: clients of every kind connect while only part of a real binlog is
durable and wait at the horizon; the rest is made durable in steps (each step one horizon advance). Each client's
stream (heartbeats aside) must equal what the same request gets from the finished file with NON_BLOCK (the
ordinary path, itself checked against the event-by-event path in test_dump_chunks.py). The counters show that
the shared pass did the sending for the plain followers, and handed the others (capability 0: GTID events
rewritten event by event) back to their own tasks. Nothing past a published horizon is ever sent.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.downstream import sendbatch
from relayproxy.downstream.dump import chunks as K
from relayproxy.downstream.dump import followers as F
from relayproxy.upstream.connection import UpstreamConnection
from relayproxy.wire.packets import BINLOG_DUMP_NON_BLOCK, BINLOG_SEND_ANNOTATE_ROWS_EVENT

from .test_downstream_dump import MYSQL80, as_sent, live_store, make_ctx, relay_with, split_events
from .test_sender_processes import MARIA_DIR, _serving

MARIA_FILE = "mariadb-repl-bin.000005"
CRC = ["SET @master_binlog_checksum='CRC32'"]


_server_ids = iter(range(1000, 1 << 30))


def _file_dump(name: str, pos: int, flags: int):
    server_id = next(_server_ids)  # each client its own: a second dump of one server_id ends the first

    async def start(conn):
        await conn.binlog_dump(name, pos, server_id, flags=flags)
    return start


def _gtid_dump(gtids: GtidSet, flags: int):
    server_id = next(_server_ids)

    async def start(conn):
        await conn.binlog_dump_gtid(server_id, gtids.encode(), flags=flags)
    return start


def _event_type(payload: bytes) -> int:
    return payload[1 + 4]


def _log_pos(payload: bytes) -> int:
    return int.from_bytes(payload[1 + 13 : 1 + 17], "little")


async def _open(port: int, setup: list[str], start):
    conn = await UpstreamConnection.connect("127.0.0.1", port, "repl", "replpw", ssl_mode="disabled",
                                            connect_timeout=10)
    for statement in setup:
        await conn.query(statement)
    await start(conn)
    return conn


async def _read_until(conn, end_pos: int, out: list[bytes], horizon) -> None:
    """Payloads until an event ending at ``end_pos``; every event's end must be within the published horizon."""
    while True:
        batch = await conn.read_packets()
        assert batch, "the dump ended early"
        for payload in batch:
            payload = bytes(payload)
            assert payload[0] == 0x00, f"an error instead of an event: {payload[:80]!r}"
            if _event_type(payload) == C.HEARTBEAT_LOG_EVENT:
                continue
            out.append(payload)
            log_pos = _log_pos(payload)
            if log_pos and _event_type(payload) not in (C.ROTATE_EVENT, C.FORMAT_DESCRIPTION_EVENT):
                assert log_pos <= horizon.snapshot().position, "an event past the durable horizon was sent"
            if log_pos == end_pos:  # (the fake ROTATE has log_pos 0)
                return


async def _reference(port: int, setup: list[str], start) -> list[bytes]:
    conn = await _open(port, setup, start)
    out = []
    try:
        while True:
            for payload in await conn.read_packets():
                payload = bytes(payload)
                if payload[0] in (0xFE, 0xFF):
                    assert payload[0] == 0xFE, payload
                    return out
                if _event_type(payload) != C.HEARTBEAT_LOG_EVENT:  # (as in _read_until: timing decides those)
                    out.append(payload)
    finally:
        conn.abort()


def _scenario(tmp_path, name: str, image: bytes, version: str, clients: list[tuple[str, list[str], object]],
              first: int, steps: int, expect_parked: int):
    """Feed ``events[:first]``, connect every client (blocking dumps), feed the rest in ``steps`` syncs, read each
    stream to the file's end; then the same requests as NON_BLOCK from the finished file. Returns
    (followed streams, reference streams, the Followers counters)."""
    events = split_events(image)
    store, feeder = live_store(tmp_path, name)
    feeder.feed_events(events[:first])
    store.sync()
    ctx = make_ctx(store, semi_sync=False, version=version)
    end_pos = len(image)

    async def run():
        async with _serving(ctx, 0) as (port, _pool):
            conns = [await _open(port, setup, start(0)) for _label, setup, start in clients]
            outs: list[list[bytes]] = [[] for _ in clients]
            readers = [asyncio.create_task(_read_until(c, end_pos, out, store.horizon))
                       for c, out in zip(conns, outs)]
            await asyncio.sleep(0.3)  # every client reaches the horizon and parks (or waits)
            parked = F.describe(store.horizon)["parked"]
            assert parked == expect_parked, f"{parked} dumps parked at the horizon, {expect_parked} expected"
            rest = events[first:]
            per = max(1, len(rest) // steps)
            for i in range(0, len(rest), per):
                feeder.feed_events(rest[i : i + per])
                store.sync()
                await asyncio.sleep(0.02)
            await asyncio.wait_for(asyncio.gather(*readers), 30)
            followers = F._followers.get(store.horizon)
            counters = (followers.passes, followers.written, followers.woken, followers.batched) if followers else (
                0, 0, 0, 0)
            for c in conns:
                c.abort()
            K.PIECES_MIN_PACKET = _DEFAULT_PIECES  # the reference goes out as patched copies whatever the fixture
            refs = [await _reference(port, setup, start(BINLOG_DUMP_NON_BLOCK)) for _l, setup, start in clients]
            return outs, refs, counters

    try:
        return asyncio.run(asyncio.wait_for(run(), 90))
    finally:
        store.close()


_DEFAULT_PIECES = K.PIECES_MIN_PACKET


@pytest.fixture(params=["copies", "pieces"])
def framing(request, monkeypatch):
    """Both ways a replica's framing of a shared chunk goes out: a patched copy (small events) and, forced here for
    every chunk, slices of the shared bytes with its sequence bytes between them (writev; large events)."""
    if request.param == "pieces":
        monkeypatch.setattr(K, "PIECES_MIN_PACKET", 0)
    return request.param


@pytest.fixture(params=["batch", "batch, 2 threads", "transports"])
def sends(request, monkeypatch):
    """The ways the shared pass writes: one batch call for the pass's sockets (sendbatch.py, the C extension), the
    batch split over two threads (forced here for 4 clients), and each socket's transport (no C extension)."""
    if request.param == "batch, 2 threads":
        monkeypatch.setattr(sendbatch, "THREADS", 2)
        monkeypatch.setattr(sendbatch, "SPLIT_MIN", 1)
    elif request.param == "transports":
        monkeypatch.setattr(sendbatch, "_send_batch", None)
    return request.param


def _check_batched(sends: str, batched: int, written: int) -> None:
    if sends == "transports":
        assert batched == 0, "the pass batched its writes with the C extension turned off"
    else:
        assert batched >= written > 0, f"{batched} batch writes for {written} ranges written by the pass"


def _compare(clients, outs, refs) -> None:
    for (label, _setup, _start), out, ref in zip(clients, outs, refs):
        assert len(out) == len(ref), f"{label}: {len(out)} events followed, {len(ref)} from the finished file"
        for i, (a, b) in enumerate(zip(out, ref)):
            assert a == b, f"{label}: event {i} differs (type {_event_type(a)} vs {_event_type(b)})"


def test_mysql_followers_get_the_same_stream_as_the_ordinary_path(tmp_path, corpus_dir, framing, sends):
    image = as_sent((corpus_dir / MYSQL80).read_bytes())
    name = "binlog.000004"
    sid = "83759871-1141-11ed-b12d-0242ac130003"
    clients = [
        ("file/position", CRC, lambda flags: _file_dump(name, 4, flags)),
        ("file/position, heartbeats", CRC + ["SET @master_heartbeat_period=200000000"],
         lambda flags: _file_dump(name, 4, flags)),
        ("GTID, nothing to skip", CRC, lambda flags: _gtid_dump(GtidSet.parse(f"{sid}:1-5"), flags)),
        # 6-26 are in the file; 6-7 are durable at the start: skipped, then it follows
        ("GTID, skips the first two", CRC, lambda flags: _gtid_dump(GtidSet.parse(f"{sid}:1-7"), flags)),
    ]
    outs, refs, (passes, written, woken, batched) = _scenario(tmp_path, name, image, "8.0.29", clients, first=12,
                                                              steps=12, expect_parked=4)
    _compare(clients, outs, refs)
    _check_batched(sends, batched, written)
    assert passes >= 5, f"only {passes} shared passes for 12 advances"
    assert written >= 4 * 5, f"the shared pass wrote {written} ranges: the followers were not served by it"


def _maria_gtid_at(events, index: int) -> str:
    """domain-server-seq of the index-th MariaDB GTID event among ``events``."""
    gtid_events = [e for _pos, e in events if e[4] == C.MARIA_GTID_EVENT]
    event = gtid_events[index]
    server_id = struct.unpack_from("<I", event, 5)[0]
    seq, domain = struct.unpack_from("<QI", event, C.HEADER_LEN)
    return f"{domain}-{server_id}-{seq}"


def test_mariadb_followers_get_the_same_stream_as_the_ordinary_path(tmp_path, corpus_dir, framing, sends):
    image = as_sent((corpus_dir / MARIA_DIR / MARIA_FILE).read_bytes())
    events = split_events(image)
    annotate = BINLOG_SEND_ANNOTATE_ROWS_EVENT
    cap4 = CRC + ["SET @mariadb_slave_capability=4"]
    start = _maria_gtid_at(events, 8)  # durable when it connects (a master refuses a GTID it does not have)
    clients = [
        ("capability 4, annotate", cap4, lambda flags: _file_dump(MARIA_FILE, 4, flags | annotate)),
        ("capability 4, no annotate (left out)", cap4, lambda flags: _file_dump(MARIA_FILE, 4, flags)),
        ("GTID start", cap4 + [f"SET @slave_connect_state='{start}'"],
         lambda flags: _file_dump("", 4, flags | annotate)),
        ("capability 0 (event by event)", CRC + ["SET @mariadb_slave_capability=0"],
         lambda flags: _file_dump(MARIA_FILE, 4, flags)),
    ]
    outs, refs, (passes, written, woken, batched) = _scenario(tmp_path, MARIA_FILE, image, "10.11.6-MariaDB-log",
                                                              clients, first=100, steps=20, expect_parked=4)
    _compare(clients, outs, refs)
    _check_batched(sends, batched, written)
    assert passes >= 10, f"only {passes} shared passes for 20 advances"
    assert written >= 2 * 10, f"the shared pass wrote {written} ranges"
    # (capability 0 parks too: each range it cannot take as it is wakes its task, which rewrites the GTID events)
    assert woken >= 1, "the capability 0 client was never handed back to its own task"


def test_heartbeats_still_come_once_the_stream_goes_quiet(tmp_path, corpus_dir):
    """A follower served by the shared pass still gets heartbeats once nothing more arrives: its timer counts from
    the last thing sent for it."""
    image = as_sent((corpus_dir / MYSQL80).read_bytes())
    events = split_events(image)
    store, feeder = live_store(tmp_path, "binlog.000004")
    feeder.feed_events(events[:12])
    store.sync()
    ctx = make_ctx(store, semi_sync=False, version="8.0.29")

    async def run():
        async with _serving(ctx, 0) as (port, _pool):
            conn = await _open(port, CRC + ["SET @master_heartbeat_period=300000000"],
                               _file_dump("binlog.000004", 4, 0))
            for _pos, event in events[12:]:
                feeder.feed_events([(_pos, event)])
                store.sync()
                await asyncio.sleep(0.01)
            got: list[bytes] = []
            while sum(_event_type(p) == C.HEARTBEAT_LOG_EVENT for p in got) < 3:
                got += [bytes(p) for p in await asyncio.wait_for(conn.read_packets(), 10)]
            conn.abort()
            followers = F._followers.get(store.horizon)
            return got, followers.written

    try:
        got, written = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        store.close()
    assert written > 0
    events_seen = [p for p in got if _event_type(p) != C.HEARTBEAT_LOG_EVENT]
    assert _log_pos(events_seen[-1]) == len(image), "the follower did not get the whole file"
    beats = [p for p in got if _event_type(p) == C.HEARTBEAT_LOG_EVENT]
    assert len(beats) >= 3


def _with_timestamps(image: bytes, timestamp: int) -> bytes:
    """The file with every event's timestamp set to ``timestamp`` and its CRC32 recomputed."""
    out = bytearray(image)
    for pos, event in split_events(image):
        struct.pack_into("<I", out, pos, timestamp)
        size = len(event)
        struct.pack_into("<I", out, pos + size - 4, zlib.crc32(out[pos : pos + size - 4]))
    return bytes(out)


def test_an_event_that_looks_like_an_ack_request_does_not_restart_the_numbering(tmp_path, corpus_dir):
    """A plain dump payload is 0x00 + the event, and an event's timestamp may start with 0xEF 0x01 (one second in
    65,536): the payload then starts like a semi-sync ACK request (0x00 0xEF 0x01). Only a semi-sync dump may restart
    its packet numbering on it; a plain one restarting it sent the replica packets out of order, and a MariaDB
    replica reconnected at that event forever (seen in test_chain_of_two_relays_feeds_a_replica)."""
    image = _with_timestamps(as_sent((corpus_dir / MYSQL80).read_bytes()), 0x6A5001EF)
    store = relay_with(tmp_path, {"binlog.000004": image})
    ctx = make_ctx(store, semi_sync=True, version="8.0.29")
    sid = "83759871-1141-11ed-b12d-0242ac130003"

    async def run():
        async with _serving(ctx, 0) as (port, _pool):
            # file/position (the FDE goes event by event) and GTID with a skip (every event of the range by itself)
            plain = await _reference(port, CRC, _file_dump("binlog.000004", 4, BINLOG_DUMP_NON_BLOCK))
            skip = await _reference(port, CRC, _gtid_dump(GtidSet.parse(f"{sid}:1-25"), BINLOG_DUMP_NON_BLOCK))
            return plain, skip

    try:
        plain, skip = asyncio.run(asyncio.wait_for(run(), 60))  # the client checks every sequence id
    finally:
        store.close()
    events = split_events(image)
    assert len(plain) == 1 + len(events)  # the fake ROTATE, then every event of the file
    assert all(p[1:5] == struct.pack("<I", 0x6A5001EF) for p in plain[1:]) and plain[1][:3] == b"\x00\xef\x01"
    assert skip[-1][1:] == events[-1][1], "the last group (GTID 26) did not arrive whole"


@pytest.mark.slow
@pytest.mark.parametrize("sends", ["batch", "transports"], indirect=True)
def test_a_replica_whose_socket_fills_in_a_pass_gets_the_rest_in_order(tmp_path, corpus_dir, sends):
    """A replica that reads nothing while megabytes become durable: the pass's batch write to it takes only part of
    a range (its socket is full), the rest goes to its transport, the dump leaves the pass for its own task (above
    the high-water mark), and once the replica reads, its stream is byte-identical to the finished file's. The
    replica beside it, reading all along, is served by the pass and gets the same."""
    image = as_sent((corpus_dir / MARIA_DIR / "mariadb-repl-bin.000002").read_bytes())
    name = "mariadb-repl-bin.000002"
    events = split_events(image)[:-1]  # up to its closing ROTATE (there is no next file here)
    end = events[-1][0] + len(events[-1][1])
    store, feeder = live_store(tmp_path, name)
    feeder.feed_events(events[:50])
    store.sync()
    ctx = make_ctx(store, semi_sync=False, version="10.11.6-MariaDB-log")
    cap4 = CRC + ["SET @mariadb_slave_capability=4"]

    async def run():
        async with _serving(ctx, 0) as (port, _pool):
            reader = await _open(port, cap4, _file_dump(name, 4, BINLOG_SEND_ANNOTATE_ROWS_EVENT))
            slow = await _open(port, cap4, _file_dump(name, 4, BINLOG_SEND_ANNOTATE_ROWS_EVENT))
            slow._protocol.max_buffered = 0  # stop reading at the first bytes: the kernel's buffers fill
            out_reader: list[bytes] = []
            reading = asyncio.create_task(_read_until(reader, end, out_reader, store.horizon))
            await asyncio.sleep(0.3)
            assert F.describe(store.horizon)["parked"] == 2
            for dump in F._followers[store.horizon].parked:  # the relay's side: a full socket sooner
                sock = dump.channel._protocol.transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            rest = events[50:]
            per = max(1, len(rest) // 100)  # ~37 KB an advance (a pass reads at most 64 KB inline)
            for i in range(0, len(rest), per):
                feeder.feed_events(rest[i : i + per])
                store.sync()
                await asyncio.sleep(0.02)
            await asyncio.wait_for(reading, 30)
            out_slow: list[bytes] = []
            await asyncio.wait_for(_read_until(slow, end, out_slow, store.horizon), 30)
            counters = F.describe(store.horizon)
            reader.abort()
            slow.abort()
            ref = await _reference(port, cap4, _file_dump(name, 4, BINLOG_SEND_ANNOTATE_ROWS_EVENT | BINLOG_DUMP_NON_BLOCK))
            assert _log_pos(ref[-1]) == end
            return out_reader, out_slow, ref, counters

    try:
        out_reader, out_slow, ref, counters = asyncio.run(asyncio.wait_for(run(), 90))
    finally:
        store.close()
    assert out_reader == ref, "the replica that kept reading got another stream"
    assert out_slow == ref, "the replica whose socket filled got another stream"
    if sends == "batch":
        assert counters["partial"] >= 1, f"no batch write was partial: {counters}"
    else:
        assert counters["batched"] == 0
    assert counters["woken"] >= 1, f"the full replica never left the pass for its own task: {counters}"
