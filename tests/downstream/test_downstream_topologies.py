"""Topologies around the relay with real servers: a MariaDB replica repointed between the relay and the master with
the same coordinates, chains of relays (master -> relay A -> relay B -> replica), mariadb-binlog --stop-never
through the relay, and 20 dump clients at once through one relay while the master takes load."""

from __future__ import annotations

import concurrent.futures
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pymysql
import pytest

from relayproxy.lab.harness import (  # noqa: F401 - re-exported: other test modules import them from here
    FIRST_FILE,
    RelayProcess,
    Writer,
    assert_files_equal_master,
    assert_same_data,
    change_master,
    free_port,
    master_status,
    prepare_master,
    replica_status,
    user_tables,
    wait_relay,
    wait_replica,
)
from ..scenarios.test_relay_e2e import mixed_load

pytestmark = pytest.mark.server

USERS_TOML = """
[[users]]
name = "repl"
password = "replpw"
plugin = "mysql_native_password"
"""


# -- helpers ------------------------------------------------------------------------------------------------------


@pytest.fixture
def relays(tmp_path):
    """Factory for `relayproxy run --listen` processes (every one stopped at the end): `relays(name, upstream_port,
    server_id=..., gtid_mode=..., extra=[flags])`, started, with `.listen_port`; account repl/replpw."""
    started: list[RelayProcess] = []
    config = tmp_path / "users.toml"
    config.write_text(USERS_TOML)

    def start(name: str, upstream_port: int, *, server_id: int = 100, gtid_mode: str = "mariadb",
              extra: list[str] = ()) -> RelayProcess:
        listen = free_port()
        relay = RelayProcess(
            tmp_path / name, upstream_port, server_id=server_id, gtid_mode=gtid_mode,
            extra=["--listen", f"127.0.0.1:{listen}", "--config", str(config), *extra],
        )
        relay.listen_port = listen
        started.append(relay)
        return relay.start()

    yield start
    for relay in reversed(started):
        relay.stop()


@pytest.fixture
def tools():
    """Start long-running client processes (mariadb-binlog --stop-never); each is ended at the end of the test."""
    procs: list[subprocess.Popen] = []

    def start(args: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        proc.log_path = log
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def binlog_tool() -> str:
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    assert tool, "mariadb-binlog is part of the mariadb-server packages"
    return tool


def stop_never_args(port: int, out: Path, server_id: int, first: str = FIRST_FILE) -> list[str]:
    return [
        binlog_tool(), "--read-from-remote-server", "--stop-never", f"--stop-never-slave-server-id={server_id}",
        "--raw", "-h127.0.0.1", f"-P{port}", "-urepl", "-preplpw", f"--result-file={out}/", first,
    ]


def stop_replica(replica) -> tuple[str, int]:
    """STOP SLAVE; the (Relay_Master_Log_File, Exec_Master_Log_Pos) the SQL thread stopped at."""
    replica.execute("STOP SLAVE")
    status = replica_status(replica)
    assert status["Slave_IO_Running"] == "No" and status["Slave_SQL_Running"] == "No", status
    assert not status["Last_IO_Error"] and not status["Last_SQL_Error"], status
    return status["Relay_Master_Log_File"], int(status["Exec_Master_Log_Pos"])


def wait_connected(replica, port: int, timeout: float = 30.0) -> dict:
    """Wait until the replica's IO thread runs against `port` (no error on either thread)."""
    deadline = time.monotonic() + timeout
    status = {}
    while time.monotonic() < deadline:
        status = replica_status(replica)
        assert not status.get("Last_IO_Error") and not status.get("Last_SQL_Error"), status
        if status.get("Slave_IO_Running") == "Yes" and int(status.get("Master_Port") or 0) == port:
            return status
        time.sleep(0.05)
    raise AssertionError(f"replica did not connect to port {port}: {status}")


def wait_files(
    out: Path, master, *, relay: RelayProcess, procs: list[subprocess.Popen], timeout: float = 60.0
) -> None:
    """Wait until every file of the master exists in `out` with the master's size (the active one: its position);
    `procs` (the downloading tools) must keep running meanwhile."""
    deadline = time.monotonic() + timeout
    want: dict[str, int] = {}
    have: dict[str, int] = {}
    while time.monotonic() < deadline:
        file, pos = master_status(master)
        want = {p.name: p.stat().st_size for p in master.binlog_files()}
        want[file] = pos
        have = {p.name: p.stat().st_size for p in out.iterdir() if p.name != "relayproxy.index"}
        if have == want:
            return
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited with {proc.returncode} before catching up:\n"
                                     f"{proc.log_path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    logs = "\n".join(proc.log_path.read_text(errors="replace")[-1000:] for proc in procs)
    raise AssertionError(f"{out}: files did not reach the master's sizes: have {have}, want {want}; relay status "
                         f"{relay.status()}\ntool output:\n{logs}\nrelay log:\n{relay.log_tail(20)}")


def assert_download_equals_master(out: Path, master) -> None:
    names = sorted(p.name for p in out.iterdir() if p.name != "relayproxy.index")
    assert names == [p.name for p in master.binlog_files()]
    (out / "relayproxy.index").write_text("".join(f"{n}\n" for n in names))
    assert_files_equal_master(out, master, up_to=master_status(master))


# -- repointing ---------------------------------------------------------------------------------------------------


def test_replica_repoints_between_relay_and_master_with_the_same_coordinates(mariadb, relays):
    """File/position replica of the relay -> the master -> the relay again, each time from its own
    Relay_Master_Log_File / Exec_Master_Log_Pos, while the master writes: no gap, no duplicate."""
    master = mariadb("master")
    prepare_master(master)
    relay = relays("relay", master.port, gtid_mode="off")
    mixed_load(master, big=False)
    wait_relay(relay, master)
    replica = mariadb("replica", server_id=3)
    change_master(replica, relay.listen_port)
    replica.execute("START SLAVE")
    wait_replica(replica, master)

    with Writer(master) as writer:
        time.sleep(1.0)
        # The relay -> the master, mid-load.
        first = stop_replica(replica)
        assert writer.done > 0
        change_master(replica, master.port, file=first[0], pos=first[1])
        replica.execute("START SLAVE")
        wait_connected(replica, master.port)
        time.sleep(1.0)
        # The master -> the relay, mid-load. The replica may be a few transactions ahead of the relay's horizon;
        # repointing needs the relay to have the position, as it would with another replica of the master.
        second = stop_replica(replica)
        assert second > first, "the replica applied nothing while it replicated from the master"
        relay.wait_for(lambda s: (s["master_log_file"], s["read_master_log_pos"]) >= second, 30,
                       f"relay horizon past {second}")
        change_master(replica, relay.listen_port, file=second[0], pos=second[1])
        replica.execute("START SLAVE")
        wait_connected(replica, relay.listen_port)
        time.sleep(1.0)
    assert writer.done > 100, writer.done
    mixed_load(master, big=False)
    wait_relay(relay, master)
    status = wait_replica(replica, master)
    assert int(status["Master_Port"]) == relay.listen_port
    assert not status["Last_IO_Error"] and not status["Last_SQL_Error"], status
    assert_same_data(master, replica)
    assert replica.execute("SELECT COUNT(*), COUNT(DISTINCT n), MIN(n), MAX(n) FROM app.w")[0] == (
        writer.done, writer.done, 1, writer.done
    )
    # Every transaction applied exactly once: the replica's GTID position is the master's.
    assert replica.execute("SELECT @@gtid_slave_pos")[0][0] == master.execute("SELECT @@gtid_binlog_pos")[0][0]


# -- chains -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("b_semi_sync", ["on", "off"])
@pytest.mark.parametrize("b_gtid_mode", ["off", "mariadb"])
def test_chain_of_two_relays_feeds_a_replica(mariadb, relays, b_gtid_mode, b_semi_sync):
    """master -> relay A -> relay B (a replica of A's --listen, by file/position or MariaDB GTID) -> MariaDB replica,
    under mixed load (XA, events over 16 MB, rotations) and a kill -9 of relay B: the replica ends with the master's
    data, both relays with the master's files. B runs with --semi-sync on and off, but the master has semi-sync off,
    so neither variant carries a semi-sync stream: they show only that the option changes nothing here."""
    master = mariadb("master")
    prepare_master(master)
    relay_a = relays("relay-a", master.port, server_id=100, gtid_mode="mariadb")
    mixed_load(master, big=True)
    relay_b = relays("relay-b", relay_a.listen_port, server_id=101, gtid_mode=b_gtid_mode,
                     extra=["--semi-sync", b_semi_sync])
    wait_relay(relay_b, master)
    replica = mariadb("replica", server_id=3)
    change_master(replica, relay_b.listen_port, file=FIRST_FILE if b_gtid_mode == "off" else None)
    replica.execute("START SLAVE")
    mixed_load(master, rounds=2, big=True)
    # Relay B crashes mid-load and resumes from relay A (by file/position or by MariaDB GTID).
    with Writer(master, rotate_every=100) as writer:
        time.sleep(0.5)
        relay_b.kill9()
        time.sleep(0.3)
        relay_b.start()
        time.sleep(0.5)
    assert writer.done > 50
    mixed_load(master, big=False)
    wait_relay(relay_a, master)
    wait_relay(relay_b, master)
    status = wait_replica(replica, master, timeout=60)
    assert (status["Master_Log_File"], int(status["Read_Master_Log_Pos"])) == master_status(master)
    assert_same_data(master, replica)
    assert_files_equal_master(relay_b.relay_dir, master, up_to=master_status(master))
    assert_files_equal_master(relay_a.relay_dir, master, up_to=master_status(master))
    assert relay_b.status()["retrieved_gtid_set"] == master.execute("SELECT @@gtid_binlog_state")[0][0]


# -- mariadb-binlog --stop-never ----------------------------------------------------------------------------------


def test_mariadb_binlog_stop_never_follows_the_relay(mariadb, relays, tools, tmp_path):
    master = mariadb("master")
    prepare_master(master)
    relay = relays("relay", master.port)
    mixed_load(master, big=False)
    wait_relay(relay, master)
    out = tmp_path / "download"
    out.mkdir()
    proc = tools(stop_never_args(relay.listen_port, out, server_id=900), tmp_path / "binlog-tool.log")
    wait_files(out, master, relay=relay, procs=[proc])
    mixed_load(master, rounds=2, big=True)
    with Writer(master, rotate_every=100) as writer:
        time.sleep(1.0)
    assert writer.done > 100
    wait_files(out, master, relay=relay, procs=[proc])
    assert proc.poll() is None, "mariadb-binlog --stop-never ended by itself"
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert_download_equals_master(out, master)


# -- many replicas at once -----------------------------------------------------------------------------------------


def test_twenty_dump_clients_at_once_all_converge(mariadb, relays, tools, tmp_path):
    """3 MariaDB replicas (file/position and GTID) + 17 mariadb-binlog --stop-never through one relay, while the
    master writes and rotates: every replica ends with the master's data, every download with its files."""
    master = mariadb("master")
    prepare_master(master)
    relay = relays("relay", master.port)
    mixed_load(master, big=False)
    wait_relay(relay, master)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        replicas = list(pool.map(lambda i: mariadb(f"replica{i}", server_id=10 + i), range(3)))
    for i, replica in enumerate(replicas):
        change_master(replica, relay.listen_port, file=None if i == 2 else FIRST_FILE)
    downloads = []
    procs = []
    for i in range(17):
        out = tmp_path / f"download{i:02d}"
        out.mkdir()
        downloads.append(out)
        procs.append(tools(stop_never_args(relay.listen_port, out, server_id=1000 + i), tmp_path / f"tool{i:02d}.log"))
    with Writer(master, rotate_every=200) as writer:
        for replica in replicas:
            replica.execute("START SLAVE")
        mixed_load(master, rounds=3, big=True)
        deadline = time.monotonic() + 30
        while dump_connections(relay) < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
    assert writer.done > 100
    dumping = dump_connections(relay)
    wait_relay(relay, master)
    for replica in replicas:
        status = wait_replica(replica, master, timeout=60)
        assert not status["Last_IO_Error"] and not status["Last_SQL_Error"], status
    for out in downloads:
        wait_files(out, master, relay=relay, procs=procs)
    assert dumping == 20, f"{dumping} dump connections seen at once, 20 expected"
    for replica in replicas:
        assert_same_data(master, replica)
    for out in downloads:
        assert_download_equals_master(out, master)


def dump_connections(relay) -> int:
    """Binlog dump connections the relay shows in SHOW PROCESSLIST."""
    conn = pymysql.connect(host="127.0.0.1", port=relay.listen_port, user="repl", password="replpw", connect_timeout=5)
    try:
        cur = conn.cursor()
        cur.execute("SHOW PROCESSLIST")
        return sum(1 for row in cur.fetchall() if "Binlog Dump" in str(row[4]))
    finally:
        conn.close()
