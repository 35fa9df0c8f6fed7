"""The failover topology on real servers: build it, kill the master mid-transaction, promote, repoint the relay.

Used by tests/scenarios/test_scenario_failover.py, `relayproxy demo` (act 2) and the failover benchmark::

    M1 ─link─ relayproxy ─┬─ R2  by GTID       (MASTER_USE_GTID=slave_pos)
     │   (run --listen)   └─ R3  by file/pos   (MASTER_LOG_FILE=<relay's first file>, MASTER_USE_GTID=no)
     ├─link─ R1  candidate: own binlog mysql-bin, log_slave_updates, gtid_strict_mode, MASTER_USE_GTID=slave_pos
     └─link─ R4  optional second candidate, same set-up (repointed to R1 after the first switch)

Every link out of M1 is a fault proxy with a `MidTransactionHold` (lab/story.py): `kill_mid_transaction` holds
all of them right after the same event inside one large transaction, kills M1 with SIGKILL and drops the links,
as a dead master's connections end. Every candidate and the relay then hold the same complete transactions.
`promote` and `repoint_relay` / `repoint_replica` send exactly what an HA tool sends. `MixedLoad` writes
transactions whose inserted rows each carry a unique `uid`, so a lost or repeated insert shows in the data.
`FailoverLab.close()` (or leaving its `with`) stops every process it started, whatever state it is in.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pymysql

from ..downstream.sql.replication_parser import ChangeMaster, render_change_master
from .faultproxy import ThreadedFaultProxy
from .harness import (
    RelayProcess,
    free_port,
    master_status,
    replica_status,
    run_every_step,
    wait_relay,
    wait_replica,
)
from .harness import change_master as _change_master
from .sandbox import MariaDBSandbox
from .story import MidTransactionHold

REPL_USER, REPL_PASSWORD = "repl", "replpw"
ADMIN_USER, ADMIN_PASSWORD = "admin", "adminpw"
BASENAME = "mysql-bin"
SCHEMA = "app"
BIG_ROW_BYTES = 4000  # one WRITE_ROWS event per row of the big transaction, about this size
# SHOW SLAVE STATUS fields shown when a wait fails
_STATUS_FIELDS = ("Master_Port", "Master_Server_Id", "Slave_IO_Running", "Slave_SQL_Running", "Master_Log_File",
                  "Read_Master_Log_Pos", "Relay_Master_Log_File", "Exec_Master_Log_Pos", "Gtid_IO_Pos",
                  "Last_IO_Errno", "Last_IO_Error", "Last_SQL_Error")


class FailoverError(AssertionError):
    """A step or a wait of the lab failed; the message carries the state of the whole topology."""


def server(basedir: Path, server_id: int, *, read_only: bool = False) -> MariaDBSandbox:
    """A GTID MariaDB with binlog basename mysql-bin and log_slave_updates: M1 and every candidate."""
    return MariaDBSandbox(basedir, server_id=server_id, binlog_format="ROW", log_bin_name=BASENAME,
                          extra_config={"log_slave_updates": 1, "read_only": 1 if read_only else None})


# -- what an HA tool sends -----------------------------------------------------------------------------------------


def promote(candidate: MariaDBSandbox) -> None:
    """Make a replica the master, as orchestrator/MHA do: STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only=0."""
    for statement in ("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0"):
        candidate.execute(statement)


def _connect_relay(port: int, user: str, password: str) -> pymysql.connections.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user=user, password=password, connect_timeout=10,
                           read_timeout=60)


def relay_sql(port: int, statement: str, *, user: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> list[dict]:
    """One statement on the relay's --listen port (admin account by default); rows as dicts. pymysql errors pass."""
    with _connect_relay(port, user, password) as conn, conn.cursor() as cur:
        cur.execute(statement)
        columns = [d[0] for d in cur.description or ()]
        return [dict(zip(columns, row)) for row in cur.fetchall()]


def change_master_sql(port: int, *, host: str = "127.0.0.1", user: str = REPL_USER, password: str = REPL_PASSWORD,
                      use_gtid: str = "slave_pos", **options: Any) -> str:
    """CHANGE MASTER TO host:port by GTID for a MariaDB server (or the relay); ``options`` as ``ChangeMaster``'s."""
    return render_change_master(ChangeMaster.for_server("mariadb", host=host, port=port, user=user, password=password,
                                                        **options, gtid=use_gtid))


def repoint_relay(relay_sql_port: int, new_master_port: int, *, host: str = "127.0.0.1", user: str = REPL_USER,
                  password: str = REPL_PASSWORD, admin_user: str = ADMIN_USER,
                  admin_password: str = ADMIN_PASSWORD) -> None:
    """STOP SLAVE; CHANGE MASTER TO ... MASTER_USE_GTID=slave_pos; START SLAVE on the relay, in one admin session."""
    with _connect_relay(relay_sql_port, admin_user, admin_password) as conn, conn.cursor() as cur:
        cur.execute("STOP SLAVE")
        cur.execute(change_master_sql(new_master_port, host=host, user=user, password=password))
        cur.execute("START SLAVE")


def repoint_replica(replica: MariaDBSandbox, new_master_port: int, *, host: str = "127.0.0.1") -> None:
    """A MariaDB replica onto the new master by GTID (slave_pos), as an HA tool repoints its other replicas."""
    replica.execute("STOP SLAVE")
    replica.execute(change_master_sql(new_master_port, host=host, connect_retry=1, heartbeat_period=1))
    replica.execute("START SLAVE")


# -- GTIDs and waits -----------------------------------------------------------------------------------------------


def gtid_seqs(text: str | None) -> dict[int, int]:
    """'0-1-57,0-2-60,1-5-3' -> {0: 60, 1: 3}: the highest sequence number per domain (state or position)."""
    seqs: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        domain, _server, seq = (int(x) for x in part.split("-"))
        seqs[domain] = max(seqs.get(domain, 0), seq)
    return seqs


def covers(have: str | None, want: str | None) -> bool:
    """Every domain of `want` is at least as far in `have` (gtid_strict_mode: sequence numbers only grow)."""
    mine = gtid_seqs(have)
    return all(mine.get(domain, 0) >= seq for domain, seq in gtid_seqs(want).items())


def binlog_pos(server: MariaDBSandbox) -> str:
    return str(server.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])


def slave_pos(server: MariaDBSandbox) -> str:
    return str(server.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0])


def wait_until(what: str, probe: Callable[[], Any], timeout: float = 60.0,
               explain: Callable[[], str] | None = None) -> Any:
    """Poll `probe` until it returns something true (returned); exceptions from it count as 'not yet'.
    On timeout: FailoverError with the last value or error and `explain()` (the topology's state)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except (pymysql.MySQLError, OSError, KeyError, IndexError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise FailoverError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}"
                                + (f"\n{explain()}" if explain else ""))
        time.sleep(0.1)


# -- the workload --------------------------------------------------------------------------------------------------


class MixedLoad:
    """Deterministic mixed transactions: autocommit and BEGIN..COMMIT inserts (a unique `uid` per row, recorded in
    `inserted` once committed), updates, CREATE TABLE and ALTER TABLE ADD COLUMN once every 100. One object can
    write on M1 and then on the promoted master: uids and DDL names never repeat."""

    def __init__(self, seed: int = 11) -> None:
        self.random = random.Random(seed)
        self.next_uid = 1
        self.transactions = 0
        self.tables = ["t1", "t2", "t3"]
        self.inserted: dict[str, set[int]] = {t: set() for t in self.tables}

    def create_schema(self, master: MariaDBSandbox) -> None:
        master.execute(f"CREATE DATABASE IF NOT EXISTS {SCHEMA}")
        for table in [*self.tables, "big"]:
            self._create(master.execute, table)

    @staticmethod
    def _create(execute: Callable[[str], Any], table: str) -> None:
        execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.{table} (pk INT AUTO_INCREMENT PRIMARY KEY, "
                "uid BIGINT NOT NULL, v VARCHAR(4000) NOT NULL, n INT NOT NULL DEFAULT 0, KEY (uid)) ENGINE=InnoDB")

    def run(self, master: MariaDBSandbox, transactions: int, *, rotate_every: int = 0) -> None:
        conn = master.connect()
        try:
            cur = conn.cursor()
            for _ in range(transactions):
                self._one(cur, self.transactions)
                self.transactions += 1
                if rotate_every and self.transactions % rotate_every == 0:
                    cur.execute("FLUSH BINARY LOGS")
        finally:
            conn.close()

    def _insert(self, cur: Any, table: str, rows: int, pending: list[tuple[str, int]]) -> int:
        uids = list(range(self.next_uid, self.next_uid + rows))
        self.next_uid += rows
        cur.executemany(f"INSERT INTO {SCHEMA}.{table} (uid, v) VALUES (%s, %s)",
                        [(u, f"row {u} " + "x" * self.random.randint(0, 60)) for u in uids])
        pending += [(table, u) for u in uids]
        return uids[-1]

    def _one(self, cur: Any, n: int) -> None:
        pick = self.random.choice
        pending: list[tuple[str, int]] = []
        kind = n % 10
        if n % 100 == 9:
            table = f"d{n}"  # a new table, then rows in it
            self._create(cur.execute, table)
            self.tables.append(table)
            self.inserted[table] = set()
        elif n % 100 == 59:
            cur.execute(f"ALTER TABLE {SCHEMA}.{pick(self.tables)} ADD COLUMN c{n} INT NOT NULL DEFAULT {n}")
        elif kind in (1, 4, 7):
            a, b = pick(self.tables), pick(self.tables)
            cur.execute("BEGIN")
            last = self._insert(cur, a, 2, pending)
            self._insert(cur, b, 1, pending)
            cur.execute(f"UPDATE {SCHEMA}.{a} SET n = n + 1 WHERE uid = %s", (last,))
            cur.execute("COMMIT")
        elif kind == 3:
            cur.execute(f"UPDATE {SCHEMA}.{pick(self.tables)} SET n = n + 1, v = CONCAT(LEFT(v, 40), '+') "
                        "WHERE uid %% 7 = %s", (n % 7,))
        else:
            self._insert(cur, pick(self.tables), 1 + n % 3, pending)  # autocommit, one or more rows
        for table, uid in pending:
            self.inserted[table].add(uid)


def uids(server: MariaDBSandbox, table: str) -> tuple[int, set[int]]:
    """(row count, set of uids) of one table: count == len(set) when no insert was applied twice."""
    rows = server.execute(f"SELECT uid FROM {SCHEMA}.{table}")
    return len(rows), {int(r[0]) for r in rows}


def assert_every_insert_once(load: MixedLoad, server: MariaDBSandbox) -> None:
    """Every insert `load` committed is on `server`, none twice."""
    for table, inserted in load.inserted.items():
        count, found = uids(server, table)
        assert count == len(found), f"{table}: a row was applied twice on {server.basedir.name}"
        assert inserted <= found, f"{table}: {len(inserted - found)} committed inserts missing on {server.basedir.name}"


# -- relayproxy promote as an HA tool runs it ----------------------------------------------------------------------


def run_promote(workdir: Path, candidate_port: int, relay_ports: list[int], *extra: str, relay_user: str = ADMIN_USER,
                relay_password: str = ADMIN_PASSWORD, candidate_user: str = "root", candidate_password: str = "",
                timeout: float = 180.0) -> tuple[int, dict, str]:
    """`relayproxy promote --json` as a subprocess with password files (written in `workdir`) on 127.0.0.1; returns
    (exit code, its JSON document, its stderr). Later flags in `extra` override earlier ones (argparse)."""
    (workdir / "cand.pw").write_text(candidate_password + "\n")
    (workdir / "relay.pw").write_text(relay_password + "\n")
    command = [sys.executable, "-m", "relayproxy.commands.cli", "promote", "--json",
               "--candidate", f"127.0.0.1:{candidate_port}", "--candidate-user", candidate_user,
               "--candidate-password-file", str(workdir / "cand.pw"),
               *(a for port in relay_ports for a in ("--relay", f"127.0.0.1:{port}")),
               "--relay-user", relay_user, "--relay-password-file", str(workdir / "relay.pw"), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    print(done.stderr)
    try:
        document = json.loads(done.stdout)
    except ValueError:
        raise FailoverError(f"promote printed no JSON document (exit {done.returncode}):\n{done.stdout}\n"
                            f"{done.stderr}") from None
    print(json.dumps(document, indent=1))
    return done.returncode, document, done.stderr


def relay_file_bytes(relay_dir: Path) -> dict[str, bytes]:
    """A relay's files in index order, with their bytes."""
    names = (relay_dir / "relayproxy.index").read_text().split()
    return {name: (relay_dir / name).read_bytes() for name in names}


def first_difference(a: bytes, b: bytes) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at byte {i} ({len(a)} and {len(b)} bytes)"
    return f"one is a prefix of the other ({len(a)} and {len(b)} bytes)"


# -- the topology --------------------------------------------------------------------------------------------------


@dataclass
class HeldLink:
    """A fault proxy from M1 to one consumer, with the hold that stops it inside the big transaction."""

    proxy: ThreadedFaultProxy
    hold: MidTransactionHold


@dataclass
class Crash:
    """Where M1 died: positions in M1's coordinates, GTIDs as MariaDB prints them."""

    last_complete: tuple[str, int]
    gtid_before: str  # M1's gtid_binlog_pos before the big transaction: what every survivor holds
    big_gtid: str
    big_end: tuple[str, int]
    cut: int  # every link was held right after the event ending here


@dataclass
class FailoverLab:
    """M1, candidates R1 (and R4), the relay on M1, R2 and R3 behind the relay; see the module docstring."""

    workdir: Path
    candidates: int = 2  # 0: no R1; 1: R1; 2: R1 and R4
    relay_server_id: int = 100
    relay_extra: list[str] = field(default_factory=list)  # more `relayproxy run` flags
    m1: MariaDBSandbox = field(init=False)
    r1: MariaDBSandbox | None = field(init=False, default=None)
    r4: MariaDBSandbox | None = field(init=False, default=None)
    r2: MariaDBSandbox = field(init=False)
    r3: MariaDBSandbox = field(init=False)
    relay: RelayProcess | None = field(init=False, default=None)
    relay_port: int = field(init=False, default=0)
    links: dict[str, HeldLink] = field(init=False, default_factory=dict)
    load: MixedLoad = field(init=False, default_factory=MixedLoad)
    first_file: str = field(init=False, default="")
    more_relays: dict[str, tuple[RelayProcess, int]] = field(init=False, default_factory=dict)  # name: (relay, SQL port)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).absolute()
        self.m1 = server(self.workdir / "m1", 1)
        if self.candidates >= 1:
            self.r1 = server(self.workdir / "r1", 2, read_only=True)
        if self.candidates >= 2:
            self.r4 = server(self.workdir / "r4", 4, read_only=True)
        self.r2 = MariaDBSandbox(self.workdir / "r2", server_id=5, log_bin=False)
        self.r3 = MariaDBSandbox(self.workdir / "r3", server_id=6, log_bin=False)

    def servers(self) -> dict[str, MariaDBSandbox]:
        found = {"M1": self.m1, "R1": self.r1, "R4": self.r4, "R2": self.r2, "R3": self.r3}
        return {name: s for name, s in found.items() if s is not None}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start(self) -> Self:
        """Start everything, create the schema on M1, wire the replication, wait until all have M1's position."""
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two at a time: a 2-core machine
            for future in [pool.submit(s.start) for s in self.servers().values()]:
                future.result()
        self.m1.create_user(REPL_USER, REPL_PASSWORD)
        self.load.create_schema(self.m1)
        candidates = {"R1": self.r1, "R4": self.r4}
        for name in ["relay", *(n for n, s in candidates.items() if s is not None)]:
            proxy = ThreadedFaultProxy(self.m1.host, self.m1.port).start()
            self.links[name] = HeldLink(proxy, MidTransactionHold(proxy, name))
        self.relay_port = free_port()
        self.relay = RelayProcess(
            self.workdir / "relay", self.links["relay"].proxy.port, server_id=self.relay_server_id,
            gtid_mode="mariadb", extra=["--listen", f"127.0.0.1:{self.relay_port}",
                                        "--users", f"{REPL_USER}:{REPL_PASSWORD},{ADMIN_USER}:{ADMIN_PASSWORD}:admin",
                                        *self.relay_extra])
        self.relay.start()
        for name, candidate in candidates.items():
            if candidate is not None:
                _change_master(candidate, self.links[name].proxy.port, file=None)
                candidate.execute("START SLAVE")
        self.wait_caught_up_m1()
        self.first_file = relay_sql(self.relay_port, "SHOW BINARY LOGS")[0]["Log_name"]
        _change_master(self.r2, self.relay_port, file=None)
        _change_master(self.r3, self.relay_port, file=self.first_file, pos=4)
        for replica in (self.r2, self.r3):
            replica.execute("START SLAVE")
        self.wait_caught_up_m1()
        return self

    def close(self) -> None:
        """Stop every process (replicas first); each step runs even if an earlier one fails; idempotent."""
        steps: list[Callable[[], None]] = [
            *(lambda s=s: s.stop(timeout=15) for s in (self.r2, self.r3)),
            lambda: self.relay.stop() if self.relay else None,
            *(lambda r=relay: r.stop() for relay, _port in self.more_relays.values()),
            *(lambda link=link: link.proxy.stop() for link in self.links.values()),
            *(lambda s=s: s.stop(timeout=15) for s in (self.r4, self.r1, self.m1) if s is not None),
        ]
        problems = run_every_step(steps)
        if problems:
            raise FailoverError("could not stop everything cleanly: " + "; ".join(problems))

    def add_relay(self, name: str, server_id: int) -> tuple[RelayProcess, int]:
        """Another relay on M1 (started now, behind its own held link, same accounts and flags as the first);
        returns it with its --listen port. `kill_mid_transaction` holds and waits for it like the first."""
        if name in self.links or not name.startswith("relay"):
            raise ValueError(f"relay name {name!r}: must start with 'relay' and be new")
        proxy = ThreadedFaultProxy(self.m1.host, self.m1.port).start()
        self.links[name] = HeldLink(proxy, MidTransactionHold(proxy, name))
        port = free_port()
        relay = RelayProcess(
            self.workdir / name, proxy.port, server_id=server_id, gtid_mode="mariadb",
            extra=["--listen", f"127.0.0.1:{port}",
                   "--users", f"{REPL_USER}:{REPL_PASSWORD},{ADMIN_USER}:{ADMIN_PASSWORD}:admin", *self.relay_extra])
        self.more_relays[name] = (relay, port)
        relay.start()
        return relay, port

    # -- waits -------------------------------------------------------------------------------------------------

    def wait_caught_up_m1(self, replicas: list[MariaDBSandbox] | None = None, timeout: float = 60.0) -> None:
        """Before any switch: every relay's horizon and each replica's Exec position (default: every server
        replicating) are M1's current position (same names and offsets through the relay in M1's epoch)."""
        if replicas is None:
            replicas = [s for n, s in self.servers().items() if n != "M1" and s.running and replica_status(s)]
        with self.explained():
            for relay in [self.relay, *(r for r, _port in self.more_relays.values())]:
                wait_relay(relay, self.m1, timeout)
            for replica in replicas:
                wait_replica(replica, self.m1, timeout)

    def wait_converged(self, source: MariaDBSandbox, replicas: list[MariaDBSandbox] | None = None,
                       timeout: float = 60.0) -> str:
        """By GTID, from any master: the relay holds `source`'s gtid_binlog_pos (read afresh at every poll) without
        an upstream error, and each replica (default R2, R3) has applied it. Returns that position."""
        replicas = [self.r2, self.r3] if replicas is None else replicas

        def probe() -> str | None:
            want = binlog_pos(source)
            status = self.relay.status()
            if not covers(status["retrieved_gtid_set"], want) or status.get("last_io_error"):
                return None
            for replica in replicas:
                state = replica_status(replica)
                if "No" in (state.get("Slave_IO_Running"), state.get("Slave_SQL_Running")):
                    raise FailoverError(f"replica {replica.basedir.name} stopped: {state.get('Last_IO_Error')} "
                                        f"{state.get('Last_SQL_Error')}\n{self.describe()}")
                if not covers(slave_pos(replica), want):
                    return None
            return want

        return wait_until(f"the relay and {[r.basedir.name for r in replicas]} to hold the GTIDs of "
                          f"{source.basedir.name}", probe, timeout, self.describe)

    # -- the crash ----------------------------------------------------------------------------------------------

    def kill_mid_transaction(self, big_bytes: int = 4 << 20) -> Crash:
        """Commit one big transaction on M1 with every link held in its middle, kill -9 M1, drop the links."""
        self.wait_caught_up_m1()
        last_complete, gtid_before = master_status(self.m1), binlog_pos(self.m1)
        rows = max(2, big_bytes // BIG_ROW_BYTES)
        for link in self.links.values():
            link.hold.hold_after(last_complete[1] + rows * BIG_ROW_BYTES // 2)
            link.proxy.refuse(True)  # no reconnect can fetch the rest: a dead master refuses too
        self.m1.execute(f"INSERT INTO {SCHEMA}.big (uid, v) SELECT 1000000000 + seq, REPEAT('b', {BIG_ROW_BYTES}) "
                        f"FROM {SCHEMA}.seq_1_to_{rows}")
        big_end, big_gtid = master_status(self.m1), binlog_pos(self.m1)
        held = {name: link.hold.wait_held(60)[1].log_pos for name, link in self.links.items()}
        cut = held["relay"]
        if set(held.values()) != {cut} or not last_complete[1] < cut < big_end[1] or big_end[0] != last_complete[0]:
            raise FailoverError(f"links held at {held}, not at one point inside the big transaction "
                                f"{last_complete}..{big_end}")
        for relay in [self.relay, *(r for r, _port in self.more_relays.values())]:
            relay.wait_for(lambda s: s.get("master_position") == {"file": big_end[0], "position": cut}, 30,
                           f"{relay.relay_dir.name} to receive the first half of the big transaction")
        for name in held.keys() - {"relay", *self.more_relays}:
            replica = self.r1 if name == "R1" else self.r4
            wait_until(f"{name} to read up to {cut}",
                       lambda r=replica: int(replica_status(r)["Read_Master_Log_Pos"]) == cut, 30, self.describe)
        self.m1.kill()
        for link in self.links.values():
            link.proxy.drop_connections()
        return Crash(last_complete, gtid_before, big_gtid, big_end, cut)

    # -- what it looks like ----------------------------------------------------------------------------------------

    def relay_files(self) -> dict[str, int]:
        """The relay's binlog files in index order, with their sizes."""
        names = (self.relay.relay_dir / "relayproxy.index").read_text().split()
        return {name: (self.relay.relay_dir / name).stat().st_size for name in names}

    def describe(self) -> str:
        """Everyone's replication state, the relay's /status, SHOW SLAVE STATUS and log tail (for failures)."""
        lines = []
        for name, s in self.servers().items():
            if not s.running:
                lines.append(f"{name} :{s.port} down")
                continue
            try:
                status = replica_status(s)
                lines.append(f"{name} :{s.port} binlog_pos {binlog_pos(s)!r} slave_pos {slave_pos(s)!r} "
                             + str({k: status.get(k) for k in _STATUS_FIELDS if k in status}))
            except (pymysql.MySQLError, OSError) as exc:
                lines.append(f"{name} :{s.port} did not answer: {exc!r}")
        if self.relay is not None:
            with contextlib.suppress(Exception):
                status = self.relay.status()
                lines.append("relay /status " + str({k: status.get(k) for k in (
                    "master_host", "master_port", "master_server_id", "io_running", "last_io_error",
                    "master_log_file", "read_master_log_pos", "retrieved_gtid_set", "master_position")}))
            with contextlib.suppress(Exception):
                row = relay_sql(self.relay_port, "SHOW SLAVE STATUS")[0]
                lines.append("relay SHOW SLAVE STATUS " + str({k: row.get(k) for k in _STATUS_FIELDS if k in row}))
            with contextlib.suppress(Exception):
                lines.append(f"relay files {self.relay_files()}")
            tail = self.relay.log_tail(25).splitlines()
            lines.append("relay log tail:\n" + "\n".join(line[:400] for line in tail))
        return "\n".join(lines)

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """Any AssertionError raised inside gets the topology's state appended to its message."""
        try:
            yield
        except AssertionError as exc:
            if not isinstance(exc, FailoverError) and exc.args and "--- topology ---" not in str(exc.args[0]):
                exc.args = (f"{exc.args[0]}\n--- topology ---\n{self.describe()}", *exc.args[1:])
            raise
