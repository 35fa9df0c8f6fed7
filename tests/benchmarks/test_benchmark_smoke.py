"""benchmarks/parse_cost.py runs end to end and reports its numbers as JSON (no assertion on timings)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the benchmark as a process: a few seconds

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "parse_cost.py"


def test_parse_cost_quick_json(corpus_dir: Path, tmp_path: Path) -> None:
    env = dict(os.environ, RELAYPROXY_CORPUS=str(corpus_dir))
    out_dir = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--output-dir", str(out_dir)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)  # stdout is exactly one JSON object
    assert isinstance(results, dict)
    for key in ("boundary_ns_per_event", "pymysqlreplication_ns_per_event", "ratio"):
        value = results[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value)
    assert results["events"] > 0 and results["bytes"] > 0
    # A quick run's numbers are not publishable: it must not write the results files.
    assert not out_dir.exists()
