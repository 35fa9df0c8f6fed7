"""A served directory (relay/readonly.py's ``ReadOnlyBinlogDir``) is a ``StoreReader`` (relay/reader.py): every
member a reader asks of a store is there, and says that nothing is written (no index sidecar, no upstream)."""

from __future__ import annotations

from relayproxy.binlog.reader import scan_bytes
from relayproxy.relay import txindex
from relayproxy.relay.catalog import FileCatalog
from relayproxy.relay.reader import StoreReader
from relayproxy.relay.readonly import ReadOnlyBinlogDir, ServeOptions

from .test_relay_store import mysql_image


def test_a_served_directory_carries_every_store_reader_member_and_writes_nothing(tmp_path):
    d = tmp_path / "binlogs"
    d.mkdir()
    first = mysql_image("binlog.000002", groups=6)
    (d / "binlog.000001").write_bytes(first)
    (d / "binlog.000002").write_bytes(mysql_image(groups=3, rotate=False, start=scan_bytes(first).gtids_after))
    store = ReadOnlyBinlogDir.open(ServeOptions(binlog_dir=d))
    assert isinstance(store, StoreReader)
    assert store.read_only and not store.sidecars_writable
    assert store.transaction_index is None and store.upstream_position() is None
    assert store.file_digest("binlog.000001") is None
    assert store.epochs.implicit and store.current_file == "binlog.000002"
    index = txindex.index_of(store)  # kept per store, never written beside the files
    assert not index.writable and txindex.index_of(store) is index
    assert len(index.transactions("binlog.000001")) == 6
    catalog = FileCatalog(store)
    assert catalog.purged() == scan_bytes(first).start_gtids
    assert str(catalog._events_gtids("binlog.000001"))  # a closed file's GTIDs: scanned, its index not written
    assert sorted(p.name for p in d.iterdir()) == ["binlog.000001", "binlog.000002"]
    store.close()
