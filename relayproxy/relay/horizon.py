"""The durable horizon: the end of the last complete, fsynced transaction, and the readers waiting on it.

Every reader of the relay (dump senders, status, the upstream session's reconnect logic) looks at one
``Horizon`` object, as Ripple's readers look at its "last complete position". The relay store is the
only writer: it calls ``advance`` after the bytes up to the new position are on disk. A snapshot is an
immutable value replaced wholesale on each advance (copy-on-advance), so a reader never sees a file
name from one advance with the position or GTID set of another.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class HorizonSnapshot:
    """One value of the horizon: ``(file, position)`` in master coordinates plus the GTID set there.

    ``gtids`` is a private copy (``GtidSet`` for MySQL, ``MariaBinlogState`` for MariaDB, ``None`` for a
    stream that has no GTIDs yet); treat it as read-only. ``seq`` increments on every advance, so
    ``wait_for_advance(snapshot.seq)`` waits for the next one. ``file`` is None only for a relay that
    has not received its first file. ``at`` is the ``time.monotonic()`` of the advance (0.0 for a
    value not made by one): the hop's send stage is measured from it (relay/hoptimes.py).
    """

    file: str | None
    position: int
    gtids: object
    seq: int
    at: float = field(default=0.0, compare=False)

    @property
    def text(self) -> str | None:
        """The GTID set as the server prints it on one line (MySQL ``uuid:1-5,uuid2:1-3``; MariaDB
        ``0-1-100,1-1-7``), or None without GTIDs."""
        gtids = self.gtids
        if gtids is None:
            return None
        fmt = getattr(gtids, "format", None)
        return fmt(",") if fmt is not None else str(gtids)

    @property
    def coordinates(self) -> tuple[str | None, int]:
        return (self.file, self.position)


def _copy_gtids(gtids):
    return None if gtids is None else gtids.copy()


class Horizon:
    """The single "last durable complete position" every reader waits on.

    ``advance`` may be called from any thread: waiters registered from an asyncio loop are woken in
    that loop (directly when ``advance`` runs on the loop's thread, through
    ``loop.call_soon_threadsafe`` otherwise). Waiting costs nothing while nothing happens: there is
    no polling, a waiter is one future.
    """

    def __init__(self, file: str | None = None, position: int = 0, gtids=None, *, seq: int = 0):
        self._lock = threading.Lock()
        self._snapshot = HorizonSnapshot(file, position, _copy_gtids(gtids), seq)
        # future -> its loop, for every task waiting for the next advance (a dict: leaving is O(1), which
        # matters with a thousand replicas waking for heartbeats at the horizon).
        self._waiters: dict[asyncio.Future, asyncio.AbstractEventLoop] = {}

    def snapshot(self) -> HorizonSnapshot:
        """The current value (a reference read: atomic, no copy)."""
        return self._snapshot

    @property
    def seq(self) -> int:
        return self._snapshot.seq

    def advance(self, file: str, position: int, gtids, *, copy: bool = True,
                at: float | None = None) -> HorizonSnapshot:
        """Publish a new durable position. Only the relay store calls this, after fsync (and a sender process,
        with the relay process's own ``at``: its time.monotonic() of the advance, the same clock in every process).

        ``gtids`` is copied (unless ``copy=False``: the caller hands over a private copy), so the
        caller may keep mutating its own set. Moving backwards inside one file is a bug in the
        caller (durable data never shrinks) and raises ValueError.
        """
        snapshot_gtids = _copy_gtids(gtids) if copy else gtids
        with self._lock:
            current = self._snapshot
            if file == current.file and position < current.position:
                raise ValueError(
                    f"horizon cannot move backwards in {file}: {current.position} -> {position}"
                )
            new = HorizonSnapshot(file, position, snapshot_gtids, current.seq + 1, time.monotonic() if at is None else at)
            self._snapshot = new
            waiters, self._waiters = self._waiters, {}
        if waiters:
            self._wake(waiters, new)
        return new

    @staticmethod
    def _wake(waiters, snapshot: HorizonSnapshot) -> None:
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for future, loop in waiters.items():
            if loop is here:
                if not future.done():
                    future.set_result(snapshot)
                continue
            try:
                loop.call_soon_threadsafe(_resolve, future, snapshot)
            except RuntimeError:
                pass  # that loop is closed: nobody is left to wake

    def add_waiter(self, after_seq: int, future: asyncio.Future) -> HorizonSnapshot | None:
        """Resolve ``future`` (created on the running loop) with the first snapshot past ``after_seq``: that
        snapshot now when the horizon is already past it (nothing is registered), else None and the future
        is resolved by the next ``advance``. The cheapest way to wait: one future, no task. A waiter that
        gives up calls ``discard_waiter``."""
        current = self._snapshot
        if current.seq > after_seq:
            return current
        loop = future.get_loop()
        with self._lock:
            current = self._snapshot  # it may have moved since the unlocked read
            if current.seq > after_seq:
                return current
            self._waiters[future] = loop
        return None

    def discard_waiter(self, future: asyncio.Future) -> None:
        with self._lock:
            self._waiters.pop(future, None)

    async def wait_for_advance(self, after_seq: int, timeout: float | None = None) -> HorizonSnapshot:
        """Return the first snapshot with ``seq > after_seq``, waiting for it if needed.

        On timeout the current snapshot is returned (its ``seq`` is still ``<= after_seq``), so a
        dump sender can send a heartbeat with the current position and wait again.
        """
        future = asyncio.get_running_loop().create_future()
        current = self.add_waiter(after_seq, future)
        if current is not None:
            return current
        try:
            if timeout is None:
                return await future
            try:
                return await asyncio.wait_for(future, timeout)
            except asyncio.TimeoutError:
                return self._snapshot
        finally:
            if not future.done() or future.cancelled():
                self.discard_waiter(future)

    @property
    def waiting(self) -> int:
        """Number of tasks currently waiting (status / tests)."""
        return len(self._waiters)


def _resolve(future: asyncio.Future, snapshot: HorizonSnapshot) -> None:
    if not future.done():
        future.set_result(snapshot)
