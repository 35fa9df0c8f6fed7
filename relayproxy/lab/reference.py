"""python-mysql-replication's event decoders driven from raw event bytes: the reference decoder and baseline.

python-mysql-replication (``pymysqlreplication``) is the decoder the field already trusts, so the
tests check our codec against it and the benchmarks measure our hot path against it. Its decoders
are only reachable through ``BinLogStreamReader``, which wants a live master. ``ReferenceDecoder``
cuts the reader out and does per event exactly what ``BinLogStreamReader.fetchone`` does with a
packet it has read -- wrap it in ``BinLogPacketWrapper`` with the same arguments -- but the packet
is built from bytes we already have, and the "control connection" is a stub that refuses every use.

What a live stream learns from the server, the decoder is told instead:

* whether events carry a CRC32 trailer (``decode(..., checksum=...)``; a live reader asks the
  server's ``@@binlog_checksum`` once per session);
* the server version, post-header lengths and flavour (MySQL/MariaDB). Like ``fetchone`` it picks
  them up from every FORMAT_DESCRIPTION_EVENT it decodes; ``set_format(fde)`` feeds them from a
  relayproxy ``FormatDescription`` instead (needed when the library cannot decode that FDE itself,
  see below, or when decoding starts mid-stream);
* table definitions: rows events are decoded against the TABLE_MAP events this decoder has seen
  (``table_map``), exactly like a live stream -- there is no schema lookup.

Event types python-mysql-replication 1.0.x cannot decode from the bytes alone
-----------------------------------------------------------------------------
``decode`` returns None for these (the library maps them to ``NotImplementedEvent``, which a
default ``BinLogStreamReader`` filters out; ``library_decodes(type_code)`` says which are which):

* ANONYMOUS_GTID (34) -- no decoder at all, so anonymous groups are invisible to it;
* TRANSACTION_PAYLOAD (40, compressed transactions), TRANSACTION_CONTEXT (36), VIEW_CHANGE (37),
  INCIDENT (26), IGNORABLE (28), HEARTBEAT_V2 (41), GTID_TAGGED (42, MySQL 8.3+ tagged GTIDs);
* pre-5.1 / legacy events: START_V3 (1), LOAD (6), SLAVE (7), CREATE_FILE (8), APPEND_BLOCK (9),
  EXEC_LOAD (10), DELETE_FILE (11), NEW_LOAD (12), PRE_GA rows (20-22);
* MariaDB compressed events: QUERY_COMPRESSED (165) and the compressed rows events (166-171);
* any vendor or future type (e.g. Amazon Aurora's type 100).

Decoded, but not from the event's own bytes alone:

* rows events (23-25, 30-32, 39) need the TABLE_MAP of their table id earlier in the same decoder;
  without it the library drops the event (``decode`` returns None). Column *names*, signedness and
  character sets come only from a TABLE_MAP's optional metadata (``binlog_row_metadata=FULL``,
  MySQL 8.0.14+ / MariaDB 10.5+); otherwise the library names columns ``UNKNOWN_COL<i>``, decodes
  unsigned integers as signed and strings as UTF-8. On a live stream it would fill names from
  ``information_schema`` only with ``use_column_name_cache=True``; the stub connection makes that
  impossible here, and the decoder keeps that option off.
* Row *values* are decoded lazily: the library's event object holds the raw rows until ``.rows``
  is read; ``materialise_rows`` does that, as a CDC consumer would.
* GTID (33): the library reads last_committed/sequence_number only when it knows the server is
  5.7+, i.e. after an FDE (or ``set_format``).
* FDE (15): the library parses the version string with ``int()`` on each dotted part, so versions
  such as ``5.1.34sp1-enterprise-gpl-advanced-log`` make it raise; ``decode`` raises
  ``ReferenceDecodeError`` and the caller can ``set_format`` from our own FDE to go on.

Where the library is wrong or gives up on real binlogs (each one pinned by
tests/binlog/test_crosscheck_pymysqlreplication.py on the corpus): PREVIOUS_GTIDS in the MySQL 8.3+
tagged format (it reads the format word as the UUID count and raises); TABLE_MAP with MySQL 9
VECTOR columns, or with the 6-byte post-header of 5.1 pre-GA servers; USER_VAR without the
optional trailing flags byte (5.1); PREVIOUS_GTIDS text keeps the encoding's exclusive interval
ends ("1-6" for 1-5); XID ignores the FDE's post-header length (harmless on real servers, where it
is 0); a 5.6 GTID event's ``lt_type`` is read from the byte after the event body; and with
``verify_checksum=True`` every GTID_LIST entry is decoded from the start of the body (each entry
object re-runs the CRC check, which rewinds the packet), so keep it off when reading GTID_LISTs.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable

import pymysql.protocol
from pymysqlreplication import event as _lib_event
from pymysqlreplication import row_event as _lib_row_event
from pymysqlreplication.packet import BinLogPacketWrapper

from ..binlog import constants as C
from ..binlog.events import FormatDescription

__all__ = [
    "OfflineControlConnection",
    "OfflineConnectionUsed",
    "ReferenceDecodeError",
    "ReferenceDecoder",
    "library_decodes",
    "LIBRARY_VERSION",
]

try:
    from importlib.metadata import version as _dist_version

    LIBRARY_VERSION = _dist_version("mysql-replication")
except Exception:  # pragma: no cover - metadata missing in odd installs
    LIBRARY_VERSION = "unknown"

# The type -> class table the library dispatches on. It is private (name-mangled) in the library,
# but it is the library's own truth about what it decodes, so we read it rather than copy it.
_LIB_EVENT_MAP: dict[int, type] = BinLogPacketWrapper._BinLogPacketWrapper__event_map  # type: ignore[attr-defined]

# Every class the library really decodes. A default BinLogStreamReader lets fewer through at packet
# level (it leaves IntvarEvent out of its default list, so INTVAR is never decoded unless asked for
# with only_events); a reference decoder wants all of them.
_ALLOWED_EVENTS: frozenset = frozenset(
    cls for cls in _LIB_EVENT_MAP.values() if cls is not _lib_event.NotImplementedEvent
)

_ROWS_EVENT_TYPES = frozenset(
    {
        C.WRITE_ROWS_EVENT_V1,
        C.UPDATE_ROWS_EVENT_V1,
        C.DELETE_ROWS_EVENT_V1,
        C.WRITE_ROWS_EVENT,
        C.UPDATE_ROWS_EVENT,
        C.DELETE_ROWS_EVENT,
        C.PARTIAL_UPDATE_ROWS_EVENT,
    }
)

_OK_BYTE = b"\x00"  # every binlog packet of a dump stream starts with the OK marker
_FLAGS = struct.Struct("<H")


def library_decodes(type_code: int) -> bool:
    """True when python-mysql-replication has a real decoder for this event type."""
    return _LIB_EVENT_MAP.get(type_code) in _ALLOWED_EVENTS


class OfflineConnectionUsed(RuntimeError):
    """The library tried to use its control connection: that would be a server round trip."""


class OfflineControlConnection:
    """Stands in for the PyMySQL control connection ``BinLogStreamReader`` would pass to decoders.

    The decoders read ``charset`` and call ``_get_dbms()`` for every event; both are answered
    locally. Anything else (``cursor()``, ``query()``, ``ping()``...) is a query to a server, so it
    raises ``OfflineConnectionUsed`` -- and is recorded in ``attempts``, because the library's
    column-name lookup catches every exception and a swallowed attempt must still be visible.
    """

    __slots__ = ("charset", "dbms", "attempts")

    def __init__(self, charset: str = "utf8", dbms: str = "mysql"):
        self.charset = charset  # BinLogStreamReader defaults the connection charset to utf8
        self.dbms = dbms
        self.attempts: list[str] = []

    def _get_dbms(self) -> str:
        return self.dbms

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not in __slots__: any real connection API.
        if name.startswith("__"):
            raise AttributeError(name)
        self.attempts.append(name)
        raise OfflineConnectionUsed(
            f"python-mysql-replication tried to use its control connection ({name}); "
            "ReferenceDecoder decodes from event bytes only"
        )


class ReferenceDecodeError(ValueError):
    """python-mysql-replication raised while decoding an event; ``cause`` is its exception."""

    def __init__(self, type_code: int, cause: BaseException):
        self.type_code = type_code
        self.cause = cause
        super().__init__(
            f"python-mysql-replication failed on {C.event_name(type_code)} (type {type_code}): "
            f"{type(cause).__name__}: {cause}"
        )


class ReferenceDecoder:
    """python-mysql-replication's decoders, one binlog stream at a time, with no server.

    Feed it every event of a stream in order (FDE first, as on the wire) so it keeps the state a
    live ``BinLogStreamReader`` keeps: server version and post-header lengths from the FDE, the
    table map from TABLE_MAP events, ``log_file`` / ``log_pos`` as its ``fetchone`` advances them.

    ``decode(event_bytes, checksum=...)`` takes one whole event (19-byte header .. CRC trailer if
    any) and returns the library's event object, or None when the library has no decoder for the
    type or drops the event (rows event whose TABLE_MAP it has not seen). A library exception is
    re-raised as ``ReferenceDecodeError``.

    Options (defaults chosen so that decoding depends on the bytes alone):

    * ``optional_meta_data=True``: take column names/charsets from the TABLE_MAP's optional
      metadata when the server wrote it (a live reader sets it from ``@@binlog_row_metadata``);
    * ``freeze_schema=False``: decode every TABLE_MAP, even for a table id already known
      (``True`` makes the library skip repeated TABLE_MAPs, which ``decode`` then reports as None);
    * ``ignore_decode_errors=True``: undecodable strings in row values are decoded with
      ``errors="ignore"`` instead of raising (the charset may be unknown without metadata);
    * ``verify_checksum=False``: the library's own CRC check (the reader's default is off). When
      on, an FDE with LOG_EVENT_BINLOG_IN_USE_F is given to the library with the flag cleared,
      as a master sends it, since the server computed the FDE's CRC with the flag clear. It also
      breaks the library's GTID_LIST decoding (see the module docstring).
    """

    def __init__(
        self,
        fde: FormatDescription | None = None,
        *,
        mysql_version: tuple[int, ...] | None = None,
        post_header_lengths: Iterable[int] | None = None,
        dbms: str | None = None,
        optional_meta_data: bool = True,
        freeze_schema: bool = False,
        ignore_decode_errors: bool = True,
        verify_checksum: bool = False,
        charset: str = "utf8",
    ):
        self.connection = OfflineControlConnection(charset=charset, dbms=dbms or "mysql")
        # Same initial values as BinLogStreamReader.__init__.
        self.mysql_version: tuple[int, ...] = (0, 0, 0)
        self.post_header_lengths: tuple[int, ...] | None = None
        self.table_map: dict[int, Any] = {}
        self.log_file: str | None = None
        self.log_pos: int | None = None
        self.optional_meta_data = optional_meta_data
        self.freeze_schema = freeze_schema
        self.ignore_decode_errors = ignore_decode_errors
        self.verify_checksum = verify_checksum
        if fde is not None:
            self.set_format(fde)
        if mysql_version is not None:
            self.mysql_version = tuple(mysql_version)
        if post_header_lengths is not None:
            self.post_header_lengths = tuple(post_header_lengths)

    # -- configuration -------------------------------------------------------------------------
    @property
    def dbms(self) -> str:
        return self.connection.dbms

    @dbms.setter
    def dbms(self, value: str) -> None:
        if value not in ("mysql", "mariadb"):
            raise ValueError(f"dbms must be 'mysql' or 'mariadb', not {value!r}")
        self.connection.dbms = value

    def set_format(self, fde: FormatDescription) -> None:
        """Decode what follows as described by one of our FormatDescriptions.

        Sets what ``fetchone`` takes from a decoded FDE (server version, post-header lengths) and
        what the reader would learn from the server (flavour).
        """
        self.mysql_version = fde.version_tuple
        self.post_header_lengths = tuple(fde.post_header_lens)
        self.dbms = "mariadb" if fde.is_mariadb else "mysql"

    def reset(self) -> None:
        """Forget tables and positions (a new stream); the format stays."""
        self.table_map = {}
        self.log_file = None
        self.log_pos = None

    # -- decoding --------------------------------------------------------------------------------
    def decode(self, event_bytes: bytes | bytearray | memoryview, *, checksum: bool) -> object | None:
        """The library's event object for one whole event, or None when it does not decode it."""
        if not isinstance(event_bytes, bytes):
            event_bytes = bytes(event_bytes)
        type_code = event_bytes[4]
        if type_code == C.FORMAT_DESCRIPTION_EVENT and self.verify_checksum:
            event_bytes = _clear_in_use_flag(event_bytes)
        packet = pymysql.protocol.MysqlPacket(_OK_BYTE + event_bytes, None)
        try:
            wrapper = BinLogPacketWrapper(
                packet,
                self.table_map,
                self.connection,
                self.mysql_version,
                checksum,
                _ALLOWED_EVENTS,
                None,  # only_tables
                None,  # ignored_tables
                None,  # only_schemas
                None,  # ignored_schemas
                self.freeze_schema,
                self.ignore_decode_errors,
                self.verify_checksum,
                self.optional_meta_data,
                False,  # enable_logging
                False,  # use_column_name_cache: it would query information_schema
                self.post_header_lengths,
            )
        except OfflineConnectionUsed:
            raise
        except Exception as exc:  # the library signals malformed input with many exception types
            raise ReferenceDecodeError(type_code, exc) from exc
        self._follow_stream(wrapper)
        return wrapper.event

    def _follow_stream(self, wrapper: BinLogPacketWrapper) -> None:
        """The bookkeeping BinLogStreamReader.fetchone does after wrapping a packet."""
        event = wrapper.event
        if wrapper.event_type == C.ROTATE_EVENT and event is not None:
            self.log_pos = event.position
            self.log_file = event.next_binlog
            # fetchone drops cached tables on a real (timestamped) rotate: table ids are not
            # stable across a server restart, which always rotates.
            if wrapper.timestamp != 0:
                self.table_map = {}
        elif wrapper.log_pos:
            self.log_pos = wrapper.log_pos
        if wrapper.event_type == C.FORMAT_DESCRIPTION_EVENT and event is not None:
            self.mysql_version = event.mysql_version
            self.post_header_lengths = event.post_header_len
        if wrapper.event_type == C.TABLE_MAP_EVENT and event is not None:
            self.table_map[event.table_id] = event.get_table()

    @staticmethod
    def materialise_rows(event: object) -> list | None:
        """Decode the row values of a rows event (the library defers this to ``.rows``)."""
        if isinstance(event, _lib_row_event.RowsEvent):
            return event.rows
        return None

    @staticmethod
    def is_rows_type(type_code: int) -> bool:
        return type_code in _ROWS_EVENT_TYPES


def _clear_in_use_flag(event_bytes: bytes) -> bytes:
    flags = _FLAGS.unpack_from(event_bytes, 17)[0]
    if not flags & C.LOG_EVENT_BINLOG_IN_USE_F:
        return event_bytes
    return event_bytes[:17] + _FLAGS.pack(flags & ~C.LOG_EVENT_BINLOG_IN_USE_F) + event_bytes[19:]
