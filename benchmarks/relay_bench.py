"""What the relay benchmarks share beyond benchmarks/common.py: the corpus folder, a relay's JSON log, binlog bytes
with the FDE's in-use flag cleared, py-spy's raw stacks, and a report measured or read back from its JSON."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.common import REPO_ROOT
from relayproxy.binlog import constants as C


def corpus_dir() -> Path:
    """The shared corpus of real binlogs: ``$RELAYPROXY_CORPUS``, else ``../shared/corpus/binlogs``."""
    return Path(os.environ.get("RELAYPROXY_CORPUS") or REPO_ROOT.parent / "shared" / "corpus" / "binlogs")


def json_log(path: Path, offset: int = 0) -> Iterator[dict]:
    """The JSON entries of a relay's log from byte ``offset`` on (lines that are not JSON objects are skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                yield entry


def clear_in_use(data: bytes) -> bytes:
    """A binlog file's bytes (or first chunk) with the FDE's LOG_EVENT_BINLOG_IN_USE_F cleared: the one byte a
    relay's copy of the master's active file may differ in."""
    if len(data) <= 4 + 19:
        return data
    buf = bytearray(data)
    buf[4 + 17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    return bytes(buf)


# -- py-spy ------------------------------------------------------------------------------------------------------

def py_spy_exe() -> str | None:
    """py-spy on PATH or beside this Python; None when it is not installed."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return exe if Path(exe).exists() else None


def py_spy_stacks(text: str) -> list[tuple[str, list[str], int]]:
    """py-spy's ``--format raw --threads`` output: per stack its thread ("?" if unnamed), frames (outermost first),
    sample count."""
    out = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread (", "process ")) else "?"
        out.append((thread, [f for f in frames if not f.startswith(("thread (", "process "))], int(count)))
    return out


def frame_parts(frame: str) -> tuple[str, str, str]:
    """A py-spy frame, ``function (path:line)``: (function, path, line)."""
    func, _, where = frame.partition(" (")
    path, _, line = where.rstrip(")").rpartition(":")
    return func, path, line


def short_path(path: str) -> str:
    """A frame's path from the package on (py-spy shortens most paths itself)."""
    stdlib = f"/lib/python{sys.version_info[0]}.{sys.version_info[1]}/"
    for marker in (str(REPO_ROOT) + "/", "site-packages/", stdlib):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


# -- the report: measured, or read back ------------------------------------------------------------------------

def report_of(args, measure: Callable[[], dict]) -> dict:
    """The run's report (``common.add_report_options``): with ``--render`` the saved one, else ``measure()``'s (JSON
    logging at warning level: stdout stays clean), saved to ``--save-json``; ``--notes`` goes in as "notes"."""
    if args.render is not None:
        report = json.loads(args.render.read_text())
    else:
        from relayproxy.log import configure_logging

        configure_logging(fmt="json", level="warning")
        report = measure()
        if args.save_json is not None:
            args.save_json.parent.mkdir(parents=True, exist_ok=True)
            args.save_json.write_text(json.dumps(report, indent=1, default=str))
    if args.notes is not None:
        report["notes"] = args.notes.read_text()
    return report
