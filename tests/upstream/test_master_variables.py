"""The relay reports its master's replication-relevant variables truthfully (design invariant 8).

Unit tests (no sockets) for the fetch, the durable file and the SQL answers; then the proof against a real
MariaDB master with binlog_row_metadata=FULL: python-mysql-replication with its control connection and its
stream on the relay decodes the same rows (values and column names) as directly on the master, and
``@@binlog_format`` and friends read through the relay equal the master's, also with the master down.
"""

from __future__ import annotations

import asyncio
import json
import threading
import types

import pytest

from relayproxy.relay.master_variables import (
    FILE_NAME,
    VARIABLES,
    MasterVariables,
    MasterVariablesFile,
    select_statement,
    variables_for,
)
from relayproxy.upstream.session import fetch_master_variables
from relayproxy.wire.packets import MySQLError

# ---------------------------------------------------------------------------------------------
# The fetch: one statement, or one by one when the master lacks some


class ScriptedMaster:
    """``await query(sql)`` against a dict of the master's global variables; unknown names answer 1193."""

    def __init__(self, known: dict[str, str | None], error: MySQLError | None = None):
        self.known = known
        self.error = error
        self.queries: list[str] = []

    async def query(self, sql: str):
        self.queries.append(sql)
        if self.error is not None:
            raise self.error
        names = [part.strip().split(".", 1)[1] for part in sql[len("SELECT "):].split(",")]
        for name in names:
            if name not in self.known:
                raise MySQLError(1193, "HY000", f"Unknown system variable '{name}'")
        return types.SimpleNamespace(rows=[[self.known[n] for n in names]])


def run(coro):
    return asyncio.run(coro)


def test_one_statement_when_the_master_has_them_all():
    known = {name: f"v-{name}" for name in VARIABLES}
    master = ScriptedMaster(known)
    got = run(fetch_master_variables(master.query, server_id=7, fetched_at=12.5))
    assert master.queries == [select_statement(VARIABLES)]
    assert got.values == known and got.absent == () and got.server_id == 7 and got.fetched_at == 12.5


def test_one_by_one_when_a_flavour_or_version_lacks_some():
    names = variables_for("mariadb")
    assert "gtid_mode" not in names and "binlog_gtid_index" in names and "binlog_row_metadata" in names
    assert "gtid_domain_id" not in variables_for("mysql") and "binlog_row_value_options" in variables_for("mysql")
    known = {name: "x" for name in names if name not in ("binlog_gtid_index", "binlog_row_metadata")}
    known["binlog_format"] = "ROW"
    master = ScriptedMaster(known)
    got = run(fetch_master_variables(master.query, names))
    assert master.queries[0] == select_statement(names) and len(master.queries) == 1 + len(names)
    assert got.absent == ("binlog_row_metadata", "binlog_gtid_index")
    assert got.values["binlog_format"] == "ROW" and "binlog_gtid_index" not in got.values


def test_another_error_is_not_swallowed():
    master = ScriptedMaster({}, error=MySQLError(1227, "42000", "Access denied"))
    with pytest.raises(MySQLError) as info:
        run(fetch_master_variables(master.query))
    assert info.value.code == 1227 and len(master.queries) == 1


def test_bytes_and_nulls_become_text_or_none():
    got = MasterVariables.from_row(("a", "b", "c"), [b"ROW", None, 3])
    assert got.values == {"a": "ROW", "b": None, "c": "3"}
    with pytest.raises(ValueError):
        MasterVariables.from_row(("a", "b"), ["x"])


# ---------------------------------------------------------------------------------------------
# The durable copy


def sample() -> MasterVariables:
    return MasterVariables(values={"binlog_format": "ROW", "binlog_row_metadata": "FULL", "time_zone": None},
                           absent=("binlog_gtid_index",), server_id=1, server_uuid=None, host="127.0.0.1",
                           port=3306, fetched_at=1700000000.25)


def test_saved_atomically_and_loaded_equal(tmp_path):
    file = MasterVariablesFile(tmp_path)
    assert file.load() is None and file.error is None  # no file yet: nothing known, nothing wrong
    file.save(sample())
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]  # no temporary file left
    assert file.load() == sample() and file.error is None
    doc = json.loads((tmp_path / FILE_NAME).read_text())
    assert doc["master"]["server_id"] == 1 and doc["fetched_at"] == 1700000000.25


@pytest.mark.parametrize("damage", [
    b"", b"{not json", b"\xff\xfe", b"[]", b'{"format": 2}',
    b'{"format": 1, "master": {"server_id": "1"}, "fetched_at": 1, "variables": {}}',
    b'{"format": 1, "master": {"server_id": 1}, "fetched_at": 1, "variables": {"binlog_format": 1}}',
    b'{"format": 1, "master": {"server_id": 1}, "variables": {}}',
])
def test_a_damaged_file_is_reported_and_ignored(tmp_path, damage):
    (tmp_path / FILE_NAME).write_bytes(damage)
    file = MasterVariablesFile(tmp_path)
    assert file.load() is None
    assert file.error is not None and FILE_NAME in file.error
    file.save(sample())  # the next connect's fetch replaces it
    assert file.load() == sample()


def test_same_master():
    v = sample()
    assert v.same_master(1, None) and v.same_master(1, "u") and not v.same_master(2, None)
    assert not v.same_master(None, None)
    with_uuid = MasterVariables(values={}, server_id=1, server_uuid="u")
    assert with_uuid.same_master(1, "u") and not with_uuid.same_master(1, "w")


# ---------------------------------------------------------------------------------------------
# The session: loads the file at start (answers while the master is down), ignores another master's


def make_session(tmp_path):
    from relayproxy.upstream.session import UpstreamSession

    cfg = types.SimpleNamespace(relay_dir=str(tmp_path), verify_checksums=True, server_id=100, master=("127.0.0.1", 1),
                                user="repl", password="", ssl_mode="disabled", ssl_ca=None, ssl_cert=None,
                                ssl_key=None, server_public_key=None, heartbeat_period=1.0, gtid_mode="off",
                                start_file=None, values={})
    store = types.SimpleNamespace()
    return UpstreamSession(cfg, store, receiver=object())


def test_session_answers_from_the_file_after_a_restart(tmp_path):
    MasterVariablesFile(tmp_path).save(sample())
    session = make_session(tmp_path)
    assert session.status.master_variables["binlog_row_metadata"] == "FULL"
    assert session.status.master_variables_source["absent"] == ["binlog_gtid_index"]


def test_session_ignores_another_masters_file(tmp_path):
    from relayproxy.relay.master_info import MasterIdentity, MasterInfoFile

    MasterInfoFile(tmp_path).save_identity(MasterIdentity(server_id=2, server_uuid=None, flavour="mariadb",
                                                          host="127.0.0.1", port=3306))
    MasterVariablesFile(tmp_path).save(sample())  # server_id 1: not the master the files came from
    session = make_session(tmp_path)
    assert session.status.master_variables is None


def test_session_reports_a_damaged_file(tmp_path):
    (tmp_path / FILE_NAME).write_text("{")
    session = make_session(tmp_path)
    assert session.status.master_variables is None
    assert FILE_NAME in session.status.master_variables_error


# ---------------------------------------------------------------------------------------------
# The real-server proof: python-mysql-replication through the relay and directly on the master

USERS_TOML = """
[[users]]
name = "repl"
password = "replpw"
plugin = "mysql_native_password"
"""

WATCHED = ("binlog_format", "binlog_row_metadata", "binlog_row_image", "binlog_checksum")


def master_workload(master) -> None:
    master.execute("CREATE DATABASE cdc")
    master.execute(
        "CREATE TABLE cdc.t (id INT PRIMARY KEY, l VARCHAR(20) CHARACTER SET latin1, "
        "u VARCHAR(20) CHARACTER SET utf8mb4, j JSON, d DECIMAL(20,6), dt DATETIME(6), ts TIMESTAMP(3) NULL, "
        "tm TIME(2), da DATE, y YEAR, b BLOB) DEFAULT CHARSET=utf8mb4")
    master.execute("CREATE TABLE cdc.t2 (k VARCHAR(10) CHARACTER SET latin1 PRIMARY KEY, n BIGINT UNSIGNED)")
    rows = [
        (1, "caf\u00e9 \u00e0 la cr\u00e8me", "\U0001F600 na\u00efve", '{"a": [1, 2.5, "\u00e9"], "b": null}',
         "12345678901234.123456", "2024-02-29 23:59:59.123456", "2001-02-03 04:05:06.789", "-838:59:59.99",
         "1000-01-01", 2155, b"\x00\xff\x80binary"),
        (2, "\u00df\u00f8\u00c6", "\u4e2d\u6587", '[]', "-0.000001", "1970-01-01 00:00:00", None, "00:00:00",
         "9999-12-31", 1901, b""),
    ]
    for row in rows:
        master.execute("INSERT INTO cdc.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", row)
    master.execute("INSERT INTO cdc.t2 VALUES ('\u00e4\u00f6\u00fc', 18446744073709551615)")
    master.execute("UPDATE cdc.t SET l = 'd\u00e9j\u00e0 vu', j = JSON_OBJECT('k', 'v\u00e9'), d = d * 2 WHERE id = 1")
    master.execute("DELETE FROM cdc.t WHERE id = 2")


def decoded_rows(port: int, user: str, password: str, first_file: str) -> tuple[list, Exception | None]:
    """Every rows event python-mysql-replication decodes from ``port`` (control connection and stream there)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    settings = {"host": "127.0.0.1", "port": port, "user": user, "password": password}
    out: list = []
    failure: list[Exception] = []

    def work() -> None:
        stream = BinLogStreamReader(connection_settings=settings, ctl_connection_settings=settings, server_id=4321,
                                    log_file=first_file, log_pos=4, resume_stream=True, blocking=False,
                                    only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent])
        try:
            for event in stream:
                out.append((type(event).__name__, event.schema, event.table, event.columns and
                            [c.name for c in event.columns], event.rows))
        except Exception as exc:  # noqa: BLE001 - the test shows it
            failure.append(exc)
        finally:
            stream.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "python-mysql-replication did not return within 60 s"
    return out, (failure[0] if failure else None)


def variables_on(port: int, user: str, password: str) -> dict:
    from relayproxy.lab.harness import listener_query

    row = listener_query(port, "SELECT " + ", ".join(f"@@{n} AS {n}" for n in WATCHED), user=user,
                         password=password)[0]
    return row


@pytest.mark.server
def test_python_mysql_replication_through_the_relay_equals_the_master(mariadb, tmp_path):
    from relayproxy.lab.harness import RelayProcess, free_port

    master = mariadb("master", extra_config={"binlog_format": "ROW", "binlog_row_metadata": "FULL",
                                             "binlog_row_image": "FULL", "rpl_semi_sync_master_enabled": 0})
    master.create_user("repl", "replpw", "REPLICATION SLAVE, REPLICATION CLIENT, SELECT")
    first_file = master.execute("SHOW BINARY LOGS")[0][0]
    config = tmp_path / "relay.toml"
    config.write_text(USERS_TOML)
    listen = free_port()
    relay = RelayProcess(tmp_path / "relay", master.port, extra=["--listen", f"127.0.0.1:{listen}",
                                                                 "--config", str(config)])
    relay.start()
    try:
        master_workload(master)
        relay.wait_caught_up(master)
        on_master = variables_on(master.port, "repl", "replpw")
        assert on_master == {"binlog_format": "ROW", "binlog_row_metadata": "FULL", "binlog_row_image": "FULL",
                             "binlog_checksum": "CRC32"}
        assert variables_on(listen, "repl", "replpw") == on_master
        persisted = json.loads((tmp_path / "relay" / FILE_NAME).read_text())
        assert persisted["variables"]["binlog_row_metadata"] == "FULL"
        assert persisted["master"]["server_id"] == int(master.execute("SELECT @@server_id")[0][0])

        direct, direct_error = decoded_rows(master.port, "repl", "replpw", first_file)
        relayed, relayed_error = decoded_rows(listen, "repl", "replpw", first_file)
        assert direct_error is None, repr(direct_error)
        assert relayed_error is None, repr(relayed_error)
        assert [e[0] for e in direct] == ["WriteRowsEvent", "WriteRowsEvent", "WriteRowsEvent", "UpdateRowsEvent",
                                          "DeleteRowsEvent"]
        assert direct[0][3][:3] == ["id", "l", "u"]  # FULL metadata: the real column names
        assert direct[0][4][0]["values"]["l"] == "caf\u00e9 \u00e0 la cr\u00e8me"  # latin1 decoded as latin1
        assert relayed == direct

        # The master down and the relay restarted: the answers come from the relay directory.
        relay.stop()
        master.stop()
        relay.start()
        assert variables_on(listen, "repl", "replpw") == on_master
    finally:
        relay.stop()


# ---------------------------------------------------------------------------------------------
# relayproxy serve: what a relay directory kept, else nothing (the files do not prove binlog_format)


def test_serve_answers_what_a_relay_directory_kept(tmp_path):
    from relayproxy.commands.serve import no_upstream

    store = types.SimpleNamespace(format_description=None, flavour="mariadb", binlog_dir=tmp_path)
    assert no_upstream(store).master_variables is None  # a server's directory: NULLs
    MasterVariablesFile(tmp_path).save(sample())
    assert no_upstream(store).master_variables["binlog_format"] == "ROW"
    (tmp_path / FILE_NAME).write_text("[1]")
    upstream = no_upstream(store)
    assert upstream.master_variables is None and upstream.master_variables_error
