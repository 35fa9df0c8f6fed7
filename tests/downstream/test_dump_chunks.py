"""Shared framed chunks (downstream/dump/chunks.py): the same stream as event by event, for every replica.

Every corpus file is streamed into a relay store and dumped twice per kind of replica, once through a
channel that takes shared chunks and once through one that does not (the event-by-event path): the
payloads must be identical, whatever the mode (file/position from the start or mid-file, MySQL GTID with
an exclude set, MariaDB GTID, each MariaDB capability, ANNOTATE_ROWS asked for or not, skip_replication).
The chunk scanner itself is property-tested against feeding events one at a time, and a damaged event
inside a chunk gets the error the event-by-event path gives.
"""

from __future__ import annotations

import asyncio
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.events import FormatDescription
from relayproxy.binlog.gtid import GtidSet
from relayproxy.downstream.dump import chunks as K
from relayproxy.downstream.dump import sender as S
from relayproxy.relay.errors import RelayEventError
from relayproxy.wire import packets as P

from ..support import eventgen as eg
from .test_downstream_dump import (
    CRC32,
    ChunklessChannel,
    FakeChannel,
    decode,
    dump_all,
    error_of,
    file_request,
    gtid_request,
    live_store,
    make_conn,
    make_ctx,
    maria_request,
    relay_with,
    run,
    split_events,
)

NAME = "binlog.000001"


def unframe(framed, seq0: int) -> tuple[list[bytes], int]:
    """The payloads of consecutive dump packets, checking that their sequence ids run on from ``seq0``; and the
    sequence id after the last."""
    at, seq, payloads = 0, seq0, []
    while at < len(framed):
        length = int.from_bytes(framed[at : at + 3], "little")
        assert framed[at + 3] == seq, f"packet {len(payloads)} numbered {framed[at + 3]}, expected {seq}"
        payloads.append(bytes(framed[at + 4 : at + 4 + length]))
        seq = (seq + 1) & 0xFF
        at += 4 + length
    return payloads, seq


def corpus_entries(corpus_dir):
    import json

    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    # Relay logs hold artificial events a relay never stores; the rest are binlogs as masters wrote them.
    return [e for e in manifest if not e["relay"] and (corpus_dir / e["file"]).stat().st_size <= (8 << 20)]


def fed_store(tmp_path, image: bytes):
    """The file as a relay file (recovery sets the horizon at its last complete group); None when the file is
    one the store refuses (e.g. artificial events written by a tool)."""
    fde_size = struct.unpack_from("<I", image, 4 + 9)[0]
    try:
        store = relay_with(tmp_path, {NAME: image})
    except (RelayEventError, ValueError):
        return None
    events, pos = [], 4
    while pos + C.HEADER_LEN <= len(image):  # whole events only: some corpus files end inside one
        size = struct.unpack_from("<I", image, pos + 9)[0]
        if size < C.HEADER_LEN or pos + size > len(image):
            break
        events.append((pos, image[pos : pos + size]))
        pos += size
    return store, events, 4 + fde_size


def both(store, conn_vars: dict, request) -> tuple[list[bytes], FakeChannel]:
    """(payloads, shared channel) after dumping with and without shared chunks; asserts they are equal."""
    shared = run(dump_all(make_ctx(store), make_conn(**conn_vars), request, FakeChannel()))
    plain = run(dump_all(make_ctx(store), make_conn(**conn_vars), request, ChunklessChannel()))
    assert len(shared.payloads) == len(plain.payloads)
    for i, (a, b) in enumerate(zip(shared.payloads, plain.payloads)):
        assert a == b, f"payload {i} differs"
    return shared.payloads, shared


def group_start_offsets(events, fde_end: int) -> list[int]:
    parser = B.TransactionBoundaryParser()
    starts = []
    for offset, event in events:
        if event[4] == C.FORMAT_DESCRIPTION_EVENT:
            parser.set_format(FormatDescription.parse(event))
            continue
        if parser.feed_event(event, 0) & B.RESULT_MASK == B.GROUP_START and offset >= fde_end:
            starts.append((offset, parser.gtid))
    return starts


def test_every_corpus_file_dumps_identically_through_shared_chunks(tmp_path, corpus_dir):
    """The whole corpus, each kind of replica: shared chunks change no byte of what a replica gets."""
    streamed = used = 0
    for index, entry in enumerate(corpus_entries(corpus_dir)):
        image = (corpus_dir / entry["file"]).read_bytes()
        if len(image) < 4 + C.HEADER_LEN or image[:4] != C.BINLOG_MAGIC or image[4 + 4] != C.FORMAT_DESCRIPTION_EVENT:
            continue  # a v1/v3 file (MySQL 3.x/4.x): no FDE to stream
        opened = fed_store(tmp_path / str(index), image)
        if opened is None:
            continue
        store, events, fde_end = opened
        try:
            snap = store.horizon.snapshot()
            if snap.position <= fde_end:
                continue  # no complete group: nothing past the header to stream
            streamed += 1
            mariadb = "MariaDB" in entry["server_version"]
            variants = [dict(CRC32)]
            if mariadb:
                variants += [
                    dict(CRC32, mariadb_slave_capability=4),
                    dict(CRC32, mariadb_slave_capability=2),
                    dict(CRC32, mariadb_slave_capability=1),
                    dict(CRC32, mariadb_slave_capability=0),
                ]
            for conn_vars in variants:
                for flags in (P.BINLOG_DUMP_NON_BLOCK, P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT):
                    _payloads, channel = both(store, conn_vars, file_request(NAME, 4, flags))
                    used += channel.chunks_sent > 0
            starts = group_start_offsets(events, fde_end)
            if len(starts) >= 2:
                mid, gtid = starts[len(starts) // 2]
                both(store, dict(CRC32), file_request(NAME, mid))
                if gtid is not None and not mariadb:
                    have = GtidSet()
                    for _offset, event in events:
                        if event[4] == C.PREVIOUS_GTIDS_LOG_EVENT:  # what the file's master had before it
                            crc = entry["checksum_alg"] == "CRC32"
                            have = GtidSet.decode(event, C.HEADER_LEN, len(event) - C.HEADER_LEN - 4 * crc)
                            break
                    for _offset, g in starts[: len(starts) // 2]:
                        if g is not None and len(g) == 2:
                            have.add(g[0], g[1])
                    both(store, dict(CRC32), gtid_request(have))
                if gtid is not None and mariadb:
                    state = "%d-%d-%d" % gtid
                    both(store, dict(CRC32, mariadb_slave_capability=4, slave_connect_state=state),
                         maria_request(P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT))
        finally:
            store.close()
    assert streamed >= 70, f"only {streamed} corpus files could be streamed"
    assert used >= streamed, "shared chunks were hardly used: the comparison proves nothing"


def test_real_mariadb_files_across_rotations_and_gtid_starts(tmp_path, corpus_dir):
    names = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5, 6, 7)]
    base = corpus_dir / "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
    store = relay_with(tmp_path, {name: (base / name).read_bytes() for name in names})
    try:
        request = file_request(names[0], 4, P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT)
        payloads, channel = both(store, dict(CRC32, mariadb_slave_capability=4), request)
        assert channel.chunks_sent >= len(names) and decode(payloads)[1][0] == 0xFE
        # Without ANNOTATE_ROWS asked for, a GTID-aware replica is sent the chunks without them (a MariaDB master
        # leaves them out for a replica that tolerates holes). (Below capability 4 every GTID event is rewritten:
        # those replicas go event by event, compared with the whole corpus above.)
        for cap, gone in ((4, {C.MARIA_ANNOTATE_ROWS_EVENT}),):
            payloads, channel = both(store, dict(CRC32, mariadb_slave_capability=cap), file_request(names[0], 4))
            assert channel.chunks_sent >= len(names), f"capability {cap}: the omitting path was not taken"
            sent_types = {p[1 + 4] for p in payloads[:-1] if p[1 + 17] & 0x20 == 0}  # not artificial
            assert not sent_types & gone and C.MARIA_GTID_EVENT in sent_types
        for state in ("0-10-262583", "0-10-262700", "0-10-262583,1-1-5"):
            both(store, dict(CRC32, mariadb_slave_capability=4, slave_connect_state=state),
                 maria_request(P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT))
        both(store, dict(CRC32, mariadb_slave_capability=4, slave_connect_state="0-10-262583",
                         slave_gtid_strict_mode=1), maria_request())
    finally:
        store.close()


def test_a_cached_chunk_keeps_its_range_once_and_a_replica_that_cannot_take_it_reads_again(tmp_path, corpus_dir):
    """A framed chunk drops the bytes it was read from (the framing holds every whole event), so the cache holds
    a range once; a replica for which the chunk is not plain (capability 0: every GTID event is rewritten) finds
    it cached without those bytes, reads the range again and gets exactly the event-by-event stream."""
    names = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5)]
    base = corpus_dir / "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
    store = relay_with(tmp_path, {name: (base / name).read_bytes() for name in names})
    try:
        cache = K.chunk_cache(store)
        request = file_request(names[0], 4, P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT)
        _payloads, channel = both(store, dict(CRC32, mariadb_slave_capability=4), request)
        assert channel.chunks_sent >= len(names)
        held = [chunk for chunk in cache._done.values() if chunk.ok]
        assert held, "nothing was cached"
        for chunk in held:
            assert chunk.data is None and chunk.size == len(chunk.framed)
            assert chunk.length >= chunk.end - chunk.start
        hits = cache.hits
        payloads, channel = both(store, dict(CRC32, mariadb_slave_capability=0), request)
        assert cache.hits > hits, "the capability-0 replica never met a cached chunk"
        assert channel.chunks_sent == 0 and len(payloads) > len(held)
    finally:
        store.close()


def test_followers_at_the_horizon_share_one_chunk_per_advance(tmp_path, corpus_dir):
    """Replicas waiting at the horizon all ask for the range it advanced by: it is read and framed once."""
    image = (corpus_dir / "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004").read_bytes()
    events = split_events(image)
    store, feeder = live_store(tmp_path, "binlog.000004")
    half = len(events) // 2
    feeder.feed_events(events[:half])
    store.sync()
    cache = K.chunk_cache(store)

    async def scenario():
        channels = [FakeChannel() for _ in range(5)]
        ctx = make_ctx(store)
        tasks = [asyncio.create_task(dump_all(ctx, make_conn(**CRC32), file_request("binlog.000004", 4, 0), ch))
                 for ch in channels]
        horizon = store.horizon.snapshot().position
        for ch in channels:
            await ch.wait_until(lambda c: sum(len(p) - 1 for p in c.payloads) >= horizon - 4 - 1000)
        misses = cache.misses
        feeder.feed_events(events[half:])
        store.sync()
        end = store.horizon.snapshot().position
        assert end > horizon
        for ch in channels:
            await ch.wait_until(lambda c: c.payloads and
                                struct.unpack_from("<I", c.payloads[-1], 1 + 13)[0] == end)
        new = cache.misses - misses
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return channels, new

    channels, new_reads = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert new_reads >= 1 and new_reads <= 2, f"{new_reads} chunk reads for one advance seen by 5 replicas"
    assert all(ch.payloads == channels[0].payloads for ch in channels[1:])
    store.close()


def test_a_damaged_event_inside_a_chunk_gets_the_event_by_event_error(tmp_path, corpus_dir):
    image = bytearray((corpus_dir / "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004").read_bytes())
    events = split_events(bytes(image))
    offset, event = events[len(events) // 2]
    image[offset + C.HEADER_LEN + 2] ^= 0xFF  # the CRC no longer matches
    store = relay_with(tmp_path, {"binlog.000004": (corpus_dir / "zendesk-maxwell/src/test/resources/sql/replay/"
                                                    "binlog.000004").read_bytes()})
    (tmp_path / "relay" / "binlog.000004").write_bytes(bytes(image))  # damaged after recovery checked it
    try:
        payloads, channel = both(store, dict(CRC32), file_request("binlog.000004", 4))
        code, message = error_of(decode(payloads)[1])
        assert code == 1236 and "did not pass crc check" in message and f"at {offset}," in message
        sent = b"".join(p[1:] for p in payloads[:-1])
        assert image[offset : offset + len(event)] not in sent  # the damaged event never left
    finally:
        store.close()


def _large_events_image() -> tuple[bytes, list[int]]:
    """A MySQL file of DDL-like groups (GTID + one Query) whose statements are larger than a shared chunk, up to
    and past what a chunk may hold (``_STREAM_PIECE``), between small ones; and the sizes of the large events."""
    sizes = [300 << 10, 1 << 20, (3 << 20) + 7, 5 << 20, (256 << 10) + 1]
    events, gno = [eg.previous_gtids()], 1
    for size in sizes:
        for small in range(3):
            events += [eg.gtid(gno), eg.query(f"CREATE TABLE t{gno} (a INT)")]
            gno += 1
        text = b"/* " + bytes(97 + i % 26 for i in range(size)) + b" */ CREATE TABLE big" + str(gno).encode() + b" (a INT)"
        events += [eg.gtid(gno), eg.query(text)]
        gno += 1
    events += [eg.gtid(gno), eg.query("DROP TABLE t1")]
    return eg.binlog_file(*events), [len(e) for e in events if len(e) > S.SHARED_CHUNK]


def test_events_larger_than_a_chunk_are_shared_too(tmp_path):
    """An event larger than a shared chunk (a bulk statement, a large row event), up to ``_STREAM_PIECE``, is a
    chunk of its own: replicas catching up through it share its read, CRC check and framing, and get the same
    bytes as event by event. Larger events are still streamed from the file by each replica."""
    image, large = _large_events_image()
    store = relay_with(tmp_path, {NAME: image})
    try:
        cache = K.chunk_cache(store)
        request = file_request(NAME, 4, P.BINLOG_DUMP_NON_BLOCK)
        payloads, channel = both(store, dict(CRC32), request)
        sent = {len(p) - 1 for p in payloads}
        assert all(size in sent for size in large), "a large event was not sent whole"
        shared = [c for c in cache._done.values() if c.ok and c.end - c.start > S.SHARED_CHUNK]
        assert sorted(c.end - c.start for c in shared) == sorted(n for n in large if n <= S._STREAM_PIECE)
        misses = cache.misses
        for _ in range(3):  # more replicas catching up: every chunk, large ones included, is read once
            again, _channel = both(store, dict(CRC32), request)
            assert again == payloads
        assert cache.misses == misses, "a replica read a chunk another had read"
        both(store, dict(CRC32), gtid_request(GtidSet.parse(str(GtidSet()))))  # MySQL GTID from nothing
    finally:
        store.close()


def test_large_annotate_events_are_shared_whether_sent_or_left_out(tmp_path):
    """MariaDB writes each row-based statement's text as an ANNOTATE_ROWS event: a bulk INSERT's is as large as its
    rows. A replica that did not ask for them is sent the chunks without them; one that did gets them. Both share
    the one read of each, and get the event-by-event path's bytes."""
    events, text = [], b"INSERT INTO t VALUES " + b",".join(b"('%s')" % (b"x" * 8000) for _ in range(100))
    for seq in range(1, 6):
        events += [eg.maria_gtid(seq), eg.query("BEGIN"),
                   eg.event(C.MARIA_ANNOTATE_ROWS_EVENT, text[: (seq * 200 << 10)]),
                   eg.table_map(), eg.write_rows(), eg.xid(seq)]
    image = eg.binlog_file(*events, server_version="10.11.6-MariaDB-log")
    store = relay_with(tmp_path, {NAME: image})
    try:
        cache = K.chunk_cache(store)
        for flags in (P.BINLOG_DUMP_NON_BLOCK, P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT):
            payloads, channel = both(store, dict(CRC32, mariadb_slave_capability=4), file_request(NAME, 4, flags))
            annotations = [p for p in payloads if len(p) > 5 and p[1 + 4] == C.MARIA_ANNOTATE_ROWS_EVENT]
            assert len(annotations) == (5 if flags & P.BINLOG_SEND_ANNOTATE_ROWS_EVENT else 0)
            assert channel.chunks_sent >= 5
        large = [c for c in cache._done.values() if c.ok and c.types == {C.MARIA_ANNOTATE_ROWS_EVENT}]
        assert len(large) >= 4, "the large ANNOTATE_ROWS events were not chunks of their own"
    finally:
        store.close()


def test_a_damaged_large_event_gets_the_event_by_event_error(tmp_path):
    image, large = _large_events_image()
    store = relay_with(tmp_path, {NAME: image})
    events = split_events(image)
    offset, event = next((o, e) for o, e in events if len(e) == large[1])
    damaged = bytearray(image)
    damaged[offset + len(event) // 2] ^= 0xFF  # the CRC no longer matches
    (tmp_path / "relay" / NAME).write_bytes(bytes(damaged))  # damaged after recovery checked it
    try:
        payloads, _channel = both(store, dict(CRC32), file_request(NAME, 4))
        code, message = error_of(decode(payloads)[1])
        assert code == 1236 and "did not pass crc check" in message and f"at {offset}," in message
        assert all(len(p) - 1 != len(event) for p in payloads[:-1])  # the damaged event never left
    finally:
        store.close()


def test_a_grown_chunk_in_the_cache_is_never_sent_past_a_replicas_limit(tmp_path):
    """Defence in depth: the chunk a large event grew into for one replica is sent to another only when it ends by
    that replica's limit. Valid files never put a limit inside an event; a closed file cut on disk inside a large
    event after one replica read it does: the next replica must get the event-by-event path's error there, not the
    cached event and what follows it."""
    image, large = _large_events_image()
    closed = image + eg.rotate("binlog.000002")
    store = relay_with(tmp_path, {NAME: closed, "binlog.000002": C.BINLOG_MAGIC})
    try:
        cache = K.chunk_cache(store)
        first = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request(NAME, 4, P.BINLOG_DUMP_NON_BLOCK),
                             FakeChannel()))
        assert all(size in {len(p) - 1 for p in first.payloads} for size in large)
        offset, event = next((o, e) for o, e in split_events(image) if len(e) == large[1])
        grown = [c for c in cache._done.values() if c.ok and c.start == offset]
        assert grown and grown[0].end == offset + len(event), "the 1 MB event was not a chunk of its own"
        cut = offset + S.SHARED_CHUNK + 100  # inside the event, past a chunk's worth of it: the same chunk key
        with open(tmp_path / "relay" / NAME, "r+b") as f:
            f.truncate(cut)
        payloads = run(dump_all(make_ctx(store), make_conn(**CRC32), file_request(NAME, 4, P.BINLOG_DUMP_NON_BLOCK),
                                FakeChannel())).payloads
        code, message = error_of(decode(payloads)[1])
        assert code == 1236 and f"at {offset}," in message, message
        assert all(len(p) - 1 != len(event) for p in payloads[:-1]), "the cached event went past the file's end"
    finally:
        store.close()


# -- the scanner alone ---------------------------------------------------------------------------


def _mysql_image(corpus_dir) -> bytes:
    return (corpus_dir / "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004").read_bytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_scan_chunk_equals_feeding_events_one_at_a_time(corpus_dir, data):
    image = _mysql_image(corpus_dir)
    events = split_events(image)
    fde = FormatDescription.parse(events[0][1])
    first = data.draw(st.integers(1, len(events) - 1), label="first event")
    cut = data.draw(st.integers(events[first][0] + 1, len(image)), label="bytes read end")
    start = events[first][0]
    reference = B.TransactionBoundaryParser(fde=fde)
    for _offset, event in events[1:first]:
        reference.feed_event(event, 0)
    chunk = K.scan_chunk(NAME, start, image[start:cut], reference.copy(), True)
    whole = [(o, e) for o, e in events[first:] if o + len(e) <= cut]
    assert chunk.end == (whole[-1][0] + len(whole[-1][1]) if whole else start)
    if not whole:
        assert not chunk.ok
        return
    assert chunk.ok and chunk.events == len(whole)
    gtids = []
    for _offset, event in whole:
        if reference.feed_event(event, 0) & B.RESULT_MASK == B.GROUP_START:
            gtids.append(reference.gtid)
    assert chunk.gtids == gtids
    assert chunk.parser.state_key() == reference.state_key()
    assert chunk.types == frozenset(e[4] for _o, e in whole)
    seq0 = data.draw(st.integers(0, 255), label="first sequence id")
    framed, next_seq = chunk.frame_for(seq0)
    payloads, seq = unframe(framed, seq0)
    assert next_seq == seq and payloads == [b"\x00" + e for _o, e in whole]
    pieces, pieces_seq = chunk.pieces_for(seq0)
    assert b"".join(pieces) == framed and pieces_seq == next_seq


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_chunk_without_some_event_types_is_the_chunk_with_those_events_left_out(corpus_dir, data):
    base = corpus_dir / "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
    image = (base / "mariadb-repl-bin.000005").read_bytes()
    events = split_events(image)
    fde = FormatDescription.parse(events[0][1])
    chunk = K.scan_chunk(NAME, events[1][0], image[events[1][0]:], B.TransactionBoundaryParser(fde=fde), True)
    assert chunk.ok and chunk.events == len(events) - 1
    omit = frozenset(data.draw(st.sets(st.sampled_from(sorted(chunk.types))), label="types left out"))
    seq0 = data.draw(st.integers(0, 255), label="first sequence id")
    framed, next_seq = chunk.frame_for(seq0, omit)
    payloads, seq = unframe(framed, seq0)
    assert next_seq == seq
    assert payloads == [b"\x00" + e for _o, e in events[1:] if e[4] not in omit]
    assert chunk.variant(omit)[2] == len(payloads)
    # the same packets as pieces of the shared framing (what a replica gets by writev for large events)
    pieces, pieces_seq = chunk.pieces_for(seq0, omit)
    assert b"".join(pieces) == framed and pieces_seq == next_seq
    assert all(isinstance(p, memoryview) and p.obj is chunk.variant(omit)[0] for p in pieces[::2]), \
        "a piece is a copy, not a slice of the shared framing"


def test_scan_chunk_stops_at_a_bad_crc_and_an_impossible_size(corpus_dir):
    image = bytearray(_mysql_image(corpus_dir))
    events = split_events(bytes(image))
    fde = FormatDescription.parse(events[0][1])
    start = events[2][0]
    bad_offset, bad = events[5]
    damaged = bytearray(image)
    damaged[bad_offset + C.HEADER_LEN] ^= 1
    chunk = K.scan_chunk(NAME, start, bytes(damaged[start:]), B.TransactionBoundaryParser(fde=fde), True)
    assert chunk.ok and chunk.end == bad_offset  # the good events before it; the sender goes on event by event
    chunk = K.scan_chunk(NAME, bad_offset, bytes(damaged[bad_offset:]), B.TransactionBoundaryParser(fde=fde), True)
    assert not chunk.ok and chunk.end == bad_offset
    short = bytearray(image)
    struct.pack_into("<I", short, start + 9, 5)
    chunk = K.scan_chunk(NAME, start, bytes(short[start:]), B.TransactionBoundaryParser(fde=fde), True)
    assert not chunk.ok and chunk.end == start
    assert zlib.crc32(bytes(bad[:-4])) == struct.unpack_from("<I", bad, len(bad) - 4)[0]


def test_the_cache_is_bounded_and_a_failed_read_lets_waiters_read_themselves():
    async def scenario():
        cache = K.ChunkCache(budget=3000)

        async def make(n):
            chunk = K.Chunk("f", 4, b"x" * n)
            return chunk

        for i in range(10):
            await cache.get(("f", i), lambda: make(1000))
        assert cache.held <= 3000 and len(cache._done) == 3

        gate = asyncio.Event()

        async def failing():
            await gate.wait()
            raise OSError("disk")

        first = asyncio.create_task(cache.get(("g", 1), failing))
        await asyncio.sleep(0)
        second = asyncio.create_task(cache.get(("g", 1), failing))
        await asyncio.sleep(0)
        gate.set()
        with pytest.raises(OSError):
            await first
        assert await second is None
        assert ("g", 1) not in cache._pending

    asyncio.run(scenario())


def test_a_dropped_chunk_leaves_no_cyclic_garbage(corpus_dir):
    """A chunk keeps its parser for the end state only: nothing of it waits for the cyclic collector once the cache
    lets it go (a full collection stops the loop; at 1,000 advances a second thousands of chunks were left to it)."""
    import gc

    base = corpus_dir / "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
    image = (base / "mariadb-repl-bin.000005").read_bytes()
    events = split_events(image)
    fde = FormatDescription.parse(events[0][1])
    start = events[1][0]

    def parsers() -> int:
        return sum(isinstance(o, B.TransactionBoundaryParser) for o in gc.get_objects())

    follower = B.TransactionBoundaryParser(fde=fde)  # a dump's own parser (it lives as long as the dump)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        before = parsers()
        for _ in range(50):
            chunk = K.scan_chunk(NAME, start, image[start:], follower.copy(), True)
            assert chunk.ok and chunk.parser is not None and chunk.parser.feed is K._feeds_no_more  # no bound method
            follower.adopt(chunk.parser)  # what a dump takes from it
            assert follower.state_key() == chunk.parser.state_key()
            del chunk
        assert parsers() == before, "chunks' parsers are left for the cyclic collector"
    finally:
        if enabled:
            gc.enable()


def test_the_cache_holds_a_bounded_number_of_chunks():
    async def scenario():
        cache = K.ChunkCache(budget=1 << 30, max_chunks=4)
        for i in range(20):
            await cache.get(("f", i), lambda: asyncio.sleep(0, K.Chunk("f", 4, b"x")))
            cache.put(("g", i), K.Chunk("g", 4, b"y"))
        assert len(cache._done) == 4
        assert list(cache._done) == [("f", 18), ("g", 18), ("f", 19), ("g", 19)]

    asyncio.run(scenario())
