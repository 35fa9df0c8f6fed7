"""The relay store: writes the master's events at the master's offsets, makes them durable, moves the horizon.

Relay files carry the master's names and every event sits at the master's byte offset
(``log_pos - event_size``), so a closed relay file is byte-identical to the master's binlog (the
master clears LOG_EVENT_BINLOG_IN_USE_F in the FDE it sends, and the relay stores what it is sent).

Write path (the relay's hot loop), one writer:

    store.start_file("binlog.000042")              # from the master's ROTATE
    store.write_event(offset, event)               # every event, at the master's offset
    store.group_complete(end, gtid)                # the boundary parser saw a group end
    store.boundary_outside(end)                    # an event outside any group ended (FDE, ROTATE, ...)
    ticket = store.begin_sync()                    # after a batch read from the socket, when store.sync_due()
    store.complete_sync(ticket)                    # back on the loop when the fsync (off the loop) ended

Appended bytes collect in memory and reach the file in large ``os.pwrite`` calls (at sync, or once
the buffer passes ``FLUSH_BYTES``, so a 1 GB transaction streams to disk without being held). The sync
pipeline (``relay/sync.py``, mixed in as ``SyncPipeline``) makes them durable: write the buffer,
``fdatasync``, record the durable mark, and only then advance the horizon to the last complete boundary,
the fsync running off the event loop (``begin_sync`` / ``complete_sync``). The horizon never points
inside a group and never past an fsync.

The switch of upstream epochs after a failover, and the fillers over a stretch a GTID dump skipped, are
``relay/epoch_switch.py`` (mixed in as ``EpochSwitch``): ``begin_epoch``, ``write_filler``. This module
keeps the append path, the boundaries, the file lifecycle (``start_file``, ``purge_to``, ``close``)
and what the store reports of its state.

Errors from the file system (full disk, EIO) poison the store: every later call raises
``RelayStoreFailed``; the OSError names the file. Reopen it; recovery cuts the unfinished tail and the
horizon is unchanged. After a failed fsync, ``close()`` first cuts the current file back to the last
successful fsync: the kernel may keep such pages in its cache without their being on disk, and
recovery, which reads through that cache, could not tell.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..binlog import constants as C
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription
from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from .closed_files import remove_all
from .durable import DurableMarkWriter, fsync_dir, write_index
from .epoch_switch import EpochSwitch, join_fde
from .epochs import Epochs, EpochsError
from .errors import (
    RelayEventError,
    RelayGapError,
    RelayMismatchError,
    RelayStateError,
    RelayStoreError,
    RelayStoreFailed,
)
from .fileindex import Indexer
from .fileindex import remove as remove_file_index
from .horizon import Horizon
from .txindex import TransactionIndex, TxIndexer
from .txindex import remove as remove_tx_index
from .layout import check_file_name
from .recovery import RecoveryReport, read_first_fde, recover
from .sync import CHECKPOINT_BYTES, CHECKPOINT_SECONDS, SyncPipeline, SyncPolicy, SyncTicket

__all__ = ["RelayStore"]

FLUSH_BYTES = 4 << 20  # write the buffer out once it holds this much
DIRECT_BYTES = 1 << 20  # an event at least this large skips the buffer

_header_unpack_from = HEADER.unpack_from
_IN_USE = C.LOG_EVENT_BINLOG_IN_USE_F
_ARTIFICIAL = C.LOG_EVENT_ARTIFICIAL_F
_FLAGS_AT = 17  # offset of the flags field in the common header
_FDE_CREATED = C.HEADER_LEN + 2 + 50  # FORMAT_DESCRIPTION create_timestamp (u32)
_FDE_CREATED_END = _FDE_CREATED + 4
_U32 = 0xFFFFFFFF
# Event types write_event looks into: the FDE (checksum length, flavour) and the file's GTID set.
_SPECIAL = [False] * 256
for _t in (C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT, C.MARIA_GTID_LIST_EVENT):
    _SPECIAL[_t] = True
del _t


def _add_gtid(target, gtid):
    """Add a boundary-parser GTID to a set, creating the set of the right flavour when needed."""
    if len(gtid) == 3 and type(gtid[0]) is int:
        if target is None:
            target = MariaBinlogState()
        target.update(MariaGtid(*gtid))
    elif len(gtid) == 3:
        if target is None:
            target = GtidSet()
        sid, tag, gno = gtid
        target.add(sid, gno, tag)
    else:
        if target is None:
            target = GtidSet()
        target.add(gtid[0], gtid[1])
    return target


class RelayStore(SyncPipeline, EpochSwitch):
    """Relay files in master coordinates, their index, and the durable horizon over them (the sync pipeline:
    ``SyncPipeline``, relay/sync.py; the switch of epochs and the fillers: ``EpochSwitch``, relay/epoch_switch.py)."""

    read_only = False  # the relay may write its directory (relayproxy serve's ReadOnlyBinlogDir may not)

    def __init__(self, relay_dir: Path, sync: SyncPolicy, recovered, *, on_fsync=None, _token=None):
        if _token is not _OPEN_TOKEN:
            raise TypeError("use RelayStore.open(relay_dir)")
        self.relay_dir = relay_dir
        self.sync_policy = sync
        self.on_fsync = on_fsync  # called as on_fsync(seconds, bytes) after each fdatasync of relay data
        self.recovery: RecoveryReport = recovered.report
        self._index: list[str] = list(recovered.files)
        self._file: str | None = recovered.current_file
        self._fd = -1
        self._buf = bytearray()
        self._written = recovered.end  # bytes handed to pwrite (in the page cache)
        self._end = recovered.end  # bytes accepted (written + buffered)
        self._synced = recovered.end  # bytes covered by the last fdatasync
        self._boundary = recovered.end  # end of the last complete group / outside event
        self._gtids = recovered.gtids
        self._fde: FormatDescription | None = recovered.fde
        # The newest FORMAT_DESCRIPTION of an earlier file, while the current one has none yet.
        self._prior_fde = None if recovered.fde is not None or len(self._index) < 2 else \
            read_first_fde(relay_dir / self._index[-2])
        self._checksum_len = recovered.fde.checksum_len if recovered.fde else 0
        self._start_set_seen = recovered.start_set_seen
        self._file_start_gtids = recovered.file_start_gtids
        # The set a new file's PREVIOUS_GTIDS / GTID_LIST must continue (a newest file cut before its
        # set event continues the previous file's set, as recovery rebuilt it).
        self._carried_gtids = None if recovered.start_set_seen or recovered.gtids is None else recovered.gtids.copy()
        scan = getattr(recovered.report, "scan", None)
        self._last_type = scan.good_end_type if scan is not None and scan.good_end == recovered.end else None
        self._flavour = recovered.flavour
        self._epochs: Epochs = recovered.epochs
        self.warnings: list[str] = list(recovered.join_warnings)  # things recorded, not refused (see begin_epoch)
        self.join_extra_gtids = recovered.join_extra_gtids  # GTIDs a join file's start set names beyond the relay's
        self.fillers = 0  # filler events written by this store
        self._pending_groups = 0
        self._pending_since: float | None = None
        self._ticket: SyncTicket | None = None
        self._failed: BaseException | None = None
        self._unsynced_cut: tuple[str, int] | None = None  # (file, length) to cut to after a failed fsync
        self._closed = False
        self._appendable = False  # fast-path guard: a current file, not failed, not closed
        self.fsyncs = 0
        self.bytes_written = 0
        snap = recovered.report.horizon
        self.horizon = Horizon(snap.file, snap.position, snap.gtids)
        # The last recovery checkpoint: (file, offset) and when (relay/checkpoint.py).
        offset = recovered.report.checkpoint_offset
        self._checkpoint_at = (self._file, offset) if offset is not None else (None, 0)
        self._checkpoint_time = time.monotonic()
        self._checkpoint_force = False
        self.checkpoint_bytes = CHECKPOINT_BYTES
        self.checkpoint_seconds = CHECKPOINT_SECONDS
        self.checkpoints = 0  # checkpoints written by this store
        self.sidecars_writable = True  # file indexes (relay/fileindex.py) may be written here
        self._indexer = Indexer(relay_dir)
        # Transaction indexes (relay/txindex.py): a background thread follows the horizon; the loop never waits.
        self._txindexer = TxIndexer(relay_dir, self.files, self._horizon_coordinates)
        self.transaction_index = TransactionIndex.for_store(self, writable=True)
        self._marks = DurableMarkWriter(relay_dir)
        try:
            if self._file is not None:
                self._fd = os.open(relay_dir / self._file, os.O_RDWR)
                self._marks.write(self._file, self._end)  # recovery fsynced the file up to here
                self._marks.fsync()
                self._appendable = True
            self._txindexer.start()
        except BaseException:
            self._txindexer.close()
            self._marks.close()
            if self._fd >= 0:
                os.close(self._fd)
            raise

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(
        cls, relay_dir: str | os.PathLike, *, sync: SyncPolicy = SyncPolicy(), create: bool = True, on_fsync=None
    ) -> "RelayStore":
        """Open (or create) a relay directory: runs recovery (``store.recovery`` says what it did).

        ``on_fsync(seconds, bytes)``, when given, hears of each completed fdatasync (e.g. a metrics histogram).
        """
        relay_dir = Path(relay_dir)
        recovered = recover(relay_dir, create=create)
        return cls(relay_dir, sync, recovered, on_fsync=on_fsync, _token=_OPEN_TOKEN)

    def __enter__(self) -> "RelayStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading the state -----------------------------------------------------------------------
    def _horizon_coordinates(self) -> tuple[str | None, int]:
        snap = self.horizon.snapshot()
        return snap.file, snap.position

    def files(self) -> list[str]:
        """Relay file names, oldest first (index order)."""
        return list(self._index)

    def path(self, name: str) -> Path:
        if name not in self._index:
            raise KeyError(f"{name!r} is not a relay file here")
        return self.relay_dir / name

    @property
    def current_file(self) -> str | None:
        return self._file

    @property
    def current_end(self) -> int:
        """Bytes of the current file accepted so far, synced or not."""
        return self._end

    @property
    def boundary_end(self) -> int:
        """End of the last complete group or outside event in the current file (synced or not)."""
        return self._boundary

    @property
    def synced_end(self) -> int:
        return self._synced

    @property
    def flavour(self) -> str | None:
        """"mysql" or "mariadb", from the first FORMAT_DESCRIPTION; None before any."""
        return self._flavour

    @property
    def format_description(self) -> FormatDescription | None:
        """The current file's FORMAT_DESCRIPTION, once written."""
        return self._fde

    @property
    def latest_format_description(self) -> FormatDescription | None:
        """The newest FORMAT_DESCRIPTION the relay has: the current file's, or while the current file holds none
        yet (just rotated; an epoch's first file waiting for its new master's), the previous file's."""
        return self._fde or self._prior_fde

    @property
    def current_file_closed(self) -> bool:
        """The current file ends with the master's ROTATE or STOP (the master has moved past it), or
        a new epoch has begun (the relay has moved past it: its last event is or will be the ROTATE
        to the epoch's first file)."""
        return self._last_type in (C.ROTATE_EVENT, C.STOP_EVENT) or self.epoch_switch_pending

    def file_digest(self, name: str) -> str | None:
        """SHA-256 of a closed relay file's logical bytes, from its index (``relay/fileindex.py``); None for the
        current file (it grows: ``fileindex.sha256_of(path, horizon position)`` hashes it on demand) and while a
        closed file's index is being built."""
        if name == self._file or self._closed:
            return None
        return self._indexer.digest(name)

    # -- epochs ----------------------------------------------------------------------------------
    @property
    def epochs(self) -> Epochs:
        """The upstream epochs (immutable value; ``relay/epochs.py``)."""
        return self._epochs

    @property
    def current_upstream_file(self) -> str | None:
        """The master's name of the current relay file (its epoch's master)."""
        if self._file is None:
            return None
        return self._epochs.upstream_name(self._file)[1]

    def upstream_position(self) -> tuple[str | None, int]:
        """``(the master's file name, offset)`` of the durable horizon: status, resume by position."""
        snap = self.horizon.snapshot()
        if snap.file is None:
            return None, snap.position
        return self._epochs.upstream_name(snap.file)[1], snap.position

    def relay_name(self, upstream_name: str) -> str:
        """The relay file ``start_file(upstream_name)`` would write: the master's file mapped through the
        current epoch (an epoch that holds no file yet begins at its first relay file, whatever the
        master's first file turns out to be). Raises ValueError (EpochsError) for a name the current
        epoch cannot hold (another series, or before the epoch's first upstream file)."""
        cur = self._epochs.current
        if self._epoch_unused():
            return cur.first_file if cur.epoch >= 2 else upstream_name
        return self._epochs.relay_name(upstream_name)

    @property
    def pending_gtids(self):
        """The GTID set at ``boundary_end`` (not yet durable); a copy."""
        return None if self._gtids is None else self._gtids.copy()

    # -- guards ----------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._failed is not None:
            raise RelayStoreFailed(f"relay store failed earlier and must be reopened: {self._failed}") from self._failed
        if self._closed:
            raise RelayStateError("relay store is closed")

    @property
    def failure(self) -> BaseException | None:
        """The file-system error that poisoned the store (it names the file), or None."""
        return self._failed

    def _fail(self, exc: BaseException, path: Path | None = None) -> None:
        # pwrite / fdatasync on a descriptor raise an OSError without a file name: name the file, so
        # "No space left on device" says where (status, logs).
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            where = path if path is not None else (self.relay_dir / self._file if self._file else self.relay_dir)
            exc.filename = os.fspath(where)
        self._failed = exc
        self._appendable = False

    # -- files -----------------------------------------------------------------------------------
    def start_file(self, name: str) -> None:
        """Start the next relay file (the master rotated to ``name``, the master's file name).

        ``name`` is mapped through the current upstream epoch (``relay_name``; identical in epoch 1).
        The previous file is synced first (it must end at a boundary: call ``discard_incomplete``
        after a cut stream), then the new file is created with the magic and fsynced, the index is
        rewritten, the directory fsynced, and the horizon moves to ``(relay name, 4)``: all before
        this returns. Starting the current file again is a no-op while it holds only the magic; an
        existing file with events, or a name already in the index, raises RelayStateError, as does a
        name the current epoch cannot map. The first file of a new epoch: a ROTATE to it that a crash
        cut from the previous file is appended first, and when the master began the epoch at another
        file than ``begin_epoch`` was told, the epoch's record follows (relay names do not change).
        """
        self._check()
        try:
            check_file_name(name)
        except ValueError as exc:
            raise RelayStateError(str(exc)) from None
        self._settle()  # the old file's descriptor is closed below: no fsync may still run on it
        upstream = name
        try:
            name = self.relay_name(upstream)
        except EpochsError as exc:
            raise RelayStateError(f"cannot start {upstream!r}: {exc}") from None
        if self._epoch_unused() and self._epochs.current.upstream_first_file != upstream:
            # The master began the epoch at another file than announced (a GTID dump picks its own):
            # nothing of the epoch is stored, so its record may follow. Relay names do not change.
            self._reanchor_epoch(upstream)
        if name == self._file:
            if self._end == 4:
                return
            raise RelayStateError(f"{name} is already the current relay file and holds {self._end} bytes")
        if name in self._index:
            raise RelayStateError(f"{name} is already a relay file (an older one): the master's names went backwards")
        if self._file is not None and self._end != self._boundary:
            raise RelayStateError(
                f"start_file({name!r}) while a group is open in {self._file} "
                f"({self._end - self._boundary} bytes after offset {self._boundary}): call discard_incomplete() first"
            )
        if self.epoch_switch_pending:
            self._complete_epoch_switch()  # a crash may have cut the switch before its ROTATE
        path = self.relay_dir / name
        try:
            if self._file is not None:
                self._sync()
            fd = self._create_file(path)
        except RelayStoreError:
            raise
        except OSError as exc:
            self._fail(exc, path)  # a sync error already named the old file; this names the new one
            raise
        old_fd = self._fd
        try:
            write_index(self.relay_dir, [*self._index, name])
            self._marks.write(name, 4)
        except OSError as exc:
            os.close(fd)
            self._fail(exc, self.relay_dir)
            raise
        if old_fd >= 0:
            os.close(old_fd)
        if self._file is not None:
            self._indexer.closed(self._file)  # closed: its index is built in the background
        self._index.append(name)
        self._fd = fd
        self._file = name
        self._appendable = True
        self._buf = bytearray()
        self._written = self._end = self._synced = self._boundary = 4
        self._prior_fde = self._fde or self._prior_fde
        self._fde = None
        self._checksum_len = 0
        self._start_set_seen = False
        self._file_start_gtids = None
        self._carried_gtids = None if self._gtids is None else self._gtids.copy()
        self._last_type = None
        self._pending_groups = 0
        self._pending_since = None
        self.horizon.advance(name, 4, self._gtids)

    def _create_file(self, path: Path) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            fd = os.open(path, os.O_RDWR)
            try:
                head = os.pread(fd, 5, 0)
                if not C.BINLOG_MAGIC.startswith(head):
                    raise RelayStateError(
                        f"{path} already exists with other content ({os.fstat(fd).st_size} bytes): "
                        "refusing to overwrite it"
                    )
                # Left by a start_file that crashed before the index write: it holds nothing, reuse it.
            except BaseException:
                os.close(fd)
                raise
        try:
            os.pwrite(fd, C.BINLOG_MAGIC, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def purge_to(self, name: str) -> list[str]:
        """Delete the relay files before ``name`` (``PURGE BINARY LOGS TO``): index first, then files.

        Then the epochs whose files are all gone are dropped from ``relayproxy.epochs`` (never the
        current one; a crash before that leaves extra records, which are harmless)."""
        self._check()
        if name not in self._index:
            raise KeyError(f"{name!r} is not a relay file here")
        keep_from = self._index.index(name)
        purged = self._index[:keep_from]
        if not purged:
            return []
        write_index(self.relay_dir, self._index[keep_from:])
        self._index = self._index[keep_from:]
        for old in purged:
            removed = remove_all(self.relay_dir / old)  # plain, converted, archived
            for parent in {p.parent for p in removed if p.parent != self.relay_dir}:
                fsync_dir(parent)
            remove_file_index(self.relay_dir, old)  # its index goes with it (a crash between: removed at open)
            remove_tx_index(self.relay_dir, old)
            self._indexer.forget(old)
        fsync_dir(self.relay_dir)
        pruned = self._epochs.pruned(self._index[0])
        if pruned != self._epochs:
            self._record_epochs(pruned)
        return purged

    # -- writing ---------------------------------------------------------------------------------
    def write_event(self, offset: int, event) -> str:
        """Store one event at its master offset.

        Returns "appended" (``offset == current_end``) or "duplicate" (``offset < current_end`` and
        the stored bytes are the same: a re-send after a reconnect, verified, not written again).
        Raises RelayGapError beyond the end, RelayMismatchError when a re-sent event differs,
        RelayEventError when the header's size is not ``len(event)``, its log_pos is neither
        ``offset + len(event)`` nor 0 (MariaDB 11.4+ writes 0 inside groups unless
        ``binlog_legacy_event_pos``), it is artificial (a fake ROTATE), or it is an FDE not at 4.
        The PREVIOUS_GTIDS / GTID_LIST event of a file is decoded here: it sets the GTID set
        (``set_start_gtids`` only cross-checks what the session decoded).
        """
        end = self._end
        if offset == end and self._appendable:
            n = len(event)
            if n < C.HEADER_LEN:
                raise RelayEventError(f"{n} bytes at offset {offset} are shorter than an event header")
            header = _header_unpack_from(event, 0)
            log_pos = header[4]
            if header[3] != n or (log_pos != (end + n) & _U32 and (log_pos or header[5] & _ARTIFICIAL)):
                self._bad_header(offset, n, header)
            if _SPECIAL[header[1]] or end == 4:
                event = self._special_event(header[1], event, offset)
                n = len(event)
            self._last_type = header[1]
            try:
                if n >= DIRECT_BYTES:
                    if self._buf:
                        self._flush()
                    self._write_all(event)
                else:
                    buf = self._buf
                    buf += event
                    if len(buf) >= FLUSH_BYTES:
                        self._flush()
            except OSError as exc:
                self._fail(exc)
                raise
            self._end = end + n
            return "appended"
        self._check()
        if self._fd < 0:
            raise RelayStateError("write_event before start_file: there is no current relay file")
        if offset > end:
            raise RelayGapError(offset, end, self._file)
        if offset < 4:
            raise RelayEventError(f"event at offset {offset}: events start at offset 4, after the magic")
        return self._verify_duplicate(offset, event)

    def append_event(self, offset: int, event, log_pos: int, type_code: int) -> str:
        """``write_event`` for a caller that has already unpacked and checked the event's header.

        The caller guarantees what write_event would otherwise check from the header: its size field
        is ``len(event)``, ``log_pos`` and ``type_code`` are the header's, and the event is not
        artificial. Only a plain append (at the current end of an open, healthy store, ``log_pos ==
        offset + len(event)``, not an event the store must look into, not the file's first event) is
        done here; anything else (duplicate, gap, special event, file past 4 GB, failed or closed
        store) goes through write_event and gets all of its checks.
        """
        end = self._end
        n = len(event)
        if offset != end or log_pos != end + n or not self._appendable or _SPECIAL[type_code] or end == 4:
            return self.write_event(offset, event)
        # The append below repeats write_event's on purpose: folding both into one helper method costs a
        # call per event, ~7% of the receiver's per-event time on OLTP streams (1.16 -> 1.25 us, measured).
        self._last_type = type_code
        try:
            if n >= DIRECT_BYTES:
                if self._buf:
                    self._flush()
                self._write_all(event)
            else:
                buf = self._buf
                buf += event
                if len(buf) >= FLUSH_BYTES:
                    self._flush()
        except OSError as exc:
            self._fail(exc)
            raise
        self._end = end + n
        return "appended"

    def _bad_header(self, offset: int, n: int, header) -> None:
        _ts, type_code, _sid, size, log_pos, flags = header
        name = C.event_name(type_code)
        if size != n:
            raise RelayEventError(f"{name} event at offset {offset}: header says {size} bytes, got {n}")
        if flags & _ARTIFICIAL:
            raise RelayEventError(
                f"{name} event at offset {offset} is artificial (LOG_EVENT_ARTIFICIAL_F): it is not part of "
                "the master's binlog and must not be stored"
            )
        raise RelayEventError(
            f"{name} event at offset {offset} of {n} bytes has log_pos {log_pos}, expected "
            f"{(offset + n) & _U32}: it does not sit at its master offset"
        )

    def _special_event(self, type_code: int, event, offset: int):
        """Check an event the store looks into and take what it says; returns the bytes to store (the event,
        or for the FORMAT_DESCRIPTION of an epoch's join file its deterministic form: ``join_fde``)."""
        if offset == 4 and type_code != C.FORMAT_DESCRIPTION_EVENT:
            raise RelayEventError(
                f"{C.event_name(type_code)} event at offset 4: a binlog file starts with its FORMAT_DESCRIPTION_EVENT"
            )
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            if offset != 4:
                # A binlog has one FDE, at offset 4. The one a master sends when a dump starts
                # mid-file (log_pos 0, created 0) describes the stream and is not stored.
                raise RelayEventError(
                    f"FORMAT_DESCRIPTION_EVENT at offset {offset}: a binlog's only FDE sits at offset 4 "
                    "(the FDE sent at a mid-file dump start is not part of the file)"
                )
            try:
                fde = FormatDescription.parse(event, 0, len(event))
                if self._epochs.join_epoch(self._file) is not None:
                    event = join_fde(event)
                    fde = FormatDescription.parse(event, 0, len(event))
            except (BinlogFormatError, ValueError) as exc:
                raise RelayEventError(f"FORMAT_DESCRIPTION_EVENT at offset {offset}: {exc}") from None
            self._fde = fde
            self._checksum_len = fde.checksum_len
            if self._flavour is None:
                self._flavour = fde.flavour
            return event
        if self._start_set_seen:
            return event  # as the scanner: only the first set event of a file defines its start set
        length = len(event) - C.HEADER_LEN - self._checksum_len
        try:
            if type_code == C.PREVIOUS_GTIDS_LOG_EVENT:
                gtids = GtidSet.decode(event, C.HEADER_LEN, length)
            else:
                gtids, _flags = MariaBinlogState.decode_gtid_list_body(event, C.HEADER_LEN, length)
        except (BinlogFormatError, ValueError) as exc:
            raise RelayEventError(f"{C.event_name(type_code)} event at offset {offset}: {exc}") from None
        join_epoch = self._epochs.join_epoch(self._file)
        if join_epoch is not None:
            self._join_start_set(gtids, join_epoch, offset, len(event), type_code)
            return event
        carried = self._carried_gtids
        # A MySQL PREVIOUS_GTIDS may name more than the relay holds: GTIDs the master counts as executed
        # but no file holds (SET GLOBAL gtid_purged after a restore, MySQL's 5.6.22 case). Adopting it
        # moves nothing backwards, and FileCatalog.purged() counts those GTIDs, so replicas lacking them
        # get error 1236 instead of a silent stream.
        restored_gap = isinstance(gtids, GtidSet) and isinstance(carried, GtidSet) and carried.is_subset(gtids)
        if carried is not None and gtids != carried and not restored_gap:
            # The new file does not continue what the relay holds (another master's history: its set
            # lacks GTIDs the relay has): adopting it would move the GTID set backwards and store
            # transactions twice. Refuse; the session reports it and nothing is written.
            raise RelayMismatchError(
                offset, len(event), self._file,
                f"its {C.event_name(type_code)} set {gtids} does not continue the relay's set {carried} "
                "(a different master history?)",
            )
        self._gtids = gtids
        self._file_start_gtids = gtids.copy()
        self._start_set_seen = True
        return event

    def _verify_duplicate(self, offset: int, event) -> str:
        n = len(event)
        end = self._end
        if offset + n > end:
            raise RelayMismatchError(
                offset, n, self._file, f"it runs past the end of the stored data at {end}: event boundaries differ"
            )
        stored = self._read_stored(offset, n)
        if stored == event:
            return "duplicate"
        if offset == 4 and n > _FDE_CREATED_END and stored[4] == C.FORMAT_DESCRIPTION_EVENT:
            if self._same_format_description(stored, event):
                return "duplicate"
        first = next(i for i in range(n) if stored[i] != event[i])
        detail = f"first difference at byte {first} (file offset {offset + first})"
        raise RelayMismatchError(offset, n, self._file, detail)

    def _same_format_description(self, stored: bytes, event) -> bool:
        """A re-sent FDE may differ from the file's in what a master changes when it sends one:
        the in-use flag (cleared), create_timestamp (zeroed when the dump does not start at the
        file's first event, e.g. a GTID dump; a join file stores it zeroed, ``join_fde``) and so
        the CRC (recomputed, and checked here)."""
        try:
            FormatDescription.parse(event, 0, len(event))
        except (BinlogFormatError, ValueError) as exc:
            raise RelayEventError(f"re-sent FORMAT_DESCRIPTION_EVENT of {self._file}: {exc}") from None
        crc_len = C.CHECKSUM_LEN if self._fde is not None and self._fde.checksum_alg != C.CHECKSUM_UNDEF else 0
        tail = len(stored) - crc_len
        created = bytes(event[_FDE_CREATED:_FDE_CREATED_END])
        return (
            stored[:_FLAGS_AT] == event[:_FLAGS_AT]
            and (stored[_FLAGS_AT] | _IN_USE) == (event[_FLAGS_AT] | _IN_USE)
            and stored[_FLAGS_AT + 1 : _FDE_CREATED] == event[_FLAGS_AT + 1 : _FDE_CREATED]
            and (created == stored[_FDE_CREATED:_FDE_CREATED_END] or b"\0\0\0\0" in (
                created, stored[_FDE_CREATED:_FDE_CREATED_END]))
            and stored[_FDE_CREATED_END:tail] == event[_FDE_CREATED_END:tail]
        )

    def _read_stored(self, offset: int, n: int) -> bytes:
        parts = []
        if offset < self._written:
            take = min(n, self._written - offset)
            try:
                data = os.pread(self._fd, take, offset)
            except OSError as exc:
                self._fail(exc)
                raise
            if len(data) != take:
                exc = RelayStoreError(
                    f"{self._file} is shorter than the relay wrote: {offset + len(data)} < {offset + take}"
                )
                self._fail(exc)
                raise exc
            parts.append(data)
        if offset + n > self._written:
            start = max(offset, self._written) - self._written
            parts.append(bytes(self._buf[start : offset + n - self._written]))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _write_all(self, data) -> None:
        """pwrite ``data`` at ``_written`` (explicit offsets: ftruncate in discard_incomplete never
        leaves the file offset behind) and count it as written."""
        view = memoryview(data)
        fd = self._fd
        at = self._written
        try:
            while view:
                written = os.pwrite(fd, view, at)
                if written <= 0:
                    raise OSError(f"pwrite wrote {written} bytes to {self._file}")
                view = view[written:]
                at += written
        finally:
            view.release()
            self.bytes_written += at - self._written
            self._written = at

    def _flush(self) -> None:
        buf = self._buf
        if buf:
            self._write_all(buf)
            self._buf = bytearray()

    # -- boundaries ------------------------------------------------------------------------------
    def group_complete(self, end_offset: int, gtid=None) -> None:
        """A group ended at ``end_offset`` of the current file; its GTID joins the set at the next sync.

        ``gtid`` is in the boundary parser's form: ``(sid16, gno)``, ``(sid16, tag, gno)``,
        ``(domain, server_id, seq)`` or None (anonymous / no GTID). A group that ends at or before
        the last boundary was re-sent after a reconnect and is ignored.
        """
        if end_offset <= self._boundary:
            return
        if end_offset > self._end:
            raise RelayStateError(
                f"group_complete at {end_offset}, beyond the stored data of {self._file} ({self._end} bytes)"
            )
        if gtid is not None:
            try:
                self._gtids = _add_gtid(self._gtids, gtid)
            except (ValueError, TypeError) as exc:
                raise RelayEventError(
                    f"group ending at {self._file}:{end_offset} has an unusable GTID {gtid!r}: {exc}"
                ) from None
        self._boundary = end_offset
        self._pending_groups += 1
        if self._pending_since is None:
            self._pending_since = time.monotonic()

    def boundary_outside(self, end_offset: int) -> None:
        """An event outside any group (FDE, PREVIOUS_GTIDS, ROTATE, ...) ended at ``end_offset``."""
        if end_offset <= self._boundary:
            return
        if end_offset > self._end:
            raise RelayStateError(
                f"boundary_outside at {end_offset}, beyond the stored data of {self._file} ({self._end} bytes)"
            )
        self._boundary = end_offset
        if self._pending_since is None:
            self._pending_since = time.monotonic()

    def set_start_gtids(self, gtids) -> None:
        """Cross-check the GTID set the session decoded from the current file's PREVIOUS_GTIDS /
        GTID_LIST. The store decodes that event itself when it is written (so recovery, which reads
        the files, always agrees with it); a different set raises RelayMismatchError."""
        self._check()
        if not self._start_set_seen:
            raise RelayStateError(f"{self._file} has no PREVIOUS_GTIDS / GTID_LIST event yet: write it first")
        if gtids != self._file_start_gtids:
            raise RelayMismatchError(
                0, 0, self._file, f"start GTID set {gtids} differs from the file's {self._file_start_gtids}"
            )

    # -- a cut stream, closing ---------------------------------------------------------------------
    def discard_incomplete(self) -> int:
        """After an upstream disconnect: cut the current file back to the last boundary.

        The partial group is thrown away (the master re-sends it whole); returns the bytes dropped.
        The caller also resets its boundary parser.
        """
        self._check()
        self._settle()  # no truncation under an fsync in flight (and a stop publishes what it made durable)
        drop = self._end - self._boundary
        if drop <= 0:
            return 0
        buffered = len(self._buf)
        if drop <= buffered:
            del self._buf[buffered - drop :]
        else:
            self._buf = bytearray()
            try:
                os.ftruncate(self._fd, self._boundary)
            except OSError as exc:
                self._fail(exc)
                raise
            self._written = self._boundary
            # The next sync's fdatasync makes the shorter size durable; until then recovery would
            # cut the same bytes anyway (they end inside a group).
            self._synced = min(self._synced, self._boundary)
        self._end = self._boundary
        return drop

    def close(self) -> None:
        """Sync what is complete and close the files (idempotent).

        After a failed fsync it also cuts the current file back to the last successful fsync; if
        that fails, close raises (and retries when called again): do not reopen the directory then.
        """
        if self._closed:
            if self._unsynced_cut is not None:
                self._cut_unsynced_tail()
            return
        ticket = self._ticket
        if ticket is not None:
            ticket.wait()  # the descriptor is closed below: let the fsync in flight end first
            if self._ticket is ticket and ticket.error is None:
                self.complete_sync(ticket)
        try:
            if self._failed is None and self._fd >= 0:
                self._checkpoint_force = True  # a clean stop leaves a checkpoint at the horizon
                self._sync()
                self._marks.fsync()
        finally:
            self._indexer.close()
            self._txindexer.close()
            self._closed = True
            self._appendable = False
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._marks.close()
            if self._unsynced_cut is not None:
                self._cut_unsynced_tail()

    def _cut_unsynced_tail(self) -> None:
        name, keep = self._unsynced_cut
        fd = os.open(self.relay_dir / name, os.O_RDWR)
        try:
            if os.fstat(fd).st_size > keep:
                os.ftruncate(fd, keep)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced_cut = None

    def __repr__(self) -> str:
        return f"<RelayStore {self.relay_dir} {self._file}:{self._end} horizon={self.horizon.snapshot().coordinates}>"


_OPEN_TOKEN = object()
