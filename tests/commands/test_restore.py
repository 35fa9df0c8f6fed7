"""relayproxy restore: a relay directory rebuilt from its archive, byte for byte; corrupt and missing objects
refused by name with nothing left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relayproxy.relay import RelayStore
from relayproxy.relay import archive as A
from relayproxy.relay.closed_files import Keyring
from relayproxy.relay.conversion import StorageOptions
from relayproxy.relay.master_info import MasterInfo, MasterInfoFile
from relayproxy.relay.objectstore import FileObjectStore

from ..relay.test_archive import Relay
from ..support.s3server import BUCKET, s3_server  # noqa: F401 - the fixture


def restore_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "restore", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def archived(tmp_path: Path, *, storage=None, upto: int | None = None):
    relay = Relay(tmp_path)
    relay.feed(upto or 1500)
    up = relay.uploader(FileObjectStore(tmp_path / "bucket"), storage=storage)
    up.run_once()
    relay.feed(len(relay.events) - 40)  # the newest file goes on past the archive...
    up.run_once()
    relay.feed(len(relay.events))  # ...and a little more is durable locally only
    return relay, up


def test_round_trip_is_byte_identical_and_opens_as_a_relay(tmp_path):
    relay, up = archived(tmp_path)
    MasterInfoFile(relay.dir).save_choice(MasterInfo(host="db1", port=3306, user="repl", password="pw-secret",
                                                     source="change_master", changed_at=1.0))
    up.run_once()
    archive_file, archive_pos, archive_gtids = up.archive_horizon
    relay.store.close()
    target = tmp_path / "restored"
    result = restore_cli("--from", f"file://{tmp_path / 'bucket'}", "--relay-dir", str(target))
    assert result.returncode == 0, result.stderr
    assert "no replication password" in result.stdout and "db1:3306" in result.stdout
    for name, image in relay.images[:-1]:
        assert (target / name).read_bytes() == (relay.dir / name).read_bytes() == image
    newest = relay.images[-1][0]
    assert archive_file == newest
    assert (target / newest).read_bytes() == (relay.dir / newest).read_bytes()[:archive_pos]
    assert (target / "relayproxy.index").read_text().split() == [n for n, _ in relay.images]
    assert (target / "relayproxy.uuid").exists() is (relay.dir / "relayproxy.uuid").exists()
    # no password given: the choice is left out (and there was no identity), the configured master is in force
    assert not (target / "relayproxy.master.json").exists()
    assert archive_gtids in result.stdout
    with RelayStore.open(target, create=False) as store:
        snap = store.horizon.snapshot()
        assert (snap.file, snap.position, snap.text) == (archive_file, archive_pos, archive_gtids)


def test_restore_with_the_master_password_keeps_the_choice(tmp_path):
    relay, up = archived(tmp_path)
    MasterInfoFile(relay.dir).save_choice(MasterInfo(host="db1", port=3306, user="repl", password="pw-secret",
                                                     source="change_master", changed_at=1.0))
    up.run_once()
    relay.store.close()
    (tmp_path / "pw").write_text("pw-secret\n")
    target = tmp_path / "restored"
    result = restore_cli("--from", f"file://{tmp_path / 'bucket'}", "--relay-dir", str(target),
                         "--master-password-file", str(tmp_path / "pw"))
    assert result.returncode == 0, result.stderr
    choice, _identity = MasterInfoFile(target).load()
    assert (choice.host, choice.password) == ("db1", "pw-secret")


def test_an_encrypted_compressed_archive_restores_with_its_key(tmp_path):
    keyring = Keyring.parse("3:" + "cd" * 32, "test")
    relay, _up = archived(tmp_path, storage=StorageOptions(compress="zstd", encrypt=True, keyring=keyring))
    relay.store.close()
    (tmp_path / "keys").write_text("3:" + "cd" * 32 + "\n")
    target = tmp_path / "restored"
    result = restore_cli("--from", f"file://{tmp_path / 'bucket'}", "--relay-dir", str(target))
    assert result.returncode == 1 and "cannot be read back" in result.stderr
    assert not target.exists()
    result = restore_cli("--from", f"file://{tmp_path / 'bucket'}", "--relay-dir", str(target),
                         "--encryption-key-file", str(tmp_path / "keys"))
    assert result.returncode == 0, result.stderr
    for name, image in relay.images[:-1]:
        assert (target / name).read_bytes() == image


def _first_part(bucket, name):
    start, end = A.bucket_files(o.key for o in bucket.list("files/"))[name].parts[0]
    return A.part_key(name, start, end)


@pytest.mark.parametrize("damage", ["corrupt", "missing", "missing-newest-start", "corrupt-metadata-too"])
def test_a_corrupt_or_missing_object_is_refused_by_name_and_nothing_is_left(tmp_path, damage):
    relay, _up = archived(tmp_path)
    relay.store.close()
    bucket = FileObjectStore(tmp_path / "bucket")
    name = "binlog.000002" if damage != "missing-newest-start" else relay.images[-1][0]
    key = _first_part(bucket, name)
    path = tmp_path / "bucket" / key
    if damage.startswith("corrupt"):
        data = bytearray(path.read_bytes())
        data[100] ^= 0xFF
        if damage == "corrupt-metadata-too":  # the part's own sha256 rewritten: the manifest still catches it
            import hashlib

            bucket.put(key, bytes(data), {"sha256": hashlib.sha256(bytes(data)).hexdigest(), "encoding": "plain"})
        else:
            path.write_bytes(bytes(data))
    else:
        bucket.delete(key)
    target = tmp_path / "restored"
    target.mkdir()
    result = restore_cli("--from", f"file://{tmp_path / 'bucket'}", "--relay-dir", str(target))
    assert result.returncode == 1
    assert key in result.stderr, result.stderr
    assert list(target.iterdir()) == []


def test_a_non_empty_directory_is_refused(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x").write_text("")
    result = restore_cli("--from", f"file://{tmp_path / 'bucket'}", "--relay-dir", str(tmp_path / "dir"))
    assert result.returncode == 2 and "not an empty directory" in result.stderr


def test_round_trip_through_s3(tmp_path, s3_server):  # noqa: F811
    from relayproxy.relay.objectstore import open_object_store

    relay = Relay(tmp_path, files=2)
    relay.feed(len(relay.events))
    bucket = open_object_store(f"s3://{BUCKET}/relay-9", endpoint=s3_server.endpoint)
    relay.uploader(bucket).run_once()
    relay.store.close()
    target = tmp_path / "restored"
    result = restore_cli("--from", f"s3://{BUCKET}/relay-9", "--archive-endpoint", s3_server.endpoint,
                         "--relay-dir", str(target))
    assert result.returncode == 0, result.stderr
    for name, image in relay.images:
        assert (target / name).read_bytes() == image


def test_real_mariadb_files_archived_and_restored_byte_for_byte(tmp_path, corpus_dir):
    from relayproxy.commands.restore import restore

    from ..relay.test_relay_store import MARIA_CORPUS, relay_dir_with

    names = [f"mariadb-repl-bin.{n:06d}" for n in (4, 5, 6, 7)]
    files = {name: (corpus_dir / MARIA_CORPUS / name).read_bytes() for name in names}
    d = relay_dir_with(tmp_path, files)
    bucket = FileObjectStore(tmp_path / "bucket")
    with RelayStore.open(d) as store:  # files older than the archive: each goes up as one part
        up = A.ArchiveUploader(d, bucket, store.files, store.horizon.snapshot, flavour=lambda: store.flavour)
        up.run_once()
        assert up.archive_horizon == (names[-1], len(files[names[-1]]), "0-10-262796")
    listed = A.bucket_files(o.key for o in bucket.list("files/"))
    assert all(listed[n].parts == ((0, len(files[n])),) for n in names)
    assert [listed[n].sealed for n in names] == [True, True, True, False]
    target = tmp_path / "restored"
    target.mkdir()
    summary = restore(bucket, target)
    assert (summary["file"], summary["position"], summary["gtids"]) == (names[-1], len(files[names[-1]]),
                                                                        "0-10-262796")
    for name in names:
        assert (target / name).read_bytes() == files[name]


@pytest.mark.parametrize("expired", ["first part", "whole file but its manifest"])
def test_oldest_files_expired_by_a_lifecycle_rule_are_refused_or_skipped_when_asked(tmp_path, expired):
    relay, up = archived(tmp_path)
    relay.store.close()
    bucket = tmp_path / "bucket"
    first = relay.images[0][0]
    parts = sorted((bucket / "files" / first).glob("part.*"))
    for part in parts[:1] if expired == "first part" else parts:
        part.unlink()
    target = tmp_path / "restored"
    refused = restore_cli("--from", f"file://{bucket}", "--relay-dir", str(target))
    assert refused.returncode == 1 and f"files/{first}/part." in refused.stderr
    assert "--from-oldest-complete" in refused.stderr
    assert not target.exists() or not any(target.iterdir())
    done = restore_cli("--from", f"file://{bucket}", "--from-oldest-complete", "--relay-dir", str(target))
    assert done.returncode == 0, done.stderr
    assert f"skipped 1 file(s) {first} to {first}" in done.stdout
    names = [n for n, _ in relay.images]
    assert (target / "relayproxy.index").read_text().split() == names[1:]
    for name, image in relay.images[1:-1]:
        assert (target / name).read_bytes() == image
    store = RelayStore.open(target, create=False)
    assert store.files() == names[1:]
    store.close()


def test_keep_local_leaves_old_files_in_the_bucket_as_stubs_with_their_indexes(tmp_path):
    from relayproxy.relay import closed_files as CF
    from relayproxy.relay import fileindex, remote, txindex

    from ..relay.test_remote import wait_indexed

    relay, up = archived(tmp_path)
    names = [n for n, _ in relay.images]
    wait_indexed(relay.dir, names[:-1])
    up.run_once()  # the closed files' index sidecars go up beside their parts
    relay.store.close()
    target = tmp_path / "restored"
    done = restore_cli("--from", f"file://{tmp_path / 'bucket'}", "--keep-local", "1 files", "--relay-dir", str(target))
    assert done.returncode == 0, done.stderr
    assert "1 of them left in the bucket as stubs" in done.stdout
    assert CF.is_remote(CF.locate(target / names[0])) and not (target / names[0]).exists()
    assert (target / names[1]).read_bytes() == relay.images[1][1]
    for name in names[:-1]:
        assert fileindex.load(target, name)[0] is not None
        side, why = txindex.load(target, name)
        assert side is not None and side.footer is not None, why
    assert not (target / remote.CACHE_DIR).exists() or not any((target / remote.CACHE_DIR).iterdir())  # no fetch
    with CF.open_relay_file(target / names[0]) as f:
        assert f.read(0, f.size()) == relay.images[0][1]
    stub = CF.read_stub(target / (names[0] + CF.REMOTE_SUFFIX))
    assert stub.url == f"file://{tmp_path / 'bucket'}" and stub.sha256 == __import__("hashlib").sha256(
        relay.images[0][1]).hexdigest()
