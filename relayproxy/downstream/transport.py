"""One client connection's bytes: ``ClientProtocol`` (the asyncio protocol: TLS over memory buffers, packets decoded
in bulk for the connection's single reader, back-pressure both ways) and ``ClientDumpChannel`` (a binlog dump's reply
stream framed onto it). The relay process's sessions (session.py) and the sender processes (workers.py) both run on
them.

Works the same under uvloop and the default loop: TLS runs over ssl.MemoryBIO (as in upstream/connection.py),
because uvloop's start_tls drops data buffered before the switch, and a client's ClientHello usually arrives in
the same segment as its SSLRequest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ..log import get_logger
from ..wire.errors import ER_NET_READ_INTERRUPTED
from ..wire.errors import CR_NET_PACKET_TOO_LARGE
from ..wire.packets import CLIENT_SSL, MAX_CHUNK, MySQLError, PacketDecoder, ProtocolError
from ..wire.tls import MemoryTls

if TYPE_CHECKING:
    from .dump.chunks import Chunk

# The listener's name: the replica side's connection lines have always been logged under it (docs/metrics.md).
log = get_logger("relayproxy.downstream.server")

# A handshake response holds a user name, a scramble and at most 64 KiB of connection attributes.
HANDSHAKE_MAX_PAYLOAD = 128 * 1024
# Undelivered client bytes above which we stop reading the socket (a client flooding us gets TCP back-pressure).
DEFAULT_MAX_BUFFERED = 1024 * 1024
DEFAULT_WRITE_TIMEOUT = 60.0  # MySQL's net_write_timeout: a client that stops reading this long is dropped
DEFAULT_NET_READ_TIMEOUT = 30.0  # MySQL's net_read_timeout: a client that stops in the middle of a packet
CLOSE_TIMEOUT = 5.0  # seconds a closing client has to let us finish (TLS close_notify, flush) before an abort
_SEMI_SYNC_ACK_REQUESTED = b"\x00\xef\x01"
# Payloads shorter than this are copied behind their header and written at once.
_COPY_LIMIT = 64 * 1024
_COALESCE_LIMIT = 256 * 1024  # write coalesced small events once this much is pending

_U32 = struct.Struct("<I")


class ClientConnectionLost(ConnectionError):
    """The client went away (closed, reset, stopped reading for write_timeout); raised by DumpChannel.send/receive."""



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
                 on_connected: Callable[[ClientProtocol], object] | None = None,
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
        self.session: object = None  # what on_connected returned: the session reading this connection

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
            return tls.exchange(data, self.transport.write, handshake)
        except ssl.SSLError as exc:
            if handshake is not None and not handshake.done():
                handshake.set_exception(exc)
                handshake.exception()  # retrieved here: the session may already be gone
            self.error = ClientConnectionLost(f"TLS error: {getattr(exc, 'reason', None) or exc}")
            self.transport.abort()
            self._wake()
            return b""

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

    @property
    def holds_input(self) -> bool:
        """Whether bytes the client sent wait here unread: whole payloads, or part of a packet."""
        return bool(self._ready) or self.decoder.pending_bytes > 0

    # -- writer side ---------------------------------------------------------------------------------------------

    @property
    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing() or self.closed.done()

    def write(self, *chunks: bytes | bytearray | memoryview) -> None:
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
            async with asyncio.timeout(CLOSE_TIMEOUT):
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
            assert transport is not None  # the caller's can_write_now(): connected
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
        transport = protocol.transport
        if transport is not None and not protocol.is_closing:
            rest = b"".join(data) if pieces else data
            try:
                transport.write(memoryview(rest)[taken:] if taken > 0 else rest)
            except Exception as exc:  # the stream would have a hole: drop the replica (it reconnects where it is)
                log.error("cannot queue the rest of a batch write; the replica is disconnected",
                          client=f"{protocol.peer_host}:{protocol.peer_port}", error=repr(exc))
                transport.abort()
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


__all__ = ["ClientConnectionLost", "ClientDumpChannel", "ClientProtocol", "server_tls_context"]
