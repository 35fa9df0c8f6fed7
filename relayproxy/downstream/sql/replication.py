"""The replication admin statements an HA tool sends to repoint a replica, answered by the relay about its own
upstream: STOP SLAVE | REPLICA, CHANGE MASTER TO | CHANGE REPLICATION SOURCE TO, START SLAVE | REPLICA, RESET
SLAVE | REPLICA. Parsing is ``downstream/sql/replication_parser.py``; the work is the upstream session's, reached
through ``ctx.replication`` (``ReplicationControl``, bound by ``commands/run.py``). Admin accounts only (1227).

These statements wait on the session (STOP SLAVE returns once the upstream connection is closed at a
transaction boundary), so they run in ``execute`` (async), never in ``execute_sync``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ...log import PeerLogLimiter, get_logger, report_failure
from ...wire.errors import ER_BAD_SLAVE
from ...wire.results import ErrorResponse, OkResponse, Response
from .. import privileges
from ...wire.errors import ER_NOT_SUPPORTED_YET
from .errors import SqlError
from .replication_parser import (
    AdminStatementError,
    ChangeMaster,
    ResetReplica,
    StartReplica,
    StopReplica,
    check_flavour,
    parse_admin_statement,
)
from .slicing import run_sliced

if TYPE_CHECKING:
    from ..context import ConnectionState

log = get_logger("relayproxy.downstream.sql")
_FAILURE_LOG = PeerLogLimiter()  # unexpected failures logged per client host and minute

_FIRST_WORDS = frozenset({"STOP", "START", "CHANGE", "RESET"})


def is_replication_statement(first_word: str | None, second_word: str | None) -> bool:
    """Whether a statement starting with these words is one of ours (``START TRANSACTION``, ``RESET MASTER`` ...
    are not: the caller answers those)."""
    if first_word not in _FIRST_WORDS:
        return False
    if first_word == "CHANGE":
        return second_word in ("MASTER", "REPLICATION")
    return second_word in ("SLAVE", "REPLICA", "ALL")


def _denied(ctx, conn: ConnectionState) -> ErrorResponse | None:
    denied = privileges.denial(ctx, conn, privileges.REPLICATION_ADMIN)
    return ErrorResponse(*denied) if denied is not None else None


async def replication_statement(ctx, conn: ConnectionState, sql: str) -> Response:
    """Answer one replication admin statement; never raises."""
    flavour = ctx.flavour
    try:
        # In slices, as every statement (slicing.py): the tokenizer's bounds and pauses apply here too.
        statement = await run_sliced(functools.partial(parse_admin_statement, sql, flavour=flavour))
        if statement is None:
            return ErrorResponse(ER_NOT_SUPPORTED_YET, "42000", f"relayproxy does not support '{sql.strip()[:40]}'")
        check_flavour(statement, flavour)
    except AdminStatementError as exc:
        return ErrorResponse(exc.code, exc.sqlstate, exc.message)
    except SqlError as exc:  # past a tokenizer bound (limits.py)
        return exc.response()
    denied = _denied(ctx, conn)
    if denied is not None:
        return denied
    control = getattr(ctx, "replication", None)
    if control is None:
        return ErrorResponse(ER_BAD_SLAVE, "HY000", "The server is not configured as slave; fix in config file or "
                             "with CHANGE MASTER TO (relayproxy serve has no master: it serves files)")
    who = {"conn_id": conn.conn_id, "user": conn.user, "client": conn.host}
    try:
        if isinstance(statement, StopReplica):
            if not statement.io_thread:
                return OkResponse(info="the relay has no SQL thread: nothing to stop")
            stopped = await control.stop_replica()
            log.info("STOP SLAVE", **who, was_running=stopped)
            return OkResponse(info="" if stopped else "Slave already has been stopped")
        if isinstance(statement, StartReplica):
            if not statement.io_thread:
                return OkResponse(info="the relay has no SQL thread: nothing to start")
            started = control.start_replica()
            log.info("START SLAVE", **who, was_stopped=started)
            return OkResponse(info="" if started else "Slave is already running")
        if isinstance(statement, ChangeMaster):
            info = control.change_master(dict(statement.options), flavour=flavour)
            log.info("CHANGE MASTER", **who, master=info.address, options=sorted(statement.options))
            return OkResponse()
        if isinstance(statement, ResetReplica):
            return ErrorResponse(
                ER_NOT_SUPPORTED_YET, "42000",
                "relayproxy does not support 'RESET SLAVE': it would discard the relay files replicas read. "
                "Repoint with STOP SLAVE; CHANGE MASTER TO ...; START SLAVE, and remove files with PURGE BINARY LOGS")
    except Exception as exc:  # the session's refusal (ReplicationAdminError) or a file-system error saving it
        code = getattr(exc, "code", None)
        if code is not None:
            return ErrorResponse(code, getattr(exc, "sqlstate", "HY000"), getattr(exc, "message", str(exc)))
        ref = report_failure(log, _FAILURE_LOG, conn.host, "replication admin statement failed", exc, **who)
        return ErrorResponse(1105, "HY000", f"relayproxy internal error (reference {ref}): {type(exc).__name__}: "
                             f"{str(exc)[:200]}")
    return ErrorResponse(ER_NOT_SUPPORTED_YET, "42000", f"relayproxy does not support '{sql.strip()[:40]}'")
