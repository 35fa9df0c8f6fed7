"""No statement holds the event loop (invariant 7), whatever its shape within max_statement_bytes.

A statement runs in slices (downstream/sql/slicing.py): its tokenizer, parser and evaluator count their work and
give the loop a turn every WORK_PER_SLICE units; and every bound of limits.py is met as the statement crosses it
(the 30,001st token, the 65th parenthesis, the 1,025th column), never after reading the whole statement.

The work done in one turn of the loop is measured, not timed: a profile hook counts every event (a call or a
return, of Python or C functions) the thread makes, and a probe task on the same loop notes the count each time
it runs; the largest difference between two notes is the most work any one turn did. Before the slicing, the
1,000,008-byte ``SELECT 1+1+...+1`` of the defect was a single turn of about 25 million calls (cProfile; 6.6 s on
the reporting machine, 11 s on a busy test machine), tokenized twice; now no turn of any shape below goes past
about 15,000 events (0.3 to 1.5 ms of CPU).

The real relay: a replica stream (COM_BINLOG_DUMP read by the test, every transaction's arrival noted) and
/status polled from threads while a monitoring account sends that statement again and again; transactions keep
arriving and /status keeps answering while the statements are in flight.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pymysql
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relayproxy.downstream.sql import dispatch, execute, limits, slicing
from relayproxy.wire.results import ErrorResponse, OkResponse, ResultSet

from .test_downstream_sql import Relay, mysql_relay  # noqa: F401 (fixtures)

MAX_BYTES = limits.DEFAULT_MAX_STATEMENT_BYTES
# Profile events (a call and its return are two, Python or C) in one turn of the loop. A slice is WORK_PER_SLICE
# units, each a token read or consumed, a node built or an evaluation step: a few dozen events each, so a slice
# is some thousands (the most measured: about 15,000, a select list being parsed). The bound leaves room for the
# loop's own calls and the answer's encoding; unsliced, one statement at MAX_TOKENS is over a million.
MAX_CALLS_PER_TURN = 40_000


async def measured(ctx, conn, sql: str) -> tuple[object, int, int]:
    """``execute(sql)`` with a probe task on the same loop: the answer, the most calls one turn of the loop made
    while it ran, and how many turns the loop made meanwhile."""
    calls = 0
    notes: list[int] = []
    done = False

    def profile(frame, event, arg):
        nonlocal calls
        calls += 1

    async def probe():
        while not done:
            notes.append(calls)
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0)
    sys.setprofile(profile)
    try:
        response = await execute(ctx, conn, sql)
        notes.append(calls)
    finally:
        sys.setprofile(None)
        done = True
    await task
    return response, max(b - a for a, b in zip(notes, notes[1:])), len(notes)


# -- statement shapes, near and over each limit ------------------------------------------------------------------


def chain(n):  # depth MAX_EXPRESSION_DEPTH, then MAX_TOKENS
    return "SELECT 1" + "+1" * n


def parens(n):  # MAX_NESTING
    return "SELECT " + "(" * n + "1" + ")" * n


def prefix(n):  # MAX_NESTING by prefix operators, MAX_TOKENS
    return "SELECT " + "-" * n + "1"


def functions(n):  # MAX_NESTING by function calls
    return "SELECT " + "IFNULL(" * n + "1" + ", 2)" * n


def items(n):  # MAX_SELECT_ITEMS, then MAX_TOKENS
    return "SELECT " + ",".join(["1"] * n)


def in_list(n):  # MAX_TERMS, then MAX_TOKENS
    return "SELECT 1 IN (" + ",".join(["2"] * n) + ")"


def string(n):  # max_statement_bytes (the packet: the command byte and the statement)
    return "SELECT '" + "x" * n + "'"


def escapes(n):  # a long literal read an escape at a time
    return "SELECT '" + "\\n" * n + "'"


def comments(n):  # MAX_TOKENS counts comments
    return "SELECT 1" + "/**/" * n


def line_comments(n):
    return "SELECT 1" + "#\n" * n


def unterminated(n):
    return "SELECT '" + "x" * n


def unterminated_comment(n):
    return "SELECT 1 /*" + "x" * n


def concat_args(n):  # a function's argument count (CONCAT takes 1 to 255, as the relay's table says)
    return "SELECT CONCAT(" + ",".join(["'ab'"] * n) + ")"


def like_chain(n):  # LIKE over long literals, an OR chain: MAX_EXPRESSION_DEPTH
    return "SELECT " + " OR ".join(["'" + "a" * 3000 + "' LIKE '%a%a%a%b'"] * n)


def show_where(n):  # a WHERE evaluated once a variable: MAX_STEPS, MAX_EXPRESSION_DEPTH
    return "SHOW VARIABLES WHERE " + " OR ".join(["Value = 1"] * n)


def values_row(n):  # @s is 100,000 characters: the row's values together are bounded by max_statement_bytes (1301)
    return "SELECT " + ",".join(["@s"] * n)


SHAPES = {  # shape: (the n where its bound is, the largest n that fits the packet)
    chain: (limits.MAX_EXPRESSION_DEPTH - 1, (MAX_BYTES - 10) // 2),
    parens: (limits.MAX_NESTING - 1, (MAX_BYTES - 10) // 2),
    prefix: (limits.MAX_NESTING - 1, MAX_BYTES - 10),
    functions: (limits.MAX_NESTING - 1, (MAX_BYTES - 10) // 11),
    items: (limits.MAX_SELECT_ITEMS, (MAX_BYTES - 10) // 2),
    in_list: (limits.MAX_TERMS - 2, (MAX_BYTES - 20) // 2),
    string: (MAX_BYTES - 10, MAX_BYTES - 10),
    escapes: ((MAX_BYTES - 10) // 2, (MAX_BYTES - 10) // 2),
    comments: (limits.MAX_TOKENS - 2, (MAX_BYTES - 10) // 4),
    line_comments: (limits.MAX_TOKENS - 2, (MAX_BYTES - 10) // 2),
    unterminated: (0, MAX_BYTES - 10),
    unterminated_comment: (0, MAX_BYTES - 20),
    concat_args: (255, (MAX_BYTES - 20) // 5),
    like_chain: (limits.MAX_EXPRESSION_DEPTH - 1, (MAX_BYTES - 10) // 3020),
    show_where: (limits.MAX_EXPRESSION_DEPTH - 1, (MAX_BYTES - 30) // 13),
    values_row: (10, 1000),
}
VALUE = "x" * 100_000
# The codes a server answers for what the relay refuses (never 1105, its internal error).
REFUSALS = {1064, 1117, 1153, 1301, 1582, limits.ER_QUERY_TIMEOUT, limits.ER_STATEMENT_TIMEOUT}


def expected(shape, n: int) -> set:
    """What the statement may get: error codes, and "ok" where an answer is right."""
    bound, largest = SHAPES[shape]
    if len(shape(n).encode()) + 1 > MAX_BYTES:
        return {1153}
    if shape in (unterminated, unterminated_comment):
        return {1064}
    if shape is concat_args:
        return {"ok"} if 1 <= n <= bound else {1582, 1064}  # 1064: past MAX_TOKENS
    if shape is values_row:
        return {"ok"} if n <= bound else {1301}
    if shape is items and n > bound:
        return {1117, 1064}
    if shape in (like_chain, show_where):  # as deep as the chain is long; SHOW's WHERE runs once a variable
        return ({"ok", limits.ER_QUERY_TIMEOUT} if n <= bound else {1064}) if n else {1064}
    return {"ok"} if n <= bound else {1064}


def sizes(shape) -> st.SearchStrategy[int]:
    """n at the bound, just over it, near the packet's limit, and anywhere between."""
    bound, largest = SHAPES[shape]
    return st.one_of(st.integers(max(0, bound - 3), bound + 3), st.integers(max(0, largest - 3), largest + 3),
                     st.integers(0, largest + 3))


@st.composite
def statements(draw) -> tuple[str, int]:
    shape = draw(st.sampled_from(list(SHAPES)))
    return shape.__name__, draw(sizes(shape))


FRAGMENTS = ["1", "+1", "(", ")", ",", "'ab'", "'", '"', "`", "\\n", "/**/", "/*", "*/", "/*!", "-- c\n", "#\n",
             " ", "NOT ", "-", "IFNULL(", "@@version", "@a", " IN (", " LIKE '%a%b'", "CONCAT(", "x", "é", ";"]


def mixed(parts: tuple[tuple[str, int], ...]) -> str:
    """Fragments, each repeated: anything within or just over the packet."""
    return "SELECT " + "".join(fragment * count for fragment, count in parts)[:MAX_BYTES]


mixes = st.tuples(st.just("mixed"), st.lists(st.tuples(st.sampled_from(FRAGMENTS), st.integers(1, 60_000)),
                                             min_size=1, max_size=8).map(tuple))
BY_NAME = {shape.__name__: shape for shape in SHAPES}


def statement(case) -> tuple[str, set]:
    """A drawn case (its shape's name and n, short to print) as the statement and what it may get."""
    name, n = case
    if name == "mixed":
        return mixed(n), set(REFUSALS) | {"ok", "other"}
    return BY_NAME[name](n), expected(BY_NAME[name], n)


@pytest.fixture
def no_traceback(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"internal error logged: {args} {kwargs}")
    monkeypatch.setattr(dispatch.log, "exception", refuse)


def check(relay: Relay, sql: str, want: set) -> tuple[object, int, int]:
    """Run ``sql`` measured: at most MAX_CALLS_PER_TURN calls in any turn of the loop, and an answer in ``want``
    ("ok": a result; "other": any error but the internal one; else the codes)."""
    response, per_turn, turns = asyncio.run(measured(relay.ctx, relay.conn, sql))
    assert per_turn <= MAX_CALLS_PER_TURN, (sql[:60], len(sql), per_turn)
    if isinstance(response, (ResultSet, OkResponse)):
        assert "ok" in want, (sql[:60], len(sql), response)
    else:
        assert isinstance(response, ErrorResponse), response
        assert response.code != 1105, response
        assert response.code in want or "other" in want, (sql[:60], len(sql), want, response)
    return response, per_turn, turns


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@pytest.mark.slow
@given(case=st.one_of(statements(), mixes))
@example(case=("chain", (1_000_008 - 8) // 2))  # the defect's statement: 1,000,008 bytes
@example(case=("chain", limits.MAX_TOKENS // 2))
@example(case=("in_list", limits.MAX_TERMS - 2))
@example(case=("items", limits.MAX_SELECT_ITEMS))
@example(case=("comments", (MAX_BYTES - 10) // 4))
@example(case=("escapes", (MAX_BYTES - 10) // 2))
@example(case=("show_where", limits.MAX_EXPRESSION_DEPTH - 1))
def test_no_statement_holds_the_loop(mysql_relay, no_traceback, case):
    sql, want = statement(case)
    mysql_relay.run(f"SET @s = '{VALUE}'")
    check(mysql_relay, sql, want)


@pytest.mark.parametrize("shape", list(SHAPES), ids=lambda f: f.__name__)
def test_each_bound_is_met_where_it_is(mysql_relay, no_traceback, shape):
    """At each shape's bound the statement is answered, one past it refused with the server's code."""
    bound, largest = SHAPES[shape]
    mysql_relay.run(f"SET @s = '{VALUE}'")
    for n in sorted({bound, bound + 1, largest, largest + 1}):
        check(mysql_relay, shape(n), expected(shape, n))


def test_the_defects_statement_is_refused_at_the_token_bound_in_slices(mysql_relay, no_traceback, monkeypatch):
    """The 1,000,008-byte SELECT 1+1+...+1: refused (1064) after MAX_TOKENS tokens, not 500,004; the loop turned
    about every WORK_PER_SLICE units of that."""
    read = []
    real = slicing.work
    monkeypatch.setattr("relayproxy.downstream.sql.parser.work", lambda units=1: read.append(units) or real(units))
    sql = chain((1_000_008 - 8) // 2)
    assert len(sql) == 1_000_008
    response, per_turn, turns = check(mysql_relay, sql, {1064})
    assert f"more than {limits.MAX_TOKENS} tokens" in response.message
    assert limits.MAX_TOKENS <= sum(read) <= limits.MAX_TOKENS + 10
    assert turns >= limits.MAX_TOKENS // slicing.WORK_PER_SLICE


def test_the_answers_are_the_same_sliced_or_not(mysql_relay):
    """Slicing changes when a statement's work is done, never what it answers."""
    r = mysql_relay
    for sql in ("SELECT 1+2, 'a' 'b', @@server_id", "SELECT 1 IN (" + ",".join(["2"] * 5000) + ", 1)",
                "SELECT CONCAT('x', REPEAT('ab', 5000)) LIKE '%ba%'", "SET @v = 5", "SELECT @v * 2",
                "SHOW VARIABLES LIKE 'gtid%'", "SELECT " + ",".join(str(i) for i in range(limits.MAX_SELECT_ITEMS)),
                "SELECT nope", "SELECT (1", "STOP SLAVE"):
        sliced = asyncio.run(execute(r.ctx, r.conn, sql))
        plain = r.run(sql)
        assert type(sliced) is type(plain)
        if isinstance(plain, ResultSet):
            assert (sliced.columns, sliced.rows) == (plain.columns, plain.rows), sql[:60]
        elif isinstance(plain, ErrorResponse) and sql != "STOP SLAVE":
            assert (sliced.code, sliced.message) == (plain.code, plain.message)


def test_a_cancelled_statement_is_unwound(mysql_relay):
    """The client went away mid-statement: the task's cancellation unwinds the statement's greenlet at once."""
    r = mysql_relay
    finished = []

    async def main():
        task = asyncio.create_task(execute(r.ctx, r.conn, in_list(limits.MAX_TERMS - 2)))
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        finished.append(True)

    asyncio.run(main())
    assert finished
    assert r.one("SELECT 1") == 1


def test_other_statements_run_between_the_slices_of_a_long_one(mysql_relay):
    """Two connections: a short statement sent while a long one is in flight is answered first."""
    r = mysql_relay
    other = r.connect(8)
    order = []

    async def run(conn, sql, name):
        await execute(r.ctx, conn, sql)
        order.append(name)

    async def main():
        long = asyncio.create_task(run(r.conn, in_list(limits.MAX_TERMS - 2), "long"))
        await asyncio.sleep(0)
        await run(other, "SELECT @@version", "short")
        await long

    asyncio.run(main())
    assert order == ["short", "long"]


# -- the real relay --------------------------------------------------------------------------------------------------

CONFIG = """
[[users]]
name = "repl"
password = "replpw"
plugin = "mysql_native_password"

[[users]]
name = "monitor"
password = "monitorpw"
plugin = "mysql_native_password"
privileges = []
"""


class DumpStream:
    """A replica's stream from the relay (COM_BINLOG_DUMP from the current end, in a thread): when each
    transaction (GTID event) arrived."""

    def __init__(self, port: int, file: str, position: int):
        self.port, self.file, self.position = port, file, position
        self.arrivals: list[float] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DumpStream:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        from relayproxy.upstream.connection import UpstreamConnection

        async def stream() -> None:
            conn = await UpstreamConnection.connect("127.0.0.1", self.port, "repl", "replpw", ssl_mode="disabled")
            try:
                await conn.query("SET @master_binlog_checksum = 'CRC32'")
                await conn.query("SET @mariadb_slave_capability = 4")
                await conn.binlog_dump(self.file, self.position, 77)
                while not self._stop.is_set():
                    try:
                        packets = await asyncio.wait_for(conn.read_packets(), 0.5)
                    except (TimeoutError, asyncio.TimeoutError):
                        continue
                    now = time.monotonic()
                    # an event packet: 0x00, then the header: timestamp (4), type (1); 0xA2 is MariaDB's GTID
                    self.arrivals.extend(now for p in packets if len(p) > 5 and p[0] == 0 and p[5] == 0xA2)
            finally:
                await conn.close()

        try:
            asyncio.run(stream())
        except BaseException as exc:  # reported by the test
            self.error = exc

    def during(self, windows: list[tuple[float, float]]) -> int:
        return sum(1 for t in self.arrivals for a, b in windows if a <= t <= b)


class StatusPoller:
    """/status read again and again from a thread: when each answer came."""

    def __init__(self, http_port: int):
        self.url = f"http://127.0.0.1:{http_port}/status"
        self.answers: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatusPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        while not self._stop.is_set():
            with urllib.request.urlopen(self.url, timeout=30) as response:
                response.read()
            self.answers.append(time.monotonic())
            time.sleep(0.01)

    def during(self, windows: list[tuple[float, float]]) -> int:
        return sum(1 for t in self.answers for a, b in windows if a <= t <= b)


def largest_gap(times: list[float], t0: float, t1: float) -> float:
    points = [t0] + [t for t in times if t0 < t < t1] + [t1]
    return max(b - a for a, b in zip(points, points[1:]))


@pytest.mark.server
def test_replicas_and_status_go_on_while_the_statement_is_refused(mariadb, tmp_path: Path) -> None:
    """The defect's 1,000,008-byte SELECT 1+1+...+1 from a monitoring account, sent ROUNDS times back to back while
    a writer commits on the master: every one is refused (1064), and while they are in flight the replica stream
    receives transactions and /status answers. Counted, never timed: before the slicing, each statement held the
    loop for its whole 6.6 s, so nothing at all arrived while one was in flight; the gaps are printed."""
    from relayproxy.lab.harness import RelayProcess, Writer, free_port, prepare_master

    rounds = 8
    master = mariadb("master")
    prepare_master(master)
    config = tmp_path / "relay.toml"
    config.write_text(CONFIG)
    listen = free_port()
    relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb",
                         extra=["--listen", f"127.0.0.1:{listen}", "--config", str(config)]).start()
    sql = chain((1_000_008 - 8) // 2)
    windows: list[tuple[float, float]] = []
    try:
        with Writer(master, rotate_every=10**9) as writer:
            admin = pymysql.connect(host="127.0.0.1", port=listen, user="repl", password="replpw")
            cur = admin.cursor()
            cur.execute("SHOW MASTER STATUS")
            file, position = cur.fetchone()[:2]
            admin.close()
            with DumpStream(listen, file, int(position)) as stream, StatusPoller(relay.http_port) as status:
                deadline = time.monotonic() + 60
                while len(stream.arrivals) < 20 or not status.answers:
                    assert stream.error is None, stream.error
                    assert time.monotonic() < deadline, "the stream or /status did not start"
                    time.sleep(0.05)
                monitor = pymysql.connect(host="127.0.0.1", port=listen, user="monitor", password="monitorpw",
                                          read_timeout=120)
                try:
                    for _ in range(rounds):
                        t0 = time.monotonic()
                        with pytest.raises(pymysql.MySQLError) as info:
                            monitor.cursor().execute(sql)
                        windows.append((t0, time.monotonic()))
                        assert info.value.args[0] == 1064, info.value.args
                        assert f"more than {limits.MAX_TOKENS} tokens" in info.value.args[1]
                finally:
                    monitor.close()
                time.sleep(0.5)
            assert stream.error is None, stream.error
            assert writer.error is None, writer.error
            in_flight = sum(b - a for a, b in windows)
            received, answered = stream.during(windows), status.during(windows)
            gaps = [largest_gap(stream.arrivals, a, b) for a, b in windows]
            status_gaps = [largest_gap(status.answers, a, b) for a, b in windows]
            print(f"\n{rounds} statements of {len(sql)} bytes refused in {in_flight:.2f} s in all "
                  f"(longest {max(b - a for a, b in windows):.3f} s); meanwhile {received} transactions reached the "
                  f"replica stream (largest gap {max(gaps):.3f} s) and /status answered {answered} times "
                  f"(largest gap {max(status_gaps):.3f} s); the writer committed {writer.done} in the whole test")
            # While the statements were in flight the stream kept receiving and /status kept answering: at least
            # one transaction and one answer for every statement, on average (the writer commits one every few ms).
            assert received >= rounds, (received, windows)
            assert answered >= rounds, (answered, windows)
    finally:
        relay.stop()
