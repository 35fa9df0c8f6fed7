"""The bounds every statement on the SQL port runs under, so no client can stall the event loop or grow the
relay's memory without bound. Each bound is structural (bytes, nodes, depth, steps), never wall time.

- ``max_statement_bytes`` (configuration, default 1 MiB): ``@@max_allowed_packet``. A client's command packet
  larger than this is refused by the server as it arrives (downstream/session.py: 1153 and the connection closed,
  as the servers), and a COM_QUERY packet larger than this is refused here before it is tokenized
  (ER_NET_PACKET_TOO_LARGE 1153) for callers that do not go through the server. The same
  number bounds every string value a statement computes (CONCAT, UPPER ...: ER_WARN_ALLOW_MAX_PACKET_SIZE 1301;
  MySQL returns NULL with that warning, the relay keeps no warnings and refuses the statement instead) and the
  total size of one connection's user variables (1301 too, naming the variables).
- ``MAX_NESTING`` (64): parentheses, function arguments and prefix operators nested deeper are a 1064 naming
  the limit, never a ``RecursionError``.
- ``MAX_EXPRESSION_DEPTH`` (256): an expression tree deeper than this (``1+1+...+1`` is as deep as it is long)
  is a 1064 naming the limit; evaluation recurses once per level, so this bounds the evaluator's stack.
- ``MAX_TERMS`` (10,000): expression nodes (literals, operators, calls) in one statement; more is a 1064.
- ``MAX_TOKENS`` (30,000): tokens and comments in one statement; the tokenizer stops with a 1064 naming the limit
  at the next one, so a megabyte of ``1+1+...`` costs 30,000 tokens' work, not half a million. Parentheses
  opened more than ``MAX_NESTING`` deep are refused by the tokenizer as they open.
- ``MAX_SELECT_ITEMS`` (1,024): columns of one SELECT; more is ER_TOO_MANY_FIELDS 1117 ("Too many columns").
  The result set is encoded in one piece on the event loop (about 3 µs a column definition on a busy core),
  and no client of a relay selects that many. The values of the row together are bounded by
  ``max_statement_bytes`` as each one is (1301).
- ``MAX_STEPS`` (200,000): evaluation steps of one statement (one per node evaluated, one per LIKE candidate,
  one per KiB of string built); more is MySQL's ER_QUERY_TIMEOUT 3024 / MariaDB's ER_STATEMENT_TIMEOUT 1969,
  naming the budget.
- Numbers: integers outside BIGINT (signed or unsigned) and doubles that overflow are ER_DATA_OUT_OF_RANGE
  1690, as are datetimes moved out of range by INTERVAL arithmetic (MySQL: NULL with warning 1441); a literal
  too large for a DOUBLE is ER_ILLEGAL_VALUE_FOR_TYPE 1367.

Every bound above caps a statement's total work; ``slicing.py`` caps the work done between two turns of the
event loop: the tokenizer, the parser and ``Budget.charge`` report their work there, and a statement run by
``dispatch.execute`` gives the loop a turn every ``slicing.WORK_PER_SLICE`` units, whatever its shape.
"""

from __future__ import annotations

import math
from typing import Any

from ...wire.errors import (
    ER_DATA_OUT_OF_RANGE,
    ER_NET_PACKET_TOO_LARGE,
    ER_QUERY_TIMEOUT,
    ER_STATEMENT_TIMEOUT,
    ER_WARN_ALLOW_MAX_PACKET_SIZE,
)
from .errors import SqlError
from .slicing import work

DEFAULT_MAX_STATEMENT_BYTES = 1 << 20
MAX_NESTING = 64
MAX_EXPRESSION_DEPTH = 256
MAX_TERMS = 10_000
MAX_TOKENS = 30_000  # three a term: a literal, an operator or comma, a parenthesis or keyword
MAX_SELECT_ITEMS = 1024
SCAN_CHARS_PER_UNIT = 4  # escapes read in a quoted text per unit of slicing.work
MAX_STEPS = 200_000
STEP_BYTES = 1024  # one step per this many characters of string built

BIGINT_MIN = -(1 << 63)
BIGINT_UNSIGNED_MAX = (1 << 64) - 1


def max_statement_bytes(ctx: Any) -> int:
    """The configured ``max_statement_bytes`` (the default when it is not configured)."""
    value = ctx.settings.max_statement_bytes
    return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_STATEMENT_BYTES


def check_statement_size(ctx: Any, sql: str) -> None:
    """Refuse a statement whose COM_QUERY packet (the command byte and the statement) is over
    ``max_statement_bytes`` before any work is done on it: the same rule as the server's packet limit and the
    value of ``@@max_allowed_packet``."""
    limit = max_statement_bytes(ctx)
    if len(sql) + 1 > limit or len(sql.encode("utf-8", "surrogateescape")) + 1 > limit:
        raise SqlError(ER_NET_PACKET_TOO_LARGE, "08S01",
                       f"Got a packet bigger than 'max_allowed_packet' bytes (relayproxy's max_statement_bytes "
                       f"is {limit})")


def value_size(value: Any) -> int:
    """Bytes a value holds, as the limits count them (a number counts 8)."""
    if isinstance(value, str):
        return len(value)  # characters: a lower bound of the bytes, and what was built
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return 8


def out_of_range(kind: str, what: str) -> SqlError:
    return SqlError(ER_DATA_OUT_OF_RANGE, "22003", f"{kind} value is out of range in '{what[:200]}'")


def check_number(value: Any, what: str) -> Any:
    """``value`` if it fits a BIGINT (signed or unsigned) or is a finite double; 1690 otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not BIGINT_MIN <= value <= BIGINT_UNSIGNED_MAX:
            raise out_of_range("BIGINT", what)
    elif isinstance(value, float) and not math.isfinite(value):
        raise out_of_range("DOUBLE", what)
    return value


class Budget:
    """Evaluation steps left to one statement."""

    __slots__ = ("steps", "limit", "flavour")

    def __init__(self, limit: int = MAX_STEPS, flavour: str = "mysql"):
        self.steps = 0
        self.limit = limit
        self.flavour = flavour

    def charge(self, steps: int = 1) -> None:
        self.steps += steps
        work(steps)  # the statement's slice: the event loop turns between slices (slicing.py)
        if self.steps > self.limit:
            detail = (f"relayproxy stops a statement after {self.limit} evaluation steps; "
                      "ask for less in one statement")
            if self.flavour == "mariadb":
                raise SqlError(ER_STATEMENT_TIMEOUT, "70100",
                               f"Query execution was interrupted (max_statement_time exceeded): {detail}")
            raise SqlError(ER_QUERY_TIMEOUT, "HY000",
                           f"Query execution was interrupted, maximum statement execution time exceeded: {detail}")


def too_large(what: str, limit: int) -> SqlError:
    return SqlError(ER_WARN_ALLOW_MAX_PACKET_SIZE, "HY000",
                    f"Result of {what} was larger than max_allowed_packet ({limit}) - refused "
                    "(relayproxy's max_statement_bytes)")
