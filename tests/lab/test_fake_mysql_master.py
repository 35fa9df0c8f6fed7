"""The whole relay (``relayproxy.commands.run.serve`` in-process, and once ``relayproxy run`` as a process) against a
scripted fake MySQL 8.0 master (tests/support/fakemaster.py) that serves real MySQL corpus binlogs.

What is checked is what a MySQL master would see and what the relay ends up holding: the queries and
commands it receives (§3.5), the GTID set in COM_BINLOG_DUMP_GTID after a cut (exactly the complete
transactions), the relay files byte for byte against the served files, and /status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import threading
from pathlib import Path

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.binlog.reader import scan_bytes
from relayproxy.commands import config
from relayproxy.commands.run import serve

from ..support.fakemaster import (
    FakeMySQLMaster,
    clear_in_use,
    next_binlog,
    split_events,
    wire_bytes,
)
from relayproxy.lab.harness import RelayProcess
from relayproxy.relay.master_variables import select_statement, variables_for

MYSQL80 = "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004"  # 8.0.29, PREVIOUS_GTIDS 1-5, 21 GTIDs
MYSQL96_TAGGED = "blackbeam-rust_mysql_common/test-data/binlogs/binlog_transaction_with_GTID_TAG.000001"
NAME = "binlog.000004"
SERVER_ID = 100


# -- helpers -----------------------------------------------------------------------------------------------------


def relay_config(master: FakeMySQLMaster, relay_dir: Path, **options: str):
    environ = {
        "RELAYPROXY_MASTER": f"127.0.0.1:{master.port}",
        "RELAYPROXY_USER": "repl",
        "RELAYPROXY_PASSWORD": "replpw",
        "RELAYPROXY_SERVER_ID": str(SERVER_ID),
        "RELAYPROXY_RELAY_DIR": str(relay_dir),
        "RELAYPROXY_HTTP": "127.0.0.1:0",
        "RELAYPROXY_GTID_MODE": "mysql",
        "RELAYPROXY_HEARTBEAT_PERIOD": "0.2",
        "RELAYPROXY_RECONNECT_MIN_DELAY": "0.01",
        "RELAYPROXY_RECONNECT_MAX_DELAY": "0.05",
    }
    environ.update({f"RELAYPROXY_{k.upper()}": v for k, v in options.items()})
    return config.load(None, environ)


@contextlib.asynccontextmanager
async def running_relay(master: FakeMySQLMaster, relay_dir: Path, **options: str):
    """`serve()` on this loop; yields what it reports as ready (http address, store, session)."""
    cfg = relay_config(master, relay_dir, **options)
    ready = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(serve(cfg, ready=ready))
    done, _ = await asyncio.wait([ready, task], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises the startup error
    info = dict(ready.result())
    info["cfg"] = cfg
    try:
        yield info
    finally:
        info["session"].stop()
        await asyncio.wait_for(task, 10)


async def http_status(address: tuple[str, int]) -> dict:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(b"GET /status HTTP/1.1\r\nHost: relay\r\n\r\n")
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(body)


async def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def at_end(info: dict, file: str, position: int):
    return lambda: info["session"].store.horizon.snapshot().coordinates == (file, position)


def group_ends(image: bytes) -> list[int]:
    ends: list[int] = []
    scan_bytes(image, on_group=lambda g: ends.append(g.end) if g.complete else None)
    return ends


def bootstrap_wire_offset(image: bytes, file_offset: int, name: str = NAME) -> int:
    """Dump-stream bytes before the event at ``file_offset`` when the master streams ``name`` from 4."""
    fake_rotate_len = C.HEADER_LEN + 8 + len(name) + 4
    events = [ev for off, ev in split_events(image) if off < file_offset]
    return wire_bytes([b"\0" * fake_rotate_len, *events])


# -- the tests ---------------------------------------------------------------------------------------------------


@pytest.fixture
def mysql80(corpus_dir) -> bytes:
    return (corpus_dir / MYSQL80).read_bytes()


def test_bootstrap_follow_and_status(tmp_path, mysql80):
    image = mysql80
    ends = group_ends(image)
    scan = scan_bytes(image)

    async def scenario():
        # The master has the first 11 transactions; the rest is written while the relay is connected.
        async with FakeMySQLMaster([(NAME, image[: ends[10]])]) as master:
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, NAME, ends[10]), what="first half")
                master.append(image[ends[10] :])
                await wait_for(at_end(info, NAME, len(image)), what="the appended half")
                await wait_for(lambda: info["session"].receiver.counters.heartbeats >= 2, what="heartbeats")
                status = await http_status(info["http"])
                store = info["session"].store
                relay_file = store.path(NAME).read_bytes()
            return master, status, relay_file

    master, status, relay_file = asyncio.run(scenario())
    assert relay_file == clear_in_use(image)
    assert status["master_log_file"] == NAME and status["read_master_log_pos"] == len(image)
    assert status["retrieved_gtid_set"] == scan.gtids_after.format(",") == "83759871-1141-11ed-b12d-0242ac130003:1-26"
    assert status["master_uuid"] == "83759871-1141-11ed-b12d-0242ac130003"
    assert status["master_server_id"] == 1 and status["master_server_version"] == "8.0.29"
    assert status["master_flavour"] == "mysql" and status["gtid_mode"] == "mysql"
    assert status["io_running"] and status["last_io_error"] is None
    assert status["master_position"] == {"file": NAME, "position": len(image)} and status["lag_bytes"] == 0
    assert status["transactions_received"] == scan.groups_complete and status["duplicate_events_skipped"] == 0
    assert status["connects"] == 1

    (conn,) = master.connections
    assert conn.error is None and conn.user == "repl" and conn.auth_plugin == "mysql_native_password"
    assert conn.connect_attrs["_client_role"] == "binary_log_listener"
    replica_uuid = (tmp_path / "relay" / "relayproxy.uuid").read_text().strip()
    # What a MySQL 8 replica IO thread sends, in order (protocol-reference §3.5).
    assert conn.queries == [
        "SELECT UNIX_TIMESTAMP()",
        "SELECT @@GLOBAL.SERVER_ID",
        "SET @master_heartbeat_period = 200000000, @source_heartbeat_period = 200000000",
        "SET @master_binlog_checksum = @@global.binlog_checksum, @source_binlog_checksum = @@global.binlog_checksum",
        "SELECT @master_binlog_checksum",
        "SELECT @@GLOBAL.SERVER_UUID",
        f"SET @slave_uuid = '{replica_uuid}', @replica_uuid = '{replica_uuid}'",
        "SELECT @@global.rpl_semi_sync_source_enabled",  # ERR 1193 (8.0.26+ name first) ...
        "SELECT @@global.rpl_semi_sync_master_enabled",  # ... and again: not a semi-sync master
        select_statement(variables_for("mysql")),  # the master's variables, once the master is accepted
        "SHOW BINARY LOGS",  # an empty relay starts at the master's oldest file
    ]
    assert conn.commands[-4:] == ["COM_QUERY", "COM_QUERY", "COM_QUERY", "COM_BINLOG_DUMP"]
    assert conn.commands.index("COM_REGISTER_SLAVE") == 7
    assert conn.register["server_id"] == SERVER_ID
    assert conn.user_vars["master_binlog_checksum"] == conn.user_vars["source_binlog_checksum"] == "CRC32"
    dump = conn.dump
    assert (dump.command, dump.file, dump.pos, dump.server_id) == ("COM_BINLOG_DUMP", NAME, 4, SERVER_ID)
    assert [s.event[4] for s in conn.sent].count(C.HEARTBEAT_LOG_EVENT) >= 2


def _expected_after_cut(image: bytes, conn) -> tuple[int, GtidSet | None]:
    """The relay's boundary after the first connection (its last event outside a group or group end that was
    delivered whole) and the GTID set there (None before PREVIOUS_GTIDS arrived)."""
    delivered = max((s.offset + len(s.event) for s in conn.sent if s.offset is not None), default=0)
    outside = [off + len(ev) for off, ev in split_events(image) if ev[4] in (C.FORMAT_DESCRIPTION_EVENT,
                                                                            C.PREVIOUS_GTIDS_LOG_EVENT)]
    boundary = max([b for b in [*outside, *group_ends(image)] if b <= delivered], default=4)
    prev_end = outside[1]
    return boundary, (scan_bytes(image[:boundary]).gtids_after if boundary >= prev_end else None)


# Where the first connection breaks, as (event index in the file, bytes into that event's packet). The 8.0 file:
# 0 FDE, 1 PREVIOUS_GTIDS, 2-31 DDL transactions (GTID, QUERY), 32-58 DDL and DML transactions (GTID, QUERY
# BEGIN, TABLE_MAP, WRITE/UPDATE_ROWS, XID).
CUTS = {
    "in-fake-rotate": None,
    "in-fde": (0, 30),
    "in-previous-gtids": (1, 10),
    "after-previous-gtids": (2, 0),
    "in-first-gtid-event": (2, 40),
    "between-gtid-and-ddl": (3, 0),
    "in-a-ddl": (9, 100),
    "between-begin-and-table-map": (34, 0),
    "in-rows-event": (35, 100),
    "in-xid": (36, 10),
    "at-a-transaction-end": (37, 0),
    "in-the-last-transaction": (-2, 50),
}


@pytest.mark.parametrize("where", list(CUTS))
def test_cut_and_reconnect_with_the_complete_transaction_set(tmp_path, mysql80, where):
    image = mysql80
    events = split_events(image)
    cut_at = CUTS[where]
    if cut_at is None:
        cut = 12
    else:
        index, into = cut_at
        cut = bootstrap_wire_offset(image, events[index][0]) + into
    scan = scan_bytes(image)

    async def scenario():
        async with FakeMySQLMaster([(NAME, image)]) as master:
            master.cuts = [cut]
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, NAME, len(image)), what="the whole file after the reconnect")
                status = await http_status(info["http"])
                relay_file = info["session"].store.path(NAME).read_bytes()
                counters = info["session"].receiver.counters
            return master, status, relay_file, counters

    master, status, relay_file, counters = asyncio.run(scenario())
    first, second = master.connections[:2]
    assert first.cut_at == cut
    boundary, have = _expected_after_cut(image, first)
    dump = second.dump
    if first.sent == []:
        assert (dump.command, dump.file, dump.pos) == ("COM_BINLOG_DUMP", NAME, 4)  # still an empty relay
    elif have is None:
        assert (dump.command, dump.file, dump.pos) == ("COM_BINLOG_DUMP", NAME, boundary)
    else:
        # Exactly the complete transactions: the cut one is not claimed, so the master re-sends it whole.
        assert dump.command == "COM_BINLOG_DUMP_GTID"
        assert dump.gtids == have, (dump.gtids, have)
        assert dump.gtid_data == have.encode()
        assert (dump.file, dump.pos, dump.server_id) == ("", 4, SERVER_ID)
        resent = [s.offset for s in second.sent if s.offset is not None and s.offset >= 4 + 122 + 71]
        assert resent and resent[0] == boundary  # the first event after the skipped groups starts the cut one
    assert relay_file == clear_in_use(image)  # nothing lost, nothing doubled
    assert counters.transactions == scan.groups_complete
    assert status["retrieved_gtid_set"] == scan.gtids_after.format(",")
    assert status["read_master_log_pos"] == len(image)
    assert status["connects"] == 2 and status["connect_failures"] >= 1
    assert len(master.connections) == 2


def _tagged_files(corpus_dir) -> list[tuple[str, bytes]]:
    image = (corpus_dir / MYSQL96_TAGGED).read_bytes()
    return [("binlog.000004", image), ("binlog.000005", next_binlog(image, scan_bytes(image).gtids_after))]


def test_tagged_gtids_cut_and_rotation(tmp_path, corpus_dir):
    files = _tagged_files(corpus_dir)
    image = files[0][1]
    events = split_events(image)
    write_rows = next(i for i, (_, ev) in enumerate(events) if ev[4] == C.WRITE_ROWS_EVENT)
    cut = bootstrap_wire_offset(image, events[write_rows][0]) + 20

    async def scenario():
        async with FakeMySQLMaster(files) as master:
            master.cuts = [cut]
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, "binlog.000005", len(files[1][1])), what="both files")
                status = await http_status(info["http"])
                store = info["session"].store
                relay = {name: store.path(name).read_bytes() for name in store.files()}
            return master, status, relay

    master, status, relay = asyncio.run(scenario())
    dump = master.connections[1].dump
    assert dump.command == "COM_BINLOG_DUMP_GTID"
    assert dump.gtids == GtidSet("55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2")
    fmt = struct.unpack_from("<Q", dump.gtid_data, 0)[0]
    assert fmt & 0xFF == 1 and fmt >> 56 == 1  # the 8.3+ tagged encoding: the set has a tag
    assert relay == {"binlog.000004": image, "binlog.000005": clear_in_use(files[1][1])}
    assert status["retrieved_gtid_set"] == "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-3"
    assert status["master_log_file"] == "binlog.000005"


def test_cut_before_the_rotate_event_keeps_the_closed_file_identical(tmp_path, corpus_dir):
    files = _tagged_files(corpus_dir)
    image = files[0][1]
    rotate_off = next(off for off, ev in split_events(image) if ev[4] == C.ROTATE_EVENT)
    cut = bootstrap_wire_offset(image, rotate_off) + 5  # the XID arrived, the ROTATE did not

    async def scenario():
        async with FakeMySQLMaster(files) as master:
            master.cuts = [cut]
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, "binlog.000005", len(files[1][1])), what="both files")
                store = info["session"].store
                relay = {name: store.path(name).read_bytes() for name in store.files()}
            return master, relay

    master, relay = asyncio.run(scenario())
    assert master.connections[1].dump.command == "COM_BINLOG_DUMP_GTID"
    assert relay["binlog.000005"] == clear_in_use(files[1][1])
    assert relay["binlog.000004"] == image, f"relay holds {len(relay['binlog.000004'])} of {len(image)} bytes"


def test_semi_sync_master_gets_acks_for_durable_transactions(tmp_path, mysql80):
    image = mysql80
    ends = group_ends(image)

    async def scenario():
        async with FakeMySQLMaster([(NAME, image)], semi_sync=True) as master:
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, NAME, len(image)), what="the file")
                await wait_for(lambda: master.connections[0].acks and master.connections[0].acks[-1][1] == len(image),
                               what="the last ACK")
                status = await http_status(info["http"])
            return master, status

    master, status = asyncio.run(scenario())
    conn = master.connections[0]
    assert "SET @rpl_semi_sync_slave = 1, @rpl_semi_sync_replica = 1" in conn.queries
    assert status["semi_sync"] is True and status["semi_sync_acks"] == len(conn.acks) >= 1
    positions = [pos for name, pos in conn.acks]
    assert all(name == NAME for name, _ in conn.acks)
    assert set(positions) <= set(ends) and positions == sorted(positions)  # only transaction ends, in order


def test_semi_sync_ack_waits_for_the_relays_fsync(tmp_path, mysql80, monkeypatch):
    """Fault injection: the relay's fsync (run in the fsync thread: relay/fsyncer.py, ``sync_on_loop = false``; a
    sync on the loop cannot be held without holding the loop) is held on an Event. While it is held the master
    receives no ACK for the new transaction; once it completes, the ACK arrives for exactly that transaction, and it
    was not there when the fsync returned."""
    from relayproxy.relay.sync import SyncTicket

    image = mysql80
    ends = group_ends(image)
    original = SyncTicket.make_durable
    armed = threading.Event()
    entered = threading.Event()
    release = threading.Event()
    held: dict = {}

    def stalled_make_durable(ticket):
        if armed.is_set() and not entered.is_set():
            held["ticket"] = (ticket.file, ticket.position, ticket.needs_fsync)
            entered.set()
            release.wait(30)
            original(ticket)
            held["acks_when_durable"] = list(held["conn"].acks)
            return
        original(ticket)

    monkeypatch.setattr(SyncTicket, "make_durable", stalled_make_durable)

    # The session's fsync thread (relay/fsyncer.py), held the same way: its Python worker in place of the C one.
    from relayproxy.relay import fsyncer

    class HoldingWorker(fsyncer.PyWorker):
        def run_job(worker, fd, mark_fd, mark):
            if armed.is_set() and not entered.is_set():
                entered.set()
                release.wait(30)
                result = fsyncer.PyWorker.run_job(worker, fd, mark_fd, mark)
                held["acks_when_durable"] = list(held["conn"].acks)
                return result
            return fsyncer.PyWorker.run_job(worker, fd, mark_fd, mark)

    native_done = SyncTicket.native_done

    def noted(ticket, *result):
        if entered.is_set() and "ticket" not in held:  # the first to end once one is held is the held one
            held["ticket"] = (ticket.file, ticket.position, ticket.needs_fsync)
        native_done(ticket, *result)

    monkeypatch.setattr(fsyncer, "new_worker", HoldingWorker)
    monkeypatch.setattr(SyncTicket, "native_done", noted)

    async def scenario():
        async with FakeMySQLMaster([(NAME, image[: ends[10]])], semi_sync=True) as master:
            async with running_relay(master, tmp_path / "relay", sync_on_loop="false") as info:
                try:
                    await wait_for(lambda: master.connections and master.connections[0].acks
                                   and master.connections[0].acks[-1] == (NAME, ends[10]), what="the ACK of group 11")
                    conn = held["conn"] = master.connections[0]
                    before = list(conn.acks)
                    armed.set()
                    master.append(image[ends[10] : ends[11]])  # one more transaction, flagged for an ACK
                    await wait_for(entered.is_set, what="the relay's fsync of the new transaction")
                    await asyncio.sleep(1.0)  # five heartbeat periods: time enough for any early ACK to arrive
                    during = list(conn.acks)
                    horizon_during = info["session"].store.horizon.snapshot().coordinates
                    release.set()
                    await wait_for(lambda: len(conn.acks) > len(before), what="the ACK after the fsync")
                    await asyncio.sleep(0.3)
                    return before, during, horizon_during, list(conn.acks)
                finally:
                    release.set()

    before, during, horizon_during, after = asyncio.run(scenario())
    assert held["ticket"] == (NAME, ends[11], True), held["ticket"]  # the held fsync covers the new transaction
    assert during == before, f"the master got an ACK while the relay's fsync was held: {during[len(before):]}"
    assert horizon_during == (NAME, ends[10])
    assert held["acks_when_durable"] == before, "an ACK reached the master before the fsync completed"
    assert after == before + [(NAME, ends[11])], after[len(before):]


def test_semi_sync_ack_follows_the_fsync_on_the_loop(tmp_path, mysql80, monkeypatch):
    """``sync_on_loop`` (what ``auto`` picks on a fast disk): the fdatasync runs on the event loop, and the master
    gets the ACK of a transaction only after the sync that covers it has returned."""
    from relayproxy.relay.sync import SyncTicket

    image = mysql80
    ends = group_ends(image)
    original = SyncTicket.make_durable
    box: dict = {}
    durable: list = []  # (file, position, the master's ACKs when that sync returned)

    def noting(ticket):
        original(ticket)
        if "conn" in box:
            durable.append((ticket.file, ticket.position, list(box["conn"].acks)))

    monkeypatch.setattr(SyncTicket, "make_durable", noting)

    async def scenario():
        async with FakeMySQLMaster([(NAME, image[: ends[10]])], semi_sync=True) as master:
            async with running_relay(master, tmp_path / "relay", sync_on_loop="true") as info:
                await wait_for(lambda: master.connections and master.connections[0].acks
                               and master.connections[0].acks[-1] == (NAME, ends[10]), what="the ACK of group 11")
                conn = box["conn"] = master.connections[0]
                master.append(image[ends[10] : ends[11]])  # one more transaction, flagged for an ACK
                await wait_for(lambda: conn.acks[-1] == (NAME, ends[11]), what="the ACK of group 12")
                return list(conn.acks), info["session"].sync_driver.syncs_on_loop

    acks, on_loop = asyncio.run(scenario())
    covering = [d for d in durable if d[0] == NAME and d[1] >= ends[11]]
    assert covering, durable
    assert (NAME, ends[11]) not in covering[0][2], "the ACK reached the master before its fsync returned"
    assert acks[-1] == (NAME, ends[11]) and on_loop >= 1


def test_caching_sha2_fast_path_and_a_wrong_password(tmp_path, mysql80):
    async def scenario():
        async with FakeMySQLMaster([(NAME, mysql80)], auth_plugin="caching_sha2_password") as master:
            async with running_relay(master, tmp_path / "bad", password="wrong") as info:
                await wait_for(lambda: len(master.connections) >= 2, what="retries")
                bad = await http_status(info["http"])
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, NAME, len(mysql80)), what="the file")
            return master, bad

    master, bad = asyncio.run(scenario())
    assert bad["last_io_error"].startswith("error 1045 from master: Access denied for user 'repl'")
    assert not bad["io_running"] and bad["read_master_log_pos"] == 0
    assert master.connections[-1].auth_plugin == "caching_sha2_password"
    assert master.connections[-1].dump is not None


def test_master_that_purged_what_the_relay_needs_fails_loud_and_keeps_the_data(tmp_path, mysql80):
    image = mysql80
    after = scan_bytes(image).gtids_after
    # A master whose only binlog starts after GTIDs the relay never received (…:27-30 were purged).
    purged = after.union(GtidSet("83759871-1141-11ed-b12d-0242ac130003:27-30"))
    later = next_binlog(image, purged)

    async def scenario():
        async with FakeMySQLMaster([(NAME, image)]) as master:
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, NAME, len(image)), what="the file")
        async with FakeMySQLMaster([("binlog.000006", later)]) as master:
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(lambda: len(master.connections) >= 2, what="retries")
                # Each retry clears last_io_error once its dump starts streaming, until the master's 1236 sets it
                # again: read the status while the error is in force.
                status = await http_status(info["http"])
                for _ in range(500):
                    if status["last_io_error"]:
                        break
                    await asyncio.sleep(0.01)
                    status = await http_status(info["http"])
                relay_file = info["session"].store.path(NAME).read_bytes()
            return master, status, relay_file

    master, status, relay_file = asyncio.run(scenario())
    assert master.connections[0].dump.gtids == after
    assert status["last_io_error"].startswith(
        "error 1236 from master: Cannot replicate because the source purged required binary logs")
    assert "83759871-1141-11ed-b12d-0242ac130003:27-30" in status["last_io_error"]
    assert not status["io_running"]
    assert status["retrieved_gtid_set"] == after.format(",") and status["read_master_log_pos"] == len(image)
    assert relay_file == clear_in_use(image)


class _MasterThread:
    """A FakeMySQLMaster on its own event loop in a thread, for a relay running as a separate process."""

    def __init__(self, files):
        self.loop = asyncio.new_event_loop()
        self.master = FakeMySQLMaster(files)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeMySQLMaster:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.master.start(), self.loop).result(10)
        return self.master

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.master.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_relayproxy_run_process_with_gtid_mode_mysql(tmp_path, mysql80):
    image = mysql80
    events = split_events(image)
    cut = bootstrap_wire_offset(image, events[9][0]) + 60  # inside the 4th transaction
    scan = scan_bytes(image)
    with _MasterThread([(NAME, image)]) as master:
        master.cuts = [cut]
        relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mysql",
                             extra=["--reconnect-min-delay", "0.01", "--ssl-mode", "disabled"])
        relay.start()
        try:
            status = relay.wait_for(
                lambda s: s["read_master_log_pos"] == len(image) and s["connects"] == 2, 30, "the whole file")
        finally:
            relay.stop()
        relay_file = (tmp_path / "relay" / NAME).read_bytes()
    boundary, have = _expected_after_cut(image, master.connections[0])
    assert master.connections[1].dump.command == "COM_BINLOG_DUMP_GTID"
    assert master.connections[1].dump.gtids == have == scan_bytes(image[:boundary]).gtids_after
    assert relay_file == clear_in_use(image)
    assert status["retrieved_gtid_set"] == scan.gtids_after.format(",")
    assert status["gtid_mode"] == "mysql" and status["master_uuid"] == "83759871-1141-11ed-b12d-0242ac130003"


SEMI_SYNC_ROTATION_BUG = (
    "BUG: UpstreamSession._sync_and_ack only ACKs when horizon.file == ack_pending's file; when a file's last "
    "transaction (flagged for ACK) arrives in the same batch as the ROTATE and the next file's preamble, the "
    "horizon is already in the next file, so that transaction is never acknowledged (the master waits for "
    "rpl_semi_sync_source_timeout and falls back to asynchronous replication)"
)


def test_semi_sync_ack_for_the_last_transaction_before_a_rotation(tmp_path, corpus_dir):
    files = _tagged_files(corpus_dir)
    image = files[0][1]
    xid_end = next(off + len(ev) for off, ev in split_events(image) if ev[4] == C.XID_EVENT)

    async def scenario():
        async with FakeMySQLMaster(files, semi_sync=True) as master:
            async with running_relay(master, tmp_path / "relay") as info:
                await wait_for(at_end(info, "binlog.000005", len(files[1][1])), what="both files")
                await asyncio.sleep(0.3)  # a few heartbeats: time enough for any ACK
                status = await http_status(info["http"])
            return master, status

    master, status = asyncio.run(scenario())
    conn = master.connections[0]
    assert [s.need_ack for s in conn.sent if s.offset == xid_end - 31] == [True]  # the XID asked for an ACK
    assert conn.acks == [("binlog.000004", xid_end)], status


def test_semi_sync_ack_after_a_rotation_in_the_same_batch_sans_io(tmp_path, corpus_dir):
    """The same, without sockets: one batch (XID flagged, ROTATE, next file's preamble), then the session's
    sync-and-ACK step."""
    from relayproxy.relay.store import RelayStore
    from relayproxy.upstream.session import UpstreamSession

    from ..support.fakemaster import BinlogIndex, DumpCursor

    files = _tagged_files(corpus_dir)
    xid_end = next(off + len(ev) for off, ev in split_events(files[0][1]) if ev[4] == C.XID_EVENT)
    cfg = config.load(None, {"RELAYPROXY_MASTER": "127.0.0.1:1", "RELAYPROXY_USER": "repl",
                             "RELAYPROXY_SERVER_ID": "100", "RELAYPROXY_RELAY_DIR": str(tmp_path / "relay")})
    store = RelayStore.open(tmp_path / "relay")
    session = UpstreamSession(cfg, store)
    session.receiver.start_stream(announced_checksum="CRC32", semi_sync=True)
    sent = DumpCursor(BinlogIndex(files), file="binlog.000004", pos=4, gtids=None, server_id=1).take()
    session.receiver.feed(b"\x00\xef" + (b"\x01" if s.need_ack else b"\x00") + s.event for s in sent)
    assert session.receiver.ack_pending == ("binlog.000004", xid_end)

    class Conn:
        packets: list[bytes] = []

        def write_packet(self, payload: bytes, seq: int) -> None:
            self.packets.append(payload)

    conn = Conn()
    asyncio.run(session._sync_and_ack(conn))
    store.close()
    assert store.horizon.snapshot().coordinates == ("binlog.000005", len(files[1][1]))
    assert conn.packets == [b"\xef" + struct.pack("<Q", xid_end) + b"binlog.000004"]


def test_gtid_failover_to_a_master_with_other_file_names_never_duplicates(tmp_path, mysql80):
    image = mysql80
    ends = group_ends(image)

    async def scenario():
        async with FakeMySQLMaster([(NAME, image[: ends[10]])]) as old:
            async with running_relay(old, tmp_path / "relay") as info:
                await wait_for(at_end(info, NAME, ends[10]), what="the old master's transactions")
        # The new master has the same transactions in its own binlog, under another name.
        async with FakeMySQLMaster([("other-bin.000001", image)]) as new:
            async with running_relay(new, tmp_path / "relay") as info:
                await wait_for(lambda: len(new.connections) >= 2, what="two connections")
                await asyncio.sleep(0.3)
                store = info["session"].store
                relay = {name: store.path(name).read_bytes() for name in store.files()}
                status = await http_status(info["http"])
        return old, new, relay, status

    old, new, relay, status = asyncio.run(scenario())
    had = scan_bytes(image[: ends[10]]).gtids_after
    # Position dumps (gtids None) are the relay asking for the end of its unclosed file, which this
    # master does not have: it refuses, and the relay keeps what it holds (failover to another
    # binlog layout is a documented limit).
    asked = [c.dump.gtids for c in new.connections if c.dump is not None and c.dump.gtids is not None]
    assert asked and all(g.is_superset(had) for g in asked), [str(g) for g in asked]
    seen: list = []
    for name, data in relay.items():
        scan_bytes(data, on_group=lambda g: seen.append(g.gtid) if g.complete else None)
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} transactions stored twice"
    assert GtidSet(status["retrieved_gtid_set"]).is_superset(had)


def test_a_master_that_freezes_after_the_handshake_is_a_timeout_error_and_retried(tmp_path, mysql80, monkeypatch):
    """A master that accepts the login and then answers nothing (a frozen server, a host gone without closing the
    connection) used to hold the relay "connecting" for good: no error, no retry. Every reply owed before the stream
    begins is bounded (setup.MASTER_SETUP_TIMEOUT, here 0.3 s, or the stream's silence limit, 1.4 s, when longer): the relay records a
    timeout naming the setup, reconnects, and streams once the master answers again."""
    from relayproxy.upstream import setup as S

    monkeypatch.setattr(S, "MASTER_SETUP_TIMEOUT", 0.3)

    async def scenario():
        async with FakeMySQLMaster([(NAME, mysql80)]) as master:
            master.silent_connections = 2
            async with running_relay(master, tmp_path / "relay", connect_timeout="1") as info:
                status = info["session"].status
                await wait_for(lambda: status.last_io_error is not None, 15, "an error for the silent master")
                error = status.last_io_error
                await wait_for(at_end(info, NAME, len(mysql80)), 15, "the file once the master answers")
                return error, [c.commands[:1] for c in master.connections]

    error, commands = asyncio.run(scenario())
    assert "silent for more than" in error and "set up replication" in error, error
    assert commands[:2] == [["unanswered"], ["unanswered"]] and len(commands) >= 3, commands
