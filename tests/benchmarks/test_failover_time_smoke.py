"""benchmarks/failover_time.py runs end to end on the smallest topology: no backlog, one failover (plus the
profiled one), a temporary output directory; the results file has the table with a row per backlog and the command
line. Timings are never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "failover_time.py"
NUMBER = r"\d+\.\d{3}"
RANGE = rf"{NUMBER} \(range {NUMBER} - {NUMBER}, \d+ runs\)"  # benchinfo.fmt_median_range


def test_failover_time_tiny_backlog(tmp_path: Path) -> None:
    out = tmp_path / "results" / "failover_time.md"
    argv = ["--backlogs", "0", "--repeats", "1", "--out", str(out), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=REPO_ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()

    # The shared header (the command line that produced it, commit and clean/dirty code, repeats), and the machine.
    assert text.splitlines()[2] == "Produced by (from the repository root):"
    assert "benchmarks/failover_time.py --backlogs 0 --repeats 1 --out" in text
    assert re.search(r"^- commit: \w+; tree: (clean|DIRTY)", text, re.MULTILINE), text[:2000]
    assert "- repeats: a single run; each run is one failover per backlog" in text
    assert "## Machine" in text and "- relayproxy commit:" in text and "- mariadbd:" in text

    # The summary table: its header and exactly one row per backlog, every timing column a median (range min - max).
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| backlog | relay files |"))
    assert "relay -> R2 (GTID)" in lines[header] and "direct: D (MariaDB)" in lines[header]
    rows = []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert [row[0] for row in rows] == ["0"], rows
    row = rows[0]
    for cell in (row[2], row[3], row[4], row[7]):  # relay -> R2, relay -> R3, direct, relay horizon
        assert re.fullmatch(RANGE, cell), cell
    assert re.fullmatch(r"\d+\.\d\d", row[5]) and re.fullmatch(r"\d+\.\d\d", row[6]), row  # the ratios
    assert re.fullmatch(r"[\d,]+ / [\d,]+ MB", row[8]), row[8]  # relay RSS / peak

    # Every failover listed; the plot written beside the markdown.
    assert re.search(r"^\| 0 \| 1 \| relay then direct \|", text, re.MULTILINE), text
    assert "Ratio relay -> R2 / direct per failover, median and range: 0: " in text
    assert out.with_suffix(".png").stat().st_size > 1000
    # The markers reached every replica exactly once (the script checks and fails otherwise).
    assert "each exactly once" in text
