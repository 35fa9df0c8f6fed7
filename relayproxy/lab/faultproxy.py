"""Fault-injecting TCP forwarder between a MySQL master and its client: pause, cut, corrupt, drop, refuse, delay.

The relay's promise ("nothing partial escapes") only means something if it holds when the master's stream breaks
at the worst byte. `FaultProxy` sits on 127.0.0.1 between a master and whatever reads from it (the relay, a
replica, PyMySQL in a test) and breaks the stream on command, at exact byte offsets, so a test or the chaos soak
can say "cut this connection in the middle of event 7" and get exactly that, every time.

Model
-----
Every accepted connection has two *flows*: server→client (`SERVER_TO_CLIENT`, the one that carries binlog events)
and client→server. Each flow counts the bytes it *received* from its source and the bytes it *forwarded* to its
destination; a flow's **stream offset** is the number of bytes forwarded so far on that connection, starting at 0
with the first byte the server sent (the handshake greeting). Offset-based faults act on those offsets:

- `cut_at_stream_offset(k)` forwards bytes up to offset k exactly, then closes both sides;
- `corrupt(k, mask)` XORs the byte at offset k with `mask` as it is forwarded;
- `pause_at_stream_offset(k)` forwards up to offset k and holds the rest until `resume()`.

Incoming chunks are split at these offsets, so they act on the exact byte no matter how TCP chunked the stream.

Which connection a fault applies to is chosen by `on`:

- ``"current"`` (default): the most recently accepted connection that is still open, or, when none is open, the
  next connection accepted (so "arm, then connect" works);
- ``"next"``: the next connection accepted, even if one is open now;
- an ``int``: that connection's id (ids count from 1 in accept order); taps receive it, `connections()` lists it.

With several concurrent connections pass ids: "current" is then merely the newest.

Flow-wide faults (`pause`, `delay`, `fragment`, `refuse`) apply to every connection, present and future.
`retarget(host, port)` moves the upstream (a VIP or DNS name moved to another server): open connections are
dropped, new ones go to the new upstream.

Observing
---------
`on_server_bytes(cb)` calls ``cb(connection_id, stream_offset, data)`` for every chunk read from the server,
*before* any of it is forwarded and before faults change it. That ordering is deliberate: a callback that feeds a
`relayproxy.lab.packetwatch.MysqlStreamWatcher` learns where event k starts and ends while none of its bytes has left
yet, and can arm `cut_at_stream_offset` / `corrupt` / `pause_at_stream_offset` at any offset >= the chunk's own
offset, for the same connection, and have it honoured. The bytes a callback sees may therefore include bytes
that a later cut prevents from being forwarded, and are the original bytes, not the corrupted ones.

Closing
-------
A cut (`cut_after`, `cut_at_stream_offset`) closes gracefully: everything up to the cut is flushed, then both
sockets get a FIN; the proxy then reads and discards what the peers still send until they close too (bounded by
`close_timeout`), so the kernel does not turn the close into a reset that could destroy the bytes just delivered.
`drop_connections()` closes at once without flushing the proxy's buffers (a crash as the client sees it), or with
``reset=True`` sends a TCP RST. `stop()` drops everything, cancels and awaits every task it started, and closes the
listening socket, so a stopped proxy leaves no task, socket or port behind.

Threading
---------
`FaultProxy` belongs to the event loop that started it; its control methods are plain (non-async) methods that
must be called on that loop's thread (from coroutines, callbacks or taps). `ThreadedFaultProxy` runs one in a
background thread with its own loop and offers the same controls as thread-safe blocking calls, for synchronous
code such as PyMySQL tests. Taps registered through it run on the proxy thread.

Limits: plain TCP only (it neither knows nor cares about TLS or compression; offsets are of the bytes on the wire).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import socket
import struct
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeVar

from ..log import get_logger

log = get_logger(__name__)

__all__ = [
    "BOTH",
    "CLIENT_TO_SERVER",
    "SERVER_TO_CLIENT",
    "ConnectionClosedError",
    "ConnectionInfo",
    "CorruptionRecord",
    "Direction",
    "FaultProxy",
    "FaultProxyError",
    "ProxyStats",
    "TapCallback",
    "Target",
    "ThreadedFaultProxy",
]


class Direction(enum.Enum):
    """Which way bytes travel through the proxy."""

    SERVER_TO_CLIENT = "server_to_client"
    CLIENT_TO_SERVER = "client_to_server"


SERVER_TO_CLIENT = Direction.SERVER_TO_CLIENT
CLIENT_TO_SERVER = Direction.CLIENT_TO_SERVER
BOTH: tuple[Direction, Direction] = (SERVER_TO_CLIENT, CLIENT_TO_SERVER)

Target = int | Literal["current", "next"]
"""Which connection a fault or a wait refers to; see the module docstring."""

Stage = Literal["forwarded", "received"]

TapCallback = Callable[[int, int, bytes], object]
"""``callback(connection_id, stream_offset, data)``: a chunk as read from its source, before it is forwarded."""

CloseMode = Literal["graceful", "abort", "reset"]

_T = TypeVar("_T")

READ_SIZE = 64 * 1024
_ACCEPT_BATCH = 64
_ACCEPT_RETRY_DELAY = 0.1
# SO_LINGER on with a zero timeout: close() then sends RST instead of FIN and discards unsent data.
_LINGER_RESET = struct.pack("ii", 1, 0)


class FaultProxyError(RuntimeError):
    """A fault could not be applied or the proxy could not do what was asked; the message says which and why."""


class ConnectionClosedError(FaultProxyError):
    """The connection a caller was waiting on closed before the awaited condition came true."""


@dataclass(frozen=True, slots=True)
class CorruptionRecord:
    """One byte the proxy changed: where, and what it was before and after the XOR."""

    direction: Direction
    offset: int
    original: int
    corrupted: int


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """A snapshot of one connection's counters and state (byte counts are *forwarded* bytes = stream offsets)."""

    id: int
    client_address: tuple[str, int]
    open: bool
    close_reason: str | None
    server_to_client: int
    client_to_server: int
    server_to_client_received: int
    client_to_server_received: int
    corruptions: tuple[CorruptionRecord, ...]

    def forwarded(self, direction: Direction) -> int:
        return self.server_to_client if direction is SERVER_TO_CLIENT else self.client_to_server


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Proxy-wide counters. Byte totals include closed connections; `refused` counts reset-on-accept refusals."""

    accepted: int
    active: int
    refused: int
    server_to_client: int
    client_to_server: int


class _Flow:
    """One direction of one connection: counters, armed offset faults, and the waiters on its counters."""

    __slots__ = (
        "applied",
        "corruptions",
        "cut_at",
        "direction",
        "eof",
        "forwarded",
        "held",
        "hold_at",
        "received",
        "waiters",
        "wake",
    )

    def __init__(self, direction: Direction) -> None:
        self.direction = direction
        self.received = 0
        self.forwarded = 0
        self.cut_at: int | None = None
        self.hold_at: int | None = None
        self.held = False
        self.corruptions: dict[int, int] = {}  # stream offset -> XOR mask still to apply
        self.applied: list[CorruptionRecord] = []
        self.waiters: list[tuple[Stage, int, asyncio.Future[int]]] = []
        self.wake = asyncio.Event()
        self.eof = False

    def count(self, stage: Stage) -> int:
        return self.forwarded if stage == "forwarded" else self.received

    def settle_waiters(self) -> None:
        if not self.waiters:
            return
        keep = []
        for stage, target, fut in self.waiters:
            value = self.count(stage)
            if fut.done():
                continue
            if value >= target:
                fut.set_result(value)
            else:
                keep.append((stage, target, fut))
        self.waiters = keep

    def fail_waiters(self, conn_id: int, reason: str) -> None:
        for stage, target, fut in self.waiters:
            if not fut.done():
                fut.set_exception(
                    ConnectionClosedError(
                        f"connection {conn_id} closed ({reason}) with {self.count(stage)} bytes {stage} "
                        f"{self.direction.value}, waiting for {target}"
                    )
                )
        self.waiters = []


class _Connection:
    """One client connection and its upstream twin, with both flows and the tasks that pump them."""

    def __init__(self, conn_id: int, client_sock: socket.socket, client_address: tuple[str, int]) -> None:
        self.id = conn_id
        self.client_sock: socket.socket | None = client_sock
        self.client_address = client_address
        self.flows: dict[Direction, _Flow] = {d: _Flow(d) for d in BOTH}
        self.client_reader: asyncio.StreamReader | None = None
        self.client_writer: asyncio.StreamWriter | None = None
        self.upstream_reader: asyncio.StreamReader | None = None
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.pumps: list[asyncio.Task[None]] = []
        self.closed = False
        self.close_reason: str | None = None
        self.close_mode: CloseMode = "graceful"
        self.finished = asyncio.Event()

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client_writer, self.upstream_writer) if w is not None]

    def info(self) -> ConnectionInfo:
        s2c, c2s = self.flows[SERVER_TO_CLIENT], self.flows[CLIENT_TO_SERVER]
        return ConnectionInfo(
            id=self.id,
            client_address=self.client_address,
            open=not self.closed,
            close_reason=self.close_reason,
            server_to_client=s2c.forwarded,
            client_to_server=c2s.forwarded,
            server_to_client_received=s2c.received,
            client_to_server_received=c2s.received,
            corruptions=tuple(s2c.applied + c2s.applied),
        )


def _directions(direction: Direction | None) -> tuple[Direction, ...]:
    return BOTH if direction is None else (direction,)


def _abort(writer: asyncio.StreamWriter, reset: bool = False) -> None:
    if reset:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()


class FaultProxy:
    """A fault-injecting TCP forwarder running on the current asyncio loop; see the module docstring.

    ``async with FaultProxy(host, port) as proxy:`` or ``await proxy.start()`` / ``await proxy.stop()``.
    `listen_port` 0 picks a free port; `proxy.port` tells which once started.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        connect_timeout: float = 5.0,
        close_timeout: float = 2.0,
        read_size: int = READ_SIZE,
        history: int = 1000,
    ) -> None:
        if read_size < 1:
            raise ValueError("read_size must be at least 1")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.listen_host = listen_host
        self._requested_port = listen_port
        self.port = 0
        self.connect_timeout = connect_timeout
        self.close_timeout = close_timeout
        self.read_size = read_size

        self._loop: asyncio.AbstractEventLoop | None = None
        self._listen_sock: socket.socket | None = None
        self._accept_retry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._stopping = False

        self._next_id = 1
        self._active: dict[int, _Connection] = {}  # insertion order = accept order
        self._unfinished: dict[int, _Connection] = {}  # accepted, and sockets not yet fully closed
        self._history: deque[_Connection] = deque(maxlen=history)
        self._pending: list[Callable[[_Connection], None]] = []  # faults armed for the next connection
        self._connection_waiters: list[tuple[int, asyncio.Future[_Connection]]] = []
        self._idle_waiters: list[asyncio.Future[None]] = []

        self._paused = {d: False for d in BOTH}
        self._delay = {d: 0.0 for d in BOTH}
        self._max_piece: dict[Direction, int | None] = {d: None for d in BOTH}
        self._refusing = False
        self._taps: dict[Direction, list[TapCallback]] = {d: [] for d in BOTH}
        self.errors: list[BaseException] = []
        """Exceptions raised by tap callbacks or by the proxy's own tasks (logged too); should stay empty."""

        self._accepted = 0
        self._refused = 0
        self._totals = {d: 0 for d in BOTH}

    # -- lifecycle -----------------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) clients connect to."""
        return (self.listen_host, self.port)

    async def start(self) -> Self:
        """Bind the listening socket and start accepting; returns self."""
        if self._started:
            raise FaultProxyError("FaultProxy.start() called twice")
        self._loop = asyncio.get_running_loop()
        self._started = True
        self.port = self._requested_port
        self._open_listener()
        log.debug("faultproxy started", port=self.port, upstream=f"{self.upstream_host}:{self.upstream_port}")
        return self

    async def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection, then wait (at most `timeout`) for all tasks to end.

        Tasks still running after `timeout` are cancelled and awaited, so when this returns nothing the proxy
        started is left on the loop.
        """
        if not self._started or self._stopping:
            return
        self._stopping = True
        self._close_listener()
        for conn in list(self._active.values()):
            self._close(conn, "proxy stopped", "abort")
        for conn in list(self._unfinished.values()):  # closed gracefully and still lingering: end that too
            for writer in conn.writers():
                _abort(writer)
        for fut in [f for _, f in self._connection_waiters] + self._idle_waiters:
            if not fut.done():
                fut.set_exception(FaultProxyError("proxy stopped"))
        self._connection_waiters.clear()
        self._idle_waiters.clear()
        tasks = list(self._tasks)
        if tasks:
            _, still_running = await asyncio.wait(tasks, timeout=timeout)
            for task in still_running:
                task.cancel()
            if still_running:
                await asyncio.gather(*still_running, return_exceptions=True)
        log.debug("faultproxy stopped", port=self.port)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        assert self._loop is not None
        task = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _open_listener(self) -> None:
        # A socket we bind and watch ourselves (add_reader, not asyncio.start_server or sock_accept) so that
        # refusing and un-refusing take effect synchronously: after refuse() returns the port refuses, after
        # refuse(False) returns it accepts, with no in-between window and no stale selector registration.
        assert self._loop is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # Lets refuse(False) rebind the same port while old connections on it sit in TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.listen_host, self.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise FaultProxyError(f"cannot listen on {self.listen_host}:{self.port}: {exc}") from exc
        self.port = sock.getsockname()[1]
        self._listen_sock = sock
        self._loop.add_reader(sock.fileno(), self._accept_ready)

    def _close_listener(self) -> None:
        sock, self._listen_sock = self._listen_sock, None
        if self._accept_retry is not None:
            self._accept_retry.cancel()
            self._accept_retry = None
        if sock is not None:
            assert self._loop is not None
            self._loop.remove_reader(sock.fileno())
            sock.close()  # connections still in the backlog get a reset, as from a dead master

    def _accept_ready(self) -> None:
        sock = self._listen_sock
        for _ in range(_ACCEPT_BATCH):  # bounded, so a connection storm cannot starve the forwarding
            if sock is None or sock is not self._listen_sock:
                return
            try:
                client_sock, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                # EMFILE and friends: stop watching for a moment instead of spinning on a readable socket;
                # connections wait in the backlog meanwhile.
                log.warning("faultproxy accept failed", port=self.port, error=str(exc))
                assert self._loop is not None
                self._loop.remove_reader(sock.fileno())
                self._accept_retry = self._loop.call_later(_ACCEPT_RETRY_DELAY, self._resume_accepting, sock)
                return
            client_sock.setblocking(False)
            self._on_accept(client_sock, address)

    def _resume_accepting(self, sock: socket.socket) -> None:
        self._accept_retry = None
        if sock is self._listen_sock and self._loop is not None:
            self._loop.add_reader(sock.fileno(), self._accept_ready)

    def _on_accept(self, client_sock: socket.socket, address: tuple[str, int]) -> None:
        if self._refusing:
            # refuse(reset=True): the TCP handshake completed, the client's first read gets a reset.
            with contextlib.suppress(OSError):
                client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            client_sock.close()
            self._refused += 1
            return
        conn = _Connection(self._next_id, client_sock, address)
        self._next_id += 1
        self._accepted += 1
        self._active[conn.id] = conn
        self._unfinished[conn.id] = conn
        pending, self._pending = self._pending, []
        for apply in pending:
            apply(conn)
        waiters = []
        for number, fut in self._connection_waiters:
            if number == conn.id and not fut.done():
                fut.set_result(conn)
            elif not fut.done():
                waiters.append((number, fut))
        self._connection_waiters = waiters
        log.debug("faultproxy accepted", port=self.port, connection=conn.id, client=f"{address[0]}:{address[1]}")
        self._spawn(self._serve(conn), f"faultproxy-{self.port}-conn-{conn.id}")

    # -- one connection ------------------------------------------------------------------------------------

    async def _serve(self, conn: _Connection) -> None:
        try:
            assert conn.client_sock is not None
            reader, writer = await asyncio.open_connection(sock=conn.client_sock, limit=self.read_size)
            conn.client_sock = None  # owned by the transport now
            conn.client_reader, conn.client_writer = reader, writer
            if conn.closed:
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(self.upstream_host, self.upstream_port, limit=self.read_size),
                    self.connect_timeout,
                )
            except (TimeoutError, OSError) as exc:
                self._close(conn, f"upstream connect failed: {exc!r}", "abort")
                return
            conn.upstream_reader, conn.upstream_writer = up_reader, up_writer
            if conn.closed:
                return
            conn.pumps = [
                asyncio.create_task(self._pump(conn, SERVER_TO_CLIENT, up_reader, writer)),
                asyncio.create_task(self._pump(conn, CLIENT_TO_SERVER, reader, up_writer)),
            ]
            outcomes = await asyncio.gather(*conn.pumps, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, Exception):  # a bug in the proxy, not a network event: say so loudly
                    self.errors.append(outcome)
                    log.error("faultproxy pump failed", connection=conn.id, exc_info=outcome)
                    self._close(conn, f"proxy error: {outcome!r}", "abort")
            self._close(conn, "closed by peers", "graceful")
        finally:
            # Also reached when stop() cancels this task: close whatever is still open, then wait for it.
            self._close(conn, "proxy task ended", "abort")
            try:
                for pump in conn.pumps:
                    pump.cancel()
                # Cancelled pumps end on their next step; wait for that, so none outlives the connection and
                # none still reads the client socket that _finish_sockets may drain.
                await asyncio.gather(*conn.pumps, return_exceptions=True)
                await self._finish_sockets(conn)
            finally:
                for pump in conn.pumps:
                    pump.cancel()
                if conn.client_sock is not None:
                    conn.client_sock.close()
                    conn.client_sock = None
                conn.finished.set()
                self._unfinished.pop(conn.id, None)
                self._settle_idle()

    async def _finish_sockets(self, conn: _Connection) -> None:
        """Close both sockets the way `conn.close_mode` says, bounded by close_timeout.

        Graceful: the upstream socket is closed after flushing; the client socket lingers (see _linger), since
        the client is the side that must receive every byte up to a cut. Abort and reset: already done.
        """
        writers = conn.writers()
        if conn.close_mode == "graceful" and not self._stopping:
            if conn.upstream_writer is not None:
                conn.upstream_writer.close()
            if conn.client_reader is not None and conn.client_writer is not None:
                try:
                    await asyncio.wait_for(self._linger(conn.client_reader, conn.client_writer), self.close_timeout)
                except (TimeoutError, OSError):
                    pass
        for writer in writers:
            if not writer.transport.is_closing():
                _abort(writer, conn.close_mode == "reset")
        for writer in writers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), self.close_timeout)

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # FIN after whatever is buffered, then drain the peer until it closes: closing a socket with unread input
        # makes the kernel send RST, and a RST can make the peer drop bytes it has not read yet.
        if writer.transport.is_closing():
            return
        if writer.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
        with contextlib.suppress(OSError):
            while await reader.read(READ_SIZE):
                pass
        writer.close()

    async def _pump(
        self, conn: _Connection, direction: Direction, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        flow = conn.flows[direction]
        other = conn.flows[CLIENT_TO_SERVER if direction is SERVER_TO_CLIENT else SERVER_TO_CLIENT]
        try:
            while not conn.closed:
                data = await reader.read(self.read_size)
                if conn.closed:
                    return
                if not data:
                    flow.eof = True
                    # Mirror the half-close: the peer's reader sees EOF where the source stopped.
                    if writer.can_write_eof() and not writer.transport.is_closing():
                        writer.write_eof()
                    if other.eof:
                        return
                    # Keep the task until the other flow also ends, so gather() in _serve reflects both.
                    while not other.eof and not conn.closed:
                        flow.wake.clear()
                        await flow.wake.wait()
                    return
                self._run_taps(conn, direction, flow.received, data)
                flow.received += len(data)
                flow.settle_waiters()
                pos = 0
                while pos < len(data):
                    await self._wait_until_forwardable(conn, flow)
                    if conn.closed:
                        return
                    n = len(data) - pos
                    cap = self._max_piece[direction]
                    if cap is not None:
                        n = min(n, cap)
                    for limit in (flow.cut_at, flow.hold_at):
                        if limit is not None:
                            n = min(n, limit - flow.forwarded)
                    assert n > 0, "an offset fault was passed without acting on it"
                    piece: bytes | bytearray = data if n == len(data) else data[pos : pos + n]
                    if flow.corruptions:
                        piece = self._corrupt_piece(flow, piece)
                    writer.write(piece)
                    pos += n
                    flow.forwarded += n
                    self._totals[direction] += n
                    flow.settle_waiters()
                    if flow.cut_at is not None and flow.forwarded == flow.cut_at:
                        self._close(conn, f"cut at {direction.value} offset {flow.forwarded}", "graceful")
                        return
                    if flow.hold_at is not None and flow.forwarded == flow.hold_at:
                        flow.hold_at = None
                        flow.held = True
                    await writer.drain()
        except (ConnectionError, OSError) as exc:
            self._close(conn, f"{direction.value}: {exc!r}", "abort")
        finally:
            flow.eof = True
            other.wake.set()

    def _corrupt_piece(self, flow: _Flow, piece: bytes | bytearray) -> bytes | bytearray:
        start, end = flow.forwarded, flow.forwarded + len(piece)
        hits = [offset for offset in flow.corruptions if start <= offset < end]
        if not hits:
            return piece
        changed = bytearray(piece)
        for offset in sorted(hits):
            mask = flow.corruptions.pop(offset)
            before = changed[offset - start]
            changed[offset - start] = before ^ mask
            flow.applied.append(CorruptionRecord(flow.direction, offset, before, before ^ mask))
        return changed

    async def _wait_until_forwardable(self, conn: _Connection, flow: _Flow) -> None:
        delay = self._delay[flow.direction]
        if delay > 0:
            await asyncio.sleep(delay)
        # Nothing may await between this check passing and the caller's write, so a pause or an offset fault
        # armed meanwhile is always seen before the next byte goes out.
        while not conn.closed and (self._paused[flow.direction] or flow.held):
            flow.wake.clear()
            await flow.wake.wait()

    def _run_taps(self, conn: _Connection, direction: Direction, offset: int, data: bytes) -> None:
        for tap in list(self._taps[direction]):
            try:
                tap(conn.id, offset, data)
            except Exception as exc:  # a broken observer must not change what is forwarded
                self.errors.append(exc)
                log.error("faultproxy tap failed", connection=conn.id, direction=direction.value, exc_info=exc)

    def _close(self, conn: _Connection, reason: str, mode: CloseMode) -> None:
        """Mark `conn` closed and start closing its sockets; idempotent (the first reason and mode win)."""
        if conn.closed:
            return
        conn.closed = True
        conn.close_reason = reason
        conn.close_mode = mode
        if mode != "graceful":
            for writer in conn.writers():
                _abort(writer, mode == "reset")
        current = asyncio.current_task()
        for pump in conn.pumps:
            if pump is not current:
                pump.cancel()
        for flow in conn.flows.values():
            flow.wake.set()
            flow.fail_waiters(conn.id, reason)
        self._active.pop(conn.id, None)
        self._history.append(conn)
        log.debug("faultproxy connection closed", port=self.port, connection=conn.id, reason=reason, mode=mode)

    def _settle_idle(self) -> None:
        if self._unfinished:
            return
        for fut in self._idle_waiters:
            if not fut.done():
                fut.set_result(None)
        self._idle_waiters = []

    # -- choosing the connection ---------------------------------------------------------------------------

    def _target(self, on: Target) -> _Connection | None:
        """The open connection `on` names, or None for "the next one accepted"."""
        if on == "next":
            return None
        if on == "current":
            return next(reversed(self._active.values()), None)
        if isinstance(on, int) and not isinstance(on, bool):
            conn = self._active.get(on)
            if conn is None:
                raise FaultProxyError(f"connection {on} is not open")
            return conn
        raise ValueError(f"on must be 'current', 'next' or a connection id, got {on!r}")

    def _arm(self, on: Target, apply: Callable[[_Connection], None]) -> int | None:
        self._require_running()
        conn = self._target(on)
        if conn is None:
            self._pending.append(apply)
            return None
        apply(conn)
        return conn.id

    def _require_running(self) -> None:
        if not self._started or self._stopping:
            raise FaultProxyError("the proxy is not running")

    # -- faults --------------------------------------------------------------------------------------------

    def pause(self, direction: Direction | None = None) -> None:
        """Stop forwarding in `direction` (None: both) on every connection, new ones included, until resume().

        Nothing is dropped: the chunk in hand waits, the rest stays in kernel buffers and TCP flow control slows
        the sender, as on a congested link. Pausing both directions also makes new connections hang before the
        greeting, like a master that accepts but never answers.
        """
        for d in _directions(direction):
            self._paused[d] = True

    def resume(self, direction: Direction | None = None) -> None:
        """Undo pause() and release flows held by pause_at_stream_offset() in `direction` (None: both)."""
        for d in _directions(direction):
            self._paused[d] = False
            for conn in self._active.values():
                flow = conn.flows[d]
                flow.held = False
                flow.wake.set()

    def pause_at_stream_offset(
        self, offset: int, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        """Forward up to stream offset `offset` exactly, then hold that flow until resume().

        Freezes a stream at a chosen byte, e.g. in the middle of a transaction. Returns the connection id it was
        armed on, or None when it waits for the next connection. Raises ValueError if the offset is already past.
        """
        if offset < 0:
            raise ValueError("offset must be >= 0")

        def apply(conn: _Connection) -> None:
            flow = conn.flows[direction]
            self._check_not_past(conn, flow, offset, "pause at")
            if offset == flow.forwarded:
                flow.held = True
            else:
                flow.hold_at = offset if flow.hold_at is None else min(flow.hold_at, offset)

        return self._arm(on, apply)

    def cut_after(
        self, n_bytes: int, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        """Forward exactly `n_bytes` more bytes in `direction`, then close both sides of that connection.

        Returns the connection id it was armed on, or None when it waits for the next connection (where it cuts
        at stream offset `n_bytes`). `n_bytes` 0 cuts at once.
        """
        if n_bytes < 0:
            raise ValueError("n_bytes must be >= 0")

        def apply(conn: _Connection) -> None:
            flow = conn.flows[direction]
            self._set_cut(conn, flow, flow.forwarded + n_bytes)

        return self._arm(on, apply)

    def cut_at_stream_offset(
        self, offset: int, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        """Close both sides of the connection once `offset` bytes have been forwarded in `direction`.

        Raises ValueError if the connection has already forwarded more than `offset`: the cut could no longer
        land on the byte asked for, and silently cutting elsewhere would make a test pass for the wrong reason.
        """
        if offset < 0:
            raise ValueError("offset must be >= 0")

        def apply(conn: _Connection) -> None:
            self._set_cut(conn, conn.flows[direction], offset)

        return self._arm(on, apply)

    def _set_cut(self, conn: _Connection, flow: _Flow, offset: int) -> None:
        self._check_not_past(conn, flow, offset, "cut at")
        if offset == flow.forwarded:
            self._close(conn, f"cut at {flow.direction.value} offset {offset}", "graceful")
        else:
            flow.cut_at = offset if flow.cut_at is None else min(flow.cut_at, offset)

    @staticmethod
    def _check_not_past(conn: _Connection, flow: _Flow, offset: int, what: str) -> None:
        if offset < flow.forwarded:
            raise ValueError(
                f"cannot {what} {flow.direction.value} offset {offset} on connection {conn.id}: "
                f"{flow.forwarded} bytes are already forwarded"
            )

    def corrupt(
        self, offset: int, xor_mask: int = 0x01, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        """XOR the byte at stream offset `offset` with `xor_mask` as it is forwarded (once).

        Several corruptions may be armed; two on one byte combine. Applied ones show in
        `ConnectionInfo.corruptions`. Raises ValueError if that byte has already been forwarded.
        """
        if offset < 0:
            raise ValueError("offset must be >= 0")
        if not 1 <= xor_mask <= 0xFF:
            raise ValueError("xor_mask must be in 1..255 (0 would change nothing)")

        def apply(conn: _Connection) -> None:
            flow = conn.flows[direction]
            self._check_not_past(conn, flow, offset, "corrupt")
            mask = flow.corruptions.get(offset, 0) ^ xor_mask
            if mask:
                flow.corruptions[offset] = mask
            else:
                flow.corruptions.pop(offset, None)

        return self._arm(on, apply)

    def drop_connections(self, *, reset: bool = False) -> int:
        """Close every open connection now, without flushing what the proxy holds; returns how many.

        Clients see what a master crash looks like from their side: EOF (or, with `reset`, a TCP reset).
        """
        conns = list(self._active.values())
        for conn in conns:
            self._close(conn, "dropped" + (" with reset" if reset else ""), "reset" if reset else "abort")
        return len(conns)

    def retarget(self, upstream_host: str, upstream_port: int, *, reset: bool = False) -> int:
        """Send new connections to another upstream (a VIP or DNS name moved to another server) and drop the open
        ones, as a moved address ends them (`drop_connections`); returns how many were dropped. Faults armed for
        the next connection, taps and flow-wide settings stay."""
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        log.debug("faultproxy retargeted", port=self.port, upstream=f"{upstream_host}:{upstream_port}")
        return self.drop_connections(reset=reset)

    def refuse(self, enabled: bool = True, *, reset: bool = False) -> None:
        """Refuse new connections (a master that is down) until refuse(False); open ones are untouched.

        By default the listening socket is closed, so connecting fails with "connection refused" exactly as for
        a stopped server. With `reset`, connections are accepted and reset at once (the client's connect succeeds
        and its first read fails), like a server that dies as it accepts. refuse(False) listens again on the same
        port.
        """
        self._require_running()
        self._refusing = enabled and reset
        want_listener = not enabled or reset
        if want_listener and self._listen_sock is None:
            self._open_listener()
        elif not want_listener and self._listen_sock is not None:
            self._close_listener()

    def delay(self, seconds: float, direction: Direction | None = None) -> None:
        """Wait `seconds` before forwarding each chunk in `direction` (None: both); 0 turns it off."""
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        for d in _directions(direction):
            self._delay[d] = float(seconds)

    def fragment(self, max_bytes: int | None, direction: Direction | None = None) -> None:
        """Forward at most `max_bytes` per write in `direction` (None: both); None turns it off.

        Together with delay() this trickles a stream in small pieces, to exercise readers' partial-read paths.
        """
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1 or None")
        for d in _directions(direction):
            self._max_piece[d] = max_bytes

    # -- observing -----------------------------------------------------------------------------------------

    def on_bytes(self, direction: Direction, callback: TapCallback) -> Callable[[], None]:
        """Call ``callback(connection_id, stream_offset, data)`` for each chunk read in `direction`.

        It runs on the proxy's loop, before the chunk is forwarded (see the module docstring); returns a
        function that removes it.
        """
        self._taps[direction].append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._taps[direction].remove(callback)

        return remove

    def on_server_bytes(self, callback: TapCallback) -> Callable[[], None]:
        """on_bytes(SERVER_TO_CLIENT, callback): what the master sends, e.g. for a MysqlStreamWatcher."""
        return self.on_bytes(SERVER_TO_CLIENT, callback)

    def on_client_bytes(self, callback: TapCallback) -> Callable[[], None]:
        """on_bytes(CLIENT_TO_SERVER, callback): what the client sends (its commands, e.g. COM_BINLOG_DUMP)."""
        return self.on_bytes(CLIENT_TO_SERVER, callback)

    def stats(self) -> ProxyStats:
        return ProxyStats(
            accepted=self._accepted,
            active=len(self._active),
            refused=self._refused,
            server_to_client=self._totals[SERVER_TO_CLIENT],
            client_to_server=self._totals[CLIENT_TO_SERVER],
        )

    @property
    def connections_accepted(self) -> int:
        return self._accepted

    @property
    def active_connections(self) -> int:
        return len(self._active)

    def connections(self) -> list[ConnectionInfo]:
        """Open connections and the most recent closed ones (up to `history`), oldest first."""
        conns = {c.id: c for c in self._history}
        conns.update(self._active)
        return [conns[i].info() for i in sorted(conns)]

    def connection(self, conn_id: int | Literal["current"] = "current") -> ConnectionInfo:
        """The snapshot of one connection (an id, or "current": the newest open one)."""
        if conn_id == "current":
            conn = self._target("current")
            if conn is None:
                raise FaultProxyError("no connection is open")
            return conn.info()
        found = self._active.get(conn_id) or next((c for c in self._history if c.id == conn_id), None)
        if found is None:
            raise FaultProxyError(f"no connection {conn_id} (never accepted, or dropped from history)")
        return found.info()

    async def _resolve_for_wait(self, on: Target, timeout: float) -> _Connection:
        if isinstance(on, int) and not isinstance(on, bool):
            conn = self._active.get(on) or next((c for c in self._history if c.id == on), None)
            if conn is not None:
                return conn
            if on < self._next_id:
                raise FaultProxyError(f"connection {on} is no longer known (history too short)")
            number = on
        else:
            conn = self._target(on)
            if conn is not None:
                return conn
            number = self._next_id
        return await self._wait_for_accept(number, timeout)

    async def _wait_for_accept(self, number: int, timeout: float) -> _Connection:
        self._require_running()
        assert self._loop is not None
        fut: asyncio.Future[_Connection] = self._loop.create_future()
        self._connection_waiters.append((number, fut))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise TimeoutError(f"connection {number} was not accepted within {timeout}s") from None
        finally:
            self._connection_waiters = [(n, f) for n, f in self._connection_waiters if f is not fut]

    async def wait_for_bytes(
        self,
        n: int,
        timeout: float = 10.0,
        *,
        direction: Direction = SERVER_TO_CLIENT,
        on: Target = "current",
        stage: Stage = "forwarded",
    ) -> int:
        """Wait until the connection's byte count in `direction` reaches `n`; return the count then (>= n).

        `stage` "forwarded" counts bytes passed on (= stream offset), "received" bytes read from the source
        (useful while paused: the bytes have arrived but are held; a held flow reads at most `read_size` bytes
        ahead, the rest waits in the kernel). Raises TimeoutError, or ConnectionClosedError if the connection
        closes first.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self._resolve_for_wait(on, timeout)
        flow = conn.flows[direction]
        if flow.count(stage) >= n:
            return flow.count(stage)
        if conn.closed:
            raise ConnectionClosedError(
                f"connection {conn.id} is closed ({conn.close_reason}) with {flow.count(stage)} bytes {stage} "
                f"{direction.value}, fewer than {n}"
            )
        fut: asyncio.Future[int] = loop.create_future()
        flow.waiters.append((stage, n, fut))
        try:
            return await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise TimeoutError(
                f"connection {conn.id}: {flow.count(stage)} of {n} bytes {stage} {direction.value} after {timeout}s"
            ) from None
        finally:
            flow.waiters = [w for w in flow.waiters if w[2] is not fut]

    async def wait_for_connection(self, number: int, timeout: float = 10.0) -> ConnectionInfo:
        """Wait until connection `number` has been accepted (at once if it was); return its snapshot.

        Ids count from 1, so "the next connection" is ``connections_accepted + 1`` read before connecting.
        """
        conn = self._active.get(number) or next((c for c in self._history if c.id == number), None)
        if conn is None:
            conn = await self._wait_for_accept(number, timeout)
        return conn.info()

    async def wait_closed(self, conn_id: int, timeout: float = 10.0) -> ConnectionInfo:
        """Wait until connection `conn_id` is closed and both its sockets are gone; return its snapshot."""
        conn = await self._resolve_for_wait(conn_id, timeout)
        try:
            await asyncio.wait_for(conn.finished.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"connection {conn_id} still open after {timeout}s") from None
        return conn.info()

    async def wait_until_idle(self, timeout: float = 10.0) -> None:
        """Wait until no connection is open and every connection's sockets are closed."""
        if not self._unfinished:
            return
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._idle_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{len(self._unfinished)} connection(s) still open after {timeout}s: {sorted(self._unfinished)}"
            ) from None
        finally:
            self._idle_waiters = [f for f in self._idle_waiters if f is not fut]


class ThreadedFaultProxy:
    """A FaultProxy on its own event loop in a daemon thread, with thread-safe blocking controls.

    For synchronous callers (PyMySQL tests, the soak driver)::

        with ThreadedFaultProxy(master.host, master.port) as proxy:
            conn = pymysql.connect(host=proxy.host, port=proxy.port, ...)
            proxy.cut_after(100)

    Every control method mirrors the FaultProxy method of the same name. Calls made on the proxy thread itself
    (from a tap) run directly, so a tap may arm faults without deadlocking.
    """

    def __init__(
        self, upstream_host: str, upstream_port: int, *, call_timeout: float = 10.0, **options: object
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.call_timeout = call_timeout
        self._options = options
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxy: FaultProxy | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.leftover_tasks: int | None = None
        """Tasks still pending on the proxy loop when it shut down (None until stopped; 0 means none leaked)."""

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Self:
        if self._thread is not None:
            raise FaultProxyError("ThreadedFaultProxy.start() called twice")
        self._thread = threading.Thread(target=self._run, name="faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise FaultProxyError(f"fault proxy thread did not start within {timeout}s")
        if self._startup_error is not None:
            self._thread.join(timeout)
            raise FaultProxyError(f"fault proxy did not start: {self._startup_error}") from self._startup_error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            try:
                proxy = FaultProxy(self.upstream_host, self.upstream_port, **self._options)  # type: ignore[arg-type]
                loop.run_until_complete(proxy.start())
            except BaseException as exc:
                self._startup_error = exc
                self._ready.set()
                return
            self._proxy = proxy
            if self._thread is not None:
                self._thread.name = f"faultproxy-{proxy.port}"
            self._ready.set()
            loop.run_forever()
        finally:
            # stop() has stopped the proxy; anything still pending would be a leak, counted then cancelled.
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            self.leftover_tasks = len(pending)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the proxy (closing every connection), end its loop and join the thread."""
        thread, loop, proxy = self._thread, self._loop, self._proxy
        if thread is None or not thread.is_alive() or loop is None:
            return
        if proxy is not None:
            asyncio.run_coroutine_threadsafe(proxy.stop(timeout=timeout / 2), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            raise FaultProxyError(f"fault proxy thread did not end within {timeout}s")

    def __enter__(self) -> Self:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def proxy(self) -> FaultProxy:
        """The FaultProxy itself: touch it only on the proxy thread (e.g. inside a tap)."""
        if self._proxy is None:
            raise FaultProxyError("the proxy is not running")
        return self._proxy

    @property
    def host(self) -> str:
        return self.proxy.listen_host

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def address(self) -> tuple[str, int]:
        return self.proxy.address

    # -- calling into the loop -----------------------------------------------------------------------------

    def _on_loop_thread(self) -> bool:
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def _call(self, fn: Callable[[FaultProxy], _T]) -> _T:
        proxy, loop = self.proxy, self._loop
        assert loop is not None
        if self._on_loop_thread():
            return fn(proxy)
        result: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn(proxy))
            except BaseException as exc:
                result.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return result.result(self.call_timeout)

    def _wait(self, make: Callable[[FaultProxy], Awaitable[_T]], timeout: float) -> _T:
        if self._on_loop_thread():
            raise FaultProxyError("cannot block on the proxy's own thread; await the FaultProxy method instead")
        proxy, loop = self.proxy, self._loop
        assert loop is not None

        async def run() -> _T:
            return await make(proxy)

        # The coroutine enforces `timeout` itself; the margin only guards against a wedged loop.
        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout + self.call_timeout)

    # -- controls (see FaultProxy for what each does) ------------------------------------------------------

    def pause(self, direction: Direction | None = None) -> None:
        self._call(lambda p: p.pause(direction))

    def resume(self, direction: Direction | None = None) -> None:
        self._call(lambda p: p.resume(direction))

    def pause_at_stream_offset(
        self, offset: int, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        return self._call(lambda p: p.pause_at_stream_offset(offset, direction, on))

    def cut_after(
        self, n_bytes: int, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        return self._call(lambda p: p.cut_after(n_bytes, direction, on))

    def cut_at_stream_offset(
        self, offset: int, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        return self._call(lambda p: p.cut_at_stream_offset(offset, direction, on))

    def corrupt(
        self, offset: int, xor_mask: int = 0x01, direction: Direction = SERVER_TO_CLIENT, on: Target = "current"
    ) -> int | None:
        return self._call(lambda p: p.corrupt(offset, xor_mask, direction, on))

    def drop_connections(self, *, reset: bool = False) -> int:
        return self._call(lambda p: p.drop_connections(reset=reset))

    def retarget(self, upstream_host: str, upstream_port: int, *, reset: bool = False) -> int:
        dropped = self._call(lambda p: p.retarget(upstream_host, upstream_port, reset=reset))
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        return dropped

    def refuse(self, enabled: bool = True, *, reset: bool = False) -> None:
        self._call(lambda p: p.refuse(enabled, reset=reset))

    def delay(self, seconds: float, direction: Direction | None = None) -> None:
        self._call(lambda p: p.delay(seconds, direction))

    def fragment(self, max_bytes: int | None, direction: Direction | None = None) -> None:
        self._call(lambda p: p.fragment(max_bytes, direction))

    def on_bytes(self, direction: Direction, callback: TapCallback) -> Callable[[], None]:
        """Register a tap (it runs on the proxy thread); the returned remover is thread-safe."""
        remove = self._call(lambda p: p.on_bytes(direction, callback))
        return lambda: self._call(lambda _p: remove())

    def on_server_bytes(self, callback: TapCallback) -> Callable[[], None]:
        return self.on_bytes(SERVER_TO_CLIENT, callback)

    def on_client_bytes(self, callback: TapCallback) -> Callable[[], None]:
        return self.on_bytes(CLIENT_TO_SERVER, callback)

    @property
    def errors(self) -> list[BaseException]:
        return self._call(lambda p: list(p.errors))

    def stats(self) -> ProxyStats:
        return self._call(lambda p: p.stats())

    @property
    def connections_accepted(self) -> int:
        return self._call(lambda p: p.connections_accepted)

    @property
    def active_connections(self) -> int:
        return self._call(lambda p: p.active_connections)

    def connections(self) -> list[ConnectionInfo]:
        return self._call(lambda p: p.connections())

    def connection(self, conn_id: int | Literal["current"] = "current") -> ConnectionInfo:
        return self._call(lambda p: p.connection(conn_id))

    # -- waits ---------------------------------------------------------------------------------------------

    def wait_for_bytes(
        self,
        n: int,
        timeout: float = 10.0,
        *,
        direction: Direction = SERVER_TO_CLIENT,
        on: Target = "current",
        stage: Stage = "forwarded",
    ) -> int:
        return self._wait(lambda p: p.wait_for_bytes(n, timeout, direction=direction, on=on, stage=stage), timeout)

    def wait_for_connection(self, number: int, timeout: float = 10.0) -> ConnectionInfo:
        return self._wait(lambda p: p.wait_for_connection(number, timeout), timeout)

    def wait_closed(self, conn_id: int, timeout: float = 10.0) -> ConnectionInfo:
        return self._wait(lambda p: p.wait_closed(conn_id, timeout), timeout)

    def wait_until_idle(self, timeout: float = 10.0) -> None:
        self._wait(lambda p: p.wait_until_idle(timeout), timeout)
