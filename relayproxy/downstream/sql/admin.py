"""Statements that change the relay: PURGE BINARY LOGS (refused while a replica still reads a file; needs an
admin account)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...log import get_logger
from ...relay import closed_files
from ...relay.retention import readers_in, readers_of
from ...wire.results import OkResponse, Response
from ..users import find_user
from .errors import (
    ER_LOG_IN_USE,
    ER_LOG_PURGE_UNKNOWN_ERR,
    ER_SPECIFIC_ACCESS_DENIED_ERROR,
    ER_UNKNOWN_TARGET_BINLOG,
    ER_WRONG_ARGUMENTS,
    SqlError,
)
from .expressions import Evaluator
from .parser import Parser
from .values import _to_datetime

log = get_logger("relayproxy.downstream.sql")

if TYPE_CHECKING:
    from .env import Env

# -- PURGE ---------------------------------------------------------------------------------------


def _purge(p: Parser, env: Env) -> Response:
    """PURGE BINARY|MASTER LOGS TO 'file' | BEFORE <datetime>: delete relay files before a point.

    Refused, with nothing deleted, while a connected replica's dump still reads one of those files
    (it would lose its stream); the error names the file and the connection (the same readers the
    retention policy respects: ``relay.retention.readers_of``). The relay's current file is never
    purged. Needs an ``admin`` account (MySQL: SUPER or BINLOG_ADMIN), checked once the target is
    known to exist, so a missing file gets 1373 as on a server.
    """
    p.expect_word("PURGE")
    p.expect_word("BINARY", "MASTER")
    p.expect_word("LOGS")
    store = env.ctx.store
    files = store.files()
    if p.accept_word("TO"):
        target = p.string()
        p.end_of_statement()
        if target not in files:
            listing = f"{files[0]} .. {files[-1]}" if files else "none"
            raise SqlError(ER_UNKNOWN_TARGET_BINLOG, "HY000",
                           f"Target log not found in binlog index: '{target}' is not a relay file (relay files: {listing})")
        _require_binlog_admin(env)
        keep_from = target
    else:
        p.expect_word("BEFORE")
        when = p.expr().eval(Evaluator(env))
        p.end_of_statement()
        cutoff = _to_datetime(when) if when is not None else None
        if cutoff is None:
            raise SqlError(ER_WRONG_ARGUMENTS, "HY000", f"Incorrect arguments to PURGE LOGS BEFORE: {when!r} is not a datetime")
        _require_binlog_admin(env)
        keep_from = files[-1] if files else None
        limit = cutoff.timestamp()
        for name in files[:-1]:  # the current file always stays
            try:
                if closed_files.stored_stat(store.path(name)).st_mtime >= limit:
                    keep_from = name
                    break
            except OSError:
                continue
        if keep_from is None:
            return OkResponse()
    doomed = files[:files.index(keep_from)]
    if not doomed:
        return OkResponse()
    readers = readers_in(readers_of(env.ctx.connections), doomed)
    if readers:
        first = readers[0]
        others = f" and {len(readers) - 1} more" if len(readers) > 1 else ""
        oldest = min(doomed.index(r.file) for r in readers)
        raise SqlError(
            ER_LOG_IN_USE, "HY000",
            f"A purgeable log is in use, will not purge: {first.file} is being read by {first.who}{others}; "
            f"nothing was purged (PURGE BINARY LOGS TO '{doomed[oldest]}' is possible now)",
        )
    try:
        purged = store.purge_to(keep_from)
    except KeyError:
        raise SqlError(ER_UNKNOWN_TARGET_BINLOG, "HY000", "Target log not found in binlog index") from None
    except Exception as exc:  # the store failed (I/O error): say so, the files that remain are intact
        raise SqlError(ER_LOG_PURGE_UNKNOWN_ERR, "HY000", f"Unknown error during log purge: {exc}") from None
    for name in purged:
        env.catalog.forget(name)
    log.info("relay files purged", files=purged, conn_id=env.conn.conn_id, user=env.conn.user)
    return OkResponse(info=f"purged {len(purged)} relay file(s): {purged[0]} .. {purged[-1]}" if purged else "")


def _require_binlog_admin(env: Env) -> None:
    """PURGE deletes files: only an account declared with ``admin = true`` may (MySQL's SUPER /
    BINLOG_ADMIN, MariaDB's BINLOG ADMIN). ``relayproxy serve`` refuses every purge itself (read-only),
    whoever asks, so its refusal is the one a client sees there."""
    if getattr(env.ctx.store, "read_only", False):
        return
    account = find_user(getattr(env.ctx.cfg, "users", None) or (), env.conn.user, env.conn.host)
    if account is not None and account.admin:
        return
    privileges = "SUPER or BINLOG_ADMIN" if env.mysql else "BINLOG ADMIN"
    raise SqlError(
        ER_SPECIFIC_ACCESS_DENIED_ERROR, "42000",
        f"Access denied; you need (at least one of) the {privileges} privilege(s) for this operation "
        f"(relayproxy: the account needs admin = true in [[users]])",
    )
