"""Transaction-boundary parser: MySQL's Transaction_boundary_parser rules and MariaDB's GTID-flag rules.

Fed one event at a time, it says whether the event opens, continues or ends an event group
and what the group's GTID is. It never holds the stream: it reads the header fields the caller
already unpacked plus at most a few bytes of the event (QUERY text head, GTID identifiers).

The MySQL flavour follows ``update_state`` of ``trx_boundary_parser.cpp`` transition for
transition, error transitions included (see protocol-reference §1.1). The MariaDB flavour follows
``queue_event`` in MariaDB's ``sql/slave.cc`` (§1.3).
"""

from __future__ import annotations

import struct

from . import constants as C
from .events import FormatDescription, split_version

# ---------------------------------------------------------------------------------------------
# Results of feed(): what the event did to the group structure of the stream.
# After EVENT_OUTSIDE and GROUP_END the stream is at a transaction boundary (is_at_boundary).
EVENT_OUTSIDE = 0  # an ignorable event outside any group (FDE, ROTATE, PREVIOUS_GTIDS, ...)
GROUP_START = 1  # the event opens a group that is not complete yet
GROUP_CONTINUE = 2  # the event is inside an open group (ignorable events inside a group too)
GROUP_END = 3  # the event completes a group (possibly a one-event group it opened itself)
RESULT_MASK = 0x3
FLAG_ERROR = 0x4  # the transition is an error; parser.error says why
FLAG_ABANDONED = 0x8  # a group that was open before this event was cut off and will never complete

RESULT_NAMES = {EVENT_OUTSIDE: "outside", GROUP_START: "start", GROUP_CONTINUE: "continue", GROUP_END: "end"}

# ---------------------------------------------------------------------------------------------
# MySQL: event boundary types (get_event_boundary_type) and parser states.
B_ERROR, B_GTID, B_BEGIN_TRX, B_END_TRX, B_END_XA_TRX, B_PRE_STATEMENT, B_STATEMENT = range(7)
B_INCIDENT, B_IGNORE, B_TRANSACTION_PAYLOAD, B_QUERY, B_UNKNOWN = range(7, 12)

S_NONE, S_GTID, S_DDL, S_DML, S_ERROR = range(5)
STATE_NAMES = {S_NONE: "NONE", S_GTID: "GTID", S_DDL: "DDL", S_DML: "DML", S_ERROR: "ERROR"}
BOUNDARY_NAMES = {
    B_ERROR: "ERROR",
    B_GTID: "GTID",
    B_BEGIN_TRX: "BEGIN_TRX",
    B_END_TRX: "END_TRX",
    B_END_XA_TRX: "END_XA_TRX",
    B_PRE_STATEMENT: "PRE_STATEMENT",
    B_STATEMENT: "STATEMENT",
    B_INCIDENT: "INCIDENT",
    B_IGNORE: "IGNORE",
    B_TRANSACTION_PAYLOAD: "TRANSACTION_PAYLOAD",
}


def _mysql_type_table() -> list[int]:
    table = [B_UNKNOWN] * 256
    for t in (C.GTID_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT):
        table[t] = B_GTID
    table[C.QUERY_EVENT] = B_QUERY
    for t in (C.XID_EVENT, C.XA_PREPARE_LOG_EVENT):
        table[t] = B_END_TRX
    for t in (C.INTVAR_EVENT, C.RAND_EVENT, C.USER_VAR_EVENT):
        table[t] = B_PRE_STATEMENT
    for t in (
        C.EXECUTE_LOAD_QUERY_EVENT,
        C.TABLE_MAP_EVENT,
        C.APPEND_BLOCK_EVENT,
        C.BEGIN_LOAD_QUERY_EVENT,
        C.ROWS_QUERY_LOG_EVENT,
        C.WRITE_ROWS_EVENT_V1,
        C.UPDATE_ROWS_EVENT_V1,
        C.DELETE_ROWS_EVENT_V1,
        C.WRITE_ROWS_EVENT,
        C.UPDATE_ROWS_EVENT,
        C.DELETE_ROWS_EVENT,
        C.VIEW_CHANGE_EVENT,
        C.PARTIAL_UPDATE_ROWS_EVENT,
        C.PRE_GA_WRITE_ROWS_EVENT,
        C.PRE_GA_UPDATE_ROWS_EVENT,
        C.PRE_GA_DELETE_ROWS_EVENT,
    ):
        table[t] = B_STATEMENT
    table[C.INCIDENT_EVENT] = B_INCIDENT
    for t in (
        C.ROTATE_EVENT,
        C.FORMAT_DESCRIPTION_EVENT,
        C.HEARTBEAT_LOG_EVENT,
        C.HEARTBEAT_LOG_EVENT_V2,
        C.PREVIOUS_GTIDS_LOG_EVENT,
        C.STOP_EVENT,
        C.SLAVE_EVENT,
        C.DELETE_FILE_EVENT,
        C.TRANSACTION_CONTEXT_EVENT,
        # 5.7 lists the pre-5.0 load events as ignorable too.
        C.START_EVENT_V3,
        C.LOAD_EVENT,
        C.CREATE_FILE_EVENT,
        C.NEW_LOAD_EVENT,
        C.EXEC_LOAD_EVENT,
    ):
        table[t] = B_IGNORE
    table[C.TRANSACTION_PAYLOAD_EVENT] = B_TRANSACTION_PAYLOAD
    return table


MYSQL_TYPE_TABLE = _mysql_type_table()
_TYPE_TABLE = MYSQL_TYPE_TABLE

# Transition table of update_state(): (state, boundary) -> (new state, is_error).
# Rows and columns in the order of protocol-reference §1.1; IGNORE keeps the state.
_T = {
    S_NONE: {
        B_GTID: (S_GTID, False),
        B_BEGIN_TRX: (S_DML, False),
        B_END_TRX: (S_NONE, True),
        B_END_XA_TRX: (S_NONE, True),
        B_PRE_STATEMENT: (S_DDL, False),
        B_STATEMENT: (S_NONE, False),
        B_TRANSACTION_PAYLOAD: (S_NONE, True),
        B_INCIDENT: (S_NONE, False),
        B_ERROR: (S_ERROR, True),
    },
    S_GTID: {
        B_GTID: (S_GTID, True),
        B_BEGIN_TRX: (S_DML, False),
        B_END_TRX: (S_NONE, True),
        B_END_XA_TRX: (S_NONE, False),
        B_PRE_STATEMENT: (S_DDL, False),
        B_STATEMENT: (S_NONE, False),
        B_TRANSACTION_PAYLOAD: (S_NONE, False),
        B_INCIDENT: (S_NONE, False),
        B_ERROR: (S_ERROR, True),
    },
    S_DDL: {
        B_GTID: (S_GTID, True),
        B_BEGIN_TRX: (S_DML, True),
        B_END_TRX: (S_NONE, True),
        B_END_XA_TRX: (S_NONE, True),
        B_PRE_STATEMENT: (S_DDL, False),
        B_STATEMENT: (S_NONE, False),
        B_TRANSACTION_PAYLOAD: (S_NONE, True),
        B_INCIDENT: (S_NONE, False),
        B_ERROR: (S_ERROR, True),
    },
    S_DML: {
        B_GTID: (S_GTID, True),
        B_BEGIN_TRX: (S_DML, True),
        B_END_TRX: (S_NONE, False),
        B_END_XA_TRX: (S_NONE, False),
        B_PRE_STATEMENT: (S_DML, False),
        B_STATEMENT: (S_DML, False),
        B_TRANSACTION_PAYLOAD: (S_NONE, True),
        B_INCIDENT: (S_NONE, False),
        B_ERROR: (S_ERROR, True),
    },
    S_ERROR: {
        B_GTID: (S_GTID, True),
        B_BEGIN_TRX: (S_DML, True),
        B_END_TRX: (S_NONE, True),
        B_END_XA_TRX: (S_NONE, True),
        B_PRE_STATEMENT: (S_DDL, True),
        B_STATEMENT: (S_NONE, True),
        B_TRANSACTION_PAYLOAD: (S_NONE, True),
        B_INCIDENT: (S_NONE, False),
        B_ERROR: (S_ERROR, True),
    },
}
# States in which the stream is inside a group (MySQL's is_inside_transaction, plus ERROR, where
# the stream is not at a boundary a relay could cut at either).
_INSIDE = (False, True, True, True, True)

# The hot path reads one packed int per (state, boundary), built from _T above:
# bits 0-2 new state, bits 4-5 result, and _SLOW when the transition needs more than a state
# change (an error to report, a group cut off, a GTID-less group opening).
_SLOW = 0x100


def _build_steps() -> list[int]:
    steps = [_SLOW] * (5 * 16)
    for state, row in _T.items():
        for boundary, (new_state, is_error) in row.items():
            if _INSIDE[state]:
                result = GROUP_CONTINUE if _INSIDE[new_state] else GROUP_END
            else:
                result = GROUP_START if _INSIDE[new_state] else GROUP_END
            slow = (
                is_error
                or boundary in (B_GTID, B_INCIDENT)
                or (state == S_NONE and boundary != B_GTID)  # a group opens without a GTID event
            )
            steps[state * 16 + boundary] = new_state | (result << 4) | (_SLOW if slow else 0)
        steps[state * 16 + B_IGNORE] = state | ((GROUP_CONTINUE if _INSIDE[state] else EVENT_OUTSIDE) << 4)
    return steps


_STEPS = _build_steps()

_U16 = struct.Struct("<H")
_QUERY_HEAD = struct.Struct("<8xBxxH")  # db_len at 8, status_vars_len at 11
_SID_GNO = struct.Struct("<16sq")
_MARIA_GTID_AT = struct.Struct("<5xI10xQIB").unpack_from  # server_id @5, then seq_no, domain_id, flags2 @19
_TYPE_SIZE_FLAGS = struct.Struct("<4xB4xI4xH").unpack_from  # the three header fields the parser needs
_ZERO_SID = bytes(16)
_QUERY_SPECIAL_FIRST = frozenset({0x42, 0x43, 0x52, 0x72, 0x58, 0x78, -1})  # B C R r X x, or no text
_GNO_MAX = (1 << 63) - 2

# MariaDB rules (slave.cc queue_event), as one action per event type.
M_NONE, M_GROUP, M_STANDALONE = range(3)
A_GTID, A_NON_GROUP, A_QUERY, A_QUERY_COMPRESSED, A_XID, A_INCIDENT, A_GROUP_EVENT, A_UNKNOWN = range(8)


def _maria_actions() -> list[int]:
    actions = [A_UNKNOWN] * 256
    for t in C.EVENT_NAMES:
        actions[t] = A_GROUP_EVENT
    for t in C.MARIADB_NON_GROUP_EVENTS:
        actions[t] = A_NON_GROUP
    actions[C.MARIA_GTID_EVENT] = A_GTID
    actions[C.QUERY_EVENT] = A_QUERY
    actions[C.MARIA_QUERY_COMPRESSED_EVENT] = A_QUERY_COMPRESSED
    actions[C.XID_EVENT] = A_XID
    actions[C.XA_PREPARE_LOG_EVENT] = A_XID
    actions[C.INCIDENT_EVENT] = A_INCIDENT
    # MySQL's IGNORABLE_LOG_EVENT never appears in a MariaDB binlog; the relay writes it as a filler over
    # a stretch a GTID dump skipped (relay/epochs.py). As an unknown type it is outside any group when it
    # carries LOG_EVENT_IGNORABLE_F (and an error without it), as MySQL's parser treats it.
    actions[C.IGNORABLE_LOG_EVENT] = A_UNKNOWN
    return actions


_MARIA_ACTIONS = _maria_actions()
_HEADER_LEN = C.HEADER_LEN
_IGNORABLE_F = C.LOG_EVENT_IGNORABLE_F
_GTID_TAGGED = C.GTID_TAGGED_LOG_EVENT
_FL_STANDALONE = C.FL_STANDALONE


class TransactionBoundaryParser:
    """Incremental transaction-boundary detector for one binlog stream.

    ``feed(type_code, flags, buf, pos, event_size)`` classifies the event whose header starts at
    ``buf[pos]`` (``buf`` may hold only the first bytes of a large event) and returns one of
    EVENT_OUTSIDE / GROUP_START / GROUP_CONTINUE / GROUP_END, or-ed with FLAG_ERROR and
    FLAG_ABANDONED. The group's GTID stays readable in ``gtid`` until the next group opens.

    ``flavour`` is "mysql", "mariadb" or "auto" (decided by every FORMAT_DESCRIPTION fed).
    """

    __slots__ = (
        "flavour",
        "state",
        "error",
        "errors",
        "_checksum_len",
        "_fde",
        "_query_body_start",
        "_gtid_sid",
        "_gtid_gno",
        "_gtid_tagged",
        "_maria_gtid",
        "_auto",
        "feed",
        "_prev_state",
        "_prev_gtid",
    )

    def __init__(self, flavour: str = "auto", fde: FormatDescription | None = None):
        if flavour not in ("auto", "mysql", "mariadb"):
            raise ValueError(f"unknown flavour {flavour!r}: expected auto, mysql or mariadb")
        self._auto = flavour == "auto"
        self.flavour = "mysql" if self._auto else flavour
        self.state = S_NONE
        self.error: str | None = None
        self.errors = 0
        self._fde: FormatDescription | None = None
        self._checksum_len = 0
        self._query_body_start = C.HEADER_LEN + 13
        self._gtid_sid: bytes | None = None
        self._gtid_gno = 0
        self._gtid_tagged: bytes | None = None
        self._maria_gtid: tuple[int, int, int] | None = None
        self._prev_state = S_NONE
        self._prev_gtid = None
        self.feed = self._feed_mysql
        if fde is not None:
            self.set_format(fde)
        if not self._auto:  # (set_format chooses only for "auto": a flavour given with an FDE is kept, and fed)
            self._select_flavour(self.flavour)

    # -- configuration -------------------------------------------------------------------------
    def set_format(self, fde: FormatDescription) -> None:
        """Adopt the checksum length and post-header sizes of a FORMAT_DESCRIPTION."""
        self._fde = fde
        self._checksum_len = fde.checksum_len
        self._query_body_start = C.HEADER_LEN + fde.query_post_header_len
        if self._auto:
            # MariaDB before 10.0 wrote no GTID events: its groups follow the MySQL rules.
            mariadb_gtid = fde.is_mariadb and split_version(fde.server_version) >= (10, 0, 0)
            self._select_flavour("mariadb" if mariadb_gtid else "mysql")

    def _select_flavour(self, flavour: str) -> None:
        if flavour != self.flavour:
            self.state = S_NONE  # == M_NONE
        self.flavour = flavour
        self.feed = self._feed_mariadb if flavour == "mariadb" else self._feed_mysql

    # -- status ----------------------------------------------------------------------------------
    @property
    def in_group(self) -> bool:
        """True while the stream is inside a group (or in MySQL's ERROR state)."""
        if self.flavour == "mariadb":
            return self.state != M_NONE
        return _INSIDE[self.state]

    @property
    def is_at_boundary(self) -> bool:
        return not self.in_group

    @property
    def state_name(self) -> str:
        if self.flavour == "mariadb":
            return ("NONE", "GROUP", "STANDALONE")[self.state]
        return STATE_NAMES[self.state]

    @property
    def gtid(self):
        """GTID of the open or last completed group.

        MySQL: ``(sid16, gno)`` or ``(sid16, tag, gno)`` for a tagged GTID, None for anonymous or
        GTID-less groups. MariaDB: ``(domain_id, server_id, seq_no)``.
        """
        if self.flavour == "mariadb":
            return self._maria_gtid
        if self._gtid_tagged is not None:
            return self._decode_tagged()
        if self._gtid_sid is None or self._gtid_sid == _ZERO_SID:
            return None
        return (self._gtid_sid, self._gtid_gno)

    def reset(self) -> None:
        """Back to outside any group: used after a reconnect, when the master re-sends whole groups."""
        self.state = S_NONE
        self.error = None
        self._gtid_sid = None
        self._gtid_tagged = None
        self._maria_gtid = None

    def state_key(self) -> tuple:
        """Everything the next ``feed`` depends on, as a hashable value: two parsers with equal keys
        classify the same events alike (the format's object is stood for by the numbers it contributes)."""
        return (self.flavour, self.state, self._checksum_len, self._query_body_start, self._gtid_sid,
                self._gtid_gno, self._gtid_tagged[0] if self._gtid_tagged is not None else None, self._maria_gtid)

    def copy(self) -> TransactionBoundaryParser:
        """An independent parser in the same state (a dump's shared read-ahead classifies a chunk with one)."""
        other = TransactionBoundaryParser.__new__(TransactionBoundaryParser)
        # Slot by slot, written out: this runs for every chunk a dump reads at the horizon (a loop over __slots__
        # with getattr/setattr cost a dozen calls a transaction in the relay's profile).
        other.flavour = self.flavour
        other.state = self.state
        other.error = self.error
        other.errors = self.errors
        other._checksum_len = self._checksum_len
        other._fde = self._fde
        other._query_body_start = self._query_body_start
        other._gtid_sid = self._gtid_sid
        other._gtid_gno = self._gtid_gno
        other._gtid_tagged = self._gtid_tagged
        other._maria_gtid = self._maria_gtid
        other._auto = self._auto
        other._prev_state = self._prev_state
        other._prev_gtid = self._prev_gtid
        other.feed = other._feed_mariadb if other.flavour == "mariadb" else other._feed_mysql
        return other

    def adopt(self, other: TransactionBoundaryParser) -> None:
        """Take ``other``'s state (the end state of a chunk that a copy of this parser classified)."""
        if (other.flavour == self.flavour and other._checksum_len == self._checksum_len
                and other._query_body_start == self._query_body_start):
            # The same format (a chunk holds no FORMAT_DESCRIPTION, and is shared only by dumps of the same file):
            # only the group state moves. Every dump that takes a shared chunk does this: plain assignments.
            self.state = other.state
            self.error = other.error
            self.errors = other.errors
            self._gtid_sid = other._gtid_sid
            self._gtid_gno = other._gtid_gno
            self._gtid_tagged = other._gtid_tagged
            self._maria_gtid = other._maria_gtid
            return
        for name in self.__slots__:
            if name != "feed":
                setattr(self, name, getattr(other, name))
        self.feed = self._feed_mariadb if self.flavour == "mariadb" else self._feed_mysql

    def checkpoint(self) -> None:
        """Remember the current state so rollback() can undo the next feed (e.g. a failed write)."""
        self._prev_state = self.state
        self._prev_gtid = (self._gtid_sid, self._gtid_gno, self._gtid_tagged, self._maria_gtid)

    def rollback(self) -> None:
        """Undo the feeds since the last checkpoint (MySQL's Transaction_boundary_parser::rollback)."""
        self.state = self._prev_state
        if self._prev_gtid is not None:
            self._gtid_sid, self._gtid_gno, self._gtid_tagged, self._maria_gtid = self._prev_gtid

    def feed_event(self, buf, pos: int = 0) -> int:
        """Convenience wrapper: unpack the header at ``buf[pos]`` and feed the event."""
        type_code = buf[pos + 4]
        event_size = int.from_bytes(buf[pos + 9 : pos + 13], "little")
        flags = _U16.unpack_from(buf, pos + 17)[0]
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            self.set_format(FormatDescription.parse(buf, pos, event_size))
        return self.feed(type_code, flags, buf, pos, event_size)

    # -- MySQL -----------------------------------------------------------------------------------
    def _classify_query(self, buf, pos: int, event_size: int) -> int:
        """get_event_boundary_type() for a QUERY_EVENT: only the head of the query text is read."""
        if event_size < self._query_body_start:
            self.error = f"QUERY_EVENT of {event_size} bytes is shorter than its post-header"
            return B_ERROR
        try:
            db_len, status_len = _QUERY_HEAD.unpack_from(buf, pos + _HEADER_LEN)
            start = self._query_body_start + status_len + db_len + 1
            qlen = event_size - self._checksum_len - start
            if qlen <= 0:
                self.error = "QUERY_EVENT with an empty query (q_len 0)"
                return B_ERROR
            q = pos + start
            first = buf[q]
        except (struct.error, IndexError):
            self.error = "QUERY_EVENT is truncated before its query text"
            return B_ERROR
        # Dispatch on the first byte: most queries are neither BEGIN/COMMIT nor ROLLBACK/XA.
        if first == 0x42:  # B: strncmp(query, "BEGIN", qlen)
            return B_BEGIN_TRX if qlen <= 5 and b"BEGIN".startswith(bytes(buf[q : q + qlen])) else B_STATEMENT
        if first == 0x43:  # C: strncmp(query, "COMMIT", qlen)
            return B_END_TRX if qlen <= 6 and b"COMMIT".startswith(bytes(buf[q : q + qlen])) else B_STATEMENT
        if first in (0x52, 0x72):  # R, r: ROLLBACK but not ROLLBACK TO (case-insensitive)
            head = bytes(buf[q : q + min(qlen, 12)]).upper()
            return B_END_TRX if head[:8] == b"ROLLBACK" and head != b"ROLLBACK TO " else B_STATEMENT
        if first in (0x58, 0x78):  # X, x: XA START (case-sensitive), XA ROLLBACK (case-insensitive)
            head = bytes(buf[q : q + min(qlen, 11)])
            if head[:8] == b"XA START":
                return B_BEGIN_TRX
            if head.upper() == b"XA ROLLBACK":
                return B_END_XA_TRX
        return B_STATEMENT

    def _feed_mysql(self, type_code: int, flags: int, buf, pos: int, event_size: int) -> int:
        boundary = _TYPE_TABLE[type_code]
        if boundary == B_QUERY:
            # Inline the common case: a query whose first letter is not B, C, R or X is a statement.
            try:
                db_len, status_len = _QUERY_HEAD.unpack_from(buf, pos + _HEADER_LEN)
                q = pos + self._query_body_start + status_len + db_len + 1
                first = buf[q] if q < pos + event_size - self._checksum_len else -1
            except (struct.error, IndexError):
                first = -1
            if first in _QUERY_SPECIAL_FIRST or event_size < self._query_body_start:
                boundary = self._classify_query(buf, pos, event_size)
            else:
                boundary = B_STATEMENT
        elif boundary == B_UNKNOWN:
            if flags & _IGNORABLE_F:
                boundary = B_IGNORE
            else:
                self.error = (
                    f"unsupported event type {type_code} without the IGNORABLE flag in the stream "
                    "(ER_TRX_BOUND_UNSUPPORTED_UNIGNORABLE_EVENT_IN_STREAM)"
                )
                boundary = B_ERROR
        step = _STEPS[self.state * 16 + boundary]
        if step & _SLOW:
            return self._slow_step(step, boundary, type_code, buf, pos, event_size)
        self.state = step & 7
        return step >> 4

    def _slow_step(self, step: int, boundary: int, type_code: int, buf, pos: int, event_size: int) -> int:
        """Transitions that do more than change state: GTIDs, incidents, errors, GTID-less groups."""
        state = self.state
        new_state = step & 7
        result = (step >> 4) & RESULT_MASK
        is_error = _T[state][boundary][1]
        if boundary == B_GTID:
            if type_code == _GTID_TAGGED:
                self._gtid_tagged = (bytes(buf[pos : pos + event_size]), self._fde)
            else:
                self._gtid_tagged = None
                try:
                    sid, gno = _SID_GNO.unpack_from(buf, pos + _HEADER_LEN + 1)
                except struct.error:
                    sid, gno = None, 0
                    self.error = "GTID event is truncated"
                else:
                    anonymous = type_code == C.ANONYMOUS_GTID_LOG_EVENT
                    if not (anonymous or 1 <= gno <= _GNO_MAX):
                        self.error = f"GTID event has GNO {gno}, outside 1..{_GNO_MAX}"
                        sid = None
                if sid is None:
                    self._gtid_sid, self._gtid_gno = None, 0
                    self.state = S_ERROR
                    self.errors += 1
                    return (GROUP_CONTINUE if _INSIDE[state] else GROUP_START) | FLAG_ERROR
                self._gtid_sid, self._gtid_gno = sid, gno
            if _INSIDE[state]:
                # A GTID inside a group: the previous group was cut and never completes.
                result = GROUP_START | FLAG_ABANDONED
                if state != S_ERROR:
                    self.error = (
                        f"GTID event inside an open {STATE_NAMES[state]} group: the previous group was truncated"
                    )
        elif state == S_NONE:
            # A group opened without a GTID event (pre-GTID servers): it has no GTID.
            self._gtid_sid = None
            self._gtid_tagged = None
        if boundary == B_INCIDENT and _INSIDE[state]:
            # An incident marks a gap: whatever was open is discarded, its GTID never completes.
            result |= FLAG_ABANDONED
            self._gtid_sid = None
            self._gtid_tagged = None
        if is_error:
            if boundary != B_ERROR and boundary != B_GTID:
                self.error = (
                    f"unexpected {BOUNDARY_NAMES[boundary]} event (type {type_code}) in state {STATE_NAMES[state]}"
                )
            result |= FLAG_ERROR
            self.errors += 1
        self.state = new_state
        return result

    def _decode_tagged(self):
        from .events import BinlogFormatError
        from .views import view_event  # tagged GTIDs are rare: decode through the full view

        raw, fde = self._gtid_tagged
        if fde is None:
            fde = FormatDescription(4, "8.3.0", 0, C.HEADER_LEN, b"", C.CHECKSUM_OFF)
        try:
            ev = view_event(raw, 0, fde)
            return (ev.sid, ev.tag, ev.gno) if ev.tag else (ev.sid, ev.gno)
        except (BinlogFormatError, ValueError):
            return None

    # -- MariaDB ---------------------------------------------------------------------------------
    def _feed_mariadb(self, type_code: int, flags: int, buf, pos: int, event_size: int) -> int:
        state = self.state
        if state == M_GROUP:  # most events of a MariaDB stream: inside a transactional group
            if type_code == 2:  # QUERY ends the group iff the event ends with NUL + COMMIT / ROLLBACK
                end = pos + event_size - self._checksum_len
                try:
                    last = buf[end - 1]
                except IndexError:  # only the head of a large event is present: it is no COMMIT
                    return GROUP_CONTINUE
                if (last == 0x54 and bytes(buf[end - 7 : end]) == b"\0COMMIT") or (
                    last == 0x4B and bytes(buf[end - 9 : end]) == b"\0ROLLBACK"
                ):
                    if event_size - self._checksum_len >= _HEADER_LEN + 13:
                        self.state = M_NONE
                        return GROUP_END
                return GROUP_CONTINUE
            if type_code == 16 or type_code == 38:  # XID, XA_PREPARE
                self.state = M_NONE
                return GROUP_END
            if type_code == 162:
                return self._maria_gtid_event(buf, pos)  # a GTID cuts the open group
            return GROUP_CONTINUE
        action = _MARIA_ACTIONS[type_code]
        if action == A_GTID:
            return self._maria_gtid_event(buf, pos)
        if state == M_STANDALONE:
            if action == A_QUERY or action == A_QUERY_COMPRESSED or action == A_INCIDENT:
                self.state = M_NONE
                return GROUP_END
            return GROUP_CONTINUE
        if action == A_NON_GROUP or action == A_INCIDENT or (action == A_UNKNOWN and flags & _IGNORABLE_F):
            return EVENT_OUTSIDE
        # A group event with no GTID before it.
        self._maria_gtid = None
        self.error = f"The current group of events starts with a non-GTID {C.event_name(type_code)} event"
        self.errors += 1
        return GROUP_END | FLAG_ERROR

    def _maria_gtid_event(self, buf, pos: int) -> int:
        try:
            server_id, seq_no, domain_id, flags2 = _MARIA_GTID_AT(buf, pos)
        except struct.error:
            self.error = "MariaDB GTID event is truncated"
            self.errors += 1
            return (GROUP_CONTINUE if self.state != M_NONE else EVENT_OUTSIDE) | FLAG_ERROR
        result = GROUP_START
        if self.state != M_NONE:
            previous = self._maria_gtid
            self.error = "Unexpected break of being relay-logged GTID %s event group by the current GTID event %d-%d-%d" % (
                "-".join(map(str, previous)) if previous else "?",
                domain_id,
                server_id,
                seq_no,
            )
            self.errors += 1
            result = GROUP_START | FLAG_ABANDONED | FLAG_ERROR
        self._maria_gtid = (domain_id, server_id, seq_no)
        self.state = M_STANDALONE if flags2 & _FL_STANDALONE else M_GROUP
        return result

    # -- batch fast path ---------------------------------------------------------------------------
    def feed_buffer(self, buf, pos: int, end: int, on_group_end=None) -> tuple[int, int]:
        """Feed every complete event of ``buf[pos:end]`` (a file image or a chunk of one).

        The loop runs inside the parser, so the per-event cost is the parser's alone (benchmarks/parse_cost.py
        and the Spark job's comparison walk use it; the runtime's scanner, receiver and dump sender call ``feed``
        per event). ``on_group_end(end_offset, gtid)`` is called for
        every completed group. Returns ``(pos after the last complete event, end of the last
        event after which the stream was at a boundary, or -1)``. FORMAT_DESCRIPTION events
        are adopted as they pass. Stops before an event that is cut or impossibly short.

        The result, the callbacks and the parser's state afterwards are exactly those of calling
        ``feed`` once per event. Each flavour has its own loop (``_batch_mysql``, ``_batch_mariadb``)
        that keeps the state in a local and handles the events that cannot surprise it (rows events
        inside a group, MariaDB GTID/QUERY/XID, ...) inline; everything else goes through ``feed``.
        The parser's attributes are up to date whenever ``on_group_end`` runs; the callback must not
        feed this parser.
        """
        last_boundary = -1
        while True:  # a FORMAT_DESCRIPTION of the other flavour ("auto") hands over to the other loop
            if self.flavour == "mariadb":
                pos, last_boundary, switched = self._batch_mariadb(buf, pos, end, on_group_end, last_boundary)
            else:
                pos, last_boundary, switched = self._batch_mysql(buf, pos, end, on_group_end, last_boundary)
            if not switched:
                return pos, last_boundary

    def _batch_mysql(self, buf, pos: int, end: int, on_group_end, last_boundary: int):
        """feed_buffer's loop under the MySQL rules; returns (pos, last_boundary, flavour switched).

        The hot comparisons use literals (a module constant is a dictionary look-up each time; _check_literals
        below keeps them honest): 19 _HEADER_LEN; actions -2 _X_QUERY, -3 _X_GTID, -16 _X_SLOW, 0x400
        _X_CLEAR_GTID; boundaries 1 B_GTID, 2 B_BEGIN_TRX, 3 B_END_TRX, 6 B_STATEMENT; state 1 S_GTID; results
        3 GROUP_END (and RESULT_MASK), 0 EVENT_OUTSIDE; B (0x42) and C (0x43) the first letters of BEGIN, COMMIT.
        """
        unpack = _TYPE_SIZE
        query_head = _QUERY_HEAD_AT
        special_first = _QUERY_SPECIAL_FIRST
        rows = _MYSQL_BATCH_ROWS
        query_rows = _MYSQL_BATCH_QUERY_ROWS
        state = self.state
        row = rows[state]
        query_row = query_rows[state]
        checksum_len = self._checksum_len
        body_start = self._query_body_start
        gtid = _UNSET  # the value of self.gtid, when known without asking it
        limit = end - 19
        while pos <= limit:
            type_code, size = unpack(buf, pos)
            nxt = pos + size
            if size < 19 or nxt > end:
                break
            act = row[type_code]
            if act == 0:  # inside a group, the state stays (rows, TABLE_MAP, INTVAR... in a DML group)
                pos = nxt
                continue
            if act == -2:  # QUERY: _feed_mysql's peek, inline; exact BEGIN and COMMIT too
                try:
                    db_len, status_len = query_head(buf, pos + 19)
                    q = pos + body_start + status_len + db_len + 1
                    first = buf[q] if q < nxt - checksum_len else -1
                except (struct.error, IndexError):
                    first = -1
                if first in special_first or size < body_start:
                    # B and C: _classify_query's strncmp against BEGIN / COMMIT, for the usual cases.
                    if first == 0x42 and size >= body_start:
                        qlen = nxt - checksum_len - q
                        if qlen > 5:
                            act = query_row[6]  # longer than BEGIN: a statement
                        elif buf[q : q + qlen] == b"BEGIN":
                            act = query_row[2]
                        else:
                            act = query_row[self._classify_query(buf, pos, size)]
                    elif first == 0x43 and size >= body_start:
                        qlen = nxt - checksum_len - q
                        if qlen > 6:
                            act = query_row[6]  # longer than COMMIT: a statement (CREATE ...)
                        elif buf[q : q + qlen] == b"COMMIT":
                            act = query_row[3]
                        else:
                            act = query_row[self._classify_query(buf, pos, size)]
                    else:
                        act = query_row[self._classify_query(buf, pos, size)]
                else:
                    act = query_row[6]
                if act == 0:  # a statement inside a DML group
                    pos = nxt
                    continue
            elif act == -3:  # GTID or ANONYMOUS_GTID opening a group (_slow_step's GTID case, inline)
                try:
                    sid, gno = _SID_GNO_AT(buf, pos + 20)
                except struct.error:
                    act = -17  # _X_SLOW - B_GTID: truncated, _slow_step reports it
                else:
                    if type_code == 34 or 1 <= gno <= _GNO_MAX:  # ANONYMOUS_GTID, or a valid GNO
                        self._gtid_tagged = None
                        self._gtid_sid = sid
                        self._gtid_gno = gno
                        gtid = None if sid == _ZERO_SID else (sid, gno)
                        state = self.state = 1
                        row = rows[1]
                        query_row = query_rows[1]
                        pos = nxt
                        continue
                    act = -17
            if act > 0:  # a transition that only changes the state (and forgets the GTID of a GTID-less group)
                if act & 0x400:
                    self._gtid_sid = None
                    self._gtid_tagged = None
                    gtid = None
                result = (act >> 4) & 3
                act &= 7
                if act != state:
                    state = self.state = act
                    row = rows[act]
                    query_row = query_rows[act]
            elif act <= -16:  # GTID, incident, errors: _slow_step
                boundary = -16 - act
                result = self._slow_step(_STEPS[state * 16 + boundary], boundary, type_code, buf, pos, size) & 3
                state = self.state
                row = rows[state]
                query_row = query_rows[state]
                gtid = _UNSET
            elif type_code == 15 and self._adopt_mysql_format(buf, pos, size):
                # A FORMAT_DESCRIPTION that keeps the MySQL rules is an IGNORE event: the state stays.
                checksum_len = self._checksum_len
                body_start = self._query_body_start
                result = (_MYSQL_BATCH_STEPS[state * 16 + B_IGNORE] >> 4) & 3
                pos = nxt
                if result == 0:
                    last_boundary = nxt
                continue
            else:  # a FORMAT_DESCRIPTION that switched to MariaDB, unknown types: the per-event path
                result = self.feed(type_code, _U16.unpack_from(buf, pos + 17)[0], buf, pos, size) & 3
                gtid = _UNSET
                if self.flavour != "mysql":
                    if result == 3:
                        last_boundary = nxt
                        if on_group_end is not None:
                            on_group_end(nxt, self.gtid)
                    elif result == 0:
                        last_boundary = nxt
                    return nxt, last_boundary, True
                state = self.state
                row = rows[state]
                query_row = query_rows[state]
                checksum_len = self._checksum_len
                body_start = self._query_body_start
            if result == 3:  # GROUP_END
                last_boundary = nxt
                if on_group_end is not None:
                    on_group_end(nxt, self.gtid if gtid is _UNSET else gtid)
                    state = self.state
                    row = rows[state]
                    query_row = query_rows[state]
            elif result == 0:  # EVENT_OUTSIDE
                last_boundary = nxt
            pos = nxt
        return pos, last_boundary, False

    def _adopt_mysql_format(self, buf, pos: int, size: int) -> bool:
        """Adopt the FORMAT_DESCRIPTION at ``buf[pos]``; True when the MySQL rules still apply."""
        self.set_format(FormatDescription.parse(buf, pos, size))
        return self.flavour == "mysql"

    def _batch_mariadb(self, buf, pos: int, end: int, on_group_end, last_boundary: int):
        """feed_buffer's loop under the MariaDB rules; returns (pos, last_boundary, flavour switched).

        The hot comparisons use literals (a module constant is a dictionary look-up per event): 19 is
        _HEADER_LEN, states 0/1/2 are M_NONE/M_GROUP/M_STANDALONE, types 2 QUERY, 16 XID, 162 GTID.
        """
        unpack = _TYPE_SIZE
        gtid_at = _MARIA_GTID_AT
        continues = _MARIA_GROUP_CONTINUES
        state = self.state
        last_at = self._checksum_len + 1  # the last byte of an event's body is buf[next - last_at]
        limit = end - 19
        while pos <= limit:
            if state == 1:
                # Inside a transactional group (most events of a MariaDB stream): only a QUERY ending with
                # COMMIT or ROLLBACK (last byte T or K), XID, XA_PREPARE, GTID and FDE leave this loop.
                while pos <= limit:
                    type_code, size = unpack(buf, pos)
                    nxt = pos + size
                    if size < 19 or nxt > end:
                        break
                    if type_code == 2:
                        if buf[nxt - last_at] not in b"TK":
                            pos = nxt
                            continue
                    elif continues[type_code]:
                        pos = nxt
                        continue
                    break
                else:
                    break  # the buffer ends
                if size < 19 or nxt > end:
                    break  # a cut or impossible event
                if type_code == 16:  # XID ends the group
                    state = self.state = 0
                    if on_group_end is not None:
                        on_group_end(nxt, self._maria_gtid)
                        state = self.state
                    last_boundary = pos = nxt
                    continue
            else:
                type_code, size = unpack(buf, pos)
                nxt = pos + size
                if size < 19 or nxt > end:
                    break
                if type_code == 162 and state == 0:  # a GTID opens a group
                    try:
                        server_id, seq_no, domain_id, flags2 = gtid_at(buf, pos)
                    except struct.error:
                        pass  # truncated: the per-event path reports it
                    else:
                        self._maria_gtid = (domain_id, server_id, seq_no)
                        state = self.state = 2 if flags2 & 1 else 1  # FL_STANDALONE
                        pos = nxt
                        continue
            # Everything else: the per-event path.
            if type_code == 15:
                self.set_format(FormatDescription.parse(buf, pos, size))
            result = self.feed(type_code, _U16.unpack_from(buf, pos + 17)[0], buf, pos, size) & RESULT_MASK
            if result == GROUP_END:
                last_boundary = nxt
                if on_group_end is not None:
                    on_group_end(nxt, self.gtid)
            elif result == EVENT_OUTSIDE:
                last_boundary = nxt
            pos = nxt
            if self.flavour != "mariadb":
                return pos, last_boundary, True
            state = self.state
            last_at = self._checksum_len + 1
        return pos, last_boundary, False


# feed_buffer's MySQL loop: per parser state, one action per event type. 0: the event continues the group and
# the state stays; > 0 (_X_STEP set): bits 0-2 the new state, bits 4-5 the result, _X_CLEAR_GTID: a group opens
# without a GTID event; _X_QUERY: peek at the query text, then _MYSQL_BATCH_STEPS[state * 16 + boundary];
# _X_GTID: a GTID/ANONYMOUS_GTID opening a group; <= _X_SLOW: _X_SLOW - boundary, a transition _slow_step
# handles; _X_FEED: feed() (FORMAT_DESCRIPTION, unknown types).
_X_STEP, _X_CLEAR_GTID, _X_QUERY, _X_GTID, _X_FEED, _X_SLOW = 0x200, 0x400, -2, -3, -1, -16
_UNSET = object()


def _mysql_batch_steps() -> list[int]:
    """_STEPS as batch actions: what _slow_step does for a GTID-less group opening is done inline."""
    out = [_X_FEED] * (5 * 16)
    for state, row in _T.items():
        for boundary, (_new_state, is_error) in row.items():
            step = _STEPS[state * 16 + boundary]
            if not step & _SLOW:
                out[state * 16 + boundary] = _X_STEP | step
            elif state == S_NONE and not is_error and boundary not in (B_GTID, B_INCIDENT):
                out[state * 16 + boundary] = _X_STEP | _X_CLEAR_GTID | (step & 0xFF)
            else:
                out[state * 16 + boundary] = _X_SLOW - boundary
        out[state * 16 + B_IGNORE] = _X_STEP | _STEPS[state * 16 + B_IGNORE]
    return out


_MYSQL_BATCH_STEPS = _mysql_batch_steps()
# Per state, the action for each QUERY boundary (B_QUERY resolved): 0 when a statement continues the group.
_MYSQL_BATCH_QUERY_ROWS = tuple(
    [0 if _STEPS[state * 16 + b] == state | (GROUP_CONTINUE << 4) else _MYSQL_BATCH_STEPS[state * 16 + b]
     for b in range(16)]
    for state in range(5)
)


def _mysql_batch_rows() -> tuple[list[int], ...]:
    rows = []
    for state in range(5):
        row = []
        for type_code in range(256):
            boundary = MYSQL_TYPE_TABLE[type_code]
            if type_code == C.FORMAT_DESCRIPTION_EVENT or boundary == B_UNKNOWN:
                act = _X_FEED
            elif boundary == B_QUERY:
                act = _X_QUERY
            elif state == S_NONE and type_code in (C.GTID_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT):
                act = _X_GTID
            elif _STEPS[state * 16 + boundary] == state | (GROUP_CONTINUE << 4):
                act = 0
            else:
                act = _MYSQL_BATCH_STEPS[state * 16 + boundary]
            row.append(act)
        rows.append(row)
    return tuple(rows)


_MYSQL_BATCH_ROWS = _mysql_batch_rows()
# feed_buffer's MariaDB loop: inside a transactional group every event type but these continues it
# (_feed_mariadb in M_GROUP); QUERY is tested before this table.
_MARIA_GROUP_CONTINUES = bytes(
    0 if t in (C.FORMAT_DESCRIPTION_EVENT, C.QUERY_EVENT, C.XID_EVENT, C.XA_PREPARE_LOG_EVENT, C.MARIA_GTID_EVENT)
    else 1
    for t in range(256)
)
_TYPE_SIZE = struct.Struct("<4xB4xI6x").unpack_from  # type and size of a 19-byte header
_QUERY_HEAD_AT = _QUERY_HEAD.unpack_from
_SID_GNO_AT = _SID_GNO.unpack_from
_ANONYMOUS_GTID = C.ANONYMOUS_GTID_LOG_EVENT


def _check_literals() -> None:
    """The batch loops spell these constants as literals; a change here must change them too."""
    expected = {
        "_HEADER_LEN": (_HEADER_LEN, 19), "_X_QUERY": (_X_QUERY, -2), "_X_GTID": (_X_GTID, -3),
        "_X_SLOW": (_X_SLOW, -16), "_X_CLEAR_GTID": (_X_CLEAR_GTID, 0x400), "B_GTID": (B_GTID, 1),
        "B_BEGIN_TRX": (B_BEGIN_TRX, 2), "B_END_TRX": (B_END_TRX, 3), "B_STATEMENT": (B_STATEMENT, 6),
        "S_GTID": (S_GTID, 1), "GROUP_END": (GROUP_END, 3), "RESULT_MASK": (RESULT_MASK, 3),
        "EVENT_OUTSIDE": (EVENT_OUTSIDE, 0), "M_NONE": (M_NONE, 0), "M_GROUP": (M_GROUP, 1),
        "M_STANDALONE": (M_STANDALONE, 2), "FL_STANDALONE": (_FL_STANDALONE, 1),
        "QUERY_EVENT": (C.QUERY_EVENT, 2), "XID_EVENT": (C.XID_EVENT, 16), "MARIA_GTID_EVENT": (C.MARIA_GTID_EVENT, 162),
        "FORMAT_DESCRIPTION_EVENT": (C.FORMAT_DESCRIPTION_EVENT, 15), "ANONYMOUS_GTID": (_ANONYMOUS_GTID, 34),
    }
    wrong = {name: value for name, (value, literal) in expected.items() if value != literal}
    if wrong:
        raise RuntimeError(f"boundary.py: the batch loops' literals no longer match {wrong}")


_check_literals()
