"""Hostile and careless clients (log flooding, connection limits, stalled clients): each attack against the in-process server on 127.0.0.1
gets the error a MySQL/MariaDB server gives, and the log grows by at most one compact line per attack (never a
traceback). No timed asserts: small configured limits and timeouts, outcomes checked."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import types
from typing import Any

import pytest
from pymysql import _auth as pymysql_auth

from .test_downstream_server import RawClient, Stub, serving

from relayproxy.log import PeerLogLimiter  # noqa: E402
from relayproxy.downstream.users import DownstreamUser  # noqa: E402
from relayproxy.wire.handshake import build_handshake_response, client_capabilities, parse_handshake  # noqa: E402
from relayproxy.wire.packets import MySQLError, parse_err  # noqa: E402

APP_PW = "app-Secret-1"
ADMIN_PW = "admin-Secret-2"
USERS = [
    DownstreamUser("app", APP_PW, plugin="mysql_native_password"),
    DownstreamUser("root", ADMIN_PW, plugin="mysql_native_password", admin=True),
]


def server_lines(text: str) -> list[dict[str, Any]]:
    """The downstream server's JSON log lines about clients (listen/stop lines left out)."""
    lines = []
    for raw in text.splitlines():
        if not raw.startswith("{"):
            continue
        line = json.loads(raw)
        if line.get("logger") == "relayproxy.downstream.server" and "conn_id" in line:
            lines.append(line)
    return lines


def assert_compact(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        assert "exception" not in line and "Traceback" not in json.dumps(line), line
        assert len(json.dumps(line)) < 600, line


async def login_error(client: RawClient, user: str, password: str) -> tuple[int, str] | None:
    """Log in with mysql_native_password; None on success, else (code, message) of the ERR."""
    first = (await client.packet())[1]
    if first[0] == 0xFF:  # refused before the greeting
        err = parse_err(first)
        return err.code, err.message
    greeting = parse_handshake(first)
    caps = client_capabilities(greeting, tls=False)
    scramble = pymysql_auth.scramble_native_password(password.encode(), greeting.auth_plugin_data[:20])
    client.send(build_handshake_response(caps, user, scramble, plugin_name="mysql_native_password"), 1)
    while True:
        seq, reply = await client.packet()
        if reply[0] == 0xFE:  # switch to the account's plugin
            client.send(pymysql_auth.scramble_native_password(password.encode(), reply[-21:-1]), seq + 1)
            continue
        if reply[0] == 0x00:
            return None
        err = parse_err(reply)
        return err.code, err.message


# -- log flooding -------------------------------------------------------------------------------------------------


def test_overlong_user_name_is_access_denied_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        async with serving(Stub(), USERS) as server:
            for plugin in ("mysql_native_password", "caching_sha2_password"):
                client = await RawClient.connect(server)
                greeting = parse_handshake((await client.packet())[1])
                caps = client_capabilities(greeting, tls=False)
                client.send(build_handshake_response(caps, "u" * 300, b"x" * 20, plugin_name=plugin), 1)
                seq, reply = await client.packet()
                if reply[0] == 0xFE:  # switched to the account plugin
                    client.send(b"y" * 20, seq + 1)
                    seq, reply = await client.packet()
                err = parse_err(reply)
                assert (err.code, err.sqlstate) == (1045, "28000")
                assert err.message.startswith("Access denied for user 'uuu")
                client.close()

    asyncio.run(scenario())
    lines = server_lines(capsys.readouterr().err)
    assert [line["event"] for line in lines] == ["login refused", "login refused"]
    assert_compact(lines)


def test_internal_error_is_one_line_with_a_reference_and_rate_limited(capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> list[str]:
        messages = []
        async with serving(Stub(), USERS, log_lines_per_host=3) as server:
            for _ in range(6):
                client = await RawClient.connect(server)
                await client.login("app", APP_PW)
                client.send(b"\x03BOOM", 0)
                err = parse_err(await client.payload())
                assert err.code == 1105 and "internal error in relayproxy" in err.message
                messages.append(err.message)
                assert await client.closed_by_server()
        return messages

    messages = asyncio.run(scenario())
    lines = server_lines(capsys.readouterr().err)
    assert_compact(lines)
    errors = [line for line in lines if line["level"] == "error"]
    assert len(errors) == 3  # log_lines_per_host: the other three are counted, not logged
    for line, message in zip(errors, messages):
        assert f"reference {line['ref']}" in message
        assert line["error"] == "RuntimeError: stub blew up" and "in sql" in line["where"]
    assert len({m for m in messages}) == 6  # each its own reference


def test_peer_log_limiter_counts_what_it_drops_and_reports_it() -> None:
    now = [0.0]
    limiter = PeerLogLimiter(2, 60.0, clock=lambda: now[0])
    assert [limiter.admit("h") for _ in range(5)] == [0, 0, None, None, None]
    assert limiter.admit("other") == 0  # per host
    now[0] = 61.0
    assert limiter.admit("h") == 3  # the next line says how many were dropped
    assert limiter.admit("h") == 0


# -- connection limits --------------------------------------------------------------------------------------------


def test_login_succeeds_during_an_unauthenticated_flood(capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        options = dict(max_connections=30, max_unauthenticated=20, unauthenticated_grace=1.0)  # wide: a loaded CI
        async with serving(Stub(), USERS, **options) as server:
            flood = []
            for _ in range(20):
                client = await RawClient.connect(server)
                await client.packet()  # the greeting; then silence
                flood.append(client)
            # Within the grace period a newcomer is refused (1040 before the greeting): the budget holds.
            young = await RawClient.connect(server)
            seq, reply = await young.packet()
            assert seq == 0 and parse_err(reply).code == 1040
            young.close()
            await asyncio.sleep(1.1)  # the flood's sockets are now older than the grace period
            for _ in range(3):
                legit = await RawClient.connect(server)
                assert await login_error(legit, "app", APP_PW) is None
                legit.send(b"\x03SELECT 1", 0)
                assert await legit.payload()
                legit.close()
            assert len(server.budget.unauthenticated) <= 20 and server.connection_count <= 21
            # The oldest idle socket made room, and was told why.
            seq, reply = await flood[0].packet()
            assert parse_err(reply).code == 1040 and await flood[0].closed_by_server()
            for client in flood:
                client.close()

    asyncio.run(scenario())
    lines = server_lines(capsys.readouterr().err)
    assert_compact(lines)
    assert len(lines) <= 10  # log_lines_per_host: the flood cannot flood the log


def test_admin_account_takes_the_extra_slot_when_full() -> None:
    async def scenario() -> None:
        async with serving(Stub(), USERS, max_connections=2) as server:
            apps = [await RawClient.connect(server) for _ in range(2)]
            for client in apps:
                assert await login_error(client, "app", APP_PW) is None
            third = await RawClient.connect(server)
            assert await login_error(third, "app", APP_PW) == (1040, "Too many connections")
            admin = await RawClient.connect(server)
            assert await login_error(admin, "root", ADMIN_PW) is None
            admin.send(b"\x03SELECT 1", 0)
            assert (await admin.payload())[0] != 0xFF
            second_admin = await RawClient.connect(server)
            code = await login_error(second_admin, "root", ADMIN_PW)
            assert code == (1040, "Too many connections")  # one extra slot, as MySQL's (refused at accept)
            for client in (*apps, third, admin, second_admin):
                client.close()

    asyncio.run(scenario())


def test_per_host_cap_refuses_before_the_greeting() -> None:
    async def scenario() -> None:
        async with serving(Stub(), USERS, max_connections_per_host=2) as server:
            held = [await RawClient.connect(server) for _ in range(2)]
            for client in held:
                await client.packet()
            extra = await RawClient.connect(server)
            seq, reply = await extra.packet()
            assert seq == 0 and (parse_err(reply).code, parse_err(reply).sqlstate) == (1040, "08004")
            held[0].close()
            assert await held[0].closed_by_server()
            await asyncio.sleep(0.05)
            again = await RawClient.connect(server)
            assert await login_error(again, "app", APP_PW) is None  # a freed slot is usable again
            for client in (*held, extra, again):
                client.close()

    asyncio.run(scenario())


def test_http_idle_flood_gives_way_to_status_and_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    """Far more idle connections than --http's cap (and a slowloris trickling a request): each newcomer takes the
    slot of the oldest connection without a complete request, so /status and /metrics answer; only when every slot
    is serving a request does a newcomer get 503."""
    from relayproxy.ops.http import HttpApi

    async def get(host: str, port: int, path: str = "/status") -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return data

    async def closed(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(), 30) == b""
        except ConnectionError:
            return True

    async def scenario() -> None:
        huge = {"ok": True, "pad": "x" * 20_000_000}
        state = {"doc": {"ok": True}}
        api = HttpApi(lambda: state["doc"], max_connections=8)
        host, port = await api.start("127.0.0.1", 0)
        try:
            slowloris_reader, slowloris = await asyncio.open_connection(host, port)
            slowloris.write(b"GET /sta")  # a request that never completes
            idle = [await asyncio.open_connection(host, port) for _ in range(60)]
            for path in ("/status", "/metrics", "/status"):
                answer = await get(host, port, path)
                assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
            assert b'"http"' in await get(host, port) and b"relayproxy_http_idle_dropped" in await get(host, port, "/metrics")
            assert await closed(slowloris_reader)  # the oldest, closed first without an answer
            for reader, _ in idle[:40]:
                assert await closed(reader)
            assert api._active <= api.max_connections and api.dropped_idle >= 50
            # Every slot serving a request whose answer nobody reads: now a newcomer gets 503.
            state["doc"] = huge
            readers = []
            for _ in range(8):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
                readers.append((reader, writer))
            for _ in range(1000):
                if len(api._serving) == 8:
                    break
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection(host, port)
            assert (await asyncio.wait_for(reader.read(), 30)).startswith(b"HTTP/1.1 503 ")
            writer.close()
            for _, w in (*idle, *readers):
                w.close()
            slowloris.close()
        finally:
            await api.close()

    asyncio.run(scenario())
    lines = [line for line in capsys.readouterr().err.splitlines() if "relayproxy.http" in line]
    assert sum("closed the oldest without a complete request" in line for line in lines) == 1  # not one per drop
    assert sum("over the cap" in line for line in lines) == 1


def test_a_failing_http_request_is_one_line_with_a_reference_not_a_traceback(capsys: pytest.CaptureFixture[str]):
    from relayproxy.log import configure_logging
    from relayproxy.ops.http import HttpApi

    configure_logging("json", "info")

    def broken() -> dict:
        raise RuntimeError("status on fire")

    async def scenario() -> list[bytes]:
        api = HttpApi(broken)
        host, port = await api.start("127.0.0.1", 0)
        answers = []
        try:
            for _ in range(15):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
                answers.append(await asyncio.wait_for(reader.read(), 5))
                writer.close()
        finally:
            await api.close()
        return answers

    answers = asyncio.run(scenario())
    assert all(a.startswith(b"HTTP/1.1 500 ") and b"internal error (reference " in a for a in answers)
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{") and "http request failed" in line]
    assert len(lines) == 10  # the per-host budget of 10 a minute: 15 failures, 10 lines
    assert all(line["ref"] and "status on fire" in line["error"] and "exception" not in line for line in lines)
    assert "Traceback" not in err
    refs = {line["ref"] for line in lines}
    assert all(f"reference {ref}".encode() in b"".join(answers) for ref in refs)


# -- stalled clients ----------------------------------------------------------------------------------------------


def test_half_a_packet_is_dropped_after_net_read_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        async with serving(Stub(), USERS, net_read_timeout=0.2, idle_timeout=3600.0) as server:
            # After login: a COM_QUERY announced as 1 MB, 10 bytes of it sent.
            client = await RawClient.connect(server)
            assert await login_error(client, "app", APP_PW) is None
            client.send_raw((1 << 20).to_bytes(3, "little") + b"\x00" + b"\x03SELECT 1")
            err = parse_err((await client.packet(timeout=10))[1])
            assert (err.code, err.sqlstate) == (1159, "08S01") and "net_read_timeout" in err.message
            assert await client.closed_by_server()
            # Before login: half a handshake response (the handshake timeout is longer).
            client = await RawClient.connect(server)
            await client.packet()
            client.send_raw((200).to_bytes(3, "little") + b"\x01" + b"\x00" * 50)
            err = parse_err((await client.packet(timeout=10))[1])
            assert err.code == 1159
            assert await client.closed_by_server()
            # A client that sends nothing at all between commands is idle, not stalled: still connected.
            idle = await RawClient.connect(server)
            assert await login_error(idle, "app", APP_PW) is None
            await asyncio.sleep(0.4)
            idle.send(b"\x03SELECT 1", 0)
            assert (await idle.payload())[0] != 0xFF
            idle.close()

    asyncio.run(scenario())
    lines = server_lines(capsys.readouterr().err)
    assert_compact(lines)
    assert len(lines) == 2  # one per stalled client


def _dump_command(server_id: int) -> bytes:
    return b"\x12" + struct.pack("<IHI", 4, 0, server_id) + b"mysql-bin.000001"


async def _start_dump(server: Any, server_id: int, *statements: str) -> RawClient:
    client = await RawClient.connect(server)
    assert await login_error(client, "app", APP_PW) is None
    for statement in statements:
        client.send(b"\x03" + statement.encode(), 0)
        assert (await client.payload())[0] == 0x00
    client.send(_dump_command(server_id), 0)
    assert await client.payload() == b"\x00tick"
    return client


async def _ended_after_ticks(client: RawClient, timeout: float = 5.0) -> bool:
    """True when the server closes a ticking dump: the ticks it sent before the newer dump ended it are still
    buffered, so they are read past; any other packet, or no close within the timeout, is False."""
    try:
        async with asyncio.timeout(timeout):
            while await client.payload(timeout) == b"\x00tick":
                pass
    except (EOFError, ConnectionError):
        return True
    except TimeoutError:
        return False
    return False


def test_a_new_dump_of_the_same_replica_ends_the_older_one(capsys: pytest.CaptureFixture[str]) -> None:
    stub = Stub()

    async def body(conn: Any, request: Any, channel: Any) -> None:
        while True:  # a dump waiting for new transactions, with a heartbeat now and then
            await channel.send(b"\x00tick")
            await asyncio.sleep(0.01)

    stub.dump_body = body

    async def scenario() -> None:
        async with serving(stub, USERS) as server:
            # MariaDB's rule (and MySQL's without a replica UUID): the same server_id.
            old = await _start_dump(server, 5)
            new = await _start_dump(server, 5)
            assert await _ended_after_ticks(old)
            assert await new.payload() == b"\x00tick"  # the newer one goes on
            # Other replicas are left alone; so are server_id 0 dumps (mysqlbinlog), several of which may run.
            other = await _start_dump(server, 6)
            tools = [await _start_dump(server, 0) for _ in range(2)]
            for client in (new, other, *tools):
                assert await client.payload() == b"\x00tick"
            # MySQL's rule: the same @slave_uuid / @replica_uuid ends the older dump whatever the server_id.
            uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
            old_uuid = await _start_dump(server, 7, f"SET @slave_uuid = '{uuid}'")
            new_uuid = await _start_dump(server, 8, f"SET @replica_uuid = '{uuid}'")
            assert await _ended_after_ticks(old_uuid)
            assert await new_uuid.payload() == b"\x00tick"
            for client in (old, new, other, *tools, old_uuid, new_uuid):
                client.close()

    asyncio.run(scenario())
    ended = [line for line in server_lines(capsys.readouterr().err) if line["event"].startswith("ended an older")]
    assert [(line.get("server_id"), line.get("replica_uuid")) for line in ended] == [
        (5, None), (None, "3e11fa47-71ca-11e1-9e33-c80aa9429562")
    ]


def test_an_out_of_range_heartbeat_period_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from relayproxy.downstream.dump import serve_dump
    from relayproxy.downstream.dump.start import int_variable
    from relayproxy.downstream.server import DownstreamServer
    from .test_downstream_server import make_ctx, rsa_key

    for value in ("1e400", float("inf"), b"-1e999"):
        with pytest.raises(MySQLError) as info:
            int_variable(value, "master_heartbeat_period")
        assert info.value.code == 1231 and "master_heartbeat_period" in info.value.message
    assert int_variable("2.5e9", "master_heartbeat_period") == 2_500_000_000 and int_variable("junk") == 0

    async def scenario() -> None:
        stub = Stub()
        server = DownstreamServer(make_ctx(), USERS, sql=stub.sql, dump=serve_dump, rsa_key=rsa_key())
        await server.start("127.0.0.1", 0)
        try:
            client = await RawClient.connect(server)
            assert await login_error(client, "app", APP_PW) is None
            client.send(b"\x03SET @master_heartbeat_period = 1e400", 0)
            assert (await client.payload())[0] == 0x00
            client.send(_dump_command(9), 0)
            err = parse_err(await client.payload())
            assert (err.code, err.sqlstate) == (1231, "42000")
            assert err.message == "Variable 'master_heartbeat_period' can't be set to the value of '1e400'"
            client.close()
        finally:
            await server.close()

    asyncio.run(scenario())
    lines = server_lines(capsys.readouterr().err)
    assert_compact(lines)
    assert not [line for line in lines if line["level"] == "error"]  # the replica's mistake, not an internal error


def test_a_statement_that_trips_a_bug_logs_one_line_with_a_reference(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from relayproxy.downstream.sql import dispatch

    def deep(parser: Any, env: Any) -> Any:
        def down(n: int) -> int:
            return down(n + 1)
        return down(0)  # RecursionError: a long traceback before

    monkeypatch.setattr(dispatch, "_dispatch", deep)
    conn = types.SimpleNamespace(host="192.0.2.7", conn_id=1, user_vars={}, session_vars={})
    monkeypatch.setattr(dispatch, "_FAILURE_LOG", PeerLogLimiter(3, 60.0))
    from .test_downstream_server import make_ctx

    ctx = make_ctx()
    # within the statement limits (64 levels of parentheses), so the statement reaches the failing _dispatch
    messages = [dispatch._execute(ctx, conn, "SELECT " + "(" * 60 + "1" + ")" * 60, {}).message for _ in range(6)]
    err = capsys.readouterr().err
    lines = [json.loads(raw) for raw in err.splitlines() if raw.startswith("{") and "SQL statement failed" in raw]
    assert len(lines) == 3 and len(err) < 3 * 1000
    for line, message in zip(lines, messages):
        assert "exception" not in line and line["error"].startswith("RecursionError")
        assert f"reference {line['ref']}" in message and "internal error" in message
