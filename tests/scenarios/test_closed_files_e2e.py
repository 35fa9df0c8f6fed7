"""A real MariaDB master, the relay with compression + encryption + archive on and small files, and MariaDB
replicas through it (from the first file by position, and by GTID after the files were converted and archived)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pymysql
import pytest

from relayproxy.lab.harness import (
    RelayProcess,
    assert_same_data,
    change_master,
    free_port,
    prepare_master,
    replica_status,
    wait_relay,
    wait_replica,
)
from relayproxy.relay import closed_files as CF
from relayproxy.relay.closed_files import Keyring

from .test_relay_e2e import mixed_load

pytestmark = pytest.mark.server

KEY_HEX = "5e" * 32
KEYS = f"# relay keys\n1:{'a1' * 32}\n2:{KEY_HEX}\n"
USERS_TOML = """
[[users]]
name = "repl"
password = "replpw"
plugin = "mysql_native_password"
"""


def wait_all_converted(relay_dir: Path, archive: Path, timeout: float = 90.0) -> list[str]:
    """Every closed file (all but the newest two: the current one and the one the horizon may still name)
    stored converted, the older ones in the archive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = (relay_dir / "relayproxy.index").read_text().split()
        closed = names[:-2]
        if len(closed) >= 4 and all(not (relay_dir / n).exists() for n in closed) \
                and any((archive / (n + CF.SUFFIX)).exists() for n in closed):
            return names
        time.sleep(0.2)
    raise AssertionError(f"closed files not converted/archived in time: relay {sorted(p.name for p in relay_dir.iterdir())}"
                         f" archive {sorted(p.name for p in archive.iterdir()) if archive.exists() else None}")


def relay_sql(port: int, sql: str):
    conn = pymysql.connect(host="127.0.0.1", port=port, user="repl", password="replpw")
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return cur.fetchall()
    finally:
        conn.close()


BIG_ROW = "SELECT GROUP_CONCAT(MD5(RAND()) SEPARATOR '') FROM (SELECT seq FROM test.seq_1_to_48000) s"


def big_rows(master, n: int = 3, per_transaction: int = 1) -> None:
    """Rows of ~1.5 MB of poorly compressible text: files that span several 1 MiB frames (``per_transaction``
    rows in one statement: one file of that many times 1.5 MB)."""
    master.execute("CREATE TABLE IF NOT EXISTS app.blobs (id INT AUTO_INCREMENT PRIMARY KEY, b LONGTEXT)")
    for i in range(n):
        master.execute("INSERT INTO app.blobs (b) " + " UNION ALL ".join([BIG_ROW] * per_transaction))


@pytest.mark.parametrize("sender_processes", [0, 2])  # 2: the dumps run in sender processes (downstream/workers.py)
def test_replicas_read_compressed_encrypted_archived_files(mariadb, tmp_path, sender_processes):
    master = mariadb("master", extra_config={"max_binlog_size": 65536, "rpl_semi_sync_master_enabled": 0,
                                             "group_concat_max_len": 4 << 20})
    prepare_master(master)
    keyfile = tmp_path / "relay.keys"
    keyfile.write_text(KEYS)
    keyfile.chmod(0o600)
    archive = tmp_path / "archive"
    config = tmp_path / "relay.toml"
    config.write_text(USERS_TOML)
    listen = free_port()
    relay_dir = tmp_path / "relay"
    relay = RelayProcess(relay_dir, master.port, gtid_mode="mariadb", extra=[
        "--listen", f"127.0.0.1:{listen}", "--config", str(config),
        "--compress-closed", "zstd", "--compress-level", "3", "--encrypt-at-rest", "on",
        "--encryption-key-file", str(keyfile), "--archive-dir", str(archive), "--archive-after", "3 files",
        "--storage-interval", "0.2", "--sender-processes", str(sender_processes),
    ])
    try:
        # A replica from the very first file by position, started before anything is converted.
        mixed_load(master, rounds=3, big=False)
        big_rows(master)
        relay.start()
        wait_relay(relay, master)
        by_position = mariadb("byposition", server_id=3)
        change_master(by_position, listen, file="master-bin.000001", pos=4)
        by_position.execute("START SLAVE")
        for _ in range(3):
            mixed_load(master, rounds=2, big=False)
            master.execute("FLUSH BINARY LOGS")
        big_rows(master, 1)
        big_rows(master, 1, per_transaction=2)  # a file of three frames: one in the middle that a start never reads
        wait_relay(relay, master)
        names = wait_all_converted(relay_dir, archive)
        assert len(names) >= 8
        wait_replica(by_position, master)
        assert_same_data(master, by_position)

        # A restart: recovery reads the converted and archived files (the key from the key file).
        relay.stop()
        mixed_load(master, rounds=1, big=False)
        relay.start()
        wait_relay(relay, master)
        names = wait_all_converted(relay_dir, archive)

        # A second replica by GTID from the start, after every old file was converted and archived, and a
        # third by position from the first (archived, encrypted, compressed) file.
        by_gtid = mariadb("bygtid", server_id=4)
        change_master(by_gtid, listen, file=None)
        by_gtid.execute("START SLAVE")
        late_position = mariadb("lateposition", server_id=5)
        change_master(late_position, listen, file="master-bin.000001", pos=4)
        late_position.execute("START SLAVE")
        mixed_load(master, rounds=1, big=False)
        wait_relay(relay, master)
        for replica in (by_position, by_gtid, late_position):
            wait_replica(replica, master)
            assert_same_data(master, replica)
        assert by_gtid.execute("SELECT @@gtid_slave_pos")[0][0] == master.execute("SELECT @@gtid_binlog_pos")[0][0]

        # The logical files are the master's binlogs, byte for byte; SHOW BINARY LOGS gives their sizes.
        CF.configure(relay_dir, keyring=Keyring.parse(KEYS, "test"))
        names = (relay_dir / "relayproxy.index").read_text().split()
        archived = [n for n in names if (archive / (n + CF.SUFFIX)).exists()]
        converted = [n for n in names if (relay_dir / (n + CF.SUFFIX)).exists()]
        assert archived and converted and not (set(archived) & set(converted))
        shown = {row[0]: int(row[1]) for row in relay_sql(listen, "SHOW BINARY LOGS")}
        for name in names[:-2]:
            with CF.open_relay_file(relay_dir / name) as f:
                assert not f.is_plain
                mine = f.read(0, f.size())
            theirs = (master.binlog_dir / name).read_bytes()
            assert mine == theirs, f"{name}: the relay's logical file differs from the master's binlog"
            assert shown[name] == len(theirs), name
        stored = [p for p in [*relay_dir.iterdir(), *archive.iterdir()] if p.name.endswith(CF.SUFFIX)]
        assert all(KEY_HEX.encode() not in p.read_bytes() for p in stored)
        assert all(b"after-rotate" not in p.read_bytes() for p in stored)  # row values are not in clear
        status = relay.status()
        assert status["storage"]["converted"] >= 1 and status["storage"]["archived"] >= 1
        assert status["storage"]["failures"] == 0
        if sender_processes:  # the dumps above were served by the sender processes, with the relay's keyring
            assert status["sender_processes"]["handed_total"] >= 3, status["sender_processes"]
        # Disk bytes are the stored bytes (compressed, in both directories); replica lag uses logical offsets.
        stored_total = sum(p.stat().st_size for p in [*relay_dir.iterdir(), *archive.iterdir()]
                           if p.name in names or CF.logical_name(p.name) in names)
        assert status["relay_disk_bytes"] == stored_total < sum(shown.values())
        relay.wait_for(lambda st: [r.get("lag_bytes") for r in st["replicas"]] == [0, 0, 0], timeout=30,
                       what="every replica 0 bytes behind")
        text = json.dumps(status) + relay.log_tail(100000)
        assert KEY_HEX not in text and "a1" * 32 not in text  # the keys are never logged nor shown

        # A damaged frame: named in the relay's log (file, frame) and never sent. A replica that needs it gets
        # nothing at or past the damaged frame; the sender ends its dump (error 1236, or, for an event streamed
        # in pieces, by closing the connection: the replica retries and meets the same refusal).
        # The damage is in a middle frame, which a relay's start does not read (it reads each closed file's head and
        # end), and the relay is restarted after it: a relay that read the file before it was damaged may still
        # serve its shared chunks from memory (they were checked when read, and these 1.5 MB rows are chunks of
        # their own), so only a fresh process must read the damaged frame from disk.
        # The relay is stopped first: its archiver moves converted files while it runs (seen once in CI: the file
        # chosen from the relay directory was in the archive by the time it was opened).
        relay.stop()
        victim, stored_path, frames = None, None, []
        for name in names:
            candidate = next((p for p in (archive / (name + CF.SUFFIX), relay_dir / (name + CF.SUFFIX)) if p.exists()),
                             None)
            if candidate is None:
                continue
            with CF.FramedFile(candidate, name=name, keyring=Keyring.parse(KEYS, "test")) as f:
                if f.count > 2:
                    victim, stored_path, frames = name, candidate, f.table
                    break
        assert victim is not None, "no stored file spans three frames"
        raw = bytearray(stored_path.read_bytes())
        at, length = frames[1][:2]
        raw[at + length // 2] ^= 0x10
        stored_path.write_bytes(raw)
        damaged_from = CF.DEFAULT_FRAME_SIZE  # the damaged frame's first logical byte
        relay.start()
        wait_relay(relay, master)
        damaged = mariadb("damaged", server_id=6)
        change_master(damaged, listen, file="master-bin.000001", pos=4)
        damaged.execute("START SLAVE")
        relay.wait_for(lambda st: "relay file cannot be read back whole: not served" in relay.log_tail(100000),
                       timeout=60, what="the damaged frame refused")
        tail = relay.log_tail(100000)
        assert victim in tail and f"frame 1 (logical offsets {damaged_from}-" in tail
        time.sleep(2)  # let the replica retry: it must not get further
        status = replica_status(damaged)
        assert int(status.get("Last_IO_Errno") or 0) in (0, 1236), status.get("Last_IO_Error")
        assert not status.get("Last_SQL_Error"), status.get("Last_SQL_Error")
        reached = (status["Master_Log_File"], int(status["Read_Master_Log_Pos"]))
        assert reached[0] < victim or (reached[0] == victim and reached[1] <= damaged_from), (reached, victim)
    finally:
        CF.configure(relay_dir, keyring=None)
        relay.stop()
