"""What the relay does on a master connection before the stream begins, as a replica does (protocol-reference
§3.5 / §3.11): the master options it starts from, its persistent replica UUID, the setup queries, the master's
variables, semi-sync, the dump request from the horizon, and how long any of it may stay unanswered."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..binlog.gtid import GtidSet, MariaBinlogState
from ..log import get_logger
from ..relay.durable import write_file_atomically
from ..relay.master_variables import VARIABLES as MASTER_VARIABLES
from ..relay.master_variables import MasterVariables, select_statement, single_statement
from ..wire.errors import ER_UNKNOWN_SYSTEM_VARIABLE
from ..wire.packets import BINLOG_SEND_ANNOTATE_ROWS_EVENT, MARIA_SLAVE_CAPABILITY_GTID, MySQLError
from .connection import UpstreamConnection
from .receiver import StreamError

if TYPE_CHECKING:
    from ..relay.master_info import MasterInfo
    from ..relay.store import RelayStore

log = get_logger("relayproxy.upstream")

__all__ = ["MARIA_SLAVE_CAPABILITY_MINE", "MASTER_SETUP_TIMEOUT", "SetupStatus", "config_values",
           "enable_semi_sync", "fetch_master_variables", "oldest_master_file", "peer_read_timeout", "persistent_uuid",
           "prepare", "request_dump", "setup_read_timeout"]


def config_values(cfg) -> dict:
    """The master-related options of a RelayConfig, as ``relay.master_info.effective_master`` takes them."""
    get = getattr(cfg, "values", None)
    names = ("master", "user", "ssl_mode", "ssl_ca", "ssl_cert", "ssl_key", "server_public_key",
             "heartbeat_period", "gtid_mode", "start_file")
    values = {name: getattr(cfg, name, None) for name in names}
    if get is not None:
        values.update({name: get.get(name, values[name]) for name in names})
    resolve = getattr(cfg, "resolved_password", None)
    values["password"] = resolve() if resolve is not None and values["master"] is not None else getattr(
        cfg, "password", None)
    return values


MARIA_SLAVE_CAPABILITY_MINE = MARIA_SLAVE_CAPABILITY_GTID  # the MariaDB events the relay understands: GTIDs

# The longest the relay waits for any reply its master owes before the stream begins (the setup queries, MariaDB's
# BINLOG_GTID_POS over a large file, the dump's first packet). A master that froze after the handshake, or whose host
# vanished without closing the connection, would otherwise hold the relay "connecting" for good, with no error and
# no retry.
MASTER_SETUP_TIMEOUT = 60.0


def setup_read_timeout(heartbeat_period: float, connect_timeout: float) -> float:
    """The read timeout of the upstream connection until its stream begins: MASTER_SETUP_TIMEOUT, or the peer's
    bound (``peer_read_timeout``) when that is longer."""
    return max(MASTER_SETUP_TIMEOUT, peer_read_timeout(heartbeat_period, connect_timeout))


def peer_read_timeout(heartbeat_period: float, connect_timeout: float) -> float:
    """How long a relay that may be a peer can leave a reply or the comparison dump silent before it counts as
    gone, until its stream begins (the stream has its own silence limit). The comparison dump is non-blocking (the
    peer sends what it holds, no heartbeats) and reads the whole horizon file while the main connection waits; a
    peer that froze or whose host vanished without closing the connections would otherwise hang the relay's
    upstream for good (state "connecting", no error, no retry). The stream's silence limit, and never less than
    the connect timeout."""
    silence = 2 * heartbeat_period + 1.0 if heartbeat_period else 0.0
    return max(silence, connect_timeout)


class SetupStatus(Protocol):
    """What ``prepare`` notes of the master (the session's ``UpstreamStatus``)."""

    clock_diff: float
    master_server_id: int | None
    master_uuid: str | None


async def prepare(conn: UpstreamConnection, status: SetupStatus, *, server_id: int, heartbeat_period: float,
                  replica_uuid: str, semi_sync: bool) -> tuple[str, bool]:
    """The queries a real replica sends before dumping (protocol-reference §3.5 / §3.11), what the master says
    noted in ``status`` as it answers; returns its binlog_checksum and whether semi-sync is on."""
    rows = (await conn.query("SELECT UNIX_TIMESTAMP()")).rows
    if rows and rows[0][0] is not None:
        status.clock_diff = time.time() - float(rows[0][0])
    rows = (await conn.query("SELECT @@GLOBAL.SERVER_ID")).rows
    master_id = int(rows[0][0]) if rows and rows[0][0] is not None else None
    if master_id is None:
        raise StreamError("the master did not report its server_id")
    if master_id == server_id:
        raise StreamError(
            f"the master and the relay have the same server_id {master_id}: set a unique --server-id"
        )
    status.master_server_id = master_id
    period_ns = int(heartbeat_period * 1_000_000_000)
    if period_ns:
        sql = f"SET @master_heartbeat_period = {period_ns}"
        if not conn.is_mariadb:
            sql += f", @source_heartbeat_period = {period_ns}"
        await conn.query(sql)
    if conn.is_mariadb:
        await conn.query("SET @master_binlog_checksum = @@global.binlog_checksum")
        checksum = (await conn.query("SELECT @master_binlog_checksum")).rows[0][0]
        await conn.query(f"SET @mariadb_slave_capability = {MARIA_SLAVE_CAPABILITY_MINE}")
    else:
        await conn.query(
            "SET @master_binlog_checksum = @@global.binlog_checksum, @source_binlog_checksum = @@global.binlog_checksum"
        )
        checksum = (await conn.query("SELECT @master_binlog_checksum")).rows[0][0]
        try:
            status.master_uuid = (await conn.query("SELECT @@GLOBAL.SERVER_UUID")).rows[0][0]
        except MySQLError as exc:
            if exc.code != ER_UNKNOWN_SYSTEM_VARIABLE:
                raise
        await conn.query(f"SET @slave_uuid = '{replica_uuid}', @replica_uuid = '{replica_uuid}'")
    checksum = (checksum or "NONE").upper()
    if checksum not in ("NONE", "CRC32"):
        raise StreamError(f"the master uses binlog_checksum {checksum!r}; only NONE and CRC32 exist")
    await conn.register_slave(server_id)
    if not semi_sync:
        return checksum, False
    return checksum, await enable_semi_sync(conn)


async def enable_semi_sync(conn: UpstreamConnection) -> bool:
    """Ask for semi-sync when the master's plugin is on; whether it is."""
    # 8.0.26+ replicas ask for the source_ name first; MariaDB only has the master_ one.
    names = ("rpl_semi_sync_master_enabled",) if conn.is_mariadb else (
        "rpl_semi_sync_source_enabled", "rpl_semi_sync_master_enabled")
    for variable in names:
        try:
            rows = (await conn.query(f"SELECT @@global.{variable}")).rows
        except MySQLError as exc:
            if exc.code == ER_UNKNOWN_SYSTEM_VARIABLE:
                continue
            raise
        if rows and str(rows[0][0]) in ("1", "ON"):
            await conn.query(
                "SET @rpl_semi_sync_slave = 1"
                if conn.is_mariadb
                else "SET @rpl_semi_sync_slave = 1, @rpl_semi_sync_replica = 1"
            )
            return True
        return False
    return False


async def fetch_master_variables(query, names: tuple[str, ...] = MASTER_VARIABLES, **identity) -> MasterVariables:
    """``names`` from the master through ``await query(sql)`` (a result with ``.rows``): one statement, or one
    by one when the master lacks some (ER_UNKNOWN_SYSTEM_VARIABLE), which are then recorded as absent."""
    try:
        rows = (await query(select_statement(names))).rows
    except MySQLError as exc:
        if exc.code != ER_UNKNOWN_SYSTEM_VARIABLE:
            raise
    else:
        if not rows:
            raise StreamError("the master answered no row for its variables")
        return MasterVariables.from_row(names, rows[0], **identity)
    answers: dict = {}
    absent: list[str] = []
    for name in names:
        try:
            rows = (await query(single_statement(name))).rows
        except MySQLError as exc:
            if exc.code != ER_UNKNOWN_SYSTEM_VARIABLE:
                raise
            absent.append(name)
            continue
        answers[name] = rows[0][0] if rows else None
    return MasterVariables.from_singles(answers, absent, **identity)


async def request_dump(conn: UpstreamConnection, store: RelayStore, master: MasterInfo, *, server_id: int,
                       start_file: str | None, by_position: bool, switching: bool) -> bool:
    """Ask for the stream from the horizon (by file/position when ``by_position``, unless ``switching``: a new
    master is joined by GTID only); returns whether the dump is by file/position."""
    horizon = store.horizon.snapshot()
    # MariaDB: without ANNOTATE_ROWS the master leaves holes where those events were.
    flags = BINLOG_SEND_ANNOTATE_ROWS_EVENT if conn.is_mariadb else 0
    if switching:
        by_position = False
    if store.current_file is None:
        start = master.log_file or start_file or await oldest_master_file(conn)
        position = (master.log_pos or 4) if master.log_file else 4
        log.info("bootstrapping an empty relay", start_file=start, position=position)
        await conn.binlog_dump(start, position, server_id, flags)
        return True
    # A new master is joined by GTID even when CHANGE MASTER gave its file/position (translated, _check_master).
    gtid_mode = ("mariadb" if conn.is_mariadb else "mysql") if switching else master.gtid_mode
    if not by_position and gtid_mode == "mysql" and isinstance(horizon.gtids, GtidSet):
        await conn.binlog_dump_gtid(server_id, horizon.gtids.encode(), flags=flags)
        return False
    if not by_position and gtid_mode == "mariadb" and isinstance(horizon.gtids, MariaBinlogState):
        position = str(horizon.gtids.current_position())
        await conn.query(f"SET @slave_connect_state = '{position}'")
        await conn.query("SET @slave_gtid_strict_mode = 1")
        await conn.query("SET @slave_gtid_ignore_duplicates = 0")
        await conn.binlog_dump("", 4, server_id, flags)
        return False
    # By file/position: the master's own coordinates of the horizon (the relay's names after a switch differ).
    file, position = store.upstream_position()
    await conn.binlog_dump(file, position, server_id, flags)
    return True


async def oldest_master_file(conn: UpstreamConnection) -> str:
    """The master's first binary log, where an empty relay without a start file begins."""
    try:
        rows = (await conn.query("SHOW BINARY LOGS")).rows
    except MySQLError as exc:
        raise StreamError(f"cannot list the master's binary logs to bootstrap ({exc.message}); "
                          "set --start-file") from exc
    if not rows:
        raise StreamError("the master has no binary logs (is log_bin on?)")
    return rows[0][0]


def persistent_uuid(relay_dir: Path) -> str:
    """A replica UUID kept in the relay directory, so the master recognises reconnects of the same relay."""
    path = relay_dir / "relayproxy.uuid"
    try:
        text = path.read_text().strip()
        return str(uuid.UUID(text))
    except (OSError, ValueError):
        value = str(uuid.uuid4())
        relay_dir.mkdir(parents=True, exist_ok=True)
        # fsynced before the rename, else an OS crash can leave the renamed file empty: a new UUID next start.
        write_file_atomically(path, (value + "\n").encode(), tmp=path.with_suffix(".tmp"))
        return value
