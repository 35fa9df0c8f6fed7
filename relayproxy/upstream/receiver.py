"""The modified IO thread, sans-I/O: dump-stream payloads in, relay-store writes and group boundaries out.

``RelayReceiver.feed(payloads)`` takes the raw packet payloads of a COM_BINLOG_DUMP stream
(0x00 + event, with the 0xEF semi-sync header when negotiated; 0xFE end; 0xFF error) and:

- places every event at the master's byte offset (``log_pos - event_size``; MariaDB 11 writes
  log_pos 0 on events inside a transaction, which then follow the previous event);
- verifies its CRC32 and the boundary parser's rules; any violation raises ``StreamError`` so the
  session drops the connection and the store throws away the partial group (never served);
- tells the store where each group (or event outside any group) ends, so only complete groups
  ever reach the horizon;
- keeps the master's latest known position from events, artificial rotates and heartbeats.

File names: the receiver speaks the master's names (``master_file``, ``master_position``); the store maps
them to relay names through the current upstream epoch (``store.relay_name``, ``relay/epochs.py``;
identical in epoch 1). ``start_stream(epoch_master=...)`` begins a new epoch when the stream's first
ROTATE arrives, if that master is not the current epoch's (the file it names is then known).

Gaps: a GTID dump (``by_position=False``) skips the groups the relay already has, so an event can sit
beyond the end of the relay file. When the stream is at a boundary (no open group) and the event opens a
group or stands outside any (GTID, ROTATE, STOP, BINLOG_CHECKPOINT), the store covers the gap with
filler events (``store.write_filler``); anything else, and every gap in a by-position dump, raises
RelayGapError.

Held groups in a later epoch: a by-position dump from a master of epoch >= 2 (the session resumes by position
when a GTID dump moved past a relay file it has not seen close, ``ResumeByPosition``) sends whole what a GTID
dump skips: that master's copies of the transactions the relay already holds (an old master's, replicated to
it before the switch). A group whose GTID is in the relay's set when the stream began is not stored again: its
events are checked by the boundary parser but not written, and the stretch they cover becomes filler when the
next event is written, as the GTID dump's gap would have (``_held_group``). Epoch 1 keeps the master's bytes.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..binlog import boundary as B
from ..binlog import constants as C
from ..binlog.checksum import CRC32_RESIDUE as _CRC32_RESIDUE
from ..binlog.checksum import ChecksumError
from ..binlog.checksum import crc32 as _crc32
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription
from ..relay.errors import RelayGapError
from ..wire.packets import parse_err
from ..wire.semisync import SEMI_SYNC_INDICATOR, SEMI_SYNC_NEED_ACK

if TYPE_CHECKING:
    from ..relay.store import RelayStore

_header_unpack_from = HEADER.unpack_from
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class StreamError(Exception):
    """The master's stream broke a rule (CRC, event sequence, offsets): the connection must be dropped."""


class ChecksumMismatch(StreamError):
    """An event's CRC32 does not match its bytes: damaged on the way (or on the master's disk)."""


class MasterStreamEnded(StreamError):
    """The master sent the end-of-stream packet (non-blocking dump, or an apparent master shutdown)."""


class ResumeByPosition(StreamError):
    """A GTID dump moved past a relay file the relay has not seen close (its ROTATE is missing).

    The master picked the next file because the GTIDs are all there, but the closed relay file must
    stay byte-identical to the master's: the session resumes once by file/position, so the master
    sends the rest of the old file (its ROTATE) before moving on.
    """


@dataclass
class ReceiverCounters:
    events: int = 0
    bytes: int = 0
    transactions: int = 0
    duplicates: int = 0
    heartbeats: int = 0
    fillers: int = 0  # filler events written over stretches a GTID dump skipped


@dataclass
class SemiSyncTally:
    """What the transaction ends of semi-sync streams said about the master's waiting (docs/failover.md,
    "Semi-sync fallback: the hole"). Kept in memory from the relay's start; written at transaction ends only.

    MariaDB's rule (semisync_master.cc ``update_sync_header``): while semi-sync is ON the master sets NEED_ACK on a
    transaction's last event when it waits (or will wait) for that position and no ACK covers it yet; an earlier
    transaction end is left unflagged when a later one is already waited for (the later ACK covers it). While OFF
    (after ``rpl_semi_sync_master_timeout``) it sets NEED_ACK on every event at or after its latest commit position:
    a replica that has caught up is asked to ACK so the master can switch back ON, a replica behind is not asked.
    """

    ack_requests: int = 0  # transaction ends that carried NEED_ACK
    unrequested_transactions: int = 0  # transaction ends that did not
    last_unrequested_gtid: tuple | None = None
    last_unrequested_time: float | None = None
    master_waiting: bool | None = None  # the latest transaction end asked for an ACK (None: none seen this stream)
    last_ack_request_time: float | None = None


class RelayReceiver:
    """Feeds one dump stream at a time into a RelayStore through the transaction-boundary parser."""

    def __init__(self, store: RelayStore, *, verify_checksums: bool = True, flavour: str = "auto",
                 relay_server_id: int = 0):
        self.store = store
        self.relay_server_id = relay_server_id  # recorded with an epoch; never written into a relay file
        self.parser = B.TransactionBoundaryParser(flavour)
        self.verify_checksums = verify_checksums
        self.counters = ReceiverCounters()
        self.master_file: str | None = None  # file the stream is in
        self.master_position: tuple[str, int] | None = None  # latest position the master told us of
        self.master_timestamp = 0  # timestamp of the latest real event (for lag in seconds)
        self.ack_pending: tuple[str, int] | None = None  # semi-sync: (file, end) the master waits on
        self.semi_sync = SemiSyncTally()
        self.clock = time.time  # stamps the semi-sync tally (tests replace it)
        self._next_offset = 0
        self._checksum_len = 0
        self._announced_crc = False
        self._semi_sync = False
        self._fde: FormatDescription | None = None
        self._by_position = True
        self._epoch_master: dict | None = None
        self._switching = False
        self._held = None  # by-position dump in a later epoch: the GTIDs the relay held when it began
        self._skipping = False  # inside a held group (its events are not stored)
        self._skipped_to: int | None = None  # end of the held groups not yet covered by filler
        self.fast_path = True  # False: every event through _event (tests compare the two paths)

    # -- stream lifecycle ----------------------------------------------------------------------
    def start_stream(self, *, announced_checksum: str, semi_sync: bool, by_position: bool = True,
                     epoch_master: dict | None = None, switching: bool = False) -> None:
        """A new dump connection: the master re-sends whole groups from the horizon on.

        ``by_position``: the dump was requested by file/position, so a switch to the next file is the
        master's word that the old one is over (a GTID dump may skip the end of the current file), and
        a gap is an error (a GTID dump's gaps become fillers).
        ``epoch_master``: the master's identity (host, port, server_id, server_uuid); when it is not the
        recorded current epoch's master, ``store.begin_epoch`` runs at the stream's first ROTATE (an
        empty relay records its first epoch; a relay with files but no recorded epoch is left to the
        session, which alone knows whether this master wrote them). None: the session handles epochs.
        ``switching``: the session decided this master is a new one (a CHANGE MASTER chose it and it passed
        the identity and GTID checks): the epoch begins at the first ROTATE whatever is recorded.
        """
        self.parser.reset()
        self._by_position = by_position
        self._epoch_master = epoch_master
        self._switching = switching
        self._announced_crc = announced_checksum.upper() == "CRC32"
        self._checksum_len = 4 if self._announced_crc else 0
        self._semi_sync = semi_sync
        self.master_file = None
        self.ack_pending = None
        self.semi_sync.master_waiting = None  # unknown until this stream's first transaction end
        self._skipping = False
        self._skipped_to = None
        self._held = None
        if by_position and self.store.epochs.current.epoch >= 2:
            held = self.store.pending_gtids
            self._held = held.current_position() if hasattr(held, "current_position") else held

    def end_stream(self) -> int:
        """The connection is gone: drop whatever partial group was written past the last boundary."""
        self.parser.reset()
        self.ack_pending = None
        self._skipping = False
        self._skipped_to = None
        return self.store.discard_incomplete()

    # -- payloads ----------------------------------------------------------------------------------
    def feed(self, payloads) -> None:
        """Process a batch of packet payloads; raises StreamError / MasterStreamEnded / MySQLError.

        Plain events (placed by their log_pos, below 4 GB, not artificial, not FDE / ROTATE /
        heartbeat) take an inline path: header unpacked once, CRC32 checked by its residue, the store's
        append_event, counters and master position updated once per run of them. Everything else,
        and every packet of a semi-sync stream, goes through ``_packet`` / ``_event`` one by one.
        Both paths write, count, place boundaries and fail identically (tests compare them).
        """
        if self._semi_sync or not self.fast_path:
            packet = self._packet
            for payload in payloads:
                packet(payload)
            return
        store = self.store
        append = store.append_event
        parser = self.parser
        parser_feed = parser.feed
        group_complete = store.group_complete
        boundary_outside = store.boundary_outside
        crc32 = _crc32
        unpack_header = _header_unpack_from
        header_len = C.HEADER_LEN
        slow_type = _SLOW_TYPE if self._held is None else _SLOW_TYPE_HELD
        skipping = self._skipping
        # Per-run state, written back to self before any slow-path event and when the batch ends or fails.
        file = self.master_file
        next_offset = self._next_offset
        verify = self._checksum_len and self.verify_checksums
        events = nbytes = transactions = duplicates = 0
        timestamp_seen = 0
        unnoted_end = 0  # end of the latest appended event not yet in master_position
        try:
            for payload in payloads:
                size = len(payload) - 1
                if size >= header_len and payload[0] == 0x00:
                    ev = payload[1:] if size < _COPY_BELOW else memoryview(payload)[1:]
                    timestamp, type_code, _server_id, event_size, log_pos, flags = unpack_header(ev, 0)
                    offset = log_pos - size
                    if (
                        event_size == size
                        and offset >= 4  # also excludes log_pos 0
                        and next_offset <= _U32_MAX - size  # else a file past 4 GB: _unwrap_offset
                        and not slow_type[type_code]
                        and not flags & _ARTIFICIAL
                        and file is not None
                        and not skipping
                    ):
                        if verify and crc32(ev) != _CRC32_RESIDUE:
                            name = C.event_name(type_code)
                            raise ChecksumMismatch(f"CRC32 mismatch in {name} event at {file}:{offset}")
                        try:
                            outcome = append(offset, ev, log_pos, type_code)
                        except RelayGapError:
                            if not self._fill_gap(offset, type_code):
                                raise
                            outcome = append(offset, ev, log_pos, type_code)
                        result = parser_feed(type_code, flags, ev, 0, size)
                        if result & _FLAG_ERROR:
                            raise StreamError(
                                f"unexpected event sequence at {file}:{offset} "
                                f"({C.event_name(type_code)}): {parser.error}"
                            )
                        next_offset = log_pos
                        if outcome == "duplicate":
                            duplicates += 1
                            # master_position is the max of the ends noted in order; a duplicate may end
                            # before the appended events of this run, so note those first, then this one.
                            if unnoted_end:
                                self._note_master_position(file, unnoted_end)
                                unnoted_end = 0
                            self._note_master_position(file, log_pos)
                        else:
                            kind = result & _RESULT_MASK
                            if kind == _GROUP_END:
                                group_complete(log_pos, parser.gtid)
                                transactions += 1
                            elif kind == _EVENT_OUTSIDE:
                                boundary_outside(log_pos)
                            unnoted_end = log_pos
                        events += 1
                        nbytes += size
                        if timestamp:
                            timestamp_seen = timestamp
                        continue
                # Anything else: hand the run's state back, take the per-event path, pick it up again.
                self._next_offset = next_offset
                if events:  # timestamp_seen and unnoted_end are only set along with events
                    self._end_run(file, events, nbytes, transactions, duplicates, timestamp_seen, unnoted_end)
                    events = nbytes = transactions = duplicates = timestamp_seen = unnoted_end = 0
                next_offset = None  # _event owns self._next_offset now, even if it raises
                if size >= header_len and payload[0] == 0x00:
                    self._event(memoryview(payload)[1:], need_ack=False)  # what _packet does with it
                else:
                    self._packet(payload)
                file = self.master_file
                next_offset = self._next_offset
                verify = self._checksum_len and self.verify_checksums
                parser_feed = parser.feed  # an FDE rebinds it to the flavour's parser
                skipping = self._skipping
        finally:
            if next_offset is not None:
                self._next_offset = next_offset
            self._end_run(file, events, nbytes, transactions, duplicates, timestamp_seen, unnoted_end)

    def _end_run(self, file, events, nbytes, transactions, duplicates, timestamp, unnoted_end) -> None:
        """Apply a run of inline events' bookkeeping, as their per-event handling would have."""
        if events:
            counters = self.counters
            counters.events += events
            counters.bytes += nbytes
            counters.transactions += transactions
            counters.duplicates += duplicates
        if timestamp:
            self.master_timestamp = timestamp
        if unnoted_end:
            self._note_master_position(file, unnoted_end)

    def _packet(self, payload) -> None:
        """One payload through the per-event path."""
        first = payload[0] if payload else -1
        if first == 0x00:
            if self._semi_sync:
                if len(payload) < 3 or payload[1] != SEMI_SYNC_INDICATOR:
                    raise StreamError("Missing magic number for semi-sync packet")
                self._event(memoryview(payload)[3:], need_ack=bool(payload[2] & SEMI_SYNC_NEED_ACK))
            else:
                self._event(memoryview(payload)[1:], need_ack=False)
        elif first == 0xFF:
            raise parse_err(bytes(payload))
        elif first == 0xFE and len(payload) < 9:
            raise MasterStreamEnded("the master sent the end of the binlog stream (apparent master shutdown)")
        else:
            raise StreamError(f"unexpected packet in the binlog stream (first byte {first}, {len(payload)} bytes)")

    def _event(self, ev: memoryview, *, need_ack: bool) -> None:
        size = len(ev)
        if size < C.HEADER_LEN:
            raise StreamError(f"binlog event of {size} bytes is shorter than its header")
        timestamp, type_code, server_id, event_size, log_pos, flags = _header_unpack_from(ev, 0)
        if event_size != size:
            raise StreamError(f"{C.event_name(type_code)} event says {event_size} bytes but its packet holds {size}")
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            self._format_description(ev, log_pos)
            if log_pos == 0:
                return  # artificial copy when the dump starts mid-file: the relay file has the real one
        elif self._checksum_len and self.verify_checksums:
            if _crc32(ev[: size - 4]) != _U32.unpack_from(ev, size - 4)[0]:
                where = f"{self.master_file}:{log_pos - size if log_pos else self._next_offset}"
                raise ChecksumMismatch(f"CRC32 mismatch in {C.event_name(type_code)} event at {where}")
        if type_code == C.ROTATE_EVENT and (flags & C.LOG_EVENT_ARTIFICIAL_F or log_pos == 0):
            self._artificial_rotate(ev, size)
            return
        if type_code == C.HEARTBEAT_LOG_EVENT or type_code == C.HEARTBEAT_LOG_EVENT_V2:
            self._heartbeat(ev, type_code, log_pos)
            return
        if self.master_file is None:
            raise StreamError(f"{C.event_name(type_code)} event before the stream named its binlog file")
        if (flags & C.LOG_EVENT_ARTIFICIAL_F or log_pos == 0) and type_code in _ARTIFICIAL_ONLY:
            return  # MariaDB's fake GTID_LIST / checkpoint at the start of a GTID dump: not in the file
        if log_pos:
            offset = log_pos - size
            if offset < 4 or self._next_offset > _U32_MAX - size:
                offset = _unwrap_offset(log_pos, size, self._next_offset)
        else:
            offset = self._next_offset
        if offset < 4:
            raise StreamError(f"{C.event_name(type_code)} event ends at {log_pos}, before the start of a binlog file")
        if self._held is not None and (self._skipping or _GTID_TYPE[type_code]) and self._held_group(
                ev, type_code, flags, offset, size):
            self.counters.events += 1
            self.counters.bytes += size
            self.counters.duplicates += 1
            if timestamp:
                self.master_timestamp = timestamp
            self._note_master_position(self.master_file, offset + size)
            return
        try:
            outcome = self.store.write_event(offset, ev)
        except RelayGapError:
            if not self._fill_gap(offset, type_code):
                raise
            outcome = self.store.write_event(offset, ev)
        result = self.parser.feed(type_code, flags, ev, 0, size)
        if result & B.FLAG_ERROR:
            raise StreamError(
                f"unexpected event sequence at {self.master_file}:{offset} "
                f"({C.event_name(type_code)}): {self.parser.error}"
            )
        end = offset + size
        self._next_offset = end
        if outcome == "duplicate":
            self.counters.duplicates += 1
        else:
            kind = result & B.RESULT_MASK
            if kind == B.GROUP_END:
                self.store.group_complete(end, self.parser.gtid)
                self.counters.transactions += 1
                if self._semi_sync:
                    self._semi_sync_end(need_ack)
            elif kind == B.EVENT_OUTSIDE:
                self.store.boundary_outside(end)
            if need_ack:
                self.ack_pending = (self.master_file, end)
        self.counters.events += 1
        self.counters.bytes += size
        if timestamp:
            self.master_timestamp = timestamp
        self._note_master_position(self.master_file, end)

    def _semi_sync_end(self, need_ack: bool) -> None:
        """A transaction ended on a semi-sync stream: tally whether the master asked for its ACK."""
        tally = self.semi_sync
        tally.master_waiting = need_ack
        if need_ack:
            tally.ack_requests += 1
            tally.last_ack_request_time = self.clock()
        else:
            tally.unrequested_transactions += 1
            tally.last_unrequested_gtid = self.parser.gtid
            tally.last_unrequested_time = self.clock()

    def _held_group(self, ev: memoryview, type_code: int, flags: int, offset: int, size: int) -> bool:
        """In a by-position dump of a later epoch: True when the event belongs to a group the relay holds (its
        GTID is in ``_held``), which is then not stored; its stretch is filled before the next stored event."""
        parser = self.parser
        if not self._skipping:
            if parser.in_group or offset < self.store.current_end:
                return False  # inside a group being stored, or a re-sent event the store verifies
            parser.checkpoint()
            result = parser.feed(type_code, flags, ev, 0, size)
            gtid = parser.gtid
            if result & B.FLAG_ERROR or gtid is None or gtid not in self._held:
                parser.rollback()  # not held: stored as usual (and an error raised there)
                return False
            self._skipping = True
        else:
            result = parser.feed(type_code, flags, ev, 0, size)
            if result & B.FLAG_ERROR:
                raise StreamError(
                    f"unexpected event sequence at {self.master_file}:{offset} "
                    f"({C.event_name(type_code)}): {parser.error}"
                )
        end = offset + size
        self._next_offset = end
        if result & B.RESULT_MASK == B.GROUP_END:
            self._skipping = False
            self._skipped_to = end
        return True

    def _fill_gap(self, offset: int, type_code: int) -> bool:
        """Cover a gap a GTID dump left with fillers when that is sound; False: the gap is an error."""
        store = self.store
        if (
            (self._by_position and offset != self._skipped_to)  # by position: only over held groups
            or self.parser.in_group
            or not _FILLS_BEFORE[type_code]
            or store.current_end != store.boundary_end
        ):
            return False
        self.counters.fillers += store.write_filler(offset, relay_server_id=self.relay_server_id)
        self._skipped_to = None
        return True

    def _format_description(self, ev: memoryview, log_pos: int) -> None:
        try:
            fde = FormatDescription.parse(ev, 0, len(ev))
        except ChecksumError as exc:
            raise ChecksumMismatch(f"FORMAT_DESCRIPTION_EVENT from the master: {exc}") from None
        except BinlogFormatError as exc:
            raise StreamError(f"FORMAT_DESCRIPTION_EVENT from the master: {exc}") from None
        self._fde = fde
        self._checksum_len = fde.checksum_len
        self.parser.set_format(fde)

    def _artificial_rotate(self, ev: memoryview, size: int) -> None:
        end = size - (4 if self._announced_crc else 0)
        if end < C.HEADER_LEN + 8:
            raise StreamError("artificial ROTATE event is too short")
        position = _U64.unpack_from(ev, C.HEADER_LEN)[0]
        name = bytes(ev[C.HEADER_LEN + 8 : end]).decode("utf-8", "replace")
        if not name or "/" in name or name in (".", ".."):
            raise StreamError(f"artificial ROTATE names an impossible binlog file {name!r}")
        self._switch_file(name, position)

    def _switch_file(self, name: str, position: int) -> None:
        store = self.store
        epoch_master, self._epoch_master = self._epoch_master, None
        switching, self._switching = self._switching, False
        if epoch_master is not None:
            current = store.epochs.current
            if switching:
                begin = not current.same_master(epoch_master) or store.epoch_switch_pending
            elif current.implicit:
                # A relay with files but no recorded epoch does not know its master: the session decides.
                begin = not store.files()
            else:
                begin = not current.same_master(epoch_master)
            if begin:
                store.begin_epoch(epoch_master, name, relay_server_id=self.relay_server_id)
        try:
            relay = store.relay_name(name)
        except ValueError as exc:
            raise StreamError(f"master switched to {name}: {exc}") from None
        if store.current_file == relay:
            if position > store.current_end:
                raise StreamError(
                    f"master resumes {name} at {position} but the relay holds only {store.current_end} bytes of it"
                )
            if position == 4 and store.current_end == 4:
                store.start_file(name)  # a no-op, or a new epoch beginning in this (empty) file follows the master
        elif relay in store.files():
            shown = name if relay == name else f"{name} (relay file {relay})"
            raise StreamError(f"master switched back to {shown}, older than the relay's current file {store.current_file}")
        else:
            if position != 4:
                raise StreamError(f"master starts {name} at position {position}, but the relay has no such file")
            if self.parser.in_group:
                raise StreamError(f"master rotated to {name} inside a transaction")
            if store.current_file is not None and not store.current_file_closed and not self._by_position:
                raise ResumeByPosition(
                    f"master moved on to {name} but the relay has not received the end of {store.current_file}; "
                    "resuming by file/position to fetch it"
                )
            store.start_file(name)
        self.master_file = name
        self._next_offset = position
        self._note_master_position(name, position)

    def _heartbeat(self, ev: memoryview, type_code: int, log_pos: int) -> None:
        self.counters.heartbeats += 1
        end = len(ev) - self._checksum_len
        if type_code == C.HEARTBEAT_LOG_EVENT:
            name = bytes(ev[C.HEADER_LEN : end]).decode("utf-8", "replace")
            if log_pos == 0 and end - C.HEADER_LEN > 8:  # MariaDB: position above 4 GB in a sub-header
                log_pos = _U64.unpack_from(ev, C.HEADER_LEN)[0]
                name = bytes(ev[C.HEADER_LEN + 8 : end]).decode("utf-8", "replace")
        else:
            from ..binlog.views import view_event

            try:
                hb = view_event(bytes(ev), 0, self._fde)
                name, log_pos = hb.log_file, hb.log_pos
            except (BinlogFormatError, ValueError) as exc:
                raise StreamError(f"malformed HEARTBEAT_V2 event: {exc}") from None
        if name:
            self._note_master_position(name, log_pos)

    def _note_master_position(self, name: str, position: int) -> None:
        current = self.master_position
        if current is None or current[0] != name or position > current[1]:
            self.master_position = (name, position)


_U32_MAX = 0xFFFFFFFF


def _unwrap_offset(log_pos: int, size: int, running: int) -> int:
    """Event start from a 32-bit log_pos in a file past 4 GB: the candidate nearest the running offset."""
    low = (log_pos - size) & _U32_MAX
    base = running - (running & _U32_MAX)
    candidates = (base - (1 << 32) + low, base + low, base + (1 << 32) + low)
    return min((c for c in candidates if c >= 4), key=lambda c: abs(c - running), default=log_pos - size)


# CRC-32 of any data followed by its own little-endian CRC-32: checking this residue over the whole
# event equals comparing the trailer with the CRC of the rest, without slicing the event.
_COPY_BELOW = 4096  # smaller payloads are copied out (one object); larger ones are viewed, not copied
_ARTIFICIAL = C.LOG_EVENT_ARTIFICIAL_F
_FLAG_ERROR = B.FLAG_ERROR
_RESULT_MASK = B.RESULT_MASK
_GROUP_END = B.GROUP_END
_EVENT_OUTSIDE = B.EVENT_OUTSIDE
# Event types feed always leaves to _event: the FDE (sets the checksum length and the parser's flavour),
# ROTATE (may switch files) and heartbeats (never stored).
_SLOW_TYPE = [False] * 256
for _t in (C.FORMAT_DESCRIPTION_EVENT, C.ROTATE_EVENT, C.HEARTBEAT_LOG_EVENT, C.HEARTBEAT_LOG_EVENT_V2):
    _SLOW_TYPE[_t] = True
del _t
# With held groups to leave out (a by-position dump in a later epoch), the events that open a group too.
_GTID_TYPE = [False] * 256
for _t in (C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.MARIA_GTID_EVENT):
    _GTID_TYPE[_t] = True
_SLOW_TYPE_HELD = [slow or gtid for slow, gtid in zip(_SLOW_TYPE, _GTID_TYPE)]
del _t

# Events that may follow a gap in a GTID dump (it is then filled): a group opens with them, or they stand
# outside any group.
_FILLS_BEFORE = [False] * 256
for _t in (C.GTID_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.MARIA_GTID_EVENT,
           C.ROTATE_EVENT, C.STOP_EVENT, C.MARIA_BINLOG_CHECKPOINT_EVENT):
    _FILLS_BEFORE[_t] = True
del _t

# Events a MariaDB master may invent at the start of a dump (log_pos 0 or artificial flag).
_ARTIFICIAL_ONLY = frozenset({C.MARIA_GTID_LIST_EVENT, C.MARIA_BINLOG_CHECKPOINT_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT})
