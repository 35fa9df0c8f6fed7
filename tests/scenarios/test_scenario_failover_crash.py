"""Crash safety of the switch. The relay is killed with kill -9 at each point of a repoint
(docs/failover.md, "Crash safety of the switch") and restarted with its ORIGINAL command line (--master still
names M1, which is dead); it comes back consistent, following the master last chosen, nothing lost or repeated.

Each kill point has its own FailoverLab (lab/failover.py: M1, candidate R1, the relay as a real process, R2 behind
it by GTID, R3 by file/position). M1 dies while a large transaction is half sent, R1 is promoted, then the relay
is repointed with STOP SLAVE / CHANGE MASTER TO / START SLAVE and killed:

  (a) right after STOP SLAVE answered. A server's STOP SLAVE does not survive its restart (MariaDB and MySQL
      start the replication threads at startup unless skip_slave_start), and no CHANGE MASTER was made: the
      restarted relay connects again to the master in force, M1 (dead, refused), reports that in Last_IO_Error
      and writes nothing; the operator's STOP / CHANGE / START then switches it as usual;
  (b) right after CHANGE MASTER answered, before START SLAVE: the choice was durable, the restarted relay
      follows R1 without a START SLAVE (the threads start at startup);
  (c) right after START SLAVE answered (connecting); after the epoch record (held on a fault proxy right after
      R1's first event of the dump, the epoch recorded and the ROTATE into its first file written), with R1's
      identity saved in relayproxy.master.json or not yet; after the join with R1 idle, R1 rotating before the
      restart (the relay then resumes by position over R1's copies of M1's transactions: this found a bug,
      fixed in upstream/receiver.py): the restart completes the switch;
  (d) in the middle of R1's first transaction (a fault proxy between R1 and the relay holds the stream there,
      after the relay wrote more than its flush threshold of it to the file): recovery cuts the partial
      transaction, the relay fetches it again whole;
  (e) random instants in the first seconds after START SLAVE while R1 takes writes (seed printed; set
      RELAYPROXY_CRASH_SEED to replay).

After each: more writes on R1; R2 and R3 converge to R1 with every insert exactly once; the relay's files are one
monotonic sequence with exactly 2 epochs (a restart never begins another epoch for the same master), epoch 2
joined at the GTID set the survivors held; the files written before the switch are unchanged byte for byte (the
last one only gained the relay's ROTATE); SHOW SLAVE STATUS and /status show R1 and no error.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.events import HEADER
from relayproxy.lab.failover import (
    SCHEMA,
    FailoverLab,
    HeldLink,
    change_master_sql,
    covers,
    promote,
    relay_sql,
    repoint_relay,
    slave_pos,
    wait_until,
)
from relayproxy.lab.faultproxy import ThreadedFaultProxy
from relayproxy.lab.harness import master_status, replica_status
from relayproxy.lab.packetwatch import MysqlStreamWatcher
from relayproxy.lab.story import MidTransactionHold
from relayproxy.relay.store import FLUSH_BYTES

from .test_scenario_failover import (
    assert_file_replica_at_relay_end,
    assert_one_file_sequence,
    assert_same_everywhere,
    file_bytes,
    relay_epochs,
    relay_slave_status,
)

pytestmark = pytest.mark.server

TIMEOUT = 60.0
M1_BIG_BYTES = 512 << 10  # M1's transaction cut in half by its death
ROW_BYTES = 4000
# R1's first transaction in (d): 1.5 times the store's flush threshold, held at 1.25 times it, so more than the
# threshold of it has reached the relay's file (written, not durable) when the relay is killed.
FIRST_TRX_ROWS = FLUSH_BYTES * 3 // 2 // ROW_BYTES
HOLD_AT = FLUSH_BYTES * 5 // 4
SEED = int(os.environ.get("RELAYPROXY_CRASH_SEED") or random.SystemRandom().randrange(1 << 30))


# -- the set-up and the steps ------------------------------------------------------------------------------------


def crashed_lab(tmp_path) -> tuple[FailoverLab, object, dict[str, bytes]]:
    """A started lab whose M1 died mid-transaction, R1 promoted; returns (lab, crash, the relay's files)."""
    lab = FailoverLab(tmp_path / "lab", candidates=1)
    try:
        lab.start()
        lab.m1.execute(f"CREATE TABLE {SCHEMA}.first (pk INT AUTO_INCREMENT PRIMARY KEY, uid BIGINT NOT NULL, "
                       "v VARCHAR(4000) NOT NULL, n INT NOT NULL DEFAULT 0, KEY (uid)) ENGINE=InnoDB")
        lab.load.inserted["first"] = set()  # checked like the load's tables; only (d) writes rows into it
        lab.load.run(lab.m1, 60, rotate_every=25)
        crash = lab.kill_mid_transaction(M1_BIG_BYTES)
        # The relay has dropped the half transaction and is retrying the dead link: its files are settled.
        lab.relay.wait_for(lambda s: s["last_io_error"] and not s["io_running"], TIMEOUT, "the relay to lose M1")
        assert lab.relay.status()["retrieved_gtid_set"] == crash.gtid_before
        promote(lab.r1)
        return lab, crash, file_bytes(lab)
    except BaseException:
        lab.close()
        raise


def kill9_restart(lab: FailoverLab) -> dict:
    """kill -9 the relay, then start it again with its original command line (--master M1's link)."""
    return kill9_restart_after(lab, lambda: None)


def kill9_restart_after(lab: FailoverLab, meanwhile) -> dict:
    """kill -9 the relay, run `meanwhile()`, start the relay again with its original command line; returns what
    the kill left (epochs recorded, identity in relayproxy.master.json, files and sizes)."""
    lab.relay.kill9()
    lab.relay._log.close()  # kill9 leaves the log handle of the old process open
    meanwhile()
    state = {"epochs": len(relay_epochs(lab)), "identity": master_json(lab).get("identity"),
             "files": lab.relay_files()}
    assert f"127.0.0.1:{lab.links['relay'].proxy.port}" in lab.relay.args  # the command line still names M1
    lab.relay.start()
    return state


def master_json(lab: FailoverLab) -> dict:
    path = lab.relay.relay_dir / "relayproxy.master.json"
    return json.loads(path.read_text()) if path.exists() else {}


def r1_link(lab: FailoverLab, name: str = "R1->relay") -> HeldLink:
    """A fault proxy between R1 and the relay (lab.close() stops it with the other links)."""
    proxy = ThreadedFaultProxy(lab.r1.host, lab.r1.port).start()
    link = lab.links[name] = HeldLink(proxy, MidTransactionHold(proxy, name))
    return link


class HoldAfterFirstEvent:
    """Holds the first binlog dump on a proxy right after its first event (the dump's artificial ROTATE)."""

    def __init__(self, proxy: ThreadedFaultProxy) -> None:
        self.proxy = proxy
        self.held: tuple[int, object] | None = None
        self._lock = threading.Lock()
        self._watchers: dict[int, MysqlStreamWatcher] = {}
        proxy.on_server_bytes(self._server_bytes)
        proxy.on_client_bytes(self._client_bytes)

    def _watcher(self, conn_id: int) -> MysqlStreamWatcher:
        return self._watchers.setdefault(conn_id, MysqlStreamWatcher(keep_events=False))

    def _client_bytes(self, conn_id: int, _offset: int, data: bytes) -> None:
        with self._lock:
            self._watcher(conn_id).feed_client(data)

    def _server_bytes(self, conn_id: int, _offset: int, data: bytes) -> None:
        with self._lock:
            events = self._watcher(conn_id).feed(data)
            if events and self.held is None:
                self.proxy.pause_at_stream_offset(events[0].packet_end, on=conn_id)
                self.held = (conn_id, events[0])

    def wait_held(self, timeout: float) -> tuple[int, object]:
        def held():
            with self._lock:
                return self.held
        conn_id, event = wait_until("the dump to be held after its first event", held, timeout)
        self.proxy.wait_for_bytes(event.packet_end, timeout, on=conn_id)
        return conn_id, event


def switch_statements(lab: FailoverLab, port: int, upto: str = "START SLAVE", *, held: bool = False) -> None:
    """STOP SLAVE; CHANGE MASTER TO R1 (at `port`); START SLAVE, one admin session, stopping after `upto`.
    `held`: the stream will be held on a proxy, so a long heartbeat period (the relay takes a master silent
    for two of them as gone, and would reconnect past the hold)."""
    change = change_master_sql(port, **({"heartbeat_period": 20} if held else {}))
    for statement in ("STOP SLAVE", change, "START SLAVE"):
        relay_sql(lab.relay_port, statement)
        if statement.startswith(upto):
            return


class LoadThread:
    """lab.load on R1 in a thread, 20 transactions at a time (FLUSH BINARY LOGS every 150), until stop()."""

    def __init__(self, lab: FailoverLab) -> None:
        self.lab = lab
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="r1-load", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.lab.load.run(self.lab.r1, 20, rotate_every=150)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def start(self) -> LoadThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)
        assert not self._thread.is_alive(), "the load thread on R1 did not stop"
        if self.error is not None:
            raise AssertionError(f"the load on R1 failed: {self.error!r}")


# -- the checks ---------------------------------------------------------------------------------------------------


def assert_follows(lab: FailoverLab, port: int, server_id: int) -> None:
    """SHOW SLAVE STATUS and /status on the relay name the master at `port` with `server_id`, IO running, no
    error; the identity recorded in relayproxy.master.json is that master's."""
    row = relay_slave_status(lab)
    assert (int(row["Master_Port"]), int(row["Master_Server_Id"])) == (port, server_id), row
    assert row["Slave_IO_Running"] == "Yes" and not row["Last_IO_Error"] and not int(row["Last_IO_Errno"]), row
    status = lab.relay.status()
    assert (status["master_port"], status["master_server_id"]) == (port, server_id), status
    assert status["io_running"] and status["last_io_error"] is None, status
    assert "CHANGE MASTER" in status["master_source"], status["master_source"]
    identity = master_json(lab)["identity"]
    assert (identity["port"], identity["server_id"]) == (port, server_id), identity


def assert_history_kept(lab: FailoverLab, before: dict[str, bytes]) -> None:
    """The files written before the switch are unchanged byte for byte, but for one event appended to the last:
    the relay's ROTATE (timestamp 0, M1's server_id as the file's FORMAT_DESCRIPTION has it, log_pos = the file's
    end: nothing of the relay's own, design invariant 11) to epoch 2's first file at position 4."""
    names = list(before)
    for name in names[:-1]:
        assert (lab.relay.relay_dir / name).read_bytes() == before[name], f"{name} changed"
    last = names[-1]
    data = (lab.relay.relay_dir / last).read_bytes()
    assert data[: len(before[last])] == before[last], f"{last} was overwritten"
    tail = data[len(before[last]):]
    assert len(tail) >= C.HEADER_LEN, f"{last} gained {len(tail)} bytes, not the ROTATE of the switch"
    ts, type_code, server_id, size, log_pos, _flags = HEADER.unpack_from(tail, 0)
    first = relay_epochs(lab)[1]["first_file"]
    m1_id = HEADER.unpack_from(data, 4)[2]
    assert (ts, type_code, server_id, size, log_pos) == (0, C.ROTATE_EVENT, m1_id, len(tail), len(data)), (
        f"{last} gained {len(tail)} bytes: {C.event_name(type_code)} timestamp {ts} server_id {server_id} size {size} "
        f"log_pos {log_pos}, not one ROTATE of the relay")
    body = tail[C.HEADER_LEN: size - C.CHECKSUM_LEN]
    assert (int.from_bytes(body[:8], "little"), body[8:].decode()) == (4, first), body


def assert_epoch_two(lab: FailoverLab, crash, before: dict[str, bytes], port: int) -> None:
    """Exactly two epochs; the second begins at the file after the last one of M1, from R1 (at `port`), joined at
    the GTID set every survivor held when M1 died."""
    epochs = relay_epochs(lab)
    assert len(epochs) == 2, f"expected 2 epochs: {epochs}"
    second = epochs[1]
    last = list(before)[-1]
    base, seq = last.rsplit(".", 1)
    assert second["first_file"] == f"{base}.{int(seq) + 1:0{len(seq)}d}", (second, last)
    assert (second["master"]["port"], second["master"]["server_id"]) == (port, lab.r1.server_id), second
    assert second["join_gtids"] == crash.gtid_before, second


def assert_switched(lab: FailoverLab, crash, before: dict[str, bytes], port: int, *, more: int = 40) -> list[str]:
    """After the restart: the relay follows R1; more writes on R1 reach R2 and R3; everything consistent."""
    lab.load.run(lab.r1, more)
    lab.wait_converged(lab.r1, timeout=TIMEOUT)
    assert_follows(lab, port, lab.r1.server_id)
    assert_same_everywhere(lab, lab.r1, [lab.r2, lab.r3])
    names = assert_one_file_sequence(lab, before, epochs=2)
    assert len(names) > len(before), "no relay file after the switch"
    assert_epoch_two(lab, crash, before, port)
    assert_history_kept(lab, before)
    r3 = replica_status(lab.r3)
    assert r3["Using_Gtid"] == "No" and r3["Master_Log_File"] == names[-1], r3  # R3 followed the ROTATE
    assert_file_replica_at_relay_end(lab)
    return names


@contextlib.contextmanager
def noted(text: str):
    """Any AssertionError raised inside names `text` (how to replay a random run)."""
    try:
        yield
    except AssertionError as exc:
        exc.args = (f"[{text}] {exc.args[0] if exc.args else ''}", *exc.args[1:])
        raise


def report(capsys, point: str, *lines: str) -> None:
    with capsys.disabled():
        print(f"\n{point}\n" + "\n".join(f"  {line}" for line in lines))


# -- the kill points ----------------------------------------------------------------------------------------------


def test_kill_after_stop_slave(tmp_path, capsys):
    """(a) Restarted, the relay connects again to the master in force, M1 (dead): refused, nothing written;
    then STOP / CHANGE / START switches it as usual."""
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained():
        m1_link = lab.links["relay"].proxy.port
        info_before, epochs_before = master_json(lab), relay_epochs(lab)
        relay_sql(lab.relay_port, "STOP SLAVE")
        killed = kill9_restart(lab)
        status = lab.relay.wait_for(lambda s: s["connect_failures"] >= 2, TIMEOUT, "the relay to retry M1")
        assert status["master_port"] == m1_link and "--master" in status["master_source"], status
        assert not status["io_running"] and "2003" in status["last_io_error"] and str(m1_link) in status["last_io_error"]
        row = relay_slave_status(lab)
        assert (int(row["Master_Port"]), row["Slave_IO_Running"], int(row["Last_IO_Errno"])) == (
            m1_link, "Connecting", 2003), row
        assert file_bytes(lab) == before, "the relay wrote something while its master is dead"
        assert relay_epochs(lab) == epochs_before and len(epochs_before) == 1, relay_epochs(lab)  # M1's only
        assert master_json(lab) == info_before, "relayproxy.master.json changed"
        assert status["retrieved_gtid_set"] == crash.gtid_before
        assert covers(slave_pos(lab.r2), status["retrieved_gtid_set"])
        observed = f"restarted: {status['state']}; Slave_IO_Running {row['Slave_IO_Running']}; {row['Last_IO_Error']}"

        repoint_relay(lab.relay_port, lab.r1.port)
        names = assert_switched(lab, crash, before, lab.r1.port)
        report(capsys, "(a) kill -9 after STOP SLAVE", f"at the kill: {killed['epochs']} epochs recorded", observed,
               f"after STOP/CHANGE/START: following R1, files {names[0]}..{names[-1]}")


def test_kill_after_change_master(tmp_path, capsys):
    """(b) CHANGE MASTER was durable once answered: restarted (no START SLAVE sent), the relay follows R1."""
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained():
        switch_statements(lab, lab.r1.port, upto="CHANGE MASTER")
        killed = kill9_restart(lab)
        assert killed["epochs"] == 1 and killed["files"] == {name: len(data) for name, data in before.items()}
        status = lab.relay.wait_for(lambda s: s["io_running"] and s["master_server_id"] == lab.r1.server_id, TIMEOUT,
                                    "the restarted relay to stream from R1")
        assert status["master_port"] == lab.r1.port, status
        names = assert_switched(lab, crash, before, lab.r1.port)
        report(capsys, "(b) kill -9 after CHANGE MASTER", f"master_source after restart: {status['master_source']}",
               f"following R1 without START SLAVE, files {names[0]}..{names[-1]}")


def test_kill_right_after_start_slave(tmp_path, capsys):
    """(c) killed as soon as START SLAVE answered (connecting / beginning the epoch): the restart switches."""
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained():
        switch_statements(lab, lab.r1.port)
        killed = kill9_restart(lab)
        names = assert_switched(lab, crash, before, lab.r1.port)
        report(capsys, "(c) kill -9 right after START SLAVE",
               f"at the kill: {killed['epochs']} epochs recorded, identity server_id "
               f"{(killed['identity'] or {}).get('server_id')}", f"after restart: files {names[0]}..{names[-1]}")


@pytest.mark.parametrize("identity", ["saved", "not-saved"])
def test_kill_after_epoch_record(tmp_path, capsys, identity):
    """(c) killed after START SLAVE once the epoch is recorded and the relay's ROTATE into its first file is
    written, before anything of R1's binlog is stored (the dump held right after its first event).
    `not-saved`: the kill also beat the record of R1's identity in relayproxy.master.json (the session writes it
    right after the epoch record): that file is put back as it was when CHANGE MASTER answered, which is exactly
    what such a kill leaves (the file is replaced atomically, and nothing else writes it in between)."""
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained():
        link = r1_link(lab)
        hold = HoldAfterFirstEvent(link.proxy)
        switch_statements(lab, link.proxy.port, upto="CHANGE MASTER", held=True)
        info_path = lab.relay.relay_dir / "relayproxy.master.json"
        chosen = info_path.read_bytes()  # the choice of R1, the identity of M1
        relay_sql(lab.relay_port, "START SLAVE")
        _conn, event = hold.wait_held(TIMEOUT)
        first = wait_until("the relay to record epoch 2", lambda: len(relay_epochs(lab)) == 2 and relay_epochs(lab)[1],
                           TIMEOUT, lab.describe)["first_file"]
        lab.relay.wait_for(lambda s: s["master_log_file"] == first, TIMEOUT, f"the relay to start {first}")
        wait_until("the relay to record R1's identity", lambda: master_json(lab)["identity"]["server_id"] == 2,
                   TIMEOUT, lab.describe)
        assert link.proxy.connections_accepted == 1, link.proxy.connections()  # the held one, never replaced
        if identity == "not-saved":
            lab.relay.kill9()
            info_path.write_bytes(chosen)
        killed = kill9_restart(lab)
        assert killed["identity"]["server_id"] == (2 if identity == "saved" else 1), killed
        assert killed["files"].get(first) == 4, killed["files"]  # the epoch's first file holds only the magic
        assert list(killed["files"]) == [*before, first] and killed["epochs"] == 2
        link.proxy.resume()
        names = assert_switched(lab, crash, before, link.proxy.port)
        report(capsys, f"(c') kill -9 after the epoch record, R1's identity {identity}",
               f"held after {event.name} (artificial {event.artificial}); at the kill: {killed['epochs']} epochs, "
               f"{first} holds 4 bytes, identity server_id {killed['identity']['server_id']}",
               f"after restart: files {names[0]}..{names[-1]}")


def test_kill_after_join_then_new_master_rotates(tmp_path, capsys):
    """(c) killed after the join, R1 idle: the relay holds R1's head (FDE, GTID_LIST), its GTID dump was skipping
    R1's copies of M1's transactions. R1 rotates before the relay is back: the restarted relay's GTID dump begins
    at R1's next file, so the relay resumes by position to fetch the end of R1's first file, copies included.
    Those must become fillers (they were stored, and R3 applied M1's transactions a second time: fixed in
    upstream/receiver.py)."""
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained():
        switch_statements(lab, lab.r1.port)
        first = wait_until("the relay to record epoch 2", lambda: len(relay_epochs(lab)) == 2 and relay_epochs(lab)[1],
                           TIMEOUT, lab.describe)["first_file"]
        lab.relay.wait_for(lambda s: s["master_log_file"] == first and s["read_master_log_pos"] > 4, TIMEOUT,
                           f"the relay to store R1's head in {first}")
        wait_until("the relay to record R1's identity", lambda: master_json(lab)["identity"]["server_id"] == 2,
                   TIMEOUT, lab.describe)
        r1_file, r1_end = master_status(lab.r1)
        killed = kill9_restart_after(lab, lambda: lab.r1.execute("FLUSH BINARY LOGS"))
        assert killed["files"][first] < r1_end, (killed["files"], r1_end)  # R1's copies of M1's not in it
        names = assert_switched(lab, crash, before, lab.r1.port)
        resumed = [line for line in lab.relay.log_tail(400).splitlines() if "resuming by file/position" in line]
        assert resumed, "the restarted relay did not resume by position (R1's GTID dump began at its next file?)"
        report(capsys, "(c'') kill -9 after the join, R1 rotates before the restart",
               f"at the kill: {first} holds {killed['files'][first]} bytes of R1's {r1_file} ({r1_end} bytes)",
               f"restart: resumed by position; files {names[0]}..{names[-1]}, M1's transactions once on R3")


def test_kill_mid_first_transaction_of_new_master(tmp_path, capsys):
    """(d) the relay holds part of R1's first transaction (more than its flush threshold: on disk, not durable)
    when killed: recovery cuts it, the relay fetches the transaction again whole."""
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained():
        link = r1_link(lab)
        switch_statements(lab, link.proxy.port, held=True)
        first = wait_until("the relay to join R1", lambda: len(relay_epochs(lab)) == 2 and relay_epochs(lab)[1],
                           TIMEOUT, lab.describe)["first_file"]
        lab.relay.wait_for(lambda s: s["io_running"] and s["master_log_file"] == first, TIMEOUT,
                           "the relay to stream from R1")
        r1_file, r1_pos = master_status(lab.r1)  # epoch 2: relay offsets are R1's; `first` mirrors R1's r1_file
        link.hold.hold_after(r1_pos + HOLD_AT)
        lab.r1.execute(f"INSERT INTO {SCHEMA}.first (uid, v) SELECT seq, REPEAT('f', {ROW_BYTES}) "
                       f"FROM {SCHEMA}.seq_1_to_{FIRST_TRX_ROWS}")
        lab.load.inserted["first"] = set(range(1, FIRST_TRX_ROWS + 1))
        trx_end = master_status(lab.r1)
        _conn, event = link.hold.wait_held(TIMEOUT)
        assert r1_pos < event.log_pos < trx_end[1] and trx_end[0] == r1_file, (r1_pos, event.log_pos, trx_end)
        lab.relay.wait_for(lambda s: s["master_position"] == {"file": r1_file, "position": event.log_pos}, TIMEOUT,
                           "the relay to receive R1's transaction up to the hold")
        held = lab.relay.status()  # the horizon: past the fillers over R1's copy of M1's transactions, no further
        assert (held["master_log_file"], held["read_master_log_pos"], held["retrieved_gtid_set"]) == (
            first, r1_pos, crash.gtid_before), held
        horizon = r1_pos
        assert link.proxy.connections_accepted == 1, link.proxy.connections()  # the held one, never replaced
        killed = kill9_restart(lab)
        partial = killed["files"][first] - horizon
        assert partial >= FLUSH_BYTES, f"R1's first transaction did not reach {first} ({killed['files']})"
        link.proxy.resume()
        names = assert_switched(lab, crash, before, link.proxy.port)
        recovered = [line for line in lab.relay.log_tail(400).splitlines() if "relay recovered" in line][-1:]
        report(capsys, "(d) kill -9 in the middle of R1's first transaction",
               f"held at {r1_file}:{event.log_pos} of {trx_end[1]}; {partial} bytes of it in {first} past the "
               f"horizon {horizon}", f"restart: {recovered[0][:300] if recovered else '(no recovery line)'}",
               f"after restart: files {names[0]}..{names[-1]}, {FIRST_TRX_ROWS} rows of it on R2 and R3 once")


@pytest.mark.parametrize("window", [(0.0, 0.1), (0.1, 1.0), (1.0, 2.5)], ids=["early", "middle", "late"])
def test_kill_at_random_instant_under_load(tmp_path, capsys, window):
    """(e) a random instant in `window` seconds after START SLAVE answered, while R1 takes writes."""
    rng = random.Random(f"{SEED}-{window}")
    delay = rng.uniform(*window)
    lab, crash, before = crashed_lab(tmp_path)
    with lab, lab.explained(), noted(f"kill -9 {delay:.3f} s after START SLAVE, RELAYPROXY_CRASH_SEED={SEED}"):
        load = LoadThread(lab).start()
        try:
            switch_statements(lab, lab.r1.port)
            time.sleep(delay)
            killed = kill9_restart(lab)
            time.sleep(0.3)  # the restarted relay catches up while the writes go on
        finally:
            load.stop()
        names = assert_switched(lab, crash, before, lab.r1.port, more=20)
        report(capsys, f"(e) kill -9 {delay:.3f} s after START SLAVE under load (RELAYPROXY_CRASH_SEED={SEED})",
               f"at the kill: {killed['epochs']} epochs, identity server_id "
               f"{(killed['identity'] or {}).get('server_id')}, files {list(killed['files'].items())[-2:]}",
               f"after restart: {lab.load.transactions} transactions in all, files {names[0]}..{names[-1]}")
