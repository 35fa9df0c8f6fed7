"""Client side of the connection phase: parse the server's HandshakeV10, choose capabilities, build the SSLRequest
and HandshakeResponse41 (protocol-reference §3.2-3.3)."""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import CR_SERVER_HANDSHAKE_ERR
from .packets import (
    CHARSET_UTF8MB4_GENERAL_CI,
    CLIENT_CONNECT_ATTRS,
    CLIENT_CONNECT_WITH_DB,
    CLIENT_LONG_FLAG,
    CLIENT_LONG_PASSWORD,
    CLIENT_PLUGIN_AUTH,
    CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA,
    CLIENT_PROTOCOL_41,
    CLIENT_SECURE_CONNECTION,
    CLIENT_SSL,
    CLIENT_TRANSACTIONS,
    ERR_HEADER,
    ProtocolError,
    lenenc_bytes,
    parse_err,
    read_nul_bytes,
)

PROTOCOL_VERSION = 10
# MariaDB >= 10 puts this in front of its version so that old MySQL replicas accept it (RPL_VERSION_HACK).
MARIADB_VERSION_PREFIX = "5.5.5-"
# What we announce as max_packet: the most a server lets a packet grow to (max_allowed_packet <= 1 GiB).
DEFAULT_MAX_PACKET = 1 << 30
DEFAULT_AUTH_PLUGIN = "mysql_native_password"

_HEAD = struct.Struct("<I8sxHBHHB10s")  # connection id .. reserved, right after the version's NUL
_RESPONSE_HEAD = struct.Struct("<IIB23x")
_VERSION_NUMBERS = re.compile(r"(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True, slots=True)
class HandshakeV10:
    """The server greeting, as parsed; `auth_plugin_data` is the whole scramble (parts 1 and 2, without the NUL)."""

    server_version: str
    connection_id: int
    auth_plugin_data: bytes
    capabilities: int
    character_set: int
    status_flags: int
    auth_plugin_name: str
    # MariaDB's extended capabilities (upper 32 bits, shifted down); 0 for MySQL.
    mariadb_capabilities: int = 0

    @property
    def is_mariadb(self) -> bool:
        """MariaDB says so in its version, and clears CLIENT_LONG_PASSWORD (its CLIENT_MYSQL) in the greeting."""
        return "mariadb" in self.server_version.lower() or not self.capabilities & CLIENT_LONG_PASSWORD

    @property
    def version(self) -> str:
        """The server version without MariaDB's "5.5.5-" replication prefix, as libmariadb reports it."""
        if self.server_version.startswith(MARIADB_VERSION_PREFIX) and self.is_mariadb:
            return self.server_version[len(MARIADB_VERSION_PREFIX) :]
        return self.server_version

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        """(major, minor, patch) of `version`; ProtocolError if it does not start with one (a replica needs it)."""
        match = _VERSION_NUMBERS.match(self.version)
        if match is None:
            raise ProtocolError(f"server version {self.version!r} does not start with major.minor.patch")
        major, minor, patch = (int(part) for part in match.groups())
        return major, minor, patch

    @property
    def supports_tls(self) -> bool:
        return bool(self.capabilities & CLIENT_SSL)


def parse_handshake(payload: bytes) -> HandshakeV10:
    """Parse the server's first packet.

    Raises the server's MySQLError when it is an ERR packet (too many connections, host blocked, ...) and
    ProtocolError when it is not a protocol-10 greeting a 4.1+ client can use.
    """
    payload = bytes(payload)
    if not payload:
        raise ProtocolError("empty greeting packet", code=CR_SERVER_HANDSHAKE_ERR)
    if payload[0] == ERR_HEADER:
        raise parse_err(payload)
    if payload[0] != PROTOCOL_VERSION:
        raise ProtocolError(
            f"server speaks protocol version {payload[0]}, only {PROTOCOL_VERSION} is supported",
            code=CR_SERVER_HANDSHAKE_ERR,
        )
    raw_version, pos = read_nul_bytes(payload, 1, "server version in the greeting")
    server_version = raw_version.decode("utf-8", "replace")
    if len(payload) < pos + _HEAD.size:
        raise ProtocolError(
            f"greeting from {server_version!r} is too short ({len(payload)} bytes) for a 4.1+ server",
            code=CR_SERVER_HANDSHAKE_ERR,
        )
    connection_id, part1, caps_low, charset, status, caps_high, auth_data_len, reserved = _HEAD.unpack_from(
        payload, pos
    )
    pos += _HEAD.size
    capabilities = caps_low | caps_high << 16
    if not capabilities & CLIENT_PROTOCOL_41 or not capabilities & CLIENT_SECURE_CONNECTION:
        raise ProtocolError(
            f"server {server_version!r} lacks CLIENT_PROTOCOL_41/CLIENT_SECURE_CONNECTION (pre-4.1 servers are "
            "not supported)",
            code=CR_SERVER_HANDSHAKE_ERR,
        )
    mariadb_caps = 0
    if not capabilities & CLIENT_LONG_PASSWORD:
        mariadb_caps = int.from_bytes(reserved[6:10], "little")

    # Part 2 is max(13, len - 8) bytes, the last of them a NUL that is not part of the scramble.
    part2_len = max(13, auth_data_len - 8)
    part2 = payload[pos : pos + part2_len]
    if len(part2) < part2_len:
        raise ProtocolError("greeting truncated inside the scramble", code=CR_SERVER_HANDSHAKE_ERR)
    pos += part2_len
    if part2.endswith(b"\0"):
        part2 = part2[:-1]

    plugin = DEFAULT_AUTH_PLUGIN
    if capabilities & CLIENT_PLUGIN_AUTH:
        # MySQL 5.5.7-5.5.9 sent the name without its NUL; take what is there.
        end = payload.find(b"\0", pos)
        raw_plugin = payload[pos : end if end >= 0 else len(payload)]
        plugin = raw_plugin.decode("ascii", "replace") or DEFAULT_AUTH_PLUGIN
    return HandshakeV10(
        server_version=server_version,
        connection_id=connection_id,
        auth_plugin_data=part1 + part2,
        capabilities=capabilities,
        character_set=charset,
        status_flags=status,
        auth_plugin_name=plugin,
        mariadb_capabilities=mariadb_caps,
    )


def client_capabilities(
    server: HandshakeV10, *, tls: bool, database: bool = False, connect_attrs: bool = True
) -> int:
    """The capabilities this client asks for, given what `server` offers.

    CLIENT_LONG_PASSWORD is always set: MariaDB reads it as CLIENT_MYSQL, "no extended capabilities follow".
    CLIENT_DEPRECATE_EOF is never set: result sets then keep their EOF packets and a non-blocking dump keeps its
    short EOF terminator, which is what the rest of the relay expects. No compression, multi-statements or LOCAL
    INFILE: a replica needs none of them and each is attack surface.
    """
    caps = (
        CLIENT_LONG_PASSWORD
        | CLIENT_LONG_FLAG
        | CLIENT_PROTOCOL_41
        | CLIENT_TRANSACTIONS
        | CLIENT_SECURE_CONNECTION
    )
    for optional in (CLIENT_PLUGIN_AUTH, CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA):
        caps |= optional & server.capabilities
    if connect_attrs:
        caps |= CLIENT_CONNECT_ATTRS & server.capabilities
    if database:
        caps |= CLIENT_CONNECT_WITH_DB
    if tls:
        if not server.capabilities & CLIENT_SSL:
            raise ValueError("TLS requested but the server does not offer CLIENT_SSL")
        caps |= CLIENT_SSL
    return caps


def build_ssl_request(
    capabilities: int, charset: int = CHARSET_UTF8MB4_GENERAL_CI, max_packet: int = DEFAULT_MAX_PACKET
) -> bytes:
    """SSLRequest payload: the first 32 bytes of a HandshakeResponse41 with CLIENT_SSL; the TLS handshake follows."""
    if not capabilities & CLIENT_SSL:
        raise ValueError("an SSLRequest must carry CLIENT_SSL")
    return _RESPONSE_HEAD.pack(capabilities, max_packet, charset)


def build_handshake_response(
    capabilities: int,
    user: str,
    auth_response: bytes,
    *,
    plugin_name: str = DEFAULT_AUTH_PLUGIN,
    database: str | None = None,
    connect_attrs: Mapping[str, str] | None = None,
    charset: int = CHARSET_UTF8MB4_GENERAL_CI,
    max_packet: int = DEFAULT_MAX_PACKET,
) -> bytes:
    """HandshakeResponse41 payload (protocol-reference §3.3), laid out as `capabilities` say."""
    if not capabilities & CLIENT_PROTOCOL_41:
        raise ValueError("HandshakeResponse41 needs CLIENT_PROTOCOL_41")
    parts = [_RESPONSE_HEAD.pack(capabilities, max_packet, charset), user.encode("utf-8"), b"\0"]
    if capabilities & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA:
        parts.append(lenenc_bytes(auth_response))
    else:
        if len(auth_response) > 255:
            raise ValueError("auth response longer than 255 bytes needs CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA")
        parts += [bytes((len(auth_response),)), auth_response]
    if capabilities & CLIENT_CONNECT_WITH_DB:
        parts += [(database or "").encode("utf-8"), b"\0"]
    if capabilities & CLIENT_PLUGIN_AUTH:
        parts += [plugin_name.encode("ascii"), b"\0"]
    if capabilities & CLIENT_CONNECT_ATTRS:
        attrs = b"".join(
            lenenc_bytes(key.encode("utf-8")) + lenenc_bytes(value.encode("utf-8"))
            for key, value in (connect_attrs or {}).items()
        )
        parts.append(lenenc_bytes(attrs))
    return b"".join(parts)
