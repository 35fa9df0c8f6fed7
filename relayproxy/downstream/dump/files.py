"""Relay files as a dump reads them: positional reads (large ones in a worker thread), the shared catalog, and
the GTIDs inside closed files (cached)."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import weakref
from collections import OrderedDict
from typing import Any

from ...binlog import constants as C
from ...binlog.events import HEADER
from ...binlog.gtid import GtidSet
from ...binlog.reader import scan_file
from ...relay import fileindex
from ...relay.catalog import FileCatalog

_INLINE_READ = 64 << 10  # reads this small stay on the loop (page cache); larger ones go to a thread
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_header_unpack_from = HEADER.unpack_from
_CRC32 = C.CHECKSUM_CRC32
_GTID_TYPES = frozenset({C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT})
# ---------------------------------------------------------------------------------------------
# Relay files and the catalog
# ---------------------------------------------------------------------------------------------

_catalogs: "weakref.WeakKeyDictionary[Any, FileCatalog]" = weakref.WeakKeyDictionary()
_file_gtids: "OrderedDict[tuple, GtidSet]" = OrderedDict()
_file_gtids_lock = threading.Lock()
_FILE_GTIDS_CACHE = 256


def _catalog(store: Any) -> FileCatalog:
    """One FileCatalog per store, shared by every dump, so file headers are read once."""
    catalog = _catalogs.get(store)
    if catalog is None:
        catalog = FileCatalog(store)
        _catalogs[store] = catalog
    return catalog


def _scan_file_gtids(path: str) -> GtidSet:
    """GTIDs of the complete groups inside a closed relay file (cached by path, size and mtime), from its index
    (relay/fileindex.py) when it has a valid one, else scanned.
    Runs in worker threads: the cache is behind a lock; a scan itself is not."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    with _file_gtids_lock:
        cached = _file_gtids.get(key)
        if cached is not None:
            _file_gtids.move_to_end(key)
            return cached
    directory, name = os.path.split(path)
    index, _why = fileindex.load(directory, name)  # verified against the file; a missing one is the catalog's
    if index is not None:
        gtids = index.events_gtids()
    else:
        result = scan_file(path, verify_checksums=False)
        after = result.gtids_after if isinstance(result.gtids_after, GtidSet) else GtidSet()
        start = result.start_gtids if isinstance(result.start_gtids, GtidSet) else GtidSet()
        gtids = after.subtract(start)
    with _file_gtids_lock:
        _file_gtids[key] = gtids
        while len(_file_gtids) > _FILE_GTIDS_CACHE:
            _file_gtids.popitem(last=False)
    return gtids


class _RelayFile:
    """One relay file open for reading: positional reads, large ones in a worker thread."""

    __slots__ = ("name", "fd")

    def __init__(self, name: str, path: os.PathLike | str):
        self.name = name
        self.fd = os.open(path, os.O_RDONLY)

    async def read(self, pos: int, n: int) -> bytes:
        if n <= _INLINE_READ:
            return os.pread(self.fd, n, pos)
        return await asyncio.get_running_loop().run_in_executor(None, os.pread, self.fd, n, pos)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _gtid_seek(path: os.PathLike | str, replica: GtidSet) -> int:
    """Where a MySQL auto-position dump of the closed relay file ``path`` may start instead of offset 4: the
    furthest boundary of its index's sparse map before which the replica has every GTID (4 without an index)."""
    directory, name = os.path.split(os.fspath(path))
    index, _why = fileindex.load(directory, name)
    return 4 if index is None else index.mysql_seek(replica)
