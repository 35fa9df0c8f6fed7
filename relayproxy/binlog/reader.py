"""Streaming binlog scanner: cuts file bytes into events, checks CRCs, tracks groups and GTID sets.

``BinlogScanner`` is sans-I/O: feed it the bytes of one binlog or relay-log file in order, in any
chunk sizes, then call ``finish()``. Memory stays bounded by the chunk size plus
``max_event_in_memory``: a larger event is checked (CRC) as it streams past and only its head is
kept. ``scan_file`` wraps it for a path. Recovery, ``relayproxy inspect`` and the tests all use
this one scanner, so they agree on where every group ends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from . import boundary as B
from . import constants as C
from .checksum import CRC32_RESIDUE as _CRC32_RESIDUE
from .checksum import ChecksumError
from .checksum import crc32 as _crc32
from .events import HEADER, BinlogFormatError, FormatDescription
from .gtid import GtidSet, MariaBinlogState, MariaGtid

_header_unpack_from = HEADER.unpack_from

_GTID_SET_EVENTS = frozenset({C.PREVIOUS_GTIDS_LOG_EVENT, C.MARIA_GTID_LIST_EVENT})
_GTID_EVENTS = frozenset({C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.MARIA_GTID_EVENT})
_FIRST_LOOK = frozenset({C.FORMAT_DESCRIPTION_EVENT, C.MARIA_START_ENCRYPTION_EVENT})  # _event's _first_look
_RESULT_MASK = B.RESULT_MASK
_FLAG_ERROR = B.FLAG_ERROR
_FLAG_ABANDONED = B.FLAG_ABANDONED
_EVENT_OUTSIDE = B.EVENT_OUTSIDE
_GROUP_START = B.GROUP_START
_GROUP_END = B.GROUP_END
_ROTATE = C.ROTATE_EVENT
_HEADER_LEN = C.HEADER_LEN
_MAY_CUT = frozenset({C.GTID_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.MARIA_GTID_EVENT,
                      C.INCIDENT_EVENT})
_ARTIFICIAL = C.LOG_EVENT_ARTIFICIAL_F

DEFAULT_CHUNK = 1 << 20
DEFAULT_MAX_EVENT_IN_MEMORY = 16 << 20
EVENT_HEAD_KEPT = 64 << 10  # bytes kept of an event that streams past


@dataclass(slots=True)
class ScannedEvent:
    """One event as found in the file. ``data`` is the whole event, or its head when ``streamed``."""

    offset: int
    timestamp: int
    type_code: int
    server_id: int
    size: int
    log_pos: int
    flags: int
    data: bytes
    streamed: bool
    crc_ok: bool | None  # None: the file carries no checksums
    boundary: int  # boundary.feed() result

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def name(self) -> str:
        return C.event_name(self.type_code)


@dataclass(slots=True)
class ScannedGroup:
    """A transaction group: from the event that opened it to the one that closed it (or the cut)."""

    start: int
    end: int
    events: int
    gtid: object  # boundary-parser form: (sid16, gno) / (sid16, tag, gno) / (domain, server, seq) / None
    complete: bool
    abandoned: bool = False  # cut off by a later GTID or incident inside the file
    end_timestamp: int = 0  # header timestamp of the group's last event scanned (the one closing a complete group)


@dataclass
class ScanResult:
    """What a whole file scan found; ``good_end`` is where a recovery would truncate to."""

    path: str | None = None
    fde: FormatDescription | None = None
    events: int = 0
    bytes: int = 0
    counts_by_type: dict[int, int] = field(default_factory=dict)
    crc_errors: int = 0
    boundary_errors: int = 0
    groups_complete: int = 0
    groups_abandoned: int = 0
    partial_tail: bool = False
    truncated_event: bool = False  # the file ends inside an event
    good_end: int = 0  # end of the last event after which the stream was at a boundary, all CRCs good
    good_end_type: int | None = None  # type of the event that ends at good_end
    error: str | None = None  # first fatal problem, naming the offset
    warnings: list[str] = field(default_factory=list)
    start_gtids: object = None  # PREVIOUS_GTIDS set (MySQL) or GTID_LIST state (MariaDB) of the file
    gtids_after: object = None  # start_gtids plus every complete group's GTID
    first_gtid_list_seen: bool = False
    last_event_type: int | None = None
    rotate_to: tuple[str, int] | None = None  # (next file, position) of a real ROTATE at the end
    resumed_from: int | None = None  # the scan began at this boundary (BinlogScanner.resume), not at 0

    @property
    def server_version(self) -> str | None:
        return self.fde.server_version if self.fde else None

    @property
    def checksum(self) -> str | None:
        return self.fde.checksum_name if self.fde else None

    @property
    def in_use(self) -> bool:
        return bool(self.fde and self.fde.in_use)

    @property
    def flavour(self) -> str:
        return self.fde.flavour if self.fde else "mysql"

    @property
    def ok(self) -> bool:
        """Well formed: no CRC error, no impossible structure, not cut inside an event."""
        return self.error is None and self.crc_errors == 0 and not self.truncated_event

    def gtid_text(self) -> str | None:
        """The GTID set after this file in the server's own text format (MySQL set / MariaDB list)."""
        if self.gtids_after is None:
            return None
        return str(self.gtids_after)


class BinlogScanner:
    """Sans-I/O scanner of one binlog/relay-log file, fed its bytes from offset 0."""

    def __init__(
        self,
        *,
        verify_checksums: bool = True,
        flavour: str = "auto",
        track_gtids: bool = True,
        on_event: Callable[[ScannedEvent], None] | None = None,
        on_group: Callable[[ScannedGroup], None] | None = None,
        on_event_types: frozenset[int] | None = None,
        max_event_in_memory: int = DEFAULT_MAX_EVENT_IN_MEMORY,
        path: str | None = None,
    ):
        """``on_event`` is called for every event, or only for those of ``on_event_types`` when given (a caller that
        reads a few types saves building the others' ScannedEvent and copying their bytes)."""
        self.result = ScanResult(path=path)
        self.parser = B.TransactionBoundaryParser(flavour)
        self._verify = verify_checksums
        self._track_gtids = track_gtids
        self._on_event = on_event
        self._on_group = on_group
        self._on_event_types = on_event_types
        self._last_timestamp = 0
        self._max_in_memory = max(max_event_in_memory, EVENT_HEAD_KEPT)
        self._buf = bytearray()
        self._buf_offset = 0  # file offset of self._buf[0]
        self._magic_done = False
        self._fde: FormatDescription | None = None
        self._checksum_len = 0
        self._stopped = False
        # group being assembled
        self._group_start = 0
        self._group_events = 0
        # an event larger than max_event_in_memory streaming past
        self._stream: dict | None = None
        self._last_end = 4

    @classmethod
    def resume(cls, offset: int, fde: FormatDescription, *, start_gtids=None, gtids_after=None,
               last_type: int | None = None, rotate_to: tuple[str, int] | None = None, **kwargs) -> "BinlogScanner":
        """A scanner to be fed a file's bytes from ``offset`` on, as if it had read ``[0, offset)`` itself.

        ``offset`` must be a boundary (the end of a complete group or of an event outside any group, no CRC
        error before it): the boundary parser is then outside any group, so what it needs is the file's
        FORMAT_DESCRIPTION (checksum length, post-header sizes, flavour). ``start_gtids`` / ``gtids_after`` /
        ``last_type`` / ``rotate_to`` are what a full scan had found up to ``offset``. Counters (events, bytes,
        groups) count only what is fed. The caller vouches for the state (relay/checkpoint.py verifies it).
        """
        if offset < 4:
            raise ValueError(f"cannot resume a scan at offset {offset}: before the end of the magic")
        scanner = cls(**kwargs)
        r = scanner.result
        scanner._magic_done = True
        scanner._buf_offset = offset
        scanner._last_end = offset
        scanner._fde = fde
        scanner._checksum_len = fde.checksum_len
        scanner.parser.set_format(fde)
        r.fde = fde
        r.good_end = offset
        r.good_end_type = last_type
        r.last_event_type = last_type
        r.start_gtids = None if start_gtids is None else start_gtids.copy()
        r.gtids_after = None if gtids_after is None else gtids_after.copy()
        r.rotate_to = rotate_to
        r.resumed_from = offset
        return scanner

    # -- feeding --------------------------------------------------------------------------------
    def feed(self, data) -> None:
        if self._stopped or not data:
            return
        if self._stream is not None:
            data = self._feed_stream(memoryview(data))
            if not data:
                return
        self._buf += data
        self._drain()

    def finish(self) -> ScanResult:
        """Close the scan: whatever is left is a cut event or an unfinished group."""
        r = self.result
        if not self._stopped:
            if self._stream is not None:
                s = self._stream
                r.truncated_event = True
                r.error = r.error or (
                    f"at offset {s['offset']}: file ends inside an event of {s['size']} bytes "
                    f"(have {s['seen']} bytes)"
                )
            elif not self._magic_done:
                r.truncated_event = True
                r.error = r.error or f"at offset 0: file of {len(self._buf)} bytes is shorter than the binlog magic"
            elif self._buf:
                r.truncated_event = True
                have = len(self._buf)
                if have >= C.HEADER_LEN:
                    size = _header_unpack_from(self._buf, 0)[3]
                    what = f"an event of {size} bytes (have {have} bytes)"
                else:
                    what = f"an event header (have {have} of {C.HEADER_LEN} bytes)"
                r.error = r.error or f"at offset {self._buf_offset}: file ends inside {what}"
        if self.parser.in_group:
            r.partial_tail = True
            self._emit_group(self._last_end, complete=False)
        elif r.truncated_event:
            r.partial_tail = True
        if r.fde is None and r.error is None:
            r.error = "at offset 4: no FORMAT_DESCRIPTION_EVENT"
        return r

    # -- internals ------------------------------------------------------------------------------
    def _fail(self, offset: int, message: str) -> None:
        r = self.result
        if r.error is None:
            r.error = f"at offset {offset}: {message}"
        self._stopped = True
        self._buf = bytearray()  # not clear(): the caller's frame may still hold a view of the old one

    def _drain(self) -> None:
        buf = self._buf
        if not self._magic_done:
            if len(buf) < 4:
                return
            if bytes(buf[:4]) != C.BINLOG_MAGIC:
                self._fail(0, f"not a binlog file: magic is {bytes(buf[:4]).hex()}, expected fe62696e")
                return
            self._magic_done = True
            self._buf_offset = 4
            del buf[:4]
            self.result.good_end = 4
        pos = 0
        n = len(buf)
        view = memoryview(buf)
        try:
            pos = self._drain_events(buf, view, n)
        finally:
            view.release()  # before ``del buf[:pos]``: a bytearray with a view held cannot be resized
        if pos < 0:
            self._stream_from(buf, ~pos, n)
        elif pos and not self._stopped:
            del buf[:pos]
            self._buf_offset += pos

    def _drain_events(self, buf, view, n: int) -> int:
        """The events wholly in ``buf[:n]`` (``view`` is a memoryview of it); returns where the next one begins, or
        ``~pos`` for an event at ``pos`` larger than ``max_event_in_memory`` (``_stream_from`` takes it)."""
        pos = 0
        event = self._event
        while n - pos >= _HEADER_LEN and not self._stopped:
            header = _header_unpack_from(buf, pos)
            size = header[3]
            offset = self._buf_offset + pos
            min_size = _HEADER_LEN + (self._checksum_len if self._fde is not None else 0)
            if size < min_size:
                self._fail(offset, f"impossible event size {size} (type {header[1]}): shorter than {min_size}")
                return pos
            if size > self._max_in_memory:
                return ~pos
            if n - pos < size:
                break
            if self._checksum_len and self._verify:
                # The CRC-32 of an event followed by its own stored CRC-32 is a constant: one pass, no tail slicing.
                crc_ok = _crc32(view[pos : pos + size]) == _CRC32_RESIDUE
            else:
                crc_ok = None
            event(header, buf, pos, offset, False, crc_ok)
            pos += size
        return pos

    def _stream_from(self, buf, pos: int, n: int) -> None:
        """The event at ``buf[pos]`` is larger than ``max_event_in_memory``: keep its head, CRC the rest as it
        arrives (``_feed_stream``)."""
        header = _header_unpack_from(buf, pos)
        size = header[3]
        offset = self._buf_offset + pos
        available = n - pos
        take = min(available, size)
        self._stream = {
            "offset": offset,
            "header": header,
            "size": size,
            "head": bytes(buf[pos : pos + min(take, EVENT_HEAD_KEPT)]),
            "crc": _crc32(memoryview(buf)[pos : pos + min(take, size - self._checksum_len)]),
            "seen": take,
            "tail": bytes(buf[pos + max(size - self._checksum_len, 0) : pos + take])
            if take > size - self._checksum_len
            else b"",
        }
        rest = bytes(buf[pos + take :])
        buf.clear()
        self._buf_offset = offset + take
        if take == size:
            self._finish_stream()
            if rest:
                self._buf += rest
                self._drain()

    def _feed_stream(self, data: memoryview):
        s = self._stream
        need = s["size"] - s["seen"]
        chunk = data[:need]
        crc_end = s["size"] - self._checksum_len  # bytes [0, crc_end) are covered by the CRC
        covered_from = s["seen"]
        if covered_from < crc_end:
            s["crc"] = _crc32(chunk[: crc_end - covered_from], s["crc"])
        if s["seen"] + len(chunk) > crc_end:
            s["tail"] += bytes(chunk[max(crc_end - covered_from, 0) :])
        if len(s["head"]) < EVENT_HEAD_KEPT:
            s["head"] += bytes(chunk[: EVENT_HEAD_KEPT - len(s["head"])])
        s["seen"] += len(chunk)
        self._buf_offset += len(chunk)
        if s["seen"] == s["size"]:
            self._finish_stream()
        return data[need:]

    def _finish_stream(self) -> None:
        s = self._stream
        self._stream = None
        crc_ok = None
        if self._checksum_len and self._verify:
            crc_ok = int.from_bytes(s["tail"][-4:], "little") == s["crc"]
        head = s["head"]
        self._event(s["header"], head, 0, s["offset"], streamed=True, crc_ok=crc_ok)

    def _event(self, header, buf, pos: int, offset: int, streamed: bool, crc_ok: bool | None) -> None:
        r = self.result
        timestamp, type_code, server_id, size, log_pos, flags = header
        if type_code in _FIRST_LOOK or self._fde is None:
            crc_ok = self._first_look(type_code, flags, buf, pos, offset, size, crc_ok)
            if self._stopped:
                return
        r.events += 1
        r.bytes += size
        counts = r.counts_by_type
        counts[type_code] = counts.get(type_code, 0) + 1
        r.last_event_type = type_code
        if crc_ok is False:
            r.crc_errors += 1
            if r.error is None:
                stored = int.from_bytes(bytes(buf[pos + size - 4 : pos + size]), "little") if not streamed else None
                detail = f" (stored 0x{stored:08x})" if stored is not None else ""
                r.error = f"at offset {offset}: CRC32 mismatch in {C.event_name(type_code)} event of {size} bytes{detail}"
        parser = self.parser
        was_inside = parser.state != 0  # parser.in_group: state 0 is NONE under both flavours' rules
        # Only a GTID or an INCIDENT cuts an open group off (FLAG_ABANDONED); a GTID overwrites the parser's GTID.
        open_gtid = parser.gtid if was_inside and type_code in _MAY_CUT else None
        result = parser.feed(type_code, flags, buf, pos, size)
        kind = result & _RESULT_MASK
        if result & _FLAG_ERROR:
            r.boundary_errors += 1
            r.warnings.append(f"at offset {offset}: {parser.error}")
        if result & _FLAG_ABANDONED:
            if was_inside:
                if type_code not in _MAY_CUT:  # (never seen) the GTID is still the cut group's
                    open_gtid = parser.gtid
                self._emit_group(offset, complete=False, abandoned=True, gtid=open_gtid)
            if kind != _EVENT_OUTSIDE:
                self._group_start = offset
                self._group_events = 0
        elif kind == _GROUP_START or (kind == _GROUP_END and not was_inside):
            self._group_start = offset
            self._group_events = 0
        if kind != _EVENT_OUTSIDE:
            self._group_events += 1
        if self._track_gtids and (type_code in _GTID_SET_EVENTS or r.gtids_after is None):
            self._track_file_gtids(type_code, buf, pos, offset, size)
        if type_code == _ROTATE and not flags & _ARTIFICIAL:
            self._note_rotate(buf, pos, size)
        self._last_timestamp = timestamp
        if self._on_event is not None and (self._on_event_types is None or type_code in self._on_event_types):
            data = bytes(buf[pos : pos + size]) if not streamed else bytes(buf)
            self._on_event(
                ScannedEvent(offset, timestamp, type_code, server_id, size, log_pos, flags, data, streamed, crc_ok, result)
            )
        end = offset + size
        self._last_end = end
        if kind == _GROUP_END:
            self._emit_group(end, complete=True)
        if (kind == _GROUP_END or kind == _EVENT_OUTSIDE) and r.crc_errors == 0 and r.error is None:
            r.good_end = end
            r.good_end_type = type_code

    def _first_look(self, type_code: int, flags: int, buf, pos: int, offset: int, size: int,
                    crc_ok: bool | None) -> bool | None:
        """A FORMAT_DESCRIPTION (adopted), an event before the first one, a START_ENCRYPTION: stops the scan
        (``_fail``) or returns the event's ``crc_ok``."""
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            r = self.result
            try:
                fde = FormatDescription.parse(buf, pos, size)
            except ChecksumError as exc:
                r.crc_errors += 1
                # Not str(exc): its offset is into the scanner's buffer, which depends on how the bytes were fed.
                self._fail(offset, f"FORMAT_DESCRIPTION_EVENT: CRC32 mismatch: stored 0x{exc.stored:08x}, "
                                   f"computed 0x{exc.computed:08x}")
                return crc_ok
            except BinlogFormatError as exc:
                self._fail(offset, str(exc).removeprefix(f"at offset {pos}: "))
                return crc_ok
            if self._fde is None:
                r.fde = fde
            self._fde = fde
            self._checksum_len = fde.checksum_len
            self.parser.set_format(fde)
            return True if fde.checksum_alg == C.CHECKSUM_CRC32 else None
        if self._fde is None:
            self._fail(offset, f"first event is {C.event_name(type_code)}, not FORMAT_DESCRIPTION_EVENT")
        elif type_code == C.MARIA_START_ENCRYPTION_EVENT and not flags & C.LOG_EVENT_IGNORABLE_F:
            # A MariaDB server's own file with encrypt_binlog=ON: every later event is encrypted. (A replica's or
            # a relay's copy has it flagged ignorable and plain events after it.)
            self._fail(offset, "the rest of the file is encrypted (MariaDB encrypt_binlog=ON, START_ENCRYPTION_EVENT "
                               "here): give the server's key file (--binlog-key-file)")
        return crc_ok

    def _emit_group(self, end: int, *, complete: bool, abandoned: bool = False, gtid=None) -> None:
        r = self.result
        if gtid is None:
            gtid = self.parser.gtid
        group = ScannedGroup(self._group_start, end, self._group_events, gtid, complete, abandoned,
                             self._last_timestamp)
        if complete:
            r.groups_complete += 1
            if self._track_gtids and gtid is not None and r.gtids_after is not None:
                try:
                    self._add_gtid(gtid)
                except ValueError as exc:
                    r.warnings.append(f"at offset {self._group_start}: group GTID not added to the set: {exc}")
        elif abandoned:
            r.groups_abandoned += 1
        if self._on_group is not None:
            self._on_group(group)
        self._group_events = 0

    # -- GTID bookkeeping -------------------------------------------------------------------------
    def _track_file_gtids(self, type_code: int, buf, pos: int, offset: int, size: int) -> None:
        r = self.result
        if r.start_gtids is not None or type_code not in _GTID_SET_EVENTS:
            if r.gtids_after is None and type_code in _GTID_EVENTS:
                # A file without PREVIOUS_GTIDS / GTID_LIST (5.6 relay logs, fragments): start empty.
                r.gtids_after = MariaBinlogState() if type_code == C.MARIA_GTID_EVENT else GtidSet()
            return
        body = pos + C.HEADER_LEN
        length = size - C.HEADER_LEN - self._checksum_len
        try:
            if type_code == C.PREVIOUS_GTIDS_LOG_EVENT:
                start = GtidSet.decode(buf, body, length)
            else:
                start, _flags = MariaBinlogState.decode_gtid_list_body(buf, body, length)
        except (BinlogFormatError, ValueError) as exc:
            r.warnings.append(f"at offset {offset}: {C.event_name(type_code)}: {exc}")
            return
        r.start_gtids = start.copy()
        r.gtids_after = start

    def _add_gtid(self, gtid) -> None:
        target = self.result.gtids_after
        maria = len(gtid) == 3 and isinstance(gtid[0], int)
        if maria != isinstance(target, MariaBinlogState):
            # A damaged file can mix flavours (a MariaDB GTID event under a MySQL FDE): no set can hold both.
            raise ValueError(f"a {'MariaDB' if maria else 'MySQL'} GTID in a file whose GTID state is "
                             f"{'MariaDB' if isinstance(target, MariaBinlogState) else 'MySQL'}'s")
        if maria:
            target.update(MariaGtid(*gtid))
        elif len(gtid) == 3:
            sid, tag, gno = gtid
            target.add(sid, gno, tag)
        else:
            sid, gno = gtid
            target.add(sid, gno)

    def _note_rotate(self, buf, pos: int, size: int) -> None:
        end = pos + size - self._checksum_len
        body = pos + C.HEADER_LEN
        if end - body >= 8:
            position = int.from_bytes(bytes(buf[body : body + 8]), "little")
            name = bytes(buf[body + 8 : end]).decode("utf-8", "replace")
            self.result.rotate_to = (name, position)


def scan_file(
    path: str | os.PathLike,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    verify_checksums: bool = True,
    flavour: str = "auto",
    track_gtids: bool = True,
    on_event: Callable[[ScannedEvent], None] | None = None,
    on_group: Callable[[ScannedGroup], None] | None = None,
    max_event_in_memory: int = DEFAULT_MAX_EVENT_IN_MEMORY,
    decrypt=None,
) -> ScanResult:
    """Scan one file in bounded memory and return what was found (never raises for bad content).

    ``decrypt``: a ``binlog.encryption.DecryptingStream`` for a MariaDB file written with encrypt_binlog=ON: the
    scanner sees the plain events (it raises ``BinlogKeyError`` for a missing or wrong key)."""
    scanner = BinlogScanner(
        verify_checksums=verify_checksums,
        flavour=flavour,
        track_gtids=track_gtids,
        on_event=on_event,
        on_group=on_group,
        max_event_in_memory=max_event_in_memory,
        path=os.fspath(path),
    )
    if decrypt is not None:
        from .encryption import BinlogKeyError
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_size)
            if not chunk:
                break
            if decrypt is not None:
                try:
                    chunk = decrypt.feed(chunk)
                except BinlogKeyError as exc:  # a missing or wrong key: what came before is reported
                    scanner.feed(decrypt.flushed)
                    scanner._fail(decrypt.offset, str(exc))
                    break
            scanner.feed(chunk)
            if scanner._stopped:
                break
        if decrypt is not None and not scanner._stopped:
            scanner.feed(decrypt.take_pending())  # an incomplete last event, as stored: reported as cut
    return scanner.finish()


def scan_bytes(data: bytes, **kwargs) -> ScanResult:
    """Scan an in-memory file image (tests, fuzzing)."""
    scanner = BinlogScanner(**kwargs)
    scanner.feed(data)
    return scanner.finish()
