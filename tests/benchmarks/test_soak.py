"""The chaos soak (benchmarks/soak.py) run briefly, its fuzzers on their own, and the parser bugs they found.

The brief soak is the real one, shorter: a MariaDB master under mixed load, the relay behind a fault proxy, a
direct replica and two replicas through the relay (one GTID, one file/position), 45 s of seeded faults of every
kind, then a few thousand inputs for each fuzzer. Every fault must be survived, every table must match, the
fuzzers must find nothing. Timings are never asserted.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import BinlogScanner, scan_bytes
from relayproxy.lab import fuzz

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "benchmarks" / "soak.py"

MYSQL_FILE = "blackbeam-rust_mysql_common/test-data/binlogs/mysql_type_bit.000001"  # 8.0.26: GTID groups
MARIA_FILE = "blackbeam-rust_mysql_common/test-data/binlogs/mariadb-bin.000001"  # 10.5.15: MARIA_GTID groups


@pytest.mark.server
def test_brief_chaos_soak_survives_every_fault_and_every_table_matches(tmp_path, corpus_dir):
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--minutes", "0.75", "--min-faults", "12", "--seed", "20261121",
         "--fuzz-inputs", "3000", "--json", "--workdir", str(tmp_path), "--output", str(tmp_path / "soak.md")],
        cwd=REPO, env=dict(os.environ, RELAYPROXY_CORPUS=str(corpus_dir)), capture_output=True, text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(proc.stdout)
    assert report["seed"] == 20261121
    assert report["verdict"]["passed"], report["verdict"]
    # The results file: the shared header, honest about being one run.
    text = (tmp_path / "soak.md").read_text()
    assert text.splitlines()[2] == "Produced by (from the repository root):"
    assert "benchmarks/soak.py --minutes 0.75 --min-faults 12 --seed 20261121" in text
    assert re.search(r"^- commit: \w+; tree: (clean|DIRTY)", text, re.MULTILINE), text[:2000]
    assert re.search(r"^- repeats: a single run; one seeded chaos run \(seed 20261121, [\d.]+ minutes of chaos\)",
                     text, re.MULTILINE), text[:2000]
    assert "alternated" not in text and "**Verdict: PASSED**" in text

    faults = report["faults"]
    kinds = {f["kind"] for f in faults if f["injected"]}
    assert len(faults) >= 12 and len(kinds) >= 7, kinds  # the first shuffled round covers many kinds
    assert {"relay kill -9", "upstream cut"} & kinds
    assert all(f["survived"] for f in faults), [f for f in faults if not f["survived"]]
    for f in faults:
        if f["kind"] == "upstream corrupt byte" and f["injected"]:
            assert f["relay_said"], f  # the relay noticed the flipped byte and reconnected
        # MariaDB's mid-statement reconnect check may stop a file/position replica after a relay kill -9 (START
        # SLAVE resumes it, reported); never after a graceful stop, which ends every dump at a transaction boundary.
        assert not f["resumed"] or f["kind"] == "relay kill -9", f
    assert "File/position replicas given START SLAVE after MariaDB's mid-statement reconnect check" in text

    inv = report["invariants"]
    assert inv["horizon_checks"] > 0 and inv["horizon_violations"] == []
    assert inv["file_checks"] > 0 and inv["file_mismatches"] == []
    assert report["load"]["transactions"] > 0 and report["load"]["error_count"] == 0

    for key in ("tables_after_chaos", "tables_final"):
        tables = report[key]
        names = {t["table"] for t in tables["tables"]}
        assert {"accounts", "events", "ledger", "blobs"} <= names
        assert tables["table_sets_match"]
        for t in tables["tables"]:
            assert len(t["servers"]) == 4  # master, the direct replica, two through the relay
            assert t["match"], t
            assert len({(s["rows"], s["checksum"]) for s in t["servers"].values()}) == 1, t

    parser = report["fuzz_parser"]
    assert parser["inputs"] == 3000 and parser["crashes"] == 0 and parser["hangs"] == 0
    assert parser["master_files"] > 0
    port = report["fuzz_port"]
    assert port["inputs"] == 3000 and port["failures"] == 0 and port["worker_errors"] == []
    assert port["relay_alive_after"] and not port["fd_leak"]
    assert port["errors_returned"] > 0 and port["logins"] > 0
    assert all(v > 0 for v in port["replica_gtid_advances"].values()), port["replica_gtid_advances"]


def test_parser_fuzzer_finds_nothing_in_mutated_corpus_events(corpus_dir):
    samples = fuzz.load_binlog_samples(fuzz.corpus_binlog_paths(corpus_dir))
    assert len(samples) > 50
    report = fuzz.fuzz_binlog_parser(samples, 5000, seed=11)
    assert report.inputs == 5000
    assert report.crashes == [] and report.hangs == []
    assert set(report.by_target) == {"file", "event", "sequence"}
    # The inputs reach every kind of outcome: clean scans, errors with offsets, decoded views, refused views.
    for outcome in ("scan ok", "scan error (at offset ...)", "view decoded", "view BinlogFormatError",
                    "boundary: event classified", "boundary: error flagged"):
        assert report.outcomes[outcome] > 0, (outcome, report.outcomes)


def test_parser_fuzzer_reports_crashes_and_hangs_with_their_input(corpus_dir):
    samples = fuzz.load_binlog_samples(fuzz.corpus_binlog_paths(corpus_dir))[:5]
    calls = {"n": 0}

    def broken_target(kind, payload):
        calls["n"] += 1
        if calls["n"] % 50 == 0:
            raise IndexError("the kind of bug the fuzzer is there to find")
        if calls["n"] == 77:
            while True:  # a parser stuck in a loop: the time cap interrupts it
                time.sleep(0.01)

    report = fuzz.fuzz_binlog_parser(samples, 200, seed=1, time_cap=0.3, target_override=broken_target)
    assert report.inputs == 200
    assert len(report.crashes) == 4 and all("IndexError" in c["error"] for c in report.crashes)
    assert all(c["bytes"] for c in report.crashes)  # the input is kept, to reproduce it
    assert len(report.hangs) == 1 and report.hangs[0]["input"] == 76


def _events(corpus_dir: Path, name: str) -> list[bytes]:
    data = (corpus_dir / name).read_bytes()
    events: list[bytes] = []
    assert scan_bytes(data, on_event=lambda ev: events.append(data[ev.offset:ev.end])).ok
    return events


def test_scanner_warns_on_a_mariadb_gtid_in_a_mysql_file(corpus_dir):
    """Found by the fuzzer: a MARIA_GTID event ahead of a MySQL GTID group made the scanner call a MySQL-only
    method on its MariaDB GTID state (AttributeError). A damaged file gets a warning, like any unaddable GTID."""
    mysql = _events(corpus_dir, MYSQL_FILE)
    maria = _events(corpus_dir, MARIA_FILE)
    fde = mysql[0]
    maria_gtid = next(e for e in maria if e[4] == C.MARIA_GTID_EVENT)
    start = next(i for i, e in enumerate(mysql) if e[4] == C.GTID_LOG_EVENT)
    end = next(i for i in range(start, len(mysql)) if mysql[i][4] == C.XID_EVENT)
    data = b"\xfebin" + fde + maria_gtid + b"".join(mysql[start:end + 1])
    result = scan_bytes(data)
    assert result.groups_complete >= 1
    assert any("GTID" in w and "not added" in w for w in result.warnings), result.warnings


def test_scanner_fde_crc_error_names_the_same_place_however_the_bytes_arrive(corpus_dir):
    """Found by the fuzzer: a second FORMAT_DESCRIPTION with a bad CRC was reported with an offset into the
    scanner's internal buffer, so the message changed with the chunking of the input."""
    events = _events(corpus_dir, MARIA_FILE)
    fde = events[0]
    bad = bytearray(fde)
    bad[30] ^= 0x01  # in the server version string; the CRC no longer matches
    data = b"\xfebin" + fde + bytes(bad)
    whole = scan_bytes(data)
    scanner = BinlogScanner()
    for i in range(0, len(data), 7):
        scanner.feed(data[i:i + 7])
    chunked = scanner.finish()
    assert whole.crc_errors == chunked.crc_errors == 1
    assert whole.error == chunked.error
    assert whole.error.startswith(f"at offset {4 + len(fde)}: FORMAT_DESCRIPTION_EVENT: CRC32 mismatch"), whole.error
    assert struct.unpack_from("<I", data, 4 + len(fde) + 9)[0] == len(fde)
