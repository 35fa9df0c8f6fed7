"""Failover time: seconds from START SLAVE on the relay until a replica behind it has applied the new master's first
transaction, at relay backlogs of 0, 100 MB and 1 GB of relay files, against a plain MariaDB replica repointed the
same way in the same run.

For each backlog size a topology of real servers (``relayproxy.lab``'s building blocks, no fault proxies)::

    M1 ─┬─ relayproxy run --listen ─┬─ R2  by GTID     (MASTER_USE_GTID=slave_pos)
        │   (a real process)        └─ R3  by file/pos (MASTER_LOG_FILE=<relay's first file>, MASTER_USE_GTID=no)
        ├─ D   "R2'": a plain MariaDB replica of M1 by GTID, no binlog (as R2): the peer, the ratio base
        └─ C1 .. Cn  candidates (binlog basename mysql-bin, log_slave_updates, read_only), one per repeat

The backlog: 8,000-byte rows (~8 MB transactions) written on M1 until its binlog holds the size asked for, into a
BLACKHOLE table (the same binlog bytes as InnoDB, no table data). Repeat k (``--repeats``) is one failover: the
master in force killed, Ck promoted and the relay and D repointed as an HA tool does, a marker row written on Ck
(all untimed); then, in turns, ``START SLAVE`` on the relay, timed until the marker is visible on R2 and R3 and in
the relay's ``GET /status``, and on D, timed until it is visible on D (one poller each, every 5 ms on an open
connection; ``Topology.failover``). Reported: the median and range over the repeats, and the relay/direct ratios.

    .venv/bin/python benchmarks/failover_time.py                          # 0, 100M, 1G x 3 repeats
    .venv/bin/python benchmarks/failover_time.py --backlogs 0 --repeats 1 --out /tmp/ft/failover_time.md

Sizes are decimal (1G = 1,000,000,000: below max_binlog_size, so a 1 GB backlog stays one binlog file). Absolute
times on a shared 2-core machine are noise; the relay/direct ratios of one run and the ranges are the result.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

import pymysql  # noqa: E402

from benchmarks import benchinfo  # noqa: E402
from benchmarks.common import RESULTS_DIR, add_report_options, logger, md_row, pyplot, results_document  # noqa: E402
from benchmarks.common import save_figure, write_results  # noqa: E402
from benchmarks.relay_bench import frame_parts, py_spy_exe, py_spy_stacks, report_of, short_path  # noqa: E402
from relayproxy.lab.failover import (  # noqa: E402
    ADMIN_PASSWORD,
    ADMIN_USER,
    BASENAME,
    REPL_PASSWORD,
    REPL_USER,
    binlog_pos,
    change_master_sql,
    covers,
    promote,
    relay_sql,
    repoint_replica,
    server,
    slave_pos,
    wait_until,
)
from relayproxy.lab.harness import change_master, free_port, master_status, replica_status  # noqa: E402
from relayproxy.lab.harness import RelayProcess, run_every_step  # noqa: E402
from relayproxy.lab.procstat import proc_status_kb  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox  # noqa: E402

POLL = 0.005  # seconds between probes, every poller
ROW_BYTES = 8000  # one row, so about one WRITE_ROWS event of binlog_row_event_max_size (8 KB)
ROWS_PER_TRX = 1000  # ~8 MB transactions
GOAL_SECONDS = 1.0
SCHEMA = "bench"
COMMON_CONFIG = {"plugin_load_add": "ha_blackhole"}  # every server: the BLACKHOLE engine for the backlog table
PATH_LABELS = {
    "relay_r2": "relay -> R2 (GTID)",
    "relay_r3": "relay -> R3 (file/pos)",
    "relay_horizon": "relay horizon (/status)",
    "direct": "direct: D repointed (MariaDB)",
}
PATHS = tuple(PATH_LABELS)
PROFILE_SECONDS = 3
GEN_TIMEOUT = 420.0  # seconds generating a backlog and everyone taking it in may take
SWITCH_TIMEOUT = 60.0  # seconds one switch may take

log = logger("failover_time")


class BenchError(RuntimeError):
    pass


def parse_size(text: str) -> int:
    """'0', '100M', '1G', '250k', '1500000' -> bytes (decimal multiples)."""
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 0, 100M, 1G)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"negative size {text!r}")
    return value


def size_label(n: int) -> str:
    if n == 0:
        return "0"
    for unit, mult in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= mult and n % (mult // 10 or 1) == 0:
            return f"{n / mult:g} {unit}B"
    return f"{n} B"


def _connect(server: MariaDBSandbox) -> pymysql.connections.Connection:
    return pymysql.connect(host=server.host, port=server.port, user="root", password="", autocommit=True,
                           connect_timeout=10, read_timeout=120)


def first_seen(probe, t0: float, timeout: float) -> float:
    """Seconds from ``t0`` until ``probe()`` is true, probed every POLL seconds (a probe error: not yet)."""
    error = None
    while time.perf_counter() - t0 < timeout:
        try:
            if probe():
                return round(time.perf_counter() - t0, 4)
        except (pymysql.MySQLError, OSError, KeyError, ValueError) as exc:
            error = exc
        time.sleep(POLL)
    raise BenchError(f"not seen within {timeout:.0f} s (last probe error: {error!r})")


# -- the topology ----------------------------------------------------------------------------------------------------

class Topology:
    """M1, candidates C1..Cn, D (direct replica of M1), the relay on M1, R2 (GTID) and R3 (file/pos) behind it."""

    def __init__(self, workdir: Path, candidates: int):
        self.workdir = workdir
        self.m1 = self._binlogged(workdir / "m1", 1)
        self.cands = [self._binlogged(workdir / f"c{i + 1}", 11 + i, read_only=True) for i in range(candidates)]
        self.d, self.r2, self.r3 = (MariaDBSandbox(workdir / name, server_id=server_id, log_bin=False,
                                                   extra_config=COMMON_CONFIG)
                                    for name, server_id in (("d", 7), ("r2", 5), ("r3", 6)))
        self.relay: RelayProcess | None = None
        self.relay_port = 0
        self.master = self.m1  # the master in force

    @staticmethod
    def _binlogged(basedir: Path, server_id: int, *, read_only: bool = False) -> MariaDBSandbox:
        """relayproxy.lab.failover.server() (ROW, basename mysql-bin, log_slave_updates) plus BLACKHOLE."""
        sandbox = server(basedir, server_id, read_only=read_only)
        sandbox.extra_config.update(COMMON_CONFIG)
        return sandbox

    def servers(self) -> list[MariaDBSandbox]:
        return [self.m1, *self.cands, self.d, self.r2, self.r3]

    def start(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two at a time: a 2-core machine
            for future in [pool.submit(s.start) for s in self.servers()]:
                future.result()
        m1 = self.m1
        m1.create_user(REPL_USER, REPL_PASSWORD)  # replicated: every candidate can serve as a master later
        m1.execute(f"CREATE DATABASE {SCHEMA}")
        m1.execute(f"CREATE TABLE {SCHEMA}.backlog (id BIGINT NOT NULL, b VARBINARY(8192) NOT NULL) ENGINE=BLACKHOLE")
        m1.execute(f"CREATE TABLE {SCHEMA}.marker (id INT PRIMARY KEY, master_server_id INT NOT NULL, "
                   "note VARCHAR(100) NOT NULL) ENGINE=InnoDB")
        self.relay_port = free_port()
        self.relay = RelayProcess(
            self.workdir / "relay", m1.port, server_id=100, gtid_mode="mariadb",
            extra=["--listen", f"127.0.0.1:{self.relay_port}",
                   "--users", f"{REPL_USER}:{REPL_PASSWORD},{ADMIN_USER}:{ADMIN_PASSWORD}:admin"])
        self.relay.start()
        for replica in [*self.cands, self.d]:
            change_master(replica, m1.port, file=None)  # MASTER_USE_GTID=slave_pos
            replica.execute("START SLAVE")
        self.wait_all(timeout=60, downstream=False)  # R2 and R3 are wired below, once the relay has a file
        first_file = next(iter(relay_sql(self.relay_port, "SHOW BINARY LOGS")[0].values()))
        change_master(self.r2, self.relay_port, file=None)
        change_master(self.r3, self.relay_port, file=first_file, pos=4)
        for replica in (self.r2, self.r3):
            replica.execute("START SLAVE")
        self.wait_all(timeout=60)

    def close(self) -> None:
        problems = run_every_step([*(lambda s=s: s.stop(timeout=15) for s in (self.r2, self.r3, self.d)),
                                   lambda: self.relay.stop() if self.relay else None,
                                   *(lambda s=s: s.stop(timeout=15) if s.running else None
                                     for s in (*self.cands, self.m1))])
        if problems:
            log("could not stop everything cleanly: " + "; ".join(problems))

    def lagging(self, downstream: bool = True) -> list[str]:
        """Who does not yet hold the master's gtid_binlog_pos (read afresh); a stopped thread raises."""
        want = binlog_pos(self.master)
        behind = []
        status = self.relay.status()
        if not covers(status["retrieved_gtid_set"], want):
            error = f"; error: {status['last_io_error']}" if status.get("last_io_error") else ""
            behind.append(f"relay ({(status['read_master_log_pos'] or 0) / 1e6:,.0f} MB into "
                          f"{status['master_log_file']}{error})")
        # Everyone following the master in force directly (remaining candidates and D), then R2 and R3.
        directly = [c for c in self.cands if c is not self.master and c.running] + [self.d]
        for replica in [*directly, *((self.r2, self.r3) if downstream else ())]:
            state = replica_status(replica)
            if "No" in (state.get("Slave_IO_Running"), state.get("Slave_SQL_Running")):
                raise BenchError(f"{replica.basedir.name} stopped: {state.get('Last_IO_Error')} "
                                 f"{state.get('Last_SQL_Error')}")
            if not covers(slave_pos(replica), want):
                behind.append(f"{replica.basedir.name} (Exec {int(state.get('Exec_Master_Log_Pos') or 0) / 1e6:,.0f}"
                              f" MB of {state.get('Relay_Master_Log_File')})")
        return behind

    def wait_all(self, timeout: float, progress: bool = False, downstream: bool = True) -> float:
        """Until every server and the relay hold the master's GTIDs (``progress``: logged every 5 s); the seconds."""
        began = last_print = time.monotonic()
        while behind := self.lagging(downstream):
            now = time.monotonic()
            if now - began > timeout:
                raise BenchError(f"not caught up after {timeout:.0f} s: {behind}")
            if progress and now - last_print >= 5:
                log(f"  taking in the backlog, {now - began:.0f} s: behind: {', '.join(behind)}")
                last_print = now
            time.sleep(0.1)
        return time.monotonic() - began

    def binlog_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.m1.binlog_files())

    def generate(self, target: int, timeout: float) -> dict:
        """Write bulk rows on M1 until its binlog holds `target` bytes; wait until everyone has them."""
        began = last_print = time.monotonic()
        start_bytes = self.binlog_bytes()
        trx = rows = 0
        with _connect(self.m1) as conn:
            cur = conn.cursor()
            while (done := self.binlog_bytes()) < target:
                n = max(1, min(ROWS_PER_TRX, -(-(target - done) // (ROW_BYTES + 44))))
                cur.execute(f"INSERT INTO {SCHEMA}.backlog (id, b) SELECT seq + {rows}, REPEAT('x', {ROW_BYTES}) "
                            f"FROM {SCHEMA}.seq_1_to_{n}")
                trx += 1
                rows += n
                now = time.monotonic()
                if now - began > timeout:
                    raise BenchError(f"generating {target / 1e6:,.0f} MB took more than {timeout:.0f} s")
                if now - last_print >= 2:
                    log(f"  M1 binlog {done / 1e6:,.0f} / {target / 1e6:,.0f} MB, relay "
                        f"{self.relay.status()['relay_disk_bytes'] / 1e6:,.0f} MB")
                    last_print = now
        written = time.monotonic() - began
        log(f"  M1 wrote {(self.binlog_bytes() - start_bytes) / 1e6:,.1f} MB in {trx} transactions in {written:.1f} s; "
            "waiting for the relay, its replicas, D and the candidates")
        catchup = self.wait_all(timeout=max(timeout - written, 10), progress=True)
        status = self.relay.status()
        return {"target_bytes": target, "transactions": trx, "rows": rows, "m1_binlog_bytes": self.binlog_bytes(),
                "m1_files": [(p.name, p.stat().st_size) for p in self.m1.binlog_files()],
                "relay_disk_bytes": status["relay_disk_bytes"], "relay_files": status["relay_files"],
                "write_seconds": round(written, 2), "catchup_seconds": round(catchup, 2),
                "total_seconds": round(time.monotonic() - began, 2)}

    def flush_replica_relay_logs(self) -> None:
        """FLUSH RELAY LOGS on R2, R3 and D (untimed) until each SQL thread has purged the file that held the
        backlog: else R2 and R3 delete it inside the timed window (at the relay's epoch ROTATE), while D's CHANGE
        MASTER deletes its relay logs before START SLAVE."""
        deadline = time.monotonic() + 60
        for attempt in range(1, 1000):
            for replica in (self.r2, self.r3, self.d):
                replica.execute("FLUSH RELAY LOGS")
            # A SQL thread leaves (and purges) a relay log when the next event comes: one small transaction.
            self.master.execute(f"REPLACE INTO {SCHEMA}.marker (id, master_server_id, note) VALUES (1, %s, %s)",
                                (self.master.server_id, f"after FLUSH RELAY LOGS #{attempt}"))
            self.wait_all(timeout=60)
            time.sleep(0.1)
            files = {r.basedir.name: {p.name: p.stat().st_size for p in r.datadir.glob("relay-bin.[0-9]*")}
                     for r in (self.r2, self.r3, self.d)}
            if all(sum(f.values()) < 1 << 20 for f in files.values()):
                return
            log(f"  relay logs after FLUSH RELAY LOGS #{attempt}: {files}")
            if time.monotonic() > deadline:
                raise BenchError(f"the replicas keep their relay logs after FLUSH RELAY LOGS: {files}")

    def failover(self, k: int, relay_first: bool, timeout: float, profile: Path | None = None) -> dict:
        """Repeat k (1-based): kill the master in force, promote C_k, repoint, marker, then the timed STARTs.
        `profile`: record the relay with py-spy during its START SLAVE (raw output there)."""
        self.wait_all(timeout=60)
        old, new = self.master, self.cands[k - 1]
        old.kill()
        promote(new)
        self.master = new
        for cand in self.cands[k:]:  # the later candidates follow the new master (untimed), as an HA tool does
            repoint_replica(cand, new.port)
        wait_until(f"candidates {[c.basedir.name for c in self.cands[k:]]} to follow {new.basedir.name}",
                   lambda: all(covers(slave_pos(c), binlog_pos(new)) for c in self.cands[k:]))
        admin = pymysql.connect(host="127.0.0.1", port=self.relay_port, user=ADMIN_USER, password=ADMIN_PASSWORD,
                                connect_timeout=10, read_timeout=120)
        conns = [admin, _connect(self.d)]
        try:
            admin_cur, d_cur = admin.cursor(), conns[1].cursor()
            admin_cur.execute("STOP SLAVE")
            admin_cur.execute(change_master_sql(new.port))
            d_cur.execute("STOP SLAVE")
            d_cur.execute(change_master_sql(new.port, connect_retry=1, heartbeat_period=1))
            # The marker: the new master's first transaction.
            marker_id = 1000 + k
            join_file, join_pos = master_status(new)
            new.execute(f"INSERT INTO {SCHEMA}.marker (id, master_server_id, note) VALUES (%s, %s, %s)",
                        (marker_id, new.server_id, f"first transaction of {new.basedir.name}"))
            marker_gtid = binlog_pos(new)
            end_file, end_pos = master_status(new)
            while not all(covers(slave_pos(c), marker_gtid) for c in self.cands[k:]):
                time.sleep(0.01)
            os.sync()  # no writeback of the backlog left to compete with the timed part
            time.sleep(0.2)
            result = {"repeat": k, "old_master": old.basedir.name, "new_master": new.basedir.name,
                      "order": "relay, direct" if relay_first else "direct, relay", "marker_id": marker_id,
                      "marker_gtid": marker_gtid, "new_master_file_before_marker": [join_file, join_pos],
                      "new_master_end": [end_file, end_pos]}

            def row_probe(replica: MariaDBSandbox):
                conns.append(conn := _connect(replica))

                def probe() -> bool:
                    with conn.cursor() as c:
                        c.execute(f"SELECT 1 FROM {SCHEMA}.marker WHERE id = {marker_id}")
                        return c.fetchone() is not None
                return probe

            relay_probes = {"relay_r2": row_probe(self.r2), "relay_r3": row_probe(self.r3),
                            "relay_horizon": lambda: covers(self.relay.status()["retrieved_gtid_set"], marker_gtid)}
            direct_probes = {"direct": row_probe(self.d)}

            def timed_start(cursor, returned: str, probes: dict) -> None:
                """START SLAVE on `cursor`, a poller per probe started just before it: seconds until each sees it."""
                with concurrent.futures.ThreadPoolExecutor(len(probes)) as pool:
                    t0 = time.perf_counter()
                    polls = {key: pool.submit(first_seen, probe, t0, timeout) for key, probe in probes.items()}
                    cursor.execute("START SLAVE")
                    result[returned] = round(time.perf_counter() - t0, 4)
                    result.update((key, f.result()) for key, f in polls.items())

            def run_relay() -> None:
                spy = start_py_spy(self.relay.proc.pid, profile) if profile is not None else None
                timed_start(admin_cur, "relay_start_slave_returned", relay_probes)
                if spy is not None:
                    spy.wait(60)

            def run_direct() -> None:
                timed_start(d_cur, "direct_start_slave_returned", direct_probes)

            for step in ((run_relay, run_direct) if relay_first else (run_direct, run_relay)):
                step()
                time.sleep(0.2)
        finally:
            for conn in conns:
                with contextlib.suppress(Exception):
                    conn.close()
        status = self.relay.status()
        if status.get("last_io_error"):
            raise BenchError(f"relay reports {status['last_io_error']} after the switch\n{self.relay.log_tail()}")
        result["relay_files_after"] = status["relay_files"]
        result["relay_disk_bytes_after"] = status["relay_disk_bytes"]
        return result


# -- the profiled switch -------------------------------------------------------------------------------------------

def start_py_spy(pid: int, output: Path) -> subprocess.Popen | None:
    """py-spy attached to the relay for PROFILE_SECONDS (CPU samples only: idle threads are not sampled)."""
    exe = py_spy_exe()
    if exe is None:
        return None
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "1000", "--threads", "--format", "raw",
                             "--duration", str(PROFILE_SECONDS), "--output", str(output), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attached and sampling before START SLAVE goes out
    return proc


# Around everything: left out of the inclusive table.
_WRAPPERS = ("<module> (relayproxy/commands/cli.py)", "main (relayproxy/commands/cli.py)",
             "run (relayproxy/commands/run.py)")


def summarise_py_spy(raw: Path, top: int = 12) -> dict:
    """Samples per thread; the main thread's hottest functions (self) and relayproxy functions (inclusive)."""
    if py_spy_exe() is None:
        return {"error": "py-spy is not installed (`.venv/bin/pip install -e '.[profile]'`)"}
    if not raw.exists() or not raw.stat().st_size:
        return {"error": "py-spy wrote nothing (not allowed to attach? see ptrace_scope)"}
    threads: Counter[str] = Counter()
    selfs: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for thread, frames, count in py_spy_stacks(raw.read_text()):
        threads[thread] += count
        if thread != "?" and "MainThread" not in thread:
            continue  # worker threads: counted per thread only
        if frames:
            selfs[_short_frame(frames[-1])] += count
        for key in dict.fromkeys(_short_frame(f, with_line=False) for f in frames if "relayproxy/" in f):
            if not key.startswith(_WRAPPERS):
                incl[key] += count
    rank = lambda d: [{"where": k, "samples": v} for k, v in d.most_common(top)]  # noqa: E731
    return {"samples": sum(threads.values()), "rate": 1000, "threads": dict(threads), "self": rank(selfs),
            "inclusive": rank(incl)}


def _short_frame(frame: str, with_line: bool = True) -> str:
    func, path, line = frame_parts(frame)
    path = short_path(path)
    return f"{func} ({path}:{line})" if with_line else f"{func} ({path})"


# -- one backlog size ----------------------------------------------------------------------------------------------

def measure_backlog(size: int, repeats: int, parent: Path, flush: bool) -> dict:
    """``repeats`` failovers, then the profiled one, at a relay backlog of ``size`` bytes (``flush``: the replicas'
    relay logs flushed first, ``Topology.flush_replica_relay_logs``)."""
    label = size_label(size)
    workdir = Path(tempfile.mkdtemp(prefix=f"ft-{label.replace(' ', '')}-", dir=parent))
    topo = Topology(workdir, repeats + 1)
    began = time.monotonic()
    try:
        log(f"backlog {label}: starting {len(topo.servers())} servers and the relay in {workdir}")
        topo.start()
        setup = time.monotonic() - began
        log(f"backlog {label}: generating ({size / 1e6:,.0f} MB through M1)")
        backlog = topo.generate(size, GEN_TIMEOUT)
        log(f"backlog {label}: relay holds {backlog['relay_disk_bytes'] / 1e6:,.1f} MB in "
            f"{backlog['relay_files']} file(s); written in {backlog['write_seconds']:.1f} s, everyone had it "
            f"{backlog['catchup_seconds']:.1f} s later")
        if flush:
            topo.flush_replica_relay_logs()

        def one_failover(order, index):
            run = topo.failover(index + 1, order[0] == "relay", SWITCH_TIMEOUT)
            log(f"backlog {label} #{index + 1} ({' then '.join(order)}): relay->R2 {run['relay_r2']:.3f} s, "
                f"relay->R3 {run['relay_r3']:.3f} s, horizon {run['relay_horizon']:.3f} s, "
                f"direct {run['direct']:.3f} s")
            return run

        # Relay first in odd repeats, D first in even ones ("order": "relay then direct" / "direct then relay").
        runs = benchinfo.run_alternating(repeats, ["relay", "direct"], one_failover)
        mem = proc_status_kb(topo.relay.proc.pid)
        raw = workdir / "py-spy.txt"
        run = topo.failover(repeats + 1, True, SWITCH_TIMEOUT, profile=raw)
        profile = {"run": run, **summarise_py_spy(raw)}
        log(f"backlog {label}: profiled switch (py-spy attached, not in the statistics): relay->R2 "
            f"{run['relay_r2']:.3f} s, horizon {run['relay_horizon']:.3f} s; {profile.get('samples')} samples")
        markers = {name: [int(r[0]) for r in s.execute(f"SELECT id FROM {SCHEMA}.marker WHERE id >= 1000 ORDER BY id")]
                   for name, s in (("R2", topo.r2), ("R3", topo.r3), ("D", topo.d))}
        want = [1000 + k for k in range(1, repeats + 2)]
        if any(got != want for got in markers.values()):
            raise BenchError(f"markers differ from {want}: {markers}")
        relay_files = {p.name: (p.stat().st_size, p.stat().st_blocks * 512)
                       for p in sorted(topo.relay.relay_dir.glob(f"{BASENAME}.*")) if p.suffix[1:].isdigit()}
    finally:
        topo.close()
        shutil.rmtree(workdir, ignore_errors=True)
    out = {"backlog": size, "label": label, "generation": backlog, "runs": runs,
           "setup_seconds": round(setup, 1), "seconds_total": round(time.monotonic() - began, 1),
           "relay_rss_kb": mem.get("VmRSS"), "relay_hwm_kb": mem.get("VmHWM"), "markers": markers,
           "relay_files": relay_files, "profile": profile,
           "replica_relay_logs_flushed": flush}
    for path in PATHS:
        values = [r[path] for r in runs]
        med, lo, hi = benchinfo.median_range(values)
        out[path] = {"median": round(med, 4), "min": lo, "max": hi, "samples": values}
    direct = out["direct"]["median"]
    for key, path in (("ratio_r2", "relay_r2"), ("ratio_r3", "relay_r3")):
        out[key] = round(out[path]["median"] / direct, 2) if direct else None
    out["ratio_r2_per_repeat"] = [round(r["relay_r2"] / r["direct"], 2) for r in runs if r["direct"]]
    return out


# -- reporting -----------------------------------------------------------------------------------------------------

def _size(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 100_000 else f"{n / 1e3:,.1f} kB"


def _mr(d: dict) -> str:
    return benchinfo.fmt_median_range(d["samples"], "{:.3f}")


def summary_section(report: dict) -> list[str]:
    rows = report["backlogs"]
    out = [
        "Seconds from the moment `START SLAVE` is sent to the relay (after `STOP SLAVE; CHANGE MASTER TO ... "
        "MASTER_USE_GTID=slave_pos` to a freshly promoted candidate, the old master killed with SIGKILL) until a "
        "marker row, the new master's first transaction, is visible on R2 (behind the relay by GTID) and on R3 "
        "(behind the relay by file/position); and, measured the same way in the same run, until it is visible on "
        "D, a plain MariaDB replica of the old master repointed with the same `CHANGE MASTER ... "
        "MASTER_USE_GTID=slave_pos; START SLAVE` (the peer). Each poller probes every "
        f"{POLL * 1000:.0f} ms on an open connection. Median and range (min - max) of {report['repeats']} failovers "
        "per backlog (each repeat kills the master in force and promotes the next candidate; relay and direct take "
        "turns going first). **Ratio = relay median / direct median** (per failover: the next paragraph); absolute "
        "times on this shared 2-core machine are noise, the ratios and ranges are the result. How it is done: the "
        "docstring of `benchmarks/failover_time.py`.",
        "",
        "| backlog | relay files | relay -> R2 (GTID), s | relay -> R3 (file/pos), s | direct: D (MariaDB), s | "
        "ratio R2 / direct | ratio R3 / direct | relay horizon, s | relay RSS / peak | backlog generated + taken in |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in rows:
        g = b["generation"]
        out.append(md_row(b["label"], f"{_size(g['relay_disk_bytes'])} in {g['relay_files']}", _mr(b["relay_r2"]),
                          _mr(b["relay_r3"]), _mr(b["direct"]), f"{b['ratio_r2']:.2f}", f"{b['ratio_r3']:.2f}",
                          _mr(b["relay_horizon"]),
                          f"{(b['relay_rss_kb'] or 0) / 1024:,.0f} / {(b['relay_hwm_kb'] or 0) / 1024:,.0f} MB",
                          f"{g['write_seconds']:.1f} s + {g['catchup_seconds']:.1f} s"))
    worst = max(max(b["relay_r2"]["max"], b["relay_r3"]["max"]) for b in rows)
    first, last = rows[0], rows[-1]
    grow, grow_direct = last["relay_r2"]["median"], last["direct"]["median"]
    # "Independent of the backlog": the largest backlog's median within 1.5x (or 0.05 s) of the smallest one's.
    flat = grow <= max(1.5 * first["relay_r2"]["median"], first["relay_r2"]["median"] + 0.05)
    out += ["", f"**Goal, under {GOAL_SECONDS:g} s: {'met' if worst < GOAL_SECONDS else 'MISSED'}** (slowest single "
            f"switch behind the relay: {worst:.3f} s). "
            + (f"**Independent of the backlog size: {'yes' if flat else 'NO'}** -- relay -> R2 median "
               f"{first['relay_r2']['median']:.3f} s at {first['label']}, {grow:.3f} s at {last['label']} "
               f"(direct: {first['direct']['median']:.3f} s, {grow_direct:.3f} s)." if len(rows) > 1 else "")]
    out += ["", "Ratio relay -> R2 / direct per failover, median and range: " + "; ".join(
        f"{b['label']}: {benchinfo.fmt_median_range(b['ratio_r2_per_repeat'], '{:.2f}', 'x')}"
        for b in rows if b.get("ratio_r2_per_repeat")) + "."]
    return out + [
        "",
        "- *relay horizon*: from `START SLAVE` until the relay's `GET /status` `retrieved_gtid_set` holds the "
        "marker's GTID, i.e. the relay has the new master's first transaction durable in its files (it advertises "
        "nothing else).",
        "- *relay RSS / peak*: VmRSS and VmHWM of the relay process after the last switch of that backlog.",
        "- *backlog generated + taken in*: seconds M1 took to write the backlog, then until the relay, R2, R3, D and "
        "every candidate held it (all concurrently on the same 2 cores).",
        "",
    ]


def details_sections(report: dict) -> list[str]:
    rows = report["backlogs"]
    out = [
        "## Every failover",
        "",
        "| backlog | # | order | new master's binlog before the marker | relay -> R2 | relay -> R3 | horizon | "
        "direct | R2 / direct | relay START SLAVE returned | D START SLAVE returned |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in rows:
        for r in b["runs"]:
            f, p = r["new_master_file_before_marker"]
            out.append(md_row(b["label"], r["repeat"], r["order"], f"{f} at {_size(p)}",
                              *(f"{r[key]:.3f}" for key in ("relay_r2", "relay_r3", "relay_horizon", "direct")),
                              f"{r['relay_r2'] / r['direct']:.2f}", f"{r['relay_start_slave_returned']:.3f}",
                              f"{r['direct_start_slave_returned']:.3f}"))
    out += [
        "",
        "*new master's binlog before the marker*: where the marker starts in the promoted candidate's binlog. A "
        "MariaDB 10.11 master finds a replica's GTID position by reading the binlog file that holds it from its "
        "start (no GTID index before 11.4), so the relay and D both wait for it to read that much.",
        "",
        "## Backlogs",
        "",
        "| backlog | M1 transactions | M1 binlog | relay files (name: size, allocated) | servers started | "
        "generated | taken in by everyone | whole backlog (setup, generation, switches) |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for b in rows:
        g = b["generation"]
        files = ", ".join(f"{n}: {_size(s)} / {_size(a)}" for n, (s, a) in b["relay_files"].items())
        out.append(md_row(b["label"], f"{g['transactions']:,}", _size(g["m1_binlog_bytes"]), files,
                          f"{b['setup_seconds']:.1f} s", f"{g['write_seconds']:.1f} s", f"{g['catchup_seconds']:.1f} s",
                          f"{b['seconds_total']:.0f} s"))
    return out + [
        "",
        f"Whole run: {report['run_seconds']:.0f} s. Relay files are listed after the switches: the first epoch's "
        "files hold the backlog; each later epoch's file mirrors the new master's file, whose part before the join "
        "point is filler (sparse: the allocated size is what is on disk). Markers on R2, R3 and D after the run: "
        "each exactly once, in order, on every backlog (checked).",
        "",
        "Settings: every server MariaDB with binlog_format=ROW (M1 and candidates: basename mysql-bin, "
        "log_slave_updates, gtid_strict_mode, default max_binlog_size 1 GB, sync_binlog=0, "
        "innodb_flush_log_at_trx_commit=1); R2, R3, D without a binlog, MASTER_CONNECT_RETRY=1, "
        "MASTER_HEARTBEAT_PERIOD=1. The relay: `relayproxy run --gtid-mode mariadb --listen ...` with the test "
        "harness's `--heartbeat-period 0.5 --reconnect-max-delay 0.5`, default `--sync-mode transaction`. The "
        "backlog table is BLACKHOLE everywhere (same binlog bytes, no table data to store); the marker table InnoDB.",
        "",
    ]


def profile_section(report: dict) -> list[str]:
    profiled = [b for b in report["backlogs"] if b.get("profile")]
    if not profiled:
        return []
    out = ["## Where the relay's switch time goes (py-spy)", "",
           "One more failover per backlog, after the timed ones and not in the statistics: py-spy "
           f"(`record --rate 1000 --threads --nonblocking`, no `--idle`: only samples where a thread is on a "
           f"CPU) attached to the relay for {PROFILE_SECONDS} s from 0.5 s before `START SLAVE`. At 1,000 "
           "samples a second, one sample is about 1 ms of CPU.", ""]
    for b in profiled:
        prof, run = b["profile"], b["profile"].get("run") or {}
        out += [f"### {b['label']}: relay -> R2 {run.get('relay_r2', 0):.3f} s, horizon "
                f"{run.get('relay_horizon', 0):.3f} s, direct {run.get('direct', 0):.3f} s with the profiler attached",
                ""]
        if "error" in prof:
            out += [f"No profile: {prof['error']}.", ""]
            continue
        out += ["Samples per thread: " + ", ".join(f"{t} {n}" for t, n in prof["threads"].items()) + ".", ""]
        for head, key, shown in (("main thread, innermost frame", "self", 8),
                                 ("relayproxy function or anything it calls (main thread)", "inclusive", 10)):
            out += [md_row(head, "samples"), "|---|---:|", *(md_row(f"`{r['where']}`", r["samples"])
                                                            for r in prof[key][:shown]), ""]
    return out


def write_markdown(path: Path, report: dict) -> None:
    body = [*summary_section(report), *details_sections(report), *profile_section(report)]
    if report.get("notes"):
        body += [report["notes"].rstrip(), ""]
    write_results(path, results_document(
        "Failover time: START SLAVE on the relay -> the new master's first transaction applied behind it",
        __file__, [], report["machine"], body, runs=report["repeats"], command=report["command"],
        what="each run is one failover per backlog (the master in force killed, the next candidate promoted), the "
             "relay's pollers or D's started first in turn"))


def write_plot(path: Path, report: dict) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    rows = report["backlogs"]
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = {"relay_r2": ("#c44e52", "o", "-"), "relay_r3": ("#dd8452", "s", "-"),
              "relay_horizon": ("#937860", "^", ":"), "direct": ("#4c72b0", "D", "--")}
    for i, name in enumerate(PATHS):
        color, marker, ls = styles[name]
        med = [b[name]["median"] for b in rows]
        errors = [[b[name]["median"] - b[name]["min"] for b in rows], [b[name]["max"] - b[name]["median"] for b in rows]]
        ax.errorbar([x + (i - 1.5) * 0.05 for x in xs], med, yerr=errors, color=color, marker=marker, ls=ls,
                    capsize=3, label=PATH_LABELS[name])
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.axhline(GOAL_SECONDS, color="gray", lw=0.8, ls="--")
    ax.text(xs[-1], GOAL_SECONDS, " goal 1 s", va="bottom", ha="right", fontsize=8, color="gray")
    ax.set_xticks(xs, [f"{b['label']}\n({b['generation']['relay_disk_bytes'] / 1e6:,.0f} MB of relay files)"
                       for b in rows], fontsize=8)
    ax.set_xlabel("relay backlog")
    ax.set_ylabel("seconds from START SLAVE (median, bar: min-max)")
    top = max(max(b[p]["max"] for p in PATHS) for b in rows)
    ax.set_ylim(0, max(top * 1.2, GOAL_SECONDS * 1.15))
    ax.set_title(f"Failover: START SLAVE -> new master's first transaction applied ({report['repeats']} repeats)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path, dpi=110)
    return True


# -- command line --------------------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backlogs", default="0,100M,1G", help="comma-separated relay backlog sizes (decimal: 100M = "
                   "100,000,000 bytes; default 0,100M,1G)")
    p.add_argument("--repeats", type=int, default=3, help="failovers per backlog (default 3; one candidate each)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "failover_time.md",
                   help="markdown results; the plot goes beside it with the suffix .png")
    add_report_options(p)
    p.add_argument("--workdir", type=Path, default=None, help="parent of the temporary directories (default $TMPDIR)")
    p.add_argument("--keep-replica-relay-logs", action="store_true", help="do not FLUSH RELAY LOGS on R2, R3 and D "
                   "before the switches: R2 and R3 then purge the relay log that held the backlog inside the timed "
                   "window (D's CHANGE MASTER purges its own before it)")
    args = p.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.backlogs.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if not args.sizes:
        p.error("--backlogs is empty")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def measure(args: argparse.Namespace, argv: list[str]) -> dict:
    began = time.monotonic()
    report = {"command": benchinfo.command_line(__file__, argv), "repeats": args.repeats}
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    report["backlogs"] = [measure_backlog(s, args.repeats, args.workdir, not args.keep_replica_relay_logs)
                          for s in args.sizes]
    report["run_seconds"] = round(time.monotonic() - began, 1)
    report["machine"] = benchinfo.machine_info(server=True)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    report = report_of(args, lambda: measure(args, argv))
    write_markdown(args.out, report)
    plotted = write_plot(args.out.with_suffix(".png"), report)
    log(f"wrote {args.out}" + (f" and {args.out.with_suffix('.png')}" if plotted else " (no plot: matplotlib missing)")
        + (f" from {args.render}" if args.render else f"; the run took {report['run_seconds']:.0f} s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
