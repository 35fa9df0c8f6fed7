"""The transaction index end to end: a real MariaDB master, the relay as a process; `SHOW RELAYPROXY TRANSACTION
FOR GTID` on the relay's port agrees with the master's own SHOW BINLOG EVENTS (where each GTID's group starts) and
BINLOG_GTID_POS (the GTID state at the group's end), and `relayproxy find` on the relay directory says the same."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pymysql
import pytest

from relayproxy.commands import cli
from relayproxy.lab.harness import RelayProcess, free_port, prepare_master
from relayproxy.relay import txindex as T


def _rows(port: int, sql: str, user: str, password: str) -> list[tuple]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user=user, password=password)
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def _master_groups(master) -> list[tuple[str, int, str]]:
    """(file, start, gtid) of every GTID event in the master's binlogs, from its SHOW BINLOG EVENTS."""
    out = []
    for path in master.binlog_files():
        for _log, pos, kind, _sid, _end, info in _rows(master.port, f"SHOW BINLOG EVENTS IN '{path.name}'", "root", ""):
            if kind == "Gtid":
                out.append((path.name, int(pos), info.split("GTID ")[-1].split()[0]))
    return out


@pytest.mark.server
def test_relay_transactions_match_the_masters_binlog(mariadb, tmp_path: Path, capsys) -> None:
    master = mariadb("master", binlog_format="ROW")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(50))")
    for i in range(40):
        master.execute(f"INSERT INTO app.t VALUES ({i}, 'v{i}')")
    master.execute("FLUSH BINARY LOGS")
    master.execute("UPDATE app.t SET v = 'z' WHERE id < 10")
    master.execute("CREATE TABLE app.u (id INT)")
    for i in range(20):
        master.execute(f"INSERT INTO app.u VALUES ({i})")
    listen = free_port()
    config = tmp_path / "relay.toml"
    config.write_text('[[users]]\nname = "repl"\npassword = "replpw"\nplugin = "mysql_native_password"\n'
                      'privileges = ["replication_client"]\n')
    relay_dir = tmp_path / "relay"
    relay = RelayProcess(relay_dir, master.port, gtid_mode="mariadb",
                         extra=["--listen", f"127.0.0.1:{listen}", "--config", str(config)]).start()
    try:
        relay.wait_caught_up(master)
        groups = _master_groups(master)
        assert len(groups) >= 60
        for file, start, gtid in groups:
            rows = _rows(listen, f"SHOW RELAYPROXY TRANSACTION FOR GTID '{gtid}'", "repl", "replpw")
            assert len(rows) == 1, gtid
            got_file, got_start, got_end, got_gtid, _ct, commit_us, coarse, tables = rows[0]
            assert (got_file, int(got_start), got_gtid) == (file, start, gtid)
            assert int(coarse) == 1 and int(commit_us) % 1_000_000 == 0
            # The master's own GTID state at the group's end names this GTID; at its start, the one before.
            at_end = _rows(master.port, f"SELECT BINLOG_GTID_POS('{file}', {int(got_end)})", "root", "")[0][0]
            assert gtid in at_end.split(","), (gtid, at_end)
        ddl = [g for g in groups if g[1] and "app.u" in _rows(listen, f"SHOW RELAYPROXY TRANSACTION FOR GTID "
                                                                     f"'{g[2]}'", "repl", "replpw")[0][7]]
        assert ddl  # the CREATE TABLE and the INSERTs into app.u name it
        assert _rows(listen, "SHOW RELAYPROXY TRANSACTION FOR GTID '0-1-99999'", "repl", "replpw") == []
        last = groups[-1]
        deadline = time.monotonic() + 30  # the closed file's sidecar, written in the background
        while not T.sidecar_path(relay_dir, groups[0][0]).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert T.sidecar_path(relay_dir, groups[0][0]).exists()
        health = relay.status()["txindex"]  # relayproxy run indexes in a child process (relay/txindex_child.py)
        assert health["mode"] == "child" and health["child_starts"] == 1 and health["errors"] == 0, health
        assert health["child_pid"] is not None and health["passes"] >= 1
    finally:
        relay.stop()
    assert cli.main(["find", "--relay-dir", str(relay_dir), "--gtid", last[2], "--json"]) == 0
    found = json.loads(capsys.readouterr().out)[0]
    assert (found["file"], found["start"], found["gtid"]) == last
