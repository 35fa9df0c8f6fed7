"""Binlog dump sender: streams relay files to a replica as its MySQL/MariaDB master would, never past the horizon.

``serve_dump(ctx, conn, request, channel)`` answers one COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID. It
reproduces the master's side of the protocol from the servers' own sources (MySQL
``sql/rpl_binlog_sender.cc`` ``Binlog_sender``; MariaDB ``sql/sql_repl.cc`` ``mysql_binlog_send``):

* **start**: file/position checks, MySQL GTID auto-position (replica-ahead check, purged check,
  newest file whose PREVIOUS_GTIDS is a subset of the replica's set) or MariaDB GTID
  (``check_slave_start_position``, ``gtid_find_binlog_file``), each refusal with the server's error
  text as ERR 1236;
* **preamble**: artificial ROTATE, then the file's FORMAT_DESCRIPTION with the in-use flag cleared
  (``log_pos``/``created`` zeroed as the server does), at the start and after every file switch;
* **events**: the bytes of the relay files, CRC-checked as they are read, in 0x00-prefixed packets
  (plus the 0xEF semi-sync header when negotiated), never beyond ``horizon.position`` of the file the
  horizon is in: a replica only ever sees complete, durable transactions (design invariant 1);
* **GTID skipping** with MySQL's heartbeat after skipped groups, or MariaDB's per-domain skipping
  followed by a fake GTID_LIST; MariaDB capability rewriting for old replicas;
* **waiting** on the horizon (no polling), a heartbeat on every idle period, EOF for NON_BLOCK.

Errors while a relay file is open get the servers' position suffix ("; the first event '...' at
..., the last event read from '...' at ..., the last byte read from '...' at ...."). File names in
it are basenames (MariaDB prints basenames; MySQL prints its own binlog path, which for a relay
would only leak the relay directory).

Semi-sync toward replicas: every packet carries the 0xEF header, the last event of every
transaction asks for an ACK, and ACKs are recorded in the relay-wide ``SemiSyncTracker`` (see
``semi_sync_tracker``) so the upstream session can wait for N replicas before it ACKs the master.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..binlog import boundary as B
from ..binlog import constants as C
from ..binlog import encoders
from ..binlog.checksum import ChecksumError
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription, split_version
from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtid, MariaGtidPosition
from ..binlog.reader import scan_file
from ..log import get_logger
from ..relay.catalog import CatalogError, FileCatalog, FileInfo
from ..wire.packets import (
    BINLOG_DUMP_NON_BLOCK,
    BINLOG_SEND_ANNOTATE_ROWS_EVENT,
    CLIENT_DEPRECATE_EOF,
    EOF_HEADER,
    USE_HEARTBEAT_EVENT_V2,
)
from ..wire.results import encode_eof, encode_error, encode_ok
from .context import DumpProgress

if TYPE_CHECKING:
    from .context import ConnectionState, DownstreamContext, DumpChannel, DumpRequest

__all__ = [
    "serve_dump",
    "SemiSyncTracker",
    "semi_sync_tracker",
    "StreamingChannel",
    "READ_CHUNK",
]

log = get_logger(__name__)

# -- error codes and texts (all reach the replica as ERR packets) ----------------------------------
ER_UNKNOWN_COM_ERROR = 1047
ER_UNKNOWN_ERROR = 1105
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236  # the replica's IO thread stops for good on this one
ER_MALFORMED_GTID_SET_ENCODING = 1773

MSG_NO_FILE = "Could not find first log file name in binary log index file"
MSG_POS_LT_4 = "Client requested master to start replication from position < 4"
MSG_POS_GT_SIZE = "Client requested master to start replication from position > file size"
MSG_MARIA_IMPOSSIBLE_POS = "Client requested master to start replication from impossible position"
MSG_CHECKSUM = "Slave can not handle replication events with the checksum that master is configured to log"
MSG_CRC = "event read from binlog did not pass crc check"
MSG_TRUNCATED = "binlog truncated in the middle of event; consider out of disk space on master"
MSG_BOGUS = "bogus data in log event"
MSG_IO = "I/O error reading log event"
MSG_BAD_MAGIC = "Binlog has bad magic number;  It's not a binary log file that can be used by this version of MySQL"
MSG_NO_FDE_MYSQL = "Could not find format_description_event in binlog file"
MSG_NO_FDE_MARIADB = "Failed to find format descriptor event in start of binlog"
MSG_NEXT_LOG = "could not find next log"
MSG_OPEN = "Could not open log file"
# A forced retention purge (or anything else) removed the file this dump reads: the dump stops at
# once (not at the end of the file) so the file's disk space is really freed.
MSG_FILE_PURGED = "Could not open log file: %s was purged from the relay while this replica was reading it"
MSG_GTID_MODE_OFF = (
    "The replication sender thread cannot start in AUTO_POSITION mode: this server has GTID_MODE = OFF instead of ON."
)
MSG_OLD_BINLOG = (
    "Found old binary log without GTIDs while looking for the oldest binary log that contains any GTID "
    "that is not in the given gtid set"
)
MSG_ANONYMOUS = "Cannot replicate anonymous transaction when AUTO_POSITION = 1, at file %s, position %d."
# ER_SLAVE_HAS_MORE_GTIDS_THAN_MASTER (1885); 8.0.26 renamed it ER_REPLICA_HAS_MORE_GTIDS_THAN_SOURCE
# and rewrote the text with source/replica, which is what a replica of an 8.0.26+ master shows.
MSG_MORE_GTIDS = {
    False: (
        "Slave has more GTIDs than the master has, using the master's SERVER_UUID. This may indicate that the end "
        "of the binary log was truncated or that the last binary log file was lost, e.g., after a power or disk "
        "failure when sync_binlog != 1. The master may or may not have rolled back transactions that were already "
        "replicated to the slave. Suggest to replicate any transactions that master has rolled back from slave to "
        "master, and/or commit empty transactions on master to account for transactions that have been committed "
        "on master but are not included in GTID_EXECUTED."
    ),
    True: (
        "Replica has more GTIDs than the source has, using the source's SERVER_UUID. This may indicate that the end "
        "of the binary log was truncated or that the last binary log file was lost, e.g., after a power or disk "
        "failure when sync_binlog != 1. The source may or may not have rolled back transactions that were already "
        "replicated to the replica. Suggest to replicate any transactions that source has rolled back from replica "
        "to source, and/or commit empty transactions on source to account for transactions that have been committed "
        "on source but are not included in GTID_EXECUTED."
    ),
}
# ER_MASTER_HAS_PURGED_REQUIRED_GTIDS (1789) as report_missing_purged_gtids formats it.
MSG_PURGED = {
    False: (
        "Cannot replicate because the master purged required binary logs. Replicate the missing transactions from "
        "elsewhere, or provision a new slave from backup. Consider increasing the master's binary log expiration "
        "period. The GTID set sent by the slave is '%s', and the missing transactions are '%s'"
    ),
    True: (
        "Cannot replicate because the source purged required binary logs. Replicate the missing transactions from "
        "elsewhere, or provision a new replica from backup. Consider increasing the source's binary log expiration "
        "period. The GTID set sent by the replica is '%s', and the missing transactions are '%s'"
    ),
}
# MariaDB sql_repl.cc, mysql_binlog_send() and gtid_find_binlog_file().
MSG_MARIA_NOT_IN_BINLOG = "Error: connecting slave requested to start from GTID %s, which is not in the master's binlog"
MSG_MARIA_NOT_IN_BINLOG2 = (
    "Error: connecting slave requested to start from GTID %s, which is not in the master's binlog. Since the "
    "master's binlog contains GTIDs with higher sequence numbers, it probably means that the slave has diverged "
    "due to executing extra erroneous transactions"
)
MSG_MARIA_HOLE = (
    "The binlog on the master is missing the GTID %s requested by the slave (even though both a prior and a "
    "subsequent sequence number does exist), and GTID strict mode is enabled"
)
MSG_MARIA_NO_STATE = (
    "Could not find GTID state requested by slave in any binlog files. Probably the slave state is too old and "
    "required binlog files have been purged."
)
MSG_MARIA_BAD_STATE = "Out of memory or malformed slave request when obtaining start position from GTID state"
MSG_MARIA_ANNOTATE_DUMMY = "Failed to replace row annotate event with dummy: too small event."
MSG_MARIA_GTID_COMPAT = "Failed to replace GTID event with backwards-compatible event: currupt event."  # sic
MSG_MARIA_LIST_DUMMY = "Failed to replace binlog checkpoint or gtid list event with dummy: too small event."

# -- MariaDB slave capabilities (@mariadb_slave_capability, sql/log_event.h) -----------------------
MARIA_SLAVE_CAPABILITY_ANNOTATE = 1
MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES = 2
MARIA_SLAVE_CAPABILITY_BINLOG_CHECKPOINT = 3
MARIA_SLAVE_CAPABILITY_GTID = 4

# -- reading and sending ---------------------------------------------------------------------------
READ_CHUNK = 1 << 20  # bytes read from a relay file at once
_INLINE_READ = 64 << 10  # reads this small stay on the loop (page cache); larger ones go to a thread
_HEAD = 64 << 10  # what the boundary parser may look at of an event that is streamed
_STREAM_PIECE = 4 << 20  # bytes of a large event read (and held) at a time while it is sent
SEMI_SYNC_MAGIC = 0xEF
_PREFIX_PLAIN = b"\x00"
_PREFIX_SEMI = (b"\x00\xef\x00", b"\x00\xef\x01")
_IDLE_RECHECK = 30.0  # without heartbeats, re-read the horizon object this often (the store may be reopened)
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_header_unpack_from = HEADER.unpack_from
_CRC32 = C.CHECKSUM_CRC32
_GTID_TYPES = frozenset({C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT})

# Per-event outcomes of _decide().
_SEND, _SKIP, _OMIT, _REPLACE = range(4)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class StreamingChannel(Protocol):
    """What a DumpChannel may offer on top of ``send`` for events that need more than one packet.

    ``send_stream(total, chunks)`` sends one payload of ``total`` bytes whose bytes arrive from the
    async iterator ``chunks`` (the first chunk starts with the 0x00 / 0xEF header), framed exactly as
    ``send`` frames a payload: 0xFFFFFF-byte packets, then a shorter one (empty when the payload
    ends on a packet boundary), and the semi-sync numbering rule after an ACK request. The sender
    reads a large event from disk piece by piece while it goes out, so memory stays bounded
    whatever the event's size (design invariant 4). A channel without it gets the whole payload
    through ``send``: correct, but the event is held in memory while it is sent.
    """

    async def send_stream(self, total: int, chunks: AsyncIterator[bytes]) -> None: ...


async def serve_dump(ctx: DownstreamContext, conn: ConnectionState, request: DumpRequest, channel: DumpChannel) -> None:
    """Serve one binlog dump until the replica leaves, an error ends it (sent as ERR), or NON_BLOCK ends it (EOF).

    Returns normally in every case; a replica that disconnects ends the dump quietly. ``conn.dump``
    shows the progress (file, position, counters, last semi-sync ACK) while it runs.
    """
    await _DumpSender(ctx, conn, request, channel).run()


class SemiSyncTracker:
    """Which position each semi-sync replica has acknowledged, relay-wide.

    The upstream session uses it to wait for N downstream replicas before the relay sends its own
    ACK to the master: ``await tracker.wait_for(file, end_pos, n, timeout)`` after the transaction
    ending at ``(file, end_pos)`` is durable. An ACK for ``(file, pos)`` means the replica has
    everything up to there; positions compare by binlog file sequence number, then offset (MySQL's
    ``ActiveTranx::compare`` compares names then positions).
    """

    def __init__(self) -> None:
        self._acked: dict[Hashable, tuple[tuple, str, int]] = {}
        self._registered: set[Hashable] = set()
        self._waiters: list[tuple[tuple, int, asyncio.Future]] = []

    @property
    def replicas(self) -> int:
        """Semi-sync replicas currently dumping (a caller may stop waiting when fewer than N are connected)."""
        return len(self._registered)

    def register(self, replica: Hashable) -> None:
        self._registered.add(replica)

    def forget(self, replica: Hashable) -> None:
        """The replica's dump ended: its ACKs no longer count."""
        self._registered.discard(replica)
        self._acked.pop(replica, None)

    def acked(self, file: str, pos: int, replica: Hashable = None) -> None:
        """Record an ACK; positions only move forward per replica, and satisfied waiters wake."""
        key = _position_key(file, pos)
        current = self._acked.get(replica)
        if current is not None and current[0] >= key:
            return
        self._acked[replica] = (key, file, pos)
        if not self._waiters:
            return
        still = []
        for target, n, future in self._waiters:
            if future.done():
                continue
            if self._count_key(target) >= n:
                future.set_result(True)
            else:
                still.append((target, n, future))
        self._waiters = still

    def last_ack(self, replica: Hashable) -> tuple[str, int] | None:
        entry = self._acked.get(replica)
        return None if entry is None else (entry[1], entry[2])

    def count(self, file: str, pos: int) -> int:
        """Replicas that acknowledged ``(file, pos)`` or later."""
        return self._count_key(_position_key(file, pos))

    def _count_key(self, target: tuple) -> int:
        return sum(1 for key, _f, _p in self._acked.values() if key >= target)

    async def wait_for(self, file: str, pos: int, n: int, timeout: float | None = None) -> bool:
        """True once ``n`` replicas acknowledged ``(file, pos)``; False when ``timeout`` passes first."""
        target = _position_key(file, pos)
        if n <= 0 or self._count_key(target) >= n:
            return True
        future = asyncio.get_running_loop().create_future()
        entry = (target, n, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            try:
                self._waiters.remove(entry)
            except ValueError:
                pass


def semi_sync_tracker(ctx: Any) -> SemiSyncTracker:
    """The relay-wide tracker, kept on the context (``ctx.semi_sync``); created on first use."""
    tracker = getattr(ctx, "semi_sync", None)
    if not isinstance(tracker, SemiSyncTracker):
        tracker = SemiSyncTracker()
        ctx.semi_sync = tracker
    return tracker


def _position_key(file: str, pos: int) -> tuple:
    base, dot, ext = file.rpartition(".")
    if dot and ext.isdigit():
        return (base, int(ext), pos)
    return (file, -1, pos)


# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------


class _DumpFailure(Exception):
    """Ends the dump with an ERR packet. ``with_position`` adds the servers' "; the first event ..." suffix,
    which both servers append to 1236 errors raised while a binlog file is open."""

    def __init__(self, message: str, code: int = ER_MASTER_FATAL_ERROR_READING_BINLOG, *, sqlstate: str = "HY000",
                 with_position: bool = False, last_event: int | None = None, last_byte: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.sqlstate = sqlstate
        self.with_position = with_position
        self.last_event = last_event
        self.last_byte = last_byte


class _ReplicaGone(Exception):
    """The replica closed the connection: the dump ends without a word."""


class _Finished(Exception):
    """NON_BLOCK dump reached the end of the relay: EOF was sent."""


def _read_failure(message: str, event_at: int, byte_at: int) -> _DumpFailure:
    return _DumpFailure(message, with_position=True, last_event=event_at, last_byte=byte_at)


def eof_payload(capabilities: int) -> bytes:
    """What ``my_eof`` sends at the end of a NON_BLOCK dump: an EOF packet, or the 0xFE-headed OK of
    CLIENT_DEPRECATE_EOF clients. Both are shorter than 9 bytes, which is how a replica recognises the end."""
    if capabilities & CLIENT_DEPRECATE_EOF:
        return encode_ok(header=EOF_HEADER)
    return encode_eof()


# ---------------------------------------------------------------------------------------------
# MariaDB compatibility rewrites (sql/log_event_server.cc: Query_log_event::dummy_event,
# Query_log_event::begin_event, Gtid_log_event::make_compatible_event)
# ---------------------------------------------------------------------------------------------

_QUERY_POST_HEADER = 13
_MIN_USER_VAR_DUMMY = C.HEADER_LEN + 4 + 1 + 1  # name length, 1-byte name, is_null
_MIN_QUERY_DUMMY = C.HEADER_LEN + _QUERY_POST_HEADER + 1 + 1  # db terminator, 1 byte of comment
_Q_TIME_ZONE_CODE = 5
_MARIA_GTID_HEADER_LEN = 19


def _dummy_header(header: bytes, type_code: int) -> bytearray:
    out = bytearray(header[: C.HEADER_LEN])
    flags = _U16.unpack_from(out, 17)[0]
    flags = (flags & ~C.LOG_EVENT_THREAD_SPECIFIC_F) | C.LOG_EVENT_SUPPRESS_USE_F
    _U16.pack_into(out, 17, flags)
    out[4] = type_code
    return out


def _finish(event: bytearray, crc: bool) -> bytes:
    if crc:
        event += _U32.pack(zlib.crc32(event))
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
        event += _U32.pack(name_len) + b"!dummyvar\0"[:name_len] + b"\x01"
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
    if data_len == C.HEADER_LEN + _MARIA_GTID_HEADER_LEN:
        event += bytes(_QUERY_POST_HEADER) + b"\0"
    elif data_len == C.HEADER_LEN + _MARIA_GTID_HEADER_LEN + 2:
        # An empty time_zone status variable takes up the commit id's 2 extra bytes.
        event += bytes(11) + _U16.pack(2) + bytes([_Q_TIME_ZONE_CODE, 0]) + b"\0"
    else:
        return None
    event += b"BEGIN"
    return _finish(event, crc)


# ---------------------------------------------------------------------------------------------
# Relay files and the catalog
# ---------------------------------------------------------------------------------------------

_catalogs: "weakref.WeakKeyDictionary[Any, FileCatalog]" = weakref.WeakKeyDictionary()
_file_gtids: "OrderedDict[tuple, GtidSet]" = OrderedDict()
_file_gtids_lock = threading.Lock()
_FILE_GTIDS_CACHE = 256


def _catalog(store: Any) -> FileCatalog:
    """One FileCatalog per store, shared by every dump, so file headers are read once."""
    catalog = _catalogs.get(store)
    if catalog is None:
        catalog = FileCatalog(store)
        _catalogs[store] = catalog
    return catalog


def _scan_file_gtids(path: str) -> GtidSet:
    """GTIDs of the complete groups inside a closed relay file (cached by path, size and mtime).
    Runs in worker threads: the cache is behind a lock; a scan itself is not."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    with _file_gtids_lock:
        cached = _file_gtids.get(key)
        if cached is not None:
            _file_gtids.move_to_end(key)
            return cached
    result = scan_file(path, verify_checksums=False)
    after = result.gtids_after if isinstance(result.gtids_after, GtidSet) else GtidSet()
    start = result.start_gtids if isinstance(result.start_gtids, GtidSet) else GtidSet()
    gtids = after.subtract(start)
    with _file_gtids_lock:
        _file_gtids[key] = gtids
        while len(_file_gtids) > _FILE_GTIDS_CACHE:
            _file_gtids.popitem(last=False)
    return gtids


class _RelayFile:
    """One relay file open for reading: positional reads, large ones in a worker thread."""

    __slots__ = ("name", "fd")

    def __init__(self, name: str, path: os.PathLike | str):
        self.name = name
        self.fd = os.open(path, os.O_RDONLY)

    async def read(self, pos: int, n: int) -> bytes:
        if n <= _INLINE_READ:
            return os.pread(self.fd, n, pos)
        return await asyncio.get_running_loop().run_in_executor(None, os.pread, self.fd, n, pos)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(slots=True)
class _MariaStart:
    """One domain of a MariaDB replica's requested position, with MariaDB's entry flags."""

    gtid: MariaGtid
    empty_domain: bool = False  # START_ON_EMPTY_DOMAIN: the relay has nothing in this domain (yet)


# ---------------------------------------------------------------------------------------------
# The sender
# ---------------------------------------------------------------------------------------------


class _DumpSender:
    """One dump: decides where to start, then streams; all protocol state of the connection lives here."""

    def __init__(self, ctx: DownstreamContext, conn: ConnectionState, request: DumpRequest, channel: DumpChannel):
        self.ctx = ctx
        self.conn = conn
        self.request = request
        self.channel = channel
        self.flavour = ctx.flavour
        uv = conn.user_vars
        self.mode = request.kind
        if self.mode == "mariadb-gtid" and self.flavour != "mariadb":
            self.mode = "file"  # a MySQL master does not know @slave_connect_state: plain file/position
        self.server_id = ctx.server_id
        # init_checksum_alg(): the replica is checksum-aware iff it set the variable; fake events
        # sent before the first FDE use its value, later ones the FDE's (m_event_checksum_alg).
        self.announced_alg = _checksum_alg(_user_var(uv, "source_binlog_checksum", "master_binlog_checksum"))
        self.event_alg = self.announced_alg
        period_ns = _int(_user_var(uv, "source_heartbeat_period", "master_heartbeat_period"))
        self.heartbeat_period = max(period_ns, 0) / 1e9
        # BINLOG_DUMP_NON_BLOCK, or server_id 0 (mysqlbinlog -R): both servers then stop at the end.
        self.non_block = bool(request.flags & BINLOG_DUMP_NON_BLOCK) or request.server_id == 0
        # 0x02 is USE_HEARTBEAT_EVENT_V2 for MySQL and BINLOG_SEND_ANNOTATE_ROWS_EVENT for MariaDB.
        self.heartbeat_v2 = self.flavour == "mysql" and bool(request.flags & USE_HEARTBEAT_EVENT_V2)
        self.send_annotate = self.flavour == "mariadb" and bool(request.flags & BINLOG_SEND_ANNOTATE_ROWS_EVENT)
        self.capability = _int(_user_var(uv, "mariadb_slave_capability"))
        self.skip_replication = self.flavour == "mariadb" and _truthy(conn.session_vars.get("skip_replication"))
        wants_semi_sync = _truthy(_user_var(uv, "rpl_semi_sync_replica", "rpl_semi_sync_slave"))
        self.semi_sync = wants_semi_sync and bool(getattr(ctx.cfg, "semi_sync", False))
        # The server may have put a DumpProgress on the connection already: keep that object.
        self.progress = conn.dump if isinstance(conn.dump, DumpProgress) else DumpProgress()
        self.progress.mode = self.mode
        self.progress.semi_sync = self.semi_sync
        self.tracker = semi_sync_tracker(ctx) if self.semi_sync else None
        self.parser = B.TransactionBoundaryParser("auto")
        modern = split_version(ctx.server_version) >= (8, 0, 26)
        self.modern_terms = modern
        # Where the stream is: the file being sent and the end of the last event read from it.
        self.file: str | None = None
        self.pos = 0
        # MySQL GTID protocol.
        self.exclude: GtidSet | None = None
        self.clear_created = False  # m_gtid_clear_fd_created_flag
        self.skip_end = 0  # exclude_group_end_pos: end of the last skipped group not yet told
        # MariaDB GTID.
        self.maria_state: dict[int, _MariaStart] = {}
        self.maria_seen = MariaBinlogState()  # until_binlog_state: GTIDs met while skipping
        self.maria_strict = _truthy(_user_var(uv, "slave_gtid_strict_mode"))
        self.maria_ignore_duplicates = _truthy(_user_var(uv, "slave_gtid_ignore_duplicates"))
        self.fake_gtid_list = False
        self.skipping = False
        self.last_sent = time.monotonic()
        self.send_stream = getattr(channel, "send_stream", None)
        self.gone: asyncio.Future | None = None
        self.reader_task: asyncio.Task | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def run(self) -> None:
        conn = self.conn
        conn.dump = self.progress
        self.gone = asyncio.get_running_loop().create_future()
        try:
            try:
                first_file, start_pos = await self._plan()
                if self.tracker is not None:
                    self.tracker.register(conn.conn_id)
                self.reader_task = asyncio.create_task(self._read_replica(), name=f"dump-reader-{conn.conn_id}")
                await self._stream(first_file, start_pos)
            except _DumpFailure as failure:
                await self._send_error(failure)
            except _Finished:
                pass
        except _ReplicaGone:
            log.debug("replica left the dump", conn_id=conn.conn_id, file=self.file, position=self.pos)
        finally:
            if self.tracker is not None:
                self.tracker.forget(conn.conn_id)
            if self.reader_task is not None:
                self.reader_task.cancel()
                await asyncio.wait({self.reader_task})  # (a cancellation of this task still propagates)

    async def _send_error(self, failure: _DumpFailure) -> None:
        message = failure.message
        if failure.with_position:
            last = failure.last_event if failure.last_event is not None else self.pos
            byte = failure.last_byte if failure.last_byte is not None else last
            name = self.file or ""
            message = (
                f"{message}; the first event '{self.request.file}' at {self.request.position}, "
                f"the last event read from '{name}' at {last}, the last byte read from '{name}' at {byte}."
            )
        log.info("dump refused or ended with an error", conn_id=self.conn.conn_id, code=failure.code, error=message)
        try:
            await self.channel.send(encode_error(failure.code, failure.sqlstate, message))  # cut to 511 bytes
        except (ConnectionError, OSError, EOFError):
            pass

    # -- where to start ----------------------------------------------------------------------------
    async def _plan(self) -> tuple[str, int]:
        if self.mode == "mysql-gtid":
            if self.flavour != "mysql":
                # MariaDB has no COM_BINLOG_DUMP_GTID: its dispatcher answers "Unknown command".
                raise _DumpFailure("Unknown command", ER_UNKNOWN_COM_ERROR, sqlstate="08S01")
            try:
                replica = GtidSet.decode(self.request.gtid_set)
            except (BinlogFormatError, ValueError, TypeError):
                raise _DumpFailure("Malformed GTID set encoding.", ER_MALFORMED_GTID_SET_ENCODING) from None
            self.exclude = replica
            if self.request.file:
                # Binlog_sender::check_start_file: a named file wins over the GTID search (and its
                # checks); the replica's GTIDs are still skipped.
                return self._check_file_position(self.request.file, self.request.position)
            return await self._plan_mysql_gtid(replica)
        if self.mode == "mariadb-gtid":
            return await self._plan_mariadb_gtid()
        if self.mode != "file":
            raise _DumpFailure(f"unknown dump request kind {self.request.kind!r}", ER_UNKNOWN_ERROR)
        return self._check_file_position(self.request.file, self.request.position)

    def _durable_names(self) -> list[str]:
        """Relay files a reader may open: up to and including the horizon's file."""
        names = self.ctx.store.files()
        horizon_file = self.ctx.horizon.snapshot().file
        if horizon_file in names:
            return names[: names.index(horizon_file) + 1]
        return names if horizon_file is None else []

    def _durable_size(self, name: str) -> int:
        snap = self.ctx.horizon.snapshot()
        if snap.file == name:
            return snap.position
        try:
            return os.path.getsize(self.ctx.store.path(name))
        except (OSError, KeyError):
            return 0

    def _check_file_position(self, file: str, pos: int) -> tuple[str, int]:
        """check_start_file() (MySQL) / init_binlog_sender + check_start_offset() (MariaDB)."""
        names = self._durable_names()
        name = file or (names[0] if names else "")
        if name not in names:
            raise _DumpFailure(MSG_NO_FILE)
        if self.flavour == "mariadb":
            if pos < 4 or pos > self._durable_size(name):
                raise _DumpFailure(
                    f"{MSG_MARIA_IMPOSSIBLE_POS}; the first event '{file}' at {pos}, the last event read from "
                    f"'{file}' at 4, the last byte read from '{file}' at 4."
                )
            return name, pos
        if pos < 4:
            raise _DumpFailure(MSG_POS_LT_4)
        if pos > self._durable_size(name):
            # The size a reader may use is the durable one: bytes past the horizon do not exist yet.
            raise _DumpFailure(MSG_POS_GT_SIZE)
        return name, pos

    def _start_sets(self) -> list[FileInfo]:
        """Durable files with their starting GTID sets, oldest first. The horizon's file is left out
        while its PREVIOUS_GTIDS / GTID_LIST is not durable yet (right after a rotation): it is
        reached by following the rotation, and must not pass for a file without GTIDs."""
        catalog = _catalog(self.ctx.store)
        try:
            infos = catalog.files()
        except CatalogError as exc:
            raise _DumpFailure(f"{MSG_IO}: {exc}") from None
        if infos and infos[-1].start_gtids is None and infos[-1].name == self.ctx.horizon.snapshot().file:
            newest = infos[-1]
            if not _has_event_after_fde(self.ctx.store.path(newest.name), newest.size):
                catalog.forget(newest.name)  # its header is still being written: read it again next time
                infos = infos[:-1]
        return infos

    async def _plan_mysql_gtid(self, replica: GtidSet) -> tuple[str, int]:
        """Binlog_sender::check_start_file() for COM_BINLOG_DUMP_GTID, in the server's order."""
        infos = await asyncio.to_thread(self._start_sets)  # reads file headers: off the loop
        if not infos:
            raise _DumpFailure(MSG_NO_FILE)
        if all(info.start_gtids is None for info in infos):
            raise _DumpFailure(MSG_GTID_MODE_OFF)  # no PREVIOUS_GTIDS anywhere: a pre-GTID master
        # 1. The replica must not have more of the master's own GTIDs than the master (ER 1885).
        relay_set = self.ctx.horizon.snapshot().gtids
        if not isinstance(relay_set, GtidSet):
            relay_set = GtidSet()
        for uuid in self._master_uuids(relay_set):
            if not _restrict(replica, uuid).is_subset(relay_set):
                raise _DumpFailure(MSG_MORE_GTIDS[self.modern_terms])
        # 2. gtid_purged must be in the replica's set (the 5.6.22 fix, Bug #19012085), checked
        # before looking for a start file: an oldest file with an empty PREVIOUS_GTIDS would
        # otherwise "match" any replica.
        missing = await self._missing_purged(infos, replica)
        if missing:
            raise _DumpFailure(MSG_PURGED[self.modern_terms] % (replica.format(), missing.format()))
        # 3. find_first_log_not_in_gtid_set(): newest to oldest, the first file whose
        # PREVIOUS_GTIDS the replica has.
        chosen = None
        for info in reversed(infos):
            if not isinstance(info.start_gtids, GtidSet):
                raise _DumpFailure(MSG_OLD_BINLOG)
            if info.start_gtids.is_subset(replica):
                chosen = info
                break
        if chosen is None:
            missing = infos[0].start_gtids.subtract(replica)
            raise _DumpFailure(MSG_PURGED[self.modern_terms] % (replica.format(), missing.format()))
        # Skipping at least the file's first transaction: clear "created" so the replica keeps its
        # temporary tables (m_gtid_clear_fd_created_flag).
        first = await asyncio.to_thread(_first_gtid, self.ctx.store.path(chosen.name), chosen.size)
        self.clear_created = first is not None and first in replica
        return chosen.name, 4

    def _master_uuids(self, relay_set: GtidSet) -> list[str]:
        """Whose GTIDs the replica may not have more of than the relay (the MySQL master checks its own
        server UUID). The relay stands for its upstream master, so that is the upstream master's UUID;
        before the relay has talked to it (status unknown), every UUID the relay files hold."""
        status = getattr(self.ctx.session, "status", None)
        uuid = getattr(status, "master_uuid", None)
        if uuid:
            return [str(uuid).strip().lower()]
        return relay_set.sids()

    async def _missing_purged(self, infos: list[FileInfo], replica: GtidSet) -> GtidSet:
        """``catalog.purged() - replica``, computed lazily.

        purged = start(oldest) ∪ ⋃ (start(f_i+1) − start(f_i) − events(f_i)) (see FileCatalog.purged).
        Subtracting the replica's set first, a pair of files needs its older file scanned only when
        the newer file names GTIDs the replica lacks: a caught-up replica costs no scan at all, a
        lagging one scans only the files it is about to be sent.
        """
        oldest = infos[0].start_gtids
        missing = oldest.subtract(replica) if isinstance(oldest, GtidSet) else GtidSet()
        for older, newer in zip(infos, infos[1:]):
            if not isinstance(older.start_gtids, GtidSet) or not isinstance(newer.start_gtids, GtidSet):
                continue
            gap = newer.start_gtids.subtract(older.start_gtids)
            gap.difference_update(replica)
            if not gap:
                continue
            path = os.fspath(self.ctx.store.path(older.name))
            try:
                held = await asyncio.to_thread(_scan_file_gtids, path)
            except OSError as exc:
                raise _DumpFailure(f"{MSG_IO}: {older.name}: {exc.strerror}") from None
            gap.difference_update(held)
            missing.update(gap)
        return missing

    async def _plan_mariadb_gtid(self) -> tuple[str, int]:
        """init_binlog_sender() with @slave_connect_state: check_slave_start_position(), then
        gtid_find_binlog_file(); the dump starts at position 4 of the file found."""
        text = _user_var(self.conn.user_vars, "slave_connect_state")
        try:
            position = MariaGtidPosition.parse(_text(text))
        except (ValueError, TypeError):
            raise _DumpFailure(MSG_MARIA_BAD_STATE, ER_UNKNOWN_ERROR) from None
        state = {g.domain_id: _MariaStart(g) for g in position}
        binlog = self.ctx.horizon.snapshot().gtids
        if not isinstance(binlog, MariaBinlogState):
            binlog = MariaBinlogState()
        for entry in state.values():
            gtid = entry.gtid
            mine = binlog.get(gtid.domain_id, gtid.server_id)
            if mine is not None and mine.seq_no >= gtid.seq_no:
                continue
            latest = binlog.latest(gtid.domain_id)
            if latest is None:
                # Nothing in this domain: probably another master's domain. Checked again if the
                # domain ever shows up in the stream.
                entry.empty_domain = True
                continue
            if self.maria_ignore_duplicates and latest.seq_no < gtid.seq_no:
                continue  # it may have come through another path of a multi-source topology
            raise self._maria_not_in_binlog(gtid, binlog)
        infos = await asyncio.to_thread(self._start_sets)
        for info in reversed(infos):
            glev = info.start_gtids
            if glev is None:
                self.maria_state = state  # a file from before GTIDs: start there, skip as usual
                return info.name, 4
            if not isinstance(glev, MariaBinlogState):
                continue
            entries = glev.gtids()
            if _contains_all_slave_gtid(state, entries):
                # Requesting the last GTID of a domain before this file means "start at this file"
                # for that domain: nothing to skip there.
                for entry_gtid in entries:
                    start = state.get(entry_gtid.domain_id)
                    if start is not None and start.gtid == entry_gtid:
                        del state[entry_gtid.domain_id]
                self.maria_state = state
                return info.name, 4
        raise _DumpFailure(MSG_MARIA_NO_STATE)

    @staticmethod
    def _maria_not_in_binlog(gtid: MariaGtid, binlog: MariaBinlogState) -> _DumpFailure:
        """give_error_start_pos_missing_in_binlog(): the "diverged" variant when the binlog is past it."""
        latest = binlog.latest(gtid.domain_id)
        if latest is not None and latest.seq_no >= gtid.seq_no:
            return _DumpFailure(MSG_MARIA_NOT_IN_BINLOG2 % (gtid,))
        return _DumpFailure(MSG_MARIA_NOT_IN_BINLOG % (gtid,))

    # -- streaming ---------------------------------------------------------------------------------
    async def _stream(self, name: str, pos: int) -> None:
        """Binlog_sender::run(): per file, a fake ROTATE, the FDE, the events; then the next file."""
        first = True
        while True:
            self.file = name
            self.pos = pos
            self.progress.file = name
            self.progress.position = pos
            # The fake rotate goes out before every file, even after the real ROTATE that ended the
            # previous one (MySQL keeps it for mysqlbinlog; the replica records two rotates).
            await self._send_event(
                encoders.artificial_rotate(name, pos, self.server_id, self.event_alg == _CRC32), False
            )
            try:
                rf = _RelayFile(name, self.ctx.store.path(name))
            except (OSError, KeyError) as exc:
                log.warning("cannot open a relay file for a dump", file=name, error=str(exc))
                raise _DumpFailure(MSG_OPEN) from None  # Binlog_read_error::CANNOT_OPEN
            try:
                fde_end = await self._send_format_description(rf, pos, first)
                if pos == 4:
                    pos = fde_end
                self.pos = pos
                await self._send_file(rf, pos)
            finally:
                rf.close()
            name = self._next_file(name)
            pos = 4
            first = False

    def _next_file(self, name: str) -> str:
        self._check_not_purged(name)
        names = self._durable_names()
        try:
            return names[names.index(name) + 1]
        except (ValueError, IndexError):
            raise _DumpFailure(MSG_NEXT_LOG, with_position=True) from None

    async def _send_format_description(self, rf: _RelayFile, start_pos: int, first: bool) -> int:
        """send_format_description_event(): the file's FDE, adjusted as the server adjusts it."""
        limit, _closed = await self._available(rf, 4 + C.HEADER_LEN)
        head = await rf.read(0, 4 + C.HEADER_LEN)
        if len(head) < 4 + C.HEADER_LEN:
            raise _read_failure(MSG_TRUNCATED, 4, len(head))
        if head[:4] != C.BINLOG_MAGIC:
            raise _DumpFailure(MSG_BAD_MAGIC)
        _ts, type_code, _sid, size, _lp, _flags = _header_unpack_from(head, 4)
        if type_code != C.FORMAT_DESCRIPTION_EVENT:
            raise _read_failure(MSG_NO_FDE_MYSQL if self.flavour == "mysql" else MSG_NO_FDE_MARIADB, 4, 4 + size)
        if size < C.HEADER_LEN:
            raise _read_failure(MSG_BOGUS, 4, 4 + C.HEADER_LEN)
        limit, closed = await self._available(rf, 4 + size)
        if 4 + size > limit:
            raise _read_failure(MSG_TRUNCATED, 4, limit)
        raw = await rf.read(4, size)
        try:
            fde = FormatDescription.parse(raw, 0, size)
        except ChecksumError:
            raise _read_failure(MSG_CRC, 4, 4 + size) from None
        except BinlogFormatError:
            raise _read_failure(MSG_BOGUS, 4, 4 + size) from None
        self.event_alg = fde.checksum_alg
        if self.announced_alg == C.CHECKSUM_UNDEF and fde.checksum_alg == _CRC32:
            # Masters never strip CRCs: a replica that did not announce a checksum cannot read these.
            raise _read_failure(MSG_CHECKSUM, 4, 4 + size)
        self.parser.set_format(fde)
        log_pos = created = None
        if self.flavour == "mysql":
            if self.exclude is not None:
                # GTID protocol: only "created" goes, and only when the first transaction is skipped.
                created = 0 if self.clear_created else None
            elif start_pos > 4:
                log_pos = created = 0  # mid-file: the replica must not count the FDE nor drop temp tables
        else:
            if first and start_pos > 4:
                log_pos = created = 0  # clear_initial_log_pos, first file only
            elif self.mode == "mariadb-gtid" and not self._maria_position_reached():
                created = 0  # the replica may hold temporary tables of GTIDs it already has
        try:
            event = encoders.fde_copy(raw, clear_in_use=True, log_pos=log_pos, created=created)
        except (BinlogFormatError, ValueError):
            raise _read_failure(MSG_BOGUS, 4, 4 + size) from None
        await self._send_event(event, False)
        return 4 + size

    def _maria_position_reached(self) -> bool:
        """slave_connection_state::is_pos_reached(): only empty-domain entries are left."""
        return all(entry.empty_domain for entry in self.maria_state.values())

    async def _send_file(self, rf: _RelayFile, pos: int) -> None:
        """send_binlog(): events up to the durable end; at the horizon wait; return at the end of a closed file."""
        while True:
            limit, closed = await self._available(rf, pos + 1)
            if closed:
                self._check_not_purged(rf.name)  # only a closed file can be purged
            if pos < limit:
                pos = await self._send_range(rf, pos, limit, watch_purge=closed)
                continue
            if pos > limit:
                raise _read_failure(MSG_TRUNCATED, pos, limit)
            return  # the end of a closed file: on to the next one

    async def _available(self, rf: _RelayFile, need_end: int) -> tuple[int, bool]:
        """The durable end of ``rf`` once it reaches ``need_end`` or the file is closed.

        At the horizon this is where the sender waits: a heartbeat after skipped groups first, EOF
        for NON_BLOCK, then ``wait_for_advance`` with the heartbeat period as timeout and a
        heartbeat on every timeout (wait_new_events / wait_with_heartbeat)."""
        while True:
            if self.gone is not None and self.gone.done():
                raise _ReplicaGone
            horizon = self.ctx.horizon
            snap = horizon.snapshot()
            limit, closed = self._durable_end(rf, snap)
            if limit >= need_end or closed:
                return limit, closed
            if self.skip_end:
                await self._heartbeat(self.skip_end)
                self.skip_end = 0
            if self.non_block:
                await self._send(eof_payload(self.conn.capabilities))
                raise _Finished
            timeout = self.heartbeat_period if self.heartbeat_period > 0 else _IDLE_RECHECK
            # Everything durable is sent: the replica is caught up until the horizon moves (status' replica lag).
            self.progress.caught_up_at = time.time()
            advanced = await self._wait(horizon, snap.seq, timeout)
            self.progress.caught_up_at = time.time()
            if not advanced and self.heartbeat_period > 0:
                await self._heartbeat(self.pos)

    def _durable_end(self, rf: _RelayFile, snap) -> tuple[int, bool]:
        """(bytes of ``rf`` a reader may send, whether the file is closed)."""
        if snap.file == rf.name:
            return snap.position, False
        if snap.file is None:
            return 4, False
        names = self.ctx.store.files()
        if rf.name in names and snap.file in names and names.index(rf.name) > names.index(snap.file):
            return 4, False  # started, but nothing of it is durable yet
        # Older than the horizon's file: complete and synced (the store syncs a file before it
        # starts the next), so its whole size is durable.
        return rf.size(), True

    async def _wait(self, horizon, seq: int, timeout: float) -> bool:
        """Wait for the horizon to pass ``seq``; False on timeout. A departing replica ends the wait."""
        waiter = asyncio.ensure_future(horizon.wait_for_advance(seq, timeout))
        try:
            await asyncio.wait({waiter, self.gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiter.done():
                waiter.cancel()
                await asyncio.wait({waiter})  # its clean-up unregisters it from the horizon
        if self.gone.done():
            raise _ReplicaGone
        return waiter.result().seq > seq

    def _check_not_purged(self, name: str) -> None:
        """ERR 1236 once ``name`` left the relay's index (retention with ``retention_force``): the open
        descriptor could keep reading a deleted file, but that would hold its disk space for as long
        as a slow replica takes, and the replica cannot continue past it anyway."""
        if name not in self.ctx.store.files():
            raise _DumpFailure(MSG_FILE_PURGED % name, with_position=True)

    async def _send_range(self, rf: _RelayFile, pos: int, limit: int, *, watch_purge: bool = False) -> int:
        """Every event of ``[pos, limit)``; ``limit`` is an event boundary, else the file is damaged.
        ``watch_purge``: the file is closed, so it may be purged meanwhile: checked at every chunk."""
        crc = self.event_alg == _CRC32
        first = True
        while pos < limit:
            if watch_purge and not first:
                self._check_not_purged(rf.name)
            first = False
            want = min(limit - pos, READ_CHUNK)
            try:
                data = await rf.read(pos, want)
            except OSError:
                raise _read_failure(MSG_IO, pos, pos) from None
            n = len(data)
            if n < want:
                raise _read_failure(MSG_TRUNCATED, pos, pos + n)
            view = memoryview(data)
            off = 0
            while off + C.HEADER_LEN <= n:
                _ts, type_code, _sid, size, _lp, flags = _header_unpack_from(data, off)
                end = off + size
                if size < C.HEADER_LEN:
                    raise _read_failure(MSG_BOGUS, pos + off, pos + off + C.HEADER_LEN)
                if end > n:
                    break
                if crc and zlib.crc32(view[off : end - 4]) != _U32.unpack_from(data, end - 4)[0]:
                    raise _read_failure(MSG_CRC, pos + off, pos + end)
                await self._handle(view, off, size, pos + off, type_code, flags, None)
                off = end
            if off:
                pos += off
                continue
            # The event at ``pos`` does not fit the chunk.
            if n < C.HEADER_LEN:
                raise _read_failure(MSG_TRUNCATED, pos, pos + n)
            _ts, type_code, _sid, size, _lp, flags = _header_unpack_from(data, 0)
            if pos + size > limit:
                raise _read_failure(MSG_TRUNCATED, pos, limit)
            if size <= _STREAM_PIECE or self.send_stream is None:
                event = await rf.read(pos, size)
                if len(event) < size:
                    raise _read_failure(MSG_TRUNCATED, pos, pos + len(event))
                if crc and zlib.crc32(memoryview(event)[:-4]) != _U32.unpack_from(event, size - 4)[0]:
                    raise _read_failure(MSG_CRC, pos, pos + size)
                await self._handle(memoryview(event), 0, size, pos, type_code, flags, None)
            else:
                await self._big_event(rf, pos, size, type_code, flags, crc)
            pos += size
        return pos

    async def _big_event(self, rf: _RelayFile, pos: int, size: int, type_code: int, flags: int, crc: bool) -> None:
        """A large event: CRC-checked in a first pass over the file (a corrupt event must not be half
        sent), then streamed from the file (``_stream_event``); only its head is ever held."""
        if crc:
            running = 0
            at = pos
            body_end = pos + size - C.CHECKSUM_LEN
            while at < body_end:
                chunk = await rf.read(at, min(_STREAM_PIECE, body_end - at))
                if not chunk:
                    raise _read_failure(MSG_TRUNCATED, pos, at)
                running = zlib.crc32(chunk, running)
                at += len(chunk)
            stored = await rf.read(body_end, C.CHECKSUM_LEN)
            if len(stored) < C.CHECKSUM_LEN:
                raise _read_failure(MSG_TRUNCATED, pos, body_end + len(stored))
            if running != _U32.unpack(stored)[0]:
                raise _read_failure(MSG_CRC, pos, pos + size)
        head = await rf.read(pos, min(size, _HEAD))
        await self._handle(memoryview(head), 0, size, pos, type_code, flags, rf)

    async def _handle(self, buf: memoryview, off: int, size: int, file_pos: int, type_code: int, flags: int,
                      rf: _RelayFile | None) -> None:
        """One event: skip it, leave it out, rewrite it or send it; then move the replica's position.

        ``buf[off:off + size]`` is the event, or only its head when ``rf`` is given (a large event,
        streamed from the file)."""
        action, replacement, need_ack = self._decide(buf, off, size, file_pos, type_code, flags)
        end_pos = file_pos + size
        if action == _SKIP:
            if self.exclude is not None:
                # MySQL: a heartbeat tells the replica how far the skipped groups went, before the
                # next event sent or before waiting; and at least every heartbeat period while
                # skipping long stretches (send_events).
                if self.heartbeat_period > 0 and time.monotonic() - self.last_sent >= self.heartbeat_period:
                    await self._heartbeat(end_pos)
                    self.skip_end = 0
                else:
                    self.skip_end = end_pos
        else:
            if self.skip_end:
                await self._heartbeat(self.skip_end)
                self.skip_end = 0
            if action == _SEND:
                if rf is None:
                    await self._send_event(buf[off : off + size], need_ack)
                else:
                    await self._stream_event(rf, file_pos, size, need_ack)
            elif action == _REPLACE:
                await self._send_event(replacement, need_ack)
        self.pos = end_pos
        self.progress.position = end_pos
        if self.fake_gtid_list and not self.skipping:
            # MariaDB: once a domain reaches the requested GTID, a fake GTID_LIST (the GTIDs met so
            # far, log_pos = here) lets MASTER_GTID_WAIT() on the replica see the position.
            self.fake_gtid_list = False
            await self._send_event(
                encoders.gtid_list(self.maria_seen, self.server_id, end_pos & 0xFFFFFFFF, self.event_alg == _CRC32,
                                   header_flags=C.LOG_EVENT_ARTIFICIAL_F),
                False,
            )

    def _decide(
        self, buf, off: int, size: int, file_pos: int, type_code: int, flags: int
    ) -> tuple[int, bytes | None, bool]:
        """(action, replacement event, ask for a semi-sync ACK) for one event; groups come from the
        boundary parser, the one parser of the relay."""
        result = self.parser.feed(type_code, flags, buf, off, size)
        kind = result & B.RESULT_MASK
        if kind == B.GROUP_START:
            self.skipping = self._skip_group(buf, off, type_code, file_pos)
        skip = self.skipping and kind != B.EVENT_OUTSIDE
        group_end = kind == B.GROUP_END
        if group_end:
            self.skipping = False
        if skip:
            return _SKIP, None, False
        need_ack = group_end and self.semi_sync
        if self.flavour == "mariadb":
            action, replacement = self._maria_filter(buf, off, size, type_code, flags)
            return action, replacement, need_ack
        return _SEND, None, need_ack

    def _skip_group(self, buf, off: int, type_code: int, file_pos: int) -> bool:
        """Whether the group opening here is one the replica already has."""
        if self.exclude is not None:
            if type_code == C.ANONYMOUS_GTID_LOG_EVENT:
                # Binlog_sender::check_event_type(): never send anonymous groups to auto-position.
                raise _read_failure(MSG_ANONYMOUS % (self.file, file_pos), file_pos, file_pos)
            if type_code in _GTID_TYPES:
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
            binlog = self.ctx.horizon.snapshot().gtids
            if not isinstance(binlog, MariaBinlogState):
                binlog = MariaBinlogState()
            mine = binlog.get(start.domain_id, start.server_id)
            if mine is None or mine.seq_no < start.seq_no:
                raise self._maria_not_in_binlog(start, binlog)
            entry.empty_domain = False
        skip = server_id != start.server_id or seq_no <= start.seq_no
        if server_id == start.server_id and seq_no >= start.seq_no:
            if self.maria_strict and seq_no > start.seq_no:
                raise _DumpFailure(MSG_MARIA_HOLE % (start,))
            self.fake_gtid_list = True
            del self.maria_state[domain]
        return skip

    def _maria_filter(self, buf, off: int, size: int, type_code: int, flags: int) -> tuple[int, bytes | None]:
        """What a MariaDB master does to an event for this replica's capabilities (send_event_to_slave)."""
        cap = self.capability
        crc = self.event_alg == _CRC32
        if type_code == C.MARIA_ANNOTATE_ROWS_EVENT and not self.send_annotate:
            if cap >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES:
                return _OMIT, None  # the replica takes positions from log_pos: holes are fine
            if cap < MARIA_SLAVE_CAPABILITY_ANNOTATE:
                dummy = dummy_event(bytes(buf[off : off + C.HEADER_LEN]), size, crc)
                if dummy is None:
                    raise _read_failure(MSG_MARIA_ANNOTATE_DUMMY, self.pos, self.pos + size)
                return _REPLACE, dummy
            # capability 1 understands the event and ignores it: sent as is
        elif type_code == C.MARIA_GTID_EVENT and cap < MARIA_SLAVE_CAPABILITY_GTID:
            # Gtid_log_event::make_compatible_event(): BEGIN for a transaction; a standalone GTID
            # is left out, or replaced by a same-size dummy for replicas that cannot take holes.
            header = bytes(buf[off : off + C.HEADER_LEN])
            if size - (C.CHECKSUM_LEN if crc else 0) < C.HEADER_LEN + _MARIA_GTID_HEADER_LEN:
                raise _read_failure(MSG_MARIA_GTID_COMPAT, self.pos, self.pos + size)
            flags2 = buf[off + C.HEADER_LEN + 12]
            if flags2 & C.FL_STANDALONE:
                if cap >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES:
                    return _OMIT, None
                dummy = dummy_event(header, size, crc)
                if dummy is None:
                    raise _read_failure(MSG_MARIA_GTID_COMPAT, self.pos, self.pos + size)
                return _REPLACE, dummy
            begin = begin_event(header, size, crc)
            if begin is None:
                raise _read_failure(MSG_MARIA_GTID_COMPAT, self.pos, self.pos + size)
            return _REPLACE, begin
        elif (type_code == C.MARIA_BINLOG_CHECKPOINT_EVENT and cap < MARIA_SLAVE_CAPABILITY_BINLOG_CHECKPOINT) or (
            type_code == C.MARIA_GTID_LIST_EVENT and cap < MARIA_SLAVE_CAPABILITY_GTID
        ):
            if cap >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES:
                return _OMIT, None
            dummy = dummy_event(bytes(buf[off : off + C.HEADER_LEN]), size, crc)
            if dummy is None:
                raise _read_failure(MSG_MARIA_LIST_DUMMY, self.pos, self.pos + size)
            return _REPLACE, dummy
        if self.skip_replication and flags & C.LOG_EVENT_SKIP_REPLICATION_F:
            return _OMIT, None  # SET skip_replication=1: events marked @@skip_replication stay here
        return _SEND, None

    # -- sending -----------------------------------------------------------------------------------
    def _prefix(self, need_ack: bool) -> bytes:
        if self.semi_sync:
            return _PREFIX_SEMI[need_ack]
        return _PREFIX_PLAIN

    async def _send_event(self, event, need_ack: bool) -> None:
        await self._send(self._prefix(need_ack) + event)
        self.progress.events_sent += 1

    async def _stream_event(self, rf: _RelayFile, pos: int, size: int, need_ack: bool) -> None:
        """Send a large event straight from the file, a piece at a time (see ``StreamingChannel``)."""
        prefix = self._prefix(need_ack)
        if self.send_stream is None:
            event = await rf.read(pos, size)  # no streaming channel: hold the event to send it whole
            if len(event) < size:
                raise _read_failure(MSG_TRUNCATED, pos, pos + len(event))
            await self._send_event(event, need_ack)
            return

        async def pieces() -> AsyncIterator[bytes]:
            yield prefix
            at, end = pos, pos + size
            while at < end:
                piece = await rf.read(at, min(_STREAM_PIECE, end - at))
                if not piece:
                    raise _read_failure(MSG_TRUNCATED, pos, at)
                at += len(piece)
                yield piece

        try:
            await self.send_stream(len(prefix) + size, pieces())
        except (ConnectionError, OSError, EOFError) as exc:
            raise _ReplicaGone from exc
        except _DumpFailure as failure:
            # The file changed under a large event after its CRC pass (it was fine a moment ago).
            # Part of the payload is out: an ERR now would be read as the rest of the event, so the
            # dump just stops; the replica times out, reconnects, and then gets the error cleanly.
            log.error("relay file changed while a large event was sent", file=self.file, position=pos,
                      error=failure.message)
            raise _ReplicaGone from failure
        if self.channel.closed:
            raise _ReplicaGone
        self.last_sent = time.monotonic()
        self.progress.events_sent += 1
        self.progress.bytes_sent += len(prefix) + size

    async def _heartbeat(self, pos: int) -> None:
        """HEARTBEAT for the current file: v2 when a MySQL replica asked for it, else v1 (MariaDB's
        v1 carries positions past 4 GB in a sub-header; MySQL's v1 truncates them, as the server does)."""
        name = self.file or ""
        crc = self.event_alg == _CRC32
        if self.flavour == "mariadb":
            event = encoders.heartbeat_v1(name, pos, self.server_id, crc, mariadb=True)
        elif self.heartbeat_v2:
            event = encoders.heartbeat_v2(name, pos, self.server_id, crc)
        else:
            event = encoders.heartbeat_v1(name, pos & 0xFFFFFFFF, self.server_id, crc)
        await self._send(self._prefix(False) + event)

    async def _send(self, payload) -> None:
        try:
            await self.channel.send(payload)
        except (ConnectionError, OSError, EOFError) as exc:
            raise _ReplicaGone from exc
        if self.channel.closed:
            raise _ReplicaGone
        self.last_sent = time.monotonic()
        self.progress.bytes_sent += len(payload)

    # -- the replica's side of the connection ------------------------------------------------------
    async def _read_replica(self) -> None:
        """Read what the replica sends during the dump: semi-sync ACKs, and the end of the connection,
        which wakes a dump waiting at the horizon so it ends at once."""
        try:
            while True:
                packet = await self.channel.receive(None)
                if packet is None:
                    break  # no timeout was asked for: None means the connection is over
                self._on_packet(packet)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError, EOFError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a broken packet from the replica must not leave the dump waiting forever
            log.exception("reading from a dumping replica failed", conn_id=self.conn.conn_id)
        finally:
            if self.gone is not None and not self.gone.done():
                self.gone.set_result(None)

    def _on_packet(self, packet: bytes) -> None:
        """A semi-sync ACK: 0xEF, the end position (u64) of the acknowledged event, the file name."""
        if not self.semi_sync or len(packet) < 10 or packet[0] != SEMI_SYNC_MAGIC:
            log.debug("ignored a packet from a dumping replica", conn_id=self.conn.conn_id, length=len(packet))
            return
        pos = _U64.unpack_from(packet, 1)[0]
        name = bytes(packet[9:]).decode("utf-8", "surrogateescape")
        self.progress.last_ack = (name, pos)
        if self.tracker is not None:
            self.tracker.acked(name, pos, self.conn.conn_id)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _contains_all_slave_gtid(state: dict[int, _MariaStart], entries: list[MariaGtid]) -> bool:
    """MariaDB's contains_all_slave_gtid(): is every requested GTID in this file or a later one?

    ``entries`` is the file's GTID_LIST in order (each domain's most recent GTID last). A domain
    of the list the replica did not ask for means it needs that domain from its very start, in an
    earlier file; asking for a GTID the list has passed means an earlier file too, unless it is
    the domain's last GTID before this file (then this file is where the domain continues)."""
    for i, listed in enumerate(entries):
        start = state.get(listed.domain_id)
        if start is None:
            return False
        gtid = start.gtid
        if gtid.server_id == listed.server_id and gtid.seq_no <= listed.seq_no:
            if gtid.seq_no < listed.seq_no:
                return False
            if i + 1 < len(entries) and entries[i + 1].domain_id == listed.domain_id:
                return False
    return True


def _restrict(gtids: GtidSet, uuid: str) -> GtidSet:
    """The part of ``gtids`` with server UUID ``uuid`` (every tag)."""
    part = GtidSet()
    for sid, tag, start, end in gtids.intervals():
        if sid == uuid:
            part.add_interval(sid, start, end + 1, tag)
    return part


def _walk_head(path, size: int, limit: int = 1 << 20):
    """(type, offset, event size, head bytes) of the events in the first bytes of a relay file (at
    most ``size``, its durable length): the FDE and what follows it, for the start-file decisions."""
    with open(path, "rb") as f:
        head = f.read(min(size, limit))
    pos = 4
    while pos + C.HEADER_LEN <= len(head):
        _ts, type_code, _sid, event_size, _lp, _flags = _header_unpack_from(head, pos)
        if event_size < C.HEADER_LEN:
            return
        yield type_code, pos, event_size, head
        pos += event_size


def _has_event_after_fde(path, size: int) -> bool:
    """Whether a complete event follows the FDE within the durable ``size`` bytes of a file."""
    try:
        for type_code, pos, event_size, _head in _walk_head(path, size):
            if type_code != C.FORMAT_DESCRIPTION_EVENT and pos + event_size <= size:
                return True
    except OSError:
        return False
    return False


def _first_gtid(path, size: int):
    """The first GTID (boundary-parser form) in a MySQL relay file, None when the first group has
    none; read from the file's head (find_first_log_not_in_gtid_set reports it the same way)."""
    parser = B.TransactionBoundaryParser("mysql")
    try:
        for type_code, pos, event_size, head in _walk_head(path, size):
            if pos + event_size > min(size, len(head)):
                return None
            result = parser.feed_event(head, pos) & B.RESULT_MASK
            if type_code in _GTID_TYPES:
                return parser.gtid
            if result != B.EVENT_OUTSIDE:
                return None
    except (OSError, BinlogFormatError, ValueError):
        return None
    return None


def _user_var(user_vars: dict, *names: str):
    for name in names:
        if name in user_vars and user_vars[name] is not None:
            return user_vars[name]
    return None


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _int(value) -> int:
    if value is None:
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    try:
        return int(float(_text(value).strip()))
    except ValueError:
        return 0


def _truthy(value) -> bool:
    if isinstance(value, str) or isinstance(value, (bytes, bytearray)):
        return _text(value).strip().upper() in ("1", "ON", "TRUE", "YES")
    return bool(value)


def _checksum_alg(value) -> int:
    """@master_binlog_checksum as the server maps it (find_type over NONE/CRC32): unset or unknown is
    UNDEF, i.e. a replica that does not handle checksums."""
    if value is None:
        return C.CHECKSUM_UNDEF
    text = _text(value).strip().upper()
    if text == "CRC32":
        return C.CHECKSUM_CRC32
    if text == "NONE":
        return C.CHECKSUM_OFF
    return C.CHECKSUM_UNDEF
