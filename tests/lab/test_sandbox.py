"""MariaDBSandbox against a real mariadbd: binlogs, crash and restart, users, parallel instances, clear errors."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pymysql
import pytest

import relayproxy.lab.sandbox as sandbox_module
from relayproxy.lab.sandbox import MariaDBSandbox, SandboxError

BINLOG_MAGIC = b"\xfebin"


def test_master_writes_rows_to_its_binlog(mariadb):
    master = mariadb()
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.items (id INT PRIMARY KEY, payload VARCHAR(100)) ENGINE=InnoDB")
    for i in range(20):
        master.execute("INSERT INTO t.items VALUES (%s, %s)", (i, f"row {i}"))

    assert master.execute("SELECT COUNT(*) FROM t.items") == ((20,),)
    logs = master.execute("SHOW BINARY LOGS")
    assert [row[0] for row in logs] == ["master-bin.000001"]
    (path,) = master.binlog_files()
    assert path == master.binlog_dir / "master-bin.000001"
    data = path.read_bytes()
    assert data[:4] == BINLOG_MAGIC
    assert len(data) == logs[0][1]
    # What the relay and its tests rely on: CRC32 checksums, MIXED format, strict GTIDs, one GTID per transaction.
    assert master.execute(
        "SELECT @@log_bin, @@binlog_checksum, @@binlog_format, @@server_id, @@gtid_strict_mode, @@gtid_binlog_pos"
    ) == ((1, "CRC32", "MIXED", 1, 1, "0-1-22"),)


def test_flush_binary_logs_starts_a_second_file(mariadb):
    master = mariadb()
    master.execute("CREATE DATABASE t")
    master.execute("FLUSH BINARY LOGS")
    master.execute("CREATE TABLE t.after_rotate (id INT PRIMARY KEY)")

    files = master.binlog_files()
    assert [f.name for f in files] == ["master-bin.000001", "master-bin.000002"]
    for f in files:
        assert f.read_bytes()[:4] == BINLOG_MAGIC


def test_killed_server_restarts_on_its_datadir(mariadb):
    master = mariadb()
    master.execute("CREATE DATABASE t")
    master.execute("CREATE TABLE t.items (id INT PRIMARY KEY) ENGINE=InnoDB")
    master.execute("INSERT INTO t.items VALUES (1), (2), (3)")
    port, pid = master.port, master.pid

    master.kill()
    assert not master.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # The crashed server's files are still listed (from the index), so a test can inspect them.
    assert [f.name for f in master.binlog_files()] == ["master-bin.000001"]

    master.start()
    assert master.port == port
    assert master.execute("SELECT COUNT(*) FROM t.items") == ((3,),)
    # After a crash the server recovers the old file and opens a new one.
    assert [f.name for f in master.binlog_files()] == ["master-bin.000001", "master-bin.000002"]


def test_parallel_instances_are_independent(mariadb):
    a = mariadb("a", server_id=1)
    b = mariadb("b", server_id=2, log_bin_name="other-bin")
    assert a.port != b.port
    assert a.socket_path != b.socket_path
    assert a.datadir != b.datadir

    a.execute("CREATE DATABASE only_on_a")
    assert a.execute("SELECT @@server_id") == ((1,),)
    assert b.execute("SELECT @@server_id") == ((2,),)
    assert b.execute("SHOW DATABASES LIKE 'only_on_a'") == ()
    assert [f.name for f in b.binlog_files()] == ["other-bin.000001"]


def test_extra_config_reaches_bootstrap_and_server(mariadb):
    # innodb_page_size is fixed when the datadir is created: the bootstrap must get it too, or startup fails.
    master = mariadb(extra_config={"innodb_page_size": "8k", "binlog_annotate_row_events": "OFF"})
    assert master.execute("SELECT @@innodb_page_size, @@binlog_annotate_row_events") == ((8192, 0),)


def test_new_datadirs_are_copies_of_one_bootstrap_per_option_set(mariadb, monkeypatch, tmp_path):
    """mariadb-install-db runs once per (binaries, InnoDB options): later datadirs are copies of its output, each
    its own (a server's writes never reach the template or another copy); other InnoDB options get their own
    bootstrap; without RELAYPROXY_SANDBOX_TEMPLATES mariadb-install-db runs for every datadir."""
    monkeypatch.setenv(sandbox_module.TEMPLATE_ENV, str(tmp_path / "templates"))
    calls = []
    real = sandbox_module._run_install_db
    monkeypatch.setattr(sandbox_module, "_run_install_db", lambda *a: (calls.append(a[3]), real(*a))[1])
    a, b = mariadb("a"), mariadb("b", server_id=2)
    assert len(calls) == 1 and calls[0].is_relative_to(tmp_path / "templates")  # built beside its place
    assert len(list((tmp_path / "templates").iterdir())) == 1
    (template,) = (tmp_path / "templates").iterdir()
    before = sorted(p.name for p in (template).iterdir())
    a.execute("CREATE DATABASE only_on_a")
    assert (a.datadir / "only_on_a").is_dir() and not (b.datadir / "only_on_a").exists()
    assert sorted(p.name for p in template.iterdir()) == before
    assert a.execute("SELECT COUNT(*) FROM mysql.user WHERE user = 'root'") == b.execute(
        "SELECT COUNT(*) FROM mysql.user WHERE user = 'root'")
    mariadb("c", extra_config={"innodb_page_size": "8k"})
    assert len(calls) == 2 and len(list((tmp_path / "templates").iterdir())) == 2
    monkeypatch.delenv(sandbox_module.TEMPLATE_ENV)
    d = mariadb("d", server_id=4)
    assert len(calls) == 3 and calls[-1] == d.datadir
    assert d.execute("SELECT @@server_id") == ((4,),)
    assert len(list((tmp_path / "templates").iterdir())) == 2


def test_created_user_connects_with_replication_grants(mariadb):
    master = mariadb()
    master.create_user("repl", "s3cret")

    conn = master.connect(user="repl", password="s3cret")
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW GRANTS")
            grants = " ".join(row[0] for row in cursor.fetchall())
            cursor.execute("SHOW BINARY LOGS")  # needs REPLICATION CLIENT (BINLOG MONITOR)
            assert cursor.fetchall()
    finally:
        conn.close()
    assert "REPLICATION SLAVE" in grants

    with pytest.raises(pymysql.err.OperationalError):
        master.connect(user="repl", password="wrong").close()


def test_create_user_refuses_anything_but_privilege_names(tmp_path):
    sandbox = MariaDBSandbox(tmp_path / "never-started")
    with pytest.raises(ValueError):
        sandbox.create_user("evil", "pw", grants="ALL ON *.* TO root; DROP DATABASE mysql")


@pytest.mark.server
def test_context_manager_stops_the_server(tmp_path):
    with MariaDBSandbox(tmp_path / "m") as master:
        pid = master.pid
        assert master.execute("SELECT 1") == ((1,),)
    assert not master.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.server
def test_long_basedir_gets_a_short_private_socket(tmp_path):
    basedir = tmp_path / ("d" * 120)
    with MariaDBSandbox(basedir) as master:
        assert master.socket_path is not None
        assert len(str(master.socket_path)) < 100
        assert master.execute("SELECT @@socket") == ((str(master.socket_path),),)
        socket_dir = master.socket_path.parent
    assert not socket_dir.exists()


@pytest.mark.server
def test_startup_failure_reports_the_error_log(tmp_path):
    sandbox = MariaDBSandbox(tmp_path / "bad", extra_config={"no_such_option": 1})
    with pytest.raises(SandboxError, match="unknown variable 'no-such-option=1'"):
        sandbox.start()
    assert not sandbox.running


@pytest.mark.server
def test_explicit_port_in_use_fails_clearly(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        sandbox = MariaDBSandbox(tmp_path / "m", port=busy.getsockname()[1])
        with pytest.raises(SandboxError, match="Address already in use"):
            sandbox.start()
    assert not sandbox.running


@pytest.mark.server
def test_auto_port_taken_before_bind_is_retried(tmp_path, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        busy_port = busy.getsockname()[1]
        real_pick = sandbox_module._pick_free_port
        picks = iter([busy_port])
        monkeypatch.setattr(sandbox_module, "_pick_free_port", lambda: next(picks, None) or real_pick())

        with MariaDBSandbox(tmp_path / "m") as master:
            assert master.port != busy_port
            assert master.execute("SELECT @@port") == ((master.port,),)


def test_missing_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(sandbox_module, "SEARCH_DIRS", ())
    monkeypatch.setenv("PATH", str(Path("/nonexistent")))
    with pytest.raises(SandboxError, match="mariadbd not found"):
        sandbox_module.find_binary("mariadbd", "mysqld")
