"""MySQL's packed integer, the one codec: ``net_store_length`` / ``net_field_length_ll`` in the binlog, the same
bytes as the client protocol's length-encoded integer (wire/packets.py reads and writes it through here).

1 byte below 251; 0xFC + 2 bytes, 0xFD + 3 bytes, 0xFE + 8 bytes, little-endian. 0xFB (SQL NULL in a row) and
0xFF are not lengths.
"""

from __future__ import annotations

import operator

_SIZES = {0xFC: 2, 0xFD: 3, 0xFE: 8}
_MAX = (1 << 64) - 1


class PackedIntError(ValueError):
    """Bytes that are not a packed integer; the message says why, callers add where it was."""


def encode_packed(value: int, what: str = "packed integer") -> bytes:
    """``value`` as a packed integer: 1, 3, 4 or 9 bytes (ValueError outside 0..2**64-1)."""
    value = operator.index(value)
    if not 0 <= value <= _MAX:
        raise ValueError(f"{what} {value} is outside 0..{_MAX}")
    if value < 251:
        return bytes((value,))
    if value < 1 << 16:
        return b"\xfc" + value.to_bytes(2, "little")
    if value < 1 << 24:
        return b"\xfd" + value.to_bytes(3, "little")
    return b"\xfe" + value.to_bytes(8, "little")


def decode_packed(buf, pos: int, end: int, what: str = "packed integer") -> tuple[int, int]:
    """The packed integer at ``buf[pos]`` and the position after it, reading nothing at or past ``end``."""
    if pos >= end:
        raise PackedIntError(f"truncated: {what} expected, but no bytes are left")
    first = buf[pos]
    if first < 251:
        return first, pos + 1
    size = _SIZES.get(first)
    if size is None:
        raise PackedIntError(f"invalid {what} prefix 0x{first:02x}")
    if pos + 1 + size > end:
        raise PackedIntError(f"truncated {what}: needs {1 + size} bytes, {end - pos} left")
    return int.from_bytes(buf[pos + 1 : pos + 1 + size], "little"), pos + 1 + size
