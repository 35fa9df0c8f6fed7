"""Test harness: run `relayproxy run` as a real process, read its /status, compare its files with the master's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from relayproxy.binlog import constants as C

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RelayProcess:
    """One `relayproxy run` process; restartable on the same relay directory."""

    def __init__(self, relay_dir: Path, master_port: int, *, user="repl", password="replpw", server_id=100,
                 gtid_mode="off", extra: list[str] | None = None, env: dict | None = None):
        self.relay_dir = Path(relay_dir)
        self.http_port = free_port()
        self.args = [
            sys.executable, "-m", "relayproxy.cli", "--log-format", "json", "run",
            "--master", f"127.0.0.1:{master_port}", "--user", user, "--server-id", str(server_id),
            "--relay-dir", str(self.relay_dir), "--http", f"127.0.0.1:{self.http_port}",
            "--gtid-mode", gtid_mode, "--heartbeat-period", "0.5", "--reconnect-max-delay", "0.5",
            *(extra or []),
        ]
        self.env = {**os.environ, "RELAYPROXY_PASSWORD": password, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log_path = self.relay_dir.parent / f"{self.relay_dir.name}.log"

    def start(self) -> "RelayProcess":
        self.relay_dir.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"relay exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.status()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"relay did not serve /status within 30 s:\n{self.log_tail()}")

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/status", timeout=5) as r:
            return json.load(r)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"relay exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status = self.status()
                if predicate(status):
                    return status
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last status {status}\n{self.log_tail()}")

    def wait_caught_up(self, master, timeout: float = 60.0) -> dict:
        file, pos = master_status(master)
        return self.wait_for(
            lambda s: s["master_log_file"] == file and s["read_master_log_pos"] == pos,
            timeout, f"horizon at {file}:{pos}",
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if getattr(self, "_log", None):
            self._log.close()

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def master_status(master) -> tuple[str, int]:
    row = master.execute("SHOW MASTER STATUS")[0]
    return row[0], int(row[1])


def prepare_master(master) -> None:
    master.create_user("repl", "replpw")


def assert_files_equal_master(relay_dir: Path, master, *, up_to: tuple[str, int] | None = None) -> None:
    """Closed relay files equal the master's byte for byte; the active one too, up to the horizon.

    The only difference allowed is LOG_EVENT_BINLOG_IN_USE_F in the FDE of the master's active file,
    which the master clears when it sends the event.
    """
    names = [p.name for p in master.binlog_files()]
    relay_names = (relay_dir / "relayproxy.index").read_text().split()
    assert relay_names == names[names.index(relay_names[0]) : names.index(relay_names[0]) + len(relay_names)]
    for name in relay_names:
        mine = (relay_dir / name).read_bytes()
        theirs = (master.binlog_dir / name).read_bytes()
        if up_to is not None and name == up_to[0]:
            theirs = theirs[: up_to[1]]
            assert len(mine) == up_to[1], (name, len(mine), up_to)
        else:
            theirs = theirs[: len(mine)] if name == relay_names[-1] else theirs
        a, b = bytearray(mine), bytearray(theirs)
        for buf in (a, b):
            if len(buf) > 4 + 19:
                buf[4 + 17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
        assert a == b, f"{name}: relay file differs from the master's (sizes {len(mine)} / {len(theirs)})"
