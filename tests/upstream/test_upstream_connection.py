"""UpstreamConnection against real mariadbd servers (and, for MySQL-only auth paths, a scripted fake MySQL 8):
authentication plugins, TLS modes, queries, the binlog dump incl. >16 MiB events, flow control, lost masters."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import os
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from relayproxy.binlog import checksum
from relayproxy.upstream import ConnectionLost, UpstreamConnection
from relayproxy.wire import errors as E
from relayproxy.wire import packets as P
from relayproxy.wire.handshake import parse_handshake
from relayproxy.wire.packets import MySQLError, parse_err, read_lenenc_bytes

PASSWORD = "s3cret-Pässword"
ROTATE_EVENT, FORMAT_DESCRIPTION_EVENT = 4, 15
_EVENT_HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine to completion on the default asyncio loop or on uvloop."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


def event_type(payload: bytes) -> int:
    return payload[1 + 4]


def events_of(payloads: list[bytes]) -> list[bytes]:
    """The events (without the 0x00 marker) of a dump's payloads, which must end with EOF."""
    assert P.is_eof(payloads[-1]), payloads[-1][:20]
    assert all(p[0] == 0 for p in payloads[:-1])
    return [p[1:] for p in payloads[:-1]]


async def dump_until_eof(conn: UpstreamConnection) -> list[bytes]:
    payloads: list[bytes] = []
    while not payloads or payloads[-1][0] == 0:
        payloads += await conn.read_packets()
    return payloads


async def prepare_replica_session(conn: UpstreamConnection) -> None:
    # Without these the master refuses checksummed events / rewrites MariaDB-only ones.
    await conn.query("SET @master_binlog_checksum = @@global.binlog_checksum")
    await conn.query("SET @mariadb_slave_capability = 4")


async def slow_dump(conn: UpstreamConnection) -> tuple[list[bytes], int, bool]:
    """Read a whole non-blocking dump more slowly than the master sends it: (payloads, largest batch in bytes,
    whether reading was seen paused)."""
    # With ANNOTATE_ROWS, as a MariaDB replica asks: then every event of the file is sent.
    flags = P.BINLOG_DUMP_NON_BLOCK | P.BINLOG_SEND_ANNOTATE_ROWS_EVENT
    await conn.binlog_dump("master-bin.000001", 4, server_id=9, flags=flags)
    payloads: list[bytes] = []
    largest_batch = 0
    paused_seen = False
    while not payloads or payloads[-1][0] == 0:
        await asyncio.sleep(0.01)
        paused_seen |= conn._protocol.paused
        batch = await conn.read_packets()
        largest_batch = max(largest_batch, sum(map(len, batch)))
        payloads += batch
    return payloads, largest_batch, paused_seen


def write_row_events(master: Any, transactions: int, rows: int = 500, width: int = 2000) -> None:
    """About transactions * rows * width bytes of row events in the master's binlog."""
    master.execute("CREATE DATABASE IF NOT EXISTS t")
    master.execute(f"CREATE TABLE t.rows (id INT PRIMARY KEY, v VARCHAR({width}))")
    master.execute("SET SESSION binlog_format = 'ROW'")  # on the sandbox's kept admin connection
    for batch in range(transactions):
        values = ", ".join(f"({batch * rows + i}, REPEAT('r', {width}))" for i in range(rows))
        master.execute(f"INSERT INTO t.rows VALUES {values}")


def assert_events_match_file(events: list[bytes], binlog: bytes) -> None:
    """Every real event (log_pos != 0) has a valid CRC32 and is byte-identical to the master's file."""
    compared = 0
    for event in events:
        checksum.verify(event)
        _, _, _, size, log_pos, _ = _EVENT_HEADER.unpack_from(event)
        assert size == len(event)
        if not log_pos:
            continue  # artificial (the fake ROTATE): not in the file
        stored = binlog[log_pos - size : log_pos]
        if event[4] == FORMAT_DESCRIPTION_EVENT:
            # The master clears LOG_EVENT_BINLOG_IN_USE_F (0x1) in the FDE it sends (and recomputes the CRC).
            stored_flags, sent_flags = struct.unpack_from("<H", stored, 17)[0], struct.unpack_from("<H", event, 17)[0]
            assert stored_flags & ~1 == sent_flags
            assert (stored[:17], stored[19:-4]) == (event[:17], event[19:-4])
        else:
            assert stored == event
        compared += 1
    assert compared


# -- TLS material ------------------------------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def write_tls_files(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate it signed (for 127.0.0.1 and localhost) and an unrelated CA, as PEM files."""
    ca_key, ca_cert = make_ca("relayproxy test CA")
    _, other_ca = make_ca("some other CA")
    server_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("relayproxy test master"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = {
        "ca": (directory / "ca.pem", ca_cert.public_bytes(pem)),
        "other_ca": (directory / "other-ca.pem", other_ca.public_bytes(pem)),
        "cert": (directory / "server-cert.pem", server_cert.public_bytes(pem)),
        "key": (
            directory / "server-key.pem",
            server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        ),
    }
    for path, data in files.values():
        path.write_bytes(data)
    return {name: path for name, (path, _) in files.items()}


# -- real mariadbd: authentication and queries -------------------------------------------------------------------


def test_native_password_queries_and_errors(mariadb, run):
    master = mariadb()
    master.create_user("repl", PASSWORD, grants="REPLICATION SLAVE, REPLICATION CLIENT, SELECT, CREATE, INSERT")
    ((version,),) = master.execute("SELECT VERSION()")

    async def scenario() -> None:
        conn = await UpstreamConnection.connect(master.host, master.port, "repl", PASSWORD, connect_timeout=5)
        async with conn:
            assert conn.server_version == version
            assert conn.handshake.server_version == "5.5.5-" + version
            assert conn.is_mariadb and not conn.tls  # preferred, and this server has no certificates
            assert (await conn.query("SELECT CONNECTION_ID()")).rows == [(str(conn.connection_id),)]

            result = await conn.query("SELECT 1 AS one, NULL AS nothing, 'grüße' AS text, x'00ff' AS raw")
            assert result.columns == ["one", "nothing", "text", "raw"]
            assert result.rows[0][:3] == ("1", None, "grüße")
            assert result.rows[0][3].encode("utf-8", "surrogateescape") == b"\x00\xff"

            await conn.query("CREATE DATABASE app")
            assert (await conn.query("SELECT seq FROM app.seq_1_to_1000")).rows == [(str(i),) for i in range(1, 1001)]
            await conn.query("CREATE TABLE app.t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(10))")
            inserted = await conn.query("INSERT INTO app.t (v) VALUES ('a'), ('b'), ('c')")
            assert (inserted.columns, inserted.rows, inserted.affected_rows, inserted.last_insert_id) == ([], [], 3, 1)

            with pytest.raises(MySQLError) as info:
                await conn.query("SELEC 1")
            assert (info.value.code, info.value.sqlstate) == (1064, "42000")
            with pytest.raises(MySQLError) as info:
                await conn.query("DROP DATABASE app")  # no DROP privilege
            assert info.value.code == 1044
            assert (await conn.query("SELECT COUNT(*) FROM app.t")).rows == [("3",)]  # still usable

        assert conn.is_closed
        with pytest.raises(ConnectionLost):
            await conn.query("SELECT 1")

        with pytest.raises(MySQLError) as info:
            await UpstreamConnection.connect(master.host, master.port, "repl", "not-" + PASSWORD)
        assert (info.value.code, info.value.sqlstate) == (1045, "28000")
        assert "using password: YES" in info.value.message
        assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value)

        with pytest.raises(MySQLError) as info:
            await UpstreamConnection.connect(master.host, master.port, "repl", PASSWORD, ssl_mode="required")
        assert info.value.code == E.CR_SSL_CONNECTION_ERROR
        assert "does not support SSL" in info.value.message

    run(scenario())


def test_ed25519_user(mariadb):
    master = mariadb()
    master.execute("INSTALL SONAME 'auth_ed25519'")
    master.execute("CREATE USER 'edrepl'@'%%' IDENTIFIED VIA ed25519 USING PASSWORD(%s)", (PASSWORD,))
    master.execute("GRANT REPLICATION SLAVE ON *.* TO 'edrepl'@'%'")

    async def scenario() -> None:
        async with await UpstreamConnection.connect(master.host, master.port, "edrepl", PASSWORD) as conn:
            assert (await conn.query("SELECT CURRENT_USER()")).rows == [("edrepl@%",)]
        with pytest.raises(MySQLError) as info:
            await UpstreamConnection.connect(master.host, master.port, "edrepl", PASSWORD + "x")
        assert info.value.code == 1045 and PASSWORD not in str(info.value)

    asyncio.run(scenario())


def test_real_greeting_parses(mariadb):
    master = mariadb()
    with socket.create_connection((master.host, master.port), timeout=5) as sock:
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:3], "little"):
            data += sock.recv(4096)
    assert data[3] == 0  # sequence id of the greeting
    hs = parse_handshake(data[4:])
    version, connection_id = master.execute("SELECT VERSION(), CONNECTION_ID()")[0]
    assert hs.version == version and hs.is_mariadb and hs.version_tuple[0] >= 10
    assert hs.auth_plugin_name == "mysql_native_password" and len(hs.auth_plugin_data) == 20
    assert 0 < hs.connection_id < connection_id


# -- real mariadbd: TLS ------------------------------------------------------------------------------------------


def test_tls_modes(mariadb, run, tmp_path):
    tls = write_tls_files(tmp_path)
    master = mariadb(extra_config={"ssl_ca": tls["ca"], "ssl_cert": tls["cert"], "ssl_key": tls["key"]})
    master.create_user("repl", PASSWORD, grants="REPLICATION SLAVE, REPLICATION CLIENT")
    write_row_events(master, transactions=2)  # ~2 MiB to dump

    async def connect(**options: Any) -> UpstreamConnection:
        return await UpstreamConnection.connect(master.host, master.port, "repl", PASSWORD, **options)

    async def ssl_version(conn: UpstreamConnection) -> str:
        return (await conn.query("SHOW SESSION STATUS LIKE 'Ssl_version'")).rows[0][1] or ""

    async def scenario() -> None:
        for options in (
            {"ssl_mode": "verify_ca", "ssl_ca": tls["ca"]},
            {"ssl_mode": "verify_identity", "ssl_ca": str(tls["ca"])},
            {"ssl_mode": "required"},
            {"ssl_mode": "preferred"},
        ):
            async with await connect(**options) as conn:
                assert conn.tls, options
                assert (await ssl_version(conn)).startswith("TLSv1."), options
        async with await connect(ssl_mode="disabled") as conn:
            assert not conn.tls and await ssl_version(conn) == ""

        with pytest.raises(MySQLError) as info:
            await connect(ssl_mode="verify_ca", ssl_ca=tls["other_ca"])
        assert info.value.code == E.CR_SSL_CONNECTION_ERROR
        assert "certificate" in info.value.message.lower()

        # The dump stream over TLS, read in batches and paused / resumed like the plain one.
        async with await connect(ssl_mode="verify_ca", ssl_ca=tls["ca"], max_buffered=64 * 1024) as conn:
            await prepare_replica_session(conn)
            payloads, _, paused_seen = await slow_dump(conn)
        assert paused_seen
        binlog = master.binlog_files()[0].read_bytes()
        events = events_of(payloads)
        assert_events_match_file(events, binlog)
        assert _EVENT_HEADER.unpack_from(events[-1])[4] == len(binlog)

    run(scenario())


# -- real mariadbd: the binlog dump ------------------------------------------------------------------------------


def test_binlog_dump_streams_rotate_fde_then_events_and_eof(mariadb, run):
    master = mariadb()
    master.create_user("repl", PASSWORD)
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.items (id INT PRIMARY KEY, v VARCHAR(100))")
    for i in range(50):
        master.execute("INSERT INTO t.items VALUES (%s, %s)", (i, f"row {i}"))

    async def scenario() -> list[bytes]:
        async with await UpstreamConnection.connect(master.host, master.port, "repl", PASSWORD) as conn:
            await prepare_replica_session(conn)
            await conn.register_slave(4242, host="relay-test", port=3307)
            hosts = master.execute("SHOW SLAVE HOSTS")
            assert any(row[0] == 4242 and row[1] == "relay-test" and row[2] == 3307 for row in hosts), hosts
            await conn.binlog_dump("master-bin.000001", 4, server_id=4242, flags=P.BINLOG_DUMP_NON_BLOCK)
            with pytest.raises(MySQLError) as info:
                await conn.query("SELECT 1")  # the connection belongs to the dump now
            assert info.value.code == E.CR_COMMANDS_OUT_OF_SYNC
            return await dump_until_eof(conn)

    payloads = run(scenario())
    assert [event_type(p) for p in payloads[:2]] == [ROTATE_EVENT, FORMAT_DESCRIPTION_EVENT]
    events = events_of(payloads)
    rotate = events[0]
    assert rotate[19:27] == struct.pack("<Q", 4) and rotate[27:-4] == b"master-bin.000001"
    assert_events_match_file(events, master.binlog_files()[0].read_bytes())
    assert len(events) > 150  # 50 transactions made it through


def test_binlog_dump_errors_arrive_as_err_payloads(mariadb):
    master = mariadb()

    async def scenario() -> None:
        async with await UpstreamConnection.connect(master.host, master.port, "root", "") as conn:
            await prepare_replica_session(conn)
            await conn.binlog_dump("no-such-file.000001", 4, server_id=5)
            (payload,) = await conn.read_packets()
            assert payload[0] == P.ERR_HEADER
            assert parse_err(payload).code == 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG
        async with await UpstreamConnection.connect(master.host, master.port, "root", "") as conn:
            # MariaDB has no COM_BINLOG_DUMP_GTID: the command is sent as built and refused by the server.
            await conn.binlog_dump_gtid(5, b"\x00" * 8)
            (payload,) = await conn.read_packets()
            assert payload[0] == P.ERR_HEADER and parse_err(payload).code == 1047  # ER_UNKNOWN_COM_ERROR

    asyncio.run(scenario())


def test_event_larger_than_16_mib_arrives_intact(mariadb):
    master = mariadb()  # the sandbox runs with max_allowed_packet=1G
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.blobs (id INT PRIMARY KEY, b LONGBLOB)")
    conn_admin = master.connect()
    with conn_admin.cursor() as cursor:
        cursor.execute("SET SESSION binlog_format = 'ROW'")  # the row image, not a short statement, is logged
        cursor.execute("INSERT INTO t.blobs VALUES (1, REPEAT(x'5a0f', 10 * 1024 * 1024))")  # 20 MiB
    conn_admin.close()

    async def scenario() -> list[bytes]:
        # A small buffer limit: one payload larger than it must still be read whole.
        conn = await UpstreamConnection.connect(master.host, master.port, "root", "", max_buffered=1 << 20)
        async with conn:
            await prepare_replica_session(conn)
            await conn.binlog_dump("master-bin.000001", 4, server_id=9, flags=P.BINLOG_DUMP_NON_BLOCK)
            return await dump_until_eof(conn)

    events = events_of(asyncio.run(scenario()))
    big = [e for e in events if len(e) > P.MAX_CHUNK]
    assert len(big) == 1 and len(big[0]) > 20 * 1024 * 1024
    assert big[0].count(b"\x5a\x0f" * 1024) >= 10 * 1024 - 1
    assert_events_match_file(events, master.binlog_files()[0].read_bytes())


def test_slow_consumer_pauses_reading_and_memory_stays_bounded(mariadb, run):
    master = mariadb()
    write_row_events(master, transactions=8)  # ~8 MiB
    limit = 256 * 1024

    async def scenario() -> tuple[list[bytes], int, bool]:
        async with await UpstreamConnection.connect(master.host, master.port, "root", "", max_buffered=limit) as conn:
            await prepare_replica_session(conn)
            return await slow_dump(conn)

    payloads, largest_batch, paused_seen = run(scenario())
    assert paused_seen
    # At most the limit, plus what one socket read can add on top, plus the packet that crossed it.
    assert largest_batch < limit + 512 * 1024, largest_batch
    binlog = master.binlog_files()[0].read_bytes()
    events = events_of(payloads)
    assert_events_match_file(events, binlog)
    # Everything came, in small batches: every byte of the file after its magic, plus the fake ROTATE.
    assert sum(map(len, events)) == len(binlog) - 4 + len(events[0])
    assert _EVENT_HEADER.unpack_from(events[-1])[4] == len(binlog)


def test_killed_master_raises_connection_lost_and_idle_reads_time_out(mariadb, run):
    master = mariadb()
    master.execute("CREATE DATABASE t")

    async def scenario() -> None:
        conn = await UpstreamConnection.connect(master.host, master.port, "root", "", read_timeout=0.3)
        await prepare_replica_session(conn)
        await conn.binlog_dump("master-bin.000001", 4, server_id=11)  # blocking: waits for more events
        received: list[bytes] = []
        with pytest.raises(TimeoutError):
            while True:
                received += await conn.read_packets()
        assert [event_type(p) for p in received[:2]] == [ROTATE_EVENT, FORMAT_DESCRIPTION_EVENT]

        conn.read_timeout = None
        reader = asyncio.ensure_future(conn.read_packets())
        await asyncio.sleep(0.1)
        assert not reader.done()
        master.kill()
        with pytest.raises(ConnectionLost) as info:
            await asyncio.wait_for(reader, 10)
        assert info.value.code == E.CR_SERVER_LOST
        assert "Lost connection" in info.value.message
        with pytest.raises(ConnectionLost):
            await conn.read_packets()  # and on every later call
        await conn.close()

    run(scenario())


def test_take_and_wait_for_packets_the_relay_stream_loop_way(mariadb, run):
    """take_packets never waits; wait_for_packets wakes on a payload, on another future, on its timeout and on the
    connection's end, and leaves no waiter behind (a cancelled one included)."""
    master = mariadb()
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.x (id INT PRIMARY KEY)")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        conn = await UpstreamConnection.connect(master.host, master.port, "root", "", read_timeout=0.3)
        await prepare_replica_session(conn)
        await conn.binlog_dump("master-bin.000001", 4, server_id=12)
        received: list[bytes] = []
        while True:  # the file's events, then nothing: the wait ends by its timeout
            await conn.wait_for_packets(None, 1.0)
            batch = conn.take_packets()
            if not batch:
                break
            received += batch
        assert [event_type(p) for p in received[:2]] == [ROTATE_EVENT, FORMAT_DESCRIPTION_EVENT]
        assert conn.take_packets() == []  # nothing there: an empty list at once, never a TimeoutError

        other = loop.create_future()
        loop.call_later(0.05, other.set_result, None)
        await conn.wait_for_packets(other, None)  # no timeout: only the other future can end this wait
        assert other.done() and conn.take_packets() == []

        waiting = asyncio.ensure_future(conn.wait_for_packets(None, None))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        master.execute("INSERT INTO t.x VALUES (1)")  # after a cancelled wait a new one may start, and wakes
        got: list[bytes] = []
        while not any(event_type(p) == 16 for p in got):  # up to the XID
            await conn.wait_for_packets(None, 30.0)
            got += conn.take_packets()

        master.kill()
        with pytest.raises(ConnectionLost):
            for _ in range(100):
                await conn.wait_for_packets(None, 10.0)
                conn.take_packets()
        await conn.close()

    run(scenario())


# -- scripted fake servers: MySQL 8 auth paths and broken peers ------------------------------------------------


class FakeMySQL8:
    """Just enough of a MySQL 8 server to run caching_sha2_password's full authentication (RSA or TLS).

    Blocking sockets in a thread, reading exactly one packet at a time as mysqld does: a TLS ClientHello that
    follows the SSLRequest must stay in the socket for the TLS layer, not in some stream buffer.
    """

    def __init__(self, password: str, tls_context: Any = None, *, cached: bool = False) -> None:
        self.password = password.encode()
        self.tls_context = tls_context
        self.cached = cached  # fast path: the server knows the password's hash
        self.rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.seen: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)  # accept() polls, so that __exit__ can stop the thread
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeMySQL8:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.listener.close()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            with sock:
                sock.settimeout(10)
                try:
                    self._handle(sock)
                except (OSError, EOFError) as exc:
                    self.seen.append(f"error {exc!r}")

    @staticmethod
    def _recv_exactly(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError("client went away")
            data += chunk
        return data

    def _read_packet(self, sock: socket.socket) -> tuple[int, bytes]:
        header = self._recv_exactly(sock, 4)
        return header[3], self._recv_exactly(sock, int.from_bytes(header[:3], "little"))

    def _handle(self, sock: socket.socket) -> None:
        scramble = bytes((65 + b % 26) for b in os.urandom(20))
        caps = 0xDFFFFFFF if self.tls_context else 0xDFFFF7FF
        greeting = (
            b"\x0a8.0.36\x00" + struct.pack("<I", 7) + scramble[:8] + b"\x00"
            + struct.pack("<HBHHB", caps & 0xFFFF, 255, 2, caps >> 16, 21) + b"\x00" * 10
            + scramble[8:] + b"\x00caching_sha2_password\x00"
        )
        sock.sendall(P.encode_packet(greeting, 0))
        seq, response = self._read_packet(sock)
        if len(response) == 32:
            self.seen.append("ssl-request")
            sock = self.tls_context.wrap_socket(sock, server_side=True)
            seq, response = self._read_packet(sock)
        user_end = response.index(b"\0", 32)
        self.seen.append("user=" + response[32:user_end].decode())
        auth, _ = read_lenenc_bytes(response, user_end + 1)
        if self.cached:
            cached = hashlib.sha256(hashlib.sha256(self.password).digest()).digest()
            key = hashlib.sha256(cached + scramble).digest()
            if hashlib.sha256(bytes(a ^ b for a, b in zip(auth, key, strict=True))).digest() == cached:
                self.seen.append("fast")
                # fast_auth_success and the OK in one write, as they may well arrive
                ok = b"\x00\x00\x00\x02\x00\x00\x00"
                sock.sendall(P.encode_packet(b"\x01\x03", seq + 1) + P.encode_packet(ok, seq + 2))
                seq, command = self._read_packet(sock)
                self.seen.append(f"command 0x{command[0]:02x}")
                return
        assert len(auth) == 32  # the SHA-256 scramble; a cold cache asks for the password:
        sock.sendall(P.encode_packet(b"\x01\x04", seq + 1))
        seq, reply = self._read_packet(sock)
        if self.tls_context:
            password = reply
            self.seen.append("cleartext")
        else:
            if reply != b"\x02":
                self.seen.append(f"no key request: {reply[:1]!r}")
                return
            pem = self.rsa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            sock.sendall(P.encode_packet(b"\x01" + pem, seq + 1))
            seq, cipher = self._read_packet(sock)
            plain = self.rsa_key.decrypt(
                cipher, padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
            )
            password = bytes(b ^ scramble[i % 20] for i, b in enumerate(plain))
            self.seen.append("rsa")
        if password == self.password + b"\0":
            sock.sendall(P.encode_packet(b"\x00\x00\x00\x02\x00\x00\x00", seq + 1))
        else:
            sock.sendall(P.encode_packet(b"\xff\x15\x04#28000Access denied for user", seq + 1))
            return
        seq, command = self._read_packet(sock)
        self.seen.append(f"command 0x{command[0]:02x}")


def test_caching_sha2_full_auth_with_rsa_key_request(run):
    async def scenario(port: int) -> None:
        conn = await UpstreamConnection.connect("127.0.0.1", port, "repl", PASSWORD, connect_timeout=10)
        assert not conn.is_mariadb and conn.server_version == "8.0.36" and not conn.tls
        await conn.close()
        with pytest.raises(MySQLError) as info:
            await UpstreamConnection.connect("127.0.0.1", port, "repl", "wrong")
        assert info.value.code == 1045
        with pytest.raises(MySQLError) as info:
            await UpstreamConnection.connect("127.0.0.1", port, "repl", PASSWORD, get_server_public_key=False)
        assert info.value.code == E.CR_AUTH_PLUGIN_ERR

    with FakeMySQL8(PASSWORD) as fake:
        run(scenario(fake.port))
    assert fake.seen[:4] == ["user=repl", "rsa", "command 0x01", "user=repl"]  # COM_QUIT after the first


def test_caching_sha2_fast_path(run):
    async def scenario(port: int) -> None:
        conn = await UpstreamConnection.connect("127.0.0.1", port, "repl", PASSWORD, ssl_mode="disabled")
        await conn.close()

    with FakeMySQL8(PASSWORD, cached=True) as fake:
        run(scenario(fake.port))
    assert fake.seen == ["user=repl", "fast", "command 0x01"]


def test_caching_sha2_full_auth_over_tls(run, tmp_path):
    tls = write_tls_files(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tls["cert"], tls["key"])

    async def scenario(port: int) -> None:
        conn = await UpstreamConnection.connect(
            "127.0.0.1", port, "repl", PASSWORD, ssl_mode="verify_identity", ssl_ca=tls["ca"]
        )
        assert conn.tls
        await conn.close()

    with FakeMySQL8(PASSWORD, tls_context=server_context) as fake:
        run(scenario(fake.port))
    assert fake.seen == ["ssl-request", "user=repl", "cleartext", "command 0x01"]


def test_broken_peers_fail_cleanly():
    async def scenario() -> None:
        async def half_greeting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"\x50\x00\x00\x00\x0a5.7.44")  # announces 80 bytes, sends 7, hangs up
            await writer.drain()
            writer.close()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()

        for handler, expected in ((half_greeting, ConnectionLost), (silent, TimeoutError)):
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            async with server:
                with pytest.raises(expected) as info:
                    await UpstreamConnection.connect("127.0.0.1", port, "u", "p", connect_timeout=0.5)
            if expected is ConnectionLost:
                assert "middle of a packet (11 bytes of it received)" in info.value.message
            else:
                assert "took longer than 0.5s" in str(info.value)

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]
        with pytest.raises(MySQLError) as info:
            await UpstreamConnection.connect("127.0.0.1", closed_port, "u", "p")
        assert info.value.code == E.CR_CONN_HOST_ERROR

        with pytest.raises(ValueError, match="ssl_mode"):
            await UpstreamConnection.connect("127.0.0.1", closed_port, "u", "p", ssl_mode="on")

    asyncio.run(scenario())
