"""SHOW RELAYPROXY TRANSACTION[S] ...: the relay's transaction index (relay/txindex.py) over SQL, read in a worker
thread.

    SHOW RELAYPROXY TRANSACTION FOR GTID 'g'
    SHOW RELAYPROXY TRANSACTION AT TIME 'T'                       the first transaction committed at or after T
    SHOW RELAYPROXY TRANSACTIONS FOR TABLE 'db.t' FROM 'T1' TO 'T2' [LIMIT n]
    SHOW RELAYPROXY TRANSACTIONS BETWEEN 'file' pos AND 'file' pos

A time without a zone is UTC on the SQL port (``Z`` or ``+HH:MM`` may be given). A transaction row is
``File, Start_pos, End_pos, Gtid, Commit_time, Commit_us, Second_resolution, Tables`` (Commit_time in UTC,
'YYYY-MM-DD HH:MM:SS.ffffff'; Tables a comma list); BETWEEN answers one row ``Transactions, Bytes, First_file,
Last_file, Files``. Nothing found: an empty result set. Needs the privilege of SHOW BINLOG EVENTS.
"""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING

from ...relay import txindex
from ...wire.errors import ER_WRONG_ARGUMENTS
from ...wire.results import ResultSet
from .. import privileges
from .errors import SqlError
from .parser import Parser, parse_limit
from .slicing import in_thread

if TYPE_CHECKING:
    from .env import Env

TRANSACTION_COLUMNS = ("File", "Start_pos", "End_pos", "Gtid", "Commit_time", "Commit_us", "Second_resolution",
                       "Tables")
SPAN_COLUMNS = ("Transactions", "Bytes", "First_file", "Last_file", "Files")
DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000


def _bad(what: str) -> SqlError:
    return SqlError(ER_WRONG_ARGUMENTS, "HY000", f"Incorrect arguments to SHOW RELAYPROXY TRANSACTION: {what}")


def _row(t: txindex.Transaction) -> list:
    return [t.file, t.start, t.end, t.gtid, txindex.format_time_utc(t.commit_us), t.commit_us,
            int(t.second_resolution), ",".join(t.tables)]


def _time(text: str) -> int:
    try:
        return txindex.parse_time(text, _dt.timezone.utc)
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _position(p: Parser) -> tuple[str, int]:
    name = p.string()
    tok = p.cur
    if tok.kind != "number" or not isinstance(tok.value, int):
        raise p.error()
    p.advance()
    return name, tok.value


def run_show_relayproxy(p: Parser, env: Env) -> ResultSet:
    """After SHOW: RELAYPROXY TRANSACTION ... / TRANSACTIONS ..."""
    p.expect_word("RELAYPROXY")
    plural = p.expect_word("TRANSACTION", "TRANSACTIONS") == "TRANSACTIONS"
    if not plural:
        if p.accept_word("FOR"):
            p.expect_word("GTID")
            gtid = p.string()
            p.end_of_statement()
            env.require(privileges.SHOW_BINLOG_EVENTS)
            try:
                txindex.parse_gtid(gtid)
            except ValueError as exc:
                raise _bad(str(exc)) from None
            index = txindex.index_of(env.ctx.store)
            found = in_thread(index.by_gtid, gtid)
        else:
            p.expect_word("AT")
            p.expect_word("TIME")
            at = _time(p.string())
            p.end_of_statement()
            env.require(privileges.SHOW_BINLOG_EVENTS)
            index = txindex.index_of(env.ctx.store)
            found = in_thread(index.first_at_or_after, at)
        return ResultSet(TRANSACTION_COLUMNS, [_row(found)] if found is not None else [])
    if p.accept_word("FOR"):
        p.expect_word("TABLE")
        table = p.string()
        p.expect_word("FROM")
        lo = _time(p.string())
        p.expect_word("TO")
        hi = _time(p.string())
        offset, count = parse_limit(p)
        p.end_of_statement()
        env.require(privileges.SHOW_BINLOG_EVENTS)
        if "." not in table:
            raise _bad(f"table {table!r} is not db.table")
        if offset:
            raise _bad("LIMIT takes no offset here")
        limit = DEFAULT_LIMIT if count is None else count
        if not 0 <= limit <= MAX_LIMIT:
            raise _bad(f"LIMIT must be 0 .. {MAX_LIMIT}")
        if limit == 0:
            return ResultSet(TRANSACTION_COLUMNS, [])
        index = txindex.index_of(env.ctx.store)
        found = in_thread(index.touching, table, lo, hi, limit)
        return ResultSet(TRANSACTION_COLUMNS, [_row(t) for t in found])
    p.expect_word("BETWEEN")
    start = _position(p)
    p.expect_word("AND")
    end = _position(p)
    p.end_of_statement()
    env.require(privileges.SHOW_BINLOG_EVENTS)
    index = txindex.index_of(env.ctx.store)
    try:
        span = in_thread(index.span, start, end)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    return ResultSet(SPAN_COLUMNS, [[span.transactions, span.bytes, span.first_file, span.last_file,
                                     ",".join(span.files)]])
