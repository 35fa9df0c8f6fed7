"""HTTP endpoints on --http: GET /status (JSON) and GET /metrics (Prometheus text), asyncio only."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .log import get_logger

log = get_logger("relayproxy.http")

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT = 10.0


class StatusCollector:
    """Prometheus collector reading the status document at scrape time (no double bookkeeping)."""

    def __init__(self, status: Callable[[], dict[str, Any]]):
        self._status = status

    def collect(self):
        s = self._status()
        labels = ["master_log_file"]
        g = GaugeMetricFamily("relayproxy_horizon_position_bytes", "Read_Master_Log_Pos: end of the last durable transaction", labels=labels)
        g.add_metric([s["master_log_file"] or ""], s["read_master_log_pos"] or 0)
        yield g
        yield GaugeMetricFamily("relayproxy_io_running", "1 while the upstream connection streams", value=int(bool(s["io_running"])))
        if s.get("lag_bytes") is not None:
            yield GaugeMetricFamily("relayproxy_lag_bytes", "master position minus horizon (same file)", value=s["lag_bytes"])
        if s.get("seconds_behind_master") is not None:
            yield GaugeMetricFamily("relayproxy_lag_seconds", "seconds behind the master", value=s["seconds_behind_master"])
        for key, help_text in (
            ("events_received", "binlog events received from the master"),
            ("bytes_received", "binlog bytes received from the master"),
            ("transactions_received", "complete transactions received"),
            ("connects", "successful connections to the master"),
            ("connect_failures", "upstream connections that ended in an error"),
            ("semi_sync_acks", "semi-sync ACKs sent to the master after durable writes"),
        ):
            yield CounterMetricFamily(f"relayproxy_{key}", help_text, value=s.get(key) or 0)
        yield GaugeMetricFamily("relayproxy_relay_files", "relay files on disk", value=s.get("relay_files") or 0)


class HttpApi:
    """A deliberately small HTTP/1.1 server: two read-only GET endpoints, one request per connection."""

    def __init__(self, status: Callable[[], dict[str, Any]]):
        self._status = status
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(StatusCollector(status))
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port)
        sock = self._server.sockets[0].getsockname()
        log.info("http api listening", address=f"{sock[0]}:{sock[1]}")
        return sock[0], sock[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        except Exception:
            log.exception("http request failed")
            try:
                await self._respond(writer, 500, "text/plain", b"internal error\n")
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
