"""--listen's admission, as the servers do it: max_connect_errors counts only handshake errors (a connection that
ends before its credentials were checked: closed, bad or timed-out handshake), never a wrong password, never from
127.0.0.1 or ::1; a blocked host gets 1129 before the greeting until FLUSH HOSTS (admin) or host_block_time; a
good login resets the count. Wrong passwords are slowed down instead, per user name and host (MySQL's
connection_control): a growing delay after login_failures_threshold consecutive failures, reset by a good login,
that holds only its own socket and never delays another account, another host or a logged-in connection.

test_same_outcome_as_mariadb runs the same sequences against a real MariaDB 10.11 (max_connect_errors=3, name
resolution on: with skip_name_resolve the servers block nobody) and against the relay."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pymysql
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .test_downstream_server import RawClient, Stub, make_ctx, rsa_key
from .test_hostile_clients import login_error

from relayproxy.downstream.admission import ConnectErrors, LoginThrottle  # noqa: E402
from relayproxy.downstream.server import DownstreamServer  # noqa: E402
from relayproxy.downstream.sql import execute  # noqa: E402
from relayproxy.downstream.users import DownstreamUser  # noqa: E402
from relayproxy.wire.packets import parse_err  # noqa: E402

USERS = [
    DownstreamUser("repl", "repl-pw", plugin="mysql_native_password"),
    DownstreamUser("mon", "mon-pw", plugin="mysql_native_password"),
    DownstreamUser("ops", "ops-pw", plugin="mysql_native_password", admin=True),
]
ELSEWHERE = "127.0.0.2"  # not the loopback address the servers exempt: its errors count
BLOCKED = "Host '127.0.0.2' is blocked because of many connection errors; unblock with 'mariadb-admin flush-hosts'"
FAST_THROTTLE = dict(login_failures_threshold=3, login_min_delay=0.001, login_max_delay=0.005)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the counts, sans-I/O -----------------------------------------------------------------------------------------


def test_counts_block_reset_expiry_and_flush() -> None:
    clock = Clock()
    errors = ConnectErrors(3, 60.0, max_hosts=4, clock=clock)
    assert [errors.failed("a") for _ in range(2)] == [False, False]
    errors.succeeded("a")  # a good login resets the count
    assert [errors.failed("a") for _ in range(3)] == [False, False, True]
    assert errors.blocked("a") and not errors.blocked("b")
    assert errors.failed("a") is False  # blocking is reported once
    clock.now += 59.9
    assert errors.blocked("a")
    clock.now += 0.1
    assert not errors.blocked("a") and errors.count("a") == 0  # block time over: a fresh count
    for _ in range(3):
        errors.failed("b")
    assert errors.flush() == 1 and not errors.blocked("b") and errors.count("b") == 0
    forever = ConnectErrors(1, 0.0, clock=clock)
    forever.failed("c")
    clock.now += 1e9
    assert forever.blocked("c")  # 0: until FLUSH HOSTS
    for loopback in ("127.0.0.1", "::1"):  # never counted, never blocked (hostname.cc); 127.0.0.2 is not loopback
        assert not any(forever.failed(loopback) for _ in range(5)) and not forever.blocked(loopback)
    assert forever.failed("127.0.0.2") and forever.blocked("127.0.0.2")


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.booleans()), max_size=200))
def test_never_more_hosts_than_the_cache_and_blocked_iff_limit_consecutive_failures(events) -> None:
    errors = ConnectErrors(3, 0.0, max_hosts=5, clock=Clock())
    run: dict[str, int] = {}  # the model: the run of failures of each remembered host, least recently failing first
    for host, ok in events:
        if errors.blocked(host):
            continue  # refused before the greeting: neither a failure nor a success
        if ok:
            errors.succeeded(host)
            run.pop(host, None)
        else:
            errors.failed(host)
            run[host] = run.pop(host, 0) + 1
            while len(run) > 5:
                run.pop(next(iter(run)))  # forgotten, as the cache forgets it (and its block)
        assert len(errors._errors) <= 5
        assert errors.count(host) == run.get(host, 0)
        assert errors.blocked(host) == (run.get(host, 0) >= 3)


def test_throttle_delays_grow_per_user_and_host_and_a_good_login_resets() -> None:
    throttle = LoginThrottle(3, 1.0, 4.5, max_keys=3)
    delays = []
    for _ in range(8):
        delays.append(throttle.delay("repl", "h1"))
        throttle.failed("repl", "h1")
    assert delays == [0, 0, 0, 1.0, 2.0, 3.0, 4.0, 4.5]  # attempt N+k waits k x min, at most max
    assert throttle.delay("repl", "h2") == 0 and throttle.delay("mon", "h1") == 0  # other hosts, other accounts
    assert throttle.delay("repl", "h1") == 4.5  # the next one, right password or not, still waits
    throttle.succeeded("repl", "h1")
    assert throttle.delay("repl", "h1") == 0 and throttle.failures("repl", "h1") == 0
    for name in "abcd":  # bounded: the least recently failing pair is forgotten
        throttle.failed(name, "h")
    assert len(throttle._failures) == 3 and throttle.failures("a", "h") == 0
    doc = throttle.describe()
    assert doc["failed_logins"] == 12 and doc["login_failures_threshold"] == 3
    off = LoginThrottle(0, 1.0, 2.0)
    for _ in range(10):
        off.failed("x", "h")
    assert off.delay("x", "h") == 0


# -- the server ---------------------------------------------------------------------------------------------------


async def connect_from(server: DownstreamServer, source: str) -> RawClient:
    reader, writer = await asyncio.open_connection(*server.address, local_addr=(source, 0))
    return RawClient(reader, writer)


def _admin_sql(stub: Stub):
    async def sql(ctx, conn, text):  # FLUSH HOSTS through the real SQL layer, the rest through the stub
        if text.upper().startswith("FLUSH"):
            return await execute(ctx, conn, text)
        return await stub.sql(ctx, conn, text)

    return sql


def test_handshake_errors_block_the_host_wrong_passwords_do_not(capsys) -> None:
    async def scenario() -> None:
        stub = Stub()
        server = DownstreamServer(make_ctx("mariadb"), USERS, sql=_admin_sql(stub), dump=stub.dump, rsa_key=rsa_key(),
                                  max_connect_errors=3, **FAST_THROTTLE)
        await server.start("127.0.0.1", 0)
        try:
            replica = await connect_from(server, ELSEWHERE)  # logged in before the burst
            await replica.login("repl", "repl-pw")
            for _ in range(20):  # wrong passwords: authentication errors, not connection errors
                client = await connect_from(server, ELSEWHERE)
                assert (await login_error(client, "repl", "wrong"))[0] == 1045
                client.close()
            assert server.connect_errors.count(ELSEWHERE) == 0 and not server.connect_errors.blocked(ELSEWHERE)
            assert server.login_throttle.failures("repl", ELSEWHERE) == 20
            for _ in range(2):  # handshake errors: a connection closed after the greeting
                client = await connect_from(server, ELSEWHERE)
                await client.packet()
                client.close()
            await _wait(lambda: server.connect_errors.count(ELSEWHERE) == 2)
            good = await connect_from(server, ELSEWHERE)  # a good login resets both counts
            await good.login("repl", "repl-pw")
            good.close()
            assert server.connect_errors.count(ELSEWHERE) == 0 and server.login_throttle.failures("repl", ELSEWHERE) == 0
            client = await connect_from(server, ELSEWHERE)  # a garbage handshake
            await client.packet()
            client.send(b"hello", 1)
            assert parse_err(await client.payload()).code == 1043
            client.close()
            for _ in range(2):
                client = await connect_from(server, ELSEWHERE)
                client.close()  # closed at once (a TCP health check)
            await _wait(lambda: server.connect_errors.blocked(ELSEWHERE))
            for password in ("repl-pw", "wrong"):
                client = await connect_from(server, ELSEWHERE)
                err = parse_err((await client.packet())[1])  # before the greeting, even with the right password
                assert (err.code, err.sqlstate, err.message) == (1129, "HY000", BLOCKED)
                assert await client.closed_by_server()
            # The replica logged in before is not touched; another host logs in.
            replica.send(b"\x0e", 0)
            assert (await replica.payload())[0] == 0x00
            other = await connect_from(server, "127.0.0.3")
            await other.login("repl", "repl-pw")
            other.send(b"\x03FLUSH HOSTS", 0)  # admin only
            assert parse_err(await other.payload()).code == 1227
            admin = await connect_from(server, "127.0.0.4")
            await admin.login("ops", "ops-pw")
            admin.send(b"\x03FLUSH HOSTS", 0)
            assert (await admin.payload())[0] == 0x00
            client = await connect_from(server, ELSEWHERE)
            await client.login("repl", "repl-pw")
            for c in (client, admin, other, replica):
                c.close()
        finally:
            await server.close()

    asyncio.run(scenario())
    events = [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert events.count("host blocked after failed logins") == 1


def test_loopback_is_never_blocked() -> None:
    """The probe's sequence from 127.0.0.1: wrong passwords, bare connect/close, garbage; then a login works."""
    async def scenario() -> None:
        stub = Stub()
        server = DownstreamServer(make_ctx("mariadb"), USERS, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key(),
                                  max_connect_errors=3, **FAST_THROTTLE)
        await server.start("127.0.0.1", 0)
        try:
            for _ in range(30):
                client = await RawClient.connect(server)
                assert (await login_error(client, "repl", "wrong"))[0] == 1045
                client.close()
            for _ in range(10):
                (await RawClient.connect(server)).close()
                client = await RawClient.connect(server)
                await client.packet()
                client.send_raw(b"\x05\x00\x00\x01hello")
                assert parse_err(await client.payload()).code == 1043
                assert await client.closed_by_server()
            client = await RawClient.connect(server)
            await client.login("repl", "repl-pw")
            client.close()
            assert server.connect_errors.count("127.0.0.1") == 0
        finally:
            await server.close()

    asyncio.run(scenario())


def test_block_time_lifts_the_block() -> None:
    async def scenario() -> None:
        stub = Stub()
        server = DownstreamServer(make_ctx("mysql"), USERS, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key(),
                                  max_connect_errors=1, host_block_time=0.2)
        await server.start("127.0.0.1", 0)
        try:
            client = await connect_from(server, ELSEWHERE)
            await client.packet()
            client.close()
            await _wait(lambda: server.connect_errors.count(ELSEWHERE) == 1)
            client = await connect_from(server, ELSEWHERE)
            err = parse_err((await client.packet())[1])
            assert err.code == 1129 and err.message.endswith("unblock with 'mysqladmin flush-hosts'")
            client.close()
            await _wait(lambda: not server.connect_errors.blocked(ELSEWHERE), timeout=30)
            client = await connect_from(server, ELSEWHERE)
            await client.login("repl", "repl-pw")
            client.close()
        finally:
            await server.close()

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_delayed_login_holds_only_its_socket_and_delays_no_one_else() -> None:
    """repl@127.0.0.2 over the threshold waits its delay (long here): meanwhile its socket is not read, it keeps its
    unauthenticated slot (a newcomer may take it when the budget is full), and logins of another account from that
    host, of the same account from another host, and a logged-in replica's commands go on. The handshake timeout does
    not cut the delay short (that would count a handshake error). A right password waits too, then resets."""
    async def scenario() -> None:
        stub = Stub()
        server = DownstreamServer(make_ctx("mariadb"), USERS, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key(),
                                  handshake_timeout=2.0, max_unauthenticated=3, unauthenticated_grace=0.0,
                                  login_failures_threshold=1, login_min_delay=2.5, login_max_delay=600.0)
        await server.start("127.0.0.1", 0)
        throttle = server.login_throttle
        try:
            replica = await RawClient.connect(server)
            await replica.login("repl", "repl-pw")
            client = await connect_from(server, ELSEWHERE)
            assert (await login_error(client, "repl", "wrong"))[0] == 1045  # the first failure: at once
            client.close()
            # Delayed 2.5 s (longer than the handshake timeout): still 1045, not 1043, and not a connection error.
            client = await connect_from(server, ELSEWHERE)
            assert (await login_error(client, "repl", "wrong"))[0] == 1045
            client.close()
            assert throttle.delayed_logins == 1 and server.connect_errors.count(ELSEWHERE) == 0
            throttle._failures[("repl", ELSEWHERE)] = 200  # the next delay: 500 s
            waiting = await connect_from(server, ELSEWHERE)
            pending = asyncio.ensure_future(login_error(waiting, "repl", "repl-pw"))
            await _wait(lambda: throttle.delaying == 1)
            session = next(s for s in server._sessions.values() if s.host == ELSEWHERE)
            assert not session.protocol.transport.is_reading()  # the socket is not read while it waits
            waiting.send_raw(b"x" * 100_000)
            await asyncio.sleep(0.1)
            assert session.protocol._ready_bytes == 0 and session.conn_id in server.budget.unauthenticated
            for who, source in (("mon", ELSEWHERE), ("repl", "127.0.0.3")):
                other = await connect_from(server, source)
                assert await login_error(other, who, f"{who}-pw") is None
                other.close()
            replica.send(b"\x0e", 0)
            assert (await replica.payload())[0] == 0x00
            assert not pending.done() and throttle.delaying == 1
            # The unauthenticated budget (3) full: a newcomer takes the delayed login's slot.
            idle = [await RawClient.connect(server) for _ in range(2)]
            for c in idle:
                await c.packet()
            newcomer = await RawClient.connect(server)
            await newcomer.login("repl", "repl-pw")
            assert (await pending)[0] == 1040 and throttle.delaying == 0
            assert server.connect_errors.count(ELSEWHERE) == 0  # evicted, not a handshake error of its own
            for c in (*idle, newcomer, replica, waiting):
                c.close()
            # A right password after failures waits its delay, then logs in and resets the pair.
            throttle._failures[("repl", ELSEWHERE)] = 1
            client = await connect_from(server, ELSEWHERE)
            assert await login_error(client, "repl", "repl-pw") is None
            assert throttle.failures("repl", ELSEWHERE) == 0 and throttle.delayed_logins == 3
            client.close()
            doc = server.describe_logins()
            assert doc["throttle"]["delayed_logins"] == 3 and doc["host_blocking"]["hosts_blocked"] == 0
        finally:
            await server.close()

    asyncio.run(scenario())


async def _wait(predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


# -- the same sequences against MariaDB and the relay -------------------------------------------------------------


def _login(port: int, source: str, password: str) -> str:
    try:
        pymysql.connect(host="127.0.0.1", port=port, user="repl", password=password, bind_address=source,
                        connect_timeout=30).close()
        return "ok"
    except pymysql.MySQLError as exc:
        return f"{exc.args[0]} {exc.args[1]}" if exc.args[0] == 1129 else str(exc.args[0])


def _bare(port: int, source: str) -> None:
    socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)).close()


def _garbage(port: int, source: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
        try:
            s.recv(4096)  # the greeting (or, once blocked, the 1129 and a close: the send may then be reset)
            s.sendall(b"\x05\x00\x00\x01hello")
            while s.recv(4096):  # the ERR (1043), then the server closes
                pass
        except ConnectionError:
            pass


def _silent(port: int, source: str) -> None:
    """Read the greeting, say nothing until the server's handshake timeout ends the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as s:
        try:
            while s.recv(4096):
                pass
        except ConnectionError:
            pass


SEQUENCES = {  # name: (the source address, what it does before a login with the right password)
    "the probe from 127.0.0.1": ("127.0.0.1", [("wrong", 150), (_bare, 30), (_garbage, 30)]),
    "wrong passwords": (ELSEWHERE, [("wrong", 30)]),
    "bare connect/close": (ELSEWHERE, [(_bare, 6)]),
    "garbage handshakes": (ELSEWHERE, [(_garbage, 6)]),
    "handshake timeouts": (ELSEWHERE, [(_silent, 3)]),
    "reset by a good login": (ELSEWHERE, [(_bare, 2), ("right", 1), (_bare, 2)]),
    "wrong passwords do not reset": (ELSEWHERE, [(_bare, 2), ("wrong", 1), (_bare, 1)]),
}


def _run(port: int, source: str, steps, settle) -> str:
    for action, times in steps:
        for _ in range(times):
            if isinstance(action, str):
                _login(port, source, "repl-pw" if action == "right" else "wrong")
            else:
                action(port, source)
    settle(source)
    return _login(port, source, "repl-pw")


def _settled(read) -> None:
    """Until the server has counted the connections that ended (it notices a close after the client moved on)."""
    last, deadline = read(), time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = read()
        if now == last:
            return
        last = now


def test_same_outcome_as_mariadb(mariadb) -> None:
    server = mariadb("mcerrors", log_bin=False, extra_config={
        "max_connect_errors": 3, "skip_name_resolve": False, "connect_timeout": 2, "performance_schema": "ON"})
    server.execute("CREATE USER 'repl'@'%' IDENTIFIED BY 'repl-pw'")

    def mariadb_errors(source: str):
        return server.execute("SELECT SUM_CONNECT_ERRORS FROM performance_schema.host_cache WHERE IP = %s", (source,))

    theirs = {}
    for name, (source, steps) in SEQUENCES.items():
        server.execute("FLUSH HOSTS")
        theirs[name] = _run(server.port, source, steps, lambda src: _settled(lambda: mariadb_errors(src)))

    loop = asyncio.new_event_loop()
    stub = Stub()
    relay = DownstreamServer(make_ctx("mariadb"), USERS, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key(),
                             max_connect_errors=3, handshake_timeout=2.0, **FAST_THROTTLE)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(relay.start("127.0.0.1", 0), loop).result(30)
        port = relay.address[1]
        ours = {}
        for name, (source, steps) in SEQUENCES.items():
            loop.call_soon_threadsafe(relay.connect_errors.flush)
            ours[name] = _run(port, source, steps, lambda src: _settled(lambda: relay.connect_errors.count(src)))
    finally:
        asyncio.run_coroutine_threadsafe(relay.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
    print("\nsequence, then a right password: MariaDB 10.11 | relay")
    for name in SEQUENCES:
        print(f"  {name:30} {theirs[name]:>10} | {ours[name]}")
    assert ours == theirs
    assert theirs["the probe from 127.0.0.1"] == "ok" and theirs["wrong passwords"] == "ok"
    assert theirs["bare connect/close"].startswith("1129 ") and theirs["reset by a good login"] == "ok"
