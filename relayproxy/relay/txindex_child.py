"""The transaction indexer (relay/txindex.py's ``TxIndexer``) in a child process of the relay.

Indexing parses every durable event a second time. In a thread of the relay process that parsing holds the GIL in
bursts, and every transaction on the hop (the event loop, the fsync thread, the loop again) waits for the GIL behind
them: it measured as milliseconds of semi-sync commit tail at the master (benchmarks/results/hop_latency.md). In a
child process (lower CPU priority, ``nice`` 10) it takes no GIL of the relay's.

The relay process keeps a ``TxIndexProcess`` with ``TxIndexer``'s surface (``start``, ``close``, ``wait_idle``,
``passes``, ``finished``, ``errors``). A feeder thread writes the horizon and the file list to the child's stdin
every ``poll_seconds`` (the list only when it changed), one JSON line each; the child runs one pass per line it
reads (the newest only, when several wait) and answers with one line a pass (its pass count, the files it finished,
its errors). Only durable bytes are indexed, as in the thread: the child reads what the horizon says is on disk.

The child ends when its stdin closes (``close``) and when the relay process dies (``PR_SET_PDEATHSIG``), and a child
that dies otherwise is started again after ``RESPAWN_DELAY``; its sidecars are written atomically or repaired on
the next start, as after any crash. Encrypted and offloaded closed files are read with the relay's keyring and
archive options, passed in the environment (``closed_files.child_environment``).

The child's side is relay/txindex_main.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from collections import deque
from typing import Callable

from ..log import get_logger, logging_settings
from .closed_files import child_environment
from .txindex import KEPT_ERRORS

log = get_logger(__name__)

RESPAWN_DELAY = 1.0  # seconds before a child that died is started again
STOP_TIMEOUT = 10.0  # seconds close() waits for the child after closing its stdin, before killing it
NICE = 10  # the child's CPU priority against the relay's (0)


class TxIndexProcess:
    """``TxIndexer``'s surface over a child process (module docstring)."""

    def __init__(self, relay_dir: Path, files: Callable[[], list[str]], horizon: Callable[[], tuple[str | None, int]],
                 *, poll_seconds: float = 0.5):
        self.relay_dir = Path(relay_dir)
        self._files = files
        self._horizon = horizon
        self.poll_seconds = poll_seconds
        self.finished: list[str] = []
        self.errors: deque[str] = deque(maxlen=KEPT_ERRORS)  # the newest; error_count counts them all
        self.error_count = 0
        self.passes = 0  # the passes of every child so far
        self.starts = 0  # children started (more than 1: one died and was replaced)
        self._base = 0  # passes of the children before the current one
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._proc: subprocess.Popen | None = None
        self._feeder: threading.Thread | None = None

    def start(self) -> None:
        if self._feeder is None and not self._stop.is_set():
            self._feeder = threading.Thread(target=self._feed, name="relay-txindex-feed", daemon=True)
            self._feeder.start()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait for two whole passes of the child after this call (tests, benchmarks), as ``TxIndexer.wait_idle``."""
        with self._cond:
            target = self.passes + 2
            self._wake.set()
            return self._cond.wait_for(lambda: self.passes >= target or self._stop.is_set(), timeout)

    # -- the relay process's side --------------------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen:
        settings = logging_settings()
        env = {**os.environ, **child_environment(self.relay_dir)}
        root = str(Path(__file__).resolve().parents[2])  # relayproxy importable as the relay imported it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen([sys.executable, "-m", "relayproxy.relay.txindex_main", os.fspath(self.relay_dir),
                                 "--log-format", settings["format"], "--log-level", str(settings["level"])],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.starts += 1
        threading.Thread(target=self._read, args=(proc,), name="relay-txindex-read", daemon=True).start()
        return proc

    def _feed(self) -> None:
        sent_files: list[str] | None = None
        while not self._stop.is_set():
            proc = self._proc
            if proc is None or proc.poll() is not None:
                if proc is not None:
                    self._child_gone(proc)
                    if not self.relay_dir.exists():
                        break  # the directory is gone (a test's, a removed relay): nothing left to index
                    if self._stop.wait(RESPAWN_DELAY):
                        break
                try:
                    proc = self._proc = self._spawn()
                except OSError as exc:
                    self._error(f"cannot start the transaction indexer: {exc}")
                    log.error("transaction indexer not started: retried", error=str(exc))
                    self._proc = None
                    if self._stop.wait(RESPAWN_DELAY):
                        break
                    continue
                sent_files = None
            file, position = self._horizon()
            files = self._files()
            message: dict = {"file": file, "position": position}
            if files != sent_files:
                message["files"] = sent_files = files
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(message).encode() + b"\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # the child is going: noticed at the next turn, after the wait (no spinning on a dead pipe)
            if self._wake.wait(self.poll_seconds):
                self._wake.clear()
        self._close_child()

    def _child_gone(self, proc: subprocess.Popen) -> None:
        message = f"the transaction indexer (pid {proc.pid}) exited with status {proc.returncode}: started again"
        self._error(message)
        log.warning("transaction indexer exited: started again", pid=proc.pid, status=proc.returncode)
        with self._cond:
            self._base = self.passes

    def _read(self, proc: subprocess.Popen) -> None:
        """One child's answers: a JSON line per pass."""
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                answer = json.loads(line)
                passes = int(answer["passes"])
            except (ValueError, KeyError, TypeError):
                continue
            with self._cond:
                self.finished += answer.get("finished", [])
                for error in answer.get("errors", []):
                    self._error(error)
                self.passes = self._base + passes
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _error(self, message: str) -> None:
        self.errors.append(message)
        self.error_count += 1

    def describe(self) -> dict:
        """As ``TxIndexer.describe``, with the child's pid and how many children were started (1 + restarts)."""
        proc = self._proc
        return {"mode": "child", "passes": self.passes, "files_finished": len(self.finished),
                "errors": self.error_count, "last_error": self.errors[-1] if self.errors else None,
                "child_pid": proc.pid if proc is not None and proc.poll() is None else None,
                "child_starts": self.starts}

    def _close_child(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the child ends its pass, then exits
        except OSError:
            pass
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.warning("transaction indexer did not stop in time: killed", pid=proc.pid)
            proc.kill()
            proc.wait()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._feeder is not None:
            self._feeder.join()
            self._feeder = None
        else:
            self._close_child()
        with self._cond:
            self._cond.notify_all()
