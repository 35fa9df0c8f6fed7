"""The relay store's sync pipeline: when to fsync (``SyncPolicy``), one fsync in flight (``SyncTicket``), and the
store's side of it (``SyncPipeline``, an object the store holds: ``begin_sync`` / ``complete_sync``, the recovery
checkpoints that ride on syncs).

A sync is: write the buffer, ``fdatasync``, record the durable mark, and only then advance the horizon to the last
complete boundary. The horizon never points inside a group and never past an fsync.

The session's SyncDriver (relay/sync_driver.py) runs the fsync off the event loop: ``ticket =
store.begin_sync()`` (writes the buffer), ``ticket.submit(executor)`` runs ``ticket.make_durable()`` in a worker thread (or ``ticket.submit_native(runner)``
in the C fsync thread, ``relay/fsyncer.py``), ``store.complete_sync(ticket)`` back on the loop publishes it; events
keep arriving, being parsed and written in between (the next batch's bytes go to the page cache while the previous
batch's fdatasync runs). At most one ticket is in flight. The ticket covers only bytes written before
``begin_sync`` (its position is the boundary then), so the horizon still moves only to fsynced boundaries.
Whatever must not overlap an fsync, i.e. closing or replacing the descriptor (``start_file``, ``close``),
truncating (``discard_incomplete``, ``write_filler``), ``begin_epoch`` and ``sync``, first waits for the ticket in
flight and publishes it (``SyncPipeline.settle``).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, cast

from ..binlog import constants as C
from ..log import get_logger
from .checkpoint import CHECKPOINT_NAME, CHECKPOINT_TMP_NAME, CheckpointError, capture
from .durable import DurableMarkWriter, encode_durable_mark, write_file_atomically
from .errors import RelayStateError, RelayStoreFailed
from .fsyncer import NativeJob
from .horizon import Horizon, HorizonSnapshot
from .write_state import Gtids, WriteState

if TYPE_CHECKING:
    from .epochs import Epochs

log = get_logger(__name__)

__all__ = ["SyncPolicy", "SyncTicket", "SyncPipeline", "CHECKPOINT_BYTES", "CHECKPOINT_SECONDS"]

# A recovery checkpoint (relay/checkpoint.py) rides on a sync once the horizon has moved this far past the last
# one, or this long after it, and at close: two extra fsyncs (its file, the directory) per 16 MB or 10 s at most.
CHECKPOINT_BYTES = 16 << 20
CHECKPOINT_SECONDS = 10.0


@dataclass(frozen=True)
class SyncPolicy:
    """When the store fsyncs, i.e. how far the durable horizon may lag the received stream.

    ``transaction`` (default): a sync is due whenever the stream reached a new boundary since the last
    fsync. Asked once per batch read from the socket (relay/sync_driver.py), every group that arrived in
    that batch shares one fsync (group commit): at low load one fsync per transaction, at high load one
    per network read. Replicas see a transaction as soon as it is durable; the cost is the fsync rate.

    ``batch``: fsync once ``max_transactions`` groups are pending, or ``max_delay`` seconds after the
    first pending boundary, whichever comes first (the session's driver begins a sync when
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
    """The store's half of the sync pipeline, an object ``RelayStore`` (relay/store.py) holds: the policy, the
    ticket in flight, the fsync count and the recovery checkpoints that ride on syncs.

    It reads and moves the store's write state (``WriteState``, relay/write_state.py: the current file, its
    descriptor and offsets, the pending groups), writes the durable mark (``marks``) and advances the
    ``horizon``; ``epochs()`` is the store's current epochs value (a checkpoint records it).
    """

    def __init__(self, state: WriteState, horizon: Horizon, marks: DurableMarkWriter, policy: SyncPolicy, *,
                 epochs: Callable[[], Epochs], on_fsync: Callable[[float, int], None] | None = None,
                 checkpoint_offset: int | None = None):
        self._w = state
        self.horizon = horizon
        self._marks = marks
        self.policy = policy
        self._epochs = epochs
        self.on_fsync = on_fsync  # called as on_fsync(seconds, bytes) after each fdatasync of relay data
        self.ticket: SyncTicket | None = None  # the one in flight
        self.fsyncs = 0
        self.fsyncs_inline = 0  # of those, the ones sync_now ran itself (a rotation, an epoch switch, a stop)
        self.unsynced_cut: tuple[str, int] | None = None  # (file, length) to cut to after a failed fsync
        # The last recovery checkpoint: (file, offset) and when (relay/checkpoint.py).
        self.checkpoint_at: tuple[str | None, int] = (state.file, checkpoint_offset) \
            if checkpoint_offset is not None else (None, 0)
        self.checkpoint_time = time.monotonic()
        self.checkpoint_force = False  # the next sync leaves a checkpoint whatever the distance (a clean stop)
        self.checkpoint_bytes = CHECKPOINT_BYTES
        self.checkpoint_seconds = CHECKPOINT_SECONDS
        self.checkpoints = 0  # checkpoints written

    @property
    def sync_deadline(self) -> float | None:
        """``time.monotonic()`` value by which a sync is due (batch mode: the session's driver begins one), or None."""
        since = self._w.pending_since
        if since is None:
            return None
        if self.policy.mode == "transaction":
            return since
        return since + self.policy.max_delay

    def sync_due(self, now: float | None = None) -> bool:
        """Whether the policy asks for a sync now (``now`` is ``time.monotonic()``)."""
        w = self._w
        since = w.pending_since
        if since is None:
            return False
        policy = self.policy
        if policy.mode == "transaction" or w.pending_groups >= policy.max_transactions:
            return True
        if now is None:
            now = time.monotonic()
        return now - since >= policy.max_delay

    def sync(self) -> bool:
        """Write everything, fsync, move the horizon to the last boundary; returns whether it moved."""
        self._w.check()
        self.settle()
        if self._w.fd < 0:
            return False
        return self.sync_now()

    def settle(self) -> None:
        """Wait for the ticket in flight, if any (blocking: its fsync is running in a worker thread, or
        runs here when it was never submitted) and publish it. Raises like ``complete_sync`` when its
        fsync failed (the store has failed then)."""
        ticket = self.ticket
        if ticket is None:
            return
        ticket.wait()
        self.complete_sync(ticket)

    def sync_now(self) -> bool:
        """Begin a sync, make it durable here (blocking) and publish it; returns whether the horizon moved."""
        ticket = self.begin_sync()
        ticket.make_durable()  # an OSError has failed the store and ended the ticket
        moved = self.complete_sync(ticket)
        if ticket.needs_fsync:
            self.fsyncs_inline += 1
        return moved

    def begin_sync(self) -> SyncTicket:
        """Write the buffer out and describe the fsync that makes it durable (see the module doc)."""
        w = self._w
        w.check()
        if self.ticket is not None:
            raise RelayStateError("a sync is already in flight")
        if w.fd < 0 or w.file is None:
            raise RelayStateError("nothing to sync: there is no current relay file")
        try:
            w.flush()
        except OSError as exc:
            w.fail(exc)
            raise
        snap = self.horizon.snapshot()
        moves = snap.file != w.file or snap.position != w.boundary
        need_fsync = w.written != w.synced
        gtids = None if (w.gtids is None or not moves) else w.gtids.copy()
        ticket = SyncTicket(
            w.file, w.boundary, gtids, moves, w.fd, self._marks, w.written, need_fsync, self._ticket_failed,
            max(w.written - w.synced, 0),
        )
        ticket.checkpoint = self._checkpoint_due(snap, ticket)
        self.ticket = ticket
        w.pending_groups = 0
        w.pending_since = None
        return ticket

    def _checkpoint_due(self, snap: HorizonSnapshot, ticket: SyncTicket) -> tuple[int, Callable[[int], None]] | None:
        """``(position, write(fd))`` of the recovery checkpoint this sync should leave, or None.

        Due once the horizon is ``checkpoint_bytes`` past the last checkpoint, ``checkpoint_seconds`` after
        it, or at close. Only where the file's own GTID state is the store's: not in a join file (its set
        starts with the join set) nor in a file that carries the previous file's set (no set event yet)."""
        w = self._w
        file = w.file
        fde = w.fde
        if fde is None or file is None or snap.file not in (None, file):
            return None
        position = ticket.position if ticket.moves else snap.position
        last_file, last_offset = self.checkpoint_at
        if position <= 4 + C.HEADER_LEN or (last_file == file and last_offset == position):
            return None
        if not self.checkpoint_force:
            moved = position - (last_offset if last_file == file else 0)
            if moved < self.checkpoint_bytes and time.monotonic() - self.checkpoint_time < self.checkpoint_seconds:
                return None
        epochs = self._epochs()
        if w.start_set_seen:
            if epochs.join_epoch(file) is not None:
                return None
        elif w.carried_gtids is not None:
            return None
        at_horizon = cast("Gtids | None", ticket.gtids if ticket.moves else snap.gtids)
        gtids = None if at_horizon is None else at_horizon.copy()
        start = None if w.file_start_gtids is None else w.file_start_gtids.copy()
        if not position == w.boundary == w.end:
            return None  # a group is open: the type of the event ending at the boundary is not known here
        last_type = w.last_type
        if last_type is None or last_type == C.ROTATE_EVENT:
            return None  # a closed file: the next start reads only its ROTATE anyway
        rotate = None
        relay_dir = w.relay_dir

        def write(fd: int) -> None:
            cp = capture(fd, file=file, offset=position, fde=fde, start_gtids=start, gtids=gtids,
                         last_type=last_type, rotate_to=rotate, epochs=epochs)
            write_file_atomically(relay_dir / CHECKPOINT_NAME, cp.encode(), tmp=relay_dir / CHECKPOINT_TMP_NAME)

        return position, write

    def _ticket_failed(self, ticket: SyncTicket, exc: OSError) -> None:
        # May run in the worker thread: only plain attribute stores.
        w = self._w
        w.fail(exc)
        if ticket.needs_fsync and ticket.file == w.file:
            # After a failed fsync the written bytes may sit in the page cache without being on disk
            # (Linux marks them clean): recovery would read them back and trust them. close() cuts
            # the file to the last successful fsync first; the master re-sends the rest.
            self.unsynced_cut = (ticket.file, w.synced)
        if self.ticket is ticket:
            self.ticket = None

    def complete_sync(self, ticket: SyncTicket) -> bool:
        """Publish what ``ticket`` made durable: the horizon moves (and wakes its readers)."""
        if ticket.error is not None:
            raise RelayStoreFailed(f"fsync of {ticket.file} failed: {ticket.error}") from ticket.error
        if ticket.completed:
            return ticket.moves  # already published (a rotation or a truncation waited for it)
        if ticket is not self.ticket:
            raise RelayStateError("complete_sync with a ticket that is not the one in flight")
        self.ticket = None
        w = self._w
        if not ticket.durable:
            w.pending_since = w.pending_since or time.monotonic()  # still to be synced
            raise RelayStateError("complete_sync before the ticket's make_durable() finished")
        ticket.completed = True
        if ticket.needs_fsync:
            self.fsyncs += 1
            if ticket.file == w.file:
                w.synced = max(w.synced, min(ticket._synced_end, w.end))
            if self.on_fsync is not None:
                self.on_fsync(ticket.fsync_seconds, ticket.fsync_bytes)
        if ticket.checkpoint is not None:
            if ticket.checkpoint_error is not None:
                log.warning("relay checkpoint not written: the next start scans more of the newest file",
                            file=ticket.file, error=str(ticket.checkpoint_error))
            else:
                self.checkpoint_at = (ticket.file, ticket.checkpoint[0])
                self.checkpoints += 1
            self.checkpoint_time = time.monotonic()
        if not ticket.moves:
            return False
        self.horizon.advance(ticket.file, ticket.position, ticket.gtids, copy=False)
        return True
