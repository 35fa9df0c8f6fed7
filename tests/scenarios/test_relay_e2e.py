"""The relay against a real mariadbd master: mirrored files, horizon-only advertising, restarts and kill -9."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest

from relayproxy.lab.harness import (
    RelayProcess,
    assert_files_equal_master,
    master_status,
    prepare_master,
)

pytestmark = pytest.mark.server


def mixed_load(master, rounds: int = 1, big: bool = True) -> None:
    """DDL; BEGIN..COMMIT DML; autocommit; XA; a >16 MB event; rotations."""
    master.execute("CREATE DATABASE IF NOT EXISTS app")
    master.execute("CREATE TABLE IF NOT EXISTS app.t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64), b LONGBLOB) ENGINE=InnoDB")
    conn = master.connect()
    try:
        cur = conn.cursor()
        for r in range(rounds):
            cur.execute("INSERT INTO app.t (v) VALUES (%s)", (f"auto-{r}",))
            conn.commit()
            cur.execute("BEGIN")
            for i in range(5):
                cur.execute("INSERT INTO app.t (v) VALUES (%s)", (f"trx-{r}-{i}",))
            cur.execute("UPDATE app.t SET v = CONCAT(v, '!') WHERE id % 3 = 0")
            cur.execute("COMMIT")
            cur.execute(f"XA START 'xa{r}'")
            cur.execute("INSERT INTO app.t (v) VALUES ('xa')")
            cur.execute(f"XA END 'xa{r}'")
            cur.execute(f"XA PREPARE 'xa{r}'")
            cur.execute(f"XA COMMIT 'xa{r}'")
            cur.execute(f"CREATE TABLE IF NOT EXISTS app.ddl{r} (a INT)")
            cur.execute("SET SESSION binlog_format = 'STATEMENT'")
            cur.execute("SET @x = 42")
            cur.execute("INSERT INTO app.t (v) VALUES (@x)")
            cur.execute("SET SESSION binlog_format = 'MIXED'")
            conn.commit()
        if big:
            cur.execute("INSERT INTO app.t (v, b) VALUES ('big', REPEAT('x', 17 * 1024 * 1024))")
            conn.commit()
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("INSERT INTO app.t (v) VALUES ('after-rotate')")
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def master(mariadb):
    m = mariadb("master", extra_config={"rpl_semi_sync_master_enabled": 0})
    prepare_master(m)
    return m


@pytest.fixture
def relay_factory(tmp_path):
    started = []

    def make(master, **kw):
        relay = RelayProcess(tmp_path / "relay", master.port, **kw)
        started.append(relay)
        return relay

    yield make
    for relay in started:
        relay.stop()


def test_file_position_mode_mirrors_the_master(master, relay_factory):
    mixed_load(master)
    relay = relay_factory(master).start()
    status = relay.wait_caught_up(master)
    assert status["io_running"] and status["last_io_error"] is None
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))
    # more load while it runs, then a clean restart resumes from the horizon
    mixed_load(master, rounds=2, big=False)
    relay.wait_caught_up(master)
    relay.stop()
    mixed_load(master, rounds=1, big=False)
    relay.start()
    relay.wait_caught_up(master)
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))
    text = relay.metrics()
    assert "relayproxy_horizon_position_bytes" in text and "relayproxy_transactions_received_total" in text
    file, pos = master_status(master)
    shown = subprocess.run(
        [sys.executable, "-m", "relayproxy.commands.cli", "status", "--http", f"127.0.0.1:{relay.http_port}"],
        capture_output=True, text=True, timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"Read_Master_Log_Pos:    {pos}" in shown.stdout and f"Master_Log_File:        {file}" in shown.stdout
    relay.stop()
    gone = subprocess.run(
        [sys.executable, "-m", "relayproxy.commands.cli", "status", "--http", f"127.0.0.1:{relay.http_port}"],
        capture_output=True, text=True, timeout=30,
    )
    assert gone.returncode == 1 and "cannot read" in gone.stderr


def test_mariadb_gtid_mode_resumes_by_gtid(master, relay_factory):
    mixed_load(master, big=False)
    relay = relay_factory(master, gtid_mode="mariadb").start()
    status = relay.wait_caught_up(master)
    assert status["retrieved_gtid_set"] == master.execute("SELECT @@gtid_binlog_state")[0][0]
    relay.stop()
    mixed_load(master, rounds=2, big=False)
    relay.start()
    status = relay.wait_caught_up(master)
    assert status["retrieved_gtid_set"] == master.execute("SELECT @@gtid_binlog_state")[0][0]
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))


def test_kill9_under_load_never_loses_or_duplicates(master, relay_factory):
    """20 rounds of kill -9 at random moments while the master writes; the files always end equal."""
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.k (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(200)) ENGINE=InnoDB")
    stop = threading.Event()

    def writer():
        conn = master.connect()
        cur = conn.cursor()
        i = 0
        while not stop.is_set() and i < 100_000:
            cur.execute("BEGIN")
            for _ in range(3):
                cur.execute("INSERT INTO app.k (v) VALUES (%s)", ("x" * random.randrange(1, 200),))
            cur.execute("COMMIT")
            i += 1
            if i % 500 == 0:
                cur.execute("FLUSH BINARY LOGS")
        conn.close()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    relay = relay_factory(master, gtid_mode="mariadb")
    rng = random.Random(11)
    try:
        for _ in range(20):
            relay.start()
            time.sleep(rng.uniform(0.05, 0.4))
            relay.kill9()
    finally:
        stop.set()
        thread.join(30)
    relay.start()
    status = relay.wait_caught_up(master, timeout=120)
    assert status["retrieved_gtid_set"] == master.execute("SELECT @@gtid_binlog_state")[0][0]
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))
