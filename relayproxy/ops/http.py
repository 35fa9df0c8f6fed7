"""HTTP endpoints on --http: GET /status (JSON) and GET /metrics (Prometheus text), asyncio only."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from prometheus_client import generate_latest

from ..log import PeerLogLimiter, get_logger, report_failure
from .metrics import FsyncStats, build_registry

log = get_logger("relayproxy.http")

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT = 10.0
DEFAULT_HTTP_MAX_CONNECTIONS = 64
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 25\r\n"
         b"Connection: close\r\nRetry-After: 1\r\n\r\ntoo many HTTP connections\n")


class HttpApi:
    """A deliberately small HTTP/1.1 server: two read-only GET endpoints, one request per connection."""

    def __init__(self, status: Callable[[], dict[str, Any]], *, fsync: FsyncStats | None = None,
                 max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS):
        self._status = status
        self.max_connections = max_connections
        self._active = 0
        self._refused = 0  # connections answered 503 since the last log line about it
        self._registry = build_registry(status, fsync)
        self._failure_log = PeerLogLimiter()  # a failing request is one line per client host, a few a minute
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port)
        sock = self._server.sockets[0].getsockname()
        log.info("http api listening", host=sock[0], port=sock[1])
        return sock[0], sock[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= self.max_connections:
            # Over the cap: a fixed answer without reading the request, so slow or idle clients cannot hold
            # descriptors the relay needs. Logged once per burst, not once per connection.
            if self._refused == 0:
                log.warning("http connections over the cap: answering 503", limit=self.max_connections)
            self._refused += 1
            try:
                writer.write(_BUSY)
            finally:
                writer.close()
            return
        if self._refused:
            log.info("http connections back under the cap", refused=self._refused)
            self._refused = 0
        self._active += 1
        try:
            await self._serve(reader, writer)
        finally:
            self._active -= 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            if len(head) > MAX_REQUEST_BYTES:
                raise ValueError("request head too large")
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                await self._respond(writer, 400, "text/plain", b"bad request\n")
                return
            method, target = parts[0], parts[1].split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                await self._respond(writer, 405, "text/plain", b"only GET\n", extra=b"Allow: GET, HEAD\r\n")
            elif target == "/status":
                body = json.dumps(self._status(), indent=2).encode() + b"\n"
                await self._respond(writer, 200, "application/json", body, head_only=method == "HEAD")
            elif target == "/metrics":
                body = generate_latest(self._registry)
                await self._respond(writer, 200, "text/plain; version=0.0.4; charset=utf-8", body, head_only=method == "HEAD")
            else:
                await self._respond(writer, 404, "text/plain", b"not found: try /status or /metrics\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError, ConnectionError):
            pass  # a broken or slow client affects only itself
        except Exception as exc:
            peer = writer.get_extra_info("peername")
            ref = report_failure(log, self._failure_log, peer[0] if peer else "?", "http request failed", exc)
            try:
                await self._respond(writer, 500, "text/plain", f"internal error (reference {ref})\n".encode())
            except ConnectionError:
                pass
        finally:
            writer.close()

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
        await writer.drain()
