"""Per-file indexes of closed relay files (relay/fileindex.py): what they hold equals a scan, they are verified on
use, rebuilt when missing or damaged, removed with their file, and the catalog and the GTID dump start use them."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from relayproxy.binlog.reader import scan_bytes, scan_file
from relayproxy.downstream.dump.files import scan_file_gtids
from relayproxy.relay import RelayStore
from relayproxy.relay import fileindex as FI
from relayproxy.relay.catalog import FileCatalog

from .test_relay_checkpoint import as_sent
from .test_relay_store import Feeder, mysql_image, split_events

MARIA = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"


def test_index_describes_a_real_file_as_a_scan_does(tmp_path, corpus_dir):
    for rel in (f"{MARIA}/mariadb-repl-bin.000002", "zalora-binlog-parser/data/gtid-fixtures/mysql-bin.01"):
        data = as_sent((corpus_dir / rel).read_bytes())
        path = tmp_path / Path(rel).name
        path.write_bytes(data)
        idx = FI.build(path, path.name, sparse_bytes=64 << 10)
        scan = scan_file(path)
        assert idx.size == len(data) and idx.events == scan.events and idx.groups == scan.groups_complete
        assert idx.start_set() == scan.start_gtids and idx.end_set() == scan.gtids_after
        assert idx.last_event == split_events(data)[-1][0] and idx.error is None
        assert FI.verify_content(idx, path) is None
        # every sparse entry is a group boundary with the set a scan of the prefix finds there
        assert idx.sparse or len(data) < 64 << 10
        for position, gtids, _anon in idx.sparse:
            prefix = scan_bytes(data[:position])
            assert prefix.good_end == position and FI.decode_gtids(gtids) == prefix.gtids_after
        # round trip through the sidecar
        FI.write(tmp_path, idx)
        loaded, why = FI.load(tmp_path, path.name)
        assert why is None and loaded == idx


def test_an_index_that_does_not_match_its_file_is_not_used_and_is_rebuilt(tmp_path, corpus_dir, caplog):
    data = as_sent((corpus_dir / "zalora-binlog-parser/data/gtid-fixtures/mysql-bin.01").read_bytes())
    path = tmp_path / "mysql-bin.01"
    path.write_bytes(data)
    FI.write(tmp_path, FI.build(path, path.name))
    side = FI.sidecar_path(tmp_path, path.name)
    good = side.read_bytes()
    cases = {
        "torn": lambda: side.write_bytes(good[: len(good) // 2]),
        "flipped": lambda: side.write_bytes(good.replace(b'"events":', b'"events":1', 1)),
        "file grew": lambda: path.write_bytes(data + b"x"),
        "last bytes changed": lambda: path.write_bytes(data[:-1] + bytes([data[-1] ^ 1])),
    }
    for label, damage in cases.items():
        path.write_bytes(data)
        side.write_bytes(good)
        damage()
        idx, why = FI.load(tmp_path, path.name)
        assert idx is None and why, label
        rebuilt = FI.index_for(tmp_path, path.name, writable=True)
        assert rebuilt.size == path.stat().st_size, label
        assert FI.load(tmp_path, path.name)[0] == rebuilt, label  # written again, and now it verifies
    side.unlink()
    FI.index_for(tmp_path, path.name, writable=False)
    assert not side.exists()  # where the relay may not write (serve), nothing is written


def test_store_indexes_closed_files_catalog_uses_them_purge_removes_them(tmp_path, monkeypatch):
    first = mysql_image("binlog.000002", groups=6)
    second = mysql_image("binlog.000003", groups=3, start=scan_bytes(first).gtids_after)
    third = mysql_image("binlog.000004", rotate=False, groups=2, start=scan_bytes(second).gtids_after)
    relay = tmp_path / "relay"
    store = RelayStore.open(relay)
    for name, image in (("binlog.000001", first), ("binlog.000002", second), ("binlog.000003", third)):
        store.start_file(name)
        Feeder(store).feed_all(image)
    assert store._indexer.wait_idle()
    for name in ("binlog.000001", "binlog.000002"):
        assert FI.load(relay, name)[0] is not None, name
    assert not FI.sidecar_path(relay, "binlog.000003").exists()  # the current file is not closed
    # the catalog reads the index: no scan of a closed file
    scans = []
    import relayproxy.binlog.reader as reader

    real = reader.scan_file
    monkeypatch.setattr(reader, "scan_file", lambda *a, **kw: (scans.append(a[0]), real(*a, **kw))[1])
    catalog = FileCatalog(store)
    purged = catalog.purged()
    assert purged == scan_bytes(first).start_gtids
    assert catalog._events_gtids("binlog.000001") == scan_bytes(first).gtids_after.subtract(
        scan_bytes(first).start_gtids)
    assert scan_file_gtids(os.fspath(relay / "binlog.000002")) == scan_bytes(second).gtids_after.subtract(
        scan_bytes(second).start_gtids)
    assert scans == []
    store.purge_to("binlog.000002")
    assert not FI.sidecar_path(relay, "binlog.000001").exists()
    store.close()
    # a leftover of a crash: an index whose file is gone, a temporary file; removed at the next open
    FI.sidecar_path(relay, "binlog.000000").write_bytes(b"{}")
    (relay / (FI.sidecar_name("binlog.000002") + ".1.2.tmp")).write_bytes(b"")
    RelayStore.open(relay).close()
    assert sorted(p.name for p in relay.iterdir() if p.name.startswith(FI.SIDECAR_PREFIX)) == [
        FI.sidecar_name("binlog.000002")]


def test_the_indexer_goes_on_after_a_defect_on_one_file(tmp_path, monkeypatch, caplog):
    """An unexpected error while indexing one closed file is logged and the next file is still indexed (the
    background thread used to die with it, and nothing was indexed again until a restart)."""
    built = []
    real_build = FI.build

    def build(path, name, **kw):
        if name == "bad.000001":
            raise ZeroDivisionError("a defect")
        idx = real_build(path, name, **kw)
        built.append(name)
        return idx

    monkeypatch.setattr(FI, "build", build)
    data = mysql_image()
    for name in ("bad.000001", "good.000002"):
        (tmp_path / name).write_bytes(data)
    indexer = FI.Indexer(tmp_path)
    try:
        indexer.closed("bad.000001")
        assert indexer.wait_idle(30)
        indexer.closed("good.000002")
        assert indexer.wait_idle(30)
        assert built == ["good.000002"] and indexer.built == ["good.000002"]
        assert FI.load(tmp_path, "good.000002")[0] is not None and FI.load(tmp_path, "bad.000001")[0] is None
        assert "relay file index failed" in caplog.text and "ZeroDivisionError" in caplog.text
        thread = indexer._thread
        assert thread is not None and thread.is_alive()  # the thread that met the defect goes on
    finally:
        indexer.close()
    assert not thread.is_alive()


def test_a_simulated_crash_ends_the_indexer_thread_quietly(tmp_path, monkeypatch):
    """Under crashfs the machine 'goes down' inside a call (SimulatedCrash, a BaseException): the thread ends
    without an unhandled-exception report, and a later closed file starts another."""
    from relayproxy.lab.crashfs import SimulatedCrash

    calls = []
    real_build = FI.build

    def build(path, name, **kw):
        calls.append(name)
        if len(calls) == 1:
            raise SimulatedCrash()
        return real_build(path, name, **kw)

    monkeypatch.setattr(FI, "build", build)
    data = mysql_image()
    for name in ("a.000001", "b.000002"):
        (tmp_path / name).write_bytes(data)
    indexer = FI.Indexer(tmp_path)
    reported = []
    monkeypatch.setattr(threading, "excepthook", reported.append)
    try:
        indexer.closed("a.000001")
        assert indexer.wait_idle(30)
        indexer.closed("b.000002")
        assert indexer.wait_idle(30)
        assert indexer.built == ["b.000002"] and calls == ["a.000001", "b.000002"]
    finally:
        indexer.close()
    assert reported == []


# -- SHA-256: what operators compare between relays ---------------------------------------------------------------


def test_the_index_holds_the_files_sha256_and_the_deep_check_compares_it(tmp_path, corpus_dir):
    import hashlib
    import json

    data = as_sent((corpus_dir / "zalora-binlog-parser/data/gtid-fixtures/mysql-bin.01").read_bytes())
    path = tmp_path / "mysql-bin.01"
    path.write_bytes(data)
    idx = FI.build(path, path.name)
    assert idx.sha256 == hashlib.sha256(data).hexdigest()
    assert FI.sha256_of(path) == (idx.sha256, len(data))
    assert FI.sha256_of(path, 100) == (hashlib.sha256(data[:100]).hexdigest(), 100)
    FI.write(tmp_path, idx)
    # A change in the middle keeps the identity (size, FDE, last 64 KiB) and the CRC32 forged: SHA-256 tells.
    record = json.loads(FI.sidecar_path(tmp_path, path.name).read_text())
    assert record["version"] == 2 and record["body"]["sha256"] == idx.sha256
    forged = FI.FileIndex(**{**record["body"], "sha256": "0" * 64})
    assert "SHA-256 differs" in FI.verify_content(forged, path)
    # An index of version 1 (no SHA-256) is not used: it is rebuilt, with the SHA-256.
    body = {k: v for k, v in record["body"].items() if k != "sha256"}
    from relayproxy.relay.checkpoint import encode_record

    FI.sidecar_path(tmp_path, path.name).write_bytes(encode_record("relayproxy-fileindex", 1, body))
    assert FI.load(tmp_path, path.name) == (None, "index damaged: version 1, this relay reads version 2")
    assert FI.index_for(tmp_path, path.name, writable=True).sha256 == idx.sha256
    assert FI.load(tmp_path, path.name)[0].sha256 == idx.sha256
    bad = dict(record["body"], sha256="not hex")
    FI.sidecar_path(tmp_path, path.name).write_bytes(encode_record("relayproxy-fileindex", 2, bad))
    assert "sha256 is not 64" in FI.load(tmp_path, path.name)[1]


def test_store_file_digests_closed_files_only_and_status_shows_them(tmp_path):
    import hashlib
    from types import SimpleNamespace

    from relayproxy.ops.status import _file_digests

    first = mysql_image("binlog.000002", groups=6)
    second = mysql_image("binlog.000003", groups=3, rotate=False, start=scan_bytes(first).gtids_after)
    relay = tmp_path / "relay"
    store = RelayStore.open(relay)
    for name, image in (("binlog.000001", first), ("binlog.000002", second)):
        store.start_file(name)
        Feeder(store).feed_all(image)
    assert store._indexer.wait_idle()
    closed = (relay / "binlog.000001").read_bytes()
    assert store.file_digest("binlog.000001") == hashlib.sha256(closed).hexdigest()
    assert store.file_digest("binlog.000002") is None  # the current file grows: hashed on demand only
    horizon = store.horizon.snapshot()
    sizes = {"binlog.000001": len(closed), "binlog.000002": horizon.position}
    assert _file_digests(store, store.files(), sizes, horizon) == [
        {"file": "binlog.000001", "size": len(closed), "sha256": hashlib.sha256(closed).hexdigest()},
        {"file": "binlog.000002", "size": horizon.position, "sha256": None}]
    # An index lost (or written before SHA-256s): null at first, built in the background, then shown.
    FI.remove(relay, "binlog.000001")
    store._indexer.forget("binlog.000001")
    assert store.file_digest("binlog.000001") is None
    assert store._indexer.wait_idle()
    assert store.file_digest("binlog.000001") == hashlib.sha256(closed).hexdigest()
    assert FI.load(relay, "binlog.000001")[0] is not None
    # The current file's digest on demand, over the horizon (what `relayproxy inspect --summary` does).
    current = (relay / "binlog.000002").read_bytes()[: horizon.position]
    assert FI.sha256_of(relay / "binlog.000002", horizon.position)[0] == hashlib.sha256(current).hexdigest()
    store.close()
    unindexed = SimpleNamespace(file_digest=lambda name: None)  # a store that keeps no index
    assert _file_digests(unindexed, ["a"], {"a": 9}, SimpleNamespace(file=None, position=0)) == [
        {"file": "a", "size": 9, "sha256": None}]


def test_inspect_summary_and_json_show_the_sha256(tmp_path, capsys):
    import hashlib
    import json

    from relayproxy.commands import cli

    image = mysql_image("binlog.000002", groups=3)
    path = tmp_path / "binlog.000001"
    path.write_bytes(image + b"\x01\x02\x03")  # a partial event after the last complete transaction
    assert cli.main(["inspect", "--summary", str(path)]) in (0, 1)
    out = capsys.readouterr().out
    want = hashlib.sha256(image).hexdigest()
    assert f"sha256: {want} (the first {len(image)} (the last complete transaction's end) of" in out
    path.write_bytes(image)
    assert cli.main(["inspect", "--summary", str(path)]) == 0
    assert f"sha256: {want} (all {len(image)} bytes)" in capsys.readouterr().out
    assert cli.main(["inspect", "--json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["sha256"], doc["sha256_bytes"], doc["size"]) == (want, len(image), len(image))
