"""A graceful stop (``DownstreamContext.stop_dumps``, what the server's close asks first): each dump ends by itself
at a transaction boundary, never inside a group; a dump waiting at the horizon ends at once. Without sockets: the
relay files, a fake channel, the sender."""

from __future__ import annotations

import asyncio

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.downstream import dump as D

from ..support import eventgen as E
from .test_downstream_dump import (
    CRC32,
    SID,
    ChunklessChannel,
    FakeChannel,
    decode,
    file_request,
    make_conn,
    make_ctx,
    mysql_group,
    relay_with,
    run,
    split_events,
)

BIG_ROWS = 100_000  # bytes of one rows event: a group of five is larger than a shared chunk (256 KB)


def big_group(gno: int) -> list[bytes]:
    rows = E.event(C.WRITE_ROWS_EVENT, bytes(10) + b"\x01\xff" + bytes(BIG_ROWS))
    return [E.gtid(gno, SID), E.query("BEGIN"), E.table_map(), *[rows] * 5, E.xid(gno)]


def sent_types(channel) -> list[int]:
    events, _ = decode(channel.payloads)
    return [e.type for e in events]


def stopping(channel_class, ctx, after_payloads: int):
    """A channel of ``channel_class`` that asks ``ctx.stop_dumps()`` as it takes its ``after_payloads``-th payload
    (from inside the sender's send: the stop lands exactly there)."""

    class Stopping(channel_class):
        async def send(self, payload) -> None:
            await super().send(payload)
            if len(self.payloads) == after_payloads:
                ctx.stop_dumps()

    return Stopping()


async def dump_until_stopped(ctx, channel) -> bool:
    """A blocking dump; whether it ended by itself (it is cancelled after 5 s otherwise)."""
    task = asyncio.create_task(D.serve_dump(ctx, make_conn(**CRC32), file_request(flags=0), channel))
    try:
        await asyncio.wait_for(asyncio.shield(task), 5)
        return True
    except TimeoutError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False


def test_a_dump_waiting_at_the_horizon_ends_at_once(tmp_path):
    store = relay_with(tmp_path, {"binlog.000001": E.binlog_file(*mysql_group(1), *mysql_group(2))})
    try:
        ctx = make_ctx(store)
        every = 2 + 2 * 5  # the fake ROTATE, the FDE, two groups of five
        channel = stopping(FakeChannel, ctx, every)
        assert run(dump_until_stopped(ctx, channel))
        assert sent_types(channel)[-1] == C.XID_EVENT and len(channel.payloads) == every
        assert not ctx.dumps  # the dump left the context's set
    finally:
        store.close()


def test_a_dump_inside_a_large_group_finishes_the_group_and_sends_no_other(tmp_path):
    groups = [big_group(gno) for gno in (1, 2, 3)]
    image = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode(), flags=C.LOG_EVENT_IGNORABLE_F),
                          *[event for group in groups for event in group])
    store = relay_with(tmp_path, {"binlog.000001": image})
    try:
        for kind in (FakeChannel, ChunklessChannel):  # shared chunks, and event by event
            ctx = make_ctx(store)
            # The stop comes with the first group's third rows event: inside it, more of it to send.
            channel = stopping(kind, ctx, 2 + 1 + 3 + 3)
            assert run(dump_until_stopped(ctx, channel))
            types = sent_types(channel)
            assert types[-1] == C.XID_EVENT, types
            gtids = types.count(C.GTID_LOG_EVENT)
            assert 1 <= gtids < 3, types  # whole groups, and it stopped before the end of the file
            assert len(types) == 2 + 1 + gtids * len(groups[0]), types
    finally:
        store.close()


def test_a_dump_that_began_inside_a_group_stops_only_after_a_whole_one(tmp_path):
    """A file/position replica asking for a position inside a group (after a crash cut its link there): the rest of
    that group looks to the parser like events outside any, so the dump stops at the end of the next whole group,
    not right after the first of those events."""
    groups = [big_group(gno) for gno in (1, 2, 3)]
    image = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode(), flags=C.LOG_EVENT_IGNORABLE_F),
                          *[event for group in groups for event in group])
    store = relay_with(tmp_path, {"binlog.000001": image})
    try:
        offsets = [offset for offset, _event in split_events(image)]
        inside = offsets[2 + 4]  # the FDE, PREVIOUS_GTIDS, then group 1's GTID, BEGIN, TABLE_MAP, rows: its 2nd rows
        ctx = make_ctx(store)
        channel = stopping(ChunklessChannel, ctx, 2 + 1)  # the stop comes with the first event after the FDE
        task = D.serve_dump(ctx, make_conn(**CRC32), file_request("binlog.000001", inside, flags=0), channel)
        assert run(asyncio.wait_for(task, 5)) is None
        types = sent_types(channel)
        rest_of_first = [C.WRITE_ROWS_EVENT] * 4 + [C.XID_EVENT]  # its rows events from the 2nd on, and its XID
        assert types[2:] == rest_of_first + [event[4] for event in groups[1]], types
    finally:
        store.close()
