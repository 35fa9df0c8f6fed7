"""CRC32 event checksums: verify, append and strip (zlib polynomial, little-endian trailer)."""

from __future__ import annotations

import struct
import zlib

from .constants import CHECKSUM_LEN

_U32 = struct.Struct("<I")


class ChecksumError(ValueError):
    """An event's stored CRC32 does not match its bytes."""

    def __init__(self, offset: int | None, stored: int, computed: int, message: str | None = None):
        self.offset = offset
        self.stored = stored
        self.computed = computed
        where = f"event at offset {offset}" if offset is not None else "event"
        super().__init__(
            message or f"CRC32 mismatch in {where}: stored 0x{stored:08x}, computed 0x{computed:08x}"
        )


def crc32_ok(buf, start: int, end: int) -> bool:
    """True when the CRC32 trailer of the event ``buf[start:end]`` matches its bytes."""
    with memoryview(buf) as view:
        computed = zlib.crc32(view[start : end - CHECKSUM_LEN])
    return computed == _U32.unpack_from(buf, end - CHECKSUM_LEN)[0]


def verify(buf, start: int = 0, end: int | None = None, offset: int | None = None) -> None:
    """Raise ChecksumError when the event ``buf[start:end]`` has a wrong CRC32 trailer."""
    if end is None:
        end = len(buf)
    # The view is released before raising: a traceback must not pin an export of the caller's
    # bytearray (it could not be resized afterwards).
    with memoryview(buf) as view:
        computed = zlib.crc32(view[start : end - CHECKSUM_LEN])
    stored = _U32.unpack_from(buf, end - CHECKSUM_LEN)[0]
    if computed != stored:
        raise ChecksumError(offset, stored, computed)


def append(event_without_crc: bytes) -> bytes:
    """The event with its CRC32 trailer appended (the caller already counted 4 bytes in event_size)."""
    return event_without_crc + _U32.pack(zlib.crc32(event_without_crc))


def recompute(event: bytes | bytearray) -> bytes:
    """The event with its last 4 bytes replaced by the CRC32 of everything before them."""
    body = bytes(event[:-CHECKSUM_LEN])
    return body + _U32.pack(zlib.crc32(body))
