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
from .checksum import ChecksumError
from .checksum import crc32 as _crc32
from .events import HEADER, BinlogFormatError, FormatDescription
from .gtid import GtidSet, MariaBinlogState, MariaGtid

_header_unpack_from = HEADER.unpack_from

_GTID_SET_EVENTS = frozenset({C.PREVIOUS_GTIDS_LOG_EVENT, C.MARIA_GTID_LIST_EVENT})
_GTID_EVENTS = frozenset({C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.MARIA_GTID_EVENT})

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
        max_event_in_memory: int = DEFAULT_MAX_EVENT_IN_MEMORY,
        path: str | None = None,
    ):
        self.result = ScanResult(path=path)
        self.parser = B.TransactionBoundaryParser(flavour)
        self._verify = verify_checksums
        self._track_gtids = track_gtids
        self._on_event = on_event
        self._on_group = on_group
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
        while n - pos >= C.HEADER_LEN and not self._stopped:
            header = _header_unpack_from(buf, pos)
            size = header[3]
            offset = self._buf_offset + pos
            min_size = C.HEADER_LEN + (self._checksum_len if self._fde is not None else 0)
            if size < min_size:
                self._fail(offset, f"impossible event size {size} (type {header[1]}): shorter than {min_size}")
                return
            if size > self._max_in_memory:
                # Stream it: keep the head, CRC the rest as it arrives.
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
                return
            if n - pos < size:
                break
            self._event(header, buf, pos, offset, streamed=False, crc_ok=self._check_crc(buf, pos, size))
            pos += size
        if pos and not self._stopped:
            del buf[:pos]
            self._buf_offset += pos

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

    def _check_crc(self, buf, pos: int, size: int) -> bool | None:
        if not self._checksum_len or not self._verify:
            return None
        end = pos + size
        return _crc32(memoryview(buf)[pos : end - 4]) == int.from_bytes(buf[end - 4 : end], "little")

    def _event(self, header, buf, pos: int, offset: int, *, streamed: bool, crc_ok: bool | None) -> None:
        r = self.result
        timestamp, type_code, server_id, size, log_pos, flags = header
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            try:
                fde = FormatDescription.parse(buf, pos, size)
            except ChecksumError as exc:
                r.crc_errors += 1
                # Not str(exc): its offset is into the scanner's buffer, which depends on how the bytes were fed.
                self._fail(offset, f"FORMAT_DESCRIPTION_EVENT: CRC32 mismatch: stored 0x{exc.stored:08x}, "
                                   f"computed 0x{exc.computed:08x}")
                return
            except BinlogFormatError as exc:
                self._fail(offset, str(exc).removeprefix(f"at offset {pos}: "))
                return
            if self._fde is None:
                r.fde = fde
            self._fde = fde
            self._checksum_len = fde.checksum_len
            self.parser.set_format(fde)
            crc_ok = True if fde.checksum_alg == C.CHECKSUM_CRC32 else None
        elif self._fde is None:
            self._fail(offset, f"first event is {C.event_name(type_code)}, not FORMAT_DESCRIPTION_EVENT")
            return
        elif type_code == C.MARIA_START_ENCRYPTION_EVENT and not flags & C.LOG_EVENT_IGNORABLE_F:
            # A MariaDB server's own file with encrypt_binlog=ON: every later event is encrypted. (A replica's or
            # a relay's copy has it flagged ignorable and plain events after it.)
            self._fail(offset, "the rest of the file is encrypted (MariaDB encrypt_binlog=ON, START_ENCRYPTION_EVENT "
                               "here): give the server's key file (--binlog-key-file)")
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
        was_inside = self.parser.in_group
        open_gtid = self.parser.gtid if was_inside else None
        result = self.parser.feed(type_code, flags, buf, pos, size)
        kind = result & B.RESULT_MASK
        if result & B.FLAG_ERROR:
            r.boundary_errors += 1
            r.warnings.append(f"at offset {offset}: {self.parser.error}")
        if result & B.FLAG_ABANDONED and was_inside:
            self._emit_group(offset, complete=False, abandoned=True, gtid=open_gtid)
        if kind == B.GROUP_START or (kind == B.GROUP_END and not was_inside) or (
            result & B.FLAG_ABANDONED and kind != B.EVENT_OUTSIDE
        ):
            self._group_start = offset
            self._group_events = 0
        if kind != B.EVENT_OUTSIDE:
            self._group_events += 1
        if self._track_gtids:
            self._track_file_gtids(type_code, buf, pos, offset, size)
        if type_code == C.ROTATE_EVENT and not (flags & C.LOG_EVENT_ARTIFICIAL_F):
            self._note_rotate(buf, pos, size)
        if self._on_event is not None:
            data = bytes(buf[pos : pos + size]) if not streamed else bytes(buf)
            self._on_event(
                ScannedEvent(offset, timestamp, type_code, server_id, size, log_pos, flags, data, streamed, crc_ok, result)
            )
        end = offset + size
        self._last_end = end
        if kind == B.GROUP_END:
            self._emit_group(end, complete=True)
        if (kind == B.GROUP_END or kind == B.EVENT_OUTSIDE) and r.crc_errors == 0 and r.error is None:
            r.good_end = end
            r.good_end_type = type_code

    def _emit_group(self, end: int, *, complete: bool, abandoned: bool = False, gtid=None) -> None:
        r = self.result
        if gtid is None:
            gtid = self.parser.gtid
        group = ScannedGroup(self._group_start, end, self._group_events, gtid, complete, abandoned)
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
