"""The archive end to end: a real MariaDB master under load, `relayproxy run` archiving to moto's S3 server over
HTTP, the bucket stopped a few seconds under load (ingest goes on, the archive catches up), the relay killed -9 and
its directory deleted, `relayproxy restore` from the bucket, and a new relay on the restored directory that takes
up the rest from the master by GTID: its files byte-identical to the old relay's closed ones, its GTID set covering
the master's, and a replica through it with every row of the master exactly once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from relayproxy.lab.failover import binlog_pos, covers
from relayproxy.lab.harness import (
    RelayProcess,
    Writer,
    assert_files_equal_master,
    change_master,
    prepare_master,
    wait_relay,
    wait_replica,
)

from ..support.s3server import BUCKET, s3_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.server

TIMEOUT = 90.0
PREFIX = "relays/relay-1"


def archive_args(endpoint: str) -> list[str]:
    return ["--archive-url", f"s3://{BUCKET}/{PREFIX}", "--archive-endpoint", endpoint, "--archive-interval", "0.3"]


def test_a_relay_rebuilt_from_its_bucket_continues_the_same_history(mariadb, s3_server, tmp_path, capsys):  # noqa: F811
    master = mariadb("master", extra_config={"rpl_semi_sync_master_enabled": 0})
    prepare_master(master)
    # The old relay has its key pair in its configuration, the new one from the standard AWS chain (environment).
    secret_file = tmp_path / "s3-secret"
    secret_file.write_text(s3_server.secret_key + "\n")
    old = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb",
                       extra=[*archive_args(s3_server.endpoint), "--archive-access-key-id", s3_server.access_key,
                              "--archive-secret-access-key-file", str(secret_file)],
                       env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None})
    new = None
    writer = Writer(master, rotate_every=120)
    try:
        old.start()
        writer.__enter__()
        old.wait_for(lambda s: (s.get("archive") or {}).get("state") == "ok"
                     and (s["archive"]["horizon"]["file"] or "") >= "master-bin.000002", TIMEOUT,
                     "the archive to follow the relay into its second file")
        # The bucket stops answering for a few seconds (its process stopped: connections hang).
        before = old.status()["read_master_log_pos"], old.status()["master_log_file"]
        s3_server.pause()
        try:
            time.sleep(4)
            during = old.status()
            assert (during["read_master_log_pos"], during["master_log_file"]) != before, "ingest stopped"
            assert during["archive"]["lag_bytes"] > 0
        finally:
            s3_server.resume()
        # The archive catches up under load: its horizon reaches where the relay was when we looked.
        target = old.status()
        old.wait_for(lambda s: s["archive"]["state"] == "ok" and
                     (s["archive"]["horizon"]["file"], s["archive"]["horizon"]["position"])
                     >= (target["master_log_file"], target["read_master_log_pos"]),
                     TIMEOUT, "the archive to catch up after the bucket came back")
        shown = json.dumps(old.status())
        assert s3_server.secret_key not in shown and s3_server.access_key not in shown
        assert 'relayproxy_archive_state{state="ok"} 1.0' in old.metrics()
        time.sleep(1.0)
        old.kill9()  # under load
        logged = old.log_path.read_text(errors="replace")
        assert s3_server.secret_key not in logged and s3_server.access_key not in logged
        aside = tmp_path / "old-relay"
        shutil.copytree(old.relay_dir, aside)
        shutil.rmtree(old.relay_dir)

        restored = subprocess.run(
            [sys.executable, "-m", "relayproxy.commands.cli", "restore", "--from", f"s3://{BUCKET}/{PREFIX}",
             "--archive-endpoint", s3_server.endpoint, "--relay-dir", str(old.relay_dir)],
            capture_output=True, text=True, timeout=300, env={**os.environ, **s3_server.env})
        assert restored.returncode == 0, restored.stderr
        assert "restored" in restored.stdout

        new = RelayProcess(old.relay_dir, master.port, gtid_mode="mariadb", listen=True, users="repl:replpw",
                           extra=archive_args(s3_server.endpoint), env=s3_server.env)
        new.start()
        time.sleep(2)  # the new relay follows the master under load
        writer.stop()
        wait_relay(new, master, TIMEOUT)
        status = new.status()
        assert covers(status["retrieved_gtid_set"], binlog_pos(master)), (status["retrieved_gtid_set"],
                                                                           binlog_pos(master))
        assert_files_equal_master(new.relay_dir, master)

        old_names = (aside / "relayproxy.index").read_text().split()
        for name in old_names[:-1]:  # every file the old relay had closed
            assert (new.relay_dir / name).read_bytes() == (aside / name).read_bytes(), name

        replica = mariadb("replica", server_id=3)
        change_master(replica, new.listen_port)
        replica.execute("START SLAVE")
        wait_replica(replica, master, TIMEOUT)
        rows = "SELECT id, v, n FROM app.w ORDER BY id"
        want = master.execute(rows)
        assert len(want) == writer.done
        assert replica.execute(rows) == want

        # The new relay archives on, resuming from what the bucket holds.
        new.wait_for(lambda s: s["archive"]["state"] == "ok" and s["archive"]["lag_bytes"] == 0, TIMEOUT,
                     "the new relay's archive to be caught up")
        newest = old_names[-1]
        with capsys.disabled():
            print(f"\n  {len(old_names)} files archived and restored; the old relay's newest file {newest} held "
                  f"{(aside / newest).stat().st_size} bytes at the kill, the restore "
                  f"{restored.stdout.split('the relay ends at ')[1].split(',')[0]}; {writer.done} rows once each")
    finally:
        if writer._thread.is_alive():  # noqa: SLF001
            writer.stop()
        old.stop()
        if new is not None:
            new.stop()
