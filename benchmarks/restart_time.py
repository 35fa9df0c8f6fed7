"""Restart time of a relay directory with and without the recovery checkpoint and the per-file indexes.

Each the median of ``--runs``, with the checkpoint / indexes a clean stop leaves and with them removed: recovery
alone (``RelayStore.open``: without the checkpoint, a full scan of the newest file), the catalog at start
(``FileCatalog.purged()``: without the indexes, every closed file scanned), a start as the store sees it, and the
whole restart as an operator sees it: ``relayproxy run --listen`` spawned until a real ``mariadb-binlog --raw`` has
the newest file and ``SELECT @@GLOBAL.gtid_purged`` is answered (its master the scripted MySQL master of
tests/support/fakemaster.py). The files are MySQL binlogs written here, in a warm page cache. The results file
describes the set-up.

    .venv/bin/python benchmarks/restart_time.py [--newest 10,100,1000] [--closed 1000,10000] [--runs 3]
        [--serve] [--dir /path]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks.benchinfo import alternating_orders, fmt_median_range, median_range  # noqa: E402
from benchmarks.common import RESULTS_DIR, machine_info, pyplot, results_document, save_figure  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from relayproxy.binlog import constants as C  # noqa: E402
from relayproxy.lab.relayprocess import RelayProcess, free_port  # noqa: E402
from relayproxy.relay import RelayStore  # noqa: E402
from relayproxy.relay import fileindex as FI  # noqa: E402
from relayproxy.relay import durable as DU  # noqa: E402
from relayproxy.relay.catalog import FileCatalog  # noqa: E402
from relayproxy.relay.checkpoint import CHECKPOINT_NAME  # noqa: E402
from tests.support import eventgen as E  # noqa: E402
from tests.support.fakemaster import FakeMySQLMaster  # noqa: E402

SID = bytes(range(16))
ROW = 64 << 10
FILE_MB = 100  # closed files of the total-size series
NEWEST_MB = 1  # the newest file of the total-size series
# mariadb-binlog refuses a server whose version starts with 8 ("unrecognized MariaDB version"); it reads MySQL 5.x
# servers, so the files carry a MySQL 5.7 FORMAT_DESCRIPTION (GTID transactions as 5.7 and 8.0 write them; the
# relay's work on them does not depend on the version).
FILE_VERSION = "5.7.44-log"
SPARE_BYTES = 2 << 30  # free space left over after a directory is written
USER, PASSWORD = "repl", "replpw"
STORE_KINDS = ("newest file", "closed files", "store start")
PROCESS_KINDS = ("run: newest file", "run: closed files", "serve: closed files")
ORDER = (*STORE_KINDS, *PROCESS_KINDS)
STEPS = (("listening", "listening"), ("served", "newest file served"), ("purged", "gtid_purged answered"))


def require_space(where: Path, needed: int, what: str) -> None:
    """Refuse (exit with a message) unless ``needed`` bytes plus a spare 2 GiB are free where ``what`` goes."""
    free = shutil.disk_usage(where).free
    if free < needed + SPARE_BYTES:
        raise SystemExit(
            f"restart_time: {what} needs {needed / 1e9:.1f} GB plus {SPARE_BYTES / 1e9:.1f} GB spare in {where}, "
            f"but only {free / 1e9:.1f} GB is free: free space, pass --dir on a larger disk, or lower --closed"
        )


def _event(type_code: int, body: bytes, end: int) -> bytes:
    return E.event(type_code, body, log_pos=end + C.HEADER_LEN + len(body) + 4)


def write_binlog(path: Path, megabytes: int, first_gno: int, next_name: str | None) -> tuple[int, int]:
    """A binlog of about ``megabytes`` MB at ``path``; returns the next GNO and the offset of the last GTID event."""
    head = E.binlog_file(E.previous_gtids(), server_version=FILE_VERSION)
    gno = first_gno
    last_gtid = 0
    payload = bytes(ROW)
    with open(path, "wb") as f:
        f.write(head)
        end = len(head)
        while end < megabytes << 20:
            chunk = bytearray()
            for _ in range(64):
                last_gtid = end
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
            f.write(_event(C.ROTATE_EVENT, struct.pack("<Q", 4) + next_name.encode(), end))
    return gno, last_gtid


def with_without(fn, runs: int, drop, restore=None) -> dict:
    """Seconds of ``fn``, ``runs`` times with the start aids (``restore`` before each, if given), then ``runs``
    times with ``drop`` before each."""
    out: dict[str, list[float]] = {"with": [], "without": []}
    for variant, before in (("with", restore), ("without", drop)):
        for _ in range(runs):
            if before is not None:
                before()
            began = time.perf_counter()
            fn()
            out[variant].append(time.perf_counter() - began)
    return out


def drop_start_aids(relay: Path, names: list[str], checkpoint: bool = True) -> None:
    """Remove every file index, and the checkpoint: the next start scans."""
    if checkpoint:
        (relay / CHECKPOINT_NAME).unlink(missing_ok=True)
    for name in names:
        FI.remove(relay, name)


def newest_rows(base: Path, sizes: list[int], runs: int) -> list[dict]:
    rows = []
    for mb in sizes:
        relay = base / f"newest-{mb}"
        require_space(base, mb << 20, f"a newest file of {mb} MB")
        relay.mkdir()
        name = "binlog.000001"
        _, last_gtid = write_binlog(relay / name, mb, 1, None)
        DU.write_index(relay, [name])
        os.sync()  # the file just written reaches the disk now, not behind the measured starts' fsyncs
        store = RelayStore.open(relay)  # one full scan, then a clean stop: the checkpoint at the horizon
        size = store.current_end
        store.close()
        checkpoint = relay / CHECKPOINT_NAME
        saved = checkpoint.read_bytes()

        def restore_checkpoint():
            checkpoint.write_bytes(saved)

        rows.append({"what": "newest file", "mb": size / 1e6,
                     **with_without(lambda: RelayStore.open(relay).close(), runs,
                                    lambda: checkpoint.unlink(missing_ok=True), restore_checkpoint)})
        restore_checkpoint()
        rows += process_rows(relay, [name], base / "work", runs, False, what="run: newest file", mb=size / 1e6,
                             start_position=last_gtid)
        shutil.rmtree(relay)
    return rows


def make_closed_dir(base: Path, total_mb: int) -> tuple[Path, list[str]]:
    """A relay directory of ``total_mb`` MB of closed 100 MB files and a 1 MB newest file, as a relay leaves it
    after a clean stop: its index, the checkpoint, and an index for every closed file."""
    relay = base / f"closed-{total_mb}"
    n = max(1, total_mb // FILE_MB)
    require_space(base, (n * FILE_MB + NEWEST_MB) << 20, f"a relay directory of {n} x {FILE_MB} MB files")
    relay.mkdir()
    names = [f"binlog.{i:06d}" for i in range(1, n + 2)]
    gno = 1
    for i, name in enumerate(names[:-1]):
        gno, _ = write_binlog(relay / name, FILE_MB, gno, names[i + 1])
    write_binlog(relay / names[-1], NEWEST_MB, gno, None)
    DU.write_index(relay, names)
    store = RelayStore.open(relay)
    FileCatalog(store).purged()  # builds and writes the indexes
    store.close()  # a clean stop: the checkpoint at the horizon
    os.sync()  # the GBs just written reach the disk now, not behind the measured starts' fsyncs
    return relay, names


def closed_rows(relay: Path, names: list[str], runs: int) -> list[dict]:
    """``purged()`` alone (the row the benchmark always had) and ``open + purged() + close``, with and without."""
    size = {"mb": sum((relay / name).stat().st_size for name in names[:-1]) / 1e6, "files": len(names) - 1}
    store = RelayStore.open(relay)

    def purged():
        FileCatalog(store).purged()

    def start():
        started = RelayStore.open(relay)
        FileCatalog(started).purged()
        started.close()

    purged()  # the indexes are there (make_closed_dir); a first call warms the page cache for both
    rows = [{"what": "closed files", **size,
             **with_without(purged, runs, lambda: drop_start_aids(relay, names, checkpoint=False))}]
    store.close()
    start()  # rebuilds the indexes dropped above; its close leaves the checkpoint
    rows.append({"what": "store start", **size, **with_without(start, runs, lambda: drop_start_aids(relay, names))})
    return rows


# -- the whole restart: a relay process and a real client ------------------------------------------------------

class MasterThread:
    """The scripted MySQL 8 master (tests/support/fakemaster.py) holding the relay's newest file, on its own loop."""

    def __init__(self, name: str, data: bytes):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-master", daemon=True)
        self.thread.start()
        self.master = FakeMySQLMaster([(name, data)], user=USER, password=PASSWORD)
        asyncio.run_coroutine_threadsafe(self.master.start(), self.loop).result(30)
        self.port = self.master.port

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.master.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


def _gtid_purged(port: int) -> str:
    import pymysql

    with pymysql.connect(host="127.0.0.1", port=port, user=USER, password=PASSWORD, connect_timeout=600,
                         read_timeout=3600) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.gtid_purged")
        return cur.fetchone()[0]


def relay_start(command: str, relay: Path, names: list[str], work: Path, master_port: int | None,
                start_position: int = 4) -> dict:
    """Spawn ``relayproxy run`` (or ``serve``) on ``relay``; seconds from the spawn until it listens, until
    ``mariadb-binlog --raw`` has the newest file from ``start_position`` to its end (checked byte for byte), and
    until ``@@gtid_purged`` answers."""
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if tool is None:
        raise SystemExit("restart_time: mariadb-binlog (mariadb-client) is needed for the process measurement")
    users = ["--users", f"{USER}:{PASSWORD}:mysql_native_password"]
    if command == "run":
        where = {"master_port": master_port, "user": USER, "extra": [*users, "--ssl-mode", "disabled"]}
    else:
        where = {"command": "serve", "extra": users}
    # Bytecode cached as a pip install leaves it, in the work directory: a PYTHONDONTWRITEBYTECODE environment (this
    # machine's) would otherwise compile every module at every start (~0.2 s here), which no installed relay does.
    env = {"PYTHONPYCACHEPREFIX": str(work / "pycache"), "PYTHONDONTWRITEBYTECODE": None}
    # No --http: the relay starts only what a restart needs; ready means accepting on --listen.
    proc = RelayProcess(relay, password=PASSWORD, gtid_mode="off" if command == "run" else None,
                        heartbeat_period=None, reconnect_max_delay=None, http=False, listen=free_port(),
                        log_level="warning", env=env, log_path=work / f"{command}.log", error=RuntimeError,
                        **where)
    out = work / "download"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    newest = names[-1]
    try:
        proc.start(3600, ready="listen")
        began = proc.t_spawn
        listening = proc.t_up - began
        done = subprocess.run(
            [tool, "--read-from-remote-server", "--raw", "-h127.0.0.1", f"-P{proc.listen_port}", f"-u{USER}",
             f"-p{PASSWORD}", f"--result-file={out}/", f"--start-position={start_position}", newest],
            capture_output=True, text=True, timeout=3600,
        )
        served = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-binlog failed ({done.returncode}): {done.stderr.strip()}\n"
                               f"{proc.log_tail(20)}")
        got = (out / newest).read_bytes()
        with open(relay / newest, "rb") as f:
            f.seek(start_position)
            want = f.read()
        if not got.endswith(want) or (start_position == 4 and len(got) != len(want) + 4):
            raise RuntimeError(f"mariadb-binlog got {len(got)} bytes of {newest}, not the relay's bytes from "
                               f"{start_position}")
        _gtid_purged(proc.listen_port)
        purged = time.perf_counter() - began
    finally:
        returncode = proc.stop(120)
    shutil.rmtree(out, ignore_errors=True)
    if returncode not in (0, -signal.SIGTERM):
        raise RuntimeError(f"the relay exited with {returncode}:\n{proc.log_tail(20)}")
    return {"listening": listening, "served": served, "purged": purged}


def process_rows(relay: Path, names: list[str], work: Path, runs: int, serve: bool, *, what: str = "run: closed files",
                 mb: float | None = None, start_position: int = 4) -> list[dict]:
    size = sum((relay / name).stat().st_size for name in names[:-1])
    master = MasterThread(names[-1], (relay / names[-1]).read_bytes())
    try:
        relay_start("run", relay, names, work, master.port, start_position)  # its clean stop leaves the checkpoint

        def one(order):
            figures = {}
            for variant in order:
                if variant == "without":
                    drop_start_aids(relay, names)
                figures[variant] = relay_start("run", relay, names, work, master.port, start_position)
            return figures

        results = [one(order) for order in alternating_orders(runs, ["with", "without"])]
    finally:
        master.close()
    rows = [{"what": what, "mb": size / 1e6 if mb is None else mb, "files": len(names) - 1,
             "with": [r["with"] for r in results], "without": [r["without"] for r in results]}]
    if serve:
        rows.append({"what": "serve: closed files", "mb": size / 1e6, "files": len(names) - 1,
                     "with": [relay_start("serve", relay, names, work, None)], "without": None})
    return rows


# -- the results file and the plot -----------------------------------------------------------------------------

def _cell(values: list[float]) -> str:
    med, lo, hi = median_range(values)
    if len(values) == 1:
        return f"{med:.3f} (1 run)"
    return f"{med:.3f} [{lo:.3f}-{hi:.3f}]"


def _ratio(with_: list[float], without: list[float]) -> float:
    return statistics.median(without) / max(statistics.median(with_), 1e-9)


def render(rows: list[dict], argv: list[str], runs: int) -> str:
    lines = [
        "Seconds, median of the runs [min-max]. MySQL 8 binlogs written by the benchmark: GTID transactions of one "
        "64 KB row event; the total-size series has closed files of 100 MB and a newest file of 1 MB. Warm page "
        "cache (the files were just written or read; 23 GB of RAM), written back to disk (`os.sync()`) before the "
        "measurements. The full-scan figures depend on the event sizes: 64 KB row events scan at ~1-2 GB/s here, "
        "small OLTP events at ~55 MB/s (README, Limits); the figures with checkpoint and indexes do not.",
        "",
        "- *newest file*: `RelayStore.open` + `close` of a directory whose newest file has that size, after a clean "
        "stop (checkpoint at the horizon) and with the checkpoint removed (full scan of the newest file).",
        "- *closed files*: `FileCatalog.purged()` over the closed files, with valid indexes and with the indexes "
        "removed (each file scanned, its index written again).",
        "- *store start*: `RelayStore.open` + `FileCatalog.purged()` + `close`, with the checkpoint and indexes, and "
        "with both removed.",
        "",
        "| what | MB | with checkpoint / index | without (full scan) | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in (r for r in rows if r["what"] in STORE_KINDS):
        files = f" ({row['files']} files)" if "files" in row else ""
        lines.append(f"| {row['what']}{files} | {row['mb']:,.0f} | {_cell(row['with'])} | {_cell(row['without'])} | "
                     f"{_ratio(row['with'], row['without']):,.0f}x |")
    procs = [r for r in rows if r["what"] in PROCESS_KINDS]
    if procs:
        lines += [
            "",
            "## The whole restart: process spawn to a served client",
            "",
            "`relayproxy run --listen` spawned on the relay directory (after a clean stop: checkpoint and indexes "
            "present; *without*: both removed before the spawn; the two alternate in order from run to run), its "
            "master the scripted MySQL master of the tests (`tests/support/fakemaster.py`, in a thread of the "
            "benchmark) holding the relay's newest file, so the relay resumes from its horizon against bytes that "
            "match, as after a real restart (no MariaDB sandbox master can serve MySQL files). Seconds from `Popen` "
            "to: *listening* (a TCP connect to `--listen` succeeds, polled every 5 ms); *newest file served* (then a "
            "`mariadb-binlog --read-from-remote-server --raw` has exited with the newest file's bytes, checked "
            "against the relay's: with *closed files*, the whole 1 MB newest file; with *newest file*, from its last "
            "transaction, `--start-position`; its first event arrives before this); *gtid_purged answered* (then a "
            "PyMySQL `SELECT @@GLOBAL.gtid_purged` answered: what a MySQL auto-position replica's dump start "
            "computes, the step that reads every closed file's index, or scans the file when its index is missing). "
            "The interpreter's start and imports (bytecode cached by a first start, as a pip install leaves it) and "
            "the client's own start are in every figure.",
            "",
            "| command: series | MB (closed files) | step | with checkpoint + indexes | without (removed) | ratio |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for row in procs:
            command, series = row["what"].split(": ")
            where = f"{row['mb']:,.0f}" + (f" ({row['files']})" if series == "closed files" else "")
            for step, label in STEPS:
                w = [r[step] for r in row["with"]]
                head = f"| `relayproxy {command}`: {series} | {where} | {label} | {_cell(w)} |"
                if row["without"] is None:
                    lines.append(f"{head} (reads every file at start, by design) | |")
                else:
                    wo = [r[step] for r in row["without"]]
                    lines.append(f"{head} {_cell(wo)} | {_ratio(w, wo):,.1f}x |")
        for series in ("newest file", "closed files"):
            sel = [r for r in procs if r["what"] == f"run: {series}"]
            if len(sel) < 2:
                continue
            small, large = sel[0], sel[-1]
            lines += ["", f"`relayproxy run`, spawn to newest file served, {series}: {large['mb']:,.0f} MB against "
                      f"{small['mb']:,.0f} MB ({large['mb'] / small['mb']:.0f}x the bytes), run i against run i:"]
            for variant in ("with", "without"):
                ratios = [b["served"] / a["served"] for a, b in zip(small[variant], large[variant])]
                lines.append(f"- {variant} checkpoint + indexes: "
                             f"{fmt_median_range([r['served'] for r in large[variant]], '{:.3f}', ' s')} at "
                             f"{large['mb']:,.0f} MB; {fmt_median_range(ratios, '{:.2f}', 'x')} the time at "
                             f"{small['mb']:,.0f} MB")
    lines += [
        "",
        "A restart after a crash (no clean stop) scans, on top of the figure with the checkpoint, the bytes "
        "written since the last checkpoint: at most 16 MB or 10 s of stream (`CHECKPOINT_BYTES`, "
        "`CHECKPOINT_SECONDS` in relay/sync.py), at the full-scan rate of the *newest file* rows.",
        "",
    ]
    return results_document("Restart time: recovery checkpoint and per-file indexes", __file__, argv, machine_info(),
                            lines, runs=runs, what="with and without checkpoint/indexes alternated in the process rows")


PANELS = (("newest file", "newest file, MB", None), ("run: newest file", "newest file, MB", "served"),
          ("closed files", "closed files, MB", None), ("store start", "closed files, MB", None),
          ("run: closed files", "closed files, MB", "served"))


def plot(rows: list[dict]) -> None:
    plt = pyplot()
    if plt is None:
        return
    panels = [p for p in PANELS if any(r["what"] == p[0] for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4), squeeze=False)
    for ax, (what, xlabel, step) in zip(axes[0], panels):
        sel = [r for r in rows if r["what"] == what]
        xs = [r["mb"] for r in sel]
        for variant, style, label in (("with", "o-", "with checkpoint / index"),
                                      ("without", "s--", "without (full scan)")):
            vals = [r[variant] if step is None else [v[step] for v in r[variant]] for r in sel]
            mids = [statistics.median(v) for v in vals]
            err = [[m - min(v) for m, v in zip(mids, vals)], [max(v) - m for m, v in zip(mids, vals)]]
            ax.errorbar(xs, mids, yerr=err, fmt=style, capsize=3, label=label)
        ax.set_xscale("log")
        if step is None:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)  # a whole process start: linear from 0, with the runs' range as error bars
        ax.set_xlabel(xlabel)
        ax.set_ylabel("seconds")
        ax.set_title(what if step is None else f"relayproxy {what}:\nspawn to newest file served", fontsize=10)
        ax.legend(fontsize=8)
    save_figure(fig, RESULTS_DIR / "restart_time.png", dpi=100)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--newest", default="10,100,1000", help="newest-file sizes, MB")
    ap.add_argument("--closed", default="1000,10000", help="total sizes of closed files, MB (100 MB files; "
                    "default 1 and 10 GB)")
    ap.add_argument("--runs", type=int, default=3, help="runs of every measurement (median and range)")
    ap.add_argument("--serve", action="store_true", help="also relayproxy serve, one run a size (it scans all)")
    ap.add_argument("--dir", default=None, help="where to write the relay directories (default: a temp dir)")
    ap.add_argument("--no-write", action="store_true", help="print the results, do not write benchmarks/results")
    args = ap.parse_args(argv)
    totals = [int(x) for x in args.closed.split(",") if x]
    base = Path(tempfile.mkdtemp(prefix="restart-time-", dir=args.dir))
    rows: list[dict] = []
    try:
        rows += newest_rows(base, [int(x) for x in args.newest.split(",") if x], args.runs)
        for total in totals:
            relay, names = make_closed_dir(base, total)
            try:
                rows += closed_rows(relay, names, args.runs)
                rows += process_rows(relay, names, base / "work", args.runs, args.serve)
            finally:
                shutil.rmtree(relay, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows.sort(key=lambda r: ORDER.index(r["what"]))
    text = render(rows, argv, args.runs)
    if not args.no_write:
        write_results(RESULTS_DIR / "restart_time.md", text + "\n")
        plot(rows)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
