"""Archived files served back: a real MariaDB master under load, `relayproxy run` archiving to moto's S3 server
over HTTP with `archive_keep_local = "0 files"` (every sealed file's local copy dropped, a stub left) and a cache
of one byte (each file is fetched again when asked). Then, with local files dropped:

- `SHOW BINARY LOGS` on the relay lists every file with the master's sizes;
- `mariadb-binlog --read-from-remote-server --raw --to-last-log` from the first file writes the master's exact
  bytes for every closed file;
- a new MariaDB replica from GTID position 0 gets every row of the master exactly once;
- a corrupted object in the bucket is refused naming its key (the relay's log and /status), never served, while
  the relay keeps serving the replica;
- the relay's directory wiped: a relay started on the empty directory with the same archive_url restores it from
  the bucket by itself, its files byte-identical to the master's, and follows the master.

And the bucket's server killed under load and started again empty: ingest never stops, and the whole history goes
up again from the relay's files (a restore from the bucket equals the master's files).
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from relayproxy.binlog import constants as C
from relayproxy.lab.failover import binlog_pos, covers
from relayproxy.lab.harness import (
    RelayProcess,
    Writer,
    assert_files_equal_master,
    change_master,
    listener_query,
    prepare_master,
    wait_relay,
    wait_replica,
)
from relayproxy.relay import closed_files as CF

from ..support.s3server import BUCKET, s3_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.server

TIMEOUT = 90.0
PREFIX = "relays/served"


def binlog_tool() -> str:
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    assert tool, "mariadb-binlog is part of the mariadb-server packages"
    return tool


def raw_download(port: int, first: str, out, *, to_last: bool = True) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [binlog_tool(), "--read-from-remote-server", "--raw", *(["--to-last-log"] if to_last else []),
         "-h127.0.0.1", f"-P{port}", "-urepl", "-preplpw", f"--result-file={out}/", first],
        capture_output=True, text=True, timeout=120)


def without_in_use_flag(data: bytes) -> bytes:
    buf = bytearray(data)
    if len(buf) > 4 + 19:
        buf[4 + 17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    return bytes(buf)


@pytest.mark.parametrize("senders", [0, 1], ids=["in-process", "sender-process"])
def test_archived_files_are_served_back_exactly_with_local_copies_dropped(mariadb, s3_server, tmp_path,  # noqa: F811
                                                                           senders):
    master = mariadb("master", extra_config={"rpl_semi_sync_master_enabled": 0})
    prepare_master(master)
    relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb", listen=True, users="repl:replpw",
                         extra=["--archive-url", f"s3://{BUCKET}/{PREFIX}", "--archive-endpoint", s3_server.endpoint,
                                "--archive-interval", "0.3", "--archive-keep-local", "0 files",
                                "--archive-cache-size", "1", "--sender-processes", str(senders)],
                         env=s3_server.env)
    writer = Writer(master, rotate_every=700)  # files of about 300 KB: more than a stub holds (2 x 64 KiB)
    replica = None
    try:
        relay.start()
        with writer:
            relay.wait_for(lambda s: ((s.get("archive") or {}).get("files_offloaded") or 0) >= 3, TIMEOUT,
                           "three files offloaded under load")
        wait_relay(relay, master, TIMEOUT)
        master.execute("FLUSH BINARY LOGS")  # the newest file closes too: sealed, then offloaded
        wait_relay(relay, master, TIMEOUT)
        names = [p.name for p in master.binlog_files()]
        closed = names[:-1]
        relay.wait_for(lambda s: s["archive"]["files_offloaded"] >= len(closed) and s["archive"]["lag_bytes"] == 0,
                       TIMEOUT, "every closed file offloaded")
        for name in closed:
            stored = CF.locate(relay.relay_dir / name)
            assert stored is not None and CF.is_remote(stored), (name, stored)
            assert not (relay.relay_dir / name).exists()

        # SHOW BINARY LOGS: every file, the master's sizes.
        shown = {r["Log_name"]: int(r["File_size"]) for r in listener_query(relay.listen_port, "SHOW BINARY LOGS")}
        assert list(shown) == names
        for name in closed:
            assert shown[name] == (master.binlog_dir / name).stat().st_size, name

        # mariadb-binlog --raw from the first file: the master's exact bytes, file by file.
        out = tmp_path / "raw"
        done = raw_download(relay.listen_port, names[0], out)
        assert done.returncode == 0, done.stderr
        for name in closed:
            mine = (out / name).read_bytes()
            assert without_in_use_flag(mine) == without_in_use_flag((master.binlog_dir / name).read_bytes()), name
        fetched = relay.status()["archive"]["cache"]
        big = [n for n in closed if (master.binlog_dir / n).stat().st_size > 2 * CF.REMOTE_EDGE]  # not all in the stub
        fetches = fetched["fetches"] if not senders else \
            relay.log_tail(500000).count("offloaded relay file fetched from the archive")  # fetched by the sender
        assert len(big) >= 3 and fetches >= len(big) and fetched["errors"] == 0
        assert fetched["bytes"] <= max((master.binlog_dir / n).stat().st_size for n in closed)  # bounded: 1 file

        # A new replica from GTID position 0: every row once.
        replica = mariadb("replica", server_id=3)
        replica.execute("SET GLOBAL gtid_slave_pos = ''")
        change_master(replica, relay.listen_port, file=None)
        replica.execute("START SLAVE")
        wait_replica(replica, master, TIMEOUT)
        rows = "SELECT id, v, n FROM app.w ORDER BY id"
        want = master.execute(rows)
        assert len(want) == writer.done
        assert replica.execute(rows) == want

        # A corrupted object: refused by name, never served; the relay goes on serving the replica.
        victim = big[1]
        client = s3_server.client()
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/files/{victim}/part.")["Contents"]
        key = listed[0]["Key"]
        obj = client.get_object(Bucket=BUCKET, Key=key)
        body = bytearray(obj["Body"].read())
        body[len(body) // 2] ^= 0x01
        client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body), Metadata=obj["Metadata"])
        bad = raw_download(relay.listen_port, victim, tmp_path / "bad", to_last=False)
        short_key = key[len(PREFIX) + 1:]
        if not senders:  # a sender process's cache is its own: its refusal is in the log, not in /status
            relay.wait_for(lambda s: short_key in (s["archive"]["cache"]["last_error"] or ""), 30,
                           "the corrupt object named in /status")
            assert "corrupt" in relay.status()["archive"]["cache"]["last_error"]
        assert short_key in relay.log_tail(500000) and "is corrupt" in relay.log_tail(500000)
        served = tmp_path / "bad" / victim
        assert bad.returncode != 0, bad  # the dump ends with an error: nothing past the damage is sent
        assert not served.exists() or served.stat().st_size <= CF.REMOTE_EDGE, served.stat().st_size
        master.execute("INSERT INTO app.w (v, n) VALUES ('after', 1)")
        time.sleep(0.5)
        wait_replica(replica, master, TIMEOUT)
        assert replica.execute(rows) == master.execute(rows)

        # The host wiped: a relay started on an empty directory with the same archive_url restores it from the
        # bucket by itself and follows the master (the corrupt part put back first: a restore refuses it by name).
        body[len(body) // 2] ^= 0x01
        client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body), Metadata=obj["Metadata"])
        relay.stop()
        shutil.rmtree(relay.relay_dir)
        relay.relay_dir.mkdir()
        reborn = RelayProcess(relay.relay_dir, master.port, gtid_mode="mariadb", listen=True, users="repl:replpw",
                              extra=["--archive-url", f"s3://{BUCKET}/{PREFIX}", "--archive-endpoint",
                                     s3_server.endpoint, "--archive-interval", "0.3"], env=s3_server.env)
        relay = reborn
        reborn.start()
        master.execute("INSERT INTO app.w (v, n) VALUES ('reborn', 2)")
        wait_relay(reborn, master, TIMEOUT)
        assert "relay directory restored from the archive" in reborn.log_tail(200000)
        assert_files_equal_master(reborn.relay_dir, master)
        assert covers(reborn.status()["retrieved_gtid_set"], binlog_pos(master))
    finally:
        if writer._thread.is_alive():  # noqa: SLF001
            writer.stop()
        relay.stop()


def test_the_bucket_killed_under_load_and_back_empty_gets_the_whole_history_again(mariadb, s3_server,  # noqa: F811
                                                                                  tmp_path):
    """moto keeps its objects in memory: killed and started again, it comes back empty (the bucket created again,
    as an operator would). The relay's ingest never stops; the uploader lists the bucket again after its failures
    and puts everything back from its local files; a restore from the bucket then equals the master's files."""
    import os
    import sys

    master = mariadb("master", extra_config={"rpl_semi_sync_master_enabled": 0})
    prepare_master(master)
    relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb",
                         extra=["--archive-url", f"s3://{BUCKET}/{PREFIX}", "--archive-endpoint", s3_server.endpoint,
                                "--archive-interval", "0.3"], env=s3_server.env)
    writer = Writer(master, rotate_every=300)
    try:
        relay.start()
        with writer:
            relay.wait_for(lambda s: (s.get("archive") or {}).get("state") == "ok"
                           and (s["archive"]["horizon"]["file"] or "") >= "master-bin.000002", TIMEOUT,
                           "the archive into the second file")
            s3_server.stop()  # killed: its objects are gone with it
            before = relay.status()["read_master_log_pos"], relay.status()["master_log_file"]
            relay.wait_for(lambda s: s["archive"]["state"] in ("retrying", "failing"), 30,
                           "the archive to report the bucket gone")
            during = relay.status()
            assert (during["read_master_log_pos"], during["master_log_file"]) != before, "ingest stopped"
            s3_server.start()
            s3_server.create_bucket()
            time.sleep(2)
        wait_relay(relay, master, TIMEOUT)
        relay.wait_for(lambda s: s["archive"]["state"] == "ok" and s["archive"]["lag_bytes"] == 0, TIMEOUT,
                       "the archive to hold everything again")
        keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]]
        assert f"{PREFIX}/relayproxy-archive.json" in keys
        target = tmp_path / "restored"
        restored = subprocess.run(
            [sys.executable, "-m", "relayproxy.commands.cli", "restore", "--from", f"s3://{BUCKET}/{PREFIX}",
             "--archive-endpoint", s3_server.endpoint, "--relay-dir", str(target)],
            capture_output=True, text=True, timeout=300, env={**os.environ, **s3_server.env})
        assert restored.returncode == 0, restored.stderr
        assert_files_equal_master(target, master)
    finally:
        if writer._thread.is_alive():  # noqa: SLF001
            writer.stop()
        relay.stop()
