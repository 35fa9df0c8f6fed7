"""MariaDB compatibility rewrites for old replicas (``@mariadb_slave_capability``): dummy events in place of
ones the replica cannot handle, BEGIN in place of a GTID event (sql/log_event_server.cc)."""

from __future__ import annotations

import zlib

from ...binlog import constants as C
from .files import U16, U32


# ---------------------------------------------------------------------------------------------
# MariaDB compatibility rewrites (sql/log_event_server.cc: Query_log_event::dummy_event,
# Query_log_event::begin_event, Gtid_log_event::make_compatible_event)
# ---------------------------------------------------------------------------------------------

_QUERY_POST_HEADER = 13
_MIN_USER_VAR_DUMMY = C.HEADER_LEN + 4 + 1 + 1  # name length, 1-byte name, is_null
_MIN_QUERY_DUMMY = C.HEADER_LEN + _QUERY_POST_HEADER + 1 + 1  # db terminator, 1 byte of comment
_Q_TIME_ZONE_CODE = 5
MARIA_GTID_HEADER_LEN = 19


def _dummy_header(header: bytes, type_code: int) -> bytearray:
    out = bytearray(header[: C.HEADER_LEN])
    flags = U16.unpack_from(out, 17)[0]
    flags = (flags & ~C.LOG_EVENT_THREAD_SPECIFIC_F) | C.LOG_EVENT_SUPPRESS_USE_F
    U16.pack_into(out, 17, flags)
    out[4] = type_code
    return out


def _finish(event: bytearray, crc: bool) -> bytes:
    if crc:
        event += U32.pack(zlib.crc32(event))
    return bytes(event)


def dummy_event(header: bytes, size: int, crc: bool) -> bytes | None:
    """An event of the same size a pre-GTID replica ignores: a comment-only QUERY, or a NULL user
    variable when the event is too short for a query. None when it is too short even for that.
    Only the original's header is needed: the whole body is replaced."""
    data_len = size - (C.CHECKSUM_LEN if crc else 0)
    if data_len < _MIN_USER_VAR_DUMMY:
        return None
    old_type = header[4]
    if data_len < _MIN_QUERY_DUMMY:
        event = _dummy_header(header, C.USER_VAR_EVENT)
        name_len = data_len - (_MIN_USER_VAR_DUMMY - 1)
        event += U32.pack(name_len) + b"!dummyvar\0"[:name_len] + b"\x01"
        return _finish(event, crc)
    event = _dummy_header(header, C.QUERY_EVENT)
    event += bytes(_QUERY_POST_HEADER) + b"\0"
    message = b"# Dummy event replacing event type %d that slave cannot handle." % old_type
    comment_len = data_len - (_MIN_QUERY_DUMMY - 1)
    event += message[:comment_len].ljust(comment_len, b" ")
    return _finish(event, crc)


def begin_event(header: bytes, size: int, crc: bool) -> bytes | None:
    """A transactional MariaDB GTID event turned into the ``BEGIN`` query an old replica expects,
    same size; None for the GTID layouts MariaDB cannot rewrite either (only 19 or 21-byte bodies)."""
    data_len = size - (C.CHECKSUM_LEN if crc else 0)
    event = _dummy_header(header, C.QUERY_EVENT)
    if data_len == C.HEADER_LEN + MARIA_GTID_HEADER_LEN:
        event += bytes(_QUERY_POST_HEADER) + b"\0"
    elif data_len == C.HEADER_LEN + MARIA_GTID_HEADER_LEN + 2:
        # An empty time_zone status variable takes up the commit id's 2 extra bytes.
        event += bytes(11) + U16.pack(2) + bytes([_Q_TIME_ZONE_CODE, 0]) + b"\0"
    else:
        return None
    event += b"BEGIN"
    return _finish(event, crc)
