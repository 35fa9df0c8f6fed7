"""`relayproxy promote` against real MariaDB servers: a master killed while the candidate lags, the candidate caught up
from the relay, promoted, the relay and a direct replica repointed; dry-run, re-runs and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayproxy.lab.failover import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    SCHEMA,
    FailoverLab,
    binlog_pos,
    covers,
    relay_sql,
    uids,
    wait_until,
)
from relayproxy.lab.harness import assert_same_data, replica_status

pytestmark = pytest.mark.server


def promote(lab: FailoverLab, tmp: Path, *extra: str, candidate=None, relays=None, timeout: float = 120) -> tuple[int, dict, str]:
    """Run `relayproxy promote --json` as an HA tool would (a subprocess); returns (exit code, document, stderr)."""
    (tmp / "cand.pw").write_text("\n")
    (tmp / "relay.pw").write_text(ADMIN_PASSWORD + "\n")
    candidate = candidate or lab.r1
    relays = relays or [f"127.0.0.1:{lab.relay_port}"]
    command = [sys.executable, "-m", "relayproxy.commands.cli", "promote", "--json",
               "--candidate", f"127.0.0.1:{candidate.port}", "--candidate-user", "root",
               "--candidate-password-file", str(tmp / "cand.pw"),
               *(a for r in relays for a in ("--relay", r)),
               "--relay-user", ADMIN_USER, "--relay-password-file", str(tmp / "relay.pw"), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    print(done.stderr)
    try:
        document = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"promote printed no JSON document (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    print(json.dumps(document, indent=1))
    return done.returncode, document, done.stderr


def lagging_candidate_then_crash(lab: FailoverLab, behind: int) -> tuple[str, int]:
    """Hold R1's link, write `behind` transactions that reach only the relay, kill -9 M1. Returns the master's last
    GTID position and how many transactions R1 lacked."""
    lab.load.run(lab.m1, 30)
    lab.wait_caught_up_m1()
    lab.links["R1"].proxy.pause()
    lab.load.run(lab.m1, behind)
    lab.wait_caught_up_m1([lab.r2, lab.r3])
    last = binlog_pos(lab.m1)
    lab.m1.kill()
    for link in lab.links.values():
        link.proxy.drop_connections()
    return last, behind


def assert_every_insert_once(lab: FailoverLab, server) -> None:
    for table, inserted in lab.load.inserted.items():
        count, found = uids(server, table)
        assert count == len(found), f"{table}: a row was applied twice on {server.basedir.name}"
        assert inserted <= found, f"{table}: {len(inserted - found)} committed inserts missing on {server.basedir.name}"


def test_promote_catches_the_lagging_candidate_up_from_the_relay(tmp_path):
    with FailoverLab(tmp_path / "lab", candidates=2) as lab:
        lab.start()
        last, behind = lagging_candidate_then_crash(lab, 120)
        r1 = lab.r1
        assert not covers(binlog_pos(r1), last), "the candidate should lag"
        before_status = replica_status(r1)

        code, doc, _ = promote(lab, tmp_path, "--dry-run")
        assert code == 0 and doc["outcome"] == "dry run", doc
        assert doc["source_relay"] == f"127.0.0.1:{lab.relay_port}"
        assert doc["fetched_count"] >= behind and doc["fetched"]
        assert "nothing was changed" in doc["message"]
        after_status = replica_status(r1)
        assert after_status["Master_Port"] == before_status["Master_Port"]  # still pointing at the old link
        assert int(r1.execute("SELECT @@GLOBAL.read_only")[0][0]) == 1
        assert relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]["Slave_IO_Running"] != "No"  # not stopped

        code, doc, stderr = promote(lab, tmp_path, "--replica", f"127.0.0.1:{lab.r4.port}")
        assert code == 0, doc
        assert doc["outcome"] == "promoted" and doc["exit_code"] == 0
        assert doc["fetched_count"] >= behind
        assert {s["step"] for s in doc["steps"]} >= {"stopped the relays' IO", "caught up", "promoted the candidate",
                                                      "repointed the relays"}
        assert "catching up" in stderr or doc["fetched_count"] == 0
        assert covers(binlog_pos(r1), last)
        assert int(r1.execute("SELECT @@GLOBAL.read_only")[0][0]) == 0
        assert replica_status(r1) == {}  # no replication left
        assert_every_insert_once(lab, r1)
        relay_status = relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]
        assert relay_status["Master_Port"] == r1.port and relay_status["Slave_IO_Running"] == "Yes"

        # the new master's writes reach both replicas behind the relay (GTID R2 and file/position R3)
        lab.load.run(r1, 40)
        lab.wait_converged(r1, [lab.r2, lab.r3, lab.r4])
        assert doc["replicas"] == [{"address": f"127.0.0.1:{lab.r4.port}",
                                    "result": f"repointed to 127.0.0.1:{r1.port} by GTID"}]
        for replica in (lab.r2, lab.r3, lab.r4):
            assert_same_data(r1, replica)
            assert_every_insert_once(lab, replica)

        # a second run finds it done and changes nothing
        code, doc, _ = promote(lab, tmp_path)
        assert code == 0 and doc["outcome"] == "already promoted", doc
        assert relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]["Master_Port"] == r1.port
