"""The status statements: SHOW VARIABLES / STATUS, SHOW MASTER STATUS, SHOW BINARY LOGS, SHOW SLAVE|REPLICA
STATUS, SHOW ALL SLAVES STATUS, SHOW SLAVE HOSTS / REPLICAS, SHOW PROCESSLIST and friends, all cut at the
horizon."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ...binlog.gtid import GtidSet, MariaBinlogState
from ...relay import closed_files
from ...relay.catalog import CatalogError
from ...wire.results import Response, ResultSet
from .. import privileges
from .binlog_events import DEFAULT_MAX_ROWS, parse_show_binlog_events, read_binlog_events, resolve
from ...wire.errors import (
    ER_NONEXISTING_GRANT,
    ER_REPLICA_CHANNEL_DOES_NOT_EXIST,
    ER_UNKNOWN_ERROR,
    WARN_NO_MASTER_INFO,
)
from .errors import SqlError, unsupported
from .expressions import Evaluator, Node
from .parser import Parser, parse_limit, syntax_error
from .replay import show_replay_stops
from .transactions import run_show_relayproxy
from .values import output_value, to_text, truthy, like_match
from .variables import STATUS_VARIABLES, SYSTEM_VARIABLES, SysVar, gtid_executed_value

if TYPE_CHECKING:
    from .env import Env

# -- SHOW ----------------------------------------------------------------------------------------


def run_show(p: Parser, env: Env) -> Response:
    p.expect_word("SHOW")
    scope = p.accept_word("GLOBAL", "SESSION", "LOCAL")
    if p.accept_word("VARIABLES"):
        return _show_variables(p, env, "global" if scope == "GLOBAL" else "session")
    if p.accept_word("STATUS"):
        return _show_status(p, env)
    if scope is not None:
        what = p.cur.value.upper() if p.cur.kind == "word" else p.sql[p.cur.start:p.cur.start + 20]
        raise unsupported(f"'SHOW {scope} {what}'")
    full = p.accept_word("FULL") is not None
    if p.accept_word("PROCESSLIST"):
        p.end_of_statement()
        return _show_processlist(env, full)
    if p.accept_word("MASTER"):
        if p.accept_word("STATUS"):
            p.end_of_statement()
            return _show_master_status(env)
        p.expect_word("LOGS")
        p.end_of_statement()
        return _show_binary_logs(env)
    if p.is_word("BINLOG") and p.is_word("EVENTS", offset=1):
        return show_binlog_events_sync(p, env)
    if p.is_word("RELAYPROXY") and p.is_word("REPLAY", offset=1):
        return show_replay_stops(p, env)
    if p.is_word("RELAYPROXY"):
        return run_show_relayproxy(p, env)
    if p.is_word("BINLOG") and env.flavour == "mariadb":
        # MariaDB 10.5.2+'s name for SHOW MASTER STATUS.
        start = p.cur.start
        p.advance()
        if not p.accept_word("STATUS"):
            raise syntax_error(p.sql, start, env.flavour)
        p.end_of_statement()
        return _show_master_status(env)
    if p.accept_word("BINARY"):
        if p.is_word("LOG"):
            start = p.cur.start
            p.advance()
            p.expect_word("STATUS")
            p.end_of_statement()
            if env.flavour == "mariadb" or not env.at_least(8, 2, 0):
                # SHOW BINARY LOG STATUS exists from MySQL 8.2 only: older servers and MariaDB say 1064,
                # which is what makes tools fall back to SHOW MASTER STATUS.
                raise syntax_error(p.sql, start, env.flavour)
            return _show_master_status(env)
        p.expect_word("LOGS")
        p.end_of_statement()
        return _show_binary_logs(env)
    if p.is_word("SLAVE", "REPLICA"):
        new_names = p.advance().value.upper() == "REPLICA"
        if p.accept_word("HOSTS"):
            p.end_of_statement()
            return _show_replica_hosts(env, new_names)
        if p.cur.kind == "string":  # MariaDB: SHOW SLAVE 'connection_name' STATUS
            _check_connection_name(p.string())
        p.expect_word("STATUS")
        if p.accept_word("FOR"):
            p.expect_word("CHANNEL")
            channel = p.name()
            if channel:
                raise SqlError(ER_REPLICA_CHANNEL_DOES_NOT_EXIST, "HY000",
                               f"Replication channel '{channel}' does not exist.")
        p.end_of_statement()
        return _show_replica_status(env, new_names=new_names, all_connections=False)
    if p.accept_word("REPLICAS"):
        p.end_of_statement()
        return _show_replica_hosts(env, True)
    if p.accept_word("ALL"):
        if env.mysql:
            raise p.error()  # MySQL has no SHOW ALL SLAVES STATUS; tools try it and fall back on 1064
        p.expect_word("SLAVES", "REPLICAS")
        p.expect_word("STATUS")
        p.end_of_statement()
        return _show_replica_status(env, new_names=False, all_connections=True)
    if p.accept_word("GRANTS"):
        return _show_grants(p, env)
    if p.accept_word("WARNINGS", "ERRORS"):
        parse_limit(p)
        p.end_of_statement()
        return ResultSet(["Level", "Code", "Message"], [])
    if p.accept_word("DATABASES", "SCHEMAS"):
        if p.accept_word("LIKE"):
            p.expr()
        p.end_of_statement()
        return ResultSet(["Database"], [])  # the relay holds no schemas
    what = p.cur.value.upper() if p.cur.kind == "word" else p.sql[p.cur.start:p.cur.start + 20]
    raise unsupported(f"'SHOW {'FULL ' if full else ''}{what}'")


def _show_grants(p: Parser, env: Env) -> ResultSet:
    """SHOW GRANTS [FOR CURRENT_USER[()] | FOR 'user'@'host']: the account's relay privileges as the servers'
    GRANT statement (USAGE when it has none). Another account's grants need admin, as the servers' need
    SELECT on the mysql schema."""
    conn = env.conn
    account = privileges.account_of(env.ctx, conn)
    user, host = conn.user, account.host if account is not None else "%"
    if p.accept_word("FOR"):
        if p.accept_word("CURRENT_USER"):
            if p.accept_op("("):
                p.expect_op(")")
        else:
            name = p.string() if p.cur.kind == "string" else p.name()
            pattern = "%"
            if p.cur.kind == "op" and p.cur.value == "@":
                p.advance()
                pattern = p.string() if p.cur.kind == "string" else p.name()
            elif p.cur.kind == "uservar":  # 'user'@'host' without spaces tokenizes the host as a user variable
                pattern = str(p.advance().value).strip("'\"`")
            if (name, pattern) != (user, host):
                env.require(privileges.SHOW_OTHER_GRANTS)
                users = env.ctx.settings.users
                account = next((u for u in users if u.name == name and u.host.lower() == pattern.lower()), None)
                if account is None:
                    raise SqlError(ER_NONEXISTING_GRANT, "42000",
                                   f"There is no such grant defined for user '{name}' on host '{pattern}'")
                user, host = name, pattern
    p.end_of_statement()
    return ResultSet([f"Grants for {user}@{host}"],
                     [[privileges.grant_statement(account, user, host, env.flavour)]])


def prepare_binlog_events(p: Parser, env: Env):
    """SHOW BINLOG EVENTS parsed, its privilege checked, its file found: (path, name, size, request, max_rows)."""
    p.expect_word("BINLOG")
    p.expect_word("EVENTS")
    request = parse_show_binlog_events(p)
    env.require(privileges.SHOW_BINLOG_EVENTS)
    name, path, size = resolve(env, request, _catalog_files(env))
    max_rows = int(env.ctx.settings.show_binlog_events_max_rows or DEFAULT_MAX_ROWS)
    return path, name, size, request, max_rows


def show_binlog_events_sync(p: Parser, env: Env) -> ResultSet:
    """SHOW BINLOG EVENTS on the caller's thread (execute_sync; ``execute`` reads in a worker thread instead)."""
    path, name, size, request, max_rows = prepare_binlog_events(p, env)
    return read_binlog_events(path, name, size, request, flavour=env.flavour, max_rows=max_rows)


def _check_connection_name(name: str) -> None:
    if name:
        raise SqlError(WARN_NO_MASTER_INFO, "HY000", f"There is no master connection '{name}'")


def _filtered(p: Parser, env: Env, rows: Iterable[tuple[str, Callable[[], str]]]) -> ResultSet:
    """Rows of (name, value thunk) under SHOW's optional LIKE / WHERE; values computed only for kept names."""
    like: Node | None = None
    where: Node | None = None
    if p.accept_word("LIKE"):
        like = p.expr()
    elif p.accept_word("WHERE"):
        where = p.expr()
    p.end_of_statement()
    ev = Evaluator(env)
    pattern = None
    if like is not None:
        value = like.eval(ev)
        pattern = to_text(value) if value is not None else None
        if pattern is None:
            return ResultSet(["Variable_name", "Value"], [])
    out = []
    for name, thunk in sorted(rows, key=lambda r: r[0].lower()):
        if pattern is not None and not like_match(name, pattern, budget=ev.budget):
            continue
        value = thunk()
        if where is not None:
            keep = where.eval(Evaluator(env, {"variable_name": name, "value": value}))
            if keep is None or not truthy(keep):
                continue
        out.append([name, value])
    return ResultSet(["Variable_name", "Value"], out)


def _show_variables(p: Parser, env: Env, scope: str) -> ResultSet:
    session = env.conn.session_vars
    rows: list[tuple[str, Callable[[], str]]] = []
    for var in SYSTEM_VARIABLES:
        if not var.exists(env) or (scope == "global" and not var.has_global):
            continue

        def thunk(var: SysVar = var) -> str:
            if scope == "session" and var.has_session and var.name in session:
                return var.show_value(session[var.name])
            return var.show_value(var.value(env))

        rows.append((var.name, thunk))
    return _filtered(p, env, rows)


def _show_status(p: Parser, env: Env) -> ResultSet:
    rows = [(s.name, (lambda s=s: str(output_value(s.value(env))))) for s in STATUS_VARIABLES if s.exists(env)]
    return _filtered(p, env, rows)


def _show_master_status(env: Env) -> ResultSet:
    """File and Position are the horizon: the end of the last complete, durable transaction."""
    env.require(privileges.SHOW_BINARY_LOGS)
    columns = ["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB"]
    if env.mysql:
        columns.append("Executed_Gtid_Set")  # MariaDB's SHOW MASTER STATUS has no GTID column
    snap = env.snapshot
    if snap.file is None:
        return ResultSet(columns, [])
    row: list[Any] = [snap.file, snap.position, "", ""]
    if env.mysql:
        row.append(gtid_executed_value(env))
    return ResultSet(columns, [row])


def _catalog_files(env: Env):
    try:
        return env.catalog.files()
    except CatalogError as exc:
        raise SqlError(ER_UNKNOWN_ERROR, "HY000", f"cannot list the relay files: {exc}") from None


def _show_binary_logs(env: Env) -> ResultSet:
    """Relay files with their durable sizes (the current file only up to the horizon)."""
    env.require(privileges.SHOW_BINARY_LOGS)
    encrypted = env.mysql and env.at_least(8, 0, 14)
    columns = ["Log_name", "File_size"] + (["Encrypted"] if encrypted else [])
    rows = [[f.name, f.size] + (["No"] if encrypted else []) for f in _catalog_files(env)]
    return ResultSet(columns, rows)


def _show_replica_hosts(env: Env, new_names: bool) -> ResultSet:
    """Replicas that registered with COM_REGISTER_SLAVE, in MySQL's or MariaDB's columns."""
    if not env.mysql:
        columns = ["Server_id", "Host", "Port", "Master_id"]
    elif new_names:
        columns = ["Server_Id", "Host", "Port", "Source_Id", "Replica_UUID"]
    elif env.at_least(8, 0, 0):
        columns = ["Server_Id", "Host", "Port", "Master_Id", "Slave_UUID"]
    else:
        columns = ["Server_id", "Host", "Port", "Master_id", "Slave_UUID"]
    rows = []
    for conn in sorted(env.ctx.connections.values(), key=lambda c: c.conn_id):
        reg = conn.registration
        if reg is None:
            continue
        host = reg.host or ("" if env.mysql else conn.host)  # MariaDB shows the client address without report_host
        row: list[Any] = [reg.server_id, host, reg.port, env.ctx.server_id]
        if env.mysql:
            row.append(str(conn.user_vars.get("replica_uuid") or conn.user_vars.get("slave_uuid") or ""))
        rows.append(row)
    return ResultSet(columns, rows)


def _show_processlist(env: Env, full: bool) -> ResultSet:
    columns = ["Id", "User", "Host", "db", "Command", "Time", "State", "Info"]
    if not env.mysql:
        columns.append("Progress")
    if env.mysql and env.at_least(8, 0, 26):
        dump_state = "Source has sent all binlog to replica; waiting for more updates"
    else:
        dump_state = "Master has sent all binlog to slave; waiting for more updates"
    rows = []
    for conn in sorted(env.ctx.connections.values(), key=lambda c: c.conn_id):
        if conn.dump is not None:
            command = "Binlog Dump GTID" if conn.dump.mode == "mysql-gtid" else "Binlog Dump"
            since, state, info = conn.dump.started, dump_state, None
        elif conn is env.conn:
            command, since, state, info = "Query", env.now, "starting", "SHOW FULL PROCESSLIST" if full else "SHOW PROCESSLIST"
        else:
            command, since, state, info = "Sleep", conn.connected_at, "", None
        row: list[Any] = [conn.conn_id, conn.user, conn.host, conn.database, command,
                          max(int(env.now - since), 0), state, info]
        if not env.mysql:
            row.append(0.0)
        rows.append(row)
    return ResultSet(columns, rows)


# SHOW REPLICA STATUS columns in MySQL's order: (8.0.22+ name, pre-8.0.22 name or None, value key, since).
# From mysql-server sql/rpl_replica.cc show_slave_status_metadata(); SHOW SLAVE STATUS renames the
# Source/Replica terms back (rename_fields_use_old_replica_source_terms).
_MYSQL_REPLICA_COLUMNS: tuple[tuple[str, str | None, str, tuple[int, ...]], ...] = (
    ("Replica_IO_State", "Slave_IO_State", "io_state", ()),
    ("Source_Host", "Master_Host", "host", ()),
    ("Source_User", "Master_User", "user", ()),
    ("Source_Port", "Master_Port", "port", ()),
    ("Connect_Retry", None, "connect_retry", ()),
    ("Source_Log_File", "Master_Log_File", "log_file", ()),
    ("Read_Source_Log_Pos", "Read_Master_Log_Pos", "log_pos", ()),
    ("Relay_Log_File", None, "log_file", ()),
    ("Relay_Log_Pos", None, "log_pos", ()),
    ("Relay_Source_Log_File", "Relay_Master_Log_File", "log_file", ()),
    ("Replica_IO_Running", "Slave_IO_Running", "io_running", ()),
    ("Replica_SQL_Running", "Slave_SQL_Running", "sql_running", ()),
    ("Replicate_Do_DB", None, "empty", ()),
    ("Replicate_Ignore_DB", None, "empty", ()),
    ("Replicate_Do_Table", None, "empty", ()),
    ("Replicate_Ignore_Table", None, "empty", ()),
    ("Replicate_Wild_Do_Table", None, "empty", ()),
    ("Replicate_Wild_Ignore_Table", None, "empty", ()),
    ("Last_Errno", None, "zero", ()),
    ("Last_Error", None, "empty", ()),
    ("Skip_Counter", None, "zero", ()),
    ("Exec_Source_Log_Pos", "Exec_Master_Log_Pos", "log_pos", ()),
    ("Relay_Log_Space", None, "relay_space", ()),
    ("Until_Condition", None, "until_none", ()),
    ("Until_Log_File", None, "empty", ()),
    ("Until_Log_Pos", None, "zero", ()),
    ("Source_SSL_Allowed", "Master_SSL_Allowed", "ssl_allowed", ()),
    ("Source_SSL_CA_File", "Master_SSL_CA_File", "ssl_ca", ()),
    ("Source_SSL_CA_Path", "Master_SSL_CA_Path", "empty", ()),
    ("Source_SSL_Cert", "Master_SSL_Cert", "ssl_cert", ()),
    ("Source_SSL_Cipher", "Master_SSL_Cipher", "empty", ()),
    ("Source_SSL_Key", "Master_SSL_Key", "ssl_key", ()),
    ("Seconds_Behind_Source", "Seconds_Behind_Master", "seconds_behind", ()),
    ("Source_SSL_Verify_Server_Cert", "Master_SSL_Verify_Server_Cert", "ssl_verify", ()),
    ("Last_IO_Errno", None, "io_errno", ()),
    ("Last_IO_Error", None, "io_error", ()),
    ("Last_SQL_Errno", None, "zero", ()),
    ("Last_SQL_Error", None, "empty", ()),
    ("Replicate_Ignore_Server_Ids", None, "empty", ()),
    ("Source_Server_Id", "Master_Server_Id", "master_server_id", ()),
    ("Source_UUID", "Master_UUID", "master_uuid", ()),
    ("Source_Info_File", "Master_Info_File", "info_file", ()),
    ("SQL_Delay", None, "zero", ()),
    ("SQL_Remaining_Delay", None, "null", ()),
    ("Replica_SQL_Running_State", "Slave_SQL_Running_State", "sql_state", ()),
    ("Source_Retry_Count", "Master_Retry_Count", "retry_count", ()),
    ("Source_Bind", "Master_Bind", "empty", ()),
    ("Last_IO_Error_Timestamp", None, "io_error_time", ()),
    ("Last_SQL_Error_Timestamp", None, "empty", ()),
    ("Source_SSL_Crl", "Master_SSL_Crl", "empty", ()),
    ("Source_SSL_Crlpath", "Master_SSL_Crlpath", "empty", ()),
    ("Retrieved_Gtid_Set", None, "gtid_set", ()),
    ("Executed_Gtid_Set", None, "gtid_set", ()),
    ("Auto_Position", None, "auto_position", ()),
    ("Replicate_Rewrite_DB", None, "empty", (5, 7, 0)),
    ("Channel_Name", None, "empty", (5, 7, 0)),
    ("Source_TLS_Version", "Master_TLS_Version", "empty", (5, 7, 10)),
    ("Source_public_key_path", "Master_public_key_path", "empty", (8, 0, 4)),
    ("Get_Source_public_key", "Get_master_public_key", "zero", (8, 0, 4)),
    ("Network_Namespace", None, "empty", (8, 0, 22)),
)

# MariaDB's SHOW SLAVE STATUS (and SHOW REPLICA STATUS: same names), as mariadbd 10.11 sends it.
_MARIADB_REPLICA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Slave_IO_State", "io_state"), ("Master_Host", "host"), ("Master_User", "user"), ("Master_Port", "port"),
    ("Connect_Retry", "connect_retry"), ("Master_Log_File", "log_file"), ("Read_Master_Log_Pos", "log_pos"),
    ("Relay_Log_File", "log_file"), ("Relay_Log_Pos", "log_pos"), ("Relay_Master_Log_File", "log_file"),
    ("Slave_IO_Running", "io_running"), ("Slave_SQL_Running", "sql_running"), ("Replicate_Do_DB", "empty"),
    ("Replicate_Ignore_DB", "empty"), ("Replicate_Do_Table", "empty"), ("Replicate_Ignore_Table", "empty"),
    ("Replicate_Wild_Do_Table", "empty"), ("Replicate_Wild_Ignore_Table", "empty"), ("Last_Errno", "zero"),
    ("Last_Error", "empty"), ("Skip_Counter", "zero"), ("Exec_Master_Log_Pos", "log_pos"),
    ("Relay_Log_Space", "relay_space"), ("Until_Condition", "until_none"), ("Until_Log_File", "empty"),
    ("Until_Log_Pos", "zero"), ("Master_SSL_Allowed", "ssl_allowed"), ("Master_SSL_CA_File", "ssl_ca"),
    ("Master_SSL_CA_Path", "empty"), ("Master_SSL_Cert", "ssl_cert"), ("Master_SSL_Cipher", "empty"),
    ("Master_SSL_Key", "ssl_key"), ("Seconds_Behind_Master", "seconds_behind"),
    ("Master_SSL_Verify_Server_Cert", "ssl_verify"), ("Last_IO_Errno", "io_errno"), ("Last_IO_Error", "io_error"),
    ("Last_SQL_Errno", "zero"), ("Last_SQL_Error", "empty"), ("Replicate_Ignore_Server_Ids", "empty"),
    ("Master_Server_Id", "master_server_id"), ("Master_SSL_Crl", "empty"), ("Master_SSL_Crlpath", "empty"),
    ("Using_Gtid", "using_gtid"), ("Gtid_IO_Pos", "gtid_io_pos"), ("Replicate_Do_Domain_Ids", "empty"),
    ("Replicate_Ignore_Domain_Ids", "empty"), ("Parallel_Mode", "parallel_mode"), ("SQL_Delay", "zero"),
    ("SQL_Remaining_Delay", "null"), ("Slave_SQL_Running_State", "sql_state"), ("Slave_DDL_Groups", "zero"),
    ("Slave_Non_Transactional_Groups", "zero"), ("Slave_Transactional_Groups", "zero"),
    ("Replicate_Rewrite_DB", "empty"),
)
_MARIADB_ALL_PREFIX = (("Connection_name", "empty"), ("Slave_SQL_State", "sql_state"))
_MARIADB_ALL_SUFFIX = (
    ("Retried_transactions", "zero"), ("Max_relay_log_size", "max_relay_log_size"), ("Executed_log_entries", "zero"),
    ("Slave_received_heartbeats", "heartbeats"), ("Slave_heartbeat_period", "heartbeat_period"),
    ("Gtid_Slave_Pos", "empty"),
)

_MASTER_ERROR_RE = re.compile(r"error (\d+) from master")


def _replica_values(env: Env, *, new_terms: bool) -> dict[str, Any]:
    """The relay's own IO-thread status, horizon-based.

    Read_Master_Log_Pos = Exec_Master_Log_Pos = the horizon: everything the relay advertises is a
    complete, durable transaction, so what it "read" is what it "executed" (a tool waiting for
    Read == Exec never waits on a half-received transaction). Slave_SQL_Running is No: a relay applies
    nothing, it has no SQL thread.
    """
    ctx = env.ctx
    cfg = ctx.settings
    st = ctx.status_document()
    up = ctx.relay.master
    state = st.get("state") or ""
    if st["io_running"]:
        io_running = "Yes"
        io_state = "Waiting for source to send event" if new_terms else "Waiting for master to send event"
    elif state in ("stopped", "stopped by STOP SLAVE"):
        io_running, io_state = "No", ""
    else:
        io_running = "Connecting"
        io_state = "Connecting to source" if new_terms else "Connecting to master"
    error = st.get("last_io_error") or ""
    errno = 0
    if error:
        m = _MASTER_ERROR_RE.search(error)
        # The master's own code; else the session's (1593 for a master the relay refuses); else CR_SERVER_LOST.
        errno = int(m.group(1)) if m else int(st.get("last_io_errno") or 2013)
    error_time = st.get("last_io_error_time")
    gtids = env.snapshot.gtids
    if isinstance(gtids, GtidSet):
        gtid_text = gtids.format(",\n")
    else:
        gtid_text = ""
    try:
        relay_space = sum(f.size for f in env.catalog.files())
    except CatalogError:
        relay_space = sum(_stored_size(ctx.store.path(n)) for n in ctx.store.files())
    # The master in force (CHANGE MASTER's choice or the configuration), else the configuration (serve).
    master = st.get("master") or {}
    ssl_mode = master.get("ssl_mode") or cfg.ssl_mode or "disabled"
    gtid_mode = st.get("gtid_mode") or cfg.gtid_mode or "off"
    # Master_Log_File / Read_Master_Log_Pos are the master's own coordinates of the horizon: the same as the
    # relay's file and offset until a switch of masters, the new master's after it (SHOW BINARY LOGS keeps
    # the relay's names).
    same_epoch = st.get("upstream_log_file") in (None, env.snapshot.file)
    return {
        "io_state": io_state,
        "host": st.get("master_host") or "",
        "user": master.get("user") or cfg.user or "",
        "port": st.get("master_port") or 0,
        "connect_retry": int(round(cfg.reconnect_max_delay or 60)),
        "log_file": (env.snapshot.file if same_epoch else st.get("upstream_log_file")) or "",
        "log_pos": (env.snapshot.position if same_epoch else st.get("upstream_log_pos")) if env.snapshot.file else 4,
        "io_running": io_running,
        "sql_running": "No",
        "empty": "",
        "zero": 0,
        "null": None,
        "relay_space": relay_space,
        "until_none": "None",
        "ssl_allowed": "No" if ssl_mode == "disabled" else "Yes",
        "ssl_ca": master.get("ssl_ca") or cfg.ssl_ca or "",
        "ssl_cert": master.get("ssl_cert") or cfg.ssl_cert or "",
        "ssl_key": master.get("ssl_key") or cfg.ssl_key or "",
        "ssl_verify": "Yes" if ssl_mode == "verify_identity" else "No",
        "seconds_behind": st.get("seconds_behind_master"),
        "io_errno": errno,
        "io_error": error,
        "io_error_time": time.strftime("%y%m%d %H:%M:%S", time.localtime(error_time)) if error and error_time else "",
        "master_server_id": up.master_server_id or 0,
        "master_uuid": up.master_uuid or "",
        "info_file": str(cfg.relay_dir or ""),
        "sql_state": "",
        "retry_count": 0,  # the relay reconnects for ever
        "gtid_set": gtid_text,
        "auto_position": int(gtid_mode == "mysql"),
        "using_gtid": "Slave_Pos" if gtid_mode == "mariadb" else "No",
        "gtid_io_pos": str(gtids.current_position()) if isinstance(gtids, MariaBinlogState) else "",
        "parallel_mode": "optimistic",
        "max_relay_log_size": 1 << 30,
        "heartbeats": up.heartbeats,
        "heartbeat_period": float(master.get("heartbeat_period") or cfg.heartbeat_period or 0.0),
    }


def _show_replica_status(env: Env, *, new_names: bool, all_connections: bool) -> ResultSet:
    """SHOW SLAVE STATUS (old names) / SHOW REPLICA STATUS (MySQL 8.0.22+ names) about the relay's upstream.

    Columns and their order are the emulated server's: MySQL's for its version, MariaDB's (which keeps
    the old names under both syntaxes and adds Using_Gtid, Gtid_IO_Pos ...) for a MariaDB master. A relay
    without a configured master shows no row, as a server that is no replica does.
    """
    env.require(privileges.SHOW_REPLICA_STATUS)
    if env.mysql:
        spec = [(new if new_names else (old or new), key) for new, old, key, since in _MYSQL_REPLICA_COLUMNS
                if not since or env.at_least(*since)]
    else:
        spec = list(_MARIADB_REPLICA_COLUMNS)
        if all_connections:
            spec = list(_MARIADB_ALL_PREFIX) + spec + list(_MARIADB_ALL_SUFFIX)
    columns = [name for name, _ in spec]
    if not env.ctx.settings.master:
        return ResultSet(columns, [])
    # Stage texts follow the version (MySQL 8.0.26 renamed them), not the syntax used.
    values = _replica_values(env, new_terms=env.mysql and env.at_least(8, 0, 26))
    return ResultSet(columns, [[values[key] for _, key in spec]])


def _stored_size(path) -> int:
    """Bytes a relay file takes on disk in whatever form it is stored (0 when purged meanwhile)."""
    try:
        return closed_files.stored_stat(path).st_size
    except OSError:
        return 0
