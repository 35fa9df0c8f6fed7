"""Server side of replies: OK, ERR and EOF packets and text-protocol result sets (column definitions with types
inferred from the values), framed for clients with and without CLIENT_DEPRECATE_EOF (sans-I/O: values in, packet
payloads out)."""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .packets import (
    CHARSET_UTF8MB4_GENERAL_CI,
    CLIENT_DEPRECATE_EOF,
    CLIENT_PROTOCOL_41,
    EOF_HEADER,
    ERR_HEADER,
    OK_HEADER,
    SERVER_STATUS_AUTOCOMMIT,
    lenenc_bytes,
    lenenc_int,
)

# ---------------------------------------------------------------------------------------------
# Responses: what the SQL layer answers with, encoded below into packets.


@dataclass(frozen=True)
class OkResponse:
    affected_rows: int = 0
    last_insert_id: int = 0
    info: str = ""
    warnings: int = 0


@dataclass(frozen=True)
class ResultSet:
    """A text-protocol result set. Values are str, bytes, int, float or None (SQL NULL)."""

    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True)
class ErrorResponse:
    code: int
    sqlstate: str
    message: str


@dataclass(frozen=True)
class CloseConnection:
    """No answer: the server logs ``reason`` and closes the connection. A replica's IO thread takes that as a
    network error and connects again later, where an answer it cannot use would stop it for good."""

    reason: str


Response = OkResponse | ResultSet | ErrorResponse | CloseConnection


_U16 = struct.Struct("<H")
_ERR_HEAD = struct.Struct("<BH")
_EOF = struct.Struct("<BHH")
_COLUMN_FIXED = struct.Struct("<BHIBHB2x")  # 0x0c, charset, length, type, flags, decimals, filler

# Column types (include/field_types.h) the relay's answers need.
MYSQL_TYPE_DOUBLE = 5
MYSQL_TYPE_NULL = 6
MYSQL_TYPE_LONGLONG = 8
MYSQL_TYPE_DATE = 10
MYSQL_TYPE_DATETIME = 12
MYSQL_TYPE_NEWDECIMAL = 246
MYSQL_TYPE_VAR_STRING = 253

# Column flags.
NOT_NULL_FLAG = 1
UNSIGNED_FLAG = 32
BINARY_FLAG = 128
NUM_FLAG = 32768

CHARSET_BINARY = 63
# "Not a fixed number of decimals" (NOT_FIXED_DEC): what MySQL reports for DOUBLE expressions.
_NOT_FIXED_DEC = 31
# MYSQL_ERRMSG_SIZE: clients copy the message into a 512-byte buffer.
MAX_ERROR_MESSAGE = 511
# The text row marker for SQL NULL.
_NULL = b"\xfb"


# -- generic packets ----------------------------------------------------------------------------------------------


def encode_ok(
    ok: OkResponse | None = None, *, status: int = SERVER_STATUS_AUTOCOMMIT, header: int = OK_HEADER
) -> bytes:
    """An OK packet. `header` 0xFE makes it the result-set terminator of CLIENT_DEPRECATE_EOF clients.

    The info text goes as the rest of the packet: we never offer CLIENT_SESSION_TRACK, which would make it lenenc.
    """
    ok = ok or OkResponse()
    return b"".join(
        (
            bytes((header,)),
            lenenc_int(ok.affected_rows),
            lenenc_int(ok.last_insert_id),
            _U16.pack(status & 0xFFFF),
            _U16.pack(min(ok.warnings, 0xFFFF)),
            ok.info.encode("utf-8", "surrogateescape"),
        )
    )


def encode_error(code: int, sqlstate: str, message: str, *, protocol41: bool = True) -> bytes:
    """An ERR packet. Without CLIENT_PROTOCOL_41 (never negotiated here, but possible before the handshake
    response is known) the '#' + SQLSTATE marker is left out, as MySQL does. Long messages are cut to what
    clients keep (511 bytes), on a character boundary."""
    if not 0 <= code <= 0xFFFF:
        raise ValueError(f"error code {code} does not fit a u16")
    state = sqlstate.encode("ascii", "replace")
    if len(state) != 5:
        raise ValueError(f"SQLSTATE must be 5 characters, got {sqlstate!r}")
    text = message.encode("utf-8", "surrogateescape")
    if len(text) > MAX_ERROR_MESSAGE:
        text = text[:MAX_ERROR_MESSAGE].decode("utf-8", "ignore").encode("utf-8")
    head = _ERR_HEAD.pack(ERR_HEADER, code)
    return head + b"#" + state + text if protocol41 else head + text


def encode_error_response(error: ErrorResponse, *, protocol41: bool = True) -> bytes:
    return encode_error(error.code, error.sqlstate, error.message, protocol41=protocol41)


def encode_eof(warnings: int = 0, status: int = SERVER_STATUS_AUTOCOMMIT) -> bytes:
    """A classic (pre-DEPRECATE_EOF) EOF packet: 0xFE, warnings, status."""
    return _EOF.pack(EOF_HEADER, min(warnings, 0xFFFF), status & 0xFFFF)


# -- result sets --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnDefinition:
    """What a ColumnDefinition41 packet says about one result column."""

    name: str
    type: int
    charset: int
    length: int
    flags: int = 0
    decimals: int = 0


def encode_column_definition(column: ColumnDefinition) -> bytes:
    """ColumnDefinition41 for a computed column: catalog "def", no schema or table, org_name = name."""
    name = lenenc_bytes(column.name.encode("utf-8", "surrogateescape"))
    return b"".join(
        (
            b"\x03def",  # catalog
            b"\x00",  # schema
            b"\x00",  # table
            b"\x00",  # org_table
            name,
            name,  # org_name
            _COLUMN_FIXED.pack(
                0x0C, column.charset, min(column.length, 0xFFFFFFFF), column.type, column.flags, column.decimals
            ),
        )
    )


def infer_column(name: str, values: Sequence[Any], *, charset: int = CHARSET_UTF8MB4_GENERAL_CI) -> ColumnDefinition:
    """A column definition that fits every value of the column: LONGLONG for integers (UNSIGNED past 2^63-1),
    DOUBLE for floats, NEWDECIMAL for Decimals, DATETIME/DATE, VAR_STRING in utf8mb4 for text, VAR_STRING in
    the binary charset for bytes, the NULL type when every value is NULL; mixed columns are text.

    Clients mostly read the text values, but some (PyMySQL's converters, HA tools) turn a column into Python
    ints or dates by its type, so numbers must not look like strings."""
    present = [v for v in values if v is not None]
    flags = 0 if len(present) < len(values) else NOT_NULL_FLAG
    kinds = {_kind(v) for v in present}
    if not kinds:
        return ColumnDefinition(name, MYSQL_TYPE_NULL, CHARSET_BINARY, 0, BINARY_FLAG)
    widths = [len(_text(v)) for v in present]
    width = max(widths)
    if kinds == {"int"}:
        unsigned = any(v > 0x7FFFFFFFFFFFFFFF for v in present)
        numeric_flags = flags | BINARY_FLAG | NUM_FLAG | (UNSIGNED_FLAG if unsigned else 0)
        return ColumnDefinition(name, MYSQL_TYPE_LONGLONG, CHARSET_BINARY, max(width, 1), numeric_flags)
    if kinds <= {"int", "float"}:
        return ColumnDefinition(
            name, MYSQL_TYPE_DOUBLE, CHARSET_BINARY, max(width, 1), flags | BINARY_FLAG | NUM_FLAG, _NOT_FIXED_DEC
        )
    if kinds <= {"int", "decimal"}:
        scale = max((-v.as_tuple().exponent for v in present if isinstance(v, decimal.Decimal)), default=0)
        return ColumnDefinition(
            name, MYSQL_TYPE_NEWDECIMAL, CHARSET_BINARY, width + 1, flags | BINARY_FLAG | NUM_FLAG, max(0, scale)
        )
    if kinds == {"datetime"}:
        return ColumnDefinition(name, MYSQL_TYPE_DATETIME, CHARSET_BINARY, width, flags | BINARY_FLAG)
    if kinds == {"date"}:
        return ColumnDefinition(name, MYSQL_TYPE_DATE, CHARSET_BINARY, width, flags | BINARY_FLAG)
    if kinds == {"bytes"}:
        return ColumnDefinition(name, MYSQL_TYPE_VAR_STRING, CHARSET_BINARY, width, flags | BINARY_FLAG)
    # Text: the length is in characters times the character set's widest form (4 for utf8mb4), as MySQL reports.
    chars = max(len(v) if isinstance(v, str) else len(_text(v)) for v in present)
    return ColumnDefinition(name, MYSQL_TYPE_VAR_STRING, charset, max(chars, 1) * 4, flags)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "int"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "datetime"
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, str):
        return "str"
    raise TypeError(f"cannot send a {type(value).__name__} value in a result set")


def _text(value: Any) -> bytes:
    """A value in the text protocol's form."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int):
        return str(value).encode("ascii")
    if isinstance(value, float):
        text = repr(value)
        # MySQL prints integral doubles without a fraction (SELECT 2e0 -> 2).
        return (text[:-2] if text.endswith(".0") else text).encode("ascii")
    if isinstance(value, datetime.datetime):
        return value.isoformat(" ").encode("ascii")
    if isinstance(value, (decimal.Decimal, datetime.date)):
        return str(value).encode("ascii")
    raise TypeError(f"cannot send a {type(value).__name__} value in a result set")


def encode_text_row(values: Sequence[Any]) -> bytes:
    """One text-protocol row: a length-encoded string per value, 0xFB for NULL."""
    return b"".join(_NULL if v is None else lenenc_bytes(_text(v)) for v in values)


def encode_result_set(
    result: ResultSet,
    *,
    deprecate_eof: bool,
    status: int = SERVER_STATUS_AUTOCOMMIT,
    charset: int = CHARSET_UTF8MB4_GENERAL_CI,
) -> list[bytes]:
    """The payloads of a text result set: column count, column definitions, [EOF], rows, then EOF or (with
    CLIENT_DEPRECATE_EOF) an OK packet with the 0xFE header. A result set without columns is an OK packet.

    Raises ValueError for a row whose width differs from the columns', TypeError for a value that has no text
    form; both name the row and column, so that the SQL layer's bug is easy to find."""
    columns = list(result.columns)
    if not columns:
        return [encode_ok(status=status)]
    rows = list(result.rows)
    for number, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"result row {number} has {len(row)} values for {len(columns)} columns {columns}")
    definitions = []
    for index, name in enumerate(columns):
        try:
            definitions.append(infer_column(str(name), [row[index] for row in rows], charset=charset))
        except TypeError as exc:
            raise TypeError(f"column {name!r}: {exc}") from None
    payloads = [lenenc_int(len(columns))]
    payloads += [encode_column_definition(d) for d in definitions]
    if not deprecate_eof:
        payloads.append(encode_eof(0, status))
    payloads += [encode_text_row(row) for row in rows]
    payloads.append(encode_ok(status=status, header=EOF_HEADER) if deprecate_eof else encode_eof(0, status))
    return payloads


def encode_response(
    response: Response, *, capabilities: int, status: int = SERVER_STATUS_AUTOCOMMIT
) -> list[bytes]:
    """The payloads answering one command, framed for a client with these negotiated `capabilities`."""
    if isinstance(response, OkResponse):
        return [encode_ok(response, status=status)]
    if isinstance(response, ErrorResponse):
        return [encode_error_response(response, protocol41=bool(capabilities & CLIENT_PROTOCOL_41))]
    if isinstance(response, ResultSet):
        return encode_result_set(response, deprecate_eof=bool(capabilities & CLIENT_DEPRECATE_EOF), status=status)
    raise TypeError(f"not a response with packets: {type(response).__name__}")  # CloseConnection has none


__all__ = [
    "ColumnDefinition",
    "encode_column_definition",
    "encode_eof",
    "encode_error",
    "encode_error_response",
    "encode_ok",
    "encode_response",
    "encode_result_set",
    "encode_text_row",
    "infer_column",
]
