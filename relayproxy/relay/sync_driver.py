"""The event loop's half of the sync pipeline: at most one sync ticket in flight, run in the fsync thread while the
loop goes on receiving, and published once it has ended.

The store's half is ``relay/sync.py`` (``begin_sync`` describes the fsync, ``complete_sync`` moves the horizon); the
thread is ``relay/fsyncer.py``'s (C when built), whose eventfd the loop watches. A ticket that also writes a
recovery checkpoint runs its ``make_durable`` in a one-thread pool instead. ``SyncDriver`` owns both and the
flight: the upstream session calls ``step`` after each batch, waits on ``waiter`` beside its read, ``drain`` at
the end of a round, and ``close`` when it stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import TYPE_CHECKING, Callable

from ..log import get_logger
from . import fsyncer

if TYPE_CHECKING:
    from .hoptimes import HopTimes
    from .store import RelayStore
    from .sync import SyncTicket

log = get_logger(__name__)

__all__ = ["ON_LOOP_AUTO_MAX", "ON_LOOP_BACKOFF", "ON_LOOP_SLOW", "SyncDriver", "horizon_covers"]

ON_LOOP_SLOW = 0.02  # seconds: an fdatasync on the loop this long held every client of the loop as long
ON_LOOP_BACKOFF = 60.0  # seconds the syncs go to the fsync thread after such a one
# on_loop "auto": the syncs run on the loop while the moving average of the recent fdatasyncs (either way) stays
# under this, and in the fsync thread otherwise; FSYNC_AVERAGE_WEIGHT is the newest sync's weight in the average.
ON_LOOP_AUTO_MAX = 0.002
FSYNC_AVERAGE_WEIGHT = 0.1


class SyncDriver:
    """One sync in flight at a time for a store written from the event loop. ``on_advance`` is called each time a
    published sync moved the horizon. The store is passed to each call: the session may reopen it between rounds.
    ``hop``, when given, hears when each sync begins and when its end is published (relay/hoptimes.py).
    ``on_loop``: run the fdatasync on the loop's thread (``sync_on_loop``), as long as they stay fast; ``"auto"``:
    on the loop while the recent fdatasyncs average under ``ON_LOOP_AUTO_MAX``, in the fsync thread otherwise and
    before the first one has been timed."""

    def __init__(self, on_advance: Callable[[], None] | None = None, hop: HopTimes | None = None, *,
                 on_loop: bool | str = False) -> None:
        self.on_advance = on_advance
        self.hop = hop
        # sync_on_loop: the fdatasync runs on the event loop's own thread, saving the two thread hand-offs of the
        # fsync thread (hoptimes' fsync_handoff) while the loop waits for the disk. One that took longer than
        # ON_LOOP_SLOW sends the next syncs to the fsync thread for ON_LOOP_BACKOFF seconds.
        if on_loop not in (True, False, "auto"):
            raise ValueError(f"on_loop is True, False or 'auto', not {on_loop!r}")
        self.on_loop = on_loop
        self.on_loop_paused_until = 0.0
        self.on_loop_pauses = 0
        self.fsync_average: float | None = None  # moving average of the fdatasyncs published (seconds)
        # fdatasyncs of relay data begun on the loop's thread, and in the fsync thread or the pool (a ticket with
        # nothing new since the last one writes at most the durable mark and counts on neither side)
        self.syncs_on_loop = 0
        self.syncs_off_loop = 0
        self._flight: tuple[SyncTicket, asyncio.Future] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._native: fsyncer.NativeFsync | None = None  # the fsync thread, started at the first native sync
        self._native_flight: tuple[SyncTicket, asyncio.Future] | None = None  # its ticket out, and the future

    @property
    def waiter(self) -> asyncio.Future | None:
        """The future that ends when the sync in flight has run (the stream loop waits on it); None when none is."""
        flight = self._flight
        return None if flight is None else flight[1]

    def describe(self) -> dict[str, object]:
        """Where the syncs run (``sync_on_loop``): the setting, whether the next one runs on the loop's thread (auto
        follows the recent fdatasyncs; a slow one pauses it), the counts each way, the pauses and the average that
        auto reads (GET /status, /metrics; docs/metrics.md)."""
        average = self.fsync_average
        return {
            "setting": self.on_loop if isinstance(self.on_loop, str) else str(self.on_loop).lower(),
            "on_loop_now": self._sync_here() and time.monotonic() >= self.on_loop_paused_until,
            "syncs_on_loop": self.syncs_on_loop,
            "syncs_off_loop": self.syncs_off_loop,
            "on_loop_pauses": self.on_loop_pauses,
            "fsync_average_seconds": None if average is None else round(average, 6),
        }

    def step(self, store: RelayStore) -> None:
        """Publish the sync in flight once it has ended, and start the next when the store's policy asks for one
        (it runs in the fsync thread while the loop goes on). A failed fsync raises its OSError."""
        flight = self._flight
        if flight is not None and flight[0].done:
            self._flight = None
            self._publish(store, flight[0])
            flight = None
        if flight is None and store.sync_due():
            ticket, future = self._flight = self._start(store)
            if future.done():  # it ran on the loop (on_loop): publish it now
                self._flight = None
                self._publish(store, ticket)

    async def drain(self, store: RelayStore) -> None:
        """The end of a round: wait for the sync in flight and publish it, then make durable what has completed
        since (one more sync), as the round's next batch would have."""
        flight, self._flight = self._flight, None
        if flight is not None:
            await asyncio.wait((flight[1],))
            self._publish(store, flight[0])
        if store.failure is None and store.sync_due():
            ticket, future = self._flight = self._start(store)
            try:
                await asyncio.wait((future,))
            finally:
                self._flight = None
            self._publish(store, ticket)

    def forget(self) -> None:
        """The round ended without a drain (cancelled): the sync in flight is left to the store, whose
        ``discard_incomplete`` and ``close`` wait for it."""
        self._flight = None

    def close(self) -> None:
        """Stop the fsync thread (a sync out ends first) and the pool; a second call does nothing. Called on the
        event loop once no round runs (the store has waited for every sync of the rounds)."""
        self._flight = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        native, self._native = self._native, None
        if native is not None:
            try:
                asyncio.get_running_loop().remove_reader(native.fileno())
            except (RuntimeError, ValueError):
                pass
            native.close()

    # -- the two ways a sync runs ---------------------------------------------------------------------------------
    def _start(self, store: RelayStore) -> tuple[SyncTicket, asyncio.Future]:
        """Begin the store's next sync and run it in the fsync thread, or in the pool for a ticket that also writes
        a recovery checkpoint. The future ends with the run."""
        ticket = store.begin_sync()
        if self.hop is not None:
            self.hop.sync_began(time.monotonic())
        if self._sync_here() and ticket.checkpoint is None and time.monotonic() >= self.on_loop_paused_until:
            self.syncs_on_loop += ticket.needs_fsync
            future = asyncio.get_running_loop().create_future()
            try:
                ticket.make_durable()  # the fdatasync on this thread: no hand-off to the fsync thread and back
            except OSError:
                pass  # kept in ticket.error (the store has failed): _publish raises it
            if ticket.fsync_seconds >= ON_LOOP_SLOW:
                self.on_loop_paused_until = time.monotonic() + ON_LOOP_BACKOFF
                self.on_loop_pauses += 1
                # Asked for (true): a warning. Chosen by auto: its own call, counted in on_loop_pauses (debug).
                report = log.warning if self.on_loop is True else log.debug
                report("an fdatasync on the event loop was slow: syncs run in the fsync thread for a while",
                       seconds=round(ticket.fsync_seconds, 4), backoff_seconds=ON_LOOP_BACKOFF)
            future.set_result(None)
            return ticket, future
        self.syncs_off_loop += ticket.needs_fsync
        if ticket.checkpoint is None:
            native = self._native_fsync()
            future = asyncio.get_running_loop().create_future()
            ticket.submit_native(native)
            self._native_flight = (ticket, future)
            return ticket, future
        future = asyncio.wrap_future(ticket.submit(self._executor()))
        future.add_done_callback(_retrieved)
        return ticket, future

    def _sync_here(self) -> bool:
        """Whether the next sync runs on the loop's thread (before the slow-sync backoff, which ``_start`` checks)."""
        if self.on_loop == "auto":
            average = self.fsync_average  # none yet: the disk is unknown, so its first sync does not hold the loop
            return average is not None and average < ON_LOOP_AUTO_MAX
        return bool(self.on_loop)

    def _native_fsync(self) -> fsyncer.NativeFsync:
        native = self._native
        if native is None:
            loop = asyncio.get_running_loop()

            def waited(_job: fsyncer.NativeJob) -> None:
                """A store operation waited for the run: the eventfd may say nothing of it."""
                try:
                    loop.call_soon_threadsafe(self._resolve_flight)
                except RuntimeError:  # the loop is closed: nothing waits on the flight any more
                    pass

            native = self._native = fsyncer.NativeFsync(on_waited=waited)
            loop.add_reader(native.fileno(), self._native_ready)
        return native

    def _native_ready(self) -> None:
        """The eventfd of the fsync thread is readable: complete the ticket and wake the stream loop."""
        native = self._native
        if native is not None:
            native.collect()
        self._resolve_flight()

    def _resolve_flight(self) -> None:
        flight = self._native_flight  # (not self._flight: drain takes that over while it waits)
        if flight is not None and flight[0].done:
            self._native_flight = None
            if not flight[1].done():
                flight[1].set_result(None)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="relay-fsync")
        return self._pool

    def _publish(self, store: RelayStore, ticket: SyncTicket) -> None:
        """The sync of ``ticket`` has ended: publish it (the horizon moves; a store operation that waited for it
        may have done so already). A failed fsync raises its OSError (the store has failed)."""
        if ticket.error is not None:
            raise ticket.error
        advanced = store.complete_sync(ticket)
        if ticket.fsync_seconds:
            average = self.fsync_average
            self.fsync_average = ticket.fsync_seconds if average is None else (
                average + FSYNC_AVERAGE_WEIGHT * (ticket.fsync_seconds - average))
        if self.hop is not None:  # when the horizon moved for it: now, or when a store operation published it
            self.hop.sync_published(store.horizon.snapshot().at or time.monotonic(), ticket.fsync_seconds)
        if advanced and self.on_advance is not None:
            self.on_advance()


def horizon_covers(store: RelayStore, file: str, position: int) -> bool:
    """Whether the durable horizon has reached ``position`` of ``file`` (what a semi-sync ACK may say)."""
    horizon = store.horizon.snapshot()
    if horizon.file == file:
        return horizon.position >= position
    # An older file: start_file synced it before the relay moved on (a rotation in the same batch).
    files = store.files()
    return file in files and horizon.file in files and files.index(file) < files.index(horizon.file)


def _retrieved(future: asyncio.Future) -> None:
    """Done-callback of a pool run's future: its error reaches the driver through the ticket, not here."""
    if not future.cancelled():
        future.exception()
