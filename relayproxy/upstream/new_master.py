"""What the relay asks a master it would switch to (docs/failover.md), before anything is written: the GTID state at
the file/position a CHANGE MASTER gave (upstream/repoint.py's rules over the master's answers), and which of the
relay's GTIDs the master lacks."""

from __future__ import annotations

from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtidPosition
from ..wire.packets import MySQLError
from .connection import UpstreamConnection
from .errors import CoordinatesRefused
from .repoint import BadCoordinates, check_boundary, check_coordinates, mysql_gtids_at, sql_string

__all__ = ["missing_on_master", "translate_coordinates"]


async def translate_coordinates(conn: UpstreamConnection, file: str, pos: int, address: str):
    """The new master's GTID state at (file, pos): MariaDB ``BINLOG_GTID_POS``; MySQL the file's Previous_gtids
    and the GTIDs of its transactions before pos (SHOW BINLOG EVENTS, read in bounded pages). Raises
    CoordinatesRefused naming what is wrong (no such file, beyond its end, not at a transaction boundary)."""
    try:
        rows = (await conn.query("SHOW BINARY LOGS")).rows
        size = check_coordinates(file, pos, [(str(r[0]), int(r[1])) for r in rows], address)
        event_type = event_error = None
        if 4 < pos < size:
            try:
                found = (await conn.query(f"SHOW BINLOG EVENTS IN {sql_string(file)} FROM {pos} LIMIT 1")).rows
            except MySQLError as exc:
                event_error = f"error {exc.code}: {exc.message}"
            else:
                event_type = str(found[0][2]) if found else None
        check_boundary(file, pos, size, event_type, event_error, address)
        if conn.is_mariadb:
            found = (await conn.query(f"SELECT BINLOG_GTID_POS({sql_string(file)}, {pos})")).rows
            text = found[0][0] if found else None
            if text is None:
                raise BadCoordinates(f"the new master {address} cannot translate {file}:{pos} into GTIDs "
                                     "(BINLOG_GTID_POS answered NULL)")
            return MariaGtidPosition.parse(str(text))
        gtids = GtidSet()
        at = 4
        while at < pos:  # pages of events: bounded memory whatever the file's size
            page = (await conn.query(f"SHOW BINLOG EVENTS IN {sql_string(file)} FROM {at} LIMIT 1000")).rows
            if not page:
                break
            gtids.update(mysql_gtids_at(page, pos))
            at = int(page[-1][4]) if int(page[-1][4]) > at else pos
        return gtids
    except BadCoordinates as exc:
        raise CoordinatesRefused(f"{exc}. Nothing was written; replicas are served what is durable") from None
    except MySQLError as exc:
        raise CoordinatesRefused(f"the new master {address} could not translate MASTER_LOG_FILE/MASTER_LOG_POS "
                                 f"{file}:{pos} into GTIDs (error {exc.code}: {exc.message}); nothing was "
                                 "written") from None

async def missing_on_master(conn: UpstreamConnection, relay_gtids) -> str:
    """The relay's GTIDs the master does not have, as text ('' when it has them all)."""
    if isinstance(relay_gtids, GtidSet):
        rows = (await conn.query("SELECT @@GLOBAL.GTID_EXECUTED")).rows
        executed = GtidSet.parse(str(rows[0][0] or "")) if rows else GtidSet()
        return str(relay_gtids.subtract(executed))
    rows = (await conn.query("SELECT @@GLOBAL.gtid_binlog_state")).rows
    state = MariaBinlogState.parse(str(rows[0][0] or "")) if rows else MariaBinlogState()
    missing = []
    for gtid in relay_gtids.current_position():
        latest = state.latest(gtid.domain_id)
        if latest is None:
            missing.append(f"{gtid} (the master has nothing of domain {gtid.domain_id})")
        elif latest.seq_no < gtid.seq_no:
            missing.append(f"{gtid.domain_id}-{gtid.server_id}-{latest.seq_no + 1}..{gtid} "
                           f"(the master's domain {gtid.domain_id} ends at {latest})")
    return ", ".join(missing)
