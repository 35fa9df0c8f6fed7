"""Peer catch-up within an epoch: a relay that lagged when the master died fetches the rest of the epoch from the
other relay, by file/position, so the two relays stay byte-identical through the switch (design invariants 2, 10
and 11; docs/failover.md, "Peer catch-up within an epoch").

Real MariaDB servers (relayproxy.lab.failover): M1, the candidate R1, the lab's relay (server_id 100) with R2 (GTID)
and R3 (file/position) behind it, and a second relay (server_id 101). The second relay's link and R1's are paused
while M1 takes more writes and rotates; M1 is killed. `relayproxy promote --relay A --relay B` levels the second
relay from the first (same names, same bytes), catches R1 up, promotes it and repoints both relays by GTID. R1 takes
more writes; the two relays' files are byte-identical; R2 and R3 move to the second relay at their own coordinates;
every committed insert is on R1, R2 and R3 exactly once. Then a relay of another master is refused as a peer,
naming it, its master and its epoch.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from relayproxy.lab.failover import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    REPL_PASSWORD,
    REPL_USER,
    FailoverLab,
    assert_every_insert_once,
    binlog_pos,
    first_difference,
    relay_file_bytes,
    run_promote,
    covers,
    relay_sql,
    wait_until,
)
from relayproxy.lab.harness import RelayProcess, assert_same_data, free_port, master_status, replica_status, wait_relay

pytestmark = pytest.mark.server

TIMEOUT = 60.0


def test_promote_levels_a_lagging_relay_from_its_peer_and_the_relays_stay_identical(tmp_path, capsys):
    started = time.monotonic()
    with FailoverLab(tmp_path / "lab", candidates=1) as lab, lab.explained():
        lab.start()
        relay2, port2 = lab.add_relay("relay2", server_id=101)
        lab.load.run(lab.m1, 40, rotate_every=30)
        wait_until("relay2 to hold M1's GTIDs", lambda: covers(relay2.status()["retrieved_gtid_set"],
                                                              binlog_pos(lab.m1)), TIMEOUT, lab.describe)
        lab.wait_caught_up_m1()
        # The second relay and the candidate lag: their links stall while M1 writes and rotates, then M1 dies.
        lab.links["relay2"].proxy.pause()
        lab.links["R1"].proxy.pause()
        lab.load.run(lab.m1, 90, rotate_every=50)
        wait_relay(lab.relay, lab.m1, TIMEOUT)  # the first relay has it all (the lab's wait would wait for both)
        last = binlog_pos(lab.m1)
        lab.m1.kill()
        for link in lab.links.values():
            link.proxy.drop_connections()
            link.proxy.refuse(True)
            link.proxy.resume()
        behind = relay2.status()["retrieved_gtid_set"]
        assert covers(lab.relay.status()["retrieved_gtid_set"], last) and not covers(behind, last), behind

        code, doc, stderr = run_promote(tmp_path, lab.r1.port, [lab.relay_port, port2], "--timeout", "120")
        assert code == 0, doc
        steps = {s["step"] for s in doc["steps"]}
        assert "levelled the relays" in steps, doc["steps"]
        assert not [w for w in doc["warnings"] if "levelled" in w], doc["warnings"]
        second = next(r for r in doc["relays"] if r["address"] == f"127.0.0.1:{port2}")
        assert second["levelled"].startswith(f"from 127.0.0.1:{lab.relay_port}"), second
        assert covers(binlog_pos(lab.r1), last)

        lab.load.run(lab.r1, 60, rotate_every=40)  # the new master's files, one rotation
        want = binlog_pos(lab.r1)
        for relay in (lab.relay, relay2):
            wait_until(f"{relay.relay_dir.name} to hold R1's GTIDs",
                       lambda r=relay: covers(r.status()["retrieved_gtid_set"], want)
                       and not r.status().get("last_io_error"), TIMEOUT, lab.describe)
            relay.wait_for(lambda s: (s["upstream_log_file"], s["upstream_log_pos"]) == master_status(lab.r1),
                           TIMEOUT, "the horizon at R1's position")
        epochs = [json.loads((r.relay_dir / "relayproxy.epochs").read_text()) for r in (lab.relay, relay2)]
        # the same epochs (each relay reached the masters through its own link: host and port differ)
        strip = [[(e["epoch"], e["first_file"], e["upstream_first_file"], e["master"]["server_id"], e["join_gtids"])
                  for e in doc_["epochs"]] for doc_ in epochs]
        assert strip[0] == strip[1] and len(strip[0]) == 2, epochs

        # A file/position replica (R3) and a GTID replica (R2) move to the second relay at their own coordinates.
        lab.wait_converged(lab.r1, [lab.r2, lab.r3])
        lab.r3.execute("STOP SLAVE")
        r3 = replica_status(lab.r3)
        file, pos = r3["Relay_Master_Log_File"], int(r3["Exec_Master_Log_Pos"])
        lab.r3.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={port2}, MASTER_USER='{REPL_USER}', "
                       f"MASTER_PASSWORD='{REPL_PASSWORD}', MASTER_LOG_FILE='{file}', MASTER_LOG_POS={pos}, "
                       "MASTER_USE_GTID=no")
        lab.r3.execute("START SLAVE")
        lab.r2.execute("STOP SLAVE")
        lab.r2.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={port2}, MASTER_USER='{REPL_USER}', "
                       f"MASTER_PASSWORD='{REPL_PASSWORD}', MASTER_USE_GTID=slave_pos")
        lab.r2.execute("START SLAVE")
        lab.load.run(lab.r1, 40)
        lab.wait_converged(lab.r1, [lab.r2, lab.r3])
        for server in (lab.r1, lab.r2, lab.r3):
            assert_every_insert_once(lab.load, server)
        for replica in (lab.r2, lab.r3):
            assert_same_data(lab.r1, replica)
            assert int(replica_status(replica)["Master_Port"]) == port2

        for relay in (lab.relay, relay2):
            relay.wait_for(lambda s: (s["upstream_log_file"], s["upstream_log_pos"]) == master_status(lab.r1),
                           TIMEOUT, "the horizon at R1's position")
        lab.relay.stop()
        relay2.stop()
        one, two = relay_file_bytes(lab.relay.relay_dir), relay_file_bytes(relay2.relay_dir)
        assert list(one) == list(two), f"relay files differ in names: {list(one)} and {list(two)}"
        differ = {name: first_difference(one[name], two[name]) for name in one if one[name] != two[name]}
        assert not differ, f"files differ between the two relays: {differ}"
        digest = hashlib.sha256(b"".join(one.values())).hexdigest()[:16]
        with capsys.disabled():
            print(f"\n  the lagging relay levelled from its peer, then both on R1: {len(one)} files, "
                  f"{sum(map(len, one.values()))} bytes, byte-identical (sha256 {digest}); "
                  f"{time.monotonic() - started:.1f} s")


def test_a_relay_of_another_master_is_refused_as_a_peer(tmp_path):
    with FailoverLab(tmp_path / "lab", candidates=1) as lab, lab.explained():
        lab.start()
        lab.load.run(lab.m1, 20)
        lab.wait_caught_up_m1()
        # A relay of R1 (server_id 2): the same transactions, another master, other files.
        other_port = free_port()
        other = RelayProcess(tmp_path / "other", lab.r1.port, server_id=102, gtid_mode="mariadb",
                             extra=["--listen", f"127.0.0.1:{other_port}", "--users",
                                    f"{REPL_USER}:{REPL_PASSWORD},{ADMIN_USER}:{ADMIN_PASSWORD}:admin"])
        other.start()
        try:
            wait_relay(other, lab.r1, TIMEOUT)
            assert relay_sql(other_port, "SELECT @@relayproxy_master_server_id AS m, @@relayproxy_epoch AS e") == [
                {"m": 2, "e": 1}]
            before = relay_file_bytes(lab.relay.relay_dir)
            relay_sql(lab.relay_port, "STOP SLAVE")
            at = relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]
            relay_sql(lab.relay_port, f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={other_port}, "
                                      f"MASTER_USER='{REPL_USER}', MASTER_PASSWORD='{REPL_PASSWORD}', "
                                      f"MASTER_LOG_FILE='{at['Master_Log_File']}', "
                                      f"MASTER_LOG_POS={at['Read_Master_Log_Pos']}, MASTER_USE_GTID=no")
            relay_sql(lab.relay_port, "START SLAVE")
            error = wait_until("the peer to be refused",
                               lambda: relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]["Last_IO_Error"], TIMEOUT,
                               lab.describe)
            assert "peer catch-up refused" in error and "a relay of another master" in error, error
            assert f"127.0.0.1:{other_port} (server_id 102)" in error and "master server_id 2" in error, error
            assert "epoch 1" in error, error
            assert relay_file_bytes(lab.relay.relay_dir) == before  # nothing written
            assert replica_status(lab.r2)["Slave_IO_Running"] == "Yes"  # replicas still served
        finally:
            other.stop()
