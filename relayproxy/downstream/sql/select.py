"""Statements about values and sessions: SELECT, DO, SET (user, session and NAMES), BEGIN / COMMIT / ROLLBACK,
USE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...wire.results import CloseConnection, OkResponse, Response, ResultSet
from ...wire.errors import ER_BAD_DB_ERROR, ER_GLOBAL_VARIABLE, ER_NO_TABLES_USED
from .errors import SqlError, unknown_variable, unsupported
from .expressions import Evaluator, Literal, Node
from ...wire.errors import ER_TOO_MANY_FIELDS, ER_WARN_ALLOW_MAX_PACKET_SIZE
from .limits import MAX_SELECT_ITEMS, too_large, value_size
from .parser import CLAUSE_WORDS, Parser, parse_limit
from .slicing import work
from .values import output_value, truthy
from .variables import binlog_checksum_value, default_collation, lookup_variable

if TYPE_CHECKING:
    from .env import Env

# -- SELECT / DO ---------------------------------------------------------------------------------

_SELECT_MODIFIERS = ("ALL", "DISTINCT", "DISTINCTROW", "HIGH_PRIORITY", "STRAIGHT_JOIN", "SQL_SMALL_RESULT",
                     "SQL_BIG_RESULT", "SQL_BUFFER_RESULT", "SQL_NO_CACHE", "SQL_CACHE", "SQL_CALC_FOUND_ROWS")


def run_select(p: Parser, env: Env) -> Response:
    p.expect_word("SELECT")
    _refuse_tables(p)
    while p.accept_word(*_SELECT_MODIFIERS):
        pass
    items: list[tuple[Node, str]] = []
    while True:
        if p.is_op("*"):
            raise SqlError(ER_NO_TABLES_USED, "HY000", "No tables used")
        start = p.cur.start
        node = p.expr()
        name = p.sql[start:p.last_end]
        if isinstance(node, Literal) and isinstance(node.value, str) and p.tokens[p.i - 1].kind == "string":
            name = node.value  # MySQL names a bare string literal's column after its value
        if p.accept_word("AS"):
            name = p.name()
        elif p.cur.kind in ("qident", "string") or (p.cur.kind == "word" and p.cur.value.upper() not in CLAUSE_WORDS):
            name = p.name()
        items.append((node, name))
        if not p.accept_op(","):
            break
        if len(items) >= MAX_SELECT_ITEMS:
            raise SqlError(ER_TOO_MANY_FIELDS, "HY000",
                           f"Too many columns (relayproxy answers at most {MAX_SELECT_ITEMS} in one SELECT)")
    if p.accept_word("FROM"):
        p.expect_word("DUAL")  # anything else was refused by _refuse_tables
    where = p.expr() if p.accept_word("WHERE") else None
    for clause in ("GROUP", "HAVING", "ORDER", "UNION", "INTO", "WINDOW", "EXCEPT", "INTERSECT"):
        if p.is_word(clause):
            raise unsupported(f"SELECT ... {clause}")
    offset, count = parse_limit(p)
    if p.accept_word("FOR"):
        p.expect_word("UPDATE", "SHARE")
    elif p.accept_word("LOCK"):
        p.expect_word("IN")
        p.expect_word("SHARE")
        p.expect_word("MODE")
    p.end_of_statement()
    ev = Evaluator(env)
    row = []
    size = 0
    for node, _ in items:
        value = output_value(node.eval(ev))
        size += value_size(value)
        if size > env.max_value_bytes:  # one row is one packet: what a server would not send, nor does the relay
            raise too_large("the row", env.max_value_bytes)
        row.append(value)
    rows = [row]
    if where is not None:
        w = where.eval(ev)
        if w is None or not truthy(w):
            rows = []
    return ResultSet([name for _, name in items], rows[offset:offset + count] if count is not None else rows[offset:])


def _refuse_tables(p: Parser) -> None:
    """A SELECT that reads a table (``FROM`` anything but ``DUAL``, outside parentheses) is refused by name,
    before its select list is parsed: ``SELECT COUNT(*) FROM information_schema.processlist`` must say
    "no tables here", not "syntax error"."""
    depth = 0
    for j in range(p.i, len(p.tokens) - 1):
        tok = p.tokens[j]
        work(1)
        if tok.kind == "op" and tok.value in "()":
            depth += 1 if tok.value == "(" else -1
        elif depth == 0 and tok.kind == "word" and tok.value.upper() == "FROM":
            nxt = p.tokens[j + 1]
            if not (nxt.kind == "word" and nxt.value.upper() == "DUAL"):
                raise unsupported(f"reading tables ('SELECT ... FROM {p.sql[nxt.start:nxt.start + 60].strip()}')")


def run_do(p: Parser, env: Env) -> Response:
    p.expect_word("DO")
    nodes = [p.expr()]
    while p.accept_op(","):
        nodes.append(p.expr())
    p.end_of_statement()
    ev = Evaluator(env)
    for node in nodes:
        node.eval(ev)
    return OkResponse()


def run_transaction(p: Parser, env: Env) -> Response:
    """BEGIN / START TRANSACTION / COMMIT / ROLLBACK: nothing to do, the relay holds no transaction."""
    word = p.advance().value.upper()
    if word == "START":
        p.expect_word("TRANSACTION")
        while p.cur.kind == "word" or p.is_op(","):
            p.advance()  # WITH CONSISTENT SNAPSHOT, READ ONLY, READ WRITE
    elif word == "BEGIN":
        p.accept_word("WORK")
    else:
        p.accept_word("WORK")
        if p.is_word("TO"):
            raise unsupported("savepoints")
        if p.accept_word("AND"):
            p.accept_word("NO")
            p.expect_word("CHAIN")
        if p.accept_word("NO"):
            p.expect_word("RELEASE")
        else:
            p.accept_word("RELEASE")
    p.end_of_statement()
    return OkResponse()


# -- SET -----------------------------------------------------------------------------------------

_CHARSET_COLLATIONS = {"latin1": "latin1_swedish_ci", "utf8": "utf8mb3_general_ci", "utf8mb3": "utf8mb3_general_ci",
                       "binary": "binary", "ascii": "ascii_general_ci"}


def _collation_of(env: Env, charset: str) -> str:
    if charset == "utf8mb4":
        return default_collation(env)
    return _CHARSET_COLLATIONS.get(charset, f"{charset}_general_ci")


def run_set(p: Parser, env: Env) -> Response:
    """SET of user variables, session variables, NAMES and CHARACTER SET.

    All right-hand sides are evaluated before anything is assigned (``SET @a = 1, @b = @a`` gives @b the
    old @a, as MariaDB does), and nothing is assigned if any part fails.
    """
    p.expect_word("SET")
    if p.is_word("GLOBAL", "PERSIST", "PERSIST_ONLY") or (p.cur.kind == "sysvar" and p.cur.value[0] == "global"):
        raise unsupported("'SET GLOBAL' (the relay's global variables follow its configuration and its master)")
    if p.is_word("PASSWORD", "ROLE", "DEFAULT"):
        raise unsupported(f"'SET {p.cur.value.upper()}'")
    if p.is_word("TRANSACTION") or (p.is_word("SESSION", "LOCAL") and p.is_word("TRANSACTION", offset=1)):
        return _set_transaction(p, env)
    user: list[tuple[str, Any]] = []
    session: list[tuple[str, Any, bool]] = []  # (name, value, reset to default)
    ev = Evaluator(env)
    while True:
        tok = p.cur
        if tok.kind == "uservar":
            p.advance()
            if p.accept_op("=", ":=") is None:
                raise p.error()
            user.append((tok.value, output_value(p.expr().eval(ev))))
        elif p.accept_word("NAMES"):
            session.extend(_set_names(p, env))
        elif p.is_word("CHARACTER", "CHARSET"):
            if p.accept_word("CHARACTER"):
                p.expect_word("SET")
            else:
                p.advance()
            charset = None if p.accept_word("DEFAULT") else p.name().lower()
            session += [("character_set_client", charset, charset is None),
                        ("character_set_results", charset, charset is None),
                        ("character_set_connection", None, True)]
        else:
            if tok.kind == "sysvar":
                p.advance()
                if tok.value[0] == "global":
                    raise unsupported("'SET GLOBAL' (the relay's global variables follow its configuration)")
                name = tok.value[1]
            else:
                p.accept_word("SESSION", "LOCAL")
                if p.is_word("GLOBAL", "PERSIST", "PERSIST_ONLY"):
                    raise unsupported("'SET GLOBAL' (the relay's global variables follow its configuration)")
                if p.cur.kind not in ("word", "qident"):
                    raise p.error()
                name = p.advance().value.lower()
            if p.accept_op("=", ":=") is None:
                raise p.error()
            var = lookup_variable(env, name)
            if var is None:
                raise unknown_variable(name)
            if not var.has_session:
                raise SqlError(ER_GLOBAL_VARIABLE, "HY000",
                               f"Variable '{name}' is a GLOBAL variable and should be set with SET GLOBAL")
            if p.accept_word("DEFAULT"):
                session.append((name, None, True))
            else:
                value = p.expr().eval(Evaluator(env, bare_words_are_strings=True))
                session.append((name, var.coerce(output_value(value)), False))
        if not p.accept_op(","):
            break
    p.end_of_statement()
    _check_user_variables(env, user)
    if any(value is None and name.lower() in _CHECKSUM_ANNOUNCEMENTS for name, value in user) \
            and binlog_checksum_value(env) is None:
        # A replica's IO thread announcing itself: told NULL, a MariaDB or MySQL replica stops for good (1593);
        # a closed connection is a network error to it, and it connects again after its connect retry.
        return CloseConnection("a replica asked for @@global.binlog_checksum, which the relay does not know yet "
                               "(it has no relay file and has not reached its master)")
    for name, value in user:
        env.conn.user_vars[name] = value
    for name, value, reset in session:
        if reset:
            env.conn.session_vars.pop(name, None)
        else:
            env.conn.session_vars[name] = value
    return OkResponse()


_CHECKSUM_ANNOUNCEMENTS = frozenset({"master_binlog_checksum", "source_binlog_checksum"})


def _check_user_variables(env: Env, assigned: list[tuple[str, Any]]) -> None:
    """One connection's user variables together hold at most ``max_statement_bytes`` (names and values): 1301
    otherwise, and nothing is assigned."""
    if not assigned:
        return
    merged = dict(env.conn.user_vars)
    merged.update(assigned)
    total = sum(len(name) + value_size(value) for name, value in merged.items())
    if total > env.max_value_bytes:
        raise SqlError(ER_WARN_ALLOW_MAX_PACKET_SIZE, "HY000",
                       f"User variables of this connection would take {total} bytes, more than max_allowed_packet "
                       f"({env.max_value_bytes}, relayproxy's max_statement_bytes): SET refused")


def _set_names(p: Parser, env: Env) -> list[tuple[str, Any, bool]]:
    names = ("character_set_client", "character_set_connection", "character_set_results", "collation_connection")
    if p.accept_word("DEFAULT"):
        return [(n, None, True) for n in names]
    charset = p.name().lower()
    collation = p.name().lower() if p.accept_word("COLLATE") else _collation_of(env, charset)
    return [(n, charset, False) for n in names[:3]] + [("collation_connection", collation, False)]


def _set_transaction(p: Parser, env: Env) -> Response:
    """SET [SESSION] TRANSACTION ISOLATION LEVEL ... | READ ONLY | READ WRITE (drivers send it)."""
    p.accept_word("SESSION", "LOCAL")
    p.expect_word("TRANSACTION")
    updates: dict[str, Any] = {}
    while True:
        if p.accept_word("ISOLATION"):
            p.expect_word("LEVEL")
            first = p.expect_word("READ", "REPEATABLE", "SERIALIZABLE")
            level = "SERIALIZABLE"
            if first == "READ":
                level = "READ-" + p.expect_word("COMMITTED", "UNCOMMITTED")
            elif first == "REPEATABLE":
                p.expect_word("READ")
                level = "REPEATABLE-READ"
            updates["transaction_isolation"] = updates["tx_isolation"] = level
        elif p.accept_word("READ"):
            read_only = int(p.expect_word("ONLY", "WRITE") == "ONLY")
            updates["transaction_read_only"] = updates["tx_read_only"] = read_only
        else:
            raise p.error()
        if not p.accept_op(","):
            break
    p.end_of_statement()
    env.conn.session_vars.update(updates)
    return OkResponse()


# -- USE -----------------------------------------------------------------------------------------


def run_use(p: Parser, env: Env) -> Response:
    p.expect_word("USE")
    name = p.name()
    p.end_of_statement()
    raise SqlError(ER_BAD_DB_ERROR, "42000", f"Unknown database '{name}' (a binlog relay holds no schemas)")
