"""A replica that stops reading mid-stream costs the relay bounded memory and slows no other replica.

Real servers: a MariaDB master under load with big transactions, the relay (in-process senders, and two sender
processes), a MariaDB replica reading normally and a dump client that stops reading after its first events. While
the stalled client holds its connection the reading replica keeps up with the master, the relay's memory (its
process and every sender process) stays within a bound that does not depend on what the stalled client has not
read, and after `net_write_timeout` the stalled client is dropped. Figures are printed, not asserted as times.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from relayproxy.binlog import constants as C
from relayproxy.lab.harness import replica_status

from .test_downstream_topologies import (  # noqa: F401 - fixtures
    FIRST_FILE,
    Writer,
    assert_same_data,
    change_master,
    mixed_load,
    prepare_master,
    relays,
    wait_relay,
    wait_replica,
)
from ..relay.test_retention import RawDumpClient

pytestmark = pytest.mark.server

STALL_TIMEOUT = 6  # net_write_timeout of the relay in this test (the default is 60 s)


def _rss_kb(pid: int) -> int:
    """Resident memory of `pid` and of every process below it (the sender processes), in KiB."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class _Sampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, _rss_kb(self.pid))
            time.sleep(0.05)


def _relay_and_reading_replica(mariadb, relays, extra: list[str] | None = None):
    """A master with a first load, the relay, and a MariaDB replica of the relay that has caught up."""
    master = mariadb("master")
    prepare_master(master)
    relay = relays("relay", master.port, extra=extra or [])
    mixed_load(master, big=False)
    wait_relay(relay, master)
    replica = mariadb("replica", server_id=11)
    change_master(replica, relay.listen_port)
    replica.execute("START SLAVE")
    wait_replica(replica, master)
    return master, relay, replica


def _stall_a_client(relay):
    """(the relay's RSS now, a dump client that has read its first event and reads nothing more, an RSS sampler
    started on the relay)."""
    baseline = _rss_kb(relay.proc.pid)
    stalled = RawDumpClient(relay.listen_port, FIRST_FILE)
    assert stalled.event()[4] == C.ROTATE_EVENT  # then it reads nothing more
    sampler = _Sampler(relay.proc.pid)
    sampler.start()
    return baseline, stalled, sampler


def _dropped(stalled: RawDumpClient, within: float) -> bool:
    """Whether the relay closes the stalled client's connection within ``within`` seconds of reading it again."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            stalled.conn._sock.settimeout(5)
            stalled.event()
        except Exception:  # noqa: BLE001 - pymysql raises OperationalError/InterfaceError on a closed connection
            return True
    return False


@pytest.mark.parametrize("senders", [0, 2])
def test_a_replica_that_stops_reading_costs_bounded_memory_and_slows_no_one(mariadb, relays, tmp_path, senders):
    master, relay, replica = _relay_and_reading_replica(
        mariadb, relays, ["--sender-processes", str(senders), "--net-write-timeout", str(STALL_TIMEOUT)])
    if senders:
        relay.wait_for(lambda s: sum(w["dumps"] for w in s["sender_processes"]["workers"]) == 1, 20,
                       "the replica's dump in a sender process")
    baseline, stalled, sampler = _stall_a_client(relay)
    began = time.monotonic()
    try:
        with Writer(master, rotate_every=150) as writer:
            mixed_load(master, rounds=2, big=True)  # two >16 MB events the stalled client never reads
            time.sleep(0.5)
        assert writer.done > 50
        wait_relay(relay, master)
        status = wait_replica(replica, master, timeout=60)
        caught_up = time.monotonic() - began
        stalled_connected = time.monotonic() - began < STALL_TIMEOUT
    finally:
        sampler.stop.set()
        sampler.join()
    assert not status["Last_IO_Error"] and not status["Last_SQL_Error"], status
    assert_same_data(master, replica)
    grew_mb = (sampler.peak - baseline) / 1024
    print(f"\nsender_processes={senders}: relay RSS {baseline / 1024:.1f} MB before, peak {sampler.peak / 1024:.1f} MB "
          f"(+{grew_mb:.1f} MB) while a client read nothing; the reading replica caught up {caught_up:.1f} s after "
          f"the load began (stalled client still connected then: {stalled_connected})")
    # What the stalled client did not read (two >16 MB events and the load) is not held for it: at most a chunk
    # and the socket buffers, whatever the backlog. 48 MB is well under the 2 x 16 MB + load it missed.
    assert grew_mb < 48, f"the relay grew by {grew_mb:.1f} MB while one client read nothing"
    # After net_write_timeout without reading, the relay drops it: the client finds the connection closed.
    assert _dropped(stalled, STALL_TIMEOUT + 30), "a client that read nothing was never dropped"
    stalled.close()


def test_a_client_that_stops_reading_for_60_s_under_load(mariadb, relays, tmp_path):
    """The issue's case as written: a client stops reading mid-stream and stays connected for the relay's default
    net_write_timeout (60 s) while the master writes all along. Through the whole stall the reading replica keeps
    applying (checked in every 10 s window: it is never held back by the stalled client), the relay's memory stays
    within the same bound, and at the end of the stall the relay drops the client. Lag figures are printed."""
    master, relay, replica = _relay_and_reading_replica(mariadb, relays)  # net_write_timeout: the default, 60 s
    baseline, stalled, sampler = _stall_a_client(relay)
    stalled_at = time.monotonic()
    applied = []  # (seconds into the stall, rows the replica has applied)
    behind = []  # seconds behind, as SHOW SLAVE STATUS says, sampled every second
    try:
        with Writer(master, rotate_every=400, limit=10**9) as writer:
            mixed_load(master, rounds=1, big=True)  # a >16 MB event the stalled client never reads
            while time.monotonic() - stalled_at < 58:
                time.sleep(1)
                rows = replica.execute("SELECT COUNT(*) FROM app.w")[0][0]
                applied.append((time.monotonic() - stalled_at, int(rows)))
                seconds = replica_status(replica).get("Seconds_Behind_Master")
                if seconds is not None:
                    behind.append(int(seconds))
        wait_relay(relay, master)
        status = wait_replica(replica, master, timeout=60)
    finally:
        sampler.stop.set()
        sampler.join()
    assert not status["Last_IO_Error"] and not status["Last_SQL_Error"], status
    assert_same_data(master, replica)
    assert writer.done > 1000, f"only {writer.done} transactions during the stall"
    for window in range(0, 50, 10):  # the reading replica applied something in every 10 s of the stall
        rows = [n for t, n in applied if window <= t < window + 10]
        assert rows and rows[-1] > rows[0], f"the replica applied nothing between {window} and {window + 10} s"
    grew_mb = (sampler.peak - baseline) / 1024
    print(f"\n60 s stall: {writer.done} transactions written meanwhile; relay RSS {baseline / 1024:.1f} MB before, "
          f"peak {sampler.peak / 1024:.1f} MB (+{grew_mb:.1f} MB); the reading replica's Seconds_Behind_Master "
          f"max {max(behind, default=0)} s over {len(behind)} samples")
    assert grew_mb < 48, f"the relay grew by {grew_mb:.1f} MB while one client read nothing for 60 s"
    # Reading now would let the relay write again (and count as progress): first let the timeout pass.
    time.sleep(max(0.0, stalled_at + 65 - time.monotonic()))
    assert _dropped(stalled, 60), "a client that read nothing for net_write_timeout was never dropped"
    stalled.close()
