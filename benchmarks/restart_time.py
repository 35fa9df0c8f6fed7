"""Restart time of a relay directory with and without the recovery checkpoint and the per-file indexes.

Two measurements, each the median of 3:

- recovery alone: ``RelayStore.open`` (recovery of the newest file, the store ready to write) against the newest
  file's size, with the checkpoint a clean stop leaves, and with it removed (the full scan);
- the catalog at start: ``FileCatalog.purged()`` (gtid_purged: it needs the GTIDs inside every closed file) against
  the total size of the closed files, with valid indexes, and with the indexes removed (every file scanned; the
  indexes are rebuilt and removed again before the next run).

The files are MySQL 8 binlogs written here: GTID transactions of one ~64 KB row event each.

    .venv/bin/python benchmarks/restart_time.py [--newest 10,100,1000] [--closed 1000] [--dir /path]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.benchinfo import command_line, commit_info, machine_info, machine_section, pyplot  # noqa: E402
from relayproxy.binlog import constants as C  # noqa: E402
from relayproxy.relay import RelayStore  # noqa: E402
from relayproxy.relay import fileindex as FI  # noqa: E402
from relayproxy.relay import recovery as R  # noqa: E402
from relayproxy.relay.catalog import FileCatalog  # noqa: E402
from relayproxy.relay.checkpoint import CHECKPOINT_NAME  # noqa: E402
from tests import eventgen as E  # noqa: E402

SID = bytes(range(16))
ROW = 64 << 10
RESULTS = Path(__file__).resolve().parent / "results"


def _event(type_code: int, body: bytes, end: int) -> bytes:
    size = C.HEADER_LEN + len(body) + 4
    raw = struct.pack("<IBIIIH", 1700000000, type_code, 1, size, end + size, 0) + body
    return raw + struct.pack("<I", zlib.crc32(raw))


def write_binlog(path: Path, megabytes: int, first_gno: int, next_name: str | None) -> int:
    """A binlog of about ``megabytes`` MB at ``path``; returns the next GNO."""
    head = bytearray(E.binlog_file(E.previous_gtids()))
    gno = first_gno
    target = megabytes << 20
    payload = bytes(ROW)
    with open(path, "wb") as f:
        f.write(head)
        end = len(head)
        while end < target:
            chunk = bytearray()
            for _ in range(64):
                for type_code, body in (
                    (C.GTID_LOG_EVENT, struct.pack("<B16sqBqq", 1, SID, gno, 2, 0, 1)),
                    (C.QUERY_EVENT, struct.pack("<IIBHH", 7, 0, 4, 0, 5) + bytes(5) + b"test\0BEGIN"),
                    (C.WRITE_ROWS_EVENT, payload),
                    (C.XID_EVENT, struct.pack("<Q", gno)),
                ):
                    ev = _event(type_code, body, end)
                    chunk += ev
                    end += len(ev)
                gno += 1
            f.write(chunk)
        if next_name is not None:
            body = struct.pack("<Q", 4) + next_name.encode()
            f.write(_event(C.ROTATE_EVENT, body, end))
    return gno


def timed(fn, repeat: int = 3, before=None) -> list[float]:
    out = []
    for _ in range(repeat):
        if before is not None:
            before()
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


def newest_rows(base: Path, sizes: list[int]) -> list[dict]:
    rows = []
    for mb in sizes:
        relay = base / f"newest-{mb}"
        relay.mkdir()
        name = "binlog.000001"
        write_binlog(relay / name, mb, 1, None)
        R.write_index(relay, [name])
        store = RelayStore.open(relay)  # one full scan, then a clean stop: the checkpoint at the horizon
        size = store.current_end
        store.close()
        cp = (relay / CHECKPOINT_NAME).read_bytes()

        def open_close():
            RelayStore.open(relay).close()

        def restore_cp():
            (relay / CHECKPOINT_NAME).write_bytes(cp)

        def drop_cp():
            (relay / CHECKPOINT_NAME).unlink(missing_ok=True)

        with_cp = timed(open_close, before=restore_cp)
        without = timed(open_close, before=drop_cp)
        rows.append({"what": "newest file", "mb": size / 1e6, "with": with_cp, "without": without})
        shutil.rmtree(relay)
    return rows


def closed_rows(base: Path, totals: list[int], file_mb: int = 100) -> list[dict]:
    rows = []
    for total in totals:
        relay = base / f"closed-{total}"
        relay.mkdir()
        n = max(1, total // file_mb)
        names = [f"binlog.{i:06d}" for i in range(1, n + 2)]
        gno = 1
        for i, name in enumerate(names[:-1]):
            gno = write_binlog(relay / name, file_mb, gno, names[i + 1])
        write_binlog(relay / names[-1], 1, gno, None)
        R.write_index(relay, names)
        store = RelayStore.open(relay)
        size = sum((relay / name).stat().st_size for name in names[:-1])

        def purged():
            FileCatalog(store).purged()

        def drop_indexes():
            for name in names:
                FI.remove(relay, name)

        purged()  # builds and writes the indexes
        with_idx = timed(purged)
        without = timed(purged, before=drop_indexes)
        store.close()
        rows.append({"what": "closed files", "mb": size / 1e6, "files": n, "with": with_idx, "without": without})
        shutil.rmtree(relay)
    return rows


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--newest", default="10,100,1000", help="newest-file sizes, MB")
    ap.add_argument("--closed", default="1000", help="total sizes of closed files, MB (100 MB files)")
    ap.add_argument("--dir", default=None, help="where to write the relay directories (default: a temp dir)")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="restart-time-", dir=args.dir))
    try:
        rows = newest_rows(base, [int(x) for x in args.newest.split(",") if x])
        rows += closed_rows(base, [int(x) for x in args.closed.split(",") if x])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = statistics.median
    lines = [
        "# Restart time: recovery checkpoint and per-file indexes",
        "",
        "Produced by (from the repository root):",
        "",
        "```",
        command_line(__file__, argv),
        "```",
        "",
        f"Commit: {commit_info()}",
        "",
        "Median of 3 (min-max in brackets), seconds. *Newest file*: `RelayStore.open` + `close` of a relay directory "
        "whose newest file has that size, after a clean stop (checkpoint at the horizon) and with the checkpoint "
        "removed (full scan). *Closed files*: `FileCatalog.purged()` over closed files of 100 MB, with valid "
        "indexes and with the indexes removed (each file scanned). MySQL 8 binlogs written by the benchmark: GTID "
        "transactions of one 64 KB row event.",
        "",
        "| what | MB | with checkpoint / index | without (full scan) | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        w, wo = row["with"], row["without"]
        lines.append(
            f"| {row['what']}{' (' + str(row['files']) + ' files)' if 'files' in row else ''} | {row['mb']:,.0f} | "
            f"{med(w):.3f} [{min(w):.3f}-{max(w):.3f}] | {med(wo):.3f} [{min(wo):.3f}-{max(wo):.3f}] | "
            f"{med(wo) / max(med(w), 1e-9):,.0f}x |"
        )
    lines += [
        "",
        "A restart after a crash (no clean stop) scans, on top of the figure with the checkpoint, the bytes "
        "written since the last checkpoint: at most 16 MB or 10 s of stream (`CHECKPOINT_BYTES`, "
        "`CHECKPOINT_SECONDS` in relay/store.py), at the full-scan rate of the last column.",
        "",
        *machine_section(machine_info()),
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "restart_time.md").write_text("\n".join(lines) + "\n")
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, what in zip(axes, ("newest file", "closed files")):
            sel = [r for r in rows if r["what"] == what]
            xs = [r["mb"] for r in sel]
            ax.plot(xs, [med(r["with"]) for r in sel], "o-", label="with checkpoint / index")
            ax.plot(xs, [med(r["without"]) for r in sel], "s--", label="full scan")
            ax.set_xlabel(f"{what}, MB")
            ax.set_ylabel("seconds")
            ax.set_title(what)
            ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "restart_time.png", dpi=100)
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
