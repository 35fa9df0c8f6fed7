"""Chaos soak: a live MariaDB topology through relayproxy under load and random faults, then fuzzing, then checksums.

Every server is a ``relayproxy.lab.sandbox`` mariadbd (binlog_format ROW, GTIDs, ``max_binlog_size`` 1 MB)::

    load threads --> master --+--> direct replica (MASTER_USE_GTID=slave_pos: the control)
                              |
                              +--> fault proxy --> relayproxy run --listen --> replica 1 (MASTER_USE_GTID=slave_pos)
                                                                          +--> replica 2 (file/position, USE_GTID=no)

Under a mixed load (``Load``), for ``--minutes`` a seeded loop injects one fault at a time, in shuffled rounds of
every kind of ``FAULT_WEIGHTS`` (relay PURGE: never past a file a replica needs, half of them first while a stalled
dump reads the oldest file, which the relay must refuse with 1378; replica kill -9: crash-safe replicas only). After
each, the relay's horizon and every replica's gtid_slave_pos must reach the master's (read after the fault) within
``CONVERGE_TIMEOUT`` s. Checked throughout: the relay's horizon never moves back, across restarts too; its files
equal the master's byte for byte. After the chaos, the load stopped: row counts and CHECKSUM TABLE of every table
on every server; then the fuzzers of ``relayproxy/lab/fuzz.py`` (the binlog parser; the live relay's port while a
light load replicates through it) and every table again. Exit status 0 when every check of ``verdict`` passed.

    .venv/bin/python benchmarks/soak.py --minutes 10 --seed 1 --fuzz-inputs 100000 --output benchmarks/results/soak.md
    .venv/bin/python benchmarks/soak.py --minutes 0.75 --min-faults 12 --fuzz-inputs 3000 --json  # as its test
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

import pymysql  # noqa: E402

from benchmarks import fanout_common  # noqa: E402  (its Relay: `relayproxy run --listen`, with a replica account)
from benchmarks.common import (  # noqa: E402
    every, header_block, logger, machine_info, machine_section, md_row, write_results)
from benchmarks.relay_bench import clear_in_use, corpus_dir, json_log  # noqa: E402
from relayproxy.lab import fuzz  # noqa: E402
from relayproxy.lab.failover import (  # noqa: E402  (ADMIN_USER: may PURGE the relay's files; the fuzzer never does)
    ADMIN_PASSWORD, ADMIN_USER, binlog_pos, covers, first_difference, gtid_seqs, relay_sql, slave_pos)
from relayproxy.lab.faultproxy import SERVER_TO_CLIENT, FaultProxyError, ThreadedFaultProxy  # noqa: E402
from relayproxy.lab.harness import (  # noqa: E402
    FIRST_FILE, change_master, master_status, replica_status, run_every_step)
from relayproxy.lab.procstat import fd_count  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox  # noqa: E402

REPL_USER, REPL_PASSWORD = fanout_common.REPL_USER, fanout_common.REPL_PASSWORD
ADMIN_TOML = f"""
[[users]]
name = "{ADMIN_USER}"
password = "{ADMIN_PASSWORD}"
plugin = "mysql_native_password"
admin = true
"""
SCHEMA = "soak"
MASTER_CONFIG = {"max_binlog_size": "1M", "sync_binlog": 0, "innodb_flush_log_at_trx_commit": 2,
                 "innodb_buffer_pool_size": "64M", "max_connections": 500}
# Crash-safe replicas: relay logs are thrown away and fetched again from gtid_slave_pos (InnoDB) after a crash.
REPLICA_CONFIG = {"relay_log_recovery": "ON", "innodb_flush_log_at_trx_commit": 1, "slave_net_timeout": 10,
                  "innodb_buffer_pool_size": "32M"}
# Fault kinds and their weight in each shuffled round.
FAULT_WEIGHTS = {
    "relay kill -9": 3, "relay SIGTERM": 2,
    "upstream cut": 3, "upstream corrupt byte": 3, "upstream pause": 2,
    "replica STOP/START SLAVE": 2, "replica kill -9": 2, "replica clean restart": 1,
    "relay PURGE": 2, "master PURGE": 1,
    "direct replica kill -9": 1,
}
# What MariaDB's error log says when a file/position replica reconnected inside a statement (its rows-event tracker
# is reset at a reconnect only for GTID replicas: tests/scenarios/test_scenario_file_position_mid_statement.py).
MID_STATEMENT_LINE = "did not receive an expected Rows-log end-of-statement"
REPLICA_FAULTS = ("replica STOP/START SLAVE", "replica kill -9", "replica clean restart", "direct replica kill -9")
KEEP_FILES = 3  # PURGE keeps at least the newest this many files
STALLED_DUMP_SERVER_ID = 999_999  # the replica that stalls in the oldest relay file before some PURGEs
LOAD_THREADS, BIG_MB, BIG_EVERY = 2, 3.0, 25.0  # the load's threads; a big transaction's MB, every ~this many s
RATE, FUZZ_LOAD_RATE = 120.0, 20.0  # the load's transactions a second in all: during the chaos, during the port fuzz
CONVERGE_TIMEOUT = 120.0  # seconds a fault may take to converge
GAP_MIN, GAP_MAX = 1.0, 4.0  # seconds between faults
FUZZ_WORKERS = 6  # parallel connections of the port fuzzer

log = logger("soak")


def file_key(name: str) -> int:
    """Binlog files sort by their numeric suffix."""
    return int(name.rsplit(".", 1)[1])


def position_key(file: str | None, pos: int | None) -> tuple[int, int]:
    return (file_key(file), int(pos)) if file else (-1, -1)


def horizon(status: dict) -> tuple[tuple[int, int], str]:
    """The horizon a relay's /status advertises: its sort key and "file:position"."""
    file, pos = status["master_log_file"], status["read_master_log_pos"]
    return position_key(file, pos), f"{file}:{pos}"


# -- the relay and the replicas ----------------------------------------------------------------------------------

class SoakRelay(fanout_common.Relay):
    """The fan-out benchmarks' relay pointed at the fault proxy (``upstream``), resuming by MariaDB GTID, with an
    admin account for PURGE beside the replicas' one."""

    def __init__(self, work: Path, upstream) -> None:
        super().__init__(work, upstream, users_toml=fanout_common.USERS_TOML + ADMIN_TOML,
                         extra=["--gtid-mode", "mariadb", "--heartbeat-period", "0.5", "--reconnect-max-delay", "0.5"])

    def binlogs(self) -> list[str]:
        return [row["Log_name"] for row in relay_sql(self.listen_port, "SHOW BINARY LOGS")]

    def upstream_ends(self, offset: int) -> tuple[dict, str | None]:
        """How its upstream connections ended since ``offset`` of its log: {kind: count}, the first message."""
        kinds: collections.Counter = collections.Counter()
        first = None
        for entry in json_log(self.log_path, offset):
            if entry.get("event") == "upstream connection ended":
                kinds[str(entry.get("kind"))] += 1
                first = first or str(entry.get("error"))
        return dict(kinds), first


@dataclass
class Replica:
    name: str
    sandbox: MariaDBSandbox
    via: str  # "relay" or "master"
    use_gtid: str  # "slave_pos" or "no"
    restarts: int = 0

    @property
    def crash_safe(self) -> bool:
        # File/position replicas keep their position in relay-log.info, not transactionally with the data.
        return self.use_gtid == "slave_pos"

    def status(self) -> dict:
        return {**replica_status(self.sandbox), "gtid_slave_pos": slave_pos(self.sandbox)}

    def log_size(self) -> int:
        with contextlib.suppress(OSError):
            return self.sandbox.error_log.stat().st_size
        return 0

    def stopped_mid_statement(self, since: int) -> bool:
        """Whether MariaDB's IO thread stopped on its rows-event tracker after a reconnect inside a statement
        (1595, and its error log line after byte ``since``): a file/position replica's limitation at a cut link
        (docs/operations.md, "Recovery"), which START SLAVE resumes."""
        try:
            st = replica_status(self.sandbox)
            if st.get("Slave_IO_Running") != "No" or str(st.get("Last_IO_Errno")) != "1595":
                return False  # (the common case at every poll: the error log is read only for a 1595 stop)
            with open(self.sandbox.error_log, "rb") as f:
                f.seek(since)
                return MID_STATEMENT_LINE in f.read().decode(errors="replace")
        except (OSError, pymysql.MySQLError):
            return False

    def errors_logged(self, lines: int = 6) -> list[str]:
        """The last ``lines`` [ERROR] lines of the server's error log: the reason behind a generic Last_IO_Error
        such as "could not queue event from master" is written there only."""
        try:
            text = self.sandbox.error_log.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if "[ERROR]" in line][-lines:]


# -- the load ----------------------------------------------------------------------------------------------------

class Load:
    """Mixed write load on the master, in ``LOAD_THREADS`` threads, about ``rate`` transactions a second in all."""

    def __init__(self, master: MariaDBSandbox, seed: int, rate: float) -> None:
        self.master = master
        self.seed = seed
        self.rate = rate
        self.transactions: collections.Counter = collections.Counter()  # by kind
        self.rows = self.deadlocks = 0
        self.errors: list[str] = []
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._scratch = 0

    @property
    def total(self) -> int:
        return sum(self.transactions.values())

    @staticmethod
    def create_schema(master: MariaDBSandbox) -> None:
        master.execute(f"CREATE DATABASE {SCHEMA}")
        master.execute(f"CREATE TABLE {SCHEMA}.accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL, "
                       "note VARCHAR(200) NOT NULL, version INT NOT NULL DEFAULT 0) ENGINE=InnoDB")
        master.execute(f"INSERT INTO {SCHEMA}.accounts (id, balance, note) SELECT seq, 1000, CONCAT('acct-', seq) "
                       f"FROM {SCHEMA}.seq_1_to_2000")
        master.execute(f"CREATE TABLE {SCHEMA}.events (id BIGINT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, "
                       "payload VARCHAR(255) NOT NULL, at DATETIME(6) NOT NULL) ENGINE=InnoDB")
        master.execute(f"CREATE TABLE {SCHEMA}.ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, account INT NOT NULL, "
                       "amount INT NOT NULL, memo VARCHAR(100) NOT NULL) ENGINE=InnoDB")
        master.execute(f"CREATE TABLE {SCHEMA}.blobs (id INT AUTO_INCREMENT PRIMARY KEY, tag INT NOT NULL, "
                       "data MEDIUMTEXT NOT NULL) ENGINE=InnoDB")

    def start(self) -> "Load":
        self._started = time.monotonic()
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"load-{i}", daemon=True)
                         for i in range(LOAD_THREADS)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> "Load":
        self._stop.set()
        for t in self._threads:
            t.join(120)
        self.seconds += time.monotonic() - self._started
        self._threads = []
        return self

    def _run(self, index: int) -> None:
        rng = random.Random(f"{self.seed}/load/{index}/1")
        interval = LOAD_THREADS / self.rate
        conn = None
        next_at = last_big = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now < next_at:
                time.sleep(min(next_at - now, 0.2))
                continue
            next_at = max(next_at + interval, now - 1.0)
            try:
                if conn is None:
                    conn = self.master.connect(database=SCHEMA, read_timeout=120)
                cur = conn.cursor()
                if index == 0 and now - last_big > BIG_EVERY * rng.uniform(0.5, 1.5):
                    kind, rows = self._big(cur, rng)
                    last_big = time.monotonic()
                else:
                    kind, rows = self._one(cur, rng, index)
                with self._lock:
                    self.transactions[kind] += 1
                    self.rows += rows
            except Exception as exc:  # noqa: BLE001 - the master is never faulted: any error is reported
                if isinstance(exc, pymysql.err.OperationalError) and exc.args and exc.args[0] == 1213:
                    with self._lock:
                        self.deadlocks += 1  # InnoDB rolled it back, the load goes on
                    with contextlib.suppress(Exception):
                        conn.rollback()
                    continue
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
                time.sleep(0.5)
        if conn is not None:
            conn.close()

    def _one(self, cur, rng: random.Random, index: int) -> tuple[str, int]:
        r = rng.random()
        if index == 1:  # the second thread: its own table, small transactions
            if r < 0.6:
                cur.execute("INSERT INTO ledger (account, amount, memo) VALUES (%s, %s, %s)",
                            (rng.randrange(1, 2001), rng.randrange(-500, 500), "memo-" + "m" * rng.randrange(80)))
                return "autocommit insert", 1
            cur.execute("BEGIN")
            n = 0
            for _ in range(rng.randrange(2, 6)):
                cur.execute("INSERT INTO ledger (account, amount, memo) VALUES (%s, %s, 'batch')",
                            (rng.randrange(1, 2001), rng.randrange(-500, 500)))
                n += 1
            n += cur.execute("DELETE FROM ledger WHERE id = %s", (rng.randrange(1, 1 + 5 * self.total + 10),))
            cur.execute("COMMIT")
            return "multi-statement transaction", n
        if r < 0.45:
            n = rng.randrange(1, 4)
            cur.execute("INSERT INTO events (k, payload, at) VALUES " + ",".join(["(%s, %s, NOW(6))"] * n),
                        [x for _ in range(n) for x in (rng.randrange(1 << 30), "p" * rng.randrange(10, 250))])
            return "autocommit insert", n
        if r < 0.55:
            n = cur.execute("UPDATE accounts SET balance = balance + 1, version = version + 1 WHERE id = %s",
                            (rng.randrange(1, 2001),))
            return "autocommit update", n
        if r >= 0.965:
            return self._ddl(cur, rng)
        cur.execute("BEGIN")
        n = 0
        for _ in range(rng.randrange(2, 8)):
            op = rng.random()
            if op < 0.45:
                a, b = rng.randrange(1, 2001), rng.randrange(1, 2001)
                amount = rng.randrange(1, 50)
                n += cur.execute("UPDATE accounts SET balance = balance - %s, version = version + 1 WHERE id = %s",
                                 (amount, a))
                n += cur.execute("UPDATE accounts SET balance = balance + %s, version = version + 1 WHERE id = %s",
                                 (amount, b))
            elif op < 0.8:
                n += cur.execute("INSERT INTO events (k, payload, at) VALUES (%s, %s, NOW(6))",
                                 (rng.randrange(1 << 30), "t" * rng.randrange(10, 250)))
            else:
                n += cur.execute("DELETE FROM events WHERE k < %s ORDER BY id LIMIT 2", (rng.randrange(1 << 24),))
        cur.execute("COMMIT")
        return "multi-statement transaction", n

    def _ddl(self, cur, rng: random.Random) -> tuple[str, int]:
        # IF [NOT] EXISTS: a MariaDB replica killed between a DDL and its gtid_slave_pos row runs the DDL again at
        # its restart (DDL is not crash-safe on a replica), which failed the direct replica once with "Duplicate
        # column name" (seed 777, fault 43, a direct replica kill -9: the column was there, gtid_slave_pos one behind).
        cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                    "AND table_name LIKE 'scratch%%'", (SCHEMA,))
        existing = sorted(row[0] for row in cur.fetchall())
        r = rng.random()
        if not existing or (r < 0.4 and len(existing) < 4):
            self._scratch += 1
            name = f"scratch_{self.seed % 1000}_{self._scratch}_{rng.randrange(1 << 20)}"
            cur.execute(f"CREATE TABLE IF NOT EXISTS {name} (id INT PRIMARY KEY, v VARCHAR(50)) ENGINE=InnoDB")
            n = cur.execute(f"INSERT INTO {name} SELECT seq, CONCAT('v', seq) FROM seq_1_to_{rng.randrange(1, 50)}")
            return "DDL (CREATE + fill)", n
        name = rng.choice(existing)
        if r < 0.75:
            column = f"c{rng.randrange(1 << 20)}"
            cur.execute(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {column} INT NOT NULL "
                        f"DEFAULT {rng.randrange(100)}")
            return "DDL (ALTER)", 0
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        return "DDL (DROP)", 0

    def _big(self, cur, rng: random.Random) -> tuple[str, int]:
        rows = max(1, int(BIG_MB * 1e6 / 2000))
        tag = rng.randrange(1 << 30)
        cur.execute("BEGIN")
        n = cur.execute(f"INSERT INTO blobs (tag, data) SELECT {tag}, REPEAT(CHAR(65 + seq % 26), 2000) "
                        f"FROM seq_1_to_{rows}")
        cur.execute("COMMIT")
        # Keep the table small: the next big transaction deletes most of the previous ones' rows (a big one too).
        n += cur.execute("DELETE FROM blobs WHERE tag <> %s", (tag,))
        return "big transaction", n


# -- the invariants ----------------------------------------------------------------------------------------------

class HorizonMonitor:
    """The relay's advertised horizon (its /status) must never move backwards, across restarts included."""

    def __init__(self, relay: SoakRelay) -> None:
        self.relay = relay
        self.checks = self.restarts_seen = 0
        self.violations: list[str] = []
        self.best: tuple[int, int] = (-1, -1)
        self.best_text = ""
        self._last_pid = None

    def observe(self) -> None:
        proc = self.relay.proc
        if proc is None:
            return
        try:
            status = self.relay.status()
        except OSError:
            return
        if self.relay.proc is not proc:
            return  # restarted under us: cannot tell which process answered
        key, text = horizon(status)
        self.checks += 1
        if self._last_pid is not None and proc.pid != self._last_pid:
            self.restarts_seen += 1
        self._last_pid = proc.pid
        if key < self.best:
            self.violations.append(f"horizon moved back from {self.best_text} to {text} (relay pid {proc.pid})")
        elif key > self.best:
            self.best, self.best_text = key, text


class FileChecker:
    """Relay files against the master's, byte for byte; each closed file once, the active one up to a position."""

    def __init__(self, relay_dir: Path, master: MariaDBSandbox) -> None:
        self.relay_dir = relay_dir
        self.master = master
        self.verified: set[str] = set()
        self.skipped_purged: set[str] = set()
        self.mismatches: list[str] = []
        self.checks = self.bytes_compared = 0

    def figures(self) -> dict:
        return {"file_checks": self.checks, "file_bytes_compared": self.bytes_compared,
                "file_mismatches": self.mismatches}

    def check(self, up_to: tuple[str, int] | None = None) -> None:
        """Closed files not yet verified; with ``up_to`` (the horizon at rest), the active file up to it as well."""
        try:
            names = (self.relay_dir / "relayproxy.index").read_text().split()
        except OSError:
            return
        active = names[-1:]
        for name in names[:-1] + (active if up_to is not None else []):
            if name in self.verified and name not in active:
                continue
            try:
                mine = (self.relay_dir / name).read_bytes()
            except FileNotFoundError:
                continue  # purged on the relay meanwhile
            try:
                theirs = (self.master.binlog_dir / name).read_bytes()
            except FileNotFoundError:
                self.skipped_purged.add(name)
                continue
            if name in active and up_to is not None:
                if up_to[0] != name:
                    self.mismatches.append(f"relay's newest file is {name} but the horizon is {up_to}")
                    continue
                theirs = theirs[:up_to[1]]  # the relay's file ends exactly at its horizon
            self.checks += 1
            self.bytes_compared += len(theirs)
            mine, theirs = clear_in_use(mine), clear_in_use(theirs)
            if mine != theirs:
                self.mismatches.append(f"{name}: relay and master: {first_difference(mine, theirs)}")
            self.verified.add(name)


# -- the soak ----------------------------------------------------------------------------------------------------

@dataclass
class Fault:
    number: int
    kind: str
    target: str = ""
    detail: str = ""
    injected: bool = False
    survived: bool | None = None
    converge_s: float | None = None
    failure: str | None = None
    relay_said: dict = field(default_factory=dict)  # "upstream connection ended" kinds the relay logged after it
    relay_error: str | None = None  # the first of those messages
    resumed: list = field(default_factory=list)  # replicas given START SLAVE after MariaDB's mid-statement check


def convergence(ok: bool, seconds: float, detail: str) -> dict:
    return {"ok": ok, "seconds": round(seconds, 1), "detail": detail}


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.replicas: list[Replica] = []
        self.stops: list = []  # what teardown() stops, newest first
        self.faults: list[Fault] = []
        self.binlog_sizes: dict[str, int] = {}  # every master file seen, purged ones too
        self.relay_purges: collections.Counter = collections.Counter()  # relay PURGE outcomes
        self.purged = {"relay": 0, "master": 0}  # files purged

    def replicas_via(self, source: str) -> list[Replica]:
        return [r for r in self.replicas if r.via == source]

    # -- set-up ------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        self.master = MariaDBSandbox(self.work / "master", server_id=1, binlog_format="ROW", extra_config=MASTER_CONFIG)
        specs = [("direct replica", "master", "slave_pos"), ("relay replica 1", "relay", "slave_pos"),
                 ("relay replica 2", "relay", "no")]
        for i, (name, via, use_gtid) in enumerate(specs):
            box = MariaDBSandbox(self.work / f"replica{i}", server_id=11 + i, log_bin=False,
                                 extra_config=REPLICA_CONFIG)
            self.replicas.append(Replica(name, box, via, use_gtid))
        servers = [self.master] + [r.sandbox for r in self.replicas]
        self.stops += [box.stop for box in servers]
        log(f"starting the master and {len(self.replicas)} replicas in {self.work}")
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(), servers))
        self.master.create_user(REPL_USER, REPL_PASSWORD)
        Load.create_schema(self.master)
        self.proxy = ThreadedFaultProxy("127.0.0.1", self.master.port).start()
        self.stops.append(self.proxy.stop)
        self.relay = SoakRelay(self.work, self.proxy)
        self.stops.append(self.relay.stop)
        self.relay.start()
        self.files = FileChecker(self.relay.relay_dir, self.master)
        for r in self.replicas:
            port = self.master.port if r.via == "master" else self.relay.listen_port
            change_master(r.sandbox, port, file=None if r.use_gtid == "slave_pos" else FIRST_FILE)
            r.sandbox.execute("START SLAVE")
        self.monitor = HorizonMonitor(self.relay)
        self.stop_monitor = every(0.2, self.monitor.observe, "horizon-monitor")
        self.stops.append(self.stop_monitor)
        self.load = Load(self.master, self.args.seed, RATE).start()
        self.stops.append(lambda: self.load._threads and self.load.stop())  # (the load of the moment)
        ok, seconds, detail = self.converge(timeout=CONVERGE_TIMEOUT)
        if not ok:
            raise RuntimeError(f"the topology did not converge after set-up: {detail}")
        log(f"topology up and converged in {seconds:.1f}s: relay {self.relay.listen_port}, proxy {self.proxy.port}, "
            f"master {self.master.port}")

    def teardown(self) -> None:
        for problem in run_every_step(reversed(self.stops)):
            log(f"teardown: {problem}")

    # -- observation -------------------------------------------------------------------------------------------
    def master_position(self) -> tuple[str, int, str]:
        return (*master_status(self.master), binlog_pos(self.master))

    def master_binlogs(self) -> list[str]:
        """The master's files now; their sizes noted (``binlog_sizes``)."""
        rows = self.master.execute("SHOW BINARY LOGS")
        self.binlog_sizes.update((name, int(size)) for name, size, *_ in rows)
        return [row[0] for row in rows]

    def converge(self, timeout: float, exact: bool = False, resume: dict | None = None,
                 fault: Fault | None = None) -> tuple[bool, float, str]:
        """Wait until the relay's horizon and every replica's gtid_slave_pos reach the master's current position
        (read now; with ``exact``, read again at every poll and required equal: the load is stopped).

        ``resume`` (after a relay kill -9: the relay could not finish what it was sending): replica name -> its
        error log's size before the fault; a file/position replica stopped by MariaDB's mid-statement check since
        then gets START SLAVE, once, as docs/operations.md says, and ``fault`` records it."""
        began = time.monotonic()
        want_file, want_pos, want_gtid = self.master_position()
        while True:
            for r in self.replicas:
                if resume and r.name in resume and r.stopped_mid_statement(resume[r.name]):
                    del resume[r.name]
                    r.sandbox.execute("START SLAVE")
                    if fault is not None:
                        fault.resumed.append(r.name)
            if exact:
                want_file, want_pos, want_gtid = self.master_position()
            problems = []
            relay_status = None
            if self.relay.alive:
                with contextlib.suppress(OSError):
                    relay_status = self.relay.status()
            if relay_status is None:
                problems.append("relay not answering")
            else:
                (have, text), want = horizon(relay_status), position_key(want_file, want_pos)
                if have < want or (exact and have != want):
                    problems.append(f"relay at {text} < {want_file}:{want_pos} "
                                    f"(last_io_error {relay_status.get('last_io_error')})")
            for r in self.replicas:
                try:
                    st = r.status()
                except Exception as exc:  # noqa: BLE001 - a restarting server: not converged yet
                    problems.append(f"{r.name}: {type(exc).__name__}: {exc}")
                    continue
                if st.get("Last_SQL_Error"):
                    return False, time.monotonic() - began, f"{r.name}: SQL thread error: {st['Last_SQL_Error']}"
                if not covers(st["gtid_slave_pos"], want_gtid) or (
                        exact and gtid_seqs(st["gtid_slave_pos"]) != gtid_seqs(want_gtid)):
                    problems.append(f"{r.name}: gtid_slave_pos {st['gtid_slave_pos']} < {want_gtid}, IO "
                                    f"{st.get('Slave_IO_Running')} SQL {st.get('Slave_SQL_Running')}, "
                                    f"Last_IO_Error {st.get('Last_IO_Error')!r}")
            if not problems:
                return True, time.monotonic() - began, ""
            if time.monotonic() > began + timeout:
                return False, time.monotonic() - began, "; ".join(problems)
            time.sleep(0.2)

    # -- faults ------------------------------------------------------------------------------------------------
    def schedule(self):
        kinds = [k for k, w in FAULT_WEIGHTS.items() for _ in range(w)]
        while True:
            round_ = list(kinds)
            self.rng.shuffle(round_)
            yield from round_

    def inject(self, fault: Fault) -> None:
        """Inject one fault: ``fault.injected`` says whether it could be, ``fault.detail`` what it did."""
        rng, kind = self.rng, fault.kind
        special = {"upstream corrupt byte": self._corrupt, "relay PURGE": self._relay_purge,
                   "master PURGE": self._master_purge, **dict.fromkeys(REPLICA_FAULTS, self._replica_fault)}
        if kind in special:
            special[kind](fault)
            return
        if kind == "relay kill -9":
            down = rng.uniform(0, 2)
            self.relay.kill9()
            time.sleep(down)
            self.relay.start()
            fault.detail = f"down {down:.1f}s before the restart"
        elif kind == "relay SIGTERM":
            self.relay.stop()
            self.relay.start()
        elif kind == "upstream cut":
            reset = rng.random() < 0.5
            n = self.proxy.drop_connections(reset=reset)
            fault.detail = f"{n} connection(s) dropped{' with RST' if reset else ''}"
        elif kind == "upstream pause":
            seconds = rng.uniform(1, 6)
            self.proxy.pause()
            time.sleep(seconds)
            self.proxy.resume()
            fault.detail = f"paused {seconds:.1f}s"
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        fault.injected = True

    def _corrupt(self, fault: Fault) -> None:
        rng = self.rng
        deadline = time.monotonic() + 30
        while True:
            try:
                info = self.proxy.connection("current")
                offset = info.forwarded(SERVER_TO_CLIENT) + rng.randrange(64, 40_000)
                mask = 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
                self.proxy.corrupt(offset, mask, on=info.id)
                break
            except (FaultProxyError, ValueError):
                if time.monotonic() > deadline:
                    fault.detail = "the relay had no upstream connection to corrupt"
                    return
                time.sleep(0.1)
        while time.monotonic() < deadline:
            info = self.proxy.connection(info.id)
            if info.corruptions or not info.open:
                break
            time.sleep(0.05)
        fault.injected = bool(info.corruptions)
        fault.detail = (f"connection {info.id}: byte at stream offset {offset} XOR 0x{mask:02x}"
                        + ("" if info.corruptions else " (not reached: the connection ended first)"))

    def _replica_fault(self, fault: Fault) -> None:
        kind = fault.kind
        if kind == "direct replica kill -9":
            candidates = self.replicas_via("master")
        elif kind == "replica kill -9":
            candidates = [r for r in self.replicas_via("relay") if r.crash_safe]
        else:
            candidates = self.replicas_via("relay")
        if not candidates:
            fault.detail = "no replica of that kind"
            return
        r = self.rng.choice(candidates)
        fault.target = r.name
        if kind == "replica STOP/START SLAVE":
            r.sandbox.execute("STOP SLAVE")
            time.sleep(self.rng.uniform(0.2, 3))
        elif kind in ("replica kill -9", "direct replica kill -9"):
            r.sandbox.kill()
            time.sleep(self.rng.uniform(0, 2))
            r.sandbox.start()
        else:
            r.sandbox.stop()
            r.sandbox.start()
        r.sandbox.execute("START SLAVE")
        r.restarts += 1
        fault.injected = True

    def _oldest_needed_by(self, replicas: list[Replica]) -> str | None:
        """The oldest master file any of these replicas still needs: where its SQL thread is (after a crash it
        fetches again from there)."""
        needed = [st["Relay_Master_Log_File"] for st in map(Replica.status, replicas)
                  if st.get("Relay_Master_Log_File")]
        return min(needed, key=file_key) if needed else None

    def _purge_target(self, files: list[str], oldest_needed: str | None) -> str | None:
        if len(files) <= KEEP_FILES:
            return None
        target = files[-KEEP_FILES]
        if oldest_needed is not None and file_key(oldest_needed) < file_key(target):
            target = oldest_needed
        return target if file_key(target) > file_key(files[0]) else None

    def _purge_relay(self, target: str) -> str | None:
        """PURGE BINARY LOGS TO ``target`` on the relay: None, or the message of its refusal (1378)."""
        try:
            relay_sql(self.relay.listen_port, f"PURGE BINARY LOGS TO '{target}'")
        except pymysql.err.MySQLError as exc:
            if not exc.args or exc.args[0] != 1378:
                raise
            return exc.args[1]
        return None

    def _relay_purge(self, fault: Fault) -> None:
        files = self.relay.binlogs()
        target = self._purge_target(files, self._oldest_needed_by(self.replicas_via("relay")))
        fault.injected = True
        outcomes = self.relay_purges
        if target is None:
            fault.detail = f"nothing old enough to purge ({len(files)} files)"
            outcomes["nothing to purge"] += 1
            return
        notes = []
        if self.rng.random() < 0.5:
            # First with a stalled replica reading the oldest file: the relay must refuse, and delete nothing.
            held = fuzz.stalled_dump(fuzz.LiveTarget("127.0.0.1", self.relay.listen_port, REPL_USER, REPL_PASSWORD,
                                                     files), files[0], STALLED_DUMP_SERVER_ID)
            try:
                self._wait_for_dump(present=True)
                if self._purge_relay(target) is None:
                    notes.append("a stalled dump had already left the doomed files: purged")
                    outcomes["purged (stalled dump already past)"] += 1
                else:
                    outcomes["refused while a stalled dump read a doomed file (1378)"] += 1
                    notes.append("refused while a stalled dump read the oldest file (1378)")
                    now = set(self.relay.binlogs())
                    gone = [name for name in files if name not in now]  # (new files may have come: the load runs)
                    if gone:
                        raise AssertionError(f"PURGE was refused but files were deleted: {gone}")
            finally:
                held.close(reset=True)
            self._wait_for_dump(present=False)
        refused = self._purge_relay(target)
        if refused is not None:
            fault.detail = "; ".join(notes + [f"refused: {refused[:160]}"])
            outcomes["refused: a replica reads the file (1378)"] += 1
            return
        after = self.relay.binlogs()
        purged = sum(1 for name in files if name not in after)  # (files the load added meanwhile are not purges)
        fault.detail = "; ".join(notes + [f"TO '{target}': {purged} file(s) purged, {len(after)} left"])
        outcomes["purged"] += 1
        self.purged["relay"] += purged

    def _wait_for_dump(self, present: bool, timeout: float = 10.0) -> None:
        """Until the relay's /status lists (or no longer lists) the stalled dump."""
        deadline = time.monotonic() + timeout
        while any(rep.get("server_id") == STALLED_DUMP_SERVER_ID and rep.get("file")
                  for rep in self.relay.status().get("replicas", [])) != present:
            if time.monotonic() > deadline:
                raise AssertionError(f"the relay {'never listed' if present else 'still lists'} the dump of "
                                     f"server_id {STALLED_DUMP_SERVER_ID} after {timeout}s")
            time.sleep(0.05)

    def _master_purge(self, fault: Fault) -> None:
        files = self.master_binlogs()
        status = self.relay.status()
        needed = [status["master_log_file"]] if status.get("master_log_file") else []
        direct = self._oldest_needed_by(self.replicas_via("master"))
        needed += [direct] if direct else []
        oldest = min(needed, key=file_key) if needed else None
        # One more file of margin: a GTID lookup may start from the file before the one holding the position.
        if oldest is not None and oldest in files and files.index(oldest) > 0:
            oldest = files[files.index(oldest) - 1]
        target = self._purge_target(files, oldest)
        fault.injected = True
        if target is None:
            fault.detail = f"nothing old enough to purge ({len(files)} files)"
            return
        self.master.execute(f"PURGE BINARY LOGS TO '{target}'")
        purged = len(files) - len(self.master_binlogs())
        fault.detail = f"TO '{target}': {purged} file(s) purged"
        self.purged["master"] += purged

    def chaos(self) -> None:
        a = self.args
        end = time.monotonic() + a.minutes * 60
        kinds = self.schedule()
        number = 0
        while time.monotonic() < end or number < a.min_faults:  # --min-faults: on a slow machine too
            number += 1
            fault = Fault(number, next(kinds))
            log_offset = self.relay.log_path.stat().st_size
            # A relay kill -9 can cut a dump inside a statement (a graceful stop does not: no resume then).
            resume = ({r.name: r.log_size() for r in self.replicas if r.via == "relay" and r.use_gtid == "no"}
                      if fault.kind == "relay kill -9" else None)
            try:
                self.inject(fault)
            except Exception as exc:  # noqa: BLE001 - an injection that breaks is a failure to report
                fault.survived = False
                fault.failure = f"injection failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
                self.faults.append(fault)
                log(f"fault {number} {fault.kind}: INJECTION FAILED {exc}")
                break
            ok, seconds, detail = self.converge(timeout=CONVERGE_TIMEOUT, resume=resume, fault=fault)
            if fault.resumed:
                fault.detail += f"; START SLAVE on {', '.join(fault.resumed)} (MariaDB's mid-statement reconnect check)"
            fault.converge_s = round(seconds, 2)
            fault.survived = ok
            fault.relay_said, fault.relay_error = self.relay.upstream_ends(log_offset)
            if not ok:
                # The replicas' own [ERROR] lines first: the results file keeps the first 3,000 characters.
                fault.failure = (f"did not converge within {CONVERGE_TIMEOUT}s: {detail}"
                                 + "".join(f"\n{r.name}'s error log:\n" + "\n".join(errors)
                                           for r in self.replicas if (errors := r.errors_logged()))
                                 + "\nrelay log:\n" + self.relay.log_tail(15))
            self.faults.append(fault)
            self.files.check()
            self.master_binlogs()
            log(f"fault {number:3d} {fault.kind:26s} {fault.target:16s} injected={fault.injected} "
                f"survived={ok} in {seconds:5.1f}s {fault.detail[:90]}")
            if not ok:
                break  # the topology is broken: later faults would say nothing more
            time.sleep(self.rng.uniform(GAP_MIN, GAP_MAX))

    # -- comparison --------------------------------------------------------------------------------------------
    def compare_tables(self) -> dict:
        servers = {"master": self.master, **{r.name: r.sandbox for r in self.replicas}}
        tables = {name: sorted(row[0] for row in box.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'",
            (SCHEMA,))) for name, box in servers.items()}
        result = {"tables": [], "all_match": True, "table_sets_match": True}
        for name, theirs in tables.items():
            if theirs != tables["master"]:
                result["table_sets_match"] = result["all_match"] = False
                result.setdefault("table_set_differences", {})[name] = {"master": tables["master"], name: theirs}
        for table in tables["master"]:
            row = {"table": table, "servers": {}}
            for name, box in servers.items():
                try:
                    count = box.execute(f"SELECT COUNT(*) FROM {SCHEMA}.`{table}`")[0][0]
                    checksum = box.execute(f"CHECKSUM TABLE {SCHEMA}.`{table}`")[0][1]
                except pymysql.err.MySQLError as exc:
                    count, checksum = None, f"error: {exc}"
                row["servers"][name] = {"rows": count, "checksum": checksum}
            row["match"] = len({(v["rows"], v["checksum"]) for v in row["servers"].values()}) == 1
            result["all_match"] &= row["match"]
            result["tables"].append(row)
        return result

    # -- fuzzing -----------------------------------------------------------------------------------------------
    def fuzz_parser(self) -> dict:
        a = self.args
        paths = sorted(self.master.binlog_dir.glob("master-bin.[0-9]*"))
        corpus = corpus_dir()
        if (corpus / "manifest.json").is_file():
            paths += fuzz.corpus_binlog_paths(corpus)
        samples = fuzz.load_binlog_samples(paths)
        log(f"binlog parser fuzz: {a.fuzz_inputs} inputs from {len(samples)} files")
        out = fuzz.fuzz_binlog_parser(samples, a.fuzz_inputs, a.seed, progress=log).as_dict()
        out["master_files"] = sum(1 for s in samples if s.name.startswith(str(self.master.binlog_dir)))
        return out

    def fuzz_port(self) -> dict:
        a = self.args
        relay_replicas = self.replicas_via("relay")
        pid = self.relay.proc.pid
        fds_before = fd_count(pid)
        target = fuzz.LiveTarget("127.0.0.1", self.relay.listen_port, REPL_USER, REPL_PASSWORD, self.relay.binlogs())
        samples: dict[str, list[str]] = {r.name: [] for r in relay_replicas}

        def sample() -> None:  # the replicas through the relay keep replicating while the fuzzer runs
            for r in relay_replicas:
                with contextlib.suppress(Exception):
                    samples[r.name].append(r.status()["gtid_slave_pos"])

        self.load = Load(self.master, a.seed + 1, FUZZ_LOAD_RATE).start()
        sample()
        stop_watch = every(0.25, sample, "fuzz-watch")
        log(f"downstream fuzz: {a.fuzz_inputs} inputs against the live relay (pid {pid}, {fds_before} fds)")
        try:
            report = fuzz.fuzz_downstream(target, a.fuzz_inputs, a.seed, workers=FUZZ_WORKERS, progress=log)
        finally:
            stop_watch()
            sample()
            self.load.stop()
        out = report.as_dict()
        out["load_during_fuzz_transactions"] = self.load.total
        out["relay_pid_before"] = pid
        out["relay_alive_after"] = self.relay.alive and self.relay.proc.pid == pid
        out["replica_gtid_advances"] = {name: sum(1 for x, y in zip(seq, seq[1:]) if gtid_seqs(y) != gtid_seqs(x))
                                        for name, seq in samples.items()}
        out["replica_gtid_samples"] = {name: len(seq) for name, seq in samples.items()}
        # Open descriptors back to where they were (connections drain asynchronously: give them a moment).
        deadline = time.monotonic() + 30
        fds_after = fd_count(pid)
        while None not in (fds_before, fds_after) and fds_after > fds_before and time.monotonic() < deadline:
            time.sleep(0.5)
            fds_after = fd_count(pid)
        out["relay_fds_before"] = fds_before
        out["relay_fds_after"] = fds_after
        out["fd_leak"] = fds_before is None or fds_after is None or fds_after > fds_before
        return out

    # -- the whole run -----------------------------------------------------------------------------------------
    def run(self) -> dict:
        a = self.args
        began = time.monotonic()
        self.setup()
        chaos_began = time.monotonic()
        self.chaos()
        chaos_s = time.monotonic() - chaos_began
        load = self.load.stop()
        ok, seconds, detail = self.converge(timeout=CONVERGE_TIMEOUT * 2, exact=True)
        self.master_binlogs()
        final_file, final_pos, final_gtid = self.master_position()
        self.monitor.observe()
        self.files.check(up_to=(final_file, final_pos) if ok else None)
        tables_after_chaos = self.compare_tables()
        log(f"after the chaos: converged={ok} in {seconds:.1f}s; tables match={tables_after_chaos['all_match']}")
        r = {
            "seed": a.seed, "minutes": a.minutes, "chaos_seconds": round(chaos_s, 1),
            "replicas": [{"name": x.name, "via": x.via, "use_gtid": x.use_gtid, "restarts": x.restarts}
                         for x in self.replicas],
            "load": {
                "seconds": round(load.seconds, 1), "transactions": load.total,
                "transactions_per_s": round(load.total / load.seconds, 1) if load.seconds else 0,
                "by_kind": dict(load.transactions), "rows": load.rows, "deadlocks_retried": load.deadlocks,
                "errors": load.errors[:10], "error_count": len(load.errors),
                "binlog_bytes": sum(self.binlog_sizes.values()), "binlog_files": len(self.binlog_sizes),
                "files_rotated": max(0, len(self.binlog_sizes) - 1), "final_position": f"{final_file}:{final_pos}",
                "final_gtid": final_gtid,
            },
            "faults": [f.__dict__ for f in self.faults],
            "final_convergence": convergence(ok, seconds, detail),
            "invariants": {
                "horizon_checks": self.monitor.checks, "horizon_violations": self.monitor.violations,
                "relay_restarts_seen": self.monitor.restarts_seen, **self.files.figures(),
                "files_not_compared_purged_on_master": sorted(self.files.skipped_purged, key=file_key),
            },
            "tables_after_chaos": tables_after_chaos,
        }
        if a.fuzz_inputs > 0 and ok:
            r["fuzz_parser"] = self.fuzz_parser()
            r["fuzz_port"] = self.fuzz_port()
            ok2, seconds2, detail2 = self.converge(timeout=CONVERGE_TIMEOUT * 2, exact=True)
            r["convergence_after_fuzz"] = convergence(ok2, seconds2, detail2)
            self.files.check(up_to=self.master_position()[:2] if ok2 else None)
            r["invariants"].update(self.files.figures())
            r["tables_final"] = self.compare_tables()
        self.stop_monitor()
        r["invariants"]["horizon_checks"] = self.monitor.checks  # (the violations: the monitor's own list)
        r["relay_purges"] = dict(self.relay_purges)
        r["relay_files_purged"], r["master_files_purged"] = self.purged["relay"], self.purged["master"]
        levels: collections.Counter = collections.Counter()
        error_events: collections.Counter = collections.Counter()
        for entry in json_log(self.relay.log_path):
            levels[str(entry.get("level"))] += 1
            if entry.get("level") in ("error", "critical"):
                error_events[str(entry.get("event"))] += 1
        r["relay_log"] = {"entries": sum(levels.values()), "levels": dict(levels), "error_events": dict(error_events)}
        r["wall_seconds"] = round(time.monotonic() - began, 1)
        r["verdict"] = verdict(r)
        return r


def verdict(r: dict) -> dict:
    """Every check of the run, named, and whether the whole run passed."""
    faults = r["faults"]
    inv = r["invariants"]
    checks = {
        "every fault survived": bool(faults) and all(f["survived"] for f in faults),
        "final convergence": r["final_convergence"]["ok"],
        "horizon never moved back": not inv["horizon_violations"],
        "relay files equal the master's": not inv["file_mismatches"] and inv["file_checks"] > 0,
        "every table matches after the chaos": r["tables_after_chaos"]["all_match"],
        "every corruption that reached the relay was detected": all(
            f["relay_said"] for f in faults if f["kind"] == "upstream corrupt byte" and f["injected"]),
        "no load errors": r["load"]["error_count"] == 0,
    }
    if "fuzz_parser" in r:
        p, d = r["fuzz_parser"], r["fuzz_port"]
        checks["binlog parser fuzz: no crash, no hang"] = p["crashes"] == 0 and p["hangs"] == 0
        checks["downstream fuzz: no failure"] = d["failures"] == 0 and not d["worker_errors"]
        checks["downstream fuzz: relay alive"] = d["relay_alive_after"]
        checks["downstream fuzz: no fd leak"] = not d["fd_leak"]
        checks["downstream fuzz: replicas kept replicating"] = all(v > 0 for v in d["replica_gtid_advances"].values())
        checks["convergence after fuzzing"] = r["convergence_after_fuzz"]["ok"]
        checks["every table matches at the end"] = r["tables_final"]["all_match"]
    return {"checks": checks, "passed": all(checks.values())}


# -- the results file --------------------------------------------------------------------------------------------

def _table(header: list[str], rows) -> list[str]:
    """A markdown table, then a blank line; a row is a list of cells or a line already written."""
    return [md_row(*header), "|" + "---|" * len(header),
            *(row if isinstance(row, str) else md_row(*row) for row in rows), ""]


def _yes(ok, no: str = "**NO**") -> str:
    return "yes" if ok else no


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return "`" + text.replace("|", "/").replace("`", "'").replace("\n", " ") + "`" if text else ""


def _counts(counts: dict, by_count: bool = False) -> list[list]:
    """Rows of (name, count with thousands separators), sorted by name or by count (highest first)."""
    items = sorted(counts.items(), key=lambda kv: -kv[1]) if by_count else sorted(counts.items())
    return [[k, f"{v:,}"] for k, v in items]


def markdown(r: dict, argv: list[str], machine: dict) -> str:
    minutes = r["chaos_seconds"] / 60
    what = (f"one seeded chaos run (seed {r['seed']}, {minutes:.1f} minutes of chaos): a soak is not repeated, and "
            "its checks are pass/fail against a direct replica of the same master in the same run, not timings "
            "against a peer")
    ld, faults = r["load"], r["faults"]
    L = [
        "# Chaos soak and fuzzing", "", *header_block(__file__, argv, machine, runs=1, what=what),
        "The design: the docstring of `benchmarks/soak.py`.", "",
        f"**Verdict: {'PASSED' if r['verdict']['passed'] else 'FAILED'}**: seed {r['seed']}, {minutes:.1f} minutes "
        f"of chaos, {len(faults)} faults, wall time {r['wall_seconds'] / 60:.1f} minutes.", "",
        *_table(["check", "result"], [[name, _yes(ok)] for name, ok in r["verdict"]["checks"].items()]),
        *machine_section(machine),
        "## Topology", "",
        "MariaDB master (binlog_format ROW, GTIDs, max_binlog_size 1 MB) → fault proxy → `relayproxy run --listen` "
        "(`--gtid-mode mariadb`, default sync mode) → replicas; plus one replica directly on the master as the "
        "control. Replicas: relay_log_recovery=ON, gtid_slave_pos in InnoDB, MASTER_CONNECT_RETRY=1.", "",
        *_table(["replica", "source", "MASTER_USE_GTID", "restarts during the run"],
                [[x["name"], x["via"], x["use_gtid"], x["restarts"]] for x in r["replicas"]]),
        "## Load held", "",
        f"- {ld['transactions']:,} transactions in {ld['seconds']:.0f} s of chaos ({ld['transactions_per_s']} "
        f"transactions/s), {ld['rows']:,} rows written; deadlocks retried: {ld['deadlocks_retried']}; "
        f"load errors: {ld['error_count']}",
        "- by kind: " + ", ".join(f"{k} {v:,}" for k, v in sorted(ld["by_kind"].items())),
        f"- master binlog: {ld['binlog_bytes'] / 1e6:.1f} MB in {ld['binlog_files']} files "
        f"({ld['files_rotated']} rotations), final position {ld['final_position']}, GTID {ld['final_gtid']}",
        f"- files purged: {r.get('relay_files_purged', 0)} on the relay, {r.get('master_files_purged', 0)} on the "
        f"master; relay PURGE outcomes: {r['relay_purges'] or 'none'}", "",
        "## Faults injected and survived", "",
        "Survived = afterwards the relay's horizon reached the master's position and every replica's gtid_slave_pos "
        "reached the master's GTID (positions read right after the fault) within the convergence timeout.", "",
    ]
    by_kind = {kind: [f for f in faults if f["kind"] == kind] for kind in FAULT_WEIGHTS}
    rows: list = []
    ends: list = []
    for kind, mine in by_kind.items():
        times = [f["converge_s"] for f in mine if f["converge_s"] is not None]
        injected = [f for f in mine if f["injected"]]
        said = [f for f in injected if f["relay_said"]]
        if mine:
            rows.append([kind, len(mine), len(injected), sum(bool(f["survived"]) for f in mine),
                         f"{statistics.median(times):.1f} / {max(times):.1f}" if times else "-"])
        if said:
            kinds = sum((collections.Counter(f["relay_said"]) for f in said), collections.Counter())
            ends.append([kind, f"{len(said)} of {len(injected)}",
                         ", ".join(f"{k} ({v})" for k, v in kinds.most_common()),
                         re.sub(r"\d+", "N", said[0]["relay_error"] or "")[:110]])  # digits as N
    tot = [sum(row[i] for row in rows) for i in (1, 2, 3)]
    rows.append(f"| **all** | **{tot[0]}** | **{tot[1]}** | **{tot[2]}** | |")
    L += [*_table(["fault", "attempted", "injected", "survived", "convergence median / max (s)"], rows),
          "How the relay's upstream connection ended after each kind of fault (the `upstream connection ended` "
          "entries of its log between the fault and the convergence, by kind):", "",
          *_table(["fault", "faults followed by a logged upstream end", "kinds logged", "first message (digits as N)"],
                  ends)]
    resumed = [f for f in faults if f.get("resumed")]
    L += [f"File/position replicas given START SLAVE after MariaDB's mid-statement reconnect check (relay kill -9 "
          f"only; docs/operations.md, \"Recovery\"): {len(resumed)}"
          + (" (" + ", ".join(f"fault {f['number']}: {', '.join(f['resumed'])}" for f in resumed) + ")" if resumed
             else "") + ".", ""]
    levels = r["relay_log"]
    L += [f"Relay log over the whole run: {levels['entries']:,} entries, by level: {levels['levels']}; "
          f"error-level events: {levels['error_events'] or 'none'}.", ""]
    for f in faults:
        if not f["survived"]:
            L += [f"**Fault {f['number']} ({f['kind']}, {f['target']}) not survived**: ", "",
                  "```", str(f["failure"])[:3000], "```", ""]
    inv, fc = r["invariants"], r["final_convergence"]
    not_compared = inv["files_not_compared_purged_on_master"]
    L += [
        "## Invariants checked during the run", "",
        f"- relay horizon never moved backwards: {inv['horizon_checks']:,} /status samples across "
        f"{inv['relay_restarts_seen']} relay restarts, {len(inv['horizon_violations'])} violations",
        f"- relay files equal the master's byte for byte (FDE in-use flag masked): {inv['file_checks']} file "
        f"comparisons, {inv['file_bytes_compared'] / 1e6:.1f} MB, {len(inv['file_mismatches'])} mismatches"
        + (f"; not comparable (purged on the master first): {len(not_compared)}" if not_compared else ""),
        *(f"  - {v}" for v in inv["horizon_violations"][:5] + inv["file_mismatches"][:5]),
        f"- after the chaos, load stopped: converged exactly (relay horizon = master position, every gtid_slave_pos "
        f"= gtid_binlog_pos) in {fc['seconds']} s: {_yes(fc['ok'], 'NO: ' + fc['detail'])}", "",
    ]
    for key, title in (("tables_after_chaos", "Data compared after the chaos"),
                       ("tables_final", "Data compared at the end (after fuzzing)")):
        if key in r:
            t = r[key]
            names = list(t["tables"][0]["servers"]) if t["tables"] else []
            L += [f"## {title}", "",
                  *_table(["table", *(f"{n}: rows / checksum" for n in names), "match"],
                          [[row["table"], *(f"{v['rows']} / {v['checksum']}" for v in row["servers"].values()),
                            _yes(row["match"])] for row in t["tables"]]),
                  f"Same set of tables on every server: {_yes(t['table_sets_match'], 'NO')}.", ""]
    if "fuzz_parser" in r:
        L += fuzz_markdown(r)
    L += ["## Fault log", "",
          *_table(["#", "fault", "target", "detail", "survived", "converged in (s)"],
                  [[f["number"], f["kind"], f["target"], f["detail"][:110].replace("|", "/"), _yes(f["survived"]),
                    f["converge_s"]] for f in faults])]
    return "\n".join(L)


def fuzz_markdown(r: dict) -> list[str]:
    """The results of the two fuzzers (markdown lines)."""
    p, d = r["fuzz_parser"], r["fuzz_port"]
    L = [
        "## Fuzzing the binlog parser", "",
        f"{p['inputs']:,} inputs in {p['seconds']} s ({p['inputs_per_s']:,}/s), mutated from {p['events']:,} real "
        f"events of {p['files']} files ({p['master_files']} of them this run's master binlogs, the rest the "
        f"corpus): {p['crashes']} crashes, {p['hangs']} hangs (cap 2 s an input; slowest {p['slowest_input_ms']} "
        f"ms).", "",
        *_table(["target", "inputs"], [[k, f"{v:,}"] for k, v in p["by_target"].items()]),
        *_table(["outcome", "count"], _counts(p["outcomes"])),
        "## Fuzzing the relay's MySQL port (live relay of this run)", "",
        f"{d['inputs']:,} inputs in {d['seconds']} s ({d['inputs_per_s']:,}/s) over {d['connections']:,} TCP "
        f"connections ({d['logins']:,} logged in), {FUZZ_WORKERS} at a time, while a light load "
        f"({d['load_during_fuzz_transactions']:,} transactions) replicated through the relay.", "",
        f"- failures (no answer within the deadline, a close inside a packet, an internal error): {d['failures']}",
        f"- ERR packets returned: {d['errors_returned']:,}; connections closed by the relay: "
        f"{d['connections_closed_by_server']:,}",
    ]
    prefix = "closed by the relay after "
    closes = {k.removeprefix(prefix): v for k, v in d["replies"].items() if k.startswith(prefix)}
    if closes:
        L.append("- logged-in connections the relay closed, by the input and answer just before the close: "
                 + ", ".join(f"{k} ({v})" for k, v in _counts(closes, by_count=True)))
    examples = {str(k): v for k, v in d["error_examples"].items()}
    errors = []
    for code, count in d["error_codes"].items():
        message, what = examples.get(str(code), ("", ""))
        errors.append([code, f"{count:,}", _cell(message), _cell(what[:100])])
    L += [
        f"- connections closed right after a successful answer: {d['closed_after_success']}"
        + (f" (e.g. `{d['closed_after_success_examples'][0][:150]}`)" if d["closed_after_success"] else ""),
        f"- relay process alive afterwards, same pid: {_yes(d['relay_alive_after'], 'NO')}; open fds "
        f"before {d['relay_fds_before']}, after {d['relay_fds_after']}",
        "- replicas through the relay kept replicating during the fuzzing (gtid_slave_pos changes seen, one "
        "sample every 0.25 s): " + ", ".join(f"{k} {v}" for k, v in d["replica_gtid_advances"].items()), "",
        *_table(["input kind", "count"], _counts(d["kinds"], by_count=True)),
        *_table(["ERR code", "count", "first message", "the input that got it"], errors),
        *(f"- failure: `{f['input'][:200]}`: {f['detail'][:300]}" for f in d["failure_details"]),
        f"After fuzzing, load stopped: converged exactly in {r['convergence_after_fuzz']['seconds']} s: "
        f"{_yes(r['convergence_after_fuzz']['ok'], 'NO')}.", "",
    ]
    return L


# -- the command -------------------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="minutes of chaos (default 10)")
    p.add_argument("--min-faults", type=int, default=0, help="go on past --minutes until this many faults were "
                   "injected (the seeded schedule then gives the same faults however slow the machine)")
    p.add_argument("--seed", type=int, default=None, help="seed of every random choice (default: random, printed)")
    p.add_argument("--fuzz-inputs", type=int, default=100_000, help="inputs for each fuzzer (0: no fuzzing)")
    p.add_argument("--output", type=Path, default=None, help="write the markdown results here")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--workdir", type=Path, default=None, help="where the servers live (default: a temp dir)")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    if args.minutes <= 0:
        p.error("--minutes must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    log(f"seed {args.seed}")
    base = args.workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="soak-", dir=base))
    soak = Soak(args, work)
    try:
        report = soak.run()
    except BaseException:
        log(f"soak aborted; servers' files kept in {work}")
        raise
    finally:
        soak.teardown()
    if report["verdict"]["passed"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"servers' and relay's files kept in {work} (the run failed)")
    report["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report["machine"] = machine_info(server=True)
    if args.output:
        write_results(args.output, markdown(report, argv, report["machine"]), log)
    if args.json:
        print(json.dumps(report, default=str))
    passed = report["verdict"]["passed"]
    log("PASSED" if passed else f"FAILED: {[k for k, v in report['verdict']['checks'].items() if not v]}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
