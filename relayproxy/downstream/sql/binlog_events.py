"""SHOW BINLOG EVENTS [IN 'file'] [FROM pos] [LIMIT [offset,] n]: the relay's own files, up to the durable
horizon, as the servers list them (Log_name, Pos, Event_type, Server_id, End_log_pos, Info).

The statement is parsed and checked on the event loop (``parse_show_binlog_events``); the file is read in a
worker thread (``read_binlog_events``, called by ``dispatch.execute``), header by header, reading a body only
for the rows it returns and at most ``_INFO_READ_MAX`` bytes of it; at most ``max_rows`` rows (config
``show_binlog_events_max_rows``) and ``max_rows * _SCAN_FACTOR`` events examined per call, so no statement
stalls the relay or grows its memory with the file's size. Event_type names and Info texts are the flavour's
(MariaDB's ``Log_event::pack_info`` / MySQL's for the common events; others have an empty Info).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...binlog import constants as C
from ...binlog.events import HEADER, BinlogFormatError, FormatDescription
from ...binlog.views import (
    BinlogCheckpointView,
    EventView,
    FormatDescriptionView,
    GtidView,
    MariaGtidListView,
    MariaGtidView,
    PreviousGtidsView,
    QueryView,
    RotateView,
    XidView,
    format_uuid,
    view_event,
)
from ...relay import closed_files
from ...wire.results import ResultSet
from ...wire.errors import ER_ERROR_WHEN_EXECUTING_COMMAND
from .errors import SqlError
from .parser import Parser, parse_limit

if TYPE_CHECKING:
    from .env import Env

COLUMNS = ["Log_name", "Pos", "Event_type", "Server_id", "End_log_pos", "Info"]
DEFAULT_MAX_ROWS = 10_000
_SCAN_FACTOR = 100  # events a call may skip (LIMIT offset) per row it may return
_INFO_READ_MAX = 1 << 20  # bytes of one event read for its Info (a longer statement's Info is cut)
_HEADER = struct.Struct("<IBIIIH")
_WHAT = "Error when executing command SHOW BINLOG EVENTS: "

# Event_type as the servers' Log_event::get_type_str() name them.
_COMMON_NAMES = {
    C.START_EVENT_V3: "Start_v3", C.QUERY_EVENT: "Query", C.STOP_EVENT: "Stop", C.ROTATE_EVENT: "Rotate",
    C.INTVAR_EVENT: "Intvar", C.LOAD_EVENT: "Load", C.SLAVE_EVENT: "Slave", C.CREATE_FILE_EVENT: "Create_file",
    C.APPEND_BLOCK_EVENT: "Append_block", C.EXEC_LOAD_EVENT: "Exec_load", C.DELETE_FILE_EVENT: "Delete_file",
    C.NEW_LOAD_EVENT: "New_load", C.RAND_EVENT: "RAND", C.USER_VAR_EVENT: "User var",
    C.FORMAT_DESCRIPTION_EVENT: "Format_desc", C.XID_EVENT: "Xid", C.BEGIN_LOAD_QUERY_EVENT: "Begin_load_query",
    C.EXECUTE_LOAD_QUERY_EVENT: "Execute_load_query", C.TABLE_MAP_EVENT: "Table_map",
    C.WRITE_ROWS_EVENT_V1: "Write_rows_v1", C.UPDATE_ROWS_EVENT_V1: "Update_rows_v1",
    C.DELETE_ROWS_EVENT_V1: "Delete_rows_v1", C.WRITE_ROWS_EVENT: "Write_rows", C.UPDATE_ROWS_EVENT: "Update_rows",
    C.DELETE_ROWS_EVENT: "Delete_rows", C.INCIDENT_EVENT: "Incident", C.HEARTBEAT_LOG_EVENT: "Heartbeat",
    C.IGNORABLE_LOG_EVENT: "Ignorable", C.ROWS_QUERY_LOG_EVENT: "Rows_query", C.GTID_LOG_EVENT: "Gtid",
    C.ANONYMOUS_GTID_LOG_EVENT: "Anonymous_Gtid", C.PREVIOUS_GTIDS_LOG_EVENT: "Previous_gtids",
    C.TRANSACTION_CONTEXT_EVENT: "Transaction_context", C.VIEW_CHANGE_EVENT: "View_change",
    C.XA_PREPARE_LOG_EVENT: "XA_prepare", C.PARTIAL_UPDATE_ROWS_EVENT: "Update_rows_partial",
    C.TRANSACTION_PAYLOAD_EVENT: "Transaction_payload", C.HEARTBEAT_LOG_EVENT_V2: "Heartbeat_v2",
    C.GTID_TAGGED_LOG_EVENT: "Gtid_tagged",
    C.MARIA_ANNOTATE_ROWS_EVENT: "Annotate_rows", C.MARIA_BINLOG_CHECKPOINT_EVENT: "Binlog_checkpoint",
    C.MARIA_GTID_EVENT: "Gtid", C.MARIA_GTID_LIST_EVENT: "Gtid_list",
    C.MARIA_START_ENCRYPTION_EVENT: "Start_encryption", C.MARIA_QUERY_COMPRESSED_EVENT: "Query_compressed",
    C.MARIA_WRITE_ROWS_COMPRESSED_EVENT_V1: "Write_rows_compressed_v1",
    C.MARIA_UPDATE_ROWS_COMPRESSED_EVENT_V1: "Update_rows_compressed_v1",
    C.MARIA_DELETE_ROWS_COMPRESSED_EVENT_V1: "Delete_rows_compressed_v1",
    C.MARIA_WRITE_ROWS_COMPRESSED_EVENT: "Write_rows_compressed",
    C.MARIA_UPDATE_ROWS_COMPRESSED_EVENT: "Update_rows_compressed",
    C.MARIA_DELETE_ROWS_COMPRESSED_EVENT: "Delete_rows_compressed",
}
_ROWS_TYPES = frozenset({
    C.WRITE_ROWS_EVENT_V1, C.UPDATE_ROWS_EVENT_V1, C.DELETE_ROWS_EVENT_V1, C.WRITE_ROWS_EVENT, C.UPDATE_ROWS_EVENT,
    C.DELETE_ROWS_EVENT, C.PARTIAL_UPDATE_ROWS_EVENT, C.MARIA_WRITE_ROWS_COMPRESSED_EVENT_V1,
    C.MARIA_UPDATE_ROWS_COMPRESSED_EVENT_V1, C.MARIA_DELETE_ROWS_COMPRESSED_EVENT_V1,
    C.MARIA_WRITE_ROWS_COMPRESSED_EVENT, C.MARIA_UPDATE_ROWS_COMPRESSED_EVENT, C.MARIA_DELETE_ROWS_COMPRESSED_EVENT,
})
_STMT_END_F = 0x0001
_INTVAR_NAMES = {1: "LAST_INSERT_ID", 2: "INSERT_ID"}


def event_type_name(type_code: int) -> str:
    return _COMMON_NAMES.get(type_code, "Unknown")


@dataclass(frozen=True)
class Request:
    """A parsed SHOW BINLOG EVENTS: the file (None: the first), the start, LIMIT's offset and count."""

    file: str | None
    position: int
    offset: int
    count: int | None


def parse_show_binlog_events(p: Parser) -> Request:
    """After SHOW BINLOG EVENTS: [IN 'file'] [FROM pos] [LIMIT [offset,] n]."""
    file = p.string() if p.accept_word("IN") else None
    position = 4
    if p.accept_word("FROM"):
        token = p.cur
        if token.kind != "number" or not isinstance(token.value, int):
            raise p.error()
        p.advance()
        position = max(token.value, 4)  # the servers start at the first event for a position inside the magic
    offset, count = parse_limit(p)
    p.end_of_statement()
    return Request(file, position, offset, count)


def resolve(env: Env, request: Request, files) -> tuple[str, str, int]:
    """(file name, path, durable size) of the file the statement names among `files` (the catalog's, with
    durable sizes); the servers' 1220 errors otherwise."""
    if not files:
        raise SqlError(ER_ERROR_WHEN_EXECUTING_COMMAND, "HY000", _WHAT + "Could not find target log")
    name = request.file if request.file is not None else files[0].name
    info = next((f for f in files if f.name == name), None)
    if info is None:
        raise SqlError(ER_ERROR_WHEN_EXECUTING_COMMAND, "HY000", _WHAT + "Could not find target log")
    if request.position > info.size:
        raise SqlError(ER_ERROR_WHEN_EXECUTING_COMMAND, "HY000", _WHAT + f"Invalid pos specified. Requested from "
                       f"pos:{request.position} is greater than actual file size:{info.size}")
    return name, str(env.ctx.store.path(name)), info.size


def read_binlog_events(path: str, name: str, size: int, request: Request, *, flavour: str,
                       max_rows: int = DEFAULT_MAX_ROWS) -> ResultSet:
    """The rows of SHOW BINLOG EVENTS for `path` read up to `size` (the durable horizon): blocking file I/O,
    run it in a worker thread. Raises SqlError 1220 for a position that is not an event's start."""
    skip = request.offset
    wanted = max_rows if request.count is None else min(request.count, max_rows)
    if wanted <= 0 and flavour == "mariadb":
        skip, wanted = 0, 1  # MariaDB 10.11 answers LIMIT [offset,] 0 with the first event, offset ignored
    rows: list[list[Any]] = []
    if wanted <= 0:
        return ResultSet(COLUMNS, rows)
    scan_budget = max_rows * _SCAN_FACTOR
    try:
        return _rows(path, name, size, request, flavour, fde_skip=skip, wanted=wanted, rows=rows,
                     scan_budget=scan_budget, max_rows=max_rows)
    except closed_files.StoredFileError as exc:  # a compressed/encrypted closed file that does not read back
        raise SqlError(ER_ERROR_WHEN_EXECUTING_COMMAND, "HY000", _WHAT + f"I/O error: {exc}") from None


def _rows(path, name, size, request, flavour, *, fde_skip, wanted, rows, scan_budget, max_rows) -> ResultSet:
    skip = fde_skip
    with closed_files.open_stream(path) as f:  # any storage form (relay/closed_files.py)
        fde = _read_fde(f, size)
        pos = request.position
        first = True
        while pos + HEADER.size <= size and len(rows) < wanted:
            f.seek(pos)
            head = f.read(HEADER.size)
            if len(head) < HEADER.size:
                break
            _, type_code, server_id, event_size, log_pos, _ = _HEADER.unpack(head)
            end = pos + event_size
            if event_size < HEADER.size or end > size or (log_pos and log_pos != end and fde is not None):
                if first:
                    raise SqlError(ER_ERROR_WHEN_EXECUTING_COMMAND, "HY000", _WHAT + "Wrong offset or I/O error")
                break  # damage past the first event: list what was read, as the servers stop at a bad event
            first = False
            scan_budget -= 1
            if scan_budget < 0:
                raise SqlError(ER_ERROR_WHEN_EXECUTING_COMMAND, "HY000",
                               _WHAT + f"LIMIT offset {request.offset} skips more than relayproxy reads in one call "
                               f"({max_rows * _SCAN_FACTOR} events); start nearer with FROM pos")
            if skip > 0:
                skip -= 1
            else:
                if event_size <= _INFO_READ_MAX:
                    f.seek(pos)
                    data = f.read(event_size)
                else:
                    data = b""
                rows.append([name, pos, event_type_name(type_code), server_id, log_pos or end,
                             _info(data, type_code, fde, flavour)])
            pos = end
    return ResultSet(COLUMNS, rows)


def _read_fde(f, size: int) -> FormatDescription | None:
    f.seek(4)
    head = f.read(HEADER.size)
    if len(head) < HEADER.size or head[4] != C.FORMAT_DESCRIPTION_EVENT:
        return None
    event_size = _HEADER.unpack(head)[3]
    if event_size > min(size - 4, 1 << 16):
        return None
    f.seek(4)
    try:
        return FormatDescription.parse(f.read(event_size), 0, event_size)
    except BinlogFormatError:
        return None


def _info(data: bytes, type_code: int, fde: FormatDescription | None, flavour: str) -> str:
    """The Info column for the common events; '' for the others or an event the relay cannot decode."""
    if not data:
        return ""
    try:
        return _info_of(data, type_code, fde, flavour)
    except (BinlogFormatError, struct.error, IndexError, ValueError):
        return ""


def _info_of(data: bytes, type_code: int, fde: FormatDescription | None, flavour: str) -> str:
    view = view_event(data, 0, fde)  # checks the header and event_size, whatever the type
    text = _view_info(view)
    return text if text is not None else _body_info(data, type_code, fde)


def _view_info(view: EventView) -> str | None:
    """Info from the fields of the event's typed view; None for a type whose Info is not read from one."""
    if isinstance(view, FormatDescriptionView):
        return f"Server ver: {view.server_version}, Binlog ver: {view.binlog_version}"
    if type(view) is QueryView:  # not its subclass ExecuteLoadQueryView, whose Info is left empty
        db = view.db
        suppress_use = view.header.flags & C.LOG_EVENT_SUPPRESS_USE_F
        return (f"use `{db.replace('`', '``')}`; " if db and not suppress_use else "") + view.query_text
    if isinstance(view, XidView):
        return f"COMMIT /* xid={view.xid} */"
    if isinstance(view, RotateView):
        return f"{view.next_file};pos={view.position}"
    if isinstance(view, MariaGtidView):
        gtid = f"{view.domain_id}-{view.header.server_id}-{view.seq_no}"
        text = ("GTID " if view.standalone else "BEGIN GTID ") + gtid
        commit_id = view.commit_id
        return text + (f" cid={commit_id}" if commit_id is not None else "")
    if isinstance(view, MariaGtidListView):
        return "[" + ",".join(f"{g.domain_id}-{g.server_id}-{g.seq_no}" for g in view.gtids) + "]"
    if isinstance(view, BinlogCheckpointView):
        return view.file_name
    if isinstance(view, GtidView):  # GTID, ANONYMOUS_GTID and (a subclass) GTID_TAGGED
        if view.type_code == C.ANONYMOUS_GTID_LOG_EVENT:
            return "SET @@SESSION.GTID_NEXT= 'ANONYMOUS'"
        return f"SET @@SESSION.GTID_NEXT= '{format_uuid(view.sid)}:{view.gno}'"
    if isinstance(view, PreviousGtidsView):
        return str(view.gtid_set)
    return None


def _body_info(data: bytes, type_code: int, fde: FormatDescription | None) -> str:
    """Info read from the raw body, for the events without a typed view that has it."""
    body = memoryview(data)[HEADER.size:]
    if type_code == C.TABLE_MAP_EVENT or type_code in _ROWS_TYPES:
        id_len = 4 if fde is not None and fde.post_header_len(type_code) == 6 else 6
        table_id = int.from_bytes(body[:id_len], "little")
        if type_code == C.TABLE_MAP_EVENT:
            pos = id_len + 2
            db_len = body[pos]
            db = bytes(body[pos + 1:pos + 1 + db_len]).decode("utf-8", "replace")
            pos += 2 + db_len
            tbl_len = body[pos]
            table = bytes(body[pos + 1:pos + 1 + tbl_len]).decode("utf-8", "replace")
            return f"table_id: {table_id} ({db}.{table})"
        flags = int.from_bytes(body[id_len:id_len + 2], "little")
        return f"table_id: {table_id}" + (" flags: STMT_END_F" if flags & _STMT_END_F else "")
    if type_code == C.MARIA_ANNOTATE_ROWS_EVENT:
        end = len(data) - (fde.checksum_len if fde is not None else 0)
        return bytes(data[HEADER.size:end]).decode("utf-8", "replace")
    if type_code == C.INTVAR_EVENT:
        kind, value = body[0], int.from_bytes(body[1:9], "little")
        return f"{_INTVAR_NAMES.get(kind, 'INVALID_INT')}={value}"
    return ""
