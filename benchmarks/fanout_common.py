"""The fan-out benchmarks' shared pieces (fanout.py, fanout_ceiling.py; soak.py and archive_lag.py use some): the
master's settings, the replica account, the relay (``relayproxy run --listen``), cheap dump clients in a helper process
and the paced writer."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import threading
import time
from pathlib import Path

from benchmarks.common import logger
from relayproxy.lab.relayprocess import RelayProcess
from relayproxy.lab.relayprocess import master_status as master_end  # noqa: F401 (the master's (file, position))
from relayproxy.upstream.connection import UpstreamConnection

REPL_USER, REPL_PASSWORD = "repl", "replpw"
OLTP_PAD = 200  # as relay_catchup.py: ~150-byte events on average
MASTER_CONFIG = {  # performance_schema: the master's dump threads' OS thread ids (fanout.py)
    "sync_binlog": 0,
    "innodb_flush_log_at_trx_commit": 0,
    "innodb_buffer_pool_size": "256M",
    "innodb_doublewrite": 0,
    "max_connections": 2000,
    "rpl_semi_sync_master_enabled": 0,
    "performance_schema": "ON",
}
USERS_TOML = f"""
[[users]]
name = "{REPL_USER}"
password = "{REPL_PASSWORD}"
plugin = "mysql_native_password"
"""

log = logger("fanout")


class Relay(RelayProcess):
    """`relayproxy run --listen` with the relay's own defaults, the account of ``users_toml`` (``--config``) and
    ``options`` (``--relay-option KEY=VALUE`` pairs) as flags, in its own session."""

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
    """A dump client logged in as a MariaDB replica (checksum, capability 4, COM_REGISTER_SLAVE), ready to dump."""
    conn = await UpstreamConnection.connect("127.0.0.1", port, REPL_USER, REPL_PASSWORD, ssl_mode="disabled",
                                            connect_timeout=connect_timeout)
    await conn.query("SET @master_binlog_checksum=@@global.binlog_checksum")
    await conn.query("SET @mariadb_slave_capability=4")
    await conn.register_slave(server_id)
    return conn


# -- cheap dump clients in a helper process (fanout.py's sweep, fanout_ceiling.py) ---------------------------------

def _discard_loop(fd: int, counter: list[int], stop: threading.Event) -> None:
    """Receive and drop a dump's bytes with recv(MSG_TRUNC): for TCP the kernel frees them without copying them."""
    sock = socket.socket(fileno=fd)
    sock.settimeout(0.2)
    buf = bytearray(1 << 20)
    try:
        while not stop.is_set():
            try:
                got = sock.recv_into(buf, len(buf), socket.MSG_TRUNC)
            except TimeoutError:
                continue
            except OSError:
                break
            if got == 0:
                break
            counter[0] += got
    finally:
        sock.close()


class _CountingProtocol(asyncio.Protocol):
    def __init__(self, got: dict, lost: asyncio.Future) -> None:
        self.got, self.lost = got, lost

    def data_received(self, data: bytes) -> None:
        self.got["bytes"] += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc or ConnectionError("connection closed"))


def idle_clients_main(port: int, start: tuple[str, int], n: int, first_id: int, conn, discard: bool = False,
                      hold: bool = False) -> None:
    """n cheap dump clients in one asyncio loop: log in, dump from start, count what arrives and drop it (a
    protocol that parses nothing; ``discard``: a thread per socket reads with ``_discard_loop``, cheaper still).
    ``hold``: the clients log in and register, then wait for "go" to ask for their dumps (``IdleClients.go``)."""
    asyncio.run(_idle_clients(port, start, n, first_id, conn, discard, hold))


async def _idle_clients(port, start, n, first_id, conn, discard, hold) -> None:
    loop = asyncio.get_running_loop()
    got: dict = {"bytes": 0, "errors": []}
    conns, counters, threads, registered, ready = [], [], [], [], []
    stop = threading.Event()
    sem = asyncio.Semaphore(50)
    go = asyncio.Event()

    async def one(i: int) -> None:
        try:
            async with sem:
                c = await replica_login(port, first_id + i, connect_timeout=120)
                conns.append(c)
            registered.append(i)
            await go.wait()
            await c.binlog_dump(start[0], start[1], first_id + i)
        except Exception as exc:  # noqa: BLE001 - reported
            got["errors"].append(f"{i}: {exc!r}")
            return
        ready.append(i)
        transport = c._protocol.transport
        if discard:
            transport.pause_reading()
            counters.append(counter := [0])
            fd = os.dup(transport.get_extra_info("socket").fileno())
            threads.append(threading.Thread(target=_discard_loop, args=(fd, counter, stop), daemon=True))
            threads[-1].start()
            return
        lost = loop.create_future()
        transport.set_protocol(_CountingProtocol(got, lost))
        exc = await lost
        got["errors"].append(f"{i} reading: {exc!r}")

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    while hold and len(registered) + len(got["errors"]) < n:
        await asyncio.sleep(0.01)
    if hold:
        conn.send({"registered": len(registered)})
        await loop.run_in_executor(None, conn.recv)  # "go"
    go.set()
    while len(ready) + len(got["errors"]) < n:
        await asyncio.sleep(0.002 if hold else 0.05)
    conn.send({"ready": len(ready), "errors": got["errors"][:5]})
    while await loop.run_in_executor(None, conn.recv) == "count":
        conn.send(got["bytes"] + sum(c[0] for c in counters))
    stop.set()
    for thread in threads:
        thread.join(2)
    got["bytes"] += sum(c[0] for c in counters)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in conns:
        c.abort()
    conn.send({"bytes": got["bytes"], "errors": got["errors"][:5], "error_count": len(got["errors"])})


class IdleClients:
    """``idle_clients_main`` in a spawned process. Server ids from ``first_id`` on: two groups of clients need
    distinct ones (a server ends an older dump of the same id)."""

    def __init__(self, port: int, start: tuple[str, int], n: int, first_id: int = 20000, discard: bool = False,
                 hold: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=idle_clients_main, args=(port, start, n, first_id, child, discard, hold),
                                daemon=True)
        self.proc.start()
        child.close()
        self.ready = self.parent.recv()

    def go(self) -> None:
        """Held clients ask for their dumps now (``wait_started`` waits until every one has)."""
        self.parent.send("go")

    def wait_started(self) -> None:
        self.ready = self.parent.recv()

    def received(self) -> int:
        self.parent.send("count")
        return self.parent.recv()

    def stop(self) -> dict:
        self.parent.send("stop")
        got = self.parent.recv() if self.parent.poll(60) else {"error": "no answer"}
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
        return got


# -- the paced OLTP writer (fanout.py, archive_lag.py) --------------------------------------------------------

LOADS = {  # the writer's loads: the table each one writes to
    "oltp": "CREATE TABLE bench.oltp (id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, "
            "c VARCHAR(255) NOT NULL) ENGINE=InnoDB",
    "bulk": "CREATE TABLE bench.bulk (id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, "
            "b BLOB NOT NULL) ENGINE=InnoDB",
}


def _one_transaction(cur, load: str, i: int, pad_a: str, pad_b: str) -> None:
    """Transaction ``i``: "oltp" alternates an autocommit insert and an insert + update; "bulk" is one 8 KB row."""
    if load == "bulk":
        cur.execute("INSERT INTO bench.bulk (k, b) VALUES (%s, REPEAT(MD5(%s), 250))", (i, i))
    elif i % 2 == 0:
        cur.execute("INSERT INTO bench.oltp (k, c) VALUES (%s, %s)", (i, pad_a))
    else:
        cur.execute("START TRANSACTION")
        cur.execute("INSERT INTO bench.oltp (k, c) VALUES (%s, %s)", (i, pad_b))
        cur.execute("UPDATE bench.oltp SET k = k + 1 WHERE id = LAST_INSERT_ID()")
        cur.execute("COMMIT")


def writer_main(port: int, load: str, schedule: list[tuple[float, float]], record: bool, conn) -> None:
    """One writer process: after "go", ``load`` transactions at each (rate, seconds) of ``schedule`` (falling behind,
    it does not burst); sends back t0, t_end, the count and, if ``record``, each (gtid seq_no, row id, commit time)."""
    import pymysql

    db = pymysql.connect(host="127.0.0.1", port=port, user="root", password="", autocommit=True, database="bench")
    cur = db.cursor()
    pad_a = ("oltp-autocommit-" * 20)[:OLTP_PAD]
    pad_b = ("oltp-multi-stmt-" * 20)[:OLTP_PAD]
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
            if record:
                t_commit = time.monotonic()
                cur.execute("SELECT @@last_gtid, LAST_INSERT_ID()")
                gtid, row_id = cur.fetchone()
                commits.append((int(gtid.rsplit("-", 1)[1]), int(row_id), t_commit))
            i += 1
            next_at += interval
        step_start = end
    db.close()
    conn.send({"t0": t0, "t_end": time.monotonic(), "trx": i, "commits": commits})
    conn.close()


class Writers:
    """``writers`` spawned processes (one connection each) sharing the schedule's rate; ``go()`` starts them,
    ``result()`` merges what they did."""

    def __init__(self, port: int, load: str, schedule: list[tuple[float, float]], *, writers: int = 1,
                 record: bool = False) -> None:
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
