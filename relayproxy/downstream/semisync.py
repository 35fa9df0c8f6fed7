"""Semi-sync toward the relay's replicas: which position each has acknowledged, relay-wide, so the upstream
session can wait for N of them before it ACKs the master."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any


class SemiSyncTracker:
    """Which position each semi-sync replica has acknowledged, relay-wide.

    The upstream session uses it to wait for N downstream replicas before the relay sends its own
    ACK to the master: ``await tracker.wait_for(file, end_pos, n, timeout)`` after the transaction
    ending at ``(file, end_pos)`` is durable. An ACK for ``(file, pos)`` means the replica has
    everything up to there; positions compare by binlog file sequence number, then offset (MySQL's
    ``ActiveTranx::compare`` compares names then positions).
    """

    def __init__(self) -> None:
        self._acked: dict[Hashable, tuple[tuple, str, int]] = {}
        self._registered: set[Hashable] = set()
        self._waiters: list[tuple[tuple, int, asyncio.Future]] = []

    @property
    def replicas(self) -> int:
        """Semi-sync replicas currently dumping (a caller may stop waiting when fewer than N are connected)."""
        return len(self._registered)

    def register(self, replica: Hashable) -> None:
        self._registered.add(replica)

    def forget(self, replica: Hashable) -> None:
        """The replica's dump ended: its ACKs no longer count."""
        self._registered.discard(replica)
        self._acked.pop(replica, None)

    def acked(self, file: str, pos: int, replica: Hashable = None) -> None:
        """Record an ACK; positions only move forward per replica, and satisfied waiters wake."""
        key = _position_key(file, pos)
        current = self._acked.get(replica)
        if current is not None and current[0] >= key:
            return
        self._acked[replica] = (key, file, pos)
        if not self._waiters:
            return
        still = []
        for target, n, future in self._waiters:
            if future.done():
                continue
            if self._count_key(target) >= n:
                future.set_result(True)
            else:
                still.append((target, n, future))
        self._waiters = still

    def last_ack(self, replica: Hashable) -> tuple[str, int] | None:
        entry = self._acked.get(replica)
        return None if entry is None else (entry[1], entry[2])

    def count(self, file: str, pos: int) -> int:
        """Replicas that acknowledged ``(file, pos)`` or later."""
        return self._count_key(_position_key(file, pos))

    def _count_key(self, target: tuple) -> int:
        return sum(1 for key, _f, _p in self._acked.values() if key >= target)

    async def wait_for(self, file: str, pos: int, n: int, timeout: float | None = None) -> bool:
        """True once ``n`` replicas acknowledged ``(file, pos)``; False when ``timeout`` passes first."""
        target = _position_key(file, pos)
        if n <= 0 or self._count_key(target) >= n:
            return True
        future = asyncio.get_running_loop().create_future()
        entry = (target, n, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            try:
                self._waiters.remove(entry)
            except ValueError:
                pass


def semi_sync_tracker(ctx: Any) -> SemiSyncTracker:
    """The relay-wide tracker, kept on the context (``ctx.semi_sync``); created on first use."""
    tracker = getattr(ctx, "semi_sync", None)
    if not isinstance(tracker, SemiSyncTracker):
        tracker = SemiSyncTracker()
        ctx.semi_sync = tracker
    return tracker


def _position_key(file: str, pos: int) -> tuple:
    base, dot, ext = file.rpartition(".")
    if dot and ext.isdigit():
        return (base, int(ext), pos)
    return (file, -1, pos)
