"""The streaming loop of a dump: per file a fake ROTATE and the FDE, then the events up to the horizon, GTID
skipping, heartbeats, semi-sync ACK requests, waiting on the horizon, EOF for NON_BLOCK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ...binlog import boundary as B
from ...binlog import constants as C
from ...binlog import encoders
from ...binlog.checksum import ChecksumError
from ...binlog.checksum import crc32 as _crc32
from ...binlog.events import BinlogFormatError, FormatDescription, split_version
from ...binlog.gtid import GtidSet, MariaGtid
from ...log import PeerLogLimiter, get_logger, report_failure
from ...wire.packets import (
    BINLOG_DUMP_NON_BLOCK,
    BINLOG_SEND_ANNOTATE_ROWS_EVENT,
    MARIA_SLAVE_CAPABILITY_ANNOTATE,
    MARIA_SLAVE_CAPABILITY_BINLOG_CHECKPOINT,
    MARIA_SLAVE_CAPABILITY_GTID,
    MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES,
    USE_HEARTBEAT_EVENT_V2,
)
from ...wire.results import encode_error
from ...wire.semisync import SEMI_SYNC_HEADER, parse_semi_sync_ack
from ..context import DumpProgress
from ..semisync import semi_sync_tracker
from .chunks import Chunk, ChunkCache, chunk_cache, scan_chunk
from .decide import END, REPLACE, SEND, SKIP, EventDecider
from .errors import (
    MSG_BAD_MAGIC,
    MSG_BOGUS,
    MSG_CHECKSUM,
    MSG_CRC,
    MSG_FILE_PURGED,
    MSG_IO,
    MSG_NEXT_LOG,
    MSG_NO_FDE_MARIADB,
    MSG_NO_FDE_MYSQL,
    MSG_OPEN,
    MSG_TRUNCATED,
    DumpFailure,
    DumpFinished,
    read_failure,
    ReplicaGone,
    eof_payload,
)
from .files import CHECKSUM_CRC32, U32, U64, header_unpack_from, RelayFile
from .followers import SENT, STAY, WAKE, Pass, followers_of
from .start import (
    MariaStart,
    StartPlan,
    StartReader,
    StartRequest,
    checksum_alg,
    connect_state,
    durable_names,
    int_variable,
    truthy,
    user_var,
)

if TYPE_CHECKING:
    from ..context import ConnectionState, DownstreamContext, DumpChannel, DumpRequest

log = get_logger("relayproxy.downstream.dump")
_FAILURE_LOG = PeerLogLimiter()  # unexpected failures logged per replica host and minute

# -- reading and sending ---------------------------------------------------------------------------
READ_CHUNK = 1 << 20  # bytes read from a relay file at once
_EVENTS_PER_YIELD = 1024  # events the event-by-event path handles between two turns of the event loop
SHARED_CHUNK = 256 << 10  # bytes of a shared framed chunk (bounds what one replica's socket buffer holds)
_HEAD = 64 << 10  # what the boundary parser may look at of an event that is streamed
_STREAM_PIECE = 4 << 20  # bytes of a large event read (and held) at a time while it is sent
_PREFIX_PLAIN = b"\x00"
_IDLE_RECHECK = 30.0  # without heartbeats, re-read the horizon object this often (the store may be reopened)

# Relay-made fillers (relay/epochs.py is_filler): never sent.
_IGNORABLE = C.IGNORABLE_LOG_EVENT
_IGNORABLE_F = C.LOG_EVENT_IGNORABLE_F


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


@runtime_checkable
class ChunkChannel(Protocol):
    """A DumpChannel that sends shared framed chunks (chunks.py): ``send_packets(chunk, omit)`` writes a chunk's
    packets, without the event types in ``omit``, numbered on from the channel's, in one write. A channel without
    it gets the dump event by event."""

    async def send_packets(self, chunk: Chunk, omit: frozenset[int] = frozenset()) -> None: ...


@runtime_checkable
class ParkingChannel(Protocol):
    """A ChunkChannel that can write without waiting, so its dump may park among the followers at the horizon
    (followers.py): ``can_write_now()`` says whether the replica reads and its socket is below the high-water
    mark; ``write_packets_now`` writes a chunk at once (False: above the mark, the dump's own task drains)."""

    def can_write_now(self) -> bool: ...

    def write_packets_now(self, chunk: Chunk, omit: frozenset[int], shared: Any, owner: Any) -> bool: ...


async def serve_dump(ctx: DownstreamContext, conn: ConnectionState, request: DumpRequest, channel: DumpChannel) -> None:
    """Serve one binlog dump until the replica leaves, an error ends it (sent as ERR), or NON_BLOCK ends it (EOF).

    Returns normally in every case; a replica that disconnects ends the dump quietly. ``conn.dump``
    shows the progress (file, position, counters, last semi-sync ACK) while it runs.
    """
    await DumpSender(ctx, conn, request, channel).run()


def _expire(future: asyncio.Future | None) -> None:
    """End a wait at the horizon without an advance (timer, or the replica left)."""
    if future is not None and not future.done():
        future.set_result(None)


# ---------------------------------------------------------------------------------------------
# The sender
# ---------------------------------------------------------------------------------------------


class DumpSender:
    """One dump: where to start (start.py plans it), then streaming; all protocol state of the connection lives
    here."""

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
        self.announced_alg = checksum_alg(user_var(uv, "source_binlog_checksum", "master_binlog_checksum"))
        self.event_alg = self.announced_alg
        period_ns = int_variable(user_var(uv, "source_heartbeat_period", "master_heartbeat_period"),
                         "master_heartbeat_period")
        self.heartbeat_period = max(period_ns, 0) / 1e9
        # BINLOG_DUMP_NON_BLOCK, or server_id 0 (mysqlbinlog -R): both servers then stop at the end.
        self.non_block = bool(request.flags & BINLOG_DUMP_NON_BLOCK) or request.server_id == 0
        # 0x02 is USE_HEARTBEAT_EVENT_V2 for MySQL and BINLOG_SEND_ANNOTATE_ROWS_EVENT for MariaDB.
        self.heartbeat_v2 = self.flavour == "mysql" and bool(request.flags & USE_HEARTBEAT_EVENT_V2)
        self.send_annotate = self.flavour == "mariadb" and bool(request.flags & BINLOG_SEND_ANNOTATE_ROWS_EVENT)
        self.capability = int_variable(user_var(uv, "mariadb_slave_capability"), "mariadb_slave_capability")
        self.skip_replication = self.flavour == "mariadb" and truthy(conn.session_vars.get("skip_replication"))
        wants_semi_sync = truthy(user_var(uv, "rpl_semi_sync_replica", "rpl_semi_sync_slave"))
        self.semi_sync = wants_semi_sync and ctx.settings.semi_sync
        # The server may have put a DumpProgress on the connection already: keep that object.
        self.progress = conn.dump if isinstance(conn.dump, DumpProgress) else DumpProgress()
        self.progress.mode = self.mode
        self.progress.semi_sync = self.semi_sync
        self.tracker = semi_sync_tracker(ctx) if self.semi_sync else None
        if self.semi_sync:
            channel.semi_sync = True  # its ACK requests restart the packet numbering (and nothing else does)
        self.parser = B.TransactionBoundaryParser("auto")
        modern = split_version(ctx.server_version) >= (8, 0, 26)
        self.modern_terms = modern
        # Where the stream is: the file being sent and the end of the last event read from it.
        self.file: str | None = None
        self.pos = 0
        # What to do with each event for this replica (decide.py): group skipping (MySQL auto-position's
        # ``exclude``, MariaDB's ``maria_state``), capability rewrites, what is owed around events, ACK requests.
        horizon_gtids = lambda: ctx.horizon.snapshot().gtids  # noqa: E731
        self.decider = EventDecider(
            self.parser, flavour=self.flavour, semi_sync=self.semi_sync, capability=self.capability,
            send_annotate=self.send_annotate, skip_replication=self.skip_replication,
            heartbeat_period=self.heartbeat_period, maria_strict=truthy(user_var(uv, "slave_gtid_strict_mode")),
            binlog_gtids=horizon_gtids)
        # MySQL GTID protocol.
        self.clear_created = False  # m_gtid_clear_fd_created_flag
        self.file_epoch = None  # the upstream epoch of the file being sent when its master's names differ
        # A peer relay catching up within the current epoch (@relayproxy_peer = 1, by file/position: the upstream
        # session's peer catch-up): the master's names and bytes, exactly as held, and never past the epoch.
        self.peer = self.mode == "file" and truthy(user_var(uv, "relayproxy_peer"))
        # MariaDB GTID.
        self.maria_ignore_duplicates = truthy(user_var(uv, "slave_gtid_ignore_duplicates"))
        self.last_sent = time.monotonic()
        # What the channel offers beyond ``send`` (the Protocols above; None: it does not).
        self.streaming = channel if isinstance(channel, StreamingChannel) else None
        # Shared framed chunks (chunks.py) for ranges that need nothing done for this replica.
        self.chunked = channel if isinstance(channel, ChunkChannel) else None
        self.chunks: ChunkCache | None = chunk_cache(ctx.store) if self.chunked is not None else None
        # Parking at the horizon (followers.py): the channel must be able to write a chunk without waiting.
        self.parking = channel if self.chunks is not None and isinstance(channel, ParkingChannel) else None
        self.rf: RelayFile | None = None  # the file _send_file is in
        self.followed = False  # the shared pass at an advance sent something while this dump was parked
        self.woken_at = 0.0  # the advance (its monotonic time) that ended the last wait at the horizon, until sent
        self.slow_types: frozenset[int] = frozenset()
        self.omit_types: frozenset[int] = frozenset()
        self.gone: asyncio.Future | None = None
        self.waiter: asyncio.Future | None = None  # what _wait is waiting on: the reader resolves it on leaving
        self.reader_task: asyncio.Task | None = None
        self.in_step = True  # the parser knows where the groups are (False: the dump began at an unknown position)

    # The start the plan (start.py) set: the decider's.
    @property
    def exclude(self) -> GtidSet | None:
        """MySQL GTID protocol: the replica's GTID set (groups in it are skipped)."""
        return self.decider.exclude

    @property
    def maria_state(self) -> dict[int, MariaStart]:
        """MariaDB GTID: per domain, the GTID the replica asked for, until it is reached."""
        return self.decider.maria_state

    def start_request(self) -> StartRequest:
        """What the start plan reads of the request and the connection."""
        request = self.request
        return StartRequest(
            mode=self.mode, kind=request.kind, flavour=self.flavour, file=request.file,
            position=request.position, gtid_set=request.gtid_set,
            connect_state=connect_state(self.conn.user_vars), peer=self.peer,
            maria_ignore_duplicates=self.maria_ignore_duplicates, modern_terms=self.modern_terms)

    def _adopt(self, plan: StartPlan) -> tuple[str, int]:
        """Take the plan's start: what the decider skips (a copy of the MariaDB state: it is consumed as the
        requested GTIDs are reached), and the flag the first FORMAT_DESCRIPTION carries."""
        self.decider.exclude = plan.exclude
        self.decider.maria_state = {e.gtid.domain_id: MariaStart(e.gtid, e.empty_domain) for e in plan.maria_state}
        self.clear_created = plan.clear_created
        return plan.file, plan.position

    @property
    def sending(self) -> str:
        """The file being sent (set before the first event of the dump is read)."""
        assert self.file is not None
        return self.file

    # -- lifecycle ---------------------------------------------------------------------------------
    async def run(self) -> None:
        conn = self.conn
        conn.dump = self.progress
        self.loop = asyncio.get_running_loop()
        self.gone = self.loop.create_future()
        self.ctx.dumps.add(self)
        try:
            try:
                first_file, start_pos = self._adopt(await StartReader(self.ctx).plan(self.start_request()))
                if self.tracker is not None:
                    self.tracker.register(conn.conn_id)
                self.reader_task = asyncio.create_task(self._read_replica(), name=f"dump-reader-{conn.conn_id}")
                await self._stream(first_file, start_pos)
            except DumpFailure as failure:
                await self._send_error(failure)
            except DumpFinished:
                pass
        except ReplicaGone:
            log.debug("replica left the dump", conn_id=conn.conn_id, file=self.file, position=self.pos)
        finally:
            self.ctx.dumps.discard(self)
            if self.tracker is not None:
                self.tracker.forget(conn.conn_id)
            if self.reader_task is not None:
                self.reader_task.cancel()
                await asyncio.wait({self.reader_task})  # (a cancellation of this task still propagates)

    def wake(self) -> None:
        """End a wait at the horizon now (``DownstreamContext.stop_dumps``): the dump then sees the stop."""
        _expire(self.waiter)

    def _at_boundary(self) -> bool:
        """Whether the events sent so far end a transaction, as far as the parser can tell: a dump that began inside
        a group (a file/position replica asking for a position in one) is not in step with the groups until the
        parser has seen one begin (the orphan rest of the first group looks to it like events outside any)."""
        if self.parser.in_group:
            self.in_step = True
            return False
        return self.in_step

    def _stop_here(self) -> None:
        """On a graceful stop, end the dump at a transaction boundary (the caller is at one)."""
        if self.ctx.dumps_stopping:
            log.info("dump ended at a transaction boundary: the relay is stopping", conn_id=self.conn.conn_id,
                     file=self.file, position=self.pos)
            raise DumpFinished

    async def _send_error(self, failure: DumpFailure) -> None:
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

    # -- streaming ---------------------------------------------------------------------------------
    async def _stream(self, name: str, pos: int) -> None:
        """Binlog_sender::run(): per file, a fake ROTATE, the FDE, the events; then the next file."""
        first = True
        while True:
            self.file = self.decider.file = name
            self.pos = pos
            self.progress.file = name
            self.progress.position = pos
            # The fake rotate goes out before every file, even after the real ROTATE that ended the
            # previous one (MySQL keeps it for mysqlbinlog; the replica records two rotates).
            await self._send_event(
                encoders.artificial_rotate(self._peer_name(name) if self.peer else name, pos, self.server_id,
                                           self.event_alg == CHECKSUM_CRC32), False
            )
            self.file_epoch = None if self.peer else self._epoch_of(name)
            self.slow_types = self._slow_types()
            try:
                rf = RelayFile(name, self.ctx.store.path(name))
            except (OSError, KeyError) as exc:
                log.warning("cannot open a relay file for a dump", file=name, error=str(exc))
                raise DumpFailure(MSG_OPEN) from None  # Binlog_read_error::CANNOT_OPEN
            try:
                fde_end = await self._send_format_description(rf, pos, first)
                if pos == 4:
                    pos = fde_end
                elif first and pos > fde_end:
                    self.in_step = False  # asked for a position that may be inside a transaction
                self.pos = pos
                await self._send_file(rf, pos)
            finally:
                rf.close()
            name = self._next_file(name)
            pos = 4
            first = False

    def _epoch_of(self, name: str):
        """The upstream epoch of a relay file when its master's names differ from the relay's (epoch 2 on,
        relay/epochs.py), else None: the master's own ROTATEs in such a file name the master's next file."""
        try:
            epoch = self.ctx.store.epochs.epoch_of(name)
        except ValueError:
            return None
        return epoch if epoch.epoch >= 2 else None

    # -- a peer relay's catch-up (docs/failover.md, "Peer catch-up within an epoch") ---------------------------
    def _peer_name(self, name: str) -> str:
        """The master's name of a relay file (the peer asks and counts in the master's names)."""
        try:
            return self.ctx.store.epochs.upstream_name(name)[1]
        except ValueError:
            return name

    def _peer_epoch_end(self, buf, off: int, size: int) -> None:
        """A ROTATE in a peer catch-up: the relay's own epoch ROTATE (timestamp 0, naming the first file of the
        next epoch) ends the catch-up with an error: the peer follows this epoch's master only, never the next
        master's stream, which it joins by its own switch (its own GTID set, its own ROTATE)."""
        epochs = self.ctx.store.epochs
        if not epochs.epochs:
            return
        crc = self.event_alg == CHECKSUM_CRC32
        target = bytes(buf[off + C.HEADER_LEN + 8 : off + size - (C.CHECKSUM_LEN if crc else 0)]).decode(
            "utf-8", "replace")
        try:
            here = epochs.epoch_of(self.sending)
        except ValueError:
            return
        following = [e for e in epochs.epochs if e.epoch == here.epoch + 1]
        if following and following[0].first_file == target and header_unpack_from(buf, off)[0] == 0:
            master = here.master_dict or {}
            raise DumpFailure(
                f"relayproxy peer catch-up: epoch {here.epoch} (master server_id {master.get('server_id')}) "
                f"ends at {self._peer_name(self.sending)}:{self.pos}; this relay follows epoch {following[0].epoch} "
                "from there (not served to a peer)")

    def _relay_rotate(self, buf, off: int, size: int) -> bytes | None:
        """A master's ROTATE in an epoch >= 2 file, naming the relay's file instead of the master's (else None:
        send it as it is). A replica that reconnects after it asks for that name."""
        crc = self.event_alg == CHECKSUM_CRC32  # the file's FDE: its events carry a CRC32
        body_end = off + size - (C.CHECKSUM_LEN if crc else 0)
        position = U64.unpack_from(buf, off + C.HEADER_LEN)[0]
        target = bytes(buf[off + C.HEADER_LEN + 8 : body_end]).decode("utf-8", "replace")
        try:
            relay = self.ctx.store.epochs.relay_name(target, self.file_epoch)
        except ValueError:
            return None
        if relay == target:
            return None
        ts, _type, server_id, _size, log_pos, flags = header_unpack_from(buf, off)
        return encoders.rotate(relay, position, server_id=server_id, checksum=crc, timestamp=ts, log_pos=log_pos,
                               flags=flags)

    def _next_file(self, name: str) -> str:
        self._check_not_purged(name)
        names = durable_names(self.ctx.store.files(), self.ctx.horizon.snapshot().file)
        try:
            return names[names.index(name) + 1]
        except (ValueError, IndexError):
            raise DumpFailure(MSG_NEXT_LOG, with_position=True) from None

    async def _send_format_description(self, rf: RelayFile, start_pos: int, first: bool) -> int:
        """send_format_description_event(): the file's FDE, adjusted as the server adjusts it."""
        limit, _closed = await self._available(rf, 4 + C.HEADER_LEN)
        head = await self._read(rf, 0, 4 + C.HEADER_LEN)
        if len(head) < 4 + C.HEADER_LEN:
            raise read_failure(MSG_TRUNCATED, 4, len(head))
        if head[:4] != C.BINLOG_MAGIC:
            raise DumpFailure(MSG_BAD_MAGIC)
        _ts, type_code, _sid, size, _lp, _flags = header_unpack_from(head, 4)
        if type_code != C.FORMAT_DESCRIPTION_EVENT:
            raise read_failure(MSG_NO_FDE_MYSQL if self.flavour == "mysql" else MSG_NO_FDE_MARIADB, 4, 4 + size)
        if size < C.HEADER_LEN:
            raise read_failure(MSG_BOGUS, 4, 4 + C.HEADER_LEN)
        limit, closed = await self._available(rf, 4 + size)
        if 4 + size > limit:
            raise read_failure(MSG_TRUNCATED, 4, limit)
        raw = await self._read(rf, 4, size)
        try:
            fde = FormatDescription.parse(raw, 0, size)
        except ChecksumError:
            raise read_failure(MSG_CRC, 4, 4 + size) from None
        except BinlogFormatError:
            raise read_failure(MSG_BOGUS, 4, 4 + size) from None
        self.event_alg = fde.checksum_alg
        if self.announced_alg == C.CHECKSUM_UNDEF and fde.checksum_alg == CHECKSUM_CRC32:
            # Masters never strip CRCs: a replica that did not announce a checksum cannot read these.
            raise read_failure(MSG_CHECKSUM, 4, 4 + size)
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
            raise read_failure(MSG_BOGUS, 4, 4 + size) from None
        await self._send_event(event, False)
        return 4 + size

    def _maria_position_reached(self) -> bool:
        """slave_connection_state::is_pos_reached(): only empty-domain entries are left."""
        return all(entry.empty_domain for entry in self.maria_state.values())

    async def _send_file(self, rf: RelayFile, pos: int) -> None:
        """send_binlog(): events up to the durable end; at the horizon wait; return at the end of a closed file."""
        self.rf = rf
        while True:
            limit, closed = await self._available(rf, pos + 1, follow=True)
            pos = self.pos  # the shared pass at an advance may have sent more while this dump was parked
            if closed:
                self._check_not_purged(rf.name)  # only a closed file can be purged
            if pos < limit:
                pos = await self._send_range(rf, pos, limit, watch_purge=closed)
                if self.woken_at:  # what that advance made durable is written: the hop's send stage
                    if self.ctx.hop is not None:
                        self.ctx.hop.sent(time.monotonic() - self.woken_at)
                    self.woken_at = 0.0
                continue
            if pos > limit:
                raise read_failure(MSG_TRUNCATED, pos, limit)
            return  # the end of a closed file: on to the next one

    async def _available(self, rf: RelayFile, need_end: int, follow: bool = False) -> tuple[int, bool]:
        """The durable end of ``rf`` once it reaches ``need_end`` or the file is closed.

        At the horizon this is where the sender waits: a heartbeat after skipped groups first, EOF
        for NON_BLOCK, then ``wait_for_advance`` with the heartbeat period as timeout and a
        heartbeat on every timeout (wait_new_events / wait_with_heartbeat).

        ``follow``: the caller sends from ``self.pos`` on, and the wait may be spent parked among the
        horizon's followers (followers.py), which may send for this dump meanwhile: ``need_end`` then
        follows ``self.pos``, and the heartbeat is due a period after the last thing sent."""
        while True:
            if self.gone is not None and self.gone.done():
                raise ReplicaGone
            self._stop_here()  # between ranges, which end at the horizon or a file's end: transaction boundaries
            horizon = self.ctx.horizon
            snap = horizon.snapshot()
            limit, closed = self._durable_end(rf, snap)
            if limit >= need_end or closed:
                return limit, closed
            owed = self.decider.take_heartbeat()
            if owed:
                await self._heartbeat(owed)
            if self.non_block:
                await self._send(eof_payload(self.conn.capabilities))
                raise DumpFinished
            timeout = self.heartbeat_period if self.heartbeat_period > 0 else _IDLE_RECHECK
            if self.followed and self.heartbeat_period > 0:
                timeout = max(self.heartbeat_period - (time.monotonic() - self.last_sent), 0.0)
            # Everything durable is sent: the replica is caught up until the horizon moves (status' replica lag).
            self.progress.caught_up_at = time.time()
            parked = follow and self._may_park(rf, snap)
            advanced = await self._wait(horizon, snap.seq, timeout, parked)
            self.progress.caught_up_at = time.time()
            if advanced and not self.followed:
                self.woken_at = horizon.snapshot().at
            if parked:
                need_end = self.pos + 1
            if not advanced and self.heartbeat_period > 0:
                await self._heartbeat(self.pos)

    def _durable_end(self, rf: RelayFile, snap) -> tuple[int, bool]:
        """(bytes of ``rf`` a reader may send, whether the file is closed).

        Under a replay stop for this replica (relay/replay_stops.py: a pitr target) the stop is the end: the dump
        sends up to it and then waits there, as at the horizon, until the stop is cleared or the replica leaves."""
        limit, closed = self._horizon_end(rf, snap)
        stop = self.ctx.replay_stops.get(self.request.server_id)
        if stop is not None:
            cap = stop.caps(rf.name, self.ctx.store.files())
            if cap is not None and cap <= limit:
                return cap, False
        return limit, closed

    def _horizon_end(self, rf: RelayFile, snap) -> tuple[int, bool]:
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

    async def _wait(self, horizon, seq: int, timeout: float, park: bool = False) -> bool:
        """Wait for the horizon to pass ``seq``; False on timeout. A departing replica ends the wait.

        One future, resolved by the horizon's advance, the timer, or the replica's reader (``_wake_waiter``):
        no task and no ``asyncio.wait`` per wake-up, which is what a hundred replicas at the horizon pay on
        every advance. ``park``: wait among the horizon's followers (followers.py), which send what this dump
        can take without its task and resolve the future only for what it cannot; sends made so meanwhile
        count as an advance (no heartbeat is due)."""
        loop = self.loop
        future = loop.create_future()
        followers = followers_of(horizon, self.ctx.hop) if park else None
        self.followed = False
        if followers is not None:
            if not followers.park(self, seq, future):
                return True
        elif horizon.add_waiter(seq, future) is not None:
            return True
        self.waiter = future
        timer = loop.call_later(timeout, _expire, future)
        try:
            snapshot = await future
        finally:
            timer.cancel()
            self.waiter = None
            if followers is not None:
                followers.unpark(self)
            elif not future.done() or future.result() is None:
                horizon.discard_waiter(future)
        if self.gone is not None and self.gone.done():
            raise ReplicaGone
        if self.followed:
            return True
        return snapshot is not None and snapshot.seq > seq

    # -- parked at the horizon: the shared pass at an advance (followers.py) -------------------------
    def _may_park(self, rf: RelayFile, snap) -> bool:
        """Whether this dump may wait among the followers: it is at the durable end of the horizon's file, the
        next events need nothing done for it so far (``_plain``), and its channel can write without waiting."""
        return (self.parking is not None and snap.file == rf.name and self.pos == snap.position
                and self._plain() and self.parking.can_write_now()
                and self.ctx.replay_stops.get(self.request.server_id) is None)  # the shared pass knows no stops

    def _follow(self, snap, shared: Pass) -> int:
        """At an advance while parked: write ``[pos, snap.position)`` now when it needs nothing done for this
        replica (SENT), or nothing is new for it (STAY); else WAKE its task for the ordinary path. What the dumps
        of the pass have in common (the chunk, whether it is plain for dumps of a kind, a framing) is worked out
        once, in ``shared``; ``_sent`` is written out here with the pass's clocks (this runs per replica per
        advance)."""
        rf = self.rf
        chunks = self.chunks
        pos = self.pos
        if rf is None or chunks is None or snap.file != rf.name or (self.gone is not None and self.gone.done()):
            return WAKE
        limit = snap.position
        if limit <= pos:
            return STAY
        want = limit - pos
        if want > SHARED_CHUNK or not self._plain():
            return WAKE
        channel = self.parking
        if channel is None or not channel.can_write_now():
            return WAKE
        parser = self.parser
        crc = self.event_alg == CHECKSUM_CRC32
        key = (rf.name, pos, want, crc, parser.state_key())  # the ordinary path's key (``_chunk``)
        chunk = shared.chunks.get(key)
        if chunk is None:
            chunk = chunks.peek(key)
            if chunk is None:
                data = rf.read_now(pos, want)
                if data is None or len(data) != want:
                    return WAKE  # a read that would block, or a short one: the ordinary path reads and reports
                chunk = scan_chunk(rf.name, pos, data, parser.copy(), crc)
                chunks.put(key, chunk)
            shared.chunks[key] = chunk
        if not (chunk.ok and chunk.end == limit):
            return WAKE
        omit = self.omit_types
        decider = self.decider
        if decider.exclude is None and not decider.maria_state:  # _plain_chunk: the chunk and these only
            kind = (chunk, self.slow_types, self.skip_replication, omit)
            counts = shared.plain.get(kind)
            if counts is None:
                counts = shared.plain[kind] = self._chunk_counts(chunk, omit) if self._plain_chunk(chunk) else ()
        else:
            counts = self._chunk_counts(chunk, omit) if self._plain_chunk(chunk) else ()
        if not counts:
            return WAKE
        writable = channel.write_packets_now(chunk, omit, shared, self)
        # _sent, with the pass's clocks
        assert chunk.parser is not None  # an ok chunk keeps its end state
        parser.adopt(chunk.parser)
        self.pos = end = chunk.end
        progress = self.progress
        progress.position = end
        progress.events_sent += counts[0]
        progress.bytes_sent += counts[1]
        self.last_sent = shared.monotonic
        self.followed = True
        progress.caught_up_at = shared.wall
        return SENT if writable else WAKE  # above the high-water mark: its task drains

    @staticmethod
    def _chunk_counts(chunk: Chunk, omit: frozenset[int]) -> tuple[int, int]:
        """(events, payload bytes) that sending ``chunk`` without the types in ``omit`` counts (``_sent``)."""
        framed, _seq_at, events = chunk.variant(omit)
        return events, len(framed) - 4 * events

    def _check_not_purged(self, name: str) -> None:
        """ERR 1236 once ``name`` left the relay's index (retention with ``retention_force``): the open
        descriptor could keep reading a deleted file, but that would hold its disk space for as long
        as a slow replica takes, and the replica cannot continue past it anyway."""
        if name not in self.ctx.store.files():
            raise DumpFailure(MSG_FILE_PURGED % name, with_position=True)

    async def _send_range(self, rf: RelayFile, pos: int, limit: int, *, watch_purge: bool = False) -> int:
        """Every event of ``[pos, limit)``; ``limit`` is an event boundary, else the file is damaged.
        ``watch_purge``: the file is closed, so it may be purged meanwhile: checked at every chunk."""
        crc = self.event_alg == CHECKSUM_CRC32
        first = True
        while pos < limit:
            if self.ctx.dumps_stopping and self._at_boundary():
                self._stop_here()
            if watch_purge and not first:
                self._check_not_purged(rf.name)
            first = False
            data = None
            if self.chunks is not None and self._plain() and not self.ctx.dumps_stopping:
                # (a stopping dump goes event by event: a shared chunk ends where its size says, not at a boundary)
                want = min(limit - pos, SHARED_CHUNK)
                chunk = await self._chunk(rf, pos, want, crc, limit)
                if chunk is not None:
                    if chunk.ok and chunk.length >= want and chunk.end <= limit and self._plain_chunk(chunk):
                        await self._send_chunk(chunk)
                        pos = chunk.end
                        continue
                    data = chunk.data  # None when the framing holds it all: read again below
            if data is None:
                want = min(limit - pos, READ_CHUNK)
                try:
                    data = await rf.read(pos, want)
                except OSError:
                    raise read_failure(MSG_IO, pos, pos) from None
            n = len(data)
            if n < want:
                raise read_failure(MSG_TRUNCATED, pos, pos + n)
            view = memoryview(data)
            off = handled = 0
            while off + C.HEADER_LEN <= n:
                _ts, type_code, _sid, size, _lp, flags = header_unpack_from(data, off)
                end = off + size
                if size < C.HEADER_LEN:
                    raise read_failure(MSG_BOGUS, pos + off, pos + off + C.HEADER_LEN)
                if end > n:
                    break
                if type_code == _IGNORABLE and flags & _IGNORABLE_F:
                    self._skip_filler(pos + end)
                    off = end
                    continue
                if crc and _crc32(view[off : end - 4]) != U32.unpack_from(data, end - 4)[0]:
                    raise read_failure(MSG_CRC, pos + off, pos + end)
                await self._handle(view, off, size, pos + off, type_code, flags, None)
                off = end
                handled += 1
                if self.ctx.dumps_stopping and self._at_boundary():
                    self._stop_here()
                if not handled % _EVENTS_PER_YIELD:
                    # A read holds up to READ_CHUNK of small events, all skipped or sent without a wait (a GTID
                    # dump skipping to its point, a fast socket): let the loop serve everyone else in between.
                    await asyncio.sleep(0)
            if off:
                pos += off
                continue
            # The event at ``pos`` does not fit the chunk.
            if n < C.HEADER_LEN:
                raise read_failure(MSG_TRUNCATED, pos, pos + n)
            _ts, type_code, _sid, size, _lp, flags = header_unpack_from(data, 0)
            if pos + size > limit:
                raise read_failure(MSG_TRUNCATED, pos, limit)
            if type_code == _IGNORABLE and flags & _IGNORABLE_F:  # a large filler: never read, never sent
                pos += size
                self._skip_filler(pos)
                continue
            if size <= _STREAM_PIECE or self.streaming is None:
                event = await self._read(rf, pos, size)
                if len(event) < size:
                    raise read_failure(MSG_TRUNCATED, pos, pos + len(event))
                if crc and _crc32(memoryview(event)[:-4]) != U32.unpack_from(event, size - 4)[0]:
                    raise read_failure(MSG_CRC, pos, pos + size)
                await self._handle(memoryview(event), 0, size, pos, type_code, flags, None)
            else:
                await self._big_event(rf, pos, size, type_code, flags, crc)
            pos += size
        return pos

    # -- shared chunks: a whole range at once when it needs nothing done for this replica ----------------
    def _slow_types(self) -> frozenset[int]:
        """Event types that this replica cannot be sent as they are in the current file: a range holding one
        goes event by event (``_handle``). Sets ``omit_types`` too: the types left out for it (the decider's
        OMIT by type alone, decide.py), which a shared chunk can leave out as well."""
        slow = {C.FORMAT_DESCRIPTION_EVENT, _IGNORABLE}  # FDEs are adopted; relay-made fillers are never sent
        omit: set[int] = set()
        if self.file_epoch is not None or self.peer:
            slow.add(C.ROTATE_EVENT)  # renamed to the relay's file names; a peer's: the epoch's end is checked
        if self.exclude is not None:
            slow.add(C.ANONYMOUS_GTID_LOG_EVENT)  # refused to an auto-position replica
        if self.flavour == "mariadb":
            cap = self.capability
            holes = cap >= MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES
            if not self.send_annotate and cap != MARIA_SLAVE_CAPABILITY_ANNOTATE:
                (omit if holes else slow).add(C.MARIA_ANNOTATE_ROWS_EVENT)
            if cap < MARIA_SLAVE_CAPABILITY_GTID:
                slow.add(C.MARIA_GTID_EVENT)  # BEGIN for a transaction, left out or a dummy when standalone
                (omit if holes else slow).add(C.MARIA_GTID_LIST_EVENT)
            if cap < MARIA_SLAVE_CAPABILITY_BINLOG_CHECKPOINT:
                (omit if holes else slow).add(C.MARIA_BINLOG_CHECKPOINT_EVENT)
        self.omit_types = frozenset(omit)
        return frozenset(slow)

    def _plain(self) -> bool:
        """Whether the next events can go as they are, unless a range holds something ``_plain_chunk`` refuses:
        no group being skipped, nothing owed first (a heartbeat, a reposition, a GTID list), no ACKs asked
        (``EventDecider.plain``, read here without the call: this runs per range and per parked replica)."""
        d = self.decider
        return not (self.semi_sync or d.skipping or d.skip_end or d.reposition or d.fake_gtid_list)

    def _plain_chunk(self, chunk: Chunk) -> bool:
        if not chunk.types.isdisjoint(self.slow_types):
            return False
        if self.skip_replication and chunk.flags & C.LOG_EVENT_SKIP_REPLICATION_F:
            return False
        d = self.decider
        exclude = d.exclude
        if exclude is not None and chunk.gtid_set is not None and not exclude.isdisjoint(chunk.gtid_set):
            return False  # a group the replica has: it is skipped, event by event
        if d.maria_state and chunk.gtids:
            state = d.maria_state
            if any(gtid is not None and gtid[0] in state for gtid in chunk.gtids):
                return False  # a domain still looking for its start GTID
            seen = d.maria_seen
            for gtid in chunk.gtids:
                if gtid is not None:
                    seen.update(MariaGtid(*gtid))  # met on the way (EventDecider._maria_skip)
        return True

    async def _chunk(self, rf: RelayFile, pos: int, want: int, crc: bool, limit: int) -> Chunk | None:
        """The shared chunk of ``want`` bytes at ``pos``; when the event there is larger (up to ``_STREAM_PIECE``,
        and ending by ``limit``), the chunk of that one event: every replica that catches up through large
        events (a bulk statement, a large row event) then shares its read, CRC check and framing too."""
        parser = self.parser
        key = (rf.name, pos, want, crc, parser.state_key())

        async def make() -> Chunk:
            data = await rf.read(pos, want)
            if len(data) == want >= C.HEADER_LEN:
                size = header_unpack_from(data, 0)[3]
                if want < size <= _STREAM_PIECE and pos + size <= limit:
                    data = await rf.read(pos, size)
            return scan_chunk(rf.name, pos, data, parser.copy(), crc)

        try:
            assert self.chunks is not None  # _chunk is asked only of a dump with a chunk cache
            return await self.chunks.get(key, make)
        except OSError:
            raise read_failure(MSG_IO, pos, pos) from None

    async def _send_chunk(self, chunk: Chunk) -> None:
        omit = self.omit_types
        try:
            assert self.chunked is not None  # chunks are made only for a ChunkChannel
            await self.chunked.send_packets(chunk, omit) if omit else await self.chunked.send_packets(chunk)
        except (ConnectionError, OSError, EOFError) as exc:
            raise ReplicaGone from exc
        if self.channel.closed:
            raise ReplicaGone
        self._sent(chunk, omit)

    def _sent(self, chunk: Chunk, omit: frozenset[int]) -> None:
        """What a chunk gone out moves: the parser, the position, the counters."""
        assert chunk.parser is not None  # a chunk sent was ok: it keeps its end state
        self.parser.adopt(chunk.parser)
        self.pos = chunk.end
        progress = self.progress
        progress.position = chunk.end
        events, nbytes = self._chunk_counts(chunk, omit)
        progress.events_sent += events
        progress.bytes_sent += nbytes
        self.last_sent = time.monotonic()

    async def _read(self, rf: RelayFile, pos: int, n: int) -> bytes:
        """``rf.read`` with a read error (a damaged compressed or encrypted frame, a disk error) turned into the
        servers' 1236 "I/O error reading log event", before anything of the event went out."""
        try:
            return await rf.read(pos, n)
        except OSError as exc:
            log.error("cannot read a relay file for a dump", file=rf.name, position=pos, error=str(exc))
            raise read_failure(MSG_IO, pos, pos) from None

    def _skip_filler(self, end_pos: int) -> None:
        """A relay-made filler (IGNORABLE_LOG_EVENT, flagged ignorable): it stands for transactions of the new
        master's file that the relay got from the earlier master (docs/failover.md), so it is never sent.

        The replica must still learn the position past it: an auto-position replica from a heartbeat before the
        next event, as after skipped groups; a MariaDB replica that tolerates holes from the next event's
        log_pos; any other replica (file/position: it counts bytes) from a fake ROTATE to (this file, here)."""
        if self.peer:
            raise DumpFailure(f"relayproxy peer catch-up: {self._peer_name(self.sending)}:{self.pos} holds a filler "
                               "(transactions this relay got from an earlier master): not served to a peer")
        self.pos = end_pos
        self.progress.position = end_pos
        self.decider.filler(end_pos)

    async def _big_event(self, rf: RelayFile, pos: int, size: int, type_code: int, flags: int, crc: bool) -> None:
        """A large event: CRC-checked in a first pass over the file (a corrupt event must not be half
        sent), then streamed from the file (``_stream_event``); only its head is ever held."""
        if crc:
            running = 0
            at = pos
            body_end = pos + size - C.CHECKSUM_LEN
            while at < body_end:
                chunk = await self._read(rf, at, min(_STREAM_PIECE, body_end - at))
                if not chunk:
                    raise read_failure(MSG_TRUNCATED, pos, at)
                running = _crc32(chunk, running)
                at += len(chunk)
            stored = await self._read(rf, body_end, C.CHECKSUM_LEN)
            if len(stored) < C.CHECKSUM_LEN:
                raise read_failure(MSG_TRUNCATED, pos, body_end + len(stored))
            if running != U32.unpack(stored)[0]:
                raise read_failure(MSG_CRC, pos, pos + size)
        head = await self._read(rf, pos, min(size, _HEAD))
        await self._handle(memoryview(head), 0, size, pos, type_code, flags, rf)

    async def _handle(self, buf: memoryview, off: int, size: int, file_pos: int, type_code: int, flags: int,
                      rf: RelayFile | None) -> None:
        """One event: what the decider (decide.py) says for it, carried out; then the replica's position moves.

        ``buf[off:off + size]`` is the event, or only its head when ``rf`` is given (a large event,
        streamed from the file)."""
        decision = self.decider.decide(buf, off, size, file_pos, type_code, flags, self.event_alg == CHECKSUM_CRC32,
                                       time.monotonic() - self.last_sent)
        action = decision.action
        if action == END:
            assert decision.failure is not None  # an END decision carries its failure
            raise decision.failure
        if type_code == C.ROTATE_EVENT:
            if self.peer:
                self._peer_epoch_end(buf, off, size)
            if self.file_epoch is not None and action == SEND and rf is None:
                renamed = self._relay_rotate(buf, off, size)
                if renamed is not None:
                    decision = decision._replace(action=REPLACE, event=renamed)
                    action = REPLACE
        end_pos = file_pos + size
        if decision.heartbeat:
            await self._heartbeat(decision.heartbeat)
        if action != SKIP:
            if decision.reposition:
                await self._send_event(
                    encoders.artificial_rotate(self.sending, decision.reposition, self.server_id,
                                               self.event_alg == CHECKSUM_CRC32),
                    False)
            if action == SEND:
                if rf is None:
                    await self._send_event(buf[off : off + size], decision.ack)
                else:
                    await self._stream_event(rf, file_pos, size, decision.ack)
            elif action == REPLACE:
                await self._send_event(decision.event, decision.ack)
        self.pos = end_pos
        self.progress.position = end_pos
        if decision.gtid_list:
            await self._send_event(
                encoders.gtid_list(self.decider.maria_seen, self.server_id, end_pos & 0xFFFFFFFF,
                                   self.event_alg == CHECKSUM_CRC32, header_flags=C.LOG_EVENT_ARTIFICIAL_F),
                False,
            )

    # -- sending -----------------------------------------------------------------------------------
    def _prefix(self, need_ack: bool) -> bytes:
        if self.semi_sync:
            return SEMI_SYNC_HEADER[need_ack]
        return _PREFIX_PLAIN

    async def _send_event(self, event, need_ack: bool) -> None:
        await self._send(self._prefix(need_ack) + event)
        self.progress.events_sent += 1

    async def _stream_event(self, rf: RelayFile, pos: int, size: int, need_ack: bool) -> None:
        """Send a large event straight from the file, a piece at a time (see ``StreamingChannel``)."""
        prefix = self._prefix(need_ack)
        if self.streaming is None:
            event = await self._read(rf, pos, size)  # no streaming channel: hold the event to send it whole
            if len(event) < size:
                raise read_failure(MSG_TRUNCATED, pos, pos + len(event))
            await self._send_event(event, need_ack)
            return

        async def pieces() -> AsyncIterator[bytes]:
            yield prefix
            at, end = pos, pos + size
            while at < end:
                piece = await rf.read(at, min(_STREAM_PIECE, end - at))
                if not piece:
                    raise read_failure(MSG_TRUNCATED, pos, at)
                at += len(piece)
                yield piece

        try:
            await self.streaming.send_stream(len(prefix) + size, pieces())
        except (ConnectionError, OSError, EOFError) as exc:
            raise ReplicaGone from exc
        except DumpFailure as failure:
            # The file changed under a large event after its CRC pass (it was fine a moment ago).
            # Part of the payload is out: an ERR now would be read as the rest of the event, so the
            # dump just stops; the replica times out, reconnects, and then gets the error cleanly.
            log.error("relay file changed while a large event was sent", file=self.file, position=pos,
                      error=failure.message)
            raise ReplicaGone from failure
        if self.channel.closed:
            raise ReplicaGone
        self.last_sent = time.monotonic()
        self.progress.events_sent += 1
        self.progress.bytes_sent += len(prefix) + size

    async def _heartbeat(self, pos: int) -> None:
        """HEARTBEAT for the current file: v2 when a MySQL replica asked for it, else v1 (MariaDB's
        v1 carries positions past 4 GB in a sub-header; MySQL's v1 truncates them, as the server does)."""
        name = self.file or ""
        crc = self.event_alg == CHECKSUM_CRC32
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
            raise ReplicaGone from exc
        if self.channel.closed:
            raise ReplicaGone
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
        except Exception as exc:  # a broken packet from the replica must not leave the dump waiting forever
            report_failure(log, _FAILURE_LOG, self.conn.host, "reading from a dumping replica failed", exc,
                           conn_id=self.conn.conn_id)
        finally:
            if self.gone is not None and not self.gone.done():
                self.gone.set_result(None)
            _expire(self.waiter)

    def _on_packet(self, packet: bytes) -> None:
        """A semi-sync ACK: 0xEF, the end position (u64) of the acknowledged event, the file name."""
        ack = parse_semi_sync_ack(packet) if self.semi_sync else None
        if ack is None:
            log.debug("ignored a packet from a dumping replica", conn_id=self.conn.conn_id, length=len(packet))
            return
        name, pos = ack
        self.progress.last_ack = (name, pos)
        if self.tracker is not None:
            self.tracker.acked(name, pos, self.conn.conn_id)
