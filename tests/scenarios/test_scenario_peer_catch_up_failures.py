"""Peer catch-up within an epoch, when it goes wrong (docs/failover.md, "Peer catch-up within an epoch").

Real MariaDB servers (relayproxy.lab.failover): M1, the lab's relay A (server_id 100, R2 by GTID and R3 by
file/position behind it) and a second relay B (server_id 101) of M1. A is stopped (STOP SLAVE) while M1 writes
more and rotates, so it lags behind B; then A is pointed at B by file/position at its horizon:

1. B's copy of A's horizon file was altered (one byte of a row, CRC recomputed: a valid event, another history)
   while B was stopped: refused, naming B, the file and the offset of the first differing byte; A's files are
   unchanged through several retries and A keeps serving R2 and R3; repointed to M1 it carries on.
2. A peer of another epoch: a relay of M1 that began at a later file (M1 purged its first files), and B once it
   switched to the promoted R1: refused, naming why; nothing written.
3. A is frozen (SIGSTOP) at a random point while appending from B, under load on M1, then killed (SIGKILL): on
   restart its files are a valid prefix of B's, it resumes from B, converges under load, ends byte-identical to B,
   and R2 and R3 behind it hold every insert once.
4. B's host goes (the link paused, B frozen) while A checks it, then at a random point while A appends, and B is
   killed: each time A reports it within a bounded time (before the fix, a peer gone silent during the check hung
   A's upstream for good: "connecting", no error, no retry), keeps a valid prefix of B's files (complete
   transactions only), and catches up from B again once B is restarted, ending byte-identical.

The link from A to B is a fault proxy (tests 3 and 4) that trickles the stream, so there is a "middle" to stop in.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import scan_file
from relayproxy.lab.failover import (
    REPL_PASSWORD,
    REPL_USER,
    FailoverLab,
    assert_every_insert_once,
    binlog_pos,
    covers,
    first_difference,
    promote,
    relay_file_bytes,
    relay_sql,
    repoint_relay,
    wait_until,
)
from relayproxy.lab.faultproxy import SERVER_TO_CLIENT, ThreadedFaultProxy
from relayproxy.lab.harness import (
    RelayProcess,
    assert_same_data,
    master_status,
    replica_status,
    wait_relay,
    wait_replica,
)
from relayproxy.upstream.session import peer_read_timeout


TIMEOUT = 60.0


# -- steps shared by the tests -----------------------------------------------------------------------------------


def lagging_relays(lab: FailoverLab, transactions: int, *, rotate_every: int, big_rows: int = 0,
                   big_rows_behind: int = 0) -> tuple[RelayProcess, int, tuple[str, int]]:
    """Relay B joins M1; both relays hold M1's first writes; relay A is stopped (STOP SLAVE) at M1's position and
    M1 writes `transactions` more (rotating every `rotate_every`), which B relays. A big transaction (rows of 4000
    bytes, one WRITE_ROWS event each) ends A's horizon file with `big_rows`, and is among those A lacks with
    `big_rows_behind`. Returns B, its SQL port and A's horizon (M1's names)."""
    relay2, port2 = lab.add_relay("relay2", server_id=101)
    lab.load.run(lab.m1, 30)
    if big_rows:  # A's horizon file gets long: the catch-up's byte comparison has something to read
        big_insert(lab, 2_000_000_000, big_rows)
    lab.wait_caught_up_m1()
    relay_sql(lab.relay_port, "STOP SLAVE")
    at = horizon(lab.relay_port)
    assert at == master_status(lab.m1), (at, master_status(lab.m1))
    lab.load.run(lab.m1, transactions // 2, rotate_every=rotate_every)
    if big_rows_behind:
        big_insert(lab, 3_000_000_000, big_rows_behind)
    lab.load.run(lab.m1, transactions - transactions // 2, rotate_every=rotate_every)
    wait_relay(relay2, lab.m1, TIMEOUT)
    return relay2, port2, at


def big_insert(lab: FailoverLab, first_uid: int, rows: int) -> None:
    lab.m1.execute(f"INSERT INTO app.big (uid, v) SELECT {first_uid} + seq, REPEAT('b', 4000) FROM app.seq_1_to_{rows}")


def wait_appended(lab: FailoverLab, at_least: int) -> int:
    """Until relay A's files hold `at_least` bytes on disk (polled every few ms); returns what they hold."""
    deadline = time.monotonic() + TIMEOUT
    while (held := held_bytes(lab.relay.relay_dir)) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"A holds {held} bytes, not {at_least}, after {TIMEOUT} s\n{lab.describe()}")
        time.sleep(0.005)
    return held


def horizon(relay_port: int) -> tuple[str, int]:
    """The relay's horizon in its master's names, as SHOW SLAVE STATUS gives it (what promote levels from)."""
    row = relay_sql(relay_port, "SHOW SLAVE STATUS")[0]
    return row["Master_Log_File"], int(row["Read_Master_Log_Pos"])


def catch_up_from(relay_port: int, peer_port: int, at: tuple[str, int]) -> None:
    """On a stopped relay: CHANGE MASTER TO the peer by file/position at `at`; START SLAVE (what promote sends)."""
    relay_sql(relay_port, f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={peer_port}, "
                          f"MASTER_USER='{REPL_USER}', MASTER_PASSWORD='{REPL_PASSWORD}', MASTER_LOG_FILE='{at[0]}', "
                          f"MASTER_LOG_POS={at[1]}, MASTER_USE_GTID=no")
    relay_sql(relay_port, "START SLAVE")


def io_error(relay_port: int) -> str:
    return relay_sql(relay_port, "SHOW SLAVE STATUS")[0]["Last_IO_Error"]


def refusals(relay: RelayProcess) -> float:
    """relayproxy_errors_total{kind="master"}: how many times the relay refused its upstream."""
    for line in relay.metrics().splitlines():
        if line.startswith("relayproxy_errors_total{") and 'kind="master"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def assert_valid_prefix(mine: dict[str, bytes], theirs: dict[str, bytes], relay_dir: Path) -> int:
    """Every file of `mine` is the peer's file of that name (the last one: a prefix of it), and the relay's last
    file ends at a transaction boundary (a scan finds nothing partial, nothing after the last complete group).
    Returns the bytes held."""
    names = list(mine)
    assert names == list(theirs)[: len(names)], f"file names: {names} and the peer's {list(theirs)}"
    for name in names[:-1]:
        assert mine[name] == theirs[name], f"{name}: {first_difference(mine[name], theirs[name])}"
    last = names[-1]
    assert theirs[last][: len(mine[last])] == mine[last], f"{last}: {first_difference(mine[last], theirs[last])}"
    if len(mine[last]) > 4:  # (only the magic number: the relay had just begun that file at a ROTATE)
        result = scan_file(relay_dir / last)
        assert result.ok and result.good_end == len(mine[last]), (last, len(mine[last]), result)
    return sum(map(len, mine.values()))


def assert_identical(relay_a: RelayProcess, relay_b: RelayProcess) -> dict[str, bytes]:
    """Both stopped: the same file names, the same bytes."""
    one, two = relay_file_bytes(relay_a.relay_dir), relay_file_bytes(relay_b.relay_dir)
    assert list(one) == list(two), f"relay files differ in names: {list(one)} and {list(two)}"
    differ = {name: first_difference(one[name], two[name]) for name in one if one[name] != two[name]}
    assert not differ, f"files differ between the two relays: {differ}"
    return one


def trickle(proxy: ThreadedFaultProxy) -> None:
    """Slow the peer's stream to a trickle (4 KiB pieces, a few ms apart): a catch-up takes a second or two."""
    proxy.fragment(4096, SERVER_TO_CLIENT)
    proxy.delay(0.004, SERVER_TO_CLIENT)


def held_bytes(relay_dir: Path) -> int:
    """Bytes in the relay's files on disk now (a partial transaction included)."""
    return sum((relay_dir / n).stat().st_size for n in (relay_dir / "relayproxy.index").read_text().split())


def table(capsys, title: str, rows: list[tuple[str, object]]) -> None:
    with capsys.disabled():
        print(f"\n  {title}")
        for what, value in rows:
            print(f"    {what:<44} {value}")


# -- the waits before a peer's stream begins are bounded (sans-I/O) --------------------------------------------------


def test_a_silent_peer_is_given_up_after_the_stream_silence_limit_and_never_less_than_the_connect_timeout():
    # upstream/session.py: the probe, the byte comparison (a second, non-blocking dump: no heartbeats) and the dump
    # request wait at most this long for a peer; before, a peer frozen in that phase hung the relay for good.
    assert peer_read_timeout(0.5, 3.0) == 3.0
    assert peer_read_timeout(1.0, 10.0) == 10.0  # the defaults
    assert peer_read_timeout(5.0, 10.0) == 11.0  # two heartbeat periods and a second, as a silent stream
    assert peer_read_timeout(0.0, 2.0) == 2.0  # heartbeats off: the connect timeout still bounds it


# -- 1. bytes that differ --------------------------------------------------------------------------------------------


@pytest.mark.server
def test_a_peer_whose_bytes_differ_before_the_horizon_is_refused_naming_the_file_and_offset(tmp_path, capsys):
    started = time.monotonic()
    with FailoverLab(tmp_path / "lab", candidates=0) as lab, lab.explained():
        lab.start()
        relay2, port2, at = lagging_relays(lab, 60, rotate_every=40)
        # B's copy of A's horizon file gets another row value in one WRITE_ROWS event before A's horizon (its CRC
        # recomputed: a valid event, another history), while B is stopped.
        relay2.stop()
        path = relay2.relay_dir / at[0]
        events = []
        assert scan_file(path, on_event=events.append).ok
        victim = [e for e in events if e.type_code in (C.WRITE_ROWS_EVENT_V1, C.WRITE_ROWS_EVENT)
                  and e.offset + e.size <= at[1]][-1]
        data = bytearray(path.read_bytes())
        end = victim.offset + victim.size
        changed = data.index(b"row ", victim.offset, end) + 4  # the first digit of the row's uid in its text
        data[changed] = ord("9") if data[changed] != ord("9") else ord("8")
        struct.pack_into("<I", data, end - 4, zlib.crc32(data[victim.offset:end - 4]))
        path.write_bytes(bytes(data))
        relay2.start()
        wait_relay(relay2, lab.m1, TIMEOUT)

        before = relay_file_bytes(lab.relay.relay_dir)
        catch_up_from(lab.relay_port, port2, at)
        error = wait_until("the peer to be refused", lambda: io_error(lab.relay_port), TIMEOUT, lab.describe)
        assert "peer catch-up refused" in error, error
        assert f"127.0.0.1:{port2} (server_id 101)" in error, error
        assert f"their bytes differ at {at[0]}:{changed} (in the event at {victim.offset}; WRITE_ROWS" in error, error
        assert relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]["Last_IO_Errno"] == 1593
        # It retries (as for any refused master) and is refused each time; nothing is ever written.
        wait_until("a second refusal", lambda: refusals(lab.relay) >= 2, TIMEOUT, lab.describe)
        assert lab.relay.status()["peer_catch_up"] is None  # no catch-up in force
        assert relay_file_bytes(lab.relay.relay_dir) == before
        assert horizon(lab.relay_port) == at

        # A keeps serving R2 and R3: both reconnect and are at its horizon.
        for replica in (lab.r2, lab.r3):
            replica.execute("STOP SLAVE")
            replica.execute("START SLAVE")
        for replica in (lab.r2, lab.r3):
            wait_until(f"{replica.basedir.name} served up to A's horizon", lambda r=replica: (
                replica_status(r).get("Slave_IO_Running") == "Yes"
                and (replica_status(r)["Relay_Master_Log_File"], int(replica_status(r)["Exec_Master_Log_Pos"])) == at),
                TIMEOUT, lab.describe)
        refused = refusals(lab.relay)
        assert relay_file_bytes(lab.relay.relay_dir) == before

        # Repointed to its master it carries on: R2 and R3 get everything once.
        relay_sql(lab.relay_port, "STOP SLAVE")
        relay_sql(lab.relay_port, f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', "
                                  f"MASTER_PORT={lab.links['relay'].proxy.port}, MASTER_USE_GTID=slave_pos")
        relay_sql(lab.relay_port, "START SLAVE")
        lab.wait_converged(lab.m1)
        for replica in (lab.r2, lab.r3):
            assert_every_insert_once(lab.load, replica)
            assert_same_data(lab.m1, replica)
        table(capsys, f"a peer with other bytes: refused, nothing written ({time.monotonic() - started:.1f} s)", [
            ("A's horizon", f"{at[0]}:{at[1]}"),
            ("byte changed on B", f"{at[0]}:{changed} (event at {victim.offset}, {C.event_name(victim.type_code)})"),
            ("refusals while pointed at B", int(refused)),
            ("A's files", f"{len(before)} files, {sum(map(len, before.values()))} bytes, unchanged"),
            ("Last_IO_Error", error[:120] + "..."),
        ])


# -- 2. another epoch ------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_a_peer_of_another_epoch_is_refused_naming_why(tmp_path, capsys):
    started = time.monotonic()
    with FailoverLab(tmp_path / "lab", candidates=1) as lab, lab.explained():
        lab.start()
        relay2, port2, at = lagging_relays(lab, 40, rotate_every=20)
        before = relay_file_bytes(lab.relay.relay_dir)
        rows = []

        # (a) A relay of M1 whose epoch began at a later file: M1 purged its first files before it started.
        current = master_status(lab.m1)[0]
        lab.m1.execute(f"PURGE BINARY LOGS TO '{current}'")
        relay3, port3 = lab.add_relay("relay3", server_id=103)
        wait_relay(relay3, lab.m1, TIMEOUT)
        first3 = relay_sql(port3, "SELECT @@relayproxy_epoch_first_file AS f")[0]["f"]
        assert first3 == current != lab.first_file, (first3, current, lab.first_file)
        catch_up_from(lab.relay_port, port3, at)
        error = wait_until("the late relay to be refused", lambda: io_error(lab.relay_port), TIMEOUT, lab.describe)
        assert "peer catch-up refused" in error and f"127.0.0.1:{port3} (server_id 103)" in error, error
        assert "holds epoch 1 of the master server_id 1" in error, error
        assert f"another epoch (it began at {current} <- {current}, this relay's epoch 1 at {lab.first_file} <- " \
               f"{lab.first_file})" in error, error
        assert relay_file_bytes(lab.relay.relay_dir) == before
        rows.append((f"B': a relay of M1 begun at {current}", why(error)))
        relay_sql(lab.relay_port, "STOP SLAVE")

        # (b) B after it switched to the promoted R1 (epoch 2 of master server_id 2).
        wait_relay(relay2, lab.m1, TIMEOUT)
        wait_replica(lab.r1, lab.m1, TIMEOUT)
        lab.m1.kill()
        promote(lab.r1)
        repoint_relay(port2, lab.r1.port)
        lab.load.run(lab.r1, 10)
        want = binlog_pos(lab.r1)
        wait_until("B to follow R1", lambda: relay_sql(port2, "SELECT @@relayproxy_epoch AS e")[0]["e"] == 2
                   and covers_on(relay2, want), TIMEOUT, lab.describe)
        catch_up_from(lab.relay_port, port2, at)
        error = wait_until("the switched peer to be refused", lambda: io_error(lab.relay_port), TIMEOUT,
                           lab.describe)
        assert "peer catch-up refused" in error and f"127.0.0.1:{port2} (server_id 101)" in error, error
        assert "holds epoch 2 of the master server_id 2" in error, error
        assert "this relay's current epoch 1 is of the master server_id 1" in error, error
        assert "a relay of another master now: it switched masters after this relay's epoch (its epoch 2, this " \
               "relay's 1); repoint this relay by GTID to the master the peer follows" in error, error
        wait_until("a second refusal", lambda: refusals(lab.relay) >= 3, TIMEOUT, lab.describe)
        assert relay_file_bytes(lab.relay.relay_dir) == before
        assert horizon(lab.relay_port) == at
        assert lab.relay.status()["peer_catch_up"] is None  # no catch-up in force
        rows.append(("B after its switch to R1", why(error)))
        rows.append(("A's files", f"{len(before)} files, {sum(map(len, before.values()))} bytes, unchanged"))
        table(capsys, f"peers of another epoch: refused ({time.monotonic() - started:.1f} s)", rows)


def why(error: str) -> str:
    """The reason in a peer catch-up refusal: what follows 'this relay's current epoch N is of the master ...: '."""
    return error.split("this relay's current epoch", 1)[1].split(": ", 1)[1].split(". Nothing was written")[0]


def covers_on(relay: RelayProcess, gtids: str) -> bool:
    return covers(relay.status()["retrieved_gtid_set"], gtids)


# -- 3. the relay killed mid catch-up ---------------------------------------------------------------------------------


@pytest.mark.server
def test_relay_killed_while_appending_from_its_peer_recovers_and_converges(tmp_path, capsys):
    started = time.monotonic()
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    with FailoverLab(tmp_path / "lab", candidates=0) as lab, lab.explained():
        lab.start()
        relay2, port2, at = lagging_relays(lab, 160, rotate_every=60, big_rows_behind=60)
        link = ThreadedFaultProxy("127.0.0.1", port2).start()
        try:
            trickle(link)
            start_bytes = held_bytes(lab.relay.relay_dir)
            behind = sum(len(b) for b in relay_file_bytes(relay2.relay_dir).values()) - start_bytes
            load = threading.Thread(target=lab.load.run, args=(lab.m1, 150), kwargs={"rotate_every": 70})
            load.start()  # M1 keeps writing while A catches up from B
            catch_up_from(lab.relay_port, link.port, at)
            stop_at = start_bytes + int(behind * rng.uniform(0.15, 0.85))
            wait_appended(lab, stop_at)
            os.kill(lab.relay.proc.pid, signal.SIGSTOP)
            frozen = {n: (lab.relay.relay_dir / n).stat().st_size
                      for n in (lab.relay.relay_dir / "relayproxy.index").read_text().split()}
            lab.relay.kill9()
            link.refuse(True)  # restarted, A recovers without reaching B: its files are what recovery kept
            link.drop_connections()
            lab.relay.start()
            recovered = lab.relay.wait_for(lambda s: s.get("master_log_file") is not None, TIMEOUT, "recovery")
            kept = relay_file_bytes(lab.relay.relay_dir)
            held = assert_valid_prefix(kept, relay_file_bytes(relay2.relay_dir), lab.relay.relay_dir)
            last = list(kept)[-1]  # (a ROTATE ended the last frozen file: recovery may have begun the next one)
            assert (recovered["master_log_file"], recovered["read_master_log_pos"]) == (last, len(kept[last])), (
                recovered, frozen)
            assert all(len(kept[n]) <= frozen.get(n, 4) for n in kept), (frozen, {n: len(b) for n, b in kept.items()})

            link.refuse(False)  # it resumes from B (the choice and the peer survive the restart)
            load.join(120)
            assert not load.is_alive()
            wait_relay(relay2, lab.m1, TIMEOUT)
            lab.wait_converged(lab.m1)
            lab.relay.wait_for(lambda s: (s["master_log_file"], s["read_master_log_pos"])
                               == (relay2.status()["master_log_file"], relay2.status()["read_master_log_pos"]),
                               TIMEOUT, "A at B's horizon")
            peer = lab.relay.status()["peer_catch_up"]
            assert peer["peer"] == f"127.0.0.1:{link.port}" and peer["epoch"] == 1, peer
            for replica in (lab.r2, lab.r3):
                assert_every_insert_once(lab.load, replica)
                assert_same_data(lab.m1, replica)
            lab.relay.stop()
            relay2.stop()
            same = assert_identical(lab.relay, relay2)
        finally:
            link.stop()
        table(capsys, f"relay A killed mid catch-up (seed {seed}; {time.monotonic() - started:.1f} s)", [
            ("A's horizon before the catch-up", f"{at[0]}:{at[1]}"),
            ("bytes behind B when it began", behind),
            ("frozen (SIGSTOP) with on disk", ", ".join(f"{n}:{s}" for n, s in list(frozen.items())[-2:])),
            ("recovered horizon (kill -9, restart)",
             f"{recovered['master_log_file']}:{recovered['read_master_log_pos']} "
             f"({sum(frozen.values()) - held:+d} bytes on disk at the kill)"),
            ("kept: a prefix of B's files", f"{held} bytes"),
            ("resumed from B, converged", f"{len(same)} files, {sum(map(len, same.values()))} bytes, identical"),
            ("R2, R3", f"every insert once ({sum(map(len, lab.load.inserted.values()))} rows)"),
        ])


# -- 4. the peer frozen, then killed, mid catch-up -------------------------------------------------------------------


@pytest.mark.server
def test_peer_frozen_or_killed_mid_catch_up_is_reported_in_bounded_time_and_the_relay_catches_up_again(tmp_path,
                                                                                                      capsys):
    started = time.monotonic()
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    # The lab's relays run with --heartbeat-period 0.5 (lab/harness.py); a connect timeout of 3 s keeps waits short.
    with FailoverLab(tmp_path / "lab", candidates=0, relay_extra=["--connect-timeout", "3"]) as lab, lab.explained():
        lab.start()
        relay2, port2, at = lagging_relays(lab, 160, rotate_every=60, big_rows=100, big_rows_behind=60)
        check_limit = peer_read_timeout(0.5, 3.0)  # how long A waits for a silent peer before its stream begins
        stream_limit = 2 * 0.5 + 1.0  # a silent stream: two heartbeat periods and a second (upstream/session.py)
        link = ThreadedFaultProxy("127.0.0.1", port2).start()
        rows = []
        try:
            # (a) B freezes (SIGSTOP: a host gone without closing its connections) while A checks it: the byte
            # comparison of A's horizon file (about 400 KB, trickled) over a second connection.
            link.delay(0.02, SERVER_TO_CLIENT)
            link.fragment(4096, SERVER_TO_CLIENT)
            before = relay_file_bytes(lab.relay.relay_dir)
            catch_up_from(lab.relay_port, link.port, at)
            def comparing() -> bool:  # the second connection dumps (well past its handshake), the stream not begun
                open_ = [c for c in link.connections() if c.open]
                return (len(open_) == 2 and open_[1].server_to_client > 20_000
                        and lab.relay.status()["state"] == "connecting")

            wait_until("A to compare its horizon file with B's", comparing, TIMEOUT, lab.describe)
            link.pause()  # B's host is gone: nothing more arrives and no connection is closed
            os.kill(relay2.proc.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            error = wait_until("A to report the frozen peer", lambda: io_error(lab.relay_port), check_limit + 15,
                               lab.describe)
            reported = time.monotonic() - frozen
            assert reported < check_limit + 5, (reported, error)
            assert f"127.0.0.1:{link.port}" in error and "silent" in error, error
            assert relay_file_bytes(lab.relay.relay_dir) == before  # nothing written before the check passed
            rows.append(("B frozen during A's check: reported after", f"{reported:.1f} s: {error[:80]}..."))

            # (b) B is back; A retries, passes the check and appends; B's host goes at a random point (the link
            # paused, B frozen), then B is killed and its connections dropped.
            trickle(link)
            link.drop_connections()
            os.kill(relay2.proc.pid, signal.SIGCONT)
            link.resume()
            start_bytes = held_bytes(lab.relay.relay_dir)
            behind = sum(len(b) for b in relay_file_bytes(relay2.relay_dir).values()) - start_bytes
            stop_at = start_bytes + int(behind * rng.uniform(0.1, 0.7))
            wait_appended(lab, stop_at)
            assert not io_error(lab.relay_port)
            link.pause()
            os.kill(relay2.proc.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            error = wait_until("A to report the silent peer", lambda: io_error(lab.relay_port), stream_limit + 15,
                               lab.describe)
            reported = time.monotonic() - frozen
            assert reported < stream_limit + 5, (reported, error)
            assert f"127.0.0.1:{link.port}" in error and "silent" in error, error
            rows.append(("B frozen mid-append: reported after", f"{reported:.1f} s: {error[:80]}..."))
            killed = time.time()
            relay2.kill9()
            link.drop_connections()
            link.resume()
            wait_until("A to fail reconnecting to the dead peer",
                       lambda: (lab.relay.status()["last_io_error_time"] or 0) > killed, TIMEOUT, lab.describe)
            rows.append(("B killed: A's next error", io_error(lab.relay_port)[:100]))
            status = lab.relay.status()
            kept = relay_file_bytes(lab.relay.relay_dir)
            held = assert_valid_prefix(kept, relay_file_bytes(relay2.relay_dir), lab.relay.relay_dir)
            last = list(kept)[-1]
            assert (status["master_log_file"], status["read_master_log_pos"]) == (last, len(kept[last])), status
            assert held > start_bytes, (held, start_bytes)
            rows.append(("A kept (a prefix of B's files, whole groups)", f"{held - start_bytes} of {behind} bytes"))

            # (c) B restarted: it recovers and follows M1 again; A catches up from it again and converges.
            relay2.start()
            lab.load.run(lab.m1, 30)
            wait_relay(relay2, lab.m1, TIMEOUT)
            lab.wait_converged(lab.m1)
            lab.relay.wait_for(lambda s: (s["master_log_file"], s["read_master_log_pos"])
                               == (relay2.status()["master_log_file"], relay2.status()["read_master_log_pos"]),
                               TIMEOUT, "A at B's horizon")
            peer = lab.relay.status()["peer_catch_up"]
            assert peer["peer"] == f"127.0.0.1:{link.port}" and peer["from"] == f"{last}:{len(kept[last])}", peer
            for replica in (lab.r2, lab.r3):
                assert_every_insert_once(lab.load, replica)
                assert_same_data(lab.m1, replica)
            lab.relay.stop()
            relay2.stop()
            same = assert_identical(lab.relay, relay2)
            rows.append(("B restarted: A caught up again from", peer["from"]))
            rows.append(("converged", f"{len(same)} files, {sum(map(len, same.values()))} bytes, identical; R2 and "
                                      f"R3 every insert once"))
        finally:
            link.stop()
        table(capsys, f"peer B frozen, then killed, mid catch-up (seed {seed}; {time.monotonic() - started:.1f} s)",
              rows)
