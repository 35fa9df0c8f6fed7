"""Failover: the relay follows the master through a failover, repointed with SQL exactly like a replica.

Real MariaDB servers (relayproxy.lab.failover): master M1; candidates R1 (and R4) replicating from M1 with their own
binlogs (basename mysql-bin, log_slave_updates, gtid_strict_mode); the relay on M1; R2 behind the relay by GTID and
R3 by file/position. M1 dies (kill -9) while a large transaction is half sent to everyone; R1 is promoted as an HA
tool does; the relay is repointed with STOP SLAVE / CHANGE MASTER TO / START SLAVE; R1 takes more mixed writes with
DDL. R2 and R3 end with R1's data, every insert exactly once, and the relay's files stay one monotonic sequence.
Also: a candidate that lacks GTIDs the relay holds is refused, a second switch works, and bad input is refused
with the servers' errors while serving goes on. The figures are printed side by side (pytest -s shows them all).
"""

from __future__ import annotations

import json
import socket

import pymysql
import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import scan_file
from relayproxy.lab.failover import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    BASENAME,
    REPL_PASSWORD,
    REPL_USER,
    SCHEMA,
    FailoverLab,
    binlog_pos,
    change_master_sql,
    covers,
    gtid_seqs,
    promote,
    relay_sql,
    repoint_relay,
    repoint_replica,
    slave_pos,
    uids,
    wait_until,
)
from relayproxy.lab.harness import assert_same_data, free_port, replica_status

pytestmark = pytest.mark.server

TIMEOUT = 60.0
BIG_BYTES = 4 << 20


# -- checks ---------------------------------------------------------------------------------------------------------


def assert_inserts_exactly_once(lab: FailoverLab, source, replicas) -> None:
    """Every table: the source holds exactly the uids the load committed; each replica the same set, none twice.
    The big transaction M1 never finished sending is nowhere."""
    for table, expected in lab.load.inserted.items():
        count, got = uids(source, table)
        assert count == len(got) and got == expected, (
            f"{source.basedir.name} {SCHEMA}.{table}: {count} rows, {len(got)} uids, "
            f"missing {sorted(expected - got)[:10]}, unexpected {sorted(got - expected)[:10]}")
        for replica in replicas:
            rows, theirs = uids(replica, table)
            assert rows == len(theirs), f"{replica.basedir.name} {table}: {rows} rows, {len(theirs)} uids: applied twice"
            assert theirs == got, (f"{replica.basedir.name} {table}: missing {sorted(got - theirs)[:10]}, "
                                   f"unexpected {sorted(theirs - got)[:10]}")
    for server in (source, *replicas):
        assert uids(server, "big")[0] == 0, f"{server.basedir.name} holds rows of the big transaction"


def assert_same_everywhere(lab: FailoverLab, source, replicas) -> None:
    for replica in replicas:
        assert_same_data(source, replica)  # same tables, CHECKSUM TABLE and row counts
    assert_inserts_exactly_once(lab, source, replicas)


def _seq(name: str) -> int:
    return int(name.rsplit(".", 1)[1])


def relay_epochs(lab: FailoverLab) -> list[dict]:
    """The epochs the relay records (relayproxy.epochs, docs/failover.md); [] while it has only its first master."""
    path = lab.relay.relay_dir / "relayproxy.epochs"
    return json.loads(path.read_text())["epochs"] if path.exists() else []


def epoch_lines(lab: FailoverLab) -> str:
    return "; ".join(f"{e['first_file']} = {e.get('upstream_first_file')} of :{(e.get('master') or {}).get('port')}"
                     for e in relay_epochs(lab)) or "(one)"


def assert_one_file_sequence(lab: FailoverLab, before: dict[str, bytes] | None = None, *,
                             epochs: int | None = None) -> list[str]:
    """The relay's files: consecutive numbers of one basename; each well formed with its FDE; each but the newest
    ends with a ROTATE to position 4 of the next one: naming it, or (inside an epoch of a later master, whose own
    ROTATEs the dump sender renames) naming that master's file that relayproxy.epochs maps to it. The ROTATE
    into an epoch's first file is the relay's and names it. Files that existed `before` were only appended to.
    `epochs`: how many upstream epochs relayproxy.epochs must list."""
    names = list(lab.relay_files())
    assert all(name.rsplit(".", 1)[0] == BASENAME for name in names), names
    assert [_seq(n) for n in names] == list(range(_seq(names[0]), _seq(names[0]) + len(names))), (
        f"not one monotonic sequence: {names}")
    recorded = relay_epochs(lab)
    starts = {e["first_file"]: e for e in recorded if e["epoch"] >= 2}
    assert set(starts) <= set(names), f"epochs start at files the relay does not have: {recorded}"
    if epochs is not None:
        assert max(len(recorded), 1) == epochs, f"expected {epochs} upstream epochs: {recorded}"
    epoch = None
    for i, name in enumerate(names):
        epoch = starts.get(name, epoch)
        scan = scan_file(lab.relay.relay_dir / name)
        assert scan.ok and scan.fde is not None and not scan.partial_tail, (name, scan.error, scan.warnings)
        if i == len(names) - 1:
            assert scan.rotate_to is None, f"the newest file {name} rotates to {scan.rotate_to}"
            break
        following = names[i + 1]
        target, position = scan.rotate_to or ("(no ROTATE)", 0)
        maps = (epoch is not None and following not in starts and target != following
                and _seq(epoch["first_file"]) + _seq(target) - _seq(epoch["upstream_first_file"]) == _seq(following))
        assert scan.last_event_type == C.ROTATE_EVENT and position == 4 and (target == following or maps), (
            f"{name} ends with {C.event_name(scan.last_event_type or 0)} to {scan.rotate_to}, not a ROTATE to "
            f"{following}:4 (epochs {recorded})")
    for name, data in (before or {}).items():
        assert (lab.relay.relay_dir / name).read_bytes()[: len(data)] == data, f"{name} was overwritten"
    return names


def file_bytes(lab: FailoverLab) -> dict[str, bytes]:
    return {name: (lab.relay.relay_dir / name).read_bytes() for name in lab.relay_files()}


def relay_slave_status(lab: FailoverLab) -> dict:
    return relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]


def assert_relay_follows(lab: FailoverLab, master) -> None:
    """SHOW SLAVE STATUS on the relay and its /status name `master`'s port (M1: the relay's link to it) and
    server_id, IO running, no error."""
    port = lab.links["relay"].proxy.port if master is lab.m1 else master.port
    row = relay_slave_status(lab)
    assert (int(row["Master_Port"]), int(row["Master_Server_Id"])) == (port, master.server_id), row
    assert row["Slave_IO_Running"] == "Yes" and not row["Last_IO_Error"], row
    status = lab.relay.status()
    assert (status["master_port"], status["master_server_id"]) == (port, master.server_id), status
    assert status["io_running"] and status["last_io_error"] is None, status


def assert_file_replica_at_relay_end(lab: FailoverLab) -> None:
    """R3 (file/position) rests at the relay's SHOW MASTER STATUS: same file name, same offset."""
    def at_end():
        end = relay_sql(lab.relay_port, "SHOW MASTER STATUS")[0]
        r3 = replica_status(lab.r3)
        return (r3["Relay_Master_Log_File"], int(r3["Exec_Master_Log_Pos"])) == (end["File"], int(end["Position"]))
    wait_until("R3 to rest at the relay's SHOW MASTER STATUS", at_end, TIMEOUT, lab.describe)


def assert_served(lab: FailoverLab) -> None:
    """R2 has everything the relay holds, and can connect afresh: its IO thread restarted gets back to Yes."""
    held = lab.relay.status()["retrieved_gtid_set"]
    assert covers(slave_pos(lab.r2), held), (slave_pos(lab.r2), held)
    lab.r2.execute("STOP SLAVE")
    lab.r2.execute("START SLAVE")
    wait_until("R2 to reconnect to the relay", lambda: replica_status(lab.r2)["Slave_IO_Running"] == "Yes",
               TIMEOUT, lab.describe)
    names = [row["Log_name"] for row in relay_sql(lab.relay_port, "SHOW BINARY LOGS", user=REPL_USER,
                                                  password=REPL_PASSWORD)]
    assert names == list(lab.relay_files())


def summary(title: str, lab: FailoverLab, source, source_label: str, capsys, extra: list[str] = ()) -> None:
    """Side by side: what the new master has and what each replica behind the relay got."""
    columns = [(source_label, source), ("R2 via relay (GTID)", lab.r2), ("R3 via relay (file/pos)", lab.r3)]
    tables = sorted(lab.load.inserted)

    def cell(server, what: str) -> str:
        try:
            return look(server, what)
        except pymysql.MySQLError as exc:
            return f"error {exc.args[0]}"

    def look(server, what: str) -> str:
        status = replica_status(server)
        if what == "gtid":
            return binlog_pos(server) if server is source else slave_pos(server)
        if what == "pos":
            return f"{status['Relay_Master_Log_File']}:{status['Exec_Master_Log_Pos']}" if status else "-"
        if what == "rows":
            return str(sum(uids(server, t)[0] for t in tables))
        if what == "uids":
            return str(sum(len(uids(server, t)[1]) for t in tables))
        if what == "checksums":
            sums = [server.execute(f"CHECKSUM TABLE {SCHEMA}.{t}")[0][1] for t in tables]
            mine = [source.execute(f"CHECKSUM TABLE {SCHEMA}.{t}")[0][1] for t in tables]
            return "equal" if sums == mine else "DIFFERENT"
        return str(uids(server, "big")[0])

    rows = [("", *(label for label, _ in columns))]
    for label, what in (("gtid position", "gtid"), ("Exec at (file:pos)", "pos"), (f"rows in {len(tables)} tables",
                        "rows"), ("distinct uids", "uids"), ("checksums vs source", "checksums"),
                        ("big trx rows", "big")):
        rows.append((label, *(cell(server, what) for _, server in columns)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [title] + ["  " + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths)) for r in rows] + list(extra)
    with capsys.disabled():
        print("\n" + "\n".join(lines))


# -- the tests -----------------------------------------------------------------------------------------------------


def test_failover_relay_follows_promoted_master(tmp_path, capsys):
    """M1 killed mid-transaction, R1 promoted, relay repointed by SQL; R2 (GTID) and R3 (file/pos) go on."""
    with FailoverLab(tmp_path / "lab", candidates=2) as lab, lab.explained():
        lab.start()
        lab.load.run(lab.m1, 300, rotate_every=110)
        crash = lab.kill_mid_transaction(BIG_BYTES)
        assert lab.relay.status()["retrieved_gtid_set"] == crash.gtid_before  # the half transaction is not counted
        promote(lab.r1)
        assert binlog_pos(lab.r1) == crash.gtid_before
        repoint_replica(lab.r4, lab.r1.port)
        before = file_bytes(lab)

        repoint_relay(lab.relay_port, lab.r1.port)
        lab.load.run(lab.r1, 300)  # with CREATE TABLE and ALTER TABLE ADD COLUMN among them
        lab.wait_converged(lab.r1, [lab.r2, lab.r3, lab.r4], TIMEOUT)
        assert_relay_follows(lab, lab.r1)
        assert_same_everywhere(lab, lab.r1, [lab.r2, lab.r3, lab.r4])
        names = assert_one_file_sequence(lab, before, epochs=2)
        assert len(names) > len(before), "no relay file after the switch"
        r3 = replica_status(lab.r3)
        assert r3["Using_Gtid"] == "No" and r3["Master_Log_File"] == names[-1], r3  # it followed the ROTATE
        assert replica_status(lab.r2)["Using_Gtid"] == "Slave_Pos"
        assert_file_replica_at_relay_end(lab)

        lab.relay.stop()  # the choice of master survives a restart, whatever --master says
        lab.relay.start()
        lab.load.run(lab.r1, 60)
        lab.wait_converged(lab.r1, timeout=TIMEOUT)
        assert_relay_follows(lab, lab.r1)
        assert_same_everywhere(lab, lab.r1, [lab.r2, lab.r3])
        names = assert_one_file_sequence(lab, before, epochs=2)  # the restart began no epoch
        assert_file_replica_at_relay_end(lab)
        summary("failover: M1 killed mid-transaction, R1 promoted, relay repointed by SQL", lab, lab.r1,
                "R1 (new master)", capsys, [
                    (f"  M1 died with {crash.big_gtid} cut at {crash.big_end[0]}:{crash.cut} of {crash.big_end[1]};"
                     f" survivors held {crash.gtid_before}"),
                    (f"  relay files {names[0]}..{names[-1]} ({len(before)} from M1), following R1 :{lab.r1.port};"
                     f" epochs {epoch_lines(lab)}"),
                    f"  {lab.load.transactions} transactions, {len(lab.load.inserted)} tables"])


def test_failover_refused_when_candidate_lacks_gtids(tmp_path, capsys):
    """The relay holds GTIDs the candidate lacks: refused with them named, nothing written, serving goes on."""
    with FailoverLab(tmp_path / "lab", candidates=1) as lab, lab.explained():
        lab.start()
        lab.load.run(lab.m1, 80, rotate_every=50)
        lab.wait_caught_up_m1()
        lab.r1.execute("STOP SLAVE")  # R1 falls behind
        lab.load.run(lab.m1, 20)
        lab.wait_caught_up_m1([lab.r2, lab.r3])
        held = lab.relay.status()["retrieved_gtid_set"]
        (domain, newest), = gtid_seqs(held).items()
        missing = f"{domain}-{lab.m1.server_id}-{newest}"  # R1 stopped before it
        assert not covers(slave_pos(lab.r1), held)
        before, status_before, behind = file_bytes(lab), lab.relay.status(), slave_pos(lab.r1)

        repoint_relay(lab.relay_port, lab.r1.port)
        status = lab.relay.wait_for(lambda s: missing in (s["last_io_error"] or ""), TIMEOUT,
                                    f"the relay to refuse R1 naming {missing}")
        row = relay_slave_status(lab)
        assert missing in row["Last_IO_Error"] and row["Slave_IO_Running"] != "Yes", row
        assert file_bytes(lab) == before, "the relay wrote something for a master it refused"
        assert (status["retrieved_gtid_set"], status["master_log_file"], status["read_master_log_pos"]) == (
            status_before["retrieved_gtid_set"], status_before["master_log_file"], status_before["read_master_log_pos"])
        assert_served(lab)
        refusal = row["Last_IO_Error"]

        repoint_relay(lab.relay_port, lab.links["relay"].proxy.port)  # back to M1, still alive
        lab.load.run(lab.m1, 30)
        lab.wait_caught_up_m1([lab.r2, lab.r3])
        assert_relay_follows(lab, lab.m1)
        assert_same_everywhere(lab, lab.m1, [lab.r2, lab.r3])
        assert_one_file_sequence(lab, before)

        lab.r1.execute("START SLAVE")  # once R1 has everything, the relay takes it
        lab.wait_converged(lab.m1, [lab.r1], TIMEOUT)
        repoint_relay(lab.relay_port, lab.r1.port)
        lab.load.run(lab.m1, 30)  # M1 -> R1 (log_slave_updates) -> relay -> R2, R3
        lab.wait_converged(lab.m1, timeout=TIMEOUT)
        assert_relay_follows(lab, lab.r1)
        assert_same_everywhere(lab, lab.m1, [lab.r1, lab.r2, lab.r3])
        assert_one_file_sequence(lab, before)
        summary("refusal: relay ahead of the candidate", lab, lab.m1, "M1", capsys,
                [f"  repointed to R1 at {behind} while holding {held}:", f"  Last_IO_Error: {refusal}"])


def test_failover_second_switch(tmp_path, capsys):
    """R1 promoted, then R1 dies too; R4 (repointed to R1 after the first switch) is promoted and the relay follows."""
    with FailoverLab(tmp_path / "lab", candidates=2) as lab, lab.explained():
        lab.start()
        lab.load.run(lab.m1, 120, rotate_every=50)
        lab.kill_mid_transaction(2 << 20)
        promote(lab.r1)
        repoint_replica(lab.r4, lab.r1.port)
        repoint_relay(lab.relay_port, lab.r1.port)
        lab.load.run(lab.r1, 120, rotate_every=60)
        lab.wait_converged(lab.r1, [lab.r2, lab.r3, lab.r4], TIMEOUT)
        before = file_bytes(lab)

        lab.r1.kill()
        promote(lab.r4)
        repoint_relay(lab.relay_port, lab.r4.port)
        lab.load.run(lab.r4, 150)
        lab.wait_converged(lab.r4, timeout=TIMEOUT)
        assert_relay_follows(lab, lab.r4)
        assert_same_everywhere(lab, lab.r4, [lab.r2, lab.r3])
        names = assert_one_file_sequence(lab, before, epochs=3)
        assert replica_status(lab.r3)["Master_Log_File"] == names[-1]
        assert_file_replica_at_relay_end(lab)
        summary("second switch: R1 killed, R4 promoted, relay repointed again", lab, lab.r4, "R4 (new master)",
                capsys, [f"  relay files {names[0]}..{names[-1]}, following R4 :{lab.r4.port}; epochs {epoch_lines(lab)}"])


def test_failover_bad_input_refused_serving_goes_on(tmp_path, capsys):
    """Misspelled option, wrong type, CHANGE MASTER while running, non-admin, dead host, wrong password."""
    with FailoverLab(tmp_path / "lab", candidates=0, relay_extra=["--connect-timeout", "3"]) as lab, lab.explained():
        lab.start()
        lab.load.run(lab.m1, 60)
        lab.wait_caught_up_m1()
        m1_link = lab.links["relay"].proxy.port
        before = file_bytes(lab)
        seen: list[str] = []

        def refused(statement: str, code: int, *words: str, user=ADMIN_USER, password=ADMIN_PASSWORD) -> None:
            with pytest.raises(pymysql.MySQLError) as info:
                relay_sql(lab.relay_port, statement, user=user, password=password)
            errno, message = info.value.args[0], str(info.value.args[1])
            shown = message if len(message) < 110 else f"{message[:40]}...{message[-66:]}"
            seen.append(f"  {statement[:58]:<58} {errno} {shown}")
            assert errno == code and all(w in message for w in words), (statement, errno, message)
            assert file_bytes(lab) == before, f"{statement}: the relay's files changed"

        good = change_master_sql(m1_link)
        refused("STOP SLAVE", 1227, "Access denied", user=REPL_USER, password=REPL_PASSWORD)
        refused(good, 1227, "Access denied", user=REPL_USER, password=REPL_PASSWORD)
        assert_relay_follows(lab, lab.m1)
        refused(good, 1198, "STOP SLAVE")
        relay_sql(lab.relay_port, "STOP SLAVE")
        refused("CHANGE MASTER TO MASTER_HOSTT='127.0.0.1'", 1064, "MASTER_HOSTT")
        refused("CHANGE MASTER TO MASTER_PORT='abc'", 1064, "'abc'")
        relay_sql(lab.relay_port, "START SLAVE")  # nothing was changed: still M1
        lab.relay.wait_for(lambda s: s["io_running"] and s["master_port"] == m1_link, TIMEOUT, "the relay on M1 again")

        io_errors: dict[str, str] = {}
        dead = free_port()  # nothing listens there
        wrong = "not-the-password-4711"
        with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; no greeting ever comes
            silent_port = silent.getsockname()[1]
            previous = ""
            for label, port, password, errno, words in (
                ("host refusing connections", dead, REPL_PASSWORD, 2003, [str(dead)]),
                ("host that does not answer", silent_port, REPL_PASSWORD, 2013, [str(silent_port)]),
                ("wrong password", m1_link, wrong, 1045, ["Access denied"]),
            ):
                repoint_relay(lab.relay_port, port, password=password)

                def new_error(previous: str = previous) -> dict | None:
                    row = relay_slave_status(lab)
                    return row if row["Last_IO_Errno"] and row["Last_IO_Error"] != previous else None

                row = wait_until(f"the relay's Last_IO_Error for the {label}", new_error, TIMEOUT, lab.describe)
                previous = row["Last_IO_Error"]
                io_errors[label] = f"{row['Last_IO_Errno']} {row['Last_IO_Error']}"
                assert int(row["Last_IO_Errno"]) == errno and all(w in row["Last_IO_Error"] for w in words), (
                    f"{label}: Last_IO_Errno {row['Last_IO_Errno']} Last_IO_Error {row['Last_IO_Error']!r}, "
                    f"expected {errno} naming {words}")
                assert int(row["Master_Port"]) == port and row["Slave_IO_Running"] != "Yes", row
                assert lab.relay.status()["last_io_error"], "/status shows no error"
                assert file_bytes(lab) == before, f"{label}: the relay's files changed"
                assert_served(lab)
        for text in (json.dumps(lab.relay.status()), json.dumps(relay_slave_status(lab), default=str),
                     lab.relay.log_path.read_text(errors="replace")):
            assert wrong not in text and ADMIN_PASSWORD not in text, "a password shows"

        repoint_relay(lab.relay_port, m1_link)
        lab.load.run(lab.m1, 40)
        lab.wait_caught_up_m1()
        assert_relay_follows(lab, lab.m1)
        assert_same_everywhere(lab, lab.m1, [lab.r2, lab.r3])
        with capsys.disabled():
            print("\nbad input on the relay's --listen port (code, message):\n" + "\n".join(seen))
            print("\n".join(f"  {label:<58} {text[:120]}" for label, text in io_errors.items()))

