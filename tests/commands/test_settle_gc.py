"""A relay process freezes what start-up made (commands/run.py ``settle_gc``), so that the cyclic collector's full
collections walk only what the relay makes while it runs (they stop the event loop: a lag spike for every replica)."""

from __future__ import annotations

import subprocess
import sys


def test_settle_gc_moves_start_up_objects_out_of_the_collector():
    code = (
        "import gc\n"
        "from relayproxy.commands.run import settle_gc\n"
        "young = gc.get_count()\n"
        "tracked = len(gc.get_objects())\n"
        "settle_gc()\n"
        "assert gc.get_freeze_count() >= tracked // 2, (gc.get_freeze_count(), tracked)\n"
        "assert len(gc.get_objects()) < 100, len(gc.get_objects())\n"
        "print(gc.get_freeze_count(), tracked)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
