"""Where a transaction's time goes on its way through the relay: one latency histogram per stage of the hop.

A transaction's last bytes arrive from the master; the event loop parses them and writes them to the relay file
(page cache); an fdatasync covering them begins in the fsync thread; it ends; the loop learns of it and advances
the durable horizon; then the semi-sync ACK goes to the master and the dump senders write the new events to their
replicas. Each step is a stage here (``STAGES``), measured with ``time.monotonic`` at the points where the relay
does that work anyway, and observed once per transaction (a batch of n complete transactions counts n times; the
send stage counts once per replica and advance). Nothing here sits per event: the session reports a batch, the
sync driver a sync, a sender a wake-up. ``ops/metrics.py`` exposes the histograms as
``relayproxy_hop_seconds{stage=...}`` (docs/metrics.md names the stages); benchmarks read the same families.

The stages add up: ``receive + write + sync_wait + fsync + fsync_handoff = durable``, the time from the bytes'
arrival to the horizon that lets a replica have them. ``fsync_handoff`` is the time a sync took beyond its
fdatasync: the hand-off to the fsync thread and its eventfd back to the loop, the thread wake-ups the direct path
does not have.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable

__all__ = ["HOP_BUCKETS", "STAGES", "Histogram", "HopTimes"]

# From a wake-up on an idle core (tens of microseconds) to a stalled disk (a second).
HOP_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

STAGES = {
    "receive": "the bytes ending the transaction arrived -> the event loop begins to parse them",
    "write": "parsed and written to the relay file (page cache)",
    "sync_wait": "written -> an fdatasync covering it begins (the sync in flight, or the batch delay)",
    "fsync": "the fdatasync itself, in the fsync thread",
    "fsync_handoff": "the rest of the sync: to the fsync thread and back to the loop (its eventfd)",
    "durable": "arrived -> the horizon covers it (the five stages above)",
    "ack": "horizon advanced -> the semi-sync ACK written to the master (the relay's replica gate included)",
    "send": "horizon advanced -> the new events written to a replica's connection (per replica)",
}


class Histogram:
    """A cumulative latency histogram in seconds (Prometheus' "le" buckets) with its count, sum and maximum.

    Safe to observe from several threads (dump senders run on worker loops): one lock, taken once per observation,
    which is once per sync, batch or wake-up, never per event."""

    def __init__(self, buckets: Iterable[float] = HOP_BUCKETS):
        bounds = tuple(float(b) for b in buckets)
        if not bounds or any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram buckets must be positive and strictly increasing, not {bounds!r}")
        self.buckets = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.count = 0
        self.sum_seconds = 0.0
        self.max_seconds = 0.0
        self.last_seconds: float | None = None
        self._lock = threading.Lock()

    def observe(self, seconds: float, weight: int = 1) -> None:
        """``weight`` things each took ``seconds`` (a negative time, from clocks read out of order, counts as 0)."""
        if seconds < 0.0:
            seconds = 0.0
        with self._lock:
            self._counts[bisect_left(self.buckets, seconds)] += weight  # the first bound >= seconds
            self.count += weight
            self.sum_seconds += seconds * weight
            self.last_seconds = seconds
            if seconds > self.max_seconds:
                self.max_seconds = seconds

    def take(self) -> tuple[list[int], float, float] | None:
        """What was observed since the last take, as (per-bucket counts, sum, maximum), and start again from
        zero; None when nothing was. A sender process sends its send stage to the relay process this way."""
        with self._lock:
            if not self.count:
                return None
            taken = (self._counts, self.sum_seconds, self.max_seconds)
            self._counts = [0] * (len(self.buckets) + 1)
            self.count, self.sum_seconds, self.max_seconds = 0, 0.0, 0.0
        return taken

    def merge(self, counts: list[int], sum_seconds: float, max_seconds: float) -> None:
        """Add what another histogram with the same buckets took (``take``). Counts of another shape, or negative
        ones, raise ValueError and change nothing."""
        if len(counts) != len(self._counts) or any(not isinstance(n, int) or n < 0 for n in counts):
            raise ValueError(f"histogram counts do not fit {len(self.buckets)} buckets and +Inf: {counts!r}")
        with self._lock:
            for i, n in enumerate(counts):
                self._counts[i] += n
            self.count += sum(counts)
            self.sum_seconds += float(sum_seconds)
            self.max_seconds = max(self.max_seconds, float(max_seconds))

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """``[(le, count <= le), ..., ("+Inf", count)]`` as Prometheus exposes them."""
        with self._lock:
            counts = list(self._counts)
        out = []
        running = 0
        for bound, n in zip(self.buckets, counts):
            running += n
            out.append((repr(bound), running))  # "0.0005", "1.0": what prometheus_client's own Histogram prints
        out.append(("+Inf", running + counts[-1]))
        return out

    def quantile_bound(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile (0 < q <= 1): at most this, read from the
        buckets (the maximum when it falls in +Inf); None before the first observation."""
        with self._lock:
            counts = list(self._counts)
            total, largest = self.count, self.max_seconds
        if not total:
            return None
        rank = q * total
        running = 0
        for bound, n in zip(self.buckets, counts):
            running += n
            if running >= rank:
                return min(bound, largest)
        return largest

    def summary(self) -> dict[str, float | int | None]:
        """The /status view: how many, the mean, the bucket bounds of p50 and p99, the maximum (seconds)."""
        count = self.count
        return {"count": count, "mean_seconds": round(self.sum_seconds / count, 6) if count else None,
                "p50_le_seconds": self.quantile_bound(0.5), "p99_le_seconds": self.quantile_bound(0.99),
                "max_seconds": round(self.max_seconds, 6)}


class HopTimes:
    """The hop's stage histograms, fed by the upstream session (``batch``, ``acked``), the sync driver
    (``sync_began``, ``sync_published``) and the dump senders (``sent``). The first three run on the relay's event
    loop; ``sent`` may come from any thread. All times are ``time.monotonic()`` values."""

    def __init__(self, buckets: Iterable[float] = HOP_BUCKETS):
        self.stages = {name: Histogram(buckets) for name in STAGES}
        # Batches whose transactions no sync covers yet: (arrived, began, ended, transactions).
        self._unsynced: list[tuple[float, float, float, int]] = []
        self._flight: tuple[float, list[tuple[float, float, float, int]]] | None = None  # (began, its batches)

    def batch(self, arrived: float, began: float, ended: float, transactions: int) -> None:
        """A batch read from the master completed ``transactions``: its bytes arrived at ``arrived``, the loop
        parsed and wrote it from ``began`` to ``ended``. A batch that completed none is not counted."""
        if transactions > 0:
            self._unsynced.append((arrived, began, ended, transactions))

    def sync_began(self, now: float) -> None:
        """A sync began: it covers every batch reported so far (the store syncs what is complete)."""
        batches, self._unsynced = self._unsynced, []
        if self._flight is not None:  # one still out (its end was not published): its batches go with this one
            batches = self._flight[1] + batches
        self._flight = (now, batches)

    def sync_published(self, now: float, fsync_seconds: float) -> None:
        """The sync that began last has ended, its fdatasync took ``fsync_seconds``, and the horizon moved at
        ``now``: the transactions it covered are durable. Each stage is observed for them."""
        flight, self._flight = self._flight, None
        if flight is None:
            return
        began_sync, batches = flight
        stages = self.stages
        handoff = max(now - began_sync - fsync_seconds, 0.0)
        for arrived, began, ended, n in batches:
            stages["receive"].observe(began - arrived, n)
            stages["write"].observe(ended - began, n)
            stages["sync_wait"].observe(began_sync - ended, n)
            stages["fsync"].observe(fsync_seconds, n)
            stages["fsync_handoff"].observe(handoff, n)
            stages["durable"].observe(now - arrived, n)

    def acked(self, advanced: float, now: float) -> None:
        """A semi-sync ACK went to the master at ``now`` for a transaction the horizon covered at ``advanced``."""
        if advanced > 0.0:
            self.stages["ack"].observe(now - advanced)

    def sent(self, seconds: float, replicas: int = 1) -> None:
        """``replicas`` dumps wrote what an advance made durable, ``seconds`` after it."""
        if replicas > 0:
            self.stages["send"].observe(seconds, replicas)

    def summary(self) -> dict[str, dict[str, float | int | None]]:
        """The /status view of every stage."""
        return {name: hist.summary() for name, hist in self.stages.items()}
