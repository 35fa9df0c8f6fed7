"""PURGE BINARY LOGS never deletes a relay file the archive's bucket has not sealed (relay/archive.py)."""

from __future__ import annotations

import types

from relayproxy.relay.archive import ArchiveUploader
from relayproxy.relay.objectstore import FileObjectStore

from .test_downstream_sql import three_files  # noqa: F401 - the fixture


def test_purge_keeps_the_files_not_sealed_in_the_archive(three_files, tmp_path):  # noqa: F811
    r = three_files
    archive = ArchiveUploader(r.dir, FileObjectStore(tmp_path / "bucket"), r.store.files, r.store.horizon.snapshot,
                              flavour=lambda: r.store.flavour)
    r.ctx.replication = types.SimpleNamespace(archive=archive)
    err = r.error("PURGE BINARY LOGS TO 'binlog.000003'", 1378)
    assert "binlog.000001 is not yet sealed in the archive" in err.message and "nothing was purged" in err.message
    assert r.store.files() == ["binlog.000001", "binlog.000002", "binlog.000003"]
    archive.run_once()  # the two closed files are sealed now
    r.ok("PURGE BINARY LOGS TO 'binlog.000003'")
    assert r.store.files() == ["binlog.000003"]
