"""A MariaDB file/position replica whose link breaks inside a multi-event statement (MariaDB's own behaviour).

Seen in the chaos soak (a CI run at 8a3d6ae): after a relay SIGTERM, the replica that follows the relay by
file/position (MASTER_USE_GTID=no) stopped with "Relay log write failure: could not queue event from master";
its error log said why: "Slave IO thread did not receive an expected Rows-log end-of-statement ...".

The cause is MariaDB's, and this test shows it with no relay at all: a MariaDB master, a fault proxy, a MariaDB
replica by file/position. The link is cut right after a rows event that does not end its statement (no
STMT_END_F: one INSERT ... SELECT of many rows makes several). The IO thread reconnects at that position, as it
should, but it resets its rows-event tracker at a reconnect only when it uses GTID (slave.cc, handle_slave_io,
``connected:``), so the first event of the new connection (the master's fake ROTATE) fails the tracker's check and
the IO thread stops. A GTID replica cut at the same byte goes on. START SLAVE (a new IO thread: the tracker is reset)
resumes the file/position replica at the same position, and every row arrives once.

What the relay does about it (it cannot change the replica): it never ends a dump inside a transaction when it
has the choice, on a graceful stop above all (test_scenario_graceful_stop.py, tests/downstream/test_dump_graceful_stop.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from relayproxy.lab.faultproxy import ThreadedFaultProxy
from relayproxy.lab.harness import (
    assert_same_data,
    change_master,
    master_status,
    prepare_master,
    replica_status,
    wait_replica,
)
from relayproxy.lab.packetwatch import MysqlStreamWatcher

pytestmark = pytest.mark.server

ROWS, ROW_BYTES = 400, 200  # one statement of ~80 KB: about ten rows events of 8 KB, only the last with STMT_END_F
WRITE_ROWS = (23, 30)  # WRITE_ROWS_EVENT_V1, WRITE_ROWS_EVENT


def one_statement(master, rows: int, row_bytes: int) -> None:
    """One INSERT ... SELECT of ``rows`` rows of ``row_bytes`` into app.t, in ROW format: a statement of many rows
    events (8 KB each), only the last of them ending the statement."""
    conn = master.connect()
    try:
        conn.cursor().execute("SET SESSION binlog_format = 'ROW'")
        conn.cursor().execute(f"INSERT INTO app.t SELECT seq, REPEAT('x', {row_bytes}) FROM app.seq_1_to_{rows}")
        conn.commit()
    finally:
        conn.close()


class CutAfterFirstRowsEvent:
    """Cuts the link right after the first rows event past master position ``after`` (armed from the tap, before
    any byte of the event is forwarded): the statement's first rows event, with more of it to come."""

    def __init__(self, proxy: ThreadedFaultProxy) -> None:
        self.proxy = proxy
        self.after: int | None = None
        self.event = None
        self._lock = threading.Lock()
        self._watchers: dict[int, MysqlStreamWatcher] = {}
        proxy.on_server_bytes(self._tap)

    def _tap(self, conn_id: int, _offset: int, data: bytes) -> None:
        with self._lock:
            events = self._watchers.setdefault(conn_id, MysqlStreamWatcher(keep_events=False)).feed(data)
            if self.after is None or self.event is not None:
                return
            for event in events:
                if event.type_code in WRITE_ROWS and event.log_pos > self.after:
                    self.proxy.cut_at_stream_offset(event.packet_end, on=conn_id)
                    self.event = event
                    return


def wait_io_stopped(replica, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = replica_status(replica)
        if status["Slave_IO_Running"] == "No":
            return status
        time.sleep(0.05)
    raise AssertionError(f"the IO thread did not stop: {status}")


@pytest.mark.parametrize("use_gtid", ["no", "slave_pos"])
def test_a_cut_inside_a_statement(mariadb, use_gtid):
    master = mariadb("master")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(250) NOT NULL) ENGINE=InnoDB")
    proxy = ThreadedFaultProxy("127.0.0.1", master.port).start()
    try:
        cut = CutAfterFirstRowsEvent(proxy)
        replica = mariadb("replica", server_id=5)
        change_master(replica, proxy.port, file=None if use_gtid == "slave_pos" else master_status(master)[0])
        replica.execute("START SLAVE")
        wait_replica(replica, master)
        cut.after = master_status(master)[1]
        one_statement(master, ROWS, ROW_BYTES)
        deadline = time.monotonic() + 20
        while cut.event is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cut.event is not None, "the statement's rows events never reached the proxy"
        cut_after = cut.event
        if use_gtid == "no":
            status = wait_io_stopped(replica)
            assert int(status["Last_IO_Errno"]) == 1595, status["Last_IO_Error"]
            assert "could not queue event from master" in status["Last_IO_Error"]
            assert int(status["Read_Master_Log_Pos"]) == cut_after.log_pos  # it had read up to the cut
            log_text = replica.error_log.read_text(errors="replace")
            assert "did not receive an expected Rows-log end-of-statement" in log_text, log_text[-3000:]
            replica.execute("START SLAVE")  # a new IO thread: its tracker starts empty
        wait_replica(replica, master)
        assert_same_data(master, replica)
        assert replica.execute("SELECT COUNT(*) FROM app.t")[0][0] == ROWS
        assert int(replica_status(replica)["Last_IO_Errno"]) == 0
    finally:
        proxy.stop()
