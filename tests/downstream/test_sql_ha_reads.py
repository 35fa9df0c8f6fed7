"""What an HA manager reads from a replica, asked of the relay (sans I/O): MHA 0.58's queries (MHA/DBHelper.pm,
MHA/SlaveUtil.pm, MHA/ServerManager.pm) get the relay's own truthful answers; tests/scenarios/test_mha.py runs MHA itself."""

from __future__ import annotations

import os

from relayproxy.downstream.sql import SYSTEM_VARIABLES

from .test_downstream_sql import maria_relay, mysql_relay  # noqa: F401 - fixtures


def test_mha_reads_the_relay_directory_as_datadir(maria_relay):  # noqa: F811
    r = maria_relay
    want = os.path.join(os.path.abspath(str(r.cfg.relay_dir)), "")
    assert r.one("SELECT @@global.datadir AS Value") == want
    assert want.endswith("/") and os.path.isdir(want)
    assert r.rows("SHOW GLOBAL VARIABLES LIKE 'datadir'") == [["datadir", want]]


def test_the_relay_has_no_applier_and_no_relay_log_info(maria_relay):  # noqa: F811
    r = maria_relay
    assert r.one("SELECT @@global.slave_parallel_workers AS Value") == 0
    assert r.one("SELECT @@global.slave_parallel_threads AS Value") == 0
    assert r.one("SELECT @@global.relay_log_purge AS Value") == 0  # no file is deleted because it was applied
    assert r.one("SELECT @@global.relay_log_info_file AS Value") is None  # the relay keeps no relay-log.info
    assert r.one("SELECT @@global.read_only AS Value") == 1
    assert r.rows("SHOW GLOBAL VARIABLES LIKE 'log_bin'") == [["log_bin", "ON"]]
    r.error("SELECT @@global.super_read_only AS Value", 1193)  # MariaDB has none


def test_mysql_flavour_has_its_own_names(mysql_relay):  # noqa: F811
    r = mysql_relay
    assert r.one("SELECT @@global.slave_parallel_workers") == 0
    r.error("SELECT @@global.slave_parallel_threads", 1193)
    names = {v.name for v in SYSTEM_VARIABLES}
    assert {"datadir", "relay_log_purge", "relay_log_info_file", "slave_parallel_workers"} <= names


def test_user_level_locks_per_session(maria_relay):  # noqa: F811
    """MHA takes GET_LOCK('MHA_Master_High_Availability_Failover', 100) on every server it touches."""
    r = maria_relay
    a, b = r.connect(21), r.connect(22)
    name = "MHA_Master_High_Availability_Failover"
    assert r.one(f"SELECT GET_LOCK('{name}', 100) AS Value", a) == 1
    assert r.one(f"SELECT GET_LOCK('{name}', 0)", a) == 1  # the same session again: counted
    assert r.one(f"SELECT IS_USED_LOCK('{name.lower()}')", b) == 21  # names are case-insensitive
    assert r.one(f"SELECT IS_FREE_LOCK('{name}')", b) == 0
    assert r.one(f"SELECT GET_LOCK('{name}', 5)", b) == 0  # held elsewhere: 0 at once, no wait
    assert r.one(f"SELECT RELEASE_LOCK('{name}')", b) == 0  # not b's
    assert r.one(f"SELECT RELEASE_LOCK('{name}')", a) == 1
    assert r.one(f"SELECT IS_FREE_LOCK('{name}')", b) == 0  # taken twice, released once
    assert r.one(f"SELECT RELEASE_LOCK('{name}')", a) == 1
    assert r.one(f"SELECT IS_FREE_LOCK('{name}')", b) == 1
    assert r.one(f"SELECT RELEASE_LOCK('{name}')", a) is None  # no such lock
    assert r.one("SELECT GET_LOCK('x', 1)", b) == 1 and r.one("SELECT GET_LOCK('y', 1)", b) == 1
    assert r.one("SELECT RELEASE_ALL_LOCKS()", b) == 2


def test_a_closed_sessions_locks_are_free(maria_relay):  # noqa: F811
    r = maria_relay
    a, b = r.connect(31), r.connect(32)
    assert r.one("SELECT GET_LOCK('MHA_Master_High_Availability_Monitor', 1)", a) == 1
    del r.ctx.connections[a.conn_id]  # the server drops a closed connection from this table
    assert r.one("SELECT IS_FREE_LOCK('MHA_Master_High_Availability_Monitor')", b) == 1
    assert r.one("SELECT GET_LOCK('MHA_Master_High_Availability_Monitor', 1)", b) == 1
