"""The relay store's sync pipeline: when to fsync (``SyncPolicy``), one fsync in flight (``SyncTicket``), and the
store's side of it (``SyncPipeline``: ``begin_sync`` / ``complete_sync``, the recovery checkpoints that ride on syncs).

A sync is: write the buffer, ``fdatasync``, record the durable mark, and only then advance the horizon to the last
complete boundary. The horizon never points inside a group and never past an fsync.

The session runs the fsync off the event loop: ``ticket = store.begin_sync()`` (writes the buffer),
``ticket.submit(executor)`` runs ``ticket.make_durable()`` in a worker thread (or ``ticket.submit_native(runner)``
in the C fsync thread, ``relay/fsyncer.py``), ``store.complete_sync(ticket)`` back on the loop publishes it; events
keep arriving, being parsed and written in between (the next batch's bytes go to the page cache while the previous
batch's fdatasync runs). At most one ticket is in flight. The ticket covers only bytes written before
``begin_sync`` (its position is the boundary then), so the horizon still moves only to fsynced boundaries.
Whatever must not overlap an fsync, i.e. closing or replacing the descriptor (``start_file``, ``close``),
truncating (``discard_incomplete``, ``write_filler``), ``begin_epoch`` and ``sync``, first waits for the ticket in
flight and publishes it (``_settle``).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from dataclasses import dataclass
from typing import Literal

from ..binlog import constants as C
from ..log import get_logger
from .checkpoint import CHECKPOINT_NAME, CHECKPOINT_TMP_NAME, CheckpointError, capture
from .durable import encode_durable_mark, write_file_atomically
from .errors import RelayStateError, RelayStoreFailed
from .fsyncer import NativeJob

log = get_logger(__name__)

__all__ = ["SyncPolicy", "SyncTicket", "SyncPipeline", "CHECKPOINT_BYTES", "CHECKPOINT_SECONDS"]

# A recovery checkpoint (relay/checkpoint.py) rides on a sync once the horizon has moved this far past the last
# one, or this long after it, and at close: two extra fsyncs (its file, the directory) per 16 MB or 10 s at most.
CHECKPOINT_BYTES = 16 << 20
CHECKPOINT_SECONDS = 10.0


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


class SyncPipeline:
    """The store's half of the sync pipeline, mixed into ``RelayStore`` (relay/store.py): a mixin, not an object of
    its own, so that ``begin_sync`` and the policy checks read the store's state without an indirection per call.

    It reads and moves the store's write state (``_file``, ``_fd``, ``_marks``, ``_written``, ``_synced``,
    ``_end``, ``_boundary``, ``_gtids``), the pending groups (``_pending_groups``, ``_pending_since``), the
    ticket in flight (``_ticket``) and the checkpoint state (``_checkpoint_*``, ``checkpoint_bytes``,
    ``checkpoint_seconds``); it calls the store's ``_check``, ``_flush`` and ``_fail``.
    """

    @property
    def sync_deadline(self) -> float | None:
        """``time.monotonic()`` value by which ``maybe_sync`` should be called (batch mode), or None."""
        if self._pending_since is None:
            return None
        if self.sync_policy.mode == "transaction":
            return self._pending_since
        return self._pending_since + self.sync_policy.max_delay

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
