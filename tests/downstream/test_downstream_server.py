"""The relay's MySQL server (downstream/server.py, wire/server_auth.py, wire/results.py, downstream/users.py) with stub
SQL and dump callables: real clients (PyMySQL, the mariadb command-line client, mariadb-binlog,
python-mysql-replication, the relay's own UpstreamConnection) log in with every auth path, run queries and binlog
dumps; raw clients send broken and unusual packets; the sans-I/O parts are tested without sockets."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import ipaddress
import re
import ssl
import struct
import time
import types
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pymysql
import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pymysql import _auth as pymysql_auth

from relayproxy.binlog.encoders import artificial_rotate
from relayproxy.commands.run import SessionRelayView
from relayproxy.downstream.context import (
    ConnectionState,
    DownstreamContext,
    DumpRequest,
)
from relayproxy.downstream.server import DownstreamServer
from relayproxy.downstream.session import parse_binlog_dump, parse_binlog_dump_gtid, parse_register_slave
from relayproxy.downstream.transport import ClientConnectionLost, server_tls_context
from relayproxy.downstream.users import DownstreamUser, find_user, parse_users
from relayproxy.ops.status import StatusSources, UpstreamSources, relay_status
from relayproxy.upstream import ConnectionLost, UpstreamConnection
from relayproxy.upstream.receiver import ReceiverCounters
from relayproxy.upstream.session import UpstreamStatus
from relayproxy.wire import packets as P
from relayproxy.wire.auth import AuthSucceeded, ClientAuthentication, SendAuthData
from relayproxy.wire.handshake import (
    build_handshake_response,
    build_ssl_request,
    client_capabilities,
    parse_handshake,
)
from relayproxy.wire.packets import (
    MySQLError,
    PacketDecoder,
    TextResultReader,
    encode_packet,
    parse_err,
    parse_ok,
)
from relayproxy.wire.results import (
    ErrorResponse,
    OkResponse,
    ResultSet,
    encode_error,
    encode_result_set,
    infer_column,
)
from relayproxy.wire.server_auth import (
    AuthAccepted,
    AuthRejected,
    HandshakeError,
    HandshakeResponse,
    RsaKeyPair,
    SendAuthPackets,
    ServerAuthentication,
    Sha2Cache,
    SslRequest,
    build_greeting,
    generate_scramble,
    greeting_version,
    parse_handshake_response,
    server_capabilities,
)

from relayproxy.lab.harness import replica_status

NATIVE_PW = "native-Secret-1"  # ASCII: PyMySQL sends str passwords as latin-1
UNI_PW = "ünï-Sëcret-4"  # UTF-8 on the wire, as the mariadb client and UpstreamConnection send it
SHA_PW = "sha2-Secret-2"
TLS_PW = "tls-only-Secret-3"
USERS = [
    DownstreamUser("native", NATIVE_PW, plugin="mysql_native_password"),
    DownstreamUser("sha", SHA_PW, plugin="caching_sha2_password"),
    DownstreamUser("tlsuser", TLS_PW, plugin="caching_sha2_password", tls="required"),
    DownstreamUser("nopw", "", plugin="mysql_native_password"),
    DownstreamUser("uni", UNI_PW, plugin="caching_sha2_password"),
    DownstreamUser("nativetls", NATIVE_PW, plugin="mysql_native_password", tls="required"),
]
PLAIN_USERS = [u for u in USERS if u.tls == "optional"]
MARIADB_FILE = "pingcap-tiflow/mysql-bin.000001"  # 10.0.17-MariaDB, checksums off, GTIDs 0-1-1..0-1-20
MYSQL_FILE = "EasyPost-rust-mysql-binlog/test_data/bin-log.000001"  # 5.7.24, CRC32, GTIDs
# MariaDB 11.8, CRC32, 10 events, the last a STOP at 912 (a replica does not count it).
MARIADB_CRC_FILE = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0/mariadb-repl-bin.000009"


# -- fixtures and helpers -----------------------------------------------------------------------------------------


class CountingKey(RsaKeyPair):
    """The server's RSA key, counting decryptions: tells the RSA full-auth path from the others."""

    decryptions = 0

    def decrypt(self, ciphertext: bytes) -> bytes:
        CountingKey.decryptions += 1
        return super().decrypt(ciphertext)


_RSA: list[CountingKey] = []


def rsa_key() -> CountingKey:
    # One key for the whole module: generating 2048-bit keys costs ~0.1 s each.
    if not _RSA:
        base = RsaKeyPair.generate()
        _RSA.append(CountingKey(base._key))
    return _RSA[0]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    return asyncio.run if request.param == "asyncio" else uvloop.run


def make_ctx(flavour: str = "mysql", version: str | None = None) -> DownstreamContext:
    version = version or ("8.0.36" if flavour == "mysql" else "10.11.6-MariaDB-log")
    cfg = types.SimpleNamespace(server_id=77)
    status = UpstreamStatus(master_flavour=flavour, master_server_version=version)
    store = types.SimpleNamespace(flavour=flavour, format_description=None, latest_format_description=None, horizon=None)
    upstream = UpstreamSources(status=status, receiver=types.SimpleNamespace(counters=ReceiverCounters()))
    return DownstreamContext(SessionRelayView(cfg, lambda: store, lambda: upstream, server_uuid="relay-uuid"),
                             status_document=lambda: relay_status(cfg, StatusSources(store, upstream)))


_SET = re.compile(r"SET\s+@(\w+)\s*=\s*'?([^',]*)'?", re.IGNORECASE)


class Stub:
    """Stands in for downstream/sql.py and downstream/dump.py: records what arrives, answers like a tiny master."""

    def __init__(self) -> None:
        self.queries: list[tuple[int, str]] = []
        self.dumps: list[DumpRequest] = []
        self.dump_states: list[ConnectionState] = []
        self.dump_body: Callable[[ConnectionState, DumpRequest, Any], Coroutine[Any, Any, None]] | None = None
        self.cancelled = 0
        self.binlog_checksum = "CRC32"

    async def sql(self, ctx: DownstreamContext, conn: ConnectionState, text: str) -> Any:
        self.queries.append((conn.conn_id, text))
        upper = text.strip().rstrip(";").upper()
        match = _SET.match(text.strip())
        if match:
            conn.user_vars[match.group(1).lower()] = match.group(2)
        if upper.startswith("SET"):
            return OkResponse()
        if upper == "WHOAMI":
            return ResultSet(["id", "user", "tls", "db"], [[conn.conn_id, conn.user, int(conn.tls), conn.database]])
        if upper == "TYPES":
            return ResultSet(
                ["i", "big", "f", "d", "s", "b", "n", "when"],
                [[-5, 2**64 - 1, 1.5, decimal.Decimal("3.25"), "grüße", b"\x00\xff", None,
                  datetime.datetime(2024, 5, 6, 7, 8, 9)]],
            )
        if upper == "MANY":
            return ResultSet(["n", "text"], [[i, f"row {i}"] for i in range(2000)])
        if upper == "FAIL":
            return ErrorResponse(1064, "42000", "You have an error in your SQL syntax")
        if upper == "RAISE":
            raise MySQLError(1193, "HY000", "Unknown system variable 'nope'")
        if upper == "BOOM":
            raise RuntimeError("stub blew up")
        if upper == "SLOW":
            await asyncio.sleep(0.01)
            return ResultSet(["id"], [[conn.conn_id]])
        if "BINLOG_CHECKSUM" in upper:
            return ResultSet(["Variable_name", "Value"], [["binlog_checksum", self.binlog_checksum]])
        if "BINLOG_ROW_METADATA" in upper:
            return ResultSet(["Variable_name", "Value"], [])
        if upper in ("SELECT VERSION()", "SELECT @@VERSION"):
            return ResultSet(["VERSION()"], [[ctx.server_version]])
        # What a MariaDB replica's IO thread asks (protocol-reference §3.11).
        if upper == "SELECT UNIX_TIMESTAMP()":
            return ResultSet(["UNIX_TIMESTAMP()"], [[int(time.time())]])
        if upper == "SHOW VARIABLES LIKE 'SERVER_ID'":
            return ResultSet(["Variable_name", "Value"], [["server_id", str(ctx.server_id)]])
        if upper == "SELECT @MASTER_BINLOG_CHECKSUM":
            return ResultSet(["@master_binlog_checksum"], [[self.binlog_checksum]])
        if upper.startswith("SELECT BINLOG_GTID_POS("):
            return ResultSet(["binlog_gtid_pos"], [[None]])
        return ResultSet(["echo"], [[text]])

    async def dump(self, ctx: DownstreamContext, conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
        self.dumps.append(request)
        self.dump_states.append(conn)
        try:
            if self.dump_body is not None:
                await self.dump_body(conn, request, channel)
            else:
                await channel.send(b"\xfe\x00\x00\x02\x00")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@contextlib.asynccontextmanager
async def serving(
    stub: Stub, users: list[DownstreamUser] = PLAIN_USERS, *, ctx: DownstreamContext | None = None, **options: Any
) -> AsyncIterator[DownstreamServer]:
    server = DownstreamServer(ctx or make_ctx(), users, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key(), **options)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()


def file_events(path: Path) -> list[bytes]:
    """The events of a binlog file, in order (after the 4-byte magic)."""
    data = path.read_bytes()
    events, pos = [], 4
    while pos < len(data):
        size = struct.unpack_from("<I", data, pos + 9)[0]
        events.append(data[pos : pos + size])
        pos += size
    return events


def serve_file(path: Path, checksum: bool) -> Callable[..., Coroutine[Any, Any, None]]:
    """A dump body that sends a fake ROTATE, the file's events and EOF, as a master does for a NON_BLOCK dump."""

    async def body(conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
        await channel.send(b"\x00" + artificial_rotate(request.file or path.name, request.position, 1, checksum))
        for event in file_events(path):
            await channel.send(b"\x00" + event)
        await channel.send(b"\xfe\x00\x00\x02\x00")

    return body


# -- TLS material -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed server certificate for 127.0.0.1/localhost and its key, as PEM files."""
    directory = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "relayproxy test listener")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return {"cert": cert_path, "key": key_path}


def client_tls(tls_files: dict[str, Path]) -> ssl.SSLContext:
    """A client context that verifies the listener's certificate and host name."""
    context = ssl.create_default_context(cafile=str(tls_files["cert"]))
    return context


# -- a raw client -------------------------------------------------------------------------------------------------


class RawClient:
    """Packets by hand, to send what real clients do not (and to see sequence ids)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = PacketDecoder(keep_sequences=True)
        self.decoder.expect_sequence(None)
        self.pending: list[tuple[int, bytes]] = []

    @classmethod
    async def connect(cls, server: DownstreamServer) -> RawClient:
        reader, writer = await asyncio.open_connection(*server.address)
        return cls(reader, writer)

    def send(self, payload: bytes, seq: int) -> None:
        self.writer.write(encode_packet(payload, seq))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def packet(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """(sequence id, payload) of the next packet; EOFError when the server closed the connection."""
        async with asyncio.timeout(timeout):
            while not self.pending:
                data = await self.reader.read(1 << 20)
                if not data:
                    raise EOFError("server closed the connection")
                self.decoder.feed(data)
                self.pending += self.decoder.packets()
        return self.pending.pop(0)

    async def payload(self, timeout: float = 5.0) -> bytes:
        return (await self.packet(timeout))[1]

    async def closed_by_server(self, timeout: float = 5.0) -> bool:
        try:
            await self.packet(timeout)
        except (EOFError, ConnectionError):
            return True
        return False

    async def login(self, user: str, password: str, *, extra_caps: int = 0) -> int:
        """Log in as a mysql_native_password account; returns the connection id."""
        greeting = parse_handshake((await self.packet())[1])
        caps = client_capabilities(greeting, tls=False) | extra_caps
        scramble = pymysql_auth.scramble_native_password(password.encode(), greeting.auth_plugin_data[:20])
        self.send(build_handshake_response(caps, user, scramble, plugin_name="mysql_native_password"), 1)
        while True:
            seq, reply = await self.packet()
            if reply[0] == 0xFE:  # the greeting's plugin was caching_sha2: switch
                self.send(pymysql_auth.scramble_native_password(password.encode(), reply[-21:-1]), seq + 1)
                continue
            assert reply[0] == 0x00, parse_err(reply)
            return greeting.connection_id

    def close(self) -> None:
        self.writer.close()


# =================================================================================================================
# sans-I/O: accounts
# =================================================================================================================


def test_parse_users_forms_and_errors(tmp_path: Path) -> None:
    pw_file = tmp_path / "pw"
    pw_file.write_text("from-file\nignored\n")
    env = {"REPL_PW": "from-env"}
    users = parse_users(
        [
            {"name": "a", "password": "lit"},
            {"name": "b", "password_env": "REPL_PW", "tls": "required"},
            {"name": "c", "password-file": str(pw_file), "plugin": "mysql_native_password", "host": "10.%"},
        ],
        environ=env,
    )
    assert [(u.name, u.password, u.plugin, u.tls, u.host) for u in users] == [
        ("a", "lit", "auto", "optional", "%"),
        ("b", "from-env", "auto", "required", "%"),
        ("c", "from-file", "mysql_native_password", "optional", "10.%"),
    ]
    text = f"x:lit:er:al, y:env:REPL_PW:required, z:file:{pw_file}:mysql_native_password:optional,w:"
    parsed = parse_users(text, environ=env)
    assert [(u.name, u.password, u.plugin, u.tls) for u in parsed] == [
        ("x", "lit:er:al", "auto", "optional"),
        ("y", "from-env", "auto", "required"),
        ("z", "from-file", "mysql_native_password", "optional"),
        ("w", "", "auto", "optional"),
    ]
    assert parse_users(parsed) == parsed and parse_users("") == [] and parse_users(None) == []
    assert parse_users(["x:lit:er:al", {"name": "y", "password_env": "REPL_PW", "tls": "required"}], environ=env) == (
        parsed[:2]
    )

    secret = "do-not-show-me"
    bad = {
        "users[0] ('a'): exactly one of password, password_env, password_file": [{"name": "a"}],
        "users[0] ('a'): exactly one of password, password_env, password_file is required (given: password, "
        "password_env)": [{"name": "a", "password": secret, "password_env": "X"}],
        "users[1]: 'name' is required": [{"name": "ok", "password": "p"}, {"password": secret}],
        "unknown key(s) pasword": [{"name": "a", "pasword": secret}],
        "environment variable NOPE (the password) is not set": [{"name": "a", "password_env": "NOPE"}],
        "plugin must be one of auto, caching_sha2_password, mysql_native_password, got 'ed25519'": [
            {"name": "a", "password": secret, "plugin": "ed25519"}
        ],
        "tls must be one of optional, required, got 'maybe'": [{"name": "a", "password": secret, "tls": "maybe"}],
        "cannot read password file": [{"name": "a", "password_file": str(tmp_path / "missing")}],
        "account 'a'@'%' is declared twice": "a:x,a:" + secret,
        "users[0]: expected name:password": "justaname",
        "not a single table": {"name": "a", "password": secret},
    }
    for message, value in bad.items():
        with pytest.raises(ValueError) as info:
            parse_users(value, environ={})
        assert message in str(info.value)
        assert secret not in str(info.value)

    user = DownstreamUser("repl", secret)
    assert secret not in repr(user) and secret not in str(user) and "***" in repr(user)
    assert find_user(users, "c", "10.1.2.3") is users[2]
    assert find_user(users, "c", "192.168.0.1") is None
    specific = [DownstreamUser("r", "any"), DownstreamUser("r", "exact", host="127.0.0.1")]
    assert find_user(specific, "r", "127.0.0.1").password == "exact"
    assert find_user(specific, "r", "10.0.0.1").password == "any"


# =================================================================================================================
# sans-I/O: result sets and generic packets
# =================================================================================================================


def test_result_set_encoding_classic_and_deprecate_eof() -> None:
    rs = ResultSet(["n", "s", "nothing"], [[1, "a", None], [2, "bé", None]])
    classic = encode_result_set(rs, deprecate_eof=False)
    reader = TextResultReader()
    results = [reader.feed(p) for p in classic]
    assert results[:-1] == [None] * (len(classic) - 1)
    assert results[-1].columns == ["n", "s", "nothing"]
    assert results[-1].rows == [("1", "a", None), ("2", "bé", None)]
    assert P.is_eof(classic[4]) and P.is_eof(classic[-1])  # after the 3 column definitions, and at the end

    modern = encode_result_set(rs, deprecate_eof=True)
    # count, 3 definitions, 2 rows, OK-with-0xFE: no EOF after the definitions.
    assert len(modern) == 1 + 3 + 2 + 1
    assert not any(p[0] == 0xFE for p in modern[:-1])
    terminator = modern[-1]
    assert terminator[0] == 0xFE and len(terminator) < 9
    assert parse_ok(terminator).status_flags & P.SERVER_STATUS_AUTOCOMMIT

    column = {c.name: c for c in (infer_column(n, v) for n, v in (
        ("i", [1, None]), ("u", [2**64 - 1]), ("f", [1.5, 2]), ("s", ["x", 3]), ("b", [b"\x00"]), ("null", [None]),
        ("d", [decimal.Decimal("1.50")]), ("dt", [datetime.datetime(2024, 1, 2, 3, 4, 5)]),
    ))}
    assert (column["i"].type, column["i"].flags & 1) == (8, 0)  # LONGLONG, nullable
    assert column["u"].type == 8 and column["u"].flags & 32  # UNSIGNED past 2^63
    assert (column["f"].type, column["s"].type, column["b"].type) == (5, 253, 253)
    assert (column["s"].charset, column["b"].charset, column["null"].type) == (45, 63, 6)
    assert (column["d"].type, column["d"].decimals, column["dt"].type) == (246, 2, 12)

    assert encode_result_set(ResultSet([], []), deprecate_eof=True)[0][0] == 0x00  # no columns: an OK
    with pytest.raises(ValueError, match="row 1 has 1 values for 2 columns"):
        encode_result_set(ResultSet(["a", "b"], [[1, 2], [3]]), deprecate_eof=False)
    with pytest.raises(TypeError, match="column 'a': cannot send a object value"):
        encode_result_set(ResultSet(["a"], [[object()]]), deprecate_eof=False)

    err = parse_err(encode_error(1045, "28000", "é" * 400))
    assert (err.code, err.sqlstate) == (1045, "28000") and len(err.message.encode()) <= 511


# =================================================================================================================
# sans-I/O: greeting, handshake response, authentication
# =================================================================================================================


def test_greeting_round_trips_through_the_client_parser() -> None:
    scramble = generate_scramble()
    assert len(scramble) == 20 and 0 not in scramble and ord("$") not in scramble
    caps = server_capabilities(tls=True)
    payload = build_greeting(
        server_version=greeting_version("10.11.6-MariaDB-log", "mariadb"), connection_id=42, scramble=scramble,
        capabilities=caps, auth_plugin="mysql_native_password",
    )
    greeting = parse_handshake(payload)
    assert greeting.server_version == "5.5.5-10.11.6-MariaDB-log" and greeting.version == "10.11.6-MariaDB-log"
    assert (greeting.connection_id, greeting.auth_plugin_data, greeting.auth_plugin_name) == (
        42, scramble, "mysql_native_password"
    )
    assert greeting.capabilities == caps and greeting.supports_tls
    for flag in (P.CLIENT_PLUGIN_AUTH, P.CLIENT_SECURE_CONNECTION, P.CLIENT_PROTOCOL_41, P.CLIENT_DEPRECATE_EOF,
                 P.CLIENT_CONNECT_WITH_DB, P.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA, P.CLIENT_CONNECT_ATTRS):
        assert caps & flag
    assert not server_capabilities(tls=False) & P.CLIENT_SSL
    assert greeting_version("8.0.36-relayproxy-log", "mysql") == "8.0.36-relayproxy-log"
    assert greeting_version("5.5.5-10.6.1-MariaDB", "mariadb") == "5.5.5-10.6.1-MariaDB"


def test_handshake_response_parsing() -> None:
    server_caps = server_capabilities(tls=True)
    greeting = parse_handshake(build_greeting(
        server_version="8.0.36", connection_id=1, scramble=generate_scramble(), capabilities=server_caps,
        auth_plugin="caching_sha2_password",
    ))
    caps = client_capabilities(greeting, tls=True, database=True)
    assert isinstance(parse_handshake_response(build_ssl_request(caps), server_caps), SslRequest)
    payload = build_handshake_response(
        caps, "repl", b"\x01" * 32, plugin_name="caching_sha2_password", database="app",
        connect_attrs={"program_name": "mysqld", "_client_role": "binary_log_listener"},
    )
    response = parse_handshake_response(payload, server_caps)
    assert isinstance(response, HandshakeResponse)
    assert (response.user, response.auth_response, response.database, response.auth_plugin) == (
        "repl", b"\x01" * 32, "app", "caching_sha2_password"
    )
    assert response.connect_attrs == {"program_name": "mysqld", "_client_role": "binary_log_listener"}
    assert "auth_response" not in repr(response)

    broken = {
        "is 10 bytes, at least 32 expected": b"\x00" * 10,
        "does not speak protocol 4.1": struct.pack("<IIB23x", 0, 0, 45) + b"u\0",
        "user name in the handshake response has no NUL": payload[:36],
        "truncated auth response for user 'repl'": payload[:32] + b"repl\0\x20abc",
        "malformed connection attributes from user 'repl'": payload[:-3],
    }
    for message, data in broken.items():
        with pytest.raises(HandshakeError) as info:
            parse_handshake_response(data, server_caps)
        assert info.value.code == 1043 and message in info.value.message, info.value.message


def converse(
    users: list[DownstreamUser], user: str, password: str, *, greeting_plugin: str, secure: bool,
    cache: Sha2Cache | None = None, client_secure: bool | None = None, request_public_key: bool = True,
) -> tuple[AuthAccepted | AuthRejected, list[bytes]]:
    """Run ServerAuthentication against the relay's ClientAuthentication, packet by packet, without sockets;
    returns the outcome and every packet the server sent."""
    scramble = generate_scramble()
    greeting = parse_handshake(build_greeting(
        server_version="8.0.36", connection_id=1, scramble=scramble, capabilities=server_capabilities(tls=secure),
        auth_plugin=greeting_plugin,
    ))
    client = ClientAuthentication(
        password, secure=secure if client_secure is None else client_secure, request_public_key=request_public_key
    )
    plugin, data = client.initial_response(greeting)
    caps = client_capabilities(greeting, tls=False)
    response = parse_handshake_response(build_handshake_response(caps, user, data, plugin_name=plugin), caps)
    server = ServerAuthentication(
        users, scramble=scramble, client_host="127.0.0.1", secure=secure, rsa_key=rsa_key(),
        sha2_cache=cache if cache is not None else Sha2Cache(),
    )
    sent: list[bytes] = []
    step = server.start(response)
    while isinstance(step, SendAuthPackets):
        sent += step.packets
        reply = None
        for packet in step.packets:
            client_step = client.receive(packet)
            if isinstance(client_step, SendAuthData):
                reply = client_step.data
        assert reply is not None
        step = server.receive(reply)
    if isinstance(step, AuthAccepted):
        sent += step.packets
        for packet in step.packets:
            client.receive(packet)
        assert isinstance(client.receive(b"\x00\x00\x00\x02\x00\x00\x00"), AuthSucceeded)
    return step, sent


def test_authentication_state_machine() -> None:
    before = CountingKey.decryptions
    cache = Sha2Cache()
    # caching_sha2_password: full auth with the RSA key, then the fast path from the cache.
    step, sent = converse(USERS, "sha", SHA_PW, greeting_plugin="caching_sha2_password", secure=False, cache=cache)
    assert isinstance(step, AuthAccepted) and step.plugin == "caching_sha2_password"
    assert sent[0] == b"\x01\x04" and sent[1].startswith(b"\x01-----BEGIN PUBLIC KEY-----")
    assert CountingKey.decryptions == before + 1 and len(cache) == 1
    step, sent = converse(USERS, "sha", SHA_PW, greeting_plugin="caching_sha2_password", secure=False, cache=cache)
    assert isinstance(step, AuthAccepted) and sent == [b"\x01\x03"]
    # A wrong password with the account cached falls back to full auth, then 1045.
    step, sent = converse(USERS, "sha", "wrong", greeting_plugin="caching_sha2_password", secure=False, cache=cache)
    assert isinstance(step, AuthRejected) and step.reason == "wrong password" and sent[0] == b"\x01\x04"
    # After a password change (configuration reload) the cached digest no longer counts: full auth again.
    changed = [DownstreamUser("sha", "new-Secret", plugin="caching_sha2_password")]
    step, sent = converse(changed, "sha", "new-Secret", greeting_plugin="caching_sha2_password", secure=True,
                          cache=cache)
    assert isinstance(step, AuthAccepted) and sent == [b"\x01\x04"]
    step, sent = converse(changed, "sha", "new-Secret", greeting_plugin="caching_sha2_password", secure=False,
                          cache=cache)
    assert isinstance(step, AuthAccepted) and sent == [b"\x01\x03"]
    # Over TLS the password comes in clear after 0x01 0x04; no RSA.
    decryptions = CountingKey.decryptions
    step, sent = converse(USERS, "sha", SHA_PW, greeting_plugin="caching_sha2_password", secure=True)
    assert isinstance(step, AuthAccepted) and sent == [b"\x01\x04"] and CountingKey.decryptions == decryptions
    # Plugin switches both ways.
    step, sent = converse(USERS, "native", NATIVE_PW, greeting_plugin="caching_sha2_password", secure=False)
    assert isinstance(step, AuthAccepted) and sent[0].startswith(b"\xfemysql_native_password\x00")
    step, sent = converse(USERS, "sha", SHA_PW, greeting_plugin="mysql_native_password", secure=False)
    assert isinstance(step, AuthAccepted) and sent[0].startswith(b"\xfecaching_sha2_password\x00")
    step, _ = converse(USERS, "nopw", "", greeting_plugin="mysql_native_password", secure=False)
    assert isinstance(step, AuthAccepted)

    # Failures: all 1045 with MySQL's text, the reason only for the log.
    cases = [
        (("native", "Bad-Pw-1"), {}, "wrong password", "YES"),
        (("native", ""), {}, "wrong password", "NO"),
        (("ghost", "Bad-Pw-2"), {}, "unknown user", "YES"),
        (("tlsuser", TLS_PW), {}, "requires TLS and the client connected without it", "YES"),
    ]
    for (name, password), extra, reason, using in cases:
        step, _ = converse(USERS, name, password, greeting_plugin="caching_sha2_password", secure=False, **extra)
        assert isinstance(step, AuthRejected), name
        assert reason in step.reason
        assert (step.error.code, step.error.sqlstate) == (1045, "28000")
        assert step.error.message == f"Access denied for user '{name}'@'127.0.0.1' (using password: {using})"
        assert not password or password not in step.reason
    # An unknown user walks the same path as a real one (full auth), so the replies reveal nothing.
    _, ghost_packets = converse(USERS, "ghost", "x", greeting_plugin="caching_sha2_password", secure=True)
    _, real_packets = converse(USERS, "sha", "x", greeting_plugin="caching_sha2_password", secure=True)
    assert ghost_packets == real_packets == [b"\x01\x04"]
    # The TLS-only account passes over TLS.
    step, _ = converse(USERS, "tlsuser", TLS_PW, greeting_plugin="caching_sha2_password", secure=True)
    assert isinstance(step, AuthAccepted)


def test_cleartext_password_without_tls_is_never_accepted() -> None:
    """A client that sends its password in clear on a plain connection is refused without looking at it."""
    scramble = generate_scramble()
    caps = server_capabilities(tls=False)
    payload = build_handshake_response(
        caps & ~P.CLIENT_SSL, "sha", pymysql_auth.scramble_caching_sha2(b"wrong", scramble),
        plugin_name="caching_sha2_password",
    )
    auth = ServerAuthentication(
        USERS, scramble=scramble, client_host="h", secure=False, rsa_key=rsa_key(), sha2_cache=Sha2Cache()
    )
    assert isinstance(auth.start(parse_handshake_response(payload, caps)), SendAuthPackets)
    step = auth.receive(SHA_PW.encode() + b"\0")
    assert isinstance(step, AuthRejected) and "RSA-encrypted password" in step.reason


# =================================================================================================================
# sans-I/O: replication commands
# =================================================================================================================


def test_replication_command_parsing() -> None:
    registration = parse_register_slave(
        P.com_register_slave(1234, "replica1", 3307, "ru", "report-secret", 0, 0), master_server_id=77
    )
    assert (registration.server_id, registration.host, registration.port, registration.user) == (
        1234, "replica1", 3307, "ru"
    )
    assert registration.master_id == 77 and "report-secret" not in repr(registration)
    with pytest.raises(P.ProtocolError, match="too short"):
        parse_register_slave(P.com_register_slave(1, "h")[:-3])
    with pytest.raises(P.ProtocolError, match="report_host runs past"):
        parse_register_slave(b"\x15" + struct.pack("<I", 1) + b"\x09abc")

    state = ConnectionState(conn_id=1)
    request = parse_binlog_dump(P.com_binlog_dump("mysql-bin.000042", 1234, 9, flags=1), state)
    assert request == DumpRequest("file", 9, 1, "mysql-bin.000042", 1234)
    state.user_vars["slave_connect_state"] = "0-1-5"
    assert parse_binlog_dump(P.com_binlog_dump("", 4, 9), state).kind == "mariadb-gtid"
    with pytest.raises(P.ProtocolError, match="at least 11 expected"):
        parse_binlog_dump(b"\x12\x04\x00")

    gtid_set = bytes(range(40))
    request = parse_binlog_dump_gtid(P.com_binlog_dump_gtid(9, gtid_set, file="", position=4, flags=4))
    assert request == DumpRequest("mysql-gtid", 9, 4, "", 4, gtid_set)
    # python-mysql-replication sends a 3-byte name of NULs.
    padded = b"\x1e" + struct.pack("<HII", 4, 9, 3) + b"\0\0\0" + struct.pack("<QI", 4, 2) + b"ab"
    assert parse_binlog_dump_gtid(padded) == DumpRequest("mysql-gtid", 9, 4, "", 4, b"ab")
    assert parse_binlog_dump_gtid(padded[:-6]).gtid_set == b""  # no data size at all: an empty set
    with pytest.raises(P.ProtocolError, match="announces a 1000-byte file name"):
        parse_binlog_dump_gtid(b"\x1e" + struct.pack("<HII", 0, 9, 1000) + b"x" * 20)
    with pytest.raises(P.ProtocolError, match="announces a 9-byte GTID set, the packet has 2 bytes left"):
        parse_binlog_dump_gtid(padded[:-6] + struct.pack("<I", 9) + b"ab")


# =================================================================================================================
# real clients
# =================================================================================================================


def test_pymysql_native_and_caching_sha2_logins(run: Callable[..., Any]) -> None:
    stub = Stub()

    async def scenario() -> None:
        async with serving(stub) as server:
            host, port = server.address

            def clients() -> list[tuple[Any, ...]]:
                seen = []
                for user, password in (("native", NATIVE_PW), ("sha", SHA_PW), ("sha", SHA_PW), ("nopw", "")):
                    decryptions = CountingKey.decryptions
                    with pymysql.connect(host=host, port=port, user=user, password=password, database="app") as conn:
                        assert conn.get_server_info() == "8.0.36-relayproxy-log"
                        with conn.cursor() as cur:
                            cur.execute("WHOAMI")
                            row = cur.fetchone()
                        conn.ping()
                        conn.select_db("other")
                        with conn.cursor() as cur:
                            cur.execute("WHOAMI")
                            assert cur.fetchone()[3] == "other"
                    seen.append((*row, CountingKey.decryptions - decryptions))
                return seen

            seen = await asyncio.to_thread(clients)
            # Connection ids count from 1; caching_sha2 does RSA full auth the first time, the fast path after.
            assert seen == [(1, "native", 0, "app", 0), (2, "sha", 0, "app", 1), (3, "sha", 0, "app", 0),
                            (4, "nopw", 0, "app", 0)]
            assert len(server.sha2_cache) == 1
            await asyncio.sleep(0.05)
            assert server.ctx.connections == {} and server.connection_count == 0

    run(scenario())


def test_tls_logins_and_tls_required_account(run: Callable[..., Any], tls_files: dict[str, Path]) -> None:
    stub = Stub()

    async def scenario() -> None:
        async with serving(stub, USERS, tls_context=server_tls_context(tls_files["cert"], tls_files["key"])) as server:
            host, port = server.address

            def clients() -> None:
                decryptions = CountingKey.decryptions
                # caching_sha2 full authentication over TLS: the password in clear inside TLS, no RSA.
                for user, password in (("sha", SHA_PW), ("tlsuser", TLS_PW), ("native", NATIVE_PW)):
                    with pymysql.connect(
                        host=host, port=port, user=user, password=password, ssl=client_tls(tls_files)
                    ) as conn:
                        with conn.cursor() as cur:
                            cur.execute("WHOAMI")
                            assert cur.fetchone()[1:3] == (user, 1)
                            cur.execute("MANY")
                            assert len(cur.fetchall()) == 2000
                assert CountingKey.decryptions == decryptions
                # The TLS-only account without TLS: MySQL's REQUIRE SSL answer, 1045.
                with pytest.raises(pymysql.err.OperationalError) as info:
                    pymysql.connect(host=host, port=port, user="tlsuser", password=TLS_PW, ssl_disabled=True)
                assert info.value.args == (
                    1045, "Access denied for user 'tlsuser'@'127.0.0.1' (using password: YES)"
                )

            await asyncio.to_thread(clients)

            # The relay's own client too: TLS preferred, caching_sha2 over TLS.
            conn = await UpstreamConnection.connect(host, port, "tlsuser", TLS_PW, ssl_mode="verify_identity",
                                                    ssl_ca=tls_files["cert"])
            async with conn:
                assert conn.tls and (await conn.query("WHOAMI")).rows[0][1:3] == ("tlsuser", "1")

        with pytest.raises(ValueError, match="'tlsuser'@'%', 'nativetls'@'%' require TLS, but no TLS certificate"):
            DownstreamServer(make_ctx(), USERS, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key())
        with pytest.raises(ValueError, match="TLS certificate or key file not found"):
            server_tls_context(tls_files["cert"].parent / "nope.pem")

    run(scenario())


def test_wrong_password_is_1045_and_never_logged(capsys: pytest.CaptureFixture[str]) -> None:
    stub = Stub()
    wrong = "Wr0ng-Passw0rd-xyz"

    async def scenario() -> None:
        async with serving(stub) as server:
            host, port = server.address

            def clients() -> None:
                for user in ("native", "sha", "ghost"):
                    with pytest.raises(pymysql.err.OperationalError) as info:
                        pymysql.connect(host=host, port=port, user=user, password=wrong)
                    assert info.value.args == (
                        1045, f"Access denied for user '{user}'@'127.0.0.1' (using password: YES)"
                    )
                with pytest.raises(pymysql.err.OperationalError) as info:
                    pymysql.connect(host=host, port=port, user="sha", password="")
                assert info.value.args[1].endswith("(using password: NO)")

            await asyncio.to_thread(clients)
            # The mariadb client says the same.
            proc = await asyncio.create_subprocess_exec(
                "mariadb", "--ssl=0", "-h", host, "-P", str(port), "-u", "sha", f"-p{wrong}", "-e", "SELECT 1",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            _, err = await proc.communicate()
            assert proc.returncode == 1
            expected = "ERROR 1045 (28000): Access denied for user 'sha'@'127.0.0.1' (using password: YES)"
            assert err.decode().strip() == expected

    asyncio.run(scenario())
    logged = capsys.readouterr()
    output = logged.out + logged.err
    assert "login refused" in output and "wrong password" in output and "unknown user" in output
    for secret in (wrong, NATIVE_PW, SHA_PW, TLS_PW, UNI_PW):
        assert secret not in output


def test_mariadb_command_line_client(tls_files: dict[str, Path]) -> None:
    """The mariadb client (libmariadb): native and caching_sha2 (RSA key request) without TLS, full auth over TLS,
    classic EOF result sets with types, errors from the SQL layer."""
    stub = Stub()

    async def mariadb(
        server: DownstreamServer, user: str, password: str, sql: str, *options: str
    ) -> tuple[int, str, str]:
        host, port = server.address
        proc = await asyncio.create_subprocess_exec(
            "mariadb", *options, "-h", host, "-P", str(port), "-u", user, f"-p{password}", "-e", sql,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode()

    async def scenario() -> None:
        async with serving(stub, USERS, tls_context=server_tls_context(tls_files["cert"], tls_files["key"])) as server:
            for user, password in (("native", NATIVE_PW), ("sha", SHA_PW), ("uni", UNI_PW), ("uni", UNI_PW)):
                code, out, err = await mariadb(server, user, password, "SELECT 1", "--ssl=0")
                assert (code, err) == (0, "")
                assert out == "echo\nSELECT 1\n"
            code, out, err = await mariadb(server, "tlsuser", TLS_PW, "WHOAMI", "--ssl", "--ssl-verify-server-cert",
                                           f"--ssl-ca={tls_files['cert']}")
            assert (code, err) == (0, "") and out.splitlines()[1].split("\t")[1:3] == ["tlsuser", "1"]
            code, out, err = await mariadb(server, "native", NATIVE_PW, "TYPES", "--ssl=0", "--column-type-info", "-t")
            assert code == 0, err
            types_seen = re.findall(r"^Type:\s+(\w+)$", out, flags=re.MULTILINE)
            assert types_seen == ["LONGLONG", "LONGLONG", "DOUBLE", "NEWDECIMAL", "VAR_STRING", "VAR_STRING", "NULL",
                                  "DATETIME"]
            assert "Flags:      NOT_NULL UNSIGNED BINARY NUM" in out and "Collation:  utf8mb4_general_ci (45)" in out
            assert re.search(r"\| +-5 \| 18446744073709551615 \| +1\.5 \| 3\.25 \| grüße +\|", out), out
            assert "| NULL | 2024-05-06 07:08:09 |" in out
            code, out, err = await mariadb(server, "native", NATIVE_PW, "FAIL", "--ssl=0")
            assert code == 1 and "ERROR 1064 (42000) at line 1: You have an error in your SQL syntax" in err
            code, out, err = await mariadb(server, "tlsuser", TLS_PW, "SELECT 1", "--ssl=0")
            assert code == 1 and "ERROR 1045 (28000)" in err

    asyncio.run(scenario())


def test_deprecate_eof_and_command_handling(run: Callable[..., Any]) -> None:
    """A client that negotiates CLIENT_DEPRECATE_EOF gets result sets ending in an OK with a 0xFE header and no EOF
    after the column definitions; COM_PING, COM_INIT_DB, unknown commands (1047) and COM_QUIT."""
    stub = Stub()

    async def scenario() -> None:
        async with serving(stub) as server:
            client = await RawClient.connect(server)
            conn_id = await client.login("native", NATIVE_PW, extra_caps=P.CLIENT_DEPRECATE_EOF)
            assert server.ctx.connections[conn_id].capabilities & P.CLIENT_DEPRECATE_EOF
            client.send(P.com_query("SELECT 1"), 0)
            packets = [await client.packet() for _ in range(4)]
            assert [seq for seq, _ in packets] == [1, 2, 3, 4]
            count, definition, row, end = (p for _, p in packets)
            assert count == b"\x01" and P.parse_column_name(definition) == "echo"
            assert P.parse_text_row(row, 1) == ("SELECT 1",)
            assert end[0] == 0xFE and parse_ok(end).warnings == 0

            client.send(bytes([P.COM_PING]), 0)
            assert await client.packet() == (1, b"\x00\x00\x00\x02\x00\x00\x00")
            messages = []
            for command in (P.COM_STMT_PREPARE, P.COM_STATISTICS, 0x63):
                client.send(bytes([command]) + b"SELECT 1", 0)
                seq, reply = await client.packet()
                err = parse_err(reply)
                assert (seq, err.code, err.sqlstate) == (1, 1047, "08S01")
                messages.append(err.message)
            assert messages == [
                "Unknown command: COM_STMT_PREPARE (0x16) is not supported by relayproxy",
                "Unknown command: COM_STATISTICS (0x09) is not supported by relayproxy",
                "Unknown command: command (0x63) is not supported by relayproxy",
            ]
            client.send(bytes([P.COM_INIT_DB]) + b"appdb", 0)
            assert (await client.payload())[0] == 0x00
            assert server.ctx.connections[conn_id].database == "appdb"
            client.send(bytes([P.COM_INIT_DB]), 0)
            assert parse_err(await client.payload()).code == 1046
            client.send(P.com_query("FAIL"), 0)
            assert parse_err(await client.payload()).code == 1064
            client.send(P.com_query("RAISE"), 0)
            assert parse_err(await client.payload()).code == 1193
            client.send(bytes([P.COM_QUIT]), 0)
            assert await client.closed_by_server()
            client.close()

            # The same query without DEPRECATE_EOF: classic EOF packets.
            classic = await RawClient.connect(server)
            await classic.login("native", NATIVE_PW)
            classic.send(P.com_query("SELECT 1"), 0)
            payloads = [await classic.payload() for _ in range(5)]
            assert P.is_eof(payloads[2]) and P.is_eof(payloads[4])
            classic.close()

    run(scenario())


def test_plain_function_sql_layer() -> None:
    """relayproxy.downstream.sql.execute is a plain function: its answers are used as they are."""
    stub = Stub()

    def execute(ctx: DownstreamContext, conn: ConnectionState, text: str) -> Any:
        return ResultSet(["conn", "sql"], [[conn.conn_id, text]]) if text != "ERR" else ErrorResponse(
            1193, "HY000", "Unknown system variable 'x'"
        )

    async def scenario() -> None:
        server = DownstreamServer(make_ctx(), PLAIN_USERS, sql=execute, dump=stub.dump, rsa_key=rsa_key())
        await server.start("127.0.0.1", 0)
        try:
            async with await UpstreamConnection.connect(*server.address, "native", NATIVE_PW) as conn:
                assert (await conn.query("SELECT 1")).rows == [("1", "SELECT 1")]
                with pytest.raises(MySQLError) as info:
                    await conn.query("ERR")
                assert info.value.code == 1193
                assert (await conn.query("SELECT 2")).rows == [("1", "SELECT 2")]
        finally:
            await server.close()

    asyncio.run(scenario())


def test_bad_clients_get_clear_errors_and_others_keep_working(run: Callable[..., Any]) -> None:
    stub = Stub()

    async def scenario() -> None:
        async with serving(stub, handshake_timeout=0.5) as server:
            # A well-behaved client stays connected through all of it.
            good = await UpstreamConnection.connect(*server.address, "sha", SHA_PW, ssl_mode="disabled")

            async def first_reply(data: bytes) -> MySQLError | None:
                client = await RawClient.connect(server)
                await client.packet()  # greeting
                client.send_raw(data)
                try:
                    seq, reply = await client.packet()
                except EOFError:
                    return None
                assert await client.closed_by_server()
                client.close()
                return parse_err(reply)

            cases = {
                "Bad handshake: the client's handshake response is 10 bytes, at least 32 expected":
                    encode_packet(b"\x01" * 10, 1),
                "Bad handshake: the client does not speak protocol 4.1 (CLIENT_PROTOCOL_41), which is required":
                    encode_packet(struct.pack("<IIB23x", 0x8000, 0, 45) + b"u\0\0", 1),
                "Bad handshake: the client asked for TLS, but this server has no TLS certificate configured":
                    encode_packet(build_ssl_request(P.CLIENT_SSL | P.CLIENT_PROTOCOL_41), 1) + b"\x16\x03\x01junk",
                "Got packets out of order: sequence id 7, expected 1": encode_packet(b"\x00" * 40, 7),
                "Got a packet bigger than 'max_allowed_packet' bytes": b"\xf0\xff\xff\x01" + b"\x00" * 100,
            }
            for message, data in cases.items():
                err = await first_reply(data)
                assert err is not None and err.message == message, (message, err)
                assert err.code in (1043, 1153, 1156)

            # Silent after the greeting: the handshake timeout.
            silent = await RawClient.connect(server)
            await silent.packet()
            err = parse_err(await silent.payload(timeout=3))
            assert (err.code, err.message) == (1043, "Bad handshake: no complete handshake within 0.5s")
            silent.close()

            # A malformed COM_REGISTER_SLAVE: 1835 naming the problem, connection closed.
            bad = await RawClient.connect(server)
            await bad.login("native", NATIVE_PW)
            bad.send(b"\x15\x01\x00\x00\x00\x09abc", 0)
            err = parse_err(await bad.payload())
            assert (err.code, err.message) == (
                1835, "Malformed communication packet: COM_REGISTER_SLAVE report_host runs past the packet end"
            )
            assert await bad.closed_by_server()
            # A truncated COM_BINLOG_DUMP.
            bad = await RawClient.connect(server)
            await bad.login("native", NATIVE_PW)
            bad.send(b"\x12\x04\x00", 0)
            assert "COM_BINLOG_DUMP is 3 bytes, at least 11 expected" in parse_err(await bad.payload()).message
            assert await bad.closed_by_server()
            # A bug in the SQL layer: 1105, that connection closed, everyone else fine.
            with pytest.raises(MySQLError) as info:
                async with await UpstreamConnection.connect(*server.address, "native", NATIVE_PW) as victim:
                    await victim.query("BOOM")
            assert info.value.code == 1105 and "internal error" in info.value.message
            # An empty command packet.
            bad = await RawClient.connect(server)
            await bad.login("native", NATIVE_PW)
            bad.send(b"", 0)
            assert parse_err(await bad.payload()).message == "Malformed communication packet: empty command"

            assert (await good.query("WHOAMI")).rows[0][1] == "sha"
            await good.close()
            await asyncio.sleep(0.05)
            assert server.ctx.connections == {}

        # Idle clients are told why they are dropped (MySQL 8.0.24+'s 4031, sequence id 0).
        async with serving(stub, idle_timeout=0.3) as server:
            idle = await RawClient.connect(server)
            await idle.login("native", NATIVE_PW)
            seq, reply = await idle.packet(timeout=3)
            assert seq == 0 and parse_err(reply).code == 4031
            assert await idle.closed_by_server()

        # Too many connections: 1040 instead of a greeting.
        async with serving(stub, max_connections=1) as server:
            first = await RawClient.connect(server)
            await first.packet()
            second = await RawClient.connect(server)
            seq, reply = await second.packet()
            assert (seq, parse_err(reply).code) == (0, 1040)
            first.close()
            second.close()

    run(scenario())


def test_many_concurrent_clients() -> None:
    stub = Stub()

    async def one(server: DownstreamServer, index: int) -> tuple[int, list[int]]:
        user, password = (("native", NATIVE_PW), ("sha", SHA_PW), ("uni", UNI_PW))[index % 3]
        conn = await UpstreamConnection.connect(*server.address, user, password, ssl_mode="disabled")
        async with conn:
            ids = [int((await conn.query("SLOW")).rows[0][0]) for _ in range(5)]
            return conn.connection_id, ids

    async def scenario() -> None:
        async with serving(stub) as server:
            results = await asyncio.gather(*(one(server, i) for i in range(60)))
            assert all(ids == [conn_id] * 5 for conn_id, ids in results)
            assert sorted(conn_id for conn_id, _ in results) == list(range(1, 61))
            await asyncio.sleep(0.05)
            assert server.ctx.connections == {}

    uvloop.run(scenario())


def test_register_and_dump_requests_reach_the_dump_sender(run: Callable[..., Any]) -> None:
    stub = Stub()

    async def scenario() -> None:
        async with serving(stub) as server:
            # A MySQL replica: register, then COM_BINLOG_DUMP_GTID.
            conn = await UpstreamConnection.connect(*server.address, "sha", SHA_PW)
            await conn.query("SET @source_binlog_checksum = 'CRC32'")
            await conn.register_slave(501, "replica-a", 3306, "ru", "report-secret")
            state = server.ctx.connections[conn.connection_id]
            assert state.registration is not None and state.registration.master_id == 77
            assert server.ctx.replicas() == [state]
            await conn.binlog_dump_gtid(501, b"\x01" * 24, flags=P.BINLOG_THROUGH_GTID)
            payloads = await conn.read_packets()
            assert P.is_eof(payloads[-1])
            await conn.close()
            # A MariaDB replica in GTID mode: COM_BINLOG_DUMP with @slave_connect_state.
            conn = await UpstreamConnection.connect(*server.address, "native", NATIVE_PW)
            await conn.query("SET @slave_connect_state='0-1-5'")
            await conn.binlog_dump("", 4, 502, flags=P.BINLOG_SEND_ANNOTATE_ROWS_EVENT)
            assert P.is_eof((await conn.read_packets())[-1])
            await conn.close()
            # File/position.
            conn = await UpstreamConnection.connect(*server.address, "native", NATIVE_PW)
            await conn.binlog_dump("mysql-bin.000007", 1234, 503, flags=P.BINLOG_DUMP_NON_BLOCK)
            assert P.is_eof((await conn.read_packets())[-1])
            await conn.close()

            assert stub.dumps == [
                DumpRequest("mysql-gtid", 501, P.BINLOG_THROUGH_GTID, "", 4, b"\x01" * 24),
                DumpRequest("mariadb-gtid", 502, 2, "", 4),
                DumpRequest("file", 503, 1, "mysql-bin.000007", 1234),
            ]
            assert [s.dump.mode for s in stub.dump_states] == ["mysql-gtid", "mariadb-gtid", "file"]
            assert stub.dump_states[0].registration.host == "replica-a"
            assert stub.dump_states[1].user_vars["slave_connect_state"] == "0-1-5"

            # A dump sender's MySQLError reaches the replica as ERR (1236 here), then the connection ends.
            async def refuse(conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
                raise MySQLError(1236, "HY000", "Could not find first log file name in binary log index file")

            stub.dump_body = refuse
            conn = await UpstreamConnection.connect(*server.address, "native", NATIVE_PW)
            await conn.binlog_dump("nope.000001", 4, 504)
            (reply,) = await conn.read_packets()
            assert parse_err(reply).code == 1236
            with pytest.raises(ConnectionLost):
                await conn.read_packets()
            await conn.close()

    run(scenario())


async def chunked(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_dump_channel_splits_large_payloads_and_resets_after_semi_sync_acks(run: Callable[..., Any]) -> None:
    """send() and send_stream() frame a 20 MiB payload as two packets and a payload of exactly 0xFFFFFF bytes as a
    full packet plus an empty one, with consecutive sequence ids (checked by reading them back with PacketDecoder);
    after a payload asking for a semi-sync ACK the numbering restarts at 1, and the ACK reaches receive()."""
    big = b"\x00" + bytes(range(256)) * (20 * 1024 * 1024 // 256)  # 20 MiB + 1: two packets
    exact = b"\x00" + b"e" * (P.MAX_CHUNK - 1)  # exactly 0xFFFFFF: a full packet and an empty one
    needs_ack = b"\x00\xef\x01needs-ack"
    stub = Stub()
    acks: list[bytes] = []

    async def body(conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
        if request.file == "broken":
            await channel.send(b"\x00first")
            await channel.send_stream(100, chunked(b"\x00" + b"x" * 89, 30))  # 90 bytes for 100 announced
            return
        channel.semi_sync = True  # as the dump sender sets it for a semi-sync replica
        await channel.send(big)
        await channel.send(exact)
        await channel.send_stream(len(big), chunked(big, 1_000_003))
        await channel.send_stream(len(exact), chunked(exact, 5_000_000))
        await channel.send(b"\x00\xef\x00small")
        await channel.send_stream(len(needs_ack), chunked(needs_ack, 1))  # the replica ACKs; numbering restarts
        acks.append(await channel.receive(timeout=5))
        await channel.send(b"\x00\xef\x00after-ack")
        await channel.send(b"\xfe\x00\x00\x02\x00")
        assert not channel.closed

    stub.dump_body = body

    async def scenario() -> None:
        async with serving(stub) as server:
            client = await RawClient.connect(server)
            await client.login("native", NATIVE_PW)
            client.send(P.com_binlog_dump("mysql-bin.000001", 4, 9), 0)
            received = [await client.packet(timeout=20) for _ in range(6)]
            ack = b"\xef" + struct.pack("<Q", 1234) + b"mysql-bin.000001"
            client.send(ack, 0)
            received += [await client.packet() for _ in range(2)]
            # The sequence id of each payload's last packet.
            assert [seq for seq, _ in received] == [2, 4, 6, 8, 9, 10, 1, 2]
            assert [p for _, p in received[:4]] == [big, exact, big, exact]
            assert [p for _, p in received[4:]] == [
                b"\x00\xef\x00small", needs_ack, b"\x00\xef\x00after-ack", b"\xfe\x00\x00\x02\x00"
            ]
            assert acks == [ack]
            assert await client.closed_by_server()
            client.close()

            # Chunks that do not add up to the announced size: the stream is corrupt, the connection dropped.
            client = await RawClient.connect(server)
            await client.login("native", NATIVE_PW)
            client.send(P.com_binlog_dump("broken", 4, 9), 0)
            assert await client.packet() == (1, b"\x00first")
            assert await client.closed_by_server()
            assert client.decoder.pending_bytes == 4 + 90  # half a packet: the replica sees a broken stream
            client.close()

    run(scenario())


def test_close_ends_listener_connections_and_dumps(run: Callable[..., Any]) -> None:
    stub = Stub()

    async def scenario() -> None:
        dumping = asyncio.Event()

        async def forever(conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
            await channel.send(b"\x00" + artificial_rotate("mysql-bin.000001", 4, 1, True))
            dumping.set()
            await asyncio.Event().wait()  # waits for new transactions that never come

        stub.dump_body = forever
        server = DownstreamServer(make_ctx(), PLAIN_USERS, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key())
        host, port = await server.start("127.0.0.1", 0)
        idle = await UpstreamConnection.connect(host, port, "native", NATIVE_PW)
        replica = await UpstreamConnection.connect(host, port, "sha", SHA_PW)
        await replica.binlog_dump("mysql-bin.000001", 4, 9)
        await asyncio.wait_for(dumping.wait(), 5)
        half = await RawClient.connect(server)
        await half.packet()  # greeting, then nothing
        assert len(server.ctx.connections) == 3

        await asyncio.wait_for(server.close(), 10)
        assert server.ctx.connections == {} and server.connection_count == 0 and stub.cancelled == 1
        with pytest.raises(ConnectionLost):
            await idle.query("SELECT 1")
        with pytest.raises(ConnectionLost):
            while True:
                await replica.read_packets()
        assert await half.closed_by_server()
        with pytest.raises(OSError):
            await asyncio.open_connection(host, port)
        for conn in (idle, replica):
            await conn.close()
        half.close()

    run(scenario())


def test_replica_disconnecting_mid_dump_cancels_the_sender() -> None:
    stub = Stub()

    async def scenario() -> None:
        waiting = asyncio.Event()

        async def body(conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
            waiting.set()
            await asyncio.sleep(30)

        stub.dump_body = body
        async with serving(stub) as server:
            replica = await UpstreamConnection.connect(*server.address, "native", NATIVE_PW)
            await replica.binlog_dump("mysql-bin.000001", 4, 9)
            await asyncio.wait_for(waiting.wait(), 5)
            replica.abort()
            for _ in range(100):
                if stub.cancelled:
                    break
                await asyncio.sleep(0.02)
            assert stub.cancelled == 1
            assert server.ctx.connections == {}

        # send() on a channel whose replica is gone raises ClientConnectionLost.
        errors: list[BaseException] = []
        gone = asyncio.Event()

        async def sender(conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
            try:
                await gone.wait()
                await channel.send(b"\x00event")
            except BaseException as exc:
                errors.append(exc)
                raise

        stub.dump_body = sender
        stub.cancelled = 0
        async with serving(stub) as server:
            replica = await UpstreamConnection.connect(*server.address, "native", NATIVE_PW)
            await replica.binlog_dump("mysql-bin.000001", 4, 9)
            await asyncio.sleep(0.05)
            replica.abort()
            await asyncio.sleep(0.05)
            gone.set()
            await asyncio.sleep(0.05)
        assert len(errors) == 1 and isinstance(errors[0], (ClientConnectionLost, asyncio.CancelledError))

    asyncio.run(scenario())


def test_mariadb_binlog_reads_a_dump(corpus_dir: Path, tls_files: dict[str, Path]) -> None:
    """mariadb-binlog --read-from-remote-server: handshake, its queries, COM_BINLOG_DUMP, then a real MariaDB file
    streamed through DumpChannel.send, decoded to the last event; in plain TCP (mysql_native_password) and over TLS
    (caching_sha2_password full authentication).

    libmariadb counts a connection as secure when TLS was merely *asked for* (its default here), so against a server
    without TLS it answers caching_sha2's full-auth request with the password in clear: the server refuses that
    (as MySQL does) without looking at it."""
    path = corpus_dir / MARIADB_FILE
    stub = Stub()
    stub.dump_body = serve_file(path, checksum=False)

    async def mariadb_binlog(server: DownstreamServer, user: str, password: str, *options: str) -> tuple[int, str, str]:
        host, port = server.address
        proc = await asyncio.create_subprocess_exec(
            "mariadb-binlog", "--read-from-remote-server", *options, "-h", host, "-P", str(port), "-u", user,
            f"-p{password}", path.name, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    def check_output(text: str) -> None:
        assert [f"GTID 0-1-{n}" in text for n in range(1, 21)] == [True] * 20
        assert "end_log_pos 3636" in text and "# End of log file" in text

    async def scenario() -> None:
        async with serving(stub, PLAIN_USERS, ctx=make_ctx("mariadb")) as server:
            code, text, err = await mariadb_binlog(server, "native", NATIVE_PW)
            assert (code, err) == (0, "")
            check_output(text)
            code, _, err = await mariadb_binlog(server, "sha", SHA_PW)
            assert code == 1 and "Access denied for user 'sha'@'127.0.0.1' (using password: YES)" in err
        tls = server_tls_context(tls_files["cert"], tls_files["key"])
        async with serving(stub, USERS, ctx=make_ctx("mariadb"), tls_context=tls) as server:
            code, text, err = await mariadb_binlog(server, "sha", SHA_PW, "--ssl", f"--ssl-ca={tls_files['cert']}")
            assert (code, err) == (0, "")
            check_output(text)
        assert [s.tls for s in stub.dump_states] == [False, True]
        assert stub.dumps == [DumpRequest("file", 0, 3, path.name, 4)] * 2
        assert stub.queries[0][1] == "SELECT VERSION()"

    asyncio.run(scenario())


def test_python_mysql_replication_reads_a_dump(corpus_dir: Path) -> None:
    """BinLogStreamReader: PyMySQL login (caching_sha2), its setup queries through the stub SQL layer, its
    COM_REGISTER_SLAVE and COM_BINLOG_DUMP, then a real MySQL 5.7 file decoded event by event; in MariaDB GTID
    mode its dump is recognised as mariadb-gtid. Also checks the greeting of a MariaDB-flavoured relay."""
    from pymysqlreplication import BinLogStreamReader

    path = corpus_dir / MYSQL_FILE
    stub = Stub()
    stub.dump_body = serve_file(path, checksum=True)

    async def scenario() -> None:
        async with serving(stub, PLAIN_USERS, ctx=make_ctx("mysql", "5.7.24-log")) as server:
            host, port = server.address

            def read() -> list[str]:
                reader = BinLogStreamReader(
                    connection_settings={"host": host, "port": port, "user": "sha", "password": SHA_PW},
                    server_id=1234, log_file=path.name, log_pos=4, resume_stream=True, blocking=False,
                    report_slave=("replica-host", "ru", "rp", 3307),
                )
                try:
                    return [type(event).__name__ for event in reader]
                finally:
                    reader.close()

            names = await asyncio.to_thread(read)
            assert names[:3] == ["RotateEvent", "FormatDescriptionEvent", "PreviousGtidsEvent"]
            assert names.count("GtidEvent") == 3 and names.count("WriteRowsEvent") == 2 and names[-1] == "XidEvent"
            assert len(names) == 1 + len(file_events(path))
            assert stub.dumps == [DumpRequest("file", 1234, 1, path.name, 4)]
            registration = stub.dump_states[0].registration
            assert (registration.server_id, registration.host, registration.port) == (1234, "replica-host", 3307)
            assert stub.dump_states[0].user_vars["master_binlog_checksum"] == "@@global.binlog_checksum"

        stub.dumps.clear()
        stub.dump_body = None
        async with serving(stub, PLAIN_USERS, ctx=make_ctx("mariadb")) as server:
            host, port = server.address

            def read_mariadb() -> tuple[str, list[Any]]:
                with pymysql.connect(host=host, port=port, user="native", password=NATIVE_PW) as conn:
                    version = conn.get_server_info()
                reader = BinLogStreamReader(
                    connection_settings={"host": host, "port": port, "user": "native", "password": NATIVE_PW},
                    server_id=1235, is_mariadb=True, auto_position="0-1-5", blocking=False,
                )
                try:
                    return version, list(reader)
                finally:
                    reader.close()

            version, events = await asyncio.to_thread(read_mariadb)
            assert version == "5.5.5-10.11.6-MariaDB-log" and events == []
            assert stub.dumps == [DumpRequest("mariadb-gtid", 1235, P.BINLOG_DUMP_NON_BLOCK, "", 4)]
            conn = await UpstreamConnection.connect(host, port, "native", NATIVE_PW)
            async with conn:
                assert conn.is_mariadb and conn.server_version == "10.11.6-MariaDB-log"

    asyncio.run(scenario())


def test_mariadb_replica_connects_registers_and_dumps(
    mariadb: Any, corpus_dir: Path, tls_files: dict[str, Path]
) -> None:
    """An unmodified mariadbd replica's IO thread against the server (stub answers to its queries): handshake with
    mysql_native_password, plain and over verified TLS, COM_REGISTER_SLAVE, COM_BINLOG_DUMP, then a real MariaDB
    binlog file received up to its last event. mariadbd cannot load caching_sha2_password: such an account fails
    on the replica's side (2059), which is why MariaDB replicas need mysql_native_password accounts."""
    path = corpus_dir / MARIADB_CRC_FILE
    stub = Stub()
    serve = serve_file(path, checksum=True)

    async def body(conn: ConnectionState, request: DumpRequest, channel: Any) -> None:
        await serve(conn, request, _WithoutEof(channel))
        await asyncio.sleep(60)  # a blocking dump: wait for more (until the replica stops)

    stub.dump_body = body
    replica = mariadb("replica", server_id=3)

    def status() -> dict[str, Any]:
        return replica_status(replica)

    async def wait_for(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        current: dict[str, Any] = {}
        for _ in range(150):
            current = await asyncio.to_thread(status)
            if predicate(current):
                return current
            await asyncio.sleep(0.1)
        raise AssertionError(f"replica never got there: {current}")

    async def scenario() -> None:
        tls = server_tls_context(tls_files["cert"], tls_files["key"])
        async with serving(stub, USERS, ctx=make_ctx("mariadb"), tls_context=tls) as server:
            host, port = server.address
            for user, ssl_options in (
                ("native", "MASTER_SSL=0"),
                ("nativetls", f"MASTER_SSL=1, MASTER_SSL_CA='{tls_files['cert']}', MASTER_SSL_VERIFY_SERVER_CERT=1"),
            ):
                await asyncio.to_thread(
                    replica.execute,
                    f"CHANGE MASTER TO MASTER_HOST='{host}', MASTER_PORT={port}, MASTER_USER='{user}', "
                    f"MASTER_PASSWORD='{NATIVE_PW}', MASTER_LOG_FILE='{path.name}', MASTER_LOG_POS=4, "
                    f"MASTER_USE_GTID=no, MASTER_CONNECT_RETRY=1, {ssl_options}",
                )
                await asyncio.to_thread(replica.execute, "START SLAVE IO_THREAD")
                current = await wait_for(lambda st: int(st["Read_Master_Log_Pos"]) == 912 or bool(st["Last_IO_Error"]))
                assert (current["Slave_IO_Running"], current["Last_IO_Error"]) == ("Yes", "")
                assert current["Master_Log_File"] == path.name
                await asyncio.to_thread(replica.execute, "STOP SLAVE")
                await asyncio.to_thread(replica.execute, "RESET SLAVE")
            assert stub.dumps == [DumpRequest("file", 3, 0, path.name, 4)] * 2
            assert [(s.user, s.tls, s.registration.server_id) for s in stub.dump_states] == [
                ("native", False, 3), ("nativetls", True, 3)
            ]
            assert stub.dump_states[0].user_vars["mariadb_slave_capability"] == "4"
            for _ in range(50):
                if stub.cancelled == 2:
                    break
                await asyncio.sleep(0.02)
            assert stub.cancelled == 2  # STOP SLAVE closed the connection: the waiting dump was cancelled

            await asyncio.to_thread(
                replica.execute,
                f"CHANGE MASTER TO MASTER_HOST='{host}', MASTER_PORT={port}, MASTER_USER='sha', "
                f"MASTER_PASSWORD='{SHA_PW}', MASTER_LOG_FILE='{path.name}', MASTER_LOG_POS=4, MASTER_SSL=0",
            )
            await asyncio.to_thread(replica.execute, "START SLAVE IO_THREAD")
            current = await wait_for(lambda st: bool(st["Last_IO_Error"]))
            assert current["Last_IO_Errno"] == 2059 and "caching_sha2_password" in current["Last_IO_Error"]
            await asyncio.to_thread(replica.execute, "STOP SLAVE")

    asyncio.run(scenario())


class _WithoutEof:
    """A channel wrapper that drops the EOF, so that serve_file's stream looks like a blocking dump."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    async def send(self, payload: bytes) -> None:
        if payload[:1] != b"\xfe":
            await self._channel.send(payload)
