"""MySQL 8.3+ ``mysql::serialization`` primitives: variable-length integers and length-prefixed strings."""

# The format is defined by libs/mysql/serialization/variable_length_integers.h and
# primitive_type_codec.h in the MySQL source (8.3+).  In short:
#
# * An unsigned integer takes 1 to 9 bytes.  The number of trailing 1-bits of the
#   first byte is the number of bytes that follow; the value's low bits sit above
#   the terminating 0-bit of the first byte and continue, little-endian, in the
#   following bytes.  k bytes carry 7*k bits for k <= 8; a first byte of 0xff
#   means 8 whole bytes follow, so any 64-bit value fits in 9 bytes.
# * A signed integer is stored as the unsigned integer (x << 1) for x >= 0 and
#   ((-(x + 1)) << 1) | 1 for x < 0: the sign lives in the lowest bit, so small
#   magnitudes of either sign stay short.
# * A string is its byte length as an unsigned varlen integer, then the bytes.
#
# Readers accept non-minimal encodings (a small value spread over more bytes than
# needed), because MySQL's reader does; writers always produce the minimal form,
# as MySQL's writer does.

from __future__ import annotations

import operator

from .events import BinlogFormatError

__all__ = [
    "UINT64_MAX",
    "INT64_MIN",
    "INT64_MAX",
    "read_varlen_uint",
    "write_varlen_uint",
    "varlen_uint_size",
    "read_varlen_int",
    "write_varlen_int",
    "varlen_int_size",
    "read_string",
    "write_string",
    "string_size",
]

UINT64_MAX = (1 << 64) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# Largest value that still fits the "trailing ones + 0-bit" layout (8 bytes, 56 bits);
# anything above needs the 9-byte 0xff form.
_MAX_SHORT_FORM = (1 << 56) - 1


def varlen_uint_size(value: int) -> int:
    """Bytes that ``write_varlen_uint(value)`` produces (1 to 9)."""
    bits = _checked_uint64(value).bit_length()
    if bits > 56:
        return 9
    return 1 + (bits - 1) // 7 if bits else 1


def write_varlen_uint(value: int) -> bytes:
    """Encode an unsigned 64-bit integer in MySQL's variable-length format."""
    value = _checked_uint64(value)
    if value > _MAX_SHORT_FORM:
        return b"\xff" + value.to_bytes(8, "little")
    size = 1 + (value.bit_length() - 1) // 7 if value else 1
    # size-1 low 1-bits, then a 0-bit, then the value: one integer written little-endian.
    return ((value << size) | ((1 << (size - 1)) - 1)).to_bytes(size, "little")


def read_varlen_uint(buf, pos: int = 0) -> tuple[int, int]:
    """Decode an unsigned variable-length integer at ``buf[pos]``; return ``(value, new_pos)``."""
    end = len(buf)
    if pos < 0 or pos >= end:
        raise BinlogFormatError("variable-length integer expected, but no bytes are left", pos)
    first = buf[pos]
    # Position of the lowest 0-bit, counting from 1 = number of trailing 1-bits + 1.
    size = ((~first) & (first + 1)).bit_length()
    if pos + size > end:
        raise BinlogFormatError(
            f"truncated variable-length integer: needs {size} bytes, {end - pos} left", pos
        )
    if size == 1:
        return first >> 1, pos + 1
    rest = int.from_bytes(buf[pos + 1 : pos + size], "little")
    if size == 9:
        return rest, pos + 9
    return (first >> size) | (rest << (8 - size)), pos + size


def varlen_int_size(value: int) -> int:
    """Bytes that ``write_varlen_int(value)`` produces (1 to 9)."""
    return varlen_uint_size(_zigzag(value))


def write_varlen_int(value: int) -> bytes:
    """Encode a signed 64-bit integer in MySQL's variable-length format (sign in the lowest bit)."""
    return write_varlen_uint(_zigzag(value))


def read_varlen_int(buf, pos: int = 0) -> tuple[int, int]:
    """Decode a signed variable-length integer at ``buf[pos]``; return ``(value, new_pos)``."""
    raw, new_pos = read_varlen_uint(buf, pos)
    magnitude = raw >> 1
    return (~magnitude if raw & 1 else magnitude), new_pos


def string_size(text: str | bytes) -> int:
    """Bytes that ``write_string(text)`` produces."""
    data = _string_bytes(text)
    return varlen_uint_size(len(data)) + len(data)


def write_string(text: str | bytes, *, max_length: int | None = None) -> bytes:
    """Encode a string (UTF-8 for ``str``) as varlen byte length + bytes.

    ``max_length`` is the bound of a bounded field (e.g. 32 for a GTID tag); a longer
    value raises ``ValueError``, as MySQL's writer refuses it.
    """
    data = _string_bytes(text)
    if max_length is not None and len(data) > max_length:
        raise ValueError(f"string of {len(data)} bytes exceeds the field's limit of {max_length}")
    return write_varlen_uint(len(data)) + data


def read_string(buf, pos: int = 0, *, max_length: int | None = None) -> tuple[str, int]:
    """Decode a varlen-length-prefixed UTF-8 string at ``buf[pos]``; return ``(text, new_pos)``.

    ``max_length`` rejects a declared length above the field's bound before reading,
    as MySQL's reader does for bounded fields.
    """
    length, data_pos = read_varlen_uint(buf, pos)
    if max_length is not None and length > max_length:
        raise BinlogFormatError(
            f"string length {length} exceeds the field's limit of {max_length}", pos
        )
    end = data_pos + length
    if end > len(buf):
        raise BinlogFormatError(
            f"truncated string: declares {length} bytes, {len(buf) - data_pos} left", pos
        )
    try:
        return str(buf[data_pos:end], "utf-8"), end
    except UnicodeDecodeError as exc:
        raise BinlogFormatError(f"string is not valid UTF-8 ({exc.reason})", data_pos + exc.start) from None


def _checked_uint64(value: int) -> int:
    value = operator.index(value)
    if not 0 <= value <= UINT64_MAX:
        raise ValueError(f"{value} is outside the unsigned 64-bit range")
    return value


def _zigzag(value: int) -> int:
    value = operator.index(value)
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{value} is outside the signed 64-bit range")
    return (value << 1) if value >= 0 else ((~value) << 1) | 1


def _string_bytes(text: str | bytes) -> bytes:
    if isinstance(text, str):
        return text.encode("utf-8")
    return bytes(text)
