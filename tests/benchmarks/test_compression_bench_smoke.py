"""benchmarks/compression.py runs end to end on the corpus and reports its figures as JSON (no assertion on timings)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "compression.py"


def test_compression_quick_json(corpus_dir: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--output-dir", str(out_dir)],
        cwd=REPO_ROOT, env=dict(os.environ, RELAYPROXY_CORPUS=str(corpus_dir)), capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    corpus = json.loads(proc.stdout)["corpus"]
    assert corpus["files"] > 0 and corpus["logical_mb"] > 0
    forms = corpus["forms"]
    assert set(forms) == {"plain", "zstd 1", "zstd 3", "zstd 9", "AES-GCM", "zstd 3 + AES-GCM"}
    for name, row in forms.items():
        for key in ("ratio", "stored_mb", "read_mb_s", "read_vs_plain", "mid_start_us"):
            assert isinstance(row[key], (int, float)) and math.isfinite(row[key]) and row[key] > 0, (name, key)
    assert forms["zstd 3"]["ratio"] > 1.5  # binlogs compress; the stored size is exact, not a timing
    assert 0.99 < forms["AES-GCM"]["ratio"] <= 1.0  # encryption alone adds a little
    assert not out_dir.exists()  # a quick run writes nothing
