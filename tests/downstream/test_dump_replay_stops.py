"""Replay stops (pitr's fence): a dump for the stop's server id sends nothing past the stop, whatever the replica
asks for; other replicas are not touched; the SQL statements check that the relay holds the point."""

from __future__ import annotations

import asyncio

import pytest

from relayproxy.binlog.gtid import GtidSet
from relayproxy.downstream.context import DumpRequest
from relayproxy.downstream.sql.dispatch import execute
from relayproxy.relay.replay_stops import ReplayStop, ReplayStops
from relayproxy.wire import packets as P
from relayproxy.wire.results import ErrorResponse, OkResponse, ResultSet

from .test_downstream_dump import (
    CRC32,
    SID,
    decode,
    dump_all,
    file_request,
    group_ends,
    gtid_request,
    is_eof,
    make_conn,
    make_ctx,
    mysql_file,
    relay_with,
    run,
    sid_set,
)


@pytest.fixture
def three_files(tmp_path):
    first = mysql_file(GtidSet(), [1, 2], "binlog.000002")
    second = mysql_file(sid_set(SID, 1, 2), [3, 4, 5], "binlog.000003")
    third = mysql_file(sid_set(SID, 1, 5), [6])
    store = relay_with(tmp_path, {"binlog.000001": first, "binlog.000002": second, "binlog.000003": third})
    yield store, second
    store.close()


def gnos_sent(channel) -> list[int]:
    events, _ = decode(channel.payloads)
    out = []
    for e in events:
        if e.type == 33:  # GTID_LOG_EVENT
            out.append(int.from_bytes(e.raw[19 + 17:19 + 25], "little"))
    return out


@pytest.mark.parametrize("group", [0, 1, 2])
def test_a_dump_for_the_stopped_server_id_ends_at_the_stop(three_files, group):
    store, second = three_files
    ctx = make_ctx(store)
    ends = group_ends(second)
    stop_at = [ends[0] - (ends[1] - ends[0]), ends[0], ends[1]][group]  # before GTID 3, after 3, after 4
    ctx.replay_stops.set(ReplayStop(2, "binlog.000002", stop_at))
    channel = run(dump_all(ctx, make_conn(**CRC32), file_request("", 4)))
    _, tail = decode(channel.payloads)
    assert is_eof(tail)  # NON_BLOCK: the stop is where this replica's binlog ends
    assert gnos_sent(channel) == [1, 2, 3, 4][:2 + group]
    # a replica with another server id gets everything
    other = run(dump_all(ctx, make_conn(**CRC32), DumpRequest("file", server_id=3, flags=P.BINLOG_DUMP_NON_BLOCK,
                                                              file="", position=4)))
    assert gnos_sent(other) == [1, 2, 3, 4, 5, 6]


def test_a_gtid_dump_past_the_stop_is_sent_nothing_and_a_cleared_stop_frees_it(three_files):
    store, second = three_files
    ctx = make_ctx(store)
    ctx.replay_stops.set(ReplayStop(2, "binlog.000002", group_ends(second)[0]))
    channel = run(dump_all(ctx, make_conn(**CRC32), gtid_request(sid_set(SID, 1, 3))))
    assert gnos_sent(channel) == []
    ctx.replay_stops.clear(2)
    channel = run(dump_all(ctx, make_conn(**CRC32), gtid_request(sid_set(SID, 1, 3))))
    assert gnos_sent(channel) == [4, 5, 6]


def test_a_blocking_dump_waits_at_the_stop_with_heartbeats(three_files):
    store, second = three_files
    ctx = make_ctx(store)
    ctx.replay_stops.set(ReplayStop(2, "binlog.000002", group_ends(second)[1]))

    async def scenario():
        from .test_downstream_dump import FakeChannel
        from relayproxy.downstream import dump as D
        channel = FakeChannel()
        conn = make_conn(**CRC32, master_heartbeat_period=str(50_000_000))
        task = asyncio.create_task(D.serve_dump(ctx, conn, file_request("", 4, flags=0), channel))
        await asyncio.sleep(0.5)
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return channel

    channel = run(scenario())
    events, _ = decode(channel.payloads)
    assert gnos_sent(channel) == [1, 2, 3, 4]
    assert sum(1 for e in events if e.type == 27) >= 2  # HEARTBEAT_LOG_EVENT while it waits at the stop


def sql(ctx, text: str, account: str = "ops:pw:admin"):
    from relayproxy.downstream.context import ConnectionState
    from relayproxy.downstream.users import parse_users
    conn = ConnectionState(conn_id=5, user=account.split(":")[0])
    conn.account = parse_users(account)[0]
    return asyncio.run(execute(ctx, conn, text))


def test_the_statements_set_show_and_clear_a_stop_that_the_relay_holds(three_files, tmp_path):
    store, second = three_files
    ctx = make_ctx(store)
    ctx.replay_stops = ReplayStops.load(store.relay_dir)
    at = group_ends(second)[1]
    answer = sql(ctx, f"RELAYPROXY SET REPLAY STOP FOR SERVER_ID 42 AT 'binlog.000002' {at} LABEL 'before x'")
    assert isinstance(answer, OkResponse), answer
    assert f"binlog.000002:{at}" in answer.info and f"{SID.hex()[:8]}" in answer.info.replace("-", "")
    shown = sql(ctx, "SHOW RELAYPROXY REPLAY STOPS")
    assert isinstance(shown, ResultSet) and shown.rows[0][:3] == [42, "binlog.000002", at]
    assert shown.rows[0][4] == "before x" and shown.rows[0][6] == "Yes"
    assert ReplayStops.load(store.relay_dir).get(42).position == at  # durable: a restarted relay keeps it
    for bad, words in (
        (f"RELAYPROXY SET REPLAY STOP FOR SERVER_ID 42 AT 'binlog.000002' {at - 3}", "not a transaction boundary"),
        ("RELAYPROXY SET REPLAY STOP FOR SERVER_ID 42 AT 'binlog.000009' 4", "not a relay file"),
        ("RELAYPROXY SET REPLAY STOP FOR SERVER_ID 42 AT 'binlog.000003' 99999999", "past what the relay holds"),
        ("RELAYPROXY SET REPLAY STOP FOR SERVER_ID 0 AT 'binlog.000002' 4", "server_id"),
        ("RELAYPROXY SET REPLAY STOP FOR SERVER_ID x AT 'binlog.000002' 4", "SERVER_ID"),
    ):
        answer = sql(ctx, bad)
        assert isinstance(answer, ErrorResponse) and words in answer.message, (bad, answer)
    assert ReplayStops.load(store.relay_dir).get(42).position == at  # a refused statement changed nothing
    denied = sql(ctx, "RELAYPROXY CLEAR REPLAY STOP FOR SERVER_ID 42", "repl:pw")
    assert isinstance(denied, ErrorResponse) and denied.code == 1227
    answer = sql(ctx, "RELAYPROXY CLEAR REPLAY STOP FOR SERVER_ID 42")
    assert isinstance(answer, OkResponse) and answer.affected_rows == 1
    assert sql(ctx, "RELAYPROXY CLEAR REPLAY STOP FOR SERVER_ID 42").affected_rows == 0
    assert ReplayStops.load(store.relay_dir).get(42) is None
