"""Sender processes (downstream/workers.py): dumps handed to worker processes give the same bytes.

In-process server, real worker processes: every kind of dump (file/position, MySQL GTID, MariaDB GTID, NON_BLOCK,
heartbeats at the horizon) is taken once from a server that serves it itself and once from one that hands it to
a sender process, by a real protocol client that checks packet sequence ids; the payloads must be identical.
Nothing past the durable horizon is sent by a worker. Semi-sync and TLS dumps stay in the relay process. With real
servers: a MariaDB master, a relay with two sender processes, MariaDB replicas and mariadb-binlog clients; one
sender process is killed with kill -9 under load, is replaced, and its replicas reconnect and end equal to the
master with nothing lost or applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.downstream.server import DownstreamServer
from relayproxy.downstream.workers import SenderPool
from relayproxy.relay.hoptimes import HopTimes
from relayproxy.upstream.connection import UpstreamConnection
from relayproxy.wire.accounts import DownstreamUser
from relayproxy.wire.packets import BINLOG_DUMP_NON_BLOCK, BINLOG_SEND_ANNOTATE_ROWS_EVENT

from .test_downstream_dump import (
    MYSQL80,
    as_sent,
    live_store,
    make_ctx,
    relay_with,
    split_events,
)
from .test_downstream_topologies import (  # noqa: F401 - fixtures
    FIRST_FILE,
    Writer,
    assert_download_equals_master,
    assert_same_data,
    change_master,
    mixed_load,
    prepare_master,
    relays,
    stop_never_args,
    tools,
    wait_files,
    wait_relay,
    wait_replica,
)

USERS = [DownstreamUser("repl", "replpw", plugin="mysql_native_password")]
MARIA_FILES = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5, 6, 7)]
MARIA_DIR = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"


async def _collect(port: int, setup: list[str], start, *, until_eof: bool = True, packets: int | None = None,
                   timeout: float = 20.0) -> list[bytes]:
    """Dump from the server on `port` and return every payload (events, then the EOF/ERR), or the first
    `packets` ones. The client's decoder checks every packet's sequence id."""
    conn = await UpstreamConnection.connect("127.0.0.1", port, "repl", "replpw", ssl_mode="disabled",
                                            connect_timeout=10)
    try:
        for statement in setup:
            await conn.query(statement)
        await start(conn)
        out: list[bytes] = []
        async with asyncio.timeout(timeout):
            while True:
                batch = await conn.read_packets()
                for payload in batch:
                    out.append(bytes(payload))
                    if packets is not None and len(out) >= packets:
                        return out
                    if until_eof and payload[0] in (0xFE, 0xFF):
                        return out
                if not batch:
                    return out
    finally:
        conn.abort()


@contextlib.asynccontextmanager
async def _serving(ctx, senders: int):
    """An in-process server on a free port; with `senders` > 0 it hands dumps to that many sender processes."""
    server = DownstreamServer(ctx, USERS)
    _host, port = await server.start("127.0.0.1", 0)
    pool = None
    if senders:
        pool = SenderPool(senders, ctx, log_format="json", log_level="warning")
        await pool.start()
        server.senders = pool
    try:
        yield port, pool
    finally:
        await server.close()
        if pool is not None:
            await pool.close()


async def _serve_both(ctx, runs) -> tuple[list, list, int]:
    """Run every (setup, start, kwargs) of `runs` against a server without and then with sender processes."""
    results = []
    handed = 0
    for senders in (0, 2):
        async with _serving(ctx, senders) as (port, pool):
            results.append([await _collect(port, setup, start, **kw) for setup, start, kw in runs])
            if pool is not None:
                handed = pool.handed_total
    return results[0], results[1], handed


def _file_dump(name: str, pos: int, flags: int = BINLOG_DUMP_NON_BLOCK):
    async def start(conn):
        await conn.binlog_dump(name, pos, 77, flags=flags)
    return start


def _gtid_dump(gtids: GtidSet, flags: int = BINLOG_DUMP_NON_BLOCK):
    async def start(conn):
        await conn.binlog_dump_gtid(77, gtids.encode(), flags=flags)
    return start


def test_mysql_dumps_through_a_sender_process_are_byte_identical(tmp_path, corpus_dir):
    image = as_sent((corpus_dir / MYSQL80).read_bytes())
    store, feeder = live_store(tmp_path, "binlog.000004")
    events = split_events(image)
    feeder.feed_events(events)
    store.sync()
    ctx = make_ctx(store, master_uuid=None, semi_sync=False, version="8.0.29")
    have = GtidSet.parse("83759871-1141-11ed-b12d-0242ac130003:1-10")  # the file holds 6-26: 6-10 are skipped
    crc = ["SET @master_binlog_checksum='CRC32'"]
    runs = [
        (crc, _file_dump("binlog.000004", 4), {}),
        (crc, _file_dump("binlog.000004", events[len(events) // 2][0]), {}),
        (crc, _gtid_dump(have), {}),
        (crc + ["SET @master_heartbeat_period=50000000"], _file_dump("binlog.000004", 4, flags=0),
         {"until_eof": False, "packets": len(events) + 4}),
    ]
    try:
        direct, handed, count = asyncio.run(_serve_both(ctx, runs))
    finally:
        store.close()
    assert count == len(runs), f"{count} of {len(runs)} dumps were handed to a sender process"
    for i, (a, b) in enumerate(zip(direct, handed)):
        assert a == b, f"run {i}: the sender process sent something else"
    # the streams end as they should: EOF for NON_BLOCK, heartbeats at the horizon for the last one
    assert direct[0][-1][0] == 0xFE and direct[2][-1][0] == 0xFE, direct[2][-1]
    assert direct[3][-1][1 + 4] == C.HEARTBEAT_LOG_EVENT


def test_mariadb_dumps_through_a_sender_process_are_byte_identical(tmp_path, corpus_dir):
    files = {name: (corpus_dir / MARIA_DIR / name).read_bytes() for name in MARIA_FILES}
    store = relay_with(tmp_path, files)
    ctx = make_ctx(store, semi_sync=False, version="10.11.6-MariaDB-log")
    base = ["SET @master_binlog_checksum='CRC32'", "SET @mariadb_slave_capability=4"]
    annotate = BINLOG_DUMP_NON_BLOCK | BINLOG_SEND_ANNOTATE_ROWS_EVENT
    runs = [
        (base, _file_dump(MARIA_FILES[0], 4, annotate), {}),
        (base, _file_dump(MARIA_FILES[0], 4), {}),
        (base + ["SET @slave_connect_state='0-10-262583'"], _file_dump("", 4, annotate), {}),
        (["SET @master_binlog_checksum='CRC32'", "SET @mariadb_slave_capability=0"],
         _file_dump(MARIA_FILES[1], 4), {}),
    ]
    try:
        direct, handed, count = asyncio.run(_serve_both(ctx, runs))
    finally:
        store.close()
    assert count == len(runs)
    for i, (a, b) in enumerate(zip(direct, handed)):
        assert a == b, f"run {i}: the sender process sent something else"
    assert all(run[-1][0] == 0xFE for run in direct)


def test_a_sender_process_sends_nothing_past_the_horizon_and_follows_it(tmp_path, corpus_dir):
    image = as_sent((corpus_dir / MYSQL80).read_bytes())
    events = split_events(image)
    store, feeder = live_store(tmp_path, "binlog.000004")
    half = len(events) // 2
    feeder.feed_events(events[:half])
    store.sync()
    durable = store.horizon.snapshot().position
    feeder.feed_events(events[half:])  # written, not yet synced: past the horizon
    ctx = make_ctx(store, semi_sync=False, version="8.0.29")
    ctx.hop = HopTimes()  # the relay's own hop stages: the worker's send stage reaches them

    async def scenario():
        async with _serving(ctx, 1) as (port, pool):
            setup = ["SET @master_binlog_checksum='CRC32'"]
            first = await _collect(port, setup, _file_dump("binlog.000004", 4))
            follow = asyncio.create_task(_collect(port, setup, _file_dump("binlog.000004", 4, flags=0),
                                                  until_eof=False, packets=len(events) + 1))
            await asyncio.sleep(0.5)
            advanced = time.monotonic()
            store.sync()  # now the rest is durable: the waiting worker dump must get it
            rest = await follow
            waited = time.monotonic() - advanced
            deadline = time.monotonic() + 10
            while not ctx.hop.stages["send"].count and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the worker reports every half second
            return first, rest, pool.handed_total, waited

    try:
        first, rest, handed, waited = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        store.close()
    assert handed == 2
    # The woken dump's send stage, timed in the worker from the relay process's advance (one monotonic clock).
    send = ctx.hop.stages["send"]
    assert send.count == 1 and 0.0 < send.max_seconds <= waited
    ends = [int.from_bytes(p[1 + 13 : 1 + 17], "little") for p in first[:-1]]
    assert first[-1][0] == 0xFE and max(ends) == durable, "a worker sent bytes past the durable horizon"
    assert int.from_bytes(rest[-1][1 + 13 : 1 + 17], "little") == len(image)


def test_semi_sync_and_tls_dumps_stay_in_the_relay_process(tmp_path, corpus_dir):
    image = as_sent((corpus_dir / MYSQL80).read_bytes())
    store, feeder = live_store(tmp_path, "binlog.000004")
    feeder.feed_events(split_events(image))
    store.sync()
    ctx = make_ctx(store, semi_sync=True, version="8.0.29")

    async def scenario():
        async with _serving(ctx, 1) as (port, pool):
            setup = ["SET @master_binlog_checksum='CRC32'", "SET @rpl_semi_sync_slave=1"]
            # (this client does not ACK: read only up to the first ACK request, after which numbering restarts)
            payloads = await _collect(port, setup, _file_dump("binlog.000004", 4), until_eof=False, packets=2)
            return payloads, pool.handed_total

    try:
        payloads, handed = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        store.close()
    assert handed == 0
    assert [p[:3] for p in payloads] == [b"\x00\xef\x00"] * 2  # semi-sync headers: the relay process serves it


# -- real servers --------------------------------------------------------------------------------------------------


def _workers(relay) -> list[dict]:
    return relay.status()["sender_processes"]["workers"]


@pytest.mark.server
def test_two_sender_processes_serve_replicas_and_one_killed_is_replaced(mariadb, relays, tools, tmp_path):
    master = mariadb("master")
    prepare_master(master)
    relay = relays("relay", master.port, extra=["--sender-processes", "2"])
    mixed_load(master, big=False)
    wait_relay(relay, master)
    replicas = [mariadb(f"replica{i}", server_id=10 + i) for i in range(4)]
    for i, replica in enumerate(replicas):
        change_master(replica, relay.listen_port, file=None if i % 2 else FIRST_FILE)
        replica.execute("START SLAVE")
    downloads, procs = [], []
    for i in range(4):
        out = tmp_path / f"download{i}"
        out.mkdir()
        downloads.append(out)
        procs.append(tools(stop_never_args(relay.listen_port, out, server_id=900 + i), tmp_path / f"tool{i}.log"))
    relay.wait_for(lambda s: sum(w["dumps"] for w in s["sender_processes"]["workers"]) == 8, 30,
                   "8 dumps in the sender processes")
    workers = _workers(relay)
    assert len(workers) == 2 and all(w["alive"] and w["dumps"] > 0 for w in workers), workers
    for out in downloads:
        wait_files(out, master, relay=relay, procs=procs)
    with Writer(master, rotate_every=150) as writer:
        time.sleep(1.0)
        victim = workers[0]
        os.kill(victim["pid"], signal.SIGKILL)
        relay.wait_for(lambda s: s["sender_processes"]["respawns"] == 1
                       and all(w["alive"] for w in s["sender_processes"]["workers"]), 30, "a new sender process")
        mixed_load(master, rounds=2, big=True)
        time.sleep(1.0)
    assert writer.done > 100
    wait_relay(relay, master)
    for replica in replicas:
        status = wait_replica(replica, master, timeout=90)
        assert not status["Last_IO_Error"] and not status["Last_SQL_Error"], status
        assert_same_data(master, replica)  # a transaction applied twice would have stopped the SQL thread
    new = _workers(relay)
    assert {w["pid"] for w in new} != {w["pid"] for w in workers} and victim["pid"] not in {w["pid"] for w in new}
    # mariadb-binlog does not reconnect: those served by the killed process ended, the others have every file
    alive = [(out, proc) for out, proc in zip(downloads, procs) if proc.poll() is None]
    assert 0 < len(alive) < len(procs), [p.poll() for p in procs]
    for out, _proc in alive:
        wait_files(out, master, relay=relay, procs=[p for _o, p in alive])
        assert_download_equals_master(out, master)
    log = relay.log_tail(400)
    assert "a sender process ended" in log
