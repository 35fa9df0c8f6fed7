"""The SQL layer, sans I/O: every statement replicas, HA tools, drivers and clients send, against real relay stores.

Stores are built from the real binlog corpus (MySQL 8.0.29 with GTIDs, MariaDB 11.8 with GTIDs) or from
synthetic streams written through the store's own write path (so the horizon is the real one). The
column lists are MySQL's (mysql-server sql/rpl_replica.cc show_slave_status_metadata) and MariaDB's
(captured from a mariadbd 10.11.19 replica's SHOW SLAVE STATUS / SHOW ALL SLAVES STATUS).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import time
import types
import uuid as uuid_mod
from pathlib import Path

import pytest

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.binlog.reader import scan_file
from relayproxy.commands import config
from relayproxy.commands.run import SessionRelayView
from relayproxy.downstream.context import (
    ConnectionState,
    DownstreamContext,
    DumpProgress,
    ReplicaRegistration,
)
from relayproxy.downstream.sql import SYSTEM_VARIABLES, execute, execute_sync, tokenize
from relayproxy.ops.status import StatusSources, UpstreamSources, relay_status
from relayproxy.relay.master_variables import VARIABLES as MASTER_VARIABLES
from relayproxy.relay.store import RelayStore
from relayproxy.relay.sync import SyncPolicy
from relayproxy.upstream.receiver import ReceiverCounters, SemiSyncTally
from relayproxy.upstream.session import UpstreamStatus
from relayproxy.wire.results import CloseConnection, ErrorResponse, OkResponse, ResultSet

from ..support import eventgen as E

RELAY_UUID = "5b0e9c4e-7a31-4c55-9d1e-2a6f3b8c9d10"
REPLICA_UUID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
MYSQL_CORPUS = "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004"  # 8.0.29, GTIDs 1-5 -> 1-26
MYSQL_CORPUS_UUID = "83759871-1141-11ed-b12d-0242ac130003"
MARIA_CORPUS_DIR = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_1"
MARIA_FILES = ("mariadb-repl-bin.000001", "mariadb-repl-bin.000002")  # 11.8.5, domain 1: '' -> 1-10-12
SID = E.MYSQL_SID
SID_TEXT = str(uuid_mod.UUID(bytes=SID))
NO_AUTO_SYNC = SyncPolicy("batch", max_transactions=1 << 30, max_delay=1e9)

# SHOW REPLICA STATUS, MySQL 8.0.22+ (show_slave_status_metadata, in order).
MYSQL80_REPLICA_COLUMNS = [
    "Replica_IO_State", "Source_Host", "Source_User", "Source_Port", "Connect_Retry", "Source_Log_File",
    "Read_Source_Log_Pos", "Relay_Log_File", "Relay_Log_Pos", "Relay_Source_Log_File", "Replica_IO_Running",
    "Replica_SQL_Running", "Replicate_Do_DB", "Replicate_Ignore_DB", "Replicate_Do_Table", "Replicate_Ignore_Table",
    "Replicate_Wild_Do_Table", "Replicate_Wild_Ignore_Table", "Last_Errno", "Last_Error", "Skip_Counter",
    "Exec_Source_Log_Pos", "Relay_Log_Space", "Until_Condition", "Until_Log_File", "Until_Log_Pos",
    "Source_SSL_Allowed", "Source_SSL_CA_File", "Source_SSL_CA_Path", "Source_SSL_Cert", "Source_SSL_Cipher",
    "Source_SSL_Key", "Seconds_Behind_Source", "Source_SSL_Verify_Server_Cert", "Last_IO_Errno", "Last_IO_Error",
    "Last_SQL_Errno", "Last_SQL_Error", "Replicate_Ignore_Server_Ids", "Source_Server_Id", "Source_UUID",
    "Source_Info_File", "SQL_Delay", "SQL_Remaining_Delay", "Replica_SQL_Running_State", "Source_Retry_Count",
    "Source_Bind", "Last_IO_Error_Timestamp", "Last_SQL_Error_Timestamp", "Source_SSL_Crl", "Source_SSL_Crlpath",
    "Retrieved_Gtid_Set", "Executed_Gtid_Set", "Auto_Position", "Replicate_Rewrite_DB", "Channel_Name",
    "Source_TLS_Version", "Source_public_key_path", "Get_Source_public_key", "Network_Namespace",
]
# SHOW SLAVE STATUS on MySQL 8.0 (the same columns under the old terms).
MYSQL80_SLAVE_COLUMNS = [
    "Slave_IO_State", "Master_Host", "Master_User", "Master_Port", "Connect_Retry", "Master_Log_File",
    "Read_Master_Log_Pos", "Relay_Log_File", "Relay_Log_Pos", "Relay_Master_Log_File", "Slave_IO_Running",
    "Slave_SQL_Running", "Replicate_Do_DB", "Replicate_Ignore_DB", "Replicate_Do_Table", "Replicate_Ignore_Table",
    "Replicate_Wild_Do_Table", "Replicate_Wild_Ignore_Table", "Last_Errno", "Last_Error", "Skip_Counter",
    "Exec_Master_Log_Pos", "Relay_Log_Space", "Until_Condition", "Until_Log_File", "Until_Log_Pos",
    "Master_SSL_Allowed", "Master_SSL_CA_File", "Master_SSL_CA_Path", "Master_SSL_Cert", "Master_SSL_Cipher",
    "Master_SSL_Key", "Seconds_Behind_Master", "Master_SSL_Verify_Server_Cert", "Last_IO_Errno", "Last_IO_Error",
    "Last_SQL_Errno", "Last_SQL_Error", "Replicate_Ignore_Server_Ids", "Master_Server_Id", "Master_UUID",
    "Master_Info_File", "SQL_Delay", "SQL_Remaining_Delay", "Slave_SQL_Running_State", "Master_Retry_Count",
    "Master_Bind", "Last_IO_Error_Timestamp", "Last_SQL_Error_Timestamp", "Master_SSL_Crl", "Master_SSL_Crlpath",
    "Retrieved_Gtid_Set", "Executed_Gtid_Set", "Auto_Position", "Replicate_Rewrite_DB", "Channel_Name",
    "Master_TLS_Version", "Master_public_key_path", "Get_master_public_key", "Network_Namespace",
]
# MySQL 5.7: no public-key columns, no Network_Namespace.
MYSQL57_SLAVE_COLUMNS = MYSQL80_SLAVE_COLUMNS[: MYSQL80_SLAVE_COLUMNS.index("Master_TLS_Version") + 1]
# mariadbd 10.11.19, SHOW SLAVE STATUS (and SHOW REPLICA STATUS: the same names).
MARIADB_SLAVE_COLUMNS = [
    "Slave_IO_State", "Master_Host", "Master_User", "Master_Port", "Connect_Retry", "Master_Log_File",
    "Read_Master_Log_Pos", "Relay_Log_File", "Relay_Log_Pos", "Relay_Master_Log_File", "Slave_IO_Running",
    "Slave_SQL_Running", "Replicate_Do_DB", "Replicate_Ignore_DB", "Replicate_Do_Table", "Replicate_Ignore_Table",
    "Replicate_Wild_Do_Table", "Replicate_Wild_Ignore_Table", "Last_Errno", "Last_Error", "Skip_Counter",
    "Exec_Master_Log_Pos", "Relay_Log_Space", "Until_Condition", "Until_Log_File", "Until_Log_Pos",
    "Master_SSL_Allowed", "Master_SSL_CA_File", "Master_SSL_CA_Path", "Master_SSL_Cert", "Master_SSL_Cipher",
    "Master_SSL_Key", "Seconds_Behind_Master", "Master_SSL_Verify_Server_Cert", "Last_IO_Errno", "Last_IO_Error",
    "Last_SQL_Errno", "Last_SQL_Error", "Replicate_Ignore_Server_Ids", "Master_Server_Id", "Master_SSL_Crl",
    "Master_SSL_Crlpath", "Using_Gtid", "Gtid_IO_Pos", "Replicate_Do_Domain_Ids", "Replicate_Ignore_Domain_Ids",
    "Parallel_Mode", "SQL_Delay", "SQL_Remaining_Delay", "Slave_SQL_Running_State", "Slave_DDL_Groups",
    "Slave_Non_Transactional_Groups", "Slave_Transactional_Groups", "Replicate_Rewrite_DB",
]
MARIADB_ALL_SLAVES_COLUMNS = ["Connection_name", "Slave_SQL_State"] + MARIADB_SLAVE_COLUMNS + [
    "Retried_transactions", "Max_relay_log_size", "Executed_log_entries", "Slave_received_heartbeats",
    "Slave_heartbeat_period", "Gtid_Slave_Pos",
]


# ---------------------------------------------------------------------------------------------
# Building relays


class Relay:
    """A DownstreamContext around a real RelayStore, with a stub upstream session."""

    def __init__(self, store: RelayStore, relay_dir: Path, *, master: str | None = "10.0.0.1:3306",
                 status: UpstreamStatus | None = None, **options: str):
        environ = {
            "RELAYPROXY_SERVER_ID": "100",
            "RELAYPROXY_USER": "repl",
            "RELAYPROXY_RELAY_DIR": str(relay_dir),
            "RELAYPROXY_LISTEN": "0.0.0.0:3307",
        }
        if master:
            environ["RELAYPROXY_MASTER"] = master
        environ.update({f"RELAYPROXY_{k.upper()}": v for k, v in options.items()})
        self.cfg = config.load(None, environ=environ)
        self.store = store
        self.status = status or UpstreamStatus(io_running=True, state="streaming", master_server_id=1,
                                               master_uuid=MYSQL_CORPUS_UUID)
        self.receiver = types.SimpleNamespace(master_position=None, master_timestamp=0, counters=ReceiverCounters(),
                                              semi_sync=SemiSyncTally())
        self.session = types.SimpleNamespace(store=store, status=self.status, receiver=self.receiver)
        self.ctx = DownstreamContext(SessionRelayView(self.cfg, lambda: self.session.store, self.upstream,
                                                      server_uuid=RELAY_UUID),
                                     status_document=lambda: relay_status(self.cfg, StatusSources(
                                         self.session.store, self.upstream())))
        self.conn = self.connect(7)

    def upstream(self) -> UpstreamSources:
        return UpstreamSources(self.session.status, self.session.receiver)

    def connect(self, conn_id: int, user: str = "repl", host: str = "10.0.0.9") -> ConnectionState:
        conn = ConnectionState(conn_id=conn_id, user=user, host=host)
        self.ctx.connections[conn_id] = conn
        return conn

    def run(self, sql: str, conn: ConnectionState | None = None):
        return execute_sync(self.ctx, conn or self.conn, sql)

    def rows(self, sql: str, conn: ConnectionState | None = None) -> list[list]:
        result = self.run(sql, conn)
        assert isinstance(result, ResultSet), f"{sql!r} -> {result}"
        return [list(r) for r in result.rows]

    def one(self, sql: str, conn: ConnectionState | None = None):
        rows = self.rows(sql, conn)
        assert len(rows) == 1 and len(rows[0]) == 1, rows
        return rows[0][0]

    def row_dict(self, sql: str) -> dict:
        result = self.run(sql)
        assert isinstance(result, ResultSet) and len(result.rows) == 1, result
        return dict(zip(result.columns, result.rows[0]))

    def ok(self, sql: str, conn: ConnectionState | None = None) -> OkResponse:
        result = self.run(sql, conn)
        assert isinstance(result, OkResponse), f"{sql!r} -> {result}"
        return result

    def error(self, sql: str, code: int, conn: ConnectionState | None = None) -> ErrorResponse:
        result = self.run(sql, conn)
        assert isinstance(result, ErrorResponse), f"{sql!r} -> {result}"
        assert result.code == code, f"{sql!r} -> {result}"
        return result


def relay_dir_with(tmp_path: Path, files: dict[str, bytes | Path]) -> Path:
    d = tmp_path / "relay"
    d.mkdir(parents=True)
    for name, data in files.items():
        if isinstance(data, Path):
            shutil.copyfile(data, d / name)
        else:
            (d / name).write_bytes(data)
    (d / "relayproxy.index").write_text("".join(f"{n}\n" for n in files))
    return d


@pytest.fixture
def mysql_relay(tmp_path, corpus_dir):
    """One real MySQL 8.0.29 binlog (GTIDs uuid:6-26 inside, uuid:1-5 before it)."""
    d = relay_dir_with(tmp_path / "mysql", {"binlog.000004": corpus_dir / MYSQL_CORPUS})
    store = RelayStore.open(d)
    yield Relay(store, d, gtid_mode="mysql")
    store.close()


@pytest.fixture
def maria_relay(tmp_path, corpus_dir):
    """Two real MariaDB 11.8 binlogs (domain 1: '' at the start, 1-10-12 at the end)."""
    d = relay_dir_with(tmp_path / "maria", {n: corpus_dir / MARIA_CORPUS_DIR / n for n in MARIA_FILES})
    store = RelayStore.open(d)
    status = UpstreamStatus(io_running=True, state="streaming", master_server_id=10)
    yield Relay(store, d, status=status, gtid_mode="mariadb")
    store.close()


def mysql_file(start: GtidSet, gnos: list[int], next_name: str | None, version: str = "8.0.36") -> bytes:
    events = [E.event(C.PREVIOUS_GTIDS_LOG_EVENT, start.encode())]
    for gno in gnos:
        events += [E.gtid(gno), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(gno)]
    if next_name:
        events.append(E.rotate(next_name))
    return E.binlog_file(*events, server_version=version)


def split_events(image: bytes, start: int = 4) -> list[tuple[int, bytes]]:
    out, pos = [], start
    while pos < len(image):
        size = struct.unpack_from("<I", image, pos + 9)[0]
        out.append((pos, image[pos:pos + size]))
        pos += size
    return out


def feed(store: RelayStore, events: list[tuple[int, bytes]], parser: B.TransactionBoundaryParser) -> None:
    """What the upstream session does per event: store, boundary parser, group ends (no sync here)."""
    for offset, ev in events:
        store.write_event(offset, ev)
        kind = parser.feed_event(ev, 0) & B.RESULT_MASK
        end = offset + len(ev)
        if kind == B.GROUP_END:
            store.group_complete(end, parser.gtid)
        elif kind == B.EVENT_OUTSIDE:
            store.boundary_outside(end)


# ---------------------------------------------------------------------------------------------
# Replica IO threads: the exact sequences (protocol-reference §3.5, §3.11) and the answers they need


def test_mysql_80_replica_io_thread_sequence(mysql_relay):
    r = mysql_relay
    before = int(time.time())
    clock = r.run("SELECT UNIX_TIMESTAMP()")
    assert clock.columns == ["UNIX_TIMESTAMP()"] and before <= clock.rows[0][0] <= int(time.time()) + 1
    # The relay's own server_id (never the master's): equal ids would stop the replica.
    server_id = r.run("SELECT @@GLOBAL.SERVER_ID")
    assert server_id.columns == ["@@GLOBAL.SERVER_ID"] and server_id.rows == [[100]]
    r.ok("SET @master_heartbeat_period = 30000000000, @source_heartbeat_period = 30000000000")
    r.ok("SET @master_binlog_checksum = @@global.binlog_checksum, @source_binlog_checksum = @@global.binlog_checksum")
    # Must be NONE or CRC32 (find_type against binlog_checksum_typelib), here the relay file's FDE says CRC32.
    assert r.one("SELECT @source_binlog_checksum") == "CRC32"
    assert r.one("SELECT @@GLOBAL.GTID_MODE") == "ON"  # auto-position needs the source ON
    assert r.one("SELECT @@GLOBAL.SERVER_UUID") == RELAY_UUID
    r.ok(f"SET @slave_uuid = '{REPLICA_UUID}', @replica_uuid = '{REPLICA_UUID}'")
    assert r.one("SELECT @@global.rpl_semi_sync_source_enabled") == 1
    r.ok("SET @rpl_semi_sync_replica = 1, @rpl_semi_sync_slave = 1")
    # What the dump sender reads afterwards, as the master's Binlog_sender does.
    assert r.conn.user_vars == {
        "master_heartbeat_period": 30000000000, "source_heartbeat_period": 30000000000,
        "master_binlog_checksum": "CRC32", "source_binlog_checksum": "CRC32",
        "slave_uuid": REPLICA_UUID, "replica_uuid": REPLICA_UUID,
        "rpl_semi_sync_replica": 1, "rpl_semi_sync_slave": 1,
    }


def test_mysql_84_replica_sees_the_same_answers(mysql_relay):
    r = mysql_relay
    r.status.master_server_version = "8.4.3"
    assert r.one("SELECT @@version") == "8.4.3-relayproxy-log"
    assert r.one("SELECT @@GLOBAL.SERVER_ID") == 100
    r.ok("SET @master_heartbeat_period = 15000000000, @source_heartbeat_period = 15000000000")
    r.ok("SET @master_binlog_checksum = @@global.binlog_checksum, @source_binlog_checksum = @@global.binlog_checksum")
    assert r.one("SELECT @source_binlog_checksum") == "CRC32"
    assert r.one("SELECT @@GLOBAL.GTID_MODE") == "ON"
    assert r.one("SELECT @@GLOBAL.SERVER_UUID") == RELAY_UUID
    assert r.one("SELECT @@global.rpl_semi_sync_source_enabled") == 1
    assert r.run("SHOW REPLICA STATUS").columns == MYSQL80_REPLICA_COLUMNS


def test_mysql_57_replica_io_thread_sequence(tmp_path):
    image = mysql_file(GtidSet(f"{SID_TEXT}:1-3"), [4, 5], None, version="5.7.44-log")
    d = relay_dir_with(tmp_path, {"mysql-bin.000001": image})
    with RelayStore.open(d) as store:
        r = Relay(store, d)
        assert r.one("SELECT UNIX_TIMESTAMP()") >= int(time.time()) - 1
        # 5.7 reads row[1] of SHOW VARIABLES for SERVER_ID and SERVER_UUID.
        server_id = r.run("SHOW VARIABLES LIKE 'SERVER_ID'")
        assert server_id.columns == ["Variable_name", "Value"] and server_id.rows == [["server_id", "100"]]
        r.ok("SET @master_heartbeat_period= 30000001024")
        r.ok("SET @master_binlog_checksum= @@global.binlog_checksum")
        assert r.one("SELECT @master_binlog_checksum") == "CRC32"
        assert r.one("SELECT @@GLOBAL.GTID_MODE") == "ON"  # the relay holds MySQL GTIDs
        assert r.rows("SHOW VARIABLES LIKE 'SERVER_UUID'") == [["server_uuid", RELAY_UUID]]
        r.ok(f"SET @slave_uuid= '{REPLICA_UUID}'")
        # 5.7 has no rpl_semi_sync_source_enabled: 1193, which an 8.0 replica treats as "try master_enabled".
        r.error("SELECT @@global.rpl_semi_sync_source_enabled", 1193)
        assert r.one("SELECT @@global.rpl_semi_sync_master_enabled") == 1
        r.ok("SET @rpl_semi_sync_slave= 1")
        assert r.conn.user_vars["master_heartbeat_period"] == 30000001024
        assert r.conn.user_vars["slave_uuid"] == REPLICA_UUID
        assert r.run("SHOW SLAVE STATUS").columns == MYSQL57_SLAVE_COLUMNS
        assert r.run("SHOW BINARY LOGS").columns == ["Log_name", "File_size"]  # Encrypted is 8.0.14+


@pytest.mark.parametrize("master_version, shown", [
    (None, "11.8.5-MariaDB-ubu2404-log"),  # no master connected yet: the relay file's FDE
    ("10.6.16-MariaDB-log", "10.6.16-MariaDB-log"),
])
def test_mariadb_replica_io_thread_sequence_gtid_mode(maria_relay, master_version, shown):
    r = maria_relay
    r.status.master_server_version = master_version
    assert r.one("SELECT @@version") == shown
    assert r.one("SELECT UNIX_TIMESTAMP()") >= int(time.time()) - 1
    assert r.rows("SHOW VARIABLES LIKE 'SERVER_ID'") == [["server_id", "100"]]
    r.ok("SET @master_heartbeat_period= 15000000000")
    r.ok("SET @master_binlog_checksum= @@global.binlog_checksum")
    assert r.one("SELECT @master_binlog_checksum") == "CRC32"
    r.ok("SET skip_replication=1")
    r.ok("SET @mariadb_slave_capability=4")
    assert r.one("SELECT @@GLOBAL.gtid_domain_id") == 0
    r.ok("SET @slave_connect_state='1-10-5'")
    r.ok("SET @slave_gtid_strict_mode=1")
    r.ok("SET @slave_gtid_ignore_duplicates=0")
    assert r.one("SELECT @@global.rpl_semi_sync_master_enabled") == 1
    r.ok("SET @rpl_semi_sync_slave= 1")
    assert r.conn.user_vars == {
        "master_heartbeat_period": 15000000000, "master_binlog_checksum": "CRC32", "mariadb_slave_capability": 4,
        "slave_connect_state": "1-10-5", "slave_gtid_strict_mode": 1, "slave_gtid_ignore_duplicates": 0,
        "rpl_semi_sync_slave": 1,
    }
    assert r.conn.session_vars["skip_replication"] == 1
    # A MariaDB master has no MySQL GTID variables: 1193 as from a real mariadbd.
    for name in ("gtid_mode", "gtid_executed", "gtid_purged", "server_uuid", "rpl_semi_sync_source_enabled"):
        r.error(f"SELECT @@GLOBAL.{name}", 1193)


def test_mariadb_replica_in_file_mode_asks_binlog_gtid_pos(maria_relay, corpus_dir):
    """BINLOG_GTID_POS at every group end equals the start state plus the groups before it; NULL elsewhere."""
    r = maria_relay
    path = corpus_dir / MARIA_CORPUS_DIR / MARIA_FILES[1]
    groups = []
    scan_file(path, on_group=groups.append)
    assert [g.complete for g in groups] == [True] * 12
    state = MariaBinlogState()
    for group in groups:
        if group.gtid is not None:
            state.update(MariaGtid(*group.gtid))
        answer = r.one(f"SELECT binlog_gtid_pos('{MARIA_FILES[1]}',{group.end})")
        assert answer == str(state.current_position())
        # Inside the group (after its first event): not a boundary, NULL, never a half-done GTID.
        inside = group.start + struct.unpack_from("<I", path.read_bytes(), group.start + 9)[0]
        if inside < group.end:
            assert r.one(f"SELECT BINLOG_GTID_POS('{MARIA_FILES[1]}', {inside})") is None
    assert r.one(f"SELECT BINLOG_GTID_POS('{MARIA_FILES[1]}', 4)") == ""
    assert r.one(f"SELECT BINLOG_GTID_POS('{MARIA_FILES[1]}', {path.stat().st_size})") == "1-10-12"
    assert r.one(f"SELECT BINLOG_GTID_POS('{MARIA_FILES[1]}', 5)") is None  # inside the FDE
    assert r.one(f"SELECT BINLOG_GTID_POS('{MARIA_FILES[1]}', {path.stat().st_size + 1})") is None
    assert r.one("SELECT BINLOG_GTID_POS('mariadb-repl-bin.000099', 4)") is None
    assert r.one("SELECT BINLOG_GTID_POS(NULL, 4)") is None
    result = r.run(f"SELECT binlog_gtid_pos('{MARIA_FILES[1]}',4)")
    assert result.columns == [f"binlog_gtid_pos('{MARIA_FILES[1]}',4)"]


# ---------------------------------------------------------------------------------------------
# The horizon: nothing partial is advertised


@pytest.fixture
def live_relay(tmp_path):
    """binlog.000001 written through the store: two complete transactions durable, a third cut mid-way."""
    image = mysql_file(GtidSet(f"{SID_TEXT}:1-10"), [11, 12, 13], None)
    events = split_events(image)
    store = RelayStore.open(tmp_path / "relay", sync=NO_AUTO_SYNC)
    store.start_file("binlog.000001")
    # FDE, PREVIOUS_GTIDS, two groups of 5 events, then the first 3 events of the third group.
    complete = 2 + 5 * 2
    parser = B.TransactionBoundaryParser()
    feed(store, events[:complete + 3], parser)
    store.sync()
    relay = Relay(store, tmp_path / "relay", gtid_mode="mysql")
    relay.parser = parser
    relay.horizon_end = events[complete - 1][0] + len(events[complete - 1][1])
    relay.partial_end = events[complete + 2][0] + len(events[complete + 2][1])
    relay.events = events
    yield relay
    store.close()


def test_status_answers_stop_at_the_horizon(live_relay):
    r = live_relay
    end = r.horizon_end
    assert r.store.current_end == r.partial_end > end  # the partial group is on disk, not advertised
    executed = f"{SID_TEXT}:1-12"
    assert r.rows("SHOW MASTER STATUS") == [["binlog.000001", end, "", "", executed]]
    r.error("SHOW BINARY LOG STATUS", 1064)  # exists from MySQL 8.2 on: older servers say 1064
    r.status.master_server_version = "8.4.3"
    assert r.rows("SHOW BINARY LOG STATUS") == [["binlog.000001", end, "", "", executed]]
    assert r.rows("SHOW BINARY LOGS") == [["binlog.000001", end, "No"]]
    assert r.one("SELECT @@global.gtid_executed") == executed
    assert r.one("SELECT @@global.gtid_purged") == f"{SID_TEXT}:1-10"
    status = r.row_dict("SHOW REPLICA STATUS")
    assert status["Source_Log_File"] == status["Relay_Source_Log_File"] == "binlog.000001"
    assert status["Read_Source_Log_Pos"] == status["Exec_Source_Log_Pos"] == end
    assert status["Retrieved_Gtid_Set"] == status["Executed_Gtid_Set"] == executed
    assert status["Relay_Log_Space"] == end
    # Group boundaries give positions; the cut group does not exist for BINLOG_GTID_POS.
    assert r.one(f"SELECT BINLOG_GTID_POS('binlog.000001', {end})") == executed
    assert r.one(f"SELECT BINLOG_GTID_POS('binlog.000001', {r.partial_end})") is None
    first_end = r.events[6][0] + len(r.events[6][1])
    assert r.one(f"SELECT BINLOG_GTID_POS('binlog.000001', {first_end})") == f"{SID_TEXT}:1-11"
    assert r.one(f"SELECT BINLOG_GTID_POS('binlog.000001', {first_end - 8})") is None  # inside the XID
    # The rest of the third group arrives and becomes durable: every answer moves together.
    feed(r.store, r.events[len(r.events) - 2:], r.parser)
    r.store.sync()
    assert r.rows("SHOW MASTER STATUS")[0][1] == r.store.current_end
    assert r.one("SELECT @@gtid_executed") == f"{SID_TEXT}:1-13"


def test_show_replica_status_values_mysql(mysql_relay, corpus_dir):
    r = mysql_relay
    size = (corpus_dir / MYSQL_CORPUS).stat().st_size
    r.receiver.master_position = ("binlog.000004", size)
    r.receiver.master_timestamp = int(time.time()) - 5
    r.status.clock_diff = 0.0
    status = r.run("SHOW REPLICA STATUS")
    assert status.columns == MYSQL80_REPLICA_COLUMNS
    row = dict(zip(status.columns, status.rows[0]))
    gtids = f"{MYSQL_CORPUS_UUID}:1-26"
    expected = {
        "Replica_IO_State": "Waiting for source to send event", "Source_Host": "10.0.0.1", "Source_User": "repl",
        "Source_Port": 3306, "Source_Log_File": "binlog.000004", "Read_Source_Log_Pos": size,
        "Relay_Log_File": "binlog.000004", "Relay_Log_Pos": size, "Relay_Source_Log_File": "binlog.000004",
        "Replica_IO_Running": "Yes", "Replica_SQL_Running": "No", "Exec_Source_Log_Pos": size,
        "Relay_Log_Space": size, "Seconds_Behind_Source": 0, "Last_IO_Errno": 0, "Last_IO_Error": "",
        "Last_IO_Error_Timestamp": "", "Source_Server_Id": 1, "Source_UUID": MYSQL_CORPUS_UUID,
        "Retrieved_Gtid_Set": gtids, "Executed_Gtid_Set": gtids, "Auto_Position": 1, "Channel_Name": "",
        "Until_Condition": "None", "SQL_Remaining_Delay": None,
    }
    assert {k: row[k] for k in expected} == expected
    old = r.run("SHOW SLAVE STATUS")
    assert old.columns == MYSQL80_SLAVE_COLUMNS
    assert old.rows == status.rows
    assert r.run("show replica status for channel ''").rows == status.rows
    r.error("SHOW REPLICA STATUS FOR CHANNEL 'other'", 3074)


def test_show_replica_status_while_reconnecting_reports_the_master_error(mysql_relay):
    r = mysql_relay
    failed_at = time.time() - 3
    r.status.io_running = False
    r.status.state = "waiting 0.40s to reconnect"
    r.status.last_io_error = "error 1236 from master: Could not find first log file name in binary log index file"
    r.status.last_io_error_time = failed_at
    row = r.row_dict("SHOW SLAVE STATUS")
    assert row["Slave_IO_Running"] == "Connecting"
    assert row["Slave_SQL_Running"] == "No"
    assert row["Seconds_Behind_Master"] is None
    assert row["Last_IO_Errno"] == 1236
    assert row["Last_IO_Error"].startswith("error 1236 from master: Could not find first log")
    assert row["Last_IO_Error_Timestamp"] == time.strftime("%y%m%d %H:%M:%S", time.localtime(failed_at))
    r.status.last_io_error = "[Errno 111] Connection refused"
    assert r.row_dict("SHOW SLAVE STATUS")["Last_IO_Errno"] == 2013
    r.status.state = "stopped"
    assert r.row_dict("SHOW SLAVE STATUS")["Slave_IO_Running"] == "No"


def test_show_slave_status_mariadb_columns_and_values(maria_relay, corpus_dir):
    r = maria_relay
    size = (corpus_dir / MARIA_CORPUS_DIR / MARIA_FILES[1]).stat().st_size
    first = (corpus_dir / MARIA_CORPUS_DIR / MARIA_FILES[0]).stat().st_size
    status = r.run("SHOW SLAVE STATUS")
    assert status.columns == MARIADB_SLAVE_COLUMNS
    row = dict(zip(status.columns, status.rows[0]))
    assert row["Slave_IO_State"] == "Waiting for master to send event"
    assert (row["Master_Log_File"], row["Read_Master_Log_Pos"], row["Exec_Master_Log_Pos"]) == (MARIA_FILES[1], size, size)
    assert (row["Slave_IO_Running"], row["Slave_SQL_Running"]) == ("Yes", "No")
    assert (row["Using_Gtid"], row["Gtid_IO_Pos"]) == ("Slave_Pos", "1-10-12")
    assert row["Master_Server_Id"] == 10
    assert row["Relay_Log_Space"] == first + size
    assert r.run("SHOW REPLICA STATUS").columns == MARIADB_SLAVE_COLUMNS  # MariaDB keeps the old names
    all_status = r.run("SHOW ALL SLAVES STATUS")
    assert all_status.columns == MARIADB_ALL_SLAVES_COLUMNS
    extra = dict(zip(all_status.columns, all_status.rows[0]))
    assert extra["Connection_name"] == "" and extra["Slave_heartbeat_period"] == 1.0
    assert r.run("SHOW ALL REPLICAS STATUS").columns == MARIADB_ALL_SLAVES_COLUMNS
    assert r.run("SHOW SLAVE '' STATUS").columns == MARIADB_SLAVE_COLUMNS
    r.error("SHOW SLAVE 'other' STATUS", 1617)


def test_show_all_slaves_status_is_a_syntax_error_for_mysql(mysql_relay):
    # Monitoring tools try it first and fall back to SHOW SLAVE STATUS on 1064, as with a real MySQL.
    mysql_relay.error("SHOW ALL SLAVES STATUS", 1064)


def test_relay_without_master_shows_no_replica_row(tmp_path):
    d = relay_dir_with(tmp_path, {"binlog.000001": mysql_file(GtidSet(), [1], None)})
    with RelayStore.open(d) as store:
        r = Relay(store, d, master=None)
        result = r.run("SHOW REPLICA STATUS")
        assert result.columns[:2] == ["Replica_IO_State", "Source_Host"] and result.rows == []


# ---------------------------------------------------------------------------------------------
# Master-side status and GTID variables


def test_mysql_gtid_variables_and_master_status(mysql_relay, corpus_dir):
    r = mysql_relay
    size = (corpus_dir / MYSQL_CORPUS).stat().st_size
    executed = f"{MYSQL_CORPUS_UUID}:1-26"
    status = r.run("SHOW MASTER STATUS")
    assert status.columns == ["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB", "Executed_Gtid_Set"]
    assert status.rows == [["binlog.000004", size, "", "", executed]]
    logs = r.run("SHOW MASTER LOGS")
    assert logs.columns == ["Log_name", "File_size", "Encrypted"] and logs.rows == [["binlog.000004", size, "No"]]
    assert r.run("SHOW BINARY LOGS").rows == logs.rows
    assert r.rows("SELECT @@gtid_mode, @@global.gtid_executed, @@GLOBAL.gtid_purged, @@enforce_gtid_consistency") == [
        ["ON", executed, f"{MYSQL_CORPUS_UUID}:1-5", "ON"]]
    # GTID variables are GLOBAL only, as in MySQL.
    r.error("SELECT @@session.gtid_executed", 1238)
    # MariaDB-only variables do not exist on a MySQL relay.
    for name in ("gtid_binlog_pos", "gtid_binlog_state", "gtid_current_pos", "gtid_slave_pos", "gtid_domain_id"):
        r.error(f"SELECT @@{name}", 1193)
    # MySQL's GTID functions, which HA tools run against any member (errant-GTID checks).
    assert r.one(f"SELECT GTID_SUBSET('{MYSQL_CORPUS_UUID}:3-7', @@global.gtid_executed)") == 1
    assert r.one(f"SELECT gtid_subtract(@@global.gtid_executed, '{MYSQL_CORPUS_UUID}:2-25')") == f"{MYSQL_CORPUS_UUID}:1:26"
    r.error("SELECT GTID_SUBSET('not a gtid set', '')", 1772)


def test_gtid_mode_off_for_a_relay_without_gtids(tmp_path):
    image = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode()),
                          E.gtid(0, anonymous=True), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(1),
                          server_version="5.7.44-log")
    d = relay_dir_with(tmp_path, {"mysql-bin.000001": image})
    with RelayStore.open(d) as store:
        r = Relay(store, d)
        assert r.rows("SELECT @@GLOBAL.GTID_MODE, @@gtid_executed, @@gtid_purged") == [["OFF", "", ""]]
        assert r.rows("SHOW MASTER STATUS") == [["mysql-bin.000001", len(image), "", "", ""]]
        # The master's own value wins when the upstream session recorded it.
        r.status.master_variables = {"gtid_mode": "on_permissive", "binlog_format": "MIXED"}
        assert r.rows("SELECT @@gtid_mode, @@binlog_format") == [["ON_PERMISSIVE", "MIXED"]]


def test_mariadb_gtid_variables_and_master_status(maria_relay, corpus_dir):
    r = maria_relay
    size = (corpus_dir / MARIA_CORPUS_DIR / MARIA_FILES[1]).stat().st_size
    first = (corpus_dir / MARIA_CORPUS_DIR / MARIA_FILES[0]).stat().st_size
    assert r.rows("SELECT @@gtid_binlog_pos, @@gtid_binlog_state, @@gtid_current_pos, @@gtid_slave_pos") == [
        ["1-10-12", "1-10-12", "1-10-12", ""]]
    status = r.run("SHOW MASTER STATUS")
    assert status.columns == ["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB"]  # as mariadbd: no GTID column
    assert status.rows == [[MARIA_FILES[1], size, "", ""]]
    logs = r.run("SHOW BINARY LOGS")
    assert logs.columns == ["Log_name", "File_size"]  # mariadbd 10.11 has no Encrypted column
    assert logs.rows == [[MARIA_FILES[0], first], [MARIA_FILES[1], size]]
    assert r.one("SELECT @@version") == "11.8.5-MariaDB-ubu2404-log"
    assert r.rows("SHOW GLOBAL VARIABLES LIKE 'gtid%'") == [
        ["gtid_binlog_pos", "1-10-12"], ["gtid_binlog_state", "1-10-12"], ["gtid_current_pos", "1-10-12"],
        ["gtid_domain_id", "0"], ["gtid_ignore_duplicates", "OFF"], ["gtid_slave_pos", ""], ["gtid_strict_mode", "OFF"],
    ]
    r.error("SELECT @@session.gtid_binlog_pos", 1238)
    r.error("SELECT GTID_SUBSET('', '')", 1305)  # MySQL functions do not exist on MariaDB


def test_mariadb_binlog_state_keeps_every_server(tmp_path):
    start = MariaBinlogState([MariaGtid(0, 1, 5), MariaGtid(0, 2, 3), MariaGtid(1, 2, 9)])
    events = [E.event(C.MARIA_GTID_LIST_EVENT, start.encode_gtid_list_body()),
              E.maria_gtid(6, 0, 0, server_id=1), E.query("BEGIN"), E.query("INSERT INTO t VALUES (1)"), E.xid(1)]
    image = E.binlog_file(*events, server_version="10.11.6-MariaDB-log")
    d = relay_dir_with(tmp_path, {"mariadb-bin.000001": image})
    with RelayStore.open(d) as store:
        r = Relay(store, d)
        assert r.rows("SELECT @@gtid_binlog_state, @@gtid_binlog_pos") == [["0-2-3,0-1-6,1-2-9", "0-1-6,1-2-9"]]
        assert r.one("SELECT BINLOG_GTID_POS('mariadb-bin.000001', 4)") == "0-2-3,1-2-9"
        assert r.one(f"SELECT BINLOG_GTID_POS('mariadb-bin.000001', {len(image)})") == "0-1-6,1-2-9"


def test_binlog_checksum_follows_the_relay_fde(tmp_path):
    image = mysql_file(GtidSet(), [1], None)
    d = relay_dir_with(tmp_path, {"binlog.000001": image})
    with RelayStore.open(d) as store:
        assert Relay(store, d).one("SELECT @@global.binlog_checksum") == "CRC32"
    plain = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode(), checksum=False),
                          E.query("CREATE TABLE t (a INT)", checksum=False), checksum=False)
    d2 = relay_dir_with(tmp_path / "plain", {"binlog.000001": plain})
    with RelayStore.open(d2) as store:
        r = Relay(store, d2)
        r.ok("SET @master_binlog_checksum= @@global.binlog_checksum")
        assert r.one("SELECT @master_binlog_checksum") == "NONE"
        assert r.rows("SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'") == [["binlog_checksum", "NONE"]]


@pytest.mark.parametrize("checksum", [True, False], ids=["crc32", "none"])
def test_binlog_checksum_while_the_newest_file_has_no_fde(tmp_path, checksum):
    """A newest file that holds only the magic (a relay restarted between a master switch and the new master's
    first event; a file just rotated to) answers with the previous file's FORMAT_DESCRIPTION, NONE as faithfully
    as CRC32, and never NULL: a MariaDB replica stops for good on NULL (1593, "when it tried to SELECT
    @master_binlog_checksum")."""
    first = E.binlog_file(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet().encode(), checksum=checksum),
                          E.query("CREATE TABLE t (a INT)", checksum=checksum), checksum=checksum)
    want = "CRC32" if checksum else "NONE"
    d = relay_dir_with(tmp_path, {"binlog.000001": first, "binlog.000002": C.BINLOG_MAGIC})
    with RelayStore.open(d) as store:
        assert store.format_description is None and store.current_file == "binlog.000002"
        r = Relay(store, d)
        r.ok("SET @master_binlog_checksum= @@global.binlog_checksum")
        assert r.one("SELECT @master_binlog_checksum") == want
        store.start_file("binlog.000003")  # rotated again while running: still the last one written
        assert r.one("SELECT @@global.binlog_checksum") == want
    alone = relay_dir_with(tmp_path / "alone", {"binlog.000001": C.BINLOG_MAGIC})
    with RelayStore.open(alone) as store:  # nothing written, no master asked: NULL, not a guess
        r = Relay(store, alone)
        assert r.one("SELECT @@global.binlog_checksum") is None
        # ... but a replica announcing itself with it would stop for good on NULL: its connection is closed
        # instead (a network error to it: it connects again), and nothing is assigned.
        for sql in ("SET @master_binlog_checksum= @@global.binlog_checksum",
                    "SET @master_binlog_checksum = @@global.binlog_checksum, "
                    "@source_binlog_checksum = @@global.binlog_checksum"):
            assert isinstance(r.run(sql), CloseConnection), sql
        assert r.one("SELECT @master_binlog_checksum") is None
        r.ok("SET @other = @@global.binlog_checksum")  # any other variable: NULL, as asked


# ---------------------------------------------------------------------------------------------
# HA managers and tools


def test_orchestrator_discovery_queries(mysql_relay):
    r = mysql_relay
    sql = ("select @@global.hostname, ifnull(@@global.report_host,''), @@global.server_id, @@global.version, "
           "@@global.read_only, @@global.binlog_format, @@global.log_bin, @@global.log_slave_updates")
    result = r.run(sql)
    assert result.columns == ["@@global.hostname", "ifnull(@@global.report_host,'')", "@@global.server_id",
                              "@@global.version", "@@global.read_only", "@@global.binlog_format", "@@global.log_bin",
                              "@@global.log_slave_updates"]
    import socket

    # Never connected: the relay does not know its master's binlog_format and says NULL, not a guess.
    assert result.rows == [[socket.gethostname(), "", 100, "8.0.29", 1, None, 1, 1]]
    # what the session fetched at connect
    r.status.master_variables = {"binlog_format": "ROW", "binlog_row_image": "FULL"}
    assert r.run(sql).rows == [[socket.gethostname(), "", 100, "8.0.29", 1, "ROW", 1, 1]]
    assert r.rows("show variables like 'maxscale%'") == []
    gtid = r.run("select @@global.gtid_mode, @@global.server_uuid, @@global.gtid_executed, @@global.gtid_purged, "
                 "@@global.master_info_repository = 'TABLE', @@global.binlog_row_image")
    assert gtid.rows == [["ON", RELAY_UUID, f"{MYSQL_CORPUS_UUID}:1-26", f"{MYSQL_CORPUS_UUID}:1-5", 1, "FULL"]]
    assert gtid.columns[4] == "@@global.master_info_repository = 'TABLE'"
    assert r.rows("show global status like 'Uptime'")[0][0] == "Uptime"
    assert r.rows("show global variables like 'rpl_semi_sync_%'") == [
        ["rpl_semi_sync_master_enabled", "ON"], ["rpl_semi_sync_source_enabled", "ON"]]
    assert r.rows("show global status like 'rpl_semi_sync_%'") == [
        ["Rpl_semi_sync_master_clients", "0"], ["Rpl_semi_sync_master_status", "ON"],
        ["Rpl_semi_sync_replica_status", "OFF"], ["Rpl_semi_sync_slave_status", "OFF"],  # its own upstream: not streaming
        ["Rpl_semi_sync_source_clients", "0"], ["Rpl_semi_sync_source_status", "ON"]]


def test_ripple_style_show_variables_where(mysql_relay):
    r = mysql_relay
    sql = ("SHOW VARIABLES WHERE Variable_Name LIKE 'rpl_semi_sync_master_enabled' OR Variable_name = 'SERVER_ID' "
           "OR Value IN ('nothing')")
    assert r.rows(sql) == [["rpl_semi_sync_master_enabled", "ON"], ["server_id", "100"]]
    assert r.rows("SHOW VARIABLES WHERE Value = 'TABLE'") == [
        ["master_info_repository", "TABLE"], ["relay_log_info_repository", "TABLE"]]
    r.error("SHOW VARIABLES WHERE nonsense = 1", 1054)


def test_semi_sync_off_in_config(tmp_path):
    d = relay_dir_with(tmp_path, {"binlog.000001": mysql_file(GtidSet(), [1], None)})
    with RelayStore.open(d) as store:
        r = Relay(store, d, semi_sync="off")
        assert r.rows("SELECT @@global.rpl_semi_sync_master_enabled, @@global.rpl_semi_sync_source_enabled") == [[0, 0]]
        assert r.rows("SHOW VARIABLES LIKE 'rpl_semi_sync_master_enabled'") == [["rpl_semi_sync_master_enabled", "OFF"]]


def test_show_replica_hosts_from_registrations(mysql_relay):
    r = mysql_relay
    a = r.connect(11, host="10.0.0.21")
    a.registration = ReplicaRegistration(server_id=201, host="replica-a", port=3306)
    a.user_vars["replica_uuid"] = REPLICA_UUID
    b = r.connect(12, host="10.0.0.22")
    b.registration = ReplicaRegistration(server_id=202, host="", port=3307)
    b.user_vars["slave_uuid"] = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    r.connect(13)  # a client that never registered
    replicas = r.run("SHOW REPLICAS")
    assert replicas.columns == ["Server_Id", "Host", "Port", "Source_Id", "Replica_UUID"]
    assert replicas.rows == [[201, "replica-a", 3306, 100, REPLICA_UUID],
                             [202, "", 3307, 100, "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]]
    assert r.run("SHOW REPLICA HOSTS").rows == replicas.rows
    hosts = r.run("SHOW SLAVE HOSTS")
    assert hosts.columns == ["Server_Id", "Host", "Port", "Master_Id", "Slave_UUID"]
    assert hosts.rows == replicas.rows


def test_show_slave_hosts_mariadb(maria_relay):
    r = maria_relay
    c = r.connect(11, host="10.0.0.21")
    c.registration = ReplicaRegistration(server_id=201, host="", port=3306)
    result = r.run("SHOW SLAVE HOSTS")
    assert result.columns == ["Server_id", "Host", "Port", "Master_id"]
    assert result.rows == [[201, "10.0.0.21", 3306, 100]]


def test_show_processlist_shows_dumps(mysql_relay):
    r = mysql_relay
    c = r.connect(11, user="repl", host="10.0.0.21:5555")
    c.dump = DumpProgress(file="binlog.000004", position=4, mode="mysql-gtid", started=time.time() - 30)
    d = r.connect(12)
    d.dump = DumpProgress(file="binlog.000004", position=4, mode="file")
    result = r.run("SHOW FULL PROCESSLIST")
    assert result.columns == ["Id", "User", "Host", "db", "Command", "Time", "State", "Info"]
    rows = {row[0]: row for row in result.rows}
    assert rows[7][4:] == ["Query", 0, "starting", "SHOW FULL PROCESSLIST"]
    assert rows[11][4] == "Binlog Dump GTID" and rows[11][5] >= 29
    assert rows[11][6] == "Source has sent all binlog to replica; waiting for more updates"
    assert rows[12][4] == "Binlog Dump"


# ---------------------------------------------------------------------------------------------
# PURGE BINARY LOGS


@pytest.fixture
def three_files(tmp_path):
    s1 = GtidSet(f"{SID_TEXT}:1-2")
    s2 = GtidSet(f"{SID_TEXT}:1-4")
    s3 = GtidSet(f"{SID_TEXT}:1-6")
    files = {
        "binlog.000001": mysql_file(s1, [3, 4], "binlog.000002"),
        "binlog.000002": mysql_file(s2, [5, 6], "binlog.000003"),
        "binlog.000003": mysql_file(s3, [7], None),
    }
    d = relay_dir_with(tmp_path, files)
    store = RelayStore.open(d)
    relay = Relay(store, d, gtid_mode="mysql", users="repl:secret:admin")  # PURGE needs an admin account
    relay.dir = d
    relay.sizes = {n: len(b) for n, b in files.items()}
    yield relay
    store.close()


def test_purge_to_refuses_files_a_replica_still_reads(three_files):
    r = three_files
    reader = r.connect(21)
    reader.dump = DumpProgress(file="binlog.000002", position=120)
    reader.registration = ReplicaRegistration(server_id=202)
    err = r.error("PURGE BINARY LOGS TO 'binlog.000003'", 1378)
    assert "binlog.000002 is being read by connection 21 (replica server_id 202)" in err.message
    assert "nothing was purged" in err.message and "PURGE BINARY LOGS TO 'binlog.000002'" in err.message
    assert r.store.files() == ["binlog.000001", "binlog.000002", "binlog.000003"]
    assert (r.dir / "binlog.000001").exists()
    # Up to the file in use is fine; the purged set moves with the oldest file.
    assert r.one("SELECT @@gtid_purged") == f"{SID_TEXT}:1-2"
    result = r.ok("PURGE MASTER LOGS TO 'binlog.000002'")
    assert "binlog.000001" in result.info
    assert r.store.files() == ["binlog.000002", "binlog.000003"]
    assert not (r.dir / "binlog.000001").exists()
    assert [row[0] for row in r.rows("SHOW BINARY LOGS")] == ["binlog.000002", "binlog.000003"]
    assert r.one("SELECT @@gtid_purged") == f"{SID_TEXT}:1-4"
    # Once the replica moved on, the rest can go.
    reader.dump.file = "binlog.000003"
    r.ok("PURGE BINARY LOGS TO 'binlog.000003'")
    assert r.store.files() == ["binlog.000003"]
    r.ok("PURGE BINARY LOGS TO 'binlog.000003'")  # nothing before it: a no-op, as on a server


def test_purge_to_unknown_file(three_files):
    err = three_files.error("PURGE BINARY LOGS TO 'binlog.000009'", 1373)
    assert "binlog.000009" in err.message and "binlog.000001 .. binlog.000003" in err.message


def test_purge_before_a_datetime_by_file_age(three_files):
    r = three_files
    now = time.time()
    for name, age_days in (("binlog.000001", 10), ("binlog.000002", 5), ("binlog.000003", 10)):
        t = now - age_days * 86400
        os.utime(r.dir / name, (t, t))
    r.ok("PURGE BINARY LOGS BEFORE NOW() - INTERVAL 7 DAY")
    assert r.store.files() == ["binlog.000002", "binlog.000003"]
    # The current file is never purged, however old.
    r.ok(f"PURGE BINARY LOGS BEFORE '{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now + 3600))}'")
    assert r.store.files() == ["binlog.000003"]
    r.error("PURGE BINARY LOGS BEFORE 'yesterday'", 1210)


def test_purge_before_refuses_a_file_in_use(three_files):
    r = three_files
    reader = r.connect(21)
    reader.dump = DumpProgress(file="binlog.000001", position=4)
    r.error("PURGE BINARY LOGS BEFORE '2999-01-01'", 1378)
    assert r.store.files() == ["binlog.000001", "binlog.000002", "binlog.000003"]


# ---------------------------------------------------------------------------------------------
# Clients and drivers at connect time


def test_command_line_client_queries(mysql_relay):
    r = mysql_relay
    comment = r.run("select @@version_comment limit 1")
    assert comment.columns == ["@@version_comment"] and comment.rows == [["relayproxy 0.1.0 binlog relay"]]
    assert r.rows("SELECT DATABASE()") == [[None]]
    assert r.rows("select DATABASE(), USER() limit 1") == [[None, "repl@10.0.0.9"]]
    # character_set_server is the master's (NULL until the session fetched it); the connection's are the relay's.
    assert r.rows("select @@character_set_client, @@character_set_connection, @@character_set_server, "
                  "@@character_set_database limit 1") == [["utf8mb4", "utf8mb4", None, "utf8mb4"]]
    r.status.master_variables = {"character_set_server": "utf8mb4"}
    assert r.rows("select @@character_set_client, @@character_set_connection, @@character_set_server, "
                  "@@character_set_database limit 1") == [["utf8mb4"] * 4]
    assert r.run("SHOW WARNINGS").columns == ["Level", "Code", "Message"]
    assert r.rows("SHOW WARNINGS LIMIT 10") == [] and r.rows("SHOW ERRORS") == []
    databases = r.run("SHOW DATABASES")
    assert databases.columns == ["Database"] and databases.rows == []
    r.error("USE mysql", 1049)
    assert r.rows("SELECT CURRENT_USER(), CURRENT_USER, CONNECTION_ID(), VERSION()") == [
        ["repl@10.0.0.9", "repl@10.0.0.9", 7, "8.0.29"]]
    assert r.one("SELECT 1") == 1


def test_driver_setup_statements(mysql_relay):
    r = mysql_relay
    # PyMySQL
    r.ok("SET AUTOCOMMIT = 0")
    assert r.one("SELECT @@autocommit") == 0
    r.ok("SET NAMES utf8mb4")
    # mysql-connector-python
    r.ok("SET NAMES 'utf8mb4' COLLATE 'utf8mb4_general_ci'")
    assert r.rows("SELECT @@character_set_client, @@collation_connection") == [["utf8mb4", "utf8mb4_general_ci"]]
    r.ok("SET @@session.autocommit = OFF")
    r.ok("SET @@session.time_zone = '+00:00', @@session.sql_mode = 'TRADITIONAL'")
    assert r.rows("SELECT @@session.time_zone, @@sql_mode, @@global.time_zone") == [["+00:00", "TRADITIONAL", "SYSTEM"]]
    # Connector/J
    sql = ("/* mysql-connector-java-8.0.33 (Revision: x) */SELECT  @@session.auto_increment_increment AS "
           "auto_increment_increment, @@character_set_client AS character_set_client, @@character_set_connection AS "
           "character_set_connection, @@character_set_results AS character_set_results, @@character_set_server AS "
           "character_set_server, @@collation_server AS collation_server, @@collation_connection AS "
           "collation_connection, @@init_connect AS init_connect, @@interactive_timeout AS interactive_timeout, "
           "@@license AS license, @@lower_case_table_names AS lower_case_table_names, @@max_allowed_packet AS "
           "max_allowed_packet, @@net_write_timeout AS net_write_timeout, @@performance_schema AS performance_schema, "
           "@@sql_mode AS sql_mode, @@system_time_zone AS system_time_zone, @@time_zone AS time_zone, "
           "@@transaction_isolation AS transaction_isolation, @@wait_timeout AS wait_timeout")
    assert r.row_dict(sql)["lower_case_table_names"] is None  # the master's, unknown before the first connect
    r.status.master_variables = {"lower_case_table_names": "0", "character_set_server": "latin1"}
    row = r.row_dict(sql)
    assert row["character_set_server"] == "latin1"
    assert list(row)[:3] == ["auto_increment_increment", "character_set_client", "character_set_connection"]
    assert row["license"] == "GPL" and row["init_connect"] == "" and row["performance_schema"] == 0
    assert row["max_allowed_packet"] == 1 << 20 and row["transaction_isolation"] == "REPEATABLE-READ"
    assert row["lower_case_table_names"] == 0 and row["interactive_timeout"] == 28800
    r.ok("SET character_set_results = NULL")
    assert r.one("SELECT @@character_set_results") is None
    r.ok("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    assert r.rows("SELECT @@tx_isolation, @@session.transaction_isolation") == [["READ-COMMITTED"] * 2]
    r.ok("SET SESSION TRANSACTION READ ONLY")
    assert r.one("SELECT @@transaction_read_only") == 1
    for statement in ("BEGIN", "START TRANSACTION", "COMMIT", "ROLLBACK", "commit work", "DO 1"):
        r.ok(statement)
    # The global value is untouched by session assignments; another connection sees the defaults.
    other = r.connect(8)
    assert r.rows("SELECT @@autocommit, @@character_set_client", conn=other) == [[1, "utf8mb4"]]
    r.ok("SET NAMES DEFAULT")
    assert r.one("SELECT @@collation_connection") == "utf8mb4_0900_ai_ci"


def test_python_mysql_replication_connect_queries(mysql_relay, maria_relay):
    r = mysql_relay
    assert r.rows("SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'") == [["binlog_checksum", "CRC32"]]
    r.ok("SET @master_binlog_checksum= @@global.binlog_checksum")
    r.ok(f"SET @slave_uuid = '{REPLICA_UUID}', @replica_uuid = '{REPLICA_UUID}'")
    r.ok("SET @master_heartbeat_period = 1000000000")
    r.ok("SET @mariadb_slave_capability=4")
    # The library tries SHOW BINARY LOG STATUS and falls back to SHOW MASTER STATUS on 1064, as an 8.0 master says.
    r.error("SHOW BINARY LOG STATUS", 1064)
    assert r.rows("SHOW MASTER STATUS")[0][0] == "binlog.000004"
    # An 8.0 server always has binlog_row_metadata; until the session fetched the master's value the relay
    # does not know it: NULL (SHOW prints ''), never MINIMAL, which would make the library ignore column metadata.
    assert r.rows("SHOW VARIABLES LIKE 'BINLOG_ROW_METADATA';") == [["binlog_row_metadata", ""]]
    assert r.one("SELECT @@binlog_row_metadata") is None
    r.status.master_variables = {"binlog_row_metadata": "FULL"}
    assert r.rows("SHOW VARIABLES LIKE 'BINLOG_ROW_METADATA';") == [["binlog_row_metadata", "FULL"]]
    m = maria_relay
    m.ok("SET @slave_connect_state = '1-10-3'")
    m.ok("SET @slave_gtid_strict_mode=1")
    m.ok("SET @slave_gtid_ignore_duplicates=0")
    assert m.conn.user_vars["slave_connect_state"] == "1-10-3"


# ---------------------------------------------------------------------------------------------
# The expression language: column names, literals, operators, functions, variables


def test_column_names_are_the_expression_text_or_alias(mysql_relay):
    r = mysql_relay
    result = r.run("SELECT 1 + 1, 'abc', NULL, -3, 1.5, @@server_id AS `id`, 2 two, 3 'three', IFNULL(NULL,  'x' )")
    assert result.columns == ["1 + 1", "abc", "NULL", "-3", "1.5", "id", "two", "three", "IFNULL(NULL,  'x' )"]
    assert result.rows == [[2, "abc", None, -3, 1.5, 100, 2, 3, "x"]]
    assert r.run("SELECT @@GLOBAL.SERVER_ID FROM DUAL").columns == ["@@GLOBAL.SERVER_ID"]
    empty = r.run("select @@server_id from dual where 1 = 0")
    assert empty.columns == ["@@server_id"] and empty.rows == []


def test_operators_follow_mysql(mysql_relay):
    r = mysql_relay
    assert r.rows("SELECT @@GLOBAL.server_id = '100', 1 = 1, 'a' = 'A', NULL = NULL, NULL <=> NULL, 2 > '10', '2' > '10'") == [
        [1, 1, 1, None, 1, 0, 1]]
    assert r.rows("SELECT 5 / 2, 5 DIV 2, 7 % 3, -7 MOD 3, 1 / 0, -(-3), 'abc' LIKE 'A%', 'a_c' LIKE 'a\\_c', "
                  "3 IN (1, 2, 3), 4 NOT IN (1, NULL), NULL IS NULL, 1 IS NOT NULL, 2 BETWEEN 1 AND 3, "
                  "1 AND NULL, 0 AND NULL, 1 OR NULL, NOT 0, !1, TRUE, FALSE") == [
        [2.5, 2, 1, -1, None, 3, 1, 1, 1, None, 1, 1, 1, None, 0, 1, 1, 0, 1, 0]]
    assert r.rows("SELECT COALESCE(NULL, NULL, 3), IF(1 > 2, 'y', 'n'), NULLIF(1, 1), CONCAT('a', 1, 'b'), "
                  "UPPER('x'), lower('Y')") == [[3, "n", None, "a1b", "X", "y"]]
    moment = r.one("SELECT NOW() - INTERVAL 1 DAY")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", moment)
    assert r.one("SELECT UNIX_TIMESTAMP('2020-01-02 03:04:05')") == int(time.mktime((2020, 1, 2, 3, 4, 5, 0, 0, -1)))
    assert r.rows("SELECT 1 LIMIT 0") == [] and r.rows("SELECT 1 LIMIT 1, 1") == [] and r.rows("SELECT 1 LIMIT 5") == [[1]]
    assert r.rows("SELECT 1 FROM DUAL WHERE @@server_id = 100") == [[1]]
    assert r.rows("SELECT 0x41, 1e3, .5, 'a' 'b', _utf8mb4'x', N'y', 'it''s', \"dq\", 'tab\\there'") == [
        [65, 1000.0, 0.5, "ab", "x", "y", "it's", "dq", "tab\there"]]


def test_user_variables(mysql_relay):
    r = mysql_relay
    assert r.one("SELECT @never_set") is None
    r.ok("SET @A = 1, @b := 'two', @`odd name` = @@global.server_id, @'q' = NULL")
    assert r.conn.user_vars == {"a": 1, "b": "two", "odd name": 100, "q": None}
    assert r.rows("SELECT @a, @B, @`odd name`") == [[1, "two", 100]]
    # Right-hand sides are evaluated before any assignment (as mariadbd does).
    r.ok("SET @x = 5, @y = @x")
    assert r.rows("SELECT @x, @y") == [[5, None]]
    # Nothing is assigned when part of the statement fails.
    r.error("SET @z = 1, @w = @@no_such_variable", 1193)
    assert "z" not in r.conn.user_vars


def test_system_variable_scopes_and_errors(mysql_relay):
    r = mysql_relay
    err = r.error("SELECT @@no_such_variable", 1193)
    assert err.message == "Unknown system variable 'no_such_variable'" and err.sqlstate == "HY000"
    r.error("SELECT @@session.read_only", 1238)
    r.error("SELECT @@global.sql_log_bin", 1238)
    assert r.rows("SELECT @@session.auto_increment_increment, @@local.max_allowed_packet, @@sql_log_bin") == [
        [1, 1 << 20, 1]]
    r.error("SET server_id = 5", 1229)
    r.error("SET SESSION no_such_variable = 1", 1193)
    r.error("SET autocommit = 7", 1231)
    r.error("SET wait_timeout = 'abc'", 1232)
    for statement in ("SET GLOBAL read_only = 0", "SET @@global.server_id = 5", "SET PERSIST max_allowed_packet = 1"):
        err = r.error(statement, 1235)
        assert "SET GLOBAL" in err.message
    r.ok("SET wait_timeout = 60, SESSION net_write_timeout = 600")
    assert r.rows("SELECT @@wait_timeout, @@global.wait_timeout, @@net_write_timeout") == [[60, 28800, 600]]
    r.ok("SET wait_timeout = DEFAULT")
    assert r.one("SELECT @@wait_timeout") == 28800
    assert r.rows("SHOW SESSION VARIABLES LIKE 'net_write_timeout'") == [["net_write_timeout", "600"]]
    assert r.rows("SHOW GLOBAL VARIABLES LIKE 'net_write_timeout'") == [["net_write_timeout", "60"]]
    assert r.rows("SHOW VARIABLES LIKE 'log\\_bin'") == [["log_bin", "ON"]]
    assert r.rows("SHOW VARIABLES LIKE 'read_only'") == [["read_only", "ON"]]
    assert r.rows("SHOW VARIABLES LIKE 'report_host'") == [["report_host", ""]]


def test_every_variable_in_the_table_answers(mysql_relay, maria_relay):
    """Each table entry answers SELECT and SHOW VARIABLES on the flavours where it exists, 1193 elsewhere."""
    for r in (mysql_relay, maria_relay):
        from relayproxy.downstream.sql.env import Env as _Env

        env = _Env(r.ctx, r.conn)
        shown = dict(map(tuple, r.rows("SHOW GLOBAL VARIABLES")))
        session_shown = [row[0] for row in r.rows("SHOW VARIABLES")]
        assert session_shown == sorted(session_shown) and "sql_log_bin" in session_shown
        assert "sql_log_bin" not in shown  # session-only
        for var in SYSTEM_VARIABLES:
            scope = "@@global." if var.has_global else "@@"
            if var.exists(env):
                value = r.one(f"SELECT {scope}{var.name}")
                assert value is None or isinstance(value, (str, int, float)), var.name
                if var.has_global:
                    assert var.name in shown, var.name
            else:
                r.error(f"SELECT {scope}{var.name}", 1193)
                assert var.name not in shown


# ---------------------------------------------------------------------------------------------
# Lexical rules and refusals


def test_comments_case_backticks_and_semicolons(mysql_relay):
    r = mysql_relay
    assert r.one("/* leading */ select @@SERVER_ID -- trailing") == 100
    assert r.one("SELECT @@server_id # hash comment") == 100
    assert r.one("SELECT @@server_id;") == 100
    assert r.one("  sElEcT   @@Server_Id  ;  ") == 100
    assert r.one("SELECT @@`server_id`") == 100
    assert r.one("SELECT @@global.`server_id`") == 100
    assert r.one("SELECT 1--1") == 2  # "--" without a space is two minus signs
    r.ok("/*!40101 SET NAMES utf8 */")
    assert r.one("SELECT @@character_set_client") == "utf8"
    r.ok("/*!40103 SET @OLD_TIME_ZONE=@@TIME_ZONE */;")
    assert r.conn.user_vars["old_time_zone"] == "SYSTEM"
    assert [t.kind for t in tokenize("SELECT /*+ hint */ `a``b`, @x, @@global.y")] == [
        "word", "qident", "op", "uservar", "op", "sysvar", "eof"]


@pytest.mark.parametrize("sql, fragment", [
    ("CREATE TABLE t (a INT)", "'CREATE TABLE'"),
    ("INSERT INTO t VALUES (1)", "'INSERT INTO'"),
    ("FLUSH LOGS", "'FLUSH LOGS'"),
    ("RESET MASTER", "'RESET MASTER'"),
    ("SHOW TABLES", "'SHOW TABLES'"),
    ("SHOW ENGINES", "'SHOW ENGINES'"),
    ("SELECT * FROM information_schema.processlist", "reading tables"),
    ("SELECT user FROM mysql.user", "SELECT ... FROM mysql.user"),
    ("SELECT COUNT(*) FROM information_schema.processlist WHERE command = 'Binlog Dump'", "reading tables"),
    ("SELECT 1 UNION SELECT 2", "SELECT ... UNION"),
    ("SELECT (SELECT 1)", "subqueries"),
    ("SET PASSWORD = 'x'", "'SET PASSWORD'"),
    ("ROLLBACK TO SAVEPOINT a", "savepoints"),
])
def test_unsupported_statements_are_refused_by_name(mysql_relay, sql, fragment):
    err = mysql_relay.error(sql, 1235)
    assert fragment in err.message and err.sqlstate == "42000"


@pytest.mark.parametrize("sql", ["SELEC 1", "SELECT 'unterminated", "SELECT 1 +", "SHOW MASTER", "SET @a",
                                 "SELECT @@", "PURGE BINARY LOGS TO", "SELECT 1 2 3"])
def test_malformed_statements_get_a_syntax_error(mysql_relay, sql):
    err = mysql_relay.error(sql, 1064)
    assert err.sqlstate == "42000" and "near '" in err.message


def test_other_errors(mysql_relay):
    r = mysql_relay
    r.error("", 1065)
    r.error("  ;  ", 1065)
    r.error("-- only a comment", 1065)
    r.error("SELECT *", 1096)
    r.error("SELECT no_column", 1054)
    err = r.error("SELECT no_such_function(1)", 1305)
    assert "no_such_function" in err.message and "IFNULL" in err.message
    r.error("SELECT IFNULL(1)", 1582)
    err = r.error("SELECT 1; SELECT 2", 1064)
    assert "one statement per query" in err.message


def test_an_internal_failure_is_an_error_not_a_crash(mysql_relay, monkeypatch):
    r = mysql_relay

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(r.ctx, "status_document", broken)
    err = r.error("SHOW SLAVE STATUS", 1105)
    assert "SHOW SLAVE STATUS" in err.message and "disk on fire" in err.message
    assert r.one("SELECT 1") == 1


# ---------------------------------------------------------------------------------------------
# Parity with a real mariadbd: the same statements, the same column names, values and error codes

PARITY_VALUES = [
    "SELECT 1 + 1, 'abc', NULL, -3, @@server_id AS `id`, 2 two, 3 'three', IFNULL(NULL,  'x' )",
    "SELECT 1 = 1, 'a' = 'A', NULL = NULL, NULL <=> NULL, 2 > '10', '2' > '10', 'b ' = 'b'",
    "SELECT 5 DIV 2, 7 % 3, -7 MOD 3, -(-3), 'abc' LIKE 'A%', 'a_c' LIKE 'a\\_c', 3 IN (1,2,3), 4 NOT IN (1, NULL)",
    "SELECT NULL IS NULL, 1 IS NOT NULL, 2 BETWEEN 1 AND 3, 1 AND NULL, 0 AND NULL, 1 OR NULL, NOT 0, !1, TRUE, FALSE",
    "SELECT COALESCE(NULL, NULL, 3), IF(1 > 2, 'y', 'n'), NULLIF(1, 1), CONCAT('a', 1, 'b'), UPPER('x'), lower('Y')",
    "SELECT 'a' 'b', _utf8mb4'x', 'it''s', \"dq\", 1--1",
    "SELECT @unset, DATABASE(), CONNECTION_ID() = CONNECTION_ID()",
    "SELECT 1 LIMIT 0",
    "SELECT 1 FROM DUAL WHERE 1 = 0",
    "select @@server_id limit 1",
    "/* c */ SELECT @@GLOBAL.SERVER_ID -- x",
    "SELECT @@SESSION.auto_increment_increment, @@autocommit, @@global.autocommit, @@skip_replication",
    "SELECT @@global.gtid_slave_pos = '', @@lower_case_table_names, @@license",
    "SHOW VARIABLES LIKE 'SERVER_ID'",
    "SHOW VARIABLES LIKE 'maxscale%'",
    "SHOW VARIABLES LIKE 'server_uuid'",
    "SHOW VARIABLES WHERE Variable_name LIKE 'rpl_semi_sync_master_enabled' OR Variable_name = 'server_id'",
    "SHOW WARNINGS",
]
PARITY_COLUMNS = [
    "select @@global.hostname, ifnull(@@global.report_host,''), @@global.server_id, @@global.version, "
    "@@global.read_only, @@global.binlog_format, @@global.log_bin, @@global.log_slave_updates",
    "SELECT UNIX_TIMESTAMP()", "SELECT NOW() - INTERVAL 1 DAY", "SELECT VERSION(), USER(), CURRENT_USER()",
    "SELECT @@gtid_binlog_pos, @@gtid_binlog_state, @@gtid_current_pos, @@gtid_slave_pos, @@gtid_domain_id",
    "SELECT BINLOG_GTID_POS('x', 4)", "select @@version_comment limit 1",
    "SHOW MASTER STATUS", "SHOW BINARY LOGS", "SHOW SLAVE STATUS", "SHOW REPLICA STATUS", "SHOW ALL SLAVES STATUS",
    "SHOW SLAVE HOSTS", "SHOW PROCESSLIST", "SHOW STATUS LIKE 'Uptime'", "SHOW GLOBAL VARIABLES LIKE 'gtid_binlog_pos'",
]
PARITY_ERRORS = [
    "SELECT @@nonexistent_var", "SELECT @@session.gtid_binlog_pos", "SELECT @@global.skip_replication",
    "SELECT @@session.read_only", "SELECT *", "SELECT foo", "SELECT nosuchfunc()", "SELEC 1",
    "PURGE BINARY LOGS TO 'nonexistent'", "SET SESSION foo_bar=1", "SELECT @@gtid_mode", "SELECT @@server_uuid",
    "SELECT @@rpl_semi_sync_source_enabled", "SELECT IFNULL(1)", "", "SET autocommit = 7",
]
PARITY_SESSION = [
    "SET @a = 1, @b = @a + 1, @C = 'x'", "SELECT @a, @b, @c, @A",
    "SET @master_binlog_checksum= @@global.binlog_checksum", "SELECT @master_binlog_checksum",
    "SET NAMES latin1", "SELECT @@character_set_client, @@collation_connection, @@character_set_results",
    "SET NAMES DEFAULT", "SELECT @@character_set_client, @@character_set_results",
    "SET character_set_results = NULL", "SELECT @@character_set_results",
    "SET autocommit=OFF, @@session.wait_timeout=100", "SELECT @@autocommit, @@wait_timeout, @@global.wait_timeout",
    "SET skip_replication=1", "SELECT @@skip_replication",
]


def test_parity_with_a_real_mariadbd(mariadb, maria_relay):
    import pymysql

    server = mariadb(server_id=1)
    version = server.execute("SELECT @@version")[0][0]
    r = maria_relay
    r.status.master_server_version = version
    # What the upstream session fetches at connect (relayproxy/relay/master_variables.py), from this server.
    values, absent = {}, []
    for name in MASTER_VARIABLES:
        try:
            values[name] = server.execute(f"SELECT @@GLOBAL.{name}")[0][0]
        except pymysql.MySQLError:
            absent.append(name)
    r.status.master_variables = {k: None if v is None else str(v) for k, v in values.items()}
    r.status.master_variables_source = {"absent": absent}
    r.cfg.values["server_id"] = 1
    r.cfg.values["semi_sync"] = False
    real = server.connect()

    def on_server(sql):
        with real.cursor() as cur:
            try:
                cur.execute(sql)
            except pymysql.MySQLError as exc:
                return ("error", exc.args[0])
            return ([d[0] for d in cur.description or []], [list(row) for row in cur.fetchall()])

    def on_relay(sql):
        result = r.run(sql)
        if isinstance(result, ErrorResponse):
            return ("error", result.code)
        if isinstance(result, OkResponse):
            return ([], [])
        return (list(result.columns), [list(row) for row in result.rows])

    for sql in PARITY_VALUES + PARITY_SESSION:
        assert on_relay(sql) == on_server(sql), sql
    for sql in PARITY_COLUMNS:
        assert on_relay(sql)[0] == on_server(sql)[0], sql
    for sql in PARITY_ERRORS:
        expected = on_server(sql)
        assert expected[0] == "error", sql
        assert on_relay(sql) == expected, sql


# ---------------------------------------------------------------------------------------------
# The coroutine the server awaits


def test_async_execute_answers_like_execute_sync(mysql_relay):
    import asyncio

    r = mysql_relay

    async def run_all():
        out = []
        for sql in ("SELECT @@GLOBAL.SERVER_ID", "SET @a = 5", "SELECT @a", "SELECT @@gtid_purged",
                    "SHOW VARIABLES LIKE 'gtid_purged'", "SELECT @@nope", "SELECT 'unterminated"):
            out.append(await execute(r.ctx, r.conn, sql))
        return out

    results = asyncio.run(run_all())
    assert [type(x).__name__ for x in results] == ["ResultSet", "OkResponse", "ResultSet", "ResultSet", "ResultSet",
                                                   "ErrorResponse", "ErrorResponse"]
    assert results[2].rows == [[5]]
    assert results[3].rows == [[f"{MYSQL_CORPUS_UUID}:1-5"]]
    assert (results[5].code, results[6].code) == (1193, 1064)


def test_async_execute_scans_for_binlog_gtid_pos_off_the_event_loop(maria_relay, corpus_dir, monkeypatch):
    import asyncio
    import threading

    from relayproxy.downstream.sql import dispatch, functions

    r = maria_relay
    size = (corpus_dir / MARIA_CORPUS_DIR / MARIA_FILES[1]).stat().st_size
    threads = []
    real = functions.gtids_at

    def recording(path, position):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(path, position)

    monkeypatch.setattr(dispatch, "gtids_at", recording)  # prefetched in a worker thread
    monkeypatch.setattr(functions, "gtids_at", recording)  # computed inline
    answer = asyncio.run(execute(r.ctx, r.conn, f"SELECT binlog_gtid_pos('{MARIA_FILES[1]}',{size})"))
    assert answer.rows == [["1-10-12"]]
    assert threads == [False]  # scanned once, in a worker thread, not again on the loop
    threads.clear()
    answer = asyncio.run(execute(r.ctx, r.conn, f"SELECT binlog_gtid_pos('{MARIA_FILES[1]}', {size} - 1)"))
    assert answer.rows == [[None]] and threads == [True]  # not a literal: computed inline
