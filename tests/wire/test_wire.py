"""Sans-I/O wire protocol: framing, length-encoded values, generic packets, result sets, handshake and auth plugins."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import struct

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.wire import errors as E
from relayproxy.wire import packets as P
from relayproxy.wire.auth import (
    AuthenticationError,
    AuthSucceeded,
    AwaitServer,
    ClientAuthentication,
    SendAuthData,
)
from relayproxy.wire.handshake import (
    HandshakeV10,
    build_handshake_response,
    build_ssl_request,
    client_capabilities,
    parse_handshake,
)
from relayproxy.wire.packets import (
    MAX_CHUNK,
    MySQLError,
    PacketDecoder,
    ProtocolError,
    TextResultReader,
    encode_packet,
    is_eof,
    lenenc_bytes,
    lenenc_int,
    parse_eof,
    parse_err,
    parse_ok,
    read_lenenc_bytes,
    read_lenenc_int,
)

PASSWORD = "hunter2-Sécret"

# The first packet of a real mariadbd 10.11.19 (Debian 12), recorded from a raw socket to a sandbox
# (test_upstream_connection.py::test_real_greeting_parses checks the same against a live server).
MARIADB_10_11_GREETING = bytes.fromhex(
    "0a352e352e352d31302e31312e31392d4d6172696144422d302b646562313275312d6c6f6700050000004f40347e43702b2400fef7"
    "2d0200ff81150000000000001d0000006f28722c22624c32563d6a21006d7973716c5f6e61746976655f70617373776f726400"
)
# What that server stored for `CREATE USER ... IDENTIFIED VIA ed25519 USING PASSWORD('secret')`.
MARIADB_ED25519_PUBLIC_KEY_OF_SECRET = "ZIgUREUg5PVgQ6LskhXmO+eZLS0nC8be6HPjYWR4YJY"

OK = b"\x00\x00\x00\x02\x00\x00\x00"


def mysql8_greeting(scramble: bytes = b"abcdefghijklmnopqrst", plugin: bytes = b"caching_sha2_password") -> bytes:
    """A MySQL 8-style greeting (built by hand: no MySQL server here)."""
    caps = 0xDFFFFFFF  # MySQL 8 announces almost every flag, CLIENT_LONG_PASSWORD included
    return (
        b"\x0a8.0.36\x00"
        + struct.pack("<I", 42)
        + scramble[:8]
        + b"\x00"
        + struct.pack("<H", caps & 0xFFFF)
        + bytes((255,))
        + struct.pack("<H", 2)
        + struct.pack("<H", caps >> 16)
        + bytes((21,))
        + b"\x00" * 10
        + scramble[8:]
        + b"\x00"
        + plugin
        + b"\x00"
    )


# -- framing -----------------------------------------------------------------------------------------------------


def split_headers(wire: bytes) -> list[tuple[int, int]]:
    """(length, seq) of every packet in `wire`."""
    out, pos = [], 0
    while pos < len(wire):
        header = struct.unpack_from("<I", wire, pos)[0]
        out.append((header & 0xFFFFFF, header >> 24))
        pos += 4 + (header & 0xFFFFFF)
    assert pos == len(wire)
    return out


def test_small_packet_layout():
    assert encode_packet(b"\x03SELECT 1", 0) == b"\x09\x00\x00\x00\x03SELECT 1"
    assert encode_packet(b"", 7) == b"\x00\x00\x00\x07"
    assert encode_packet(b"x", 256 + 3) == b"\x01\x00\x00\x03x"


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (MAX_CHUNK - 1, [(MAX_CHUNK - 1, 5)]),
        (MAX_CHUNK, [(MAX_CHUNK, 5), (0, 6)]),  # exact multiple: a trailing empty packet says "done"
        (MAX_CHUNK + 10, [(MAX_CHUNK, 5), (10, 6)]),
        (2 * MAX_CHUNK, [(MAX_CHUNK, 5), (MAX_CHUNK, 6), (0, 7)]),
    ],
)
def test_large_payloads_split_and_reassemble(length, expected):
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    wire = encode_packet(payload, 5)
    assert split_headers(wire) == expected
    assert P.packet_count(length) == len(expected)

    decoder = PacketDecoder(keep_sequences=True)
    decoder.expect_sequence(5)
    # 64 KiB chunks, as a socket delivers them: nothing is complete until the last packet.
    for start in range(0, len(wire), 65536):
        decoder.feed(wire[start : start + 65536])
        if start + 65536 < len(wire):
            assert not decoder.has_payloads
    (seq, got), = decoder.packets()
    assert got == payload
    assert seq == expected[-1][1]
    assert decoder.next_seq == expected[-1][1] + 1
    assert decoder.pending_bytes == 0


def test_many_small_packets_come_out_in_one_batch_with_bytes_counted():
    payloads = [bytes([0]) + bytes([i % 256]) * (100 + i) for i in range(300)]
    wire = b"".join(encode_packet(p, i + 1) for i, p in enumerate(payloads))
    decoder = PacketDecoder()
    decoder.expect_sequence(1)
    decoder.feed(wire[:1000])
    decoder.feed(wire[1000:])
    assert decoder.buffered_bytes == sum(map(len, payloads))
    assert decoder.payloads() == payloads
    assert decoder.buffered_bytes == 0
    assert decoder.payloads() == []
    assert decoder.next_seq == 301 % 256


def test_byte_by_byte_feeding():
    payloads = [b"a" * 10, b"", b"b" * 300]
    wire = b"".join(encode_packet(p, i) for i, p in enumerate(payloads))
    decoder = PacketDecoder()
    for i in range(len(wire)):
        decoder.feed(wire[i : i + 1])
    assert decoder.payloads() == payloads


def test_sequence_ids_wrap_and_out_of_order_is_an_error():
    decoder = PacketDecoder()
    decoder.expect_sequence(254)
    decoder.feed(encode_packet(b"a", 254) + encode_packet(b"b", 255) + encode_packet(b"c", 0))
    assert decoder.payloads() == [b"a", b"b", b"c"]
    with pytest.raises(ProtocolError) as info:
        decoder.feed(encode_packet(b"d", 5))
    assert info.value.code == E.ER_NET_PACKETS_OUT_OF_ORDER
    assert "got sequence id 5, expected 1" in str(info.value)

    lenient = PacketDecoder()
    lenient.expect_sequence(None)
    lenient.feed(encode_packet(b"x", 9) + encode_packet(b"y", 3))
    assert lenient.payloads() == [b"x", b"y"]


def test_oversized_payload_is_refused_from_its_header():
    decoder = PacketDecoder(max_payload=1000)
    with pytest.raises(ProtocolError) as info:
        decoder.feed(b"\xff\xff\xff\x00" + b"x" * 10)  # announces 16 MiB: refused before buffering it
    assert info.value.code == E.CR_NET_PACKET_TOO_LARGE
    decoder = PacketDecoder(max_payload=MAX_CHUNK + 5)
    decoder.feed(encode_packet(b"y" * (MAX_CHUNK + 5), 0))
    assert len(decoder.payloads()[0]) == MAX_CHUNK + 5
    with pytest.raises(ProtocolError):
        decoder.feed(encode_packet(b"y" * (MAX_CHUNK + 6), 2))


def test_pending_bytes_show_a_cut_packet():
    decoder = PacketDecoder()
    wire = encode_packet(b"z" * 50, 0)
    decoder.feed(wire[:20])
    assert decoder.pending_bytes == 20 and not decoder.has_payloads
    decoder.feed(wire[20:])
    assert decoder.pending_bytes == 0 and decoder.payloads() == [b"z" * 50]


def test_packets_needs_keep_sequences():
    with pytest.raises(RuntimeError):
        PacketDecoder().packets()


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=600), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=20000), max_size=10),
    first_seq=st.integers(min_value=0, max_value=255),
)
def test_decoder_roundtrip_any_split(payloads, cuts, first_seq):
    wire = b""
    seq = first_seq
    for payload in payloads:
        wire += encode_packet(payload, seq)
        seq += P.packet_count(len(payload))
    decoder = PacketDecoder()
    decoder.expect_sequence(first_seq)
    out: list[bytes] = []
    previous = 0
    for cut in sorted(c % (len(wire) + 1) for c in cuts) + [len(wire)]:
        decoder.feed(wire[previous:cut])
        previous = cut
        out += decoder.payloads()
    assert out == payloads
    assert decoder.pending_bytes == 0


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=300), max_size=8), check=st.booleans())
def test_decoder_random_bytes_give_clear_errors(chunks, check):
    decoder = PacketDecoder(max_payload=1 << 20)
    if not check:
        decoder.expect_sequence(None)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            decoder.payloads()
    except ProtocolError as exc:
        assert exc.code in (E.ER_NET_PACKETS_OUT_OF_ORDER, E.CR_NET_PACKET_TOO_LARGE)


# -- length-encoded values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (250, b"\xfa"),
        (251, b"\xfc\xfb\x00"),
        (0xFFFF, b"\xfc\xff\xff"),
        (0x10000, b"\xfd\x00\x00\x01"),
        (0xFFFFFF, b"\xfd\xff\xff\xff"),
        (0x1000000, b"\xfe\x00\x00\x00\x01\x00\x00\x00\x00"),
        (2**64 - 1, b"\xfe" + b"\xff" * 8),
    ],
)
def test_lenenc_int_boundaries(value, encoded):
    assert lenenc_int(value) == encoded
    assert read_lenenc_int(b"junk" + encoded + b"more", 4) == (value, 4 + len(encoded))


def test_lenenc_errors():
    for bad in (b"", b"\xfc\x01", b"\xfd\x01\x02", b"\xfe" + b"\x00" * 7):
        with pytest.raises(ProtocolError, match="truncated"):
            read_lenenc_int(bad, 0)
    for prefix in (b"\xfb", b"\xff"):
        with pytest.raises(ProtocolError, match="invalid length-encoded integer prefix"):
            read_lenenc_int(prefix, 0)
    with pytest.raises(ValueError):
        lenenc_int(-1)
    with pytest.raises(ValueError):
        lenenc_int(2**64)
    assert read_lenenc_bytes(lenenc_bytes(b"abc") + b"!", 0) == (b"abc", 4)
    with pytest.raises(ProtocolError, match="runs past"):
        read_lenenc_bytes(b"\x05abc", 0)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lenenc_roundtrip(value):
    encoded = lenenc_int(value)
    assert read_lenenc_int(encoded, 0) == (value, len(encoded))


# -- OK / ERR / EOF ----------------------------------------------------------------------------------------------


def test_parse_ok():
    ok = parse_ok(b"\x00\xfc\x00\x01\x05\x02\x00\x01\x00info")
    assert (ok.affected_rows, ok.last_insert_id, ok.status_flags, ok.warnings, ok.info) == (256, 5, 2, 1, b"info")
    with pytest.raises(ProtocolError):
        parse_ok(b"\x00\x01\x02")
    with pytest.raises(ProtocolError):
        parse_ok(b"\xff\x00")


def test_parse_err_with_and_without_sqlstate():
    err = parse_err(b"\xff\x15\x04#28000Access denied for user 'repl'@'localhost' (using password: YES)")
    assert isinstance(err, MySQLError)
    assert (err.code, err.sqlstate) == (1045, "28000")
    assert err.message.startswith("Access denied")
    assert str(err) == f"ERROR 1045 (28000): {err.message}"
    # Sent before the handshake (e.g. host blocked): no SQLSTATE marker.
    early = parse_err(b"\xff\x6a\x04Host '10.0.0.1' is not allowed to connect")
    assert (early.code, early.sqlstate, early.message) == (1130, "HY000", "Host '10.0.0.1' is not allowed to connect")
    with pytest.raises(ProtocolError):
        parse_err(b"\xff\x01")


def test_eof_detection():
    assert is_eof(b"\xfe\x00\x00\x02\x00")
    assert parse_eof(b"\xfe\x01\x00\x22\x00") == (1, 0x22)
    assert parse_eof(b"\xfe") == (0, 0)
    assert not is_eof(b"\xfe" + b"\x00" * 8)  # 9 bytes: a row or an event, not an EOF
    assert not is_eof(b"") and not is_eof(b"\x00")
    with pytest.raises(ProtocolError):
        parse_eof(b"\x00\x00")


def test_mysql_error_is_catchable_as_protocol_error_value_error():
    exc = ProtocolError("bad")
    assert isinstance(exc, MySQLError) and isinstance(exc, ValueError)
    assert exc.code == E.CR_MALFORMED_PACKET


# -- text result sets --------------------------------------------------------------------------------------------


def column_def(name: bytes) -> bytes:
    return (
        lenenc_bytes(b"def") + lenenc_bytes(b"") + lenenc_bytes(b"") + lenenc_bytes(b"") + lenenc_bytes(name)
        + lenenc_bytes(b"") + b"\x0c" + struct.pack("<HIBHB", 45, 20, 0xFD, 0, 0) + b"\x00\x00"
    )


def test_text_result_set():
    reader = TextResultReader()
    packets = [
        b"\x02",
        column_def(b"Variable_name"),
        column_def(b"wert"),
        b"\xfe\x00\x00\x02\x00",
        lenenc_bytes(b"server_id") + lenenc_bytes(b"1"),
        lenenc_bytes(b"gtid") + b"\xfb",
        lenenc_bytes(b"raw") + lenenc_bytes(b"\xff\x00"),
        b"\xfe\x00\x00\x02\x00",
    ]
    results = [reader.feed(p) for p in packets]
    assert results[:-1] == [None] * 7
    result = results[-1]
    assert result.columns == ["Variable_name", "wert"]
    assert result.rows[:2] == [("server_id", "1"), ("gtid", None)]
    assert result.rows[2][1].encode("utf-8", "surrogateescape") == b"\xff\x00"
    assert reader.done
    with pytest.raises(ProtocolError):
        reader.feed(b"\x00")


def test_text_result_ok_and_errors():
    result = TextResultReader().feed(b"\x00\x03\x07\x02\x00\x00\x00")
    assert (result.columns, result.rows, result.affected_rows, result.last_insert_id) == ([], [], 3, 7)
    with pytest.raises(MySQLError) as info:
        TextResultReader().feed(b"\xff\x28\x04#42000You have an error in your SQL syntax")
    assert info.value.code == 1064
    reader = TextResultReader()
    for packet in (b"\x01", column_def(b"a"), b"\xfe\x00\x00\x02\x00", lenenc_bytes(b"x")):
        assert reader.feed(packet) is None
    with pytest.raises(MySQLError) as info:
        reader.feed(b"\xff\x25\x05#70100Query execution was interrupted")  # mid-rows ERR
    assert (info.value.code, info.value.sqlstate) == (1317, "70100")
    with pytest.raises(ProtocolError, match="LOCAL INFILE"):
        TextResultReader().feed(b"\xfb/etc/passwd")
    reader = TextResultReader()
    for packet in (b"\x01", column_def(b"a"), b"\xfe\x00\x00\x02\x00"):
        reader.feed(packet)
    with pytest.raises(ProtocolError, match="after its 1 columns"):
        reader.feed(lenenc_bytes(b"x") + b"extra")


# -- commands ----------------------------------------------------------------------------------------------------


def test_replication_commands_layout():
    assert P.com_query("SELECT 'é'") == b"\x03SELECT '\xc3\xa9'"
    assert P.com_register_slave(7, "relay", 3306, "u", "p") == (
        b"\x15" + struct.pack("<I", 7) + b"\x05relay" + b"\x01u" + b"\x01p" + struct.pack("<HII", 3306, 0, 0)
    )
    assert P.com_binlog_dump("master-bin.000002", 1234, 99, 1) == (
        b"\x12" + struct.pack("<IHI", 1234, 1, 99) + b"master-bin.000002"
    )
    # One SID (16 bytes of "U") with one interval 1-5: n_sids, sid, n_intervals, start, end (exclusive).
    gtid_set = struct.pack("<Q", 1) + b"U" * 16 + struct.pack("<QQQ", 1, 1, 6)
    assert P.com_binlog_dump_gtid(99, gtid_set, flags=4) == (
        b"\x1e" + struct.pack("<HII", 4, 99, 0) + struct.pack("<QI", 4, len(gtid_set)) + gtid_set
    )
    with pytest.raises(ValueError):
        P.com_binlog_dump("f", 2**32, 1)
    with pytest.raises(ValueError):
        P.com_register_slave(1, host="h" * 256)


# -- handshake ---------------------------------------------------------------------------------------------------


def test_real_mariadb_greeting():
    hs = parse_handshake(MARIADB_10_11_GREETING)
    assert hs.server_version == "5.5.5-10.11.19-MariaDB-0+deb12u1-log"
    assert hs.version == "10.11.19-MariaDB-0+deb12u1-log"
    assert hs.version_tuple == (10, 11, 19)
    assert hs.is_mariadb
    assert hs.connection_id == 5
    assert hs.auth_plugin_data == b'O@4~Cp+$o(r,"bL2V=j!' and len(hs.auth_plugin_data) == 20
    assert hs.auth_plugin_name == "mysql_native_password"
    assert not hs.capabilities & P.CLIENT_LONG_PASSWORD  # MariaDB's "I am not MySQL" bit
    assert hs.capabilities & P.CLIENT_PLUGIN_AUTH and hs.capabilities & P.CLIENT_CONNECT_ATTRS
    assert not hs.supports_tls  # that server ran without certificates
    assert hs.mariadb_capabilities & P.MARIADB_CLIENT_STMT_BULK_OPERATIONS
    assert hs.character_set == 45


def test_mysql_greeting():
    hs = parse_handshake(mysql8_greeting())
    assert (hs.server_version, hs.version, hs.is_mariadb, hs.mariadb_capabilities) == ("8.0.36", "8.0.36", False, 0)
    assert hs.auth_plugin_data == b"abcdefghijklmnopqrst"
    assert hs.auth_plugin_name == "caching_sha2_password"
    assert hs.supports_tls


def test_greeting_errors():
    with pytest.raises(MySQLError) as info:
        parse_handshake(b"\xff\x10\x04Too many connections")
    assert info.value.code == 1040 and not isinstance(info.value, ProtocolError)
    with pytest.raises(ProtocolError, match="protocol version 9"):
        parse_handshake(b"\x09" + MARIADB_10_11_GREETING[1:])
    with pytest.raises(ProtocolError):
        parse_handshake(MARIADB_10_11_GREETING[:50])
    with pytest.raises(ProtocolError, match="NUL"):
        parse_handshake(b"\x0a5.7.1")
    odd_version = parse_handshake(b"\x0aweird" + MARIADB_10_11_GREETING[MARIADB_10_11_GREETING.index(b"\0") :])
    with pytest.raises(ProtocolError, match="does not start with"):
        assert odd_version.version_tuple


def _mutated_greeting(cut: int, position: int, value: int, tail: bytes) -> bytes:
    """The real greeting with one byte changed, cut short and given a random tail."""
    data = bytearray(MARIADB_10_11_GREETING)
    data[position % len(data)] = value
    return bytes(data[:cut]) + tail


@settings(max_examples=500, deadline=None)
@given(
    st.binary(max_size=200)
    | st.builds(
        _mutated_greeting,
        st.integers(0, len(MARIADB_10_11_GREETING)),
        st.integers(0, len(MARIADB_10_11_GREETING) - 1),
        st.integers(0, 255),
        st.binary(max_size=40),
    )
)
def test_random_greetings_give_clear_errors(data):
    try:
        hs = parse_handshake(data)
    except MySQLError:
        return
    assert isinstance(hs, HandshakeV10)
    with contextlib.suppress(ProtocolError):
        assert hs.version_tuple[0] >= 0
    assert isinstance(hs.is_mariadb, bool) and isinstance(hs.version, str)


def test_ssl_request_and_handshake_response_layout():
    hs = parse_handshake(mysql8_greeting())
    caps = client_capabilities(hs, tls=True)
    for flag in (
        P.CLIENT_LONG_PASSWORD, P.CLIENT_PROTOCOL_41, P.CLIENT_SECURE_CONNECTION, P.CLIENT_PLUGIN_AUTH,
        P.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA, P.CLIENT_CONNECT_ATTRS, P.CLIENT_SSL, P.CLIENT_TRANSACTIONS,
    ):
        assert caps & flag, hex(flag)
    for flag in (P.CLIENT_DEPRECATE_EOF, P.CLIENT_COMPRESS, P.CLIENT_LOCAL_FILES, P.CLIENT_MULTI_STATEMENTS):
        assert not caps & flag, hex(flag)

    ssl_request = build_ssl_request(caps)
    assert len(ssl_request) == 32
    assert struct.unpack_from("<IIB", ssl_request) == (caps, 1 << 30, 45)
    assert ssl_request[9:] == b"\x00" * 23

    auth = b"\x01" * 32
    response = build_handshake_response(
        caps, "repl", auth, plugin_name="caching_sha2_password", connect_attrs={"_client_name": "relayproxy"}
    )
    assert response[:32] == ssl_request
    pos = 32
    assert response[pos : pos + 5] == b"repl\x00"
    pos += 5
    assert response[pos] == 32 and response[pos + 1 : pos + 33] == auth
    pos += 33
    assert response[pos : pos + 22] == b"caching_sha2_password\x00"
    pos += 22
    attrs, end = read_lenenc_bytes(response, pos)
    assert end == len(response)
    assert attrs == lenenc_bytes(b"_client_name") + lenenc_bytes(b"relayproxy")

    # Without PLUGIN_AUTH_LENENC: a one-byte length; with CONNECT_WITH_DB: the database after the auth data.
    plain = build_handshake_response(P.CLIENT_PROTOCOL_41 | P.CLIENT_CONNECT_WITH_DB, "u", b"ab", database="db")
    assert plain[32:] == b"u\x00\x02abdb\x00"
    with pytest.raises(ValueError):
        client_capabilities(parse_handshake(MARIADB_10_11_GREETING), tls=True)  # that server has no TLS


# -- authentication ----------------------------------------------------------------------------------------------


def sha1(data: bytes) -> bytes:
    return hashlib.sha1(data).digest()


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def native_server_accepts(response: bytes, scramble: bytes, password: str) -> bool:
    """The server-side check of mysql_native_password (protocol-reference §3.4), written from the formula."""
    stored = sha1(sha1(password.encode()))
    return sha1(xor(response, sha1(scramble + stored))) == stored


def caching_sha2_server_accepts(response: bytes, scramble: bytes, password: str) -> bool:
    """The server-side fast-auth check of caching_sha2_password: it caches SHA256(SHA256(pw))."""
    cached = sha256(sha256(password.encode()))
    return sha256(xor(response, sha256(cached + scramble))) == cached


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def rsa_decrypt_password(key: rsa.RSAPrivateKey, cipher: bytes, scramble: bytes) -> bytes:
    """What the server does with an RSA-encrypted password: OAEP(SHA-1) decrypt, XOR with the scramble."""
    plain = key.decrypt(cipher, padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None))
    return bytes(b ^ scramble[i % len(scramble)] for i, b in enumerate(plain))


def start(auth: ClientAuthentication, greeting: bytes) -> tuple[str, bytes, bytes]:
    hs = parse_handshake(greeting)
    plugin, data = auth.initial_response(hs)
    return plugin, data, hs.auth_plugin_data


def test_native_password():
    auth = ClientAuthentication(PASSWORD, secure=False)
    plugin, data, scramble = start(auth, MARIADB_10_11_GREETING)
    assert plugin == "mysql_native_password" and len(data) == 20
    assert native_server_accepts(data, scramble, PASSWORD)
    assert not native_server_accepts(data, scramble, "wrong")
    step = auth.receive(OK)
    assert isinstance(step, AuthSucceeded) and auth.done
    assert ClientAuthentication("", secure=False).initial_response(parse_handshake(MARIADB_10_11_GREETING))[1] == b""


def test_wrong_password_error_passes_through_without_the_password():
    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, MARIADB_10_11_GREETING)
    with pytest.raises(MySQLError) as info:
        auth.receive(b"\xff\x15\x04#28000Access denied for user 'repl'@'127.0.0.1' (using password: YES)")
    assert info.value.code == 1045
    assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value)


def test_caching_sha2_fast_path():
    auth = ClientAuthentication(PASSWORD, secure=False)
    plugin, data, scramble = start(auth, mysql8_greeting())
    assert plugin == "caching_sha2_password" and len(data) == 32
    assert caching_sha2_server_accepts(data, scramble, PASSWORD)
    assert isinstance(auth.receive(b"\x01\x03"), AwaitServer)  # fast_auth_success, the OK follows
    assert isinstance(auth.receive(OK), AuthSucceeded)


def test_caching_sha2_full_auth_over_tls_sends_cleartext():
    auth = ClientAuthentication(PASSWORD, secure=True)
    start(auth, mysql8_greeting())
    step = auth.receive(b"\x01\x04")  # perform_full_authentication
    assert step == SendAuthData(PASSWORD.encode() + b"\0")
    assert PASSWORD not in repr(step) and PASSWORD not in repr(auth)
    assert isinstance(auth.receive(OK), AuthSucceeded)


def test_caching_sha2_full_auth_requests_the_rsa_key(rsa_key):
    auth = ClientAuthentication(PASSWORD, secure=False)
    _, _, scramble = start(auth, mysql8_greeting())
    assert auth.receive(b"\x01\x04") == SendAuthData(b"\x02")  # request the public key
    step = auth.receive(b"\x01" + public_pem(rsa_key))
    assert isinstance(step, SendAuthData) and len(step.data) == 256
    assert rsa_decrypt_password(rsa_key, step.data, scramble) == PASSWORD.encode() + b"\0"
    assert isinstance(auth.receive(OK), AuthSucceeded)


def test_caching_sha2_full_auth_with_a_configured_key(rsa_key):
    auth = ClientAuthentication(PASSWORD, secure=False, server_public_key=public_pem(rsa_key))
    _, _, scramble = start(auth, mysql8_greeting())
    step = auth.receive(b"\x01\x04")
    assert rsa_decrypt_password(rsa_key, step.data, scramble) == PASSWORD.encode() + b"\0"


def test_caching_sha2_full_auth_without_tls_key_or_key_request_fails_clearly():
    auth = ClientAuthentication(PASSWORD, secure=False, request_public_key=False)
    start(auth, mysql8_greeting())
    with pytest.raises(AuthenticationError) as info:
        auth.receive(b"\x01\x04")
    assert info.value.code == E.CR_AUTH_PLUGIN_ERR
    assert "secure connection" in info.value.message and PASSWORD not in str(info.value)


def test_caching_sha2_bad_key_and_bad_replies(rsa_key):
    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, mysql8_greeting())
    auth.receive(b"\x01\x04")
    with pytest.raises(AuthenticationError, match="not a PEM key"):
        auth.receive(b"\x01not a key")
    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, mysql8_greeting())
    with pytest.raises(ProtocolError, match="unknown fast-auth result"):
        auth.receive(b"\x01\x07")
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    auth = ClientAuthentication("p" * 90, secure=False, server_public_key=public_pem(small))
    start(auth, mysql8_greeting())
    with pytest.raises(AuthenticationError, match="too long"):
        auth.receive(b"\x01\x04")
    empty = ClientAuthentication("", secure=False)
    assert start(empty, mysql8_greeting())[1] == b"\0"


def test_sha256_password(rsa_key):
    greeting = mysql8_greeting(plugin=b"sha256_password")
    auth = ClientAuthentication(PASSWORD, secure=False)
    plugin, data, scramble = start(auth, greeting)
    assert (plugin, data) == ("sha256_password", b"\x01")  # its own key-request byte
    step = auth.receive(b"\x01" + public_pem(rsa_key))
    assert rsa_decrypt_password(rsa_key, step.data, scramble) == PASSWORD.encode() + b"\0"
    assert isinstance(auth.receive(OK), AuthSucceeded)

    tls = ClientAuthentication(PASSWORD, secure=True)
    assert start(tls, greeting)[1] == PASSWORD.encode() + b"\0"
    assert start(ClientAuthentication("", secure=False), greeting)[1] == b"\0"


def test_auth_switch_to_caching_sha2_uses_the_new_scramble():
    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, MARIADB_10_11_GREETING)
    new_scramble = b"ZYXWVUTSRQPONMLKJIHG"
    step = auth.receive(b"\xfecaching_sha2_password\x00" + new_scramble + b"\x00")
    assert auth.plugin_name == "caching_sha2_password"
    assert caching_sha2_server_accepts(step.data, new_scramble, PASSWORD)


def test_auth_switch_to_native_password():
    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, mysql8_greeting())
    new_scramble = b"0123456789abcdefghij"
    step = auth.receive(b"\xfemysql_native_password\x00" + new_scramble + b"\x00")
    assert native_server_accepts(step.data, new_scramble, PASSWORD)
    assert isinstance(auth.receive(OK), AuthSucceeded)


def test_auth_switch_to_ed25519_signs_with_the_key_mariadb_stores():
    auth = ClientAuthentication("secret", secure=False)
    start(auth, MARIADB_10_11_GREETING)
    nonce = bytes(range(32))
    step = auth.receive(b"\xfeclient_ed25519\x00" + nonce)
    assert len(step.data) == 64
    public = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(MARIADB_ED25519_PUBLIC_KEY_OF_SECRET + "="))
    public.verify(step.data, nonce)  # raises InvalidSignature if we derived the key differently from MariaDB

    short = ClientAuthentication("secret", secure=False)
    start(short, MARIADB_10_11_GREETING)
    with pytest.raises(ProtocolError, match="nonce is 20 bytes"):
        short.receive(b"\xfeclient_ed25519\x00" + nonce[:20])


def test_unsupported_and_refused_plugins():
    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, MARIADB_10_11_GREETING)
    with pytest.raises(AuthenticationError) as info:
        auth.receive(b"\xfeauth_gssapi_client\x00whatever")
    assert info.value.code == E.CR_AUTH_PLUGIN_CANNOT_LOAD
    assert "auth_gssapi_client" in info.value.message and PASSWORD not in str(info.value)

    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, MARIADB_10_11_GREETING)
    with pytest.raises(AuthenticationError, match="mysql_old_password"):
        auth.receive(b"\xfe")

    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, MARIADB_10_11_GREETING)
    with pytest.raises(AuthenticationError, match="without TLS"):
        auth.receive(b"\xfemysql_clear_password\x00")
    auth = ClientAuthentication(PASSWORD, secure=True)
    start(auth, MARIADB_10_11_GREETING)
    assert auth.receive(b"\xfemysql_clear_password\x00").data == PASSWORD.encode() + b"\0"


def test_server_defaulting_to_an_unknown_plugin_starts_with_native_password():
    auth = ClientAuthentication(PASSWORD, secure=False)
    plugin, data, scramble = start(auth, mysql8_greeting(plugin=b"client_ed25519"))
    assert plugin == "mysql_native_password" and native_server_accepts(data, scramble, PASSWORD)


def test_auth_protocol_errors():
    auth = ClientAuthentication(PASSWORD, secure=False)
    start(auth, MARIADB_10_11_GREETING)
    with pytest.raises(ProtocolError, match="unexpected AuthMoreData"):
        auth.receive(b"\x01\x03")  # native password has no extra round
    with pytest.raises(ProtocolError, match="unexpected packet 0x42"):
        auth.receive(b"\x42")
    with pytest.raises(ProtocolError, match="scramble is 5 bytes"):
        auth.receive(b"\xfemysql_native_password\x00short")
    auth.receive(OK)
    with pytest.raises(ProtocolError, match="after authentication succeeded"):
        auth.receive(OK)


@settings(max_examples=300, deadline=None)
@given(packets=st.lists(st.binary(max_size=80), min_size=1, max_size=4), secure=st.booleans())
def test_random_auth_packets_give_clear_errors(packets, secure):
    auth = ClientAuthentication(PASSWORD, secure=secure)
    start(auth, mysql8_greeting())
    try:
        for packet in packets:
            step = auth.receive(packet)
            assert isinstance(step, SendAuthData | AwaitServer | AuthSucceeded)
            if isinstance(step, AuthSucceeded):
                break
    except MySQLError as exc:
        assert PASSWORD not in str(exc)


@settings(max_examples=300, deadline=None)
@given(packets=st.lists(st.binary(max_size=60), min_size=1, max_size=6))
def test_random_result_packets_give_clear_errors(packets):
    reader = TextResultReader()
    try:
        for packet in packets:
            reader.feed(packet)
    except MySQLError:
        pass
