"""MySQL client/server packet framing, length-encoded values, OK/ERR/EOF packets, text result sets and the commands
a replica sends (sans-I/O: bytes in, values out)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..binlog.packed import PackedIntError, decode_packed, encode_packed
from .errors import (
    CR_MALFORMED_PACKET,
    CR_NET_PACKET_TOO_LARGE,
    ER_NET_PACKETS_OUT_OF_ORDER,
)

# -- framing -----------------------------------------------------------------------------------------------------

HEADER_LEN = 4
# A payload this long (or longer) continues in the next packet; the receiver concatenates (protocol-reference §3.1).
MAX_CHUNK = 0xFFFFFF
# The largest payload we accept by default: max_allowed_packet tops out at 1 GiB on MySQL and MariaDB, and a binlog
# event can carry a row image that large plus the OK byte and the semi-sync header.
DEFAULT_MAX_PAYLOAD = (1 << 30) + 64

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U24_LOW = 0xFFFFFF

# -- capability flags (protocol-reference §3.2) ------------------------------------------------------------------

CLIENT_LONG_PASSWORD = 0x1  # MariaDB calls it CLIENT_MYSQL: clear in a greeting means "MariaDB, extended caps follow"
CLIENT_MYSQL = CLIENT_LONG_PASSWORD
CLIENT_FOUND_ROWS = 0x2
CLIENT_LONG_FLAG = 0x4
CLIENT_CONNECT_WITH_DB = 0x8
CLIENT_NO_SCHEMA = 0x10
CLIENT_COMPRESS = 0x20
CLIENT_ODBC = 0x40
CLIENT_LOCAL_FILES = 0x80
CLIENT_IGNORE_SPACE = 0x100
CLIENT_PROTOCOL_41 = 0x200
CLIENT_INTERACTIVE = 0x400
CLIENT_SSL = 0x800
CLIENT_IGNORE_SIGPIPE = 0x1000
CLIENT_TRANSACTIONS = 0x2000
CLIENT_RESERVED = 0x4000
CLIENT_SECURE_CONNECTION = 0x8000
CLIENT_MULTI_STATEMENTS = 0x10000
CLIENT_MULTI_RESULTS = 0x20000
CLIENT_PS_MULTI_RESULTS = 0x40000
CLIENT_PLUGIN_AUTH = 0x80000
CLIENT_CONNECT_ATTRS = 0x100000
CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA = 0x200000
CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS = 0x400000
CLIENT_SESSION_TRACK = 0x800000
CLIENT_DEPRECATE_EOF = 0x1000000
CLIENT_OPTIONAL_RESULTSET_METADATA = 0x2000000
CLIENT_ZSTD_COMPRESSION_ALGORITHM = 0x4000000
CLIENT_QUERY_ATTRIBUTES = 0x8000000
CLIENT_MULTI_FACTOR_AUTHENTICATION = 0x10000000
CLIENT_SSL_VERIFY_SERVER_CERT = 0x40000000
CLIENT_REMEMBER_OPTIONS = 0x80000000

# MariaDB extended capabilities: the upper 32 bits, sent in the greeting's last 4 filler bytes (shifted down here).
MARIADB_CLIENT_PROGRESS = 1 << 0
MARIADB_CLIENT_COM_MULTI = 1 << 1
MARIADB_CLIENT_STMT_BULK_OPERATIONS = 1 << 2
MARIADB_CLIENT_EXTENDED_METADATA = 1 << 3
MARIADB_CLIENT_CACHE_METADATA = 1 << 4

# -- server status flags -----------------------------------------------------------------------------------------

SERVER_STATUS_IN_TRANS = 0x1
SERVER_STATUS_AUTOCOMMIT = 0x2
SERVER_MORE_RESULTS_EXISTS = 0x8

# -- command codes -----------------------------------------------------------------------------------------------

COM_SLEEP = 0x00
COM_QUIT = 0x01
COM_INIT_DB = 0x02
COM_QUERY = 0x03
COM_FIELD_LIST = 0x04
COM_STATISTICS = 0x09
COM_PROCESS_KILL = 0x0C
COM_PING = 0x0E
COM_BINLOG_DUMP = 0x12
COM_TABLE_DUMP = 0x13
COM_REGISTER_SLAVE = 0x15
COM_STMT_PREPARE = 0x16
COM_STMT_EXECUTE = 0x17
COM_RESET_CONNECTION = 0x1F
COM_BINLOG_DUMP_GTID = 0x1E

# COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID flags (protocol-reference §3.7).
BINLOG_DUMP_NON_BLOCK = 0x01
BINLOG_SEND_ANNOTATE_ROWS_EVENT = 0x02  # MariaDB
USE_HEARTBEAT_EVENT_V2 = 0x02  # MySQL 8.0.26+ (same bit, other meaning)
BINLOG_THROUGH_GTID = 0x04  # MySQL: COM_BINLOG_DUMP_GTID carries a GTID set

# What a MariaDB replica says it understands (@mariadb_slave_capability before its dump, sql/log_event.h): the relay
# sends GTID as a replica of its master, and answers each level as a master.
MARIA_SLAVE_CAPABILITY_ANNOTATE = 1
MARIA_SLAVE_CAPABILITY_TOLERATE_HOLES = 2
MARIA_SLAVE_CAPABILITY_BINLOG_CHECKPOINT = 3
MARIA_SLAVE_CAPABILITY_GTID = 4

# First byte of the packets a server answers with.
OK_HEADER = 0x00
LOCAL_INFILE_HEADER = 0xFB
EOF_HEADER = 0xFE
ERR_HEADER = 0xFF


# utf8mb4_general_ci: understood by every MySQL >= 5.5.3 and MariaDB, fits the handshake's one charset byte.
CHARSET_UTF8MB4_GENERAL_CI = 45


class MySQLError(Exception):
    """An error from (or about) a MySQL/MariaDB peer: `code` is the server's errno, or a client CR_* code (2000+)
    for problems the client detects itself; `sqlstate` is the 5-character SQLSTATE."""

    def __init__(self, code: int, sqlstate: str, message: str) -> None:
        self.code = code
        self.sqlstate = sqlstate
        self.message = message
        super().__init__(code, sqlstate, message)

    def __str__(self) -> str:
        # The mysql client's spelling, which DBAs grep for.
        return f"ERROR {self.code} ({self.sqlstate}): {self.message}"


class ProtocolError(MySQLError, ValueError):
    """The peer sent bytes that break the protocol (truncated or malformed packet, out-of-order sequence id):
    CR_MALFORMED_PACKET unless a more specific code applies. The connection cannot be trusted any more."""

    def __init__(self, message: str, code: int = CR_MALFORMED_PACKET) -> None:
        super().__init__(code, "HY000", message)


# -- length-encoded integers and strings -------------------------------------------------------------------------


def read_lenenc_int(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """The length-encoded integer at buf[pos] and the position after it (binlog/packed.py); ProtocolError when
    truncated or when the first byte is 0xFB (NULL, only meaningful in rows) or 0xFF (undefined)."""
    try:
        return decode_packed(buf, pos, len(buf), "length-encoded integer")
    except PackedIntError as exc:
        raise ProtocolError(f"{exc} at offset {pos}") from None


def read_lenenc_bytes(buf: bytes | bytearray | memoryview, pos: int) -> tuple[bytes, int]:
    """The length-encoded string at buf[pos] and the position after it; ProtocolError when truncated."""
    length, pos = read_lenenc_int(buf, pos)
    end = pos + length
    if end > len(buf):
        raise ProtocolError(f"length-encoded string of {length} bytes at offset {pos} runs past the packet end")
    return bytes(buf[pos:end]), end


def lenenc_int(value: int) -> bytes:
    """`value` as a length-encoded integer (ValueError for a negative one or one over 64 bits)."""
    return encode_packed(value, "length-encoded integer")


def lenenc_bytes(value: bytes) -> bytes:
    """`value` as a length-encoded string."""
    return lenenc_int(len(value)) + value


def read_nul_bytes(buf: bytes, pos: int, what: str) -> tuple[bytes, int]:
    """The NUL-terminated string at buf[pos] (without the NUL) and the position after the NUL."""
    end = buf.find(b"\0", pos)
    if end < 0:
        raise ProtocolError(f"{what}: missing NUL terminator")
    return buf[pos:end], end + 1


# -- packet framing ----------------------------------------------------------------------------------------------


def packet_count(payload_len: int) -> int:
    """How many packets (hence sequence ids) a payload of this length takes: a payload of exactly k * 0xFFFFFF
    bytes ends with an empty packet, so that the receiver knows it is complete."""
    return payload_len // MAX_CHUNK + 1


def encode_packet(payload: bytes | bytearray | memoryview, seq: int) -> bytes:
    """`payload` framed as one or more packets starting at sequence id `seq` (see packet_count for the next one)."""
    length = len(payload)
    if length < MAX_CHUNK:
        return _U32.pack(length | (seq & 0xFF) << 24) + payload
    parts: list[bytes | memoryview] = []
    with memoryview(payload) as view:
        for start in range(0, length + 1, MAX_CHUNK):
            chunk = view[start : start + MAX_CHUNK]
            parts.append(_U32.pack(len(chunk) | (seq & 0xFF) << 24))
            parts.append(chunk)
            seq += 1
        return b"".join(parts)


class PacketDecoder:
    """Turns a byte stream into complete payloads, reassembling the 0xFFFFFF-byte packets of payloads >= 16 MiB.

    `feed()` parses every complete packet at once and queues its payload; `payloads()` / `packets()` hand the queue
    over in one batch, which is what keeps the per-event cost low on a stream of ~150-byte binlog events.
    Memory held: the queued payloads (`buffered_bytes`, which the caller bounds by not feeding more until it has
    drained them) plus one incomplete payload, refused as soon as its announced size passes `max_payload`.

    Sequence ids are checked (a MySQL client does the same and reports "Got packets out of order"): the first packet
    must carry 0 unless `expect_sequence()` says otherwise, and each next one the following id modulo 256.
    """

    __slots__ = (
        "_check",
        "_expected",
        "_need",
        "_partial",
        "_partial_len",
        "_ready",
        "_ready_bytes",
        "_ready_seqs",
        "_tail",
        "keep_sequences",
        "max_payload",
    )

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD, keep_sequences: bool = False) -> None:
        # Unparsed bytes after the last complete packet, and how many the next packet needs in all.
        self._tail = bytearray()
        self._need = HEADER_LEN
        self._ready: list[bytes] = []
        self._ready_seqs: list[int] = []
        self._ready_bytes = 0
        # Chunks of a payload that spans several packets, joined once its last packet arrives.
        self._partial: list[bytes] = []
        self._partial_len = 0
        self._expected = 0
        self._check = True
        self.max_payload = max_payload
        self.keep_sequences = keep_sequences

    # -- state ---------------------------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The sequence id the next packet from the peer must carry (and the one a reply to it starts with)."""
        return self._expected

    def expect_sequence(self, seq: int | None) -> None:
        """Check that the next packet carries `seq` (and the following ones count up from it); None stops checking."""
        if seq is None:
            self._check = False
        else:
            self._check = True
            self._expected = seq & 0xFF

    @property
    def buffered_bytes(self) -> int:
        """Bytes of complete payloads that `payloads()` has not handed over yet."""
        return self._ready_bytes

    @property
    def has_payloads(self) -> bool:
        return bool(self._ready)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete payload: nonzero when the stream stops here, the peer vanished mid-packet."""
        return len(self._tail) + self._partial_len

    # -- input ---------------------------------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the stream and queue every payload they complete; ProtocolError on a broken stream."""
        tail = self._tail
        if tail:
            if len(tail) + len(data) < self._need:
                # Part of a large packet: append only; nothing is rescanned until the packet is complete.
                tail += data
                return
            data = bytes(tail) + data
            self._tail = bytearray()
        elif type(data) is not bytes:
            data = bytes(data)
        consumed = self._parse(data)
        if consumed < len(data):
            self._tail = bytearray(memoryview(data)[consumed:])

    def _parse(self, data: bytes) -> int:
        """Queue the payloads of all complete packets in `data`; return how many bytes that consumed.

        This is the per-event hot loop: locals only, one unpack and one slice per packet."""
        total = len(data)
        pos = 0
        append = self._ready.append
        added = 0
        unpack = _U32.unpack_from
        check = self._check
        expected = self._expected
        keep_seqs = self.keep_sequences
        in_partial = bool(self._partial)
        need = HEADER_LEN
        try:
            while total - pos >= HEADER_LEN:
                header = unpack(data, pos)[0]
                length = header & _U24_LOW
                start = pos + HEADER_LEN
                end = start + length
                if end > total:
                    if self._partial_len + length > self.max_payload:
                        raise self._too_large()
                    need = HEADER_LEN + length
                    break
                seq = header >> 24
                if seq != expected and check:
                    raise ProtocolError(
                        f"packets out of order: got sequence id {seq}, expected {expected}",
                        code=ER_NET_PACKETS_OUT_OF_ORDER,
                    )
                expected = (seq + 1) & 0xFF
                pos = end
                if length < MAX_CHUNK and not in_partial:
                    append(data[start:end])
                    added += length
                else:
                    payload = self._add_chunk(data[start:end])
                    in_partial = bool(self._partial)
                    if payload is None:
                        continue
                    append(payload)
                    added += len(payload)
                if keep_seqs:
                    self._ready_seqs.append(seq)
        finally:
            self._expected = expected
            self._ready_bytes += added
            self._need = need
        return pos

    def _add_chunk(self, chunk: bytes) -> bytes | None:
        """Collect one packet of a multi-packet payload; the whole payload once a shorter packet ends it."""
        if self._partial_len + len(chunk) > self.max_payload:
            raise self._too_large()
        self._partial.append(chunk)
        self._partial_len += len(chunk)
        if len(chunk) == MAX_CHUNK:
            return None
        payload = b"".join(self._partial)
        self._partial = []
        self._partial_len = 0
        return payload

    def _too_large(self) -> ProtocolError:
        return ProtocolError(
            f"peer sent a payload of more than {self.max_payload} bytes (the decoder's max_payload)",
            code=CR_NET_PACKET_TOO_LARGE,
        )

    # -- output --------------------------------------------------------------------------------------------------

    def payloads(self) -> list[bytes]:
        """Every complete payload queued so far, oldest first (empty if none); the queue starts afresh."""
        ready = self._ready
        if ready:
            self._ready = []
            self._ready_seqs = []
            self._ready_bytes = 0
        return ready

    def packets(self) -> list[tuple[int, bytes]]:
        """Like payloads(), paired with the sequence id of each payload's last packet (needs keep_sequences=True)."""
        if not self.keep_sequences:
            raise RuntimeError("PacketDecoder(keep_sequences=True) is needed to report sequence ids")
        seqs = self._ready_seqs
        return list(zip(seqs, self.payloads(), strict=True))


# -- generic response packets ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OkPacket:
    """A parsed OK packet (also the 0xFE-headed OK that ends a result set under CLIENT_DEPRECATE_EOF)."""

    affected_rows: int
    last_insert_id: int
    status_flags: int
    warnings: int
    info: bytes


def parse_ok(payload: bytes | bytearray | memoryview) -> OkPacket:
    """Parse an OK packet (header 0x00, or 0xFE for a DEPRECATE_EOF terminator); ProtocolError if it is not one."""
    if not payload or payload[0] not in (OK_HEADER, EOF_HEADER):
        raise ProtocolError(f"expected an OK packet, got {_describe(payload)}")
    affected, pos = read_lenenc_int(payload, 1)
    last_id, pos = read_lenenc_int(payload, pos)
    if len(payload) < pos + 4:
        raise ProtocolError("truncated OK packet: status and warning counts missing")
    status = _U16.unpack_from(payload, pos)[0]
    warnings = _U16.unpack_from(payload, pos + 2)[0]
    return OkPacket(affected, last_id, status, warnings, bytes(payload[pos + 4 :]))


def parse_err(payload: bytes | bytearray | memoryview) -> MySQLError:
    """The MySQLError an ERR packet (header 0xFF) carries. Returned, not raised, so that the caller raises it where
    the traceback is useful. An ERR sent before the handshake has no '#'+SQLSTATE marker; it gets HY000."""
    if len(payload) < 3 or payload[0] != ERR_HEADER:
        raise ProtocolError(f"expected an ERR packet, got {_describe(payload)}")
    code = _U16.unpack_from(payload, 1)[0]
    if len(payload) >= 9 and payload[3] == 0x23:  # '#'
        sqlstate = bytes(payload[4:9]).decode("ascii", "replace")
        message = bytes(payload[9:])
    else:
        sqlstate = "HY000"
        message = bytes(payload[3:])
    return MySQLError(code, sqlstate, message.decode("utf-8", "replace"))


def is_eof(payload: bytes | bytearray | memoryview) -> bool:
    """True for a classic EOF packet: 0xFE and shorter than 9 bytes (a row or an event starting with 0xFE is longer;
    MySQL's replica uses the same test to spot the end of a dump)."""
    return len(payload) < 9 and len(payload) > 0 and payload[0] == EOF_HEADER


def parse_eof(payload: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(warnings, status_flags) of an EOF packet; zeros for the 1-byte pre-4.1 form."""
    if not is_eof(payload):
        raise ProtocolError(f"expected an EOF packet, got {_describe(payload)}")
    if len(payload) >= 5:
        return _U16.unpack_from(payload, 1)[0], _U16.unpack_from(payload, 3)[0]
    return 0, 0


def _describe(payload: bytes | bytearray | memoryview) -> str:
    if not payload:
        return "an empty packet"
    return f"a {len(payload)}-byte packet starting with 0x{payload[0]:02x}"


# -- text result sets (COM_QUERY replies) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryResult:
    """What a COM_QUERY returned: column names and rows of text values (None for SQL NULL), or, for a statement
    without a result set, empty columns/rows with the OK packet's counts.

    Values are decoded as UTF-8 with surrogateescape, so binary columns survive: `value.encode("utf-8",
    "surrogateescape")` gives the exact bytes back.
    """

    columns: list[str]
    rows: list[tuple[str | None, ...]]
    affected_rows: int = 0
    last_insert_id: int = 0
    warnings: int = 0
    status_flags: int = 0


def parse_column_name(payload: bytes | bytearray | memoryview) -> str:
    """The column name (the alias, `name`) from a ColumnDefinition41 packet."""
    pos = 0
    # catalog, schema, table, org_table, then name.
    for _ in range(4):
        length, pos = read_lenenc_int(payload, pos)
        pos += length
    name, _ = read_lenenc_bytes(payload, pos)
    return name.decode("utf-8", "surrogateescape")


def parse_text_row(payload: bytes | bytearray | memoryview, column_count: int) -> tuple[str | None, ...]:
    """One text-protocol row: `column_count` length-encoded strings, 0xFB for NULL."""
    values: list[str | None] = []
    pos = 0
    for _ in range(column_count):
        if pos < len(payload) and payload[pos] == 0xFB:
            values.append(None)
            pos += 1
            continue
        raw, pos = read_lenenc_bytes(payload, pos)
        values.append(raw.decode("utf-8", "surrogateescape"))
    if pos != len(payload):
        raise ProtocolError(f"row has {len(payload) - pos} bytes after its {column_count} columns")
    return tuple(values)


class TextResultReader:
    """Reads the reply to one COM_QUERY, packet by packet (classic EOF framing: CLIENT_DEPRECATE_EOF not negotiated).

    `feed(payload)` returns the QueryResult once the reply is complete, None while more packets are needed, and
    raises the MySQLError of an ERR packet (before or in the middle of the rows).
    """

    __slots__ = ("_column_count", "_columns", "_rows", "_state")

    _START, _COLUMNS, _COLUMNS_EOF, _ROWS, _DONE = range(5)

    def __init__(self) -> None:
        self._state = self._START
        self._column_count = 0
        self._columns: list[str] = []
        self._rows: list[tuple[str | None, ...]] = []

    @property
    def done(self) -> bool:
        return self._state == self._DONE

    def feed(self, payload: bytes) -> QueryResult | None:
        if self._state == self._DONE:
            raise ProtocolError("packet after the end of the query result")
        if not payload:
            raise ProtocolError("empty packet in a query result")
        first = payload[0]
        if first == ERR_HEADER:
            self._state = self._DONE
            raise parse_err(payload)
        state = self._state
        if state == self._ROWS:
            if is_eof(payload):
                return self._finish(parse_eof(payload))
            self._rows.append(parse_text_row(payload, self._column_count))
            return None
        if state == self._START:
            if first == OK_HEADER:
                ok = parse_ok(payload)
                self._state = self._DONE
                if ok.status_flags & SERVER_MORE_RESULTS_EXISTS:
                    # We never ask for CLIENT_MULTI_RESULTS, so a second result would be a protocol violation.
                    raise ProtocolError("server announced more results without CLIENT_MULTI_RESULTS")
                return QueryResult([], [], ok.affected_rows, ok.last_insert_id, ok.warnings, ok.status_flags)
            if first == LOCAL_INFILE_HEADER:
                self._state = self._DONE
                raise ProtocolError("server asked for LOAD DATA LOCAL INFILE, which this client never allows")
            count, end = read_lenenc_int(payload, 0)
            if end != len(payload) or count == 0:
                raise ProtocolError(f"bad column count packet ({_describe(payload)})")
            self._column_count = count
            self._state = self._COLUMNS
            return None
        if state == self._COLUMNS:
            self._columns.append(parse_column_name(payload))
            if len(self._columns) == self._column_count:
                self._state = self._COLUMNS_EOF
            return None
        # _COLUMNS_EOF
        parse_eof(payload)
        self._state = self._ROWS
        return None

    def _finish(self, eof: tuple[int, int]) -> QueryResult:
        warnings, status = eof
        self._state = self._DONE
        if status & SERVER_MORE_RESULTS_EXISTS:
            raise ProtocolError("server announced more results without CLIENT_MULTI_RESULTS")
        return QueryResult(self._columns, self._rows, 0, 0, warnings, status)


# -- commands a replica sends ------------------------------------------------------------------------------------


def com_query(sql: str | bytes) -> bytes:
    """COM_QUERY payload: the statement as UTF-8 (the connection's character set is utf8mb4)."""
    return bytes((COM_QUERY,)) + (sql.encode("utf-8") if isinstance(sql, str) else sql)


def com_register_slave(
    server_id: int, host: str = "", port: int = 0, user: str = "", password: str = "", rank: int = 0, master_id: int = 0
) -> bytes:
    """COM_REGISTER_SLAVE payload (protocol-reference §3.6): what SHOW SLAVE HOSTS / SHOW REPLICAS lists."""
    parts = [bytes((COM_REGISTER_SLAVE,)), _U32.pack(_u32(server_id, "server_id"))]
    for what, value in (("host", host), ("user", user), ("password", password)):
        raw = value.encode("utf-8")
        if len(raw) > 255:
            raise ValueError(f"COM_REGISTER_SLAVE {what} is longer than 255 bytes")
        parts += [bytes((len(raw),)), raw]
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port must be 0..65535, got {port}")
    parts += [_U16.pack(port), _U32.pack(_u32(rank, "rank")), _U32.pack(_u32(master_id, "master_id"))]
    return b"".join(parts)


def com_binlog_dump(file: str, position: int, server_id: int, flags: int = 0) -> bytes:
    """COM_BINLOG_DUMP payload (protocol-reference §3.7): start `file` at byte `position` (a u32 on the wire)."""
    return (
        bytes((COM_BINLOG_DUMP,))
        + _U32.pack(_u32(position, "position"))
        + _U16.pack(_u16(flags, "flags"))
        + _U32.pack(_u32(server_id, "server_id"))
        + file.encode("utf-8")
    )


def com_binlog_dump_gtid(
    server_id: int, encoded_gtid_set: bytes, *, file: str = "", position: int = 4, flags: int = 0
) -> bytes:
    """COM_BINLOG_DUMP_GTID payload (protocol-reference §3.8); `encoded_gtid_set` is the binary Gtid_set (§2.7).

    The data size and set are always sent: the server reads them whatever the flags say.
    """
    name = file.encode("utf-8")
    if not 0 <= position < 1 << 64:
        raise ValueError(f"position must fit a u64, got {position}")
    return b"".join(
        (
            bytes((COM_BINLOG_DUMP_GTID,)),
            _U16.pack(_u16(flags, "flags")),
            _U32.pack(_u32(server_id, "server_id")),
            _U32.pack(len(name)),
            name,
            _U64.pack(position),
            _U32.pack(len(encoded_gtid_set)),
            encoded_gtid_set,
        )
    )


def _u32(value: int, what: str) -> int:
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{what} must fit a u32, got {value}")
    return value


def _u16(value: int, what: str) -> int:
    if not 0 <= value <= 0xFFFF:
        raise ValueError(f"{what} must fit a u16, got {value}")
    return value
