"""Test harness around the relay process (relayprocess.py): compare its files with the master's, replicas, load."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pymysql

from relayproxy.binlog import constants as C
from relayproxy.downstream.sql.replication_parser import ChangeMaster, render_change_master
from relayproxy.lab.faultproxy import ThreadedFaultProxy
from relayproxy.lab.packetwatch import MysqlStreamWatcher
from relayproxy.lab.relayprocess import REPO, RelayProcess, free_port, master_status  # noqa: F401 (re-exported)

FIRST_FILE = "master-bin.000001"  # a fresh MariaDBSandbox master's first binlog


def run_every_step(steps) -> list[str]:
    """Run each step of a shutdown even if an earlier one fails; the failures, as text (none: empty)."""
    problems = []
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - stop the rest, report at the end
            problems.append(repr(exc))
    return problems


class StreamMap:
    """Follows every proxied connection's server-to-client bytes and finds the binlog events in them."""

    def __init__(self, proxy: ThreadedFaultProxy):
        self._lock = threading.Lock()
        self._watchers: dict[int, MysqlStreamWatcher] = {}
        proxy.on_server_bytes(self._tap)

    def _tap(self, conn_id: int, offset: int, data: bytes) -> None:
        with self._lock:
            self._watchers.setdefault(conn_id, MysqlStreamWatcher()).feed(data)

    def events_ending_in(self, start: int, end: int, timeout: float = 20.0):
        """(conn_id, events) of the newest connection once it has seen every event in master range (start, end]."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._watchers:
                    conn_id = max(self._watchers)
                    events = [e for e in self._watchers[conn_id].events if start < e.log_pos <= end and not e.artificial]
                    if events and events[-1].log_pos == end:
                        return conn_id, events
            time.sleep(0.02)
        with self._lock:
            seen = {c: [(e.name, e.log_pos) for e in w.events][-8:] for c, w in self._watchers.items()}
            problems = {c: w.problems for c, w in self._watchers.items() if w.problems}
        raise AssertionError(
            f"the proxy never received the events of master range ({start}, {end}]; last events seen {seen}; {problems}"
        )

    def wait_settled_at(self, proxy: ThreadedFaultProxy, position: int, timeout: float = 20.0, *,
                        after_heartbeat: bool = False) -> int:
        """Wait until the newest connection has carried an event ending at master `position` and the proxy has
        forwarded all it received on it; returns that connection's id.

        Transactions are located by pausing the link and watching what arrives; a paused proxy holds the one chunk
        it has read and reads no more, so a chunk still in flight at the pause (the rest of a dump's opening
        events, say) would hide them. Pause only a settled link. With short heartbeat periods, a heartbeat that
        arrives between the pause and the transaction is such a chunk too: ``after_heartbeat`` waits for the next
        heartbeat to have been forwarded (the following one is a whole period away).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            first = max(self._watchers, default=None)
            beats = (first, self._heartbeats(first)) if after_heartbeat else None
        while time.monotonic() < deadline:
            with self._lock:
                newest = max(self._watchers, default=None)
                reached = newest is not None and any(e.log_pos == position for e in self._watchers[newest].events)
                if reached and beats is not None:  # a new connection's first heartbeat counts
                    reached = self._heartbeats(newest) > (beats[1] if newest == beats[0] else 0)
            if reached:
                info = proxy.connection(newest)
                if info.open and info.server_to_client_received == info.server_to_client:
                    return newest
            time.sleep(0.02)
        raise AssertionError(f"the link did not settle at master position {position}"
                             f"{' after a heartbeat' if after_heartbeat else ''}: {proxy.connections()}")

    def _heartbeats(self, conn: int | None) -> int:
        """Heartbeat events seen so far on connection ``conn`` (the caller holds the lock)."""
        watcher = self._watchers.get(conn) if conn is not None else None
        return 0 if watcher is None else sum(
            e.type_code in (C.HEARTBEAT_LOG_EVENT, C.HEARTBEAT_LOG_EVENT_V2) for e in watcher.events)



def prepare_master(master) -> None:
    master.create_user("repl", "replpw")


def assert_files_equal_master(relay_dir: Path, master, *, up_to: tuple[str, int] | None = None) -> None:
    """Closed relay files equal the master's byte for byte; the active one too, up to the horizon.

    The only difference allowed is LOG_EVENT_BINLOG_IN_USE_F in the FDE of the master's active file,
    which the master clears when it sends the event.
    """
    names = [p.name for p in master.binlog_files()]
    relay_names = (relay_dir / "relayproxy.index").read_text().split()
    assert relay_names == names[names.index(relay_names[0]) : names.index(relay_names[0]) + len(relay_names)]
    for name in relay_names:
        mine = (relay_dir / name).read_bytes()
        theirs = (master.binlog_dir / name).read_bytes()
        if up_to is not None and name == up_to[0]:
            theirs = theirs[: up_to[1]]
            assert len(mine) == up_to[1], (name, len(mine), up_to)
        else:
            theirs = theirs[: len(mine)] if name == relay_names[-1] else theirs
        a, b = bytearray(mine), bytearray(theirs)
        for buf in (a, b):
            if len(buf) > 4 + 19:
                buf[4 + 17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
        assert a == b, f"{name}: relay file differs from the master's (sizes {len(mine)} / {len(theirs)})"


# -- replicas of the relay, data checks and load (shared by the end-to-end tests) ------------------------------------


def replica_status(replica) -> dict:
    conn = replica.connect()
    try:
        cur = conn.cursor()
        cur.execute("SHOW SLAVE STATUS")
        row = cur.fetchone()
        return dict(zip([d[0] for d in cur.description], row)) if row else {}
    finally:
        conn.close()


def wait_relay(relay: RelayProcess, master, timeout: float = 60.0) -> dict:
    """Wait until the relay's horizon is the master's current position, read afresh at every poll: MariaDB writes
    a BINLOG_CHECKPOINT event some time after a rotation, so a position read once may already be behind
    (harness.wait_caught_up compares with one snapshot). An upstream error on the relay fails at once: no
    relay in these topologies has a reason to lose its master."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        assert relay.proc is not None and relay.proc.poll() is None, f"relay exited:\n{relay.log_tail()}"
        want = master_status(master)
        try:
            status = relay.status()
        except OSError:
            time.sleep(0.05)
            continue
        assert status["last_io_error"] is None, f"{relay.relay_dir.name}: {status['last_io_error']}"
        if (status["master_log_file"], status["read_master_log_pos"]) == want:
            return status
        time.sleep(0.05)
    raise AssertionError(f"{relay.relay_dir.name} did not reach the master's position: {status}\n{relay.log_tail()}")


def wait_replica(replica, master, timeout: float = 60.0, *, under_load: bool = False) -> dict:
    """Wait until the replica has executed up to the master's current position (read afresh, see wait_relay);
    a stopped replication thread fails at once. ``under_load``: the master is being written meanwhile, so the
    target is its position when the wait began, and the replica passes once it has executed that far (being at
    the master's moving position at the moment of a poll is a race a slow machine can lose for a minute)."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    target = master_status(master) if under_load else None
    while time.monotonic() < deadline:
        want = target or master_status(master)
        status = replica_status(replica)
        # A connection error while the IO thread retries (a relay restarting) is fine; a stopped thread is not.
        assert status.get("Slave_IO_Running") != "No" and status.get("Slave_SQL_Running") != "No", (
            f"replica stopped: {status.get('Last_IO_Error')} {status.get('Last_SQL_Error')}")
        executed = (status.get("Relay_Master_Log_File"), int(status.get("Exec_Master_Log_Pos") or 0))
        if executed == want or (target is not None and executed[0] is not None and executed >= target):
            return status
        time.sleep(0.1)
    raise AssertionError(f"replica did not reach the master's position: {status}")


def change_master(replica, port: int, *, file: str | None = FIRST_FILE, pos: int = 4) -> None:
    where = {"log_file": file, "log_pos": pos} if file is not None else {}
    replica.execute(render_change_master(ChangeMaster.for_server(
        "mariadb", host="127.0.0.1", port=port, user="repl", password="replpw", connect_retry=1, heartbeat_period=1,
        **where, gtid=file is None)))


def user_tables(server) -> list[str]:
    rows = server.execute(
        "SELECT CONCAT(table_schema, '.', table_name) FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
        "AND table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys') ORDER BY 1"
    )
    return [row[0] for row in rows]


def assert_same_data(master, replica) -> None:
    """Same tables, each with the same CHECKSUM TABLE and row count."""
    tables = user_tables(master)
    assert tables and user_tables(replica) == tables
    for table in tables:
        theirs = master.execute(f"CHECKSUM TABLE {table}")[0][1], master.execute(f"SELECT COUNT(*) FROM {table}")[0][0]
        mine = replica.execute(f"CHECKSUM TABLE {table}")[0][1], replica.execute(f"SELECT COUNT(*) FROM {table}")[0][0]
        assert mine == theirs, f"{table}: replica (checksum, rows) {mine} != master {theirs}"


class Writer:
    """Small transactions on the master from a thread, a rotation every `rotate_every`, until stop()."""

    def __init__(self, master, *, rotate_every: int = 150, limit: int = 20_000):
        self.master = master
        self.rotate_every = rotate_every
        self.limit = limit
        self.done = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        master.execute("CREATE DATABASE IF NOT EXISTS app")
        master.execute("CREATE TABLE IF NOT EXISTS app.w (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(100), "
                       "n INT) ENGINE=InnoDB")
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Writer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            conn = self.master.connect()
            cur = conn.cursor()
            while not self._stop.is_set() and self.done < self.limit:
                cur.execute("BEGIN")
                cur.execute("INSERT INTO app.w (v, n) VALUES (%s, %s)", (f"row-{self.done}", self.done))
                cur.execute("UPDATE app.w SET n = n + 1 WHERE id = LAST_INSERT_ID()")
                cur.execute("COMMIT")
                self.done += 1
                if self.done % self.rotate_every == 0:
                    cur.execute("FLUSH BINARY LOGS")
                time.sleep(0.002)
            conn.close()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "writer thread did not stop"
        if self.error is not None:
            raise AssertionError(f"writer failed: {self.error!r}")


def listener_query(port: int, statement: str, *, user: str = "repl", password: str = "replpw") -> list[dict]:
    """One statement on a relay's --listen port as any SQL client sends it; the rows as dicts by column name."""
    conn = pymysql.connect(host="127.0.0.1", port=port, user=user, password=password)
    try:
        cur = conn.cursor()
        cur.execute(statement)
        columns = [d[0] for d in cur.description or ()]
        return [dict(zip(columns, row)) for row in cur.fetchall()]
    finally:
        conn.close()
