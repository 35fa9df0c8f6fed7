"""The relay store: writes the master's events at the master's offsets, makes them durable, moves the horizon.

Relay files carry the master's names and every event sits at the master's byte offset
(``log_pos - event_size``), so a closed relay file is byte-identical to the master's binlog (the
master clears LOG_EVENT_BINLOG_IN_USE_F in the FDE it sends, and the relay stores what it is sent).

Write path (the relay's hot loop), one writer:

    store.start_file("binlog.000042")              # from the master's ROTATE
    store.write_event(offset, event)               # every event, at the master's offset
    store.group_complete(end, gtid)                # the boundary parser saw a group end
    store.boundary_outside(end)                    # an event outside any group ended (FDE, ROTATE, ...)
    store.maybe_sync()                             # after each batch read from the socket

Appended bytes collect in memory and reach the file in large ``os.pwrite`` calls (at sync, or once
the buffer passes ``FLUSH_BYTES``, so a 1 GB transaction streams to disk without being held). A sync
is: write the buffer, ``fdatasync``, record the durable mark, and only then advance the horizon to
the last complete boundary. The horizon never points inside a group and never past an fsync.

The session runs the fsync off the event loop: ``ticket = store.begin_sync()`` (writes the buffer),
``ticket.submit(executor)`` runs ``ticket.make_durable()`` in a worker thread, ``store.complete_sync(ticket)``
back on the loop publishes it; events keep arriving, being parsed and written in between (the next
batch's bytes go to the page cache while the previous batch's fdatasync runs). At most one ticket is
in flight. The ticket covers only bytes written before ``begin_sync`` (its position is the boundary
then), so the horizon still moves only to fsynced boundaries. Whatever must not overlap an fsync, i.e.
closing or replacing the descriptor (``start_file``, ``close``), truncating (``discard_incomplete``,
``write_filler``), ``begin_epoch`` and ``sync``, first waits for the ticket in flight and publishes it.

Upstream epochs (``relay/epochs.py``): after a failover the session calls ``store.begin_epoch(master,
upstream_first_file, relay_server_id=...)`` before it streams from the new master. The relay's files
stay one monotonic sequence: ``start_file`` takes the master's file name and creates the relay name it
maps to in the current epoch (epoch 1, and every relay without ``relayproxy.epochs``, maps names
identically), ``current_upstream_file`` / ``upstream_position()`` give the master's coordinates. The
switch is crash safe: the epochs record is its commit point; the ROTATE the relay then appends to its
last file (to the new epoch's first file) is re-appended, byte-identical, by ``begin_epoch`` or
``start_file`` when a crash cut it. ``write_filler`` covers the stretch a GTID dump skipped with
IGNORABLE events of the relay's own (never inside a group); the first file of an epoch may start with
a GTID set that lacks part of the relay's (``join_gtids ∪ its set`` is the set at its start).

Same history, same bytes (design invariant 11): what the relay writes itself (the epoch ROTATE,
``join_rotate``; fillers; the join file's FORMAT_DESCRIPTION, ``_join_fde``) depends only on the
files and the stream, never on the relay's server_id, its clock or when it connected, so two relays
that followed the same masters hold byte-identical files.

Errors from the file system (full disk, EIO) poison the store: every later call raises
``RelayStoreFailed``; the OSError names the file. Reopen it; recovery cuts the unfinished tail and the
horizon is unchanged. After a failed fsync, ``close()`` first cuts the current file back to the last
successful fsync: the kernel may keep such pages in its cache without their being on disk, and
recovery, which reads through that cache, could not tell.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..binlog import constants as C
from ..binlog import encoders as _enc
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription
from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from ..log import get_logger
from .checkpoint import CHECKPOINT_NAME, CHECKPOINT_TMP_NAME, CheckpointError, capture
from .closed_files import remove_all
from .epochs import (
    EPOCHS_NAME,
    Epoch,
    Epochs,
    EpochsError,
    gtid_missing,
    gtid_text,
    gtid_union,
    normalise_master,
    parse_gtid_text,
)
from .fileindex import Indexer
from .fileindex import remove as remove_file_index
from .horizon import Horizon
from .fsyncer import NativeJob
from .durable import DurableMarkWriter, encode_durable_mark, fsync_dir, write_epochs, write_file_atomically, write_index
from .errors import (
    RelayEventError,
    RelayGapError,
    RelayMismatchError,
    RelayRecoveryError,
    RelayStateError,
    RelayStoreError,
    RelayStoreFailed,
)
from .layout import check_file_name
from .recovery import RecoveryReport, read_final_rotate, read_first_fde, recover

log = get_logger(__name__)

__all__ = [
    "SyncPolicy",
    "RelayStore",
    "SyncTicket",
    "RecoveryReport",
    "RelayStoreError",
    "RelayRecoveryError",
    "RelayGapError",
    "RelayMismatchError",
    "RelayStateError",
    "RelayEventError",
    "RelayStoreFailed",
]

FLUSH_BYTES = 4 << 20  # write the buffer out once it holds this much
DIRECT_BYTES = 1 << 20  # an event at least this large skips the buffer
SPARSE_FILLER_BYTES = 1 << 20  # a filler at least this large is written sparse (header + CRC, a hole between)
FILLER_MAX_SIZE = _enc.FILLER_MAX_SIZE  # a larger gap is covered by several fillers
# A recovery checkpoint (relay/checkpoint.py) rides on a sync once the horizon has moved this far past the last
# one, or this long after it, and at close: two extra fsyncs (its file, the directory) per 16 MB or 10 s at most.
CHECKPOINT_BYTES = 16 << 20
CHECKPOINT_SECONDS = 10.0

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




def join_rotate(first_file: str, fde: FormatDescription, end: int, *, checksum: bool) -> bytes:
    """The ROTATE a relay appends at ``end`` of its last file of an epoch, naming the next epoch's first file.

    Every field is a function of the history the relays share (design invariant 11): the name, the offset, and
    the file's own FORMAT_DESCRIPTION. server_id is that FDE's (the master that wrote the file), so the file ends
    as if its master had rotated it: never the relay's own id, which a replica of the relay could share, and
    which would make the replica's IO thread treat the ROTATE as its own event (skipped from its relay log
    unless ``replicate_same_server_id``); a replica with the old master's id would be that master itself, which
    skips the old master's events anyway. timestamp 0, as the servers stamp the events they make up (fake
    ROTATE, heartbeats): a replica's SQL thread does not take a 0 timestamp into Seconds_Behind_Master, and no
    clock or crash timing can change it, so the ROTATE re-appended after a crash is byte-identical.
    """
    size = C.HEADER_LEN + 8 + len(first_file.encode("utf-8", "surrogateescape")) + (C.CHECKSUM_LEN if checksum else 0)
    return _enc.rotate(first_file, 4, server_id=fde.server_id, checksum=checksum, timestamp=0,
                       log_pos=(end + size) & _U32)


def _join_fde(event) -> bytes:
    """The FORMAT_DESCRIPTION a relay stores at the head of an epoch's join file: the new master's, with
    create_timestamp 0 and the in-use flag clear (CRC recomputed).

    How the master sends that FDE depends on how the relay asked, not on the history: MariaDB's GTID dump
    zeroes ``created`` only while the requested position is not reached at the file's start, a dump by
    position from offset 4 sends it as written (non-zero in the first binlog after the server started). The
    relay stores the one form, so relays that agree on the history hold the same bytes (design invariant 11).
    ``created = 0`` is also what a replica of the relay should see there: it tells a replica that the master
    restarted and its temporary tables are gone, which a switch of masters is not a reason to do.
    """
    return _enc.fde_copy(event, clear_in_use=True, created=0)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncPolicy:
    """When the store fsyncs, i.e. how far the durable horizon may lag the received stream.

    ``transaction`` (default): ``maybe_sync`` fsyncs whenever the stream reached a new boundary since
    the last fsync. Called once per batch read from the socket, every group that arrived in that
    batch shares one fsync (group commit): at low load one fsync per transaction, at high load one
    per network read. Replicas see a transaction as soon as it is durable; the cost is the fsync rate.

    ``batch``: fsync once ``max_transactions`` groups are pending, or ``max_delay`` seconds after the
    first pending boundary, whichever comes first (the session calls ``maybe_sync`` when
    ``sync_deadline`` passes). Fewer fsyncs and more throughput on slow disks; replicas see
    transactions up to ``max_delay`` later, and more data sits between the horizon and the stream
    (re-fetched from the master after a crash, never lost: it was never advertised).
    """

    mode: Literal["transaction", "batch"] = "transaction"
    max_transactions: int = 100
    max_delay: float = 0.01

    def __post_init__(self):
        if self.mode not in ("transaction", "batch"):
            raise ValueError(f"sync mode must be 'transaction' or 'batch', not {self.mode!r}")
        if self.max_transactions < 1:
            raise ValueError("max_transactions must be at least 1")
        if self.max_delay < 0:
            raise ValueError("max_delay must not be negative")


class SyncTicket:
    """One fsync in flight: what it covers and where the horizon goes once it is done."""

    __slots__ = (
        "file", "position", "gtids", "moves", "_fd", "_marks", "_synced_end", "durable", "needs_fsync", "error", "_on_error",
        "fsync_seconds", "fsync_bytes", "checkpoint", "checkpoint_error", "_lock", "_ran", "_job", "completed",
    )

    def __init__(self, file, position, gtids, moves, fd, marks, synced_end, needs_fsync, on_error, fsync_bytes=0):
        self.file = file
        self.position = position
        self.gtids = gtids
        self.moves = moves  # the horizon will move when this completes
        self._fd = fd
        self._marks = marks
        self._synced_end = synced_end
        self.needs_fsync = needs_fsync  # False when nothing was written since the last fsync
        self.durable = False
        self.error: OSError | None = None
        self._on_error = on_error
        self.fsync_seconds = 0.0  # how long the fdatasync took (for the fsync latency metric)
        self.fsync_bytes = fsync_bytes  # bytes written since the previous fdatasync of this file
        self.checkpoint = None  # (position, write(fd)) of a recovery checkpoint to write once durable
        self.checkpoint_error: BaseException | None = None
        self._lock = threading.Lock()
        self._ran = False  # make_durable has begun (it runs once; a second call waits for the first)
        self._job: concurrent.futures.Future | None = None  # the worker's run, once submitted
        self.completed = False  # complete_sync has published it

    def submit(self, executor: concurrent.futures.Executor) -> concurrent.futures.Future:
        """Run ``make_durable`` in ``executor`` (a worker thread); the store's operations that must not
        overlap an fsync in flight (rotation, truncation, epoch switch, close) wait for that run."""
        self._job = executor.submit(self.make_durable)
        return self._job

    def submit_native(self, runner) -> None:
        """Run the fdatasync and the mark's write in the C fsync thread (relay/fsyncer.py); ``native_done`` completes
        the ticket on the thread that collects or waits for it. Not for a ticket with a checkpoint to write (Python:
        the thread pool's ``submit``)."""
        if self.checkpoint is not None:
            raise RelayStateError("a ticket with a checkpoint to write runs in the thread pool")
        with self._lock:
            if self._ran:
                raise RelayStateError("this sync ticket has run already")
            self._ran = True
        mark = encode_durable_mark(self.file, self.position) if self.moves else None
        self._job = runner.start(self, self._fd if self.needs_fsync else -1, self._marks.fileno(), mark)

    def native_done(self, err: int, stage: int, seconds: float) -> None:
        """The C thread's result: as ``_make_durable`` ends (the store fails on an error)."""
        self.fsync_seconds = seconds
        if err:
            what = "fdatasync of the relay file" if stage == 1 else "write of the durable mark"
            exc = OSError(err, f"{os.strerror(err)} ({what})")
            self.error = exc
            self._on_error(self, exc)
            return
        self.durable = True

    @property
    def done(self) -> bool:
        """``make_durable`` has returned or raised (in the worker it was submitted to)."""
        job = self._job
        return job.done() if job is not None else self.durable or self.error is not None

    def wait(self) -> None:
        """Until ``make_durable`` has run: by the worker it was submitted to, else here (blocking). Its
        OSError is kept in ``error`` (and has failed the store)."""
        job = self._job
        try:
            if job is not None:
                job.result()
            else:
                self.make_durable()
        except OSError:
            pass

    def make_durable(self) -> None:
        """fdatasync the file and record the durable mark; safe to run in a worker thread.

        An OSError fails the store at once (an fsync error cannot be retried: the kernel may have
        dropped the dirty pages), ends this ticket, and is re-raised; later calls on the store
        raise RelayStoreFailed, ``close()`` still works, and reopening recovers from the files.
        It runs once: a second call waits for the first and returns (or raises) as it did.
        """
        job = self._job
        if isinstance(job, NativeJob):  # it runs (or ran) in the C fsync thread: wait for that
            job.result()
            return
        with self._lock:
            if self._ran:
                if self.error is not None:
                    raise self.error
                return
            self._ran = True
            self._make_durable()

    def _make_durable(self) -> None:
        try:
            if self.needs_fsync:
                began = time.perf_counter()
                os.fdatasync(self._fd)
                self.fsync_seconds = time.perf_counter() - began
            if self.moves:
                self._marks.write(self.file, self.position)
        except OSError as exc:
            self.error = exc
            self._on_error(self, exc)
            raise
        self.durable = True
        if self.checkpoint is not None:
            # After the fdatasync: the checkpoint never names bytes that are not durable. Its failure
            # costs only a longer scan at the next start (the previous checkpoint stands).
            try:
                self.checkpoint[1](self._fd)
            except (OSError, CheckpointError) as exc:
                self.checkpoint_error = exc


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


class RelayStore:
    """Relay files in master coordinates, their index, and the durable horizon over them."""

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
        self._marks = DurableMarkWriter(relay_dir)
        try:
            if self._file is not None:
                self._fd = os.open(relay_dir / self._file, os.O_RDWR)
                self._marks.write(self._file, self._end)  # recovery fsynced the file up to here
                self._marks.fsync()
                self._appendable = True
        except BaseException:
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
    def epoch_switch_pending(self) -> bool:
        """The current epoch (>= 2) is recorded but its first relay file holds no events yet."""
        cur = self._epochs.current
        if cur.implicit or cur.epoch < 2:
            return False
        return cur.first_file not in self._index or (cur.first_file == self._file and self._end <= 4)

    def _epoch_unused(self) -> bool:
        """The current recorded epoch holds no data yet (its record may still be changed)."""
        cur = self._epochs.current
        if cur.implicit:
            return False
        if cur.epoch == 1:
            return not self._index
        return self.epoch_switch_pending

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

    @property
    def sync_deadline(self) -> float | None:
        """``time.monotonic()`` value by which ``maybe_sync`` should be called (batch mode), or None."""
        if self._pending_since is None:
            return None
        if self.sync_policy.mode == "transaction":
            return self._pending_since
        return self._pending_since + self.sync_policy.max_delay

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

    # -- epochs: the switch ------------------------------------------------------------------------
    def begin_epoch(self, master: dict, upstream_first_file: str, *, relay_server_id: int,
                    now: float | None = None) -> Epoch:
        """Begin a new upstream epoch: the session streams next from ``master`` (host, port, server_id,
        server_uuid), starting with its binlog file ``upstream_first_file``.

        Steps: the current file is made durable; the new epoch is recorded in ``relayproxy.epochs``
        (first relay file = the relay's next sequence number, join set = the durable GTID set): that
        record is the commit point; then a ROTATE to ``(first file, 4)`` made by the relay
        (``join_rotate``: timestamp 0, the server_id of the file's FORMAT_DESCRIPTION, CRC32 when the
        file has checksums) is appended to the current file, made durable, and the horizon moves past
        it, so file/position replicas of the relay follow it into the new file. The receiver's next
        ``start_file(F)`` creates that file. ``relay_server_id`` and ``now`` go into the record only
        (who switched, and when): no byte of a relay file depends on them.

        Idempotent: called again for the same master it completes a switch a crash cut (the ROTATE is
        re-appended byte for byte from the record) and returns the current epoch. While the current
        epoch holds no data its record is replaced (another master, or another first file) instead
        of adding an epoch. A relay without files records epoch 1 (identity names), no ROTATE. A
        newest file holding only the magic becomes the new epoch's first file (the ROTATE before it
        already names it). Requires no open group (call ``discard_incomplete`` first).
        """
        self._check()
        self._settle()
        try:
            master = normalise_master(master)
            check_file_name(upstream_first_file)
        except ValueError as exc:
            raise RelayStateError(f"begin_epoch: {exc}") from None
        if type(relay_server_id) is not int or not 0 <= relay_server_id <= _U32:
            raise RelayStateError(f"begin_epoch: relay_server_id {relay_server_id!r} is not a server id")
        if self._file is not None and self._end != self._boundary:
            raise RelayStateError(
                f"begin_epoch while a group is open in {self._file} ({self._end - self._boundary} bytes after "
                f"offset {self._boundary}): call discard_incomplete() first"
            )
        if self._fd >= 0:
            self._sync()  # the join set is the durable one, and nothing unsynced precedes the ROTATE
        started = time.time() if now is None else float(now)
        cur = self._epochs.current
        try:
            if not cur.implicit and cur.same_master(master):
                planned = self._epochs
                if self._epoch_unused() and cur.upstream_first_file != upstream_first_file:
                    planned = self._reanchored(upstream_first_file)
            elif self._epoch_unused():
                join = gtid_text(self.horizon.snapshot().gtids)
                changes = {"master": master, "upstream_first_file": upstream_first_file, "join_gtids": join,
                           "started": started, "relay_server_id": relay_server_id}
                if cur.epoch == 1:
                    changes["first_file"] = upstream_first_file
                planned = self._epochs.replaced_current(**changes)
            else:
                planned = self._epochs.next_epoch(
                    index=self._index, current_empty=self._file is not None and self._end <= 4, master=master,
                    upstream_first_file=upstream_first_file, join_gtids=gtid_text(self.horizon.snapshot().gtids),
                    started=started, relay_server_id=relay_server_id,
                )
        except EpochsError as exc:
            raise RelayStateError(f"begin_epoch: {exc}") from None
        if planned != self._epochs:
            self._record_epochs(planned)  # the commit point of the switch
        if self.epoch_switch_pending:
            self._complete_epoch_switch()
        return self._epochs.current

    def _reanchored(self, upstream_first_file: str) -> Epochs:
        cur = self._epochs.current
        changes = {"upstream_first_file": upstream_first_file}
        if cur.epoch == 1:
            changes["first_file"] = upstream_first_file
        return self._epochs.replaced_current(**changes)

    def _reanchor_epoch(self, upstream_first_file: str) -> None:
        try:
            planned = self._reanchored(upstream_first_file)
        except EpochsError as exc:
            raise RelayStateError(f"cannot start {upstream_first_file!r}: {exc}") from None
        self._record_epochs(planned)

    def _record_epochs(self, planned: Epochs) -> None:
        try:
            write_epochs(self.relay_dir, planned)
        except OSError as exc:
            self._fail(exc, self.relay_dir / EPOCHS_NAME)
            raise
        self._epochs = planned

    def _complete_epoch_switch(self) -> None:
        """Append (unless the current file already ends with it) the ROTATE to the pending epoch's first
        file, make it durable and move the horizon past it."""
        cur = self._epochs.current
        if self._file is None or cur.first_file == self._file:
            return  # no earlier file, or the epoch reuses the empty newest file its predecessor's ROTATE names
        if self._end != self._boundary:
            raise RelayStateError(f"cannot end {self._file} with the epoch's ROTATE: a group is open")
        if not self._ends_with_rotate_to(cur.first_file):
            self._append_join_rotate(cur)
        self._sync()

    def _ends_with_rotate_to(self, name: str) -> bool:
        if self._last_type != C.ROTATE_EVENT:
            return False
        try:
            self._flush()
        except OSError as exc:
            self._fail(exc)
            raise
        rotate = read_final_rotate(self.relay_dir / self._file)
        return rotate is not None and rotate[1] == 4 and name in self._epochs.rotate_targets(self._file, rotate[0])

    def _append_join_rotate(self, epoch: Epoch) -> None:
        if self._fde is None:
            raise RelayStateError(
                f"{self._file} has no FORMAT_DESCRIPTION_EVENT: it cannot end with the ROTATE to {epoch.first_file}"
            )
        end = self._end
        event = join_rotate(epoch.first_file, self._fde, end, checksum=self._checksum_len == C.CHECKSUM_LEN)
        self.write_event(end, event)
        self.boundary_outside(end + len(event))

    # -- fillers ---------------------------------------------------------------------------------
    def write_filler(self, offset: int, *, relay_server_id: int | None = None) -> int:
        """Cover ``[current_end, offset)`` with the relay's filler events (a GTID dump skipped groups the
        relay has); returns how many (one, unless the gap exceeds ``FILLER_MAX_SIZE``).

        Only at a boundary (no open group). Each filler is IGNORABLE_LOG_EVENT with
        LOG_EVENT_IGNORABLE_F, timestamp 0, the server_id of the file's FORMAT_DESCRIPTION (the master
        that wrote the file), log_pos its end, a zero body and a CRC32 when the file has checksums; large
        ones are written sparse. Nothing in them depends on the relay (``relay_server_id`` is accepted and
        ignored): relays that skipped the same stretch write the same bytes. They end outside any group:
        the horizon may move past them. Raises RelayGapError when the gap is smaller than an event.
        """
        self._check()
        self._settle()  # a large filler truncates (extends) the file
        if self._fd < 0:
            raise RelayStateError("write_filler before start_file: there is no current relay file")
        end = self._end
        if offset <= end:
            raise RelayStateError(f"write_filler to {offset}: {self._file} already holds {end} bytes")
        if end != self._boundary:
            raise RelayStateError(
                f"write_filler while a group is open in {self._file} (after offset {self._boundary}): "
                "a filler never sits inside a group"
            )
        if self._fde is None:
            raise RelayStateError(f"write_filler in {self._file} before its FORMAT_DESCRIPTION_EVENT")
        checksum = self._checksum_len == C.CHECKSUM_LEN
        server_id = self._fde.server_id
        try:
            sizes = _enc.filler_sizes(offset - end, checksum, FILLER_MAX_SIZE)
        except ValueError:
            raise RelayGapError(offset, end, self._file) from None
        at = end
        try:
            for size in sizes:
                stop = at + size
                if size < SPARSE_FILLER_BYTES:
                    self.write_event(at, _enc.filler(size, log_pos=stop & _U32, server_id=server_id,
                                                     checksum=checksum))
                else:
                    self._write_sparse_filler(at, size, server_id, checksum)
                at = stop
        except OSError as exc:
            self._fail(exc)
            raise
        self._last_type = C.IGNORABLE_LOG_EVENT
        self.fillers += len(sizes)
        self.boundary_outside(offset)
        return len(sizes)

    def _write_sparse_filler(self, at: int, size: int, server_id: int, checksum: bool) -> None:
        self._flush()
        fd = self._fd
        stop = at + size
        header = _enc.filler_header(size, log_pos=stop & _U32, server_id=server_id)
        os.ftruncate(fd, at)  # nothing stale in the hole: it reads as zeros
        os.pwrite(fd, header, at)
        if checksum:
            os.pwrite(fd, _enc.filler_crc(header, size).to_bytes(4, "little"), stop - C.CHECKSUM_LEN)
            self.bytes_written += len(header) + C.CHECKSUM_LEN
        else:
            os.ftruncate(fd, stop)
            self.bytes_written += len(header)
        self._written = self._end = stop

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
        or for the FORMAT_DESCRIPTION of an epoch's join file its deterministic form: ``_join_fde``)."""
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
                    event = _join_fde(event)
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

    def _join_start_set(self, gtids, epoch: Epoch, offset: int, size: int, type_code: int) -> None:
        """The first file of an epoch starts with its new master's set, which may be a strict subset of
        the relay's (that file began before the join point; fillers cover the groups the relay had):
        the set at its start is ``join_gtids ∪ its set``. A set naming GTIDs the relay never had (the
        new master had them before this file: errant or other-domain transactions) is recorded, not
        refused: they count as purged (FileCatalog.purged), the relay cannot serve them."""
        join = parse_gtid_text(epoch.join_gtids)
        try:
            effective = gtid_union(join, gtids)
            extra = gtid_missing(gtids, join) if join is not None else None
        except ValueError as exc:
            raise RelayMismatchError(offset, size, self._file, f"its {C.event_name(type_code)} set: {exc}") from None
        if extra is not None:
            self.join_extra_gtids = extra
            self.warnings.append(
                f"{self._file} (epoch {epoch.epoch}) starts with {C.event_name(type_code)} {gtid_text(gtids)}, "
                f"which names {gtid_text(extra)} that the relay never had: counted as purged"
            )
        self._gtids = effective
        self._file_start_gtids = gtids.copy()
        self._start_set_seen = True

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
        file's first event, e.g. a GTID dump; a join file stores it zeroed, ``_join_fde``) and so
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

    # -- syncing ---------------------------------------------------------------------------------
    def sync_due(self, now: float | None = None) -> bool:
        """Whether the policy asks for a sync now (``now`` is ``time.monotonic()``)."""
        since = self._pending_since
        if since is None:
            return False
        policy = self.sync_policy
        if policy.mode == "transaction" or self._pending_groups >= policy.max_transactions:
            return True
        if now is None:
            now = time.monotonic()
        return now - since >= policy.max_delay

    def maybe_sync(self, now: float | None = None) -> bool:
        """Sync if the policy says so; returns whether the horizon moved."""
        if self._pending_since is None or self._ticket is not None or not self.sync_due(now):
            return False
        return self._sync()

    def sync(self) -> bool:
        """Write everything, fsync, move the horizon to the last boundary; returns whether it moved."""
        self._check()
        self._settle()
        if self._fd < 0:
            return False
        return self._sync()

    def _settle(self) -> None:
        """Wait for the ticket in flight, if any (blocking: its fsync is running in a worker thread, or
        runs here when it was never submitted) and publish it. Raises like ``complete_sync`` when its
        fsync failed (the store has failed then)."""
        ticket = self._ticket
        if ticket is None:
            return
        ticket.wait()
        self.complete_sync(ticket)

    def _sync(self) -> bool:
        ticket = self.begin_sync()
        ticket.make_durable()  # an OSError has failed the store and ended the ticket
        return self.complete_sync(ticket)

    def begin_sync(self) -> SyncTicket:
        """Write the buffer out and describe the fsync that makes it durable (see the module doc)."""
        self._check()
        if self._ticket is not None:
            raise RelayStateError("a sync is already in flight")
        if self._fd < 0:
            raise RelayStateError("nothing to sync: there is no current relay file")
        try:
            self._flush()
        except OSError as exc:
            self._fail(exc)
            raise
        snap = self.horizon.snapshot()
        moves = snap.file != self._file or snap.position != self._boundary
        need_fsync = self._written != self._synced
        gtids = None if (self._gtids is None or not moves) else self._gtids.copy()
        ticket = SyncTicket(
            self._file, self._boundary, gtids, moves, self._fd, self._marks, self._written, need_fsync, self._ticket_failed,
            max(self._written - self._synced, 0),
        )
        ticket.checkpoint = self._checkpoint_due(snap, ticket)
        self._ticket = ticket
        self._pending_groups = 0
        self._pending_since = None
        return ticket

    def _checkpoint_due(self, snap, ticket: SyncTicket):
        """``(position, write(fd))`` of the recovery checkpoint this sync should leave, or None.

        Due once the horizon is ``checkpoint_bytes`` past the last checkpoint, ``checkpoint_seconds`` after
        it, or at close. Only where the file's own GTID state is the store's: not in a join file (its set
        starts with the join set) nor in a file that carries the previous file's set (no set event yet)."""
        file = self._file
        if self._fde is None or snap.file not in (None, file):
            return None
        position = ticket.position if ticket.moves else snap.position
        last_file, last_offset = self._checkpoint_at
        if position <= 4 + C.HEADER_LEN or (last_file == file and last_offset == position):
            return None
        if not self._checkpoint_force:
            moved = position - (last_offset if last_file == file else 0)
            if moved < self.checkpoint_bytes and time.monotonic() - self._checkpoint_time < self.checkpoint_seconds:
                return None
        if self._start_set_seen:
            if self._epochs.join_epoch(file) is not None:
                return None
        elif self._carried_gtids is not None:
            return None
        gtids = ticket.gtids if ticket.moves else snap.gtids
        gtids = None if gtids is None else gtids.copy()
        start = None if self._file_start_gtids is None else self._file_start_gtids.copy()
        if not position == self._boundary == self._end:
            return None  # a group is open: the type of the event ending at the boundary is not known here
        fde, last_type, epochs = self._fde, self._last_type, self._epochs
        if last_type is None or last_type == C.ROTATE_EVENT:
            return None  # a closed file: the next start reads only its ROTATE anyway
        rotate = None
        relay_dir = self.relay_dir

        def write(fd: int) -> None:
            cp = capture(fd, file=file, offset=position, fde=fde, start_gtids=start, gtids=gtids,
                         last_type=last_type, rotate_to=rotate, epochs=epochs)
            write_file_atomically(relay_dir / CHECKPOINT_NAME, cp.encode(), tmp=relay_dir / CHECKPOINT_TMP_NAME)

        return position, write

    def _ticket_failed(self, ticket: SyncTicket, exc: OSError) -> None:
        # May run in the worker thread: only plain attribute stores.
        self._fail(exc)
        if ticket.needs_fsync and ticket.file == self._file:
            # After a failed fsync the written bytes may sit in the page cache without being on disk
            # (Linux marks them clean): recovery would read them back and trust them. close() cuts
            # the file to the last successful fsync first; the master re-sends the rest.
            self._unsynced_cut = (ticket.file, self._synced)
        if self._ticket is ticket:
            self._ticket = None

    def complete_sync(self, ticket: SyncTicket) -> bool:
        """Publish what ``ticket`` made durable: the horizon moves (and wakes its readers)."""
        if ticket.error is not None:
            raise RelayStoreFailed(f"fsync of {ticket.file} failed: {ticket.error}") from ticket.error
        if ticket.completed:
            return ticket.moves  # already published (a rotation or a truncation waited for it)
        if ticket is not self._ticket:
            raise RelayStateError("complete_sync with a ticket that is not the one in flight")
        self._ticket = None
        if not ticket.durable:
            self._pending_since = self._pending_since or time.monotonic()  # still to be synced
            raise RelayStateError("complete_sync before the ticket's make_durable() finished")
        ticket.completed = True
        if ticket.needs_fsync:
            self.fsyncs += 1
            if ticket.file == self._file:
                self._synced = max(self._synced, min(ticket._synced_end, self._end))
            if self.on_fsync is not None:
                self.on_fsync(ticket.fsync_seconds, ticket.fsync_bytes)
        if ticket.checkpoint is not None:
            if ticket.checkpoint_error is not None:
                log.warning("relay checkpoint not written: the next start scans more of the newest file",
                            file=ticket.file, error=str(ticket.checkpoint_error))
            else:
                self._checkpoint_at = (ticket.file, ticket.checkpoint[0])
                self.checkpoints += 1
            self._checkpoint_time = time.monotonic()
        if not ticket.moves:
            return False
        self.horizon.advance(ticket.file, ticket.position, ticket.gtids, copy=False)
        return True

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
