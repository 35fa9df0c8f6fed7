"""Replicas at the horizon, served from the advance itself: one pass per advance, no task woken per replica.

A dump that has sent everything durable of the horizon's file parks here (``Followers.park``) instead of waiting
on the horizon by itself. When the horizon advances, one callback on the loop (``_on_advance``) asks each parked
dump to take the new range at once (``DumpSender._follow``): the range is read once from the page cache into a
shared chunk (chunks.py, through the same cache and key as the ordinary path), and each dump that needs nothing
done to it and whose socket has room gets its framed packets written there and then, numbered from its own
sequence id (one framing shared by the dumps at the same sequence id). Such a dump stays parked: a hundred
replicas at the horizon cost one pass of plain calls per advance, not a hundred task wake-ups, coroutine chains
and ``await``s.

Anything else wakes the dump's own task, which takes the ordinary path (``DumpSender._send_file``): a new file, a
range that holds something to skip, rewrite or leave out event by event, a range larger than a shared chunk, a
read that would block, a socket above its high-water mark (the task then waits for it with the write timeout), a
replica gone. Both paths send the same bytes, and both send only ``[position, snapshot.position)`` of a snapshot
the horizon published: nothing past the durable mark.

One ``Followers`` per horizon object and event loop (the relay process and every sender process have their own).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import TYPE_CHECKING, Any

from ...log import get_logger
from .. import sendbatch

if TYPE_CHECKING:
    from ...relay.hoptimes import HopTimes
    from ...relay.horizon import Horizon, HorizonSnapshot

log = get_logger("relayproxy.downstream.dump")

# What ``DumpSender._follow`` did with an advance.
WAKE, STAY, SENT = 0, 1, 2  # its task must take over; nothing new for it (still parked); written (still parked)


class Pass:
    """What the dumps of one pass share, so that each dump at the horizon costs a socket write and a few
    assignments (the per-replica work the pass exists to save): ``chunks`` the chunk of a range (by the ordinary
    path's key), ``plain`` whether a chunk needs nothing done for dumps of one kind (by the chunk and what
    ``_plain_chunk`` looks at, for dumps with no GTID set to skip and no MariaDB domain still looking for its start),
    ``framings`` a chunk's framing from one sequence id, and the clocks read once for the pass."""

    __slots__ = ("chunks", "plain", "framings", "monotonic", "wall", "sends", "queued", "rests")

    def __init__(self, batch: bool = False) -> None:
        self.chunks: dict = {}
        self.plain: dict = {}
        self.framings: dict = {}
        self.monotonic = time.monotonic()
        self.wall = time.time()
        # The writes gathered for one batch (sendbatch.py; None: each channel writes through its transport):
        # (fd, data) for the batch, and (channel, data, pieces, total, dump) to hand what a socket left back.
        self.sends: list | None = [] if batch else None
        self.queued: list = []
        self.rests = 0  # batch writes a socket took only part of (the rest went to its transport)

    def flush(self) -> list:
        """Write the gathered writes; returns the dumps whose channel cannot take another write now (a socket that
        took only part: the transport holds the rest above its high-water mark, or reports the error)."""
        sends, queued = self.sends, self.queued
        if not sends:
            return []
        self.sends, self.queued = [], []
        try:
            results = sendbatch.send(sends, sendbatch.THREADS)
        except Exception as exc:  # nothing of the batch was written (its checks come before any write)
            log.error("the shared pass's batch write failed; its writes go through the transports", error=repr(exc))
            results = [-1] * len(sends)
        blocked = []
        for (channel, data, pieces, total, dump), taken in zip(queued, results):
            if taken != total:
                self.rests += 1
                if not channel.write_rest(data, pieces, taken):
                    blocked.append(dump)
        return blocked


class Followers:
    """The dumps parked at one horizon (``parked``: dump -> the future its task waits on)."""

    def __init__(self, horizon: "Horizon", loop: asyncio.AbstractEventLoop, hop: "HopTimes | None" = None):
        self.horizon = horizon
        self.loop = loop
        self.hop = hop  # the hop's send stage, observed once per pass for the dumps it wrote (relay/hoptimes.py)
        self.parked: dict[Any, asyncio.Future] = {}
        self._listening: asyncio.Future | None = None
        self._seen = horizon.seq
        # Counters (tests, benchmarks): passes run, ranges written by a pass, dumps woken to their own path.
        self.passes = 0
        self.written = 0
        self.woken = 0
        self.batched = 0  # writes made by one batch call (sendbatch.py) instead of each transport
        self.partial = 0  # of those, the ones a socket took only part of (the rest went to its transport)

    def park(self, dump: Any, seq: int, future: asyncio.Future) -> bool:
        """Park ``dump`` (its task awaits ``future``) until the horizon passes ``seq`` with something it cannot take
        in a pass. False when the horizon is past ``seq`` already: the dump goes on by itself."""
        if self.horizon.seq > seq:
            return False
        self.parked[dump] = future
        if self._listening is None:
            self._seen = seq  # (the horizon's seq now: it is not past it)
            self._listen()
        return True

    def unpark(self, dump: Any) -> None:
        self.parked.pop(dump, None)

    def _listen(self) -> None:
        future = self.loop.create_future()
        self._listening = future
        current = self.horizon.add_waiter(self._seen, future)
        if current is not None:
            future.set_result(current)
        future.add_done_callback(self._on_advance)

    def _on_advance(self, future: asyncio.Future) -> None:
        self._listening = None
        if future.cancelled():
            return
        snapshot: HorizonSnapshot = self.horizon.snapshot()  # the newest published value, whatever woke us
        self._seen = snapshot.seq
        parked = self.parked
        if parked:
            self.passes += 1
            shared = Pass(sendbatch.available())
            sent = 0
            for dump, waiter in list(parked.items()):
                if waiter.done():
                    continue  # woken already (timer, replica gone): its task unparks it
                try:
                    outcome = dump._follow(snapshot, shared)
                except Exception as exc:  # a bug in one dump's pass must not stall the others: its task takes over
                    log.error("a dump at the horizon failed in the shared pass; it continues by itself",
                              error=repr(exc))
                    outcome = WAKE
                if outcome == SENT:
                    self.written += 1
                    sent += 1
                    continue
                if outcome == STAY:
                    continue
                del parked[dump]
                self.woken += 1
                waiter.set_result(snapshot)
            if shared.sends:
                self.batched += len(shared.sends)
                for dump in shared.flush():  # above the high-water mark now: its task drains
                    draining = parked.pop(dump, None)
                    if draining is not None and not draining.done():
                        self.woken += 1
                        draining.set_result(snapshot)
                self.partial += shared.rests
            if self.hop is not None and snapshot.at:
                self.hop.sent(time.monotonic() - snapshot.at, sent)
        if parked:
            self._listen()


_followers: "weakref.WeakKeyDictionary[Any, Followers]" = weakref.WeakKeyDictionary()


def describe(horizon: "Horizon") -> dict[str, int]:
    """What /status shows of the dumps parked at ``horizon`` in this process (all zeros before any parked)."""
    followers = _followers.get(horizon)
    if followers is None:
        return {"parked": 0, "passes": 0, "written": 0, "woken": 0, "batched": 0, "partial": 0}
    return {"parked": len(followers.parked), "passes": followers.passes, "written": followers.written,
            "woken": followers.woken, "batched": followers.batched, "partial": followers.partial}


def followers_of(horizon: "Horizon", hop: "HopTimes | None" = None) -> Followers:
    """The Followers of ``horizon`` on the running loop (``hop``: where a new one reports its send stage)."""
    loop = asyncio.get_running_loop()
    followers = _followers.get(horizon)
    if followers is None or followers.loop is not loop:
        followers = Followers(horizon, loop, hop)
        _followers[horizon] = followers
    return followers
