"""MariaDB encrypted binlogs (encrypt_binlog=ON): the key file, the decryptor, and `serve`, `inspect` and the relay
against real 10.11 servers running file_key_management (AES-CBC with a plain key file, AES-CTR with a key file
encrypted with a file key)."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog.encryption import (
    BinlogKeyError,
    DecryptingStream,
    EventDecryptor,
    decrypt_binlog,
    parse_key_file,
)
from relayproxy.lab.harness import RelayProcess, master_status, prepare_master
from relayproxy.relay.decrypted import DecryptedMirror, read_key_file

from ..support import eventgen as E
from ..downstream.test_downstream_e2e import replica_status, wait_replica
from ..scenarios.test_relay_e2e import mixed_load
from ..commands.test_serve import served

KEY1 = bytes(range(32))
KEY2 = bytes(range(100, 116))
FILE_KEY = "s3cret-file-key"


# ---------------------------------------------------------------------------------------------
# A test-side encryptor, written from the format description (binlog/encryption.py's text), to round-trip


def _encrypt_event(plain: bytes, offset: int, key: bytes, nonce: bytes, algorithm: str) -> bytes:
    n = len(plain)
    moved = bytearray(plain)
    moved[9:13] = plain[0:4]
    stream = bytes(moved[4:])
    iv = nonce + struct.pack("<I", offset)
    if algorithm == "aes_ctr":
        enc = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
        cipher = enc.update(stream) + enc.finalize()
    else:
        whole = len(stream) // 16 * 16
        enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
        cipher = enc.update(stream[:whole]) + enc.finalize()
        ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        mask = ecb.update(iv) + ecb.finalize()
        cipher += bytes(a ^ b for a, b in zip(stream[whole:], mask))
    stored = bytearray(4) + bytearray(cipher)
    stored[0:4] = stored[9:13]
    stored[9:13] = struct.pack("<I", n)
    return bytes(stored)


def _plain_event(type_code: int, body: bytes, offset: int, crc: bool = True) -> bytes:
    size = C.HEADER_LEN + len(body) + (4 if crc else 0)
    head = struct.pack("<IBIIIH", 1700000000, type_code, 7, size, offset + size, 0)
    event = head + body
    return event + struct.pack("<I", zlib.crc32(event)) if crc else event


def _start_event(offset: int, nonce: bytes) -> bytes:
    return _plain_event(C.MARIA_START_ENCRYPTION_EVENT, b"\x01" + struct.pack("<I", 1) + nonce, offset)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(min_size=0, max_size=300), offset=st.integers(4, 0xFFFFFF00),
       algorithm=st.sampled_from(["aes_cbc", "aes_ctr"]), nonce=st.binary(min_size=12, max_size=12))
def test_decrypt_inverts_mariadb_encryption(body, offset, algorithm, nonce):
    plain = _plain_event(C.QUERY_EVENT, body, offset)
    stored = _encrypt_event(plain, offset, KEY1, nonce, algorithm)
    assert len(stored) == len(plain) and struct.unpack_from("<I", stored, 9)[0] == len(plain)
    dec = EventDecryptor(_start_event(256, nonce), {1: KEY1}, algorithm=algorithm)
    assert dec.decrypt(offset, stored) == plain
    # Another key, another position or one flipped bit: refused, never returned as an event.
    with pytest.raises(BinlogKeyError, match="does not decrypt with key id 1"):
        EventDecryptor(_start_event(256, nonce), {1: bytes(32)}, algorithm=algorithm).decrypt(offset, stored)
    with pytest.raises(BinlogKeyError, match=f"offset {offset + 16}"):
        dec.decrypt(offset + 16, stored)
    flipped = bytearray(stored)
    flipped[len(stored) // 2 if len(stored) // 2 not in range(9, 13) else 4] ^= 0x10
    with pytest.raises(BinlogKeyError):
        dec.decrypt(offset, bytes(flipped))


@settings(max_examples=50, deadline=None)
@given(bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=8), cut=st.integers(1, 4000),
       algorithm=st.sampled_from(["aes_cbc", "aes_ctr"]))
def test_stream_decrypts_a_file_fed_in_any_pieces(bodies, cut, algorithm):
    fde = bytearray(E.fde(server_version="10.11.19-MariaDB-log", checksum=True, n_types=171))
    struct.pack_into("<I", fde, 13, 4 + len(fde))  # log_pos: its end, at offset 4
    struct.pack_into("<I", fde, len(fde) - 4, zlib.crc32(fde[:-4]))
    nonce = bytes(range(12))
    plain_file = bytearray(C.BINLOG_MAGIC + fde)
    start = _start_event(len(plain_file), nonce)
    stored_file = bytearray(plain_file + start)
    ignorable = bytearray(start)
    struct.pack_into("<H", ignorable, 17, C.LOG_EVENT_IGNORABLE_F)
    struct.pack_into("<I", ignorable, len(ignorable) - 4, zlib.crc32(ignorable[:-4]))
    plain_file += ignorable
    for body in bodies:
        event = _plain_event(C.QUERY_EVENT, body, len(plain_file))
        stored_file += _encrypt_event(event, len(plain_file), KEY1, nonce, algorithm)
        plain_file += event
    stream = DecryptingStream({1: KEY1}, algorithm=algorithm)
    out = b""
    for at in range(0, len(stored_file), cut):
        out += stream.feed(stored_file[at : at + cut])
    assert out == bytes(plain_file) and stream.pending == 0 and stream.encrypted
    # The plain copy passes through unchanged (its START_ENCRYPTION is ignorable), with or without keys.
    assert decrypt_binlog(bytes(plain_file), None) == bytes(plain_file)
    # A cut last event waits.
    assert DecryptingStream({1: KEY1}, algorithm=algorithm).feed(stored_file[:-1]) == bytes(plain_file)[: -len(event)]


def test_key_file_format_and_errors(tmp_path):
    text = f"# keys\n\n1;{KEY1.hex()}\n 2;{KEY2.hex().upper()} \n".encode()
    assert parse_key_file(text) == {1: KEY1, 2: KEY2}
    for bad, message in [
        (b"1:00", "expected '<key id>;<hex key>'"),
        (b"x;00", "expected '<key id>;<hex key>'"),
        (b"0;" + KEY2.hex().encode(), "key id 0 is out of range"),
        (b"3;zz", "key 3 is not hexadecimal"),
        (b"3;0011", "key 3 has 16 bits"),
        (b"1;" + KEY2.hex().encode() + b"\n1;" + KEY2.hex().encode(), "line 2: key id 1 appears twice"),
    ]:
        with pytest.raises(BinlogKeyError, match=re.escape(message)):
            parse_key_file(bad, source="keys.txt")
    plain = tmp_path / "keys.txt"
    plain.write_bytes(text)
    enc = tmp_path / "keys.enc"
    _openssl_encrypt(plain, enc, FILE_KEY)
    assert read_key_file(enc, FILE_KEY) == {1: KEY1, 2: KEY2}
    (tmp_path / "filekey").write_text(FILE_KEY + "\n")
    assert read_key_file(enc, f"FILE:{tmp_path / 'filekey'}") == {1: KEY1, 2: KEY2}
    with pytest.raises(BinlogKeyError, match="is encrypted .* give its file key"):
        read_key_file(enc)
    with pytest.raises(BinlogKeyError, match="does not decrypt with the given file key"):
        read_key_file(enc, "not-the-key")
    with pytest.raises(BinlogKeyError, match="cannot read the binlog key file"):
        read_key_file(tmp_path / "missing")


def _openssl_encrypt(src: Path, dst: Path, secret: str) -> None:
    """The key file encrypted as MariaDB's documentation says: openssl enc -aes-256-cbc -md sha1."""
    subprocess.run(["openssl", "enc", "-aes-256-cbc", "-md", "sha1", "-pass", f"pass:{secret}", "-in", str(src),
                    "-out", str(dst)], check=True, capture_output=True)


# ---------------------------------------------------------------------------------------------
# Real servers


@pytest.fixture(params=["aes_cbc plain key file", "aes_ctr encrypted key file"], scope="module")
def encrypted_master(request, tmp_path_factory):
    from relayproxy.lab.sandbox import MariaDBSandbox

    algorithm, _, kind = request.param.partition(" ")
    base = tmp_path_factory.mktemp("encrypted")
    keys = base / "keys.txt"
    keys.write_text(f"1;{KEY1.hex()}\n2;{KEY2.hex()}\n")
    config = {"plugin_load_add": "file_key_management", "encrypt_binlog": True,
              "file_key_management_encryption_algorithm": algorithm}
    filekey = None
    if kind.startswith("encrypted"):
        enc = base / "keys.enc"
        _openssl_encrypt(keys, enc, FILE_KEY)
        keys = enc
        filekey = FILE_KEY
        config["file_key_management_filekey"] = FILE_KEY
    config["file_key_management_filename"] = str(keys)
    master = MariaDBSandbox(base / "master", extra_config=config)
    master.start()
    try:
        prepare_master(master)
        mixed_load(master, rounds=2, big=True)
        master.execute("FLUSH BINARY LOGS")
        _wait_for_checkpoint(master)
        yield master, keys, filekey, algorithm
    finally:
        master.stop()


def _wait_for_checkpoint(master, timeout: float = 30.0) -> None:
    """After FLUSH BINARY LOGS, MariaDB writes the new file's BINLOG_CHECKPOINT later, from its background thread,
    once the older file's transactions are durable in InnoDB. A test that serves a snapshot of the files waits for
    it, so the master is not past the snapshot by that one event."""
    newest = master.execute("SHOW MASTER STATUS")[0][0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = master.execute(f"SHOW BINLOG EVENTS IN '{newest}'")
        if any(row[2] == "Binlog_checkpoint" and newest in str(row[5]) for row in events):
            return
        time.sleep(0.05)
    raise AssertionError(f"the master wrote no BINLOG_CHECKPOINT for {newest} in {timeout} s")


def _key_args(keys, filekey, algorithm) -> list[str]:
    args = ["--binlog-key-file", str(keys), "--binlog-key-algorithm", algorithm]
    return args + (["--binlog-key-file-key", filekey] if filekey else [])


pytestmark = pytest.mark.server


def test_the_server_writes_encrypted_files(encrypted_master):
    master, keys, filekey, algorithm = encrypted_master
    first = master.binlog_files()[0].read_bytes()
    assert b"app.t" in decrypt_binlog(first, read_key_file(keys, filekey), algorithm=algorithm)
    assert b"app.t" not in first  # really encrypted: no table name in clear


def test_decrypted_files_equal_what_the_master_sends(encrypted_master, tmp_path):
    """Every closed file, decrypted, is byte for byte what `mariadb-binlog --read-from-remote-server --raw` gets."""
    master, keys, filekey, algorithm = encrypted_master
    key_map = read_key_file(keys, filekey)
    closed = [p for p in master.binlog_files()][:-1]
    assert len(closed) >= 2
    for path in closed:
        subprocess.run(["mariadb-binlog", "--read-from-remote-server", "--raw", "-h127.0.0.1", f"-P{master.port}",
                        "-uroot", f"--result-file={tmp_path}/", path.name], check=True, capture_output=True)
        assert decrypt_binlog(path.read_bytes(), key_map, algorithm=algorithm) == (tmp_path / path.name).read_bytes()


def _remote_events(master, name: str) -> list[tuple[int, int]]:
    """(position, end_log_pos) of every event `mariadb-binlog --read-from-remote-server` lists (the master decrypts)."""
    text = subprocess.run(["mariadb-binlog", "--read-from-remote-server", "-h127.0.0.1", f"-P{master.port}",
                           "-uroot", name], check=True, capture_output=True, text=True).stdout
    events = []
    at = None
    for line in text.splitlines():
        m = re.match(r"^# at (\d+)$", line)
        if m:
            at = int(m.group(1))
            continue
        m = re.search(r" end_log_pos (\d+) ", line)
        if m and at is not None and line.startswith("#"):
            events.append((at, int(m.group(1))))
            at = None
    return [e for e in events if e[1] != 0]  # the fake ROTATE / FDE copies of a remote dump (log_pos 0)


def test_inspect_lists_the_events_mariadb_binlog_lists(encrypted_master):
    master, keys, filekey, algorithm = encrypted_master
    for path in master.binlog_files()[:-1]:
        shown = subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "inspect",
                                *_key_args(keys, filekey, algorithm), str(path)],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        listed = [(int(m.group(1)), int(m.group(3))) for m in
                  re.finditer(r"^\s+(\d+)\s+(\S+)\s+\d+\s+\d+\s+(\d+)\s+ok", shown.stdout, re.M)]
        assert listed and listed == _remote_events(master, path.name)
        assert "MARIA_START_ENCRYPTION" in shown.stdout and "CRC errors: 0" in shown.stdout
        as_json = subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "inspect", "--json",
                                  *_key_args(keys, filekey, algorithm), str(path)],
                                 capture_output=True, text=True, timeout=60)
        report = json.loads(as_json.stdout)
        assert report["error"] is None and report["events"] == len(listed) and report["crc_errors"] == 0


def test_inspect_without_or_with_a_wrong_key_says_so(encrypted_master, tmp_path):
    master, keys, filekey, algorithm = encrypted_master
    path = master.binlog_files()[0]
    cli = [sys.executable, "-m", "relayproxy.commands.cli", "inspect"]
    plain = subprocess.run([*cli, str(path)], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 1 and "encrypt_binlog=ON" in plain.stdout and "--binlog-key-file" in plain.stdout
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(f"1;{bytes(32).hex()}\n")
    bad = subprocess.run([*cli, "--binlog-key-file", str(wrong), "--binlog-key-algorithm", algorithm, str(path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "does not decrypt with key id 1" in bad.stdout and str(wrong) in bad.stdout
    missing = tmp_path / "no-id-1.txt"
    missing.write_text(f"2;{KEY2.hex()}\n")
    gone = subprocess.run([*cli, "--binlog-key-file", str(missing), str(path)], capture_output=True, text=True,
                          timeout=60)
    assert gone.returncode == 1 and "key id 1" in gone.stdout and str(missing) in gone.stdout


def test_serve_refuses_a_missing_or_wrong_key_naming_it(encrypted_master, tmp_path):
    master, keys, filekey, algorithm = encrypted_master
    missing = tmp_path / "no-id-1.txt"
    missing.write_text(f"2;{KEY2.hex()}\n")
    with pytest.raises(Exception, match=rf"key id 1 .*not in {re.escape(str(missing))}"):
        with served(master.binlog_dir, "--binlog-key-file", str(missing)):
            pass
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(f"1;{bytes(32).hex()}\n")
    with pytest.raises(Exception, match=rf"does not decrypt with key id 1 from {re.escape(str(wrong))}"):
        with served(master.binlog_dir, "--binlog-key-file", str(wrong), "--binlog-key-algorithm", algorithm):
            pass
    with pytest.raises(Exception, match="encrypt_binlog=ON"):
        with served(master.binlog_dir):
            pass


def test_a_replica_of_serve_gets_the_masters_data(encrypted_master, mariadb, tmp_path):
    master, keys, filekey, algorithm = encrypted_master
    decrypted = tmp_path / "plain"
    with served(master.binlog_dir, *_key_args(keys, filekey, algorithm), "--decrypted-dir", str(decrypted)) as srv:
        assert len(srv.mirror.encrypted_files) >= 3  # every file, the newest too
        assert srv.status()["binlog_dir"] == str(master.binlog_dir)
        replica = mariadb("replica", server_id=3)
        replica.execute(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={srv.port}, MASTER_USER='repl', "
            "MASTER_PASSWORD='servepw', MASTER_CONNECT_RETRY=1, MASTER_LOG_FILE='master-bin.000001', "
            "MASTER_LOG_POS=4"
        )
        replica.execute("START SLAVE")
        status = wait_replica(replica, master)
        assert status["Slave_IO_Running"] == "Yes" and status["Slave_SQL_Running"] == "Yes"
        for table in ("app.t", "app.ddl0", "app.ddl1"):
            assert replica.execute(f"CHECKSUM TABLE {table}")[0][1] == master.execute(f"CHECKSUM TABLE {table}")[0][1]
        assert replica.execute("SELECT COUNT(*) FROM app.t") == master.execute("SELECT COUNT(*) FROM app.t")
        replica.execute("STOP SLAVE")
        assert replica_status(replica)["Last_IO_Error"] == ""
    # The plain copies were in the directory asked for, never in the served one.
    assert not any(p.name.startswith(".") for p in master.binlog_dir.iterdir())


def test_mirror_follows_a_growing_file(encrypted_master, tmp_path):
    master, keys, filekey, algorithm = encrypted_master
    mirror = DecryptedMirror(master.binlog_dir, read_key_file(keys, filekey), key_source=str(keys),
                             algorithm=algorithm, target=tmp_path / "m")
    try:
        mirror.sync()
        newest = master.binlog_files()[-1]
        before = (tmp_path / "m" / newest.name).stat().st_size
        master.execute("INSERT INTO app.t (v) VALUES ('grown')")
        mirror.sync()
        grown = (tmp_path / "m" / newest.name).read_bytes()
        assert len(grown) > before and b"grown" in grown
        assert grown == decrypt_binlog(newest.read_bytes(), read_key_file(keys, filekey), algorithm=algorithm)
        index = (tmp_path / "m" / "master-bin.index").read_text()
        assert newest.name in index
    finally:
        mirror.close()
    assert (tmp_path / "m").is_dir()  # a directory given by the operator is kept


def test_a_relay_of_an_encrypted_master_stores_plain_files(encrypted_master, tmp_path):
    """The master decrypts before sending: the relay's files are the plain ones (START_ENCRYPTION ignorable)."""
    master, keys, filekey, algorithm = encrypted_master
    relay = RelayProcess(tmp_path / "relay", master.port).start()
    try:
        relay.wait_caught_up(master)
    finally:
        relay.stop()
    key_map = read_key_file(keys, filekey)
    for path in master.binlog_files()[:-1]:
        stored = (tmp_path / "relay" / path.name).read_bytes()
        assert stored == decrypt_binlog(path.read_bytes(), key_map, algorithm=algorithm), path.name
        assert b"app.t" in stored or path.stat().st_size < 1024
        shown = subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "inspect", "--summary",
                                str(tmp_path / "relay" / path.name)], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stdout
    file, pos = master_status(master)
    assert os.path.getsize(tmp_path / "relay" / file) == pos
