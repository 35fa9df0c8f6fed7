"""The relay store's write state (``WriteState``): the current file, its descriptor, buffer and offsets, its format
and GTID state, the groups not yet synced, and whether the store may still write.

One object, held by ``RelayStore`` (relay/store.py) and shared with the two objects the store holds: its sync
pipeline (``SyncPipeline``, relay/sync.py) and its epoch switch (``EpochSwitch``, relay/epoch_switch.py). They read
and move these fields; nothing else keeps a copy of them. The store's append path reads them once per event, so
this is a plain slotted record, not a class with properties.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from ..binlog.events import FormatDescription
from ..binlog.gtid import GtidSet, MariaBinlogState
from .errors import RelayStateError, RelayStoreFailed

__all__ = ["WriteState", "Gtids"]

Gtids = Union[GtidSet, MariaBinlogState]  # MySQL's GTID set or MariaDB's binlog state


@dataclass(eq=False, slots=True)
class WriteState:
    """What the store is writing: the current relay file and where its bytes stand (see the module doc)."""

    relay_dir: Path
    file: str | None = None  # the current relay file, None before any
    fd: int = -1  # its descriptor, -1 when none is open
    buf: bytearray = field(default_factory=bytearray)  # accepted bytes not yet handed to pwrite
    written: int = 0  # bytes handed to pwrite (in the page cache)
    end: int = 0  # bytes accepted (written + buffered)
    synced: int = 0  # bytes covered by the last fdatasync
    boundary: int = 0  # end of the last complete group / outside event
    gtids: Gtids | None = None  # the GTID set at ``boundary``
    fde: FormatDescription | None = None  # the current file's FORMAT_DESCRIPTION, once written
    prior_fde: FormatDescription | None = None  # the newest one of an earlier file, while the current has none
    checksum_len: int = 0  # from the FDE: 4 with CRC32, else 0
    last_type: int | None = None  # the type of the last event appended (None: not known)
    start_set_seen: bool = False  # the file's PREVIOUS_GTIDS / GTID_LIST has been written
    file_start_gtids: Gtids | None = None  # the set that event carries (None before it)
    carried_gtids: Gtids | None = None  # the set a new file's set event must continue (None: no such check)
    pending_groups: int = 0  # groups completed since the last sync began
    pending_since: float | None = None  # time.monotonic() of the first boundary not yet synced
    bytes_written: int = 0  # bytes this store has written to relay files
    failed: BaseException | None = None  # the file-system error that poisoned the store
    closed: bool = False
    appendable: bool = False  # fast-path guard: a current file, not failed, not closed

    def check(self) -> None:
        """Raise unless the store may still be used (not failed, not closed)."""
        if self.failed is not None:
            raise RelayStoreFailed(f"relay store failed earlier and must be reopened: {self.failed}") from self.failed
        if self.closed:
            raise RelayStateError("relay store is closed")

    def fail(self, exc: BaseException, path: Path | None = None) -> None:
        """Poison the store with ``exc``. May run in a worker thread (a failed fsync): only plain stores."""
        # pwrite / fdatasync on a descriptor raise an OSError without a file name: name the file, so
        # "No space left on device" says where (status, logs).
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            where = path if path is not None else (self.relay_dir / self.file if self.file else self.relay_dir)
            exc.filename = os.fspath(where)
        self.failed = exc
        self.appendable = False

    def write_all(self, data: bytes | bytearray | memoryview) -> None:
        """pwrite ``data`` at ``written`` (explicit offsets: a truncation never leaves the file offset behind)
        and count it as written. An OSError is the caller's to report (``fail``)."""
        view = memoryview(data)
        fd = self.fd
        at = self.written
        try:
            while view:
                n = os.pwrite(fd, view, at)
                if n <= 0:
                    raise OSError(f"pwrite wrote {n} bytes to {self.file}")
                view = view[n:]
                at += n
        finally:
            view.release()
            self.bytes_written += at - self.written
            self.written = at

    def flush(self) -> None:
        """Hand the buffer to pwrite (``write_all``)."""
        buf = self.buf
        if buf:
            self.write_all(buf)
            self.buf = bytearray()
