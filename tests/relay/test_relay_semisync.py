"""Loss-less semi-sync: the relay registers as a semi-sync replica and ACKs only after the transaction is durable."""

from __future__ import annotations

import time

import pytest

from relayproxy.lab.faultproxy import ThreadedFaultProxy
from relayproxy.lab.harness import RelayProcess, master_status, prepare_master
from relayproxy.ops.status import format_status

pytestmark = pytest.mark.server


def status_var(master, name: str) -> str:
    rows = master.execute(f"SHOW GLOBAL STATUS LIKE '{name}'")
    return rows[0][1] if rows else None


@pytest.mark.parametrize("sync_on_loop", [False, True], ids=["fsync-thread", "sync-on-loop"])
def test_master_counts_every_commit_as_acknowledged_by_the_relay(mariadb, tmp_path, sync_on_loop):
    master = mariadb("master", extra_config={
        "rpl_semi_sync_master_enabled": 1,
        "rpl_semi_sync_master_timeout": 20000,
        # Set-up statements run before the relay connects must not stall for the timeout.
        "rpl_semi_sync_master_wait_no_slave": "OFF",
    })
    prepare_master(master)
    relay = RelayProcess(tmp_path / "relay", master.port, extra=["--sync-on-loop", str(sync_on_loop).lower()]).start()
    try:
        status = relay.wait_for(lambda s: s["io_running"] and s["semi_sync"], 20, "semi-sync streaming")
        assert status_var(master, "Rpl_semi_sync_master_clients") == "1"
        assert status_var(master, "Rpl_semi_sync_master_status") == "ON"
        # Every transaction from here on waits for the relay's ACK (a missing ACK would stall
        # the commit for the 20 s timeout and count it in no_tx).
        yes_before = int(status_var(master, "Rpl_semi_sync_master_yes_tx"))
        no_before = int(status_var(master, "Rpl_semi_sync_master_no_tx"))
        master.execute("CREATE DATABASE app")
        master.execute("CREATE TABLE app.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB")
        conn = master.connect()
        cur = conn.cursor()
        commits = 25
        for i in range(commits):
            cur.execute("INSERT INTO app.t (v) VALUES (%s)", (i,))
            conn.commit()
            # The commit returned, so the master had the relay's ACK: the relay's durable horizon (moved only
            # after the fsync, and before the ACK is sent) already covers it. The stalled-fsync test in
            # test_fake_mysql_master.py shows the order itself; this checks it against a real master.
            file, pos = master_status(master)
            status = relay.status()
            horizon = (status["master_log_file"], status["read_master_log_pos"])
            assert horizon >= (file, pos), f"commit {i} at {file}:{pos} returned; the relay's horizon is {horizon}"
        conn.close()
        assert int(status_var(master, "Rpl_semi_sync_master_yes_tx")) - yes_before == commits + 2
        assert int(status_var(master, "Rpl_semi_sync_master_no_tx")) == no_before
        assert status_var(master, "Rpl_semi_sync_master_status") == "ON"
        status = relay.wait_caught_up(master)
        assert status["semi_sync_acks"] >= commits
        # Each ACK is timed from the advance that made its transaction durable (the hop's ack stage).
        assert status["hop"]["ack"]["count"] == status["semi_sync_acks"]
        assert status["hop"]["durable"]["count"] >= commits
        # The relay acknowledged only what its horizon covers: durable in its files.
        file, pos = master_status(master)
        assert (relay.relay_dir / file).stat().st_size >= pos
    finally:
        relay.stop()


def test_relay_acks_the_master_only_after_its_semi_sync_replica(mariadb, tmp_path):
    """master (semi-sync) -> relay (--semi-sync-replicas 1) -> MariaDB replica (semi-sync): no peer does this."""
    from relayproxy.lab.harness import free_port

    master = mariadb("master", extra_config={
        "rpl_semi_sync_master_enabled": 1,
        "rpl_semi_sync_master_timeout": 20000,
        "rpl_semi_sync_master_wait_no_slave": "OFF",
    })
    prepare_master(master)
    config = tmp_path / "relay.toml"
    config.write_text('[[users]]\nname = "repl"\npassword = "replpw"\n')
    listen = free_port()
    relay = RelayProcess(tmp_path / "relay", master.port, extra=[
        "--listen", f"127.0.0.1:{listen}", "--config", str(config),
        "--semi-sync-replicas", "1", "--semi-sync-timeout", "15",
    ]).start()
    replica = mariadb("replica", server_id=3, extra_config={"rpl_semi_sync_slave_enabled": 1})
    try:
        relay.wait_for(lambda s: s["io_running"] and s["semi_sync"], 20, "semi-sync streaming")
        replica.execute(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={listen}, MASTER_USER='repl', "
            "MASTER_PASSWORD='replpw', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1"
        )
        replica.execute("START SLAVE")
        status = relay.wait_for(lambda s: any(r["semi_sync"] for r in s["replicas"]), 20, "a semi-sync replica")
        assert status_var(replica, "Rpl_semi_sync_slave_status") == "ON"
        yes_before = int(status_var(master, "Rpl_semi_sync_master_yes_tx"))
        no_before = int(status_var(master, "Rpl_semi_sync_master_no_tx"))
        master.execute("CREATE DATABASE app")
        master.execute("CREATE TABLE app.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB")
        conn = master.connect()
        cur = conn.cursor()
        for i in range(10):
            cur.execute("INSERT INTO app.t (v) VALUES (%s)", (i,))
            conn.commit()
            # The commit returned: the relay ACKed it, so its semi-sync replica had ACKed it to the relay.
            file, pos = master_status(master)
            ack = [r for r in relay.status()["replicas"] if r["semi_sync"]][0]["last_ack"]
            assert ack[0] == file and ack[1] >= pos, (ack, file, pos)
        conn.close()
        assert int(status_var(master, "Rpl_semi_sync_master_yes_tx")) - yes_before == 12
        assert int(status_var(master, "Rpl_semi_sync_master_no_tx")) == no_before
        status = relay.status()
        assert status["semi_sync_replica_waits"] >= 12 and status["semi_sync_replica_timeouts"] == 0
        acked = [r for r in status["replicas"] if r["semi_sync"]][0]["last_ack"]
        assert acked is not None and acked[0] == status["master_log_file"]
    finally:
        relay.stop()


def _commit(master_conn, master, v: int) -> tuple[str, float]:
    """One INSERT committed on the master: its GTID and how long the commit took."""
    cur = master_conn.cursor()
    start = time.monotonic()
    cur.execute("INSERT INTO app.t (v) VALUES (%s)", (v,))
    master_conn.commit()
    took = time.monotonic() - start
    cur.execute("SELECT @@gtid_binlog_pos")
    return cur.fetchone()[0], took


def test_fallback_to_async_shows_in_the_relays_semi_sync_tally(mariadb, tmp_path):
    """A semi-sync master times out waiting for the relay and commits unacknowledged; the relay's tally shows the
    transactions the master did not ask it to ACK (docs/failover.md, "Semi-sync fallback: the hole")."""
    master = mariadb("master", extra_config={
        "rpl_semi_sync_master_enabled": 1,
        "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
        "rpl_semi_sync_master_timeout": 500,
        "rpl_semi_sync_master_wait_no_slave": "OFF",  # set-up before the relay connects
    })
    prepare_master(master)
    with ThreadedFaultProxy(master.host, master.port) as proxy:
        relay = RelayProcess(tmp_path / "relay", proxy.port).start()
        try:
            relay.wait_for(lambda s: s["io_running"] and s["semi_sync"], 20, "semi-sync streaming")
            master.execute("SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON")
            master.execute("CREATE DATABASE app")
            master.execute("CREATE TABLE app.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB")
            conn = master.connect()
            # Healthy: every commit waits for the relay's ACK and gets it.
            for i in range(5):
                _gtid, took = _commit(conn, master, i)
                assert took < 0.4
            status = relay.wait_caught_up(master)
            # The set-up transactions, committed before any semi-sync replica was connected, returned unacknowledged
            # (the master's no_tx) and reached the relay unasked; every one since was asked for and acknowledged.
            no_before = int(status_var(master, "Rpl_semi_sync_master_no_tx"))
            assert no_before >= 1 and status["semi_sync_unrequested_transactions"] == no_before
            base = no_before
            assert status["semi_sync_master_waiting"] is True and status["semi_sync_ack_requests"] >= 7
            assert status["semi_sync_ack_request_age_seconds"] >= 0
            assert status_var(master, "Rpl_semi_sync_master_status") == "ON"

            # The link stalls: the next commit waits out the 500 ms and the master falls back to async.
            stalled_at = time.time()
            proxy.pause()
            fallback = [_commit(conn, master, 100)]
            assert fallback[0][1] >= 0.4
            assert status_var(master, "Rpl_semi_sync_master_status") == "OFF"
            # The relay is cut off while the master goes on committing in fallback: no wait, no ACK.
            proxy.refuse(True)
            proxy.drop_connections()
            proxy.resume()
            for i in range(4):
                fallback.append(_commit(conn, master, 101 + i))
                assert int(status_var(master, "Rpl_semi_sync_master_no_tx")) - no_before == len(fallback)  # unwaited
            assert int(status_var(master, "Rpl_semi_sync_master_no_tx")) - no_before == 5
            # The relay comes back behind the master's latest commit: the master does not ask it to ACK the
            # transactions before that commit, and asks for the last one so it can switch semi-sync back ON.
            proxy.refuse(False)
            status = relay.wait_caught_up(master)
            assert status["semi_sync_unrequested_transactions"] - base == 4 == len(fallback) - 1
            assert status["semi_sync_last_unrequested_gtid"] == fallback[-2][0]
            assert stalled_at <= status["semi_sync_last_unrequested_time"] <= time.time()
            assert status["semi_sync_master_waiting"] is True
            deadline = time.monotonic() + 10
            while status_var(master, "Rpl_semi_sync_master_status") != "ON" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert status_var(master, "Rpl_semi_sync_master_status") == "ON"
            yes = int(status_var(master, "Rpl_semi_sync_master_yes_tx"))
            _gtid, took = _commit(conn, master, 200)
            assert took < 0.4 and int(status_var(master, "Rpl_semi_sync_master_yes_tx")) == yes + 1
            status = relay.wait_caught_up(master)
            assert status["semi_sync_master_waiting"] is True and status["semi_sync_unrequested_transactions"] == base + 4
            text = format_status(status)  # what `relayproxy status` prints
            assert f"Not asked to ACK:       {base + 4} transactions, latest {fallback[-2][0]}" in text
            assert "Semi-sync master:       waiting for ACKs" in text

            # The blind spot: the relay stays connected but stalled. Every fallback commit is asked for when the
            # master's dump thread sends it (it has caught up with the latest commit), so the tally cannot show
            # them; the master's own Rpl_semi_sync_master_no_tx does.
            no_before = int(status_var(master, "Rpl_semi_sync_master_no_tx"))
            asked = status["semi_sync_ack_requests"]
            proxy.pause()
            stalled = [_commit(conn, master, 300)]
            assert stalled[0][1] >= 0.4 and status_var(master, "Rpl_semi_sync_master_status") == "OFF"
            for i in range(2):
                time.sleep(0.2)
                stalled.append(_commit(conn, master, 301 + i))
            assert int(status_var(master, "Rpl_semi_sync_master_no_tx")) - no_before == 3
            proxy.resume()
            status = relay.wait_caught_up(master)
            assert status["semi_sync_unrequested_transactions"] == base + 4
            assert status["semi_sync_ack_requests"] == asked + 3
            conn.close()
        finally:
            relay.stop()
