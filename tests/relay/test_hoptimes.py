"""The hop's stage histograms (relay/hoptimes.py): bucket counting, quantile bounds, and the stages of a sync."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relayproxy.relay.hoptimes import HOP_BUCKETS, STAGES, Histogram, HopTimes
from relayproxy.relay.store import RelayStore
from relayproxy.relay.sync_driver import SyncDriver
from .test_relay_store import Feeder, mysql_image


def test_buckets_follow_prometheus_le_with_weights_and_reject_bad_bounds():
    h = Histogram((0.001, 0.01))
    h.observe(0.001)  # on a bound: in that bucket
    h.observe(0.002, 5)
    h.observe(3.0)
    h.observe(-1.0)  # clocks read out of order: counted as no time at all
    assert h.cumulative_buckets() == [("0.001", 2), ("0.01", 7), ("+Inf", 8)]
    assert h.count == 8 and h.max_seconds == 3.0 and h.last_seconds == 0.0
    assert h.sum_seconds == pytest.approx(0.001 + 0.01 + 3.0)
    for bad in ((), (0.01, 0.001), (0, 1), (0.1, 0.1)):
        with pytest.raises(ValueError, match="strictly increasing"):
            Histogram(bad)


@given(st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=200),
       st.floats(min_value=0.01, max_value=1.0))
def test_the_quantile_bound_is_at_least_the_true_quantile_and_within_its_bucket(values, q):
    h = Histogram()
    for v in values:
        h.observe(v)
    bound = h.quantile_bound(q)
    ordered = sorted(values)
    rank = max(int(-(-q * len(values) // 1)), 1)  # ceil(q * n): the nearest-rank quantile
    true = ordered[rank - 1]
    assert bound >= true or bound == max(values)
    # the bound is the true value's bucket's upper edge (or the maximum when that is smaller)
    edges = [b for b in HOP_BUCKETS if b >= true]
    assert bound <= (edges[0] if edges else max(values))
    assert Histogram().quantile_bound(0.5) is None


@given(st.lists(st.lists(st.floats(min_value=0.0, max_value=3.0), max_size=30), min_size=1, max_size=6))
def test_takes_merged_elsewhere_give_the_histogram_of_every_observation(reports):
    """A sender process's send stage (take, sent to the relay process, merged there): the merged histogram is the
    one that would have seen every observation itself, however the reports split them."""
    worker, merged, whole = Histogram(), Histogram(), Histogram()
    for report in reports:
        for v in report:
            worker.observe(v)
            whole.observe(v)
        taken = worker.take()
        assert (taken is None) == (not report) and worker.count == 0
        if taken is not None:
            merged.merge(*taken)
    assert merged.cumulative_buckets() == whole.cumulative_buckets() and merged.count == whole.count
    assert merged.max_seconds == whole.max_seconds and merged.sum_seconds == pytest.approx(whole.sum_seconds)


def test_a_merge_of_another_shape_is_refused_and_changes_nothing():
    h = Histogram((0.001, 0.01))
    h.observe(0.002)
    for bad in ([1, 2], [1, 2, 3, 4], [1, -1, 0], [1.5, 0, 0]):
        with pytest.raises(ValueError, match="do not fit 2 buckets"):
            h.merge(bad, 1.0, 1.0)
    assert h.cumulative_buckets() == [("0.001", 0), ("0.01", 1), ("+Inf", 1)] and h.count == 1


def test_observations_from_several_threads_are_all_counted():
    h = Histogram()

    def work():
        for _ in range(5000):
            h.observe(0.0003, 2)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.count == 40000 and h.cumulative_buckets()[-1] == ("+Inf", 40000)


def test_a_sync_observes_each_stage_once_per_transaction_and_they_add_up_to_durable():
    hop = HopTimes()
    hop.batch(arrived=10.000, began=10.001, ended=10.003, transactions=3)
    hop.batch(arrived=10.004, began=10.004, ended=10.005, transactions=0)  # nothing completed: not counted
    hop.sync_began(10.006)
    hop.batch(arrived=10.007, began=10.0075, ended=10.008, transactions=1)  # after the sync began: the next one's
    hop.sync_published(10.010, fsync_seconds=0.003)
    s = hop.stages
    assert [s[name].count for name in ("receive", "write", "sync_wait", "fsync", "fsync_handoff", "durable")] == [3] * 6
    assert s["receive"].sum_seconds == pytest.approx(3 * 0.001)
    assert s["write"].sum_seconds == pytest.approx(3 * 0.002)
    assert s["sync_wait"].sum_seconds == pytest.approx(3 * 0.003)
    assert s["fsync"].sum_seconds == pytest.approx(3 * 0.003)
    assert s["fsync_handoff"].sum_seconds == pytest.approx(3 * 0.001)  # 4 ms of sync, 3 of them the fdatasync
    parts = sum(s[n].sum_seconds for n in ("receive", "write", "sync_wait", "fsync", "fsync_handoff"))
    assert parts == pytest.approx(s["durable"].sum_seconds) == pytest.approx(3 * 0.010)
    hop.sync_began(10.011)
    hop.sync_published(10.012, fsync_seconds=0.0005)
    assert s["durable"].count == 4 and s["durable"].last_seconds == pytest.approx(10.012 - 10.007)
    hop.sync_published(10.013, fsync_seconds=0.0)  # no sync out: nothing to attribute
    assert s["durable"].count == 4
    hop.acked(advanced=10.012, now=10.0125)
    hop.acked(advanced=0.0, now=11.0)  # an advance of unknown time: not counted
    hop.sent(0.0002, replicas=7)
    hop.sent(0.1, replicas=0)
    assert s["ack"].count == 1 and s["send"].count == 7
    assert set(hop.summary()) == set(STAGES) and hop.summary()["send"]["count"] == 7


def test_a_sync_begun_while_one_is_still_out_carries_its_transactions():
    hop = HopTimes()
    hop.batch(1.0, 1.0, 1.001, 2)
    hop.sync_began(1.002)
    hop.batch(1.003, 1.003, 1.004, 1)
    hop.sync_began(1.005)  # the first one's end was never published (a store operation took it over)
    hop.sync_published(1.007, 0.001)
    assert hop.stages["durable"].count == 3


def test_the_sync_driver_reports_a_real_stores_syncs(tmp_path):
    """SyncDriver with a real store and the fsync thread: one batch of groups, one sync, every stage observed."""
    hop = HopTimes()
    store = RelayStore.open(tmp_path / "relay")

    async def main():
        driver = SyncDriver(hop=hop)
        try:
            store.start_file("binlog.000001")
            feeder = Feeder(store, sync_each_event=False)  # the driver syncs, as in the session
            loop = asyncio.get_running_loop()
            began = loop.time()
            feeder.feed_all(mysql_image(rotate=False, groups=5))
            hop.batch(began, began, loop.time(), 5)
            await driver.drain(store)
        finally:
            driver.close()

    try:
        asyncio.run(main())
    finally:
        store.close()
    durable = hop.stages["durable"]
    assert durable.count == 5 and durable.max_seconds > 0
    assert hop.stages["fsync"].count == 5 and hop.stages["fsync"].sum_seconds > 0
    assert store.horizon.snapshot().at > 0  # the advance's own time, which the send stage starts from
