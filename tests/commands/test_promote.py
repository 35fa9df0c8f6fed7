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
    assert_every_insert_once,
    binlog_pos,
    covers,
    relay_sql,
    run_promote,
)
from relayproxy.lab.harness import assert_same_data, replica_status

pytestmark = pytest.mark.server


def promote(lab: FailoverLab, tmp: Path, *extra: str, candidate=None, relays=None) -> tuple[int, dict, str]:
    """`relayproxy promote --json` run as an HA tool would (a subprocess) on the lab's candidate R1 and relay."""
    candidate = candidate or lab.r1
    ports = [int(r.rpartition(":")[2]) for r in relays] if relays else [lab.relay_port]
    return run_promote(tmp, candidate.port, ports, *extra)


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
        # this relay runs without semi-sync: it acknowledged nothing, and promote says what that means
        assert doc["relays"][0]["semi_sync"]["acks"] == 0
        assert any("acknowledged nothing to the master" in w for w in doc["warnings"]), doc["warnings"]
        assert {s["step"] for s in doc["steps"]} >= {"stopped the relays' IO", "caught up", "promoted the candidate",
                                                      "repointed the relays"}
        assert "catching up" in stderr or doc["fetched_count"] == 0
        assert covers(binlog_pos(r1), last)
        assert int(r1.execute("SELECT @@GLOBAL.read_only")[0][0]) == 0
        assert replica_status(r1) == {}  # no replication left
        assert_every_insert_once(lab.load, r1)
        relay_status = relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]
        assert relay_status["Master_Port"] == r1.port and relay_status["Slave_IO_Running"] == "Yes"

        # the new master's writes reach both replicas behind the relay (GTID R2 and file/position R3)
        lab.load.run(r1, 40)
        lab.wait_converged(r1, [lab.r2, lab.r3, lab.r4])
        assert doc["replicas"] == [{"address": f"127.0.0.1:{lab.r4.port}",
                                    "result": f"repointed to 127.0.0.1:{r1.port} by GTID"}]
        for replica in (lab.r2, lab.r3, lab.r4):
            assert_same_data(r1, replica)
            assert_every_insert_once(lab.load, replica)

        # a second run finds it done and changes nothing
        code, doc, _ = promote(lab, tmp_path)
        assert code == 0 and doc["outcome"] == "already promoted", doc
        assert relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]["Master_Port"] == r1.port


def _closed_port() -> int:
    from relayproxy.lab.harness import free_port

    return free_port()


def test_promote_refuses_bad_input_then_converges_after_a_timeout_and_a_kill(tmp_path, mariadb):
    """Each bad input: a clear message naming the server, its exit code, and nothing changed. Then a catch-up that
    cannot finish (the candidate's SQL thread blocked by a table lock) times out (5) leaving the candidate replicating
    from the relay; a run killed with SIGKILL mid catch-up; and the next run converges, every insert once."""
    from relayproxy.lab.harness import RelayProcess

    with FailoverLab(tmp_path / "lab", candidates=1) as lab:
        lab.start()
        r1 = lab.r1
        # an errant transaction on the candidate, in a domain of its own (no conflict with domain 0's sequence)
        r1.execute("SET SESSION gtid_domain_id = 9")
        r1.execute(f"CREATE TABLE {SCHEMA}.local_only (a INT PRIMARY KEY)")
        r1.execute("SET SESSION gtid_domain_id = 0")
        last, _ = lagging_candidate_then_crash(lab, 80)
        relay = f"127.0.0.1:{lab.relay_port}"

        def unchanged() -> None:
            status = replica_status(r1)
            assert status["Master_Port"] == lab.links["R1"].proxy.port and int(
                r1.execute("SELECT @@GLOBAL.read_only")[0][0]) == 1
            assert relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]["Slave_IO_Running"] != "No"

        closed = _closed_port()
        code, doc, _ = promote(lab, tmp_path, "--candidate", f"127.0.0.1:{closed}")  # argparse: the last one wins
        assert code == 4 and doc["outcome"] == "unreachable" and f"candidate 127.0.0.1:{closed}" in doc["message"]

        code, doc, _ = promote(lab, tmp_path, relays=[relay, f"127.0.0.1:{closed}"])
        assert code == 4 and f"relay 127.0.0.1:{closed} is unreachable" in doc["message"]
        assert "--skip-unreachable-relays" in doc["message"]
        unchanged()

        code, doc, _ = promote(lab, tmp_path, "--dry-run", "--skip-unreachable-relays",
                               relays=[relay, f"127.0.0.1:{closed}"])
        assert code == 0 and doc["outcome"] == "dry run" and any(closed_ in w for w in doc["warnings"]
                                                                 for closed_ in [str(closed)])

        (tmp_path / "bad.pw").write_text("wrong\n")
        code, doc, _ = promote(lab, tmp_path, "--relay-password-file", str(tmp_path / "bad.pw"))
        assert code == 4 and f"relay {relay}: login as 'admin' refused" in doc["message"]

        code, doc, _ = promote(lab, tmp_path, "--candidate-password-file", str(tmp_path / "nowhere.pw"))
        assert code == 2 and "nowhere.pw" in doc["message"]

        code, doc, _ = promote(lab, tmp_path, "--strict")
        assert code == 3 and "9-2-1" in doc["message"] and "--strict" in doc["message"]
        unchanged()

        # a server that is no replica and lacks what the relay holds; a relay of another master
        nolsu = mariadb("nolsu", server_id=32)  # log_slave_updates off (MariaDB's default)
        code, doc, _ = promote(lab, tmp_path, candidate=nolsu)
        assert code == 3 and "log_slave_updates off" in doc["message"] and f"127.0.0.1:{nolsu.port}" in doc["message"]
        other = mariadb("other", server_id=31, extra_config={"log_slave_updates": 1})
        other.create_user("repl", "replpw")
        other.execute("CREATE DATABASE elsewhere")
        code, doc, _ = promote(lab, tmp_path, candidate=other)
        assert code == 3 and "is not a replica" in doc["message"] and f"127.0.0.1:{other.port}" in doc["message"]
        assert "is writable" in doc["message"]
        other.execute("SET GLOBAL read_only = 1")
        code, doc, _ = promote(lab, tmp_path, candidate=other)
        assert code == 3 and "--candidate-detached" in doc["message"], doc
        other.execute("SET GLOBAL read_only = 0")
        other_relay = RelayProcess(tmp_path / "other-relay", other.port, server_id=131, gtid_mode="mariadb",
                                   extra=["--listen", f"127.0.0.1:{(port := _closed_port())}",
                                          "--users", f"repl:replpw,{ADMIN_USER}:{ADMIN_PASSWORD}:admin"]).start()
        try:
            other_relay.wait_for(lambda s: s.get("io_running"), 30, "the other relay streaming")
            code, doc, _ = promote(lab, tmp_path, relays=[relay, f"127.0.0.1:{port}"])
            assert code == 3 and "different masters" in doc["message"] and "server_id 31" in doc["message"], doc
        finally:
            other_relay.stop()
        unchanged()

        # a catch-up that cannot finish: the candidate's SQL thread waits on a table lock
        locker = r1.connect()
        locker.cursor().execute(f"LOCK TABLES {SCHEMA}.t1 READ, {SCHEMA}.t2 READ, {SCHEMA}.t3 READ")
        code, doc, _ = promote(lab, tmp_path, "--timeout", "4")
        assert code == 5 and doc["outcome"] == "timed out", doc
        assert f"left replicating from relay {relay}" in doc["message"] and "run the same command again" in doc["message"]
        assert replica_status(r1)["Master_Port"] == lab.relay_port
        assert relay_sql(lab.relay_port, "SHOW SLAVE STATUS")[0]["Slave_IO_Running"] == "No"  # fenced

        # run again while the SQL thread is still blocked: its STOP SLAVE waits, and the run is killed there (as an
        # HA tool's own timeout would); then the lock goes and the next run converges
        (tmp_path / "cand.pw").write_text("\n")
        running = subprocess.Popen(
            [sys.executable, "-m", "relayproxy.commands.cli", "promote", "--candidate", f"127.0.0.1:{r1.port}",
             "--candidate-user", "root", "--candidate-password-file", str(tmp_path / "cand.pw"), "--relay", relay,
             "--relay-user", ADMIN_USER, "--relay-password-file", str(tmp_path / "relay.pw")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = ""
        while "decided" not in seen and running.poll() is None:
            seen += running.stderr.readline()
        time.sleep(1.0)
        assert running.poll() is None, f"the run should wait on STOP SLAVE: {seen}{running.communicate()}"
        running.kill()
        running.communicate()
        locker.close()
        code, doc, _ = promote(lab, tmp_path)
        assert code == 0 and doc["outcome"] == "promoted", doc
        assert "9-2-1" in doc["errant"] and any("9-2-1" in w for w in doc["warnings"])
        assert covers(binlog_pos(r1), last) and replica_status(r1) == {}
        assert_every_insert_once(lab.load, r1)
        lab.load.run(r1, 20)
        lab.wait_converged(r1)
        assert_same_data(r1, lab.r2)


def test_a_candidate_the_ha_tool_detached_read_only_is_caught_up_with_candidate_detached(tmp_path):
    """MHA and Orchestrator may reset the candidate's replication before their hook runs; while it is read-only,
    `--candidate-detached` lets promote catch it up from the relay."""
    with FailoverLab(tmp_path / "lab", candidates=1) as lab:
        lab.start()
        last, _ = lagging_candidate_then_crash(lab, 60)
        r1 = lab.r1
        for statement in ("STOP SLAVE", "RESET SLAVE ALL"):  # what the HA tool did; read_only stays on
            r1.execute(statement)
        code, doc, _ = promote(lab, tmp_path)
        assert code == 3 and "--candidate-detached" in doc["message"]
        # the relay is lost while the candidate catches up from it (the catch-up held back by a table lock): the run
        # ends at once, naming it; with the relay back, the next run converges
        locker = r1.connect()
        locker.cursor().execute(f"LOCK TABLES {SCHEMA}.t1 READ, {SCHEMA}.t2 READ, {SCHEMA}.t3 READ")
        running = subprocess.Popen(
            [sys.executable, "-m", "relayproxy.commands.cli", "promote", "--json", "--candidate-detached",
             "--candidate", f"127.0.0.1:{r1.port}", "--candidate-user", "root", "--candidate-password-file",
             str(tmp_path / "cand.pw"), "--relay", f"127.0.0.1:{lab.relay_port}", "--relay-user", ADMIN_USER,
             "--relay-password-file", str(tmp_path / "relay.pw")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = ""
        while "catching up" not in seen and running.poll() is None:
            seen += running.stderr.readline()
        lab.relay.kill9()
        out, _ = running.communicate(timeout=30)
        doc = json.loads(out)
        assert running.returncode == 4 and "lost while the candidate caught up" in doc["message"], doc
        lab.relay.start()
        locker.close()
        code, doc, _ = promote(lab, tmp_path, "--candidate-detached")
        assert code == 0 and doc["outcome"] == "promoted", doc
        assert covers(binlog_pos(r1), last) and replica_status(r1) == {}
        assert_every_insert_once(lab.load, r1)
        lab.load.run(r1, 10)
        lab.wait_converged(r1)
