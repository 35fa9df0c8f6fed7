"""The pure-Python build: relayproxy without its compiled parts, as on a machine with no compiler or no isal wheel.

Three modules have a compiled fast path and a Python fallback: ``downstream/sendbatch.py`` (the C extension
``_sendbatch.c``; without it the shared pass writes through the transports), ``relay/fsyncer.py`` (the C fsync
thread ``_fsync.c``; without it ``PyWorker``) and ``binlog/checksum.py`` (ISA-L's CRC32 from the ``isal`` package;
without it zlib's). ``RELAYPROXY_PURE_PYTHON=1`` in the environment turns them all off, in the process and in every process it starts (sender processes, the relay run as a process). ``make test``
builds the extensions and installs isal, so the rest of the suite runs the fast paths; the test below runs the tests
that exercise the fallbacks once more, in a pytest subprocess with the variable set (a few seconds).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relayproxy.binlog import checksum
from relayproxy.downstream import sendbatch
from relayproxy.relay import fsyncer

REPO = Path(__file__).resolve().parents[2]
PURE_ENV = "RELAYPROXY_PURE_PYTHON"

# Run again with RELAYPROXY_PURE_PYTHON=1: the shared pass without the extension (in this process and in a sender
# process), the upstream session's fsyncs through PyWorker, zlib's CRC32 over the whole corpus and the property
# tests, and the check that the switch took.
PURE_TESTS = [
    "tests/project/test_pure_python.py::test_the_compiled_parts_in_use_are_the_ones_the_environment_asks_for",
    "tests/downstream/test_dump_followers.py::test_mysql_followers_get_the_same_stream_as_the_ordinary_path[copies-transports]",
    "tests/downstream/test_dump_followers.py::test_mariadb_followers_get_the_same_stream_as_the_ordinary_path[pieces-transports]",
    "tests/downstream/test_dump_followers.py::test_heartbeats_still_come_once_the_stream_goes_quiet",
    "tests/downstream/test_sender_processes.py::test_mysql_dumps_through_a_sender_process_are_byte_identical",
    "tests/lab/test_fake_mysql_master.py::test_bootstrap_follow_and_status",
    "tests/lab/test_fake_mysql_master.py::test_semi_sync_master_gets_acks_for_durable_transactions",
    "tests/relay/test_relay_fsyncer.py::test_a_ticket_in_the_fsync_thread_publishes_and_fails_as_in_the_pool[python]",
    "tests/binlog/test_checksum_impl.py::test_the_crc32_in_use_equals_zlibs",
    "tests/binlog/test_checksum_impl.py::test_a_crc32_over_an_event_and_its_stored_crc_is_zlibs_residue",
    "tests/binlog/test_corpus.py",
]


def test_the_compiled_parts_in_use_are_the_ones_the_environment_asks_for():
    """Here (make test): the extensions and isal. In the pure-Python run below: none of them."""
    if os.environ.get(PURE_ENV) == "1":
        assert sendbatch._send_batch is None and not sendbatch.available(), "the C extension is loaded"
        assert fsyncer.CWorker is None and not fsyncer.native(), "the C fsync thread is loaded"
        assert checksum.CRC32_IMPL == "zlib", checksum.CRC32_IMPL
    else:
        assert sendbatch.available(), "relayproxy.downstream._sendbatch is missing: pip install -e . did not build it"
        assert fsyncer.native(), "relayproxy.relay._fsync is missing: pip install -e . did not build it"
        assert checksum.CRC32_IMPL == "isal", checksum.CRC32_IMPL


@pytest.mark.slow  # a pytest subprocess: about 6 s, in make test, not in make test-quick
def test_the_pure_python_build_passes_the_tests_of_the_fallbacks(tmp_path):
    env = {**os.environ, PURE_ENV: "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "pure"),
               *PURE_TESTS]
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0, f"with {PURE_ENV}=1: {summary}\n{out.stdout[-6000:]}\n{out.stderr[-2000:]}"
    assert " failed" not in summary and " error" not in summary and " deselected" not in summary, summary
