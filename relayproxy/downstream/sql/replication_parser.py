"""The replication admin statements an HA manager sends a replica, parsed and checked: STOP/START/RESET SLAVE|REPLICA
and CHANGE MASTER TO / CHANGE REPLICATION SOURCE TO.

Sans-I/O: text in, a frozen statement object (or an ``AdminStatementError`` carrying the server's code, SQLSTATE
and text) out. After an HA failover an orchestrator repoints every replica with ``STOP SLAVE; CHANGE MASTER TO
...; START SLAVE`` (or the MySQL 8.0.23+ REPLICA / SOURCE spellings); the relay answers the same statements, so
it can be repointed exactly like a replica. Executing them (saving the choice, restarting the upstream session)
is the caller's job.

Both spellings of every option normalise to one key set (``ChangeMaster.options``): host, port, user, password,
ssl, ssl_ca, ssl_capath, ssl_cert, ssl_key, ssl_cipher, ssl_verify_server_cert, connect_retry, heartbeat_period,
use_gtid (MariaDB), auto_position (MySQL), log_file, log_pos, public_key_path, get_public_key (MySQL).
``check_flavour`` then refuses what the relay's flavour of server would not parse.

What the servers do, and where the relay deliberately differs (each checked against the servers' sources):

- MySQL 8.0.23+ accepts MASTER_ and SOURCE_ option names in either statement, mixed (sql_yacc.yy
  ``change_replication_source_host: MASTER_HOST_SYM | SOURCE_HOST_SYM``, a deprecation warning only); so do we.
- Neither server refuses an option given twice (the last one wins), except MariaDB for MASTER_USE_GTID
  (ER_DUP_ARGUMENT). The relay refuses every repeat with ER_DUP_ARGUMENT: a repointing statement that names two
  hosts is a mistake, not a preference.
- MariaDB accepts MASTER_USE_GTID=slave_pos|current_pos together with MASTER_LOG_FILE/POS and ignores the
  coordinates (sql_repl.cc ``change_master``; a warning since MDEV-19801). The relay refuses the combination
  (ER_WRONG_ARGUMENTS) so nothing an operator typed is silently dropped.
- Values are as strict as the grammar (``ulong_num``, ``TEXT_STRING_sys``): a quoted number or a bare word where a
  string belongs is a syntax error. Decimals where an integer belongs are refused too (MySQL would truncate them).
  A port outside 0..65535 is refused (ER_WRONG_ARGUMENTS; MySQL would truncate it silently).

Passwords never appear in an error message or a repr: the "near '...'" text of a syntax error shows the value of
an option only when the option is a known one that holds no secret, and ``ChangeMaster`` shows ``***``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...wire.errors import (
    ER_BAD_SLAVE_AUTO_POSITION,
    ER_DUP_ARGUMENT,
    ER_NOT_SUPPORTED_YET,
    ER_PARSE_ERROR,
    ER_REPLICA_CHANNEL_DOES_NOT_EXIST,
    ER_SLAVE_HEARTBEAT_VALUE_OUT_OF_RANGE,
    ER_UNKNOWN_ERROR,
    ER_WRONG_ARGUMENTS,
    WARN_NO_MASTER_INFO,
)
from ...wire.sqltext import sql_string
from .errors import SqlError
from .parser import Token, tokenize

__all__ = [
    "HEARTBEAT_PERIOD_MAX",
    "MAX_OPTIONS",
    "MAX_STATEMENT_BYTES",
    "OPTION_KEYS",
    "AdminStatement",
    "AdminStatementError",
    "ChangeMaster",
    "ResetReplica",
    "StartReplica",
    "StopReplica",
    "check_flavour",
    "parse_admin_statement",
    "render_change_master",
]

MAX_STATEMENT_BYTES = 64 * 1024
MAX_OPTIONS = 64
# SLAVE_MAX_HEARTBEAT_PERIOD in both servers (sql_yacc.yy checks MASTER_HEARTBEAT_PERIOD against it), seconds.
HEARTBEAT_PERIOD_MAX = 4294967
_UINT32_MAX = 0xFFFFFFFF
_UINT64_MAX = 0xFFFFFFFFFFFFFFFF
_BIN_LOG_HEADER_SIZE = 4  # both grammars raise MASTER_LOG_POS below 4 to 4

# ---------------------------------------------------------------------------------------------


class AdminStatementError(Exception):
    """A replication admin statement is refused: ``code``, ``sqlstate`` and ``message`` are what the client sees."""

    def __init__(self, code: int, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.sqlstate = sqlstate
        self.message = message

    def __repr__(self) -> str:
        return f"AdminStatementError({self.code}, {self.sqlstate!r}, {self.message!r})"


def _wrong_arguments(what: str) -> AdminStatementError:
    return AdminStatementError(ER_WRONG_ARGUMENTS, "HY000", f"Incorrect arguments to {what}")


def _unsupported(what: str, why: str) -> AdminStatementError:
    return AdminStatementError(ER_NOT_SUPPORTED_YET, "42000", f"relayproxy does not support '{what}': {why}")


# ---------------------------------------------------------------------------------------------
# Statements


@dataclass(frozen=True)
class StopReplica:
    """STOP SLAVE | STOP REPLICA [IO_THREAD] [, SQL_THREAD] (no thread named: both)."""

    io_thread: bool = True
    sql_thread: bool = True


@dataclass(frozen=True)
class StartReplica:
    """START SLAVE | START REPLICA [IO_THREAD] [, SQL_THREAD] (no thread named: both)."""

    io_thread: bool = True
    sql_thread: bool = True


@dataclass(frozen=True)
class ResetReplica:
    """RESET SLAVE | RESET REPLICA [ALL]."""

    all: bool = False


@dataclass(frozen=True, repr=False)
class ChangeMaster:
    """CHANGE MASTER TO / CHANGE REPLICATION SOURCE TO: ``options`` maps canonical keys (``OPTION_KEYS``) to values.

    Only ``options`` takes part in equality; ``statement`` and ``keywords`` (the option names as written, in the
    order of ``options``) say how it was spelled, for ``check_flavour`` and ``render_change_master``.
    """

    options: dict[str, Any]
    statement: str = field(default="CHANGE MASTER", compare=False)
    keywords: tuple[str, ...] = field(default=(), compare=False)
    connection: str = field(default="", compare=False)  # a MariaDB connection name (the relay has none)

    def __repr__(self) -> str:
        shown = {k: ("***" if k == "password" else v) for k, v in self.options.items()}
        return f"ChangeMaster(options={shown!r}, statement={self.statement!r})"

    __str__ = __repr__

    @classmethod
    def for_server(cls, flavour: str, version: tuple[int, ...] = (), *, gtid: bool | str | None = None,
                   connection: str = "", **options: Any) -> ChangeMaster:
        """The statement a server of ``flavour`` and ``version`` parses, for ``render_change_master``: CHANGE
        REPLICATION SOURCE TO with SOURCE_ names on MySQL 8.0.23+, else CHANGE MASTER TO with MASTER_ names.

        ``options`` are canonical keys (``OPTION_KEYS``, and ``delay``, which the relay itself refuses), in the
        order given. ``gtid`` comes last, in the flavour's words: True follows by GTID (MariaDB MASTER_USE_GTID =
        slave_pos, MySQL *_AUTO_POSITION = 1), False by file/position (no / 0), a string is MariaDB's value.
        """
        if gtid is not None:
            if flavour == "mariadb":
                options["use_gtid"] = gtid if isinstance(gtid, str) else "slave_pos" if gtid else "no"
            elif isinstance(gtid, str):
                raise ValueError(f"MASTER_USE_GTID={gtid} is MariaDB's; MySQL takes gtid=True or False")
            else:
                options["auto_position"] = gtid
        unknown = sorted(set(options) - set(_RENDERED_OPTION_BY_KEY))
        if unknown:
            raise ValueError(f"unknown CHANGE MASTER option keys: {', '.join(unknown)}")
        source = flavour == "mysql" and tuple(version) >= (8, 0, 23)
        cmd = cls(options, "CHANGE REPLICATION SOURCE" if source else "CHANGE MASTER", connection=connection)
        check_flavour(cmd, flavour)
        return cmd


AdminStatement = StopReplica | StartReplica | ResetReplica | ChangeMaster


# ---------------------------------------------------------------------------------------------
# The option table: canonical key, MASTER_ keyword, SOURCE_ keyword (None: MariaDB only), value kind.


class _Option(NamedTuple):
    key: str
    master: str
    source: str | None
    kind: str  # string | port | uint32 | bool | heartbeat | use_gtid | log_pos


_OPTIONS: tuple[_Option, ...] = (
    _Option("host", "MASTER_HOST", "SOURCE_HOST", "string"),
    _Option("port", "MASTER_PORT", "SOURCE_PORT", "port"),
    _Option("user", "MASTER_USER", "SOURCE_USER", "string"),
    _Option("password", "MASTER_PASSWORD", "SOURCE_PASSWORD", "string"),
    _Option("ssl", "MASTER_SSL", "SOURCE_SSL", "bool"),
    _Option("ssl_ca", "MASTER_SSL_CA", "SOURCE_SSL_CA", "string"),
    _Option("ssl_capath", "MASTER_SSL_CAPATH", "SOURCE_SSL_CAPATH", "string"),
    _Option("ssl_cert", "MASTER_SSL_CERT", "SOURCE_SSL_CERT", "string"),
    _Option("ssl_key", "MASTER_SSL_KEY", "SOURCE_SSL_KEY", "string"),
    _Option("ssl_cipher", "MASTER_SSL_CIPHER", "SOURCE_SSL_CIPHER", "string"),
    _Option("ssl_verify_server_cert", "MASTER_SSL_VERIFY_SERVER_CERT", "SOURCE_SSL_VERIFY_SERVER_CERT", "bool"),
    _Option("connect_retry", "MASTER_CONNECT_RETRY", "SOURCE_CONNECT_RETRY", "uint32"),
    _Option("heartbeat_period", "MASTER_HEARTBEAT_PERIOD", "SOURCE_HEARTBEAT_PERIOD", "heartbeat"),
    _Option("use_gtid", "MASTER_USE_GTID", None, "use_gtid"),
    _Option("auto_position", "MASTER_AUTO_POSITION", "SOURCE_AUTO_POSITION", "bool"),
    _Option("log_file", "MASTER_LOG_FILE", "SOURCE_LOG_FILE", "string"),
    _Option("log_pos", "MASTER_LOG_POS", "SOURCE_LOG_POS", "log_pos"),
    _Option("public_key_path", "MASTER_PUBLIC_KEY_PATH", "SOURCE_PUBLIC_KEY_PATH", "string"),
    _Option("get_public_key", "GET_MASTER_PUBLIC_KEY", "GET_SOURCE_PUBLIC_KEY", "bool"),
)
OPTION_KEYS: tuple[str, ...] = tuple(o.key for o in _OPTIONS)
_OPTION_BY_KEY = {o.key: o for o in _OPTIONS}
_OPTION_BY_KEYWORD = {kw: o for o in _OPTIONS for kw in (o.master, o.source) if kw}
# What ChangeMaster.for_server renders besides: options the relay refuses (_UNSUPPORTED_OPTIONS) but a server takes.
_RENDERED_OPTION_BY_KEY = {**_OPTION_BY_KEY, "delay": _Option("delay", "MASTER_DELAY", "SOURCE_DELAY", "uint32")}
_USE_GTID_VALUES = ("slave_pos", "current_pos", "no")

# Options the servers know that the relay does not act on: refused by name (1235), not as a syntax error.
_UNSUPPORTED_OPTIONS = frozenset({
    "MASTER_BIND", "SOURCE_BIND", "MASTER_RETRY_COUNT", "SOURCE_RETRY_COUNT", "MASTER_DELAY", "SOURCE_DELAY",
    "MASTER_SSL_CRL", "SOURCE_SSL_CRL", "MASTER_SSL_CRLPATH", "SOURCE_SSL_CRLPATH", "MASTER_TLS_VERSION",
    "SOURCE_TLS_VERSION", "MASTER_TLS_CIPHERSUITES", "SOURCE_TLS_CIPHERSUITES", "MASTER_COMPRESSION_ALGORITHMS",
    "SOURCE_COMPRESSION_ALGORITHMS", "MASTER_ZSTD_COMPRESSION_LEVEL", "SOURCE_ZSTD_COMPRESSION_LEVEL",
    "SOURCE_CONNECTION_AUTO_FAILOVER", "NETWORK_NAMESPACE", "IGNORE_SERVER_IDS", "DO_DOMAIN_IDS",
    "IGNORE_DOMAIN_IDS", "RELAY_LOG_FILE", "RELAY_LOG_POS", "PRIVILEGE_CHECKS_USER", "REQUIRE_ROW_FORMAT",
    "REQUIRE_TABLE_PRIMARY_KEY_CHECK", "ASSIGN_GTIDS_TO_ANONYMOUS_TRANSACTIONS", "GTID_ONLY",
    "MASTER_DEMOTE_TO_SLAVE",
})
# Option names whose value an error message may quote: known, and holding no secret.
_QUOTABLE_OPTIONS = frozenset(kw for kw, o in _OPTION_BY_KEYWORD.items() if o.key != "password") | (
    _UNSUPPORTED_OPTIONS)


# ---------------------------------------------------------------------------------------------
# Error text. The tokens are the SQL layer's (``parser.tokenize``, MySQL's lexical rules) read with
# ``strict=False``: what cannot be read is a ``bad`` token, reported here like any other syntax error.

_STATEMENT_WORDS = frozenset({
    "CHANGE", "MASTER", "REPLICATION", "SOURCE", "FILTER", "TO", "STOP", "START", "RESET", "SLAVE", "REPLICA",
    "SLAVES", "REPLICAS", "ALL", "IO_THREAD", "SQL_THREAD", "RELAY_THREAD", "UNTIL", "FOR", "CHANNEL", "USER",
    "DEFAULT_AUTH", "PLUGIN_DIR", "SLAVE_POS", "CURRENT_POS", "NO",
})
# Characters MySQL reads as one-character tokens that the SQL tokenizer has no operator for (``bad`` tokens
# here; ``@`` only when no variable name follows it): like operators, shown even where a password may be.
_PUNCTUATION = frozenset("@:?[]{}")


def _is_punctuation(tok: Token) -> bool:
    return tok.kind == "op" or (tok.kind == "bad" and tok.value in _PUNCTUATION)


def _names_a_password(tok: Token) -> bool:
    """A word or an @variable (``@x``, ``@@x``) whose name contains PASSWORD."""
    name = tok.value if tok.kind in ("word", "uservar") else tok.value[1] if tok.kind == "sysvar" else ""
    return "PASSWORD" in name.upper()


def _shown_tokens(tokens: list[Token]) -> set[int]:
    """Indexes of the tokens an error message may quote; the others show as ``***``.

    A whitelist, because a statement an error is about may be damaged anywhere: operators and stray characters;
    the statement's keywords and option names (a word followed by ``=``, so a mistyped option is named); the value
    right after ``=`` of a known option that holds no secret. Never anything up to the next comma after a word
    naming a password, nor an unclosed quote or comment (it swallows the rest of the statement). An @variable
    is never shown.
    """
    shown: set[int] = set()
    hidden: set[int] = set()
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if tok.kind == "op" or (tok.kind == "bad" and tok.value not in (None, "/*")):
            shown.add(i)
        elif tok.kind == "word":
            upper = tok.value.upper()
            if upper in _STATEMENT_WORDS or upper in _OPTION_BY_KEYWORD or upper in _UNSUPPORTED_OPTIONS or (
                    nxt is not None and nxt.kind == "op" and nxt.value == "="):
                shown.add(i)
        if _names_a_password(tok):
            j = i + 1
            while j < len(tokens) and not (tokens[j].kind == "op" and tokens[j].value == ","):
                hidden.add(j)
                j += 1
        if (tok.kind == "op" and tok.value == "=" and i > 0 and tokens[i - 1].kind == "word"
                and tokens[i - 1].value.upper() in _QUOTABLE_OPTIONS and nxt is not None):
            negative = nxt.kind == "op" and nxt.value == "-"
            value = i + 2 if negative else i + 1
            if value < len(tokens) and tokens[value].kind in ("string", "number", "word"):
                shown.add(value)
    return shown - {j for j in hidden if not _is_punctuation(tokens[j])}


def _near(sql: str, tokens: list[Token], index: int, shown: set[int], limit: int = 80) -> str:
    """The servers' ``near '...'`` text from token ``index`` on, what may not be shown as ``***``."""
    parts: list[str] = []
    size = 0
    prev_end = tokens[index].start
    for k in range(index, len(tokens)):
        tok = tokens[k]
        if tok.kind == "eof" or size >= limit:
            break
        gap = sql[prev_end:tok.start]
        if gap:
            parts.append(" " if ("/*" in gap or "#" in gap or "--" in gap) else gap)
        if k in shown:
            parts.append(sql[tok.start:tok.end])
        elif tok.kind == "string":
            parts.append("'***'")
        elif tok.kind == "bad" and tok.value in (None, "/*"):  # an unclosed quote or comment
            parts.append(sql[tok.start:tok.start + 2] if tok.value == "/*" else sql[tok.start] + "***")
        else:
            parts.append("***")
        size = sum(len(p) for p in parts)
        prev_end = tok.end
    return "".join(parts)[:limit]


def _syntax_error_text(near: str, line: int, product: str) -> str:
    return (f"You have an error in your SQL syntax; check the manual that corresponds to your {product} server "
            f"version for the right syntax to use near '{near}' at line {line}")


# ---------------------------------------------------------------------------------------------
# Parser (recursive descent over the token list)


class _Parser:
    def __init__(self, sql: str, tokens: list[Token], product: str) -> None:
        self.sql = sql
        self.tokens = tokens
        self.product = product
        self.i = 0
        self._shown: set[int] | None = None

    @property
    def cur(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def is_word(self, *words: str) -> bool:
        tok = self.cur
        return tok.kind == "word" and tok.value.upper() in words

    def accept_word(self, *words: str) -> str | None:
        if self.is_word(*words):
            return self.advance().value.upper()
        return None

    def expect_word(self, *words: str, at: int | None = None) -> str:
        word = self.accept_word(*words)
        if word is None:
            raise self.error(at)
        return word

    def accept_op(self, op: str) -> bool:
        if self.cur.kind == "op" and self.cur.value == op:
            self.advance()
            return True
        return False

    def expect_op(self, op: str, at: int | None = None) -> None:
        if not self.accept_op(op):
            raise self.error(at)

    def string(self, at: int | None = None) -> str:
        if self.cur.kind != "string":
            raise self.error(at)
        return self.advance().value

    def end(self) -> None:
        self.accept_op(";")
        if self.cur.kind != "eof":
            raise self.error()

    def error(self, at: int | None = None) -> AdminStatementError:
        """ER_PARSE_ERROR near token ``at`` (default: the current one), secrets masked."""
        index = self.i if at is None else at
        if self._shown is None:
            self._shown = _shown_tokens(self.tokens)
        near = _near(self.sql, self.tokens, index, self._shown)
        line = self.sql.count("\n", 0, self.tokens[index].start) + 1
        return AdminStatementError(ER_PARSE_ERROR, "42000", _syntax_error_text(near, line, self.product))

    # -- statements ------------------------------------------------------------------------------------

    def statement(self) -> AdminStatement | None:
        verb = self.accept_word("STOP", "START", "CHANGE", "RESET")
        if verb is None:
            return None
        if verb == "CHANGE":
            return self.change()
        if verb == "RESET":
            return self.reset()
        return self.start_stop(verb)

    def connection_name(self) -> str:
        """MariaDB's optional 'connection_name' after SLAVE / MASTER."""
        return self.advance().value if self.cur.kind == "string" else ""

    def for_channel(self) -> str:
        """MySQL's optional FOR CHANNEL 'name' (MariaDB 10.7+ accepts it too)."""
        if self.accept_word("FOR"):
            self.expect_word("CHANNEL")
            return self.string()
        return ""

    def start_stop(self, verb: str) -> StartReplica | StopReplica | None:
        noun: str | None
        if self.accept_word("ALL"):  # MariaDB: START | STOP ALL SLAVES: the relay has one connection
            noun = self.expect_word("SLAVES", "REPLICAS")
            name = ""
        else:
            noun = self.accept_word("SLAVE", "REPLICA")
            if noun is None:
                return None  # START TRANSACTION, START GROUP_REPLICATION ...: not a replication admin statement
            name = self.connection_name()
        threads: set[str] = set()
        if self.is_word("IO_THREAD", "RELAY_THREAD", "SQL_THREAD"):
            while True:
                word = self.expect_word("IO_THREAD", "RELAY_THREAD", "SQL_THREAD")
                threads.add("sql" if word == "SQL_THREAD" else "io")
                if not self.accept_op(","):
                    break
        if verb == "START":
            if self.is_word("UNTIL"):
                raise _unsupported(f"START {noun} UNTIL",
                                   "the relay has no applier to stop at a position; it relays whole transactions")
            if self.is_word("USER", "PASSWORD", "DEFAULT_AUTH", "PLUGIN_DIR"):
                raise _unsupported(f"START {noun} ... {self.cur.value.upper()}",
                                   "give the master's account with CHANGE MASTER TO MASTER_USER, MASTER_PASSWORD")
        channel = self.for_channel()
        self.end()
        _check_connection(name, channel)
        io, sql = (True, True) if not threads else ("io" in threads, "sql" in threads)
        return StartReplica(io, sql) if verb == "START" else StopReplica(io, sql)

    def reset(self) -> ResetReplica | None:
        if self.accept_word("SLAVE", "REPLICA") is None:
            return None  # RESET MASTER, RESET BINARY LOGS AND GTIDS, RESET QUERY CACHE ...
        name = self.connection_name()
        reset_all = self.accept_word("ALL") is not None
        channel = self.for_channel()
        self.end()
        _check_connection(name, channel)
        return ResetReplica(all=reset_all)

    def change(self) -> ChangeMaster:
        if self.accept_word("MASTER"):
            statement = "CHANGE MASTER"
            name = self.connection_name()
        elif self.accept_word("REPLICATION"):
            if self.is_word("FILTER"):
                raise _unsupported("CHANGE REPLICATION FILTER", "the relay keeps every event the master sends")
            self.expect_word("SOURCE")
            statement, name = "CHANGE REPLICATION SOURCE", ""
        else:
            raise self.error()
        self.expect_word("TO")
        options: dict[str, Any] = {}
        keywords: list[str] = []
        while True:
            if len(options) >= MAX_OPTIONS:
                raise AdminStatementError(ER_UNKNOWN_ERROR, "HY000",
                                          f"{statement} names more than {MAX_OPTIONS} options")
            start = self.i
            tok = self.cur
            if tok.kind != "word":
                raise self.error()
            keyword = tok.value.upper()
            spec = _OPTION_BY_KEYWORD.get(keyword)
            if spec is None:
                if keyword in _UNSUPPORTED_OPTIONS:
                    raise _unsupported(f"{statement} TO {keyword}",
                                       "the relay stores every event of the master and has no such setting")
                raise self.error()  # unknown option: near 'MASTER_HOSTT = ...'
            self.advance()
            self.expect_op("=", at=start)
            value = self.option_value(spec, keyword, start)
            if spec.key in options:
                raise AdminStatementError(ER_DUP_ARGUMENT, "HY000", f"Option '{keyword}' used twice in statement")
            options[spec.key] = value
            keywords.append(keyword)
            if not self.accept_op(","):
                break
        channel = self.for_channel()
        self.end()
        if name or channel:
            what = f"connection '{name}'" if name else f"channel '{channel}'"
            raise _unsupported(f"{statement} ... {what}",
                               "the relay follows one master, on the default unnamed connection")
        _check_combinations(options)
        return ChangeMaster(options, statement, tuple(keywords))

    def option_value(self, spec: _Option, keyword: str, start: int) -> Any:
        tok = self.cur
        kind = spec.kind
        if kind == "string":
            value = self.string(at=start)
            if "\n" in value or (spec.key == "host" and not value.strip()):
                raise _wrong_arguments(keyword)
            return value
        if kind == "use_gtid":
            word = tok.value.lower() if tok.kind == "word" else None
            if word not in _USE_GTID_VALUES:
                raise self.error(start)
            self.advance()
            return word
        if kind == "heartbeat":
            negative = self.accept_op("-")
            tok = self.cur
            if tok.kind != "number":
                raise self.error(start)
            self.advance()
            period = -float(tok.value) if negative else float(tok.value)
            if not 0.0 <= period <= HEARTBEAT_PERIOD_MAX:
                raise AdminStatementError(
                    ER_SLAVE_HEARTBEAT_VALUE_OUT_OF_RANGE, "HY000",
                    f"The requested value for the heartbeat period is either negative or exceeds the maximum "
                    f"allowed ({HEARTBEAT_PERIOD_MAX} seconds). ({keyword})")
            return 0.0 if period < 0.001 else period  # under 1 ms: the servers reset it to 0 (warning 1703)
        # Integer kinds: an unsigned integer literal, as the grammar's ulong_num / ulonglong_num.
        if tok.kind != "number" or isinstance(tok.value, float):
            raise self.error(start)
        self.advance()
        number = tok.value
        if kind == "port":
            if number > 65535:
                raise _wrong_arguments(f"{keyword} ({number} is not a TCP port: 0..65535)")
            return number
        if kind == "uint32":
            if number > _UINT32_MAX:
                raise _wrong_arguments(f"{keyword} ({number} is over {_UINT32_MAX})")
            return number
        if kind == "bool":
            if number > _UINT32_MAX:
                raise _wrong_arguments(f"{keyword} ({number} is over {_UINT32_MAX})")
            return number != 0
        if kind == "log_pos":
            if number > _UINT64_MAX:
                raise _wrong_arguments(f"{keyword} ({number} is over {_UINT64_MAX})")
            return max(_BIN_LOG_HEADER_SIZE, number)
        raise AssertionError(kind)


def _check_connection(name: str, channel: str) -> None:
    """Only the default unnamed connection exists on the relay."""
    if name:
        raise AdminStatementError(WARN_NO_MASTER_INFO, "HY000", f"There is no master connection '{name}'")
    if channel:
        raise AdminStatementError(ER_REPLICA_CHANNEL_DOES_NOT_EXIST, "HY000",
                                  f"Replication channel '{channel}' does not exist.")


def _check_combinations(options: dict[str, Any]) -> None:
    coordinates = "log_file" in options or "log_pos" in options
    if "use_gtid" in options and "auto_position" in options:
        raise _wrong_arguments("MASTER_USE_GTID and MASTER_AUTO_POSITION (MariaDB's and MySQL's GTID options: "
                               "give the one for the master's flavour)")
    if options.get("auto_position") and coordinates:
        # MySQL's text (share/messages_to_clients.txt, ER_BAD_SLAVE_AUTO_POSITION).
        raise AdminStatementError(ER_BAD_SLAVE_AUTO_POSITION, "HY000",
                                  "Parameters MASTER_LOG_FILE, MASTER_LOG_POS, RELAY_LOG_FILE and RELAY_LOG_POS "
                                  "cannot be set when MASTER_AUTO_POSITION is active.")
    if options.get("use_gtid") in ("slave_pos", "current_pos") and coordinates:
        raise _wrong_arguments(f"MASTER_USE_GTID={options['use_gtid']} with MASTER_LOG_FILE/MASTER_LOG_POS "
                               "(the relay would follow the GTID position and ignore the coordinates; "
                               "give MASTER_USE_GTID=no to start by position)")


def parse_admin_statement(sql: str, *, flavour: str = "mysql") -> AdminStatement | None:
    """Parse one STOP / START / CHANGE / RESET statement (an optional trailing ``;``).

    Returns the statement, or None when the text is not a replication admin statement (``START TRANSACTION``,
    ``RESET MASTER``, ``STOP GROUP_REPLICATION`` ...: the caller answers those). Raises ``AdminStatementError``
    otherwise. ``flavour`` only names the product in syntax errors; ``check_flavour`` checks what it accepts.
    """
    product = "MariaDB" if flavour == "mariadb" else "MySQL"
    if len(sql) > MAX_STATEMENT_BYTES or len(sql.encode("utf-8", "surrogatepass")) > MAX_STATEMENT_BYTES:
        raise AdminStatementError(ER_UNKNOWN_ERROR, "HY000",
                                  f"replication admin statement of more than {MAX_STATEMENT_BYTES} bytes refused")
    try:
        tokens = tokenize(sql, strict=False)
    except SqlError as err:  # a bound the tokenizer keeps (nesting, token count): the same words, as documented
        raise AdminStatementError(err.code, err.sqlstate, err.message) from None
    return _Parser(sql, tokens, product).statement()


# ---------------------------------------------------------------------------------------------
# Flavour check and rendering


def _keywords_of(cmd: ChangeMaster) -> list[str]:
    """The option names of ``cmd`` as written, or the default spelling of its statement."""
    if len(cmd.keywords) == len(cmd.options):
        return list(cmd.keywords)
    source = cmd.statement == "CHANGE REPLICATION SOURCE"
    return [(_RENDERED_OPTION_BY_KEY[k].source if source else None) or _RENDERED_OPTION_BY_KEY[k].master
            for k in cmd.options]


def _render_value(key: str, value: Any, mask_password: bool) -> str:
    if key == "password" and mask_password:
        return "'***'"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    if key == "use_gtid":
        return value
    return sql_string(value)


def _render_options(keys: list[str], keywords: list[str], options: dict[str, Any], mask_password: bool) -> str:
    return ", ".join(f"{kw}={_render_value(k, options[k], mask_password)}" for k, kw in zip(keys, keywords))


def render_change_master(cmd: ChangeMaster, *, mask_password: bool = False) -> str:
    """The statement text of ``cmd`` (``parse_admin_statement`` of it gives ``cmd`` back): the one builder of
    CHANGE MASTER / CHANGE REPLICATION SOURCE text, for the relay and for the servers (``ChangeMaster.for_server``)."""
    keys = list(cmd.options)
    name = f" {_render_value('connection', cmd.connection, False)}" if cmd.connection else ""
    return f"{cmd.statement}{name} TO {_render_options(keys, _keywords_of(cmd), cmd.options, mask_password)}"


def check_flavour(cmd: AdminStatement, flavour: str) -> None:
    """Refuse a CHANGE MASTER the relay's flavour of server would not parse, with that server's 1064: MariaDB has no
    MASTER_AUTO_POSITION, public-key options, SOURCE_ names or CHANGE REPLICATION SOURCE; MySQL no MASTER_USE_GTID."""
    if flavour not in ("mysql", "mariadb"):
        raise ValueError(f"flavour must be 'mysql' or 'mariadb', got {flavour!r}")
    if not isinstance(cmd, ChangeMaster):
        return
    product = "MariaDB" if flavour == "mariadb" else "MySQL"
    keys = list(cmd.options)
    keywords = _keywords_of(cmd)
    if flavour == "mariadb" and cmd.statement == "CHANGE REPLICATION SOURCE":
        near = "REPLICATION SOURCE TO " + _render_options(keys, keywords, cmd.options, True)
        raise AdminStatementError(ER_PARSE_ERROR, "42000", _syntax_error_text(near[:80], 1, product))
    for n, (key, keyword) in enumerate(zip(keys, keywords)):
        if flavour == "mysql":
            foreign = key == "use_gtid"
        else:
            foreign = key in ("auto_position", "public_key_path", "get_public_key") or "SOURCE_" in keyword
        if foreign:
            near = _render_options(keys[n:], keywords[n:], cmd.options, True)
            raise AdminStatementError(ER_PARSE_ERROR, "42000", _syntax_error_text(near[:80], 1, product))
