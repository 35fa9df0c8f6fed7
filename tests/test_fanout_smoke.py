"""Smoke test of benchmarks/fanout.py: a --quick run (5 clients through the relay and on the master) completes,
reports sane numbers and every client converges. Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parent.parent


def test_fanout_quick_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fanout.py"), "--quick", "--json", "--seconds", "3",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["all_converged"] is True
    assert set(report["phases"]) == {"relay", "direct"}
    for name, phase in report["phases"].items():
        assert phase["clients"] == 5
        assert phase["converged"] == 5, (name, phase["not_converged"])
        assert phase["not_converged"] == []
        assert phase["transactions"] > 0
        # every client saw every transaction's XID
        assert phase["lag_samples"] == phase["clients"] * phase["transactions"], name
        assert phase["lag_missing"] == 0
        for key in ("p50", "p90", "p99", "max"):
            assert isinstance(phase["lag_ms"][key], (int, float)), (name, key)
        assert phase["lag_ms"]["p50"] <= phase["lag_ms"]["p99"] <= phase["lag_ms"]["max"]
        assert phase["events"] > 0 and phase["bytes"] > phase["events"] * 19
        assert phase["events_per_s"] > 0 and phase["mb_per_s"] > 0
        assert phase["end"] != phase["start"]
    relay = report["phases"]["relay"]
    assert relay["relay_cpu_seconds"] > 0
    assert relay["relay_vmhwm_kb"] > 1000
    for key in ("lag_p50", "lag_p99", "events_per_s", "mb_per_s"):
        assert key in report["ratios"]
    assert report["ratios"]["events_per_s"] > 0
    assert "fanout.py" in report["command"] and report["machine"]["cores"]
