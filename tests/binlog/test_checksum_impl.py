"""The CRC32 every event check goes through (binlog/checksum.py): ISA-L's when the ``isal`` package is installed,
else zlib's. Both must give zlib's values for every input the relay feeds them (bytes, bytearray, memoryview slices,
a running value), and the relay must work with zlib's alone."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog import checksum

REPO = Path(__file__).resolve().parents[2]


def test_isal_is_used_here():
    """setup.cfg asks for isal on this platform: the fast path is the one the suite runs."""
    assert checksum.CRC32_IMPL == "isal", "isal is not installed: the relay falls back to zlib's slower CRC32"


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=20_000), start=st.integers(0, 64), cut=st.integers(0, 64),
       running=st.integers(0, 0xFFFFFFFF))
def test_the_crc32_in_use_equals_zlibs(data, start, cut, running):
    view = memoryview(data)[start : max(start, len(data) - cut)]
    assert checksum.crc32(data) == zlib.crc32(data)
    assert checksum.crc32(view) == zlib.crc32(view)
    assert checksum.crc32(bytearray(view), running) == zlib.crc32(bytes(view), running)


def test_a_crc32_over_an_event_and_its_stored_crc_is_zlibs_residue():
    """The receiver checks an event by the CRC over the event and its trailer (a constant residue)."""
    body = os.urandom(8000)
    event = body + zlib.crc32(body).to_bytes(4, "little")
    assert checksum.crc32(event) == zlib.crc32(event) == 0x2144DF1C


def test_without_isal_the_relay_uses_zlibs_crc32_and_still_verifies_events(corpus_dir):
    """In a process where ``isal`` cannot be imported: zlib's CRC32, and a real corpus file scans clean."""
    image = corpus_dir / "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004"
    code = (
        "import sys, zlib\n"
        "sys.modules['isal'] = None; sys.modules['isal.isal_zlib'] = None\n"
        "from relayproxy.binlog import checksum\n"
        "assert checksum.CRC32_IMPL == 'zlib' and checksum.crc32 is zlib.crc32, checksum.CRC32_IMPL\n"
        "from relayproxy.binlog.reader import scan_file\n"
        f"result = scan_file({str(image)!r}, verify_checksums=True)\n"
        "assert result.events > 50 and result.crc_errors == 0, (result.events, result.crc_errors)\n"
        "print('events', result.events)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "events" in out.stdout
