"""Failed-login throttling per host (issue 14, MySQL's max_connect_errors): after N consecutive connections from a
host that end without logging in, that host gets 1129 before the greeting until FLUSH HOSTS (admin) or
host_block_time; a good login resets the count; other hosts and connections already logged in are unaffected."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from test_downstream_server import RawClient, Stub, make_ctx, rsa_key  # noqa: E402
from test_hostile_clients import login_error  # noqa: E402

from relayproxy.downstream.server import ConnectErrors, DownstreamServer  # noqa: E402
from relayproxy.downstream.sql import execute  # noqa: E402
from relayproxy.downstream.users import DownstreamUser  # noqa: E402
from relayproxy.wire.packets import parse_err  # noqa: E402

USERS = [
    DownstreamUser("repl", "repl-pw", plugin="mysql_native_password"),
    DownstreamUser("ops", "ops-pw", plugin="mysql_native_password", admin=True),
]
BLOCKED = "Host '127.0.0.1' is blocked because of many connection errors; unblock with 'mariadb-admin flush-hosts'"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.booleans()), max_size=200))
def test_never_more_hosts_than_the_cache_and_blocked_iff_limit_consecutive_failures(events) -> None:
    errors = ConnectErrors(3, 0.0, max_hosts=5, clock=Clock())
    run: dict[str, int] = {}
    for host, ok in events:
        if errors.blocked(host):
            continue  # refused before the greeting: neither a failure nor a success
        if ok:
            errors.succeeded(host)
            run[host] = 0
        else:
            errors.failed(host)
            run[host] = run.get(host, 0) + 1
        assert len(errors._errors) <= 5
        if errors.count(host) or run[host] == 0:  # remembered: the count is the run of failures
            assert errors.count(host) == run[host]
            assert errors.blocked(host) == (run[host] >= 3)


async def connect_from(server: DownstreamServer, source: str) -> RawClient:
    reader, writer = await asyncio.open_connection(*server.address, local_addr=(source, 0))
    return RawClient(reader, writer)


def test_failed_logins_block_the_host_not_others_nor_logged_in_replicas(capsys) -> None:
    async def scenario() -> None:
        stub = Stub()
        ctx = make_ctx("mariadb")

        async def sql(ctx, conn, text):  # FLUSH HOSTS through the real SQL layer, the rest through the stub
            if text.upper().startswith("FLUSH"):
                return await execute(ctx, conn, text)
            return await stub.sql(ctx, conn, text)

        server = DownstreamServer(ctx, USERS, sql=sql, dump=stub.dump, rsa_key=rsa_key(), max_connect_errors=3)
        await server.start("127.0.0.1", 0)
        try:
            replica = await RawClient.connect(server)  # logged in before the burst
            await replica.login("repl", "repl-pw")
            for _ in range(2):
                client = await RawClient.connect(server)
                assert (await login_error(client, "repl", "wrong"))[0] == 1045
                client.close()
            good = await RawClient.connect(server)  # a good login resets the count
            await good.login("repl", "repl-pw")
            good.close()
            for _ in range(2):
                client = await RawClient.connect(server)
                assert (await login_error(client, "repl", "wrong"))[0] == 1045
                client.close()
            client = await RawClient.connect(server)  # a handshake abandoned after the greeting counts too
            await client.packet()
            client.close()
            await _wait(lambda: server.connect_errors.blocked("127.0.0.1"))
            for password in ("repl-pw", "wrong"):
                client = await RawClient.connect(server)
                err = parse_err((await client.packet())[1])  # before the greeting, even with the right password
                assert (err.code, err.sqlstate, err.message) == (1129, "HY000", BLOCKED)
                assert await client.closed_by_server()
            # The replica logged in before is not touched; another host logs in.
            replica.send(b"\x0e", 0)
            assert (await replica.payload())[0] == 0x00
            other = await connect_from(server, "127.0.0.2")
            await other.login("repl", "repl-pw")
            # FLUSH HOSTS: admin only (a non-admin connected from elsewhere gets 1227), then the host is let in.
            other.send(b"\x03FLUSH HOSTS", 0)
            assert parse_err(await other.payload()).code == 1227
            admin = await connect_from(server, "127.0.0.3")
            await admin.login("ops", "ops-pw")
            admin.send(b"\x03FLUSH HOSTS", 0)
            assert (await admin.payload())[0] == 0x00
            client = await RawClient.connect(server)
            await client.login("repl", "repl-pw")
            for c in (client, admin, other, replica):
                c.close()
        finally:
            await server.close()

    asyncio.run(scenario())
    events = [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert events.count("host blocked after failed logins") == 1
    assert events.count("connection refused: host blocked after failed logins") == 2


def test_block_time_lifts_the_block() -> None:
    async def scenario() -> None:
        stub = Stub()
        server = DownstreamServer(make_ctx("mysql"), USERS, sql=stub.sql, dump=stub.dump, rsa_key=rsa_key(),
                                  max_connect_errors=1, host_block_time=0.2)
        await server.start("127.0.0.1", 0)
        try:
            client = await RawClient.connect(server)
            assert (await login_error(client, "repl", "wrong"))[0] == 1045
            client.close()
            await _wait(lambda: server.connect_errors.count("127.0.0.1") == 1)
            client = await RawClient.connect(server)
            err = parse_err((await client.packet())[1])
            assert err.code == 1129 and err.message.endswith("unblock with 'mysqladmin flush-hosts'")
            client.close()
            await _wait(lambda: not server.connect_errors.blocked("127.0.0.1"), timeout=30)
            client = await RawClient.connect(server)
            await client.login("repl", "repl-pw")
            client.close()
        finally:
            await server.close()

    asyncio.run(scenario())


async def _wait(predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)
