"""One asyncio client connection to a master: TCP, optional TLS, authentication, text queries, COM_REGISTER_SLAVE
and the binlog dump stream, on top of the sans-I/O relayproxy.wire (works under uvloop and the default loop)."""

from __future__ import annotations

import asyncio
import collections
import os
import ssl
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from .. import __version__
from ..log import get_logger
from ..wire.tls import MemoryTls
from ..wire.auth import AuthSucceeded, ClientAuthentication, SendAuthData
from ..wire.handshake import (
    HandshakeV10,
    build_handshake_response,
    build_ssl_request,
    client_capabilities,
    parse_handshake,
)
from ..wire.errors import CR_COMMANDS_OUT_OF_SYNC, CR_CONN_HOST_ERROR, CR_SERVER_LOST, CR_SSL_CONNECTION_ERROR
from ..wire.packets import (
    COM_QUIT,
    DEFAULT_MAX_PAYLOAD,
    ERR_HEADER,
    OK_HEADER,
    MySQLError,
    PacketDecoder,
    ProtocolError,
    QueryResult,
    TextResultReader,
    com_binlog_dump,
    com_binlog_dump_gtid,
    com_query,
    com_register_slave,
    encode_packet,
    packet_count,
    parse_err,
)

log = get_logger(__name__)

SSL_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
# Undelivered payload bytes above which the socket stops being read until the consumer catches up: the kernel's
# buffers then fill and TCP slows the master down. (The master drops the dump after its net_write_timeout, 60 s by
# default, if the consumer stalls that long.)
DEFAULT_MAX_BUFFERED = 4 * 1024 * 1024  # flow-control window: 4 MB halves peak RSS with no measured slowdown (benchmarks/results/relay_catchup.md)
_CLOSE_TIMEOUT = 5.0


class ConnectionLost(MySQLError):
    """The connection to the master ended (closed, reset, killed) or broke; CR_SERVER_LOST (2013)."""

    def __init__(self, message: str) -> None:
        super().__init__(CR_SERVER_LOST, "HY000", message)


class _PacketProtocol(asyncio.Protocol):
    """Buffers what the socket delivers (decrypting it when TLS is on) and decodes it in bulk; wakes the single
    reader once payloads are ready.

    Flow control: reading pauses while more than `max_buffered` bytes of complete payloads wait for the consumer
    and resumes when it takes them, so memory stays bounded when the consumer is slower than the master. A single
    payload larger than that (a huge event) is still read in full: the consumer cannot get it otherwise.
    """

    def __init__(self, decoder: PacketDecoder, max_buffered: int, peer: str) -> None:
        self.decoder = decoder
        self.max_buffered = max_buffered
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.tls: MemoryTls | None = None
        self.paused = False
        self.error: BaseException | None = None  # why the stream cannot be trusted / went away
        self.closed = asyncio.get_running_loop().create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._tls_handshake: asyncio.Future[None] | None = None
        # time.monotonic() when the first payload not yet read completed, and that of the last batch read (the
        # hop's receive stage starts there: relay/hoptimes.py)
        self._arrived: float | None = None
        self.batch_arrived: float | None = None

    # -- writer side ---------------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(self.tls.encrypt(data) if self.tls is not None else data)

    def start_tls(self, context: ssl.SSLContext, server_hostname: str) -> asyncio.Future[None]:
        """Begin the TLS handshake (right after the SSLRequest); the future completes with it or its error."""
        assert self.transport is not None and self.tls is None
        self.tls = MemoryTls(context, server_side=False, server_hostname=server_hostname)
        self._tls_handshake = asyncio.get_running_loop().create_future()
        self.transport.write(self.tls.start())
        return self._tls_handshake

    # -- asyncio callbacks ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.error is not None:
            return
        if self.tls is not None:
            data = self._decrypt(data)
            if not data:
                return
        decoder = self.decoder
        try:
            decoder.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if decoder.has_payloads:
            if self._arrived is None:
                self._arrived = time.monotonic()
            if decoder.buffered_bytes > self.max_buffered and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            self._wake()

    def _decrypt(self, data: bytes) -> bytes:
        tls = self.tls
        assert tls is not None and self.transport is not None
        handshake = self._tls_handshake
        try:
            return tls.exchange(data, self.transport.write, handshake)
        except ssl.SSLError as exc:
            if handshake is not None and not handshake.done():
                handshake.set_exception(exc)
                self.transport.abort()
            else:
                detail = getattr(exc, "reason", None) or str(exc)
                self._fail(MySQLError(CR_SSL_CONNECTION_ERROR, "HY000", f"TLS error from {self.peer}: {detail}"))
            return b""

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def eof_received(self) -> bool:
        return False  # a half-closed master is a gone master: let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            reason = f"Lost connection to server {self.peer}"
            reason += f": {exc}" if exc is not None else " (the server closed the connection)"
            pending = self.decoder.pending_bytes
            if pending:
                reason += f"; it ended in the middle of a packet ({pending} bytes of it received)"
            self.error = ConnectionLost(reason)
        handshake = self._tls_handshake
        if handshake is not None and not handshake.done():
            handshake.set_exception(self.error)
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- reader side ---------------------------------------------------------------------------------------------

    async def read_batch(self, timeout: float | None) -> list[bytes]:
        """Every complete payload buffered, waiting for at least one; payloads that arrived before the connection
        broke are delivered first, the error after them."""
        while True:
            payloads = self.take()
            if payloads:
                return payloads
            waiter = asyncio.get_running_loop().create_future()
            self.wake_on_input(waiter)
            try:
                if timeout is None:
                    await waiter
                else:
                    async with asyncio.timeout(timeout):
                        await waiter
            finally:
                self._waiter = None

    def take(self) -> list[bytes]:
        """``read_batch`` without the wait: every complete payload buffered now, none when it would wait; the
        connection's error once nothing it received before breaking is left."""
        payloads = self.decoder.payloads()
        if payloads:
            self.batch_arrived, self._arrived = self._arrived, None
            if self.paused:
                self.paused = False
                if self.transport is not None and not self.transport.is_closing():
                    self.transport.resume_reading()
            return payloads
        if self.error is not None:
            raise self.error
        return payloads

    def wake_on_input(self, future: asyncio.Future[None]) -> None:
        """Complete ``future`` (its result None) once a payload or the connection's error is there to take; the
        caller clears it (``stop_waking``) when it stops waiting. One waiter at a time."""
        if self._waiter is not None:
            raise RuntimeError("another task is already waiting for packets on this connection")
        self._waiter = future

    def stop_waking(self, future: asyncio.Future[None]) -> None:
        if self._waiter is future:
            self._waiter = None


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _ssl_context(
    ssl_mode: str, ssl_ca: str | os.PathLike[str] | None, ssl_cert: str | os.PathLike[str] | None,
    ssl_key: str | os.PathLike[str] | None,
) -> ssl.SSLContext | None:
    """The client TLS context ssl_mode calls for (None for disabled), following the MySQL client's modes:
    preferred/required encrypt without checking who answers, verify_ca checks the chain, verify_identity also the
    host name."""
    if ssl_mode not in SSL_MODES:
        raise ValueError(f"ssl_mode must be one of {', '.join(SSL_MODES)}, got {ssl_mode!r}")
    if ssl_mode == "disabled":
        if ssl_ca or ssl_cert or ssl_key:
            raise ValueError("ssl_ca/ssl_cert/ssl_key given with ssl_mode='disabled'")
        return None
    if ssl_key and not ssl_cert:
        raise ValueError("ssl_key given without ssl_cert")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ssl_mode in ("preferred", "required"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if ssl_ca:
            log.warning("ssl_ca is not used to verify the server with this ssl_mode; use verify_ca", ssl_mode=ssl_mode)
    else:
        context.verify_mode = ssl.CERT_REQUIRED
        context.check_hostname = ssl_mode == "verify_identity"
        if ssl_ca:
            context.load_verify_locations(cafile=os.fspath(ssl_ca))
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if ssl_cert:
        context.load_cert_chain(os.fspath(ssl_cert), os.fspath(ssl_key) if ssl_key else None)
    return context


def _public_key_bytes(server_public_key: bytes | str | os.PathLike[str] | None) -> bytes | None:
    if server_public_key is None or isinstance(server_public_key, bytes):
        return server_public_key
    return Path(server_public_key).read_bytes()


def default_connect_attrs() -> dict[str, str]:
    """Connection attributes we announce (performance_schema.session_connect_attrs on MySQL)."""
    return {
        "_client_name": "relayproxy",
        "_client_version": __version__,
        "_os": sys.platform,
        "_pid": str(os.getpid()),
        "program_name": "relayproxy",
        # What MySQL's own binlog readers announce, so that the master sees what this connection is for.
        "_client_role": "binary_log_listener",
    }


class UpstreamConnection:
    """A client connection to a MySQL/MariaDB master, for the upstream side of the relay.

    Commands run one at a time. After `binlog_dump()`/`binlog_dump_gtid()` the connection belongs to the dump:
    `read_packets()` returns the raw reply payloads in batches (0x00 + event [+ semi-sync header], 0xFE EOF, 0xFF
    ERR) and only `write_packet()` (semi-sync ACKs) and `close()`/`abort()` remain.
    """

    def __init__(self, protocol: _PacketProtocol, host: str, port: int, read_timeout: float | None) -> None:
        """Not for direct use: `await UpstreamConnection.connect(...)` builds and authenticates one."""
        self._protocol = protocol
        self.host = host
        self.port = port
        self.read_timeout = read_timeout
        self.tls = False
        self._handshake: HandshakeV10 | None = None
        # Payloads of the current reply that arrived in the same batch as the one being looked at.
        self._pending: collections.deque[bytes] = collections.deque()
        self._busy = False
        self._dumping = False
        self.semi_sync = False  # set by the caller once it has enabled semi-sync (SET @rpl_semi_sync_slave=1)
        self._broken = False
        self._closed = False

    # -- connection facts ----------------------------------------------------------------------------------------

    @property
    def handshake(self) -> HandshakeV10:
        """The server's greeting."""
        if self._handshake is None:
            raise RuntimeError("not connected yet")
        return self._handshake

    @property
    def server_version(self) -> str:
        """The version the server announced, MariaDB's "5.5.5-" prefix removed (handshake.server_version has the
        raw one)."""
        return self.handshake.version

    @property
    def is_mariadb(self) -> bool:
        return self.handshake.is_mariadb

    @property
    def connection_id(self) -> int:
        return self.handshake.connection_id

    @property
    def is_closed(self) -> bool:
        return self._closed or self._protocol.closed.done()

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else "dumping" if self._dumping else "open"
        server = f"id={self._handshake.connection_id} {self._handshake.version!r} " if self._handshake else ""
        return f"<UpstreamConnection {self.host}:{self.port} {server}tls={self.tls} {state}>"

    # -- connecting ----------------------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        user: str,
        password: str | bytes,
        *,
        ssl_mode: str = "preferred",
        ssl_ca: str | os.PathLike[str] | None = None,
        ssl_cert: str | os.PathLike[str] | None = None,
        ssl_key: str | os.PathLike[str] | None = None,
        server_public_key: bytes | str | os.PathLike[str] | None = None,
        get_server_public_key: bool = True,
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
        connect_attrs: Mapping[str, str] | None = None,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> UpstreamConnection:
        """Connect, negotiate TLS as `ssl_mode` says, authenticate, and return the connection in the command phase.

        ssl_mode follows the MySQL client: disabled; preferred (TLS when the server offers it, unverified);
        required (TLS or fail, unverified); verify_ca (the chain must lead to `ssl_ca`, or to the system CAs);
        verify_identity (and the certificate must name `host`). `ssl_cert`/`ssl_key` are a client certificate.
        `server_public_key` (PEM bytes or a file path) encrypts the password for sha256/caching_sha2 full
        authentication without TLS; failing that the key is requested from the server unless
        `get_server_public_key` is False. `connect_timeout` bounds TCP connect, TLS and authentication together
        (TimeoutError); `read_timeout` bounds every later wait for the server (TimeoutError).
        `max_buffered` is the flow-control limit on undelivered payload bytes, `max_payload` the largest payload
        accepted.

        Raises MySQLError: the server's own (1045 access denied, 1040 too many connections, ...) or a client one
        (2003 cannot connect, 2013 connection lost, 2026 TLS failure, 2059/2061 authentication plugin problems).
        """
        context = _ssl_context(ssl_mode, ssl_ca, ssl_cert, ssl_key)
        public_key = _public_key_bytes(server_public_key)
        attrs = default_connect_attrs() if connect_attrs is None else dict(connect_attrs)
        loop = asyncio.get_running_loop()
        peer = f"{host}:{port}"
        protocol = _PacketProtocol(PacketDecoder(max_payload=max_payload), max_buffered, peer)
        conn = cls(protocol, host, port, read_timeout)
        try:
            async with asyncio.timeout(connect_timeout):
                try:
                    await loop.create_connection(lambda: protocol, host, port)
                except OSError as exc:
                    raise MySQLError(
                        CR_CONN_HOST_ERROR, "HY000", f"Can't connect to server on {peer} ({exc.strerror or exc})"
                    ) from exc
                auth = await conn._handshake_and_authenticate(
                    user, password, ssl_mode, context, public_key, get_server_public_key, attrs
                )
        except TimeoutError:
            conn.abort()
            raise TimeoutError(
                f"connecting to {peer} (TCP, TLS and authentication) took longer than {connect_timeout}s"
            ) from None
        except BaseException:
            conn.abort()
            raise
        log.debug(
            "connected to master",
            peer=peer,
            server_version=conn.handshake.server_version,
            connection_id=conn.connection_id,
            tls=conn.tls,
            auth_plugin=auth.plugin_name,
            user=user,
        )
        return conn

    async def _handshake_and_authenticate(
        self,
        user: str,
        password: str | bytes,
        ssl_mode: str,
        context: ssl.SSLContext | None,
        public_key: bytes | None,
        get_server_public_key: bool,
        attrs: dict[str, str],
    ) -> ClientAuthentication:
        protocol = self._protocol
        self._handshake = handshake = parse_handshake(await self._read_one())
        self.tls = self._want_tls(ssl_mode, handshake)
        caps = client_capabilities(handshake, tls=self.tls, connect_attrs=bool(attrs))
        seq = protocol.decoder.next_seq
        if self.tls:
            assert context is not None
            seq = self._write(build_ssl_request(caps), seq)
            await self._start_tls(context)
        auth = ClientAuthentication(
            password, secure=self.tls, server_public_key=public_key, request_public_key=get_server_public_key
        )
        plugin, data = auth.initial_response(handshake)
        self._write(build_handshake_response(caps, user, data, plugin_name=plugin, connect_attrs=attrs), seq)
        while True:
            # One packet at a time: the server may send two at once (caching_sha2's fast-auth result and the OK).
            step = auth.receive(await self._read_one())
            if isinstance(step, AuthSucceeded):
                if self._pending:
                    raise ProtocolError(f"{len(self._pending)} unexpected packets after authentication")
                return auth
            if isinstance(step, SendAuthData):
                self._write(step.data, protocol.decoder.next_seq)

    def _want_tls(self, ssl_mode: str, handshake: HandshakeV10) -> bool:
        if ssl_mode == "disabled":
            return False
        if handshake.supports_tls:
            return True
        peer = self._protocol.peer
        if ssl_mode == "preferred":
            log.info("server does not offer TLS, continuing unencrypted (ssl_mode=preferred)", peer=peer)
            return False
        raise MySQLError(
            CR_SSL_CONNECTION_ERROR,
            "HY000",
            f"SSL connection error: ssl_mode={ssl_mode} but the server {peer} does not support SSL",
        )

    async def _start_tls(self, context: ssl.SSLContext) -> None:
        protocol = self._protocol
        try:
            await protocol.start_tls(context, self.host)
        except ssl.SSLError as exc:
            detail = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or str(exc)
            raise MySQLError(
                CR_SSL_CONNECTION_ERROR, "HY000", f"SSL connection error with {protocol.peer}: {detail}"
            ) from exc

    # -- packet I/O ----------------------------------------------------------------------------------------------

    def _write(self, payload: bytes, seq: int, *, reply_follows: bool = True) -> int:
        """Send `payload` starting at sequence id `seq` and return the id after it, which a reply must carry."""
        protocol = self._protocol
        if protocol.error is not None:
            raise protocol.error
        transport = protocol.transport
        if transport is None or transport.is_closing():
            raise ConnectionLost(f"Lost connection to server {protocol.peer}: the connection is closed")
        protocol.send(encode_packet(payload, seq))
        after = (seq + packet_count(len(payload))) & 0xFF
        if reply_follows:
            protocol.decoder.expect_sequence(after)
        return after

    async def _read_one(self) -> bytes:
        if not self._pending:
            self._pending.extend(await self._protocol.read_batch(self.read_timeout))
        return self._pending.popleft()

    def _begin_command(self, what: str) -> None:
        # Misuse first: it is a bug in the caller whether or not the master is still there.
        if self._busy or self._dumping or self._pending:
            state = "a binlog dump is running" if self._dumping else "another command is in progress"
            raise MySQLError(CR_COMMANDS_OUT_OF_SYNC, "HY000", f"Commands out of sync: cannot {what}, {state}")
        if self._closed:
            raise ConnectionLost(f"Lost connection to server {self._protocol.peer}: the connection was closed")
        if self._protocol.error is not None:
            raise self._protocol.error
        if self._broken:
            raise ConnectionLost(f"connection to {self._protocol.peer} was abandoned after an earlier failure")

    async def _command(self, payload: bytes, what: str) -> bytes:
        """Send a command and return the first packet of its reply."""
        self._begin_command(what)
        self._busy = True
        self._write(payload, 0)
        try:
            return await self._read_one()
        except BaseException:
            self._busy = False
            self._give_up()
            raise

    def _give_up(self) -> None:
        """After a timeout, a cancellation or a broken packet mid-reply the stream position is unknown: drop it."""
        self._broken = True
        self._pending.clear()
        if self._protocol.transport is not None:
            self._protocol.transport.abort()

    # -- commands ------------------------------------------------------------------------------------------------

    async def query(self, sql: str) -> QueryResult:
        """Run one statement (COM_QUERY) and return its complete result; raises the server's MySQLError, after
        which the connection stays usable. A timeout (read_timeout), a cancellation or a broken reply leaves the
        reply half-read, so the connection is dropped then."""
        payload = await self._command(com_query(sql), "run a query")
        reader = TextResultReader()
        try:
            while True:
                result = reader.feed(payload)
                if result is not None:
                    if self._pending:
                        raise ProtocolError(f"{len(self._pending)} unexpected packets after a query result")
                    return result
                payload = await self._read_one()
        except MySQLError as exc:
            # An ERR packet ends the reply cleanly; anything else leaves the stream at an unknown point.
            if not reader.done or isinstance(exc, (ProtocolError, ConnectionLost)):
                self._give_up()
            raise
        except BaseException:
            self._give_up()
            raise
        finally:
            self._busy = False

    async def register_slave(
        self,
        server_id: int,
        host: str = "",
        port: int = 0,
        user: str = "",
        password: str = "",
        rank: int = 0,
        master_id: int = 0,
    ) -> None:
        """COM_REGISTER_SLAVE: announce this replica (SHOW SLAVE HOSTS / SHOW REPLICAS); raises the server's error."""
        payload = com_register_slave(server_id, host, port, user, password, rank, master_id)
        reply = await self._command(payload, "register as a replica")
        self._busy = False
        if reply and reply[0] == ERR_HEADER:
            raise parse_err(reply)
        if not reply or reply[0] != OK_HEADER or self._pending:
            self._give_up()
            raise ProtocolError(f"unexpected reply to COM_REGISTER_SLAVE ({len(reply)} bytes)")

    async def binlog_dump(self, file: str, position: int, server_id: int, flags: int = 0) -> None:
        """Send COM_BINLOG_DUMP for `file` from byte `position`; read the stream with read_packets().

        The session should have declared its checksum support first (SET @master_binlog_checksum=...), or the
        master refuses to send checksummed events."""
        self._start_dump(com_binlog_dump(file, position, server_id, flags))

    async def binlog_dump_gtid(
        self, server_id: int, encoded_gtid_set: bytes, *, file: str = "", position: int = 4, flags: int = 0
    ) -> None:
        """Send COM_BINLOG_DUMP_GTID (MySQL) with the binary-encoded GTID set; read the stream with read_packets()."""
        self._start_dump(com_binlog_dump_gtid(server_id, encoded_gtid_set, file=file, position=position, flags=flags))

    def _start_dump(self, payload: bytes) -> None:
        self._begin_command("start a binlog dump")
        self._write(payload, 0)
        self._dumping = True
        if self.semi_sync:
            # A semi-sync master restarts sequence ids after every packet that asks for an ACK (MySQL's
            # net_clear + pkt_nr++ in readSlaveReply), whether or not our ACK has been sent yet: the check is
            # meaningless on such a stream (CRC32s and log positions still guard it).
            self._protocol.decoder.expect_sequence(None)

    @property
    def batch_arrived(self) -> float | None:
        """``time.monotonic()`` when the first payload of the batch ``read_packets`` returned last had arrived
        (None when unknown: payloads read before the dump started)."""
        return self._protocol.batch_arrived

    async def read_packets(self) -> list[bytes]:
        """Wait until at least one complete payload is there and return all that are (oldest first).

        Raises ConnectionLost once the master is gone (after every payload received before that was returned),
        ProtocolError for a broken stream, TimeoutError when nothing arrives within read_timeout (the
        connection stays as it is: a dump may simply be idle without heartbeats)."""
        return self.take_packets() or await self._protocol.read_batch(self.read_timeout)

    def take_packets(self) -> list[bytes]:
        """``read_packets`` without the wait: the payloads it would return now, or none when it would wait (then
        ``wait_for_packets`` says when to take again). Raises as ``read_packets`` does, but never TimeoutError."""
        if self._pending:
            batch = list(self._pending)
            self._pending.clear()
            self._protocol.batch_arrived = None
            return batch
        if self._busy:
            raise MySQLError(CR_COMMANDS_OUT_OF_SYNC, "HY000", "Commands out of sync: a command is reading replies")
        return self._protocol.take()

    async def wait_for_packets(self, other: asyncio.Future | None, timeout: float | None) -> None:
        """Until ``take_packets`` has something to return, ``other`` ends (the relay's fsync out), or ``timeout``
        seconds pass: one future the three complete and no task (the relay waits once or twice a transaction)."""
        loop = asyncio.get_running_loop()
        wake = loop.create_future()
        protocol = self._protocol
        protocol.wake_on_input(wake)
        timer = loop.call_later(timeout, _wake, wake) if timeout is not None else None
        if other is not None:
            other.add_done_callback(woken := lambda _f: _wake(wake))
        try:
            await wake
        finally:
            protocol.stop_waking(wake)
            if timer is not None:
                timer.cancel()
            if other is not None:
                other.remove_done_callback(woken)

    def write_packet(self, payload: bytes, seq: int) -> None:
        """Send a raw packet on the dump connection, e.g. a semi-sync ACK (0xEF + position + file name, seq 0).

        How a master numbers the packets that follow an ACK it has read is not something this client relies on:
        the sequence-id check is off from here on (CRC32s and log positions still guard the event stream)."""
        self._write(payload, seq, reply_follows=False)
        self._protocol.decoder.expect_sequence(None)

    # -- closing -------------------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Say goodbye (COM_QUIT, unless a dump or a command is running) and close; waits a few seconds at most."""
        if self._closed:
            return
        self._closed = True
        protocol = self._protocol
        transport = protocol.transport
        if transport is None or transport.is_closing():
            return
        if not (self._dumping or self._busy or self._broken) and protocol.error is None:
            protocol.send(encode_packet(bytes((COM_QUIT,)), 0))
        if protocol.tls is not None and protocol.tls.handshake_complete:
            transport.write(protocol.tls.close_notify())
        transport.close()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await asyncio.shield(protocol.closed)
        except TimeoutError:
            transport.abort()

    def abort(self) -> None:
        """Drop the connection at once, discarding anything unsent or unread."""
        self._closed = True
        if self._protocol.transport is not None:
            self._protocol.transport.abort()

    async def __aenter__(self) -> UpstreamConnection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
