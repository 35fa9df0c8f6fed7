"""Scenario: the upstream link stops inside a multi-event transaction, with real replicas on both paths.

One topology for the whole file's cut points (servers are not restarted per cut):

    master --fault proxy--> relayproxy run --listen --> MariaDB replica "via relay"
    master --fault proxy------------------------------> MariaDB replica "direct"

Both links are cut at the same event of the same transaction (after each event, and in the middle of each event).
While the links are down the relay advertises nothing of the cut transaction (/status, SQL SHOW SLAVE STATUS on its
listener) and the replica behind it has none of it, whereas the direct replica has read part of it
(Read_Master_Log_Pos past Exec_Master_Log_Pos). When the links come back the master sends the transaction again and
every copy ends equal to the master, each transaction exactly once. The figures are printed side by side (pytest -s).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from relayproxy.lab.faultproxy import SERVER_TO_CLIENT, ThreadedFaultProxy
from relayproxy.lab.packetwatch import EventLocation

from relayproxy.lab.harness import (
    RelayProcess,
    StreamMap,
    assert_files_equal_master,
    assert_same_data,
    change_master,
    listener_query,
    master_status,
    prepare_master,
    replica_status,
    wait_relay,
    wait_replica,
)
from ..downstream.test_downstream_topologies import relays  # noqa: F401 - a fixture

pytestmark = pytest.mark.server

INSERTS_PER_TRANSACTION = 3


@dataclass
class Link:
    """A fault proxy between the master and one consumer, with the binlog events seen on it."""

    proxy: ThreadedFaultProxy
    streams: StreamMap

    @classmethod
    def to(cls, master) -> "Link":
        proxy = ThreadedFaultProxy("127.0.0.1", master.port).start()
        return cls(proxy, StreamMap(proxy))


@dataclass
class Topology:
    master: object
    relay: RelayProcess
    via_relay: object
    direct: object
    relay_link: Link
    direct_link: Link


@pytest.fixture
def topology(mariadb, relays):
    master = mariadb("master")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute(
        "CREATE TABLE app.t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(100) NOT NULL, n INT NOT NULL DEFAULT 0)"
        " ENGINE=InnoDB")
    links = [Link.to(master), Link.to(master)]
    try:
        relay_link, direct_link = links
        # Heartbeats every 30 s on both links: one arriving while a link is paused to locate a transaction would be
        # the chunk the proxy holds (see StreamMap.wait_settled_at), and a pause must not look like a silent master.
        relay = relays("relay", relay_link.proxy.port, extra=["--heartbeat-period", "30"])
        via_relay = mariadb("via_relay", server_id=3)
        direct = mariadb("direct", server_id=4)
        change_master(via_relay, relay.listen_port, file=None)
        change_master(direct, direct_link.proxy.port, file=None)
        direct.execute("CHANGE MASTER TO MASTER_HEARTBEAT_PERIOD=30")
        for replica in (via_relay, direct):
            replica.execute("START SLAVE")
        topo = Topology(master, relay, via_relay, direct, relay_link, direct_link)
        caught_up(topo)
        yield topo
        for replica in (via_relay, direct):
            replica.execute("STOP SLAVE")
        problems = [error for link in links for error in link.proxy.errors]
        assert not problems, problems
    finally:
        for link in links:
            link.proxy.stop()


# -- helpers ------------------------------------------------------------------------------------------------------


def caught_up(topo: Topology) -> None:
    """Every link is up again and everything is at the master's end. A replica that already had everything may
    still be reconnecting: wait until its dump runs too, or the next pause would freeze its handshake."""
    topo.relay.wait_for(lambda s: s["io_running"] and s["last_io_error"] is None, 30, "the relay to stream again")
    wait_relay(topo.relay, topo.master)
    for replica in (topo.via_relay, topo.direct):
        wait_replica(replica, topo.master)
        wait_dumping(replica)
    position = master_status(topo.master)[1]
    for link in (topo.relay_link, topo.direct_link):
        link.streams.wait_settled_at(link.proxy, position)


def wait_dumping(replica, timeout: float = 30.0) -> dict:
    """Wait until the replica's IO thread has requested its binlog dump (not merely connected: Slave_IO_Running
    says Yes during the queries before the dump request)."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = replica_status(replica)
        if status["Slave_IO_Running"] == "Yes" and status["Slave_IO_State"].startswith("Waiting for master to send"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"the replica's IO thread did not get back to dumping: {status}")


def binlog_state(server) -> str:
    return server.execute("SELECT @@GLOBAL.gtid_binlog_state")[0][0]


def slave_pos(server) -> str:
    return server.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0]


def write_transaction(master, round_no: int) -> tuple[str, int, int, str]:
    """BEGIN; several INSERTs and an UPDATE; COMMIT: (file, start, end, GTID) of it in the master's binlog."""
    file, start = master_status(master)
    conn = master.connect()
    try:
        cur = conn.cursor()
        cur.execute("BEGIN")
        for i in range(INSERTS_PER_TRANSACTION):
            cur.execute("INSERT INTO app.t (v) VALUES (%s)", (f"round {round_no} row {i} " + "x" * 30,))
        cur.execute("UPDATE app.t SET n = n + 1 WHERE id %% 2 = %s", (round_no % 2,))
        cur.execute("COMMIT")
        cur.execute("SELECT @@SESSION.last_gtid")
        gtid = cur.fetchone()[0]
    finally:
        conn.close()
    file2, end = master_status(master)
    assert file2 == file, "the transaction must not straddle a rotation"
    return file, start, end, gtid


def pending_transaction(topo: Topology, round_no: int):
    """Pause both links, commit one transaction on the master and find its events in both streams (still held)."""
    for link in (topo.relay_link, topo.direct_link):
        link.proxy.pause(SERVER_TO_CLIENT)
    file, start, end, gtid = write_transaction(topo.master, round_no)
    relay_conn, relay_events = topo.relay_link.streams.events_ending_in(start, end)
    direct_conn, direct_events = topo.direct_link.streams.events_ending_in(start, end)
    assert [(e.name, e.log_pos) for e in relay_events] == [(e.name, e.log_pos) for e in direct_events]
    return (file, start, end, gtid), (relay_conn, relay_events), (direct_conn, direct_events)


def read_so_far(events: list[EventLocation], index: int, where: str, start: int) -> int:
    """The master position a consumer has read up to when its link is cut `where` ("after"/"inside") event `index`."""
    whole = index + 1 if where == "after" else index
    return events[whole - 1].log_pos if whole else start


def wait_direct_read(replica, position: int, timeout: float = 30.0) -> dict:
    """Wait until the direct replica's IO thread has noted `position` and lost its master (it retries meanwhile)."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = replica_status(replica)
        assert status.get("Slave_SQL_Running") == "Yes", status.get("Last_SQL_Error")
        if int(status["Read_Master_Log_Pos"]) == position and status["Slave_IO_Running"] != "Yes":
            return status
        time.sleep(0.05)
    raise AssertionError(f"the direct replica did not stop at read position {position}: {status}")


def wait_for_read(replica, position: int, timeout: float = 30.0) -> dict:
    """Wait until the replica's IO thread has noted `position` (its link stays open)."""
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = replica_status(replica)
        if int(status["Read_Master_Log_Pos"]) == position:
            return status
        time.sleep(0.05)
    raise AssertionError(f"the replica did not read up to {position}: {status}")


def resent(link: Link, start: int, end: int, old_conn: int, timeout: float = 20.0) -> list[int]:
    """log_pos of the events of master range (start, end] that a connection newer than `old_conn` carried."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn, events = link.streams.events_ending_in(start, end, timeout=deadline - time.monotonic())
        if conn != old_conn:
            return [e.log_pos for e in events]
        time.sleep(0.02)  # the old connection saw them; the new one has not started yet
    raise AssertionError(f"no new connection carried master range ({start}, {end}]")


def figures(topo: Topology, label: str, gtid: str, direct_status: dict) -> dict:
    """What each side shows about the cut transaction; printed as one row."""
    relay_status = topo.relay.status()
    relay_sql = listener_query(topo.relay.listen_port, "SHOW SLAVE STATUS")[0]  # the relay's own, over SQL
    via = replica_status(topo.via_relay)
    row = {
        "relay_read": relay_status["read_master_log_pos"],
        "relay_retrieved": relay_status["retrieved_gtid_set"],
        "relay_sql_read": int(relay_sql["Read_Master_Log_Pos"]),
        "relay_sql_gtid_io_pos": relay_sql["Gtid_IO_Pos"],
        "via_read": int(via["Read_Master_Log_Pos"]),
        "via_exec": int(via["Exec_Master_Log_Pos"]),
        "via_slave_pos": slave_pos(topo.via_relay),
        "direct_read": int(direct_status["Read_Master_Log_Pos"]),
        "direct_exec": int(direct_status["Exec_Master_Log_Pos"]),
        "direct_slave_pos": slave_pos(topo.direct),
    }
    print(
        f"{label:<28} {gtid:<8} | relay read {row['relay_read']:>6} retrieved {row['relay_retrieved']:<8}"
        f" sql {row['relay_sql_read']:>6} {row['relay_sql_gtid_io_pos']:<8}"
        f" | via relay read/exec {row['via_read']:>6}/{row['via_exec']:<6} pos {row['via_slave_pos']:<8}"
        f" | direct read/exec {row['direct_read']:>6}/{row['direct_exec']:<6} pos {row['direct_slave_pos']:<8}"
        f" partial={row['direct_read'] > row['direct_exec']}"
    )
    return row


def table_rows(server) -> tuple[int, int]:
    return server.execute("SELECT COUNT(*), COUNT(DISTINCT v) FROM app.t")[0]


def assert_all_equal_master(topo: Topology, transactions: int) -> None:
    caught_up(topo)
    master = topo.master
    status = topo.relay.status()
    assert status["retrieved_gtid_set"] == binlog_state(master)
    assert_files_equal_master(topo.relay.relay_dir, master, up_to=master_status(master))  # each event once
    expected_rows = transactions * INSERTS_PER_TRANSACTION
    assert table_rows(master) == (expected_rows, expected_rows)
    for replica in (topo.via_relay, topo.direct):
        assert_same_data(master, replica)
        assert table_rows(replica) == (expected_rows, expected_rows), "a transaction applied twice or lost"
        assert slave_pos(replica) == master.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]


# -- the tests ----------------------------------------------------------------------------------------------------


def test_stop_start_mid_group_every_boundary(topology):
    """Cut both links after every event and inside every event of a multi-event transaction, one at a time."""
    topo = topology
    print(f"\n{'cut':<28} {'gtid':<8} | relay (/status, SQL) | replica via relay | direct replica")
    round_no = 0
    index = 0
    events_per_transaction = None
    checked = []
    while events_per_transaction is None or index < events_per_transaction:
        for where in ("after", "inside"):
            caught_up(topo)
            before = binlog_state(topo.master)
            via_before = slave_pos(topo.via_relay)
            (file, start, end, gtid), (r_conn, r_events), (d_conn, d_events) = pending_transaction(topo, round_no)
            round_no += 1
            events_per_transaction = len(r_events)
            target = r_events[index]
            for link, conn, events in ((topo.relay_link, r_conn, r_events), (topo.direct_link, d_conn, d_events)):
                link.proxy.refuse(True)  # hold every reconnect until the state during the outage is checked
                cut = events[index].packet_end if where == "after" else events[index].middle
                link.proxy.cut_at_stream_offset(cut, on=conn)
                link.proxy.resume(SERVER_TO_CLIENT)
            complete = where == "after" and index == len(r_events) - 1
            read = read_so_far(r_events, index, where, start)
            relay_status = topo.relay.wait_for(lambda s: not s["io_running"], 20, "the cut to end the relay's link")
            direct_status = wait_direct_read(topo.direct, read)
            if complete:
                wait_replica(topo.via_relay, topo.master)
            row = figures(topo, f"{where} {index} {target.name}", gtid, direct_status)

            relay_pos = end if complete else start
            assert (relay_status["master_log_file"], relay_status["read_master_log_pos"]) == (file, relay_pos)
            assert (topo.relay.relay_dir / file).stat().st_size == relay_pos, "a partial transaction on disk"
            if complete:
                assert row["relay_retrieved"] == binlog_state(topo.master) != before
                assert row["via_exec"] == end and gtid in row["via_slave_pos"]
            else:
                # Nothing of the cut transaction anywhere behind the relay.
                assert row["relay_retrieved"] == before and gtid not in row["relay_retrieved"].split(",")
                assert row["relay_sql_read"] == start and row["relay_sql_gtid_io_pos"] == before
                assert row["via_read"] == row["via_exec"] == start
                assert row["via_slave_pos"] == via_before and gtid not in row["via_slave_pos"]
                # The direct replica has part of it: read past what it executed, GTID not applied.
                assert row["direct_read"] == read and row["direct_exec"] == start
                assert gtid not in row["direct_slave_pos"]
                assert (row["direct_read"] > row["direct_exec"]) == (read > start)
            checked.append((where, index, target.name))
            for link in (topo.relay_link, topo.direct_link):
                link.proxy.refuse(False)
            if not complete:  # the master sends the whole transaction again on the relay's new connection
                assert resent(topo.relay_link, start, end, r_conn) == [e.log_pos for e in r_events]
        index += 1
    assert events_per_transaction >= 2 + 2 * INSERTS_PER_TRANSACTION, "a multi-event transaction"
    assert len(checked) == 2 * events_per_transaction
    assert_all_equal_master(topo, transactions=round_no)


def test_stop_start_mid_group_relay_restarted(topology):
    """The relay's link is paused inside a transaction, the relay is stopped with SIGTERM and started again."""
    topo = topology
    caught_up(topo)
    before = binlog_state(topo.master)
    via_before = slave_pos(topo.via_relay)
    (file, start, end, gtid), (r_conn, r_events), (d_conn, d_events) = pending_transaction(topo, 0)
    index = len(r_events) // 2
    for link, conn, events in ((topo.relay_link, r_conn, r_events), (topo.direct_link, d_conn, d_events)):
        link.proxy.pause_at_stream_offset(events[index].middle, on=conn)
        link.proxy.resume(SERVER_TO_CLIENT)  # forwards up to the held offset, then holds
        link.proxy.wait_for_bytes(events[index].middle, on=conn)
    read = read_so_far(r_events, index, "inside", start)
    direct_status = wait_for_read(topo.direct, read)
    print(f"\n{'state':<28} {'gtid':<8} | relay (/status, SQL) | replica via relay | direct replica")
    row = figures(topo, f"paused inside {index} {r_events[index].name}", gtid, direct_status)
    assert row["relay_read"] == start and row["relay_retrieved"] == before
    assert row["via_read"] == row["via_exec"] == start and row["via_slave_pos"] == via_before
    assert row["direct_read"] == read > row["direct_exec"] == start

    topo.relay.stop()  # SIGTERM with the link held inside the transaction
    assert (topo.relay.relay_dir / file).stat().st_size == start, "a partial transaction on disk after SIGTERM"
    topo.relay_link.proxy.refuse(True)
    topo.relay_link.proxy.drop_connections()
    topo.relay.start()
    relay_status = topo.relay.wait_for(lambda s: s["connect_failures"] > 0, 20, "the restarted relay to try its master")
    row = figures(topo, "restarted, link refused", gtid, replica_status(topo.direct))
    assert (relay_status["master_log_file"], relay_status["read_master_log_pos"]) == (file, start)
    assert row["relay_retrieved"] == before and row["relay_sql_read"] == start
    assert row["relay_sql_gtid_io_pos"] == before
    assert row["via_read"] == row["via_exec"] == start and row["via_slave_pos"] == via_before
    assert gtid not in row["via_slave_pos"]

    topo.relay_link.proxy.refuse(False)
    topo.direct_link.proxy.resume(SERVER_TO_CLIENT)
    assert resent(topo.relay_link, start, end, r_conn) == [e.log_pos for e in r_events]  # sent again, whole
    caught_up(topo)
    figures(topo, "links restored", gtid, replica_status(topo.direct))
    assert_all_equal_master(topo, transactions=1)

