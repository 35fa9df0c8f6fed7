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
pipeline (``relay/sync.py``, the ``SyncPipeline`` the store holds) makes them durable: write the buffer,
``fdatasync``, record the durable mark, and only then advance the horizon to the last complete boundary,
the fsync running off the event loop (``begin_sync`` / ``complete_sync``). The horizon never points
inside a group and never past an fsync.

The switch of upstream epochs after a failover, and the fillers over a stretch a GTID dump skipped, are
``relay/epoch_switch.py`` (the ``EpochSwitch`` the store holds): ``begin_epoch``, ``write_filler``. Both
share the store's write state (``relay/write_state.py``: the current file, its offsets and GTID state); the
store delegates its public methods to them. This module keeps the append path, the boundaries, the file
lifecycle (``start_file``, ``purge_to``, ``close``) and what the store reports of its state.

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
from typing import Callable

from ..binlog import constants as C
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription
from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from .closed_files import remove_all
from .durable import DurableMarkWriter, fsync_dir, write_index
from .epoch_switch import EpochSwitch, join_fde
from .epochs import Epoch, Epochs, EpochsError
from .errors import (
    RelayEventError,
    RelayGapError,
    RelayMismatchError,
    RelayStateError,
    RelayStoreError,
)
from .fileindex import Indexer
from .fileindex import remove as remove_file_index
from .horizon import Horizon
from .txindex import TransactionIndex, TxIndexer
from .txindex_child import TxIndexProcess
from .txindex import remove as remove_tx_index
from .layout import check_file_name
from .recovery import RecoveredState, RecoveryReport, read_first_fde, recover
from .sync import SyncPipeline, SyncPolicy, SyncTicket
from .write_state import Gtids, WriteState

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


def _write_state(relay_dir: Path, recovered: RecoveredState, index: list[str]) -> WriteState:
    """The write state of the newest file as recovery left it (its descriptor not yet open)."""
    end = recovered.end
    fde = recovered.fde
    scan = recovered.report.scan
    return WriteState(
        relay_dir, recovered.current_file, written=end, end=end, synced=end, boundary=end, gtids=recovered.gtids,
        fde=fde,
        # The newest FORMAT_DESCRIPTION of an earlier file, while the current one has none yet.
        prior_fde=None if fde is not None or len(index) < 2 else read_first_fde(relay_dir / index[-2]),
        checksum_len=fde.checksum_len if fde else 0,
        last_type=scan.good_end_type if scan is not None and scan.good_end == end else None,
        start_set_seen=recovered.start_set_seen, file_start_gtids=recovered.file_start_gtids,
        # The set a new file's PREVIOUS_GTIDS / GTID_LIST must continue (a newest file cut before its
        # set event continues the previous file's set, as recovery rebuilt it).
        carried_gtids=None if recovered.start_set_seen or recovered.gtids is None else recovered.gtids.copy(),
    )


class RelayStore:
    """Relay files in master coordinates, their index, and the durable horizon over them. It holds its write state
    (``WriteState``, relay/write_state.py), its sync pipeline (``SyncPipeline``, relay/sync.py) and its switch of
    epochs and fillers (``EpochSwitch``, relay/epoch_switch.py), which share that state."""

    read_only = False  # the relay may write its directory (relayproxy serve's ReadOnlyBinlogDir may not)

    def __init__(self, relay_dir: Path, sync: SyncPolicy, recovered: RecoveredState, *,
                 on_fsync: Callable[[float, int], None] | None = None, txindex_in_child: bool = False,
                 _token: object = None):
        if _token is not _OPEN_TOKEN:
            raise TypeError("use RelayStore.open(relay_dir)")
        self.relay_dir = relay_dir
        self.recovery: RecoveryReport = recovered.report
        self._index: list[str] = list(recovered.files)
        self._w = w = _write_state(relay_dir, recovered, self._index)
        self._flavour = recovered.flavour
        snap = recovered.report.horizon
        self.horizon = Horizon(snap.file, snap.position, snap.gtids) if snap is not None else Horizon()
        self._marks = DurableMarkWriter(relay_dir)
        self._pipeline = SyncPipeline(w, self.horizon, self._marks, sync, epochs=self._current_epochs,
                                      on_fsync=on_fsync, checkpoint_offset=recovered.report.checkpoint_offset)
        self._switch = EpochSwitch(
            w, self._pipeline, self.horizon, self._index, recovered.epochs, write_event=self.write_event,
            boundary_outside=self.boundary_outside, warnings=list(recovered.join_warnings),
            join_extra_gtids=recovered.join_extra_gtids,
        )
        self.sidecars_writable = True  # file indexes (relay/fileindex.py) may be written here
        self._indexer = Indexer(relay_dir)
        # Transaction indexes (relay/txindex.py): a background thread follows the horizon; the loop never waits.
        # In a child process with ``txindex_in_child`` (relay/txindex_child.py): its parsing takes no GIL of ours.
        self.txindex_in_child = txindex_in_child
        indexer = TxIndexProcess if txindex_in_child else TxIndexer
        self._txindexer = indexer(relay_dir, self.files, self._horizon_coordinates)
        self.transaction_index = TransactionIndex.for_store(self, writable=True)
        try:
            if w.file is not None:
                w.fd = os.open(relay_dir / w.file, os.O_RDWR)
                self._marks.write(w.file, w.end)  # recovery fsynced the file up to here
                self._marks.fsync()
                w.appendable = True
            self._txindexer.start()
        except BaseException:
            self._txindexer.close()
            self._marks.close()
            if w.fd >= 0:
                os.close(w.fd)
            raise

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(
        cls, relay_dir: str | os.PathLike, *, sync: SyncPolicy = SyncPolicy(), create: bool = True, on_fsync=None,
        txindex_in_child: bool = False,
    ) -> "RelayStore":
        """Open (or create) a relay directory: runs recovery (``store.recovery`` says what it did).

        ``on_fsync(seconds, bytes)``, when given, hears of each completed fdatasync (e.g. a metrics histogram);
        ``txindex_in_child`` builds the transaction index in a child process (relay/txindex_child.py).
        """
        relay_dir = Path(relay_dir)
        recovered = recover(relay_dir, create=create)
        return cls(relay_dir, sync, recovered, on_fsync=on_fsync, txindex_in_child=txindex_in_child,
                   _token=_OPEN_TOKEN)

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
        return self._w.file

    @property
    def current_end(self) -> int:
        """Bytes of the current file accepted so far, synced or not."""
        return self._w.end

    @property
    def boundary_end(self) -> int:
        """End of the last complete group or outside event in the current file (synced or not)."""
        return self._w.boundary

    @property
    def synced_end(self) -> int:
        return self._w.synced

    @property
    def flavour(self) -> str | None:
        """"mysql" or "mariadb", from the first FORMAT_DESCRIPTION; None before any."""
        return self._flavour

    @property
    def format_description(self) -> FormatDescription | None:
        """The current file's FORMAT_DESCRIPTION, once written."""
        return self._w.fde

    @property
    def latest_format_description(self) -> FormatDescription | None:
        """The newest FORMAT_DESCRIPTION the relay has: the current file's, or while the current file holds none
        yet (just rotated; an epoch's first file waiting for its new master's), the previous file's."""
        w = self._w
        return w.fde or w.prior_fde

    @property
    def current_file_closed(self) -> bool:
        """The current file ends with the master's ROTATE or STOP (the master has moved past it), or
        a new epoch has begun (the relay has moved past it: its last event is or will be the ROTATE
        to the epoch's first file)."""
        return self._w.last_type in (C.ROTATE_EVENT, C.STOP_EVENT) or self._switch.pending

    def file_digest(self, name: str) -> str | None:
        """SHA-256 of a closed relay file's logical bytes, from its index (``relay/fileindex.py``); None for the
        current file (it grows: ``fileindex.sha256_of(path, horizon position)`` hashes it on demand) and while a
        closed file's index is being built."""
        w = self._w
        if name == w.file or w.closed:
            return None
        return self._indexer.digest(name)

    # -- epochs ----------------------------------------------------------------------------------
    @property
    def epochs(self) -> Epochs:
        """The upstream epochs (immutable value; ``relay/epochs.py``)."""
        return self._switch.epochs

    @property
    def current_upstream_file(self) -> str | None:
        """The master's name of the current relay file (its epoch's master)."""
        w = self._w
        if w.file is None:
            return None
        return self._switch.epochs.upstream_name(w.file)[1]

    def upstream_position(self) -> tuple[str | None, int]:
        """``(the master's file name, offset)`` of the durable horizon: status, resume by position."""
        snap = self.horizon.snapshot()
        if snap.file is None:
            return None, snap.position
        return self._switch.epochs.upstream_name(snap.file)[1], snap.position

    def relay_name(self, upstream_name: str) -> str:
        """The relay file ``start_file(upstream_name)`` would write: the master's file mapped through the
        current epoch (an epoch that holds no file yet begins at its first relay file, whatever the
        master's first file turns out to be). Raises ValueError (EpochsError) for a name the current
        epoch cannot hold (another series, or before the epoch's first upstream file)."""
        cur = self._switch.epochs.current
        if self._switch.epoch_unused():
            return cur.first_file if cur.epoch >= 2 and cur.first_file is not None else upstream_name
        return self._switch.epochs.relay_name(upstream_name)

    @property
    def pending_gtids(self):
        """The GTID set at ``boundary_end`` (not yet durable); a copy."""
        w = self._w
        return None if w.gtids is None else w.gtids.copy()

    @property
    def failure(self) -> BaseException | None:
        """The file-system error that poisoned the store (it names the file), or None."""
        return self._w.failed

    @property
    def bytes_written(self) -> int:
        """Bytes this store has written to relay files."""
        return self._w.bytes_written

    # -- the sync pipeline (relay/sync.py) ---------------------------------------------------------
    @property
    def sync_policy(self) -> SyncPolicy:
        return self._pipeline.policy

    @property
    def on_fsync(self) -> Callable[[float, int], None] | None:
        """Called as ``on_fsync(seconds, bytes)`` after each fdatasync of relay data (or None)."""
        return self._pipeline.on_fsync

    def txindex_health(self) -> dict:
        """The transaction indexer's health (``TxIndexer.describe``): /status ``txindex`` and /metrics."""
        return self._txindexer.describe()

    @property
    def open_options(self) -> dict:
        """What this store was opened with (``RelayStore.open``'s keywords): a reopened store gets the same."""
        return {"sync": self.sync_policy, "on_fsync": self.on_fsync, "txindex_in_child": self.txindex_in_child}

    @property
    def fsyncs(self) -> int:
        """fdatasyncs of relay data this store has completed."""
        return self._pipeline.fsyncs

    @property
    def fsyncs_inline(self) -> int:
        """Of those, the ones the store ran itself on the caller's thread, not through a sync driver: before a new
        file, at an epoch switch, at a stop (``sync()``)."""
        return self._pipeline.fsyncs_inline

    @property
    def checkpoints(self) -> int:
        """Recovery checkpoints this store has written (relay/checkpoint.py)."""
        return self._pipeline.checkpoints

    @property
    def checkpoint_bytes(self) -> int:
        """A checkpoint rides on the first sync once the horizon is this far past the last one."""
        return self._pipeline.checkpoint_bytes

    @checkpoint_bytes.setter
    def checkpoint_bytes(self, value: int) -> None:
        self._pipeline.checkpoint_bytes = value

    @property
    def checkpoint_seconds(self) -> float:
        """... or this long after it."""
        return self._pipeline.checkpoint_seconds

    @checkpoint_seconds.setter
    def checkpoint_seconds(self, value: float) -> None:
        self._pipeline.checkpoint_seconds = value

    @property
    def sync_deadline(self) -> float | None:
        """``time.monotonic()`` value by which a sync is due (batch mode: the session's driver begins one), or None."""
        return self._pipeline.sync_deadline

    def sync_due(self, now: float | None = None) -> bool:
        """Whether the policy asks for a sync now (``now`` is ``time.monotonic()``)."""
        return self._pipeline.sync_due(now)

    def sync(self) -> bool:
        """Write everything, fsync, move the horizon to the last boundary; returns whether it moved."""
        return self._pipeline.sync()

    def begin_sync(self) -> SyncTicket:
        """Write the buffer out and describe the fsync that makes it durable (relay/sync.py)."""
        return self._pipeline.begin_sync()

    def complete_sync(self, ticket: SyncTicket) -> bool:
        """Publish what ``ticket`` made durable: the horizon moves (and wakes its readers)."""
        return self._pipeline.complete_sync(ticket)

    # -- the switch of epochs and the fillers (relay/epoch_switch.py) ------------------------------
    def _current_epochs(self) -> Epochs:
        return self._switch.epochs

    @property
    def epoch_switch_pending(self) -> bool:
        """The current epoch (>= 2) is recorded but its first relay file holds no events yet."""
        return self._switch.pending

    @property
    def warnings(self) -> list[str]:
        """Things recorded, not refused (see ``begin_epoch``)."""
        return self._switch.warnings

    @property
    def join_extra_gtids(self) -> Gtids | None:
        """GTIDs a join file's start set names beyond the relay's (counted as purged), or None."""
        return self._switch.join_extra_gtids

    @property
    def fillers(self) -> int:
        """Filler events this store has written."""
        return self._switch.fillers

    def begin_epoch(self, master: dict, upstream_first_file: str, *, relay_server_id: int,
                    now: float | None = None) -> Epoch:
        """Begin a new upstream epoch streamed from ``master`` at its ``upstream_first_file``
        (``EpochSwitch.begin_epoch``, relay/epoch_switch.py); returns the current epoch."""
        return self._switch.begin_epoch(master, upstream_first_file, relay_server_id=relay_server_id, now=now)

    def write_filler(self, offset: int, *, relay_server_id: int | None = None) -> int:
        """Cover ``[current_end, offset)`` with the relay's filler events; returns how many
        (``EpochSwitch.write_filler``, relay/epoch_switch.py)."""
        return self._switch.write_filler(offset, relay_server_id=relay_server_id)

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
        w = self._w
        w.check()
        try:
            check_file_name(name)
        except ValueError as exc:
            raise RelayStateError(str(exc)) from None
        self._pipeline.settle()  # the old file's descriptor is closed below: no fsync may still run on it
        upstream = name
        try:
            name = self.relay_name(upstream)
        except EpochsError as exc:
            raise RelayStateError(f"cannot start {upstream!r}: {exc}") from None
        if self._switch.epoch_unused() and self._switch.epochs.current.upstream_first_file != upstream:
            # The master began the epoch at another file than announced (a GTID dump picks its own):
            # nothing of the epoch is stored, so its record may follow. Relay names do not change.
            self._switch.reanchor(upstream)
        if name == w.file:
            if w.end == 4:
                return
            raise RelayStateError(f"{name} is already the current relay file and holds {w.end} bytes")
        if name in self._index:
            raise RelayStateError(f"{name} is already a relay file (an older one): the master's names went backwards")
        if w.file is not None and w.end != w.boundary:
            raise RelayStateError(
                f"start_file({name!r}) while a group is open in {w.file} "
                f"({w.end - w.boundary} bytes after offset {w.boundary}): call discard_incomplete() first"
            )
        if self._switch.pending:
            self._switch.complete_pending_switch()  # a crash may have cut the switch before its ROTATE
        path = self.relay_dir / name
        try:
            if w.file is not None:
                self._pipeline.sync_now()
            fd = self._create_file(path)
        except RelayStoreError:
            raise
        except OSError as exc:
            w.fail(exc, path)  # a sync error already named the old file; this names the new one
            raise
        old_fd = w.fd
        try:
            write_index(self.relay_dir, [*self._index, name])
            self._marks.write(name, 4)
        except OSError as exc:
            os.close(fd)
            w.fail(exc, self.relay_dir)
            raise
        if old_fd >= 0:
            os.close(old_fd)
        if w.file is not None:
            self._indexer.closed(w.file)  # closed: its index is built in the background
        self._index.append(name)
        w.fd = fd
        w.file = name
        w.appendable = True
        w.buf = bytearray()
        w.written = w.end = w.synced = w.boundary = 4
        w.prior_fde = w.fde or w.prior_fde
        w.fde = None
        w.checksum_len = 0
        w.start_set_seen = False
        w.file_start_gtids = None
        w.carried_gtids = None if w.gtids is None else w.gtids.copy()
        w.last_type = None
        w.pending_groups = 0
        w.pending_since = None
        self.horizon.advance(name, 4, w.gtids)

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
        self._w.check()
        if name not in self._index:
            raise KeyError(f"{name!r} is not a relay file here")
        keep_from = self._index.index(name)
        purged = self._index[:keep_from]
        if not purged:
            return []
        write_index(self.relay_dir, self._index[keep_from:])
        del self._index[:keep_from]  # in place: the epoch switch reads the same list
        for old in purged:
            removed = remove_all(self.relay_dir / old)  # plain, converted, archived
            for parent in {p.parent for p in removed if p.parent != self.relay_dir}:
                fsync_dir(parent)
            remove_file_index(self.relay_dir, old)  # its index goes with it (a crash between: removed at open)
            remove_tx_index(self.relay_dir, old)
            self._indexer.forget(old)
        fsync_dir(self.relay_dir)
        pruned = self._switch.epochs.pruned(self._index[0])
        if pruned != self._switch.epochs:
            self._switch.record(pruned)
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
        w = self._w
        end = w.end
        if offset == end and w.appendable:
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
            w.last_type = header[1]
            try:
                if n >= DIRECT_BYTES:
                    if w.buf:
                        w.flush()
                    w.write_all(event)
                else:
                    buf = w.buf
                    buf += event
                    if len(buf) >= FLUSH_BYTES:
                        w.flush()
            except OSError as exc:
                w.fail(exc)
                raise
            w.end = end + n
            return "appended"
        w.check()
        if w.fd < 0:
            raise RelayStateError("write_event before start_file: there is no current relay file")
        if offset > end:
            raise RelayGapError(offset, end, w.file)
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
        w = self._w
        end = w.end
        n = len(event)
        if offset != end or log_pos != end + n or not w.appendable or _SPECIAL[type_code] or end == 4:
            return self.write_event(offset, event)
        # The append below repeats write_event's on purpose: folding both into one helper method costs a
        # call per event, ~7% of the receiver's per-event time on OLTP streams (1.16 -> 1.25 us, measured).
        w.last_type = type_code
        try:
            if n >= DIRECT_BYTES:
                if w.buf:
                    w.flush()
                w.write_all(event)
            else:
                buf = w.buf
                buf += event
                if len(buf) >= FLUSH_BYTES:
                    w.flush()
        except OSError as exc:
            w.fail(exc)
            raise
        w.end = end + n
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
        w = self._w
        file = w.file
        if file is None:  # appendable: never (write_event takes this path only with a current file)
            raise RelayStateError("write_event before start_file: there is no current relay file")
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
                if self._switch.epochs.join_epoch(file) is not None:
                    event = join_fde(event)
                    fde = FormatDescription.parse(event, 0, len(event))
            except (BinlogFormatError, ValueError) as exc:
                raise RelayEventError(f"FORMAT_DESCRIPTION_EVENT at offset {offset}: {exc}") from None
            w.fde = fde
            w.checksum_len = fde.checksum_len
            if self._flavour is None:
                self._flavour = fde.flavour
            return event
        if w.start_set_seen:
            return event  # as the scanner: only the first set event of a file defines its start set
        length = len(event) - C.HEADER_LEN - w.checksum_len
        gtids: Gtids
        try:
            if type_code == C.PREVIOUS_GTIDS_LOG_EVENT:
                gtids = GtidSet.decode(event, C.HEADER_LEN, length)
            else:
                gtids, _flags = MariaBinlogState.decode_gtid_list_body(event, C.HEADER_LEN, length)
        except (BinlogFormatError, ValueError) as exc:
            raise RelayEventError(f"{C.event_name(type_code)} event at offset {offset}: {exc}") from None
        join_epoch = self._switch.epochs.join_epoch(file)
        if join_epoch is not None:
            self._switch.join_start_set(gtids, join_epoch, offset, len(event), type_code)
            return event
        carried = w.carried_gtids
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
                offset, len(event), w.file,
                f"its {C.event_name(type_code)} set {gtids} does not continue the relay's set {carried} "
                "(a different master history?)",
            )
        w.gtids = gtids
        w.file_start_gtids = gtids.copy()
        w.start_set_seen = True
        return event

    def _verify_duplicate(self, offset: int, event) -> str:
        w = self._w
        n = len(event)
        end = w.end
        if offset + n > end:
            raise RelayMismatchError(
                offset, n, w.file, f"it runs past the end of the stored data at {end}: event boundaries differ"
            )
        stored = self._read_stored(offset, n)
        if stored == event:
            return "duplicate"
        if offset == 4 and n > _FDE_CREATED_END and stored[4] == C.FORMAT_DESCRIPTION_EVENT:
            if self._same_format_description(stored, event):
                return "duplicate"
        first = next(i for i in range(n) if stored[i] != event[i])
        detail = f"first difference at byte {first} (file offset {offset + first})"
        raise RelayMismatchError(offset, n, w.file, detail)

    def _same_format_description(self, stored: bytes, event) -> bool:
        """A re-sent FDE may differ from the file's in what a master changes when it sends one:
        the in-use flag (cleared), create_timestamp (zeroed when the dump does not start at the
        file's first event, e.g. a GTID dump; a join file stores it zeroed, ``join_fde``) and so
        the CRC (recomputed, and checked here)."""
        w = self._w
        try:
            FormatDescription.parse(event, 0, len(event))
        except (BinlogFormatError, ValueError) as exc:
            raise RelayEventError(f"re-sent FORMAT_DESCRIPTION_EVENT of {w.file}: {exc}") from None
        crc_len = C.CHECKSUM_LEN if w.fde is not None and w.fde.checksum_alg != C.CHECKSUM_UNDEF else 0
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
        w = self._w
        parts = []
        if offset < w.written:
            take = min(n, w.written - offset)
            try:
                data = os.pread(w.fd, take, offset)
            except OSError as exc:
                w.fail(exc)
                raise
            if len(data) != take:
                short = RelayStoreError(
                    f"{w.file} is shorter than the relay wrote: {offset + len(data)} < {offset + take}"
                )
                w.fail(short)
                raise short
            parts.append(data)
        if offset + n > w.written:
            start = max(offset, w.written) - w.written
            parts.append(bytes(w.buf[start : offset + n - w.written]))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    # -- boundaries ------------------------------------------------------------------------------
    def group_complete(self, end_offset: int, gtid=None) -> None:
        """A group ended at ``end_offset`` of the current file; its GTID joins the set at the next sync.

        ``gtid`` is in the boundary parser's form: ``(sid16, gno)``, ``(sid16, tag, gno)``,
        ``(domain, server_id, seq)`` or None (anonymous / no GTID). A group that ends at or before
        the last boundary was re-sent after a reconnect and is ignored.
        """
        w = self._w
        if end_offset <= w.boundary:
            return
        if end_offset > w.end:
            raise RelayStateError(
                f"group_complete at {end_offset}, beyond the stored data of {w.file} ({w.end} bytes)"
            )
        if gtid is not None:
            try:
                w.gtids = _add_gtid(w.gtids, gtid)
            except (ValueError, TypeError) as exc:
                raise RelayEventError(
                    f"group ending at {w.file}:{end_offset} has an unusable GTID {gtid!r}: {exc}"
                ) from None
        w.boundary = end_offset
        w.pending_groups += 1
        if w.pending_since is None:
            w.pending_since = time.monotonic()

    def boundary_outside(self, end_offset: int) -> None:
        """An event outside any group (FDE, PREVIOUS_GTIDS, ROTATE, ...) ended at ``end_offset``."""
        w = self._w
        if end_offset <= w.boundary:
            return
        if end_offset > w.end:
            raise RelayStateError(
                f"boundary_outside at {end_offset}, beyond the stored data of {w.file} ({w.end} bytes)"
            )
        w.boundary = end_offset
        if w.pending_since is None:
            w.pending_since = time.monotonic()

    def set_start_gtids(self, gtids) -> None:
        """Cross-check the GTID set the session decoded from the current file's PREVIOUS_GTIDS /
        GTID_LIST. The store decodes that event itself when it is written (so recovery, which reads
        the files, always agrees with it); a different set raises RelayMismatchError."""
        w = self._w
        w.check()
        if not w.start_set_seen:
            raise RelayStateError(f"{w.file} has no PREVIOUS_GTIDS / GTID_LIST event yet: write it first")
        if gtids != w.file_start_gtids:
            raise RelayMismatchError(
                0, 0, w.file, f"start GTID set {gtids} differs from the file's {w.file_start_gtids}"
            )

    # -- a cut stream, closing ---------------------------------------------------------------------
    def discard_incomplete(self) -> int:
        """After an upstream disconnect: cut the current file back to the last boundary.

        The partial group is thrown away (the master re-sends it whole); returns the bytes dropped.
        The caller also resets its boundary parser.
        """
        w = self._w
        w.check()
        self._pipeline.settle()  # no truncation under an fsync in flight (and a stop publishes what it made durable)
        drop = w.end - w.boundary
        if drop <= 0:
            return 0
        buffered = len(w.buf)
        if drop <= buffered:
            del w.buf[buffered - drop :]
        else:
            w.buf = bytearray()
            try:
                os.ftruncate(w.fd, w.boundary)
            except OSError as exc:
                w.fail(exc)
                raise
            w.written = w.boundary
            # The next sync's fdatasync makes the shorter size durable; until then recovery would
            # cut the same bytes anyway (they end inside a group).
            w.synced = min(w.synced, w.boundary)
        w.end = w.boundary
        return drop

    def close(self) -> None:
        """Sync what is complete and close the files (idempotent).

        After a failed fsync it also cuts the current file back to the last successful fsync; if
        that fails, close raises (and retries when called again): do not reopen the directory then.
        """
        w = self._w
        if w.closed:
            if self._pipeline.unsynced_cut is not None:
                self._cut_unsynced_tail()
            return
        ticket = self._pipeline.ticket
        if ticket is not None:
            ticket.wait()  # the descriptor is closed below: let the fsync in flight end first
            if self._pipeline.ticket is ticket and ticket.error is None:
                self.complete_sync(ticket)
        try:
            if w.failed is None and w.fd >= 0:
                self._pipeline.checkpoint_force = True  # a clean stop leaves a checkpoint at the horizon
                self._pipeline.sync_now()
                self._marks.fsync()
        finally:
            self._indexer.close()
            self._txindexer.close()
            w.closed = True
            w.appendable = False
            if w.fd >= 0:
                os.close(w.fd)
                w.fd = -1
            self._marks.close()
            if self._pipeline.unsynced_cut is not None:
                self._cut_unsynced_tail()

    def _cut_unsynced_tail(self) -> None:
        cut = self._pipeline.unsynced_cut
        if cut is None:
            return
        name, keep = cut
        fd = os.open(self.relay_dir / name, os.O_RDWR)
        try:
            if os.fstat(fd).st_size > keep:
                os.ftruncate(fd, keep)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._pipeline.unsynced_cut = None

    def __repr__(self) -> str:
        w = self._w
        return f"<RelayStore {self.relay_dir} {w.file}:{w.end} horizon={self.horizon.snapshot().coordinates}>"


_OPEN_TOKEN = object()
