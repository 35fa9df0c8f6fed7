"""Prometheus metrics: the status document and the fsync timings as metric families, built at scrape time.

Nothing here sits on the per-event path. The receiver, the session and the dump senders keep plain
counters; ``RelayCollector`` reads one status document per scrape (stat()s of the relay files, no
reads) and turns it into metric families. Per-replica series come and go with the replica's
connection, because a custom collector only reports what exists at scrape time. The one thing
recorded as it happens is each fdatasync's latency, into ``FsyncStats`` (a plain histogram: the
relay store calls ``observe`` once per sync, and knows nothing of Prometheus).
Names, labels and meanings are documented in docs/metrics.md; keep the two in step.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from ..relay.hoptimes import STAGES, Histogram, HopTimes

# From a fast NVMe fdatasync (well under 1 ms) to a busy spinning disk or network volume (~1 s).
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)

REPLICA_LABELS = ("server_id", "connection_id", "user", "host")


class FsyncStats:
    """Cumulative latency histogram of the relay store's fdatasyncs, plus bytes made durable.

    Plain Python so the store needs no Prometheus import: pass ``observe`` as the store's
    ``on_fsync``. Called once per sync (never per event) on the event loop's thread, which is also
    where scrapes read it. The histogram is relay/hoptimes.py's, as the hop's stages use.
    """

    def __init__(self, buckets: Iterable[float] = FSYNC_BUCKETS):
        self.histogram = Histogram(buckets)
        self.buckets = self.histogram.buckets
        self.bytes = 0

    def observe(self, seconds: float, nbytes: int = 0) -> None:
        """One fdatasync took ``seconds`` and made ``nbytes`` durable."""
        self.histogram.observe(seconds)
        self.bytes += nbytes

    @property
    def count(self) -> int:
        return self.histogram.count

    @property
    def sum_seconds(self) -> float:
        return self.histogram.sum_seconds

    @property
    def last_seconds(self) -> float | None:
        return self.histogram.last_seconds

    @property
    def max_seconds(self) -> float:
        return self.histogram.max_seconds

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """``[(le, count of syncs <= le), ..., ("+Inf", count)]`` as Prometheus exposes them."""
        return self.histogram.cumulative_buckets()

    def summary(self) -> dict[str, Any]:
        """The /status view: how many, how long, how much."""
        h = self.histogram
        return {
            "fsyncs": h.count,
            "fsync_bytes": self.bytes,
            "fsync_seconds_sum": round(h.sum_seconds, 6),
            "fsync_last_seconds": None if h.last_seconds is None else round(h.last_seconds, 6),
            "fsync_max_seconds": round(h.max_seconds, 6),
        }


class RelayCollector:
    """Turns one status document (``relayproxy.ops.status.relay_status``) per scrape into metric families."""

    def __init__(self, status: Callable[[], dict[str, Any]], fsync: FsyncStats | None = None,
                 hop: HopTimes | None = None):
        self._status = status
        self._fsync = fsync
        self._hop = hop

    def describe(self) -> list:
        return []  # series depend on the relay's state; nothing to check at registration

    def collect(self) -> Iterator:
        s = self._status()
        yield from _info(s)
        yield from _master(s)
        yield from _upstream(s)
        yield from _fsync(s, self._fsync)
        yield from _hop(self._hop)
        yield from _disk(s)
        yield from _retention(s.get("retention"))
        yield from _archive(s.get("archive"))
        yield from _txindex(s.get("txindex"))
        yield from _replicas(s.get("replicas") or [])
        yield from _replay_stops(s.get("replay_stops"))
        yield from _logins(s.get("logins"))
        yield from _http(s.get("http"))


def _gauge(name: str, help_text: str, value) -> Iterator[GaugeMetricFamily]:
    if value is not None:
        yield GaugeMetricFamily(name, help_text, value=value)


def _counter(name: str, help_text: str, value) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value or 0)


def _info(s: dict[str, Any]) -> Iterator:
    info = GaugeMetricFamily(
        "relayproxy_info", "Always 1; the labels describe the relay and its master",
        labels=["version", "flavour", "master_server_version", "gtid_mode"],
    )
    info.add_metric(
        [s.get("version") or "", s.get("flavour") or "", s.get("master_server_version") or "",
         s.get("gtid_mode") or ""],
        1,
    )
    yield info


def _master(s: dict[str, Any]) -> Iterator:
    """Which master the relay follows (the one in force: CHANGE MASTER's choice or --master) and its epoch."""
    master = s.get("master")
    if master:
        family = GaugeMetricFamily(
            "relayproxy_master_info", "Always 1; the labels name the master in force and where the choice came from",
            labels=["host", "port", "server_id", "source"],
        )
        family.add_metric([str(master.get("host") or ""), str(master.get("port") or ""),
                           _text(s.get("master_server_id")), str(master.get("source") or "")], 1)
        yield family
    epochs = s.get("epochs")
    if epochs:
        yield GaugeMetricFamily("relayproxy_upstream_epoch",
                                "Upstream epochs the relay's files span: 1 until the first switch of masters",
                                value=epochs[-1]["epoch"])


def _upstream(s: dict[str, Any]) -> Iterator:
    horizon = GaugeMetricFamily(
        "relayproxy_horizon_position_bytes",
        "Read_Master_Log_Pos: end of the last complete, durable transaction, in the master's file",
        labels=["master_log_file"],
    )
    horizon.add_metric([s.get("master_log_file") or ""], s.get("read_master_log_pos") or 0)
    yield horizon
    yield from _gauge("relayproxy_horizon_file_index", "Sequence number of the horizon's file name (binlog.000042: 42)",
                      s.get("horizon_file_index"))
    master = s.get("master_position")
    if master:
        family = GaugeMetricFamily(
            "relayproxy_master_position_bytes", "Latest master position the relay has seen (events, heartbeats)",
            labels=["master_log_file"],
        )
        family.add_metric([master["file"]], master["position"])
        yield family
    yield from _gauge("relayproxy_master_file_index", "Sequence number of the master's latest seen file name",
                      s.get("master_file_index"))
    yield GaugeMetricFamily("relayproxy_io_running", "1 while the upstream connection streams", value=int(bool(s.get("io_running"))))
    yield GaugeMetricFamily("relayproxy_semi_sync_active", "1 while the upstream connection uses semi-sync",
                            value=int(bool(s.get("semi_sync") and s.get("io_running"))))
    waiting = s.get("semi_sync_master_waiting")
    yield from _gauge("relayproxy_semi_sync_master_waiting",
                      "1 when the latest transaction end of the semi-sync stream asked for an ACK, 0 when it did not "
                      "(absent until one arrives on the current stream)", None if waiting is None else int(waiting))
    yield from _gauge("relayproxy_semi_sync_last_ack_request_timestamp_seconds",
                      "Unix time the master last asked the relay to ACK a transaction", s.get("semi_sync_last_ack_request_time"))
    yield from _gauge("relayproxy_semi_sync_last_unrequested_timestamp_seconds",
                      "Unix time of the latest semi-sync transaction the master did not ask the relay to ACK",
                      s.get("semi_sync_last_unrequested_time"))
    yield from _gauge("relayproxy_lag_bytes", "Master position minus horizon (absent while they are in different files)",
                      s.get("lag_bytes"))
    yield from _gauge("relayproxy_lag_seconds", "Seconds_Behind_Master of the relay (absent while not streaming)",
                      s.get("seconds_behind_master"))
    for name, key, help_text in (
        ("events_received", "events_received", "Binlog events received from the master"),
        ("bytes_received", "bytes_received", "Binlog event bytes received from the master"),
        ("transactions_received", "transactions_received", "Complete transactions received from the master"),
        ("duplicate_events_skipped", "duplicate_events_skipped",
         "Re-sent events after a reconnect, verified against the stored bytes and not written again"),
        ("heartbeats_received", "heartbeats_received", "Heartbeat events received from the master"),
        ("connects", "connects", "Successful connections to the master"),
        ("reconnects", "reconnects", "Successful connections to the master after the first one"),
        ("connect_failures", "connect_failures", "Upstream connections or attempts that ended in an error"),
        ("store_failures", "store_failures", "Rounds that ended because the relay store could not write (full disk, EIO)"),
        ("semi_sync_acks", "semi_sync_acks", "Semi-sync ACKs sent to the master, each after a durable write"),
        ("semi_sync_ack_requests", "semi_sync_ack_requests",
         "Transactions whose last event asked the relay for a semi-sync ACK (NEED_ACK)"),
        ("semi_sync_unrequested_transactions", "semi_sync_unrequested_transactions",
         "Transactions received on a semi-sync stream whose end did not ask for an ACK (master in fallback, or a later one awaited)"),
        ("semi_sync_replica_waits", "semi_sync_replica_waits",
         "Upstream ACKs that first waited for semi-sync replicas of the relay"),
        ("semi_sync_replica_timeouts", "semi_sync_replica_timeouts",
         "Upstream ACKs sent after giving up waiting for semi-sync replicas of the relay"),
    ):
        yield _counter(f"relayproxy_{name}", help_text, s.get(key))
    errors = CounterMetricFamily(
        "relayproxy_errors", "Errors that ended an upstream connection (network, master, stream, store), by kind",
        labels=["kind"],
    )
    for kind, n in sorted((s.get("errors_by_kind") or {}).items()):
        errors.add_metric([kind], n)
    yield errors


def _fsync(s: dict[str, Any], stats: FsyncStats | None) -> Iterator:
    if stats is None:
        return
    yield HistogramMetricFamily(
        "relayproxy_fsync_seconds", "Latency of each fdatasync of relay data (one per group commit)",
        buckets=stats.cumulative_buckets(), sum_value=stats.sum_seconds,
    )
    yield _counter("relayproxy_fsync_bytes", "Relay bytes made durable by fdatasync", stats.bytes)
    driver = s.get("sync_driver")
    if driver is None:
        return
    yield from _gauge("relayproxy_fsync_on_loop", "1 when the next fdatasync runs on the event loop's thread, 0 in "
                      "the fsync thread (sync_on_loop; auto follows the average, a slow one pauses it)",
                      int(driver["on_loop_now"]))
    yield _counter("relayproxy_fsyncs_on_loop", "fdatasyncs run on the event loop's thread", driver["syncs_on_loop"])
    yield _counter("relayproxy_fsyncs_off_loop", "fdatasyncs run in the fsync thread (or with a checkpoint, the pool)",
                   driver["syncs_off_loop"])
    yield _counter("relayproxy_fsyncs_by_store", "fdatasyncs the store ran itself on the loop's thread, not through "
                   "the sync driver: before a new file, at an epoch switch, at a stop", driver["syncs_by_store"])
    yield _counter("relayproxy_fsync_on_loop_pauses", "Slow fdatasyncs on the loop that sent the next ones to the "
                   "fsync thread for a while", driver["on_loop_pauses"])
    yield from _gauge("relayproxy_fsync_average_seconds", "Moving average of the recent fdatasyncs (what auto reads)",
                      driver["fsync_average_seconds"])


def _hop(hop: HopTimes | None) -> Iterator:
    """The hop's stages (relay/hoptimes.py): where a transaction's time goes from its arrival to a replica."""
    if hop is None:
        return
    family = HistogramMetricFamily(
        "relayproxy_hop_seconds", "Time of each stage of a transaction's hop through the relay, per transaction "
        "(send: per replica and advance); stage durable = receive + write + sync_wait + fsync + fsync_handoff",
        labels=["stage"])
    for stage in STAGES:
        hist = hop.stages[stage]
        family.add_metric([stage], hist.cumulative_buckets(), hist.sum_seconds)
    yield family


def _disk(s: dict[str, Any]) -> Iterator:
    yield GaugeMetricFamily("relayproxy_relay_files", "Relay files in the index", value=s.get("relay_files") or 0)
    yield from _gauge("relayproxy_relay_disk_bytes", "Sum of the relay files' sizes", s.get("relay_disk_bytes"))
    yield from _gauge("relayproxy_relay_fs_free_bytes", "Bytes free for the relay on its file system (statvfs f_bavail)",
                      s.get("relay_fs_free_bytes"))
    yield from _gauge("relayproxy_relay_fs_size_bytes", "Size of the relay's file system", s.get("relay_fs_size_bytes"))
    yield from _gauge("relayproxy_relay_oldest_file_age_seconds", "Age (mtime) of the oldest relay file",
                      s.get("relay_oldest_file_age_seconds"))


def _retention(stats: dict[str, Any] | None) -> Iterator:
    if not stats:
        return  # no retention_* limit set: no retention task
    for key, help_text in (
        ("runs", "Retention checks run"),
        ("purges", "Retention checks that purged at least one relay file"),
        ("files_purged", "Relay files purged by retention"),
        ("bytes_purged", "Bytes of relay files purged by retention"),
        ("blocked_by_readers", "Retention checks held back by a replica still reading a file due for purge"),
        ("readers_evicted", "Dumps ended because retention_force purged the file they read"),
    ):
        if key in stats:
            yield _counter(f"relayproxy_retention_{key}", help_text, stats[key])
    yield from _gauge("relayproxy_retention_last_purge_timestamp_seconds", "Unix time of the last purge by retention",
                      stats.get("last_purge"))


def _txindex(t: dict[str, Any] | None) -> Iterator:
    if not t:
        return  # a served directory: no indexer
    for key, help_text in (
        ("passes", "Passes of the transaction indexer over the newly durable bytes"),
        ("errors", "Passes of the transaction indexer that failed (each is retried)"),
        ("child_starts", "Transaction indexer child processes started (more than one: one died and was replaced)"),
    ):
        if t.get(key) is not None:
            yield _counter(f"relayproxy_txindex_{key}", help_text, t[key])


ARCHIVE_STATES = ("starting", "ok", "retrying", "failing")


def _archive(a: dict[str, Any] | None) -> Iterator:
    if not a:
        return  # no archive_url: no uploader
    for key, help_text in (
        ("bytes_uploaded", "Bytes put to the archive's bucket (parts, manifests, state objects)"),
        ("objects_uploaded", "Objects put to the archive's bucket"),
        ("parts_uploaded", "Parts of relay files put to the archive's bucket"),
        ("files_sealed", "Relay files sealed in the archive (their manifest written)"),
        ("files_offloaded", "Sealed relay files whose local copy was replaced by a stub (archive_keep_local)"),
        ("gaps", "Relay files purged before the bucket held them whole (archive_backlog_max), marked in gaps/"),
        ("errors", "Archive passes that failed (each is retried with backoff)"),
    ):
        yield _counter(f"relayproxy_archive_{key}", help_text, a.get(key))
    cache = a.get("cache") or {}
    for key, help_text in (
        ("hits", "Opens of an offloaded relay file found in the archive cache"),
        ("fetches", "Offloaded relay files fetched whole from the bucket into the archive cache"),
        ("bytes_fetched", "Bytes of offloaded relay files fetched from the bucket"),
        ("evictions", "Files evicted from the archive cache (least recently used, beyond archive_cache_size)"),
        ("errors", "Fetches refused: an object missing or corrupt (named in the log), or the bucket unreachable"),
    ):
        if cache:
            yield _counter(f"relayproxy_archive_cache_{key}", help_text, cache.get(key))
    if cache:
        yield from _gauge("relayproxy_archive_cache_bytes", "Bytes held by the archive cache", cache.get("bytes"))
    yield from _gauge("relayproxy_archive_backlog_bytes",
                      "Stored bytes of the relay files from the first one not sealed in the bucket", a.get("backlog_bytes"))
    yield from _gauge("relayproxy_archive_lag_bytes", "Bytes of the relay's durable history not yet in the archive",
                      a.get("lag_bytes"))
    yield from _gauge("relayproxy_archive_lag_seconds",
                      "Seconds since the archive last held everything the relay had made durable", a.get("lag_seconds"))
    horizon = a.get("horizon") or {}
    yield from _gauge("relayproxy_archive_horizon_position_bytes", "Position of the archive horizon in its file",
                      horizon.get("position"))
    state = GaugeMetricFamily("relayproxy_archive_state", "1 for the archive uploader's state (ok, retrying, failing)",
                              labels=["state"])
    for name in ARCHIVE_STATES:
        state.add_metric([name], 1 if a.get("state") == name else 0)
    yield state


def _replay_stops(stops: list[dict[str, Any]] | None) -> Iterator:
    if stops is None:
        return  # no SQL/dump port: no replay stops
    yield GaugeMetricFamily("relayproxy_replay_stops", "Replay stops in force (relayproxy pitr targets fenced)",
                            value=len(stops))
    position = GaugeMetricFamily("relayproxy_replay_stop_position_bytes",
                                 "Relay position a replica's dumps are never sent past (relayproxy pitr's stop)",
                                 labels=["server_id", "master_log_file"])
    reached = GaugeMetricFamily("relayproxy_replay_stop_reached",
                                "1 when a dump of the replica has been sent everything up to its stop, else 0",
                                labels=["server_id"])
    for stop in stops:
        position.add_metric([str(stop["server_id"]), stop["file"]], stop["position"])
        reached.add_metric([str(stop["server_id"])], int(any(d["at_stop"] for d in stop["dumps"])))
    yield position
    yield reached


def _replicas(replicas: list[dict[str, Any]]) -> Iterator:
    dumping = [r for r in replicas if r.get("file") is not None]
    yield GaugeMetricFamily("relayproxy_replicas_connected", "Dump connections (replicas and binlog tools) being served",
                            value=len(dumping))
    position = GaugeMetricFamily("relayproxy_replica_position_bytes", "End of the last event sent to the replica",
                                 labels=[*REPLICA_LABELS, "master_log_file"])
    lag_bytes = GaugeMetricFamily("relayproxy_replica_lag_bytes",
                                  "Durable binlog bytes not yet sent to the replica (across files)", labels=REPLICA_LABELS)
    lag_seconds = GaugeMetricFamily("relayproxy_replica_lag_seconds",
                                    "0 when the replica has everything durable, else seconds since it last had",
                                    labels=REPLICA_LABELS)
    events = CounterMetricFamily("relayproxy_replica_events_sent", "Events sent to the replica on this connection",
                                 labels=REPLICA_LABELS)
    sent = CounterMetricFamily("relayproxy_replica_bytes_sent", "Bytes sent to the replica on this connection",
                               labels=REPLICA_LABELS)
    acked = GaugeMetricFamily("relayproxy_replica_semi_sync_acked_position_bytes",
                              "Last position the semi-sync replica acknowledged", labels=[*REPLICA_LABELS, "master_log_file"])
    for r in dumping:
        ident = [_text(r.get("server_id")), _text(r.get("connection_id")), _text(r.get("user")), _text(r.get("host"))]
        position.add_metric([*ident, r["file"]], r.get("position") or 0)
        if r.get("lag_bytes") is not None:
            lag_bytes.add_metric(ident, r["lag_bytes"])
        if r.get("lag_seconds") is not None:
            lag_seconds.add_metric(ident, r["lag_seconds"])
        events.add_metric(ident, r.get("events_sent") or 0)
        sent.add_metric(ident, r.get("bytes_sent") or 0)
        if r.get("last_ack"):
            acked.add_metric([*ident, r["last_ack"][0]], r["last_ack"][1])
    yield from (position, lag_bytes, lag_seconds, events, sent, acked)


def _logins(logins: dict[str, Any] | None) -> Iterator:
    """--listen's admission: host blocking (max_connect_errors) and the password throttle (absent without --listen)."""
    if not logins:
        return
    hosts = logins.get("host_blocking") or {}
    yield GaugeMetricFamily("relayproxy_blocked_hosts",
                            "Client hosts refused with 1129 after max_connect_errors handshake errors (until FLUSH HOSTS)",
                            value=hosts.get("hosts_blocked") or 0)
    throttle = logins.get("throttle") or {}
    yield _counter("relayproxy_login_failures", "Logins refused for a wrong password or an unknown account (1045)",
                   throttle.get("failed_logins"))
    yield _counter("relayproxy_login_delays",
                   "Login answers delayed by the password throttle (an account and host over login_failures_threshold)",
                   throttle.get("delayed_logins"))
    yield GaugeMetricFamily("relayproxy_logins_delayed_now", "Logins waiting for their throttle delay now",
                            value=throttle.get("delaying_now") or 0)
    yield GaugeMetricFamily("relayproxy_throttled_accounts",
                            "Account and host pairs over login_failures_threshold (their next login is delayed)",
                            value=throttle.get("throttled_accounts") or 0)


def _http(http: dict[str, Any] | None) -> Iterator:
    if not http:
        return
    yield GaugeMetricFamily("relayproxy_http_connections", "Connections open on --http", value=http.get("connections") or 0)
    yield _counter("relayproxy_http_idle_dropped",
                   "--http connections closed without an answer to make room (the oldest without a complete request)",
                   http.get("dropped_idle"))
    yield _counter("relayproxy_http_busy_refused", "--http connections answered 503: every slot was serving a request",
                   http.get("refused_busy"))


def _text(value) -> str:
    return "" if value is None else str(value)


def build_registry(status: Callable[[], dict[str, Any]], fsync: FsyncStats | None = None, *,
                   hop: HopTimes | None = None, process: bool = True) -> CollectorRegistry:
    """The registry /metrics serves: the relay's families, plus process_* and python_info when ``process``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(status, fsync, hop))
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return registry


__all__ = ["FSYNC_BUCKETS", "FsyncStats", "RelayCollector", "build_registry"]
