"""`relayproxy status --http` exit codes, as the README's health checks use them: 0 when the relay's IO side runs,
3 when it does not, 1 when the relay cannot be read. A stand-in /status server answers for the relay."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

pytestmark = pytest.mark.slow  # three CLI subprocesses: ~2.5 s


def _serve(document: dict) -> HTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps(document).encode()
            self.send_response(200 if self.path == "/status" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _status(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "status", "--json", "--http",
                           f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)


def test_status_exits_0_running_3_not_running_1_unreachable():
    for io_running, want in ((True, 0), (False, 3)):
        server = _serve({"io_running": io_running, "last_io_error": None if io_running else "master gone"})
        try:
            done = _status(server.server_address[1])
        finally:
            server.shutdown()
            server.server_close()
        assert done.returncode == want, (io_running, done.stdout, done.stderr)
        assert json.loads(done.stdout)["io_running"] is io_running
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    done = _status(closed)
    assert done.returncode == 1 and "cannot read" in done.stderr, done.stderr
