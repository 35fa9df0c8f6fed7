"""Scenario 4: crash safety of the relay with a real MariaDB master and a MariaDB replica through it.

- side by side: a direct MariaDB replica with relay_log_recovery=1 (its SQL thread lagging) and the relay,
  kill -9 at the same moment mid a 24 MB transaction: the direct replica throws away every relay-log byte its SQL
  thread had not applied and downloads it again from the master; the relay keeps every complete transaction it had
  (a byte-identical prefix of the master's files) and fetches only the unfinished one again;
- kill -9 of the relay at random points (under load, right after a restart, while the replica's dump catches up);
- debris after a crash: the relay is frozen (SIGSTOP), killed, and its newest file cut to a random length at or past
  the store's own durable mark, with garbage appended (recovery must cut debris, keep the rest); also at a rotation
  boundary (file N closed, file N+1 with only its header, or N+1 created but
  not yet listed, or gone);
- a full disk (a 16 MB tmpfs as the relay directory): the relay stops receiving with a clear error, keeps serving
  what is durable to a connected replica, retries, and resumes by itself when space returns; ENOSPC / EIO at
  every write and fsync of the store (no server) loses nothing.

These debris tests trust the store's mark to say what was fsynced, so a store that wrote its mark before the
fsync would pass them; the OS crash that drops unsynced data without trusting the store is
tests/relay/test_crash_simulation.py (relayproxy/lab/crashfs.py), which such a store fails.

In every case the replica through the relay ends equal to the master row by row (CHECKSUM TABLE, exact row counts
on tables with primary keys and unique ids) and the relay's files equal the master's. Random points come from
RELAYPROXY_CRASH_SEED (printed; default fixed) so a failure can be replayed.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from relayproxy.binlog.reader import scan_bytes
from relayproxy.lab.harness import (
    Writer,
    assert_files_equal_master,
    assert_same_data,
    change_master,
    master_status,
    prepare_master,
    replica_status,
    user_tables,
    wait_relay,
    wait_replica,
)
from relayproxy.relay import durable as DU
from relayproxy.relay import layout as LA
from relayproxy.relay import recovery as R
from relayproxy.relay.errors import RelayStoreError
from relayproxy.relay.store import RelayStore

from ..downstream.test_downstream_e2e import relay_sql
from ..downstream.test_downstream_topologies import relays  # noqa: F401 - a fixture
from .test_relay_e2e import mixed_load
from ..relay.test_relay_store import Feeder, mysql_image, split_events

SEED = int(os.environ.get("RELAYPROXY_CRASH_SEED", "20261121"))


def _rng(salt: str) -> random.Random:
    print(f"\nrandom points: RELAYPROXY_CRASH_SEED={SEED} ({salt})")
    return random.Random(f"{SEED}-{salt}")


def _coords(file, pos) -> tuple[str, int]:
    """Comparable (file, position): the master's names are zero-padded, so they sort in binlog order."""
    return (file or "", int(pos or 0))


def _replica_read(replica) -> tuple[str, int]:
    """How far the replica's IO thread has received, in master coordinates."""
    status = replica_status(replica)
    return _coords(status.get("Master_Log_File"), status.get("Read_Master_Log_Pos"))


def _received_within(seen: tuple[str, int], horizon: tuple[str, int], relay_dir: Path) -> bool:
    """Whether a replica that has read up to ``seen`` got nothing past ``horizon``. A replica that read the ROTATE
    ending the horizon's file holds the coordinates of the next file at 4: the same point as the end of that file."""
    if seen <= horizon:
        return True
    path = relay_dir / horizon[0]
    return R.read_final_rotate(path) == seen and path.stat().st_size == horizon[1]


def _recovery_reports(relay, since: int) -> list[str]:
    """The "relay recovered from its files" reports logged after byte ``since`` of the relay's log."""
    with open(relay.log_path, "rb") as f:
        f.seek(since)
        lines = f.read().decode(errors="replace").splitlines()
    reports = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") in ("relay recovered from its files", "relay store reopened after a failure"):
            reports.append(record.get("report") or record.get("recovery") or "")
    return reports


def _log_size(relay) -> int:
    try:
        return relay.log_path.stat().st_size
    except OSError:
        return 0


def _start_replica(mariadb, relay, *, gtid: bool):
    replica = mariadb("replica", server_id=3)
    change_master(replica, relay.listen_port, file=None if gtid else "master-bin.000001")
    replica.execute("START SLAVE")
    return replica


def _loaded_chain(mariadb, relays, *, gtid: bool):
    """master -> relay -> replica, after a mixed load that everyone has caught up with."""
    master = mariadb("master")
    prepare_master(master)
    relay = relays("relay", master.port, gtid_mode="mariadb" if gtid else "off")
    mixed_load(master, big=False)
    wait_relay(relay, master)
    replica = _start_replica(mariadb, relay, gtid=gtid)
    wait_replica(replica, master)
    return master, relay, replica


def _assert_writer_rows(replica, writer) -> None:
    """Every transaction of the Writer exactly once: n runs 1..done without a gap or a repeat."""
    got = replica.execute("SELECT COUNT(*), COUNT(DISTINCT n), MIN(n), MAX(n) FROM app.w")[0]
    assert tuple(int(v) for v in got) == (writer.done, writer.done, 1, writer.done), got


def _final_checks(master, relay, replica, *, writer=None) -> None:
    wait_relay(relay, master, timeout=90)
    wait_replica(replica, master, timeout=90)
    assert_same_data(master, replica)
    if writer is not None:
        _assert_writer_rows(replica, writer)
    gtid_m = master.execute("SELECT @@gtid_binlog_pos")[0][0]
    gtid_r = replica.execute("SELECT @@gtid_slave_pos")[0][0]
    assert gtid_r == gtid_m, f"replica applied {gtid_r}, master has {gtid_m}"
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))
    print(f"end: master at {master_status(master)}, gtid master {gtid_m} / replica {gtid_r}; relay files equal the "
          f"master's\n  table              rows master  rows replica  checksum master  checksum replica")
    for table in user_tables(master):
        counts = [server.execute(f"SELECT COUNT(*) FROM {table}")[0][0] for server in (master, replica)]
        sums = [server.execute(f"CHECKSUM TABLE {table}")[0][1] for server in (master, replica)]
        print(f"  {table:18} {counts[0]:<12} {counts[1]:<13} {sums[0]:<16} {sums[1]}")


# -- side by side: a direct replica with relay_log_recovery=1 and the relay, killed at the same moment ---------------


def _relay_logs(server) -> dict[str, int]:
    """The replica's relay-log files on disk and their sizes."""
    return {p.name: p.stat().st_size for p in sorted(server.datadir.glob("relay-bin.[0-9]*"))}


def _relay_log_digests(server) -> dict[str, str]:
    """The replica's relay-log files and the SHA-256 of their bytes: a file kept from before the crash has the same
    name and bytes; one created again under a reused name (the index rewritten at the restart) does not."""
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(server.datadir.glob("relay-bin.[0-9]*"))}


def _master_distance(master, a: tuple[str, int], b: tuple[str, int]) -> int:
    """Bytes of the master's binlog from coordinates ``a`` to ``b`` (b >= a), across rotations."""
    if b <= a:
        return 0
    sizes = {p.name: p.stat().st_size for p in master.binlog_files()}
    names = sorted(sizes)
    if a[0] == b[0]:
        return b[1] - a[1]
    total = sizes[a[0]] - a[1]
    for name in names[names.index(a[0]) + 1 : names.index(b[0])]:
        total += sizes[name]
    return total + b[1]


def _prefix_digests(relay_dir: Path) -> dict[str, bytes]:
    return {name: (relay_dir / name).read_bytes() for name in DU.read_index(relay_dir)}


@pytest.mark.server
def test_side_by_side_kill9_direct_replica_with_relay_log_recovery_and_relay(mariadb, relays):
    """The usual stack and the relay, killed at the same moment mid-load, mid a 24 MB transaction, after the direct
    replica's SQL thread lagged (its IO thread kept receiving): a direct MariaDB replica (GTID, relay_log_recovery=1)
    throws away every relay-log byte its SQL thread had not applied and downloads it again from the master; the relay
    keeps its files up to its durable horizon (a byte-identical prefix of the master's files) and fetches only the cut
    tail. Both end equal to the master: CHECKSUM TABLE, every Writer transaction and every big row exactly once."""
    master = mariadb("master")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.big (id INT PRIMARY KEY, b LONGTEXT) ENGINE=InnoDB")
    relay = relays("relay", master.port, gtid_mode="mariadb")
    behind = _start_replica(mariadb, relay, gtid=True)
    direct = mariadb("direct", server_id=4, extra_config={"relay_log_recovery": 1, "relay_log_purge": 1})
    change_master(direct, master.port, file=None)
    direct.execute("START SLAVE")
    with Writer(master, rotate_every=200) as writer:
        time.sleep(1.0)
        wait_replica(direct, master, under_load=True)
        # The direct replica lags: its SQL thread stops (a long query, a slow apply), its IO thread goes on receiving.
        direct.execute("STOP SLAVE SQL_THREAD")
        time.sleep(2.0)
        d_status = replica_status(direct)  # its SQL thread is stopped: "applied" stays put until the kill
        d_logs = _relay_logs(direct)
        r_status = relay.status()
        _start_big_transaction_and_wait_for_its_tail(master, relay, 1)
        # Both at the same moment, while the big transaction streams (SIGKILL to both, then reap).
        os.kill(direct.pid, signal.SIGKILL)
        relay.proc.send_signal(signal.SIGKILL)
        direct.kill()
        relay.kill9()
        master_at_kill = master_status(master)
        r_mark, _ = DU.read_durable_mark(relay.relay_dir)
        r_on_disk = _prefix_digests(relay.relay_dir)  # what the killed relay left (kill -9 keeps written bytes)
        names = DU.read_index(relay.relay_dir)
        plan = R.plan_recovery(relay.relay_dir, names, epochs=R.read_epochs(relay.relay_dir), mark=r_mark)
        kept = (plan.tail.name, plan.tail.end)  # what recovery will keep (the plan only reads)
        d_on_disk = _relay_logs(direct)
        d_contents = _relay_log_digests(direct)  # names alone do not tell: MariaDB may number new relay logs again

        since = _log_size(relay)
        relay.start()
        direct.start()
        d_after = replica_status(direct)  # before START SLAVE: what relay_log_recovery made of the relay logs
        d_logs_after = _relay_logs(direct)
        direct.execute("START SLAVE")
        r_after = relay.status()
        time.sleep(1.0)
    for thread in _big_threads:
        thread.join(60)
    _big_threads.clear()

    # The direct replica: what it had received, what it had applied, what relay_log_recovery kept.
    received = _coords(d_status["Master_Log_File"], d_status["Read_Master_Log_Pos"])  # before the big transaction
    applied = _coords(d_status["Relay_Master_Log_File"], d_status["Exec_Master_Log_Pos"])
    restart_from = _coords(d_after["Master_Log_File"], d_after["Read_Master_Log_Pos"])
    d_bytes_before, d_bytes_after = sum(d_on_disk.values()), sum(d_logs_after.values())
    d_big_part = d_on_disk[max(d_on_disk)] - d_logs.get(max(d_on_disk), 0)  # what it had of the big transaction
    complete_thrown_away = _master_distance(master, restart_from, received)  # whole transactions, never applied
    thrown_away = complete_thrown_away + d_big_part
    # The relay: its horizon before the kill, what recovery kept, what it must fetch again.
    horizon_before = _coords(r_status["master_log_file"], r_status["read_master_log_pos"])
    horizon_after = _coords(r_after["master_log_file"], r_after["read_master_log_pos"])
    newest = names[-1]
    r_received = (newest, len(r_on_disk[newest]))
    r_refetch = _master_distance(master, kept, r_received)
    # Complete transactions the relay threw away: the master's binlog (of which the relay's newest file is a byte
    # prefix) scanned up to what the relay had on disk; its last complete transaction ends at good_end, and
    # recovery keeps up to ``kept``.
    master_file = {p.name: p for p in master.binlog_files()}[newest]
    with open(master_file, "rb") as f:
        complete_end = scan_bytes(f.read(r_received[1])).good_end
    r_complete_thrown_away = complete_end - kept[1]
    reports = _recovery_reports(relay, since)
    print(f"\nkilled both at master {master_at_kill[0]}:{master_at_kill[1]}, mid a {BIG_ROWS * BIG_ROW_BYTES >> 20} MB "
          f"transaction\n"
          f"direct replica (relay_log_recovery=1): received up to {received[0]}:{received[1]}, applied up to "
          f"{applied[0]}:{applied[1]} before the big transaction, then {d_big_part} bytes of it; relay logs at the kill "
          f"{d_on_disk} ({d_bytes_before} bytes)\n"
          f"  after restart: IO thread restarts from {restart_from[0]}:{restart_from[1]} (Relay_Log_File "
          f"{d_after['Relay_Log_File']} Relay_Log_Pos {d_after['Relay_Log_Pos']}), relay logs {d_logs_after} "
          f"({d_bytes_after} bytes, the old ones no longer read): {thrown_away} bytes of the master's binlog thrown "
          f"away and downloaded again: {complete_thrown_away} of complete transactions, {d_big_part} of the big one\n"
          f"relay: horizon {horizon_before[0]}:{horizon_before[1]} before the kill, durable mark "
          f"{r_mark.file}:{r_mark.position}, {r_received[1]} bytes of {newest} on disk; recovery keeps {kept[0]}:{kept[1]} "
          f"({reports[0] if reports else '?'}), a moment after restart the horizon is {horizon_after[0]}:"
          f"{horizon_after[1]}: fetches {r_refetch} bytes again, the unfinished transaction; {r_complete_thrown_away} bytes of "
          f"complete transactions (the last complete one on disk ends at {newest}:{complete_end})")

    # Properties of the usual stack (MariaDB's documented relay_log_recovery behaviour): the relay logs it had are
    # not read again (its SQL thread starts in a new relay log at 4), and its IO thread restarts from what the SQL
    # thread had applied, not from what it had received.
    assert d_after["Relay_Log_File"] not in d_on_disk and int(d_after["Relay_Log_Pos"]) == 4, d_after
    assert restart_from == applied < received, (restart_from, applied, received)
    assert complete_thrown_away > 0, "the lagging direct replica threw nothing away: the comparison shows nothing"
    assert complete_thrown_away == _master_distance(master, applied, received), (applied, received)
    # Properties of the relay: nothing durable lost, the kept files a byte-identical prefix of what it had, nothing
    # fetched again but the tail past the horizon.
    assert kept >= horizon_before and horizon_after >= horizon_before, (horizon_before, kept, horizon_after)
    assert _coords(r_mark.file, r_mark.position) <= kept, (r_mark, kept)
    assert kept[0] == newest, f"recovery would drop whole files: {names} -> {kept}"
    for name, data in r_on_disk.items():
        now = (relay.relay_dir / name).read_bytes()
        keep = len(data) if name != newest else kept[1]
        assert now[:keep] == data[:keep], f"{name}: recovery changed bytes it had to keep (first {keep})"
    # Recovery cuts only an unfinished group (no complete transaction is thrown away), never damage.
    assert plan.tail.kind in (R.WHOLE, R.PARTIAL), (plan.tail.kind, plan.tail.detail)
    assert r_complete_thrown_away == 0, (
        f"recovery cut {r_complete_thrown_away} bytes of complete transactions ({newest}: kept {kept[1]}, the last "
        f"complete transaction on disk ends at {complete_end})")
    assert r_refetch > 0, "the relay had nothing of the big transaction when killed: the comparison shows nothing"

    # The end: both replicas equal the master, every transaction exactly once.
    for replica in (direct, behind):
        wait_replica(replica, master, timeout=120)
        assert_same_data(master, replica)
        _assert_writer_rows(replica, writer)
        assert replica.execute("SELECT COUNT(*), COUNT(DISTINCT id), SUM(LENGTH(b)) FROM app.big")[0] == (
            BIG_ROWS, BIG_ROWS, BIG_ROWS * BIG_ROW_BYTES)
        assert replica.execute("SELECT @@gtid_slave_pos")[0][0] == master.execute("SELECT @@gtid_binlog_pos")[0][0]
    kept_logs = set(_relay_log_digests(direct).items()) & set(d_contents.items())
    assert not kept_logs, f"the direct replica kept its pre-crash relay logs: {sorted(n for n, _ in kept_logs)}"
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))
    print(f"end: writer committed {writer.done} transactions; both replicas equal the master (CHECKSUM TABLE, "
          f"{writer.done} unique writer ids, {BIG_ROWS} big rows); relay files equal the master's")


# -- kill -9 ------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_relay_kill9_at_random_points_nothing_lost(mariadb, relays):
    """kill -9 at random moments under load, right after a restart, while the replica's dump catches up on a
    backlog, and with part of a 24 MB transaction on disk (recovery must cut it): after each restart the horizon is at least where it was (kill -9 keeps every written byte, so nothing
    good is thrown away), the replica never has more than the relay advertised, and at the end the replica equals
    the master (every Writer transaction exactly once) and the relay files equal the master's."""
    rng = _rng("kill9")
    master, relay, replica = _loaded_chain(mariadb, relays, gtid=True)

    master.execute("CREATE TABLE app.big (id INT PRIMARY KEY, b LONGTEXT) ENGINE=InnoDB")
    kinds = ["under-load"] * 4 + ["right-after-start"] * 3 + ["during-replica-dump"] * 3 + ["mid-big-transaction"] * 2
    rng.shuffle(kinds)
    big_id = 1
    rows = []
    with Writer(master, rotate_every=80) as writer:
        for round_no, kind in enumerate(kinds):
            if kind == "mid-big-transaction":
                # Read first (the horizon only grows, so it stays a lower bound), then kill the moment part of
                # the big transaction is on disk.
                seen_by_replica = _replica_read(replica)
                before = relay.status()
                delay = _start_big_transaction_and_wait_for_its_tail(master, relay, big_id)
                big_id += BIG_ROWS
            elif kind == "during-replica-dump":
                replica.execute("STOP SLAVE")
                time.sleep(rng.uniform(0.3, 0.8))  # a backlog builds up on the relay
                replica.execute("START SLAVE")
                relay.wait_for(lambda s: any(r["server_id"] == 3 and r["events_sent"] for r in s["replicas"]),
                               30, "the replica's dump to start")
                delay = rng.uniform(0.0, 0.2)
            elif kind == "right-after-start":
                relay.kill9()
                relay.start()
                delay = rng.uniform(0.0, 0.05)
            else:
                delay = rng.uniform(0.05, 0.6)
            if kind != "mid-big-transaction":
                time.sleep(delay)
                seen_by_replica = _replica_read(replica)
                before = relay.status()
            horizon_before = _coords(before["master_log_file"], before["read_master_log_pos"])
            assert _received_within(seen_by_replica, horizon_before, relay.relay_dir), (seen_by_replica, horizon_before)
            relay.kill9()
            since = _log_size(relay)
            relay.start()
            after = relay.status()
            horizon_after = _coords(after["master_log_file"], after["read_master_log_pos"])
            assert horizon_after >= horizon_before, f"durable data lost by kill -9: {horizon_before} -> {horizon_after}"
            reports = _recovery_reports(relay, since)
            rows.append((round_no, kind, delay, horizon_before, horizon_after, seen_by_replica,
                         reports[0] if reports else "?"))
            time.sleep(rng.uniform(0.2, 0.5))  # let it stream (and the replica reconnect) before the next kill
    print("round kind                 kill after  horizon before kill          horizon after restart        "
          "replica had                  recovery")
    for round_no, kind, delay, hb, ha, seen, report in rows:
        print(f"{round_no:5} {kind:20} {delay:9.3f}s  {hb[0]}:{hb[1]:<10} {ha[0]}:{ha[1]:<10} "
              f"{seen[0] or '-'}:{seen[1]:<10} {report}")
    print(f"writer committed {writer.done} transactions during {len(rows)} kills")
    for thread in _big_threads:
        thread.join(60)
    _big_threads.clear()
    _final_checks(master, relay, replica, writer=writer)
    assert replica.execute("SELECT COUNT(*), SUM(LENGTH(b)) FROM app.big")[0] == (big_id - 1, (big_id - 1) * BIG_ROW_BYTES)


BIG_ROWS = 16
BIG_ROW_BYTES = 1_500_000
_big_threads: list[threading.Thread] = []


def _start_big_transaction_and_wait_for_its_tail(master, relay, first_id: int) -> float:
    """Commit a 24 MB transaction (16 row events of 1.5 MB: each is written straight to the relay file, not
    buffered) from a thread, and return once the relay's newest file holds 2 MB more than before, with the relay
    frozen (SIGSTOP) at that moment: it has part of the transaction on disk and not its end, so the kill the caller
    sends next leaves a partial group for recovery to cut."""

    def commit() -> None:
        conn = master.connect()
        try:
            cur = conn.cursor()
            cur.execute("SET SESSION binlog_format = 'ROW'")
            cur.execute("BEGIN")
            for i in range(BIG_ROWS):
                cur.execute("INSERT INTO app.big VALUES (%s, REPEAT('b', %s))", (first_id + i, BIG_ROW_BYTES))
            cur.execute("COMMIT")
        finally:
            conn.close()

    def newest_size() -> tuple[str, int]:
        name = DU.read_index(relay.relay_dir)[-1]
        try:
            return name, (relay.relay_dir / name).stat().st_size
        except FileNotFoundError:
            return name, 0

    start = time.monotonic()
    name, base = newest_size()
    path = relay.relay_dir / name
    thread = threading.Thread(target=commit, daemon=True)
    _big_threads.append(thread)
    thread.start()
    polls = 0
    while time.monotonic() - start < 20:
        polls += 1
        if polls % 50 == 0 and DU.read_index(relay.relay_dir)[-1] != name:  # the writer rotated meanwhile
            name, base = newest_size()
            path = relay.relay_dir / name
        try:
            if path.stat().st_size - base >= 2 << 20:
                # Frozen at once: on a quiet machine the relay takes the rest of the transaction in a few ms, and
                # the callers' kill came too late once in CI (the relay had all of it: nothing to cut).
                os.kill(relay.proc.pid, signal.SIGSTOP)
                break
        except FileNotFoundError:
            pass
        time.sleep(0.0005)
    return time.monotonic() - start


# -- simulated OS crash ------------------------------------------------------------------------------------------


def _freeze(relay) -> None:
    """SIGSTOP the relay and wait until it is really stopped: the signal is delivered asynchronously, and a relay
    still running for a moment could write (and publish) more after the harness read its state."""
    os.kill(relay.proc.pid, signal.SIGSTOP)
    stat = Path(f"/proc/{relay.proc.pid}/stat")
    deadline = time.monotonic() + 10
    while stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, "the relay did not stop on SIGSTOP"
        time.sleep(0.001)


def _durable_state(relay_dir: Path) -> tuple[list[str], DU.DurableMark]:
    """The index and the durable mark, read while the relay is frozen. The store writes the mark only after the
    fsync that made it durable and before it publishes the horizon, so the mark is at once a lower bound of what
    is fsynced and an upper bound of what any replica can have been sent; files before the mark's file were
    fsynced whole before the next one was created."""
    names = DU.read_index(relay_dir)
    mark, problem = DU.read_durable_mark(relay_dir)
    assert mark is not None and problem is None, problem
    assert mark.file in names, (mark, names)
    return names, mark


def _os_crash(relay_dir: Path, names: list[str], mark: DU.DurableMark, rng: random.Random) -> dict:
    """Turn the files of a killed relay into what an OS crash could leave: the mark's file cut anywhere at or past
    the mark (bytes past the last fsync may or may not have reached the disk), possibly with garbage after it
    (stale blocks, zeros); a file created after it keeps at least its fsynced magic. Earlier files are whole.
    A file the relay created but had not yet named in its index (frozen between the two) counts as the newest:
    start_file fsynced the file before it whole, and recovery adopts it."""
    base = names[-1].rsplit(".", 1)[0]
    names = names + sorted(p.name for p in relay_dir.glob(f"{base}.*")
                           if p.name.rsplit(".", 1)[1].isdigit() and p.name > names[-1])
    at = names.index(mark.file)
    done = {"file": mark.file, "durable": mark.position}
    for name in names[at:]:
        path = relay_dir / name
        size = path.stat().st_size
        if name != names[-1]:
            # A newer file exists: start_file fsynced this one whole before creating it.
            done.update(size=size, kept=size, garbage=0)
            continue
        floor = mark.position if name == mark.file else 4
        keep = rng.randint(min(floor, size), size)
        garbage = b""
        if rng.random() < 0.6:
            n = rng.randint(1, 3000)
            garbage = bytes(n) if rng.random() < 0.3 else rng.randbytes(n)
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.seek(keep)
            f.write(garbage)
        if name == mark.file:
            done.update(size=size, kept=keep, garbage=len(garbage))
        else:
            done.setdefault("later", []).append((name, size, keep, len(garbage)))
    return done


@pytest.mark.server
def test_simulated_os_crash_only_fsynced_bytes_survive(mariadb, relays):
    """Freeze the relay under load, check the replica holds nothing past the durable mark, kill it, cut its newest
    file to a random length at or past the mark and append garbage (debris: this trusts the mark, see the module
    doc and tests/relay/test_crash_simulation.py for the crash that does not), restart: recovery keeps everything durable
    (horizon >= mark), cuts only the debris, refetches the rest; a file/position replica resumes from where it
    was (it never got anything the relay lost) and ends equal to the master; the files equal the master's."""
    rng = _rng("os-crash")
    master, relay, replica = _loaded_chain(mariadb, relays, gtid=False)

    rows = []
    with Writer(master, rotate_every=60) as writer:
        for round_no in range(8):
            time.sleep(rng.uniform(0.1, 0.7))
            _freeze(relay)
            names, mark = _durable_state(relay.relay_dir)
            seen_by_replica = _replica_read(replica)  # the relay is frozen: it can send nothing more
            assert _received_within(seen_by_replica, _coords(mark.file, mark.position), relay.relay_dir), (
                f"the replica received {seen_by_replica}, past what was durable {mark}")
            relay.kill9()
            assert _durable_state(relay.relay_dir) == (names, mark), "the frozen relay wrote after all"
            crash = _os_crash(relay.relay_dir, names, mark, rng)
            since = _log_size(relay)
            relay.start()
            status = relay.status()
            recovered = _coords(status["master_log_file"], status["read_master_log_pos"])
            assert recovered >= _coords(mark.file, mark.position), f"durable data lost: {mark} -> {recovered}"
            reports = _recovery_reports(relay, since)
            rows.append((round_no, crash, recovered, seen_by_replica, reports[0] if reports else "?"))
            time.sleep(rng.uniform(0.2, 0.4))
    print("round file               fsynced  size     kept     garbage  recovered horizon           replica had"
          "                  recovery")
    for round_no, c, rec, seen, report in rows:
        print(f"{round_no:5} {c['file']:18} {c['durable']:<8} {c['size']:<8} {c['kept']:<8} {c['garbage']:<8} "
              f"{rec[0]}:{rec[1]:<10} {seen[0] or '-'}:{seen[1]:<10} {report}"
              + (f" later files {c['later']}" if c.get("later") else ""))
    print(f"writer committed {writer.done} transactions during {len(rows)} simulated OS crashes")
    _final_checks(master, relay, replica, writer=writer)


ROTATION_STATES = {
    "header-only+garbage": "file N+1 listed with its header events, garbage after them",
    "magic-only": "file N+1 listed with only its fsynced magic (crash before its FDE was fsynced)",
    "created-unlisted-empty": "file N+1 created, empty, not yet in the index (crash inside start_file)",
    "created-unlisted-partial-magic": "file N+1 with 2 bytes of magic, not in the index",
    "created-unlisted-debris": "file N+1 not in the index, its magic then debris (seen in CI: the relay stopped "
                               "with 'already exists' when the stream reached N+1)",
    "not-created": "file N+1 never created: N (with its ROTATE) is the newest file",
}


@pytest.mark.server
def test_simulated_os_crash_at_rotation_boundary(mariadb, relays):
    """At a rotation: file N closed (ends with the master's ROTATE, fsynced), file N+1 just started. Each state a
    crash there can leave is recovered without losing N, the relay refetches N+1 from the master and a replica
    started afterwards ends equal to the master."""
    rng = _rng("rotation")
    master, relay, replica = _loaded_chain(mariadb, relays, gtid=True)
    master.execute("CREATE TABLE app.r (id INT PRIMARY KEY, state VARCHAR(40)) ENGINE=InnoDB")
    next_id = 1
    rows = []
    for state in ROTATION_STATES:
        for _ in range(rng.randint(1, 4)):
            master.execute("INSERT INTO app.r VALUES (%s, %s)", (next_id, state))
            next_id += 1
        wait_relay(relay, master)
        wait_replica(replica, master)
        replica.execute("STOP SLAVE")  # it must not see N+1 before the crash: the states below predate it
        master.execute("FLUSH BINARY LOGS")
        wait_relay(relay, master)
        names = DU.read_index(relay.relay_dir)
        older, newer = names[-2], names[-1]
        relay.kill9()  # the master is quiet: the relay had nothing more to write
        d = relay.relay_dir
        older_size = (d / older).stat().st_size
        newer_size = (d / newer).stat().st_size
        assert R.read_final_rotate(d / older) == (newer, 4), f"{older} is not closed by a ROTATE to {newer}"
        if state == "header-only+garbage":
            with open(d / newer, "ab") as f:
                f.write(rng.randbytes(rng.randint(1, 500)))
        elif state == "magic-only":
            os.truncate(d / newer, 4)
            (d / LA.DURABLE_MARK_NAME).write_bytes(DU.encode_durable_mark(newer, 4))
        else:
            DU.write_index(d, names[:-1])
            (d / LA.DURABLE_MARK_NAME).write_bytes(DU.encode_durable_mark(older, older_size))
            if state == "created-unlisted-empty":
                os.truncate(d / newer, 0)
            elif state == "created-unlisted-partial-magic":
                os.truncate(d / newer, 2)
            elif state == "created-unlisted-debris":
                os.truncate(d / newer, 4)
                with open(d / newer, "ab") as f:
                    f.write(rng.randbytes(rng.randint(23, 1500)))
            else:
                os.unlink(d / newer)
        since = _log_size(relay)
        relay.start()
        status = relay.status()
        recovered = _coords(status["master_log_file"], status["read_master_log_pos"])
        assert recovered >= _coords(older, older_size), f"{state}: lost the closed file {older}: {recovered}"
        assert (d / older).stat().st_size == older_size
        reports = _recovery_reports(relay, since)
        if state == "created-unlisted-debris":
            assert (d / LA.UNADOPTED_DIR / f"{newer}.1").stat().st_size > 4, f"{state}: {newer} not kept aside"
        for _ in range(rng.randint(1, 3)):
            master.execute("INSERT INTO app.r VALUES (%s, %s)", (next_id, state + " after"))
            next_id += 1
        wait_relay(relay, master)
        replica.execute("START SLAVE")
        wait_replica(replica, master)
        rows.append((state, older, older_size, newer, newer_size, recovered, reports[0] if reports else "?"))
    print("state                            closed file (bytes)          new file (bytes)       recovered horizon"
          "          recovery")
    for state, older, older_size, newer, newer_size, rec, report in rows:
        print(f"{state:32} {older}:{older_size:<10} {newer}:{newer_size:<6} {rec[0]}:{rec[1]:<8} {report}")
    _final_checks(master, relay, replica)
    assert replica.execute("SELECT COUNT(*), COUNT(DISTINCT id), MAX(id) FROM app.r")[0] == (
        next_id - 1, next_id - 1, next_id - 1)


# -- full disk ----------------------------------------------------------------------------------------------------


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a {size} tmpfs on {path} for the full-disk test: {done.stderr.strip()} "
                    "(needs root or CAP_SYS_ADMIN)", pytrace=False)


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(path: Path, leave: int) -> int:
    """A filler file that leaves about ``leave`` bytes free (0: until ENOSPC); returns its size."""
    written = 0
    target = max(_free_bytes(path) - leave, 0)
    chunk = b"\xaa" * 65536
    with open(path / "filler", "ab", buffering=0) as f:
        try:
            while leave == 0 or written < target:
                n = min(len(chunk), target - written) if leave else len(chunk)
                written += f.write(chunk[:n])
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        if leave == 0:
            try:  # the last partial page
                while True:
                    written += f.write(b"\xaa")
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return written


def _insert_batch(master, first_id: int, transactions: int, *, rows: int = 4, pad: int = 1500) -> int:
    conn = master.connect()
    try:
        cur = conn.cursor()
        cur.execute("SET SESSION binlog_format = 'ROW'")  # the padding goes into the binlog
        next_id = first_id
        for _ in range(transactions):
            cur.execute("BEGIN")
            for _ in range(rows):
                cur.execute("INSERT INTO app.d (id, pad) VALUES (%s, REPEAT('p', %s))", (next_id, pad))
                next_id += 1
            cur.execute("COMMIT")
        return next_id
    finally:
        conn.close()


def _wait_disk_full_error(relay, timeout: float = 30.0) -> dict:
    return relay.wait_for(lambda s: "No space left on device" in (s["last_io_error"] or ""), timeout,
                          "the relay to report the full disk")


def _wait_resumed(relay, master, timeout: float = 60.0) -> dict:
    """The relay catches up by itself once space returns: horizon at the master's position (read afresh) and the
    store error cleared."""
    return relay.wait_for(
        lambda s: s["last_io_error"] is None
        and (s["master_log_file"], s["read_master_log_pos"]) == master_status(master),
        timeout, "the relay to resume and catch up after space returned")


def _check_full_disk_period(relay, replica, master, connection_id: int, label: str) -> dict:
    """While the disk is full: a clear error naming the directory; the horizon stays put; the replica stays
    connected (same dump connection) and gets everything up to the horizon, nothing past it."""
    status = _wait_disk_full_error(relay)
    error = status["last_io_error"]
    assert f"'{relay.relay_dir}/" in error, f"the error must name the file in the relay directory: {error}"
    # Recovery at the first reopen may keep complete transactions that reached the file before ENOSPC: let the
    # retries settle, then the horizon must stay where it is while the disk stays full.
    time.sleep(1.5)
    settled = relay.status()
    failures_before = settled["store_failures"]
    horizon = (settled["master_log_file"], settled["read_master_log_pos"], settled["retrieved_gtid_set"])
    for _ in range(6):
        time.sleep(0.4)
        now = relay.status()
        assert (now["master_log_file"], now["read_master_log_pos"], now["retrieved_gtid_set"]) == horizon
        assert "No space left on device" in (now["last_io_error"] or ""), now["last_io_error"]
    assert now["store_failures"] > failures_before, "the relay does not retry while the disk is full"
    assert master_status(master) > horizon[:2], "the master must be ahead: the relay could not store the rest"
    # Everything durable reaches the replica, over the same dump connection.
    deadline = time.monotonic() + 30
    while replica.execute("SELECT @@gtid_slave_pos")[0][0] != horizon[2]:
        assert time.monotonic() < deadline, (replica.execute("SELECT @@gtid_slave_pos")[0][0], horizon)
        time.sleep(0.1)
    rstatus = replica_status(replica)
    assert rstatus["Slave_IO_Running"] == "Yes" and not rstatus["Last_IO_Error"], rstatus
    seen = _coords(rstatus["Master_Log_File"], rstatus["Read_Master_Log_Pos"])
    assert _received_within(seen, _coords(*horizon[:2]), relay.relay_dir), (seen, horizon)
    assert rstatus["Gtid_IO_Pos"] == horizon[2], (rstatus["Gtid_IO_Pos"], horizon)
    conns = [r["connection_id"] for r in relay.status()["replicas"] if r["server_id"] == 3]
    assert conns == [connection_id], f"the replica's dump connection changed: {conns} (was {connection_id})"
    advertised = relay_sql(relay, "SHOW MASTER STATUS")[0]
    assert (advertised[0], int(advertised[1])) == horizon[:2]
    print(f"{label}: error {error!r}\n  horizon held at {horizon[0]}:{horizon[1]} gtid {horizon[2]} "
          f"(master at {master_status(master)}); replica gtid {horizon[2]} rows "
          f"{replica.execute('SELECT COUNT(*) FROM app.d')[0][0]} vs master "
          f"{master.execute('SELECT COUNT(*) FROM app.d')[0][0]}; retries {now['store_failures'] - failures_before} "
          f"in {6 * 0.4:.1f}s")
    return now


@pytest.mark.server
def test_full_disk_stops_cleanly_serves_durable_resumes(mariadb, relays, tmp_path):
    """A 16 MB tmpfs relay directory filled to a few KB free, then (second round) to the last byte right before a
    rotation: each time the relay stops receiving with "No space left on device" naming its directory, its
    horizon stays at the last durable transaction, the connected replica keeps its dump connection and gets
    everything durable, the relay retries, and when the filler goes it resumes by itself; at the end the replica
    equals the master and the relay files equal the master's."""
    relay_dir = tmp_path / "relay"
    _mount_tmpfs(relay_dir, "16m")
    relay = None
    try:
        master = mariadb("master")
        prepare_master(master)
        master.execute("CREATE DATABASE app")
        master.execute("CREATE TABLE app.d (id INT PRIMARY KEY, pad TEXT) ENGINE=InnoDB")
        relay = relays("relay", master.port, gtid_mode="mariadb")
        next_id = _insert_batch(master, 1, 30)
        wait_relay(relay, master)
        replica = _start_replica(mariadb, relay, gtid=True)
        wait_replica(replica, master)
        connection_id = next(r["connection_id"] for r in relay.status()["replicas"] if r["server_id"] == 3)

        # Round 1: a few KB free, then more transactions than fit.
        filler = _fill(relay_dir, leave=24 << 10)
        print(f"round 1: filler {filler} bytes, {_free_bytes(relay_dir)} bytes left on the relay's tmpfs")
        next_id = _insert_batch(master, next_id, 20)
        _check_full_disk_period(relay, replica, master, connection_id, "round 1 (mid-stream)")
        next_id = _insert_batch(master, next_id, 5)  # the master goes on meanwhile
        os.unlink(relay_dir / "filler")
        _wait_resumed(relay, master)
        wait_replica(replica, master)
        assert_same_data(master, replica)

        # Round 2: the disk full to the last byte, then the master rotates: the ROTATE or the new file's creation
        # (its magic, its header events) cannot be written.
        filler = _fill(relay_dir, leave=0)
        print(f"round 2: filler {filler} bytes, {_free_bytes(relay_dir)} bytes left")
        master.execute("FLUSH BINARY LOGS")
        next_id = _insert_batch(master, next_id, 3)
        _check_full_disk_period(relay, replica, master, connection_id, "round 2 (at a rotation)")
        os.unlink(relay_dir / "filler")
        _wait_resumed(relay, master)

        next_id = _insert_batch(master, next_id, 5)
        _final_checks(master, relay, replica)
        assert replica.execute("SELECT COUNT(*), COUNT(DISTINCT id), MAX(id) FROM app.d")[0] == (
            next_id - 1, next_id - 1, next_id - 1)
        conns = [r["connection_id"] for r in relay.status()["replicas"] if r["server_id"] == 3]
        assert conns == [connection_id], "the replica was disconnected during the full-disk periods"
        log = relay.log_path.read_text(errors="replace")
        assert "No space left on device" in log and "relay store writes again" in log
    finally:
        if relay is not None:
            relay.stop()
        _umount(relay_dir)


# -- ENOSPC / EIO at every write and fsync (store level, no server) ----------------------------------------------


class _FailOnce:
    """Counts the store's file-system calls that can fail for lack of space or an I/O error (writes, fsyncs, file
    creation) and makes call number ``fail_at`` raise ``error``; every other call is real."""

    def __init__(self, monkeypatch, fail_at: int | None, error: int):
        self.calls = 0
        self.fail_at = fail_at
        self.error = error
        self.failed_call: str | None = None
        for name in ("pwrite", "write", "fsync", "fdatasync", "open"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def call(*args, **kw):
            if name == "open" and not (args[1] & os.O_CREAT):
                return real(*args, **kw)
            self.calls += 1
            if self.calls == self.fail_at:
                self.failed_call = name
                raise OSError(self.error, os.strerror(self.error))
            return real(*args, **kw)

        return call


def _two_file_stream():
    first = mysql_image("binlog.000002", groups=5)
    second = mysql_image("binlog.000003", rotate=False, groups=4, start=scan_bytes(first).gtids_after)
    return [("binlog.000001", first), ("binlog.000002", second)]


def _feed_from(store: RelayStore, files, file: str | None, position: int) -> None:
    """What the session does after a reconnect: the master re-sends from the horizon (whole groups), rotating."""
    names = [name for name, _ in files]
    start = names.index(file) if file in names else 0
    for name, image in files[start:]:
        if store.current_file != name:
            store.start_file(name)
        feeder = Feeder(store)
        pos = position if name == file else 4
        for offset, event in split_events(image):
            if offset >= pos:
                feeder.feed(offset, event)
            else:  # the session's parser has seen the file's FORMAT_DESCRIPTION (checksums) in its preamble
                feeder.parser.feed_event(event, 0)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_write_or_fsync_failure_at_every_call_loses_nothing(tmp_path, monkeypatch, error):
    """Fail each write / fsync / file creation of a two-file stream in turn (data, file header, magic, index,
    durable mark): the store never publishes past what is fsynced, reopening keeps every published transaction,
    and resuming from the horizon ends with files byte-identical to the master's."""
    files = _two_file_stream()
    counter = _FailOnce(monkeypatch, None, error)
    clean = tmp_path / "clean"
    store = RelayStore.open(clean)
    _feed_from(store, files, None, 4)
    store.close()
    total = counter.calls
    monkeypatch.undo()
    assert total > 30, total
    outcomes: dict[str, int] = {}
    for fail_at in range(1, total + 1):
        d = tmp_path / f"k{fail_at}"
        counter = _FailOnce(monkeypatch, fail_at, error)
        store = None
        published = None
        try:
            store = RelayStore.open(d)
            _feed_from(store, files, None, 4)
        except (OSError, RelayStoreError) as exc:
            if store is not None:
                published = store.horizon.snapshot()
                assert store.failure is exc or store.failure is exc.__cause__, exc
                assert store.failure.errno == error and store.failure.filename, "the error must name the file"
        finally:
            monkeypatch.undo()  # space returns
        if store is not None:
            try:
                store.close()
            except (OSError, RelayStoreError):
                store.close()  # the cut after a failed fsync is retried
        reopened = RelayStore.open(d)
        snap = reopened.horizon.snapshot()
        if published is not None and published.file is not None:
            assert _coords(snap.file, snap.position) >= _coords(published.file, published.position), (
                f"call {fail_at} ({counter.failed_call}): published {published.coordinates}, reopened at "
                f"{snap.coordinates}")
            if counter.failed_call == "fdatasync":
                # The bytes after the last successful fsync may never reach the disk: they were cut, not trusted.
                assert snap.coordinates == published.coordinates, (fail_at, published.coordinates, snap.coordinates)
        _feed_from(reopened, files, snap.file, snap.position)
        reopened.close()
        for name, image in files:
            assert (d / name).read_bytes() == image, f"call {fail_at} ({counter.failed_call}): {name} differs"
        assert DU.read_index(d) == [name for name, _ in files]
        outcomes[counter.failed_call or "none"] = outcomes.get(counter.failed_call or "none", 0) + 1
        shutil.rmtree(d)
    print(f"{os.strerror(error)} injected at each of {total} calls: {outcomes}; every run ended byte-identical")
