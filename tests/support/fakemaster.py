"""A scripted fake MySQL 8.0 master that serves real binlog files over the replication protocol.

Two layers, as in the relay itself:

* sans-I/O: ``BinlogIndex`` (the master's binlog files, growable) and ``DumpCursor`` (what MySQL's
  ``Binlog_sender`` sends for one COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID: fake ROTATE, FDE with the
  in-use flag cleared (log_pos/created zeroed when starting mid-file), PREVIOUS_GTIDS, the events,
  GTID skipping with a heartbeat at the end of the skipped groups, file switches);
* asyncio: ``FakeMySQLMaster`` on 127.0.0.1: handshake v10 (mysql_native_password, or the
  caching_sha2_password fast path), the queries a MySQL 8 replica sends (protocol-reference §3.5)
  and @@GLOBAL.GTID_EXECUTED / GTID_PURGED (what a relay repointed to this master checks),
  COM_REGISTER_SLAVE, both dump commands, heartbeats, semi-sync headers and ACKs, and a scripted
  cut of the connection after N bytes of the dump stream. Everything a client sends is logged in
  ``master.connections`` so that tests can assert on it.

The events themselves are never re-encoded: they go out byte for byte as the files hold them. The
events the master makes up (fake ROTATE, FDE copy, heartbeats) are built here with struct + zlib,
independently of ``relayproxy.binlog.encoders``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass, field

from relayproxy.binlog import constants as C
from relayproxy.binlog.events import FormatDescription
from relayproxy.binlog.gtid import GtidSet  # only the type tests hand in; decisions use .mysql_gtids.Gtids
from relayproxy.binlog.views import view_event
from relayproxy.wire import packets as P
from relayproxy.wire.packets import encode_packet, lenenc_bytes, lenenc_int, read_lenenc_bytes, read_lenenc_int

from .mysql_gtids import Gtids

HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
ER_ACCESS_DENIED_ERROR = 1045
ER_PARSE_ERROR = 1064
USE_HEARTBEAT_EVENT_V2 = 0x02
_GTID_TYPES = (C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT)
_GROUP_OPENERS = (C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT)
_FDE_CREATED = C.HEADER_LEN + 2 + 50


# -- events the master makes up ----------------------------------------------------------------------------------


def make_event(type_code: int, body: bytes, *, server_id: int, log_pos: int = 0, flags: int = 0,
               timestamp: int = 0, checksum: bool = True) -> bytes:
    size = C.HEADER_LEN + len(body) + (4 if checksum else 0)
    raw = HEADER.pack(timestamp, type_code, server_id, size, log_pos, flags) + body
    return raw + struct.pack("<I", zlib.crc32(raw)) if checksum else raw


def fake_rotate(name: str, position: int, server_id: int, checksum: bool = True) -> bytes:
    """MySQL ``Binlog_sender::fake_rotate_event``: ts 0, log_pos 0, LOG_EVENT_ARTIFICIAL_F."""
    body = struct.pack("<Q", position) + name.encode()
    return make_event(C.ROTATE_EVENT, body, server_id=server_id, flags=C.LOG_EVENT_ARTIFICIAL_F, checksum=checksum)


def heartbeat(name: str, position: int, server_id: int, *, v2: bool = False, checksum: bool = True) -> bytes:
    if not v2:
        return make_event(C.HEARTBEAT_LOG_EVENT, name.encode(), server_id=server_id, log_pos=position & 0xFFFFFFFF,
                          checksum=checksum)
    raw = name.encode()
    packed = lenenc_int(position)
    body = lenenc_int(1) + lenenc_int(len(raw)) + raw + lenenc_int(2) + lenenc_int(len(packed)) + packed + lenenc_int(0)
    return make_event(C.HEARTBEAT_LOG_EVENT_V2, body, server_id=server_id, log_pos=position & 0xFFFFFFFF,
                      checksum=checksum)


def fde_as_sent(fde: bytes, *, mid_file: bool, clear_created: bool) -> bytes:
    """The FDE as ``Binlog_sender::send_format_description_event`` sends it: LOG_EVENT_BINLOG_IN_USE_F
    cleared; log_pos and created zeroed when the dump starts mid-file; created zeroed in GTID mode
    when the first transaction of the file is skipped; CRC recomputed."""
    ev = bytearray(fde)
    flags = struct.unpack_from("<H", ev, 17)[0] & ~C.LOG_EVENT_BINLOG_IN_USE_F
    struct.pack_into("<H", ev, 17, flags)
    if mid_file:
        struct.pack_into("<I", ev, 13, 0)
    if mid_file or clear_created:
        struct.pack_into("<I", ev, _FDE_CREATED, 0)
    if FormatDescription.parse(bytes(fde), 0, len(fde)).checksum_alg != C.CHECKSUM_UNDEF:
        struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
    return bytes(ev)


def split_events(data: bytes | bytearray, start: int = 4) -> list[tuple[int, bytes]]:
    """(offset, event) of every complete event from ``start`` on."""
    out = []
    off = start
    while off + C.HEADER_LEN <= len(data):
        size = int.from_bytes(data[off + 9 : off + 13], "little")
        if size < C.HEADER_LEN or off + size > len(data):
            break
        out.append((off, bytes(data[off : off + size])))
        off += size
    return out


def clear_in_use(image: bytes) -> bytes:
    """A binlog image as a master sends its FDE: LOG_EVENT_BINLOG_IN_USE_F cleared (the CRC does not cover it)."""
    out = bytearray(image)
    out[4 + 17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    return bytes(out)


def as_gtids(gtids: Gtids | GtidSet | str | None) -> Gtids:
    """The scripted master's own set for what a test hands in: MySQL's text, or a relayproxy ``GtidSet`` read
    through its binary form (the bytes a master would get), never through its arithmetic."""
    if gtids is None:
        return Gtids()
    if isinstance(gtids, Gtids):
        return gtids
    if isinstance(gtids, str):
        return Gtids.parse(gtids)
    return Gtids.decode(gtids.encode())


def next_binlog(prev_image: bytes, gtids: Gtids | GtidSet, *, created: int = 0) -> bytes:
    """The empty active binlog a MySQL master opens after rotating away from ``prev_image``: the same
    FDE (in use, log_pos 4 + size) and a PREVIOUS_GTIDS holding ``gtids`` (header copied from the
    previous file's PREVIOUS_GTIDS)."""
    events = split_events(prev_image)
    (_, fde), (_, prev) = events[0], events[1]
    assert prev[4] == C.PREVIOUS_GTIDS_LOG_EVENT, "the previous file needs a PREVIOUS_GTIDS event"
    fde = bytearray(fde)
    struct.pack_into("<H", fde, 17, struct.unpack_from("<H", fde, 17)[0] | C.LOG_EVENT_BINLOG_IN_USE_F)
    struct.pack_into("<I", fde, _FDE_CREATED, created)
    signed = bytearray(fde[:-4])
    signed[17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    struct.pack_into("<I", fde, len(fde) - 4, zlib.crc32(signed))
    ts, _type, server_id, _size, _pos, flags = HEADER.unpack_from(prev)
    body = as_gtids(gtids).encode()
    end = 4 + len(fde)
    prev_event = make_event(C.PREVIOUS_GTIDS_LOG_EVENT, body, server_id=server_id, timestamp=ts, flags=flags,
                            log_pos=end + C.HEADER_LEN + len(body) + 4)
    return C.BINLOG_MAGIC + bytes(fde) + prev_event


# -- the master's binlogs and what a dump sends ------------------------------------------------------------------


class BinlogFile:
    def __init__(self, name: str, data: bytes):
        if not data.startswith(C.BINLOG_MAGIC):
            raise ValueError(f"{name} is not a binlog file")
        self.name = name
        self.data = bytearray(data)
        self._events: list[tuple[int, bytes]] = []
        self._scanned_to = 4
        self._scan()
        self.fde = self._events[0][1]
        fmt = FormatDescription.parse(self.fde, 0, len(self.fde))
        self.format = fmt
        self.checksum = fmt.checksum_alg == C.CHECKSUM_CRC32
        self.previous_gtids: Gtids | None = None
        if len(self._events) > 1 and self._events[1][1][4] == C.PREVIOUS_GTIDS_LOG_EVENT:
            ev = self._events[1][1]
            self.previous_gtids = Gtids.decode(ev[C.HEADER_LEN:len(ev) - fmt.checksum_len])

    def _scan(self) -> None:
        for off, ev in split_events(self.data, self._scanned_to):
            self._events.append((off, ev))
            self._scanned_to = off + len(ev)

    def append(self, data: bytes) -> None:
        self.data += data
        self._scan()

    @property
    def size(self) -> int:
        return len(self.data)

    def events_from(self, offset: int) -> list[tuple[int, bytes]]:
        return [(off, ev) for off, ev in self._events if off >= offset]

    def first_gtid(self) -> tuple[str, str, int] | None:
        for _, ev in self._events:
            if ev[4] in _GTID_TYPES:
                return gtid_of(ev, self.format)
        return None

    def gtids_after(self) -> Gtids:
        runs = {key: list(value) for key, value in (self.previous_gtids or Gtids()).runs.items()}
        for _, ev in self._events:
            if ev[4] in _GTID_TYPES:
                uuid, tag, gno = gtid_of(ev, self.format)
                runs.setdefault((uuid, tag), []).append((gno, gno))
        return Gtids(runs)


def _uuid(sid: bytes) -> str:
    h = bytes(sid).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def gtid_of(ev: bytes, fmt: FormatDescription) -> tuple[str, str, int]:
    """(uuid, tag, gno) of a GTID event."""
    view = view_event(ev, 0, fmt)
    return _uuid(view.sid), (view.tag or "").lower(), view.gno


class BinlogIndex:
    """The master's binlog files, oldest first; the last one is the active file and may grow."""

    def __init__(self, files: list[tuple[str, bytes]]):
        self.files = [BinlogFile(name, data) for name, data in files]
        self.gtid_purged_extra = Gtids()  # what SET GLOBAL gtid_purged added beyond the files

    def gtid_purged(self) -> Gtids:
        """MySQL's lost_gtids: the oldest file's PREVIOUS_GTIDS, plus what SET GLOBAL gtid_purged added."""
        oldest = self.files[0].previous_gtids
        return (oldest or Gtids()).union(self.gtid_purged_extra)

    def names(self) -> list[str]:
        return [f.name for f in self.files]

    def get(self, name: str) -> tuple[int, BinlogFile] | None:
        for i, f in enumerate(self.files):
            if f.name == name:
                return i, f
        return None

    def executed(self) -> Gtids:
        return self.files[-1].gtids_after()


def _gtid_text(numbers: dict[tuple[str, str], set[int]]) -> str:
    """MySQL's text of a set given as ``(uuid, tag) -> {gno, ...}``: runs of consecutive numbers as ``a-b``."""
    parts: dict[str, list[str]] = {}
    for (uuid, tag), gnos in sorted(numbers.items()):
        if not gnos:
            continue
        runs, ordered = [], sorted(gnos)
        first = prev = ordered[0]
        for n in ordered[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(f"{first}" if first == prev else f"{first}-{prev}")
            if n is not None:
                first = prev = n
        parts.setdefault(uuid, []).append((f"{tag}:" if tag else "") + ":".join(runs))
    return ",".join(f"{uuid}:{':'.join(pieces)}" for uuid, pieces in parts.items())


def missing_gtids(needed: Gtids, have: Gtids) -> str:
    """The text of ``needed`` minus ``have``, with the scripted master's own arithmetic (tests/support/mysql_gtids.py),
    not relayproxy's ``GtidSet.subtract``: its answer stays independent of the code the relay runs."""
    return needed.difference(have).text(",")


def _purged_message(gtids: Gtids, missing: str) -> str:
    return (
        "Cannot replicate because the source purged required binary logs. Replicate the missing transactions "
        "from elsewhere, or provision a new replica from backup. Consider increasing the source's binary log "
        f"expiration period. The GTID set sent by the replica is '{gtids.text(',')}', and the "
        f"missing transactions are '{missing}'"
    )


class DumpError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class SentEvent:
    file: str
    offset: int | None  # offset in the file; None for events the master made up
    event: bytes
    need_ack: bool = False


class DumpCursor:
    """What MySQL's Binlog_sender sends for one dump request, as far as the files go right now."""

    def __init__(self, index: BinlogIndex, *, file: str, pos: int, gtids: Gtids | GtidSet | None, server_id: int,
                 heartbeat_v2: bool = False):
        self.index = index
        self.server_id = server_id
        self.heartbeat_v2 = heartbeat_v2
        gtids = self.gtids = None if gtids is None else as_gtids(gtids)
        self.skipping = False
        self.skipped_end: int | None = None
        self.clear_created = False
        if gtids is not None:
            self.fi, pos = self._gtid_start(gtids), 4
            first = self.index.files[self.fi].first_gtid()
            self.clear_created = first is not None and gtids.contains(first[0], first[2], first[1])
        else:
            if not file:
                self.fi = 0
            else:
                found = index.get(file)
                if found is None:
                    raise DumpError(ER_MASTER_FATAL_ERROR_READING_BINLOG,
                                    "Could not find first log file name in binary log index file")
                self.fi = found[0]
            if pos < 4:
                raise DumpError(ER_MASTER_FATAL_ERROR_READING_BINLOG,
                                "Client requested master to start replication from position < 4.")
            if pos > index.files[self.fi].size:
                raise DumpError(ER_MASTER_FATAL_ERROR_READING_BINLOG,
                                "Client requested master to start replication from position > file size")
        self.start_pos = pos
        self.preamble = True
        self.off = pos
        self.position = (index.files[self.fi].name, pos)  # what a heartbeat says now

    def _gtid_start(self, gtids: Gtids) -> int:
        executed = self.index.executed()
        if not gtids.issubset(executed):
            raise DumpError(
                ER_MASTER_FATAL_ERROR_READING_BINLOG,
                "Slave has more GTIDs than the master has, using the master's SERVER_UUID. This may indicate that "
                "the end of the binary log was truncated or that the last binary log file was lost, e.g., after a "
                "power or disk failure when sync_binlog != 1. The master may or may not have rolled back "
                "transactions that were already replicated to the slave. Suggest to replicate any transactions "
                "that master has rolled back from slave to master, and/or commit empty transactions on master to "
                "account for transactions that have been committed on master but are not included in GTID_EXECUTED.",
            )
        # gtid_purged must be in the replica's set (the 5.6.22 fix, Bug #19012085), before the file search.
        missing = missing_gtids(self.index.gtid_purged(), gtids)
        if missing:
            raise DumpError(ER_MASTER_FATAL_ERROR_READING_BINLOG, _purged_message(gtids, missing))
        # find_first_log_not_in_gtid_set: newest -> oldest, the first whose PREVIOUS_GTIDS is a subset.
        for i in range(len(self.index.files) - 1, -1, -1):
            prev = self.index.files[i].previous_gtids
            if prev is None:
                raise DumpError(
                    ER_MASTER_FATAL_ERROR_READING_BINLOG,
                    "Found old binary log without GTIDs while looking for the oldest binary log that contains any "
                    "GTID that is not in the given gtid set",
                )
            if prev.issubset(gtids):
                return i
        missing = missing_gtids(self.index.files[0].previous_gtids, gtids)
        raise DumpError(ER_MASTER_FATAL_ERROR_READING_BINLOG, _purged_message(gtids, missing))

    def take(self) -> list[SentEvent]:
        """Every event the dump would send now, in order (empty when it has caught up)."""
        out: list[SentEvent] = []
        while True:
            f = self.index.files[self.fi]
            if self.preamble:
                self.preamble = False
                out.append(SentEvent(f.name, None, fake_rotate(f.name, self.start_pos, self.server_id, f.checksum)))
                mid = self.start_pos > 4
                out.append(SentEvent(f.name, None if mid else 4,
                                     fde_as_sent(f.fde, mid_file=mid, clear_created=self.clear_created)))
                self.off = self.start_pos if mid else 4 + len(f.fde)
                self.position = (f.name, self.off)
                self.skipping = False
            events = f.events_from(self.off)
            for i, (off, ev) in enumerate(events):
                type_code = ev[4]
                end = off + len(ev)
                self.off = end
                if self.gtids is not None:
                    if type_code in _GTID_TYPES:
                        uuid, tag, gno = gtid_of(ev, f.format)
                        self.skipping = self.gtids.contains(uuid, gno, tag)
                    elif type_code == C.ANONYMOUS_GTID_LOG_EVENT:
                        raise DumpError(
                            ER_MASTER_FATAL_ERROR_READING_BINLOG,
                            f"Cannot replicate anonymous transaction when AUTO_POSITION = 1, at file {f.name}, "
                            f"position {off}.",
                        )
                    if self.skipping and type_code not in (C.ROTATE_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT):
                        self.skipped_end = end
                        self.position = (f.name, end)
                        continue
                if self.skipped_end is not None:
                    out.append(SentEvent(f.name, None, self._heartbeat(f.name, self.skipped_end)))
                    self.skipped_end = None
                following = events[i + 1][1][4] if i + 1 < len(events) else None
                ends_group = (
                    type_code not in (*_GROUP_OPENERS, C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT,
                                      C.ROTATE_EVENT, C.STOP_EVENT)
                    and (following is None or following in (*_GROUP_OPENERS, C.ROTATE_EVENT, C.STOP_EVENT))
                )
                out.append(SentEvent(f.name, off, ev, need_ack=ends_group))
                self.position = (f.name, end)
            if self.fi + 1 < len(self.index.files) and self.off >= f.size:
                # A closed file is done: MySQL sends a fake ROTATE for the next one (after the real one).
                self.fi += 1
                self.start_pos = 4
                self.preamble = True
                self.clear_created = False
                continue
            if self.skipped_end is not None:
                out.append(SentEvent(f.name, None, self._heartbeat(f.name, self.skipped_end)))
                self.skipped_end = None
            return out

    def _heartbeat(self, name: str, position: int) -> bytes:
        checksum = self.index.files[self.fi].checksum
        return heartbeat(name, position, self.server_id, v2=self.heartbeat_v2, checksum=checksum)

    def idle_heartbeat(self) -> bytes:
        return self._heartbeat(*self.position)


# -- the server --------------------------------------------------------------------------------------------------


@dataclass
class DumpRequest:
    command: str  # "COM_BINLOG_DUMP" or "COM_BINLOG_DUMP_GTID"
    file: str
    pos: int
    flags: int
    server_id: int
    gtids: GtidSet | None = None
    gtid_data: bytes = b""


@dataclass
class ConnectionLog:
    id: int
    user: str | None = None
    auth_plugin: str | None = None
    auth_response: bytes = b""
    connect_attrs: dict[str, str] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    register: dict | None = None
    dump: DumpRequest | None = None
    user_vars: dict[str, object] = field(default_factory=dict)
    sent: list[SentEvent] = field(default_factory=list)  # events whose packet was sent whole
    dump_bytes: int = 0
    cut_at: int | None = None
    acks: list[tuple[str, int]] = field(default_factory=list)
    error: str | None = None


class _Cut(Exception):
    pass


_SET_ASSIGNMENT = re.compile(r"@(\w+)\s*=\s*('(?:[^']*)'|@@global\.\w+|[-\w.]+)", re.IGNORECASE)


class FakeMySQLMaster:
    """Serves ``files`` (``[(name, bytes)]``, oldest first) as a MySQL 8.0 master on 127.0.0.1."""

    def __init__(self, files: list[tuple[str, bytes]], *, server_id: int = 1, server_uuid: str | None = None,
                 version: str | None = None, user: str = "repl", password: str = "replpw",
                 auth_plugin: str = "mysql_native_password", semi_sync: bool = False, port: int = 0):
        self.index = BinlogIndex(files)
        self.server_id = server_id
        uuids = self.index.executed().uuids()
        self.server_uuid = server_uuid or (uuids[0] if uuids else "3e11fa47-71ca-11e1-9e33-c80aa9429562")
        self.version = version or self.index.files[0].format.server_version
        self.user = user
        self.password = password.encode()
        self.auth_plugin = auth_plugin
        self.semi_sync = semi_sync
        self.cuts: list[int | None] = []  # dump-stream bytes after which the next dumps are cut (None: no cut)
        self.silent_connections = 0  # the next N connections get no answer to any command after the handshake
        self.connections: list[ConnectionLog] = []
        self._server: asyncio.AbstractServer | None = None
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.port = port  # 0: any free port; a given one lets another server answer at a dead master's address

    # -- control ---------------------------------------------------------------------------------------------------
    async def start(self) -> FakeMySQLMaster:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> FakeMySQLMaster:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def append(self, data: bytes) -> None:
        """New events in the active (last) file: running dumps send them."""
        self.index.files[-1].append(data)
        self._changed.set()

    def add_file(self, name: str, data: bytes) -> None:
        self.index.files.append(BinlogFile(name, data))
        self._changed.set()

    def purge_to(self, name: str) -> list[str]:
        """PURGE BINARY LOGS TO 'name': drop the files before it (the oldest file's PREVIOUS_GTIDS becomes the
        new gtid_purged, as on MySQL); returns the names dropped."""
        found = self.index.get(name)
        if found is None:
            raise ValueError(f"{name} is not one of the master's binlog files {self.index.names()}")
        dropped = self.index.names()[: found[0]]
        del self.index.files[: found[0]]
        return dropped

    def set_gtid_purged(self, gtids: Gtids | GtidSet | str) -> None:
        """SET GLOBAL gtid_purged = '+gtids': MySQL counts them as purged whatever the files say."""
        self.index.gtid_purged_extra = self.index.gtid_purged_extra.union(as_gtids(gtids))

    @property
    def dumps(self) -> list[DumpRequest]:
        return [c.dump for c in self.connections if c.dump is not None]

    # -- one connection --------------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        log = ConnectionLog(len(self.connections) + 1)
        self.connections.append(log)
        try:
            await self._session(reader, writer, log)
        except (asyncio.IncompleteReadError, ConnectionError, _Cut):
            pass
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # visible to the test through the log
            log.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> tuple[int, bytes]:
        header = await reader.readexactly(4)
        return header[3], await reader.readexactly(int.from_bytes(header[:3], "little"))

    async def _session(self, reader, writer, log: ConnectionLog) -> None:
        scramble = bytes(65 + b % 26 for b in os.urandom(20))
        caps = (P.CLIENT_LONG_PASSWORD | P.CLIENT_FOUND_ROWS | P.CLIENT_LONG_FLAG | P.CLIENT_CONNECT_WITH_DB
                | P.CLIENT_PROTOCOL_41 | P.CLIENT_TRANSACTIONS | P.CLIENT_SECURE_CONNECTION
                | P.CLIENT_MULTI_STATEMENTS | P.CLIENT_MULTI_RESULTS | P.CLIENT_PS_MULTI_RESULTS
                | P.CLIENT_PLUGIN_AUTH | P.CLIENT_CONNECT_ATTRS | P.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
                | P.CLIENT_SESSION_TRACK | P.CLIENT_DEPRECATE_EOF)
        greeting = (
            b"\x0a" + self.version.encode() + b"\0" + struct.pack("<I", log.id) + scramble[:8] + b"\0"
            + struct.pack("<HBHHB", caps & 0xFFFF, 255, 2, caps >> 16, 21) + b"\0" * 10
            + scramble[8:] + b"\0" + self.auth_plugin.encode() + b"\0"
        )
        writer.write(encode_packet(greeting, 0))
        seq, response = await self._read(reader)
        client_caps = self._parse_response(response, log)
        auth = log.auth_response
        ok = b"\x00\x00\x00\x02\x00\x00\x00"
        if log.user != self.user or not self._check_password(auth, scramble):
            writer.write(encode_packet(
                b"\xff" + struct.pack("<H", ER_ACCESS_DENIED_ERROR) + b"#28000"
                + f"Access denied for user '{log.user}'@'localhost' (using password: YES)".encode(), seq + 1))
            await writer.drain()
            return
        if self.auth_plugin == "caching_sha2_password":
            writer.write(encode_packet(b"\x01\x03", seq + 1) + encode_packet(ok, seq + 2))  # fast_auth_success
        else:
            writer.write(encode_packet(ok, seq + 1))
        self.deprecate_eof = bool(client_caps & P.CLIENT_DEPRECATE_EOF)
        silent = self.silent_connections > 0
        if silent:  # a server that froze after the handshake: it reads, answers nothing, keeps the connection
            self.silent_connections -= 1
        while True:
            seq, command = await self._read(reader)
            if not command:
                continue
            if silent:
                log.commands.append("unanswered")
                continue
            code = command[0]
            if code == P.COM_QUIT:
                log.commands.append("COM_QUIT")
                return
            if code == P.COM_QUERY:
                sql = command[1:].decode()
                log.queries.append(sql)
                log.commands.append("COM_QUERY")
                writer.write(self._query_reply(sql, log, client_caps))
            elif code == P.COM_REGISTER_SLAVE:
                log.commands.append("COM_REGISTER_SLAVE")
                log.register = self._parse_register(command)
                writer.write(encode_packet(ok, 1))
            elif code == P.COM_PING:
                log.commands.append("COM_PING")
                writer.write(encode_packet(ok, 1))
            elif code in (P.COM_BINLOG_DUMP, P.COM_BINLOG_DUMP_GTID):
                log.dump = self._parse_dump(command)
                log.commands.append(log.dump.command)
                await self._dump(reader, writer, log)
                return
            else:
                log.commands.append(f"0x{code:02x}")
                writer.write(encode_packet(b"\xff" + struct.pack("<H", 1047) + b"#08S01Unknown command", 1))
            await writer.drain()

    def _parse_response(self, response: bytes, log: ConnectionLog) -> int:
        caps = struct.unpack_from("<I", response, 0)[0]
        pos = 32
        end = response.index(b"\0", pos)
        log.user = response[pos:end].decode()
        pos = end + 1
        if caps & P.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA:
            auth, pos = read_lenenc_bytes(response, pos)
        else:
            n = response[pos]
            auth, pos = response[pos + 1 : pos + 1 + n], pos + 1 + n
        log.auth_response = bytes(auth)
        if caps & P.CLIENT_CONNECT_WITH_DB:
            end = response.index(b"\0", pos)
            pos = end + 1
        if caps & P.CLIENT_PLUGIN_AUTH:
            end = response.index(b"\0", pos)
            log.auth_plugin = response[pos:end].decode()
            pos = end + 1
        if caps & P.CLIENT_CONNECT_ATTRS:
            total, pos = read_lenenc_int(response, pos)
            stop = pos + total
            while pos < stop:
                key, pos = read_lenenc_bytes(response, pos)
                value, pos = read_lenenc_bytes(response, pos)
                log.connect_attrs[key.decode()] = value.decode()
        return caps

    def _check_password(self, auth: bytes, scramble: bytes) -> bool:
        pw = self.password
        if self.auth_plugin == "caching_sha2_password":
            if not pw:
                return auth == b""
            cached = hashlib.sha256(hashlib.sha256(pw).digest()).digest()
            key = hashlib.sha256(cached + scramble).digest()
            return len(auth) == 32 and hashlib.sha256(bytes(a ^ b for a, b in zip(auth, key))).digest() == cached
        if not pw:
            return auth == b""
        stored = hashlib.sha1(hashlib.sha1(pw).digest()).digest()
        key = hashlib.sha1(scramble + stored).digest()
        return len(auth) == 20 and hashlib.sha1(bytes(a ^ b for a, b in zip(auth, key))).digest() == stored

    @staticmethod
    def _parse_register(command: bytes) -> dict:
        server_id = struct.unpack_from("<I", command, 1)[0]
        pos = 5
        values = []
        for _ in range(3):
            n = command[pos]
            values.append(command[pos + 1 : pos + 1 + n].decode())
            pos += 1 + n
        port = struct.unpack_from("<H", command, pos)[0]
        return {"server_id": server_id, "host": values[0], "user": values[1], "password": values[2], "port": port}

    @staticmethod
    def _parse_dump(command: bytes) -> DumpRequest:
        if command[0] == P.COM_BINLOG_DUMP:
            pos, flags, server_id = struct.unpack_from("<IHI", command, 1)
            return DumpRequest("COM_BINLOG_DUMP", command[11:].decode(), pos, flags, server_id)
        flags, server_id, name_len = struct.unpack_from("<HII", command, 1)
        name = command[11 : 11 + name_len].decode()
        at = 11 + name_len
        pos, data_len = struct.unpack_from("<QI", command, at)
        data = bytes(command[at + 12 : at + 12 + data_len])
        return DumpRequest("COM_BINLOG_DUMP_GTID", name, pos, flags, server_id, GtidSet.decode(data, 0, len(data)),
                           data)

    # -- queries ---------------------------------------------------------------------------------------------------
    def _query_reply(self, sql: str, log: ConnectionLog, caps: int) -> bytes:
        text = sql.strip().rstrip(";")
        upper = text.upper()
        if upper.startswith("SET "):
            for name, value in _SET_ASSIGNMENT.findall(text):
                if value.startswith("'"):
                    log.user_vars[name.lower()] = value[1:-1]
                elif value.lower() == "@@global.binlog_checksum":
                    log.user_vars[name.lower()] = "CRC32" if self.index.files[-1].checksum else "NONE"
                else:
                    log.user_vars[name.lower()] = value
            return encode_packet(b"\x00\x00\x00\x02\x00\x00\x00", 1)
        if upper == "SELECT UNIX_TIMESTAMP()":
            return self._result(["UNIX_TIMESTAMP()"], [[str(int(time.time()))]], caps)
        if upper == "SELECT @@GLOBAL.SERVER_ID":
            return self._result(["@@GLOBAL.SERVER_ID"], [[str(self.server_id)]], caps)
        if upper == "SELECT @@GLOBAL.SERVER_UUID":
            return self._result(["@@GLOBAL.SERVER_UUID"], [[self.server_uuid]], caps)
        if upper in ("SELECT @@GLOBAL.GTID_EXECUTED", "SELECT @@GLOBAL.GTID_PURGED"):
            # MySQL's gtid_executed holds what SET GLOBAL gtid_purged added, too; both as MySQL prints them.
            value = (self.index.executed().union(self.index.gtid_purged_extra) if upper.endswith("EXECUTED")
                     else self.index.gtid_purged())
            return self._result([text.split(" ", 1)[1]], [[value.text(",\n")]], caps)
        if upper == "SELECT @@GLOBAL.GTID_MODE":
            return self._result(["@@GLOBAL.GTID_MODE"], [["ON"]], caps)
        if upper == "SELECT @@GLOBAL.RPL_SEMI_SYNC_SOURCE_ENABLED" and self.semi_sync:
            return self._result(["@@global.rpl_semi_sync_source_enabled"], [["1"]], caps)
        if upper.startswith("SELECT @@GLOBAL.RPL_SEMI_SYNC_"):
            name = text.split(".", 1)[1]
            return self._error(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")
        names = re.fullmatch(r"SELECT @@GLOBAL\.\w+(?:\s*,\s*@@GLOBAL\.\w+)*", text, re.IGNORECASE) and [
            n.lower() for n in re.findall(r"@@GLOBAL\.(\w+)", text, re.IGNORECASE)]
        if names:  # the relay's variables query (relay/master_variables.py): what a MySQL 8.0 master has
            known = self._global_variables()
            for name in names:
                if name not in known:
                    return self._error(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")
            return self._result([f"@@GLOBAL.{n}" for n in names], [[known[n] for n in names]], caps)
        match = re.fullmatch(r"SELECT @(\w+)", text, re.IGNORECASE)
        if match:
            return self._result([f"@{match.group(1)}"], [[log.user_vars.get(match.group(1).lower())]], caps)
        match = re.fullmatch(r"SHOW (?:GLOBAL )?VARIABLES LIKE '(\w+)'", text, re.IGNORECASE)
        if match:  # what python-mysql-replication asks before it dumps
            known = {"binlog_checksum": "CRC32" if self.index.files[-1].checksum else "NONE",
                     "binlog_row_metadata": "MINIMAL"}
            name = match.group(1).lower()
            rows = [[name, known[name]]] if name in known else []
            return self._result(["Variable_name", "Value"], rows, caps)
        if upper in ("SHOW BINARY LOGS", "SHOW MASTER LOGS"):
            rows = [[f.name, str(f.size), "No"] for f in self.index.files]
            return self._result(["Log_name", "File_size", "Encrypted"], rows, caps)
        match = re.fullmatch(r"SHOW BINLOG EVENTS IN '([^']*)'(?: FROM (\d+))?(?: LIMIT (\d+))?", text, re.IGNORECASE)
        if match:  # what a relay repointed by MASTER_LOG_FILE/MASTER_LOG_POS reads to translate them into GTIDs
            return self._binlog_events(match.group(1), int(match.group(2) or 4), match.group(3), caps)
        if upper in ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"):
            last = self.index.files[-1]
            return self._result(["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB", "Executed_Gtid_Set"],
                                [[last.name, str(last.size), "", "", self.index.executed().text(",\n")]], caps)
        return self._error(ER_PARSE_ERROR, "42000", f"You have an error in your SQL syntax near '{text[:40]}'")

    def _binlog_events(self, name: str, pos: int, limit: str | None, caps: int) -> bytes:
        """SHOW BINLOG EVENTS IN name FROM pos LIMIT n, with MySQL 8.0's columns, names, Info for the GTID events
        and its errors (ER_ERROR_WHEN_EXECUTING_COMMAND for a file it does not have or a position inside an event)."""
        found = self.index.get(name)
        if found is None:
            return self._error(1220, "HY000", "Error when executing command SHOW BINLOG EVENTS: Could not find target "
                               "log")
        binlog = found[1]
        if pos > binlog.size:
            return self._error(1220, "HY000", "Error when executing command SHOW BINLOG EVENTS: Invalid pos "
                               f"specified. Requested from pos:{pos} is greater than actual file size:{binlog.size}")
        events = binlog.events_from(pos)
        if pos < binlog.size and (not events or events[0][0] != pos):
            return self._error(1220, "HY000", "Error when executing command SHOW BINLOG EVENTS: Wrong offset or I/O "
                               "error")
        names = {C.FORMAT_DESCRIPTION_EVENT: "Format_desc", C.PREVIOUS_GTIDS_LOG_EVENT: "Previous_gtids",
                 C.GTID_LOG_EVENT: "Gtid", C.QUERY_EVENT: "Query", C.XID_EVENT: "Xid", C.ROTATE_EVENT: "Rotate"}
        rows = []
        for off, ev in events[: int(limit) if limit is not None else None]:
            type_code, server_id, size = ev[4], int.from_bytes(ev[5:9], "little"), len(ev)
            info = ""
            if type_code in _GTID_TYPES:
                uuid, _tag, gno = gtid_of(ev, binlog.format)
                info = f"SET @@SESSION.GTID_NEXT= '{uuid}:{gno}'"
            elif type_code == C.PREVIOUS_GTIDS_LOG_EVENT:
                info = (binlog.previous_gtids or Gtids()).text(",\n")
            rows.append([name, str(off), names.get(type_code, f"Unknown({type_code})"), str(server_id),
                         str(off + size), info])
        return self._result(["Log_name", "Pos", "Event_type", "Server_id", "End_log_pos", "Info"], rows, caps)

    def _global_variables(self) -> dict[str, str | None]:
        """The master's replication-relevant variables (MySQL has no gtid_domain_id, gtid_strict_mode,
        binlog_gtid_index: those answer 1193)."""
        return {"binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "MINIMAL",
                "binlog_row_value_options": "", "binlog_checksum": "CRC32" if self.index.files[-1].checksum else "NONE",
                "gtid_mode": "ON", "enforce_gtid_consistency": "ON", "log_bin": "1", "max_allowed_packet": "67108864",
                "version": self.version, "version_comment": "MySQL Community Server - GPL",
                "character_set_server": "utf8mb4", "collation_server": "utf8mb4_0900_ai_ci", "time_zone": "SYSTEM",
                "system_time_zone": "UTC", "lower_case_table_names": "0"}

    @staticmethod
    def _error(code: int, sqlstate: str, message: str, seq: int = 1) -> bytes:
        return encode_packet(b"\xff" + struct.pack("<H", code) + b"#" + sqlstate.encode() + message.encode(), seq)

    @staticmethod
    def _result(columns: list[str], rows: list[list[str | None]], caps: int) -> bytes:
        deprecate_eof = bool(caps & P.CLIENT_DEPRECATE_EOF)
        packets = [lenenc_int(len(columns))]
        for name in columns:
            packets.append(
                lenenc_bytes(b"def") + lenenc_bytes(b"") + lenenc_bytes(b"") + lenenc_bytes(b"")
                + lenenc_bytes(name.encode()) + lenenc_bytes(name.encode())
                + b"\x0c" + struct.pack("<HIBHB", 255, 1024, 0xFD, 0, 31) + b"\0\0"
            )
        if not deprecate_eof:
            packets.append(b"\xfe\x00\x00\x02\x00")
        for row in rows:
            packets.append(b"".join(b"\xfb" if v is None else lenenc_bytes(str(v).encode()) for v in row))
        packets.append(b"\xfe\x00\x00\x02\x00\x00\x00" if deprecate_eof else b"\xfe\x00\x00\x02\x00")
        return b"".join(encode_packet(p, i + 1) for i, p in enumerate(packets))

    # -- the dump --------------------------------------------------------------------------------------------------
    async def _dump(self, reader, writer, log: ConnectionLog) -> None:
        req = log.dump
        cut = self.cuts.pop(0) if self.cuts else None
        seq = 1
        semi = self.semi_sync and str(log.user_vars.get("rpl_semi_sync_replica",
                                                        log.user_vars.get("rpl_semi_sync_slave", "0"))) == "1"

        async def send(payload: bytes) -> None:
            nonlocal seq
            data = encode_packet(payload, seq)
            seq = (seq + 1) & 0xFF
            if cut is not None and log.dump_bytes + len(data) > cut:
                writer.write(data[: cut - log.dump_bytes])
                log.dump_bytes = log.cut_at = cut
                await writer.drain()
                writer.close()  # graceful: every byte written arrives, then the FIN
                raise _Cut()
            log.dump_bytes += len(data)
            writer.write(data)

        checksum = log.user_vars.get("source_binlog_checksum", log.user_vars.get("master_binlog_checksum"))
        try:
            if self.index.files[-1].checksum and checksum is None:
                raise DumpError(ER_MASTER_FATAL_ERROR_READING_BINLOG,
                                "Slave can not handle replication events with the checksum that master is "
                                "configured to log")
            if checksum is not None and str(checksum).upper() != "CRC32":
                raise DumpError(ER_MASTER_FATAL_ERROR_READING_BINLOG, "this fake master only serves CRC32 binlogs")
            cursor = DumpCursor(self.index, file=req.file, pos=req.pos, server_id=self.server_id,
                                  gtids=None if req.gtids is None else Gtids.decode(req.gtid_data),
                                heartbeat_v2=bool(req.flags & USE_HEARTBEAT_EVENT_V2))
        except DumpError as exc:
            log.error = exc.message
            await send(b"\xff" + struct.pack("<H", exc.code) + b"#HY000" + exc.message.encode())
            await writer.drain()
            return
        if semi:
            ack_task = asyncio.ensure_future(self._read_acks(reader, log))
            self._tasks.add(ack_task)
            ack_task.add_done_callback(self._tasks.discard)
        period_ns = int(log.user_vars.get("source_heartbeat_period", log.user_vars.get("master_heartbeat_period", 0)))
        period = period_ns / 1e9 if period_ns else None
        while True:
            try:
                events = cursor.take()
            except DumpError as exc:
                log.error = exc.message
                await send(b"\xff" + struct.pack("<H", exc.code) + b"#HY000" + exc.message.encode())
                await writer.drain()
                return
            for sent in events:
                head = (b"\x00\xef" + (b"\x01" if sent.need_ack else b"\x00")) if semi else b"\x00"
                await send(head + sent.event)
                log.sent.append(sent)
            await writer.drain()
            if events:
                continue
            if req.flags & P.BINLOG_DUMP_NON_BLOCK:
                await send(b"\xfe\x00\x00\x02\x00")
                await writer.drain()
                return
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=period)
            except asyncio.TimeoutError:
                head = b"\x00\xef\x00" if semi else b"\x00"
                beat = cursor.idle_heartbeat()
                await send(head + beat)
                log.sent.append(SentEvent(cursor.position[0], None, beat))
                await writer.drain()
            if reader.at_eof() and not semi:
                return

    @staticmethod
    async def _read_acks(reader: asyncio.StreamReader, log: ConnectionLog) -> None:
        try:
            while True:
                header = await reader.readexactly(4)
                payload = await reader.readexactly(int.from_bytes(header[:3], "little"))
                if payload[:1] == b"\xef" and len(payload) >= 9:
                    log.acks.append((payload[9:].decode(), struct.unpack_from("<Q", payload, 1)[0]))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass


def wire_bytes(events: list[bytes], *, semi_sync: bool = False) -> int:
    """Bytes on the wire of a dump stream made of ``events`` (packet header + 0x00 [+ 0xEF flag] + event)."""
    return sum(4 + (3 if semi_sync else 1) + len(ev) for ev in events)
