"""Catch-up throughput and memory: relayproxy against the MariaDB replica IO thread and mariadb-binlog.

A real MariaDB master holds a backlog in two shapes, one after the other (``RESET MASTER`` in between): ``oltp``
(100 MB; a procedure alternating an autocommit INSERT with ``START TRANSACTION; INSERT; UPDATE; COMMIT``, ~150
bytes an event) and ``bulk`` (300 MB of ``INSERT ... SELECT FROM seq_1_to_10000`` transactions, 8 KB row events).
In turns (round robin, ``--repeat`` times, the median reported) each reader catches up from nothing to the master's
end position: the replica IO thread (log_slave_updates, so it receives the same bytes as the others: the ratio
base), the same without log_slave_updates, ``mariadb-binlog --raw`` under ``/usr/bin/time`` (peak RSS), and
``relayproxy run`` with ``--sync-mode transaction`` and ``batch``, timed from its "http api listening" log line until
``GET /status`` shows the end, its files then compared with the master's; ``--extra-relay`` adds another checkout's
tree. Every reader is polled every 10 ms, and ``settle`` runs before each. A full run then profiles one relay
catch-up per shape under ``py-spy record --idle``, and last replicates one ``--big-trx-mb`` MB transaction through a
running relay whose RSS is sampled throughout.

    .venv/bin/python benchmarks/relay_catchup.py                 # full run, writes benchmarks/results/
    .venv/bin/python benchmarks/relay_catchup.py --quick --json  # ~10 MB smoke run, prints JSON, writes nothing

Absolute times on a shared 2-core machine are noise; the ratios between readers of the same run are the result.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import linecache
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

import pymysql  # noqa: E402

from benchmarks.common import REPO_ROOT, RESULTS_DIR, add_report_options, command_line, logger  # noqa: E402
from benchmarks.common import machine_info, machine_section, md_row, pyplot, save_figure, write_results  # noqa: E402
from benchmarks.relay_bench import clear_in_use, frame_parts, json_log, py_spy_exe, py_spy_stacks  # noqa: E402
from benchmarks.relay_bench import report_of, short_path  # noqa: E402
from relayproxy.binlog import constants as C  # noqa: E402
from relayproxy.binlog.events import HEADER  # noqa: E402
from relayproxy.downstream.sql.replication_parser import ChangeMaster, render_change_master  # noqa: E402
from relayproxy.lab.harness import run_every_step  # noqa: E402
from relayproxy.lab.procstat import proc_status_kb  # noqa: E402
from relayproxy.lab.relayprocess import RelayProcess, master_status, py_spy_record  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox, find_binary  # noqa: E402

POLL = 0.01  # seconds between status polls, the same for every reader
TIMEOUT = 600.0  # seconds any one catch-up may take
REPL_USER, REPL_PASSWORD = "repl", "replpw"
OLTP_PAD = 200  # characters of the VARCHAR each OLTP row carries: ~150-byte events on average
BULK_ROWS = 10_000  # rows per bulk transaction
BIG_ROW_MB = 4  # row (and so row-event) size of the large-transaction test
READER_LABELS = {
    "io_thread": "MariaDB replica IO thread",
    "io_thread_no_annotate": "IO thread, replica without log_slave_updates (2)",
    "mariadb_binlog": "mariadb-binlog --raw",
    "relay_transaction": "relayproxy (sync transaction, CRC on)",
    "relay_batch": "relayproxy (sync batch, CRC on)",
}
READERS = tuple(READER_LABELS)
SHAPE_LABELS = {"oltp": "OLTP-shaped (small transactions)", "bulk": "bulk rows (8 KB row events)"}
# Fast generation; none of this changes what the readers receive.
MASTER_CONFIG = {"sync_binlog": 0, "innodb_flush_log_at_trx_commit": 0, "innodb_buffer_pool_size": "256M",
                 "innodb_log_file_size": "512M", "innodb_doublewrite": 0, "max_allowed_packet": "1G",
                 "rpl_semi_sync_master_enabled": 0}
# log_slave_updates makes the IO thread ask for ANNOTATE_ROWS events, as the relay and mariadb-binlog do. The lean
# replica, as often configured, has no binlog: the master leaves ANNOTATE_ROWS out for it (footnote 2).
REPLICA_CONFIG = {"log_slave_updates": 1, "replicate_annotate_row_events": 1, "innodb_buffer_pool_size": "64M",
                  "max_allowed_packet": "1G"}
REPLICA_LEAN_CONFIG = {"innodb_buffer_pool_size": "64M", "max_allowed_packet": "1G"}
BACKLOG_MB = {"oltp": (10.0, 100.0), "bulk": (10.0, 300.0)}  # (--quick, full run)

log = logger("relay_catchup")


class ReaderError(RuntimeError):
    pass


def settle(master: MariaDBSandbox, timeout: float = 10.0) -> None:
    """Untimed, before every run: kill the master's leftover Binlog Dump threads (a new dump from the same
    server_id otherwise waits ~100 ms for the idle one to be killed), then ``sync`` the previous run's writes."""
    deadline = time.monotonic() + timeout
    while rows := master.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%%'"):
        for (thread_id,) in rows:
            try:
                master.execute(f"KILL CONNECTION {int(thread_id)}")
            except pymysql.err.Error:
                pass  # it ended meanwhile
        if time.monotonic() > deadline:
            raise ReaderError(f"master dump threads {rows} do not go away")
        time.sleep(0.01)
    os.sync()


# -- the master and its backlogs -------------------------------------------------------------------------------

@dataclass
class Backlog:
    shape: str
    files: list[tuple[str, int]]  # (name, size) of every master binlog file
    end: tuple[str, int]  # master's SHOW MASTER STATUS after the load
    counts_by_type: dict[int, int]
    generate_seconds: float

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.files)

    @property
    def events(self) -> int:
        return sum(self.counts_by_type.values())

    def summary(self) -> dict:
        return {"bytes": self.bytes, "mb": round(self.bytes / 1e6, 2), "events": self.events,
                "transactions": self.counts_by_type.get(C.MARIA_GTID_EVENT, 0),  # a GTID event is a transaction
                "avg_event_bytes": round(self.bytes / self.events if self.events else 0.0, 1),
                "files": [name for name, _ in self.files], "end": list(self.end),
                "generate_seconds": round(self.generate_seconds, 2),
                "counts_by_type": {C.event_name(t): n for t, n in sorted(self.counts_by_type.items())}}


def describe_backlog(master: MariaDBSandbox, shape: str, seconds: float) -> Backlog:
    """The master's binlog files now, their events counted by type from the headers (mmap: works for 1 GB files)."""
    end = master_status(master)
    files = [(p.name, p.stat().st_size) for p in master.binlog_files()]
    counts: Counter[int] = Counter()
    for name, size in files:
        if size <= 4:
            continue
        with open(master.binlog_dir / name, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 4
            while pos + 19 <= size:
                _ts, type_code, _sid, ev_size, _lp, _fl = HEADER.unpack_from(mm, pos)
                if ev_size < 19:
                    raise RuntimeError(f"{name}: impossible event size {ev_size} at {pos}")
                counts[type_code] += 1
                pos += ev_size
    return Backlog(shape, files, end, dict(counts), seconds)


OLTP_PROCEDURE = """CREATE PROCEDURE bench.load_oltp(IN n INT)
BEGIN
  DECLARE i INT DEFAULT 0;
  WHILE i < n DO
    INSERT INTO bench.oltp (k, c) VALUES (i, '{pad_a}');
    START TRANSACTION;
    INSERT INTO bench.oltp (k, c) VALUES (i, '{pad_b}');
    UPDATE bench.oltp SET k = k + 1 WHERE id = LAST_INSERT_ID();
    COMMIT;
    SET i = i + 1;
  END WHILE;
END"""


def generate(master: MariaDBSandbox, shape: str, target_bytes: int) -> Backlog:
    """Load the master until its binlog (reset first: the shape's backlog is all it holds) has ``target_bytes``:
    ``oltp`` CALLs the procedure in chunks, ``bulk`` INSERT ... SELECTs 10,000 rows a transaction."""
    auto = "AUTO_INCREMENT " if shape == "oltp" else ""
    setup = [f"DROP TABLE IF EXISTS bench.{shape}",
             f"CREATE TABLE bench.{shape} (id INT {auto}PRIMARY KEY, k INT NOT NULL, c VARCHAR(255) NOT NULL) "
             "ENGINE=InnoDB"]
    if shape == "oltp":
        setup[1:1] = ["DROP PROCEDURE IF EXISTS bench.load_oltp"]
        setup.append(OLTP_PROCEDURE.format(pad_a=("oltp-autocommit-" * 20)[:OLTP_PAD],
                                           pad_b=("oltp-multi-stmt-" * 20)[:OLTP_PAD]))
    for sql in [*setup, "RESET MASTER"]:
        master.execute(sql)
    began = time.monotonic()
    done = rows = 0
    chunk = 2000
    while done < target_bytes:
        if shape == "oltp":
            master.execute("CALL bench.load_oltp(%s)", (chunk,))
            rows += chunk
        else:
            master.execute(f"INSERT INTO bench.bulk (id, k, c) SELECT seq + {rows}, seq, REPEAT(CHAR(97 + seq % 26), "
                           f"{OLTP_PAD}) FROM bench.seq_1_to_{BULK_ROWS}")
            rows += BULK_ROWS
        done = sum(p.stat().st_size for p in master.binlog_files())
        chunk = max(100, min(50_000, int((target_bytes - done) / (done / rows)) + 1))
    return describe_backlog(master, shape, time.monotonic() - began)


# -- the readers: each returns a Sample ------------------------------------------------------------------------

@dataclass
class Sample:
    seconds: float
    peak_rss_kb: int | None = None
    extra: dict = field(default_factory=dict)


def run_io_thread(replica: MariaDBSandbox, master: MariaDBSandbox, backlog: Backlog) -> Sample:
    replica.execute("STOP SLAVE")
    replica.execute("RESET SLAVE ALL")  # deletes its relay logs: every run starts empty
    replica.execute(render_change_master(ChangeMaster.for_server(
        "mariadb", host="127.0.0.1", port=master.port, user=REPL_USER, password=REPL_PASSWORD,
        log_file=backlog.files[0][0], log_pos=4, gtid=False)))
    settle(master)
    end_file, end_pos = backlog.end
    with replica.connect(cursorclass=pymysql.cursors.DictCursor) as conn:
        cur = conn.cursor()
        t0 = time.perf_counter()
        cur.execute("START SLAVE IO_THREAD")
        while True:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
            if row["Master_Log_File"] == end_file and int(row["Read_Master_Log_Pos"]) >= end_pos:
                seconds = time.perf_counter() - t0
                break
            if row["Last_IO_Errno"]:
                raise ReaderError(f"IO thread error {row['Last_IO_Errno']}: {row['Last_IO_Error']}")
            if time.perf_counter() - t0 > TIMEOUT:
                raise ReaderError(f"IO thread did not catch up within {TIMEOUT}s: {row['Master_Log_File']}:"
                                  f"{row['Read_Master_Log_Pos']} of {end_file}:{end_pos}")
            time.sleep(POLL)
        cur.execute("STOP SLAVE IO_THREAD")
        cur.execute("SHOW SLAVE STATUS")
        return Sample(seconds, None, {"relay_log_space": int(cur.fetchone()["Relay_Log_Space"])})


def run_mariadb_binlog(master: MariaDBSandbox, backlog: Backlog, workdir: Path) -> Sample:
    out = Path(tempfile.mkdtemp(prefix="mbl-", dir=workdir))
    timefile = out / "time.txt"
    cmd = [find_binary("mariadb-binlog", "mysqlbinlog"), "--read-from-remote-server", "--raw", "--to-last-log",
           "--host=127.0.0.1", f"--port={master.port}", f"--user={REPL_USER}", f"--result-file={out}/",
           backlog.files[0][0]]
    if Path("/usr/bin/time").exists():
        cmd = ["/usr/bin/time", "-f", "%M", "-o", str(timefile), *cmd]
    settle(master)
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env={**os.environ, "MYSQL_PWD": REPL_PASSWORD}, capture_output=True, text=True,
                              timeout=TIMEOUT)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise ReaderError(f"mariadb-binlog exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        if timefile.exists():
            rss, how = int(timefile.read_text().split()[-1]), "/usr/bin/time"
        else:
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            how = "getrusage(RUSAGE_CHILDREN) (a maximum over every child so far)"
        got = {p.name: p.stat().st_size for p in out.iterdir() if p.name != "time.txt"}
        if got != dict(backlog.files):
            raise ReaderError(f"mariadb-binlog wrote {got}, the master has {dict(backlog.files)}")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return Sample(seconds, rss, {"rss_from": how})


class Relay(RelayProcess):
    """One `relayproxy run` subprocess (optionally under py-spy at 250 Hz, optionally another checkout's source:
    ``src_root`` is its cwd and first on PYTHONPATH), its GET /status polled every POLL seconds."""

    def __init__(self, relay_dir: Path, master: MariaDBSandbox, *, sync_mode: str = "transaction",
                 src_root: Path = REPO_ROOT, py_spy_output: Path | None = None):
        super().__init__(
            relay_dir, master.port, user=REPL_USER, password=REPL_PASSWORD, server_id=100, gtid_mode=None,
            heartbeat_period=None, reconnect_max_delay=None, extra=["--sync-mode", sync_mode], cwd=src_root,
            pythonpath=src_root, new_session=True, error=ReaderError, poll=POLL,
            wrapper=py_spy_record(py_spy_output, 250) if py_spy_output is not None else None,
        )

    def wait_end(self, end, sample=None, poll: float | None = None) -> dict:
        """Poll /status until the horizon is at ``end`` (a callable: the master's position, read again each
        poll), calling ``sample()`` before each poll; the relay reporting an error raises."""

        def at_end(status: dict) -> bool:
            if sample is not None:
                sample()
            want = end() if callable(end) else tuple(end)
            if (status.get("master_log_file"), status.get("read_master_log_pos")) == want:
                return True
            if status.get("last_io_error"):
                raise ReaderError(f"relay reports an error: {status['last_io_error']}\n{self.log_tail()}")
            return False

        return self.wait_for(at_end, TIMEOUT, f"the horizon at {end}", poll=poll)

    def logged_start(self) -> float | None:
        """perf_counter() value of the "http api listening" log line, right after which serve() starts the upstream
        session. (The first /status answer is no start mark: a relay busy with a backlog answers late.)"""
        offset = time.time() - time.perf_counter()
        for entry in json_log(self.log_path):
            if entry.get("event") == "http api listening":
                stamp = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
                return stamp.timestamp() - offset
        return None


def run_relay(master: MariaDBSandbox, backlog: Backlog, workdir: Path, sync_mode: str, *,
              src_root: Path = REPO_ROOT, verify: bool = True, keep_digests: bool = False,
              py_spy_output: Path | None = None) -> Sample:
    relay_dir = Path(tempfile.mkdtemp(prefix=f"relay-{sync_mode}-", dir=workdir)) / "relay"
    settle(master)
    relay = Relay(relay_dir, master, sync_mode=sync_mode, src_root=src_root, py_spy_output=py_spy_output)
    try:
        relay.start(60.0)
        status = relay.wait_end(backlog.end)
        t_done = time.perf_counter()
        mem = proc_status_kb(relay.pid)
    finally:
        relay.stop(60.0)
    t_start = relay.logged_start() or relay.t_up
    extra = {"startup_seconds": round(t_start - relay.t_spawn, 3), "events_received": status.get("events_received"),
             "fsyncs": status.get("fsyncs"),  # fdatasyncs of relay data until the horizon reached the end
             "fsync_seconds": status.get("fsync_seconds_sum")}  # the time they took (in the fsync thread)
    try:
        if verify:
            identical, digests, detail = compare_with_master(relay_dir, master, backlog.end)
            extra["identical"] = identical
            if not identical:
                extra["difference"] = detail
            if keep_digests:
                extra["digests"] = digests
    finally:
        shutil.rmtree(relay_dir.parent, ignore_errors=True)
        relay.log_path.unlink(missing_ok=True)
    return Sample(t_done - t_start, mem.get("VmHWM"), extra)


def compare_with_master(relay_dir: Path, master: MariaDBSandbox, end: tuple[str, int]):
    """Stream-compare every relay file with the master's (the active one up to `end`): (identical, digests, detail).
    The digests (sha256) mask LOG_EVENT_BINLOG_IN_USE_F in the FDE, the one byte that may differ."""
    names = (relay_dir / "relayproxy.index").read_text().split()
    master_names = [p.name for p in master.binlog_files()]
    if names != master_names[: len(names)] or names[-1] != end[0]:
        return False, {}, f"relay files {names} vs master files {master_names} (end {end})"
    digests, detail = {}, None
    for name in names:
        a = _masked_digest(relay_dir / name, None)
        b = _masked_digest(master.binlog_dir / name, end[1] if name == end[0] else None)
        digests[name] = {"relay": a[0], "master": b[0], "bytes": b[1]}
        if a != b and detail is None:
            detail = f"{name}: relay {a[1]} bytes sha256 {a[0][:12]}, master {b[1]} bytes sha256 {b[0][:12]}"
    return detail is None, digests, detail


def _masked_digest(path: Path, limit: int | None) -> tuple[str, int]:
    h, total = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20 if limit is None else max(0, min(8 << 20, limit - total))):
            h.update(clear_in_use(chunk) if total == 0 else chunk)
            total += len(chunk)
    return h.hexdigest(), total


# -- measuring -------------------------------------------------------------------------------------------------

def measure_shape(backlog: Backlog, master, replicas: dict, workdir: Path, repeat: int, readers: tuple[str, ...],
                  extra_src: dict[str, Path]) -> dict[str, list[Sample]]:
    results: dict[str, list[Sample]] = {name: [] for name in (*readers, *extra_src)}
    order = list(results)
    # Warm-up (untimed): the binlog in the page cache, the master's dump path warm, for every reader alike.
    run_mariadb_binlog(master, backlog, workdir)
    for rep in range(repeat):
        for name in order[rep % len(order):] + order[: rep % len(order)]:
            if name in replicas:
                sample = run_io_thread(replicas[name], master, backlog)
            elif name == "mariadb_binlog":
                sample = run_mariadb_binlog(master, backlog, workdir)
            elif name in ("relay_transaction", "relay_batch"):
                sample = run_relay(master, backlog, workdir, name.split("_", 1)[1],
                                   keep_digests=(rep == 0 and name == "relay_transaction"))
            else:
                sample = run_relay(master, backlog, workdir, "transaction", src_root=extra_src[name])
            results[name].append(sample)
            log(f"{backlog.shape} #{rep + 1} {name}: {sample.seconds:.3f} s"
                + (f", peak RSS {sample.peak_rss_kb / 1024:.1f} MB" if sample.peak_rss_kb else ""))
            if sample.extra.get("identical") is False:
                raise ReaderError(f"{name}: relay files differ from the master's: {sample.extra.get('difference')}")
    return results


def shape_report(backlog: Backlog, results: dict[str, list[Sample]]) -> dict:
    """Per reader: the median seconds, throughput and ratio to the IO thread's median, the median peak RSS."""
    median = {name: statistics.median(s.seconds for s in samples) for name, samples in results.items()}
    base = median.get("io_thread")
    readers = {}
    for name, samples in results.items():
        sec, first = median[name], samples[0].extra
        got_bytes, got_events = backlog.bytes, backlog.events
        if name == "io_thread_no_annotate":  # the master leaves ANNOTATE_ROWS out for this one
            got_bytes = first.get("relay_log_space") or got_bytes
            got_events -= backlog.counts_by_type.get(C.MARIA_ANNOTATE_ROWS_EVENT, 0)
        rss = [s.peak_rss_kb for s in samples if s.peak_rss_kb]
        entry = {"seconds": round(sec, 4), "samples": [round(s.seconds, 4) for s in samples],
                 "received_bytes": got_bytes, "received_events": got_events,
                 "mb_per_s": round(got_bytes / 1e6 / sec, 2), "events_per_s": round(got_events / sec),
                 "ratio_vs_io_thread": round(sec / base, 3) if base else None,
                 "peak_rss_kb": int(statistics.median(rss)) if rss else None}
        fsyncs = [s.extra["fsyncs"] for s in samples if s.extra.get("fsyncs") is not None]
        if fsyncs:
            spent = [s.extra["fsync_seconds"] for s in samples if s.extra.get("fsync_seconds") is not None]
            entry.update(fsyncs=statistics.median(fsyncs), fsyncs_range=[min(fsyncs), max(fsyncs)],
                         fsync_seconds=round(statistics.median(spent), 3) if spent else None)
        if name.startswith("relay"):
            entry["startup_seconds"] = statistics.median(s.extra["startup_seconds"] for s in samples)
            entry["identical"] = all(s.extra.get("identical") for s in samples)
            entry["events_received"] = first.get("events_received")
            if "digests" in first:
                entry["digests"] = first["digests"]
        elif name.startswith("io_thread"):
            entry.update(peak_rss_kb=None, relay_log_space=first.get("relay_log_space"))
        elif name == "mariadb_binlog":
            entry["rss_from"] = first.get("rss_from")
        readers[name] = entry
    return {"backlog": backlog.summary(), "readers": readers}


# -- the py-spy profile ----------------------------------------------------------------------------------------

def py_spy_profile(master, backlog: Backlog, workdir: Path, top: int = 18) -> dict:
    """Run one catch-up under py-spy and summarise the samples."""
    if py_spy_exe() is None:
        return {"error": "py-spy is not installed (`.venv/bin/pip install py-spy`)"}
    raw = workdir / "pyspy.txt"
    sample = run_relay(master, backlog, workdir, "transaction", verify=False, py_spy_output=raw)
    for _ in range(100):
        if raw.exists() and raw.stat().st_size:
            break
        time.sleep(0.1)
    if not raw.exists():
        return {"error": "py-spy wrote no output"}
    return summarise_py_spy(raw.read_text(), sample.seconds, top)


_IDLE_LEAVES = ("run", "run_until_complete", "run_forever", "_run_once", "select", "poll", "wait", "_worker", "get")
_IDLE_PATHS = ("uvloop", "asyncio", "selectors", "threading", "concurrent", "queue")


def summarise_py_spy(text: str, seconds: float, top: int) -> dict:
    """The main thread's samples split into idle (a leaf where the thread waits: the event loop, whose uvloop
    caller is the leaf as uvloop is C, a selector, a worker waiting), start-up and catch-up work, with its top
    functions and lines; the other threads' samples, those inside SyncTicket.make_durable counted as fsync."""
    stacks = py_spy_stacks(text)
    if not stacks:
        return {"error": "no samples"}
    # The main thread is the one whose samples run the relay's code or its event loop.
    threads: Counter[str] = Counter()
    mains: Counter[str] = Counter()
    for thread, frames, count in stacks:
        threads[thread] += count
        if any("relayproxy/commands/cli.py" in f or "runpy" in f for f in frames):
            mains[thread] += count
    main_thread = max(mains or threads, key=(mains or threads).get)
    fsync = others = idle = startup = work = 0
    by_func: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_line: Counter[str] = Counter()
    for thread, frames, count in stacks:
        if thread != main_thread:
            others += count
            fsync += count if any("make_durable" in f for f in frames) else 0
            continue
        func, path, lineno = frame_parts(frames[-1] if frames else "?")
        if not any(("relayproxy/commands/run.py" in f and not f.startswith("run (")) or "uvloop" in f or "runners.py" in f
                   for f in frames):
            startup += count  # interpreter start-up, imports, argument parsing, the stop
        elif func.rsplit(".", 1)[-1] in _IDLE_LEAVES and any(m in path for m in _IDLE_PATHS):
            idle += count  # waiting in the event loop: for the socket or for the fsync thread
        else:
            work += count
            by_func[f"{func} ({short_path(path)})"] += count
            by_line[f"{path}:{lineno}"] += count
            for key in dict.fromkeys(f"{f} ({short_path(p)})" for f, p, _ in map(frame_parts, frames)):
                inclusive[key] += count
    total = idle + startup + work
    lines = []
    for key, count in by_line.most_common(top):
        path, _, lineno = key.rpartition(":")
        source = linecache.getline(path, int(lineno)).strip().replace("|", "\\|") if lineno.isdigit() else ""
        lines.append({"where": f"{short_path(path)}:{lineno}", "share": count / work if work else 0, "source": source})
    # Inclusive shares: the relay's own functions below the session loop (the wrappers above it are ~100%).
    incl = [(k, v) for k, v in inclusive.items() if v < 0.97 * work and "(<frozen" not in k]
    return {
        "seconds": round(seconds, 3), "main_thread_samples": total, "other_thread_samples": others,
        "fsync_samples": fsync, **{f"{name}_share": n / total if total else 0
                                   for name, n in (("startup", startup), ("idle", idle), ("work", work))},
        "work_samples": work,
        "self": [{"function": k, "share": v / work} for k, v in by_func.most_common(top)],
        "inclusive": [{"function": k, "share": v / work} for k, v in sorted(incl, key=lambda kv: -kv[1])[:top]],
        "lines": lines,
    }


# -- large transaction: memory stays flat ----------------------------------------------------------------------

def big_transaction_test(master, workdir: Path, mb: int) -> dict:
    """One ``mb`` MB transaction of ``BIG_ROW_MB`` MB rows through a caught-up relay, its RSS sampled every 50 ms
    (VmHWM reset through /proc/<pid>/clear_refs before it)."""
    for sql in ("RESET MASTER", "DROP TABLE IF EXISTS bench.big",
                "CREATE TABLE bench.big (id INT PRIMARY KEY, b LONGBLOB NOT NULL) ENGINE=InnoDB"):
        master.execute(sql)
    relay_dir = Path(tempfile.mkdtemp(prefix="relay-big-", dir=workdir)) / "relay"
    relay = Relay(relay_dir, master)
    samples: list[tuple[float, int]] = []
    rows = max(1, mb // BIG_ROW_MB)

    def load() -> None:
        with master.connect(autocommit=False) as conn:
            cur = conn.cursor()
            cur.execute("BEGIN")
            for i in range(rows):
                cur.execute("INSERT INTO bench.big (id, b) VALUES (%s, REPEAT('x', %s))", (i, BIG_ROW_MB << 20))
            cur.execute("COMMIT")

    def sample_rss() -> None:
        samples.append((time.perf_counter() - t0, proc_status_kb(relay.pid).get("VmRSS", 0)))

    try:
        relay.start(60.0)
        relay.wait_end(master_status(master))
        time.sleep(0.2)
        before = proc_status_kb(relay.pid)
        try:
            Path(f"/proc/{relay.pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            cleared = True
        except OSError:
            cleared = False
        after_clear = proc_status_kb(relay.pid)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            loading = pool.submit(load)
            while not concurrent.futures.wait([loading], 0.05).done:
                sample_rss()
            loading.result()
        t_commit = time.perf_counter()
        # The master's end read again at each poll: it rotates right after the COMMIT past max_binlog_size.
        status = relay.wait_end(lambda: master_status(master), sample=sample_rss, poll=0.05)
        end = (status["master_log_file"], status["read_master_log_pos"])
        t_done = time.perf_counter()
        peak = proc_status_kb(relay.pid)
    finally:
        relay.stop(60.0)
    try:
        identical, _digests, detail = compare_with_master(relay_dir, master, end)
        backlog = describe_backlog(master, "big", 0.0)
    finally:
        shutil.rmtree(relay_dir.parent, ignore_errors=True)
    result = {
        "mb": mb, "rows": rows, "row_event_mb": BIG_ROW_MB, "binlog_bytes": backlog.bytes, "events": backlog.events,
        "rss_before_kb": before.get("VmRSS"), "hwm_before_kb": before.get("VmHWM"), "hwm_reset": cleared,
        "rss_after_reset_kb": after_clear.get("VmRSS"), "peak_rss_kb": peak.get("VmHWM"),
        "rss_end_kb": peak.get("VmRSS"), "peak_growth_kb": (peak.get("VmHWM") or 0) - (before.get("VmRSS") or 0),
        "commit_seconds": round(t_commit - t0, 2), "relay_after_commit_seconds": round(t_done - t_commit, 2),
        "identical": identical, "rss_samples": [[round(t, 3), kb] for t, kb in samples],
    }
    if not identical:
        result["difference"] = detail
    master.execute("RESET MASTER")  # 1 GB less on disk
    master.execute("DROP TABLE IF EXISTS bench.big")
    return result


# -- reporting -------------------------------------------------------------------------------------------------

def _mb(kb: int | None) -> str:
    return "-" if not kb else f"{kb / 1024:,.1f} MB"


def shape_markdown(shape: str, data: dict) -> list[str]:
    b, readers = data["backlog"], data["readers"]
    out = [
        f"## {SHAPE_LABELS.get(shape, shape)}", "",
        f"Backlog: {b['mb']:.1f} MB in {b['events']:,} events ({b['avg_event_bytes']:.0f} bytes an event on "
        f"average), {b['transactions']:,} transactions, {len(b['files'])} binlog file(s); generated in "
        f"{b['generate_seconds']:.1f} s. Events by type: "
        + ", ".join(f"{k} {v:,}" for k, v in b["counts_by_type"].items()) + ".",
        "",
        "| reader | seconds | [min - max] | MB/s | events/s | ratio vs IO thread | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in readers.items():
        out.append(md_row(READER_LABELS.get(name, name), f"{r['seconds']:.3f}",
                          f"[{min(r['samples']):.3f} - {max(r['samples']):.3f}]", f"{r['mb_per_s']:,.1f}",
                          f"{r['events_per_s']:,}", f"{r['ratio_vs_io_thread']:.2f}",
                          "n/c (1)" if name.startswith("io_thread") else _mb(r["peak_rss_kb"])))
    ratio = (readers.get("relay_transaction") or {}).get("ratio_vs_io_thread")
    if ratio:
        out += ["", f"**Target (relayproxy, default configuration, at least as fast as the IO thread): "
                f"{'met' if ratio <= 1.0 else 'MISSED'}** -- {ratio:.2f}x the IO thread's time "
                f"({1 / ratio:.2f}x its throughput)."]
    relay_rows = [r for n, r in readers.items() if n.startswith("relay")]
    if relay_rows:
        out += ["", f"relayproxy's Python start-up before it serves /status (not in the times above): "
                f"{relay_rows[0]['startup_seconds']:.2f} s. Relay files byte-identical to the master's after "
                f"every relay run: {'yes' if all(r['identical'] for r in relay_rows) else 'NO'}."]
    counted = [(n, r) for n, r in readers.items() if r.get("fsyncs") is not None]
    if counted:
        out += ["", "fdatasyncs of relay data until the horizon reached the end (/status `fsyncs`, median "
                "[min - max]): " + "; ".join(
                    f"{READER_LABELS.get(n, n)} {r['fsyncs']:.0f} [{r['fsyncs_range'][0]} - {r['fsyncs_range'][1]}]"
                    + (f" ({r['fsync_seconds']:.2f} s in fdatasync)" if r.get("fsync_seconds") is not None else "")
                    for n, r in counted) + "."]
    io = readers.get("io_thread")
    if io and io.get("relay_log_space"):
        out += [f"IO thread relay log space at the end: {io['relay_log_space'] / 1e6:.1f} MB (same bytes "
                "received: ANNOTATE_ROWS included)."]
    return [*out, ""]


FOOTNOTES = [
    "(1) not comparable: the IO thread lives inside the replica's mariadbd, whose VmHWM is the whole server "
    "(buffer pool, caches), not the cost of replicating.",
    "(2) A replica without log_slave_updates does not ask for ANNOTATE_ROWS events, so the master leaves them "
    "out: it receives fewer events and bytes than every other reader (its MB/s and events/s are of what it "
    "received). Not a like-for-like baseline: the relay must store the master's bytes unchanged. This is most "
    "likely the configuration behind the 2.1 s / 60 MB/s in peers.md.",
    "mariadb-binlog's peak RSS is from `/usr/bin/time -f %M`; relayproxy's is VmHWM of the relay process, read "
    "just before it is stopped.",
    "",
    "Settings: the master runs binlog_format=ROW, binlog_checksum=CRC32, ANNOTATE_ROWS on (defaults), "
    "sync_binlog=0. The replica (IO thread) runs with MariaDB's defaults for its relay log (sync_relay_log=10000: "
    "an fsync every 10,000 events, sync_master_info=10000), log_slave_updates=1 so that it asks for "
    "ANNOTATE_ROWS like the others. mariadb-binlog writes without fsync. relayproxy `--sync-mode transaction` "
    "fsyncs (fdatasync + durable mark) once per batch read from the socket that completed a transaction (group "
    "commit), in its fsync thread while it reads and writes the next batch (one fsync in flight; batches that "
    "arrive meanwhile share the next one); `batch` fsyncs every 100 transactions or 10 ms. No TLS anywhere (the "
    "sandbox has have_ssl=DISABLED).",
    "",
]


def big_trx_markdown(big: dict) -> list[str]:
    return [
        "## Large transaction: memory", "",
        f"One transaction of {big['binlog_bytes'] / 1e6:,.0f} MB ({big['rows']} rows of {big['row_event_mb']} MB "
        f"LONGBLOB, so {big['rows']} row events of ~{big['row_event_mb']} MB, {big['events']} events in the file) "
        "committed on the master while a caught-up relay (default configuration) runs.",
        "",
        "| relay process | RSS |",
        "|---|---:|",
        md_row("RSS before the transaction", _mb(big["rss_before_kb"])),
        md_row("peak RSS (VmHWM) before it, start-up and catch-up of the empty binlog", _mb(big["hwm_before_kb"])),
        md_row(f"peak RSS (VmHWM, reset before the transaction{'' if big['hwm_reset'] else ': reset FAILED'}) while "
               "it streams through", _mb(big["peak_rss_kb"])),
        md_row("growth of the peak over the RSS before", _mb(big["peak_growth_kb"])),
        md_row("RSS at the end", _mb(big["rss_end_kb"])),
        "",
        f"The master took {big['commit_seconds']:.1f} s to run and commit it; the relay had it durable "
        f"{big['relay_after_commit_seconds']:.1f} s after the COMMIT returned. Relay file byte-identical to the "
        f"master's: {'yes' if big['identical'] else 'NO'}.",
        "",
    ]


def profile_markdown(prof: dict, shape: str) -> list[str]:
    if "error" in prof:
        return [f"## Profile ({shape})", "", f"No py-spy profile: {prof['error']}", ""]
    out = [
        f"## Where relayproxy's catch-up time goes: {SHAPE_LABELS.get(shape, shape)} (py-spy)", "",
        f"One extra `sync-mode transaction` catch-up of the {shape} backlog launched under `py-spy record --rate 250 "
        f"--threads --idle` ({prof['seconds']:.2f} s under the sampler; not in the table above). Of the main "
        f"thread's {prof['main_thread_samples']:,} samples: {prof['work_share']:.1%} working, "
        f"{prof['idle_share']:.1%} idle in the event loop (waiting for the socket or the fsync thread), "
        f"{prof['startup_share']:.1%} interpreter start-up, imports and the stop. The fsync worker thread was "
        f"inside `SyncTicket.make_durable` (fdatasync, GIL released) in {prof['fsync_samples']:,} samples "
        f"({prof['fsync_samples'] / max(prof['main_thread_samples'], 1):.1%} of the main thread's count: while the "
        "main thread waits for it, it does not parse). Shares below are of the main thread's working samples.",
    ]
    for title, key in (("Innermost frame (self time):", "self"),
                       ("Inclusive (the function or anything it calls):", "inclusive")):
        out += ["", title, "", "| function | share |", "|---|---:|"]
        out += [md_row(f"`{r['function']}`", f"{r['share']:.1%}") for r in prof[key]]
    out += ["", "Hottest source lines:", "", "| share | line | source |", "|---:|---|---|"]
    out += [md_row(f"{r['share']:.1%}", f"`{r['where']}`", f"`{r['source']}`") for r in prof["lines"]]
    return [*out, ""]


def write_markdown(path: Path, report: dict, argv: list[str]) -> None:
    out = ["# Relay catch-up: relayproxy vs the MariaDB replica IO thread and mariadb-binlog", "",
           "Produced by (from the repository root):", "", "```", report.get("command") or command_line(__file__, argv),
           "```", "",
           f"Each reader catches up from nothing to the master's end position; median of {report['repeat']} runs per "
           "row, the readers taking turns (round robin, after one untimed warm-up read), `sync` before every run, "
           f"status polled every {POLL * 1000:.0f} ms for every reader. **Ratio = time / IO thread time of the same "
           "run** (below 1.00 is faster than the IO thread). Absolute times on this shared 2-core machine are noise; "
           "the ratios are the result.", ""]
    for shape, data in report["shapes"].items():
        out += shape_markdown(shape, data)
    out += FOOTNOTES
    if report.get("big_trx"):
        out += big_trx_markdown(report["big_trx"])
    for shape, prof in (report.get("profile") or {}).items():
        out += profile_markdown(prof, shape)
    if report.get("notes"):
        out += [report["notes"].rstrip(), ""]
    write_results(path, "\n".join(out + machine_section(report["machine"])), log)


COLORS = {"io_thread": "#4c72b0", "io_thread_no_annotate": "#8da0cb", "mariadb_binlog": "#55a868",
          "relay_transaction": "#c44e52", "relay_batch": "#dd8452"}


def write_plot(path: Path, report: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    shapes, big = list(report["shapes"]), report.get("big_trx")
    ncols = len(shapes) + (1 if big else 0)
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.2))
    axes = [axes] if ncols == 1 else axes
    for ax, shape in zip(axes, shapes):
        data = report["shapes"][shape]
        names = list(data["readers"])
        ratios = [data["readers"][n]["ratio_vs_io_thread"] for n in names]
        bars = ax.barh([READER_LABELS.get(n, n).replace(" (", "\n(") for n in names], ratios,
                       color=[COLORS.get(n, "#8172b2" if n.startswith(("proto", "P")) else "#937860") for n in names])
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        for bar, ratio, n in zip(bars, ratios, names):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                    f" {ratio:.2f}x ({data['readers'][n]['mb_per_s']:.0f} MB/s)", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(ratios) * 1.45)
        b = data["backlog"]
        ax.set_title(f"{shape}: {b['mb']:.0f} MB, {b['events']:,} events ({b['avg_event_bytes']:.0f} B/event)",
                     fontsize=9)
        ax.set_xlabel("catch-up time / IO thread time (lower is faster)")
        ax.tick_params(axis="y", labelsize=7)
    if big:
        ax = axes[-1]
        rss = [kb / 1024 for _, kb in big["rss_samples"]]
        ax.plot([t for t, _ in big["rss_samples"]], rss, color="#c44e52")
        ax.axhline((big["rss_before_kb"] or 0) / 1024, color="gray", ls="--", lw=0.8, label="RSS before")
        ax.axvline(big["commit_seconds"], color="black", ls=":", lw=0.8, label="COMMIT returned")
        if big.get("peak_rss_kb"):
            ax.axhline(big["peak_rss_kb"] / 1024, color="#c44e52", ls=":", lw=0.8, label="peak (VmHWM)")
        ax.set_ylim(0, max(max(rss, default=1), (big.get("peak_rss_kb") or 0) / 1024) * 1.5)
        ax.set_title(f"relay RSS during one {big['binlog_bytes'] / 1e6:,.0f} MB transaction", fontsize=9)
        ax.set_xlabel("seconds since BEGIN")
        ax.set_ylabel("RSS (MB)")
        ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def print_summary(report: dict) -> None:
    for shape, data in report["shapes"].items():
        b = data["backlog"]
        print(f"{shape}: {b['mb']:.1f} MB, {b['events']:,} events, {b['avg_event_bytes']:.0f} B/event")
        for name, r in data["readers"].items():
            print(f"  {name:20s} {r['seconds']:8.3f} s {r['mb_per_s']:8.1f} MB/s {r['events_per_s']:>10,} ev/s "
                  f"x{r['ratio_vs_io_thread']:.2f}  rss {_mb(r['peak_rss_kb'])}")
    if big := report.get("big_trx"):
        print(f"big trx {big['binlog_bytes'] / 1e6:.0f} MB: RSS before {_mb(big['rss_before_kb'])}, peak "
              f"{_mb(big['peak_rss_kb'])}, identical {big['identical']}")


# -- command line ----------------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="~10 MB backlogs, one run each, a 16 MB big transaction, "
                   "no profile, writes nothing")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on stdout")
    p.add_argument("--repeat", type=int, default=None, help="runs per reader and shape (default 5; --quick 1)")
    p.add_argument("--big-trx-mb", type=int, default=None, help="size of the large transaction (default 1024; "
                   "--quick 16; 0 skips the test)")
    p.add_argument("--shapes", default="oltp,bulk", help="comma-separated: oltp, bulk")
    p.add_argument("--readers", default=",".join(READERS), help="comma-separated subset of: " + ", ".join(READERS)
                   + " (io_thread is the ratio base: keep it)")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profile")
    p.add_argument("--extra-relay", action="append", default=[], metavar="LABEL=SRC_DIR",
                   help="also time a relayproxy tree at SRC_DIR (e.g. a prototype in /tmp) as reader LABEL")
    add_report_options(p)
    p.add_argument("--output-dir", type=Path, default=None, help=f"where results go (default {RESULTS_DIR}); "
                   "--quick writes nothing unless this is given")
    p.add_argument("--workdir", type=Path, default=None, help="parent of the temporary directory (default $TMPDIR)")
    args = p.parse_args(argv)
    args.repeat = (1 if args.quick else 5) if args.repeat is None else args.repeat
    args.big_trx_mb = (16 if args.quick else 1024) if args.big_trx_mb is None else args.big_trx_mb
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    args.readers = tuple(r.strip() for r in args.readers.split(",") if r.strip())
    for name in {*args.shapes, *args.readers} - {*SHAPE_LABELS, *READERS}:
        p.error(f"unknown shape or reader {name!r}")
    args.extra_src = {}
    for item in args.extra_relay:
        label, _, src = item.partition("=")
        if not src or not (Path(src) / "relayproxy" / "commands" / "cli.py").is_file():
            p.error(f"--extra-relay {item!r}: expected LABEL=DIR with DIR/relayproxy/commands/cli.py")
        args.extra_src[label] = Path(src).resolve()
    return args


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(args: argparse.Namespace, argv: list[str]) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rp-catchup-", dir=args.workdir))
    master = MariaDBSandbox(work / "master", server_id=1, binlog_format="ROW", extra_config=MASTER_CONFIG)
    replica = MariaDBSandbox(work / "replica", server_id=2, log_bin_name="replica-bin", extra_config=REPLICA_CONFIG)
    lean = MariaDBSandbox(work / "replica-lean", server_id=3, log_bin=False, extra_config=REPLICA_LEAN_CONFIG)
    report: dict = {"quick": args.quick, "repeat": args.repeat, "backlog_mb": BACKLOG_MB["oltp"][not args.quick],
                    "shapes": {}, "loadavg_before": _loadavg()}
    try:
        log(f"starting master and replica sandboxes in {work}")
        for server in (master, replica, lean):
            server.start()
        master.create_user(REPL_USER, REPL_PASSWORD)
        master.execute("CREATE DATABASE IF NOT EXISTS bench")
        for shape in args.shapes:
            log(f"generating the {shape} backlog (~{BACKLOG_MB[shape][not args.quick]:g} MB)")
            backlog = generate(master, shape, int(BACKLOG_MB[shape][not args.quick] * 1e6))
            log(f"{shape}: {backlog.bytes / 1e6:.1f} MB, {backlog.events:,} events, "
                f"{backlog.summary()['transactions']:,} transactions in {backlog.generate_seconds:.1f} s")
            results = measure_shape(backlog, master, {"io_thread": replica, "io_thread_no_annotate": lean}, work,
                                    args.repeat, args.readers, args.extra_src)
            report["shapes"][shape] = shape_report(backlog, results)
            if not args.quick and not args.no_profile:
                log(f"profiling relayproxy's {shape} catch-up with py-spy")
                report.setdefault("profile", {})[shape] = py_spy_profile(master, backlog, work)
        if args.big_trx_mb:
            log(f"large transaction: {args.big_trx_mb} MB")
            b = report["big_trx"] = big_transaction_test(master, work, args.big_trx_mb)
            log(f"big trx: RSS before {_mb(b['rss_before_kb'])}, peak {_mb(b['peak_rss_kb'])}, "
                f"identical {b['identical']}")
    finally:
        for problem in run_every_step([lean.stop, replica.stop, master.stop]):
            log(f"could not stop a server: {problem}")
        shutil.rmtree(work, ignore_errors=True)
    report["loadavg_after"] = _loadavg()
    report["machine"] = machine_info(server=True)
    report["machine"]["load average (1, 5, 15 min) before / after"] = (
        f"{report['loadavg_before']} / {report['loadavg_after']} (other work on the machine shifts the ratios too)"
    )
    report["command"] = command_line(__file__, argv)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    report = report_of(args, lambda: measure(args, argv))
    out_dir = args.output_dir or (None if args.quick and args.render is None else RESULTS_DIR)
    if out_dir is not None:
        write_markdown(out_dir / "relay_catchup.md", report, argv)
        write_plot(out_dir / "relay_catchup.png", report)
    if args.render is None and args.json:
        print(json.dumps(report, default=str, indent=1))
    elif args.render is None:
        print_summary(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
