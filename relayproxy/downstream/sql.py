"""The SQL the relay answers: what replica IO threads, HA managers, drivers and command-line clients send.

A binlog relay is not a database. It answers the statements its clients need in order to replicate
from it, watch it and manage its files (protocol-reference §3.5, §3.11, §4.4), from its own state:

- ``SELECT`` of literals, ``@@system`` and ``@user`` variables and a few functions (``IFNULL``,
  ``COALESCE``, ``UNIX_TIMESTAMP``, ``NOW``, ``VERSION``, ``BINLOG_GTID_POS``, ``GTID_SUBTRACT`` ...),
  with MySQL's column names (the expression text as typed, or the alias);
- ``SET @user = ...``, ``SET [SESSION] var = ...``, ``SET NAMES``, ``SET CHARACTER SET``;
- ``SHOW [GLOBAL|SESSION] VARIABLES / STATUS [LIKE | WHERE]``, ``SHOW MASTER STATUS`` /
  ``SHOW BINARY LOG STATUS``, ``SHOW BINARY LOGS``, ``SHOW SLAVE|REPLICA STATUS``,
  ``SHOW ALL SLAVES STATUS`` (MariaDB), ``SHOW SLAVE HOSTS`` / ``SHOW REPLICAS``, ``SHOW PROCESSLIST``,
  ``SHOW WARNINGS``, ``SHOW DATABASES``;
- ``PURGE BINARY LOGS TO 'file' | BEFORE <datetime>`` (refused while a replica still reads a file);
- ``BEGIN`` / ``COMMIT`` / ``ROLLBACK`` / ``DO`` (trivially true: the relay holds no transactions).

Everything the relay advertises comes from the durable horizon (design.md): positions, GTID sets and
file sizes never include a transaction that is not complete and fsynced. Every other statement gets
a clear ERR naming it (1235, or 1064 for malformed syntax), never an OK that did nothing.

The variables live in one table, ``SYSTEM_VARIABLES``; add an entry there to answer a new one.
``execute`` is the coroutine the server awaits; ``execute_sync`` is the same without the event loop.
Neither does network I/O. Disk work: ``PURGE`` unlinks files (on the caller's thread, the one that owns
the store); ``BINLOG_GTID_POS`` reads one relay file up to the position and the first ``gtid_purged``
scans closed files, both moved to a worker thread by ``execute``.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import functools
import os
import re
import socket
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .. import __version__
from ..binlog.events import split_version
from ..binlog.gtid import GtidSet, MariaBinlogState
from ..binlog.reader import BinlogScanner
from ..log import get_logger
from ..ops.status import relay_status
from ..relay.catalog import CatalogError, FileCatalog
from ..relay.retention import readers_in, readers_of
from ..wire.results import ErrorResponse, OkResponse, Response, ResultSet
from .context import ConnectionState
from .users import find_user

__all__ = ["execute", "execute_sync", "SqlError", "SysVar", "SYSTEM_VARIABLES", "STATUS_VARIABLES", "tokenize"]

log = get_logger(__name__)

# ---------------------------------------------------------------------------------------------
# Errors: MySQL codes and SQLSTATEs, because a replica or a driver decides what to do from them
# (a MySQL replica accepts ER_UNKNOWN_SYSTEM_VARIABLE for GTID_MODE and semi-sync, nothing else).

ER_UNKNOWN_ERROR = 1105
ER_EMPTY_QUERY = 1065
ER_PARSE_ERROR = 1064
ER_NOT_SUPPORTED_YET = 1235
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
ER_INCORRECT_GLOBAL_LOCAL_VAR = 1238
ER_GLOBAL_VARIABLE = 1229
ER_WRONG_VALUE_FOR_VAR = 1231
ER_WRONG_TYPE_FOR_VAR = 1232
ER_BAD_FIELD_ERROR = 1054
ER_NO_TABLES_USED = 1096
ER_SP_DOES_NOT_EXIST = 1305
ER_BAD_DB_ERROR = 1049
ER_UNKNOWN_TARGET_BINLOG = 1373
ER_LOG_IN_USE = 1378
ER_LOG_PURGE_UNKNOWN_ERR = 1379
ER_SPECIFIC_ACCESS_DENIED_ERROR = 1227
ER_WRONG_ARGUMENTS = 1210
ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT = 1582
ER_MALFORMED_GTID_SET_SPECIFICATION = 1772
ER_REPLICA_CHANNEL_DOES_NOT_EXIST = 3074
WARN_NO_MASTER_INFO = 1617


class SqlError(Exception):
    """A statement failed; becomes the ERR packet the client sees."""

    def __init__(self, code: int, sqlstate: str, message: str):
        super().__init__(message)
        self.code = code
        self.sqlstate = sqlstate
        self.message = message

    def response(self) -> ErrorResponse:
        return ErrorResponse(self.code, self.sqlstate, self.message)


def _unsupported(what: str) -> SqlError:
    return SqlError(
        ER_NOT_SUPPORTED_YET,
        "42000",
        f"relayproxy does not support {what}: a binlog relay answers replication, monitoring and "
        "connection-setup statements only",
    )


def _unknown_variable(name: str) -> SqlError:
    return SqlError(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")


# ---------------------------------------------------------------------------------------------
# Tokenizer


@dataclass(frozen=True, slots=True)
class Token:
    """One lexical token. ``start``/``end`` index the original text (column names are slices of it).

    kinds: ``word`` (keyword or bare identifier, value as written), ``qident`` (`quoted`), ``string``,
    ``number`` (int or float), ``sysvar`` (value ``(scope or None, lower-case name)``), ``uservar``
    (lower-case name), ``op``, ``eof``.
    """

    kind: str
    value: Any
    start: int
    end: int


_WORD_RE = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]+")
_USERVAR_RE = re.compile(r"[A-Za-z0-9_$.\u0080-\U0010ffff]+")
_NUMBER_RE = re.compile(r"0[xX][0-9A-Fa-f]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_OPERATORS = ("<=>", ":=", "<=", ">=", "<>", "!=", "||", "&&", "(", ")", ",", ".", "=", "<", ">", "+", "-",
              "*", "/", "%", ";", "!", "~", "^", "&", "|")
# MySQL string escapes; \% and \_ keep their backslash (they only mean something to LIKE).
_ESCAPES = {"0": "\0", "'": "'", '"': '"', "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a",
            "\\": "\\", "%": "\\%", "_": "\\_"}
_SCOPES = {"global": "global", "session": "session", "local": "session"}
_EXECUTABLE_COMMENT_RE = re.compile(r"/\*M?!\d*")


def _line_of(sql: str, pos: int) -> int:
    return sql.count("\n", 0, pos) + 1


def _syntax_error(sql: str, pos: int, flavour: str = "mysql") -> SqlError:
    near = sql[pos:pos + 80]
    product = "MariaDB" if flavour == "mariadb" else "MySQL"
    return SqlError(
        ER_PARSE_ERROR,
        "42000",
        f"You have an error in your SQL syntax; check the manual that corresponds to your {product} server "
        f"version for the right syntax to use near '{near}' at line {_line_of(sql, pos)}",
    )


def _read_quoted(sql: str, i: int, quote: str, *, escapes: bool) -> tuple[str, int]:
    """The text of a quoted string or identifier opening at ``sql[i]``, and the index after it."""
    out: list[str] = []
    j, n = i + 1, len(sql)
    while j < n:
        c = sql[j]
        if escapes and c == "\\" and j + 1 < n:
            out.append(_ESCAPES.get(sql[j + 1], sql[j + 1]))
            j += 2
            continue
        if c == quote:
            if j + 1 < n and sql[j + 1] == quote:
                out.append(quote)
                j += 2
                continue
            return "".join(out), j + 1
        out.append(c)
        j += 1
    raise _syntax_error(sql, i)


def _read_name(sql: str, i: int) -> tuple[str, int]:
    """A bare or `quoted` name at ``i`` (for @@variables)."""
    if i < len(sql) and sql[i] == "`":
        return _read_quoted(sql, i, "`", escapes=False)
    m = _WORD_RE.match(sql, i)
    if m is None:
        raise _syntax_error(sql, i)
    return m.group(), m.end()


def tokenize(sql: str) -> list[Token]:
    """Split a statement into tokens, dropping comments.

    ``/*! ... */`` and ``/*M! ... */`` (executable comments, as mysqldump and clients write them) are
    read as SQL, their version number skipped; other ``/* */``, ``-- `` and ``#`` comments are dropped.
    """
    tokens: list[Token] = []
    i, n = 0, len(sql)
    in_executable = False
    while True:
        # Whitespace and comments.
        while i < n:
            c = sql[i]
            if c.isspace():
                i += 1
            elif sql.startswith("/*", i):
                m = _EXECUTABLE_COMMENT_RE.match(sql, i)
                if m is not None and not in_executable:
                    in_executable = True
                    i = m.end()
                    continue
                end = sql.find("*/", i + 2)
                if end < 0:
                    raise _syntax_error(sql, i)
                i = end + 2
            elif in_executable and sql.startswith("*/", i):
                in_executable = False
                i += 2
            elif c == "#" or (sql.startswith("--", i) and (i + 2 >= n or sql[i + 2].isspace() or ord(sql[i + 2]) < 32)):
                end = sql.find("\n", i)
                i = n if end < 0 else end + 1
            else:
                break
        if i >= n:
            tokens.append(Token("eof", None, n, n))
            return tokens
        c = sql[i]
        start = i
        if c in "'\"":
            value, i = _read_quoted(sql, i, c, escapes=True)
            tokens.append(Token("string", value, start, i))
        elif c == "`":
            value, i = _read_quoted(sql, i, "`", escapes=False)
            tokens.append(Token("qident", value, start, i))
        elif sql.startswith("@@", i):
            name, i = _read_name(sql, i + 2)
            scope = None
            if i < n and sql[i] == "." and name.lower() in _SCOPES:
                scope = _SCOPES[name.lower()]
                name, i = _read_name(sql, i + 1)
            tokens.append(Token("sysvar", (scope, name.lower()), start, i))
        elif c == "@":
            if i + 1 < n and sql[i + 1] in "'\"`":
                name, i = _read_quoted(sql, i + 1, sql[i + 1], escapes=sql[i + 1] != "`")
            else:
                m = _USERVAR_RE.match(sql, i + 1)
                if m is None:
                    raise _syntax_error(sql, i)
                name, i = m.group(), m.end()
            tokens.append(Token("uservar", name.lower(), start, i))
        else:
            m = _NUMBER_RE.match(sql, i)
            word = _WORD_RE.match(sql, i)
            if m is not None and not (word is not None and word.end() > m.end()):
                text = m.group()
                if text[:2].lower() == "0x":
                    value: int | float = int(text, 16)
                elif any(ch in text for ch in ".eE"):
                    value = float(text)
                else:
                    value = int(text)
                i = m.end()
                tokens.append(Token("number", value, start, i))
            elif word is not None:
                i = word.end()
                tokens.append(Token("word", word.group(), start, i))
            else:
                for op in _OPERATORS:
                    if sql.startswith(op, i):
                        i += len(op)
                        tokens.append(Token("op", op, start, i))
                        break
                else:
                    raise _syntax_error(sql, i)


# ---------------------------------------------------------------------------------------------
# Expressions: a small tree and its evaluation. MySQL semantics where a client could notice them:
# NULL propagates, strings compare case-insensitively, a string meets a number as a number.


class _Node:
    __slots__ = ()

    def eval(self, ev: "_Evaluator") -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _Literal(_Node):
    value: Any

    def eval(self, ev: "_Evaluator") -> Any:
        return self.value


@dataclass(frozen=True, slots=True)
class _SysVarRef(_Node):
    scope: str | None
    name: str

    def eval(self, ev: "_Evaluator") -> Any:
        return ev.env.read_variable(self.name, self.scope)


@dataclass(frozen=True, slots=True)
class _UserVarRef(_Node):
    name: str

    def eval(self, ev: "_Evaluator") -> Any:
        return ev.env.conn.user_vars.get(self.name)


@dataclass(frozen=True, slots=True)
class _ColumnRef(_Node):
    name: str

    def eval(self, ev: "_Evaluator") -> Any:
        if ev.row is not None:
            key = self.name.lower()
            if key in ev.row:
                return ev.row[key]
        if ev.bare_words_are_strings:
            return self.name  # SET sql_mode = ANSI, SET autocommit = ON
        raise SqlError(ER_BAD_FIELD_ERROR, "42S22", f"Unknown column '{self.name}' in 'field list'")


@dataclass(frozen=True, slots=True)
class _Call(_Node):
    name: str  # upper case
    args: tuple[_Node, ...]

    def eval(self, ev: "_Evaluator") -> Any:
        spec = _FUNCTIONS.get(self.name)
        if spec is None or not spec.exists(ev.env):
            raise SqlError(
                ER_SP_DOES_NOT_EXIST, "42000",
                f"FUNCTION {self.name.lower()} does not exist (relayproxy evaluates only "
                f"{', '.join(sorted(n for n, f in _FUNCTIONS.items() if f.exists(ev.env)))})",
            )
        if not spec.min_args <= len(self.args) <= spec.max_args:
            raise SqlError(ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT, "42000",
                           f"Incorrect parameter count in the call to native function '{self.name}'")
        return spec.fn(ev.env, [a.eval(ev) for a in self.args])


@dataclass(frozen=True, slots=True)
class _Unary(_Node):
    op: str  # "-", "+", "NOT", "~"
    operand: _Node

    def eval(self, ev: "_Evaluator") -> Any:
        v = self.operand.eval(ev)
        if v is None:
            return None
        if self.op == "NOT":
            return int(not _truthy(v))
        if self.op == "~":
            return ~int(_to_number(v)) & 0xFFFFFFFFFFFFFFFF
        number = _to_number(v)
        return -number if self.op == "-" else number


@dataclass(frozen=True, slots=True)
class _Logic(_Node):
    op: str  # "AND" | "OR"
    left: _Node
    right: _Node

    def eval(self, ev: "_Evaluator") -> Any:
        a = self.left.eval(ev)
        b = self.right.eval(ev)
        ta = None if a is None else _truthy(a)
        tb = None if b is None else _truthy(b)
        if self.op == "AND":
            if ta is False or tb is False:
                return 0
            return None if ta is None or tb is None else 1
        if ta or tb:
            return 1
        return None if ta is None or tb is None else 0


@dataclass(frozen=True, slots=True)
class _Compare(_Node):
    op: str
    left: _Node
    right: _Node

    def eval(self, ev: "_Evaluator") -> Any:
        a = self.left.eval(ev)
        b = self.right.eval(ev)
        if self.op == "<=>":
            if a is None or b is None:
                return int(a is None and b is None)
            return int(_compare(a, b) == 0)
        c = _compare(a, b)
        if c is None:
            return None
        return int({"=": c == 0, "!=": c != 0, "<>": c != 0, "<": c < 0, ">": c > 0, "<=": c <= 0,
                    ">=": c >= 0}[self.op])


@dataclass(frozen=True, slots=True)
class _Arith(_Node):
    op: str
    left: _Node
    right: _Node

    def eval(self, ev: "_Evaluator") -> Any:
        a = self.left.eval(ev)
        b = self.right.eval(ev)
        if a is None or b is None:
            return None
        x, y = _to_number(a), _to_number(b)
        if self.op == "+":
            return x + y
        if self.op == "-":
            return x - y
        if self.op == "*":
            return x * y
        if y == 0:
            return None  # MySQL: division by zero is NULL (with a warning)
        if self.op == "/":
            return x / y
        if self.op == "DIV":
            return int(x / y)
        return x - y * int(x / y)  # MOD / %: the sign follows the dividend, as in MySQL


_INTERVAL_UNITS = {
    "MICROSECOND": _dt.timedelta(microseconds=1), "SECOND": _dt.timedelta(seconds=1),
    "MINUTE": _dt.timedelta(minutes=1), "HOUR": _dt.timedelta(hours=1), "DAY": _dt.timedelta(days=1),
    "WEEK": _dt.timedelta(weeks=1),
}


@dataclass(frozen=True, slots=True)
class _IntervalArith(_Node):
    """``<datetime> + INTERVAL n unit`` / ``- INTERVAL`` (``PURGE BINARY LOGS BEFORE NOW() - INTERVAL 3 DAY``)."""

    left: _Node
    sign: int
    amount: _Node
    unit: str

    def eval(self, ev: "_Evaluator") -> Any:
        base = self.left.eval(ev)
        amount = self.amount.eval(ev)
        if base is None or amount is None:
            return None
        moment = _to_datetime(base)
        if moment is None:
            return None
        return moment + self.sign * _to_number(amount) * _INTERVAL_UNITS[self.unit]


@dataclass(frozen=True, slots=True)
class _Like(_Node):
    subject: _Node
    pattern: _Node
    negate: bool
    escape: str = "\\"

    def eval(self, ev: "_Evaluator") -> Any:
        s = self.subject.eval(ev)
        p = self.pattern.eval(ev)
        if s is None or p is None:
            return None
        hit = _like_regex(_to_text(p), self.escape).match(_to_text(s)) is not None
        return int(hit != self.negate)


@dataclass(frozen=True, slots=True)
class _In(_Node):
    subject: _Node
    items: tuple[_Node, ...]
    negate: bool

    def eval(self, ev: "_Evaluator") -> Any:
        s = self.subject.eval(ev)
        if s is None:
            return None
        saw_null = False
        for item in self.items:
            v = item.eval(ev)
            if v is None:
                saw_null = True
            elif _compare(s, v) == 0:
                return int(not self.negate)
        return None if saw_null else int(self.negate)


@dataclass(frozen=True, slots=True)
class _Between(_Node):
    subject: _Node
    low: _Node
    high: _Node
    negate: bool

    def eval(self, ev: "_Evaluator") -> Any:
        s, lo, hi = self.subject.eval(ev), self.low.eval(ev), self.high.eval(ev)
        a, b = _compare(s, lo), _compare(s, hi)
        if a is None or b is None:
            return None
        return int((a >= 0 and b <= 0) != self.negate)


@dataclass(frozen=True, slots=True)
class _Is(_Node):
    subject: _Node
    what: str  # NULL | TRUE | FALSE
    negate: bool

    def eval(self, ev: "_Evaluator") -> Any:
        v = self.subject.eval(ev)
        if self.what == "NULL":
            hit = v is None
        elif self.what == "TRUE":
            hit = v is not None and _truthy(v)
        else:
            hit = v is not None and not _truthy(v)
        return int(hit != self.negate)


def _to_number(v: Any) -> int | float:
    """MySQL's implicit string-to-number conversion: the longest numeric prefix, 0 when there is none."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, _dt.datetime):
        return int(v.strftime("%Y%m%d%H%M%S"))
    text = v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)
    m = re.match(r"\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", text)
    if m is None:
        return 0
    number = m.group().strip()
    try:
        return int(number)
    except ValueError:
        return float(number)


def _truthy(v: Any) -> bool:
    return _to_number(v) != 0


def _to_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    return str(_output(v))


def _compare(a: Any, b: Any) -> int | None:
    if a is None or b is None:
        return None
    if isinstance(a, _dt.datetime) or isinstance(b, _dt.datetime):
        x, y = _to_datetime(a), _to_datetime(b)
        if x is None or y is None:
            return None
        return (x > y) - (x < y)
    if isinstance(a, (str, bytes)) and isinstance(b, (str, bytes)):
        x_s, y_s = _to_text(a).casefold().rstrip(" "), _to_text(b).casefold().rstrip(" ")
        return (x_s > y_s) - (x_s < y_s)
    x, y = _to_number(a), _to_number(b)
    return (x > y) - (x < y)


@functools.lru_cache(maxsize=256)
def _like_regex(pattern: str, escape: str = "\\") -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.IGNORECASE | re.DOTALL)


_DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d", "%Y%m%d%H%M%S",
                     "%Y%m%d")


def _to_datetime(v: Any) -> _dt.datetime | None:
    if isinstance(v, _dt.datetime):
        return v
    text = _to_text(v).strip().replace("T", " ")
    for fmt in _DATETIME_FORMATS:
        try:
            return _dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
    return None


def _output(v: Any) -> Any:
    """A value as the result set carries it (str, bytes, int, float or None)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, _dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, _dt.date):
        return v.isoformat()
    return v


class _Evaluator:
    __slots__ = ("env", "row", "bare_words_are_strings")

    def __init__(self, env: "_Env", row: dict[str, Any] | None = None, *, bare_words_are_strings: bool = False):
        self.env = env
        self.row = row
        self.bare_words_are_strings = bare_words_are_strings


# ---------------------------------------------------------------------------------------------
# Per-statement view of the relay: one horizon snapshot, so every value in one answer agrees.

_cached_catalog: tuple["weakref.ref[Any]", FileCatalog] | None = None


def _catalog_for(ctx) -> FileCatalog:
    """The FileCatalog of the context's current store, kept between statements.

    Keeping it matters: ``gtid_purged`` scans closed files once and file headers are read once. A
    ``ctx.catalog`` for that store is used when the server provides one; otherwise the last one built
    here is reused while the store is the same object (a store reopened after a failure gets a fresh
    one, and only one is ever kept, so nothing accumulates).
    """
    global _cached_catalog
    store = ctx.store
    shared = getattr(ctx, "catalog", None)
    if isinstance(shared, FileCatalog) and getattr(shared, "_store", None) is store:
        return shared
    if _cached_catalog is not None and _cached_catalog[0]() is store:
        return _cached_catalog[1]
    catalog = FileCatalog(store)
    _cached_catalog = (weakref.ref(store), catalog)
    return catalog


class _Env:
    """What one statement sees: the context, the connection, and one snapshot of the horizon."""

    def __init__(self, ctx, conn: ConnectionState, prefetched: dict[tuple[str, int], Any] | None = None):
        self.ctx = ctx
        self.conn = conn
        self.now = time.time()
        # BINLOG_GTID_POS scans done off the event loop before the statement ran: (path, pos) -> result.
        self.prefetched = prefetched or {}

    @functools.cached_property
    def snapshot(self):
        return self.ctx.horizon.snapshot()

    @functools.cached_property
    def flavour(self) -> str:
        return self.ctx.flavour

    @property
    def mysql(self) -> bool:
        return self.flavour != "mariadb"

    @functools.cached_property
    def version(self) -> str:
        """The version string clients see in @@version (MariaDB's "5.5.5-" handshake prefix removed)."""
        version = self.ctx.server_version
        return version[6:] if version.startswith("5.5.5-") else version

    @functools.cached_property
    def version_tuple(self) -> tuple[int, int, int]:
        return split_version(self.version)

    def at_least(self, *version: int) -> bool:
        return self.version_tuple >= version

    @functools.cached_property
    def catalog(self) -> FileCatalog:
        return _catalog_for(self.ctx)

    def master_var(self, name: str) -> Any:
        """A variable of the upstream master, when the session recorded it (``status.extra["master_variables"]``).

        Some answers (binlog_format, binlog_row_image, gtid_mode ...) describe the stream, whose truth
        is on the master; the upstream session may capture them at connect time, and they are used
        here when present.
        """
        extra = getattr(self.ctx.session.status, "extra", None) or {}
        variables = extra.get("master_variables") or {}
        return variables.get(name)

    @property
    def mysql_gtids(self) -> GtidSet | None:
        gtids = self.snapshot.gtids
        return gtids if isinstance(gtids, GtidSet) else None

    @property
    def maria_state(self) -> MariaBinlogState:
        gtids = self.snapshot.gtids
        return gtids if isinstance(gtids, MariaBinlogState) else MariaBinlogState()

    def read_variable(self, name: str, scope: str | None) -> Any:
        """``@@name`` / ``@@global.name`` / ``@@session.name`` as SELECT shows it (booleans as 1/0)."""
        var = _lookup_variable(self, name)
        session = self.conn.session_vars
        if var is None:
            if scope != "global" and name in session:
                return session[name]
            raise _unknown_variable(name)
        if scope == "global":
            if not var.has_global:
                raise SqlError(ER_INCORRECT_GLOBAL_LOCAL_VAR, "HY000", f"Variable '{name}' is a SESSION variable")
            return var.select_value(self)
        if scope == "session" and not var.has_session:
            raise SqlError(ER_INCORRECT_GLOBAL_LOCAL_VAR, "HY000", f"Variable '{name}' is a GLOBAL variable")
        if var.has_session and name in session:
            return session[name]
        return var.select_value(self)


# ---------------------------------------------------------------------------------------------
# System variables: the one table of answers.


def _always(env: _Env) -> bool:
    return True


def _mysql_only(env: _Env) -> bool:
    return env.mysql


def _mariadb_only(env: _Env) -> bool:
    return not env.mysql


def _mysql_since(*version: int) -> Callable[[_Env], bool]:
    def check(env: _Env) -> bool:
        return env.mysql and env.at_least(*version)

    return check


def _not_mysql8(env: _Env) -> bool:
    return not (env.mysql and env.at_least(8, 0, 0))


@dataclass(frozen=True)
class SysVar:
    """One system variable the relay answers.

    ``value(env)`` gives the global value; ``kind`` says how it prints (``bool``: 1/0 in SELECT, ON/OFF
    in SHOW VARIABLES). ``has_session``: a session may read ``@@session.x`` and ``SET x``;
    ``has_global``: ``@@global.x`` exists. ``exists(env)`` hides variables the emulated server does not
    have, so ``SELECT @@x`` gets the ERR 1193 a real server of that flavour/version would send (a MySQL
    replica treats 1193 on GTID_MODE and semi-sync as "feature absent").
    """

    name: str
    value: Callable[[_Env], Any]
    kind: str = "str"  # str | int | bool
    has_session: bool = True
    has_global: bool = True
    exists: Callable[[_Env], bool] = _always
    doc: str = ""

    def select_value(self, env: _Env) -> Any:
        value = self.value(env)
        if self.kind == "bool" and value is not None:
            return int(bool(value))
        return value

    def show_value(self, value: Any) -> str:
        if value is None:
            return ""
        if self.kind == "bool":
            return "ON" if _truthy(value) else "OFF"
        return str(value)

    def coerce(self, value: Any) -> Any:
        """A value assigned with SET, normalised to this variable's kind."""
        if value is None:
            return None
        if self.kind == "bool":
            if isinstance(value, str):
                word = value.strip().upper()
                if word in ("ON", "TRUE", "YES"):
                    return 1
                if word in ("OFF", "FALSE", "NO"):
                    return 0
            number = _to_number(value)
            if number not in (0, 1):
                raise SqlError(ER_WRONG_VALUE_FOR_VAR, "42000",
                               f"Variable '{self.name}' can't be set to the value of '{_to_text(value)}'")
            return int(number)
        if self.kind == "int":
            if isinstance(value, str) and not re.fullmatch(r"\s*[+-]?\d+\s*", value):
                raise SqlError(ER_WRONG_TYPE_FOR_VAR, "42000", f"Incorrect argument type to variable '{self.name}'")
            return int(_to_number(value))
        return _to_text(value)


def _binlog_checksum(env: _Env) -> str:
    """The relay's checksum algorithm, from its current file's FORMAT_DESCRIPTION (what the dump sends)."""
    fde = env.ctx.store.format_description
    if fde is None:
        return "CRC32"  # nothing received yet; every supported master writes CRC32 by default
    return fde.checksum_name or "NONE"  # a pre-5.6 file carries no checksums


def _gtid_mode(env: _Env) -> str:
    override = env.master_var("gtid_mode")
    if override:
        return str(override).upper()
    gtids = env.mysql_gtids
    return "ON" if env.ctx.cfg.gtid_mode == "mysql" or (gtids is not None and bool(gtids)) else "OFF"


def _gtid_executed(env: _Env) -> str:
    gtids = env.mysql_gtids
    return gtids.format(",\n") if gtids is not None else ""


def _gtid_purged(env: _Env) -> str:
    try:
        purged = env.catalog.purged()
    except CatalogError as exc:
        raise SqlError(ER_UNKNOWN_ERROR, "HY000", f"cannot compute gtid_purged: {exc}") from None
    return purged.format(",\n") if isinstance(purged, GtidSet) else ""


def _default_collation(env: _Env) -> str:
    return "utf8mb4_0900_ai_ci" if env.mysql and env.at_least(8, 0, 0) else "utf8mb4_general_ci"


def _sql_mode(env: _Env) -> str:
    if not env.mysql:
        return "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION"
    if env.at_least(8, 0, 0):
        return ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
                "NO_ENGINE_SUBSTITUTION")
    return ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
            "NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION")


def _listen_port(env: _Env) -> int:
    listen = getattr(env.ctx.cfg, "listen", None)
    return int(listen[1]) if listen else 3306


def _system_time_zone(env: _Env) -> str:
    return time.strftime("%Z") or "UTC"


def _version_comment(env: _Env) -> str:
    return f"relayproxy {__version__} binlog relay"


def _semi_sync(env: _Env) -> bool:
    return bool(getattr(env.ctx.cfg, "semi_sync", False))


def _from_master(name: str, default: Any) -> Callable[[_Env], Any]:
    """The master's value when the upstream session recorded it, else ``default`` (a value or ``f(env)``)."""

    def value(env: _Env) -> Any:
        found = env.master_var(name)
        if found is not None:
            return found
        return default(env) if callable(default) else default

    return value


SYSTEM_VARIABLES: tuple[SysVar, ...] = (
    # -- identity: the relay's own, never the master's (a replica refuses a master with its own id/uuid)
    SysVar("server_id", lambda e: e.ctx.server_id, "int", has_session=False, doc="the relay's --server-id"),
    SysVar("server_uuid", lambda e: e.ctx.server_uuid, has_session=False, exists=_mysql_only),
    SysVar("hostname", lambda e: socket.gethostname(), has_session=False),
    SysVar("port", _listen_port, "int", has_session=False),
    SysVar("report_host", lambda e: None, has_session=False),
    SysVar("report_port", _listen_port, "int", has_session=False),
    SysVar("version", lambda e: e.version, has_session=False),
    SysVar("version_comment", _version_comment, has_session=False),
    SysVar("license", lambda e: "GPL", has_session=False),
    # -- what kind of server this is: a read-only binlog server that logs its master's events
    SysVar("read_only", lambda e: True, "bool", has_session=False),
    SysVar("super_read_only", lambda e: True, "bool", has_session=False, exists=_mysql_only),
    SysVar("log_bin", lambda e: True, "bool", has_session=False),
    SysVar("log_slave_updates", lambda e: True, "bool", has_session=False,
           doc="1: the relay's binlogs are its master's events, so replicas below it can be relocated"),
    SysVar("log_replica_updates", lambda e: True, "bool", has_session=False, exists=_mysql_since(8, 0, 26)),
    SysVar("binlog_format", _from_master("binlog_format", lambda e: "ROW" if e.mysql else "MIXED")),
    SysVar("binlog_row_image", _from_master("binlog_row_image", "FULL")),
    SysVar("binlog_row_metadata", lambda e: e.master_var("binlog_row_metadata") or "MINIMAL", has_session=False,
           # MySQL 8.0.1+ always has it (default MINIMAL); MariaDB 10.5+ too; earlier servers do not.
           exists=lambda e: e.master_var("binlog_row_metadata") is not None
           or (e.mysql and e.at_least(8, 0, 1)) or (not e.mysql and e.at_least(10, 5, 0)),
           doc="only when the upstream session recorded the master's value"),
    SysVar("binlog_checksum", _binlog_checksum, has_session=False),
    SysVar("master_info_repository", lambda e: "TABLE", has_session=False, exists=_mysql_only),
    SysVar("relay_log_info_repository", lambda e: "TABLE", has_session=False, exists=_mysql_only),
    # -- GTIDs, from the horizon (MySQL) or the horizon's binlog state (MariaDB)
    SysVar("gtid_mode", _gtid_mode, has_session=False, exists=_mysql_only),
    SysVar("enforce_gtid_consistency", lambda e: "ON" if _gtid_mode(e) == "ON" else "OFF", has_session=False,
           exists=_mysql_only),
    SysVar("gtid_executed", _gtid_executed, has_session=False, exists=_mysql_only),
    SysVar("gtid_purged", _gtid_purged, has_session=False, exists=_mysql_only),
    SysVar("gtid_binlog_pos", lambda e: str(e.maria_state.current_position()), has_session=False,
           exists=_mariadb_only),
    SysVar("gtid_binlog_state", lambda e: str(e.maria_state), has_session=False, exists=_mariadb_only),
    SysVar("gtid_current_pos", lambda e: str(e.maria_state.current_position()), has_session=False,
           exists=_mariadb_only, doc="= gtid_binlog_pos: the relay applies nothing, it only logs"),
    SysVar("gtid_slave_pos", lambda e: "", has_session=False, exists=_mariadb_only,
           doc="empty: the relay applies no transaction"),
    SysVar("gtid_domain_id", _from_master("gtid_domain_id", 0), "int", exists=_mariadb_only),
    SysVar("gtid_strict_mode", _from_master("gtid_strict_mode", False), "bool", has_session=False,
           exists=_mariadb_only),
    SysVar("gtid_ignore_duplicates", lambda e: False, "bool", has_session=False, exists=_mariadb_only),
    # -- semi-sync toward the relay's replicas (config semi_sync)
    SysVar("rpl_semi_sync_master_enabled", _semi_sync, "bool", has_session=False),
    SysVar("rpl_semi_sync_source_enabled", _semi_sync, "bool", has_session=False, exists=_mysql_since(8, 0, 26)),
    # -- what drivers and client libraries read at connect time
    SysVar("max_allowed_packet", lambda e: 1 << 30, "int"),
    SysVar("net_write_timeout", lambda e: 60, "int"),
    SysVar("net_read_timeout", lambda e: 30, "int"),
    SysVar("net_buffer_length", lambda e: 16384, "int"),
    SysVar("wait_timeout", lambda e: 28800, "int"),
    SysVar("interactive_timeout", lambda e: 28800, "int"),
    SysVar("connect_timeout", lambda e: 10, "int", has_session=False),
    SysVar("character_set_client", lambda e: "utf8mb4"),
    SysVar("character_set_connection", lambda e: "utf8mb4"),
    SysVar("character_set_results", lambda e: "utf8mb4"),
    SysVar("character_set_server", lambda e: "utf8mb4"),
    SysVar("character_set_database", lambda e: "utf8mb4"),
    SysVar("character_set_system", lambda e: "utf8mb3", has_session=False),
    SysVar("collation_connection", _default_collation),
    SysVar("collation_server", _default_collation),
    SysVar("collation_database", _default_collation),
    SysVar("sql_mode", _sql_mode),
    SysVar("time_zone", lambda e: "SYSTEM"),
    SysVar("system_time_zone", _system_time_zone, has_session=False),
    SysVar("lower_case_table_names", lambda e: 0, "int", has_session=False),
    SysVar("init_connect", lambda e: "", has_session=False),
    SysVar("performance_schema", lambda e: False, "bool", has_session=False),
    SysVar("autocommit", lambda e: True, "bool"),
    SysVar("auto_increment_increment", lambda e: 1, "int"),
    SysVar("auto_increment_offset", lambda e: 1, "int"),
    SysVar("tx_isolation", lambda e: "REPEATABLE-READ"),
    SysVar("transaction_isolation", lambda e: "REPEATABLE-READ"),
    SysVar("tx_read_only", lambda e: False, "bool"),
    SysVar("transaction_read_only", lambda e: False, "bool"),
    SysVar("query_cache_size", lambda e: 0, "int", has_session=False, exists=_not_mysql8),
    SysVar("query_cache_type", lambda e: "OFF", exists=_not_mysql8),
    SysVar("sql_log_bin", lambda e: True, "bool", has_global=False),
    SysVar("skip_replication", lambda e: False, "bool", has_global=False,
           doc="MariaDB replicas SET it with replicate_events_marked_for_skip=FILTER_ON_MASTER"),
)

_VARIABLES_BY_NAME: dict[str, SysVar] = {v.name: v for v in SYSTEM_VARIABLES}


def _lookup_variable(env: _Env, name: str) -> SysVar | None:
    var = _VARIABLES_BY_NAME.get(name)
    return var if var is not None and var.exists(env) else None


@dataclass(frozen=True)
class StatusVar:
    """One SHOW STATUS counter."""

    name: str
    value: Callable[[_Env], Any]
    exists: Callable[[_Env], bool] = _always


def _uptime(env: _Env) -> int:
    return max(int(env.now - env.ctx.started), 0)


def _semi_sync_clients(env: _Env) -> int:
    return sum(1 for c in env.ctx.connections.values() if c.dump is not None and c.dump.semi_sync)


STATUS_VARIABLES: tuple[StatusVar, ...] = (
    StatusVar("Uptime", _uptime),
    StatusVar("Uptime_since_flush_status", _uptime),
    StatusVar("Threads_connected", lambda e: len(e.ctx.connections)),
    StatusVar("Threads_running", lambda e: 1),
    StatusVar("Slave_running", lambda e: "ON" if e.ctx.session.status.io_running else "OFF", exists=_mariadb_only),
    StatusVar("Rpl_semi_sync_master_status", lambda e: "ON" if _semi_sync(e) else "OFF"),
    StatusVar("Rpl_semi_sync_master_clients", _semi_sync_clients),
    StatusVar("Rpl_semi_sync_source_status", lambda e: "ON" if _semi_sync(e) else "OFF",
              exists=_mysql_since(8, 0, 26)),
    StatusVar("Rpl_semi_sync_source_clients", _semi_sync_clients, exists=_mysql_since(8, 0, 26)),
)


# ---------------------------------------------------------------------------------------------
# Functions


@dataclass(frozen=True)
class _Function:
    fn: Callable[[_Env, list[Any]], Any]
    min_args: int = 0
    max_args: int = 0
    exists: Callable[[_Env], bool] = _always


def _first_not_null(env: _Env, args: list[Any]) -> Any:
    return next((a for a in args if a is not None), None)


def _if(env: _Env, args: list[Any]) -> Any:
    return args[1] if args[0] is not None and _truthy(args[0]) else args[2]


def _nullif(env: _Env, args: list[Any]) -> Any:
    return None if _compare(args[0], args[1]) == 0 else args[0]


def _unix_timestamp(env: _Env, args: list[Any]) -> Any:
    if not args:
        return int(env.now)
    if args[0] is None:
        return None
    moment = _to_datetime(args[0])
    return int(moment.timestamp()) if moment is not None else None


def _now(env: _Env, args: list[Any]) -> Any:
    return _dt.datetime.fromtimestamp(int(env.now))


def _utc_now(env: _Env, args: list[Any]) -> Any:
    return _dt.datetime.fromtimestamp(int(env.now), _dt.timezone.utc).replace(tzinfo=None)


def _user(env: _Env, args: list[Any]) -> Any:
    return f"{env.conn.user}@{env.conn.host}"


def _concat(env: _Env, args: list[Any]) -> Any:
    return None if any(a is None for a in args) else "".join(_to_text(a) for a in args)


def _gtid_set_arg(value: Any) -> GtidSet:
    try:
        return GtidSet.parse(_to_text(value))
    except ValueError:
        raise SqlError(ER_MALFORMED_GTID_SET_SPECIFICATION, "HY000",
                       f"Malformed GTID set specification '{_to_text(value)[:200]}'.") from None


def _gtid_subset(env: _Env, args: list[Any]) -> Any:
    if args[0] is None or args[1] is None:
        return None
    return int(_gtid_set_arg(args[0]).is_subset(_gtid_set_arg(args[1])))


def _gtid_subtract(env: _Env, args: list[Any]) -> Any:
    if args[0] is None or args[1] is None:
        return None
    return _gtid_set_arg(args[0]).subtract(_gtid_set_arg(args[1])).format(",\n")


def _binlog_gtid_pos(env: _Env, args: list[Any]) -> Any:
    """MariaDB's BINLOG_GTID_POS(file, pos): the GTID position at a file/position of the relay's binlog.

    It is the file's starting state plus every group that completes before ``pos``. A position that is
    not at a group boundary, beyond the durable horizon, or in no relay file gives NULL (a MariaDB
    replica in file/position mode asks it to learn its GTID position and tolerates NULL). The relay
    never names a position inside a transaction, where MariaDB would count the open group as done.
    """
    name, pos = args
    if name is None or pos is None:
        return None
    position = _to_number(pos)
    if not isinstance(position, int) or position < 4:
        return None
    try:
        info = next((f for f in env.catalog.files() if f.name == _to_text(name)), None)
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
        gtids = env.prefetched[key] if key in env.prefetched else _gtids_at(path, position)
        if gtids is _NOT_A_BOUNDARY:
            return None
        if gtids is None:
            gtids = info.start_gtids  # before the file's PREVIOUS_GTIDS / GTID_LIST: its starting set
    if isinstance(gtids, MariaBinlogState):
        return str(gtids.current_position())
    if isinstance(gtids, GtidSet):
        return gtids.format(",")
    return None


_NOT_A_BOUNDARY = object()
_SCAN_CHUNK = 1 << 20


def _gtids_at(path, position: int) -> Any:
    """GTID set after the groups that end at or before ``position`` (which must be a group boundary)."""
    scanner = BinlogScanner()
    remaining = position
    try:
        with open(path, "rb") as f:
            while remaining > 0:
                chunk = f.read(min(_SCAN_CHUNK, remaining))
                if not chunk:
                    return _NOT_A_BOUNDARY  # the file is shorter than asked: purged or cut under us
                scanner.feed(chunk)
                remaining -= len(chunk)
    except OSError:
        return _NOT_A_BOUNDARY
    result = scanner.finish()
    if not result.ok or result.partial_tail or result.good_end != position:
        return _NOT_A_BOUNDARY
    return result.gtids_after


_FUNCTIONS: dict[str, _Function] = {
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
    "LOWER": _Function(lambda e, a: None if a[0] is None else _to_text(a[0]).lower(), 1, 1),
    "LCASE": _Function(lambda e, a: None if a[0] is None else _to_text(a[0]).lower(), 1, 1),
    "UPPER": _Function(lambda e, a: None if a[0] is None else _to_text(a[0]).upper(), 1, 1),
    "UCASE": _Function(lambda e, a: None if a[0] is None else _to_text(a[0]).upper(), 1, 1),
    "BINLOG_GTID_POS": _Function(_binlog_gtid_pos, 2, 2),
    "GTID_SUBSET": _Function(_gtid_subset, 2, 2, exists=_mysql_only),
    "GTID_SUBTRACT": _Function(_gtid_subtract, 2, 2, exists=_mysql_only),
}

# Functions MySQL lets you call without parentheses.
_BARE_FUNCTIONS = frozenset({"CURRENT_TIMESTAMP", "CURRENT_USER", "CURRENT_DATE", "LOCALTIME", "LOCALTIMESTAMP"})


# ---------------------------------------------------------------------------------------------
# Parser (recursive descent over the token list)

# Words that end a select item: after them comes a clause, not an alias.
_CLAUSE_WORDS = frozenset({
    "FROM", "WHERE", "LIMIT", "INTO", "FOR", "UNION", "ORDER", "GROUP", "HAVING", "LOCK", "WINDOW", "AND", "OR",
    "XOR", "NOT", "LIKE", "IN", "IS", "BETWEEN", "DIV", "MOD", "REGEXP", "RLIKE", "ESCAPE", "EXCEPT", "INTERSECT",
})


class _Parser:
    def __init__(self, sql: str, tokens: list[Token], flavour: str):
        self.sql = sql
        self.tokens = tokens
        self.i = 0
        self.flavour = flavour
        self.last_end = 0

    # -- token helpers ---------------------------------------------------------------------------
    @property
    def cur(self) -> Token:
        return self.tokens[self.i]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "eof":
            self.i += 1
            self.last_end = tok.end
        return tok

    def is_word(self, *words: str, offset: int = 0) -> bool:
        tok = self.peek(offset) if offset else self.cur
        return tok.kind == "word" and tok.value.upper() in words

    def accept_word(self, *words: str) -> str | None:
        if self.is_word(*words):
            return self.advance().value.upper()
        return None

    def expect_word(self, *words: str) -> str:
        word = self.accept_word(*words)
        if word is None:
            raise self.error()
        return word

    def is_op(self, *ops: str) -> bool:
        return self.cur.kind == "op" and self.cur.value in ops

    def accept_op(self, *ops: str) -> str | None:
        if self.is_op(*ops):
            return self.advance().value
        return None

    def expect_op(self, op: str) -> None:
        if self.accept_op(op) is None:
            raise self.error()

    def error(self, tok: Token | None = None) -> SqlError:
        return _syntax_error(self.sql, (tok or self.cur).start, self.flavour)

    def name(self) -> str:
        """An identifier: bare word, `quoted`, or (where MySQL allows it) a string."""
        tok = self.cur
        if tok.kind in ("word", "qident", "string"):
            self.advance()
            return tok.value
        raise self.error()

    def string(self) -> str:
        tok = self.cur
        if tok.kind != "string":
            raise self.error()
        self.advance()
        return tok.value

    def end_of_statement(self) -> None:
        self.accept_op(";")
        if self.cur.kind != "eof":
            if self.tokens[self.i - 1].kind == "op" and self.tokens[self.i - 1].value == ";":
                raise SqlError(ER_PARSE_ERROR, "42000",
                               "relayproxy runs one statement per query; send the statements separately "
                               f"(near '{self.sql[self.cur.start:self.cur.start + 80]}')")
            raise self.error()

    # -- expressions -----------------------------------------------------------------------------
    def expr(self) -> _Node:
        left = self.and_expr()
        while self.accept_word("OR") or self.accept_op("||"):
            left = _Logic("OR", left, self.and_expr())
        return left

    def and_expr(self) -> _Node:
        left = self.not_expr()
        while self.accept_word("AND") or self.accept_op("&&"):
            left = _Logic("AND", left, self.not_expr())
        return left

    def not_expr(self) -> _Node:
        if self.accept_word("NOT"):
            return _Unary("NOT", self.not_expr())
        return self.predicate()

    def predicate(self) -> _Node:
        left = self.additive()
        while True:
            op = self.accept_op("=", "<=>", "!=", "<>", "<", ">", "<=", ">=")
            if op is not None:
                left = _Compare(op, left, self.additive())
                continue
            if self.accept_word("IS"):
                negate = self.accept_word("NOT") is not None
                what = self.expect_word("NULL", "TRUE", "FALSE")
                left = _Is(left, what, negate)
                continue
            negate = False
            if self.is_word("NOT") and self.is_word("LIKE", "IN", "BETWEEN", offset=1):
                self.advance()
                negate = True
            if self.accept_word("LIKE"):
                pattern = self.additive()
                escape = "\\"
                if self.accept_word("ESCAPE"):
                    escape = self.string()[:1] or "\\"
                left = _Like(left, pattern, negate, escape)
            elif self.accept_word("IN"):
                self.expect_op("(")
                items = [self.expr()]
                while self.accept_op(","):
                    items.append(self.expr())
                self.expect_op(")")
                left = _In(left, tuple(items), negate)
            elif self.accept_word("BETWEEN"):
                low = self.additive()
                self.expect_word("AND")
                left = _Between(left, low, self.additive(), negate)
            else:
                return left

    def additive(self) -> _Node:
        left = self.multiplicative()
        while True:
            op = self.accept_op("+", "-")
            if op is None:
                return left
            if self.accept_word("INTERVAL"):
                amount = self.unary()
                unit = self.expect_word(*_INTERVAL_UNITS)
                left = _IntervalArith(left, 1 if op == "+" else -1, amount, unit)
            else:
                left = _Arith(op, left, self.multiplicative())

    def multiplicative(self) -> _Node:
        left = self.unary()
        while True:
            op = self.accept_op("*", "/", "%") or self.accept_word("DIV", "MOD")
            if op is None:
                return left
            left = _Arith("MOD" if op == "%" else op, left, self.unary())

    def unary(self) -> _Node:
        op = self.accept_op("-", "+", "!", "~")
        if op is not None:
            return _Unary("NOT" if op == "!" else op, self.unary())
        return self.primary()

    def primary(self) -> _Node:
        tok = self.cur
        if tok.kind == "number":
            self.advance()
            return _Literal(tok.value)
        if tok.kind == "string":
            self.advance()
            text = tok.value
            while self.cur.kind == "string":  # 'a' 'b' is 'ab'
                text += self.advance().value
            return _Literal(text)
        if tok.kind == "sysvar":
            self.advance()
            return _SysVarRef(*tok.value)
        if tok.kind == "uservar":
            self.advance()
            return _UserVarRef(tok.value)
        if tok.kind == "qident":
            self.advance()
            return self._qualified(tok.value)
        if tok.kind == "op" and tok.value == "(":
            self.advance()
            if self.is_word("SELECT"):
                raise _unsupported("subqueries")
            node = self.expr()
            self.expect_op(")")
            return node
        if tok.kind == "word":
            word = tok.value.upper()
            nxt = self.peek()
            if word == "NULL":
                self.advance()
                return _Literal(None)
            if word in ("TRUE", "FALSE"):
                self.advance()
                return _Literal(int(word == "TRUE"))
            if (word.startswith("_") or word == "N") and nxt.kind == "string" and nxt.start == tok.end:
                self.advance()  # a character-set introducer: _utf8mb4'text', N'text'
                return self.primary()
            if nxt.kind == "op" and nxt.value == "(" and nxt.start == tok.end or (
                nxt.kind == "op" and nxt.value == "(" and word in _FUNCTIONS
            ):
                self.advance()
                self.advance()
                args: list[_Node] = []
                if not self.accept_op(")"):
                    args.append(self.expr())
                    while self.accept_op(","):
                        args.append(self.expr())
                    self.expect_op(")")
                return _Call(word, tuple(args))
            if word in _BARE_FUNCTIONS:
                self.advance()
                return _Call(word, ())
            if word in _CLAUSE_WORDS or word in ("SELECT", "INTERVAL"):
                raise self.error()
            self.advance()
            return self._qualified(tok.value)
        raise self.error()

    def _qualified(self, name: str) -> _Node:
        while self.is_op(".") and self.peek().kind in ("word", "qident"):
            self.advance()
            name = self.advance().value
        return _ColumnRef(name)


# ---------------------------------------------------------------------------------------------
# Statements


async def execute(ctx, conn: ConnectionState, sql: str) -> Response:
    """Answer one COM_QUERY (what ``downstream/server.py`` awaits): OkResponse, ResultSet or ErrorResponse.

    The statement runs on the caller's thread, as ``execute_sync``, except the two answers that may read
    a lot of relay data, which are computed in a worker thread first so the event loop (the upstream
    session, every dump) never stalls on them: ``BINLOG_GTID_POS('file', pos)`` with literal arguments
    (a MariaDB replica's form; it reads the file up to ``pos``) and the first ``gtid_purged`` (the
    catalog scans each closed file once). Never raises.
    """
    if isinstance(sql, (bytes, bytearray)):
        sql = bytes(sql).decode("utf-8", "replace")
    prefetched: dict[tuple[str, int], Any] = {}
    try:
        tokens = tokenize(sql)
    except SqlError as exc:
        return exc.response()
    try:
        await _prefetch(ctx, tokens, prefetched)
    except Exception:  # only an optimisation: the statement computes what is missing itself
        log.exception("prefetch for SQL statement failed", statement=sql[:200])
    return _execute(ctx, conn, sql, prefetched)


async def _prefetch(ctx, tokens: list[Token], prefetched: dict[tuple[str, int], Any]) -> None:
    kinds = [(t.kind, t.value.upper() if t.kind == "word" else t.value) for t in tokens]
    catalog: FileCatalog | None = None
    for i, (kind, value) in enumerate(kinds):
        if kind == "word" and value == "BINLOG_GTID_POS" and [k for k, _ in kinds[i + 1:i + 6]] == [
            "op", "string", "op", "number", "op"
        ] and kinds[i + 1][1] == "(" and kinds[i + 3][1] == "," and kinds[i + 5][1] == ")":
            name, position = kinds[i + 2][1], kinds[i + 4][1]
            catalog = catalog or _catalog_for(ctx)
            try:
                info = next((f for f in catalog.files() if f.name == name), None)
                if info is None or not isinstance(position, int) or not 4 < position <= info.size:
                    continue
                path = ctx.store.path(name)
            except (CatalogError, KeyError):
                continue  # the statement itself answers NULL
            prefetched[(str(path), position)] = await asyncio.to_thread(_gtids_at, path, position)
    mentions_purged = any(k == "sysvar" and v[1] == "gtid_purged" for k, v in kinds) or (
        kinds and kinds[0] == ("word", "SHOW") and ("word", "VARIABLES") in kinds
    )
    if mentions_purged and ctx.flavour != "mariadb":
        catalog = catalog or _catalog_for(ctx)
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


def _execute(ctx, conn: ConnectionState, sql: str, prefetched: dict[tuple[str, int], Any]) -> Response:
    env = _Env(ctx, conn, prefetched)
    try:
        tokens = tokenize(sql)
        if tokens[0].kind == "eof" or (tokens[0].kind == "op" and tokens[0].value == ";" and tokens[1].kind == "eof"):
            return ErrorResponse(ER_EMPTY_QUERY, "42000", "Query was empty")
        parser = _Parser(sql, tokens, env.flavour)
        return _dispatch(parser, env)
    except SqlError as exc:
        return exc.response()
    except Exception as exc:  # a bug must not take the connection down: say which statement hit it
        log.exception("SQL statement failed unexpectedly", statement=sql[:200], conn_id=conn.conn_id)
        return ErrorResponse(ER_UNKNOWN_ERROR, "HY000",
                             f"relayproxy internal error answering '{sql[:80]}': {exc.__class__.__name__}: {exc}")


# Statements MySQL knows that a relay refuses: named in the error, never silently accepted.
_KNOWN_UNSUPPORTED = frozenset({
    "ALTER", "ANALYZE", "BINLOG", "CACHE", "CALL", "CHANGE", "CHECK", "CHECKSUM", "CLONE", "CREATE", "DEALLOCATE",
    "DELETE", "DESC", "DESCRIBE", "DROP", "EXECUTE", "EXPLAIN", "FLUSH", "GET", "GRANT", "HANDLER", "HELP", "IMPORT",
    "INSERT", "INSTALL", "KILL", "LOAD", "LOCK", "OPTIMIZE", "PREPARE", "RELEASE", "RENAME", "REPAIR", "REPLACE",
    "RESET", "RESIGNAL", "RESTART", "REVOKE", "SAVEPOINT", "SHUTDOWN", "SIGNAL", "STOP", "TABLE", "TRUNCATE",
    "UNINSTALL", "UNLOCK", "UPDATE", "VALUES", "WITH", "XA",
})


def _statement_name(parser: _Parser) -> str:
    words = [t.value.upper() for t in parser.tokens[:2] if t.kind == "word"]
    return " ".join(words) or parser.sql.strip()[:40]


def _dispatch(p: _Parser, env: _Env) -> Response:
    first = p.cur
    word = first.value.upper() if first.kind == "word" else None
    handler = _HANDLERS.get(word or "")
    if handler is not None:
        return handler(p, env)
    if word == "START":
        if p.is_word("TRANSACTION", offset=1):
            return _transaction(p, env)
        raise _unsupported(f"'{_statement_name(p)}'")
    if word in _KNOWN_UNSUPPORTED:
        raise _unsupported(f"'{_statement_name(p)}' statements")
    if first.kind == "op" and first.value == "(":
        raise _unsupported("parenthesised queries")
    raise p.error()


# -- SELECT / DO ---------------------------------------------------------------------------------

_SELECT_MODIFIERS = ("ALL", "DISTINCT", "DISTINCTROW", "HIGH_PRIORITY", "STRAIGHT_JOIN", "SQL_SMALL_RESULT",
                     "SQL_BIG_RESULT", "SQL_BUFFER_RESULT", "SQL_NO_CACHE", "SQL_CACHE", "SQL_CALC_FOUND_ROWS")


def _select(p: _Parser, env: _Env) -> Response:
    p.expect_word("SELECT")
    _refuse_tables(p)
    while p.accept_word(*_SELECT_MODIFIERS):
        pass
    items: list[tuple[_Node, str]] = []
    while True:
        if p.is_op("*"):
            raise SqlError(ER_NO_TABLES_USED, "HY000", "No tables used")
        start = p.cur.start
        node = p.expr()
        name = p.sql[start:p.last_end]
        if isinstance(node, _Literal) and isinstance(node.value, str) and p.tokens[p.i - 1].kind == "string":
            name = node.value  # MySQL names a bare string literal's column after its value
        if p.accept_word("AS"):
            name = p.name()
        elif p.cur.kind in ("qident", "string") or (p.cur.kind == "word" and p.cur.value.upper() not in _CLAUSE_WORDS):
            name = p.name()
        items.append((node, name))
        if not p.accept_op(","):
            break
    if p.accept_word("FROM"):
        p.expect_word("DUAL")  # anything else was refused by _refuse_tables
    where = p.expr() if p.accept_word("WHERE") else None
    for clause in ("GROUP", "HAVING", "ORDER", "UNION", "INTO", "WINDOW", "EXCEPT", "INTERSECT"):
        if p.is_word(clause):
            raise _unsupported(f"SELECT ... {clause}")
    offset, count = _limit(p)
    if p.accept_word("FOR"):
        p.expect_word("UPDATE", "SHARE")
    elif p.accept_word("LOCK"):
        p.expect_word("IN")
        p.expect_word("SHARE")
        p.expect_word("MODE")
    p.end_of_statement()
    ev = _Evaluator(env)
    row = [_output(node.eval(ev)) for node, _ in items]
    rows = [row]
    if where is not None:
        w = where.eval(ev)
        if w is None or not _truthy(w):
            rows = []
    return ResultSet([name for _, name in items], rows[offset:offset + count] if count is not None else rows[offset:])


def _refuse_tables(p: _Parser) -> None:
    """A SELECT that reads a table (``FROM`` anything but ``DUAL``, outside parentheses) is refused by name,
    before its select list is parsed: ``SELECT COUNT(*) FROM information_schema.processlist`` must say
    "no tables here", not "syntax error"."""
    depth = 0
    for j in range(p.i, len(p.tokens) - 1):
        tok = p.tokens[j]
        if tok.kind == "op" and tok.value in "()":
            depth += 1 if tok.value == "(" else -1
        elif depth == 0 and tok.kind == "word" and tok.value.upper() == "FROM":
            nxt = p.tokens[j + 1]
            if not (nxt.kind == "word" and nxt.value.upper() == "DUAL"):
                raise _unsupported(f"reading tables ('SELECT ... FROM {p.sql[nxt.start:nxt.start + 60].strip()}')")


def _limit(p: _Parser) -> tuple[int, int | None]:
    if not p.accept_word("LIMIT"):
        return 0, None
    first = p.cur
    if first.kind != "number" or not isinstance(first.value, int):
        raise p.error()
    p.advance()
    if p.accept_op(","):
        second = p.cur
        if second.kind != "number" or not isinstance(second.value, int):
            raise p.error()
        p.advance()
        return first.value, second.value
    if p.accept_word("OFFSET"):
        second = p.cur
        if second.kind != "number" or not isinstance(second.value, int):
            raise p.error()
        p.advance()
        return second.value, first.value
    return 0, first.value


def _do(p: _Parser, env: _Env) -> Response:
    p.expect_word("DO")
    nodes = [p.expr()]
    while p.accept_op(","):
        nodes.append(p.expr())
    p.end_of_statement()
    ev = _Evaluator(env)
    for node in nodes:
        node.eval(ev)
    return OkResponse()


def _transaction(p: _Parser, env: _Env) -> Response:
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
            raise _unsupported("savepoints")
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


def _collation_of(env: _Env, charset: str) -> str:
    if charset == "utf8mb4":
        return _default_collation(env)
    return _CHARSET_COLLATIONS.get(charset, f"{charset}_general_ci")


def _set(p: _Parser, env: _Env) -> Response:
    """SET of user variables, session variables, NAMES and CHARACTER SET.

    All right-hand sides are evaluated before anything is assigned (``SET @a = 1, @b = @a`` gives @b the
    old @a, as MariaDB does), and nothing is assigned if any part fails.
    """
    p.expect_word("SET")
    if p.is_word("GLOBAL", "PERSIST", "PERSIST_ONLY") or (p.cur.kind == "sysvar" and p.cur.value[0] == "global"):
        raise _unsupported("'SET GLOBAL' (the relay's global variables follow its configuration and its master)")
    if p.is_word("PASSWORD", "ROLE", "DEFAULT"):
        raise _unsupported(f"'SET {p.cur.value.upper()}'")
    if p.is_word("TRANSACTION") or (p.is_word("SESSION", "LOCAL") and p.is_word("TRANSACTION", offset=1)):
        return _set_transaction(p, env)
    user: list[tuple[str, Any]] = []
    session: list[tuple[str, Any, bool]] = []  # (name, value, reset to default)
    ev = _Evaluator(env)
    while True:
        tok = p.cur
        if tok.kind == "uservar":
            p.advance()
            if p.accept_op("=", ":=") is None:
                raise p.error()
            user.append((tok.value, _output(p.expr().eval(ev))))
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
                    raise _unsupported("'SET GLOBAL' (the relay's global variables follow its configuration)")
                name = tok.value[1]
            else:
                p.accept_word("SESSION", "LOCAL")
                if p.is_word("GLOBAL", "PERSIST", "PERSIST_ONLY"):
                    raise _unsupported("'SET GLOBAL' (the relay's global variables follow its configuration)")
                if p.cur.kind not in ("word", "qident"):
                    raise p.error()
                name = p.advance().value.lower()
            if p.accept_op("=", ":=") is None:
                raise p.error()
            var = _lookup_variable(env, name)
            if var is None:
                raise _unknown_variable(name)
            if not var.has_session:
                raise SqlError(ER_GLOBAL_VARIABLE, "HY000",
                               f"Variable '{name}' is a GLOBAL variable and should be set with SET GLOBAL")
            if p.accept_word("DEFAULT"):
                session.append((name, None, True))
            else:
                value = p.expr().eval(_Evaluator(env, bare_words_are_strings=True))
                session.append((name, var.coerce(_output(value)), False))
        if not p.accept_op(","):
            break
    p.end_of_statement()
    for name, value in user:
        env.conn.user_vars[name] = value
    for name, value, reset in session:
        if reset:
            env.conn.session_vars.pop(name, None)
        else:
            env.conn.session_vars[name] = value
    return OkResponse()


def _set_names(p: _Parser, env: _Env) -> list[tuple[str, Any, bool]]:
    names = ("character_set_client", "character_set_connection", "character_set_results", "collation_connection")
    if p.accept_word("DEFAULT"):
        return [(n, None, True) for n in names]
    charset = p.name().lower()
    collation = p.name().lower() if p.accept_word("COLLATE") else _collation_of(env, charset)
    return [(n, charset, False) for n in names[:3]] + [("collation_connection", collation, False)]


def _set_transaction(p: _Parser, env: _Env) -> Response:
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


# -- SHOW ----------------------------------------------------------------------------------------


def _show(p: _Parser, env: _Env) -> Response:
    p.expect_word("SHOW")
    scope = p.accept_word("GLOBAL", "SESSION", "LOCAL")
    if p.accept_word("VARIABLES"):
        return _show_variables(p, env, "global" if scope == "GLOBAL" else "session")
    if p.accept_word("STATUS"):
        return _show_status(p, env)
    if scope is not None:
        what = p.cur.value.upper() if p.cur.kind == "word" else p.sql[p.cur.start:p.cur.start + 20]
        raise _unsupported(f"'SHOW {scope} {what}'")
    full = p.accept_word("FULL") is not None
    if p.accept_word("PROCESSLIST"):
        p.end_of_statement()
        return _show_processlist(env, full)
    if p.accept_word("MASTER"):
        if p.accept_word("STATUS"):
            p.end_of_statement()
            return _show_master_status(env)
        p.expect_word("LOGS")
        p.end_of_statement()
        return _show_binary_logs(env)
    if p.is_word("BINLOG") and env.flavour == "mariadb":
        # MariaDB 10.5.2+'s name for SHOW MASTER STATUS.
        start = p.cur.start
        p.advance()
        if not p.accept_word("STATUS"):
            raise _syntax_error(p.sql, start, env.flavour)
        p.end_of_statement()
        return _show_master_status(env)
    if p.accept_word("BINARY"):
        if p.is_word("LOG"):
            start = p.cur.start
            p.advance()
            p.expect_word("STATUS")
            p.end_of_statement()
            if env.flavour == "mariadb" or not env.at_least(8, 2, 0):
                # SHOW BINARY LOG STATUS exists from MySQL 8.2 only: older servers and MariaDB say 1064,
                # which is what makes tools fall back to SHOW MASTER STATUS.
                raise _syntax_error(p.sql, start, env.flavour)
            return _show_master_status(env)
        p.expect_word("LOGS")
        p.end_of_statement()
        return _show_binary_logs(env)
    if p.is_word("SLAVE", "REPLICA"):
        new_names = p.advance().value.upper() == "REPLICA"
        if p.accept_word("HOSTS"):
            p.end_of_statement()
            return _show_replica_hosts(env, new_names)
        if p.cur.kind == "string":  # MariaDB: SHOW SLAVE 'connection_name' STATUS
            _check_connection_name(p.string())
        p.expect_word("STATUS")
        if p.accept_word("FOR"):
            p.expect_word("CHANNEL")
            channel = p.name()
            if channel:
                raise SqlError(ER_REPLICA_CHANNEL_DOES_NOT_EXIST, "HY000",
                               f"Replication channel '{channel}' does not exist.")
        p.end_of_statement()
        return _show_replica_status(env, new_names=new_names, all_connections=False)
    if p.accept_word("REPLICAS"):
        p.end_of_statement()
        return _show_replica_hosts(env, True)
    if p.accept_word("ALL"):
        if env.mysql:
            raise p.error()  # MySQL has no SHOW ALL SLAVES STATUS; tools try it and fall back on 1064
        p.expect_word("SLAVES", "REPLICAS")
        p.expect_word("STATUS")
        p.end_of_statement()
        return _show_replica_status(env, new_names=False, all_connections=True)
    if p.accept_word("WARNINGS", "ERRORS"):
        _limit(p)
        p.end_of_statement()
        return ResultSet(["Level", "Code", "Message"], [])
    if p.accept_word("DATABASES", "SCHEMAS"):
        if p.accept_word("LIKE"):
            p.expr()
        p.end_of_statement()
        return ResultSet(["Database"], [])  # the relay holds no schemas
    what = p.cur.value.upper() if p.cur.kind == "word" else p.sql[p.cur.start:p.cur.start + 20]
    raise _unsupported(f"'SHOW {'FULL ' if full else ''}{what}'")


def _check_connection_name(name: str) -> None:
    if name:
        raise SqlError(WARN_NO_MASTER_INFO, "HY000", f"There is no master connection '{name}'")


def _filtered(p: _Parser, env: _Env, rows: Iterable[tuple[str, Callable[[], str]]]) -> ResultSet:
    """Rows of (name, value thunk) under SHOW's optional LIKE / WHERE; values computed only for kept names."""
    like: _Node | None = None
    where: _Node | None = None
    if p.accept_word("LIKE"):
        like = p.expr()
    elif p.accept_word("WHERE"):
        where = p.expr()
    p.end_of_statement()
    ev = _Evaluator(env)
    pattern = None
    if like is not None:
        value = like.eval(ev)
        pattern = _like_regex(_to_text(value)) if value is not None else None
        if pattern is None:
            return ResultSet(["Variable_name", "Value"], [])
    out = []
    for name, thunk in sorted(rows, key=lambda r: r[0].lower()):
        if pattern is not None and not pattern.match(name):
            continue
        value = thunk()
        if where is not None:
            keep = where.eval(_Evaluator(env, {"variable_name": name, "value": value}))
            if keep is None or not _truthy(keep):
                continue
        out.append([name, value])
    return ResultSet(["Variable_name", "Value"], out)


def _show_variables(p: _Parser, env: _Env, scope: str) -> ResultSet:
    session = env.conn.session_vars
    rows: list[tuple[str, Callable[[], str]]] = []
    for var in SYSTEM_VARIABLES:
        if not var.exists(env) or (scope == "global" and not var.has_global):
            continue

        def thunk(var: SysVar = var) -> str:
            if scope == "session" and var.has_session and var.name in session:
                return var.show_value(session[var.name])
            return var.show_value(var.value(env))

        rows.append((var.name, thunk))
    return _filtered(p, env, rows)


def _show_status(p: _Parser, env: _Env) -> ResultSet:
    rows = [(s.name, (lambda s=s: str(_output(s.value(env))))) for s in STATUS_VARIABLES if s.exists(env)]
    return _filtered(p, env, rows)


def _show_master_status(env: _Env) -> ResultSet:
    """File and Position are the horizon: the end of the last complete, durable transaction."""
    columns = ["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB"]
    if env.mysql:
        columns.append("Executed_Gtid_Set")  # MariaDB's SHOW MASTER STATUS has no GTID column
    snap = env.snapshot
    if snap.file is None:
        return ResultSet(columns, [])
    row: list[Any] = [snap.file, snap.position, "", ""]
    if env.mysql:
        row.append(_gtid_executed(env))
    return ResultSet(columns, [row])


def _catalog_files(env: _Env):
    try:
        return env.catalog.files()
    except CatalogError as exc:
        raise SqlError(ER_UNKNOWN_ERROR, "HY000", f"cannot list the relay files: {exc}") from None


def _show_binary_logs(env: _Env) -> ResultSet:
    """Relay files with their durable sizes (the current file only up to the horizon)."""
    encrypted = env.mysql and env.at_least(8, 0, 14)
    columns = ["Log_name", "File_size"] + (["Encrypted"] if encrypted else [])
    rows = [[f.name, f.size] + (["No"] if encrypted else []) for f in _catalog_files(env)]
    return ResultSet(columns, rows)


def _show_replica_hosts(env: _Env, new_names: bool) -> ResultSet:
    """Replicas that registered with COM_REGISTER_SLAVE, in MySQL's or MariaDB's columns."""
    if not env.mysql:
        columns = ["Server_id", "Host", "Port", "Master_id"]
    elif new_names:
        columns = ["Server_Id", "Host", "Port", "Source_Id", "Replica_UUID"]
    elif env.at_least(8, 0, 0):
        columns = ["Server_Id", "Host", "Port", "Master_Id", "Slave_UUID"]
    else:
        columns = ["Server_id", "Host", "Port", "Master_id", "Slave_UUID"]
    rows = []
    for conn in sorted(env.ctx.connections.values(), key=lambda c: c.conn_id):
        reg = conn.registration
        if reg is None:
            continue
        host = reg.host or ("" if env.mysql else conn.host)  # MariaDB shows the client address without report_host
        row: list[Any] = [reg.server_id, host, reg.port, env.ctx.server_id]
        if env.mysql:
            row.append(str(conn.user_vars.get("replica_uuid") or conn.user_vars.get("slave_uuid") or ""))
        rows.append(row)
    return ResultSet(columns, rows)


def _show_processlist(env: _Env, full: bool) -> ResultSet:
    columns = ["Id", "User", "Host", "db", "Command", "Time", "State", "Info"]
    if not env.mysql:
        columns.append("Progress")
    if env.mysql and env.at_least(8, 0, 26):
        dump_state = "Source has sent all binlog to replica; waiting for more updates"
    else:
        dump_state = "Master has sent all binlog to slave; waiting for more updates"
    rows = []
    for conn in sorted(env.ctx.connections.values(), key=lambda c: c.conn_id):
        if conn.dump is not None:
            command = "Binlog Dump GTID" if conn.dump.mode == "mysql-gtid" else "Binlog Dump"
            since, state, info = conn.dump.started, dump_state, None
        elif conn is env.conn:
            command, since, state, info = "Query", env.now, "starting", "SHOW FULL PROCESSLIST" if full else "SHOW PROCESSLIST"
        else:
            command, since, state, info = "Sleep", conn.connected_at, "", None
        row: list[Any] = [conn.conn_id, conn.user, conn.host, conn.database, command,
                          max(int(env.now - since), 0), state, info]
        if not env.mysql:
            row.append(0.0)
        rows.append(row)
    return ResultSet(columns, rows)


# SHOW REPLICA STATUS columns in MySQL's order: (8.0.22+ name, pre-8.0.22 name or None, value key, since).
# From mysql-server sql/rpl_replica.cc show_slave_status_metadata(); SHOW SLAVE STATUS renames the
# Source/Replica terms back (rename_fields_use_old_replica_source_terms).
_MYSQL_REPLICA_COLUMNS: tuple[tuple[str, str | None, str, tuple[int, ...]], ...] = (
    ("Replica_IO_State", "Slave_IO_State", "io_state", ()),
    ("Source_Host", "Master_Host", "host", ()),
    ("Source_User", "Master_User", "user", ()),
    ("Source_Port", "Master_Port", "port", ()),
    ("Connect_Retry", None, "connect_retry", ()),
    ("Source_Log_File", "Master_Log_File", "log_file", ()),
    ("Read_Source_Log_Pos", "Read_Master_Log_Pos", "log_pos", ()),
    ("Relay_Log_File", None, "log_file", ()),
    ("Relay_Log_Pos", None, "log_pos", ()),
    ("Relay_Source_Log_File", "Relay_Master_Log_File", "log_file", ()),
    ("Replica_IO_Running", "Slave_IO_Running", "io_running", ()),
    ("Replica_SQL_Running", "Slave_SQL_Running", "sql_running", ()),
    ("Replicate_Do_DB", None, "empty", ()),
    ("Replicate_Ignore_DB", None, "empty", ()),
    ("Replicate_Do_Table", None, "empty", ()),
    ("Replicate_Ignore_Table", None, "empty", ()),
    ("Replicate_Wild_Do_Table", None, "empty", ()),
    ("Replicate_Wild_Ignore_Table", None, "empty", ()),
    ("Last_Errno", None, "zero", ()),
    ("Last_Error", None, "empty", ()),
    ("Skip_Counter", None, "zero", ()),
    ("Exec_Source_Log_Pos", "Exec_Master_Log_Pos", "log_pos", ()),
    ("Relay_Log_Space", None, "relay_space", ()),
    ("Until_Condition", None, "until_none", ()),
    ("Until_Log_File", None, "empty", ()),
    ("Until_Log_Pos", None, "zero", ()),
    ("Source_SSL_Allowed", "Master_SSL_Allowed", "ssl_allowed", ()),
    ("Source_SSL_CA_File", "Master_SSL_CA_File", "ssl_ca", ()),
    ("Source_SSL_CA_Path", "Master_SSL_CA_Path", "empty", ()),
    ("Source_SSL_Cert", "Master_SSL_Cert", "ssl_cert", ()),
    ("Source_SSL_Cipher", "Master_SSL_Cipher", "empty", ()),
    ("Source_SSL_Key", "Master_SSL_Key", "ssl_key", ()),
    ("Seconds_Behind_Source", "Seconds_Behind_Master", "seconds_behind", ()),
    ("Source_SSL_Verify_Server_Cert", "Master_SSL_Verify_Server_Cert", "ssl_verify", ()),
    ("Last_IO_Errno", None, "io_errno", ()),
    ("Last_IO_Error", None, "io_error", ()),
    ("Last_SQL_Errno", None, "zero", ()),
    ("Last_SQL_Error", None, "empty", ()),
    ("Replicate_Ignore_Server_Ids", None, "empty", ()),
    ("Source_Server_Id", "Master_Server_Id", "master_server_id", ()),
    ("Source_UUID", "Master_UUID", "master_uuid", ()),
    ("Source_Info_File", "Master_Info_File", "info_file", ()),
    ("SQL_Delay", None, "zero", ()),
    ("SQL_Remaining_Delay", None, "null", ()),
    ("Replica_SQL_Running_State", "Slave_SQL_Running_State", "sql_state", ()),
    ("Source_Retry_Count", "Master_Retry_Count", "retry_count", ()),
    ("Source_Bind", "Master_Bind", "empty", ()),
    ("Last_IO_Error_Timestamp", None, "io_error_time", ()),
    ("Last_SQL_Error_Timestamp", None, "empty", ()),
    ("Source_SSL_Crl", "Master_SSL_Crl", "empty", ()),
    ("Source_SSL_Crlpath", "Master_SSL_Crlpath", "empty", ()),
    ("Retrieved_Gtid_Set", None, "gtid_set", ()),
    ("Executed_Gtid_Set", None, "gtid_set", ()),
    ("Auto_Position", None, "auto_position", ()),
    ("Replicate_Rewrite_DB", None, "empty", (5, 7, 0)),
    ("Channel_Name", None, "empty", (5, 7, 0)),
    ("Source_TLS_Version", "Master_TLS_Version", "empty", (5, 7, 10)),
    ("Source_public_key_path", "Master_public_key_path", "empty", (8, 0, 4)),
    ("Get_Source_public_key", "Get_master_public_key", "zero", (8, 0, 4)),
    ("Network_Namespace", None, "empty", (8, 0, 22)),
)

# MariaDB's SHOW SLAVE STATUS (and SHOW REPLICA STATUS: same names), as mariadbd 10.11 sends it.
_MARIADB_REPLICA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Slave_IO_State", "io_state"), ("Master_Host", "host"), ("Master_User", "user"), ("Master_Port", "port"),
    ("Connect_Retry", "connect_retry"), ("Master_Log_File", "log_file"), ("Read_Master_Log_Pos", "log_pos"),
    ("Relay_Log_File", "log_file"), ("Relay_Log_Pos", "log_pos"), ("Relay_Master_Log_File", "log_file"),
    ("Slave_IO_Running", "io_running"), ("Slave_SQL_Running", "sql_running"), ("Replicate_Do_DB", "empty"),
    ("Replicate_Ignore_DB", "empty"), ("Replicate_Do_Table", "empty"), ("Replicate_Ignore_Table", "empty"),
    ("Replicate_Wild_Do_Table", "empty"), ("Replicate_Wild_Ignore_Table", "empty"), ("Last_Errno", "zero"),
    ("Last_Error", "empty"), ("Skip_Counter", "zero"), ("Exec_Master_Log_Pos", "log_pos"),
    ("Relay_Log_Space", "relay_space"), ("Until_Condition", "until_none"), ("Until_Log_File", "empty"),
    ("Until_Log_Pos", "zero"), ("Master_SSL_Allowed", "ssl_allowed"), ("Master_SSL_CA_File", "ssl_ca"),
    ("Master_SSL_CA_Path", "empty"), ("Master_SSL_Cert", "ssl_cert"), ("Master_SSL_Cipher", "empty"),
    ("Master_SSL_Key", "ssl_key"), ("Seconds_Behind_Master", "seconds_behind"),
    ("Master_SSL_Verify_Server_Cert", "ssl_verify"), ("Last_IO_Errno", "io_errno"), ("Last_IO_Error", "io_error"),
    ("Last_SQL_Errno", "zero"), ("Last_SQL_Error", "empty"), ("Replicate_Ignore_Server_Ids", "empty"),
    ("Master_Server_Id", "master_server_id"), ("Master_SSL_Crl", "empty"), ("Master_SSL_Crlpath", "empty"),
    ("Using_Gtid", "using_gtid"), ("Gtid_IO_Pos", "gtid_io_pos"), ("Replicate_Do_Domain_Ids", "empty"),
    ("Replicate_Ignore_Domain_Ids", "empty"), ("Parallel_Mode", "parallel_mode"), ("SQL_Delay", "zero"),
    ("SQL_Remaining_Delay", "null"), ("Slave_SQL_Running_State", "sql_state"), ("Slave_DDL_Groups", "zero"),
    ("Slave_Non_Transactional_Groups", "zero"), ("Slave_Transactional_Groups", "zero"),
    ("Replicate_Rewrite_DB", "empty"),
)
_MARIADB_ALL_PREFIX = (("Connection_name", "empty"), ("Slave_SQL_State", "sql_state"))
_MARIADB_ALL_SUFFIX = (
    ("Retried_transactions", "zero"), ("Max_relay_log_size", "max_relay_log_size"), ("Executed_log_entries", "zero"),
    ("Slave_received_heartbeats", "heartbeats"), ("Slave_heartbeat_period", "heartbeat_period"),
    ("Gtid_Slave_Pos", "empty"),
)

_MASTER_ERROR_RE = re.compile(r"error (\d+) from master")


def _replica_values(env: _Env, *, new_terms: bool) -> dict[str, Any]:
    """The relay's own IO-thread status, horizon-based.

    Read_Master_Log_Pos = Exec_Master_Log_Pos = the horizon: everything the relay advertises is a
    complete, durable transaction, so what it "read" is what it "executed" (a tool waiting for
    Read == Exec never waits on a half-received transaction). Slave_SQL_Running is No: a relay applies
    nothing, it has no SQL thread.
    """
    ctx = env.ctx
    cfg = ctx.cfg
    st = relay_status(cfg, ctx.store, ctx.session)
    up = ctx.session.status
    state = st.get("state") or ""
    if st["io_running"]:
        io_running = "Yes"
        io_state = "Waiting for source to send event" if new_terms else "Waiting for master to send event"
    elif state == "stopped":
        io_running, io_state = "No", ""
    else:
        io_running = "Connecting"
        io_state = "Connecting to source" if new_terms else "Connecting to master"
    error = st.get("last_io_error") or ""
    errno = 0
    if error:
        m = _MASTER_ERROR_RE.search(error)
        errno = int(m.group(1)) if m else 2013  # CR_SERVER_LOST: the connection to the master ended
    error_time = st.get("last_io_error_time")
    gtids = env.snapshot.gtids
    if isinstance(gtids, GtidSet):
        gtid_text = gtids.format(",\n")
    else:
        gtid_text = ""
    try:
        relay_space = sum(f.size for f in env.catalog.files())
    except CatalogError:
        relay_space = sum(os.path.getsize(ctx.store.path(n)) for n in ctx.store.files()
                          if os.path.exists(ctx.store.path(n)))
    ssl_mode = getattr(cfg, "ssl_mode", "disabled") or "disabled"
    counters = getattr(ctx.session.receiver, "counters", None)
    return {
        "io_state": io_state,
        "host": st.get("master_host") or "",
        "user": getattr(cfg, "user", None) or "",
        "port": st.get("master_port") or 0,
        "connect_retry": int(round(getattr(cfg, "reconnect_max_delay", 60) or 60)),
        "log_file": env.snapshot.file or "",
        "log_pos": env.snapshot.position if env.snapshot.file else 4,
        "io_running": io_running,
        "sql_running": "No",
        "empty": "",
        "zero": 0,
        "null": None,
        "relay_space": relay_space,
        "until_none": "None",
        "ssl_allowed": "No" if ssl_mode == "disabled" else "Yes",
        "ssl_ca": getattr(cfg, "ssl_ca", None) or "",
        "ssl_cert": getattr(cfg, "ssl_cert", None) or "",
        "ssl_key": getattr(cfg, "ssl_key", None) or "",
        "ssl_verify": "Yes" if ssl_mode == "verify_identity" else "No",
        "seconds_behind": st.get("seconds_behind_master"),
        "io_errno": errno,
        "io_error": error,
        "io_error_time": time.strftime("%y%m%d %H:%M:%S", time.localtime(error_time)) if error and error_time else "",
        "master_server_id": up.master_server_id or 0,
        "master_uuid": up.master_uuid or "",
        "info_file": str(getattr(cfg, "relay_dir", "") or ""),
        "sql_state": "",
        "retry_count": 0,  # the relay reconnects for ever
        "gtid_set": gtid_text,
        "auto_position": int(getattr(cfg, "gtid_mode", "off") == "mysql"),
        "using_gtid": "Slave_Pos" if getattr(cfg, "gtid_mode", "off") == "mariadb" else "No",
        "gtid_io_pos": str(gtids.current_position()) if isinstance(gtids, MariaBinlogState) else "",
        "parallel_mode": "optimistic",
        "max_relay_log_size": 1 << 30,
        "heartbeats": getattr(counters, "heartbeats", 0) if counters is not None else 0,
        "heartbeat_period": float(getattr(cfg, "heartbeat_period", 0.0) or 0.0),
    }


def _show_replica_status(env: _Env, *, new_names: bool, all_connections: bool) -> ResultSet:
    """SHOW SLAVE STATUS (old names) / SHOW REPLICA STATUS (MySQL 8.0.22+ names) about the relay's upstream.

    Columns and their order are the emulated server's: MySQL's for its version, MariaDB's (which keeps
    the old names under both syntaxes and adds Using_Gtid, Gtid_IO_Pos ...) for a MariaDB master. A relay
    without a configured master shows no row, as a server that is no replica does.
    """
    if env.mysql:
        spec = [(new if new_names else (old or new), key) for new, old, key, since in _MYSQL_REPLICA_COLUMNS
                if not since or env.at_least(*since)]
    else:
        spec = list(_MARIADB_REPLICA_COLUMNS)
        if all_connections:
            spec = list(_MARIADB_ALL_PREFIX) + spec + list(_MARIADB_ALL_SUFFIX)
    columns = [name for name, _ in spec]
    if not getattr(env.ctx.cfg, "master", None):
        return ResultSet(columns, [])
    # Stage texts follow the version (MySQL 8.0.26 renamed them), not the syntax used.
    values = _replica_values(env, new_terms=env.mysql and env.at_least(8, 0, 26))
    return ResultSet(columns, [[values[key] for _, key in spec]])


# -- PURGE ---------------------------------------------------------------------------------------


def _purge(p: _Parser, env: _Env) -> Response:
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
        when = p.expr().eval(_Evaluator(env))
        p.end_of_statement()
        cutoff = _to_datetime(when) if when is not None else None
        if cutoff is None:
            raise SqlError(ER_WRONG_ARGUMENTS, "HY000", f"Incorrect arguments to PURGE LOGS BEFORE: {when!r} is not a datetime")
        _require_binlog_admin(env)
        keep_from = files[-1] if files else None
        limit = cutoff.timestamp()
        for name in files[:-1]:  # the current file always stays
            try:
                if os.path.getmtime(store.path(name)) >= limit:
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


def _require_binlog_admin(env: _Env) -> None:
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


# -- USE -----------------------------------------------------------------------------------------


def _use(p: _Parser, env: _Env) -> Response:
    p.expect_word("USE")
    name = p.name()
    p.end_of_statement()
    raise SqlError(ER_BAD_DB_ERROR, "42000", f"Unknown database '{name}' (a binlog relay holds no schemas)")


_HANDLERS: dict[str, Callable[[_Parser, _Env], Response]] = {
    "SELECT": _select,
    "SET": _set,
    "SHOW": _show,
    "PURGE": _purge,
    "DO": _do,
    "USE": _use,
    "BEGIN": _transaction,
    "COMMIT": _transaction,
    "ROLLBACK": _transaction,
}

