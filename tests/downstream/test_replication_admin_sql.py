"""STOP SLAVE / CHANGE MASTER TO / START SLAVE on the relay's SQL port, against a real UpstreamSession and relay
directory (no master: the session is driven by the statements only). The scenario with real servers is
tests/scenarios/test_scenario_failover.py."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from relayproxy.commands import config
from relayproxy.commands.run import SessionRelayView, upstream_sources
from relayproxy.downstream.context import ConnectionState, DownstreamContext
from relayproxy.downstream.sql import execute
from relayproxy.ops.status import StatusSources, relay_status
from relayproxy.relay import RelayStore
from relayproxy.relay.master_info import FILE_NAME
from relayproxy.upstream.session import UpstreamSession
from relayproxy.wire.results import ErrorResponse, OkResponse, ResultSet

SECRET = "s3cret-pw-7f"


class Relay:
    def __init__(self, relay_dir, *, gtid_mode="mariadb", replication=True):
        environ = {
            "RELAYPROXY_SERVER_ID": "100",
            "RELAYPROXY_MASTER": "127.0.0.1:3306",
            "RELAYPROXY_USER": "repl",
            "RELAYPROXY_PASSWORD": "replpw",
            "RELAYPROXY_RELAY_DIR": str(relay_dir),
            "RELAYPROXY_LISTEN": "127.0.0.1:3307",
            "RELAYPROXY_GTID_MODE": gtid_mode,
            "RELAYPROXY_USERS": "repl:replpw,ops:opspw:admin",
        }
        self.relay_dir = relay_dir
        self.cfg = config.load(None, environ=environ)
        self.store = RelayStore.open(relay_dir)
        self.session = UpstreamSession(self.cfg, self.store)
        self.session.status.master_flavour = "mariadb" if gtid_mode == "mariadb" else "mysql"
        self.ctx = DownstreamContext(SessionRelayView(self.cfg, lambda: self.session.store,
                                                      lambda: upstream_sources(self.session),
                                                      server_uuid="00000000-0000-4000-8000-000000000100"),
                                     status_document=lambda: relay_status(self.cfg, StatusSources(
                                         self.session.store, upstream_sources(self.session))),
                                     replication=self.session if replication else None)

    def conn(self, user: str) -> ConnectionState:
        return ConnectionState(conn_id=len(self.ctx.connections) + 1, user=user, host="127.0.0.1")

    def run(self, sql: str, user: str = "ops"):
        return asyncio.run(execute(self.ctx, self.conn(user), sql))

    def ok(self, sql: str, user: str = "ops") -> OkResponse:
        answer = self.run(sql, user)
        assert isinstance(answer, OkResponse), f"{sql!r} -> {answer}"
        return answer

    def error(self, sql: str, code: int, user: str = "ops") -> ErrorResponse:
        answer = self.run(sql, user)
        assert isinstance(answer, ErrorResponse) and answer.code == code, f"{sql!r} -> {answer}"
        return answer

    def slave_status(self) -> dict:
        answer = self.run("SHOW SLAVE STATUS")
        assert isinstance(answer, ResultSet) and len(answer.rows) == 1
        return dict(zip(answer.columns, answer.rows[0]))

    def close(self):
        self.store.close()


@pytest.fixture
def relay(tmp_path):
    r = Relay(tmp_path / "relay")
    yield r
    r.close()


CHANGE = (f"CHANGE MASTER TO MASTER_HOST='127.0.0.2', MASTER_PORT=3310, MASTER_USER='repl2', "
          f"MASTER_PASSWORD='{SECRET}', MASTER_USE_GTID=slave_pos")


def test_the_three_statements_repoint_the_relay_and_the_choice_is_durable(relay):
    assert relay.session.io_enabled
    err = relay.error(CHANGE, 1198)  # as the servers: not while replication runs
    assert "STOP SLAVE" in err.message
    assert not (relay.relay_dir / FILE_NAME).exists()

    relay.ok("STOP SLAVE")
    assert not relay.session.io_enabled and relay.session.status.state == "stopped by STOP SLAVE"
    assert relay.slave_status()["Slave_IO_Running"] == "No"
    relay.ok(CHANGE)
    assert relay.session.master.address == "127.0.0.2:3310" and relay.session.master.gtid_mode == "mariadb"
    path = relay.relay_dir / FILE_NAME
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text())["choice"]["host"] == "127.0.0.2"

    row = relay.slave_status()
    assert (row["Master_Host"], row["Master_Port"], row["Master_User"]) == ("127.0.0.2", 3310, "repl2")
    assert row["Using_Gtid"] == "Slave_Pos"
    doc = relay.ctx.status_document()
    assert doc["master_host"] == "127.0.0.2" and doc["master_port"] == 3310
    assert doc["master"]["password_set"] is True and "CHANGE MASTER" in doc["master_source"]
    assert SECRET not in json.dumps(doc, default=str) and SECRET not in str(row)

    relay.ok("START SLAVE")
    assert relay.session.io_enabled and relay.session._wake.is_set()  # the run loop connects at once
    relay.close()

    # A restart with the old command line (--master 127.0.0.1:3306) follows the CHANGE MASTER choice.
    again = Relay(relay.relay_dir)
    try:
        assert again.session.master.address == "127.0.0.2:3310" and again.session.master.password == SECRET
        assert "overrides --master 127.0.0.1:3306" in again.session.master_reason
    finally:
        again.close()


@pytest.mark.parametrize("sql", ["STOP SLAVE", "START SLAVE", "STOP REPLICA", CHANGE, "RESET SLAVE ALL"])
def test_a_non_admin_account_gets_1227_and_nothing_changes(relay, sql):
    err = relay.error(sql, 1227, user="repl")
    assert "admin = true" in err.message
    assert relay.session.io_enabled and relay.session.master.address == "127.0.0.1:3306"
    assert not (relay.relay_dir / FILE_NAME).exists()


@pytest.mark.parametrize("sql, code, named", [
    ("CHANGE MASTER TO MASTER_HOSTT='h'", 1064, "MASTER_HOSTT"),
    ("CHANGE MASTER TO MASTER_PORT='abc'", 1064, "abc"),
    ("CHANGE MASTER TO MASTER_HOST='h', MASTER_HOST='i'", 1225, "MASTER_HOST"),  # MariaDB's answer
    ("CHANGE MASTER TO MASTER_AUTO_POSITION=1", 1064, "MASTER_AUTO_POSITION"),  # MySQL's option, MariaDB relay
    ("CHANGE MASTER TO MASTER_HOST=''", 1210, "MASTER_HOST"),
    ("CHANGE MASTER TO MASTER_PORT=70000", 1210, "70000"),
    ("START SLAVE UNTIL MASTER_LOG_FILE='b.000002', MASTER_LOG_POS=4", 1235, "UNTIL"),
])
def test_bad_change_master_is_a_clear_error_and_nothing_is_written(relay, sql, code, named):
    relay.ok("STOP SLAVE")
    err = relay.error(sql, code)
    assert named in err.message
    assert relay.session.master.address == "127.0.0.1:3306"
    assert not (relay.relay_dir / FILE_NAME).exists()


def test_reset_slave_is_refused_with_the_reason(relay):
    relay.ok("STOP SLAVE")
    err = relay.error("RESET SLAVE ALL", 1235)
    assert "discard the relay files" in err.message
    assert list((relay.relay_dir).iterdir()) == list(relay.relay_dir.iterdir())


def test_stop_and_start_twice_answer_ok_and_say_so(relay):
    assert relay.ok("STOP SLAVE").info == ""
    assert "already" in relay.ok("STOP SLAVE").info
    assert relay.ok("START SLAVE").info == ""
    assert "already" in relay.ok("START REPLICA").info
    assert "no SQL thread" in relay.ok("STOP SLAVE SQL_THREAD").info and relay.session.io_enabled


def test_without_an_upstream_the_statements_say_so(tmp_path):
    r = Relay(tmp_path / "served", replication=False)
    try:
        err = r.error("STOP SLAVE", 1200)
        assert "not configured as slave" in err.message
    finally:
        r.close()


def test_mysql_flavour_takes_the_source_spelling_and_auto_position(tmp_path):
    r = Relay(tmp_path / "mysql", gtid_mode="mysql")
    try:
        r.ok("STOP REPLICA")
        r.error("CHANGE MASTER TO MASTER_USE_GTID=slave_pos", 1064)  # MariaDB's option on a MySQL relay
        r.ok("CHANGE REPLICATION SOURCE TO SOURCE_HOST='db2', SOURCE_PORT=3307, SOURCE_AUTO_POSITION=1")
        assert r.session.master.address == "db2:3307" and r.session.master.gtid_mode == "mysql"
        assert r.slave_status()["Auto_Position"] == 1
    finally:
        r.close()


def test_metrics_name_the_master_in_force_and_where_the_choice_came_from(relay):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from relayproxy.ops.metrics import build_registry

    def master_labels():
        text = generate_latest(build_registry(relay.ctx.status_document, process=False)).decode()
        family = {f.name: f for f in text_string_to_metric_families(text)}["relayproxy_master_info"]
        [sample] = family.samples
        return sample.labels

    assert master_labels() == {"host": "127.0.0.1", "port": "3306", "server_id": "", "source": "config"}
    relay.ok("STOP SLAVE")
    relay.ok(CHANGE)
    assert master_labels() == {"host": "127.0.0.2", "port": "3310", "server_id": "", "source": "change_master"}


def test_stop_slave_while_connecting_to_a_master_that_never_answers_stops_at_once(tmp_path):
    """The round still connecting is cancelled, not waited for (connect_timeout is long here), and no error is
    recorded: the operator stopped it."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel does), never greets
    port = silent.getsockname()[1]
    r = Relay(tmp_path / "relay")
    r.session.master = r.session.master.__class__(**{**r.session.master.__dict__, "port": port})

    async def scenario():
        r.cfg.values["connect_timeout"] = 120.0
        task = asyncio.create_task(r.session.run())
        while r.session.status.state != "connecting":
            await asyncio.sleep(0.01)
        stopped = await r.session.stop_replica(timeout=10)
        idle = r.session._idle.is_set()
        state = r.session.status.state
        r.session.stop()
        await asyncio.wait_for(task, 10)
        return stopped, idle, state

    try:
        stopped, idle, state = asyncio.run(scenario())
        assert stopped and idle, "STOP SLAVE waited for the connect timeout instead of cancelling the attempt"
        assert state == "stopped by STOP SLAVE" and r.session.status.last_io_error is None
    finally:
        silent.close()
        r.close()


def test_a_relay_with_files_refuses_a_file_and_position_other_than_its_horizon(tmp_path, corpus_dir):
    """The relay's files are one history: CHANGE MASTER cannot move where it continues (a gap or a repeat)."""
    from .test_downstream_sql import MYSQL_CORPUS, relay_dir_with

    d = relay_dir_with(tmp_path, {"binlog.000004": corpus_dir / MYSQL_CORPUS})
    r = Relay(d, gtid_mode="off")
    try:
        size = (d / "binlog.000004").stat().st_size
        r.ok("STOP SLAVE")
        err = r.error("CHANGE MASTER TO MASTER_LOG_FILE='binlog.000004', MASTER_LOG_POS=4", 1210)
        assert f"continues from its horizon binlog.000004:{size}" in err.message
        assert not (d / FILE_NAME).exists()
        r.ok(f"CHANGE MASTER TO MASTER_LOG_FILE='binlog.000004', MASTER_LOG_POS={size}, MASTER_CONNECT_RETRY=7")
        assert r.session.master.connect_retry == 7  # it caps the reconnect backoff
    finally:
        r.close()


def test_status_shows_the_masters_variables_as_it_said_them(tmp_path):
    from relayproxy.relay.master_variables import MasterVariablesFile

    from ..upstream.test_master_variables import sample

    (tmp_path / "relay").mkdir()
    MasterVariablesFile(tmp_path / "relay").save(sample())
    r = Relay(tmp_path / "relay")
    try:
        doc = r.ctx.status_document()
        assert doc["master_variables"]["binlog_row_metadata"] == "FULL" and doc["master_variables_error"] is None
    finally:
        r.close()
    (tmp_path / "relay" / "relayproxy.master-variables.json").write_text("{ damaged")
    r = Relay(tmp_path / "relay")
    try:
        doc = r.ctx.status_document()
        assert doc["master_variables"] is None and "relayproxy.master-variables.json" in doc["master_variables_error"]
    finally:
        r.close()
