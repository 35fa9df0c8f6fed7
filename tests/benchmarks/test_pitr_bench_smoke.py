"""benchmarks/pitr.py runs end to end on a tiny backlog (real MariaDB master, relay, mariadb-backup, both replay
methods and the kill runs) and writes nothing with --no-write (no assertion on timings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.server, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "pitr.py"


def test_pitr_benchmark_tiny_run(tmp_path: Path) -> None:
    results = REPO_ROOT / "benchmarks" / "results"
    before = {p.name: p.read_bytes() for p in results.glob("pitr*")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--gb", "0.004", "--repeats", "1", "--no-write",
                           "--workdir", str(tmp_path / "work")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "## Machine" in out and "relayproxy commit:" in out, out[-2000:]
    assert "| 1 |" in out and "pitr / pipe" in out and "kill -9 halfway" in out, out[-3000:]
    assert "pitr = reference" in out
    row = next(line for line in out.splitlines() if line.startswith("| 1 |"))
    assert row.split("|")[8].strip() == "yes", row  # pitr's replay equals the reference, even on a tiny backlog
    assert {p.name: p.read_bytes() for p in results.glob("pitr*")} == before, "--no-write rewrote results"
