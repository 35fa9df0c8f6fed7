"""Hostile clients' attacks against a running relay while a real MariaDB replica streams through it: a real master with a
writer, the relay as a process (lab/harness.py), a real replica of the relay. After each attack: the replica's
GTID position advanced (the largest gap between its observed advances during the attack is printed, never
asserted), the relay's RSS came back within a generous margin of its baseline, and the relay's log grew by a few
lines at most; at the end the relay's files equal the master's byte for byte and the replica has everything.

The attackers come from other loopback addresses than the replica (127.0.0.2-4): the failed-login burst and the
idle flood throttle, block or fill their own host, never the replica's. The HTTP idle flood holds far more idle
connections on --http than its cap while /status and /metrics are read."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
import urllib.request
from pathlib import Path

import pymysql
import pytest

from relayproxy.lab.harness import (
    RelayProcess,
    Writer,
    assert_files_equal_master,
    free_port,
    master_status,
    prepare_master,
    wait_relay,
    wait_replica,
)
from relayproxy.upstream.connection import UpstreamConnection

pytestmark = pytest.mark.server

CONFIG = """
max_connect_errors = 10
login_failures_threshold = 3
login_min_delay = 0.05
login_max_delay = 0.2
http_max_connections = 16
handshake_timeout = 2.0
net_read_timeout = 2.0

[[users]]
name = "repl"
password = "replpw"
plugin = "mysql_native_password"

[[users]]
name = "app"
password = "apppw"
plugin = "mysql_native_password"
privileges = []

[[users]]
name = "ops"
password = "opspw"
plugin = "mysql_native_password"
admin = true
"""
SQL_HOST, FLOOD_HOST, BURST_HOST = "127.0.0.2", "127.0.0.3", "127.0.0.4"
RSS_MARGIN = 96 * 1024 * 1024  # generous: the allocator keeps some freed memory
# A client host may cause 10 log lines a minute (the server's PeerLogLimiter), plus a line or two the relay writes
# once per event (a host blocked, hosts flushed, an older dump ended).
LOG_LINES_PER_ATTACK = 12
REPLICA_SERVER_ID = 3


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class Progress:
    """Polls the replica's @@gtid_slave_pos from a thread; the times it changed."""

    def __init__(self, replica) -> None:
        self.replica = replica
        self.changes: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        conn = self.replica.connect()
        cur = conn.cursor()
        last = None
        while not self._stop.is_set():
            cur.execute("SELECT @@gtid_slave_pos")
            pos = cur.fetchone()[0]
            if pos != last:
                self.changes.append((time.monotonic(), pos))
                last = pos
            time.sleep(0.02)
        conn.close()

    def advanced_since(self, t0: float) -> bool:
        return any(t > t0 for t, _ in self.changes)

    def largest_gap(self, t0: float, t1: float) -> float:
        """The longest time without an observed advance, over the window [t0, t1]."""
        times = [t for t, _ in self.changes]
        before = [t for t in times if t <= t0]
        points = ([before[-1]] if before else [t0]) + [t for t in times if t0 < t <= t1]
        after = [t for t in times if t > t1]
        points.append(after[0] if after else t1)
        return max(b - a for a, b in zip(points, points[1:]))


def connect(user: str, password: str, port: int, source: str = SQL_HOST) -> pymysql.connections.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user=user, password=password, bind_address=source,
                           connect_timeout=10, read_timeout=30)


def expect_error(port: int, sql: str, codes: tuple[int, ...]) -> int:
    conn = connect("app", "apppw", port)
    try:
        with pytest.raises(pymysql.MySQLError) as info:
            conn.cursor().execute(sql)
    finally:
        conn.close()
    assert info.value.args[0] in codes, (sql[:60], info.value.args)
    return info.value.args[0]


# -- the attacks -----------------------------------------------------------------------------------------------------


def big_select(port: int) -> None:
    expect_error(port, "SELECT " + "1+" * (1 << 19) + "1", (1153,))


def like_backtracking(port: int) -> None:
    conn = connect("app", "apppw", port)
    try:
        cur = conn.cursor()
        cur.execute("SELECT '" + "a" * 1152 + "' LIKE '%a%a%ab'")
        assert cur.fetchall() == ((0,),)
    finally:
        conn.close()


def deep_parentheses(port: int) -> None:
    expect_error(port, "SELECT " + "(" * 150 + "1" + ")" * 150, (1064,))


def concat_growth(port: int) -> None:
    conn = connect("app", "apppw", port)
    try:
        cur = conn.cursor()
        cur.execute("SET @a = '" + "x" * 1300 + "'")
        with pytest.raises(pymysql.MySQLError) as info:
            for _ in range(20):
                cur.execute("SET @a = CONCAT(@a, @a, @a, @a, @a, @a, @a, @a)")
        assert info.value.args[0] == 1301, info.value.args
    finally:
        conn.close()


def long_user_name(port: int) -> None:
    with pytest.raises(pymysql.MySQLError) as info:
        connect("u" * 300, "x", port)
    assert info.value.args[0] == 1045, info.value.args


def idle_flood(port: int) -> None:
    """150 connections from one host that read the greeting and say nothing (more than the unauthenticated
    budget, 100): then a login from that host still works."""
    flood = []
    try:
        for _ in range(150):
            s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(FLOOD_HOST, 0))
            flood.append(s)
        time.sleep(1.2)  # older than the eviction grace period
        conn = connect("repl", "replpw", port, source="127.0.0.5")
        conn.close()
        time.sleep(2.5)  # handshake_timeout ends the rest
    finally:
        for s in flood:
            s.close()


def half_sent_packet(port: int) -> None:
    """Log in, announce a 1000-byte command and send 10 bytes of it: dropped after net_read_timeout (1159)."""
    conn = connect("repl", "replpw", port)
    sock = conn._sock  # noqa: SLF001 (a broken client, below the driver)
    sock.sendall(struct.pack("<I", 1000) + b"\x03SELECT 1 ")  # length 1000, sequence 0; 10 bytes of it
    sock.settimeout(20)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    assert data[4] == 0xFF and int.from_bytes(data[5:7], "little") == 1159, data[:80]


def zombie_dump(port: int) -> None:
    """A dump with the replica's server_id: the relay ends the replica's older dump, as the servers do; the
    replica reconnects (MASTER_CONNECT_RETRY=1) and ends this one in turn."""
    async def attack() -> None:
        conn = await UpstreamConnection.connect("127.0.0.1", port, "repl", "replpw", ssl_mode="disabled")
        try:
            await conn.query("SET @master_binlog_checksum = 'CRC32'")
            file = (await conn.query("SHOW MASTER STATUS")).rows[0][0]
            await conn.binlog_dump(file.decode() if isinstance(file, bytes) else file, 4, REPLICA_SERVER_ID)
            with pytest.raises(Exception):  # ended by the replica's reconnect (or our timeout)
                async with asyncio.timeout(10):
                    while True:
                        await conn.read_packets()
        finally:
            await conn.close()

    asyncio.run(attack())


def heartbeat_overflow(port: int) -> None:
    conn = connect("repl", "replpw", port)
    try:
        cur = conn.cursor()
        try:
            cur.execute("SET @master_heartbeat_period = 1e400")
        except pymysql.MySQLError as exc:
            assert exc.args[0] != 1105, exc.args  # a clear error, never an internal one
    finally:
        conn.close()


def failed_login_burst(port: int) -> None:
    """25 wrong passwords: every one is 1045 (slowed down after the third, never a block, as the servers), and the
    right one still logs in. Then 12 connections closed without a handshake: those block the host (1129) until FLUSH
    HOSTS."""
    codes = []
    for _ in range(25):
        try:
            pymysql.connect(host="127.0.0.1", port=port, user="repl", password="wrong", bind_address=BURST_HOST,
                            connect_timeout=10).close()
        except pymysql.MySQLError as exc:
            codes.append(exc.args[0])
    assert codes == [1045] * 25, codes
    pymysql.connect(host="127.0.0.1", port=port, user="repl", password="replpw", bind_address=BURST_HOST,
                    connect_timeout=10).close()
    for _ in range(12):
        socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(BURST_HOST, 0)).close()
    deadline = time.monotonic() + 30
    while True:  # the relay counts a close after the client has moved on
        try:
            pymysql.connect(host="127.0.0.1", port=port, user="repl", password="replpw", bind_address=BURST_HOST,
                            connect_timeout=10).close()
        except pymysql.MySQLError as exc:
            assert exc.args[0] == 1129, exc.args
            break
        assert time.monotonic() < deadline, "12 handshake errors did not block the host"
        for _ in range(10):
            socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(BURST_HOST, 0)).close()
    admin = connect("ops", "opspw", port)  # from another host: FLUSH HOSTS lets the burst's host in again
    admin.cursor().execute("FLUSH HOSTS")
    admin.close()
    pymysql.connect(host="127.0.0.1", port=port, user="repl", password="replpw", bind_address=BURST_HOST).close()


_HTTP: dict[str, int] = {}  # the relay's --http port, set by the test


def http_idle_flood(port: int) -> None:
    """1,500 idle connections on --http (cap 16): /status and /metrics still answer, and report the drops."""
    http = _HTTP["port"]
    flood = []
    try:
        for _ in range(1500):
            flood.append(socket.create_connection(("127.0.0.1", http), timeout=10, source_address=(FLOOD_HOST, 0)))
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=30) as response:
            assert response.status == 200
            doc = json.load(response)
        assert doc["http"]["dropped_idle"] >= 1500 - 16, doc["http"]
        assert doc["logins"]["throttle"]["failed_logins"] >= 25, doc["logins"]
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=30) as response:
            assert response.status == 200 and b"relayproxy_http_idle_dropped" in response.read()
    finally:
        for s in flood:
            s.close()


ATTACKS = [big_select, like_backtracking, deep_parentheses, concat_growth, long_user_name, idle_flood,
           half_sent_packet, zombie_dump, heartbeat_overflow, failed_login_burst, http_idle_flood]


def test_attacks_while_a_replica_streams(mariadb, tmp_path: Path) -> None:
    master = mariadb("master")
    prepare_master(master)
    config = tmp_path / "relay.toml"
    config.write_text(CONFIG)
    listen = free_port()
    relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb",
                         extra=["--listen", f"127.0.0.1:{listen}", "--config", str(config)]).start()
    _HTTP["port"] = relay.http_port
    replica = mariadb("replica", server_id=REPLICA_SERVER_ID)
    report = []
    baseline = 0
    try:
        with Writer(master, rotate_every=10**9) as writer:
            replica.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={listen}, MASTER_USER='repl', "
                            "MASTER_PASSWORD='replpw', MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos")
            replica.execute("START SLAVE")
            with Progress(replica) as progress:
                deadline = time.monotonic() + 60
                while not progress.advanced_since(time.monotonic() - 0.5) or writer.done < 50:
                    assert time.monotonic() < deadline, "the replica does not stream through the relay"
                    time.sleep(0.1)
                pid = relay.proc.pid
                baseline = rss(pid)
                for attack in ATTACKS:
                    lines_before = len(relay.log_path.read_bytes().splitlines())
                    t0 = time.monotonic()
                    attack(listen)
                    t1 = time.monotonic()
                    deadline = time.monotonic() + 30
                    while not progress.advanced_since(t1):
                        assert time.monotonic() < deadline, f"{attack.__name__}: the replica stopped receiving"
                        time.sleep(0.05)
                    assert progress.advanced_since(t0)
                    deadline = time.monotonic() + 30
                    while rss(pid) > baseline + RSS_MARGIN:
                        assert time.monotonic() < deadline, (
                            f"{attack.__name__}: relay RSS {rss(pid)} stays above its baseline {baseline}")
                        time.sleep(0.2)
                    grown = len(relay.log_path.read_bytes().splitlines()) - lines_before
                    report.append((attack.__name__, t1 - t0, progress.largest_gap(t0, t1), rss(pid), grown))
                    assert grown <= LOG_LINES_PER_ATTACK, (
                        f"{attack.__name__}: the relay log grew by {grown} lines\n{relay.log_tail(grown)}")
                    assert "Traceback" not in relay.log_tail(grown + 1), attack.__name__
        assert writer.done > 0
        wait_relay(relay, master)
        wait_replica(replica, master)
        assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))
        assert replica.execute("SELECT COUNT(*) FROM app.w") == master.execute("SELECT COUNT(*) FROM app.w")
    finally:
        print(f"\nrelay RSS baseline {baseline / 2**20:.1f} MiB")
        print(f"{'attack':20} {'seconds':>8} {'largest replica gap (s)':>24} {'RSS MiB':>8} {'log lines':>9}")
        for name, seconds, gap, memory, grown in report:
            print(f"{name:20} {seconds:8.2f} {gap:24.3f} {memory / 2**20:8.1f} {grown:9d}")
        relay.stop()
