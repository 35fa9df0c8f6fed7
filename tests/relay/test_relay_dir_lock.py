"""One relay per relay directory: a second `relayproxy run` on the same directory is refused at start."""

from __future__ import annotations

import subprocess
import sys

from relayproxy.lab.harness import REPO, RelayProcess, free_port


def test_second_relay_on_the_same_directory_is_refused(tmp_path):
    relay_dir = tmp_path / "relay"
    # No master listens on this port: the first relay keeps retrying, holding its directory all along.
    first = RelayProcess(relay_dir, free_port()).start()
    try:
        second = subprocess.run(
            [sys.executable, "-m", "relayproxy.commands.cli", "run", "--master", f"127.0.0.1:{free_port()}", "--user", "repl",
             "--password", "x", "--server-id", "101", "--relay-dir", str(relay_dir)],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )
        assert second.returncode == 1, second
        assert f"relay directory {relay_dir} is in use by another relayproxy (pid {first.proc.pid})" in second.stderr
        assert first.proc.poll() is None and first.status()["relay_files"] == 0
    finally:
        first.kill9()
    # The kernel drops an flock when its holder dies, however it dies: no stale lock after kill -9.
    again = RelayProcess(relay_dir, free_port()).start()
    again.stop()
    assert (relay_dir / "relayproxy.lock").read_text().strip().isdigit()
