"""Typed, lazily decoded views of single binlog events: `inspect`, SHOW BINLOG EVENTS, the relay's own checks.

A view wraps one event in a caller's buffer (``bytes``, ``bytearray`` or ``memoryview``) without
copying it: the constructor reads the 19-byte common header and checks that the event fits, and
each field is decoded when it is first asked for.  The boundary parser's hot path does not go
through here (it reads the few bytes it needs itself); views are the readable layer on top, so
they favour clear errors over raw speed, but stay cheap enough to build for every event.

Layouts follow the server sources, not secondary descriptions:
MySQL ``libs/mysql/binlog/event/control_events.cpp`` / ``statement_events.cpp`` and
``codecs/binary.cpp``; MariaDB ``sql/log_event.cc`` (``Gtid_log_event``, ``Gtid_list_log_event``,
``Binlog_checkpoint_log_event``, ``Heartbeat_log_event``).  Every decoding error is a
``BinlogFormatError`` that names the event's offset and what is wrong; views never leak
``IndexError`` or ``struct.error``.  The one other error is ``ChecksumError``, from a
FORMAT_DESCRIPTION whose own CRC32 does not match (``FormatDescription.parse`` checks it) or
from ``verify_checksum()``.

The body a view sees excludes the event's CRC32 trailer (``fde.checksum_len`` bytes); the
trailer itself is checked by ``verify_checksum()`` or, on the hot path, by the reader.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Union

from . import checksum as _checksum
from .constants import (
    ANONYMOUS_GTID_LOG_EVENT,
    CHECKSUM_LEN,
    CHECKSUM_OFF,
    CHECKSUM_UNDEF,
    EXECUTE_LOAD_QUERY_EVENT,
    FL_ALLOW_PARALLEL,
    FL_COMMIT_ALTER_E1,
    FL_COMPLETED_XA,
    FL_DDL,
    FL_EXTRA_MULTI_ENGINE_E1,
    FL_GROUP_COMMIT_ID,
    FL_PREPARED_XA,
    FL_ROLLBACK_ALTER_E1,
    FL_STANDALONE,
    FL_START_ALTER_E1,
    FL_TRANSACTIONAL,
    FL_WAITED,
    FORMAT_DESCRIPTION_EVENT,
    GTID_LIST_COUNT_MASK,
    GTID_LIST_FLAG_IGN_GTIDS,
    GTID_LIST_FLAG_UNTIL_REACHED,
    GTID_LOG_EVENT,
    GTID_TAGGED_LOG_EVENT,
    HEADER_LEN,
    HEARTBEAT_FIELD_END,
    HEARTBEAT_FIELD_LOG_FILENAME,
    HEARTBEAT_FIELD_LOG_POSITION,
    HEARTBEAT_LOG_EVENT,
    HEARTBEAT_LOG_EVENT_V2,
    INCIDENT_EVENT,
    LOG_EVENT_ARTIFICIAL_F,
    LOG_EVENT_BINLOG_IN_USE_F,
    MARIA_BINLOG_CHECKPOINT_EVENT,
    MARIA_GTID_EVENT,
    MARIA_GTID_LIST_EVENT,
    MARIA_START_ENCRYPTION_EVENT,
    PAYLOAD_COMPRESSION_NONE,
    PAYLOAD_COMPRESSION_ZSTD,
    PAYLOAD_FIELD_COMPRESSION_TYPE,
    PAYLOAD_FIELD_END,
    PAYLOAD_FIELD_SIZE,
    PAYLOAD_FIELD_UNCOMPRESSED_SIZE,
    PREVIOUS_GTIDS_LOG_EVENT,
    QUERY_EVENT,
    ROTATE_EVENT,
    TRANSACTION_PAYLOAD_EVENT,
    XA_PREPARE_LOG_EVENT,
    XID_EVENT,
    event_name,
)
from .events import HEADER, BinlogFormatError, EventHeader, FormatDescription, default_format
from .packed import PackedIntError, decode_packed

if TYPE_CHECKING:  # the GTID module is only needed when a GTID field is actually read
    from .gtid import GtidSet, MariaBinlogState, MariaGtid

__all__ = [
    "Buffer",
    "EventView",
    "OpaqueEvent",
    "FormatDescriptionView",
    "QueryView",
    "ExecuteLoadQueryView",
    "RotateView",
    "XidView",
    "GtidView",
    "GtidTaggedView",
    "PreviousGtidsView",
    "XaPrepareView",
    "IncidentView",
    "HeartbeatView",
    "HeartbeatV2View",
    "TransactionPayloadView",
    "MariaGtidView",
    "MariaGtidListView",
    "BinlogCheckpointView",
    "StartEncryptionView",
    "EVENT_VIEWS",
    "view_event",
    "read_net_field_length",
    "format_uuid",
    "xid_text",
    "FL_EXTRA_THREAD_ID",
]

Buffer = Union[bytes, bytearray, memoryview]

# MariaDB 11.5+ (MDEV-7850) stores the originating thread id in the GTID event when this
# flags_extra bit is set; the 11.8 corpus files carry it on every GTID.
from .constants import FL_EXTRA_THREAD_ID  # noqa: E402  (re-exported)

_header_unpack_from = HEADER.unpack_from
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_MYSQL_GTID_POST_HEADER = struct.Struct("<B16sqBqq")  # flags, sid, gno, lt_type, last_committed, seq_no
_MYSQL_GTID_56 = struct.Struct("<B16sq")  # 5.6: flags, sid, gno
_MARIA_GTID_FIXED = struct.Struct("<QIB")  # seq_no, domain_id, flags2
_GTID_LIST_ENTRY = struct.Struct("<IIQ")

_NO_FDE = default_format()  # stand-in for "no FDE seen yet": v4, no checksums
_LOGICAL_TIMESTAMP_TYPECODE = 2
_COMMIT_TS_LEN = 7
_COMMIT_TS_FLAG = 1 << 55
_SERVER_VERSION_FLAG = 1 << 31
_GNO_END = (1 << 63) - 1  # exclusive, as MySQL's GNO_END
_XID_PART_MAX = 64  # MAXGTRIDSIZE / MAXBQUALSIZE
_GTID_HEADER_LEN = 19  # MariaDB GTID post-header; the body is zero-padded up to it
_TAG_MAX_LENGTH = 32
_QUERY_DESCRIBE_CHARS = 60
_INCIDENT_NAMES = {0: "NONE", 1: "LOST_EVENTS"}


# ---------------------------------------------------------------------------------------------
# Small shared decoders
# ---------------------------------------------------------------------------------------------


def read_net_field_length(buf, pos: int, end: int) -> tuple[int, int]:
    """Decode a MySQL packed integer (``net_field_length_ll``) at ``buf[pos]``, not reading past ``end``.

    Used by the GTID event's transaction_length and by the TLV headers of TRANSACTION_PAYLOAD
    and HEARTBEAT_V2.  ``0xfb`` (SQL NULL) and ``0xff`` are not valid lengths here.
    """
    try:
        return _net_field_length(buf, pos, end)
    except PackedIntError as exc:
        raise BinlogFormatError(str(exc), pos) from None


_net_field_length = decode_packed  # raises PackedIntError (a ValueError); callers add where it happened


def format_uuid(sid: bytes) -> str:
    """Canonical text of a 16-byte server UUID (lowercase 8-4-4-4-12, as MySQL prints it)."""
    h = bytes(sid).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def xid_text(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """An XA xid as MySQL's ``serialize_xid`` prints it: ``X'<gtrid hex>',X'<bqual hex>',<formatID>``."""
    return f"X'{bytes(gtrid).hex()}',X'{bytes(bqual).hex()}',{format_id}"


def _as_buffer(buf: Buffer) -> Buffer:
    """``buf`` in a form whose indexing gives ints and whose slices are bytes-like.

    ``bytes`` and ``bytearray`` are kept as they are: wrapping a bytearray in a memoryview would
    pin it, and a reader that later resizes its buffer (while a view, or an exception traceback
    holding one, is still alive) would fail with a BufferError far from the cause.  Slices of
    them copy, which only costs for the few fields copied out anyway.  Memoryviews (and other
    buffers, wrapped) stay zero-copy.
    """
    kind = type(buf)
    if kind is bytes or kind is bytearray:
        return buf
    view = buf if kind is memoryview else memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _decode_name(raw) -> str:
    # File names are bytes on the wire; surrogateescape keeps odd bytes round-trippable
    # through the encoders (``str.encode("utf-8", "surrogateescape")``).
    return bytes(raw).decode("utf-8", "surrogateescape")


def _snippet(raw: bytes, limit: int = _QUERY_DESCRIBE_CHARS) -> str:
    text = " ".join(raw.decode("utf-8", "replace").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Base view
# ---------------------------------------------------------------------------------------------


class EventView:
    """One event at ``buf[offset]``: its header, body bounds and lazily decoded fields.

    ``body_start``/``body_end`` are absolute offsets into ``buf``: the body starts after the
    19-byte common header and ends before the CRC32 trailer (if the FDE says events carry one).
    """

    __slots__ = ("buf", "offset", "fde", "header", "body_start", "body_end")

    buf: Buffer

    type_codes: ClassVar[tuple[int, ...]] = ()

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        view = _as_buffer(buf)
        available = len(view) - offset
        if offset < 0 or available < HEADER_LEN:
            raise BinlogFormatError(f"event header needs {HEADER_LEN} bytes, have {max(available, 0)}", offset)
        self.buf = view
        self.offset = offset
        self.fde = _NO_FDE if fde is None else fde
        self.header = header = EventHeader._make(_header_unpack_from(view, offset))
        size = header.event_size
        trailer = self._trailer_len()
        if size < HEADER_LEN + trailer:
            what = "header + trailer" if trailer else "header"
            raise self._error(f"event_size {size} is smaller than the {what} ({HEADER_LEN + trailer})")
        if size > available:
            raise self._error(f"event_size {size} runs past the end of the buffer ({available} bytes left)")
        self.body_start = offset + HEADER_LEN
        self.body_end = offset + size - trailer

    def _trailer_len(self) -> int:
        """Bytes after the body: the CRC32 when the FDE says events carry one."""
        return self.fde.checksum_len

    # -- header shortcuts -----------------------------------------------------------------------
    @property
    def type_code(self) -> int:
        return self.header.type_code

    @property
    def name(self) -> str:
        return event_name(self.header.type_code)

    @property
    def timestamp(self) -> int:
        return self.header.timestamp

    @property
    def server_id(self) -> int:
        return self.header.server_id

    @property
    def event_size(self) -> int:
        return self.header.event_size

    @property
    def log_pos(self) -> int:
        return self.header.log_pos

    @property
    def flags(self) -> int:
        """Common-header flags.  Views of events with a flags field of their own (GTID, GTID_LIST)
        return that field here; ``header.flags`` is always the common header's."""
        return self.header.flags

    @property
    def end_offset(self) -> int:
        """Offset in ``buf`` just past this event (where the next event starts)."""
        return self.offset + self.header.event_size

    @property
    def is_artificial(self) -> bool:
        """LOG_EVENT_ARTIFICIAL_F: generated by a server (fake rotate...), not read from a binlog."""
        return bool(self.header.flags & LOG_EVENT_ARTIFICIAL_F)

    @property
    def body_len(self) -> int:
        return self.body_end - self.body_start

    @property
    def body(self) -> memoryview:
        """The event body (post-header + data) without header and CRC, as a zero-copy view.

        The memoryview pins the caller's buffer while it lives (a bytearray cannot be resized).
        """
        return memoryview(self.buf)[self.body_start : self.body_end]

    @property
    def raw(self) -> bytes:
        """The whole event, header and CRC included."""
        return bytes(self.buf[self.offset : self.offset + self.header.event_size])

    @property
    def has_checksum(self) -> bool:
        return self._trailer_len() == CHECKSUM_LEN

    def verify_checksum(self) -> None:
        """Raise ``ChecksumError`` if the CRC32 trailer does not match (no-op without checksums)."""
        if self.has_checksum:
            _checksum.verify(self.buf, self.offset, self.offset + self.header.event_size, offset=self.offset)

    def describe(self) -> str:
        """One-line human summary of the decoded fields (the info column of ``relayproxy inspect``)."""
        return f"{self.body_len} bytes"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} at {self.offset}, {self.header.event_size} bytes>"

    # -- bounded readers ------------------------------------------------------------------------
    def _error(self, detail: str) -> BinlogFormatError:
        return BinlogFormatError(f"{self.name}: {detail}", self.offset)

    def _need(self, pos: int, size: int, what: str) -> None:
        if pos + size > self.body_end:
            left = max(self.body_end - pos, 0)
            raise self._error(
                f"{what} needs {size} bytes at body offset {pos - self.body_start}, "
                f"but the body has {left} left (body {self.body_len} bytes)"
            )

    def _u8(self, pos: int, what: str) -> int:
        self._need(pos, 1, what)
        return self.buf[pos]

    def _u16(self, pos: int, what: str) -> int:
        self._need(pos, 2, what)
        return _U16.unpack_from(self.buf, pos)[0]

    def _u32(self, pos: int, what: str) -> int:
        self._need(pos, 4, what)
        return _U32.unpack_from(self.buf, pos)[0]

    def _u64(self, pos: int, what: str) -> int:
        self._need(pos, 8, what)
        return _U64.unpack_from(self.buf, pos)[0]

    def _bytes(self, pos: int, size: int, what: str) -> bytes:
        self._need(pos, size, what)
        return bytes(self.buf[pos : pos + size])

    def _packed(self, pos: int, what: str) -> tuple[int, int]:
        try:
            return _net_field_length(self.buf, pos, self.body_end)
        except ValueError as exc:
            raise self._error(f"{what} at body offset {pos - self.body_start}: {exc}") from None

    def _nested(self, exc: BinlogFormatError, base: int) -> BinlogFormatError:
        """Re-raise a helper's error (GTID set, serialization) as this event's, keeping where it was."""
        message = exc.args[0]
        prefix = f"at offset {exc.offset}: "
        if exc.offset is not None and message.startswith(prefix):
            message = f"{message[len(prefix):]} (body offset {exc.offset - base})"
        return self._error(message)

    def _post_header_len(self, default: int) -> int:
        """The FDE's post-header length for this type, or ``default`` when the FDE has no entry."""
        type_code = self.header.type_code
        lens = self.fde.post_header_lens
        return lens[type_code - 1] if 1 <= type_code <= len(lens) else default


class OpaqueEvent(EventView):
    """Any event without a dedicated view: the header and the raw body, nothing decoded."""

    __slots__ = ()


# ---------------------------------------------------------------------------------------------
# FORMAT_DESCRIPTION (15)
# ---------------------------------------------------------------------------------------------


class FormatDescriptionView(EventView):
    """A FORMAT_DESCRIPTION_EVENT, decoded eagerly (it describes everything after it).

    The ``fde`` argument is ignored for the layout: an FDE describes itself.  Its CRC trailer
    exists whenever the server is checksum-aware, even with ``checksum_alg`` = OFF, and it is
    verified on construction when the algorithm is CRC32 (``FormatDescription.parse``), which
    can raise ``ChecksumError``.
    """

    __slots__ = ("format",)

    type_codes = (FORMAT_DESCRIPTION_EVENT,)

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        view = _as_buffer(buf)
        if offset < 0:
            raise BinlogFormatError("negative event offset", offset)
        self.format = FormatDescription.parse(view, offset)
        super().__init__(view, offset, self.format)

    def _trailer_len(self) -> int:
        # checksum_alg byte + CRC32 for checksum-aware servers; nothing before 5.6.1 / MariaDB 5.3.
        return 0 if self.format.checksum_alg == CHECKSUM_UNDEF else 1 + CHECKSUM_LEN

    @property
    def has_checksum(self) -> bool:
        return self.format.checksum_alg != CHECKSUM_UNDEF

    def verify_checksum(self) -> None:
        """Check the FDE's own CRC, which checksum-aware servers write even with checksum_alg OFF.

        The server computes it with LOG_EVENT_BINLOG_IN_USE_F clear and sets the flag afterwards
        (and clears it again on close), so the flag is masked out for the check.
        """
        if self.format.checksum_alg == CHECKSUM_UNDEF:
            return
        event = bytearray(self.buf[self.offset : self.offset + self.header.event_size])
        _U16.pack_into(event, 17, self.header.flags & ~LOG_EVENT_BINLOG_IN_USE_F)
        _checksum.verify(event, 0, len(event), offset=self.offset)

    @property
    def binlog_version(self) -> int:
        return self.format.binlog_version

    @property
    def server_version(self) -> str:
        return self.format.server_version

    @property
    def create_timestamp(self) -> int:
        return self.format.create_timestamp

    @property
    def checksum_alg(self) -> int:
        return self.format.checksum_alg

    @property
    def in_use(self) -> bool:
        return self.format.in_use

    def describe(self) -> str:
        parts = [
            f"server {self.format.server_version}",
            f"binlog v{self.format.binlog_version}",
            f"checksum {self.format.checksum_name or 'n/a'}",
        ]
        if self.format.create_timestamp:
            parts.append(f"created {self.format.create_timestamp}")
        if self.format.in_use:
            parts.append("in use")
        return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# QUERY (2) and EXECUTE_LOAD_QUERY (18)
# ---------------------------------------------------------------------------------------------


class QueryView(EventView):
    """QUERY_EVENT: post-header (thread, exec time, db length, error code, status-vars length),
    then status vars, the default database + NUL, and the statement text to the body end.

    The layout offsets are computed in the constructor (a handful of byte reads) because every
    field depends on them; the strings are only copied when asked for.
    """

    __slots__ = ("_post_header", "_status_start", "_db_start", "_db_len", "_query_start")

    type_codes = (QUERY_EVENT,)
    _DEFAULT_POST_HEADER: ClassVar[int] = 13

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        post_header = self._post_header_len(0) or self._DEFAULT_POST_HEADER
        if post_header < 11:
            raise self._error(f"post-header length {post_header} is shorter than the 11-byte minimum")
        body = self.body_start
        self._need(body, post_header, "post-header")
        db_len = self.buf[body + 8]
        # Binlog v4 query post-headers are >= 13 and end with status_vars_len; v3 had none.
        status_len = _U16.unpack_from(self.buf, body + 11)[0] if post_header >= 13 else 0
        status_start = body + post_header
        db_start = status_start + status_len
        query_start = db_start + db_len + 1
        if query_start > self.body_end:
            raise self._error(
                f"status vars ({status_len} bytes) + db name ({db_len} bytes) + NUL need "
                f"{query_start - status_start} bytes after the post-header, the body has {self.body_end - status_start}"
            )
        self._post_header = post_header
        self._status_start = status_start
        self._db_start = db_start
        self._db_len = db_len
        self._query_start = query_start

    @property
    def thread_id(self) -> int:
        return _U32.unpack_from(self.buf, self.body_start)[0]

    @property
    def exec_time(self) -> int:
        return _U32.unpack_from(self.buf, self.body_start + 4)[0]

    @property
    def error_code(self) -> int:
        return _U16.unpack_from(self.buf, self.body_start + 9)[0]

    @property
    def status_vars(self) -> bytes:
        """The raw status-variable block (codes with values); not decoded, as MySQL recommends
        skipping it as a block because later codes have variable sizes."""
        return bytes(self.buf[self._status_start : self._db_start])

    @property
    def db(self) -> str:
        return bytes(self.buf[self._db_start : self._db_start + self._db_len]).decode("utf-8", "replace")

    @property
    def query(self) -> bytes:
        return bytes(self.buf[self._query_start : self.body_end])

    @property
    def query_text(self) -> str:
        return self.query.decode("utf-8", "replace")

    @property
    def query_len(self) -> int:
        return self.body_end - self._query_start

    def query_prefix(self, size: int = 32) -> bytes:
        """The first ``size`` bytes of the statement, without copying the rest (BEGIN/COMMIT checks)."""
        return bytes(self.buf[self._query_start : min(self._query_start + size, self.body_end)])

    def describe(self) -> str:
        snippet = _snippet(self.query_prefix(4 * _QUERY_DESCRIBE_CHARS))
        prefix = f"{self.db}: " if self._db_len else ""
        error = f" (error {self.error_code})" if self.error_code else ""
        return f"{prefix}{snippet}{error}"


class ExecuteLoadQueryView(QueryView):
    """EXECUTE_LOAD_QUERY_EVENT: a QUERY with 13 more post-header bytes naming the loaded file.

    The post-header length is taken from the FDE (26 on every v4 server)."""

    __slots__ = ()

    type_codes = (EXECUTE_LOAD_QUERY_EVENT,)
    _DEFAULT_POST_HEADER = 26

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        if self._post_header < 26:
            raise self._error(f"post-header length {self._post_header} is shorter than 26")

    @property
    def file_id(self) -> int:
        return _U32.unpack_from(self.buf, self.body_start + 13)[0]

    @property
    def fn_pos_start(self) -> int:
        return _U32.unpack_from(self.buf, self.body_start + 17)[0]

    @property
    def fn_pos_end(self) -> int:
        return _U32.unpack_from(self.buf, self.body_start + 21)[0]

    @property
    def dup_handling(self) -> int:
        return self.buf[self.body_start + 25]

    def describe(self) -> str:
        return f"file_id={self.file_id} {super().describe()}"


# ---------------------------------------------------------------------------------------------
# ROTATE (4), XID (16), INCIDENT (26)
# ---------------------------------------------------------------------------------------------


class RotateView(EventView):
    """ROTATE_EVENT: ``position`` (u64) in the next file, then its name without a NUL."""

    __slots__ = ()

    type_codes = (ROTATE_EVENT,)

    def _name_start(self) -> int:
        # The rotate post-header is frozen at 8 bytes in binlog v4 (it must be readable before any
        # FDE arrives); a stand-in FDE without an entry for type 4 therefore still means 8.
        return self.body_start + self._post_header_len(8)

    @property
    def position(self) -> int:
        if self._post_header_len(8) == 0:
            return 4  # pre-v4 rotates had no position: the next file starts after its magic
        return self._u64(self.body_start, "position")

    @property
    def next_file_bytes(self) -> bytes:
        start = self._name_start()
        if start >= self.body_end:
            raise self._error("the next file name is empty (event smaller than expected)")
        return bytes(self.buf[start : self.body_end])

    @property
    def next_file(self) -> str:
        return _decode_name(self.next_file_bytes)

    def describe(self) -> str:
        return f"-> {self.next_file}:{self.position}" + (" (artificial)" if self.is_artificial else "")


class XidView(EventView):
    """XID_EVENT: the storage engine's transaction id (u64), informational only."""

    __slots__ = ()

    type_codes = (XID_EVENT,)

    @property
    def xid(self) -> int:
        return self._u64(self.body_start + self._post_header_len(0), "xid")

    def describe(self) -> str:
        return f"xid={self.xid}"


class IncidentView(EventView):
    """INCIDENT_EVENT: incident number (u16 post-header), then a length-prefixed message."""

    __slots__ = ()

    type_codes = (INCIDENT_EVENT,)

    @property
    def incident_type(self) -> int:
        return self._u16(self.body_start, "incident number")

    @property
    def message(self) -> str:
        pos = self.body_start + self._post_header_len(2)
        length = self._u8(pos, "message length")
        return self._bytes(pos + 1, length, "message").decode("utf-8", "replace")

    def describe(self) -> str:
        kind = _INCIDENT_NAMES.get(self.incident_type, "unknown")
        message = self.message
        return f"incident {self.incident_type} ({kind})" + (f": {message}" if message else "")


# ---------------------------------------------------------------------------------------------
# MySQL GTID (33), ANONYMOUS_GTID (34), GTID_TAGGED (42)
# ---------------------------------------------------------------------------------------------


class GtidView(EventView):
    """GTID_LOG_EVENT / ANONYMOUS_GTID_LOG_EVENT in its 5.6 (25-byte), 5.7 (42-byte) and 8.0 forms.

    The fixed part (flags, SID, GNO, logical clock) sits at fixed offsets and is read directly;
    the variable tail of 8.0 (commit timestamps, transaction_length, server versions, commit
    group ticket) is decoded once, on first access, exactly as ``Gtid_event::Gtid_event`` reads
    it: each field is present only if enough bytes remain.  Absent fields read as ``None``;
    ``original_*`` equal their ``immediate_*`` counterparts when not stored separately.
    """

    __slots__ = ("_tail",)

    type_codes = (GTID_LOG_EVENT, ANONYMOUS_GTID_LOG_EVENT)

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        self._tail: tuple | None = None
        if self.type_code != GTID_TAGGED_LOG_EVENT:
            self._need(self.body_start, _MYSQL_GTID_56.size, "flags + SID + GNO")

    # -- fixed part ----------------------------------------------------------------------------
    @property
    def gtid_flags(self) -> int:
        """The GTID event's own flags byte (bit 0: FLAG_MAY_HAVE_SBR), not the header flags."""
        return self.buf[self.body_start]

    @property
    def flags(self) -> int:  # type: ignore[override]
        """Same as ``gtid_flags`` (the header's flags are ``header.flags``)."""
        return self.gtid_flags

    @property
    def may_have_sbr(self) -> bool:
        return bool(self.gtid_flags & 1)

    @property
    def sid(self) -> bytes:
        return bytes(self.buf[self.body_start + 1 : self.body_start + 17])

    @property
    def uuid(self) -> str:
        return format_uuid(self.sid)

    @property
    def tag(self) -> str:
        return ""

    @property
    def gno(self) -> int:
        gno = _I64.unpack_from(self.buf, self.body_start + 17)[0]
        self._check_gno(gno)
        return gno

    def _check_gno(self, gno: int) -> None:
        if self.type_code == ANONYMOUS_GTID_LOG_EVENT:
            if gno != 0:
                raise self._error(f"anonymous GTID with GNO {gno} (must be 0)")
        elif not 1 <= gno < _GNO_END:
            raise self._error(f"invalid GNO {gno} (valid: 1 .. 2^63-2)")

    @property
    def is_anonymous(self) -> bool:
        return self.type_code == ANONYMOUS_GTID_LOG_EVENT

    @property
    def gtid(self) -> str:
        """``uuid:gno``, ``uuid:tag:gno`` or ``ANONYMOUS``."""
        if self.is_anonymous:
            return "ANONYMOUS"
        tag = self.tag
        return f"{self.uuid}:{tag}:{self.gno}" if tag else f"{self.uuid}:{self.gno}"

    @property
    def lt_type(self) -> int | None:
        """Logical-timestamp type code (2 from 5.7.5 on); ``None`` for the 5.6 form."""
        pos = self.body_start + 25
        return self.buf[pos] if pos < self.body_end else None

    @property
    def last_committed(self) -> int | None:
        return self._clock(26)

    @property
    def sequence_number(self) -> int | None:
        return self._clock(34)

    def _clock(self, rel: int) -> int | None:
        if self.lt_type != _LOGICAL_TIMESTAMP_TYPECODE:
            return None  # 5.6, or 5.7.4 and earlier (other type code): MySQL ignores the rest
        pos = self.body_start + rel
        self._need(pos, 8, "logical clock")
        return _I64.unpack_from(self.buf, pos)[0]

    # -- variable tail -------------------------------------------------------------------------
    @property
    def immediate_commit_timestamp(self) -> int | None:
        return self._decoded_tail()[0]

    @property
    def original_commit_timestamp(self) -> int | None:
        return self._decoded_tail()[1]

    @property
    def transaction_length(self) -> int | None:
        """Bytes of the whole transaction, this GTID event included (8.0.2+); ``None`` if absent."""
        return self._decoded_tail()[2]

    @property
    def immediate_server_version(self) -> int | None:
        return self._decoded_tail()[3]

    @property
    def original_server_version(self) -> int | None:
        return self._decoded_tail()[4]

    @property
    def commit_group_ticket(self) -> int | None:
        return self._decoded_tail()[5]

    def _decoded_tail(self) -> tuple:
        if self._tail is None:
            self._tail = self._decode_tail()
        return self._tail

    def _decode_tail(self) -> tuple:
        ict = oct_ = trx_len = isv = osv = ticket = None
        end = self.body_end
        pos = self.body_start + _MYSQL_GTID_POST_HEADER.size
        if self.lt_type == _LOGICAL_TIMESTAMP_TYPECODE:
            self._need(self.body_start, _MYSQL_GTID_POST_HEADER.size, "logical clocks")
            if end - pos >= _COMMIT_TS_LEN:
                ict = int.from_bytes(self.buf[pos : pos + _COMMIT_TS_LEN], "little")
                pos += _COMMIT_TS_LEN
                if ict & _COMMIT_TS_FLAG:
                    ict &= ~_COMMIT_TS_FLAG
                    self._need(pos, _COMMIT_TS_LEN, "original_commit_timestamp")
                    oct_ = int.from_bytes(self.buf[pos : pos + _COMMIT_TS_LEN], "little")
                    pos += _COMMIT_TS_LEN
                else:
                    oct_ = ict
                if end - pos >= 1:
                    trx_len, pos = self._packed(pos, "transaction_length")
                if end - pos >= 4:
                    isv = _U32.unpack_from(self.buf, pos)[0]
                    pos += 4
                    if isv & _SERVER_VERSION_FLAG:
                        isv &= ~_SERVER_VERSION_FLAG
                        osv = self._u32(pos, "original_server_version")
                        pos += 4
                    else:
                        osv = isv
                    if end - pos >= 8:
                        ticket = _U64.unpack_from(self.buf, pos)[0]
        return (ict, oct_, trx_len, isv, osv, ticket)

    def describe(self) -> str:
        parts = [self.gtid]
        if self.last_committed is not None:
            parts.append(f"last_committed={self.last_committed} sequence_number={self.sequence_number}")
        if self.transaction_length is not None:
            parts.append(f"transaction_length={self.transaction_length}")
        return " ".join(parts)


class GtidTaggedView(GtidView):
    """GTID_TAGGED_LOG_EVENT (8.3+): the same fields as a GTID event plus ``tag``, encoded with
    ``mysql::serialization`` (``Gtid_event::define_fields``).

    Layout: varlen serialization version (1), varlen message size (counted from the message's
    first byte), varlen last-non-ignorable field id, then ``(field id, value)`` pairs in id
    order, a missing field being simply skipped.  Field ids: 0 gtid_flags, 1 uuid (16 varlen
    bytes), 2 gno (signed), 3 tag (string <= 32), 4 last_committed (signed), 5 sequence_number
    (signed), 6 immediate_commit_timestamp, 7 original_commit_timestamp, 8 transaction_length,
    9 immediate_server_version, 10 original_server_version, 11 commit_group_ticket.  Fields after
    11 are ignorable extensions from newer servers; a non-ignorable one is an error, as in MySQL.
    """

    __slots__ = ("_fields",)

    type_codes = (GTID_TAGGED_LOG_EVENT,)

    _LAST_KNOWN_FIELD_ID = 11

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        self._fields: tuple | None = None

    def _decoded(self) -> tuple:
        if self._fields is None:
            try:
                self._fields = self._decode_fields()
            except BinlogFormatError as exc:
                if exc.args[0].startswith(f"at offset {self.offset}: {self.name}: "):
                    raise
                raise self._nested(exc, 0) from None
        return self._fields

    def _decode_fields(self) -> tuple:
        from .serialization import read_string, read_varlen_int, read_varlen_uint

        body = self.buf[self.body_start : self.body_end]
        version, pos = read_varlen_uint(body, 0)
        if version != 1:
            raise self._error(f"unsupported serialization format version {version}")
        size, pos = read_varlen_uint(body, pos)
        if size > len(body) or size < pos:
            raise self._error(f"message size {size} does not fit the {len(body)}-byte body")
        msg = body[:size]
        last_non_ignorable, pos = read_varlen_uint(msg, pos)
        if last_non_ignorable > self._LAST_KNOWN_FIELD_ID + 1:
            raise self._error(
                f"unknown non-ignorable field {last_non_ignorable - 1} (this reader knows fields up to "
                f"{self._LAST_KNOWN_FIELD_ID})"
            )
        values: list = [None] * (self._LAST_KNOWN_FIELD_ID + 1)
        for field_id in range(self._LAST_KNOWN_FIELD_ID + 1):
            if pos >= size:
                break
            found, after_id = read_varlen_uint(msg, pos)
            if found != field_id:
                continue  # field absent: the encoder left it out (its predicate was false)
            pos = after_id
            if field_id == 1:
                sid = bytearray(16)
                for i in range(16):
                    byte, pos = read_varlen_uint(msg, pos)
                    if byte > 0xFF:
                        raise self._error(f"UUID byte {i} has value {byte}")
                    sid[i] = byte
                values[1] = bytes(sid)
            elif field_id == 3:
                values[3], pos = read_string(msg, pos, max_length=_TAG_MAX_LENGTH)
            elif field_id in (2, 4, 5):
                values[field_id], pos = read_varlen_int(msg, pos)
            else:
                values[field_id], pos = read_varlen_uint(msg, pos)
        flags, sid, gno, tag, last_committed, seq, ict, oct_, trx_len, isv, osv, ticket = values
        # Defaults of Gtid_event's constructor and its "field missing" functors.
        if oct_ is None:
            oct_ = ict
        if osv is None:
            osv = isv
        if flags is not None and flags > 0xFF:
            raise self._error(f"gtid_flags value {flags} does not fit a byte")
        for name, value in (("immediate_server_version", isv), ("original_server_version", osv)):
            if value is not None and value > 0xFFFFFFFF:
                raise self._error(f"{name} {value} does not fit 32 bits")
        return (
            flags or 0,
            sid or bytes(16),
            gno or 0,
            (tag or "").lower(),
            last_committed,
            seq,
            ict,
            oct_,
            trx_len,
            isv,
            osv,
            ticket,
        )

    @property
    def gtid_flags(self) -> int:
        return self._decoded()[0]

    @property
    def sid(self) -> bytes:
        return self._decoded()[1]

    @property
    def gno(self) -> int:
        gno = self._decoded()[2]
        self._check_gno(gno)
        return gno

    @property
    def tag(self) -> str:
        return self._decoded()[3]

    @property
    def lt_type(self) -> int | None:
        return None  # the serialization format has no type code: clocks are always logical

    @property
    def last_committed(self) -> int | None:
        return self._decoded()[4]

    @property
    def sequence_number(self) -> int | None:
        return self._decoded()[5]

    def _decoded_tail(self) -> tuple:
        return self._decoded()[6:]


# ---------------------------------------------------------------------------------------------
# PREVIOUS_GTIDS (35), XA_PREPARE (38)
# ---------------------------------------------------------------------------------------------


class PreviousGtidsView(EventView):
    """PREVIOUS_GTIDS_LOG_EVENT: the GTID set of all earlier files, in ``Gtid_set::encode`` form
    (untagged, or the 8.3+ tagged format; ``GtidSet.decode`` detects which)."""

    __slots__ = ("_set",)

    type_codes = (PREVIOUS_GTIDS_LOG_EVENT,)

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        self._set = None

    @property
    def encoded(self) -> bytes:
        return bytes(self.buf[self.body_start + self._post_header_len(0) : self.body_end])

    @property
    def is_tagged_format(self) -> bool:
        start = self.body_start + self._post_header_len(0)
        self._need(start, 8, "GTID set header")
        return self.buf[start + 7] != 0

    @property
    def gtid_set(self) -> GtidSet:
        """The decoded set (decoded once; returns the same object on every access)."""
        if self._set is None:
            from .gtid import GtidSet

            start = self.body_start + self._post_header_len(0)
            if self.body_end - start < 8:
                raise self._error(f"GTID set needs at least 8 bytes, the body has {max(self.body_end - start, 0)}")
            try:
                self._set = GtidSet.decode(self.buf, start, self.body_end - start)
            except BinlogFormatError as exc:
                raise self._nested(exc, self.body_start) from None
        return self._set

    def describe(self) -> str:
        gtid_set = self.gtid_set
        return gtid_set.format(separator=",") if gtid_set else "(empty)"


class XaPrepareView(EventView):
    """XA_PREPARE_LOG_EVENT: one_phase (u8), then MySQL's XID: formatID, gtrid_length and
    bqual_length (u32 each), then gtrid+bqual bytes.  Lengths are checked as MySQL does
    (each <= 64)."""

    __slots__ = ()

    type_codes = (XA_PREPARE_LOG_EVENT,)

    def _start(self) -> int:
        return self.body_start + self._post_header_len(0)

    @property
    def one_phase(self) -> bool:
        return bool(self._u8(self._start(), "one_phase"))

    @property
    def format_id(self) -> int:
        return self._u32(self._start() + 1, "formatID")

    def _lengths(self) -> tuple[int, int]:
        start = self._start()
        gtrid_len = self._u32(start + 5, "gtrid_length")
        bqual_len = self._u32(start + 9, "bqual_length")
        if gtrid_len > _XID_PART_MAX or bqual_len > _XID_PART_MAX:
            raise self._error(f"invalid XID lengths gtrid={gtrid_len} bqual={bqual_len} (max 64 each)")
        return gtrid_len, bqual_len

    @property
    def gtrid(self) -> bytes:
        gtrid_len, _ = self._lengths()
        return self._bytes(self._start() + 13, gtrid_len, "gtrid")

    @property
    def bqual(self) -> bytes:
        gtrid_len, bqual_len = self._lengths()
        return self._bytes(self._start() + 13 + gtrid_len, bqual_len, "bqual")

    @property
    def xid_text(self) -> str:
        return xid_text(self.format_id, self.gtrid, self.bqual)

    def describe(self) -> str:
        if self.one_phase:
            return f"XA COMMIT {self.xid_text} ONE PHASE"
        return f"XA PREPARE {self.xid_text}"


# ---------------------------------------------------------------------------------------------
# HEARTBEAT (27) and HEARTBEAT_V2 (41)
# ---------------------------------------------------------------------------------------------


class HeartbeatView(EventView):
    """HEARTBEAT_LOG_EVENT (v1): the master's current file name as the body, its position in the
    header's log_pos.

    MariaDB's >4 GB case: the header's log_pos is 0 and an 8-byte sub-header before the name
    carries the position (``send_heartbeat_event``, ``HB_SUB_HEADER_LEN``).  A MySQL heartbeat
    can never have log_pos 0 (MySQL rejects log_pos < 4), so log_pos 0 alone selects the
    sub-header form whatever the flavour.
    """

    __slots__ = ()

    type_codes = (HEARTBEAT_LOG_EVENT,)

    @property
    def has_sub_header(self) -> bool:
        return self.header.log_pos == 0

    @property
    def position(self) -> int:
        log_pos = self.header.log_pos
        if log_pos == 0:
            return self._u64(self.body_start, "position sub-header")
        if log_pos < 4:
            raise self._error(f"log_pos {log_pos} is before the first event (invalid heartbeat)")
        return log_pos

    log_pos = position  # type: ignore[assignment]  # the heartbeat's position *is* its log_pos

    @property
    def log_file_bytes(self) -> bytes:
        start = self.body_start + (8 if self.has_sub_header else 0)
        if start >= self.body_end:
            raise self._error("no binlog file name (event smaller than expected)")
        return bytes(self.buf[start : self.body_end])

    @property
    def log_file(self) -> str:
        return _decode_name(self.log_file_bytes)

    def describe(self) -> str:
        return f"{self.log_file}:{self.position}"


class HeartbeatV2View(EventView):
    """HEARTBEAT_LOG_EVENT_V2 (8.0.26+): a TLV list (packed-integer type and length) carrying the
    file name (type 1) and the 64-bit position (type 2), ended by type 0.

    Decoded as ``codecs::binary::Heartbeat::decode`` does, from the first body byte (the FDE's
    post-header length is not consulted); unknown types are skipped by their length.  A field
    the event lacks reads as MySQL's default (empty name, position 0).
    """

    __slots__ = ("_fields",)

    type_codes = (HEARTBEAT_LOG_EVENT_V2,)

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        self._fields: tuple[bytes, int] | None = None

    def _decoded(self) -> tuple[bytes, int]:
        if self._fields is None:
            name = b""
            position = 0
            pos = self.body_start
            end = self.body_end
            while pos < end:
                field_type, pos = self._packed(pos, "field type")
                if field_type == HEARTBEAT_FIELD_END:
                    break
                length, pos = self._packed(pos, "field length")
                if field_type == HEARTBEAT_FIELD_LOG_FILENAME:
                    name = self._bytes(pos, length, "log file name")
                    pos += length
                elif field_type == HEARTBEAT_FIELD_LOG_POSITION:
                    position, pos = self._packed(pos, "log position")
                else:
                    self._need(pos, length, f"unknown field {field_type}")
                    pos += length
            self._fields = (name, position)
        return self._fields

    @property
    def log_file_bytes(self) -> bytes:
        return self._decoded()[0]

    @property
    def log_file(self) -> str:
        return _decode_name(self._decoded()[0])

    @property
    def position(self) -> int:
        return self._decoded()[1]

    log_pos = position  # type: ignore[assignment]

    def describe(self) -> str:
        return f"{self.log_file}:{self.position}"


# ---------------------------------------------------------------------------------------------
# TRANSACTION_PAYLOAD (40)
# ---------------------------------------------------------------------------------------------


class TransactionPayloadView(EventView):
    """TRANSACTION_PAYLOAD_EVENT (8.0.20+): a TLV header (payload_size, compression_type,
    uncompressed_size, end mark) from the first body byte, then the payload: complete events
    without CRCs, zstd-compressed (type 0) or stored (type 255).

    The FDE's post-header entry for this type holds the enum value 40, not a length (a MySQL
    quirk), and MySQL's decoder ignores it; so does this view.
    """

    __slots__ = ("_meta",)

    type_codes = (TRANSACTION_PAYLOAD_EVENT,)

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        self._meta: tuple[int, int, int, int | None] | None = None

    def _decoded(self) -> tuple[int, int, int, int | None]:
        if self._meta is None:
            payload_size = compression = uncompressed = None
            pos = self.body_start
            end = self.body_end
            while True:
                if pos >= end:
                    raise self._error("header ends without its end mark")
                field_type, pos = self._packed(pos, "field type")
                if field_type == PAYLOAD_FIELD_END:
                    break
                length, pos = self._packed(pos, "field length")
                if field_type == PAYLOAD_FIELD_SIZE:
                    payload_size, pos = self._packed(pos, "payload_size")
                elif field_type == PAYLOAD_FIELD_COMPRESSION_TYPE:
                    compression, pos = self._packed(pos, "compression_type")
                    if compression not in (PAYLOAD_COMPRESSION_ZSTD, PAYLOAD_COMPRESSION_NONE):
                        raise self._error(f"unknown compression type {compression}")
                elif field_type == PAYLOAD_FIELD_UNCOMPRESSED_SIZE:
                    uncompressed, pos = self._packed(pos, "uncompressed_size")
                else:
                    self._need(pos, length, f"unknown field {field_type}")
                    pos += length
            if payload_size is None or compression is None:
                missing = "payload_size" if payload_size is None else "compression_type"
                raise self._error(f"header has no {missing}")
            if payload_size > end - pos:
                raise self._error(f"payload_size {payload_size} exceeds the {end - pos} bytes left in the body")
            self._meta = (pos, payload_size, compression, uncompressed)
        return self._meta

    @property
    def payload_size(self) -> int:
        return self._decoded()[1]

    @property
    def compression_type(self) -> int:
        return self._decoded()[2]

    @property
    def uncompressed_size(self) -> int | None:
        """Informational only (MySQL does not require it); ``None`` when absent."""
        return self._decoded()[3]

    @property
    def payload_view(self) -> memoryview:
        """The compressed payload, zero-copy (it pins the caller's buffer while it lives)."""
        start, size, _, _ = self._decoded()
        return memoryview(self.buf)[start : start + size]

    @property
    def payload(self) -> bytes:
        return bytes(self.payload_view)

    @property
    def inner_format(self) -> FormatDescription:
        """The FDE that describes the inner events: the outer one with checksums off."""
        return dataclasses.replace(self.fde, checksum_alg=CHECKSUM_OFF)

    def iter_inner_events(self, *, chunk_size: int = 1 << 12) -> Iterator[EventView]:
        """Yield a view of each event inside the payload, decompressing as it goes.

        Memory stays bounded by the largest single inner event plus what ``chunk_size``
        compressed bytes expand to: the payload is fed to a zstd decompression object a slice
        at a time and each event's bytes are held only until the event is complete, so neither
        ``uncompressed_size`` nor a corrupt inner event_size makes it allocate more than the
        data really holds.  Each yielded view owns its bytes.

        The generator holds a view of the payload until it is exhausted or closed, so a caller
        feeding a resizable buffer should finish iterating before it resizes it.

        A truncated or corrupt frame raises ``BinlogFormatError``.  (``zstandard``'s
        ``stream_reader`` would report a frame cut short as a clean end of data, i.e. an
        empty or shortened transaction; the decompression object's ``eof`` flag does not.)
        """
        _, _, compression, uncompressed = self._decoded()
        inner_fde = self.inner_format
        if compression == PAYLOAD_COMPRESSION_NONE:
            chunks: Iterator[bytes | memoryview] = iter((self.payload_view,))
        else:
            chunks = self._zstd_chunks(max(1, chunk_size))
        yield from self._split_events(chunks, inner_fde, uncompressed)

    def _zstd_chunks(self, chunk_size: int) -> Iterator[bytes]:
        import zstandard

        payload = self.payload_view
        if not len(payload):
            return
        dctx = zstandard.ZstdDecompressor()
        dobj = dctx.decompressobj()
        pos = 0
        try:
            while pos < len(payload):
                piece = payload[pos : pos + chunk_size]
                pos += len(piece)
                out = dobj.decompress(piece)
                if out:
                    yield out
                if dobj.eof:
                    # The frame ended inside this slice; what follows it must be another frame.
                    pos -= len(dobj.unused_data)
                    if pos < len(payload):
                        dobj = dctx.decompressobj()
        except zstandard.ZstdError as exc:
            raise self._error(f"zstd decompression failed at payload offset {pos}: {exc}") from None
        if not dobj.eof:
            raise self._error("zstd frame is truncated (the payload ends before the frame does)")

    def _split_events(self, chunks, inner_fde: FormatDescription, uncompressed: int | None) -> Iterator[EventView]:
        pending = bytearray()
        start = 0  # first unconsumed byte of pending
        total = 0  # uncompressed offset of pending[start]
        for chunk in chunks:
            pending += chunk
            while len(pending) - start >= HEADER_LEN:
                size = _U32.unpack_from(pending, start + 9)[0]
                if size < HEADER_LEN:
                    raise self._error(f"inner event at uncompressed offset {total} has invalid event_size {size}")
                if uncompressed is not None and total + size > uncompressed:
                    raise self._error(
                        f"inner event at uncompressed offset {total} ({size} bytes) runs past "
                        f"uncompressed_size {uncompressed}"
                    )
                if len(pending) - start < size:
                    break
                yield view_event(bytes(pending[start : start + size]), 0, inner_fde)
                start += size
                total += size
            del pending[:start]
            start = 0
        if pending:
            where = "an event header" if len(pending) < HEADER_LEN else "an event"
            raise self._error(f"payload ends inside {where} at uncompressed offset {total}")
        if uncompressed is not None and total != uncompressed:
            raise self._error(f"payload holds {total} bytes of events, uncompressed_size says {uncompressed}")

    def describe(self) -> str:
        kind = {PAYLOAD_COMPRESSION_ZSTD: "ZSTD", PAYLOAD_COMPRESSION_NONE: "NONE"}[self.compression_type]
        text = f"{kind} payload_size={self.payload_size}"
        if self.uncompressed_size is not None:
            text += f" uncompressed_size={self.uncompressed_size}"
        return text


# ---------------------------------------------------------------------------------------------
# MariaDB: GTID (162), GTID_LIST (163), BINLOG_CHECKPOINT (161), START_ENCRYPTION (164)
# ---------------------------------------------------------------------------------------------


class MariaGtidView(EventView):
    """MariaDB GTID_EVENT: seq_no (u64), domain_id (u32), flags2 (u8), then optional fields in
    ``Gtid_log_event``'s order: commit_id (FL_GROUP_COMMIT_ID); XID (FL_PREPARED_XA or
    FL_COMPLETED_XA: formatID u32, gtrid_len u8, bqual_len u8, data); flags_extra (if any byte
    is left); extra_engines (FL_EXTRA_MULTI_ENGINE_E1); sa_seq_no (FL_COMMIT_ALTER_E1 or
    FL_ROLLBACK_ALTER_E1); thread_id u32 (FL_EXTRA_THREAD_ID, 11.5+); zero padding to 19 bytes.

    The GTID's server_id is the header's.  Absent optional fields read as ``None``
    (``flags_extra`` as 0).
    """

    __slots__ = ("_extra",)

    type_codes = (MARIA_GTID_EVENT,)

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        self._extra: tuple | None = None
        # MariaDB rejects a GTID event shorter than its 19-byte post-header (the body is padded).
        if self.body_len < _GTID_HEADER_LEN:
            raise self._error(f"body of {self.body_len} bytes is shorter than the {_GTID_HEADER_LEN}-byte minimum")

    @property
    def seq_no(self) -> int:
        return _U64.unpack_from(self.buf, self.body_start)[0]

    @property
    def domain_id(self) -> int:
        return _U32.unpack_from(self.buf, self.body_start + 8)[0]

    @property
    def flags2(self) -> int:
        return self.buf[self.body_start + 12]

    @property
    def gtid(self) -> MariaGtid:
        from .gtid import MariaGtid

        seq_no, domain_id, _ = _MARIA_GTID_FIXED.unpack_from(self.buf, self.body_start)
        return MariaGtid(domain_id, self.header.server_id, seq_no)

    @property
    def gtid_text(self) -> str:
        seq_no, domain_id, _ = _MARIA_GTID_FIXED.unpack_from(self.buf, self.body_start)
        return f"{domain_id}-{self.header.server_id}-{seq_no}"

    # -- flags2 helpers ------------------------------------------------------------------------
    @property
    def standalone(self) -> bool:
        """FL_STANDALONE: no BEGIN/COMMIT; the group is this GTID plus one statement (DDL...)."""
        return bool(self.flags2 & FL_STANDALONE)

    @property
    def transactional(self) -> bool:
        return bool(self.flags2 & FL_TRANSACTIONAL)

    @property
    def allow_parallel(self) -> bool:
        return bool(self.flags2 & FL_ALLOW_PARALLEL)

    @property
    def waited(self) -> bool:
        return bool(self.flags2 & FL_WAITED)

    @property
    def is_ddl(self) -> bool:
        return bool(self.flags2 & FL_DDL)

    @property
    def is_prepared_xa(self) -> bool:
        """FL_PREPARED_XA: the group ends with XA PREPARE (XA_PREPARE_LOG_EVENT)."""
        return bool(self.flags2 & FL_PREPARED_XA)

    @property
    def is_completed_xa(self) -> bool:
        """FL_COMPLETED_XA: the group is an XA COMMIT/ROLLBACK of an earlier prepared XA."""
        return bool(self.flags2 & FL_COMPLETED_XA)

    @property
    def is_xa(self) -> bool:
        return bool(self.flags2 & (FL_PREPARED_XA | FL_COMPLETED_XA))

    # -- optional fields -----------------------------------------------------------------------
    def _decoded(self) -> tuple:
        if self._extra is None:
            flags2 = self.flags2
            pos = self.body_start + 13
            commit_id = xid = None
            flags_extra = 0
            extra_engines = sa_seq_no = thread_id = None
            if flags2 & FL_GROUP_COMMIT_ID:
                commit_id = self._u64(pos, "commit_id")
                pos += 8
            if flags2 & (FL_PREPARED_XA | FL_COMPLETED_XA):
                format_id = self._u32(pos, "XID formatID")
                gtrid_len = self._u8(pos + 4, "XID gtrid_length")
                bqual_len = self._u8(pos + 5, "XID bqual_length")
                if gtrid_len > _XID_PART_MAX or bqual_len > _XID_PART_MAX:
                    raise self._error(f"invalid XID lengths gtrid={gtrid_len} bqual={bqual_len} (max 64 each)")
                data = self._bytes(pos + 6, gtrid_len + bqual_len, "XID data")
                xid = (format_id, data[:gtrid_len], data[gtrid_len:])
                pos += 6 + gtrid_len + bqual_len
            if pos < self.body_end:
                flags_extra = self.buf[pos]
                pos += 1
                if flags_extra & FL_EXTRA_MULTI_ENGINE_E1:
                    extra_engines = self._u8(pos, "extra_engines")
                    pos += 1
                if flags_extra & (FL_COMMIT_ALTER_E1 | FL_ROLLBACK_ALTER_E1):
                    sa_seq_no = self._u64(pos, "sa_seq_no")
                    pos += 8
                if flags_extra & FL_EXTRA_THREAD_ID:
                    thread_id = self._u32(pos, "thread_id")
                    pos += 4
            self._extra = (commit_id, xid, flags_extra, extra_engines, sa_seq_no, thread_id)
        return self._extra

    @property
    def commit_id(self) -> int | None:
        """Group-commit id (FL_GROUP_COMMIT_ID): events with the same id committed together."""
        return self._decoded()[0]

    @property
    def xid_format_id(self) -> int | None:
        xid = self._decoded()[1]
        return None if xid is None else xid[0]

    @property
    def xid_gtrid(self) -> bytes | None:
        xid = self._decoded()[1]
        return None if xid is None else xid[1]

    @property
    def xid_bqual(self) -> bytes | None:
        xid = self._decoded()[1]
        return None if xid is None else xid[2]

    @property
    def xid_text(self) -> str | None:
        xid = self._decoded()[1]
        return None if xid is None else xid_text(*xid)

    @property
    def flags_extra(self) -> int:
        return self._decoded()[2]

    @property
    def extra_engines(self) -> int | None:
        return self._decoded()[3]

    @property
    def sa_seq_no(self) -> int | None:
        """seq_no of the START ALTER this COMMIT/ROLLBACK ALTER completes (10.8+)."""
        return self._decoded()[4]

    @property
    def thread_id(self) -> int | None:
        return self._decoded()[5]

    @property
    def is_start_alter(self) -> bool:
        return bool(self.flags_extra & FL_START_ALTER_E1)

    @property
    def is_commit_alter(self) -> bool:
        return bool(self.flags_extra & FL_COMMIT_ALTER_E1)

    @property
    def is_rollback_alter(self) -> bool:
        return bool(self.flags_extra & FL_ROLLBACK_ALTER_E1)

    _FLAG_WORDS: ClassVar[tuple[tuple[int, str], ...]] = (
        (FL_STANDALONE, "standalone"),
        (FL_TRANSACTIONAL, "trans"),
        (FL_ALLOW_PARALLEL, "parallel"),
        (FL_WAITED, "waited"),
        (FL_DDL, "ddl"),
        (FL_PREPARED_XA, "xa-prepare"),
        (FL_COMPLETED_XA, "xa-complete"),
    )

    def describe(self) -> str:
        parts = [self.gtid_text]
        flags2 = self.flags2
        parts.extend(word for bit, word in self._FLAG_WORDS if flags2 & bit)
        if self.commit_id is not None:
            parts.append(f"cid={self.commit_id}")
        if self.xid_text is not None:
            parts.append(f"xid={self.xid_text}")
        if self.sa_seq_no is not None:
            parts.append(f"sa_seq_no={self.sa_seq_no}")
        if self.thread_id is not None:
            parts.append(f"thread_id={self.thread_id}")
        return " ".join(parts)


class MariaGtidListView(EventView):
    """MariaDB GTID_LIST_EVENT: count_and_flags (u32: low 28 bits count, top bits flags), then
    count x (domain_id u32, server_id u32, seq_no u64).  Bytes after the entries (the empty
    list's 2-byte padding) are ignored, as MariaDB ignores them."""

    __slots__ = ("_gtids",)

    type_codes = (MARIA_GTID_LIST_EVENT,)

    def __init__(self, buf: Buffer, offset: int, fde: FormatDescription | None) -> None:
        super().__init__(buf, offset, fde)
        self._gtids: tuple | None = None
        self._need(self.body_start, 4, "count_and_flags")

    @property
    def count(self) -> int:
        return _U32.unpack_from(self.buf, self.body_start)[0] & GTID_LIST_COUNT_MASK

    @property
    def flags(self) -> int:  # type: ignore[override]
        """GTID_LIST_FLAG_* bits, in place (not shifted): UNTIL_REACHED = 1<<28, IGN_GTIDS = 1<<29.

        (The common header's flags are ``header.flags``.)"""
        return _U32.unpack_from(self.buf, self.body_start)[0] & ~GTID_LIST_COUNT_MASK

    @property
    def gtids(self) -> tuple[MariaGtid, ...]:
        """The entries in event order (a domain's most recent GTID is its last entry)."""
        if self._gtids is None:
            from .gtid import MariaGtid

            count = self.count
            pos = self.body_start + 4
            self._need(pos, count * _GTID_LIST_ENTRY.size, f"{count} GTID entries")
            self._gtids = tuple(
                MariaGtid._make(_GTID_LIST_ENTRY.unpack_from(self.buf, pos + i * _GTID_LIST_ENTRY.size))
                for i in range(count)
            )
        return self._gtids

    @property
    def state(self) -> MariaBinlogState:
        """The list as a binlog state (what ``gtid_binlog_state`` was at the start of the file)."""
        from .gtid import MariaBinlogState

        return MariaBinlogState(self.gtids)

    def describe(self) -> str:
        text = "[" + ",".join(str(g) for g in self.gtids) + "]"
        flags = self.flags
        if flags & GTID_LIST_FLAG_UNTIL_REACHED:
            text += " until-reached"
        if flags & GTID_LIST_FLAG_IGN_GTIDS:
            text += " ign-gtids"
        return text


class BinlogCheckpointView(EventView):
    """MariaDB BINLOG_CHECKPOINT_EVENT: binlog_file_len (u32 post-header), then the name of the
    oldest binlog still needed for crash recovery."""

    __slots__ = ()

    type_codes = (MARIA_BINLOG_CHECKPOINT_EVENT,)

    @property
    def file_name_bytes(self) -> bytes:
        length = self._u32(self.body_start, "binlog_file_len")
        return self._bytes(self.body_start + self._post_header_len(4), length, "file name")

    @property
    def file_name(self) -> str:
        return _decode_name(self.file_name_bytes)

    def describe(self) -> str:
        return self.file_name


class StartEncryptionView(EventView):
    """MariaDB START_ENCRYPTION_EVENT: scheme (u8), key_version (u32), nonce (12 bytes).  Every
    event after it in the file is encrypted; a master sends it to replicas as an ignorable event."""

    __slots__ = ()

    type_codes = (MARIA_START_ENCRYPTION_EVENT,)

    @property
    def scheme(self) -> int:
        return self._u8(self.body_start, "scheme")

    @property
    def key_version(self) -> int:
        return self._u32(self.body_start + 1, "key_version")

    @property
    def nonce(self) -> bytes:
        return self._bytes(self.body_start + 5, 12, "nonce")

    def describe(self) -> str:
        return f"scheme {self.scheme}, key version {self.key_version}"


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------

EVENT_VIEWS: dict[int, type[EventView]] = {
    code: cls
    for cls in (
        FormatDescriptionView,
        QueryView,
        ExecuteLoadQueryView,
        RotateView,
        XidView,
        IncidentView,
        GtidView,
        GtidTaggedView,
        PreviousGtidsView,
        XaPrepareView,
        HeartbeatView,
        HeartbeatV2View,
        TransactionPayloadView,
        MariaGtidView,
        MariaGtidListView,
        BinlogCheckpointView,
        StartEncryptionView,
    )
    for code in cls.type_codes
}


def view_event(buf: Buffer, offset: int = 0, fde: FormatDescription | None = None) -> EventView:
    """The typed view of the event at ``buf[offset]`` (``OpaqueEvent`` for types without one).

    ``fde`` is the FORMAT_DESCRIPTION in force (checksum length, post-header lengths); ``None``
    stands for a pre-FDE stream without checksums.  Raises ``BinlogFormatError`` when the header
    is short or event_size does not fit ``buf``; field errors surface when a field is read.
    """
    if len(buf) - offset < HEADER_LEN or offset < 0:
        raise BinlogFormatError(f"event header needs {HEADER_LEN} bytes, have {max(len(buf) - offset, 0)}", offset)
    cls = EVENT_VIEWS.get(buf[offset + 4], OpaqueEvent)
    return cls(buf, offset, fde)
