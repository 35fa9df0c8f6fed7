"""The relay repointed to a promoted master with that master's own file and position, as MHA 0.58 does it.

After promoting a replica of a MariaDB master, MHA sends every other replica (and the relay)
``CHANGE MASTER TO MASTER_HOST=<new>, MASTER_PORT=..., MASTER_LOG_FILE='<file>', MASTER_LOG_POS=<pos>`` with the new
master's ``SHOW MASTER STATUS`` coordinates and no GTID option. The relay translates them into the new master's
GTIDs (``BINLOG_GTID_POS``), checks that the new master has every GTID the relay holds, and joins it by GTID from
its own horizon (upstream/repoint.py, docs/failover.md). Real servers (relayproxy.lab.failover): M1 killed mid
transaction, R1 promoted and written to before the relay is repointed (so the relay is behind the coordinates and
must fetch the difference), R2 (GTID) and R3 (file/position) behind the relay; bad coordinates; R4, behind the
relay, refused; the same master with coordinates other than the horizon refused. Pure translation rules first.
"""

from __future__ import annotations

import time

import pymysql
import pytest

from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtidPosition
from relayproxy.lab.failover import (
    FailoverLab,
    binlog_pos,
    gtid_seqs,
    promote,
    relay_sql,
    wait_until,
)
from relayproxy.lab.harness import master_status, replica_status
from relayproxy.upstream.repoint import (
    BadCoordinates,
    check_boundary,
    check_coordinates,
    decide_switch,
    mysql_gtids_at,
    sql_string,
)

from .test_scenario_failover import (
    assert_file_replica_at_relay_end,
    assert_one_file_sequence,
    assert_relay_follows,
    assert_same_everywhere,
    file_bytes,
    relay_slave_status,
)

TIMEOUT = 60.0
A = "aaaaaaaa-1111-4111-8111-000000000001"
B = "bbbbbbbb-2222-4222-8222-000000000002"


# -- the pure rules ---------------------------------------------------------------------------------------------------


def test_check_coordinates_names_the_missing_file_and_the_end():
    logs = [("mysql-bin.000001", 900), ("mysql-bin.000002", 1233)]
    assert check_coordinates("mysql-bin.000002", 1233, logs, "db2:3306") == 1233
    assert check_coordinates("mysql-bin.000001", 4, logs, "db2:3306") == 900
    with pytest.raises(BadCoordinates, match=r"MASTER_LOG_FILE 'mysql-bin.000009' is not one of the binary logs of "
                                             r"the new master db2:3306 \(it has mysql-bin.000001..mysql-bin.000002\)"):
        check_coordinates("mysql-bin.000009", 4, logs, "db2:3306")
    with pytest.raises(BadCoordinates, match=r"MASTER_LOG_POS 1300 is beyond the end of mysql-bin.000002 .* "
                                             r"\(1233 bytes\)"):
        check_coordinates("mysql-bin.000002", 1300, logs, "db2:3306")
    with pytest.raises(BadCoordinates, match=r"\(it has none\)"):
        check_coordinates("b.1", 4, [], "db2:3306")


@pytest.mark.parametrize("event_type", ["Gtid", "Format_desc", "Gtid_list", "Binlog_checkpoint", "Rotate", "Stop",
                                        "Previous_gtids", "Anonymous_Gtid", None])
def test_a_boundary_event_or_the_end_is_accepted(event_type):
    check_boundary("b.1", 500, 1000, event_type, None, "db2:3306")


@pytest.mark.parametrize("event_type", ["Table_map", "Write_rows_v1", "Xid", "Query", "Annotate_rows"])
def test_a_position_inside_a_transaction_is_refused(event_type):
    with pytest.raises(BadCoordinates, match=f"b.1:500 is inside a transaction .*the event there is a {event_type}"):
        check_boundary("b.1", 500, 1000, event_type, None, "db2:3306")


def test_a_position_inside_an_event_is_refused_with_the_servers_words():
    with pytest.raises(BadCoordinates, match=r"MASTER_LOG_POS 501 is not the start of an event in b.1 .*"
                                             r"\(error 1220: Wrong offset\)"):
        check_boundary("b.1", 501, 1000, None, "error 1220: Wrong offset", "db2:3306")
    check_boundary("b.1", 4, 1000, None, "never asked", "db2:3306")  # the file's start and end need no event
    check_boundary("b.1", 1000, 1000, None, "never asked", "db2:3306")


def test_mysql_gtids_at_a_position_are_the_previous_gtids_and_the_transactions_before_it():
    rows = [
        ("b.3", 4, "Format_desc", 2, 126, "Server ver: 8.0.36, Binlog ver: 4"),
        ("b.3", 126, "Previous_gtids", 2, 197, f"{A}:1-40,\n{B}:1-3"),
        ("b.3", 197, "Gtid", 1, 276, f"SET @@SESSION.GTID_NEXT= '{A}:41'"),
        ("b.3", 276, "Query", 1, 351, "BEGIN"),
        ("b.3", 351, "Xid", 1, 382, "COMMIT /* xid=9 */"),
        ("b.3", 382, "Gtid", 2, 461, f"SET @@SESSION.GTID_NEXT= '{B}:4'"),
        ("b.3", 461, "Query", 2, 560, "CREATE TABLE t (a INT)"),
        ("b.3", 560, "Gtid", 2, 639, f"SET @@SESSION.GTID_NEXT= '{B}:5'"),
    ]
    assert mysql_gtids_at(rows, 4) == GtidSet()
    assert mysql_gtids_at(rows, 197) == GtidSet(f"{A}:1-40,{B}:1-3")
    assert mysql_gtids_at(rows, 382) == GtidSet(f"{A}:1-41,{B}:1-3")
    assert mysql_gtids_at(rows, 560) == GtidSet(f"{A}:1-41,{B}:1-4")
    assert mysql_gtids_at(rows, 639) == GtidSet(f"{A}:1-41,{B}:1-5")
    assert mysql_gtids_at(rows[3:], 639) == GtidSet(f"{B}:4-5")  # a later page: only its own GTIDs
    with pytest.raises(BadCoordinates, match="cannot read the GTID"):
        mysql_gtids_at([("b.3", 197, "Gtid", 1, 276, "garbled")], 300)


def test_decision_mariadb_relay_behind_the_coordinates():
    relay = MariaBinlogState.parse("0-1-40")
    d = decide_switch(master="db2:3306", server_id=2, relay=relay, missing="", coordinates=("mysql-bin.000003", 900),
                      translated=MariaGtidPosition.parse("0-2-45,1-2-3"), at=1.0)
    assert d.accepted and d.behind == "0-2-41..0-2-45,1-2-1..1-2-3" and d.beyond == ""
    doc = d.describe()
    assert doc["coordinates"] == {"file": "mysql-bin.000003", "position": 900}
    assert (doc["coordinates_gtids"], doc["relay_gtids"]) == ("0-2-45,1-2-3", "0-1-40")
    assert doc["decision"] == "joined by GTID from the relay's horizon" and doc["missing_on_master"] is None
    assert doc["relay_behind_coordinates"] == "0-2-41..0-2-45,1-2-1..1-2-3"


def test_decision_mariadb_relay_beyond_the_coordinates_and_refused():
    d = decide_switch(master="db2:3306", server_id=2, relay=MariaBinlogState.parse("0-1-40,0-2-42"),
                      missing="0-2-41..0-2-42 (the master's domain 0 ends at 0-1-40)", coordinates=("b.1", 4),
                      translated=MariaGtidPosition.parse("0-1-40"))
    assert not d.accepted and d.beyond == "0-2-41..0-2-42" and d.behind == ""
    assert d.describe()["decision"].startswith("refused") and d.describe()["relay_beyond_coordinates"]


def test_decision_mysql_and_without_coordinates():
    d = decide_switch(master="db2:3306", server_id=2, relay=GtidSet(f"{A}:1-40"), missing="",
                      coordinates=("b.3", 639), translated=GtidSet(f"{A}:1-41,{B}:1-5"))
    assert d.behind == f"{A}:41,\n{B}:1-5" and d.beyond == ""
    plain = decide_switch(master="db2:3306", server_id=2, relay=GtidSet(f"{A}:1-40"), missing="")
    assert plain.describe()["coordinates"] is None and plain.behind is None and plain.accepted


def test_sql_string_escapes_what_a_client_gave():
    assert sql_string("mysql-bin.000001") == "'mysql-bin.000001'"
    assert sql_string("a'b\\c") == "'a\\'b\\\\c'"


def test_change_master_accepts_coordinates_for_another_address_only(tmp_path, corpus_dir):
    """No master needed: on a relay with files, coordinates other than the horizon are accepted for another address
    (translated at connect), refused (1210) for the address the files came from; coordinates a stream has followed
    (here --start-file's) are spent: a CHANGE MASTER without coordinates forgets them, while a second CHANGE MASTER
    before START SLAVE keeps the first one's (MySQL's rule)."""
    from relayproxy.relay.master_info import MasterInfo

    from ..downstream.test_downstream_sql import MYSQL_CORPUS, relay_dir_with
    from ..downstream.test_replication_admin_sql import Relay

    d = relay_dir_with(tmp_path, {"binlog.000004": corpus_dir / MYSQL_CORPUS})
    r = Relay(d, gtid_mode="off")
    try:
        session = r.session
        session.master = MasterInfo(**{**session.master.__dict__, "log_file": "binlog.000001", "log_pos": 4})
        r.ok("STOP SLAVE")
        r.ok("CHANGE MASTER TO MASTER_CONNECT_RETRY=7")
        assert (session.master.log_file, session.master.log_pos) == (None, None)  # --start-file's: spent
        err = r.error("CHANGE MASTER TO MASTER_LOG_FILE='binlog.000002', MASTER_LOG_POS=4", 1210)
        assert "joins another master (a new MASTER_HOST/MASTER_PORT)" in err.message
        r.ok("CHANGE MASTER TO MASTER_HOST='127.0.0.9', MASTER_LOG_FILE='mysql-bin.000003', MASTER_LOG_POS=2231")
        chosen = session.master
        assert (chosen.host, chosen.log_file, chosen.log_pos, chosen.gtid_mode, chosen.unfollowed) == (
            "127.0.0.9", "mysql-bin.000003", 2231, "off", True)
        r.ok("CHANGE MASTER TO MASTER_PASSWORD='other'")  # the switch is not made yet: its coordinates stay
        assert (session.master.log_file, session.master.log_pos) == ("mysql-bin.000003", 2231)
        r.ok("CHANGE MASTER TO MASTER_HOST='127.0.0.10'")  # a new address without coordinates forgets them
        assert (session.master.log_file, session.master.log_pos) == (None, None)
    finally:
        r.close()


# -- real servers -----------------------------------------------------------------------------------------------------


def change_master_coordinates(port: int, file: str, pos: int) -> str:
    """What MHA 0.58 sends a replica of the new master: its SHOW MASTER STATUS, no GTID option."""
    return (f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={port}, MASTER_USER='repl', "
            f"MASTER_PASSWORD='replpw', MASTER_LOG_FILE='{file}', MASTER_LOG_POS={pos}")


def repoint_by_coordinates(lab: FailoverLab, port: int, file: str, pos: int) -> None:
    relay_sql(lab.relay_port, "STOP SLAVE")
    relay_sql(lab.relay_port, change_master_coordinates(port, file, pos))
    relay_sql(lab.relay_port, "START SLAVE")


def wait_io_error(lab: FailoverLab, what: str, previous: str | None) -> dict:
    """SHOW SLAVE STATUS once the relay shows an IO error other than ``previous``."""
    def new_error() -> dict | None:
        row = relay_slave_status(lab)
        return row if row["Last_IO_Errno"] and row["Last_IO_Error"] and row["Last_IO_Error"] != previous else None
    return wait_until(f"the relay's Last_IO_Error for {what}", new_error, TIMEOUT, lab.describe)


def event_inside_a_transaction(server, file: str) -> tuple[int, str, int]:
    """(position, type, end) of a Table_map event in ``file``: inside a transaction, and 2+ bytes long."""
    for _f, pos, kind, _sid, end, _info in server.execute(f"SHOW BINLOG EVENTS IN '{file}'"):
        if kind == "Table_map":
            return int(pos), kind, int(end)
    raise AssertionError(f"no Table_map event in {file}")


@pytest.mark.server
def test_mha_repoint_by_file_position(tmp_path, capsys):
    """M1 dies mid-transaction; R1 promoted and written to; the relay repointed with R1's SHOW MASTER STATUS.
    Bad coordinates first (each refused naming what is wrong, nothing written), then the good ones: the relay
    fetches what R1 wrote before the coordinates and everything after; R2 and R3 equal R1, also after a relay
    restart. Then R4 (behind the relay) given by file/position is refused naming the missing GTIDs, and R1 again
    with coordinates other than the relay's horizon on it is refused (1210), with the horizon accepted."""
    started = time.monotonic()
    with FailoverLab(tmp_path / "lab", candidates=2) as lab, lab.explained():
        lab.start()
        lab.load.run(lab.m1, 200, rotate_every=80)
        crash = lab.kill_mid_transaction(2 << 20)
        promote(lab.r1)
        lab.load.run(lab.r1, 25)  # before the repoint: the relay is behind the coordinates MHA gives
        file, pos = master_status(lab.r1)
        r1_gtids = binlog_pos(lab.r1)
        before = file_bytes(lab)
        seen: list[str] = []

        # -- bad coordinates: refused at START SLAVE with 1236 naming what is wrong; nothing written ----------------
        size = pos
        inside, kind, end = event_inside_a_transaction(lab.r1, file)
        previous = None
        for label, bad_file, bad_pos, words in (
            ("a file R1 does not have", "mysql-bin.999999", 4, ["MASTER_LOG_FILE 'mysql-bin.999999' is not one"]),
            ("a position beyond the end", file, size + 1000, [f"MASTER_LOG_POS {size + 1000} is beyond the end of "
                                                              f"{file}", f"({size} bytes)"]),
            ("a position inside an event", file, inside + 1, [f"MASTER_LOG_POS {inside + 1} is not the start of an "
                                                              f"event in {file}"]),
            ("a position inside a transaction", file, inside, [f"{file}:{inside} is inside a transaction",
                                                               f"the event there is a {kind}"]),
        ):
            repoint_by_coordinates(lab, lab.r1.port, bad_file, bad_pos)
            row = wait_io_error(lab, label, previous)
            previous = row["Last_IO_Error"]
            seen.append(f"  {label:<32} {row['Last_IO_Errno']} {previous[:150]}")
            assert int(row["Last_IO_Errno"]) == 1236 and all(w in previous for w in words), (label, row)
            assert row["Slave_IO_Running"] != "Yes" and file_bytes(lab) == before, f"{label}: the relay wrote"
        assert lab.relay.status()["retrieved_gtid_set"] == crash.gtid_before

        # -- R1's SHOW MASTER STATUS, as MHA sends it --------------------------------------------------------------
        repoint_by_coordinates(lab, lab.r1.port, file, pos)
        lab.load.run(lab.r1, 120)
        lab.wait_converged(lab.r1, timeout=TIMEOUT)
        assert_relay_follows(lab, lab.r1)
        assert_same_everywhere(lab, lab.r1, [lab.r2, lab.r3])
        names = assert_one_file_sequence(lab, before, epochs=2)
        assert replica_status(lab.r3)["Master_Log_File"] == names[-1]
        assert_file_replica_at_relay_end(lab)
        status = lab.relay.status()
        switch = status["last_switch"]
        (domain, r1_seq), = gtid_seqs(r1_gtids).items()
        (_d, m1_seq), = gtid_seqs(crash.gtid_before).items()
        assert switch["coordinates"] == {"file": file, "position": pos} and switch["accepted"], switch
        assert (switch["coordinates_gtids"], switch["relay_gtids"]) == (r1_gtids, crash.gtid_before), switch
        assert switch["relay_behind_coordinates"] == f"{domain}-{lab.r1.server_id}-{m1_seq + 1}..{r1_gtids}", switch
        assert switch["missing_on_master"] is None and switch["relay_beyond_coordinates"] is None, switch
        assert status["gtid_mode"] == "off" and status["master"]["log_file"] == file, status["master"]
        assert '"switch decision"' in lab.relay.log_path.read_text(errors="replace")

        lab.relay.stop()  # the choice and the epoch survive a restart; reconnects go on by file/position
        lab.relay.start()
        lab.load.run(lab.r1, 40)
        lab.wait_converged(lab.r1, timeout=TIMEOUT)
        assert_relay_follows(lab, lab.r1)
        assert_same_everywhere(lab, lab.r1, [lab.r2, lab.r3])
        names = assert_one_file_sequence(lab, before, epochs=2)
        assert_file_replica_at_relay_end(lab)
        followed = time.monotonic()

        # -- R4 is behind the relay (it never got R1's writes): refused by file/position too -----------------------
        held = lab.relay.status()["retrieved_gtid_set"]
        promote(lab.r4)
        r4_file, r4_pos = master_status(lab.r4)
        (_d, r4_seq), = gtid_seqs(binlog_pos(lab.r4)).items()
        newest = f"{domain}-{lab.r1.server_id}-{gtid_seqs(held)[domain]}"  # held is a state: 0-1-N,0-2-M
        missing = f"{domain}-{lab.r1.server_id}-{r4_seq + 1}..{newest}"
        after_switch = file_bytes(lab)
        repoint_by_coordinates(lab, lab.r4.port, r4_file, r4_pos)
        row = wait_io_error(lab, "R4, behind the relay", None)
        assert int(row["Last_IO_Errno"]) == 1593 and missing in row["Last_IO_Error"], (missing, row)
        assert file_bytes(lab) == after_switch, "the relay wrote something for a master it refused"
        refusal = lab.relay.status()
        assert refusal["retrieved_gtid_set"] == held and refusal["last_switch"]["accepted"] is False
        assert refusal["last_switch"]["coordinates"] == {"file": r4_file, "position": r4_pos}
        assert missing in refusal["last_switch"]["missing_on_master"], refusal["last_switch"]
        seen.append(f"  {'R4 behind the relay':<32} {row['Last_IO_Errno']} {row['Last_IO_Error'][:150]}")

        # -- R1 again (the master the relay's files came from): only its horizon is accepted -----------------------
        relay_sql(lab.relay_port, "STOP SLAVE")
        up_file, up_pos = refusal["upstream_log_file"], refusal["upstream_log_pos"]
        with pytest.raises(pymysql.MySQLError) as info:
            relay_sql(lab.relay_port, change_master_coordinates(lab.r1.port, file, pos))
        assert info.value.args[0] == 1210 and f"continues from its horizon {up_file}:{up_pos}" in info.value.args[1]
        seen.append(f"  {'R1 again, old coordinates':<32} {info.value.args[0]} {info.value.args[1][:150]}")
        relay_sql(lab.relay_port, change_master_coordinates(lab.r1.port, up_file, up_pos))
        relay_sql(lab.relay_port, "START SLAVE")
        lab.load.run(lab.r1, 30)
        lab.wait_converged(lab.r1, timeout=TIMEOUT)
        assert_relay_follows(lab, lab.r1)
        assert_same_everywhere(lab, lab.r1, [lab.r2, lab.r3])
        assert_one_file_sequence(lab, before, epochs=2)
        with capsys.disabled():
            print(f"\nrepoint by file/position: R1's {file}:{pos} = {r1_gtids}, relay at {crash.gtid_before}; "
                  f"followed in {followed - started:.1f}s, all checks {time.monotonic() - started:.1f}s\n"
                  + "\n".join(seen))


@pytest.mark.server
@pytest.mark.parametrize("point", ["CHANGE MASTER", "START SLAVE"])
def test_kill_during_repoint_by_file_position(tmp_path, capsys, point):
    """kill -9 right after CHANGE MASTER (by R1's file/position) or START SLAVE answered, restarted with the
    original command line (--master names dead M1): the choice was durable, the restart translates the
    coordinates again and switches; what R1 wrote before the coordinates is not skipped."""
    from .test_scenario_failover_crash import assert_switched, crashed_lab, kill9_restart, master_json

    started = time.monotonic()
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained():
        lab.load.run(lab.r1, 15)  # the relay is behind the coordinates
        file, pos = master_status(lab.r1)
        relay_sql(lab.relay_port, "STOP SLAVE")
        relay_sql(lab.relay_port, change_master_coordinates(lab.r1.port, file, pos))
        if point == "START SLAVE":
            relay_sql(lab.relay_port, "START SLAVE")
        choice = master_json(lab)["choice"]
        assert (choice["port"], choice["log_file"], choice["log_pos"], choice["gtid_mode"]) == (
            lab.r1.port, file, pos, "off"), choice
        killed = kill9_restart(lab)
        status = lab.relay.wait_for(lambda s: s["io_running"] and s["master_server_id"] == lab.r1.server_id, TIMEOUT,
                                    "the restarted relay to stream from R1")
        assert status["last_switch"]["coordinates"] == {"file": file, "position": pos}, status["last_switch"]
        names = assert_switched(lab, crash, before, lab.r1.port)
        with capsys.disabled():
            print(f"\nkill -9 after {point} (by {file}:{pos}): {killed['epochs']} epoch(s) at the kill; following R1,"
                  f" files {names[0]}..{names[-1]}; {time.monotonic() - started:.1f}s")


# -- MySQL: the scripted MySQL 8.0 masters of tests/scenarios/test_failover_mysql.py ------------------------------------------


def test_mysql_repoint_by_file_position_on_the_promoted_master(tmp_path):
    """The relay (A:1-7 from M1) repointed to M2 with M2's SHOW MASTER STATUS, MASTER_AUTO_POSITION=0: the GTIDs at
    that position (M2's Previous_gtids + its transactions before it: A:1-8,B:1-3) are read with SHOW BINLOG EVENTS;
    the relay joins by COM_BINLOG_DUMP_GTID from its own A:1-7 and fetches A:8, B:1-6. A position inside a
    transaction is refused first, naming it; nothing is asked of the dump then."""
    import asyncio

    from ..support.fakemaster import FakeMySQLMaster
    from ..lab.test_fake_mysql_master import http_status, wait_for
    from .test_failover_mysql import (
        A as MA,
        B as MB,
        M1_FILES,
        M2_FILES,
        RELAY_HAS,
        files_of,
        follow_m1,
        gtid_set_bytes,
        ok,
        relay_files,
        sql,
        text,
    )

    relay_dir = tmp_path / "relay"
    third = M2_FILES[2]
    b3_end = third.spans[(MB, 3)][1]  # M2's SHOW MASTER STATUS: its 000003 up to B:3

    async def scenario():
        m1 = await FakeMySQLMaster(files_of(M1_FILES), server_id=1, server_uuid=MA).start()
        m2 = FakeMySQLMaster([*files_of(M2_FILES[:2]), (third.name, third.image[:b3_end])], server_id=2,
                             server_uuid=MB)
        try:
            async with follow_m1(relay_dir, m1) as info:
                port, session = info["listen"][1], info["session"]
                await m1.stop()
                await wait_for(lambda: not session.status.io_running, what="the relay to lose M1")
                await m2.start()
                before = relay_files(relay_dir)

                async def repoint(file: str, pos: int) -> None:
                    await ok(port, "STOP REPLICA")
                    await ok(port, f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', SOURCE_PORT={m2.port}, "
                                   f"SOURCE_USER='repl', SOURCE_PASSWORD='replpw', SOURCE_AUTO_POSITION=0, "
                                   f"SOURCE_LOG_FILE='{file}', SOURCE_LOG_POS={pos}")
                    await ok(port, "START REPLICA")

                await ok(port, "STOP REPLICA")
                refused_auto = await sql(port, f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={m2.port}, "
                                               f"MASTER_LOG_FILE='{third.name}', MASTER_LOG_POS={b3_end}")
                inside = third.spans[(MB, 3)][0] + 1  # inside B:3's GTID event
                await repoint(third.name, inside)
                await wait_for(lambda: session.status.last_io_error, what="the bad position refused")
                bad = (session.status.last_io_errno, session.status.last_io_error, list(m2.dumps))
                await repoint(third.name, b3_end)
                await wait_for(lambda: session.status.io_running and session.status.master_server_id == 2,
                               what="the relay on M2")
                m2.append(third.image[b3_end:])
                m2.add_file(M2_FILES[3].name, M2_FILES[3].image)
                await wait_for(lambda: session.store.horizon.snapshot().coordinates
                               == ("mysql-bin.000009", len(M2_FILES[3].image)), what="B:6 in the relay")
                status = await http_status(info["http"])
            return refused_auto, bad, before, status, m2
        finally:
            await m1.stop()
            await m2.stop()

    refused_auto, bad, before, status, m2 = asyncio.run(scenario())
    assert refused_auto[0] == 1776, refused_auto  # as MySQL: coordinates while auto-position is on
    errno, error, dumps = bad
    assert errno == 1236 and dumps == [], bad
    assert f"MASTER_LOG_POS {third.spans[(MB, 3)][0] + 1} is not the start of an event in {third.name}" in error
    assert before == {f.name: f.image for f in M1_FILES}
    assert [d.command for d in m2.dumps] == ["COM_BINLOG_DUMP_GTID"] and m2.dumps[0].gtid_data == gtid_set_bytes(
        RELAY_HAS)
    switch = status["last_switch"]
    assert switch["coordinates"] == {"file": third.name, "position": b3_end} and switch["accepted"], switch
    assert switch["coordinates_gtids"].replace("\n", "") == f"{MA}:1-8,{MB}:1-3", switch
    assert switch["relay_gtids"] == text(RELAY_HAS) and switch["missing_on_master"] is None, switch
    assert switch["relay_behind_coordinates"].replace("\n", "") == f"{MA}:8,{MB}:1-3", switch
    assert status["retrieved_gtid_set"] == f"{MA}:1-8,{MB}:1-6" and status["last_io_error"] is None
