"""Failover, the MySQL side: the relay (``--gtid-mode mysql``) repointed by SQL to a promoted MySQL 8.0 master.

Two scripted masters (tests/support/fakemaster.py): M1 (server_id 1, uuid A) and M2 (server_id 2, uuid B), both with
basename ``mysql-bin``; M2's files are numbered below the relay's. M2 is a promoted replica with
log_replica_updates: it holds M1's transactions under the same GTIDs (their events keep server_id 1) in its own
file layout and offsets, then its own (uuid B). The relay runs in-process (``serve``) with ``--listen`` and an
admin account, and is repointed with the statements an HA tool sends, through pymysql.

Every expectation (GTID sets, what the relay lacks, what M2 purged, the 1236 text) is written out here from
literal GTID lists, never computed with relayproxy's ``GtidSet`` (the fake master's purged/missing computation
uses it: checking it with itself would be circular). The binlog files are built here with struct + zlib.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import pymysql

from relayproxy.binlog import constants as C
from relayproxy.lab.harness import listener_query
from relayproxy.relay.epochs import EPOCHS_NAME
from relayproxy.relay.master_info import FILE_NAME

from ..support import eventgen as E
from ..support.fakemaster import FakeMySQLMaster, split_events
from ..lab.test_fake_mysql_master import SERVER_ID, http_status, running_relay, wait_for
from ..commands.test_serve import read_stream

A = "aaaaaaaa-1111-4111-8111-000000000001"  # M1's server_uuid
B = "bbbbbbbb-2222-4222-8222-000000000002"  # M2's server_uuid
REPL_PW = "servepw"  # the relay's accounts: repl for replicas, ops (admin) for the replication statements
USERS = f"repl:{REPL_PW}:mysql_native_password,ops:opspw:mysql_native_password:admin"
RELAY = {"listen": "127.0.0.1:0", "users": USERS}


# -- binlog files, built independently of relayproxy's encoders -------------------------------------------------


def gtids(spec: str) -> list[tuple[str, int]]:
    """'A:1-3,B:2' -> [(A, 1), (A, 2), (A, 3), (B, 2)] (letters stand for the two servers' UUIDs)."""
    out = []
    for part in filter(None, spec.split(",")):
        who, _, rng = part.partition(":")
        lo, _, hi = rng.partition("-")
        out += [({"A": A, "B": B}[who], n) for n in range(int(lo), int(hi or lo) + 1)]
    return out


def text(items: list[tuple[str, int]]) -> str:
    """MySQL's text of a GTID set given as a list: UUIDs in order, runs of numbers as intervals, ',' between."""
    parts = []
    for sid in sorted({s for s, _ in items}):
        nums = sorted({n for s, n in items if s == sid})
        runs, start = [], nums[0]
        for prev, n in zip(nums, nums[1:] + [None]):
            if n != prev + 1:
                runs.append(f"{start}" if start == prev else f"{start}-{prev}")
                start = n
        parts.append(f"{sid}:{':'.join(runs)}")
    return ",".join(parts)


def gtid_set_bytes(items: list[tuple[str, int]]) -> bytes:
    """MySQL's binary GTID set (PREVIOUS_GTIDS body, COM_BINLOG_DUMP_GTID data): n_sids, then per SID in byte order
    the SID, n_intervals and [start, end) pairs."""
    out = struct.pack("<Q", len({s for s, _ in items}))
    for sid in sorted({s for s, _ in items}, key=lambda s: uuid.UUID(s).bytes):
        nums = sorted({n for s, n in items if s == sid})
        runs = []
        for n in nums:
            if runs and runs[-1][1] == n:
                runs[-1][1] = n + 1
            else:
                runs.append([n, n + 1])
        out += uuid.UUID(sid).bytes + struct.pack("<Q", len(runs)) + b"".join(struct.pack("<qq", *r) for r in runs)
    return out


def _sealed(ev: bytes | bytearray, *, log_pos: int | None = None, server_id: int | None = None) -> bytes:
    ev = bytearray(ev)
    if log_pos is not None:
        struct.pack_into("<I", ev, 13, log_pos)
    if server_id is not None:
        struct.pack_into("<I", ev, 5, server_id)
    struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
    return bytes(ev)


@dataclass
class Binlog:
    name: str
    image: bytes
    spans: dict[tuple[str, int], tuple[int, int]]  # GTID -> (start, end) of its transaction in the file


def binlog(name: str, server_id: int, previous: str, transactions: str, rotate_to: str | None = None) -> Binlog:
    """A MySQL 8.0 binlog file of ``server_id``: FDE, PREVIOUS_GTIDS, transactions (GTID, BEGIN, INSERT, XID;
    a transaction keeps the server_id of the server that committed it: 1 for A, 2 for B), optional ROTATE."""
    out = bytearray(C.BINLOG_MAGIC)
    spans = {}

    def put(ev: bytes, sid: int) -> None:
        out.extend(_sealed(ev, log_pos=len(out) + len(ev), server_id=sid))

    put(E.fde("8.0.36"), server_id)
    put(E.event(C.PREVIOUS_GTIDS_LOG_EVENT, gtid_set_bytes(gtids(previous))), server_id)
    for sid, gno in gtids(transactions):
        origin = 1 if sid == A else 2
        start = len(out)
        for ev in (E.gtid(gno, uuid.UUID(sid).bytes), E.query("BEGIN"),
                   E.query(f"INSERT INTO t VALUES ('{sid[:8]}', {gno})"), E.xid(gno)):
            put(ev, origin)
        spans[(sid, gno)] = (start, len(out))
    if rotate_to:
        put(E.rotate(rotate_to), server_id)
    return Binlog(name, bytes(out), spans)


# M1: the relay mirrors both files; M1 dies after A:7 (its last transaction the relay received).
M1_FILES = [binlog("mysql-bin.000005", 1, "", "A:1-4", "mysql-bin.000006"),
            binlog("mysql-bin.000006", 1, "A:1-4", "A:5-7")]
RELAY_HAS = gtids("A:1-7")

# M2, promoted: it got A:8 from M1 before M1 died, rotated at other points, then took its own writes B:1-6
# (B:4-6 while the relay follows it, with a rotation to mysql-bin.000004).
M2_FILES = [binlog("mysql-bin.000001", 2, "", "A:1-3", "mysql-bin.000002"),
            binlog("mysql-bin.000002", 2, "A:1-3", "A:4-8,B:1-2", "mysql-bin.000003"),
            binlog("mysql-bin.000003", 2, "A:1-8,B:1-2", "B:3-5", "mysql-bin.000004"),
            binlog("mysql-bin.000004", 2, "A:1-8,B:1-5", "B:6")]
M2_EXECUTED = gtids("A:1-8,B:1-6")


# -- helpers ------------------------------------------------------------------------------------------------------


def relay_files(relay_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(relay_dir.glob("mysql-bin.*"))}


def everything(relay_dir: Path) -> dict[str, bytes]:
    """The relay directory's files, but the transaction indexes: caches its background thread writes whenever it
    gets to them (relay/txindex.py), whatever the master says."""
    return {p.name: p.read_bytes() for p in sorted(relay_dir.iterdir())
            if p.is_file() and not p.name.startswith("relayproxy.txindex.")}


def _sql(port: int, statement: str, user: str, password: str):
    try:
        return listener_query(port, statement, user=user, password=password)
    except pymysql.err.MySQLError as exc:
        return exc.args  # (code, message)


async def sql(port: int, statement: str, *, user: str = "ops", password: str = "opspw"):
    """One statement on the relay's --listen port through pymysql (in a thread: the relay runs on this loop)."""
    return await asyncio.to_thread(_sql, port, statement, user, password)


async def ok(port: int, statement: str) -> list[dict]:
    rows = await sql(port, statement)
    assert isinstance(rows, list), f"{statement!r} -> {rows}"
    return rows


@contextlib.asynccontextmanager
async def follow_m1(relay_dir: Path, m1: FakeMySQLMaster):
    """The relay on M1 until it holds both of M1's files; yields the running relay's info."""
    async with running_relay(m1, relay_dir, **RELAY) as info:
        last = M1_FILES[-1]
        await wait_for(lambda: info["session"].store.horizon.snapshot().coordinates == (last.name, len(last.image)),
                       what="M1's files in the relay")
        yield info


def files_of(files: list[Binlog]) -> list[tuple[str, bytes]]:
    return [(f.name, f.image) for f in files]


async def repoint(port: int, master_port: int, *, spelling: str = "source") -> None:
    if spelling == "source":
        await ok(port, "STOP REPLICA")
        await ok(port, f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', SOURCE_PORT={master_port}, "
                       "SOURCE_USER='repl', SOURCE_PASSWORD='replpw', SOURCE_AUTO_POSITION=1")
    else:
        await ok(port, "STOP SLAVE")
        await ok(port, f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={master_port}, MASTER_USER='repl', "
                       "MASTER_PASSWORD='replpw', MASTER_AUTO_POSITION=1")


def dump_threads(info) -> int:
    return sum(1 for c in info["downstream"].ctx.connections.values() if c.dump is not None)


def gtid_texts(got) -> list[str]:
    return [e.gtid for e in got if e.gtid]


def as_texts(items: list[tuple[str, int]]) -> list[str]:
    return [f"{sid}:{gno}" for sid, gno in items]


# -- (1) auto-position to the promoted master ---------------------------------------------------------------------


def test_the_relay_continues_by_auto_position_on_the_promoted_master(tmp_path):
    relay_dir = tmp_path / "relay"
    m2_third = M2_FILES[2]
    b3_end = m2_third.spans[(B, 3)][1]  # M2 serves its 000003 up to B:3; B:4-5, ROTATE, 000004 come later

    async def scenario():
        m1 = await FakeMySQLMaster(files_of(M1_FILES), server_id=1, server_uuid=A).start()
        m2 = FakeMySQLMaster([*files_of(M2_FILES[:2]), (m2_third.name, m2_third.image[:b3_end])],
                             server_id=2, server_uuid=B)
        try:
            async with follow_m1(relay_dir, m1) as info:
                port = info["listen"][1]
                before = relay_files(relay_dir)
                # Two replicas of the relay stay connected across the switch: GTID auto-position and file/position.
                last = f"{B}:6"
                by_gtid = asyncio.ensure_future(asyncio.to_thread(
                    read_stream, port, password=REPL_PW, auto_position=f"{A}:1-2", blocking=True,
                    stop_at_gtid=last, timeout=40))
                by_position = asyncio.ensure_future(asyncio.to_thread(
                    read_stream, port, password=REPL_PW, log_file="mysql-bin.000005", log_pos=4, resume_stream=True,
                    blocking=True, stop_at_gtid=last, timeout=40, server_id=9002))  # two replicas, two server_ids
                await wait_for(lambda: dump_threads(info) == 2, what="two replicas dumping from the relay")
                await m1.stop()  # M1 dies
                await wait_for(lambda: not info["session"].status.io_running, what="the relay to lose M1")
                await m2.start()
                await repoint(port, m2.port)
                await ok(port, "START REPLICA")
                session = info["session"]
                await wait_for(lambda: session.store.horizon.snapshot().coordinates == ("mysql-bin.000008", b3_end),
                               what="M2's transactions up to B:3")
                m2.append(m2_third.image[b3_end:])  # B:4, B:5, M2's ROTATE
                m2.add_file(M2_FILES[3].name, M2_FILES[3].image)  # B:6
                await wait_for(lambda: session.store.horizon.snapshot().coordinates
                               == ("mysql-bin.000009", len(M2_FILES[3].image)), what="B:6 in the relay")
                clients = await asyncio.wait_for(asyncio.gather(by_gtid, by_position), 45)
                # Replicas that connect after the switch.
                fresh_gtid = await asyncio.to_thread(read_stream, port, password=REPL_PW, auto_position=f"{A}:1-7")
                fresh_pos = await asyncio.to_thread(read_stream, port, password=REPL_PW, log_file="mysql-bin.000005",
                                                    log_pos=4, resume_stream=True)
                status = await http_status(info["http"])
                (slave,) = await ok(port, "SHOW SLAVE STATUS")
                binary_logs = await ok(port, "SHOW BINARY LOGS")
                after = relay_files(relay_dir)
                epochs = json.loads((relay_dir / EPOCHS_NAME).read_text())
            # A restart with the old command line (--master: M1's address) follows the CHANGE MASTER choice.
            async with running_relay(m1, relay_dir, **RELAY) as info:
                await wait_for(lambda: len(m2.dumps) == 2 and info["session"].status.io_running, what="M2 again")
                restarted = await http_status(info["http"])
            unchanged = relay_files(relay_dir) == after
        finally:
            await m1.stop()
            await m2.stop()
        return before, after, clients, fresh_gtid, fresh_pos, status, slave, binary_logs, epochs, m2, restarted, unchanged

    (before, after, clients, fresh_gtid, fresh_pos, status, slave, binary_logs, epochs, m2, restarted,
     unchanged) = asyncio.run(scenario())

    # M2 was asked by GTID for exactly the relay's set, after the relay checked its gtid_executed.
    conn = next(c for c in m2.connections if c.dump is not None)
    assert "SELECT @@GLOBAL.GTID_EXECUTED" in conn.queries
    assert conn.dump.command == "COM_BINLOG_DUMP_GTID" and conn.dump.gtid_data == gtid_set_bytes(RELAY_HAS)
    assert (conn.dump.file, conn.dump.pos, conn.dump.server_id) == ("", 4, SERVER_ID)
    assert all(d.command == "COM_BINLOG_DUMP_GTID" for d in m2.dumps), "a switch is by GTID only"

    # The relay's Retrieved_Gtid_Set grew to M2's gtid_executed; the status names M2.
    assert status["retrieved_gtid_set"] == text(M2_EXECUTED) == f"{A}:1-8,{B}:1-6"
    assert status["last_io_error"] is None and status["io_running"]
    assert (status["master_server_id"], status["master_uuid"]) == (2, B)
    assert (status["master_log_file"], status["read_master_log_pos"]) == ("mysql-bin.000009", len(M2_FILES[3].image))
    assert (status["upstream_log_file"], status["upstream_log_pos"]) == ("mysql-bin.000004", len(M2_FILES[3].image))
    assert (slave["Master_Port"], slave["Master_Server_Id"], slave["Master_UUID"]) == (m2.port, 2, B)
    assert slave["Retrieved_Gtid_Set"].replace("\n", "") == text(M2_EXECUTED) and slave["Auto_Position"] == 1
    assert (slave["Master_Log_File"], slave["Read_Master_Log_Pos"]) == ("mysql-bin.000004", len(M2_FILES[3].image))
    assert slave["Last_IO_Errno"] == 0 and slave["Slave_IO_Running"] == "Yes"

    # One monotonic sequence of relay files; the M1-epoch files are unchanged, the last one ends with the relay's
    # ROTATE to the first M2-epoch file, written as the old master would have (its server_id, timestamp 0: same
    # history, same bytes on every relay).
    names = [f"mysql-bin.{n:06d}" for n in range(5, 10)]
    assert list(after) == names and [r["Log_name"] for r in binary_logs] == names
    assert before == {f.name: f.image for f in M1_FILES}
    assert after["mysql-bin.000005"] == before["mysql-bin.000005"]
    old = before["mysql-bin.000006"]
    assert after["mysql-bin.000006"][: len(old)] == old
    rotate = after["mysql-bin.000006"][len(old):]
    body = struct.pack("<Q", 4) + b"mysql-bin.000007"
    head = struct.pack("<IBIIIH", 0, C.ROTATE_EVENT, 1, 19 + len(body) + 4, len(old) + 19 + len(body) + 4, 0)
    assert rotate == head + body + struct.pack("<I", zlib.crc32(head + body)), rotate

    # The M2 epoch: relay 000007/8/9 hold M2's 000002/3/4 at M2's offsets; where the GTID dump skipped what the
    # relay had (A:4-7), 000007 has the relay's filler events instead.
    joined, m2_second = after["mysql-bin.000007"], M2_FILES[1]
    gap = (m2_second.spans[(A, 4)][0], m2_second.spans[(A, 7)][1])
    assert len(joined) == len(m2_second.image)
    assert joined[: gap[0]] == m2_second.image[: gap[0]] and joined[gap[1]:] == m2_second.image[gap[1]:]
    fillers = [(off, ev) for off, ev in split_events(joined) if gap[0] <= off < gap[1]]
    assert fillers and fillers[0][0] == gap[0] and fillers[-1][0] + len(fillers[-1][1]) == gap[1]
    assert all(ev[4] == C.IGNORABLE_LOG_EVENT and struct.unpack_from("<H", ev, 17)[0] & C.LOG_EVENT_IGNORABLE_F
               for _, ev in fillers)
    assert after["mysql-bin.000008"] == M2_FILES[2].image and after["mysql-bin.000009"] == M2_FILES[3].image
    second = epochs["epochs"][1]
    assert (second["first_file"], second["upstream_first_file"]) == ("mysql-bin.000007", "mysql-bin.000002")
    assert (second["master"]["server_id"], second["master"]["server_uuid"], second["master"]["port"]) == (2, B, m2.port)
    assert second["join_gtids"] == text(RELAY_HAS)

    # Replicas of the relay: every GTID exactly once, in order, across the switch.
    (got_gtid, error_gtid), (got_pos, error_pos) = clients
    assert error_gtid is None and error_pos is None, (error_gtid, error_pos)
    assert gtid_texts(got_gtid) == as_texts(gtids("A:3-8,B:1-6"))
    assert gtid_texts(got_pos) == as_texts(gtids("A:1-8,B:1-6"))
    assert fresh_gtid[1] is None and gtid_texts(fresh_gtid[0]) == as_texts(gtids("A:8,B:1-6"))
    assert fresh_pos[1] is None and gtid_texts(fresh_pos[0]) == as_texts(gtids("A:1-8,B:1-6"))
    assert not [e for e in got_pos + fresh_pos[0] if e.type_code == C.IGNORABLE_LOG_EVENT]

    # After a restart of the relay with --master still M1's address: on M2, by GTID, from M2's gtid_executed.
    assert restarted["master_port"] == m2.port and "overrides --master" in restarted["master_source"]
    assert restarted["last_io_error"] is None and restarted["retrieved_gtid_set"] == text(M2_EXECUTED)
    assert m2.dumps[1].command == "COM_BINLOG_DUMP_GTID" and m2.dumps[1].gtid_data == gtid_set_bytes(M2_EXECUTED)
    assert unchanged


# -- (2) and (3): a new master the relay must refuse -----------------------------------------------------------------


async def refused_switch(relay_dir: Path, m2_files: list[Binlog], *, purge_to: str | None = None):
    """Follow M1, lose it, repoint to M2 (CHANGE MASTER spelling), wait for the relay's Last_IO_Error. Returns what
    was on disk just before START SLAVE and after the refusal, the status, SHOW SLAVE STATUS, what a replica of the
    relay still gets, and M2's connection log."""
    m1 = await FakeMySQLMaster(files_of(M1_FILES), server_id=1, server_uuid=A).start()
    m2 = FakeMySQLMaster(files_of(m2_files), server_id=2, server_uuid=B)
    if purge_to:
        m2.purge_to(purge_to)
    try:
        async with follow_m1(relay_dir, m1) as info:
            port = info["listen"][1]
            await m1.stop()
            await m2.start()
            await repoint(port, m2.port, spelling="master")
            before = everything(relay_dir)
            await ok(port, "START SLAVE")
            session = info["session"]
            await wait_for(lambda: session.status.errors.get("master", 0) >= 2, what="two attempts, both refused")
            # Each retry clears Last_IO_Error once its dump request is accepted (as a server's IO thread does),
            # and a refusal sets it again: read both views while the error stands.
            for _ in range(400):
                status = await http_status(info["http"])
                (slave,) = await ok(port, "SHOW SLAVE STATUS")
                if status["last_io_error"] and slave["Last_IO_Error"] == status["last_io_error"]:
                    break
                await asyncio.sleep(0.01)
            served = await asyncio.to_thread(read_stream, port, password=REPL_PW, auto_position=f"{A}:1-2")
            await ok(port, "STOP SLAVE")
            after = everything(relay_dir)
    finally:
        await m1.stop()
        await m2.stop()
    return before, after, status, slave, served, m2


def assert_nothing_written(before: dict, after: dict, status: dict, served) -> None:
    assert after == before, sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
    assert list(relay_files_of(after)) == [f.name for f in M1_FILES]
    assert len(json.loads(after[EPOCHS_NAME])["epochs"]) == 1  # no epoch begun: only M1's
    assert json.loads(after[FILE_NAME])["identity"]["server_id"] == 1  # still M1's files
    assert status["retrieved_gtid_set"] == text(RELAY_HAS) and not status["io_running"]
    assert served[1] is None and gtid_texts(served[0]) == as_texts(gtids("A:3-7"))  # replicas are still served


def relay_files_of(files: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if k.startswith("mysql-bin.")}


def test_a_new_master_lacking_gtids_the_relay_holds_is_refused_naming_them(tmp_path):
    # The candidate was behind: it has A:1-5 (then its own B:1-3), the relay A:1-7.
    behind = [binlog("mysql-bin.000001", 2, "", "A:1-5,B:1-3")]
    lacking = [g for g in RELAY_HAS if g not in gtids("A:1-5,B:1-3")]  # computed here: A:6, A:7
    before, after, status, slave, served, m2 = asyncio.run(refused_switch(tmp_path / "relay", behind))
    error = status["last_io_error"]
    assert error == (
        f"the new master 127.0.0.1:{m2.port} (server_id 2 ({B})) lacks GTIDs the relay holds: {text(lacking)} "
        "(those transactions are lost on it: it was behind the old master). Nothing was written; replicas are "
        "served what is durable. Choose another master, or accept the loss by re-seeding the relay"), error
    assert text(lacking) == f"{A}:6-7"
    assert slave["Last_IO_Error"] == error and slave["Slave_IO_Running"] == "Connecting"  # retries, refused each time
    assert slave["Last_IO_Errno"] == 1593  # ER_SLAVE_FATAL_ERROR: the relay refused it, the master said nothing
    assert status["errors_by_kind"]["master"] >= 2
    # The attempts asked M2's gtid_executed, and for no dump.
    assert m2.dumps == [] and sum("SELECT @@GLOBAL.GTID_EXECUTED" in c.queries for c in m2.connections) >= 2
    assert_nothing_written(before, after, status, served)


def test_a_new_master_that_purged_gtids_the_relay_lacks_gives_1236_not_a_silent_gap(tmp_path):
    # M2 got A:8 (the relay never did) and then purged the file holding A:6-8: its gtid_purged is A:1-8. It has
    # every GTID the relay holds, so the relay's own check passes; M2's dump answers 1236.
    purging = [binlog("mysql-bin.000001", 2, "", "A:1-5", "mysql-bin.000002"),
               binlog("mysql-bin.000002", 2, "A:1-5", "A:6-8", "mysql-bin.000003"),
               binlog("mysql-bin.000003", 2, "A:1-8", "B:1-3")]
    purged = gtids("A:1-8")  # the PREVIOUS_GTIDS of M2's oldest remaining file
    missing = [g for g in purged if g not in RELAY_HAS]  # computed here: A:8
    before, after, status, slave, served, m2 = asyncio.run(
        refused_switch(tmp_path / "relay", purging, purge_to="mysql-bin.000003"))
    message = (
        "Cannot replicate because the source purged required binary logs. Replicate the missing transactions "
        "from elsewhere, or provision a new replica from backup. Consider increasing the source's binary log "
        f"expiration period. The GTID set sent by the replica is '{text(RELAY_HAS)}', and the missing "
        f"transactions are '{text(missing)}'")
    assert text(missing) == f"{A}:8"
    assert status["last_io_error"] == f"error 1236 from master: {message}", status["last_io_error"]
    assert (slave["Last_IO_Errno"], slave["Last_IO_Error"]) == (1236, status["last_io_error"])
    assert slave["Slave_IO_Running"] == "Connecting"
    assert len(m2.dumps) >= 2 and all(d.command == "COM_BINLOG_DUMP_GTID" and d.gtid_data == gtid_set_bytes(RELAY_HAS)
                                      for d in m2.dumps)
    assert all(c.sent == [] for c in m2.connections)  # M2 sent no event: B:1-3 never reached the relay
    assert_nothing_written(before, after, status, served)


# -- (4) MariaDB's option on the MySQL relay ---------------------------------------------------------------------


def test_master_use_gtid_on_the_mysql_relay_is_1064_and_changes_nothing(tmp_path):
    relay_dir = tmp_path / "relay"

    async def scenario():
        async with (FakeMySQLMaster(files_of(M1_FILES), server_id=1, server_uuid=A) as m1,
                    follow_m1(relay_dir, m1) as info):
            port = info["listen"][1]
            await ok(port, "STOP SLAVE")
            before = everything(relay_dir)
            answers = [await sql(port, f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=1, "
                                       f"MASTER_USE_GTID={mode}") for mode in ("slave_pos", "current_pos", "no")]
            after = everything(relay_dir)
            master = info["session"].master.address
            await ok(port, "START SLAVE")
            await wait_for(lambda: info["session"].status.io_running, what="back on M1")
        return before, after, answers, master, m1

    before, after, answers, master, m1 = asyncio.run(scenario())
    for code, message in answers:
        assert code == 1064 and "MASTER_USE_GTID" in message, (code, message)
    assert after == before and master == f"127.0.0.1:{m1.port}"


# -- (5) the VIP case: another server at the recorded address ----------------------------------------------------


def test_a_restart_on_the_old_address_where_the_promoted_master_now_answers_is_refused(tmp_path):
    """Without CHANGE MASTER: refused with the identity error, nothing written. Then the repoint the error asks for,
    to the same address (the VIP), is followed: the relay switches by auto-position."""
    relay_dir = tmp_path / "relay"
    last = M2_FILES[-1]

    async def scenario():
        m1 = await FakeMySQLMaster(files_of(M1_FILES), server_id=1, server_uuid=A).start()
        vip = m1.port
        try:
            async with follow_m1(relay_dir, m1):
                pass  # the relay stops (its process ends)
            await m1.stop()
            before = everything(relay_dir)
            # The VIP moves: the promoted M2 answers at M1's address; the relay restarts with the same --master.
            async with (FakeMySQLMaster(files_of(M2_FILES), server_id=2, server_uuid=B, port=vip) as m2,
                        running_relay(m2, relay_dir, **RELAY) as info):
                assert info["cfg"].master == ("127.0.0.1", vip)
                await wait_for(lambda: info["session"].status.last_io_error and len(m2.connections) >= 2,
                               what="the refusal")
                status = await http_status(info["http"])
                (slave,) = await ok(info["listen"][1], "SHOW SLAVE STATUS")
                after = everything(relay_dir)
                refused_dumps = list(m2.dumps)
                # The operator repoints the relay to the VIP, as the error says.
                await repoint(info["listen"][1], vip, spelling="master")
                await ok(info["listen"][1], "START SLAVE")
                await wait_for(lambda: info["session"].store.horizon.snapshot().coordinates
                               == ("mysql-bin.000009", len(last.image)), what="M2's transactions via the VIP")
                switched = await http_status(info["http"])
                files = relay_files(relay_dir)
        finally:
            await m1.stop()
        return vip, before, after, status, slave, refused_dumps, switched, files, m2

    vip, before, after, status, slave, refused_dumps, switched, files, m2 = asyncio.run(scenario())
    error = status["last_io_error"]
    assert error == (
        f"the master at 127.0.0.1:{vip} is server_id 2 ({B}), but the relay's files came from server_id 1 ({A}) at "
        f"127.0.0.1:{vip}; a resume on another server by file/position would relay a different history. To switch "
        "masters, repoint the relay with STOP SLAVE; CHANGE MASTER TO ...; START SLAVE (by GTID)"), error
    assert slave["Last_IO_Error"] == error and status["errors_by_kind"]["master"] >= 1
    assert refused_dumps == []  # refused before asking for anything
    assert after == before and status["retrieved_gtid_set"] == text(RELAY_HAS)

    assert switched["last_io_error"] is None and switched["retrieved_gtid_set"] == text(M2_EXECUTED)
    assert (switched["master_server_id"], switched["master_uuid"]) == (2, B)
    assert [d.command for d in m2.dumps] == ["COM_BINLOG_DUMP_GTID"] and m2.dumps[0].gtid_data == gtid_set_bytes(RELAY_HAS)
    assert list(files) == [f"mysql-bin.{n:06d}" for n in range(5, 10)]
    assert files["mysql-bin.000005"] == before["mysql-bin.000005"]
    assert files["mysql-bin.000006"].startswith(before["mysql-bin.000006"])
    assert json.loads((relay_dir / FILE_NAME).read_text())["identity"]["server_id"] == 2
