"""Relay files as a dump reads them: positional reads (large ones in a worker thread), the shared catalog, and
the GTIDs inside closed files (cached)."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path

from ...binlog import constants as C
from ...binlog.events import HEADER
from ...binlog.gtid import GtidSet
from ...log import get_logger
from ...relay import closed_files, fileindex
from ...relay.closed_files import StoredFileError, open_relay_file

log = get_logger("relayproxy.downstream.dump")
_INLINE_READ = 64 << 10  # reads this small stay on the loop (page cache); larger ones go to a thread
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
header_unpack_from = HEADER.unpack_from
CHECKSUM_CRC32 = C.CHECKSUM_CRC32
GTID_TYPES = frozenset({C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT})
# ---------------------------------------------------------------------------------------------
# Relay files and the catalog
# ---------------------------------------------------------------------------------------------

_file_gtids: "OrderedDict[tuple, GtidSet]" = OrderedDict()
_file_gtids_lock = threading.Lock()
_FILE_GTIDS_CACHE = 256


def scan_file_gtids(path: str) -> GtidSet:
    """GTIDs of the complete groups inside a closed relay file (cached by path, size and mtime), from its index
    (relay/fileindex.py) when it has a valid one, else scanned.
    Runs in worker threads: the cache is behind a lock; a scan itself is not."""
    st = closed_files.stored_stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    with _file_gtids_lock:
        cached = _file_gtids.get(key)
        if cached is not None:
            _file_gtids.move_to_end(key)
            return cached
    directory, name = os.path.split(path)
    index, _why = fileindex.load(Path(directory), name)  # verified against the file; a missing one is the catalog's
    if index is not None:
        gtids = index.events_gtids()
    else:
        result = closed_files.scan(path, verify_checksums=False)  # any storage form (compressed, archived...)
        after = result.gtids_after if isinstance(result.gtids_after, GtidSet) else GtidSet()
        start = result.start_gtids if isinstance(result.start_gtids, GtidSet) else GtidSet()
        gtids = after.subtract(start)
    with _file_gtids_lock:
        _file_gtids[key] = gtids
        while len(_file_gtids) > _FILE_GTIDS_CACHE:
            _file_gtids.popitem(last=False)
    return gtids


class RelayFile:
    """One relay file open for reading its logical bytes (plain, compressed, encrypted, archived:
    ``relay/closed_files.py``): positional reads; large ones, and any that decode a frame, in a worker
    thread. A stored file that does not read back whole raises OSError (EIO) naming the file and frame,
    and is logged: its bytes are never sent."""

    __slots__ = ("name", "_file", "is_plain")

    def __init__(self, name: str, path: os.PathLike | str):
        self.name = name
        try:
            self._file = open_relay_file(path)
        except StoredFileError as exc:
            raise _io_error(name, exc) from None
        self.is_plain = self._file.is_plain

    async def read(self, pos: int, n: int) -> bytes:
        f = self._file
        try:
            if n <= _INLINE_READ and f.cheap(pos, n):  # plain (page cache) or frames decoded already
                return f.read(pos, n)
            return await asyncio.get_running_loop().run_in_executor(None, f.read, pos, n)
        except StoredFileError as exc:
            raise _io_error(self.name, exc) from None

    def read_now(self, pos: int, n: int) -> bytes | None:
        """``read`` when it can be done on the loop without blocking (a small read of a plain file or of frames
        decoded already), else None. A stored file that does not read back also gives None: the ordinary path
        (``read``) then reports it."""
        f = self._file
        if n > _INLINE_READ or not f.cheap(pos, n):
            return None
        try:
            return f.read(pos, n)
        except (StoredFileError, OSError):
            return None

    def size(self) -> int:
        return self._file.size()

    def close(self) -> None:
        self._file.close()


def _io_error(name: str, exc: StoredFileError) -> OSError:
    log.error("relay file cannot be read back whole: not served", file=name, frame=exc.frame,
              offset=exc.offset, error=str(exc))
    return OSError(errno.EIO, str(exc))
