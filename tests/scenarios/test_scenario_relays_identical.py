"""Same history, same bytes (design invariant 11): two relays of one master hold identical files across a failover.

Real MariaDB servers (relayproxy.lab.failover): M1, candidate R1, the lab's relay (server_id 100, started with
M1) and a second relay (server_id 101) started later, after M1 rotated, and restarted once. M1 dies (kill -9)
with a big transaction half sent to everyone; R1 is promoted; both relays are repointed to R1 by GTID; R1 takes
more writes and rotates. Then every relay file is byte-identical between the two relays: the same names, the same
bytes, including what each relay wrote itself (the ROTATE that ends M1's last file, the fillers over what R1's
GTID dump skipped, the FORMAT_DESCRIPTION of the join file). A replica or a file/position tool can move from one
relay to the other at its own coordinates; their /status shows the same SHA-256 for every closed file.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import scan_file
from relayproxy.lab.failover import (
    FailoverLab,
    binlog_pos,
    covers,
    first_difference,
    promote,
    relay_file_bytes,
    repoint_relay,
    wait_until,
)
from relayproxy.lab.harness import master_status, wait_relay
from relayproxy.relay.epochs import is_filler

pytestmark = pytest.mark.server

TIMEOUT = 60.0


def test_two_relays_of_one_master_hold_identical_files_across_a_failover(tmp_path, capsys):
    started = time.monotonic()
    with FailoverLab(tmp_path / "lab", candidates=1) as lab, lab.explained():
        lab.start()
        lab.load.run(lab.m1, 60, rotate_every=40)  # M1 rotates before the second relay exists
        relay2, port2 = lab.add_relay("relay2", server_id=101)
        lab.load.run(lab.m1, 60, rotate_every=45)
        wait_relay(relay2, lab.m1, TIMEOUT)
        relay2.stop()  # restarted once: recovery, checkpoint, a by-position resume
        lab.load.run(lab.m1, 30)
        relay2.start()
        lab.load.run(lab.m1, 30)
        crash = lab.kill_mid_transaction(2 << 20)
        for relay in (lab.relay, relay2):
            assert relay.status()["retrieved_gtid_set"] == crash.gtid_before

        promote(lab.r1)
        repoint_relay(lab.relay_port, lab.r1.port)
        time.sleep(0.3)  # the relays join at different moments
        repoint_relay(port2, lab.r1.port)
        lab.load.run(lab.r1, 80, rotate_every=50)  # the new master's files, one rotation
        want = binlog_pos(lab.r1)
        for relay in (lab.relay, relay2):
            wait_until(f"{relay.relay_dir.name} to hold R1's GTIDs",
                       lambda r=relay: covers(r.status()["retrieved_gtid_set"], want)
                       and not r.status().get("last_io_error"), TIMEOUT, lab.describe)
            relay.wait_for(lambda s: (s["upstream_log_file"], s["upstream_log_pos"]) == master_status(lab.r1),
                           TIMEOUT, "the horizon at R1's position")
        # What an operator compares (docs/operations.md): /status relay_file_digests, closed files by SHA-256.
        def digests(relay):
            shown = relay.status()["relay_file_digests"]
            return shown if all(d["sha256"] for d in shown[:-1]) else None

        shown = [wait_until(f"{r.relay_dir.name}'s closed files to have their SHA-256", lambda r=r: digests(r),
                            TIMEOUT, lab.describe) for r in (lab.relay, relay2)]
        assert shown[0] == shown[1], f"/status relay_file_digests differ:\n{shown[0]}\n{shown[1]}"
        assert shown[0][-1]["sha256"] is None  # the current file grows: hashed on demand only
        lab.relay.stop()
        relay2.stop()

        one, two = relay_file_bytes(lab.relay.relay_dir), relay_file_bytes(relay2.relay_dir)
        assert list(one) == list(two), f"relay files differ in names: {list(one)} and {list(two)}"
        differ = {name: first_difference(one[name], two[name]) for name in one if one[name] != two[name]}
        assert not differ, f"files differ between the two relays: {differ}"
        assert [(d["file"], d["size"]) for d in shown[0]] == [(name, len(data)) for name, data in one.items()]
        assert all(d["sha256"] == hashlib.sha256(one[d["file"]]).hexdigest() for d in shown[0][:-1])

        # The switch happened, with relay-written events in it: a ROTATE ending M1's last file and fillers.
        epochs = (lab.relay.relay_dir / "relayproxy.epochs").read_text()
        assert '"epoch": 2' in epochs
        fillers, rotates = 0, 0
        for name in one:
            events = []
            result = scan_file(lab.relay.relay_dir / name, on_event=events.append)
            assert result.ok, (name, result.error)
            fillers += sum(is_filler(e.data) for e in events)
            rotates += sum(e.type_code == C.ROTATE_EVENT and e.timestamp == 0 for e in events)
        assert fillers >= 1 and rotates >= 1, (fillers, rotates)
        with capsys.disabled():
            print(f"\n  two relays (server_id 100 and 101, the second started later and restarted): "
                  f"{len(one)} files, {sum(map(len, one.values()))} bytes, byte-identical; "
                  f"{fillers} fillers, {rotates} relay ROTATE(s); {time.monotonic() - started:.1f} s")
