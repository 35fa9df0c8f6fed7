"""Common event header and FORMAT_DESCRIPTION decoding for every binlog generation."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import NamedTuple

from . import checksum
from .constants import (
    CHECKSUM_CRC32,
    CHECKSUM_LEN,
    CHECKSUM_OFF,
    CHECKSUM_UNDEF,
    FORMAT_DESCRIPTION_EVENT,
    HEADER_LEN,
    LOG_EVENT_BINLOG_IN_USE_F,
    QUERY_EVENT,
)

# timestamp u32, type u8, server_id u32, event_size u32, log_pos u32, flags u16
HEADER = struct.Struct("<IBIIIH")
_header_unpack_from = HEADER.unpack_from


class BinlogFormatError(ValueError):
    """Bytes that cannot be a well-formed binlog event or file; the message names offset and cause."""

    def __init__(self, message: str, offset: int | None = None):
        self.offset = offset
        super().__init__(message if offset is None else f"at offset {offset}: {message}")


class EventHeader(NamedTuple):
    """The 19-byte common header (v4) of a binlog event."""

    timestamp: int
    type_code: int
    server_id: int
    event_size: int
    log_pos: int
    flags: int

    @classmethod
    def unpack(cls, buf, offset: int = 0) -> "EventHeader":
        if len(buf) - offset < HEADER_LEN:
            raise BinlogFormatError(f"event header needs {HEADER_LEN} bytes, have {len(buf) - offset}", offset)
        return cls(*_header_unpack_from(buf, offset))

    def pack(self) -> bytes:
        return HEADER.pack(*self)


# Version from which each flavour writes the checksum_alg byte in its FDE.
_MYSQL_CHECKSUM_SPLIT = (5, 6, 1)
_MARIADB_CHECKSUM_SPLIT = (5, 3, 0)
_VERSION_RE = re.compile(rb"(\d+)\.(\d+)\.(\d+)")

FDE_FIXED_LEN = 2 + 50 + 4 + 1  # binlog_version, server_version, create_timestamp, header_len
_FDE_FIXED = struct.Struct("<H50sIB").unpack_from  # the same four fields
# MySQL 5.5 knew 27 event types; checksum-aware servers (5.6.1+, MariaDB 5.3+) list 34 or more.
PRE_CHECKSUM_MAX_TYPES = 30


def split_version(server_version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a server version string; (0, 0, 0) when it has none."""
    m = _VERSION_RE.match(server_version.encode("latin-1", "replace"))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else (0, 0, 0)


@dataclass(frozen=True, slots=True)
class FormatDescription:
    """A decoded FORMAT_DESCRIPTION_EVENT: how to read every event that follows it."""

    binlog_version: int
    server_version: str
    create_timestamp: int
    header_len: int
    post_header_lens: bytes  # post_header_lens[t - 1] is the post-header length of type t
    checksum_alg: int  # CHECKSUM_OFF, CHECKSUM_CRC32 or CHECKSUM_UNDEF (pre-checksum server)
    flags: int = 0
    server_id: int = 0

    @property
    def checksum_len(self) -> int:
        """Bytes of CRC at the end of every event this FDE describes (the FDE itself excepted)."""
        return CHECKSUM_LEN if self.checksum_alg == CHECKSUM_CRC32 else 0

    @property
    def is_mariadb(self) -> bool:
        return "mariadb" in self.server_version.lower()

    @property
    def flavour(self) -> str:
        return "mariadb" if self.is_mariadb else "mysql"

    @property
    def in_use(self) -> bool:
        """LOG_EVENT_BINLOG_IN_USE_F: the server had not closed this file cleanly."""
        return bool(self.flags & LOG_EVENT_BINLOG_IN_USE_F)

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        return split_version(self.server_version)

    @property
    def checksum_name(self) -> str | None:
        """"CRC32", "NONE", or None for a server that predates checksums."""
        if self.checksum_alg == CHECKSUM_CRC32:
            return "CRC32"
        if self.checksum_alg == CHECKSUM_OFF:
            return "NONE"
        return None

    def post_header_len(self, type_code: int) -> int:
        if 1 <= type_code <= len(self.post_header_lens):
            return self.post_header_lens[type_code - 1]
        return 0

    @property
    def query_post_header_len(self) -> int:
        return self.post_header_len(QUERY_EVENT) or 13

    @classmethod
    def parse(cls, buf, offset: int = 0, event_size: int | None = None) -> "FormatDescription":
        """Decode the FDE whose header starts at ``buf[offset]``; its own CRC is verified when present."""
        if len(buf) - offset < HEADER_LEN:  # EventHeader.unpack's check, without building the named tuple
            raise BinlogFormatError(f"event header needs {HEADER_LEN} bytes, have {len(buf) - offset}", offset)
        _ts, type_code, server_id, size, _log_pos, flags = _header_unpack_from(buf, offset)
        if type_code != FORMAT_DESCRIPTION_EVENT:
            raise BinlogFormatError(f"expected FORMAT_DESCRIPTION_EVENT, found type {type_code}", offset)
        if event_size is None:
            event_size = size
        if event_size < HEADER_LEN + FDE_FIXED_LEN or len(buf) - offset < event_size:
            raise BinlogFormatError(f"FORMAT_DESCRIPTION_EVENT too short ({event_size} bytes)", offset)
        body = offset + HEADER_LEN
        binlog_version, raw_version, create_timestamp, header_len = _FDE_FIXED(buf, body)
        raw_version = raw_version.split(b"\0", 1)[0]
        server_version = raw_version.decode("latin-1")
        if binlog_version != 4 or header_len != HEADER_LEN:
            raise BinlogFormatError(
                f"unsupported binlog format version {binlog_version} with header length {header_len}", offset
            )
        # split_version(server_version), on the bytes it would encode back to (latin-1 round-trips).
        m = _VERSION_RE.match(raw_version)
        version = (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else (0, 0, 0)
        split = _MARIADB_CHECKSUM_SPLIT if "mariadb" in server_version.lower() else _MYSQL_CHECKSUM_SPLIT
        end = offset + event_size
        if version >= split:
            alg = buf[end - CHECKSUM_LEN - 1]
            if alg not in (CHECKSUM_OFF, CHECKSUM_CRC32):
                raise BinlogFormatError(f"FORMAT_DESCRIPTION_EVENT has unknown checksum algorithm {alg}", offset)
            # Checksum-aware servers give their FDE a real CRC32 footer whatever the algorithm
            # (seen in every checksum=NONE file of the corpus: MySQL 5.6/5.7, MariaDB 10.0), so it
            # is always verified: a flipped algorithm byte must not switch checking off.
            _verify_fde_crc(buf, offset, end, flags)
            post_header_lens = bytes(buf[body + FDE_FIXED_LEN : end - CHECKSUM_LEN - 1])
        else:
            alg = CHECKSUM_UNDEF
            post_header_lens = bytes(buf[body + FDE_FIXED_LEN : end])
            if len(post_header_lens) > PRE_CHECKSUM_MAX_TYPES:
                # Servers before checksums knew at most 27 event types; a longer FDE with such a
                # version is a damaged one, and trusting it would switch off CRC checks for the file.
                raise BinlogFormatError(
                    f"FORMAT_DESCRIPTION_EVENT lists {len(post_header_lens)} event types, impossible for "
                    f"server version {server_version!r} (a server without checksums knows at most "
                    f"{PRE_CHECKSUM_MAX_TYPES})",
                    offset,
                )
        # binlog_version, server_version, create_timestamp, header_len, post_header_lens, checksum_alg, flags,
        # server_id (positional: the FDE of every small file is parsed on the hot path of a file walk)
        return cls(binlog_version, server_version, create_timestamp, header_len, post_header_lens, alg, flags, server_id)


def _verify_fde_crc(buf, offset: int, end: int, flags: int) -> None:
    # The server checksums its FDE with the in-use flag clear and flips the flag in place
    # (MySQL event_checksum_test), so the CRC is checked against the flag-cleared bytes.
    if flags & LOG_EVENT_BINLOG_IN_USE_F:
        event = bytearray(buf[offset:end])
        struct.pack_into("<H", event, 17, flags & ~LOG_EVENT_BINLOG_IN_USE_F)
        checksum.verify(event, 0, len(event), offset=offset)
    else:
        checksum.verify(buf, offset, end, offset=offset)


def default_format(server_version: str = "5.0.0") -> FormatDescription:
    """A stand-in FDE for streams whose real FDE has not been seen yet (no checksums)."""
    return FormatDescription(4, server_version, 0, HEADER_LEN, bytes([0, 13]), CHECKSUM_UNDEF)
