"""Hostile statements on the SQL port: each gets one clear ERR, and the work each costs is bounded
structurally (bytes read, tokens consumed, evaluation steps counted), never by a timed assert."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.commands import config
from relayproxy.downstream.sql import dispatch, execute, limits
from relayproxy.downstream.sql import env as env_module
from relayproxy.downstream.sql.errors import SqlError
from relayproxy.downstream.sql import parser as parser_module
from relayproxy.downstream.sql.parser import Parser, tokenize
from relayproxy.downstream.sql.values import like_match
from relayproxy.wire.results import ErrorResponse, ResultSet, encode_response

from .test_downstream_sql import Relay, maria_relay, mysql_relay, relay_dir_with  # noqa: F401 (fixtures)


@pytest.fixture
def no_traceback(monkeypatch):
    """A client-caused error is an ERR, never the internal-error path that logs a traceback."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"internal error logged: {args} {kwargs}")
    monkeypatch.setattr(dispatch.log, "exception", refuse)


@pytest.fixture
def budgets(monkeypatch):
    """Every statement's Budget, to read the steps it spent."""
    made: list[limits.Budget] = []

    class Recording(limits.Budget):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(env_module, "Budget", Recording)
    return made


def small_relay(tmp_path, corpus_dir, size: str) -> Relay:
    from relayproxy.relay.store import RelayStore

    from .test_downstream_sql import MYSQL_CORPUS
    d = relay_dir_with(tmp_path / "small", {"binlog.000004": corpus_dir / MYSQL_CORPUS})
    return Relay(RelayStore.open(d), d, gtid_mode="mysql", max_statement_bytes=size)


# -- 1. statement size ---------------------------------------------------------------------------


def test_max_statement_bytes_is_an_option_of_one_mebibyte():
    cfg = config.load(None, environ={})
    assert cfg.max_statement_bytes == 1 << 20 == limits.DEFAULT_MAX_STATEMENT_BYTES
    assert config.load(None, environ={"RELAYPROXY_MAX_STATEMENT_BYTES": "4K"}).max_statement_bytes == 4096


def test_a_statement_over_the_limit_is_refused_before_it_is_tokenized(mysql_relay, monkeypatch, no_traceback):
    r = mysql_relay
    calls = []
    monkeypatch.setattr(dispatch, "tokenize", lambda sql, **kw: calls.append(len(sql)) or tokenize(sql, **kw))
    sql = "SELECT " + "1+" * (1 << 19) + "1"  # the issue's 1 MB SELECT 1+1+...
    e = r.error(sql, 1153)
    assert "max_allowed_packet" in e.message and str(1 << 20) in e.message
    e = asyncio.run(execute(r.ctx, r.conn, "CHANGE MASTER TO MASTER_HOST='" + "h" * (2 << 20) + "'"))
    assert isinstance(e, ErrorResponse) and e.code == 1153
    assert calls == []
    # counted in bytes, not characters
    r.error("SELECT '" + "\u00e9" * ((1 << 19) + 10) + "'", 1153)
    assert calls == []


def test_the_limit_is_configurable(tmp_path, corpus_dir, no_traceback):
    r = small_relay(tmp_path, corpus_dir, "1K")
    r.error("SELECT '" + "x" * 1100 + "'", 1153)
    assert r.one("SELECT '" + "x" * 900 + "'") == "x" * 900
    r.store.close()


# -- 2. nesting, depth and terms -----------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT " + "(" * 150 + "1" + ")" * 150,  # the issue's RecursionError
    "SELECT " + "-" * 100_000 + "1",
    "SELECT " + "NOT " * 10_000 + "1",
    "SELECT " + "IFNULL(" * 100 + "1" + ", 2)" * 100,
    "SELECT " + "1+" * 300_000 + "1",  # 600 KB: under the statement limit, over the depth limit
    "SELECT 1 IN (" + ",".join(["1"] * 10_001) + ")",  # more terms than MAX_TERMS, shallow
    "SHOW VARIABLES WHERE " + " OR ".join(["Value = 1"] * 300),
])
def test_deep_or_long_expressions_are_a_syntax_error_not_a_recursion_error(mysql_relay, sql, no_traceback):
    e = mysql_relay.error(sql, 1064)
    assert "relayproxy refuses" in e.message
    assert any(str(n) in e.message
               for n in (limits.MAX_NESTING, limits.MAX_EXPRESSION_DEPTH, limits.MAX_TERMS, limits.MAX_TOKENS))


def test_the_parser_stops_reading_at_the_limit(monkeypatch):
    sql = "SELECT " + "1+" * 10_000 + "1"  # under MAX_TOKENS, over MAX_EXPRESSION_DEPTH
    tokens = tokenize(sql)
    p = Parser(sql, tokens, "mysql")
    p.advance()
    with pytest.raises(SqlError):
        p.expr()
    assert p.i <= 2 * limits.MAX_EXPRESSION_DEPTH + 2  # refused after ~256 terms, not 10,000
    # The tokenizer stops at its own bounds: the MAX_TOKENS + 1-th token, the MAX_NESTING + 1-th parenthesis.
    consumed = []
    real_read_token = parser_module._read_token
    monkeypatch.setattr(parser_module, "_read_token", lambda sql, i: consumed.append(i) or real_read_token(sql, i))
    with pytest.raises(SqlError, match=f"more than {limits.MAX_TOKENS} tokens"):
        tokenize("SELECT " + "1+" * 300_000 + "1")
    assert len(consumed) == limits.MAX_TOKENS
    consumed.clear()
    with pytest.raises(SqlError, match=f"nested more than {limits.MAX_NESTING} deep"):
        tokenize("SELECT " + "(" * 10_000 + "1" + ")" * 10_000)
    assert len(consumed) == limits.MAX_NESTING + 2  # SELECT and the parentheses


def test_expressions_under_the_limits_still_answer(mysql_relay):
    r = mysql_relay
    assert r.one("SELECT " + "(" * 60 + "1" + ")" * 60) == 1
    assert r.one("SELECT " + "1+" * 200 + "1") == 201
    assert r.one("SELECT 1 IN (" + ",".join(["2"] * 5000) + ", 1)") == 1


# -- 3. LIKE -------------------------------------------------------------------------------------


def reference_like(subject: str, pattern: str, escape: str = "\\") -> bool:
    """The backtracking regex relayproxy used before (exponential, fine on small inputs)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.IGNORECASE | re.DOTALL).match(subject) is not None


@settings(max_examples=3000, deadline=None)
@given(st.text("aAbB_%\\x\n", max_size=12), st.text("aAbBx\n_%\\", max_size=14), st.sampled_from(["\\", "x", "%"]))
def test_like_matches_the_regex_reference(pattern, subject, escape):
    assert like_match(subject, pattern, escape) == reference_like(subject, pattern, escape)


@pytest.mark.parametrize("subject,pattern,hit", [
    ("abc", "abc", True), ("ABC", "a_c", True), ("abc", "a%", True), ("abc", "%c", True), ("abc", "%b%", True),
    ("abc", "ab", False), ("a%c", "a\\%c", True), ("abc", "a\\%c", False), ("a_c", "a\\_c", True),
    ("abc", "a\\_c", False), ("", "%", True), ("", "_", False), ("ab\\", "ab\\", True), ("aXb", "a%b%", True),
    ("server_id", "server\\_%", True), ("serverXid", "server\\_%", False),
])
def test_like_semantics(subject, pattern, hit):
    assert like_match(subject, pattern) is hit


@pytest.mark.parametrize("pattern", ["%a%a%ab", "%a%a%a%a%a%a%ab", "%a_a_a_a_a_b%", "_%_%_%_%b", "%aaaaaaab%"])
def test_like_work_is_linear(pattern):
    for n in (1152, 20_000):
        budget = limits.Budget(limit=1 << 60)
        assert like_match("a" * n, pattern, budget=budget) is False
        assert budget.steps <= 8 * (n + len(pattern))  # linear, where the regex was n^(number of %)


def test_the_issues_like_answers(mysql_relay, budgets, no_traceback):
    assert mysql_relay.one("SELECT '" + "a" * 1152 + "' LIKE '%a%a%ab'") == 0
    assert budgets[-1].steps < 10_000
    assert mysql_relay.one("SELECT '" + "a" * 1152 + "b' LIKE '%a%a%ab'") == 1


# -- 4. string values and user variables ---------------------------------------------------------


def test_concat_doubling_stops_at_the_limit(mysql_relay, no_traceback):
    r = mysql_relay
    r.ok("SET @a = '" + "x" * 1300 + "'")
    errors = 0
    for _ in range(20):  # 1.3 KB * 8^k passes 1 MiB in 4 rounds
        result = r.run("SET @a = CONCAT(@a, @a, @a, @a, @a, @a, @a, @a)")
        if isinstance(result, ErrorResponse):
            assert result.code == 1301 and "max_allowed_packet" in result.message
            errors += 1
    assert errors == 20 - 3
    assert sum(len(k) + limits.value_size(v) for k, v in r.conn.user_vars.items()) <= 1 << 20
    r.error("SELECT CONCAT(@a, @a, @a, @a, @a, @a, @a, @a)", 1301)
    r.error("SELECT UPPER(CONCAT(@a, @a, @a, @a, @a, @a, @a, @a))", 1301)


def test_user_variables_of_a_connection_are_capped_together(mysql_relay, no_traceback):
    r = mysql_relay
    chunk = "y" * (200 * 1024)
    for i in range(5):
        r.ok(f"SET @v{i} = '{chunk}'")
    e = r.error(f"SET @v5 = '{chunk}'", 1301)
    assert "User variables" in e.message
    assert "v5" not in r.conn.user_vars  # nothing assigned
    r.ok("SET @v0 = NULL")  # freeing space makes room again
    r.ok(f"SET @v5 = '{chunk}'")
    other = r.connect(8)
    r.ok(f"SET @v0 = '{chunk}'", other)  # per connection


# -- 5. numeric overflow -------------------------------------------------------------------------


@pytest.mark.parametrize("sql,code", [
    ("SELECT NOW() - INTERVAL 1e20 DAY", 1690),
    ("SELECT NOW() + INTERVAL 99999999 DAY", 1690),
    ("PURGE BINARY LOGS BEFORE NOW() - INTERVAL 1e20 DAY", 1690),
    ("SELECT 9223372036854775807 * 9223372036854775807", 1690),
    ("SELECT 18446744073709551615 + 1", 1690),
    ("SELECT -18446744073709551615", 1690),
    ("SELECT 1e308 * 10", 1690),
    ("SELECT '1e400' + 0", 1690),
    ("SELECT '1e400' DIV 1", 1690),
    ("SELECT 1e400", 1367),
    ("SELECT " + "9" * 5000, 1367),
])
def test_numeric_overflow_is_data_out_of_range(mysql_relay, sql, code, no_traceback):
    e = mysql_relay.error(sql, code)
    assert len(e.message) < 400


def test_huge_literals_never_reach_the_wire_as_huge_integers(mysql_relay, no_traceback):
    r = mysql_relay
    hex_literal = "0x" + "f" * 200_000  # the issue's product of two hex literals (smaller, same shape)
    for sql in (f"SELECT {hex_literal} * {hex_literal}", f"SELECT {hex_literal}", "SELECT " + "9" * 30,
                "SELECT 18446744073709551615, -9223372036854775808"):
        result = r.run(sql)
        encode_response(result, capabilities=0)  # never raises
    assert r.one("SELECT 18446744073709551615 - 1") == 18446744073709551614
    assert isinstance(r.one("SELECT " + "9" * 30), float)


# -- 6. work budget ------------------------------------------------------------------------------


def test_a_statement_over_its_step_budget_is_interrupted(mysql_relay, budgets, no_traceback):
    items = ",".join(["'nope'"] * 9000)
    e = mysql_relay.error(f"SHOW VARIABLES WHERE Variable_name IN ({items})", 3024)
    assert "evaluation steps" in e.message
    assert budgets[-1].steps == limits.MAX_STEPS + 1  # stopped at the budget, not after the ~500 rows


def test_mariadb_names_its_own_timeout_error(maria_relay, no_traceback):
    items = ",".join(["'nope'"] * 9000)
    e = maria_relay.error(f"SHOW VARIABLES WHERE Variable_name IN ({items})", 1969)
    assert e.sqlstate == "70100"


def test_ordinary_statements_use_a_small_part_of_the_budget(mysql_relay, budgets):
    r = mysql_relay
    for sql in ("SHOW VARIABLES", "SHOW VARIABLES LIKE '%gtid%'", "SHOW GLOBAL VARIABLES WHERE Variable_name LIKE "
                "'server%' OR Value = 'ON'", "SELECT @@server_id, @@gtid_mode, UNIX_TIMESTAMP(), CONCAT('a', 'b')"):
        assert isinstance(r.run(sql), ResultSet)
        assert budgets[-1].steps < limits.MAX_STEPS // 20, sql


# -- @@max_allowed_packet is what the server enforces -------------------------------------------------------------


@pytest.mark.parametrize("limit", [4096, 1 << 20])
def test_max_allowed_packet_is_the_enforced_packet_limit(limit):
    """A real client against the in-process server with the real SQL layer: @@max_allowed_packet answers
    max_statement_bytes; a COM_QUERY packet of exactly that size is answered, one byte more is 1153 and the
    connection is closed, as the servers do."""
    import pymysql

    from relayproxy.downstream.server import DownstreamServer
    from relayproxy.downstream.users import DownstreamUser

    from .test_downstream_server import make_ctx, rsa_key

    ctx = make_ctx("mysql")
    ctx.relay.cfg.max_statement_bytes = limit
    users = [DownstreamUser("app", "app-pw", plugin="mysql_native_password")]

    async def scenario() -> None:
        server = DownstreamServer(ctx, users, rsa_key=rsa_key())
        await server.start("127.0.0.1", 0)
        assert server.max_packet == limit

        def client() -> None:
            conn = pymysql.connect(host="127.0.0.1", port=server.address[1], user="app", password="app-pw")
            cur = conn.cursor()
            cur.execute("SELECT @@max_allowed_packet, @@global.max_allowed_packet")
            assert cur.fetchall() == ((limit, limit),)
            head, tail = "SELECT '", "' AS x"
            filler = "a" * (limit - 1 - len(head) - len(tail) - 16)  # 16 bytes left under the string bound
            statement = head + filler + tail + " " * 16  # the COM_QUERY packet is exactly `limit` bytes
            assert len(statement) + 1 == limit
            cur.execute(statement)
            assert cur.fetchall() == ((filler,),)
            with pytest.raises(pymysql.MySQLError) as info:
                cur.execute(statement + " ")  # one byte over
            # 1153 when the error arrives before the client has sent all of its packet; 2013 when the close does;
            # 2006 when the client is still sending as the server closes (its unread bytes make the kernel answer
            # with a reset): the servers' own "MySQL server has gone away" for a packet that is too large.
            assert info.value.args[0] in (1153, 2013, 2006), info.value.args
            if info.value.args[0] == 1153:
                assert "max_allowed_packet" in info.value.args[1]
            with pytest.raises(pymysql.MySQLError):  # the server closed the connection
                cur.execute("SELECT 1")
            conn.close()

        try:
            await asyncio.to_thread(client)
        finally:
            await server.close()

    asyncio.run(scenario())
