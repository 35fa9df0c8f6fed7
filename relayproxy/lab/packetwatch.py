"""Sans-I/O watcher of one MySQL connection's server→client bytes: where each binlog event of a dump sits.

Fault tests need to break a replication stream at a chosen place ("after event 7", "in the middle of the XID
of the third transaction"), and the place has to be a byte offset in the TCP stream, which also carries the
handshake, the authentication exchange and the replies to the client's setup queries before the dump starts.
`MysqlStreamWatcher` is fed that stream in chunks of any size (typically from
`relayproxy.lab.faultproxy.FaultProxy.on_server_bytes`) and reports, for every binlog event packet, its stream
offsets, type and log_pos, as soon as the event's 19-byte header has arrived, which is before the rest of the
event has been forwarded, so a tap can still arm a fault inside it.

Heuristics (the watcher sees bytes, not the conversation, so it decides from framing and content):

- Framing: every packet is [3-byte little-endian length][1-byte sequence id][payload]. A packet of length
  0xFFFFFF is continued by the next packet (possibly by an empty one); the chain is one logical packet and only
  its first packet starts with the status byte. Compression (CLIENT_COMPRESS) and TLS change the framing and
  are not supported; when fed the client's bytes too, the watcher notices both and stops, saying so in
  `problems`.
- When the dump starts: at the first server packet after the client's COM_BINLOG_DUMP (0x12) or
  COM_BINLOG_DUMP_GTID (0x1e) when `feed_client` is fed the client's bytes, or after `mark_dump_started()`.
  Without either, at the first packet that is the artificial ROTATE every dump begins with: sequence id 1, status
  0x00, type 4, timestamp 0, log_pos 0, LOG_EVENT_ARTIFICIAL_F set, event_size equal to what the framing says
  (after the semi-sync prefix, if there is one). No OK packet or result-set row of the setup queries is plausibly
  all of that at once.
- Events: once the dump has started, a logical packet whose payload starts with 0x00 and is at least 20 bytes long
  (status byte + 19-byte header) is an event. With semi-sync the payload is 0x00 0xEF <ack flag> <event>; the
  prefix is recognised (with `semi_sync=None`) because the event_size in the header then matches the framing only
  when the two extra bytes are skipped. An event whose header disagrees with the framing is still reported, with
  a line in `problems`.
- End: 0xFE with a payload under 9 bytes is the EOF of a non-blocking dump; 0xFF is an ERR packet (its code and
  message are kept). Either ends the dump; a later dump on the same connection is detected like the first.

Offsets are stream offsets: 0 is the first byte fed (or `start_offset`), counting every byte, packet headers
included, exactly as `FaultProxy` counts the bytes it forwards.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Literal

from ..binlog.constants import (
    HEADER_LEN,
    LOG_EVENT_ARTIFICIAL_F,
    ROTATE_EVENT,
    event_name,
)
from ..wire.packets import COM_BINLOG_DUMP, COM_BINLOG_DUMP_GTID
from ..wire.semisync import SEMI_SYNC_INDICATOR

__all__ = ["MAX_PACKET_PAYLOAD", "DumpEnd", "EventLocation", "MysqlStreamWatcher", "packet_spans"]

MAX_PACKET_PAYLOAD = 0xFFFFFF
PACKET_HEADER_LEN = 4

_CLIENT_COMPRESS = 0x0020
_CLIENT_SSL = 0x0800

_OK, _EOF, _ERR = 0x00, 0xFE, 0xFF
_PLAIN_PREFIX = 1  # status byte
_SEMI_SYNC_PREFIX = 3  # status byte, 0xEF, ack flag
_HEAD_WANTED = _SEMI_SYNC_PREFIX + HEADER_LEN
_ERR_HEAD_WANTED = 512  # enough of an ERR packet for its code and a useful message
_MIN_EVENT_PAYLOAD = _PLAIN_PREFIX + HEADER_LEN

# timestamp u32, type u8, server_id u32, event_size u32, log_pos u32, flags u16
_EVENT_HEADER = struct.Struct("<IBIIIH")


@dataclass(frozen=True, slots=True)
class EventLocation:
    """Where one binlog event sits in the stream, and what its header says.

    `start`..`end` are the stream offsets of the event's first byte and just past its last byte (not counting
    the status byte or semi-sync prefix). An event of 16 MB or more spans several packets; its bytes are then the
    `segments`, with 4-byte packet headers between them, and `stream_offset(i)` maps its i-th byte.
    `packet_end` is just past the event's last packet (for a 16 MB chain ending in an empty packet, after that
    empty packet's header): the clean place to cut "after" this event.
    """

    index: int
    type_code: int
    timestamp: int
    server_id: int
    event_size: int
    log_pos: int
    flags: int
    packet_start: int
    start: int
    end: int
    packet_end: int
    segments: tuple[tuple[int, int], ...]
    semi_sync: bool = False
    ack_requested: bool = False

    @property
    def name(self) -> str:
        return event_name(self.type_code)

    @property
    def artificial(self) -> bool:
        """Made up by the master for this dump (the opening ROTATE, heartbeats); not at log_pos in any file."""
        return bool(self.flags & LOG_EVENT_ARTIFICIAL_F)

    @property
    def master_offset(self) -> int | None:
        """Where the event starts in the master's binlog file (log_pos - event_size); None when log_pos is 0."""
        return self.log_pos - self.event_size if self.log_pos else None

    @property
    def middle(self) -> int:
        """Stream offset of the event's middle byte: a cut here leaves half an event."""
        return self.stream_offset(self.event_size // 2)

    def stream_offset(self, i: int) -> int:
        """Stream offset of the event's byte `i` (0 <= i < event_size), skipping continuation packet headers."""
        if not 0 <= i < self.event_size:
            raise IndexError(f"byte {i} is outside event {self.index} ({self.event_size} bytes)")
        for seg_start, seg_end in self.segments:
            if i < seg_end - seg_start:
                return seg_start + i
            i -= seg_end - seg_start
        raise IndexError(f"byte {i} is beyond the segments of event {self.index}")

    def contains(self, offset: int) -> bool:
        return any(s <= offset < e for s, e in self.segments)


@dataclass(frozen=True, slots=True)
class DumpEnd:
    """How a dump ended: the EOF of a non-blocking dump, or an ERR packet (e.g. 1236) from the master."""

    offset: int
    kind: Literal["eof", "error"]
    error_code: int | None = None
    message: str = ""


def packet_spans(packet_start: int, payload_len: int) -> tuple[list[tuple[int, int]], int]:
    """Payload ranges of a logical packet of `payload_len` bytes starting at `packet_start`, and its end.

    A payload of 0xFFFFFF bytes or more is split into 0xFFFFFF-byte packets; a chain whose length is a multiple
    of 0xFFFFFF ends with an empty packet (which has a header but no range).
    """
    spans: list[tuple[int, int]] = []
    header = packet_start
    remaining = payload_len
    while True:
        size = min(MAX_PACKET_PAYLOAD, remaining)
        body = header + PACKET_HEADER_LEN
        if size:
            spans.append((body, body + size))
        remaining -= size
        header = body + size
        if size < MAX_PACKET_PAYLOAD:
            return spans, header


class _Framer:
    """Splits a byte stream into packets, keeping only the first `want` bytes of each logical packet's payload."""

    __slots__ = ("_chain_start", "_chained", "_hdr", "_left", "_len", "_seq", "_start", "head", "offset", "want")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self._hdr = bytearray()
        self._left: int | None = None  # payload bytes still to come in the current packet; None: in a header
        self._len = 0
        self._seq = 0
        self._start = 0
        self._chain_start = 0
        self._chained = False  # the current packet continues a 0xFFFFFF one
        self.head = bytearray()
        self.want = _HEAD_WANTED


class MysqlStreamWatcher:
    """Feed it one connection's server→client bytes (and optionally its client→server bytes); see the module doc.

    `feed` returns the events whose header arrived in that chunk; `events` keeps them all unless
    `keep_events=False` (for long soaks: memory then stays constant, `event_count` still counts).
    """

    def __init__(
        self,
        *,
        start_offset: int = 0,
        dump_started: bool = False,
        semi_sync: bool | None = None,
        keep_events: bool = True,
    ) -> None:
        self.semi_sync = semi_sync
        self.keep_events = keep_events
        self.events: list[EventLocation] = []
        self.event_count = 0
        self.dump_started_at: int | None = None
        self.dump_end: DumpEnd | None = None
        self.problems: list[str] = []
        self.stopped = False  # TLS or compression seen: bytes are no longer plain packets

        self._server = _Framer(start_offset)
        self._client = _Framer(0)
        self._client.want = 5
        self._client_packets = 0
        self._dump_pending = dump_started  # the next server logical packet opens a dump
        self._dump_active = False
        self._semi_seen = False
        self._classified = False
        self._chain_event: EventLocation | None = None
        self._event_starts: list[int] = []

    @property
    def offset(self) -> int:
        """Stream offset of the next server byte to be fed."""
        return self._server.offset

    @property
    def dump_active(self) -> bool:
        return self._dump_active

    def mark_dump_started(self) -> None:
        """Say that the client has just sent a dump command: the next server packet opens the dump."""
        self._dump_pending = True

    def event_at(self, offset: int) -> EventLocation | None:
        """The kept event whose bytes include stream offset `offset`, if any."""
        i = bisect.bisect_right(self._event_starts, offset) - 1
        if i < 0:
            return None
        event = self.events[i]
        return event if event.contains(offset) else None

    # -- server side ---------------------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> list[EventLocation]:
        """Account for the next server→client bytes; return the events whose header completed in them."""
        found: list[EventLocation] = []
        if self.stopped:
            self._server.offset += len(data)
            return found
        f = self._server
        view = memoryview(data)
        i, n = 0, len(view)
        while i < n:
            if f._left is None:
                take = min(PACKET_HEADER_LEN - len(f._hdr), n - i)
                f._hdr += view[i : i + take]
                i += take
                f.offset += take
                if len(f._hdr) == PACKET_HEADER_LEN:
                    self._server_packet_started()
                    if f._left == 0:
                        self._server_packet_ended(found)
                continue
            take = min(f._left, n - i)
            if not f._chained and len(f.head) < f.want:
                if not f.head and view[i] == _ERR:
                    f.want = _ERR_HEAD_WANTED  # keep enough of an ERR packet for its message
                f.head += view[i : i + min(take, f.want - len(f.head))]
            i += take
            f.offset += take
            f._left -= take
            if not f._chained and not self._classified and (len(f.head) >= f.want or f._left == 0):
                self._classify(found)
            if f._left == 0:
                self._server_packet_ended(found)
        return found

    def _server_packet_started(self) -> None:
        f = self._server
        f._len = f._hdr[0] | f._hdr[1] << 8 | f._hdr[2] << 16
        f._seq = f._hdr[3]
        f._start = f.offset - PACKET_HEADER_LEN
        f._hdr.clear()
        f._left = f._len
        if not f._chained:
            f._chain_start = f._start
            f.head.clear()
            f.want = _HEAD_WANTED
            self._classified = False

    def _server_packet_ended(self, found: list[EventLocation]) -> None:
        f = self._server
        if not f._chained and not self._classified:
            self._classify(found)
        f._left = None
        if f._len == MAX_PACKET_PAYLOAD:
            f._chained = True
            return
        f._chained = False
        event, self._chain_event = self._chain_event, None
        if event is not None and event.packet_end != f.offset:
            self.problems.append(
                f"event {event.index} ({event.name}) at {event.packet_start}: header says its packets end at "
                f"{event.packet_end}, framing ended them at {f.offset}"
            )

    def _classify(self, found: list[EventLocation]) -> None:
        """Decide what the logical packet starting at the current chain is, from its first bytes."""
        f = self._server
        head = f.head
        if not head:
            self._classified = True
            return
        if self._dump_pending:
            self._dump_pending = False
            self._start_dump(f._chain_start)
        elif not self._dump_active and self._is_opening_rotate():
            self._start_dump(f._chain_start)
        if not self._dump_active:
            self._classified = True
            return
        status = head[0]
        if status == _ERR:
            # Wait for the message (up to _ERR_HEAD_WANTED bytes) unless the packet has ended.
            if f._left and len(head) < f.want:
                return
            code = int.from_bytes(head[1:3], "little") if len(head) >= 3 else None
            message = bytes(head[9:] if head[3:4] == b"#" else head[3:]).decode("utf-8", "replace")
            self._end_dump(DumpEnd(f._chain_start, "error", code, message))
        elif status == _EOF and f._len < 9:
            self._end_dump(DumpEnd(f._chain_start, "eof"))
        elif status == _OK and f._len >= _MIN_EVENT_PAYLOAD:
            event = self._event(head)
            found.append(event)
            if f._len == MAX_PACKET_PAYLOAD:
                self._chain_event = event
        else:
            self.problems.append(
                f"packet at {f._chain_start} ({f._len} bytes, first byte 0x{status:02x}) is neither an event, "
                "EOF nor ERR during a dump"
            )
        self._classified = True

    def _is_opening_rotate(self) -> bool:
        f = self._server
        head = f.head
        if f._seq != 1 or len(head) < _MIN_EVENT_PAYLOAD or head[0] != _OK:
            return False
        prefixes = [_PLAIN_PREFIX]
        if self.semi_sync is not False and len(head) >= _HEAD_WANTED and head[1] == SEMI_SYNC_INDICATOR:
            prefixes.append(_SEMI_SYNC_PREFIX)
        for prefix in prefixes:
            timestamp, type_code, _, event_size, log_pos, flags = _EVENT_HEADER.unpack_from(head, prefix)
            if (
                type_code == ROTATE_EVENT
                and timestamp == 0
                and log_pos == 0
                and flags & LOG_EVENT_ARTIFICIAL_F
                and self._size_fits(event_size, prefix)
            ):
                return True
        return False

    def _size_fits(self, event_size: int, prefix: int) -> bool:
        length = self._server._len
        if length < MAX_PACKET_PAYLOAD:
            return event_size == length - prefix
        return event_size + prefix >= MAX_PACKET_PAYLOAD

    def _start_dump(self, offset: int) -> None:
        self._dump_active = True
        self.dump_started_at = offset
        self.dump_end = None
        self._semi_seen = False

    def _end_dump(self, end: DumpEnd) -> None:
        self._dump_active = False
        self.dump_end = end

    def _event(self, head: bytearray) -> EventLocation:
        f = self._server
        semi = self._semi_seen if self.semi_sync is None else self.semi_sync
        if self.semi_sync is None and not semi and len(head) >= _HEAD_WANTED and head[1] == SEMI_SYNC_INDICATOR:
            plain_size = _EVENT_HEADER.unpack_from(head, _PLAIN_PREFIX)[3]
            semi_size = _EVENT_HEADER.unpack_from(head, _SEMI_SYNC_PREFIX)[3]
            semi = not self._size_fits(plain_size, _PLAIN_PREFIX) and self._size_fits(semi_size, _SEMI_SYNC_PREFIX)
            self._semi_seen = semi
        prefix = _SEMI_SYNC_PREFIX if semi else _PLAIN_PREFIX
        if len(head) < prefix + HEADER_LEN:
            # Only possible when semi_sync=True was forced and the packet is too short for it.
            self.problems.append(f"packet at {f._chain_start} is too short for a semi-sync event")
            prefix = _PLAIN_PREFIX
            semi = False
        timestamp, type_code, server_id, event_size, log_pos, flags = _EVENT_HEADER.unpack_from(head, prefix)
        start = f._chain_start + PACKET_HEADER_LEN + prefix
        if f._len < MAX_PACKET_PAYLOAD:
            # One packet: trust the framing for where it ends, and say so if the header disagrees.
            end = f._chain_start + PACKET_HEADER_LEN + f._len
            segments: tuple[tuple[int, int], ...] = ((start, end),)
            packet_end = end
        else:
            spans, packet_end = packet_spans(f._chain_start, prefix + event_size)
            first_start, first_end = spans[0]
            segments = ((first_start + prefix, first_end), *spans[1:])
            end = segments[-1][1]
        if not self._size_fits(event_size, prefix):
            self.problems.append(
                f"event at {f._chain_start}: header event_size {event_size} does not match the packet's {f._len} "
                "bytes"
            )
        event = EventLocation(
            index=self.event_count,
            type_code=type_code,
            timestamp=timestamp,
            server_id=server_id,
            event_size=event_size,
            log_pos=log_pos,
            flags=flags,
            packet_start=f._chain_start,
            start=start,
            end=end,
            packet_end=packet_end,
            segments=segments,
            semi_sync=semi,
            ack_requested=semi and head[2] == 0x01,
        )
        self.event_count += 1
        if self.keep_events:
            self.events.append(event)
            self._event_starts.append(event.packet_start)
        return event

    # -- client side ---------------------------------------------------------------------------------------

    def feed_client(self, data: bytes | bytearray | memoryview) -> None:
        """Account for the next client→server bytes: spots the dump command (and TLS or compression)."""
        if self.stopped:
            return
        f = self._client
        view = memoryview(data)
        i, n = 0, len(view)
        while i < n:
            if f._left is None:
                take = min(PACKET_HEADER_LEN - len(f._hdr), n - i)
                f._hdr += view[i : i + take]
                i += take
                if len(f._hdr) == PACKET_HEADER_LEN:
                    f._len = f._hdr[0] | f._hdr[1] << 8 | f._hdr[2] << 16
                    f._seq = f._hdr[3]
                    f._hdr.clear()
                    f._left = f._len
                    if not f._chained:
                        f.head.clear()
                    if f._left == 0:
                        self._client_packet_ended()
                continue
            take = min(f._left, n - i)
            if not f._chained and len(f.head) < f.want:
                f.head += view[i : i + min(take, f.want - len(f.head))]
            i += take
            f._left -= take
            if f._left == 0:
                self._client_packet_ended()
                if self.stopped:
                    return

    def _client_packet_ended(self) -> None:
        f = self._client
        f._left = None
        chained, f._chained = f._chained, f._len == MAX_PACKET_PAYLOAD
        if chained or not f.head:
            return
        self._client_packets += 1
        if self._client_packets == 1 and len(f.head) >= 4:
            # The handshake response (or the SSL request that precedes it): its capability flags.
            capabilities = int.from_bytes(f.head[:4], "little")
            if capabilities & _CLIENT_SSL:
                self._stop("the client asked for TLS: the rest of the stream is encrypted")
            elif capabilities & _CLIENT_COMPRESS:
                self._stop("the client asked for protocol compression: packets are no longer plain")
            return
        if f._seq == 0 and f.head[0] in (COM_BINLOG_DUMP, COM_BINLOG_DUMP_GTID):
            self._dump_pending = True

    def _stop(self, why: str) -> None:
        self.stopped = True
        self.problems.append(why)
