"""The relay behind a fault-injecting forwarder: pauses, cuts at every event boundary and mid-event, corruption."""

from __future__ import annotations

import time

import pytest

from relayproxy.lab.faultproxy import SERVER_TO_CLIENT, ThreadedFaultProxy

from relayproxy.lab.harness import (
    RelayProcess,
    StreamMap,
    assert_files_equal_master,
    master_status,
    prepare_master,
)

pytestmark = pytest.mark.server


@pytest.fixture
def topology(mariadb, tmp_path):
    master = mariadb("master")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(100)) ENGINE=InnoDB")
    proxy = ThreadedFaultProxy("127.0.0.1", master.port).start()
    streams = StreamMap(proxy)
    relay = RelayProcess(tmp_path / "relay", proxy.port, gtid_mode="mariadb").start()
    relay.wait_caught_up(master)
    yield master, proxy, streams, relay
    relay.stop()
    errors = proxy.errors
    proxy.stop()
    assert not errors, errors


def write_transaction(master, rows: int = 4) -> tuple[str, int, int]:
    """One multi-event transaction; returns (file, start, end) of it in the master's binlog."""
    file, start = master_status(master)
    conn = master.connect()
    try:
        cur = conn.cursor()
        cur.execute("BEGIN")
        for i in range(rows):
            cur.execute("INSERT INTO app.t (v) VALUES (%s)", (f"row {i} " + "x" * 40,))
        cur.execute("COMMIT")
    finally:
        conn.close()
    file2, end = master_status(master)
    assert file2 == file
    return file, start, end


def gtid_state(master) -> str:
    return master.execute("SELECT @@gtid_binlog_state")[0][0]


def test_pause_mid_transaction_keeps_the_horizon_at_the_previous_transaction(topology):
    master, proxy, streams, relay = topology
    before_state = gtid_state(master)
    proxy.pause(SERVER_TO_CLIENT)
    file, start, end = write_transaction(master, rows=6)
    conn_id, events = streams.events_ending_in(start, end)
    assert len(events) >= 5
    proxy.pause_at_stream_offset(events[3].packet_end, on=conn_id)
    proxy.resume()
    proxy.wait_for_bytes(events[3].packet_end, on=conn_id)
    time.sleep(0.5)  # give the relay every chance to (wrongly) advance
    status = relay.status()
    assert status["io_running"]
    assert (status["master_log_file"], status["read_master_log_pos"]) == (file, start)
    assert status["retrieved_gtid_set"] == before_state
    proxy.resume()
    status = relay.wait_caught_up(master)
    assert status["retrieved_gtid_set"] == gtid_state(master)


@pytest.mark.parametrize("where", ["after", "middle"])
def test_cut_at_every_event_of_a_transaction(topology, where):
    master, proxy, streams, relay = topology
    rounds = 0
    index = 0
    while True:
        relay.wait_caught_up(master)
        relay.wait_for(lambda s: s["io_running"], 20, "the relay to stream again")
        # The relay may report caught up (its position is its files') while a new dump's opening events are still
        # in the proxy: a pause then holds that chunk and the transaction is never read (a CI run timed out so).
        # The 0.5 s heartbeats are such chunks too: pause just after one, the next a period away.
        before_state = gtid_state(master)
        streams.wait_settled_at(proxy, master_status(master)[1], after_heartbeat=True)
        proxy.pause(SERVER_TO_CLIENT)
        file, start, end = write_transaction(master)
        conn_id, events = streams.events_ending_in(start, end)
        if index >= len(events):
            proxy.resume()
            break
        target = events[index]
        cut = target.packet_end if where == "after" else target.middle
        proxy.refuse(True)  # hold the reconnect until the state during the outage is checked
        proxy.cut_at_stream_offset(cut, on=conn_id)
        proxy.resume()
        status = relay.wait_for(lambda s: not s["io_running"], 20, "the cut to end the connection")
        complete = where == "after" and index == len(events) - 1
        expected = end if complete else start
        assert (status["master_log_file"], status["read_master_log_pos"]) == (file, expected), (where, index)
        assert (status["retrieved_gtid_set"] == before_state) != complete
        assert (relay.relay_dir / file).stat().st_size == expected, "the partial transaction stayed on disk"
        proxy.refuse(False)
        status = relay.wait_caught_up(master)
        assert status["retrieved_gtid_set"] == gtid_state(master)
        index += 1
        rounds += 1
    assert rounds >= 5
    relay.wait_caught_up(master)
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))


def test_corrupted_byte_is_reported_and_nothing_past_the_last_good_transaction_is_written(topology):
    master, proxy, streams, relay = topology
    proxy.pause(SERVER_TO_CLIENT)
    file, start, end = write_transaction(master, rows=5)
    conn_id, events = streams.events_ending_in(start, end)
    proxy.refuse(True)
    proxy.corrupt(events[3].middle, on=conn_id)
    proxy.resume()
    status = relay.wait_for(lambda s: s["last_io_error"] and not s["io_running"], 20, "the CRC error")
    assert "CRC32 mismatch" in status["last_io_error"]
    assert (status["master_log_file"], status["read_master_log_pos"]) == (file, start)
    assert (relay.relay_dir / file).stat().st_size == start
    proxy.refuse(False)
    status = relay.wait_caught_up(master)
    assert status["last_io_error"] is None and status["io_running"]
    assert_files_equal_master(relay.relay_dir, master, up_to=master_status(master))


def test_a_silent_master_is_treated_as_gone_after_two_heartbeat_periods(topology):
    """Heartbeat period 0.5 s: a stream frozen for longer ends the connection, and the relay reconnects."""
    master, proxy, streams, relay = topology
    relay.wait_caught_up(master)
    before = relay.status()
    proxy.pause(SERVER_TO_CLIENT)
    try:
        status = relay.wait_for(lambda s: s["last_io_error"] and "silent" in s["last_io_error"], 20,
                                "the silence to be noticed")
        assert status["read_master_log_pos"] == before["read_master_log_pos"]
        assert status["connect_failures"] > before["connect_failures"]
    finally:
        proxy.resume()
    write_transaction(master)
    status = relay.wait_caught_up(master)
    assert status["io_running"] and status["last_io_error"] is None
