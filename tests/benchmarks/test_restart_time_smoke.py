"""benchmarks/restart_time.py runs end to end on tiny sizes (the relay as a process against the scripted MySQL
master of tests/support) and writes nothing with --no-write (no assertion on timings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the benchmark as a process, a relay process inside it: a few seconds

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "restart_time.py"
RESULTS = REPO_ROOT / "benchmarks" / "results" / "restart_time.md"


def test_restart_time_tiny_run(tmp_path: Path) -> None:
    before = RESULTS.read_bytes()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--newest", "1", "--closed", "20", "--runs", "1", "--no-write",
         "--dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "## Machine" in out and "relayproxy commit:" in out, out[-2000:]
    # Both kinds of measurement ran: the scan of the newest file and a `relayproxy run` process start.
    assert "newest file" in out and "`relayproxy run`" in out, out[-2000:]
    assert RESULTS.read_bytes() == before, "--no-write rewrote benchmarks/results/restart_time.md"
