"""Smoke test of benchmarks/fanout.py: a --quick run (2 mariadb-binlog clients and 1 MariaDB replica through the
relay and on the master) completes, reports sane numbers and every client converges. Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[2]


def test_fanout_real_clients_quick(tmp_path: Path) -> None:
    """2 mariadb-binlog processes and 1 MariaDB replica, through the relay and on the master: every byte arrives,
    lag is measured for every transaction on the sampled clients and the replica, the report has its CPU, bytes
    and ratio fields; --quick writes no results file. ``--real`` (which the results files quote) is accepted."""
    saved = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fanout.py"), "--real", "--quick", "--loads", "oltp",
         "--binlog-clients", "2", "--real-replicas", "1", "--oltp-rate", "100", "--save-json", str(saved)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fanout_real.md" not in proc.stderr  # --quick writes no results file
    report = json.loads(saved.read_text())
    assert report["mode"] == "real"
    body = report["loads"]["oltp"]
    assert len(body["repeats"]) == 1
    phases = body["repeats"][0]["phases"]
    assert set(phases) == {"relay", "direct"}
    for name, ph in phases.items():
        assert ph["converged"] is True, name
        assert ph["binlog_clients"] == 2 and ph["replicas"] == 1
        trx = ph["transactions"]
        assert trx > 0
        want = ph["event_bytes_per_client"]
        assert want > trx * 100  # ~150-byte row events and more per transaction
        # each mariadb-binlog client wrote every event byte of the phase, exactly
        assert ph["clients_short"] == 0
        assert ph["client_bytes"] == 2 * want, name
        # the replica asks for no ANNOTATE_ROWS (no log_slave_updates), so it gets fewer bytes than mariadb-binlog
        assert trx * 100 < ph["replica_relay_log_bytes"] < want, name
        assert ph["delivered_bytes"] == ph["client_bytes"] + ph["replica_relay_log_bytes"]
        # every sampled client saw every transaction's XID; the replica applied every row
        assert ph["sampled_clients"] == [0, 1]
        assert ph["lag_ms_clients"]["n"] == 2 * trx, name
        assert ph["lag_ms_replicas"]["n"] == trx, name
        for lag in (ph["lag_ms_clients"], ph["lag_ms_replicas"]):
            assert lag["p50"] <= lag["p99"] <= lag["max"]
        for key in ("mariadbd", "dump_threads", "binlog_clients", "replicas"):
            assert set(ph["cpu_seconds"][key]) == {"load", "idle_rate_pct", "net"}, key
        assert ph["cpu_seconds"]["mariadbd"]["load"] > 0
        assert ph["dump_threads_cpu_s_per_mb"] is not None
    relay, direct = phases["relay"], phases["direct"]
    assert relay["dump_threads"] == 1  # the master serves only the relay
    assert direct["dump_threads"] == 3  # 2 mariadb-binlog + 1 replica
    assert relay["cpu_seconds"]["relay"]["load"] > 0 and relay["relay_cpu_s_per_mb"] > 0
    assert direct["cpu_seconds"]["relay"] is None
    mem = relay["relay_memory_end_kb"]
    assert mem["processes"] >= 1 and mem["hwm_kb_sum"] > 1000 and mem["rss_kb"] > 1000 and mem["pss_kb"] > 1000
    summary = body["summary"]
    for key in ("relay_vs_dump_threads", "relay_vs_mariadbd_difference", "lag_clients_p99", "delivered_mb"):
        assert set(summary["ratios"][key]) == {"median", "min", "max", "n"}, key
    assert summary["ratios"]["delivered_mb"]["n"] == 1
    assert summary["relay"]["relay_cpu_s_per_mb"]["median"] > 0
    assert "--real" in report["command"] and report["machine"]["cores"]
