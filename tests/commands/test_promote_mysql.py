"""`relayproxy promote`, MySQL flavour, against scripted MySQL 8.0 servers: no MySQL server runs here.

What is real: the relay (``serve`` in-process, ``--gtid-mode mysql``, its SQL listener and its upstream session);
`relayproxy promote --json` as a separate process, as an HA tool runs it, talking the MySQL protocol through
PyMySQL; the MySQL client/replication protocol on every link (handshakes, result sets, COM_BINLOG_DUMP_GTID by
auto-position, heartbeats, CRC32-checked binlog events); the fault proxy that stalls the candidate's link.

What is scripted: the old master M1 (tests/support/fakemaster.py ``FakeMySQLMaster``, serving a binlog file built here)
and the candidate (tests/support/fakereplica.py ``FakeMySQLReplica``): a MySQL 8.0.36 (8.0.22, 8.0.21, 5.7.44) server that
answers the statements promote sends, in its version's words, and whose replication link is a MySQL-protocol replica
by GTID auto-position; "applying" a transaction records its GTID and its statements and writes it to its own
binlog, which its master side serves. So the last part, the relay repointed to the promoted candidate, is real on
the relay's side: it connects to the candidate by SOURCE_AUTO_POSITION, dumps from the candidate's binlog and
receives the candidate's new writes; a --replica (a second scripted replica) is repointed and catches up from it the
same way. A real MySQL would also apply row changes and keep a relay log; the fake does neither.

Every expected GTID set is written out as a literal; nothing is computed with relayproxy's ``GtidSet``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pymysql
import pytest

from relayproxy.lab.failover import run_promote
from relayproxy.lab.faultproxy import SERVER_TO_CLIENT, FaultProxy

from ..support.fakemaster import FakeMySQLMaster
from ..support.fakereplica import (
    REPLICA_COLUMNS,
    FakeMySQLReplica,
    binlog_image,
    gtid_bytes,
    insert_statement,
    old_name,
    transaction_spans,
    version_tuple,
)
from ..lab.test_fake_mysql_master import running_relay, wait_for

# Each test runs the relay and `relayproxy promote` as a process against scripted servers: 2 to 9 s each.
pytestmark = pytest.mark.slow

A = "aaaaaaaa-1111-4111-8111-000000000001"  # M1, the master that dies (server_id 1)
B = "bbbbbbbb-2222-4222-8222-000000000002"  # the candidate (server_id 2)
C = "cccccccc-3333-4333-8333-000000000003"  # errant: written on the candidate, in no relay
D = "dddddddd-4444-4444-8444-000000000004"  # a write only the diverging relay's master took
E = "eeeeeeee-5555-4555-8555-000000000005"  # another replica of M1 (server_id 3), given to promote as --replica
RELAY_USERS = "repl:servepw:mysql_native_password,ops:opspw:mysql_native_password:admin"
RELAY = {"listen": "127.0.0.1:0", "users": RELAY_USERS}
# root for promote; repl for the links the relay and replicas had to M1; ops for --repl-user (both directions)
CANDIDATE_ACCOUNTS = {"root": "rootpw", "repl": "replpw", "ops": "opspw"}

M1_IMAGE = binlog_image(1, {}, [(A, n, 1) for n in range(1, 8)])  # A:1-7 in mysql-bin.000001
A4_END = transaction_spans(M1_IMAGE)[(A, 4)][1]  # M1 serves A:1-4 first; A:5-7 reach only the relay


# -- helpers -----------------------------------------------------------------------------------------------------------


def _sql(port: int, statement: str, user: str, password: str) -> list[dict]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user=user, password=password, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            columns = [d[0] for d in cur.description or ()]
            return [dict(zip(columns, row)) for row in cur.fetchall()]
    finally:
        conn.close()


async def relay_sql(port: int, statement: str) -> list[dict]:
    """A statement on a relay's --listen port as its admin (in a thread: the relay runs on this loop)."""
    return await asyncio.to_thread(_sql, port, statement, "ops", "opspw")


async def candidate_sql(cand: FakeMySQLReplica, statement: str) -> list[dict]:
    return await asyncio.to_thread(_sql, cand.port, statement, "root", "rootpw")


def words(version: str) -> dict[str, str]:
    """MySQL's words by version: START/STOP/RESET/SHOW REPLICA from 8.0.22, CHANGE REPLICATION SOURCE from 8.0.23."""
    new, source = version_tuple(version) >= (8, 0, 22), version_tuple(version) >= (8, 0, 23)
    return {"replica": "REPLICA" if new else "SLAVE", "change": "CHANGE REPLICATION SOURCE TO" if source
            else "CHANGE MASTER TO", "option": "SOURCE" if source else "MASTER"}


async def replica_status(server: FakeMySQLReplica) -> list[dict]:
    """SHOW REPLICA STATUS (SHOW SLAVE STATUS before 8.0.22, its columns renamed to the new names)."""
    w = words(server.version)
    rows = await candidate_sql(server, f"SHOW {w['replica']} STATUS")
    if w["replica"] == "SLAVE":
        new = {old_name(c): c for c in REPLICA_COLUMNS}
        rows = [{new[k]: v for k, v in row.items()} for row in rows]
    return rows


async def one_line(port: int) -> str:
    (row,) = await relay_sql(port, "SELECT @@GLOBAL.gtid_executed AS g")
    return str(row["g"]).replace("\n", "")


async def promote(tmp: Path, cand: FakeMySQLReplica, relays: list[int], *extra: str) -> tuple[int, dict, str]:
    """`relayproxy promote --json` as a subprocess; (exit code, JSON document, stderr)."""
    return await asyncio.to_thread(run_promote, tmp, cand.port, relays, "--timeout", "60", *extra, relay_user="ops",
                                   relay_password="opspw", candidate_password="rootpw", timeout=120)


@contextlib.asynccontextmanager
async def lagging_candidate(tmp: Path, *, version: str = "8.0.36", errant: int = 0):
    """M1 (A:1-4), the relay and the candidate follow it (the candidate, and another replica R2, through a fault
    proxy, by auto-position); their links stall, M1 writes A:5-7 (only the relay gets them) and dies. With
    ``errant``, someone writes C:1..n on the candidate while its link is stalled. Yields (m1, relay info,
    candidate, R2)."""
    m1 = await FakeMySQLMaster([("mysql-bin.000001", M1_IMAGE[:A4_END])], server_id=1, server_uuid=A).start()
    proxy = await FaultProxy("127.0.0.1", m1.port).start()
    cand = await FakeMySQLReplica(server_id=2, server_uuid=B, accounts=CANDIDATE_ACCOUNTS, version=version).start()
    r2 = await FakeMySQLReplica(server_id=3, server_uuid=E, accounts=CANDIDATE_ACCOUNTS, version=version).start()
    try:
        async with running_relay(m1, tmp / "relay", **RELAY) as info:
            horizon = info["session"].store.horizon
            await wait_for(lambda: horizon.snapshot().coordinates == ("mysql-bin.000001", A4_END), what="relay A:1-4")
            w = words(version)
            change = (f"{w['change']} {w['option']}_HOST='127.0.0.1', {w['option']}_PORT={{}}, "
                      f"{w['option']}_USER='repl', {w['option']}_PASSWORD='replpw', {w['option']}_AUTO_POSITION=1")
            for server in (cand, r2):
                await candidate_sql(server, change.format(proxy.port))
                await candidate_sql(server, "START SLAVE")
                await wait_for(lambda s=server: s.gtid_executed == f"{A}:1-4", what="the replicas on A:1-4")
                assert server.source.io == "Yes" and m1.dumps[-1].command == "COM_BINLOG_DUMP_GTID"

            proxy.pause(SERVER_TO_CLIENT)  # the candidate's link stalls
            if errant:
                cand.commit(errant, "INSERT INTO local_only VALUES ({gno})", sid=C, read_only_off=True)
            want = f"{A}:1-4" + (f",{C}:1-{errant}" if errant else "")
            m1.append(M1_IMAGE[A4_END:])
            await wait_for(lambda: horizon.snapshot().coordinates == ("mysql-bin.000001", len(M1_IMAGE)),
                           what="relay A:1-7")
            await m1.stop()  # M1 dies
            await proxy.stop()
            for server in (cand, r2):
                await wait_for(lambda s=server: s.source.io == "Connecting" and s.source.io_errno, timeout=20,
                               what="the replicas' links broken")
            assert cand.gtid_executed == want and r2.gtid_executed == f"{A}:1-4"  # A:5-7 never reached them
            yield m1, info, cand, r2
    finally:
        await r2.stop()
        await cand.stop()
        await proxy.stop()
        await m1.stop()


def step_names(doc: dict) -> list[str]:
    return [s["step"] for s in doc["steps"]]


async def assert_nothing_changed(cand: FakeMySQLReplica, admin_before: int, relay_port: int, m1_port: int,
                                 proxy_port: int | None = None) -> None:
    assert cand.admin_log[admin_before:] == []  # not one STOP/START/CHANGE/RESET/SET GLOBAL
    (status,) = await replica_status(cand)
    assert status["Source_Port"] == (proxy_port or status["Source_Port"]) and status["Replica_SQL_Running"] == "Yes"
    (ro,) = await candidate_sql(cand, "SELECT @@GLOBAL.read_only")
    assert list(ro.values()) == [1] and cand.super_read_only
    (relay,) = await relay_sql(relay_port, "SHOW REPLICA STATUS")
    assert relay["Source_Port"] == m1_port and relay["Replica_IO_Running"] != "No"  # not fenced


def admin_shape(statements: list[str]) -> list[str]:
    """The admin statements with the CHANGE's options reduced to their names."""
    out = []
    for s in statements:
        if s.upper().startswith("CHANGE"):
            head, _, options = s.partition(" TO ")
            out.append(head + " TO " + ", ".join(sorted(o.split("=")[0].strip() for o in options.split(","))))
        else:
            out.append(s)
    return out


# -- the promotion -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["8.0.36", "8.0.22", "8.0.21", "5.7.44"])
def test_promote_catches_the_lagging_mysql_candidate_up_from_the_relay(tmp_path, version):
    """8.0.36 takes CHANGE REPLICATION SOURCE TO; 8.0.22 has SHOW/STOP/START/RESET REPLICA but only CHANGE MASTER
    TO (CHANGE REPLICATION SOURCE arrived in 8.0.23); 8.0.21 and 5.7 have only the SLAVE words and SHOW SLAVE
    STATUS's Master_* columns. The scripted server answers a word its version lacks with 1064, on which promote would
    exit 3."""

    async def scenario():
        async with lagging_candidate(tmp_path, version=version) as (m1, info, cand, r2):
            port = info["listen"][1]
            proxy_port = cand.source.port
            admin_before = len(cand.admin_log)

            code, dry, _ = await promote(tmp_path, cand, [port], "--dry-run")
            await assert_nothing_changed(cand, admin_before, port, m1.port, proxy_port)

            r2_before = len(r2.admin_log)
            code_run, doc, stderr = await promote(tmp_path, cand, [port], "--replica", f"127.0.0.1:{r2.port}")
            admin = cand.admin_log[admin_before:]
            r2_admin = r2.admin_log[r2_before:]
            (relay_status,) = await relay_sql(port, "SHOW REPLICA STATUS")
            relay_gtids = await one_line(port)
            cand_status = await replica_status(cand)
            variables = await candidate_sql(cand, "SHOW GLOBAL VARIABLES LIKE 'super_read_only'")
            (read_only,) = await candidate_sql(cand, "SELECT @@GLOBAL.read_only")
            dumps_to_candidate = list(cand.dumps)

            # the new master takes writes; the relay streams them from it
            new = cand.commit(2)
            await wait_for(lambda: info["session"].status.io_running, what="relay streaming")
            for _ in range(500):
                if await one_line(port) == f"{A}:1-7,\n{B}:1-2".replace("\n", ""):
                    break
                await asyncio.sleep(0.02)
            relay_after_writes = await one_line(port)
            await wait_for(lambda: r2.gtid_executed == f"{A}:1-7,{B}:1-2", what="R2 on the new master")
            (r2_status,) = await replica_status(r2)

            admin_before_again = len(cand.admin_log)
            code_again, again, _ = await promote(tmp_path, cand, [port])
            assert cand.admin_log[admin_before_again:] == []  # a repeated run changes nothing on the new master
            return (code, dry, code_run, doc, stderr, admin, relay_status, relay_gtids, cand_status, variables,
                    read_only, dumps_to_candidate, new, relay_after_writes, code_again, again, cand, port, r2,
                    r2_admin, r2_status)

    (code, dry, code_run, doc, stderr, admin, relay_status, relay_gtids, cand_status, variables, read_only,
     dumps_to_candidate, new, relay_after_writes, code_again, again, cand, port, r2, r2_admin,
     r2_status) = asyncio.run(scenario())

    # --dry-run: what it would do, and nothing done (asserted inside the scenario)
    assert code == 0 and dry["outcome"] == "dry run", dry
    assert dry["flavour"] == "mysql" and dry["source_relay"] == f"127.0.0.1:{port}"
    assert (dry["fetched"], dry["fetched_count"]) == (f"{A}:5-7", 3)
    assert "nothing was changed" in dry["message"]

    # the promotion
    assert code_run == 0 and doc["outcome"] == "promoted" and doc["exit_code"] == 0, doc
    assert doc["candidate"]["before"] == f"{A}:1-4" and doc["candidate"]["after"] == f"{A}:1-7"
    assert doc["candidate"]["version"] == version and doc["candidate"]["server_id"] == 2
    assert (doc["fetched"], doc["fetched_count"], doc["errant"]) == (f"{A}:5-7", 3, "")
    assert doc["relays"] == [{"address": f"127.0.0.1:{port}", "reachable": True, "gtids": f"{A}:1-7",
                              "master": doc["relays"][0]["master"], "master_server_id": 1,
                              "follows_candidate": False,
                              "semi_sync": {"acks": 0, "unrequested_transactions": 0, "last_unrequested_gtid": ""},
                              "result": "follows the candidate",
                              "gtids_after": f"{A}:1-7"}], doc["relays"]
    assert step_names(doc) == ["read the topology", "stopped the relays' IO", "stopped the candidate's IO thread",
                               "decided", "pointed the candidate at the relay", "caught up", "promoted the candidate",
                               "repointed the relays", "the relays stream from the candidate",
                               "repointed the replicas"]
    # ... in MySQL's words for the candidate's version, in this order
    w = words(version)
    o, r = w["option"], w["replica"]
    key = f"GET_{o}_PUBLIC_KEY, " if tuple(map(int, version.split("."))) >= (8, 0, 4) else ""
    change = f"{w['change']} {key}{o}_AUTO_POSITION, {o}_HOST, {o}_PASSWORD, {o}_PORT, {o}_USER"
    shape = admin_shape(admin)
    shape = [s.replace(f", {o}_DELAY", "") for s in shape]  # resetting a delay is allowed
    assert shape == [f"STOP {r} IO_THREAD", f"STOP {r}", change, f"START {r}", f"STOP {r}", f"RESET {r} ALL",
                     "SET GLOBAL super_read_only = 0", "SET GLOBAL read_only = 0"], admin
    assert f"_PORT={port}" in admin[2] and "_HOST='127.0.0.1'" in admin[2] and "_AUTO_POSITION=1" in admin[2]
    assert "_USER='ops'" in admin[2] and "_PASSWORD='opspw'" in admin[2]  # the relay's account (no --repl-user)
    # the candidate holds every GTID the relay had, each transaction applied once, in order; it is a master now
    assert cand.gtid_executed == f"{A}:1-7,{B}:1-2" and cand.served_gtids() == cand.gtid_executed
    assert cand.statements == ([(f"{A}:{n}", insert_statement(A, n)) for n in range(1, 8)]
                               + [(f"{B}:{n}", f"INSERT INTO t VALUES ('new', {n})") for n in (1, 2)])
    assert cand_status == [] and cand.source is None  # RESET REPLICA ALL: no replication left
    assert variables == [{"Variable_name": "super_read_only", "Value": "OFF"}] and list(read_only.values()) == [0]
    assert cand.read_only is False and cand.super_read_only is False
    # the relay follows the candidate by auto-position
    assert relay_status["Source_Port"] == cand.port and relay_status["Source_Host"] == "127.0.0.1"
    assert relay_status["Auto_Position"] == 1 and relay_status["Replica_IO_Running"] == "Yes"
    assert relay_status["Source_Server_Id"] == 2 and relay_status["Source_UUID"] == B
    assert relay_gtids == f"{A}:1-7"
    relay_dumps = [d for d in dumps_to_candidate if d.server_id == 100]  # the relay's --server-id
    assert relay_dumps and {d.command for d in relay_dumps} == {"COM_BINLOG_DUMP_GTID"}
    assert relay_dumps[-1].gtid_data == gtid_bytes({A: set(range(1, 8))})
    assert new == [f"{B}:1", f"{B}:2"] and relay_after_writes == f"{A}:1-7,{B}:1-2"
    # --replica R2: repointed to the candidate by auto-position (keeping its account), caught up from its binlog
    assert doc["replicas"] == [{"address": f"127.0.0.1:{r2.port}",
                                "result": f"repointed to 127.0.0.1:{cand.port} by GTID"}]
    assert r2_admin == [f"STOP {r}", f"{w['change']} {o}_HOST='127.0.0.1', {o}_PORT={cand.port}, "
                        f"{o}_AUTO_POSITION=1", f"START {r}"], r2_admin
    assert r2_status["Source_Port"] == cand.port and r2_status["Source_Server_Id"] == 2
    assert (r2_status["Replica_IO_Running"], r2_status["Auto_Position"], r2_status["Source_User"]) == ("Yes", 1, "repl")
    assert r2.statements == cand.statements  # each transaction once, in the same order

    # run again: done already, nothing changed
    assert code_again == 0 and again["outcome"] == "already promoted", again


def test_errant_gtids_on_the_mysql_candidate_refused_with_strict_reported_without(tmp_path):
    async def scenario():
        async with lagging_candidate(tmp_path, errant=2) as (m1, info, cand, _r2):
            port = info["listen"][1]
            admin_before = len(cand.admin_log)
            strict = await promote(tmp_path, cand, [port], "--strict")
            await assert_nothing_changed(cand, admin_before, port, m1.port, cand.source.port)
            done = await promote(tmp_path, cand, [port])
            for _ in range(500):
                if await one_line(port) == f"{A}:1-7,{C}:1-2":
                    break
                await asyncio.sleep(0.02)
            return strict, done, await one_line(port), cand

    (code, refused, _), (code_done, doc, _), relay_gtids, cand = asyncio.run(scenario())
    assert code == 3 and refused["outcome"] == "refused", refused
    assert refused["message"] == (f"--strict: the candidate 127.0.0.1:{cand.port} has GTIDs that no relay has "
                                  f"(errant transactions): {C}:1-2")
    assert code_done == 0 and doc["outcome"] == "promoted", doc
    assert doc["errant"] == f"{C}:1-2" and doc["fetched"] == f"{A}:5-7"
    assert any(f"the failed master did not write: {C}:1-2 (errant" in w for w in doc["warnings"]), doc["warnings"]
    assert doc["candidate"]["before"] == f"{A}:1-4,{C}:1-2" and doc["candidate"]["after"] == f"{A}:1-7,{C}:1-2"
    assert cand.gtid_executed == f"{A}:1-7,{C}:1-2" and cand.source is None and not cand.read_only
    # the relay now follows the candidate and receives its errant transactions from it
    assert relay_gtids == f"{A}:1-7,{C}:1-2"


def test_two_mysql_relays_that_diverge_are_refused_and_nothing_changes(tmp_path):
    """Relay 1 follows M1 (A:1-5); relay 2 follows a server presenting itself as the same master (server_id 1) that
    took a write of its own after A:3 (D:1): neither relay holds the other's history."""
    m1_image = binlog_image(1, {}, [(A, n, 1) for n in range(1, 6)])
    m1b_image = binlog_image(1, {}, [(A, 1, 1), (A, 2, 1), (A, 3, 1), (D, 1, 1)])

    async def scenario():
        async with (FakeMySQLMaster([("mysql-bin.000001", m1_image)], server_id=1, server_uuid=A) as m1,
                    FakeMySQLMaster([("mysql-bin.000001", m1b_image)], server_id=1, server_uuid=A) as m1b,
                    running_relay(m1, tmp_path / "relay1", **RELAY) as one,
                    running_relay(m1b, tmp_path / "relay2", **RELAY) as two):
            for info, image in ((one, m1_image), (two, m1b_image)):
                horizon = info["session"].store.horizon
                await wait_for(lambda h=horizon, i=image: h.snapshot().coordinates == ("mysql-bin.000001", len(i)),
                               what="the relays on their masters")
            cand = await FakeMySQLReplica(server_id=2, server_uuid=B, accounts=CANDIDATE_ACCOUNTS,
                                          executed=[(A, n, 1) for n in (1, 2)]).start()
            try:
                await candidate_sql(cand, f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', "
                                          f"SOURCE_PORT={m1.port}, SOURCE_USER='repl', SOURCE_PASSWORD='replpw', "
                                          "SOURCE_AUTO_POSITION=1")
                admin_before = len(cand.admin_log)
                ports = [one["listen"][1], two["listen"][1]]
                result = await promote(tmp_path, cand, ports)
                after = [(await relay_sql(p, "SHOW REPLICA STATUS"))[0] for p in ports]
                gtids = [await one_line(p) for p in ports]
                return result, ports, cand, admin_before, after, gtids, (m1.port, m1b.port)
            finally:
                await cand.stop()

    (code, doc, _), ports, cand, admin_before, after, gtids, masters = asyncio.run(scenario())
    assert code == 3 and doc["outcome"] == "refused", doc
    p1, p2 = (f"127.0.0.1:{p}" for p in ports)
    assert doc["message"] == (f"the relays diverge: {p2} has {D}:1 that {p1} lacks, and {p1} has {A}:4-5 that {p2} "
                              "lacks; no relay holds every transaction of the others"), doc["message"]
    assert gtids == [f"{A}:1-5", f"{A}:1-3,{D}:1"]
    assert cand.admin_log[admin_before:] == [] and cand.read_only and cand.source.port == masters[0]
    for status, master in zip(after, masters):
        assert status["Source_Port"] == master and status["Replica_IO_Running"] == "Yes"  # neither was fenced


def test_a_detached_read_only_mysql_candidate_is_caught_up_with_candidate_detached(tmp_path):
    """An HA tool (MHA does) detached the candidate before calling the hook: STOP REPLICA, RESET REPLICA ALL, still
    read-only. Without --candidate-detached: refused (3), nothing changed; with it: caught up and promoted."""

    async def scenario():
        async with lagging_candidate(tmp_path) as (m1, info, cand, _r2):
            port = info["listen"][1]
            await candidate_sql(cand, "STOP REPLICA")
            await candidate_sql(cand, "RESET REPLICA ALL")
            admin_before = len(cand.admin_log)
            refused = await promote(tmp_path, cand, [port])
            unchanged = cand.admin_log[admin_before:] == [] and cand.read_only and cand.source is None
            done = await promote(tmp_path, cand, [port], "--candidate-detached")
            (relay_status,) = await relay_sql(port, "SHOW REPLICA STATUS")
            return refused, unchanged, done, cand, relay_status, port

    (code, refused, _), unchanged, (code_done, doc, _), cand, relay_status, port = asyncio.run(scenario())
    assert code == 3 and "--candidate-detached" in refused["message"] and f"lacks {A}:5-7" in refused["message"]
    assert unchanged
    assert code_done == 0 and doc["outcome"] == "promoted", doc
    assert doc["candidate"]["is_replica"] is False and doc["fetched"] == f"{A}:5-7"
    assert "stopped the candidate's IO thread" not in step_names(doc)  # no link of its own to fence
    assert cand.gtid_executed == f"{A}:1-7" and cand.source is None and not cand.read_only
    assert relay_status["Source_Port"] == cand.port and relay_status["Replica_IO_Running"] == "Yes"


def test_a_candidate_the_relay_refuses_to_log_in_ends_the_run_and_a_rerun_converges(tmp_path):
    """A wrong --repl-password-file: the candidate's IO thread retries the login for ever ("Connecting", 1045), as
    MySQL's does; promote ends with 4 naming the refusal instead of waiting out --timeout, leaves the candidate
    pointing at the relay, and the same command with the right account converges."""

    async def scenario():
        async with lagging_candidate(tmp_path) as (m1, info, cand, _r2):
            port = info["listen"][1]
            (tmp_path / "bad.pw").write_text("wrong\n")
            (tmp_path / "good.pw").write_text("opspw\n")
            started = asyncio.get_running_loop().time()
            refused = await promote(tmp_path, cand, [port], "--repl-user", "ops", "--repl-password-file",
                                    str(tmp_path / "bad.pw"))
            seconds = asyncio.get_running_loop().time() - started
            left = (cand.source.port, cand.source.io, cand.source.io_errno, cand.read_only)
            done = await promote(tmp_path, cand, [port], "--repl-user", "ops", "--repl-password-file",
                                 str(tmp_path / "good.pw"))
            return refused, seconds, left, done, cand, port

    (code, refused, _), seconds, left, (code_done, doc, _), cand, port = asyncio.run(scenario())
    assert code == 4 and refused["outcome"] == "unreachable", refused
    assert refused["message"].startswith(f"candidate 127.0.0.1:{cand.port} cannot log into relay 127.0.0.1:{port} as "
                                         "'ops': 1045 Error connecting to source 'ops@127.0.0.1:"), refused["message"]
    assert "Access denied for user 'ops'" in refused["message"] and "run the same command again" in refused["message"]
    assert seconds < 30  # not the --timeout of 60 s
    assert left == (port, "Connecting", 1045, True)
    assert code_done == 0 and doc["outcome"] == "promoted" and doc["fetched"] == f"{A}:5-7", doc
    assert cand.gtid_executed == f"{A}:1-7" and cand.source is None
