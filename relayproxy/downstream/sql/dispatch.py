"""Running one statement: ``execute`` (the coroutine the server awaits, disk reads moved to a worker thread),
``execute_sync``, and the dispatch from a statement's first word to its handler."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ...log import PeerLogLimiter, get_logger, report_failure
from ...relay.catalog import CatalogError, FileCatalog
from ...wire.results import ErrorResponse, Response
from ..context import ConnectionState
from .admin import run_flush, run_kill, run_purge
from .binlog_events import read_binlog_events
from .env import Env
from ...wire.errors import ER_EMPTY_QUERY, ER_UNKNOWN_ERROR
from .errors import SqlError, unsupported
from .functions import gtids_at
from .limits import check_statement_size
from .parser import Parser, Token, tokenize
from .replication import is_replication_statement, replication_statement
from .replay import run_replay
from .select import run_do, run_select, run_set, run_transaction, run_use
from .show import run_show, prepare_binlog_events
from .slicing import run_sliced, work

log = get_logger("relayproxy.downstream.sql")
_FAILURE_LOG = PeerLogLimiter()  # unexpected failures logged per client host and minute

# ---------------------------------------------------------------------------------------------
# Statements


async def execute(ctx, conn: ConnectionState, sql: str) -> Response:
    """Answer one COM_QUERY (what ``downstream/session.py`` awaits): OkResponse, ResultSet or ErrorResponse.

    The statement runs on the event loop's thread in slices (``slicing.run_sliced``): its tokenizing, parsing
    and evaluation give the loop a turn every ``slicing.WORK_PER_SLICE`` units of work, so no statement, whatever
    its shape, holds the upstream session, the dumps or /status for more than a slice (invariant 7). It is
    tokenized once. The two answers that may read a lot of relay data are computed in a worker thread first:
    ``BINLOG_GTID_POS('file', pos)`` with literal arguments (a MariaDB replica's form; it reads the file up to
    ``pos``) and the first ``gtid_purged`` (the catalog scans each closed file once). Never raises.
    """
    if isinstance(sql, (bytes, bytearray)):
        sql = bytes(sql).decode("utf-8", "replace")
    prefetched: dict[tuple[str, int], Any] = {}
    try:
        check_statement_size(ctx, sql)
        tokens = await run_sliced(tokenize, sql)
    except SqlError as exc:
        return exc.response()
    first, second = ([t.value.upper() if t.kind == "word" else None for t in tokens[:2]] + [None, None])[:2]
    if is_replication_statement(first, second):
        return await replication_statement(ctx, conn, sql)
    if first == "SHOW" and second == "BINLOG" and len(tokens) > 2 and tokens[2].kind == "word" \
            and tokens[2].value.upper() == "EVENTS":
        return await _show_binlog_events(ctx, conn, sql, tokens)
    try:
        await _prefetch(ctx, tokens, prefetched)
    except Exception:  # only an optimisation: the statement computes what is missing itself
        log.exception("prefetch for SQL statement failed", statement=sql[:200])
    return await run_sliced(_execute, ctx, conn, sql, prefetched, tokens)


async def _show_binlog_events(ctx, conn: ConnectionState, sql: str, tokens: list[Token]) -> Response:
    """SHOW BINLOG EVENTS: parsed and checked here (in slices), the file read in a worker thread (never on the
    loop)."""
    env = Env(ctx, conn)

    def prepare():
        parser = Parser(sql, tokens, env.flavour)
        parser.expect_word("SHOW")
        return prepare_binlog_events(parser, env)

    try:
        path, name, size, request, max_rows = await run_sliced(prepare)
        return await asyncio.to_thread(read_binlog_events, path, name, size, request, flavour=env.flavour,
                                       max_rows=max_rows)
    except SqlError as exc:
        return exc.response()
    except Exception as exc:
        ref = report_failure(log, _FAILURE_LOG, conn.host, "SHOW BINLOG EVENTS failed unexpectedly", exc,
                             statement=sql[:200], conn_id=conn.conn_id)
        return ErrorResponse(ER_UNKNOWN_ERROR, "HY000",
                             f"relayproxy internal error (reference {ref}) answering SHOW BINLOG EVENTS")


def _prefetch_wanted(tokens: list[Token]) -> tuple[list[tuple[str, Any]], bool]:
    """What ``_prefetch`` reads ahead for a statement: its ``BINLOG_GTID_POS('file', pos)`` calls with literal
    arguments, and whether it reads ``gtid_purged``. One pass over the tokens, charged to the statement's slice."""
    calls: list[tuple[str, Any]] = []
    purged = False
    show = bool(tokens) and tokens[0].kind == "word" and tokens[0].value.upper() == "SHOW"
    for i, tok in enumerate(tokens):
        if not i & 7:
            work(1)
        if tok.kind == "word":
            word = tok.value.upper()
            if word == "BINLOG_GTID_POS":
                args = tokens[i + 1:i + 6]
                if [t.kind for t in args] == ["op", "string", "op", "number", "op"] and args[0].value == "(" \
                        and args[2].value == "," and args[4].value == ")":
                    calls.append((args[1].value, args[3].value))
            elif show and word == "VARIABLES":
                purged = True
        elif tok.kind == "sysvar" and tok.value[1] == "gtid_purged":
            purged = True
    return calls, purged


async def _prefetch(ctx, tokens: list[Token], prefetched: dict[tuple[str, int], Any]) -> None:
    calls, mentions_purged = await run_sliced(_prefetch_wanted, tokens)
    catalog: FileCatalog | None = None
    for name, position in calls:
        catalog = catalog or ctx.catalog
        try:
            info = next((f for f in catalog.files() if f.name == name), None)
            if info is None or not isinstance(position, int) or not 4 < position <= info.size:
                continue
            path = ctx.store.path(name)
        except (CatalogError, KeyError):
            continue  # the statement itself answers NULL
        prefetched[(str(path), position)] = await asyncio.to_thread(gtids_at, path, position)
    if mentions_purged and ctx.flavour != "mariadb":
        catalog = catalog or ctx.catalog
        try:
            await asyncio.to_thread(catalog.purged)  # fills the catalog's per-file cache
        except CatalogError:
            pass  # the statement reports it, naming the file


def execute_sync(ctx, conn: ConnectionState, sql: str) -> Response:
    """Answer one COM_QUERY synchronously (sans I/O callers and tests): never raises.

    An unexpected failure is logged and reported as ERR 1105 naming the statement, so one bad answer
    ends one statement, not the connection or the relay.
    """
    if isinstance(sql, (bytes, bytearray)):
        sql = bytes(sql).decode("utf-8", "replace")
    return _execute(ctx, conn, sql, {})


def _execute(ctx, conn: ConnectionState, sql: str, prefetched: dict[tuple[str, int], Any],
             tokens: list[Token] | None = None) -> Response:
    env = Env(ctx, conn, prefetched)
    try:
        check_statement_size(ctx, sql)
        if tokens is None:
            tokens = tokenize(sql)
        if tokens[0].kind == "eof" or (tokens[0].kind == "op" and tokens[0].value == ";" and tokens[1].kind == "eof"):
            return ErrorResponse(ER_EMPTY_QUERY, "42000", "Query was empty")
        parser = Parser(sql, tokens, env.flavour)
        return _dispatch(parser, env)
    except SqlError as exc:
        return exc.response()
    except Exception as exc:  # a bug must not take the connection down: say which statement hit it
        # One line with a reference id the client also gets, at most a few a minute per client host: a
        # statement that trips a bug must not fill the disk with tracebacks (those are at debug level).
        detail = f"{exc.__class__.__name__}: {str(exc)[:200]}"
        ref = report_failure(log, _FAILURE_LOG, conn.host, "SQL statement failed unexpectedly", exc,
                             statement=sql[:200], conn_id=conn.conn_id)
        return ErrorResponse(ER_UNKNOWN_ERROR, "HY000",
                             f"relayproxy internal error (reference {ref}) answering '{sql[:80]}': {detail}")


# Statements MySQL knows that a relay refuses: named in the error, never silently accepted.
_KNOWN_UNSUPPORTED = frozenset({
    "ALTER", "ANALYZE", "BINLOG", "CACHE", "CALL", "CHANGE", "CHECK", "CHECKSUM", "CLONE", "CREATE", "DEALLOCATE",
    "DELETE", "DESC", "DESCRIBE", "DROP", "EXECUTE", "EXPLAIN", "GET", "GRANT", "HANDLER", "HELP", "IMPORT",
    "INSERT", "INSTALL", "LOAD", "LOCK", "OPTIMIZE", "PREPARE", "RELEASE", "RENAME", "REPAIR", "REPLACE",
    "RESET", "RESIGNAL", "RESTART", "REVOKE", "SAVEPOINT", "SHUTDOWN", "SIGNAL", "STOP", "TABLE", "TRUNCATE",
    "UNINSTALL", "UNLOCK", "UPDATE", "VALUES", "WITH", "XA",
})


def _statement_name(parser: Parser) -> str:
    words = [t.value.upper() for t in parser.tokens[:2] if t.kind == "word"]
    return " ".join(words) or parser.sql.strip()[:40]


def _dispatch(p: Parser, env: Env) -> Response:
    first = p.cur
    word = first.value.upper() if first.kind == "word" else None
    handler = _HANDLERS.get(word or "")
    if handler is not None:
        return handler(p, env)
    second = p.tokens[1].value.upper() if len(p.tokens) > 1 and p.tokens[1].kind == "word" else None
    if is_replication_statement(word, second):
        raise SqlError(ER_UNKNOWN_ERROR, "HY000", f"'{_statement_name(p)}' needs the relay's event loop (execute)")
    if word == "START":
        if p.is_word("TRANSACTION", offset=1):
            return run_transaction(p, env)
        raise unsupported(f"'{_statement_name(p)}'")
    if word in _KNOWN_UNSUPPORTED:
        raise unsupported(f"'{_statement_name(p)}' statements")
    if first.kind == "op" and first.value == "(":
        raise unsupported("parenthesised queries")
    raise p.error()


_HANDLERS: dict[str, Callable[[Parser, Env], Response]] = {
    "SELECT": run_select,
    "SET": run_set,
    "SHOW": run_show,
    "PURGE": run_purge,
    "KILL": run_kill,
    "FLUSH": run_flush,
    "RELAYPROXY": run_replay,
    "DO": run_do,
    "USE": run_use,
    "BEGIN": run_transaction,
    "COMMIT": run_transaction,
    "ROLLBACK": run_transaction,
}
