"""/metrics: the collector's families from a status document, fsync timings from a real store, and a real chain."""

from __future__ import annotations

import asyncio
import errno
import os
import time
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relayproxy import __version__
from relayproxy.downstream.context import (
    ConnectionState,
    DumpProgress,
    ReplicaRegistration,
)
from relayproxy.ops.http import HttpApi
from relayproxy.ops.metrics import FSYNC_BUCKETS, FsyncStats, build_registry
from relayproxy.relay.hoptimes import STAGES, HopTimes
from relayproxy.relay.replay_stops import ReplayStop, ReplayStops
from relayproxy.ops.status import StatusSources, UpstreamSources, bytes_behind, file_index, format_status, relay_status
from relayproxy.relay import RelayStore, RelayStoreFailed, SyncPolicy
from relayproxy.relay.retention import RetentionStats
from relayproxy.upstream.receiver import (
    ChecksumMismatch,
    MasterStreamEnded,
    ReceiverCounters,
    SemiSyncTally,
    StreamError,
)
from relayproxy.upstream.session import (
    UPSTREAM_ERROR_KINDS,
    UpstreamStatus,
    upstream_error_kind,
)
from relayproxy.wire.packets import MySQLError

from relayproxy.lab.harness import change_master, master_status, wait_replica
from ..downstream.test_downstream_e2e import chain  # noqa: F401  (a fixture: master + relayproxy run --listen)
from ..scenarios.test_relay_e2e import mixed_load
from ..relay.test_relay_store import Feeder, mysql_image, split_events

# ---------------------------------------------------------------------------------------------
# Helpers


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, family: str, sample: str | None = None, **labels) -> float:
    """The one sample of ``family`` named ``sample`` (default: the family's name) whose labels include ``labels``."""
    wanted = sample or family
    found = [s.value for s in fams[family].samples if s.name == wanted and labels.items() <= s.labels.items()]
    assert len(found) == 1, (family, wanted, labels, fams[family].samples)
    return found[0]


def scrape(status, fsync=None, *, process: bool = False) -> dict:
    return families(generate_latest(build_registry(lambda: status, fsync, process=process)).decode())


def base_status(**overrides) -> dict:
    """A status document as relay_status builds it (the keys the collector reads)."""
    doc = {
        "version": __version__, "flavour": "mariadb", "master_server_version": "10.11.6-MariaDB-log",
        "gtid_mode": "mariadb", "master_log_file": "master-bin.000007", "read_master_log_pos": 1200,
        "horizon_file_index": 7, "master_position": {"file": "master-bin.000007", "position": 1500},
        "master_file_index": 7, "io_running": True, "semi_sync": False, "lag_bytes": 300,
        "seconds_behind_master": 2, "events_received": 50, "bytes_received": 9000, "transactions_received": 10,
        "duplicate_events_skipped": 3, "heartbeats_received": 4, "connects": 3, "reconnects": 2,
        "connect_failures": 2, "store_failures": 5, "semi_sync_acks": 0, "semi_sync_replica_waits": 0, "semi_sync_replica_timeouts": 0,
        "errors_by_kind": {**dict.fromkeys(UPSTREAM_ERROR_KINDS, 0), "io": 1, "timeout": 1},
        "relay_files": 2, "relay_disk_bytes": 5000, "relay_fs_free_bytes": 10**9, "relay_fs_size_bytes": 10**10,
        "relay_oldest_file_age_seconds": 86.5,
        "replicas": [
            {"connection_id": 11, "user": "repl", "host": "10.0.0.5", "server_id": 3, "file": "master-bin.000006",
             "position": 700, "lag_bytes": 2496, "lag_seconds": 1.5, "events_sent": 40, "bytes_sent": 8000,
             "last_ack": ["master-bin.000006", 650]},
            {"connection_id": 12, "user": "tool", "host": "10.0.0.6", "server_id": None, "file": None,
             "position": None, "lag_bytes": None, "lag_seconds": None, "events_sent": 0, "bytes_sent": 0,
             "last_ack": None},  # registered, not dumping: no per-replica series
        ],
    }
    doc.update(overrides)
    return doc


# ---------------------------------------------------------------------------------------------
# The collector, from a status document


def test_collector_exposes_every_family_with_its_type_labels_and_value():
    fsync = FsyncStats()
    for seconds in (0.0002, 0.003, 0.003, 0.7, 5.0):
        fsync.observe(seconds, 1000)
    fams = scrape(base_status(), fsync)

    assert value(fams, "relayproxy_info", version=__version__, flavour="mariadb", gtid_mode="mariadb",
                 master_server_version="10.11.6-MariaDB-log") == 1
    assert value(fams, "relayproxy_horizon_position_bytes", master_log_file="master-bin.000007") == 1200
    assert value(fams, "relayproxy_horizon_file_index") == 7
    assert value(fams, "relayproxy_master_position_bytes", master_log_file="master-bin.000007") == 1500
    assert value(fams, "relayproxy_lag_bytes") == 300 and value(fams, "relayproxy_lag_seconds") == 2
    assert value(fams, "relayproxy_io_running") == 1
    for name, expected in (("events_received", 50), ("bytes_received", 9000), ("transactions_received", 10),
                           ("duplicate_events_skipped", 3), ("heartbeats_received", 4), ("connects", 3),
                           ("reconnects", 2), ("connect_failures", 2), ("store_failures", 5),
                           ("semi_sync_acks", 0)):
        family = f"relayproxy_{name}"
        assert fams[family].type == "counter", family
        assert value(fams, family, f"{family}_total") == expected, family
    errors = fams["relayproxy_errors"]
    assert errors.type == "counter"
    assert {s.labels["kind"]: s.value for s in errors.samples} == {
        **dict.fromkeys(UPSTREAM_ERROR_KINDS, 0.0), "io": 1.0, "timeout": 1.0}

    hist = fams["relayproxy_fsync_seconds"]
    assert hist.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 1 and buckets["0.005"] == 3 and buckets["1.0"] == 4 and buckets["2.0"] == 4
    assert buckets["+Inf"] == 5 and len(buckets) == len(FSYNC_BUCKETS) + 1
    assert value(fams, "relayproxy_fsync_seconds", "relayproxy_fsync_seconds_count") == 5
    assert value(fams, "relayproxy_fsync_seconds", "relayproxy_fsync_seconds_sum") == pytest.approx(5.7062)
    assert value(fams, "relayproxy_fsync_bytes", "relayproxy_fsync_bytes_total") == 5000

    assert value(fams, "relayproxy_relay_files") == 2
    assert value(fams, "relayproxy_relay_disk_bytes") == 5000
    assert value(fams, "relayproxy_relay_fs_free_bytes") == 10**9
    assert value(fams, "relayproxy_relay_oldest_file_age_seconds") == 86.5

    assert value(fams, "relayproxy_replicas_connected") == 1
    ident = {"server_id": "3", "connection_id": "11", "user": "repl", "host": "10.0.0.5"}
    assert value(fams, "relayproxy_replica_position_bytes", **ident, master_log_file="master-bin.000006") == 700
    assert value(fams, "relayproxy_replica_lag_bytes", **ident) == 2496
    assert value(fams, "relayproxy_replica_lag_seconds", **ident) == 1.5
    assert value(fams, "relayproxy_replica_events_sent", "relayproxy_replica_events_sent_total", **ident) == 40
    assert value(fams, "relayproxy_replica_bytes_sent", "relayproxy_replica_bytes_sent_total", **ident) == 8000
    assert value(fams, "relayproxy_replica_semi_sync_acked_position_bytes", **ident,
                 master_log_file="master-bin.000006") == 650
    for family in ("relayproxy_replica_position_bytes", "relayproxy_replica_lag_bytes"):
        assert all(s.labels["connection_id"] == "11" for s in fams[family].samples), "a non-dumping client has no series"


def test_collector_leaves_out_what_is_unknown_and_series_of_gone_replicas():
    state = base_status()
    registry = build_registry(lambda: state, None, process=False)
    fams = families(generate_latest(registry).decode())
    assert "relayproxy_replica_lag_bytes" in fams and "relayproxy_fsync_seconds" not in fams
    assert not any(name.startswith("relayproxy_retention_") for name in fams)  # no retention task, no series
    # Not streaming, nothing seen from the master yet, the replica disconnected: those series go away.
    state.update(io_running=False, master_position=None, master_file_index=None, lag_bytes=None,
                 seconds_behind_master=None, replicas=[])
    fams = families(generate_latest(registry).decode())
    assert value(fams, "relayproxy_io_running") == 0
    for gone in ("relayproxy_master_position_bytes", "relayproxy_lag_bytes", "relayproxy_lag_seconds"):
        assert gone not in fams or not fams[gone].samples, gone
    assert value(fams, "relayproxy_replicas_connected") == 0
    assert not fams["relayproxy_replica_position_bytes"].samples


def test_semi_sync_tally_families_follow_the_status_document():
    fams = scrape(base_status())
    assert "relayproxy_semi_sync_master_waiting" not in fams or not fams["relayproxy_semi_sync_master_waiting"].samples
    assert value(fams, "relayproxy_semi_sync_unrequested_transactions",
                 "relayproxy_semi_sync_unrequested_transactions_total") == 0
    fams = scrape(base_status(
        semi_sync=True, semi_sync_master_waiting=False, semi_sync_ack_requests=40, semi_sync_last_ack_request_time=1e9,
        semi_sync_unrequested_transactions=3, semi_sync_last_unrequested_time=1e9 + 5,
        semi_sync_last_unrequested_gtid="0-1-57"))
    assert value(fams, "relayproxy_semi_sync_master_waiting") == 0
    assert fams["relayproxy_semi_sync_unrequested_transactions"].type == "counter"
    assert value(fams, "relayproxy_semi_sync_unrequested_transactions",
                 "relayproxy_semi_sync_unrequested_transactions_total") == 3
    assert value(fams, "relayproxy_semi_sync_ack_requests", "relayproxy_semi_sync_ack_requests_total") == 40
    assert value(fams, "relayproxy_semi_sync_last_ack_request_timestamp_seconds") == 1e9
    assert value(fams, "relayproxy_semi_sync_last_unrequested_timestamp_seconds") == 1e9 + 5
    assert value(scrape(base_status(semi_sync_master_waiting=True)), "relayproxy_semi_sync_master_waiting") == 1


def test_process_collectors_are_registered():
    fams = scrape(base_status(), process=True)
    assert "process_cpu_seconds" in fams and "python_info" in fams


def test_fsync_stats_buckets_follow_prometheus_le_and_reject_bad_bounds():
    stats = FsyncStats((0.001, 0.01))
    for seconds in (0.001, 0.0011, 0.5):  # on a bound counts in that bucket
        stats.observe(seconds, 10)
    assert stats.cumulative_buckets() == [("0.001", 1), ("0.01", 2), ("+Inf", 3)]
    assert stats.summary()["fsyncs"] == 3 and stats.summary()["fsync_bytes"] == 30
    assert stats.summary()["fsync_last_seconds"] == 0.5 and stats.summary()["fsync_max_seconds"] == 0.5
    for bad in ((), (0.01, 0.001), (0, 1), (0.1, 0.1)):
        with pytest.raises(ValueError, match="strictly increasing"):
            FsyncStats(bad)


# ---------------------------------------------------------------------------------------------
# The fsync timings, from a real store


def test_every_fdatasync_of_a_real_store_is_observed_with_its_bytes(tmp_path):
    stats = FsyncStats()
    store = RelayStore.open(tmp_path / "relay", sync=SyncPolicy(), on_fsync=stats.observe)
    try:
        store.start_file("binlog.000001")
        feeder = Feeder(store)
        feeder.feed_all(mysql_image("binlog.000002", groups=6))
        after_first = stats.count
        assert after_first == store.fsyncs > 0
        store.start_file("binlog.000002")
        feeder.parser.reset()
        feeder.feed_all(mysql_image(rotate=False, groups=3, start=store.pending_gtids))
        assert stats.count == store.fsyncs > after_first
    finally:
        store.close()
    assert stats.count == store.fsyncs
    assert stats.sum_seconds > 0 and stats.last_seconds is not None
    files = [tmp_path / "relay" / n for n in ("binlog.000001", "binlog.000002")]
    assert stats.bytes == sum(p.stat().st_size - 4 for p in files)  # every byte after the magic, synced once
    assert stats.cumulative_buckets()[-1] == ("+Inf", stats.count)


def test_a_reopened_store_keeps_reporting_to_the_same_stats(tmp_path):
    stats = FsyncStats()
    image = mysql_image(rotate=False, groups=4)
    events = split_events(image)
    store = RelayStore.open(tmp_path / "relay", on_fsync=stats.observe)
    store.start_file("binlog.000001")
    feeder = Feeder(store)
    for offset, event in events[:4]:
        feeder.feed(offset, event)
    store.close()
    before = stats.count
    reopened = RelayStore.open(tmp_path / "relay", on_fsync=stats.observe)  # what the session does after a failure
    try:
        feeder = Feeder(reopened)
        for offset, event in events:
            if offset >= reopened.current_end:  # recovery kept the complete groups; the rest comes again
                feeder.feed(offset, event)
        assert stats.count > before and stats.count == before + reopened.fsyncs
    finally:
        reopened.close()


# ---------------------------------------------------------------------------------------------
# The status document: disk usage and replica lag across files


def fake_upstream(**status) -> UpstreamSources:
    return UpstreamSources(
        status=UpstreamStatus(io_running=True, connects=2, master_flavour="mysql", **status),
        receiver=SimpleNamespace(counters=ReceiverCounters(events=9, bytes=999, transactions=3),
                                 master_position=None, master_timestamp=0, semi_sync=SemiSyncTally()),
    )


def fake_cfg(relay_dir):
    return SimpleNamespace(master=("db1", 3306), gtid_mode="mysql", server_id=100, relay_dir=relay_dir,
                           sync_mode="transaction")


def two_file_store(tmp_path, stats=None) -> RelayStore:
    store = RelayStore.open(tmp_path / "relay", on_fsync=stats.observe if stats else None)
    store.start_file("binlog.000001")
    feeder = Feeder(store)
    feeder.feed_all(mysql_image("binlog.000002", groups=6))
    store.start_file("binlog.000002")
    feeder.parser.reset()
    feeder.feed_all(mysql_image(rotate=False, groups=2, start=store.pending_gtids))
    return store


def test_status_reports_disk_usage_and_per_replica_lag_across_files(tmp_path):
    stats = FsyncStats()
    store = two_file_store(tmp_path, stats)
    try:
        first, second = (store.path(n) for n in store.files())
        size1, size2 = first.stat().st_size, second.stat().st_size
        old = time.time() - 3600
        os.utime(first, (old, old))
        horizon = store.horizon.snapshot()
        assert horizon.file == "binlog.000002" and horizon.position == size2
        connections = {
            5: ConnectionState(conn_id=5, user="repl", host="10.1.1.1", registration=ReplicaRegistration(server_id=21),
                               dump=DumpProgress(file="binlog.000001", position=200, started=time.time() - 30)),
            6: ConnectionState(conn_id=6, user="repl", host="10.1.1.2", registration=ReplicaRegistration(server_id=22),
                               dump=DumpProgress(file="binlog.000002", position=size2, caught_up_at=time.time() - 60)),
            7: ConnectionState(conn_id=7, user="repl", host="10.1.1.3",
                               dump=DumpProgress(file="binlog.000002", position=120, caught_up_at=time.time() - 5)),
        }
        stops = ReplayStops(None)  # server 21 fenced at the end of binlog.000001, server 22 in the second file
        stops.set(ReplayStop(21, "binlog.000001", size1, label="before GTID x"))
        stops.set(ReplayStop(22, "binlog.000002", 120))
        downstream = SimpleNamespace(ctx=SimpleNamespace(connections=connections, replay_stops=stops),
                                     describe_logins=dict)
        retention = SimpleNamespace(stats=RetentionStats(runs=4, purges=1, files_purged=2, bytes_purged=9000,
                                                         last_purge=1.7e9))
        sources = StatusSources(store, fake_upstream(errors={"io": 2}), downstream=downstream, fsync=stats,
                                retention=retention)
        doc = relay_status(fake_cfg(store.relay_dir), sources)

        assert doc["relay_files"] == 2 and doc["relay_disk_bytes"] == size1 + size2
        assert doc["relay_oldest_file"] == "binlog.000001" and doc["relay_oldest_file_age_seconds"] >= 3600
        vfs = os.statvfs(store.relay_dir)
        assert 0 < doc["relay_fs_free_bytes"] <= vfs.f_blocks * vfs.f_frsize == doc["relay_fs_size_bytes"]
        assert doc["horizon_file_index"] == 2 and doc["reconnects"] == 1
        assert doc["errors_by_kind"] == {**dict.fromkeys(UPSTREAM_ERROR_KINDS, 0), "io": 2}
        assert doc["fsyncs"] == stats.count == store.fsyncs and doc["fsync_bytes"] == stats.bytes
        by_id = {r["connection_id"]: r for r in doc["replicas"]}
        # Behind by a file: the rest of binlog.000001, then binlog.000002 up to the horizon (magic not counted).
        assert by_id[5]["lag_bytes"] == (size1 - 200) + (size2 - 4)
        assert 30 <= by_id[5]["lag_seconds"] < 30 + 60  # never caught up on this connection: since the dump began
        assert by_id[6]["lag_bytes"] == 0 and by_id[6]["lag_seconds"] == 0
        assert by_id[7]["lag_bytes"] == size2 - 120 and 5 <= by_id[7]["lag_seconds"] < 5 + 60

        fams = families(generate_latest(build_registry(
            lambda: relay_status(fake_cfg(store.relay_dir), sources), stats,
            process=False)).decode())
        assert value(fams, "relayproxy_replicas_connected") == 3
        assert value(fams, "relayproxy_replica_lag_bytes", connection_id="5", server_id="21") == (size1 - 200) + (size2 - 4)
        assert value(fams, "relayproxy_replica_lag_bytes", connection_id="7", server_id="") == size2 - 120
        assert value(fams, "relayproxy_relay_disk_bytes") == size1 + size2
        assert value(fams, "relayproxy_fsync_seconds", "relayproxy_fsync_seconds_count") == store.fsyncs
        assert value(fams, "relayproxy_info", flavour="mysql", gtid_mode="mysql") == 1
        assert value(fams, "relayproxy_retention_files_purged", "relayproxy_retention_files_purged_total") == 2
        assert value(fams, "relayproxy_retention_bytes_purged", "relayproxy_retention_bytes_purged_total") == 9000
        assert value(fams, "relayproxy_retention_runs", "relayproxy_retention_runs_total") == 4
        assert value(fams, "relayproxy_retention_last_purge_timestamp_seconds") == 1.7e9

        assert [(d["server_id"], [(x["connection_id"], x["at_stop"]) for x in d["dumps"]], d["persistent"])
                for d in doc["replay_stops"]] == [(21, [(5, False)], False), (22, [(6, True)], False)]
        assert doc["replay_stops"][0]["label"] == "before GTID x" and doc["replay_stops"][0]["position"] == size1
        assert value(fams, "relayproxy_replay_stops") == 2
        assert value(fams, "relayproxy_replay_stop_position_bytes", server_id="21",
                     master_log_file="binlog.000001") == size1
        assert value(fams, "relayproxy_replay_stop_reached", server_id="21") == 0
        assert value(fams, "relayproxy_replay_stop_reached", server_id="22") == 1

        text = format_status(doc)
        assert (f"Replay stop:            server_id 21 at binlog.000001:{size1} (before GTID x), 1 dump(s) short of "
                "it, in memory only") in text
        assert "Replay stop:            server_id 22 at binlog.000002:120, reached, in memory only" in text
        assert "Replicas:               3" in text and f"{size1 - 200 + size2 - 4} bytes" in text
        assert f"Fsync:                  {store.fsyncs} syncs" in text
        assert "Reconnects:             1; errors: io 2" in text
    finally:
        store.close()


def test_status_shows_the_peer_catch_up_in_force(tmp_path):
    # docs/failover.md, "Peer catch-up within an epoch": /status has `peer_catch_up` (was kept in the session only).
    store = two_file_store(tmp_path)
    try:
        upstream = fake_upstream()
        assert relay_status(fake_cfg(store.relay_dir), StatusSources(store, upstream))["peer_catch_up"] is None
        peer = {"peer": "relay1:3307", "peer_server_id": 101, "epoch": 1, "master_server_id": 1,
                "from": "binlog.000002:120", "verified_bytes": 120}
        upstream.status.peer_catch_up = dict(peer)
        assert relay_status(fake_cfg(store.relay_dir), StatusSources(store, upstream))["peer_catch_up"] == peer
    finally:
        store.close()


def test_bytes_behind_and_file_index():
    names = ["b.000001", "b.000002", "b.000003"]
    sizes = {"b.000001": 1000, "b.000002": 504, "b.000003": 300}
    assert bytes_behind(names, sizes, ("b.000003", 100), ("b.000003", 300)) == 200
    assert bytes_behind(names, sizes, ("b.000003", 300), ("b.000003", 300)) == 0
    assert bytes_behind(names, sizes, ("b.000001", 900), ("b.000003", 104)) == 100 + 500 + 100
    assert bytes_behind(names, sizes, ("b.000001", 1000), ("b.000002", 4)) == 0
    assert bytes_behind(names, sizes, ("gone.000001", 4), ("b.000003", 4)) is None  # purged or unknown
    assert bytes_behind(names, sizes, ("b.000003", 4), ("b.000001", 4)) is None  # past the horizon's file
    assert bytes_behind(names, {"b.000001": 1000}, ("b.000001", 4), ("b.000003", 4)) is None  # a size missing
    assert file_index("mysql-bin.000042") == 42 and file_index("binlog.1000000") == 1000000
    assert file_index("no-number") is None and file_index(None) is None and file_index("x.abc") is None


def test_upstream_errors_are_classified_into_a_small_fixed_set_of_kinds():
    def failed_store(code):
        try:
            try:
                raise OSError(code, os.strerror(code))
            except OSError as exc:
                raise RelayStoreFailed("relay store failed earlier") from exc
        except RelayStoreFailed as exc:
            return exc

    cases = {
        "io": [ConnectionResetError(), OSError(errno.EHOSTUNREACH, "no route"), MasterStreamEnded("end"),
               MySQLError(2013, "HY000", "Lost connection")],
        "timeout": [asyncio.TimeoutError()],
        "master": [MySQLError(1236, "HY000", "Could not find first log file name in binary log index file")],
        "protocol": [StreamError("unexpected packet in the binlog stream")],
        "crc": [ChecksumMismatch("CRC32 mismatch in WRITE_ROWS_EVENT event at binlog.000001:500")],
        "store": [failed_store(errno.EIO), OSError(errno.EIO, "I/O error")],
        "disk_full": [failed_store(errno.ENOSPC), OSError(errno.EDQUOT, "quota"), OSError(errno.ENOSPC, "full")],
        "internal": [RuntimeError("bug")],
    }
    assert set(cases) == set(UPSTREAM_ERROR_KINDS)
    for kind, errors in cases.items():
        for exc in errors:
            assert upstream_error_kind(exc) == kind, (exc, kind)


# ---------------------------------------------------------------------------------------------
# The real chain: master -> relayproxy run --listen -> MariaDB replica


def http_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


def wait_metrics(relay, predicate, what: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    fams = None
    while time.monotonic() < deadline:
        fams = families(relay.metrics())
        if predicate(fams):
            return fams
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last /metrics:\n"
                         + "\n".join(f"{s.name}{s.labels} {s.value}" for f in (fams or {}).values()
                                     for s in f.samples if s.name.startswith("relayproxy_"))
                         + "\n" + relay.log_tail())


def hop_counts(fams) -> dict[str, float]:
    """The count of each stage of relayproxy_hop_seconds."""
    return {s.labels["stage"]: s.value for s in fams["relayproxy_hop_seconds"].samples if s.name.endswith("_count")}


def in_step(master, replica_id: int):
    """/metrics says: horizon == the master's position now, the replica has all of it, nothing behind."""

    def check(fams) -> bool:
        file, pos = master_status(master)  # re-read: MariaDB may write a BINLOG_CHECKPOINT after a rotation
        horizon = [(s.labels["master_log_file"], s.value) for s in fams["relayproxy_horizon_position_bytes"].samples]
        replica = [(s.labels["master_log_file"], s.value) for s in fams["relayproxy_replica_position_bytes"].samples
                   if s.labels["server_id"] == str(replica_id)]
        lag = [s.value for s in fams["relayproxy_replica_lag_bytes"].samples if s.labels["server_id"] == str(replica_id)]
        seconds = [s.value for s in fams["relayproxy_replica_lag_seconds"].samples
                   if s.labels["server_id"] == str(replica_id)]
        return horizon == [(file, pos)] and replica == [(file, pos)] and lag == [0] and seconds == [0]

    return check


def test_metrics_of_a_real_chain_follow_the_master_the_replica_and_a_lost_upstream(chain, mariadb):
    master, relay = chain
    mixed_load(master, big=False)
    relay.wait_caught_up(master)
    replica = mariadb("replica", server_id=3)
    change_master(replica, relay.listen_port, file=None)  # MASTER_USE_GTID=slave_pos
    replica.execute("START SLAVE")
    wait_replica(replica, master)
    fams = wait_metrics(relay, in_step(master, 3), "relay and replica in step with the master")

    file, pos = master_status(master)
    assert value(fams, "relayproxy_master_position_bytes", master_log_file=file) == pos
    assert value(fams, "relayproxy_horizon_file_index") == int(file.rsplit(".", 1)[1])
    assert value(fams, "relayproxy_io_running") == 1 and value(fams, "relayproxy_lag_bytes") == 0
    assert value(fams, "relayproxy_replicas_connected") == 1
    assert value(fams, "relayproxy_fsync_seconds", "relayproxy_fsync_seconds_count") > 0
    assert value(fams, "relayproxy_fsync_bytes", "relayproxy_fsync_bytes_total") > 0
    # Where the syncs ran (sync_on_loop = auto): every fdatasync counted once on one of three sides (one more
    # than the histogram's count when a sync was in flight at the scrape), the average what auto reads.
    syncs = value(fams, "relayproxy_fsync_seconds", "relayproxy_fsync_seconds_count")
    on_loop = value(fams, "relayproxy_fsyncs_on_loop", "relayproxy_fsyncs_on_loop_total")
    off_loop = value(fams, "relayproxy_fsyncs_off_loop", "relayproxy_fsyncs_off_loop_total")
    by_store = value(fams, "relayproxy_fsyncs_by_store", "relayproxy_fsyncs_by_store_total")  # e.g. at a rotation
    assert syncs <= on_loop + off_loop + by_store <= syncs + 1 and syncs > 0
    assert value(fams, "relayproxy_fsync_on_loop") in (0, 1)
    assert value(fams, "relayproxy_fsync_average_seconds") > 0
    assert value(fams, "relayproxy_transactions_received", "relayproxy_transactions_received_total") > 0
    assert value(fams, "relayproxy_reconnects", "relayproxy_reconnects_total") == 0
    assert value(fams, "relayproxy_replica_events_sent", "relayproxy_replica_events_sent_total", server_id="3") > 0
    sizes = sum(p.stat().st_size for p in relay.relay_dir.iterdir() if p.name.startswith("master-bin."))
    assert value(fams, "relayproxy_relay_disk_bytes") == sizes
    assert value(fams, "relayproxy_relay_files") == len(master.binlog_files())
    assert value(fams, "relayproxy_info", flavour="mariadb", gtid_mode="mariadb") == 1
    assert "process_cpu_seconds" in fams
    # Where the transactions' time went (relay/hoptimes.py): every stage of the hop saw them, and the send stage
    # the replica's, once it waits at the horizon for new transactions.
    mixed_load(master, rounds=1, big=False)
    fams = wait_metrics(relay, lambda f: in_step(master, 3)(f) and hop_counts(f)["send"] > 0, "a send at the horizon")
    hop = hop_counts(fams)
    assert set(hop) == set(STAGES)
    received = value(fams, "relayproxy_transactions_received", "relayproxy_transactions_received_total")
    assert all(hop[stage] > 0 for stage in STAGES if stage != "ack"), hop
    assert hop["receive"] == hop["fsync"] == hop["durable"] <= received and hop["ack"] == 0  # no semi-sync here

    # Kill the relay's dump thread on the master: the relay reconnects, and the counters say so.
    dumps = master.execute("SELECT id FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%'")
    assert len(dumps) == 1, dumps
    master.execute(f"KILL {dumps[0][0]}")
    fams = wait_metrics(
        relay,
        lambda f: value(f, "relayproxy_reconnects", "relayproxy_reconnects_total") >= 1
        and value(f, "relayproxy_io_running") == 1,
        "a reconnect after KILL",
    )
    assert value(fams, "relayproxy_connect_failures", "relayproxy_connect_failures_total") >= 1
    assert sum(s.value for s in fams["relayproxy_errors"].samples) >= 1
    mixed_load(master, rounds=1, big=False)
    wait_replica(replica, master)
    fams = wait_metrics(relay, in_step(master, 3), "relay and replica in step after the reconnect")
    status = relay.status()  # read after the scrape: its fsync count can only be the same or larger
    assert status["fsyncs"] >= value(fams, "relayproxy_fsync_seconds", "relayproxy_fsync_seconds_count") > 0
    [replica_doc] = [r for r in status["replicas"] if r["server_id"] == 3]
    assert replica_doc["lag_bytes"] == 0 and replica_doc["lag_seconds"] == 0


def test_http_api_serves_the_same_registry_over_http(tmp_path):
    """HttpApi wires build_registry: /metrics over a socket has the families and the fsync histogram."""
    store = two_file_store(tmp_path)
    stats = FsyncStats()
    stats.observe(0.002, 100)
    upstream = fake_upstream()
    cfg = fake_cfg(store.relay_dir)

    async def main():
        api = HttpApi(lambda: relay_status(cfg, StatusSources(store, upstream, fsync=stats)), fsync=stats)
        host, port = await api.start("127.0.0.1", 0)
        try:
            text = await asyncio.to_thread(http_get, port, "/metrics")
            status = await asyncio.to_thread(http_get, port, "/status")
        finally:
            await api.close()
        return text, status

    try:
        text, status_text = asyncio.run(main())
    finally:
        store.close()
    fams = families(text)
    assert value(fams, "relayproxy_fsync_seconds", "relayproxy_fsync_seconds_count") == 1
    assert value(fams, "relayproxy_relay_files") == 2 and "process_cpu_seconds" in fams
    assert '"fsync_last_seconds": 0.002' in status_text and '"relay_disk_bytes"' in status_text


def test_the_hop_stages_reach_status_metrics_and_the_status_text(tmp_path):
    """relay/hoptimes.py's histograms: /status `hop`, relayproxy_hop_seconds{stage}, and one line of `relayproxy
    status` with the stages' means."""
    store = two_file_store(tmp_path)
    hop = HopTimes()
    hop.batch(1.0, 1.0002, 1.0005, 4)
    hop.sync_began(1.0006)
    hop.sync_published(1.0016, 0.0008)
    hop.sent(0.0001, replicas=3)
    try:
        doc = relay_status(fake_cfg(store.relay_dir), StatusSources(store, fake_upstream(), hop=hop))
        fams = families(generate_latest(build_registry(lambda: doc, hop=hop, process=False)).decode())
    finally:
        store.close()
    assert doc["hop"]["durable"]["count"] == 4
    assert doc["hop"]["durable"]["p99_le_seconds"] == pytest.approx(0.0016)  # the maximum: under its bucket's bound
    assert doc["hop"]["send"]["count"] == 3 and doc["hop"]["ack"]["count"] == 0
    assert value(fams, "relayproxy_hop_seconds", "relayproxy_hop_seconds_count", stage="fsync") == 4
    assert value(fams, "relayproxy_hop_seconds", "relayproxy_hop_seconds_bucket", stage="send", le="0.0001") == 3
    line = next(x for x in format_status(doc).splitlines() if x.startswith("Hop"))
    assert "receive 0.20 ms" in line and "durable 1.60 ms" in line and "send 0.10 ms" in line and "ack" not in line


def test_where_the_syncs_run_reaches_status_and_metrics(tmp_path):
    """relay/sync_driver.py's counts: /status `sync_driver` and the relayproxy_fsync_on_loop family; auto's side
    follows the average it reads, and a slow sync's pause sends the next ones off the loop whatever the average."""
    from relayproxy.relay.sync_driver import ON_LOOP_AUTO_MAX, SyncDriver

    store = two_file_store(tmp_path)
    driver = SyncDriver(on_loop="auto")
    driver.syncs_on_loop, driver.syncs_off_loop, driver.fsync_average = 7, 2, ON_LOOP_AUTO_MAX / 2
    stats = FsyncStats()
    try:
        doc = relay_status(fake_cfg(store.relay_dir), StatusSources(store, fake_upstream(), fsync=stats, sync=driver,
                                                                    syncs_by_store=store.fsyncs_inline))
        fams = families(generate_latest(build_registry(lambda: doc, stats, process=False)).decode())
        assert doc["sync_driver"] == {"setting": "auto", "on_loop_now": True, "syncs_on_loop": 7,
                                      "syncs_off_loop": 2, "on_loop_pauses": 0,
                                      "fsync_average_seconds": ON_LOOP_AUTO_MAX / 2,
                                      "syncs_by_store": store.fsyncs}  # the feeder's syncs: no driver ran one
        assert value(fams, "relayproxy_fsync_on_loop") == 1
        assert value(fams, "relayproxy_fsyncs_on_loop", "relayproxy_fsyncs_on_loop_total") == 7
        assert value(fams, "relayproxy_fsyncs_off_loop", "relayproxy_fsyncs_off_loop_total") == 2
        assert value(fams, "relayproxy_fsyncs_by_store", "relayproxy_fsyncs_by_store_total") == store.fsyncs > 0
        assert value(fams, "relayproxy_fsync_average_seconds") == ON_LOOP_AUTO_MAX / 2
        driver.fsync_average = ON_LOOP_AUTO_MAX * 2  # a slower disk: auto moves the syncs to the fsync thread
        assert driver.describe()["on_loop_now"] is False
        driver.fsync_average, driver.on_loop_pauses = 0.0001, 1
        driver.on_loop_paused_until = time.monotonic() + 60  # after a slow one on the loop
        doc = relay_status(fake_cfg(store.relay_dir), StatusSources(store, fake_upstream(), fsync=stats, sync=driver))
        fams = families(generate_latest(build_registry(lambda: doc, stats, process=False)).decode())
        assert value(fams, "relayproxy_fsync_on_loop") == 0
        assert value(fams, "relayproxy_fsync_on_loop_pauses", "relayproxy_fsync_on_loop_pauses_total") == 1
        line = next(x for x in format_status(doc).splitlines() if x.startswith("Fsync runs:"))  # relayproxy status
        assert line.endswith("7 on the loop, 2 in the fsync thread, 0 by the store; sync_on_loop auto, next in the "
                             "fsync thread; slow-sync pauses: 1"), line
        assert SyncDriver(on_loop=True).describe()["setting"] == "true"
        # Without a sync driver (SHOW REPLICA STATUS, serve) the family is left out, not guessed.
        doc = relay_status(fake_cfg(store.relay_dir), StatusSources(store, fake_upstream(), fsync=stats))
        fams = families(generate_latest(build_registry(lambda: doc, stats, process=False)).decode())
        assert "sync_driver" not in doc and "relayproxy_fsync_on_loop" not in fams
    finally:
        store.close()


def test_the_transaction_indexer_health_reaches_status_and_metrics(tmp_path):
    """RelayStore.txindex_health: /status `txindex` and relayproxy_txindex_*; a served directory has none."""
    store = two_file_store(tmp_path)
    try:
        assert store._txindexer.wait_idle()
        health = store.txindex_health()
        doc = relay_status(fake_cfg(store.relay_dir), StatusSources(store, fake_upstream(), txindex=health))
        fams = families(generate_latest(build_registry(lambda: doc, process=False)).decode())
        bare = relay_status(fake_cfg(store.relay_dir), StatusSources(store, fake_upstream()))
    finally:
        store.close()
    assert doc["txindex"]["mode"] == "thread" and doc["txindex"]["errors"] == 0 and doc["txindex"]["passes"] >= 2
    assert value(fams, "relayproxy_txindex_passes", "relayproxy_txindex_passes_total") == health["passes"]
    assert value(fams, "relayproxy_txindex_errors", "relayproxy_txindex_errors_total") == 0
    assert "relayproxy_txindex_child_starts" not in fams  # a thread: no child
    assert "txindex" not in bare
    text = format_status(doc)
    # 1 file finished: the closed file, whose index the indexer built
    assert f"Transaction index:      thread; {health['passes']} passes, 1 files finished, 0 errors" in text
    child = {**doc, "txindex": {"mode": "child", "child_pid": 42, "child_starts": 2, "passes": 9, "files_finished": 1,
                                "errors": 1, "last_error": "the transaction indexer (pid 41) exited"}}
    assert ("Transaction index:      child pid 42, 2 started; 9 passes, 1 files finished, 1 errors; last error: the "
            "transaction indexer (pid 41) exited") in format_status(child)
    assert "Transaction index" not in format_status(bare)
