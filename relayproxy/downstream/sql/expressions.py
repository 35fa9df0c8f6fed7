"""Expression trees the parser builds (literals, variables, calls, operators, LIKE, IN, BETWEEN, IS) and how each
evaluates against one statement's ``Env``."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...wire.errors import ER_BAD_FIELD_ERROR, ER_SP_DOES_NOT_EXIST, ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT
from .errors import SqlError
from .functions import FUNCTIONS
from .limits import STEP_BYTES, check_number, out_of_range, too_large, value_size
from .values import compare_values, to_datetime, to_number, to_text, truthy, like_match
from .variables import read_variable

if TYPE_CHECKING:
    from .env import Env

# ---------------------------------------------------------------------------------------------
# Expressions: a small tree and its evaluation. MySQL semantics where a client could notice them:
# NULL propagates, strings compare case-insensitively, a string meets a number as a number.


class Node:
    __slots__ = ()

    def eval(self, ev: "Evaluator") -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Literal(Node):
    value: Any

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        return self.value


@dataclass(frozen=True, slots=True)
class SysVarRef(Node):
    scope: str | None
    name: str

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        return read_variable(ev.env, self.name, self.scope)


@dataclass(frozen=True, slots=True)
class UserVarRef(Node):
    name: str

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        return ev.env.conn.user_vars.get(self.name)


@dataclass(frozen=True, slots=True)
class ColumnRef(Node):
    name: str

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        if ev.row is not None:
            key = self.name.lower()
            if key in ev.row:
                return ev.row[key]
        if ev.bare_words_are_strings:
            return self.name  # SET sql_mode = ANSI, SET autocommit = ON
        raise SqlError(ER_BAD_FIELD_ERROR, "42S22", f"Unknown column '{self.name}' in 'field list'")


@dataclass(frozen=True, slots=True)
class Call(Node):
    name: str  # upper case
    args: tuple[Node, ...]

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        spec = FUNCTIONS.get(self.name)
        if spec is None or not spec.exists(ev.env):
            raise SqlError(
                ER_SP_DOES_NOT_EXIST, "42000",
                f"FUNCTION {self.name.lower()} does not exist (relayproxy evaluates only "
                f"{', '.join(sorted(n for n, f in FUNCTIONS.items() if f.exists(ev.env)))})",
            )
        if not spec.min_args <= len(self.args) <= spec.max_args:
            raise SqlError(ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT, "42000",
                           f"Incorrect parameter count in the call to native function '{self.name}'")
        result = spec.fn(ev.env, [a.eval(ev) for a in self.args])
        if isinstance(result, (str, bytes)):
            size = value_size(result)
            ev.budget.charge(size // STEP_BYTES)
            if size > ev.env.max_value_bytes:
                raise too_large(f"{self.name.lower()}()", ev.env.max_value_bytes)
        return result


@dataclass(frozen=True, slots=True)
class Unary(Node):
    op: str  # "-", "+", "NOT", "~"
    operand: Node

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        v = self.operand.eval(ev)
        if v is None:
            return None
        if self.op == "NOT":
            return int(not truthy(v))
        number = check_number(to_number(v), f"{self.op}{_shown(v)}")
        if self.op == "~":
            return ~int(number) & 0xFFFFFFFFFFFFFFFF
        return check_number(-number, f"-({_shown(v)})") if self.op == "-" else number


@dataclass(frozen=True, slots=True)
class Logic(Node):
    op: str  # "AND" | "OR"
    left: Node
    right: Node

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        a = self.left.eval(ev)
        b = self.right.eval(ev)
        ta = None if a is None else truthy(a)
        tb = None if b is None else truthy(b)
        if self.op == "AND":
            if ta is False or tb is False:
                return 0
            return None if ta is None or tb is None else 1
        if ta or tb:
            return 1
        return None if ta is None or tb is None else 0


@dataclass(frozen=True, slots=True)
class Compare(Node):
    op: str
    left: Node
    right: Node

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        a = self.left.eval(ev)
        b = self.right.eval(ev)
        if self.op == "<=>":
            if a is None or b is None:
                return int(a is None and b is None)
            return int(compare_values(a, b) == 0)
        c = compare_values(a, b)
        if c is None:
            return None
        return int({"=": c == 0, "!=": c != 0, "<>": c != 0, "<": c < 0, ">": c > 0, "<=": c <= 0,
                    ">=": c >= 0}[self.op])


@dataclass(frozen=True, slots=True)
class Arith(Node):
    op: str
    left: Node
    right: Node

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        a = self.left.eval(ev)
        b = self.right.eval(ev)
        if a is None or b is None:
            return None
        what = f"({_shown(a)} {self.op} {_shown(b)})"
        # Operands and results stay in BIGINT / finite DOUBLE (1690 otherwise), so no operation is ever
        # on numbers of unbounded size.
        x, y = check_number(to_number(a), what), check_number(to_number(b), what)
        if self.op == "+":
            return check_number(x + y, what)
        if self.op == "-":
            return check_number(x - y, what)
        if self.op == "*":
            return check_number(x * y, what)
        if y == 0:
            return None  # MySQL: division by zero is NULL (with a warning)
        try:
            if self.op == "/":
                return check_number(x / y, what)
            if self.op == "DIV":
                return check_number(int(x / y), what)
            return check_number(x - y * int(x / y), what)  # MOD / %: the sign follows the dividend, as in MySQL
        except OverflowError:
            raise out_of_range("DOUBLE", what) from None


def _shown(v: Any) -> str:
    """A value as an error message names it (cut short)."""
    text = to_text(v) if isinstance(v, (str, bytes, bytearray)) else repr(v) if not isinstance(v, int) else None
    if text is None:
        return str(v) if -(10 ** 30) < v < 10 ** 30 else "<a number too large>"
    return text if len(text) <= 40 else text[:40] + "..."


INTERVAL_UNITS = {
    "MICROSECOND": _dt.timedelta(microseconds=1), "SECOND": _dt.timedelta(seconds=1),
    "MINUTE": _dt.timedelta(minutes=1), "HOUR": _dt.timedelta(hours=1), "DAY": _dt.timedelta(days=1),
    "WEEK": _dt.timedelta(weeks=1),
}


@dataclass(frozen=True, slots=True)
class IntervalArith(Node):
    """``<datetime> + INTERVAL n unit`` / ``- INTERVAL`` (``PURGE BINARY LOGS BEFORE NOW() - INTERVAL 3 DAY``)."""

    left: Node
    sign: int
    amount: Node
    unit: str

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        base = self.left.eval(ev)
        amount = self.amount.eval(ev)
        if base is None or amount is None:
            return None
        moment = to_datetime(base)
        if moment is None:
            return None
        what = f"{_shown(base)} {'+' if self.sign > 0 else '-'} INTERVAL {_shown(amount)} {self.unit}"
        try:
            return moment + self.sign * check_number(to_number(amount), what) * INTERVAL_UNITS[self.unit]
        except (OverflowError, ValueError):  # MySQL: NULL with warning 1441; the relay refuses the statement
            raise out_of_range("DATETIME", what) from None


@dataclass(frozen=True, slots=True)
class Like(Node):
    subject: Node
    pattern: Node
    negate: bool
    escape: str = "\\"

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        s = self.subject.eval(ev)
        p = self.pattern.eval(ev)
        if s is None or p is None:
            return None
        hit = like_match(to_text(s), to_text(p), self.escape, ev.budget)
        return int(hit != self.negate)


@dataclass(frozen=True, slots=True)
class In(Node):
    subject: Node
    items: tuple[Node, ...]
    negate: bool

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        s = self.subject.eval(ev)
        if s is None:
            return None
        saw_null = False
        for item in self.items:
            v = item.eval(ev)
            if v is None:
                saw_null = True
            elif compare_values(s, v) == 0:
                return int(not self.negate)
        return None if saw_null else int(self.negate)


@dataclass(frozen=True, slots=True)
class Between(Node):
    subject: Node
    low: Node
    high: Node
    negate: bool

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        s, lo, hi = self.subject.eval(ev), self.low.eval(ev), self.high.eval(ev)
        a, b = compare_values(s, lo), compare_values(s, hi)
        if a is None or b is None:
            return None
        return int((a >= 0 and b <= 0) != self.negate)


@dataclass(frozen=True, slots=True)
class Is(Node):
    subject: Node
    what: str  # NULL | TRUE | FALSE
    negate: bool

    def eval(self, ev: "Evaluator") -> Any:
        ev.budget.charge()
        v = self.subject.eval(ev)
        if self.what == "NULL":
            hit = v is None
        elif self.what == "TRUE":
            hit = v is not None and truthy(v)
        else:
            hit = v is not None and not truthy(v)
        return int(hit != self.negate)


class Evaluator:
    __slots__ = ("env", "row", "bare_words_are_strings", "budget")

    def __init__(self, env: "Env", row: dict[str, Any] | None = None, *, bare_words_are_strings: bool = False):
        self.env = env
        self.budget = env.budget  # one per statement, shared by every row it evaluates
        self.row = row
        self.bare_words_are_strings = bare_words_are_strings
