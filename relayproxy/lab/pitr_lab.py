"""The PITR workbench (tests/scenarios/test_pitr.py, benchmarks/pitr.py): a mixed OLTP load with marker rows and a
"disaster" statement on a real master, the reference a DBA trusts (a restored backup replicating straight from the
master with START SLAVE UNTIL master_gtid_pos), commit times read by mariadb-binlog (not by relayproxy), and the
comparison of two instances table by table."""

from __future__ import annotations

import calendar
import random
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..downstream.sql.replication_parser import ChangeMaster, render_change_master
from .harness import user_tables
from .sandbox import MariaDBSandbox, find_binary

SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS shop",
    "CREATE TABLE IF NOT EXISTS shop.orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer INT NOT NULL, "
    "amount DECIMAL(12,2) NOT NULL, note VARCHAR(255), payload MEDIUMBLOB, KEY (customer)) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS shop.accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS shop.markers (seq BIGINT PRIMARY KEY, writer INT NOT NULL, phase VARCHAR(16) NOT NULL, "
    "at DATETIME(6) NOT NULL) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS shop.victim (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64)) ENGINE=InnoDB",
]
ACCOUNTS = 200


def create_schema(master: MariaDBSandbox) -> None:
    for statement in SCHEMA:
        master.execute(statement)
    master.execute("INSERT IGNORE INTO shop.accounts (id, balance) VALUES "
                   + ",".join(f"({i}, 1000)" for i in range(ACCOUNTS)))
    master.execute("INSERT INTO shop.victim (v) VALUES " + ",".join(f"('row {i}')" for i in range(100)))


class MixedLoad:
    """Writers in threads committing a mix: single-row inserts, multi-statement transfers between accounts, order
    updates and deletes, a large order (``big_every``: a 64-256 KB blob) now and then, and a marker row per
    transaction group that records the writer, a sequence number and the phase (so an instance's markers say
    exactly which of the master's commits it holds). ``limit``: commits per writer; ``stop()`` ends it early."""

    def __init__(self, master: MariaDBSandbox, *, writers: int = 2, limit: int = 1_000_000, phase: str = "load",
                 big_every: int = 50, seed: int = 1, pause: float = 0.0):
        self.master, self.writers, self.limit, self.phase = master, writers, limit, phase
        self.big_every, self.seed, self.pause = big_every, seed, pause
        self.commits = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(writers)]
        self._seq_base = int(time.time() * 1000) % 1_000_000 * 1_000_000

    def __enter__(self) -> "MixedLoad":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_commits(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.commits < n:
            if self.errors:
                raise AssertionError(f"load failed: {self.errors[0]!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"load made {self.commits} commits in {timeout} s, wanted {n}")
            time.sleep(0.01)

    def stop(self) -> int:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        if self.errors:
            raise AssertionError(f"load failed: {self.errors[0]!r}")
        return self.commits

    def _run(self, writer: int) -> None:
        rng = random.Random(self.seed * 1000 + writer)
        try:
            conn = self.master.connect()
            cur = conn.cursor()
            n = 0
            while not self._stop.is_set() and n < self.limit:
                n += 1
                seq = self._seq_base + writer * 100_000_000 + n
                kind = rng.random()
                cur.execute("BEGIN")
                if n % self.big_every == 0:
                    cur.execute("INSERT INTO shop.orders (customer, amount, note, payload) VALUES (%s, %s, %s, %s)",
                                (rng.randrange(ACCOUNTS), rng.randrange(1, 10**6) / 100, "big",
                                 rng.randbytes(rng.randrange(64 << 10, 256 << 10))))
                elif kind < 0.45:
                    cur.execute("INSERT INTO shop.orders (customer, amount, note) VALUES (%s, %s, %s)",
                                (rng.randrange(ACCOUNTS), rng.randrange(1, 10**6) / 100, f"w{writer} n{n}"))
                elif kind < 0.8:
                    a, b = rng.sample(range(ACCOUNTS), 2)
                    amount = rng.randrange(1, 50)
                    cur.execute("UPDATE shop.accounts SET balance = balance - %s WHERE id = %s", (amount, a))
                    cur.execute("UPDATE shop.accounts SET balance = balance + %s WHERE id = %s", (amount, b))
                elif kind < 0.95:
                    cur.execute("UPDATE shop.orders SET amount = amount + 1, note = CONCAT('u', id) WHERE customer = %s "
                                "ORDER BY id DESC LIMIT 3", (rng.randrange(ACCOUNTS),))
                else:
                    cur.execute("DELETE FROM shop.orders WHERE customer = %s ORDER BY id LIMIT 1",
                                (rng.randrange(ACCOUNTS),))
                cur.execute("INSERT INTO shop.markers (seq, writer, phase, at) VALUES (%s, %s, %s, NOW(6))",
                            (seq, writer, self.phase))
                cur.execute("COMMIT")
                with self._lock:
                    self.commits += 1
                if self.pause:
                    time.sleep(self.pause)
            conn.close()
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)


def disaster(master: MariaDBSandbox) -> str:
    """The mistake a PITR undoes: ``DROP TABLE shop.victim``; its GTID (what --before-gtid names)."""
    conn = master.connect()
    try:
        cur = conn.cursor()
        cur.execute("DROP TABLE shop.victim")
        cur.execute("SELECT @@last_gtid")
        return str(cur.fetchone()[0])
    finally:
        conn.close()


def gtid_before(gtid: str) -> str:
    """The GTID position just before ``gtid`` in its domain (one server, gtid_strict_mode)."""
    domain, server, seq = (int(x) for x in gtid.split("-"))
    return f"{domain}-{server}-{seq - 1}"


# -- the reference -------------------------------------------------------------------------------------------------

def start_reference(backup_dir: Path, sandbox: MariaDBSandbox, master: MariaDBSandbox, until: str,
                    *, user: str = "repl", password: str = "replpw") -> MariaDBSandbox:
    """A restored backup replicating straight from the master, by GTID from the backup's position, with START SLAVE
    UNTIL master_gtid_pos = ``until`` (the last GTID to apply): what a DBA would do without relayproxy."""
    from .backup import restore_backup
    from ..commands.pitr_plan import read_backup_info

    info = read_backup_info(backup_dir)
    ref = restore_backup(backup_dir, sandbox)
    ref.execute(f"SET GLOBAL gtid_slave_pos = '{info.gtid}'")
    ref.execute(render_change_master(ChangeMaster.for_server("mariadb", host="127.0.0.1", port=master.port, user=user,
                                                             password=password, gtid=True)))
    ref.execute(f"START SLAVE UNTIL master_gtid_pos = '{until}'")
    return ref


def wait_stopped_at(server: MariaDBSandbox, position: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pos = str(server.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0])
        status = server.execute("SHOW SLAVE STATUS")
        if pos == position:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{server.basedir.name} at {pos!r}, wanted {position!r}; status {status}")
        time.sleep(0.1)


# -- comparing -----------------------------------------------------------------------------------------------------

def fingerprint(server: MariaDBSandbox) -> dict[str, tuple]:
    """Per user table (CHECKSUM TABLE, rows); and the markers: (count, max seq per writer and phase)."""
    out: dict[str, tuple] = {}
    for table in user_tables(server):
        out[table] = (server.execute(f"CHECKSUM TABLE {table}")[0][1],
                      server.execute(f"SELECT COUNT(*) FROM {table}")[0][0])
    if "shop.markers" in out:
        out["markers"] = tuple(server.execute("SELECT writer, phase, COUNT(*), MAX(seq) FROM shop.markers "
                                              "GROUP BY writer, phase ORDER BY writer, phase"))
    return out


# -- commit times, as mariadb-binlog prints them -------------------------------------------------------------------

_HEADER = re.compile(r"^#(\d{6})\s+(\d{1,2}:\d{2}:\d{2}) server id \d+\s+end_log_pos (\d+)[^\t]*\t(.*)$")
_GTID = re.compile(r"^GTID (\d+-\d+-\d+)( ddl| trans)?")


@dataclass(frozen=True)
class Committed:
    gtid: str
    commit_second: int  # UTC seconds since the epoch, from the header of the event that ends the transaction
    end: int  # end_log_pos of that event
    file: str


def commit_times(binlog_files: list[Path]) -> list[Committed]:
    """Every transaction of the files in binlog order: its GTID and the header time of the event that ends it (the
    Xid, the COMMIT query, or the DDL query itself), parsed from ``mariadb-binlog`` run in UTC: an oracle that shares
    no code with relayproxy's index."""
    tool = find_binary("mariadb-binlog", "mysqlbinlog")
    out: list[Committed] = []
    for path in binlog_files:
        text = subprocess.run([tool, "--base64-output=never", str(path)], capture_output=True, text=True,
                              check=True, env={"TZ": "UTC", "PATH": "/usr/bin:/bin"}).stdout
        gtid, ddl, last = None, False, None
        for line in text.splitlines():
            m = _HEADER.match(line)
            if m:
                last = m
                g = _GTID.match(m.group(4))
                if g:
                    gtid, ddl = g.group(1), g.group(2) == " ddl"
                elif gtid is not None and ddl and m.group(4).startswith("Query"):
                    out.append(_committed(gtid, m, path))
                    gtid = None
                continue
            if gtid is not None and not ddl and last is not None and line.startswith("COMMIT"):
                out.append(_committed(gtid, last, path))
                gtid = None
    return out


def _committed(gtid: str, header: re.Match, path: Path) -> Committed:
    day, clock, end = header.group(1), header.group(2), int(header.group(3))
    return Committed(gtid, calendar.timegm(time.strptime(f"{day} {clock}", "%y%m%d %H:%M:%S")), end, path.name)


def busiest_second(committed: list[Committed], after_gtid: str) -> int:
    """The second holding the most commits after ``after_gtid`` (for a --before-time inside a busy second)."""
    seen = False
    counts: dict[int, int] = {}
    for c in committed:
        if seen:
            counts[c.commit_second] = counts.get(c.commit_second, 0) + 1
        seen = seen or c.gtid == after_gtid
    return max(counts, key=lambda s: (counts[s], s))


def last_before(committed: list[Committed], micros: int) -> str:
    """The last GTID applied by a stop before time T (µs): everything before the first transaction, in binlog order,
    recorded at or after T (a transaction recorded at second S counts as committed at S.000000)."""
    previous = None
    for c in committed:
        if c.commit_second * 1_000_000 >= micros:
            break
        previous = c.gtid
    assert previous is not None
    return previous
