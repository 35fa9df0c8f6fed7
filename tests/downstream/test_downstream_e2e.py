"""Real replicas and tools through the relay: master -> relayproxy -> MariaDB replica / mariadb-binlog."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from relayproxy.lab.harness import (
    RelayProcess,
    assert_files_equal_master,
    free_port,
    master_status,
    prepare_master,
    replica_status,
    wait_replica,  # reads the master's position afresh: MariaDB writes a BINLOG_CHECKPOINT a moment after a rotation
)
from ..scenarios.test_relay_e2e import mixed_load

pytestmark = pytest.mark.server

USERS_TOML = """
[[users]]
name = "repl"
password = "replpw"
plugin = "mysql_native_password"
"""


@pytest.fixture
def chain(mariadb, tmp_path):
    master = mariadb("master")
    prepare_master(master)
    config = tmp_path / "relay.toml"
    config.write_text(USERS_TOML)
    listen = free_port()
    relay = RelayProcess(
        tmp_path / "relay", master.port, gtid_mode="mariadb",
        extra=["--listen", f"127.0.0.1:{listen}", "--config", str(config)],
    )
    relay.listen_port = listen
    relay.start()
    yield master, relay
    relay.stop()


def table_rows(server, table: str):
    return server.execute(f"SELECT * FROM {table} ORDER BY 1")


@pytest.mark.parametrize("use_gtid", ["no", "slave_pos"])
def test_mariadb_replica_through_the_relay_equals_the_master(chain, mariadb, use_gtid):
    master, relay = chain
    mixed_load(master, big=True)
    relay.wait_caught_up(master)
    replica = mariadb("replica", server_id=3)
    replica.execute(
        f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={relay.listen_port}, MASTER_USER='repl', "
        f"MASTER_PASSWORD='replpw', MASTER_CONNECT_RETRY=1, "
        + ("MASTER_LOG_FILE='master-bin.000001', MASTER_LOG_POS=4, MASTER_USE_GTID=no" if use_gtid == "no"
           else "MASTER_USE_GTID=slave_pos")
    )
    replica.execute("START SLAVE")
    status = wait_replica(replica, master)
    assert status["Slave_IO_Running"] == "Yes" and status["Slave_SQL_Running"] == "Yes"
    # Master coordinates are kept: the replica's position through the relay is the master's.
    assert (status["Master_Log_File"], int(status["Read_Master_Log_Pos"])) == master_status(master)
    mixed_load(master, rounds=2, big=False)
    wait_replica(replica, master)
    for table in ("app.t", "app.ddl0", "app.ddl1"):
        assert table_rows(replica, table) == table_rows(master, table), table
    if use_gtid == "slave_pos":
        assert replica.execute("SELECT @@gtid_slave_pos")[0][0] == master.execute("SELECT @@gtid_binlog_pos")[0][0]
    hosts = relay_sql(relay, "SHOW SLAVE HOSTS")
    assert any(int(row[0]) == 3 for row in hosts)


def relay_sql(relay, sql: str):
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=relay.listen_port, user="repl", password="replpw")
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return cur.fetchall()
    finally:
        conn.close()


def test_mariadb_binlog_reads_the_relay_like_a_master(chain, tmp_path):
    master, relay = chain
    mixed_load(master, big=False)
    relay.wait_caught_up(master)
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    assert tool, "mariadb-binlog is part of the mariadb-server packages"
    out = tmp_path / "download"
    out.mkdir()
    first = master.binlog_files()[0].name
    subprocess.run(
        [tool, "--read-from-remote-server", "--raw", "--to-last-log", "-h127.0.0.1", f"-P{relay.listen_port}",
         "-urepl", "-preplpw", f"--result-file={out}/", first],
        check=True, timeout=60, capture_output=True,
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == [p.name for p in master.binlog_files()]
    assert_files_equal_master(out_as_relay(out, names), master, up_to=master_status(master))
    binlogs = relay_sql(relay, "SHOW BINARY LOGS")
    assert [row[0] for row in binlogs] == names


def out_as_relay(out, names):
    (out / "relayproxy.index").write_text("".join(f"{n}\n" for n in names))
    return out


@pytest.mark.parametrize("use_gtid", ["no", "slave_pos"])
def test_a_replica_started_before_the_relay_reached_its_master_waits_and_then_streams(mariadb, tmp_path, use_gtid):
    """A fresh relay whose master is down has no file and does not know its binlog_checksum. A MariaDB replica
    started behind it must not stop for good (NULL there is 1593, "when it tried to SELECT
    @master_binlog_checksum", which it never retries): the relay closes such a connection, and the replica keeps
    connecting (Slave_IO_Running: Connecting) until the master is up; then it streams, equal to the master."""
    from relayproxy.lab.sandbox import MariaDBSandbox

    master = MariaDBSandbox(tmp_path / "master", port=free_port())  # not started yet: the relay finds no one
    config = tmp_path / "relay.toml"
    config.write_text(USERS_TOML)
    listen = free_port()
    relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb",
                         extra=["--listen", f"127.0.0.1:{listen}", "--config", str(config)])
    relay.listen_port = listen
    relay.start()
    try:
        replica = mariadb("replica", server_id=3)
        replica.execute(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={listen}, MASTER_USER='repl', "
            "MASTER_PASSWORD='replpw', MASTER_CONNECT_RETRY=1, "
            + ("MASTER_LOG_FILE='master-bin.000001', MASTER_LOG_POS=4, MASTER_USE_GTID=no" if use_gtid == "no"
               else "MASTER_USE_GTID=slave_pos"))
        replica.execute("START SLAVE")
        deadline = time.monotonic() + 60
        while relay.log_path.read_text().count("closed the connection without an answer") < 2:
            status = replica_status(replica)
            assert status["Slave_IO_Running"] != "No", f"the replica stopped: {status}"
            assert time.monotonic() < deadline, f"the replica did not try twice: {status}\n{relay.log_tail()}"
            time.sleep(0.2)
        status = replica_status(replica)
        assert status["Slave_IO_Running"] == "Connecting" and status["Last_IO_Errno"] != "1593", status
        assert relay.status()["master_log_file"] in (None, ""), relay.status()  # it still has nothing
        master.start()
        try:
            prepare_master(master)
            mixed_load(master, big=False)
            relay.wait_caught_up(master)
            status = wait_replica(replica, master)
            assert status["Slave_IO_Running"] == "Yes" and status["Slave_SQL_Running"] == "Yes", status
            for (table,) in master.execute(
                    "SELECT CONCAT(table_schema, '.', table_name) FROM information_schema.tables "
                    "WHERE table_schema = 'app'"):
                assert table_rows(replica, table) == table_rows(master, table), table
        finally:
            master.stop()
    finally:
        relay.stop()
