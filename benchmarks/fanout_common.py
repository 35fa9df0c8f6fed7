"""The fan-out benchmarks' shared pieces (benchmarks/fanout.py runs them): the master's settings, the replica
account, the relay as they run it (``relayproxy run --listen`` through ``relayproxy.lab.relayprocess``), a dump
client's login, the paced writer, the log line and a markdown row."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from benchmarks.common import logger
from relayproxy.lab.relayprocess import RelayProcess
from relayproxy.lab.relayprocess import master_status as master_end  # noqa: F401 (the master's (file, position))
from relayproxy.upstream.connection import UpstreamConnection

REPL_USER, REPL_PASSWORD = "repl", "replpw"
OLTP_PAD = 200  # as relay_catchup.py: ~150-byte events on average
BINLOG_SEND_ANNOTATE_ROWS_EVENT = 2  # COM_BINLOG_DUMP flag: what a MariaDB replica with log_slave_updates asks
MASTER_CONFIG = {
    "sync_binlog": 0,
    "innodb_flush_log_at_trx_commit": 0,
    "innodb_buffer_pool_size": "256M",
    "innodb_doublewrite": 0,
    "max_connections": 1000,
    "rpl_semi_sync_master_enabled": 0,
}
USERS_TOML = f"""
[[users]]
name = "{REPL_USER}"
password = "{REPL_PASSWORD}"
plugin = "mysql_native_password"
"""

log = logger("fanout")


# candidate for benchmarks/common.py
def md_row(*cells) -> str:
    """One row of a markdown table ("| a | b |"; an empty cell is "|  |")."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


class Relay(RelayProcess):
    """`relayproxy run --listen` as the fan-out benchmarks run it: the relay's own defaults (no test timings),
    replicas served on ``listen_port`` with the account of ``users_toml`` (``--config``), ``options`` (the
    ``--relay-option KEY=VALUE`` pairs) as flags, in its own session."""

    def __init__(self, work: Path, master, options: list[tuple[str, str]] | None = None, *,
                 users_toml: str = USERS_TOML, extra: list[str] | None = None) -> None:
        config = work / "relay.toml"
        config.write_text(users_toml)
        flags = [arg for key, value in options or () for arg in ("--" + key.replace("_", "-"), value)]
        super().__init__(
            work / "relay", master.port, user=REPL_USER, password=REPL_PASSWORD, gtid_mode=None,
            heartbeat_period=None, reconnect_max_delay=None, listen=True, config=config, extra=[*flags, *(extra or [])],
            log_path=work / "relay.log", new_session=True, error=RuntimeError,
        )

    def start(self, timeout: float = 60.0) -> "Relay":
        super().start(timeout)
        return self

    def stop(self, timeout: float = 60.0) -> int | None:
        return super().stop(timeout)


async def replica_login(port: int, server_id: int, *, connect_timeout: float = 60.0) -> UpstreamConnection:
    """A dump client logged in as a MariaDB replica logs in (the master's checksum, MariaDB capability 4,
    COM_REGISTER_SLAVE with ``server_id``), ready for its COM_BINLOG_DUMP."""
    conn = await UpstreamConnection.connect("127.0.0.1", port, REPL_USER, REPL_PASSWORD, ssl_mode="disabled",
                                            connect_timeout=connect_timeout)
    await conn.query("SET @master_binlog_checksum=@@global.binlog_checksum")
    await conn.query("SET @mariadb_slave_capability=4")
    await conn.register_slave(server_id)
    return conn


# -- the paced OLTP writer (fanout_inprocess, fanout_real, archive_lag) ------------------------------------------

LOADS = {  # the writer's loads: the table each one writes to
    "oltp": "CREATE TABLE bench.oltp (id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, "
            "c VARCHAR(255) NOT NULL) ENGINE=InnoDB",
    "bulk": "CREATE TABLE bench.bulk (id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, "
            "b BLOB NOT NULL) ENGINE=InnoDB",
}
RECORDS = {  # what the writer asks after each commit, and how it records the answer (with the commit time)
    None: None,
    "gtid": "SELECT @@last_gtid",
    "gtid+row": "SELECT @@last_gtid, LAST_INSERT_ID()",
}


def _one_transaction(cur, load: str, i: int, pad_a: str, pad_b: str) -> None:
    """Transaction ``i`` of the load: "oltp" alternates an autocommit insert and an insert + update transaction;
    "bulk" is one ~8 KB row insert."""
    if load == "bulk":
        cur.execute("INSERT INTO bench.bulk (k, b) VALUES (%s, REPEAT(MD5(%s), 250))", (i, i))
    elif i % 2 == 0:
        cur.execute("INSERT INTO bench.oltp (k, c) VALUES (%s, %s)", (i, pad_a))
    else:
        cur.execute("START TRANSACTION")
        cur.execute("INSERT INTO bench.oltp (k, c) VALUES (%s, %s)", (i, pad_b))
        cur.execute("UPDATE bench.oltp SET k = k + 1 WHERE id = LAST_INSERT_ID()")
        cur.execute("COMMIT")


def writer_main(port: int, load: str, schedule: list[tuple[float, float]], record: str | None, conn) -> None:
    """One writer process: after "go" on ``conn``, ``load`` transactions on the master at each (rate, seconds) of
    ``schedule`` (falling behind, it keeps the rate and does not burst); sends back t0, t_end, the count and, when
    ``record``, each commit as (gtid seq_no, commit time) or (gtid seq_no, row id, commit time)."""
    import pymysql

    db = pymysql.connect(host="127.0.0.1", port=port, user="root", password="", autocommit=True, database="bench")
    cur = db.cursor()
    pad_a = ("oltp-autocommit-" * 20)[:OLTP_PAD]
    pad_b = ("oltp-multi-stmt-" * 20)[:OLTP_PAD]
    query = RECORDS[record]
    commits: list[tuple] = []
    conn.send("ready")
    conn.recv()  # go
    t0 = step_start = time.monotonic()
    i = 0
    for rate, seconds in schedule:
        interval, next_at, end = 1.0 / rate, step_start, step_start + seconds
        while (now := time.monotonic()) < end:
            if now < next_at:
                time.sleep(next_at - now)
            elif now - next_at > 0.1:
                next_at = now  # fell behind (a busy machine): keep the rate, do not burst to catch up
            _one_transaction(cur, load, i, pad_a, pad_b)
            if query is not None:
                t_commit = time.monotonic()
                cur.execute(query)
                row = cur.fetchone()
                seq = int(row[0].rsplit("-", 1)[1])
                commits.append((seq, t_commit) if len(row) == 1 else (seq, int(row[1]), t_commit))
            i += 1
            next_at += interval
        step_start = end
    db.close()
    conn.send({"t0": t0, "t_end": time.monotonic(), "trx": i, "commits": commits})
    conn.close()


class Writers:
    """The load: ``writers`` processes (one connection each, spawned, so the benchmark's own CPU use cannot delay
    their commits) sharing the schedule's rate; ``go()`` starts them, ``result()`` merges what they did."""

    def __init__(self, port: int, load: str, schedule: list[tuple[float, float]], *, writers: int = 1,
                 record: str | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        share = [(rate / writers, seconds) for rate, seconds in schedule]
        self.parents, self.procs = [], []
        for _ in range(writers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=writer_main, args=(port, load, share, record, child), daemon=True)
            proc.start()
            child.close()
            self.parents.append(parent)
            self.procs.append(proc)
        for parent in self.parents:
            if parent.recv() != "ready":
                raise RuntimeError("writer did not start")

    def go(self) -> None:
        for parent in self.parents:
            parent.send("go")

    def result(self) -> dict:
        """t0 (the first start), t_end (the last end), trx (all of them) and the commits in commit-time order."""
        got = [parent.recv() for parent in self.parents]
        for proc in self.procs:
            proc.join(10)
        commits = sorted((c for g in got for c in g["commits"]), key=lambda c: c[-1])
        return {"t0": min(g["t0"] for g in got), "t_end": max(g["t_end"] for g in got),
                "trx": sum(g["trx"] for g in got), "commits": commits}
