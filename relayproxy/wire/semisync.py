"""The semi-sync replication bytes (protocol-reference §3.9), sans-I/O: the header a master puts before each event
of a semi-sync dump, and the ACK a replica sends back, which both sides of the relay build and read."""

from __future__ import annotations

import struct

# A semi-sync dump's payloads are 0x00, SEMI_SYNC_INDICATOR, a flag byte, the event; SEMI_SYNC_NEED_ACK in the flag
# asks the replica to ACK that event. The ACK starts with the same indicator byte.
SEMI_SYNC_INDICATOR = 0xEF
SEMI_SYNC_NEED_ACK = 0x01
SEMI_SYNC_HEADER = (b"\x00\xef\x00", b"\x00\xef\x01")  # the payload prefix without and with the ACK request

_U64 = struct.Struct("<Q")
_ACK_MIN_LEN = 1 + _U64.size + 1  # the indicator, the position, a file name of at least one byte


def encode_semi_sync_ack(file: str, position: int) -> bytes:
    """The ACK payload (sent with sequence id 0): 0xEF, ``position`` (the end of the acknowledged event in the
    master's ``file``) as a little-endian u64, then the file name without a NUL, as MySQL and MariaDB send it."""
    return bytes((SEMI_SYNC_INDICATOR,)) + _U64.pack(position) + file.encode("utf-8", "surrogateescape")


def parse_semi_sync_ack(payload: bytes | memoryview) -> tuple[str, int] | None:
    """``(file, position)`` of an ACK payload; None when the payload is not one (too short, another first byte)."""
    if len(payload) < _ACK_MIN_LEN or payload[0] != SEMI_SYNC_INDICATOR:
        return None
    position = _U64.unpack_from(payload, 1)[0]
    return bytes(payload[1 + _U64.size :]).decode("utf-8", "surrogateescape"), position


__all__ = ["SEMI_SYNC_HEADER", "SEMI_SYNC_INDICATOR", "SEMI_SYNC_NEED_ACK", "encode_semi_sync_ack",
           "parse_semi_sync_ack"]
