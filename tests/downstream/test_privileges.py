"""Privileges on the relay's server port: replication_slave (dump, register), replication_client (the
status statements), binlog_admin (PURGE), admin (everything). Every statement class against every privilege in
process; the 1227 texts against a real MariaDB's; a real MariaDB replica refused, then replicating."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pymysql
import pytest

from .test_downstream_server import RawClient, Stub, make_ctx, serving

from relayproxy.commands import config  # noqa: E402
from relayproxy.commands.run import SessionRelayView, upstream_sources  # noqa: E402
from relayproxy.downstream import privileges  # noqa: E402
from relayproxy.downstream.context import ConnectionState, DownstreamContext, DumpProgress  # noqa: E402
from relayproxy.downstream.sql import execute  # noqa: E402
from relayproxy.downstream.users import DownstreamUser, parse_users  # noqa: E402
from relayproxy.lab.harness import (  # noqa: E402
    RelayProcess,
    free_port,
    master_status,
    prepare_master,
    replica_status,
    wait_replica,
)
from relayproxy.ops.status import StatusSources, relay_status  # noqa: E402
from relayproxy.relay import RelayStore  # noqa: E402
from relayproxy.upstream.session import UpstreamSession  # noqa: E402
from relayproxy.wire.packets import parse_err  # noqa: E402
from relayproxy.wire.results import ErrorResponse, ResultSet  # noqa: E402

# -- the account model and its configuration -----------------------------------------------------------------------


def test_defaults_keep_old_configs_working() -> None:
    plain, admin = parse_users("repl:pw,ops:pw2:admin")
    assert plain.granted == {"replication_slave", "replication_client"}  # what every account could do before
    assert admin.granted == {"replication_slave", "replication_client", "binlog_admin", "admin"}
    assert not plain.has("binlog_admin") and admin.has("binlog_admin")


def test_privileges_in_tables_and_specs_with_aliases() -> None:
    users = parse_users([
        {"name": "mon", "password": "a", "privileges": ["slave_monitor"]},
        {"name": "purger", "password": "b", "privileges": ["binlog_admin", "replication_client"]},
        {"name": "nothing", "password": "c", "privileges": []},
        {"name": "boss", "password": "d", "privileges": ["admin"]},
        "cdc:Pw-Secret-9:privileges=replication_slave+binlog_monitor",
        "old:f:admin:privileges=replication_client",
    ])
    got = {u.name: u.granted for u in users}
    assert got["mon"] == {"replication_client"}
    assert got["purger"] == {"binlog_admin", "replication_client"}
    assert got["nothing"] == frozenset()
    assert got["boss"] == set(privileges.PRIVILEGES)
    assert got["cdc"] == {"replication_slave", "replication_client"}
    assert got["old"] == set(privileges.PRIVILEGES)  # admin = true implies every privilege
    assert "Pw-Secret-9" not in repr(users[4]) and users[4].password == "Pw-Secret-9"


@pytest.mark.parametrize("value, fragment", [
    ([{"name": "x", "password": "p", "privileges": ["super"]}], "unknown privilege 'super'"),
    ([{"name": "x", "password": "p", "privileges": "replication_slave"}], None),  # one name as a string is fine
    ([{"name": "x", "password": "p", "privileges": 3}], "privileges must be a list"),
    ("x:p:privileges=dump", "unknown privilege 'dump'"),
])
def test_bad_privileges_are_named(value, fragment) -> None:
    if fragment is None:
        assert parse_users(value)[0].granted == {"replication_slave"}
        return
    with pytest.raises(ValueError) as info:
        parse_users(value)
    assert fragment in str(info.value) and "users[0]" in str(info.value) and "'p'" not in str(info.value)


def test_privileges_in_a_toml_config(tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text('[[users]]\nname = "mon"\npassword = "pw"\nprivileges = ["replication_client"]\n')
    cfg = config.load(None, environ={"RELAYPROXY_CONFIG": str(path)})
    assert [u.granted for u in cfg.users] == [{"replication_client"}]


# -- every statement class against every privilege, in process ------------------------------------------------------

ACCOUNTS = ("repl:pw:privileges=replication_slave,mon:pw:privileges=replication_client,"
            "purger:pw:privileges=binlog_admin,ops:pw:admin,legacy:pw,none:pw:privileges=")
# account -> privileges it holds (legacy: the default of an account declared without privileges)
HOLDS = {
    "repl": {"replication_slave"}, "mon": {"replication_client"}, "purger": {"binlog_admin"},
    "ops": set(privileges.PRIVILEGES), "legacy": {"replication_slave", "replication_client"}, "none": set(),
}
CHANGE = ("CHANGE MASTER TO MASTER_HOST='127.0.0.2', MASTER_PORT=3310, MASTER_USER='r', MASTER_PASSWORD='x', "
          "MASTER_USE_GTID=slave_pos")
# statement -> (privilege it needs, MariaDB's names in its 1227 text: checked against mariadbd below)
STATEMENTS = {
    "SHOW SLAVE STATUS": ("replication_client", "SUPER, SLAVE MONITOR"),
    "SHOW REPLICA STATUS": ("replication_client", "SUPER, SLAVE MONITOR"),
    "SHOW ALL SLAVES STATUS": ("replication_client", "SUPER, SLAVE MONITOR"),
    "SHOW BINARY LOGS": ("replication_client", "SUPER, BINLOG MONITOR"),
    "SHOW MASTER LOGS": ("replication_client", "SUPER, BINLOG MONITOR"),
    "SHOW MASTER STATUS": ("replication_client", "SUPER, BINLOG MONITOR"),
    "SHOW BINLOG STATUS": ("replication_client", "SUPER, BINLOG MONITOR"),
    "SHOW BINLOG EVENTS": ("replication_client", "BINLOG MONITOR"),
    "SHOW BINLOG EVENTS IN 'master-bin.000001' FROM 4 LIMIT 2": ("replication_client", "BINLOG MONITOR"),
    "PURGE BINARY LOGS BEFORE '2000-01-01'": ("binlog_admin", "SUPER, BINLOG ADMIN"),
    "STOP SLAVE": ("admin", "SUPER, REPLICATION SLAVE ADMIN"),
    "START SLAVE": ("admin", "SUPER, REPLICATION SLAVE ADMIN"),
    CHANGE: ("admin", "SUPER, REPLICATION SLAVE ADMIN"),
    "FLUSH HOSTS": ("admin", "RELOAD"),
}
FREE = ("SELECT @@version", "SHOW VARIABLES LIKE 'server_id'", "SET @master_heartbeat_period = 1000000000",
        "SELECT @@global.gtid_domain_id", "SHOW GRANTS")


class Relay:
    def __init__(self, relay_dir: Path, flavour: str = "mariadb") -> None:
        environ = {
            "RELAYPROXY_SERVER_ID": "100", "RELAYPROXY_MASTER": "127.0.0.1:3306", "RELAYPROXY_USER": "u",
            "RELAYPROXY_PASSWORD": "p", "RELAYPROXY_RELAY_DIR": str(relay_dir), "RELAYPROXY_LISTEN": "127.0.0.1:1",
            "RELAYPROXY_GTID_MODE": "mariadb" if flavour == "mariadb" else "mysql", "RELAYPROXY_USERS": ACCOUNTS,
        }
        self.cfg = config.load(None, environ=environ)
        self.store = RelayStore.open(relay_dir)
        self.session = UpstreamSession(self.cfg, self.store)
        self.session.status.master_flavour = flavour
        self.ctx = DownstreamContext(SessionRelayView(self.cfg, lambda: self.session.store,
                                                      lambda: upstream_sources(self.session),
                                                      server_uuid="00000000-0000-4000-8000-000000000100"),
                                     status_document=lambda: relay_status(self.cfg, StatusSources(
                                         self.session.store, upstream_sources(self.session))),
                                     replication=self.session)
        self.killed: list[int] = []
        self.ctx.kill_connection = lambda conn_id: self.killed.append(conn_id) or True
        self.ctx.flush_hosts = lambda: 0

    def conn(self, user: str, conn_id: int = 1) -> ConnectionState:
        state = ConnectionState(conn_id=conn_id, user=user, host="127.0.0.1")
        self.ctx.connections[conn_id] = state
        return state

    def run(self, sql: str, user: str):
        return asyncio.run(execute(self.ctx, self.conn(user), sql))


@pytest.fixture
def relay(tmp_path):
    r = Relay(tmp_path / "relay")
    yield r
    r.store.close()


@pytest.mark.parametrize("user", sorted(HOLDS))
def test_each_statement_class_against_each_privilege(relay: Relay, user: str) -> None:
    for sql, (needed, names) in STATEMENTS.items():
        answer = relay.run(sql, user)
        denied = isinstance(answer, ErrorResponse) and answer.code == 1227
        assert denied == (needed not in HOLDS[user]), (user, sql, answer)
        if denied:
            assert answer.sqlstate == "42000"
            assert answer.message.startswith(
                f"Access denied; you need (at least one of) the {names} privilege(s) for this operation")
            assert f"needs {needed}" in answer.message
    for sql in FREE:
        answer = relay.run(sql, user)
        assert not isinstance(answer, ErrorResponse), (user, sql, answer)


def test_mysql_flavour_names_mysql_privileges(tmp_path: Path) -> None:
    relay = Relay(tmp_path / "relay", flavour="mysql")
    try:
        assert "SUPER, REPLICATION CLIENT privilege" in relay.run("SHOW REPLICA STATUS", "none").message
        assert "SUPER, REPLICATION CLIENT privilege" in relay.run("SHOW BINARY LOGS", "repl").message
        assert "SUPER or BINLOG_ADMIN privilege" in relay.run("PURGE BINARY LOGS BEFORE '2000-01-01'", "mon").message
        assert "SUPER or REPLICATION_SLAVE_ADMIN privilege" in relay.run("STOP REPLICA", "purger").message
    finally:
        relay.store.close()


def test_kill_own_connection_or_anyone_with_admin(relay: Relay) -> None:
    relay.conn("legacy", conn_id=40)
    relay.conn("repl", conn_id=41).dump = DumpProgress(file="master-bin.000001", position=4)
    killer = relay.conn("mon", conn_id=5)
    answer = asyncio.run(execute(relay.ctx, killer, "KILL 40"))
    assert (answer.code, answer.message) == (1095, "You are not owner of thread 40")
    answer = asyncio.run(execute(relay.ctx, killer, "KILL 99"))
    assert (answer.code, answer.message) == (1094, "Unknown thread id: 99")
    assert relay.killed == []
    # Own connection (same account name): no privilege needed. KILL QUERY of an idle one does nothing.
    own = relay.conn("legacy", conn_id=6)
    assert not isinstance(asyncio.run(execute(relay.ctx, own, "KILL QUERY 40")), ErrorResponse)
    assert relay.killed == []
    assert not isinstance(asyncio.run(execute(relay.ctx, own, "KILL CONNECTION 40")), ErrorResponse)
    # admin: anyone's; KILL QUERY ends a dump.
    admin = relay.conn("ops", conn_id=7)
    assert not isinstance(asyncio.run(execute(relay.ctx, admin, "KILL QUERY 41")), ErrorResponse)
    assert relay.killed == [40, 41]


def test_show_grants_lists_the_relay_privileges(relay: Relay) -> None:
    def grants(user: str, sql: str = "SHOW GRANTS") -> list[str]:
        answer = relay.run(sql, user)
        assert isinstance(answer, ResultSet), answer
        assert answer.columns == [f"Grants for {user}@%"] or "FOR" in sql
        return [row[0] for row in answer.rows]

    assert grants("none") == ["GRANT USAGE ON *.* TO `none`@`%`"]
    assert grants("legacy") == ["GRANT REPLICATION SLAVE, BINLOG MONITOR, SLAVE MONITOR ON *.* TO `legacy`@`%`"]
    assert grants("purger", "SHOW GRANTS FOR CURRENT_USER()") == ["GRANT BINLOG ADMIN ON *.* TO `purger`@`%`"]
    assert grants("ops", "SHOW GRANTS FOR 'mon'@'%'") == ["GRANT BINLOG MONITOR, SLAVE MONITOR ON *.* TO `mon`@`%`"]
    assert grants("ops")[0].startswith("GRANT SUPER, REPLICATION SLAVE ADMIN, CONNECTION ADMIN, RELOAD, REPLICATION")
    assert relay.run("SHOW GRANTS FOR 'ops'@'%'", "mon").code == 1227
    assert relay.run("SHOW GRANTS FOR 'ghost'@'%'", "ops").code == 1141


# -- the server's commands: COM_REGISTER_SLAVE and the dumps -------------------------------------------------------


def test_register_and_dump_need_replication_slave(capsys: pytest.CaptureFixture[str]) -> None:
    users = [DownstreamUser("mon", "pw", plugin="mysql_native_password", privileges=["replication_client"]),
             DownstreamUser("repl", "pw", plugin="mysql_native_password", privileges=["replication_slave"])]
    stub = Stub()

    async def scenario() -> None:
        async with serving(stub, users, ctx=make_ctx("mariadb")) as server:
            client = await RawClient.connect(server)
            await client.login("mon", "pw")
            register = b"\x15" + (7).to_bytes(4, "little") + b"\x00\x00\x00" + b"\x00\x00" + b"\x00" * 8
            dump = b"\x12" + (4).to_bytes(4, "little") + b"\x00\x00" + (7).to_bytes(4, "little") + b"f.000001"
            dump_gtid = b"\x1e" + b"\x00\x00" + (7).to_bytes(4, "little") + (0).to_bytes(4, "little") \
                + (4).to_bytes(8, "little") + (0).to_bytes(4, "little")
            for payload in (register, dump, dump_gtid):
                client.send(payload, 0)
                err = parse_err(await client.payload())
                assert (err.code, err.sqlstate) == (1227, "42000")
                assert err.message.startswith(
                    "Access denied; you need (at least one of) the REPLICATION SLAVE privilege(s) for this operation")
            client.send(b"\x0e", 0)  # the connection stays usable, as on the servers
            assert (await client.payload())[0] == 0x00
            client.close()
            assert stub.dumps == []
            client = await RawClient.connect(server)
            await client.login("repl", "pw")
            client.send(dump, 0)
            assert (await client.payload())[0] == 0xFE  # the stub dump's EOF
            client.close()
            assert len(stub.dumps) == 1

    asyncio.run(scenario())
    refusals = [line for line in capsys.readouterr().err.splitlines() if "missing privilege" in line]
    assert len(refusals) == 3


# -- real servers ---------------------------------------------------------------------------------------------------

RELAY_USERS = """
[[users]]
name = "mon"
password = "monpw"
plugin = "mysql_native_password"
privileges = ["replication_client"]

[[users]]
name = "repl"
password = "replpw"
plugin = "mysql_native_password"
privileges = ["replication_slave"]

[[users]]
name = "nopriv"
password = "nopw"
plugin = "mysql_native_password"
privileges = []
"""


@pytest.mark.server
def test_real_replica_needs_replication_slave_and_texts_match_mariadb(mariadb, tmp_path: Path) -> None:
    master = mariadb("master")
    prepare_master(master)
    master.create_user("nopriv", "nopw", grants="USAGE")
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(20))")
    master.execute("INSERT INTO app.t VALUES (1, 'one')")
    cfg = tmp_path / "relay.toml"
    cfg.write_text(RELAY_USERS)
    listen = free_port()
    relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb",
                         extra=["--listen", f"127.0.0.1:{listen}", "--config", str(cfg)]).start()
    try:
        relay.wait_caught_up(master)
        # The 1227 texts, up to the relay's hint, are mariadbd's for an account without the privilege.
        for sql in ("SHOW SLAVE STATUS", "SHOW BINARY LOGS", "SHOW MASTER STATUS", "SHOW BINLOG EVENTS",
                    "PURGE BINARY LOGS BEFORE "
                    "'2000-01-01'", "STOP SLAVE", "FLUSH HOSTS", CHANGE):
            answers = []
            for port in (master.port, listen):
                conn = pymysql.connect(host="127.0.0.1", port=port, user="nopriv", password="nopw")
                try:
                    with pytest.raises(pymysql.MySQLError) as info:
                        conn.cursor().execute(sql)
                finally:
                    conn.close()
                answers.append(info.value.args)
            theirs, mine = answers
            assert mine[0] == theirs[0] == 1227, (sql, answers)
            assert mine[1].split(" (relayproxy:")[0] == theirs[1], (sql, answers)

        replica = mariadb("replica", server_id=3)
        replica.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={listen}, MASTER_USER='mon', "
                        "MASTER_PASSWORD='monpw', MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos")
        replica.execute("START SLAVE")
        deadline = time.monotonic() + 60
        status = replica_status(replica)
        while not status.get("Last_IO_Errno") and time.monotonic() < deadline:
            time.sleep(0.1)
            status = replica_status(replica)
        # The IO thread's COM_REGISTER_SLAVE failed with the relay's 1227 (MariaDB wraps it as 1597).
        assert status["Last_IO_Errno"] == 1597, status
        assert "COM_REGISTER_SLAVE failed: Access denied; you need (at least one of) the REPLICATION SLAVE " \
               "privilege(s)" in status["Last_IO_Error"] and "(Errno: 1227)" in status["Last_IO_Error"], status
        assert replica.execute("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = 'app'")[0][0] == 0

        replica.execute("STOP SLAVE")
        replica.execute("CHANGE MASTER TO MASTER_USER='repl', MASTER_PASSWORD='replpw'")
        replica.execute("START SLAVE")
        master.execute("INSERT INTO app.t VALUES (2, 'two')")
        status = wait_replica(replica, master)
        assert status["Last_IO_Errno"] == 0
        assert replica.execute("SELECT * FROM app.t ORDER BY id") == ((1, "one"), (2, "two"))
        assert (status["Master_Log_File"], int(status["Read_Master_Log_Pos"])) == master_status(master)
    finally:
        relay.stop()
