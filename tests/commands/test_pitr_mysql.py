"""`relayproxy pitr`, MySQL flavour, against scripted MySQL 8.0 servers: no MySQL server runs here.

What is real: the relay (``serve`` in-process, ``--gtid-mode mysql``, its SQL listener, its transaction index and its
replay stop); `relayproxy pitr --json` as a separate process talking the MySQL protocol through PyMySQL; the
replication protocol on every link (COM_BINLOG_DUMP_GTID by auto-position, CRC32-checked events).

What is scripted: the master (tests/support/fakemaster.py, serving a binlog built here) and the target
(tests/support/fakereplica.py ``FakeMySQLReplica``, a MySQL 8.0 server that answers the statements pitr sends and
"applies" a transaction by recording its GTID and its statement). A real MySQL would also apply row changes and keep a
relay log. Expected GTID sets are written out as literals.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.fakemaster import FakeMySQLMaster
from ..support.fakereplica import FakeMySQLReplica, binlog_image, insert_statement
from ..lab.test_fake_mysql_master import running_relay, wait_for
from .test_serve import served

pytestmark = pytest.mark.slow

A = "aaaaaaaa-1111-4111-8111-000000000001"  # the master
T = "cccccccc-3333-4333-8333-000000000003"  # the target's own uuid
RELAY_USERS = "repl:servepw:mysql_native_password,ops:opspw:mysql_native_password:admin"
ACCOUNTS = {"root": "rootpw"}
IMAGE = binlog_image(1, {}, [(A, n, 1) for n in range(1, 21)])  # A:1-20


def run_pitr(tmp: Path, target_port: int, relay_port: int, *extra: str) -> tuple[int, dict, str]:
    (tmp / "root.pw").write_text("rootpw\n")
    (tmp / "ops.pw").write_text("opspw\n")
    (tmp / "repl.pw").write_text("servepw\n")
    done = subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "pitr", "--json",
                           "--target", f"127.0.0.1:{target_port}", "--target-user", "root",
                           "--target-password-file", str(tmp / "root.pw"), "--relay", f"127.0.0.1:{relay_port}",
                           "--relay-user", "ops", "--relay-password-file", str(tmp / "ops.pw"),
                           "--repl-user", "repl", "--repl-password-file", str(tmp / "repl.pw"), "--timeout", "60",
                           *extra], capture_output=True, text=True, timeout=120)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {}
    return done.returncode, doc, done.stderr


def scenario(tmp: Path, target_kw: dict, *runs: list[str], through_serve: bool = False):
    """The relay (`run`, in-process) follows the scripted master until it has A:1-20; each run of pitr then replays
    onto the scripted target through it, or (``through_serve``) through `relayproxy serve` on the relay's directory
    once the relay has stopped (its replay stops are in memory only)."""
    async def replays(target, port: int) -> list:
        results = []
        for extra in runs:
            before = len(target.admin_log)
            code, doc, err = await asyncio.to_thread(run_pitr, tmp, target.port, port, *extra)
            results.append((code, doc, err, target.admin_log[before:], target.gtid_executed, list(target.statements)))
        return results

    async def go():
        master = await FakeMySQLMaster([("mysql-bin.000001", IMAGE)], server_id=1, server_uuid=A).start()
        target = await FakeMySQLReplica(**{"server_id": 7, "server_uuid": T, "accounts": ACCOUNTS, **target_kw}).start()
        try:
            async with running_relay(master, tmp / "relay", listen="127.0.0.1:0", users=RELAY_USERS) as info:
                horizon = info["session"].store.horizon
                await wait_for(lambda: horizon.snapshot().coordinates == ("mysql-bin.000001", len(IMAGE)),
                               what="the relay has A:1-20")
                if not through_serve:
                    return await replays(target, info["listen"][1])
            with served(tmp / "relay", "--gtid-mode", "mysql", users=RELAY_USERS) as relay:
                return await replays(target, relay.port)
        finally:
            await target.stop()
            await master.stop()

    return asyncio.run(go())


def test_a_restored_mysql_target_is_replayed_to_just_before_a_gtid(tmp_path):
    (first, again) = scenario(tmp_path, {}, ["--before-gtid", f"{A}:15", "--from-gtid", f"{A}:1-5"],
                              ["--before-gtid", f"{A}:15", "--from-gtid", f"{A}:1-5"])
    code, doc, err, admin, executed, statements = first
    assert code == 0, err
    assert doc["outcome"] == "done" and doc["target"]["flavour"] == "mysql"
    assert executed == f"{A}:1-14"
    assert [s for _, s in statements] == [insert_statement(A, n) for n in range(6, 15)]  # 6..14, each once
    assert doc["stop"]["first_left_out"]["gtid"] == f"{A}:15" and doc["range"]["transactions"] == 9
    shape = [s.split(" ")[0] + " " + s.split(" ")[1] for s in admin]
    assert shape == ["SET GLOBAL", "CHANGE REPLICATION", "START REPLICA", "STOP REPLICA", "RESET REPLICA"], admin
    assert admin[0] == f"SET GLOBAL gtid_purged = '{A}:1-5'" and "SOURCE_AUTO_POSITION=1" in admin[1]
    code, doc, err, admin, executed, _ = again  # run again: at the stop already, nothing to apply
    assert code == 0 and doc["outcome"] == "done" and executed == f"{A}:1-14" and admin == [], (err, admin)


def test_until_gtid_and_a_target_that_holds_part_of_the_range_continues_from_it(tmp_path):
    (run,) = scenario(tmp_path, {"executed": [(A, n, 1) for n in range(1, 9)]},
                      ["--until-gtid", f"{A}:12", "--from-gtid", f"{A}:1-5"])
    code, doc, err, admin, executed, statements = run
    assert code == 0, err
    assert executed == f"{A}:1-12" and doc["start"]["resumed"]
    assert [s for _, s in statements][-4:] == [insert_statement(A, n) for n in range(9, 13)]
    assert not any("gtid_purged" in s for s in admin)  # it held more than the start: nothing set


def test_a_mysql_target_past_the_stop_or_a_stop_the_relay_lacks_is_refused(tmp_path):
    past, missing, diverged = scenario(
        tmp_path, {"executed": [(A, n, 1) for n in range(1, 18)]},
        ["--before-gtid", f"{A}:15"], ["--before-gtid", f"{A}:99"],
        ["--before-gtid", f"{A}:19", "--from-gtid", f"{A}:1-3,{T}:1"])
    code, doc, err, admin, executed, _ = past
    assert code == 3 and "already has transactions past the stop" in doc["message"] and f"{A}:15-17" in doc["message"]
    assert admin == [] and executed == f"{A}:1-17"
    code, doc, err, admin, _, _ = missing
    assert code == 3 and "not in the relay's history" in doc["message"] and admin == []
    code, doc, err, admin, _, _ = diverged
    assert code == 3 and "diverge" in doc["message"] and admin == [], doc


def test_a_relay_that_keeps_its_stops_in_memory_only_is_refused_unless_accepted(tmp_path):
    """`relayproxy serve` keeps replay stops in memory: its restart mid-replay would lift the fence. pitr refuses it
    (exit 3, the stop it set cleared again, the target untouched) unless --accept-volatile-stop says so."""
    refused, accepted = scenario(tmp_path, {}, ["--before-gtid", f"{A}:15", "--from-gtid", f"{A}:1-5"],
                                 ["--before-gtid", f"{A}:15", "--from-gtid", f"{A}:1-5", "--accept-volatile-stop"],
                                 through_serve=True)
    code, doc, err, admin, executed, _ = refused
    assert code == 3 and "keeps replay stops in memory only" in doc["message"], (err, doc)
    assert admin == [] and executed == ""
    assert "--accept-volatile-stop" in doc["message"]
    code, doc, err, admin, executed, _ = accepted
    assert code == 0 and doc["outcome"] == "done" and executed == f"{A}:1-14", err


def test_a_refusal_after_the_fence_and_a_timeout_leave_a_state_the_same_command_finishes(tmp_path):
    """Exit 3 after the fence (the target cannot log into the relay: a wrong --repl-password-file) and exit 5 (the
    target never reaches the relay: a --relay-address nobody listens on, under --timeout): each leaves the stop and the
    stopped replication in place, and the same command with the mistake fixed ends at the stop."""
    from relayproxy.lab.harness import free_port

    (tmp_path / "wrong.pw").write_text("not-the-password\n")
    base = ["--before-gtid", f"{A}:15", "--from-gtid", f"{A}:1-5"]
    wrong_password, timed_out, fixed = scenario(
        tmp_path, {}, [*base, "--repl-password-file", str(tmp_path / "wrong.pw")],
        [*base, "--relay-address", f"127.0.0.1:{free_port()}", "--timeout", "3"], base)
    code, doc, err, admin, executed, _ = wrong_password
    assert code == 3 and "cannot replicate from relay" in doc["message"] and "1045" in doc["message"], (err, doc)
    assert [s.split(" ")[0] for s in admin][:3] == ["SET", "CHANGE", "START"] and admin[-1].startswith("STOP")
    assert executed == f"{A}:1-5"  # the backup's position set; nothing replayed
    code, doc, err, admin, executed, _ = timed_out
    assert code == 5 and "--timeout ran out" in doc["message"] and executed == f"{A}:1-5", (err, doc)
    code, doc, err, admin, executed, statements = fixed
    assert code == 0 and doc["outcome"] == "done" and executed == f"{A}:1-14", (err, doc)
    assert [s for _, s in statements] == [insert_statement(A, n) for n in range(6, 15)]  # each once


@pytest.mark.parametrize("target_kw, complaint", [
    ({"server_id": 0}, "has server_id 0: a replica needs its own server_id"),
    ({"version": "10.11.6-MariaDB"}, "a replay needs one flavour on both"),
], ids=["server_id 0", "another flavour"])
def test_a_target_with_server_id_0_or_of_another_flavour_is_refused_untouched(tmp_path, target_kw, complaint):
    (run,) = scenario(tmp_path, target_kw, ["--before-gtid", f"{A}:15", "--from-gtid", f"{A}:1-5"])
    code, doc, err, admin, executed, _ = run
    assert code == 3 and complaint in doc["message"], (err, doc)
    assert admin == [] and executed == ""
