"""`relayproxy pitr` end to end on real servers: a MariaDB master under a mixed load with marker rows, a real
mariadb-backup taken mid-load, more load, a DROP TABLE, more load; the backup restored into new instances and
replayed from the relay to just before the disaster (by GTID, and by a time inside a busy second), each compared
table by table with a reference a DBA trusts: the same backup replicating straight from the master with START SLAVE
UNTIL master_gtid_pos. Killed twice mid-replay (kill -9), the command run again ends at the same state. And the bad
inputs, each refused with words naming what was wrong and nothing changed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from relayproxy.lab import pitr_lab as L
from relayproxy.lab.backup import restore_backup, take_backup
from relayproxy.lab.harness import RelayProcess, listener_query, prepare_master
from relayproxy.lab.sandbox import MariaDBSandbox
from relayproxy.commands.pitr_plan import read_backup_info

pytestmark = pytest.mark.server

ADMIN, ADMIN_PW = "ops", "opspw"


class History:
    """The shared set-up: master, relay, backup, disaster, and a way to make restored instances."""

    def __init__(self, base: Path, *, master_config: dict | None = None, relay_extra: list[str] | None = None,
                 backlog: int = 2500):
        self.base = base
        self.servers: list[MariaDBSandbox] = []
        self.master = self.server("master", server_id=1, extra_config=master_config)
        prepare_master(self.master)
        self.relay = RelayProcess(base / "relay", self.master.port, gtid_mode="mariadb", listen=True,
                                  users=f"repl:replpw,{ADMIN}:{ADMIN_PW}:admin", extra=relay_extra)
        self.relay.start()
        L.create_schema(self.master)
        (base / "ops.pw").write_text(ADMIN_PW + "\n")
        (base / "repl.pw").write_text("replpw\n")
        (base / "wrong.pw").write_text("not-it\n")
        with L.MixedLoad(self.master, writers=2, phase="before") as load:
            load.wait_commits(300)
            self.backup = take_backup(self.master, base / "backup")  # mid-load: writers commit while it copies
            load.wait_commits(load.commits + backlog)
        self.backup_gtid = str(read_backup_info(self.backup).gtid)
        self.disaster_gtid = L.disaster(self.master)
        with L.MixedLoad(self.master, writers=2, phase="after", seed=2) as load:
            load.wait_commits(400)
        self.relay.wait_caught_up(self.master, timeout=120)
        self.committed = L.commit_times(self.master.binlog_files())
        self.references: dict[str, MariaDBSandbox] = {}

    def server(self, name: str, **kw) -> MariaDBSandbox:
        sandbox = MariaDBSandbox(self.base / name, binlog_format="ROW", **kw)
        self.servers.append(sandbox)
        return sandbox.start()

    def restored(self, name: str, server_id: int) -> MariaDBSandbox:
        sandbox = MariaDBSandbox(self.base / name, server_id=server_id, binlog_format="ROW")
        self.servers.append(sandbox)
        return restore_backup(self.backup, sandbox)

    def reference(self, until: str) -> MariaDBSandbox:
        """The restored backup replicated straight from the master up to ``until`` (cached per stop)."""
        if until not in self.references:
            sandbox = MariaDBSandbox(self.base / f"ref-{len(self.references)}", server_id=90 + len(self.references),
                                     binlog_format="ROW")
            self.servers.append(sandbox)
            ref = L.start_reference(self.backup, sandbox, self.master, until)
            L.wait_stopped_at(ref, until)
            self.references[until] = ref
        return self.references[until]

    def pitr(self, target: MariaDBSandbox, *extra: str, password: str = "ops.pw", wait: bool = True,
             timeout: float = 300.0):
        args = [sys.executable, "-m", "relayproxy.commands.cli", "pitr",
                "--target", f"127.0.0.1:{target.port}", "--target-user", "root",
                "--target-password-file", str(self.base / "empty.pw"),
                "--relay", f"127.0.0.1:{self.relay.listen_port}", "--relay-user", ADMIN,
                "--relay-password-file", str(self.base / password),
                "--repl-user", "repl", "--repl-password-file", str(self.base / "repl.pw"), *extra]
        (self.base / "empty.pw").write_text("")
        if not wait:
            return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)

    def relay_stops(self) -> list[dict]:
        return listener_query(self.relay.listen_port, "SHOW RELAYPROXY REPLAY STOPS", user=ADMIN, password=ADMIN_PW)

    def close(self) -> None:
        self.relay.stop()
        for server in reversed(self.servers):
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - stop the others
                pass


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    base = tmp_path_factory.mktemp("pitr")
    h = History(base)
    try:
        yield h
    finally:
        h.close()
        shutil.rmtree(base, ignore_errors=True)


def assert_done(history: History, target: MariaDBSandbox, until: str, result) -> dict:
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(result.stdout)
    assert report["outcome"] == "done" and report["exit_code"] == 0
    assert str(target.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0]) == until
    assert L.fingerprint(target) == L.fingerprint(history.reference(until))
    assert target.execute("SHOW ALL SLAVES STATUS") == ()  # its replay connection is reset
    assert history.relay_stops() == []  # and the relay's stop cleared
    return report


def test_before_gtid_replays_to_just_before_the_drop_table(history):
    target = history.restored("target-gtid", server_id=11)
    until = L.gtid_before(history.disaster_gtid)
    result = history.pitr(target, "--before-gtid", history.disaster_gtid, "--from-backup", str(history.backup),
                          "--parallel", "4", "--json")
    report = assert_done(history, target, until, result)
    assert target.execute("SELECT COUNT(*) FROM shop.victim")[0][0] == 100  # the dropped table is back
    assert report["start"]["position"] == history.backup_gtid
    assert report["stop"]["first_left_out"]["gtid"] == history.disaster_gtid
    assert report["range"]["transactions"] == int(until.split("-")[2]) - int(history.backup_gtid.split("-")[2])
    assert [s["step"] for s in report["steps"]] == ["planned", "fenced", "replaying", "replayed", "finished"]
    # run again: nothing to do, same state
    again = history.pitr(target, "--before-gtid", history.disaster_gtid, "--from-backup", str(history.backup),
                         "--json")
    assert_done(history, target, until, again)


def wait_moved(target: MariaDBSandbox, past: int, stop_seq: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pos = str(target.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0] or "0-0-0")
        seen = int(pos.split("-")[2])
        if past < seen < stop_seq:
            return seen
        time.sleep(0.005)
    raise AssertionError(f"the target did not move past {past} (stop {stop_seq}) in {timeout} s")


def test_killed_mid_replay_with_the_target_then_with_the_relay_and_run_again(history):
    """kill -9 of pitr together with the target (a crash mid-apply), then of pitr together with the relay; the same
    command run again ends at the same state: nothing applied twice (the markers' primary key would stop the
    applier), nothing missed (the tables equal the reference's)."""
    target = history.restored("target-kill", server_id=12)
    until = L.gtid_before(history.disaster_gtid)
    backup_seq = int(history.backup_gtid.split("-")[2])
    stop_seq = int(until.split("-")[2])
    command = ["--before-gtid", history.disaster_gtid, "--from-backup", str(history.backup), "--parallel", "0"]
    proc = history.pitr(target, *command, wait=False)
    first = wait_moved(target, backup_seq + 20, stop_seq)
    os.killpg(proc.pid, signal.SIGKILL)
    target.kill()
    proc.wait(10)
    assert [s["Server_id"] for s in history.relay_stops()] == [12]  # the relay still fences the target
    target.start()  # crash recovery; the sandbox does not start replication by itself (skip_slave_start)
    at_restart = int(str(target.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0]).split("-")[2])
    assert backup_seq < at_restart < stop_seq, (first, at_restart)
    proc = history.pitr(target, *command, wait=False)
    wait_moved(target, at_restart + 20, stop_seq)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    history.relay.kill9()
    history.relay.start()  # the stop is read back from the relay's directory
    assert [s["Server_id"] for s in history.relay_stops()] == [12]
    result = history.pitr(target, *command, "--json")
    report = assert_done(history, target, until, result)
    assert report["start"]["resumed"] or "previous run" in report["message"]


def test_before_time_inside_a_busy_second(history):
    second = L.busiest_second(history.committed, history.backup_gtid)
    if second >= next(c.commit_second for c in history.committed if c.gtid == history.disaster_gtid):
        second = history.committed[[c.gtid for c in history.committed].index(history.backup_gtid) + 1].commit_second
    micros = second * 1_000_000 + 500_000
    until = L.last_before(history.committed, micros)
    when = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") + ".5"
    target = history.restored("target-time", server_id=13)
    result = history.pitr(target, "--before-time", when, "--time-zone", "UTC", "--from-backup",
                          str(history.backup), "--json")
    report = assert_done(history, target, until, result)
    assert any("whole seconds" in w for w in report["warnings"])
    assert any("no time zone: read in UTC" in w for w in report["warnings"])
    # the first transaction left out is the first recorded at or after T, in binlog order
    gtids = [c.gtid for c in history.committed]
    assert report["stop"]["first_left_out"]["gtid"] == gtids[gtids.index(until) + 1]


def test_dry_run_names_the_range_and_changes_nothing(history):
    target = history.restored("target-dry", server_id=14)
    result = history.pitr(target, "--before-gtid", history.disaster_gtid, "--from-backup", str(history.backup),
                          "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "relayproxy pitr: dry run" in result.stdout and "range:" in result.stdout
    assert "master-bin." in result.stdout
    assert str(target.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0]) == ""
    assert target.execute("SHOW ALL SLAVES STATUS") == () and history.relay_stops() == []


def test_bad_inputs_are_refused_naming_what_was_wrong(history):
    target = history.restored("target-bad", server_id=15)
    backup = ["--from-backup", str(history.backup)]
    disaster = ["--before-gtid", history.disaster_gtid]
    cases = [
        # a stop the relay does not hold
        (["--before-gtid", "0-1-99999999", *backup], 3, "not in the relay's history"),
        # a backup whose GTID is not in the relay's history
        ([*disaster, "--from-gtid", "0-77-5"], 3, "is not in the relay's history"),
        # the stop before the backup: the target would already be past it
        (["--until-gtid", f"0-1-{int(history.backup_gtid.split('-')[2]) - 10}", *backup], 3,
         "already has transactions past the stop"),
        # a time before everything the relay holds: the target, at the backup, is past it
        (["--before-time", "2000-01-01 00:00:00Z", *backup], 3, "already has transactions past the stop"),
        # a time past everything the relay holds
        (["--before-time", "2099-01-01 00:00:00Z", *backup], 3, "not received yet"),
        (["--before-time", "2026-12-02 14:02:17", "--time-zone", "Mars/Olympus", *backup], 2, "not a time zone"),
        (["--before-time", "yesterday", *backup], 2, "expected 'YYYY-MM-DD"),
        ([*disaster, "--from-backup", str(history.base)], 3, "no mariadb_backup_binlog_info or xtrabackup"),
    ]
    for extra, code, words in cases:
        result = history.pitr(target, *extra)
        assert result.returncode == code and words in result.stderr, (extra, result.returncode, result.stderr)
    wrong = history.pitr(target, *disaster, *backup, password="wrong.pw")
    assert wrong.returncode == 4 and f"login as '{ADMIN}' refused" in wrong.stderr, wrong.stderr
    # a target replicating from somewhere else
    target.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={history.master.port}, "
                   "MASTER_USER='repl', MASTER_PASSWORD='replpw', MASTER_USE_GTID=slave_pos")
    target.execute("START SLAVE")
    elsewhere = history.pitr(target, *disaster, *backup)
    assert elsewhere.returncode == 3 and "is replicating from" in elsewhere.stderr, elsewhere.stderr
    target.execute("STOP SLAVE")
    target.execute("RESET SLAVE ALL")
    # nothing half-done anywhere
    assert history.relay_stops() == []
    assert not [c for c in target.execute("SHOW ALL SLAVES STATUS")]


def test_files_the_relay_archived_compressed_are_replayed_without_copying_them_back(tmp_path):
    """The relay compresses closed files and moves them to its archive directory; a replay that spans them reads them
    there, through the same look-up as every dump, and its transaction index covers them."""
    archive = tmp_path / "archive"
    h = History(tmp_path / "h", master_config={"max_binlog_size": 1 << 20},
                relay_extra=["--compress-closed", "zstd", "--archive-dir", str(archive), "--archive-after", "2 files",
                             "--storage-interval", "0.2"], backlog=1200)
    try:
        deadline = time.monotonic() + 90
        names = (h.relay.relay_dir / "relayproxy.index").read_text().split()
        while time.monotonic() < deadline and not all(
                not (h.relay.relay_dir / n).exists() for n in names[:-3]):
            time.sleep(0.2)
        archived = sorted(p.name for p in archive.iterdir() if p.name.startswith("master-bin."))
        assert len(names) >= 5 and len(archived) >= 2, (names, archived)
        backup_file = read_backup_info(h.backup).file
        assert any(a.startswith(backup_file) for a in archived), (backup_file, archived)  # the replay starts there
        target = h.restored("target-archive", server_id=16)
        until = L.gtid_before(h.disaster_gtid)
        result = h.pitr(target, "--before-gtid", h.disaster_gtid, "--from-backup", str(h.backup), "--json")
        report = assert_done(h, target, until, result)
        assert backup_file in report["range"]["files"]
    finally:
        h.close()
