"""CRC32 event checksums: verify, append and strip (zlib polynomial, little-endian trailer)."""

from __future__ import annotations

import os
import struct
import zlib

from .constants import CHECKSUM_LEN

try:  # ISA-L's CRC32 (SIMD, ~10x zlib's on 8 KB events, ~3x on 150-byte ones): the same function, same values
    if os.environ.get("RELAYPROXY_PURE_PYTHON") == "1":  # the build without compiled extras (tests/project/test_pure_python.py)
        raise ImportError("RELAYPROXY_PURE_PYTHON=1")
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # no wheel for this platform: zlib's
    _isal_crc32 = None

crc32 = _isal_crc32 if _isal_crc32 is not None else zlib.crc32
"""``zlib.crc32(data, value=0)``, from ISA-L when the ``isal`` package is installed (setup.cfg asks for it where
it has wheels), else zlib's. Every CRC32 over event bytes goes through it."""
CRC32_IMPL = "isal" if _isal_crc32 is not None else "zlib"

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


# -- extending a CRC32 by zero bytes in O(log n) ------------------------------------------------------
# zlib's register update for one byte b is c -> T[(c ^ b) & 0xFF] ^ (c >> 8), and T is linear over GF(2); for b = 0
# that is a linear map Z on the 32-bit register. n zero bytes apply Z^n, which squaring builds in O(log n) steps of
# 32x32 bit matrices (each a list of 32 column words). The relay's filler events are gigabytes of zeros: their CRC
# must not cost a pass over them (the event loop would stall for ~0.3 s per GB).

_POLY = 0xEDB88320  # the reflected CRC-32 polynomial zlib uses
CRC32_RESIDUE = 0x2144DF1C  # zlib.crc32 of any bytes followed by their own CRC-32 (little-endian)


def _zero_byte_matrix() -> list[int]:
    def one_zero_byte(c: int) -> int:
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        return c

    return [one_zero_byte(1 << i) for i in range(32)]


def _apply(matrix: list[int], vector: int) -> int:
    out = 0
    i = 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _square(matrix: list[int]) -> list[int]:
    return [_apply(matrix, column) for column in matrix]


_ZERO_BYTE = _zero_byte_matrix()


def crc32_zeros(crc: int, count: int) -> int:
    """``zlib.crc32(bytes(count), crc)``, computed in O(log count) without the zeros."""
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    register = crc ^ 0xFFFFFFFF
    power = _ZERO_BYTE
    while count:
        if count & 1:
            register = _apply(power, register)
        count >>= 1
        if count:
            power = _square(power)
    return register ^ 0xFFFFFFFF


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

