"""benchmarks/common.py: the percentile's three rules on known inputs, the results skeleton, the log line."""

from __future__ import annotations

import math

import pytest

from benchmarks import common

TEN = [float(v) for v in range(1, 11)]  # 1..10


@pytest.mark.parametrize(("method", "q", "expected"), [
    ("rounded-index", 50, 5.0),  # index round(4.5) = 4 (half to even)
    ("rounded-index", 0, 1.0),
    ("rounded-index", 100, 10.0),
    ("rounded-index", 90, 9.0),  # index round(8.1) = 8
    ("nearest-rank", 50, 5.0),  # ceil(5) = rank 5
    ("nearest-rank", 95, 10.0),  # ceil(9.5) = rank 10
    ("nearest-rank", 0, 1.0),
    ("exclusive-rank", 50, 6.0),  # index floor(5) = 5
    ("exclusive-rank", 99, 10.0),
    ("exclusive-rank", 100, 10.0),
])
def test_percentile_on_known_inputs(method, q, expected):
    assert common.percentile(reversed(TEN), q, method=method) == expected


def test_rounded_index_rounds_halves_to_even():
    assert common.percentile([1.0, 2.0], 50) == 1.0  # index round(0.5) = 0
    assert common.percentile([1.0, 2.0, 3.0, 4.0], 50) == 3.0  # index round(1.5) = 2


def test_percentile_of_nothing_is_nan_and_unknown_methods_fail():
    assert math.isnan(common.percentile([], 50))
    with pytest.raises(ValueError):
        common.percentile([1.0], 50, method="linear")


def test_the_skeleton_names_the_command_commit_tree_and_machine():
    machine = common.machine_info()
    text = common.results_document("A bench", "benchmarks/fanout.py", ["--quick"], machine, ["## Results", "", "x"])
    lines = text.splitlines()
    assert lines[0] == "# A bench"
    assert any(line.endswith("benchmarks/fanout.py --quick") for line in lines)
    assert any(line.startswith("- commit: ") and "; tree: " in line for line in lines)
    assert any(line.startswith("- machine: ") for line in lines)
    assert "## Machine" in lines and any(line.startswith("- tree: ") for line in lines)


def test_logger_prefixes(capsys):
    common.logger("bench")("hello")
    common.logger("bench", clock=False)("there")
    common.logger(None)("bare")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[bench ") and err[0].endswith("] hello")
    assert err[1:] == ["[bench] there", "bare"]
