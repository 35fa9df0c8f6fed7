"""The SQL functions the relay evaluates (IFNULL, COALESCE, UNIX_TIMESTAMP, NOW, VERSION, GTID_SUBSET,
GTID_SUBTRACT, BINLOG_GTID_POS ...): one table, ``FUNCTIONS``."""

from __future__ import annotations

import datetime as _dt
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ...binlog.gtid import GtidSet, MariaBinlogState
from ...binlog.reader import BinlogScanner
from ...relay import closed_files
from ...relay.catalog import CatalogError
from ...wire.errors import ER_MALFORMED_GTID_SET_SPECIFICATION
from .errors import SqlError
from .limits import too_large
from .values import compare_values, to_datetime, to_number, to_text, truthy
from .variables import always_present, mysql_only

if TYPE_CHECKING:
    from .env import Env

# ---------------------------------------------------------------------------------------------
# Functions


@dataclass(frozen=True)
class _Function:
    fn: Callable[[Env, list[Any]], Any]
    min_args: int = 0
    max_args: int = 0
    exists: Callable[[Env], bool] = always_present


def _first_not_null(env: Env, args: list[Any]) -> Any:
    return next((a for a in args if a is not None), None)


def _if(env: Env, args: list[Any]) -> Any:
    return args[1] if args[0] is not None and truthy(args[0]) else args[2]


def _nullif(env: Env, args: list[Any]) -> Any:
    return None if compare_values(args[0], args[1]) == 0 else args[0]


def _unix_timestamp(env: Env, args: list[Any]) -> Any:
    if not args:
        return int(env.now)
    if args[0] is None:
        return None
    moment = to_datetime(args[0])
    return int(moment.timestamp()) if moment is not None else None


def _now(env: Env, args: list[Any]) -> Any:
    return _dt.datetime.fromtimestamp(int(env.now))


def _utc_now(env: Env, args: list[Any]) -> Any:
    return _dt.datetime.fromtimestamp(int(env.now), _dt.timezone.utc).replace(tzinfo=None)


def _user(env: Env, args: list[Any]) -> Any:
    return f"{env.conn.user}@{env.conn.host}"


def _concat(env: Env, args: list[Any]) -> Any:
    if any(a is None for a in args):
        return None
    parts = [to_text(a) for a in args]
    if sum(len(part) for part in parts) > env.max_value_bytes:  # refused before it is built
        raise too_large("concat()", env.max_value_bytes)
    return "".join(parts)


def _gtid_set_arg(value: Any) -> GtidSet:
    try:
        return GtidSet.parse(to_text(value))
    except ValueError:
        raise SqlError(ER_MALFORMED_GTID_SET_SPECIFICATION, "HY000",
                       f"Malformed GTID set specification '{to_text(value)[:200]}'.") from None


def _gtid_subset(env: Env, args: list[Any]) -> Any:
    if args[0] is None or args[1] is None:
        return None
    return int(_gtid_set_arg(args[0]).is_subset(_gtid_set_arg(args[1])))


def _gtid_subtract(env: Env, args: list[Any]) -> Any:
    if args[0] is None or args[1] is None:
        return None
    return _gtid_set_arg(args[0]).subtract(_gtid_set_arg(args[1])).format(",\n")


def _binlog_gtid_pos(env: Env, args: list[Any]) -> Any:
    """MariaDB's BINLOG_GTID_POS(file, pos): the GTID position at a file/position of the relay's binlog.

    It is the file's starting state plus every group that completes before ``pos``. A position that is
    not at a group boundary, beyond the durable horizon, or in no relay file gives NULL (a MariaDB
    replica in file/position mode asks it to learn its GTID position and tolerates NULL). The relay
    never names a position inside a transaction, where MariaDB would count the open group as done.
    """
    name, pos = args
    if name is None or pos is None:
        return None
    position = to_number(pos)
    if not isinstance(position, int) or position < 4:
        return None
    try:
        info = next((f for f in env.catalog.files() if f.name == to_text(name)), None)
    except CatalogError:
        return None
    if info is None or position > info.size:
        return None
    if position == 4:
        gtids = info.start_gtids
    else:
        try:
            path = env.ctx.store.path(info.name)
        except KeyError:
            return None  # purged meanwhile
        key = (str(path), position)
        gtids = env.prefetched[key] if key in env.prefetched else gtids_at(path, position)
        if gtids is NOT_A_BOUNDARY:
            return None
        if gtids is None:
            gtids = info.start_gtids  # before the file's PREVIOUS_GTIDS / GTID_LIST: its starting set
    return state_text(gtids)


def state_text(gtids) -> str | None:
    """A GTID state as BINLOG_GTID_POS answers it: MariaDB's position (per domain the last GTID), MySQL's set."""
    if isinstance(gtids, MariaBinlogState):
        return str(gtids.current_position())
    if isinstance(gtids, GtidSet):
        return gtids.format(",")
    return None


NOT_A_BOUNDARY = object()
_SCAN_CHUNK = 1 << 20


def gtids_at(path, position: int) -> Any:
    """GTID set after the groups that end at or before ``position`` (which must be a group boundary)."""
    scanner = BinlogScanner()
    remaining = position
    try:
        with closed_files.open_stream(path) as f:  # any storage form
            while remaining > 0:
                chunk = f.read(min(_SCAN_CHUNK, remaining))
                if not chunk:
                    return NOT_A_BOUNDARY  # the file is shorter than asked: purged or cut under us
                scanner.feed(chunk)
                remaining -= len(chunk)
    except (OSError, closed_files.StoredFileError):
        return NOT_A_BOUNDARY
    result = scanner.finish()
    if not result.ok or result.partial_tail or result.good_end != position:
        return NOT_A_BOUNDARY
    return result.gtids_after


# -- user-level locks (GET_LOCK ...): HA tools take one on every server before they touch it (MHA:
# 'MHA_Master_High_Availability_Failover'). Per relay process, by name (case-insensitive), held by a connection id
# with a count (a session may take the same lock again); a lock whose connection has gone is free.

_USER_LOCKS: weakref.WeakKeyDictionary[Any, dict[str, list[int]]] = weakref.WeakKeyDictionary()


def _locks(env: Env) -> dict[str, list[int]]:
    locks = _USER_LOCKS.setdefault(env.ctx, {})
    for name in [n for n, (holder, _) in locks.items() if holder not in env.ctx.connections]:
        del locks[name]  # its session ended: released, as a server releases a closed session's locks
    return locks


def _lock_name(value: Any) -> str | None:
    return None if value is None else to_text(value).lower()


def _get_lock(env: Env, args: list[Any]) -> Any:
    """1: taken (or taken again by this session); 0: another session holds it. The relay does not wait for it:
    a lock held elsewhere answers 0 at once, which is what the server answers when the timeout runs out."""
    name = _lock_name(args[0])
    if name is None:
        return None
    locks = _locks(env)
    holder = locks.get(name)
    if holder is None:
        locks[name] = [env.conn.conn_id, 1]
        return 1
    if holder[0] == env.conn.conn_id:
        holder[1] += 1
        return 1
    return 0


def _release_lock(env: Env, args: list[Any]) -> Any:
    name = _lock_name(args[0])
    locks = _locks(env)
    if name is None:
        return None
    holder = locks.get(name)
    if holder is None:
        return None
    if holder[0] != env.conn.conn_id:
        return 0
    holder[1] -= 1
    if holder[1] == 0:
        del locks[name]
    return 1


def _release_all_locks(env: Env, args: list[Any]) -> Any:
    locks = _locks(env)
    mine = [n for n, (holder, _) in locks.items() if holder == env.conn.conn_id]
    count = sum(locks.pop(n)[1] for n in mine)
    return count


def _is_used_lock(env: Env, args: list[Any]) -> Any:
    name = _lock_name(args[0])
    holder = _locks(env).get(name) if name is not None else None
    return holder[0] if holder is not None else None


def _is_free_lock(env: Env, args: list[Any]) -> Any:
    name = _lock_name(args[0])
    return None if name is None else int(name not in _locks(env))


FUNCTIONS: dict[str, _Function] = {
    "GET_LOCK": _Function(_get_lock, 2, 2),
    "RELEASE_LOCK": _Function(_release_lock, 1, 1),
    "RELEASE_ALL_LOCKS": _Function(_release_all_locks),
    "IS_USED_LOCK": _Function(_is_used_lock, 1, 1),
    "IS_FREE_LOCK": _Function(_is_free_lock, 1, 1),
    "IFNULL": _Function(_first_not_null, 2, 2),
    "COALESCE": _Function(_first_not_null, 1, 255),
    "IF": _Function(_if, 3, 3),
    "NULLIF": _Function(_nullif, 2, 2),
    "UNIX_TIMESTAMP": _Function(_unix_timestamp, 0, 1),
    "NOW": _Function(_now, 0, 1),
    "CURRENT_TIMESTAMP": _Function(_now, 0, 1),
    "LOCALTIME": _Function(_now, 0, 1),
    "LOCALTIMESTAMP": _Function(_now, 0, 1),
    "SYSDATE": _Function(_now, 0, 1),
    "UTC_TIMESTAMP": _Function(_utc_now, 0, 1),
    "CURDATE": _Function(lambda e, a: _now(e, a).date()),
    "CURRENT_DATE": _Function(lambda e, a: _now(e, a).date()),
    "VERSION": _Function(lambda e, a: e.version),
    "DATABASE": _Function(lambda e, a: e.conn.database),
    "SCHEMA": _Function(lambda e, a: e.conn.database),
    "USER": _Function(_user),
    "SESSION_USER": _Function(_user),
    "SYSTEM_USER": _Function(_user),
    "CURRENT_USER": _Function(_user),
    "CONNECTION_ID": _Function(lambda e, a: e.conn.conn_id),
    "LAST_INSERT_ID": _Function(lambda e, a: 0, 0, 1),
    "CONCAT": _Function(_concat, 1, 255),
    "LOWER": _Function(lambda e, a: None if a[0] is None else to_text(a[0]).lower(), 1, 1),
    "LCASE": _Function(lambda e, a: None if a[0] is None else to_text(a[0]).lower(), 1, 1),
    "UPPER": _Function(lambda e, a: None if a[0] is None else to_text(a[0]).upper(), 1, 1),
    "UCASE": _Function(lambda e, a: None if a[0] is None else to_text(a[0]).upper(), 1, 1),
    "BINLOG_GTID_POS": _Function(_binlog_gtid_pos, 2, 2),
    "GTID_SUBSET": _Function(_gtid_subset, 2, 2, exists=mysql_only),
    "GTID_SUBTRACT": _Function(_gtid_subtract, 2, 2, exists=mysql_only),
}

# Functions MySQL lets you call without parentheses.
BARE_FUNCTIONS = frozenset({"CURRENT_TIMESTAMP", "CURRENT_USER", "CURRENT_DATE", "LOCALTIME", "LOCALTIMESTAMP"})
