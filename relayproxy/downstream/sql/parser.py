"""The SQL tokenizer and the recursive-descent parser: statement text in, tokens and expression trees out (no
evaluation here). MySQL's lexical rules: quotes, escapes, comments, executable comments, backquoted names."""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from ...wire.errors import ER_PARSE_ERROR
from .errors import SqlError, unsupported
from .expressions import (
    INTERVAL_UNITS,
    Arith,
    Between,
    Call,
    ColumnRef,
    Compare,
    In,
    IntervalArith,
    Is,
    Like,
    Literal,
    Logic,
    Node,
    SysVarRef,
    Unary,
    UserVarRef,
)
from .functions import BARE_FUNCTIONS, FUNCTIONS
from ...wire.errors import ER_ILLEGAL_VALUE_FOR_TYPE
from .limits import BIGINT_UNSIGNED_MAX, MAX_EXPRESSION_DEPTH, MAX_NESTING, MAX_TERMS, MAX_TOKENS, SCAN_CHARS_PER_UNIT
from .slicing import work

# ---------------------------------------------------------------------------------------------
# Tokenizer


class Token(NamedTuple):
    """One lexical token. ``start``/``end`` index the original text (column names are slices of it).

    kinds: ``word`` (keyword or bare identifier, value as written), ``qident`` (`quoted`), ``string``,
    ``number`` (int or float), ``sysvar`` (value ``(scope or None, lower-case name)``), ``uservar``
    (lower-case name), ``op``, ``eof``.

    A named tuple, not a class with slots: a tuple of strings and numbers leaves the cyclic collector's books at
    its first collection, so the thirty thousand tokens of a statement at MAX_TOKENS do not push the collector
    into a full collection (a stall of the whole loop) the way as many tracked objects would.
    """

    kind: str
    value: Any
    start: int
    end: int


_WORD_RE = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]+")
_USERVAR_RE = re.compile(r"[A-Za-z0-9_$.\u0080-\U0010ffff]+")
# ASCII digits only, as MySQL (my_isdigit): other scripts' digits are identifier characters.
_NUMBER_RE = re.compile(r"0[xX][0-9A-Fa-f]+|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OPERATORS = ("<=>", ":=", "<=", ">=", "<>", "!=", "||", "&&", "(", ")", ",", ".", "=", "<", ">", "+", "-",
              "*", "/", "%", ";", "!", "~", "^", "&", "|")
# The operators by first character, longest first (the order above): one dict look-up a token, not 26 tries.
_OPERATORS_BY_FIRST: dict[str, tuple[str, ...]] = {}
for _op in _OPERATORS:
    _OPERATORS_BY_FIRST[_op[0]] = _OPERATORS_BY_FIRST.get(_op[0], ()) + (_op,)
del _op
# Whitespace as str.isspace() has it (re's \s is the same Unicode test), skipped in one match, not a char a turn.
_SPACE_RE = re.compile(r"\s+")
# The run of a quoted text up to its next quote (or, where escapes apply, backslash): copied in one piece.
_QUOTED_RUNS = {("'", True): re.compile(r"[^'\\]+"), ('"', True): re.compile(r'[^"\\]+'),
                ("`", False): re.compile(r"[^`]+"), ("'", False): re.compile(r"[^']+"),
                ('"', False): re.compile(r'[^"]+'), ("`", True): re.compile(r"[^`\\]+")}
# MySQL string escapes; \% and \_ keep their backslash (they only mean something to LIKE).
_ESCAPES = {"0": "\0", "'": "'", '"': '"', "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a",
            "\\": "\\", "%": "\\%", "_": "\\_"}
_SCOPES = {"global": "global", "session": "session", "local": "session"}
_EXECUTABLE_COMMENT_RE = re.compile(r"/\*M?![0-9]*")


def _line_of(sql: str, pos: int) -> int:
    return sql.count("\n", 0, pos) + 1


def syntax_error(sql: str, pos: int, flavour: str = "mysql") -> SqlError:
    near = sql[pos:pos + 80]
    product = "MariaDB" if flavour == "mariadb" else "MySQL"
    return SqlError(
        ER_PARSE_ERROR,
        "42000",
        f"You have an error in your SQL syntax; check the manual that corresponds to your {product} server "
        f"version for the right syntax to use near '{near}' at line {_line_of(sql, pos)}",
    )


def _read_quoted(sql: str, i: int, quote: str, *, escapes: bool) -> tuple[str, int]:
    """The text of a quoted string or identifier opening at ``sql[i]``, and the index after it.

    Runs without a quote or escape are copied in one piece; each escape or doubled quote is a turn of the loop,
    charged to the statement's slice (slicing.work) so a megabyte of ``\\n`` is read between turns of the
    event loop, not in one."""
    out: list[str] = []
    j, n = i + 1, len(sql)
    run = _QUOTED_RUNS[(quote, escapes)]
    turns = 0
    while j < n:
        m = run.match(sql, j)
        if m is not None:
            out.append(m.group())
            j = m.end()
            if j >= n:
                break
        turns += 1
        if turns == SCAN_CHARS_PER_UNIT:
            work(1)
            turns = 0
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
    raise syntax_error(sql, i)


def _read_name(sql: str, i: int) -> tuple[str, int]:
    """A bare or `quoted` name at ``i`` (for @@variables)."""
    if i < len(sql) and sql[i] == "`":
        return _read_quoted(sql, i, "`", escapes=False)
    m = _WORD_RE.match(sql, i)
    if m is None:
        raise syntax_error(sql, i)
    return m.group(), m.end()


def _number_value(sql: str, i: int, text: str, hexadecimal: bool, real: bool) -> int | float | bytes:
    """A numeric literal's value. As in MySQL, a decimal integer past BIGINT UNSIGNED is not an integer (MySQL
    makes it a DECIMAL, the relay a DOUBLE), one past DOUBLE is refused (1367), and a hexadecimal literal past 8
    bytes is a binary string: never an integer of unbounded size."""
    if hexadecimal:
        digits = text[2:].lstrip("0")
        if len(digits) <= 16:
            return int(text, 16)
        return bytes.fromhex(("0" if len(text) % 2 else "") + text[2:])
    if not real and len(text) <= 20:
        value = int(text)
        if value <= BIGINT_UNSIGNED_MAX:
            return value
    number = float(text)
    if not math.isfinite(number):
        raise SqlError(ER_ILLEGAL_VALUE_FOR_TYPE, "22007",
                       f"Illegal double '{text[:64]}{'...' if len(text) > 64 else ''}' value found during parsing")
    return number


def _read_token(sql: str, i: int) -> Token:
    """The token opening at ``sql[i]`` (not whitespace, not a comment); raises SqlError if there is none."""
    n = len(sql)
    c = sql[i]
    if c in "'\"":
        value, end = _read_quoted(sql, i, c, escapes=True)
        return Token("string", value, i, end)
    if c == "`":
        value, end = _read_quoted(sql, i, "`", escapes=False)
        return Token("qident", value, i, end)
    if sql.startswith("@@", i):
        name, end = _read_name(sql, i + 2)
        scope = None
        if end < n and sql[end] == "." and name.lower() in _SCOPES:
            scope = _SCOPES[name.lower()]
            name, end = _read_name(sql, end + 1)
        return Token("sysvar", (scope, name.lower()), i, end)
    if c == "@":
        if i + 1 < n and sql[i + 1] in "'\"`":
            name, end = _read_quoted(sql, i + 1, sql[i + 1], escapes=sql[i + 1] != "`")
        else:
            m = _USERVAR_RE.match(sql, i + 1)
            if m is None:
                raise syntax_error(sql, i)
            name, end = m.group(), m.end()
        return Token("uservar", name.lower(), i, end)
    m = _NUMBER_RE.match(sql, i)
    word = _WORD_RE.match(sql, i)
    if m is not None:
        text = m.group()
        hexadecimal = text[:2].lower() == "0x"
        real = not hexadecimal and any(ch in text for ch in ".eE")
        # Digits running into letters make a word (1abc, 0x1G), as in MySQL; a real number does not (1e5x is
        # 1e5 then x: sql_lex.cc returns FLOAT_NUM as soon as the exponent's digits end).
        if real or word is None or word.end() <= m.end():
            return Token("number", _number_value(sql, i, text, hexadecimal, real), i, m.end())
    if word is not None:
        return Token("word", word.group(), i, word.end())
    for op in _OPERATORS_BY_FIRST.get(c, ()):
        if sql.startswith(op, i):
            return Token("op", op, i, i + len(op))
    raise syntax_error(sql, i)


def _limit_error(sql: str, pos: int, what: str) -> SqlError:
    """A statement past one of limits.py's bounds: the parse error servers give, naming the bound."""
    near = sql[pos:pos + 80]
    return SqlError(ER_PARSE_ERROR, "42000", f"{what} near '{near}' at line {_line_of(sql, pos)}")


def nesting_error(sql: str, pos: int) -> SqlError:
    return _limit_error(sql, pos, f"relayproxy refuses expressions nested more than {MAX_NESTING} deep "
                                  "(parentheses, function calls, prefix operators)")


def _too_many_tokens(sql: str, pos: int) -> SqlError:
    return _limit_error(sql, pos, f"relayproxy refuses statements of more than {MAX_TOKENS} tokens and comments")


def tokenize(sql: str, *, strict: bool = True) -> list[Token]:
    """Split a statement into tokens, dropping comments; the last token is ``eof``.

    ``/*! ... */`` and ``/*M! ... */`` (executable comments, as mysqldump and clients write them) are
    read as SQL, their version number skipped; other ``/* */``, ``-- `` and ``#`` comments are dropped.

    What cannot be read (an unclosed quote or comment, a stray character) raises SqlError, or with
    ``strict=False`` becomes a ``bad`` token and tokenizing goes on: an unclosed quote (value None) or comment
    (value ``"/*"``) runs to the end of the text; otherwise the token is the one character (value that
    character; ``@`` of a variable that cannot be read), and the next token starts after it.

    Bounded (limits.py), whatever ``strict``: reading stops with a 1064 at the ``MAX_TOKENS + 1``-th token or
    comment and at a parenthesis opened ``MAX_NESTING + 1`` deep (the parser would refuse it), so a statement's
    tokens cost O(the limit), not O(the statement). Each token and comment is charged to the statement's slice
    (slicing.work): run under ``slicing.run_sliced``, the event loop turns every few hundred of them.
    """
    tokens: list[Token] = []
    append = tokens.append
    i, n = 0, len(sql)
    in_executable = False
    depth = 0  # parentheses open
    comments = 0  # counted with the tokens: a megabyte of /**/ is as much to read as of 1+1
    space = _SPACE_RE.match
    while True:
        # Whitespace and comments.
        while i < n:
            c = sql[i]
            if c.isspace():
                blank = space(sql, i)
                assert blank is not None  # \s matches every character str.isspace() does
                i = blank.end()
            elif c == "/" and sql.startswith("/*", i):
                comments += 1
                if len(tokens) + comments > MAX_TOKENS:
                    raise _too_many_tokens(sql, i)
                work(1)
                m = _EXECUTABLE_COMMENT_RE.match(sql, i)
                if m is not None and not in_executable:
                    in_executable = True
                    i = m.end()
                    continue
                end = sql.find("*/", i + 2)
                if end < 0:
                    if strict:
                        raise syntax_error(sql, i)
                    append(Token("bad", "/*", i, n))
                    i = n
                    break
                i = end + 2
            elif in_executable and c == "*" and sql.startswith("*/", i):
                in_executable = False
                i += 2
            elif c == "#" or (c == "-" and sql.startswith("--", i)
                              and (i + 2 >= n or sql[i + 2].isspace() or ord(sql[i + 2]) < 32)):
                comments += 1
                if len(tokens) + comments > MAX_TOKENS:
                    raise _too_many_tokens(sql, i)
                work(1)
                end = sql.find("\n", i)
                i = n if end < 0 else end + 1
            else:
                break
        if i >= n:
            append(Token("eof", None, n, n))
            return tokens
        if len(tokens) + comments >= MAX_TOKENS:
            raise _too_many_tokens(sql, i)
        work(1)
        try:
            token = _read_token(sql, i)
        except SqlError:
            if strict:
                raise
            quote = sql[i] in "'\"`"
            token = Token("bad", None if quote else sql[i], i, n if quote else i + 1)
        if token.kind == "op":
            if token.value == "(":
                depth += 1
                if depth > MAX_NESTING:
                    raise nesting_error(sql, i)
            elif token.value == ")" and depth:
                depth -= 1
        append(token)
        i = token.end


# ---------------------------------------------------------------------------------------------
# Parser (recursive descent over the token list)

# Words that end a select item: after them comes a clause, not an alias.
CLAUSE_WORDS = frozenset({
    "FROM", "WHERE", "LIMIT", "INTO", "FOR", "UNION", "ORDER", "GROUP", "HAVING", "LOCK", "WINDOW", "AND", "OR",
    "XOR", "NOT", "LIKE", "IN", "IS", "BETWEEN", "DIV", "MOD", "REGEXP", "RLIKE", "ESCAPE", "EXCEPT", "INTERSECT",
})


class Parser:
    def __init__(self, sql: str, tokens: list[Token], flavour: str):
        self.sql = sql
        self.tokens = tokens
        self.i = 0
        self.flavour = flavour
        self.last_end = 0
        # Bounds (limits.py): nesting of the recursive descent, depth of the tree built, nodes in the statement.
        self.nesting = 0
        self.terms = 0
        self._depths: dict[int, int] = {}

    # -- token helpers ---------------------------------------------------------------------------
    @property
    def cur(self) -> Token:
        return self.tokens[self.i]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        work(1)  # the statement's slice (slicing.py): a token consumed, with the parsing around it
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
        return syntax_error(self.sql, (tok or self.cur).start, self.flavour)

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

    # -- bounds ----------------------------------------------------------------------------------
    def _limit_error(self, what: str) -> SqlError:
        return _limit_error(self.sql, self.cur.start, what)

    def _nest(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise nesting_error(self.sql, self.cur.start)

    def _leaf(self, node: Node) -> Node:
        return self._node(node)

    def _node(self, node: Node, *children: Node) -> Node:
        """Count a node built from ``children`` against MAX_TERMS and MAX_EXPRESSION_DEPTH."""
        self.terms += 1
        work(1)
        if self.terms > MAX_TERMS:
            raise self._limit_error(f"relayproxy refuses statements of more than {MAX_TERMS} terms")
        depth = 0
        depths = self._depths
        for count, child in enumerate(children, 1):  # an IN list or a call may have thousands
            child_depth = depths.get(id(child), 1)
            if child_depth > depth:
                depth = child_depth
            if not count & 7:
                work(1)
        depth += 1
        if depth > MAX_EXPRESSION_DEPTH:
            raise self._limit_error(f"relayproxy refuses expressions more than {MAX_EXPRESSION_DEPTH} operators deep")
        self._depths[id(node)] = depth
        return node

    # -- expressions -----------------------------------------------------------------------------
    def expr(self) -> Node:
        self._nest()
        try:
            left = self.and_expr()
            while self.accept_word("OR") or self.accept_op("||"):
                right = self.and_expr()
                left = self._node(Logic("OR", left, right), left, right)
            return left
        finally:
            self.nesting -= 1

    def and_expr(self) -> Node:
        left = self.not_expr()
        while self.accept_word("AND") or self.accept_op("&&"):
            right = self.not_expr()
            left = self._node(Logic("AND", left, right), left, right)
        return left

    def not_expr(self) -> Node:
        if self.accept_word("NOT"):
            self._nest()
            try:
                operand = self.not_expr()
            finally:
                self.nesting -= 1
            return self._node(Unary("NOT", operand), operand)
        return self.predicate()

    def predicate(self) -> Node:
        left = self.additive()
        while True:
            op = self.accept_op("=", "<=>", "!=", "<>", "<", ">", "<=", ">=")
            if op is not None:
                right = self.additive()
                left = self._node(Compare(op, left, right), left, right)
                continue
            if self.accept_word("IS"):
                negate = self.accept_word("NOT") is not None
                what = self.expect_word("NULL", "TRUE", "FALSE")
                left = self._node(Is(left, what, negate), left)
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
                left = self._node(Like(left, pattern, negate, escape), left, pattern)
            elif self.accept_word("IN"):
                self.expect_op("(")
                items = [self.expr()]
                while self.accept_op(","):
                    items.append(self.expr())
                self.expect_op(")")
                left = self._node(In(left, tuple(items), negate), left, *items)
            elif self.accept_word("BETWEEN"):
                low = self.additive()
                self.expect_word("AND")
                high = self.additive()
                left = self._node(Between(left, low, high, negate), left, low, high)
            else:
                return left

    def additive(self) -> Node:
        left = self.multiplicative()
        while True:
            op = self.accept_op("+", "-")
            if op is None:
                return left
            if self.accept_word("INTERVAL"):
                amount = self.unary()
                unit = self.expect_word(*INTERVAL_UNITS)
                left = self._node(IntervalArith(left, 1 if op == "+" else -1, amount, unit), left, amount)
            else:
                right = self.multiplicative()
                left = self._node(Arith(op, left, right), left, right)

    def multiplicative(self) -> Node:
        left = self.unary()
        while True:
            op = self.accept_op("*", "/", "%") or self.accept_word("DIV", "MOD")
            if op is None:
                return left
            right = self.unary()
            left = self._node(Arith("MOD" if op == "%" else op, left, right), left, right)

    def unary(self) -> Node:
        op = self.accept_op("-", "+", "!", "~")
        if op is not None:
            self._nest()
            try:
                operand = self.unary()
            finally:
                self.nesting -= 1
            return self._node(Unary("NOT" if op == "!" else op, operand), operand)
        return self.primary()

    def primary(self) -> Node:
        tok = self.cur
        if tok.kind == "number":
            self.advance()
            return self._leaf(Literal(tok.value))
        if tok.kind == "string":
            self.advance()
            text = tok.value
            parts = [text]
            while self.cur.kind == "string":  # 'a' 'b' is 'ab'
                parts.append(self.advance().value)
            return self._leaf(Literal("".join(parts)))
        if tok.kind == "sysvar":
            self.advance()
            return self._leaf(SysVarRef(*tok.value))
        if tok.kind == "uservar":
            self.advance()
            return self._leaf(UserVarRef(tok.value))
        if tok.kind == "qident":
            self.advance()
            return self._qualified(tok.value)
        if tok.kind == "op" and tok.value == "(":
            self.advance()
            if self.is_word("SELECT"):
                raise unsupported("subqueries")
            node = self.expr()
            self.expect_op(")")
            return node
        if tok.kind == "word":
            word = tok.value.upper()
            nxt = self.peek()
            if word == "NULL":
                self.advance()
                return self._leaf(Literal(None))
            if word in ("TRUE", "FALSE"):
                self.advance()
                return self._leaf(Literal(int(word == "TRUE")))
            if (word.startswith("_") or word == "N") and nxt.kind == "string" and nxt.start == tok.end:
                self.advance()  # a character-set introducer: _utf8mb4'text', N'text'
                return self.primary()
            if nxt.kind == "op" and nxt.value == "(" and nxt.start == tok.end or (
                nxt.kind == "op" and nxt.value == "(" and word in FUNCTIONS
            ):
                self.advance()
                self.advance()
                args: list[Node] = []
                if not self.accept_op(")"):
                    args.append(self.expr())
                    while self.accept_op(","):
                        args.append(self.expr())
                    self.expect_op(")")
                return self._node(Call(word, tuple(args)), *args)
            if word in BARE_FUNCTIONS:
                self.advance()
                return self._leaf(Call(word, ()))
            if word in CLAUSE_WORDS or word in ("SELECT", "INTERVAL"):
                raise self.error()
            self.advance()
            return self._qualified(tok.value)
        raise self.error()

    def _qualified(self, name: str) -> Node:
        while self.is_op(".") and self.peek().kind in ("word", "qident"):
            self.advance()
            name = self.advance().value
        return self._leaf(ColumnRef(name))


def parse_limit(p: Parser) -> tuple[int, int | None]:
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
