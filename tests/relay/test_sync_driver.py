"""The event loop's half of the sync pipeline (relay/sync_driver.py), driven without an upstream session: a real
store in a temporary directory, events fed as the receiver feeds them, the fsync thread held on an Event.

What must hold: a sync runs in the fsync thread (or the pool, for a ticket that writes a recovery checkpoint) while
the loop goes on, and the horizon moves only when the driver publishes it; ``drain`` waits for the sync in flight
and makes durable what completed since; ``close`` stops the thread, and again does nothing; a failed fsync raises
its OSError from the call that would have published it, the store failed, the horizon where it was."""

from __future__ import annotations

import asyncio
import errno
import os
import threading

import pytest

from relayproxy.relay import fsyncer
from relayproxy.relay.errors import RelayStoreError, RelayStoreFailed
from relayproxy.relay.sync_driver import SyncDriver, horizon_covers

from ..support.fakemaster import split_events
from .test_relay_store import Feeder, fresh_store, mysql_image

WAIT = 30  # seconds: a bound on waiting for a condition, never a speed assertion


class HeldWorker(fsyncer.PyWorker):
    """The Python fsync thread, counting its jobs; a job waits for ``release`` while ``hold`` is set."""

    made: list["HeldWorker"] = []
    hold = threading.Event()
    release = threading.Event()
    entered = threading.Event()

    def __init__(self) -> None:
        super().__init__()
        self.jobs = 0
        HeldWorker.made.append(self)

    def run_job(self, fd, mark_fd, mark):
        self.jobs += 1
        if HeldWorker.hold.is_set():
            HeldWorker.entered.set()
            assert HeldWorker.release.wait(WAIT), "the held fsync was never released"
        return fsyncer.PyWorker.run_job(self, fd, mark_fd, mark)


@pytest.fixture
def worker(monkeypatch):
    """The fsync thread the driver starts is a ``HeldWorker`` (not held unless a test says so)."""
    HeldWorker.made = []
    for event in (HeldWorker.hold, HeldWorker.release, HeldWorker.entered):
        event.clear()
    monkeypatch.setattr(fsyncer, "new_worker", HeldWorker)
    yield HeldWorker
    HeldWorker.release.set()


class Stream:
    """A store fed group by group, as the receiver feeds it, without syncing (the driver does)."""

    def __init__(self, tmp_path, *, groups: int = 9, checkpoints: bool = False):
        self.store = fresh_store(tmp_path)
        # A recovery checkpoint is due at every sync (the pool's path), or never (the fsync thread's).
        self.store.checkpoint_bytes = 0 if checkpoints else 1 << 40
        self.store.checkpoint_seconds = 0 if checkpoints else 1e9
        self.image = mysql_image(groups=groups, rotate=False)
        self.events = split_events(self.image)
        self.feeder = Feeder(self.store, sync_each_event=False)
        self.fed = 0

    def feed_until(self, end: int) -> None:
        """Every event that ends at or before ``end`` (a group's end)."""
        while self.fed < len(self.events) and self.events[self.fed][0] + len(self.events[self.fed][1]) <= end:
            self.feeder.feed(*self.events[self.fed])
            self.fed += 1

    @property
    def horizon(self) -> int:
        return self.store.horizon.snapshot().position


def ends_of(stream: Stream) -> list[int]:
    """The boundaries of the whole image, fed into a throw-away parser (the stream itself is fed step by step)."""
    from relayproxy.binlog import boundary as B

    parser, ends = B.TransactionBoundaryParser(), []
    for offset, ev in stream.events:
        if parser.feed_event(ev, 0) & B.RESULT_MASK in (B.GROUP_END, B.EVENT_OUTSIDE):
            ends.append(offset + len(ev))
    return ends


async def ended(driver: SyncDriver) -> None:
    waiter = driver.waiter
    assert waiter is not None, "no sync in flight"
    await asyncio.wait((waiter,), timeout=WAIT)  # as the session waits: an error is the ticket's, not raised here
    assert waiter.done(), "the sync did not end"


def test_a_sync_runs_in_the_fsync_thread_and_step_publishes_it(tmp_path, worker):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    advances = []
    driver = SyncDriver(on_advance=lambda: advances.append(stream.horizon))

    async def scenario():
        driver.step(stream.store)
        assert driver.waiter is None  # nothing complete to make durable
        stream.feed_until(ends[2])
        driver.step(stream.store)
        assert driver.waiter is not None and stream.horizon == 4  # running; nothing advertised yet
        await ended(driver)
        assert stream.horizon == 4  # durable, not published until the loop says so
        driver.step(stream.store)
        assert driver.waiter is None and stream.horizon == ends[2]
        driver.close()
        # What a semi-sync ACK may say now: up to the horizon, nothing of a file the relay does not hold.
        assert horizon_covers(stream.store, "binlog.000001", ends[2])
        assert not horizon_covers(stream.store, "binlog.000001", ends[3])
        assert not horizon_covers(stream.store, "binlog.000000", 4)

    asyncio.run(scenario())
    assert advances == [ends[2]]
    assert [w.jobs for w in worker.made] == [1]
    assert stream.store.checkpoints == 0
    stream.store.close()


def test_one_sync_in_flight_the_groups_completed_meanwhile_share_the_next(tmp_path, worker):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver()

    async def scenario():
        worker.hold.set()
        stream.feed_until(ends[1])
        driver.step(stream.store)
        assert await asyncio.to_thread(worker.entered.wait, WAIT)
        first = driver.waiter
        stream.feed_until(ends[4])
        driver.step(stream.store)  # still running: no second sync
        assert driver.waiter is first and stream.horizon == 4
        worker.hold.clear()
        worker.release.set()
        await ended(driver)
        driver.step(stream.store)  # publishes the first, starts the one for groups 3-5
        assert stream.horizon == ends[1] and driver.waiter is not None and driver.waiter is not first
        await ended(driver)
        driver.step(stream.store)
        assert stream.horizon == ends[4] and driver.waiter is None
        driver.close()

    asyncio.run(scenario())
    assert [w.jobs for w in worker.made] == [2]
    stream.store.close()


def test_drain_waits_for_the_sync_in_flight_then_syncs_what_completed_since(tmp_path, worker):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    advances = []
    driver = SyncDriver(on_advance=lambda: advances.append(stream.horizon))

    async def scenario():
        worker.hold.set()
        stream.feed_until(ends[1])
        driver.step(stream.store)
        assert await asyncio.to_thread(worker.entered.wait, WAIT)
        stream.feed_until(ends[5])
        drain = asyncio.ensure_future(driver.drain(stream.store))
        await asyncio.sleep(0.3)
        assert not drain.done(), "drain returned while the sync was in flight"
        assert stream.horizon == 4
        worker.hold.clear()
        worker.release.set()
        await asyncio.wait_for(drain, WAIT)
        assert driver.waiter is None
        driver.close()

    asyncio.run(scenario())
    assert advances == [ends[1], ends[5]]
    assert stream.horizon == ends[5]
    stream.store.close()


def test_drain_without_a_sync_in_flight_syncs_what_is_due_or_nothing(tmp_path, worker):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver()

    async def scenario():
        await driver.drain(stream.store)  # nothing complete: no sync
        assert worker.made == []
        stream.feed_until(ends[3])
        await driver.drain(stream.store)
        assert stream.horizon == ends[3] and driver.waiter is None
        driver.close()

    asyncio.run(scenario())
    stream.store.close()


def test_close_stops_the_fsync_thread_and_a_second_close_does_nothing(tmp_path, worker):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver()

    async def scenario():
        driver.close()  # before any sync: nothing was started
        stream.feed_until(ends[2])
        driver.step(stream.store)
        await ended(driver)
        driver.step(stream.store)
        (thread,) = [w._thread for w in worker.made]
        assert thread.is_alive()
        driver.close()
        assert not thread.is_alive()
        assert worker.made[0]._efd == -1  # the eventfd is closed
        driver.close()
        # A sync after close starts a new thread (a session that runs again after a stop).
        stream.feed_until(ends[4])
        driver.step(stream.store)
        await ended(driver)
        driver.step(stream.store)
        driver.close()

    asyncio.run(scenario())
    assert len(worker.made) == 2 and not any(w._thread.is_alive() for w in worker.made)
    assert stream.horizon == ends[4]
    stream.store.close()


def test_close_with_a_sync_out_lets_it_end_first(tmp_path, worker):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver()

    async def scenario():
        worker.hold.set()
        stream.feed_until(ends[2])
        driver.step(stream.store)
        assert await asyncio.to_thread(worker.entered.wait, WAIT)
        driver.forget()  # the round ended without a drain: the store has the ticket
        timer = threading.Timer(0.3, worker.release.set)
        timer.start()
        driver.close()  # blocks until the job is out of the thread
        timer.join()
        assert not worker.made[0]._thread.is_alive()

    asyncio.run(scenario())
    stream.store.close()  # publishes the ticket the round left to it
    assert stream.horizon == ends[2]


def test_a_ticket_with_a_checkpoint_runs_in_the_pool(tmp_path, worker):
    stream = Stream(tmp_path, checkpoints=True)
    ends = ends_of(stream)
    advances = []
    driver = SyncDriver(on_advance=lambda: advances.append(stream.horizon))

    async def scenario():
        stream.feed_until(ends[3])
        driver.step(stream.store)
        await ended(driver)
        driver.step(stream.store)
        stream.feed_until(ends[6])
        await driver.drain(stream.store)
        threads = {t.name for t in threading.enumerate()}
        driver.close()
        driver.close()
        return threads

    threads = asyncio.run(scenario())
    assert worker.made == []  # never the fsync thread
    assert any(name.startswith("relay-fsync") for name in threads)
    assert advances == [ends[3], ends[6]]
    assert stream.store.checkpoints == 2
    stream.store.close()


def _failing_fdatasync(fd):
    raise OSError(errno.EIO, "Input/output error")


@pytest.mark.parametrize("path", ["thread", "pool"])
def test_a_failed_fsync_raises_its_oserror_where_it_would_be_published(tmp_path, worker, monkeypatch, path):
    stream = Stream(tmp_path, checkpoints=path == "pool")
    ends = ends_of(stream)
    advances = []
    driver = SyncDriver(on_advance=lambda: advances.append(stream.horizon))

    async def scenario():
        stream.feed_until(ends[3])
        monkeypatch.setattr(os, "fdatasync", _failing_fdatasync)
        driver.step(stream.store)
        await ended(driver)
        with pytest.raises(OSError) as raised:
            driver.step(stream.store)
        driver.close()
        return raised.value

    error = asyncio.run(scenario())
    monkeypatch.undo()
    assert error.errno == errno.EIO and not isinstance(error, RelayStoreError)  # the OSError itself
    assert stream.store.failure is not None  # the store failed when the fsync did
    with pytest.raises(RelayStoreFailed):
        stream.store.begin_sync()
    assert advances == [] and stream.horizon == 4
    assert [w.jobs for w in worker.made] == ([1] if path == "thread" else [])
    stream.store.close()


def test_a_failed_fsync_in_flight_raises_from_drain(tmp_path, worker, monkeypatch):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver()

    async def scenario():
        worker.hold.set()
        stream.feed_until(ends[2])
        driver.step(stream.store)
        assert await asyncio.to_thread(worker.entered.wait, WAIT)
        monkeypatch.setattr(os, "fdatasync", _failing_fdatasync)
        stream.feed_until(ends[4])
        worker.release.set()
        with pytest.raises(OSError) as raised:
            await driver.drain(stream.store)
        assert driver.waiter is None
        driver.close()
        return raised.value

    error = asyncio.run(scenario())
    monkeypatch.undo()
    assert error.errno == errno.EIO
    assert stream.store.failure is not None and stream.horizon == 4
    stream.store.close()


def test_an_ack_of_an_older_file_is_covered_once_the_horizon_has_moved_past_it(tmp_path):
    store = fresh_store(tmp_path)
    image = mysql_image("binlog.000002", groups=3)
    Feeder(store).feed_all(image)
    store.start_file("binlog.000002")  # syncs the old file before the relay moves on
    assert store.horizon.snapshot().coordinates == ("binlog.000002", 4)
    assert horizon_covers(store, "binlog.000001", len(image))
    assert horizon_covers(store, "binlog.000002", 4) and not horizon_covers(store, "binlog.000002", 5)
    assert not horizon_covers(store, "binlog.000003", 4)
    store.close()


def test_every_fsync_is_counted_on_one_side_or_as_the_stores_own(tmp_path, worker):
    """/metrics' fsyncs_on_loop + fsyncs_off_loop + fsyncs_by_store cover every fdatasync: a rotation's sync of the
    old file runs in the store itself, not through the driver (a CI run once saw 9 driver syncs of 10)."""
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver(on_loop=True)

    async def scenario():
        stream.feed_until(ends[2])
        driver.step(stream.store)
        stream.feed_until(ends[4])
        stream.store.start_file("binlog.000002")  # syncs what the driver has not yet: the store's own
        driver.close()

    asyncio.run(scenario())
    store = stream.store
    assert (driver.syncs_on_loop, driver.syncs_off_loop, store.fsyncs_inline, store.fsyncs) == (1, 0, 1, 2)
    store.close()  # a clean stop with nothing new to sync adds no fdatasync of relay data
    assert store.fsyncs_inline == store.fsyncs - 1


@pytest.mark.parametrize("on_loop", [True, False], ids=["on_loop", "fsync_thread"])
def test_a_sync_with_nothing_new_to_fsync_counts_on_neither_side(tmp_path, worker, monkeypatch, on_loop):
    """The driver's two counts are of fdatasyncs, as their /metrics help says: a ticket whose bytes an earlier
    fdatasync already covered (``needs_fsync`` false, made so here) moves the horizon and counts on neither side."""
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    store = stream.store
    driver = SyncDriver(on_loop=on_loop)
    begin = store.begin_sync

    def covered_already():
        ticket = begin()
        ticket.needs_fsync = False
        return ticket

    async def scenario():
        stream.feed_until(ends[2])
        driver.step(store)  # a real fdatasync
        await driver.drain(store)
        monkeypatch.setattr(store, "begin_sync", covered_already)
        stream.feed_until(ends[4])
        driver.step(store)
        await driver.drain(store)
        driver.close()

    asyncio.run(scenario())
    assert stream.horizon == ends[4]
    assert (driver.syncs_on_loop, driver.syncs_off_loop) == ((1, 0) if on_loop else (0, 1))
    assert driver.syncs_on_loop + driver.syncs_off_loop + store.fsyncs_inline == store.fsyncs == 1
    store.close()


def test_on_loop_the_sync_runs_and_is_published_in_step_itself(tmp_path, worker):
    """sync_on_loop: the fdatasync runs in ``step`` on the loop's thread and the horizon moves before it returns;
    the fsync thread is never started."""
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    advances = []
    driver = SyncDriver(on_advance=lambda: advances.append(stream.horizon), on_loop=True)

    async def scenario():
        stream.feed_until(ends[2])
        driver.step(stream.store)
        assert driver.waiter is None and stream.horizon == ends[2]  # durable and published at once
        stream.feed_until(ends[4])
        await driver.drain(stream.store)
        assert stream.horizon == ends[4]
        driver.close()

    asyncio.run(scenario())
    assert advances == [ends[2], ends[4]]
    assert worker.made == [] and stream.store.fsyncs >= 2
    stream.store.close()


def test_on_loop_a_slow_fdatasync_sends_the_next_syncs_to_the_fsync_thread(tmp_path, worker, monkeypatch):
    from relayproxy.relay import sync_driver

    monkeypatch.setattr(sync_driver, "ON_LOOP_SLOW", 0.0)  # every fdatasync counts as slow
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver(on_loop=True)

    async def scenario():
        stream.feed_until(ends[1])
        driver.step(stream.store)  # on the loop, found slow
        assert stream.horizon == ends[1] and driver.on_loop_pauses == 1
        stream.feed_until(ends[3])
        driver.step(stream.store)  # in the fsync thread now
        assert driver.waiter is not None
        await ended(driver)
        driver.step(stream.store)
        assert stream.horizon == ends[3]
        driver.close()

    asyncio.run(scenario())
    assert [w.jobs for w in worker.made] == [1]
    stream.store.close()


def test_on_loop_a_failed_fdatasync_raises_from_step_and_fails_the_store(tmp_path, worker, monkeypatch):
    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver(on_loop=True)

    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")

    async def scenario():
        stream.feed_until(ends[1])
        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(OSError) as raised:
            driver.step(stream.store)
        assert raised.value.errno == errno.EIO
        monkeypatch.undo()
        assert stream.horizon == 4  # nothing published
        with pytest.raises(RelayStoreFailed):
            stream.feed_until(ends[2])
        driver.close()

    asyncio.run(scenario())
    stream.store.close()


def test_on_loop_auto_follows_the_average_fdatasync(tmp_path, worker, monkeypatch):
    """sync_on_loop = auto (the default): in the fsync thread until one sync has been timed (a disk of unknown speed
    never holds the loop), then on the loop while the recent fdatasyncs average under ON_LOOP_AUTO_MAX, in the fsync
    thread when they do not, and back on the loop once they do again."""
    from relayproxy.relay import sync_driver

    stream = Stream(tmp_path)
    ends = ends_of(stream)
    driver = SyncDriver(on_loop="auto")
    monkeypatch.setattr(sync_driver, "ON_LOOP_AUTO_MAX", 10.0)  # any disk is fast enough for the loop

    async def scenario():
        assert driver.describe()["on_loop_now"] is False  # no average yet
        stream.feed_until(ends[1])
        driver.step(stream.store)
        assert driver.waiter is not None and driver.syncs_off_loop == 1 and driver.syncs_on_loop == 0
        await ended(driver)
        driver.step(stream.store)
        assert stream.horizon == ends[1]
        assert driver.fsync_average is not None and driver.fsync_average > 0
        stream.feed_until(ends[2])
        driver.step(stream.store)  # timed and fast: on the loop, published at once
        assert driver.waiter is None and stream.horizon == ends[2] and driver.syncs_on_loop == 1
        monkeypatch.setattr(sync_driver, "ON_LOOP_AUTO_MAX", 0.0)  # every average is too slow now
        stream.feed_until(ends[3])
        driver.step(stream.store)
        assert driver.waiter is not None and driver.syncs_off_loop == 2  # in the fsync thread
        await ended(driver)
        driver.step(stream.store)
        assert stream.horizon == ends[3]
        monkeypatch.setattr(sync_driver, "ON_LOOP_AUTO_MAX", 10.0)  # fast again
        stream.feed_until(ends[4])
        driver.step(stream.store)
        assert driver.waiter is None and stream.horizon == ends[4] and driver.syncs_on_loop == 2
        driver.close()

    asyncio.run(scenario())
    assert [w.jobs for w in worker.made] == [2] and driver.on_loop_pauses == 0  # the first sync and the slow one
    stream.store.close()


def test_on_loop_takes_only_true_false_or_auto():
    with pytest.raises(ValueError, match="auto"):
        SyncDriver(on_loop="sometimes")
