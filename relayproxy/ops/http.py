"""HTTP endpoints on --http: GET /status (JSON) and GET /metrics (Prometheus text), asyncio only."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any, Callable

from prometheus_client import generate_latest

from ..log import PeerLogLimiter, get_logger, report_failure
from ..relay.hoptimes import HopTimes
from .metrics import FsyncStats, build_registry

log = get_logger("relayproxy.http")

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT = 10.0  # from accept to a complete request head, whatever trickles in meanwhile
WRITE_TIMEOUT = 10.0  # a client that does not read its answer this long is dropped
DEFAULT_HTTP_MAX_CONNECTIONS = 64
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 25\r\n"
         b"Connection: close\r\nRetry-After: 1\r\n\r\ntoo many HTTP connections\n")


class _Connection:
    __slots__ = ("writer", "dropped")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.dropped = False  # closed to make room for a newcomer


class HttpApi:
    """A deliberately small HTTP/1.1 server: two read-only GET endpoints, one request per connection.

    At most `max_connections` at once. When they are all taken, a newcomer takes the slot of the oldest connection
    that has not sent a complete request head yet (it is closed without an answer), as the MySQL port does for
    connections not logged in yet: idle or trickling sockets cannot keep /status and /metrics from answering. Only
    when every slot is serving a request does a newcomer get 503. A request head must arrive whole within
    REQUEST_TIMEOUT and MAX_REQUEST_BYTES; an answer not read within WRITE_TIMEOUT is dropped."""

    def __init__(self, status: Callable[[], dict[str, Any]], *, fsync: FsyncStats | None = None,
                 hop: HopTimes | None = None, max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS):
        self._status = status
        self.max_connections = max_connections
        self._waiting: dict[int, _Connection] = {}  # connections without a complete request head, oldest first
        self._serving: dict[int, _Connection] = {}
        self._ids = itertools.count()
        self._refused = 0  # connections answered 503 since the last log line about it
        self.dropped_idle = 0  # connections closed to make room for a newcomer, since the start
        self._dropped_unlogged = 0
        self._drop_logged_at: float | None = None
        self.refused_busy = 0  # connections answered 503 (every slot serving a request), since the start
        self._registry = build_registry(self._document, fsync, hop=hop)
        self._failure_log = PeerLogLimiter()  # a failing request is one line per client host, a few a minute
        self._server: asyncio.AbstractServer | None = None

    def _document(self) -> dict[str, Any]:
        """The /status document: the relay's, plus this port's own connection counts."""
        doc = self._status()
        doc["http"] = self.describe()
        return doc

    @property
    def _active(self) -> int:
        return len(self._waiting) + len(self._serving)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        # limit: readuntil() refuses a request head longer than this without buffering more of it
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_REQUEST_BYTES)
        sock = self._server.sockets[0].getsockname()
        log.info("http api listening", host=sock[0], port=sock[1])
        return sock[0], sock[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _make_room(self) -> bool:
        """Free a slot for a newcomer by closing the oldest connection still without a complete request; False
        when every slot is serving a request."""
        if not self._waiting:
            return False
        key = next(iter(self._waiting))
        oldest = self._waiting.pop(key)
        oldest.dropped = True
        self.dropped_idle += 1
        oldest.writer.transport.abort()  # its reader wakes with an error and its handler ends; no answer owed
        # One line a minute at most, with the count since the last one: a flood is not a log flood.
        self._dropped_unlogged += 1
        now = time.monotonic()
        if self._drop_logged_at is None or now - self._drop_logged_at >= 60.0:
            log.warning("http connections at the cap: closed the oldest without a complete request to make room",
                        limit=self.max_connections, closed=self._dropped_unlogged)
            self._drop_logged_at, self._dropped_unlogged = now, 0
        return True

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= self.max_connections and not self._make_room():
            # Every slot is answering a request: a fixed answer without reading this one. Logged once per burst,
            # not once per connection.
            if self._refused == 0:
                log.warning("http connections over the cap: answering 503", limit=self.max_connections)
            self._refused += 1
            self.refused_busy += 1
            try:
                writer.write(_BUSY)
            finally:
                writer.close()
            return
        if self._refused:
            log.info("http connections back under the cap", refused=self._refused)
            self._refused = 0
        key = next(self._ids)
        conn = _Connection(writer)
        self._waiting[key] = conn
        try:
            await self._serve(reader, writer, key, conn)
        finally:
            self._waiting.pop(key, None)
            self._serving.pop(key, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int,
                     conn: _Connection) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            if len(head) > MAX_REQUEST_BYTES:
                raise ValueError("request head too large")
            if self._waiting.pop(key, None) is None:
                return  # dropped to make room just as its request arrived
            self._serving[key] = conn
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                await self._respond(writer, 400, "text/plain", b"bad request\n")
                return
            method, target = parts[0], parts[1].split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                await self._respond(writer, 405, "text/plain", b"only GET\n", extra=b"Allow: GET, HEAD\r\n")
            elif target == "/status":
                body = json.dumps(self._document(), indent=2).encode() + b"\n"
                await self._respond(writer, 200, "application/json", body, head_only=method == "HEAD")
            elif target == "/metrics":
                body = generate_latest(self._registry)
                await self._respond(writer, 200, "text/plain; version=0.0.4; charset=utf-8", body, head_only=method == "HEAD")
            else:
                await self._respond(writer, 404, "text/plain", b"not found: try /status or /metrics\n")
        except asyncio.TimeoutError:
            conn.dropped = True  # no complete request in time, or the answer not read in time: nothing more owed
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            pass  # a broken or slow client affects only itself
        except Exception as exc:
            peer = writer.get_extra_info("peername")
            ref = report_failure(log, self._failure_log, peer[0] if peer else "?", "http request failed", exc)
            try:
                await self._respond(writer, 500, "text/plain", f"internal error (reference {ref})\n".encode())
            except (ConnectionError, asyncio.TimeoutError):
                conn.dropped = True
        finally:
            if conn.dropped:
                writer.transport.abort()
            else:
                writer.close()

    def describe(self) -> dict[str, Any]:
        return {"max_connections": self.max_connections, "connections": self._active,
                "waiting_for_request": len(self._waiting), "dropped_idle": self.dropped_idle,
                "refused_busy": self.refused_busy}

    @staticmethod
    async def _respond(writer, code: int, ctype: str, body: bytes, *, head_only: bool = False, extra: bytes = b"") -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}[code]
        writer.write(
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\nCache-Control: no-store\r\n".encode()
            + extra
            + b"\r\n"
            + (b"" if head_only else body)
        )
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
