"""Bad clients against the relay's MySQL server: wrong passwords, garbage and truncated handshakes, absurd packet
lengths, commands before authentication, random command packets after a valid login, and a hypothesis run of
10,000 random inputs. Each bad connection must end with an ERR or a clean close, within a deadline, while a
well-behaved client keeps querying and dumping; at the end no connection is left behind.

The server runs in-process (uvloop, on its own thread) with the real SQL layer and the real dump sender, over a
relay store made from a copy of real MariaDB 11.8 binlogs from the corpus. No mariadbd is needed.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import selectors
import shutil
import socket
import struct
import threading
import time
import types
from pathlib import Path

import pymysql
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysql import _auth as pymysql_auth

from relayproxy.binlog import constants as C
from relayproxy.commands import config
from relayproxy.commands.run import SessionRelayView
from relayproxy.downstream.context import DownstreamContext
from relayproxy.downstream.server import DownstreamServer
from relayproxy.downstream.users import DownstreamUser
from relayproxy.ops.status import StatusSources, UpstreamSources, relay_status
from relayproxy.relay.store import RelayStore
from relayproxy.upstream.receiver import ReceiverCounters, SemiSyncTally
from relayproxy.upstream.session import UpstreamStatus
from relayproxy.wire import packets as P
from relayproxy.wire.handshake import (
    build_handshake_response,
    client_capabilities,
    parse_handshake,
)
from relayproxy.wire.packets import (
    PacketDecoder,
    TextResultReader,
    encode_packet,
    parse_err,
)

MARIA_DIR = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_1"
MARIA_FILES = ("mariadb-repl-bin.000001", "mariadb-repl-bin.000002")  # 11.8.5, domain 1: '' -> 1-10-12
USER, PASSWORD = "repl", "replpw"
DEADLINE = 5.0  # seconds a bad connection may take to be answered and closed once its input is sent
INTERNAL_ERROR = "internal error in relayproxy"


# -- the server, in-process ---------------------------------------------------------------------------------------


class InProcessRelay:
    """A DownstreamServer (real SQL layer, real dump sender) over a relay store, served from a uvloop thread."""

    def __init__(self, relay_dir: Path, **server_options) -> None:
        environ = {
            "RELAYPROXY_SERVER_ID": "100",
            "RELAYPROXY_USER": USER,
            "RELAYPROXY_RELAY_DIR": str(relay_dir),
            "RELAYPROXY_LISTEN": "127.0.0.1:0",
            "RELAYPROXY_MASTER": "10.0.0.1:3306",
            "RELAYPROXY_GTID_MODE": "mariadb",
        }
        self.cfg = config.load(None, environ=environ)
        self.store = RelayStore.open(relay_dir)
        status = UpstreamStatus(io_running=True, state="streaming", master_server_id=10)
        receiver = types.SimpleNamespace(master_position=None, master_timestamp=0, counters=ReceiverCounters(),
                                         semi_sync=SemiSyncTally())
        upstream = UpstreamSources(status=status, receiver=receiver)
        self.ctx = DownstreamContext(SessionRelayView(self.cfg, lambda: self.store, lambda: upstream,
                                                      server_uuid="5b0e9c4e-7a31-4c55-9d1e-2a6f3b8c9d10"),
                                     status_document=lambda: relay_status(self.cfg, StatusSources(self.store, upstream)))
        self.users = [DownstreamUser(USER, PASSWORD, plugin="mysql_native_password")]
        self.options = server_options
        self.loop = uvloop.new_event_loop()
        self.server: DownstreamServer | None = None
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, name="in-process-relay", daemon=True)

    def __enter__(self) -> InProcessRelay:
        self._thread.start()

        async def start() -> int:
            self.server = DownstreamServer(self.ctx, self.users, **self.options)
            return (await self.server.start("127.0.0.1", 0))[1]

        try:
            self.port = self.call(start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.server is not None:
                self.call(self.server.close(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
            self.store.close()

    def call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def snapshot(self) -> tuple[dict, int, int]:
        """(ctx.connections, server sessions, other tasks on the loop), read on the loop's thread."""

        async def read():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            return dict(self.ctx.connections), self.server.connection_count, len(tasks)

        return self.call(read())

    def wait_no_connections(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        snap = self.snapshot()
        while time.monotonic() < deadline:
            snap = self.snapshot()
            if snap == ({}, 0, 0):
                return
            time.sleep(0.05)
        raise AssertionError(f"connections left behind (ctx.connections, sessions, tasks): {snap}")


@pytest.fixture
def relay_dir(tmp_path, corpus_dir) -> Path:
    d = tmp_path / "relay"
    d.mkdir()
    for name in MARIA_FILES:
        shutil.copyfile(corpus_dir / MARIA_DIR / name, d / name)
        os.chmod(d / name, 0o644)
    (d / "relayproxy.index").write_text("".join(f"{n}\n" for n in MARIA_FILES))
    return d


# -- a blocking raw client ----------------------------------------------------------------------------------------


class ServerClosed(EOFError):
    pass


class Client:
    """Packets by hand over a blocking socket."""

    def __init__(self, port: int, timeout: float = DEADLINE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = PacketDecoder(keep_sequences=True)
        self.decoder.expect_sequence(None)
        self.pending: list[tuple[int, bytes]] = []
        self.greeting = None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, payload: bytes, seq: int) -> None:
        self.sock.sendall(encode_packet(payload, seq))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def packet(self) -> tuple[int, bytes]:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ServerClosed("server closed the connection")
            self.decoder.feed(data)
            self.pending += self.decoder.packets()
        return self.pending.pop(0)

    def payload(self) -> bytes:
        return self.packet()[1]

    def greet(self):
        self.greeting = parse_handshake(self.payload())
        return self.greeting

    def login_payload(self, user: str = USER, password: str = PASSWORD) -> bytes:
        greeting = self.greeting or self.greet()
        caps = client_capabilities(greeting, tls=False)
        scramble = pymysql_auth.scramble_native_password(password.encode(), greeting.auth_plugin_data[:20])
        return build_handshake_response(caps, user, scramble, plugin_name="mysql_native_password",
                                        connect_attrs={"program_name": "fuzz"})

    def login(self, user: str = USER, password: str = PASSWORD) -> None:
        self.send(self.login_payload(user, password), 1)
        reply = self.payload()
        if reply[0] != 0x00:
            raise parse_err(reply)

    def query(self, sql: str):
        self.send(b"\x03" + sql.encode(), 0)
        reader = TextResultReader()
        while True:
            payload = self.payload()
            if payload[0] == 0xFF:
                raise parse_err(payload)
            result = reader.feed(payload)
            if result is not None:
                return result

    def until_closed(self, deadline: float = DEADLINE) -> tuple[list[tuple[int, bytes]], int]:
        """Every packet until the server closes the connection by itself: (packets, bytes of a cut packet).
        AssertionError when it is still open after `deadline` seconds."""
        return self._read_to_end(deadline, half_close=False)

    def rest(self, deadline: float = DEADLINE) -> tuple[list[tuple[int, bytes]], int]:
        """Half-close our side, then every packet until the server closes (see until_closed)."""
        return self._read_to_end(deadline, half_close=True)

    def _read_to_end(self, deadline: float, half_close: bool) -> tuple[list[tuple[int, bytes]], int]:
        with_deadline = time.monotonic() + deadline
        if half_close:
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # already reset by the server
        packets = list(self.pending)
        self.pending = []
        while True:
            left = with_deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the server did not close the connection within {deadline}s; got {packets[:5]}")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                break
            except TimeoutError:
                continue
            if not data:
                break
            self.decoder.feed(data)
            packets += self.decoder.packets()
        return packets, self.decoder.pending_bytes


def binlog_dump(file: str, position: int, server_id: int, flags: int = P.BINLOG_DUMP_NON_BLOCK) -> bytes:
    return struct.pack("<BIHI", P.COM_BINLOG_DUMP, position, flags, server_id) + file.encode()


def register_slave(server_id: int, host: bytes = b"h", user: bytes = b"u", password: bytes = b"", port: int = 3306):
    return (struct.pack("<BI", P.COM_REGISTER_SLAVE, server_id) + bytes((len(host),)) + host + bytes((len(user),))
            + user + bytes((len(password),)) + password + struct.pack("<HII", port, 0, 0))


def expected_events(relay_dir: Path) -> list[bytes]:
    """The relay files' events, in order, with the FDE's in-use flag cleared (as a dump sends them)."""
    events = []
    for name in MARIA_FILES:
        data = (relay_dir / name).read_bytes()
        pos = 4
        while pos < len(data):
            size = struct.unpack_from("<I", data, pos + 9)[0]
            event = bytearray(data[pos : pos + size])
            if event[4] == C.FORMAT_DESCRIPTION_EVENT:
                event[17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
            events.append(bytes(event))
            pos += size
    return events


def dump_events(client: Client, file: str = MARIA_FILES[0], position: int = 4, server_id: int = 4000) -> list[bytes]:
    """A NON_BLOCK dump to its EOF: the non-artificial events received."""
    client.query("SET @master_binlog_checksum = @@global.binlog_checksum")
    client.query("SET @mariadb_slave_capability = 4")  # MARIA_SLAVE_CAPABILITY_MINE: events as they are
    client.send(binlog_dump(file, position, server_id), 0)
    events = []
    while True:
        payload = client.payload()
        if payload[0] == 0xFE and len(payload) < 9:
            return events
        if payload[0] == 0xFF:
            raise parse_err(payload)
        assert payload[0] == 0x00, payload[:20]
        event = payload[1:]
        if not struct.unpack_from("<H", event, 17)[0] & C.LOG_EVENT_ARTIFICIAL_F:
            events.append(event)


class GoodClient:
    """Logs in, queries and dumps in a loop on a thread, for as long as the bad clients run; must never fail."""

    def __init__(self, port: int, relay_dir: Path) -> None:
        self.port = port
        self.want = expected_events(relay_dir)
        self.rounds = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)

    def __enter__(self) -> GoodClient:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def check(self) -> None:
        assert not self._thread.is_alive(), "good client did not stop"
        assert self.error is None, f"the well-behaved client failed after {self.rounds} rounds: {self.error!r}"
        assert self.rounds > 0

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with Client(self.port) as client:
                    client.login()
                    for _ in range(20):
                        assert client.query("SELECT @@server_id").rows == [("100",)]
                        binlogs = client.query("SHOW BINARY LOGS").rows
                        assert [row[0] for row in binlogs] == list(MARIA_FILES)
                        assert client.query("SHOW MASTER STATUS").rows[0][:2] == (MARIA_FILES[1], "2595")
                    assert dump_events(client) == self.want
                    assert client.until_closed() == ([], 0)  # a NON_BLOCK dump ends the connection
                self.rounds += 1
        except BaseException as exc:
            self.error = exc


# -- bad clients, one by one --------------------------------------------------------------------------------------


def assert_error_then_close(client: Client, codes: tuple[int, ...], deadline: float = DEADLINE) -> P.MySQLError:
    """The server answers with exactly one ERR (one of `codes`) and closes by itself; nothing else comes."""
    packets, cut = client.until_closed(deadline)
    assert cut == 0 and len(packets) == 1, packets
    err = parse_err(packets[0][1])
    assert err.code in codes, err
    return err


def assert_refused(client: Client, codes: tuple[int, ...]) -> None:
    """Garbage after the greeting: an ERR (one of `codes`) and a close; or, when it reads as a login of an unknown
    account, the AuthSwitchRequest to the relay's default plugin (as for a real account of that name), then
    (nothing answering it) the handshake timeout's 1043."""
    packets, cut = client.until_closed()
    assert cut == 0 and packets, packets
    if packets[0][1][:1] == b"\xfe":
        assert packets[0][1].startswith((b"\xfemysql_native_password\0", b"\xfecaching_sha2_password\0")), packets
        packets = packets[1:]
        codes = (1043,)
    assert len(packets) == 1 and parse_err(packets[0][1]).code in codes, packets


@pytest.mark.slow
def test_bad_clients_end_with_an_error_and_others_keep_working(relay_dir):
    with InProcessRelay(relay_dir, handshake_timeout=1.0, idle_timeout=2.0) as relay:
        with GoodClient(relay.port, relay_dir) as good:
            bad_clients(relay.port)
        good.check()
        relay.wait_no_connections()


def bad_clients(port: int) -> None:
    started = time.monotonic()
    rng = random.Random(1045)

    # Wrong password: 1045, then nothing (no further data, the connection closed).
    with Client(port) as c:
        c.greet()
        c.send(c.login_payload(password="wrong"), 1)
        seq, payload = c.packet()
        err = parse_err(payload)
        assert (seq, err.code, err.sqlstate) == (2, 1045, "28000"), err
        assert "Access denied for user 'repl'" in err.message
        assert c.until_closed() == ([], 0)
    # Unknown user: 1045 too, after the full authentication exchange MySQL fakes for unknown accounts.
    with pytest.raises(pymysql.err.OperationalError) as info:
        pymysql.connect(host="127.0.0.1", port=port, user="nobody", password="x", connect_timeout=DEADLINE)
    assert info.value.args[0] == 1045, info.value

    # Garbage instead of a handshake response: an HTTP request reads as a 5 MB packet.
    with Client(port) as c:
        c.greet()
        c.send_raw(b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n")
        assert_error_then_close(c, (1153,))
    # Garbage that fits a packet.
    for garbage in (b"\x01" * 40, b"\x00" * 32 + b"\xff" * 64, *(rng.randbytes(rng.randrange(300)) for _ in range(20))):
        with Client(port) as c:
            c.greet()
            c.send(garbage, 1)
            # 1043 bad handshake, 1045 access denied, 1251 an account plugin the client cannot switch to
            assert_refused(c, (1043, 1045, 1251))
    # Commands before authentication: COM_QUERY, COM_BINLOG_DUMP, COM_REGISTER_SLAVE, COM_QUIT as the response.
    for command in (b"\x03SELECT 1", binlog_dump(MARIA_FILES[0], 4, 9), register_slave(9), b"\x01"):
        for seq in (0, 1):
            with Client(port) as c:
                c.greet()
                c.send(command, seq)
                assert_error_then_close(c, (1043, 1156))
    # Nothing at all: a command before the greeting is read (the server speaks first).
    with Client(port) as c:
        c.send(b"\x03SELECT 1", 0)
        c.greet()
        assert_error_then_close(c, (1043, 1156))

    # A truncated handshake response, then silence: the handshake timeout (1043) ends it.
    with Client(port) as c:
        c.greet()
        c.send_raw(encode_packet(c.login_payload(), 1)[:30])
        t0 = time.monotonic()
        err = parse_err(c.payload())
        assert err.code == 1043 and 0.5 < time.monotonic() - t0 < 3, err
        assert c.until_closed() == ([], 0)
    # A truncated handshake response, then the client leaves: a clean close.
    with Client(port) as c:
        c.greet()
        c.send_raw(encode_packet(c.login_payload(), 1)[:30])
        packets, _ = c.rest()
        assert packets == []
    # A 16 MB length header before authentication, then silence: refused at once (1153).
    with Client(port) as c:
        c.greet()
        c.send_raw(b"\xff\xff\xff\x01")
        err = parse_err(c.payload())
        assert err.code == 1153, err
        assert c.until_closed() == ([], 0)

    # After a valid login: a 16 MB length header is over max_allowed_packet (max_statement_bytes): 1153 at once.
    with Client(port) as c:
        c.greet()
        c.login()
        c.send_raw(b"\xff\xff\xff\x00" + b"\x03SELECT")
        err = parse_err(c.payload())
        assert err.code == 1153 and "max_allowed_packet" in err.message, err
        assert c.until_closed() == ([], 0)
    # After a valid login: a 1000-byte length header (under the limit), then silence: the idle timeout ends it.
    with Client(port) as c:
        c.greet()
        c.login()
        c.send_raw(b"\xe8\x03\x00\x00" + b"\x03SELECT")
        t0 = time.monotonic()
        err = parse_err(c.payload())
        assert err.code == 4031 and time.monotonic() - t0 < 5, err
        assert c.until_closed() == ([], 0)
    # A length of 0xFFFFFF followed by garbage, packet after packet, past max_allowed_packet (max_statement_bytes, 1 MiB): 1153.
    with Client(port, timeout=30) as c:
        c.greet()
        c.login()
        chunk = rng.randbytes(P.MAX_CHUNK)
        try:
            for seq in range(6):
                c.send_raw(struct.pack("<I", P.MAX_CHUNK | seq << 24) + chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading and closed: also fine, as long as it said why first
        err = assert_error_then_close(c, (1153,), deadline=30)
        assert "max_allowed_packet" in err.message
    # A length of 0xFFFFFF followed by a little garbage, then the client leaves: 1153 for the header first.
    with Client(port) as c:
        c.greet()
        c.login()
        c.send_raw(b"\xff\xff\xff\x00" + rng.randbytes(1000))
        packets, _ = c.rest()  # over max_allowed_packet: refused (1153) as soon as the header arrives
        assert [parse_err(payload).code for _, payload in packets] == [1153]
    # Out-of-order sequence id after login.
    with Client(port) as c:
        c.greet()
        c.login()
        c.send(b"\x0e", 5)
        assert_error_then_close(c, (1156,))
    # Unknown and unsupported commands: 1047 each, and the connection stays usable.
    with Client(port) as c:
        c.greet()
        c.login()
        for command in (b"\x11user\0", b"\x16SELECT 1", b"\x17\x01\x00\x00\x00", b"\x00", b"\x1f", b"\x08",
                        b"\x0c\x01\x00\x00\x00", b"\xfe", b"\xff" * 10, b"\x20" + rng.randbytes(50)):
            c.send(command, 0)
            err = parse_err(c.payload())
            assert err.code == 1047, (command, err)
        assert c.query("SELECT @@server_id").rows == [("100",)]
        c.send(b"\x01", 0)  # COM_QUIT
        assert c.until_closed() == ([], 0)
    # Broken replication commands: a clear 1835 / 1236 and the connection ends.
    for command, codes in (
        (b"\x12\x04\x00", (1835,)),
        (binlog_dump("nope.000001", 4, 9), (1236,)),
        (binlog_dump(f"../relay/{MARIA_FILES[0]}", 4, 9), (1236,)),
        (binlog_dump("/etc/passwd", 4, 9), (1236,)),
        (binlog_dump("relayproxy.index", 4, 9), (1236,)),
        (binlog_dump(MARIA_FILES[1], 5, 9), (1236,)),
        (binlog_dump(MARIA_FILES[1], 1 << 31, 9), (1236,)),
        (register_slave(9)[:8], (1835,)),
        (b"\x1e" + b"\x00" * 5, (1835,)),
    ):
        with Client(port) as c:
            c.greet()
            c.login()
            c.send(command, 0)
            packets, cut = c.until_closed()
            # A dump may send its artificial ROTATE (and FDE) before it finds the position bad, as MariaDB does.
            assert cut == 0 and packets and all(p[:1] == b"\x00" for _, p in packets[:-1]), (command, packets)
            assert parse_err(packets[-1][1]).code in codes, (command, packets)
    # Clients that leave at once: some reset the connection (RST), some close it (FIN), some after the greeting.
    for i in range(30):
        c = Client(port)
        if i % 3 == 0:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif i % 3 == 1:
            c.greet()
        c.close()
    assert time.monotonic() - started < 60


def test_bad_clients_leave_nothing_behind(relay_dir):
    """The same server after a burst of bad clients: connections, sessions and tasks back to none."""
    rng = random.Random(50)
    with InProcessRelay(relay_dir, handshake_timeout=1.0) as relay:
        for i in range(50):
            with Client(relay.port) as c:
                c.greet()
                if i % 2:
                    c.login()
                    c.send(rng.randbytes(i), 0)
                else:
                    c.send_raw(rng.randbytes(i))
                c.rest()
        with Client(relay.port) as c:
            c.greet()
            c.login()
            assert c.query("SELECT 1").rows == [("1",)]
        relay.wait_no_connections()


# -- random inputs (hypothesis) ------------------------------------------------------------------------------------

# Statements replicas and tools send, so that random command sequences reach the SQL layer's and the dump sender's
# real paths. No PURGE or KILL: the good client must stay unharmed by design, not by luck.
STATEMENTS = [
    "SELECT @@server_id", "SHOW BINARY LOGS", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS", "SHOW PROCESSLIST",
    "SELECT @@gtid_binlog_pos", "SELECT @@gtid_current_pos", "SHOW VARIABLES LIKE 'server_id'",
    "SET @master_binlog_checksum = @@global.binlog_checksum", "SET @master_binlog_checksum = 'NONE'",
    "SET @master_heartbeat_period = 100000000", "SET @master_heartbeat_period = 1", "SET @slave_connect_state = ''",
    "SET @slave_connect_state = '1-10-5'", "SET @slave_connect_state = '1-10-99'", "SET @slave_connect_state = 'x'",
    "SET @slave_gtid_strict_mode = 1", "SET @slave_gtid_ignore_duplicates = 1", "SET @mariadb_slave_capability = 4",
    "SET @rpl_semi_sync_slave = 1", "SELECT BINLOG_GTID_POS('mariadb-repl-bin.000002', 4)",
    "SELECT BINLOG_GTID_POS('mariadb-repl-bin.000002', 2595)", "SHOW SLAVE STATUS", "SHOW ALL SLAVES STATUS",
    "SHOW GLOBAL VARIABLES LIKE 'gtid%'", "SELECT UNIX_TIMESTAMP()", "SELECT VERSION()", "SHOW BINLOG EVENTS",
    "SHOW BINLOG EVENTS IN 'mariadb-repl-bin.000002' FROM 4 LIMIT 3", "SET NAMES utf8mb4", "SELECT @@version_comment",
    "SHOW WARNINGS", "SELECT 1", "SHOW STATUS", "USE mysql", "SELECT * FROM information_schema.processlist",
]


def _framed(payloads: list[bytes], first_seq: int) -> bytes:
    return b"".join(encode_packet(p, (first_seq + i) & 0xFF) for i, p in enumerate(payloads))


_any_bytes = st.binary(max_size=300)
_command_byte = st.one_of(st.integers(0, 0x21), st.integers(0, 255))
_random_command = st.builds(lambda c, rest: bytes((c,)) + rest, _command_byte, st.binary(max_size=80))
_query = st.one_of(
    st.sampled_from(STATEMENTS),
    st.text(max_size=80),
    st.builds(lambda s, cut: s[:cut], st.sampled_from(STATEMENTS), st.integers(0, 40)),
    st.builds(lambda s, extra: s + extra, st.sampled_from(STATEMENTS), st.text(max_size=20)),
).map(lambda text: b"\x03" + text.encode("utf-8", "surrogatepass"))
_dump = st.builds(
    binlog_dump,
    st.one_of(st.sampled_from([*MARIA_FILES, "", "x", "mariadb-repl-bin.000003", "../../etc/passwd"]),
              st.text(max_size=20)),
    st.one_of(st.sampled_from([0, 3, 4, 5, 256, 358, 2595, 2596]), st.integers(0, 2**32 - 1)),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 1, 2, 3, 4, 0xFFFF]),
)
_dump_gtid = st.builds(
    lambda flags, sid, name, pos, tail: struct.pack("<BHII", 0x1E, flags, sid, len(name)) + name
    + struct.pack("<Q", pos) + tail,
    st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1), st.binary(max_size=20), st.integers(0, 2**64 - 1),
    st.binary(max_size=40),
)
_register = st.builds(
    lambda sid, host, user, pw, port, cut: register_slave(sid, host, user, pw, port)[:cut],
    st.integers(0, 2**32 - 1), st.binary(max_size=30), st.binary(max_size=10), st.binary(max_size=10),
    st.integers(0, 0xFFFF), st.integers(0, 80),
)
_command = st.one_of(_query, _query, _dump, _dump_gtid, _register, _random_command, st.just(b"\x0e"), st.just(b""))

# What a client sends after the greeting, before or instead of a login.
_pre_auth = st.one_of(
    st.tuples(st.just("raw"), _any_bytes),
    st.tuples(st.just("framed"), st.builds(encode_packet, _any_bytes, st.sampled_from([0, 1, 2, 255]))),
    # A real handshake response, mutated: (index, byte) replacements and a cut (applied once the scramble is known).
    st.tuples(st.just("mutated"), st.tuples(
        st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=4), st.integers(0, 250),
        st.booleans())),
    st.tuples(st.just("huge"), st.builds(lambda n, s, rest: struct.pack("<I", n | s << 24) + rest,
                                         st.integers(0x20000, 0xFFFFFF), st.integers(0, 255), st.binary(max_size=50))),
)
# What a logged-in client sends: a few commands (in order, each starting a new exchange), or raw bytes.
_post_auth = st.one_of(
    st.tuples(st.just("commands"), st.lists(_command, min_size=1, max_size=4)),
    st.tuples(st.just("raw"), _any_bytes),
    st.tuples(st.just("huge"), st.builds(lambda n, rest: struct.pack("<I", n) + rest,
                                         st.integers(0x10000, 0xFFFFFF), st.binary(max_size=50))),
)
_case = st.one_of(st.tuples(st.just("pre"), _pre_auth), st.tuples(st.just("post"), _post_auth))

# Inputs per hypothesis example, run side by side on as many connections (loopback round trips overlap).
BATCH = 10
FUZZ_INPUTS = int(os.environ.get("RELAYPROXY_FUZZ_INPUTS", "10000"))
QUIET = 0.03  # a connection silent this long after its input has had its answers: we half-close it
OBSERVE = 0.5  # longest we listen before half-closing (a dump may stream heartbeats for ever)


def client_input(c: Client, case) -> bytes:
    """Greet (and log in, for a post-authentication case); return the bytes of the case to send."""
    phase, (kind, data) = case
    c.greet()
    if phase == "pre":
        if kind == "mutated":
            replacements, cut, then_command = data
            payload = bytearray(c.login_payload())
            for index, value in replacements:
                if index < len(payload):
                    payload[index] = value
            data = encode_packet(bytes(payload[:cut]), 1)
            if then_command:  # a command in the same segment, as if the login had succeeded
                data += encode_packet(b"\x03SHOW BINARY LOGS", 0)
        return data
    c.login()
    return b"".join(encode_packet(command, 0) for command in data) if kind == "commands" else data


def run_batch(port: int, cases) -> list[tuple[list[tuple[int, bytes]], int]]:
    """Each case on its own connection, all at once: send its input, listen until the server closes or goes quiet
    (QUIET, at most OBSERVE seconds), half-close, and require the server to close within DEADLINE seconds.
    Returns (packets after the input, bytes of a cut packet) per case."""
    clients = [Client(port) for _ in cases]
    try:
        inputs = [client_input(c, case) for c, case in zip(clients, cases)]
        selector = selectors.DefaultSelector()
        now = time.monotonic()
        state = {}  # client -> [last activity, half-closed at or None, packets]
        for c, data in zip(clients, inputs):
            try:
                c.sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server refused early and closed; what it said is still to be read
            c.sock.setblocking(False)
            selector.register(c.sock, selectors.EVENT_READ, c)
            state[c] = [now, None, list(c.pending)]
            c.pending = []
        began = now
        results = {}
        while state:
            now = time.monotonic()
            for c, (last, half, _) in list(state.items()):
                if half is None and (now - last > QUIET or now - began > OBSERVE):
                    try:
                        c.sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    state[c][1] = now
                elif half is not None and now - half > DEADLINE:
                    raise AssertionError(
                        f"the server did not close within {DEADLINE}s of the client's half-close; input "
                        f"{cases[clients.index(c)]!r}, received {state[c][2][:5]}"
                    )
            for key, _ in selector.select(timeout=0.005):
                c = key.data
                try:
                    data = c.sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    data = b""
                if not data:
                    selector.unregister(c.sock)
                    results[c] = (state.pop(c)[2], c.decoder.pending_bytes)
                    continue
                c.decoder.feed(data)
                state[c][2] += c.decoder.packets()
                state[c][0] = time.monotonic()
        selector.close()
        return [results[c] for c in clients]
    finally:
        for c in clients:
            c.close()


@pytest.mark.slow
def test_random_inputs_never_hang_or_hurt_other_clients(relay_dir):
    """At least 10,000 random inputs (RELAYPROXY_FUZZ_INPUTS), each on a fresh connection, BATCH at a time: the
    server closes within DEADLINE seconds of the client's half-close, in whole packets, never with an internal
    error; meanwhile a well-behaved client queries and dumps without a single failure; at the end a fresh client
    works and no connection, session or task is left behind."""
    counts = {"inputs": 0, "errors": 0, "answered": 0}
    codes: collections.Counter[int] = collections.Counter()
    with InProcessRelay(relay_dir, handshake_timeout=2.0) as relay:
        port = relay.port

        @settings(max_examples=-(-FUZZ_INPUTS // BATCH), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(cases=st.lists(_case, min_size=BATCH, max_size=BATCH))
        def batch(cases):
            for case, (packets, cut) in zip(cases, run_batch(port, cases)):
                assert cut == 0, f"the server closed in the middle of a packet ({cut} bytes of it sent): {case!r}"
                for _, payload in packets:
                    if payload[:1] == b"\xff":
                        err = parse_err(payload)
                        assert INTERNAL_ERROR not in err.message, (case, err)
                        counts["errors"] += 1
                        codes[err.code] += 1
                counts["answered"] += bool(packets)
                counts["inputs"] += 1

        with GoodClient(port, relay_dir) as good:
            started = time.monotonic()
            batch()
            elapsed = time.monotonic() - started
        good.check()
        with Client(port) as c:
            c.greet()
            c.login()
            assert c.query("SHOW MASTER STATUS").rows[0][:2] == (MARIA_FILES[1], "2595")
            assert dump_events(c) == good.want
        relay.wait_no_connections()
    print(f"\n{counts['inputs']} random inputs in {elapsed:.1f}s ({counts['inputs'] / elapsed:.0f}/s), "
          f"{counts['answered']} answered, {counts['errors']} ERR packets {dict(codes.most_common())}; "
          f"the good client ran {good.rounds} rounds")
    assert counts["inputs"] >= FUZZ_INPUTS


def test_an_unknown_account_looks_like_a_wrong_password(relay_dir):
    with InProcessRelay(relay_dir) as relay:
        replies = []
        for user, password in ((USER, "wrong"), ("nobody", "wrong")):
            with Client(relay.port) as c:
                c.greet()
                c.send(c.login_payload(user=user, password=password), 1)
                seq, payload = c.packet()
                replies.append((seq, payload[:1], payload.replace(user.encode(), b"<user>")))
        assert replies[0] == replies[1], replies


def test_commands_sent_before_a_half_close_are_answered(relay_dir):
    with InProcessRelay(relay_dir) as relay:
        # A dump request's answer (it looks at the files on a worker thread, so the FIN always arrives first).
        with Client(relay.port) as c:
            c.greet()
            c.login()
            c.send(binlog_dump("nope.000001", 4, 9), 0)
            packets, cut = c.rest()
        assert len(packets) == 1 and parse_err(packets[0][1]).code == 1236, packets
        # A query's answer (lost or not depending on whether the FIN is read before the session runs).
        for _ in range(20):
            with Client(relay.port) as c:
                c.greet()
                c.login()
                c.send(b"\x03SELECT 1", 0)
                packets, cut = c.rest()
            assert cut == 0 and [p for _, p in packets][-2:] == [b"\x011", b"\xfe\x00\x00\x02\x00"], packets
        relay.wait_no_connections()
