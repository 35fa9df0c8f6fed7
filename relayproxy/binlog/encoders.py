"""Encoders for the events the relay writes itself: fake rotates, FDE copies, heartbeats and GTID preambles.

Everything here returns complete event bytes (19-byte header, body, and a CRC32 trailer when
asked for) with ``event_size`` set to the real length.  The byte layouts mirror what the
servers' dump threads send, checked against their sources:

* MySQL ``sql/rpl_binlog_sender.cc``: ``fake_rotate_event`` (timestamp 0, log_pos 0,
  LOG_EVENT_ARTIFICIAL_F), ``send_heartbeat_event`` (timestamp 0, flags 0, log_pos = position),
  ``send_format_description_event`` (clears LOG_EVENT_BINLOG_IN_USE_F; when starting mid-file
  zeroes log_pos and ``created`` and recomputes the CRC);
* MariaDB ``sql/sql_repl.cc``: ``send_heartbeat_event`` (the >4 GB sub-header),
  ``send_format_descriptor_event``;
* ``codecs/binary.cpp`` for the HEARTBEAT_V2 TLV body.

Fillers (``filler_header``, ``filler_sizes``, ``filler_crc``) are the relay's own: IGNORABLE_LOG_EVENT
(28) with LOG_EVENT_IGNORABLE_F and a zero body, covering a stretch of a relay file that a GTID dump
skipped (see ``relay/epochs.py``). Large ones stay sparse on disk, so the CRC of the zeros is computed
in chunks.

Checksums in transit: neither MySQL nor MariaDB strips or adds CRCs to binlog events when
serving a replica.  A replica that did not announce ``@master_binlog_checksum`` is refused
(error 1236, "Slave can not handle replication events with the checksum that master is
configured to log"); every other replica gets the events byte for byte as they are in the
file, and only the events the dump thread makes up (fake rotate, heartbeat) get a CRC
computed for them.  ``strip_checksum``/``add_checksum`` therefore have no server behaviour to
copy; they keep ``log_pos`` unchanged, because log_pos is the end offset of the event *in the
master's file*, where the event has the size the file gives it.  After stripping, ``log_pos -
event_size`` is no longer the event's start offset in that file: use them for local
processing (tests, tools feeding a checksum-less consumer), not for bytes served as a master.
"""

from __future__ import annotations

import operator
import struct
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Union

from . import checksum as _checksum
from .constants import (
    CHECKSUM_CRC32,
    CHECKSUM_LEN,
    CHECKSUM_OFF,
    CHECKSUM_UNDEF,
    FORMAT_DESCRIPTION_EVENT,
    GTID_LIST_COUNT_MASK,
    HEADER_LEN,
    HEARTBEAT_FIELD_END,
    HEARTBEAT_FIELD_LOG_FILENAME,
    HEARTBEAT_FIELD_LOG_POSITION,
    HEARTBEAT_LOG_EVENT,
    HEARTBEAT_LOG_EVENT_V2,
    IGNORABLE_LOG_EVENT,
    LOG_EVENT_ARTIFICIAL_F,
    LOG_EVENT_BINLOG_IN_USE_F,
    LOG_EVENT_IGNORABLE_F,
    MARIA_BINLOG_CHECKPOINT_EVENT,
    MARIA_GTID_LIST_EVENT,
    PREVIOUS_GTIDS_LOG_EVENT,
    ROTATE_EVENT,
)
from .events import HEADER, BinlogFormatError, EventHeader, FormatDescription
from .packed import encode_packed

if TYPE_CHECKING:
    from .gtid import GtidSet, MariaBinlogState, MariaGtid

__all__ = [
    "encode_event",
    "rotate",
    "artificial_rotate",
    "fde_copy",
    "heartbeat_v1",
    "heartbeat_v2",
    "previous_gtids",
    "gtid_list",
    "binlog_checkpoint",
    "strip_checksum",
    "add_checksum",
    "filler_header",
    "filler_sizes",
    "filler_crc",
    "filler",
    "FILLER_MAX_SIZE",
    "net_store_length",
]

FileName = Union[str, bytes]

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_GTID_LIST_ENTRY = struct.Struct("<IIQ")
_UINT32_MAX = 0xFFFFFFFF
_UINT64_MAX = (1 << 64) - 1
_FN_REFLEN = 512  # servers cap file names at FN_REFLEN - 1 bytes
_FDE_CREATED_OFFSET = HEADER_LEN + 2 + 50  # binlog_version u16, server_version[50], created u32
_FLAGS_OFFSET = 17
_LOG_POS_OFFSET = 13
_SIZE_OFFSET = 9


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def _uint(name: str, value: int, maximum: int) -> int:
    value = operator.index(value)
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} {value} is outside 0..{maximum}")
    return value


def encode_event(
    type_code: int,
    body: bytes,
    *,
    server_id: int,
    log_pos: int,
    checksum: bool,
    timestamp: int = 0,
    flags: int = 0,
) -> bytes:
    """A complete event: header with the right event_size, ``body``, and a CRC32 if ``checksum``."""
    size = HEADER_LEN + len(body) + (CHECKSUM_LEN if checksum else 0)
    event = HEADER.pack(
        _uint("timestamp", timestamp, _UINT32_MAX),
        _uint("type code", type_code, 0xFF),
        _uint("server_id", server_id, _UINT32_MAX),
        _uint("event_size", size, _UINT32_MAX),
        _uint("log_pos", log_pos, _UINT32_MAX),
        _uint("flags", flags, 0xFFFF),
    ) + bytes(body)
    return _checksum.append(event) if checksum else event


def net_store_length(value: int) -> bytes:
    """MySQL's packed integer (``net_store_length``): 1, 3, 4 or 9 bytes (binlog/packed.py)."""
    return encode_packed(value)


def _file_name(name: FileName, what: str) -> bytes:
    """A binlog file name as the dump thread sends it: basename only, no NUL, < FN_REFLEN bytes.

    ``str`` names are encoded with surrogateescape so names decoded by the views round-trip.
    """
    raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else bytes(name)
    raw = raw.rsplit(b"/", 1)[-1]  # the servers strip the directory (dirname_length)
    if not raw:
        raise ValueError(f"{what}: empty file name")
    if b"\0" in raw:
        raise ValueError(f"{what}: file name contains a NUL byte")
    if len(raw) >= _FN_REFLEN:
        raise ValueError(f"{what}: file name of {len(raw)} bytes exceeds the server limit of {_FN_REFLEN - 1}")
    return raw


# ---------------------------------------------------------------------------------------------
# ROTATE
# ---------------------------------------------------------------------------------------------


def rotate(
    next_file: FileName,
    position: int,
    *,
    server_id: int,
    checksum: bool,
    timestamp: int = 0,
    log_pos: int = 0,
    flags: int = 0,
) -> bytes:
    """A ROTATE_EVENT: ``position`` (u64) then the file name, no NUL.

    With the defaults plus ``flags=LOG_EVENT_ARTIFICIAL_F`` it is the fake rotate of
    ``artificial_rotate``; with a real timestamp, log_pos and flags it reproduces the rotate a
    server writes at the end of a binlog file.
    """
    body = _U64.pack(_uint("position", position, _UINT64_MAX)) + _file_name(next_file, "ROTATE")
    return encode_event(
        ROTATE_EVENT, body, server_id=server_id, log_pos=log_pos, checksum=checksum, timestamp=timestamp, flags=flags
    )


def artificial_rotate(next_file: FileName, position: int, server_id: int, checksum: bool) -> bytes:
    """The fake ROTATE a master sends first on every dump and at each file switch.

    timestamp 0 and log_pos 0 (so the replica does not advance its read position by it),
    flags LOG_EVENT_ARTIFICIAL_F, ``position`` = where the replica starts in ``next_file``
    (4, or the requested position).  ``checksum`` is whether the replica gets CRCs.
    """
    return rotate(next_file, position, server_id=server_id, checksum=checksum, flags=LOG_EVENT_ARTIFICIAL_F)


# ---------------------------------------------------------------------------------------------
# FORMAT_DESCRIPTION copy
# ---------------------------------------------------------------------------------------------


def fde_copy(
    original: bytes | bytearray | memoryview,
    *,
    clear_in_use: bool = True,
    log_pos: int | None = None,
    created: int | None = None,
    checksum_alg: int | None = None,
) -> bytes:
    """A copy of a FORMAT_DESCRIPTION_EVENT with its header/post-header adjusted as a dump thread does.

    * ``clear_in_use``: clear LOG_EVENT_BINLOG_IN_USE_F (a master always does when sending);
    * ``log_pos``: the header's log_pos (0 when the dump starts mid-file, so the replica does
      not count the FDE in its position);
    * ``created``: the create_timestamp (0 when starting mid-file, so the replica does not drop
      its temporary tables);
    * ``checksum_alg``: rewrite the checksum_alg byte (``CHECKSUM_OFF`` / ``CHECKSUM_CRC32``),
      e.g. for a relay that stores the stream with another checksum setting.

    The FDE of a checksum-aware server always ends with the alg byte and a CRC32, whatever the
    alg says (the corpus has OFF files from 5.6, 5.7 and MariaDB 10.0 with a valid FDE CRC), so
    the copy keeps those 4 bytes and recomputes them; a pre-checksum FDE has neither, and asking
    to set its checksum_alg is an error.  The CRC is computed with the in-use flag masked out,
    as the server computes it, so a copy that keeps the flag still verifies.

    ``original`` must be exactly one FDE; its CRC is verified (when its alg is CRC32) before
    anything is changed, so a corrupt FDE is never re-signed.
    """
    data = bytes(original)
    fde = FormatDescription.parse(data, 0)
    size = _U32.unpack_from(data, _SIZE_OFFSET)[0]
    if len(data) != size:
        raise BinlogFormatError(f"fde_copy needs exactly one event: event_size {size}, got {len(data)} bytes", 0)
    event = bytearray(data)
    flags = _U16.unpack_from(event, _FLAGS_OFFSET)[0]
    if clear_in_use:
        flags &= ~LOG_EVENT_BINLOG_IN_USE_F
    _U16.pack_into(event, _FLAGS_OFFSET, flags)
    if log_pos is not None:
        _U32.pack_into(event, _LOG_POS_OFFSET, _uint("log_pos", log_pos, _UINT32_MAX))
    if created is not None:
        _U32.pack_into(event, _FDE_CREATED_OFFSET, _uint("created", created, _UINT32_MAX))
    if fde.checksum_alg == CHECKSUM_UNDEF:
        if checksum_alg is not None:
            raise ValueError(
                f"server {fde.server_version} predates binlog checksums: its FDE has no checksum_alg byte to set"
            )
        return bytes(event)
    if checksum_alg is not None:
        if checksum_alg not in (CHECKSUM_OFF, CHECKSUM_CRC32):
            raise ValueError(f"checksum_alg must be CHECKSUM_OFF (0) or CHECKSUM_CRC32 (1), not {checksum_alg}")
        event[-CHECKSUM_LEN - 1] = checksum_alg
    signed = bytearray(event[:-CHECKSUM_LEN])
    _U16.pack_into(signed, _FLAGS_OFFSET, flags & ~LOG_EVENT_BINLOG_IN_USE_F)
    event[-CHECKSUM_LEN:] = _U32.pack(zlib.crc32(signed))
    return bytes(event)


# ---------------------------------------------------------------------------------------------
# Heartbeats
# ---------------------------------------------------------------------------------------------


def heartbeat_v1(log_file: FileName, log_pos: int, server_id: int, checksum: bool, mariadb: bool = False) -> bytes:
    """HEARTBEAT_LOG_EVENT as the master's dump thread sends it while idle.

    timestamp 0, flags 0, the current file's basename as the body and the current position in
    log_pos.  A position past 4 GB does not fit log_pos: MariaDB (``mariadb=True``) then sets
    log_pos 0 and puts the position in an 8-byte sub-header before the name; MySQL would
    silently truncate it, which makes its replica fail with error 1623, so that case raises
    ``ValueError`` here (use ``heartbeat_v2`` for MySQL replicas that asked for it).

    A replica checks the name against the last ROTATE's and the position against what it has
    already read, so pass the served file's name and the position of the last byte sent.
    """
    name = _file_name(log_file, "HEARTBEAT")
    log_pos = _uint("log_pos", log_pos, _UINT64_MAX)
    if log_pos <= _UINT32_MAX:
        return encode_event(HEARTBEAT_LOG_EVENT, name, server_id=server_id, log_pos=log_pos, checksum=checksum)
    if not mariadb:
        raise ValueError(f"heartbeat position {log_pos} does not fit a v1 heartbeat's 32-bit log_pos; use heartbeat_v2")
    body = _U64.pack(log_pos) + name
    return encode_event(HEARTBEAT_LOG_EVENT, body, server_id=server_id, log_pos=0, checksum=checksum)


def heartbeat_v2(log_file: FileName, log_pos: int, server_id: int, checksum: bool) -> bytes:
    """HEARTBEAT_LOG_EVENT_V2 (8.0.26+, sent when the dump flags include USE_HEARTBEAT_EVENT_V2).

    Body: TLV fields with packed-integer type and length: 1 = file name, 2 = position (a packed
    integer, so positions past 4 GB fit), 0 = end mark.  The header's log_pos carries the low
    32 bits of the position.
    """
    name = _file_name(log_file, "HEARTBEAT_V2")
    log_pos = _uint("log_pos", log_pos, _UINT64_MAX)
    position = net_store_length(log_pos)
    body = (
        net_store_length(HEARTBEAT_FIELD_LOG_FILENAME)
        + net_store_length(len(name))
        + name
        + net_store_length(HEARTBEAT_FIELD_LOG_POSITION)
        + net_store_length(len(position))
        + position
        + net_store_length(HEARTBEAT_FIELD_END)
    )
    return encode_event(
        HEARTBEAT_LOG_EVENT_V2, body, server_id=server_id, log_pos=log_pos & _UINT32_MAX, checksum=checksum
    )


# ---------------------------------------------------------------------------------------------
# GTID preambles
# ---------------------------------------------------------------------------------------------


def previous_gtids(
    gtid_set: GtidSet,
    server_id: int,
    log_pos: int,
    checksum: bool,
    tagged: bool | None = None,
    *,
    timestamp: int = 0,
    flags: int = LOG_EVENT_IGNORABLE_F,
) -> bytes:
    """PREVIOUS_GTIDS_LOG_EVENT carrying ``gtid_set`` in ``Gtid_set::encode`` form.

    ``tagged``: ``None`` uses the 8.3+ tagged format only if the set has tagged GTIDs, ``False``
    forces the untagged format (for replicas older than 8.3; raises if tags are present),
    ``True`` forces the tagged one.  The default header flags are LOG_EVENT_IGNORABLE_F, as
    MySQL 5.7+ writes this event (5.6 wrote 0).
    """
    body = gtid_set.encode(tagged=tagged)
    return encode_event(
        PREVIOUS_GTIDS_LOG_EVENT,
        body,
        server_id=server_id,
        log_pos=log_pos,
        checksum=checksum,
        timestamp=timestamp,
        flags=flags,
    )


def gtid_list(
    state_or_gtids: MariaBinlogState | Iterable[MariaGtid | tuple[int, int, int]],
    server_id: int,
    log_pos: int,
    checksum: bool,
    flags: int = 0,
    *,
    timestamp: int = 0,
    header_flags: int = 0,
) -> bytes:
    """MariaDB GTID_LIST_EVENT: count_and_flags (u32), then (domain_id u32, server_id u32, seq_no u64)
    per GTID; an empty list gets 2 zero bytes of padding, as MariaDB writes it.

    ``state_or_gtids`` is a ``MariaBinlogState`` (entries in its order: each domain's most recent
    GTID last) or GTIDs in the order to write.  ``flags`` are the GTID_LIST_FLAG_* bits (in place,
    e.g. ``GTID_LIST_FLAG_IGN_GTIDS``); ``header_flags`` the common-header flags (a master's fake
    GTID_LIST sets LOG_EVENT_ARTIFICIAL_F and timestamp 0).
    """
    encode_body = getattr(state_or_gtids, "encode_gtid_list_body", None)
    if encode_body is not None:
        body = encode_body(flags)
    else:
        if flags & GTID_LIST_COUNT_MASK:
            raise ValueError(f"GTID_LIST flags {flags:#x} overlap the count field")
        entries = [tuple(g) for g in state_or_gtids]
        if len(entries) > GTID_LIST_COUNT_MASK:
            raise ValueError(f"{len(entries)} GTIDs do not fit a GTID_LIST_EVENT")
        parts = [_U32.pack(_uint("GTID_LIST count_and_flags", len(entries) | flags, _UINT32_MAX))]
        for domain_id, gtid_server_id, seq_no in entries:
            parts.append(
                _GTID_LIST_ENTRY.pack(
                    _uint("domain_id", domain_id, _UINT32_MAX),
                    _uint("server_id", gtid_server_id, _UINT32_MAX),
                    _uint("seq_no", seq_no, _UINT64_MAX),
                )
            )
        if not entries:
            parts.append(b"\0\0")
        body = b"".join(parts)
    return encode_event(
        MARIA_GTID_LIST_EVENT,
        body,
        server_id=server_id,
        log_pos=log_pos,
        checksum=checksum,
        timestamp=timestamp,
        flags=header_flags,
    )


def binlog_checkpoint(
    file_name: FileName,
    server_id: int,
    log_pos: int,
    checksum: bool,
    *,
    timestamp: int = 0,
    flags: int = 0,
) -> bytes:
    """MariaDB BINLOG_CHECKPOINT_EVENT: binlog_file_len (u32) then the file name (basename, no NUL)."""
    name = _file_name(file_name, "BINLOG_CHECKPOINT")
    return encode_event(
        MARIA_BINLOG_CHECKPOINT_EVENT,
        _U32.pack(len(name)) + name,
        server_id=server_id,
        log_pos=log_pos,
        checksum=checksum,
        timestamp=timestamp,
        flags=flags,
    )


# ---------------------------------------------------------------------------------------------
# Checksum trailer
# ---------------------------------------------------------------------------------------------


def _one_event(event: bytes | bytearray | memoryview, what: str) -> tuple[bytes, EventHeader]:
    data = bytes(event)
    header = EventHeader.unpack(data, 0)
    if header.event_size != len(data):
        raise BinlogFormatError(
            f"{what} needs exactly one event: event_size {header.event_size}, got {len(data)} bytes", 0
        )
    if header.type_code == FORMAT_DESCRIPTION_EVENT:
        raise ValueError(f"{what}: a FORMAT_DESCRIPTION_EVENT keeps its CRC whatever the algorithm; use fde_copy()")
    return data, header


def strip_checksum(event: bytes | bytearray | memoryview, *, verify: bool = True) -> bytes:
    """The event without its CRC32 trailer, event_size reduced by 4, log_pos unchanged.

    The CRC is verified first (``ChecksumError`` if wrong) unless ``verify=False``: dropping it
    unchecked would throw away the only evidence of corruption.  See the module docstring for
    why log_pos stays as it is and why a master never does this.
    """
    data, header = _one_event(event, "strip_checksum")
    if header.event_size < HEADER_LEN + CHECKSUM_LEN:
        raise BinlogFormatError(f"event of {header.event_size} bytes is too short to carry a CRC32", 0)
    if verify:
        _checksum.verify(data, 0, len(data), offset=0)
    out = bytearray(data[:-CHECKSUM_LEN])
    _U32.pack_into(out, _SIZE_OFFSET, header.event_size - CHECKSUM_LEN)
    return bytes(out)


def add_checksum(event: bytes | bytearray | memoryview) -> bytes:
    """The event with a CRC32 trailer appended, event_size increased by 4, log_pos unchanged."""
    data, header = _one_event(event, "add_checksum")
    out = bytearray(data)
    _U32.pack_into(out, _SIZE_OFFSET, _uint("event_size", header.event_size + CHECKSUM_LEN, _UINT32_MAX))
    return _checksum.append(bytes(out))


# ---------------------------------------------------------------------------------------------
# Fillers (the relay's own IGNORABLE events over a skipped stretch)
# ---------------------------------------------------------------------------------------------

FILLER_MAX_SIZE = _UINT32_MAX - 0xFFFF  # event_size is a u32; keep some slack below its maximum


def filler_sizes(gap: int, checksum: bool, max_size: int = FILLER_MAX_SIZE) -> list[int]:
    """Sizes of the fewest filler events that cover exactly ``gap`` bytes (each at least a header and
    CRC, at most ``max_size``); ValueError when the gap is smaller than one event."""
    smallest = HEADER_LEN + (CHECKSUM_LEN if checksum else 0)
    if gap < smallest:
        raise ValueError(f"a gap of {gap} bytes is smaller than the smallest event ({smallest} bytes)")
    count = -(-gap // max_size)
    base, extra = divmod(gap, count)
    return [base + 1] * extra + [base] * (count - extra)


def filler_header(size: int, *, log_pos: int, server_id: int, timestamp: int = 0) -> bytes:
    """The 19-byte header of a filler of ``size`` bytes (IGNORABLE_LOG_EVENT, LOG_EVENT_IGNORABLE_F)."""
    return HEADER.pack(
        _uint("timestamp", timestamp, _UINT32_MAX),
        IGNORABLE_LOG_EVENT,
        _uint("server_id", server_id, _UINT32_MAX),
        _uint("event_size", size, _UINT32_MAX),
        _uint("log_pos", log_pos, _UINT32_MAX),
        LOG_EVENT_IGNORABLE_F,
    )


def filler_crc(header: bytes, size: int) -> int:
    """CRC32 of a filler's header followed by its zero body (``size`` includes the 4 CRC bytes), in O(log size):
    the zeros are never made nor read (a 4 GB filler costs microseconds)."""
    return _checksum.crc32_zeros(zlib.crc32(header), size - len(header) - CHECKSUM_LEN)


def filler(size: int, *, log_pos: int, server_id: int, checksum: bool, timestamp: int = 0) -> bytes:
    """A whole filler event in memory (for small ones; large ones are written sparse from the parts)."""
    header = filler_header(size, log_pos=log_pos, server_id=server_id, timestamp=timestamp)
    if not checksum:
        return header + bytes(size - HEADER_LEN)
    return header + bytes(size - HEADER_LEN - CHECKSUM_LEN) + _U32.pack(filler_crc(header, size))
