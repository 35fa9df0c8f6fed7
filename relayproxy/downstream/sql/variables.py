"""The relay's system and status variables: ``SYSTEM_VARIABLES`` and ``STATUS_VARIABLES``, one entry each. Add an
entry here to answer a new ``@@variable`` or ``SHOW STATUS`` row; say only what the relay knows (design.md)."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ... import __version__
from ...binlog.gtid import GtidSet
from ...relay.catalog import CatalogError
from ...wire.errors import (
    ER_INCORRECT_GLOBAL_LOCAL_VAR,
    ER_UNKNOWN_ERROR,
    ER_WRONG_TYPE_FOR_VAR,
    ER_WRONG_VALUE_FOR_VAR,
)
from .errors import SqlError, unknown_variable
from .values import to_number, to_text, truthy

if TYPE_CHECKING:
    from .env import Env

# ---------------------------------------------------------------------------------------------
# System variables: the one table of answers.


def always_present(env: Env) -> bool:
    return True


def mysql_only(env: Env) -> bool:
    return env.mysql


def _mariadb_only(env: Env) -> bool:
    return not env.mysql


def _mysql_since(*version: int) -> Callable[[Env], bool]:
    def check(env: Env) -> bool:
        return env.mysql and env.at_least(*version)

    return check


def _not_mysql8(env: Env) -> bool:
    return not (env.mysql and env.at_least(8, 0, 0))


@dataclass(frozen=True)
class SysVar:
    """One system variable the relay answers.

    ``value(env)`` gives the global value; ``kind`` says how it prints (``bool``: 1/0 in SELECT, ON/OFF
    in SHOW VARIABLES). ``has_session``: a session may read ``@@session.x`` and ``SET x``;
    ``has_global``: ``@@global.x`` exists. ``exists(env)`` hides variables the emulated server does not
    have, so ``SELECT @@x`` gets the ERR 1193 a real server of that flavour/version would send (a MySQL
    replica treats 1193 on GTID_MODE and semi-sync as "feature absent").
    """

    name: str
    value: Callable[[Env], Any]
    kind: str = "str"  # str | int | bool
    has_session: bool = True
    has_global: bool = True
    exists: Callable[[Env], bool] = always_present
    doc: str = ""

    def select_value(self, env: Env) -> Any:
        value = self.value(env)
        if isinstance(value, str) and self.kind in ("bool", "int"):  # a master's text ("ON", "0")
            try:
                value = self.coerce(value)
            except SqlError:
                return value
        if self.kind == "bool" and value is not None:
            return int(bool(value))
        return value

    def show_value(self, value: Any) -> str:
        if value is None:
            return ""
        if self.kind == "bool":
            return "ON" if truthy(value) else "OFF"
        return str(value)

    def coerce(self, value: Any) -> Any:
        """A value assigned with SET, normalised to this variable's kind."""
        if value is None:
            return None
        if self.kind == "bool":
            if isinstance(value, str):
                word = value.strip().upper()
                if word in ("ON", "TRUE", "YES"):
                    return 1
                if word in ("OFF", "FALSE", "NO"):
                    return 0
            number = to_number(value)
            if number not in (0, 1):
                raise SqlError(ER_WRONG_VALUE_FOR_VAR, "42000",
                               f"Variable '{self.name}' can't be set to the value of '{to_text(value)}'")
            return int(number)
        if self.kind == "int":
            if isinstance(value, str) and not re.fullmatch(r"\s*[+-]?\d+\s*", value):
                raise SqlError(ER_WRONG_TYPE_FOR_VAR, "42000", f"Incorrect argument type to variable '{self.name}'")
            return int(to_number(value))
        return to_text(value)


def binlog_checksum_value(env: Env) -> str | None:
    """The relay's checksum algorithm, from its newest FORMAT_DESCRIPTION (what the dump sends; while the current
    file holds none yet, as after a rotation or at a new epoch's first file, the previous file's); before any file,
    the master's value when the session fetched it; else NULL (a guess would change how a client cuts events; a
    MariaDB replica stops on NULL, so NULL is only for a relay that has never seen a master)."""
    fde = env.ctx.store.latest_format_description
    if fde is None:
        found = env.master_var("binlog_checksum")
        return str(found).upper() if found is not None else None
    return fde.checksum_name or "NONE"  # a pre-5.6 file carries no checksums


def _enforce_gtid_consistency(env: Env) -> str:
    found = env.master_var("enforce_gtid_consistency")
    if found is not None:
        return str(found).upper()
    return "ON" if _gtid_mode(env) == "ON" else "OFF"  # ON is required by gtid_mode=ON; OFF otherwise is a guess
    # that changes no decoding (it only restricts what the master accepted)


def _gtid_mode(env: Env) -> str:
    override = env.master_var("gtid_mode")
    if override:
        return str(override).upper()
    gtids = env.mysql_gtids
    return "ON" if env.ctx.settings.gtid_mode == "mysql" or (gtids is not None and bool(gtids)) else "OFF"


def gtid_executed_value(env: Env) -> str:
    gtids = env.mysql_gtids
    return gtids.format(",\n") if gtids is not None else ""


def _gtid_purged(env: Env) -> str:
    try:
        purged = env.catalog.purged()
    except CatalogError as exc:
        raise SqlError(ER_UNKNOWN_ERROR, "HY000", f"cannot compute gtid_purged: {exc}") from None
    return purged.format(",\n") if isinstance(purged, GtidSet) else ""


def default_collation(env: Env) -> str:
    return "utf8mb4_0900_ai_ci" if env.mysql and env.at_least(8, 0, 0) else "utf8mb4_general_ci"


def _sql_mode(env: Env) -> str:
    if not env.mysql:
        return "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION"
    if env.at_least(8, 0, 0):
        return ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
                "NO_ENGINE_SUBSTITUTION")
    return ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
            "NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION")


def _listen_port(env: Env) -> int:
    listen = env.ctx.settings.listen
    return int(listen[1]) if listen else 3306


def _version_comment(env: Env) -> str:
    return f"relayproxy {__version__} binlog relay"


def _datadir(env: Env) -> str | None:
    """The relay directory (absolute, with the trailing slash servers print): where the relay's files and state are.
    NULL when the relay runs without one (never the case for ``run`` and ``serve``)."""
    relay_dir = env.ctx.settings.relay_dir
    if not relay_dir:
        return None
    return os.path.join(os.path.abspath(str(relay_dir)), "")


def _semi_sync(env: Env) -> bool:
    return env.ctx.settings.semi_sync


def _from_master(name: str, default: Any) -> Callable[[Env], Any]:
    """The master's value when the upstream session recorded it, else ``default`` (a value or ``f(env)``):
    None (NULL) for what changes how a client decodes or decides, the server's documented default otherwise."""

    def value(env: Env) -> Any:
        found = env.master_var(name)
        if found is not None:
            return found
        return default(env) if callable(default) else default

    return value


def _master_has(name: str, otherwise: Callable[[Env], bool]) -> Callable[[Env], bool]:
    """Does the variable exist? As the master said when it was asked (1193 = it lacks it), else ``otherwise``."""

    def exists(env: Env) -> bool:
        if env.master_var(name) is not None:
            return True
        if env.master_lacks(name):
            return False
        return otherwise(env)

    return exists


def _epoch_field(name: str) -> Callable[[Env], Any]:
    """A field of the relay's current upstream epoch (relay/epochs.py), NULL while none is recorded: what a peer
    relay checks before it catches up from this one by file/position (docs/failover.md, "Peer catch-up")."""

    def value(env: Env) -> Any:
        epochs = env.ctx.store.epochs
        current = epochs.current if epochs.epochs else None
        if current is None or current.implicit:
            return None
        if name in ("server_id", "server_uuid", "host", "port"):
            return (current.master_dict or {}).get(name)
        return getattr(current, name)

    return value


SYSTEM_VARIABLES: tuple[SysVar, ...] = (
    # -- identity: the relay's own, never the master's (a replica refuses a master with its own id/uuid)
    SysVar("server_id", lambda e: e.ctx.server_id, "int", has_session=False, doc="the relay's --server-id"),
    SysVar("server_uuid", lambda e: e.ctx.server_uuid, has_session=False, exists=mysql_only),
    SysVar("hostname", lambda e: socket.gethostname(), has_session=False),
    SysVar("port", _listen_port, "int", has_session=False),
    SysVar("report_host", lambda e: None, has_session=False),
    SysVar("report_port", _listen_port, "int", has_session=False),
    SysVar("version", lambda e: e.version, has_session=False),
    SysVar("version_comment", _version_comment, has_session=False),
    SysVar("datadir", _datadir, has_session=False,
           doc="the relay directory: its files (the master's names and offsets) and its state"),
    SysVar("license", lambda e: "GPL", has_session=False),
    # -- what kind of server this is: a read-only binlog server that logs its master's events
    SysVar("read_only", lambda e: True, "bool", has_session=False),
    SysVar("super_read_only", lambda e: True, "bool", has_session=False, exists=mysql_only),
    SysVar("log_bin", lambda e: True, "bool", has_session=False),
    SysVar("log_slave_updates", lambda e: True, "bool", has_session=False,
           doc="1: the relay's binlogs are its master's events, so replicas below it can be relocated"),
    SysVar("log_replica_updates", lambda e: True, "bool", has_session=False, exists=_mysql_since(8, 0, 26)),
    # -- how the master logs rows: its values (fetched at connect, persisted), NULL while the relay does not
    # know (a default here would be a guess that changes a CDC client's decoding or its start-up check)
    SysVar("binlog_format", _from_master("binlog_format", None)),
    SysVar("binlog_row_image", _from_master("binlog_row_image", None)),
    SysVar("binlog_row_metadata", _from_master("binlog_row_metadata", None), has_session=False,
           # MySQL 8.0.1+ always has it (default MINIMAL); MariaDB 10.5+ too; earlier servers do not.
           exists=_master_has("binlog_row_metadata",
                              lambda e: (e.mysql and e.at_least(8, 0, 1)) or (not e.mysql and e.at_least(10, 5, 0))),
           doc="the master's value; NULL until the relay has fetched it"),
    SysVar("binlog_row_value_options", _from_master("binlog_row_value_options", None),
           exists=_master_has("binlog_row_value_options", lambda e: e.mysql and e.at_least(8, 0, 3)),
           doc="MySQL: PARTIAL_JSON changes how JSON updates are logged"),
    SysVar("binlog_gtid_index", _from_master("binlog_gtid_index", None), "bool", has_session=False,
           exists=_master_has("binlog_gtid_index", lambda e: not e.mysql and e.at_least(11, 4, 0))),
    SysVar("binlog_checksum", binlog_checksum_value, has_session=False),
    # -- what a replica's applier would have: the relay applies nothing, keeps no relay-log.info (its position is
    # its files) and never deletes a file because it was applied (retention is its expire_logs_days)
    SysVar("slave_parallel_workers", lambda e: 0, "int", has_session=False, doc="0: no applier threads"),
    SysVar("slave_parallel_threads", lambda e: 0, "int", has_session=False, exists=_mariadb_only),
    SysVar("replica_parallel_workers", lambda e: 0, "int", has_session=False, exists=_mysql_since(8, 0, 26)),
    SysVar("relay_log_purge", lambda e: False, "bool", has_session=False,
           doc="OFF: no file is deleted because it was applied; retention_* purge the oldest files"),
    SysVar("relay_log_info_file", lambda e: None, has_session=False,
           doc="NULL: the relay has no relay-log.info; its position is its files (MHA then looks for "
               "<datadir>/relay-log.info, which does not exist: docs/failover.md, MHA 0.58)"),
    SysVar("master_info_repository", lambda e: "TABLE", has_session=False, exists=mysql_only),
    SysVar("relay_log_info_repository", lambda e: "TABLE", has_session=False, exists=mysql_only),
    # -- GTIDs, from the horizon (MySQL) or the horizon's binlog state (MariaDB)
    SysVar("gtid_mode", _gtid_mode, has_session=False, exists=mysql_only),
    SysVar("enforce_gtid_consistency", _enforce_gtid_consistency, has_session=False,
           exists=mysql_only),
    SysVar("gtid_executed", gtid_executed_value, has_session=False, exists=mysql_only),
    SysVar("gtid_purged", _gtid_purged, has_session=False, exists=mysql_only),
    SysVar("gtid_binlog_pos", lambda e: str(e.maria_state.current_position()), has_session=False,
           exists=_mariadb_only),
    SysVar("gtid_binlog_state", lambda e: str(e.maria_state), has_session=False, exists=_mariadb_only),
    SysVar("gtid_current_pos", lambda e: str(e.maria_state.current_position()), has_session=False,
           exists=_mariadb_only, doc="= gtid_binlog_pos: the relay applies nothing, it only logs"),
    SysVar("gtid_slave_pos", lambda e: "", has_session=False, exists=_mariadb_only,
           doc="empty: the relay applies no transaction"),
    SysVar("gtid_domain_id", _from_master("gtid_domain_id", 0), "int", exists=_mariadb_only),
    SysVar("gtid_strict_mode", _from_master("gtid_strict_mode", False), "bool", has_session=False,
           exists=_mariadb_only),
    SysVar("gtid_ignore_duplicates", lambda e: False, "bool", has_session=False, exists=_mariadb_only),
    # -- semi-sync toward the relay's replicas (config semi_sync)
    SysVar("rpl_semi_sync_master_enabled", _semi_sync, "bool", has_session=False),
    SysVar("rpl_semi_sync_source_enabled", _semi_sync, "bool", has_session=False, exists=_mysql_since(8, 0, 26)),
    # -- what drivers and client libraries read at connect time
    # What the relay enforces on a client's packet (downstream/session.py) and a statement (limits.py), not the
    # master's (which /status shows): a driver sizing its batches by it must not be refused below it.
    SysVar("max_allowed_packet", lambda e: e.max_value_bytes, "int"),
    SysVar("net_write_timeout", lambda e: 60, "int"),
    SysVar("net_read_timeout", lambda e: 30, "int"),
    SysVar("net_buffer_length", lambda e: 16384, "int"),
    SysVar("wait_timeout", lambda e: 28800, "int"),
    SysVar("interactive_timeout", lambda e: 28800, "int"),
    SysVar("connect_timeout", lambda e: 10, "int", has_session=False),
    SysVar("character_set_client", lambda e: "utf8mb4"),
    SysVar("character_set_connection", lambda e: "utf8mb4"),
    SysVar("character_set_results", lambda e: "utf8mb4"),
    # the master's defaults: a CDC client's DDL parser takes them for columns declared without a charset
    SysVar("character_set_server", _from_master("character_set_server", None)),
    SysVar("character_set_database", lambda e: "utf8mb4"),
    SysVar("character_set_system", lambda e: "utf8mb3", has_session=False),
    SysVar("collation_connection", default_collation),
    SysVar("collation_server", _from_master("collation_server", None)),
    SysVar("collation_database", default_collation),
    SysVar("sql_mode", _sql_mode),
    # the master's; time_zone's default is SYSTEM on both servers (row events carry TIMESTAMPs in UTC)
    SysVar("time_zone", _from_master("time_zone", "SYSTEM")),
    SysVar("system_time_zone", _from_master("system_time_zone", None), has_session=False),
    SysVar("lower_case_table_names", _from_master("lower_case_table_names", None), "int", has_session=False),
    SysVar("init_connect", lambda e: "", has_session=False),
    SysVar("performance_schema", lambda e: False, "bool", has_session=False),
    SysVar("autocommit", lambda e: True, "bool"),
    SysVar("auto_increment_increment", lambda e: 1, "int"),
    SysVar("auto_increment_offset", lambda e: 1, "int"),
    SysVar("tx_isolation", lambda e: "REPEATABLE-READ"),
    SysVar("transaction_isolation", lambda e: "REPEATABLE-READ"),
    SysVar("tx_read_only", lambda e: False, "bool"),
    SysVar("transaction_read_only", lambda e: False, "bool"),
    SysVar("query_cache_size", lambda e: 0, "int", has_session=False, exists=_not_mysql8),
    SysVar("query_cache_type", lambda e: "OFF", exists=_not_mysql8),
    SysVar("sql_log_bin", lambda e: True, "bool", has_global=False),
    SysVar("skip_replication", lambda e: False, "bool", has_global=False,
           doc="MariaDB replicas SET it with replicate_events_marked_for_skip=FILTER_ON_MASTER"),
    # -- the relay's current upstream epoch (relayproxy.epochs): which master its newest files came from; a
    # server answers 1193 to these, so a relay that connects knows whether it talks to a relay of which master
    SysVar("relayproxy_epoch", _epoch_field("epoch"), "int", has_session=False),
    SysVar("relayproxy_master_server_id", _epoch_field("server_id"), "int", has_session=False),
    SysVar("relayproxy_master_server_uuid", _epoch_field("server_uuid"), has_session=False),
    SysVar("relayproxy_epoch_first_file", _epoch_field("first_file"), has_session=False),
    SysVar("relayproxy_epoch_upstream_first_file", _epoch_field("upstream_first_file"), has_session=False),
)

_VARIABLES_BY_NAME: dict[str, SysVar] = {v.name: v for v in SYSTEM_VARIABLES}


def lookup_variable(env: Env, name: str) -> SysVar | None:
    var = _VARIABLES_BY_NAME.get(name)
    return var if var is not None and var.exists(env) else None


def read_variable(env: Env, name: str, scope: str | None) -> Any:
    """``@@name`` / ``@@global.name`` / ``@@session.name`` as SELECT shows it (booleans as 1/0)."""
    var = lookup_variable(env, name)
    session = env.conn.session_vars
    if var is None:
        if scope != "global" and name in session:
            return session[name]
        raise unknown_variable(name)
    if scope == "global":
        if not var.has_global:
            raise SqlError(ER_INCORRECT_GLOBAL_LOCAL_VAR, "HY000", f"Variable '{name}' is a SESSION variable")
        return var.select_value(env)
    if scope == "session" and not var.has_session:
        raise SqlError(ER_INCORRECT_GLOBAL_LOCAL_VAR, "HY000", f"Variable '{name}' is a GLOBAL variable")
    if var.has_session and name in session:
        return session[name]
    return var.select_value(env)


@dataclass(frozen=True)
class StatusVar:
    """One SHOW STATUS counter."""

    name: str
    value: Callable[[Env], Any]
    exists: Callable[[Env], bool] = always_present


def _uptime(env: Env) -> int:
    return max(int(env.now - env.ctx.started), 0)


def _semi_sync_clients(env: Env) -> int:
    return sum(1 for c in env.ctx.connections.values() if c.dump is not None and c.dump.semi_sync)


def _upstream(name: str, render: Callable[[Any], Any] = lambda v: v) -> Callable[[Env], Any]:
    """A field of the relay's status document (its upstream side), as SHOW STATUS shows it."""
    return lambda env: render((env.ctx.status_document() or {}).get(name))


def _on_off(value: Any) -> str:
    return "" if value is None else ("ON" if value else "OFF")


def _replica_semi_sync(env: Env) -> str:
    """The relay as its master's semi-sync replica: ON while the stream it reads negotiated semi-sync."""
    doc = env.ctx.status_document() or {}
    return "ON" if doc.get("semi_sync") and doc.get("io_running") else "OFF"


STATUS_VARIABLES: tuple[StatusVar, ...] = (
    StatusVar("Uptime", _uptime),
    StatusVar("Uptime_since_flush_status", _uptime),
    StatusVar("Threads_connected", lambda e: len(e.ctx.connections)),
    StatusVar("Threads_running", lambda e: 1),
    StatusVar("Slave_running", lambda e: "ON" if e.ctx.relay.master.io_running else "OFF", exists=_mariadb_only),
    StatusVar("Rpl_semi_sync_master_status", lambda e: "ON" if _semi_sync(e) else "OFF"),
    StatusVar("Rpl_semi_sync_master_clients", _semi_sync_clients),
    StatusVar("Rpl_semi_sync_source_status", lambda e: "ON" if _semi_sync(e) else "OFF",
              exists=_mysql_since(8, 0, 26)),
    StatusVar("Rpl_semi_sync_source_clients", _semi_sync_clients, exists=_mysql_since(8, 0, 26)),
    StatusVar("Rpl_semi_sync_slave_status", _replica_semi_sync),
    StatusVar("Rpl_semi_sync_replica_status", _replica_semi_sync, exists=_mysql_since(8, 0, 26)),
    # What semi-sync streams' transaction ends said (docs/failover.md, "Semi-sync fallback: the hole"), for an HA
    # tool that speaks SQL only (relayproxy promote reads them): the relay's own counters, since it started.
    StatusVar("Relayproxy_semi_sync_acks", _upstream("semi_sync_acks", lambda v: int(v or 0))),
    StatusVar("Relayproxy_semi_sync_master_waiting", _upstream("semi_sync_master_waiting", _on_off)),
    StatusVar("Relayproxy_semi_sync_unrequested_transactions",
              _upstream("semi_sync_unrequested_transactions", lambda v: int(v or 0))),
    StatusVar("Relayproxy_semi_sync_last_unrequested_gtid",
              _upstream("semi_sync_last_unrequested_gtid", lambda v: v or "")),
)
