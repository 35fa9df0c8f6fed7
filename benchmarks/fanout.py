"""Fan-out to real clients: mariadb-binlog processes and MariaDB replicas following relayproxy, against the master.

A MariaDB master takes a paced load (``--loads``: ``oltp`` at ``--oltp-rate``, ``bulk`` 8 KB rows at 25 trx/s) from
``--writers`` processes that record each COMMIT's time. ``--binlog-clients`` ``mariadb-binlog --stop-never`` processes
and ``--real-replicas`` MariaDB replicas follow either the relay (phase ``relay``, ``--relay-option KEY=VALUE``) or the
master (phase ``direct``), ``--repeats`` times in alternating order. Per phase: CPU over the load less an idle
baseline (the relay's tree, mariadbd, the master's dump threads alone), bytes delivered, lag of ``--sample-clients``
clients and of every replica, relay memory. Unless ``--no-ceiling``: a rate ladder per load and target. ``--sweep``:
1 to 1000 clients. The ratios relay / direct of one run are the result, not the absolute numbers.

    .venv/bin/python benchmarks/fanout.py                       # ~12 min, writes fanout_real.md/.png
    .venv/bin/python benchmarks/fanout.py --sweep --loads '' --no-ceiling
    .venv/bin/python benchmarks/fanout.py --quick --save-json r.json   # 5 clients + 1 replica, writes nothing
    .venv/bin/python benchmarks/fanout.py --relay-option sender_processes=2 --stem NAME

``--real`` changes nothing (the results files' commands have it). CPU and memory readings: relayproxy.lab.procstat.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import os
import resource
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pymysql

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks import benchinfo  # noqa: E402
from benchmarks.common import (RESULTS_DIR, add_report_options, md_row, percentile, save_figure,  # noqa: E402
                               write_results)
from benchmarks.fanout_common import (LOADS, MASTER_CONFIG, REPL_PASSWORD, REPL_USER, IdleClients,  # noqa: E402
                                      Relay, Writers, log, master_end)
from relayproxy.downstream.sql.replication_parser import ChangeMaster, render_change_master  # noqa: E402
from relayproxy.lab.harness import replica_status  # noqa: E402
from relayproxy.lab.procstat import pids_cpu, threads_cpu, tree_cpu, tree_memory_kb  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox  # noqa: E402

_u64_unpack_from = struct.Struct("<Q").unpack_from

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
DEFAULT_RATES = {"oltp": 300.0, "bulk": 25.0}  # trx/s (the oltp one: --oltp-rate)
QUICK = {"binlog_clients": 5, "real_replicas": 1, "repeats": 1, "idle_seconds": 2.0, "seconds": 5.0}  # --quick
FULL = {"binlog_clients": 50, "real_replicas": 3, "repeats": 3, "idle_seconds": 10.0, "seconds": 20.0}
DRAIN_TIMEOUT = 120.0  # seconds every client and replica may take to reach the master's end after the load
REPLICA_POLL_INTERVAL = 0.01  # seconds between a replica's SELECT MAX(id)
CEILING_STEPS = {"oltp": (100.0, 200.0, 300.0, 450.0, 600.0), "bulk": (40.0, 80.0, 160.0, 320.0, 640.0)}  # trx/s
CEILING_STEP_SECONDS, CEILING_MAX_LAG = 5.0, 1.0  # a step's length; the p99 lag (s) that counts as not keeping up
SWEEP_COUNTS = (1, 10, 50, 100, 300, 1000)
SWEEP_RATE, SWEEP_SECONDS, SWEEP_IDLE_SECONDS = 20.0, 10.0, 5.0  # OLTP trx/s (every client receives it)
SWEEP_STREAMING_MAX = 100  # beyond this many clients the rest are cheap asyncio dump clients (read and discard)
TARGETS = ("relay", "direct")  # the phases of a pair, in this order in even repeats and reversed in odd ones
CPU_PARTS = ("relay", "mariadbd", "dump_threads", "replicas", "binlog_clients", "bench")


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


def dump_thread_ids(master: MariaDBSandbox, after_connection_id: int = 0) -> list[int]:
    """OS thread ids of the master's binlog dump threads of connections newer than after_connection_id (OS threads
    are reused and a gone client's dump thread lingers: the connection id tells this phase's from an earlier's)."""
    rows = master.execute("SELECT THREAD_OS_ID FROM performance_schema.threads "
                          "WHERE PROCESSLIST_COMMAND LIKE 'Binlog Dump%%' AND THREAD_OS_ID IS NOT NULL "
                          "AND PROCESSLIST_ID > %s", (after_connection_id,))
    return sorted(int(r[0]) for r in rows)


def last_connection_id(master: MariaDBSandbox) -> int:
    return int(master.execute("SELECT COALESCE(MAX(PROCESSLIST_ID), 0) FROM performance_schema.threads")[0][0])


# --- clients ---
class BinlogClient:
    """`mariadb-binlog --read-from-remote-server --raw --stop-never` writing into its own directory, started."""

    def __init__(self, index: int, port: int, start: tuple[str, int], out_dir: Path) -> None:
        self.index, self.out_dir = index, out_dir
        self.err_path = out_dir.parent / f"{out_dir.name}.err"
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            shutil.which("mariadb-binlog") or "mariadb-binlog", "--read-from-remote-server", "--raw", "--stop-never",
            "--host=127.0.0.1", f"--port={port}", f"--user={REPL_USER}", f"--password={REPL_PASSWORD}",
            f"--stop-never-slave-server-id={5000 + index}", f"--result-file={out_dir}/",
            f"--start-position={start[1]}", start[0],
        ]
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT)

    def size(self) -> int:
        with contextlib.suppress(OSError), os.scandir(self.out_dir) as entries:
            return _bytes_in(entries)
        return 0

    def error_text(self) -> str:
        try:
            return self.err_path.read_text(errors="replace")[-500:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _wait_written(clients: list[BinlogClient], label: str, timeout: float = 120.0) -> None:
    """Until every client has written its file's magic (a client that exits fails the phase)."""
    deadline = time.monotonic() + timeout
    while not all(c.size() > 4 for c in clients):
        dead = [c for c in clients if c.proc.poll() is not None]
        if dead:
            raise RuntimeError(f"{label}: mariadb-binlog {dead[0].index} exited: {dead[0].error_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: mariadb-binlog clients did not start within {timeout:g} s")
        time.sleep(0.05)


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
        while (st := replica_status(s)).get("Slave_IO_Running") != "Yes" or st.get("Slave_SQL_Running") != "Yes":
            if time.monotonic() > deadline:
                keys = ("Slave_IO_Running", "Slave_SQL_Running", "Last_IO_Error", "Last_SQL_Error")
                raise RuntimeError(f"replica {self.index} did not start replicating from port {port}: "
                                   f"{ {k: st.get(k) for k in keys} }")
            time.sleep(0.05)

    def at(self, end: tuple[str, int]) -> bool:
        st = replica_status(self.server)
        return st.get("Relay_Master_Log_File") == end[0] and int(st.get("Exec_Master_Log_Pos") or 0) == end[1]

    def relay_log_bytes(self) -> int:
        return _bytes_in(self.server.datadir.glob("relay-bin.[0-9]*"))


def _bytes_in(files) -> int:
    """The files' sizes summed (one gone meanwhile counts 0)."""
    total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += f.stat().st_size
    return total


# --- lag and bytes watchers (threads in this process) ---
class _Watcher(threading.Thread):
    """A daemon thread that runs until ``stop()``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class TailLag(_Watcher):
    """Tails the raw binlog output of a few mariadb-binlog clients; notes when each transaction's XID arrived
    (at this poller's resolution, --tail-interval)."""

    def __init__(self, dirs: dict[int, Path], interval: float) -> None:
        super().__init__()
        self.dirs, self.interval = dirs, interval
        self.arrivals: dict[int, list[tuple[int, float]]] = {k: [] for k in dirs}
        self._files: dict[Path, list] = {}  # path -> [bytes read so far, bytes not parsed yet, last GTID seq]

    def run(self) -> None:
        last_list = 0.0
        names: dict[int, list[Path]] = {k: [] for k in self.dirs}
        while not self._halt.is_set():
            now = time.monotonic()
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
        now = time.monotonic()
        for k, d in self.dirs.items():
            for path in sorted(d.iterdir()):
                self._read(k, path, now)

    def _read(self, k: int, path: Path, now: float) -> None:
        st = self._files.setdefault(path, [0, b"", None])
        try:
            size = os.stat(path).st_size
        except OSError:
            return
        if size <= st[0] or size < 4:
            return
        with open(path, "rb") as f:
            f.seek(st[0])
            data = f.read(size - st[0])
        buf = st[1] + data if st[0] else data[4:]  # a new file starts with its magic
        st[0] += len(data)
        seq, out, i, n = st[2], self.arrivals[k], 0, len(buf)
        while n - i >= 19:
            size_ev = int.from_bytes(buf[i + 9:i + 13], "little")
            if size_ev < 19:
                raise RuntimeError(f"{path}: event of {size_ev} bytes at {st[0] - n + i}")
            if n - i < size_ev:
                break
            if buf[i + 4] == 162:  # MARIA_GTID
                seq = _u64_unpack_from(buf, i + 19)[0]
            elif buf[i + 4] == 16 and seq is not None:  # XID
                out.append((seq, now))
            i += size_ev
        st[1], st[2] = buf[i:], seq


class ReplicaPoller(_Watcher):
    """Every interval, SELECT MAX(id) on each replica: when a row id first shows, its transaction has been applied."""

    def __init__(self, replicas: list[Replica], table: str, interval: float) -> None:
        super().__init__()
        self.replicas, self.table, self.interval = replicas, table, interval
        self.seen: dict[int, list[tuple[int, float]]] = {r.index: [] for r in replicas}  # (max id, first seen)
        self.errors: list[str] = []

    def run(self) -> None:
        conns = {r.index: r.server.connect(database="bench") for r in self.replicas}
        query = f"SELECT COALESCE(MAX(id), 0) FROM {self.table}"
        last = {}
        for i, c in conns.items():
            with c.cursor() as cur:
                cur.execute(query)
                last[i] = cur.fetchone()[0]
        next_at = time.monotonic()
        while not self._halt.is_set():
            for i, c in conns.items():
                try:
                    with c.cursor() as cur:
                        cur.execute(query)
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


class BytesSampler(_Watcher):
    """(time, total bytes the clients hold) every interval: delivered MB/s over any window."""

    def __init__(self, clients: list[BinlogClient], replicas: list[Replica], interval: float = 0.25) -> None:
        super().__init__()
        self.clients, self.replicas, self.interval = clients, replicas, interval
        self.samples: list[tuple[float, int]] = []

    def run(self) -> None:
        while not self._halt.is_set():
            t = time.monotonic()  # the time of a sample is taken before its reading
            held = sum(c.size() for c in self.clients) + sum(r.relay_log_bytes() for r in self.replicas)
            self.samples.append((t, held))
            self._halt.wait(self.interval)


# --- one phase ---
class RealBench:
    """Everything that lives across phases: the master, the replicas, the work directory, the options."""

    def __init__(self, args, work: Path, servers: Path) -> None:
        self.args = args
        self.work = work
        self.master = MariaDBSandbox(servers / "master", server_id=1, binlog_format="ROW",
                                     extra_config=MASTER_CONFIG)
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

    def cpu_snapshot(self, relay: Relay | None, dump_tids: list[int], clients: list[BinlogClient]) -> dict:
        return {
            "t": time.monotonic(),
            "relay": tree_cpu(relay.proc.pid) if relay is not None else None,
            "mariadbd": tree_cpu(self.master.pid),
            "dump_threads": threads_cpu(self.master.pid, dump_tids),
            "replicas": pids_cpu([r.server.pid for r in self.replicas if r.server.pid]),
            "binlog_clients": pids_cpu([c.proc.pid for c in clients]),
            "bench": tree_cpu(os.getpid()),
        }

    def pair(self, order, load: str, n_stream: int, **options) -> dict:
        """A phase of each target in ``order``, without their raw series."""
        return {target: slim(self.phase(target, load, n_stream, **options)) for target in order}

    def phase(self, target: str, load: str, n_stream: int, n_idle: int = 0,
              schedule: list[tuple[float, float]] | None = None, idle_seconds: float | None = None,
              with_replicas: bool = True, drain: bool = True) -> dict:
        args, master = self.args, self.master
        self.phase_no += 1
        label = f"p{self.phase_no:02d}-{target}-{load}-{n_stream + n_idle}"
        pdir = self.work / label
        cdir = Path(args.clients_dir) / f"{self.work.name}-{label}" if args.clients_dir else pdir
        replicas = self.replicas if with_replicas else []
        schedule = schedule or [(args.rates[load], args.seconds)]
        relay = idle = None
        clients: list[BinlogClient] = []
        try:
            floor = last_connection_id(master)  # this phase's dump connections are all newer
            if target == "relay":
                extra = [("max_connections", str(n_stream + n_idle + 100))] if n_stream + n_idle > 900 else []
                relay = Relay(self.work, master, options=extra + self.relay_options).start()
                relay.wait_at(master_end(master), timeout=120, poll=0.02)
            port = relay.listen_port if relay else master.port
            start = master_end(master)
            writer = Writers(master.port, load, schedule, writers=args.writers, record=True)
            t_c = time.monotonic()
            for i in range(n_stream):
                clients.append(BinlogClient(i, port, start, cdir / f"c{i:04d}"))
            _wait_written(clients, label)
            for r in replicas:
                r.point(port, start)
            if n_idle:
                idle = IdleClients(port, start, n_idle)
                if idle.ready.get("errors"):
                    log(f"{label}: idle clients: {idle.ready}")
            connect_seconds = time.monotonic() - t_c
            expected = 1 if relay else n_stream + len(replicas) + n_idle
            deadline = time.monotonic() + 30
            while len(tids := dump_thread_ids(master, floor)) < expected and time.monotonic() <= deadline:
                time.sleep(0.1)
            time.sleep(1.0)
            rss_connected = tree_memory_kb(relay.proc.pid) if relay else None
            a = self.cpu_snapshot(relay, tids, clients)  # the idle baseline: clients connected, no load
            time.sleep(args.idle_seconds if idle_seconds is None else idle_seconds)
            b = self.cpu_snapshot(relay, tids, clients)
            k = max(1, min(args.sample_clients, n_stream))
            sampled = sorted({round(i * (n_stream - 1) / max(1, k - 1)) for i in range(k)}) if n_stream else []
            tail = TailLag({i: clients[i].out_dir for i in sampled}, args.tail_interval)
            poller = ReplicaPoller(replicas, f"bench.{load}", REPLICA_POLL_INTERVAL) if replicas else None
            sampler = BytesSampler(clients, replicas)
            watchers = [tail, *([poller] if poller else []), sampler]
            status0, before = _relay_counters(relay), _held(clients, replicas, idle)
            for watcher in watchers:
                watcher.start()
            c0 = self.cpu_snapshot(relay, tids, clients)
            writer.go()
            log(f"{label}: {n_stream} mariadb-binlog + {len(replicas)} replicas + {n_idle} idle clients on "
                f"{'the relay' if relay else 'the master'} from {start[0]}:{start[1]}; {load} at "
                f"{', '.join(f'{r:g}' for r, _ in schedule)} trx/s")
            w = writer.result()
            end = master_end(master)
            want = end[1] - start[1] if end[0] == start[0] else None
            converged_at = None
            deadline = time.monotonic() + (DRAIN_TIMEOUT if drain else 3.0)
            while converged_at is None and time.monotonic() < deadline:
                if want is not None and all(c.size() - s >= want for c, s in zip(clients, before[0])) \
                        and all(r.at(end) for r in replicas):
                    converged_at = time.monotonic()
                else:
                    time.sleep(0.02)
            d = self.cpu_snapshot(relay, tids, clients)
            mem = tree_memory_kb(relay.proc.pid) if relay else None
            status1 = _relay_counters(relay)
            for watcher in watchers:
                watcher.stop()
            after = _held(clients, replicas, idle)
            idle_result, idle = (idle.stop() if idle else None), None
        finally:
            for c in clients:
                c.stop()
            if idle is not None:
                idle.stop()
            for r in replicas:
                try:
                    r.server.execute("STOP SLAVE")
                except Exception as exc:  # noqa: BLE001
                    log(f"replica {r.index}: STOP SLAVE: {exc}")
            if relay is not None:
                relay.stop()
            shutil.rmtree(pdir, ignore_errors=True)
            shutil.rmtree(cdir, ignore_errors=True)

        commits = w["commits"]
        seq_at = {s: t for s, _, t in commits}
        per_client = {i: [t - seq_at[s] for s, t in arr if s in seq_at] for i, arr in tail.arrivals.items()}
        lags_replicas: list[float] = []
        id_at = sorted((i, t) for _, i, t in commits)
        ids = [i for i, _ in id_at]
        for seen in poller.seen.values() if poller else ():
            prev = 0
            for m, t in seen:
                lags_replicas += [t - id_at[j][1] for j in range(bisect.bisect_right(ids, prev),
                                                                 bisect.bisect_right(ids, m))]
                prev = m
        window, idle_window = d["t"] - c0["t"], b["t"] - a["t"]

        def net(key):  # CPU over the load window, less the idle baseline's rate over as long
            if c0[key] is None or d[key] is None:
                return None
            used = d[key] - c0[key]
            base = (b[key] - a[key]) / idle_window * window if a[key] is not None and b[key] is not None else 0.0
            return {"load": round(used, 3), "idle_rate_pct": round(100 * (b[key] - a[key]) / idle_window, 2)
                    if a[key] is not None else None, "net": round(used - base, 3)}

        def counter(key):  # how much a /status counter grew over the load window
            if not status0 or not status1 or status0[key] is None or status1[key] is None:
                return None
            return status1[key] - status0[key]

        cpu = {k: net(k) for k in CPU_PARTS}
        client_bytes, replica_bytes = (sum(x - y for x, y in zip(after[n], before[n])) for n in (0, 1))
        idle_bytes = after[2] - before[2]  # at the socket: 5 more bytes an event (header, OK byte), ~3 % at OLTP
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
            "clients_short": sum(1 for c, s in zip(after[0], before[0]) if want is not None and c - s < want),
            "client_bytes": client_bytes, "replica_relay_log_bytes": replica_bytes, "idle_client_bytes": idle_bytes,
            "delivered_bytes": delivered,
            "delivered_mb_per_s": round(mb / window, 3) if window else None,
            "relay_status_bytes_sent": counter("bytes_sent"),
            "relay_fsyncs": counter("fsyncs"),
            "relay_fsync_seconds": counter("fsync_seconds"),
            "relay_fsync_max_seconds_ever": (status1 or {}).get("fsync_max_seconds"),
            "dump_threads": len(tids),
            "cpu_seconds": cpu,
            "sampled_clients": sampled,
            "lag_ms_clients": lag_summary([lag for lags in per_client.values() for lag in lags]),
            "lag_ms_replicas": lag_summary(lags_replicas),
            "replica_poll_errors": poller.errors[:3] if poller else [],
            "idle_clients_result": idle_result,
            "relay_memory_connected_kb": rss_connected,
            "relay_memory_end_kb": mem,
            "bytes_series": sampler.samples,
            "commits": commits,
            "client_arrivals": {i: [(s, t) for s, t in arr] for i, arr in tail.arrivals.items()},
            "t_go": c0["t"],
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


def _held(clients: list[BinlogClient], replicas: list[Replica], idle: IdleClients | None) -> tuple:
    """What the receivers hold now: each client's bytes, each replica's relay log bytes, the idle clients' bytes."""
    return [c.size() for c in clients], [r.relay_log_bytes() for r in replicas], idle.received() if idle else 0


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


def slim(phase: dict) -> dict:
    """The phase without its raw series (what the JSON report keeps)."""
    return {k: v for k, v in phase.items() if k not in ("bytes_series", "commits", "client_arrivals")}


# --- analysis of phases ---
def ceiling_steps(phase: dict, max_lag: float) -> list[dict]:
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
        in_step = [(s, tc) for s, _, tc in commits if lo <= tc < hi]
        lags = []
        missing = 0
        for s, tc in in_step:
            if tc >= lo + secs / 2:  # the step's second half
                got = arrivals_by_seq.get(s, [])
                missing += n_sampled - len(got)
                lags += [ta - tc for ta in got]
        b0, b1 = bytes_at(lo), bytes_at(hi)
        delivered = (b1 - b0) if b0 is not None and b1 is not None else None
        lag = lag_summary(lags)
        out.append({"rate": rate, "achieved_trx_s": round(len(in_step) / secs, 1),
                    "offered_mb_s": round(per_trx * len(in_step) * receivers / 1e6 / secs, 2),
                    "delivered_mb_s": round(delivered / 1e6 / secs, 2) if delivered is not None else None,
                    "lag_ms": lag, "missing_arrivals": missing,
                    "kept_up": missing == 0 and lag["p99"] is not None and lag["p99"] < max_lag * 1000})
        t = hi
    return out


FIGURES = (  # a summary figure: its name, its path in a phase, its scale; its row in the results, its digits
    ("writer_rate", ("writer_rate",), None, "writer rate achieved (trx/s)", 1),
    ("delivered_mb", ("delivered_bytes",), 1e-6, "delivered (MB, all clients + replicas)", 1),
    ("delivered_mb_per_s", ("delivered_mb_per_s",), None, "delivered MB/s", 2),
    ("drain_seconds", ("drain_seconds",), None, "drain: last commit -> everyone has it (s)", 3),
    ("relay_cpu_net_s", ("cpu_seconds", "relay", "net"), None, "relay CPU, net (s)", 2),
    ("relay_cpu_idle_pct", ("cpu_seconds", "relay", "idle_rate_pct"), None,
     "relay CPU idle baseline (% of a core)", 1),
    ("relay_cpu_s_per_mb", ("relay_cpu_s_per_mb",), None, "**relay CPU s per MB delivered**", 4),
    ("dump_threads_cpu_net_s", ("cpu_seconds", "dump_threads", "net"), None, "master dump threads CPU, net (s)", 2),
    ("dump_threads_cpu_s_per_mb", ("dump_threads_cpu_s_per_mb",), None, "**master dump threads CPU s per MB**", 4),
    ("mariadbd_cpu_net_s", ("cpu_seconds", "mariadbd", "net"), None, "mariadbd CPU, net (s)", 2),
    ("mariadbd_cpu_s_per_mb", ("mariadbd_cpu_s_per_mb",), None, "mariadbd CPU s per MB", 4),
    ("binlog_clients_cpu_net_s", ("cpu_seconds", "binlog_clients", "net"), None,
     "mariadb-binlog clients CPU, net (s)", 2),
    ("lag_clients_p50_ms", ("lag_ms_clients", "p50"), None, "lag p50, sampled mariadb-binlog clients (ms)", 1),
    ("lag_clients_p99_ms", ("lag_ms_clients", "p99"), None, "lag p99, sampled mariadb-binlog clients (ms)", 1),
    ("lag_clients_max_ms", ("lag_ms_clients", "max"), None, "lag max, sampled mariadb-binlog clients (ms)", 1),
    ("lag_replicas_p50_ms", ("lag_ms_replicas", "p50"), None, "lag p50, replicas, applied (ms)", 1),
    ("lag_replicas_p99_ms", ("lag_ms_replicas", "p99"), None, "lag p99, replicas, applied (ms)", 1),
    ("relay_rss_end_mb", ("relay_memory_end_kb", "rss_kb"), 1 / 1024, "relay RSS at the end (MB, all processes)", 1),
    ("relay_vmhwm_mb", ("relay_memory_end_kb", "hwm_kb_sum"), 1 / 1024,
     "relay peak RSS VmHWM (MB, sum over processes)", 1),
    ("relay_pss_end_mb", ("relay_memory_end_kb", "pss_kb"), 1 / 1024,
     "relay PSS at the end (MB, sum over processes)", 1),
    ("relay_processes", ("relay_memory_end_kb", "processes"), None, "relay processes at the end", 0),
    ("relay_status_mb_sent", ("relay_status_bytes_sent",), 1e-6, "relay /status bytes_sent (MB)", 1),
    ("relay_fsyncs", ("relay_fsyncs",), None, "relay fsyncs in the load window", 0),
    ("relay_fsync_seconds", ("relay_fsync_seconds",), None, "relay seconds in fsync in the load window", 2),
)


def _get(phase: dict | None, path: tuple):
    v = phase
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return v


def _ratio(a, b):
    return a / b if a is not None and b else None


def summarize_load(repeats: list[dict]) -> dict:
    """Median and range over the repeats of each figure, for relay and direct, and of the per-repeat ratios."""
    out: dict = {"relay": {}, "direct": {}, "ratios": {}}
    for target in ("relay", "direct"):
        for name, path, scale, _label, _digits in FIGURES:
            vals = [_get(rep["phases"].get(target), path) for rep in repeats]
            out[target][name] = spread([v * scale if v is not None and scale else v for v in vals])
    per: dict[str, list] = {k: [] for k in ("relay_vs_dump_threads", "relay_vs_mariadbd_difference",
                                            "lag_clients_p99", "lag_replicas_p99", "delivered_mb")}
    alt = []
    for rep in repeats:
        r, d = rep["phases"].get("relay"), rep["phases"].get("direct")
        if not r or not d:
            continue
        mb_d = d["delivered_bytes"] / 1e6
        rc = r.get("relay_cpu_s_per_mb")
        per["relay_vs_dump_threads"].append(_ratio(rc, d.get("dump_threads_cpu_s_per_mb")))
        # the master's dump work by difference: mariadbd serving N clients minus mariadbd serving the relay
        diff = (d["cpu_seconds"]["mariadbd"]["net"] - r["cpu_seconds"]["mariadbd"]["net"]) / mb_d if mb_d else None
        alt.append(diff)
        per["relay_vs_mariadbd_difference"].append(_ratio(rc, diff) if diff and diff > 0 else None)
        for key, path in (("lag_clients_p99", ("lag_ms_clients", "p99")),
                          ("lag_replicas_p99", ("lag_ms_replicas", "p99"))):
            per[key].append(_ratio(_get(r, path), _get(d, path)))
        per["delivered_mb"].append(r["delivered_bytes"] / d["delivered_bytes"] if d["delivered_bytes"] else None)
    out["direct"]["master_dump_by_difference_s_per_mb"] = spread(alt)
    out["ratios"] = {k: spread(v) for k, v in per.items()}
    return out


def run(args) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, 65536):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    work = Path(tempfile.mkdtemp(prefix="rp-fanout-real-"))
    servers = Path(tempfile.mkdtemp(prefix="rp-fanout-servers-", dir=args.servers_dir)) if args.servers_dir else work
    bench = RealBench(args, work, servers)
    report: dict = {"mode": "real", "loads": {}, "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    try:
        bench.start()
        for load in args.loads:
            repeats = [{"order": list(order), "phases": bench.pair(order, load, args.binlog_clients)}
                       for order in benchinfo.alternating_orders(args.repeats, TARGETS)]
            report["loads"][load] = {"rate": args.rates[load], "repeats": repeats, "summary": summarize_load(repeats)}
        for load in CEILING_STEPS if args.ceiling else ():
            report.setdefault("ceilings", {})[load] = ce = {
                "load": load, "step_seconds": CEILING_STEP_SECONDS, "max_lag_seconds": CEILING_MAX_LAG, "targets": {}}
            for target in TARGETS:
                sched = [(r, CEILING_STEP_SECONDS) for r in CEILING_STEPS[load]]
                ph = bench.phase(target, load, args.binlog_clients, schedule=sched, idle_seconds=2.0, drain=False)
                steps = ceiling_steps(ph, CEILING_MAX_LAG)
                kept = list(itertools.takewhile(lambda st: st["kept_up"], steps))
                pct = {k: round(100 * c["load"] / ph["window_seconds"], 1) if (c := ph["cpu_seconds"][k]) else None
                       for k in ("relay", "mariadbd")}
                ce["targets"][target] = {"steps": steps, "highest_kept_up": kept[-1] if kept else None,
                                         "relay_cpu_pct": pct["relay"], "mariadbd_cpu_pct": pct["mariadbd"]}
        if args.sweep:
            report["sweep"] = {"load": "oltp", "rate": SWEEP_RATE, "seconds": SWEEP_SECONDS, "points": []}
            orders = benchinfo.alternating_orders(len(SWEEP_COUNTS), TARGETS)
            for n, order in zip(SWEEP_COUNTS, orders):
                n_stream = min(n, SWEEP_STREAMING_MAX)
                phases = bench.pair(order, "oltp", n_stream, n_idle=n - n_stream, with_replicas=False,
                                    schedule=[(SWEEP_RATE, SWEEP_SECONDS)], idle_seconds=SWEEP_IDLE_SECONDS)
                report["sweep"]["points"].append({"clients": n, "streaming": n_stream, "idle": n - n_stream,
                                                  "order": list(order), "phases": phases,
                                                  "summary": summarize_load([{"phases": phases}])})
    finally:
        bench.stop()
        for tree in {work, servers}:
            shutil.rmtree(tree, ignore_errors=True)
    return report


# --- the results file ---
RATIO_ROWS = (  # the per-repeat ratios table: (label, ratio, digits, bold)
    ("relay CPU per MB / master dump threads CPU per MB", "relay_vs_dump_threads", 2, True),
    ("relay CPU per MB / master dump work by difference", "relay_vs_mariadbd_difference", 2, False),
    ("lag p99, sampled clients", "lag_clients_p99", 2, False),
    ("lag p99, replicas", "lag_replicas_p99", 2, False),
    ("bytes delivered", "delivered_mb", 3, False),
)


def _intro(a: dict) -> list[str]:
    """The paragraphs that say how the run measured (from the report's args)."""
    writers = "its own process" if a.get("writers", 1) == 1 else \
        f"{a['writers']} processes, one connection each, sharing the rate"
    servers = (f" The master's and the replicas' data directories are on {a['servers_dir']} (`--servers-dir`), the "
               f"mariadb-binlog clients' output on {a.get('clients_dir') or 'the relay disk'}; the relay directory is "
               "on the disk." if a.get("servers_dir") else "")
    return [
        f"Clients: {a['binlog_clients']} `mariadb-binlog --read-from-remote-server --raw --stop-never` processes "
        f"(each writing its own directory) and {a['real_replicas']} real MariaDB 10.11 replicas (sandboxes, "
        "file/position, no binlog of their own), all started at the master's end position of the phase. Phase "
        "`relay`: they connect to `relayproxy run --listen` (started for the phase on its relay directory, "
        f"replicating from the master; relay options: {a['relay_option'] or 'defaults'}); phase `direct`: the relay "
        f"stopped, the same clients connect to the master. Phase order alternates over {a['repeats']} repeats "
        "(relay-direct, direct-relay, ...); figures are the median (min-max) over the repeats; each ratio is "
        "computed per repeat (relay and direct of the same repeat) and then summarized." + servers,
        "",
        f"Per phase: an idle window of {a['idle_seconds']:g} s with every client connected and no load (CPU "
        f"baseline), then the load for {a['seconds']:g} s, until every client and replica has the master's last "
        "byte (the load window). CPU over the load window minus the idle rate times its length. `relay` = the relay "
        "process and all its descendants (user+sys from /proc/<pid>/stat, found through /proc/<pid>/task/*/children);"
        " `dump threads` = the master's `Binlog Dump` threads only (on-CPU time from "
        "/proc/<mariadbd>/task/<tid>/schedstat, the threads found by `performance_schema.threads.THREAD_OS_ID`, "
        "which the benchmark turns on); `mariadbd` = the whole server. In the relay phase the master's dump threads "
        "serve only the relay. Delivered bytes = growth of the mariadb-binlog output files + growth of the "
        "replicas' relay logs over the load window (the replicas ask for no ANNOTATE_ROWS events, mariadb-binlog "
        "does). The master's dump work is also shown by difference: mariadbd's net CPU in the direct phase minus in "
        "the relay phase, per MB delivered.",
        "",
        f"Lag: the writer ({writers}) records each COMMIT's return time; for {a['sample_clients']} sampled "
        f"mariadb-binlog clients (evenly spread over the indices; polled every {a['tail_interval'] * 1000:g} ms, "
        "which bounds the resolution) a tail parser notes when each transaction's XID is in the output file; for "
        f"every replica `SELECT MAX(id)` every {a['replica_poll_interval'] * 1000:g} ms notes when each "
        "transaction's row was applied (apply time included).",
        "",
        "**The machine has 2 cores shared with other work: master, relay, writer, replicas and all clients run on "
        "them.** Absolute numbers are noise; the relay/direct ratios of one run are the result.",
        "",
    ]


def _load_section(load: str, body: dict) -> list[str]:
    sm, rt = body["summary"], body["summary"]["ratios"]
    rep0 = body["repeats"][0]["phases"]["relay"]
    events = ("~150-byte row events (autocommit INSERT / INSERT+UPDATE)" if load == "oltp"
              else f"one {BULK_BYTES}-byte BLOB row per transaction (8 KB row events)")
    out = [f"## Load `{load}`: {body['rate']:g} trx/s, {events}", "",
           f"{rep0['binlog_clients']} mariadb-binlog clients + {rep0['replicas']} replicas; lag sampled on clients "
           f"{rep0['sampled_clients']} and on every replica.", "",
           "| per phase | relay | direct (master) |", "|---|---:|---:|"]
    for key, _path, _scale, label, digits in FIGURES:
        r, d = sm["relay"].get(key), sm["direct"].get(key)
        if (r and r["median"] is not None) or (d and d["median"] is not None):
            out.append(md_row(label, fmt_spread(r, digits), fmt_spread(d, digits)))
    out += [f"| master dump work by difference (mariadbd direct - relay), CPU s per MB | | "
            f"{fmt_spread(sm['direct']['master_dump_by_difference_s_per_mb'], 4)} |",
            "", "| ratio (relay / direct, per repeat) | median (range) |", "|---|---:|"]
    for label, key, digits, bold in RATIO_ROWS:
        stars = "**" if bold else ""
        out.append(md_row(f"{stars}{label}{stars}", f"{stars}{fmt_spread(rt[key], digits)}{stars}"))
    bad = [(i, t, p["label"]) for i, rep in enumerate(body["repeats"]) for t, p in rep["phases"].items()
           if not p["converged"]]
    return out + ["", f"**Phases where not every client reached the master's end: {bad}**" if bad else
                  "Every client and replica of every phase reached the master's final position.", ""]


def _ceiling_section(ce: dict) -> list[str]:
    out = [f"## Egress ceiling ({ce['load']} load, rate ladder, {ce['step_seconds']:g} s a step)", "",
           "A step is kept up when every sampled client got every transaction committed in the step's second half, "
           f"with p99 lag there below {ce['max_lag_seconds']:g} s (lag that grows without bound fails both). Offered "
           "MB/s = the load's bytes per transaction x transactions committed in the step x receivers; delivered MB/s "
           "= what the clients and replicas together received during the step. A step where the writer achieved "
           "less than 90 % of the asked rate is marked *writer-bound*: the master (or the machine) limited it, not "
           "the target.", "",
           "| target | trx/s asked | trx/s achieved | offered MB/s | delivered MB/s | lag p99 (ms) | kept up |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for target, t in ce["targets"].items():
        for st in t["steps"]:
            bound = " (writer-bound)" if st["achieved_trx_s"] < 0.9 * st["rate"] else ""
            out.append(md_row(target, f"{st['rate']:g}", st["achieved_trx_s"], st["offered_mb_s"],
                              st["delivered_mb_s"], st["lag_ms"]["p99"], ("yes" if st["kept_up"] else "no") + bound))
    out.append("")
    for target, t in ce["targets"].items():
        best = t["highest_kept_up"]
        out.append(f"- {target}: highest rate kept up "
                   + (f"{best['rate']:g} trx/s, {best['delivered_mb_s']} MB/s delivered" if best else "none")
                   + f" (relay CPU {t['relay_cpu_pct']} % / mariadbd CPU {t['mariadbd_cpu_pct']} % of a core "
                     "over the whole ladder)")
    return out + [""]


def _sweep_section(sw: dict) -> list[str]:
    command = [f"Command: `{sw['command']}`" + (f" ({sw['command_note']})" if sw.get("command_note") else ""),
               ""] if sw.get("command") else []
    out = [f"## Scale sweep (OLTP, {sw['rate']:g} trx/s, {sw['seconds']:g} s a phase, no replicas)", "", *command,
           f"Up to {SWEEP_STREAMING_MAX} clients are mariadb-binlog processes; beyond that the rest are cheap asyncio "
           "dump clients in one helper process (connect, register, dump from the end, read and discard: they receive "
           "the stream too; their bytes, counted at the socket with the packet headers, are part of the delivered "
           "bytes). One repeat per point, phase order alternating. The relay's CPU includes its upstream work "
           "(receiving, CRC, writing and fsyncing the stream once), which weighs most with few clients; *marginal* "
           "= (CPU here - CPU at the previous point) / (MB here - MB there), relay over dump threads: the cost of the "
           "added clients alone.", "",
           "| clients | relay CPU s/MB | dump threads CPU s/MB | ratio | marginal ratio | lag p99 relay (ms) | "
           "lag p99 direct (ms) | relay RSS end (MB) | relay VmHWM (MB) | converged r/d |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    prev = None
    for pt in sw["points"]:
        s = pt["summary"]
        r, d = s["relay"], s["direct"]
        cur = (r["relay_cpu_net_s"]["median"], r["delivered_mb"]["median"], d["dump_threads_cpu_net_s"]["median"],
               d["delivered_mb"]["median"])
        marginal = "-"
        if prev is not None and None not in cur and None not in prev and cur[1] > prev[1] and cur[3] > prev[3]:
            d_slope = (cur[2] - prev[2]) / (cur[3] - prev[3])
            marginal = f"{(cur[0] - prev[0]) / (cur[1] - prev[1]) / d_slope:.2f}" if d_slope > 0 else "-"
        prev = cur
        out.append(md_row(f"{pt['clients']} ({pt['streaming']}+{pt['idle']})",
                          fmt_spread(r["relay_cpu_s_per_mb"], 4), fmt_spread(d["dump_threads_cpu_s_per_mb"], 4),
                          fmt_spread(s["ratios"]["relay_vs_dump_threads"], 2), marginal,
                          fmt_spread(r["lag_clients_p99_ms"], 1), fmt_spread(d["lag_clients_p99_ms"], 1),
                          fmt_spread(r["relay_rss_end_mb"], 1), fmt_spread(r["relay_vmhwm_mb"], 1),
                          f"{pt['phases']['relay']['converged']}/{pt['phases']['direct']['converged']}"))
    return out + [""]


def render_markdown(report: dict, notes: str | None, png_name: str) -> str:
    out = ["# Fan-out to real clients: relayproxy vs. MariaDB's own dump threads", "", "Command:", "",
           f"    {report['command']}", "", *_intro(report["args"])]
    for load, body in report["loads"].items():
        out += _load_section(load, body)
    for ce in report.get("ceilings", {}).values():
        out += _ceiling_section(ce)
    if report.get("sweep"):
        out += _sweep_section(report["sweep"])
    if notes:
        out += [notes.rstrip(), ""]
    out += [f"![CPU per MB and lag]({png_name})", "", *benchinfo.machine_section(report["machine"])]
    return "\n".join(out)


def write_plot(path: Path, report: dict) -> bool:
    plt = benchinfo.pyplot()
    if plt is None:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    sw = report.get("sweep")
    if sw and sw["points"]:
        xs = [p["clients"] for p in sw["points"]]
        for ax, target, key, color, label in (
                (ax1, "relay", "relay_cpu_s_per_mb", "#c44e52", "relay (all processes)"),
                (ax1, "direct", "dump_threads_cpu_s_per_mb", "#4c72b0", "mariadbd dump threads (direct)"),
                (ax2, "relay", "lag_clients_p99_ms", "#c44e52", "through relay, p99"),
                (ax2, "direct", "lag_clients_p99_ms", "#4c72b0", "direct, p99")):
            ax.plot(xs, [p["summary"][target][key]["median"] for p in sw["points"]], "o-", color=color, label=label)
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
            xs = [i + (j - 0.5) * width for i in range(len(loads))]
            summaries = [report["loads"][ld]["summary"][target] for ld in loads]
            ax1.bar(xs, [s[key]["median"] or 0 for s in summaries], width, color=color,
                    label="relay" if target == "relay" else "mariadbd dump threads")
            ax2.bar(xs, [s["lag_clients_p99_ms"]["median"] or 0 for s in summaries], width, color=color,
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real", action="store_true", help="changes nothing (the results files' commands have it)")
    p.add_argument("--quick", action="store_true", help="5 clients + 1 replica, one repeat, 2 x 5 s a phase, no "
                   "ceiling; writes nothing unless --output-dir is given")
    p.add_argument("--binlog-clients", type=int, default=None, help="mariadb-binlog clients (default 50; --quick 5)")
    p.add_argument("--real-replicas", type=int, default=None, help="MariaDB replicas (default 3; --quick 1)")
    p.add_argument("--loads", default="oltp,bulk", help="comma-separated: oltp, bulk")
    p.add_argument("--oltp-rate", type=float, default=DEFAULT_RATES["oltp"], help="OLTP trx/s (default 300)")
    p.add_argument("--repeats", type=int, default=None, help="repeats of relay+direct per load (default 3; --quick 1)")
    p.add_argument("--writers", type=int, default=1, help="writer processes sharing the rate (one: ~600 trx/s at most)")
    p.add_argument("--relay-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of `relayproxy run` for the relay phases (repeatable), e.g. sender_processes=2")
    p.add_argument("--clients-dir", default=None, metavar="DIR", help="where the mariadb-binlog clients write "
                   "(default: the work directory, whose writeback the relay's fdatasync waits behind; e.g. /dev/shm)")
    p.add_argument("--servers-dir", default=None, metavar="DIR", help="where the master's and the replicas' data "
                   "directories live (default: the work directory, on the relay's disk; e.g. /dev/shm)")
    p.add_argument("--sample-clients", type=int, default=4, help="mariadb-binlog clients whose lag is measured")
    p.add_argument("--tail-interval", type=float, default=0.002, help="seconds between polls of the sampled files")
    p.add_argument("--no-ceiling", dest="ceiling", action="store_false", help="no rate ladder (nor with --quick)")
    p.add_argument("--sweep", action="store_true", help="also the scale sweep (1..1000 clients; ~10 min more)")
    p.add_argument("--baseline", action="store_true", help="the results files are fanout_real_baseline.md/.png")
    p.add_argument("--stem", default=None, help="the results files' name without .md/.png (default fanout_real)")
    p.add_argument("--output-dir", type=Path, default=None, help=f"where results go (default {RESULTS_DIR}; none "
                   "with --quick)")
    add_report_options(p, saved="the report")
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.rates = {"oltp": args.oltp_rate or DEFAULT_RATES["oltp"], "bulk": DEFAULT_RATES["bulk"]}
    args.loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    for x in args.loads:
        if x not in LOADS:
            raise SystemExit(f"unknown load {x!r} (oltp, bulk)")
    for o in args.relay_option:
        if "=" not in o:
            raise SystemExit(f"--relay-option wants KEY=VALUE, got {o!r}")
    args.ceiling = args.ceiling and not args.quick
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from relayproxy.log import configure_logging

    configure_logging(fmt="json", level="warning")
    # SIGTERM (and SIGINT, which a background job may have ignored) end the run through the finally blocks, which
    # stop the clients, the relay and the sandboxes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.render is not None:
        report = json.loads(args.render.read_text())
    else:
        report = run(args)
        given = vars(args) | {"replica_poll_interval": REPLICA_POLL_INTERVAL}
        report["args"] = {k: given[k] for k in (
            "binlog_clients", "real_replicas", "repeats", "idle_seconds", "seconds", "rates", "relay_option",
            "sample_clients", "tail_interval", "replica_poll_interval", "quick", "writers", "clients_dir",
            "servers_dir")}
        report["machine"] = benchinfo.machine_info(server=True)
        report["command"] = benchinfo.command_line(__file__, argv)
    if args.save_json is not None:
        args.save_json.write_text(json.dumps(report, indent=1))
    out_dir = args.output_dir if args.output_dir is not None else (None if args.quick else RESULTS_DIR)
    if out_dir is not None:
        stem = args.stem or ("fanout_real_baseline" if args.baseline else "fanout_real")
        text = render_markdown(report, args.notes.read_text() if args.notes else None, f"{stem}.png")
        write_results(out_dir / f"{stem}.md", text, log)
        write_plot(out_dir / f"{stem}.png", report)
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


if __name__ == "__main__":
    sys.exit(main())
