"""The transaction indexer's child process (relay/txindex_child.py says why and how the relay talks to it).

Run as ``python -m relayproxy.relay.txindex_main RELAY_DIR`` by ``TxIndexProcess`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import IO

from . import closed_files, remote
from .txindex import TxIndexer
from .txindex_child import NICE


def _die_with_parent() -> None:
    """SIGKILL this process when the relay's thread that started it (its feeder, which lives as long as the child
    is wanted) dies, as when the relay process dies: Linux ``prctl(PR_SET_PDEATHSIG)``, best effort. The closed
    stdin ends the child anyway."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(relay_dir: Path, stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """The child's loop: a pass per line read on ``stdin`` (the newest of those waiting), an answer per pass."""
    state: dict = {"file": None, "position": 4, "files": []}
    lines: list[dict] = []
    arrived = threading.Condition()
    eof = threading.Event()

    def read() -> None:
        for raw in stdin:
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            with arrived:
                lines.append(message)
                arrived.notify()
        eof.set()
        indexer._stop.set()  # a pass in progress stops between two chunks
        with arrived:
            arrived.notify()

    indexer = TxIndexer(relay_dir, lambda: state["files"], lambda: (state["file"], state["position"]))
    threading.Thread(target=read, name="txindex-stdin", daemon=True).start()
    reported = (0, 0)
    while True:
        with arrived:
            arrived.wait_for(lambda: lines or eof.is_set())
            if not lines:
                return 0
            for message in lines:
                state.update(message)
            lines.clear()
        if not indexer.run_pass() or eof.is_set():
            return 0
        new_errors = min(indexer.error_count - reported[1], len(indexer.errors))
        answer = {"passes": indexer.passes, "finished": indexer.finished[reported[0]:],
                  "errors": list(indexer.errors)[len(indexer.errors) - new_errors:]}
        reported = (len(indexer.finished), indexer.error_count)
        try:
            stdout.write(json.dumps(answer).encode() + b"\n")
            stdout.flush()
        except (BrokenPipeError, OSError):
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="relayproxy's transaction indexer (started by the relay only)")
    parser.add_argument("relay_dir", type=Path)
    parser.add_argument("--log-format", default="json")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    _die_with_parent()
    try:
        os.nice(NICE)
    except OSError:
        pass
    from ..log import configure_logging

    configure_logging(args.log_format, args.log_level)
    closed_files.configure_from_env(args.relay_dir)
    remote.configure_from_env(args.relay_dir)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C to the relay's group: the relay closes stdin itself
    return serve(args.relay_dir, sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
