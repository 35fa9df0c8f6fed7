"""benchmarks/txindex.py runs end to end on tiny sizes and reports its figures as JSON (no assertion on timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "txindex.py"


def test_txindex_bench_tiny_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--transactions", "6000", "--files", "2", "--oltp-transactions", "600",
         "--lookups", "20", "--no-write", "--json", "--output-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    for flavour in ("mariadb", "mysql"):
        row = figures["size"][flavour]
        assert row["transactions"] == 600 and 0 < row["ratio_pct"] < 100
    scale = figures["scale"]
    assert scale["transactions"] == 6000 and scale["lookups"] == 20
    assert all(scale[k] >= 0 for k in ("gtid_p50_ms", "gtid_p99_ms", "time_p50_ms", "time_p99_ms"))
    assert set(scale["table"]) and not list(tmp_path.iterdir())  # --no-write: nothing written
