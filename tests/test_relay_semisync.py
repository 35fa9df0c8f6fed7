"""Loss-less semi-sync: the relay registers as a semi-sync replica and ACKs only after the transaction is durable."""

from __future__ import annotations

import pytest

from .relayharness import RelayProcess, master_status, prepare_master

pytestmark = pytest.mark.server


def status_var(master, name: str) -> str:
    rows = master.execute(f"SHOW GLOBAL STATUS LIKE '{name}'")
    return rows[0][1] if rows else None


def test_master_counts_every_commit_as_acknowledged_by_the_relay(mariadb, tmp_path):
    master = mariadb("master", extra_config={
        "rpl_semi_sync_master_enabled": 1,
        "rpl_semi_sync_master_timeout": 20000,
        # Set-up statements run before the relay connects must not stall for the timeout.
        "rpl_semi_sync_master_wait_no_slave": "OFF",
    })
    prepare_master(master)
    relay = RelayProcess(tmp_path / "relay", master.port).start()
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
        conn.close()
        assert int(status_var(master, "Rpl_semi_sync_master_yes_tx")) - yes_before == commits + 2
        assert int(status_var(master, "Rpl_semi_sync_master_no_tx")) == no_before
        assert status_var(master, "Rpl_semi_sync_master_status") == "ON"
        status = relay.wait_caught_up(master)
        assert status["semi_sync_acks"] >= commits
        # The relay acknowledged only what its horizon covers: durable in its files.
        file, pos = master_status(master)
        assert (relay.relay_dir / file).stat().st_size >= pos
    finally:
        relay.stop()
