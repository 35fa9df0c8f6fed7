"""benchmarks/relay_catchup.py runs end to end on a tiny backlog: every reader reports, the relay's files
equal the master's (never an assertion on timings)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "relay_catchup.py"
READERS = ("io_thread", "io_thread_no_annotate", "mariadb_binlog", "relay_transaction", "relay_batch")


def positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_relay_catchup_quick_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--big-trx-mb", "8", "--workdir", str(tmp_path)],
        cwd=REPO_ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)  # stdout is exactly one JSON object
    assert report["quick"] is True and report["repeat"] >= 1
    assert set(report["shapes"]) == {"oltp", "bulk"}

    for shape, data in report["shapes"].items():
        backlog = data["backlog"]
        for key in ("bytes", "events", "transactions", "avg_event_bytes"):
            assert positive(backlog[key]), (shape, key, backlog[key])
        if shape == "oltp":
            assert 100 <= backlog["avg_event_bytes"] <= 250, backlog  # "about 150 bytes an event"
        else:
            assert backlog["avg_event_bytes"] > 1000, backlog  # large multi-row row events
        readers = data["readers"]
        assert set(READERS) <= set(readers), readers.keys()
        for name in READERS:
            r = readers[name]
            for key in ("seconds", "mb_per_s", "events_per_s", "ratio_vs_io_thread"):
                assert positive(r[key]), (shape, name, key, r[key])
            assert len(r["samples"]) == report["repeat"] and all(positive(s) for s in r["samples"])
        assert readers["io_thread"]["ratio_vs_io_thread"] == 1.0
        assert readers["io_thread"]["peak_rss_kb"] is None  # the replica's mariadbd is not comparable
        assert readers["io_thread"]["relay_log_space"] >= backlog["bytes"]  # same bytes, ANNOTATE_ROWS included
        assert positive(readers["mariadb_binlog"]["peak_rss_kb"])
        for name in ("relay_transaction", "relay_batch"):
            r = readers[name]
            assert positive(r["peak_rss_kb"]) and r["startup_seconds"] >= 0
            assert r["identical"] is True, (shape, name)
            assert r["events_received"] >= backlog["events"] - 3  # minus the FDE/GTID_LIST/checkpoint of a mid-file start
        # The script compared the relay's files with the master's; check its digests here too.
        digests = readers["relay_transaction"]["digests"]
        assert [name for name in digests] == backlog["files"]
        for name, d in digests.items():
            assert d["relay"] == d["master"] and d["bytes"] > 4, (shape, name, d)
        assert sum(d["bytes"] for d in digests.values()) == backlog["bytes"]

    big = report["big_trx"]
    assert big["identical"] is True
    assert big["binlog_bytes"] >= 8 * 1024 * 1024
    for key in ("rss_before_kb", "peak_rss_kb", "rss_end_kb"):
        assert positive(big[key]), (key, big[key])
    assert big["rss_samples"] and all(positive(kb) for _t, kb in big["rss_samples"])
