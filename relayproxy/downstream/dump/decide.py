"""What a dump does with each event for its replica, sans-I/O: send it as is, send other bytes, leave it out, skip a
group the replica has, and what is owed around it (a heartbeat after skipped groups, a fake ROTATE past a filler,
a fake GTID_LIST once a MariaDB domain reaches its start, a semi-sync ACK request); or end the dump.

``EventDecider`` is the state machine of one dump's event-by-event path (``sender.py`` ``_handle``): fed one event
at a time (its header fields and bytes), it returns a ``Decision`` and updates its state; it reads no file, writes no
socket and never waits. The shared chunk path (``sender.py`` ``_plain_chunk``, ``followers.py``) does not call it
per event: it reads the same state once per range (``skipping``, ``skip_end``, ``reposition``, ``fake_gtid_list``,
``exclude``, ``maria_state``, ``maria_seen``) to see whether the range needs anything done at all.

The rules are the servers' (MySQL ``Binlog_sender::skip_event`` / ``send_events``; MariaDB ``send_event_to_slave``,
``Gtid_log_event::make_compatible_event``); groups come from the boundary parser, the one parser of the relay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ...binlog import boundary as B
from ...binlog import constants as C
from ...binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from .errors import (
    MSG_ANONYMOUS,
    MSG_MARIA_ANNOTATE_DUMMY,
    MSG_MARIA_GTID_COMPAT,
    MSG_MARIA_HOLE,
    MSG_MARIA_LIST_DUMMY,
    DumpFailure,
    read_failure,
    maria_not_in_binlog,
)
from ...wire.packets import (
    MARIA_SLAVE_CAPABILITY_ANNOTATE,
    MARIA_SLAVE_CAPABILITY_BINLOG_CHECKPOINT,
    MARIA_SLAVE_CAPABILITY_GTID,
    MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES,
)
from .files import GTID_TYPES
from .rewrite import MARIA_GTID_HEADER_LEN, begin_event, dummy_event

# What to do with the event itself.
SEND, REPLACE, OMIT, SKIP, END = range(5)
ACTION_NAMES = ("SEND", "REPLACE", "OMIT", "SKIP", "END")


class Decision(NamedTuple):
    """One event's decision, in the order the sender carries it out: ``heartbeat`` (a HEARTBEAT at that position of
    the current file, 0 for none), ``reposition`` (a fake ROTATE to (current file, that position), 0 for none), the
    event (``action``: SEND it as is, REPLACE it by ``event``, OMIT it, SKIP it as part of a group the replica has,
    or END the dump with ``failure``), ``ack`` (ask for a semi-sync ACK of it), then ``gtid_list`` (a fake GTID_LIST
    of the GTIDs met, ``EventDecider.maria_seen``, at the event's end)."""

    action: int
    event: bytes | None = None
    ack: bool = False
    heartbeat: int = 0
    reposition: int = 0
    gtid_list: bool = False
    failure: DumpFailure | None = None


_SEND = Decision(SEND)
_SEND_ACK = Decision(SEND, None, True)
_SKIP = Decision(SKIP)
_OMIT = Decision(OMIT)


class EventDecider:
    """The per-event state of one dump. The sender sets the start (``exclude`` for MySQL auto-position,
    ``maria_state`` for a MariaDB GTID position; ``file`` at each file) and asks ``decide`` per event and
    ``filler`` per relay-made filler; ``take_heartbeat`` gives the heartbeat owed before the sender waits.

    ``binlog_gtids`` returns the relay's MariaDB binlog state (the horizon's GTIDs): read only when a domain the
    replica asked for had nothing in the relay when the dump started and its first group arrives."""

    __slots__ = (
        "parser", "flavour", "semi_sync", "capability", "send_annotate", "skip_replication", "heartbeat_period",
        "exclude", "maria_state", "maria_seen", "maria_strict", "binlog_gtids", "file",
        "skipping", "skip_end", "reposition", "fake_gtid_list",
    )

    def __init__(self, parser: B.TransactionBoundaryParser, *, flavour: str, semi_sync: bool = False,
                 capability: int = 0, send_annotate: bool = False, skip_replication: bool = False,
                 heartbeat_period: float = 0.0, maria_strict: bool = False,
                 binlog_gtids: Callable[[], Any] | None = None):
        self.parser = parser
        self.flavour = flavour
        self.semi_sync = semi_sync
        self.capability = capability
        self.send_annotate = send_annotate  # MariaDB BINLOG_SEND_ANNOTATE_ROWS_EVENT
        self.skip_replication = skip_replication  # MariaDB SET skip_replication=1
        self.heartbeat_period = heartbeat_period
        self.exclude: GtidSet | None = None  # MySQL GTID protocol: the replica's GTIDs
        self.maria_state: dict = {}  # MariaDB GTID: domain -> _MariaStart still looked for
        self.maria_seen = MariaBinlogState()  # until_binlog_state: GTIDs met while skipping
        self.maria_strict = maria_strict
        self.binlog_gtids = binlog_gtids
        self.file: str | None = None
        # The state the events move.
        self.skipping = False  # inside a group the replica has
        self.skip_end = 0  # exclude_group_end_pos: end of the last skipped group not yet told (MySQL)
        self.reposition = 0  # a fake ROTATE to (file, here) is due before the next event: a filler was skipped
        self.fake_gtid_list = False  # a MariaDB domain reached its start: a GTID_LIST is due

    # -- the chunk path's question (once per range, not per event) ------------------------------------------
    def plain(self) -> bool:
        """Whether nothing is owed or going on that a range sent as it is would miss: no group being skipped, no
        heartbeat, reposition or GTID list owed, no ACKs asked."""
        return not (self.semi_sync or self.skipping or self.skip_end or self.reposition or self.fake_gtid_list)

    def take_heartbeat(self) -> int:
        """The position of the heartbeat owed after skipped groups (0: none), before the sender waits; now told."""
        owed = self.skip_end
        self.skip_end = 0
        return owed

    # -- per event ------------------------------------------------------------------------------------
    def filler(self, end_pos: int) -> None:
        """A relay-made filler (never sent) ends at ``end_pos``: the replica must learn the position past it. An
        auto-position replica from a heartbeat before the next event (as after skipped groups); a MariaDB replica
        that tolerates holes from the next event's log_pos; any other (file/position: it counts bytes) from a
        fake ROTATE to (this file, here)."""
        if self.exclude is not None:
            self.skip_end = end_pos
        elif not (self.flavour == "mariadb" and self.capability >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES):
            self.reposition = end_pos

    def decide(self, buf, off: int, size: int, file_pos: int, type_code: int, flags: int, crc: bool,
               idle: float = 0.0) -> Decision:
        """The decision for the event ``buf[off:off + size]`` at ``file_pos`` (only its head is needed for a large
        one); ``crc``: the file's events end with a CRC32; ``idle``: seconds since the sender last sent anything
        (a heartbeat is due while skipping once it reaches the heartbeat period)."""
        try:
            action, event, ack = self._event(buf, off, size, file_pos, type_code, flags, crc)
        except DumpFailure as failure:
            return Decision(END, failure=failure)
        end_pos = file_pos + size
        heartbeat = reposition = 0
        if action == SKIP:
            if self.exclude is not None:
                # MySQL: a heartbeat tells the replica how far the skipped groups went, before the next event sent
                # or before waiting; and at least every heartbeat period while skipping long stretches.
                if self.heartbeat_period > 0 and idle >= self.heartbeat_period:
                    heartbeat = end_pos
                    self.skip_end = 0
                else:
                    self.skip_end = end_pos
        else:
            if self.skip_end:
                heartbeat = self.skip_end
                self.skip_end = 0
            if self.reposition:
                reposition = self.reposition
                self.reposition = 0
        gtid_list = False
        if self.fake_gtid_list and not self.skipping:
            # MariaDB: once a domain reaches the requested GTID, a fake GTID_LIST (the GTIDs met so far, log_pos =
            # here) lets MASTER_GTID_WAIT() on the replica see the position.
            self.fake_gtid_list = False
            gtid_list = True
        if not (heartbeat or reposition or gtid_list or event is not None):
            if action == SEND:
                return _SEND_ACK if ack else _SEND
            if action == SKIP:
                return _SKIP
            if action == OMIT and not ack:
                return _OMIT
        return Decision(action, event, ack, heartbeat, reposition, gtid_list)

    def _event(self, buf, off: int, size: int, file_pos: int, type_code: int, flags: int,
               crc: bool) -> tuple[int, bytes | None, bool]:
        """(action, replacement, ACK request) for the event itself; the group state moves."""
        result = self.parser.feed(type_code, flags, buf, off, size)
        kind = result & B.RESULT_MASK
        if kind == B.GROUP_START:
            self.skipping = self._skip_group(type_code, file_pos)
        skip = self.skipping and kind != B.EVENT_OUTSIDE
        group_end = kind == B.GROUP_END
        if group_end:
            self.skipping = False
        if skip:
            return SKIP, None, False
        ack = group_end and self.semi_sync
        if self.flavour == "mariadb":
            action, replacement = self._maria_filter(buf, off, size, file_pos, type_code, flags, crc)
            return action, replacement, ack
        return SEND, None, ack

    def _skip_group(self, type_code: int, file_pos: int) -> bool:
        """Whether the group opening here is one the replica already has."""
        if self.exclude is not None:
            if type_code == C.ANONYMOUS_GTID_LOG_EVENT:
                # Binlog_sender::check_event_type(): never send anonymous groups to auto-position.
                raise read_failure(MSG_ANONYMOUS % (self.file, file_pos), file_pos, file_pos)
            if type_code in GTID_TYPES:
                gtid = self.parser.gtid
                return gtid is not None and gtid in self.exclude
            return False
        if self.maria_state and type_code == C.MARIA_GTID_EVENT:
            return self._maria_skip(self.parser.gtid)
        return False

    def _maria_skip(self, gtid: tuple[int, int, int] | None) -> bool:
        """send_event_to_slave(): skip the domain's groups until the requested GTID, then stop skipping."""
        if gtid is None:
            return False
        domain, server_id, seq_no = gtid
        self.maria_seen.update(MariaGtid(domain, server_id, seq_no))
        entry = self.maria_state.get(domain)
        if entry is None:
            return False
        start = entry.gtid
        if entry.empty_domain:
            binlog = self.binlog_gtids() if self.binlog_gtids is not None else None
            if not isinstance(binlog, MariaBinlogState):
                binlog = MariaBinlogState()
            mine = binlog.get(start.domain_id, start.server_id)
            if mine is None or mine.seq_no < start.seq_no:
                raise maria_not_in_binlog(start, binlog)
            entry.empty_domain = False
        skip = server_id != start.server_id or seq_no <= start.seq_no
        if server_id == start.server_id and seq_no >= start.seq_no:
            if self.maria_strict and seq_no > start.seq_no:
                raise DumpFailure(MSG_MARIA_HOLE % (start,))
            self.fake_gtid_list = True
            del self.maria_state[domain]
        return skip

    def _maria_filter(self, buf, off: int, size: int, file_pos: int, type_code: int, flags: int,
                      crc: bool) -> tuple[int, bytes | None]:
        """What a MariaDB master does to an event for this replica's capabilities (send_event_to_slave)."""
        cap = self.capability
        if type_code == C.MARIA_ANNOTATE_ROWS_EVENT and not self.send_annotate:
            if cap >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES:
                return OMIT, None  # the replica takes positions from log_pos: holes are fine
            if cap < MARIA_SLAVE_CAPABILITY_ANNOTATE:
                dummy = dummy_event(bytes(buf[off : off + C.HEADER_LEN]), size, crc)
                if dummy is None:
                    raise read_failure(MSG_MARIA_ANNOTATE_DUMMY, file_pos, file_pos + size)
                return REPLACE, dummy
            # capability 1 understands the event and ignores it: sent as is
        elif type_code == C.MARIA_GTID_EVENT and cap < MARIA_SLAVE_CAPABILITY_GTID:
            # Gtid_log_event::make_compatible_event(): BEGIN for a transaction; a standalone GTID is left out, or
            # replaced by a same-size dummy for replicas that cannot take holes.
            header = bytes(buf[off : off + C.HEADER_LEN])
            if size - (C.CHECKSUM_LEN if crc else 0) < C.HEADER_LEN + MARIA_GTID_HEADER_LEN:
                raise read_failure(MSG_MARIA_GTID_COMPAT, file_pos, file_pos + size)
            flags2 = buf[off + C.HEADER_LEN + 12]
            if flags2 & C.FL_STANDALONE:
                if cap >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES:
                    return OMIT, None
                dummy = dummy_event(header, size, crc)
                if dummy is None:
                    raise read_failure(MSG_MARIA_GTID_COMPAT, file_pos, file_pos + size)
                return REPLACE, dummy
            begin = begin_event(header, size, crc)
            if begin is None:
                raise read_failure(MSG_MARIA_GTID_COMPAT, file_pos, file_pos + size)
            return REPLACE, begin
        elif (type_code == C.MARIA_BINLOG_CHECKPOINT_EVENT and cap < MARIA_SLAVE_CAPABILITY_BINLOG_CHECKPOINT) or (
            type_code == C.MARIA_GTID_LIST_EVENT and cap < MARIA_SLAVE_CAPABILITY_GTID
        ):
            if cap >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES:
                return OMIT, None
            dummy = dummy_event(bytes(buf[off : off + C.HEADER_LEN]), size, crc)
            if dummy is None:
                raise read_failure(MSG_MARIA_LIST_DUMMY, file_pos, file_pos + size)
            return REPLACE, dummy
        if self.skip_replication and flags & C.LOG_EVENT_SKIP_REPLICATION_F:
            return OMIT, None  # SET skip_replication=1: events marked @@skip_replication stay here
        return SEND, None
