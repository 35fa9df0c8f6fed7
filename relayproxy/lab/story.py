"""The master-crash-mid-transaction story: which replica an HA controller may promote, direct or through the relay.

A MariaDB master, relayproxy with a replica through it and a replica connected directly; a large transaction is
half sent when the master is killed.

Topology (everything on 127.0.0.1, in one working directory)::

    master M ──P1── relayproxy R ── replica T ("through the relay")
             └─P2── replica D ("direct")

P1 and P2 are fault-injecting forwarders (`relayproxy.lab.faultproxy`). They make the crash deterministic: both links
are held right after the same event in the middle of the big transaction, the master is killed with SIGKILL, and
the links then drop, as a dead master's connections do. An HA controller's usual rule is "promote a replica once
`Read_Master_Log_Pos == Exec_Master_Log_Pos`" (it has applied everything it received). The direct replica received
half a transaction it can never finish, so that rule never fires for it; relayproxy advertises and sends only
complete transactions, so the replica through it is at rest at the end of the last complete transaction.

`CrashStory` builds the topology and runs the steps; `run_crash_story` runs the whole story and returns a
`StoryResult`. `relayproxy demo` and tests/scenarios/test_scenario_master_crash.py both use it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from ..binlog import constants as C
from ..downstream.sql.replication_parser import ChangeMaster, render_change_master
from ..log import get_logger
from .faultproxy import ThreadedFaultProxy
from .packetwatch import EventLocation, MysqlStreamWatcher
from .relayprocess import RelayProcess
from .sandbox import MariaDBSandbox

log = get_logger(__name__)

REPL_USER = "repl"
REPL_PASSWORD = "replpw"
ADMIN_USER = "ha"  # the account an HA tool repoints the relay with (admin = true)
ADMIN_PASSWORD = "hapw"
SCHEMA = "demo"
# Bytes of payload per row of the big transaction: each row becomes its own WRITE_ROWS event of about this size.
BIG_ROW_BYTES = 4000
# The SQL thread's state once it has applied everything it received.
IDLE_SQL_STATE = "Slave has read all relay log; waiting for more updates"
# How many polls in a row the HA rule must hold before it counts (one lucky poll is not a stable state).
STABLE_POLLS = 3

_HEARTBEATS = (C.HEARTBEAT_LOG_EVENT, C.HEARTBEAT_LOG_EVENT_V2)


class StoryError(RuntimeError):
    """A step of the story could not be done (a server, the relay or a replica misbehaved); the message says which."""


# -- what the story observes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaState:
    """The fields of SHOW SLAVE STATUS an HA controller looks at (None: the replica did not answer)."""

    master_log_file: str | None
    read_master_log_pos: int
    relay_master_log_file: str | None
    exec_master_log_pos: int
    io_running: str
    sql_running: str
    sql_state: str
    last_io_error: str = ""
    last_sql_error: str = ""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ReplicaState:
        return cls(
            master_log_file=row.get("Master_Log_File") or None,
            read_master_log_pos=int(row.get("Read_Master_Log_Pos") or 0),
            relay_master_log_file=row.get("Relay_Master_Log_File") or None,
            exec_master_log_pos=int(row.get("Exec_Master_Log_Pos") or 0),
            io_running=str(row.get("Slave_IO_Running") or ""),
            sql_running=str(row.get("Slave_SQL_Running") or ""),
            sql_state=str(row.get("Slave_SQL_Running_State") or ""),
            last_io_error=str(row.get("Last_IO_Error") or ""),
            last_sql_error=str(row.get("Last_SQL_Error") or ""),
        )

    @property
    def read(self) -> tuple[str | None, int]:
        return (self.master_log_file, self.read_master_log_pos)

    @property
    def executed(self) -> tuple[str | None, int]:
        return (self.relay_master_log_file, self.exec_master_log_pos)

    @property
    def read_equals_exec(self) -> bool:
        return self.master_log_file is not None and self.read == self.executed

    @property
    def ha_may_switch(self) -> bool:
        """The HA rule: everything received has been applied and the SQL thread is idle, without error."""
        return self.read_equals_exec and self.sql_running == "Yes" and self.sql_state == IDLE_SQL_STATE

    def brief(self) -> str:
        """'000002:8518649/125420': file, Read_Master_Log_Pos / Exec_Master_Log_Pos (file again if it differs)."""
        same_file = self.relay_master_log_file == self.master_log_file
        exec_file = "" if same_file else f"{_short(self.relay_master_log_file)}:"
        return f"{_short(self.master_log_file)}:{self.read_master_log_pos}/{exec_file}{self.exec_master_log_pos}"


@dataclass(frozen=True)
class Snapshot:
    """One look at the whole topology (None where a piece did not answer, e.g. the master after the kill)."""

    elapsed: float
    phase: str  # what the story is doing: "setup", "workload", "catch-up", "big trx", "kill+2.5s" (after the kill)
    master: tuple[str, int] | None
    relay: dict[str, Any] | None
    direct: ReplicaState | None
    through_relay: ReplicaState | None
    transactions: int

    def line(self) -> str:
        """The live view's one line."""
        master = f"{_short(self.master[0])}:{self.master[1]}" if self.master else "down"
        if self.relay is not None:
            relay = (
                f"{_short(self.relay['master_log_file'])}:{self.relay['read_master_log_pos']} "
                f"{self.relay.get('retrieved_gtid_set') or '-'}"
            )
        else:
            relay = "?"
        direct = self.direct.brief() if self.direct else "?"
        through = self.through_relay.brief() if self.through_relay else "?"
        return (
            f"{self.elapsed:5.1f}s {self.phase:<10} master {master}  relay {relay}  direct {direct}  "
            f"via relay {through}  {self.transactions} trx"
        )


@dataclass
class ReplicaOutcome:
    """How one replica came out of the crash: its state when the master died and at the end of the measurement."""

    name: str
    at_kill: ReplicaState
    final: ReplicaState
    seconds_to_switch: float | None  # None: the HA rule never held within `cap`
    cap: float

    @property
    def stuck(self) -> bool:
        return self.seconds_to_switch is None

    def short_verdict(self) -> str:
        return f"never within {self.cap:.0f} s" if self.stuck else f"{self.seconds_to_switch:.2f} s after the kill"

    def verdict(self) -> str:
        if self.stuck:
            return (
                f"never within {self.cap:.0f} s; stuck at Read {self.final.read_master_log_pos} / "
                f"Exec {self.final.exec_master_log_pos}"
            )
        return f"{self.seconds_to_switch:.2f} s after the kill"


@dataclass
class StoryResult:
    """Everything the story measured; positions are (master file, byte offset) in the master's coordinates."""

    workdir: Path
    mariadb_version: str
    workload_transactions: int
    workload_seconds: float
    last_complete: tuple[str, int]  # the master's end position before the big transaction
    gtid_before: str  # master's @@gtid_binlog_pos then
    checksums_before: dict[str, int | None]  # CHECKSUM TABLE on the master then
    big_transaction_end: tuple[str, int]
    big_transaction_gtid: str
    big_transaction_bytes: int
    cut_master_pos: int  # both links were held right after the event ending here (inside the big transaction)
    direct: ReplicaOutcome
    through_relay: ReplicaOutcome
    relay_status: dict[str, Any]  # the relay's /status at the end of the measurement
    relay_at_kill: dict[str, Any]  # its /status just before the kill: it had received the first half by then
    checksums_through_relay: dict[str, int | None]  # CHECKSUM TABLE on the replica through the relay then
    timeline: list[Snapshot] = field(default_factory=list)

    @property
    def relay_position(self) -> tuple[str, int]:
        return (self.relay_status["master_log_file"], int(self.relay_status["read_master_log_pos"]))

    def summary_lines(self) -> list[str]:
        """The side-by-side table the demo prints and the scenario test reports."""
        d, t = self.direct, self.through_relay
        file = self.last_complete[0]
        rows = [
            ("", "direct replica", "replica through relayproxy"),
            ("Read_Master_Log_Pos", _pos(d.final.read, file), _pos(t.final.read, file)),
            ("Exec_Master_Log_Pos", _pos(d.final.executed, file), _pos(t.final.executed, file)),
            ("Read == Exec", _yes_no(d.final.read_equals_exec), _yes_no(t.final.read_equals_exec)),
            ("IO thread", d.final.io_running, t.final.io_running),
            ("stuck mid-transaction", _yes_no(d.stuck), _yes_no(t.stuck)),
            ("HA may switch", d.short_verdict(), t.short_verdict()),
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows]
        relay = self.relay_status
        lines += [
            "",
            f"  master before the big transaction: {file}:{self.last_complete[1]}, GTID {self.gtid_before}",
            f"  big transaction: GTID {self.big_transaction_gtid}, {self.big_transaction_bytes} bytes, ends at "
            f"{self.big_transaction_end[0]}:{self.big_transaction_end[1]}",
            f"  both links cut after master position {self.cut_master_pos}, then the master was killed",
            f"  relayproxy had received up to {self.relay_at_kill['master_position']['position']} and advertised "
            f"Read_Master_Log_Pos {self.relay_at_kill['read_master_log_pos']} when the master died",
            f"  relayproxy /status: Read_Master_Log_Pos {relay['master_log_file']}:{relay['read_master_log_pos']}, "
            f"Retrieved_Gtid_Set {relay.get('retrieved_gtid_set') or '(empty)'}",
            f"                      IO running {'Yes' if relay.get('io_running') else 'No'}"
            f" ({relay.get('last_io_error') or 'no error'})",
        ]
        return lines

    def as_dict(self) -> dict[str, Any]:
        """The figures as plain data (for a test report or a JSON file)."""

        def replica(o: ReplicaOutcome) -> dict[str, Any]:
            return {
                "read": list(o.final.read),
                "exec": list(o.final.executed),
                "read_equals_exec": o.final.read_equals_exec,
                "sql_state": o.final.sql_state,
                "io_running": o.final.io_running,
                "seconds_to_ha_may_switch": o.seconds_to_switch,
                "cap_seconds": o.cap,
            }

        return {
            "mariadb_version": self.mariadb_version,
            "workload_transactions": self.workload_transactions,
            "last_complete": list(self.last_complete),
            "gtid_before": self.gtid_before,
            "big_transaction": {
                "gtid": self.big_transaction_gtid,
                "bytes": self.big_transaction_bytes,
                "end": list(self.big_transaction_end),
                "cut_after_master_pos": self.cut_master_pos,
            },
            "relay": {
                "received_at_kill": self.relay_at_kill.get("master_position"),
                "read_at_kill": [self.relay_at_kill["master_log_file"], self.relay_at_kill["read_master_log_pos"]],
                "read": list(self.relay_position),
                "retrieved_gtid_set": self.relay_status.get("retrieved_gtid_set"),
                "io_running": self.relay_status.get("io_running"),
            },
            "direct": replica(self.direct),
            "through_relay": replica(self.through_relay),
        }


def _short(file: str | None) -> str:
    """'master-bin.000003' -> '000003' (the live view is one line)."""
    if not file:
        return "-"
    return file.rsplit(".", 1)[-1]


def _pos(position: tuple[str | None, int], usual_file: str) -> str:
    file, pos = position
    return str(pos) if file == usual_file else f"{file}:{pos}"


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


# -- pieces -----------------------------------------------------------------------------------------------------------


def demo_relay(relay_dir: Path, master_port: int, *, server_id: int = 100) -> RelayProcess:
    """`relayproxy run` as the story runs it: its own session (a Ctrl-C for the caller reaches only the caller),
    /status over HTTP, replicas served on `listen_port`, resuming by MariaDB GTID; the caller's RELAYPROXY_*
    settings (a --config file, say) belong to their own relays, not to this one."""
    return RelayProcess(
        relay_dir, master_port, user=REPL_USER, password=REPL_PASSWORD, server_id=server_id, gtid_mode="mariadb",
        heartbeat_period=None, reconnect_max_delay=1, listen=True, clean_env=True,
        users=f"{REPL_USER}:{REPL_PASSWORD},{ADMIN_USER}:{ADMIN_PASSWORD}:admin", log_path=relay_dir.parent / "relay.log",
        new_session=True, error=StoryError, status_timeout=2.0,
    )  # fmt: skip


class MidTransactionHold:
    """Holds one forwarder's dump stream right after the first event that ends at or past a chosen master position.

    Taps follow every connection's bytes with a MysqlStreamWatcher; once `hold_after(log_pos)` is armed, the first
    binlog event whose header shows log_pos >= that position gets `pause_at_stream_offset(its end)`, armed from
    the tap before any byte of it has been forwarded (see relayproxy.lab.faultproxy).
    """

    def __init__(self, proxy: ThreadedFaultProxy, name: str) -> None:
        self.proxy = proxy
        self.name = name
        self._lock = threading.Lock()
        self._watchers: dict[int, MysqlStreamWatcher] = {}
        self._threshold: int | None = None
        self.held: tuple[int, EventLocation] | None = None  # (connection id, the last event let through)
        proxy.on_server_bytes(self._server_bytes)
        proxy.on_client_bytes(self._client_bytes)

    def _watcher(self, conn_id: int) -> MysqlStreamWatcher:
        watcher = self._watchers.get(conn_id)
        if watcher is None:
            watcher = self._watchers[conn_id] = MysqlStreamWatcher(keep_events=False)
        return watcher

    def _client_bytes(self, conn_id: int, _offset: int, data: bytes) -> None:
        with self._lock:
            self._watcher(conn_id).feed_client(data)

    def _server_bytes(self, conn_id: int, _offset: int, data: bytes) -> None:
        # Runs on the proxy thread before `data` is forwarded, so the hold lands exactly at the event's end.
        with self._lock:
            events = self._watcher(conn_id).feed(data)
            if self._threshold is None or self.held is not None:
                return
            for event in events:
                if event.artificial or event.type_code in _HEARTBEATS or event.log_pos < self._threshold:
                    continue
                self.proxy.pause_at_stream_offset(event.packet_end, on=conn_id)
                self.held = (conn_id, event)
                return

    def hold_after(self, log_pos: int) -> None:
        with self._lock:
            self._threshold = log_pos

    def wait_held(self, timeout: float) -> tuple[int, EventLocation]:
        """Wait until the stream is held (every byte up to the hold forwarded); return (connection, event)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                held = self.held
            if held is not None:
                conn_id, event = held
                self.proxy.wait_for_bytes(event.packet_end, max(0.1, deadline - time.monotonic()), on=conn_id)
                return held
            time.sleep(0.02)
        raise StoryError(f"the {self.name} link never reached the middle of the big transaction within {timeout:.0f}s")


class Workload:
    """A mixed write load on the master in a thread: autocommit and multi-statement row transactions, statement
    format with user variables, XA, deletes, a DDL now and then and a binlog rotation every few seconds."""

    def __init__(self, master: MariaDBSandbox, seed: int = 7) -> None:
        self.master = master
        self.transactions = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._random = random.Random(seed)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="story-workload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def _run(self) -> None:
        try:
            conn = self.master.connect()
        except BaseException as exc:
            self.error = exc
            return
        try:
            cur = conn.cursor()
            last_rotation = time.monotonic()
            while not self._stop.is_set():
                self._one(cur, self.transactions)
                self.transactions += 1
                if time.monotonic() - last_rotation > 3:
                    cur.execute("FLUSH BINARY LOGS")
                    last_rotation = time.monotonic()
                time.sleep(0.002)  # a steady stream, not a benchmark: leave the CPUs to the replicas
        except BaseException as exc:
            self.error = exc
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def _one(self, cur: Any, n: int) -> None:
        owner = self._random.randint(1, 20)
        amount = self._random.randint(1, 500)
        kind = n % 10
        if kind in (0, 3, 6):
            cur.execute(
                f"INSERT INTO {SCHEMA}.ledger (account_id, amount, note) VALUES (%s, %s, %s)",
                (owner, amount, f"autocommit {n}"),
            )
        elif kind in (1, 4, 7):
            other = owner % 20 + 1
            cur.execute("BEGIN")
            cur.execute(f"UPDATE {SCHEMA}.accounts SET balance = balance - %s WHERE id = %s", (amount, owner))
            cur.execute(f"UPDATE {SCHEMA}.accounts SET balance = balance + %s WHERE id = %s", (amount, other))
            cur.execute(
                f"INSERT INTO {SCHEMA}.ledger (account_id, amount, note) VALUES (%s, %s, %s), (%s, %s, %s)",
                (owner, -amount, f"to {other}", other, amount, f"from {owner}"),
            )
            cur.execute("COMMIT")
        elif kind == 2:
            cur.execute("SET SESSION binlog_format = 'STATEMENT'")
            cur.execute("SET @bonus = %s", (amount,))
            cur.execute("BEGIN")
            cur.execute(f"UPDATE {SCHEMA}.accounts SET balance = balance + @bonus WHERE id = %s", (owner,))
            cur.execute(
                f"INSERT INTO {SCHEMA}.ledger (account_id, amount, note) VALUES (%s, @bonus, 'bonus')", (owner,)
            )
            cur.execute("COMMIT")
            cur.execute("SET SESSION binlog_format = 'ROW'")
        elif kind == 5:
            xid = f"story-{n}"
            cur.execute("XA START %s", (xid,))
            cur.execute(
                f"INSERT INTO {SCHEMA}.ledger (account_id, amount, note) VALUES (%s, 0, 'xa audit')", (owner,)
            )
            cur.execute("XA END %s", (xid,))
            cur.execute("XA PREPARE %s", (xid,))
            cur.execute("XA COMMIT %s", (xid,))
        elif kind == 8:
            cur.execute(f"DELETE FROM {SCHEMA}.ledger WHERE account_id = %s ORDER BY id LIMIT 3", (owner,))
        elif n % 200 == 9:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.audit_{n // 200} (id INT PRIMARY KEY, note TEXT)")
        else:
            cur.execute(
                f"INSERT INTO {SCHEMA}.ledger (account_id, amount, note) VALUES (%s, %s, 'mixed')", (owner, amount)
            )


def _replica_state(replica: MariaDBSandbox) -> ReplicaState | None:
    try:
        conn = replica.connect(connect_timeout=2, read_timeout=5)
    except (pymysql.MySQLError, OSError, RuntimeError):
        return None
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
        return ReplicaState.from_row(row) if row else None
    except (pymysql.MySQLError, OSError):
        return None
    finally:
        with contextlib.suppress(Exception):
            conn.close()


# -- the story --------------------------------------------------------------------------------------------------------

Observer = Callable[[Snapshot], None]
Narrator = Callable[[str], None]


class CrashStory:
    """The topology and the story's steps. Use as a context manager (or call close()): closing stops every process
    the story started, whatever state it is in. Files stay in `workdir`; removing it is the caller's choice."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        observe: Observer | None = None,
        narrate: Narrator | None = None,
        interval: float = 0.25,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self.observe = observe or (lambda _snapshot: None)
        self.narrate = narrate or (lambda _text: None)
        self.interval = interval
        self.master = MariaDBSandbox(self.workdir / "master", server_id=1, binlog_format="ROW")
        # The direct replica logs what it applies (log_slave_updates): act 2 promotes it to master.
        self.direct = MariaDBSandbox(self.workdir / "direct-replica", server_id=2, log_bin=True,
                                     extra_config={"log_slave_updates": 1})
        self.through_relay = MariaDBSandbox(self.workdir / "relay-replica", server_id=3, log_bin=False)
        self.relay_link: ThreadedFaultProxy | None = None
        self.direct_link: ThreadedFaultProxy | None = None
        self.relay: RelayProcess | None = None
        self.relay_hold: MidTransactionHold | None = None
        self.direct_hold: MidTransactionHold | None = None
        self.workload: Workload | None = None
        self.version = ""
        self.workload_seconds = 0.0
        self.timeline: list[Snapshot] = []
        self._began = time.monotonic()
        self.phase = "setup"
        self._killed_at: float | None = None
        self._transactions = 0

    # -- lifecycle --------------------------------------------------------------------------------------------

    def __enter__(self) -> CrashStory:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        try:
            self.close()
        except StoryError as exc:
            if exc_type is None:
                raise
            log.error("story cleanup failed after an earlier error", error=str(exc))  # keep the first error

    def close(self) -> None:
        """Stop everything this story started (idempotent; every piece is stopped even if another fails)."""
        problems: list[str] = []
        steps: list[tuple[str, Callable[[], None]]] = [
            ("workload", lambda: self.workload.stop() if self.workload else None),
            ("relay", lambda: self.relay.stop() if self.relay else None),
            ("relay link", lambda: self.relay_link.stop() if self.relay_link else None),
            ("direct link", lambda: self.direct_link.stop() if self.direct_link else None),
            # The direct replica may hold an open transaction and retry a dead master; a clean stop is still quick.
            ("direct replica", lambda: self.direct.stop(timeout=15)),
            ("replica through the relay", lambda: self.through_relay.stop(timeout=15)),
            ("master", lambda: self.master.stop(timeout=15)),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # keep stopping the rest; say what failed at the end
                problems.append(f"{what}: {exc}")
        if problems:
            raise StoryError("could not stop everything cleanly: " + "; ".join(problems))

    # -- steps ------------------------------------------------------------------------------------------------

    def start(self) -> str:
        """Start the three servers (in parallel), the two links, the relay, and both replicas; return the version."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.narrate("starting a MariaDB master and two replicas (initialising three datadirs takes a few seconds)")
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            for future in [pool.submit(s.start) for s in (self.master, self.direct, self.through_relay)]:
                future.result()
        self.version = version = str(self.master.execute("SELECT VERSION()")[0][0])
        self.master.create_user(REPL_USER, REPL_PASSWORD)
        self._create_schema()
        self.relay_link = ThreadedFaultProxy(self.master.host, self.master.port).start()
        self.direct_link = ThreadedFaultProxy(self.master.host, self.master.port).start()
        self.relay_hold = MidTransactionHold(self.relay_link, "relay")
        self.direct_hold = MidTransactionHold(self.direct_link, "direct replica")
        self.relay = demo_relay(self.workdir / "relay" / "data", self.relay_link.port)
        self.relay.start()
        self._change_master(self.direct, self.direct_link.port)
        self._change_master(self.through_relay, self.relay.listen_port)
        self.narrate(
            f"MariaDB {version}: master :{self.master.port}; relayproxy :{self.relay.listen_port} (status "
            f"http://127.0.0.1:{self.relay.http_port}/status) reading the master through forwarder "
            f":{self.relay_link.port}; replica :{self.through_relay.port} through the relay; replica "
            f":{self.direct.port} directly on the master through forwarder :{self.direct_link.port}"
        )
        self.wait_caught_up(timeout=60)
        return version

    def _create_schema(self) -> None:
        self.master.execute(f"CREATE DATABASE {SCHEMA}")
        self.master.execute(
            f"CREATE TABLE {SCHEMA}.accounts (id INT PRIMARY KEY, owner VARCHAR(40) NOT NULL,"
            " balance DECIMAL(14,2) NOT NULL) ENGINE=InnoDB"
        )
        self.master.execute(
            f"INSERT INTO {SCHEMA}.accounts SELECT seq, CONCAT('owner ', seq), 1000 FROM {SCHEMA}.seq_1_to_20"
        )
        self.master.execute(
            f"CREATE TABLE {SCHEMA}.ledger (id INT AUTO_INCREMENT PRIMARY KEY, account_id INT NOT NULL,"
            " amount DECIMAL(14,2) NOT NULL, note VARCHAR(80) NOT NULL) ENGINE=InnoDB"
        )
        self.master.execute(
            f"CREATE TABLE {SCHEMA}.big (id INT AUTO_INCREMENT PRIMARY KEY, payload TEXT NOT NULL) ENGINE=InnoDB"
        )

    @staticmethod
    def _change_master(replica: MariaDBSandbox, port: int) -> None:
        replica.execute(render_change_master(ChangeMaster.for_server(
            "mariadb", host="127.0.0.1", port=port, user=REPL_USER, password=REPL_PASSWORD, connect_retry=1,
            heartbeat_period=1, gtid=True)))
        replica.execute("START SLAVE")

    def snapshot(self) -> Snapshot:
        """Look at everything once (each piece that does not answer shows as None)."""
        master = None
        if self.master.running:
            with contextlib.suppress(pymysql.MySQLError, OSError, RuntimeError):
                row = self.master.execute("SHOW MASTER STATUS")[0]
                master = (str(row[0]), int(row[1]))
        relay = None
        if self.relay is not None:
            with contextlib.suppress(OSError, ValueError):
                relay = self.relay.status()
        if self.workload is not None:
            self._transactions = self.workload.transactions
        snap = Snapshot(
            elapsed=time.monotonic() - self._began,
            phase=self.phase if self._killed_at is None else f"kill+{time.monotonic() - self._killed_at:.1f}s",
            master=master,
            relay=relay,
            direct=_replica_state(self.direct),
            through_relay=_replica_state(self.through_relay),
            transactions=self._transactions,
        )
        self.timeline.append(snap)
        self.observe(snap)
        return snap

    def run_workload(self, seconds: float) -> tuple[int, float]:
        """The mixed workload for `seconds`, looking at the topology every `interval`; (transactions, seconds)."""
        self.narrate(f"mixed workload on the master for {seconds:g} s")
        self.phase = "workload"
        began = time.monotonic()
        self.workload = Workload(self.master)
        self.workload.start()
        try:
            while time.monotonic() - began < seconds:
                if self.workload.error is not None:
                    break
                snap = self.snapshot()
                for name, state in (("direct", snap.direct), ("through the relay", snap.through_relay)):
                    # A replica whose IO thread is retrying is fine; a stopped replication thread is not.
                    if state is not None and "No" in (state.io_running, state.sql_running):
                        raise StoryError(f"replica {name} stopped: {state.last_io_error} {state.last_sql_error}")
                time.sleep(self.interval)
        finally:
            self.workload.stop()
        if self.workload.error is not None:
            raise StoryError(f"the workload failed: {self.workload.error!r}")
        self._transactions = self.workload.transactions
        self.workload_seconds = time.monotonic() - began
        self.phase = "catch-up"
        return self.workload.transactions, self.workload_seconds

    def wait_caught_up(self, timeout: float = 60.0) -> Snapshot:
        """Wait until the relay's horizon and both replicas' Read and Exec are the master's position, and that
        position has stayed put for a moment (MariaDB writes a BINLOG_CHECKPOINT event after a rotation, late)."""
        deadline = time.monotonic() + timeout
        steady_since: float | None = None
        last: Snapshot | None = None
        while time.monotonic() < deadline:
            snap = self.snapshot()
            want = snap.master
            caught_up = (
                want is not None
                and snap.relay is not None
                and (snap.relay["master_log_file"], snap.relay["read_master_log_pos"]) == want
                and all(
                    r is not None and r.read == want and r.executed == want and r.sql_state == IDLE_SQL_STATE
                    for r in (snap.direct, snap.through_relay)
                )
            )
            if caught_up and last is not None and last.master == want:
                steady_since = steady_since or time.monotonic()
                if time.monotonic() - steady_since >= 1.0:
                    return snap
            else:
                steady_since = None
            last = snap
            time.sleep(min(self.interval, 0.1))
        raise StoryError(f"the relay and the replicas did not catch up with the master within {timeout:.0f}s: {last}")

    def checksums(self, server: MariaDBSandbox) -> dict[str, int | None]:
        tables = [
            f"{SCHEMA}.{row[0]}"
            for row in server.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'"
                " ORDER BY table_name",
                (SCHEMA,),
            )
        ]
        if not tables:
            return {}
        return {str(row[0]): row[1] for row in server.execute(f"CHECKSUM TABLE {', '.join(tables)}")}

    def crash_mid_transaction(
        self, *, big_bytes: int, direct_cap: float, relay_cap: float
    ) -> StoryResult:
        """Write the big transaction, hold both links in its middle, kill -9 the master, drop the links, and
        measure how long until each replica satisfies the HA rule."""
        if self.relay is None or self.relay_link is None or self.direct_link is None:
            raise StoryError("crash_mid_transaction() needs start() first")
        assert self.relay_hold is not None and self.direct_hold is not None
        snap = self.wait_caught_up()
        assert snap.master is not None
        last_complete = snap.master
        gtid_before = str(self.master.execute("SELECT @@gtid_binlog_pos")[0][0])
        checksums_before = self.checksums(self.master)

        rows = max(2, big_bytes // BIG_ROW_BYTES)
        # The first event that ends past the transaction's midpoint: with one row per event, about half the rows.
        threshold = last_complete[1] + (rows * BIG_ROW_BYTES) // 2
        for hold in (self.relay_hold, self.direct_hold):
            hold.hold_after(threshold)
        # Open connections stay; new ones are refused from now on, so neither the relay nor the replica can fetch
        # the rest of the transaction by reconnecting while their link is held (a dead master refuses too).
        self.relay_link.refuse(True)
        self.direct_link.refuse(True)
        self.narrate(
            f"caught up at {last_complete[0]}:{last_complete[1]} (GTID {gtid_before}); now one big transaction: "
            f"{rows} rows, about {round(rows * BIG_ROW_BYTES / (1024 * 1024))} MB of row events"
        )
        self.phase = "big trx"
        conn = self.master.connect(autocommit=False, read_timeout=120)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    f"INSERT INTO {SCHEMA}.big (payload) SELECT REPEAT(CHAR(65 + seq % 26), {BIG_ROW_BYTES}) "
                    f"FROM {SCHEMA}.seq_1_to_{rows}"
                )
            conn.commit()
        finally:
            conn.close()
        row = self.master.execute("SHOW MASTER STATUS")[0]
        big_end = (str(row[0]), int(row[1]))
        big_gtid = str(self.master.execute("SELECT @@gtid_binlog_pos")[0][0])
        if big_end[0] != last_complete[0]:
            raise StoryError(f"the master rotated during the big transaction ({last_complete} -> {big_end})")
        first = self.master.execute(f"SHOW BINLOG EVENTS IN '{last_complete[0]}' FROM {last_complete[1]} LIMIT 1")
        if not first or first[0][2] != "Gtid" or big_gtid.rsplit("-", 1)[-1] not in str(first[0][5]):
            # Something else (a late BINLOG_CHECKPOINT, say) was written between the snapshot and the big transaction.
            raise StoryError(f"the big transaction {big_gtid} does not start at {last_complete}: {first}")

        _, relay_event = self.relay_hold.wait_held(60)
        _, direct_event = self.direct_hold.wait_held(60)
        if relay_event.log_pos != direct_event.log_pos or not last_complete[1] < relay_event.log_pos < big_end[1]:
            raise StoryError(
                f"the links were held at master positions {relay_event.log_pos} and {direct_event.log_pos}, not at "
                f"one point inside the big transaction ({last_complete[1]}, {big_end[1]})"
            )
        cut = relay_event.log_pos
        self._wait_direct_read(cut, timeout=30)
        relay_at_kill = self._wait_relay_received((big_end[0], cut), timeout=30)
        self.snapshot()

        self.narrate(
            f"both links hold the stream after master position {cut}, inside the big transaction "
            f"({last_complete[1]}..{big_end[1]}); kill -9 the master"
        )
        at_kill = {"direct": _replica_state(self.direct), "through_relay": _replica_state(self.through_relay)}
        killed_at = self._killed_at = time.monotonic()
        self.master.kill()
        # A dead master's connections end: the replicas see EOF where the link was held.
        self.relay_link.drop_connections()
        self.direct_link.drop_connections()
        outcomes = self._measure(killed_at, at_kill, direct_cap=direct_cap, relay_cap=relay_cap)
        relay_status = self.relay.status()
        return StoryResult(
            workdir=self.workdir,
            mariadb_version=self.version,
            workload_transactions=self._transactions,
            workload_seconds=self.workload_seconds,
            last_complete=last_complete,
            gtid_before=gtid_before,
            checksums_before=checksums_before,
            big_transaction_end=big_end,
            big_transaction_gtid=big_gtid,
            big_transaction_bytes=big_end[1] - last_complete[1],
            cut_master_pos=cut,
            direct=outcomes["direct"],
            through_relay=outcomes["through_relay"],
            relay_status=relay_status,
            relay_at_kill=relay_at_kill,
            checksums_through_relay=self.checksums(self.through_relay),
            timeline=self.timeline,
        )

    def _wait_relay_received(self, position: tuple[str, int], timeout: float) -> dict[str, Any]:
        """Wait until the relay has received every event up to the hold (its /status master_position)."""
        assert self.relay is not None
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        want = {"file": position[0], "position": position[1]}
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                status = self.relay.status()
                if status.get("master_position") == want:
                    return status
            time.sleep(0.05)
        raise StoryError(f"the relay did not receive the events up to master position {position}: {status}")

    def _wait_direct_read(self, position: int, timeout: float) -> None:
        """Wait until the direct replica's IO thread has written everything up to the hold to its relay log."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = _replica_state(self.direct)
            if state is not None and state.read_master_log_pos == position:
                return
            time.sleep(0.05)
        raise StoryError(f"the direct replica did not read up to master position {position}: {state}")

    def _measure(
        self, killed_at: float, at_kill: dict[str, ReplicaState | None], *, direct_cap: float, relay_cap: float
    ) -> dict[str, ReplicaOutcome]:
        """Poll both replicas from the kill on: the HA rule must hold STABLE_POLLS polls in a row; the time
        reported is that of the first of them. Each replica is watched until the rule holds or its cap passes."""
        caps = {"direct": direct_cap, "through_relay": relay_cap}
        servers = {"direct": self.direct, "through_relay": self.through_relay}
        streak_start: dict[str, float | None] = {name: None for name in caps}
        streak: dict[str, int] = {name: 0 for name in caps}
        switched: dict[str, float | None] = {name: None for name in caps}
        final: dict[str, ReplicaState | None] = dict(at_kill)
        last_view = 0.0
        while True:
            now = time.monotonic() - killed_at
            pending = [n for n in caps if switched[n] is None and now < caps[n]]
            if not pending:
                break
            for name in pending:
                state = _replica_state(servers[name])
                if state is not None:
                    final[name] = state
                if state is not None and state.ha_may_switch:
                    if streak[name] == 0:
                        streak_start[name] = now
                    streak[name] += 1
                    if streak[name] >= STABLE_POLLS:
                        switched[name] = streak_start[name]
                else:
                    streak[name] = 0
            if time.monotonic() - last_view >= self.interval:
                self.snapshot()
                last_view = time.monotonic()
            time.sleep(0.05)
        outcomes = {}
        for name in caps:
            state = final[name] or at_kill[name]
            if state is None or at_kill[name] is None:
                raise StoryError(f"replica {name} did not answer SHOW SLAVE STATUS during the measurement")
            outcomes[name] = ReplicaOutcome(name, at_kill[name], state, switched[name], caps[name])
        return outcomes


@dataclass
class FailoverResult:
    """Act 2: the direct replica promoted, the relay repointed to it with SQL, new writes through the relay."""

    new_master_port: int
    promoted_at_gtid: str  # the promoted replica's @@gtid_binlog_pos when it became master
    statements: list[str]  # what was sent to the relay (the password masked)
    writes: int  # transactions written on the new master
    seconds_to_first: float  # START SLAVE on the relay -> the first new transaction applied behind it
    seconds_to_all: float  # ... -> all of them
    relay_files: list[str]  # the relay's files after the switch (one monotonic sequence)
    relay_status: dict[str, Any]
    checksums_new_master: dict[str, int | None]
    checksums_through_relay: dict[str, int | None]

    def summary_lines(self) -> list[str]:
        same = self.checksums_new_master == self.checksums_through_relay
        st = self.relay_status
        return [
            f"  promoted the direct replica (:{self.new_master_port}) at GTID {self.promoted_at_gtid}: "
            "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0 (its half transaction is dropped)",
            "  repointed relayproxy as an HA tool repoints any replica:",
            *(f"    {statement}" for statement in self.statements),
            f"  {self.writes} transactions written on the new master; the replica through relayproxy had the first "
            f"{self.seconds_to_first:.2f} s after START SLAVE, all of them after {self.seconds_to_all:.2f} s",
            f"  relayproxy now follows :{st.get('master_port')} (server_id {st.get('master_server_id')}), "
            f"Retrieved_Gtid_Set {st.get('retrieved_gtid_set')}",
            f"  relay files: {', '.join(self.relay_files)} (one sequence: the new master's files follow the old's)",
            f"  CHECKSUM TABLE, new master vs replica through relayproxy: {'equal' if same else 'DIFFERENT'}",
        ]


def _relay_sql(port: int, statements: list[str]) -> None:
    conn = pymysql.connect(host="127.0.0.1", port=port, user=ADMIN_USER, password=ADMIN_PASSWORD,
                           connect_timeout=10, read_timeout=60, autocommit=True)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def promote_and_repoint(story: CrashStory, *, writes: int = 50, timeout: float = 60.0) -> FailoverResult:
    """Act 2 of the story, after the crash: promote the direct replica (an HA tool's three statements), repoint
    the relay to it (STOP SLAVE; CHANGE MASTER TO ... MASTER_USE_GTID=slave_pos; START SLAVE), write on the new
    master and watch the replica through the relay receive it."""
    if story.relay is None:
        raise StoryError("promote_and_repoint() needs the crash story first")
    story.phase = "failover"
    new = story.direct
    story.narrate(f"act 2: an HA tool promotes the direct replica (:{new.port}) and repoints relayproxy to it")
    new.execute("STOP SLAVE")
    new.execute("RESET SLAVE ALL")
    new.execute("SET GLOBAL read_only = 0")
    promoted_at = str(new.execute("SELECT @@gtid_binlog_pos")[0][0])
    new.create_user(REPL_USER, REPL_PASSWORD)
    change = ChangeMaster.for_server("mariadb", host="127.0.0.1", port=new.port, user=REPL_USER,
                                     password=REPL_PASSWORD, gtid=True)
    _relay_sql(story.relay.listen_port, ["STOP SLAVE", render_change_master(change)])
    started = time.monotonic()
    _relay_sql(story.relay.listen_port, ["START SLAVE"])
    conn = new.connect()
    try:
        with conn.cursor() as cur:
            for i in range(writes):
                cur.execute(f"INSERT INTO {SCHEMA}.ledger (account_id, amount, note) VALUES (%s, %s, %s)",
                            (1 + i % 20, 1, f"after the failover {i}"))
                conn.commit()
    finally:
        conn.close()
    target = str(new.execute("SELECT @@gtid_binlog_pos")[0][0])
    first_seq = int(promoted_at.rsplit("-", 1)[1]) + 1 if promoted_at else 1
    first_at = all_at = None
    deadline = started + timeout
    last_view = 0.0
    row = ""
    while time.monotonic() < deadline and all_at is None:
        row = str(story.through_relay.execute("SELECT @@gtid_slave_pos")[0][0] or "")
        seq = int(row.rsplit("-", 1)[1]) if row else 0
        now = time.monotonic() - started
        if first_at is None and seq >= first_seq:
            first_at = now
        if row == target:
            all_at = now
        else:
            if time.monotonic() - last_view >= story.interval:
                story.snapshot()
                last_view = time.monotonic()
            time.sleep(0.01)
    if first_at is None or all_at is None:
        raise StoryError(f"the replica through the relay did not receive the new master's writes within "
                         f"{timeout:.0f}s: it is at {row}, the new master at {target}\n{story.relay.log_tail(10)}")
    status = story.relay.status()
    files = sorted(p.name for p in story.relay.relay_dir.iterdir() if p.name.startswith("master-bin."))
    return FailoverResult(
        new_master_port=new.port,
        promoted_at_gtid=promoted_at,
        statements=["STOP SLAVE;", render_change_master(change, mask_password=True) + ";", "START SLAVE;"],
        writes=writes,
        seconds_to_first=first_at,
        seconds_to_all=all_at,
        relay_files=files,
        relay_status=status,
        checksums_new_master=story.checksums(new),
        checksums_through_relay=story.checksums(story.through_relay),
    )


def run_crash_story(
    workdir: str | os.PathLike[str],
    *,
    workload_seconds: float = 8.0,
    big_bytes: int = 16 * 1024 * 1024,
    direct_cap: float = 10.0,
    relay_cap: float = 30.0,
    observe: Observer | None = None,
    narrate: Narrator | None = None,
    interval: float = 0.25,
) -> StoryResult:
    """The whole story in `workdir`: start, workload, catch up, crash mid-transaction, measure, stop everything.

    Every process it started is stopped before it returns or raises; the files stay in `workdir`.
    """
    with CrashStory(workdir, observe=observe, narrate=narrate, interval=interval) as story:
        story.start()
        story.run_workload(workload_seconds)
        return story.crash_mid_transaction(big_bytes=big_bytes, direct_cap=direct_cap, relay_cap=relay_cap)
