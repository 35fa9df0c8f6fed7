"""The relay's MySQL server: accepts replicas and tools on --listen, runs the handshake, TLS and authentication
(wire/server_auth.py), then one command loop per connection that hands COM_QUERY to the SQL layer and the dump
commands to the dump sender through a DumpChannel (downstream/context.py seams).

Works the same under uvloop and the default loop: TLS runs over ssl.MemoryBIO (as in upstream/connection.py),
because uvloop's start_tls drops data buffered before the switch, and a client's ClientHello usually arrives in
the same segment as its SSLRequest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import itertools
import os
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ..log import PeerLogLimiter, get_logger, report_failure
from ..wire.accounts import DownstreamUser, find_user
from ..wire.errors import (
    ER_ACCESS_DENIED_ERROR,
    ER_CLIENT_INTERACTION_TIMEOUT,
    ER_CON_COUNT_ERROR,
    ER_HOST_IS_BLOCKED,
    ER_MALFORMED_PACKET,
    ER_NET_PACKETS_OUT_OF_ORDER,
    ER_NET_PACKET_TOO_LARGE,
    ER_NET_READ_INTERRUPTED,
    ER_NO_DB_ERROR,
    ER_UNKNOWN_COM_ERROR,
    ER_UNKNOWN_ERROR,
)
from ..wire.packets import (
    CLIENT_SSL,
    COM_BINLOG_DUMP,
    COM_BINLOG_DUMP_GTID,
    COM_INIT_DB,
    COM_PING,
    COM_QUERY,
    COM_QUIT,
    COM_REGISTER_SLAVE,
    CR_NET_PACKET_TOO_LARGE,
    MAX_CHUNK,
    SERVER_STATUS_AUTOCOMMIT,
    MySQLError,
    PacketDecoder,
    ProtocolError,
    encode_packet,
    packet_count,
)
from ..wire.results import (
    CloseConnection,
    ErrorResponse,
    Response,
    encode_error,
    encode_ok,
    encode_response,
)
from ..wire.server_auth import (
    ER_HANDSHAKE_ERROR,
    AuthAccepted,
    AuthRejected,
    HandshakeError,
    RsaKeyPair,
    SendAuthPackets,
    ServerAuthentication,
    Sha2Cache,
    SslRequest,
    build_greeting,
    default_auth_plugin,
    generate_scramble,
    greeting_charset,
    greeting_version,
    parse_handshake_response,
    server_capabilities,
)
from ..wire.tls import MemoryTls
from . import privileges
from .context import (
    ConnectionState,
    DownstreamContext,
    DumpChannel,
    DumpProgress,
    DumpRequest,
    ReplicaRegistration,
    SenderProcesses,
)
from .sql.limits import max_statement_bytes

if TYPE_CHECKING:
    from .dump.chunks import Chunk

log = get_logger(__name__)

# The SQL layer may answer directly or through a coroutine (relayproxy.downstream.sql.execute is a plain function).
SqlExecutor = Callable[[DownstreamContext, ConnectionState, str], Response | Awaitable[Response]]
DumpServer = Callable[[DownstreamContext, ConnectionState, DumpRequest, DumpChannel], Awaitable[None]]


# A handshake response holds a user name, a scramble and at most 64 KiB of connection attributes.
HANDSHAKE_MAX_PAYLOAD = 128 * 1024
# max_allowed_packet for client commands when no context says otherwise: the configuration's max_statement_bytes
# (sql/limits.py) is what the server enforces and what @@max_allowed_packet answers. Replicas send only small
# commands (register, dump requests, semi-sync ACKs).
# Undelivered client bytes above which we stop reading the socket (a client flooding us gets TCP back-pressure).
DEFAULT_MAX_BUFFERED = 1024 * 1024
DEFAULT_HANDSHAKE_TIMEOUT = 10.0  # MySQL's connect_timeout
DEFAULT_IDLE_TIMEOUT = 28800.0  # MySQL's wait_timeout
DEFAULT_WRITE_TIMEOUT = 60.0  # MySQL's net_write_timeout: a client that stops reading this long is dropped
DEFAULT_NET_READ_TIMEOUT = 30.0  # MySQL's net_read_timeout: a client that stops in the middle of a packet
DEFAULT_MAX_CONNECTIONS = 1000  # MySQL's max_connections default is 151; a relay fans out to more
DEFAULT_MAX_CONNECTIONS_PER_HOST = 0  # 0: no per-host cap
DEFAULT_MAX_UNAUTHENTICATED = 100  # connections between accept and a successful login
DEFAULT_MAX_CONNECT_ERRORS = 100  # MariaDB's and MySQL's max_connect_errors
DEFAULT_HOST_BLOCK_TIME = 0.0  # seconds a blocked host stays blocked; 0: until FLUSH HOSTS (as the servers)
_HOST_CACHE_SIZE = 10_000  # hosts whose failed logins are remembered (the oldest is forgotten beyond)
# The servers never count a loopback client's connection errors (hostname.cc ip_to_hostname: "Do not count connect
# errors from localhost"): exactly these two addresses, not the rest of 127.0.0.0/8.
_LOOPBACK = frozenset({"127.0.0.1", "::1"})
# Password guessing (MySQL's connection_control): after this many consecutive wrong logins of one account from one
# host, each further attempt's answer waits 1, 2, 3... times the minimum delay, at most the maximum. connection_control
# allows up to 2147483 s; a relay's maximum stays below the replicas' connect/read timeout (slave_net_timeout, 60 s),
# so a replica with a wrong password still sees its 1045 rather than a lost connection.
DEFAULT_LOGIN_FAILURES_THRESHOLD = 3
DEFAULT_LOGIN_MIN_DELAY = 1.0
DEFAULT_LOGIN_MAX_DELAY = 30.0
_THROTTLE_KEYS = 10_000  # (account, host) pairs whose failures are remembered (the least recently failing forgotten)
# An unauthenticated connection older than this may be dropped to make room for a new one when their budget is
# full: a client logs in within milliseconds, an idle socket that has sat this long holds a slot for nothing.
DEFAULT_UNAUTHENTICATED_GRACE = 1.0
_CLOSE_TIMEOUT = 5.0
_HALF_CLOSE_GRACE = 1.0  # seconds a dump may still answer after the replica half-closed
_SEMI_SYNC_ACK_REQUESTED = b"\x00\xef\x01"
_INTERNAL_ERROR = "Unknown error: internal error in relayproxy (reference {ref}), see its log"
# Log lines a peer host can cause per window (client errors, refusals, internal errors); the rest are counted
# and the count is reported on its next line once the window has passed.
DEFAULT_LOG_LINES_PER_HOST = 10
_LOGGED_NAME_MAX = 64  # characters of a client-chosen name (user, program) that reach the log
# Payloads shorter than this are copied behind their header and written at once.
_COPY_LIMIT = 64 * 1024
_COALESCE_LIMIT = 256 * 1024  # write coalesced small events once this much is pending

_COMMAND_NAMES = {
    0x00: "COM_SLEEP", 0x04: "COM_FIELD_LIST", 0x05: "COM_CREATE_DB", 0x06: "COM_DROP_DB", 0x07: "COM_REFRESH",
    0x08: "COM_SHUTDOWN", 0x09: "COM_STATISTICS", 0x0A: "COM_PROCESS_INFO", 0x0B: "COM_CONNECT",
    0x0C: "COM_PROCESS_KILL", 0x0D: "COM_DEBUG", 0x0F: "COM_TIME", 0x10: "COM_DELAYED_INSERT",
    0x11: "COM_CHANGE_USER", 0x13: "COM_TABLE_DUMP", 0x14: "COM_CONNECT_OUT", 0x16: "COM_STMT_PREPARE",
    0x17: "COM_STMT_EXECUTE", 0x18: "COM_STMT_SEND_LONG_DATA", 0x19: "COM_STMT_CLOSE", 0x1A: "COM_STMT_RESET",
    0x1B: "COM_SET_OPTION", 0x1C: "COM_STMT_FETCH", 0x1D: "COM_DAEMON", 0x1F: "COM_RESET_CONNECTION",
    0x20: "COM_CLONE", 0x21: "COM_SUBSCRIBE_GROUP_REPLICATION_STREAM",
}

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_DUMP_HEAD = struct.Struct("<IHI")  # COM_BINLOG_DUMP: position, flags, server_id
_DUMP_GTID_HEAD = struct.Struct("<HII")  # COM_BINLOG_DUMP_GTID: flags, server_id, name length


def _short(text: str | None) -> str | None:
    """A client-chosen string as it may appear in a log line: bounded."""
    if text is None or len(text) <= _LOGGED_NAME_MAX:
        return text
    return f"{text[:_LOGGED_NAME_MAX]}...({len(text.encode('utf-8', 'surrogateescape'))} bytes)"


class ClientConnectionLost(ConnectionError):
    """The client went away (closed, reset, stopped reading for write_timeout); raised by DumpChannel.send/receive."""


class _Close(Exception):
    """End this connection quietly: the reason was already answered and logged."""


def server_tls_context(
    cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str] | None = None
) -> ssl.SSLContext:
    """A server TLS context from PEM files (TLS 1.2+, no client certificates asked for); ValueError naming the
    file when it cannot be loaded."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file) if key_file else None)
    except FileNotFoundError as exc:
        raise ValueError(f"TLS certificate or key file not found: {exc.filename}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(
            f"cannot load TLS certificate {os.fspath(cert_file)!r} / key {os.fspath(key_file or cert_file)!r}: {exc}"
        ) from None
    return context


# -- transport ----------------------------------------------------------------------------------------------------


class ClientProtocol(asyncio.Protocol):
    """Bytes from one client: decrypted when TLS is on, decoded in bulk into payloads that wait for the
    connection's single reader; reading pauses while more than `max_buffered` bytes of them wait.

    The first packet is cut out by hand: when it is an SSLRequest, what follows it in the same read is the
    ClientHello and goes to TLS, not to the packet decoder. Writes go through `write()` (encrypting when TLS is on);
    `drain()` waits while the transport's buffer is over its high-water mark.

    ``on_connected(protocol)`` (the server's) returns the session that will read the connection. A connection that
    arrives ``logged_in`` (a replica's socket handed to a sender process, downstream/workers.py) has no handshake
    packet to cut out and no server to tell.
    """

    def __init__(self, *, max_buffered: int, net_read_timeout: float, tls_context: ssl.SSLContext | None = None,
                 on_connected: Callable[[ClientProtocol], _Session | None] | None = None,
                 logged_in: bool = False) -> None:
        self._on_connected = on_connected
        self.tls_context = tls_context
        self.decoder = PacketDecoder(max_payload=HANDSHAKE_MAX_PAYLOAD, keep_sequences=True)
        # Sequence ids are checked by the reader, per exchange; semi-sync ACKs restart them mid-dump.
        self.decoder.expect_sequence(None)
        self.max_buffered = max_buffered
        self.net_read_timeout = net_read_timeout
        self._last_data = 0.0  # time.monotonic() of the last bytes received
        self._partial = False  # the bytes received end inside a packet
        self.transport: asyncio.Transport | None = None
        self.peer_host = "?"
        self.peer_port = 0
        self.fd = -1  # the socket's descriptor once connected (the shared pass's batch writes, sendbatch.py)
        self.tls: MemoryTls | None = None
        self.tls_handshake: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.input_ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # client half-closed
        self._first: bytearray | None = None if logged_in else bytearray()
        self._discard = False
        self._ready: collections.deque[tuple[int, bytes]] = collections.deque()
        self._ready_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._read_paused = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.session: _Session | None = None

    # -- asyncio callbacks ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1  # the shared pass's batch writes (sendbatch.py)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            # An IPv4 client of a dual-stack listener: match accounts and report it as MySQL does, in IPv4 form.
            if host.startswith("::ffff:") and "." in host:
                host = host[7:]
            self.peer_host, self.peer_port = host, int(peer[1])
        if self._on_connected is not None:
            self.session = self._on_connected(self)

    def data_received(self, data: bytes) -> None:
        if self.error is not None or self._discard:
            return
        self._last_data = time.monotonic()
        try:
            self._receive(data)
        finally:
            partial = bool(self._first) or self.decoder.pending_bytes > 0
            if partial and not self._partial:
                self._partial = True
                self._wake()  # a reader waiting for a long time (idle_timeout) now waits net_read_timeout at most
            elif not partial:
                self._partial = False

    def _receive(self, data: bytes) -> None:
        if self.tls is not None:
            data = self._decrypt(data)
            if not data:
                return
        if self._first is not None:
            data = self._take_first_packet(data)
            if not data:
                return
        try:
            self.decoder.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if self.decoder.has_payloads:
            packets = self.decoder.packets()
            self._ready.extend(packets)
            self._ready_bytes += sum(len(payload) for _, payload in packets)
            if self._ready_bytes > self.max_buffered and not self._read_paused and self.transport is not None:
                self._read_paused = True
                self.transport.pause_reading()
            self._wake()

    def _take_first_packet(self, data: bytes) -> bytes:
        """Collect the client's first packet; return what follows it (for the decoder), b"" if nothing does or it
        belongs to TLS."""
        first = self._first
        assert first is not None
        first += data
        if len(first) < 4:
            return b""
        header = _U32.unpack_from(first)[0]
        length, seq = header & 0xFFFFFF, header >> 24
        if length >= HANDSHAKE_MAX_PAYLOAD:
            self._first = None
            self._fail(ProtocolError(f"handshake packet of {length} bytes announced", code=CR_NET_PACKET_TOO_LARGE))
            return b""
        if len(first) < 4 + length:
            return b""
        payload, rest = bytes(first[4 : 4 + length]), bytes(first[4 + length :])
        self._first = None
        self._ready.append((seq, payload))
        self._ready_bytes += len(payload)
        self._wake()
        is_ssl_request = length == 32 and _U32.unpack_from(payload)[0] & CLIENT_SSL
        if not is_ssl_request:
            return rest
        if self.tls_context is None:
            self._discard = True  # a ClientHello we cannot answer; the session refuses the client
            return b""
        self.tls = MemoryTls(self.tls_context, server_side=True)
        self.tls_handshake = asyncio.get_running_loop().create_future()
        if rest:
            self._receive(rest)
        return b""

    def _decrypt(self, data: bytes) -> bytes:
        tls = self.tls
        assert tls is not None and self.transport is not None
        handshake = self.tls_handshake
        try:
            plaintext = tls.receive(data)
        except ssl.SSLError as exc:
            if handshake is not None and not handshake.done():
                handshake.set_exception(exc)
                handshake.exception()  # retrieved here: the session may already be gone
            self.error = ClientConnectionLost(f"TLS error: {getattr(exc, 'reason', None) or exc}")
            self.transport.abort()
            self._wake()
            return b""
        output = tls.pending_output()
        if output:
            self.transport.write(output)
        if tls.handshake_complete and handshake is not None and not handshake.done():
            handshake.set_result(None)
        return plaintext

    def _fail(self, exc: BaseException) -> None:
        """The input cannot be trusted any more: stop reading; the session answers with an ERR and closes."""
        self.error = exc
        if self.transport is not None and not self._read_paused:
            self._read_paused = True
            with contextlib.suppress(RuntimeError):
                self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        # A half-close ends the input, not the conversation: commands already received still get their
        # replies (a master answers, then closes on its next read). read() raises once they are consumed.
        if self.error is None:
            self.error = ClientConnectionLost(f"client {self.peer_host}:{self.peer_port} closed its side")
        if not self.input_ended.done():
            self.input_ended.set_result(None)
        self._wake()
        return True  # keep the transport open for the replies; the session closes it

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            detail = f": {exc}" if exc is not None else ""
            self.error = ClientConnectionLost(f"client {self.peer_host}:{self.peer_port} closed the connection{detail}")
        handshake = self.tls_handshake
        if handshake is not None and not handshake.done():
            handshake.set_exception(ClientConnectionLost("client closed the connection during the TLS handshake"))
            handshake.exception()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- reader side ---------------------------------------------------------------------------------------------

    async def read(self, timeout: float | None) -> tuple[int, bytes]:
        """The next payload and the sequence id of its last packet; TimeoutError after `timeout` seconds; the
        protocol error or ClientConnectionLost once the input is over (after the payloads received before)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            if self.error is not None:
                raise self.error
            if self._waiter is not None:
                raise RuntimeError("another task is already reading from this client")
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            now = time.monotonic()
            wait = None if deadline is None else deadline - now
            if self._partial:  # inside a packet: the client must keep sending
                stall = self._last_data + self.net_read_timeout - now
                wait = stall if wait is None else min(wait, stall)
            try:
                if wait is None:
                    await waiter
                else:
                    async with asyncio.timeout(max(wait, 0.0)):
                        await waiter
            except TimeoutError:
                now = time.monotonic()
                if self._partial and not self._ready and now - self._last_data >= self.net_read_timeout:
                    raise MySQLError(
                        ER_NET_READ_INTERRUPTED, "08S01",
                        f"Got timeout reading communication packets: nothing received for {self.net_read_timeout:g}s "
                        f"inside a packet (net_read_timeout)",
                    ) from None
                if deadline is not None and now >= deadline:
                    raise
            finally:
                self._waiter = None
        packet = self._ready.popleft()
        self._ready_bytes -= len(packet[1])
        if self._read_paused and self.error is None and self._ready_bytes <= self.max_buffered // 2 and (
            self.transport is not None
        ):
            self._read_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
        return packet

    # -- writer side ---------------------------------------------------------------------------------------------

    @property
    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing() or self.closed.done()

    def write(self, *chunks: bytes | memoryview) -> None:
        if self.is_closing:
            raise ClientConnectionLost(f"client {self.peer_host}:{self.peer_port} is gone")
        assert self.transport is not None
        tls = self.tls
        for chunk in chunks:
            self.transport.write(tls.encrypt(chunk) if tls is not None else chunk)

    def write_pieces(self, pieces: list) -> None:
        """Write the buffers of ``pieces`` in order, in one writev where the transport does that (no join: the
        transport keeps references, not copies). Under TLS they are joined and encrypted as one record."""
        if self.is_closing:
            raise ClientConnectionLost(f"client {self.peer_host}:{self.peer_port} is gone")
        assert self.transport is not None
        if self.tls is not None:
            self.transport.write(self.tls.encrypt(b"".join(pieces)))
        else:
            self.transport.writelines(pieces)

    async def drain(self, timeout: float | None) -> None:
        """Wait until the transport's buffer is below its high-water mark; a client that has not read for
        `timeout` seconds is dropped (ClientConnectionLost)."""
        if not self._write_paused:
            if self.closed.done():
                raise ClientConnectionLost(f"client {self.peer_host}:{self.peer_port} is gone")
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()
            raise ClientConnectionLost(
                f"client {self.peer_host}:{self.peer_port} read nothing for {timeout}s (write_timeout); dropped"
            ) from None
        if self.closed.done():
            raise ClientConnectionLost(f"client {self.peer_host}:{self.peer_port} is gone")

    async def close(self) -> None:
        """TLS close_notify, flush and close; abort if the client does not let us finish within a few seconds."""
        transport = self.transport
        if transport is None:
            return
        if not transport.is_closing():
            if self.tls is not None and self.tls.handshake_complete:
                with contextlib.suppress(Exception):
                    transport.write(self.tls.close_notify())
            transport.close()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await asyncio.shield(self.closed)
        except TimeoutError:
            transport.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def hold_reading(self) -> None:
        """Stop reading the socket for a while (a throttled login's delay): what the client sends waits in the
        kernel, not in the relay."""
        if self.transport is not None and not self._read_paused:
            with contextlib.suppress(RuntimeError):
                self.transport.pause_reading()

    def release_reading(self) -> None:
        if self.transport is not None and not self._read_paused and not self.transport.is_closing():
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()


# -- the dump channel ---------------------------------------------------------------------------------------------


class ClientDumpChannel:
    """DumpChannel for one COM_BINLOG_DUMP[_GTID]: the reply stream's packets, numbered on from the command's.

    In a semi-sync dump (``semi_sync``), after a payload that asks for an ACK (0x00 0xEF 0x01 ...) the numbering
    restarts at 1: the replica
    resets its count when it sends the ACK (seq 0), and MySQL's and MariaDB's masters do the same on their side
    (ReplSemiSyncMaster::readSlaveReply: net_clear, then pkt_nr++), so the next event must carry 1.
    """

    def __init__(self, protocol: ClientProtocol, write_timeout: float | None, first_seq: int) -> None:
        self._protocol = protocol
        self._write_timeout = write_timeout
        self._seq = first_seq
        self.semi_sync = False  # the sender sets it for a semi-sync dump: an ACK request restarts the numbering
        # Small events are framed into one buffer and written together: one transport.write (one send()
        # syscall, one TCP segment train, one TLS record) per batch instead of per ~150-byte event. The
        # buffer goes out when it is full, before any larger payload, and on the next turn of the event loop,
        # i.e. as soon as the sender waits for anything (file read, the horizon, an ACK): never held back.
        self._pending = bytearray()
        self._flush_scheduled = False

    def _queue(self, frame: bytes) -> None:
        self._pending += frame
        if len(self._pending) >= _COALESCE_LIMIT:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write the coalesced frames now (also called by the event loop right after the sender yields)."""
        self._flush_scheduled = False
        if not self._pending:
            return
        data = bytes(self._pending)
        self._pending.clear()
        if not self._protocol.is_closing:
            self._protocol.write(data)

    @property
    def closed(self) -> bool:
        # A half-close is not a close: the dump may still answer (send_final); events are refused by send().
        protocol = self._protocol
        return protocol.is_closing or (protocol.error is not None and not protocol.input_ended.done())

    def _check_reader(self) -> None:
        # A replica that half-closed reads no more events: sending them would only fill its socket.
        if self._protocol.input_ended.done() or self._protocol.is_closing:
            raise ClientConnectionLost("the replica closed the connection")

    async def send_final(self, payload: bytes) -> None:
        """The dump's last word (an ERR or EOF): delivered even after the replica half-closed."""
        if self._protocol.is_closing:
            raise ClientConnectionLost("the replica closed the connection")
        await self._send(payload)
        self.flush()  # the last word: on the wire before the session closes the connection

    async def send(self, payload: bytes) -> None:
        """Send one payload, split into 16 MiB packets (plus the empty one when it ends on a boundary); waits while
        the client is slow to read, so a dump never piles up more than one payload in memory."""
        if payload[:1] in (b"\xff", b"\xfe"):
            await self.send_final(payload)  # an ERR or EOF is the dump's last word: answer even a half-closed replica
            return
        self._check_reader()
        await self._send(payload)

    async def _send(self, payload: bytes) -> None:
        protocol = self._protocol
        timeout = self._write_timeout
        length = len(payload)
        seq = self._seq
        if length < _COPY_LIMIT:
            if protocol.is_closing:
                raise ClientConnectionLost(f"client {protocol.peer_host}:{protocol.peer_port} is gone")
            self._queue(_U32.pack(length | seq << 24) + payload)
            seq = (seq + 1) & 0xFF
        elif length < MAX_CHUNK:
            self.flush()
            protocol.write(_U32.pack(length | seq << 24), payload)
            seq = (seq + 1) & 0xFF
        else:
            self.flush()
            with memoryview(payload) as view:
                for start in range(0, length + 1, MAX_CHUNK):
                    chunk = view[start : start + MAX_CHUNK]
                    protocol.write(_U32.pack(len(chunk) | seq << 24), chunk)
                    seq = (seq + 1) & 0xFF
                    await protocol.drain(timeout)
        self._seq = 1 if self.semi_sync and payload[:3] == _SEMI_SYNC_ACK_REQUESTED else seq
        await protocol.drain(timeout)

    async def send_packets(self, chunk: Chunk, omit: frozenset[int] = frozenset()) -> None:
        """Send a shared framed chunk (dump/chunks.py), without the event types in ``omit``: its packets numbered on
        from this channel's, in one write."""
        self._check_reader()
        self.flush()
        protocol = self._protocol
        if chunk.as_pieces(omit):
            pieces, self._seq = chunk.pieces_for(self._seq, omit)
            protocol.write_pieces(pieces)
        else:
            data, self._seq = chunk.frame_for(self._seq, omit)
            protocol.write(data)
        await protocol.drain(self._write_timeout)

    def can_write_now(self) -> bool:
        """Whether ``write_packets_now`` may write: the replica still reads and its socket is below the high-water
        mark (above it, the dump's own task waits for it with the write timeout)."""
        protocol = self._protocol
        return not (protocol.is_closing or protocol._write_paused or protocol.input_ended.done())

    def write_packets_now(self, chunk: Chunk, omit: frozenset[int], shared: Any, owner: Any) -> bool:
        """``send_packets`` without waiting (the shared pass at a horizon advance, dump/followers.py; the caller
        checked ``can_write_now`` just now, in the same callback). ``shared.framings`` holds the framings made in
        this pass: dumps at the same sequence id share one. A socket whose transport holds nothing unsent gets its
        write in the pass's batch (``shared.sends``, sendbatch.py; ``owner`` is the dump, for ``write_rest``).
        Returns ``can_write_now()`` after the write (False above the high-water mark: the dump's own task then waits
        for the replica with the write timeout); True for a write left to the batch."""
        if self._pending:
            self.flush()
        key = (chunk, self._seq, omit)
        framings = shared.framings
        framed = framings.get(key)
        if framed is None:
            total = len(chunk.variant(omit)[0])
            if chunk.as_pieces(omit):
                framed = framings[key] = (True, *chunk.pieces_for(self._seq, omit), total)
            else:
                framed = framings[key] = (False, *chunk.frame_for(self._seq, omit), total)
        pieces, data, self._seq, total = framed
        protocol = self._protocol
        if protocol.tls is not None:
            protocol.write_pieces(data) if pieces else protocol.write(data)
        else:
            transport = protocol.transport
            sends = shared.sends
            if sends is not None and protocol.fd >= 0 and not transport.get_write_buffer_size():
                sends.append((protocol.fd, data))
                shared.queued.append((self, data, pieces, total, owner))
                return True
            if pieces:
                transport.writelines(data)
            else:
                transport.write(data)
        return not (protocol._write_paused or protocol.is_closing or protocol.input_ended.done())

    def write_rest(self, data, pieces: bool, taken: int) -> bool:
        """A batch write (``write_packets_now``) of which the socket took ``taken`` bytes (< 0: none, an error):
        the rest goes to the transport, which queues it or reports the error as for any write. Returns
        ``can_write_now()``."""
        protocol = self._protocol
        if not protocol.is_closing:
            rest = b"".join(data) if pieces else data
            try:
                protocol.transport.write(memoryview(rest)[taken:] if taken > 0 else rest)
            except Exception as exc:  # the stream would have a hole: drop the replica (it reconnects where it is)
                log.error("cannot queue the rest of a batch write; the replica is disconnected",
                          client=f"{protocol.peer_host}:{protocol.peer_port}", error=repr(exc))
                protocol.transport.abort()
        return self.can_write_now()

    async def send_stream(self, total: int, chunks: AsyncIterator[bytes]) -> None:
        """Send one payload of `total` bytes that arrives as `chunks` (the first starting with the 0x00 / 0xEF
        header), framed exactly as send() frames it, so that a 1 GiB event goes out without being held in memory
        (dump.StreamingChannel). Chunks that add up to anything but `total` leave the stream corrupt: the
        connection is dropped and ValueError raised."""
        self._check_reader()
        self.flush()
        protocol = self._protocol
        timeout = self._write_timeout
        seq = self._seq
        sent = 0
        room = 0  # bytes left in the packet being written
        head = b""
        async for chunk in chunks:
            if len(head) < 3:
                head += bytes(chunk[: 3 - len(head)])
            view = memoryview(chunk)
            while view:
                if room == 0:
                    if sent >= total:
                        protocol.abort()
                        raise ValueError(f"send_stream: the chunks hold more than the announced {total} bytes")
                    room = min(MAX_CHUNK, total - sent)
                    protocol.write(_U32.pack(room | seq << 24))
                    seq = (seq + 1) & 0xFF
                piece = view[:room]
                protocol.write(piece)
                room -= len(piece)
                sent += len(piece)
                view = view[len(piece) :]
            await protocol.drain(timeout)
        if sent != total or room:
            protocol.abort()
            raise ValueError(f"send_stream: the chunks hold {sent} bytes, {total} were announced")
        if total % MAX_CHUNK == 0:  # ends on a packet boundary (or is empty): the terminating short packet
            protocol.write(_U32.pack(seq << 24))
            seq = (seq + 1) & 0xFF
        self._seq = 1 if self.semi_sync and head == _SEMI_SYNC_ACK_REQUESTED else seq
        await protocol.drain(timeout)

    async def receive(self, timeout: float | None = None) -> bytes | None:
        """The next payload from the replica (a semi-sync ACK: 0xEF, position u64, file name), None after `timeout`
        seconds without one. Raises ClientConnectionLost once the replica is gone."""
        self.flush()  # what the replica is to acknowledge must be on the wire before we wait for its ACK
        try:
            _, payload = await self._protocol.read(timeout)
        except TimeoutError:
            return None
        except MySQLError as exc:
            raise ClientConnectionLost(f"replica sent a broken packet: {exc.message}") from exc
        return payload


# -- one connection -----------------------------------------------------------------------------------------------


class ConnectErrors:
    """Connection errors per client host (MySQL's and MariaDB's max_connect_errors, sans-I/O): after `limit`
    consecutive handshake errors a host is blocked (new connections get 1129 before the greeting) until ``flush()``
    (FLUSH HOSTS) or, when `block_seconds` > 0, until that long has passed; a successful login resets the host's
    count. Connections that already logged in, and other hosts, are never affected. At most `max_hosts` hosts are
    remembered (the least recently failing is forgotten first), so a client spraying addresses cannot grow it
    without bound.

    What counts is what the servers count (Host_errors::sum_connect_errors: only handshake errors): a connection
    that ends before its credentials were checked (closed, bad or timed-out handshake, TLS failure). A wrong
    password or unknown account is an authentication error, which the servers do not count here (LoginThrottle
    slows those down instead), and a loopback client (127.0.0.1, ::1) is never counted nor blocked."""

    def __init__(self, limit: int = DEFAULT_MAX_CONNECT_ERRORS, block_seconds: float = DEFAULT_HOST_BLOCK_TIME,
                 *, max_hosts: int = _HOST_CACHE_SIZE, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"max_connect_errors must be at least 1, got {limit}")
        self.limit = limit
        self.block_seconds = block_seconds
        self.max_hosts = max_hosts
        self._clock = clock
        self._errors: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._blocked: dict[str, float] = {}  # host -> clock() when it was blocked

    @staticmethod
    def counted(host: str) -> bool:
        """Whether this host's connection errors count at all (not for the loopback addresses, as the servers)."""
        return host not in _LOOPBACK

    def blocked(self, host: str) -> bool:
        since = self._blocked.get(host)
        if since is None:
            return False
        if self.block_seconds > 0 and self._clock() - since >= self.block_seconds:
            del self._blocked[host]
            self._errors.pop(host, None)
            return False
        return True

    def failed(self, host: str) -> bool:
        """Count one handshake error; True when it blocks the host (once, at the limit)."""
        if not self.counted(host):
            return False
        count = self._errors.pop(host, 0) + 1
        self._errors[host] = count
        while len(self._errors) > self.max_hosts:
            forgotten, _ = self._errors.popitem(last=False)
            self._blocked.pop(forgotten, None)
        if count >= self.limit and host not in self._blocked:
            self._blocked[host] = self._clock()
            return True
        return False

    def succeeded(self, host: str) -> None:
        self._errors.pop(host, None)

    def count(self, host: str) -> int:
        return self._errors.get(host, 0)

    def flush(self) -> int:
        """FLUSH HOSTS: forget every count and unblock every host; how many were blocked."""
        blocked = len(self._blocked)
        self._errors.clear()
        self._blocked.clear()
        return blocked

    def describe(self) -> dict[str, Any]:
        return {"max_connect_errors": self.limit, "host_block_time": self.block_seconds,
                "hosts_counted": len(self._errors), "hosts_blocked": len(self._blocked)}


class LoginThrottle:
    """Password guessing slowed down per account and client host (MySQL's connection_control, sans-I/O): after
    `threshold` consecutive wrong logins of one user name from one host, the answer to each further attempt of that
    pair (right or wrong) waits ``delay()``: (failures - threshold + 1) x `min_delay`, at most `max_delay`. A
    successful login resets the pair. Never a lockout, and never a delay for another user name or another host.
    `threshold` 0 turns it off. At most `max_keys` pairs are remembered (the least recently failing is forgotten)."""

    def __init__(self, threshold: int = DEFAULT_LOGIN_FAILURES_THRESHOLD, min_delay: float = DEFAULT_LOGIN_MIN_DELAY,
                 max_delay: float = DEFAULT_LOGIN_MAX_DELAY, *, max_keys: int = _THROTTLE_KEYS) -> None:
        if threshold < 0:
            raise ValueError(f"login_failures_threshold must be 0 (off) or more, got {threshold}")
        if not 0 < min_delay <= max_delay:
            raise ValueError(f"login_min_delay ({min_delay:g}s) must be positive and at most login_max_delay "
                             f"({max_delay:g}s)")
        self.threshold = threshold
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.max_keys = max_keys
        self._failures: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()
        self.failed_logins = 0  # wrong logins counted since the start
        self.delayed_logins = 0  # logins whose answer was delayed since the start
        self.delaying = 0  # logins being delayed now

    def failures(self, user: str, host: str) -> int:
        return self._failures.get((user, host), 0)

    def delay(self, user: str, host: str) -> float:
        """Seconds the answer to this login attempt waits (0: at once)."""
        if self.threshold == 0:
            return 0.0
        over = self._failures.get((user, host), 0) - self.threshold + 1
        return 0.0 if over <= 0 else min(over * self.min_delay, self.max_delay)

    def failed(self, user: str, host: str) -> None:
        if self.threshold == 0:
            return
        self.failed_logins += 1
        key = (user, host)
        self._failures[key] = self._failures.pop(key, 0) + 1
        while len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)

    def succeeded(self, user: str, host: str) -> None:
        self._failures.pop((user, host), None)

    def describe(self, limit: int = 10) -> dict[str, Any]:
        """For /status: the settings, the counters, and the `limit` pairs with the most consecutive failures among
        those being delayed (user names shortened: they are the client's)."""
        throttled = [(n, key) for key, n in self._failures.items() if self.threshold and n >= self.threshold]
        throttled.sort(key=lambda item: -item[0])
        return {
            "login_failures_threshold": self.threshold,
            "login_min_delay": self.min_delay,
            "login_max_delay": self.max_delay,
            "failed_logins": self.failed_logins,
            "delayed_logins": self.delayed_logins,
            "delaying_now": self.delaying,
            "throttled_accounts": len(throttled),
            "most_failing": [
                {"user": _short(user), "host": host, "consecutive_failures": n, "next_delay": self.delay(user, host)}
                for n, (user, host) in throttled[:limit]
            ],
        }


class _Session:
    """One client, from the greeting to the close: handshake, authentication, then its commands in order."""

    def __init__(self, server: DownstreamServer, protocol: ClientProtocol, conn_id: int) -> None:
        self.server = server
        self.protocol = protocol
        self.ctx = server.ctx
        self.state = ConnectionState(conn_id=conn_id, host=protocol.peer_host)
        self.capabilities = 0
        self._seq = 0  # the sequence id of our next packet
        self.task: asyncio.Task[None] | None = None
        self.host = protocol.peer_host
        self.started = time.monotonic()
        self.refusal: str | None = None  # set by the server: refuse with 1040 before the greeting
        self.blocked = False  # set by the server: the host is blocked (1129 before the greeting)
        self.greeted = False  # the greeting went out: leaving before the credentials are checked is a handshake error
        self.credentials_checked = False  # the login reached a verdict on the credentials (right or wrong)
        self.logged_in = False
        self.counted = False  # holds a slot in the server's counts
        self.evicted = False
        self.dumping: tuple[str, object] | None = None  # ("uuid", uuid) or ("server_id", id) while a dump runs
        self._log = log.bind(conn_id=conn_id, client=f"{protocol.peer_host}:{protocol.peer_port}")

    @property
    def conn_id(self) -> int:
        return self.state.conn_id

    def evict(self) -> None:
        """Drop this not-yet-authenticated connection to make room (1040 when it can still be told)."""
        self.evicted = True
        self.server._release(self)
        if self.protocol.tls is None:
            with contextlib.suppress(Exception):
                self._write([encode_error(ER_CON_COUNT_ERROR, "08004", "Too many connections")])
        if self.task is not None:
            self.task.cancel()

    # -- packet I/O ----------------------------------------------------------------------------------------------

    def _write(self, payloads: Sequence[bytes]) -> None:
        for payload in payloads:
            self.protocol.write(encode_packet(payload, self._seq))
            self._seq = (self._seq + packet_count(len(payload))) & 0xFF

    async def _send(self, payloads: Sequence[bytes]) -> None:
        self._write(payloads)
        await self.protocol.drain(self.server.write_timeout)

    async def _read(self, timeout: float | None, *, new_command: bool = False) -> bytes:
        """The client's next payload; its sequence id must follow ours (0 at a new command)."""
        seq, payload = await self.protocol.read(timeout)
        if len(payload) > self.protocol.decoder.max_payload:
            # The decoder refuses a packet over the limit while it is still arriving; one that arrived whole in
            # a single read is refused here (the decoder's fast path is the upstream hot loop: no check there).
            raise MySQLError(CR_NET_PACKET_TOO_LARGE, "08S01", "Got a packet bigger than 'max_allowed_packet' bytes")
        first = 0 if new_command else self._seq
        expected = (first + packet_count(len(payload)) - 1) & 0xFF
        if seq != expected:
            message = f"Got packets out of order: sequence id {seq}, expected {expected}"
            raise MySQLError(ER_NET_PACKETS_OUT_OF_ORDER, "08S01", message)
        self._seq = (seq + 1) & 0xFF
        return payload

    def _note(self, level: str, event: str, **fields: Any) -> None:
        """One log line caused by this client, within its host's budget (PeerLogLimiter)."""
        suppressed = self.server.log_limiter.admit(self.protocol.peer_host)
        if suppressed is None:
            return
        if suppressed:
            fields["suppressed_before"] = suppressed
        getattr(self._log, level)(event, **fields)

    def _internal_error(self, exc: BaseException, what: str) -> bytes:
        """A bug, not the client's doing: one log line with a reference id (no traceback: a client that can
        trigger it could fill the disk; the traceback is at debug level), and the ERR the client gets, naming
        the same reference."""
        ref = report_failure(self._log, self.server.log_limiter, self.protocol.peer_host, what, exc)
        return encode_error(ER_UNKNOWN_ERROR, "HY000", _INTERNAL_ERROR.format(ref=ref))

    async def _fail(self, code: int, sqlstate: str, message: str) -> NoReturn:
        """Answer with an ERR packet (best effort) and end the connection."""
        with contextlib.suppress(ConnectionError, MySQLError, RuntimeError):
            await self._send([encode_error(code, sqlstate, message)])
        raise _Close

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def run(self) -> None:
        server = self.server
        self.ctx.connections[self.conn_id] = self.state
        try:
            if self.blocked:
                self._note("info", "connection refused: host blocked after failed logins",
                           max_connect_errors=server.connect_errors.limit)
                tool = "mariadb-admin" if self.ctx.flavour == "mariadb" else "mysqladmin"
                await self._fail(ER_HOST_IS_BLOCKED, "HY000", f"Host '{self.host[:64]}' is blocked because of many "
                                 f"connection errors; unblock with '{tool} flush-hosts'")
            if self.refusal is not None:
                self._note("warning", "connection refused: too many connections", reason=self.refusal)
                await self._fail(ER_CON_COUNT_ERROR, "08004", "Too many connections")
            await self._handshake()
            await self._command_loop()
        except _Close:
            pass
        except asyncio.CancelledError:
            # the server is closing, kill(), or a newer connection took this one's unauthenticated slot
            if self.evicted:
                self._note("info", "connection dropped: not logged in while the unauthenticated budget was full")
        except ClientConnectionLost as exc:
            self._log.debug("client gone", reason=str(exc))
        except MySQLError as exc:
            self._note("info", "closing connection after a protocol error", error=str(exc)[:200])
            with contextlib.suppress(_Close):
                await self._protocol_error(exc)
        except Exception as exc:
            error = self._internal_error(exc, "internal error serving client; closing its connection")
            with contextlib.suppress(ConnectionError, MySQLError, RuntimeError, asyncio.CancelledError):
                await self._send([error])
        finally:
            if self.greeted and not self.credentials_checked and not self.evicted and not server._closing:
                server._handshake_failed(self)  # what the servers count toward max_connect_errors
            self.ctx.connections.pop(self.conn_id, None)
            server._release(self)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self.protocol.close()
            self._log.debug("connection closed", user=self.state.user or None)

    async def _protocol_error(self, exc: MySQLError) -> NoReturn:
        if exc.code == CR_NET_PACKET_TOO_LARGE:
            if self.logged_in:
                self._seq = 1  # the reply to a command's first packet (sequence 0), as the servers number it
            await self._fail(ER_NET_PACKET_TOO_LARGE, "08S01", "Got a packet bigger than 'max_allowed_packet' bytes")
        if exc.code < 2000:  # a server error code: send it as it is
            await self._fail(exc.code, exc.sqlstate if len(exc.sqlstate) == 5 else "HY000", exc.message)
        await self._fail(ER_MALFORMED_PACKET, "HY000", f"Malformed communication packet: {exc.message}")

    # -- connection phase ----------------------------------------------------------------------------------------

    async def _handshake(self) -> None:
        server = self.server
        timeout = server.handshake_timeout
        try:
            async with asyncio.timeout(timeout):
                step, response = await self._authenticate()
        except TimeoutError:
            self._note("info", "handshake timed out", seconds=timeout)
            if self.protocol.tls is not None and not self.protocol.tls.handshake_complete:
                raise _Close from None  # no way to send an ERR mid-TLS-handshake
            await self._fail(ER_HANDSHAKE_ERROR, "08S01", f"Bad handshake: no complete handshake within {timeout:g}s")
        # The throttle's delay is not part of the handshake: it is the relay's doing, not the client's.
        await self._answer_login(step, response)

    async def _hold(self, seconds: float) -> None:
        """Wait before answering a throttled login: the task sleeps (nothing runs for it), the socket is not read (a
        client cannot make the relay buffer for it meanwhile), and it keeps its unauthenticated slot, so a newcomer
        may still take that slot (evict) when the budget is full."""
        throttle = self.server.login_throttle
        throttle.delayed_logins += 1
        throttle.delaying += 1
        self.protocol.hold_reading()
        try:
            await asyncio.sleep(seconds)
        finally:
            throttle.delaying -= 1
            self.protocol.release_reading()

    async def _answer_login(self, step: AuthAccepted | AuthRejected, response: Any) -> None:
        """The verdict on the credentials: counted by the login throttle (per user name and host), delayed when that
        pair has failed too often, then answered: 1045 and closed, or the login goes on."""
        server = self.server
        throttle = server.login_throttle
        user, host = response.user, self.host
        secure = self.protocol.tls is not None
        credentials = isinstance(step, AuthAccepted) or step.error.code == ER_ACCESS_DENIED_ERROR
        delay = 0.0
        if credentials:
            self.credentials_checked = True  # right or wrong: not a handshake error (max_connect_errors)
            delay = throttle.delay(user, host)
            if isinstance(step, AuthRejected):
                throttle.failed(user, host)  # before the delay: attempts made meanwhile see it
            if delay > 0:
                await self._hold(delay)
        if isinstance(step, AuthRejected):
            self._note("warning", "login refused", user=_short(response.user), reason=step.reason, tls=secure,
                       consecutive_failures=throttle.failures(user, host) or None,
                       delayed=round(delay, 3) if delay else None)
            error = step.error
            await self._fail(error.code, error.sqlstate, error.message)
        assert isinstance(step, AuthAccepted)
        self.logged_in = True  # the credentials were good: not a failed login, whatever follows
        throttle.succeeded(user, host)
        server.connect_errors.succeeded(self.host)
        refusal = server._logged_in(self, step.user)
        if refusal is not None:
            self._note("warning", "login refused: too many connections", user=_short(step.user.name), reason=refusal)
            await self._fail(ER_CON_COUNT_ERROR, "08004", "Too many connections")
        state = self.state
        state.user = step.user.name
        state.account = step.user
        state.tls = secure
        state.database = response.database
        state.capabilities = self.capabilities
        self.protocol.decoder.max_payload = server.max_packet
        await self._send([*step.packets, encode_ok()])
        # Debug, not info: HA managers and monitoring log in every few seconds.
        self._log.debug(
            "client logged in",
            user=step.user.name,
            plugin=step.plugin,
            tls=secure,
            tls_version=self.protocol.tls.version if self.protocol.tls else None,
            program=_short(response.connect_attrs.get("program_name") or response.connect_attrs.get("_client_name")),
        )

    async def _authenticate(self) -> tuple[AuthAccepted | AuthRejected, Any]:
        """Greeting, TLS, handshake response and the authentication exchange, up to the verdict (not sent yet)."""
        server = self.server
        ctx = self.ctx
        flavour = ctx.flavour
        version = greeting_version(ctx.server_version, flavour)
        tls_offered = server.tls_context is not None
        caps = server_capabilities(tls=tls_offered)
        scramble = generate_scramble()
        self.greeted = True
        await self._send(
            [
                build_greeting(
                    server_version=version,
                    connection_id=self.conn_id,
                    scramble=scramble,
                    capabilities=caps,
                    auth_plugin=default_auth_plugin(flavour),
                    charset=greeting_charset(version, flavour),
                )
            ]
        )
        try:
            response = parse_handshake_response(await self._read(None), caps)
            if isinstance(response, SslRequest):
                if not tls_offered:
                    raise HandshakeError("the client asked for TLS, but this server has no TLS certificate configured")
                await self._start_tls()
                response = parse_handshake_response(await self._read(None), caps)
                if isinstance(response, SslRequest):
                    raise HandshakeError("a second SSLRequest after TLS was established")
        except HandshakeError as exc:
            self._note("info", "bad handshake", error=exc.message[:200])
            await self._fail(exc.code, exc.sqlstate, exc.message)
        secure = self.protocol.tls is not None
        self.capabilities = response.capabilities & caps & ~(0 if secure else CLIENT_SSL)
        auth = ServerAuthentication(
            server.users_for,
            scramble=scramble,
            client_host=self.protocol.peer_host,
            secure=secure,
            rsa_key=server.rsa_key,
            sha2_cache=server.sha2_cache,
            default_plugin=default_auth_plugin(self.server.ctx.flavour),
        )
        step = auth.start(response)
        while isinstance(step, SendAuthPackets):
            await self._send(step.packets)
            step = auth.receive(await self._read(None))
        return step, response

    async def _start_tls(self) -> None:
        handshake = self.protocol.tls_handshake
        assert handshake is not None
        try:
            await handshake
        except ssl.SSLError as exc:
            self._note("info", "TLS handshake failed", error=getattr(exc, "reason", None) or str(exc)[:200])
            raise _Close from None

    # -- command phase -------------------------------------------------------------------------------------------

    async def _command_loop(self) -> None:
        server = self.server
        while True:
            try:
                payload = await self._read(server.idle_timeout, new_command=True)
            except TimeoutError:
                self._note("info", "idle timeout", seconds=server.idle_timeout)
                self._seq = 0  # not a reply: a new exchange, as MySQL 8.0.24+ sends it
                await self._fail(
                    ER_CLIENT_INTERACTION_TIMEOUT,
                    "HY000",
                    "The client was disconnected by the server because of inactivity.",
                )
            if not payload:
                await self._fail(ER_MALFORMED_PACKET, "HY000", "Malformed communication packet: empty command")
            command = payload[0]
            if command == COM_QUERY:
                await self._query(payload)
            elif command == COM_PING:
                await self._send([encode_ok()])
            elif command == COM_QUIT:
                raise _Close
            elif command == COM_INIT_DB:
                await self._init_db(payload)
            elif command == COM_REGISTER_SLAVE:
                if await self._refused(privileges.REGISTER, "COM_REGISTER_SLAVE"):
                    continue
                await self._register_slave(payload)
            elif command == COM_BINLOG_DUMP:
                if await self._refused(privileges.DUMP, "COM_BINLOG_DUMP"):
                    continue
                await self._dump(parse_binlog_dump(payload, self.state))
                raise _Close  # as MySQL: the connection ends with the dump
            elif command == COM_BINLOG_DUMP_GTID:
                if await self._refused(privileges.DUMP, "COM_BINLOG_DUMP_GTID"):
                    continue
                await self._dump(parse_binlog_dump_gtid(payload))
                raise _Close
            else:
                name = _COMMAND_NAMES.get(command, "command")
                message = f"Unknown command: {name} (0x{command:02x}) is not supported by relayproxy"
                await self._send([encode_error(ER_UNKNOWN_COM_ERROR, "08S01", message)])

    async def _refused(self, action: privileges.Action, command: str) -> bool:
        """Answer ERR 1227 (the connection stays, as on the servers) when the account lacks the privilege."""
        denied = privileges.denial(self.ctx, self.state, action)
        if denied is None:
            return False
        self._note("info", "command refused: missing privilege", command=command, user=_short(self.state.user),
                   privilege=action.privilege)
        await self._send([encode_error(*denied)])
        return True

    async def _query(self, payload: bytes) -> None:
        sql_text = payload[1:].decode("utf-8", "surrogateescape")
        try:
            response = self.server.sql(self.ctx, self.state, sql_text)
            if inspect.isawaitable(response):
                response = await response
        except MySQLError as exc:
            response = ErrorResponse(exc.code, exc.sqlstate, exc.message)
        if isinstance(response, CloseConnection):
            self._note("warning", "closed the connection without an answer", reason=response.reason,
                       statement=sql_text[:200])
            raise _Close
        await self._send(encode_response(response, capabilities=self.capabilities, status=SERVER_STATUS_AUTOCOMMIT))

    async def _init_db(self, payload: bytes) -> None:
        name = payload[1:].decode("utf-8", "replace").rstrip("\0")
        if not name:
            await self._send([encode_error(ER_NO_DB_ERROR, "3D000", "No database selected")])
            return
        self.state.database = name
        await self._send([encode_ok()])

    async def _register_slave(self, payload: bytes) -> None:
        try:
            registration = parse_register_slave(payload, master_server_id=self.ctx.server_id)
        except ProtocolError as exc:
            await self._fail(ER_MALFORMED_PACKET, "HY000", f"Malformed communication packet: {exc.message}")
        self.state.registration = registration
        self._log.info(
            "replica registered", server_id=registration.server_id, report_host=registration.host,
            report_port=registration.port,
        )
        await self._send([encode_ok()])

    async def _dump(self, request: DumpRequest) -> None:
        """Run the dump sender until it returns, fails, or the replica goes away (then it is cancelled, so that a
        sender waiting for new transactions does not outlive its reader)."""
        state = self.state
        if state.dump is None:
            state.dump = DumpProgress(file=request.file or None, position=request.position, mode=request.kind)
        self._log.info(
            "binlog dump requested", kind=request.kind, file=request.file, position=request.position,
            server_id=request.server_id, flags=request.flags,
        )
        self.dumping = _replica_identity(state, request)
        self.server._end_older_dumps(self)
        pool = self.server.senders
        if pool is not None:
            try:
                handed = await self._hand_off(pool, request)
            except BaseException:
                self.dumping = None
                raise
            if handed:
                self.dumping = None
                return
        channel = ClientDumpChannel(self.protocol, self.server.write_timeout, self._seq)
        task = asyncio.ensure_future(self.server.dump(self.ctx, state, request, channel))
        try:
            closed, ended = self.protocol.closed, self.protocol.input_ended
            await asyncio.wait({task, closed, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and ended.done() and not closed.done():
                # The replica half-closed: it reads no more events. A reply the sender is about to give (an
                # ERR for a bad request) still goes out; a sender waiting for new transactions is stopped.
                await asyncio.wait({task, closed}, timeout=_HALF_CLOSE_GRACE)
        finally:
            self.dumping = None
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            channel.flush()  # whatever the sender framed last (EOF, ERR) goes out before the session moves on
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or isinstance(exc, ClientConnectionLost):
            with contextlib.suppress(ConnectionError):
                await self.protocol.drain(self.server.write_timeout)
            return
        if isinstance(exc, MySQLError):
            self._note("info", "binlog dump ended with an error", error=str(exc)[:300])
            message = encode_error(exc.code, exc.sqlstate if len(exc.sqlstate) == 5 else "HY000", exc.message)
        else:
            message = self._internal_error(exc, "binlog dump sender failed")
        with contextlib.suppress(ConnectionError):
            await channel.send_final(message)


    async def _hand_off(self, pool: SenderProcesses, request: DumpRequest) -> bool:
        """Serve the dump from a sender process (workers.py) when it can be moved there: a plain connection (a
        TLS session cannot change process), no semi-sync (its ACKs belong to this process's tracker), nothing
        read from the replica past the dump command. False: serve it here."""
        from .dump.start import _truthy, _user_var

        protocol, state = self.protocol, self.state
        transport = protocol.transport
        semi_sync = _truthy(_user_var(state.user_vars, "rpl_semi_sync_replica", "rpl_semi_sync_slave"))
        if protocol.tls is not None or (semi_sync and self.ctx.settings.semi_sync):
            return False
        if transport is None or transport.is_closing():
            return False
        worker = pool.pick()
        if worker is None:
            return False
        # Everything this process wrote must be on the wire first: the worker numbers packets on from here.
        await protocol.drain(self.server.write_timeout)
        deadline = time.monotonic() + self.server.write_timeout
        while transport.get_write_buffer_size() and time.monotonic() < deadline and not transport.is_closing():
            await asyncio.sleep(0.001)
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        transport.pause_reading()
        sock = transport.get_extra_info("socket")
        if protocol._ready or protocol.decoder.pending_bytes or protocol.error is not None or sock is None:
            transport.resume_reading()  # the replica already sent more: this process reads it
            return False
        fd = os.dup(sock.fileno())
        ticket = {
            "conn_id": self.conn_id, "user": state.user, "host": state.host, "capabilities": state.capabilities,
            "user_vars": dict(state.user_vars), "session_vars": dict(state.session_vars), "seq": self._seq,
            "kind": request.kind, "server_id": request.server_id, "flags": request.flags, "file": request.file,
            "position": request.position, "gtid_set": request.gtid_set,
        }
        self._log.info("binlog dump handed to a sender process", slot=worker.slot, pid=worker.process.pid)
        handing = asyncio.ensure_future(pool.hand_off(worker, ticket, fd, state.dump))
        protocol.abort()  # this process's descriptor only: the worker holds the connection now
        await handing
        return True

# -- command parsing (sans-I/O) -----------------------------------------------------------------------------------


def _replica_identity(state: ConnectionState, request: DumpRequest) -> tuple[str, object] | None:
    """Who is dumping, for ending a zombie dump as the servers do: the replica's UUID when it set @slave_uuid /
    @replica_uuid (MySQL's kill_zombie_dump_threads), else its server_id (MariaDB's; MySQL's without a UUID);
    None for server_id 0 without a UUID (mysqlbinlog / mariadb-binlog: several may run at once)."""
    uuid = state.user_vars.get("replica_uuid") or state.user_vars.get("slave_uuid")
    if isinstance(uuid, (bytes, bytearray)):
        uuid = bytes(uuid).decode("utf-8", "replace")
    if uuid:
        return ("uuid", str(uuid).strip().lower())
    if request.server_id:
        return ("server_id", request.server_id)
    return None


def parse_register_slave(payload: bytes, *, master_server_id: int = 0) -> ReplicaRegistration:
    """COM_REGISTER_SLAVE (protocol-reference §3.6). The reported password is read past and dropped: the relay has
    no use for it and must not keep it. A master_id of 0 means this server, as in MySQL."""
    pos = 1
    try:
        server_id = _U32.unpack_from(payload, pos)[0]
        pos += 4
        fields = []
        for what in ("report_host", "report_user", "report_password"):
            if pos >= len(payload):
                raise ProtocolError(f"COM_REGISTER_SLAVE ends before {what}")
            length = payload[pos]
            value = payload[pos + 1 : pos + 1 + length]
            if len(value) != length:
                raise ProtocolError(f"COM_REGISTER_SLAVE {what} runs past the packet end")
            fields.append(value)
            pos += 1 + length
        port = _U16.unpack_from(payload, pos)[0]
        rank, master_id = struct.unpack_from("<II", payload, pos + 2)
    except struct.error:
        raise ProtocolError(
            f"COM_REGISTER_SLAVE is {len(payload)} bytes, too short for server_id, host, user, password, port, rank "
            "and master_id"
        ) from None
    host, user = (raw.decode("utf-8", "replace") for raw in fields[:2])
    return ReplicaRegistration(
        server_id=server_id, host=host, port=port, user=user, rank=rank, master_id=master_id or master_server_id
    )


def parse_binlog_dump(payload: bytes, state: ConnectionState | None = None) -> DumpRequest:
    """COM_BINLOG_DUMP (§3.7): kind "mariadb-gtid" when the connection has set @slave_connect_state (a MariaDB
    replica in GTID mode, which sends position 4 and no file name), "file" otherwise."""
    if len(payload) < 1 + _DUMP_HEAD.size:
        raise ProtocolError(f"COM_BINLOG_DUMP is {len(payload)} bytes, at least 11 expected")
    position, flags, server_id = _DUMP_HEAD.unpack_from(payload, 1)
    file = _file_name(payload[1 + _DUMP_HEAD.size :], "COM_BINLOG_DUMP")
    gtid_mode = state is not None and state.user_vars.get("slave_connect_state") is not None
    return DumpRequest("mariadb-gtid" if gtid_mode else "file", server_id, flags, file, position)


def parse_binlog_dump_gtid(payload: bytes) -> DumpRequest:
    """COM_BINLOG_DUMP_GTID (§3.8): kind "mysql-gtid", `gtid_set` the encoded set as sent (possibly empty)."""
    head = 1 + _DUMP_GTID_HEAD.size
    if len(payload) < head:
        raise ProtocolError(f"COM_BINLOG_DUMP_GTID is {len(payload)} bytes, at least {head} expected")
    flags, server_id, name_size = _DUMP_GTID_HEAD.unpack_from(payload, 1)
    pos = head
    if name_size > len(payload) - pos - 8:
        raise ProtocolError(
            f"COM_BINLOG_DUMP_GTID announces a {name_size}-byte file name, which with the position does not fit "
            f"its {len(payload)} bytes"
        )
    file = _file_name(payload[pos : pos + name_size], "COM_BINLOG_DUMP_GTID")
    pos += name_size
    position = _U64.unpack_from(payload, pos)[0]
    pos += 8
    gtid_set = b""
    if pos < len(payload):
        if len(payload) - pos < 4:
            raise ProtocolError("COM_BINLOG_DUMP_GTID ends inside the GTID set's data size")
        data_size = _U32.unpack_from(payload, pos)[0]
        pos += 4
        if data_size != len(payload) - pos:
            raise ProtocolError(
                f"COM_BINLOG_DUMP_GTID announces a {data_size}-byte GTID set, the packet has {len(payload) - pos} "
                "bytes left"
            )
        gtid_set = bytes(payload[pos:])
    return DumpRequest("mysql-gtid", server_id, flags, file, position, gtid_set)


def _file_name(raw: bytes, what: str) -> str:
    # Some clients send the name NUL-terminated or NUL-padded; MySQL reads it as a C string.
    raw = raw.split(b"\0", 1)[0]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what}: the binlog file name is not valid UTF-8") from None


# -- the server ---------------------------------------------------------------------------------------------------


class DownstreamServer:
    """The relay's listener for replicas, mariadb-binlog, CDC tools and HA managers.

    `users`: the accounts (DownstreamUser); `tls_context`: a server SSLContext (server_tls_context()) to offer
    TLS, None for plaintext only; `sql(ctx, conn_state, sql_text)` answers COM_QUERY with a Response, directly or
    as a coroutine (default relayproxy.downstream.sql.execute); a MySQLError it raises is sent as ERR, anything
    else ends the connection with 1105; `dump(ctx, conn_state, request, channel)` serves a binlog dump (default
    relayproxy.downstream.dump.serve_dump); `rsa_key` decrypts caching_sha2_password full authentication
    without TLS (a 2048-bit key is generated when None).

    Limits: `handshake_timeout` for greeting-to-OK, `idle_timeout` between commands (not during a dump),
    `write_timeout` for a client that stops reading (net_write_timeout), `net_read_timeout` for a client that
    stops in the middle of a packet (1159, then closed), `max_packet` for a client's command (default: the
    configuration's max_statement_bytes, which @@max_allowed_packet reports), `max_buffered` unread
    client bytes before reading pauses, `log_lines_per_host` per minute (PeerLogLimiter).

    Connections: `max_connections` logged-in clients plus one more for an admin account (MySQL's extra
    connection for SUPER / CONNECTION_ADMIN), checked after authentication as MySQL does: 1040 "Too many
    connections". Clients that have not logged in yet have their own budget, `max_unauthenticated` (at most
    `max_connections`), and `handshake_timeout`: when it is full, a newcomer takes the slot of the oldest one that
    has held it for `unauthenticated_grace` seconds (dropped with 1040), else it gets 1040 before the greeting;
    so idle sockets cannot lock logins out. `max_connections_per_host` (0: no cap) counts every connection of
    one client address, refused with 1040 before the greeting (the user is not known yet: not 1203, which
    is MySQL's per-account max_user_connections).

    Connection errors: `max_connect_errors` consecutive connections from one host that end before their
    credentials were checked (handshake errors, what the servers count; never from 127.0.0.1 or ::1) block that host
    (1129 before the greeting, as the servers) until FLUSH HOSTS (``ctx.flush_hosts``, admin) or, when
    `host_block_time` > 0, for that many seconds; a successful login resets the count (ConnectErrors).

    Wrong passwords: after `login_failures_threshold` consecutive wrong logins of one user name from one host, the
    answer to each further attempt of that pair waits 1, 2, 3... x `login_min_delay`, at most `login_max_delay`
    (MySQL's connection_control; LoginThrottle); a successful login resets it.
    """

    def __init__(
        self,
        ctx: DownstreamContext,
        users: Sequence[DownstreamUser],
        *,
        tls_context: ssl.SSLContext | None = None,
        sql: SqlExecutor | None = None,
        dump: DumpServer | None = None,
        rsa_key: RsaKeyPair | None = None,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        net_read_timeout: float = DEFAULT_NET_READ_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_host: int = DEFAULT_MAX_CONNECTIONS_PER_HOST,
        max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
        unauthenticated_grace: float = DEFAULT_UNAUTHENTICATED_GRACE,
        max_packet: int | None = None,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        log_lines_per_host: int = DEFAULT_LOG_LINES_PER_HOST,
        max_connect_errors: int = DEFAULT_MAX_CONNECT_ERRORS,
        host_block_time: float = DEFAULT_HOST_BLOCK_TIME,
        login_failures_threshold: int = DEFAULT_LOGIN_FAILURES_THRESHOLD,
        login_min_delay: float = DEFAULT_LOGIN_MIN_DELAY,
        login_max_delay: float = DEFAULT_LOGIN_MAX_DELAY,
    ) -> None:
        # Imported here rather than at the top: they bring in the store and the binlog code, which a server
        # built with stand-ins (tests, tools) does not need.
        if sql is None:
            from .sql import execute as sql
        if dump is None:
            from .dump import serve_dump as dump
        self.ctx = ctx
        self.tls_context = tls_context
        self.sql: SqlExecutor = sql
        self.dump: DumpServer = dump
        self.rsa_key = rsa_key or RsaKeyPair.generate()
        self.sha2_cache = Sha2Cache()
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self.net_read_timeout = net_read_timeout
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        self.max_unauthenticated = max_unauthenticated
        self.unauthenticated_grace = unauthenticated_grace
        # A client's command packet at most (1153 and closed beyond, as the servers): @@max_allowed_packet, which
        # is max_statement_bytes unless a caller (a test) sets it.
        self.max_packet = max_packet if max_packet is not None else max_statement_bytes(ctx)
        self.max_buffered = max_buffered
        self.log_limiter = PeerLogLimiter(log_lines_per_host, 60.0)
        self.connect_errors = ConnectErrors(max_connect_errors, host_block_time)
        self.login_throttle = LoginThrottle(login_failures_threshold, login_min_delay, login_max_delay)
        ctx.kill_connection = self.kill
        ctx.flush_hosts = self.connect_errors.flush
        self._server: asyncio.AbstractServer | None = None
        self._sessions: dict[int, _Session] = {}
        self.senders: SenderProcesses | None = None  # dumps served by sender processes (workers.py), when configured
        self._unauthenticated: dict[int, _Session] = {}  # oldest first
        self._per_host: collections.Counter[str] = collections.Counter()
        self._ids = itertools.count(1)
        self._closing = False
        self._users: tuple[DownstreamUser, ...] = ()
        self.set_users(users)

    def __repr__(self) -> str:
        listening = self._server is not None and self._server.is_serving()
        where = "%s:%d" % self.address if listening else "not listening"
        return f"<DownstreamServer {where} connections={len(self._sessions)} tls={self.tls_context is not None}>"

    # -- accounts ------------------------------------------------------------------------------------------------

    @property
    def users(self) -> tuple[DownstreamUser, ...]:
        return self._users

    def set_users(self, users: Sequence[DownstreamUser]) -> None:
        """Replace the accounts (e.g. on a configuration reload); open connections are not affected. A changed
        password drops out of the caching_sha2 fast-auth cache by itself (Sha2Cache.lookup)."""
        users = tuple(users)
        if self.tls_context is None:
            needing = [u.account for u in users if u.tls == "required"]
            if needing:
                accounts = ", ".join(needing)
                raise ValueError(
                    f"account(s) {accounts} require TLS, but no TLS certificate is configured for the listener"
                )
        self._users = users

    def users_for(self, name: str, client_host: str) -> DownstreamUser | None:
        """The account `name` logs in as from `client_host` (None: no such account)."""
        return find_user(self._users, name, client_host)

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the server is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def connection_count(self) -> int:
        return len(self._sessions)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on host:port (port 0 picks a free one); returns the address actually bound."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(self._new_protocol, host, port, reuse_address=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        address = self.address
        log.info("listening for replicas", host=address[0], port=address[1], tls=self.tls_context is not None,
                 users=len(self._users))
        return address

    def _new_protocol(self) -> ClientProtocol:
        return ClientProtocol(max_buffered=self.max_buffered, net_read_timeout=self.net_read_timeout,
                              tls_context=self.tls_context, on_connected=self._accept)

    def _accept(self, protocol: ClientProtocol) -> _Session | None:
        if self._closing:
            protocol.abort()
            return None
        conn_id = next(self._ids)
        if conn_id > 0xFFFFFFFF:  # the greeting's field is 32 bits
            self._ids = itertools.count(1)
            conn_id = next(self._ids)
        session = _Session(self, protocol, conn_id)
        self._sessions[conn_id] = session
        session.blocked = self.connect_errors.blocked(session.host)
        session.refusal = None if session.blocked else self._admission(session)
        if session.refusal is None and not session.blocked:
            self._unauthenticated[conn_id] = session
            self._per_host[session.host] += 1
            session.counted = True
        session.task = asyncio.get_running_loop().create_task(session.run(), name=f"downstream-conn-{conn_id}")
        return session

    def _admission(self, session: _Session) -> str | None:
        """Why a new connection is refused before its greeting (None: it may try to log in)."""
        host = session.host
        cap = self.max_connections_per_host
        if cap > 0 and self._per_host[host] >= cap:
            return f"{self._per_host[host]} connections from this host (max_connections_per_host = {cap})"
        if self.authenticated_count >= self.max_connections + 1:
            return f"{self.authenticated_count} clients logged in (max_connections = {self.max_connections}, +1 admin)"
        budget = max(1, min(self.max_unauthenticated, self.max_connections))
        if len(self._unauthenticated) < budget:
            return None
        oldest = next(iter(self._unauthenticated.values()))
        if time.monotonic() - oldest.started < self.unauthenticated_grace:
            return f"{len(self._unauthenticated)} connections not logged in yet (max_unauthenticated_connections)"
        oldest.evict()
        return None

    def _logged_in(self, session: _Session, user: DownstreamUser) -> str | None:
        """Move an authenticated session to the logged-in count; why not (None: it may), MySQL's rule: beyond
        max_connections only an admin account, and only one."""
        count = self.authenticated_count
        if count >= self.max_connections + 1 or (count >= self.max_connections and not user.has(privileges.ADMIN)):
            return f"{count} clients logged in (max_connections = {self.max_connections}, +1 for an admin account)"
        self._unauthenticated.pop(session.conn_id, None)
        return None

    def _handshake_failed(self, session: _Session) -> None:
        """A connection from `session.host` ended before its credentials were checked (closed, bad or timed-out
        handshake, TLS failure): a handshake error, what the servers count toward max_connect_errors."""
        if self.connect_errors.failed(session.host):
            log.warning("host blocked after failed logins", host=session.host,
                        max_connect_errors=self.connect_errors.limit,
                        block_time=self.connect_errors.block_seconds or "until FLUSH HOSTS")

    def _release(self, session: _Session) -> None:
        self._sessions.pop(session.conn_id, None)
        self._unauthenticated.pop(session.conn_id, None)
        if session.counted:
            session.counted = False
            self._per_host[session.host] -= 1
            if self._per_host[session.host] <= 0:
                del self._per_host[session.host]

    def describe_logins(self) -> dict[str, Any]:
        """/status `logins`: the host blocking (max_connect_errors) and the password throttle, with their counts."""
        return {"host_blocking": self.connect_errors.describe(), "throttle": self.login_throttle.describe()}

    @property
    def authenticated_count(self) -> int:
        """Connections that have logged in (and still hold their slot)."""
        return sum(1 for s in self._sessions.values() if s.counted) - len(self._unauthenticated)

    def _end_older_dumps(self, session: _Session) -> None:
        """A replica that starts a dump while an older one of its own still runs (it reconnected and the old
        TCP connection is not dead yet): end the older one, as MySQL and MariaDB do, with one log line."""
        identity = session.dumping
        if identity is None:
            return
        for other in list(self._sessions.values()):
            if other is not session and other.dumping == identity and self.kill(other.conn_id):
                other.dumping = None
                session._log.info(
                    "ended an older dump of the same replica", older_conn_id=other.conn_id,
                    **{"server_id" if identity[0] == "server_id" else "replica_uuid": identity[1]},
                )

    def kill(self, conn_id: int) -> bool:
        """End one connection (KILL, or a replica reconnecting with the same server_id/UUID); False if unknown."""
        session = self._sessions.get(conn_id)
        if session is None or session.task is None:
            return False
        session.task.cancel()
        return True

    async def close(self) -> None:
        """Stop listening and end every connection (a running dump is cancelled; replicas reconnect later)."""
        self._closing = True
        server = self._server
        if server is not None:
            server.close()
        tasks = [s.task for s in list(self._sessions.values()) if s.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT * 2)
            for session in list(self._sessions.values()):
                session.protocol.abort()
            for task in pending:
                with contextlib.suppress(BaseException):
                    await task
        if server is not None:
            await server.wait_closed()
        log.info("stopped listening for replicas")

    async def __aenter__(self) -> DownstreamServer:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


__all__ = [
    "ClientConnectionLost",
    "ClientDumpChannel",
    "ClientProtocol",
    "ConnectErrors",
    "DownstreamServer",
    "LoginThrottle",
    "DumpServer",
    "SqlExecutor",
    "parse_binlog_dump",
    "parse_binlog_dump_gtid",
    "parse_register_slave",
    "server_tls_context",
]
