"""FaultProxy against a real mariadbd (pass-through, pause, cut, corrupt, refuse, drop, dump) and MysqlStreamWatcher."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pymysql
import pytest

from relayproxy.binlog import constants as C
from relayproxy.lab.faultproxy import (
    CLIENT_TO_SERVER,
    SERVER_TO_CLIENT,
    ConnectionClosedError,
    CorruptionRecord,
    FaultProxy,
    ThreadedFaultProxy,
)
from relayproxy.lab.packetwatch import (
    MAX_PACKET_PAYLOAD,
    EventLocation,
    MysqlStreamWatcher,
)
from relayproxy.lab.sandbox import MariaDBSandbox

from ..support import eventgen as E

COM_BINLOG_DUMP = 0x12
BINLOG_DUMP_NON_BLOCK = 0x01
BINLOG_FILE = "master-bin.000001"
CR_SERVER_GONE_ERROR = 2006
CR_SERVER_LOST = 2013
CR_CONN_HOST_ERROR = 2003
LOST = (CR_SERVER_GONE_ERROR, CR_SERVER_LOST)
BLOB = bytes(range(256)) * 40


# -- helpers ---------------------------------------------------------------------------------------------------


class StreamCapture:
    """A tap that keeps every connection's bytes as the proxy read them (before faults), by connection id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, bytearray] = {}

    def __call__(self, conn_id: int, offset: int, data: bytes) -> None:
        with self._lock:
            stream = self._streams.setdefault(conn_id, bytearray())
            assert offset == len(stream), "tap chunks must arrive in order, without gaps"
            stream += data

    def stream(self, conn_id: int) -> bytes:
        with self._lock:
            return bytes(self._streams.get(conn_id, b""))


def connect(proxy: ThreadedFaultProxy, **kwargs: object) -> pymysql.connections.Connection:
    params: dict[str, object] = {
        "host": proxy.host, "port": proxy.port, "user": "root", "password": "", "autocommit": True,
        "connect_timeout": 10, "read_timeout": 10, "write_timeout": 10,
    }
    params.update(kwargs)
    return pymysql.connect(**params)  # type: ignore[arg-type]


def fetch_one(conn: pymysql.connections.Connection, sql: str) -> object:
    with conn.cursor() as cur:
        cur.execute(sql)
        (row,) = cur.fetchall()
        return row[0]


def start_dump(conn: pymysql.connections.Connection, server_id: int, pos: int = 4) -> None:
    """Ask for BINLOG_FILE from `pos` as a non-blocking replica would (the server ends with EOF)."""
    with conn.cursor() as cur:
        cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
        cur.execute("SET @mariadb_slave_capability = 4")
    request = struct.pack("<IHI", pos, BINLOG_DUMP_NON_BLOCK, server_id) + BINLOG_FILE.encode()
    conn._execute_command(COM_BINLOG_DUMP, request)


def read_dump(conn: pymysql.connections.Connection, into: list[bytes], limit: int = 10_000) -> None:
    """Append each dump packet's payload to `into` until the EOF packet (raises on a broken connection)."""
    for _ in range(limit):
        packet = conn._read_packet()
        if packet.is_eof_packet():
            return
        into.append(packet.get_all_data())
    raise AssertionError(f"dump sent more than {limit} packets")


def read_packet(sock: socket.socket) -> bytes:
    """One whole MySQL packet (header included) from a blocking socket."""
    header = recv_exactly(sock, 4)
    return header + recv_exactly(sock, int.from_bytes(header[:3], "little"))


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AssertionError(f"EOF after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def recv_until_eof(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    data = bytearray()
    while len(data) <= limit:
        chunk = sock.recv(65536)
        if not chunk:
            return bytes(data)
        data += chunk
    raise AssertionError("peer kept sending")


def raw_connect(proxy: ThreadedFaultProxy) -> socket.socket:
    sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
    sock.settimeout(10)
    return sock


def write_transactions(master: MariaDBSandbox) -> None:
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.items (id INT PRIMARY KEY, payload VARCHAR(200)) ENGINE=InnoDB")
    with master.connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = 'ROW'")
        cur.execute("BEGIN")
        for i in range(3):
            cur.execute("INSERT INTO t.items VALUES (%s, %s)", (i, f"row {i} " * 10))
        cur.execute("COMMIT")
        cur.execute("INSERT INTO t.items VALUES (100, 'autocommit')")
        cur.execute("UPDATE t.items SET payload = 'changed' WHERE id < 2")


# -- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture
def master(mariadb) -> MariaDBSandbox:
    return mariadb()


@pytest.fixture
def proxy(master: MariaDBSandbox) -> Iterator[ThreadedFaultProxy]:
    fault_proxy = ThreadedFaultProxy(master.host, master.port).start()
    try:
        yield fault_proxy
        assert fault_proxy.errors == []
    finally:
        fault_proxy.stop()
    assert fault_proxy.leftover_tasks == 0


# -- pass-through and counters ---------------------------------------------------------------------------------


def test_queries_pass_through_and_counters_add_up(proxy: ThreadedFaultProxy, master: MariaDBSandbox) -> None:
    capture = StreamCapture()
    proxy.on_server_bytes(capture)
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.blobs (id INT PRIMARY KEY, b LONGBLOB)")
    master.execute("INSERT INTO t.blobs VALUES (1, %s)", (BLOB,))

    for _ in range(2):
        with connect(proxy) as conn:
            assert fetch_one(conn, "SELECT b FROM t.blobs WHERE id = 1") == BLOB
            assert fetch_one(conn, "SELECT @@port") == master.port
            assert fetch_one(conn, "SELECT REPEAT('ab', 50000)") == "ab" * 50000
    proxy.wait_until_idle()

    stats = proxy.stats()
    assert (stats.accepted, stats.active, stats.refused) == (2, 0, 0)
    infos = proxy.connections()
    assert [i.id for i in infos] == [1, 2] and not any(i.open for i in infos)
    assert stats.server_to_client == sum(i.server_to_client for i in infos)
    assert stats.client_to_server == sum(i.client_to_server for i in infos)
    for info in infos:
        assert info.close_reason == "closed by peers"
        assert info.server_to_client == info.server_to_client_received == len(capture.stream(info.id)) > 100_000
        assert 0 < info.client_to_server == info.client_to_server_received


def test_byte_counts_are_exact_and_half_closes_pass_through(proxy: ThreadedFaultProxy) -> None:
    with raw_connect(proxy) as sock:
        greeting = read_packet(sock)
        assert greeting[3] == 0 and greeting[4] == 10  # sequence 0, protocol version 10
        assert proxy.wait_for_bytes(len(greeting)) == len(greeting)
        assert proxy.connection().server_to_client == len(greeting)

        garbage = b"\x05\x00\x00\x01hello"  # not a handshake response: the server answers with an error and hangs up
        sock.sendall(garbage)
        assert proxy.wait_for_bytes(len(garbage), direction=CLIENT_TO_SERVER) == len(garbage)
        reply = recv_until_eof(sock)
        assert reply[4] == 0xFF  # ERR packet, then EOF forwarded from the server's close
    info = proxy.wait_closed(1)
    assert (info.server_to_client, info.client_to_server) == (len(greeting) + len(reply), len(garbage))


# -- pause -----------------------------------------------------------------------------------------------------


def test_pause_holds_a_query_until_resume(proxy: ThreadedFaultProxy) -> None:
    with connect(proxy) as conn, ThreadPoolExecutor(1) as pool:
        conn_id = proxy.connection().id
        before = proxy.connection(conn_id).server_to_client
        proxy.pause(SERVER_TO_CLIENT)
        result = pool.submit(fetch_one, conn, "SELECT REPEAT('z', 1000)")
        # The server has answered: the reply is in the proxy, held, none of it forwarded.
        proxy.wait_for_bytes(before + 1000, stage="received")
        assert proxy.connection(conn_id).server_to_client == before
        assert not result.done()
        proxy.resume()
        assert result.result(timeout=10) == "z" * 1000
        assert proxy.connection(conn_id).server_to_client > before + 1000


def test_pause_both_ways_holds_a_new_connection_before_the_greeting(proxy: ThreadedFaultProxy) -> None:
    proxy.pause()
    with raw_connect(proxy) as sock:
        proxy.wait_for_bytes(1, on=1, stage="received")
        assert proxy.connection(1).server_to_client == 0
        proxy.resume()
        greeting = read_packet(sock)
        assert greeting[4] == 10


def test_pause_at_stream_offset_freezes_a_reply_at_that_byte(proxy: ThreadedFaultProxy) -> None:
    with connect(proxy) as conn, ThreadPoolExecutor(1) as pool:
        conn_id = proxy.connection().id
        freeze_at = proxy.connection(conn_id).server_to_client + 50
        assert proxy.pause_at_stream_offset(freeze_at) == conn_id
        result = pool.submit(fetch_one, conn, "SELECT REPEAT('q', 5000)")
        proxy.wait_for_bytes(freeze_at + 4000, stage="received")
        assert proxy.connection(conn_id).server_to_client == freeze_at
        assert not result.done()
        proxy.resume()
        assert result.result(timeout=10) == "q" * 5000


# -- cuts ------------------------------------------------------------------------------------------------------


def test_cut_after_cuts_mid_response_with_a_clean_error(proxy: ThreadedFaultProxy) -> None:
    conn = connect(proxy)
    conn_id = proxy.connection().id
    before = proxy.connection(conn_id).server_to_client
    assert proxy.cut_after(5000) == conn_id
    with pytest.raises(pymysql.err.OperationalError) as raised:
        fetch_one(conn, "SELECT REPEAT('x', 100000)")
    assert raised.value.args[0] == CR_SERVER_LOST
    info = proxy.wait_closed(conn_id)
    assert info.server_to_client == before + 5000
    assert info.close_reason == f"cut at server_to_client offset {before + 5000}"
    conn.close()

    with connect(proxy) as again:  # the proxy itself carries on
        assert fetch_one(again, "SELECT 42") == 42


def test_cut_at_stream_offset_delivers_exactly_that_many_bytes(proxy: ThreadedFaultProxy) -> None:
    capture = StreamCapture()
    proxy.on_server_bytes(capture)
    assert proxy.cut_at_stream_offset(30, on="next") is None  # armed for the next connection
    with raw_connect(proxy) as sock:
        received = recv_until_eof(sock)  # a FIN, not a reset: the bytes before the cut all arrive
    assert received == capture.stream(1)[:30]
    assert proxy.wait_closed(1).server_to_client == 30
    with connect(proxy), pytest.raises(ValueError, match="already forwarded"):
        proxy.cut_at_stream_offset(10)  # past: cutting elsewhere would be a silent lie


# -- corruption ------------------------------------------------------------------------------------------------


def test_corrupt_flips_exactly_the_chosen_byte(proxy: ThreadedFaultProxy, master: MariaDBSandbox) -> None:
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.blobs (id INT PRIMARY KEY, b LONGBLOB)")
    master.execute("INSERT INTO t.blobs VALUES (1, %s)", (BLOB,))
    query = "SELECT b FROM t.blobs WHERE id = 1"
    capture = StreamCapture()
    proxy.on_server_bytes(capture)

    with connect(proxy) as conn:
        conn_id = proxy.connection().id
        start = proxy.connection(conn_id).server_to_client
        assert fetch_one(conn, query) == BLOB
        second = proxy.connection(conn_id).server_to_client
        first_reply = capture.stream(conn_id)[start:second]
        where = first_reply.find(BLOB)
        assert where > 0 and first_reply.count(BLOB) == 1

        # The same query gets a byte-identical reply, so the blob's 1000th byte sits at a known stream offset.
        target = second + where + 1000
        proxy.corrupt(target, xor_mask=0x5A)
        got = fetch_one(conn, query)
        assert isinstance(got, bytes) and len(got) == len(BLOB)
        assert [i for i in range(len(BLOB)) if got[i] != BLOB[i]] == [1000]
        assert got[1000] == BLOB[1000] ^ 0x5A
        assert proxy.connection(conn_id).corruptions == (
            CorruptionRecord(SERVER_TO_CLIENT, target, BLOB[1000], BLOB[1000] ^ 0x5A),
        )
        # Taps see the bytes as the server sent them.
        assert capture.stream(conn_id)[second:] == first_reply
    assert master.execute(query) == ((BLOB,),)


# -- refuse and drop -------------------------------------------------------------------------------------------


def test_refuse_makes_connections_fail_until_lifted(proxy: ThreadedFaultProxy) -> None:
    port = proxy.port
    with connect(proxy) as survivor:
        proxy.refuse(True)
        with pytest.raises(pymysql.err.OperationalError) as raised:
            connect(proxy)
        assert raised.value.args[0] == CR_CONN_HOST_ERROR and "Connection refused" in str(raised.value)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((proxy.host, port), timeout=10).close()
        assert fetch_one(survivor, "SELECT 1") == 1  # open connections are untouched

        proxy.refuse(True, reset=True)
        with pytest.raises(pymysql.err.OperationalError) as raised:
            connect(proxy)
        # TCP connect succeeds, then the handshake read fails: PyMySQL says 2003 (reset) or 2013 (EOF).
        assert raised.value.args[0] in (CR_CONN_HOST_ERROR, CR_SERVER_LOST)
        assert "Connection refused" not in str(raised.value)
        assert proxy.stats().refused == 1

        proxy.refuse(False)
        assert proxy.port == port
        with connect(proxy) as again:
            assert fetch_one(again, "SELECT 2") == 2
    assert proxy.stats().accepted == 2


def test_drop_connections_kills_live_connections(proxy: ThreadedFaultProxy) -> None:
    first, second = connect(proxy), connect(proxy)
    assert proxy.active_connections == 2
    assert proxy.drop_connections() == 2
    for conn in (first, second):
        with pytest.raises(pymysql.err.OperationalError) as raised:
            fetch_one(conn, "SELECT 1")
        assert raised.value.args[0] in LOST
        conn.close()
    proxy.wait_until_idle()
    assert proxy.stats().active == 0
    assert [i.close_reason for i in proxy.connections()] == ["dropped", "dropped"]

    with raw_connect(proxy) as sock:
        greeting = read_packet(sock)
        proxy.wait_for_bytes(len(greeting))
        assert proxy.drop_connections(reset=True) == 1
        with pytest.raises(ConnectionResetError):
            sock.recv(1)

    with connect(proxy) as conn:
        assert fetch_one(conn, "SELECT 3") == 3


def test_retarget_moves_the_address_to_another_server_and_drops_open_connections(
    proxy: ThreadedFaultProxy, master: MariaDBSandbox, mariadb
) -> None:
    other = mariadb("other", server_id=77)
    kept = connect(proxy)
    assert fetch_one(kept, "SELECT @@server_id") == master.server_id
    assert proxy.retarget(other.host, other.port) == 1  # what a VIP or DNS name moved to another server does
    with pytest.raises(pymysql.err.OperationalError) as raised:
        fetch_one(kept, "SELECT 1")
    assert raised.value.args[0] in LOST
    kept.close()
    assert (proxy.upstream_host, proxy.upstream_port) == (other.host, other.port)
    with connect(proxy) as conn:
        assert fetch_one(conn, "SELECT @@server_id") == 77
    proxy.wait_until_idle()
    assert proxy.retarget(master.host, master.port) == 0
    with connect(proxy) as conn:
        assert fetch_one(conn, "SELECT @@server_id") == master.server_id


def test_wait_for_bytes_fails_fast_when_the_connection_closes(proxy: ThreadedFaultProxy) -> None:
    with connect(proxy):
        conn_id = proxy.connection().id
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(proxy.wait_for_bytes, 10**9, 10.0, on=conn_id)
            proxy.drop_connections()  # before or after the wait starts: either way it must not sit out its timeout
            with pytest.raises(ConnectionClosedError):
                waiting.result(timeout=10)
        with pytest.raises(TimeoutError):
            proxy.wait_for_bytes(1, 0.05, on="next")
    

# -- many connections, stopping --------------------------------------------------------------------------------


def test_many_connections_at_once(proxy: ThreadedFaultProxy) -> None:
    workers = 16
    all_open = threading.Barrier(workers + 1, timeout=20)
    checked = threading.Barrier(workers + 1, timeout=20)

    def work(n: int) -> list[object]:
        with connect(proxy) as conn:
            all_open.wait()
            checked.wait()
            return [fetch_one(conn, f"SELECT {n} * {i}") for i in range(20)]

    with ThreadPoolExecutor(workers) as pool:
        results = [pool.submit(work, n) for n in range(workers)]
        all_open.wait()
        assert proxy.active_connections == workers
        checked.wait()
        for n, result in enumerate(results):
            assert result.result(timeout=20) == [n * i for i in range(20)]
    proxy.wait_until_idle()
    stats = proxy.stats()
    assert (stats.accepted, stats.active) == (workers, 0)
    assert stats.server_to_client == sum(i.server_to_client for i in proxy.connections())


def test_threaded_proxy_stop_releases_everything(master: MariaDBSandbox) -> None:
    proxy = ThreadedFaultProxy(master.host, master.port).start()
    port = proxy.port
    conn = connect(proxy)
    proxy.pause()  # even with held bytes and a live connection
    proxy.stop()
    assert proxy.leftover_tasks == 0
    assert not any(t.name.startswith("faultproxy") for t in threading.enumerate())
    with pytest.raises(pymysql.err.OperationalError):
        fetch_one(conn, "SELECT 1")
    conn.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    with socket.socket() as sock:  # the port is free to take again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_async_proxy_stops_cleanly_inside_a_running_loop(master: MariaDBSandbox) -> None:
    async def scenario() -> None:
        async with FaultProxy(master.host, master.port) as proxy:
            port = proxy.port
            streams = []
            for n in range(1, 4):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                streams.append((reader, writer))
                header = await reader.readexactly(4)
                await reader.readexactly(int.from_bytes(header[:3], "little"))
                assert await proxy.wait_for_bytes(1, on=n) > 4
            assert proxy.active_connections == 3
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
        for reader, writer in streams:
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            await writer.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)

    asyncio.run(scenario())


# -- binlog dumps through the proxy ----------------------------------------------------------------------------


def test_binlog_dump_events_sit_at_the_offsets_the_watcher_reports(
    proxy: ThreadedFaultProxy, master: MariaDBSandbox
) -> None:
    write_transactions(master)
    capture = StreamCapture()
    watcher = MysqlStreamWatcher()  # told about the dump by the client's bytes
    guesser = MysqlStreamWatcher()  # finds the dump from the server's bytes alone
    proxy.on_server_bytes(capture)
    proxy.on_server_bytes(lambda _cid, _off, data: (watcher.feed(data), guesser.feed(data)))
    proxy.on_client_bytes(lambda _cid, _off, data: watcher.feed_client(data))

    received: list[bytes] = []
    with connect(proxy) as conn:
        start_dump(conn, server_id=901)
        read_dump(conn, received)
        conn_id = proxy.connection().id
    stream = capture.stream(conn_id)
    binlog = master.binlog_files()[0].read_bytes()

    assert watcher.problems == [] and guesser.problems == []
    assert watcher.dump_started_at == guesser.dump_started_at is not None
    assert watcher.dump_end is not None and watcher.dump_end.kind == "eof"
    assert guesser.events == watcher.events
    events = watcher.events
    assert len(events) == len(received) > 20
    assert [e.name for e in events[:2]] == ["ROTATE", "FORMAT_DESCRIPTION"] and events[0].artificial
    assert {"MARIA_GTID", "TABLE_MAP", "WRITE_ROWS_V1", "XID", "QUERY"} <= {e.name for e in events}
    for event, payload in zip(events, received):
        in_stream = stream[event.start : event.end]
        assert payload[:1] == b"\x00" and payload[1:] == in_stream
        assert in_stream[4] == event.type_code and len(in_stream) == event.event_size
        assert watcher.event_at(event.middle) is event
        if event.artificial:
            continue
        in_file = binlog[event.master_offset : event.log_pos]
        if event.type_code == C.FORMAT_DESCRIPTION_EVENT:
            # The master clears LOG_EVENT_BINLOG_IN_USE_F in the FDE it sends; the rest is the file's bytes.
            in_file = in_file[:17] + bytes([in_file[17] & ~C.LOG_EVENT_BINLOG_IN_USE_F]) + in_file[18:]
        assert in_stream == in_file, event


def test_fragmented_slow_stream_carries_the_same_dump(proxy: ThreadedFaultProxy, master: MariaDBSandbox) -> None:
    write_transactions(master)
    direct: list[bytes] = []
    with master.connect(read_timeout=10) as conn:
        start_dump(conn, server_id=904)
        read_dump(conn, direct)

    capture = StreamCapture()
    proxy.on_server_bytes(capture)
    proxy.fragment(7, SERVER_TO_CLIENT)
    proxy.delay(0.0002, SERVER_TO_CLIENT)
    through: list[bytes] = []
    with connect(proxy) as conn:
        conn_id = proxy.connection().id
        start_dump(conn, server_id=905)
        read_dump(conn, through)
    # The artificial ROTATE carries no timestamp and the rest is the file, so both dumps are byte-identical.
    assert through == direct
    assert proxy.wait_closed(conn_id).server_to_client == len(capture.stream(conn_id))


@pytest.mark.parametrize("where", ["middle", "after"])
def test_cut_in_the_middle_of_or_right_after_an_event(
    proxy: ThreadedFaultProxy, master: MariaDBSandbox, where: str
) -> None:
    write_transactions(master)
    watcher = MysqlStreamWatcher()
    armed: dict[str, object] = {}

    def cut_at_first_xid(conn_id: int, _offset: int, data: bytes) -> None:
        # Runs on the proxy thread before `data` is forwarded, so the cut can still land inside it.
        for event in watcher.feed(data):
            if event.type_code == C.XID_EVENT and not armed:
                armed["event"] = event
                armed["offset"] = event.middle if where == "middle" else event.packet_end
                proxy.cut_at_stream_offset(armed["offset"], on=conn_id)  # type: ignore[arg-type]

    proxy.on_server_bytes(cut_at_first_xid)
    proxy.on_client_bytes(lambda _cid, _off, data: watcher.feed_client(data))
    received: list[bytes] = []
    with connect(proxy) as conn:
        conn_id = proxy.connection().id
        start_dump(conn, server_id=902)
        with pytest.raises(pymysql.err.OperationalError) as raised:
            read_dump(conn, received)
    assert raised.value.args[0] == CR_SERVER_LOST

    xid = armed["event"]
    assert isinstance(xid, EventLocation)
    assert proxy.wait_closed(conn_id).server_to_client == armed["offset"]
    # The client got every event before the XID whole, and the XID itself only when cut after it.
    assert len(received) == xid.index + (1 if where == "after" else 0)
    assert [p[5] for p in received] == [e.type_code for e in watcher.events[: len(received)]]


def test_corrupting_a_byte_inside_an_event(proxy: ThreadedFaultProxy, master: MariaDBSandbox) -> None:
    write_transactions(master)
    watcher = MysqlStreamWatcher()
    targets: list[tuple[int, int]] = []

    def flip_last_crc_byte_of_first_write_rows(conn_id: int, _offset: int, data: bytes) -> None:
        for event in watcher.feed(data):
            if event.name == "WRITE_ROWS_V1" and not targets:
                targets.append((event.index, event.event_size - 1))
                proxy.corrupt(event.stream_offset(event.event_size - 1), 0xFF, on=conn_id)

    proxy.on_server_bytes(flip_last_crc_byte_of_first_write_rows)
    proxy.on_client_bytes(lambda _cid, _off, data: watcher.feed_client(data))
    received: list[bytes] = []
    with connect(proxy) as conn:
        start_dump(conn, server_id=903)
        read_dump(conn, received)

    binlog = master.binlog_files()[0].read_bytes()
    ((index, byte),) = targets
    event = watcher.events[index]
    got, want = received[index][1:], binlog[event.master_offset : event.log_pos]
    assert [i for i in range(len(want)) if got[i] != want[i]] == [byte]
    assert got[byte] == want[byte] ^ 0xFF
    after = watcher.events[index + 1]  # untouched
    assert received[index + 1][1:] == binlog[after.master_offset : after.log_pos]


# -- MysqlStreamWatcher on synthetic streams -------------------------------------------------------------------


EOF_PACKET = b"\xfe\x00\x00\x02\x00"


def packets(payload: bytes, seq: int) -> tuple[bytes, int]:
    """`payload` framed as one logical packet (split at 16 MB), and the next sequence id."""
    out = bytearray()
    while True:
        chunk, payload = payload[:MAX_PACKET_PAYLOAD], payload[MAX_PACKET_PAYLOAD:]
        out += len(chunk).to_bytes(3, "little") + bytes([seq & 0xFF]) + chunk
        seq += 1
        if len(chunk) < MAX_PACKET_PAYLOAD:
            return bytes(out), seq


def synthetic_session(events: list[bytes], *, prefix: bytes = b"\x00", ending: bytes = EOF_PACKET) -> bytes:
    """Greeting, auth OK, decoy packets, then a dump of `events` (each after `prefix`) and `ending`."""
    out = bytearray()
    out += packets(b"\x0a5.5.5-10.11.0-MariaDB\x00" + bytes(60), 0)[0]
    out += packets(b"\x00\x00\x00\x02\x00\x00\x00", 2)[0]
    # Decoys before the dump: an OK packet (sequence 1, 0x00, 20+ bytes, a 4 where an event's type would be) and
    # a result-set row whose first column is empty. Neither is the artificial ROTATE that opens a dump.
    out += packets(b"\x00\x00\x00\x02\x00\x04" + b"info" * 6, 1)[0]
    out += packets(b"\x01", 1)[0] + packets(b"\x03def" + bytes(20), 2)[0] + packets(EOF_PACKET, 3)[0]
    out += packets(b"\x00" + bytes(30), 4)[0] + packets(EOF_PACKET, 5)[0]
    seq = 1
    for event in [E.rotate("master-bin.000001", timestamp=0, flags=C.LOG_EVENT_ARTIFICIAL_F), *events]:
        framed, seq = packets(prefix + event, seq)
        out += framed
    out += packets(ending, seq)[0]
    return bytes(out)


def feed_in_pieces(watcher: MysqlStreamWatcher, data: bytes, rng: random.Random, biggest: int = 700) -> None:
    pos = 0
    while pos < len(data):
        n = rng.choice((1, 2, 3, rng.randint(1, biggest)))
        watcher.feed(data[pos : pos + n])
        pos += n


def test_watcher_finds_events_however_the_stream_is_chunked() -> None:
    events = [E.fde("10.11.0-MariaDB"), E.maria_gtid(1), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(7)]
    data = synthetic_session(events)
    whole = MysqlStreamWatcher()
    assert len(whole.feed(data)) == len(events) + 1
    assert whole.problems == [] and whole.dump_end is not None and whole.dump_end.kind == "eof"
    assert [e.name for e in whole.events][1:] == ["FORMAT_DESCRIPTION", "MARIA_GTID", "QUERY", "TABLE_MAP",
                                                  "WRITE_ROWS_V2", "XID"]
    for found, raw in zip(whole.events[1:], events):
        assert data[found.start : found.end] == raw and found.packet_end == found.end
        assert data[found.start - 1] == 0x00  # the status byte before each event
    for seed in range(20):
        pieces = MysqlStreamWatcher()
        feed_in_pieces(pieces, data, random.Random(seed))
        assert pieces.events == whole.events and pieces.offset == len(data)


def test_watcher_follows_events_across_16mb_packets() -> None:
    # One event that spills into a second packet, one whose packets fill exactly 2 x 0xFFFFFF (so an empty
    # packet ends it), then a small one that must still be found where it is.
    spill = E.event(C.WRITE_ROWS_EVENT, bytes(MAX_PACKET_PAYLOAD + 1000 - 23))
    exact = E.event(C.WRITE_ROWS_EVENT, bytes(2 * MAX_PACKET_PAYLOAD - 1 - 23))
    assert len(spill) == MAX_PACKET_PAYLOAD + 1000 and 1 + len(exact) == 2 * MAX_PACKET_PAYLOAD
    data = synthetic_session([spill, exact, E.xid(9)])
    watcher = MysqlStreamWatcher()
    feed_in_pieces(watcher, data, random.Random(1), biggest=4 << 20)
    assert watcher.problems == []
    _, big, bigger, small = watcher.events
    assert len(big.segments) == 2 and len(bigger.segments) == 2
    for event, raw in ((big, spill), (bigger, exact)):
        assert b"".join(data[s:e] for s, e in event.segments) == raw
        assert event.end == event.segments[-1][1]
        for i in (0, 19, MAX_PACKET_PAYLOAD - 2, MAX_PACKET_PAYLOAD - 1, len(raw) - 1):
            assert data[event.stream_offset(i)] == raw[i]
    assert bigger.packet_end == bigger.end + 4  # the empty packet's header
    assert big.packet_end == bigger.packet_start and bigger.packet_end == small.packet_start
    assert data[small.start : small.end] == E.xid(9)


def test_watcher_semi_sync_prefix_and_error_end() -> None:
    events = [E.maria_gtid(1), E.xid(2)]
    error = b"\xff" + (1236).to_bytes(2, "little") + b"#HY000" + b"Could not find first log file name"
    data = synthetic_session(events, prefix=b"\x00\xef\x01", ending=error)
    watcher = MysqlStreamWatcher()
    watcher.feed(data)
    assert watcher.problems == []
    assert len(watcher.events) == 3 and all(e.semi_sync and e.ack_requested for e in watcher.events)
    assert [data[e.start : e.end] for e in watcher.events[1:]] == events
    assert watcher.dump_end is not None
    assert (watcher.dump_end.kind, watcher.dump_end.error_code) == ("error", 1236)
    assert watcher.dump_end.message == "Could not find first log file name"


def test_watcher_uses_the_client_dump_command_and_stops_at_tls() -> None:
    watcher = MysqlStreamWatcher()
    watcher.feed_client(packets(struct.pack("<I", 0x000FA685) + bytes(28), 1)[0])  # handshake response, no TLS
    watcher.feed(packets(b"\x00\x00\x00\x02\x00\x00\x00", 2)[0])
    watcher.feed_client(packets(bytes([COM_BINLOG_DUMP]) + bytes(10), 0)[0])
    # Without the command this would not count: it is not the artificial ROTATE a dump opens with.
    first = watcher.feed(packets(b"\x00" + E.xid(5), 1)[0])
    assert [e.name for e in first] == ["XID"] and watcher.dump_started_at == 11

    tls = MysqlStreamWatcher()
    tls.feed_client(packets(struct.pack("<I", 0x000FAE85) + bytes(28), 1)[0])
    assert tls.stopped and "TLS" in tls.problems[0]
    assert tls.feed(b"\x17\x03\x03" + bytes(100)) == [] and tls.offset == 103
