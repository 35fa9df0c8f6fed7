"""The relay records which server its files came from and refuses to resume on another one.

Before: restarted with ``--master`` pointing at another server whose binlog had the same name and size, the relay
resumed at that offset by file/position and relayed the other server's history with no error. Now the master's
identity (server_id, server_uuid) is kept in ``relayproxy.master.json``; another server is refused with a
``Last_IO_Error`` that names both, nothing is written, and a CHANGE MASTER is the way to switch (by GTID).
"""

from __future__ import annotations

import json

import pytest

from relayproxy.lab.harness import RelayProcess, master_status, prepare_master
from relayproxy.relay.master_info import FILE_NAME

pytestmark = pytest.mark.server


def _load(master, n: int) -> None:
    master.execute("CREATE DATABASE IF NOT EXISTS app")
    master.execute("CREATE TABLE IF NOT EXISTS app.t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(40)) ENGINE=InnoDB")
    for i in range(n):
        master.execute(f"INSERT INTO app.t (v) VALUES ('row-{i}')")


def _files(relay_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(relay_dir.iterdir()) if p.name.startswith("master-bin.")}


@pytest.mark.parametrize("gtid_mode", ["off", "mariadb"])
def test_a_restart_pointed_at_another_server_is_refused_and_writes_nothing(mariadb, tmp_path, gtid_mode):
    # Two unrelated masters with the same binlog basename and the same history length: same file, same size.
    a = mariadb("a", server_id=1)
    b = mariadb("b", server_id=2)
    for m in (a, b):
        prepare_master(m)
        _load(m, 20)
    assert master_status(a) == master_status(b)  # the trap: a file/position resume would find "its" offset

    relay = RelayProcess(tmp_path / "relay", a.port, gtid_mode=gtid_mode)
    try:
        relay.start()
        relay.wait_caught_up(a)
        recorded = json.loads((relay.relay_dir / FILE_NAME).read_text())["identity"]
        assert recorded["server_id"] == 1 and recorded["port"] == a.port
        relay.stop()
        before = _files(relay.relay_dir)

        _load(b, 5)  # b moves on: by position the relay would now stream b's transactions as if they were a's
        wrong = RelayProcess(tmp_path / "relay", b.port, gtid_mode=gtid_mode)
        wrong.start()
        status = wrong.wait_for(lambda s: s["last_io_error"], 30, "a refusal")
        error = status["last_io_error"]
        assert f"127.0.0.1:{b.port} is server_id 2" in error and "came from server_id 1" in error, error
        assert "CHANGE MASTER" in error
        assert status["read_master_log_pos"] == master_status(a)[1] and not status["io_running"]
        assert _files(relay.relay_dir) == before  # nothing of b's history was written
        assert status["errors_by_kind"]["master"] >= 1  # a master the relay refuses counts as kind "master"
        wrong.stop()

        # Back on the right server: it resumes as before.
        _load(a, 3)
        relay.start()
        relay.wait_caught_up(a)
        assert relay.status()["last_io_error"] is None
    finally:
        relay.stop()
