"""Fan-out with real external clients (``benchmarks/fanout.py --real``): mariadb-binlog processes and MariaDB
replicas following the relay or the master, relay vs. direct (the module docstring of benchmarks/fanout.py says what
is measured and how). CPU and memory readings: ``relayproxy.lab.procstat``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pymysql

from benchmarks import benchinfo
from benchmarks.common import RESULTS_DIR, percentile, save_figure
from benchmarks.fanout_common import (
    MASTER_CONFIG,
    REPL_PASSWORD,
    REPL_USER,
    LOADS,
    Relay,
    Writers,
    log,
    machine_info,
    master_end,
)
from relayproxy.downstream.sql.replication_parser import ChangeMaster, render_change_master
from relayproxy.lab.procstat import pids_cpu, threads_cpu, tree_cpu, tree_memory_kb
from relayproxy.lab.sandbox import MariaDBSandbox
from relayproxy.upstream.connection import UpstreamConnection

_u64_unpack_from = struct.Struct("<Q").unpack_from


# =============================================================================================
# Real external clients (--real): mariadb-binlog processes and MariaDB replicas, relay vs. direct
# =============================================================================================
REAL_MASTER_CONFIG = {**MASTER_CONFIG, "performance_schema": "ON", "max_connections": 2000}
REPLICA_CONFIG = {
    "sync_binlog": 0,
    "innodb_flush_log_at_trx_commit": 0,
    "innodb_buffer_pool_size": "32M",
    "innodb_doublewrite": 0,
    "relay_log_purge": 0,  # relay log growth is one of the delivered-bytes measures
    "performance_schema": "OFF",
    "slave_net_timeout": 60,
}
BULK_BYTES = 8000  # REPEAT(MD5(k), 250): an 8 KB row event from a short statement (the ANNOTATE_ROWS stays small)
DEFAULT_RATES = {"oltp": 300.0, "bulk": 25.0}
CEILING_STEPS = {"oltp": (100.0, 200.0, 300.0, 450.0, 600.0), "bulk": (40.0, 80.0, 160.0, 320.0, 640.0)}  # trx/s
SWEEP_COUNTS = (1, 10, 50, 100, 300, 1000)
SWEEP_STREAMING_MAX = 100  # beyond this many clients the rest are cheap asyncio dump clients (read and discard)
REAL_PHASE_ORDERS = (("relay", "direct"), ("direct", "relay"))  # alternated over the repeats


# --- small statistics helpers (kept here and tiny so that benchinfo's, when they exist, can replace them) ---
def spread(values: list[float | None]) -> dict:
    """median, min, max and n of the values that exist (None when there are none)."""
    vals = sorted(v for v in values if v is not None and v == v)
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(vals), 4), "min": round(vals[0], 4), "max": round(vals[-1], 4),
            "n": len(vals)}


def fmt_spread(s: dict | None, digits: int = 2) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s["n"] == 1:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def lag_summary(lags: list[float]) -> dict:
    lags = sorted(lags)
    if not lags:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    return {"n": len(lags), **{k: round(percentile(lags, q) * 1000, 2) for k, q in (("p50", 50), ("p90", 90),
                                                                                    ("p99", 99))},
            "max": round(lags[-1] * 1000, 2)}


# --- the master's dump threads (their CPU: relayproxy.lab.procstat.threads_cpu) ---
def dump_thread_ids(master: MariaDBSandbox, after_connection_id: int = 0) -> list[int]:
    """OS thread ids of the master's binlog dump threads serving connections newer than after_connection_id
    (performance_schema, which the benchmark turns on). Connection ids only grow, while OS threads are cached and
    reused by later connections, and a gone client's dump thread lingers until it next writes: the connection id
    is what tells this phase's dump threads from an earlier phase's."""
    rows = master.execute("SELECT THREAD_OS_ID FROM performance_schema.threads "
                          "WHERE PROCESSLIST_COMMAND LIKE 'Binlog Dump%%' AND THREAD_OS_ID IS NOT NULL "
                          "AND PROCESSLIST_ID > %s", (after_connection_id,))
    return sorted(int(r[0]) for r in rows)


def last_connection_id(master: MariaDBSandbox) -> int:
    return int(master.execute("SELECT COALESCE(MAX(PROCESSLIST_ID), 0) FROM performance_schema.threads")[0][0])


def _writers_text(n: int) -> str:
    return "its own process" if n == 1 else f"{n} processes, one connection each, sharing the rate"


# --- clients ---
class BinlogClient:
    """`mariadb-binlog --read-from-remote-server --raw --stop-never` writing into its own directory."""

    def __init__(self, index: int, port: int, start: tuple[str, int], out_dir: Path) -> None:
        self.index = index
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self.cmd = [
            shutil.which("mariadb-binlog") or "mariadb-binlog", "--read-from-remote-server", "--raw", "--stop-never",
            "--host=127.0.0.1", f"--port={port}", f"--user={REPL_USER}", f"--password={REPL_PASSWORD}",
            f"--stop-never-slave-server-id={5000 + index}", f"--result-file={out_dir}/",
            f"--start-position={start[1]}", start[0],
        ]
        self.proc: subprocess.Popen | None = None
        self._err = None

    def start(self) -> None:
        self._err = open(self.out_dir.parent / f"{self.out_dir.name}.err", "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._err, stderr=subprocess.STDOUT)

    def size(self) -> int:
        total = 0
        try:
            with os.scandir(self.out_dir) as it:
                for e in it:
                    total += e.stat().st_size
        except OSError:
            pass
        return total

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def error_text(self) -> str:
        try:
            return (self.out_dir.parent / f"{self.out_dir.name}.err").read_text(errors="replace")[-500:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._err is not None:
            self._err.close()
            self._err = None


class Replica:
    """A real MariaDB replica (sandbox, no binlog of its own) pointed by file/position at the relay or master."""

    def __init__(self, index: int, work: Path) -> None:
        self.index = index
        self.server = MariaDBSandbox(work / f"replica{index}", server_id=10 + index, log_bin=False,
                                     binlog_format="ROW", extra_config=REPLICA_CONFIG)

    def start(self) -> None:
        self.server.start()
        self.server.execute("CREATE DATABASE IF NOT EXISTS bench")
        for ddl in LOADS.values():
            self.server.execute(ddl)

    def point(self, port: int, start: tuple[str, int], timeout: float = 60.0) -> None:
        s = self.server
        s.execute("STOP SLAVE")
        s.execute(render_change_master(ChangeMaster.for_server(
            "mariadb", host="127.0.0.1", port=port, user=REPL_USER, password=REPL_PASSWORD, log_file=start[0],
            log_pos=start[1], gtid=False, connect_retry=1)))
        s.execute("START SLAVE")
        deadline = time.monotonic() + timeout
        while True:
            st = self.slave_status()
            if st.get("Slave_IO_Running") == "Yes" and st.get("Slave_SQL_Running") == "Yes":
                return
            if time.monotonic() > deadline:
                keys = ("Slave_IO_Running", "Slave_SQL_Running", "Last_IO_Error", "Last_SQL_Error")
                raise RuntimeError(f"replica {self.index} did not start replicating from port {port}: "
                                   f"{ {k: st.get(k) for k in keys} }")
            time.sleep(0.05)

    def slave_status(self) -> dict:
        with self.server.connect().cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
            cur.connection.close()
        return row or {}

    def at(self, end: tuple[str, int]) -> bool:
        st = self.slave_status()
        return st.get("Relay_Master_Log_File") == end[0] and int(st.get("Exec_Master_Log_Pos") or 0) == end[1]

    def stop_slave(self) -> None:
        self.server.execute("STOP SLAVE")

    def relay_log_bytes(self) -> int:
        total = 0
        for p in self.server.datadir.glob("relay-bin.[0-9]*"):
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return total

    @property
    def pid(self) -> int | None:
        return self.server.pid


def _discard_loop(fd: int, counter: list[int], stop: threading.Event) -> None:
    """Receive and drop a dump's bytes with recv(MSG_TRUNC): for TCP the kernel frees them without copying them
    to this process, so the client costs almost nothing besides the server's own send."""
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


def idle_clients_main(port: int, start: tuple[str, int], n: int, first_id: int, conn, discard: bool = False,
                      hold: bool = False) -> None:
    """n cheap dump clients in one asyncio loop: connect, register, dump from start, read and discard. ``discard``:
    once the dump has started, each socket is read by a thread with recv(MSG_TRUNC) (``_discard_loop``), which
    does not even copy the bytes: the cheapest client there is, for measuring a server's egress ceiling.
    ``hold``: every client logs in and registers, then waits for "go" before it asks for its dump, so that the
    clients of several processes start their dumps together (``IdleClients.go``)."""
    counters: list[list[int]] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []

    async def main() -> None:
        got = {"bytes": 0, "errors": []}
        conns: list[UpstreamConnection] = []
        sem = asyncio.Semaphore(50)
        go = asyncio.Event()
        registered: list[int] = []
        if not hold:
            go.set()

        async def one(i: int) -> None:
            try:
                async with sem:
                    c = await UpstreamConnection.connect("127.0.0.1", port, REPL_USER, REPL_PASSWORD,
                                                         ssl_mode="disabled", connect_timeout=120)
                    conns.append(c)
                    await c.query("SET @master_binlog_checksum=@@global.binlog_checksum")
                    await c.query("SET @mariadb_slave_capability=4")
                    await c.register_slave(first_id + i)
                registered.append(i)
                await go.wait()
                await c.binlog_dump(start[0], start[1], first_id + i)
            except Exception as exc:  # noqa: BLE001 - reported
                got["errors"].append(f"{i}: {exc!r}")
                return
            ready.append(i)
            if discard:
                transport = c._protocol.transport
                transport.pause_reading()
                counter = [0]
                counters.append(counter)
                thread = threading.Thread(target=_discard_loop, daemon=True,
                                          args=(os.dup(transport.get_extra_info("socket").fileno()), counter, stop))
                threads.append(thread)
                thread.start()
                return
            # From here on only count what arrives: hand the socket to a protocol that parses nothing, so that
            # hundreds of these cost little CPU (the relay still frames and sends every event to each).
            lost = asyncio.get_running_loop().create_future()
            c._protocol.transport.set_protocol(_CountingProtocol(got, lost))
            try:
                exc = await lost
            except asyncio.CancelledError:
                raise
            if exc is not None:
                got["errors"].append(f"{i} reading: {exc!r}")

        ready: list[int] = []
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        if hold:
            while len(registered) + len(got["errors"]) < n:
                await asyncio.sleep(0.01)
            conn.send({"registered": len(registered)})
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # "go"
            go.set()
        while len(ready) + len(got["errors"]) < n:
            await asyncio.sleep(0.05 if not hold else 0.002)
        conn.send({"ready": len(ready), "errors": got["errors"][:5]})
        while await asyncio.get_running_loop().run_in_executor(None, conn.recv) == "count":
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

    asyncio.run(main())


class _CountingProtocol(asyncio.Protocol):
    def __init__(self, got: dict, lost: asyncio.Future) -> None:
        self.got, self.lost = got, lost

    def data_received(self, data: bytes) -> None:
        self.got["bytes"] += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc or ConnectionError("connection closed"))


class IdleClients:
    def __init__(self, port: int, start: tuple[str, int], n: int, first_id: int = 20000, discard: bool = False,
                 hold: bool = False) -> None:
        """``hold``: the clients log in and register, then wait for ``go()`` to ask for their dumps."""
        ctx = multiprocessing.get_context("spawn")
        self.parent, child = ctx.Pipe()
        # server_ids first_id.. : two groups of clients need distinct ones (a server ends an older dump of the same id)
        self.proc = ctx.Process(target=idle_clients_main, args=(port, start, n, first_id, child, discard, hold),
                                daemon=True)
        self.proc.start()
        child.close()
        self.n = n
        self.ready = self.parent.recv()

    def go(self) -> None:
        """Held clients ask for their dumps now (``wait_started`` then waits until every one has)."""
        self.parent.send("go")

    def wait_started(self) -> None:
        self.ready = self.parent.recv()

    def received(self) -> int:
        """Bytes all these clients have received so far."""
        self.parent.send("count")
        return self.parent.recv()

    def stop(self) -> dict:
        self.parent.send("stop")
        got = self.parent.recv() if self.parent.poll(60) else {"error": "no answer"}
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
        return got


# --- lag watchers (threads in this process) ---
class TailLag(threading.Thread):
    """Tails the raw binlog output of a few mariadb-binlog clients; notes when each transaction's XID arrived
    (at this poller's resolution, --tail-interval)."""

    def __init__(self, dirs: dict[int, Path], interval: float) -> None:
        super().__init__(daemon=True)
        self.dirs = dirs
        self.interval = interval
        self.arrivals: dict[int, list[tuple[int, float]]] = {k: [] for k in dirs}
        self._files: dict[Path, list] = {}  # path -> [offset, pending bytes, seq]
        self._halt = threading.Event()

    def run(self) -> None:
        monotonic = time.monotonic
        last_list = 0.0
        names: dict[int, list[Path]] = {k: [] for k in self.dirs}
        while not self._halt.is_set():
            now = monotonic()
            if now - last_list > 0.05:
                for k, d in self.dirs.items():
                    try:
                        names[k] = sorted(d.iterdir())
                    except OSError:
                        names[k] = []
                last_list = now
            for k, paths in names.items():
                for path in paths:
                    self._read(k, path, now)
            self._halt.wait(self.interval)
        now = monotonic()
        for k, d in self.dirs.items():
            for path in sorted(d.iterdir()):
                self._read(k, path, now)

    def _read(self, k: int, path: Path, now: float) -> None:
        st = self._files.get(path)
        if st is None:
            st = self._files[path] = [0, b"", None]  # bytes read so far, bytes not parsed yet, last GTID seq
        try:
            size = os.stat(path).st_size
        except OSError:
            return
        if size <= st[0] or size < 4:
            return
        with open(path, "rb") as f:
            f.seek(st[0])
            data = f.read(size - st[0])
        first = st[0] == 0
        st[0] += len(data)
        buf = st[1] + data
        if first:
            buf = buf[4:]  # the file's magic
        seq = st[2]
        out = self.arrivals[k]
        i = 0
        n = len(buf)
        while n - i >= 19:
            size_ev = int.from_bytes(buf[i + 9:i + 13], "little")
            if size_ev < 19:
                raise RuntimeError(f"{path}: event of {size_ev} bytes at {st[0] - n + i}")
            if n - i < size_ev:
                break
            t = buf[i + 4]
            if t == 162:
                seq = _u64_unpack_from(buf, i + 19)[0]
            elif t == 16 and seq is not None:
                out.append((seq, now))
            i += size_ev
        st[1] = buf[i:]
        st[2] = seq

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class ReplicaPoller(threading.Thread):
    """Every interval, SELECT MAX(id) on each replica: when a row id first shows, its transaction has been applied."""

    def __init__(self, replicas: list[Replica], table: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.replicas = replicas
        self.table = table
        self.interval = interval
        self.seen: dict[int, list[tuple[int, float]]] = {r.index: [] for r in replicas}  # (max id, first seen)
        self._halt = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        conns = {r.index: r.server.connect(database="bench") for r in self.replicas}
        last = {}
        for i, c in conns.items():
            with c.cursor() as cur:
                cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {self.table}")
                last[i] = cur.fetchone()[0]
        next_at = time.monotonic()
        while not self._halt.is_set():
            for i, c in conns.items():
                try:
                    with c.cursor() as cur:
                        cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {self.table}")
                        m = cur.fetchone()[0]
                except pymysql.err.Error as exc:
                    self.errors.append(repr(exc))
                    continue
                if m > last[i]:
                    self.seen[i].append((m, time.monotonic()))
                    last[i] = m
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay > 0:
                self._halt.wait(delay)
            else:
                next_at = time.monotonic()
        for c in conns.values():
            c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class BytesSampler(threading.Thread):
    """(time, total bytes the clients hold) every interval: delivered MB/s over any window."""

    def __init__(self, clients: list[BinlogClient], replicas: list[Replica], interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.clients, self.replicas, self.interval = clients, replicas, interval
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def total(self) -> int:
        return sum(c.size() for c in self.clients) + sum(r.relay_log_bytes() for r in self.replicas)

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.monotonic(), self.total()))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


# --- one phase ---
class RealBench:
    """Everything that lives across phases: the master, the replicas, the work directory, the options."""

    def __init__(self, args, work: Path, servers: Path) -> None:
        self.args = args
        self.work = work
        self.master = MariaDBSandbox(servers / "master", server_id=1, binlog_format="ROW",
                                     extra_config=REAL_MASTER_CONFIG)
        self.replicas = [Replica(i, servers) for i in range(args.real_replicas)]
        self.relay_options = [tuple(o.split("=", 1)) for o in args.relay_option]
        self.phase_no = 0

    def start(self) -> None:
        log(f"starting the master (and up to {len(self.replicas)} replicas) in {self.work}")
        self.master.start()
        self.master.create_user(REPL_USER, REPL_PASSWORD)
        self.master.execute("CREATE DATABASE IF NOT EXISTS bench")
        for ddl in LOADS.values():
            self.master.execute(ddl)
        if self.args.loads or self.args.ceiling:  # the sweep alone uses no replicas
            for r in self.replicas:
                r.start()

    def stop(self) -> None:
        for s in [*(r.server for r in self.replicas), self.master]:
            try:
                s.stop()
            except Exception as exc:  # noqa: BLE001
                log(f"could not stop {s}: {exc}")

    def cpu_snapshot(self, relay: Relay | None, dump_tids: list[int], clients: list[BinlogClient],
                     writer: Writers | None) -> dict:
        return {
            "t": time.monotonic(),
            "relay": tree_cpu(relay.proc.pid) if relay is not None else None,
            "mariadbd": tree_cpu(self.master.pid),
            "dump_threads": threads_cpu(self.master.pid, dump_tids),
            "replicas": pids_cpu([r.pid for r in self.replicas if r.pid]),
            "binlog_clients": pids_cpu([c.proc.pid for c in clients if c.proc is not None]),
            "bench": tree_cpu(os.getpid()),
        }

    def phase(self, target: str, load: str, n_stream: int, n_idle: int = 0,
              schedule: list[tuple[float, float]] | None = None, idle_seconds: float | None = None,
              with_replicas: bool = True, drain: bool = True) -> dict:
        args = self.args
        self.phase_no += 1
        label = f"p{self.phase_no:02d}-{target}-{load}-{n_stream + n_idle}"
        pdir = self.work / label
        cdir = Path(args.clients_dir) / f"{self.work.name}-{label}" if args.clients_dir else pdir
        replicas = self.replicas if with_replicas else []
        schedule = schedule or [(args.rates[load], args.seconds)]
        idle_seconds = args.idle_seconds if idle_seconds is None else idle_seconds
        relay = None
        extra = [("max_connections", str(n_stream + n_idle + 100))] if n_stream + n_idle > 900 else []
        clients: list[BinlogClient] = []
        idle: IdleClients | None = None
        try:
            floor = last_connection_id(self.master)  # this phase's dump connections are all newer
            if target == "relay":
                relay = Relay(self.work, self.master, options=extra + self.relay_options).start()
                relay.wait_at(master_end(self.master), timeout=120, poll=0.02)
                port = relay.listen_port
            else:
                port = self.master.port
            start = master_end(self.master)
            writer = Writers(self.master.port, load, schedule, writers=args.writers, record="gtid+row")
            t_c = time.monotonic()
            clients = [BinlogClient(i, port, start, cdir / f"c{i:04d}") for i in range(n_stream)]
            for c in clients:
                c.start()
            deadline = time.monotonic() + 120
            while True:
                dead = [c for c in clients if not c.alive()]
                if dead:
                    raise RuntimeError(f"{label}: mariadb-binlog {dead[0].index} exited: {dead[0].error_text()}")
                if all(c.size() > 4 for c in clients):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: mariadb-binlog clients did not start within 120 s")
                time.sleep(0.05)
            for r in replicas:
                r.point(port, start)
            if n_idle:
                idle = IdleClients(port, start, n_idle)
                if idle.ready.get("errors"):
                    log(f"{label}: idle clients: {idle.ready}")
            connect_seconds = time.monotonic() - t_c
            expected = 1 if target == "relay" else n_stream + len(replicas) + n_idle
            deadline = time.monotonic() + 30
            while True:
                tids = dump_thread_ids(self.master, floor)
                if len(tids) >= expected or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            time.sleep(1.0)
            rss_connected = tree_memory_kb(relay.proc.pid) if relay else None
            # Idle baseline: clients connected, no load.
            a = self.cpu_snapshot(relay, tids, clients, writer)
            time.sleep(idle_seconds)
            b = self.cpu_snapshot(relay, tids, clients, writer)
            # Load.
            k = max(1, min(args.sample_clients, n_stream))
            sampled = sorted({round(i * (n_stream - 1) / max(1, k - 1)) for i in range(k)}) if n_stream else []
            tail = TailLag({i: clients[i].out_dir for i in sampled}, args.tail_interval)
            table = "bench.bulk" if load == "bulk" else "bench.oltp"
            poller = ReplicaPoller(replicas, table, args.replica_poll_interval) if replicas else None
            sampler = BytesSampler(clients, replicas)
            status0 = _relay_counters(relay)
            size0 = [c.size() for c in clients]
            rl0 = [r.relay_log_bytes() for r in replicas]
            idle0 = idle.received() if idle else 0
            tail.start()
            if poller:
                poller.start()
            sampler.start()
            c0 = self.cpu_snapshot(relay, tids, clients, writer)
            writer.go()
            log(f"{label}: {n_stream} mariadb-binlog + {len(replicas)} replicas + {n_idle} idle clients on "
                f"{'the relay' if relay else 'the master'} from {start[0]}:{start[1]}; {load} at "
                f"{', '.join(f'{r:g}' for r, _ in schedule)} trx/s")
            w = writer.result()
            end = master_end(self.master)
            want = end[1] - start[1] if end[0] == start[0] else None
            converged_at = None
            deadline = time.monotonic() + (args.drain_timeout if drain else 3.0)
            while time.monotonic() < deadline:
                grown = [c.size() - s for c, s in zip(clients, size0)]
                ok = (all(g >= want for g in grown) if want is not None else False)
                if ok and all(r.at(end) for r in replicas):
                    converged_at = time.monotonic()
                    break
                time.sleep(0.02)
            d = self.cpu_snapshot(relay, tids, clients, writer)
            mem = tree_memory_kb(relay.proc.pid) if relay else None
            status1 = _relay_counters(relay)
            sampler.stop()
            tail.stop()
            if poller:
                poller.stop()
            size1 = [c.size() for c in clients]
            rl1 = [r.relay_log_bytes() for r in replicas]
            idle1 = idle.received() if idle else 0
            idle_result = idle.stop() if idle else None
            idle = None
        finally:
            for c in clients:
                c.stop()
            if idle is not None:
                idle.stop()
            for r in replicas:
                try:
                    r.stop_slave()
                except Exception as exc:  # noqa: BLE001
                    log(f"replica {r.index}: STOP SLAVE: {exc}")
            if relay is not None:
                relay.stop()
            shutil.rmtree(pdir, ignore_errors=True)
            shutil.rmtree(cdir, ignore_errors=True)

        # ---- numbers
        commits = w["commits"]
        seq_at = {s: t for s, _, t in commits}
        id_at = sorted((i, t) for _, i, t in commits)
        lags_clients: list[float] = []
        per_client = {}
        for i, arr in tail.arrivals.items():
            mine = [t - seq_at[s] for s, t in arr if s in seq_at]
            per_client[i] = lag_summary(mine)
            lags_clients += mine
        lags_replicas: list[float] = []
        if poller:
            import bisect
            ids = [i for i, _ in id_at]
            for _, seen in poller.seen.items():
                prev = 0
                for m, t in seen:
                    lo, hi = bisect.bisect_right(ids, prev), bisect.bisect_right(ids, m)
                    lags_replicas += [t - id_at[j][1] for j in range(lo, hi)]
                    prev = m
        t_go, t_done = c0["t"], d["t"]
        window = t_done - t_go
        idle_window = b["t"] - a["t"]

        def net(key):
            if c0[key] is None or d[key] is None:
                return None
            used = d[key] - c0[key]
            base = (b[key] - a[key]) / idle_window * window if a[key] is not None and b[key] is not None else 0.0
            return {"load": round(used, 3), "idle_rate_pct": round(100 * (b[key] - a[key]) / idle_window, 2)
                    if a[key] is not None else None, "net": round(used - base, 3)}

        cpu = {k: net(k) for k in ("relay", "mariadbd", "dump_threads", "replicas", "binlog_clients", "bench")}
        client_bytes = sum(x - y for x, y in zip(size1, size0))
        replica_bytes = sum(x - y for x, y in zip(rl1, rl0))
        idle_bytes = idle1 - idle0  # counted at the socket: 5 more bytes an event (header, OK byte), ~3 % at OLTP
        delivered = client_bytes + replica_bytes + idle_bytes
        mb = delivered / 1e6
        phase = {
            "label": label, "target": target, "load": load, "binlog_clients": n_stream,
            "replicas": len(replicas), "idle_clients": n_idle, "start": list(start), "end": list(end),
            "schedule": schedule, "transactions": len(commits),
            "writer_rate": round(len(commits) / (w["t_end"] - w["t0"]), 1),
            "event_bytes_per_client": want,
            "connect_seconds": round(connect_seconds, 2), "idle_seconds": round(idle_window, 2),
            "window_seconds": round(window, 2),
            "converged": converged_at is not None,
            "drain_seconds": round(converged_at - max(t for _, _, t in commits), 3)
            if converged_at and commits else None,
            "clients_short": sum(1 for c, s in zip(size1, size0) if want is not None and c - s < want),
            "client_bytes": client_bytes, "replica_relay_log_bytes": replica_bytes, "idle_client_bytes": idle_bytes,
            "delivered_bytes": delivered,
            "delivered_mb_per_s": round(mb / window, 3) if window else None,
            "relay_status_bytes_sent": _counter_delta(status0, status1, "bytes_sent"),
            "relay_fsyncs": _counter_delta(status0, status1, "fsyncs"),
            "relay_fsync_seconds": _counter_delta(status0, status1, "fsync_seconds"),
            "relay_fsync_max_seconds_ever": (status1 or {}).get("fsync_max_seconds"),
            "dump_threads": len(tids),
            "cpu_seconds": cpu,
            "sampled_clients": sampled,
            "lag_ms_clients": lag_summary(lags_clients),
            "lag_ms_clients_each": per_client,
            "lag_ms_replicas": lag_summary(lags_replicas),
            "replica_poll_errors": poller.errors[:3] if poller else [],
            "idle_clients_result": idle_result,
            "relay_memory_connected_kb": rss_connected,
            "relay_memory_end_kb": mem,
            "bytes_series": sampler.samples,
            "commits": commits,
            "client_arrivals": {i: [(s, t) for s, t in arr] for i, arr in tail.arrivals.items()},
            "t_go": t_go,
        }
        if mb > 0:
            if cpu["relay"]:
                phase["relay_cpu_s_per_mb"] = round(cpu["relay"]["net"] / mb, 5)
            phase["dump_threads_cpu_s_per_mb"] = round(cpu["dump_threads"]["net"] / mb, 5)
            phase["mariadbd_cpu_s_per_mb"] = round(cpu["mariadbd"]["net"] / mb, 5)
        log(f"{label}: {len(commits)} trx at {phase['writer_rate']} trx/s; {mb:.1f} MB delivered "
            f"({phase['delivered_mb_per_s']} MB/s); converged {phase['converged']}; relay CPU {cpu['relay']}; "
            f"dump threads {cpu['dump_threads']}; mariadbd {cpu['mariadbd']}; lag clients "
            f"{phase['lag_ms_clients']} replicas {phase['lag_ms_replicas']}")
        return phase


def _relay_counters(relay: Relay | None) -> dict | None:
    """What the relay's /status says it has done: bytes sent to its replicas, fsyncs and their seconds."""
    if relay is None:
        return None
    try:
        st = relay.status()
        return {"bytes_sent": sum(int(r.get("bytes_sent") or 0) for r in st.get("replicas") or []),
                "fsyncs": st.get("fsyncs"), "fsync_seconds": st.get("fsync_seconds_sum"),
                "fsync_max_seconds": st.get("fsync_max_seconds")}
    except (OSError, ValueError, TypeError):
        return None


def _counter_delta(a: dict | None, b: dict | None, key: str):
    if not a or not b or a.get(key) is None or b.get(key) is None:
        return None
    return b[key] - a[key]


# --- analysis of phases ---
BULKY_KEYS = ("bytes_series", "commits", "client_arrivals", "lag_ms_clients_each")


def slim(phase: dict) -> dict:
    """The phase without its raw series (what the JSON report keeps)."""
    return {k: v for k, v in phase.items() if k not in BULKY_KEYS[:3]}


def ceiling_steps(phase: dict, step_seconds: float, max_lag: float) -> list[dict]:
    """Per step of a rate ladder: offered trx/s, delivered MB/s (all clients, from the byte samples), sampled
    clients' lag in the step's second half, and whether the target kept up: every sampled client got every
    transaction of that half, with p99 lag below max_lag seconds (lag that grows without bound fails both)."""
    commits = phase["commits"]
    receivers = phase["binlog_clients"] + phase["replicas"]
    per_trx = (phase["event_bytes_per_client"] or 0) / max(1, len(commits))
    n_sampled = len(phase["client_arrivals"])
    arrivals_by_seq: dict[int, list[float]] = {}
    for arr in phase["client_arrivals"].values():
        for s, t in arr:
            arrivals_by_seq.setdefault(s, []).append(t)
    series = phase["bytes_series"]

    def bytes_at(t: float) -> int | None:
        prev = None
        for ts, b in series:  # linear interpolation between the samples around t
            if ts >= t:
                if prev is None:
                    return b
                return round(prev[1] + (b - prev[1]) * (t - prev[0]) / (ts - prev[0])) if ts > prev[0] else b
            prev = (ts, b)
        return prev[1] if prev else None

    out = []
    t = phase["t_go"]
    for rate, secs in phase["schedule"]:
        lo, hi = t, t + secs
        mid = lo + secs / 2
        in_step = [(s, tc) for s, _, tc in commits if lo <= tc < hi]
        late = [(s, tc) for s, tc in in_step if tc >= mid]
        lags = []
        missing = 0
        for s, tc in late:
            got = arrivals_by_seq.get(s, [])
            missing += n_sampled - len(got)
            lags += [ta - tc for ta in got]
        b0, b1 = bytes_at(lo), bytes_at(hi)
        delivered = (b1 - b0) if b0 is not None and b1 is not None else None
        offered = per_trx * len(in_step) * receivers
        lag = lag_summary(lags)
        kept = missing == 0 and lag["p99"] is not None and lag["p99"] < max_lag * 1000
        out.append({"rate": rate, "achieved_trx_s": round(len(in_step) / secs, 1),
                    "offered_mb_s": round(offered / 1e6 / secs, 2),
                    "delivered_mb_s": round(delivered / 1e6 / secs, 2) if delivered is not None else None,
                    "lag_ms": lag, "missing_arrivals": missing, "kept_up": kept})
        t = hi
    return out


def summarize_load(repeats: list[dict]) -> dict:
    """Median and range over the repeats of each figure, for relay and direct, and of the per-repeat ratios."""
    def get(phase, path):
        v = phase
        for k in path:
            if v is None:
                return None
            v = v.get(k) if isinstance(v, dict) else None
        return v

    figures = {
        "delivered_mb": ("delivered_bytes",), "delivered_mb_per_s": ("delivered_mb_per_s",),
        "writer_rate": ("writer_rate",), "drain_seconds": ("drain_seconds",),
        "relay_cpu_net_s": ("cpu_seconds", "relay", "net"),
        "relay_cpu_idle_pct": ("cpu_seconds", "relay", "idle_rate_pct"),
        "relay_cpu_s_per_mb": ("relay_cpu_s_per_mb",),
        "mariadbd_cpu_net_s": ("cpu_seconds", "mariadbd", "net"),
        "mariadbd_cpu_s_per_mb": ("mariadbd_cpu_s_per_mb",),
        "dump_threads_cpu_net_s": ("cpu_seconds", "dump_threads", "net"),
        "dump_threads_cpu_s_per_mb": ("dump_threads_cpu_s_per_mb",),
        "binlog_clients_cpu_net_s": ("cpu_seconds", "binlog_clients", "net"),
        "lag_clients_p50_ms": ("lag_ms_clients", "p50"), "lag_clients_p99_ms": ("lag_ms_clients", "p99"),
        "lag_clients_max_ms": ("lag_ms_clients", "max"),
        "lag_replicas_p50_ms": ("lag_ms_replicas", "p50"), "lag_replicas_p99_ms": ("lag_ms_replicas", "p99"),
        "relay_rss_end_mb": ("relay_memory_end_kb", "rss_kb"), "relay_vmhwm_mb": ("relay_memory_end_kb", "hwm_kb_sum"),
        "relay_pss_end_mb": ("relay_memory_end_kb", "pss_kb"), "relay_processes": ("relay_memory_end_kb", "processes"),
        "relay_status_mb_sent": ("relay_status_bytes_sent",),
        "relay_fsyncs": ("relay_fsyncs",), "relay_fsync_seconds": ("relay_fsync_seconds",),
    }
    scale = {"delivered_mb": 1e-6, "relay_rss_end_mb": 1 / 1024, "relay_vmhwm_mb": 1 / 1024,
             "relay_pss_end_mb": 1 / 1024, "relay_status_mb_sent": 1e-6}
    out: dict = {"relay": {}, "direct": {}, "ratios": {}}
    for target in ("relay", "direct"):
        for name, path in figures.items():
            vals = []
            for rep in repeats:
                v = get(rep["phases"].get(target), path)
                vals.append(v * scale[name] if v is not None and name in scale else v)
            out[target][name] = spread(vals)
    per_ratio = {"relay_vs_dump_threads": [], "relay_vs_mariadbd_difference": [], "lag_clients_p99": [],
                 "lag_replicas_p99": [], "delivered_mb": []}
    alt = []
    for rep in repeats:
        r, d = rep["phases"].get("relay"), rep["phases"].get("direct")
        if not r or not d:
            continue
        mb_d = d["delivered_bytes"] / 1e6
        rc, dc = r.get("relay_cpu_s_per_mb"), d.get("dump_threads_cpu_s_per_mb")
        per_ratio["relay_vs_dump_threads"].append(rc / dc if rc is not None and dc else None)
        # the master's dump work by difference: mariadbd serving N clients minus mariadbd serving the relay
        diff = (d["cpu_seconds"]["mariadbd"]["net"] - r["cpu_seconds"]["mariadbd"]["net"]) / mb_d if mb_d else None
        alt.append(diff)
        per_ratio["relay_vs_mariadbd_difference"].append(rc / diff if rc is not None and diff and diff > 0 else None)
        for key, path in (("lag_clients_p99", ("lag_ms_clients", "p99")),
                          ("lag_replicas_p99", ("lag_ms_replicas", "p99"))):
            a, b = get(r, path), get(d, path)
            per_ratio[key].append(a / b if a is not None and b else None)
        per_ratio["delivered_mb"].append(r["delivered_bytes"] / d["delivered_bytes"] if d["delivered_bytes"] else None)
    out["direct"]["master_dump_by_difference_s_per_mb"] = spread(alt)
    out["ratios"] = {k: spread(v) for k, v in per_ratio.items()}
    return out


def run_real(args) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    work = Path(tempfile.mkdtemp(prefix="rp-fanout-real-", dir=args.workdir))
    servers = Path(tempfile.mkdtemp(prefix="rp-fanout-servers-", dir=args.servers_dir)) if args.servers_dir else work
    bench = RealBench(args, work, servers)
    report: dict = {"mode": "real", "loads": {}, "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    try:
        bench.start()
        for load in args.loads:
            repeats = []
            for k in range(args.repeats):
                order = REAL_PHASE_ORDERS[k % 2]
                phases = {}
                for target in order:
                    phases[target] = slim(bench.phase(target, load, args.binlog_clients))
                repeats.append({"order": list(order), "phases": phases})
            report["loads"][load] = {"rate": args.rates[load], "repeats": repeats, "summary": summarize_load(repeats)}
        for load in args.ceiling_loads if args.ceiling else ():
            report.setdefault("ceilings", {})[load] = ce = {
                "load": load, "step_seconds": args.ceiling_step_seconds, "max_lag_seconds": args.ceiling_max_lag,
                "targets": {}}
            for target in ("relay", "direct"):
                sched = [(r, args.ceiling_step_seconds) for r in args.ceiling_rates[load]]
                ph = bench.phase(target, load, args.binlog_clients, schedule=sched, idle_seconds=2.0, drain=False)
                steps = ceiling_steps(ph, args.ceiling_step_seconds, args.ceiling_max_lag)
                best = None
                for st in steps:
                    if not st["kept_up"]:
                        break
                    best = st
                ce["targets"][target] = {
                    "steps": steps, "highest_kept_up": best,
                    "relay_cpu_pct": round(100 * ph["cpu_seconds"]["relay"]["load"] / ph["window_seconds"], 1)
                    if ph["cpu_seconds"]["relay"] else None,
                    "mariadbd_cpu_pct": round(100 * ph["cpu_seconds"]["mariadbd"]["load"] / ph["window_seconds"], 1),
                }
        if args.sweep:
            report["sweep"] = {"load": "oltp", "rate": args.sweep_rate, "seconds": args.sweep_seconds, "points": []}
            for j, n in enumerate(args.sweep_counts):
                n_stream = min(n, SWEEP_STREAMING_MAX)
                order = REAL_PHASE_ORDERS[j % 2]
                phases = {}
                for target in order:
                    phases[target] = slim(bench.phase(
                        target, "oltp", n_stream, n_idle=n - n_stream, with_replicas=False,
                        schedule=[(args.sweep_rate, args.sweep_seconds)], idle_seconds=args.sweep_idle_seconds))
                report["sweep"]["points"].append({"clients": n, "streaming": n_stream, "idle": n - n_stream,
                                                  "order": list(order), "phases": phases,
                                                  "summary": summarize_load([{"phases": phases}])})
    finally:
        bench.stop()
        for tree in {work, servers}:
            if not args.keep:
                shutil.rmtree(tree, ignore_errors=True)
            else:
                log(f"kept {tree}")
    for load in report["loads"].values():
        for rep in load["repeats"]:
            for ph in rep["phases"].values():
                ph.pop("lag_ms_clients_each", None)
    return report


# --- the results file ---
def write_real_markdown(path: Path, report: dict, notes: str | None, png_name: str) -> None:
    a = report["args"]
    out = [
        "# Fan-out to real clients: relayproxy vs. MariaDB's own dump threads",
        "",
        "Command:",
        "",
        f"    {report['command']}",
        "",
        f"Clients: {a['binlog_clients']} `mariadb-binlog --read-from-remote-server --raw --stop-never` processes "
        f"(each writing its own directory) and {a['real_replicas']} real MariaDB 10.11 replicas (sandboxes, "
        "file/position, "
        "no binlog of their own), all started at the master's end position of the phase. Phase `relay`: they "
        "connect to `relayproxy run --listen` (started for the phase on its relay directory, replicating from the "
        f"master; relay options: {a['relay_option'] or 'defaults'}); phase `direct`: the relay stopped, the same "
        f"clients connect to the master. Phase order alternates over {a['repeats']} repeats "
        "(relay-direct, direct-relay, ...); figures are the median (min-max) over the repeats; each ratio is "
        "computed per repeat (relay and direct of the same repeat) and then summarized."
        + (f" The master's and the replicas' data directories are on {a['servers_dir']} (`--servers-dir`), the "
           "mariadb-binlog clients' output on "
           f"{a.get('clients_dir') or 'the relay disk'}; the relay directory is on the disk."
           if a.get("servers_dir") else ""),
        "",
        "Per phase: an idle window of "
        f"{a['idle_seconds']:g} s with every client connected and no load (CPU baseline), then the load for "
        f"{a['seconds']:g} s, until every client and replica has the master's last byte (the load window). "
        "CPU over the load window minus the idle rate times its length. `relay` = the relay process and all its "
        "descendants (user+sys from /proc/<pid>/stat, found through /proc/<pid>/task/*/children); `dump threads` = "
        "the master's `Binlog Dump` threads only (on-CPU time from /proc/<mariadbd>/task/<tid>/schedstat, the "
        "threads found by `performance_schema.threads.THREAD_OS_ID`, which the benchmark turns on); "
        "`mariadbd` = the whole server. In the relay phase the master's dump threads serve only the relay. "
        "Delivered bytes = growth of the mariadb-binlog output files + growth of the replicas' relay logs over "
        "the load window (the replicas ask for no ANNOTATE_ROWS events, mariadb-binlog does). The master's dump "
        "work is also shown by difference: mariadbd's net CPU in the direct "
        "phase minus in the relay phase, per MB delivered.",
        "",
        f"Lag: the writer ({_writers_text(a.get('writers', 1))}) records each COMMIT's return time; for "
        f"{a['sample_clients']} sampled "
        f"mariadb-binlog clients (evenly spread over the indices; polled every {a['tail_interval'] * 1000:g} ms, "
        "which bounds the resolution) a tail parser notes when each transaction's XID is in the output file; for "
        f"every replica `SELECT MAX(id)` every {a['replica_poll_interval'] * 1000:g} ms notes when each "
        "transaction's row was applied (apply time included).",
        "",
        "**The machine has 2 cores shared with other work: master, relay, writer, replicas and all clients run on "
        "them.** Absolute numbers are noise; the relay/direct ratios of one run are the result.",
        "",
    ]
    rows = [
        ("writer rate achieved (trx/s)", "writer_rate", 1, False),
        ("delivered (MB, all clients + replicas)", "delivered_mb", 1, False),
        ("delivered MB/s", "delivered_mb_per_s", 2, False),
        ("drain: last commit -> everyone has it (s)", "drain_seconds", 3, False),
        ("relay CPU, net (s)", "relay_cpu_net_s", 2, False),
        ("relay CPU idle baseline (% of a core)", "relay_cpu_idle_pct", 1, False),
        ("**relay CPU s per MB delivered**", "relay_cpu_s_per_mb", 4, False),
        ("master dump threads CPU, net (s)", "dump_threads_cpu_net_s", 2, False),
        ("**master dump threads CPU s per MB**", "dump_threads_cpu_s_per_mb", 4, False),
        ("mariadbd CPU, net (s)", "mariadbd_cpu_net_s", 2, False),
        ("mariadbd CPU s per MB", "mariadbd_cpu_s_per_mb", 4, False),
        ("mariadb-binlog clients CPU, net (s)", "binlog_clients_cpu_net_s", 2, False),
        ("lag p50, sampled mariadb-binlog clients (ms)", "lag_clients_p50_ms", 1, False),
        ("lag p99, sampled mariadb-binlog clients (ms)", "lag_clients_p99_ms", 1, False),
        ("lag max, sampled mariadb-binlog clients (ms)", "lag_clients_max_ms", 1, False),
        ("lag p50, replicas, applied (ms)", "lag_replicas_p50_ms", 1, False),
        ("lag p99, replicas, applied (ms)", "lag_replicas_p99_ms", 1, False),
        ("relay RSS at the end (MB, all processes)", "relay_rss_end_mb", 1, False),
        ("relay peak RSS VmHWM (MB, sum over processes)", "relay_vmhwm_mb", 1, False),
        ("relay PSS at the end (MB, sum over processes)", "relay_pss_end_mb", 1, False),
        ("relay processes at the end", "relay_processes", 0, False),
        ("relay /status bytes_sent (MB)", "relay_status_mb_sent", 1, False),
        ("relay fsyncs in the load window", "relay_fsyncs", 0, False),
        ("relay seconds in fsync in the load window", "relay_fsync_seconds", 2, False),
    ]
    for load, body in report["loads"].items():
        sm = body["summary"]
        rt = sm["ratios"]
        rep0 = body["repeats"][0]["phases"]["relay"]
        out += [f"## Load `{load}`: {body['rate']:g} trx/s, "
                + ("~150-byte row events (autocommit INSERT / INSERT+UPDATE)" if load == "oltp"
                   else f"one {BULK_BYTES}-byte BLOB row per transaction (8 KB row events)"),
                "",
                f"{rep0['binlog_clients']} mariadb-binlog clients + {rep0['replicas']} replicas; lag sampled on "
                f"clients {rep0['sampled_clients']} and on every replica.",
                "",
                "| per phase | relay | direct (master) |", "|---|---:|---:|"]
        for label, key, digits, _ in rows:
            r, d = sm["relay"].get(key), sm["direct"].get(key)
            if (not r or r["median"] is None) and (not d or d["median"] is None):
                continue
            out.append(f"| {label} | {fmt_spread(r, digits)} | {fmt_spread(d, digits)} |")
        out.append(f"| master dump work by difference (mariadbd direct - relay), CPU s per MB | | "
                   f"{fmt_spread(sm['direct']['master_dump_by_difference_s_per_mb'], 4)} |")
        out += ["", "| ratio (relay / direct, per repeat) | median (range) |", "|---|---:|",
                f"| **relay CPU per MB / master dump threads CPU per MB** | "
                f"**{fmt_spread(rt['relay_vs_dump_threads'], 2)}** |",
                f"| relay CPU per MB / master dump work by difference | "
                f"{fmt_spread(rt['relay_vs_mariadbd_difference'], 2)} |",
                f"| lag p99, sampled clients | {fmt_spread(rt['lag_clients_p99'], 2)} |",
                f"| lag p99, replicas | {fmt_spread(rt['lag_replicas_p99'], 2)} |",
                f"| bytes delivered | {fmt_spread(rt['delivered_mb'], 3)} |", ""]
        bad = [(i, t, p["label"]) for i, rep in enumerate(body["repeats"]) for t, p in rep["phases"].items()
               if not p["converged"]]
        out += ([f"**Phases where not every client reached the master's end: {bad}**", ""] if bad else
                ["Every client and replica of every phase reached the master's final position.", ""])
    for ce in ([report["ceiling"]] if "ceiling" in report else list(report.get("ceilings", {}).values())):
        out += [f"## Egress ceiling ({ce['load']} load, rate ladder, {ce['step_seconds']:g} s a step)", "",
                "A step is kept up when every sampled client got every transaction committed in the step's second "
                f"half, with p99 lag there below {ce['max_lag_seconds']:g} s (lag that grows without bound fails "
                "both). "
                "Offered MB/s = the load's bytes per transaction x transactions committed in the step x receivers; "
                "delivered MB/s = what the clients and replicas together received during the step. A step where "
                "the writer achieved less than 90 % of the asked rate is marked *writer-bound*: the master (or the "
                "machine) limited it, not the target.", "",
                "| target | trx/s asked | trx/s achieved | offered MB/s | delivered MB/s | lag p99 (ms) | kept up |",
                "|---|---:|---:|---:|---:|---:|---|"]
        for target, t in ce["targets"].items():
            for st in t["steps"]:
                out.append(f"| {target} | {st['rate']:g} | {st['achieved_trx_s']} | {st['offered_mb_s']} | "
                           f"{st['delivered_mb_s']} | {st['lag_ms']['p99']} | {'yes' if st['kept_up'] else 'no'}"
                           f"{' (writer-bound)' if st['achieved_trx_s'] < 0.9 * st['rate'] else ''} |")
        out.append("")
        for target, t in ce["targets"].items():
            best = t["highest_kept_up"]
            out.append(f"- {target}: highest rate kept up "
                       + (f"{best['rate']:g} trx/s, {best['delivered_mb_s']} MB/s delivered" if best else "none")
                       + f" (relay CPU {t['relay_cpu_pct']} % / mariadbd CPU {t['mariadbd_cpu_pct']} % of a core "
                         "over the whole ladder)")
        out.append("")
    sw = report.get("sweep")
    if sw:
        out += [f"## Scale sweep (OLTP, {sw['rate']:g} trx/s, {sw['seconds']:g} s a phase, no replicas)", "",
                *([f"Command: `{sw['command']}`" + (f" ({sw['command_note']})" if sw.get("command_note") else ""),
                   ""] if sw.get("command") else []),
                f"Up to {SWEEP_STREAMING_MAX} clients are mariadb-binlog processes; beyond that the rest are cheap "
                "asyncio dump clients in one helper process (connect, register, dump from the end, read and "
                "discard: they receive the stream too; their bytes, counted at the socket with the packet headers, are "
                "part of the delivered bytes). One repeat per point, phase order alternating. The relay's CPU includes "
                "its upstream work (receiving, CRC, writing and fsyncing the stream once), which weighs most with "
                "few clients; *marginal* = (CPU here - CPU at the previous point) / (MB here - MB there), relay over "
                "dump threads: the cost of the added clients alone.", "",
                "| clients | relay CPU s/MB | dump threads CPU s/MB | ratio | marginal ratio | lag p99 relay (ms) | "
                "lag p99 direct (ms) | relay RSS end (MB) | relay VmHWM (MB) | converged r/d |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        prev = None
        for pt in sw["points"]:
            s = pt["summary"]
            cur = (s["relay"]["relay_cpu_net_s"]["median"], s["relay"]["delivered_mb"]["median"],
                   s["direct"]["dump_threads_cpu_net_s"]["median"], s["direct"]["delivered_mb"]["median"])
            marginal = "-"
            if prev is not None and None not in cur and None not in prev and cur[1] > prev[1] and cur[3] > prev[3]:
                r_slope = (cur[0] - prev[0]) / (cur[1] - prev[1])
                d_slope = (cur[2] - prev[2]) / (cur[3] - prev[3])
                marginal = f"{r_slope / d_slope:.2f}" if d_slope > 0 else "-"
            prev = cur
            out.append(
                f"| {pt['clients']} ({pt['streaming']}+{pt['idle']}) "
                f"| {fmt_spread(s['relay']['relay_cpu_s_per_mb'], 4)} "
                f"| {fmt_spread(s['direct']['dump_threads_cpu_s_per_mb'], 4)} "
                f"| {fmt_spread(s['ratios']['relay_vs_dump_threads'], 2)} | {marginal} "
                f"| {fmt_spread(s['relay']['lag_clients_p99_ms'], 1)} "
                f"| {fmt_spread(s['direct']['lag_clients_p99_ms'], 1)} "
                f"| {fmt_spread(s['relay']['relay_rss_end_mb'], 1)} | {fmt_spread(s['relay']['relay_vmhwm_mb'], 1)} "
                f"| {pt['phases']['relay']['converged']}/{pt['phases']['direct']['converged']} |")
        out.append("")
    if notes:
        out += [notes.rstrip(), ""]
    out += [f"![CPU per MB and lag]({png_name})", ""]
    out += benchinfo.machine_section(report["machine"])
    path.write_text("\n".join(out))


def write_real_plot(path: Path, report: dict) -> bool:
    plt = benchinfo.pyplot()
    if plt is None:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    sw = report.get("sweep")
    if sw and sw["points"]:
        xs = [p["clients"] for p in sw["points"]]
        med = lambda p, t, k: p["summary"][t][k]["median"]  # noqa: E731
        ax1.plot(xs, [med(p, "relay", "relay_cpu_s_per_mb") for p in sw["points"]], "o-", color="#c44e52",
                 label="relay (all processes)")
        ax1.plot(xs, [med(p, "direct", "dump_threads_cpu_s_per_mb") for p in sw["points"]], "o-", color="#4c72b0",
                 label="mariadbd dump threads (direct)")
        ax2.plot(xs, [med(p, "relay", "lag_clients_p99_ms") for p in sw["points"]], "o-", color="#c44e52",
                 label="through relay, p99")
        ax2.plot(xs, [med(p, "direct", "lag_clients_p99_ms") for p in sw["points"]], "o-", color="#4c72b0",
                 label="direct, p99")
        for ax in (ax1, ax2):
            ax.set_xscale("log")
            ax.set_xlabel("connected clients (log)")
        ax1.set_title(f"CPU per MB delivered, OLTP {sw['rate']:g} trx/s", fontsize=9)
        ax2.set_title("lag p99 of sampled mariadb-binlog clients", fontsize=9)
    else:
        loads = list(report["loads"])
        width = 0.38
        for j, (target, key, color) in enumerate((("relay", "relay_cpu_s_per_mb", "#c44e52"),
                                                  ("direct", "dump_threads_cpu_s_per_mb", "#4c72b0"))):
            vals = [report["loads"][ld]["summary"][target][key]["median"] or 0 for ld in loads]
            ax1.bar([i + (j - 0.5) * width for i in range(len(loads))], vals, width, color=color,
                    label="relay" if target == "relay" else "mariadbd dump threads")
            vals = [report["loads"][ld]["summary"][target]["lag_clients_p99_ms"]["median"] or 0 for ld in loads]
            ax2.bar([i + (j - 0.5) * width for i in range(len(loads))], vals, width, color=color,
                    label=f"{target} p99")
        for ax in (ax1, ax2):
            ax.set_xticks(range(len(loads)), loads)
        n = report["args"]["binlog_clients"] + report["args"]["real_replicas"]
        ax1.set_title(f"CPU s per MB delivered, {n} clients", fontsize=9)
        ax2.set_title("lag p99 of sampled mariadb-binlog clients (ms)", fontsize=9)
    ax1.set_ylabel("CPU s per MB")
    ax2.set_ylabel("ms")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path, dpi=110)
    return True


def add_real_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("real clients (--real)")
    g.add_argument("--real", action="store_true", help="real external clients: mariadb-binlog processes and "
                   "MariaDB replicas, relay vs. direct, repeats with alternating order (results: fanout_real.md)")
    g.add_argument("--binlog-clients", type=int, default=None, help="mariadb-binlog clients (default 50; --quick 5)")
    g.add_argument("--real-replicas", type=int, default=None, help="MariaDB replicas (default 3; --quick 1)")
    g.add_argument("--loads", default="oltp,bulk", help="comma-separated: oltp, bulk")
    g.add_argument("--oltp-rate", type=float, default=None, help="OLTP trx/s (default 300)")
    g.add_argument("--bulk-rate", type=float, default=None, help="bulk (8 KB) trx/s (default 25)")
    g.add_argument("--repeats", type=int, default=None, help="repeats of relay+direct per load (default 3; "
                   "--quick 1)")
    g.add_argument("--idle-seconds", type=float, default=None, help="idle CPU baseline window per phase "
                   "(default 10; --quick 2)")
    g.add_argument("--relay-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of `relayproxy run` for the relay phases (repeatable), e.g. sender_processes=2")
    g.add_argument("--clients-dir", default=None, metavar="DIR",
                   help="where the mariadb-binlog clients write what they receive (default: the work directory, on "
                        "the relay's filesystem). On one machine their writes share the relay's disk, which no "
                        "remote client does: on ext4 (data=ordered) the relay's fdatasync then waits for their "
                        "writeback. /dev/shm keeps them off it")
    g.add_argument("--servers-dir", default=None, metavar="DIR",
                   help="where the master's and the MariaDB replicas' data directories live (default: the work "
                        "directory, on the relay's filesystem). On a fleet they are other machines with their own "
                        "disks; here their writeback (InnoDB, binlog, relay logs) shares the relay's disk and its "
                        "fdatasync waits behind it. /dev/shm keeps them off it (the relay's directory stays on disk)")
    g.add_argument("--writers", type=int, default=1, help="writer processes sharing the load's rate (one tops out "
                   "near 600 trx/s on these machines)")
    g.add_argument("--sample-clients", type=int, default=4, help="mariadb-binlog clients whose lag is measured")
    g.add_argument("--tail-interval", type=float, default=0.002, help="seconds between polls of the sampled files")
    g.add_argument("--replica-poll-interval", type=float, default=0.01, help="seconds between SELECT MAX(id)")
    g.add_argument("--ceiling", action=argparse.BooleanOptionalAction, default=None,
                   help="egress ceiling: a rate ladder of each --ceiling-loads on relay and direct (default on; "
                   "off with --quick)")
    g.add_argument("--ceiling-loads", default="oltp,bulk")
    g.add_argument("--ceiling-oltp-rates", default=",".join(f"{r:g}" for r in CEILING_STEPS["oltp"]),
                   help="OLTP trx/s steps")
    g.add_argument("--ceiling-bulk-rates", default=",".join(f"{r:g}" for r in CEILING_STEPS["bulk"]),
                   help="bulk trx/s steps")
    g.add_argument("--ceiling-step-seconds", type=float, default=5.0)
    g.add_argument("--ceiling-max-lag", type=float, default=1.0, help="seconds of p99 lag that count as not "
                   "keeping up")
    g.add_argument("--sweep", action="store_true", help="also the scale sweep (1..1000 clients; ~10 min more)")
    g.add_argument("--sweep-counts", default=",".join(str(n) for n in SWEEP_COUNTS))
    g.add_argument("--sweep-rate", type=float, default=20.0, help="OLTP trx/s in the sweep (every client "
                   "receives it: 1000 clients x this rate)")
    g.add_argument("--sweep-seconds", type=float, default=10.0)
    g.add_argument("--sweep-idle-seconds", type=float, default=5.0)
    g.add_argument("--baseline", action="store_true", help="write fanout_real_baseline.md/.png instead of "
                   "fanout_real.md/.png")
    g.add_argument("--keep", action="store_true", help="keep the work directory")


def finish_real_args(args) -> None:
    q = args.quick
    args.binlog_clients = args.binlog_clients if args.binlog_clients is not None else (5 if q else 50)
    args.real_replicas = args.real_replicas if args.real_replicas is not None else (1 if q else 3)
    args.repeats = args.repeats if args.repeats is not None else (1 if q else 3)
    args.idle_seconds = args.idle_seconds if args.idle_seconds is not None else (2.0 if q else 10.0)
    if args.seconds is None:
        args.seconds = 5.0 if q else 20.0
    args.rates = {"oltp": args.oltp_rate or DEFAULT_RATES["oltp"], "bulk": args.bulk_rate or DEFAULT_RATES["bulk"]}
    args.loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    for x in args.loads:
        if x not in LOADS:
            raise SystemExit(f"unknown load {x!r} (oltp, bulk)")
    for o in args.relay_option:
        if "=" not in o:
            raise SystemExit(f"--relay-option wants KEY=VALUE, got {o!r}")
    args.ceiling = (not q) if args.ceiling is None else args.ceiling
    args.ceiling_rates = {"oltp": [float(x) for x in args.ceiling_oltp_rates.split(",") if x.strip()],
                          "bulk": [float(x) for x in args.ceiling_bulk_rates.split(",") if x.strip()]}
    args.ceiling_loads = [x.strip() for x in args.ceiling_loads.split(",") if x.strip()]
    for x in args.ceiling_loads:
        if x not in LOADS:
            raise SystemExit(f"unknown ceiling load {x!r} (oltp, bulk)")
    args.sweep_counts = [int(x) for x in args.sweep_counts.split(",") if x.strip()]


def real_main(args, argv: list[str], script: str | Path) -> int:
    """The --real benchmark for benchmarks/fanout.py's parsed arguments (``script``: the command it quotes)."""
    finish_real_args(args)
    # SIGTERM (and SIGINT, which a background job may have ignored) end the run through the finally blocks, which
    # stop the clients, the relay and the sandboxes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.render is not None:
        report = json.loads(args.render.read_text())
    else:
        report = run_real(args)
        report["args"] = {k: getattr(args, k) for k in (
            "binlog_clients", "real_replicas", "repeats", "idle_seconds", "seconds", "rates", "relay_option",
            "sample_clients", "tail_interval", "replica_poll_interval", "quick", "writers", "clients_dir",
            "servers_dir")}
        report["machine"] = machine_info()
        report["command"] = benchinfo.command_line(script, argv)
    if args.save_json is not None:
        args.save_json.write_text(json.dumps(report, indent=1))
    out_dir = args.output_dir if args.output_dir is not None else (None if args.quick else RESULTS_DIR)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = "fanout_real_baseline" if args.baseline else "fanout_real"
        write_real_markdown(out_dir / f"{stem}.md", report, args.notes.read_text() if args.notes else None,
                            f"{stem}.png")
        write_real_plot(out_dir / f"{stem}.png", report)
        log(f"wrote {out_dir / (stem + '.md')}")
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for load, body in report.get("loads", {}).items():
            rt = body["summary"]["ratios"]
            print(f"{load}: relay CPU/MB / dump threads CPU/MB = {fmt_spread(rt['relay_vs_dump_threads'])}; "
                  f"by difference {fmt_spread(rt['relay_vs_mariadbd_difference'])}")
    bad = [p["label"] for body in report.get("loads", {}).values() for rep in body["repeats"]
           for p in rep["phases"].values() if not p["converged"]]
    if bad:
        log(f"FAILED: clients did not reach the master's end in {bad}")
        return 1
    return 0

