"""MySQL/MariaDB wire protocol, sans-I/O: packet framing, generic packets, result sets, handshake and auth."""

from .auth import AuthenticationError, AuthSucceeded, AwaitServer, ClientAuthentication, SendAuthData
from .handshake import HandshakeV10, build_handshake_response, build_ssl_request, client_capabilities, parse_handshake
from .packets import (
    MySQLError,
    OkPacket,
    PacketDecoder,
    ProtocolError,
    QueryResult,
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

__all__ = [
    "AuthSucceeded",
    "AuthenticationError",
    "AwaitServer",
    "ClientAuthentication",
    "HandshakeV10",
    "MySQLError",
    "OkPacket",
    "PacketDecoder",
    "ProtocolError",
    "QueryResult",
    "SendAuthData",
    "TextResultReader",
    "build_handshake_response",
    "build_ssl_request",
    "client_capabilities",
    "encode_packet",
    "is_eof",
    "lenenc_bytes",
    "lenenc_int",
    "parse_eof",
    "parse_err",
    "parse_handshake",
    "parse_ok",
    "read_lenenc_bytes",
    "read_lenenc_int",
]
