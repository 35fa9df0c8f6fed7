"""The fsync of one batch runs while the next batch is received, parsed and written (the session's pipeline).

What must not move: the horizon (and so everything advertised from it) goes only to boundaries whose bytes an
fdatasync that has *completed* covers; at most one sync ticket is in flight; a rotation, a truncation after a
disconnect, a stop (close) wait for the ticket in flight before they touch the descriptor; a failed fsync fails the
store at once. The fsync is held on an Event (as tests/lab/test_fake_mysql_master.py holds it for the semi-sync ACK
test), in the store alone (threads) and in the whole relay in-process against the scripted master.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.binlog.reader import scan_bytes
from relayproxy.relay import fsyncer
from relayproxy.relay.horizon import Horizon
from relayproxy.relay.errors import RelayStoreFailed
from relayproxy.relay.store import RelayStore
from relayproxy.relay.sync import SyncTicket

from ..support import eventgen as E
from ..support.fakemaster import FakeMySQLMaster, clear_in_use, next_binlog, split_events
from ..lab.test_fake_mysql_master import MYSQL80, NAME, group_ends, running_relay, wait_for
from .test_relay_store import NO_AUTO_SYNC, OTHER_SID, Feeder, fresh_store, mysql_image

WAIT = 30  # seconds: generous bounds on waiting for a condition, never a speed assertion


class FsyncLedger:
    """Patches SyncTicket.make_durable: records each completed fsync, counts tickets in flight, and can hold the
    next armed ticket until ``release`` is set. Also checks, at every Horizon.advance, that the new position is
    covered by a completed fsync of that file (or is a new file's start, fsynced by start_file itself)."""

    def __init__(self, monkeypatch):
        self.lock = threading.Lock()
        self.durable: dict[str, int] = {}  # file -> highest position a completed make_durable covers
        self.order: list[tuple] = []  # ("durable", file, position) and what tests add
        self.in_flight = 0
        self.max_in_flight = 0
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.held: SyncTicket | None = None
        self.violations: list[str] = []
        self.advances: list[tuple[str, int]] = []
        original = SyncTicket.make_durable
        ledger = self

        def make_durable(ticket):
            with ledger.lock:
                ledger.in_flight += 1
                ledger.max_in_flight = max(ledger.max_in_flight, ledger.in_flight)
            try:
                if ledger.armed.is_set() and ledger.held is None and ticket.moves:
                    ledger.held = ticket
                    ledger.entered.set()
                    assert ledger.release.wait(WAIT), "the held fsync was never released"
                original(ticket)
            finally:
                with ledger.lock:
                    ledger.in_flight -= 1
            with ledger.lock:
                if ticket.durable and ticket.moves:
                    ledger.durable[ticket.file] = max(ledger.durable.get(ticket.file, 0), ticket.position)
                    ledger.order.append(("durable", ticket.file, ticket.position))

        advance = Horizon.advance

        def checked_advance(horizon, file, position, gtids, *, copy=True):
            with ledger.lock:
                covered = ledger.durable.get(file, 4)
                if position > covered:
                    ledger.violations.append(f"horizon moved to {file}:{position}, fsynced only to {covered}")
                ledger.advances.append((file, position))
            return advance(horizon, file, position, gtids, copy=copy)

        monkeypatch.setattr(SyncTicket, "make_durable", make_durable)
        monkeypatch.setattr(Horizon, "advance", checked_advance)

        # The session's fsync thread (relay/fsyncer.py): the Python worker, held and counted the same way; a
        # ticket's durability is recorded when the loop completes it (native_done), before complete_sync.
        class LedgerWorker(fsyncer.PyWorker):
            def run_job(worker, fd, mark_fd, mark):
                with ledger.lock:
                    ledger.in_flight += 1
                    ledger.max_in_flight = max(ledger.max_in_flight, ledger.in_flight)
                try:
                    if ledger.armed.is_set() and ledger.held is None and mark is not None:
                        ledger.held = True
                        ledger.entered.set()
                        assert ledger.release.wait(WAIT), "the held fsync was never released"
                    return fsyncer.PyWorker.run_job(worker, fd, mark_fd, mark)
                finally:
                    with ledger.lock:
                        ledger.in_flight -= 1

        native_done = SyncTicket.native_done

        def recorded(ticket, err, stage, seconds):
            native_done(ticket, err, stage, seconds)
            with ledger.lock:
                if ticket.durable and ticket.moves:
                    ledger.durable[ticket.file] = max(ledger.durable.get(ticket.file, 0), ticket.position)
                    ledger.order.append(("durable", ticket.file, ticket.position))

        monkeypatch.setattr(fsyncer, "new_worker", LedgerWorker)
        monkeypatch.setattr(SyncTicket, "native_done", recorded)

    def hold_next(self) -> None:
        self.held = None
        self.entered.clear()
        self.release.clear()
        self.armed.set()

    def note(self, *what) -> None:
        with self.lock:
            self.order.append(what)


def in_thread(fn, *args):
    """Run ``fn`` in a thread (it may block on the held fsync); returns (thread, result box)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def held_ticket(store: RelayStore, ledger: FsyncLedger, pool) -> SyncTicket:
    """begin_sync + submit to the fsync thread, held there until ledger.release."""
    ledger.hold_next()
    ticket = store.begin_sync()
    ticket.submit(pool)
    assert ledger.entered.wait(WAIT)
    return ticket


@pytest.fixture
def pool():
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-fsync")
    yield executor
    executor.shutdown(wait=True)


# -- the store alone ------------------------------------------------------------------------------------------------


def test_rotation_waits_for_the_fsync_in_flight(tmp_path, monkeypatch, pool):
    ledger = FsyncLedger(monkeypatch)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    image = mysql_image("binlog.000002", groups=6)
    events = split_events(image)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:9]:
        feeder.feed(offset, ev)
    covered = store.boundary_end
    before = store.horizon.snapshot().coordinates
    ticket = held_ticket(store, ledger, pool)
    for offset, ev in events[9:]:  # the rest of the file, ROTATE included, written while the fsync is held
        feeder.feed(offset, ev)
    assert store.current_end == len(image)
    monkeypatch.setattr(store, "_create_file", _noting(store._create_file, ledger, "create"))
    thread, box = in_thread(store.start_file, "binlog.000002")
    thread.join(0.5)
    assert thread.is_alive(), "start_file went on while the fsync of the old file was in flight"
    assert store.horizon.snapshot().coordinates == before
    assert store.current_file == "binlog.000001"
    ledger.release.set()
    thread.join(WAIT)
    assert not thread.is_alive() and "error" not in box, box
    assert ticket.completed  # start_file published it before syncing the rest and rotating
    assert ledger.order[0] == ("durable", "binlog.000001", covered)
    assert ledger.order[1] == ("durable", "binlog.000001", len(image))
    assert ledger.order[2][0] == "create"
    assert store.horizon.snapshot().coordinates == ("binlog.000002", 4)
    assert ledger.violations == [] and ledger.max_in_flight == 1
    assert [a for a in ledger.advances if a[0] == "binlog.000001"] == [
        ("binlog.000001", 4), ("binlog.000001", covered), ("binlog.000001", len(image))]
    store.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image


def _noting(fn, ledger: FsyncLedger, what: str):
    def noted(*args, **kw):
        ledger.note(what, *[str(a) for a in args])
        return fn(*args, **kw)
    return noted


def big_group(gno: int, size: int = 3 << 20) -> list[bytes]:
    """A transaction with a statement large enough to bypass the store's buffer (written at once)."""
    return [E.gtid(gno), E.query("BEGIN"), E.query(b"INSERT INTO t VALUES ('" + b"x" * size + b"')"), E.xid(gno)]


def test_discard_incomplete_waits_for_the_fsync_in_flight(tmp_path, monkeypatch, pool):
    ledger = FsyncLedger(monkeypatch)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    image = E.binlog_file(*mysql_events_then_big())
    events = split_events(image)
    cut = len(events) - 1  # the big transaction without its XID: a partial group, its statement already pwritten
    feeder = Feeder(store, sync_each_event=False)
    first = [i for i, (_, ev) in enumerate(events) if ev[4] == C.GTID_LOG_EVENT][-1]  # the big transaction's GTID
    for offset, ev in events[:first]:
        feeder.feed(offset, ev)
    covered = store.boundary_end
    ticket = held_ticket(store, ledger, pool)
    for offset, ev in events[first:cut]:
        feeder.feed(offset, ev)
    partial_end = store.current_end
    assert os.path.getsize(tmp_path / "relay" / "binlog.000001") > covered + (3 << 20)  # on its way to disk
    thread, box = in_thread(store.discard_incomplete)
    thread.join(0.5)
    assert thread.is_alive(), "discard_incomplete truncated while the fsync was in flight"
    assert os.path.getsize(tmp_path / "relay" / "binlog.000001") > covered + (3 << 20)
    ledger.release.set()
    thread.join(WAIT)
    assert not thread.is_alive() and box == {"value": partial_end - covered}, box
    assert ticket.completed
    assert store.horizon.snapshot().position == covered
    assert os.path.getsize(tmp_path / "relay" / "binlog.000001") == covered == store.current_end
    feeder.parser.reset()
    for offset, ev in events[first:]:  # the master re-sends the transaction whole
        feeder.feed(offset, ev)
    assert store.sync()
    assert store.horizon.snapshot().position == len(image)
    assert ledger.violations == [] and ledger.max_in_flight == 1
    store.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image


def mysql_events_then_big() -> list[bytes]:
    start = GtidSet()
    start.add_interval(OTHER_SID, 1, 6)
    events = [E.event(C.PREVIOUS_GTIDS_LOG_EVENT, start.encode())]
    for gno in range(1, 4):
        events += [E.gtid(gno), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(gno)]
    return events + big_group(4)


def test_close_waits_for_the_fsync_in_flight_and_loses_nothing(tmp_path, monkeypatch, pool):
    ledger = FsyncLedger(monkeypatch)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    image = mysql_image(groups=9, rotate=False)
    events = split_events(image)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:12]:
        feeder.feed(offset, ev)
    covered = store.boundary_end
    before = store.horizon.snapshot().coordinates
    ticket = held_ticket(store, ledger, pool)
    for offset, ev in events[12:]:
        feeder.feed(offset, ev)
    thread, box = in_thread(store.close)
    thread.join(0.5)
    assert thread.is_alive(), "close went on while the fsync was in flight"
    assert store.horizon.snapshot().coordinates == before == ("binlog.000001", 4)
    ledger.release.set()
    thread.join(WAIT)
    assert not thread.is_alive() and "error" not in box, box
    assert ticket.completed
    assert [a[1] for a in ledger.advances] == [4, covered, len(image)]  # start, the held one, close's own sync
    assert ledger.violations == [] and ledger.max_in_flight == 1
    reopened = RelayStore.open(tmp_path / "relay")
    assert reopened.horizon.snapshot().position == len(image)
    reopened.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image


def test_a_failed_fsync_in_flight_fails_the_store_at_once(tmp_path, monkeypatch, pool):
    ledger = FsyncLedger(monkeypatch)
    store = fresh_store(tmp_path, sync=NO_AUTO_SYNC)
    image = mysql_image(groups=9, rotate=False)
    events = split_events(image)
    feeder = Feeder(store, sync_each_event=False)
    for offset, ev in events[:12]:
        feeder.feed(offset, ev)
    before = store.horizon.snapshot().coordinates
    ticket = held_ticket(store, ledger, pool)
    feeder.feed(*events[12])

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    ledger.release.set()
    concurrent.futures.wait([ticket._job], WAIT)
    # The store failed when the fsync did, before anyone published the ticket: the next write refuses.
    assert store.failure is not None
    with pytest.raises(RelayStoreFailed):
        feeder.feed(*events[13])
    with pytest.raises(RelayStoreFailed):
        store.complete_sync(ticket)
    assert store.horizon.snapshot().coordinates == before
    monkeypatch.undo()
    store.close()
    assert (tmp_path / "relay" / "binlog.000001").stat().st_size == 4  # cut to the last successful fsync


# -- the whole relay, in-process, against the scripted master -------------------------------------------------------


@pytest.fixture
def mysql80(corpus_dir) -> bytes:
    return (corpus_dir / MYSQL80).read_bytes()


def test_relay_keeps_receiving_while_the_fsync_is_held_and_rotates_after_it(tmp_path, mysql80, monkeypatch):
    """While one fsync is held the relay receives and writes the next transactions (the pipeline), the horizon
    and the ACKs stay behind; a ROTATE that arrives meanwhile creates the next file only after that fsync."""
    ledger = FsyncLedger(monkeypatch)
    image = mysql80
    ends = group_ends(image)
    second = next_binlog(image, scan_bytes(image).gtids_after)
    monkeypatch.setattr(RelayStore, "_create_file", _noting_method(RelayStore._create_file, ledger, "create"))
    released_by_timer = []

    async def scenario():
        async with FakeMySQLMaster([(NAME, image[: ends[10]])], semi_sync=True) as master:
            async with running_relay(master, tmp_path / "relay", sync_on_loop="false") as info:
                store = info["session"].store
                await wait_for(lambda: store.horizon.snapshot().coordinates == (NAME, ends[10]), WAIT, "group 11")
                conn = master.connections[0]
                await wait_for(lambda: conn.acks and conn.acks[-1] == (NAME, ends[10]), WAIT, "the ACK of group 11")
                ledger.hold_next()
                master.append(image[ends[10] : ends[11]])
                await wait_for(ledger.entered.is_set, WAIT, "the held fsync of group 12")
                acks_held = list(conn.acks)
                master.append(image[ends[11] : ends[14]])
                # Received, parsed and written while the fsync of group 12 is held:
                await wait_for(lambda: store.current_end == ends[14], WAIT, "groups 13-14 written")
                horizon_held = store.horizon.snapshot().coordinates
                acks_during = list(conn.acks)
                # The rest of the file, its ROTATE and the next file: start_file must wait for the held fsync.
                # It blocks the event loop (as its own fsync always did), so a timer thread releases it.
                master.append(image[ends[14] :])
                master.add_file("binlog.000005", second)
                timer = threading.Timer(0.5, lambda: (released_by_timer.append(True), ledger.release.set()))
                timer.start()
                await wait_for(lambda: store.horizon.snapshot().coordinates == ("binlog.000005", len(second)),
                               WAIT, "the next file")
                timer.join()
                relay = {name: store.path(name).read_bytes() for name in store.files()}
                return acks_held, acks_during, horizon_held, relay, list(conn.acks)

    acks_held, acks_during, horizon_held, relay, acks = asyncio.run(scenario())
    assert released_by_timer
    assert horizon_held == (NAME, ends[10])  # the received groups 12-14 were not advertised before their fsync
    assert acks_during == acks_held and acks_held[-1] == (NAME, ends[10])
    held_at = ledger.order.index(("durable", NAME, ends[11]))
    created = [i for i, o in enumerate(ledger.order) if o[0] == "create" and o[1].endswith("binlog.000005")]
    assert created and created[0] > held_at, ledger.order
    assert ledger.violations == [], ledger.violations
    assert ledger.max_in_flight == 1
    assert relay == {NAME: clear_in_use(image), "binlog.000005": clear_in_use(second)}
    positions = [pos for name, pos in acks if name == NAME]
    assert positions == sorted(positions) and set(positions) <= set(ends)


def _noting_method(fn, ledger: FsyncLedger, what: str):
    def noted(self, *args, **kw):
        ledger.note(what, *[str(a) for a in args])
        return fn(self, *args, **kw)
    return noted


@pytest.mark.parametrize("how", ["disconnect", "stop"])
def test_disconnect_or_stop_while_the_fsync_is_held(tmp_path, mysql80, monkeypatch, how):
    """The connection ends (the master cuts it mid-transaction, or the relay stops) while an fsync is held: the
    round waits for it, publishes it, makes the complete transactions received since durable, and only then cuts
    the partial one; nothing is lost or doubled after the reconnect."""
    ledger = FsyncLedger(monkeypatch)
    image = mysql80
    ends = group_ends(image)
    monkeypatch.setattr(RelayStore, "discard_incomplete",
                        _noting_method(RelayStore.discard_incomplete, ledger, "discard"))
    xid_of_15 = [off for off, _ev in split_events(image) if off < ends[15]][-1]

    async def scenario():
        async with FakeMySQLMaster([(NAME, image[: ends[10]])]) as master:
            async with running_relay(master, tmp_path / "relay", sync_on_loop="false") as info:
                session = info["session"]
                store = session.store
                await wait_for(lambda: store.horizon.snapshot().coordinates == (NAME, ends[10]), WAIT, "group 11")
                ledger.hold_next()
                master.append(image[ends[10] : ends[11]])
                await wait_for(ledger.entered.is_set, WAIT, "the held fsync of group 12")
                if how == "disconnect":
                    # groups 13-14 and group 15 without its XID, then the connection drops
                    master.append(image[ends[11] : xid_of_15])
                    await wait_for(lambda: store.current_end == xid_of_15, WAIT, "the partial group 15")
                    session._conn.abort()
                else:
                    master.append(image[ends[11] : ends[14]])
                    await wait_for(lambda: store.current_end == ends[14], WAIT, "groups 13-14 written")
                    session.stop()
                await asyncio.sleep(0.3)  # the round is ending: it must be waiting for the held fsync
                during = store.horizon.snapshot().coordinates
                discarded_during = [o for o in ledger.order if o[0] == "discard"]
                ledger.release.set()
                if how == "disconnect":
                    master.append(image[xid_of_15:])
                    await wait_for(lambda: store.horizon.snapshot().coordinates == (NAME, len(image)), WAIT, "all")
                    return during, discarded_during, store.path(NAME).read_bytes(), None
                await wait_for(lambda: session.status.state == "stopped", WAIT, "the stop")
                return during, discarded_during, None, store.horizon.snapshot().coordinates

    during, discarded_during, relay_file, stopped_at = asyncio.run(scenario())
    assert during == (NAME, ends[10])
    assert discarded_during == []  # no truncation while the fsync was held
    held_at = ledger.order.index(("durable", NAME, ends[11]))
    discards = [i for i, o in enumerate(ledger.order) if o[0] == "discard"]
    assert discards and discards[0] > held_at, ledger.order
    # The groups received after the held one were made durable before the round ended.
    assert ("durable", NAME, ends[14]) in ledger.order[held_at:discards[0]], ledger.order
    assert ledger.violations == [] and ledger.max_in_flight == 1
    if how == "disconnect":
        assert relay_file == clear_in_use(image)
    else:
        assert stopped_at == (NAME, ends[14])
        reopened = RelayStore.open(tmp_path / "relay")
        assert reopened.horizon.snapshot().coordinates == (NAME, ends[14])
        reopened.close()
