"""Statements that change the relay: PURGE BINARY LOGS (refused while a replica still reads a file; needs the
binlog_admin privilege), KILL (another account's connection needs admin) and FLUSH HOSTS (admin)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...log import get_logger
from ...relay import closed_files
from ...relay.retention import readers_in, readers_of
from ...wire.results import OkResponse, Response
from .. import privileges
from ...wire.errors import (
    ER_KILL_DENIED_ERROR,
    ER_LOG_IN_USE,
    ER_LOG_PURGE_UNKNOWN_ERR,
    ER_NO_SUCH_THREAD,
    ER_UNKNOWN_TARGET_BINLOG,
    ER_WRONG_ARGUMENTS,
)
from .errors import SqlError, unsupported
from .expressions import Evaluator
from .parser import Parser
from .values import to_datetime

log = get_logger("relayproxy.downstream.sql")

if TYPE_CHECKING:
    from .env import Env

# -- PURGE ---------------------------------------------------------------------------------------


def run_purge(p: Parser, env: Env) -> Response:
    """PURGE BINARY|MASTER LOGS TO 'file' | BEFORE <datetime>: delete relay files before a point.

    Refused, with nothing deleted, while a connected replica's dump still reads one of those files
    (it would lose its stream); the error names the file and the connection (the same readers the
    retention policy respects: ``relay.retention.readers_of``). The relay's current file is never
    purged. Needs binlog_admin (MySQL: SUPER or BINLOG_ADMIN), checked once the target is
    known to exist, so a missing file gets 1373 as on a server.
    """
    p.expect_word("PURGE")
    p.expect_word("BINARY", "MASTER")
    p.expect_word("LOGS")
    store = env.ctx.store
    files = store.files()
    keep_from: str | None
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
        cutoff = to_datetime(when) if when is not None else None
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
    # With archive_url, a file not yet sealed in the bucket stays (relay/archive.py): purging it would lose it.
    archive = getattr(getattr(env.ctx, "replication", None), "archive", None)
    held = archive.hold_from() if archive is not None else None
    if archive is not None and held in doomed:
        raise SqlError(
            ER_LOG_IN_USE, "HY000",
            f"A purgeable log is in use, will not purge: {held} is not yet sealed in the archive "
            f"({archive.bucket.url}); nothing was purged"
            + (f" (PURGE BINARY LOGS TO '{held}' is possible now)" if doomed.index(held) else ""),
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
    """PURGE deletes files: only an account with binlog_admin (or admin) may (MySQL's SUPER / BINLOG_ADMIN,
    MariaDB's BINLOG ADMIN). ``relayproxy serve`` refuses every purge itself (read-only), whoever asks, so its
    refusal is the one a client sees there."""
    if env.ctx.store.read_only:
        return
    env.require(privileges.PURGE)


# -- KILL, FLUSH HOSTS ---------------------------------------------------------------------------------------


def run_kill(p: Parser, env: Env) -> Response:
    """KILL [CONNECTION | QUERY] id: end a connection (a replica's dump, a stuck client). As on the servers, an
    account may kill its own connections; another account's needs admin (1095 "You are not owner of thread",
    the servers' answer, not 1227). KILL QUERY ends a running dump (a dump is its connection's query) and does
    nothing to an idle connection: the relay's other statements finish at once."""
    p.expect_word("KILL")
    query_only = p.accept_word("QUERY") is not None
    if not query_only:
        p.accept_word("CONNECTION")
    token = p.cur
    if token.kind != "number" or not isinstance(token.value, int):
        raise p.error()
    p.advance()
    p.end_of_statement()
    conn_id = token.value
    target = env.ctx.connections.get(conn_id)
    if target is None:
        raise SqlError(ER_NO_SUCH_THREAD, "HY000", f"Unknown thread id: {conn_id}")
    if target.user != env.conn.user and not privileges.has(env.ctx, env.conn, privileges.ADMIN):
        raise SqlError(ER_KILL_DENIED_ERROR, "HY000", f"You are not owner of thread {conn_id}")
    if query_only and target.dump is None:
        return OkResponse()
    kill = getattr(env.ctx, "kill_connection", None)
    if kill is None or not kill(conn_id):
        raise SqlError(ER_NO_SUCH_THREAD, "HY000", f"Unknown thread id: {conn_id}")
    log.info("connection killed", killed_conn_id=conn_id, killed_user=target.user, conn_id=env.conn.conn_id,
             user=env.conn.user, query_only=query_only)
    return OkResponse()


def run_flush(p: Parser, env: Env) -> Response:
    """FLUSH HOSTS: unblock every host blocked after max_connect_errors failed logins and forget the counts (the
    servers' RELOAD privilege: admin). Other FLUSH statements are refused by name."""
    p.expect_word("FLUSH")
    p.accept_word("LOCAL", "NO_WRITE_TO_BINLOG")
    if not p.accept_word("HOSTS"):
        what = p.cur.value.upper() if p.cur.kind == "word" else ""
        raise unsupported(f"'FLUSH {what}'" if what else "'FLUSH'")
    p.end_of_statement()
    env.require(privileges.FLUSH_HOSTS)
    flush = getattr(env.ctx, "flush_hosts", None)
    unblocked = flush() if flush is not None else 0
    log.info("hosts flushed", conn_id=env.conn.conn_id, user=env.conn.user, unblocked=unblocked)
    return OkResponse()
