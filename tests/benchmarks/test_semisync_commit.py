"""benchmarks/semisync_commit.py's arithmetic and report, from figures made here (the measuring runs servers for
minutes and is run by hand; its results file names the command)."""

from __future__ import annotations

import json

from benchmarks import semisync_commit as bench
from relayproxy.relay.hoptimes import STAGES


def scrape(counts: dict[str, list[float]], sums: dict[str, float]) -> dict:
    """A hop_buckets() answer: per stage the cumulative counts at le 0.001, 0.01 and +Inf."""
    return {stage: {"le": dict(zip(("0.001", "0.01", "+Inf"), counts.get(stage, [0, 0, 0]))),
                    "sum": sums.get(stage, 0.0), "count": counts.get(stage, [0, 0, 0])[-1]} for stage in STAGES}


def test_hop_share_is_the_difference_of_two_scrapes():
    before = scrape({"fsync": [5, 10, 10]}, {"fsync": 0.02})
    after = scrape({"fsync": [5, 108, 110]}, {"fsync": 0.52})  # 100 more: 98 under 10 ms, 2 beyond
    share = bench.hop_share(before, after)["fsync"]
    assert share["count"] == 100 and share["mean"] == 5.0  # ms
    assert share["p50"] == 10.0  # 0 of the 100 under 1 ms, 98 under 10 ms
    assert share["p99"] is None or share["p99"] > 10.0  # the 99th is past the last finite bucket
    assert bench.hop_share(before, before)["fsync"] == {"count": 0, "mean": None, "p50": None, "p99": None}


def row(acker: str, writers: int, repeat: int, p99: float, *, valid: bool = True) -> dict:
    out = {"acker": acker, "writers": writers, "repeat": repeat, "commits": 1000, "tps": 100.0, "acked": 1000,
           "fallback": 0 if valid else 3, "valid": valid, "p50": p99 / 4, "p99": p99, "p99.9": p99 * 2}
    if acker.startswith("relay"):
        out["hop"] = {stage: {"count": 1000, "mean": 0.1, "p50": 0.1, "p99": 0.5} for stage in STAGES}
    return out


def test_the_report_takes_ratios_within_each_repeat_and_leaves_invalid_runs_out(tmp_path):
    rows = [row("relay", 1, 1, 2.0), row("replica_sync", 1, 1, 4.0), row("replica", 1, 1, 1.0),
            row("relay", 1, 2, 1.1), row("replica_sync", 1, 2, 1.2), row("replica", 1, 2, 1.0),
            row("relay", 4, 1, 3.0), row("replica_sync", 4, 1, 9.0, valid=False), row("replica", 4, 1, 2.9)]
    report = {"writers": [1, 4], "seconds": 5, "repeats": 2, "rows": rows, "servers_dir": "/dev/shm",
              "acker_dir": "/tmp", "machine": {"relayproxy commit": "abc1234", "cpu": "test"},
              "argv": ["--writers", "1,4"]}
    assert bench.ratios(report, 1, "replica") == [2.0, 1.1]
    assert bench.ratios(report, 4, "replica_sync") == []  # its only run fell back to async
    text = bench.render(report, report["argv"])
    relay = "| relayproxy run, defaults (sync_on_loop = auto) "
    assert relay + "| 1 | 0.71x (range 0.50x - 0.92x, 2 runs) | 1.55x (range 1.10x - 2.00x, 2 runs) | MISSED |" in text
    assert relay + "| 4 | - | - | not measured (no valid pair) |" in text
    assert "| relayproxy run, sync_on_loop = false | 1 | - | - | not measured (no valid pair) |" in text
    assert "| MariaDB replica, sync_relay_log=1 | 4 | - | - | - | - | 0 of 1 |" in text
    assert relay + "| 1 | fsync | 1000 | 0.100 | 0.100 | 0.500 |" in text
    assert "- commit: abc1234" in text
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report))
    out = tmp_path / "semisync_commit.md"
    assert bench.main(["--render", str(saved), "--output", str(out)]) == 0
    assert out.read_text() == text
