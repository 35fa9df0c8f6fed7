"""`relayproxy promote` killed after each of its steps, the ``levelling`` flavour: see test_promote_interrupted.py (one
file a flavour, so that the two test workers share the kills)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_promote_interrupted import cases, check_converges

pytestmark = pytest.mark.server


@cases("levelling")
def test_a_second_run_converges_after_a_kill_after_each_step(tmp_path: Path, flavour: str, after: int):
    check_converges(tmp_path, flavour, after)
