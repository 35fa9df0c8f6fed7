"""A graceful stop (SIGTERM) of the relay leaves no replica inside a transaction.

    master --> relayproxy run --listen --> fault proxy --> MariaDB replica by file/position (MASTER_USE_GTID=no)

The link to the replica is paused while one statement of many rows events (~25 MB, ROW format) goes through the
relay, so the relay's dump is held in the middle of that transaction when SIGTERM arrives; the link is resumed half
a second later. The relay finishes the transaction it was sending, then ends the dump and exits. The replica
reconnects to the restarted relay at the transaction's end and goes on: before this, the dump was cut where it
stood, the replica reconnected inside the statement, and MariaDB stopped its IO thread (see
test_scenario_file_position_mid_statement.py for why). With the dumps in this process and in sender processes.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from relayproxy.lab.faultproxy import SERVER_TO_CLIENT, ThreadedFaultProxy
from relayproxy.lab.harness import (
    assert_same_data,
    change_master,
    master_status,
    prepare_master,
    replica_status,
    wait_relay,
    wait_replica,
)

from ..downstream.test_downstream_topologies import relays  # noqa: F401 - a fixture
from .test_scenario_file_position_mid_statement import one_statement

pytestmark = pytest.mark.server

# One INSERT ... SELECT of ~25 MB (about 3,000 rows events in one statement): more than the loopback sockets between
# the relay and the paused proxy absorb (several MB), so the relay itself holds the rest when SIGTERM comes.
ROWS, ROW_BYTES = 50_000, 500


@pytest.mark.parametrize("sender_processes, grace", [(0, None), (1, None), (0, "0")],
                         ids=["in-process", "sender-process", "no-grace"])
def test_sigterm_ends_each_dump_at_a_transaction_boundary(mariadb, relays, sender_processes, grace):  # noqa: F811
    """``no-grace``: ``--dump-stop-grace 0``, the cut of before: the replica is left inside the statement, and after
    the relay's restart MariaDB's check stops it (1595) until START SLAVE."""
    master = mariadb("master")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(600) NOT NULL) ENGINE=InnoDB")
    extra = ["--sender-processes", str(sender_processes)] + (["--dump-stop-grace", grace] if grace else [])
    relay = relays("relay", master.port, extra=extra)
    wait_relay(relay, master)
    proxy = ThreadedFaultProxy("127.0.0.1", relay.listen_port).start()
    try:
        replica = mariadb("replica", server_id=5)
        change_master(replica, proxy.port, file=master_status(master)[0])
        replica.execute("START SLAVE")
        wait_replica(replica, master)
        proxy.pause(SERVER_TO_CLIENT)
        one_statement(master, ROWS, ROW_BYTES)
        end = master_status(master)
        wait_relay(relay, master)  # durable at the relay: its dump is now held inside the transaction
        time.sleep(0.3)
        held = replica_status(replica)
        assert int(held["Read_Master_Log_Pos"]) < end[1], "the pause did not hold the transaction"
        os.kill(relay.pid if relay.pid is not None else relay.proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        proxy.resume(SERVER_TO_CLIENT)
        assert relay.stop(timeout=30) == 0
        if grace == "0":
            cut_inside_the_statement(relay, master, replica, end)
            return
        # The replica had the whole transaction when its link ended, and nothing stopped it.
        deadline = time.monotonic() + 20
        status = replica_status(replica)
        while int(status["Read_Master_Log_Pos"]) != end[1] and time.monotonic() < deadline:
            time.sleep(0.05)
            status = replica_status(replica)
        assert (status["Master_Log_File"], int(status["Read_Master_Log_Pos"])) == end, status
        assert status["Slave_IO_Running"] != "No", status["Last_IO_Error"]
        log_text = relay.log_tail(400)
        assert "dump ended at a transaction boundary: the relay is stopping" in log_text, log_text[-3000:]
        relay.start()
        master.execute("INSERT INTO app.t VALUES (0, 'after the restart')")
        wait_replica(replica, master)
        assert_same_data(master, replica)
        assert replica.execute("SELECT COUNT(*) FROM app.t")[0][0] == ROWS + 1
        assert int(replica_status(replica)["Last_IO_Errno"]) == 0
    finally:
        proxy.stop()


def cut_inside_the_statement(relay, master, replica, end) -> None:
    """What a stop without grace does: the replica holds part of the statement; at the relay's restart its IO thread
    reconnects there and MariaDB stops it; START SLAVE resumes it and every row arrives once."""
    time.sleep(1.0)
    status = replica_status(replica)
    assert int(status["Read_Master_Log_Pos"]) < end[1], "the dump was not cut inside the statement"
    relay.start()
    deadline = time.monotonic() + 30
    while status["Slave_IO_Running"] != "No" and time.monotonic() < deadline:
        time.sleep(0.1)
        status = replica_status(replica)
    assert int(status["Last_IO_Errno"]) == 1595, status
    replica.execute("START SLAVE")
    wait_replica(replica, master)
    assert_same_data(master, replica)
    assert replica.execute("SELECT COUNT(*) FROM app.t")[0][0] == ROWS
